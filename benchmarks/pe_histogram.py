"""Benchmark: PE's DP nearest-neighbour histogram step: exact against approximate search, and against DPSDA's.

What is timed, on each side, is one histogram step of PE (Lin et al. 2023, Alg. 2): the lookahead embedding of the
synthetic samples (the mean embedding of k variations; k = 0: their own embedding), every private sample's vote for
its nearest synthetic sample (exact L2 search: faiss ``IndexFlatL2`` through each side's ``auto`` backend), the
counting, the Gaussian noise and the threshold. The "variation API" and the "embedding" are stand-ins on both sides:
a variation hands back precomputed random embeddings (seeded; the same arrays for both), so no generative model or
feature extractor is timed.

- dpsyn: ``PE._lookahead_embedding`` (with a stand-in API and embedder) then ``dp_nn_histogram``, once per
  ``method.nn_index`` in ``--nn-index`` (default: ``flat``, faiss's exact search, and ``ivf``; ``hnsw`` on request).
  Each approximate index's line gives its speed-up over ``flat`` in the same run and how far its clean (noise-free)
  histogram is from the exact one: the fraction of private samples whose vote lands on the same synthetic sample, the
  overlap of the top ``--top-k`` voted candidates (ties broken by index), and the fraction of votes that moved.
- DPSDA (``--dpsda DIR``, a scratch checkout of github.com/microsoft/DPSDA): ``pe.histogram.NearestNeighbors``'s
  ``compute_histogram``, ``pe.dp.Gaussian.add_noise`` and ``PEPopulation``'s threshold (``_post_process_histogram``),
  with stand-ins that follow DPSDA's interfaces (``compute_embedding(data)`` fills the embedding column of the data
  frame with one row array per sample, as DPSDA's own embeddings do; ``variation_api(syn_data)`` returns a ``Data``).
  DPSDA needs pandas, generalimport and omegaconf: run this with an interpreter that has them (a scratch venv), never
  by adding them to dpsyn. The private embeddings are computed before the timing on both sides (both runners embed
  the private set once).

The repeats rotate the order of the sides (each index of dpsyn, DPSDA) after one untimed warm-up each; the table gives
the best and median seconds and the ratio dpsyn / DPSDA (below 1: dpsyn faster). The clean (noise-free) histograms of the
two sides are compared: with exact search they agree up to near-ties, which the float32 vs float64 averaging of the
lookahead embeddings can flip.

``--data gaussian`` (the default) draws the embeddings i.i.d. standard normal: no structure at all, the hardest case
for an approximate index (nearest and 50th-nearest are almost equally far). ``--data clustered`` draws them on a
16-dimensional subspace plus small noise, closer to image features (the public encoder's are of low intrinsic
dimension): there the approximate votes agree far more with the exact ones.

Usage: python benchmarks/pe_histogram.py [--n-private 50000] [--n-synthetic 50000] [--dim 64] [--lookahead 0 8]
       [--nn-index flat ivf] [--data gaussian|clustered] [--top-k 1000] [--repeats 3] [--threads 1]
       [--clock wall|cpu] [--dpsda /tmp/dpsda]
Getting DPSDA (into a scratch folder, never into this repo), e.g.:
  git clone https://github.com/microsoft/DPSDA /tmp/dpsda
  .venv/bin/python -m venv /tmp/dpsda-venv        # a scratch venv that also sees dpsyn's (.venv), through a .pth:
  echo "import site; site.addsitedir('$PWD/.venv/lib/python3.11/site-packages')" \
      > /tmp/dpsda-venv/lib/python3.11/site-packages/zz_dpsyn_venv.pth
  /tmp/dpsda-venv/bin/pip install pandas generalimport
  /tmp/dpsda-venv/bin/python benchmarks/pe_histogram.py --dpsda /tmp/dpsda
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import time
from types import SimpleNamespace
from typing import Any, Callable

import numpy as np
import torch

from dpsyn.machine import cpu_model
from dpsyn.methods.pe.histogram import dp_nn_histogram, faiss, nearest_neighbours
from dpsyn.methods.pe.method import PE
from dpsyn.privacy import dp_numpy_generator

SIGMA = 5.0  # noise multiplier and threshold: their values do not change the cost
THRESHOLD = 10.0
BACKEND = "auto"  # faiss on both sides (DPSDA's "auto" tries faiss first too); IndexFlatL2 on DPSDA's


class Embeddings:
    """The seeded stand-in embeddings: private (n, d), synthetic (m, d) and ``k`` variations (k, m, d) of it."""

    def __init__(self, n_private: int, n_synthetic: int, dim: int, max_lookahead: int, seed: int = 0,
                 data: str = "gaussian") -> None:
        rng = np.random.default_rng(seed)
        if data == "gaussian":
            self.private = rng.standard_normal((n_private, dim), dtype=np.float32)
            self.synthetic = rng.standard_normal((n_synthetic, dim), dtype=np.float32)
        else:  # a 16-d subspace (random linear map) plus noise of 0.1 per coordinate
            basis = rng.standard_normal((min(16, dim), dim), dtype=np.float32)
            self.private, self.synthetic = (
                rng.standard_normal((n, len(basis)), dtype=np.float32) @ basis
                + 0.1 * rng.standard_normal((n, dim), dtype=np.float32) for n in (n_private, n_synthetic))
        noise = [rng.standard_normal(self.synthetic.shape, dtype=np.float32) for _ in range(max_lookahead)]
        self.variations = np.stack([self.synthetic + 0.5 * z for z in noise]) if noise else np.zeros(
            (0, n_synthetic, dim), np.float32)

    def array(self, key: Any) -> np.ndarray:
        return self.synthetic if key == "synthetic" else self.variations[key]


# ---------------------------------------------------------------------------------------------------------- dpsyn


class _DpsynStandinAPI:
    """dpsyn's ``variation_api(pop, degree=, generator=)``: the i-th call returns the i-th precomputed variation."""

    def __init__(self) -> None:
        self.calls = 0

    def variation_api(self, pop: Any, *, degree: float, generator: Any) -> SimpleNamespace:
        self.calls += 1
        return SimpleNamespace(x=self.calls - 1)


def lookahead_embedding(emb: Embeddings, lookahead: int) -> np.ndarray:
    """``PE._lookahead_embedding`` (its own code) on a stand-in PE whose variations are the precomputed arrays."""
    pe = SimpleNamespace(lookahead=lookahead, api=_DpsynStandinAPI(), _generator=lambda *parts: None)
    return PE._lookahead_embedding(pe, SimpleNamespace(x="synthetic"), 0.5, emb.array, 0)


def dpsyn_step(emb: Embeddings, lookahead: int, rng: np.random.Generator, nn_index: str = "flat") -> Any:
    """dpsyn's histogram step: the lookahead embedding then ``dp_nn_histogram`` with ``nn_index``."""
    syn_emb = lookahead_embedding(emb, lookahead)
    return dp_nn_histogram(emb.private, syn_emb, noise_multiplier=SIGMA, threshold=THRESHOLD, rng=rng, backend=BACKEND,
                           nn_index=nn_index)


# ---------------------------------------------------------------------------------------------------------- DPSDA


def load_dpsda(path: str) -> SimpleNamespace:
    """DPSDA's modules from a checkout at ``path`` (ImportError when it or its dependencies are missing).

    ``pe.embedding`` and ``pe.api`` are not imported (their packages pull in clean-fid and openai); the stand-ins
    below follow their interfaces instead of subclassing their abstract bases.
    """
    sys.path.insert(0, path)
    from pe.constant.data import (CLEAN_HISTOGRAM_COLUMN_NAME, EMBEDDING_COLUMN_NAME,
                                  LOOKAHEAD_EMBEDDING_COLUMN_NAME, POST_PROCESSED_DP_HISTOGRAM_COLUMN_NAME)
    from pe.data import Data
    from pe.dp import Gaussian
    from pe.histogram import NearestNeighbors
    from pe.population import PEPopulation
    import pandas as pd

    return SimpleNamespace(
        Data=Data, Gaussian=Gaussian, NearestNeighbors=NearestNeighbors, PEPopulation=PEPopulation, pd=pd,
        CLEAN=CLEAN_HISTOGRAM_COLUMN_NAME, EMBEDDING=EMBEDDING_COLUMN_NAME, LOOKAHEAD=LOOKAHEAD_EMBEDDING_COLUMN_NAME,
        THRESHOLDED=POST_PROCESSED_DP_HISTOGRAM_COLUMN_NAME,
    )


class DpsdaStandins:
    """DPSDA-interface stand-ins: an Embedding (``column_name``, ``compute_embedding``), an API (``variation_api``)."""

    def __init__(self, pe: SimpleNamespace, emb: Embeddings) -> None:
        self.pe = pe
        self.column_name = f"{pe.EMBEDDING}.StandinEmbedding"  # what pe.embedding.Embedding.column_name would give
        # one (d,) array per row, as DPSDA's embeddings store them; built once, outside the timing
        self._rows = {"synthetic": list(emb.synthetic), **{i: list(v) for i, v in enumerate(emb.variations)}}
        self._private_rows = list(emb.private)
        self.calls = 0

    # pe.embedding.Embedding interface
    def compute_embedding(self, data: Any) -> Any:
        if self.column_name in data.data_frame.columns:  # DPSDA's embeddings only compute the missing rows
            return data
        rows = self._rows[data.metadata["standin"]]
        data.data_frame[self.column_name] = self.pe.pd.Series(rows, index=data.data_frame.index)
        return data

    # pe.api.API interface (only what the histogram and the population use)
    def variation_api(self, syn_data: Any) -> Any:
        self.calls += 1
        return self.pe.Data(data_frame=self.pe.pd.DataFrame(index=syn_data.data_frame.index),
                            metadata={"standin": self.calls - 1})

    def random_api(self, label_info: Any, num_samples: int) -> Any:  # pragma: no cover - not used here
        raise NotImplementedError

    def private_data(self) -> Any:
        """The private Data with its embedding column already filled (DPSDA's runner keeps it across iterations)."""
        pd = self.pe.pd
        frame = pd.DataFrame(index=pd.RangeIndex(len(self._private_rows)))
        frame[self.column_name] = pd.Series(self._private_rows, index=frame.index)
        return self.pe.Data(data_frame=frame, metadata={"standin": "private"})

    def synthetic_data(self) -> Any:
        n = len(self._rows["synthetic"])
        return self.pe.Data(data_frame=self.pe.pd.DataFrame(index=self.pe.pd.RangeIndex(n)),
                            metadata={"standin": "synthetic"})


def make_dpsda_step(pe: SimpleNamespace, emb: Embeddings, lookahead: int) -> Callable[[], Any]:
    """A closure timing DPSDA's step: compute_histogram, Gaussian.add_noise, PEPopulation's threshold."""
    standins = DpsdaStandins(pe, emb)
    histogram = pe.NearestNeighbors(embedding=standins, mode="l2", lookahead_degree=lookahead, api=standins,
                                    num_nearest_neighbors=1, backend=BACKEND)
    dp = pe.Gaussian()
    with np.errstate(over="ignore"):  # DPSDA's epsilon search overflows exp() on its way (harmless)
        dp.set_epsilon_and_delta(num_iterations=10, epsilon=None, delta=1e-5, noise_multiplier=SIGMA)
    population = pe.PEPopulation(api=standins, histogram_threshold=THRESHOLD)
    priv_data = standins.private_data()
    pending: list[Any] = []

    def prepare() -> None:  # a fresh synthetic Data (no embedding yet) for the next step, outside the timing
        standins.calls = 0
        pending.append(standins.synthetic_data())

    def step() -> Any:
        syn_data = pending.pop()
        _, syn_data = histogram.compute_histogram(priv_data=priv_data, syn_data=syn_data)
        syn_data = dp.add_noise(syn_data=syn_data)
        return population._post_process_histogram(syn_data)

    step.prepare = prepare  # type: ignore[attr-defined]
    return step


# ---------------------------------------------------------------------------------------------------------- timing


def set_threads(n: int) -> None:
    if n <= 0:
        return
    torch.set_num_threads(n)
    if faiss is not None:
        faiss.omp_set_num_threads(n)
    try:  # the BLAS faiss bundles, numpy's
        from threadpoolctl import threadpool_limits

        threadpool_limits(n)
    except ImportError:
        pass


CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}  # cpu: this process's CPU time, all its threads


def timed(fn: Callable[[], Any], prepare: Callable[[], None] | None = None, clock: str = "wall") -> tuple[float, Any]:
    if prepare is not None:
        prepare()
    now = CLOCKS[clock]
    t0 = now()
    out = fn()
    return now() - t0, out


def compare(ours: Any, theirs: Any, pe: SimpleNamespace, ours_syn: np.ndarray) -> str:
    """How far apart the clean histograms (and the lookahead embeddings) of the two sides are."""
    a = np.asarray(ours.clean, dtype=np.float64)
    b = theirs.data_frame[pe.CLEAN].to_numpy(dtype=np.float64)
    look = np.stack(theirs.data_frame[pe.LOOKAHEAD].values).astype(np.float32)
    emb_diff = float(np.abs(look - ours_syn).max())
    thr = theirs.data_frame[pe.THRESHOLDED].to_numpy(dtype=np.float64)
    if not (thr >= 0).all() or a.sum() != b.sum():
        return f"MISMATCH: vote totals {a.sum():.0f} vs {b.sum():.0f}"
    moved = int(np.abs(a - b).sum() / 2)
    same = "identical" if moved == 0 else f"{int((a != b).sum())} counts differ ({moved} votes moved: near-ties)"
    return f"{same}; lookahead emb max|diff| {emb_diff:.1e}"


def agreement(emb: Embeddings, lookahead: int, exact: Any, approx: Any, nn_index: str, top_k: int) -> str:
    """How far the approximate index's clean histogram is from the exact one (the same synthetic embeddings)."""
    syn_emb = lookahead_embedding(emb, lookahead)
    ids_exact = nearest_neighbours(emb.private, syn_emb, backend=BACKEND, nn_index="flat")[:, 0]
    ids_approx = nearest_neighbours(emb.private, syn_emb, backend=BACKEND, nn_index=nn_index)[:, 0]
    a, b = np.asarray(exact.clean), np.asarray(approx.clean)
    top = [set(np.argsort(-c, kind="stable")[:top_k].tolist()) for c in (a, b)]
    return (f"same vote {np.mean(ids_exact == ids_approx):.3f}, top-{top_k} overlap {len(top[0] & top[1]) / top_k:.3f}, "
            f"votes moved {np.abs(a - b).sum() / 2 / a.sum():.3f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n-private", type=int, default=50_000)
    ap.add_argument("--n-synthetic", type=int, default=50_000)
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--lookahead", type=int, nargs="+", default=[0, 8], help="lookahead degrees to time (0: none)")
    ap.add_argument("--nn-index", nargs="+", default=["flat", "ivf"], choices=["flat", "ivf", "hnsw"],
                    help="dpsyn's method.nn_index values to time (flat, the exact search, is always timed)")
    ap.add_argument("--data", choices=["gaussian", "clustered"], default="gaussian",
                    help="i.i.d. normal embeddings (no structure: the hardest case for an approximate index) or "
                         "embeddings on a 16-d subspace (closer to image features)")
    ap.add_argument("--top-k", type=int, default=1000, help="top voted candidates compared between exact and approximate")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1, help="faiss/torch/BLAS threads (0: leave the defaults)")
    ap.add_argument("--clock", choices=sorted(CLOCKS), default="wall",
                    help="wall time, or the process's CPU time (steadier on a loaded machine; sums the threads)")
    ap.add_argument("--dpsda", default=None, help="a scratch checkout of microsoft/DPSDA to compare against")
    args = ap.parse_args()
    set_threads(args.threads)

    pe = None
    if args.dpsda:
        try:
            pe = load_dpsda(args.dpsda)
        except ImportError as e:
            print(f"DPSDA not importable from {args.dpsda} ({e}): timing dpsyn only")

    emb = Embeddings(args.n_private, args.n_synthetic, args.dim, max(args.lookahead), data=args.data)
    indexes = ["flat"] + [i for i in dict.fromkeys(args.nn_index) if i != "flat"]
    if faiss is None:
        indexes = ["flat"]
    threads = faiss.omp_get_max_threads() if faiss is not None else torch.get_num_threads()
    simd = faiss.get_compile_options() if faiss is not None else "-"
    print(f"CPU: {cpu_model()} ({platform.machine()}), {threads} thread(s); faiss {getattr(faiss, '__version__', '-')} "
          f"({simd})")
    print(f"PE DP-NN histogram step: {args.n_private} private x {args.n_synthetic} synthetic x {args.dim}-d, "
          f"{args.data} embeddings, {args.clock} clock, best / median of {args.repeats}")
    rng = dp_numpy_generator()  # dpsyn's DP noise generator, as PE uses it (OS entropy)
    for k in args.lookahead:
        ours_fns = {idx: (lambda idx=idx: dpsyn_step(emb, k, rng, idx)) for idx in indexes}
        theirs_fn = make_dpsda_step(pe, emb, k) if pe is not None else None
        outs = {idx: timed(fn)[1] for idx, fn in ours_fns.items()}  # warm-up (and the histograms compared below)
        if theirs_fn is not None:
            _, theirs_out = timed(theirs_fn, theirs_fn.prepare)
        sides = list(indexes) + (["DPSDA"] if theirs_fn is not None else [])
        times: dict[str, list[float]] = {side: [] for side in sides}
        for r in range(args.repeats):
            for side in sides[r % len(sides):] + sides[:r % len(sides)]:  # rotate the order between repeats
                if side == "DPSDA":
                    times[side].append(timed(theirs_fn, theirs_fn.prepare, args.clock)[0])
                else:
                    times[side].append(timed(ours_fns[side], clock=args.clock)[0])
        fb, fm = min(times["flat"]), statistics.median(times["flat"])
        print(f"  lookahead {k}:")
        print(f"    {'dpsyn flat (exact)':<24} {fb:8.3f}s best {fm:8.3f}s median")
        for idx in indexes[1:]:
            b, m = min(times[idx]), statistics.median(times[idx])
            print(f"    {'dpsyn ' + idx:<24} {b:8.3f}s best {m:8.3f}s median   speed-up vs flat {fb / b:.2f}x best, "
                  f"{fm / m:.2f}x median; clean histogram vs exact: "
                  f"{agreement(emb, k, outs['flat'], outs[idx], idx, args.top_k)}")
        if theirs_fn is not None:
            tb, tm = min(times["DPSDA"]), statistics.median(times["DPSDA"])
            print(f"    {'DPSDA (exact)':<24} {tb:8.3f}s best {tm:8.3f}s median   dpsyn flat / DPSDA {fb / tb:.2f}x best, "
                  f"{fm / tm:.2f}x median; clean histograms: "
                  f"{compare(outs['flat'], theirs_out, pe, lookahead_embedding(emb, k))}")
    if pe is None:
        print("For the ratio against microsoft/DPSDA's histogram, put a checkout of it in a scratch folder outside "
              "this repo (e.g. /tmp/dpsda) and rerun with --dpsda /tmp/dpsda, from an interpreter that also has pandas "
              "and generalimport (a scratch venv; see this file's docstring).")


if __name__ == "__main__":
    main()
