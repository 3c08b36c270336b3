"""Thin shim so that `python train.py ...` works from a checkout: the app is dpsyn.cli.train."""

from dpsyn.cli.train import main

if __name__ == "__main__":
    main()
