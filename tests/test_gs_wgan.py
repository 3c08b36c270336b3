"""GS-WGAN (paper 002 baseline): the sanitised gradient, the critic bank and partitions, the privacy accounting,
and the method end to end (with a resume)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from dpsyn.data.base import Split
from dpsyn.data.partitions import KeyedPartitions, partition_key
from dpsyn.methods import gs_wgan, session
from dpsyn.methods.gs_wgan import (
    SAMPLING_NOTE,
    CriticBank,
    clip_per_sample,
    critic_turn,
    generator_step,
    gs_wgan_sigma,
    iteration_noise_multiplier,
    published_analysis_epsilon,
    sanitize,
)
from dpsyn.nets.dcgan import CondDCGANGenerator
from dpsyn.nets.ensemble import CondConvTeacher
from dpsyn.privacy import PrivacyLedger, dp_generator, dpsgd_epsilon
from dpsyn.privacy.uniform_choice import uniform_choice_epsilon
from tests.conftest import RecordingBar, crash_on_call, run_context

SMOKE = ("method=gs_wgan", "dataset=fmnist", "method.critics=20", "method.batch_size=4", "method.critic_steps=1",
         "method.ndf=2", "method.ngf=4", "method.z_dim=8", "privacy.deterministic_noise=true",
         "metrics.names.image=[]", "metrics.n_samples=50", "method.warm_start_iterations=2")


def _parts(n: int, k: int) -> KeyedPartitions:
    return KeyedPartitions(np.arange(n), k, key=partition_key(0, "critics"))


def _batches(parts: KeyedPartitions, k: int, steps: int, batch: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [(r[0], m[0]) for r, m in (parts.batch([k], batch) for _ in range(steps))]


def _critic(ndf: int = 4) -> CondConvTeacher:
    return CondConvTeacher(num_classes=3, channels=1, resolution=28, ndf=ndf)


def _gen() -> CondDCGANGenerator:
    return CondDCGANGenerator(z_dim=8, num_classes=3, channels=1, resolution=28, ngf=4)


def _raw_grads(critic: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """dD(x_j)/dx_j per sample, unsanitised."""
    xx = x.detach().clone().requires_grad_(True)
    return torch.autograd.grad(critic(xx, y).sum(), xx)[0]


def test_sanitised_gradient_reaching_g_is_clipped_per_sample_even_for_a_huge_critic() -> None:
    torch.manual_seed(0)
    G, critic = _gen(), _critic()
    with torch.no_grad():
        for p in critic.parameters():
            p.mul_(1e3)  # raw input gradients ~1e6 times larger
    z, y, clip = torch.randn(6, 8), torch.randint(0, 3, (6,)), 0.5
    raw = _raw_grads(critic, G(z, y), y)
    assert raw.flatten(1).norm(dim=1).min() > 1e3 * clip
    got = generator_step(G, critic, z=z, y=y, clip=clip, sigma=0.0, generator=None)
    norms = got.flatten(1).norm(dim=1)
    assert (norms <= clip * (1 + 1e-5)).all() and (norms >= clip * (1 - 1e-5)).all()
    torch.testing.assert_close(got, clip_per_sample(-raw, clip), rtol=1e-4, atol=1e-7)  # of the loss -D(x_j)
    # small gradients pass unchanged
    small = torch.randn(5, 3, 4) * 1e-3
    torch.testing.assert_close(clip_per_sample(small, 1.0), small)


def test_noise_added_to_the_clipped_gradient_has_std_sigma_c() -> None:
    grad = torch.randn(2000, 784, generator=torch.Generator().manual_seed(0)) * 5.0
    clip, sigma = 0.5, 1.3
    out = sanitize(grad, clip=clip, sigma=sigma, generator=dp_generator(deterministic=True, seed=3))
    noise = out - clip_per_sample(grad, clip)
    assert noise.std().item() == pytest.approx(sigma * clip, rel=0.01)
    assert abs(noise.mean().item()) < 0.01 * sigma * clip
    assert torch.equal(sanitize(grad, clip=clip, sigma=0.0, generator=None), clip_per_sample(grad, clip))
    with pytest.raises(ValueError, match="clip bound"):
        sanitize(grad, clip=None, sigma=1.0, generator=dp_generator(deterministic=True, seed=3))


def test_only_the_gradient_into_the_fakes_is_sanitised_exactly_once(monkeypatch) -> None:
    """G's parameter gradient is exactly the autograd gradient of (sanitised / b) . x: sanitised once, then only
    post-processing; the critic's parameters get no gradient."""
    torch.manual_seed(1)
    G, critic = _gen(), _critic()
    z, y, b = torch.randn(5, 8), torch.randint(0, 3, (5,)), 5
    calls = []
    original = gs_wgan.sanitize

    def counted(grad, **kw):
        calls.append(grad.detach().clone())
        return original(grad, **kw)

    monkeypatch.setattr(gs_wgan, "sanitize", counted)
    G.zero_grad()
    released = generator_step(G, critic, z=z, y=y, clip=0.1, sigma=0.7,
                              generator=dp_generator(deterministic=True, seed=0))
    assert len(calls) == 1
    torch.testing.assert_close(calls[0], -_raw_grads(critic, G(z, y), y), rtol=1e-5, atol=1e-8)  # raw grad of -D(x_j)
    assert not torch.allclose(released, calls[0])
    x2 = G(z, y)  # train-mode BatchNorm: the same batch gives the same output
    want = torch.autograd.grad((released / b * x2).sum(), list(G.parameters()))
    for p, w in zip(G.parameters(), want):
        torch.testing.assert_close(p.grad, w, rtol=1e-5, atol=1e-7)
    assert all(p.grad is None for p in critic.parameters())


def test_each_critic_trains_only_on_its_own_partition() -> None:
    """Critic 2's turn reads partition 2 only: perturbing every other row leaves it (and the others) unchanged."""
    torch.manual_seed(0)
    x_all, y_all = torch.rand(40, 1, 28, 28), torch.randint(0, 3, (40,))
    G = _gen()
    own = _parts(40, 4).members(2)

    def turn(x: torch.Tensor) -> list[torch.Tensor]:
        torch.manual_seed(5)
        bank = CriticBank(_critic, 4, lr=1e-2, betas=(0.5, 0.9))
        critic_turn(bank, 2, x=x, y=y_all, batches=_batches(_parts(40, 4), 2, 3, 4), G=G, z_dim=8, num_classes=3,
                    gp_weight=10.0, drift=1e-3, generator=torch.Generator().manual_seed(0))
        return [bank.flat(i) for i in range(4)]

    torch.manual_seed(5)
    fresh = CriticBank(_critic, 4, lr=1e-2, betas=(0.5, 0.9))
    init = [fresh.flat(i) for i in range(4)]
    base = turn(x_all)
    others = torch.ones(40, dtype=torch.bool)
    others[own] = False
    x_pert = x_all.clone()
    x_pert[others] = torch.rand(int(others.sum()), 1, 28, 28)
    pert = turn(x_pert)
    assert not torch.equal(base[2], init[2])  # it trained
    assert torch.equal(base[2], pert[2])
    for i in (0, 1, 3):
        assert torch.equal(base[i], init[i]) and torch.equal(pert[i], init[i])
    x_own = x_all.clone()
    x_own[own] = torch.rand(len(own), 1, 28, 28)
    assert not torch.equal(turn(x_own)[2], base[2])  # its own rows do matter


def test_critic_bank_keeps_k_independent_adams() -> None:
    """Turns of critics 1, 2, 1 through the bank = two steps of a standalone copy of critic 1 with its own Adam."""
    torch.manual_seed(0)
    bank = CriticBank(_critic, 3, lr=1e-2, betas=(0.5, 0.9))
    ref = _critic()
    ref.load_state_dict({n: bank.params[n][1].clone() for n in bank.names})
    ref_opt = torch.optim.Adam(ref.parameters(), lr=1e-2, betas=(0.5, 0.9))
    xs = [torch.rand(4, 1, 28, 28) for _ in range(3)]
    ys = torch.randint(0, 3, (4,))

    def step(module, opt, x):
        opt.zero_grad()
        (module(x, ys) ** 2).sum().backward()
        opt.step()

    for k, x in ((1, xs[0]), (2, xs[1]), (1, xs[2])):
        module, opt = bank.checkout(k)
        step(module, opt, x)
        bank.checkin(k, opt)
    step(ref, ref_opt, xs[0])
    step(ref, ref_opt, xs[2])
    torch.testing.assert_close(bank.flat(1), torch.cat([p.detach().flatten() for p in ref.parameters()]))
    assert bank.steps.tolist() == [0.0, 2.0, 1.0]


def _ctx(**kw):
    return run_context(**kw)


def _method(make_cfg, *over: str, **ctx_kw):
    from dpsyn.methods import METHODS

    cfg = make_cfg(*SMOKE, "method.critics=10", "method.iterations=3", "method.checkpoint_every=0", *over)
    return METHODS.get("gs_wgan")(cfg.method, _ctx(**ctx_kw))


def _tiny() -> Split:
    rng = np.random.default_rng(0)
    return Split(rng.random((60, 1, 28, 28), dtype=np.float32), rng.integers(0, 3, 60).astype(np.int64),
                 np.arange(60))


def test_ledger_epsilon_is_within_target_and_matches_independent_accountants(make_cfg) -> None:
    from dpsyn.methods import PrivacyBudget
    from dpsyn.privacy.dpsgd import rdp_orders

    m = _method(make_cfg)
    ledger = PrivacyLedger(target_epsilon=2.0, delta=1e-5)
    m.fit(_tiny(), PrivacyBudget(2.0, 1e-5), ledger)
    (event,) = ledger.events
    sigma = m.train_log["sigma"]
    assert sigma == gs_wgan_sigma(epsilon=2.0, delta=1e-5, critics=10, iterations=3, batch_size=4)
    # one step an iteration: its 4 releases share the critic drawn (sensitivity 2C sqrt(4)), one of 10 critics
    assert event.kind == "uniform_choice_gaussian" and event.sampling == "uniform_one_of_k"
    assert event.noise_multiplier == pytest.approx(sigma / (2 * 2)) and event.population == 10 and event.steps == 3
    assert event.bound == "convexity" and SAMPLING_NOTE in event.label
    assert "poisson" not in str(ledger.to_dict()["events"]).lower()  # no GS-WGAN event says Poisson
    eps = ledger.epsilon()
    assert 1.99 < eps <= 2.0  # calibrated to the target (bisection to 0.01% of the noise)
    assert eps == pytest.approx(uniform_choice_epsilon(population=10, noise_multiplier=sigma / 4, steps=3,
                                                       delta=1e-5))
    # the remove pair of Poisson subsampling is one the mechanism can produce (the other critics' outputs all at the
    # far side of the ball), so its epsilon (Google's dp_accounting, independent) is a lower bound of the charge;
    # the charge is at most Wang, Balle & Kasiviswanathan's sampling-without-replacement bound here
    dpa = pytest.importorskip("dp_accounting")
    from dp_accounting.rdp import rdp_privacy_accountant

    acc = rdp_privacy_accountant.RdpAccountant(orders=rdp_orders())
    acc.compose(dpa.PoissonSampledDpEvent(0.1, dpa.GaussianDpEvent(sigma / 4)), 3)
    wor = rdp_privacy_accountant.RdpAccountant(orders=rdp_orders(),
                                               neighboring_relation=dpa.NeighboringRelation.REPLACE_ONE)
    wor.compose(dpa.SampledWithoutReplacementDpEvent(10, 1, dpa.GaussianDpEvent(sigma / 4)), 3)
    assert acc.get_epsilon(1e-5) < eps <= wor.get_epsilon(1e-5)
    # the charge's premise, checked by dp_accounting: 4 Gaussian releases of noise multiplier sigma/2 (each of
    # sensitivity 2C) compose to exactly one of multiplier sigma/4 (sensitivity 2C sqrt(4))
    four = rdp_privacy_accountant.RdpAccountant(orders=rdp_orders())
    four.compose(dpa.ComposedDpEvent([dpa.GaussianDpEvent(sigma / 2)] * 4))
    one = rdp_privacy_accountant.RdpAccountant(orders=rdp_orders())
    one.compose(dpa.GaussianDpEvent(sigma / 4))
    assert four.get_epsilon(1e-5) == pytest.approx(one.get_epsilon(1e-5), rel=1e-9)
    # the GS-WGAN authors' analysis (each release subsampled on its own), recorded beside the run, never charged
    published = m.train_log["epsilon_published_analysis"]
    assert published == pytest.approx(dpsgd_epsilon(noise_multiplier=sigma / 2, sample_rate=0.1, steps=12,
                                                    delta=1e-5))
    assert published < eps


def test_published_analysis_undercounts_the_authors_mnist_setting() -> None:
    """The authors' MNIST setting (K=1000, noise_multiplier 1.07 vs sensitivity 2C, i.e. sigma 2.14 C, 20000 x 32
    releases): their per-release composition gives eps 4.45 under Opacus's RDP (the paper reports 10 with autodp's
    sampling-without-replacement analysis); one step an iteration, as dpsyn charges it, gives 366."""
    args = dict(sigma=2.14, critics=1000, batch_size=32, iterations=20000)
    assert published_analysis_epsilon(**args, delta=1e-5, accountant="rdp") == pytest.approx(4.4502, abs=1e-3)
    per_iteration = dpsgd_epsilon(noise_multiplier=iteration_noise_multiplier(2.14, 32), sample_rate=1e-3,
                                  steps=20000, delta=1e-5)
    assert per_iteration == pytest.approx(365.73, abs=0.05)  # the Poisson argument, one step an iteration
    charged = uniform_choice_epsilon(population=1000, noise_multiplier=iteration_noise_multiplier(2.14, 32),
                                     steps=20000, delta=1e-5)
    assert charged >= per_iteration
    assert iteration_noise_multiplier(2.14, 32) == pytest.approx(1.07 / math.sqrt(32))


def test_eps_inf_adds_no_noise_and_records_a_non_private_event(make_cfg, monkeypatch) -> None:
    from dpsyn.methods import PrivacyBudget

    seen = []
    original = gs_wgan.sanitize
    monkeypatch.setattr(gs_wgan, "sanitize", lambda g, **kw: seen.append(kw) or original(g, **kw))
    m = _method(make_cfg, "eps=inf", "method.clip=0.3")
    ledger = PrivacyLedger(target_epsilon=math.inf, delta=1e-5)
    m.fit(_tiny(), PrivacyBudget(math.inf, 1e-5), ledger)
    assert math.isinf(ledger.epsilon()) and ledger.events[0].kind == "non_private"
    assert seen == [{"clip": 0.3, "sigma": 0.0, "generator": None, "basis": None}] * 3
    assert m.sample(7).x.shape == (7, 1, 28, 28)


def test_gs_wgan_runs_end_to_end_and_resumes_without_charging_twice(make_cfg, tmp_path, monkeypatch) -> None:
    """Crash in iteration 4 (checkpoint every 2): the journal has the 4 iterations charged; the re-run resumes at
    iteration 2 from the checkpoint, keeps iterations 3 and 4 charged (their releases happened), and stops when 5
    are charged: 3 generator iterations in the released G, 5 charged once each (its 4 releases sharing the critic)."""
    from dpsyn.task import run

    over = (*SMOKE, "eps=1", "method.checkpoint_every=2")
    original = gs_wgan.generator_step
    monkeypatch.setattr(gs_wgan, "generator_step", crash_on_call(original, 4))
    with pytest.raises(RuntimeError, match="killed"):
        run(make_cfg(*over), tmp_path / "run")
    assert (tmp_path / "run" / "checkpoints" / "gs_wgan.pt").is_file()
    journal = json.loads((tmp_path / "run" / "checkpoints" / "ledger.journal.json").read_text())
    assert journal["events"][0]["steps"] == 4

    monkeypatch.setattr(gs_wgan, "generator_step", original)
    result = run(make_cfg(*over), tmp_path / "run")
    (event,) = result["privacy_events"]
    assert event["kind"] == "uniform_choice_gaussian" and event["steps"] == 5  # trainer=debug: 5 iterations
    assert event["population"] == 20 and event["sampling"] == "uniform_one_of_k"
    assert result["adjacency"].startswith("add/remove one private row")  # the relation, in result.json too
    sigma = result["sample_provenance"]["sigma"]
    assert event["noise_multiplier"] == pytest.approx(sigma / (2 * 2))  # batch 4: sensitivity 2C sqrt(4)
    assert 0 < result["epsilon_spent"] <= 1.0
    assert result["epsilon_spent"] == pytest.approx(
        uniform_choice_epsilon(population=20, noise_multiplier=sigma / 4, steps=5, delta=result["delta"]))
    assert result["sample_provenance"]["iterations"] == 3 and result["n_samples"] == 50
    assert PrivacyLedger.load(tmp_path / "run" / "privacy.json").epsilon() == pytest.approx(result["epsilon_spent"])
    (tmp_path / "run" / "checkpoints" / "fitted.pt").unlink()  # the method's own check (checkpoints/fitted.pt would refuse first)
    with pytest.raises(ValueError, match="holds no critics"):  # a finished run drops its critics (unreleased)
        run(make_cfg(*over), tmp_path / "run")
    with pytest.raises(ValueError, match="resume with the same config"):
        run(make_cfg(*over, "method.clip=0.25"), tmp_path / "run")


def test_gs_wgan_config_errors_name_the_key() -> None:
    # checked at compose time by the schema (dpsyn.config.schema.GSWGANSchema), before any data is loaded
    from dpsyn.cli.config_check import ConfigError, preflight

    for override, key in (("method.critics=0", "method.critics"), ("method.clip=-1", "method.clip"),
                          ("method.ema=1", "method.ema"), ("method.drift=-0.1", "method.drift"),
                          ("method.critic_steps=1.5", "method.critic_steps"),
                          ("method.output_frequencies=0", "method.output_frequencies"),
                          ("method.warm_start_chunk=0", "method.warm_start_chunk")):
        with pytest.raises(ConfigError, match=key):
            preflight(["method=gs_wgan", override])


@pytest.mark.parametrize(("dataset", "eps", "want"), [
    ("fmnist", "inf", (10, None, 1.0, 1000, 32, 50, 1)), ("fmnist", "10", (100, 7, 0.5, 12000, 8, 150, 20)),
    ("fmnist", "30", (100, 7, 0.5, 12000, 8, 150, 20)),
    ("fmnist", "1", (100, 7, 0.5, 12000, 8, 150, 20)), ("fmnist", "9.9", (100, 7, 0.5, 12000, 8, 150, 20)),
    ("fmnist", "0.1", (100, 7, 0.5, 12000, 8, 150, 20)),
    ("digits", "inf", (100, None, 1.0, 1000, 32, 50, 1)), ("digits", "10", (100, None, 1.0, 1000, 32, 50, 1)),
])
def test_fmnist_takes_ten_critics_without_noise_and_the_band_with_it(make_cfg, dataset, eps, want) -> None:
    """fmnist's eps=inf runs take 10 critics, its private runs 100 critics (fewer mean more noise per release), the
    7x7 band and the clip 0.5, and 12000 iterations of batch 8 after a 150-iteration warm start (20 critics a vmap
    call), each chosen on the validation split (at eps 10 and 1) (gs_wgan_fmnist.yaml); other datasets keep the
    embedded defaults."""
    m = make_cfg("method=gs_wgan", f"dataset={dataset}", f"eps={eps}").method
    got = (m.critics, m.output_frequencies, m.clip, m.iterations, m.batch_size, m.warm_start_iterations,
           m.warm_start_chunk)
    assert got == want


def test_a_private_run_publishes_neither_the_critic_drawn_nor_its_w_estimate(make_cfg, tmp_path, caplog) -> None:
    """The 1/K amplification needs the chosen critic to stay secret, and W is read from private rows: neither may
    reach the logs or result.json of a private run."""
    import logging

    from dpsyn.task import run

    with caplog.at_level(logging.INFO, logger="dpsyn.methods.gs_wgan"):
        result = run(make_cfg(*SMOKE, "eps=1", "metrics.names.image=[]", "metrics.n_samples=20"), tmp_path / "run")
    text = caplog.text
    assert "gs_wgan iteration 1/" in text and "critic " not in text and "W estimate" not in text
    assert "last_w" not in result["sample_provenance"]


def test_the_progress_bar_shows_iterations_and_epsilon_only(make_cfg, monkeypatch) -> None:
    """Under DP the bar shows the iterations and the epsilon spent, never the critic drawn nor its W estimate."""
    from dpsyn.methods import PrivacyBudget

    monkeypatch.setattr(RecordingBar, "made", [])
    monkeypatch.setattr(session, "tqdm", RecordingBar)
    ledger = PrivacyLedger(target_epsilon=2.0, delta=1e-5)
    _method(make_cfg).fit(_tiny(), PrivacyBudget(2.0, 1e-5), ledger)
    bar = next(b for b in RecordingBar.made if b.desc == "gs_wgan iterations")
    assert bar.total == bar.n == 3 and bar.closed
    assert bar.postfixes == [{"eps": f"{ledger.epsilon():.3f}"}]  # the last iteration's (then every 20)


def test_the_warm_start_trains_every_critic_on_its_own_partition_and_resets_their_adams(monkeypatch) -> None:
    """warm_start: critic k's steps read partition k's rows only, against a throw-away generator (not the main G),
    every critic moves, and every Adam starts afresh afterwards (the authors load the weights into new optimisers)."""
    torch.manual_seed(0)
    x_all, y_all = torch.rand(40, 1, 28, 28), torch.randint(0, 3, (40,))
    parts = _parts(40, 4)
    bank = CriticBank(_critic, 4, lr=1e-2, betas=(0.5, 0.9))
    init = [bank.flat(i) for i in range(4)]
    seen, made = [], []
    original = gs_wgan.critic_steps_on
    monkeypatch.setattr(gs_wgan, "critic_steps_on",
                        lambda critic, opt, **kw: seen.append((kw["batches"], kw["G"])) or original(critic, opt, **kw))
    gs_wgan.warm_start(bank, parts, x=x_all, y=y_all, make_generator=lambda: made.append(_gen()) or made[-1],
                       iterations=3, critic_steps=2, batch=4, z_dim=8, num_classes=3, gp_weight=10.0, drift=1e-3,
                       lr_g=1e-3, betas=(0.5, 0.9), generator=torch.Generator().manual_seed(0), progress=True)
    assert len(seen) == 4 * 3 and len(made) == 4
    owner = parts.owner()
    for call, (batches, G) in enumerate(seen):
        k = call // 3
        assert len(batches) == 2 and G is made[k]
        for rows, mask in batches:
            assert (owner[rows[mask].numpy()] == k).all() and mask.any()
    for i in range(4):
        assert not torch.equal(bank.flat(i), init[i])
    assert bank.steps.tolist() == [0.0] * 4
    assert all(float(t.abs().sum()) == 0.0 for t in (*bank.exp_avg.values(), *bank.exp_avg_sq.values()))


@pytest.mark.parametrize("chunk", [1, 4])
def test_a_warm_started_critic_depends_on_its_own_partition_only(chunk: int) -> None:
    """Changing the rows of partition 3 changes critic 3 after the warm start and leaves the others bit for bit the
    same, also when the four critics warm up in one vmap call (chunk 4). DPImageBench's GS-WGAN (@565f8d7
    models/gs_wgan.py:402-404) loads every critic from the last critic's warm start, so a row of that partition
    reaches every critic and the 1/K sampling of the accountant fails for it."""
    def warmed(x_all: torch.Tensor, y_all: torch.Tensor, parts: KeyedPartitions) -> list[torch.Tensor]:
        torch.manual_seed(1)
        bank = CriticBank(_critic, 4, lr=1e-2, betas=(0.5, 0.9))
        gs_wgan.warm_start(bank, parts, x=x_all, y=y_all, make_generator=_gen, iterations=3, critic_steps=2, batch=4,
                           z_dim=8, num_classes=3, gp_weight=10.0, drift=1e-3, lr_g=1e-3, betas=(0.5, 0.9),
                           generator=torch.Generator().manual_seed(0), chunk=chunk, progress=True)
        return [bank.flat(i) for i in range(4)]

    torch.manual_seed(0)
    x_all, y_all = torch.rand(40, 1, 28, 28), torch.randint(0, 3, (40,))
    parts = _parts(40, 4)
    before = warmed(x_all, y_all, parts)
    changed = x_all.clone()
    changed[parts.members(3)] = torch.rand(len(parts.members(3)), 1, 28, 28)
    after = warmed(changed, y_all, parts)
    assert all(torch.equal(before[k], after[k]) for k in range(3))
    assert not torch.equal(before[3], after[3])
    assert not any(torch.equal(before[i], before[j]) for i in range(4) for j in range(i + 1, 4))  # no shared start


def test_critics_warmed_up_together_get_what_each_ones_own_loop_gives() -> None:
    """warm_start with chunk > 1 stacks the critics and their throw-away generators (BatchNorm and G's low-pass
    included) and runs each step as one vmap call: every critic ends where its own one-at-a-time loop ends (up to
    float rounding), whatever the chunk, and the Adams are reset as before. A chunk that mixed the critics' losses,
    draws or generators would move them elsewhere. In float64: in float32 Adam amplifies the rounding of the
    batched kernels (to about 1e-5 here, 7e-4 at the embedded sizes), so a tight tolerance would depend on the CPU."""
    from dpsyn.nets.lowpass import LowPassOutput, dct_basis

    def gen() -> torch.nn.Module:
        return LowPassOutput(_gen(), dct_basis((1, 28, 28), 7).double())

    dtype = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        _check_chunks_against_the_loop(gen)
    finally:
        torch.set_default_dtype(dtype)


def _check_chunks_against_the_loop(gen) -> None:
    torch.manual_seed(0)
    x_all, y_all = torch.rand(50, 1, 28, 28), torch.randint(0, 3, (50,))
    parts = _parts(50, 5)
    out = {}
    for chunk in (1, 2, 5):
        torch.manual_seed(1)
        bank = CriticBank(_critic, 5, lr=1e-2, betas=(0.5, 0.9))
        init = [bank.flat(k) for k in range(5)]
        gs_wgan.warm_start(bank, parts, x=x_all, y=y_all, make_generator=gen, iterations=3, critic_steps=2, batch=4,
                           z_dim=8, num_classes=3, gp_weight=10.0, drift=1e-3, lr_g=1e-2, betas=(0.5, 0.9),
                           generator=torch.Generator().manual_seed(0), chunk=chunk, progress=True)
        out[chunk] = [bank.flat(k) for k in range(5)]
        assert all(float((out[chunk][k] - init[k]).abs().max()) > 1e-2 for k in range(5))  # every critic trained
        assert bank.steps.tolist() == [0.0] * 5
        assert all(float(t.abs().sum()) == 0.0 for t in (*bank.exp_avg.values(), *bank.exp_avg_sq.values()))
    for chunk in (2, 5):
        for k in range(5):
            assert out[chunk][k].dtype == torch.float64
            torch.testing.assert_close(out[chunk][k], out[1][k], rtol=0, atol=1e-10)
    # the critics differ from one another by far more than that tolerance
    assert min(float((out[1][i] - out[1][j]).abs().max()) for i in range(5) for j in range(i + 1, 5)) > 1e-2
    with pytest.raises(ValueError, match="chunk"):
        gs_wgan.warm_start(bank, parts, x=x_all, y=y_all, make_generator=gen, iterations=1, critic_steps=1, batch=4,
                           z_dim=8, num_classes=3, gp_weight=10.0, drift=1e-3, lr_g=1e-2, betas=(0.5, 0.9),
                           generator=torch.Generator().manual_seed(0), chunk=0, progress=True)


def test_the_warm_start_chunk_reaches_the_warm_start_and_may_change_on_resume(make_cfg, tmp_path,
                                                                             monkeypatch) -> None:
    """method.warm_start_chunk is handed to warm_start; since it changes the speed only, a run killed after its warm
    start resumes under another chunk (a resume_free_key) and does not warm up again."""
    from dpsyn.task import run

    chunks = []
    original_ws = gs_wgan.warm_start
    monkeypatch.setattr(gs_wgan, "warm_start", lambda *a, **kw: chunks.append(kw["chunk"]) or original_ws(*a, **kw))
    over = (*SMOKE, "eps=1", "method.checkpoint_every=2")
    original = gs_wgan.generator_step
    monkeypatch.setattr(gs_wgan, "generator_step", crash_on_call(original, 3))
    with pytest.raises(RuntimeError, match="killed"):
        run(make_cfg(*over, "method.warm_start_chunk=20"), tmp_path / "run")
    monkeypatch.setattr(gs_wgan, "generator_step", original)
    result = run(make_cfg(*over, "method.warm_start_chunk=1"), tmp_path / "run")
    assert chunks == [20]
    assert result["fit_restored"] is False and result["privacy_events"][0]["steps"] == 5


def test_the_warm_start_charges_nothing_and_releases_no_critic(make_cfg, tmp_path, monkeypatch) -> None:
    """A private run with a warm start: during it no noise is drawn and the ledger does not change; the run's ledger
    is exactly the main run's releases (as without a warm start); the critics are never among the method's fitted
    (published) attributes, only in the checkpoint as unreleased; a resumed run does not warm-start again."""
    from dpsyn.task import run

    calls = []
    original_ws, original_gm = gs_wgan.warm_start, gs_wgan.gaussian_mechanism
    noise = []
    monkeypatch.setattr(gs_wgan, "gaussian_mechanism", lambda *a, **kw: noise.append(1) or original_gm(*a, **kw))

    charges = []
    for name in ("add", "record_steps"):
        method = getattr(PrivacyLedger, name)
        monkeypatch.setattr(PrivacyLedger, name,
                            lambda self, *a, _m=method, **kw: charges.append(1) or _m(self, *a, **kw))

    def spied(bank, parts, **kw):
        n_noise, n_charges = len(noise), len(charges)
        before = [bank.flat(k) for k in range(bank.k)]
        original_ws(bank, parts, **kw)
        calls.append({"noise": len(noise) - n_noise, "charges": len(charges) - n_charges,
                      "moved": all(not torch.equal(bank.flat(k), before[k]) for k in range(bank.k))})
    monkeypatch.setattr(gs_wgan, "warm_start", spied)
    over = (*SMOKE, "eps=1", "method.checkpoint_every=2")
    original = gs_wgan.generator_step
    monkeypatch.setattr(gs_wgan, "generator_step", crash_on_call(original, 3))
    with pytest.raises(RuntimeError, match="killed"):
        run(make_cfg(*over), tmp_path / "run")
    assert calls == [{"noise": 0, "charges": 0, "moved": True}] and len(charges) > 0
    monkeypatch.setattr(gs_wgan, "generator_step", original)
    result = run(make_cfg(*over), tmp_path / "run")
    assert len(calls) == 1  # resumed from the checkpoint: no second warm start
    (event,) = result["privacy_events"]
    assert event["kind"] == "uniform_choice_gaussian" and event["steps"] == 5  # the main run's iterations only
    cold = run(make_cfg(*over, "method.warm_start_iterations=0"), tmp_path / "cold")
    assert cold["privacy_events"][0]["steps"] == event["steps"]
    assert result["sample_provenance"]["warm_start_iterations"] == 2
    assert cold["sample_provenance"]["warm_start_iterations"] == 0
    assert "critics" not in gs_wgan.GSWGAN.fitted_attrs
    assert gs_wgan.GSWGAN.unreleased_checkpoint_keys[gs_wgan.CHECKPOINT] == ("critics",)


def test_sanitising_in_a_basis_clips_and_noises_its_coefficients_only() -> None:
    """With a basis the per-sample gradient is written as its low-frequency DCT coefficients (checked against
    scipy's orthonormal DCT-II), clipped to C and noised there with std sigma C; the result lies in the basis' span,
    so the noise has m^2 of the d dimensions."""
    from scipy.fft import dctn

    from dpsyn.nets.lowpass import dct_basis

    m, clip, sigma = 5, 0.5, 1.3
    basis = dct_basis((1, 28, 28), m)
    grad = torch.randn(2000, 1, 28, 28, generator=torch.Generator().manual_seed(0)) * 5.0
    want = torch.from_numpy(dctn(grad[:, 0].double().numpy(), axes=(1, 2), norm="ortho")[:, :m, :m].reshape(-1, m * m))
    clean = sanitize(grad, clip=clip, sigma=0.0, generator=None, basis=basis)
    coef = clean.flatten(1) @ basis
    torch.testing.assert_close(coef.double(), clip_per_sample(want, clip), rtol=1e-4, atol=1e-6)
    assert coef.norm(dim=1).max() <= clip * (1 + 1e-5)
    noisy = sanitize(grad, clip=clip, sigma=sigma, generator=dp_generator(deterministic=True, seed=3), basis=basis)
    flat = noisy.flatten(1)
    assert (flat - (flat @ basis) @ basis.T).abs().max() < 1e-4  # nothing outside the span
    noise = flat @ basis - coef
    assert noise.std().item() == pytest.approx(sigma * clip, rel=0.02)
    assert noise.square().sum(1).mean().item() == pytest.approx(m * m * (sigma * clip) ** 2, rel=0.02)
    with pytest.raises(ValueError, match="basis of 784 rows"):
        sanitize(torch.randn(3, 1, 8, 8), clip=1.0, sigma=0.0, generator=None, basis=basis)


def test_output_frequencies_keeps_g_in_the_band_and_charges_the_same(make_cfg, monkeypatch) -> None:
    """method.output_frequencies: G is the low-pass generator, every released gradient lies in the band, the
    samples' logits too, and the ledger is the run's without it (the same sigma, rate and releases)."""
    from dpsyn.methods import PrivacyBudget
    from dpsyn.nets.lowpass import LowPassOutput, dct_basis

    released = []
    original = gs_wgan.generator_step
    monkeypatch.setattr(gs_wgan, "generator_step", lambda *a, **kw: released.append(original(*a, **kw)) or released[-1])
    ledgers = {}
    for m in (None, 4):
        over = ("method.output_frequencies=null" if m is None else f"method.output_frequencies={m}",)
        method = _method(make_cfg, *over)
        ledgers[m] = PrivacyLedger(target_epsilon=2.0, delta=1e-5)
        method.fit(_tiny(), PrivacyBudget(2.0, 1e-5), ledgers[m])
    assert isinstance(method.G, LowPassOutput) and method.sample(5).provenance["output_frequencies"] == 4
    basis = dct_basis((1, 28, 28), 4)
    for r in released[3:]:  # the band run's 3 iterations
        flat = r.flatten(1)
        assert (flat - (flat @ basis) @ basis.T).abs().max() < 1e-4
    assert all((r.flatten(1) - (r.flatten(1) @ basis) @ basis.T).abs().max() > 1e-2 for r in released[:3])
    logits = torch.logit(torch.from_numpy(method.sample(20).x).double().clamp(1e-6, 1 - 1e-6)).flatten(1)
    assert (logits - (logits @ basis.double()) @ basis.double().T).abs().max() < 1e-2
    (plain,), (band,) = ledgers[None].events, ledgers[4].events
    assert (band.noise_multiplier, band.population, band.steps) == (plain.noise_multiplier, plain.population,
                                                                    plain.steps)
    assert ledgers[4].epsilon() == ledgers[None].epsilon() and "4x4 lowest DCT frequencies" in band.label



def test_private_runs_refuse_the_authors_drawn_schedule(make_cfg) -> None:
    """Training the critic drawn makes every critic depend on the secret draws of earlier iterations (hidden state),
    which no bound here covers: a private run refuses it before any work; eps=inf runs it."""
    from dpsyn.methods import PrivacyBudget

    with pytest.raises(ValueError, match="critic_schedule=drawn.*eps=inf only"):
        _method(make_cfg, "method.critic_schedule=drawn").fit(_tiny(), PrivacyBudget(2.0, 1e-5),
                                                              PrivacyLedger(target_epsilon=2.0, delta=1e-5))
    m = _method(make_cfg, "eps=inf", "method.critic_schedule=drawn")
    m.fit(_tiny(), PrivacyBudget(math.inf, 1e-5), PrivacyLedger(target_epsilon=math.inf, delta=1e-5))
    assert m.train_log["critic_schedule"] == "drawn"


@pytest.mark.parametrize("fresh", [0, 2])
def test_critics_train_on_a_public_schedule_and_the_release_reads_the_critic_drawn(make_cfg, monkeypatch,
                                                                                   fresh: int) -> None:
    """Iteration t trains critic t mod K (kept) whatever was drawn; the sanitised gradient goes through the critic
    the DP picker drew; with fresh_steps a throw-away copy of that critic takes the steps on its own partition and
    the bank keeps the critic as it was."""
    from dpsyn.methods import PrivacyBudget

    turns, released = [], []
    real_turn = gs_wgan.critic_turn

    def turn(bank, k, *, batches, keep=True, **kw):
        before = bank.flat(k).clone()
        out = real_turn(bank, k, batches=batches, keep=keep, **kw)
        turns.append((k, keep, len(batches), torch.equal(bank.flat(k), before)))
        return out

    real_step = gs_wgan.generator_step

    def step(G, critic, **kw):
        released.append(torch.cat([p.detach().flatten() for p in critic.parameters()]).clone())
        return real_step(G, critic, **kw)

    draws = []
    real_draw = gs_wgan.draw_critics
    monkeypatch.setattr(gs_wgan, "draw_critics", lambda k, n, g: draws.append(real_draw(k, n, g)) or draws[-1])
    monkeypatch.setattr(gs_wgan, "critic_turn", turn)
    monkeypatch.setattr(gs_wgan, "generator_step", step)
    m = _method(make_cfg, "method.iterations=5", "method.critic_steps=2", f"method.fresh_steps={fresh}",
                "method.warm_start_iterations=0")
    m.fit(_tiny(), PrivacyBudget(2.0, 1e-5), PrivacyLedger(target_epsilon=2.0, delta=1e-5))
    kept = [t for t in turns if t[1]]
    assert [t[0] for t in kept] == [0, 1, 2, 3, 4] and all(t[2] == 2 and not t[3] for t in kept)  # t mod K (K=10)
    thrown = [t for t in turns if not t[1]]
    assert len(thrown) == (5 if fresh else 0)
    assert [t[0] for t in thrown] == [int(d) for d in draws][: len(thrown)]
    assert all(t[2] == fresh and t[3] for t in thrown)  # the bank's critic unchanged by the copy's steps
    assert len(released) == len(draws) == 5
