"""Kill-and-rerun harness: a real ``python train.py`` process is killed with SIGKILL at chosen points, then rerun in
the same run directory to completion.

A kill point is a file of the run directory (``checkpoints/last.ckpt``, ``checkpoints/fitted.pt``, ...) and which new
version of it (counted from the start of that process: an atomic write replaces the file, a new inode is a new
version) to wait for. :func:`kill_and_rerun` starts the command, kills it at the first point, starts it again, kills it
at the second, ... and finally runs it to completion. :func:`check_crash_safe` then checks what issue 15 asks: the
ledger holds every release exactly once (the same events as an uninterrupted run of the same config), epsilon spent
<= the target, result.json is complete, and a run killed after fit (``checkpoints/fitted.pt`` written) was not
fitted again and charged nothing more.
"""

from __future__ import annotations

import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dpsyn.paths import REPO_DIR
from dpsyn.results.io import read_json

FITTED = "checkpoints/fitted.pt"
RESULT_KEYS = ("method", "dataset", "eps", "delta", "seed", "epsilon_spent", "accountant", "privacy_events", "metrics",
               "n_private", "n_samples", "sample_provenance", "timings", "fit_restored")


@dataclass(frozen=True)
class KillPoint:
    """Kill the process once ``path`` (relative to the run directory) has had ``version`` new versions."""

    path: str
    version: int = 1


@dataclass
class Killed:
    """What one killed process left: the file that triggered the kill, the ledger on disk, the fitted state's."""

    point: KillPoint
    seconds: float
    ledger_events: list[dict[str, Any]] | None
    fitted_events: list[dict[str, Any]] | None
    fitted_mtime_ns: int | None


@dataclass
class CrashRun:
    """The kills, then the final run's result, ledger and output."""

    run_dir: Path
    killed: list[Killed] = field(default_factory=list)
    result: dict[str, Any] | None = None
    ledger: dict[str, Any] | None = None
    output: str = ""
    seconds: float = 0.0


def _version_id(path: Path) -> tuple[int, int] | None:
    try:
        st = path.stat()
    except FileNotFoundError:
        return None
    return st.st_ino, st.st_mtime_ns


def _fitted_events(run_dir: Path) -> tuple[list[dict[str, Any]] | None, int | None]:
    path = run_dir / FITTED
    if not path.is_file():
        return None, None
    import torch

    blob = torch.load(path, map_location="cpu", weights_only=False)
    return blob["ledger"]["events"], path.stat().st_mtime_ns


def _command(overrides: list[str], run_dir: Path) -> list[str]:
    return [sys.executable, str(REPO_DIR / "train.py"), *overrides, f"hydra.run.dir={run_dir}"]


def run_until_killed(overrides: list[str], run_dir: Path, env: dict[str, str], point: KillPoint, *,
                     timeout: float, poll_s: float = 0.02) -> Killed:
    """Start the run, wait for ``point``, SIGKILL the process; fail if it ends (or times out) before that."""
    target = run_dir / point.path
    seen = _version_id(target)
    versions = 0
    log_path = run_dir.parent / f"{run_dir.name}.killed{time.monotonic_ns()}.log"
    t0 = time.monotonic()
    with open(log_path, "w") as log:
        proc = subprocess.Popen(_command(overrides, run_dir), env=env, cwd=run_dir.parent, stdout=log,
                                stderr=subprocess.STDOUT)
        try:
            while True:
                now = _version_id(target)
                if now is not None and now != seen:
                    seen, versions = now, versions + 1
                    if versions >= point.version:
                        proc.kill()  # SIGKILL: no handler, no finally block runs
                        break
                if proc.poll() is not None:
                    raise AssertionError(f"the run ended (rc {proc.returncode}) before {point} was reached:\n"
                                         + log_path.read_text()[-3000:])
                if time.monotonic() - t0 > timeout:
                    raise AssertionError(f"{point} not reached within {timeout:g} s:\n" + log_path.read_text()[-3000:])
                time.sleep(poll_s)
        finally:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
    assert proc.returncode == -9, f"expected a SIGKILL, got rc {proc.returncode}"
    assert not (run_dir / "result.json").exists(), f"killed at {point} but the run had already finished"
    privacy = run_dir / "privacy.json"
    events = read_json(privacy)["events"] if privacy.is_file() else None
    fitted_events, mtime = _fitted_events(run_dir)
    return Killed(point, time.monotonic() - t0, events, fitted_events, mtime)


def kill_and_rerun(overrides: list[str], run_dir: Path, env: dict[str, str], points: list[KillPoint], *,
                   timeout: float = 600) -> CrashRun:
    """Kill the run at each of ``points`` in turn (one process each), then rerun it to completion in ``run_dir``."""
    run_dir.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    out = CrashRun(run_dir)
    for point in points:
        out.killed.append(run_until_killed(overrides, run_dir, env, point, timeout=timeout))
    proc = subprocess.run(_command(overrides, run_dir), env=env, cwd=run_dir.parent, capture_output=True, text=True,
                          timeout=timeout)
    out.output = proc.stdout + proc.stderr
    assert proc.returncode == 0, out.output[-4000:]
    out.result = read_json(run_dir / "result.json")
    out.ledger = read_json(run_dir / "privacy.json")
    out.seconds = time.monotonic() - t0
    return out


def check_crash_safe(crash: CrashRun, *, eps: float, n_samples: int,
                     reference_events: list[dict[str, Any]] | None = None) -> None:
    """The assertions of issue 15 (part 3) on a finished :func:`kill_and_rerun`.

    Args:
        crash: the kills and the final run.
        eps: the target epsilon.
        n_samples: ``metrics.n_samples`` of the config.
        reference_events: the ledger events of an uninterrupted run of the same config (deterministic noise): the
            final ledger must equal them, i.e. hold every planned release exactly once.
    """
    result, ledger = crash.result, crash.ledger
    assert result is not None and ledger is not None
    missing = [k for k in RESULT_KEYS if k not in result]
    assert not missing, f"result.json lacks {missing}"
    assert result["n_samples"] == n_samples and isinstance(result["metrics"], dict), result["n_samples"]
    assert result["privacy_events"] == ledger["events"], "result.json and privacy.json disagree"
    assert ledger["events"], "no release recorded"
    assert 0 < result["epsilon_spent"] <= eps * (1 + 1e-9), result["epsilon_spent"]
    assert ledger["epsilon_spent"] == result["epsilon_spent"]
    if reference_events is not None:
        assert ledger["events"] == reference_events, (
            "the ledger after kill(s) and rerun differs from an uninterrupted run's:\n"
            f"{ledger['events']}\nvs\n{reference_events}")
    for i, killed in enumerate(crash.killed):
        if killed.point.path != FITTED:
            continue
        # killed after fit: what was spent is on disk, and the rerun neither fitted again nor charged again
        assert killed.fitted_events is not None and killed.ledger_events == killed.fitted_events
        assert ledger["events"] == killed.fitted_events, "the rerun charged again"
        if i == len(crash.killed) - 1:
            assert result["fit_restored"] is True, "the rerun after a kill past fit fitted again"
            assert "fit skipped" in crash.output
            assert (crash.run_dir / FITTED).stat().st_mtime_ns == killed.fitted_mtime_ns, "fitted.pt rewritten"
    if not any(k.point.path == FITTED for k in crash.killed):
        assert result["fit_restored"] is False
