"""Kill-and-rerun harness: a real ``python train.py`` process is killed with SIGKILL at chosen points, then rerun in
the same run directory to completion.

A kill point is a file of the run directory (``checkpoints/last.ckpt``, ``checkpoints/fitted.pt``, ...) and which new
version of it (counted from the start of that process: an atomic write replaces the file, a new inode is a new
version) to wait for. :func:`kill_and_rerun` starts the command, kills it at the first point, starts it again, kills it
at the second, ... and finally runs it to completion. :func:`check_crash_safe` then checks what issue 15 asks: the
ledger holds every release exactly once (the same events as an uninterrupted run of the same config), epsilon spent
<= the target, result.json is complete, and a run killed after fit (``checkpoints/fitted.pt`` written) was not
fitted again and charged nothing more.

No charge lost on resume (issue 59): a killed process may have charged (and released) rounds after its last
checkpoint; its write-ahead journal (:data:`JOURNAL`) holds them. Each kill records the journal and what the rerun can
resume from (the checkpoints' ledgers, a Lightning checkpoint's steps); the final ledger must hold every charge of
every journal left by a kill, and where a kill left charges beyond what the rerun resumed from
(:func:`lost_charges`), they are charged on top of the redone rounds: the final ledger then differs from an
uninterrupted run's by those charges.
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
JOURNAL = "checkpoints/ledger.journal.json"
LIGHTNING = "checkpoints/last.ckpt"
RESULT_KEYS = ("method", "dataset", "eps", "delta", "seed", "epsilon_spent", "accountant", "privacy_events", "metrics",
               "n_private", "n_samples", "sample_provenance", "timings", "fit_restored")


@dataclass(frozen=True)
class KillPoint:
    """Kill the process once ``path`` (relative to the run directory) has had ``version`` new versions, or, with
    ``charged`` = ``(kind, key, n)``, once the journal at ``path`` charges at least ``n`` of ``key`` over its events
    of ``kind`` (e.g. ``("pate", "queries", 880)``): a point in the run's progress that fast rounds cannot skip (the
    poll sees a version change, not each of several writes between two polls)."""

    path: str
    version: int = 1
    charged: tuple[str, str, int] | None = None

    def reached(self, target: Path, versions: int) -> bool:
        if self.charged is None:
            return versions >= self.version
        kind, key, n = self.charged
        try:
            events = read_json(target)["events"]
        except (OSError, ValueError, KeyError):
            return False
        return charge(events, kind, key) >= n


@dataclass
class Killed:
    """What one killed process left: the file that triggered the kill, the ledger on disk, the fitted state's, the
    journal's, and the ledgers a rerun can resume from (``checkpoints/*.pt`` but fitted.pt, by file name) and the DP
    steps of a Lightning checkpoint (``checkpoints/last.ckpt``; None without one)."""

    point: KillPoint
    seconds: float
    ledger_events: list[dict[str, Any]] | None
    fitted_events: list[dict[str, Any]] | None
    fitted_mtime_ns: int | None
    journal_events: list[dict[str, Any]] | None = None
    checkpoint_events: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    checkpoint_steps: dict[str, int] = field(default_factory=dict)
    lightning_steps: int | None = None


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


def _resumable(run_dir: Path) -> tuple[dict[str, list[dict[str, Any]]], dict[str, int], int | None]:
    """The ledgers and steps of the training checkpoints (fitted.pt aside) and the steps of a Lightning checkpoint."""
    import torch

    ledgers, at, steps = {}, {}, None
    for path in sorted((run_dir / "checkpoints").glob("*.pt")) if (run_dir / "checkpoints").is_dir() else []:
        if path.name == Path(FITTED).name:
            continue
        blob = torch.load(path, map_location="cpu", weights_only=False)
        if isinstance(blob, dict) and isinstance(blob.get("ledger"), dict):
            ledgers[path.name], at[path.name] = blob["ledger"]["events"], int(blob["step"])
    if (run_dir / LIGHTNING).is_file():
        steps = int(torch.load(run_dir / LIGHTNING, map_location="cpu", weights_only=False)["dpsyn"]["dp_steps"])
    return ledgers, at, steps


def journal_events(run_dir: Path) -> list[dict[str, Any]] | None:
    """The events of the run's write-ahead journal, or None without one."""
    path = run_dir / JOURNAL
    return read_json(path)["events"] if path.is_file() else None


def charge(events: list[dict[str, Any]], kind: str, key: str) -> int:
    """The sum of ``key`` (queries, steps, count) over the events of ``kind``."""
    return sum(int(e[key]) for e in events if e["kind"] == kind)


def lost_charges(killed: Killed) -> list[str]:
    """What the killed process's journal charges beyond what a rerun resumes from (the fitted state's ledger, else
    a training checkpoint's ledger, else its Lightning steps, else nothing): the rounds made after its last
    checkpoint. One phrase per event that holds more; empty when the checkpoint covers the journal."""
    from dpsyn.privacy.journal import charges_beyond, is_empty

    journal = [e for e in killed.journal_events or [] if not is_empty(e)]
    if killed.fitted_events is not None:
        covered = killed.fitted_events
    elif killed.checkpoint_events:
        covered = max(killed.checkpoint_events.values(), key=len)
    elif killed.lightning_steps is not None:
        covered = [{**e, "steps": min(e["steps"], killed.lightning_steps)} if e["kind"] == "sampled_gaussian" else e
                   for e in journal]
    else:  # no training state: the rerun starts from scratch
        covered = []
    return charges_beyond(journal, covered) if len(journal) >= len(covered) else []


def holds_every_charge(final: list[dict[str, Any]], journal: list[dict[str, Any]]) -> bool:
    """Whether ``final`` holds every charge of ``journal``: event by event, the same release record with at least
    its charges (:func:`dpsyn.privacy.journal.dominates`)."""
    from dpsyn.privacy.journal import dominates

    return len(final) >= len(journal) and all(dominates(f, j) for f, j in zip(final, journal))


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
                    if point.reached(target, versions):
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
    ledgers, at, steps = _resumable(run_dir)
    return Killed(point, time.monotonic() - t0, events, fitted_events, mtime, journal_events(run_dir), ledgers, at,
                  steps)


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
    # no charge lost on resume: every charge a killed process journalled is in the final ledger
    for killed in crash.killed:
        if killed.journal_events is not None:
            assert holds_every_charge(ledger["events"], killed.journal_events), (
                f"the final ledger lost charges the process killed at {killed.point} had journalled:\n"
                f"{ledger['events']}\nvs\n{killed.journal_events}")
    lost = [c for killed in crash.killed for c in lost_charges(killed)]
    if reference_events is not None and not lost:
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
