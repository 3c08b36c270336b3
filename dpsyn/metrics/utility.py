"""Downstream accuracy: train classifiers on synthetic data, select them on held-out synthetic data, test once.

The protocol the field gets wrong (G-PATE's code and DPImageBench's early versions pick the best epoch on the test
set): here the synthetic data are split once into a train part and a held-out part; each classifier's epoch is
selected on the held-out *synthetic* part, and the real test split, sealed in a
:class:`~dpsyn.metrics.sealed.SealedSplit`, is read exactly once, by the selected model or ensemble.

Classifiers (``classifier=``): ``cnn_bn`` (:class:`~dpsyn.nets.classifier.BNCNN`, the default, for 28x28/32x32
data), ``small_cnn`` (:class:`~dpsyn.nets.classifier.SmallCNN`, the default before, kept for old rows) and
``wrn_40_4`` (:class:`~dpsyn.nets.wrn.WideResNet` depth 40 width 4, PE's CIFAR-10 classifier). PE reports an
ensemble of 5: ``ensemble=k`` trains k members on the same synthetic train part, each with its own seed, and
predicts with the mean of their logits (not a vote).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
from torch import nn

from dpsyn.lit.classifier import predict, train_classifier
from dpsyn.metrics.sealed import SealedSplit, TestSetReuseError, accuracy_from_logits, seal
from dpsyn.nets.classifier import BNCNN, SmallCNN
from dpsyn.nets.wrn import wrn_40_4

log = logging.getLogger(__name__)

#: classifier name -> builder(channels, num_classes, resolution) of a fresh, untrained network
CLASSIFIERS: dict[str, Callable[[int, int, int], nn.Module]] = {
    "small_cnn": lambda channels, num_classes, resolution: SmallCNN(
        channels=channels, num_classes=num_classes, resolution=resolution
    ),
    "cnn_bn": lambda channels, num_classes, resolution: BNCNN(
        channels=channels, num_classes=num_classes, resolution=resolution
    ),
    "wrn_40_4": lambda channels, num_classes, resolution: wrn_40_4(num_classes=num_classes, channels=channels),
}


def build_classifier(name: str, *, channels: int, num_classes: int, resolution: int) -> nn.Module:
    """A fresh downstream classifier.

    Args:
        name: a key of :data:`CLASSIFIERS` (``small_cnn`` or ``wrn_40_4``).
        channels: input channels.
        num_classes: output classes.
        resolution: input side in pixels.

    Returns:
        The untrained network.

    Raises:
        ValueError: for an unknown name.
    """
    if name not in CLASSIFIERS:
        raise ValueError(f"unknown downstream classifier {name!r}; choose one of {sorted(CLASSIFIERS)}")
    return CLASSIFIERS[name](channels, num_classes, resolution)


def ensemble_logits(
    nets: Sequence[nn.Module], x: np.ndarray, *, batch_size: int = 1024, device: str | torch.device | None = None
) -> np.ndarray:
    """Mean of the members' logits (PE's ensemble; averaging logits, not votes).

    Args:
        nets: the trained members.
        x: (N, C, H, W) float32 inputs.
        batch_size: prediction batch size.
        device: where to run the members (None or ``"cpu"``: the CPU).

    Returns:
        (N, num_classes) float64 averaged logits.

    Raises:
        ValueError: if ``nets`` is empty.
    """
    if len(nets) == 0:
        raise ValueError("an ensemble needs at least one member")
    x = np.ascontiguousarray(x, dtype=np.float32)  # the same object when it is already float32 and contiguous
    return np.mean([predict(n, x, batch_size=batch_size, device=device) for n in nets], axis=0)


def downstream_accuracy(
    synthetic: tuple[np.ndarray, np.ndarray],
    test: SealedSplit | tuple[np.ndarray, np.ndarray],
    *,
    num_classes: int,
    epochs: int,
    batch_size: int,
    lr: float,
    val_fraction: float,
    seed: int,
    classifier: str = "small_cnn",
    ensemble: int = 1,
    limit_train_batches: int | float | None = None,
    device: str | torch.device | None = None,
    progress: bool = True,
    schedule: str = "constant",
) -> dict[str, Any]:
    """Accuracy on the real test split of classifiers trained and selected on synthetic data only.

    The synthetic set is split once (seeded by ``seed``) into a train part and a held-out part of ``val_fraction``.
    Member ``k`` (``k = 0..ensemble-1``) is trained on the train part with seed ``seed + k`` and keeps the weights of
    its epoch with the best accuracy on the held-out part. The test split is then read once, for the ensemble's
    averaged logits.

    Args:
        synthetic: ``(x, y)``: (N, C, H, W) images in [0, 1] and (N,) int labels.
        test: the real evaluation split, as a :class:`SealedSplit` (with a read left) or an ``(x, y)`` pair
            (sealed here, one read).
        num_classes: number of classes.
        epochs: training epochs per member.
        batch_size: training batch size.
        lr: Adam learning rate.
        val_fraction: fraction of the synthetic data held out for model selection, in (0, 1).
        seed: seed of the split and of member 0.
        classifier: a key of :data:`CLASSIFIERS`.
        ensemble: number of members (PE reports 5).
        limit_train_batches: passed to the Lightning trainer (for smoke runs).
        device: where to predict (None: the CPU via :func:`dpsyn.lit.classifier.predict`; ``"cuda"`` for WRN at
            scale). Training uses Lightning's ``accelerator="auto"``.
        progress: show Lightning's progress bar.
        schedule: the learning-rate schedule, ``constant`` or ``cosine`` (:class:`dpsyn.lit.classifier.ClassifierModule`).

    Returns:
        ``acc`` (test accuracy of the ensemble), ``acc_synthetic_val`` (selection accuracy: the ensemble's accuracy on
        the held-out synthetic part), ``best_epoch`` (member 0's selected epoch), ``best_epochs`` and
        ``member_val_accs`` (per member), ``member_seeds``, ``classifier``, ``ensemble``, ``n_train``, ``n_val``,
        ``n_test``, ``test_reads`` (reads of the sealed split so far; 1 when it was sealed here).

    Raises:
        ValueError: for missing or out-of-range labels, a bad ``val_fraction``/``ensemble``, too few synthetic
            examples, or an unknown classifier.
        TestSetReuseError: if ``test`` is a sealed split with no read left (checked before any training).
    """
    x, y = synthetic
    if y is None:
        raise ValueError("downstream accuracy needs labelled synthetic data (the method returned no labels)")
    if len(x) != len(y):
        raise ValueError(f"synthetic x has {len(x)} rows but y has {len(y)}")
    if int(ensemble) < 1:
        raise ValueError(f"ensemble must be >= 1 member, got {ensemble}")
    if not 0.0 < float(val_fraction) < 1.0:
        raise ValueError(f"val_fraction must be in (0, 1), got {val_fraction}")
    if x.ndim != 4:
        raise ValueError(f"downstream accuracy needs images (N, C, H, W), got shape {tuple(x.shape)}")
    y = np.asarray(y)
    if len(y) and (y.min() < 0 or y.max() >= num_classes):
        raise ValueError(f"synthetic labels must lie in 0..{num_classes - 1}, got range {y.min()}..{y.max()}")
    sealed = seal(test, name="test")
    if sealed.reads_left < 1:  # fail before spending any training time
        raise TestSetReuseError(f"sealed split {sealed.name!r} has no read left ({sealed.n_reads} already made)")

    rng = np.random.default_rng(seed)
    perm = rng.permutation(len(x))
    n_val = max(1, int(round(len(x) * val_fraction)))
    if len(x) - n_val < 1:
        raise ValueError(f"{len(x)} synthetic examples leave nothing to train on with val_fraction={val_fraction}")
    val_idx, tr_idx = perm[:n_val], perm[n_val:]
    train_xy = (np.ascontiguousarray(x[tr_idx], dtype=np.float32), y[tr_idx].astype(np.int64))
    val_xy = (np.ascontiguousarray(x[val_idx], dtype=np.float32), y[val_idx].astype(np.int64))

    nets: list[nn.Module] = []
    fits: list[dict[str, Any]] = []
    seeds = [int(seed) + k for k in range(int(ensemble))]
    for k, member_seed in enumerate(seeds):
        torch.manual_seed(member_seed)  # initial weights differ between members
        net = build_classifier(classifier, channels=x.shape[1], num_classes=num_classes, resolution=x.shape[2])
        fit = train_classifier(
            net,
            train_xy,
            val_xy,
            epochs=epochs,
            batch_size=batch_size,
            lr=lr,
            seed=member_seed,
            limit_train_batches=limit_train_batches,
            progress=progress,
            schedule=schedule,
        )
        log.info("downstream %s member %d/%d: best epoch %d, held-out synthetic acc %.4f",
                 classifier, k + 1, ensemble, fit["best_epoch"], fit["val_acc"])
        nets.append(net)
        fits.append(fit)

    if len(nets) == 1:
        selection_acc = float(fits[0]["val_acc"])
    else:
        val_logits = ensemble_logits(nets, val_xy[0], device=device)
        selection_acc = float((val_logits.argmax(1) == val_xy[1]).mean())

    # the only contact with the real test split
    result = sealed.evaluate_once(
        lambda test_x: ensemble_logits(nets, test_x, device=device),
        accuracy_from_logits,
        reader=f"{__name__}.downstream_accuracy[{classifier}x{len(nets)}]",
    )
    return {
        "acc": float(result["acc"]),
        "acc_synthetic_val": selection_acc,
        "best_epoch": int(fits[0]["best_epoch"]),
        "best_epochs": [int(f["best_epoch"]) for f in fits],
        "member_val_accs": [float(f["val_acc"]) for f in fits],
        "member_seeds": seeds,
        "classifier": classifier,
        "ensemble": len(nets),
        "n_train": len(tr_idx),
        "n_val": n_val,
        "n_test": len(sealed),
        "test_reads": sealed.n_reads,
    }
