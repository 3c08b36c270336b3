"""The Renyi filter bound of PATE events (``bound=renyi_filter``; Feldman & Zrnic 2021, Thm 3.1): a query pays GNMax
only if its threshold check answered it, at one RDP order fixed before the run, and the run stops before the realised
sum could pass the budget. Cross-checked against Google's dp_accounting (an RDP accountant independent of Opacus and
of dpsyn) at the filter's order."""

from __future__ import annotations

import math

import numpy as np
import pytest

from dpsyn.privacy import ApproxDPEvent, PATEEvent, PrivacyLedger, pate_max_queries
from dpsyn.privacy.dpsgd import rdp_orders

S1, S2, T = 3000.0, 1000.0, 2000.0  # G-PATE's eps=1 noise at 4000 teachers (votes)
ROUND = 150  # queries a round (15 samples x k=10)


def filter_event(ledger: PrivacyLedger, max_queries: int | None = None) -> PATEEvent:
    order, budget = ledger.renyi_filter(sigma_threshold=S1, sigma=S2)
    return PATEEvent(sigma_threshold=S1, sigma=S2, threshold=T, bound="renyi_filter", filter_order=order,
                     filter_budget=budget, max_queries=max_queries, label="test")


def votes_answered(n: int, answered: int) -> tuple[np.ndarray, np.ndarray]:
    votes = np.zeros((n, 10), dtype=np.int64)
    votes[:, 0] = 4000
    flags = np.zeros(n, dtype=bool)
    flags[:answered] = True
    return votes, flags


def dp_accounting_epsilon(order: float, thresholds: int, answered: int, delta: float) -> float:
    """The epsilon at ``order`` alone of ``thresholds`` Gaussian threshold checks (sensitivity 1) and ``answered``
    GNMax answers (L2 sensitivity sqrt 2: a Gaussian of noise multiplier sigma/sqrt 2), by dp_accounting."""
    dpa = pytest.importorskip("dp_accounting")
    from dp_accounting.rdp import rdp_privacy_accountant

    acc = rdp_privacy_accountant.RdpAccountant(orders=[order])
    acc.compose(dpa.GaussianDpEvent(noise_multiplier=S1), thresholds)
    if answered:
        acc.compose(dpa.GaussianDpEvent(noise_multiplier=S2 / math.sqrt(2)), answered)
    return acc.get_epsilon(delta)


def test_the_filter_s_budget_is_the_target_at_its_order_and_allows_the_data_independent_count_when_all_answer():
    ledger = PrivacyLedger(target_epsilon=1.0, delta=1e-5)
    order, budget = ledger.renyi_filter(sigma_threshold=S1, sigma=S2)
    assert order in rdp_orders()
    # the budget is the RDP whose epsilon at that order is the target, by an independent accountant
    per_threshold, per_answer = order / (2 * S1**2), order / S2**2
    n = budget / per_threshold  # thresholds alone that fill it (a real count of queries, not an integer here)
    assert dp_accounting_epsilon(order, int(n), 0, 1e-5) <= 1.0 < dp_accounting_epsilon(order, int(n) + 2, 0, 1e-5)
    # every query answered, the filter allows what the data-independent bound allows (the order is the same)
    assert math.floor(budget / (per_threshold + per_answer)) == pate_max_queries(
        epsilon=1.0, sigma_threshold=S1, sigma=S2, delta=1e-5)


def test_the_filter_s_stopping_rule_matches_an_independent_accountant_at_its_order() -> None:
    """Rounds of 150 queries, 60% answered: the ledger stops before the round that, all answered, could pass the
    budget; dp_accounting composes the released mechanisms at the filter's order and agrees on both sides."""
    ledger = PrivacyLedger(target_epsilon=1.0, delta=1e-5)
    event_id = ledger.add(filter_event(ledger))
    event = ledger.events[event_id]
    rounds = 0
    while True:
        trial = event.with_queries(*votes_answered(ROUND, ROUND))  # the round, every query answered
        if ledger.would_exceed(trial, replacing=event_id):
            break
        ledger.record_pate_queries(event_id, *votes_answered(ROUND, 90))
        rounds += 1
    q, a = event.queries, event.answered
    order = event.filter_order
    assert (q, a) == (rounds * ROUND, rounds * 90)
    assert dp_accounting_epsilon(order, q, a, 1e-5) <= 1.0  # what was released fits the budget
    assert dp_accounting_epsilon(order, q + ROUND, a + ROUND, 1e-5) > 1.0  # the next round, all answered, might not
    # more rounds than the data-independent bound (every query charged GNMax) allows, for the same target
    worst = pate_max_queries(epsilon=1.0, sigma_threshold=S1, sigma=S2, delta=1e-5) // ROUND
    assert rounds > 1.5 * worst
    # the guarantee reported is the filter's budget (the target), never the realised sum
    assert ledger.epsilon() == pytest.approx(1.0, rel=1e-9) and ledger.epsilon() <= 1.0
    assert event.filter_spent() == pytest.approx(q * order / (2 * S1**2) + a * order / S2**2)
    assert "renyi-filter" in ledger.accountant_description()


def test_an_overrun_filter_has_no_guarantee_and_the_ledger_refuses_it() -> None:
    from dpsyn.privacy import BudgetExceededError

    ledger = PrivacyLedger(target_epsilon=1.0, delta=1e-5)
    event_id = ledger.add(filter_event(ledger))
    event = ledger.events[event_id]
    per_query = event.filter_order / (2 * S1**2) + event.filter_order / S2**2
    n = int(event.filter_budget / per_query) + 1  # all answered: just past the budget
    ledger.record_pate_queries(event_id, *votes_answered(n, n))
    assert np.all(np.isinf(event.rdp(rdp_orders())))
    assert math.isinf(ledger.epsilon())
    with pytest.raises(BudgetExceededError):
        ledger.check_within_budget()


def test_the_step_cap_bounds_every_order_a_priori_and_only_while_the_run_stays_inside_it() -> None:
    ledger = PrivacyLedger(target_epsilon=10.0, delta=1e-5)
    event = filter_event(ledger, max_queries=3000)
    orders = np.asarray(rdp_orders())
    event.add_queries(*votes_answered(1500, 1000))
    worst = 3000 * (orders / (2 * S1**2) + orders / S2**2)  # the capped run, every query answered
    at = orders == event.filter_order
    np.testing.assert_allclose(event.rdp(orders)[~at], worst[~at])
    assert event.rdp(orders)[at] == pytest.approx(min(worst[at][0], event.filter_budget))
    # the cap binds: the reported epsilon is the capped run's data-independent one, under the target
    capped = PrivacyLedger(target_epsilon=10.0, delta=1e-5, events=[event])
    assert capped.epsilon() < 10.0
    from dpsyn.privacy import pate_data_independent_epsilon

    assert capped.epsilon() == pytest.approx(pate_data_independent_epsilon(
        queries=3000, sigma_threshold=S1, sigma=S2, delta=1e-5), rel=1e-6)
    # a run resumed with more steps than its event's cap: only the filter's order still holds a guarantee
    event.add_queries(*votes_answered(1501, 0))
    assert np.all(np.isinf(event.rdp(orders)[~at])) and np.isfinite(event.rdp(orders)[at][0])


def test_the_filter_leaves_the_class_proportions_their_share() -> None:
    """A table's Laplace class-ratio release (basic composition, as the ledger's epsilon) comes out of the target
    before the filter's budget is set."""
    ledger = PrivacyLedger(target_epsilon=1.0, delta=1e-5)
    ledger.add(ApproxDPEvent(epsilon=0.01, delta=0.0, label="class proportions"))
    event_id = ledger.add(filter_event(ledger))
    event = ledger.events[event_id]
    n = int(event.filter_budget / (event.filter_order / (2 * S1**2)))
    ledger.record_pate_queries(event_id, *votes_answered(n, 0))
    assert ledger.epsilon() == pytest.approx(1.0, rel=1e-9) and ledger.epsilon() <= 1.0
    assert dp_accounting_epsilon(event.filter_order, n, 0, 1e-5) <= 0.99


def test_a_filter_event_round_trips_through_json_and_rejects_what_does_not_belong() -> None:
    ledger = PrivacyLedger(target_epsilon=1.0, delta=1e-5)
    event = filter_event(ledger, max_queries=30000)
    event.add_queries(*votes_answered(300, 200))
    again = PATEEvent.from_dict(event.to_dict())
    assert again == event and again.filter_spent() == event.filter_spent()
    base = dict(sigma_threshold=S1, sigma=S2, threshold=T, label="x")
    with pytest.raises(ValueError, match="filter_order and filter_budget"):
        PATEEvent(**base, bound="renyi_filter")
    with pytest.raises(ValueError, match="not one of the event's RDP orders"):
        PATEEvent(**base, bound="renyi_filter", filter_order=17.5, filter_budget=0.5)
    with pytest.raises(ValueError, match="belong to the renyi_filter bound"):
        PATEEvent(**base, bound="data_independent", filter_order=18.0, filter_budget=0.5)
    with pytest.raises(ValueError, match="a private ledger"):
        PrivacyLedger(target_epsilon=math.inf, delta=1e-5).renyi_filter(sigma_threshold=S1, sigma=S2)
