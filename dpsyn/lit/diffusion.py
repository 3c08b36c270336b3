"""LightningModule that trains the embedded diffusion model behind PE's RANDOM_API / VARIATION_API.

A class-conditional DDPM (Ho et al. 2020) with the epsilon-prediction loss ``|| eps - eps_theta(x_t, t, y) ||^2``,
``x_t = sqrt(abar_t) x_0 + sqrt(1 - abar_t) eps``, ``t`` uniform over the training timesteps (diffusers'
``DDPMScheduler`` holds the noise schedule and adds the noise). With probability ``p_uncond`` a label is replaced
by the "no class" token (index ``num_classes`` of the UNet's class embedding), so one network also samples without
a class (and can do classifier-free guidance). An exponential moving average of the weights is kept; that average
is what is released and sampled from.

Public data only: nothing here spends privacy budget. The sampler (DDIM, SDEdit) lives in
:mod:`dpsyn.public.diffusion`.
"""

from __future__ import annotations

import copy
import math
import time
from typing import Any

import lightning as L
import numpy as np
import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, RandomSampler, TensorDataset

from dpsyn.lit.ema import update_ema

__all__ = ["DiffusionModule", "drop_labels", "train_diffusion", "warmup_cosine"]


def drop_labels(labels: torch.Tensor, null_label: int, p: float) -> torch.Tensor:
    """``labels`` with each entry replaced by ``null_label`` with probability ``p`` (the global torch RNG)."""
    if p <= 0:
        return labels
    drop = torch.rand(labels.shape, device=labels.device) < p
    return torch.where(drop, torch.full_like(labels, null_label), labels)


def warmup_cosine(step: int, *, warmup: int, total: int) -> float:
    """Learning-rate factor: linear warm-up over ``warmup`` steps, then a cosine decay to 0 at ``total``."""
    if step < warmup:
        return (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return 0.5 * (1.0 + math.cos(math.pi * progress))


class DiffusionModule(L.LightningModule):
    """Noise-prediction training of a diffusers ``UNet2DModel`` with an EMA copy.

    Args:
        unet: the network, ``unet(x_t, t, class_labels=y).sample`` predicts the noise; built with
            ``num_class_embeds = num_classes + 1`` (or without a class embedding when ``num_classes`` is 0).
        scheduler: a diffusers ``DDPMScheduler`` (the training noise schedule).
        num_classes: public classes (0 = unconditional); label ``num_classes`` is the "no class" token.
        p_uncond: probability of training a row with the "no class" token.
        lr: AdamW peak learning rate (weight decay 0).
        warmup_steps, total_steps: the learning-rate schedule (:func:`warmup_cosine`).
        ema_decay: the average's decay (0 disables it; then the live weights are released).
    """

    def __init__(
        self,
        *,
        unet: nn.Module,
        scheduler: Any,
        num_classes: int,
        p_uncond: float,
        lr: float,
        warmup_steps: int,
        total_steps: int,
        ema_decay: float,
    ) -> None:
        super().__init__()
        self.unet = unet
        # left in train mode while training (never run then); only its parameters follow the live ones
        self.unet_ema = copy.deepcopy(unet).requires_grad_(False)
        self.scheduler = scheduler
        self.num_train_timesteps = int(scheduler.config.num_train_timesteps)
        self.num_classes, self.p_uncond = num_classes, p_uncond
        self.lr, self.warmup_steps, self.total_steps, self.ema_decay = lr, warmup_steps, total_steps, ema_decay
        self.ema_updates = 0

    def configure_optimizers(self) -> dict[str, Any]:
        opt = torch.optim.AdamW(self.unet.parameters(), lr=self.lr, weight_decay=0.0)
        sched = torch.optim.lr_scheduler.LambdaLR(
            opt, lambda s: warmup_cosine(s, warmup=self.warmup_steps, total=self.total_steps)
        )
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}

    def loss(self, x0: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """The epsilon-prediction MSE of a batch of images ``x0`` in [-1, 1] with their class ``labels``."""
        noise = torch.randn_like(x0)
        t = torch.randint(0, self.num_train_timesteps, (len(x0),), device=x0.device)
        x_t = self.scheduler.add_noise(x0, noise, t)
        if self.num_classes > 0:
            y = drop_labels(labels, self.num_classes, self.p_uncond)
            pred = self.unet(x_t, t, class_labels=y).sample
        else:
            pred = self.unet(x_t, t).sample
        return F.mse_loss(pred, noise)

    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = self.loss(x * 2.0 - 1.0, y)  # images in [0, 1] -> the model's [-1, 1]
        self.log("train/loss", loss, prog_bar=True, on_step=True, batch_size=len(x))
        return loss

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        self._update_ema()

    def _update_ema(self) -> None:
        update_ema(self.unet_ema, self.unet, step=self.ema_updates, max_decay=self.ema_decay)
        self.ema_updates += 1


def train_diffusion(
    unet: nn.Module,
    scheduler: Any,
    images: np.ndarray,
    labels: np.ndarray,
    *,
    settings: dict[str, Any],
    num_classes: int,
    seed: int,
    progress: bool = True,
) -> dict[str, Any]:
    """Train ``unet`` in place on public ``images`` (its weights become the EMA average) and return a record.

    Args:
        unet: a freshly initialised ``UNet2DModel``.
        scheduler: the ``DDPMScheduler`` of the noise schedule.
        images: (N, C, H, W) float32 in [0, 1].
        labels: (N,) int64 class ids in 0..num_classes-1 (ignored when ``num_classes`` is 0).
        settings: ``steps``, ``batch_size``, ``lr``, ``warmup_steps``, ``ema_decay``, ``p_uncond``.
        num_classes: public classes (0 trains an unconditional model).
        seed: seeds the batch order, the timesteps, the noise and the label dropping.
        progress: show Lightning's progress bar.

    Returns:
        Training seconds, steps, batch size, the mean loss of the last 10% of the steps.
    """
    steps, batch = int(settings["steps"]), int(settings["batch_size"])
    L.seed_everything(seed, verbose=False)
    module = DiffusionModule(
        unet=unet,
        scheduler=scheduler,
        num_classes=num_classes,
        p_uncond=float(settings["p_uncond"]),
        lr=float(settings["lr"]),
        warmup_steps=int(settings["warmup_steps"]),
        total_steps=steps,
        ema_decay=float(settings["ema_decay"]),
    )
    losses: list[float] = []

    class _Losses(L.Callback):
        def on_train_batch_end(self, trainer: L.Trainer, pl_module: Any, outputs: Any, b: Any, i: int) -> None:
            losses.append(float(outputs["loss"]))

    x = torch.from_numpy(np.ascontiguousarray(images, dtype=np.float32))
    y = torch.from_numpy(np.asarray(labels, dtype=np.int64))
    sampler = RandomSampler(range(len(x)), replacement=True, num_samples=steps * batch,
                            generator=torch.Generator().manual_seed(seed))
    loader = DataLoader(TensorDataset(x, y), batch_size=batch, sampler=sampler, drop_last=True)
    trainer = L.Trainer(
        max_epochs=1,
        accelerator="cpu",  # the embedded model is sized for the CPU; its data tensors live there
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_model_summary=False,
        enable_progress_bar=progress,
        callbacks=[_Losses()],
        log_every_n_steps=50,
    )
    t0 = time.perf_counter()
    trainer.fit(module, train_dataloaders=loader)
    train_s = time.perf_counter() - t0
    if module.ema_decay > 0:
        unet.load_state_dict(module.unet_ema.state_dict())
    unet.eval()
    tail = losses[-max(1, len(losses) // 10):]
    return {
        "train_seconds": round(train_s, 2),
        "steps": len(losses),
        "batch_size": batch,
        "final_loss": float(np.mean(tail)) if tail else float("nan"),
        "released": "ema" if module.ema_decay > 0 else "live",
    }
