"""Fidelity metrics pinned against the reference implementations on identical features (torch-fidelity, prdc),
with the generated/real argument order pinned, plus NDB's behaviour on shifted and resampled distributions."""

from __future__ import annotations

import contextlib
import io

import numpy as np
import pytest
import torch
from scipy.spatial.distance import jensenshannon

from dpsyn.metrics import fidelity
from dpsyn.metrics.fidelity import (
    density_coverage,
    feature_statistics,
    frechet_distance,
    frechet_distance_from_features,
    inception_score,
    kid,
    knn_radii,
    precision_recall,
)
from dpsyn.metrics.ndb import js_divergence, ndb, ndb_from_counts, two_proportion_z_test


def _features(n_gen: int = 600, n_real: int = 500, d: int = 16, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Generated and real features from different (correlated, shifted) Gaussians."""
    rng = np.random.default_rng(seed)
    mix = rng.normal(size=(d, d)) * 0.5
    real = rng.normal(size=(n_real, d)) @ mix
    gen = rng.normal(loc=0.2, scale=1.1, size=(n_gen, d)) @ mix
    return gen, real


def _prdc(real: np.ndarray, fake: np.ndarray, k: int) -> dict[str, float]:
    from prdc import compute_prdc

    with contextlib.redirect_stdout(io.StringIO()):  # compute_prdc prints the sample counts
        return {key: float(v) for key, v in compute_prdc(real_features=real, fake_features=fake, nearest_k=k).items()}


def _tf_prc(gen: np.ndarray, real: np.ndarray, k: int) -> dict[str, float]:
    from torch_fidelity.metric_prc import prc_features_to_metric

    # float64 tensors: torch-fidelity then compares float64 distances, as we do
    return prc_features_to_metric(torch.from_numpy(gen), torch.from_numpy(real), prc_neighborhood=k, verbose=False)


# ------------------------------------------------------------------------------------------------------ FD


def test_fd_equals_torch_fidelity_fid_on_identical_features() -> None:
    from torch_fidelity.metric_fid import fid_features_to_statistics, fid_statistics_to_metric

    gen, real = _features(d=32)
    ref = fid_statistics_to_metric(
        fid_features_to_statistics(torch.from_numpy(gen)), fid_features_to_statistics(torch.from_numpy(real)), False
    )["frechet_inception_distance"]
    ours = frechet_distance_from_features(gen, real)
    assert abs(ours - ref) / ref < 1e-5
    mu, sigma = feature_statistics(gen)
    tf_stats = fid_features_to_statistics(torch.from_numpy(gen))
    np.testing.assert_allclose(mu, tf_stats["mu"], rtol=1e-12)
    np.testing.assert_allclose(sigma, tf_stats["sigma"], rtol=1e-10, atol=1e-12)


def test_fd_is_robust_on_rank_deficient_covariances() -> None:
    """N < D (singular covariances): finite, non-negative, and ~0 for a set against itself."""
    rng = np.random.default_rng(3)
    a, b = rng.normal(size=(20, 64)), rng.normal(size=(30, 64))
    assert np.isfinite(frechet_distance_from_features(a, b)) and frechet_distance_from_features(a, b) > 0
    # ~0 up to the square-root amplification of eigenvalue round-off (~1e-8 of the trace here)
    assert abs(frechet_distance_from_features(a, a)) < 1e-7 * np.trace(np.cov(a, rowvar=False))
    with pytest.raises(ValueError, match="mismatched"):
        frechet_distance(np.zeros(3), np.eye(3), np.zeros(4), np.eye(4))


# ----------------------------------------------------------------------------------------------------- KID


def test_kid_equals_torch_fidelity_with_the_same_subsets() -> None:
    from torch_fidelity.metric_kid import kid_features_to_metric

    gen, real = _features(n_gen=400, n_real=350, d=24)
    for seed in (0, 7):
        ref = kid_features_to_metric(
            torch.from_numpy(gen), torch.from_numpy(real), kid_subsets=12, kid_subset_size=200, rng_seed=seed,
            verbose=False,
        )
        mean, std = kid(gen, real, subsets=12, subset_size=200, seed=seed)
        assert mean == pytest.approx(ref["kernel_inception_distance_mean"], rel=1e-9)
        assert std == pytest.approx(ref["kernel_inception_distance_std"], rel=1e-9)
    # the order matters (generated rows are drawn first); two samples of one distribution score ~0
    assert kid(real, gen, subsets=12, subset_size=200)[0] != pytest.approx(mean, rel=1e-6)
    rng = np.random.default_rng(11)
    same_a, same_b = rng.normal(size=(400, 24)), rng.normal(size=(400, 24))
    shifted_kid = kid(same_a, same_b + 0.5, subsets=12, subset_size=200)[0]
    assert abs(kid(same_a, same_b, subsets=12, subset_size=200)[0]) < 0.05 * shifted_kid
    with pytest.raises(ValueError, match="subset_size"):
        kid(gen, real, subset_size=351)


# ------------------------------------------------------------------------------------------------------ IS


def test_inception_score_equals_torch_fidelity_on_the_same_logits() -> None:
    from torch_fidelity.metric_isc import isc_features_to_metric

    logits = np.random.default_rng(1).normal(scale=3.0, size=(1003, 40))  # 1003: splits of unequal size
    for splits, shuffle, seed in ((10, True, 0), (7, True, 2020), (4, False, 0)):
        ref = isc_features_to_metric(torch.from_numpy(logits), splits=splits, shuffle=shuffle, rng_seed=seed)
        mean, std = inception_score(logits, splits=splits, shuffle=shuffle, seed=seed)
        assert mean == pytest.approx(ref["inception_score_mean"], rel=1e-12)
        assert std == pytest.approx(ref["inception_score_std"], rel=1e-9)
    # confident, uniformly spread classes -> IS ~ number of classes; constant predictions -> 1
    confident = np.eye(40)[np.arange(4000) % 40] * 50.0
    assert inception_score(confident, splits=4, shuffle=False)[0] == pytest.approx(40.0, rel=1e-6)
    assert inception_score(np.tile(confident[:1], (100, 1)), splits=4)[0] == pytest.approx(1.0)


# ----------------------------------------------------------------------------------------- precision / recall


def test_precision_recall_equal_torch_fidelity_and_prdc() -> None:
    gen, real = _features()
    for k in (3, 5):
        ours = precision_recall(gen, real, k=k)
        tf = _tf_prc(gen, real, k)
        ref = _prdc(real, gen, k)
        # torch-fidelity returns float32 means: 1e-6 still proves identical counts (1 sample = 1/500)
        assert ours["precision"] == pytest.approx(tf["precision"], abs=1e-6)
        assert ours["recall"] == pytest.approx(tf["recall"], abs=1e-6)
        assert ours["precision"] == pytest.approx(ref["precision"], abs=1e-12)
        assert ours["recall"] == pytest.approx(ref["recall"], abs=1e-12)
        assert 0.05 < ours["precision"] < 0.99 and 0.05 < ours["recall"] < 0.99  # a non-degenerate case


def test_precision_recall_order_is_generated_then_real() -> None:
    """Mode collapse: generated samples packed in one corner of the real data -> high precision, low recall."""
    rng = np.random.default_rng(2)
    real = rng.normal(size=(800, 8))
    gen = rng.normal(loc=0.3, scale=0.3, size=(800, 8))
    ours = precision_recall(gen, real, k=3)
    assert ours["precision"] > 0.9 and ours["recall"] < 0.3
    tf = _tf_prc(gen, real, 3)
    assert (ours["precision"], ours["recall"]) == pytest.approx((tf["precision"], tf["recall"]), abs=1e-6)
    swapped = precision_recall(real, gen, k=3)
    assert swapped["precision"] < 0.3 and swapped["recall"] > 0.9
    assert (swapped["precision"], swapped["recall"]) == pytest.approx((ours["recall"], ours["precision"]), abs=1e-12)


def test_density_coverage_equal_prdc() -> None:
    gen, real = _features(seed=4)
    for k in (3, 5):
        ours = density_coverage(gen, real, k=k)
        ref = _prdc(real, gen, k)
        assert ours["density"] == pytest.approx(ref["density"], abs=1e-12)
        assert ours["coverage"] == pytest.approx(ref["coverage"], abs=1e-12)
    # same distribution: density ~1, coverage high; the order matters on an asymmetric case
    rng = np.random.default_rng(5)
    a, b = rng.normal(size=(1500, 4)), rng.normal(size=(1500, 4))
    same = density_coverage(a, b, k=5)
    assert 0.8 < same["density"] < 1.2 and same["coverage"] > 0.9
    tight = rng.normal(scale=0.3, size=(1500, 4))
    assert density_coverage(tight, a, k=5)["density"] > 5 * density_coverage(a, tight, k=5)["density"]
    half = b.copy()
    half[:, 0] = np.abs(half[:, 0])  # generated covers half of the real support
    assert density_coverage(half, a, k=5)["coverage"] < 0.75 < density_coverage(a, half, k=5)["coverage"]


def test_ties_follow_each_papers_convention() -> None:
    """On an integer lattice distances tie exactly (and are exact in float64): precision/recall count a distance
    equal to the radius as inside (torch-fidelity, Kynkaanniemi et al.), density/coverage as outside (prdc)."""
    rng = np.random.default_rng(8)
    gen = rng.integers(0, 4, size=(300, 3)).astype(np.float64)
    real = rng.integers(0, 4, size=(250, 3)).astype(np.float64) + np.array([1.0, 0.0, 0.0])
    ours, tf, ref = precision_recall(gen, real, k=3), _tf_prc(gen, real, 3), _prdc(real, gen, 3)
    assert (ours["precision"], ours["recall"]) == pytest.approx((tf["precision"], tf["recall"]), abs=1e-6)
    assert (ours["precision"], ours["recall"]) != pytest.approx((ref["precision"], ref["recall"]), abs=1e-6)
    dc = density_coverage(gen, real, k=3)
    assert (dc["density"], dc["coverage"]) == pytest.approx((ref["density"], ref["coverage"]), abs=1e-12)


def test_blocked_distances_match_a_single_block(monkeypatch: pytest.MonkeyPatch) -> None:
    """Blocks of a few rows (odd sizes, ragged last block) give exactly the single-block answers."""
    gen, real = _features(n_gen=301, n_real=257, d=8, seed=6)
    whole = precision_recall(gen, real, k=4), density_coverage(gen, real, k=4), knn_radii(real, k=4)
    monkeypatch.setattr(fidelity, "_BLOCK_BYTES", 8 * 257 * 7)  # 7 rows per block
    blocked = precision_recall(gen, real, k=4), density_coverage(gen, real, k=4), knn_radii(real, k=4)
    assert blocked[0] == whole[0] and blocked[1] == whole[1]
    np.testing.assert_allclose(blocked[2], whole[2], rtol=1e-13)  # BLAS summation order differs per block
    # radii against brute force (k-th neighbour other than the point itself)
    d = np.sqrt(((real[:, None, :] - real[None, :, :]) ** 2).sum(-1))
    np.testing.assert_allclose(whole[2], np.sort(d, axis=1)[:, 4], rtol=1e-9)


def test_manifold_metrics_reject_bad_input() -> None:
    gen, real = _features(n_gen=10, n_real=10, d=3)
    with pytest.raises(ValueError, match="same D"):
        precision_recall(gen, real[:, :2])
    with pytest.raises(ValueError, match="k must be"):
        precision_recall(gen, real, k=10)
    bad = gen.copy()
    bad[0, 0] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        density_coverage(bad, real)


# ----------------------------------------------------------------------------------------------------- NDB


def _mixture(n: int, weights: np.ndarray, *, seed: int, shift: float = 0.0) -> np.ndarray:
    centres = np.random.default_rng(100).normal(scale=4.0, size=(len(weights), 8))
    rng = np.random.default_rng(seed)
    return centres[rng.choice(len(weights), n, p=weights)] + rng.normal(size=(n, 8)) + shift


def test_ndb_flags_a_shifted_distribution_and_not_a_resample() -> None:
    w = np.full(10, 0.1)
    real_train = _mixture(4000, w, seed=1)
    resample = ndb(_mixture(4000, w, seed=2), real_train, k=50, seed=0)
    assert resample["K"] == 50 and resample["ndb_k"] <= 0.12 and resample["js"] < 0.01
    dropped = w.copy()
    dropped[:3] = 0.02  # three modes under-produced
    collapsed = ndb(_mixture(4000, dropped / dropped.sum(), seed=3), real_train, k=50, seed=0)
    shifted = ndb(_mixture(4000, w, seed=3, shift=0.5), real_train, k=50, seed=0)
    for out in (collapsed, shifted):
        assert out["ndb_k"] > 0.3 and out["js"] > 3 * resample["js"]
        assert out["ndb"] == round(out["ndb_k"] * 50)


def test_ndb_pure_parts() -> None:
    # z-test: hand-computed pooled statistic
    z, p = two_proportion_z_test(np.array([30, 0]), 100, np.array([20, 0]), 100)
    pooled = 50 / 200
    assert z[0] == pytest.approx(0.1 / np.sqrt(pooled * (1 - pooled) * 0.02))
    assert p[0] == pytest.approx(0.1025, abs=1e-4) and z[1] == 0 and p[1] == 1
    # JS divergence in nats = scipy's Jensen-Shannon distance squared
    a, b = np.array([1.0, 2.0, 3.0, 0.0]), np.array([0.0, 1.0, 1.0, 2.0])
    assert js_divergence(a, b) == pytest.approx(jensenshannon(a, b) ** 2, rel=1e-10)
    assert js_divergence(np.array([1.0, 0.0]), np.array([0.0, 1.0])) == pytest.approx(np.log(2))
    out = ndb_from_counts(np.array([500, 500, 0]), np.array([500, 400, 100]), alpha=0.05)
    expected_js = js_divergence(np.array([5, 5, 0]), np.array([5, 4, 1]))
    assert out == {"ndb": 2, "ndb_k": 2 / 3, "js": pytest.approx(expected_js), "K": 3}
    # 20/100 real vs 33/100 generated: p = 0.0373 in both bins -> different at alpha 0.05, not at 0.03
    assert two_proportion_z_test(np.array([33]), 100, np.array([20]), 100)[1][0] == pytest.approx(0.0373, abs=1e-4)
    assert ndb_from_counts(np.array([20, 80]), np.array([33, 67]))["ndb"] == 2
    assert ndb_from_counts(np.array([20, 80]), np.array([33, 67]), alpha=0.03)["ndb"] == 0
    with pytest.raises(ValueError, match="k must be"):
        ndb(np.zeros((5, 2)), np.zeros((5, 2)), k=10)
