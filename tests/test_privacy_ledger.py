"""The privacy ledger: composition rules, budget check, serialisation, atomic save."""

from __future__ import annotations

import json
import math
import os

import pytest

from dpsyn.privacy import (
    ApproxDPEvent,
    BudgetExceededError,
    GaussianEvent,
    NonPrivateEvent,
    PrivacyLedger,
    SampledGaussianEvent,
    dpsgd_epsilon,
    gdp_epsilon,
)

DELTA = 1e-5


def sgd(steps: int = 200, accountant: str = "rdp", **kw) -> SampledGaussianEvent:
    return SampledGaussianEvent(sampling="poisson", 
        noise_multiplier=kw.get("noise_multiplier", 1.1),
        sample_rate=kw.get("sample_rate", 0.01),
        steps=steps,
        accountant=accountant,
        label=kw.get("label", "discriminator"),
    )


def mixed_ledger() -> PrivacyLedger:
    ledger = PrivacyLedger(target_epsilon=5.0, delta=DELTA)
    ledger.add(GaussianEvent(noise_multiplier=4.0, count=3, label="histogram"))
    ledger.add(sgd())
    ledger.add(ApproxDPEvent(epsilon=0.2, delta=1e-6, label="laplace count"))
    return ledger


# ---------------------------------------------------------------------------------------------------------------------
# composition
# ---------------------------------------------------------------------------------------------------------------------


def test_empty_ledger_spends_nothing():
    ledger = PrivacyLedger(target_epsilon=1.0, delta=DELTA)
    assert ledger.epsilon(DELTA) == 0.0
    assert ledger.check_within_budget() == 0.0
    assert ledger.accountant_description() == "none (no releases)"


def test_gaussian_events_compose_exactly_as_gdp():
    two = PrivacyLedger(target_epsilon=10.0, delta=DELTA)
    two.add(GaussianEvent(noise_multiplier=3.0, count=2))
    two.add(GaussianEvent(noise_multiplier=4.0, count=5))
    # one event with the same sum of count/nm^2: 2/9 + 5/16 = 1/nm^2 -> nm = (2/9 + 5/16)^(-1/2)
    one = PrivacyLedger(target_epsilon=10.0, delta=DELTA)
    one.add(GaussianEvent(noise_multiplier=(2 / 9 + 5 / 16) ** -0.5, count=1))
    assert two.epsilon(DELTA) == pytest.approx(one.epsilon(DELTA), rel=1e-9)
    # and that is gdp_epsilon (PE's accounting): T releases at one noise level
    pe = PrivacyLedger(target_epsilon=10.0, delta=DELTA)
    pe.add(GaussianEvent(noise_multiplier=5 * math.sqrt(2), count=20))
    assert pe.epsilon(DELTA) == pytest.approx(gdp_epsilon(noise_multiplier=5 * math.sqrt(2), steps=20, delta=DELTA))
    assert round(pe.epsilon(DELTA), 3) == 2.594
    assert pe.accountant_description() == "gdp (exact)"


def test_approx_dp_events_add_and_take_their_delta():
    ledger = PrivacyLedger(target_epsilon=10.0, delta=DELTA)
    ledger.add(ApproxDPEvent(epsilon=0.5, delta=2e-6))
    ledger.add(ApproxDPEvent(epsilon=0.25, delta=3e-6))
    assert ledger.epsilon(DELTA) == pytest.approx(0.75)
    # with a Gaussian event, the Gaussian part is accounted at the delta left over (1e-5 - 5e-6)
    ledger.add(GaussianEvent(noise_multiplier=10.0, count=4))
    expected = 0.75 + gdp_epsilon(noise_multiplier=10.0, steps=4, delta=DELTA - 5e-6)
    assert ledger.epsilon(DELTA) == pytest.approx(expected, rel=1e-9)
    assert ledger.epsilon(DELTA) > 0.75 + gdp_epsilon(noise_multiplier=10.0, steps=4, delta=DELTA)
    assert "basic composition of 2 approx-DP event(s)" in ledger.accountant_description()


def test_approx_dp_deltas_exhausting_the_budget_raise():
    ledger = PrivacyLedger(target_epsilon=10.0, delta=DELTA)
    ledger.add(ApproxDPEvent(epsilon=0.5, delta=DELTA))
    assert ledger.epsilon(DELTA) == 0.5  # alone, it fits exactly
    ledger.add(GaussianEvent(noise_multiplier=10.0))
    with pytest.raises(ValueError, match="no delta is left"):
        ledger.epsilon(DELTA)
    alone = PrivacyLedger(target_epsilon=10.0, delta=DELTA)
    alone.add(ApproxDPEvent(epsilon=0.5, delta=2 * DELTA))
    with pytest.raises(ValueError, match="delta"):
        alone.epsilon(DELTA)
    # the ledger can still be saved (for inspection and resume) though its epsilon is undefined
    data = ledger.to_dict()
    assert data["epsilon_spent"] is None and "no delta is left" in data["epsilon_error"]


def test_non_private_event_makes_epsilon_infinite():
    ledger = PrivacyLedger(target_epsilon=math.inf, delta=DELTA)
    ledger.add(GaussianEvent(noise_multiplier=10.0))
    assert ledger.is_private
    ledger.add(NonPrivateEvent(label="real data"))
    assert not ledger.is_private
    assert ledger.epsilon(DELTA) == math.inf
    assert ledger.accountant_description() == "non-private"
    assert ledger.check_within_budget() == math.inf  # target inf: a non-private run is within its "budget"
    finite = PrivacyLedger(target_epsilon=10.0, delta=DELTA, events=ledger.events)
    with pytest.raises(BudgetExceededError):
        finite.check_within_budget()


@pytest.mark.parametrize("accountant", ["rdp", "prv"])
def test_single_dpsgd_event_uses_its_own_accountant(accountant):
    ledger = PrivacyLedger(target_epsilon=10.0, delta=DELTA)
    ledger.add(sgd(steps=300, accountant=accountant))
    expected = dpsgd_epsilon(noise_multiplier=1.1, sample_rate=0.01, steps=300, delta=DELTA, accountant=accountant)
    assert ledger.epsilon(DELTA) == expected
    from importlib.metadata import version

    orders = ", orders 1.1-1024" if accountant == "rdp" else ""
    assert ledger.accountant_description() == f"{accountant} (opacus {version('opacus')}{orders}), poisson sampling"


def test_steps_grow_in_place():
    ledger = PrivacyLedger(target_epsilon=10.0, delta=DELTA)
    event_id = ledger.add(sgd(steps=0))
    assert ledger.epsilon(DELTA) == 0.0
    ledger.record_steps(event_id, 100)
    ledger.events[event_id].add_steps(50)
    assert ledger.events[event_id].steps == 150
    assert ledger.epsilon(DELTA) == dpsgd_epsilon(noise_multiplier=1.1, sample_rate=0.01, steps=150, delta=DELTA)
    gid = ledger.add(GaussianEvent(noise_multiplier=2.0))
    with pytest.raises(ValueError, match="not a DP-SGD"):
        ledger.record_steps(gid, 1)
    with pytest.raises(ValueError, match="no event with id"):
        ledger.record_steps(7, 1)
    with pytest.raises(ValueError, match="n must be"):
        ledger.record_steps(event_id, -1)


def test_zero_step_dpsgd_event_does_not_change_the_rule():
    ledger = PrivacyLedger(target_epsilon=10.0, delta=DELTA)
    ledger.add(GaussianEvent(noise_multiplier=5.0, count=2))
    ledger.add(sgd(steps=0))  # recorded before training started: nothing spent yet
    assert ledger.accountant_description() == "gdp (exact)"
    assert ledger.epsilon(DELTA) == gdp_epsilon(noise_multiplier=5.0, steps=2, delta=DELTA)


def test_mixed_events_use_rdp_and_cost_at_least_each_part():
    g = GaussianEvent(noise_multiplier=4.0, count=3)
    s = sgd()
    ledger = PrivacyLedger(target_epsilon=10.0, delta=DELTA)
    ledger.add(g)
    ledger.add(s)
    eps = ledger.epsilon(DELTA)
    assert "rdp" in ledger.accountant_description() and "mixed" in ledger.accountant_description()
    eps_sgd = dpsgd_epsilon(noise_multiplier=1.1, sample_rate=0.01, steps=200, delta=DELTA)
    eps_gauss = gdp_epsilon(noise_multiplier=4.0, steps=3, delta=DELTA)
    assert eps >= eps_sgd and eps >= eps_gauss
    # RDP composition is tighter than adding the two epsilons
    assert eps < eps_sgd + eps_gauss
    # and equals Opacus's RDP accountant on the combined history (a Gaussian release = sampling rate 1)
    from opacus.accountants import RDPAccountant

    from dpsyn.privacy.dpsgd import rdp_orders

    acc = RDPAccountant()
    acc.history = [(4.0, 1.0, 3), (1.1, 0.01, 200)]
    assert eps == pytest.approx(acc.get_epsilon(delta=DELTA, alphas=rdp_orders()), rel=1e-12)


def test_two_dpsgd_events_use_rdp_composition():
    ledger = PrivacyLedger(target_epsilon=10.0, delta=DELTA)
    ledger.add(sgd(steps=100, accountant="prv"))
    ledger.add(sgd(steps=100, accountant="prv"))
    # two identical runs of 100 steps = one of 200 steps, under RDP
    assert ledger.epsilon(DELTA) == pytest.approx(
        dpsgd_epsilon(noise_multiplier=1.1, sample_rate=0.01, steps=200, delta=DELTA, accountant="rdp"), rel=1e-12
    )
    assert ledger.accountant_description().startswith("rdp (opacus")


def test_check_within_budget():
    ledger = PrivacyLedger(target_epsilon=1.0, delta=DELTA)
    ledger.add(ApproxDPEvent(epsilon=1.0, delta=0.0))
    assert ledger.check_within_budget() == 1.0  # exactly at the target is fine
    ledger.add(ApproxDPEvent(epsilon=1e-10, delta=0.0))
    assert ledger.check_within_budget() == pytest.approx(1.0)  # within the 1e-9 relative slack
    ledger.add(ApproxDPEvent(epsilon=0.01, delta=0.0))
    with pytest.raises(BudgetExceededError, match="exceeded"):
        ledger.check_within_budget()
    assert issubclass(BudgetExceededError, RuntimeError)


# ---------------------------------------------------------------------------------------------------------------------
# serialisation
# ---------------------------------------------------------------------------------------------------------------------


def test_to_dict_from_dict_round_trip():
    ledger = mixed_ledger()
    data = ledger.to_dict()
    json.dumps(data, allow_nan=False)  # valid JSON, no NaN/Infinity literals
    back = PrivacyLedger.from_dict(json.loads(json.dumps(data)))
    assert back.epsilon(DELTA) == ledger.epsilon(DELTA)
    assert back.events == ledger.events
    assert back.target_epsilon == 5.0 and back.delta == DELTA
    assert data["epsilon_spent"] == ledger.epsilon(DELTA)
    assert data["accountant"] == ledger.accountant_description()
    assert [e["kind"] for e in data["events"]] == ["gaussian", "sampled_gaussian", "approx_dp"]
    assert data["events"][1]["accountant"] == "rdp" and data["events"][1]["sampling"] == "poisson"
    assert "opacus_version" in data


def test_save_load_round_trip(tmp_path):
    ledger = mixed_ledger()
    path = ledger.save(tmp_path / "privacy.json")
    assert path == tmp_path / "privacy.json"
    loaded = PrivacyLedger.load(path)
    assert loaded.events == ledger.events
    assert loaded.epsilon(DELTA) == ledger.epsilon(DELTA)
    assert PrivacyLedger.load(tmp_path).events == ledger.events  # a run directory works too
    assert [p.name for p in tmp_path.iterdir()] == ["privacy.json"]  # no temporary file left behind


def test_non_private_ledger_round_trips_infinity(tmp_path):
    ledger = PrivacyLedger(target_epsilon=math.inf, delta=DELTA)
    ledger.add(NonPrivateEvent(label="real"))
    ledger.save(tmp_path)
    raw = json.loads((tmp_path / "privacy.json").read_text())
    assert raw["target_epsilon"] == "inf" and raw["epsilon_spent"] == "inf"
    back = PrivacyLedger.load(tmp_path)
    assert back.target_epsilon == math.inf and back.epsilon(DELTA) == math.inf


def test_resumed_ledger_keeps_counting(tmp_path):
    ledger = PrivacyLedger(target_epsilon=10.0, delta=DELTA)
    event_id = ledger.add(sgd(steps=100))
    ledger.save(tmp_path)
    resumed = PrivacyLedger.load(tmp_path)
    resumed.record_steps(event_id, 100)
    assert resumed.epsilon(DELTA) == dpsgd_epsilon(noise_multiplier=1.1, sample_rate=0.01, steps=200, delta=DELTA)


def test_save_is_atomic_when_writing_fails(tmp_path, monkeypatch):
    old = PrivacyLedger(target_epsilon=1.0, delta=DELTA)
    old.add(GaussianEvent(noise_multiplier=20.0))
    old.save(tmp_path)
    before = (tmp_path / "privacy.json").read_text()

    def broken_fsync(fd):  # the new ledger is in the temporary file, then the disk fails before the rename
        raise OSError("No space left on device")

    monkeypatch.setattr(os, "fsync", broken_fsync)
    with pytest.raises(OSError, match="No space"):
        mixed_ledger().save(tmp_path / "privacy.json")
    monkeypatch.undo()
    assert (tmp_path / "privacy.json").read_text() == before  # the old ledger survives intact
    assert [p.name for p in tmp_path.iterdir()] == ["privacy.json"]  # and no partial temporary file remains


def test_save_is_atomic_when_replace_fails(tmp_path, monkeypatch):
    def broken_replace(src, dst):
        raise OSError("interrupted")

    monkeypatch.setattr(os, "replace", broken_replace)
    with pytest.raises(OSError, match="interrupted"):
        mixed_ledger().save(tmp_path / "privacy.json")
    assert list(tmp_path.iterdir()) == []  # no privacy.json, partial or otherwise


def test_from_dict_rejects_garbage():
    with pytest.raises(ValueError, match="not a dpsyn privacy ledger"):
        PrivacyLedger.from_dict({"events": []})
    data = mixed_ledger().to_dict()
    data["events"].append({"kind": "moments", "sigma": 1.0})
    with pytest.raises(ValueError, match="unknown privacy event kind 'moments'"):
        PrivacyLedger.from_dict(data)
    data = mixed_ledger().to_dict()
    data["events"][0]["sigma"] = 1.0
    with pytest.raises(ValueError, match="unexpected fields"):
        PrivacyLedger.from_dict(data)


# ---------------------------------------------------------------------------------------------------------------------
# validation
# ---------------------------------------------------------------------------------------------------------------------


def test_events_and_ledger_validate_their_input():
    with pytest.raises(ValueError, match="noise_multiplier"):
        GaussianEvent(noise_multiplier=0.0)
    with pytest.raises(ValueError, match="count"):
        GaussianEvent(noise_multiplier=1.0, count=-1)
    with pytest.raises(ValueError, match=r"'rdp', 'prv'"):
        sgd(accountant="gdp")
    with pytest.raises(ValueError, match="poisson"):
        SampledGaussianEvent(noise_multiplier=1.0, sample_rate=0.01, steps=1, accountant="rdp", sampling="shuffle")
    with pytest.raises(ValueError, match="sample_rate"):
        sgd(sample_rate=2.0)
    with pytest.raises(ValueError, match="NonPrivateEvent"):
        ApproxDPEvent(epsilon=math.inf, delta=0.0)
    with pytest.raises(ValueError, match="delta"):
        ApproxDPEvent(epsilon=1.0, delta=1.0)
    with pytest.raises(TypeError):
        GaussianEvent(2.0)  # keyword-only
    with pytest.raises(ValueError, match="target_epsilon"):
        PrivacyLedger(target_epsilon=0.0, delta=DELTA)
    with pytest.raises(ValueError, match="delta"):
        PrivacyLedger(target_epsilon=1.0, delta=0.0)
    with pytest.raises(ValueError, match="not a privacy event"):
        PrivacyLedger(target_epsilon=1.0, delta=DELTA).add({"kind": "gaussian"})
    assert GaussianEvent(noise_multiplier=2.0).kind == "gaussian"


# ---------------------------------------------------------------------------------------------------------------------
# the write-ahead journal (dpsyn.privacy.journal): no charge lost on resume
# ---------------------------------------------------------------------------------------------------------------------

FP = {"method": "m", "eps": 3.0}


def _journalled(tmp_path, fingerprint=FP) -> PrivacyLedger:
    ledger = PrivacyLedger(target_epsilon=3.0, delta=DELTA)
    ledger.attach_journal(tmp_path / "journal.json", fingerprint=fingerprint)
    return ledger


def _on_disk(tmp_path) -> list[dict]:
    return json.loads((tmp_path / "journal.json").read_text())["events"]


def test_every_recording_call_is_journalled_before_it_returns(tmp_path):
    import numpy as np

    from dpsyn.privacy import PATEEvent
    from dpsyn.privacy.pate import pate_smooth_release

    ledger = _journalled(tmp_path)
    assert _on_disk(tmp_path) == []
    sid = ledger.add(sgd(steps=0))
    assert _on_disk(tmp_path) == [e.to_dict() for e in ledger.events]
    ledger.record_steps(sid, 3)
    assert _on_disk(tmp_path)[0]["steps"] == 3
    pid = ledger.add(PATEEvent(sigma_threshold=100.0, sigma=50.0, threshold=10.0, bound="data_dependent"))
    votes = np.array([[18, 2], [10, 10]])
    ledger.record_pate_queries(pid, votes, np.array([True, False]))
    assert _on_disk(tmp_path)[1]["queries"] == 2 and _on_disk(tmp_path)[1]["answered"] == 1
    assert _on_disk(tmp_path) == [e.to_dict() for e in ledger.events]
    release = pate_smooth_release(votes=votes, sigma_threshold=100.0, sigma=50.0, threshold=10.0, answered=[True, False],
                                  order=3.0, beta=0.1, sigma_ss=2.0, delta=DELTA, generator=np.random.default_rng(0))
    ledger.record_pate_smooth_release(pid, release)
    assert _on_disk(tmp_path)[1]["smooth_release"] is not None
    text = (tmp_path / "journal.json").read_text()
    assert "\n " not in text  # compact: one line, no pretty-printing


def test_a_rerun_starts_from_the_journal_and_keeps_its_charges(tmp_path):
    first = _journalled(tmp_path)
    first.add(GaussianEvent(noise_multiplier=4.0, count=2, label="histogram"))
    eid = first.add(sgd(steps=0))
    first.record_steps(eid, 7)  # killed here: no checkpoint holds these steps
    rerun = _journalled(tmp_path)
    assert [e.to_dict() for e in rerun.events] == [e.to_dict() for e in first.events]
    assert rerun.epsilon() == pytest.approx(first.epsilon())
    # the rerun starts from scratch: its empty DP-SGD event continues the journal's, the new steps on top of the 7
    again = rerun.add(sgd(steps=0))
    assert again == 1 and rerun.events[1].steps == 7
    rerun.record_steps(again, 5)
    assert rerun.events[1].steps == 12 and _on_disk(tmp_path)[1]["steps"] == 12
    # a release that charges at creation is a new release: appended, charged on top of the journal's
    assert rerun.add(GaussianEvent(noise_multiplier=4.0, count=2, label="histogram")) == 2


def test_restore_keeps_the_larger_of_journal_and_checkpoint(tmp_path):
    """Journal larger than the checkpoint (rounds after it): the journal's charges and extra events are kept."""
    first = _journalled(tmp_path)
    eid = first.add(sgd(steps=0))
    first.record_steps(eid, 4)
    checkpoint = [e.to_dict() for e in first.events]  # saved at step 4
    first.record_steps(eid, 2)  # steps 5-6: charged, maybe logged, not checkpointed
    first.add(GaussianEvent(noise_multiplier=2.0, count=1, label="after the checkpoint"))
    rerun = _journalled(tmp_path)
    assert rerun.restore(checkpoint) == [0]
    assert [e.to_dict() for e in rerun.events] == [e.to_dict() for e in first.events]
    assert rerun.events[0].steps == 6 and len(rerun) == 2
    rerun.record_steps(0, 2)  # the rounds redone from the checkpoint's step: charged on top (both happened)
    assert rerun.events[0].steps == 8 and _on_disk(tmp_path)[0]["steps"] == 8


def test_restore_with_an_equal_journal_or_none_is_the_checkpoint(tmp_path):
    event = sgd(steps=5)
    checkpoint = [event.to_dict()]
    # no journal (a run directory of an earlier dpsyn, or the first attempt): the checkpoint, as before
    bare = _journalled(tmp_path / "a")
    assert bare.restore(checkpoint) == [0] and [e.to_dict() for e in bare.events] == checkpoint
    # a journal equal to the checkpoint: the same events, charged once
    first = _journalled(tmp_path / "b")
    first.add(sgd(steps=5))
    rerun = _journalled(tmp_path / "b")
    assert rerun.restore(checkpoint) == [0] and [e.to_dict() for e in rerun.events] == checkpoint
    # a checkpoint ahead of its journal (the journal lost writes): the checkpoint's charges
    behind = _journalled(tmp_path / "c")
    behind.add(sgd(steps=2))
    rerun = _journalled(tmp_path / "c")
    assert rerun.restore(checkpoint) == [0] and rerun.events[0].steps == 5


def test_restore_absorbs_a_recharged_prefix_and_refuses_another_runs_records(tmp_path):
    laplace = ApproxDPEvent(epsilon=0.1, delta=0.0, label="class proportions")
    first = _journalled(tmp_path)
    first.add(laplace)
    eid = first.add(sgd(steps=3))
    checkpoint = [e.to_dict() for e in first.events]
    first.record_steps(eid, 1)
    rerun = _journalled(tmp_path)
    rerun.add(ApproxDPEvent(epsilon=0.1, delta=0.0, label="class proportions"))  # reused from its file, recorded again
    assert rerun.restore(checkpoint) == [1]
    assert [e.to_dict() for e in rerun.events] == [e.to_dict() for e in first.events]  # charged once, 4 steps
    other = _journalled(tmp_path)
    with pytest.raises(ValueError, match="not a state of the journal"):
        other.restore([laplace.to_dict(), sgd(steps=3, noise_multiplier=2.0).to_dict()])


def test_a_journal_of_another_configuration_is_refused_at_the_first_recording(tmp_path):
    first = _journalled(tmp_path)
    first.add(sgd(steps=3))
    before = (tmp_path / "journal.json").read_text()
    other = _journalled(tmp_path, {"method": "m", "eps": 1.0})  # not refused yet: a method's own check comes first
    assert len(other) == 0
    with pytest.raises(ValueError, match=r"another configuration \(differing: eps\)"):
        other.add(sgd(steps=0))
    with pytest.raises(ValueError, match="another configuration"):
        other.restore([sgd(steps=3).to_dict()])
    assert (tmp_path / "journal.json").read_text() == before  # left as it is
    # a journal of another configuration that holds no event has nothing to lose: replaced
    empty = tmp_path / "empty"
    _journalled(empty)
    fresh = _journalled(empty, {"method": "other"})
    fresh.add(sgd(steps=1))
    assert json.loads((empty / "journal.json").read_text())["fingerprint"] == {"method": "other"}


def test_reusing_takes_up_an_equal_release_and_only_inside(tmp_path):
    first = _journalled(tmp_path)
    first.add(ApproxDPEvent(epsilon=0.1, delta=0.0, label="class proportions"))
    rerun = _journalled(tmp_path)
    with rerun.reusing():
        assert rerun.add(ApproxDPEvent(epsilon=0.1, delta=0.0, label="class proportions")) == 0
    assert len(rerun) == 1
    # outside, an equal release is another release (fresh noise): charged again
    assert rerun.add(ApproxDPEvent(epsilon=0.1, delta=0.0, label="class proportions")) == 1


def test_a_renyi_filter_of_an_interrupted_attempt_is_continued(tmp_path):
    import numpy as np

    from dpsyn.privacy import PATEEvent

    def filter_event(ledger):
        order, budget = ledger.renyi_filter(sigma_threshold=100.0, sigma=50.0)
        return PATEEvent(sigma_threshold=100.0, sigma=50.0, threshold=10.0, bound="renyi_filter", filter_order=order,
                         filter_budget=budget, max_queries=1000, label="votes")

    first = _journalled(tmp_path)
    pid = first.add(filter_event(first))
    first.record_pate_queries(pid, np.array([[18, 2]] * 10), np.ones(10, dtype=bool))
    rerun = _journalled(tmp_path)  # killed before its first checkpoint: the rerun starts from scratch
    again = rerun.add(filter_event(rerun))  # the same filter: its queries continue within the one budget
    assert again == 0 and len(rerun) == 1 and rerun.events[0].queries == 10
    assert rerun.epsilon() == pytest.approx(first.epsilon())


def test_absorb_journal_takes_up_charges_another_process_wrote(tmp_path):
    import pickle

    ledger = _journalled(tmp_path)
    eid = ledger.add(sgd(steps=0))
    rank0 = pickle.loads(pickle.dumps(ledger))  # a DDP rank's copy: it journals its steps
    rank0.record_steps(eid, 3)
    assert ledger.events[eid].steps == 0
    ledger.absorb_journal()
    assert ledger.events[eid].steps == 3 and _on_disk(tmp_path)[0]["steps"] == 3
    other = pickle.loads(pickle.dumps(ledger))
    other.detach_journal()
    other.record_steps(eid, 5)  # detached (a rank other than 0): not written
    assert _on_disk(tmp_path)[0]["steps"] == 3
