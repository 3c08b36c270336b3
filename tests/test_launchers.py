"""A sweep through the launchers users run at scale: submitit (Slurm's machinery, run locally) and a local Ray cluster.

Each test runs ``python train.py -m`` over two cells (dp_gan on fmnist at eps=1 and eps=2, debug-sized) with
``hydra/launcher=...`` and checks that both cells finished (result.json with its overrides and an epsilon that the
saved ledger reproduces) and that the launcher asked for really ran them: Hydra's record of the launcher choice, and
the launcher's own job logs (submitit's ``.submitit`` folder, Ray's worker logs) holding each cell's summary.
Slow (about a minute each on 2 cores): ``make test-full`` runs them, ``make test`` does not.
"""

from __future__ import annotations

import importlib.util
import math
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import yaml

from dpsyn.paths import REPO_DIR
from dpsyn.privacy import PrivacyLedger
from dpsyn.results.io import read_json

pytestmark = pytest.mark.slow

EPS = (1, 2)


def _sweep(cli_env: dict[str, str], tmp_path: Path, *launcher: str) -> tuple[subprocess.CompletedProcess, Path]:
    """``python train.py -m`` over the two cells with the ``launcher`` overrides; returns the process and sweep dir."""
    proc = subprocess.run(
        [sys.executable, str(REPO_DIR / "train.py"), "-m", "method=dp_gan", "dataset=fmnist",
         "eps=" + ",".join(map(str, EPS)), "trainer=debug", "logger=none", "metrics.names.image=[]",
         "metrics.n_samples=60", "trainer.enable_progress_bar=false", *launcher],
        capture_output=True, text=True, env={**cli_env, "OMP_NUM_THREADS": "1"}, cwd=tmp_path, timeout=900,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    sweeps = list((tmp_path / "outputs" / "multirun").iterdir())
    assert len(sweeps) == 1, sweeps
    return proc, sweeps[0]


def _finished_cells(sweep: Path, launcher: str) -> list[Path]:
    """Both cells' run directories, after checking their result.json, ledger and the launcher Hydra used."""
    cells = []
    for eps in EPS:
        cell = sweep / "dp_gan" / "fmnist" / f"eps{eps}" / "seed0"
        result = read_json(cell / "result.json")
        assert (result["method"], result["dataset"], result["eps"], result["seed"]) == ("dp_gan", "fmnist", eps, 0)
        assert f"eps={eps}" in result["overrides"] and "method=dp_gan" in result["overrides"]
        assert Path(result["run_dir"]) == cell
        spent = result["epsilon_spent"]
        assert math.isfinite(spent) and 0 < spent <= eps, spent
        assert not result["non_private_reference"]
        # the record is the ledger's: composing the saved events again gives the same epsilon
        assert PrivacyLedger.load(cell / "privacy.json").epsilon() == pytest.approx(spent, rel=1e-9)
        hydra_cfg = yaml.safe_load((cell / ".hydra" / "hydra.yaml").read_text())["hydra"]
        assert hydra_cfg["runtime"]["choices"]["hydra/launcher"] == launcher
        assert hydra_cfg["mode"] == "MULTIRUN"
        cells.append(cell)
    return cells


def _logs_holding(logs: list[Path], cell: Path) -> list[Path]:
    """The job logs that hold the summary a run prints at its end (its output folder is its last line)."""
    return [log for log in logs if f"outputs : {cell}" in log.read_text(errors="replace")]


def test_sweep_through_submitit_local(cli_env: dict[str, str], tmp_path: Path) -> None:
    """``hydra/launcher=submitit_local``: the same submitit job machinery as ``submitit_slurm``, on this machine."""
    _, sweep = _sweep(cli_env, tmp_path, "hydra/launcher=submitit_local")
    cells = _finished_cells(sweep, "submitit_local")
    jobs = sorted(p for p in (sweep / ".submitit").iterdir() if p.is_dir() and p.name.isdigit())
    assert len(jobs) == len(EPS), jobs
    for job in jobs:  # a submitted job, run from its pickle, returned a pickled result
        assert (job / f"{job.name}_submitted.pkl").is_file() and (job / f"{job.name}_0_result.pkl").is_file()
        assert "submitit INFO" in (job / f"{job.name}_0_log.out").read_text()
    logs = [job / f"{job.name}_0_log.out" for job in jobs]
    # each cell ran in its own submitit job
    assert [len(_logs_holding(logs, cell)) for cell in cells] == [1, 1]
    assert _logs_holding(logs, cells[0]) != _logs_holding(logs, cells[1])


@pytest.mark.skipif(importlib.util.find_spec("ray") is None
                    or importlib.util.find_spec("hydra_plugins.hydra_ray_launcher") is None,
                    reason="ray is not importable: pip install -e '.[ray]' (hydra-ray-launcher) to run this test")
def test_sweep_on_a_local_ray_cluster(cli_env: dict[str, str], tmp_path: Path) -> None:
    """``hydra/launcher=ray`` with no address: Ray starts a local cluster, runs each cell as a task, stops."""
    # Ray's sockets live in its temp dir, and a Unix socket path must stay under 108 bytes: pytest's tmp_path is
    # too deep for that, so the cluster gets a short folder of its own
    ray_tmp = Path(tempfile.mkdtemp(prefix="dpsyn-ray-", dir="/tmp"))
    try:
        proc, sweep = _sweep(cli_env, tmp_path, "hydra/launcher=ray", "+hydra.launcher.ray.init.num_cpus=2",
                             "+hydra.launcher.ray.init.include_dashboard=false",
                             f"+hydra.launcher.ray.init._temp_dir={ray_tmp}")
        cells = _finished_cells(sweep, "ray")
        assert "Ray Launcher is launching 2 jobs" in proc.stdout + proc.stderr
        sessions = [p for p in ray_tmp.glob("session_*") if p.is_dir() and not p.is_symlink()]
        assert len(sessions) == 1, sessions
        # the cells ran in Ray worker processes, not in the driver: their summaries are in the workers' logs
        logs = sorted((sessions[0] / "logs").glob("worker-*.out"))
        holding = [_logs_holding(logs, cell) for cell in cells]
        assert [len(h) for h in holding] == [1, 1], [log.name for log in logs]
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)
