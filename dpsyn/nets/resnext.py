"""CIFAR ResNeXt (Xie et al. 2017, "Aggregated Residual Transformations for Deep Neural Networks", section 5.3),
one of DPImageBench's three downstream classifiers (ResNeXt-29, 8x64d).

The CIFAR variant of the paper: a 3x3 stem convolution with 64 channels, three stages of ``(depth - 2) / 9``
bottleneck blocks with 256, 512 and 1024 output channels (``64 * widen * 2^i``, widen 4), the second and third
stages downsampling by 2 in their first block, then global average pooling and a linear head. A bottleneck block is
1x1 conv (to ``D = cardinality * base_width * 2^i`` channels) - BN - ReLU - 3x3 grouped conv (``cardinality``
groups) - BN - ReLU - 1x1 conv - BN, plus the shortcut (a 1x1 conv + BN where the shape changes), then ReLU.
Global average pooling lets the same network take 28x28 and 32x32 inputs.

ResNeXt-29 8x64d on 10 classes has 34,426,698 parameters (the paper's "34.4M"; ``tests/test_nets_cifar.py``).
``base_width`` (64) and ``stem`` (64) set the widths; tests shrink them.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from dpsyn.nets.wrn import he_init


class _Bottleneck(nn.Module):
    """1x1 reduce - 3x3 grouped - 1x1 expand (BN after each, ReLU after the first two), plus the shortcut, ReLU."""

    def __init__(self, c_in: int, c_out: int, *, inner: int, cardinality: int, stride: int) -> None:
        super().__init__()
        self.reduce = nn.Conv2d(c_in, inner, 1, bias=False)
        self.bn_reduce = nn.BatchNorm2d(inner)
        self.grouped = nn.Conv2d(inner, inner, 3, stride=stride, padding=1, groups=cardinality, bias=False)
        self.bn_grouped = nn.BatchNorm2d(inner)
        self.expand = nn.Conv2d(inner, c_out, 1, bias=False)
        self.bn_expand = nn.BatchNorm2d(c_out)
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or c_in != c_out:
            self.shortcut = nn.Sequential(nn.Conv2d(c_in, c_out, 1, stride=stride, bias=False), nn.BatchNorm2d(c_out))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.relu(self.bn_reduce(self.reduce(x)))
        h = F.relu(self.bn_grouped(self.grouped(h)))
        h = self.bn_expand(self.expand(h))
        return F.relu(h + self.shortcut(x))


class CifarResNeXt(nn.Module):
    """ResNeXt-``depth`` (``cardinality`` x ``base_width``d) for CIFAR-sized inputs: see the module docstring.

    Args:
        depth: total depth, ``9n + 2`` (29 -> 3 blocks per stage).
        cardinality: groups of the 3x3 convolutions (8).
        base_width: channels per group in the first stage (64); doubled at each stage.
        widen: output channels of the first stage over ``stem`` (4: 256 channels).
        num_classes: output classes.
        channels: input channels (1 or 3).
        stem: channels of the stem convolution (64).

    Raises:
        ValueError: if ``depth`` is not ``9n + 2`` with ``n >= 1``, or a size is not positive.
    """

    def __init__(self, *, depth: int = 29, cardinality: int = 8, base_width: int = 64, widen: int = 4,
                 num_classes: int = 10, channels: int = 3, stem: int = 64) -> None:
        super().__init__()
        if depth < 11 or (depth - 2) % 9 != 0:
            raise ValueError(f"ResNeXt depth must be 9n + 2 with n >= 1 (11, 20, 29, ...), got {depth}")
        sizes = {"cardinality": cardinality, "base_width": base_width, "widen": widen, "num_classes": num_classes,
                 "channels": channels, "stem": stem}
        if any(v < 1 for v in sizes.values()):
            raise ValueError(f"every size must be >= 1, got {sizes}")
        n = (depth - 2) // 9
        self.stem = nn.Sequential(nn.Conv2d(channels, stem, 3, padding=1, bias=False), nn.BatchNorm2d(stem),
                                  nn.ReLU())
        blocks: list[nn.Module] = []
        c_in = stem
        for i, stride in enumerate((1, 2, 2)):
            c_out, inner = stem * widen * 2**i, cardinality * base_width * 2**i
            for j in range(n):
                blocks.append(_Bottleneck(c_in, c_out, inner=inner, cardinality=cardinality,
                                          stride=stride if j == 0 else 1))
                c_in = c_out
        self.blocks = nn.Sequential(*blocks)
        self.num_features = c_in
        self.head = nn.Linear(c_in, num_classes)
        he_init(self)  # He initialisation (fan-out), unit BN scales, zero biases

    def features(self, x: torch.Tensor) -> torch.Tensor:
        return F.adaptive_avg_pool2d(self.blocks(self.stem(x)), 1).flatten(1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


def resnext_29(*, num_classes: int, channels: int, base_width: int = 64, stem: int = 64) -> CifarResNeXt:
    """ResNeXt-29 8x64d (DPImageBench's ``resnext`` classifier).

    Args:
        num_classes: output classes.
        channels: input channels.
        base_width: channels per group in the first stage (64: the paper's).
        stem: stem channels (64: the paper's).

    Returns:
        The network.
    """
    return CifarResNeXt(depth=29, cardinality=8, base_width=base_width, widen=4, num_classes=num_classes,
                        channels=channels, stem=stem)
