"""Small CNN classifier: the embedded evaluation network and the downstream-accuracy classifier for 28x28/32x32."""

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
