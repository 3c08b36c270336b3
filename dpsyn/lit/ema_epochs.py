"""A classifier trained on one split, an exponential moving average of its weights handed out after every epoch.

DPImageBench's downstream training (``evaluation/evaluator.py``): Adam, a step learning-rate schedule, an EMA of the
weights (the averaged weights are what is scored), inputs scaled from [0, 1] to [-1, 1]. The caller scores each
epoch's averaged network and keeps the one it selects (:mod:`dpsyn.metrics.dpimagebench`); nothing here reads data
other than the training split.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

from dpsyn.lit.ema import update_ema


class Centred(nn.Module):
    """``net(2 x - 1)``: images in [0, 1] to the [-1, 1] DPImageBench's classifiers are trained on."""

    def __init__(self, net: nn.Module) -> None:
        super().__init__()
        self.net = net

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x * 2.0 - 1.0)


def train_epochs_with_ema(
    net: nn.Module,
    train: tuple[np.ndarray, np.ndarray],
    *,
    epochs: int,
    batch_size: int,
    lr: float,
    lr_step: int,
    lr_gamma: float,
    ema_decay: float,
    seed: int,
    device: str | torch.device = "cpu",
) -> Iterator[tuple[int, nn.Module]]:
    """Train ``net`` with Adam and ``StepLR(lr_step, lr_gamma)``; after each epoch yield ``(epoch, ema_net)``.

    The EMA's decay warms up as DPImageBench's (``min(ema_decay, (1 + u) / (10 + u))`` at the u-th update, u from 1);
    its BatchNorm statistics are the live network's. ``ema_net`` (in eval mode, on ``device``) is the same object at
    every epoch: copy it to keep an epoch's weights.

    Args:
        net: the network (trained in place; its EMA is a copy).
        train: ``(x, y)``: (N, C, H, W) float32 images in [0, 1] and (N,) int64 labels.
        epochs: training epochs.
        batch_size: batch size (the last batch may be smaller).
        lr: Adam's learning rate.
        lr_step: epochs between learning-rate decays.
        lr_gamma: the decay factor.
        ema_decay: the EMA's largest decay (0: the EMA is the live network).
        seed: seed of the batch order.
        device: where to train.

    Yields:
        ``(epoch, ema_net)``, epoch counted from 0.
    """
    net.to(device)
    ema = copy.deepcopy(net).eval()
    opt = torch.optim.Adam(net.parameters(), lr=lr)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=lr_step, gamma=lr_gamma)
    loader = DataLoader(TensorDataset(torch.from_numpy(train[0]), torch.from_numpy(train[1])), batch_size=batch_size,
                        shuffle=True, generator=torch.Generator().manual_seed(int(seed)))
    updates = 0
    for epoch in range(epochs):
        net.train()
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            opt.zero_grad(set_to_none=True)
            F.cross_entropy(net(x), y).backward()
            opt.step()
            updates += 1
            # dpsyn's step counts the updates before this one; DPImageBench's counter is incremented first
            update_ema(ema, net, step=updates, max_decay=ema_decay, warmup="ten")
        sched.step()
        ema.eval()
        yield epoch, ema
