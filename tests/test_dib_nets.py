"""dpsyn.nets.dib: DPImageBench's DP-GAN networks at their sizes, their ranges, Opacus's per-sample gradients of the
discriminator, and ``dp_gan`` with ``method.arch=dib`` end to end."""

from __future__ import annotations

import json

import pytest
import torch
from opacus import GradSampleModule
from opacus.validators import ModuleValidator
from torch import nn

from dpsyn.lit import fused_grad_sample
from dpsyn.methods.dp_gan import image_networks
from dpsyn.nets.dib import DIBDiscriminator, DIBGenerator

# trainable parameters of 2019ChenGong/DPImageBench @565f8d7 models/DP_GAN/{generator,discriminator}.py at
# configs/DPGAN/fmnist_28_eps1.0.yaml's widths (g_conv_dim 96, z_dim 60, g_shared_dim 128; d_conv_dim 80), counted
# by instantiating their classes with num_classes=10 (their run builds 1000-row label tables, max(10, 1000) classes:
# 6,771,970 and 1,342,563); 32x32x3 with z_dim 80: 9,416,196 and 1,649,127
THEIR_PARAMS = {(1, 28, 60): (6_645_250, 1_184_163), (3, 32, 80): (9_416_196, 1_649_127)}


def _count(m: nn.Module) -> int:
    return sum(p.numel() for p in m.parameters() if p.requires_grad)


@pytest.mark.parametrize("channels,resolution,z_dim", list(THEIR_PARAMS))
def test_full_width_parameter_counts_are_dpimagebenchs(channels: int, resolution: int, z_dim: int) -> None:
    g_theirs, d_theirs = THEIR_PARAMS[channels, resolution, z_dim]
    G = DIBGenerator(z_dim=z_dim, num_classes=10, channels=channels, resolution=resolution)
    D = DIBDiscriminator(num_classes=10, channels=channels, resolution=resolution)
    assert _count(G) == pytest.approx(g_theirs, rel=0.01)
    assert _count(D) == pytest.approx(d_theirs, rel=0.01)


@pytest.mark.parametrize("channels,resolution", [(1, 28), (3, 32), (3, 28), (1, 32)])
def test_shapes_and_ranges(channels: int, resolution: int) -> None:
    torch.manual_seed(0)
    z_dim = 6 if resolution == 28 else 8
    G = DIBGenerator(z_dim=z_dim, num_classes=3, channels=channels, resolution=resolution, ngf=16, shared_dim=8)
    D = DIBDiscriminator(num_classes=3, channels=channels, resolution=resolution, ndf=8)
    y = torch.tensor([0, 1, 2, 0, 1])
    x = G(torch.randn(5, z_dim), y)
    assert G.z_dim == z_dim
    assert x.shape == (5, channels, resolution, resolution) and x.min() >= 0 and x.max() <= 1
    logits = D(x, y)
    assert logits.shape == (5,) and torch.isfinite(logits).all()
    assert D(x[:1], y[:1]).shape == (1,)


def test_discriminator_sees_minus_one_to_one() -> None:
    """D(x) = their D(2x - 1): its first layer is applied to 2x - 1, not to x."""
    torch.manual_seed(0)
    D = DIBDiscriminator(num_classes=2, channels=1, resolution=28, ndf=4)
    seen: list[torch.Tensor] = []
    D.blocks[0].conv1.register_forward_hook(lambda m, inp, out: seen.append(inp[0]))
    x = torch.rand(3, 1, 28, 28)
    D(x, torch.tensor([0, 1, 0]))
    torch.testing.assert_close(seen[0], 2 * x - 1)


def test_bad_shapes_and_latents_are_refused() -> None:
    with pytest.raises(ValueError, match="multiple of 3"):
        DIBGenerator(z_dim=64, num_classes=10, channels=1, resolution=28)
    with pytest.raises(ValueError, match="z_dim=6: .*4 equal chunks"):
        image_networks("dib", z_dim=6, num_classes=10, channels=3, resolution=32, ngf=16, ndf=8)
    with pytest.raises(ValueError, match="28x28 or 32x32"):
        DIBDiscriminator(num_classes=10, channels=1, resolution=64)
    with pytest.raises(ValueError, match="multiple of 32"):
        DIBDiscriminator(num_classes=10, channels=1, resolution=28, ndf=48)


def test_discriminator_is_opacus_compatible_and_not_fused() -> None:
    D = DIBDiscriminator(num_classes=10, channels=1, resolution=28, ndf=32)
    assert not any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in D.modules())
    assert ModuleValidator.validate(D, strict=True) == []
    assert not fused_grad_sample.supports(D)  # dp_gan falls back to Opacus's hooks
    assert not fused_grad_sample.supports(GradSampleModule(D))


@pytest.mark.parametrize("functorch", [False, True])
def test_per_sample_gradients_equal_row_by_row(functorch: bool) -> None:
    torch.manual_seed(0)
    D = DIBDiscriminator(num_classes=3, channels=1, resolution=28, ndf=4).double()
    for m in D.modules():  # GroupNorm's affine off its initial (1, 0), so its gradients are not trivial
        if isinstance(m, nn.GroupNorm):
            nn.init.normal_(m.weight)
            nn.init.normal_(m.bias)
    x, y = torch.rand(4, 1, 28, 28, dtype=torch.float64), torch.tensor([0, 2, 1, 2])
    rows = []
    for i in range(len(x)):
        D.zero_grad()
        D(x[i : i + 1], y[i : i + 1]).sum().backward()
        rows.append([p.grad.clone() for p in D.parameters()])

    gsm = GradSampleModule(D, loss_reduction="sum", force_functorch=functorch)
    gsm.zero_grad(set_to_none=True)
    gsm(x, y).sum().backward()
    for j, p in enumerate(gsm.parameters()):
        for i in range(len(x)):
            torch.testing.assert_close(p.grad_sample[i], rows[i][j])
    gsm._close()


def test_a_rows_gradient_depends_on_that_row_only() -> None:
    """No batch statistics: changing row 1 leaves row 0's per-sample gradient as it was."""
    torch.manual_seed(0)
    gsm = GradSampleModule(DIBDiscriminator(num_classes=3, channels=1, resolution=28, ndf=4).double(),
                           loss_reduction="sum")
    y = torch.tensor([0, 1])

    def row0(x: torch.Tensor) -> list[torch.Tensor]:
        gsm.zero_grad(set_to_none=True)
        gsm(x, y).sum().backward()
        return [p.grad_sample[0].clone() for p in gsm.parameters()]

    x = torch.rand(2, 1, 28, 28, dtype=torch.float64)
    other = x.clone()
    other[1] = torch.rand(1, 28, 28, dtype=torch.float64)
    for a, b in zip(row0(x), row0(other)):
        torch.testing.assert_close(a, b)
    gsm._close()


def test_dp_gan_arch_dib_runs_end_to_end(make_cfg, tmp_path) -> None:
    from dpsyn.task import run

    result = run(make_cfg("method=dp_gan", "eps=1", "method.arch=dib", "method.ngf=16", "method.ndf=8",
                          "method.z_dim=6", "method.batch_size=32", "trainer.limit_train_batches=3",
                          "metrics.names.image=[]", "metrics.n_samples=40"), tmp_path / "run")
    assert 0 < result["epsilon_spent"] <= 1 + 1e-9
    saved = json.loads((tmp_path / "run" / "result.json").read_text())
    assert saved["privacy_events"][0]["steps"] == 3


def test_dp_gan_refuses_dib_on_tables(make_cfg, tmp_path) -> None:
    from dpsyn.task import run

    with pytest.raises(ValueError, match="arch=dib: tables"):
        run(make_cfg("method=dp_gan", "dataset=breast_cancer", "eps=1", "method.arch=dib"), tmp_path / "run")
