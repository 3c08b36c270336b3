"""Diffusion models behind Private Evolution's RANDOM_API and VARIATION_API (paper 001, Lin et al., Alg. 1).

``load_diffusion_model(cfg.public, cache_dir=..., data_dir=...)`` reads the ``diffusion`` section of a
``conf/public`` node and returns a :class:`DiffusionModel`:

* ``name: unet`` (``conf/public/fmnist.yaml``, ``kind: embedded``): a small class-conditional DDPM (diffusers
  ``UNet2DModel``) trained by dpsyn on the public split (``fmnist_public``) through
  :mod:`dpsyn.lit.diffusion`, cached (and shipped) like the other embedded public models;
* ``name: improved_diffusion`` (``conf/public/imagenet.yaml``): a released openai/improved-diffusion checkpoint
  (the paper's ``imagenet64_cond_270M_250K.pt``) built with the user's improved-diffusion installation;
* ``name: stable_diffusion``: a local diffusers Stable Diffusion folder, text-to-image for RANDOM_API and
  image-to-image for VARIATION_API (the paper's App. J), one text prompt per condition.

The API (what PE calls)::

    model.random(labels, *, generator)                      # one image per label, float32 NCHW in [0, 1]
    model.variation(images, labels, *, degree, generator)   # SDEdit variations of `images`

Labels are public condition ids ``0..num_classes-1`` (public classes, ImageNet classes, prompts) or ``-1`` for
"no condition" where the model has one (``model.unconditional``).

**Variation degree** (one convention for every backend): ``degree`` in (0, 1] is the fraction of the (respaced)
DDIM schedule that SDEdit (Meng et al. 2022) re-runs. With ``S`` DDIM steps, the input is noised to the
``k = round(degree * S)``-th respaced timestep (forward process ``q(x_t | x_0)``) and denoised by the last ``k``
DDIM steps, conditioned on its label. ``degree=1`` noises to the top of the schedule: (almost) a fresh sample of
the label's class; smaller degrees stay closer to the input. PE's improved-diffusion setting "degree d of 100
respaced steps, d = 0, 2, ..., 40, smaller = more variation" (DPSDA skips the first d of the 100 steps) is
``degree = 1 - d / 100`` (:func:`degree_from_skipped_steps`). Stable Diffusion's img2img ``strength`` is the same
fraction (diffusers runs ``int(strength * S)`` steps).

Sampling is DDIM with eta = 0 (deterministic given the starting noise) and the predicted x_0 clipped to [-1, 1]
(improved-diffusion's ``clip_denoised``). All randomness comes from the ``generator`` argument, so a call is
reproducible; the embedded and improved-diffusion models also give the same images whatever the batch size.

Public data and public checkpoints only: nothing here spends privacy budget. Nothing is downloaded: real models come
from local paths and a missing file raises an error saying what to download and where to put it.
"""

from __future__ import annotations

import logging
import math
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from dpsyn.public.cache import (
    _as_dict,
    _key,
    _load_cached,
    _positive_int,
    _public_data,
    _resolve,
    _save,
    _sha256,
)

__all__ = [
    "DIFFUSION_ARCH_VERSION",
    "IMPROVED_DIFFUSION_URL",
    "DiffusionModel",
    "EmbeddedDiffusion",
    "ImprovedDiffusionModel",
    "StableDiffusionModel",
    "build_scheduler",
    "build_unet",
    "check_diffusion_config",
    "ddim_denoise",
    "degree_from_skipped_steps",
    "load_diffusion_model",
    "respaced_timesteps",
    "sdedit_steps",
]

log = logging.getLogger(__name__)

DIFFUSION_ARCH_VERSION = 1  # bump when build_unet, the schedule or the training loop change (old caches unused)

IMPROVED_DIFFUSION_URL = (
    "https://openaipublic.blob.core.windows.net/diffusion/march-2021/imagenet64_cond_270M_250K.pt"
)
"""The paper's model: class-conditional ImageNet 64x64, 270M parameters, 250K steps (openai/improved-diffusion)."""

# ----------------------------------------------------------------------------------------------------------------
# Config checks

_UNET_TRAIN_KEYS = (
    "block_out_channels", "layers_per_block", "mid_attention", "attention_head_dim", "norm_num_groups",
    "num_train_timesteps", "beta_schedule", "p_uncond", "steps", "batch_size", "lr", "warmup_steps", "ema_decay",
)  # fmt: skip
"""What determines the embedded weights (and so the cache key); the sampling keys do not."""

_SAMPLING_KEYS = ("ddim_steps", "spacing", "sample_batch_size")
_KEYS = {
    "unet": {"name", *_UNET_TRAIN_KEYS, *_SAMPLING_KEYS, "guidance_scale", "quality_n"},
    "improved_diffusion": {"name", "checkpoint", "flags", *_SAMPLING_KEYS},
    "stable_diffusion": {"name", "model", "prompts", "resolution", "ddim_steps", "guidance_scale",
                         "sample_batch_size", "dtype"},
}
_OPTIONAL = {"mid_attention", "attention_head_dim", "warmup_steps", "guidance_scale", "quality_n", "spacing",
             "dtype", "resolution", "flags"}
_NAMES = {"embedded": ("unet",), "real": ("improved_diffusion", "stable_diffusion")}
_BETA_SCHEDULES = ("linear", "scaled_linear", "squaredcos_cap_v2")
_SPACINGS = ("even", "leading")
_DTYPES = ("float32", "float16", "bfloat16")


def check_diffusion_config(public_cfg: dict[str, Any]) -> None:
    """Validate the ``diffusion`` section of a ``conf/public`` node (a plain dict holding ``kind`` and ``diffusion``).

    Raises:
        ValueError: in one line naming the offending key (``public.diffusion.ddim_steps``) and what is allowed.
    """
    kind = public_cfg.get("kind")
    if kind not in _NAMES:
        raise ValueError(f"public.kind={kind!r}; allowed: embedded, real")
    d = public_cfg.get("diffusion")
    if not isinstance(d, dict):
        raise ValueError("public.diffusion is missing or not a mapping")
    name = d.get("name")
    if name not in _NAMES[kind]:
        raise ValueError(f"public.diffusion.name={name!r} for public.kind={kind}; allowed: {', '.join(_NAMES[kind])}")
    allowed = _KEYS[name]
    listed = ", ".join(sorted(allowed))
    unknown = sorted(set(d) - allowed)
    if unknown:
        raise ValueError(f"unknown key public.diffusion.{unknown[0]} for public.diffusion.name={name}; allowed: {listed}")
    missing = sorted(allowed - set(d) - _OPTIONAL)
    if missing:
        raise ValueError(f"public config lacks public.diffusion.{missing[0]} (public.diffusion.name={name})")

    def key(k: str) -> str:
        return f"public.diffusion.{k}"

    _positive_int(d["ddim_steps"], key("ddim_steps"))
    _positive_int(d["sample_batch_size"], key("sample_batch_size"))
    if d.get("spacing", "even") not in _SPACINGS:
        raise ValueError(f"{key('spacing')}={d['spacing']!r}; allowed: {', '.join(_SPACINGS)}")
    if "guidance_scale" in d:
        _number(d["guidance_scale"], key("guidance_scale"), low=0.0)
    if name == "unet":
        boc = d["block_out_channels"]
        if not isinstance(boc, list) or not boc:
            raise ValueError(f"{key('block_out_channels')}={boc!r} must be a non-empty list of positive integers")
        for i, ch in enumerate(boc):
            _positive_int(ch, f"{key('block_out_channels')}[{i}]")
        for k in ("layers_per_block", "norm_num_groups", "num_train_timesteps", "steps", "batch_size"):
            _positive_int(d[k], key(k))
        if "attention_head_dim" in d:
            _positive_int(d["attention_head_dim"], key("attention_head_dim"))
        bad = [ch for ch in boc if ch % d["norm_num_groups"]]
        if bad:
            raise ValueError(f"{key('block_out_channels')} entry {bad[0]} is not divisible by "
                             f"{key('norm_num_groups')}={d['norm_num_groups']}")
        if d["beta_schedule"] not in _BETA_SCHEDULES:
            raise ValueError(f"{key('beta_schedule')}={d['beta_schedule']!r}; allowed: {', '.join(_BETA_SCHEDULES)}")
        if d["ddim_steps"] > d["num_train_timesteps"]:
            raise ValueError(f"{key('ddim_steps')}={d['ddim_steps']} exceeds "
                             f"{key('num_train_timesteps')}={d['num_train_timesteps']}")
        _number(d["p_uncond"], key("p_uncond"), low=0.0, high=1.0, high_open=True)
        _number(d["ema_decay"], key("ema_decay"), low=0.0, high=1.0, high_open=True)
        _number(d["lr"], key("lr"), low=0.0, low_open=True)
        if "mid_attention" in d and not isinstance(d["mid_attention"], bool):
            raise ValueError(f"{key('mid_attention')}={d['mid_attention']!r} must be true or false")
        for k in ("warmup_steps", "quality_n"):
            if k in d and (isinstance(d[k], bool) or not isinstance(d[k], int) or d[k] < 0):
                raise ValueError(f"{key(k)}={d[k]!r} must be a non-negative integer")
    elif name == "improved_diffusion":
        if not isinstance(d["checkpoint"], str) or not d["checkpoint"]:
            raise ValueError(f"{key('checkpoint')}={d['checkpoint']!r} must be a path")
        if not isinstance(d.get("flags", {}), dict):
            raise ValueError(f"{key('flags')} must be a mapping of create_model_and_diffusion arguments")
    else:  # stable_diffusion
        if not isinstance(d["model"], str) or not d["model"]:
            raise ValueError(f"{key('model')}={d['model']!r} must be the path of a local diffusers model folder")
        prompts = d["prompts"]
        if not isinstance(prompts, list) or not prompts or not all(isinstance(p, str) for p in prompts):
            raise ValueError(f"{key('prompts')} must be a non-empty list of strings (condition i = prompt i)")
        res = d.get("resolution", 512)
        _positive_int(res, key("resolution"))
        if res % 8:
            raise ValueError(f"{key('resolution')}={res} must be divisible by 8")
        if d.get("dtype", "float32") not in _DTYPES:
            raise ValueError(f"{key('dtype')}={d['dtype']!r}; allowed: {', '.join(_DTYPES)}")


def _number(value: Any, key: str, *, low: float, high: float = math.inf, low_open: bool = False,
            high_open: bool = False) -> None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    ok = ok and (value > low if low_open else value >= low) and (value < high if high_open else value <= high)
    if not ok:
        lo, hi = ("(" if low_open else "[") + f"{low:g}", f"{high:g}" + (")" if high_open else "]")
        raise ValueError(f"{key}={value!r} must be a number in {lo}, {hi}")


# ----------------------------------------------------------------------------------------------------------------
# Schedules and the sampler (pure functions)


def respaced_timesteps(num_train_timesteps: int, steps: int, spacing: str = "even") -> np.ndarray:
    """The ``steps`` training timesteps DDIM visits, ascending (int64).

    Args:
        num_train_timesteps: T of the training schedule.
        steps: S <= T.
        spacing: ``"even"``: ``round(linspace(0, T - 1, S))``, improved-diffusion's plain ``"S"`` respacing (what
            PE's code uses; the top step T - 1 is included, so degree 1 starts from pure noise); ``"leading"``:
            ``arange(S) * (T // S)``, diffusers' default and improved-diffusion's ``"ddimS"`` when S divides T.

    Raises:
        ValueError: for S outside 1..T or an unknown spacing.
    """
    if not 1 <= steps <= num_train_timesteps:
        raise ValueError(f"steps={steps} must be in 1..{num_train_timesteps}")
    if spacing == "even":
        ts = np.round(np.linspace(0, num_train_timesteps - 1, steps)).astype(np.int64)
    elif spacing == "leading":
        ts = np.arange(steps, dtype=np.int64) * (num_train_timesteps // steps)
    else:
        raise ValueError(f"spacing={spacing!r}; allowed: {', '.join(_SPACINGS)}")
    return ts


def sdedit_steps(degree: float, steps: int) -> int:
    """DDIM steps re-run for a variation of ``degree`` in (0, 1]: ``round(degree * steps)``, at least 1."""
    if isinstance(degree, bool) or not isinstance(degree, (int, float, np.floating)) or not 0.0 < degree <= 1.0:
        raise ValueError(f"degree={degree!r} must be in (0, 1] (the fraction of the DDIM schedule re-run)")
    return int(min(steps, max(1, round(float(degree) * steps))))


def degree_from_skipped_steps(skipped: int, steps: int = 100) -> float:
    """PE's improved-diffusion degree (respaced steps skipped at the start of an S-step schedule; 0 = most
    variation) as this module's ``degree``: ``1 - skipped / steps``."""
    if not 0 <= skipped < steps:
        raise ValueError(f"skipped={skipped} must be in 0..{steps - 1}")
    return 1.0 - skipped / steps


def ddim_denoise(
    eps_fn: Any,
    x: torch.Tensor,
    timesteps: np.ndarray,
    alphas_cumprod: torch.Tensor,
    *,
    clip: bool = True,
) -> torch.Tensor:
    """Deterministic DDIM (eta = 0) from ``x`` at ``timesteps[-1]`` down to x_0.

    Each step predicts the noise, forms ``x0 = (x - sqrt(1 - a) eps) / sqrt(a)`` (clipped to [-1, 1] with ``clip``,
    the noise then re-derived from the clipped x0, as improved-diffusion and diffusers' ``use_clipped_model_output``
    do) and moves to the next lower visited timestep: ``x = sqrt(a_prev) x0 + sqrt(1 - a_prev) eps``; after the
    last (t = timesteps[0]) ``a_prev = 1``, so the result is the final x0.

    Args:
        eps_fn: ``eps_fn(x, t) -> predicted noise`` for an int training timestep ``t``.
        x: the starting point, noised to ``timesteps[-1]``.
        timesteps: ascending training timesteps to visit (from :func:`respaced_timesteps`, possibly a prefix).
        alphas_cumprod: the training schedule's cumulative alpha products (length T).
        clip: clip the predicted x0.
    """
    abar = alphas_cumprod.to(device=x.device, dtype=torch.float64)
    for i in range(len(timesteps) - 1, -1, -1):
        t = int(timesteps[i])
        a = abar[t]
        a_prev = abar[int(timesteps[i - 1])] if i > 0 else torch.ones((), dtype=torch.float64, device=x.device)
        eps = eps_fn(x, t).to(torch.float64)
        xd = x.to(torch.float64)
        x0 = (xd - (1 - a).sqrt() * eps) / a.sqrt()
        if clip:
            x0 = x0.clamp(-1.0, 1.0)
            eps = (xd - a.sqrt() * x0) / (1 - a).sqrt()
        x = (a_prev.sqrt() * x0 + (1 - a_prev).sqrt() * eps).to(x.dtype)
    return x


class _NoiseStream:
    """Gaussian noise for consecutive images, drawn from ``generator`` in fixed chunks of images, so the noise
    of image i does not depend on the batch size (torch's draws differ by request size)."""

    def __init__(self, generator: torch.Generator, shape: tuple[int, ...], chunk: int = 256) -> None:
        self.generator, self.shape, self.chunk = generator, tuple(shape), chunk
        self.buffer = torch.empty((0, *shape))

    def take(self, n: int) -> torch.Tensor:
        parts, need = [], n
        while need > 0:
            if len(self.buffer) == 0:
                self.buffer = torch.randn((self.chunk, *self.shape), generator=self.generator,
                                          device=self.generator.device)
            part, self.buffer = self.buffer[:need], self.buffer[need:]
            parts.append(part)
            need -= len(part)
        return torch.cat(parts) if parts else torch.empty((0, *self.shape))


def _default_device(device: Any) -> torch.device:
    if device is not None:
        return torch.device(device)
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


# ----------------------------------------------------------------------------------------------------------------
# The API


class DiffusionModel:
    """PE's RANDOM_API / VARIATION_API over one diffusion model.

    Attributes:
        num_classes: public conditions (classes or prompts); 0 = an unconditional model.
        unconditional: whether label -1 ("no condition") is accepted.
        shape: (C, H, W) of the images produced (and expected by :meth:`variation`).
        batch_size: images per forward pass.
        device: where the network runs.
        record: provenance (config, cache or checkpoint path, sha256, measured quality).
    """

    num_classes: int = 0
    unconditional: bool = True
    shape: tuple[int, int, int] = (1, 1, 1)
    batch_size: int = 256
    device: torch.device = torch.device("cpu")
    record: dict[str, Any]

    def random(
        self, labels: np.ndarray, *, generator: torch.Generator, batch_size: int | None = None
    ) -> np.ndarray:
        """RANDOM_API: one fresh sample per label.

        Args:
            labels: (N,) int public condition ids in 0..num_classes-1, or -1 for none (if ``unconditional``).
            generator: the only source of randomness (a CPU ``torch.Generator``).
            batch_size: images per forward pass (None: ``self.batch_size``).

        Returns:
            float32 (N, C, H, W) images in [0, 1].
        """
        raise NotImplementedError

    def variation(
        self,
        images: np.ndarray,
        labels: np.ndarray,
        *,
        degree: float,
        generator: torch.Generator,
        batch_size: int | None = None,
    ) -> np.ndarray:
        """VARIATION_API (SDEdit): each image noised to the fraction ``degree`` of the schedule, then denoised
        conditioned on its label.

        Args:
            images: (N, C, H, W) float in [0, 1], ``(C, H, W) == self.shape``.
            labels: (N,) the images' conditions (as for :meth:`random`).
            degree: in (0, 1]; 1 = (almost) a fresh sample, smaller = closer to the input (module docstring).
            generator: the only source of randomness.
            batch_size: images per forward pass (None: ``self.batch_size``).

        Returns:
            float32 (N, C, H, W) images in [0, 1].
        """
        raise NotImplementedError

    def to(self, device: Any) -> DiffusionModel:
        """Move the network to ``device`` (None: cuda when available, else the CPU)."""
        raise NotImplementedError

    # -- input checks shared by the backends

    def _check_labels(self, labels: np.ndarray, n: int | None = None) -> np.ndarray:
        y = np.asarray(labels)
        if y.ndim != 1 or (y.size and not np.issubdtype(y.dtype, np.integer)):
            raise ValueError(f"labels must be a 1-D integer array, got dtype {y.dtype} shape {y.shape}")
        if n is not None and len(y) != n:
            raise ValueError(f"got {n} images but {len(y)} labels")
        y = y.astype(np.int64)
        if self.num_classes == 0:
            ok = y == -1
        else:
            ok = ((y >= 0) & (y < self.num_classes)) | ((y == -1) & self.unconditional)
        if not np.all(ok):
            if self.num_classes == 0:
                allowed = "-1 (an unconditional model)"
            else:
                allowed = f"0..{self.num_classes - 1}" + (" or -1 (no condition)" if self.unconditional else
                                                          " (this model has no unconditional mode)")
            raise ValueError(f"label {int(y[~ok][0])} out of range; allowed: {allowed}")
        return y

    def _check_images(self, images: np.ndarray) -> np.ndarray:
        x = np.asarray(images)
        if x.ndim != 4 or tuple(x.shape[1:]) != tuple(self.shape):
            raise ValueError(f"images must be (N, {', '.join(map(str, self.shape))}), got shape {x.shape}")
        x = x.astype(np.float32, copy=False)
        if not np.all(np.isfinite(x)):
            raise ValueError("images contain NaN or infinite values")
        if x.size and (x.min() < -1e-3 or x.max() > 1 + 1e-3):
            raise ValueError(f"images must be floats in [0, 1], got values in [{x.min():g}, {x.max():g}]")
        return x


class _DDIMModel(DiffusionModel):
    """A noise-prediction network sampled with :func:`ddim_denoise` (the embedded and improved-diffusion models)."""

    net: torch.nn.Module
    alphas_cumprod: torch.Tensor  # float64, length T
    timesteps: np.ndarray  # ascending respaced timesteps
    clip_denoised: bool = True

    def _eps(self, x: torch.Tensor, t: int, labels: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def to(self, device: Any) -> _DDIMModel:
        self.device = _default_device(device)
        self.net.to(self.device)
        return self

    @property
    def ddim_steps(self) -> int:
        return len(self.timesteps)

    def random(
        self, labels: np.ndarray, *, generator: torch.Generator, batch_size: int | None = None
    ) -> np.ndarray:
        y = self._check_labels(labels)
        return self._run(None, y, steps=self.ddim_steps, generator=generator, batch_size=batch_size)

    def variation(
        self,
        images: np.ndarray,
        labels: np.ndarray,
        *,
        degree: float,
        generator: torch.Generator,
        batch_size: int | None = None,
    ) -> np.ndarray:
        x = self._check_images(images)
        y = self._check_labels(labels, len(x))
        k = sdedit_steps(degree, self.ddim_steps)
        return self._run(x, y, steps=k, generator=generator, batch_size=batch_size)

    @torch.inference_mode()
    def _run(
        self, images: np.ndarray | None, labels: np.ndarray, *, steps: int, generator: torch.Generator,
        batch_size: int | None,
    ) -> np.ndarray:
        n, bs = len(labels), int(batch_size or self.batch_size)
        out = np.empty((n, *self.shape), dtype=np.float32)
        ts = self.timesteps[:steps]
        a_start = self.alphas_cumprod[int(ts[-1])]
        noise = _NoiseStream(generator, self.shape)
        was_training = self.net.training
        self.net.eval()
        try:
            for i in range(0, n, bs):
                z = noise.take(min(bs, n - i)).to(self.device, torch.float32)
                y = torch.from_numpy(labels[i : i + bs]).to(self.device)
                if images is None:
                    x = z
                else:  # SDEdit: q(x_t | x_0) at the starting timestep
                    x0 = torch.from_numpy(images[i : i + bs]).to(self.device) * 2.0 - 1.0
                    x = (a_start.sqrt() * x0 + (1 - a_start).sqrt() * z).float()
                x = ddim_denoise(lambda v, t, y=y: self._eps(v, t, y), x, ts, self.alphas_cumprod,
                                 clip=self.clip_denoised)
                out[i : i + bs] = ((x + 1.0) / 2.0).clamp(0.0, 1.0).float().cpu().numpy()
        finally:
            self.net.train(was_training)
        return out


# ----------------------------------------------------------------------------------------------------------------
# Embedded: diffusers UNet2DModel trained here


def build_unet(settings: dict[str, Any], *, channels: int, resolution: int, num_classes: int) -> torch.nn.Module:
    """The embedded noise-prediction network: a diffusers ``UNet2DModel`` of plain ResNet blocks, one level per
    ``block_out_channels`` entry (each but the last halving the resolution), self-attention only in the middle block
    at the lowest resolution (``mid_attention``), and a class embedding with ``num_classes + 1`` rows (the last is
    "no class") when ``num_classes > 0``.

    Raises:
        ValueError: if ``resolution`` cannot be halved ``len(block_out_channels) - 1`` times.
    """
    from diffusers import UNet2DModel

    boc = tuple(int(c) for c in settings["block_out_channels"])
    levels = len(boc) - 1
    if resolution % (2**levels):
        raise ValueError(
            f"public.diffusion.block_out_channels has {len(boc)} levels: the image side {resolution} must be "
            f"divisible by {2**levels}"
        )
    return UNet2DModel(
        sample_size=resolution,
        in_channels=channels,
        out_channels=channels,
        block_out_channels=boc,
        layers_per_block=int(settings["layers_per_block"]),
        down_block_types=("DownBlock2D",) * len(boc),
        up_block_types=("UpBlock2D",) * len(boc),
        add_attention=bool(settings.get("mid_attention", True)),
        attention_head_dim=int(settings.get("attention_head_dim", 32)),
        norm_num_groups=int(settings["norm_num_groups"]),
        num_class_embeds=num_classes + 1 if num_classes > 0 else None,
    )


def build_scheduler(settings: dict[str, Any]) -> Any:
    """The training noise schedule: diffusers' ``DDPMScheduler`` (epsilon prediction)."""
    from diffusers import DDPMScheduler

    return DDPMScheduler(num_train_timesteps=int(settings["num_train_timesteps"]),
                         beta_schedule=str(settings["beta_schedule"]), prediction_type="epsilon")


class EmbeddedDiffusion(_DDIMModel):
    """The embedded class-conditional DDPM (weights: the EMA average), sampled with DDIM.

    Args:
        unet: a trained :func:`build_unet` network.
        settings: the ``diffusion`` section (schedule, ``ddim_steps``, ``spacing``, ``guidance_scale``,
            ``sample_batch_size``).
        num_classes: public classes (0 = unconditional).
        shape: (C, H, W).
        record: provenance.
        device: None = cuda when available, else the CPU.

    ``guidance_scale`` w != 1 mixes the conditional and "no class" predictions, ``eps_u + w (eps_c - eps_u)``
    (classifier-free guidance; twice the compute). 1 = plain conditional sampling.
    """

    def __init__(
        self,
        unet: torch.nn.Module,
        *,
        settings: dict[str, Any],
        num_classes: int,
        shape: tuple[int, int, int],
        record: dict[str, Any] | None = None,
        device: Any = None,
    ) -> None:
        self.net = unet.eval()
        self.num_classes, self.shape = int(num_classes), tuple(int(s) for s in shape)  # type: ignore[assignment]
        self.unconditional = True
        self.null_label = self.num_classes
        self.alphas_cumprod = build_scheduler(settings).alphas_cumprod.to(torch.float64)
        self.timesteps = respaced_timesteps(int(settings["num_train_timesteps"]), int(settings["ddim_steps"]),
                                            str(settings.get("spacing", "even")))
        self.guidance_scale = float(settings.get("guidance_scale", 1.0))
        self.batch_size = int(settings["sample_batch_size"])
        self.record = record or {}
        self.to(device)

    @classmethod
    def from_checkpoint(cls, weights: str | Path, *, device: Any = None, **overrides: Any) -> EmbeddedDiffusion:
        """Load a cached or shipped ``<key>.safetensors`` with the settings its ``<key>.json`` sidecar records,
        without the training data (``overrides`` replace sampling settings such as ``ddim_steps``)."""
        from safetensors.torch import load_file

        from dpsyn.results.io import read_json

        weights = Path(weights)
        record = read_json(weights.with_suffix(".json"))
        settings = {**_SAMPLING_DEFAULTS, **record.get("sampling", {}), **record["settings"], **overrides}
        with torch.random.fork_rng():
            torch.manual_seed(int(record["seed"]))
            unet = build_unet(settings, channels=record["shape"][0], resolution=record["shape"][1],
                              num_classes=int(record["num_classes"]))
        unet.load_state_dict(load_file(str(weights)))
        return cls(unet, settings=settings, num_classes=int(record["num_classes"]), shape=tuple(record["shape"]),
                   record={"kind": "embedded", "weights": str(weights), **record}, device=device)

    def _eps(self, x: torch.Tensor, t: int, labels: torch.Tensor) -> torch.Tensor:
        tt = torch.full((len(x),), t, device=x.device, dtype=torch.long)
        if self.num_classes == 0:
            return self.net(x, tt).sample
        y = torch.where(labels < 0, torch.full_like(labels, self.null_label), labels)
        w = self.guidance_scale
        if w == 1.0 or bool((labels < 0).all()):  # "no class" rows: guidance would change nothing
            return self.net(x, tt, class_labels=y).sample
        both = self.net(torch.cat([x, x]), torch.cat([tt, tt]),
                        class_labels=torch.cat([y, torch.full_like(y, self.null_label)])).sample
        cond, uncond = both.chunk(2)
        return uncond + w * (cond - uncond)


_SAMPLING_DEFAULTS = {"ddim_steps": 25, "spacing": "even", "guidance_scale": 1.0, "sample_batch_size": 256}


def _sampling_settings(d: dict[str, Any]) -> dict[str, Any]:
    return {k: d.get(k, v) for k, v in _SAMPLING_DEFAULTS.items()}


def _train_settings(d: dict[str, Any]) -> dict[str, Any]:
    defaults = {"mid_attention": True, "attention_head_dim": 32, "warmup_steps": 0}
    return {k: d.get(k, defaults.get(k)) for k in _UNET_TRAIN_KEYS}


def _load_embedded(cfg: dict[str, Any], *, cache_dir: Path, data_dir: Path, progress: bool,
                   device: Any) -> EmbeddedDiffusion:
    from dpsyn.lit.diffusion import train_diffusion

    d, seed = cfg["diffusion"], int(cfg["seed"])
    public, data, provenance = _public_data(cfg, data_dir)
    num_classes = len(data.public_classes or data.classes)
    c, res = int(public.x.shape[1]), int(public.x.shape[2])
    settings = _train_settings(d)
    key = _key(f"{cfg['name']}-diffusion", {"arch": DIFFUSION_ARCH_VERSION, "settings": settings, "seed": seed,
                                             "num_classes": num_classes, "data": provenance})
    with torch.random.fork_rng():  # initial weights follow `seed`, not the caller's RNG state
        torch.manual_seed(seed)
        unet = build_unet(settings, channels=c, resolution=res, num_classes=num_classes)
    folder = cache_dir / "public"
    weights, meta = folder / f"{key}.safetensors", folder / f"{key}.json"
    record = _load_cached(unet, weights, meta)
    if record is not None:
        log.info("public diffusion model %s loaded from %s", key, record.get("shipped", weights))
        return EmbeddedDiffusion(unet, settings={**settings, **d}, num_classes=num_classes, shape=(c, res, res),
                                 record=_embedded_record(cfg, weights, record), device=device)

    n_params = sum(p.numel() for p in unet.parameters())
    log.info("training the public diffusion model %s (%d parameters, %d steps) on %s (%d images)", key, n_params,
             settings["steps"], cfg["dataset"], len(public))
    with torch.random.fork_rng():
        fit = train_diffusion(unet, build_scheduler(settings), public.x, public.y, settings=settings,
                              num_classes=num_classes, seed=seed, progress=progress)
    record = {
        "key": key, "arch_version": DIFFUSION_ARCH_VERSION, "settings": settings, "seed": seed,
        "num_classes": num_classes, "shape": [c, res, res], "parameters": n_params, "data": provenance,
        "library": _library_versions(), **fit,
        "sampling": _sampling_settings(d),  # the defaults of from_checkpoint, and what `quality` was measured with
    }
    model = EmbeddedDiffusion(unet, settings={**settings, **d}, num_classes=num_classes, shape=(c, res, res),
                              record=record, device=device)
    if int(d.get("quality_n", 0)) > 0:
        record["quality"] = measure_quality(model, data, cfg, cache_dir=cache_dir, data_dir=data_dir)
    unet.to("cpu")
    _save(unet, weights, meta, record)
    model.to(device)
    model.record = _embedded_record(cfg, weights, record)
    log.info("public diffusion model %s cached at %s", key, weights)
    return model


def _embedded_record(cfg: dict[str, Any], weights: Path, record: dict[str, Any]) -> dict[str, Any]:
    return {"kind": "embedded", "name": "unet", "config": cfg["diffusion"], "cache": str(weights), **record}


def _library_versions() -> dict[str, str]:
    import diffusers

    return {"torch": torch.__version__, "diffusers": diffusers.__version__}


def measure_quality(
    model: DiffusionModel, data: Any, cfg: dict[str, Any], *, cache_dir: Path, data_dir: Path
) -> dict[str, Any]:
    """Quality of the embedded model, judged by the family's evaluation network (never by the model's own data).

    * ``class_acc``: of ``quality_n`` samples drawn for class c (an equal number per class), how many the
      evaluation network classifies as c (and per class);
    * ``fd_evalnet``: Frechet distance between those samples and the eval split in the evaluation network's
      feature space; ``fd_evalnet_real``: the same for as many real public images (the floor at this sample size);
      ``fd_evalnet_uncond``: for as many samples drawn with label -1;
    * ``variation``: at degrees 0.2 / 0.5 / 0.8, for 256 eval images: the mean pixel MSE between image and variation
      and how often the variation is still classified as the image's class.
    """

    from dpsyn.data import load_dataset
    from dpsyn.metrics.evalnet import extract_features, load_or_train_evalnet
    from dpsyn.metrics.fidelity import frechet_distance_from_features
    from dpsyn.lit.classifier import predict
    from dpsyn.config import load_group as _load_group

    t0 = time.perf_counter()
    seed = int(cfg["seed"])
    k = max(1, model.num_classes)
    per_class = max(1, int(cfg["diffusion"]["quality_n"]) // k)
    family = load_dataset(_load_group("dataset", data.family), seed=0, data_dir=data_dir)
    net, net_record = load_or_train_evalnet(family, settings=dict(cfg["quality"]["evalnet"]), cache_dir=cache_dir)
    labels = np.repeat(np.arange(model.num_classes), per_class) if model.num_classes else np.full(per_class, -1)
    log.info("measuring the diffusion model: %d class-conditional samples", len(labels))
    samples = model.random(labels, generator=torch.Generator().manual_seed(seed))
    real_feats = extract_features(net, data.eval.x)
    result: dict[str, Any] = {"n": int(len(labels)), "ddim_steps": getattr(model, "ddim_steps", None),
                              "guidance_scale": getattr(model, "guidance_scale", None),
                              "classifier": f"evalnet {net_record['key']}",
                              "classifier_test_acc": net_record.get("test_acc")}
    if model.num_classes:
        # the evaluation network's classes are the family's; the public labels are the same names here
        pred = predict(net, samples).argmax(1)
        result["class_acc"] = float((pred == labels).mean())
        result["class_acc_per_class"] = [round(float((pred[labels == c] == c).mean()), 4)
                                         for c in range(model.num_classes)]
    result["fd_evalnet"] = frechet_distance_from_features(extract_features(net, samples), real_feats)
    rows = np.random.default_rng(seed).choice(len(data.public), size=min(len(labels), len(data.public)),
                                              replace=False)
    result["fd_evalnet_real"] = frechet_distance_from_features(extract_features(net, data.public.x[rows]),
                                                               real_feats)
    uncond = model.random(np.full(len(labels), -1), generator=torch.Generator().manual_seed(seed + 1))
    result["fd_evalnet_uncond"] = frechet_distance_from_features(extract_features(net, uncond), real_feats)
    rows = np.random.default_rng(seed).choice(len(data.eval), size=min(256, len(data.eval)), replace=False)
    x, y = data.eval.x[rows], data.eval.y[rows]
    result["variation"] = {}
    for degree in (0.2, 0.5, 0.8):
        v = model.variation(x, y, degree=degree, generator=torch.Generator().manual_seed(seed))
        result["variation"][str(degree)] = {
            "mse": float(((v - x) ** 2).mean()),
            "class_acc": float((predict(net, v).argmax(1) == y).mean()),
        }
    result["seconds"] = round(time.perf_counter() - t0, 2)
    return result


# ----------------------------------------------------------------------------------------------------------------
# Real: improved-diffusion checkpoints


class ImprovedDiffusionModel(_DDIMModel):
    """A released openai/improved-diffusion checkpoint, built with the user's improved-diffusion installation.

    ``improved_diffusion.script_util.model_and_diffusion_defaults()`` updated with ``flags`` (the checkpoint's
    MODEL_FLAGS and DIFFUSION_FLAGS from improved-diffusion's README) is passed to ``create_model_and_diffusion``;
    the model's output (noise, plus the variance channels when ``learn_sigma``) and the diffusion's
    ``alphas_cumprod`` drive :func:`ddim_denoise` over the ``ddim_steps`` respaced timesteps. Labels are ImageNet
    class ids; a class-conditional checkpoint has no "no class" mode (draw class ids instead: PE draws them
    uniformly).

    Args:
        checkpoint: the ``.pt`` state dict.
        flags: ``create_model_and_diffusion`` arguments.
        ddim_steps, spacing: the respacing (PE: 100, even).
        batch_size: images per forward pass.
        device: None = cuda when available, else the CPU.

    Raises:
        FileNotFoundError: if ``checkpoint`` is missing (the message says what to download and where).
        ImportError: if ``improved_diffusion`` cannot be imported (the message says what to install).
        ValueError: for flags ``create_model_and_diffusion`` does not take.
    """

    def __init__(
        self,
        checkpoint: str | Path,
        *,
        flags: dict[str, Any],
        ddim_steps: int = 100,
        spacing: str = "even",
        batch_size: int = 256,
        device: Any = None,
    ) -> None:
        path = Path(checkpoint)
        if not path.is_file():
            name = IMPROVED_DIFFUSION_URL.rsplit("/", 1)[1]
            raise FileNotFoundError(
                f"improved-diffusion checkpoint not found: {path}. Download {name} from {IMPROVED_DIFFUSION_URL} "
                f"(openai/improved-diffusion) and put it there (or set public.diffusion.checkpoint); dpsyn never "
                "downloads weights."
            )
        try:
            from improved_diffusion import script_util
        except ImportError as err:
            raise ImportError(
                "the improved_diffusion adapter needs openai/improved-diffusion's code: git clone "
                "https://github.com/openai/improved-diffusion && pip install -e improved-diffusion "
                f"(so that `import improved_diffusion.script_util` works); import failed with: {err}"
            ) from err
        args = dict(script_util.model_and_diffusion_defaults())
        unknown = sorted(set(flags) - set(args))
        if unknown:
            raise ValueError(f"unknown key public.diffusion.flags.{unknown[0]}; allowed: {', '.join(sorted(args))}")
        args.update(flags)
        args["timestep_respacing"] = ""  # the full schedule: dpsyn respaces (ddim_steps, spacing) itself
        net, diffusion = script_util.create_model_and_diffusion(**args)
        net.load_state_dict(torch.load(path, map_location="cpu", weights_only=True))
        self.net = net.eval()
        self.alphas_cumprod = torch.as_tensor(np.asarray(diffusion.alphas_cumprod, dtype=np.float64))
        self.num_train_timesteps = len(self.alphas_cumprod)
        self.timesteps = respaced_timesteps(self.num_train_timesteps, int(ddim_steps), spacing)
        self.learn_sigma = bool(args.get("learn_sigma", False))
        self.predict_xstart = bool(args.get("predict_xstart", False))
        self.rescale_timesteps = bool(args.get("rescale_timesteps", False))
        self.num_classes = int(getattr(script_util, "NUM_CLASSES", 1000)) if args.get("class_cond") else 0
        self.unconditional = not args.get("class_cond")
        self.shape = (3, int(args["image_size"]), int(args["image_size"]))
        self.batch_size = int(batch_size)
        self.record = {"kind": "real", "name": "improved_diffusion", "checkpoint": str(path), "sha256": _sha256(path),
                       "flags": {k: args[k] for k in sorted(flags)}, "ddim_steps": int(ddim_steps),
                       "spacing": spacing}
        self.to(device)

    def _eps(self, x: torch.Tensor, t: int, labels: torch.Tensor) -> torch.Tensor:
        tt = torch.full((len(x),), t, device=x.device, dtype=torch.long)
        t_in = tt.float() * (1000.0 / self.num_train_timesteps) if self.rescale_timesteps else tt
        out = self.net(x, t_in, y=labels) if self.num_classes else self.net(x, t_in)
        out = out[:, : x.shape[1]]  # learn_sigma: the second half of the channels is the variance
        if self.predict_xstart:
            a = self.alphas_cumprod[t].to(x.device, x.dtype)
            out = (x - a.sqrt() * out) / (1 - a).sqrt()
        return out


# ----------------------------------------------------------------------------------------------------------------
# Real: Stable Diffusion through diffusers


class StableDiffusionModel(DiffusionModel):
    """Stable Diffusion from a local diffusers folder: RANDOM_API = text-to-image of the label's prompt,
    VARIATION_API = image-to-image of the label's prompt with ``strength = degree`` (SDEdit inside diffusers).

    Condition i is ``prompts[i]``; label -1 is the empty prompt. The scheduler is replaced by DDIM (from the
    folder's scheduler config, so its timestep spacing is the model's own). Reproducible given ``generator`` and
    the batch size (diffusers draws each batch's latents at once).

    Raises:
        FileNotFoundError: if the folder or its ``model_index.json`` is missing.
        ImportError: without transformers (Stable Diffusion's text encoder).
    """

    def __init__(
        self,
        folder: str | Path,
        *,
        prompts: list[str],
        resolution: int = 512,
        ddim_steps: int = 50,
        guidance_scale: float = 7.5,
        batch_size: int = 8,
        dtype: str = "float32",
        device: Any = None,
    ) -> None:
        folder = Path(folder)
        if not (folder / "model_index.json").is_file():
            raise FileNotFoundError(
                f"Stable Diffusion model folder not found: {folder} (no model_index.json). Download a diffusers-"
                "format model, e.g. `huggingface-cli download stable-diffusion-v1-5/stable-diffusion-v1-5 "
                f"--local-dir {folder}`, or point public.diffusion.model at one; dpsyn never downloads weights."
            )
        try:
            import transformers  # noqa: F401  (the CLIP text encoder and tokenizer)
        except ImportError as err:
            raise ImportError(f"the stable_diffusion adapter needs transformers: pip install transformers ({err})") from err
        from diffusers import DDIMScheduler, StableDiffusionImg2ImgPipeline, StableDiffusionPipeline

        pipe = StableDiffusionPipeline.from_pretrained(
            str(folder), local_files_only=True, torch_dtype=getattr(torch, dtype), safety_checker=None,
            feature_extractor=None, requires_safety_checker=False,
        )
        pipe.scheduler = DDIMScheduler.from_config(pipe.scheduler.config)
        pipe.set_progress_bar_config(disable=True)
        self.text2img = pipe
        self.img2img = StableDiffusionImg2ImgPipeline(**pipe.components, requires_safety_checker=False)
        self.img2img.set_progress_bar_config(disable=True)
        self.prompts = list(prompts)
        self.num_classes, self.unconditional = len(self.prompts), True
        self.shape = (3, int(resolution), int(resolution))
        self.ddim_steps, self.guidance_scale = int(ddim_steps), float(guidance_scale)
        self.batch_size = int(batch_size)
        files = sorted(p for p in folder.rglob("*") if p.suffix in (".safetensors", ".bin", ".ckpt"))
        self.record = {
            "kind": "real", "name": "stable_diffusion", "model": str(folder), "prompts": self.prompts,
            "resolution": int(resolution), "ddim_steps": self.ddim_steps, "guidance_scale": self.guidance_scale,
            "dtype": dtype, "sha256": {str(p.relative_to(folder)): _sha256(p) for p in files},
        }
        self.to(device)

    def to(self, device: Any) -> StableDiffusionModel:
        self.device = _default_device(device)
        self.text2img.to(self.device)  # the img2img pipeline shares the same modules
        return self

    def _prompts(self, labels: np.ndarray) -> list[str]:
        return [self.prompts[int(v)] if v >= 0 else "" for v in labels]

    @torch.inference_mode()
    def random(
        self, labels: np.ndarray, *, generator: torch.Generator, batch_size: int | None = None
    ) -> np.ndarray:
        y = self._check_labels(labels)
        bs, (_, h, w) = int(batch_size or self.batch_size), self.shape
        out = [
            self.text2img(prompt=self._prompts(y[i : i + bs]), height=h, width=w,
                          num_inference_steps=self.ddim_steps, guidance_scale=self.guidance_scale,
                          generator=generator, output_type="pt").images.float().cpu()
            for i in range(0, len(y), bs)
        ]
        return _stack(out, self.shape)

    @torch.inference_mode()
    def variation(
        self,
        images: np.ndarray,
        labels: np.ndarray,
        *,
        degree: float,
        generator: torch.Generator,
        batch_size: int | None = None,
    ) -> np.ndarray:
        x = self._check_images(images)
        y = self._check_labels(labels, len(x))
        sdedit_steps(degree, self.ddim_steps)  # validates the degree
        bs = int(batch_size or self.batch_size)
        out = [
            self.img2img(prompt=self._prompts(y[i : i + bs]), image=torch.from_numpy(x[i : i + bs]).clamp(0, 1),
                         strength=float(degree), num_inference_steps=self.ddim_steps,
                         guidance_scale=self.guidance_scale, generator=generator, output_type="pt").images.float().cpu()
            for i in range(0, len(x), bs)
        ]
        return _stack(out, self.shape)


def _stack(parts: list[torch.Tensor], shape: tuple[int, ...]) -> np.ndarray:
    if not parts:
        return np.zeros((0, *shape), dtype=np.float32)
    return torch.cat(parts).clamp(0, 1).numpy().astype(np.float32, copy=False)


# ----------------------------------------------------------------------------------------------------------------
# Loading


def load_diffusion_model(
    public_cfg: Any, *, cache_dir: str | Path, data_dir: str | Path, progress: bool = True, device: Any = None
) -> DiffusionModel:
    """The diffusion model of ``public_cfg``'s ``diffusion`` section: loaded from the cache or the package's shipped
    weights, or trained (embedded ``unet``), or built from local checkpoints (real adapters).

    Args:
        public_cfg: a whole ``conf/public/<name>.yaml`` node (DictConfig or dict).
        cache_dir: ``${paths.cache_dir}``; embedded weights are cached under ``<cache_dir>/public``.
        data_dir: ``${paths.data_dir}``: the public dataset, and what relative checkpoint paths are resolved against.
        progress: show Lightning's progress bar while training.
        device: where the network runs (None: cuda when available, else the CPU).

    Raises:
        ValueError: if the node has no ``diffusion`` section or it is invalid (before any work).
        FileNotFoundError: for missing data, checkpoints or model folders (the message says what to get and where).
        ImportError: for ``improved_diffusion`` without openai/improved-diffusion importable.
    """
    cfg = _as_dict(public_cfg)
    if cfg.get("diffusion") is None:
        raise ValueError(
            f"public config {cfg.get('name')!r} has no diffusion section (public.diffusion): PE needs one; see "
            "conf/public/fmnist.yaml (embedded) or conf/public/imagenet.yaml (improved_diffusion, stable_diffusion)"
        )
    check_diffusion_config(cfg)
    d, data_dir = cfg["diffusion"], Path(data_dir)
    if d["name"] == "unet":
        return _load_embedded(cfg, cache_dir=Path(cache_dir), data_dir=data_dir, progress=progress, device=device)
    if d["name"] == "improved_diffusion":
        return ImprovedDiffusionModel(_resolve(d["checkpoint"], data_dir), flags=dict(d.get("flags") or {}),
                                      ddim_steps=int(d["ddim_steps"]), spacing=str(d.get("spacing", "even")),
                                      batch_size=int(d["sample_batch_size"]), device=device)
    return StableDiffusionModel(_resolve(d["model"], data_dir), prompts=list(d["prompts"]),
                                resolution=int(d.get("resolution", 512)), ddim_steps=int(d["ddim_steps"]),
                                guidance_scale=float(d.get("guidance_scale", 7.5)),
                                batch_size=int(d["sample_batch_size"]), dtype=str(d.get("dtype", "float32")),
                                device=device)

