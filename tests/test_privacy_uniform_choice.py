"""The per-step bounds of a Gaussian mechanism on one of K units drawn uniformly (dpsyn.privacy.uniform_choice),
checked against independent computations: quadrature of the Renyi divergence of the actual mixtures (random and
adversarial configurations of the units inside the clipping ball, and a worst-case search), Opacus and
dp_accounting for the Poisson pair the argument reduces to, dp_accounting's PLD for the hockey-stick curve, and the
integral representation itself (which, with the Poisson pair's own reverse curve, must give Opacus's RDP exactly)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import integrate, optimize
from scipy.stats import norm

from dpsyn.privacy.uniform_choice import (
    UNIFORM_CHOICE_BOUNDS,
    _hockey_stick_add,
    _log_hockey_stick_remove,
    uniform_choice_epsilon,
    uniform_choice_noise_multiplier,
    uniform_choice_rdp,
)

ORDERS = [1.5, 2.0, 4.0, 8.0, 16.0, 32.0]


def _mixture_pdf(x: np.ndarray, means: np.ndarray, s: float) -> np.ndarray:
    return norm.pdf(x[:, None], loc=means[None, :], scale=s).mean(axis=1)


def _log_mixture_pdf(x: np.ndarray, means: np.ndarray, s: float) -> np.ndarray:
    from scipy.special import logsumexp

    return logsumexp(norm.logpdf(x[:, None], loc=means[None, :], scale=s), axis=1) - math.log(len(means))


def _renyi(p_means: np.ndarray, q_means: np.ndarray, s: float, alpha: float) -> float:
    """D_alpha(P || Q) of two equal-weight 1-D Gaussian mixtures of std s, by quadrature on a fine grid (in logs:
    the integrand spans hundreds of orders of magnitude at large alpha)."""
    from scipy.special import logsumexp

    span = (alpha + 12) * s + alpha * (np.ptp(np.concatenate([p_means, q_means])) + 1)
    x = np.linspace(min(p_means.min(), q_means.min()) - span, max(p_means.max(), q_means.max()) + span, 60_001)
    log_f = alpha * _log_mixture_pdf(x, p_means, s) + (1 - alpha) * _log_mixture_pdf(x, q_means, s)
    return float(logsumexp(log_f) + math.log(x[1] - x[0])) / (alpha - 1)


def _pair(k: int, rho: float, rest: np.ndarray, a: float, b: float) -> tuple[np.ndarray, np.ndarray]:
    """P: the K units' means with the changed unit at ``a``; Q: the same with it at ``b``."""
    return np.concatenate([rest, [a]]), np.concatenate([rest, [b]])


@pytest.mark.parametrize("k", [2, 5, 10])
def test_the_bound_holds_for_every_configuration_of_the_units_in_the_ball(k: int) -> None:
    """Random placements of the K units' outputs in the ball [-rho, rho] (1-D) and the two adversarial ones: the
    Renyi divergence of the actual mixtures, both ways, never exceeds the convexity bound; the remove pair (the other
    units at the far side, the changed one moving from there to the edge) attains Opacus's Poisson RDP."""
    rho, nm = 0.5, 0.8  # Delta = 2 rho = 1, noise std s = nm * Delta
    s = nm * 2 * rho
    bound = uniform_choice_rdp(population=k, noise_multiplier=nm, orders=ORDERS, bound="convexity")
    poisson = uniform_choice_rdp(population=k, noise_multiplier=nm, orders=ORDERS, bound="poisson_argument")
    rng = np.random.default_rng(k)
    configs = [_pair(k, rho, rng.uniform(-rho, rho, k - 1), *rng.uniform(-rho, rho, 2)) for _ in range(3)]
    remove = _pair(k, rho, np.full(k - 1, -rho), rho, -rho)
    add = _pair(k, rho, np.full(k - 1, rho), rho, -rho)
    for j, alpha in enumerate(ORDERS):
        for p, q in [*configs, remove, add]:
            for x, y in ((p, q), (q, p)):
                assert _renyi(x, y, s, alpha) <= bound[j] * (1 + 1e-6), (alpha, x, y)
        assert _renyi(*remove, s, alpha) == pytest.approx(poisson[j], rel=2e-4)  # the remove pair is attained
        assert poisson[j] <= bound[j]


@pytest.mark.slow
def test_a_worst_case_search_stays_under_the_bound() -> None:
    """Maximise D_alpha(P || Q) over the positions of K = 3 units and the changed unit's two positions in the ball
    (Nelder-Mead from several starts): the best found stays under the bound, and close to it (the remove pair)."""
    rho, nm, k, alpha = 0.5, 0.6, 3, 8.0
    s = nm * 2 * rho
    (bound,) = uniform_choice_rdp(population=k, noise_multiplier=nm, orders=[alpha], bound="convexity")

    def neg(v: np.ndarray) -> float:
        v = rho * np.tanh(v)  # inside the ball
        p, q = _pair(k, rho, v[: k - 1], v[k - 1], v[k])
        return -max(_renyi(p, q, s, alpha), _renyi(q, p, s, alpha))

    rng = np.random.default_rng(0)
    best = max(-optimize.minimize(neg, rng.normal(size=k + 1), method="Nelder-Mead",
                                  options={"maxiter": 300, "xatol": 1e-3, "fatol": 1e-9}).fun for _ in range(4))
    assert best <= bound * (1 + 1e-6)
    assert best >= 0.8 * bound


def test_the_integral_representation_gives_opacus_s_rdp_with_the_poisson_pair_s_own_curves() -> None:
    """The proof's identity E_Q[L^alpha] = 1 + alpha(alpha-1)[int e^(-alpha u) H(Q||P) + int e^((alpha-1)u) H(P||Q)]
    evaluated by quadrature with the Poisson remove pair's two curves reproduces Opacus's sampled-Gaussian RDP and
    dp_accounting's (independent implementations); with the remove curve in both places it is what the module
    charges (within its integration slack, and above)."""
    dpa = pytest.importorskip("dp_accounting")
    from dp_accounting.rdp import rdp_privacy_accountant
    from opacus.accountants.analysis.rdp import compute_rdp

    q, nm = 0.05, 1.3
    mu = 1.0 / nm
    log_h = lambda u: float(_log_hockey_stick_remove(np.array([u]), q, mu)[0])  # noqa: E731
    h = lambda u: math.exp(log_h(u))  # noqa: E731
    h_add = lambda u: float(_hockey_stick_add(np.array([u]), q, mu)[0])  # noqa: E731
    pts = [q / 10, q, 10 * q, 0.1, 1.0, 3.0]
    charged = uniform_choice_rdp(population=20, noise_multiplier=nm, orders=ORDERS, bound="convexity")
    for j, alpha in enumerate(ORDERS):
        i2 = integrate.quad(lambda u: math.exp((alpha - 1) * u + log_h(u)), 0, 60, points=pts, limit=500,
                            epsrel=1e-11, epsabs=0)[0]
        i1_add = integrate.quad(lambda u: math.exp(-alpha * u) * h_add(u), 0, 60, points=pts, limit=500,
                                epsrel=1e-11, epsabs=0)[0]
        i1 = integrate.quad(lambda u: math.exp(-alpha * u) * h(u), 0, 60, points=pts, limit=500,
                            epsrel=1e-11, epsabs=0)[0]
        poisson = math.log1p(alpha * (alpha - 1) * (i1_add + i2)) / (alpha - 1)
        acc = rdp_privacy_accountant.RdpAccountant(orders=[alpha])
        acc.compose(dpa.PoissonSampledDpEvent(q, dpa.GaussianDpEvent(nm)), 1)
        assert poisson == pytest.approx(compute_rdp(q=q, noise_multiplier=nm, steps=1, orders=[alpha])[0], rel=1e-6)
        if float(alpha).is_integer():  # at fractional orders dp_accounting's value is an upper bound, not exact
            assert poisson == pytest.approx(float(acc._rdp[0]), rel=1e-6)
        symmetric = math.log1p(alpha * (alpha - 1) * (i1 + i2)) / (alpha - 1)
        assert symmetric * (1 - 1e-9) <= charged[j] <= symmetric * 1.01  # up to float rounding, above


def test_the_one_step_curve_is_under_dp_accounting_s_pld_of_the_poisson_mixture() -> None:
    """The hockey-stick divergence of random configurations, both ways, at several epsilons, is at most the delta of
    dp_accounting's privacy-loss distribution of the Poisson-subsampled Gaussian (the pair the proof bounds by)."""
    pld_mod = pytest.importorskip("dp_accounting.pld.privacy_loss_distribution")
    k, rho, nm = 5, 0.5, 0.7
    s = nm * 2 * rho
    pld = pld_mod.from_gaussian_mechanism(standard_deviation=nm, sensitivity=1.0, sampling_prob=1.0 / k,
                                          value_discretization_interval=1e-4)
    x = np.linspace(-15, 15, 60_001)
    rng = np.random.default_rng(3)
    for _ in range(4):
        p_m, q_m = _pair(k, rho, rng.uniform(-rho, rho, k - 1), *rng.uniform(-rho, rho, 2))
        p, q = _mixture_pdf(x, p_m, s), _mixture_pdf(x, q_m, s)
        for eps in (0.0, 0.1, 0.5, 1.0, 2.0):
            for a, b in ((p, q), (q, p)):
                hs = integrate.trapezoid(np.clip(a - math.exp(eps) * b, 0, None), x)
                assert hs <= pld.get_delta_for_epsilon(eps) + 1e-7


def test_the_bounds_rank_as_their_assumptions_and_calibrate_within_the_target() -> None:
    """poisson_argument <= convexity <= wang2019 in epsilon at GS-WGAN's settings (dpsyn's eps=1 default: K 100,
    noise multiplier 4.53, 12,000 steps); one unit of one (K = 1) is the Gaussian mechanism; the calibration never
    returns a noise over the target, and is tight."""
    nm = 25.63 / (2 * math.sqrt(8))
    eps = {b: uniform_choice_epsilon(population=100, noise_multiplier=nm, steps=12_000, delta=1e-5, bound=b)
           for b in UNIFORM_CHOICE_BOUNDS}
    assert eps["poisson_argument"] == pytest.approx(0.9936, abs=1e-3)
    assert eps["convexity"] == pytest.approx(1.080, abs=2e-3)
    assert eps["wang2019"] == pytest.approx(2.130, abs=2e-3)
    assert eps["poisson_argument"] < eps["convexity"] < eps["wang2019"]
    one = uniform_choice_rdp(population=1, noise_multiplier=2.0, orders=ORDERS)
    np.testing.assert_allclose(one, np.asarray(ORDERS) / (2 * 4.0))
    for bound in UNIFORM_CHOICE_BOUNDS:
        found = uniform_choice_noise_multiplier(epsilon=1.0, delta=1e-5, population=100, steps=12_000, bound=bound)
        got = uniform_choice_epsilon(population=100, noise_multiplier=found, steps=12_000, delta=1e-5, bound=bound)
        assert 0.99 < got <= 1.0
    with pytest.raises(ValueError, match="bound"):
        uniform_choice_rdp(population=3, noise_multiplier=1.0, orders=ORDERS, bound="poisson")


def test_each_event_states_its_sampling_and_refuses_another() -> None:
    """A DP-SGD event must state its sampling (no default), and only Poisson is accounted for: GS-WGAN's uniform
    one-of-K draw is refused there, and a uniform-choice event refuses Poisson. privacy.json names the relation and
    every event's sampling and relation."""
    from dpsyn.privacy import PrivacyLedger
    from dpsyn.privacy.ledger import GaussianEvent, PrivacyEvent, SampledGaussianEvent, UniformChoiceGaussianEvent

    with pytest.raises(TypeError, match="sampling"):
        SampledGaussianEvent(noise_multiplier=1.0, sample_rate=0.01, steps=1, accountant="rdp")  # type: ignore[call-arg]
    with pytest.raises(ValueError, match="not accounted for"):
        SampledGaussianEvent(noise_multiplier=1.0, sample_rate=0.01, steps=1, accountant="rdp",
                             sampling="uniform_one_of_k")
    with pytest.raises(ValueError, match="uniform_one_of_k"):
        UniformChoiceGaussianEvent(noise_multiplier=1.0, population=10, steps=1, sampling="poisson")
    ledger = PrivacyLedger(target_epsilon=5.0, delta=1e-5)
    ledger.add(UniformChoiceGaussianEvent(noise_multiplier=1.0, population=10, steps=3))
    ledger.add(SampledGaussianEvent(noise_multiplier=1.0, sample_rate=0.01, steps=3, accountant="rdp",
                                    sampling="poisson"))
    ledger.add(GaussianEvent(noise_multiplier=3.0))
    out = ledger.to_dict()
    assert out["adjacency"].startswith("add/remove one private row")
    assert [e["sampling"] for e in out["events"]] == ["uniform_one_of_k", "poisson", "none"]
    assert all(e["relation"].startswith("add/remove one row") for e in out["events"])
    again = PrivacyLedger.from_dict(out)
    assert again.epsilon() == ledger.epsilon()
    assert [PrivacyEvent.from_dict(e).to_dict() for e in out["events"]] == out["events"]
