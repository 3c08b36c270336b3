"""The exponential moving average of a network's weights that the embedded public models and the GANs release."""

from __future__ import annotations

from typing import Literal

import torch
from torch import nn


@torch.no_grad()
def update_ema(
    ema: nn.Module, live: nn.Module, *, step: int, max_decay: float, warmup: Literal["ten", "mean"] = "ten"
) -> None:
    """One EMA step of ``ema`` towards ``live``; ``step`` counts the updates made before this one.

    The decay warms up so that the random initial weights do not linger (with a fixed 0.999 they would still hold
    0.999^2000 = 13% of the average after a 2000-step run):

    - ``warmup="ten"``: ``min(max_decay, (1 + step) / (10 + step))`` (the embedded public models, G-PATE's ``ema``);
    - ``warmup="mean"``: ``min(max_decay, step / (step + 1))``, a plain running mean until it reaches ``max_decay``
      (GS-WGAN's authors).

    ``max_decay <= 0`` copies ``live``. Buffers (BatchNorm running statistics) follow the live network.
    """
    if warmup == "ten":
        ramp = (1.0 + step) / (10.0 + step)
    elif warmup == "mean":
        ramp = step / (step + 1.0)
    else:
        raise ValueError(f"warmup must be 'ten' or 'mean', got {warmup!r}")
    decay = min(max_decay, ramp) if max_decay > 0 else 0.0
    for p_ema, p in zip(ema.parameters(), live.parameters()):
        p_ema.lerp_(p, 1.0 - decay)
    for b_ema, b in zip(ema.buffers(), live.buffers()):
        b_ema.copy_(b)
