"""dpsyn's fused per-sample gradients (dp_gan's default paired DP step): the same gradients as Opacus's and as a
row-by-row reference, each row's gradient a function of its own rows only, and the step built on them."""

from __future__ import annotations

import warnings

import pytest
import torch
from opacus import GradSampleModule
from opacus.optimizers import DPOptimizer
from torch import nn
from torch.nn import functional as F

from dpsyn.lit import fused_grad_sample as fused
from dpsyn.nets.dcgan import CondDCGANDiscriminator
from dpsyn.nets.mlp_gan import CondMLPDiscriminator

warnings.filterwarnings("ignore", message="Full backward hook is firing")


def _rows(b: int, channels: int, resolution: int, classes: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(b, channels, resolution, resolution, generator=g, dtype=torch.float64)
    fake = torch.rand(b, channels, resolution, resolution, generator=g, dtype=torch.float64)
    y = torch.randint(0, classes, (b,), generator=g)
    y_fake = torch.randint(0, classes, (b,), generator=g)
    return x, fake, y, y_fake


def _targets(b: int) -> torch.Tensor:
    return torch.cat([torch.ones(b), torch.zeros(b)]).double()


def _disc(classes: int, channels: int, resolution: int, ndf: int, seed: int = 0) -> CondDCGANDiscriminator:
    torch.manual_seed(seed)
    return CondDCGANDiscriminator(num_classes=classes, channels=channels, resolution=resolution, ndf=ndf).double()


@pytest.mark.parametrize("classes,channels,resolution,ndf", [(10, 1, 28, 6), (4, 3, 32, 5), (2, 1, 8, 3)])
def test_paired_grad_samples_equal_opacus_per_sample_gradients(classes, channels, resolution, ndf) -> None:
    """Real row i and fake row i (their own, different labels) summed, as Opacus's hooks leave them."""
    b = 6
    x, fake, y, y_fake = _rows(b, channels, resolution, classes)
    gsm = GradSampleModule(_disc(classes, channels, resolution, ndf), loss_reduction="sum")
    loss = F.binary_cross_entropy_with_logits(gsm(x, y), torch.ones(b).double(), reduction="sum")
    (loss + F.binary_cross_entropy_with_logits(gsm(fake, y_fake), torch.zeros(b).double(), reduction="sum")).backward()
    ours = fused.grad_samples(gsm, torch.cat([x, fake]), torch.cat([y, y_fake]), _targets(b), paired=True)
    assert set(ours) == set(gsm.parameters())
    for p in gsm.parameters():
        assert ours[p].shape == p.grad_sample.shape
        torch.testing.assert_close(ours[p], p.grad_sample, rtol=1e-10, atol=1e-12)
    assert all(p.grad is not None for p in gsm.parameters())  # Opacus's run, not ours, filled .grad


def test_poisson_batches_of_changing_size_reuse_the_scratch_buffers_correctly() -> None:
    """Each step's batch has its own size (Poisson): the scratch tensors grow and are sliced, and every step's
    gradients still equal Opacus's (a border left over from a larger step, or a stale row, would show)."""
    gsm = GradSampleModule(_disc(4, 1, 12, 3), loss_reduction="sum")
    for step, b in enumerate((5, 2, 9, 3, 9, 1)):
        x, fake, y, y_fake = _rows(b, 1, 12, 4, seed=step)
        gsm.zero_grad(set_to_none=True)
        for p in gsm.parameters():
            p.grad_sample = None
        loss = F.binary_cross_entropy_with_logits(gsm(x, y), torch.ones(b).double(), reduction="sum")
        (loss + F.binary_cross_entropy_with_logits(gsm(fake, y_fake), torch.zeros(b).double(),
                                                   reduction="sum")).backward()
        ours = fused.grad_samples(gsm, torch.cat([x, fake]), torch.cat([y, y_fake]), _targets(b), paired=True)
        for p in gsm.parameters():
            torch.testing.assert_close(ours[p], p.grad_sample, rtol=1e-10, atol=1e-12)


def test_the_scratch_is_released_and_allocated_again() -> None:
    D = _disc(3, 1, 12, 4)
    x, fake, y, y_fake = _rows(4, 1, 12, 3)
    rows, labels = torch.cat([x, fake]), torch.cat([y, y_fake])
    first = fused.grad_samples(D, rows, labels, _targets(4), paired=True)
    assert fused._SCRATCH._bufs
    fused.release_scratch()
    assert not fused._SCRATCH._bufs
    again = fused.grad_samples(D, rows, labels, _targets(4), paired=True)
    assert all(torch.equal(first[p], again[p]) for p in D.parameters())


def test_unpaired_grad_samples_equal_the_gradient_of_each_row_alone() -> None:
    D = _disc(3, 1, 12, 4)
    x, fake, y, _ = _rows(5, 1, 12, 3)
    targets = torch.tensor([1.0, 0.0, 1.0, 1.0, 0.0]).double()
    ours = fused.grad_samples(D, x, y, targets, paired=False)
    for i in range(len(x)):
        D.zero_grad()
        F.binary_cross_entropy_with_logits(D(x[i:i + 1], y[i:i + 1]), targets[i:i + 1], reduction="sum").backward()
        for p in D.parameters():
            torch.testing.assert_close(ours[p][i], p.grad, rtol=1e-10, atol=1e-12)
    D.zero_grad(set_to_none=True)
    fused.grad_samples(D, x, y, targets, paired=False)
    assert all(p.grad is None for p in D.parameters())  # no batch gradient is computed or left behind


def test_a_pairs_gradient_depends_on_its_own_rows_only() -> None:
    """The sensitivity argument of the paired step: replacing real row j (image and label) changes pair j's
    gradient and no other pair's."""
    b, j = 7, 3
    D = _disc(5, 1, 16, 4)
    x, fake, y, y_fake = _rows(b, 1, 16, 5)
    before = fused.grad_samples(D, torch.cat([x, fake]), torch.cat([y, y_fake]), _targets(b), paired=True)
    x2, y2 = x.clone(), y.clone()
    x2[j] = 1.0 - x2[j]
    y2[j] = (y2[j] + 1) % 5
    after = fused.grad_samples(D, torch.cat([x2, fake]), torch.cat([y2, y_fake]), _targets(b), paired=True)
    others = [i for i in range(b) if i != j]
    for p in D.parameters():
        torch.testing.assert_close(after[p][others], before[p][others], rtol=0, atol=0)
    assert any((after[p][j] - before[p][j]).abs().max() > 1e-6 for p in D.parameters())


def test_the_fused_dp_step_is_the_row_by_row_clipped_noised_sum_over_the_expected_batch() -> None:
    """Through Opacus's DPOptimizer (clip, noise replayed from the generator, / expected batch): the update equals the
    reference built one row at a time, and equals the hooks step with the same noise."""
    b, clip, B, nm, seed = 5, 0.05, 8, 0.7, 5
    x, fake, y, y_fake = _rows(b, 1, 16, 3)
    ref_D = _disc(3, 1, 16, 4)
    params = list(ref_D.parameters())
    want = torch.zeros(sum(p.numel() for p in params), dtype=torch.float64)
    for i in range(b):
        ref_D.zero_grad()
        loss = F.binary_cross_entropy_with_logits(ref_D(x[i:i + 1], y[i:i + 1]), torch.ones(1).double(),
                                                  reduction="sum")
        loss = loss + F.binary_cross_entropy_with_logits(ref_D(fake[i:i + 1], y_fake[i:i + 1]),
                                                         torch.zeros(1).double(), reduction="sum")
        loss.backward()
        g = torch.cat([p.grad.flatten() for p in params])
        assert g.norm() > clip, "the test must exercise clipping"
        want += g * min(1.0, clip / (g.norm().item() + 1e-6))
    noise = torch.Generator().manual_seed(seed)
    want += torch.cat([torch.normal(0.0, nm * clip, size=p.shape, generator=noise, dtype=p.dtype).flatten()
                       for p in params])
    want /= B

    updates = []
    for engine in ("fused", "hooks"):
        gsm = GradSampleModule(_disc(3, 1, 16, 4), loss_reduction="sum")
        opt = DPOptimizer(torch.optim.SGD(gsm.parameters(), lr=1.0), noise_multiplier=nm, max_grad_norm=clip,
                          expected_batch_size=B, loss_reduction="mean",
                          generator=torch.Generator().manual_seed(seed))
        before = torch.cat([p.detach().flatten() for p in gsm.parameters()]).clone()
        opt.zero_grad(set_to_none=True)
        if engine == "fused":
            fused.set_grad_samples(opt, fused.grad_samples(gsm, torch.cat([x, fake]), torch.cat([y, y_fake]),
                                                           _targets(b), paired=True))
        else:
            loss = F.binary_cross_entropy_with_logits(gsm(x, y), torch.ones(b).double(), reduction="sum")
            (loss + F.binary_cross_entropy_with_logits(gsm(fake, y_fake), torch.zeros(b).double(),
                                                       reduction="sum")).backward()
        opt.step()
        updates.append(before - torch.cat([p.detach().flatten() for p in gsm.parameters()]))
    torch.testing.assert_close(updates[0], want, rtol=1e-7, atol=1e-10)
    torch.testing.assert_close(updates[0], updates[1], rtol=1e-9, atol=1e-12)


def test_supports_only_what_it_computes_exactly() -> None:
    D = _disc(3, 1, 16, 4)
    assert fused.supports(D) and fused.supports(GradSampleModule(D))
    assert not fused.supports(CondMLPDiscriminator(num_classes=2, shape=(6,), hidden=[8]))
    assert not fused.supports(CondDCGANDiscriminator(num_classes=3, channels=1, resolution=16, ndf=4, out=3))
    grouped = _disc(3, 1, 16, 4)
    grouped.net[2] = nn.Conv2d(4, 8, 4, 2, 1, groups=2).double()
    assert not fused.supports(grouped)
    with pytest.raises(ValueError, match="CondDCGANDiscriminator only"):
        fused.grad_samples(CondMLPDiscriminator(num_classes=2, shape=(6,), hidden=[8]), torch.rand(2, 6),
                           torch.tensor([0, 1]), torch.ones(2), paired=False)
    with pytest.raises(ValueError, match="equal numbers"):
        x, _, y, _ = _rows(3, 1, 16, 3)
        fused.grad_samples(D, x, y, torch.ones(3).double(), paired=True)


def test_set_grad_samples_refuses_gradients_that_miss_a_parameter() -> None:
    gsm = GradSampleModule(_disc(3, 1, 16, 4), loss_reduction="sum")
    opt = DPOptimizer(torch.optim.SGD(gsm.parameters(), lr=1.0), noise_multiplier=1.0, max_grad_norm=1.0,
                      expected_batch_size=4, loss_reduction="mean")
    x, fake, y, y_fake = _rows(2, 1, 16, 3)
    samples = fused.grad_samples(gsm, torch.cat([x, fake]), torch.cat([y, y_fake]), _targets(2), paired=True)
    samples.pop(next(iter(samples)))
    with pytest.raises(ValueError, match="one to one"):
        fused.set_grad_samples(opt, samples)


def test_gan_module_uses_the_fused_engine_only_for_a_paired_step_it_supports(caplog) -> None:
    from dpsyn.lit.gan import GANModule
    from dpsyn.nets.dcgan import CondDCGANGenerator

    def module(step: str, mode: str, D: nn.Module) -> GANModule:
        dp = {"noise_multiplier": 1.0, "max_grad_norm": 1.0, "generator": torch.Generator(), "max_steps": 3,
              "grad_sample_mode": mode}
        G = CondDCGANGenerator(z_dim=4, num_classes=3, channels=1, resolution=16, ngf=4)
        return GANModule(generator=G, discriminator=D, z_dim=4, num_classes=3, expected_batch_size=4, lr_g=1e-3,
                         lr_d=1e-3, beta1=0.5, dp=dp, dpsgd_step=step)

    dcgan = GradSampleModule(CondDCGANDiscriminator(num_classes=3, channels=1, resolution=16, ndf=4))
    with caplog.at_level("INFO", logger="dpsyn.lit.gan"):
        assert module("paired", "fused", dcgan).fused
    assert "per-sample gradients by dpsyn's fused engine" in caplog.text
    assert not module("split", "fused", dcgan).fused
    assert not module("paired", "hooks", dcgan).fused
    mlp = GradSampleModule(CondMLPDiscriminator(num_classes=3, shape=(6,), hidden=[8]))
    assert not module("paired", "fused", mlp).fused


def test_dp_gan_default_trains_with_the_fused_engine_within_budget(make_cfg, tmp_path, monkeypatch) -> None:
    """The default config takes the fused path (every DP step goes through it) and spends at most the target."""
    import json

    from dpsyn.task import run

    calls: list[int] = []
    real = fused.grad_samples

    def counting(*a, **k):
        calls.append(len(a[1]))
        return real(*a, **k)

    monkeypatch.setattr(fused, "grad_samples", counting)
    run(make_cfg("method=dp_gan", "eps=1", "method.ngf=8", "method.ndf=8", "metrics.names.image=[]",
                 "metrics.n_samples=50", "trainer.limit_train_batches=3"), tmp_path / "run")
    result = json.loads((tmp_path / "run" / "result.json").read_text())
    assert 0 < result["epsilon_spent"] <= 1.0
    assert len(calls) >= 2 and all(n % 2 == 0 for n in calls)  # empty Poisson batches take the noise-only step
    assert not fused._SCRATCH._bufs, "the scratch buffers outlived the training"
