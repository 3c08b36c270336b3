"""Methods, one file per algorithm, registered by name in :data:`METHODS` through the explicit imports below."""

from dpsyn.methods import dp_gan, privgan, real  # noqa: F401  (registration)
from dpsyn.methods.base import METHODS, Method, PrivacyBudget, RunContext, Samples

__all__ = ["METHODS", "Method", "PrivacyBudget", "RunContext", "Samples"]
