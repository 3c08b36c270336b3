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
    fig, axes = plt.subplots(
        len(rows), per_class, figsize=(per_class * 0.8 + 1.6, len(rows) * 0.8 + 0.4), squeeze=False
    )
    for r, idx in enumerate(rows):
        for j in range(per_class):
            ax = axes[r][j]
            ax.set_xticks([])
            ax.set_yticks([])
            for s in ax.spines.values():
                s.set_visible(False)
            if j < len(idx):
                img = np.clip(x[idx[j]], 0, 1)
                if img.shape[0] == 1:
                    ax.imshow(img[0], cmap="gray", vmin=0, vmax=1)
                else:
                    ax.imshow(np.transpose(img, (1, 2, 0)))
        axes[r][0].set_ylabel(names[r], rotation=0, ha="right", va="center", fontsize=8)
    if title:
        fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=80)
    plt.close(fig)
    return atomic_write(path, lambda f: f.write(buf.getvalue()))
