"""dpsyn.lit.ema.update_ema: the two warm-up schedules (embedded public models / G-PATE, and GS-WGAN's authors')."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from dpsyn.lit.ema import update_ema


def _net(value: float) -> nn.Module:
    net = nn.Sequential(nn.Linear(3, 2), nn.BatchNorm1d(2))
    with torch.no_grad():
        for p in net.parameters():
            p.fill_(value)
        net[1].running_mean.fill_(value)
    return net


def test_mean_warmup_is_the_running_mean_of_the_snapshots() -> None:
    ema, live = _net(0.0), _net(0.0)
    values = [3.0, -1.0, 4.0, 1.5, 9.0]
    for step, v in enumerate(values):
        with torch.no_grad():
            for p in live.parameters():
                p.fill_(v)
        update_ema(ema, live, step=step, max_decay=0.999, warmup="mean")
    for p in ema.parameters():
        torch.testing.assert_close(p, torch.full_like(p, sum(values) / len(values)))


def test_mean_warmup_caps_at_max_decay() -> None:
    ema, live = _net(1.0), _net(3.0)
    update_ema(ema, live, step=99, max_decay=0.5, warmup="mean")  # ramp 0.99 > 0.5: the cap decides
    for p in ema.parameters():
        torch.testing.assert_close(p, torch.full_like(p, 2.0))


def test_ten_warmup_follows_its_ramp() -> None:
    ema, live = _net(0.0), _net(1.0)
    update_ema(ema, live, step=2, max_decay=0.999)  # decay (1 + 2) / (10 + 2) = 0.25
    for p in ema.parameters():
        torch.testing.assert_close(p, torch.full_like(p, 0.75))


@pytest.mark.parametrize("warmup", ["ten", "mean"])
def test_no_decay_copies_and_buffers_follow_the_live_network(warmup: str) -> None:
    ema, live = _net(0.0), _net(2.0)
    update_ema(ema, live, step=50, max_decay=0.0, warmup=warmup)  # type: ignore[arg-type]
    for pe, p in zip(ema.parameters(), live.parameters()):
        torch.testing.assert_close(pe, p)
    torch.testing.assert_close(ema[1].running_mean, live[1].running_mean)


def test_unknown_warmup_is_refused() -> None:
    with pytest.raises(ValueError, match="warmup"):
        update_ema(_net(0.0), _net(1.0), step=0, max_decay=0.9, warmup="linear")  # type: ignore[arg-type]
