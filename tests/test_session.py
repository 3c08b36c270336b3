"""FitSession (dpsyn.methods.session): resume, checkpoints on schedule, charges that survive a crash, the stop rules,
the bar. A toy loop (one linear layer, a generator) stands in for a method: fast, no real method."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from dpsyn.methods import session
from dpsyn.methods.session import FitSession
from dpsyn.privacy import (
    PATEEvent,
    NonPrivateEvent,
    PrivacyLedger,
    SampledGaussianEvent,
)
from dpsyn.privacy.journal import JOURNAL_PATH
from tests.conftest import RecordingBar, run_context

FP = {"method": "toy"}


def _ledger(run_dir: Path | None = None, eps: float = 10.0) -> PrivacyLedger:
    """The run's ledger as dpsyn.cli.train makes it: journalled in the run directory."""
    ledger = PrivacyLedger(target_epsilon=eps, delta=1e-5)
    if run_dir is not None:
        ledger.attach_journal(run_dir / JOURNAL_PATH, fingerprint=FP)
    return ledger


def _event() -> SampledGaussianEvent:
    return SampledGaussianEvent(noise_multiplier=1.0, sample_rate=0.01, steps=0, accountant="rdp", sampling="poisson",
                                label="toy dp-sgd")


def _toy(run_dir: Path | None, ledger: PrivacyLedger, *, total: int = 6, every: int = 2, crash_at: int | None = None,
         seen: list[int] | None = None) -> tuple[torch.nn.Module, FitSession]:
    """A toy fit: a step draws from ``gen``, charges one DP-SGD step, moves the layer; killed in step ``crash_at``
    after its charge."""
    torch.manual_seed(0)
    layer, gen = torch.nn.Linear(2, 1), torch.Generator().manual_seed(0)
    ctx = run_context(run_dir=run_dir)
    with FitSession(ctx, ledger, "toy.pt", FP, state={"layer": layer, "gen": gen, "secret": None}, total=total,
                    desc="toy", every=every) as s:
        s.open(_event)
        for step in s.steps():
            noise = torch.randn(1, generator=gen)
            s.charge_steps(1)
            if step == crash_at:
                raise RuntimeError("killed")
            with torch.no_grad():
                layer.bias += noise
            if seen is not None:
                seen.append(step)
    return layer, s


def test_a_fresh_session_runs_every_step_and_records_its_event() -> None:
    ledger = _ledger()
    seen: list[int] = []
    _, s = _toy(None, ledger, seen=seen)
    assert seen == list(range(6)) and s.step == 6 and s.stopped_by == "steps" and not s.resumed
    (event,) = ledger.events
    assert event.steps == 6 and s.event is event


def test_a_checkpoint_is_written_on_schedule_and_resume_restores_step_and_state(tmp_path: Path) -> None:
    """every=2: a run killed in step 3 (0-based) leaves the checkpoint of step 2; the rerun starts there with the
    layer and the generator as they were then, and ends with the uninterrupted run's layer."""
    with pytest.raises(RuntimeError, match="killed"):
        _toy(tmp_path, _ledger(tmp_path), crash_at=3)
    saved = torch.load(tmp_path / "checkpoints" / "toy.pt", weights_only=False)
    assert saved["step"] == 2 and set(saved) >= {"layer", "gen", "secret", "ledger"} and saved["secret"] is None
    assert saved["ledger"]["events"][0]["steps"] == 2  # the ledger as it stood at step 2

    seen: list[int] = []
    layer, s = _toy(tmp_path, _ledger(tmp_path), seen=seen)
    assert s.resumed and seen == [2, 3, 4, 5] and s.step == 6
    reference, _ = _toy(None, _ledger())
    assert torch.equal(layer.bias, reference.bias)  # state and generator restored: the same steps as without a crash


def test_no_checkpoint_without_a_run_directory_or_with_every_zero(tmp_path: Path) -> None:
    _toy(tmp_path, _ledger(tmp_path), every=0)
    assert not (tmp_path / "checkpoints" / "toy.pt").exists()
    _toy(tmp_path, _ledger(tmp_path), every=4)
    assert torch.load(tmp_path / "checkpoints" / "toy.pt", weights_only=False)["step"] == 4


def test_a_charge_recorded_before_a_crash_is_in_the_resumed_ledger(tmp_path: Path) -> None:
    """Killed in step 3 after charging it: the checkpoint (step 2) holds 2 steps, the journal 4; the resumed ledger
    keeps the 4 and charges the 4 steps redone on top (8: both attempts' releases happened)."""
    with pytest.raises(RuntimeError, match="killed"):
        _toy(tmp_path, _ledger(tmp_path), crash_at=3)
    ledger = _ledger(tmp_path)  # a fresh process: its ledger starts from the journal
    _, s = _toy(tmp_path, ledger)
    (event,) = ledger.events
    assert event.steps == 4 + 4 and s.event is event


def test_the_planned_charges_stop_a_resumed_run_early(tmp_path: Path) -> None:
    """steps(charged=...): a run calibrated for ``total`` charged steps stops once the ledger charges them, an
    interrupted attempt's included (killed in step 3: 4 charged, resumed at 2, so two steps more)."""
    with pytest.raises(RuntimeError, match="killed"):
        _toy(tmp_path, _ledger(tmp_path), crash_at=3)
    ledger = _ledger(tmp_path)
    torch.manual_seed(0)
    layer, gen = torch.nn.Linear(2, 1), torch.Generator().manual_seed(0)
    seen = []
    with FitSession(run_context(run_dir=tmp_path), ledger, "toy.pt", FP, state={"layer": layer, "gen": gen},
                    total=6, desc="toy", every=2) as s:
        s.open(_event)
        for step in s.steps(charged=lambda: s.event.steps):
            s.charge_steps(1)
            seen.append(step)
    assert seen == [2, 3] and ledger.events[0].steps == 6 and s.stopped_by == "plan" and s.step == 4
    assert s.plan_spent(6, 6) and not s.plan_spent(5, 6)


def test_would_exceed_stops_before_the_query_batch_that_overspends() -> None:
    """The PATE rule: before a batch of queries, whether it (GNMax charged for all) would pass the target; nothing is
    recorded then and stopped_by says "budget"."""
    ledger = _ledger(eps=1.0)
    votes = torch.tensor([[5, 5]] * 10)  # every query at the threshold's edge: costly
    with FitSession(run_context(), ledger, "toy.pt", FP, total=10_000, desc="toy") as s:
        s.open(lambda: PATEEvent(sigma_threshold=40.0, sigma=40.0, threshold=1.0, bound="data_independent",
                                 label="toy votes"))
        for _ in s.steps():
            trial = s.event.with_queries(votes, torch.ones(10, dtype=torch.bool))
            if s.would_exceed(trial):
                break
            s.charge_queries(votes, torch.ones(10, dtype=torch.bool))
    assert s.stopped_by == "budget" and 0 < s.step < 10_000
    assert ledger.events[0].queries == 10 * s.step  # the refused batch was not recorded
    assert ledger.epsilon() <= 1.0 * (1 + 1e-9)
    assert ledger.would_exceed(ledger.events[0].with_queries(votes, torch.ones(10, dtype=torch.bool)), replacing=0)


def test_a_non_private_event_is_recorded_but_not_charged_and_a_resume_restores_it(tmp_path: Path) -> None:
    ledger = _ledger(tmp_path)
    with FitSession(run_context(run_dir=tmp_path), ledger, "toy.pt", FP, total=2, desc="toy") as s:
        assert s.open(NonPrivateEvent(label="toy without noise")) is None and s.event is None
        for _ in s.steps():
            with pytest.raises(ValueError, match="no event to charge"):
                s.charge_steps(1)
    ledger = PrivacyLedger(target_epsilon=10.0, delta=1e-5)
    with FitSession(run_context(run_dir=tmp_path), ledger, "toy.pt", FP, total=2, desc="toy") as s:
        made = []
        assert s.open(lambda: made.append(1) or NonPrivateEvent(label="x")) is None and s.resumed
        assert not made and [e.label for e in ledger.events] == ["toy without noise"]  # restored, not made again
        assert list(s.steps()) == []  # the saved step is the total: nothing left


def test_a_checkpoint_missing_an_object_is_refused_unless_the_run_had_finished(tmp_path: Path) -> None:
    from dpsyn.results.checkpoint import drop_keys

    layer = torch.nn.Linear(2, 1)
    ctx = run_context(run_dir=tmp_path)
    with FitSession(ctx, _ledger(), "toy.pt", FP, state={"layer": layer}, total=4, desc="toy", every=2) as s:
        s.open(_event)
        for step in s.steps():
            if step == 3:
                break  # the checkpoint stays at step 2
    assert drop_keys(tmp_path / "checkpoints" / "toy.pt", ("layer",))
    with pytest.raises(ValueError, match="holds no layer and stopped at step 2 of 4"):
        FitSession(ctx, _ledger(), "toy.pt", FP, state={"layer": layer}, total=4, desc="toy").__enter__()
    with FitSession(ctx, _ledger(), "toy.pt", FP, state={"layer": layer}, total=2, desc="toy") as s:
        assert s.step == 2  # finished: nothing to restore the layer for
    with pytest.raises(ValueError, match="another configuration"):
        FitSession(ctx, _ledger(), "toy.pt", {"method": "other"}, total=4, desc="toy").__enter__()


def test_save_writes_the_values_and_the_bar_counts_the_steps_and_closes(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(RecordingBar, "made", [])
    monkeypatch.setattr(session, "tqdm", RecordingBar)
    stage = {"v": "done"}
    with FitSession(run_context(run_dir=tmp_path), _ledger(), "toy.pt", FP, values=lambda: {"stage": stage["v"]},
                    total=3, desc="toy", every=1) as s:
        s.open()
        s.save()
        assert torch.load(tmp_path / "checkpoints" / "toy.pt", weights_only=False)["stage"] == "done"
        for step in s.steps():
            s.show(eps=f"{step:.1f}")
            if step == 1:
                s.save(stage="histogram")
                assert torch.load(tmp_path / "checkpoints" / "toy.pt", weights_only=False)["stage"] == "histogram"
                assert torch.load(tmp_path / "checkpoints" / "toy.pt", weights_only=False)["step"] == 1
    (bar,) = RecordingBar.made
    assert bar.desc == "toy" and bar.total == bar.n == 3 and bar.closed
    assert bar.postfixes == [{"eps": "0.0"}, {"eps": "1.0"}, {"eps": "2.0"}]
    saved = torch.load(tmp_path / "checkpoints" / "toy.pt", weights_only=False)
    assert saved["step"] == 3 and saved["stage"] == "done"
