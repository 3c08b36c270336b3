"""The metric wiring end to end: every metric of `metrics=full` on a run, re-scoring saved samples, sealed reads."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from dpsyn.cli.config_check import ConfigError
from dpsyn.cli.evaluate import rescore
from dpsyn.task import run
from dpsyn.results.io import read_json


@pytest.fixture
def real_run(make_cfg, tmp_path: Path) -> Path:
    run(make_cfg("method=real", "dataset=fmnist", "metrics.n_samples=1200"), tmp_path / "run")
    return tmp_path / "run"


@pytest.fixture
def unscored_run(make_cfg, tmp_path: Path) -> Path:
    """A completed run without image metrics: what the refusals below need (they come before any scoring)."""
    run(make_cfg("method=real", "dataset=fmnist", "metrics.names.image=[]", "metrics.n_samples=60"), tmp_path / "run")
    return tmp_path / "run"


@pytest.mark.slow  # every metric of conf/metrics/full.yaml trained and scored (~40 s)
def test_full_metrics_on_saved_samples(real_run: Path) -> None:
    before = read_json(real_run / "result.json")
    assert set(before["metrics"]) >= {"fd_fmnist", "acc"}
    assert before["metric_info"]["fd_fmnist"]["extractor"] == "evalnet_fmnist"
    assert before["metric_info"]["acc"]["selection"] == "held-out synthetic split"
    assert before["metric_info"]["eval_reads"] == [{"reader": before["metric_info"]["eval_reads"][0]["reader"], "n": 10000}]

    after = rescore(real_run, ["metrics=full", "metrics.kid.subsets=5", "metrics.ndb.K=20", "metrics.mia.n_members=300"])
    m = after["metrics"]
    for key in ("fd_fmnist", "kid_fmnist", "precision", "recall", "density", "coverage", "is_fmnist", "ndb_k",
                "ndb_js", "acc", "mia_bb_auc", "mia_bb_eps_lb"):
        assert key in m and isinstance(m[key], float) and not math.isnan(m[key]), key
    # real data scored against real data: close manifolds, near-zero distance, high precision and recall
    assert m["precision"] > 0.6 and m["recall"] > 0.6 and m["fd_fmnist"] < 5
    assert after["metric_info"]["kid_fmnist"]["subsets"] == 5
    assert [r["reader"] for r in after["metric_info"]["eval_reads"]] == [
        after["metric_info"]["eval_reads"][0]["reader"], "metrics.mia_bb"]  # acc and mia_bb: one sealed read each
    assert after["rescored"][-1]["overrides"][0] == "metrics=full"
    assert read_json(real_run / "result.json")["metrics"]["ndb_k"] == pytest.approx(m["ndb_k"])


def test_rescore_refuses_other_overrides_and_incomplete_runs(unscored_run: Path, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="only metric settings"):
        rescore(unscored_run, ["eps=0.1"])
    with pytest.raises(ConfigError, match="allowed: default, full"):
        rescore(unscored_run, ["metrics=fancy"])
    (tmp_path / "partial").mkdir()
    with pytest.raises(ConfigError, match="no config.yaml"):
        rescore(tmp_path / "partial")


def test_unknown_metric_fails_before_any_metric_runs(make_cfg, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown metric 'fidd'"):
        run(make_cfg("method=real", "metrics.names.image=[fd,fidd]"), tmp_path / "run")
    assert not (tmp_path / "run" / "result.json").exists()


def test_monitor_scores_like_the_metrics_and_computes_the_real_radii_once(make_cfg, monkeypatch) -> None:
    """PE's per-iteration monitor: the same precision/recall as the metric functions, the real set's k-NN radii
    computed on the first call only (they were recomputed every iteration)."""
    import numpy as np

    from dpsyn.task import family_loader
    from dpsyn.data import load_dataset
    from dpsyn.metrics import fidelity, make_monitor

    cfg = make_cfg("dataset=fmnist", "metrics.n_real=500")
    data = load_dataset(cfg.dataset, seed=0, data_dir=cfg.paths.data_dir)
    calls = []
    real_radii = fidelity.real_squared_knn_radii
    monkeypatch.setattr(fidelity, "real_squared_knn_radii", lambda *a, **k: calls.append(1) or real_radii(*a, **k))
    monitor = make_monitor(data, cfg.metrics, cache_dir=cfg.paths.cache_dir, load_family=family_loader(cfg))
    images = [data.private.x[:300], data.private.x[300:600]]
    got = [monitor(x) for x in images]
    assert len(calls) == 1 and all({"fd_fmnist", "precision", "recall"} <= set(v) for v in got)
    # the same numbers the metric function gives from scratch, on the monitor's own features
    from dpsyn.metrics import _extractor, _features

    env = {"cache_dir": cfg.paths.cache_dir, "seed": 0, "load_family": family_loader(cfg), "feats": {}}
    real = _features(env, data, cfg.metrics, "real")
    gen = _extractor(env, data, cfg.metrics).extract(images[1])["features"]
    want = fidelity.precision_recall(gen, real, k=int(cfg.metrics.prdc.k_pr))
    assert got[1]["precision"] == pytest.approx(want["precision"]) and got[1]["recall"] == pytest.approx(want["recall"])
    with pytest.raises(ValueError, match="real_squared_radii of shape"):
        fidelity.precision_recall(gen, real, k=3, real_squared_radii=np.zeros(3))
