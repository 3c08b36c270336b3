"""The Laplace mechanism on class counts (:mod:`dpsyn.privacy.laplace`) and the methods' class-ratio release.

Checked against scipy's Laplace distribution (an independent implementation): the noise's distribution (a
Kolmogorov-Smirnov test of many draws), and the privacy guarantee itself (the likelihood ratio of the output density
for neighbouring histograms is at most e^eps everywhere on a grid, and reaches it: the calibration is not loose).
"""

from __future__ import annotations

import math

from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from dpsyn.data.base import Split
from dpsyn.methods.base import Method, PrivacyBudget, Samples
from dpsyn.privacy import (
    ApproxDPEvent,
    PrivacyLedger,
    SampledGaussianEvent,
    dp_class_counts,
    dp_class_proportions,
    dpsgd_noise_multiplier,
    laplace_scale,
)
from tests.conftest import run_context

LABELS = np.array([0] * 30 + [1] * 5 + [2] * 65)


def _noise(epsilon: float, *, draws: int, seed: int = 0) -> np.ndarray:
    """``draws`` noise values of :func:`dp_class_counts` (noisy counts minus true counts), deterministic generator."""
    gen = np.random.default_rng(seed)
    true = np.bincount(LABELS, minlength=4).astype(np.float64)
    out = [dp_class_counts(LABELS, 4, epsilon=epsilon, generator=gen) - true for _ in range(draws // 4)]
    return np.concatenate(out)


# ------------------------------------------------------------------------------------------------- mechanism


@pytest.mark.parametrize("epsilon", [0.01, 0.5, 1.0, 8.0])
def test_noise_is_laplace_with_scale_one_over_epsilon(epsilon: float) -> None:
    noise = _noise(epsilon, draws=8000)
    assert laplace_scale(epsilon=epsilon) == pytest.approx(1.0 / epsilon)
    ks = stats.kstest(noise, stats.laplace(loc=0.0, scale=1.0 / epsilon).cdf)
    assert ks.pvalue > 1e-3, ks
    # and the test has power: twice the scale is rejected
    assert stats.kstest(noise, stats.laplace(loc=0.0, scale=2.0 / epsilon).cdf).pvalue < 1e-6


def test_laplace_scale_is_sensitivity_over_epsilon() -> None:
    assert laplace_scale(epsilon=0.5, sensitivity=2.0) == pytest.approx(4.0)


@pytest.mark.parametrize("epsilon", [0.01, 0.1, 1.0, 5.0])
def test_likelihood_ratio_of_neighbouring_histograms_is_at_most_e_eps(epsilon: float) -> None:
    """Adding one row changes one count by 1 (L1 sensitivity 1); for every output the density ratio is <= e^eps."""
    neighbour = np.append(LABELS, 1)  # one more row, of class 1
    c, c2 = np.bincount(LABELS, minlength=4), np.bincount(neighbour, minlength=4)
    assert np.abs(c - c2).sum() == 1

    b = laplace_scale(epsilon=epsilon)
    # the counts are noised independently: the joint density ratio is the product of per-count ratios, so its
    # supremum is at most the sum of the per-count suprema (each taken on a grid of +-30 scales around the counts)
    sup = []
    for k in range(4):
        grid = np.linspace(min(c[k], c2[k]) - 30 * b, max(c[k], c2[k]) + 30 * b, 20001)
        log_ratio = stats.laplace.logpdf(grid, loc=c[k], scale=b) - stats.laplace.logpdf(grid, loc=c2[k], scale=b)
        sup.append(float(np.max(np.abs(log_ratio))))
    assert sup[0] == sup[2] == sup[3] == 0.0
    assert sum(sup) <= epsilon * (1 + 1e-9)
    assert sup[1] == pytest.approx(epsilon, rel=1e-9)  # tight: no budget wasted
    # a mechanism with half the noise would not be eps-DP
    grid = np.linspace(c[1] - 30 * b, c2[1] + 30 * b, 20001)
    half = stats.laplace.logpdf(grid, loc=c[1], scale=b / 2) - stats.laplace.logpdf(grid, loc=c2[1], scale=b / 2)
    assert np.max(np.abs(half)) > epsilon * 1.5


def test_empirical_output_distributions_of_neighbours_are_eps_close() -> None:
    """Monte Carlo of the mechanism itself on neighbouring label sets: bin frequencies differ by at most e^eps."""
    epsilon, draws = 1.0, 200_000
    neighbour = np.append(LABELS, 1)
    ga, gb = np.random.default_rng(2), np.random.default_rng(3)
    out_a = np.array([dp_class_counts(LABELS, 4, epsilon=epsilon, generator=ga)[1] for _ in range(draws // 20)])
    out_b = np.array([dp_class_counts(neighbour, 4, epsilon=epsilon, generator=gb)[1] for _ in range(draws // 20)])
    bins = np.arange(1.0, 10.0, 0.5)  # well-populated bins around the two true counts (5 and 6)
    pa = np.histogram(out_a, bins)[0] / len(out_a)
    pb = np.histogram(out_b, bins)[0] / len(out_b)
    ratio = np.maximum(pa / pb, pb / pa)
    assert np.all(ratio <= math.exp(epsilon) * 1.25)  # sampling error: ~1000 draws per bin


def test_proportions_are_a_distribution() -> None:
    gen = np.random.default_rng(0)
    for epsilon in (0.001, 0.01, 1.0, 100.0):
        for _ in range(200):
            p = dp_class_proportions(LABELS, 4, epsilon=epsilon, generator=gen)
            assert p.shape == (4,) and np.all(p >= 0) and p.sum() == pytest.approx(1.0)
    p = dp_class_proportions(LABELS, 4, epsilon=1e6, generator=gen)
    np.testing.assert_allclose(p, [0.3, 0.05, 0.65, 0.0], atol=1e-4)


class _FixedNoise(np.random.Generator):
    """A stand-in generator whose Laplace draws are fixed values (a numpy Generator, as laplace_mechanism requires)."""

    def __init__(self, values: list[float]) -> None:
        super().__init__(np.random.PCG64(0))
        self.values = np.asarray(values, dtype=np.float64)

    def laplace(self, loc: float, scale: float, size: int | tuple[int, ...]) -> np.ndarray:
        assert tuple(np.atleast_1d(size)) == (len(self.values),)
        return loc + self.values


def test_all_non_positive_noisy_counts_give_uniform_proportions() -> None:
    labels = np.array([0, 0, 1])
    p = dp_class_proportions(labels, 3, epsilon=1.0, generator=_FixedNoise([-5.0, -4.0, -0.5]))
    np.testing.assert_allclose(p, [1 / 3] * 3)
    p = dp_class_proportions(labels, 3, epsilon=1.0, generator=_FixedNoise([-2.0, 0.0, 3.0]))  # clamped at 0
    np.testing.assert_allclose(p, [0.0, 0.25, 0.75])


@pytest.mark.parametrize("epsilon", [0, -1.0, math.inf, math.nan, True, "1"])
def test_invalid_epsilon_raises(epsilon) -> None:
    with pytest.raises(ValueError, match="epsilon"):
        dp_class_proportions(LABELS, 4, epsilon=epsilon, generator=np.random.default_rng(0))
    with pytest.raises(ValueError, match="epsilon"):
        laplace_scale(epsilon=epsilon)


@pytest.mark.parametrize(
    "labels",
    [np.array([[0, 1]]), np.array([0, -1]), np.array([0, 4]), np.array([1, 7]), np.array([0.5, 1.7]), ["a", "b"]],
)
def test_invalid_labels_raise(labels: np.ndarray) -> None:
    with pytest.raises(ValueError, match="labels"):
        dp_class_counts(labels, 4, epsilon=1.0, generator=np.random.default_rng(0))


def test_integral_float_labels_and_empty_labels_are_counted() -> None:
    counts = dp_class_counts(np.array([0.0, 2.0, 2.0]), 3, epsilon=1e9, generator=np.random.default_rng(0))
    np.testing.assert_allclose(counts, [1, 0, 2], atol=1e-6)
    empty = dp_class_counts(np.zeros(0, np.int64), 2, epsilon=1.0, generator=np.random.default_rng(1))
    assert empty.shape == (2,)


@pytest.mark.parametrize("num_classes", [0, -1, 2.0, True])
def test_invalid_num_classes_raises(num_classes) -> None:
    with pytest.raises(ValueError, match="num_classes"):
        dp_class_proportions(np.zeros(0, np.int64), num_classes, epsilon=1.0, generator=np.random.default_rng(0))


def test_invalid_sensitivity_raises() -> None:
    with pytest.raises(ValueError, match="sensitivity"):
        laplace_scale(epsilon=1.0, sensitivity=0.0)


# -------------------------------------------------------------------------------------- Method helpers + ledger


class _Dummy(Method):
    def fit(self, private, budget, ledger, public=None) -> None:  # pragma: no cover - not used
        raise NotImplementedError

    def sample(self, n: int, labels: np.ndarray | None = None) -> Samples:  # pragma: no cover - not used
        raise NotImplementedError


def _method(*, deterministic: bool = True, run_dir: Path | None = None) -> _Dummy:
    ctx = run_context(deterministic_noise=deterministic, kind="table", shape=(5,), run_dir=run_dir)
    return _Dummy({}, ctx)


def _private() -> Split:
    y = np.array([0] * 300 + [1] * 100 + [2] * 600)
    return Split(np.zeros((len(y), 5), np.float32), y)


def test_release_records_a_pure_dp_event_and_returns_the_remaining_budget() -> None:
    target, delta = 1.0, 1e-5
    ledger = PrivacyLedger(target_epsilon=target, delta=delta)
    props, remaining = _method().release_class_proportions(
        _private(), PrivacyBudget(epsilon=target, delta=delta), ledger, 0.01
    )
    (event,) = ledger.events
    assert isinstance(event, ApproxDPEvent) and event.epsilon == 0.01 and event.delta == 0.0
    assert remaining == PrivacyBudget(epsilon=target - 0.01, delta=delta)
    assert props.shape == (3,) and np.all(props >= 0) and props.sum() == pytest.approx(1.0)
    assert ledger.epsilon() == pytest.approx(0.01)

    # the generator spends the rest with DP-SGD, calibrated for the remaining budget: the total stays in target
    q, steps = 0.05, 400
    nm = dpsgd_noise_multiplier(epsilon=remaining.epsilon, delta=remaining.delta, sample_rate=q, steps=steps)
    ledger.add(SampledGaussianEvent(sampling="poisson",
                                    noise_multiplier=nm, sample_rate=q, steps=steps, accountant="rdp"))
    spent = ledger.epsilon()
    assert spent <= target * (1 + 1e-9) and spent > 0.9 * target
    assert ledger.check_within_budget() == spent
    assert "basic composition of 1 approx-DP event" in ledger.accountant_description()


def test_release_noise_is_deterministic_only_when_asked() -> None:
    budget = PrivacyBudget(epsilon=1.0, delta=1e-5)

    def release(det: bool) -> np.ndarray:
        ledger = PrivacyLedger(target_epsilon=1.0, delta=1e-5)
        return _method(deterministic=det).release_class_proportions(_private(), budget, ledger, 0.01)[0]

    np.testing.assert_array_equal(release(True), release(True))
    assert not np.array_equal(release(False), release(False))


def test_non_private_run_uses_exact_proportions_and_charges_nothing() -> None:
    ledger = PrivacyLedger(target_epsilon=math.inf, delta=1e-5)
    budget = PrivacyBudget(epsilon=math.inf, delta=1e-5)
    props, remaining = _method().release_class_proportions(_private(), budget, ledger, 0.01)
    np.testing.assert_allclose(props, [0.3, 0.1, 0.6])
    assert remaining == budget and ledger.epsilon() == 0.0


@pytest.mark.parametrize("eps_ratio", [0.0, -0.1, 1.0, 2.0, True])
def test_class_ratio_epsilon_must_lie_inside_the_budget(eps_ratio) -> None:
    ledger = PrivacyLedger(target_epsilon=1.0, delta=1e-5)
    with pytest.raises(ValueError, match="class-ratio epsilon"):
        _method().release_class_proportions(_private(), PrivacyBudget(1.0, 1e-5), ledger, eps_ratio)
    assert ledger.epsilon() == 0.0  # nothing released, nothing charged


def test_labels_follow_the_proportions() -> None:
    rng = np.random.default_rng(0)
    labels = _method().labels_from_proportions(30_000, np.array([0.2, 0.0, 0.8]), rng)
    assert labels.dtype == np.int64 and labels.shape == (30_000,)
    freq = np.bincount(labels, minlength=3) / len(labels)
    assert freq[1] == 0 and freq[0] == pytest.approx(0.2, abs=0.01)
    # unnormalised weights are normalised
    labels = _method().labels_from_proportions(10_000, np.array([1.0, 1.0, 2.0]), rng)
    assert np.bincount(labels, minlength=3)[2] / 10_000 == pytest.approx(0.5, abs=0.02)


def test_a_release_is_drawn_once_per_run_directory(tmp_path: Path) -> None:
    """A run that crashes after the Laplace release (before any checkpoint of g_pate / pate_gan / dp_gan) and is
    run again in its directory reuses the release it wrote, charging it again in the new ledger; never a new draw."""
    budget = PrivacyBudget(epsilon=1.0, delta=1e-5)

    def release(run_dir: Path, eps_ratio: float = 0.01) -> tuple[np.ndarray, PrivacyLedger]:
        ledger = PrivacyLedger(target_epsilon=1.0, delta=1e-5)
        props = _method(deterministic=False, run_dir=run_dir).release_class_proportions(
            _private(), budget, ledger, eps_ratio)[0]
        return props, ledger

    first, _ = release(tmp_path / "a")
    assert (tmp_path / "a" / "checkpoints" / "class_proportions.json").is_file()
    again, ledger = release(tmp_path / "a")
    np.testing.assert_array_equal(first, again)
    assert ledger.epsilon() == pytest.approx(0.01)
    other, _ = release(tmp_path / "b")  # another run: a fresh draw (OS entropy)
    assert not np.array_equal(first, other)
    with pytest.raises(ValueError, match="released at class-ratio epsilon 0.01"):
        release(tmp_path / "a", eps_ratio=0.1)
