"""Evaluation protocol ids: what changes them, the store's protocol column and its backfill."""

from __future__ import annotations

import csv
import shutil
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from dpsyn.paths import REPO_DIR
from dpsyn.results import export, protocol
from dpsyn.results.protocol import protocol_id
from tests.conftest import compose_cfg

EXPERIMENTS = REPO_DIR / "experiments"


def _dpimagebench(cfg):
    """``cfg``'s metrics and dataset with ``metrics.protocol=dpimagebench`` (untyped: whether or not this checkout's
    schema has the protocol's node yet)."""
    cfg = OmegaConf.create({k: OmegaConf.to_container(cfg[k], resolve=True) for k in ("metrics", "dataset")})
    cfg.metrics.protocol = "dpimagebench"
    if "dpimagebench" not in cfg.metrics:  # the protocol's own settings (metrics.dpimagebench), their defaults
        cfg.metrics.dpimagebench = {"classifiers": ["resnet_110", "wrn_40_4", "resnext_29"], "epochs": 50,
                                    "n_train": 55000, "validation_rows": 5000, "selection": "real_val",
                                    "selection_eps": None, "width_divisor": 1}
    return cfg


def test_the_id_names_what_decides_acc_and_nothing_else() -> None:
    base = protocol_id(compose_cfg([]))
    assert base == "dpsyn:cnn_bn,x1,8ep,cosine,n18000"
    changed = {o: protocol_id(compose_cfg([o])) for o in (
        "metrics.classifier.name=wrn_40_4", "metrics.classifier.epochs=20", "metrics.classifier.ensemble=5",
        "metrics.n_samples=60000", "metrics.classifier.val_fraction=0.2", "metrics.classifier.lr=0.01",
        "metrics.classifier.schedule=constant",
        "metrics.split=validation")}
    assert changed["metrics.classifier.name=wrn_40_4"] == "dpsyn:wrn_40_4,x1,8ep,cosine,n18000"
    assert changed["metrics.n_samples=60000"] == "dpsyn:cnn_bn,x1,8ep,cosine,n54000"
    assert changed["metrics.classifier.schedule=constant"] == "dpsyn:cnn_bn,x1,8ep,constant,n18000"
    assert len(set(changed.values()) | {base}) == len(changed) + 1  # each change gives an id of its own
    dib = protocol_id(_dpimagebench(compose_cfg([])))
    assert dib == "dpimagebench:resnet_110+wrn_40_4+resnext_29,50ep,n20000,real_val5000"
    # what does not change how acc is measured keeps the id
    for same in (["seed=3"], ["eps=10"], ["method=dp_gan"], ["dataset=digits"], ["metrics.n_real=500"],
                 ["metrics.names.image=[fd]"], ["experiment=wu2023_table1_quick"], ["trainer=gpu"]):
        assert protocol_id(compose_cfg(same)) == base, same
    # tables: the scikit-learn classifiers and the rows they train on
    table = protocol_id(compose_cfg(["dataset=breast_cancer"]))
    assert table == "dpsyn:tabular[logreg+random_forest+gradient_boosting+mlp],n20000"
    assert protocol_id(compose_cfg(["dataset=breast_cancer", "metrics.tabular.classifiers=[logreg]"])) != table


def test_the_experiments_profiles_have_the_ids_their_yaml_says() -> None:
    assert (protocol_id(compose_cfg(["experiment=dpimagebench_fmnist_dib"]))
            == "dpimagebench:resnet_110+wrn_40_4+resnext_29,50ep,n55000,real_val5000")
    assert protocol_id(compose_cfg(["experiment=dpimagebench_fmnist_paper"])) == "dpsyn:cnn_bn,x1,20ep,cosine,n54000"
    assert protocol_id(compose_cfg(["experiment=lin2023_fig4_paper"])) == "dpsyn:wrn_40_4,x5,8ep,cosine,n45000"
    assert protocol_id(compose_cfg(["experiment=rajotte2020_grid_quick"])) == "dpsyn:cnn_bn,x1,8ep,cosine,n2700"


def test_legacy_defaults_stand_in_for_todays_only() -> None:
    """A row kept before ids was scored at the legacy defaults wherever its config sat at today's default."""
    today = OmegaConf.create({"n_samples": 20000, "classifier": {"name": "new_net", "ensemble": 1, "epochs": 30,
                                                                 "schedule": "cosine", "val_fraction": 0.1}})
    cfg = OmegaConf.create({"dataset": {"kind": "image"}, "metrics": {
        "n_samples": 20000, "classifier": {"name": "new_net", "ensemble": 5, "epochs": 30, "schedule": "cosine",
                                           "val_fraction": 0.1}}})
    legacy = protocol._legacy(cfg, today)
    assert legacy.metrics.classifier.name == "small_cnn" and legacy.metrics.classifier.epochs == 5
    assert legacy.metrics.classifier.schedule == "constant"
    assert legacy.metrics.n_samples == 10000
    assert legacy.metrics.classifier.ensemble == 5  # set by its experiment (at odds with today's default): kept


def test_backfill_gives_every_row_its_runs_protocol_and_a_rerun_changes_nothing(tmp_path: Path) -> None:
    for paper in ("dpimagebench", "rajotte2020"):
        (tmp_path / paper).mkdir()
        with open(EXPERIMENTS / paper / export.RESULTS_FILE, newline="") as f:
            rows = list(csv.DictReader(f))
        want = [r.pop("protocol") for r in rows]
        # a file from before protocol ids: no protocol column at all
        with open(tmp_path / paper / export.RESULTS_FILE, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=[c for c in export.COLUMNS if c != "protocol"], lineterminator="\n")
            w.writeheader()
            w.writerows(rows[:40])
        done = protocol.backfill(tmp_path)
        assert [r["protocol"] for r in export.read_rows(tmp_path / paper / export.RESULTS_FILE)] == want[:40]
        assert sum(done[tmp_path / paper / export.RESULTS_FILE].values()) == min(40, len(rows))
    before = {p: p.read_text() for p in tmp_path.glob("*/results.csv")}
    assert protocol.backfill(tmp_path) == {}
    assert {p: p.read_text() for p in tmp_path.glob("*/results.csv")} == before


@pytest.mark.parametrize("path", sorted(EXPERIMENTS.glob(f"*/{export.RESULTS_FILE}")), ids=lambda p: p.parent.name)
def test_every_kept_row_names_its_protocol(path: Path) -> None:
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        assert "protocol" in (reader.fieldnames or [])
        rows = list(reader)
    assert rows and all(r["protocol"] for r in rows)
    assert all(r["protocol"].split(":", 1)[0] in ("dpsyn", "dpimagebench") for r in rows)


def test_copy_of_the_store_round_trips_the_protocol(tmp_path: Path) -> None:
    shutil.copytree(EXPERIMENTS / "rajotte2020", tmp_path / "rajotte2020")
    recs = export.load_records(tmp_path)
    assert {r["protocol"] for r in recs} == {"dpsyn:small_cnn,x1,5ep,constant,n2700"}
