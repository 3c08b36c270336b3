"""Keep a benchmark's rows in the repository (``docs/data/<name>.csv``), where ``make docs`` builds docs/speed.md's
tables from them: the rows of the same settings are replaced, the others kept, and each row names the CPU, torch and
the code it ran on."""

from __future__ import annotations

import csv
import subprocess
from pathlib import Path

import torch

from dpsyn.machine import cpu_model

DATA_DIR = Path(__file__).resolve().parents[1] / "docs" / "data"
PROVENANCE = ("cpu", "torch", "git_sha")


def keep(name: str, rows: list[dict], key: tuple[str, ...], path: Path | None = None) -> Path:
    """Write ``rows`` (dicts with the same keys) to ``docs/data/<name>.csv``; earlier rows that agree with a new one
    on ``key`` are dropped."""
    path = path or DATA_DIR / f"{name}.csv"
    sha = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                         cwd=Path(__file__).resolve().parent).stdout.strip()
    new = [{**{k: str(v) for k, v in r.items()}, "cpu": cpu_model(), "torch": torch.__version__, "git_sha": sha}
           for r in rows]
    fields = list(new[0])
    keys = {tuple(r[k] for k in key) for r in new}
    old = [r for r in csv.DictReader(path.open())] if path.is_file() else []
    kept = [r for r in old if tuple(r.get(k, "") for k in key) not in keys]
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=fields, lineterminator="\n", extrasaction="ignore")
        w.writeheader()
        w.writerows([*kept, *new])
    return path
