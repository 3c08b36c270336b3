"""Every registered method, end to end through ``dpsyn.task.run`` with ``trainer=debug``, in seconds each.

Each case runs on the cheapest dataset the method supports with the tiny overrides of tests/tiny.py, and checks what
every run must leave: result.json, samples.npz and privacy.json, with the epsilon spent within the target for every
method that is not a non-private reference. In ``make test`` (not marked slow).

The same runs are pinned: with ``privacy.deterministic_noise=true`` each one's samples and ledger events hash to the
digest recorded in tests/data/pinned_runs.csv for this machine (CPU model, torch version, intra-op threads; floating
point differs between them, so another machine's rows are not compared). A refactoring must leave every digest
unchanged; a change that means to alter a method's output re-records its row:
``DPSYN_RECORD_PINNED=1 make test`` (or ``pytest tests/test_all_methods.py``), then commit the CSV.
"""

from __future__ import annotations

import csv
import fcntl
import hashlib
import json
import math
import os
from pathlib import Path

import numpy as np
import pytest

from dpsyn.methods import METHODS
from tests.tiny import TINY

PINNED = Path(__file__).parent / "data" / "pinned_runs.csv"
PINNED_COLUMNS = ("machine", "method", "digest")

EPS = 1.0
BASE = ("trainer=debug", "logger=none", f"eps={EPS}", "privacy.deterministic_noise=true",
        "trainer.enable_progress_bar=false")


def test_tiny_overrides_cover_every_registered_method() -> None:
    assert set(TINY) == set(METHODS.names())
    for name, overrides in TINY.items():
        assert f"method={name}" in overrides and any(o.startswith("dataset=") for o in overrides), name


@pytest.mark.parametrize("method", METHODS.names())
def test_every_method_runs_end_to_end_with_debug_trainer(method: str, make_cfg, tmp_path: Path) -> None:
    check_end_to_end(method, make_cfg, tmp_path / "run")
    _check_pinned(method, tmp_path / "run")


def check_end_to_end(method: str, make_cfg, run_dir: Path) -> None:
    """The budget harness: ``method``'s tiny run (its class's ``tiny``) leaves result.json, samples.npz and
    privacy.json, agreeing with each other, and spends at most its target (a reference: inf, flagged)."""
    from dpsyn.task import run

    cfg = make_cfg(*BASE, *METHODS.get(method).tiny)
    result = run(cfg, run_dir)

    for name in ("result.json", "samples.npz", "privacy.json", "config.yaml"):
        assert (run_dir / name).is_file(), name
    saved = json.loads((run_dir / "result.json").read_text())
    assert saved["method"] == method and saved["dataset"] == cfg.dataset.name and saved["eps"] == EPS
    assert float(saved["epsilon_spent"]) == result["epsilon_spent"]  # json writes inf as "inf"
    ledger = json.loads((run_dir / "privacy.json").read_text())
    assert ledger["events"] == saved["privacy_events"]
    with np.load(run_dir / "samples.npz") as samples:
        assert len(samples["x"]) == int(cfg.metrics.n_samples) == saved["n_samples"]
        assert np.all(np.isfinite(samples["x"]))
    reference = METHODS.get(method).reference
    assert saved["non_private_reference"] is reference
    if reference:
        assert math.isinf(float(saved["epsilon_spent"]))
    else:
        assert 0 <= float(saved["epsilon_spent"]) <= EPS * (1 + 1e-9), saved["epsilon_spent"]


def _machine() -> str:
    import torch

    from dpsyn.machine import cpu_model

    return f"{cpu_model()} | torch {torch.__version__} | {torch.get_num_threads()} threads"


def run_digest(run_dir: Path) -> str:
    """sha256 of a run's samples (every array of samples.npz, its dtype and shape) and its ledger events."""
    h = hashlib.sha256()
    with np.load(run_dir / "samples.npz") as samples:
        for key in sorted(samples.files):
            a = np.ascontiguousarray(samples[key])
            h.update(f"{key}:{a.dtype.str}:{a.shape}".encode())
            h.update(a.tobytes())
    events = json.loads((run_dir / "privacy.json").read_text())["events"]
    h.update(json.dumps(events, sort_keys=True).encode())
    return h.hexdigest()


def _check_pinned(method: str, run_dir: Path) -> None:
    machine, digest = _machine(), run_digest(run_dir)
    if os.environ.get("DPSYN_RECORD_PINNED") == "1":
        PINNED.parent.mkdir(exist_ok=True)
        with open(PINNED, "a+", newline="") as fh:  # xdist workers record at once: one lock, one rewrite
            fcntl.flock(fh, fcntl.LOCK_EX)
            fh.seek(0)
            rows = [r for r in csv.DictReader(fh) if (r["machine"], r["method"]) != (machine, method)]
            rows.append({"machine": machine, "method": method, "digest": digest})
            fh.seek(0)
            fh.truncate()
            w = csv.DictWriter(fh, fieldnames=PINNED_COLUMNS, lineterminator="\n")
            w.writeheader()
            w.writerows(sorted(rows, key=lambda r: (r["machine"], r["method"])))
        return
    rows = list(csv.DictReader(PINNED.open())) if PINNED.is_file() else []
    pinned = {r["method"]: r["digest"] for r in rows if r["machine"] == machine}
    if method not in pinned:
        pytest.skip(f"no pinned digest of {method} for {machine!r} (DPSYN_RECORD_PINNED=1 records one)")
    assert digest == pinned[method], (
        f"{method}: the pinned run's samples or ledger changed on {machine!r}; if that is meant, re-record "
        "(DPSYN_RECORD_PINNED=1)")


def _public_methods() -> list:
    return [pytest.param(m, marks=() if m in ("dp_gan_ft", "dp_mepf") else pytest.mark.slow)
            for m in METHODS.names() if METHODS.get(m).needs_public]


@pytest.mark.parametrize("method", _public_methods())
def test_a_run_does_not_depend_on_whether_the_public_models_were_cached(method: str, make_cfg, tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """Training the public models (a cache miss) draws from the global generators; loading them does not. A run must
    be the same either way: here the load is followed by draws, as a miss would make them."""
    import torch

    from dpsyn.methods.base import Method
    from dpsyn.task import run

    cfg = make_cfg(*BASE, *TINY[method])
    run(cfg, tmp_path / "hit")
    load = Method.public_models

    def load_as_a_miss(self):
        models = load(self)
        torch.rand(1000), np.random.rand(1000)  # what training them would have drawn
        return models

    monkeypatch.setattr(Method, "public_models", load_as_a_miss)
    run(cfg, tmp_path / "miss")
    assert run_digest(tmp_path / "hit") == run_digest(tmp_path / "miss")
