"""``dp_gan``: DP-GAN (Xie et al. 2018) — a class-conditional DCGAN whose discriminator is trained with DP-SGD.

The baseline of papers 000 and 002. The discriminator is the only part that touches private data; it is trained
with Opacus DP-SGD (per-sample clipping, Gaussian noise) under Poisson sampling, accounted with the configured
accountant (RDP by default); the generator is post-processing. The noise multiplier is calibrated once, before
training, for the exact number of discriminator steps the Trainer will run, so the run spends at most its target.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, TensorDataset

from dpsyn.data.base import Split
from dpsyn.lit.gan import GANModule, PeriodicCheckpoint, planned_steps
from dpsyn.methods.base import METHODS, Method, PrivacyBudget, Samples
from dpsyn.nets.dcgan import CondDCGANDiscriminator, CondDCGANGenerator
from dpsyn.privacy import (
    NonPrivateEvent,
    PrivacyLedger,
    SampledGaussianEvent,
    dp_generator,
    dpsgd_noise_multiplier,
)

log = logging.getLogger(__name__)


def _check_resumable(ckpt: Path, dp: dict[str, Any] | None) -> int:
    """Steps already made by the checkpointed run; refuses a checkpoint made under another privacy calibration.

    Raises:
        ValueError: the checkpoint's noise multiplier or step budget differs from this run's.
    """
    state = torch.load(ckpt, map_location="cpu", weights_only=False)["dpsyn"]
    want = (None, None) if dp is None else (dp["noise_multiplier"], dp["max_steps"])
    if (state["noise_multiplier"], state["max_steps"]) != want:
        raise ValueError(
            f"{ckpt} was trained with noise multiplier {state['noise_multiplier']} for {state['max_steps']} steps, "
            f"this config calibrates {want[0]} for {want[1]}: resume with the same config, or use a new run directory"
        )
    return int(state["dp_steps"])


@METHODS.register("dp_gan")
class DPGAN(Method):
    """DP-GAN on images (see the module docstring)."""

    kinds = ("image",)

    def fit(
        self, private: Split, budget: PrivacyBudget, ledger: PrivacyLedger, public: Split | None = None
    ) -> None:
        import lightning as L

        cfg, ctx = self.cfg, self.ctx
        L.seed_everything(ctx.seed, workers=True, verbose=False)
        channels, resolution = ctx.shape[0], ctx.shape[1]
        G = CondDCGANGenerator(
            z_dim=cfg.z_dim, num_classes=ctx.num_classes, channels=channels, resolution=resolution, ngf=cfg.ngf
        )
        D: Any = CondDCGANDiscriminator(num_classes=ctx.num_classes, channels=channels, resolution=resolution, ndf=cfg.ndf)
        data = TensorDataset(torch.from_numpy(private.x), torch.from_numpy(private.y))
        n, batch = len(data), int(cfg.batch_size)
        if batch > n:
            raise ValueError(f"method.batch_size={batch} exceeds the {n} private examples")
        trainer_kwargs = dict(ctx.trainer)
        epochs = trainer_kwargs.pop("max_epochs", None) or int(cfg.epochs)

        dp: dict[str, Any] | None = None
        if budget.private:
            from opacus import GradSampleModule
            from opacus.data_loader import DPDataLoader

            sample_rate = batch / n
            # Poisson sampling: the scheme the accountant assumes. Its randomness is part of the mechanism,
            # so it is drawn from OS entropy like the noise, not from the run seed.
            loader = DPDataLoader(
                data,
                sample_rate=sample_rate,
                generator=dp_generator(deterministic=ctx.deterministic_noise, seed=ctx.seed + 1),
            )
            steps = planned_steps(
                epochs=epochs, batches_per_epoch=len(loader), limit_train_batches=trainer_kwargs.get("limit_train_batches")
            )
            noise_multiplier = dpsgd_noise_multiplier(
                epsilon=budget.epsilon, delta=budget.delta, sample_rate=sample_rate, steps=steps, accountant=ctx.accountant
            )
            log.info(
                "DP-SGD: noise multiplier %.4f for %d steps at sample rate %.5f (%s accountant, eps=%g, delta=%g)",
                noise_multiplier, steps, sample_rate, ctx.accountant, budget.epsilon, budget.delta,
            )
            D = GradSampleModule(D, loss_reduction="sum", force_functorch=cfg.grad_sample_mode == "functorch")
            dp = {
                "noise_multiplier": noise_multiplier,
                "max_grad_norm": float(cfg.max_grad_norm),
                "generator": dp_generator(deterministic=ctx.deterministic_noise, seed=ctx.seed),
                "max_steps": steps,
            }
        else:
            loader = DataLoader(
                data, batch_size=batch, shuffle=True, drop_last=True, generator=torch.Generator().manual_seed(ctx.seed)
            )
        self.module = GANModule(
            generator=G,
            discriminator=D,
            z_dim=int(cfg.z_dim),
            num_classes=ctx.num_classes,
            expected_batch_size=batch,
            lr_g=float(cfg.lr_g),
            lr_d=float(cfg.lr_d),
            beta1=float(cfg.beta1),
            dp=dp,
        )
        callbacks, ckpt_path = [], None
        if ctx.run_dir is not None and int(cfg.checkpoint_every) > 0:
            ckpt = Path(ctx.run_dir) / "checkpoints" / "last.ckpt"
            callbacks.append(PeriodicCheckpoint(ckpt, int(cfg.checkpoint_every)))
            if ckpt.is_file():
                ckpt_path = str(ckpt)
                self.module.dp_steps = _check_resumable(ckpt, dp)
                log.info("resuming dp_gan from %s (%d discriminator steps already made)", ckpt, self.module.dp_steps)
        trainer = L.Trainer(
            max_epochs=epochs,
            logger=ctx.logger if ctx.logger is not None else False,
            enable_checkpointing=False,  # PeriodicCheckpoint writes the one checkpoint a resume needs
            use_distributed_sampler=False,
            num_sanity_val_steps=0,
            callbacks=callbacks,
            **trainer_kwargs,
        )
        try:
            trainer.fit(self.module, train_dataloaders=loader, ckpt_path=ckpt_path)
        finally:
            # charge every release that happened, even when training stopped early or crashed
            if dp is not None:
                ledger.add(
                    SampledGaussianEvent(
                        noise_multiplier=dp["noise_multiplier"],
                        sample_rate=batch / n,
                        steps=self.module.dp_steps,
                        accountant=ctx.accountant,
                        label="dp_gan discriminator (DP-SGD, clip %g)" % dp["max_grad_norm"],
                    )
                )
            else:
                ledger.add(NonPrivateEvent(label="dp_gan trained without noise (eps=inf)"))
        if self.module.G.training:
            self.module.G.eval()

    def sample(self, n: int, labels: np.ndarray | None = None) -> Samples:
        rng = np.random.default_rng(self.ctx.seed)
        if labels is None:
            labels = self.uniform_labels(n, rng)
        torch.manual_seed(self.ctx.seed)
        x = self.module.generate(torch.from_numpy(labels)).numpy().astype(np.float32)
        return Samples(x, labels, {"method": "dp_gan", "labels": "uniform over classes (public choice)"})
