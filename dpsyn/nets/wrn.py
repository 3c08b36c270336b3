"""Wide residual network (Zagoruyko & Komodakis 2016, "Wide Residual Networks"), the downstream classifier of PE.

PE (Lin et al. 2024, Private Evolution) reports CIFAR-10 downstream accuracy with WRN-40-4: depth 40, widening
factor 4. The architecture follows the paper: a 3x3 stem convolution with 16 channels, three groups of
``(depth - 4) / 6`` pre-activation basic blocks (BN-ReLU-conv3x3-BN-ReLU-[dropout]-conv3x3) with 16k, 32k and 64k
channels (the second and third groups downsample by 2 in their first block; a 1x1 convolution projects the shortcut
where the shape changes), then BN-ReLU, global average pooling and a linear head. Global average pooling (rather than a
fixed 8x8 pool) lets the same network take 28x28 and 32x32 inputs.

WRN-40-4 on 10 classes has 8,949,210 parameters (the paper's "8.9M"; WRN-28-10 gives its 36.5M).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F



def he_init(net: nn.Module) -> None:
    """He initialisation for convolutions (fan-out, as the WRN and ResNet papers), unit BN scales, zero biases: the
    WRN and ResNeXt-29 (dpsyn.nets.resnext)."""
    for m in net.modules():
        if isinstance(m, nn.Conv2d):
            nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
        elif isinstance(m, nn.BatchNorm2d):
            nn.init.ones_(m.weight)
            nn.init.zeros_(m.bias)
        elif isinstance(m, nn.Linear):
            nn.init.zeros_(m.bias)

class _PreActBlock(nn.Module):
    """BN-ReLU-conv3x3-BN-ReLU-dropout-conv3x3, plus the identity or a 1x1 projection of the pre-activated input."""

    def __init__(self, c_in: int, c_out: int, *, stride: int, dropout: float) -> None:
        super().__init__()
        self.bn1 = nn.BatchNorm2d(c_in)
        self.conv1 = nn.Conv2d(c_in, c_out, 3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(c_out)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, stride=1, padding=1, bias=False)
        self.dropout = dropout
        # the projection reads the pre-activated input, as in the paper's reference model
        self.shortcut = (
            nn.Conv2d(c_in, c_out, 1, stride=stride, bias=False) if (c_in != c_out or stride != 1) else None
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = F.relu(self.bn1(x))
        h = self.conv1(a)
        h = F.relu(self.bn2(h))
        if self.dropout > 0:
            h = F.dropout(h, p=self.dropout, training=self.training)
        h = self.conv2(h)
        return h + (x if self.shortcut is None else self.shortcut(a))


class WideResNet(nn.Module):
    """WRN-``depth``-``widen``: see the module docstring.

    ``features(x)`` returns the pooled penultimate activations (``64 * widen`` of them); ``forward(x)`` the logits.

    Args:
        depth: total depth; ``(depth - 4)`` must be divisible by 6 (40 -> 6 blocks per group).
        widen: widening factor k (4 for WRN-40-4).
        num_classes: output classes.
        channels: input channels (1 for MNIST-like data, 3 for CIFAR-10).
        dropout: dropout probability between the two convolutions of each block (0: none, as PE's default).

    Raises:
        ValueError: if ``depth`` does not give a whole number of blocks, or a size is not positive.
    """

    def __init__(
        self, *, depth: int = 40, widen: int = 4, num_classes: int = 10, channels: int = 3, dropout: float = 0.0
    ) -> None:
        super().__init__()
        if depth < 10 or (depth - 4) % 6 != 0:
            raise ValueError(f"WRN depth must be 6n + 4 with n >= 1 (10, 16, 22, 28, 40, ...), got {depth}")
        if widen < 1 or num_classes < 1 or channels < 1:
            raise ValueError(f"widen, num_classes and channels must be >= 1, got {widen}, {num_classes}, {channels}")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {dropout}")
        n = (depth - 4) // 6
        widths = [16, 16 * widen, 32 * widen, 64 * widen]
        self.num_features = widths[-1]
        self.stem = nn.Conv2d(channels, widths[0], 3, padding=1, bias=False)
        blocks: list[nn.Module] = []
        c_in = widths[0]
        for c_out, stride in zip(widths[1:], (1, 2, 2), strict=True):
            for i in range(n):
                blocks.append(_PreActBlock(c_in, c_out, stride=stride if i == 0 else 1, dropout=dropout))
                c_in = c_out
        self.blocks = nn.Sequential(*blocks)
        self.bn = nn.BatchNorm2d(c_in)
        self.head = nn.Linear(c_in, num_classes)
        self._init_weights()

    def _init_weights(self) -> None:
        he_init(self)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        h = self.blocks(self.stem(x))
        h = F.relu(self.bn(h))
        return F.adaptive_avg_pool2d(h, 1).flatten(1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


def wrn_40_4(*, num_classes: int, channels: int, dropout: float = 0.0) -> WideResNet:
    """WRN-40-4 as used by PE for CIFAR-10 downstream accuracy.

    Args:
        num_classes: output classes.
        channels: input channels.
        dropout: per-block dropout (default 0).

    Returns:
        The network.
    """
    return WideResNet(depth=40, widen=4, num_classes=num_classes, channels=channels, dropout=dropout)
