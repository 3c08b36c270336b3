"""Privacy math: pinned numbers, cross-checks against the independent dp_accounting library, and input validation.

dp_accounting (Google) is an implementation independent of Opacus and of dpsyn: its RDP accountant, its PLD
(privacy loss distribution) accountant and its analytic-Gaussian helpers are what dpsyn's numbers are checked against.
"""

from __future__ import annotations

import itertools
import logging
import math
import warnings

import numpy as np
import pytest

dpa = pytest.importorskip("dp_accounting")
from dp_accounting.pld import pld_privacy_accountant  # noqa: E402
from dp_accounting.rdp import rdp_privacy_accountant  # noqa: E402

from dpsyn.privacy import (  # noqa: E402
    ACCOUNTANTS,
    dpsgd_epsilon,
    dpsgd_noise_multiplier,
    gaussian_rdp,
    gaussian_sigma,
    gdp_delta,
    gdp_epsilon,
    gdp_epsilon_from_mu,
    gdp_mu,
    gdp_noise_multiplier,
)
from dpsyn.privacy.dpsgd import rdp_orders  # noqa: E402

SQRT2 = math.sqrt(2.0)


@pytest.fixture(autouse=True)
def _quiet_dp_accounting():
    """dp_accounting logs a warning per RDP order it cannot evaluate; keep the test output readable."""
    logging.disable(logging.WARNING)
    yield
    logging.disable(logging.NOTSET)


def pld_epsilon(event: dpa.DpEvent, count: int, delta: float, interval: float = 1e-3) -> float:
    """Epsilon of ``count`` compositions of ``event`` by dp_accounting's (pessimistic) PLD accountant."""
    acc = pld_privacy_accountant.PLDAccountant(value_discretization_interval=interval)
    acc.compose(event, count)
    return acc.get_epsilon(delta)


# ---------------------------------------------------------------------------------------------------------------------
# Gaussian mechanism calibration
# ---------------------------------------------------------------------------------------------------------------------


def test_classic_sigma_pinned_to_hand_computed_value():
    # eps = 1, delta = 1e-5: log(1/delta) = 11.512925465; 2 log(1/delta) = 23.02585093;
    # sqrt(23.02585093 + 2) = 5.002584426; sqrt(23.02585093) = 4.798525910;
    # sigma = (5.002584426 + 4.798525910) / 2 = 4.900555168
    assert gaussian_sigma(epsilon=1.0, delta=1e-5) == pytest.approx(4.900555168, abs=1e-8)
    # eps = 0.5, delta = 1e-3, sensitivity 2: log(1/delta) = 6.907755279; 2 log = 13.81551056;
    # sqrt(14.81551056) = 3.849092174; sqrt(13.81551056) = 3.716922189; (7.566014363)/(1.0) * 2 = 15.13202873
    assert gaussian_sigma(epsilon=0.5, delta=1e-3, sensitivity=2.0, calibration="classic") == pytest.approx(
        15.13202873, abs=1e-7
    )


@pytest.mark.parametrize(
    ("epsilon", "delta"),
    [(0.1, 1e-5), (0.5, 1e-6), (1.0, 1e-5), (3.0, 1e-5), (10.0, 1e-5), (1.0, 1e-9)],
)
def test_analytic_sigma_matches_dp_accounting_pld(epsilon, delta):
    sigma = gaussian_sigma(epsilon=epsilon, delta=delta, calibration="analytic")
    # (d) independent PLD accountant: the returned sigma spends the target epsilon (within 1 %)
    eps_pld = pld_epsilon(dpa.GaussianDpEvent(sigma), 1, delta, interval=1e-4)
    assert eps_pld == pytest.approx(epsilon, rel=0.01)
    # and dp_accounting's own analytic-Gaussian calibration (same closed form, independent code) agrees tightly
    assert sigma == pytest.approx(dpa.get_sigma_gaussian(epsilon, delta), rel=1e-6)


@pytest.mark.parametrize("sensitivity", [0.5, 1.0, 3.0])
def test_analytic_sigma_scales_with_sensitivity_and_is_safe(sensitivity):
    base = gaussian_sigma(epsilon=1.0, delta=1e-5, calibration="analytic")
    sigma = gaussian_sigma(epsilon=1.0, delta=1e-5, sensitivity=sensitivity, calibration="analytic")
    assert sigma == pytest.approx(base * sensitivity, rel=1e-10)
    assert gdp_delta(mu=sensitivity / sigma, epsilon=1.0) <= 1e-5


def test_classic_sigma_is_never_below_analytic_sigma():
    for epsilon, delta in itertools.product([0.01, 0.1, 0.5, 1.0, 3.0, 10.0, 50.0], [1e-3, 1e-5, 1e-8, 1e-12]):
        classic = gaussian_sigma(epsilon=epsilon, delta=delta, calibration="classic")
        analytic = gaussian_sigma(epsilon=epsilon, delta=delta, calibration="analytic")
        assert classic >= analytic, (epsilon, delta)
        # the classic formula is itself a valid (eps, delta) calibration: its exact delta is within the target
        assert gdp_delta(mu=1.0 / classic, epsilon=epsilon) <= delta


@pytest.mark.parametrize(("epsilon", "delta"), [(1e-4, 1e-5), (500.0, 1e-5), (1.0, 1e-200), (2.0, 0.9)])
def test_analytic_sigma_robust_at_extremes(epsilon, delta):
    # a fixed brentq bracket would fail on some of these; the expanding bracket must not
    sigma = gaussian_sigma(epsilon=epsilon, delta=delta, calibration="analytic")
    assert math.isfinite(sigma) and sigma > 0
    assert gdp_delta(mu=1.0 / sigma, epsilon=epsilon) <= delta
    # and it is the smallest such sigma, to high relative precision
    assert gdp_delta(mu=1.0 / (sigma * (1 - 1e-8)), epsilon=epsilon) > delta


# ---------------------------------------------------------------------------------------------------------------------
# Gaussian DP (PE's accounting)
# ---------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("noise_multiplier", "steps", "expected"),
    [(5 * SQRT2, 20, 2.594), (5 * SQRT2, 10, 1.760), (2 * SQRT2, 5, 3.34), (10 * SQRT2, 7, 0.6745)],
)
def test_gdp_epsilon_reproduces_pe_numbers(noise_multiplier, steps, expected):
    eps = gdp_epsilon(noise_multiplier=noise_multiplier, steps=steps, delta=1e-5)
    decimals = len(str(expected).split(".")[1])
    assert round(eps, decimals) == expected


@pytest.mark.parametrize(
    ("noise_multiplier", "steps", "delta"),
    [(5 * SQRT2, 20, 1e-5), (5 * SQRT2, 10, 1e-5), (1.0, 1, 1e-5), (3.0, 50, 1e-6), (20.0, 100, 1e-5)],
)
def test_gdp_epsilon_matches_dp_accounting(noise_multiplier, steps, delta):
    eps = gdp_epsilon(noise_multiplier=noise_multiplier, steps=steps, delta=delta)
    # (c) PLD of `steps` composed Gaussian events (numerical composition, independent of the closed form)
    assert eps == pytest.approx(pld_epsilon(dpa.GaussianDpEvent(noise_multiplier), steps, delta), rel=0.01)
    # T Gaussian releases of std sigma = one release of std sigma/sqrt(T): dp_accounting's analytic Gaussian
    assert eps == pytest.approx(dpa.get_epsilon_gaussian(noise_multiplier / math.sqrt(steps), delta), rel=1e-6)


def test_gdp_epsilon_is_on_the_safe_side_and_tight():
    mu = gdp_mu(noise_multiplier=5 * SQRT2, steps=20)
    assert mu == pytest.approx(math.sqrt(20) / (5 * SQRT2))
    eps = gdp_epsilon_from_mu(mu=mu, delta=1e-5)
    assert gdp_delta(mu=mu, epsilon=eps) <= 1e-5
    assert gdp_delta(mu=mu, epsilon=eps * (1 - 1e-9)) > 1e-5


def test_gdp_epsilon_edge_cases():
    assert gdp_epsilon(noise_multiplier=1.0, steps=0, delta=1e-5) == 0.0
    assert gdp_epsilon_from_mu(mu=0.0, delta=1e-5) == 0.0
    # so much noise that eps = 0 already meets delta
    assert gdp_epsilon(noise_multiplier=1e6, steps=1, delta=1e-5) == 0.0
    # so little noise that e^eps overflows a float: the log-space evaluation still answers
    eps = gdp_epsilon(noise_multiplier=1e-3, steps=1, delta=1e-5)
    assert 5e5 < eps < 5.1e5
    assert gdp_delta(mu=1e3, epsilon=eps) <= 1e-5


@pytest.mark.parametrize(("epsilon", "steps", "delta"), [(2.594, 20, 1e-5), (0.1, 1, 1e-5), (8.0, 1000, 1e-6)])
def test_gdp_noise_multiplier_inverts_gdp_epsilon(epsilon, steps, delta):
    nm = gdp_noise_multiplier(epsilon=epsilon, steps=steps, delta=delta)
    assert gdp_epsilon(noise_multiplier=nm, steps=steps, delta=delta) <= epsilon
    # exact value = the nm whose mu meets delta at epsilon exactly; dp_accounting's analytic Gaussian computes it
    exact = dpa.get_sigma_gaussian(epsilon, delta) * math.sqrt(steps)
    assert nm == pytest.approx(exact, rel=1e-6)
    assert nm >= exact * (1 - 1e-9)


def test_gdp_noise_multiplier_round_trip_pe():
    nm = gdp_noise_multiplier(
        epsilon=gdp_epsilon(noise_multiplier=5 * SQRT2, steps=20, delta=1e-5), steps=20, delta=1e-5
    )
    assert nm == pytest.approx(5 * SQRT2, rel=1e-6)


def test_gaussian_rdp_is_alpha_over_two_sigma_squared():
    orders = [1.5, 2.0, 10.0, 64.0]
    np.testing.assert_allclose(gaussian_rdp(noise_multiplier=2.0, orders=orders), np.array(orders) / 8.0)
    # the same as dp_accounting's RDP of one Gaussian event (read through its single-order RDP -> eps conversion)
    for order, rdp in zip(orders, gaussian_rdp(noise_multiplier=2.0, orders=orders)):
        single = rdp_privacy_accountant.RdpAccountant(orders=[order])
        single.compose(dpa.GaussianDpEvent(2.0))
        assert single.get_epsilon(1e-5) == pytest.approx(
            rdp + math.log1p(-1 / order) - math.log(1e-5 * order) / (order - 1)
        )


# ---------------------------------------------------------------------------------------------------------------------
# DP-SGD over Opacus, checked against dp_accounting
# ---------------------------------------------------------------------------------------------------------------------

INTEGER_ORDERS = [float(a) for a in range(2, 64)] + [128.0, 256.0]
DPSGD_GRID = list(itertools.product([0.8, 1.0, 2.0], [0.001, 0.01, 0.1], [100, 1000], [1e-5, 1e-6]))


def dpa_rdp_epsilon(sigma: float, q: float, steps: int, delta: float, orders) -> float:
    acc = rdp_privacy_accountant.RdpAccountant(orders=orders)
    acc.compose(dpa.PoissonSampledDpEvent(q, dpa.GaussianDpEvent(sigma)), steps)
    return acc.get_epsilon(delta)


@pytest.mark.parametrize(("sigma", "q", "steps", "delta"), DPSGD_GRID)
def test_dpsgd_rdp_matches_dp_accounting_rdp(sigma, q, steps, delta):
    # (a) Same (integer) orders on both sides: the two independent RDP implementations must agree tightly.
    ours = dpsgd_epsilon(
        noise_multiplier=sigma, sample_rate=q, steps=steps, delta=delta, accountant="rdp", orders=INTEGER_ORDERS
    )
    theirs = dpa_rdp_epsilon(sigma, q, steps, delta, INTEGER_ORDERS)
    assert ours == pytest.approx(theirs, rel=1e-6)
    # With dpsyn's default orders (Opacus's DEFAULT_ALPHAS, which add fractional orders 1.1 .. 10.9, plus orders up
    # to 1024), dpsyn is never looser than dp_accounting at the same orders; dp_accounting 0.6.0 overestimates the
    # RDP at small fractional orders (see test_opacus_fractional_order_rdp_matches_numerical_integration), so there
    # it is looser, by up to ~6 % on this grid (sigma=0.8, q=0.1, 1000 steps).
    default = dpsgd_epsilon(noise_multiplier=sigma, sample_rate=q, steps=steps, delta=delta, accountant="rdp")
    theirs_default = dpa_rdp_epsilon(sigma, q, steps, delta, rdp_orders())
    assert default <= theirs_default * (1 + 1e-9)
    assert default == pytest.approx(theirs_default, rel=0.07)
    # more orders can only tighten the bound
    assert default <= ours * (1 + 1e-12)


def test_dpsgd_rdp_orders_extend_opacus_defaults():
    from opacus.accountants import RDPAccountant

    orders = rdp_orders()
    assert orders[: len(RDPAccountant.DEFAULT_ALPHAS)] == [float(a) for a in RDPAccountant.DEFAULT_ALPHAS]
    assert max(orders) == 1024
    # where the optimum lies inside Opacus's grid, the numbers are Opacus's own
    opacus = RDPAccountant()
    opacus.history = [(1.0, 0.01, 1000)]
    assert dpsgd_epsilon(noise_multiplier=1.0, sample_rate=0.01, steps=1000, delta=1e-5) == pytest.approx(
        opacus.get_epsilon(delta=1e-5), rel=1e-12
    )
    # Opacus's orders stop at 63, so the conversion alone costs >= log(1/delta)/62 - log(63)/62 + log(62/63) = 0.10
    # and eps = 0.1 (the DP-MGE/DP-DRE grid) is out of reach with them; with orders to 1024 it is reachable.
    from opacus.accountants.utils import get_noise_multiplier

    with pytest.raises(ValueError, match="too low"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        get_noise_multiplier(target_epsilon=0.1, target_delta=1e-5, sample_rate=0.01, steps=1000, accountant="rdp")
    nm = dpsgd_noise_multiplier(epsilon=0.1, delta=1e-5, sample_rate=0.01, steps=1000)
    assert dpsgd_epsilon(noise_multiplier=nm, sample_rate=0.01, steps=1000, delta=1e-5) <= 0.1


@pytest.mark.parametrize(("q", "sigma"), [(0.1, 0.8), (0.1, 2.0), (0.01, 1.0)])
def test_opacus_fractional_order_rdp_matches_numerical_integration(q, sigma):
    """Ground truth for the fractional orders where Opacus and dp_accounting disagree.

    RDP of the Poisson-sampled Gaussian at order a is log(A_a)/(a-1) with
    A_a = E_{z ~ N(0, s^2)} [((1-q) + q exp((2z-1)/(2 s^2)))^a] (Mironov et al. 2019); integrate it numerically.
    """
    from opacus.accountants.analysis.rdp import compute_rdp

    z = np.linspace(-60 * sigma, 60 * sigma + 60, 400_001)
    for order in (1.1, 1.3, 1.6, 2.5, 4.5):
        log_ratio = np.logaddexp(np.log1p(-q), np.log(q) + (2 * z - 1) / (2 * sigma**2))
        log_f = order * log_ratio - z**2 / (2 * sigma**2) - 0.5 * np.log(2 * np.pi * sigma**2)
        m = log_f.max()
        log_a = m + np.log(np.trapezoid(np.exp(log_f - m), z))
        numeric = log_a / (order - 1)
        opacus = compute_rdp(q=q, noise_multiplier=sigma, steps=1, orders=[order])[0]
        assert opacus == pytest.approx(numeric, rel=1e-6), order


@pytest.mark.parametrize(
    ("sigma", "q", "steps", "delta"),
    [(1.0, 0.01, 1000, 1e-5), (1.0, 0.1, 100, 1e-5), (2.0, 0.1, 100, 1e-6), (0.8, 0.01, 100, 1e-5)],
)
def test_dpsgd_prv_matches_dp_accounting_pld(sigma, q, steps, delta):
    # (b) Two numerical-composition accountants; Opacus's PRV returns the upper end of a +-0.01 interval.
    ours = dpsgd_epsilon(noise_multiplier=sigma, sample_rate=q, steps=steps, delta=delta, accountant="prv")
    theirs = pld_epsilon(dpa.PoissonSampledDpEvent(q, dpa.GaussianDpEvent(sigma)), steps, delta)
    assert ours == pytest.approx(theirs, rel=0.05)
    # both tighter than RDP
    rdp = dpsgd_epsilon(noise_multiplier=sigma, sample_rate=q, steps=steps, delta=delta, accountant="rdp")
    assert ours < rdp


def test_dpsgd_zero_steps_spend_nothing():
    for accountant in ACCOUNTANTS:
        assert dpsgd_epsilon(noise_multiplier=1.0, sample_rate=0.01, steps=0, delta=1e-5, accountant=accountant) == 0


@pytest.mark.parametrize("accountant", ACCOUNTANTS)
def test_dpsgd_noise_multiplier_meets_target(accountant):
    kw = dict(delta=1e-5, sample_rate=0.01, steps=500)
    nm = dpsgd_noise_multiplier(epsilon=1.0, accountant=accountant, **kw)
    eps = dpsgd_epsilon(noise_multiplier=nm, accountant=accountant, **kw)
    assert 1.0 - 0.011 <= eps <= 1.0


def test_dpsgd_noise_multiplier_steps_up_when_opacus_overspends(monkeypatch, caplog):
    import opacus.accountants.utils as opacus_utils

    kw = dict(delta=1e-5, sample_rate=0.01, steps=300)
    honest = dpsgd_noise_multiplier(epsilon=1.0, **kw)
    # an Opacus that returns a noise multiplier 1 % too small (eps over the target)
    monkeypatch.setattr(opacus_utils, "get_noise_multiplier", lambda **kwargs: honest * 0.99)
    assert dpsgd_epsilon(noise_multiplier=honest * 0.99, **kw) > 1.0
    with caplog.at_level(logging.WARNING, logger="dpsyn.privacy.dpsgd"):
        nm = dpsgd_noise_multiplier(epsilon=1.0, **kw)
    assert nm > honest * 0.99
    assert dpsgd_epsilon(noise_multiplier=nm, **kw) <= 1.0
    assert "stepping up" in caplog.text


# ---------------------------------------------------------------------------------------------------------------------
# validation
# ---------------------------------------------------------------------------------------------------------------------


def test_gaussian_sigma_rejects_bad_input():
    with pytest.raises(ValueError, match=r"'classic', 'analytic'"):
        gaussian_sigma(epsilon=1.0, delta=1e-5, calibration="tight")
    for bad in (0.0, -1.0, math.inf, math.nan):
        with pytest.raises(ValueError, match="epsilon"):
            gaussian_sigma(epsilon=bad, delta=1e-5)
    for bad in (0.0, 1.0, -1e-5, 2.0):
        with pytest.raises(ValueError, match="delta"):
            gaussian_sigma(epsilon=1.0, delta=bad, calibration="analytic")
    for bad in (0.0, -2.0):
        with pytest.raises(ValueError, match="sensitivity"):
            gaussian_sigma(epsilon=1.0, delta=1e-5, sensitivity=bad)
    with pytest.raises(TypeError):
        gaussian_sigma(1.0, 1e-5)  # keyword-only


def test_gdp_functions_reject_bad_input():
    with pytest.raises(ValueError, match="noise_multiplier"):
        gdp_epsilon(noise_multiplier=0.0, steps=10, delta=1e-5)
    with pytest.raises(ValueError, match="steps"):
        gdp_epsilon(noise_multiplier=1.0, steps=-1, delta=1e-5)
    with pytest.raises(ValueError, match="steps"):
        gdp_epsilon(noise_multiplier=1.0, steps=2.5, delta=1e-5)
    with pytest.raises(ValueError, match="delta"):
        gdp_epsilon(noise_multiplier=1.0, steps=10, delta=0.0)
    with pytest.raises(ValueError, match="epsilon"):
        gdp_noise_multiplier(epsilon=math.inf, steps=10, delta=1e-5)
    with pytest.raises(ValueError, match="steps"):
        gdp_noise_multiplier(epsilon=1.0, steps=0, delta=1e-5)


def test_dpsgd_functions_reject_bad_input():
    kw = dict(noise_multiplier=1.0, sample_rate=0.01, steps=10, delta=1e-5)
    with pytest.raises(ValueError, match=r"'rdp', 'prv'"):
        dpsgd_epsilon(accountant="gdp", **kw)
    with pytest.raises(ValueError, match=r"'rdp', 'prv'"):
        dpsgd_noise_multiplier(epsilon=1.0, delta=1e-5, sample_rate=0.01, steps=10, accountant="moments")
    with pytest.raises(ValueError, match="inf"):
        dpsgd_noise_multiplier(epsilon=math.inf, delta=1e-5, sample_rate=0.01, steps=10)
    with pytest.raises(ValueError, match="sample_rate"):
        dpsgd_epsilon(**{**kw, "sample_rate": 1.5})
    with pytest.raises(ValueError, match="sample_rate"):
        dpsgd_epsilon(**{**kw, "sample_rate": 0.0})
    with pytest.raises(ValueError, match="delta"):
        dpsgd_epsilon(**{**kw, "delta": 1.0})
    with pytest.raises(ValueError, match="orders"):
        dpsgd_epsilon(accountant="prv", orders=[2.0, 3.0], **kw)
    with pytest.raises(ValueError, match="orders"):
        dpsgd_epsilon(orders=[0.5, 2.0], **kw)
    assert ACCOUNTANTS == ("rdp", "prv")
