"""The Gaussian mechanism: calibration of sigma and exact Gaussian-DP (mu-GDP) accounting.

Pure math on numpy/scipy (no torch, no Opacus), so it can be imported anywhere, tables included.

Everything here rests on one closed form. A sensitivity-``Δ`` Gaussian release with noise std ``σ`` is
``mu``-GDP with ``mu = Δ/σ`` (Dong, Roth & Su 2019), and ``T`` adaptive releases of noise multiplier ``σ``
(sensitivity 1) compose to ``mu = sqrt(T)/σ``. A ``mu``-GDP mechanism is ``(eps, delta(eps))``-DP for every
``eps >= 0`` with, tightly (Balle & Wang 2018, Thm 8; Dong et al. 2019, Cor 2.13),

    delta(eps) = Phi(-eps/mu + mu/2) - e^eps Phi(-eps/mu - mu/2).

``delta(eps)`` decreases in ``eps`` and increases in ``mu``. This module evaluates it in log space
(``scipy.special.log_ndtr``) so that neither ``e^eps`` nor the Gaussian tails overflow or underflow, and inverts it
with a bracketing search that widens its bracket until the sign changes (never a fixed bracket that can fail) and
then steps to the safe side: a returned epsilon or noise level never spends more than the target.

Why by hand: scipy gives the special functions and the root finder, but no library we depend on exposes the exact
mu-GDP <-> (eps, delta) conversion or the analytic Gaussian calibration (Opacus's ``gdp`` accountant is the
central-limit approximation for *subsampled* Gaussians, a different and non-conservative quantity).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from numbers import Integral, Real

import numpy as np
from scipy.optimize import brentq
from scipy.special import log_ndtr
from dpsyn.config.schema import CALIBRATIONS

logger = logging.getLogger(__name__)

"""Allowed values of ``gaussian_sigma(calibration=...)``."""

# Relative precision of the root searches before the final step to the safe side.
_XTOL_REL = 1e-13
_MAX_DOUBLINGS = 2000


# --------------------------------------------------------------------------------------------------------------------
# validation helpers (shared with the rest of dpsyn.privacy)
# --------------------------------------------------------------------------------------------------------------------


def _check_positive(name: str, value: float, *, allow_inf: bool = False) -> float:
    """Return ``value`` as a float if it is a real number > 0 (finite unless ``allow_inf``), else raise ValueError."""
    if isinstance(value, bool) or not isinstance(value, Real):
        raise ValueError(f"{name} must be a real number > 0, got {value!r}")
    v = float(value)
    if math.isnan(v) or v <= 0 or (math.isinf(v) and not allow_inf):
        bound = "> 0" if allow_inf else "finite and > 0"
        raise ValueError(f"{name} must be {bound}, got {value!r}")
    return v


def _check_delta(name: str, value: float) -> float:
    """Return ``value`` as a float if it lies in the open interval (0, 1), else raise ValueError."""
    if isinstance(value, bool) or not isinstance(value, Real) or not 0.0 < float(value) < 1.0:
        raise ValueError(f"{name} must lie in the open interval (0, 1), got {value!r}")
    return float(value)


def _check_count(name: str, value: int) -> int:
    """Return ``value`` as an int if it is an integer >= 0, else raise ValueError."""
    if isinstance(value, bool) or not isinstance(value, Integral) or value < 0:
        raise ValueError(f"{name} must be an integer >= 0, got {value!r}")
    return int(value)


# --------------------------------------------------------------------------------------------------------------------
# the closed form and its inversion
# --------------------------------------------------------------------------------------------------------------------


def _log_gdp_delta(mu: float, epsilon: float) -> float:
    """``log delta(eps)`` of a ``mu``-GDP mechanism, computed without overflow.

    ``delta = Phi(a) - e^eps Phi(b)`` with ``a = mu/2 - eps/mu`` and ``b = -mu/2 - eps/mu`` is rewritten as
    ``Phi(a) * (1 - exp(eps + log Phi(b) - log Phi(a)))``; the exponent is < 0 for mu > 0, and ``-expm1`` keeps
    the difference accurate when it is small.
    """
    a = mu / 2.0 - epsilon / mu
    b = -mu / 2.0 - epsilon / mu
    log_pa = float(log_ndtr(a))
    x = epsilon + float(log_ndtr(b)) - log_pa
    if x >= 0.0:  # only by rounding, when the true delta is far below double precision relative to Phi(a)
        return -math.inf
    return log_pa + math.log(-math.expm1(x))


def gdp_delta(*, mu: float, epsilon: float) -> float:
    """The tight delta of a ``mu``-GDP mechanism at ``epsilon``.

    Args:
        mu: The GDP parameter, > 0.
        epsilon: The epsilon at which to evaluate, >= 0.

    Returns:
        ``Phi(-eps/mu + mu/2) - e^eps Phi(-eps/mu - mu/2)``.

    Raises:
        ValueError: If ``mu <= 0`` or ``epsilon < 0``.
    """
    mu = _check_positive("mu", mu)
    if isinstance(epsilon, bool) or not isinstance(epsilon, Real) or not float(epsilon) >= 0:
        raise ValueError(f"epsilon must be a real number >= 0, got {epsilon!r}")
    return math.exp(_log_gdp_delta(mu, float(epsilon)))


def _smallest_safe(h: Callable[[float], float], x0: float, ok: Callable[[float], bool]) -> float:
    """Smallest ``x > 0`` with ``h(x) <= 0``, for ``h`` non-increasing on ``(0, inf)``, returned on the safe side.

    The bracket ``[lo, hi]`` around ``x0`` is widened geometrically until ``h(lo) > 0 >= h(hi)`` (if ``h`` is
    already <= 0 at tiny ``x`` the answer is that tiny ``x``), then Brent's method narrows it to ``_XTOL_REL``
    relative precision and the result is moved up until ``ok(x)`` holds at the returned ``x`` itself, so that
    the guarantee does not depend on the root finder's tolerance (nor on rounding between log and linear scale).

    Args:
        h: A non-increasing function of ``x``; ``h(x) <= 0`` means "x spends no more than the target".
        x0: A starting guess > 0.
        ok: The exact acceptance test the caller promises (e.g. ``gdp_delta(...) <= delta``); true for large x.

    Returns:
        ``x`` with ``ok(x)``, within about ``1e-12`` relative of the exact threshold.

    Raises:
        ArithmeticError: If no bracket is found (h is not monotone or not finite where it should be).
    """

    def hf(x: float) -> float:
        value = h(x)
        if math.isnan(value):
            raise ArithmeticError(f"the spending function is NaN at {x!r}")
        # -inf (delta below double precision) would stall Brent's method; any huge negative value will do.
        return max(value, -1e300)

    lo = hi = x0
    h_hi = hf(hi)
    for _ in range(_MAX_DOUBLINGS):
        if h_hi <= 0:
            break
        lo, hi = hi, hi * 2.0
        h_hi = hf(hi)
    else:
        raise ArithmeticError("could not bracket the root from above (is the function monotone?)")
    bracketed = True
    if hi == x0:  # h(x0) <= 0: walk down until h > 0
        h_lo = hf(lo)
        while h_lo <= 0:
            hi, lo = lo, lo / 2.0
            if lo < 1e-300:  # spends nothing however small x is: the smallest x tried will do
                bracketed = False
                break
            h_lo = hf(lo)
    x = brentq(hf, lo, hi, xtol=1e-300, rtol=_XTOL_REL, maxiter=500) if bracketed else hi
    step = 4.0 * _XTOL_REL
    for _ in range(_MAX_DOUBLINGS):  # safe side: never return a value whose own check fails
        if ok(x):
            return x
        x *= 1.0 + step
        step *= 2.0
    raise ArithmeticError(f"no value passes the acceptance test near {x!r}")


def gdp_mu(*, noise_multiplier: float, steps: int) -> float:
    """The GDP parameter of ``steps`` adaptive sensitivity-1 Gaussian releases with noise std ``noise_multiplier``.

    Args:
        noise_multiplier: Noise std divided by the L2 sensitivity, > 0.
        steps: Number of releases, >= 0.

    Returns:
        ``mu = sqrt(steps) / noise_multiplier``.

    Raises:
        ValueError: On a non-positive noise multiplier or a negative or non-integer number of steps.
    """
    nm = _check_positive("noise_multiplier", noise_multiplier)
    steps = _check_count("steps", steps)
    return math.sqrt(steps) / nm


def gdp_epsilon_from_mu(*, mu: float, delta: float) -> float:
    """Exact epsilon of a ``mu``-GDP mechanism at ``delta``.

    Args:
        mu: The GDP parameter, >= 0 (0 means nothing was released).
        delta: Target delta in (0, 1).

    Returns:
        The smallest ``eps >= 0`` with ``delta(eps) <= delta`` (to about 1e-12 relative, rounded up).

    Raises:
        ValueError: If ``mu < 0`` or is not finite, or ``delta`` is outside (0, 1).
    """
    delta = _check_delta("delta", delta)
    if isinstance(mu, bool) or not isinstance(mu, Real) or not 0.0 <= float(mu) < math.inf:
        raise ValueError(f"mu must be a finite real number >= 0, got {mu!r}")
    mu = float(mu)
    if mu == 0.0:
        return 0.0
    log_target = math.log(delta)
    if math.exp(_log_gdp_delta(mu, 0.0)) <= delta:
        return 0.0

    def h(eps: float) -> float:
        return _log_gdp_delta(mu, eps) - log_target

    def ok(eps: float) -> bool:
        return math.exp(_log_gdp_delta(mu, eps)) <= delta  # exactly the check gdp_delta(mu=, epsilon=) <= delta

    # mu^2/2 + mu*sqrt(2 log(1/delta)) upper-bounds the answer; a good scale to start the bracket from.
    return _smallest_safe(h, max(mu * mu / 2.0 + mu * math.sqrt(2.0 * math.log(1.0 / delta)), 1e-12), ok)


def gdp_epsilon(*, noise_multiplier: float, steps: int, delta: float) -> float:
    """Epsilon of ``steps`` adaptive sensitivity-1 Gaussian releases, by the exact mu-GDP conversion (PE's accounting).

    ``mu = sqrt(steps)/noise_multiplier`` and epsilon is the smallest ``eps`` with
    ``Phi(-eps/mu + mu/2) - e^eps Phi(-eps/mu - mu/2) <= delta``. With ``noise_multiplier = 5*sqrt(2)`` and
    ``delta = 1e-5``: 20 steps give 2.594 and 10 steps give 1.760 (PE, Lin et al. 2024).

    Args:
        noise_multiplier: Noise std of each release divided by its L2 sensitivity, > 0.
        steps: Number of releases, an integer >= 0.
        delta: Target delta in (0, 1).

    Returns:
        Epsilon (0.0 for zero steps), rounded up so that its delta never exceeds ``delta``.

    Raises:
        ValueError: On invalid arguments.
    """
    return gdp_epsilon_from_mu(mu=gdp_mu(noise_multiplier=noise_multiplier, steps=steps), delta=delta)


def gdp_noise_multiplier(*, epsilon: float, steps: int, delta: float) -> float:
    """The smallest noise multiplier whose ``gdp_epsilon`` over ``steps`` releases is at most ``epsilon``.

    Args:
        epsilon: Target epsilon, finite and > 0.
        steps: Number of sensitivity-1 Gaussian releases, an integer >= 1.
        delta: Target delta in (0, 1).

    Returns:
        A noise multiplier ``nm`` with ``gdp_epsilon(noise_multiplier=nm, steps=steps, delta=delta) <= epsilon``,
        within 1e-6 relative of (and never below) the exact value.

    Raises:
        ValueError: On invalid arguments (``epsilon = inf`` included: a non-private run needs no noise).
    """
    epsilon = _check_positive("epsilon", epsilon)
    delta = _check_delta("delta", delta)
    steps = _check_count("steps", steps)
    if steps < 1:
        raise ValueError(f"steps must be >= 1 to calibrate a noise multiplier, got {steps}")
    log_target = math.log(delta)
    root_t = math.sqrt(steps)

    def h(nm: float) -> float:
        return _log_gdp_delta(root_t / nm, epsilon) - log_target

    def ok(nm: float) -> bool:
        return gdp_epsilon(noise_multiplier=nm, steps=steps, delta=delta) <= epsilon

    # ok() is the round trip itself: the forward function rounds its own answer up by ~1e-12, so the inverse
    # checks what callers will check.
    return _smallest_safe(h, root_t / max(epsilon, 1e-3), ok)


def gaussian_rdp(*, noise_multiplier: float, orders: Sequence[float] | np.ndarray) -> np.ndarray:
    """Renyi DP of one sensitivity-1 Gaussian release: ``alpha / (2 sigma^2)`` at each order ``alpha``.

    Args:
        noise_multiplier: Noise std divided by the L2 sensitivity, > 0.
        orders: RDP orders, each > 1.

    Returns:
        An array of RDP values, one per order.

    Raises:
        ValueError: On a non-positive noise multiplier or an order <= 1.
    """
    nm = _check_positive("noise_multiplier", noise_multiplier)
    alphas = np.atleast_1d(np.asarray(orders, dtype=np.float64))
    if alphas.size == 0 or not np.all(alphas > 1):
        raise ValueError(f"RDP orders must be a non-empty sequence of numbers > 1, got {orders!r}")
    return alphas / (2.0 * nm * nm)


def gaussian_sigma(
    *, epsilon: float, delta: float, sensitivity: float = 1.0, calibration: str = "classic"
) -> float:
    """Noise std of a Gaussian mechanism that is ``(epsilon, delta)``-DP for one release of L2 ``sensitivity``.

    Two calibrations:

    * ``"classic"``: the formula of paper 000 (DP-MGE/DP-DRE),
      ``sigma = (sqrt(2 log(1/delta) + 2 eps) + sqrt(2 log(1/delta))) / (2 eps) * sensitivity``.
    * ``"analytic"``: Balle & Wang 2018's analytic Gaussian mechanism, the smallest sigma with
      ``Phi(Δ/(2σ) - εσ/Δ) - e^ε Phi(-Δ/(2σ) - εσ/Δ) <= delta`` (exact; never larger than "classic").

    Args:
        epsilon: Target epsilon, finite and > 0.
        delta: Target delta in (0, 1).
        sensitivity: L2 sensitivity of the released statistic, > 0.
        calibration: ``"classic"`` or ``"analytic"``.

    Returns:
        The noise standard deviation; for "analytic" its delta at ``epsilon`` never exceeds ``delta``.

    Raises:
        ValueError: On invalid arguments or an unknown calibration.
    """
    if calibration not in CALIBRATIONS:
        raise ValueError(
            f"unknown Gaussian calibration {calibration!r}; allowed: {', '.join(repr(c) for c in CALIBRATIONS)}"
        )
    epsilon = _check_positive("epsilon", epsilon)
    delta = _check_delta("delta", delta)
    sensitivity = _check_positive("sensitivity", sensitivity)
    if calibration == "classic":
        log_inv = math.log(1.0 / delta)
        return (math.sqrt(2.0 * log_inv + 2.0 * epsilon) + math.sqrt(2.0 * log_inv)) / (2.0 * epsilon) * sensitivity
    log_target = math.log(delta)

    # Work with the unit-sensitivity noise multiplier s = sigma/Δ (mu = 1/s); delta decreases as s grows.
    def h(s: float) -> float:
        return _log_gdp_delta(1.0 / s, epsilon) - log_target

    def ok(s: float) -> bool:
        return math.exp(_log_gdp_delta(1.0 / s, epsilon)) <= delta

    sigma = _smallest_safe(h, 1.0 / max(epsilon, 1e-3), ok) * sensitivity
    # Scaling by the sensitivity can round mu = sensitivity/sigma up by an ulp: step to the safe side again.
    while math.exp(_log_gdp_delta(sensitivity / sigma, epsilon)) > delta:
        sigma = math.nextafter(sigma, math.inf)
    logger.debug("analytic Gaussian sigma=%.6g for eps=%g delta=%g sensitivity=%g", sigma, epsilon, delta, sensitivity)
    return sigma
