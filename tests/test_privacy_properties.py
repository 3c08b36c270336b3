"""Property tests (hypothesis): calibration inverses never overspend; epsilon is monotone in noise and steps."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from dpsyn.privacy import (
    dpsgd_epsilon,
    dpsgd_noise_multiplier,
    gaussian_sigma,
    gdp_delta,
    gdp_epsilon,
    gdp_noise_multiplier,
)

FAST = settings(max_examples=20, deadline=None, database=None)
SLOWISH = settings(max_examples=12, deadline=None, database=None)  # each example runs an Opacus bisection (~0.3-1 s)

epsilons = st.floats(min_value=0.05, max_value=20.0, allow_nan=False, allow_infinity=False)
deltas = st.sampled_from([1e-3, 1e-5, 1e-6, 1e-9])
noise_multipliers = st.floats(min_value=0.3, max_value=50.0, allow_nan=False, allow_infinity=False)
sample_rates = st.floats(min_value=1e-3, max_value=0.05, allow_nan=False, allow_infinity=False)


@FAST
@given(epsilon=epsilons, delta=deltas, sensitivity=st.floats(min_value=1e-3, max_value=1e3))
def test_analytic_sigma_never_overspends(epsilon, delta, sensitivity):
    sigma = gaussian_sigma(epsilon=epsilon, delta=delta, sensitivity=sensitivity, calibration="analytic")
    assert gdp_delta(mu=sensitivity / sigma, epsilon=epsilon) <= delta
    # tight: 1e-9 less noise already overspends
    assert gdp_delta(mu=sensitivity / (sigma * (1 - 1e-9)), epsilon=epsilon) > delta
    assert sigma <= gaussian_sigma(epsilon=epsilon, delta=delta, sensitivity=sensitivity, calibration="classic")


@FAST
@given(epsilon=epsilons, delta=deltas, steps=st.integers(min_value=1, max_value=5000))
def test_gdp_noise_multiplier_never_overspends(epsilon, delta, steps):
    nm = gdp_noise_multiplier(epsilon=epsilon, steps=steps, delta=delta)
    eps = gdp_epsilon(noise_multiplier=nm, steps=steps, delta=delta)
    assert eps <= epsilon
    assert math.isclose(eps, epsilon, rel_tol=1e-6)  # and not needlessly below it


@FAST
@given(
    nm=noise_multipliers,
    factor=st.floats(min_value=1.001, max_value=10.0),
    steps=st.integers(min_value=1, max_value=2000),
    extra=st.integers(min_value=1, max_value=2000),
    delta=deltas,
)
def test_gdp_epsilon_monotone(nm, factor, steps, extra, delta):
    eps = gdp_epsilon(noise_multiplier=nm, steps=steps, delta=delta)
    assert gdp_epsilon(noise_multiplier=nm * factor, steps=steps, delta=delta) <= eps
    assert gdp_epsilon(noise_multiplier=nm, steps=steps + extra, delta=delta) >= eps
    if eps > 1e-6:  # strictly, wherever epsilon is not already 0
        assert gdp_epsilon(noise_multiplier=nm * factor, steps=steps, delta=delta) < eps


@SLOWISH
@given(
    epsilon=st.floats(min_value=0.3, max_value=10.0),
    delta=st.sampled_from([1e-5, 1e-6]),
    sample_rate=sample_rates,
    steps=st.integers(min_value=10, max_value=500),
)
def test_dpsgd_rdp_noise_multiplier_never_overspends(epsilon, delta, sample_rate, steps):
    kw = dict(delta=delta, sample_rate=sample_rate, steps=steps, accountant="rdp")
    nm = dpsgd_noise_multiplier(epsilon=epsilon, **kw)
    eps = dpsgd_epsilon(noise_multiplier=nm, **kw)
    assert eps <= epsilon
    assert eps >= epsilon - 0.011  # Opacus's bisection tolerance (0.01) is honoured: no needless extra noise


@SLOWISH
@given(
    nm=st.floats(min_value=0.5, max_value=10.0),
    factor=st.floats(min_value=1.01, max_value=4.0),
    sample_rate=sample_rates,
    steps=st.integers(min_value=1, max_value=1000),
    extra=st.integers(min_value=1, max_value=1000),
    delta=st.sampled_from([1e-5, 1e-6]),
)
def test_dpsgd_rdp_epsilon_monotone(nm, factor, sample_rate, steps, extra, delta):
    kw = dict(sample_rate=sample_rate, delta=delta, accountant="rdp")
    eps = dpsgd_epsilon(noise_multiplier=nm, steps=steps, **kw)
    assert dpsgd_epsilon(noise_multiplier=nm * factor, steps=steps, **kw) < eps
    assert dpsgd_epsilon(noise_multiplier=nm, steps=steps + extra, **kw) > eps
