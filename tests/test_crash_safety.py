"""Crash safety (issue 15, part 3): every method that spends privacy is killed with SIGKILL after its first
checkpoint or release (and after fit, while sampling or scoring), rerun in the same run directory, and must end with
every release in its ledger exactly once (the events of an uninterrupted run), epsilon <= the target and a complete
result.json; a rerun after fit restores ``checkpoints/fitted.pt`` and neither fits nor charges again.

The subprocess cases pay ~12 s of imports per process: one fast case runs in ``make test``, the rest are slow.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.crash_harness import FITTED, KillPoint, check_crash_safe, kill_and_rerun
from tests.tiny import IMAGE_METRICS, SHOES, TABLE_METRICS, TINY_PUBLIC

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
FAST_CASE = "g_pate"
# methods that release nothing private with noise: a rerun fits again (their ledger is non-private or empty)
SPEND_NOTHING = {"real", "privgan", "gan", "public_uniform", "icgan_nonprivate"}


def _reference_events(make_cfg, overrides: tuple[str, ...], run_dir: Path) -> list[dict]:
    """The ledger of an uninterrupted run of the same config (in this process: no extra imports to pay)."""
    from dpsyn.cli.train import run

    return run(make_cfg(*BASE, *overrides), run_dir)["privacy_events"]


def _crash_case(name: str, make_cfg, cli_env: dict[str, str], tmp_path: Path) -> None:
    overrides, points = CASES[name]
    reference = _reference_events(make_cfg, overrides, tmp_path / "reference")
    crash = kill_and_rerun([*BASE, *overrides], tmp_path / "crashed", cli_env, list(points))
    n_samples = int(next(o for o in overrides if o.startswith("metrics.n_samples=")).split("=")[1])
    check_crash_safe(crash, eps=1.0, n_samples=n_samples, reference_events=reference)


def test_every_private_method_is_covered() -> None:
    """Each method that spends privacy keeps a fitted state and has a kill-and-rerun case; the others spend nothing."""
    from dpsyn.methods import METHODS

    names = set(METHODS.names())
    covered = {CASES_METHOD.get(case, case) for case in CASES}
    for name in names:
        cls = METHODS.get(name)
        if name in SPEND_NOTHING:  # fitted again by a rerun: harmless, they release nothing with noise
            assert cls.fitted_attrs is None and name not in covered
        else:
            assert cls.fitted_attrs is not None, f"{name} spends privacy but keeps no fitted state"
            assert name in covered, f"{name} has no kill-and-rerun case"


def test_kill_and_rerun_fast_case(make_cfg, cli_env: dict[str, str], tmp_path: Path) -> None:
    """``make test``'s one subprocess case: G-PATE killed after its first checkpoint, then after fit."""
    _crash_case(FAST_CASE, make_cfg, cli_env, tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(set(CASES) - {FAST_CASE}))
def test_kill_and_rerun(name: str, make_cfg, cli_env: dict[str, str], tmp_path: Path) -> None:
    _crash_case(name, make_cfg, cli_env, tmp_path)


# ---- the fitted state, in process (fast) ------------------------------------------------------------------------


def test_fitted_state_is_restored_without_fitting_or_charging_again(make_cfg, tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    import dpsyn.metrics as metrics
    from dpsyn.cli.train import FITTED_STATE, run
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
    from dpsyn.cli.train import FITTED_STATE, run

    result = run(make_cfg("method=real", "metrics.names.image=[]", "metrics.n_samples=60"), tmp_path / "run")
    assert result["fit_restored"] is False and not (tmp_path / "run" / FITTED_STATE).exists()
