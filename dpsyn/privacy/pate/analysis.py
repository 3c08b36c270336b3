"""PATE's Confident-GNMax aggregator: its Renyi-DP accounting (Papernot et al. 2018, "Scalable Private Learning
with PATE"), used by G-PATE (paper 002) and PATE-GAN.

This module is the analysis (data-independent and data-dependent RDP bounds, RDP -> epsilon, the epsilon of a run).
The mechanism itself is :mod:`dpsyn.privacy.pate.mechanism`, the smooth-sensitivity release
:mod:`dpsyn.privacy.pate.smooth`; :mod:`dpsyn.privacy.pate` re-exports all three.

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

numpy/scipy only, except the RDP -> epsilon conversion (Opacus, imported where needed).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass
from numbers import Real
from typing import Any

import numpy as np
from scipy.special import log_ndtr, logsumexp

from dpsyn.privacy.dpsgd import _check_orders, rdp_to_epsilon
from dpsyn.privacy.gaussian import _check_count, _check_delta, _check_positive
from dpsyn.config.schema import PATE_BOUNDS

logger = logging.getLogger(__name__)

"""Which RDP bound an epsilon (or a ledger's :class:`~dpsyn.privacy.ledger.PATEEvent`) uses. ``renyi_filter`` is a
ledger bound only (:class:`~dpsyn.privacy.ledger.PATEEvent`): a Renyi filter at one order fixed before the run
(Feldman & Zrnic 2021), where a query pays GNMax only if its threshold check answered it."""

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
# epsilon of a run (RDP -> (eps, delta): dpsyn.privacy.dpsgd.rdp_to_epsilon, the ledger's conversion)
# --------------------------------------------------------------------------------------------------------------------


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
