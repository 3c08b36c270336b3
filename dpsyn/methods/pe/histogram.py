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

Search. faiss (:mod:`dpsyn.nn_index`: on a GPU when faiss has one, else the CPU), or torch's exact matmul top-1
when faiss is absent. ``nn_index`` picks faiss's index: ``flat`` (exact ``IndexFlatL2``: the same votes as torch's
search up to ties), ``ivf`` or ``hnsw`` (approximate: a vote may land on a near-nearest synthetic sample), ``auto``
(exact below :data:`dpsyn.nn_index.AUTO_MIN_ROWS` synthetic samples and on a GPU, ``ivf`` above on a CPU). The counting
is ``np.bincount``. At 50k x 50k x 64-d the exact search is nearly all of the step's time, here and in DPSDA
(``benchmarks/pe_histogram.py``: exact flat at 0.95-1.0x DPSDA's time on one thread, identical histograms; ``ivf``
about 3x faster than exact flat).

Why an approximate index keeps sensitivity 1. The sensitivity argument above never used that the vote goes to the
*nearest* sample: it needs only that each private sample casts exactly one vote (``num_nearest`` weighted votes) and
that where it goes depends on that sample alone, not on the other private samples. An approximate index meets both
when it is trained and filled with the synthetic embeddings only: it is then a fixed function of public/synthetic
data (the population is post-processing of earlier releases), and each private query is searched against it
independently, so adding or removing one private sample adds or removes its own vote(s) and moves no other. Were the
index trained on private embeddings (IVF's k-means cells, HNSW's graph), one private sample could move the cells and
so the votes of many others: the sensitivity would no longer be 1 and the Gaussian release would not be
(mu = 1/sigma)-GDP. :func:`nearest_neighbours` therefore builds the index from ``synthetic`` only
(``tests/test_pe.py`` spies on faiss's train/add calls and checks that one added private row changes one count by 1).
An approximate index changes the utility (votes can land one neighbour off), never the privacy accounting.

DP noise comes from the generator the caller passes (:func:`dpsyn.privacy.dp_numpy_generator`: OS entropy unless
``privacy.deterministic_noise``). This module is written from the paper and methods.md, not ported from DPSDA.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

import numpy as np

from dpsyn.privacy import gaussian_mechanism

from dpsyn.nn_index import KINDS as NN_INDEXES
from dpsyn.nn_index import faiss, knn_search  # faiss: None where it is not importable (torch's search then)
from dpsyn.config.schema import KNN_BACKENDS as BACKENDS
from dpsyn.config.schema import PE_SELECTIONS as SELECTIONS

log = logging.getLogger(__name__)



def nearest_neighbours(
    private: np.ndarray, synthetic: np.ndarray, *, k: int = 1, backend: str = "auto", gpu: bool | None = None,
    batch_size: int = 8192, nn_index: str = "flat",
) -> np.ndarray:
    """Indices (n_private, k) of each private row's ``k`` nearest synthetic rows in L2 distance.

    Exact with ``nn_index="flat"`` (and with the torch backend); approximate with ``ivf`` / ``hnsw``, whose index is
    built and trained on ``synthetic`` only (the module docstring says why that keeps sensitivity 1).

    Args:
        private: (n, d) float embeddings of the private samples.
        synthetic: (m, d) float embeddings of the synthetic samples (lookahead embeddings when used).
        k: neighbours per private row.
        backend: ``faiss``, ``torch`` (blocked matmul + top-k, exact) or ``auto`` (faiss when importable).
        gpu: faiss on a GPU / torch on CUDA: None (default) = when available, False = CPU
            (:func:`dpsyn.nn_index.use_gpu`).
        batch_size: private rows per block of the torch backend.
        nn_index: faiss's index: ``flat`` (exact), ``ivf``, ``hnsw`` or ``auto`` (:func:`dpsyn.nn_index.resolve_kind`).

    Raises:
        ValueError: on shape mismatches, ``k`` larger than the synthetic set, an unknown backend or index, or an
            approximate index with the torch backend (it only searches exactly).
        ImportError: ``backend="faiss"`` or an approximate index without faiss.
    """
    private = np.ascontiguousarray(private, dtype=np.float32)
    synthetic = np.ascontiguousarray(synthetic, dtype=np.float32)
    if private.ndim != 2 or synthetic.ndim != 2 or private.shape[1] != synthetic.shape[1]:
        raise ValueError(f"embeddings must be (n, d) and (m, d) with the same d, got {private.shape} and {synthetic.shape}")
    if not 1 <= k <= len(synthetic):
        raise ValueError(f"num_nearest={k} must be between 1 and the number of synthetic samples ({len(synthetic)})")
    if backend not in BACKENDS:
        raise ValueError(f"histogram backend={backend!r}; allowed: {', '.join(BACKENDS)}")
    if nn_index not in NN_INDEXES:
        raise ValueError(f"method.nn_index={nn_index!r}; allowed: {', '.join(NN_INDEXES)}")
    if backend == "torch" and nn_index in ("ivf", "hnsw"):
        raise ValueError(f"method.nn_index={nn_index} needs faiss; method.knn_backend=torch searches exactly "
                         "(use nn_index=flat or auto, or knn_backend=faiss/auto)")
    if (backend == "faiss" or nn_index in ("ivf", "hnsw")) and faiss is None:
        raise ImportError(f"histogram backend={backend}, nn_index={nn_index} needs faiss, which is not importable: "
                          "pip install faiss-cpu (or the gpu extra: pip install -e .[gpu])")
    if len(private) == 0:
        return np.zeros((0, k), dtype=np.int64)
    if backend in ("auto", "faiss") and faiss is not None:
        # the index sees the synthetic rows only (train + add); the private rows are only queries
        return knn_search(synthetic, private, k, kind=nn_index, metric="l2", gpu=gpu, purpose="PE histogram")
    import torch

    device = "cuda" if gpu is not False and torch.cuda.is_available() else "cpu"
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
    gpu: bool | None = None,
    nn_index: str = "flat",
) -> np.ndarray:
    """The clean (noise-free) vote counts of Alg. 2 / Alg. 3: float64 (m,), L2 sensitivity 1.

    With labels (class-conditional PE), a private row of class c votes only among synthetic rows of class c; a class
    with private rows but no synthetic row is an error (its votes would have nowhere to go).

    Args:
        private, synthetic: (n, d) and (m, d) embeddings.
        private_labels, synthetic_labels: both None (unconditional) or both int arrays (conditional).
        num_nearest: each private row gives ``1/sqrt(num_nearest)`` to each of its ``num_nearest`` nearest rows.
        backend, gpu, nn_index: see :func:`nearest_neighbours` (with labels, ``auto`` decides per class on the
            class's synthetic rows).
    """
    if (private_labels is None) != (synthetic_labels is None):
        raise ValueError("give both private_labels and synthetic_labels (class-conditional PE) or neither")
    m = len(synthetic)
    counts = np.zeros(m, dtype=np.float64)
    weight = 1.0 / math.sqrt(num_nearest)
    if private_labels is None:
        ids = nearest_neighbours(private, synthetic, k=num_nearest, backend=backend, gpu=gpu, nn_index=nn_index)
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
        ids = nearest_neighbours(private[priv_rows], synthetic[syn_rows], k=num_nearest, backend=backend, gpu=gpu,
                                nn_index=nn_index)
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
    gpu: bool | None = None,
    nn_index: str = "flat",
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
                      num_nearest=num_nearest, backend=backend, gpu=gpu, nn_index=nn_index)
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
