"""IC-GAN training step (Casanova et al. 2021) for the embedded public generator of paper 000.

:func:`dpsyn.public.icgan.train_icgan` builds the nets, the k-NN neighbourhoods and the loader, and runs this module.
Public data only: nothing here touches private data.
"""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING

import lightning as L
import torch
from torch.nn import functional as F

from dpsyn.lit.ema import update_ema

if TYPE_CHECKING:
    from dpsyn.public.icgan import InstanceConditionedDiscriminator, InstanceConditionedGenerator


class ICGANModule(L.LightningModule):
    """IC-GAN training: non-saturating GAN loss, D and G conditioned on an instance's features, D's real images
    drawn from that instance's neighbourhood; keeps an exponential moving average of G (what is released).

    Args:
        generator, discriminator: the nets.
        images: (N, C, H, W) float tensor of public images.
        features: (N, d) unit-norm features of ``images``.
        neighbours: (N, k) int64 neighbour indices (:func:`knn_indices`).
        lr_g, lr_d, beta1: Adam settings.
        ema_decay: decay of the generator average (0 disables it).
    """

    def __init__(
        self,
        *,
        generator: InstanceConditionedGenerator,
        discriminator: InstanceConditionedDiscriminator,
        images: torch.Tensor,
        features: torch.Tensor,
        neighbours: torch.Tensor,
        lr_g: float,
        lr_d: float,
        beta1: float,
        ema_decay: float,
    ) -> None:
        super().__init__()
        self.automatic_optimization = False
        self.G, self.D = generator, discriminator
        # left in train mode while training (it is never run then; its BatchNorm statistics are copied from G)
        self.G_ema = copy.deepcopy(generator).requires_grad_(False)
        # data as plain attributes, not buffers: they are not part of the model's state
        self.images, self.features, self.neighbours = images, features, neighbours
        self.lr_g, self.lr_d, self.beta1, self.ema_decay = lr_g, lr_d, beta1, ema_decay
        self.ema_updates = 0

    def configure_optimizers(self) -> list[torch.optim.Optimizer]:
        return [
            torch.optim.Adam(self.G.parameters(), lr=self.lr_g, betas=(self.beta1, 0.999)),
            torch.optim.Adam(self.D.parameters(), lr=self.lr_d, betas=(self.beta1, 0.999)),
        ]

    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> None:
        (idx,) = batch
        opt_g, opt_d = self.optimizers(use_pl_optimizer=False)
        b, k = len(idx), self.neighbours.shape[1]
        h = self.features[idx]
        pick = torch.randint(0, k, (b,))
        real = self.images[self.neighbours[idx, pick]]

        opt_d.zero_grad(set_to_none=True)
        with torch.no_grad():
            fake = self.G(torch.randn(b, self.G.z_dim), h)
        loss_d = F.softplus(-self.D(real, h)).mean() + F.softplus(self.D(fake, h)).mean()
        self.manual_backward(loss_d)
        opt_d.step()

        self.D.requires_grad_(False)
        opt_g.zero_grad(set_to_none=True)
        loss_g = F.softplus(-self.D(self.G(torch.randn(b, self.G.z_dim), h), h)).mean()
        self.manual_backward(loss_g)
        opt_g.step()
        self.D.requires_grad_(True)
        self._update_ema()
        self.log_dict({"train/loss_d": loss_d.item(), "train/loss_g": loss_g.item()}, prog_bar=True, on_step=True)

    def _update_ema(self) -> None:
        update_ema(self.G_ema, self.G, step=self.ema_updates, max_decay=self.ema_decay)
        self.ema_updates += 1
