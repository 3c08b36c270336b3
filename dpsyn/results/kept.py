"""Measurements kept in the repository, beside the results: ``docs/data/<name>.csv``, which the benchmarks' and the
audit's ``keep`` options write and :mod:`dpsyn.results.docs` turns into the tables of docs/ (``make docs``).

Each row names the CPU, torch and the code it ran on. Writing a name again replaces the rows that agree with a new
row on ``key`` and keeps the others (``key=()`` replaces them all)."""

from __future__ import annotations

import csv
import io
import subprocess
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from dpsyn.machine import cpu_model
from dpsyn.paths import IN_CHECKOUT, REPO_DIR, require_checkout
from dpsyn.results.io import atomic_write_text

DATA_DIR = REPO_DIR / "docs" / "data"
PROVENANCE = ("cpu", "torch", "git_sha")


def git_head() -> str:
    """The checkout's HEAD commit, or "" outside a git checkout (an installed dpsyn included)."""
    if not IN_CHECKOUT:
        return ""
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=REPO_DIR, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return ""
    return out.stdout.strip() if out.returncode == 0 else ""


def provenance() -> dict[str, str]:
    try:
        torch_version = version("torch")
    except PackageNotFoundError:
        torch_version = ""
    return {"cpu": cpu_model(), "torch": torch_version, "git_sha": git_head()}


def keep_rows(name: str, rows: list[dict[str, Any]], *, key: tuple[str, ...], path: Path | None = None,
              **given: str) -> Path:
    """Write ``rows`` (dicts with the same keys, in column order) to ``docs/data/<name>.csv`` with their provenance
    (``given`` overrides it: ``cpu=``, ``git_sha=``); earlier rows that agree with a new one on ``key`` go."""
    if path is None:  # docs/data is the repository's
        require_checkout(f"keeping {name}.csv")
        path = DATA_DIR / f"{name}.csv"
    prov = {**provenance(), **given}
    new = [{**{k: str(v) for k, v in r.items()}, **prov} for r in rows]
    keys = {tuple(r[k] for k in key) for r in new}
    old = list(csv.DictReader(path.open())) if path.is_file() else []
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=list(new[0]), lineterminator="\n", extrasaction="ignore")
    w.writeheader()
    w.writerows([*(r for r in old if tuple(r.get(k, "") for k in key) not in keys), *new])
    path.parent.mkdir(parents=True, exist_ok=True)
    return atomic_write_text(path, buf.getvalue())
