"""End to end: a run writes config.yaml, privacy.json, samples.npz, samples.png and, last, result.json."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from dpsyn.cli.train import format_summary
from dpsyn.task import run
from dpsyn.paths import REPO_DIR
from dpsyn.privacy import BudgetExceededError, PrivacyLedger
from dpsyn.results.io import read_json
from dpsyn.results.protocol import protocol_id
from tests.tiny import IMAGE_METRICS


def _outputs(run_dir: Path) -> dict:
    for name in ("config.yaml", "privacy.json", "samples.npz", "samples.png", "result.json"):
        assert (run_dir / name).is_file(), name
    return read_json(run_dir / "result.json")


def test_dp_gan_run_spends_at_most_its_target(make_cfg, tmp_path: Path) -> None:
    cfg = make_cfg("method=dp_gan", "dataset=fmnist", "eps=1")
    result = run(cfg, tmp_path / "run")
    on_disk = _outputs(tmp_path / "run")
    assert on_disk["epsilon_spent"] == pytest.approx(result["epsilon_spent"])
    assert 0 < result["epsilon_spent"] <= 1.0
    assert "rdp" in result["accountant"] and "poisson" in result["accountant"]
    (event,) = result["privacy_events"]
    assert event["kind"] == "sampled_gaussian" and event["steps"] == 5  # trainer=debug: 5 steps
    assert event["sample_rate"] == pytest.approx(128 / 60000)
    assert result["metrics"]["fd_fmnist"] > 0
    assert 0 <= result["metrics"]["acc"] <= 1
    assert result["non_private_reference"] is False
    # what measured acc: the id names the classifier and its training count, the one the classifier really had
    assert on_disk["protocol"] == protocol_id(cfg) and on_disk["protocol_name"] == "dpsyn"
    n_train = result["metric_info"]["acc"]["n_train"]
    assert on_disk["protocol"] == f"dpsyn:cnn_bn,x1,1ep,cosine,n{n_train}" and n_train == 540  # trainer=debug: 600, 1 epoch
    ledger = PrivacyLedger.load(tmp_path / "run" / "privacy.json")
    assert ledger.epsilon(1e-5) == pytest.approx(result["epsilon_spent"])
    samples = np.load(tmp_path / "run" / "samples.npz")
    assert samples["x"].shape == (600, 1, 28, 28) and samples["x"].min() >= 0 and samples["x"].max() <= 1
    assert set(samples["y"].tolist()) == set(range(10))
    with Image.open(tmp_path / "run" / "samples.png") as im:
        assert im.size[0] > 200 and im.size[1] > 200
    summary = format_summary(result)
    assert "epsilon spent" in summary and "fd_fmnist" in summary and str(tmp_path / "run") in summary


@pytest.mark.slow  # the flag is covered by test_all_methods; this adds real data's accuracy
def test_real_is_the_flagged_non_private_reference(make_cfg, tmp_path: Path) -> None:
    cfg = make_cfg("method=real", "dataset=fmnist", "eps=1", "metrics.n_samples=2000", "metrics.classifier.epochs=3")
    result = run(cfg, tmp_path / "run")
    assert result["non_private_reference"] is True
    assert math.isinf(result["epsilon_spent"])
    assert result["metrics"]["acc"] > 0.6  # real data: far above chance (0.1) even with a small classifier
    assert read_json(tmp_path / "run" / "result.json")["epsilon_spent"] == math.inf


def test_eps_inf_runs_without_noise(make_cfg, tmp_path: Path) -> None:
    result = run(make_cfg("method=dp_gan", "eps=inf", *IMAGE_METRICS), tmp_path / "run")  # metrics: test above
    assert math.isinf(result["epsilon_spent"]) and result["privacy_events"][0]["kind"] == "non_private"


def test_over_budget_run_writes_no_result(make_cfg, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """If the ledger exceeds the target (here: a calibration bug simulated), no result row is written."""
    import dpsyn.lit.dpsgd as dpsgd

    real_calibration = dpsgd.dpsgd_noise_multiplier
    monkeypatch.setattr(dpsgd, "dpsgd_noise_multiplier", lambda **kw: real_calibration(**kw) / 3)
    with pytest.raises(BudgetExceededError):
        run(make_cfg("method=dp_gan", "eps=1"), tmp_path / "run")
    assert not (tmp_path / "run" / "result.json").exists()
    assert PrivacyLedger.load(tmp_path / "run" / "privacy.json").epsilon(1e-5) > 1  # what was spent is on disk


def test_crash_after_training_leaves_no_result(make_cfg, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import dpsyn.metrics as metrics

    def boom(*a, **k):
        raise KeyboardInterrupt("killed mid-evaluation")

    monkeypatch.setattr(metrics, "evaluate", boom)
    with pytest.raises(KeyboardInterrupt):
        run(make_cfg("method=real"), tmp_path / "run")
    assert (tmp_path / "run" / "privacy.json").exists()
    assert not (tmp_path / "run" / "result.json").exists()
    assert not list((tmp_path / "run").glob(".*.tmp"))


def test_cli_multirun_writes_one_result_per_job(cli_env: dict[str, str], tmp_path: Path) -> None:
    """Four jobs in one process, on a small table (dp_gan on fmnist from the command line: test_console's default
    run; here its DCGAN's DP-SGD steps took half of the test's time)."""
    proc = subprocess.run(
        [sys.executable, str(REPO_DIR / "train.py"), "-m", "method=dp_gan,real", "dataset=breast_cancer", "eps=1,inf",
         "trainer=debug", "logger=csv", "metrics.tabular.classifiers=[logreg]", "metrics.n_samples=60",
         "trainer.enable_progress_bar=false"],
        capture_output=True, text=True, env=cli_env, cwd=tmp_path, timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = sorted((tmp_path / "outputs" / "multirun").glob("*/*/breast_cancer/eps*/seed0/result.json"))
    assert len(results) == 4
    cells = {(r["method"], r["eps"]) for r in map(read_json, results)}
    assert cells == {("dp_gan", 1.0), ("dp_gan", math.inf), ("real", 1.0), ("real", math.inf)}
    assert proc.stdout.count("dpsyn: ") == 4 and "epsilon spent" in proc.stdout
    assert all(json.loads(r.read_text())["git_sha"] is None or len(json.loads(r.read_text())["git_sha"]) == 40 for r in results)


def _twin(sweep: Path, method: str, eps: str, overrides: list[str], spent: float = 0.0, **extra) -> Path:
    """A finished cell written by hand, as a sweep leaves it."""
    cell = sweep / method / "fmnist" / f"eps{eps}" / "seed0"
    cell.mkdir(parents=True)
    np.savez(cell / "samples.npz", x=np.arange(6.0).reshape(2, 3), y=[0, 1])
    (cell / "privacy.json").write_text("{}")
    record = {"method": method, "dataset": "fmnist", "seed": 0, "eps": float(eps), "epsilon_spent": spent,
              "non_private_reference": method == "real", "deterministic_noise": False, "metrics": {"acc": 0.5},
              "timings": {"total_s": 50.0}, "overrides": overrides, "run_dir": str(cell), **extra}
    (cell / "result.json").write_text(json.dumps(record))
    return cell


def test_eps_free_cell_reuses_its_twin_at_another_eps(make_cfg, tmp_path: Path) -> None:
    from dpsyn.task import reuse_eps_free_result
    from dpsyn.methods import METHODS

    assert not METHODS.get("real").output_depends_on_eps()
    assert not METHODS.get("public_uniform").output_depends_on_eps()
    assert METHODS.get("dp_mge").output_depends_on_eps() and METHODS.get("dp_gan").output_depends_on_eps()
    sweep = tmp_path / "sweep"
    cfg = make_cfg("method=real", "eps=1", "metrics.n_samples=10")
    twin = _twin(sweep, "real", "inf", ["method=real", "eps=inf", "metrics.n_samples=10"], protocol=protocol_id(cfg))
    cell = sweep / "real" / "fmnist" / "eps1" / "seed0"
    result = reuse_eps_free_result(cfg, cell, sweep, ["method=real", "eps=1", "metrics.n_samples=10",
                                                      "skip_existing=true"])
    assert result is not None and result["eps"] == 1.0 and result["reused_from"] == str(twin)
    assert read_json(cell / "result.json") == result and result["metrics"] == {"acc": 0.5}
    assert np.array_equal(np.load(cell / "samples.npz")["x"], np.load(twin / "samples.npz")["x"])
    assert (cell / "privacy.json").is_file() and (cell / "config.yaml").is_file()
    # a third cell names the original, not the copy
    third = reuse_eps_free_result(make_cfg("method=real", "eps=10", "metrics.n_samples=10"),
                                  sweep / "real" / "fmnist" / "eps10" / "seed0", sweep,
                                  ["method=real", "eps=10", "metrics.n_samples=10"])
    assert third is not None and third["reused_from"] == str(twin)


def test_no_reuse_across_other_overrides_budgets_or_eps_dependent_methods(make_cfg, tmp_path: Path) -> None:
    from dpsyn.task import reuse_eps_free_result

    sweep = tmp_path / "sweep"
    _twin(sweep, "real", "inf", ["method=real", "eps=inf", "metrics.n_samples=10"])
    # the same overrides, scored under another protocol (the code's defaults moved since): scored again, not reused
    _twin(sweep, "real", "10", ["method=real", "eps=10"], protocol="dpsyn:wrn_40_4,x5,5ep,constant,n9000")
    _twin(sweep, "public_uniform", "inf", ["method=public_uniform", "eps=inf"], spent=2.0)
    _twin(sweep, "dp_gan", "10", ["method=dp_gan", "eps=10"], spent=0.5)
    cell = tmp_path / "new"
    # another override (a different config) is not a twin
    assert reuse_eps_free_result(make_cfg("method=real", "eps=1"), cell, sweep, ["method=real", "eps=1"]) is None
    # an eps-free method whose twin spent more than this cell's target (never for public_uniform: the guard)
    assert reuse_eps_free_result(make_cfg("method=public_uniform", "eps=1"), cell, sweep,
                                 ["method=public_uniform", "eps=1"]) is None
    # a DP method is always run: its output depends on eps
    assert reuse_eps_free_result(make_cfg("method=dp_gan", "eps=1"), cell, sweep, ["method=dp_gan", "eps=1"]) is None
    assert not cell.exists()


def test_missing_data_is_one_clear_line_not_a_traceback(cli_env: dict[str, str], tmp_path: Path) -> None:
    """The README's first promise, without CIFAR-10 on disk: exit 3 and a message naming what to put where."""
    proc = subprocess.run(
        [sys.executable, str(REPO_DIR / "train.py"), "method=dp_dre", "dataset=cifar10", "eps=1", "logger=none"],
        capture_output=True, text=True, env=cli_env, cwd=tmp_path, timeout=300,
    )
    assert proc.returncode == 3, proc.stderr[-2000:]
    assert "dpsyn: missing input: CIFAR-10 not found" in proc.stderr and "cifar-10-python.tar.gz" in proc.stderr
    assert "Traceback" not in proc.stderr
    (error,) = (tmp_path / "outputs").rglob("error.txt")  # the trace is kept beside the run for a bug report
    assert "FileNotFoundError" in error.read_text()


def test_the_code_recorded_is_the_code_at_the_start_of_the_run(make_cfg, tmp_path: Path, monkeypatch) -> None:
    """HEAD can move while a long run trains (a commit beside it): result.json names the commit the run started
    from, and whether tracked files differed from it then."""
    import dpsyn.task as task
    import dpsyn.metrics

    head = ["a" * 40]
    monkeypatch.setattr(task, "git_sha", lambda: head[0])
    monkeypatch.setattr(task, "git_dirty", lambda: True)
    evaluate = dpsyn.metrics.evaluate

    def commit_during_the_run(*args, **kwargs):
        head[0] = "b" * 40  # a commit lands while the run is scored
        return evaluate(*args, **kwargs)

    monkeypatch.setattr(dpsyn.metrics, "evaluate", commit_during_the_run)
    result = run(make_cfg("method=real", "dataset=breast_cancer", "eps=inf"), tmp_path / "run")
    on_disk = read_json(tmp_path / "run" / "result.json")
    assert result["git_sha"] == on_disk["git_sha"] == "a" * 40 and on_disk["git_dirty"] is True
