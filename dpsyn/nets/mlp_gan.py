"""Class-conditional MLP generator and discriminator (privGAN's MLPs for 28x28, widths configurable)."""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F


class CondMLPGenerator(nn.Module):
    """G(z, y): z and one-hot y through LeakyReLU(0.2) hidden layers to an image in [0, 1] (sigmoid).

    privGAN's MNIST generator is 100-512-512-1024-784 with tanh; dpsyn's images live in [0, 1], hence the sigmoid.
    """

    def __init__(self, *, z_dim: int, num_classes: int, shape: tuple[int, ...], hidden: tuple[int, ...]) -> None:
        super().__init__()
        self.z_dim, self.num_classes, self.shape = z_dim, num_classes, tuple(shape)
        layers: list[nn.Module] = []
        width = z_dim + num_classes
        for h in hidden:
            layers += [nn.Linear(width, h), nn.LeakyReLU(0.2)]
            width = h
        layers += [nn.Linear(width, math.prod(self.shape)), nn.Sigmoid()]
        self.net = nn.Sequential(*layers)

    def forward(self, z: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        h = torch.cat([z, F.one_hot(y, self.num_classes).to(z.dtype)], dim=1)
        return self.net(h).view(len(z), *self.shape)


class CondMLPDiscriminator(nn.Module):
    """D(x, y) -> logits (``out`` of them: 1 for a GAN discriminator, N for privGAN's central discriminator)."""

    def __init__(self, *, num_classes: int, shape: tuple[int, ...], hidden: tuple[int, ...], out: int = 1) -> None:
        super().__init__()
        self.num_classes, self.out = num_classes, out
        layers: list[nn.Module] = []
        width = math.prod(shape) + num_classes
        for h in hidden:
            layers += [nn.Linear(width, h), nn.LeakyReLU(0.2)]
            width = h
        layers.append(nn.Linear(width, out))
        self.net = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        h = torch.cat([x.flatten(1), F.one_hot(y, self.num_classes).to(x.dtype)], dim=1)
        logits = self.net(h)
        return logits.squeeze(1) if self.out == 1 else logits
