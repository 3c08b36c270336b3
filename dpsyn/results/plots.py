"""Plots rebuilt from runs: privacy-utility curves and sample-grid mosaics (PNG, matplotlib, no torch)."""

from __future__ import annotations

import io
import math
from pathlib import Path
from typing import Any

import numpy as np

from dpsyn.results.io import atomic_write
from dpsyn.results.tables import Cell, MetricSpec, TableSpec, fmt_col


def _plt() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig: Any, path: str | Path) -> Path:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    _plt().close(fig)
    return atomic_write(path, lambda f: f.write(buf.getvalue()))


def privacy_utility_plot(
    spec: TableSpec, metric: MetricSpec, cells: dict[tuple[Any, Any], Cell], path: str | Path
) -> Path:
    """Metric vs eps per row (method): log-x, error bars (std over seeds), eps=inf drawn at the right edge, published
    numbers as hollow markers."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6.0, 4.0))
    finite = sorted({c for (_, c) in cells if isinstance(c, float) and math.isfinite(c)}
                    | {c for p in spec.published for cols in p.values.values() for c in cols if math.isfinite(c)})
    inf_x = (max(finite) * 10) if finite else 1.0
    xs_of = lambda c: inf_x if math.isinf(c) else c  # noqa: E731
    rows = list(dict.fromkeys([r for r, _ in cells]))
    colors = {r: f"C{i}" for i, r in enumerate(rows + [r for p in spec.published for r in p.values if r not in rows])}
    for r in rows:
        pts = sorted((xs_of(c), cell) for (rr, c), cell in cells.items() if rr == r and isinstance(c, float))
        if not pts:
            continue
        # finite eps joined by a line; eps=inf (non-private) a separate point at the right edge
        for group, label in (([p for p in pts if p[0] != inf_x]), r), (([p for p in pts if p[0] == inf_x]), None):
            if group:
                ax.errorbar([p[0] for p in group], [p[1].mean for p in group],
                            yerr=[0 if math.isnan(p[1].std) else p[1].std for p in group],
                            marker="o", capsize=3, label=label, color=colors[r])
    for i, p in enumerate(s for s in spec.published if s.metric == metric.name):
        for r, cols in p.values.items():
            pts = sorted((xs_of(c), v * p.scale) for c, v in cols.items())
            ax.plot([q[0] for q in pts], [q[1] for q in pts], linestyle=":", marker="os^"[i % 3], fillstyle="none",
                    color=colors.get(r, "k"), label=f"{r} published [{i + 1}]")
    ax.set_xscale("log")
    ticks = finite + ([inf_x] if any(isinstance(c, float) and math.isinf(c) for _, c in cells) else [])
    ax.set_xticks(ticks)
    ax.set_xticklabels([fmt_col(t) if t != inf_x else "∞" for t in ticks])
    ax.minorticks_off()
    ax.set_xlabel(f"{spec.columns} (target epsilon)")
    ax.set_ylabel(metric.label or metric.name)
    arrow = "↑ better" if metric.direction == "max" else "↓ better"
    ax.set_title(f"{spec.title}\n{metric.name} ({arrow})", fontsize=8)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    return _save(fig, path)


def sample_mosaic(runs: dict[tuple[str, Any], Path], path: str | Path, *, per_cell: int = 4, title: str = "") -> Path:
    """A grid: one row per method, one column per eps, each cell a per_cell x per_cell tile of that run's samples.

    Args:
        runs: (method, eps) -> run directory holding ``samples.npz``.
    """
    plt = _plt()
    methods = list(dict.fromkeys(m for m, _ in runs))
    eps = sorted({e for _, e in runs}, key=lambda e: (isinstance(e, str), e))
    fig, axes = plt.subplots(len(methods), len(eps), figsize=(1.6 * len(eps) + 1, 1.6 * len(methods) + 0.5),
                             squeeze=False)
    for i, m in enumerate(methods):
        for j, e in enumerate(eps):
            ax = axes[i][j]
            ax.set_xticks([])
            ax.set_yticks([])
            run = runs.get((m, e))
            if run is not None and (Path(run) / "samples.npz").exists():
                with np.load(Path(run) / "samples.npz") as z:
                    x, y = z["x"], z["y"]
                ax.imshow(_tile(x, y, per_cell), cmap="gray" if x.shape[1] == 1 else None, vmin=0, vmax=1)
            else:
                ax.text(0.5, 0.5, "missing", ha="center", va="center", transform=ax.transAxes, fontsize=7)
            if i == 0:
                ax.set_title(f"eps={fmt_col(e)}", fontsize=8)
            if j == 0:
                ax.set_ylabel(m, fontsize=8)
    if title:
        fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    return _save(fig, path)


def has_image_samples(runs: dict[tuple[str, Any], Path]) -> bool:
    """Whether the first run with a ``samples.npz`` holds images (N, C, H, W); table rows have no mosaic."""
    for run in runs.values():
        path = Path(run) / "samples.npz"
        if path.exists():
            with np.load(path) as z:
                return z["x"].ndim == 4
    return False


def _tile(x: np.ndarray, y: np.ndarray, k: int) -> np.ndarray:
    """k x k images, spread over the classes when labels exist, as one HxW(xC) array."""
    if len(y) == len(x) and len(y):
        order = np.argsort(y, kind="stable")
        idx = order[np.linspace(0, len(order) - 1, k * k).astype(int)]
    else:
        idx = np.arange(min(len(x), k * k))
    imgs = np.clip(x[idx], 0, 1)
    c, h, w = imgs.shape[1:]
    if len(imgs) < k * k:
        imgs = np.concatenate([imgs, np.zeros((k * k - len(imgs), c, h, w), imgs.dtype)])
    grid = imgs.reshape(k, k, c, h, w).transpose(0, 3, 1, 4, 2).reshape(k * h, k * w, c)
    return grid[..., 0] if c == 1 else grid


def _num(v: Any) -> float | None:
    try:
        return float(v)
    except (TypeError, ValueError):
        return None


def _grouped(results: list[dict[str, Any]], keys: list[str], metric: str,
             select: dict[str, Any] | None = None) -> dict[tuple[Any, ...], list[float]]:
    """The metric's values grouped by the given result fields (runs matching ``select`` only)."""
    from collections import defaultdict

    from dpsyn.results.tables import _field, _key

    groups: dict[tuple[Any, ...], list[float]] = defaultdict(list)
    for r in results:
        if any(_key(_field(r, k)) != _key(v) for k, v in (select or {}).items()):
            continue
        value = _num(_field(r, metric))
        coords = tuple(_key(_field(r, k)) for k in keys)
        if value is None or math.isnan(value) or any(c is None for c in coords):
            continue
        groups[coords].append(value)
    return groups


def figure(fig_spec: dict[str, Any], results: list[dict[str, Any]], path: str | Path, *, title: str = "") -> Path | None:
    """One figure of a table spec's ``figures`` list, from the runs' result.json records (None if no run has data).

    ``kind: heatmap`` — the mean of ``metric`` over runs on the grid of two fields ``x`` and ``y`` (each cell
    annotated; grid values evenly spaced, i.e. log axes for a log-spaced grid, as Rajotte & Ng's Fig. 5).
    ``kind: curve`` — ``metric`` (mean ± std over the runs sharing a point) against field ``x``, one line per value of
    field ``by``; ``baseline`` names a metric drawn as a dashed line (e.g. an attack's random-guess rate); ``log: true``
    puts x on a log scale. Both take ``select`` (field: value) to restrict the runs and ``label`` for the metric axis.
    """
    kind, metric = fig_spec.get("kind"), fig_spec["metric"]
    label = fig_spec.get("label", metric)
    select = fig_spec.get("select")
    plt = _plt()
    if kind == "heatmap":
        g = _grouped(results, [fig_spec["x"], fig_spec["y"]], metric, select)
        if not g:
            return None
        xs = sorted({k[0] for k in g}, key=lambda v: (_num(v) is None, _num(v) or 0, str(v)))
        ys = sorted({k[1] for k in g}, key=lambda v: (_num(v) is None, _num(v) or 0, str(v)))
        grid = np.full((len(ys), len(xs)), np.nan)
        for (x, y), vals in g.items():
            grid[ys.index(y), xs.index(x)] = float(np.mean(vals))
        fig, ax = plt.subplots(figsize=(1.2 * len(xs) + 2.5, 1.0 * len(ys) + 2.0))
        im = ax.imshow(grid, origin="lower", cmap=fig_spec.get("cmap", "viridis"), aspect="auto")
        for i in range(len(ys)):
            for j in range(len(xs)):
                if not np.isnan(grid[i, j]):
                    ax.text(j, i, f"{grid[i, j]:.2f}", ha="center", va="center", fontsize=8,
                            color="w" if grid[i, j] < np.nanmean(grid) else "k")
        ax.set_xticks(range(len(xs)), [fmt_col(v) for v in xs])
        ax.set_yticks(range(len(ys)), [fmt_col(v) for v in ys])
        ax.set_xlabel(fig_spec.get("x_label", fig_spec["x"]))
        ax.set_ylabel(fig_spec.get("y_label", fig_spec["y"]))
        fig.colorbar(im, ax=ax, label=label)
    elif kind == "curve":
        by = fig_spec.get("by")
        g = _grouped(results, [by, fig_spec["x"]] if by else [fig_spec["x"]], metric, select)
        if not g:
            return None
        fig, ax = plt.subplots(figsize=(6.0, 4.0))
        lines = sorted({k[0] for k in g}, key=str) if by else [None]
        for i, line in enumerate(lines):
            pts = sorted((_num(k[-1]), v) for k, v in g.items() if (not by or k[0] == line) and _num(k[-1]) is not None)
            ax.errorbar([p[0] for p in pts], [float(np.mean(p[1])) for p in pts],
                        yerr=[float(np.std(p[1], ddof=1)) if len(p[1]) > 1 else 0.0 for p in pts],
                        marker="o", capsize=3, color=f"C{i}", label=str(line) if by else metric)
        if fig_spec.get("baseline"):
            b = _grouped(results, [fig_spec["x"]], fig_spec["baseline"], select)
            pts = sorted((_num(k[0]), float(np.mean(v))) for k, v in b.items() if _num(k[0]) is not None)
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], "k--", label=fig_spec.get("baseline_label", "random guess"))
        if fig_spec.get("log", False):
            ax.set_xscale("log")
        ax.set_xlabel(fig_spec.get("x_label", fig_spec["x"]))
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    else:
        raise ValueError(f"figure kind={kind!r}: unknown; allowed: heatmap, curve")
    import textwrap

    ax.set_title(textwrap.fill(f"{title}", 80) + f"\n{fig_spec.get('title', label)}", fontsize=8)
    fig.tight_layout()
    return _save(fig, path)
