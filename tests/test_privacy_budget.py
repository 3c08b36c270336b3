"""One split_budget and one calibration path (dpsyn.privacy.budget) for dp_mge, dp_mepf, PE and gs_wgan.

Each method's sigmas are compared with the formulas it used at 83123e5 (copied below as ``_old_*``).
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from dpsyn.privacy import (
    ApproxDPEvent,
    GaussianEvent,
    PrivacyLedger,
    calibrate_releases,
    dpsgd_noise_multiplier,
    gaussian_sigma,
    gdp_noise_multiplier,
    replace_one_noise_std,
    split_budget,
)

BUDGETS = [(0.1, 1e-5), (1.0, 1e-5), (2.594, 1e-6), (10.0, 1 / 60000), (0.67, 3e-7)]


def _old_dp_mge(*, epsilon, delta, calibration, mean_share=0.5, count_share=0.0):
    """dp_mge.plan_releases at 83123e5: {name: (sigma, share, eps_k, delta_k)}."""
    rest = 1.0 - float(count_share)
    shares = {"mean": rest * float(mean_share), "second_moment": rest * (1.0 - float(mean_share))}
    if count_share > 0:
        shares["counts"] = float(count_share)
    if calibration == "analytic":
        sigma = gaussian_sigma(epsilon=epsilon, delta=delta, sensitivity=1.0, calibration="analytic")
        return {k: (sigma / math.sqrt(f), f, None, None) for k, f in shares.items()}
    deltas = {k: f * delta for k, f in shares.items()}
    while math.fsum(deltas.values()) > delta:
        deltas = {k: math.nextafter(d, 0.0) for k, d in deltas.items()}
    return {k: (gaussian_sigma(epsilon=f * epsilon, delta=deltas[k], sensitivity=1.0, calibration="classic"), f,
                f * epsilon, deltas[k]) for k, f in shares.items()}


def _old_dp_mepf(*, epsilon, delta, fractions, calibration):
    """dp_mepf.split_budget + its per-share gaussian_sigma at 83123e5: {name: (sigma, eps_k, delta_k)}."""
    eps = {k: epsilon * float(f) for k, f in fractions.items()}
    dlt = {k: delta * float(f) for k, f in fractions.items()}
    for shares, limit in ((eps, epsilon), (dlt, delta)):
        while math.fsum(shares.values()) > limit:
            k = max(shares, key=shares.__getitem__)
            shares[k] = math.nextafter(shares[k], 0.0)
    return {k: (gaussian_sigma(epsilon=eps[k], delta=dlt[k], sensitivity=1.0, calibration=calibration), eps[k], dlt[k])
            for k in fractions}


@pytest.mark.parametrize(("epsilon", "delta"), BUDGETS)
@pytest.mark.parametrize("calibration", ["classic", "analytic"])
@pytest.mark.parametrize("count_share", [0.0, 0.05])
def test_dp_mge_sigmas_unchanged(epsilon, delta, calibration, count_share):
    from dpsyn.methods.dp_mge import plan_releases

    new = plan_releases(epsilon=epsilon, delta=delta, calibration=calibration, count_share=count_share)
    old = _old_dp_mge(epsilon=epsilon, delta=delta, calibration=calibration, count_share=count_share)
    assert list(new) == list(old)
    for k, (sigma, share, eps_k, delta_k) in old.items():
        r = new[k]
        assert (r.sigma, r.share, r.epsilon, r.delta, r.calibration) == (sigma, share, eps_k, delta_k, calibration)


@pytest.mark.parametrize(("epsilon", "delta"), BUDGETS)
@pytest.mark.parametrize("calibration", ["classic", "analytic"])
@pytest.mark.parametrize("fractions", [{"m1": 0.45, "m2": 0.45, "counts": 0.1}, {"m1": 1.0}, {"m1": 0.3, "m2": 0.7}])
def test_dp_mepf_sigmas_unchanged(epsilon, delta, calibration, fractions):
    plan = calibrate_releases(epsilon=epsilon, delta=delta, fractions=fractions, calibration=calibration)
    old = _old_dp_mepf(epsilon=epsilon, delta=delta, fractions=fractions, calibration=calibration)
    assert {k: (r.sigma, r.epsilon, r.delta) for k, r in plan.items()} == old


@pytest.mark.parametrize(("epsilon", "delta"), BUDGETS[:3])
def test_gs_wgan_sigma_is_twice_sqrt_b_times_the_per_iteration_noise_multiplier(epsilon, delta):
    """One step an iteration (its b = 4 releases share the critic drawn: sensitivity 2C sqrt(4)), one of 10 critics
    drawn uniformly, under the default (convexity) bound and the others."""
    from dpsyn.methods.gs_wgan import SENSITIVITY_FACTOR, gs_wgan_sigma
    from dpsyn.privacy.uniform_choice import UNIFORM_CHOICE_BOUNDS, uniform_choice_noise_multiplier

    for bound in UNIFORM_CHOICE_BOUNDS:
        nm = uniform_choice_noise_multiplier(epsilon=epsilon, delta=delta, population=10, steps=3, bound=bound)
        assert gs_wgan_sigma(epsilon=epsilon, delta=delta, critics=10, iterations=3, batch_size=4, bound=bound) \
            == pytest.approx(2.0 * 2.0 * nm) == replace_one_noise_std(nm) * 2.0
    assert SENSITIVITY_FACTOR == 2.0
    with pytest.raises(ValueError, match="noise_multiplier"):
        replace_one_noise_std(0.0)


@pytest.mark.parametrize(("epsilon", "delta"), BUDGETS)
def test_pe_noise_multiplier_unchanged_and_overspending_refused(epsilon, delta):
    from dpsyn.methods.pe.method import pe_noise_multiplier

    nm = pe_noise_multiplier(epsilon=epsilon, delta=delta, releases=7, noise_multiplier=None)
    assert nm == gdp_noise_multiplier(epsilon=epsilon, steps=7, delta=delta)
    assert pe_noise_multiplier(epsilon=epsilon, delta=delta, releases=7, noise_multiplier=nm) == nm  # at the limit
    with pytest.raises(ValueError, match="spends eps="):
        pe_noise_multiplier(epsilon=epsilon, delta=delta, releases=7, noise_multiplier=nm * 0.99)


def test_split_budget_stays_within_the_totals():
    rng = np.random.default_rng(0)
    for _ in range(300):
        k = int(rng.integers(1, 6))
        f = rng.dirichlet(np.ones(k))
        f[-1] = 1.0 - math.fsum(f[:-1])
        if f[-1] <= 0:
            continue
        fractions = {f"r{i}": float(x) for i, x in enumerate(f)}
        eps, delta = float(rng.uniform(0.01, 20)), float(10 ** rng.uniform(-9, -3))
        shares = split_budget(epsilon=eps, delta=delta, fractions=fractions)
        assert math.fsum(e for e, _ in shares.values()) <= eps
        assert math.fsum(d for _, d in shares.values()) <= delta
        ledger = PrivacyLedger(target_epsilon=eps, delta=delta,
                               events=[ApproxDPEvent(epsilon=e, delta=d) for e, d in shares.values()])
        assert ledger.epsilon() <= eps


@pytest.mark.parametrize(("epsilon", "delta"), BUDGETS)
def test_gdp_composition_spends_the_budget_exactly(epsilon, delta):
    plan = calibrate_releases(epsilon=epsilon, delta=delta, fractions={"a": 0.2, "b": 0.5, "c": 0.3},
                              calibration="analytic", composition="gdp")
    ledger = PrivacyLedger(target_epsilon=epsilon, delta=delta,
                           events=[GaussianEvent(noise_multiplier=r.sigma) for r in plan.values()])
    assert ledger.epsilon() == pytest.approx(epsilon, rel=1e-9)
    assert not ledger.would_exceed(GaussianEvent(noise_multiplier=1e12))


def test_refusals():
    with pytest.raises(ValueError, match="sum to 1"):
        split_budget(epsilon=1.0, delta=1e-5, fractions={"m1": 0.5, "m2": 0.4})
    with pytest.raises(ValueError, match="method.budget_split: every release"):
        split_budget(epsilon=1.0, delta=1e-5, fractions={"m1": 1.0, "m2": 0.0}, what="method.budget_split")
    with pytest.raises(ValueError, match="calibration='analytic'"):
        calibrate_releases(epsilon=1.0, delta=1e-5, fractions={"a": 1.0}, calibration="classic", composition="gdp")
    with pytest.raises(ValueError, match="composition"):
        calibrate_releases(epsilon=1.0, delta=1e-5, fractions={"a": 1.0}, composition="rdp")
    with pytest.raises(ValueError, match="calibration"):
        calibrate_releases(epsilon=1.0, delta=1e-5, fractions={"a": 1.0}, calibration="exact")
