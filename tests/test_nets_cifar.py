"""DPImageBench's downstream classifiers built from their papers' descriptions: parameter counts, shapes."""

from __future__ import annotations

import pytest
import torch

from dpsyn.nets.resnet import CifarResNet, resnet_110
from dpsyn.nets.resnext import CifarResNeXt, resnext_29
from dpsyn.nets.wrn import wrn_40_4


def _params(net: torch.nn.Module) -> int:
    return sum(p.numel() for p in net.parameters())


@pytest.mark.parametrize(("build", "channels", "count"), [
    # the papers' "1.7M" and "34.4M"; the same counts as DPImageBench's evaluation/classifier/{resnet,resnext}.py
    (resnet_110, 3, 1_730_714), (resnet_110, 1, 1_730_426),
    (resnext_29, 3, 34_426_698), (resnext_29, 1, 34_425_546),
    (wrn_40_4, 3, 8_949_210), (wrn_40_4, 1, 8_948_922),
])
def test_parameter_counts(build, channels: int, count: int) -> None:
    assert _params(build(num_classes=10, channels=channels)) == count


@pytest.mark.parametrize("side", [28, 32])
@pytest.mark.parametrize("channels", [1, 3])
def test_small_widths_take_28_and_32_pixel_inputs(side: int, channels: int) -> None:
    for net in (resnet_110(num_classes=7, channels=channels, width=2),
                resnext_29(num_classes=7, channels=channels, base_width=1, stem=2)):
        assert net(torch.rand(2, channels, side, side)).shape == (2, 7)


def test_depths_are_checked() -> None:
    with pytest.raises(ValueError, match="6n \\+ 2"):
        CifarResNet(depth=111)
    with pytest.raises(ValueError, match="9n \\+ 2"):
        CifarResNeXt(depth=30)
    assert len(CifarResNet(depth=110).blocks) == 54 and len(CifarResNeXt(depth=29).blocks) == 9
