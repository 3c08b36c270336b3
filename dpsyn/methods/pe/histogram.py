"""PE's DP nearest-neighbour histogram (Lin et al. 2023, Alg. 2) and its parent selection.

Every private sample votes for its nearest synthetic sample in an embedding space::

    count[j] = #{x in S_priv : argmin_i d(Phi(x), Phi'(z_i)) = j}
    count   += N(0, sigma^2)                      (one Gaussian per synthetic sample)
    count    = max(count - H, 0)                  (threshold H: small noisy counts are zeroed)

``Phi'(z)`` is the *lookahead* embedding: the mean embedding of k variations of z (k = 0: Phi(z) itself), which
scores a candidate by where its offspring land rather than by where it is.

Sensitivity. Adding or removing one private sample changes one count by 1 (with ``num_nearest = m`` neighbours each
of m counts by ``1/sqrt(m)``, as DPSDA normalises the votes): the histogram has L2 sensitivity 1, so one histogram
is one sensitivity-1 Gaussian release with noise multiplier sigma, whatever the data. The class-conditional variant
(Alg. 3) lets a private sample of class c vote only among the synthetic samples of class c: each private sample still
votes once, the per-class histograms are disjoint parts of one vector, and the whole is still one release of
sensitivity 1 (parallel composition).

Search. faiss's exact ``IndexFlatL2`` (a GPU index when faiss has GPUs and the caller asks for one), or torch's exact
matmul top-1 when faiss is absent: both exact, so they give the same votes up to ties. The counting is
``np.bincount``. At 50k x 50k x 64-d the exact faiss search is nearly all of the step's time, here and in DPSDA
(``benchmarks/pe_histogram.py``: 0.95-1.0x DPSDA's time on one thread, identical histograms).

DP noise comes from the generator the caller passes (:func:`dpsyn.privacy.dp_numpy_generator`: OS entropy unless
``privacy.deterministic_noise``). This module is written from the paper and methods.md, not ported from DPSDA.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

import numpy as np

from dpsyn.privacy import gaussian_mechanism

try:  # faiss-cpu is a dependency; faiss-gpu on GPU machines. torch's exact search is the fallback.
    import faiss
except ImportError:  # pragma: no cover - exercised only where faiss is missing
    faiss = None

log = logging.getLogger(__name__)

BACKENDS: tuple[str, ...] = ("auto", "faiss", "torch")
SELECTIONS: tuple[str, ...] = ("sample", "rank")


def nearest_neighbours(
    private: np.ndarray, synthetic: np.ndarray, *, k: int = 1, backend: str = "auto", gpu: bool = False,
    batch_size: int = 8192,
) -> np.ndarray:
    """Indices (n_private, k) of each private row's ``k`` nearest synthetic rows in L2 distance (exact search).

    Args:
        private: (n, d) float embeddings of the private samples.
        synthetic: (m, d) float embeddings of the synthetic samples (lookahead embeddings when used).
        k: neighbours per private row.
        backend: ``faiss`` (``IndexFlatL2``), ``torch`` (blocked matmul + top-k) or ``auto`` (faiss when importable).
        gpu: put the faiss index on a GPU (faiss-gpu) / run torch on CUDA, when available.
        batch_size: private rows per block of the torch backend.

    Raises:
        ValueError: on shape mismatches, ``k`` larger than the synthetic set, or an unknown backend.
    """
    private = np.ascontiguousarray(private, dtype=np.float32)
    synthetic = np.ascontiguousarray(synthetic, dtype=np.float32)
    if private.ndim != 2 or synthetic.ndim != 2 or private.shape[1] != synthetic.shape[1]:
        raise ValueError(f"embeddings must be (n, d) and (m, d) with the same d, got {private.shape} and {synthetic.shape}")
    if not 1 <= k <= len(synthetic):
        raise ValueError(f"num_nearest={k} must be between 1 and the number of synthetic samples ({len(synthetic)})")
    if backend not in BACKENDS:
        raise ValueError(f"histogram backend={backend!r}; allowed: {', '.join(BACKENDS)}")
    if backend == "faiss" and faiss is None:
        raise ImportError("histogram backend=faiss but faiss is not importable: pip install faiss-cpu (or faiss-gpu)")
    if len(private) == 0:
        return np.zeros((0, k), dtype=np.int64)
    if backend in ("auto", "faiss") and faiss is not None:
        index = faiss.IndexFlatL2(synthetic.shape[1])
        if gpu and hasattr(faiss, "StandardGpuResources") and faiss.get_num_gpus() > 0:
            index = faiss.index_cpu_to_gpu(faiss.StandardGpuResources(), 0, index)
        index.add(synthetic)
        _, ids = index.search(private, k)
        return ids.astype(np.int64)
    import torch

    device = "cuda" if gpu and torch.cuda.is_available() else "cpu"
    syn = torch.from_numpy(synthetic).to(device)
    syn_sq = (syn * syn).sum(1)
    out = np.empty((len(private), k), dtype=np.int64)
    for start in range(0, len(private), batch_size):
        p = torch.from_numpy(private[start:start + batch_size]).to(device)
        # ||p - s||^2 = ||p||^2 - 2 p.s + ||s||^2; ||p||^2 is constant per row, so it does not change the ranking
        score = syn_sq[None, :] - 2.0 * (p @ syn.T)
        out[start:start + len(p)] = torch.topk(score, k, dim=1, largest=False).indices.cpu().numpy()
    return out


def nn_counts(
    private: np.ndarray,
    synthetic: np.ndarray,
    *,
    private_labels: np.ndarray | None = None,
    synthetic_labels: np.ndarray | None = None,
    num_nearest: int = 1,
    backend: str = "auto",
    gpu: bool = False,
) -> np.ndarray:
    """The clean (noise-free) vote counts of Alg. 2 / Alg. 3: float64 (m,), L2 sensitivity 1.

    With labels (class-conditional PE), a private row of class c votes only among synthetic rows of class c; a class
    with private rows but no synthetic row is an error (its votes would have nowhere to go).

    Args:
        private, synthetic: (n, d) and (m, d) embeddings.
        private_labels, synthetic_labels: both None (unconditional) or both int arrays (conditional).
        num_nearest: each private row gives ``1/sqrt(num_nearest)`` to each of its ``num_nearest`` nearest rows.
        backend, gpu: see :func:`nearest_neighbours`.
    """
    if (private_labels is None) != (synthetic_labels is None):
        raise ValueError("give both private_labels and synthetic_labels (class-conditional PE) or neither")
    m = len(synthetic)
    counts = np.zeros(m, dtype=np.float64)
    weight = 1.0 / math.sqrt(num_nearest)
    if private_labels is None:
        ids = nearest_neighbours(private, synthetic, k=num_nearest, backend=backend, gpu=gpu)
        counts += np.bincount(ids.ravel(), minlength=m) * weight
        return counts
    private_labels = np.asarray(private_labels)
    synthetic_labels = np.asarray(synthetic_labels)
    if len(private_labels) != len(private) or len(synthetic_labels) != m:
        raise ValueError("labels must have one entry per embedding row")
    for c in np.unique(private_labels):
        syn_rows = np.flatnonzero(synthetic_labels == c)
        if len(syn_rows) == 0:
            raise ValueError(f"class {c} has private samples but no synthetic sample to vote for")
        priv_rows = np.flatnonzero(private_labels == c)
        ids = nearest_neighbours(private[priv_rows], synthetic[syn_rows], k=num_nearest, backend=backend, gpu=gpu)
        counts += np.bincount(syn_rows[ids.ravel()], minlength=m) * weight
    return counts


@dataclass
class Histogram:
    """One DP nearest-neighbour histogram.

    Attributes:
        clean: the vote counts before noise. Never released: kept only in memory for tests and diagnostics.
        noisy: ``clean + N(0, sigma^2)`` (the DP release).
        thresholded: ``max(noisy - threshold, 0)`` (post-processing of the release).
        noise_multiplier: sigma (0 = no noise: a non-private run).
        threshold: H.
    """

    clean: np.ndarray
    noisy: np.ndarray
    thresholded: np.ndarray
    noise_multiplier: float
    threshold: float


def dp_nn_histogram(
    private: np.ndarray,
    synthetic: np.ndarray,
    *,
    noise_multiplier: float,
    threshold: float,
    rng: np.random.Generator | None,
    private_labels: np.ndarray | None = None,
    synthetic_labels: np.ndarray | None = None,
    num_nearest: int = 1,
    backend: str = "auto",
    gpu: bool = False,
) -> Histogram:
    """Alg. 2 (Alg. 3 with labels): vote counts, Gaussian noise of std ``noise_multiplier`` on every count, threshold.

    Args:
        noise_multiplier: sigma; 0 only for a non-private run (then ``rng`` may be None).
        threshold: H >= 0, subtracted from every noisy count before clamping at 0.
        rng: the DP noise generator (:func:`dpsyn.privacy.dp_numpy_generator`).
        other arguments: see :func:`nn_counts`.

    Raises:
        ValueError: for a negative sigma or threshold, or sigma > 0 without a generator.
    """
    if not noise_multiplier >= 0 or not math.isfinite(noise_multiplier):
        raise ValueError(f"noise_multiplier={noise_multiplier!r} must be a finite number >= 0")
    if not threshold >= 0:
        raise ValueError(f"threshold={threshold!r} must be >= 0")
    if noise_multiplier > 0 and rng is None:
        raise ValueError("a DP histogram needs its noise generator (rng)")
    clean = nn_counts(private, synthetic, private_labels=private_labels, synthetic_labels=synthetic_labels,
                      num_nearest=num_nearest, backend=backend, gpu=gpu)
    noisy = gaussian_mechanism(clean, noise_multiplier, generator=rng) if noise_multiplier > 0 else clean.copy()
    return Histogram(clean=clean, noisy=noisy, thresholded=np.maximum(noisy - threshold, 0.0),
                     noise_multiplier=float(noise_multiplier), threshold=float(threshold))


def select_parents(
    weights: np.ndarray,
    n: int,
    *,
    mode: str,
    rng: np.random.Generator,
    rank_keep: float = 0.5,
    labels: np.ndarray | None = None,
    per_class: dict[int, int] | None = None,
) -> tuple[np.ndarray, str]:
    """Indices of the parents of the next population, drawn from the thresholded histogram (post-processing).

    ``sample`` (the paper's): ``n`` i.i.d. draws with probability ``weights / sum(weights)``. ``rank``: the top
    ``ceil(rank_keep * n)`` rows by weight, repeated in turn to fill ``n`` (each parent gets about ``1/rank_keep``
    children). With ``labels`` and ``per_class`` (class-conditional PE), class c's ``per_class[c]`` parents are
    chosen among its own rows with its own weights. A group whose weights are all 0 (every noisy count below the
    threshold) falls back to uniform weights over its rows, and the returned note says so.

    Returns:
        (indices into ``weights``, a note: "" or which groups fell back to uniform).
    """
    if mode not in SELECTIONS:
        raise ValueError(f"method.selection={mode!r}; allowed: {', '.join(SELECTIONS)}")
    if not 0 < rank_keep <= 1:
        raise ValueError(f"method.rank_keep={rank_keep!r} must be in (0, 1]")
    weights = np.asarray(weights, dtype=np.float64)
    groups = [(None, np.arange(len(weights)), n)] if labels is None else [
        (c, np.flatnonzero(np.asarray(labels) == c), k) for c, k in sorted((per_class or {}).items())
    ]
    chosen, empty = [], []
    for c, rows, k in groups:
        if k == 0:
            continue
        if len(rows) == 0:
            raise ValueError(f"no synthetic sample of class {c} to select from")
        w = weights[rows]
        if not w.sum() > 0:
            empty.append("all" if c is None else str(c))
            w = np.ones(len(rows))
        if mode == "sample":
            chosen.append(rows[rng.choice(len(rows), size=k, replace=True, p=w / w.sum())])
        else:
            keep = max(1, math.ceil(rank_keep * k))
            top = rows[np.argsort(-w, kind="stable")[:keep]]
            chosen.append(np.resize(top, k))
    note = f"all counts below the threshold (uniform parents) for: {', '.join(empty)}" if empty else ""
    return np.concatenate(chosen) if chosen else np.zeros(0, dtype=np.int64), note
