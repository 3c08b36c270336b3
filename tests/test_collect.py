"""experiments/long2021/measured/collect.py: the script that keeps paper 002's run rows in the repo."""

from __future__ import annotations

import csv
import json
import os
from pathlib import Path

import pytest

from tests.conftest import load_script

SCRIPT = Path(__file__).resolve().parents[1] / "experiments" / "long2021" / "measured" / "collect.py"


def _collect():
    return load_script(SCRIPT, "long2021_collect")


def test_help_prints_usage_and_writes_no_file(tmp_path: Path, monkeypatch, capsys) -> None:
    """`collect.py --help` once wrote a CSV named '--help' into the repository."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as e:
        _collect().main(["--help"])
    assert e.value.code == 0 and "run_dirs" in capsys.readouterr().out
    assert os.listdir(tmp_path) == []


def test_rows_of_finished_runs_replace_their_earlier_rows(tmp_path: Path) -> None:
    run = tmp_path / "g_pate_seed0"
    run.mkdir()
    result = {"method": "g_pate", "dataset": "fmnist", "eps": 1.0, "seed": 0, "metrics": {"acc": 0.4, "fd_fmnist": 90.0},
              "epsilon_spent": 0.99}
    (run / "result.json").write_text(json.dumps(result))
    unfinished = tmp_path / "unfinished"
    unfinished.mkdir()
    out = tmp_path / "rows.csv"
    collect = _collect()
    collect.main([str(out), str(run), str(unfinished)])
    result["metrics"]["acc"] = 0.5
    (run / "result.json").write_text(json.dumps(result))
    collect.main([str(out), str(run)])
    rows = list(csv.DictReader(out.open()))
    assert [(r["run"], r["acc"], r["fd"], r["metrics_split"]) for r in rows] == [("g_pate_seed0", "0.5", "90.0", "eval")]


def test_a_validation_run_and_a_dirty_tree_are_marked(tmp_path: Path) -> None:
    """A run scored on the validation split must not read as a test-split cell, nor uncommitted code as its sha."""
    run = tmp_path / "tuning_run"
    run.mkdir()
    (run / "result.json").write_text(json.dumps({"method": "g_pate", "metrics": {"acc": 0.6}, "metrics_split": "validation",
                                                 "git_sha": "abc", "git_dirty": True}))
    out = tmp_path / "rows.csv"
    _collect().main([str(out), str(run)])
    (row,) = csv.DictReader(out.open())
    assert (row["metrics_split"], row["git_sha"]) == ("validation", "abc-dirty")


def test_the_accountant_column_carries_what_the_method_says_it_charged(tmp_path: Path) -> None:
    """gs_wgan's provenance says how an iteration is charged; the row must keep it beside the ledger's accountant."""
    run = tmp_path / "gs_wgan_run"
    run.mkdir()
    said = "sampled-Gaussian rdp, one step an iteration"
    (run / "result.json").write_text(json.dumps({"method": "gs_wgan", "metrics": {"acc": 0.3}, "accountant": "rdp",
                                                 "sample_provenance": {"accountant": said}}))
    plain = tmp_path / "g_pate_run"
    plain.mkdir()
    (plain / "result.json").write_text(json.dumps({"method": "g_pate", "metrics": {"acc": 0.5}, "accountant": "pate"}))
    out = tmp_path / "rows.csv"
    _collect().main([str(out), str(run), str(plain)])
    rows = {r["run"]: r["accountant"] for r in csv.DictReader(out.open())}
    assert rows == {"gs_wgan_run": f"rdp; {said}", "g_pate_run": "pate"}
