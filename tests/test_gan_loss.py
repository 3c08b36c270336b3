"""dp_gan's ``method.loss`` (bce | hinge) and ``method.ema``: the losses' values and per-sample gradients, the EMA the
samples come from, and a ledger that neither changes."""

from __future__ import annotations

import warnings

import pytest
import torch
from opacus import GradSampleModule

from dpsyn.lit import fused_grad_sample as fused
from dpsyn.lit.gan_loss import discriminator_loss, generator_loss
from dpsyn.nets.dcgan import CondDCGANDiscriminator
from tests.test_dp_gan import SMALL_IMAGE_RUN

warnings.filterwarnings("ignore", message="Full backward hook is firing")


def test_hinge_loss_values_and_zero_gradient_beyond_the_margin() -> None:
    logits = torch.tensor([2.0, 0.5, -0.5, -2.0], requires_grad=True)
    targets = torch.tensor([1.0, 1.0, 0.0, 0.0])
    loss = discriminator_loss(logits, targets, "hinge")
    # real rows relu(1 - s), fake rows relu(1 + s): 0 + 0.5 + 0.5 + 0
    assert loss.item() == pytest.approx(1.0)
    loss.backward()
    assert logits.grad.tolist() == [0.0, -1.0, 1.0, 0.0]  # rows beyond the margin give exactly zero gradient
    assert generator_loss(torch.tensor([1.0, 3.0]), "hinge").item() == pytest.approx(-2.0)


def test_bce_loss_is_the_non_saturating_gan_loss() -> None:
    logits, targets = torch.tensor([1.0, -1.0]), torch.tensor([1.0, 0.0])
    expected = 2 * torch.nn.functional.softplus(torch.tensor(-1.0))  # -log sigmoid(1) twice
    assert discriminator_loss(logits, targets, "bce").item() == pytest.approx(expected.item())
    assert generator_loss(torch.tensor([0.0]), "bce").item() == pytest.approx(torch.log(torch.tensor(2.0)).item())
    with pytest.raises(ValueError, match="unknown GAN loss 'wgan'"):
        discriminator_loss(logits, targets, "wgan")


@pytest.mark.parametrize("loss", ["bce", "hinge"])
def test_fused_paired_grad_samples_of_each_loss_equal_opacus(loss: str) -> None:
    """The fused engine differentiates the configured loss: its per-row gradients are Opacus's hooks' gradients of the
    same loss (float64)."""
    torch.manual_seed(0)
    b, classes = 6, 4
    D = CondDCGANDiscriminator(num_classes=classes, channels=1, resolution=12, ndf=4).double()
    with torch.no_grad():  # real rows beyond the hinge margin (zero gradient), fake rows inside it
        D.net[-1].bias.fill_(1.5)
    g = torch.Generator().manual_seed(1)
    x, fake = torch.rand(b, 1, 12, 12, generator=g).double(), torch.rand(b, 1, 12, 12, generator=g).double()
    y, y_fake = torch.randint(0, classes, (b,), generator=g), torch.randint(0, classes, (b,), generator=g)
    gsm = GradSampleModule(D, loss_reduction="sum")
    total = (discriminator_loss(gsm(x, y), torch.ones(b).double(), loss)
             + discriminator_loss(gsm(fake, y_fake), torch.zeros(b).double(), loss))
    total.backward()
    targets = torch.cat([torch.ones(b), torch.zeros(b)]).double()
    ours = fused.grad_samples(gsm, torch.cat([x, fake]), torch.cat([y, y_fake]), targets, paired=True, loss=loss)
    for p in gsm.parameters():
        torch.testing.assert_close(ours[p], p.grad_sample, rtol=1e-10, atol=1e-12)
    if loss == "hinge":  # both branches of the hinge were exercised
        logits = D(torch.cat([x, fake]), torch.cat([y, y_fake])).detach()
        assert (logits[:b] > 1).any() and (logits[b:] > -1).all()


def _ledger(result: dict) -> list[dict]:
    keep = ("kind", "noise_multiplier", "sample_rate", "steps", "accountant")
    return [{k: e.get(k) for k in keep} for e in result["privacy_events"]]


def test_hinge_and_ema_leave_the_ledger_unchanged(make_cfg, tmp_path) -> None:
    """The same noise multiplier, sample rate, steps and epsilon under bce and under hinge with an EMA of G; the
    samples differ (the settings do something)."""
    import numpy as np

    from dpsyn.task import run

    base = ("method=dp_gan", "eps=1", "trainer.limit_train_batches=6", "seed=3", *SMALL_IMAGE_RUN)
    plain = run(make_cfg(*base), tmp_path / "bce")
    other = run(make_cfg(*base, "method.loss=hinge", "method.ema=0.9"), tmp_path / "hinge_ema")
    assert _ledger(plain) == _ledger(other)
    assert plain["epsilon_spent"] == other["epsilon_spent"]
    assert plain["privacy_events"][0]["steps"] == 6
    a = np.load(tmp_path / "bce" / "samples.npz")["x"]
    b = np.load(tmp_path / "hinge_ema" / "samples.npz")["x"]
    assert a.shape == b.shape and not np.allclose(a, b)


def test_the_samples_come_from_the_ema_of_g() -> None:
    """With ``method.ema`` the released generator is G_ema, the warm-up average of G's weights over its steps,
    not G itself; without it G."""
    from dpsyn.lit import ema as ema_mod
    from dpsyn.lit.gan import GANModule

    G = torch.nn.Sequential(torch.nn.Linear(2, 2))
    D = torch.nn.Linear(2, 1)
    module = GANModule(generator=G, discriminator=D, z_dim=2, num_classes=2, expected_batch_size=4, lr_g=1e-3,
                       lr_d=1e-3, beta1=0.5, dp=None, ema=0.99)
    assert module.released_generator is module.G_ema and module.G_ema is not G
    assert "G_ema.0.weight" in module.state_dict()  # checkpointed with G
    reference = [p.clone() for p in G.parameters()]
    for t in range(3):  # what training does after each generator step t
        with torch.no_grad():
            for p in G.parameters():
                p.add_(1.0)
        ema_mod.update_ema(module.G_ema, G, step=t, max_decay=0.99)
        decay = min(0.99, (1 + t) / (10 + t))
        reference = [r * decay + p.detach() * (1 - decay) for r, p in zip(reference, G.parameters())]
    for r, p in zip(reference, module.G_ema.parameters()):
        torch.testing.assert_close(p, r)
    plain = GANModule(generator=G, discriminator=D, z_dim=2, num_classes=2, expected_batch_size=4, lr_g=1e-3,
                      lr_d=1e-3, beta1=0.5, dp=None)
    assert plain.G_ema is None and plain.released_generator is G
    with pytest.raises(ValueError, match="ema=1.0"):
        GANModule(generator=G, discriminator=D, z_dim=2, num_classes=2, expected_batch_size=4, lr_g=1e-3, lr_d=1e-3,
                  beta1=0.5, dp=None, ema=1.0)


def test_training_updates_the_ema_once_per_generator_step(make_cfg, tmp_path, monkeypatch) -> None:
    """d_steps=2, 6 discriminator steps: 3 generator steps, each followed by one EMA update with step 0, 1, 2."""
    from dpsyn.lit import gan
    from dpsyn.task import run

    steps: list[int] = []
    real_update = gan.update_ema
    monkeypatch.setattr(gan, "update_ema", lambda ema, live, *, step, max_decay: (
        steps.append(step), real_update(ema, live, step=step, max_decay=max_decay)))
    run(make_cfg("method=dp_gan", "eps=1", "method.d_steps=2", "method.ema=0.99", "trainer.limit_train_batches=6",
                 *SMALL_IMAGE_RUN), tmp_path / "run")
    assert steps == [0, 1, 2]
