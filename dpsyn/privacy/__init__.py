"""dpsyn.privacy: THE only place with privacy math — mechanisms, accountants, calibration, the ledger, DP noise.

Public API (keyword-only arguments, Opacus's names):

* :func:`gaussian_sigma` — Gaussian mechanism calibration ("classic" paper-000 formula or "analytic" Balle & Wang).
* :func:`split_budget` / :func:`calibrate_releases` — a budget split between Gaussian releases and each one's sigma
  (dp_mge, dp_mepf); :func:`replace_one_noise_std` — the 2C sensitivity of replace-one releases (gs_wgan).
* :func:`gdp_epsilon` / :func:`gdp_noise_multiplier` — T adaptive Gaussian releases, exact mu-GDP (PE's accounting).
* :func:`dpsgd_epsilon` / :func:`dpsgd_noise_multiplier` — DP-SGD over Opacus's accountants (:data:`ACCOUNTANTS`).
* :func:`pate_epsilon` / :func:`pate_privacy` — Confident-GNMax RDP (PATE 2018), data-dependent or not;
  :func:`confident_gnmax` the mechanism (torch); :func:`pate_max_queries` the queries a budget allows;
  :func:`pate_smooth_release` the smooth-sensitivity release of the data-dependent epsilon.
* :func:`dp_class_proportions` / :func:`dp_class_counts` — the Laplace mechanism on class counts (G-PATE's
  class-ratio release on tables).
* :class:`PrivacyLedger` and its events — every release recorded, composed, saved as ``privacy.json``
  (:mod:`dpsyn.privacy.ledger`: events, composition, the Renyi filter, the writer).
* :mod:`dpsyn.privacy.tuning` — private tuning's cost (Papernot & Steinke 2022, :class:`RepeatAndSelectEvent`).
* :func:`dp_generator` / :func:`dp_numpy_generator` — generators for DP noise, seeded from OS entropy.
* :func:`gaussian_mechanism` / :func:`laplace_mechanism` — the only DP noise draws in dpsyn (numpy or torch).
* :func:`report_noisy_max` / :class:`NoisyMax` — a DP choice among candidates by their counts (Laplace, Claim 3.9
  of Dwork & Roth), the DPImageBench protocol's accounted classifier selection.
* :mod:`dpsyn.privacy.audit` (imported on its own) — empirical epsilon lower bounds from a distinguishing test
  (Clopper-Pearson), the harnesses that run each mechanism and the audit's runner, used by
  ``python -m dpsyn.cli.audit``.

The inverse functions never return a noise level whose epsilon exceeds the target. Importing this package imports
neither torch nor Opacus; they are imported where first needed.
"""

from dpsyn.privacy.budget import (
    COMPOSITIONS,
    REPLACE_ONE_SENSITIVITY_FACTOR,
    CalibratedRelease,
    calibrate_releases,
    replace_one_noise_std,
    split_budget,
)
from dpsyn.privacy.dpsgd import ACCOUNTANTS, dpsgd_epsilon, dpsgd_noise_multiplier
from dpsyn.privacy.gaussian import (
    CALIBRATIONS,
    gaussian_rdp,
    gaussian_sigma,
    gdp_delta,
    gdp_epsilon,
    gdp_epsilon_from_mu,
    gdp_mu,
    gdp_noise_multiplier,
)
from dpsyn.privacy.laplace import dp_class_counts, dp_class_proportions, laplace_scale
from dpsyn.privacy.ledger import (
    ApproxDPEvent,
    BudgetExceededError,
    GaussianEvent,
    NonPrivateEvent,
    PrivacyEvent,
    PrivacyLedger,
    PATEEvent,
    RepeatAndSelectEvent,
    SampledGaussianEvent,
)
from dpsyn.privacy.noise import dp_generator, dp_numpy_generator, gaussian_mechanism, laplace_mechanism
from dpsyn.privacy.noisy_max import NoisyMax, noisy_max_event, report_noisy_max
from dpsyn.privacy.pate import (
    PATE_BOUNDS,
    PATE_RELEASES,
    PATEPrivacy,
    PATESmoothRelease,
    check_smooth_sensitivity_conditions,
    confident_gnmax,
    confident_gnmax_rdp,
    gnmax_local_sensitivity,
    gnmax_logq,
    gnmax_rdp,
    gnmax_rdp_data_independent,
    gnmax_rdp_from_logq,
    gnss_rdp,
    pate_bound_for_release,
    pate_data_independent_epsilon,
    pate_epsilon,
    pate_local_sensitivity,
    pate_max_queries,
    pate_privacy,
    pate_smooth_release,
    rdp_to_epsilon,
    smooth_sensitivity,
    threshold_local_sensitivity,
    threshold_logpr_answered,
    threshold_rdp,
    threshold_rdp_data_independent,
)

__all__ = [
    "ACCOUNTANTS",
    "CALIBRATIONS",
    "COMPOSITIONS",
    "PATE_BOUNDS",
    "PATE_RELEASES",
    "REPLACE_ONE_SENSITIVITY_FACTOR",
    "ApproxDPEvent",
    "BudgetExceededError",
    "CalibratedRelease",
    "GaussianEvent",
    "NoisyMax",
    "NonPrivateEvent",
    "PATEEvent",
    "PATEPrivacy",
    "PATESmoothRelease",
    "PrivacyEvent",
    "PrivacyLedger",
    "RepeatAndSelectEvent",
    "SampledGaussianEvent",
    "calibrate_releases",
    "check_smooth_sensitivity_conditions",
    "confident_gnmax",
    "confident_gnmax_rdp",
    "dp_class_counts",
    "dp_class_proportions",
    "dp_generator",
    "dp_numpy_generator",
    "dpsgd_epsilon",
    "dpsgd_noise_multiplier",
    "gaussian_mechanism",
    "gaussian_rdp",
    "gaussian_sigma",
    "gdp_delta",
    "gdp_epsilon",
    "gdp_epsilon_from_mu",
    "gdp_mu",
    "gdp_noise_multiplier",
    "gnmax_local_sensitivity",
    "gnmax_logq",
    "gnmax_rdp",
    "gnmax_rdp_data_independent",
    "gnmax_rdp_from_logq",
    "gnss_rdp",
    "laplace_mechanism",
    "laplace_scale",
    "noisy_max_event",
    "pate_bound_for_release",
    "pate_data_independent_epsilon",
    "pate_epsilon",
    "pate_local_sensitivity",
    "pate_max_queries",
    "pate_privacy",
    "pate_smooth_release",
    "rdp_to_epsilon",
    "report_noisy_max",
    "replace_one_noise_std",
    "smooth_sensitivity",
    "split_budget",
    "threshold_local_sensitivity",
    "threshold_logpr_answered",
    "threshold_rdp",
    "threshold_rdp_data_independent",
]
