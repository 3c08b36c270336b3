"""Feature encoders h(x) of paper 000 (DP-MGE / DP-DRE): the embedded conv encoder and real ResNet-50 adapters.

DP-MGE releases the mean and the second moment of the private features ``v_i = h(x_i)`` with the Gaussian
mechanism; each sum has L2 sensitivity 1 only if ``||v_i|| <= 1``. Every encoder here therefore L2-normalises its
output and then passes it through :func:`clip_to_unit_ball`, which *enforces* the bound (float rounding of a
normalised vector can exceed 1 by an ulp) and counts the rows it had to shrink; a method that receives features
from elsewhere must call it again rather than assume the bound.

* :class:`EmbeddedEncoder`: a small conv net for 28x28 grey images, trained by dpsyn on ``fmnist_public``'s public
  labels with a supervised (cosine) classification head that is dropped afterwards. (IC-GAN's ImageNet encoder is
  self-supervised SwAV; on the embedded stand-in a supervised encoder is the cheap way to a feature space whose
  neighbourhoods are semantically coherent, which is what the instance-conditioned generator needs.)
* :class:`ResNet50Encoder`: torchvision's ResNet-50 with ImageNet weights read from a local file.
* :class:`SwAVEncoder`: the self-supervised SwAV ResNet-50 that IC-GAN conditions on, read from
  ``swav_800ep_pretrain.pth.tar``.

The real adapters never download anything: a missing file raises :class:`FileNotFoundError` saying what to
download and where to put it (``${paths.data_dir}/checkpoints/`` by default).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TypeVar

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

__all__ = [
    "ENCODER_ARCH_VERSION",
    "EmbeddedEncoder",
    "EncoderClassifier",
    "ResNet50Encoder",
    "RESNET50_URL",
    "SWAV_URL",
    "SwAVEncoder",
    "clip_to_unit_ball",
    "encode_images",
]

log = logging.getLogger(__name__)

ENCODER_ARCH_VERSION = 1  # bump when EmbeddedEncoder changes, so cached weights are not loaded into a new net

RESNET50_URL = "https://download.pytorch.org/models/resnet50-11ad3fa6.pth"
"""torchvision's ``ResNet50_Weights.IMAGENET1K_V2``."""
SWAV_URL = "https://dl.fbaipublicfiles.com/deepcluster/swav_800ep_pretrain.pth.tar"
"""SwAV ResNet-50, 800 epochs: the feature extractor of IC-GAN (facebookresearch/ic_gan README)."""

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)

ArrayT = TypeVar("ArrayT", np.ndarray, torch.Tensor)


def clip_to_unit_ball(v: ArrayT, *, max_norm: float = 1.0) -> tuple[ArrayT, int]:
    """Shrink every row of ``v`` whose L2 norm exceeds ``max_norm`` onto the sphere of radius ``max_norm``.

    Norms are computed in float64. After rescaling, rows are re-checked in their own dtype (float32 rounding can
    leave a norm one ulp above the bound) and nudged towards zero until the bound holds exactly, so the result
    satisfies ``||row|| <= max_norm`` as computed in float64 — what the Gaussian mechanism's sensitivity needs.

    Args:
        v: features, (N, D) or a single (D,) vector; numpy array or torch tensor (returned as the same type,
            dtype and device).
        max_norm: the radius of the ball.

    Returns:
        ``(v_clipped, n_clipped)``: the clipped copy and how many rows violated the bound.

    Raises:
        ValueError: if ``max_norm`` is not positive or ``v`` holds NaN or infinite values (no finite bound on
            such a row's contribution exists; the caller must fix its encoder, not have it silently zeroed).
    """
    if not max_norm > 0:
        raise ValueError(f"max_norm={max_norm} must be positive")
    is_torch = isinstance(v, torch.Tensor)
    arr = v.detach().cpu().numpy() if is_torch else np.asarray(v)
    single = arr.ndim == 1
    rows = arr[None] if single else arr
    if rows.ndim != 2:
        raise ValueError(f"features must be (N, D) or (D,), got shape {tuple(arr.shape)}")
    if not np.issubdtype(rows.dtype, np.floating):
        rows = rows.astype(np.float32)
    if not np.all(np.isfinite(rows)):
        raise ValueError("features contain NaN or infinite values; cannot bound their norm")
    out = np.array(rows, copy=True)
    norms = np.linalg.norm(out.astype(np.float64), axis=1)
    bad = norms > max_norm
    n_clipped = int(bad.sum())
    if n_clipped:
        out[bad] = (out[bad].astype(np.float64) * (max_norm / norms[bad])[:, None]).astype(out.dtype)
        shrink = out.dtype.type(1.0 - np.finfo(out.dtype).eps)
        for _ in range(64):  # one or two rounds in practice
            still = np.linalg.norm(out.astype(np.float64), axis=1) > max_norm
            if not still.any():
                break
            out[still] *= shrink
        else:  # pragma: no cover - would need a pathological dtype
            raise RuntimeError("could not bring feature norms within max_norm")
    if single:
        out = out[0]
    if is_torch:
        return torch.from_numpy(out).to(device=v.device, dtype=v.dtype), n_clipped
    return out, n_clipped


class EmbeddedEncoder(nn.Module):
    """h: (N, 1, 28, 28) images in [0, 1] -> (N, feature_dim) L2-normalised features.

    Two 3x3 conv blocks (BatchNorm, ReLU, 2x2 max-pool) and a linear projection of the flattened map to
    ``feature_dim`` (measured on ``fmnist_public``: flattening beat a deeper net with global average pooling,
    0.88 vs 0.82 test accuracy after two epochs, in half the CPU time). Trained with a supervised
    cosine-classifier head on the public data's labels (see :class:`EncoderClassifier`); the head is not part of
    the encoder.

    Args:
        feature_dim: d, the feature size.
        width: channels of the first conv block (then 2x).
        channels: input channels.
        resolution: input side, divisible by 4.
    """

    def __init__(self, *, feature_dim: int = 64, width: int = 32, channels: int = 1, resolution: int = 28) -> None:
        super().__init__()
        self.feature_dim = feature_dim
        self.input_shape = (channels, resolution, resolution)

        def block(c_in: int, c_out: int) -> list[nn.Module]:
            return [nn.Conv2d(c_in, c_out, 3, padding=1, bias=False), nn.BatchNorm2d(c_out), nn.ReLU(True)]

        if resolution % 4:
            raise ValueError(f"resolution must be divisible by 4, got {resolution}")
        self.body = nn.Sequential(
            *block(channels, width), nn.MaxPool2d(2),
            *block(width, 2 * width), nn.MaxPool2d(2),
            nn.Flatten(),
            nn.Linear(2 * width * (resolution // 4) ** 2, feature_dim),
        )  # fmt: skip

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Unit-norm features (differentiable; use :meth:`encode` for the clipped numpy release)."""
        return F.normalize(self.body(x), dim=1)

    def encode(
        self, images: np.ndarray, *, batch_size: int = 512, device: str | torch.device | None = None
    ) -> np.ndarray:
        """Features of ``images`` (N, C, H, W) float in [0, 1]: float32 (N, d), every row of norm <= 1."""
        if tuple(images.shape[1:]) != self.input_shape:
            raise ValueError(
                f"the embedded encoder takes images of shape {self.input_shape}, got {tuple(images.shape[1:])}; "
                f"set dataset.resolution={self.input_shape[1]} and dataset.channels={self.input_shape[0]}"
            )
        return encode_images(self, images, batch_size=batch_size, device=device)


class EncoderClassifier(nn.Module):
    """The encoder with a cosine-classifier head, ``logits = scale * <W_c / ||W_c||, h(x)>``: what is trained.

    A cosine head makes classes separable by angle on the unit sphere, the geometry the inner-product k-NN of the
    IC-GAN and DP-MGE's Gaussian on features both work in.
    """

    def __init__(self, encoder: EmbeddedEncoder, num_classes: int, *, scale: float = 16.0) -> None:
        super().__init__()
        self.encoder = encoder
        self.weight = nn.Parameter(torch.randn(num_classes, encoder.feature_dim) * 0.01)
        self.scale = scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.scale * self.encoder(x) @ F.normalize(self.weight, dim=1).t()


@torch.no_grad()
def encode_images(
    net: nn.Module, images: np.ndarray, *, batch_size: int = 512, device: str | torch.device | None = None
) -> np.ndarray:
    """Run ``net`` (images -> features) over ``images`` in batches without gradients, then clip to the unit ball.

    Args:
        net: a module mapping a float (B, C, H, W) tensor to (B, d) features.
        images: float images in [0, 1], NCHW.
        batch_size: rows per forward pass.
        device: where to run (None: the CPU); the module is moved back to the CPU afterwards.

    Returns:
        float32 (N, d) features with every norm <= 1.
    """
    if images.ndim != 4:
        raise ValueError(f"images must be (N, C, H, W), got shape {tuple(images.shape)}")
    dev = torch.device(device) if device is not None else torch.device("cpu")
    was_training = net.training
    net.to(dev).eval()
    out = []
    try:
        for i in range(0, len(images), batch_size):
            chunk = torch.from_numpy(np.ascontiguousarray(images[i : i + batch_size], dtype=np.float32)).to(dev)
            out.append(net(chunk).float().cpu().numpy())
    finally:
        net.train(was_training)
        if dev.type != "cpu":
            net.to("cpu")
    dim = int(getattr(net, "feature_dim", 0))
    feats = np.concatenate(out) if out else np.zeros((0, dim), dtype=np.float32)
    # how many rows were shrunk is not logged: on private images it is a private count (docs/published-fields.md)
    feats, _ = clip_to_unit_ball(feats)
    return feats


# ----------------------------------------------------------------------------------------------------------------
# Real-checkpoint adapters (ImageNet-scale ResNet-50s); weights come from local files only.


def _missing(path: Path, what: str, url: str, filename: str) -> FileNotFoundError:
    return FileNotFoundError(
        f"{what} not found at {path}. Download {filename} from {url} and save it at that path "
        f"(the configs expect it under ${{paths.data_dir}}/checkpoints/{filename}); dpsyn never downloads weights."
    )


class ResNet50Encoder(nn.Module):
    """torchvision ResNet-50 up to global average pooling: (N, C, H, W) in [0, 1] -> (N, 2048) unit-norm features.

    Grey images are repeated to RGB, resized (bilinear, antialiased) to ``resolution`` and normalised with the
    ImageNet mean and standard deviation. Weights are read from ``checkpoint`` (a torchvision ResNet-50
    ``state_dict`` saved with ``torch.save``, e.g. ``resnet50-11ad3fa6.pth`` = ``IMAGENET1K_V2``).

    Args:
        checkpoint: path of the weights file.
        resolution: side the images are resized to (224 for ImageNet weights); None keeps the input size.

    Raises:
        FileNotFoundError: if ``checkpoint`` does not exist (the message says what to download and where).
        ValueError: if the file is not a ResNet-50 state dict.
    """

    feature_dim = 2048
    _what = "torchvision ResNet-50 weights (ResNet50_Weights.IMAGENET1K_V2)"
    _url = RESNET50_URL
    _filename = "resnet50-11ad3fa6.pth"

    def __init__(self, checkpoint: str | Path, *, resolution: int | None = 224) -> None:
        super().__init__()
        import torchvision

        path = Path(checkpoint).expanduser()
        if not path.is_file():
            raise _missing(path, self._what, self._url, self._filename)
        self.checkpoint = path
        self.resolution = resolution
        net = torchvision.models.resnet50(weights=None)
        self._load(net, path)
        net.fc = nn.Identity()
        self.net = net.eval()
        self.register_buffer("mean", torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1), persistent=False)
        self.register_buffer("std", torch.tensor(IMAGENET_STD).view(1, 3, 1, 1), persistent=False)

    def _load(self, net: nn.Module, path: Path) -> None:
        state = torch.load(path, map_location="cpu", weights_only=True)
        if isinstance(state, dict) and "state_dict" in state and isinstance(state["state_dict"], dict):
            state = state["state_dict"]
        try:
            net.load_state_dict(state)
        except (RuntimeError, TypeError) as err:
            raise ValueError(f"{path} is not a torchvision ResNet-50 state_dict: {err}") from None

    def preprocess(self, x: torch.Tensor) -> torch.Tensor:
        """[0, 1] NCHW (1 or 3 channels) -> resized, ImageNet-normalised RGB."""
        if x.shape[1] == 1:
            x = x.expand(-1, 3, -1, -1)
        elif x.shape[1] != 3:
            raise ValueError(f"images must have 1 or 3 channels, got {x.shape[1]}")
        if self.resolution is not None and tuple(x.shape[2:]) != (self.resolution, self.resolution):
            x = F.interpolate(x, size=(self.resolution, self.resolution), mode="bilinear", antialias=True,
                              align_corners=False)
        return (x - self.mean) / self.std

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.normalize(self.net(self.preprocess(x)), dim=1)

    def encode(
        self, images: np.ndarray, *, batch_size: int = 64, device: str | torch.device | None = None
    ) -> np.ndarray:
        """Unit-ball features (float32, (N, 2048)) of ``images`` in [0, 1], in batches, no gradients."""
        return encode_images(self, images, batch_size=batch_size, device=device)


class SwAVEncoder(ResNet50Encoder):
    """IC-GAN's instance feature extractor: the self-supervised SwAV ResNet-50 (800 epochs), 2048-d, unit norm.

    ``checkpoint`` is ``swav_800ep_pretrain.pth.tar`` (a ``torch.save``d state dict, possibly wrapped in
    ``{"state_dict": ...}``, whose keys carry DataParallel's ``module.`` prefix). The prefix is stripped; SwAV's
    projection head and prototypes are dropped; every ResNet-50 backbone weight must be present.
    """

    _what = "SwAV ResNet-50 weights (IC-GAN's feature extractor)"
    _url = SWAV_URL
    _filename = "swav_800ep_pretrain.pth.tar"

    def _load(self, net: nn.Module, path: Path) -> None:
        state = torch.load(path, map_location="cpu", weights_only=True)
        if isinstance(state, dict) and "state_dict" in state and isinstance(state["state_dict"], dict):
            state = state["state_dict"]
        if not isinstance(state, dict):
            raise ValueError(f"{path} is not a SwAV checkpoint (expected a state dict, got {type(state).__name__})")
        stripped = {(k[len("module."):] if k.startswith("module.") else k): v for k, v in state.items()}
        wanted = {k for k in net.state_dict() if not k.startswith("fc.")}
        # BatchNorm's step counters are bookkeeping, not weights; some exports omit them
        missing = sorted(k for k in wanted - set(stripped) if not k.endswith("num_batches_tracked"))
        if missing:
            raise ValueError(
                f"{path} is not a SwAV ResNet-50 checkpoint: {len(missing)} backbone weights missing "
                f"(first: {missing[0]})"
            )
        dropped = sorted(set(stripped) - wanted)
        if dropped:
            log.debug("SwAV checkpoint: ignoring %d non-backbone keys (e.g. %s)", len(dropped), dropped[0])
        net.load_state_dict({k: stripped[k] for k in wanted if k in stripped}, strict=False)
