"""Benchmark: dpsyn's FD and precision/recall against torch-fidelity's and prdc's, on the same features, same run.

Seeded random features (default 10k generated x 10k real, 64-d; real ~ N(0, I), generated ~ N(0.1, 1.1^2 I)).
Each implementation runs ``--repeats`` times; the median wall time is reported with the ratio ours/theirs
(target <= 1.0x) and the values, so a speed-up that changed the answer shows. The references get float32 features
(what their feature extractors produce); dpsyn computes in float64 whatever it is given.

- FD: ``frechet_distance_from_features`` vs torch-fidelity's ``fid_features_to_statistics`` (x2) +
  ``fid_statistics_to_metric``.
- precision/recall (k=3): ``precision_recall`` vs torch-fidelity's ``prc_features_to_metric`` (its default
  ``save_cpu_ram=False`` path) and prdc's ``compute_prdc`` (which also returns density/coverage: compared with
  dpsyn's ``precision_recall`` + ``density_coverage`` as well).

Usage: python benchmarks/metrics_fidelity.py [--n 10000] [--dim 64] [--k 3] [--repeats 3] [--threads N]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch


def timed_pair(ours: Callable[[], Any], theirs: Callable[[], Any], repeats: int) -> tuple[tuple[float, Any], ...]:
    """Median seconds of ``repeats`` calls of each function, alternating them (so drifts in machine load hit both
    alike; the first call is timed too), and each one's value: ((t_ours, v_ours), (t_theirs, v_theirs))."""
    times: tuple[list[float], list[float]] = ([], [])
    values: list[Any] = [None, None]
    for i in range(repeats):
        for j in ((0, 1) if i % 2 == 0 else (1, 0)):
            t0 = time.perf_counter()
            values[j] = (ours, theirs)[j]()
            times[j].append(time.perf_counter() - t0)
    return (statistics.median(times[0]), values[0]), (statistics.median(times[1]), values[1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=10000, help="rows per set (generated and real)")
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--k", type=int, default=3, help="precision/recall neighbourhood")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: leave torch's default)")
    ap.add_argument("--skip-prdc", action="store_true", help="skip prdc (the slowest reference)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    from prdc import compute_prdc
    from torch_fidelity.metric_fid import fid_features_to_statistics, fid_statistics_to_metric
    from torch_fidelity.metric_prc import prc_features_to_metric

    from dpsyn.metrics.fidelity import density_coverage, frechet_distance_from_features, precision_recall

    rng = np.random.default_rng(0)
    real = rng.normal(size=(args.n, args.dim)).astype(np.float32)
    gen = rng.normal(loc=0.1, scale=1.1, size=(args.n, args.dim)).astype(np.float32)
    gen_t, real_t = torch.from_numpy(gen), torch.from_numpy(real)
    print(f"features: {args.n} generated x {args.n} real, {args.dim}-d; torch threads {torch.get_num_threads()}; "
          f"median of {args.repeats} (FD: of at least 21)")

    rows = []

    def row(name: str, ours: tuple[float, Any], theirs: tuple[float, Any], ref: str) -> None:
        rows.append((name, ref, ours[0], theirs[0]))
        print(f"{name:<28} ours {ours[0]:8.3f}s  {ref:<14} {theirs[0]:8.3f}s  ratio {ours[0] / theirs[0]:5.2f}x  "
              f"values ours {ours[1]}  theirs {theirs[1]}")

    fd_repeats = max(args.repeats, 21)  # milliseconds each: more repeats to steady the median

    def ours_fd() -> float:
        return round(frechet_distance_from_features(gen, real), 6)

    def tf_fd() -> float:
        stats = fid_features_to_statistics(gen_t), fid_features_to_statistics(real_t)
        return round(fid_statistics_to_metric(*stats, False)["frechet_inception_distance"], 6)

    row("FD", *timed_pair(ours_fd, tf_fd, fd_repeats), "torch-fidelity")

    def ours_pr() -> tuple[float, float]:
        out = precision_recall(gen, real, k=args.k)
        return round(out["precision"], 5), round(out["recall"], 5)

    def tf_pr() -> tuple[float, float]:
        out = prc_features_to_metric(gen_t, real_t, prc_neighborhood=args.k, verbose=False)
        return round(out["precision"], 5), round(out["recall"], 5)

    pr_ours, pr_tf = timed_pair(ours_pr, tf_pr, args.repeats)
    row(f"precision/recall k={args.k}", pr_ours, pr_tf, "torch-fidelity")
    if not args.skip_prdc:

        def prdc_all() -> tuple[float, ...]:
            with contextlib.redirect_stdout(io.StringIO()):  # compute_prdc prints the sample counts
                out = compute_prdc(real_features=real, fake_features=gen, nearest_k=args.k)
            return tuple(round(float(out[m]), 5) for m in ("precision", "recall", "density", "coverage"))

        def ours_all() -> tuple[float, ...]:
            pr, dc = precision_recall(gen, real, k=args.k), density_coverage(gen, real, k=args.k)
            return tuple(round(v, 5) for v in (pr["precision"], pr["recall"], dc["density"], dc["coverage"]))

        # prdc has no precision/recall-only entry point: its time covers all four, as does "ours" on the 2nd row
        (t_all, v_all), (t_prdc, v_prdc) = timed_pair(ours_all, prdc_all, args.repeats)
        row(f"precision/recall k={args.k}", pr_ours, (t_prdc, v_prdc[:2]), "prdc")
        row(f"P/R + density/coverage k={args.k}", (t_all, v_all), (t_prdc, v_prdc), "prdc")

    print("summary (ours/theirs): " + ", ".join(f"{n} vs {r} {o / t:.2f}x" for n, r, o, t in rows))


if __name__ == "__main__":
    main()
