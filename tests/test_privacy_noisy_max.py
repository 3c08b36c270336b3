"""Report noisy max (dpsyn.privacy.noisy_max): the selection frequencies against the closed form, the streaming
selector against the one-shot function, the ledger's charge and the input checks. Its privacy is audited
(tests/test_audit.py, row noisy_max_selection)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from dpsyn.privacy import NoisyMax, PrivacyLedger, dp_numpy_generator, noisy_max_event, report_noisy_max


def _gen(seed: int) -> np.random.Generator:
    return dp_numpy_generator(deterministic=True, seed=seed)


@pytest.mark.parametrize(("eps", "gap"), [(1.0, 0.0), (1.0, 2.0), (0.5, 3.0), (2.0, 1.0)])
def test_two_candidate_frequency_matches_the_laplace_difference(eps: float, gap: float) -> None:
    """Candidate 0 behind by ``gap``: selected with P(L0 - L1 > gap) = (2 + gap eps) exp(-gap eps) / 4 (the
    difference of two Laplace(1/eps) draws), within 5 standard errors over 200k selections side by side."""
    n = 200_000
    selector = NoisyMax(epsilon=eps, generator=_gen(7))
    selector.offer(np.full(n, 100.0 - gap))
    selector.offer(np.full(n, 100.0))
    p = (2.0 + gap * eps) * math.exp(-gap * eps) / 4.0
    assert abs(float(np.mean(selector.best == 0)) - p) < 5 * math.sqrt(p * (1 - p) / n)


def test_streaming_selector_is_the_one_shot_function() -> None:
    counts = [3.0, 9.0, 4.0, 8.5, 1.0]
    picks = []
    for seed in range(50):
        selector = NoisyMax(epsilon=0.7, generator=_gen(seed))
        won = [selector.offer(c) for c in counts]
        assert won[0] is True and won[selector.best] is True and selector.n == len(counts)
        assert selector.best == report_noisy_max(counts, epsilon=0.7, generator=_gen(seed))
        picks.append(selector.best)
    assert {1, 3} <= set(picks)  # the noise does choose among close candidates
    assert report_noisy_max([0.0, 1000.0, 0.0], epsilon=1.0, generator=_gen(1)) == 1


def test_the_charge_is_pure_dp_and_composes() -> None:
    ledger = PrivacyLedger(target_epsilon=2.0, delta=1e-5)
    ledger.add(noisy_max_event(epsilon=0.25, label="selection"))
    ledger.add(noisy_max_event(epsilon=0.5, label="selection"))
    assert ledger.epsilon() == pytest.approx(0.75)
    assert ledger.to_dict()["events"][0]["delta"] == 0.0


def test_inputs_are_checked() -> None:
    with pytest.raises(ValueError, match="at least one candidate"):
        report_noisy_max([], epsilon=1.0, generator=_gen(0))
    with pytest.raises(ValueError, match="epsilon"):
        NoisyMax(epsilon=math.inf, generator=_gen(0))
    with pytest.raises(ValueError, match="numpy Generator"):
        NoisyMax(epsilon=1.0, generator=np.random.RandomState(0))  # type: ignore[arg-type]
    selector = NoisyMax(epsilon=1.0, generator=_gen(0))
    selector.offer(np.zeros(3))
    with pytest.raises(ValueError, match="shape"):
        selector.offer(np.zeros(4))


def test_a_reservation_lowers_the_limit_of_every_stopping_check_for_the_block_only() -> None:
    """ledger.reserving(r): the method's stop checks (would_exceed, check_within_budget, renyi_filter) answer for
    target - r, so the pure-DP selection charged after the block fits; outside the block the target is whole."""
    from dpsyn.privacy import BudgetExceededError

    ledger = PrivacyLedger(target_epsilon=1.0, delta=1e-5)
    full_filter = ledger.renyi_filter(sigma_threshold=100.0, sigma=50.0)
    with ledger.reserving(0.3):
        assert ledger.would_exceed(noisy_max_event(epsilon=0.71, label="method"))
        assert not ledger.would_exceed(noisy_max_event(epsilon=0.69, label="method"))
        reserved_filter = ledger.renyi_filter(sigma_threshold=100.0, sigma=50.0)
        assert reserved_filter[1] < full_filter[1]  # the filter's RDP budget is that of eps 0.7
        ledger.add(noisy_max_event(epsilon=0.69, label="method"))
        ledger.check_within_budget()
        ledger.add(noisy_max_event(epsilon=0.02, label="over"))
        with pytest.raises(BudgetExceededError, match="0.3 reserved"):
            ledger.check_within_budget()
        with pytest.raises(ValueError, match="reserved already"):
            with ledger.reserving(0.1):
                pass
    assert not ledger.would_exceed(noisy_max_event(epsilon=0.29, label="selection"))
    ledger.add(noisy_max_event(epsilon=0.29, label="selection"))
    assert ledger.check_within_budget() == pytest.approx(1.0)
    with pytest.raises(ValueError, match="needs 0 <= eps < target"):
        with ledger.reserving(1.0):
            pass
    inf = PrivacyLedger(target_epsilon=math.inf, delta=1e-5)
    with inf.reserving(0.5):  # a non-private run reserves nothing
        assert not inf.would_exceed(noisy_max_event(epsilon=100.0, label="x"))
