"""Instance-conditioned generator g(z, h(x)) of paper 000 (DP-MGE / DP-DRE decode features with it).

IC-GAN (Casanova et al. 2021) models the data distribution as a mixture of instance-conditional distributions:
for each training instance ``x_i`` the generator, given ``h(x_i)`` and noise ``z``, must produce images that the
discriminator — also conditioned on ``h(x_i)`` — cannot tell from the real *neighbours* of ``x_i`` (its k nearest
neighbours by inner product of the unit-norm features, ``x_i`` itself included). Decoding a feature vector ``v``
then samples an image whose features lie near ``v``; paper 000 decodes DP-estimated features this way.

* :class:`InstanceConditionedGenerator` / :class:`InstanceConditionedDiscriminator`: small DCGAN-like nets for
  28x28 grey images, the embedded stand-in trained by :func:`train_icgan` on ``fmnist_public`` (a few CPU minutes).
  The discriminator is a projection discriminator (Miyato & Koyama 2018), as in IC-GAN's BigGAN backbone.
* :func:`knn_indices`: the neighbourhoods, with faiss's exact ``IndexFlatIP`` when faiss is importable (on a GPU when
  faiss has one: :mod:`dpsyn.nn_index` makes that choice for every faiss search of dpsyn).
* :class:`ICGANGenerator`: a released IC-GAN (BigGAN backbone) loaded through the user's ic_gan checkout.

The training step (:class:`dpsyn.lit.icgan.ICGANModule`) lives with the other LightningModules in ``dpsyn.lit``.

Public data only: nothing here touches private data, so nothing here spends privacy budget.
"""

from __future__ import annotations

import logging
import pickle
import time
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, RandomSampler, TensorDataset

from dpsyn.lit.icgan import ICGANModule

# faiss (exact inner-product search, faster than a matmul on large public sets) is None where it is not importable
# (no wheel for every platform); torch's matmul + top-k is exact too
from dpsyn.nn_index import faiss, knn_search

__all__ = [
    "GENERATOR_ARCH_VERSION",
    "ICGANGenerator",
    "ICGANModule",
    "ICGAN_URL",
    "InstanceConditionedDiscriminator",
    "InstanceConditionedGenerator",
    "knn_indices",
    "neighbourhood_purity",
    "train_icgan",
]

log = logging.getLogger(__name__)

GENERATOR_ARCH_VERSION = 1  # bump when the nets or the training loop change, so old caches are not reused

ICGAN_URL = "https://dl.fbaipublicfiles.com/ic_gan/icgan_biggan_imagenet_res256.tar.gz"
"""The released unconditional IC-GAN (BigGAN backbone, ImageNet, 256x256; facebookresearch/ic_gan README)."""


def knn_indices(features: np.ndarray, k: int, *, backend: str = "auto", batch_size: int = 4096) -> np.ndarray:
    """Indices of each row's ``k`` nearest rows by inner product (cosine for unit-norm rows), itself included.

    Args:
        features: (N, D) float features.
        k: neighbourhood size, 1..N.
        backend: ``"faiss"`` (``IndexFlatIP``, exact; on a GPU when faiss has one: :func:`dpsyn.nn_index.use_gpu`),
            ``"torch"`` (exact: chunked matmul + top-k) or ``"auto"`` (faiss when importable).
        batch_size: query rows per chunk (torch backend).

    Returns:
        int64 (N, k), each row ordered by decreasing similarity.

    Raises:
        ValueError: for an invalid ``k`` or ``backend``; ImportError if ``backend="faiss"`` and faiss is missing.
    """
    feats = np.ascontiguousarray(features, dtype=np.float32)
    if feats.ndim != 2:
        raise ValueError(f"features must be (N, D), got shape {feats.shape}")
    n = len(feats)
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or not 1 <= k <= n:
        raise ValueError(f"k={k!r} must be an integer in 1..{n}")
    if backend not in ("auto", "faiss", "torch"):
        raise ValueError(f"backend={backend!r}; allowed: auto, faiss, torch")
    if backend == "faiss" and faiss is None:
        raise ImportError("backend='faiss' needs faiss: pip install faiss-cpu")
    if backend in ("auto", "faiss") and faiss is not None:
        return knn_search(feats, feats, int(k), kind="flat", metric="ip", purpose="IC-GAN neighbourhoods")
    table = torch.from_numpy(feats)
    out = np.empty((n, int(k)), dtype=np.int64)
    with torch.no_grad():
        for i in range(0, n, batch_size):
            sims = table[i : i + batch_size] @ table.t()
            out[i : i + batch_size] = sims.topk(int(k), dim=1).indices.numpy()
    return out


class _CondBatchNorm2d(nn.Module):
    """BatchNorm without its own affine, scaled and shifted by linear functions of the condition (as in BigGAN)."""

    def __init__(self, channels: int, cond_dim: int) -> None:
        super().__init__()
        self.bn = nn.BatchNorm2d(channels, affine=False)
        self.gain = nn.Linear(cond_dim, channels)
        self.bias = nn.Linear(cond_dim, channels)
        nn.init.zeros_(self.gain.weight)
        nn.init.zeros_(self.gain.bias)
        nn.init.zeros_(self.bias.weight)
        nn.init.zeros_(self.bias.bias)

    def forward(self, x: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        return self.bn(x) * (1 + self.gain(c)[:, :, None, None]) + self.bias(c)[:, :, None, None]


class InstanceConditionedGenerator(nn.Module):
    """g(z, h): a linear layer to (2*ngf, s, s) (s = resolution/4), two (nearest x2 upsample, 3x3 conv) stages,
    a 3x3 conv to the image, sigmoid. (Upsample + conv rather than transposed convs: no checkerboard artefacts.)

    The condition ``[z, h]`` enters at the input and, through conditional BatchNorm, at every stage.

    Args:
        z_dim: noise size.
        feature_dim: size of the instance features h.
        ngf: width.
        channels: image channels.
        resolution: image side, divisible by 4.
    """

    def __init__(
        self, *, z_dim: int = 64, feature_dim: int = 64, ngf: int = 64, channels: int = 1, resolution: int = 28
    ) -> None:
        super().__init__()
        if resolution % 4:
            raise ValueError(f"resolution must be divisible by 4, got {resolution}")
        self.z_dim, self.feature_dim, self.ngf, self.start = z_dim, feature_dim, ngf, resolution // 4
        self.image_shape = (channels, resolution, resolution)
        cond = z_dim + feature_dim
        self.fc = nn.Linear(cond, 2 * ngf * self.start * self.start)
        self.bn0 = _CondBatchNorm2d(2 * ngf, cond)
        self.conv1 = nn.Conv2d(2 * ngf, ngf, 3, padding=1)
        self.bn1 = _CondBatchNorm2d(ngf, cond)
        self.conv2 = nn.Conv2d(ngf, ngf // 2, 3, padding=1)  # half width at full resolution: CPU time
        self.bn2 = _CondBatchNorm2d(ngf // 2, cond)
        self.out = nn.Conv2d(ngf // 2, channels, 3, padding=1)

    def forward(self, z: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        c = torch.cat([z, h], dim=1)
        x = self.fc(c).view(len(z), 2 * self.ngf, self.start, self.start)
        x = F.relu(self.bn0(x, c))
        x = F.relu(self.bn1(self.conv1(F.interpolate(x, scale_factor=2.0, mode="nearest")), c))
        x = F.relu(self.bn2(self.conv2(F.interpolate(x, scale_factor=2.0, mode="nearest")), c))
        return torch.sigmoid(self.out(x))  # images live in [0, 1]

    @torch.no_grad()
    def decode(
        self,
        features: np.ndarray,
        *,
        generator: torch.Generator | None = None,
        batch_size: int = 1000,
        normalize: bool = True,
        device: str | torch.device | None = None,
        z: np.ndarray | None = None,
    ) -> np.ndarray:
        """One image per feature row: ``g(z, v)`` with ``z ~ N(0, I)`` drawn from ``generator``.

        Args:
            features: (N, feature_dim) feature vectors.
            generator: source of the noise z (None: torch's global RNG). Must live on the CPU.
            batch_size: rows per forward pass.
            normalize: project rows onto the unit sphere first (the generator was trained on unit-norm features;
                a DP-MGE sample from N(mu, diag s) is not on it). Zero rows stay zero.
            device: where to run (None: the CPU).
            z: (N, z_dim) noise to use instead of drawing it (PE's variations perturb a sample's own z).

        Returns:
            float32 (N, C, H, W) images in [0, 1].
        """
        return _decode(self, features, self.z_dim, self.feature_dim, generator=generator, batch_size=batch_size,
                       normalize=normalize, device=device, to_unit=lambda x: x, z=z)


def _decode(
    net: nn.Module,
    features: np.ndarray,
    z_dim: int,
    feature_dim: int,
    *,
    generator: torch.Generator | None,
    batch_size: int,
    normalize: bool,
    device: str | torch.device | None,
    to_unit: Any,
    truncation: float | None = None,
    forward: Any = None,
    z: np.ndarray | None = None,
) -> np.ndarray:
    feats = np.asarray(features, dtype=np.float32)
    if feats.ndim != 2 or feats.shape[1] != feature_dim:
        raise ValueError(f"features must be (N, {feature_dim}), got shape {feats.shape}")
    if not np.all(np.isfinite(feats)):
        raise ValueError("features contain NaN or infinite values")
    dev = torch.device(device) if device is not None else torch.device("cpu")
    was_training = net.training
    net.to(dev).eval()
    fwd = forward or net
    # all noise drawn at once: the images do not depend on batch_size (torch draws differ by request size)
    if z is not None:
        noise = torch.as_tensor(np.asarray(z, dtype=np.float32))
        if noise.shape != (len(feats), z_dim):
            raise ValueError(f"z must be ({len(feats)}, {z_dim}), got shape {tuple(noise.shape)}")
    else:
        noise = torch.randn(len(feats), z_dim, generator=generator)
    if truncation is not None:
        noise = noise.clamp(-truncation, truncation)
    out = []
    try:
        for i in range(0, len(feats), batch_size):
            h = torch.from_numpy(feats[i : i + batch_size])
            if normalize:
                h = F.normalize(h, dim=1)
            z = noise[i : i + batch_size]
            out.append(to_unit(fwd(z.to(dev), h.to(dev))).clamp(0, 1).float().cpu().numpy())
    finally:
        net.train(was_training)
        if dev.type != "cpu":
            net.to("cpu")
    if not out:
        return np.zeros((0, 1, 1, 1), dtype=np.float32)
    return np.concatenate(out)


class InstanceConditionedDiscriminator(nn.Module):
    """D(x, h) -> logit = w . phi(x) + <P h, phi(x)>: a projection discriminator, no normalisation layers.

    phi: two stride-2 4x4 convs (LeakyReLU 0.2) and a linear layer to ``hidden`` units.
    """

    def __init__(
        self, *, feature_dim: int = 64, ndf: int = 64, channels: int = 1, resolution: int = 28, hidden: int = 256
    ) -> None:
        super().__init__()
        self.phi = nn.Sequential(
            nn.Conv2d(channels, ndf, 4, 2, 1), nn.LeakyReLU(0.2),
            nn.Conv2d(ndf, 2 * ndf, 4, 2, 1), nn.LeakyReLU(0.2),
            nn.Flatten(),
            nn.Linear(2 * ndf * (resolution // 4) ** 2, hidden), nn.LeakyReLU(0.2),
        )  # fmt: skip
        self.out = nn.Linear(hidden, 1)
        self.proj = nn.Linear(feature_dim, hidden, bias=False)

    def forward(self, x: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        f = self.phi(x)
        return self.out(f).squeeze(1) + (self.proj(h) * f).sum(1)


def train_icgan(
    images: np.ndarray,
    features: np.ndarray,
    *,
    settings: dict[str, Any],
    seed: int,
    labels: np.ndarray | None = None,
    progress: bool = True,
) -> tuple[InstanceConditionedGenerator, dict[str, Any]]:
    """Train the embedded IC-GAN on public ``images`` with their encoder ``features``.

    Args:
        images: (N, C, H, W) float32 in [0, 1].
        features: (N, d) unit-norm features of ``images``.
        settings: ``z_dim``, ``ngf``, ``ndf``, ``k``, ``steps``, ``batch_size``, ``lr_g``, ``lr_d``, ``beta1``,
            ``ema_decay``, optional ``knn_backend`` (auto | faiss | torch).
        seed: seeds the initial weights, the instance sampling and the noise.
        labels: the images' labels, only to report the neighbourhoods' class purity (training never uses them).
        progress: show Lightning's progress bar.

    Returns:
        The averaged (EMA) generator in eval mode, and a record: k-NN backend and timing, neighbourhood purity
        (with ``labels``), training seconds, final losses.
    """
    n, d = features.shape
    c, res = images.shape[1], images.shape[2]
    k = int(settings["k"])
    t0 = time.perf_counter()
    backend = str(settings.get("knn_backend", "auto"))
    neighbours = knn_indices(features, k, backend=backend)
    knn_s = time.perf_counter() - t0
    L.seed_everything(seed, verbose=False)
    gen = InstanceConditionedGenerator(
        z_dim=int(settings["z_dim"]), feature_dim=d, ngf=int(settings["ngf"]), channels=c, resolution=res
    )
    disc = InstanceConditionedDiscriminator(feature_dim=d, ndf=int(settings["ndf"]), channels=c, resolution=res)
    module = ICGANModule(
        generator=gen,
        discriminator=disc,
        images=torch.from_numpy(np.ascontiguousarray(images, dtype=np.float32)),
        features=torch.from_numpy(np.ascontiguousarray(features, dtype=np.float32)),
        neighbours=torch.from_numpy(neighbours),
        lr_g=float(settings["lr_g"]),
        lr_d=float(settings["lr_d"]),
        beta1=float(settings["beta1"]),
        ema_decay=float(settings["ema_decay"]),
    )
    steps, batch = int(settings["steps"]), int(settings["batch_size"])
    sampler = RandomSampler(range(n), replacement=True, num_samples=steps * batch,
                            generator=torch.Generator().manual_seed(seed))
    loader = DataLoader(TensorDataset(torch.arange(n)), batch_size=batch, sampler=sampler, drop_last=True)
    trainer = L.Trainer(
        max_epochs=1,
        accelerator="cpu",  # the embedded models are sized for the CPU; data tensors live there
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_model_summary=False,
        enable_progress_bar=progress,
        log_every_n_steps=50,
    )
    t1 = time.perf_counter()
    trainer.fit(module, train_dataloaders=loader)
    train_s = time.perf_counter() - t1
    released = module.G_ema if float(settings["ema_decay"]) > 0 else module.G
    gen.load_state_dict(released.state_dict())
    gen.eval()
    record = {
        "knn_backend": "faiss" if (backend != "torch" and faiss is not None) else "torch",
        "knn_seconds": round(knn_s, 2),
        "train_seconds": round(train_s, 2),
        "steps": steps,
        "final_loss_d": float(trainer.callback_metrics.get("train/loss_d", float("nan"))),
        "final_loss_g": float(trainer.callback_metrics.get("train/loss_g", float("nan"))),
    }
    if labels is not None:
        record["neighbourhood_purity"] = neighbourhood_purity(neighbours, np.asarray(labels))
    return gen, record


def neighbourhood_purity(neighbours: np.ndarray, labels: np.ndarray) -> float:
    """Fraction of (instance, neighbour) pairs, self excluded, that share the instance's label."""
    same = labels[neighbours[:, 1:]] == labels[:, None]
    return float(same.mean()) if same.size else 1.0


# ----------------------------------------------------------------------------------------------------------------
# Real adapter: a released IC-GAN through the user's ic_gan checkout.


class ICGANGenerator(nn.Module):
    """A released IC-GAN generator (BigGAN backbone), built by the user's ic_gan code, conditioned on SwAV features.

    ``checkpoint_dir`` is an extracted release, e.g. ``icgan_biggan_imagenet_res256/`` from
    ``icgan_biggan_imagenet_res256.tar.gz``, holding ``state_dict_best0.pth`` (the training config and best FID)
    and ``G_ema_best0.pth`` (the generator weights); where both ``best0`` and ``best1`` exist the one with the lower
    recorded FID is used, as ic_gan's own inference code does. The network class comes from ic_gan's
    ``BigGAN_PyTorch.BigGAN`` module, so the ic_gan repository root must be importable (on ``PYTHONPATH``).

    Args:
        checkpoint_dir: the extracted release folder.
        truncation: clamp z to [-truncation, truncation] (None: no truncation).
        trust_pickle: ``state_dict_best*.pth`` is loaded with ``torch.load(weights_only=True)``; if that refuses
            the file, pass True to unpickle it fully (only for a file from the official release).

    Raises:
        FileNotFoundError: if the folder or its files are missing (the message says what to download and where).
        ImportError: if ic_gan's ``BigGAN_PyTorch`` cannot be imported (the message says what to install).
    """

    def __init__(
        self, checkpoint_dir: str | Path, *, truncation: float | None = None, trust_pickle: bool = False
    ) -> None:
        super().__init__()
        folder = Path(checkpoint_dir).expanduser()
        configs = sorted(folder.glob("state_dict_best*.pth")) if folder.is_dir() else []
        if not configs:
            raise FileNotFoundError(
                f"IC-GAN generator not found in {folder} (no state_dict_best*.pth). Download "
                f"{ICGAN_URL.rsplit('/', 1)[1]} from {ICGAN_URL} (facebookresearch/ic_gan) and extract it under "
                f"${{paths.data_dir}}/checkpoints/ so that {folder}/G_ema_best0.pth exists; dpsyn never downloads "
                "weights."
            )
        try:
            from BigGAN_PyTorch import BigGAN
        except ImportError as err:
            raise ImportError(
                "the IC-GAN adapter needs ic_gan's code: git clone https://github.com/facebookresearch/ic_gan, "
                "install its requirements, and put the clone's root on PYTHONPATH (so that "
                f"`import BigGAN_PyTorch.BigGAN` works); import failed with: {err}"
            ) from err
        best_name, best_fid, config = None, float("inf"), None
        for path in configs:
            state = self._load_pickle(path, trust_pickle)
            fid = float(state.get("best_FID", float("inf")))
            if config is None or fid < best_fid:
                best_name, best_fid, config = path.stem.removeprefix("state_dict_"), fid, state["config"]
        weights = folder / f"G_ema_{best_name}.pth"
        if not weights.is_file():
            weights = folder / f"G_{best_name}.pth"
        if not weights.is_file():
            raise FileNotFoundError(
                f"IC-GAN generator weights G_ema_{best_name}.pth / G_{best_name}.pth missing in {folder}; "
                f"re-extract {ICGAN_URL.rsplit('/', 1)[1]} from {ICGAN_URL}"
            )
        config = dict(config)
        config.update(skip_init=True, no_optim=True)  # inference only: no init pass, no optimizer
        net = BigGAN.Generator(**config)
        net.load_state_dict(torch.load(weights, map_location="cpu", weights_only=True))
        self.net = net.eval()
        self.z_dim = int(net.dim_z)
        self.feature_dim = int(config.get("shared_dim_feat", 2048))
        res = int(config.get("resolution", 256))
        self.image_shape = (3, res, res)
        self.truncation = truncation
        self.record = {"checkpoint": str(weights), "best_fid": best_fid, "resolution": res}

    @staticmethod
    def _load_pickle(path: Path, trust_pickle: bool) -> dict[str, Any]:
        try:
            return torch.load(path, map_location="cpu", weights_only=not trust_pickle)
        except pickle.UnpicklingError as err:
            raise ValueError(
                f"{path} holds objects torch.load(weights_only=True) refuses ({err}); if the file is from the "
                "official IC-GAN release, set public.generator.trust_pickle=true"
            ) from None

    @torch.no_grad()
    def decode(
        self,
        features: np.ndarray,
        *,
        generator: torch.Generator | None = None,
        batch_size: int = 16,
        normalize: bool = True,
        device: str | torch.device | None = None,
        z: np.ndarray | None = None,
    ) -> np.ndarray:
        """One image per feature row, ``G(z, None, v)`` mapped from [-1, 1] to [0, 1] (see
        :meth:`InstanceConditionedGenerator.decode` for the arguments)."""
        return _decode(self.net, features, self.z_dim, self.feature_dim, generator=generator,
                       batch_size=batch_size, normalize=normalize, device=device, to_unit=lambda x: (x + 1) / 2,
                       truncation=self.truncation, forward=lambda z, h: self.net(z, None, h), z=z)
