"""DP-SGD accounting (Poisson-subsampled Gaussian mechanism) over Opacus's accountants.

The accountant is always named explicitly (Opacus's default changed from "rdp" to "prv" once) and recorded by the
ledger. Opacus is imported inside the functions so that ``import dpsyn.privacy`` stays light.

Allowed accountants (:data:`ACCOUNTANTS`):

* ``"rdp"``: Renyi DP of the sampled Gaussian (Mironov et al. 2019), Opacus's ``compute_rdp``, converted with
  Balle et al. 2020, Thm 21 (Opacus's ``get_privacy_spent``). An upper bound. The orders are Opacus's
  ``DEFAULT_ALPHAS`` (1.1 .. 63) *plus* orders up to 1024 (:data:`EXTRA_RDP_ORDERS`, as dp_accounting's defaults
  have): with orders <= 63 the conversion alone costs ``log(1/delta)/62`` (about 0.19 at delta = 1e-5), so Opacus's
  defaults cannot certify small budgets such as the papers' eps = 0.1 however much noise is added. More orders only
  tighten the bound; for budgets where the optimum lies below 63 the numbers equal Opacus's own.
* ``"prv"``: numerical composition of privacy-loss random variables (Gopi et al. 2021); Opacus returns the upper end
  of its error interval (``eps_error = 0.01``), so it is also an upper bound, and tighter than RDP.

Opacus's ``"gdp"`` accountant is deliberately not offered: it is the central-limit approximation of subsampled
Gaussian composition, which can *under*-estimate epsilon (Opacus itself warns so), and a trustworthy baseline must
not report a privacy level it cannot guarantee.

Both accountants assume Poisson subsampling with rate ``sample_rate``; the data loader must sample that way.
"""

from __future__ import annotations

import contextlib
import logging
import math
import warnings
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from dpsyn.config.schema import ACCOUNTANTS
from dpsyn.privacy.gaussian import _check_count, _check_delta, _check_positive

logger = logging.getLogger(__name__)

"""DP-SGD accountants dpsyn accepts (Opacus names)."""

# How far dpsgd_noise_multiplier may step up a noise multiplier that Opacus returned over the target.
_MAX_STEP_UPS = 200


def check_accountant(accountant: str) -> str:
    """Return ``accountant`` if it is one of :data:`ACCOUNTANTS`.

    Raises:
        ValueError: Naming the allowed accountants otherwise.
    """
    if accountant not in ACCOUNTANTS:
        raise ValueError(
            f"unknown DP-SGD accountant {accountant!r}; allowed: {', '.join(repr(a) for a in ACCOUNTANTS)}"
        )
    return accountant


def _check_sample_rate(sample_rate: float) -> float:
    q = _check_positive("sample_rate", sample_rate)
    if q > 1.0:
        raise ValueError(f"sample_rate must lie in (0, 1], got {sample_rate!r}")
    return q


def opacus_version() -> str:
    """The installed Opacus version (read from package metadata, without importing Opacus)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("opacus")
    except PackageNotFoundError:  # pragma: no cover - opacus is a hard dependency
        return "unknown"


EXTRA_RDP_ORDERS: tuple[float, ...] = (64.0, 80.0, 96.0, 128.0, 160.0, 192.0, 256.0, 384.0, 512.0, 768.0, 1024.0)
"""Orders dpsyn adds to Opacus's ``DEFAULT_ALPHAS`` (which stop at 63) so that small budgets can be certified."""


def rdp_orders() -> list[float]:
    """The RDP orders dpsyn uses everywhere: Opacus's ``RDPAccountant.DEFAULT_ALPHAS`` + :data:`EXTRA_RDP_ORDERS`."""
    from opacus.accountants import RDPAccountant

    return [float(a) for a in RDPAccountant.DEFAULT_ALPHAS] + list(EXTRA_RDP_ORDERS)


def rdp_orders_description() -> str:
    """A short description of :func:`rdp_orders` for the ledger (e.g. ``"orders 1.1-1024"``)."""
    orders = rdp_orders()
    return f"orders {min(orders):g}-{max(orders):g}"


@contextlib.contextmanager
def _quiet_opacus() -> Iterator[None]:
    """Silence two benign Opacus warnings, which a calibration search would otherwise repeat dozens of times.

    * "Optimal order is the largest/smallest alpha": the RDP bound is valid, only possibly loose.
    * numpy's divide-by-zero RuntimeWarnings inside the PRV accountant (``np.where`` evaluates ``log(0)`` in the
      branch it then discards).
    """
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Optimal order")
        warnings.filterwarnings("ignore", category=RuntimeWarning, module=r"opacus\.accountants\.analysis\.prv")
        yield


def _check_orders(orders: Sequence[float] | np.ndarray | None) -> np.ndarray:
    """The orders as a 1-D float array (dpsyn's :func:`~dpsyn.privacy.dpsgd.rdp_orders` when None), each > 1."""
    if orders is None:
        return np.asarray(rdp_orders(), dtype=np.float64)
    alphas = np.atleast_1d(np.asarray(orders, dtype=np.float64))
    if alphas.ndim != 1 or alphas.size == 0 or not np.all(np.isfinite(alphas)) or not np.all(alphas > 1):
        raise ValueError(f"RDP orders must be a non-empty sequence of finite numbers > 1, got {orders!r}")
    return alphas


def rdp_to_epsilon(
    *, rdp: Sequence[float] | np.ndarray, orders: Sequence[float] | np.ndarray, delta: float
) -> tuple[float, float]:
    """Epsilon at ``delta`` of an RDP curve: Balle et al. 2020, Thm 21 (Opacus's ``get_privacy_spent``), best order.

    dpsyn's one RDP -> epsilon conversion: :class:`~dpsyn.privacy.PrivacyLedger` applies it to every RDP
    composition, and the PATE analysis to its curves. ``inf`` RDP values (orders where a mechanism has no bound) are
    allowed.

    Args:
        rdp: RDP values, one per order, each >= 0.
        orders: RDP orders, each > 1.
        delta: Target delta in (0, 1).

    Returns:
        ``(epsilon, best order)``; epsilon is clipped at 0 and is ``inf`` if every order's RDP is.

    Raises:
        ValueError: On mismatched lengths, negative or NaN RDP values, or an invalid delta.
    """
    alphas = _check_orders(orders)
    r = np.atleast_1d(np.asarray(rdp, dtype=np.float64))
    delta = _check_delta("delta", delta)
    if r.shape != alphas.shape:
        raise ValueError(f"rdp and orders must have the same length, got {r.shape} and {alphas.shape}")
    if np.any(np.isnan(r)) or np.any(r < 0):
        raise ValueError("RDP values must be >= 0 (inf allowed)")
    if np.all(np.isinf(r)):
        return math.inf, math.nan
    from opacus.accountants.analysis.rdp import get_privacy_spent

    with _quiet_opacus():
        eps, best = get_privacy_spent(orders=alphas, rdp=r, delta=delta)
    # The conversion can dip below 0 for delta close to 1; epsilon is never negative.
    return max(0.0, float(eps)), float(best)


def _get_epsilon(accountant_obj: Any, delta: float, alphas: list[float] | None = None) -> float:
    """``accountant_obj.get_epsilon(delta)`` (with ``alphas`` for RDP), quietly, clipped at 0."""
    kwargs = {} if alphas is None else {"alphas": alphas}
    with _quiet_opacus():
        eps = float(accountant_obj.get_epsilon(delta=delta, **kwargs))
    # The RDP -> (eps, delta) conversion can dip below 0 for delta close to 1; epsilon is never negative.
    return max(0.0, eps)


def dpsgd_epsilon(
    *,
    noise_multiplier: float,
    sample_rate: float,
    steps: int,
    delta: float,
    accountant: str = "rdp",
    orders: Sequence[float] | None = None,
) -> float:
    """Epsilon of DP-SGD: ``steps`` Poisson-subsampled Gaussian steps, by an Opacus accountant.

    Args:
        noise_multiplier: Noise std divided by the clipping norm, > 0.
        sample_rate: Poisson sampling rate ``q`` in (0, 1] (expected batch size / dataset size).
        steps: Number of optimiser steps, an integer >= 0.
        delta: Target delta in (0, 1).
        accountant: ``"rdp"`` or ``"prv"``.
        orders: RDP orders to optimise over (``"rdp"`` only); :func:`rdp_orders` by default. Any set of orders
            gives a valid bound; more orders give a tighter one.

    Returns:
        Epsilon (an upper bound; 0.0 for zero steps).

    Raises:
        ValueError: On invalid arguments, an unknown accountant, or ``orders`` with an accountant other than rdp.
    """
    check_accountant(accountant)
    alphas = rdp_orders() if accountant == "rdp" and orders is None else None
    if orders is not None:
        if accountant != "rdp":
            raise ValueError(f"orders apply to the 'rdp' accountant only, not {accountant!r}")
        alphas = [float(a) for a in orders]
        if not alphas or not all(a > 1 for a in alphas):
            raise ValueError(f"RDP orders must be a non-empty sequence of numbers > 1, got {orders!r}")
    nm = _check_positive("noise_multiplier", noise_multiplier)
    q = _check_sample_rate(sample_rate)
    steps = _check_count("steps", steps)
    delta = _check_delta("delta", delta)
    if steps == 0:
        return 0.0
    from opacus.accountants import create_accountant

    acc = create_accountant(mechanism=accountant)
    acc.history = [(nm, q, steps)]
    return _get_epsilon(acc, delta, alphas=alphas)


def dpsgd_noise_multiplier(
    *,
    epsilon: float,
    delta: float,
    sample_rate: float,
    steps: int,
    accountant: str = "rdp",
    epsilon_tolerance: float = 0.01,
) -> float:
    """The noise multiplier that makes ``steps`` DP-SGD steps ``(epsilon, delta)``-DP under ``accountant``.

    Opacus's ``get_noise_multiplier`` (bisection to ``epsilon_tolerance``) finds it; dpsyn then checks the answer
    with :func:`dpsgd_epsilon` and, should it ever exceed the target, raises the noise multiplier by 0.1 % steps
    until it does not. The result therefore never overspends; it may underspend by up to ``epsilon_tolerance``.

    Args:
        epsilon: Target epsilon, finite and > 0 (non-private runs need no noise and must not call this).
        delta: Target delta in (0, 1).
        sample_rate: Poisson sampling rate in (0, 1].
        steps: Number of optimiser steps, an integer >= 1.
        accountant: ``"rdp"`` or ``"prv"``.
        epsilon_tolerance: Opacus's bisection tolerance on epsilon, > 0.

    Returns:
        A noise multiplier ``nm`` with ``dpsgd_epsilon(noise_multiplier=nm, ...) <= epsilon``.

    Raises:
        ValueError: On invalid arguments, an unknown accountant, or a budget too small for any noise multiplier
            up to Opacus's limit (1e6).
    """
    check_accountant(accountant)
    epsilon = _check_positive("epsilon", epsilon, allow_inf=True)
    if math.isinf(epsilon):
        raise ValueError("epsilon = inf is not a calibration target: a non-private run adds no noise")
    delta = _check_delta("delta", delta)
    q = _check_sample_rate(sample_rate)
    steps = _check_count("steps", steps)
    if steps < 1:
        raise ValueError(f"steps must be >= 1 to calibrate a noise multiplier, got {steps}")
    tol = _check_positive("epsilon_tolerance", epsilon_tolerance)
    from opacus.accountants.utils import get_noise_multiplier

    # Opacus forwards extra keyword arguments to the accountant's get_epsilon: the RDP search uses dpsyn's orders.
    extra = {"alphas": rdp_orders()} if accountant == "rdp" else {}
    try:
        with _quiet_opacus():
            nm = float(
                get_noise_multiplier(
                    target_epsilon=epsilon,
                    target_delta=delta,
                    sample_rate=q,
                    steps=steps,
                    accountant=accountant,
                    epsilon_tolerance=tol,
                    **extra,
                )
            )
    except ValueError as err:
        raise ValueError(
            f"no noise multiplier reaches eps={epsilon:g} at delta={delta:g} with sample_rate={q:g} and "
            f"{steps} steps under the {accountant!r} accountant (opacus: {err})"
        ) from err
    eps = dpsgd_epsilon(noise_multiplier=nm, sample_rate=q, steps=steps, delta=delta, accountant=accountant)
    for _ in range(_MAX_STEP_UPS):
        if eps <= epsilon:
            break
        logger.warning(
            "opacus returned noise multiplier %.6g with eps %.6g > target %.6g (%s); stepping up", nm, eps, epsilon,
            accountant,
        )
        nm *= 1.001
        eps = dpsgd_epsilon(noise_multiplier=nm, sample_rate=q, steps=steps, delta=delta, accountant=accountant)
    else:
        raise RuntimeError(
            f"could not find a noise multiplier within eps={epsilon} ({accountant}); last nm={nm}, eps={eps}"
        )
    logger.debug(
        "dpsgd noise multiplier %.6g: eps %.6g <= %.6g (delta=%g, q=%g, steps=%d, %s)",
        nm, eps, epsilon, delta, q, steps, accountant,
    )
    return nm
