"""README's G-PATE ladder figure: for each run directory, one row of its samples.npz (two samples per class), the row
labelled with the given text.

    python experiments/long2021/measured/ladder_figure.py OUT.png "LABEL=RUN_DIR" ["LABEL=RUN_DIR" ...]  (split at the last "=")
"""

from __future__ import annotations

import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

PER_CLASS = 2


def main(argv: list[str]) -> None:
    out, pairs = Path(argv[0]), [a.rsplit("=", 1) for a in argv[1:]]
    fig, axes = plt.subplots(len(pairs), 1, figsize=(12, 1.0 * len(pairs) + 0.3), squeeze=False)
    for ax, (label, run) in zip(axes[:, 0], pairs):
        d = np.load(Path(run) / "samples.npz")
        x, y = d["x"], d["y"]
        tiles = [x[np.flatnonzero(y == c)[:PER_CLASS]] for c in range(int(y.max()) + 1)]
        row = np.concatenate([t[:, 0] for t in tiles], axis=0)  # (10 * PER_CLASS, H, W)
        ax.imshow(np.concatenate(list(row), axis=1), cmap="gray", vmin=0, vmax=1)
        ax.set_xticks([])
        ax.set_yticks([])
        ax.set_ylabel(label, rotation=0, ha="right", va="center", fontsize=9)
    fig.suptitle(f"G-PATE on fmnist: {PER_CLASS} samples per class (T-shirt ... ankle boot), one row per run",
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(out, dpi=80)
    print(out)


if __name__ == "__main__":
    main(sys.argv[1:])
