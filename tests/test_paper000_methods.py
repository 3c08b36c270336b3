"""Paper 000's methods: DP-MGE's calibration, clipping and estimates; DP-DRE's accounting and density-ratio recovery;
the public baselines; each method end to end on fmnist_shoes with tiny public models."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from dpsyn.config import load_group

from dpsyn.data.base import Split
from dpsyn.methods.base import PrivacyBudget, RunContext
from dpsyn.methods.dp_dre import DensityRatioEstimator, DPSGDSettings, sampling_weights
from dpsyn.methods.dp_mge import DPMGE, dp_moments, plan_releases
from dpsyn.methods.public_baselines import centroid_labels, private_label_map
from dpsyn.privacy import PrivacyLedger, dp_generator, dpsgd_noise_multiplier, gaussian_sigma
from dpsyn.public import PublicModels
from tests.conftest import run_context
from tests.tiny import TINY_PUBLIC

CLASSES = ["Sandal", "Sneaker", "Ankle boot"]


def _paper_sigma(eps: float, delta: float) -> float:
    """Paper 000: sigma = (sqrt(2 log(1/delta) + 2 eps) + sqrt(2 log(1/delta))) / (2 eps), written out again."""
    a = 2 * math.log(1 / delta)
    return (math.sqrt(a + 2 * eps) + math.sqrt(a)) / (2 * eps)


def _ledger(releases: dict, eps: float, delta: float) -> PrivacyLedger:
    ledger = PrivacyLedger(target_epsilon=eps, delta=delta)
    for r in releases.values():
        ledger.add(r.event("test"))
    return ledger


# ------------------------------------------------------------------------------------------- DP-MGE calibration


@pytest.mark.parametrize("eps", [0.1, 1.0, 3.0, 10.0])
def test_mge_noise_scale_is_the_paper_formula_and_analytic_is_tighter(eps: float) -> None:
    delta = 1e-5
    classic = plan_releases(epsilon=eps, delta=delta, calibration="classic")
    for name in ("mean", "second_moment"):
        # (eps/2, delta/2) each, sensitivity 1
        assert classic[name].sigma == pytest.approx(_paper_sigma(eps / 2, delta / 2), rel=1e-12)
        assert (classic[name].epsilon, classic[name].delta) == (eps / 2, delta / 2)
    assert "counts" not in classic
    led = _ledger(classic, eps, delta)
    assert led.check_within_budget() == pytest.approx(eps)  # basic composition: exactly the target
    analytic = plan_releases(epsilon=eps, delta=delta, calibration="analytic")
    for name in ("mean", "second_moment"):
        assert analytic[name].sigma <= classic[name].sigma
        assert analytic[name].sigma == pytest.approx(
            math.sqrt(2) * gaussian_sigma(epsilon=eps, delta=delta, calibration="analytic"))
    assert _ledger(analytic, eps, delta).check_within_budget() == pytest.approx(eps, rel=1e-6)
    # with a DP count release, three shares still compose within the budget
    three = plan_releases(epsilon=eps, delta=delta, calibration="classic", count_share=0.05)
    assert three["counts"].sigma == pytest.approx(_paper_sigma(0.05 * eps, 0.05 * delta), rel=1e-9)
    assert _ledger(three, eps, delta).check_within_budget() <= eps * (1 + 1e-9)


def test_mge_noise_has_the_calibrated_std() -> None:
    rng = np.random.default_rng(0)
    est = dp_moments(np.zeros((1, 40000)), np.zeros(1, dtype=np.int64), 1, sigma_mean=3.0, sigma_second=0.5,
                     sigma_counts=None, rng=rng)
    assert est.mean.std() == pytest.approx(3.0, rel=0.03)  # n = 1: the mean is the noisy sum
    assert est.second.std() == pytest.approx(0.5, rel=0.03)
    with pytest.raises(ValueError, match="norm <= 1"):
        dp_moments(np.full((2, 4), 0.9), np.zeros(2, dtype=np.int64), 1, sigma_mean=None, sigma_second=None,
                   sigma_counts=None, rng=None)


# ------------------------------------------------------------------------------ DP-MGE through the method, stubbed


class _StubEncoder:
    """Features = a fixed per-image vector (the images' first d pixels times ``scale``)."""

    def __init__(self, d: int, scale: float) -> None:
        self.feature_dim, self.scale = d, scale

    def encode(self, images: np.ndarray, **_: Any) -> np.ndarray:
        return (images.reshape(len(images), -1)[:, : self.feature_dim] * self.scale).astype(np.float32)


class _StubGenerator:
    feature_dim = 0

    def decode(self, features: np.ndarray, **_: Any) -> np.ndarray:
        return np.zeros((len(features), 1, 28, 28), dtype=np.float32)


def _stub_models(d: int = 8, scale: float = 1.0) -> PublicModels:
    return PublicModels(encoder=_StubEncoder(d, scale), generator=_StubGenerator(), feature_dim=d, record={})


def _ctx(**kw: Any) -> RunContext:
    return run_context(**{"deterministic_noise": False, "classes": CLASSES, **kw})


def _mge(monkeypatch: pytest.MonkeyPatch, models: PublicModels, ctx: RunContext | None = None, **over: Any) -> DPMGE:
    cfg = OmegaConf.merge(load_group("method", "dp_mge"), over)
    m = DPMGE(cfg, ctx or _ctx())
    monkeypatch.setattr(m, "public_models", lambda: models)
    return m


def _images(n: int, seed: int = 0, lo: float = 0.0, hi: float = 0.3) -> Split:
    rng = np.random.default_rng(seed)
    x = rng.uniform(lo, hi, size=(n, 1, 28, 28)).astype(np.float32)
    return Split(x, rng.integers(0, 3, size=n))


def test_mge_clips_features_outside_the_unit_ball_and_publishes_no_count(monkeypatch: pytest.MonkeyPatch) -> None:
    """Rows outside the unit ball are clipped, but how many were is a private count: reported nowhere."""
    private = _images(200)
    private.x[:7] = 1.0  # 8 pixels of 1.0 times scale 1: norm sqrt(8) > 1
    import dpsyn.public

    m = _mge(monkeypatch, _stub_models())
    clipped: list[int] = []
    real_clip = dpsyn.public.clip_to_unit_ball

    def spy(v: Any, *a: Any, **k: Any) -> Any:
        out, n = real_clip(v, *a, **k)
        clipped.append(n)
        assert np.all(np.linalg.norm(out.astype(np.float64), axis=1) <= 1.0)
        return out, n

    monkeypatch.setattr(dpsyn.public, "clip_to_unit_ball", spy)
    ledger = PrivacyLedger(target_epsilon=1.0, delta=1e-5)
    m.fit(private, PrivacyBudget(1.0, 1e-5), ledger)
    assert clipped == [7]  # the private features went through the clip ...
    assert not [k for k in vars(m) if "clip" in k]  # ... and its count was not kept
    values, _ = m.report()
    assert not [k for k in values if "clip" in k]
    assert values["mge_sigma_mean"] == pytest.approx(_paper_sigma(0.5, 0.5e-5), rel=1e-12)
    assert [e.kind for e in ledger.events] == ["approx_dp", "approx_dp"]
    assert "treated as public" in ledger.events[0].label
    assert ledger.check_within_budget() == pytest.approx(1.0)
    s = m.sample(30)
    assert s.x.shape == (30, 1, 28, 28) and not [k for k in s.provenance if "clip" in k]


def test_mge_converges_at_large_eps_and_its_noise_is_not_reproducible(monkeypatch: pytest.MonkeyPatch) -> None:
    private = _images(3000)
    feats = _StubEncoder(8, 1.0).encode(private.x).astype(np.float64)
    true_mean, true_var = feats.mean(0), feats.var(0)

    def fit(eps: float, **ctx_kw: Any) -> DPMGE:
        m = _mge(monkeypatch, _stub_models(), _ctx(**ctx_kw), calibration="analytic")
        m.fit(private, PrivacyBudget(eps, 1e-5), PrivacyLedger(target_epsilon=eps, delta=1e-5))
        return m

    big = fit(1e5)
    np.testing.assert_allclose(big.est.mean[0], true_mean, atol=1e-3)
    np.testing.assert_allclose(big.est.var[0], true_var, atol=2e-3)
    exact = fit(math.inf)
    np.testing.assert_allclose(exact.est.mean[0], true_mean, atol=1e-12)
    a, b = fit(1.0), fit(1.0)
    assert not np.array_equal(a.est.mean, b.est.mean), "DP noise was reproducible from the run seed"
    c, d = fit(1.0, deterministic_noise=True), fit(1.0, deterministic_noise=True)
    np.testing.assert_array_equal(c.est.mean, d.est.mean)
    # the noise level is what was calibrated: the error of the mean is about sigma / n per coordinate
    err = np.abs(a.est.mean[0] - true_mean).max()
    assert err < 6 * a.releases["mean"].sigma / 3000


def test_conditional_mge_estimates_per_class_and_releases_dp_counts(monkeypatch: pytest.MonkeyPatch) -> None:
    private = _images(900)
    m = _mge(monkeypatch, _stub_models(), conditional=True, class_counts="dp")
    ledger = PrivacyLedger(target_epsilon=3.0, delta=1e-5)
    m.fit(private, PrivacyBudget(3.0, 1e-5), ledger)
    assert m.est.mean.shape == (3, 8)
    assert [e.kind for e in ledger.events] == ["approx_dp"] * 3 and "released with DP" in ledger.events[0].label
    assert ledger.check_within_budget() <= 3.0
    s = m.sample(60)
    assert sorted(np.bincount(s.y).tolist()) == [20, 20, 20]


# ---------------------------------------------------------------------------------------------------- DP-DRE


def _two_gaussians(seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.normal(1.0, 1.0, size=(3000, 2)), rng.normal(0.0, 1.0, size=(6000, 2))


@pytest.mark.parametrize("eps", [math.inf, 3.0])
def test_density_ratio_recovers_a_known_ratio(eps: float) -> None:
    """private ~ N(+1, I), public ~ N(0, I): log r(x) = x1 + x2 - 1."""
    private, public = _two_gaussians(0)
    batch, epochs = 256, 15
    steps = epochs * math.ceil(len(private) / batch)
    dp = None
    if math.isfinite(eps):
        nm = dpsgd_noise_multiplier(epsilon=eps, delta=1e-5, sample_rate=batch / len(private), steps=steps,
                                    accountant="rdp")
        dp = DPSGDSettings(noise_multiplier=nm, max_grad_norm=1.0, noise_generator=dp_generator(),
                           sampling_generator=dp_generator())
    est = DensityRatioEstimator(2, hidden=32, lr=3e-3, seed=0)
    est.fit(private, public, steps=steps, batch_size=batch, public_batch_size=batch, dp=dp)
    assert est.steps_done == steps
    log_r = est.log_ratio(public)
    true = public.sum(1) - 1.0
    assert np.corrcoef(log_r, true)[0, 1] > (0.95 if dp is None else 0.85)
    w = sampling_weights(log_r)
    reweighted = w @ public  # reweighting N(0, I) by the true ratio gives N(1, I)
    assert np.all(reweighted > 0.6) and np.all(public.mean(0) < 0.1)
    # weights concentrate where the private density is the higher one
    higher = true > 0
    assert w[higher].sum() > 0.65 and higher.mean() < 0.3  # exact ratio: 0.76 vs 0.24


def test_label_helpers_map_names_and_nearest_centroids() -> None:
    mapping = private_label_map(["T-shirt/top", "sandal", "Sneaker", "Bag", "Ankle boot"], CLASSES)
    assert mapping.tolist() == [-1, 0, 1, -1, 2]
    cents = np.array([[1.0, 0], [0.9, 0.1], [0, 1.0]])
    lab, present = centroid_labels(np.array([[0.2, 0.9], [0.8, 0.1]]), cents, np.array([0, 0, 2]), 3)
    assert lab.tolist() == [2, 0] and present == [0, 2]


# ------------------------------------------------------------------------------------------------ end to end


@pytest.mark.parametrize(
    ("method", "extra"),
    [
        ("dp_mge", ()),
        ("dp_dre", ("method.public_pool=3000",)),
        ("public_uniform", ("method.public_pool=3000",)),
        ("icgan_nonprivate", ()),
    ],
)
@pytest.mark.slow  # the run itself is covered by test_all_methods; this adds the metrics on fmnist_shoes
def test_each_method_runs_end_to_end_on_fmnist_shoes(make_cfg, tmp_path: Path, method: str, extra: tuple) -> None:
    from dpsyn.task import run
    from dpsyn.results.io import read_json

    cfg = make_cfg(f"method={method}", "dataset=fmnist_shoes", "eps=1", "dataset.n_private=900", *TINY_PUBLIC, *extra)
    result = run(cfg, tmp_path / "run")
    on_disk = read_json(tmp_path / "run" / "result.json")
    assert on_disk["method"] == method
    metrics = result["metrics"]
    assert 0 < metrics["fd_fmnist"] < math.inf and 0 <= metrics["acc"] <= 1
    samples = np.load(tmp_path / "run" / "samples.npz")
    assert samples["x"].shape == (600, 1, 28, 28) and 0 <= samples["x"].min() and samples["x"].max() <= 1
    assert set(samples["y"].tolist()) <= {0, 1, 2}
    events = result["privacy_events"]
    if method == "public_uniform":
        assert events == [] and result["epsilon_spent"] == 0.0  # no private data used: nothing spent
        assert metrics["public_private_class_mass"] == pytest.approx(0.3, abs=0.03)
    elif method == "icgan_nonprivate":
        assert result["non_private_reference"] is True and [e["kind"] for e in events] == ["non_private"]
    else:
        assert result["non_private_reference"] is False and 0 < result["epsilon_spent"] <= 1.0
    if method == "dp_dre":
        (event,) = events
        # trainer=debug: one epoch, at most 5 steps; an epoch is ceil(900 / 256) = 4 expected batches
        assert event["kind"] == "sampled_gaussian" and event["steps"] == 4
        assert event["sample_rate"] == pytest.approx(256 / 900)
        assert 0 <= metrics["dre_private_class_mass"] <= 1
        assert metrics["dre_private_class_mass_uniform"] == pytest.approx(0.3, abs=0.03)
    if method == "dp_mge":
        # paper 000: (eps/2, delta/2) for each sum, n public
        assert [e["kind"] for e in events] == ["approx_dp"] * 2 and "n treated as public" in events[0]["label"]
        assert [(e["epsilon"], e["delta"]) for e in events] == [(0.5, 0.5e-5)] * 2
        assert metrics["mge_sigma_mean"] == pytest.approx(_paper_sigma(0.5, 0.5e-5), rel=1e-12)
    if method in ("dp_dre", "dp_mge"):  # a private count (no noise): published nowhere
        assert "clip" not in json.dumps({k: result[k] for k in ("metrics", "metric_info", "sample_provenance")})


def test_methods_refuse_bad_choices() -> None:
    # checked at compose time by the schemas (dpsyn.config.schema), before any data is loaded
    from dpsyn.cli.config_check import ConfigError, preflight

    with pytest.raises(ConfigError, match="method.calibration=tight: allowed: classic, analytic"):
        preflight(["method=dp_mge", "dataset=fmnist_all", "method.calibration=tight"])
    with pytest.raises(ConfigError, match="method.other_classes=drop: allowed: nearest, exclude"):
        preflight(["method=dp_dre", "dataset=fmnist_all", "method.other_classes=drop"])


@pytest.mark.filterwarnings("ignore:Full backward hook is firing")
def test_dre_dp_step_clips_every_row_and_public_rows_leave_the_sensitivity_unchanged() -> None:
    """One DP step (noise 0) equals the clipped per-row gradients summed over private and public rows, divided by the
    expected batch; neighbouring private sets (one row removed) move it by at most max_grad_norm / expected batch."""
    from opacus import GradSampleModule
    from opacus.optimizers import DPOptimizer
    from torch.nn import functional as F

    from dpsyn.methods.dp_dre import RatioMLP

    torch.manual_seed(0)
    priv, pub = torch.randn(6, 4) * 3, torch.randn(5, 4) * 3
    clip, expected = 0.1, 4

    def fresh() -> RatioMLP:
        torch.manual_seed(1)
        return RatioMLP(4, 8)

    def update(rows: torch.Tensor) -> torch.Tensor:
        gsm = GradSampleModule(fresh(), loss_reduction="sum")
        params = list(gsm.parameters())
        opt = DPOptimizer(torch.optim.SGD(params, lr=1.0), noise_multiplier=0.0, max_grad_norm=clip,
                          expected_batch_size=expected, loss_reduction="mean")
        batch = torch.cat([rows, pub])
        target = torch.cat([torch.ones(len(rows)), torch.zeros(len(pub))])
        F.binary_cross_entropy_with_logits(gsm(batch), target, reduction="sum").backward()
        before = torch.cat([p.detach().flatten() for p in params]).clone()
        opt.step()
        return before - torch.cat([p.detach().flatten() for p in params])

    ref_net = fresh()
    want = 0
    for x, t in [(r, 1.0) for r in priv] + [(r, 0.0) for r in pub]:
        ref_net.zero_grad()
        F.binary_cross_entropy_with_logits(ref_net(x[None]), torch.tensor([t]), reduction="sum").backward()
        g = torch.cat([p.grad.flatten() for p in ref_net.parameters()])
        assert g.norm() > clip  # the test exercises clipping
        want = want + g * min(1.0, clip / (g.norm().item() + 1e-6))
    got = update(priv)
    torch.testing.assert_close(got, want / expected, rtol=1e-4, atol=1e-7)
    assert (got - update(priv[:-1])).norm().item() <= clip / expected + 1e-6
