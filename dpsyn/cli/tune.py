"""``python -m dpsyn.cli.tune final <sweep dir>``: re-run a tuning sweep's best trial once, scored on the eval split.

A tuning sweep (``python train.py -m experiment=tune ...``, hydra/sweeper=optuna) scores every trial on the
validation split carved from the private training set; the sealed eval split is never read by it. This command
reads the sweep's ``optimization_results.yaml`` (the best trial's settings) and a trial's ``result.json`` (the
command line of the sweep), and runs ``train.py`` once with those settings and ``metrics.split=eval`` in ``<sweep dir>/final``:
the one run whose metrics read the eval split (once, sealed). Its ledger records that its settings were chosen on
the trials' validation scores, a release without DP (docs/tuning.md, "Tuning sweeps").
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

from dpsyn.paths import IN_CHECKOUT, REPO_DIR

# a checkout's train.py; an installed dpsyn has none, so its entry point is called
TRAIN = [str(REPO_DIR / "train.py")] if IN_CHECKOUT else ["-c", "from dpsyn.cli.train import main; main()"]


def final_command(sweep_dir: Path, extra: list[str]) -> tuple[list[str], dict]:
    """The train.py command line of the final run and the sweep's best trial (``best_params``, ``best_value``)."""
    from omegaconf import OmegaConf

    from dpsyn.results.io import read_json

    best_file = sweep_dir / "optimization_results.yaml"
    trials = sorted(sweep_dir.glob("trial*/*/result.json"))
    if not best_file.is_file() or not trials:
        raise SystemExit(f"{sweep_dir}: no optimization_results.yaml or no finished trial; is it a finished "
                         "`train.py -m experiment=tune` sweep?")
    best = OmegaConf.to_container(OmegaConf.load(best_file), resolve=False)
    task = [str(o) for o in read_json(trials[0])["overrides"]]  # the sweep's command line plus trial 0's settings
    swept = set(best["best_params"])
    keep = [o for o in task if not o.startswith("hydra") and o.split("=", 1)[0].lstrip("+~") not in swept]
    cmd = [sys.executable, *TRAIN, *keep,
           *(f"{k}={v}" for k, v in best["best_params"].items()),
           "metrics.split=eval", "tuning.objective=null", f"tuning.tuned_on={sweep_dir}", f"tuning.trials={len(trials)}",
           f"hydra.run.dir={sweep_dir / 'final'}", *extra]
    return cmd, best


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m dpsyn.cli.tune", description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("final", help="re-run the best trial once, scored on the sealed eval split")
    p.add_argument("sweep_dir", type=Path)
    p.add_argument("overrides", nargs="*", help="extra train.py overrides (e.g. logger=none)")
    args = ap.parse_args(argv)
    cmd, best = final_command(args.sweep_dir.resolve(), args.overrides)
    print(f"best trial: {best['best_params']} (validation {best['best_value']}); final run: {' '.join(cmd[1:])}",
          flush=True)
    sys.exit(subprocess.run(cmd).returncode)


if __name__ == "__main__":
    main()
