"""``samples.png``: a grid of samples, one row per class, labelled with the class name."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np

from dpsyn.results.io import atomic_write


def save_sample_grid(
    path: str | Path,
    x: np.ndarray,
    y: np.ndarray | None,
    classes: list[str],
    *,
    per_class: int = 10,
    title: str = "",
) -> Path:
    """Write a PNG grid: row c shows up to ``per_class`` samples of class c (or, without labels, rows of samples).

    Args:
        x: images (N, C, H, W) in [0, 1].
        y: labels (N,) or None.
        classes: class names in label order.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if y is None:
        rows = [np.arange(i, min(i + per_class, len(x))) for i in range(0, min(len(x), per_class * 10), per_class)]
        names = ["" for _ in rows]
    else:
        rows = [np.flatnonzero(y == c)[:per_class] for c in range(len(classes))]
        names = list(classes)
    # one image of tiles (white gaps) in one axes: a hundred axes took ~1 s of every run's time in matplotlib
    n_ch, h, w = x.shape[1], x.shape[2], x.shape[3]
    gap = max(1, h // 14)
    canvas = np.ones((gap + len(rows) * (h + gap), gap + per_class * (w + gap), 3), np.float32)
    for r, idx in enumerate(rows):
        for j, i in enumerate(idx[:per_class]):
            img = np.clip(np.asarray(x[i], dtype=np.float32), 0, 1)
            img = np.repeat(img[:1], 3, axis=0) if n_ch == 1 else img[:3]
            top, left = gap + r * (h + gap), gap + j * (w + gap)
            canvas[top : top + h, left : left + w] = np.transpose(img, (1, 2, 0))
    fig, ax = plt.subplots(figsize=(per_class * 0.8 + 1.6, len(rows) * 0.8 + 0.4))
    ax.imshow(canvas, interpolation="nearest")
    ax.set_xticks([])
    ax.set_yticks([gap + r * (h + gap) + h / 2 for r in range(len(rows))], labels=names, fontsize=8)
    ax.tick_params(left=False)
    for s in ax.spines.values():
        s.set_visible(False)
    if title:
        fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=80)
    plt.close(fig)
    return atomic_write(path, lambda f: f.write(buf.getvalue()))
