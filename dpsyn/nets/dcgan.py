"""Class-conditional DCGAN generator and discriminator for small images (28x28 or 32x32).

The discriminator is what DP-SGD trains, so it has no BatchNorm (per-sample gradients need per-sample
independence); the class condition enters as one-hot channel maps (``cond="concat"``, no parameters), or as a
projection head (``cond="projection"``: an inner product of a class embedding with the features), or both; every
Opacus grad sampler supports each. The generator is post-processing of the discriminator's DP outputs and may use BatchNorm.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F


def one_hot(y: torch.Tensor, num_classes: int, dtype: torch.dtype) -> torch.Tensor:
    """``F.one_hot(y, num_classes).to(dtype)``, as rows of an identity matrix: the same values, and it also runs under
    ``torch.func.vmap(grad(...))``, where ``F.one_hot``'s range check on ``y`` fails (GS-WGAN's batched warm start)."""
    return torch.eye(num_classes, dtype=dtype, device=y.device)[y]


class CondDCGANGenerator(nn.Module):
    """G(z, y): a linear layer to a (4*ngf, s, s) map (s = resolution / 4), then two stride-2 transposed convs.

    Args:
        z_dim: latent dimension.
        num_classes: number of classes (the label is fed one-hot).
        channels: image channels.
        resolution: image side; must be divisible by 4.
        ngf: width multiplier.
    """

    def __init__(self, *, z_dim: int, num_classes: int, channels: int, resolution: int, ngf: int = 32) -> None:
        super().__init__()
        if resolution % 4:
            raise ValueError(f"resolution must be divisible by 4, got {resolution}")
        self.z_dim, self.num_classes, self.start = z_dim, num_classes, resolution // 4
        self.fc = nn.Sequential(
            nn.Linear(z_dim + num_classes, 2 * ngf * self.start * self.start),
            nn.BatchNorm1d(2 * ngf * self.start * self.start),
            nn.ReLU(True),
        )
        self.net = nn.Sequential(
            nn.ConvTranspose2d(2 * ngf, ngf, 4, 2, 1),
            nn.BatchNorm2d(ngf),
            nn.ReLU(True),
            nn.ConvTranspose2d(ngf, channels, 4, 2, 1),
            nn.Sigmoid(),  # images live in [0, 1]
        )
        self.ngf = ngf

    def forward(self, z: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        h = self.fc(torch.cat([z, one_hot(y, self.num_classes, z.dtype)], dim=1))
        return self.net(h.view(len(z), 2 * self.ngf, self.start, self.start))


D_CONDS: tuple[str, ...] = ("concat", "projection", "both")
"""How :class:`CondDCGANDiscriminator` reads the label (``method.d_cond``)."""


class CondDCGANDiscriminator(nn.Module):
    """D(x, y) -> logit(s): two stride-2 convs with LeakyReLU, then a linear layer; no normalisation layers.

    Args:
        num_classes: number of classes.
        channels: image channels.
        resolution: image side; must be divisible by 4.
        ndf: width multiplier.
        out: number of logits (1 for a GAN discriminator, N for privGAN's central discriminator).
        cond: how the label enters. ``concat`` (the default): one-hot label maps concatenated to the image channels.
            ``projection`` (Miyato & Koyama 2018, cGANs with projection discriminator): the image alone goes through
            the convs to features h (the last linear layer's input), and the logit is ``linear(h) + <embed(y), h>``
            with a learned class embedding ``embed`` (K x dim h). ``both``: the label maps and the projection.
    """

    def __init__(self, *, num_classes: int, channels: int, resolution: int, ndf: int = 32, out: int = 1,
                 cond: str = "concat") -> None:
        super().__init__()
        if cond not in D_CONDS:
            raise ValueError(f"cond={cond!r}; allowed: {', '.join(D_CONDS)}")
        if cond != "concat" and out != 1:
            raise ValueError(f"cond={cond!r} projects onto one logit; out={out} needs cond='concat'")
        self.num_classes, self.out, self.cond = num_classes, out, cond
        self.label_maps = cond in ("concat", "both")
        features = 2 * ndf * (resolution // 4) ** 2
        self.net = nn.Sequential(
            nn.Conv2d(channels + (num_classes if self.label_maps else 0), ndf, 4, 2, 1),
            nn.LeakyReLU(0.2),
            nn.Conv2d(ndf, 2 * ndf, 4, 2, 1),
            nn.LeakyReLU(0.2),
            nn.Flatten(),
            nn.Linear(features, out),
        )
        # the projection's class embedding; small initial values (SNGAN-projection's code: xavier on a fresh table)
        self.embed: nn.Embedding | None = None
        if cond in ("projection", "both"):
            self.embed = nn.Embedding(num_classes, features)
            nn.init.xavier_uniform_(self.embed.weight)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        if self.label_maps:
            maps = F.one_hot(y, self.num_classes).to(x.dtype)[:, :, None, None].expand(-1, -1, *x.shape[2:])
            x = torch.cat([x, maps], dim=1)
        if self.embed is None:
            logits = self.net(x)
            return logits.squeeze(1) if self.out == 1 else logits
        h = self.net[:-1](x)
        return self.net[-1](h).squeeze(1) + (self.embed(y) * h).sum(dim=1)
