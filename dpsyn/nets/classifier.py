"""CNN classifiers for 28x28/32x32 images: :class:`SmallCNN` (the embedded evaluation network) and :class:`BNCNN`
(the downstream classifier of the ``dpsyn`` evaluation protocol)."""

from __future__ import annotations

import torch
from torch import nn


class SmallCNN(nn.Module):
    """Three conv blocks (32, 64, 64 channels, each followed by 2x2 max-pooling), a ``feature_dim`` layer, a head.

    ``features(x)`` returns the penultimate activations (used as the feature space of ``fd_<family>``);
    ``forward(x)`` returns logits.

    Args:
        channels: input channels.
        num_classes: output classes.
        resolution: input side (28 or 32).
        feature_dim: width of the feature layer.
    """

    def __init__(self, *, channels: int, num_classes: int, resolution: int, feature_dim: int = 128) -> None:
        super().__init__()
        self.num_features = feature_dim  # the attribute name torchmetrics expects of a feature extractor
        side = resolution // 8
        self.body = nn.Sequential(
            nn.Conv2d(channels, 32, 3, padding=1), nn.ReLU(True), nn.MaxPool2d(2),
            nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(True), nn.MaxPool2d(2),
            nn.Conv2d(64, 64, 3, padding=1), nn.ReLU(True), nn.MaxPool2d(2),
            nn.Flatten(),
            nn.Linear(64 * side * side, feature_dim), nn.ReLU(True),
        )
        self.head = nn.Linear(feature_dim, num_classes)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x))


class BNCNN(nn.Module):
    """Three conv blocks (conv 3x3 without bias, BatchNorm, ReLU, 2x2 max-pooling; 32, 64, 128 channels), a
    256-wide layer, dropout, a head: 0.39M parameters at 28x28.

    The downstream classifier of the ``dpsyn`` protocol (``metrics.classifier.name=cnn_bn``), chosen by measurement
    on a validation split of real Fashion-MNIST (docs/metrics.md, "The downstream classifier"): trained on 18000 real
    images for 8 epochs with a cosine schedule it reaches 0.915 there, where :class:`SmallCNN` on 9000 images for 5
    epochs reaches 0.835.

    Args:
        channels: input channels.
        num_classes: output classes.
        resolution: input side (28 or 32).
        widths: the three blocks' channels.
        hidden: width of the layer before the head.
        dropout: dropout before the head.
    """

    def __init__(self, *, channels: int, num_classes: int, resolution: int, widths: tuple[int, int, int] = (32, 64, 128),
                 hidden: int = 256, dropout: float = 0.3) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        c = channels
        for w in widths:
            layers += [nn.Conv2d(c, w, 3, padding=1, bias=False), nn.BatchNorm2d(w), nn.ReLU(True), nn.MaxPool2d(2)]
            c = w
        side = resolution // 8
        self.body = nn.Sequential(*layers, nn.Flatten(), nn.Linear(c * side * side, hidden), nn.ReLU(True))
        self.head = nn.Sequential(nn.Dropout(dropout), nn.Linear(hidden, num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x))
