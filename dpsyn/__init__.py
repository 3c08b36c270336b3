"""dpsyn: differentially private synthetic data, reproduced and compared under exact privacy accounting."""

__version__ = "0.1.0"

from dpsyn import config as _config  # noqa: E402,F401  (registers the config schemas in Hydra's ConfigStore)
