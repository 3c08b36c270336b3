"""LightningModule for a (DP-)GAN: the discriminator optionally trained with Opacus DP-SGD, the generator not.

The generator only sees the discriminator, so it is post-processing of the discriminator's DP releases
(Xie et al. 2018, DP-GAN). Each discriminator step is one sampled-Gaussian release:

* real batch: Poisson-sampled by Opacus's ``DPDataLoader`` (the sampling scheme the RDP accountant assumes);
* fake batch: as many generated samples as real ones, paired row by row with the real batch. Opacus sums the
  per-sample gradients of the two forward passes row-wise, so row i's gradient is grad(real_i) + grad(fake_i),
  clipped as one. Removing a private record removes one row, so the L2 sensitivity stays ``max_grad_norm``
  (the construction of Opacus's DCGAN example);
* the clipped sum is noised and divided by the *expected* batch size (Poisson DP-SGD must not divide by the
  realised size).

Manual optimisation, because two optimizers alternate and the grad-sample hooks must be off during the generator
step (the generator's loss backpropagates through D, which would otherwise leave per-sample gradients behind).
"""

from __future__ import annotations

import contextlib
import math
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import lightning as L
import torch
from torch import nn
from torch.nn import functional as F

from dpsyn.privacy import gaussian_mechanism


class GANModule(L.LightningModule):
    """Conditional GAN with an optionally DP discriminator.

    Args:
        generator: G(z, y).
        discriminator: D(x, y) -> logits; wrapped in an Opacus ``GradSampleModule`` by the caller when private.
        z_dim: latent size.
        num_classes: label range for generated samples.
        expected_batch_size: the Poisson loader's expected batch size (also the generator's batch size).
        lr_g, lr_d, beta1: Adam settings.
        dp: None for a non-private run, else a dict with ``noise_multiplier``, ``max_grad_norm``,
            ``generator`` (torch.Generator for the DP noise) and ``max_steps`` (the steps the budget was
            calibrated for: training stops there, whatever the Trainer would do).
    """

    def __init__(
        self,
        *,
        generator: nn.Module,
        discriminator: nn.Module,
        z_dim: int,
        num_classes: int,
        expected_batch_size: int,
        lr_g: float,
        lr_d: float,
        beta1: float,
        dp: dict[str, Any] | None,
    ) -> None:
        super().__init__()
        self.automatic_optimization = False
        self.G, self.D = generator, discriminator
        self.z_dim, self.num_classes, self.batch = z_dim, num_classes, expected_batch_size
        self.lr_g, self.lr_d, self.beta1 = lr_g, lr_d, beta1
        self.dp = dp
        self.dp_steps = 0  # discriminator releases made: what the ledger charges

    def configure_optimizers(self) -> list[torch.optim.Optimizer]:
        opt_g = torch.optim.Adam(self.G.parameters(), lr=self.lr_g, betas=(self.beta1, 0.999))
        opt_d: torch.optim.Optimizer = torch.optim.Adam(self.D.parameters(), lr=self.lr_d, betas=(self.beta1, 0.999))
        if self.dp is not None:
            from dpsyn.lit.dpsgd import dp_optimizer

            # the noisy clipped sum divided by the expected batch size
            opt_d = dp_optimizer(opt_d, noise_multiplier=self.dp["noise_multiplier"],
                                 max_grad_norm=self.dp["max_grad_norm"], expected_batch_size=self.batch,
                                 generator=self.dp["generator"])
        return [opt_g, opt_d]

    def _latent(self, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        z = torch.randn(n, self.z_dim, device=self.device)
        y = torch.randint(0, self.num_classes, (n,), device=self.device)
        return z, y

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        if self.dp is not None and self.dp_steps >= self.dp["max_steps"]:
            self.trainer.should_stop = True  # the budget was calibrated for max_steps releases
            return
        x, y = batch
        b = len(x)
        opt_g, opt_d = self.optimizers(use_pl_optimizer=False)

        if self.dp is not None and b == 0:
            noise_only_step(opt_d)  # an empty Poisson batch is still a release: noise alone
            self.dp_steps += 1
            return
        # discriminator: sum losses (per-sample gradients unscaled); the optimizer divides by the expected size
        opt_d.zero_grad(set_to_none=True)
        with torch.no_grad():
            # generate at least an expected-size batch (BatchNorm needs > 1 row), use as many rows as real ones
            z, y_fake = self._latent(max(self.batch, b))
            fake = self.G(z, y_fake)[:b]
            y_fake = y_fake[:b]
        loss_real = F.binary_cross_entropy_with_logits(self.D(x, y), torch.ones(b, device=self.device), reduction="sum")
        loss_fake = F.binary_cross_entropy_with_logits(
            self.D(fake, y_fake), torch.zeros(b, device=self.device), reduction="sum"
        )
        loss_d = loss_real + loss_fake
        if self.dp is None:
            loss_d = loss_d / self.batch
        self.manual_backward(loss_d)
        opt_d.step()
        self.dp_steps += 1

        # generator: post-processing of the DP discriminator; D is frozen (no parameter or per-sample gradients)
        with self._frozen_discriminator():
            z, y_g = self._latent(self.batch)
            loss_g = F.binary_cross_entropy_with_logits(
                self.D(self.G(z, y_g), y_g), torch.ones(self.batch, device=self.device)
            )
            opt_g.zero_grad(set_to_none=True)
            self.manual_backward(loss_g)
            opt_g.step()

        # Under DP only what is post-processing of the released discriminator is logged: loss_g (a fixed-size batch of
        # fakes through the DP-trained D). loss_d reads the private batch without noise, and its size is the Poisson
        # draw; logs end up in W&B and CSV files, so they would be an unaccounted release.
        logs = {"train/loss_g": loss_g.item()}
        if self.dp is None:
            logs["train/loss_d"] = (loss_real + loss_fake).item() / max(b, 1)
        self.log_dict(logs, prog_bar=True, on_step=True, batch_size=self.batch)

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        # the releases made so far: a resumed run charges them once (they are not re-made, not forgotten)
        checkpoint["dpsyn"] = {
            "dp_steps": self.dp_steps,
            "noise_multiplier": None if self.dp is None else self.dp["noise_multiplier"],
            "max_steps": None if self.dp is None else self.dp["max_steps"],
        }

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        self.dp_steps = int(checkpoint["dpsyn"]["dp_steps"])

    @contextlib.contextmanager
    def _frozen_discriminator(self) -> Iterator[None]:
        """Turn off D's parameter gradients and, when DP, Opacus's grad-sample hooks (measured: the generator step
        costs 5x more with functorch per-sample gradients left on)."""
        params = [p for p in self.D.parameters() if p.requires_grad]
        if self.dp is not None:
            self.D.disable_hooks()
        for p in params:
            p.requires_grad_(False)
        try:
            yield
        finally:
            for p in params:
                p.requires_grad_(True)
            if self.dp is not None:
                self.D.enable_hooks()

    @torch.no_grad()
    def generate(self, labels: torch.Tensor, batch_size: int = 1000) -> torch.Tensor:
        """Images for the given labels, generator in eval mode (BatchNorm running statistics)."""
        was_training = self.G.training
        self.G.eval()
        out = []
        for i in range(0, len(labels), batch_size):
            y = labels[i : i + batch_size].to(self.device)
            out.append(self.G(torch.randn(len(y), self.z_dim, device=self.device), y).cpu())
        self.G.train(was_training)
        return torch.cat(out) if out else torch.empty(0)


class PeriodicCheckpoint(L.Callback):
    """Every ``every`` discriminator steps, and at the end of each epoch, write ``path`` atomically (a kill during
    the write leaves the previous checkpoint intact)."""

    def __init__(self, path: Path, every: int) -> None:
        self.path, self.every = Path(path), max(1, int(every))

    def _save(self, trainer: L.Trainer) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(f".{self.path.name}.tmp")
        trainer.save_checkpoint(tmp, weights_only=False)  # the full training state, for resuming
        os.replace(tmp, self.path)

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, *args: Any) -> None:
        if pl_module.dp_steps % self.every == 0:
            self._save(trainer)

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._save(trainer)


def noise_only_step(optimizer: Any) -> None:
    """The DP-SGD update for an empty Poisson batch: N(0, (noise_multiplier * max_grad_norm)^2) / expected batch.

    What Opacus's ``DPOptimizer`` computes when the clipped sum is zero; done here because Opacus's functorch
    per-sample path fails on a zero-size batch, and skipping the step would reveal that the batch was empty.
    """
    std = optimizer.noise_multiplier * optimizer.max_grad_norm
    for p in optimizer.params:
        noise = gaussian_mechanism(torch.zeros(p.shape, device=p.device), std, generator=optimizer.generator)
        p.grad = (noise / optimizer.expected_batch_size).to(p.dtype)
    optimizer.original_optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def planned_steps(*, epochs: int, batches_per_epoch: int, limit_train_batches: int | float | None) -> int:
    """Number of discriminator steps a Trainer will run (what the noise is calibrated for).

    Follows Lightning's convention: a float ``limit_train_batches`` is a fraction of the epoch, an int a count.
    """
    if limit_train_batches is None:
        per_epoch = batches_per_epoch
    elif isinstance(limit_train_batches, float):
        per_epoch = max(1, int(math.floor(batches_per_epoch * limit_train_batches)))
    else:
        per_epoch = min(batches_per_epoch, int(limit_train_batches))
    return epochs * per_epoch
