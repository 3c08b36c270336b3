"""The DCGAN discriminator's projection head (``method.d_cond=projection|both``, Miyato & Koyama 2018): its forward,
and dpsyn's fused per-sample gradients for it against Opacus's hooks and a row-by-row reference."""

from __future__ import annotations

import pytest
import torch
from opacus import GradSampleModule
from torch import nn
from torch.nn import functional as F

from dpsyn.lit import fused_grad_sample as fused
from dpsyn.lit.gan_loss import discriminator_loss
from dpsyn.nets.dcgan import CondDCGANDiscriminator

pytestmark = pytest.mark.filterwarnings("ignore:Full backward hook is firing")

CONDS = ("projection", "both")


def _rows(b: int, channels: int, resolution: int, classes: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(b, channels, resolution, resolution, generator=g, dtype=torch.float64)
    fake = torch.rand(b, channels, resolution, resolution, generator=g, dtype=torch.float64)
    y = torch.randint(0, classes, (b,), generator=g)
    y_fake = torch.randint(0, classes, (b,), generator=g)
    return x, fake, y, y_fake


def _targets(b: int) -> torch.Tensor:
    return torch.cat([torch.ones(b), torch.zeros(b)]).double()


def _disc(cond: str, classes: int = 4, channels: int = 1, resolution: int = 12, ndf: int = 3,
          seed: int = 0) -> CondDCGANDiscriminator:
    torch.manual_seed(seed)
    return CondDCGANDiscriminator(num_classes=classes, channels=channels, resolution=resolution, ndf=ndf,
                                  cond=cond).double()


def test_projection_forward_is_linear_plus_the_class_embeddings_inner_product() -> None:
    D = _disc("projection")
    x, _, y, _ = _rows(5, 1, 12, 4)
    assert D.net[0].in_channels == 1  # the image alone: no label maps
    h = D.net[:-1](x)
    want = (h @ D.net[-1].weight.T).squeeze(1) + D.net[-1].bias + (D.embed.weight[y] * h).sum(1)
    torch.testing.assert_close(D(x, y), want)
    both = _disc("both")
    assert both.net[0].in_channels == 1 + 4 and both.embed is not None
    concat = _disc("concat")
    assert concat.embed is None and concat.net[0].in_channels == 5
    assert sum(p.numel() for p in D.parameters()) == (sum(p.numel() for p in concat.parameters())
                                                      - 4 * 3 * 16 + D.embed.weight.numel())


def test_the_label_changes_a_projection_logit() -> None:
    D = _disc("projection")
    x, _, y, _ = _rows(3, 1, 12, 4)
    assert (D(x, y) - D(x, (y + 1) % 4)).abs().min() > 0


def test_bad_conds_are_refused() -> None:
    with pytest.raises(ValueError, match="cond="):
        CondDCGANDiscriminator(num_classes=3, channels=1, resolution=8, cond="film")
    with pytest.raises(ValueError, match="one logit"):
        CondDCGANDiscriminator(num_classes=3, channels=1, resolution=8, out=3, cond="projection")
    from dpsyn.methods.dp_gan import image_networks

    with pytest.raises(ValueError, match="arch=dcgan"):
        image_networks("dib", z_dim=60, num_classes=10, channels=1, resolution=28, ngf=8, ndf=8, d_cond="projection")
    _, D = image_networks("dcgan", z_dim=8, num_classes=10, channels=1, resolution=28, ngf=4, ndf=4,
                          d_cond="projection")
    assert D.cond == "projection" and D.embed is not None


@pytest.mark.parametrize("cond", CONDS)
@pytest.mark.parametrize("loss", ("bce", "hinge"))
@pytest.mark.parametrize("classes,channels,resolution,ndf", [(10, 1, 28, 4), (3, 3, 16, 5)])
def test_paired_grad_samples_equal_opacus_per_sample_gradients(cond, loss, classes, channels, resolution, ndf) -> None:
    b = 6
    x, fake, y, y_fake = _rows(b, channels, resolution, classes)
    y_fake[0] = y[0]  # a pair of one class: its embedding row gets both rows' terms
    gsm = GradSampleModule(_disc(cond, classes, channels, resolution, ndf), loss_reduction="sum")
    assert fused.supports(gsm)
    total = (discriminator_loss(gsm(x, y), torch.ones(b).double(), loss)
             + discriminator_loss(gsm(fake, y_fake), torch.zeros(b).double(), loss))
    total.backward()
    ours = fused.grad_samples(gsm, torch.cat([x, fake]), torch.cat([y, y_fake]), _targets(b), paired=True, loss=loss)
    assert set(ours) == set(gsm.parameters())
    for p in gsm.parameters():
        assert ours[p].shape == p.grad_sample.shape
        torch.testing.assert_close(ours[p], p.grad_sample, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("cond", CONDS)
def test_unpaired_grad_samples_equal_the_gradient_of_each_row_alone(cond) -> None:
    D = _disc(cond)
    x, _, y, _ = _rows(5, 1, 12, 4)
    targets = torch.tensor([1.0, 0.0, 1.0, 1.0, 0.0]).double()
    ours = fused.grad_samples(D, x, y, targets, paired=False)
    for i in range(len(x)):
        D.zero_grad()
        F.binary_cross_entropy_with_logits(D(x[i:i + 1], y[i:i + 1]), targets[i:i + 1], reduction="sum").backward()
        for p in D.parameters():
            torch.testing.assert_close(ours[p][i], p.grad, rtol=1e-10, atol=1e-12)
    D.zero_grad(set_to_none=True)
    fused.grad_samples(D, x, y, targets, paired=False)
    assert all(p.grad is None for p in D.parameters())


@pytest.mark.parametrize("cond", CONDS)
def test_paired_grad_samples_equal_the_row_by_row_pair_reference(cond) -> None:
    D = _disc(cond, classes=3, resolution=16, ndf=4)
    b = 5
    x, fake, y, y_fake = _rows(b, 1, 16, 3, seed=2)
    ours = fused.grad_samples(D, torch.cat([x, fake]), torch.cat([y, y_fake]), _targets(b), paired=True)
    for i in range(b):
        D.zero_grad()
        (F.binary_cross_entropy_with_logits(D(x[i:i + 1], y[i:i + 1]), torch.ones(1).double(), reduction="sum")
         + F.binary_cross_entropy_with_logits(D(fake[i:i + 1], y_fake[i:i + 1]), torch.zeros(1).double(),
                                              reduction="sum")).backward()
        for p in D.parameters():
            torch.testing.assert_close(ours[p][i], p.grad, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("cond", CONDS)
def test_a_pairs_gradient_depends_on_its_own_rows_only(cond) -> None:
    b, j = 7, 3
    D = _disc(cond, classes=5, resolution=16, ndf=4)
    x, fake, y, y_fake = _rows(b, 1, 16, 5)
    before = fused.grad_samples(D, torch.cat([x, fake]), torch.cat([y, y_fake]), _targets(b), paired=True)
    x2, y2 = x.clone(), y.clone()
    x2[j] = 1.0 - x2[j]
    y2[j] = (y2[j] + 1) % 5
    after = fused.grad_samples(D, torch.cat([x2, fake]), torch.cat([y2, y_fake]), _targets(b), paired=True)
    others = [i for i in range(b) if i != j]
    for p in D.parameters():
        torch.testing.assert_close(after[p][others], before[p][others], rtol=0, atol=0)
    assert (after[D.embed.weight][j] - before[D.embed.weight][j]).abs().max() > 1e-6


def test_supports_a_plain_embedding_only() -> None:
    D = _disc("projection")
    assert fused.supports(D) and fused.supports(GradSampleModule(_disc("both")))
    D.embed = nn.Embedding(4, D.embed.weight.shape[1], max_norm=1.0).double()
    assert not fused.supports(D)


def test_gan_module_takes_the_fused_engine_for_a_projection_discriminator() -> None:
    from dpsyn.lit.gan import GANModule
    from dpsyn.nets.dcgan import CondDCGANGenerator

    dp = {"noise_multiplier": 1.0, "max_grad_norm": 1.0, "generator": torch.Generator(), "max_steps": 3,
          "grad_sample_mode": "fused"}
    G = CondDCGANGenerator(z_dim=4, num_classes=3, channels=1, resolution=16, ngf=4)
    D = GradSampleModule(CondDCGANDiscriminator(num_classes=3, channels=1, resolution=16, ndf=4, cond="projection"))
    module = GANModule(generator=G, discriminator=D, z_dim=4, num_classes=3, expected_batch_size=4, lr_g=1e-3,
                       lr_d=1e-3, beta1=0.5, dp=dp)
    assert module.fused
