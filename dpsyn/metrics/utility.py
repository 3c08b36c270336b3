"""Downstream accuracy: train a classifier on synthetic data, select it on held-out synthetic data, test once.

The protocol the field gets wrong (G-PATE's code and DPImageBench's early versions pick the best epoch on the test
set): here the epoch is selected on a held-out split *of the synthetic data*, and the real evaluation split is
touched exactly once, by the selected model.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from dpsyn.lit.classifier import predict, train_classifier
from dpsyn.nets.classifier import SmallCNN


def downstream_accuracy(
    synthetic: tuple[np.ndarray, np.ndarray],
    test: tuple[np.ndarray, np.ndarray],
    *,
    num_classes: int,
    epochs: int,
    batch_size: int,
    lr: float,
    val_fraction: float,
    seed: int,
) -> dict[str, Any]:
    """Accuracy on ``test`` of a SmallCNN trained on ``synthetic`` images and labels.

    Returns:
        ``{"acc": test accuracy, "acc_synthetic_val": selection accuracy, "best_epoch": int}``.
    """
    x, y = synthetic
    if y is None:
        raise ValueError("downstream accuracy needs labelled synthetic data (the method returned no labels)")
    rng = np.random.default_rng(seed)
    perm = rng.permutation(len(x))
    n_val = max(1, int(round(len(x) * val_fraction)))
    val_idx, tr_idx = perm[:n_val], perm[n_val:]
    net = SmallCNN(channels=x.shape[1], num_classes=num_classes, resolution=x.shape[2])
    fit = train_classifier(
        net,
        (np.ascontiguousarray(x[tr_idx], dtype=np.float32), y[tr_idx].astype(np.int64)),
        (np.ascontiguousarray(x[val_idx], dtype=np.float32), y[val_idx].astype(np.int64)),
        epochs=epochs,
        batch_size=batch_size,
        lr=lr,
        seed=seed,
    )
    # the only contact with the real test split
    test_acc = float((predict(net, test[0]).argmax(1) == test[1]).mean())
    return {"acc": test_acc, "acc_synthetic_val": float(fit["val_acc"]), "best_epoch": int(fit["best_epoch"])}
