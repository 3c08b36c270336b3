"""Crash safety (issue 15, part 3): every method that spends privacy is killed with SIGKILL after its first
checkpoint or release (and after fit, while sampling or scoring), rerun in the same run directory, and must end with
every release in its ledger exactly once (the events of an uninterrupted run), epsilon <= the target and a complete
result.json; a rerun after fit restores ``checkpoints/fitted.pt`` and neither fits nor charges again.

No charge lost on resume (issue 59): a process is killed after it charged (and may have logged) rounds that its last
checkpoint does not hold, on its write-ahead journal's Nth version; the rerun keeps those charges on top of the
rounds it redoes. For a method that the step cap stops (G-PATE here, its budget not binding), the final ledger
holds exactly the lost rounds' queries more than an uninterrupted run; for a method whose noise is calibrated for a
fixed number of steps (DP-GAN, PE), training stops when the charged steps reach the planned ones: the same charges
as an uninterrupted run, fewer updates.

The subprocess cases pay ~5-12 s of imports per process: one fast case runs in ``make test``, the rest are slow.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.crash_harness import (
    FITTED,
    JOURNAL,
    LIGHTNING,
    CrashRun,
    KillPoint,
    charge,
    check_crash_safe,
    holds_every_charge,
    kill_and_rerun,
    lost_charges,
)
from tests.tiny import IMAGE_METRICS, SHOES, TABLE_METRICS, TINY, TINY_PUBLIC

BASE = ("trainer=debug", "logger=none", "eps=1", "privacy.deterministic_noise=true",
        "trainer.enable_progress_bar=false")
G_PATE = ("method=g_pate", "dataset=fmnist", "method.teachers=20", "method.batch_size=4", "method.projection_dim=2",
          "method.sigma_threshold=100", "method.sigma=50", "method.threshold=10", "method.teacher_arch=conv",
          "method.ndf=2", "method.z_dim=8", "method.ngf=4", "method.checkpoint_every=1", *IMAGE_METRICS)
PATE_GAN = ("method=pate_gan", "method.teachers=10", "method.batch_size=4", "method.teacher_batch=2",
            "method.sigma_threshold=100", "method.sigma=50", "method.threshold=5", "method.ndf=2", "method.student_ndf=4",
            "method.z_dim=8", "method.ngf=4", "method.teacher_chunk=null", "method.checkpoint_every=1")
AFTER_FIT = KillPoint(FITTED)  # killed while sampling or scoring
BEFORE_RELEASE = KillPoint("config.yaml")  # the run's first write: before any data is read
# G-PATE stopped by its step cap (40 rounds of b*k = 8 queries), not by its budget (data-independent bound, wide
# noise: eps ~0.1 of 1 with the lost rounds), so that every lost round shows in the final queries. A tiny round
# takes 10-60 ms: the kills are points of the journal's content, with many rounds of slack before the next checkpoint
# (the harness polls every 20 ms and a kill may land a few rounds late)
G_PATE_CAPPED = ("method=g_pate", "dataset=fmnist", "method.teachers=20", "method.batch_size=4",
                 "method.projection_dim=2", "method.sigma_threshold=2000", "method.sigma=1000", "method.threshold=10",
                 "method.bound=data_independent", "method.teacher_arch=conv", "method.ndf=2", "method.z_dim=8",
                 "method.ngf=4", "trainer.limit_train_batches=40", *IMAGE_METRICS)
G_PATE_ROUND = 8  # queries a round: batch_size * projection_dim


def after_rounds(rounds: int) -> KillPoint:
    """Killed once the journal charges ``rounds`` G-PATE rounds' queries (the interrupted attempts' included)."""
    return KillPoint(JOURNAL, charged=("pate", "queries", rounds * G_PATE_ROUND))



# method case -> (overrides, kill points in turn: one process killed at each, then a rerun to completion)
CASES: dict[str, tuple[tuple[str, ...], tuple[KillPoint, ...]]] = {
    "dp_gan": (("method=dp_gan", "method.checkpoint_every=2", *IMAGE_METRICS),
               (KillPoint("checkpoints/last.ckpt"), AFTER_FIT)),
    "dp_gan_table": (("method=dp_gan", "dataset=breast_cancer", "method.checkpoint_every=2", *TABLE_METRICS),
                     (KillPoint("checkpoints/class_proportions.json"), AFTER_FIT)),
    "dp_gan_ft": (("method=dp_gan_ft", *SHOES, "method.pretrain_steps=10", "method.max_public=400",
                   "method.checkpoint_every=2"), (KillPoint("checkpoints/last.ckpt"), AFTER_FIT)),
    "dp_gan_mi": (("method=dp_gan_mi", *SHOES, "method.checkpoint_every=2"),
                  (KillPoint("checkpoints/last.ckpt"), AFTER_FIT)),
    "dp_dre": (("method=dp_dre", *SHOES), (BEFORE_RELEASE, AFTER_FIT)),
    "dp_mge": (("method=dp_mge", *SHOES), (BEFORE_RELEASE, AFTER_FIT)),
    "dp_mepf": (("method=dp_mepf", *SHOES, "method.steps=3", "method.batch_size=12"), (BEFORE_RELEASE, AFTER_FIT)),
    # pe.pt: version 1 after RANDOM_API, version 2 right after the first histogram (the first release)
    "pe": (("method=pe", "dataset=fmnist_shoes", *TINY_PUBLIC, "method.population=60", "method.degrees=[0.6,0.4,0.3]",
            "method.lookahead=1", "method.threshold=1.0", "dataset.n_private=300", "metrics.n_real=300",
            *IMAGE_METRICS), (KillPoint("checkpoints/pe.pt", 2), AFTER_FIT)),
    "g_pate": (G_PATE, (KillPoint("checkpoints/g_pate.pt"), AFTER_FIT)),
    "g_pate_table": (("method=g_pate", "dataset=breast_cancer", "method.teachers=20", "method.batch_size=4",
                      "method.projection_dim=2", "method.sigma_threshold=100", "method.sigma=50", "method.threshold=10",
                      "method.d_hidden=[8]", "method.g_hidden=[8]", "method.z_dim=4", "method.checkpoint_every=1",
                      *TABLE_METRICS), (KillPoint("checkpoints/class_proportions.json"), AFTER_FIT)),
    "pate_gan": ((*PATE_GAN, *IMAGE_METRICS), (KillPoint("checkpoints/pate_gan.pt"), AFTER_FIT)),
    "pate_gan_table": ((*PATE_GAN, "dataset=breast_cancer", *TABLE_METRICS),
                       (KillPoint("checkpoints/class_proportions.json"), AFTER_FIT)),
    "gs_wgan": (("method=gs_wgan", "method.critics=20", "method.batch_size=4", "method.critic_steps=1",
                 "method.ndf=2", "method.ngf=4", "method.z_dim=8", "method.iterations=6", "method.checkpoint_every=1",
                 *IMAGE_METRICS), (KillPoint("checkpoints/gs_wgan.pt"), AFTER_FIT)),
}
CASES_METHOD = {"dp_gan_table": "dp_gan", "g_pate_table": "g_pate", "pate_gan_table": "pate_gan"}


def spends_nothing(name: str) -> bool:
    """A method that releases nothing private with noise (a reference, or one that reads no private row): a rerun
    fits again, harmlessly."""
    from dpsyn.methods import METHODS

    cls = METHODS.get(name)
    return cls.reference or not cls.output_depends_on_eps()


def crash_case(name: str) -> tuple[tuple[str, ...], tuple[KillPoint, ...]]:
    """The kill-and-rerun case of a method or case ``name``: the hand-made one above, else the method's own tiny run
    (its class's ``tiny``, checkpointing every step where its schema has ``checkpoint_every``) killed once its first
    training checkpoint exists (the first file of its ``unreleased_checkpoint_keys``) and once after fit. A method
    with no training checkpoint is killed after fit only: it has nothing to resume, and a kill timed before its first
    release can land after it (a fast fit ends within the harness's polling interval)."""
    from dpsyn.config import METHOD_SCHEMAS
    from dpsyn.methods import METHODS

    if name in CASES:
        return CASES[name]
    cls = METHODS.get(name)
    every = ("method.checkpoint_every=1",) if "checkpoint_every" in METHOD_SCHEMAS[name].__dataclass_fields__ else ()
    files = list(cls.unreleased_checkpoint_keys)
    points = (KillPoint(f"checkpoints/{files[0]}"), AFTER_FIT) if files else (AFTER_FIT,)
    return (*cls.tiny, *every), points


def crash_cases() -> list[str]:
    """Every case the suite runs: the hand-made ones and a default one for each registered method that spends
    privacy and has none (a new method is covered without a line here)."""
    from dpsyn.methods import METHODS

    covered = {CASES_METHOD.get(case, case) for case in CASES}
    return sorted({*CASES, *(m for m in METHODS.names() if m not in covered and not spends_nothing(m))})
# the journal cases (issue 59): killed after rounds that the last checkpoint does not hold
JOURNAL_CASES: dict[str, tuple[tuple[str, ...], tuple[KillPoint, ...]]] = {
    # resumed from the checkpoint at round 20 with rounds 21-24 (or a few more) lost, then killed after fit
    "g_pate_lost_rounds": ((*G_PATE_CAPPED, "method.checkpoint_every=20"), (after_rounds(24), AFTER_FIT)),
    # killed again, some 8 rounds after the resume (before attempt 2's next checkpoint, at round 40)
    "g_pate_killed_twice": ((*G_PATE_CAPPED, "method.checkpoint_every=20"), (after_rounds(24), after_rounds(34))),
    # killed before its first checkpoint: the rerun starts from scratch and keeps the 10-odd rounds' charges
    "g_pate_before_first_checkpoint": ((*G_PATE_CAPPED, "method.checkpoint_every=1000"), (after_rounds(10),)),
}
FAST_CASE = "g_pate_lost_rounds"


def _reference_events(make_cfg, overrides: tuple[str, ...], run_dir: Path) -> list[dict]:
    """The ledger of an uninterrupted run of the same config (in this process: no extra imports to pay)."""
    from dpsyn.task import run

    return run(make_cfg(*BASE, *overrides), run_dir)["privacy_events"]


def check_kill_and_rerun(name: str, make_cfg, cli_env: dict[str, str], tmp_path: Path) -> None:
    """The crash-safety harness: :func:`crash_case` ``name`` killed at each of its points, rerun to completion, and
    checked against an uninterrupted run's ledger."""
    overrides, points = crash_case(name)
    reference = _reference_events(make_cfg, overrides, tmp_path / "reference")
    crash = kill_and_rerun([*BASE, *overrides], tmp_path / "crashed", cli_env, list(points))
    n_samples = int(next(o for o in overrides if o.startswith("metrics.n_samples=")).split("=")[1])
    check_crash_safe(crash, eps=1.0, n_samples=n_samples, reference_events=reference)


def test_every_private_method_is_covered() -> None:
    """Each method that spends privacy keeps a fitted state and has a kill-and-rerun case; the others spend nothing."""
    from dpsyn.methods import METHODS

    names = set(METHODS.names())
    covered = {CASES_METHOD.get(case, case) for case in crash_cases()}
    for name in names:
        cls = METHODS.get(name)
        if spends_nothing(name):  # fitted again by a rerun: harmless, they release nothing with noise
            assert cls.fitted_attrs is None and name not in covered
        else:
            assert cls.fitted_attrs is not None, f"{name} spends privacy but keeps no fitted state"
            assert name in covered, f"{name} has no kill-and-rerun case"


@pytest.mark.slow
@pytest.mark.parametrize("name", crash_cases())
def test_kill_and_rerun(name: str, make_cfg, cli_env: dict[str, str], tmp_path: Path) -> None:
    check_kill_and_rerun(name, make_cfg, cli_env, tmp_path)


# ---- no charge lost on resume (issue 59) -------------------------------------------------------------------------


def _queries(events: list[dict]) -> int:
    return charge(events, "pate", "queries")


def _journal_case(name: str, make_cfg, cli_env: dict[str, str], tmp_path: Path) -> CrashRun:
    """Kill G-PATE after rounds its last checkpoint misses, rerun, and require the lost rounds' queries on top."""
    overrides, points = JOURNAL_CASES[name]
    reference = _reference_events(make_cfg, overrides, tmp_path / "reference")
    crash = kill_and_rerun([*BASE, *overrides], tmp_path / "crashed", cli_env, list(points))
    check_crash_safe(crash, eps=1.0, n_samples=60)
    # the last kill that a rerun resumed from (a kill after fit is restored, not resumed)
    last = [k for k in crash.killed if k.point.path != FITTED][-1]
    assert last.journal_events is not None and lost_charges(last), (
        f"{name}: the kill at {last.point} left no round beyond the checkpoint (the test would prove nothing)")
    step = last.checkpoint_steps.get("g_pate.pt", 0)
    # the rerun resumed at `step` with every charge of the journal, and redid the rounds from there: the final
    # ledger holds, beyond an uninterrupted run's, what the journal held beyond `step` rounds
    extra = _queries(last.journal_events) - G_PATE_ROUND * step
    assert extra > 0
    assert _queries(crash.ledger["events"]) == _queries(reference) + extra, (
        "the final ledger must hold the uninterrupted run's queries plus the lost rounds' "
        f"({_queries(reference)} + {extra}), it holds {_queries(crash.ledger['events'])}")
    for killed in crash.killed:  # every journal left by a kill: its charges are all in the final ledger
        assert killed.journal_events is None or _queries(crash.ledger["events"]) >= _queries(killed.journal_events)
    return crash


def test_kill_after_a_charged_round_keeps_its_charge_fast_case(make_cfg, cli_env: dict[str, str],
                                                               tmp_path: Path) -> None:
    """``make test``'s subprocess case: G-PATE killed after round 24 with its checkpoint at round 20 (rounds 21-24
    charged, maybe logged, not checkpointed), then killed after fit; the finished ledger holds those rounds twice
    (lost and redone), epsilon within the target, and the kill after fit is restored without a charge more."""
    crash = _journal_case(FAST_CASE, make_cfg, cli_env, tmp_path)
    logs = sorted(crash.run_dir.parent.glob(f"{crash.run_dir.name}.killed*.log"))
    assert len(logs) == 2 and "stay charged (from the journal)" in logs[1].read_text()  # the resume said so
    assert crash.result["fit_restored"] is True


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(set(JOURNAL_CASES) - {FAST_CASE}))
def test_kill_after_a_charged_round_keeps_its_charge(name: str, make_cfg, cli_env: dict[str, str],
                                                     tmp_path: Path) -> None:
    _journal_case(name, make_cfg, cli_env, tmp_path)


@pytest.mark.slow
def test_a_fixed_calibration_dp_sgd_run_stops_at_its_planned_charged_steps(make_cfg, cli_env: dict[str, str],
                                                                           tmp_path: Path) -> None:
    """DP-GAN's noise is calibrated for 40 steps: killed after step ~13 with its checkpoint at step 10, the rerun keeps
    the lost steps' charges and makes fewer updates, so that the charged steps end at the planned 40 (epsilon as an
    uninterrupted run's, within the target) and says so."""
    import torch

    overrides = ("method=dp_gan", "method.checkpoint_every=10", "trainer.limit_train_batches=40", *IMAGE_METRICS)
    reference = _reference_events(make_cfg, overrides, tmp_path / "reference")
    assert [e["steps"] for e in reference] == [40]
    # killed once step 13 is charged (each step is charged before it is made); the checkpoint is at step 10
    point = KillPoint(JOURNAL, charged=("sampled_gaussian", "steps", 13))
    crash = kill_and_rerun([*BASE, *overrides], tmp_path / "crashed", cli_env, [point])
    check_crash_safe(crash, eps=1.0, n_samples=60)
    (killed,) = crash.killed
    lost = charge(killed.journal_events, "sampled_gaussian", "steps") - (killed.lightning_steps or 0)
    assert killed.lightning_steps == 10 and lost >= 3, (killed.lightning_steps, killed.journal_events)
    assert crash.ledger["events"] == reference  # the planned steps charged, no more
    assert holds_every_charge(crash.ledger["events"], killed.journal_events)
    assert f"{lost} DP-SGD step(s) of an interrupted attempt" in crash.output
    # the model's own steps: the checkpoint's 10, then only as many as the planned 40 leave after the lost ones
    final = torch.load(crash.run_dir / LIGHTNING, map_location="cpu", weights_only=False)["dpsyn"]
    assert final["dp_steps"] == 40 - lost


# ---- fixed calibration and a reused release, in process (slow) ---------------------------------------------------


@pytest.mark.slow
def test_pe_keeps_a_lost_histogram_and_stops_at_its_planned_releases(make_cfg, tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """PE killed after charging its second histogram, before checkpointing it: the rerun keeps that histogram's
    charge, redoes the iteration, and stops when the charged histograms reach the 3 its sigma was calibrated for
    (two iterations instead of three, epsilon at the target)."""
    import dpsyn.methods.pe.method as pe
    from dpsyn.task import run

    cfg = make_cfg(*BASE, *TINY["pe"])
    run_dir = tmp_path / "run"
    real = pe.dp_nn_histogram
    calls = {"n": 0}

    def killed_at_the_second(*a, **k):
        calls["n"] += 1
        if calls["n"] == 2:
            raise KeyboardInterrupt("killed after the charge of histogram 2, before its checkpoint")
        return real(*a, **k)

    with monkeypatch.context() as m:
        m.setattr(pe, "dp_nn_histogram", killed_at_the_second)
        with pytest.raises(KeyboardInterrupt):
            run(cfg, run_dir)
    from dpsyn.results.io import read_json

    journal = read_json(run_dir / JOURNAL)["events"]
    assert [e["label"].split(":")[0] for e in journal] == ["pe histogram 1/3", "pe histogram 2/3"]
    result = run(cfg, run_dir)
    labels = [e["label"].split(":")[0] for e in result["privacy_events"]]
    assert labels == ["pe histogram 1/3", "pe histogram 2/3", "pe histogram 2/3"], labels  # lost and redone
    assert holds_every_charge(result["privacy_events"], journal)
    assert result["epsilon_spent"] <= 1.0 * (1 + 1e-9)
    assert result["epsilon_spent"] == pytest.approx(run(cfg, tmp_path / "reference")["epsilon_spent"])
    assert [h["iteration"] for h in result["sample_provenance"]["history"]] == [0, 1, 2]  # not 3: stopped


@pytest.mark.slow
def test_dp_mepf_reuses_its_release_after_a_crash_in_the_generator_training(make_cfg, tmp_path: Path,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """A crash while the generator trains: the rerun reuses the saved release (charged once) instead of releasing
    again, which would spend the budget twice and be refused."""
    import dpsyn.methods.dp_mepf as mepf
    from dpsyn.task import run

    cfg = make_cfg(*BASE, *TINY["dp_mepf"])
    run_dir = tmp_path / "run"
    with monkeypatch.context() as m:
        def crash(*a, **k):
            raise KeyboardInterrupt("killed while the generator trains")

        m.setattr(mepf.DPMEPF, "_fit_generator", crash)
        with pytest.raises(KeyboardInterrupt):
            run(cfg, run_dir)
    assert (run_dir / "checkpoints" / mepf.RELEASE_CHECKPOINT).is_file()
    reference = run(cfg, tmp_path / "reference")

    def no_second_release(*a, **k):
        raise AssertionError("released again")

    monkeypatch.setattr(mepf.DPMEPF, "_release", no_second_release)
    result = run(cfg, run_dir)
    assert result["privacy_events"] == reference["privacy_events"]
    assert result["epsilon_spent"] == pytest.approx(reference["epsilon_spent"]) and result["epsilon_spent"] <= 1.0


# ---- the fitted state, in process (fast) ------------------------------------------------------------------------


def test_fitted_state_is_restored_without_fitting_or_charging_again(make_cfg, tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    import dpsyn.metrics as metrics
    from dpsyn.task import FITTED_STATE, run
    from dpsyn.methods import METHODS

    cfg = make_cfg(*BASE, *G_PATE)
    run_dir = tmp_path / "run"
    with monkeypatch.context() as m:
        def killed(*a, **k):
            raise KeyboardInterrupt("killed while scoring")

        m.setattr(metrics, "evaluate", killed)
        with pytest.raises(KeyboardInterrupt):
            run(cfg, run_dir)
    assert (run_dir / FITTED_STATE).is_file() and not (run_dir / "result.json").exists()
    first_samples = np.load(run_dir / "samples.npz")["x"]
    from dpsyn.results.io import read_json

    spent = read_json(run_dir / "privacy.json")["events"]

    def refit(*a, **k):
        raise AssertionError("fitted again")

    monkeypatch.setattr(METHODS.get("g_pate"), "fit", refit)
    result = run(cfg, run_dir)
    assert result["fit_restored"] is True and result["privacy_events"] == spent
    assert np.array_equal(np.load(run_dir / "samples.npz")["x"], first_samples)  # the same fitted generator
    # another config is refused, before anything is spent
    with pytest.raises(ValueError, match="fitted under another configuration.*eps"):
        run(make_cfg(*BASE, *G_PATE, "eps=2"), run_dir)
    # sampling settings are post-processing: not part of the fingerprint
    assert run(make_cfg(*BASE, *G_PATE, "metrics.n_samples=40"), run_dir)["fit_restored"] is True


def test_a_method_without_fitted_state_writes_none(make_cfg, tmp_path: Path) -> None:
    from dpsyn.task import FITTED_STATE, run

    result = run(make_cfg("method=real", "metrics.names.image=[]", "metrics.n_samples=60"), tmp_path / "run")
    assert result["fit_restored"] is False and not (tmp_path / "run" / FITTED_STATE).exists()
