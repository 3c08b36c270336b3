"""CIFAR residual network (He et al. 2016, "Deep Residual Learning for Image Recognition", section 4.2), one of
DPImageBench's three downstream classifiers (ResNet-110).

The CIFAR variant of the paper: a 3x3 stem convolution with 16 channels, three stages of ``(depth - 2) / 6`` basic
blocks (conv3x3-BN-ReLU-conv3x3-BN, plus the shortcut, then ReLU) with 16, 32 and 64 channels, the second and third
stages downsampling by 2 in their first block, then global average pooling and a linear head. Where a block changes
the shape, its shortcut is a 1x1 convolution with BN (the paper's option B; DPImageBench's classifier does the same).
Global average pooling lets the same network take 28x28 and 32x32 inputs.

ResNet-110 on 10 classes has 1,730,714 parameters (the paper's "1.7M"; ``tests/test_nets_cifar.py``). ``width``
(16, the paper's) sets the first stage's channels; tests shrink it.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F


class _BasicBlock(nn.Module):
    """conv3x3-BN-ReLU-conv3x3-BN, plus the identity or a 1x1 conv + BN projection, then ReLU."""

    def __init__(self, c_in: int, c_out: int, *, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(c_in, c_out, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(c_out)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, stride=1, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(c_out)
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or c_in != c_out:
            self.shortcut = nn.Sequential(nn.Conv2d(c_in, c_out, 1, stride=stride, bias=False), nn.BatchNorm2d(c_out))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.relu(self.bn1(self.conv1(x)))
        h = self.bn2(self.conv2(h))
        return F.relu(h + self.shortcut(x))


class CifarResNet(nn.Module):
    """ResNet-``depth`` for CIFAR-sized inputs: see the module docstring.

    Args:
        depth: total depth, ``6n + 2`` (110 -> 18 blocks per stage).
        num_classes: output classes.
        channels: input channels (1 or 3).
        width: channels of the first stage (16 in the paper); the stages have ``width``, ``2 width``, ``4 width``.

    Raises:
        ValueError: if ``depth`` is not ``6n + 2`` with ``n >= 1``, or a size is not positive.
    """

    def __init__(self, *, depth: int = 110, num_classes: int = 10, channels: int = 3, width: int = 16) -> None:
        super().__init__()
        if depth < 8 or (depth - 2) % 6 != 0:
            raise ValueError(f"ResNet depth must be 6n + 2 with n >= 1 (8, 20, 32, 44, 56, 110, ...), got {depth}")
        if num_classes < 1 or channels < 1 or width < 1:
            raise ValueError(f"num_classes, channels and width must be >= 1, got {num_classes}, {channels}, {width}")
        n = (depth - 2) // 6
        self.stem = nn.Sequential(nn.Conv2d(channels, width, 3, padding=1, bias=False), nn.BatchNorm2d(width),
                                  nn.ReLU())
        blocks: list[nn.Module] = []
        c_in = width
        for c_out, stride in ((width, 1), (2 * width, 2), (4 * width, 2)):
            for i in range(n):
                blocks.append(_BasicBlock(c_in, c_out, stride=stride if i == 0 else 1))
                c_in = c_out
        self.blocks = nn.Sequential(*blocks)
        self.num_features = c_in
        self.head = nn.Linear(c_in, num_classes)
        for m in self.modules():  # He initialisation (fan-out), unit BN scales
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        return F.adaptive_avg_pool2d(self.blocks(self.stem(x)), 1).flatten(1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


def resnet_110(*, num_classes: int, channels: int, width: int = 16) -> CifarResNet:
    """ResNet-110 (DPImageBench's ``resnet`` classifier).

    Args:
        num_classes: output classes.
        channels: input channels.
        width: first-stage channels (16: the paper's).

    Returns:
        The network.
    """
    return CifarResNet(depth=110, num_classes=num_classes, channels=channels, width=width)
