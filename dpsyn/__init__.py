"""dpsyn: differentially private synthetic data, reproduced and compared under exact privacy accounting."""

__version__ = "0.1.0"
