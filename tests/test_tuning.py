"""Tuning that never touches the test split: the validation split, metrics.split=validation, the optuna sweep, the
final re-run, what the ledgers record, the preflight's search-space syntax."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from dpsyn.cli.config_check import ConfigError, preflight
from dpsyn.data import DataBundle, Split, carve_validation
from dpsyn.paths import REPO_DIR


def _bundle(n: int = 50) -> DataBundle:
    x = np.arange(n, dtype=np.float32).reshape(n, 1)
    ev = Split(np.full((7, 1), -1.0, np.float32), np.zeros(7, np.int64))
    return DataBundle(name="t", kind="table", private=Split(x, np.arange(n) % 2, np.arange(n) + 100), eval=ev,
                      classes=["a", "b"], family="t", info={"sizes": {}})


def test_carve_validation_holds_out_private_rows_and_drops_the_eval_split() -> None:
    b = _bundle()
    v = carve_validation(b, 0.2, split_seed=0)
    assert (len(v.private), len(v.eval), v.eval_split) == (40, 10, "validation")
    assert set(v.private.x[:, 0]).isdisjoint(v.eval.x[:, 0])
    assert set(v.private.x[:, 0]) | set(v.eval.x[:, 0]) == set(b.private.x[:, 0])
    assert not np.any(v.eval.x == -1.0)  # the real eval rows are nowhere in the bundle
    assert np.array_equal(v.eval.index, v.eval.x[:, 0].astype(int) + 100)  # provenance follows the rows
    assert np.array_equal(carve_validation(b, 10, split_seed=0).eval.x, v.eval.x)  # a count or a fraction
    assert not np.array_equal(carve_validation(b, 0.2, split_seed=1).eval.x, v.eval.x)  # the split seed decides
    assert v.info["validation"]["rows"] == 10 and b.eval_split == "eval"
    with pytest.raises(ValueError, match="validation_size"):
        carve_validation(b, 50, split_seed=0)


def test_preflight_accepts_a_search_space_and_checks_its_ends() -> None:
    preflight(["-m", "experiment=tune", "method=dp_gan", "dataset=digits", "trainer=debug"])
    preflight(["-m", "experiment=tune", "method=dp_gan", "method.lr_d=tag(log, interval(1e-5, 1e-2))"])
    with pytest.raises(ConfigError, match="batch_size"):
        preflight(["-m", "experiment=tune", "method=dp_gan", "method.batch_size=interval(0, 64)"])
    with pytest.raises(ConfigError, match="split"):
        preflight(["method=dp_gan", "metrics.split=test"])


def test_a_tuning_sweep_never_reads_the_eval_split_and_the_final_run_reads_it_once(tmp_path: Path, cli_env) -> None:
    env = {**cli_env, "DPSYN_OUTPUT_DIR": str(tmp_path), "OMP_NUM_THREADS": "1"}
    # a narrow DCGAN (the final run keeps the sweep's overrides): what is checked is which split each run reads
    cmd = [sys.executable, str(REPO_DIR / "train.py"), "-m", "experiment=tune", "method=dp_gan", "dataset=digits",
           "eps=1", "trainer=debug", "logger=none", "method.ngf=8", "method.ndf=8", "hydra.sweeper.n_trials=2"]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    sweep = tmp_path / "experiments" / "tune_dp_gan_digits_eps1.0" / "embedded"
    if not sweep.is_dir():
        sweep = next((tmp_path / "experiments").glob("tune_dp_gan_digits_eps*")) / "embedded"
    trials = sorted(sweep.glob("trial*/seed0/result.json"))
    assert len(trials) == 2  # two trials: the best one is still a choice
    values = []
    for path in trials:
        r = json.loads(path.read_text())
        info = r["metric_info"]
        assert r["metrics_split"] == "validation" and r["tuning"]["role"] == "trial"
        assert "eval_reads" not in info and [x["n"] for x in info["validation_reads"]] == [144]  # 10% of 1437
        # every metric's reference is the validation split: no reader got the eval split
        refs = [v["reference"] for v in info.values() if isinstance(v, dict) and "reference" in v]
        assert refs and all("validation split" in ref for ref in refs)
        assert not any(k.endswith("_test_acc") for k in r["metrics"])
        assert float(r["epsilon_spent"]) == float("inf")  # the validation score went to the sweeper without DP
        assert r["privacy_events"][-1]["kind"] == "non_private" and "tuning trial" in r["privacy_events"][-1]["label"]
        values.append(r["metrics"]["acc"])
    # re-scoring a trial keeps its split: validation again, never the eval split
    from dpsyn.cli.evaluate import rescore

    with pytest.raises(ConfigError, match="scored on its validation split"):
        rescore(trials[0].parent, ["metrics.split=eval"])
    again = rescore(trials[0].parent, ["metrics.names.image=[fd]"])
    assert "eval_reads" not in again["metric_info"] and "validation split" in again["metric_info"]["fd_digits"]["reference"]
    best = (sweep / "optimization_results.yaml").read_text()
    assert f"best_value: {max(values)}" in best

    proc = subprocess.run([sys.executable, "-m", "dpsyn.cli.tune", "final", str(sweep), "logger=none"], env=env,
                          capture_output=True, text=True, timeout=600, cwd=REPO_DIR)
    assert proc.returncode == 0, proc.stderr[-3000:]
    r = json.loads((sweep / "final" / "result.json").read_text())
    assert r["metrics_split"] == "eval" and [x["n"] for x in r["metric_info"]["eval_reads"]] == [359]
    assert r["tuning"] == {"role": "final", "tuned_on": str(sweep), "trials": 2}
    assert "settings chosen on 2 trials" in r["privacy_events"][-1]["label"] and float(r["epsilon_spent"]) == float("inf")
    best_params = [line.strip() for line in best.splitlines()[2:5]]
    for p in best_params:  # the final run has the best trial's settings
        k, v = p.split(": ")
        assert f"{k}={v}" in r["overrides"]
