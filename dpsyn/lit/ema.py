"""The exponential moving average of a network's weights that the embedded public models release."""

from __future__ import annotations

import torch
from torch import nn


@torch.no_grad()
def update_ema(ema: nn.Module, live: nn.Module, *, step: int, max_decay: float) -> None:
    """One EMA step of ``ema`` towards ``live``; ``step`` counts the updates made before this one.

    The decay warms up as ``min(max_decay, (1 + step) / (10 + step))``: with a fixed 0.999 the random initial weights
    would still hold 0.999^2000 = 13% of the average after a 2000-step run. ``max_decay <= 0`` copies ``live``.
    Buffers (BatchNorm running statistics) follow the live network.
    """
    decay = min(max_decay, (1.0 + step) / (10.0 + step)) if max_decay > 0 else 0.0
    for p_ema, p in zip(ema.parameters(), live.parameters()):
        p_ema.lerp_(p, 1.0 - decay)
    for b_ema, b in zip(ema.buffers(), live.buffers()):
        b_ema.copy_(b)
