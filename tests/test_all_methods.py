"""Every registered method, end to end through ``dpsyn.cli.train.run`` with ``trainer=debug``, in seconds each.

Each case runs on the cheapest dataset the method supports with the tiny overrides of tests/tiny.py, and checks what
every run must leave: result.json, samples.npz and privacy.json, with the epsilon spent within the target for every
method that is not a non-private reference. In ``make test`` (not marked slow).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from dpsyn.methods import METHODS
from tests.tiny import TINY

EPS = 1.0
BASE = ("trainer=debug", "logger=none", f"eps={EPS}", "privacy.deterministic_noise=true",
        "trainer.enable_progress_bar=false")


def test_tiny_overrides_cover_every_registered_method() -> None:
    assert set(TINY) == set(METHODS.names())
    for name, overrides in TINY.items():
        assert f"method={name}" in overrides and any(o.startswith("dataset=") for o in overrides), name


@pytest.mark.parametrize("method", METHODS.names())
def test_every_method_runs_end_to_end_with_debug_trainer(method: str, make_cfg, tmp_path: Path) -> None:
    from dpsyn.cli.train import run

    cfg = make_cfg(*BASE, *TINY[method])
    run_dir = tmp_path / "run"
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
