"""Private hyperparameter tuning: the RDP cost of running a DP trial a random number of times and releasing the best.

Papernot & Steinke (2022), "Hyperparameter tuning with Renyi differential privacy" (ICLR, arXiv:2110.03620): draw
the number of trials K at random, run K independent DP trials (each with its own hyperparameters drawn from a fixed,
data-independent search space, and a DP score), release only the best-scoring trial's output and score. K and the
other trials stay secret. If one trial is (lambda, eps(lambda))-RDP, the whole search is RDP with

* K ~ Poisson(mu) (``shape = inf``; K = 0 releases nothing), their Thm 6::

      eps'(lambda) = eps(lambda) + mu * delta_hat + log(mu) / (lambda - 1),
      delta_hat = the trial's delta at eps_hat = log(1 + 1 / (lambda - 1));

* K ~ truncated negative binomial D(eta, gamma) on {1, 2, ...} (``shape = eta >= 0``: 0 the logarithmic, 1 the
  geometric distribution), their Thm 2, for every pair (lambda_hat, eps(lambda_hat)) of the same curve::

      eps'(lambda) = eps(lambda) + (1 + eta) * (1 - 1/lambda_hat) * eps(lambda_hat)
                     + (1 + eta) * log(1/gamma) / lambda_hat + log(E[K]) / (lambda - 1),

  minimised over lambda_hat, then made non-decreasing in lambda (RDP is monotone in the order).

Written here rather than taken from dp_accounting's ``RepeatAndSelectDpEvent``: a dpsyn trial's curve can hold PATE
events (:class:`dpsyn.privacy.PATEEvent`), which are not ``DpEvent`` s, so the ledger needs the formula on a curve.
tests/test_private_tuning.py checks it against dp_accounting's RDP accountant (an independent implementation).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from dpsyn.privacy.dpsgd import _check_orders

POISSON = math.inf
"""``shape`` of the Poisson distribution of the number of trials."""


def check_trials_distribution(*, mean: float, shape: float) -> tuple[float, float]:
    """Validate the distribution of the number of trials: ``mean`` >= 1 (> 1 for a truncated negative binomial),
    ``shape`` = inf (Poisson) or >= 0 (truncated negative binomial; 0 logarithmic, 1 geometric).

    Shapes in (-1, 0), which Papernot & Steinke allow, are refused: numpy cannot draw from them.
    """
    try:
        mean, shape = float(mean), float(shape)
    except (TypeError, ValueError):
        raise ValueError(f"mean and shape of the number of trials must be numbers, got {mean!r}, {shape!r}") from None
    if math.isnan(shape) or shape < 0:
        raise ValueError(f"shape of the number of trials must be >= 0 (0 logarithmic, 1 geometric, a truncated "
                         f"negative binomial) or inf (Poisson), got {shape}")
    if not (math.isfinite(mean) and mean >= 1.0):
        raise ValueError(f"mean number of trials must be a finite number >= 1, got {mean}")
    if math.isfinite(shape) and mean <= 1.0:
        raise ValueError("mean number of trials must be > 1 for a truncated negative binomial (mean 1 is one trial: "
                         "no tuning)")
    return mean, shape


def tnb_mean(*, shape: float, gamma: float) -> float:
    """E[K] of the truncated negative binomial D(eta = shape, gamma) on {1, 2, ...} (Papernot & Steinke, Sec. 2)."""
    if not 0.0 < gamma < 1.0:
        raise ValueError(f"gamma must lie in (0, 1), got {gamma}")
    if shape == 0.0:  # logarithmic: P[K = k] proportional to (1 - gamma)^k / k
        return (1.0 - gamma) / (gamma * math.log(1.0 / gamma))
    return shape * (1.0 - gamma) / (gamma * (1.0 - gamma**shape))


def tnb_gamma(*, shape: float, mean: float) -> float:
    """The gamma in (0, 1) at which the truncated negative binomial with ``shape`` has mean ``mean`` (bisection on
    log gamma; the mean decreases as gamma grows)."""
    mean, shape = check_trials_distribution(mean=mean, shape=shape)
    if not math.isfinite(shape):
        raise ValueError("the Poisson distribution has no gamma")
    lo, hi = -700.0, 0.0  # log gamma
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if mid == lo or mid == hi:
            break
        if tnb_mean(shape=shape, gamma=math.exp(mid)) > mean:
            lo = mid
        else:
            hi = mid
    return math.exp(0.5 * (lo + hi))


def draw_trial_count(*, mean: float, shape: float, generator: np.random.Generator) -> int:
    """Draw the number of trials K. ``generator`` must be a DP-noise generator
    (:func:`dpsyn.privacy.dp_numpy_generator`): K is part of the mechanism and must stay secret."""
    mean, shape = check_trials_distribution(mean=mean, shape=shape)
    if not math.isfinite(shape):
        return int(generator.poisson(mean))
    gamma = tnb_gamma(shape=shape, mean=mean)
    if shape == 0.0:
        return int(generator.logseries(1.0 - gamma))
    while True:  # a negative binomial (failures before `shape` successes of probability gamma), conditioned on >= 1
        k = int(generator.negative_binomial(shape, gamma))
        if k >= 1:
            return k


def rdp_to_delta(*, rdp: Sequence[float] | np.ndarray, orders: Sequence[float] | np.ndarray, epsilon: float) -> float:
    """Delta at ``epsilon`` of an RDP curve: the inverse of :func:`dpsyn.privacy.dpsgd.rdp_to_epsilon` (Balle et al.
    2020, Thm 21), ``min over lambda of exp((lambda-1)(eps(lambda) - epsilon + log(1 - 1/lambda)) - log lambda)``,
    at most 1."""
    alphas = _check_orders(orders)
    r = np.asarray(rdp, dtype=np.float64)
    if r.shape != alphas.shape or np.any(np.isnan(r)) or np.any(r < 0):
        raise ValueError("rdp must hold one value >= 0 per order")
    with np.errstate(invalid="ignore"):
        log_delta = (alphas - 1.0) * (r - epsilon + np.log1p(-1.0 / alphas)) - np.log(alphas)
    log_delta = np.where(np.isinf(r), np.inf, log_delta)
    return float(min(1.0, math.exp(min(0.0, float(np.min(log_delta))))))


def repeat_and_select_rdp(
    *, rdp: Sequence[float] | np.ndarray, orders: Sequence[float] | np.ndarray, mean: float, shape: float
) -> np.ndarray:
    """The RDP curve of the best of K trials, from one trial's curve (the module docstring's formulas).

    Args:
        rdp: One trial's RDP, one value per order (inf where it has no bound).
        orders: RDP orders, each > 1.
        mean: E[K].
        shape: :data:`POISSON` or the truncated negative binomial's eta >= 0.

    Returns:
        The search's RDP at ``orders`` (inf where no bound applies).
    """
    alphas = _check_orders(orders)
    r = np.asarray(rdp, dtype=np.float64)
    if r.shape != alphas.shape or np.any(np.isnan(r)) or np.any(r < 0):
        raise ValueError("rdp must hold one value >= 0 per order")
    mean, shape = check_trials_distribution(mean=mean, shape=shape)
    if not math.isfinite(shape):
        out = np.empty_like(r)
        for i, lam in enumerate(alphas):
            delta_hat = rdp_to_delta(rdp=r, orders=alphas, epsilon=math.log1p(1.0 / (lam - 1.0)))
            out[i] = r[i] + mean * delta_hat + math.log(mean) / (lam - 1.0)
        return out
    log_inv_gamma = -math.log(tnb_gamma(shape=shape, mean=mean))
    with np.errstate(invalid="ignore"):
        per_hat = (1.0 + shape) * ((1.0 - 1.0 / alphas) * r + log_inv_gamma / alphas)
    const = float(np.min(per_hat))
    out = r + const + math.log(mean) / (alphas - 1.0)
    # monotonicity in the order: the bound at lambda holds at every smaller order too
    order = np.argsort(alphas)
    suffix_min = np.minimum.accumulate(out[order][::-1])[::-1]
    result = np.empty_like(out)
    result[order] = suffix_min
    return result


def pure_dp_rdp(*, epsilon: float, orders: Sequence[float] | np.ndarray) -> np.ndarray:
    """RDP of an epsilon-DP mechanism: ``min(epsilon, lambda * epsilon^2 / 2)`` (the second through zCDP, Bun &
    Steinke 2016, Prop. 3.3)."""
    alphas = _check_orders(orders)
    return np.minimum(float(epsilon), alphas * float(epsilon) ** 2 / 2.0)


def trials_distribution_name(*, mean: float, shape: float) -> str:
    """``"Poisson(mean 3)"``, ``"geometric (mean 3)"``, ``"logarithmic (mean 3)"`` or ``"truncated negative binomial
    (eta 0.5, mean 3)"``."""
    if not math.isfinite(shape):
        return f"Poisson (mean {mean:g})"
    if shape == 0.0:
        return f"logarithmic (mean {mean:g})"
    if shape == 1.0:
        return f"geometric (mean {mean:g})"
    return f"truncated negative binomial (eta {shape:g}, mean {mean:g})"
