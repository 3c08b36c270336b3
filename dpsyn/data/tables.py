"""Real (non-embedded) tabular datasets read from their official on-disk formats: ``kaggle_credit``.

- ``kaggle_credit``: the Kaggle credit card fraud table (ULB machine learning group; 284,807 transactions, 492
  frauds), G-PATE's (paper 002) tabular dataset. Read from Kaggle's ``creditcard.csv`` (31 columns ``"Time"``,
  ``"V1"`` .. ``"V28"``, ``"Amount"``, ``"Class"``; quoted header, ``Class`` the quoted string ``"0"`` / ``"1"``)
  at ``dataset.path``, by default ``${paths.data_dir}/kaggle_credit/creditcard.csv``. Kaggle needs an account, so
  the file is never downloaded by dpsyn: a missing file fails with a message saying where to get it and where to
  put it.
"""

from __future__ import annotations

import csv
import logging
import warnings
from pathlib import Path
from typing import Any

import numpy as np

from dpsyn.data.base import DataBundle
from dpsyn.data.common import DATASETS, cfg_get, check_config
from dpsyn.data.idx import DataFormatError
from dpsyn.data.sklearn_sets import _eval_fraction, table_bundle

__all__ = [
    "KAGGLE_CREDIT_CLASSES",
    "KAGGLE_CREDIT_COLUMNS",
    "KAGGLE_CREDIT_FEATURES",
    "KAGGLE_CREDIT_FILE",
    "KAGGLE_CREDIT_URL",
    "load_kaggle_credit",
    "read_creditcard_csv",
]

log = logging.getLogger(__name__)

KAGGLE_CREDIT_URL = "https://www.kaggle.com/datasets/mlg-ulb/creditcardfraud"
KAGGLE_CREDIT_FILE = "kaggle_credit/creditcard.csv"
"""Default location of ``creditcard.csv``, relative to ``${paths.data_dir}``."""
KAGGLE_CREDIT_FEATURES: tuple[str, ...] = (*(f"V{i}" for i in range(1, 29)), "Amount")
"""The 29 features G-PATE uses (``Time`` is dropped)."""
KAGGLE_CREDIT_COLUMNS: tuple[str, ...] = ("Time", *KAGGLE_CREDIT_FEATURES, "Class")
"""The 31 columns of Kaggle's ``creditcard.csv``, in file order."""
KAGGLE_CREDIT_CLASSES: tuple[str, ...] = ("legit", "fraud")
"""Label 0 = legitimate transaction, 1 = fraud (the file's ``Class`` column)."""


def _missing_hint(default: Path) -> str:
    return (
        f"download creditcard.csv from {KAGGLE_CREDIT_URL} (needs a Kaggle account; e.g. `kaggle datasets download "
        f"-d mlg-ulb/creditcardfraud` then unzip creditcardfraud.zip) and put it at {default}, or point "
        "dataset.path at the file"
    )


def read_creditcard_csv(path: str | Path) -> tuple[np.ndarray, np.ndarray]:
    """Read Kaggle's ``creditcard.csv``: the 29 features (``Time`` dropped) and the ``Class`` labels.

    The header names and the values may be quoted or not (Kaggle's file quotes the header and ``Class``). The values
    are parsed by numpy's C reader (``np.loadtxt``, which reads the file in chunks), so the 150 MB file needs about
    70 MB of memory beyond the result.

    Args:
        path: The CSV file.

    Returns:
        ``(x, y)``: float64 (N, 29) features in :data:`KAGGLE_CREDIT_FEATURES` order, int64 (N,) labels in {0, 1}.

    Raises:
        FileNotFoundError: if ``path`` is not a file.
        DataFormatError: on another header, an unparsable or non-finite value, or a label outside {0, 1}.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist")
    with path.open(newline="", encoding="utf-8") as f:
        header = next(csv.reader(f), None)
        names = [h.strip() for h in header] if header else []
        if sorted(names) != sorted(KAGGLE_CREDIT_COLUMNS) or len(names) != len(KAGGLE_CREDIT_COLUMNS):
            raise DataFormatError(
                f"{path}: header {names!r} is not Kaggle creditcard.csv's; expected the 31 columns "
                f"{', '.join(KAGGLE_CREDIT_COLUMNS)}"
            )
        try:
            with warnings.catch_warnings():
                warnings.filterwarnings("ignore", "loadtxt: input contained no data", UserWarning)
                table = np.loadtxt(f, delimiter=",", quotechar='"', dtype=np.float64, ndmin=2)
        except ValueError as err:
            raise DataFormatError(f"{path}: not a readable creditcard.csv ({err})") from err
    if table.size == 0:
        raise DataFormatError(f"{path}: no data rows")
    if table.shape[1] != len(names):
        raise DataFormatError(f"{path}: rows have {table.shape[1]} values, the header {len(names)}")
    if not np.isfinite(table).all():
        raise DataFormatError(f"{path}: non-finite values")
    labels = table[:, names.index("Class")]
    if not np.isin(labels, (0.0, 1.0)).all():
        bad = np.unique(labels[~np.isin(labels, (0.0, 1.0))])[:5]
        raise DataFormatError(f"{path}: Class values {bad.tolist()} are not 0 or 1")
    x = table[:, [names.index(c) for c in KAGGLE_CREDIT_FEATURES]]
    return x, labels.astype(np.int64)


def _csv_path(cfg: Any, data_dir: Path) -> tuple[Path, Path]:
    """(the file to read, the default location) from ``dataset.path`` (null = the default)."""
    default = Path(data_dir) / KAGGLE_CREDIT_FILE
    value = cfg_get(cfg, "path")
    if value is None:
        return default, default
    if not isinstance(value, str) or not value:
        raise ValueError(
            f"dataset.path={value!r} must be null (${{paths.data_dir}}/{KAGGLE_CREDIT_FILE}) or a file path"
        )
    return Path(value).expanduser(), default


@DATASETS.register("kaggle_credit")
def load_kaggle_credit(cfg: Any, *, seed: int, data_dir: Path) -> DataBundle:
    """``kaggle_credit``: Kaggle's credit card fraud table (284,807 rows x 29 features), kind ``"table"``.

    Features V1..V28 and Amount (``Time`` dropped, as in G-PATE), min-max scaled to [0, 1] with bounds taken from
    the whole file; as for ``breast_cancer`` (PATE-GAN's protocol) the bounds are treated as public domain knowledge
    and not spent from the privacy budget. Private = ``1 - eval_fraction``, eval = ``eval_fraction`` of each class
    (fixed stratified split with ``split_seed``), then the optional seeded ``n_private`` subsample. Labels:
    0 = legit, 1 = fraud.

    Raises:
        ValueError: on a config error (before the file is read).
        FileNotFoundError: if the CSV is missing (the message names the download page and where to put the file).
        DataFormatError: if the CSV is not in Kaggle's format.
    """
    name = str(cfg_get(cfg, "name"))
    check_config(
        cfg,
        kind="table",
        family="kaggle_credit",
        public_options=(None,),
        class_names=KAGGLE_CREDIT_CLASSES,
        extra_keys=("eval_fraction", "path"),
    )
    _eval_fraction(cfg)  # validate before any work
    if cfg_get(cfg, "download", False):
        raise ValueError(
            f"dataset.download=true is not available for dataset {name!r} (Kaggle needs an account; get the file "
            f"from {KAGGLE_CREDIT_URL}); allowed: false"
        )
    path, default = _csv_path(cfg, data_dir)
    if not path.is_file():
        raise FileNotFoundError(f"Kaggle credit card fraud data not found: {path} does not exist; "
                                f"{_missing_hint(default)}")
    x, labels = read_creditcard_csv(path)
    info = {
        "source": f"Kaggle creditcard.csv ({KAGGLE_CREDIT_URL})",
        "files": {"creditcard.csv": str(path)},
        "n_rows": len(x),
        "feature_names": list(KAGGLE_CREDIT_FEATURES),
        "dropped_columns": ["Time"],
        "scaling": "min-max over the whole file (bounds treated as public domain knowledge)",
    }
    return table_bundle(cfg, x, labels, KAGGLE_CREDIT_CLASSES, seed=seed, name=name, family="kaggle_credit",
                        info=info)
