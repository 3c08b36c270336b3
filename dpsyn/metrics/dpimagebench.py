"""Downstream accuracy by DPImageBench's protocol (``metrics.protocol=dpimagebench``).

DPImageBench (Chen et al., 2019ChenGong/DPImageBench, ``evaluation/evaluator.py``) trains three classifiers on the
synthetic images, ResNet-110, WRN-40-4 and ResNeXt-29 (8x64d), each with Adam (lr 0.01, divided by 5 every 20
epochs), batch 256, 50 epochs on 55,000 synthetic images, scoring an EMA (0.9999) of the weights after each epoch. Each
classifier keeps the epoch with the best accuracy on 5,000 real images held out of the sensitive training split,
and the reported number is the mean over the three of their test accuracy at that epoch.

That selection reads private rows. ``selection="real_val"`` does it as they do, and the result says so: it is not
accounted (the synthetic data stay DP, the accuracy number is not). ``selection="noisy_max"`` makes it a DP
release: each classifier's epoch is chosen by report noisy max over its epochs' counts of correct validation rows
(:class:`dpsyn.privacy.NoisyMax`, sensitivity 1), at ``selection_eps / len(classifiers)`` each, charged in the run's
ledger before any noise is drawn; the validation rows are disjoint from the rows the method trained on.

The real evaluation split is read once, after every selection is made, by the selected networks together
(:class:`~dpsyn.metrics.sealed.SealedSplit`).
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
from torch import nn

from dpsyn.lit.ema_epochs import Centred, train_epochs_with_ema
from dpsyn.metrics.sealed import SealedSplit, TestSetReuseError, seal
from dpsyn.nets.resnet import resnet_110
from dpsyn.nets.resnext import resnext_29
from dpsyn.nets.wrn import WideResNet

log = logging.getLogger(__name__)

SELECTION_TEXT = {
    "real_val": "real validation rows of the private split (not accounted)",
    "noisy_max": "report noisy max over each classifier's epochs on the real validation rows of the private split "
                 "(accounted: in the run's privacy ledger)",
}

#: name -> builder(channels, num_classes, width_divisor, wrn_dropout); divisor 1 gives the papers' widths (WRN-40-4:
#: :func:`dpsyn.nets.wrn.wrn_40_4`), a larger one shrinks them (tests)
CLASSIFIERS: dict[str, Callable[[int, int, int, float], nn.Module]] = {
    "resnet_110": lambda c, k, d, _p: resnet_110(num_classes=k, channels=c, width=max(1, 16 // d)),
    "wrn_40_4": lambda c, k, d, p: WideResNet(depth=40, widen=max(1, 4 // d), num_classes=k, channels=c, dropout=p),
    "resnext_29": lambda c, k, d, _p: resnext_29(num_classes=k, channels=c, base_width=max(1, 64 // d),
                                                 stem=max(1, 64 // d)),
}


@torch.no_grad()
def _logits(net: nn.Module, x: np.ndarray, device: torch.device, batch_size: int = 1024) -> np.ndarray:
    net.eval()
    out = [net(torch.from_numpy(x[i:i + batch_size]).to(device)).double().cpu().numpy()
           for i in range(0, len(x), batch_size)]
    return np.concatenate(out)


def _correct(net: nn.Module, split: tuple[np.ndarray, np.ndarray], device: torch.device) -> int:
    """Correct predictions of ``net`` on the validation rows (the only private rows this module reads)."""
    return int((_logits(net, split[0], device).argmax(1) == split[1]).sum())


def dpimagebench_accuracy(
    synthetic: tuple[np.ndarray, np.ndarray],
    validation: tuple[np.ndarray, np.ndarray],
    test: SealedSplit | tuple[np.ndarray, np.ndarray],
    *,
    num_classes: int,
    classifiers: Sequence[str],
    epochs: int,
    batch_size: int,
    lr: float,
    lr_step: int,
    lr_gamma: float,
    ema_decay: float,
    wrn_dropout: float,
    n_train: int,
    seed: int,
    selection: str = "real_val",
    selection_eps: float | None = None,
    ledger: Any = None,
    generator: np.random.Generator | None = None,
    width_divisor: int = 1,
    device: str | torch.device | None = None,
) -> dict[str, Any]:
    """Mean test accuracy of DPImageBench's classifiers, each at the epoch selected on the real validation rows.

    Args:
        synthetic: ``(x, y)`` synthetic images in [0, 1] (N, C, H, W) and labels.
        validation: ``(x, y)``: the real validation rows, held out of the private split (the method never saw them).
        test: the real evaluation split (a sealed split with a read left, or an ``(x, y)`` pair).
        num_classes: number of classes.
        classifiers: names of :data:`CLASSIFIERS`, in order.
        epochs, batch_size, lr, lr_step, lr_gamma, ema_decay: the training (:func:`train_epochs_with_ema`).
        wrn_dropout: dropout of WRN-40-4's blocks (theirs: 0.3).
        n_train: synthetic images trained on (a seeded draw; all when there are fewer).
        seed: seed of the draw and of classifier ``k``'s initialisation and batches (``seed + k``).
        selection: ``"real_val"`` (their selection, not accounted) or ``"noisy_max"`` (DP, charged to ``ledger``).
        selection_eps: the whole selection's epsilon (``noisy_max``), split equally between the classifiers.
        ledger: the run's :class:`~dpsyn.privacy.PrivacyLedger` (``noisy_max``).
        generator: a DP generator (:func:`dpsyn.privacy.dp_numpy_generator`) for the selection's noise.
        width_divisor: divide the networks' widths (1: the papers'; tests shrink them).
        device: where to train (None: CUDA when there is one, else the CPU).

    Returns:
        ``acc`` (the mean over classifiers), ``acc_std``, ``per_classifier`` (name -> test accuracy),
        ``selected_epochs``, ``val_accs`` (``real_val`` only: under ``noisy_max`` the validation accuracy is not
        released), ``n_train``, ``n_validation``, ``n_test``, ``test_reads``, ``selection_events`` (ledger ids).

    Raises:
        ValueError: an unknown classifier or selection, missing labels or validation rows, ``noisy_max`` without
            its epsilon, ledger or generator.
        TestSetReuseError: ``test`` has no read left (checked before any training).
    """
    x, y = synthetic
    if y is None:
        raise ValueError("downstream accuracy needs labelled synthetic data (the method returned no labels)")
    unknown = [c for c in classifiers if c not in CLASSIFIERS]
    if unknown or not classifiers:
        raise ValueError(f"unknown classifiers {unknown or list(classifiers)}; choose from {sorted(CLASSIFIERS)}")
    if selection not in SELECTION_TEXT:
        raise ValueError(f"selection must be one of {sorted(SELECTION_TEXT)}, got {selection!r}")
    if validation is None or len(validation[0]) == 0:
        raise ValueError("the dpimagebench protocol selects on real validation rows held out of the private split; "
                         "none were given")
    if selection == "noisy_max" and (selection_eps is None or ledger is None or generator is None):
        raise ValueError("selection=noisy_max needs selection_eps, the run's ledger and a DP generator")
    sealed = seal(test, name="test")
    if sealed.reads_left < 1:
        raise TestSetReuseError(f"sealed split {sealed.name!r} has no read left ({sealed.n_reads} already made)")
    dev = torch.device(device) if device is not None else torch.device("cuda" if torch.cuda.is_available() else "cpu")

    rng = np.random.default_rng(seed)
    idx = rng.permutation(len(x))[:min(int(n_train), len(x))]
    train_xy = (np.ascontiguousarray(x[idx], dtype=np.float32), np.asarray(y)[idx].astype(np.int64))
    val_xy = (np.ascontiguousarray(validation[0], dtype=np.float32), np.asarray(validation[1]).astype(np.int64))

    from dpsyn.privacy import NoisyMax, noisy_max_event

    each_eps = None if selection_eps is None else float(selection_eps) / len(classifiers)
    selected: dict[str, nn.Module] = {}
    epochs_chosen: dict[str, int] = {}
    val_accs: dict[str, float] = {}
    events: list[int] = []
    for k, name in enumerate(classifiers):
        torch.manual_seed(int(seed) + k)
        net = Centred(CLASSIFIERS[name](x.shape[1], num_classes, int(width_divisor), float(wrn_dropout)))
        selector = None
        if selection == "noisy_max":  # charged before any noise is drawn (the ledger journals it)
            events.append(ledger.add(noisy_max_event(
                epsilon=each_eps, label=f"dpimagebench protocol: {name}'s epoch by report noisy max over {epochs} "
                                        f"epochs' correct counts on the real validation rows")))
            selector = NoisyMax(epsilon=each_eps, generator=generator)
        best, keep = -1, None
        for epoch, ema in train_epochs_with_ema(net, train_xy, epochs=int(epochs), batch_size=int(batch_size),
                                                lr=float(lr), lr_step=int(lr_step), lr_gamma=float(lr_gamma),
                                                ema_decay=float(ema_decay), seed=int(seed) + k, device=dev):
            count = _correct(ema, val_xy, dev)
            # theirs keeps the later epoch on a tie (evaluator.py: val_acc >= best_acc)
            chosen = selector.offer(count) if selector is not None else count >= best
            if chosen:
                best, keep, epochs_chosen[name] = count, copy.deepcopy(ema).cpu(), epoch
        selected[name] = keep
        if selector is None:
            val_accs[name] = best / len(val_xy[1])
        log.info("dpimagebench protocol: %s selected epoch %d of %d (%s)", name, epochs_chosen[name], epochs,
                 selection)

    def predict(test_x: np.ndarray) -> dict[str, np.ndarray]:
        return {n: _logits(m.to(dev), np.ascontiguousarray(test_x, dtype=np.float32), dev) for n, m in selected.items()}

    def metric(test_y: np.ndarray, logits: dict[str, np.ndarray]) -> dict[str, Any]:
        return {n: float((v.argmax(1) == test_y).mean()) for n, v in logits.items()}

    # the only contact with the real test split: every selection is made
    per = sealed.evaluate_once(predict, metric, reader=f"{__name__}.dpimagebench_accuracy[{','.join(classifiers)}]")
    accs = np.array([per[n] for n in classifiers])
    return {
        "acc": float(accs.mean()), "acc_std": float(accs.std()), "per_classifier": per,
        "selected_epochs": dict(epochs_chosen), "val_accs": val_accs, "n_train": len(idx),
        "n_validation": len(val_xy[1]), "n_test": len(sealed), "test_reads": sealed.n_reads,
        "selection_events": events,
    }
