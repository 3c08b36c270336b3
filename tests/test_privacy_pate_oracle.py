"""Brute-force oracle for PATE's GNMax local sensitivities (dpsyn.privacy.pate, Papernot et al. 2018, App. B-C).

The smooth-sensitivity release bounds ``LS(d)``: the largest change of the released data-dependent RDP
``beta(n) = gnmax_rdp(n)`` at one order, over every vote histogram ``n'`` at most ``d`` teacher changes from the
base histogram and every neighbour ``n''`` of ``n'`` (one teacher changes its vote: one vote moves between two bins,
the total stays the number of teachers). On small cases (8-50 teachers, 2-3 bins) this is computed exactly here by
enumerating every histogram with that many votes, every neighbour of each, and every base histogram (sorted: the
RDP is symmetric in the bins), at every distance ``d = 0 .. teachers``.

* Inside conditions C5-C6 (:func:`check_smooth_sensitivity_conditions` passes) dpsyn's bounds must never be below
  the exact maximum (to 1e-9), and the oracle must be able to catch a bound half as large.
* The same for :func:`pate_local_sensitivity` (threshold + GNMax) on one query, and on two queries of 2 bins,
  brute-forced jointly (a changed teacher moves one vote in each query). The two-query case catches per-query
  bounds that hold only at distance exactly ``d``: their sum can fall below the joint local sensitivity.
* Outside them, :func:`gnmax_local_sensitivity` and :func:`pate_local_sensitivity` (when a query was answered) must
  raise a ValueError naming the failing condition, as :func:`pate_smooth_release` does. The known counterexample
  (votes (33, 11, 6), sigma 0.792, order 10: exact 1.268 at distance 1, the unguarded bound 0.569) is pinned.

The function whose changes are measured is dpsyn's own ``gnmax_rdp`` (checked against an independent mpmath
implementation in test_privacy_pate.py): the local sensitivity bounds the change of what is released.
"""

from __future__ import annotations

import functools
import itertools
import re

import numpy as np
import pytest

from dpsyn.privacy import (
    check_smooth_sensitivity_conditions,
    gnmax_local_sensitivity,
    gnmax_rdp,
    pate_local_sensitivity,
    pate_smooth_release,
    threshold_local_sensitivity,
    threshold_rdp,
)

TOL = 1e-9

# (sigma, order) pairs inside C5-C6 for 2 and 3 bins, from small noise at a low order to larger noise and orders.
INSIDE = [(0.792, 1.5), (1.5, 1.5), (1.0, 2.0), (2.0, 2.0), (3.0, 3.0), (5.0, 3.0), (5.0, 5.0), (8.0, 5.0)]
SIZES = [(8, 2), (20, 2), (50, 2), (8, 3), (20, 3), (50, 3)]  # (teachers, bins)
# (sigma, order, bins) where C6 fails.
OUTSIDE = [(0.792, 10.0, 3), (0.5, 2.0, 2), (1.0, 3.0, 2), (2.0, 5.0, 3), (3.0, 5.0, 2), (5.0, 10.0, 3), (8.0, 20.0, 2)]


def histograms(n: int, m: int) -> np.ndarray:
    """Every vote histogram of ``n`` teachers over ``m`` bins (2 or 3), shape (count, m)."""
    if m == 2:
        a = np.arange(n + 1)
        return np.stack([a, n - a], axis=1)
    if m != 3:
        raise ValueError("the oracle enumerates 2 or 3 bins")
    a, b = np.meshgrid(np.arange(n + 1), np.arange(n + 1), indexing="ij")
    keep = a + b <= n
    return np.stack([a[keep], b[keep], n - a[keep] - b[keep]], axis=1)


def neighbour_changes(hists: np.ndarray, values: np.ndarray) -> np.ndarray:
    """``max |values[n''] - values[n]|`` over the neighbours ``n''`` of each histogram (one vote moves bins)."""
    n, m = int(hists[0].sum()), hists.shape[1]
    index = np.full((n + 1,) * (m - 1), -1)
    index[tuple(hists[:, :-1].T)] = np.arange(len(hists))  # the last bin is fixed by the others
    worst = np.zeros(len(hists))
    for src, dst in itertools.permutations(range(m), 2):
        has = hists[:, src] > 0
        moved = hists[has].copy()
        moved[:, src] -= 1
        moved[:, dst] += 1
        j = index[tuple(moved[:, :-1].T)]
        assert np.all(j >= 0)
        worst[has] = np.maximum(worst[has], np.abs(values[j] - values[has]))
    return worst


def exact_by_distance(hists: np.ndarray, per_hist: np.ndarray, bases: np.ndarray) -> np.ndarray:
    """``max`` of ``per_hist`` over the histograms within distance ``d`` of each base, shape (bases, n + 1).

    The distance is the number of teachers that must change their vote: ``sum_j max(n'_j - base_j, 0)``.
    """
    n = int(hists[0].sum())
    dist = np.maximum(hists[None, :, :] - bases[:, None, :], 0).sum(axis=2)  # (bases, hists)
    out = np.zeros((len(bases), n + 1))
    rows = np.repeat(np.arange(len(bases)), len(hists))
    np.maximum.at(out, (rows, dist.ravel()), np.tile(per_hist, len(bases)))
    return np.maximum.accumulate(out, axis=1)  # within d, not exactly at d


def sorted_bases(hists: np.ndarray) -> np.ndarray:
    """The histograms with counts in decreasing order (one per multiset of counts)."""
    return hists[np.all(np.diff(hists, axis=1) <= 0, axis=1)]


@functools.lru_cache(maxsize=None)
def exact_gnmax_ls(n: int, m: int, sigma: float, order: float) -> tuple[np.ndarray, np.ndarray]:
    """``(bases, exact)``: every sorted base histogram and the exact GNMax local sensitivity at each distance."""
    hists = histograms(n, m)
    beta = gnmax_rdp(votes=hists, sigma=sigma, orders=[order])[:, 0]
    bases = sorted_bases(hists)
    return bases, exact_by_distance(hists, neighbour_changes(hists, beta), bases)


def condition_error(sigma: float, order: float, m: int) -> str | None:
    """The message of :func:`check_smooth_sensitivity_conditions`, None when C5-C6 hold."""
    try:
        check_smooth_sensitivity_conditions(sigma=sigma, order=order, num_bins=m)
    except ValueError as err:
        return str(err)
    return None


@pytest.mark.parametrize("n,m", SIZES)
@pytest.mark.parametrize("sigma,order", INSIDE)
def test_gnmax_local_sensitivity_is_never_below_the_exact_maximum_inside_the_conditions(sigma, order, n, m):
    assert condition_error(sigma, order, m) is None  # the grid is inside C5-C6
    bases, exact = exact_gnmax_ls(n, m, sigma, order)
    ours = np.array([gnmax_local_sensitivity(votes=b, sigma=sigma, order=order, num_teachers=n) for b in bases])
    assert ours.shape == exact.shape == (len(bases), n + 1)
    short = ours < exact - TOL
    assert not short.any(), (
        f"bound below the exact maximum for votes {bases[np.nonzero(short)[0][0]].tolist()} at distances "
        f"{np.nonzero(short[np.nonzero(short)[0][0]])[0].tolist()}"
    )
    # Power: where the RDP depends on the votes at all, half of dpsyn's bound would be caught by the oracle.
    if exact.max() > 0 and n >= 20:
        assert np.any(0.5 * ours < exact - TOL)
    # The bins' order does not matter (the function sorts the votes).
    b = bases[len(bases) // 2]
    np.testing.assert_array_equal(
        gnmax_local_sensitivity(votes=b[::-1].copy(), sigma=sigma, order=order, num_teachers=n), ours[len(bases) // 2]
    )


@pytest.mark.parametrize("n,m", [(20, 2), (20, 3), (50, 3)])
@pytest.mark.parametrize("sigma,order", INSIDE[::2])
def test_pate_local_sensitivity_of_one_answered_query_is_never_below_the_exact_maximum(sigma, order, n, m):
    """One answered query: threshold RDP + GNMax RDP, brute-forced as one function of the histogram."""
    sigma_threshold, threshold = 2.0, 0.6 * n
    hists = histograms(n, m)
    total = threshold_rdp(votes=hists, sigma_threshold=sigma_threshold, threshold=threshold, orders=[order])[:, 0]
    total = total + gnmax_rdp(votes=hists, sigma=sigma, orders=[order])[:, 0]
    bases = sorted_bases(hists)
    exact = exact_by_distance(hists, neighbour_changes(hists, total), bases)
    kw = dict(sigma_threshold=sigma_threshold, sigma=sigma, threshold=threshold, order=order, num_teachers=n)
    ours = np.array([pate_local_sensitivity(votes=b[None, :], answered=[True], **kw) for b in bases])
    assert np.all(ours >= exact - TOL)
    assert np.any(0.5 * ours < exact - TOL)


def joint_local_sensitivity(per_query: list[np.ndarray]) -> np.ndarray:
    """Exact local sensitivity of ``sum_i f_i(n_i)`` over two queries with 2 bins, at every pair of histograms.

    ``per_query[i][k]`` is query ``i``'s RDP at the histogram ``(k, n - k)``. One teacher changing its vote moves
    at most one vote in each query (it votes on every query), so a neighbour shifts each ``k`` by -1, 0 or +1.
    """
    f = per_query[0][:, None] + per_query[1][None, :]
    size = f.shape[0]
    worst = np.zeros_like(f)
    for a, b in itertools.product((-1, 0, 1), repeat=2):
        src = (slice(max(0, -a), size - max(0, a)), slice(max(0, -b), size - max(0, b)))
        dst = (slice(max(0, a), size - max(0, -a)), slice(max(0, b), size - max(0, -b)))
        moved = np.zeros_like(f)
        moved[src] = np.abs(f[dst] - f[src])
        worst = np.maximum(worst, moved)
    return worst


@pytest.mark.parametrize("answered", [(False, False), (False, True), (True, True)])
@pytest.mark.parametrize("sigma,order,sigma_threshold,threshold", [
    (5.0, 5.0, 1.0, 10.0), (3.0, 3.0, 2.0, 14.0), (2.0, 2.0, 1.0, 17.0), (1.0, 2.0, 3.0, 12.0),
])
def test_pate_local_sensitivity_of_two_queries_is_never_below_the_exact_maximum(
    sigma, order, sigma_threshold, threshold, answered
):
    """Two queries of 20 teachers, 2 bins: the per-query bounds summed must cover every pair of histograms.

    A teacher is at distance ``max(d_1, d_2)``: changing ``d`` teachers moves each query's histogram by <= d.
    """
    n = 20
    hists = histograms(n, 2)
    thr = threshold_rdp(votes=hists, sigma_threshold=sigma_threshold, threshold=threshold, orders=[order])[:, 0]
    gn = gnmax_rdp(votes=hists, sigma=sigma, orders=[order])[:, 0]
    ls = joint_local_sensitivity([thr + gn if a else thr for a in answered])
    k = np.arange(n + 1)
    kw = dict(sigma_threshold=sigma_threshold, sigma=sigma, threshold=threshold, order=order, num_teachers=n)
    caught = False
    for b1, b2 in itertools.product(range(n // 2, n + 1), repeat=2):  # the larger count first (symmetric)
        dist = np.maximum(np.abs(k - b1)[:, None], np.abs(k - b2)[None, :])
        exact = np.zeros(n + 1)
        np.maximum.at(exact, dist.ravel(), ls.ravel())
        exact = np.maximum.accumulate(exact)
        votes = np.array([[b1, n - b1], [b2, n - b2]])
        ours = pate_local_sensitivity(votes=votes, answered=list(answered), **kw)
        short = np.nonzero(ours < exact - TOL)[0]
        assert short.size == 0, f"votes {votes.tolist()}: bound below the exact maximum at distances {short.tolist()}"
        caught |= bool(np.any(0.5 * ours < exact - TOL))
    assert caught  # half the bound would be caught


@pytest.mark.parametrize("sigma,order,m", OUTSIDE)
def test_local_sensitivities_refuse_outside_the_conditions(sigma, order, m):
    message = condition_error(sigma, order, m)
    assert message is not None and re.search(r"condition C[56] fails", message)
    condition = re.search(r"C[56]", message).group()
    n = 20
    votes = np.array([14, 6] if m == 2 else [12, 5, 3])
    with pytest.raises(ValueError, match=rf"condition {condition} fails for sigma={sigma:g}, order={order:g}"):
        gnmax_local_sensitivity(votes=votes, sigma=sigma, order=order, num_teachers=n)
    kw = dict(sigma_threshold=2.0, sigma=sigma, threshold=12.0, order=order, num_teachers=n)
    queries = np.stack([votes, np.sort(votes)])
    with pytest.raises(ValueError, match=rf"condition {condition} fails"):
        pate_local_sensitivity(votes=queries, answered=[False, True], **kw)
    # No answered query: no GNMax bound is used, only the threshold step's exact one, which needs no condition.
    ls = pate_local_sensitivity(votes=queries, answered=[False, False], **kw)
    single = threshold_local_sensitivity(
        max_votes=int(votes.max()), sigma_threshold=2.0, threshold=12.0, order=order, num_teachers=n
    )
    np.testing.assert_allclose(ls, 2 * single, rtol=1e-12)
    # And the release refuses with the same message (it checks the same conditions).
    with pytest.raises(ValueError, match=rf"condition {condition} fails"):
        pate_smooth_release(
            votes=queries, answered=[False, True], sigma_threshold=2.0, sigma=sigma, threshold=12.0, delta=1e-5,
            order=order, beta=0.4 / order, sigma_ss=1.0, generator=np.random.default_rng(0),
        )


def test_the_known_counterexample_is_refused():
    """Votes (33, 11, 6), sigma 0.792, order 10 (outside C6): the exact maximum change at distance 1 is 1.268."""
    sigma, order, votes = 0.792, 10.0, (33, 11, 6)
    bases, exact = exact_gnmax_ls(50, 3, sigma, order)
    row = exact[np.nonzero(np.all(bases == votes, axis=1))[0][0]]
    assert row[0] == pytest.approx(0.9173, abs=1e-4)
    assert row[1] == pytest.approx(1.2680, abs=1e-4)  # dpsyn returned 0.569 here before the guard
    with pytest.raises(ValueError, match="condition C6 fails"):
        gnmax_local_sensitivity(votes=np.array(votes), sigma=sigma, order=order, num_teachers=50)
    with pytest.raises(ValueError, match="condition C6 fails"):
        pate_local_sensitivity(votes=[votes], answered=[True], sigma_threshold=4.0, sigma=sigma, threshold=30.0,
                               order=order, num_teachers=50)
