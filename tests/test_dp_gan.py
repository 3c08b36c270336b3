"""dp_gan's DP-SGD step: the per-row gradient pairing, clipping, expected-batch normalisation and the noise source."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from opacus import GradSampleModule
from opacus.optimizers import DPOptimizer
from torch.nn import functional as F

from dpsyn.lit.gan import noise_only_step, planned_steps
from dpsyn.nets.dcgan import CondDCGANDiscriminator, CondDCGANGenerator
from tests.conftest import run_context
from dpsyn.config import load_group


# end-to-end runs on fmnist whose checks do not depend on the networks' width or on image metrics: a narrow DCGAN (the
# default is 32 wide) and few samples
SMALL_IMAGE_RUN = ("method.ngf=8", "method.ndf=8", "metrics.names.image=[]", "metrics.n_samples=60")


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
    from dpsyn.task import run

    def weights(*over: str) -> torch.Tensor:
        import dpsyn.methods.dp_gan as m

        captured = {}
        orig_fit = m.DPGAN.fit

        def fit(self, *a, **k):
            orig_fit(self, *a, **k)
            captured["w"] = torch.cat([p.detach().flatten() for p in self.module.D.parameters()])

        m.DPGAN.fit = fit
        try:
            run(make_cfg("method=dp_gan", "eps=1", *SMALL_IMAGE_RUN, *over), tmp_path / str(len(list(tmp_path.iterdir()))))
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
    from dpsyn.task import run
    from dpsyn.lit import gan
    from dpsyn.privacy import PrivacyLedger, dpsgd_epsilon

    over = ("method=dp_gan", "eps=1", "trainer.limit_train_batches=10", "method.checkpoint_every=3",
            *SMALL_IMAGE_RUN[:2], "metrics.names.image=[]", "metrics.n_samples=50")
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

    # a finished run's fitted state made under another config is refused first ...
    with pytest.raises(ValueError, match="fitted under another configuration"):
        run(make_cfg(*over[:1], "eps=2", *over[2:]), tmp_path / "run")
    # ... and without it, the training checkpoint made under another calibration is refused
    (tmp_path / "run" / "checkpoints" / "fitted.pt").unlink()
    with pytest.raises(ValueError, match="was trained with noise multiplier"):
        run(make_cfg(*over[:1], "eps=2", *over[2:]), tmp_path / "run")


# ------------------------------------------------------------------------------------------------------- tables


def _events(result: dict, kind: str) -> list[dict]:
    return [e for e in result["privacy_events"] if e["kind"] == kind]


def test_dp_gan_on_a_table_releases_class_proportions_then_dp_sgd_within_target(make_cfg, tmp_path) -> None:
    """breast_cancer end to end: Laplace class-ratio release (eps 0.01) + DP-SGD for the rest, total <= eps."""
    from dpsyn.task import run
    from dpsyn.privacy import dpsgd_epsilon

    # deterministic noise: at eps 0.01 the Laplace scale (100) is large for breast_cancer's 455 private rows, and
    # about 1 draw in 9 zeroes a class, leaving a one-class synthetic table that AUROC refuses
    result = run(make_cfg("method=dp_gan", "dataset=breast_cancer", "eps=1", "metrics.n_samples=300",
                          "method.class_ratio_epsilon=0.01",  # the paper's (conf/method_dataset has 0.1 here)
                          "metrics.tabular.classifiers=[logreg]", "privacy.deterministic_noise=true"), tmp_path / "run")
    (ratio,) = _events(result, "approx_dp")
    assert ratio["epsilon"] == 0.01 and ratio["delta"] == 0.0 and "Laplace" in ratio["label"]
    (sgd,) = _events(result, "sampled_gaussian")
    assert sgd["steps"] == 3  # one epoch of Poisson batches: 1 / sample rate = 455 / 128 -> 3
    eps_sgd = dpsgd_epsilon(noise_multiplier=sgd["noise_multiplier"], sample_rate=sgd["sample_rate"],
                            steps=sgd["steps"], delta=result["delta"])
    assert eps_sgd <= 0.99 * (1 + 1e-9)  # calibrated for the remaining budget
    assert result["epsilon_spent"] == pytest.approx(0.01 + eps_sgd)
    assert result["epsilon_spent"] <= 1.0
    assert "basic composition" in result["accountant"]
    assert 0.0 <= result["metrics"]["auroc"] <= 1.0
    samples = np.load(tmp_path / "run" / "samples.npz")
    assert samples["x"].shape == (300, 30) and samples["x"].min() >= 0 and samples["x"].max() <= 1
    props = result["sample_provenance"]["class_proportions"]
    assert len(props) == 2 and sum(props) == pytest.approx(1.0)
    assert "Laplace" in result["sample_provenance"]["labels"]


def test_dp_gan_table_labels_follow_the_released_proportions() -> None:
    from dpsyn.data.base import Split
    from dpsyn.methods import METHODS, PrivacyBudget
    from dpsyn.methods.dp_gan import _ProportionalLabelGAN
    from dpsyn.privacy import ApproxDPEvent, PrivacyLedger

    cfg = load_group("method", "dp_gan")
    cfg.batch_size, cfg.class_ratio_epsilon = 32, 0.5
    ctx = run_context(kind="table", shape=(4,), trainer={"max_epochs": 1, "limit_train_batches": 2,
                                                          "enable_progress_bar": False, "enable_model_summary": False})
    rng = np.random.default_rng(0)
    y = np.repeat([0, 1, 2], [100, 300, 600])
    private = Split(rng.random((len(y), 4), dtype=np.float32), y)
    method = METHODS.get("dp_gan")(cfg, ctx)
    ledger = PrivacyLedger(target_epsilon=2.0, delta=1e-5)
    method.fit(private, PrivacyBudget(epsilon=2.0, delta=1e-5), ledger)
    assert isinstance(ledger.events[0], ApproxDPEvent) and ledger.events[0].epsilon == 0.5
    assert ledger.check_within_budget() <= 2.0
    props = method.label_probs
    np.testing.assert_allclose(props, [0.1, 0.3, 0.6], atol=0.02)  # Laplace scale 2 on counts of 1000 rows

    samples = method.sample(20_000)
    assert samples.x.shape == (20_000, 4) and samples.y.dtype == np.int64
    np.testing.assert_allclose(np.bincount(samples.y, minlength=3) / 20_000, props, atol=0.015)
    given = method.sample(10, labels=np.full(10, 2))
    assert (given.y == 2).all()
    # the generator's fake labels during training follow the proportions too (post-processing of the release)
    assert isinstance(method.module, _ProportionalLabelGAN)
    torch.manual_seed(0)
    _, y_fake = method.module._latent(20_000)
    np.testing.assert_allclose(np.bincount(y_fake.numpy(), minlength=3) / 20_000, props, atol=0.015)


@pytest.mark.parametrize("value", [1.0, 2.0, 0.0, -0.1])
def test_dp_gan_class_ratio_epsilon_must_leave_budget_for_dp_sgd(make_cfg, tmp_path, value: float) -> None:
    from dpsyn.task import run

    with pytest.raises(ValueError, match="method.class_ratio_epsilon"):
        run(make_cfg("method=dp_gan", "dataset=breast_cancer", "eps=1", f"method.class_ratio_epsilon={value}"),
            tmp_path / "run")


def test_dp_gan_table_without_privacy_uses_exact_proportions(make_cfg, tmp_path) -> None:
    from dpsyn.task import run

    result = run(make_cfg("method=dp_gan", "dataset=breast_cancer", "eps=inf", "metrics.n_samples=200",
                          "metrics.tabular.classifiers=[logreg]"), tmp_path / "run")
    assert [e["kind"] for e in result["privacy_events"]] == ["non_private"]
    assert result["epsilon_spent"] == float("inf")
    props = result["sample_provenance"]["class_proportions"]
    assert props[0] == pytest.approx(170 / 455, abs=1e-3)  # malignant share of breast_cancer's private rows


def test_a_resumed_table_run_reuses_its_class_ratio_release(make_cfg, tmp_path, monkeypatch) -> None:
    """Crash mid-training: the re-run resumes with the class proportions it released, charged once."""
    from dpsyn.task import run
    from dpsyn.lit import gan

    over = ("method=dp_gan", "dataset=breast_cancer", "eps=1", "trainer.limit_train_batches=4", "method.class_ratio_epsilon=0.01",
            "method.checkpoint_every=2", "method.batch_size=32", "metrics.n_samples=100",
            "metrics.tabular.classifiers=[logreg]", "privacy.deterministic_noise=true")
    original = gan.GANModule.training_step

    def crash_at_3(self, batch, idx):
        if self.dp_steps == 3:
            raise RuntimeError("killed")
        return original(self, batch, idx)

    monkeypatch.setattr(gan.GANModule, "training_step", crash_at_3)
    with pytest.raises(RuntimeError, match="killed"):
        run(make_cfg(*over), tmp_path / "run")
    saved = tmp_path / "run" / "checkpoints" / "class_proportions.json"
    state = json.loads(saved.read_text())
    assert state["epsilon"] == 0.01 and len(state["proportions"]) == 2
    # mark the saved release: a re-run that re-released (fresh noise, charged again) would not return the mark
    saved.write_text(json.dumps({**state, "proportions": [0.25, 0.75]}))
    monkeypatch.setattr(gan.GANModule, "training_step", original)
    result = run(make_cfg(*over), tmp_path / "run")
    assert len(_events(result, "approx_dp")) == 1 and _events(result, "sampled_gaussian")[0]["steps"] == 4
    assert result["sample_provenance"]["class_proportions"] == [0.25, 0.75]
    assert result["epsilon_spent"] <= 1.0
    (tmp_path / "run" / "checkpoints" / "fitted.pt").unlink()  # the method's own check (checkpoints/fitted.pt would refuse first)
    with pytest.raises(ValueError, match="released at class-ratio epsilon 0.01, this config asks for 0.02"):
        run(make_cfg(*over, "method.class_ratio_epsilon=0.02"), tmp_path / "run")


@pytest.mark.parametrize("eps", ["1", "inf"])
def test_private_runs_log_nothing_read_from_the_private_batch(make_cfg, tmp_path, monkeypatch, eps: str) -> None:
    """W&B/CSV logs are published with a run: under DP only the generator loss (post-processing of the DP
    discriminator on a fixed number of fakes) is logged, not the discriminator loss on the private Poisson batch."""
    from dpsyn.task import run
    from dpsyn.lit import gan

    logged: list[set[str]] = []
    monkeypatch.setattr(gan.GANModule, "log_dict", lambda self, d, **k: logged.append(set(d)))
    run(make_cfg("method=dp_gan", f"eps={eps}", "metrics.names.image=[]", "metrics.n_samples=50",
                 "trainer.limit_train_batches=2"), tmp_path / "run")
    assert logged and all("train/loss_g" in keys for keys in logged)
    assert all(("train/loss_d" in keys) == (eps == "inf") for keys in logged)


def test_shared_dpsgd_setup_calibrates_for_the_trainers_steps_and_samples_poisson() -> None:
    """dpsyn.lit.dpsgd (dp_gan, dp_gan_ft, dp_gan_mi, dp_dre): the wrapped D, a Poisson loader at batch/n, the
    noise multiplier of dpsgd_noise_multiplier for exactly the steps the Trainer will run, and the ledger charge."""
    from types import SimpleNamespace

    from opacus.data_loader import DPDataLoader
    from torch.utils.data import TensorDataset

    from dpsyn.lit.dpsgd import charge_dpsgd, private_discriminator_loader
    from dpsyn.methods.base import PrivacyBudget
    from dpsyn.privacy import PrivacyLedger, dpsgd_epsilon, dpsgd_noise_multiplier

    data = TensorDataset(torch.randn(500, 4), torch.zeros(500, dtype=torch.long))
    ctx = SimpleNamespace(seed=3, deterministic_noise=False, accountant="rdp")
    D = torch.nn.Linear(4, 1)
    kw = dict(batch=50, epochs=3, limit_train_batches=4, ctx=ctx, max_grad_norm=0.7, grad_sample_mode="hooks",
              name="test")
    wrapped, loader, dp = private_discriminator_loader(D, data, budget=PrivacyBudget(2.0, 1e-5), **kw)
    assert isinstance(wrapped, GradSampleModule) and isinstance(loader, DPDataLoader)
    assert loader.sample_rate == pytest.approx(0.1)
    assert dp is not None and dp["max_steps"] == 12 and dp["max_grad_norm"] == 0.7  # 3 epochs x 4 batches
    assert dp["noise_multiplier"] == dpsgd_noise_multiplier(epsilon=2.0, delta=1e-5, sample_rate=0.1, steps=12)
    # the noise generator is not the run's seed: two set-ups draw different noise
    _, _, dp2 = private_discriminator_loader(torch.nn.Linear(4, 1), data, budget=PrivacyBudget(2.0, 1e-5), **kw)
    assert not torch.equal(torch.randn(5, generator=dp["generator"]), torch.randn(5, generator=dp2["generator"]))
    ledger = PrivacyLedger(target_epsilon=2.0, delta=1e-5)
    charge_dpsgd(ledger, noise_multiplier=dp["noise_multiplier"], sample_rate=0.1, steps_done=7, accountant="rdp",
                 label="x", non_private_label="y")
    assert ledger.epsilon(1e-5) == pytest.approx(dpsgd_epsilon(noise_multiplier=dp["noise_multiplier"],
                                                               sample_rate=0.1, steps=7, delta=1e-5), rel=1e-9)
    # no budget: the module as it is, a seeded shuffled loader, a non-private event
    plain, loader, dp = private_discriminator_loader(D, data, budget=PrivacyBudget(float("inf"), 1e-5), **kw)
    assert plain is D and dp is None and not isinstance(loader, DPDataLoader) and loader.batch_size == 50
    ledger = PrivacyLedger(target_epsilon=float("inf"), delta=1e-5)
    charge_dpsgd(ledger, noise_multiplier=None, sample_rate=0.1, steps_done=7, accountant="rdp", label="x",
                 non_private_label="y")
    assert ledger.to_dict()["events"][0]["kind"] == "non_private"


# --- split mode (the default DP step): per-sample gradients for the real rows only, B fake rows added after noise


def _flat(params) -> torch.Tensor:
    return torch.cat([p.detach().flatten() for p in params]).clone()


def _replayed_noise(params, std: float, seed: int) -> torch.Tensor:
    """The Gaussian draws Opacus's DPOptimizer makes from a generator seeded with ``seed``: one tensor per parameter,
    in parameter order (``torch.normal(0, std, p.shape)``)."""
    g = torch.Generator().manual_seed(seed)
    return torch.cat([torch.normal(0.0, std, size=p.shape, generator=g).flatten() for p in params])


def _clipped_row_sum(D: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, target: float, clip: float) -> torch.Tensor:
    """Reference: sum over rows of clip(grad of row i's loss), one row at a time."""
    total = torch.zeros(sum(p.numel() for p in D.parameters()))
    for i in range(len(x)):
        D.zero_grad()
        F.binary_cross_entropy_with_logits(D(x[i : i + 1], y[i : i + 1]), torch.full((1,), target),
                                           reduction="sum").backward()
        g = torch.cat([p.grad.flatten() for p in D.parameters()])
        total += g * min(1.0, clip / (g.norm().item() + 1e-6))
    return total


@pytest.mark.parametrize("functorch", [False, True])
def test_split_step_is_the_clipped_noised_real_sum_plus_the_fake_gradient_over_b(functorch: bool) -> None:
    from dpsyn.lit.gan import split_dp_step

    x, y = torch.rand(5, 1, 28, 28), torch.tensor([0, 1, 2, 0, 1])
    fake, y_fake = torch.rand(8, 1, 28, 28), torch.tensor([0, 1, 2, 0, 1, 2, 0, 1])
    clip, B, nm, seed = 0.05, 8, 0.7, 11
    D = _d()
    params = list(D.parameters())
    want = (_clipped_row_sum(D, x, y, 1.0, clip) + _replayed_noise(params, nm * clip, seed)) / B
    want += _clipped_row_sum(D, fake, y_fake, 0.0, clip) / len(fake)  # the fake rows: clipped per row, averaged

    gsm = GradSampleModule(_d(), loss_reduction="sum", force_functorch=functorch)
    opt = DPOptimizer(torch.optim.SGD(gsm.parameters(), lr=1.0), noise_multiplier=nm, max_grad_norm=clip,
                      expected_batch_size=B, loss_reduction="mean", generator=torch.Generator().manual_seed(seed))
    before = _flat(gsm.parameters())
    split_dp_step(
        opt, gsm,
        fake_loss=lambda: F.binary_cross_entropy_with_logits(gsm(fake, y_fake), torch.zeros(8), reduction="sum"),
        real_loss=lambda: F.binary_cross_entropy_with_logits(gsm(x, y), torch.ones(5), reduction="sum"),
    )
    update = before - _flat(gsm.parameters())
    torch.testing.assert_close(update, want, rtol=1e-4, atol=1e-6)
    assert all(p.grad is None and getattr(p, "grad_sample", None) is None for p in gsm.parameters())


def test_paired_step_matches_the_row_by_row_clipped_noised_sum() -> None:
    """The paired construction with noise: row i's real + fake gradient clipped as one, summed, noised, / B."""
    x, fake, y = torch.rand(5, 1, 28, 28), torch.rand(5, 1, 28, 28), torch.tensor([0, 1, 2, 0, 1])
    clip, B, nm, seed = 0.05, 8, 0.7, 5
    D = _d()
    ref = _row_grads(D, x, fake, y)
    want = (sum(g * min(1.0, clip / (g.norm().item() + 1e-6)) for g in ref)
            + _replayed_noise(list(D.parameters()), nm * clip, seed)) / B
    gsm = GradSampleModule(_d(), loss_reduction="sum")
    opt = DPOptimizer(torch.optim.SGD(gsm.parameters(), lr=1.0), noise_multiplier=nm, max_grad_norm=clip,
                      expected_batch_size=B, loss_reduction="mean", generator=torch.Generator().manual_seed(seed))
    before = _flat(gsm.parameters())
    opt.zero_grad(set_to_none=True)
    loss = F.binary_cross_entropy_with_logits(gsm(x, y), torch.ones(5), reduction="sum")
    (loss + F.binary_cross_entropy_with_logits(gsm(fake, y), torch.zeros(5), reduction="sum")).backward()
    opt.step()
    torch.testing.assert_close(before - _flat(gsm.parameters()), want, rtol=1e-4, atol=1e-6)


def _split_module(B: int, seed: int):
    from dpsyn.lit.gan import GANModule

    torch.manual_seed(0)
    G = CondDCGANGenerator(z_dim=8, num_classes=3, channels=1, resolution=28, ngf=4)
    gsm = GradSampleModule(_d(), loss_reduction="sum")
    dp = {"noise_multiplier": 0.9, "max_grad_norm": 0.05, "generator": torch.Generator().manual_seed(seed),
          "max_steps": 10}
    m = GANModule(generator=G, discriminator=gsm, z_dim=8, num_classes=3, expected_batch_size=B, lr_g=1e-3,
                  lr_d=1e-3, beta1=0.5, dp=dp)
    m.manual_backward = lambda loss: loss.backward()  # no Trainer attached
    _, opt_d = m.configure_optimizers()
    opt_d.original_optimizer = torch.optim.SGD(gsm.parameters(), lr=1.0)  # the update is the gradient
    return m, gsm, opt_d


@pytest.mark.parametrize("b", [0, 3, 20])
def test_split_step_fake_rows_and_their_term_do_not_depend_on_the_poisson_count(b: int) -> None:
    """The fake term (not noised) is computed on exactly B rows whatever b, and equals what the same fake rows give
    with no private row at all (their gradients clipped per row, averaged): the step reveals b only through the
    clipped, noised sum."""
    B, seed = 8, 3
    m, gsm, opt_d = _split_module(B, seed)
    seen: list[tuple[int, bool]] = []
    gsm._module.register_forward_pre_hook(lambda mod, args: seen.append((len(args[0]), gsm.hooks_enabled)))
    x, y = torch.rand(b, 1, 28, 28), torch.randint(0, 3, (b,))
    params = list(gsm.parameters())
    before = _flat(params)
    # the real part, by the reference (computed on a copy with the same weights, before the step)
    ref_d = _d()
    real = _clipped_row_sum(ref_d, x, y, 1.0, 0.05) if b else torch.zeros_like(before)
    torch.manual_seed(42)  # the fake rows' latents
    m._split_dp_step(opt_d, x, y)
    fake_term = (before - _flat(params)) - (real + _replayed_noise(params, 0.9 * 0.05, seed)) / B
    assert [n for n, _ in seen] == [B] + ([b] if b else []), "exactly B fake rows, then the Poisson batch"
    # the same fake rows' plain gradient / B, from the same latents
    torch.manual_seed(42)
    z, y_fake = m._latent(B)
    with torch.no_grad():
        fake = m.G(z, y_fake)
    torch.testing.assert_close(fake_term, _clipped_row_sum(ref_d, fake, y_fake, 0.0, 0.05) / B, rtol=1e-3, atol=1e-6)


def test_split_step_refuses_a_step_without_per_sample_gradients() -> None:
    from dpsyn.lit.gan import split_dp_step

    gsm = GradSampleModule(_d(), loss_reduction="sum")
    opt = DPOptimizer(torch.optim.SGD(gsm.parameters(), lr=1.0), noise_multiplier=1.0, max_grad_norm=1.0,
                      expected_batch_size=4, loss_reduction="mean")
    x, y = torch.rand(4, 1, 28, 28), torch.randint(0, 3, (4,))

    def real_loss_without_hooks() -> torch.Tensor:  # a bug that would bypass the clipping (and, in Opacus, the noise)
        gsm.disable_hooks()
        return F.binary_cross_entropy_with_logits(gsm(x, y), torch.ones(4), reduction="sum")

    with pytest.raises(RuntimeError, match="per-sample"):
        split_dp_step(opt, gsm, fake_loss=lambda: gsm(x, y).sum() * 0, real_loss=real_loss_without_hooks)


@pytest.mark.parametrize("d_steps", [1, 3])
def test_d_steps_puts_that_many_charged_discriminator_steps_before_each_generator_step(
    make_cfg, tmp_path, monkeypatch, d_steps: int
) -> None:
    """``method.d_steps`` (DPImageBench's d_updates): 7 discriminator steps make 7 // d_steps generator steps, after
    discriminator steps d_steps, 2 d_steps, ...; the ledger charges all 7 discriminator steps, whatever the ratio."""
    from dpsyn.task import run
    from dpsyn.lit import gan
    from dpsyn.privacy import dpsgd_epsilon

    g_after: list[int] = []  # the discriminator step count at each generator step
    monkeypatch.setattr(gan.GANModule, "log_dict", lambda self, d, **k: g_after.append(self.dp_steps))
    result = run(make_cfg("method=dp_gan", "eps=1", f"method.d_steps={d_steps}", "trainer.limit_train_batches=7",
                          *SMALL_IMAGE_RUN), tmp_path / "run")
    assert g_after == list(range(d_steps, 8, d_steps))
    (event,) = result["privacy_events"]
    assert event["steps"] == 7
    assert result["epsilon_spent"] == pytest.approx(dpsgd_epsilon(
        noise_multiplier=event["noise_multiplier"], sample_rate=event["sample_rate"], steps=7, delta=1e-5))


def test_d_steps_must_be_positive() -> None:
    from dpsyn.lit.gan import GANModule

    with pytest.raises(ValueError, match="d_steps=0"):
        GANModule(generator=torch.nn.Linear(1, 1), discriminator=torch.nn.Linear(1, 1), z_dim=1, num_classes=2,
                  expected_batch_size=4, lr_g=1e-3, lr_d=1e-3, beta1=0.5, dp=None, d_steps=0)
