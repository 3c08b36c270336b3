"""PATE's Confident-GNMax aggregator (Papernot et al. 2018), used by G-PATE (paper 002) and PATE-GAN, in three parts:

* :mod:`~dpsyn.privacy.pate.analysis` — the Renyi-DP bounds (data-independent and data-dependent), RDP -> epsilon
  and the epsilon of a run (:func:`pate_privacy`, :func:`pate_epsilon`, :func:`pate_max_queries`); numpy/scipy.
* :mod:`~dpsyn.privacy.pate.mechanism` — :func:`confident_gnmax`, the mechanism on torch tensors.
* :mod:`~dpsyn.privacy.pate.smooth` — local and smooth sensitivities of the data-dependent RDP and the GNSS release
  (:func:`pate_smooth_release`).

Every public name is importable from here (and from :mod:`dpsyn.privacy`), as it was from the single module.
"""

from dpsyn.privacy.pate.analysis import (
    PATE_BOUNDS,
    PATE_RELEASES,
    PATEPrivacy,
    check_pate_bound,
    confident_gnmax_rdp,
    gnmax_logq,
    gnmax_rdp,
    gnmax_rdp_data_independent,
    gnmax_rdp_from_logq,
    pate_bound_for_release,
    pate_data_independent_epsilon,
    pate_epsilon,
    pate_max_queries,
    pate_privacy,
    rdp_to_epsilon,
    threshold_logpr_answered,
    threshold_rdp,
    threshold_rdp_data_independent,
)
from dpsyn.privacy.pate.mechanism import confident_gnmax
from dpsyn.privacy.pate.smooth import (
    PATESmoothRelease,
    check_smooth_sensitivity_conditions,
    gnmax_local_sensitivity,
    gnss_rdp,
    pate_local_sensitivity,
    pate_smooth_release,
    smooth_sensitivity,
    threshold_local_sensitivity,
)

__all__ = [
    "PATEPrivacy",
    "PATESmoothRelease",
    "PATE_BOUNDS",
    "PATE_RELEASES",
    "check_pate_bound",
    "check_smooth_sensitivity_conditions",
    "confident_gnmax",
    "confident_gnmax_rdp",
    "gnmax_local_sensitivity",
    "gnmax_logq",
    "gnmax_rdp",
    "gnmax_rdp_data_independent",
    "gnmax_rdp_from_logq",
    "gnss_rdp",
    "pate_bound_for_release",
    "pate_data_independent_epsilon",
    "pate_epsilon",
    "pate_local_sensitivity",
    "pate_max_queries",
    "pate_privacy",
    "pate_smooth_release",
    "rdp_to_epsilon",
    "smooth_sensitivity",
    "threshold_local_sensitivity",
    "threshold_logpr_answered",
    "threshold_rdp",
    "threshold_rdp_data_independent",
]
