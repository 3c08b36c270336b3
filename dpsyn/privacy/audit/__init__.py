"""Empirical privacy auditing: epsilon lower bounds from a distinguishing test on a mechanism's outputs.

* :mod:`dpsyn.privacy.audit.stats`: the statistics (Clopper-Pearson bounds, the threshold chosen on one half of the
  trials and evaluated on the other), pure numpy/scipy; its public names are re-exported here.
* :mod:`dpsyn.privacy.audit.mechanisms`: the harnesses that run every DP mechanism dpsyn uses as the methods call
  it, and score its outputs (torch, Opacus and the methods imported when a harness runs).
* :mod:`dpsyn.privacy.audit.runner`: the audit itself, one row per mechanism (``python -m dpsyn.cli.audit``).

Importing this package imports the statistics only: neither torch nor the harnesses.
"""

from dpsyn.privacy.audit.stats import (
    MIN_ERRORS,
    AuditResult,
    audit_scores,
    clopper_pearson_upper,
    epsilon_from_rates,
)

__all__ = ["MIN_ERRORS", "AuditResult", "audit_scores", "clopper_pearson_upper", "epsilon_from_rates"]
