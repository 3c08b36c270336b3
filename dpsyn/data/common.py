"""Pieces every dataset loader shares: the registry, config access and validation, seeded splits, image helpers.

Every registered loader has the signature ``loader(cfg, *, seed, data_dir) -> DataBundle`` and validates its config
with :func:`check_config` before reading any file, so that a config error fails at once, in one line naming the key
and the allowed values.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np
from omegaconf import ListConfig

from dpsyn.data.base import DataBundle, Split
from dpsyn.registry import Registry

__all__ = [
    "COMMON_KEYS",
    "DATASETS",
    "DatasetLoader",
    "adapt_images",
    "cfg_get",
    "check_config",
    "select_classes",
    "stratified_split",
    "subsample",
    "to_float_images",
]

log = logging.getLogger(__name__)

DatasetLoader = Callable[..., DataBundle]

DATASETS: Registry[DatasetLoader] = Registry("dataset")
"""Dataset name -> loader ``(cfg, *, seed, data_dir) -> DataBundle``. Filled by explicit imports in
``dpsyn/data/__init__.py``."""

COMMON_KEYS: frozenset[str] = frozenset(
    {"name", "kind", "family", "resolution", "channels", "public", "classes", "split_seed", "n_private", "download",
     "validation_size"}  # validation_size: read by dpsyn.data.carve_validation (tuning runs), not by the loaders
)
"""Keys every ``conf/dataset/*.yaml`` may have; loaders declare any extra ones they accept."""


def cfg_get(cfg: Any, key: str, default: Any = None) -> Any:
    """Read ``key`` from a DictConfig, a dict, or an object with attributes; ``default`` if absent.

    OmegaConf list nodes are returned as plain lists.
    """
    if hasattr(cfg, "get"):
        value = cfg.get(key, default)
    else:
        value = getattr(cfg, key, default)
    if isinstance(value, (ListConfig, tuple)):
        value = list(value)
    return value


def _cfg_keys(cfg: Any) -> list[str]:
    if hasattr(cfg, "keys"):
        return [str(k) for k in cfg.keys()]
    return [k for k in vars(cfg) if not k.startswith("_")]


def _fmt(value: Any) -> str:
    return "null" if value is None else repr(value)


def check_config(
    cfg: Any,
    *,
    kind: str,
    family: str,
    public_options: Sequence[str | None],
    class_names: Sequence[str] | None,
    extra_keys: Iterable[str] = (),
) -> None:
    """Validate a dataset config before any data is read.

    Args:
        cfg: The dataset config node.
        kind: The kind the loader produces; ``cfg.kind``, if set, must equal it.
        family: The family the loader produces; ``cfg.family``, if set, must equal it.
        public_options: Allowed values of ``cfg.public`` (None = no public data).
        class_names: All class names of the source; ``cfg.classes``, if set, must be a non-empty list of distinct
            names among them (matched case-insensitively).
        extra_keys: Keys this loader accepts beyond :data:`COMMON_KEYS`.

    Raises:
        ValueError: naming the offending key and the allowed values.
    """
    name = cfg_get(cfg, "name")
    allowed = COMMON_KEYS | set(extra_keys)
    # `defaults` is Hydra's (a dataset file may choose its public models); it is gone once Hydra composes the file
    unknown = sorted(set(_cfg_keys(cfg)) - allowed - {"defaults"})
    if unknown:
        raise ValueError(
            f"unknown key dataset.{unknown[0]} for dataset {name!r}; allowed: {', '.join(sorted(allowed))}"
        )
    for key, expected in (("kind", kind), ("family", family)):
        value = cfg_get(cfg, key)
        if value is not None and value != expected:
            raise ValueError(f"dataset.{key}={value!r} does not match dataset {name!r}; allowed: {expected!r}")
    public = cfg_get(cfg, "public")
    if public not in public_options:
        raise ValueError(
            f"dataset.public={_fmt(public)} is not available for dataset {name!r}; allowed: "
            f"{', '.join(_fmt(p) for p in public_options)}"
        )
    split_seed = cfg_get(cfg, "split_seed", 0)
    if isinstance(split_seed, bool) or not isinstance(split_seed, int) or split_seed < 0:
        raise ValueError(f"dataset.split_seed={split_seed!r} must be a non-negative integer")
    n_private = cfg_get(cfg, "n_private")
    if n_private is not None and (isinstance(n_private, bool) or not isinstance(n_private, int) or n_private < 1):
        raise ValueError(f"dataset.n_private={n_private!r} must be null (all) or a positive integer")
    download = cfg_get(cfg, "download", False)
    if not isinstance(download, bool):
        raise ValueError(f"dataset.download={download!r} must be true or false")
    resolution = cfg_get(cfg, "resolution")
    channels = cfg_get(cfg, "channels")
    if kind == "table":
        for key, value in (("resolution", resolution), ("channels", channels)):
            if value is not None:
                raise ValueError(f"dataset.{key}={value!r} does not apply to table dataset {name!r}; allowed: null")
    else:
        bad_resolution = isinstance(resolution, bool) or not isinstance(resolution, int) or resolution < 1
        if resolution is not None and bad_resolution:
            raise ValueError(f"dataset.resolution={resolution!r} must be null (native) or a positive integer")
        if channels not in (None, 1, 3):
            raise ValueError(f"dataset.channels={channels!r}; allowed: null (native), 1, 3")
    classes = cfg_get(cfg, "classes")
    if classes is not None:
        resolve_class_names(classes, class_names, dataset=str(name))


def resolve_class_names(requested: Any, class_names: Sequence[str] | None, *, dataset: str) -> list[str]:
    """Map requested class names (case-insensitive) onto the canonical names of ``class_names``.

    Raises:
        ValueError: if the request is empty, has duplicates or unknown names.
    """
    if class_names is None:
        raise ValueError(f"dataset.classes cannot select classes of dataset {dataset!r}; allowed: null")
    if isinstance(requested, str) or not isinstance(requested, (list, tuple)) or not requested:
        raise ValueError(
            f"dataset.classes={requested!r} must be null (all) or a non-empty list of names among: "
            f"{', '.join(class_names)}"
        )
    lookup = {c.lower(): c for c in class_names}
    resolved: list[str] = []
    for item in requested:
        canonical = lookup.get(str(item).lower())
        if canonical is None:
            raise ValueError(
                f"dataset.classes: unknown class {item!r} for dataset {dataset!r}; allowed: {', '.join(class_names)}"
            )
        if canonical in resolved:
            raise ValueError(f"dataset.classes: class {canonical!r} is listed twice")
        resolved.append(canonical)
    return resolved


def stratified_split(labels: np.ndarray, fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Split row indices into two disjoint parts, ``fraction`` of each class in the first, seeded.

    Each class's rows are permuted by ``numpy.random.default_rng(seed)`` (classes in sorted order) and the first
    ``floor(fraction * n_c + 0.5)`` go to the first part. The result depends only on ``labels``, ``fraction`` and
    ``seed``, so the same files and seed always give the same split.

    Returns:
        ``(first, second)``: sorted int64 index arrays that together cover ``range(len(labels))``.
    """
    if not 0.0 < fraction < 1.0:
        raise ValueError(f"split fraction must be in (0, 1), got {fraction}")
    labels = np.asarray(labels)
    rng = np.random.default_rng(seed)
    first: list[np.ndarray] = []
    for c in np.unique(labels):
        rows = rng.permutation(np.flatnonzero(labels == c))
        first.append(rows[: int(np.floor(fraction * len(rows) + 0.5))])
    first_idx = np.sort(np.concatenate(first)).astype(np.int64) if first else np.zeros(0, dtype=np.int64)
    mask = np.ones(len(labels), dtype=bool)
    mask[first_idx] = False
    return first_idx, np.flatnonzero(mask).astype(np.int64)


def subsample(index: np.ndarray, n: int | None, seed: int, *, what: str) -> np.ndarray:
    """Draw ``n`` of ``index`` without replacement with ``numpy.random.default_rng(seed)``, kept in sorted order.

    Args:
        index: Candidate row indices.
        n: How many to keep; None keeps all.
        seed: The run seed.
        what: Name used in the error message (``"fmnist_shoes private"``).

    Raises:
        ValueError: if ``n`` exceeds the number of candidates.
    """
    if n is None:
        return index
    if n > len(index):
        raise ValueError(f"dataset.n_private={n} but {what} has only {len(index)} examples; allowed: 1..{len(index)}")
    chosen = np.random.default_rng(seed).choice(len(index), size=n, replace=False)
    return index[np.sort(chosen)]


def select_classes(
    labels: np.ndarray, class_names: Sequence[str], requested: Sequence[str] | None
) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """Rows of the requested classes and their labels re-indexed to 0..k-1 in the requested order.

    Args:
        labels: Original labels (indices into ``class_names``).
        class_names: Names of the original labels.
        requested: Canonical class names to keep (see :func:`resolve_class_names`), or None for all.

    Returns:
        ``(rows, new_labels, names)``: int64 row indices (ascending), int64 labels, class names in label order.
    """
    labels = np.asarray(labels)
    if requested is None:
        return np.arange(len(labels), dtype=np.int64), labels.astype(np.int64), list(class_names)
    original = [list(class_names).index(c) for c in requested]
    remap = np.full(len(class_names), -1, dtype=np.int64)
    remap[original] = np.arange(len(original))
    new = remap[labels]
    rows = np.flatnonzero(new >= 0).astype(np.int64)
    return rows, new[rows], list(requested)


def to_float_images(x: np.ndarray, *, scale: float = 255.0) -> np.ndarray:
    """uint8-range images (N, H, W) or (N, C, H, W) -> float32 NCHW in [0, 1]."""
    out = np.array(x, dtype=np.float32)  # a fresh array (never a view of a cached one), scaled in place
    out /= np.float32(scale)
    if out.ndim == 3:
        out = out[:, None]
    return out


def adapt_images(x: np.ndarray, *, resolution: int | None, channels: int | None) -> np.ndarray:
    """Resize (bilinear, antialiased) and convert channels of float NCHW images in [0, 1].

    Args:
        x: Images (N, C, H, W).
        resolution: Target square size, or None to keep the native size.
        channels: 1 (ITU-R BT.601 luma of RGB) or 3 (grey repeated), or None to keep.
    """
    if channels is not None and channels != x.shape[1]:
        if channels == 3 and x.shape[1] == 1:
            x = np.repeat(x, 3, axis=1)
        elif channels == 1 and x.shape[1] == 3:
            weights = np.array([0.299, 0.587, 0.114], dtype=np.float32)
            x = np.einsum("nchw,c->nhw", x, weights)[:, None].astype(np.float32)
        else:
            raise ValueError(f"dataset.channels={channels} cannot be made from {x.shape[1]}-channel images")
    if resolution is not None and (x.shape[2], x.shape[3]) != (resolution, resolution):
        x = resize_images(x, resolution)
    return np.ascontiguousarray(x, dtype=np.float32)


def resize_images(x: np.ndarray, size: int, *, batch: int = 8192) -> np.ndarray:
    """Bilinear (antialiased) resize of float NCHW images to ``size`` x ``size``, clipped to [0, 1]."""
    import torch
    import torch.nn.functional as F

    out = np.empty((len(x), x.shape[1], size, size), dtype=np.float32)
    with torch.no_grad():
        for start in range(0, len(x), batch):
            chunk = torch.from_numpy(np.ascontiguousarray(x[start : start + batch], dtype=np.float32))
            resized = F.interpolate(chunk, size=(size, size), mode="bilinear", align_corners=False, antialias=True)
            out[start : start + batch] = resized.clamp_(0.0, 1.0).numpy()
    return out


def finish_image_bundle(
    cfg: Any,
    *,
    name: str,
    family: str,
    private: Split,
    eval_split: Split,
    classes: list[str],
    public: Split | None,
    public_classes: list[str] | None,
    info: dict,
) -> DataBundle:
    """Apply ``cfg.resolution`` / ``cfg.channels`` to every split, record sizes in ``info``, build the bundle."""
    resolution = cfg_get(cfg, "resolution")
    channels = cfg_get(cfg, "channels")
    info = dict(info)
    info["native_shape"] = list(private.x.shape[1:])

    def adapt(split: Split) -> Split:
        return Split(adapt_images(split.x, resolution=resolution, channels=channels), split.y, split.index)

    private, eval_split = adapt(private), adapt(eval_split)
    public = adapt(public) if public is not None else None
    info["shape"] = list(private.x.shape[1:])
    info["sizes"] = {
        "private": len(private),
        "eval": len(eval_split),
        "public": len(public) if public is not None else 0,
    }
    bundle = DataBundle(
        name=name,
        kind="image",
        private=private,
        eval=eval_split,
        classes=classes,
        family=family,
        public=public,
        info=info,
        public_classes=public_classes,
    )
    log.info(
        "dataset %s: private %d, eval %d, public %d, shape %s",
        name,
        len(private),
        len(eval_split),
        len(public) if public is not None else 0,
        tuple(private.x.shape[1:]),
    )
    return bundle
