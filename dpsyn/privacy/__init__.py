"""dpsyn.privacy: THE only place with privacy math — mechanisms, accountants, calibration, the ledger, DP noise.

Public API (keyword-only arguments, Opacus's names):

* :func:`gaussian_sigma` — Gaussian mechanism calibration ("classic" paper-000 formula or "analytic" Balle & Wang).
* :func:`gdp_epsilon` / :func:`gdp_noise_multiplier` — T adaptive Gaussian releases, exact mu-GDP (PE's accounting).
* :func:`dpsgd_epsilon` / :func:`dpsgd_noise_multiplier` — DP-SGD over Opacus's accountants (:data:`ACCOUNTANTS`).
* :class:`PrivacyLedger` and its events — every release recorded, composed, saved as ``privacy.json``.
* :func:`dp_generator` / :func:`dp_numpy_generator` — generators for DP noise, seeded from OS entropy.

The inverse functions never return a noise level whose epsilon exceeds the target. Importing this package imports
neither torch nor Opacus; they are imported where first needed.
"""

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
from dpsyn.privacy.ledger import (
    ApproxDPEvent,
    BudgetExceededError,
    GaussianEvent,
    NonPrivateEvent,
    PrivacyEvent,
    PrivacyLedger,
    SampledGaussianEvent,
)
from dpsyn.privacy.noise import dp_generator, dp_numpy_generator

__all__ = [
    "ACCOUNTANTS",
    "CALIBRATIONS",
    "ApproxDPEvent",
    "BudgetExceededError",
    "GaussianEvent",
    "NonPrivateEvent",
    "PrivacyEvent",
    "PrivacyLedger",
    "SampledGaussianEvent",
    "dp_generator",
    "dp_numpy_generator",
    "dpsgd_epsilon",
    "dpsgd_noise_multiplier",
    "gaussian_rdp",
    "gaussian_sigma",
    "gdp_delta",
    "gdp_epsilon",
    "gdp_epsilon_from_mu",
    "gdp_mu",
    "gdp_noise_multiplier",
]
