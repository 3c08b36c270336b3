"""NDB: the number of statistically different bins (Richardson & Weiss, "On GANs and GMMs", NeurIPS 2018).

The real training samples are clustered into K bins with K-means; every real training sample and every generated
sample is assigned to its nearest centroid; for each bin a two-proportion z-test (pooled proportion, two-sided)
asks whether the generated share of that bin differs from the real share at significance ``alpha``. NDB is the
number of bins where it does, NDB/K its fraction (about ``alpha`` for a model that matches the data, well above for
one that drops or over-produces modes). The Jensen-Shannon divergence between the two bin histograms is reported
beside it.

Samples may be images (flattened to pixel vectors, as in the paper) or feature vectors. The staged pure functions
(:func:`two_proportion_z_test`, :func:`js_divergence`, :func:`ndb_from_counts`) are testable without K-means.
"""

from __future__ import annotations

import logging

import numpy as np
from scipy import stats

log = logging.getLogger(__name__)


def two_proportion_z_test(
    count1: np.ndarray, n1: int, count2: np.ndarray, n2: int
) -> tuple[np.ndarray, np.ndarray]:
    """Two-sided two-proportion z-test with the pooled proportion, elementwise over bins.

    p = (count1 + count2) / (n1 + n2), z = (count1 / n1 - count2 / n2) / sqrt(p (1 - p) (1 / n1 + 1 / n2)),
    p-value = 2 (1 - Phi(|z|)). A bin empty (or full) in both samples has z = 0 and p-value 1.

    Returns:
        (z, p_value) arrays.
    """
    c1, c2 = np.asarray(count1, dtype=np.float64), np.asarray(count2, dtype=np.float64)
    p1, p2 = c1 / n1, c2 / n2
    pooled = (c1 + c2) / (n1 + n2)
    se = np.sqrt(pooled * (1.0 - pooled) * (1.0 / n1 + 1.0 / n2))
    with np.errstate(divide="ignore", invalid="ignore"):
        z = np.where(se > 0, (p1 - p2) / np.where(se > 0, se, 1.0), 0.0)
    return z, 2.0 * stats.norm.sf(np.abs(z))


def js_divergence(p: np.ndarray, q: np.ndarray) -> float:
    """Jensen-Shannon divergence (natural log, so in [0, ln 2]) between two histograms (normalised here).

    JS(p, q) = KL(p || m) / 2 + KL(q || m) / 2 with m = (p + q) / 2 and 0 log 0 = 0. This is the divergence, the
    square of scipy's ``jensenshannon`` distance.

    Raises:
        ValueError: on negative entries, an all-zero histogram or mismatched lengths.
    """
    p, q = np.asarray(p, dtype=np.float64), np.asarray(q, dtype=np.float64)
    if p.shape != q.shape or p.ndim != 1:
        raise ValueError(f"histograms must be 1-D of the same length, got {p.shape} and {q.shape}")
    if (p < 0).any() or (q < 0).any() or p.sum() <= 0 or q.sum() <= 0:
        raise ValueError("histograms must be non-negative with a positive total")
    p, q = p / p.sum(), q / q.sum()
    m = (p + q) / 2

    def kl(a: np.ndarray) -> float:
        nz = a > 0
        return float((a[nz] * np.log(a[nz] / m[nz])).sum())

    return max(0.0, 0.5 * kl(p) + 0.5 * kl(q))


def ndb_from_counts(real_counts: np.ndarray, generated_counts: np.ndarray, *, alpha: float = 0.05) -> dict[str, float]:
    """NDB, NDB/K and JS from per-bin sample counts (real first, generated second).

    Returns:
        ``{"ndb": int, "ndb_k": float, "js": float, "K": int}``.

    Raises:
        ValueError: on mismatched shapes, empty samples, or alpha outside (0, 1).
    """
    rc, gc = np.asarray(real_counts), np.asarray(generated_counts)
    if rc.shape != gc.shape or rc.ndim != 1:
        raise ValueError(f"bin counts must be 1-D of the same length, got {rc.shape} and {gc.shape}")
    if not 0 < alpha < 1:
        raise ValueError(f"alpha must be in (0, 1), got {alpha}")
    n_real, n_gen = int(rc.sum()), int(gc.sum())
    if n_real == 0 or n_gen == 0:
        raise ValueError("both samples must be non-empty")
    _, p_values = two_proportion_z_test(gc, n_gen, rc, n_real)
    different = int((p_values < alpha).sum())
    k = len(rc)
    return {"ndb": different, "ndb_k": different / k, "js": js_divergence(rc, gc), "K": k}


def _flatten(x: np.ndarray, name: str) -> np.ndarray:
    a = np.asarray(x)
    if a.ndim < 2 or len(a) == 0:
        raise ValueError(f"{name} must be (N, ...) with N > 0, got shape {a.shape}")
    return np.ascontiguousarray(a.reshape(len(a), -1), dtype=np.float64)


def ndb(
    generated: np.ndarray,
    real_train: np.ndarray,
    *,
    k: int = 100,
    alpha: float = 0.05,
    seed: int = 0,
    max_fit_samples: int | None = None,
    n_init: int = 1,
) -> dict[str, float]:
    """NDB/K of ``generated`` against the real training samples (Richardson & Weiss 2018).

    Args:
        generated: (N_g, ...) generated samples (images or features; flattened per row).
        real_train: (N_r, ...) real TRAINING samples, same layout: K-means is fitted on them and their bin shares
            are the reference proportions.
        k: number of K-means bins (the paper's default 100).
        alpha: significance level of each bin's test.
        seed: K-means seed (and of the fitting subsample).
        max_fit_samples: fit K-means on at most this many real rows drawn without replacement (all real rows are
            still binned); None fits on all of them.
        n_init: K-means restarts (sklearn's ``n_init``), stated here so sklearn's changing default does not apply.

    Returns:
        ``{"ndb": number of different bins, "ndb_k": ndb / K, "js": JS divergence (natural log) of the real and
        generated bin histograms, "K": K}``.

    Raises:
        ValueError: on mismatched dimensions, fewer real rows than bins, or bad ``k``.
    """
    from sklearn.cluster import KMeans

    g, r = _flatten(generated, "generated"), _flatten(real_train, "real_train")
    if g.shape[1] != r.shape[1]:
        raise ValueError(f"generated rows have {g.shape[1]} values, real rows {r.shape[1]}")
    if not 2 <= k <= len(r):
        raise ValueError(f"k must be in [2, N_real={len(r)}], got {k}")
    fit = r
    if max_fit_samples is not None and max_fit_samples < len(r):
        if max_fit_samples < k:
            raise ValueError(f"max_fit_samples ({max_fit_samples}) must be at least k ({k})")
        fit = r[np.random.default_rng(seed).choice(len(r), max_fit_samples, replace=False)]
    km = KMeans(n_clusters=k, n_init=n_init, random_state=seed).fit(fit)
    real_counts = np.bincount(km.predict(r), minlength=k)
    gen_counts = np.bincount(km.predict(g), minlength=k)
    out = ndb_from_counts(real_counts, gen_counts, alpha=alpha)
    log.info("NDB %d/%d bins differ (alpha %.3g), JS %.4g", out["ndb"], k, alpha, out["js"])
    return out
