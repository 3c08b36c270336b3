"""Feature extractors for the fidelity metrics, registered by name, and an on-disk feature cache.

Each extractor declares what it provides (torch-fidelity's habit): ``name``, ``provides`` (layers, e.g.
``("features", "logits")``), ``feature_dim``, ``resolution`` (the input side the network works at) and ``identity``
(what determines its outputs: a weights hash or a training-config key; part of every cache key). All take images as
float NCHW in [0, 1] and return float64 arrays.

Registered factories (:data:`FEATURE_EXTRACTORS`):

- ``inception``: torch-fidelity's InceptionV3 (``FeatureExtractorInceptionV3``): ``features`` = the 2048-d pool
  layer (``"2048"``), ``logits`` = ``"logits_unbiased"`` (the layer torch-fidelity's Inception Score uses). Weights
  come from a local file only (argument, ``$DPSYN_INCEPTION_WEIGHTS``, or torch-fidelity's download cache in the torch
  hub folder); nothing is downloaded. Metric names: ``fid``, ``is``, ``kid``.
- ``evalnet``: the embedded evaluation network of a dataset family (:mod:`dpsyn.metrics.evalnet`), named
  ``evalnet_<family>``; ``features`` = ``SmallCNN.features`` (128-d), ``logits`` = its classifier head.
  Metric names: ``fd_<family>``, ``is_<family>``.
- ``clip``: an open_clip image encoder from a local checkpoint (optional; open_clip is imported only when used).

:func:`cached_features` stores features as ``.npy`` under ``<cache_dir>/features/``, keyed by the split key, the
extractor, the layer and a hash of the images' content and the extractor's identity, so the real split's features
are computed once per extractor.
"""

from __future__ import annotations

import abc
import hashlib
import logging
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.nn import functional as F

from dpsyn.data.base import DataBundle
from dpsyn.registry import Registry

log = logging.getLogger(__name__)

FEATURE_EXTRACTORS: Registry = Registry("feature extractor")

INCEPTION_WEIGHTS_ENV = "DPSYN_INCEPTION_WEIGHTS"
CLIP_CHECKPOINT_ENV = "DPSYN_CLIP_CHECKPOINT"
# the file torch-fidelity downloads (torch.hub.load_state_dict_from_url keeps it under <hub dir>/checkpoints/)
INCEPTION_WEIGHTS_FILE = "weights-inception-2015-12-05-6726825d.pth"
# open_clip's OpenAI CLIP normalisation, used when a model does not state its own
_CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
_CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
_EMBEDDED_HINT = (
    "without them, use the embedded evaluation network: feature extractor `evalnet_<family>` "
    "(metric `fd_<family>`, e.g. fd_fmnist), trained on the dataset's train split"
)


class FeatureExtractor(abc.ABC):
    """What every feature extractor provides.

    Attributes:
        name: registry-facing name (``inception``, ``evalnet_fmnist``, ``clip``); part of cache file names.
        provides: the layers :meth:`extract` returns (``"features"`` always, ``"logits"`` for classifiers).
        feature_dim: width of the ``features`` layer.
        resolution: input side the network works at (inputs are resized to it), or None where it takes any size.
        identity: what determines the outputs (weights hash, config key); part of every feature-cache key.
    """

    name: str
    provides: tuple[str, ...]
    feature_dim: int
    resolution: int | None

    @property
    @abc.abstractmethod
    def identity(self) -> str:
        """A string that changes whenever the extractor's outputs could change."""

    @abc.abstractmethod
    def extract(self, x: np.ndarray) -> dict[str, np.ndarray]:
        """Every provided layer for images ``x`` (float NCHW in [0, 1]), in one pass, as float64 (N, dim) arrays."""

    def features(self, x: np.ndarray) -> np.ndarray:
        """The ``features`` layer for images ``x`` (float32 NCHW in [0, 1]) as float64 (N, feature_dim)."""
        return self.extract(x)["features"]

    def logits(self, x: np.ndarray) -> np.ndarray:
        """The ``logits`` layer for images ``x``.

        Raises:
            ValueError: if this extractor provides no logits.
        """
        if "logits" not in self.provides:
            raise ValueError(f"feature extractor {self.name!r} provides {self.provides}, not logits")
        return self.extract(x)["logits"]

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r}, provides={self.provides}, feature_dim={self.feature_dim})"


def check_images(x: np.ndarray, *, channels: tuple[int, ...] | None = None) -> np.ndarray:
    """Validate images (N, C, H, W) in [0, 1] and return them as contiguous float32.

    Raises:
        ValueError: on another shape, no images, a channel count not in ``channels``, NaNs or values outside [0, 1].
    """
    x = np.ascontiguousarray(x, dtype=np.float32)
    if x.ndim != 4 or len(x) == 0:
        raise ValueError(f"images must be (N, C, H, W) with N > 0, got shape {x.shape}")
    if channels is not None and x.shape[1] not in channels:
        raise ValueError(f"images have {x.shape[1]} channels; this extractor takes {' or '.join(map(str, channels))}")
    if not (np.isfinite(x).all() and x.min() >= 0.0 and x.max() <= 1.0):
        raise ValueError(f"images must be finite and in [0, 1], got range [{np.nanmin(x)}, {np.nanmax(x)}]")
    return x


def to_uint8(x: np.ndarray) -> np.ndarray:
    """[0, 1] floats to uint8 by rounding x * 255 to the nearest integer (the encoding of a saved PNG)."""
    return np.floor(np.clip(x, 0.0, 1.0) * 255.0 + 0.5).astype(np.uint8)


def _default_device(device: str | None) -> torch.device:
    return torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))


def _run_batched(
    fn: Callable[[torch.Tensor], dict[str, torch.Tensor]], x: np.ndarray, *, batch_size: int, device: torch.device
) -> dict[str, np.ndarray]:
    """Apply ``fn`` to batches of ``x`` and concatenate each returned layer as float64 numpy."""
    parts: dict[str, list[np.ndarray]] = {}
    with torch.inference_mode():
        for i in range(0, len(x), batch_size):
            for layer, out in fn(torch.from_numpy(x[i : i + batch_size]).to(device)).items():
                parts.setdefault(layer, []).append(out.detach().to("cpu", torch.float64).numpy())
    return {layer: np.concatenate(chunks) for layer, chunks in parts.items()}


def _file_digest(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()[:16]


# ---------------------------------------------------------------------------------------------------- inception


def inception_weight_candidates(weights_path: str | Path | None = None) -> list[Path]:
    """Where the InceptionV3 weights are looked for, in order.

    An explicit ``weights_path`` is the only candidate; otherwise ``$DPSYN_INCEPTION_WEIGHTS`` if set, else
    torch-fidelity's download cache (``<torch hub dir>/checkpoints/weights-inception-2015-12-05-6726825d.pth``).
    """
    if weights_path is not None:
        return [Path(weights_path).expanduser()]
    if os.environ.get(INCEPTION_WEIGHTS_ENV):
        return [Path(os.environ[INCEPTION_WEIGHTS_ENV]).expanduser()]
    return [Path(torch.hub.get_dir()) / "checkpoints" / INCEPTION_WEIGHTS_FILE]


class InceptionExtractor(FeatureExtractor):
    """torch-fidelity's InceptionV3 (the FID network) loaded from a local weights file.

    Images are converted to uint8 (torch-fidelity's input type), grey images repeated to 3 channels; torch-fidelity
    resizes to 299 x 299 with its TensorFlow-compatible bilinear interpolation.

    Args:
        weights_path: the weights file (torch-fidelity's ``weights-inception-2015-12-05-6726825d.pth`` or a state
            dict of the same structure); None looks in ``$DPSYN_INCEPTION_WEIGHTS`` then torch-fidelity's cache.
        device: torch device; None picks CUDA when available.
        batch_size: images per forward pass.

    Raises:
        FileNotFoundError: if no weights file is found (the message says where it looked and names the embedded
            alternative).
        ValueError: if the file is not an InceptionV3 state dict of torch-fidelity's structure.
    """

    name = "inception"
    provides = ("features", "logits")
    feature_dim = 2048
    resolution = 299

    def __init__(
        self, weights_path: str | Path | None = None, *, device: str | None = None, batch_size: int = 64
    ) -> None:
        from torch_fidelity.feature_extractor_inceptionv3 import FeatureExtractorInceptionV3

        candidates = inception_weight_candidates(weights_path)
        found = [p for p in candidates if p.is_file()]
        if not found:
            raise FileNotFoundError(
                "InceptionV3 weights not found (looked in: "
                + ", ".join(str(p) for p in candidates)
                + f"). The `inception` extractor (fid, is, kid) needs torch-fidelity's {INCEPTION_WEIGHTS_FILE}, "
                f"which dpsyn never downloads: pass its path (weights_path), set ${INCEPTION_WEIGHTS_ENV}, or put it "
                f"in torch-fidelity's cache {Path(torch.hub.get_dir()) / 'checkpoints'}; {_EMBEDDED_HINT}"
            )
        self.weights_path = found[0]
        self.device = _default_device(device)
        self.batch_size = int(batch_size)
        try:
            net = FeatureExtractorInceptionV3(
                "inception-v3-compat",
                ["2048", "logits_unbiased"],
                feature_extractor_weights_path=str(self.weights_path),
            )
        except RuntimeError as e:  # load_state_dict: missing/unexpected keys or shape mismatches
            raise ValueError(
                f"{self.weights_path} is not an InceptionV3 state dict of torch-fidelity's structure: {e}"
            ) from e
        self.net = net.to(self.device)
        self._identity: str | None = None
        log.info("InceptionV3 weights loaded from %s", self.weights_path)

    @property
    def identity(self) -> str:
        if self._identity is None:
            self._identity = f"inception-v3-compat-{_file_digest(self.weights_path)}"
        return self._identity

    def extract(self, x: np.ndarray) -> dict[str, np.ndarray]:
        x = check_images(x, channels=(1, 3))
        u8 = to_uint8(x)
        if u8.shape[1] == 1:
            u8 = np.repeat(u8, 3, axis=1)

        def fn(batch: torch.Tensor) -> dict[str, torch.Tensor]:
            feats, logits = self.net(batch)
            return {"features": feats, "logits": logits}

        return _run_batched(fn, np.ascontiguousarray(u8), batch_size=self.batch_size, device=self.device)


@FEATURE_EXTRACTORS.register("inception")
def inception(
    weights_path: str | Path | None = None, *, device: str | None = None, batch_size: int = 64
) -> InceptionExtractor:
    """Build the ``inception`` extractor (see :class:`InceptionExtractor`)."""
    return InceptionExtractor(weights_path, device=device, batch_size=batch_size)


# ------------------------------------------------------------------------------------------------------ evalnet


class EvalNetExtractor(FeatureExtractor):
    """Adapter around an embedded evaluation network (:class:`dpsyn.nets.classifier.SmallCNN`).

    Args:
        net: the trained network.
        record: its cache record from :func:`dpsyn.metrics.evalnet.load_or_train_evalnet` (``key``, ``test_acc``).
        family: the dataset family it was trained on.
        channels: input channels it takes.
        resolution: input side it takes (no resizing: images must already have it).
        batch_size: images per forward pass.
    """

    provides = ("features", "logits")

    def __init__(
        self,
        net: torch.nn.Module,
        record: dict[str, Any],
        *,
        family: str,
        channels: int,
        resolution: int,
        batch_size: int = 1024,
    ) -> None:
        self.net = net.eval()
        self.record = record
        self.family = family
        self.name = f"evalnet_{family}"
        self.channels = channels
        self.resolution = resolution
        self.feature_dim = int(getattr(net, "num_features"))
        self.batch_size = int(batch_size)
        self._identity: str | None = None

    @property
    def identity(self) -> str:
        # the config key plus a hash of the weights themselves: a retrained network under the same key (the weights'
        # initialisation is not covered by the key) must not reuse features cached for the previous one
        if self._identity is None:
            h = hashlib.sha256()
            for name, tensor in sorted(self.net.state_dict().items()):
                h.update(name.encode())
                h.update(tensor.detach().to("cpu").contiguous().numpy().tobytes())
            self._identity = f"{self.record['key']}-{h.hexdigest()[:12]}"
        return self._identity

    def extract(self, x: np.ndarray) -> dict[str, np.ndarray]:
        x = check_images(x, channels=(self.channels,))
        if x.shape[2:] != (self.resolution, self.resolution):
            raise ValueError(
                f"{self.name} takes {self.resolution}x{self.resolution} images, got {x.shape[2]}x{x.shape[3]}"
            )

        def fn(batch: torch.Tensor) -> dict[str, torch.Tensor]:
            feats = self.net.features(batch)
            return {"features": feats, "logits": self.net.head(feats)}

        return _run_batched(fn, x, batch_size=self.batch_size, device=torch.device("cpu"))


@FEATURE_EXTRACTORS.register("evalnet")
def evalnet(
    family_data: DataBundle,
    *,
    settings: dict[str, Any],
    cache_dir: str | Path,
    seed: int = 0,
    batch_size: int = 1024,
) -> EvalNetExtractor:
    """Build ``evalnet_<family>``: the family's evaluation network, trained and cached on first use.

    Args:
        family_data: the family's reference dataset (``fmnist`` for every ``fmnist*``), as for
            :func:`dpsyn.metrics.evalnet.load_or_train_evalnet`.
        settings: the evaluation network's training settings (``cfg.metrics.evalnet``).
        cache_dir: root of the cache.
        seed: training seed.
        batch_size: images per forward pass.
    """
    from dpsyn.metrics.evalnet import load_or_train_evalnet

    net, record = load_or_train_evalnet(family_data, settings=dict(settings), cache_dir=cache_dir, seed=seed)
    c, h = family_data.shape[0], family_data.shape[1]
    return EvalNetExtractor(net, record, family=family_data.family, channels=c, resolution=h, batch_size=batch_size)


# --------------------------------------------------------------------------------------------------------- clip


class ClipExtractor(FeatureExtractor):
    """An open_clip image encoder: ``features`` = ``model.encode_image`` (not L2-normalised).

    Images are resized (bicubic, antialiased) to the model's input side, grey repeated to 3 channels, and normalised
    with the model's own mean/std (``model.visual.preprocess_cfg``) or OpenAI CLIP's.

    Args:
        model: an open_clip model (has ``encode_image`` and ``visual``).
        model_name: open_clip architecture name.
        checkpoint_path: the checkpoint it was loaded from.
        device: torch device.
        batch_size: images per forward pass.
    """

    provides = ("features",)
    name = "clip"

    def __init__(
        self, model: torch.nn.Module, *, model_name: str, checkpoint_path: Path, device: torch.device, batch_size: int
    ) -> None:
        self.model = model.eval().to(device)
        self.model_name = model_name
        self.checkpoint_path = checkpoint_path
        self.device = device
        self.batch_size = int(batch_size)
        visual = model.visual
        size = getattr(visual, "image_size", 224)
        self.resolution = int(size[0] if isinstance(size, (tuple, list)) else size)
        cfg = getattr(visual, "preprocess_cfg", None) or {}
        self.mean = torch.tensor(cfg.get("mean", _CLIP_MEAN), device=device).view(1, 3, 1, 1)
        self.std = torch.tensor(cfg.get("std", _CLIP_STD), device=device).view(1, 3, 1, 1)
        dim = getattr(visual, "output_dim", None)
        if dim is None:
            dim = self.extract(np.zeros((1, 3, self.resolution, self.resolution), np.float32))["features"].shape[1]
        self.feature_dim = int(dim)
        self._identity: str | None = None

    @property
    def identity(self) -> str:
        if self._identity is None:
            self._identity = f"clip-{self.model_name}-{_file_digest(self.checkpoint_path)}"
        return self._identity

    def extract(self, x: np.ndarray) -> dict[str, np.ndarray]:
        x = check_images(x, channels=(1, 3))

        def fn(batch: torch.Tensor) -> dict[str, torch.Tensor]:
            if batch.shape[1] == 1:
                batch = batch.repeat(1, 3, 1, 1)
            if batch.shape[2:] != (self.resolution, self.resolution):
                batch = F.interpolate(
                    batch, size=(self.resolution, self.resolution), mode="bicubic", align_corners=False,
                    antialias=True,
                ).clamp_(0.0, 1.0)
            return {"features": self.model.encode_image((batch - self.mean) / self.std)}

        return _run_batched(fn, x, batch_size=self.batch_size, device=self.device)


@FEATURE_EXTRACTORS.register("clip")
def clip(
    checkpoint_path: str | Path | None = None,
    *,
    model_name: str = "ViT-B-32",
    device: str | None = None,
    batch_size: int = 64,
) -> ClipExtractor:
    """Build the ``clip`` extractor from a local open_clip checkpoint (nothing is downloaded).

    Args:
        checkpoint_path: the checkpoint file; None reads ``$DPSYN_CLIP_CHECKPOINT``.
        model_name: open_clip architecture (``ViT-B-32``, ...).
        device: torch device; None picks CUDA when available.
        batch_size: images per forward pass.

    Raises:
        ImportError: if open_clip is not installed.
        FileNotFoundError: if no checkpoint is given or the file does not exist.
    """
    try:
        import open_clip
    except ImportError as e:
        raise ImportError(
            "the `clip` feature extractor needs open_clip, which is not installed (pip install open_clip_torch); "
            "alternatives: `inception` (torch-fidelity's InceptionV3, local weights) or the embedded "
            "`evalnet_<family>` (metric `fd_<family>`)"
        ) from e
    raw = checkpoint_path if checkpoint_path is not None else os.environ.get(CLIP_CHECKPOINT_ENV)
    path = Path(raw).expanduser() if raw else None
    if path is None or not path.is_file():
        where = str(path) if path is not None else f"no path given and ${CLIP_CHECKPOINT_ENV} is unset"
        raise FileNotFoundError(
            f"open_clip checkpoint for {model_name} not found ({where}); pass checkpoint_path or set "
            f"${CLIP_CHECKPOINT_ENV} (dpsyn never downloads it); {_EMBEDDED_HINT}"
        )
    dev = _default_device(device)
    model, _, _ = open_clip.create_model_and_transforms(model_name, pretrained=str(path), device=dev)
    log.info("open_clip %s loaded from %s", model_name, path)
    return ClipExtractor(model, model_name=model_name, checkpoint_path=path, device=dev, batch_size=batch_size)


# ----------------------------------------------------------------------------------------------------- lookup


def build_feature_extractor(name: str, **kwargs: Any) -> FeatureExtractor:
    """Build an extractor by its user-facing name: ``inception``, ``clip`` or ``evalnet_<family>``.

    ``evalnet_<family>`` goes to the ``evalnet`` factory, whose ``family_data`` must be that family's bundle.

    Raises:
        ValueError: for an unknown name, or an ``evalnet_<family>`` whose ``family_data`` is another family.
    """
    if name.startswith("evalnet_"):
        extractor = FEATURE_EXTRACTORS.get("evalnet")(**kwargs)
        if extractor.name != name:
            raise ValueError(f"asked for {name!r} but family_data is of family {extractor.family!r}")
        return extractor
    if name == "evalnet":
        raise ValueError("name the family: `evalnet_<family>` (e.g. evalnet_fmnist)")
    return FEATURE_EXTRACTORS.get(name)(**kwargs)


# ------------------------------------------------------------------------------------------------------- cache


def _safe(part: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.=-]+", "_", part).strip("_") or "_"


def _content_digest(extractor: FeatureExtractor, x: np.ndarray) -> str:
    x = np.ascontiguousarray(x, dtype=np.float32)  # what the extractor sees
    h = hashlib.blake2b(digest_size=12)
    h.update(f"{extractor.identity}|{x.shape}|".encode())
    h.update(memoryview(x).cast("B"))
    return h.hexdigest()


def features_cache_path(
    extractor: FeatureExtractor,
    x: np.ndarray,
    *,
    key: str,
    cache_dir: str | Path,
    layer: str = "features",
    digest: str | None = None,
) -> Path:
    """The ``.npy`` file that holds (or will hold) ``extractor``'s ``layer`` for images ``x``.

    ``<cache_dir>/features/<key>-<extractor.name>-<layer>-<digest>.npy``, where the digest hashes the images'
    shape and bytes (as float32) together with ``extractor.identity``: other images, or other weights under the same
    name, give another file. ``digest`` skips re-hashing ``x`` when it is already known.
    """
    digest = digest or _content_digest(extractor, x)
    return Path(cache_dir) / "features" / f"{_safe(key)}-{_safe(extractor.name)}-{_safe(layer)}-{digest}.npy"


def cached_features(
    extractor: FeatureExtractor, x: np.ndarray, *, key: str, cache_dir: str | Path, layer: str = "features"
) -> np.ndarray:
    """``extractor``'s ``layer`` for images ``x``, computed once and then read from ``<cache_dir>/features/``.

    On a miss every layer the extractor provides is computed in one pass and each is stored (logits cost nothing
    extra once the features are computed), written atomically.

    Args:
        extractor: a :class:`FeatureExtractor`.
        x: images (N, C, H, W) in [0, 1].
        key: what the images are, e.g. ``"fmnist-eval"`` (the readable part of the file name): a hit needs the same
            key, extractor, layer and image content; changed content under the same key is a miss, never stale.
        cache_dir: root of the cache.
        layer: one of ``extractor.provides``.

    Returns:
        float64 (N, dim) array.

    Raises:
        ValueError: if the extractor does not provide ``layer``.
    """
    if layer not in extractor.provides:
        raise ValueError(f"feature extractor {extractor.name!r} provides {extractor.provides}, not {layer!r}")
    digest = _content_digest(extractor, x)
    paths = {
        lay: features_cache_path(extractor, x, key=key, cache_dir=cache_dir, layer=lay, digest=digest)
        for lay in extractor.provides
    }
    path = paths[layer]
    if path.is_file():
        out = np.load(path)
        if len(out) == len(x):
            log.debug("features %s loaded from %s", layer, path)
            return out
        log.warning("ignoring cached features %s: %d rows for %d images", path, len(out), len(x))
    computed = extractor.extract(x)
    path.parent.mkdir(parents=True, exist_ok=True)
    for lay, p in paths.items():
        tmp = p.with_name(p.name + f".{os.getpid()}.tmp")
        with tmp.open("wb") as f:
            np.save(f, computed[lay])
        tmp.replace(p)
    log.info("features %s of %s (%d images) cached at %s", layer, extractor.name, len(x), path)
    return computed[layer]
