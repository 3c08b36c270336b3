"""PATE (Confident-GNMax) accounting and mechanism: dpsyn.privacy.pate and the ledger's PATEEvent.

The RDP numbers are checked against an INDEPENDENT implementation written here from the formulas of Papernot et
al. 2018, "Scalable Private Learning with PATE" (Prop. 7 union bound, Prop. 8 data-independent bound, Thm 6 with
Prop. 10's orders, the threshold step as a sensitivity-1 Gaussian, App. B-C smooth sensitivity): scalar loops in
mpmath at 50 digits, the probabilities and bounds evaluated directly (erfc, A and B as numbers, no log-space
rewriting), where dpsyn is vectorised numpy in log space. The RDP -> (eps, delta) conversion is checked against
dp_accounting's ``compute_epsilon`` as well. Numbers pinned below were computed both ways.
"""

from __future__ import annotations

import itertools
import json
import math

import mpmath as mp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dpsyn.privacy import (
    PATE_RELEASES,
    ApproxDPEvent,
    BudgetExceededError,
    GaussianEvent,
    PATEEvent,
    PATESmoothRelease,
    PrivacyLedger,
    check_smooth_sensitivity_conditions,
    confident_gnmax,
    confident_gnmax_rdp,
    dp_generator,
    dp_numpy_generator,
    gaussian_rdp,
    gnmax_local_sensitivity,
    gnmax_logq,
    gnmax_rdp,
    gnmax_rdp_data_independent,
    gnmax_rdp_from_logq,
    gnss_rdp,
    pate_bound_for_release,
    pate_data_independent_epsilon,
    pate_epsilon,
    pate_local_sensitivity,
    pate_max_queries,
    pate_privacy,
    pate_smooth_release,
    rdp_to_epsilon,
    smooth_sensitivity,
    threshold_local_sensitivity,
    threshold_logpr_answered,
    threshold_rdp,
    threshold_rdp_data_independent,
)
from dpsyn.privacy.dpsgd import rdp_orders

mp.mp.dps = 50
DELTA = 1e-5
ORDERS = [1.1, 1.5, 2.0, 3.5, 8.0, 20.0, 64.0, 256.0, 1024.0]
SIGMAS = [1.0, 5.0, 40.0, 1000.0]

# Vote histograms (one row per query): unanimous, strong consensus, split, tied; 2 bins and 10 bins.
VOTES_2 = np.array([[100, 0], [97, 3], [90, 10], [70, 30], [55, 45], [50, 50]])
VOTES_10 = np.array(
    [
        [250, 0, 0, 0, 0, 0, 0, 0, 0, 0],
        [240, 10, 0, 0, 0, 0, 0, 0, 0, 0],
        [200, 50, 0, 0, 0, 0, 0, 0, 0, 0],
        [130, 60, 30, 20, 10, 0, 0, 0, 0, 0],
        [25, 25, 25, 25, 25, 25, 25, 25, 25, 25],
    ]
)
VOTES_GPATE = np.array(  # 4000 teachers, 10 bins (G-PATE's MNIST setting)
    [
        [4000, 0, 0, 0, 0, 0, 0, 0, 0, 0],
        [2414, 1564, 22, 0, 0, 0, 0, 0, 0, 0],
        [2400, 178, 178, 178, 178, 178, 178, 178, 177, 177],
        [400, 400, 400, 400, 400, 400, 400, 400, 400, 400],
    ]
)


# ---------------------------------------------------------------------------------------------------------------------
# the independent implementation (mpmath, scalar, straight from the paper's formulas)
# ---------------------------------------------------------------------------------------------------------------------


def ref_q_gnmax(counts, sigma) -> mp.mpf:
    """Prop. 7: q <= sum_{j != j*} erfc((n* - n_j) / (2 sigma)) / 2, capped at 1 - 1/m."""
    counts = [int(c) for c in counts]
    star = counts.index(max(counts))
    total = mp.mpf(0)
    for j, c in enumerate(counts):
        if j != star:
            total += mp.erfc(mp.mpf(counts[star] - c) / (2 * mp.mpf(sigma))) / 2
    return min(total, 1 - mp.mpf(1) / len(counts))


def ref_thm6(q, sigma, order) -> mp.mpf:
    """Thm 6 with mu2 = sigma sqrt(log 1/q), mu1 = mu2 + 1, eps_i = mu_i / sigma^2; min with lambda / sigma^2.

    Evaluated as written, so ``1 - q`` needs about ``log10(1/q)`` more digits than the answer: the working
    precision grows with it, up to 400 digits (below q ~ 1e-340 the RDP is far below the tests' tolerances).
    """
    q = mp.mpf(q)
    if q == 0:
        return mp.mpf(0)
    with mp.workdps(min(400, 60 + int(-mp.log10(q)))):
        return +_ref_thm6(q, sigma, order)


def _ref_thm6(q, sigma, order) -> mp.mpf:
    s, lam = mp.mpf(sigma), mp.mpf(order)
    independent = lam / s**2
    mu2 = s * mp.sqrt(mp.log(1 / q))
    mu1 = mu2 + 1
    e1, e2 = mu1 / s**2, mu2 / s**2
    if not mu2 > 1 or not lam < mu1 or not q * mp.e**e2 < 1:
        return independent
    if not q <= mp.e ** ((mu2 - 1) * e2) / (mu1 / (mu1 - 1) * mu2 / (mu2 - 1)) ** mu2:
        return independent
    a = (1 - q) / (1 - (q * mp.e**e2) ** ((mu2 - 1) / mu2))
    b = mp.e**e1 / q ** (1 / (mu1 - 1))
    value = mp.log((1 - q) * a ** (lam - 1) + q * b ** (lam - 1)) / (lam - 1)
    return min(independent, max(value, mp.mpf(0)))


def ref_p_answered(max_votes, sigma_threshold, threshold) -> mp.mpf:
    """Pr[max + N(0, s1^2) >= T] = erfc((T - max) / (s1 sqrt 2)) / 2."""
    return mp.erfc((mp.mpf(threshold) - int(max_votes)) / (mp.mpf(sigma_threshold) * mp.sqrt(2))) / 2


def ref_threshold(max_votes, sigma_threshold, threshold, order) -> mp.mpf:
    """The threshold step: Thm 6 with q = min(p, 1 - p) and an RDP of lambda / (2 s1^2) = lambda / (sqrt2 s1)^2.

    ``1 - p`` is the other tail, erfc((max - T) / (s1 sqrt 2)) / 2, not a subtraction (which rounds to 0).
    """
    p = ref_p_answered(max_votes, sigma_threshold, threshold)
    not_p = mp.erfc((int(max_votes) - mp.mpf(threshold)) / (mp.mpf(sigma_threshold) * mp.sqrt(2))) / 2
    return ref_thm6(min(p, not_p), mp.sqrt(2) * sigma_threshold, order)


def ref_epsilon(rdp, orders, delta) -> float:
    """Balle et al. 2020 Thm 21: min over orders of rdp + log((a-1)/a) - (log delta + log a) / (a - 1)."""
    best = mp.inf
    for a, r in zip(orders, rdp):
        a = mp.mpf(a)
        best = min(best, mp.mpf(r) + mp.log((a - 1) / a) - (mp.log(delta) + mp.log(a)) / (a - 1))
    return float(max(best, 0))


def ref_query_rdp(counts, s1, s2, t, order, answered=True) -> mp.mpf:
    value = ref_threshold(max(counts), s1, t, order)
    if answered:
        value += ref_thm6(ref_q_gnmax(counts, s2), s2, order)
    return value


def assert_close(ours, ref, rel=1e-7, abs_=1e-300):
    ours, ref = np.asarray(ours, dtype=float), np.asarray([float(r) for r in np.ravel(ref)]).reshape(np.shape(ours))
    np.testing.assert_allclose(ours, ref, rtol=rel, atol=abs_)


# ---------------------------------------------------------------------------------------------------------------------
# RDP functions vs the independent implementation
# ---------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("votes", [VOTES_2, VOTES_10, VOTES_GPATE], ids=["2bins", "10bins", "gpate"])
@pytest.mark.parametrize("sigma", SIGMAS)
def test_gnmax_rdp_matches_independent_implementation(votes, sigma):
    ours = gnmax_rdp(votes=votes, sigma=sigma, orders=ORDERS)
    ref = [[ref_thm6(ref_q_gnmax(row, sigma), sigma, a) for a in ORDERS] for row in votes]
    # relative 1e-7 (the log-space rewriting cancels a little where the RDP is tiny), absolute 1e-12 of lambda/sigma^2
    np.testing.assert_allclose(ours, np.array(ref, dtype=float), rtol=1e-7, atol=1e-12 * 1024 / sigma**2)
    logq = [mp.log(ref_q_gnmax(r, sigma)) for r in votes]
    assert_close(gnmax_logq(votes=votes, sigma=sigma), logq, rel=1e-12, abs_=1e-14)


def test_gnmax_cases_cover_both_regimes():
    """The fixtures above exercise the data-dependent bound and each reason to fall back to lambda/sigma^2."""
    di = gnmax_rdp_data_independent(sigma=5.0, orders=ORDERS)
    rdp = gnmax_rdp(votes=VOTES_2, sigma=5.0, orders=ORDERS)
    assert np.all(rdp[0, :6] < di[:6] * 1e-10)  # unanimous 100-0: far below up to order 20 ...
    assert np.all(rdp[0, 6:] == di[6:])  # ... but mu1 = 5 sqrt(log 1/q) + 1 ~ 52 < 64: data-independent above
    assert np.all(rdp[-1] == di)  # 50-50: q = 1/2, invalid -> data-independent
    # 90-10 at sigma 5: valid at small orders, but lambda >= mu1 at large ones (mu1 = 5 sqrt(log 1/q) + 1 ~ 32)
    assert rdp[2, 0] < di[0] and rdp[2, -1] == di[-1]
    mu1 = 5.0 * math.sqrt(-gnmax_logq(votes=VOTES_2[2:3], sigma=5.0)[0]) + 1
    assert 20 < mu1 < 64 and rdp[2, ORDERS.index(64.0)] == di[ORDERS.index(64.0)]
    # sigma = 1: mu2 = sqrt(log 1/q) > 1 needs q < 1/e; the 55-45 split at sigma 1 is still data-dependent
    assert gnmax_rdp(votes=VOTES_2[4:5], sigma=1.0, orders=[2.0])[0, 0] < 2.0
    # G-PATE's sigma = 1000 with 4000 teachers: even unanimous votes leave q ~ 0.02, so no data-dependent gain up to
    # order 64 (where the optimum of an eps ~ 1 budget lies); only at orders >= 256 (mu1 ~ 1965) a small one
    gpate = gnmax_rdp(votes=VOTES_GPATE, sigma=1000.0, orders=ORDERS)
    di_gpate = gnmax_rdp_data_independent(sigma=1000.0, orders=ORDERS)
    np.testing.assert_array_equal(gpate[:, :7], np.tile(di_gpate[:7], (4, 1)))
    assert gpate[0, 7] < di_gpate[7] and np.array_equal(gpate[1:, 7:], np.tile(di_gpate[7:], (3, 1)))


@pytest.mark.parametrize("votes", [VOTES_2, VOTES_10, VOTES_GPATE], ids=["2bins", "10bins", "gpate"])
@pytest.mark.parametrize("sigma_threshold,threshold", [(1.0, 60.0), (5.0, 80.0), (40.0, 150.0), (3000.0, 2000.0)])
def test_threshold_rdp_matches_independent_implementation(votes, sigma_threshold, threshold):
    ours = threshold_rdp(votes=votes, sigma_threshold=sigma_threshold, threshold=threshold, orders=ORDERS)
    ref = [[ref_threshold(max(row), sigma_threshold, threshold, a) for a in ORDERS] for row in votes]
    np.testing.assert_allclose(ours, np.array(ref, dtype=float), rtol=1e-7, atol=1e-12 * 1024 / sigma_threshold**2)
    logp = threshold_logpr_answered(votes=votes, sigma_threshold=sigma_threshold, threshold=threshold)
    ref_logp = [mp.log(ref_p_answered(max(r), sigma_threshold, threshold)) for r in votes]
    assert_close(logp, ref_logp, rel=1e-12, abs_=1e-14)  # log p ~ -1e-300 where p ~ 1: compared absolutely


def test_threshold_data_independent_is_half_of_gnmax_at_the_same_sigma():
    # max count: sensitivity 1 -> lambda/(2 s1^2); histogram: sensitivity sqrt 2 -> lambda/s^2
    threshold_di = threshold_rdp_data_independent(sigma_threshold=7.0, orders=ORDERS)
    np.testing.assert_allclose(threshold_di, np.array(ORDERS) / 98)
    np.testing.assert_allclose(gnmax_rdp_data_independent(sigma=7.0, orders=ORDERS), np.array(ORDERS) / 49)
    # and equals the Gaussian mechanism's RDP at noise multiplier s1 (sensitivity 1)
    np.testing.assert_allclose(
        threshold_rdp_data_independent(sigma_threshold=7.0, orders=ORDERS),
        gaussian_rdp(noise_multiplier=7.0, orders=ORDERS),
    )
    # a threshold far from the max count: q ~ 0 -> the data-dependent RDP is ~0; at the max count: q = 1/2 -> fallback
    far = threshold_rdp(votes=[[100, 0]], sigma_threshold=5.0, threshold=20.0, orders=ORDERS)[0]
    at = threshold_rdp(votes=[[100, 0]], sigma_threshold=5.0, threshold=100.0, orders=ORDERS)[0]
    np.testing.assert_allclose(at, np.array(ORDERS) / 50, rtol=1e-15)
    # far: log q ~ -131, mu1 = sqrt2 * 5 * sqrt(131) + 1 ~ 82: tiny up to order 20, smaller at 64, fallback above
    assert np.all(far[:6] < 1e-20) and far[6] < 64 / 50
    np.testing.assert_allclose(far[7:], np.array(ORDERS[7:]) / 50, rtol=1e-15)


def test_rdp_from_logq_edge_cases():
    assert np.all(gnmax_rdp_from_logq(logq=-np.inf, sigma=3.0, orders=ORDERS) == 0.0)  # a certain answer
    np.testing.assert_array_equal(gnmax_rdp_from_logq(logq=0.0, sigma=3.0, orders=ORDERS), np.array(ORDERS) / 9)
    assert gnmax_rdp_from_logq(logq=[-50.0, -1.0], sigma=3.0, orders=ORDERS).shape == (2, len(ORDERS))
    for q in (1e-3, 1e-8, 1e-30):  # against the reference directly on q
        assert_close(gnmax_rdp_from_logq(logq=math.log(q), sigma=3.0, orders=ORDERS),
                     [ref_thm6(q, 3.0, a) for a in ORDERS], rel=1e-7)
    with pytest.raises(ValueError, match="logq"):
        gnmax_rdp_from_logq(logq=0.1, sigma=3.0, orders=ORDERS)


# (votes, sigma, order) -> RDP, computed with dpsyn and with the mpmath reference (agreeing to >= 12 digits)
PINNED_GNMAX = [(([90, 10], 5.0, 2.0), 2.8812953686309e-28), (([200, 50] + [0] * 8, 40.0, 8.0), 0.0016548841892320)]
PINNED_THRESHOLD = [((97, 5.0, 80.0, 3.5), 0.0013076007755151)]  # (max votes, sigma_threshold, T, order) -> RDP


def test_pinned_rdp_values():
    for (votes, sigma, order), value in PINNED_GNMAX:
        assert gnmax_rdp(votes=[votes], sigma=sigma, orders=[order])[0, 0] == pytest.approx(value, rel=1e-11)
        assert float(ref_thm6(ref_q_gnmax(votes, sigma), sigma, order)) == pytest.approx(value, rel=1e-11)
    for (max_votes, s1, t, order), value in PINNED_THRESHOLD:
        votes = [[max_votes, 100 - max_votes]]
        assert threshold_rdp(votes=votes, sigma_threshold=s1, threshold=t, orders=[order])[0, 0] == pytest.approx(
            value, rel=1e-11
        )
        assert float(ref_threshold(max_votes, s1, t, order)) == pytest.approx(value, rel=1e-11)


# ---------------------------------------------------------------------------------------------------------------------
# composition and epsilon
# ---------------------------------------------------------------------------------------------------------------------


def test_confident_gnmax_rdp_composes_per_query():
    answered = np.array([True, False, True, True, False, True])
    kw = dict(sigma_threshold=5.0, sigma=5.0, threshold=80.0, orders=ORDERS)
    ours = confident_gnmax_rdp(votes=VOTES_2, answered=answered, **kw)
    ref = [sum(ref_query_rdp(r, 5.0, 5.0, 80.0, a, ans) for r, ans in zip(VOTES_2, answered)) for a in ORDERS]
    assert_close(ours, ref, rel=1e-7)
    # answered=None charges GNMax for every query: never less than with the mask
    everything = confident_gnmax_rdp(votes=VOTES_2, **kw)
    assert np.all(everything >= ours)
    assert_close(everything, [sum(ref_query_rdp(r, 5.0, 5.0, 80.0, a) for r in VOTES_2) for a in ORDERS], rel=1e-7)
    # data-independent: Q (lambda/(2 s1^2) + lambda/s^2) regardless of answers
    di = confident_gnmax_rdp(votes=VOTES_2, answered=answered, data_dependent=False, **kw)
    np.testing.assert_allclose(di, 6 * (np.array(ORDERS) / 50 + np.array(ORDERS) / 25))


def test_pate_epsilon_matches_reference_and_dp_accounting():
    from dp_accounting.rdp.rdp_privacy_accountant import compute_epsilon

    orders = rdp_orders()
    answered = np.array([True, True, False, True])
    kw = dict(votes=VOTES_GPATE, sigma_threshold=3000.0, sigma=1000.0, threshold=2000.0, delta=DELTA)
    info = pate_privacy(answered=answered, **kw)
    ref_rdp = [sum(ref_query_rdp(r, 3000.0, 1000.0, 2000.0, a, ans) for r, ans in zip(VOTES_GPATE, answered))
               for a in orders]
    assert_close(info.rdp, ref_rdp, rel=1e-9)
    assert info.epsilon == pytest.approx(ref_epsilon(ref_rdp, orders, DELTA), rel=1e-10)
    assert info.epsilon == pytest.approx(compute_epsilon(orders, info.rdp, DELTA)[0], rel=1e-10)
    assert info.queries == 4 and info.answered == 3 and info.bound == "data_dependent"
    assert info.epsilon == pate_epsilon(answered=answered, **kw)
    p = [float(ref_p_answered(max(r), 3000.0, 2000.0)) for r in VOTES_GPATE]
    assert info.expected_answered == pytest.approx(sum(p), rel=1e-12)
    # pinned (dpsyn and the reference agree to 1e-12). G-PATE's sigmas leave q large even for unanimous votes, so
    # the data-dependent bound gains mostly from the unanswered query; with four queries the best order is high,
    # where the unanimous query's GNMax bound is a little below lambda/sigma^2 too.
    assert info.epsilon == pytest.approx(0.0065659359212618, rel=1e-10)
    assert pate_epsilon(data_dependent=False, **kw) == pytest.approx(0.0078249652326271, rel=1e-10)
    all_charged = [sum(ref_query_rdp(r, 3000.0, 1000.0, 2000.0, a) for r in VOTES_GPATE) for a in orders]
    assert pate_epsilon(**kw) == pytest.approx(ref_epsilon(all_charged, orders, DELTA), rel=1e-10)
    assert pate_epsilon(**kw) == pytest.approx(0.0075899359212618, rel=1e-10)


def test_rdp_to_epsilon_uses_the_ledgers_conversion():
    orders = rdp_orders()
    rdp = 40 * gaussian_rdp(noise_multiplier=4.0, orders=orders)
    eps, best = rdp_to_epsilon(rdp=rdp, orders=orders, delta=DELTA)
    ledger = PrivacyLedger(target_epsilon=100.0, delta=DELTA)
    ledger.add(GaussianEvent(noise_multiplier=4.0, count=40))
    ledger.add(PATEEvent(sigma_threshold=1.0, sigma=1.0, threshold=0.0))  # no queries: spends nothing
    assert eps == pytest.approx(ref_epsilon(rdp, orders, DELTA), rel=1e-12)
    assert best in orders
    # never optimistic compared with the classic conversion pate_2018 uses (rdp + log(1/delta)/(lambda-1))
    classic = min(r + math.log(1 / DELTA) / (a - 1) for a, r in zip(orders, rdp))
    assert eps <= classic
    inf_rdp = np.where(np.array(orders) < 10, rdp, np.inf)  # orders with no bound are skipped
    assert rdp_to_epsilon(rdp=inf_rdp, orders=orders, delta=DELTA)[1] < 10
    assert rdp_to_epsilon(rdp=np.full(len(orders), np.inf), orders=orders, delta=DELTA)[0] == math.inf
    with pytest.raises(ValueError, match="same length"):
        rdp_to_epsilon(rdp=[1.0], orders=[2.0, 3.0], delta=DELTA)


@settings(max_examples=60, deadline=None, database=None)
@given(
    data=st.data(),
    bins=st.integers(min_value=2, max_value=12),
    teachers=st.integers(min_value=1, max_value=5000),
    sigma=st.floats(min_value=0.2, max_value=5000.0),
    sigma_threshold=st.floats(min_value=0.2, max_value=5000.0),
    threshold_frac=st.floats(min_value=-0.5, max_value=1.5),
)
def test_data_dependent_never_exceeds_data_independent(data, bins, teachers, sigma, sigma_threshold, threshold_frac):
    weights = data.draw(st.lists(st.integers(0, 100), min_size=bins, max_size=bins).filter(lambda w: sum(w) > 0))
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    votes = rng.multinomial(teachers, np.array(weights) / sum(weights), size=3)
    orders = rdp_orders()
    t = threshold_frac * teachers
    gn = gnmax_rdp(votes=votes, sigma=sigma, orders=orders)
    th = threshold_rdp(votes=votes, sigma_threshold=sigma_threshold, threshold=t, orders=orders)
    assert np.all(gn >= 0) and np.all(th >= 0)
    assert np.all(gn <= gnmax_rdp_data_independent(sigma=sigma, orders=orders))
    assert np.all(th <= threshold_rdp_data_independent(sigma_threshold=sigma_threshold, orders=orders))
    kw = dict(votes=votes, sigma_threshold=sigma_threshold, sigma=sigma, threshold=t, delta=DELTA)
    assert pate_epsilon(**kw) <= pate_epsilon(data_dependent=False, **kw)
    answered = rng.random(3) < 0.5
    assert pate_epsilon(answered=answered, **kw) <= pate_epsilon(**kw)


@settings(max_examples=30, deadline=None, database=None)
@given(
    queries=st.integers(min_value=1, max_value=200_000),
    extra=st.integers(min_value=1, max_value=100_000),
    sigma=st.floats(min_value=1.0, max_value=5000.0),
    sigma_threshold=st.floats(min_value=1.0, max_value=5000.0),
    factor=st.floats(min_value=1.01, max_value=5.0),
)
def test_data_independent_epsilon_monotone(queries, extra, sigma, sigma_threshold, factor):
    kw = dict(sigma_threshold=sigma_threshold, sigma=sigma, delta=DELTA)
    eps = pate_data_independent_epsilon(queries=queries, **kw)
    assert pate_data_independent_epsilon(queries=queries + extra, **kw) >= eps
    more_noise = dict(sigma_threshold=sigma_threshold * factor, sigma=sigma * factor, delta=DELTA)
    assert pate_data_independent_epsilon(queries=queries, **more_noise) <= eps
    if eps > 1e-9:
        assert pate_data_independent_epsilon(queries=queries, **more_noise) < eps


def test_data_dependent_epsilon_monotone_in_queries_but_not_in_sigma():
    rng = np.random.default_rng(3)
    votes = rng.multinomial(250, [0.7, 0.2, 0.1], size=400)
    kw = dict(sigma_threshold=20.0, sigma=10.0, threshold=150.0, delta=DELTA)
    eps = [pate_epsilon(votes=votes[:n], **kw) for n in (1, 10, 50, 100, 400)]
    assert all(a < b for a, b in zip(eps, eps[1:]))
    # More noise can RAISE the data-dependent bound: with little noise a consensus answer is almost certain
    # (q ~ 0, RDP ~ 0); more noise makes q larger. Only the data-independent bound decreases in sigma for sure.
    unanimous = np.array([[250, 0, 0]] * 10)
    low = pate_epsilon(votes=unanimous, sigma_threshold=5.0, sigma=5.0, threshold=100.0, delta=DELTA)
    high = pate_epsilon(votes=unanimous, sigma_threshold=50.0, sigma=50.0, threshold=100.0, delta=DELTA)
    assert low < high
    di = dict(sigma_threshold=5.0, threshold=100.0, delta=DELTA, data_dependent=False)
    assert pate_epsilon(votes=unanimous, sigma=50.0, **{**di, "sigma_threshold": 50.0}) < pate_epsilon(
        votes=unanimous, sigma=5.0, **di
    )


def test_no_queries_spend_nothing():
    kw = dict(sigma_threshold=3.0, sigma=3.0, threshold=1.0, delta=DELTA)
    assert pate_epsilon(votes=np.zeros((0, 4)), **kw) == 0.0
    assert pate_data_independent_epsilon(queries=0, sigma_threshold=3.0, sigma=3.0, delta=DELTA) == 0.0


# ---------------------------------------------------------------------------------------------------------------------
# G-PATE's budget: how many queries the data-independent bound allows
# ---------------------------------------------------------------------------------------------------------------------

GPATE_MNIST_EPS1 = dict(sigma_threshold=3000.0, sigma=1000.0, delta=1e-5)  # 4000 teachers, T=2000 (methods.md)


def test_gpate_mnist_eps1_data_independent_budget_pinned():
    q = pate_max_queries(epsilon=1.0, **GPATE_MNIST_EPS1)
    assert q == 28944
    assert pate_data_independent_epsilon(queries=q, **GPATE_MNIST_EPS1) <= 1.0
    assert pate_data_independent_epsilon(queries=q + 1, **GPATE_MNIST_EPS1) > 1.0
    # reference: per query lambda (1/(2 3000^2) + 1/1000^2), Balle conversion at dpsyn's orders
    orders = rdp_orders()
    c = 1 / (2 * 3000.0**2) + 1 / 1000.0**2
    assert ref_epsilon([q * c * a for a in orders], orders, 1e-5) <= 1.0 < ref_epsilon(
        [(q + 1) * c * a for a in orders], orders, 1e-5
    )
    # G-PATE queries 64 samples x 10 projected dimensions = 640 votes per generator step: 45 steps
    assert q // 640 == 45
    # eps as a function of the number of queries (pinned)
    for queries, eps in [(640, 0.1275249521), (6400, 0.4415033018), (28944, 0.9999866278), (64000, 1.5438441902)]:
        assert pate_data_independent_epsilon(queries=queries, **GPATE_MNIST_EPS1) == pytest.approx(eps, rel=1e-9)
    # and the same number through pate_epsilon on real-shaped votes (10 bins)
    votes = np.tile(VOTES_GPATE, (160, 1))  # 640 queries
    assert pate_epsilon(votes=votes, threshold=2000.0, data_dependent=False, **GPATE_MNIST_EPS1) == pytest.approx(
        0.1275249521, rel=1e-9
    )


def test_pate_max_queries_edge_cases():
    assert pate_max_queries(epsilon=1e-6, sigma_threshold=1.0, sigma=1.0, delta=DELTA) == 0
    assert pate_max_queries(epsilon=10.0, sigma_threshold=600.0, sigma=100.0, delta=1e-5) == 17582  # eps=10 setting


# ---------------------------------------------------------------------------------------------------------------------
# the mechanism
# ---------------------------------------------------------------------------------------------------------------------

torch = pytest.importorskip("torch")

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.mark.parametrize("device", DEVICES)
def test_confident_gnmax_answers_consensus_and_skips_disagreement(device):
    gen = dp_generator(deterministic=True, seed=0, device=device)
    truth = torch.arange(100, device=device) % 7
    votes = torch.zeros(100, 7, dtype=torch.int64, device=device)
    votes[torch.arange(100), truth] = 1000
    answered, label = confident_gnmax(votes, sigma_threshold=10.0, sigma=10.0, threshold=500.0, generator=gen)
    assert answered.dtype == torch.bool and label.dtype == torch.int64 and label.device.type == device
    assert answered.all() and torch.equal(label, truth)
    low = torch.full((50, 7), 10, device=device)
    low[:, 0] = 40
    answered, label = confident_gnmax(low, sigma_threshold=10.0, sigma=10.0, threshold=1000.0, generator=gen)
    assert not answered.any() and torch.all(label == -1)


def test_confident_gnmax_answered_rate_and_labels_match_analytic_probabilities():
    gen = dp_generator(deterministic=True, seed=1)
    n, s1, s2, t = 20000, 30.0, 20.0, 100.0
    votes = torch.tensor([[115, 85]] * n)  # max - T = 15 = s1/2: Pr[answered] = Phi(1/2)
    answered, label = confident_gnmax(votes, sigma_threshold=s1, sigma=s2, threshold=t, generator=gen)
    p = float(ref_p_answered(115, s1, t))
    assert p == pytest.approx(0.5 * math.erfc(-0.5 / math.sqrt(2)))
    assert abs(answered.float().mean().item() - p) < 5 * math.sqrt(p * (1 - p) / n)
    # among the answered, label 0 wins w.p. Pr[N(0, 2 s2^2) < 30] = Phi(30 / (sqrt2 s2))
    wins = (label[answered] == 0).float()
    p0 = 0.5 * math.erfc(-30 / (math.sqrt(2) * s2) / math.sqrt(2))
    assert abs(wins.mean().item() - p0) < 5 * math.sqrt(p0 * (1 - p0) / wins.numel())
    assert torch.all(label[~answered] == -1) and torch.all(label[answered] >= 0)
    # and the data-dependent accounting's expected number of answers says the same
    info = pate_privacy(votes=votes[:10].numpy(), sigma_threshold=s1, sigma=s2, threshold=t, delta=DELTA)
    assert info.expected_answered == pytest.approx(10 * p, rel=1e-12)


def test_confident_gnmax_noise_comes_from_the_generator():
    votes = torch.tensor([[10, 9, 8], [5, 5, 5]] * 50)
    kw = dict(sigma_threshold=5.0, sigma=5.0, threshold=8.0)
    a1, l1 = confident_gnmax(votes, generator=dp_generator(deterministic=True, seed=7), **kw)
    a2, l2 = confident_gnmax(votes, generator=dp_generator(deterministic=True, seed=7), **kw)
    a3, l3 = confident_gnmax(votes, generator=dp_generator(deterministic=True, seed=8), **kw)
    assert torch.equal(a1, a2) and torch.equal(l1, l2)
    assert not (torch.equal(a1, a3) and torch.equal(l1, l3))


def test_confident_gnmax_rejects_bad_input():
    gen = dp_generator(deterministic=True, seed=0)
    kw = dict(sigma_threshold=1.0, sigma=1.0, threshold=1.0, generator=gen)
    with pytest.raises(ValueError, match="torch.Tensor"):
        confident_gnmax(np.ones((2, 3)), **kw)
    with pytest.raises(ValueError, match="shape"):
        confident_gnmax(torch.ones(3), **kw)
    with pytest.raises(ValueError, match="sigma"):
        confident_gnmax(torch.ones(2, 3), **{**kw, "sigma": 0.0})
    with pytest.raises(ValueError, match="generator"):
        confident_gnmax(torch.ones(2, 3), **{**kw, "generator": np.random.default_rng(0)})
    with pytest.raises(TypeError):
        confident_gnmax(torch.ones(2, 3), 1.0, 1.0, 1.0, gen)  # keyword-only


def test_rdp_functions_reject_bad_input():
    kw = dict(sigma_threshold=1.0, sigma=1.0, threshold=1.0, delta=DELTA)
    with pytest.raises(ValueError, match="2-D"):
        pate_epsilon(votes=[1, 2, 3], **kw)
    with pytest.raises(ValueError, match="at least 2 bins"):
        pate_epsilon(votes=[[3]], **kw)
    with pytest.raises(ValueError, match="integer counts"):
        pate_epsilon(votes=[[1.5, 2]], **kw)
    with pytest.raises(ValueError, match="integer counts"):
        pate_epsilon(votes=[[-1, 2]], **kw)
    with pytest.raises(ValueError, match="answered"):
        pate_epsilon(votes=[[1, 2]], answered=[True, False], **kw)
    with pytest.raises(ValueError, match="sigma_threshold"):
        pate_epsilon(votes=[[1, 2]], **{**kw, "sigma_threshold": -1.0})
    with pytest.raises(ValueError, match="delta"):
        pate_epsilon(votes=[[1, 2]], **{**kw, "delta": 0.0})
    with pytest.raises(ValueError, match="orders"):
        gnmax_rdp(votes=[[1, 2]], sigma=1.0, orders=[1.0, 2.0])
    with pytest.raises(ValueError, match="'data_independent', 'raw', 'smooth'"):
        pate_bound_for_release("smoothed")
    bounds = [pate_bound_for_release(r) for r in PATE_RELEASES]
    assert bounds == ["data_independent", "data_dependent", "data_dependent"]


# ---------------------------------------------------------------------------------------------------------------------
# the ledger's PATE event
# ---------------------------------------------------------------------------------------------------------------------


def pate_event(bound: str = "data_independent") -> PATEEvent:
    return PATEEvent(sigma_threshold=20.0, sigma=10.0, threshold=150.0, bound=bound, label="teachers")


def some_votes(seed: int = 0, n: int = 64) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    votes = rng.multinomial(250, rng.dirichlet([3.0, 1.0, 1.0]), size=n)
    return votes, rng.random(n) < 0.6


@pytest.mark.parametrize("bound", ["data_independent", "data_dependent"])
def test_single_pate_event_equals_pate_epsilon(bound):
    ledger = PrivacyLedger(target_epsilon=50.0, delta=DELTA)
    event_id = ledger.add(pate_event(bound))
    assert ledger.epsilon() == 0.0
    batches = [some_votes(seed) for seed in range(3)]
    for votes, answered in batches:
        ledger.record_pate_queries(event_id, votes, answered)
    votes = np.concatenate([b[0] for b in batches])
    answered = np.concatenate([b[1] for b in batches])
    expected = pate_epsilon(
        votes=votes, answered=answered, sigma_threshold=20.0, sigma=10.0, threshold=150.0, delta=DELTA,
        data_dependent=bound == "data_dependent",
    )
    assert ledger.epsilon() == pytest.approx(expected, rel=1e-12)
    event = ledger.events[event_id]
    assert event.queries == 192 and event.answered == int(answered.sum())
    raw = "; raw: a function of the private votes, not itself a DP release" if bound == "data_dependent" else ""
    assert ledger.raw_data_dependent() == (bound == "data_dependent")
    assert ledger.accountant_description().endswith(
        f"composition of 1 pate confident-gnmax event(s) ({bound.replace('_', '-')} bound{raw})"
    )


def test_pate_event_accepts_torch_votes_and_grows_in_place():
    votes, answered = some_votes()
    event = pate_event("data_dependent")
    event.add_queries(torch.from_numpy(votes), torch.from_numpy(answered))
    other = pate_event("data_dependent")
    other.add_queries(votes[:10], answered[:10])
    other.add_queries(votes[10:], answered[10:])
    assert other.queries == event.queries == 64
    np.testing.assert_allclose(other.rdp_data_dependent, event.rdp_data_dependent, rtol=1e-12)


def test_pate_event_composes_with_gaussian_by_rdp_addition():
    votes, answered = some_votes(n=40)
    ledger = PrivacyLedger(target_epsilon=50.0, delta=DELTA)
    pid = ledger.add(pate_event("data_dependent"))
    ledger.record_pate_queries(pid, votes, answered)
    ledger.add(GaussianEvent(noise_multiplier=8.0, count=5, label="histogram"))
    orders = rdp_orders()
    pate_part = [sum(ref_query_rdp(r, 20.0, 10.0, 150.0, a, ans) for r, ans in zip(votes, answered)) for a in orders]
    total = [p + 5 * a / (2 * 64.0) for p, a in zip(pate_part, orders)]
    assert ledger.epsilon() == pytest.approx(ref_epsilon(total, orders, DELTA), rel=1e-9)
    assert ledger.epsilon() > pate_epsilon(
        votes=votes, answered=answered, sigma_threshold=20.0, sigma=10.0, threshold=150.0, delta=DELTA
    )
    desc = ledger.accountant_description()
    assert "1 pate confident-gnmax event(s) (data-dependent bound; raw: a function of the private votes, not itself a " \
           "DP release)" in desc and "1 gaussian event(s)" in desc


def test_laplace_class_count_release_composes_as_approx_dp():
    """G-PATE/PATE-GAN's tabular two-step release: Laplace class counts (eps 0.01, delta 0) + the generator."""
    votes, answered = some_votes()
    ledger = PrivacyLedger(target_epsilon=1.0, delta=DELTA)
    ledger.add(ApproxDPEvent(epsilon=0.01, delta=0.0, label="laplace class counts"))
    pid = ledger.add(pate_event())
    ledger.record_pate_queries(pid, votes, answered)
    alone = pate_epsilon(votes=votes, sigma_threshold=20.0, sigma=10.0, threshold=150.0, delta=DELTA,
                         data_dependent=False)
    assert ledger.epsilon() == pytest.approx(0.01 + alone, rel=1e-12)  # delta 0: all of delta left for PATE
    assert ledger.accountant_description().endswith("+ basic composition of 1 approx-DP event(s)")


def test_pate_event_json_round_trip_and_resume(tmp_path):
    votes, answered = some_votes()
    ledger = PrivacyLedger(target_epsilon=50.0, delta=DELTA)
    a = ledger.add(pate_event("data_dependent"))
    b = ledger.add(pate_event("data_independent"))
    ledger.record_pate_queries(a, votes[:32], answered[:32])
    ledger.record_pate_queries(b, votes[:32], answered[:32])
    ledger.save(tmp_path)
    raw = json.loads((tmp_path / "privacy.json").read_text())
    event = raw["events"][0]
    assert event["kind"] == "pate" and event["bound"] == "data_dependent" and event["queries"] == 32
    assert len(event["rdp_data_dependent"]) == len(event["orders"]) == len(rdp_orders())
    resumed = PrivacyLedger.load(tmp_path)
    assert resumed.events == ledger.events and resumed.epsilon() == ledger.epsilon()
    resumed.record_pate_queries(a, votes[32:], answered[32:])
    resumed.record_pate_queries(b, votes[32:], answered[32:])
    straight = PrivacyLedger(target_epsilon=50.0, delta=DELTA)
    for eid, bound in ((0, "data_dependent"), (1, "data_independent")):
        straight.add(pate_event(bound))
        straight.record_pate_queries(eid, votes, answered)
    assert resumed.epsilon() == pytest.approx(straight.epsilon(), rel=1e-12)
    assert resumed.events[0].answered == straight.events[0].answered


def test_pate_event_rejects_bad_input_and_corrupt_files():
    with pytest.raises(ValueError, match="'data_independent', 'data_dependent'"):
        PATEEvent(sigma_threshold=1.0, sigma=1.0, threshold=1.0, bound="smooth")
    with pytest.raises(ValueError, match="sigma"):
        PATEEvent(sigma_threshold=1.0, sigma=0.0, threshold=1.0)
    with pytest.raises(ValueError, match="answered"):
        PATEEvent(sigma_threshold=1.0, sigma=1.0, threshold=1.0, queries=1, answered=2)
    with pytest.raises(ValueError, match="exceeds the data-independent bound"):
        PATEEvent(sigma_threshold=1.0, sigma=1.0, threshold=1.0, queries=1, orders=[2.0], rdp_data_dependent=[5.0])
    with pytest.raises(ValueError, match="values for"):
        PATEEvent(sigma_threshold=1.0, sigma=1.0, threshold=1.0, orders=[2.0, 3.0], rdp_data_dependent=[0.0])
    ledger = PrivacyLedger(target_epsilon=1.0, delta=DELTA)
    gid = ledger.add(GaussianEvent(noise_multiplier=3.0))
    with pytest.raises(ValueError, match="not a PATE"):
        ledger.record_pate_queries(gid, [[1, 2]], [True])
    pid = ledger.add(pate_event())
    with pytest.raises(ValueError, match="answered"):
        ledger.record_pate_queries(pid, [[1, 2], [3, 4]], [True])
    with pytest.raises(ValueError, match="not a DP-SGD"):
        ledger.record_steps(pid, 1)
    # a data-dependent event recorded at other orders cannot be composed at the ledger's
    odd = PrivacyLedger(target_epsilon=1.0, delta=DELTA)
    odd.add(PATEEvent(sigma_threshold=9.0, sigma=9.0, threshold=1.0, bound="data_dependent", queries=1,
                      orders=[2.0], rdp_data_dependent=[0.01]))
    with pytest.raises(ValueError, match="other orders"):
        odd.epsilon()


def test_budget_check_stops_an_overspending_pate_run():
    ledger = PrivacyLedger(target_epsilon=1.0, delta=1e-5)
    pid = ledger.add(PATEEvent(sigma_threshold=3000.0, sigma=1000.0, threshold=2000.0))
    votes = np.tile(VOTES_GPATE[:1], (28944, 1))
    ledger.record_pate_queries(pid, votes, np.ones(28944, dtype=bool))
    assert ledger.check_within_budget() <= 1.0
    ledger.record_pate_queries(pid, votes[:1], [True])
    with pytest.raises(BudgetExceededError, match="pate"):
        ledger.check_within_budget()


# ---------------------------------------------------------------------------------------------------------------------
# smooth sensitivity
# ---------------------------------------------------------------------------------------------------------------------


def ref_bu(q, sigma, m):
    """BU(q) = min(1, (m-1)/2 erfc(erfcinv(2q/(m-1)) - 1/sigma)), erfcinv(x) = erfinv(1 - x)."""
    q = mp.mpf(q)
    return min(mp.mpf(1), (m - 1) * mp.erfc(mp.erfinv(1 - 2 * q / (m - 1)) - 1 / mp.mpf(sigma)) / 2)


def ref_bl(q, sigma, m):
    q = mp.mpf(q)
    return (m - 1) * mp.erfc(mp.erfinv(1 - 2 * q / (m - 1)) + 1 / mp.mpf(sigma)) / 2


def ref_logq0(sigma, order):
    """Bisection in log q for where Thm 6 stops beating lambda/sigma^2 (the fixtures below are monotone there)."""
    di = mp.mpf(order) / mp.mpf(sigma) ** 2
    lo, hi = mp.mpf(-1), mp.mpf(0)
    while not ref_thm6(mp.e**lo, sigma, order) < di:
        lo *= 2
    for _ in range(120):
        mid = (lo + hi) / 2
        if ref_thm6(mp.e**mid, sigma, order) < di:
            lo = mid
        else:
            hi = mid
    return lo


def ref_ls_at_q(q, sigma, order, m):
    """Algorithm 3: LS(q) = max(beta(BU(q)) - beta(q), beta(q) - beta(BL(q))), or the plateau on [q1, q0]."""
    beta = lambda x: ref_thm6(x, sigma, order)  # noqa: E731
    q0 = mp.e ** ref_logq0(sigma, order)
    q1 = ref_bl(q0, sigma, m)
    if q1 <= q <= q0:
        return max(mp.mpf(order) / mp.mpf(sigma) ** 2 - beta(q1), beta(q1) - beta(ref_bl(q1, sigma, m)))
    return max(beta(ref_bu(q, sigma, m)) - beta(q), beta(q) - beta(ref_bl(q, sigma, m)))


@pytest.mark.parametrize(
    "votes,sigma,order",
    [
        ((38, 2, 0), 5.0, 3.0),
        ((30, 6, 4), 5.0, 3.0),
        ((20, 12, 8), 5.0, 3.0),
        ((35, 5), 4.0, 4.0),
        ((300, 0), 40.0, 8.0),
    ],
)
def test_gnmax_local_sensitivity_at_distance_zero_matches_reference(votes, sigma, order):
    ours = gnmax_local_sensitivity(votes=np.array(votes), sigma=sigma, order=order, num_teachers=sum(votes))
    ref = ref_ls_at_q(ref_q_gnmax(votes, sigma), sigma, order, len(votes))
    assert ours[0] == pytest.approx(float(ref), rel=1e-6, abs=1e-15)
    assert np.all(ours >= 0)


def _histograms(n: int, m: int):
    for cut in itertools.combinations(range(n + m - 1), m - 1):
        edges = (-1, *cut, n + m - 1)
        yield tuple(edges[i + 1] - edges[i] - 1 for i in range(m))


def brute_force_ls(votes, sigma, order):
    """Exact local sensitivity of the GNMax RDP over every histogram within distance d (small cases only)."""
    n, m = sum(votes), len(votes)
    hists = list(_histograms(n, m))
    beta = {h: float(ref_thm6(ref_q_gnmax(h, sigma), sigma, order)) for h in hists}
    ls = {}
    for h in hists:
        worst = 0.0
        for a, b in itertools.permutations(range(m), 2):
            if h[a]:
                g = list(h)
                g[a] -= 1
                g[b] += 1
                worst = max(worst, abs(beta[tuple(g)] - beta[h]))
        ls[h] = worst
    dist = {h: sum(max(x - y, 0) for x, y in zip(h, votes)) for h in hists}
    return np.array([max(ls[h] for h in hists if dist[h] <= d) for d in range(n + 1)])


@pytest.mark.parametrize(
    "votes,sigma,order", [((24, 1, 0), 5.0, 3.0), ((13, 8, 4), 5.0, 3.0), ((25, 0, 0), 3.0, 2.0), ((26, 4), 4.0, 4.0)]
)
def test_gnmax_local_sensitivity_bounds_brute_force(votes, sigma, order):
    ours = gnmax_local_sensitivity(votes=np.array(votes), sigma=sigma, order=order, num_teachers=sum(votes))
    exact = brute_force_ls(votes, sigma, order)
    assert np.all(ours >= exact - 1e-12)  # a valid upper bound at every distance
    assert np.all(ours <= 2.0 * exact + 1e-9)  # and not a loose one
    if len(votes) == 2:  # with two bins BU/BL are exact: the bound is nearly tight
        assert ours[0] == pytest.approx(exact[0], rel=1e-6)


def test_threshold_local_sensitivity_is_exact():
    n, s1, t, order = 40, 4.0, 25.0, 3.0
    r = [float(ref_threshold(v, s1, t, order)) for v in range(n + 1)]
    ls_at = [max(abs(r[v + k] - r[v]) for k in (-1, 1) if 0 <= v + k <= n) for v in range(n + 1)]
    for v in (0, 12, 25, 40):
        ours = threshold_local_sensitivity(max_votes=v, sigma_threshold=s1, threshold=t, order=order, num_teachers=n)
        ref = [max(ls_at[w] for w in range(max(0, v - d), min(n, v + d) + 1)) for d in range(n + 1)]
        assert ours.shape == (n + 1,) and np.all(ours <= np.array(ref) + 1e-15)
        # equal where it matters for the smooth sensitivity (the max over the window is at its edge or counted
        # earlier with a larger weight): compare the beta-smooth maxima, and ours never below the edge values
        for beta in (0.05, 0.2, 1.0):
            assert smooth_sensitivity(local_sensitivity=ours, beta=beta) == pytest.approx(
                smooth_sensitivity(local_sensitivity=np.array(ref), beta=beta), rel=1e-6
            )


def test_smooth_sensitivity_is_larger_for_split_votes_than_for_consensus():
    kw = dict(sigma=5.0, order=3.0, num_teachers=40)
    beta = 0.1
    consensus = smooth_sensitivity(local_sensitivity=gnmax_local_sensitivity(votes=np.array([40, 0, 0]), **kw),
                                   beta=beta)
    split = smooth_sensitivity(local_sensitivity=gnmax_local_sensitivity(votes=np.array([20, 12, 8]), **kw),
                               beta=beta)
    assert 0.0 <= consensus < split
    assert smooth_sensitivity(local_sensitivity=[0.0, 1.0, 4.0], beta=1.0) == pytest.approx(4 * math.exp(-2))


def test_gnss_rdp_matches_theorem_23():
    beta, s = 0.02, 3.0
    orders = [1.5, 5.0, 20.0, 24.9, 25.0, 100.0]
    ours = gnss_rdp(beta=beta, sigma_ss=s, orders=orders)
    for a, o in zip(orders, ours):
        if a < 1 / (2 * beta):
            a_ = mp.mpf(a)
            ref = a_ * mp.e ** (2 * mp.mpf(beta)) / s**2 + (beta * a_ - mp.log(1 - 2 * a_ * beta) / 2) / (a_ - 1)
            assert o == pytest.approx(float(ref), rel=1e-12)
        else:
            assert o == math.inf


def test_smooth_release_and_its_ledger_cost():
    rng = np.random.default_rng(5)
    votes = rng.multinomial(60, [0.8, 0.15, 0.05], size=30)
    answered = rng.random(30) < 0.7
    kw = dict(sigma_threshold=8.0, sigma=5.0, threshold=40.0)
    order, beta, sigma_ss = 3.0, 0.1, 2.0
    release = pate_smooth_release(
        votes=votes, answered=answered, delta=DELTA, order=order, beta=beta, sigma_ss=sigma_ss,
        generator=dp_numpy_generator(deterministic=True, seed=11), **kw,
    )
    assert isinstance(release, PATESmoothRelease) and release.queries == 30
    raw = confident_gnmax_rdp(votes=votes, answered=answered, orders=[order], **kw)[0]
    ls = pate_local_sensitivity(votes=votes, answered=answered, order=order, num_teachers=60, **kw)
    ss = smooth_sensitivity(local_sensitivity=ls, beta=beta)
    z = dp_numpy_generator(deterministic=True, seed=11).standard_normal()
    assert release.smooth_sensitivity == pytest.approx(ss) and ss > 0
    assert release.rdp_noisy == pytest.approx(raw + ss * sigma_ss * z)
    cost = gnss_rdp(beta=beta, sigma_ss=sigma_ss, orders=[order])[0]
    assert release.rdp_release == pytest.approx(cost)
    assert release.epsilon == pytest.approx(ref_epsilon([release.rdp_noisy + cost], [order], DELTA), rel=1e-12)
    # per-query local sensitivities add up
    single = sum(threshold_local_sensitivity(max_votes=int(max(v)), sigma_threshold=8.0, threshold=40.0, order=order,
                                             num_teachers=60) for v in votes)
    single += sum(gnmax_local_sensitivity(votes=v, sigma=5.0, order=order, num_teachers=60) for v in votes[answered])
    np.testing.assert_allclose(ls, single, rtol=1e-12)

    ledger = PrivacyLedger(target_epsilon=100.0, delta=DELTA)
    pid = ledger.add(PATEEvent(bound="data_dependent", **kw))
    ledger.record_pate_queries(pid, votes, answered)
    before = ledger.epsilon()
    assert ledger.raw_data_dependent()
    ledger.record_pate_smooth_release(pid, release)
    assert not ledger.raw_data_dependent()  # released with smooth sensitivity: no longer raw
    orders = rdp_orders()
    expected = rdp_to_epsilon(
        rdp=np.asarray(ledger.events[pid].rdp_data_dependent) + gnss_rdp(beta=beta, sigma_ss=sigma_ss, orders=orders),
        orders=orders, delta=DELTA,
    )[0]
    assert ledger.epsilon() == pytest.approx(expected, rel=1e-12) and ledger.epsilon() > before
    assert "1 smooth-sensitivity release(s)" in ledger.accountant_description()
    back = PrivacyLedger.from_dict(json.loads(json.dumps(ledger.to_dict())))
    assert back.events == ledger.events and back.epsilon() == ledger.epsilon()
    with pytest.raises(ValueError, match="already"):
        ledger.record_pate_smooth_release(pid, release)
    with pytest.raises(ValueError, match="already released"):
        ledger.record_pate_queries(pid, votes, answered)
    other = PrivacyLedger(target_epsilon=100.0, delta=DELTA)
    oid = other.add(PATEEvent(bound="data_dependent", **kw))
    other.record_pate_queries(oid, votes[:5], answered[:5])
    with pytest.raises(ValueError, match="covers 30 queries"):
        other.record_pate_smooth_release(oid, release)


def test_smooth_release_refuses_where_its_analysis_does_not_apply():
    check_smooth_sensitivity_conditions(sigma=40.0, order=8.0, num_bins=10)  # holds
    with pytest.raises(ValueError, match="C6"):  # small noise, high order: beta(BU(q)) - beta(q) is not monotone
        check_smooth_sensitivity_conditions(sigma=1.0, order=5.0, num_bins=3)
    kw = dict(votes=[[10, 0, 0]], answered=[True], sigma_threshold=2.0, sigma=1.0, threshold=5.0, delta=DELTA,
              generator=np.random.default_rng(0))
    with pytest.raises(ValueError, match="C6"):
        pate_smooth_release(order=5.0, beta=0.05, sigma_ss=1.0, **kw)
    with pytest.raises(ValueError, match=r"order must lie in \(1, 1/\(2 beta\)\)"):
        pate_smooth_release(order=5.0, beta=0.2, sigma_ss=1.0, **kw)
