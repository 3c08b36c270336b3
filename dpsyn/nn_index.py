"""The faiss nearest-neighbour searches of dpsyn: which index (exact or approximate) and where it runs (GPU or CPU).

Two searches use it: PE's DP histogram (:mod:`dpsyn.methods.pe.histogram`: private queries against the synthetic
population) and the IC-GAN neighbourhoods (:func:`dpsyn.public.icgan.knn_indices`: public rows against themselves).
Both go through :func:`knn_search`, so the device choice and its log line are made in one place.

Index kinds (``kind``):

* ``flat``: faiss's exact ``IndexFlatL2`` / ``IndexFlatIP`` (BLAS matrix products; the reference).
* ``ivf``: ``IndexIVFFlat``, an inverted file: k-means cells over the indexed rows, each query scans the ``nprobe``
  cells nearest to it. ``nlist`` ~ sqrt(rows) cells and ``nprobe`` ~ nlist / 28 (about 3.5 % of the rows scanned per
  query): at 50k x 50k x 64-d on one CPU thread that is about 3x faster than ``flat`` including the k-means training
  (``benchmarks/pe_histogram.py``). The k-means runs 10 iterations on at most 64 rows per cell (a seeded subsample
  of the indexed rows): its cost is small beside the search.
* ``hnsw``: ``IndexHNSWFlat`` (M = 16 links, efConstruction = 40, efSearch = 32): higher agreement with ``flat`` than
  ``ivf``, but its graph is built one row at a time, which on one CPU thread costs about as much as the exact search.
* ``auto``: ``flat`` below :data:`AUTO_MIN_ROWS` indexed rows (there the exact search takes a second or less and an
  approximate one saves nothing worth its error) or on a GPU (exact search of 50k x 50k takes milliseconds there),
  ``ivf`` from :data:`AUTO_MIN_ROWS` rows on, on a CPU.

An approximate search may leave a query with fewer than ``k`` results (an IVF cell can be empty); such queries are
searched again exactly, so every query always gets ``k`` neighbours.

What the index sees. :func:`build_index` trains (k-means / graph) and fills the index with ``rows`` only; queries are
only searched, one at a time, and never change it. For PE that is what keeps the histogram's sensitivity at 1 with an
approximate index (see :mod:`dpsyn.methods.pe.histogram`): do not pass private rows as ``rows``.

Device. The index goes to GPU 0 when faiss has GPU support (``pip install -e .[gpu]``: the faiss-gpu wheel) and
sees a CUDA device (``StandardGpuResources`` exists and ``get_num_gpus() > 0``), else it stays on the CPU; ``gpu=False``
forces the CPU. faiss has no GPU HNSW: ``hnsw`` always runs on the CPU. The first search of each kind and device logs
one INFO line saying which index was used.
"""

from __future__ import annotations

import logging
import math
from typing import Any

import numpy as np
from dpsyn.config.schema import NN_INDEXES as KINDS

try:  # faiss-cpu is a dependency; faiss-gpu (the `gpu` extra) replaces it on GPU machines
    import faiss
except ImportError:  # pragma: no cover - exercised only where faiss is missing
    faiss = None

log = logging.getLogger(__name__)

METRICS: tuple[str, ...] = ("l2", "ip")
AUTO_MIN_ROWS = 20_000
"""``auto`` picks ``ivf`` from this many indexed rows on (CPU). Below it the exact search costs about a second or less
(20k x 20k x 64-d on one thread), and the population sizes of the CPU profiles (PE: 500-2000) stay exact."""

IVF_TRAIN_ITERATIONS = 10
IVF_POINTS_PER_CELL = 64  # k-means trains on at most this many rows per cell (faiss subsamples, seeded)
IVF_PROBE_FRACTION = 28  # nprobe = nlist / 28 (rounded, >= 1)
HNSW_M = 16
HNSW_EF_CONSTRUCTION = 40
HNSW_EF_SEARCH = 32

_logged: set[str] = set()
_gpu_resources: Any = None


def faiss_gpu_available() -> bool:
    """Whether faiss can put an index on a GPU: a build with GPU support (faiss-gpu) that sees a CUDA device."""
    if faiss is None or not hasattr(faiss, "StandardGpuResources"):
        return False
    try:
        return faiss.get_num_gpus() > 0
    except Exception:  # a GPU build without a usable driver raises instead of answering 0
        return False


def use_gpu(gpu: bool | None = None) -> bool:
    """The device decision: ``gpu=None`` (the default) means "a GPU when faiss has one", ``False`` forces the CPU,
    ``True`` asks for the GPU and falls back to the CPU (with the log line saying so) when faiss has none."""
    return gpu is not False and faiss_gpu_available()


def ivf_params(n_rows: int) -> tuple[int, int]:
    """(nlist, nprobe) of the ``ivf`` index for ``n_rows`` indexed rows.

    nlist ~ sqrt(n_rows), and at most n_rows / 39 so that k-means has the 39 rows per cell faiss asks for;
    nprobe ~ nlist / :data:`IVF_PROBE_FRACTION`, at least 1.
    """
    nlist = max(1, min(round(math.sqrt(n_rows)), n_rows // 39))
    return nlist, max(1, round(nlist / IVF_PROBE_FRACTION))


def resolve_kind(kind: str, n_rows: int, *, gpu: bool) -> str:
    """The concrete index kind (``flat``, ``ivf`` or ``hnsw``) for ``kind`` over ``n_rows`` indexed rows.

    Raises:
        ValueError: an unknown kind.
    """
    if kind not in KINDS:
        raise ValueError(f"nn_index={kind!r}; allowed: {', '.join(KINDS)}")
    if kind != "auto":
        return kind
    return "ivf" if not gpu and n_rows >= AUTO_MIN_ROWS else "flat"


def _log_once(message: str) -> None:
    if message not in _logged:
        _logged.add(message)
        log.info(message)


def _resources() -> Any:
    """One ``StandardGpuResources`` per process: each one reserves a slice of GPU memory for temporary buffers."""
    global _gpu_resources
    if _gpu_resources is None:
        _gpu_resources = faiss.StandardGpuResources()
    return _gpu_resources


def build_index(rows: np.ndarray, *, kind: str = "flat", metric: str = "l2", gpu: bool | None = None
                ) -> tuple[Any, str]:
    """A faiss index trained on and filled with ``rows`` only, and a one-line description of it.

    Args:
        rows: (m, d) float32, C-contiguous: the only rows the index ever sees (training and content).
        kind: ``flat``, ``ivf``, ``hnsw`` or ``auto`` (see the module docstring).
        metric: ``l2`` (squared Euclidean) or ``ip`` (inner product).
        gpu: see :func:`use_gpu`.

    Raises:
        ImportError: faiss is not importable.
        ValueError: an unknown kind or metric.
    """
    if faiss is None:
        raise ImportError("faiss is not importable: pip install faiss-cpu (or the gpu extra: pip install -e .[gpu])")
    if metric not in METRICS:
        raise ValueError(f"metric={metric!r}; allowed: {', '.join(METRICS)}")
    on_gpu = use_gpu(gpu)
    kind = resolve_kind(kind, len(rows), gpu=on_gpu)
    m, d = rows.shape
    faiss_metric = faiss.METRIC_L2 if metric == "l2" else faiss.METRIC_INNER_PRODUCT
    if kind == "flat":
        index = faiss.IndexFlatL2(d) if metric == "l2" else faiss.IndexFlatIP(d)
        what = type(index).__name__
    elif kind == "ivf":
        nlist, nprobe = ivf_params(m)
        quantizer = faiss.IndexFlatL2(d) if metric == "l2" else faiss.IndexFlatIP(d)
        index = faiss.IndexIVFFlat(quantizer, d, nlist, faiss_metric)
        index.cp.niter = IVF_TRAIN_ITERATIONS
        index.cp.max_points_per_centroid = IVF_POINTS_PER_CELL
        index.train(rows)
        index.nprobe = nprobe
        what = f"IndexIVFFlat(nlist={nlist}, nprobe={nprobe})"
    else:
        index = faiss.IndexHNSWFlat(d, HNSW_M, faiss_metric)
        index.hnsw.efConstruction = HNSW_EF_CONSTRUCTION
        index.hnsw.efSearch = HNSW_EF_SEARCH
        what = f"IndexHNSWFlat(M={HNSW_M}, efConstruction={HNSW_EF_CONSTRUCTION}, efSearch={HNSW_EF_SEARCH})"
    index.add(rows)
    where = "CPU"
    if on_gpu and kind != "hnsw":
        index = faiss.index_cpu_to_gpu(_resources(), 0, index)  # copies the trained, filled index (nprobe included)
        where = "GPU 0 (faiss-gpu)"
    elif on_gpu:
        where = "CPU (faiss has no GPU HNSW)"
    elif gpu:
        where = "CPU (gpu asked, but faiss has no GPU support or sees no GPU)"
    return index, f"faiss {what} on {where}"


def knn_search(rows: np.ndarray, queries: np.ndarray, k: int, *, kind: str = "flat", metric: str = "l2",
               gpu: bool | None = None, purpose: str = "nearest-neighbour search") -> np.ndarray:
    """Indices (n_queries, k) into ``rows`` of each query's ``k`` nearest rows, nearest first.

    The index is built from ``rows`` alone (:func:`build_index`); queries an approximate index leaves with fewer than
    ``k`` results are searched again exactly, so every entry is a valid row index. The first call of each
    (purpose, index, device) logs one INFO line naming them.

    Args:
        rows: (m, d) rows to index (the only rows the index sees).
        queries: (n, d) queries.
        k: neighbours per query, 1..m.
        kind, metric, gpu: see :func:`build_index`.
        purpose: what the search is for, in the log line.
    """
    rows = np.ascontiguousarray(rows, dtype=np.float32)
    queries = np.ascontiguousarray(queries, dtype=np.float32)
    index, what = build_index(rows, kind=kind, metric=metric, gpu=gpu)
    _log_once(f"{purpose}: {what}")
    _, ids = index.search(queries, int(k))
    missing = np.flatnonzero((ids < 0).any(axis=1))
    if len(missing):
        exact, _ = build_index(rows, kind="flat", metric=metric, gpu=gpu)
        _, ids[missing] = exact.search(queries[missing], int(k))
    return ids.astype(np.int64)
