"""The one checkpointer (dpsyn.results.checkpoint): step, state and ledger saved atomically and restored together;
a checkpoint made under another fingerprint or version is refused; teachers can be dropped by key."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from dpsyn.privacy import ApproxDPEvent, GaussianEvent, PrivacyLedger
from dpsyn.results.checkpoint import Checkpointer, drop_keys


def _ledger(*events) -> PrivacyLedger:
    return PrivacyLedger(target_epsilon=3.0, delta=1e-5, events=events)


def test_save_then_load_restores_step_state_and_ledger(tmp_path: Path) -> None:
    ckpt = Checkpointer.in_run(tmp_path, "m.pt", {"lr": 0.1, "eps": 3.0}, every=2)
    assert ckpt.path == tmp_path / "checkpoints" / "m.pt" and ckpt.load() is None
    ledger = _ledger(GaussianEvent(noise_multiplier=2.0, count=3, label="g"))
    ckpt.save(4, {"w": torch.arange(3.0), "note": "x"}, ledger)
    saved = Checkpointer.in_run(tmp_path, "m.pt", {"eps": 3.0, "lr": 0.1}, every=2).load()
    assert saved.step == 4 and saved.state["note"] == "x" and torch.equal(saved.state["w"], torch.arange(3.0))
    assert set(saved.state) == {"w", "note"}
    fresh = PrivacyLedger(target_epsilon=3.0, delta=1e-5)
    assert saved.restore_ledger(fresh) == [0]
    assert fresh.epsilon() == pytest.approx(ledger.epsilon()) and fresh.epsilon() > 0
    assert saved.restored_ledger().to_dict()["events"] == ledger.to_dict()["events"]


def test_another_fingerprint_or_version_is_refused(tmp_path: Path) -> None:
    Checkpointer.in_run(tmp_path, "m.pt", {"lr": 0.1, "seed": 0}).save(1, {}, None)
    with pytest.raises(ValueError, match=r"another configuration \(differing: lr\): resume with the same config"):
        Checkpointer.in_run(tmp_path, "m.pt", {"lr": 0.2, "seed": 0}).load()
    with pytest.raises(ValueError, match="version"):
        Checkpointer.in_run(tmp_path, "m.pt", {"lr": 0.1, "seed": 0}, version=2).load()


def test_off_without_run_dir_or_interval(tmp_path: Path) -> None:
    for ckpt in (Checkpointer.in_run(None, "m.pt", {}), Checkpointer.in_run(tmp_path, "m.pt", {}, every=0)):
        assert not ckpt.enabled and not ckpt.due(1) and ckpt.save(1, {}) is None and ckpt.load() is None
    assert not (tmp_path / "checkpoints").exists()
    ckpt = Checkpointer.in_run(tmp_path, "m.pt", {}, every=3)
    assert [s for s in range(1, 10) if ckpt.due(s)] == [3, 6, 9]


def test_restore_ledger_accepts_a_recharged_prefix_and_refuses_anything_else(tmp_path: Path) -> None:
    laplace = ApproxDPEvent(epsilon=0.1, delta=0.0, label="class proportions")
    gauss = GaussianEvent(noise_multiplier=2.0, count=1, label="g")
    ckpt = Checkpointer(tmp_path / "m.pt", {})
    ckpt.save(2, {}, _ledger(laplace, gauss))
    saved = ckpt.load()
    again = _ledger(ApproxDPEvent(epsilon=0.1, delta=0.0, label="class proportions"))
    assert saved.restore_ledger(again) == [1]  # the re-charged release is not charged twice
    assert [e.to_dict() for e in again.events] == [laplace.to_dict(), gauss.to_dict()]
    other = _ledger(ApproxDPEvent(epsilon=0.2, delta=0.0, label="class proportions"))
    with pytest.raises(ValueError, match="not the first"):
        saved.restore_ledger(other)
    bare = Checkpointer(tmp_path / "n.pt", {})
    bare.save(1, {})
    with pytest.raises(ValueError, match="holds no ledger"):
        bare.load().restore_ledger(_ledger())


def _run_ledger(run_dir: Path, fingerprint: dict | None = None) -> PrivacyLedger:
    """A run's ledger as dpsyn.task.run makes it: fresh, then journalled in the run directory."""
    from dpsyn.privacy.journal import JOURNAL_PATH

    ledger = _ledger()
    ledger.attach_journal(run_dir / JOURNAL_PATH, fingerprint=fingerprint or {"eps": 3.0})
    return ledger


def test_restore_ledger_merges_the_journal_of_the_interrupted_attempt(tmp_path: Path) -> None:
    """Checkpoint at round 2, rounds 3-4 journalled (charged, maybe logged) before the kill: the resumed ledger holds
    them, and the rounds redone from the checkpoint's step are charged on top."""
    ckpt = Checkpointer.in_run(tmp_path, "m.pt", {"lr": 0.1})
    attempt = _run_ledger(tmp_path)
    eid = attempt.add(GaussianEvent(noise_multiplier=2.0, count=0, label="rounds"))
    for round_ in range(1, 5):
        attempt.add(GaussianEvent(noise_multiplier=5.0, count=1, label=f"round {round_}"))
        if round_ == 2:
            ckpt.save(2, {}, attempt)
    journal = [e.to_dict() for e in attempt.events]  # SIGKILL here: privacy.json is not written
    saved = ckpt.load()
    assert len(saved.ledger["events"]) == 3

    resumed = _run_ledger(tmp_path)
    assert saved.restore_ledger(resumed) == [0, 1, 2]
    assert [e.to_dict() for e in resumed.events] == journal  # the journal's rounds 3-4 kept
    resumed.add(GaussianEvent(noise_multiplier=5.0, count=1, label="round 3"))  # redone: a second release
    assert resumed.epsilon() > attempt.epsilon() and eid == 0

    # equal: a journal that holds nothing beyond the checkpoint restores the checkpoint, charged once
    equal_dir = tmp_path / "equal"
    ckpt = Checkpointer.in_run(equal_dir, "m.pt", {"lr": 0.1})
    attempt = _run_ledger(equal_dir)
    attempt.add(GaussianEvent(noise_multiplier=5.0, count=1, label="round 1"))
    ckpt.save(1, {}, attempt)
    resumed = _run_ledger(equal_dir)
    assert ckpt.load().restore_ledger(resumed) == [0]
    assert [e.to_dict() for e in resumed.events] == [e.to_dict() for e in attempt.events]

    # missing: no journal (a run directory of an earlier dpsyn): the checkpoint's events, as before
    (equal_dir / "checkpoints" / "ledger.journal.json").unlink()
    resumed = _run_ledger(equal_dir)
    assert ckpt.load().restore_ledger(resumed) == [0] and len(resumed) == 1

    # another configuration's journal: refused, as the checkpointer refuses another configuration's checkpoint
    other = _run_ledger(tmp_path, {"eps": 1.0})
    with pytest.raises(ValueError, match=r"journalled under another configuration \(differing: eps\)"):
        Checkpointer.in_run(tmp_path, "m.pt", {"lr": 0.1}).load().restore_ledger(other)


def test_a_rerun_without_checkpoint_keeps_the_journal_and_another_config_is_refused(make_cfg, tmp_path: Path,
                                                                                   monkeypatch) -> None:
    """dpsyn.task.run: a run killed before its first checkpoint reruns from scratch with the journal's charges;
    a journal made under another config is refused before anything is charged."""
    from dpsyn.task import run
    from dpsyn.lit import gan
    from dpsyn.results.io import read_json

    over = ("method=dp_gan", "dataset=breast_cancer", "eps=1", "method.checkpoint_every=0", "method.batch_size=16",
            "trainer.limit_train_batches=6", "metrics.tabular.classifiers=[logreg]", "metrics.n_samples=40")
    original = gan.GANModule.training_step

    def crash_at_4(self, batch, idx):
        if self.dp_steps == 4:
            raise RuntimeError("killed")
        return original(self, batch, idx)

    with monkeypatch.context() as m:
        m.setattr(gan.GANModule, "training_step", crash_at_4)
        with pytest.raises(RuntimeError, match="killed"):
            run(make_cfg(*over), tmp_path / "run")
    journal = read_json(tmp_path / "run" / "checkpoints" / "ledger.journal.json")["events"]
    assert [e["kind"] for e in journal] == ["approx_dp", "sampled_gaussian"] and journal[1]["steps"] == 4
    steps_made = []
    monkeypatch.setattr(gan.GANModule, "training_step",
                        lambda self, b, i: (steps_made.append(self.dp_steps), original(self, b, i))[1])
    result = run(make_cfg(*over), tmp_path / "run")
    # the class proportions reused (charged once), the 4 lost steps kept: 2 more steps to the planned 6
    assert result["privacy_events"][:1] == journal[:1] and len(result["privacy_events"]) == 2
    assert result["privacy_events"][1]["steps"] == 6 and steps_made[:3] == [0, 1, 2]
    assert result["epsilon_spent"] <= 1.0 + 1e-9
    with pytest.raises(ValueError, match="fitted under another configuration"):
        run(make_cfg(*over, "method.lr_g=0.01"), tmp_path / "run")
    (tmp_path / "run" / "checkpoints" / "fitted.pt").unlink()
    with pytest.raises(ValueError, match="journalled under another configuration"):
        run(make_cfg(*over, "method.lr_g=0.01"), tmp_path / "run")


def test_reserved_keys_and_drop_keys(tmp_path: Path) -> None:
    ckpt = Checkpointer(tmp_path / "m.pt", {"a": 1})
    with pytest.raises(ValueError, match="reserved"):
        ckpt.save(1, {"step": 3})
    ckpt.save(5, {"G": 1, "teachers": 2, "opt_teachers": 3}, _ledger())
    assert drop_keys(tmp_path / "m.pt", ("teachers", "opt_teachers"))
    assert not drop_keys(tmp_path / "m.pt", ("teachers",)) and not drop_keys(tmp_path / "none.pt", ("x",))
    saved = ckpt.load()
    assert saved.step == 5 and saved.state == {"G": 1}


def test_a_kill_during_save_leaves_the_previous_checkpoint(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ckpt = Checkpointer(tmp_path / "m.pt", {})
    ckpt.save(1, {"v": 1}, _ledger())

    def boom(obj, f):  # the write dies half-way
        f.write(b"partial")
        raise KeyboardInterrupt

    monkeypatch.setattr(torch, "save", boom)
    with pytest.raises(KeyboardInterrupt):
        ckpt.save(2, {"v": 2}, _ledger())
    monkeypatch.undo()
    saved = ckpt.load()
    assert saved.step == 1 and saved.state == {"v": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["m.pt"]


def test_run_limits_resolve_device_and_step_caps_from_the_trainer_config(monkeypatch: pytest.MonkeyPatch) -> None:
    """RunContext's device and step limits come from conf/trainer (dpsyn.task.run fills them): hand-written loops
    read these, not Trainer settings."""
    from dpsyn.methods import RunContext
    from dpsyn.methods.base import run_limits

    debug = run_limits({"accelerator": "cpu", "max_epochs": 1, "limit_train_batches": 5})
    assert debug == {"device": "cpu", "max_steps": 5, "max_epochs": 1, "batch_limit": 5}
    assert run_limits({"limit_train_batches": 0.5, "max_epochs": None}) == {
        "device": "cpu", "max_steps": None, "max_epochs": None, "batch_limit": 0.5}  # a fraction caps no loop
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert run_limits({"accelerator": "gpu"})["device"] == "cuda"
    assert run_limits({"accelerator": "cpu"})["device"] == "cpu"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert run_limits({"accelerator": "auto"})["device"] == "cpu"
    ctx = RunContext(seed=0, deterministic_noise=True, accountant="rdp", kind="image", shape=(1, 2, 2), num_classes=2,
                     classes=["a", "b"], **debug)
    assert ctx.capped_steps(400) == 5 and ctx.capped_steps(3) == 3
    assert RunContext(seed=0, deterministic_noise=True, accountant="rdp", kind="image", shape=(1, 2, 2),
                      num_classes=2, classes=["a", "b"]).capped_steps(400) == 400


def test_methods_read_no_trainer_settings_outside_lightning() -> None:
    """Only the methods that build a Lightning Trainer read ctx.trainer; no method resolves a device itself."""
    import re

    from dpsyn.paths import REPO_DIR

    lightning = {"dp_gan.py", "dp_gan_ft.py", "privgan.py"}
    for path in sorted((REPO_DIR / "dpsyn" / "methods").rglob("*.py")):
        text = path.read_text()
        if path.name not in lightning:
            assert "ctx.trainer" not in text, path
        assert not re.search(r"^def _device\(|^def capped_steps\(", text, re.M), path  # RunContext has them


def test_lightning_dp_steps_refuses_another_calibration(tmp_path: Path) -> None:
    from dpsyn.results.checkpoint import lightning_dp_steps

    path = tmp_path / "last.ckpt"
    torch.save({"dpsyn": {"dp_steps": 7, "noise_multiplier": 1.2, "max_steps": 20}}, path)
    assert lightning_dp_steps(path, {"noise_multiplier": 1.2, "max_steps": 20, "generator": None}) == 7
    with pytest.raises(ValueError, match="was trained with noise multiplier 1.2 for 20 steps"):
        lightning_dp_steps(path, {"noise_multiplier": 1.3, "max_steps": 20})
    with pytest.raises(ValueError, match="resume with the same config"):
        lightning_dp_steps(path, None)  # a private checkpoint under a non-private run


# per method: a key the hand-picked fingerprint lists missed before (or a run fact), and a key free to differ
@pytest.mark.parametrize(("method", "key", "free_key"), [("g_pate", "lr_g", "checkpoint_every"),
                                                         ("pate_gan", "lr_g", "checkpoint_every"),
                                                         ("gs_wgan", "iterations", "checkpoint_every"),
                                                         ("pe", "public_pool", "checkpoint")])
def test_resume_fingerprint_holds_every_typed_key_but_the_free_ones(method: str, key: str, free_key: str,
                                                                   make_ctx) -> None:
    """A training checkpoint is resumed only under the same typed method config: every field of the schema counts
    (a hyperparameter added later cannot be forgotten), only Method.resume_free_keys may differ."""
    import dataclasses

    from omegaconf import open_dict

    from dpsyn.config import METHOD_SCHEMAS
    from dpsyn.methods import METHODS, PrivacyBudget
    from tests.conftest import compose_cfg

    cls = METHODS.get(method)
    cfg = compose_cfg([f"method={method}"]).method
    budget = PrivacyBudget(epsilon=1.0, delta=1e-5)
    fp = cls(cfg, make_ctx()).resume_fingerprint(budget)
    fields = {f.name for f in dataclasses.fields(METHOD_SCHEMAS[method])}
    assert set(fp["method"]) == fields - set(cls.resume_free_keys)
    assert free_key in cls.resume_free_keys and (fp["eps"], fp["delta"]) == (1.0, 1e-5)

    changed = cfg.copy()
    with open_dict(changed):
        changed[key] = (cfg[key] or 0) * 2 + 100
    assert cls(changed, make_ctx()).resume_fingerprint(budget) != fp
    free = cfg.copy()
    with open_dict(free):
        free[free_key] = not cfg[free_key] if isinstance(cfg[free_key], bool) else int(cfg[free_key]) + 7
    assert cls(free, make_ctx()).resume_fingerprint(budget) == fp
    assert cls(cfg, make_ctx()).resume_fingerprint(PrivacyBudget(epsilon=2.0, delta=1e-5)) != fp
