"""A GAN in the feature space of the public encoder h: the shared core of paper 000's baselines DP-GAN-FT and
DP-GAN-MI (``dpsyn.methods.dp_gan_ft``, ``dpsyn.methods.dp_gan_mi``).

Paper 000 (appendix, "Baselines") describes both as 4-layer MLP generator and discriminator working on feature
vectors ``v = h(x)``; a generated vector is decoded into an image by the public instance-conditioned generator g.
What is here:

* :class:`FeatureGenerator`: ``(z, y) -> v`` on the unit sphere (h's features are L2-normalised, and so are the
  vectors g was trained to decode);
* :class:`FeatureDiscriminator`: ``(v, y) -> logit``, an MLP without normalisation layers (per-sample gradients);
* :class:`FeatureGANModule`: the Lightning module. It *is* :class:`dpsyn.lit.gan.GANModule` (the DP-SGD
  discriminator step, the empty-Poisson-batch noise step, the frozen-discriminator generator step are written once,
  there) plus a ``stage`` — ``"public_pretrain"`` (non-private, public features, every label the "no class"
  token) or ``"private_finetune"`` / ``"private_scratch"`` (the DP-SGD stage on private features) — and a step limit
  for the non-private stage; its checkpoints also carry the record of the public pretraining its weights descend
  from (``checkpoint["dpsyn"]["pretraining"]``), so a resumed run can check it and skip the pretraining;
* :func:`fit_feature_gan_stage`: one stage run by a Lightning Trainer, optionally resumed from a checkpoint.

Labels. The repository scores downstream accuracy, so the feature GAN is class-conditional in the manner of the
repo's ``dp_gan`` (one-hot label concatenated to the input). The one-hot has ``num_classes + 1`` entries; the last
one, :attr:`FeatureGANModule.null_label`, marks "no class" and is the only label used while pretraining on public
features (the public classes are not the private ones). This conditioning is a reconstruction: paper 000's
baselines are unconditional (scored by FID only).
"""

from __future__ import annotations

import logging
from typing import Any

import lightning as L
import torch
from torch import nn
from torch.nn import functional as F

from dpsyn.lit.gan import GANModule

log = logging.getLogger(__name__)

STAGES: tuple[str, ...] = ("public_pretrain", "private_finetune", "private_scratch")
"""``public_pretrain``: non-private, public features only. The two private stages are DP-SGD (or, at eps=inf,
plain SGD) on private features: after public pretraining (DP-GAN-FT) or from a fresh initialisation (DP-GAN-MI)."""


def _mlp(sizes: list[int]) -> nn.Sequential:
    """Linear layers of the given sizes with LeakyReLU(0.2) between them (none after the last)."""
    layers: list[nn.Module] = []
    for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:])):
        layers.append(nn.Linear(a, b))
        if i < len(sizes) - 2:
            layers.append(nn.LeakyReLU(0.2))
    return nn.Sequential(*layers)


def _check_sizes(layers: int, hidden: int) -> None:
    if isinstance(layers, bool) or not isinstance(layers, int) or layers < 2:
        raise ValueError(f"layers={layers!r} must be an integer >= 2 (paper 000: 4)")
    if isinstance(hidden, bool) or not isinstance(hidden, int) or hidden < 1:
        raise ValueError(f"hidden={hidden!r} must be a positive integer")


class FeatureGenerator(nn.Module):
    """G(z, y) -> a unit-norm feature vector: an MLP on ``[z, one_hot(y)]``, then L2 normalisation.

    Args:
        z_dim: latent size.
        feature_dim: d, the size of h's features.
        num_labels: one-hot size (the private classes + the "no class" token).
        hidden: width of the hidden layers.
        layers: number of linear layers (paper 000: 4).
    """

    def __init__(self, *, z_dim: int, feature_dim: int, num_labels: int, hidden: int = 256, layers: int = 4) -> None:
        super().__init__()
        _check_sizes(layers, hidden)
        self.z_dim, self.feature_dim, self.num_labels = z_dim, feature_dim, num_labels
        self.net = _mlp([z_dim + num_labels] + [hidden] * (layers - 1) + [feature_dim])

    def forward(self, z: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        out = self.net(torch.cat([z, F.one_hot(y, self.num_labels).to(z.dtype)], dim=1))
        return F.normalize(out, dim=1)  # h's features, and g's inputs, live on the unit sphere


class FeatureDiscriminator(nn.Module):
    """D(v, y) -> logit: an MLP on ``[v, one_hot(y)]`` with no normalisation layers (Opacus per-sample gradients).

    Args:
        feature_dim: d.
        num_labels: one-hot size.
        hidden: width of the hidden layers.
        layers: number of linear layers (paper 000: 4).
    """

    def __init__(self, *, feature_dim: int, num_labels: int, hidden: int = 256, layers: int = 4) -> None:
        super().__init__()
        _check_sizes(layers, hidden)
        self.num_labels = num_labels
        self.net = _mlp([feature_dim + num_labels] + [hidden] * (layers - 1) + [1])

    def forward(self, v: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return self.net(torch.cat([v, F.one_hot(y, self.num_labels).to(v.dtype)], dim=1)).squeeze(1)


class FeatureGANModule(GANModule):
    """:class:`~dpsyn.lit.gan.GANModule` on feature vectors, with a training stage.

    Args:
        stage: one of :data:`STAGES`.
        null_label: the "no class" label; in ``public_pretrain`` every generated row gets it (the real public rows
            carry it too), otherwise generated rows get labels drawn uniformly from ``range(num_classes)``.
        max_steps: non-private stages stop after this many discriminator steps (None: the Trainer's epochs). The DP
            stage stops at ``dp["max_steps"]`` (what its noise was calibrated for), as in GANModule.
        pretraining: the record (settings and outcome) of the public pretraining the weights descend from, None
            when there is none; written into checkpoints under ``checkpoint["dpsyn"]["pretraining"]``.
        **kwargs: :class:`~dpsyn.lit.gan.GANModule`'s arguments.
    """

    def __init__(self, *, stage: str, null_label: int, max_steps: int | None = None,
                 pretraining: dict[str, Any] | None = None, **kwargs: Any) -> None:
        if stage not in STAGES:
            raise ValueError(f"stage={stage!r}; allowed: {', '.join(STAGES)}")
        super().__init__(**kwargs)
        if stage == "public_pretrain" and self.dp is not None:
            raise ValueError("the public pretraining stage is non-private: it must not get a DP optimizer")
        self.stage, self.null_label, self.max_steps = stage, int(null_label), max_steps
        self.pretraining = pretraining

    def _latent(self, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        z = torch.randn(n, self.z_dim, device=self.device)
        if self.stage == "public_pretrain":
            y = torch.full((n,), self.null_label, dtype=torch.long, device=self.device)
        else:
            y = torch.randint(0, self.num_classes, (n,), device=self.device)
        return z, y

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        if self.dp is None and self.max_steps is not None and self.dp_steps >= self.max_steps:
            self.trainer.should_stop = True
            return
        super().training_step(batch, batch_idx)

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        super().on_save_checkpoint(checkpoint)  # dp_steps and the DP calibration
        checkpoint["dpsyn"].update(stage=self.stage, pretraining=self.pretraining)


def fit_feature_gan_stage(
    module: FeatureGANModule,
    loader: Any,
    *,
    epochs: int,
    trainer_kwargs: dict[str, Any],
    logger: Any = None,
    callbacks: list[L.Callback] | None = None,
    ckpt_path: str | None = None,
) -> None:
    """Run one stage of the feature GAN with a Lightning Trainer.

    Args:
        module: the stage's module.
        loader: its data (public features with the null label, or private features with their labels; a Poisson
            ``DPDataLoader`` for a DP stage).
        epochs: Trainer ``max_epochs``.
        trainer_kwargs: Trainer arguments (from ``conf/trainer``), ``max_epochs`` excluded.
        logger: a Lightning logger or None.
        callbacks: Trainer callbacks (e.g. :class:`~dpsyn.lit.gan.PeriodicCheckpoint`).
        ckpt_path: a checkpoint of this stage to resume from (weights, optimizer states, loop progress and, through
            :meth:`~dpsyn.lit.gan.GANModule.on_load_checkpoint`, the steps already made), or None.
    """
    trainer = L.Trainer(
        max_epochs=epochs,
        logger=logger if logger is not None else False,
        enable_checkpointing=False,  # the caller's PeriodicCheckpoint writes the one checkpoint a resume needs
        use_distributed_sampler=False,
        num_sanity_val_steps=0,
        callbacks=callbacks or [],
        **trainer_kwargs,
    )
    trainer.fit(module, train_dataloaders=loader, ckpt_path=ckpt_path)
    log.info("feature GAN stage %s: %d discriminator steps", module.stage, module.dp_steps)
