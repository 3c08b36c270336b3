"""trainer=ddp (dpsyn.lit.ddp): DP-SGD on 2 CPU processes over gloo, noise once per global step, one ledger step each.

The step test replays rank 0's noise generator and compares the ranks' update exactly against a one-process
reference: every rank's rows clipped one at a time, summed, ONE noise draw, divided by the global B, plus the mean
of the fake rows' clipped gradients (the same count on every rank). Noise added on every rank, a sum of the ranks' fake terms, or a reduction that forgets to
divide by the world size each change the update by far more than the tolerance.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.nn import functional as F

from dpsyn.nets.dcgan import CondDCGANDiscriminator
from dpsyn.nets.mlp_gan import CondMLPDiscriminator
from dpsyn.config import load_group

WORLD, B, CLIP, NM, SEED = 2, 8, 0.5, 0.8, 13
SHAPE, CLASSES = (6,), 3
# the real rows each rank holds at each step: step 1 both ranks, step 2 rank 1 empty, step 3 rank 0 empty
ROWS = [(3, 5), (4, 0), (0, 2)]


IMAGE = (1, 8, 8)  # the rows of the fused mode: dp_gan's DCGAN discriminator, which the fused engine computes


def _disc(mode: str = "split") -> torch.nn.Module:
    torch.manual_seed(0)
    if mode == "paired_fused":
        return CondDCGANDiscriminator(num_classes=CLASSES, channels=1, resolution=IMAGE[1], ndf=2)
    return CondMLPDiscriminator(num_classes=CLASSES, shape=SHAPE, hidden=(16,))


def _rows(step: int, rank: int, n: int, mode: str = "split") -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 + 10 * step + rank)
    shape = IMAGE if mode == "paired_fused" else SHAPE
    return torch.randn(n, *shape, generator=g) * 3, torch.randint(0, CLASSES, (n,), generator=g)


def _fakes(step: int, rank: int, n: int = B // WORLD, mode: str = "split") -> tuple[torch.Tensor, torch.Tensor]:
    """Fake rows: B/W for a split step; a paired step takes max(B/W, b) as GANModule does, and uses the first b."""
    g = torch.Generator().manual_seed(2000 + 10 * step + rank)
    shape = IMAGE if mode == "paired_fused" else SHAPE
    return torch.randn(n, *shape, generator=g), torch.randint(0, CLASSES, (n,), generator=g)


def _flat(params) -> torch.Tensor:
    return torch.cat([p.detach().flatten() for p in params]).clone()


MODES = ("split", "paired", "paired_fused")


def _rank(rank: int, port: int, out: str) -> None:
    """One rank: the three steps of each mode in turn (a fresh discriminator and optimizer each), then the sampler;
    ``<out>/<rank>.pt`` holds ``{mode: [parameters after each step]}``, the batches and their count."""
    import torch.distributed as dist

    from dpsyn.lit.ddp import DistributedPoissonBatchSampler

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD)
    try:
        after = {mode: _rank_steps(rank, mode) for mode in MODES}
        # the Poisson sampler: this rank's shard only, one batch per step, empty ones included
        sampler = DistributedPoissonBatchSampler(total_size=11, sample_rate=0.1,
                                                 generator=torch.Generator().manual_seed(rank))
        batches = list(sampler)
        torch.save({"after": after, "batches": batches, "num_batches": sampler.num_batches}, Path(out) / f"{rank}.pt")
    finally:
        dist.destroy_process_group()


def _rank_steps(rank: int, mode: str) -> list[torch.Tensor]:
    """This rank's side of the three DP steps of ``mode`` (in an initialised process group)."""
    from opacus import GradSampleModule

    from dpsyn.lit.dpsgd import dp_optimizer
    from dpsyn.lit.gan import noise_only_step, split_dp_step

    from dpsyn.lit import fused_grad_sample

    gsm = GradSampleModule(_disc(mode), loss_reduction="sum")
    # rank 1 gets a generator of its own: if it drew noise, the update would not match rank 0's replay
    gen = torch.Generator().manual_seed(SEED if rank == 0 else SEED + 99)
    opt = dp_optimizer(torch.optim.SGD(gsm.parameters(), lr=1.0), noise_multiplier=NM, max_grad_norm=CLIP,
                       expected_batch_size=B // WORLD, generator=gen, distributed=True)
    after = []
    for step, counts in enumerate(ROWS):
        x, y = _rows(step, rank, counts[rank], mode)
        fake, y_fake = _fakes(step, rank, max(B // WORLD, len(x)) if mode != "split" else B // WORLD, mode)
        if mode != "split":  # GANModule's paired step: real row i and fake row i clipped together
            b = len(x)
            if b and mode == "paired_fused":  # the default engine: per-pair gradients in one pass
                opt.zero_grad(set_to_none=True)
                fused_grad_sample.set_grad_samples(opt, fused_grad_sample.grad_samples(
                    gsm, torch.cat([x, fake[:b]]), torch.cat([y, y_fake[:b]]),
                    torch.cat([torch.ones(b), torch.zeros(b)]), paired=True))
                opt.step()
            elif b:
                opt.zero_grad(set_to_none=True)
                loss = F.binary_cross_entropy_with_logits(gsm(x, y), torch.ones(len(x)), reduction="sum")
                loss = loss + F.binary_cross_entropy_with_logits(gsm(fake[: len(x)], y_fake[: len(x)]),
                                                                 torch.zeros(len(x)), reduction="sum")
                loss.backward()
                opt.step()
            else:
                noise_only_step(opt)
            after.append(_flat(gsm.parameters()))
            continue
        split_dp_step(
            opt, gsm,
            fake_loss=lambda: F.binary_cross_entropy_with_logits(gsm(fake, y_fake), torch.zeros(len(fake)),
                                                                 reduction="sum"),
            real_loss=(lambda: F.binary_cross_entropy_with_logits(gsm(x, y), torch.ones(len(x)), reduction="sum"))
            if len(x) else None,
        )
        after.append(_flat(gsm.parameters()))
    return after


def _clipped_row(D: torch.nn.Module, loss: torch.Tensor) -> torch.Tensor:
    """The gradient of one row's loss, flattened and clipped to CLIP."""
    D.zero_grad()
    loss.backward()
    g = torch.cat([p.grad.flatten() for p in D.parameters()])
    return g * min(1.0, CLIP / (g.norm().item() + 1e-6))


def _bce(D: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, target: float) -> torch.Tensor:
    return F.binary_cross_entropy_with_logits(D(x, y), torch.full((len(x),), target), reduction="sum")


def _reference(mode: str = "split") -> list[torch.Tensor]:
    """One process: every rank's rows clipped one at a time (``paired``: real row i with the rank's fake row i, as
    one row), summed, one N(0, (NM*CLIP)^2) draw from rank 0's generator (Opacus's order: one tensor per parameter),
    / B; ``split``: plus the mean of all fake rows' clipped gradients (each rank's mean, averaged over ranks: the
    same count on every rank). SGD lr 1."""
    D = _disc(mode)
    params = list(D.parameters())
    gen = torch.Generator().manual_seed(SEED)
    out = []
    for step, counts in enumerate(ROWS):
        clipped = torch.zeros(sum(p.numel() for p in params))
        for rank in range(WORLD):
            x, y = _rows(step, rank, counts[rank], mode)
            fake, y_fake = _fakes(step, rank, max(B // WORLD, len(x)), mode)
            for i in range(len(x)):
                loss = _bce(D, x[i:i + 1], y[i:i + 1], 1.0)
                if mode != "split":
                    loss = loss + _bce(D, fake[i:i + 1], y_fake[i:i + 1], 0.0)
                clipped += _clipped_row(D, loss)
        noise = torch.cat([torch.normal(0.0, NM * CLIP, size=p.shape, generator=gen).flatten() for p in params])
        update = (clipped + noise) / B
        if mode == "split":
            fakes = [_fakes(step, r) for r in range(WORLD)]
            rows = [_clipped_row(D, _bce(D, f[j:j + 1], yf[j:j + 1], 0.0)) for f, yf in fakes for j in range(len(f))]
            update += sum(rows) / len(rows)
        with torch.no_grad():
            flat = _flat(params) - update
            i = 0
            for p in params:
                p.copy_(flat[i:i + p.numel()].view_as(p))
                i += p.numel()
        out.append(_flat(params))
    return out


@pytest.fixture(scope="module")
def gloo_ranks(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    """What each of the 2 gloo ranks saved: one spawn runs both modes' steps (a spawn costs each rank its imports)."""
    import torch.multiprocessing as mp

    from dpsyn.lit.ddp import _free_port

    out = tmp_path_factory.mktemp("gloo_ranks")
    mp.spawn(_rank, args=(_free_port(), str(out)), nprocs=WORLD, join=True)
    return [torch.load(out / f"{r}.pt", weights_only=False) for r in range(WORLD)]


def test_two_gloo_ranks_clip_their_rows_and_add_the_noise_once_per_step(gloo_ranks: list[dict]) -> None:
    got = [g["after"]["split"] for g in gloo_ranks]
    want = _reference()
    for step in range(len(ROWS)):
        assert torch.equal(got[0][step], got[1][step]), "the ranks' discriminators differ"
        torch.testing.assert_close(got[0][step], want[step], rtol=1e-4, atol=1e-6)
    # the sampler: rank r holds rows r, r+2, ...; every step yields a batch (some empty), as many on every rank
    for r, g in enumerate(gloo_ranks):
        assert len(g["batches"]) == g["num_batches"] == 10
        assert all(i % WORLD == r for batch in g["batches"] for i in batch)
    assert any(len(b) == 0 for g in gloo_ranks for b in g["batches"])


def test_two_gloo_ranks_paired_step_adds_the_noise_once_per_step(gloo_ranks: list[dict]) -> None:
    """The default paired step under DDP (Opacus's DistributedDPOptimizer.step, and the noise-only step of an empty
    shard) against the one-process reference with rank 0's noise replayed."""
    got = [g["after"]["paired"] for g in gloo_ranks]
    want = _reference("paired")
    for step in range(len(ROWS)):
        assert torch.equal(got[0][step], got[1][step]), "the ranks' discriminators differ"
        torch.testing.assert_close(got[0][step], want[step], rtol=1e-4, atol=1e-6)


def test_two_gloo_ranks_fused_paired_step_adds_the_noise_once_per_step(gloo_ranks: list[dict]) -> None:
    """dp_gan's default engine under DDP: each rank's fused per-pair gradients through DistributedDPOptimizer, against
    the one-process row-by-row reference with rank 0's noise replayed (the DCGAN discriminator, 8x8 images)."""
    got = [g["after"]["paired_fused"] for g in gloo_ranks]
    want = _reference("paired_fused")
    for step in range(len(ROWS)):
        assert torch.equal(got[0][step], got[1][step]), "the ranks' discriminators differ"
        torch.testing.assert_close(got[0][step], want[step], rtol=1e-4, atol=1e-6)


def test_the_reference_would_see_noise_on_every_rank() -> None:
    """The tolerance of the test above is far below one extra noise draw (/B), so a second draw cannot pass."""
    params = list(_disc().parameters())
    extra = torch.cat([torch.normal(0.0, NM * CLIP, size=p.shape, generator=torch.Generator().manual_seed(SEED + 99))
                       .flatten() for p in params]) / B
    assert extra.abs().max() > 1e-2


def _tiny_dp_gan_fit(*, eps: float = 3.0, batch: int = 8, devices: int = 2, ledger=None):
    """dp_gan on a 64-row table under trainer=ddp (2 CPU ranks, 3 global steps): (method, ledger)."""
    from omegaconf import OmegaConf

    from dpsyn.data.base import Split
    from dpsyn.methods import METHODS, PrivacyBudget
    from dpsyn.privacy import PrivacyLedger
    from tests.conftest import run_context

    cfg = OmegaConf.merge(load_group("method", "dp_gan"),
                          {"batch_size": batch, "table_g_hidden": [8], "table_d_hidden": [8], "checkpoint_every": 0})
    ctx = run_context(kind="table", shape=(4,), classes=("a", "b"),
                      trainer={"strategy": "dpsgd_ddp", "devices": devices, "accelerator": "cpu", "max_epochs": 1,
                               "limit_train_batches": 3, "enable_progress_bar": False})
    rng = np.random.default_rng(0)
    private = Split(x=rng.normal(size=(64, 4)).astype(np.float32), y=rng.integers(0, 2, 64))
    method = METHODS.get("dp_gan")(cfg, ctx)
    ledger = ledger if ledger is not None else PrivacyLedger(target_epsilon=eps, delta=1e-5)
    method.fit(private, PrivacyBudget(epsilon=eps, delta=1e-5), ledger)
    return method, ledger


def _sgd_events(ledger):
    from dpsyn.privacy import SampledGaussianEvent

    return [e for e in ledger.events if isinstance(e, SampledGaussianEvent)]


def test_the_parent_charges_rank_zeros_global_step_count_once(monkeypatch) -> None:
    """Without spawning: the ledger gets one DP-SGD event of rank 0's step count, at rate B/n."""
    import dpsyn.lit.ddp as ddp

    def fake_fit(job, *, planned_steps):
        assert planned_steps == 3 and job.world_size == 2 and job.batch == 8
        return {"G": {}, "D": {}, "dp_steps": 3, "noise_multiplier": fake_fit.nm, "identical": True}

    real_calibrate = __import__("dpsyn.lit.dpsgd", fromlist=["calibrate_dpsgd"]).calibrate_dpsgd

    def calibrate(**kw):
        cal = real_calibrate(**kw)
        fake_fit.nm = cal.noise_multiplier
        return cal

    monkeypatch.setattr("dpsyn.lit.dpsgd.calibrate_dpsgd", calibrate)
    monkeypatch.setattr(ddp, "fit_gan_ddp", fake_fit)
    monkeypatch.setattr(torch.nn.Module, "load_state_dict", lambda self, state, strict=True: None)
    _, ledger = _tiny_dp_gan_fit()
    sgd = _sgd_events(ledger)
    assert len(sgd) == 1 and sgd[0].steps == 3 and sgd[0].sample_rate == pytest.approx(8 / 64)


def test_a_failed_ddp_fit_is_charged_what_fit_gan_ddp_says(monkeypatch) -> None:
    """A rank died: the ledger still gets the steps DDPFitError carries (rank 0's count, else the planned steps)."""
    import dpsyn.lit.ddp as ddp
    from dpsyn.privacy import PrivacyLedger

    def failing(job, *, planned_steps):
        raise ddp.DDPFitError("rank 1 died", planned_steps)

    monkeypatch.setattr(ddp, "fit_gan_ddp", failing)
    ledger = PrivacyLedger(target_epsilon=3.0, delta=1e-5)
    with pytest.raises(ddp.DDPFitError):
        _tiny_dp_gan_fit(ledger=ledger)
    assert [e.steps for e in _sgd_events(ledger)] == [3]


@pytest.mark.parametrize("eps, batch, devices, match", [(float("inf"), 8, 2, "eps=inf"), (3.0, 9, 2, "multiple")])
def test_trainer_ddp_refuses_what_it_cannot_do_before_any_release(eps, batch, devices, match) -> None:
    from dpsyn.privacy import PrivacyLedger

    ledger = PrivacyLedger(target_epsilon=eps, delta=1e-5)
    with pytest.raises(ValueError, match=match):
        _tiny_dp_gan_fit(eps=eps, batch=batch, devices=devices, ledger=ledger)
    assert len(ledger.events) == 0, "refused before the class proportions' release"


def test_trainer_ddp_is_refused_for_methods_without_it(make_cfg, tmp_path) -> None:
    from dpsyn.cli.config_check import ConfigError
    from dpsyn.task import run

    cfg = make_cfg("method=gan", "trainer=ddp")
    assert cfg.trainer.strategy == "dpsgd_ddp" and cfg.trainer.accelerator == "gpu"
    with pytest.raises(ConfigError, match="trainer=ddp: method gan .* methods that do: dp_gan"):
        run(cfg, tmp_path / "run")


@pytest.mark.slow
def test_dp_gan_with_trainer_ddp_charges_one_step_per_global_step(monkeypatch) -> None:
    """End to end on 2 gloo ranks (about 50 s on a loaded 2-core machine): 3 global steps, 3 ledger steps, and
    G and D bitwise identical on both ranks."""
    import dpsyn.lit.ddp as ddp

    seen: list[dict] = []
    real_fit = ddp.fit_gan_ddp

    def spy(job, *, planned_steps):
        seen.append(real_fit(job, planned_steps=planned_steps))
        return seen[-1]

    monkeypatch.setattr(ddp, "fit_gan_ddp", spy)
    method, ledger = _tiny_dp_gan_fit()
    sgd = _sgd_events(ledger)
    assert len(sgd) == 1 and sgd[0].steps == 3, "one ledger step per global step (not one per rank)"
    assert sgd[0].sample_rate == pytest.approx(8 / 64)
    assert method.module.dp_steps == 3
    assert len(seen) == 1 and seen[0]["identical"], "G and D must be identical on every rank"
    assert torch.equal(method.module.G.state_dict()["net.0.weight"] if "net.0.weight" in method.module.G.state_dict()
                       else next(iter(method.module.G.state_dict().values())), next(iter(seen[0]["G"].values())))
    assert ledger.epsilon(1e-5) <= 3.0
