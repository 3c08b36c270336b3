"""Datasets bundled with scikit-learn (no files, no network): ``digits`` (images) and ``breast_cancer`` (table).

Both are split once into private (``1 - eval_fraction``) and eval (``eval_fraction``) parts, stratified by class,
with the fixed ``split_seed`` (not the run seed), so every run of a sweep is scored on the same eval rows.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np

from dpsyn.data.base import DataBundle, Split
from dpsyn.data.common import (
    DATASETS,
    cfg_get,
    check_config,
    finish_image_bundle,
    resize_images,
    resolve_class_names,
    select_classes,
    stratified_split,
    subsample,
)
from dpsyn.data.fmnist import FMNIST_CLASSES, fmnist_public_split

__all__ = ["DIGIT_CLASSES", "load_breast_cancer_dataset", "load_digits_dataset", "table_bundle"]

log = logging.getLogger(__name__)

DIGIT_CLASSES: tuple[str, ...] = tuple(str(d) for d in range(10))
_EXTRA_KEYS = ("eval_fraction",)


def _eval_fraction(cfg: Any) -> float:
    value = cfg_get(cfg, "eval_fraction", 0.2)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 < value < 1.0:
        raise ValueError(f"dataset.eval_fraction={value!r} must be a number in (0, 1)")
    return float(value)


def _private_eval_rows(
    cfg: Any, labels: np.ndarray, class_names: tuple[str, ...], *, seed: int, name: str
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, list[str]]:
    """Fixed stratified private/eval split, class subset, then the seeded ``n_private`` subsample.

    Returns:
        ``(private_rows, private_labels, eval_rows, eval_labels, class_names_in_label_order)``.
    """
    split_seed = int(cfg_get(cfg, "split_seed", 0))
    requested = cfg_get(cfg, "classes")
    classes = resolve_class_names(requested, class_names, dataset=name) if requested is not None else None
    private_all, eval_all = stratified_split(labels, 1.0 - _eval_fraction(cfg), split_seed)
    rows, private_labels, names = select_classes(labels[private_all], class_names, classes)
    keep = subsample(np.arange(len(rows)), cfg_get(cfg, "n_private"), seed, what=f"{name} private")
    eval_rows, eval_labels, _ = select_classes(labels[eval_all], class_names, classes)
    return private_all[rows][keep], private_labels[keep], eval_all[eval_rows], eval_labels, names


@DATASETS.register("digits")
def load_digits_dataset(cfg: Any, *, seed: int, data_dir: Path) -> DataBundle:
    """``digits``: scikit-learn's 1797 8x8 digits (values 0..16), bilinearly resized to 28x28, in [0, 1].

    Private = 80% and eval = 20% of the images (fixed stratified split). With ``public: fmnist_public`` the public
    data is Fashion-MNIST's public half: the "support assumption violated" case of paper 000 (public images share
    no class with the private ones).
    """
    from sklearn.datasets import load_digits

    name = str(cfg_get(cfg, "name"))
    check_config(
        cfg,
        kind="image",
        family="digits",
        public_options=("fmnist_public", None),
        class_names=DIGIT_CLASSES,
        extra_keys=_EXTRA_KEYS,
    )
    _eval_fraction(cfg)  # validate before any work
    digits = load_digits()
    images = digits.images.astype(np.float32)[:, None] / np.float32(16.0)  # (1797, 1, 8, 8), values 0..16
    x = resize_images(images, 28)
    labels = digits.target.astype(np.int64)
    p_rows, p_labels, e_rows, e_labels, names = _private_eval_rows(cfg, labels, DIGIT_CLASSES, seed=seed, name=name)
    private = Split(x[p_rows], p_labels, p_rows)
    eval_split = Split(x[e_rows], e_labels, e_rows)

    split_seed = int(cfg_get(cfg, "split_seed", 0))
    info: dict[str, Any] = {
        "source": "sklearn.datasets.load_digits (8x8, resized to 28x28)",
        "split_seed": split_seed,
        "seed": seed,
        "eval_fraction": _eval_fraction(cfg),
        "n_private": cfg_get(cfg, "n_private"),
        "classes": names,
        "public": cfg_get(cfg, "public"),
    }
    public = None
    if cfg_get(cfg, "public") == "fmnist_public":
        public, public_info = fmnist_public_split(
            data_dir, split_seed=split_seed, download=bool(cfg_get(cfg, "download", False))
        )
        info["public_files"] = public_info["files"]
    return finish_image_bundle(
        cfg,
        name=name,
        family="digits",
        private=private,
        eval_split=eval_split,
        classes=names,
        public=public,
        public_classes=list(FMNIST_CLASSES) if public is not None else None,
        info=info,
    )


@DATASETS.register("breast_cancer")
def load_breast_cancer_dataset(cfg: Any, *, seed: int, data_dir: Path) -> DataBundle:
    """``breast_cancer``: scikit-learn's Wisconsin diagnostic table (569 rows x 30 features), kind ``"table"``.

    Features are min-max scaled to [0, 1] with bounds taken from the whole dataset; as in PATE-GAN's protocol the
    bounds are treated as public domain knowledge (they are not spent from the privacy budget). Private = 80%,
    eval = 20% (fixed stratified split). Labels: 0 = malignant, 1 = benign (scikit-learn's ``target_names``).
    """
    from sklearn.datasets import load_breast_cancer

    del data_dir  # bundled with scikit-learn
    name = str(cfg_get(cfg, "name"))
    data = load_breast_cancer()
    class_names = tuple(str(c) for c in data.target_names)
    check_config(
        cfg,
        kind="table",
        family="breast_cancer",
        public_options=(None,),
        class_names=class_names,
        extra_keys=_EXTRA_KEYS,
    )
    _eval_fraction(cfg)  # validate before any work
    info = {
        "source": "sklearn.datasets.load_breast_cancer",
        "feature_names": [str(f) for f in data.feature_names],
        "scaling": "min-max over the whole dataset (bounds treated as public domain knowledge)",
    }
    return table_bundle(cfg, data.data, data.target, class_names, seed=seed, name=name, family="breast_cancer",
                        info=info)


def table_bundle(
    cfg: Any, x: np.ndarray, labels: np.ndarray, class_names: tuple[str, ...], *, seed: int, name: str, family: str,
    info: dict[str, Any],
) -> DataBundle:
    """A table's bundle: features min-max scaled to [0, 1] with bounds from all of ``x`` (public domain knowledge,
    as in PATE-GAN's protocol), the fixed stratified private/eval split, and ``info`` (source, features, scaling)
    completed with the split's settings and sizes."""
    x = x.astype(np.float64)
    low, high = x.min(axis=0), x.max(axis=0)
    x = np.clip((x - low) / np.where(high > low, high - low, 1.0), 0.0, 1.0).astype(np.float32)
    p_rows, p_labels, e_rows, e_labels, names = _private_eval_rows(
        cfg, np.asarray(labels).astype(np.int64), class_names, seed=seed, name=name
    )
    private = Split(x[p_rows], p_labels, p_rows)
    eval_split = Split(x[e_rows], e_labels, e_rows)
    info = {
        **info,
        "split_seed": int(cfg_get(cfg, "split_seed", 0)),
        "seed": seed,
        "eval_fraction": _eval_fraction(cfg),
        "n_private": cfg_get(cfg, "n_private"),
        "classes": names,
        "sizes": {"private": len(private), "eval": len(eval_split), "public": 0},
        "shape": [x.shape[1]],
    }
    log.info("dataset %s: private %d, eval %d, %d features", name, len(private), len(eval_split), x.shape[1])
    return DataBundle(
        name=name, kind="table", private=private, eval=eval_split, classes=names, family=family, public=None, info=info
    )
