"""Methods, one file per algorithm, registered by name in :data:`METHODS` through the explicit imports below."""

from dpsyn.methods import dp_gan, privgan, real  # noqa: F401  (registration)
from dpsyn.methods import dp_dre, dp_gan_ft, dp_gan_mi, dp_mepf, dp_mge, public_baselines  # noqa: F401  (paper 000)
from dpsyn.methods import pe  # noqa: F401  (paper 001)
from dpsyn.methods import g_pate  # noqa: F401  (paper 002)
from dpsyn.methods import pate_gan  # noqa: F401  (paper 002 baseline)
from dpsyn.methods import gs_wgan  # noqa: F401  (paper 002 baseline)
from dpsyn.methods.base import METHODS, Method, PrivacyBudget, RunContext, Samples

__all__ = ["METHODS", "Method", "PrivacyBudget", "RunContext", "Samples"]
