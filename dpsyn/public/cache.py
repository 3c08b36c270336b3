"""The public-model cache: keys, checksummed safetensors weights with their JSON sidecars, the package's shipped
checkpoints, and the public split the embedded models are trained on. Shared by :mod:`dpsyn.public` (the encoder
and IC-GAN) and :mod:`dpsyn.public.diffusion` (PE's diffusion model)."""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path
from typing import Any

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf

log = logging.getLogger("dpsyn.public")


def _as_dict(cfg: Any) -> dict[str, Any]:
    if isinstance(cfg, DictConfig):
        return OmegaConf.to_container(cfg, resolve=True)  # type: ignore[return-value]
    return json.loads(json.dumps(cfg))  # a deep, plain copy


def _positive_int(value: Any, key: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{key}={value!r} must be a positive integer")


def _key(prefix: str, blob: dict[str, Any]) -> str:
    text = json.dumps(blob, sort_keys=True, default=str)
    return f"{prefix}-{hashlib.sha256(text.encode()).hexdigest()[:12]}"


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _save(module: torch.nn.Module, weights: Path, meta: Path, record: dict[str, Any]) -> None:
    from safetensors.torch import save

    from dpsyn.results.io import atomic_write, atomic_write_json

    blob = save({k: v.detach().contiguous() for k, v in module.state_dict().items()})
    atomic_write(weights, lambda f: f.write(blob))
    record["sha256"] = hashlib.sha256(blob).hexdigest()
    atomic_write_json(meta, record)  # last: a sidecar means the weights beside it are complete


SHIPPED_DIR = Path(__file__).resolve().parent / "weights"  # small embedded checkpoints shipped with the package


def _load_cached(module: torch.nn.Module, weights: Path, meta: Path) -> dict[str, Any] | None:
    """Load weights keyed like ``weights`` from the cache or, failing that, from the package's shipped checkpoints
    (same key = same architecture, settings, seed and data provenance; their sha256 is checked against the sidecar)."""
    from safetensors.torch import load, load_file

    from dpsyn.results.io import read_json

    if weights.is_file() and meta.is_file():
        module.load_state_dict(load_file(str(weights)))
        module.eval()
        return read_json(meta)
    shipped_w, shipped_m = SHIPPED_DIR / weights.name, SHIPPED_DIR / meta.name
    if not (shipped_w.is_file() and shipped_m.is_file()):
        return None
    blob, record = shipped_w.read_bytes(), read_json(shipped_m)
    if hashlib.sha256(blob).hexdigest() != record.get("sha256"):
        log.warning("shipped public model %s does not match its recorded sha256; retraining", shipped_w.name)
        return None
    module.load_state_dict(load(blob))
    module.eval()
    return {**record, "shipped": str(shipped_w)}


def _public_data(cfg: dict[str, Any], data_dir: Path) -> tuple[Any, Any, dict[str, Any]]:
    """The public split (subsampled to ``n_public``), the dataset bundle, and the data provenance for cache keys."""
    from dpsyn.data import Split, load_dataset
    from dpsyn.config import load_group as _load_group
    from dpsyn.paths import CONF_DIR

    ds_file = CONF_DIR / "dataset" / f"{cfg['dataset']}.yaml"
    if not ds_file.is_file():
        options = sorted(p.stem for p in (CONF_DIR / "dataset").glob("*.yaml"))
        raise ValueError(f"public.dataset={cfg['dataset']!r}: no such dataset config; allowed: {', '.join(options)}")
    data = load_dataset(_load_group("dataset", str(cfg["dataset"])), seed=int(cfg["seed"]), data_dir=data_dir)
    if data.public is None or data.kind != "image":
        raise ValueError(f"public.dataset={cfg['dataset']!r} has no public image split to train public models on")
    public = data.public
    n = cfg.get("n_public")
    if n is not None and n < len(public):
        rows = np.sort(np.random.default_rng(int(cfg["seed"])).choice(len(public), size=n, replace=False))
        index = public.index[rows] if public.index is not None else None
        public = Split(public.x[rows], public.y[rows], index)
    info = {k: v for k, v in data.info.items() if k not in ("timing", "sizes")}
    provenance = {"dataset": cfg["dataset"], "n_public": len(public), **info}
    return public, data, provenance


def _resolve(path: str, data_dir: Path) -> Path:
    p = Path(path).expanduser()
    return p if p.is_absolute() else data_dir / p
