"""Accuracy against training progress from one run: score copies of a run's checkpoint taken while it trained.

gs_wgan calibrates its noise for the run's whole length, so its intermediate checkpoints are what it releases after
that many iterations *at the noise of the full run*, not what a shorter run would give. g_pate and pate_gan add
noise of a fixed size per query and stop when the budget is spent, so their checkpoint after r rounds is what a run
capped at r rounds releases. Either way the curve shows whether a run was still improving when it stopped (issue
17's evidence that a target is out of reach on 2 cores). The generator of each copy makes 10k samples (uniform
labels, the method's own latent and sampler) and dpsyn's metrics score them (``python -m dpsyn.cli.evaluate``'s
path: the run's metric config, the downstream classifier selected on held-out synthetic data, the test split read
once per copy). The curve is a report: nothing may be chosen on it (it reads the test split at every point).

Usage: start the watcher beside a run (it copies ``RUN/checkpoints/<method>.pt`` into ``RUN/snap/`` whenever the
file changes, until ``RUN/result.json`` appears), then score the copies::

    python experiments/long2021/measured/snapshot_eval.py RUN --watch gs_wgan.pt &
    python experiments/long2021/measured/snapshot_eval.py RUN [--every 500 | --every 100 --points 6] [--out TSV]

Supported: ``gs_wgan`` (its EMA generator), ``g_pate`` (its EMA with ``method.ema`` > 0, else G) and ``pate_gan``
(the generator), on image datasets.
"""

from __future__ import annotations

import argparse
import csv
import shutil
import tempfile
from pathlib import Path

import numpy as np
import torch
from omegaconf import OmegaConf

from dpsyn.methods.base import generate_conditional
from dpsyn.results.plots import _plt, _save, _tile


def generator_of(cfg, state: dict, *, shape: tuple[int, ...], num_classes: int) -> tuple[torch.nn.Module, str]:
    """The checkpoint's released generator (gs_wgan, g_pate: its EMA when ``method.ema`` > 0; g_pate's wrapped in its
    output low-pass when ``method.output_frequencies`` is set) and its latent distribution."""
    from dpsyn.methods import METHODS, RunContext

    m = cfg.method
    # the method's own builder (g_pate's output low-pass included), the one fit() trains
    ctx = RunContext(seed=int(cfg.seed), deterministic_noise=False, accountant=str(cfg.privacy.accountant),
                     kind="image", shape=shape, num_classes=num_classes, classes=[str(c) for c in range(num_classes)])
    G = METHODS.get(m.name)(m, ctx)._make_generator()
    key = "G_ema" if m.name in ("gs_wgan", "g_pate") and float(m.get("ema", 0)) > 0 else "G"
    G.load_state_dict(state[key])
    return G.eval(), ("uniform" if m.name == "g_pate" else "normal")


def pick(copies: dict[int, Path], *, every: int, points: int) -> dict[int, Path]:
    """The copies whose step is a multiple of ``every``; with ``points``, about that many, evenly spread over the
    steps, always with the first and the last."""
    seen = {k: v for k, v in copies.items() if k % every == 0}
    if points and len(seen) > points:
        points = max(points, 2)  # the first and the last at least
        steps = sorted(seen)
        keep = {steps[round(i * (len(steps) - 1) / (points - 1))] for i in range(points)}
        seen = {k: v for k, v in seen.items() if k in keep}
    return dict(sorted(seen.items()))


def score(run: Path, *, every: int = 500, points: int = 0, n: int = 10000, out: Path | None = None) -> list[dict]:
    """Score the chosen copies of ``run/snap``; writes ``out`` (default ``run/snapshots.tsv``, tab-separated: a training curve, not a results file, so not a
    .csv under experiments/) and a PNG beside it."""
    from dpsyn.cli.evaluate import rescore
    from dpsyn.data import load_dataset

    cfg = OmegaConf.load(run / "config.yaml")
    data = load_dataset(cfg.dataset, seed=int(cfg.seed), data_dir=cfg.paths.data_dir, public=False)
    shape, k = tuple(data.private.x.shape[1:]), len(data.classes)
    copies: dict[int, Path] = {}
    for p in sorted((run / "snap").glob("*.pt")):  # memory-mapped: reading the step does not read the weights
        copies.setdefault(int(torch.load(p, map_location="cpu", weights_only=False, mmap=True)["step"]), p)
    seed = int(cfg.seed)
    labels = np.random.default_rng(seed).permutation(np.arange(n) % k).astype(np.int64)  # the same at every step
    rows, tiles = [], []
    for step, p in pick(copies, every=every, points=points).items():
        state = torch.load(p, map_location="cpu", weights_only=False)
        G, latent = generator_of(cfg, state, shape=shape, num_classes=k)
        with torch.no_grad():
            x = generate_conditional(G, labels, z_dim=int(cfg.method.z_dim), shape=shape, latent=latent,
                                     generator=torch.Generator().manual_seed(seed + 1))
        with tempfile.TemporaryDirectory() as tmp:
            d = Path(tmp)
            shutil.copy(run / "config.yaml", d / "config.yaml")
            np.savez(d / "samples.npz", x=x, y=labels)
            (d / "result.json").write_text("{}")
            vals = rescore(d)["metrics"]
        row = {"step": step, **{key: v for key, v in vals.items() if isinstance(v, (int, float))}}
        print(row, flush=True)
        rows.append(row)
        tiles.append((step, _tile(x, labels, k)))
    out = out or run / "snapshots.tsv"
    with open(out, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=sorted({key for r in rows for key in r}, key=lambda c: (c != "step", c)),
                           delimiter="\t", lineterminator="\n")
        w.writeheader()
        w.writerows(rows)
    print(f"wrote {out}")
    if tiles:  # per scored step a k x k tile of samples sorted by label (a row per class)
        fig, axes = _plt().subplots(1, len(tiles), figsize=(2.2 * len(tiles), 2.6), squeeze=False)
        for ax, (step, tile), row in zip(axes[0], tiles, rows):
            ax.imshow(tile, cmap="gray", vmin=0, vmax=1)
            ax.set_xticks([])
            ax.set_yticks([])
            ax.set_title(f"step {step}" + (f": acc {row['acc']:.3f}" if "acc" in row else ""), fontsize=8)
        fig.suptitle(f"{cfg.method.name} {cfg.dataset.name} eps={cfg.eps} seed {cfg.seed}", fontsize=9)
        fig.tight_layout()
        print(f"wrote {_save(fig, out.with_suffix('.png'))}")
    return rows


def watch(run: Path, name: str, *, interval: float = 5.0, timeout: float | None = None) -> int:
    """Copy ``run/checkpoints/name`` to ``run/snap/ck_<n>.pt`` each time it changes, until ``run/result.json``
    exists (or ``timeout`` seconds pass); returns the number of copies. Checkpoints are written atomically (a
    renamed temporary file), so a copy is never half a file."""
    import time

    src, dst = run / "checkpoints" / name, run / "snap"
    dst.mkdir(parents=True, exist_ok=True)
    last, copies, t0 = None, 0, time.monotonic()
    while True:
        done = (run / "result.json").exists()  # read first: a checkpoint written before the result is still copied
        if src.exists():
            st = src.stat()
            stamp = (st.st_ino, st.st_mtime_ns)  # a renamed-in file is a new inode even within one clock tick
            if stamp != last:
                shutil.copy(src, dst / f"ck_{copies:05d}.pt")
                last, copies = stamp, copies + 1
        if done or (timeout is not None and time.monotonic() - t0 > timeout):
            return copies
        time.sleep(interval)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run", type=Path)
    ap.add_argument("--every", type=int, default=500, help="score the copies whose step is a multiple of this")
    ap.add_argument("--points", type=int, default=0,
                    help="score about this many copies, evenly spread over the steps (0: every --every multiple)")
    ap.add_argument("--n", type=int, default=10000, help="samples per copy")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--watch", metavar="CHECKPOINT", default=None,
                    help="copy RUN/checkpoints/CHECKPOINT whenever it changes, until the run ends (no scoring)")
    args = ap.parse_args()
    if args.watch:
        print(f"{watch(args.run, args.watch)} copies in {args.run / 'snap'}")
        return
    score(args.run, every=args.every, points=args.points, n=args.n, out=args.out)


if __name__ == "__main__":
    main()
