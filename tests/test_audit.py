"""The empirical privacy audit (dpsyn.privacy.audit, dpsyn.cli.audit) and the Poisson sampling it leaves to tests.

The audit must be sound (a correct mechanism is never reported above its claim, beyond the stated confidence) and
have power: every Gaussian-noise mechanism, replaced by a test double with half the noise, must be caught. The
doubles wrap the very functions the audit (and the methods) call, so nothing in production code is switched.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from scipy.stats import binomtest

from dpsyn.paths import REPO_DIR
from dpsyn.privacy.audit import audit_scores, clopper_pearson_upper, epsilon_from_rates
from dpsyn.privacy.audit.mechanisms import MECHANISMS
from dpsyn.privacy.audit.runner import format_table, run_audit, select_mechanisms

# --------------------------------------------------------------------------------------------------------------
# the statistics


@pytest.mark.parametrize("k,n", [(0, 10), (3, 10), (10, 10), (17, 100_000), (99_000, 100_000)])
def test_clopper_pearson_matches_scipy_exact_interval(k: int, n: int) -> None:
    """One-sided (1 - alpha) upper bound = the upper end of scipy's two-sided exact (1 - 2 alpha) interval."""
    alpha = 0.01
    ours = clopper_pearson_upper(k, n, alpha=alpha)
    ref = binomtest(k, n).proportion_ci(confidence_level=1 - 2 * alpha, method="exact").high
    assert ours == pytest.approx(ref, rel=1e-9, abs=1e-12)


def test_epsilon_from_rates_is_the_dp_inequality() -> None:
    assert epsilon_from_rates(0.1, 0.5, delta=0.0) == pytest.approx(math.log(5.0))
    assert epsilon_from_rates(0.5, 0.1, delta=0.0) == pytest.approx(math.log(5.0))  # the complementary test
    assert epsilon_from_rates(0.5, 0.5, delta=0.0) == 0.0  # a coin flip proves nothing
    assert epsilon_from_rates(0.0, 0.5, delta=0.0) == math.inf


def test_audit_of_exact_laplace_scores_stays_below_and_near_the_true_epsilon() -> None:
    """Laplace(1/eps) shifted by 1 is exactly eps-DP and every tail test is tight: the bound must approach eps from
    below (over seeds: never above)."""
    eps = 1.0
    lows = []
    for seed in range(10):
        rng = np.random.default_rng(seed)
        s0, s1 = rng.laplace(0, 1 / eps, 200_000), 1 + rng.laplace(0, 1 / eps, 200_000)
        lows.append(audit_scores(s0, s1, delta=0.0, alpha=0.005, rng=rng).eps_lower)
    assert max(lows) <= eps and min(lows) > 0.8, lows


def test_audit_picks_the_arm_with_the_signal() -> None:
    rng = np.random.default_rng(0)
    s0 = rng.normal(0, 1, (3, 20_000))
    s1 = rng.normal(0, 1, (3, 20_000))
    s1[2] += 2.0  # only arm 2 differs between the two sides
    res = audit_scores(s0, s1, delta=1e-5, alpha=0.005, rng=rng)
    assert res.arm == 2 and res.eps_lower > 1.0


def test_audit_scores_refuses_bad_input() -> None:
    rng = np.random.default_rng(0)
    with pytest.raises(ValueError, match="at least 4"):
        audit_scores(np.zeros(3), np.zeros(3), delta=1e-5, alpha=0.01, rng=rng)
    with pytest.raises(ValueError, match="finite"):
        audit_scores(np.array([0, 1, 2, np.nan, 4.0]), np.zeros(5), delta=1e-5, alpha=0.01, rng=rng)
    with pytest.raises(ValueError, match="arms"):
        audit_scores(np.zeros((2, 10)), np.zeros((3, 10)), delta=1e-5, alpha=0.01, rng=rng)


# --------------------------------------------------------------------------------------------------------------
# the mechanisms: sound on main, caught at half the noise

FAST_TRIALS = 200_000


def test_every_mechanism_is_within_its_claim(tmp_path: Path) -> None:
    """Every mechanism as the methods call it, at a small trial count (reproducible noise): no lower bound above
    the ledger's claim, and every bound positive (each test sees the canary)."""
    rows = run_audit(select_mechanisms("all"), eps=1.0, delta=1e-5, trials=FAST_TRIALS, deterministic=True, seed=3)
    assert [r["mechanism"] for r in rows] == list(MECHANISMS)
    for r in rows:
        assert {"mechanism", "eps_claimed", "delta", "eps_lower", "trials"} <= set(r)
        assert 0.9 < r["eps_claimed"] <= 1.0 + 1e-9, r  # each calibrated to eps=1 for one release
        assert 0.0 < r["eps_lower"] <= r["eps_claimed"] and r["passed"], r
    assert "dpsgd_step" in format_table(rows, confidence=0.95)


def _halve(monkeypatch: pytest.MonkeyPatch, module: object, name: str, **scale: float) -> None:
    """Replace ``module.name`` by a test double that calls it with the keyword arguments in ``scale`` multiplied."""
    original = getattr(module, name)

    def double(*args, **kwargs):
        for key, factor in scale.items():
            if kwargs.get(key) is not None:
                kwargs[key] = kwargs[key] * factor
        return original(*args, **kwargs)

    monkeypatch.setattr(module, name, double)


def _half_noise_doubles() -> dict[str, tuple]:
    import dpsyn.lit.dpsgd as dpsgd
    import dpsyn.methods.dp_mge as dp_mge
    import dpsyn.methods.g_pate as g_pate
    import dpsyn.methods.gs_wgan as gs_wgan
    import dpsyn.methods.pe.histogram as pe_histogram
    import dpsyn.privacy.noisy_max as noisy_max
    import dpsyn.trial as trial
    import dpsyn.privacy as privacy

    return {
        "dpsgd_step": (dpsgd, "dp_optimizer", {"noise_multiplier": 0.5}),
        "dpsgd_empty_batch": (dpsgd, "dp_optimizer", {"noise_multiplier": 0.5}),
        "dpsgd_split_step": (dpsgd, "dp_optimizer", {"noise_multiplier": 0.5}),
        "dp_mge_classic": (dp_mge, "dp_moments", {"sigma_mean": 0.5, "sigma_second": 0.5}),
        "dp_mge_analytic": (dp_mge, "dp_moments", {"sigma_mean": 0.5, "sigma_second": 0.5}),
        "pe_histogram": (pe_histogram, "dp_nn_histogram", {"noise_multiplier": 0.5}),
        "gnmax_threshold": (privacy, "confident_gnmax", {"sigma_threshold": 0.5, "sigma": 0.5}),
        "gnmax_argmax": (privacy, "confident_gnmax", {"sigma_threshold": 0.5, "sigma": 0.5}),
        "g_pate_dpgradagg": (g_pate, "dp_grad_agg", {"sigma_threshold": 0.5, "sigma": 0.5}),
        "gs_wgan_sanitize": (gs_wgan, "sanitize", {"sigma": 0.5}),
        "gs_wgan_sanitize_band": (gs_wgan, "sanitize", {"sigma": 0.5}),
        "gs_wgan_iteration": (gs_wgan, "sanitize", {"sigma": 0.5}),
        "gs_wgan_hidden_state": (gs_wgan, "sanitize", {"sigma": 0.5}),
        "laplace_class_counts": (privacy, "dp_class_counts", {"epsilon": 2.0}),  # half the Laplace scale
        "private_tuning_score": (trial, "noised_count", {"noise_multiplier": 0.5}),
        "noisy_max_selection": (noisy_max, "laplace_scale", {"epsilon": 2.0}),  # half the Laplace scale
    }


def test_dp_mepf_double_halves_the_positional_sigma(monkeypatch: pytest.MonkeyPatch) -> None:
    """release_means takes sigma positionally: its double is written out (caught like the others)."""
    import dpsyn.methods.dp_mepf as dp_mepf

    original = dp_mepf.release_means
    monkeypatch.setattr(dp_mepf, "release_means", lambda s, c, sigma, rng: original(s, c, sigma / 2, rng))
    (row,) = run_audit(["dp_mepf"], eps=1.0, delta=1e-5, trials=8_000_000, deterministic=True, seed=1)
    assert row["eps_lower"] > row["eps_claimed"] and not row["passed"], row


# trials per double (the mechanisms whose outputs are bits split theirs over 8 vote distances), enough that the
# double is caught on every seed tried (1-4), not only the one pinned here; measured margins (lower / claimed) in
# the closing note of issue 15. dpsgd_step (the slowest: 3 Opacus steps per 512 trials) at 1M: its three rows
# caught on seeds 1-8, lower / claimed >= 1.15 (seed 1, the one pinned: 1.54, 1.36, 1.15; 2M gave >= 1.26 on 1-4)
DOUBLE_TRIALS = {"gs_wgan_sanitize": 2_000_000, "gs_wgan_sanitize_band": 2_000_000, "gs_wgan_iteration": 1_000_000,
                 "laplace_class_counts": 2_000_000, "dpsgd_step": 1_000_000,
                 "g_pate_dpgradagg": 2_000_000, "gnmax_threshold": 4_000_000, "gnmax_argmax": 4_000_000}


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if n in ("g_pate_dpgradagg", "pe_histogram",
                                                                                     "dp_mge_classic") else n
                                  for n in _half_noise_doubles()
                                  if n not in ("dpsgd_empty_batch", "dpsgd_split_step")])
def test_half_noise_double_is_caught(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each Gaussian-noise mechanism (and the Laplace release) with half its noise: reported above its claim.

    dp_mge's default classic calibration (paper 000's sigma per release, basic composition of the two) is loose by
    about 2x: with half the noise its true epsilon is only about 1.1 against the claimed 1, too close to be shown
    with this many trials, so its double removes 3/4 of the noise. The same function at the analytic calibration
    (dp_mge_analytic) is caught at half the noise.
    """
    module, attr, scale = _half_noise_doubles()[name]
    if name == "dp_mge_classic":
        scale = {k: 0.25 for k in scale}
    _halve(monkeypatch, module, attr, **scale)
    # the DP-SGD rows share their steps (one run_audit call for all three)
    names = ["dpsgd_step", "dpsgd_empty_batch", "dpsgd_split_step"] if name == "dpsgd_step" else [name]
    rows = run_audit(names, eps=1.0, delta=1e-5, trials=DOUBLE_TRIALS.get(name, 1_000_000), deterministic=True,
                     seed=1)
    for row in rows:
        assert row["eps_lower"] > row["eps_claimed"] and not row["passed"], row


def test_gs_wgan_per_release_charge_is_caught_by_the_iteration_row(monkeypatch: pytest.MonkeyPatch) -> None:
    """The GS-WGAN authors' analysis as a test double: sigma calibrated for, and the ledger charged with,
    iterations x b releases each subsampled on its own (noise multiplier sigma / 2). The b releases of an iteration
    share one critic draw, so the iteration row's lower bound exceeds that claim (2.5-2.9x on seeds 1-4 at 200k
    trials), while dpsyn's charge (one step an iteration, noise multiplier sigma / (2 sqrt(b))) holds."""
    import dpsyn.methods.gs_wgan as gs_wgan
    from dpsyn.privacy import SampledGaussianEvent, dpsgd_noise_multiplier

    (row,) = run_audit(["gs_wgan_iteration"], eps=1.0, delta=1e-5, trials=FAST_TRIALS, deterministic=True, seed=1)
    assert 0 < row["eps_lower"] <= row["eps_claimed"] <= 1.0 and row["passed"], row

    def sigma_per_release(*, epsilon, delta, critics, iterations, batch_size, bound="convexity"):
        return 2.0 * dpsgd_noise_multiplier(epsilon=epsilon, delta=delta, sample_rate=1.0 / critics,
                                            steps=iterations * batch_size, accountant="rdp")

    def event_per_release(*, sigma, critics, batch_size, iterations, bound, label):
        return SampledGaussianEvent(sampling="poisson", noise_multiplier=sigma / 2.0, sample_rate=1.0 / critics,
                                    steps=iterations * batch_size, accountant="rdp", label=label)

    monkeypatch.setattr(gs_wgan, "gs_wgan_sigma", sigma_per_release)
    monkeypatch.setattr(gs_wgan, "privacy_event", event_per_release)
    (row,) = run_audit(["gs_wgan_iteration"], eps=1.0, delta=1e-5, trials=FAST_TRIALS, deterministic=True, seed=1)
    assert 0.9 < row["eps_claimed"] <= 1.0 and row["eps_lower"] > 2.0 * row["eps_claimed"] and not row["passed"], row


def test_the_hidden_state_row_catches_a_per_step_charge_when_critics_depend_on_the_draws() -> None:
    """The multi-iteration row's machinery, at the review's toy (10 critics, noise multiplier 0.5, 30 iterations; the
    unchanged critics' output depends on whether the canary's critic trained at the previous iteration): under the
    authors' schedule (the critic drawn trains) the secret draws leak through that state, and the lower bound exceeds
    the tightest per-step charge that ignores it, the privacy-loss distribution of the Poisson pair composed 30 times
    (dp_accounting, eps 2 at its delta 0.283; measured 2.32); under dpsyn's round-robin schedule the state is public
    and the bound stays under it (1.63). The row as registered (GS-WGAN-like critics whose state is their own
    training, 3 critics, 10 iterations, the ledger's charge) passes: tests above."""
    import torch

    from dpsyn.privacy.audit import audit_scores
    from dpsyn.privacy.audit.mechanisms import hidden_state_log_likelihood, hidden_state_releases

    pld_mod = pytest.importorskip("dp_accounting.pld.privacy_loss_distribution")
    K, T, nm = 10, 30, 0.5
    delta = pld_mod.from_gaussian_mechanism(standard_deviation=nm, sensitivity=1.0, sampling_prob=1 / K,
                                            value_discretization_interval=1e-3).self_compose(T).get_delta_for_epsilon(2.0)
    lower = {}
    for schedule in ("drawn", "round_robin"):
        gen, scores = torch.Generator().manual_seed(5), []
        kw = dict(critics=K, sigma=2 * nm, schedule=schedule, dynamics="changed")
        for side in (0, 1):
            y = hidden_state_releases(iterations=T, side=side, trials=50_000, generator=gen, **kw)
            scores.append(hidden_state_log_likelihood(y, side=1, **kw) - hidden_state_log_likelihood(y, side=0, **kw))
        lower[schedule] = audit_scores(scores[0], scores[1], delta=delta, alpha=0.025,
                                       rng=np.random.default_rng(0)).eps_lower
    assert lower["drawn"] > 2.1 and lower["round_robin"] < 2.0, lower


def test_every_noise_mechanism_has_a_double() -> None:
    """A new audited mechanism must come with its half-noise test double."""
    assert set(_half_noise_doubles()) | {"dp_mepf"} == set(MECHANISMS)


def test_select_mechanisms_names_the_allowed_ones() -> None:
    assert select_mechanisms("gs_wgan_sanitize") == ["gs_wgan_sanitize"]
    with pytest.raises(ValueError, match="allowed: all, dpsgd_step"):
        select_mechanisms(["dpsgd_stepp"])


def _cli(args: list[str], tmp_path: Path, prelude: str = "") -> subprocess.CompletedProcess:
    code = f"import sys\n{prelude}\nfrom dpsyn.cli.audit import main\nsys.argv = ['audit', *{args!r}]\nmain()\n"
    env = {**os.environ, "DPSYN_OUTPUT_DIR": str(tmp_path / "outputs"), "PYTHONPATH": str(REPO_DIR)}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=600)


def test_cli_exits_1_and_names_the_mechanism_over_its_claim(tmp_path: Path) -> None:
    """The command line on a broken mechanism (the sanitizer with half its noise): table, audit.json, exit 1."""
    prelude = ("import dpsyn.methods.gs_wgan as g\n_s = g.sanitize\n"
               "g.sanitize = lambda grad, *, clip, sigma, generator: _s(grad, clip=clip, sigma=sigma / 2, "
               "generator=generator)")
    out = _cli(["mechanisms=[gs_wgan_sanitize,laplace_class_counts]", "trials=200000", "deterministic=true"],
               tmp_path, prelude)
    assert out.returncode == 1, out.stderr[-2000:]
    assert "audit FAILED" in out.stderr and "gs_wgan_sanitize" in out.stderr.split("audit FAILED")[1]
    assert "laplace_class_counts" in out.stdout and "FAIL" in out.stdout
    (audit_json,) = (tmp_path / "outputs" / "audit").glob("*/audit.json")
    rows = {r["mechanism"]: r for r in json.loads(audit_json.read_text())["rows"]}
    assert not rows["gs_wgan_sanitize"]["passed"] and rows["laplace_class_counts"]["passed"]


def test_cli_refuses_an_unknown_mechanism_in_one_line(tmp_path: Path) -> None:
    out = _cli(["mechanisms=dpsgd"], tmp_path)
    assert out.returncode == 2
    assert out.stderr.strip().splitlines()[-1].startswith("dpsyn: config error: mechanisms=dpsgd: unknown")


@pytest.mark.slow
def test_default_audit_passes_and_is_tight_for_the_gaussian_mechanisms(tmp_path: Path) -> None:
    """``python -m dpsyn.cli.audit`` with its defaults (4M trials): exit 0, and the DP-SGD step and the Gaussian
    releases reach at least half of their claim (a tight audit). Reproducible noise so that a rerun is the same."""
    out = _cli(["deterministic=true"], tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    (audit_json,) = (tmp_path / "outputs" / "audit").glob("*/audit.json")
    rows = {r["mechanism"]: r for r in json.loads(audit_json.read_text())["rows"]}
    assert set(rows) == set(MECHANISMS)
    for name in ("dpsgd_step", "dpsgd_empty_batch", "dpsgd_split_step", "dp_mge_analytic", "pe_histogram",
                 "gs_wgan_sanitize", "gs_wgan_sanitize_band"):
        assert rows[name]["eps_lower"] >= 0.5 * rows[name]["eps_claimed"], rows[name]


# --------------------------------------------------------------------------------------------------------------
# Poisson sampling, tested apart from the releases (the audit runs them at sampling rate 1)


def _check_poisson(masks: np.ndarray, q: float) -> None:
    """``masks`` (steps, n) bool: each row in each step independently with probability q."""
    steps, n = masks.shape
    sizes = masks.sum(1)
    # batch sizes ~ Binomial(n, q): mean and variance
    assert abs(sizes.mean() - n * q) < 5 * math.sqrt(n * q * (1 - q) / steps)
    assert 0.8 < sizes.var(ddof=1) / (n * q * (1 - q)) < 1.25
    # every row kept at rate q (Bonferroni over rows at 1e-3 overall)
    per_row = masks.sum(0)
    p = [binomtest(int(k), steps, q).pvalue for k in per_row]
    assert min(p) > 1e-3 / n
    # no dependence between rows: inclusion of row i and row i+1 uncorrelated
    a, b = masks[:, :-1].astype(float).ravel(), masks[:, 1:].astype(float).ravel()
    assert abs(np.corrcoef(a, b)[0, 1]) < 5 / math.sqrt(len(a))
    assert sizes.min() == 0 or q * n > 10  # empty batches happen at small expected sizes (they are not skipped)


def test_dp_dre_poisson_mask_is_poisson() -> None:
    from dpsyn.lit.dpsgd import poisson_mask
    from dpsyn.privacy import dp_generator

    gen = dp_generator(deterministic=True, seed=5)
    masks = np.stack([poisson_mask(200, sample_rate=0.02, generator=gen).numpy() for _ in range(4000)])
    _check_poisson(masks, 0.02)


def test_dp_gan_loader_is_poisson() -> None:
    """dp_gan's private loader (private_discriminator_loader: Opacus's DPDataLoader) at rate batch / n."""
    from types import SimpleNamespace

    from torch.utils.data import TensorDataset

    from dpsyn.lit.dpsgd import private_discriminator_loader
    from dpsyn.methods.base import PrivacyBudget

    n, batch = 200, 4
    data = TensorDataset(torch.arange(n), torch.zeros(n, dtype=torch.long))
    ctx = SimpleNamespace(deterministic_noise=True, seed=11, accountant="rdp")
    _, loader, dp = private_discriminator_loader(
        torch.nn.Linear(1, 1), data, batch=batch, epochs=1, limit_train_batches=None,
        budget=PrivacyBudget(epsilon=1.0, delta=1e-5), ctx=ctx, max_grad_norm=1.0, grad_sample_mode="hooks",
        name="test")
    assert dp is not None
    masks = []
    while len(masks) < 4000:
        for x, _ in loader:
            m = np.zeros(n, dtype=bool)
            m[x.numpy()] = True
            masks.append(m)
    _check_poisson(np.stack(masks[:4000]), batch / n)
