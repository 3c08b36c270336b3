"""Methods, one file per algorithm, registered by name in :data:`METHODS` through the explicit imports below; the
plugins' (:mod:`dpsyn.plugins`) register themselves through :func:`register_method` when imported."""

from dpsyn.methods import dp_gan, privgan, real  # noqa: F401  (registration)
from dpsyn.methods import dp_dre, dp_gan_ft, dp_gan_mi, dp_mepf, dp_mge, public_baselines  # noqa: F401  (paper 000)
from dpsyn.methods import pe  # noqa: F401  (paper 001)
from dpsyn.methods import g_pate  # noqa: F401  (paper 002)
from dpsyn.methods import pate_gan  # noqa: F401  (paper 002 baseline)
from dpsyn.methods import gs_wgan  # noqa: F401  (paper 002 baseline)
from dpsyn.methods.base import METHODS, Method, PrivacyBudget, RunContext, Samples, register_method
from dpsyn.plugins import load_plugins

load_plugins()  # methods from outside dpsyn (entry points, DPSYN_PLUGINS): registered as dpsyn's own are

__all__ = ["METHODS", "Method", "PrivacyBudget", "RunContext", "Samples", "register_method"]
