"""dp_gan's DP-SGD step: the per-row gradient pairing, clipping, expected-batch normalisation and the noise source."""

from __future__ import annotations

import pytest
import torch
from opacus import GradSampleModule
from opacus.optimizers import DPOptimizer
from torch.nn import functional as F

from dpsyn.lit.gan import noise_only_step, planned_steps
from dpsyn.nets.dcgan import CondDCGANDiscriminator, CondDCGANGenerator


def _d() -> CondDCGANDiscriminator:
    torch.manual_seed(0)
    return CondDCGANDiscriminator(num_classes=3, channels=1, resolution=28, ndf=4)


def _row_grads(D: torch.nn.Module, x: torch.Tensor, fake: torch.Tensor, y: torch.Tensor) -> list[torch.Tensor]:
    """Reference: the gradient of row i's loss (real_i labelled 1 + fake_i labelled 0), one row at a time."""
    rows = []
    for i in range(len(x)):
        D.zero_grad()
        loss = F.binary_cross_entropy_with_logits(D(x[i : i + 1], y[i : i + 1]), torch.ones(1), reduction="sum")
        loss = loss + F.binary_cross_entropy_with_logits(D(fake[i : i + 1], y[i : i + 1]), torch.zeros(1), reduction="sum")
        loss.backward()
        rows.append(torch.cat([p.grad.flatten() for p in D.parameters()]).clone())
    return rows


@pytest.mark.parametrize("functorch", [True, False])
def test_dp_step_clips_each_real_fake_row_and_divides_by_expected_batch(functorch: bool) -> None:
    x, fake, y = torch.rand(5, 1, 28, 28), torch.rand(5, 1, 28, 28), torch.tensor([0, 1, 2, 0, 1])
    D = _d()
    ref = _row_grads(D, x, fake, y)
    clip, expected_batch = 0.05, 8
    want = sum(g * min(1.0, clip / (g.norm().item() + 1e-6)) for g in ref) / expected_batch

    gsm = GradSampleModule(_d(), loss_reduction="sum", force_functorch=functorch)
    params = list(gsm.parameters())
    opt = DPOptimizer(torch.optim.SGD(params, lr=1.0), noise_multiplier=0.0, max_grad_norm=clip,
                      expected_batch_size=expected_batch, loss_reduction="mean")
    opt.zero_grad(set_to_none=True)
    loss = F.binary_cross_entropy_with_logits(gsm(x, y), torch.ones(5), reduction="sum")
    loss = loss + F.binary_cross_entropy_with_logits(gsm(fake, y), torch.zeros(5), reduction="sum")
    loss.backward()
    before = torch.cat([p.detach().flatten() for p in params]).clone()
    opt.step()
    step = before - torch.cat([p.detach().flatten() for p in params])  # SGD lr=1: the update is the gradient
    assert all(g.norm() > clip for g in ref), "test must exercise clipping"
    torch.testing.assert_close(step, want, rtol=1e-4, atol=1e-7)


def test_empty_poisson_batch_gets_a_noise_only_update_with_the_calibrated_std() -> None:
    gsm = GradSampleModule(_d(), loss_reduction="sum", force_functorch=True)
    params = list(gsm.parameters())
    opt = DPOptimizer(torch.optim.SGD(params, lr=1.0), noise_multiplier=2.0, max_grad_norm=0.5,
                      expected_batch_size=4, loss_reduction="mean", generator=torch.Generator().manual_seed(1))
    before = torch.cat([p.detach().flatten() for p in params]).clone()
    noise_only_step(opt)
    update = before - torch.cat([p.detach().flatten() for p in params])
    # std of each coordinate = noise_multiplier * max_grad_norm / expected_batch_size = 0.25
    assert update.std().item() == pytest.approx(0.25, rel=0.05)
    assert update.mean().item() == pytest.approx(0.0, abs=0.02)
    assert all(p.grad is None for p in params)


def test_dp_gan_noise_is_not_reproducible_from_the_seed(make_cfg, tmp_path) -> None:
    """Two runs with the same seed: identical without DP noise difference only if deterministic_noise is set."""
    from dpsyn.cli.train import run

    def weights(*over: str) -> torch.Tensor:
        import dpsyn.methods.dp_gan as m

        captured = {}
        orig_fit = m.DPGAN.fit

        def fit(self, *a, **k):
            orig_fit(self, *a, **k)
            captured["w"] = torch.cat([p.detach().flatten() for p in self.module.D.parameters()])

        m.DPGAN.fit = fit
        try:
            run(make_cfg("method=dp_gan", "eps=1", "metrics.names.image=[]", *over), tmp_path / str(len(list(tmp_path.iterdir()))))
        finally:
            m.DPGAN.fit = orig_fit
        return captured["w"]

    a, b = weights(), weights()
    assert not torch.equal(a, b), "DP noise (or Poisson sampling) was reproducible from the run seed"
    c, d = weights("privacy.deterministic_noise=true"), weights("privacy.deterministic_noise=true")
    torch.testing.assert_close(c, d)


def test_generator_outputs_images_in_unit_range() -> None:
    G = CondDCGANGenerator(z_dim=8, num_classes=3, channels=3, resolution=32, ngf=4)
    out = G(torch.randn(6, 8), torch.tensor([0, 1, 2, 0, 1, 2]))
    assert out.shape == (6, 3, 32, 32) and out.min() >= 0 and out.max() <= 1


@pytest.mark.parametrize(
    ("limit", "expected"), [(None, 3 * 469), (5, 15), (1, 3), (0.5, 3 * 234), (1.0, 3 * 469), (10_000, 3 * 469)]
)
def test_planned_steps_follows_lightning_limits(limit, expected) -> None:
    assert planned_steps(epochs=3, batches_per_epoch=469, limit_train_batches=limit) == expected


def test_a_crashed_run_resumes_from_its_checkpoint_without_spending_twice(make_cfg, tmp_path, monkeypatch) -> None:
    """Crash at step 7 of 10 (checkpoint every 3): the re-run resumes at step 6 and the ledger counts 10 steps."""
    from dpsyn.cli.train import run
    from dpsyn.lit import gan
    from dpsyn.privacy import PrivacyLedger, dpsgd_epsilon

    over = ("method=dp_gan", "eps=1", "trainer.limit_train_batches=10", "method.checkpoint_every=3",
            "metrics.names.image=[]", "metrics.n_samples=50")
    original = gan.GANModule.training_step

    def crash_at_7(self, batch, idx):
        if self.dp_steps == 6 and not getattr(self, "_resumed", False):
            raise RuntimeError("killed")
        return original(self, batch, idx)

    monkeypatch.setattr(gan.GANModule, "training_step", crash_at_7)
    with pytest.raises(RuntimeError, match="killed"):
        run(make_cfg(*over), tmp_path / "run")
    assert (tmp_path / "run" / "checkpoints" / "last.ckpt").is_file()
    assert not (tmp_path / "run" / "result.json").exists()
    crashed = PrivacyLedger.load(tmp_path / "run" / "privacy.json")
    assert crashed.to_dict()["events"][0]["steps"] == 6  # what the crashed run made

    steps_seen = []

    def resumed(self, batch, idx):
        self._resumed = True
        steps_seen.append(self.dp_steps)
        return original(self, batch, idx)

    monkeypatch.setattr(gan.GANModule, "training_step", resumed)
    result = run(make_cfg(*over), tmp_path / "run")
    assert steps_seen[0] == 6  # resumed, not restarted
    (event,) = result["privacy_events"]
    assert event["steps"] == 10
    assert result["epsilon_spent"] == pytest.approx(dpsgd_epsilon(
        noise_multiplier=event["noise_multiplier"], sample_rate=event["sample_rate"], steps=10, delta=1e-5))
    assert result["epsilon_spent"] <= 1.0

    # a checkpoint made under another calibration is refused
    with pytest.raises(ValueError, match="was trained with noise multiplier"):
        run(make_cfg(*over[:1], "eps=2", *over[2:]), tmp_path / "run")
