"""Smooth-sensitivity release of PATE's data-dependent RDP (Papernot et al. 2018, Sec. 4 and App. B-C).

The local-sensitivity bounds of the accumulated RDP (GNMax: Alg. 3-5, valid under conditions C5-C6 only, checked
by :func:`check_smooth_sensitivity_conditions`; the threshold step: exact), their smooth bound, and the GNSS release
with its own RDP cost (Thm 23). See :mod:`dpsyn.privacy.pate.analysis` for the bounds they start from.
"""

from __future__ import annotations

import functools
import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy.special import log_ndtr, ndtri_exp

from dpsyn.privacy.dpsgd import _check_orders
from dpsyn.privacy.gaussian import _check_delta, _check_positive
from dpsyn.privacy.pate.analysis import (
    _SQRT2,
    _as_numpy,
    _check_answered,
    _check_real,
    _check_votes,
    _gnmax_logq,
    _rdp_from_logq,
    _threshold_logq,
    confident_gnmax_rdp,
)

logger = logging.getLogger(__name__)


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
