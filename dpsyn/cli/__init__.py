"""Entry points: ``train`` (the Hydra app behind ``python train.py``)."""
