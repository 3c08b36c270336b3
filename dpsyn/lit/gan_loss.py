"""The GAN losses dp_gan offers (``method.loss``): the non-saturating BCE and the hinge loss.

Both are sums over rows (the DP-SGD step clips each row's gradient and divides the noisy sum by the expected batch
size) for the discriminator, and means for the generator. The choice changes what a row's gradient is, never how it
is clipped, noised or charged: the ledger of a run is the same under either (tests/test_gan_loss.py).

* ``bce`` (Goodfellow et al. 2014, the non-saturating generator loss): D minimises
  ``BCE(D(x), 1) + BCE(D(G(z)), 0)``, G minimises ``BCE(D(G(z)), 1)``.
* ``hinge`` (Lim & Ye 2017; Miyato et al. 2018; DPImageBench's DP-GAN): D minimises
  ``relu(1 - D(x)) + relu(1 + D(G(z)))``, G minimises ``-D(G(z))``. A row beyond the margin gives exactly zero
  gradient, so under a small clip bound (every row clipped) the rows D already separates stop pulling, where BCE's
  clipped gradients all have the same norm whatever the row's confidence.
"""

from __future__ import annotations

import torch
from torch.nn import functional as F

from dpsyn.config.schema import GAN_LOSSES as LOSSES  # the values of method.loss: bce (the default) | hinge


def discriminator_loss(logits: torch.Tensor, targets: torch.Tensor, loss: str) -> torch.Tensor:
    """The discriminator's loss summed over rows; ``targets`` holds 1 for a real row and 0 for a fake one."""
    if loss == "bce":
        return F.binary_cross_entropy_with_logits(logits, targets, reduction="sum")
    if loss == "hinge":
        sign = 2.0 * targets - 1.0
        return F.relu(1.0 - sign * logits).sum()
    raise ValueError(f"unknown GAN loss {loss!r}; allowed: {', '.join(LOSSES)}")


def generator_loss(logits: torch.Tensor, loss: str) -> torch.Tensor:
    """The generator's loss, a mean over its fake rows' logits ``D(G(z))``."""
    if loss == "bce":
        return F.binary_cross_entropy_with_logits(logits, torch.ones_like(logits))
    if loss == "hinge":
        return -logits.mean()
    raise ValueError(f"unknown GAN loss {loss!r}; allowed: {', '.join(LOSSES)}")
