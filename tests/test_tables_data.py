"""``kaggle_credit``: Kaggle's creditcard.csv read through the dataset registry, from tiny files in the true format.

The files are written as Kaggle ships them: a quoted header ``"Time","V1",...,"V28","Amount","Class"`` and the
``Class`` value quoted (``"0"`` / ``"1"``); a variant without any quotes is read the same way.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from omegaconf import DictConfig, OmegaConf

from dpsyn.config import load_group

from dpsyn.data import DATASETS, DataFormatError, load_dataset
from dpsyn.data.tables import KAGGLE_CREDIT_COLUMNS, KAGGLE_CREDIT_URL

CONF_DIR = Path(__file__).resolve().parents[1] / "conf" / "dataset"
N_LEGIT, N_FRAUD = 52, 8


def dataset_cfg(**overrides: object) -> DictConfig:
    """The shipped ``conf/dataset/kaggle_credit.yaml`` with overrides, in struct mode as Hydra composes it."""
    cfg = OmegaConf.merge(OmegaConf.to_container(load_group("dataset", "kaggle_credit")), overrides)  # untyped
    OmegaConf.set_struct(cfg, True)
    return cfg


def write_creditcard_csv(path: Path, *, quoted: bool = True, seed: int = 0) -> dict[str, np.ndarray]:
    """A tiny ``creditcard.csv`` (N_LEGIT + N_FRAUD rows, shuffled) in Kaggle's format; returns its columns."""
    rng = np.random.default_rng(seed)
    n = N_LEGIT + N_FRAUD
    labels = rng.permutation(np.r_[np.zeros(N_LEGIT, np.int64), np.ones(N_FRAUD, np.int64)])
    time = np.sort(rng.integers(0, 172_792, size=n)).astype(np.float64)  # seconds since the first transaction
    v = rng.normal(size=(n, 28)) + 3.0 * labels[:, None]  # frauds are shifted: a classifier can find them
    amount = np.round(rng.exponential(80.0, size=n), 2)
    q = '"' if quoted else ""
    lines = [",".join(f"{q}{c}{q}" for c in KAGGLE_CREDIT_COLUMNS)]
    for i in range(n):
        values = [f"{time[i]:.0f}", *(repr(float(a)) for a in v[i]), f"{amount[i]:.2f}", f"{q}{labels[i]}{q}"]
        lines.append(",".join(values))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return {"time": time, "v": v, "amount": amount, "labels": labels}


def _minmax(a: np.ndarray) -> np.ndarray:
    return (a - a.min(axis=0)) / (a.max(axis=0) - a.min(axis=0))


def test_kaggle_credit_is_registered_with_a_yaml() -> None:
    assert "kaggle_credit" in DATASETS.names()
    cfg = load_group("dataset", "kaggle_credit")
    assert cfg.kind == "table" and cfg.family == "kaggle_credit" and cfg.path is None


@pytest.mark.parametrize("quoted", [True, False])
def test_kaggle_credit_from_the_default_path(tmp_path: Path, quoted: bool) -> None:
    cols = write_creditcard_csv(tmp_path / "kaggle_credit" / "creditcard.csv", quoted=quoted)
    bundle = load_dataset(dataset_cfg(), seed=0, data_dir=tmp_path)
    assert bundle.kind == "table" and bundle.family == "kaggle_credit" and bundle.public is None
    assert bundle.classes == ["legit", "fraud"] and bundle.shape == (29,)
    assert len(bundle.private) == 48 and len(bundle.eval) == 12
    assert bundle.private.x.dtype == np.float32 and bundle.private.y.dtype == np.int64

    # stratified: each class split 80/20 (rounded), the two parts disjoint and covering the file
    assert np.bincount(bundle.private.y).tolist() == [42, 6]
    assert np.bincount(bundle.eval.y).tolist() == [10, 2]
    rows = np.concatenate([bundle.private.index, bundle.eval.index])
    assert sorted(rows.tolist()) == list(range(N_LEGIT + N_FRAUD))
    assert np.array_equal(bundle.private.y, cols["labels"][bundle.private.index])
    assert np.array_equal(bundle.eval.y, cols["labels"][bundle.eval.index])

    # features: V1..V28 and Amount, min-max scaled over the whole file; Time dropped
    x = np.concatenate([bundle.private.x, bundle.eval.x])[np.argsort(rows)]
    assert x.min() >= 0.0 and x.max() <= 1.0
    assert np.allclose(x.min(axis=0), 0.0) and np.allclose(x.max(axis=0), 1.0)
    want = _minmax(np.column_stack([cols["v"], cols["amount"]]))
    np.testing.assert_allclose(x, want, atol=1e-6)
    assert not any(np.allclose(x[:, j], _minmax(cols["time"]), atol=1e-6) for j in range(x.shape[1]))
    info = json.loads(json.dumps(bundle.info))  # result.json must be able to record it
    assert info["dropped_columns"] == ["Time"] and info["feature_names"][-1] == "Amount"
    assert info["sizes"] == {"private": 48, "eval": 12, "public": 0}


def test_kaggle_credit_path_split_seed_and_subsample(tmp_path: Path) -> None:
    csv = tmp_path / "elsewhere" / "cc.csv"
    write_creditcard_csv(csv)
    a = load_dataset(dataset_cfg(path=str(csv)), seed=0, data_dir=tmp_path / "empty")
    b = load_dataset(dataset_cfg(path=str(csv)), seed=7, data_dir=tmp_path / "empty")
    assert np.array_equal(a.eval.index, b.eval.index)  # the split depends on split_seed only
    c = load_dataset(dataset_cfg(path=str(csv), split_seed=1), seed=0, data_dir=tmp_path)
    assert not np.array_equal(a.eval.index, c.eval.index)
    sub = load_dataset(dataset_cfg(path=str(csv), n_private=20), seed=3, data_dir=tmp_path)
    assert len(sub.private) == 20 and set(sub.private.index) <= set(a.private.index)
    assert np.array_equal(sub.eval.index, a.eval.index)
    fraud = load_dataset(dataset_cfg(path=str(csv), classes=["fraud"]), seed=0, data_dir=tmp_path)
    assert fraud.classes == ["fraud"] and set(fraud.private.y.tolist()) == {0} and len(fraud.private) == 6


def test_missing_file_names_the_download_page_and_the_expected_path(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError) as info:
        load_dataset(dataset_cfg(), seed=0, data_dir=tmp_path)
    message = str(info.value)
    assert KAGGLE_CREDIT_URL == "https://www.kaggle.com/datasets/mlg-ulb/creditcardfraud"
    assert KAGGLE_CREDIT_URL in message and "creditcard.csv" in message
    assert str(tmp_path / "kaggle_credit" / "creditcard.csv") in message
    with pytest.raises(FileNotFoundError, match="nope.csv does not exist.*kaggle.com") as info:
        load_dataset(dataset_cfg(path=str(tmp_path / "nope.csv")), seed=0, data_dir=tmp_path)
    assert str(tmp_path / "kaggle_credit" / "creditcard.csv") in str(info.value)  # the default place is named too


@pytest.mark.parametrize(
    ("overrides", "phrase"),
    [
        ({"download": True}, "dataset.download=true is not available.*allowed: false"),
        ({"resolution": 28}, "dataset.resolution=28 .* allowed: null"),
        ({"classes": ["fraudulent"]}, "unknown class 'fraudulent'.*legit, fraud"),
        ({"eval_fraction": 0.0}, "dataset.eval_fraction=0.0"),
        ({"path": 3}, "dataset.path=3"),
    ],
)
def test_config_errors_fail_before_reading(tmp_path: Path, overrides: dict, phrase: str) -> None:
    with pytest.raises(ValueError, match=phrase):
        load_dataset(dataset_cfg(**overrides), seed=0, data_dir=tmp_path)  # no file there: the config fails first


@pytest.mark.parametrize(
    ("mutate", "phrase"),
    [
        (lambda lines: [lines[0].replace('"Time",', ""), *lines[1:]], "header"),
        (lambda lines: [lines[0], lines[1].replace(',"0"', ',"2"').replace(',"1"', ',"2"'), *lines[2:]], "Class"),
        (lambda lines: [lines[0], "1,2,3", *lines[2:]], "creditcard.csv"),
        (lambda lines: [lines[0], lines[1].replace(",", ",abc", 1), *lines[2:]], "creditcard.csv"),
        (lambda lines: lines[:1], "no data rows"),
    ],
)
def test_corrupt_files_raise_data_format_error(tmp_path: Path, mutate, phrase: str) -> None:
    csv = tmp_path / "cc.csv"
    write_creditcard_csv(csv)
    csv.write_text("\n".join(mutate(csv.read_text().splitlines())) + "\n")
    with pytest.raises(DataFormatError, match=phrase):
        load_dataset(dataset_cfg(path=str(csv)), seed=0, data_dir=tmp_path)


def test_real_run_on_kaggle_credit_scores_auroc(make_cfg, tmp_path: Path) -> None:
    """train.py's run end to end on the tiny file: method=real, the tabular AUROC metric on the eval rows."""
    from dpsyn.task import run

    csv = tmp_path / "cc.csv"
    write_creditcard_csv(csv)
    cfg = make_cfg("method=real", "dataset=kaggle_credit", f"dataset.path={csv}", "metrics.n_samples=200",
                   "metrics.tabular.classifiers=[logreg,random_forest]")
    result = run(cfg, tmp_path / "run")
    assert result["dataset"] == "kaggle_credit" and result["n_private"] == 48
    assert result["metrics"]["auroc"] > 0.8  # frauds are shifted by 3 std in V1..V28: easy to find
    assert result["metric_info"]["eval_reads"][0]["n"] == 12
    assert (tmp_path / "run" / "result.json").is_file()
