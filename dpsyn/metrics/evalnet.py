"""Embedded evaluation networks: a small CNN per dataset family, trained on that family's real train split.

They give the feature space of ``fd_<family>`` where InceptionV3 weights cannot be had (and Inception is a poor
feature space for 28x28 grey images anyway). Keyed by a hash of everything that determines the weights (family,
architecture, training settings and seed, the training data's provenance), a network is looked for in this order:

1. the cache, ``${paths.cache_dir}/evalnet/<key>.safetensors``;
2. the package's shipped weights, :data:`SHIPPED_DIR` (the default config's network, so that a first run does not
   train it), used only under exactly the same key; their sha256 is checked against the sidecar first, and a
   mismatch is an error, not a silent retrain;
3. otherwise it is trained and cached.

Each ``<key>.safetensors`` has a ``<key>.json`` sidecar recording that config, the network's test accuracy and the
weights' sha256. ``python -m dpsyn.cli.pretrain evalnet=<family> ship=true`` regenerates the shipped file.
The evaluation network only scores samples; it is never released, so training it on private data spends no budget.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from dpsyn.data.base import DataBundle
from dpsyn.lit.classifier import predict, train_classifier
from dpsyn.nets.classifier import SmallCNN
from dpsyn.results.io import atomic_write, atomic_write_json, read_json

log = logging.getLogger(__name__)

ARCH_VERSION = 1  # bump when SmallCNN changes, so old caches are not loaded into a new architecture

SHIPPED_DIR = Path(__file__).resolve().parent / "weights"  # evaluation networks shipped with the package

REGENERATE = "python -m dpsyn.cli.pretrain evalnet=<family> ship=true"


def evalnet_key(family: str, settings: dict[str, Any], data_info: dict[str, Any]) -> str:
    """Cache key: family plus a short hash of the architecture version, training settings and data provenance."""
    blob = json.dumps({"arch": ARCH_VERSION, "settings": settings, "data": data_info}, sort_keys=True, default=str)
    return f"{family}-{hashlib.sha256(blob.encode()).hexdigest()[:12]}"


def _identity(family_data: DataBundle, settings: dict[str, Any], seed: int) -> tuple[str, dict[str, Any]]:
    """The key of ``family_data``'s network under ``settings`` and ``seed``, and the data provenance it hashes."""
    data_info = {"name": family_data.name, **{k: v for k, v in family_data.info.items() if k != "timing"}}
    return evalnet_key(family_data.family, {**settings, "seed": seed}, data_info), data_info


def _new_net(family_data: DataBundle, seed: int) -> SmallCNN:
    with torch.random.fork_rng():  # the initial weights follow `seed`, not the caller's global RNG state
        torch.manual_seed(seed)
        c, h = family_data.shape[0], family_data.shape[1]
        return SmallCNN(channels=c, num_classes=family_data.num_classes, resolution=h)


def load_or_train_evalnet(
    family_data: DataBundle, *, settings: dict[str, Any], cache_dir: str | Path, seed: int = 0
) -> tuple[SmallCNN, dict[str, Any]]:
    """Return the family's evaluation network: from the cache, else the shipped weights (same key), else trained
    and cached.

    Args:
        family_data: the family's reference dataset (``fmnist`` for every ``fmnist*``): trained on its ``private``
            split (the real train split), tested on its ``eval`` split.
        settings: ``epochs``, ``batch_size``, ``lr``, ``val_fraction``, optional ``limit_train_batches``.
        cache_dir: root of the cache.
        seed: training seed (fixed by default: the metric's feature space must not change between runs).

    Returns:
        The network in eval mode and its record (key, settings, accuracy; ``source`` says where it came from:
        ``"cache"``, ``"shipped"`` or ``"trained"``).

    Raises:
        RuntimeError: the shipped weights for this key do not match their recorded sha256 or configuration.
    """
    from safetensors.torch import load, load_file

    settings = dict(settings)
    key, data_info = _identity(family_data, settings, seed)
    folder = Path(cache_dir) / "evalnet"
    weights, meta = folder / f"{key}.safetensors", folder / f"{key}.json"
    net = _new_net(family_data, seed)
    if weights.exists() and meta.exists():
        net.load_state_dict(load_file(str(weights)))
        net.eval()
        log.info("evaluation network %s: from the cache (%s)", key, weights)
        return net, {**read_json(meta), "source": "cache"}

    shipped = _read_shipped(key, settings=settings, seed=seed, data_info=data_info)
    if shipped is not None:
        blob, record, path = shipped
        net.load_state_dict(load(blob))
        net.eval()
        log.info("evaluation network %s: shipped with dpsyn (%s), test accuracy %.4f", key, path, record["test_acc"])
        return net, {**record, "source": "shipped", "shipped": str(path)}

    log.info("evaluation network %s: not cached or shipped; training it (cached at %s)", key, weights)
    record = _train(net, family_data, key=key, settings=settings, seed=seed, data_info=data_info)
    save_evalnet(net, record, folder)
    log.info("evaluation network %s: trained, test accuracy %.4f", key, record["test_acc"])
    return net, {**record, "source": "trained"}


def _read_shipped(
    key: str, *, settings: dict[str, Any], seed: int, data_info: dict[str, Any]
) -> tuple[bytes, dict[str, Any], Path] | None:
    """The shipped weights' bytes, sidecar and path for ``key``, checked; ``None`` when none are shipped for it."""
    weights, meta = SHIPPED_DIR / f"{key}.safetensors", SHIPPED_DIR / f"{key}.json"
    if not (weights.is_file() and meta.is_file()):
        return None
    blob, record = weights.read_bytes(), read_json(meta)
    digest = hashlib.sha256(blob).hexdigest()
    if digest != record.get("sha256"):
        raise RuntimeError(
            f"shipped evaluation network {weights} does not match the sha256 its sidecar {meta.name} records "
            f"(file: {digest}, recorded: {record.get('sha256')}): the package's copy is damaged or was replaced. "
            f"Reinstall dpsyn, or regenerate it with `{REGENERATE}`."
        )
    # the key is a hash: also compare what it stands for, so a renamed or hand-edited sidecar cannot pass
    expected = json.loads(json.dumps({"key": key, "arch_version": ARCH_VERSION, "settings": settings, "seed": seed,
                                      "data": data_info}, default=str))
    wrong = [k for k, v in expected.items() if record.get(k) != v]
    if wrong:
        raise RuntimeError(
            f"shipped evaluation network {weights}: its sidecar's {', '.join(wrong)} do not match the key {key} "
            f"they are shipped under. Regenerate it with `{REGENERATE}`."
        )
    return blob, record, weights


def _train(
    net: SmallCNN, family_data: DataBundle, *, key: str, settings: dict[str, Any], seed: int,
    data_info: dict[str, Any]
) -> dict[str, Any]:
    """Train ``net`` on the family's train split (best epoch on a seeded validation carve-out); return its record."""
    t0 = time.perf_counter()
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
    return {
        "key": key,
        "family": family_data.family,
        "arch_version": ARCH_VERSION,
        "settings": settings,
        "seed": seed,
        "data": data_info,
        "val_acc": fit["val_acc"],
        "test_acc": test_acc,
        "num_features": net.num_features,
        "train_seconds": round(time.perf_counter() - t0, 2),
    }


def save_evalnet(net: SmallCNN, record: dict[str, Any], folder: str | Path) -> Path:
    """Write ``<key>.safetensors`` and its ``<key>.json`` sidecar (``record`` plus the weights' sha256) in
    ``folder``; the sidecar last, so that a sidecar means the weights beside it are complete. Returns the weights."""
    from safetensors.torch import save

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    weights = folder / f"{record['key']}.safetensors"
    blob = save({k: v.detach().contiguous() for k, v in net.state_dict().items()})
    atomic_write(weights, lambda f: f.write(blob))
    atomic_write_json(folder / f"{record['key']}.json", {**record, "sha256": hashlib.sha256(blob).hexdigest()})
    return weights


def ship_evalnet(
    family_data: DataBundle, *, settings: dict[str, Any], seed: int = 0, folder: str | Path | None = None
) -> tuple[Path, dict[str, Any]]:
    """Train the family's network afresh (neither cache nor shipped copy is read) and write it in ``folder`` (the
    package's shipped weights, :data:`SHIPPED_DIR`, by default), replacing the family's previously shipped networks
    there.

    Returns:
        The weights' path and the sidecar's record (with ``sha256``).
    """
    settings = dict(settings)
    key, data_info = _identity(family_data, settings, seed)
    folder = SHIPPED_DIR if folder is None else Path(folder)
    net = _new_net(family_data, seed)
    log.info("evaluation network %s: training it to ship in %s", key, folder)
    record = _train(net, family_data, key=key, settings=settings, seed=seed, data_info=data_info)
    for old in sorted(folder.glob(f"{family_data.family}-*.*")):
        if old.suffix in (".safetensors", ".json") and old.stem != key:
            log.info("removing the previously shipped %s", old.name)
            old.unlink()
    weights = save_evalnet(net, record, folder)
    return weights, read_json(weights.with_suffix(".json"))


def extract_features(net: SmallCNN, x: np.ndarray) -> np.ndarray:
    """Feature-layer activations of ``x`` (float64)."""
    with torch.inference_mode():
        return predict(net, np.ascontiguousarray(x, dtype=np.float32), features=True)
