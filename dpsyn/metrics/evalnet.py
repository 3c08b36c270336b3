"""Embedded evaluation networks: a small CNN per dataset family, trained on that family's real train split.

They give the feature space of ``fd_<family>`` where InceptionV3 weights cannot be had (and Inception is a poor
feature space for 28x28 grey images anyway). Trained once and cached under ``${paths.cache_dir}/evalnet`` as
safetensors, keyed by a hash of everything that determines the weights (family, architecture, training settings,
the training data's provenance); the sidecar JSON records that config and the network's test accuracy.
The evaluation network only scores samples; it is never released, so training it on private data spends no budget.
"""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path
from typing import Any

import numpy as np
import torch

from dpsyn.data.base import DataBundle
from dpsyn.lit.classifier import predict, train_classifier
from dpsyn.nets.classifier import SmallCNN
from dpsyn.results.io import atomic_write_json

log = logging.getLogger(__name__)

ARCH_VERSION = 1  # bump when SmallCNN changes, so old caches are not loaded into a new architecture


def evalnet_key(family: str, settings: dict[str, Any], data_info: dict[str, Any]) -> str:
    """Cache key: family plus a short hash of the architecture version, training settings and data provenance."""
    blob = json.dumps({"arch": ARCH_VERSION, "settings": settings, "data": data_info}, sort_keys=True, default=str)
    return f"{family}-{hashlib.sha256(blob.encode()).hexdigest()[:12]}"


def load_or_train_evalnet(
    family_data: DataBundle, *, settings: dict[str, Any], cache_dir: str | Path, seed: int = 0
) -> tuple[SmallCNN, dict[str, Any]]:
    """Return the family's evaluation network, training and caching it on first use.

    Args:
        family_data: the family's reference dataset (``fmnist`` for every ``fmnist*``): trained on its ``private``
            split (the real train split), tested on its ``eval`` split.
        settings: ``epochs``, ``batch_size``, ``lr``, ``val_fraction``, optional ``limit_train_batches``.
        cache_dir: root of the cache.
        seed: training seed (fixed by default: the metric's feature space must not change between runs).

    Returns:
        The network in eval mode and its record (key, settings, accuracy).
    """
    from safetensors.torch import load_file, save_file

    settings = dict(settings)
    data_info = {"name": family_data.name, **{k: v for k, v in family_data.info.items() if k != "timing"}}
    key = evalnet_key(family_data.family, {**settings, "seed": seed}, data_info)
    folder = Path(cache_dir) / "evalnet"
    weights, meta = folder / f"{key}.safetensors", folder / f"{key}.json"
    c, h = family_data.shape[0], family_data.shape[1]
    with torch.random.fork_rng():  # the initial weights follow `seed`, not the caller's global RNG state
        torch.manual_seed(seed)
        net = SmallCNN(channels=c, num_classes=family_data.num_classes, resolution=h)
    if weights.exists() and meta.exists():
        net.load_state_dict(load_file(str(weights)))
        net.eval()
        return net, json.loads(meta.read_text())

    log.info("training the evaluation network %s (cached at %s)", key, weights)
    x, y = family_data.private.x, family_data.private.y
    rng = np.random.default_rng(seed)
    perm = rng.permutation(len(x))
    n_val = max(1, int(len(x) * float(settings.get("val_fraction", 0.1))))
    val_idx, tr_idx = perm[:n_val], perm[n_val:]
    fit = train_classifier(
        net,
        (x[tr_idx], y[tr_idx]),
        (x[val_idx], y[val_idx]),
        epochs=int(settings["epochs"]),
        batch_size=int(settings["batch_size"]),
        lr=float(settings["lr"]),
        seed=seed,
        limit_train_batches=settings.get("limit_train_batches"),
    )
    test_acc = float((predict(net, family_data.eval.x).argmax(1) == family_data.eval.y).mean())
    record = {
        "key": key,
        "family": family_data.family,
        "settings": settings,
        "seed": seed,
        "data": data_info,
        "val_acc": fit["val_acc"],
        "test_acc": test_acc,
        "num_features": net.num_features,
    }
    folder.mkdir(parents=True, exist_ok=True)
    tmp = weights.with_suffix(".tmp")
    save_file({k: v.contiguous() for k, v in net.state_dict().items()}, str(tmp))
    tmp.replace(weights)
    atomic_write_json(meta, record)
    log.info("evaluation network %s: test accuracy %.4f", key, test_acc)
    return net, record


def extract_features(net: SmallCNN, x: np.ndarray) -> np.ndarray:
    """Feature-layer activations of ``x`` (float64)."""
    with torch.inference_mode():
        return predict(net, np.ascontiguousarray(x, dtype=np.float32), features=True)
