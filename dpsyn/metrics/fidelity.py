"""Fidelity metrics on feature arrays, as staged pure functions: features -> statistics -> metric.

Every function here takes features (or logits) already extracted (see :mod:`dpsyn.metrics.features`), so it can be
tested against the reference implementations on identical inputs without any network. Conventions are pinned to
torch-fidelity's: **the first argument is the generated set, the second the real set** (torch-fidelity's
``input1`` / ``input2``); swapping them changes precision/recall, density/coverage and KID's subset draws.

- Frechet distance (FID when the features are InceptionV3's, ``fd_<extractor>`` otherwise), Heusel et al. 2017.
- KID, Binkowski et al. 2018: unbiased MMD^2 with the cubic polynomial kernel, averaged over random subsets drawn
  exactly as torch-fidelity draws them (``np.random.RandomState(seed)``, generated then real, per subset).
- Inception Score, Salimans et al. 2016, from logits (torch-fidelity's ``logits_unbiased`` layer for InceptionV3).
- Precision/recall with k-NN manifolds, Kynkaanniemi et al. 2019 (a point is inside a ball when its distance is
  ``<=`` the radius, as torch-fidelity and the paper's code).
- Density/coverage, Naeem et al. 2020 (strict ``<``, as the ``prdc`` package).

Arithmetic is float64 throughout (statistics, kernels, distances): the k-NN metrics compare distances with radii,
and float32's ``|a|^2 + |b|^2 - 2ab`` round-off (~1e-7 relative) can flip a comparison where float64's (~1e-16)
practically cannot. Pairwise distances are computed in row blocks of at most ``_BLOCK_BYTES`` with torch matmuls,
so 10k x 10k distance matrices are never held whole.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch

_SMALL_LAPACK_DIM = 256  # feature widths up to which the FD eigendecompositions run single-threaded
_BLOCK_BYTES = 32 * 2**20  # one block of squared distances (float64): 32 MiB, ~420 x 10k (measured best here)


@functools.cache
def _blas_controller() -> Any:
    from threadpoolctl import ThreadpoolController  # a scikit-learn dependency

    return ThreadpoolController()


def _single_thread_blas() -> contextlib.AbstractContextManager:
    """Limit BLAS/LAPACK to one thread: on a loaded 2-core machine a multi-threaded eigendecomposition of a 64 x 64
    matrix was measured at ~48 ms per call (threads waiting for a core) against 0.3 ms single-threaded."""
    return _blas_controller().limit(limits=1, user_api="blas")


def feature_statistics(features: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Mean and unbiased covariance (divided by N - 1, as ``np.cov``) of ``features`` (N, D), in float64.

    Raises:
        ValueError: if ``features`` is not 2-D with at least 2 rows.
    """
    f = np.array(features, dtype=np.float64)  # a copy: centred in place below
    if f.ndim != 2 or len(f) < 2:
        raise ValueError(f"need at least 2 feature rows of shape (N, D), got {f.shape}")
    mu = f.mean(axis=0)
    f -= mu
    # X^T X of one array with itself: numpy hands it to BLAS's symmetric rank-k update (half of a general matmul)
    return mu, (f.T @ f) / (len(f) - 1)


def frechet_distance(mu1: np.ndarray, sigma1: np.ndarray, mu2: np.ndarray, sigma2: np.ndarray) -> float:
    """Frechet distance between N(mu1, sigma1) and N(mu2, sigma2).

    ||mu1 - mu2||^2 + tr(sigma1) + tr(sigma2) - 2 tr((sigma1 sigma2)^{1/2}). The eigenvalues of sigma1 sigma2 are
    those of the symmetric PSD matrix sigma1^{1/2} sigma2 sigma1^{1/2}, so the trace term is the sum of square roots
    of that matrix's eigenvalues (clipped at 0): two symmetric eigendecompositions, which are faster than the general
    ``eigvals``/``sqrtm`` of the reference codes at D = 2048 and have no complex round-off on near-singular
    covariances (N < D).

    Raises:
        ValueError: on mismatched shapes.
    """
    mu1, mu2 = np.asarray(mu1, dtype=np.float64), np.asarray(mu2, dtype=np.float64)
    sigma1, sigma2 = np.asarray(sigma1, dtype=np.float64), np.asarray(sigma2, dtype=np.float64)
    d = mu1.shape[0]
    if mu1.shape != (d,) or mu2.shape != (d,) or sigma1.shape != (d, d) or sigma2.shape != (d, d):
        raise ValueError(
            f"mismatched statistics: mu1 {mu1.shape}, sigma1 {sigma1.shape}, mu2 {mu2.shape}, sigma2 {sigma2.shape}"
        )
    diff = mu1 - mu2
    with _single_thread_blas() if d <= _SMALL_LAPACK_DIM else contextlib.nullcontext():
        w, v = np.linalg.eigh(sigma1)
        sqrt_s1 = (v * np.sqrt(np.clip(w, 0, None))) @ v.T
        m = sqrt_s1 @ sigma2 @ sqrt_s1
        eig = np.linalg.eigvalsh((m + m.T) / 2)
    tr_covmean = np.sqrt(np.clip(eig, 0, None)).sum()
    return float(diff @ diff + np.trace(sigma1) + np.trace(sigma2) - 2.0 * tr_covmean)


def frechet_distance_from_features(generated: np.ndarray, real: np.ndarray) -> float:
    """``frechet_distance`` of the Gaussian fits of two feature sets (generated first, real second)."""
    return frechet_distance(*feature_statistics(generated), *feature_statistics(real))


# --------------------------------------------------------------------------------------------------------- KID


def _poly_kernel(x: np.ndarray, y: np.ndarray, *, degree: int, gamma: float, coef0: float) -> np.ndarray:
    return (gamma * (x @ y.T) + coef0) ** degree


def mmd2_unbiased(k_xx: np.ndarray, k_xy: np.ndarray, k_yy: np.ndarray) -> float:
    """Unbiased MMD^2 from kernel matrices of two equal-sized samples (m x m each).

    sum_{i != j} k(x_i, x_j) / (m (m - 1)) + sum_{i != j} k(y_i, y_j) / (m (m - 1)) - 2 sum_{i, j} k(x_i, y_j) / m^2
    (the estimator torch-fidelity's KID uses: the cross term keeps its diagonal).
    """
    m = k_xx.shape[0]
    off_xx = k_xx.sum() - np.trace(k_xx)
    off_yy = k_yy.sum() - np.trace(k_yy)
    return float((off_xx + off_yy) / (m * (m - 1)) - 2.0 * k_xy.sum() / (m * m))


def kid(
    generated: np.ndarray,
    real: np.ndarray,
    *,
    subsets: int = 100,
    subset_size: int = 1000,
    degree: int = 3,
    gamma: float | None = None,
    coef0: float = 1.0,
    seed: int = 0,
) -> tuple[float, float]:
    """Kernel Inception Distance (Binkowski et al. 2018), torch-fidelity's definition.

    For each of ``subsets`` rounds, draws ``subset_size`` generated rows then ``subset_size`` real rows without
    replacement from one ``np.random.RandomState(seed)`` (torch-fidelity's order, so the same ``seed`` gives the
    same subsets as its ``rng_seed``; torch-fidelity's default seed is 2020, ours 0), and computes the unbiased
    MMD^2 with the kernel ``(gamma <x, y> + coef0) ** degree``.

    Args:
        generated: (N_g, D) generated features.
        real: (N_r, D) real features.
        subsets: number of random subsets.
        subset_size: rows per subset (at most min(N_g, N_r)).
        degree: polynomial kernel degree.
        gamma: kernel scale; None means 1 / D.
        coef0: kernel offset.
        seed: seed of the subset draws.

    Returns:
        (mean, population standard deviation) of the subset MMD^2 values; slightly negative means are valid.

    Raises:
        ValueError: on bad shapes or a subset size larger than either set.
    """
    g, r = _check_pair(generated, real)
    if subsets < 1:
        raise ValueError(f"subsets must be >= 1, got {subsets}")
    if not 2 <= subset_size <= min(len(g), len(r)):
        raise ValueError(
            f"subset_size must be in [2, min(N_generated, N_real)] = [2, {min(len(g), len(r))}], got {subset_size}"
        )
    gamma = 1.0 / g.shape[1] if gamma is None else float(gamma)
    rng = np.random.RandomState(seed)
    values = np.empty(subsets)
    for i in range(subsets):
        x = g[rng.choice(len(g), subset_size, replace=False)]
        y = r[rng.choice(len(r), subset_size, replace=False)]
        kw = {"degree": degree, "gamma": gamma, "coef0": coef0}
        values[i] = mmd2_unbiased(_poly_kernel(x, x, **kw), _poly_kernel(x, y, **kw), _poly_kernel(y, y, **kw))
    return float(values.mean()), float(values.std())


# ------------------------------------------------------------------------------------------------ Inception Score


def inception_score(
    logits: np.ndarray, *, splits: int = 10, shuffle: bool = True, seed: int = 0
) -> tuple[float, float]:
    """Inception Score (Salimans et al. 2016) from classifier logits, torch-fidelity's definition.

    Rows are permuted with ``np.random.RandomState(seed).permutation`` when ``shuffle`` (torch-fidelity's
    ``samples_shuffle``; its default seed is 2020, ours 0), cut into ``splits`` contiguous parts at ``i * N // splits``,
    and each part scores exp(mean_i KL(p(y|x_i) || p(y))) with p(y) the part's mean of the softmax.

    Args:
        logits: (N, C) logits (for InceptionV3, torch-fidelity's ``logits_unbiased``).
        splits: number of parts.
        shuffle: permute rows before splitting.
        seed: seed of the permutation.

    Returns:
        (mean, population standard deviation) over the parts.

    Raises:
        ValueError: if ``logits`` is not 2-D or has fewer rows than ``splits``.
    """
    z = np.asarray(logits, dtype=np.float64)
    if z.ndim != 2 or z.shape[1] < 2:
        raise ValueError(f"logits must be (N, C) with C >= 2, got {z.shape}")
    if not 1 <= splits <= len(z):
        raise ValueError(f"splits must be in [1, N={len(z)}], got {splits}")
    if shuffle:
        z = z[np.random.RandomState(seed).permutation(len(z))]
    log_p = torch.from_numpy(z).log_softmax(dim=1)
    p = log_p.exp()
    n = len(z)
    scores = []
    for i in range(splits):
        lo, hi = i * n // splits, (i + 1) * n // splits
        log_q = p[lo:hi].mean(dim=0).log()
        kl = (p[lo:hi] * (log_p[lo:hi] - log_q)).sum(dim=1).mean()
        scores.append(float(kl.exp()))
    return float(np.mean(scores)), float(np.std(scores))


# ------------------------------------------------------------------------------------------- k-NN manifold metrics


def _check_pair(generated: np.ndarray, real: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    g = np.ascontiguousarray(generated, dtype=np.float64)
    r = np.ascontiguousarray(real, dtype=np.float64)
    if g.ndim != 2 or r.ndim != 2 or g.shape[1] != r.shape[1]:
        raise ValueError(f"need two (N, D) feature arrays with the same D, got generated {g.shape} and real {r.shape}")
    if not (np.isfinite(g).all() and np.isfinite(r).all()):
        raise ValueError("features contain NaN or inf")
    return g, r


def _check_k(k: int, *sizes: int) -> None:
    if not 1 <= k < min(sizes):
        raise ValueError(f"k must be in [1, N - 1] for every set (sizes {sizes}), got {k}")


def _block_rows(n_cols: int) -> int:
    return max(1, _BLOCK_BYTES // (8 * n_cols))


def _squared_distance_blocks(a: torch.Tensor, b: torch.Tensor) -> Iterator[tuple[int, int, torch.Tensor]]:
    """Yield ``(start, stop, block)``: squared Euclidean distances of rows a[start:stop] to every row of b.

    One matmul per block writes |a_i|^2 + |b_j|^2 - 2 a_i.b_j directly, from rows augmented as [a, |a|^2, 1] and
    [-2 b, 1, |b|^2], into a buffer reused across blocks (no per-block allocation, no extra passes over the block).
    Float64 round-off is ~1e-16 of the squared norms; values can be a hair below 0 for (near-)identical rows, which
    no comparison with a radius or minimum below is sensitive to. The block is overwritten by the next one.
    """
    a_sq, b_sq = (a * a).sum(1, keepdim=True), (b * b).sum(1, keepdim=True)
    a_aug = torch.cat([a, a_sq, torch.ones_like(a_sq)], dim=1)
    b_aug_t = torch.cat([-2.0 * b, torch.ones_like(b_sq), b_sq], dim=1).T.contiguous()
    step = _block_rows(len(b))
    buffer = torch.empty(min(step, len(a)), len(b), dtype=a.dtype)
    for start in range(0, len(a), step):
        stop = min(start + step, len(a))
        block = buffer[: stop - start]
        torch.mm(a_aug[start:stop], b_aug_t, out=block)
        yield start, stop, block


def _knn_squared_radii(f: torch.Tensor, k: int) -> torch.Tensor:
    radii = torch.empty(len(f), dtype=f.dtype)
    for start, stop, block in _squared_distance_blocks(f, f):
        # (k+1)-th smallest with the point itself included: the reference codes' kthvalue(k + 1) / argpartition(k + 1)
        # (topk is several times faster than kthvalue on CPU)
        radii[start:stop] = block.topk(k + 1, dim=1, largest=False, sorted=True).values[:, -1]
    return radii.clamp_(min=0.0)


def real_squared_knn_radii(real: np.ndarray, *, k: int) -> torch.Tensor:
    """The squared k-NN radii :func:`precision_recall` computes for its real set, to pass back as
    ``real_squared_radii`` when that set is scored again."""
    r = np.ascontiguousarray(real, dtype=np.float64)
    _check_k(k, len(r))
    return _knn_squared_radii(torch.from_numpy(r), k)


def knn_radii(features: np.ndarray, *, k: int) -> np.ndarray:
    """Distance of each row to its k-th nearest neighbour in the same set (the row itself not counted).

    Computed as the (k+1)-th smallest distance with the row itself included, as torch-fidelity and prdc do (so an
    exact duplicate of a row counts as a neighbour at distance 0).

    Raises:
        ValueError: if ``features`` is not (N, D) or k is not in [1, N - 1].
    """
    f, _ = _check_pair(features, features)
    _check_k(k, len(f))
    return _knn_squared_radii(torch.from_numpy(f), k).sqrt().numpy()


def precision_recall(generated: np.ndarray, real: np.ndarray, *, k: int = 3,
                     real_squared_radii: torch.Tensor | None = None) -> dict[str, float]:
    """Improved precision and recall (Kynkaanniemi et al. 2019) with k-NN manifold estimates.

    Precision: the fraction of generated samples within (``<=``) the k-NN radius of at least one real sample.
    Recall: the fraction of real samples within the k-NN radius of at least one generated sample.
    Identical to torch-fidelity's ``prc`` with ``prc_neighborhood=k`` (input1 = generated, input2 = real); prdc's
    ``compute_prdc(real, fake)`` uses a strict ``<`` and so differs only where a distance equals a radius exactly.

    Args:
        generated: (N_g, D) generated features.
        real: (N_r, D) real features.
        k: neighbourhood size (the paper's default 3).
        real_squared_radii: the real set's squared k-NN radii (:func:`real_squared_knn_radii`), when the same real
            set is scored many times (PE's per-iteration monitor): computed here otherwise.

    Returns:
        ``{"precision": ..., "recall": ...}``.

    Raises:
        ValueError: on bad shapes, non-finite values, or k outside [1, N - 1].
    """
    g, r = _check_pair(generated, real)
    _check_k(k, len(g), len(r))
    gt, rt = torch.from_numpy(g), torch.from_numpy(r)
    if real_squared_radii is None:
        real_r2 = _knn_squared_radii(rt, k)
    elif real_squared_radii.shape != (len(r),):
        raise ValueError(f"real_squared_radii of shape {tuple(real_squared_radii.shape)} for {len(r)} real rows")
    else:
        real_r2 = real_squared_radii.to(rt.dtype)
    gen_r2 = _knn_squared_radii(gt, k)
    precise = torch.zeros(len(g), dtype=torch.bool)
    recalled = torch.zeros(len(r), dtype=torch.bool)
    mask = torch.empty(min(_block_rows(len(r)), len(g)), len(r), dtype=torch.bool)
    for start, stop, block in _squared_distance_blocks(gt, rt):  # block[i, j] = |g_i - r_j|^2
        m = mask[: stop - start]
        precise[start:stop] = torch.le(block, real_r2.unsqueeze(0), out=m).any(dim=1)
        recalled |= torch.le(block, gen_r2[start:stop, None], out=m).any(dim=0)
    return {"precision": precise.double().mean().item(), "recall": recalled.double().mean().item()}


def density_coverage(generated: np.ndarray, real: np.ndarray, *, k: int = 5) -> dict[str, float]:
    """Density and coverage (Naeem et al. 2020), prdc's definitions.

    Density: (1 / (k N_g)) sum_i #{real j : |g_i - r_j| < R_j}, with R_j real sample j's k-NN radius (can exceed 1).
    Coverage: the fraction of real samples whose nearest generated sample lies strictly within their own k-NN radius.
    Identical to ``prdc.compute_prdc(real, generated, k)["density" / "coverage"]``.

    Args:
        generated: (N_g, D) generated features.
        real: (N_r, D) real features.
        k: neighbourhood size (the paper's default 5).

    Returns:
        ``{"density": ..., "coverage": ...}``.

    Raises:
        ValueError: on bad shapes, non-finite values, or k outside [1, N_real - 1].
    """
    g, r = _check_pair(generated, real)
    _check_k(k, len(r))
    gt, rt = torch.from_numpy(g), torch.from_numpy(r)
    real_r2 = _knn_squared_radii(rt, k)
    inside = torch.zeros(len(g), dtype=torch.float64)
    nearest_gen = torch.full((len(r),), torch.inf, dtype=torch.float64)
    mask = torch.empty(min(_block_rows(len(r)), len(g)), len(r), dtype=torch.bool)
    for start, stop, block in _squared_distance_blocks(gt, rt):
        inside[start:stop] = torch.lt(block, real_r2.unsqueeze(0), out=mask[: stop - start]).sum(dim=1).double()
        torch.minimum(nearest_gen, block.min(dim=0).values, out=nearest_gen)
    return {
        "density": inside.mean().item() / k,
        "coverage": (nearest_gen < real_r2).double().mean().item(),
    }
