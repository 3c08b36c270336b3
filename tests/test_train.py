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

from dpsyn.cli.train import format_summary, run
from dpsyn.paths import REPO_DIR
from dpsyn.privacy import BudgetExceededError, PrivacyLedger
from dpsyn.results.io import read_json


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
    ledger = PrivacyLedger.load(tmp_path / "run" / "privacy.json")
    assert ledger.epsilon(1e-5) == pytest.approx(result["epsilon_spent"])
    samples = np.load(tmp_path / "run" / "samples.npz")
    assert samples["x"].shape == (600, 1, 28, 28) and samples["x"].min() >= 0 and samples["x"].max() <= 1
    assert set(samples["y"].tolist()) == set(range(10))
    with Image.open(tmp_path / "run" / "samples.png") as im:
        assert im.size[0] > 200 and im.size[1] > 200
    summary = format_summary(result)
    assert "epsilon spent" in summary and "fd_fmnist" in summary and str(tmp_path / "run") in summary


def test_real_is_the_flagged_non_private_reference(make_cfg, tmp_path: Path) -> None:
    cfg = make_cfg("method=real", "dataset=fmnist", "eps=1", "metrics.n_samples=2000", "metrics.classifier.epochs=3")
    result = run(cfg, tmp_path / "run")
    assert result["non_private_reference"] is True
    assert math.isinf(result["epsilon_spent"])
    assert result["metrics"]["acc"] > 0.6  # real data: far above chance (0.1) even with a small classifier
    assert read_json(tmp_path / "run" / "result.json")["epsilon_spent"] == math.inf


def test_eps_inf_runs_without_noise(make_cfg, tmp_path: Path) -> None:
    result = run(make_cfg("method=dp_gan", "eps=inf"), tmp_path / "run")
    assert math.isinf(result["epsilon_spent"]) and result["privacy_events"][0]["kind"] == "non_private"


def test_over_budget_run_writes_no_result(make_cfg, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """If the ledger exceeds the target (here: a calibration bug simulated), no result row is written."""
    import dpsyn.methods.dp_gan as dp_gan

    real_calibration = dp_gan.dpsgd_noise_multiplier
    monkeypatch.setattr(dp_gan, "dpsgd_noise_multiplier", lambda **kw: real_calibration(**kw) / 3)
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
    proc = subprocess.run(
        [sys.executable, str(REPO_DIR / "train.py"), "-m", "method=dp_gan,real", "dataset=fmnist", "eps=1,inf",
         "trainer=debug", "logger=csv"],
        capture_output=True, text=True, env=cli_env, cwd=tmp_path, timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = sorted((tmp_path / "outputs" / "multirun").glob("*/*/fmnist/eps*/seed0/result.json"))
    assert len(results) == 4
    cells = {(r["method"], r["eps"]) for r in map(read_json, results)}
    assert cells == {("dp_gan", 1.0), ("dp_gan", math.inf), ("real", 1.0), ("real", math.inf)}
    assert proc.stdout.count("dpsyn: ") == 4 and "epsilon spent" in proc.stdout
    assert all(json.loads(r.read_text())["git_sha"] is None or len(json.loads(r.read_text())["git_sha"]) == 40 for r in results)
