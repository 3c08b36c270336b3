"""``make gpu-check`` (benchmarks/gpu_check.py): the exit without CUDA, its CPU mode end to end, the report written
after every check, the budgets, and the detection of module calls off the expected device."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from dpsyn.methods import METHODS
from dpsyn.paths import REPO_DIR
from tests.conftest import load_script

SCRIPT = REPO_DIR / "benchmarks" / "gpu_check.py"


gc = load_script(SCRIPT, "dpsyn_gpu_check_under_test")


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("OUT", "DPSYN_GPU_CHECK_DEVICE")}
    env.update(PYTHONPATH=str(REPO_DIR), OMP_NUM_THREADS="1", **extra)
    return env


def test_without_cuda_it_exits_3_with_its_message_and_writes_nothing(tmp_path: Path) -> None:
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, str(SCRIPT), "--out", str(out)], env=_env(CUDA_VISIBLE_DEVICES=""),
                          capture_output=True, text=True, timeout=120, cwd=REPO_DIR)
    assert proc.returncode == 3, proc.stderr
    assert proc.stdout.strip() == "no CUDA device: nothing checked"
    assert not out.exists()


def test_cpu_mode_writes_an_entry_for_every_check(tmp_path: Path) -> None:
    """The script end to end on the CPU (smallest sizes), two methods selected: json and md hold every check, each
    passed or skipped with a reason."""
    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--device", "cpu", "--out", str(out), "--standin-data",
         "--only", "method/real", "method/g_pate", "paper/*", "ratio/*"],
        env=_env(), capture_output=True, text=True, timeout=600, cwd=REPO_DIR)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    data = json.loads((out / "gpu-check.json").read_text())
    md = (out / "gpu-check.md").read_text()
    assert data["device"] == "cpu" and data["state"] == "finished" and "stand-in" in data["data"]
    checks = {c["name"]: c for c in data["checks"]}
    want = ["deps", *(f"method/{m}" for m in METHODS.names()), "paper/g_pate_mnist", "paper/wu2023_swav_32px",
            "paper/wu2023_swav_128px", "paper/pe_cifar10_histogram", "ratio/dpsgd_vs_plain",
            "ratio/teachers_vmap_vs_loop", "ratio/pe_faiss_gpu_vs_cpu", "paper/dp_gan_dib",
            "paper/gs_wgan_1000_critics"]
    assert list(checks) == want
    for name, c in checks.items():
        assert c["status"] in ("passed", "skipped"), (name, c)
        assert c["status"] == "passed" or c["reason"], name
        assert f"| {name} |" in md
    assert checks["method/dp_gan"]["reason"] == "not selected (--only)"
    for name in want:
        if name.startswith(("paper/", "ratio/dpsgd", "ratio/teachers")) or name in ("method/real", "method/g_pate"):
            assert checks[name]["status"] == "passed", name
    assert checks["deps"]["measured"]["torch"] == torch.__version__
    g_pate = checks["method/g_pate"]["measured"]
    assert 0 < g_pate["epsilon_spent"] <= 1.0 and g_pate["module_calls"]["cpu"] > 0 and g_pate["optimizer_steps"] > 0
    assert checks["method/real"]["measured"]["note"] == "non-private reference"
    assert checks["paper/g_pate_mnist"]["measured"]["paper_teachers"] == 4000
    assert checks["paper/g_pate_mnist"]["measured"]["params_per_teacher"] > 500_000  # the authors' teacher
    dib = checks["paper/dp_gan_dib"]["measured"]
    assert (dib["d_steps_dpsyn"], dib["g_steps_dpsyn"], dib["d_steps_dpimagebench"]) == (1950, 390, 2100)
    assert dib["run_estimate_h_dpimagebench"] == pytest.approx((2100 * dib["d_step_s"] + 420 * dib["g_step_s"]) / 3600)
    gsw = checks["paper/gs_wgan_1000_critics"]["measured"]
    assert (gsw["paper_critics"], gsw["critics_built"], gsw["ndf"], gsw["warm_start_iterations"]) == (1000, 4, 64, 2000)
    assert gsw["warm_start_iteration_s"] > 0 and gsw["iteration_s"] > 0 and gsw["sigma"] > 0
    assert gsw["warm_start_estimate_h"] == pytest.approx(gsw["warm_start_iteration_s"] * 1000 * 2000 / 3600)
    # the profile's 100 critics a vmap call, capped at the critics built
    assert gsw["warm_start_chunk"] == 4 and gsw["warm_start_chunked_iteration_s"] > 0
    assert gsw["warm_start_chunk_speedup"] == pytest.approx(gsw["warm_start_iteration_s"]
                                                            / gsw["warm_start_chunked_iteration_s"])
    assert gsw["warm_start_chunked_estimate_h"] == pytest.approx(gsw["warm_start_chunked_iteration_s"] * 1000 * 2000
                                                                 / 3600)
    assert checks["ratio/teachers_vmap_vs_loop"]["measured"]["train_x"] > 0
    dpsgd = checks["ratio/dpsgd_vs_plain"]["measured"]
    assert dpsgd["default"] == "paired/fused" and dpsgd["paired/fused"] > 0 and dpsgd["split/hooks"] > 0
    assert dpsgd["paired/hooks"] > 0


def test_the_report_is_rewritten_after_each_check_and_survives_a_kill(tmp_path: Path) -> None:
    report = gc.Report(tmp_path, {"device": "cpu"})
    seen_on_disk: list[list[str]] = []

    def look() -> dict:
        seen_on_disk.append([c["name"] for c in json.loads(report.json_path.read_text())["checks"]])
        return {"ok": 1}

    def broken() -> dict:
        raise ValueError("midway")

    def killed() -> dict:
        raise KeyboardInterrupt  # the run is stopped here: nothing after it runs

    checks = [gc.Check("a", 10, lambda: {"x": 1.5}), gc.Check("b", 10, look), gc.Check("c", 10, broken),
              gc.Check("d", 10, look), gc.Check("e", 10, killed), gc.Check("f", 10, look)]
    with pytest.raises(KeyboardInterrupt):
        gc.run_checks(checks, report, deadline=time.monotonic() + 60, selected=lambda name: True)
    assert seen_on_disk == [["a"], ["a", "b", "c"]]  # each check finds the earlier ones on disk
    saved = json.loads(report.json_path.read_text())
    assert [(c["name"], c["status"]) for c in saved["checks"]] == [
        ("a", "passed"), ("b", "passed"), ("c", "failed"), ("d", "passed")]
    assert saved["checks"][2]["failures"] == ["ValueError: midway"]
    assert "| c | failed |" in report.md_path.read_text()
    assert not list(tmp_path.glob(".*.tmp"))  # the atomic writes left no temporary file


def test_budgets_missing_modules_and_selection_are_recorded(tmp_path: Path) -> None:
    report = gc.Report(tmp_path, {})
    checks = [gc.Check("slow", 0.2, lambda: time.sleep(5) or {}),
              gc.Check("needs", 10, lambda: {}, needs=("a_module_that_is_not_there",)),
              gc.Check("import", 10, lambda: __import__("another_module_that_is_not_there")),
              gc.Check("big", 1000, lambda: {}),
              gc.Check("other", 1, lambda: {})]
    gc.run_checks(checks, report, deadline=time.monotonic() + 100, selected=lambda name: name != "other")
    got = {c["name"]: c for c in report.checks}
    assert got["slow"]["status"] == "failed" and "past its budget" in got["slow"]["failures"][0]
    assert got["slow"]["seconds"] < 5
    assert got["needs"]["reason"] == "needs a_module_that_is_not_there (not importable here)"
    assert got["import"]["reason"] == "needs another_module_that_is_not_there (not importable here)"
    assert got["big"]["status"] == "skipped" and got["big"]["reason"].startswith("not started")
    assert got["other"]["reason"] == "not selected (--only)"


def test_the_recorder_flags_module_calls_off_the_expected_device() -> None:
    """A silent CPU fallback: a module that ran on the CPU while the GPU was expected is named."""
    net = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU())
    with gc.DeviceRecorder("cuda") as rec:
        net(torch.rand(5, 3))  # outside a recorded phase: not counted
        with rec.phase():
            net(torch.rand(7, 3))
    assert rec.off == {"Sequential": 1, "Linear": 1, "ReLU": 1}
    assert rec.calls["cpu"] == 3 and rec.rows == 7
    with gc.DeviceRecorder("cpu") as rec:
        with rec.phase():
            net(torch.rand(2, 3))
            torch.optim.SGD(net.parameters(), lr=0.1).step()
    assert not rec.off and rec.steps == 1
    net(torch.rand(2, 3))  # the hooks are gone


def test_recorded_phases_wrap_fit_and_sample_and_restore_them() -> None:
    cls = METHODS.get("real")
    before = {k: cls.__dict__.get(k) for k in ("fit", "sample")}
    with gc.DeviceRecorder("cpu") as rec, gc.recorded_phases(cls, rec):
        assert cls.__dict__["fit"] is not before["fit"]
    assert {k: cls.__dict__.get(k) for k in ("fit", "sample")} == before
