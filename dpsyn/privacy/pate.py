"""PATE's Confident-GNMax aggregator and its Renyi-DP accounting (Papernot et al. 2018, "Scalable Private Learning
with PATE"), used by G-PATE (paper 002) and PATE-GAN.

The mechanism (:func:`confident_gnmax`, Algorithm 1 of Papernot et al.) answers a query from the teachers' vote
histogram ``n`` (one row of ``votes``, ``B`` bins, one vote per teacher):

1. threshold check: answer only if ``max_j n_j + N(0, sigma_threshold^2) >= threshold``;
2. noisy argmax (GNMax): the answer is ``argmax_j (n_j + N(0, sigma^2))``.

One teacher changing its vote moves one vote between two bins, so the histogram's L2 sensitivity is ``sqrt(2)`` and
the maximum count's is 1. Hence the data-independent RDP at order ``lambda`` (Prop. 8, and the Gaussian mechanism):

* GNMax: ``lambda / sigma^2``;
* threshold step: ``lambda / (2 sigma_threshold^2)``.

The data-dependent RDP (Thm 6 with the orders of Prop. 10) is smaller when the teachers agree. For GNMax,
``q`` = Pr[answer != argmax] is bounded by the union bound (Prop. 7)
``q <= sum_{j != j*} Pr[N(0, 2 sigma^2) > n_j* - n_j] = sum_{j != j*} erfc((n_j* - n_j)/(2 sigma))/2``, capped at
``1 - 1/B`` (the argmax is the most likely answer). With ``mu2 = sigma sqrt(log 1/q)``, ``mu1 = mu2 + 1`` and
``eps_i = mu_i/sigma^2`` (the data-independent RDP at order ``mu_i``),

    RDP(lambda) <= 1/(lambda-1) log[(1-q) A^(lambda-1) + q B^(lambda-1)],
    A = (1-q) / (1 - (q e^eps2)^((mu2-1)/mu2)),   B = e^eps1 / q^(1/(mu1-1)),

valid when ``mu2 > 1``, ``lambda < mu1``, ``q e^eps2 < 1`` and ``q <= e^((mu2-1) eps2) / (mu1/(mu1-1) mu2/(mu2-1))^mu2``
(the range where the bound increases in ``q``, so that the union bound may stand in for ``q``). Where any condition
fails the data-independent value is used, and the data-dependent value is always ``min``-ed with it.

The threshold step is a Gaussian mechanism of sensitivity 1 with two outcomes. Thm 6 applies with the likelier
outcome as ``i*`` (so ``q = min(p, 1-p)``, ``p`` = Pr[answered] = ``Phi((max n - threshold)/sigma_threshold)``,
exact, no union bound) and with the noise scale ``sqrt(2) sigma_threshold``: the formula above is written for an
RDP of ``lambda/sigma^2``, and ``lambda/(2 sigma_threshold^2) = lambda/(sqrt(2) sigma_threshold)^2``.

Composition over queries (RDP adds up, the answered/not-answered bit being part of each query's output):

* ``data_dependent=True``: every query pays its data-dependent threshold RDP; a query pays its data-dependent GNMax
  RDP if it was answered (when ``answered`` is given, as in Papernot et al.'s and G-PATE's accounting of a run) or,
  when ``answered`` is not given, always (conservative). The result depends on the private votes: it is not itself
  differentially private to publish (see the smooth-sensitivity release below).
* ``data_dependent=False``: the data-independent bound. Whether a query was answered depends on the data, so dpsyn
  charges every query both steps, ``Q (lambda/(2 sigma_threshold^2) + lambda/sigma^2)``: conservative, and a
  function of public parameters only (it fixes in advance how many queries a budget allows,
  :func:`pate_max_queries`).

RDP -> (eps, delta): Balle et al. 2020, Thm 21, through Opacus's ``get_privacy_spent``, minimised over the orders,
exactly as :class:`dpsyn.privacy.PrivacyLedger` converts every RDP composition. (The pate_2018 code uses the older
``eps = rdp + log(1/delta)/(lambda-1)``, which is never smaller: dpsyn's numbers are at most theirs.)

Smooth-sensitivity release (Papernot et al. 2018, Sec. 4 and App. B-C): the data-dependent RDP at one order
``lambda`` is published as ``RDP(lambda) + SS_beta * N(0, sigma_ss^2)``, where ``SS_beta = max_d e^(-beta d) LS(d)``
and ``LS(d)`` bounds the local sensitivity of the accumulated RDP within distance ``d`` (teachers changed). This "GNSS"
release is itself ``(lambda, lambda e^(2 beta)/sigma_ss^2 + (beta lambda - log(1 - 2 lambda beta)/2)/(lambda-1))``-RDP
for ``1 < lambda < 1/(2 beta)`` (their Thm 23); :func:`pate_smooth_release` returns that cost, and the ledger adds it
(:meth:`dpsyn.privacy.PrivacyLedger.record_pate_smooth_release`). ``lambda``, ``beta`` and ``sigma_ss`` must be fixed
without looking at the votes (the pate_2018 script optimises them on the votes, which it says cannot be released).

The GNMax local-sensitivity bounds (Alg. 3-5) are valid only where the analysis' conditions C5-C6 (App. B.4) hold
for ``(sigma, lambda, bins)``; outside them they can fall below the true local sensitivity (e.g. votes (33, 11, 6),
sigma 0.792, order 10: the exact maximum at distance 1 is 1.268, the unguarded bound 0.569). So
:func:`gnmax_local_sensitivity`, :func:`pate_local_sensitivity` (when a query was answered) and
:func:`pate_smooth_release` all run :func:`check_smooth_sensitivity_conditions` first and raise ValueError, naming
the failing condition, outside them. The threshold step's local sensitivity is exact and needs no condition.

Release options (:data:`PATE_RELEASES`) as a method's config names them: ``"data_independent"`` (what tables call
eps unless the config says otherwise), ``"raw"`` (the data-dependent epsilon, as G-PATE reports it) and ``"smooth"``
(raw accounting during training, then a smooth-sensitivity release of it).

numpy/scipy only, except :func:`confident_gnmax` (torch, imported inside it) and the RDP -> epsilon conversion
(Opacus, imported where needed).
"""

from __future__ import annotations

import functools
import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass
from numbers import Real
from typing import TYPE_CHECKING, Any

import numpy as np
from scipy.special import log_ndtr, logsumexp, ndtri_exp

from dpsyn.privacy.dpsgd import _quiet_opacus, rdp_orders
from dpsyn.privacy.gaussian import _check_count, _check_delta, _check_positive

if TYPE_CHECKING:  # pragma: no cover
    import torch

logger = logging.getLogger(__name__)

PATE_BOUNDS: tuple[str, ...] = ("data_independent", "data_dependent")
"""Which RDP bound an epsilon (or a ledger's :class:`~dpsyn.privacy.ledger.PATEEvent`) uses."""

PATE_RELEASES: tuple[str, ...] = ("data_independent", "raw", "smooth")
"""How a method reports PATE's epsilon (config ``release``); see :func:`pate_bound_for_release`."""

_SQRT2 = math.sqrt(2.0)


# --------------------------------------------------------------------------------------------------------------------
# validation helpers
# --------------------------------------------------------------------------------------------------------------------


def _check_real(name: str, value: float) -> float:
    """Return ``value`` as a float if it is a finite real number, else raise ValueError."""
    if isinstance(value, bool) or not isinstance(value, Real) or not math.isfinite(float(value)):
        raise ValueError(f"{name} must be a finite real number, got {value!r}")
    return float(value)


def _check_orders(orders: Sequence[float] | np.ndarray | None) -> np.ndarray:
    """The orders as a 1-D float array (dpsyn's :func:`~dpsyn.privacy.dpsgd.rdp_orders` when None), each > 1."""
    if orders is None:
        return np.asarray(rdp_orders(), dtype=np.float64)
    alphas = np.atleast_1d(np.asarray(orders, dtype=np.float64))
    if alphas.ndim != 1 or alphas.size == 0 or not np.all(np.isfinite(alphas)) or not np.all(alphas > 1):
        raise ValueError(f"RDP orders must be a non-empty sequence of finite numbers > 1, got {orders!r}")
    return alphas


def _as_numpy(x: Any) -> np.ndarray:
    """``x`` as a numpy array; torch tensors (CPU or GPU) are detached and copied to the CPU first."""
    if hasattr(x, "detach") and hasattr(x, "cpu"):  # a torch.Tensor, without importing torch
        x = x.detach().cpu().numpy()
    return np.asarray(x)


def _check_votes(votes: Any) -> np.ndarray:
    """``votes`` as a float64 array of shape (queries, bins): integer counts >= 0, at least 2 bins."""
    v = _as_numpy(votes)
    if v.dtype == np.bool_ or not (np.issubdtype(v.dtype, np.integer) or np.issubdtype(v.dtype, np.floating)):
        raise ValueError(f"votes must be an array of vote counts, got dtype {v.dtype}")
    if v.ndim != 2 or v.shape[1] < 2:
        raise ValueError(f"votes must be a 2-D array (queries, bins) with at least 2 bins, got shape {v.shape}")
    v = v.astype(np.float64)
    if not np.all(np.isfinite(v)) or np.any(v < 0) or np.any(v != np.round(v)):
        raise ValueError("votes must be integer counts >= 0 (one vote per teacher per query)")
    return v


def _check_answered(answered: Any, queries: int) -> np.ndarray:
    """``answered`` as a bool array of shape (queries,)."""
    a = _as_numpy(answered)
    if a.shape != (queries,):
        raise ValueError(f"answered must have shape ({queries},) (one flag per query), got {a.shape}")
    if a.dtype != np.bool_:
        if not np.all(np.isin(a, (0, 1))):
            raise ValueError("answered must hold booleans (True where the query was answered)")
        a = a.astype(bool)
    return a


def check_pate_bound(bound: str) -> str:
    """Return ``bound`` if it is one of :data:`PATE_BOUNDS`.

    Raises:
        ValueError: Naming the allowed bounds otherwise.
    """
    if bound not in PATE_BOUNDS:
        raise ValueError(f"unknown PATE bound {bound!r}; allowed: {', '.join(repr(b) for b in PATE_BOUNDS)}")
    return bound


def pate_bound_for_release(release: str) -> str:
    """The ledger bound a release option implies: ``"data_independent"`` for itself, ``"data_dependent"`` otherwise.

    ``"raw"`` reports the data-dependent epsilon; ``"smooth"`` accounts with it during training and publishes it
    through :func:`pate_smooth_release` at the end.

    Raises:
        ValueError: Naming the allowed releases if ``release`` is not one of :data:`PATE_RELEASES`.
    """
    if release not in PATE_RELEASES:
        raise ValueError(f"unknown PATE release {release!r}; allowed: {', '.join(repr(r) for r in PATE_RELEASES)}")
    return "data_independent" if release == "data_independent" else "data_dependent"


# --------------------------------------------------------------------------------------------------------------------
# pure RDP functions (vectorised over queries and orders)
# --------------------------------------------------------------------------------------------------------------------


def gnmax_rdp_data_independent(*, sigma: float, orders: Sequence[float] | np.ndarray) -> np.ndarray:
    """Data-independent RDP of one GNMax answer: ``lambda / sigma^2`` (histogram L2 sensitivity sqrt 2; Prop. 8).

    Args:
        sigma: Std of the Gaussian noise added to each vote count, > 0.
        orders: RDP orders, each > 1.

    Returns:
        One RDP value per order.

    Raises:
        ValueError: On a non-positive sigma or an order <= 1.
    """
    sigma = _check_positive("sigma", sigma)
    return _check_orders(orders) / (sigma * sigma)


def threshold_rdp_data_independent(*, sigma_threshold: float, orders: Sequence[float] | np.ndarray) -> np.ndarray:
    """Data-independent RDP of one threshold check: ``lambda / (2 sigma_threshold^2)`` (max count, sensitivity 1).

    Args:
        sigma_threshold: Std of the Gaussian noise added to the maximum vote count, > 0.
        orders: RDP orders, each > 1.

    Returns:
        One RDP value per order.

    Raises:
        ValueError: On a non-positive sigma_threshold or an order <= 1.
    """
    sigma_threshold = _check_positive("sigma_threshold", sigma_threshold)
    return _check_orders(orders) / (2.0 * sigma_threshold * sigma_threshold)


def gnmax_logq(*, votes: Any, sigma: float) -> np.ndarray:
    """Upper bound on ``log Pr[GNMax answer != argmax]`` per query (Prop. 7: union bound, capped at ``1 - 1/B``).

    Args:
        votes: Vote counts, shape (queries, bins).
        sigma: Std of the GNMax noise, > 0.

    Returns:
        ``log q`` per query, shape (queries,).

    Raises:
        ValueError: On invalid votes or sigma.
    """
    v = _check_votes(votes)
    sigma = _check_positive("sigma", sigma)
    return _gnmax_logq(v, sigma)


def _gnmax_logq(v: np.ndarray, sigma: float) -> np.ndarray:
    n_bins = v.shape[1]
    if v.shape[0] == 0:
        return np.zeros(0)
    top = np.argmax(v, axis=1)
    gaps = v[np.arange(v.shape[0]), top][:, None] - v  # >= 0
    # Pr[n_j + Z_j > n_* + Z_*] = Pr[N(0, 2 sigma^2) > gap] = Phi(-gap / (sqrt(2) sigma)), in log space
    log_terms = log_ndtr(-gaps / (_SQRT2 * sigma))
    log_terms[np.arange(v.shape[0]), top] = -np.inf  # exclude the argmax itself (exactly one index)
    logq = logsumexp(log_terms, axis=1)
    return np.minimum(logq, math.log1p(-1.0 / n_bins))


def gnmax_rdp_from_logq(*, logq: Any, sigma: float, orders: Sequence[float] | np.ndarray) -> np.ndarray:
    """Data-dependent RDP of GNMax given an upper bound ``log q`` on Pr[answer != argmax] (Thm 6, Prop. 10).

    Falls back to the data-independent ``lambda/sigma^2`` wherever Thm 6's conditions fail, and is never above it.

    Args:
        logq: ``log q`` per query, each <= 0 (``-inf``: the answer is certain, RDP 0); shape (queries,) or scalar.
        sigma: The noise scale of a mechanism whose RDP is ``lambda/sigma^2`` (GNMax's sigma, or
            ``sqrt(2) sigma_threshold`` for the threshold step).
        orders: RDP orders, each > 1.

    Returns:
        RDP per query and order, shape (queries, orders) (``(orders,)`` for a scalar ``logq``).

    Raises:
        ValueError: On ``logq > 0`` or NaN, a non-positive sigma or an order <= 1.
    """
    sigma = _check_positive("sigma", sigma)
    alphas = _check_orders(orders)
    lq = np.asarray(logq, dtype=np.float64)
    scalar = lq.ndim == 0
    lq = np.atleast_1d(lq)
    if lq.ndim != 1 or np.any(np.isnan(lq)) or np.any(lq > 0):
        raise ValueError("logq must be a 1-D array (or scalar) of log-probabilities <= 0")
    out = _rdp_from_logq(lq, sigma * sigma, alphas)
    return out[0] if scalar else out


def _log1mexp(x: np.ndarray) -> np.ndarray:
    """``log(1 - e^x)`` for ``x < 0``, accurate at both ends (log1p for tiny e^x, log(-expm1) near 0)."""
    x = np.asarray(x, dtype=np.float64)
    out = np.empty_like(x)
    small = x < -math.log(2.0)
    out[small] = np.log1p(-np.exp(x[small]))
    out[~small] = np.log(-np.expm1(x[~small]))
    return out


def _rdp_from_logq(lq: np.ndarray, var: float, alphas: np.ndarray) -> np.ndarray:
    """Thm 6 with Prop. 10's orders, vectorised: ``lq`` (Q,), ``alphas`` (K,) -> (Q, K).

    ``var`` is the variance ``sigma^2`` of a mechanism whose RDP is ``lambda/var`` (GNMax: ``sigma^2``; the
    threshold step: ``2 sigma_threshold^2``), passed as such so that the fallback equals the data-independent
    functions' value exactly.
    """
    sigma = math.sqrt(var)
    independent = alphas / var
    out = np.broadcast_to(independent, (lq.size, alphas.size)).copy()
    certain = np.isneginf(lq)
    out[certain] = 0.0  # the output is fixed: no privacy loss at all
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        mu2 = sigma * np.sqrt(-lq)
        mu1 = mu2 + 1.0
        eps1 = mu1 / var
        eps2 = mu2 / var
        # Thm 6's conditions (per query): mu2 > 1; q e^eps2 < 1 (A > 0); q small enough that the bound increases in q
        q_max = (mu2 - 1.0) * eps2 - mu2 * (np.log(mu1 / (mu1 - 1.0)) + np.log(mu2 / (mu2 - 1.0)))
        ok_query = (~certain) & (mu2 > 1.0) & (lq + eps2 < 0.0) & (lq <= q_max)
        if not np.any(ok_query):
            return out
        lqv, mu1v, mu2v, eps1v, eps2v = (x[ok_query][:, None] for x in (lq, mu1, mu2, eps1, eps2))
        a = alphas[None, :]
        log_1mq = _log1mexp(lqv)  # log(1 - q)
        # log(1 - (q e^eps2)^((mu2-1)/mu2)); q e^eps2 < 1, so the exponent is < 0
        log_1m_qe = _log1mexp((lqv + eps2v) * (mu2v - 1.0) / mu2v)
        log_a = log_1mq - log_1m_qe
        log_b = eps1v - lqv / (mu1v - 1.0)
        bound = np.logaddexp(log_1mq + (a - 1.0) * log_a, lqv + (a - 1.0) * log_b) / (a - 1.0)
        ok = (a < mu1v) & np.isfinite(bound)
        sub = out[ok_query]
        sub[ok] = np.minimum(sub[ok], np.maximum(bound[ok], 0.0))
        out[ok_query] = sub
    return out


def gnmax_rdp(*, votes: Any, sigma: float, orders: Sequence[float] | np.ndarray) -> np.ndarray:
    """Data-dependent RDP of one GNMax answer per query (Prop. 7 + Thm 6), never above ``lambda/sigma^2``.

    Args:
        votes: Vote counts, shape (queries, bins).
        sigma: Std of the GNMax noise, > 0.
        orders: RDP orders, each > 1.

    Returns:
        RDP per query and order, shape (queries, orders).

    Raises:
        ValueError: On invalid votes, sigma or orders.
    """
    v = _check_votes(votes)
    sigma = _check_positive("sigma", sigma)
    alphas = _check_orders(orders)
    return _rdp_from_logq(_gnmax_logq(v, sigma), sigma * sigma, alphas)


def threshold_logpr_answered(*, votes: Any, sigma_threshold: float, threshold: float) -> np.ndarray:
    """``log Pr[max_j n_j + N(0, sigma_threshold^2) >= threshold]`` per query (exact).

    Args:
        votes: Vote counts, shape (queries, bins).
        sigma_threshold: Std of the threshold noise, > 0.
        threshold: The threshold ``T`` on the noisy maximum count.

    Returns:
        ``log p`` per query, shape (queries,).

    Raises:
        ValueError: On invalid arguments.
    """
    v = _check_votes(votes)
    s1 = _check_positive("sigma_threshold", sigma_threshold)
    t = _check_real("threshold", threshold)
    return log_ndtr((v.max(axis=1, initial=0.0) - t) / s1)


def threshold_rdp(
    *, votes: Any, sigma_threshold: float, threshold: float, orders: Sequence[float] | np.ndarray
) -> np.ndarray:
    """Data-dependent RDP of one threshold check per query, never above ``lambda/(2 sigma_threshold^2)``.

    Thm 6 with ``q = min(p, 1-p)`` (``p`` = Pr[answered]) and noise scale ``sqrt(2) sigma_threshold``.

    Args:
        votes: Vote counts, shape (queries, bins).
        sigma_threshold: Std of the threshold noise, > 0.
        threshold: The threshold ``T``.
        orders: RDP orders, each > 1.

    Returns:
        RDP per query and order, shape (queries, orders).

    Raises:
        ValueError: On invalid arguments.
    """
    v = _check_votes(votes)
    s1 = _check_positive("sigma_threshold", sigma_threshold)
    t = _check_real("threshold", threshold)
    alphas = _check_orders(orders)
    return _rdp_from_logq(_threshold_logq(v.max(axis=1, initial=0.0), s1, t), 2.0 * s1 * s1, alphas)


def _threshold_logq(max_votes: np.ndarray, s1: float, t: float) -> np.ndarray:
    """``log min(p, 1-p)``, both tails computed directly (no cancellation in ``1 - p``)."""
    z = (max_votes - t) / s1
    return np.minimum(log_ndtr(z), log_ndtr(-z))


def confident_gnmax_rdp(
    *,
    votes: Any,
    sigma_threshold: float,
    sigma: float,
    threshold: float,
    orders: Sequence[float] | np.ndarray,
    answered: Any = None,
    data_dependent: bool = True,
) -> np.ndarray:
    """RDP of Confident-GNMax over all queries in ``votes``, composed (summed) per order.

    Args:
        votes: Vote counts, shape (queries, bins).
        sigma_threshold: Std of the threshold noise, > 0.
        sigma: Std of the GNMax noise, > 0.
        threshold: The threshold ``T`` on the noisy maximum count.
        orders: RDP orders, each > 1.
        answered: Which queries were answered, shape (queries,) bool. Data-dependent bound only: answered queries
            pay GNMax, the others do not. ``None``: every query pays GNMax (conservative).
        data_dependent: False for the data-independent bound, ``Q (lambda/(2 sigma_threshold^2) + lambda/sigma^2)``
            (``answered`` is then ignored: whether a query is answered depends on the data).

    Returns:
        The composed RDP, one value per order.

    Raises:
        ValueError: On invalid arguments.
    """
    v = _check_votes(votes)
    s1 = _check_positive("sigma_threshold", sigma_threshold)
    s2 = _check_positive("sigma", sigma)
    t = _check_real("threshold", threshold)
    alphas = _check_orders(orders)
    if not isinstance(data_dependent, bool):
        raise ValueError(f"data_dependent must be True or False, got {data_dependent!r}")
    mask = None if answered is None else _check_answered(answered, v.shape[0])
    n = v.shape[0]
    if not data_dependent:
        return n * (alphas / (2.0 * s1 * s1) + alphas / (s2 * s2))
    rdp = _rdp_from_logq(_threshold_logq(v.max(axis=1, initial=0.0), s1, t), 2.0 * s1 * s1, alphas).sum(axis=0)
    gn = v if mask is None else v[mask]
    if gn.shape[0]:
        rdp = rdp + _rdp_from_logq(_gnmax_logq(gn, s2), s2 * s2, alphas).sum(axis=0)
    # Each query's bound is already <= its data-independent one; this keeps rounding in the sums from inverting it.
    return np.minimum(rdp, n * (alphas / (2.0 * s1 * s1) + alphas / (s2 * s2)))


# --------------------------------------------------------------------------------------------------------------------
# RDP -> (eps, delta), and epsilon of a run
# --------------------------------------------------------------------------------------------------------------------


def rdp_to_epsilon(
    *, rdp: Sequence[float] | np.ndarray, orders: Sequence[float] | np.ndarray, delta: float
) -> tuple[float, float]:
    """Epsilon at ``delta`` of an RDP curve: Balle et al. 2020, Thm 21 (Opacus's ``get_privacy_spent``), best order.

    The same conversion :class:`~dpsyn.privacy.PrivacyLedger` applies to every RDP composition. ``inf`` RDP values
    (orders where a mechanism has no bound) are allowed.

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


@dataclass(frozen=True)
class PATEPrivacy:
    """Epsilon of a set of Confident-GNMax queries and how it was obtained (:func:`pate_privacy`).

    Attributes:
        epsilon: Epsilon at ``delta`` (Balle et al. 2020 conversion, min over ``orders``).
        delta: The delta.
        order: The order that gave ``epsilon``.
        orders: The orders, shape (K,).
        rdp: The composed RDP curve, shape (K,).
        bound: ``"data_dependent"`` or ``"data_independent"``.
        queries: Number of queries.
        answered: Number of answered queries (None when not given).
        expected_answered: Sum over queries of Pr[answered] given the votes (data-dependent, for diagnostics).
    """

    epsilon: float
    delta: float
    order: float
    orders: np.ndarray
    rdp: np.ndarray
    bound: str
    queries: int
    answered: int | None
    expected_answered: float


def pate_privacy(
    *,
    votes: Any,
    sigma_threshold: float,
    sigma: float,
    threshold: float,
    delta: float,
    data_dependent: bool = True,
    answered: Any = None,
    orders: Sequence[float] | np.ndarray | None = None,
) -> PATEPrivacy:
    """Epsilon of Confident-GNMax over the queries in ``votes``, with the RDP curve and its best order.

    See :func:`confident_gnmax_rdp` for the bounds; ``orders`` defaults to the ledger's
    (:func:`dpsyn.privacy.dpsgd.rdp_orders`), so a single PATE event in a ledger gives the same epsilon.

    Raises:
        ValueError: On invalid arguments.
    """
    v = _check_votes(votes)
    alphas = _check_orders(orders)
    rdp = confident_gnmax_rdp(
        votes=v,
        sigma_threshold=sigma_threshold,
        sigma=sigma,
        threshold=threshold,
        orders=alphas,
        answered=answered,
        data_dependent=data_dependent,
    )
    mask = None if answered is None else _check_answered(answered, v.shape[0])
    if v.shape[0] == 0:
        eps, best = 0.0, float(alphas[0])
        _check_delta("delta", delta)
    else:
        eps, best = rdp_to_epsilon(rdp=rdp, orders=alphas, delta=delta)
    log_p = log_ndtr((v.max(axis=1, initial=0.0) - float(threshold)) / float(sigma_threshold))
    return PATEPrivacy(
        epsilon=eps,
        delta=float(delta),
        order=best,
        orders=alphas,
        rdp=rdp,
        bound="data_dependent" if data_dependent else "data_independent",
        queries=int(v.shape[0]),
        answered=None if mask is None else int(mask.sum()),
        expected_answered=float(np.exp(log_p).sum()),
    )


def pate_epsilon(
    *,
    votes: Any,
    sigma_threshold: float,
    sigma: float,
    threshold: float,
    delta: float,
    data_dependent: bool = True,
    answered: Any = None,
    orders: Sequence[float] | np.ndarray | None = None,
) -> float:
    """Epsilon of Confident-GNMax (Papernot et al. 2018) over the queries in ``votes``.

    Args:
        votes: Vote counts, shape (queries, bins); each row is one query's histogram over the bins.
        sigma_threshold: Std of the noise on the maximum count (G-PATE's sigma1), > 0.
        sigma: Std of the GNMax noise on each count (G-PATE's sigma2), > 0.
        threshold: The threshold ``T`` on the noisy maximum count.
        delta: Target delta in (0, 1).
        data_dependent: True: Papernot et al.'s data-dependent bound (not itself private to publish). False: the
            data-independent bound, every query charged both steps.
        answered: Which queries were answered (data-dependent bound only); None charges GNMax for every query.
        orders: RDP orders; the ledger's by default.

    Returns:
        Epsilon (0.0 for no queries).

    Raises:
        ValueError: On invalid arguments.
    """
    return pate_privacy(
        votes=votes,
        sigma_threshold=sigma_threshold,
        sigma=sigma,
        threshold=threshold,
        delta=delta,
        data_dependent=data_dependent,
        answered=answered,
        orders=orders,
    ).epsilon


def pate_data_independent_epsilon(
    *, queries: int, sigma_threshold: float, sigma: float, delta: float,
    orders: Sequence[float] | np.ndarray | None = None,
) -> float:
    """Data-independent epsilon of ``queries`` Confident-GNMax queries (every query charged both steps).

    Raises:
        ValueError: On invalid arguments.
    """
    n = _check_count("queries", queries)
    s1 = _check_positive("sigma_threshold", sigma_threshold)
    s2 = _check_positive("sigma", sigma)
    delta = _check_delta("delta", delta)
    alphas = _check_orders(orders)
    if n == 0:
        return 0.0
    rdp = n * (alphas / (2.0 * s1 * s1) + alphas / (s2 * s2))
    return rdp_to_epsilon(rdp=rdp, orders=alphas, delta=delta)[0]


def pate_max_queries(
    *, epsilon: float, sigma_threshold: float, sigma: float, delta: float,
    orders: Sequence[float] | np.ndarray | None = None,
) -> int:
    """The largest number of queries whose data-independent epsilon is at most ``epsilon``.

    This fixes, before training, how many Confident-GNMax queries a budget allows (e.g. how long G-PATE trains).

    Args:
        epsilon: The budget, finite and > 0.
        sigma_threshold: Std of the threshold noise, > 0.
        sigma: Std of the GNMax noise, > 0.
        delta: Target delta in (0, 1).
        orders: RDP orders; the ledger's by default.

    Returns:
        ``Q`` with ``pate_data_independent_epsilon(queries=Q, ...) <= epsilon < ... (queries=Q+1)`` (0 if even one
        query overspends).

    Raises:
        ValueError: On invalid arguments.
    """
    epsilon = _check_positive("epsilon", epsilon)
    kw = dict(sigma_threshold=sigma_threshold, sigma=sigma, delta=delta, orders=orders)

    def fits(n: int) -> bool:
        return pate_data_independent_epsilon(queries=n, **kw) <= epsilon

    if not fits(1):
        return 0
    lo, hi = 1, 2
    while fits(hi):
        lo, hi = hi, hi * 2
        if hi > 1 << 62:
            raise ValueError("the budget allows an unbounded number of queries (is sigma huge?)")
    while hi - lo > 1:  # invariant: fits(lo), not fits(hi); epsilon increases with the number of queries
        mid = (lo + hi) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid
    return lo


# --------------------------------------------------------------------------------------------------------------------
# the mechanism (torch: runs where the votes are, GPU included)
# --------------------------------------------------------------------------------------------------------------------


def confident_gnmax(
    votes: torch.Tensor, *, sigma_threshold: float, sigma: float, threshold: float, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """Confident-GNMax (Papernot et al. 2018, Algorithm 1) on a batch of queries.

    Query ``i`` is answered iff ``max_j votes[i, j] + N(0, sigma_threshold^2) >= threshold``; its answer is then
    ``argmax_j (votes[i, j] + N(0, sigma^2))``. The noise comes from ``generator`` only (get it from
    :func:`dpsyn.privacy.dp_generator`: OS entropy unless deterministic for tests), on the votes' device.

    Args:
        votes: Vote counts, shape (queries, bins), on any device.
        sigma_threshold: Std of the threshold noise, > 0.
        sigma: Std of the GNMax noise, > 0.
        threshold: The threshold ``T``.
        generator: A ``torch.Generator`` on the votes' device.

    Returns:
        ``(answered, label)``: bool (queries,) and int64 (queries,) with ``-1`` where not answered.

    Raises:
        ValueError: On invalid arguments or a generator on another device.
    """
    import torch

    if not isinstance(votes, torch.Tensor):
        raise ValueError(f"votes must be a torch.Tensor of shape (queries, bins), got {type(votes).__name__}")
    if votes.ndim != 2 or votes.shape[1] < 2:
        raise ValueError(f"votes must have shape (queries, bins) with at least 2 bins, got {tuple(votes.shape)}")
    if votes.dtype == torch.bool or votes.is_complex():
        raise ValueError(f"votes must hold vote counts, got dtype {votes.dtype}")
    s1 = _check_positive("sigma_threshold", sigma_threshold)
    s2 = _check_positive("sigma", sigma)
    t = _check_real("threshold", threshold)
    if not isinstance(generator, torch.Generator):
        raise ValueError(f"generator must be a torch.Generator (dpsyn.privacy.dp_generator), got {generator!r}")
    gdev, vdev = torch.device(generator.device), votes.device
    if gdev.type != vdev.type or (gdev.index is not None and vdev.index is not None and gdev.index != vdev.index):
        raise ValueError(f"generator is on {gdev} but the votes are on {vdev}")
    dtype = torch.float64 if votes.dtype == torch.float64 else torch.float32  # never half precision for DP noise
    counts = votes.to(dtype)
    q, b = counts.shape
    noise_max = torch.randn(q, generator=generator, device=counts.device, dtype=dtype)
    answered = counts.amax(dim=1) + s1 * noise_max >= t
    noise = torch.randn(q, b, generator=generator, device=counts.device, dtype=dtype)
    label = torch.argmax(counts + s2 * noise, dim=1)
    label = torch.where(answered, label, torch.full_like(label, -1))
    return answered, label


# --------------------------------------------------------------------------------------------------------------------
# smooth sensitivity (Papernot et al. 2018, App. B-C)
# --------------------------------------------------------------------------------------------------------------------


def gnss_rdp(*, beta: float, sigma_ss: float, orders: Sequence[float] | np.ndarray) -> np.ndarray:
    """RDP of releasing ``f(D) + SS_beta(D) N(0, sigma_ss^2)`` (Papernot et al. 2018, Thm 23).

    ``lambda e^(2 beta)/sigma_ss^2 + (beta lambda - log(1 - 2 lambda beta)/2)/(lambda - 1)`` for
    ``1 < lambda < 1/(2 beta)``; ``inf`` at larger orders (no bound there).

    Raises:
        ValueError: On a non-positive beta or sigma_ss or an order <= 1.
    """
    beta = _check_positive("beta", beta)
    s = _check_positive("sigma_ss", sigma_ss)
    alphas = _check_orders(orders)
    out = np.full(alphas.shape, np.inf)
    ok = alphas < 1.0 / (2.0 * beta)
    a = alphas[ok]
    out[ok] = a * math.exp(2.0 * beta) / (s * s) + (beta * a - 0.5 * np.log1p(-2.0 * a * beta)) / (a - 1.0)
    return out


def smooth_sensitivity(*, local_sensitivity: Sequence[float] | np.ndarray, beta: float) -> float:
    """``max_d e^(-beta d) LS(d)``: the beta-smooth sensitivity from local sensitivities at distance d = 0, 1, ...

    Raises:
        ValueError: On a non-positive beta or negative or non-finite local sensitivities.
    """
    beta = _check_positive("beta", beta)
    ls = np.asarray(local_sensitivity, dtype=np.float64)
    if ls.ndim != 1 or ls.size == 0 or not np.all(np.isfinite(ls)) or np.any(ls < 0):
        raise ValueError("local_sensitivity must be a non-empty 1-D array of finite values >= 0")
    return float(np.max(ls * np.exp(-beta * np.arange(ls.size))))


def _beta_gnmax(logq: np.ndarray, sigma: float, order: float) -> np.ndarray:
    """GNMax's data-dependent RDP at one order as a function of ``log q`` (the function that is released)."""
    return _rdp_from_logq(np.atleast_1d(np.asarray(logq, dtype=np.float64)), sigma * sigma, np.array([order]))[:, 0]


def _log_bu(logq: np.ndarray, sigma: float, n_bins: int) -> np.ndarray:
    """log of the largest union-bound q after one teacher changes its vote, from q (Papernot et al., Prop. 12).

    ``BU(q) = min(1, (m-1)/2 erfc(erfcinv(2q/(m-1)) - 1/sigma))`` = ``(m-1) Phi(Phi^-1(q/(m-1)) + sqrt2/sigma)``.
    """
    lm = math.log(n_bins - 1)
    return np.minimum(lm + log_ndtr(ndtri_exp(np.minimum(logq - lm, 0.0)) + _SQRT2 / sigma), 0.0)


def _log_bl(logq: np.ndarray, sigma: float, n_bins: int) -> np.ndarray:
    """log of the smallest union-bound q after one teacher changes its vote.

    ``BL(q) = (m-1)/2 erfc(erfcinv(2q/(m-1)) + 1/sigma)`` = ``(m-1) Phi(Phi^-1(q/(m-1)) - sqrt2/sigma)``.
    """
    lm = math.log(n_bins - 1)
    return lm + log_ndtr(ndtri_exp(np.minimum(logq - lm, 0.0)) - _SQRT2 / sigma)


@functools.lru_cache(maxsize=256)
def _gnmax_q0_q1(sigma: float, order: float, n_bins: int) -> tuple[float, float]:
    """``(log q0, log q1)``: q0 = where the data-dependent bound stops beating ``lambda/sigma^2``, q1 = BL(q0).

    ``-inf`` for both when the data-dependent bound never helps at this order (then the RDP is constant).
    """
    independent = order / sigma**2
    cap = math.log1p(-1.0 / n_bins)

    def better(lq: float) -> bool:
        return bool(_beta_gnmax(np.array([lq]), sigma, order)[0] < independent)

    if better(cap):  # the data-dependent bound is below the data-independent one at the largest possible q
        return cap, float(_log_bl(np.array([cap]), sigma, n_bins)[0])
    lo = -1.0
    while not better(lo):
        lo *= 2.0
        if lo < -1e7:
            return -math.inf, -math.inf
    hi = cap
    for _ in range(200):  # bisection on log q: better(lo), not better(hi)
        mid = 0.5 * (lo + hi)
        if better(mid):
            lo = mid
        else:
            hi = mid
        if hi - lo <= 1e-12 * max(1.0, abs(lo)):
            break
    return lo, float(_log_bl(np.array([lo]), sigma, n_bins)[0])


def _ls_gnmax_of_logq(logq: np.ndarray, sigma: float, order: float, n_bins: int) -> np.ndarray:
    """Upper bound on the local sensitivity of the GNMax RDP at histograms with union bound ``q`` (Algorithm 3).

    ``max(beta(BU(q)) - beta(q), beta(q) - beta(BL(q)))``; on the plateau ``[q1, q0]`` the plateau value
    ``max(lambda/sigma^2 - beta(q1), beta(q1) - beta(BL(q1)))``, the global maximum (given conditions C5-C6).
    """
    lq = np.atleast_1d(np.asarray(logq, dtype=np.float64))
    lq0, lq1 = _gnmax_q0_q1(sigma, order, n_bins)
    if math.isinf(lq0):
        return np.zeros(lq.shape)
    b = _beta_gnmax(lq, sigma, order)
    ls = np.maximum(
        _beta_gnmax(_log_bu(lq, sigma, n_bins), sigma, order) - b,
        b - _beta_gnmax(_log_bl(lq, sigma, n_bins), sigma, order),
    )
    plateau = _gnmax_plateau(sigma, order, n_bins)
    on_plateau = (lq >= lq1) & (lq <= lq0)
    ls[on_plateau] = plateau
    return np.maximum(ls, 0.0)


@functools.lru_cache(maxsize=256)
def _gnmax_plateau(sigma: float, order: float, n_bins: int) -> float:
    lq0, lq1 = _gnmax_q0_q1(sigma, order, n_bins)
    if math.isinf(lq0):
        return 0.0
    b1 = _beta_gnmax(np.array([lq1]), sigma, order)[0]
    b2 = _beta_gnmax(_log_bl(np.array([lq1]), sigma, n_bins), sigma, order)[0]
    return float(max(order / sigma**2 - b1, b1 - b2, 0.0))


def check_smooth_sensitivity_conditions(*, sigma: float, order: float, num_bins: int) -> None:
    """Check numerically the conditions under which the GNMax local-sensitivity bounds hold (App. B.4, C5-C6).

    C5: the released RDP ``beta(q)`` is non-decreasing in ``q``. C6: ``beta(BU(q)) - beta(q)`` is non-decreasing for
    ``q <= q1``. Checked on a dense grid of ``log q`` (pate_2018 checks a symbolic derivative numerically; neither
    is a proof).

    Args:
        sigma: Std of the GNMax noise, > 0.
        order: The RDP order, > 1.
        num_bins: Number of bins (classes), >= 2.

    Raises:
        ValueError: If a condition fails at this sigma, order and number of bins (or on invalid arguments).
    """
    sigma = _check_positive("sigma", sigma)
    order = float(_check_orders([order])[0])
    if isinstance(num_bins, bool) or not isinstance(num_bins, int) or num_bins < 2:
        raise ValueError(f"num_bins must be an integer >= 2, got {num_bins!r}")
    _check_conditions(sigma, order, num_bins)


@functools.lru_cache(maxsize=256)
def _check_conditions(sigma: float, order: float, n_bins: int) -> None:
    lq0, lq1 = _gnmax_q0_q1(sigma, order, n_bins)
    if math.isinf(lq0):
        return
    cap = math.log1p(-1.0 / n_bins)
    lo = min(50.0 * lq0, -50.0)
    grid = -np.geomspace(-lo, max(-cap, 1e-12), 4000)  # increasing log q from lo to cap
    b = _beta_gnmax(grid, sigma, order)
    tol = 1e-12 * max(1.0, order / sigma**2)
    if np.any(np.diff(b) < -tol):
        raise ValueError(
            f"smooth-sensitivity condition C5 fails for sigma={sigma:g}, order={order:g}, bins={n_bins} "
            "(the data-dependent RDP is not monotone in q): use another order or the raw/data-independent release"
        )
    g1 = grid[grid <= lq1]
    if g1.size > 1:
        delta_b = _beta_gnmax(_log_bu(g1, sigma, n_bins), sigma, order) - _beta_gnmax(g1, sigma, order)
        if np.any(np.diff(delta_b) < -tol):
            raise ValueError(
                f"smooth-sensitivity condition C6 fails for sigma={sigma:g}, order={order:g}, bins={n_bins}: "
                "use another order or the raw/data-independent release"
            )


def gnmax_local_sensitivity(*, votes: Any, sigma: float, order: float, num_teachers: int) -> np.ndarray:
    """Upper bounds on the local sensitivity of one query's GNMax RDP at distance ``d = 0 .. num_teachers``.

    ``LS(d)`` bounds ``|beta(q(n')) - beta(q(n''))|`` over histograms ``n'`` at most ``d`` teacher changes from
    ``votes`` and their neighbours ``n''``. The local sensitivity as a function of ``q`` rises to a plateau on
    ``[q1, q0]`` and falls after it (given C5-C6), so ``LS(d)`` is its value at the histogram ``d`` moves nearer the
    plateau: moving votes from the top bin to the runner-up when ``q < q1`` (Papernot et al., Alg. 4-5), and from the
    largest other bin to the top when ``q > q0``; the plateau once reached (or when votes run out).

    This holds only where conditions C5-C6 hold for ``(sigma, order, bins)``
    (:func:`check_smooth_sensitivity_conditions`); elsewhere the function refuses rather than return a bound that
    may be too small.

    Args:
        votes: One query's vote counts, shape (bins,).
        sigma: Std of the GNMax noise, > 0.
        order: The RDP order, > 1.
        num_teachers: Number of teachers (the largest distance), >= the number of votes.

    Returns:
        Array of shape (num_teachers + 1,), each >= 0.

    Raises:
        ValueError: On invalid arguments, or, naming the condition, when C5 or C6 fails for ``sigma``, ``order``
            and the number of bins.
    """
    arr = _as_numpy(votes)
    if arr.ndim != 1:
        raise ValueError(f"gnmax_local_sensitivity takes one query's votes, shape (bins,), got {arr.shape}")
    v = _check_votes(arr[None, :])
    sigma = _check_positive("sigma", sigma)
    order = float(_check_orders([order])[0])
    n_teachers = _check_num_teachers(num_teachers, v)
    check_smooth_sensitivity_conditions(sigma=sigma, order=order, num_bins=int(v.shape[1]))
    return _ls_gnmax_path(np.sort(v[0])[::-1].copy(), sigma, order, n_teachers)


def _check_num_teachers(num_teachers: int, v: np.ndarray) -> int:
    if isinstance(num_teachers, bool) or not isinstance(num_teachers, int) or num_teachers < 1:
        raise ValueError(f"num_teachers must be an integer >= 1, got {num_teachers!r}")
    if v.size and v.sum(axis=1).max() > num_teachers:
        raise ValueError(f"a query has more votes ({int(v.sum(axis=1).max())}) than num_teachers={num_teachers}")
    return num_teachers


def _ls_gnmax_path(sv: np.ndarray, sigma: float, order: float, n_teachers: int) -> np.ndarray:
    """:func:`gnmax_local_sensitivity` on votes ``sv`` sorted in decreasing order."""
    n_bins = sv.size
    lq0, lq1 = _gnmax_q0_q1(sigma, order, n_bins)
    plateau = _gnmax_plateau(sigma, order, n_bins)
    res = np.full(n_teachers + 1, plateau)
    if math.isinf(lq0):
        return res  # zeros: the RDP does not depend on the votes at this order
    lq = _gnmax_logq(sv[None, :], sigma)[0]
    if lq1 <= lq <= lq0:
        return res
    if lq < lq1:
        # Towards larger q: move d votes from the top bin to the runner-up (all d at once, while top >= runner-up).
        d_max = min(int((sv[0] - sv[1]) // 2), n_teachers)
        d = np.arange(d_max + 1, dtype=np.float64)
        path = np.broadcast_to(sv, (d.size, n_bins)).copy()
        path[:, 0] -= d
        path[:, 1] += d
        lqs = _gnmax_logq(path, sigma)
        reached = np.nonzero(lqs >= lq1)[0]
        stop = reached[0] if reached.size else d.size
        res[:stop] = _ls_gnmax_of_logq(lqs[:stop], sigma, order, n_bins)
        return res  # from `stop` on: the plateau (reached, or the path ran out; conservative either way)
    # lq > lq0: towards smaller q, one vote at a time from the largest other bin to the top.
    cur = sv.copy()
    for d in range(n_teachers + 1):
        if d > 0:
            j = 1 + int(np.argmax(cur[1:]))
            if cur[j] <= 0:
                break  # unanimous: nothing left to move; the rest stays at the plateau (conservative)
            cur[0] += 1
            cur[j] -= 1
            lq = _gnmax_logq(cur[None, :], sigma)[0]
        if lq <= lq0:
            break  # the plateau is reached
        res[d] = _ls_gnmax_of_logq(np.array([lq]), sigma, order, n_bins)[0]
    return res


@functools.lru_cache(maxsize=64)
def _threshold_ls_table(n_teachers: int, threshold: float, s1: float, order: float) -> np.ndarray:
    """Local sensitivity of the threshold RDP at each maximum count ``v = 0..N`` (exact: v moves by 1 per teacher)."""
    v = np.arange(n_teachers + 1, dtype=np.float64)
    r = _rdp_from_logq(_threshold_logq(v, s1, threshold), 2.0 * s1 * s1, np.array([order]))[:, 0]
    step = np.abs(np.diff(r))  # |r(v+1) - r(v)|, length N
    ls = np.zeros(n_teachers + 1)
    ls[:-1] = step
    ls[1:] = np.maximum(ls[1:], step)
    return ls


def threshold_local_sensitivity(
    *, max_votes: int, sigma_threshold: float, threshold: float, order: float, num_teachers: int
) -> np.ndarray:
    """Local sensitivity of one query's threshold RDP at distance ``d = 0 .. num_teachers`` (shape (num_teachers + 1,)).

    The threshold RDP depends on the maximum count ``v`` only, and one teacher moves ``v`` by at most 1, so
    ``LS(d) = max over |v' - v| <= d of max(|r(v'+1) - r(v')|, |r(v'-1) - r(v')|)`` (exact, up to the maximum counts
    in the window that no histogram has, such as ``v' < num_teachers / bins``, counted conservatively).

    ``LS(d)`` covers every histogram within distance ``d``, not only those at ``v +- d``, like the GNMax bounds: the
    per-query bounds are summed over queries (:func:`pate_local_sensitivity`), and there one query may sit at a
    nearer histogram where its own local sensitivity is larger. (Taking only ``v' = v +- d``, as pate_2018 does,
    gives the same smooth sensitivity for one query alone, but a sum over queries can then fall below the true
    local sensitivity: e.g. two unanswered queries of 20 teachers, 2 bins, maximum counts 16 and 10, threshold 10,
    ``sigma_threshold`` 1, order 5, beta 0.02: smooth sensitivity 0.80 against an exact 1.43.)

    Args:
        max_votes: The query's maximum vote count, in ``[0, num_teachers]``.
        sigma_threshold: Std of the threshold noise, > 0.
        threshold: The threshold ``T``.
        order: The RDP order, > 1.
        num_teachers: Number of teachers (the largest distance), >= 1.

    Returns:
        Array of shape (num_teachers + 1,), non-decreasing, each >= 0.

    Raises:
        ValueError: On invalid arguments.
    """
    s1 = _check_positive("sigma_threshold", sigma_threshold)
    t = _check_real("threshold", threshold)
    order = float(_check_orders([order])[0])
    if isinstance(num_teachers, bool) or not isinstance(num_teachers, int) or num_teachers < 1:
        raise ValueError(f"num_teachers must be an integer >= 1, got {num_teachers!r}")
    bad = isinstance(max_votes, bool) or not isinstance(max_votes, (int, np.integer))
    if bad or not 0 <= max_votes <= num_teachers:
        raise ValueError(f"max_votes must be an integer in [0, num_teachers={num_teachers}], got {max_votes!r}")
    return _threshold_ls_rows(np.array([int(max_votes)]), np.array([1.0]), num_teachers, t, s1, order)


def _threshold_ls_rows(
    max_votes: np.ndarray, weights: np.ndarray, n_teachers: int, t: float, s1: float, order: float
) -> np.ndarray:
    """``sum_i weights[i] LS_i(d)`` for the threshold step over queries with maximum counts ``max_votes``."""
    table = _threshold_ls_table(n_teachers, t, s1, order)
    d = np.arange(n_teachers + 1)
    total = np.zeros(n_teachers + 1)
    for v, w in zip(max_votes.tolist(), weights.tolist()):
        up = np.where(v + d <= n_teachers, table[np.minimum(v + d, n_teachers)], 0.0)
        down = np.where(v - d >= 0, table[np.maximum(v - d, 0)], 0.0)
        total += w * np.maximum.accumulate(np.maximum(up, down))  # within distance d, not only at v +- d
    return total


def pate_local_sensitivity(
    *,
    votes: Any,
    answered: Any,
    sigma_threshold: float,
    sigma: float,
    threshold: float,
    order: float,
    num_teachers: int,
) -> np.ndarray:
    """Local sensitivity within distance ``d`` of the accumulated data-dependent RDP (threshold: every query; GNMax:
    the answered ones), the sum of the per-query bounds (the max of a sum is at most the sum of the maxima). Each
    per-query bound covers every histogram within distance ``d`` (changing ``d`` teachers moves every query's
    histogram by at most ``d``), so the sum covers every set of histograms within distance ``d``.

    The GNMax part uses :func:`gnmax_local_sensitivity`'s bounds, valid only where conditions C5-C6 hold; they are
    checked (:func:`check_smooth_sensitivity_conditions`) whenever a query was answered. With no answered query the
    result is the threshold step's exact local sensitivity alone, and no condition applies.

    Args:
        votes: Every query's vote counts, shape (queries, bins).
        answered: Which queries were answered, shape (queries,); only these pay GNMax.
        sigma_threshold: Std of the threshold noise, > 0.
        sigma: Std of the GNMax noise, > 0.
        threshold: The threshold ``T``.
        order: The RDP order, > 1.
        num_teachers: Number of teachers (the largest distance), >= the votes of every query.

    Returns:
        Array of shape (num_teachers + 1,): distances ``0 .. num_teachers``.

    Raises:
        ValueError: On invalid arguments, or, naming the condition, when a query was answered and C5 or C6 fails for
            ``sigma``, ``order`` and the number of bins.
    """
    v = _check_votes(votes)
    mask = _check_answered(answered, v.shape[0])
    s1 = _check_positive("sigma_threshold", sigma_threshold)
    s2 = _check_positive("sigma", sigma)
    t = _check_real("threshold", threshold)
    order = float(_check_orders([order])[0])
    n_teachers = _check_num_teachers(num_teachers, v)
    maxes, counts = np.unique(v.max(axis=1, initial=0.0).astype(np.int64), return_counts=True)
    total = _threshold_ls_rows(maxes, counts.astype(np.float64), n_teachers, t, s1, order)
    if mask.any():
        check_smooth_sensitivity_conditions(sigma=s2, order=order, num_bins=int(v.shape[1]))
        sorted_rows = -np.sort(-v[mask], axis=1)
        rows, counts = np.unique(sorted_rows, axis=0, return_counts=True)  # identical histograms: computed once
        for row, c in zip(rows, counts.tolist()):
            total += c * _ls_gnmax_path(row.copy(), s2, order, n_teachers)
    return total


@dataclass(frozen=True)
class PATESmoothRelease:
    """A smooth-sensitivity release of Confident-GNMax's data-dependent RDP (:func:`pate_smooth_release`).

    Attributes:
        epsilon: The published epsilon at ``delta``: the noisy RDP plus the release's own cost, converted at
            ``order`` (a noisy estimate, not an upper bound; ``noise_std`` says how noisy).
        delta: The delta.
        order: The single RDP order of the release.
        beta: The smoothness parameter.
        sigma_ss: The noise multiplier of the release.
        smooth_sensitivity: ``SS_beta`` of the accumulated RDP (data-dependent; not published by itself).
        rdp_noisy: ``RDP(order) + SS_beta * N(0, sigma_ss^2)`` (the published value).
        rdp_release: RDP cost of the release itself at ``order`` (Thm 23).
        noise_std: ``SS_beta * sigma_ss``.
        queries: Number of queries covered.
        answered: Number of answered queries covered.
    """

    epsilon: float
    delta: float
    order: float
    beta: float
    sigma_ss: float
    smooth_sensitivity: float
    rdp_noisy: float
    rdp_release: float
    noise_std: float
    queries: int
    answered: int

    def to_dict(self) -> dict[str, float | int]:
        """The release as a JSON-serialisable dict (stored in the ledger's PATE event)."""
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


def pate_smooth_release(
    *,
    votes: Any,
    answered: Any,
    sigma_threshold: float,
    sigma: float,
    threshold: float,
    delta: float,
    order: float,
    beta: float,
    sigma_ss: float,
    generator: np.random.Generator,
    num_teachers: int | None = None,
) -> PATESmoothRelease:
    """Publish the data-dependent RDP of a run's Confident-GNMax queries with smooth sensitivity (GNSS).

    The raw data-dependent RDP at ``order`` (threshold for every query, GNMax for the answered ones) plus
    ``SS_beta * N(0, sigma_ss^2)``; the release costs :func:`gnss_rdp` more, which the ledger must record
    (:meth:`dpsyn.privacy.PrivacyLedger.record_pate_smooth_release`). ``order``, ``beta`` and ``sigma_ss`` must be
    chosen without the votes (from the config); the paper's ranges are ``beta`` in ``[0.3, 0.5)/order``.

    Args:
        votes: Every query's vote counts, shape (queries, bins).
        answered: Which queries were answered, shape (queries,).
        sigma_threshold: Std of the threshold noise, > 0.
        sigma: Std of the GNMax noise, > 0.
        threshold: The threshold ``T``.
        delta: Target delta in (0, 1).
        order: The RDP order of the release, in ``(1, 1/(2 beta))``.
        beta: Smoothness, > 0.
        sigma_ss: Noise multiplier of the release, > 0.
        generator: numpy generator for the release's noise (:func:`dpsyn.privacy.dp_numpy_generator`).
        num_teachers: Number of teachers; by default the votes per query (then every row must have the same sum).

    Returns:
        The release.

    Raises:
        ValueError: On invalid arguments, an order outside ``(1, 1/(2 beta))``, or conditions C5-C6 failing.
    """
    v = _check_votes(votes)
    mask = _check_answered(answered, v.shape[0])
    delta = _check_delta("delta", delta)
    beta = _check_positive("beta", beta)
    sigma_ss = _check_positive("sigma_ss", sigma_ss)
    order = float(_check_orders([order])[0])
    if not order < 1.0 / (2.0 * beta):
        raise ValueError(f"order must lie in (1, 1/(2 beta)) = (1, {1.0 / (2.0 * beta):g}), got {order:g}")
    if not isinstance(generator, np.random.Generator):
        raise ValueError(f"generator must be a numpy Generator (dpsyn.privacy.dp_numpy_generator), got {generator!r}")
    if v.shape[0] == 0:
        raise ValueError("no queries to release")
    s2 = _check_positive("sigma", sigma)
    if num_teachers is None:
        sums = v.sum(axis=1)
        if np.any(sums != sums[0]):
            raise ValueError("rows of votes have different sums: pass num_teachers")
        num_teachers = int(sums[0])
    check_smooth_sensitivity_conditions(sigma=s2, order=order, num_bins=int(v.shape[1]))
    kw = dict(sigma_threshold=sigma_threshold, sigma=sigma, threshold=threshold)
    rdp_raw = float(confident_gnmax_rdp(votes=v, answered=mask, orders=[order], **kw)[0])
    ls = pate_local_sensitivity(votes=v, answered=mask, order=order, num_teachers=num_teachers, **kw)
    ss = smooth_sensitivity(local_sensitivity=ls, beta=beta)
    rdp_noisy = rdp_raw + ss * sigma_ss * float(generator.standard_normal())
    rdp_release = float(gnss_rdp(beta=beta, sigma_ss=sigma_ss, orders=[order])[0])
    # Balle et al. 2020's conversion at the single order (as rdp_to_epsilon), on the published value.
    eps = rdp_noisy + rdp_release - (math.log(delta) + math.log(order)) / (order - 1.0) + math.log1p(-1.0 / order)
    logger.info(
        "PATE smooth-sensitivity release at order %g: RDP %.6g + noise (std %.3g) -> eps %.6g (release cost %.3g)",
        order, rdp_raw, ss * sigma_ss, eps, rdp_release,
    )
    return PATESmoothRelease(
        epsilon=max(0.0, eps),
        delta=delta,
        order=order,
        beta=beta,
        sigma_ss=sigma_ss,
        smooth_sensitivity=ss,
        rdp_noisy=rdp_noisy,
        rdp_release=rdp_release,
        noise_std=ss * sigma_ss,
        queries=int(v.shape[0]),
        answered=int(mask.sum()),
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
