"""Fidelity metrics as staged pure functions: features -> statistics -> metric (torch-fidelity's layout)."""

from __future__ import annotations

import numpy as np
from scipy import linalg


def feature_statistics(features: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Mean and (unbiased) covariance of ``features`` (N, D), in float64."""
    f = np.asarray(features, dtype=np.float64)
    if f.ndim != 2 or len(f) < 2:
        raise ValueError(f"need at least 2 feature rows of shape (N, D), got {f.shape}")
    return f.mean(axis=0), np.cov(f, rowvar=False)


def frechet_distance(mu1: np.ndarray, sigma1: np.ndarray, mu2: np.ndarray, sigma2: np.ndarray) -> float:
    """Frechet distance between N(mu1, sigma1) and N(mu2, sigma2).

    ||mu1 - mu2||^2 + tr(sigma1 + sigma2 - 2 (sigma1 sigma2)^{1/2}); the trace of the matrix square root is taken
    as the sum of the square roots of the eigenvalues of sigma1 sigma2 (real, non-negative up to round-off), which
    avoids ``sqrtm``'s complex round-off on near-singular covariances.
    """
    diff = mu1 - mu2
    eig = linalg.eigvals(sigma1 @ sigma2)
    tr_covmean = np.sqrt(np.clip(eig.real, 0, None)).sum()
    return float(diff @ diff + np.trace(sigma1) + np.trace(sigma2) - 2.0 * tr_covmean)


def frechet_distance_from_features(generated: np.ndarray, real: np.ndarray) -> float:
    """``frechet_distance`` of the Gaussian fits of two feature sets (generated first, real second)."""
    return frechet_distance(*feature_statistics(generated), *feature_statistics(real))
