"""``python -m dpsyn.cli.pretrain [public=fmnist] [public.generator.steps=N ...]``: train and cache the public models.

Trains (or finds in ``${paths.cache_dir}/public``) the encoder and the instance-conditioned generator of
``conf/public/<name>.yaml`` with progress bars, then prints where they are cached and their recorded quality:
the encoder's test accuracy and how often a decoded test feature is classified as its image's class. For
``kind: real`` it checks that the checkpoints load. ``grid=PATH`` also saves decoded test features as a PNG grid.
"""

from __future__ import annotations

import sys
import time
from typing import Any

import hydra
from omegaconf import DictConfig

from dpsyn.paths import CONF_DIR


def format_summary(record: dict[str, Any], seconds: float) -> str:
    """The lines the command prints: cache locations (or checkpoints) and the recorded quality numbers."""
    lines = [f"dpsyn: public models '{record['config']['name']}' ({record['kind']}), ready in {seconds:.1f}s"]
    enc, gen = record["encoder"], record["generator"]
    if record["kind"] == "real":
        lines.append(f"  encoder   : {enc['name']} {enc['checkpoint']}")
        lines.append(f"  generator : {gen['checkpoint']}")
        return "\n".join(lines)
    lines.append(f"  encoder   : {record['cache']['encoder']}")
    lines.append(f"    d={enc['feature_dim']}, val acc {enc['val_acc']:.4f}, test acc {enc['test_acc']:.4f}, "
                 f"trained in {enc['train_seconds']:.1f}s")
    lines.append(f"  generator : {record['cache']['generator']}")
    line = f"    {gen['steps']} steps in {gen['train_seconds']:.1f}s, k-NN ({gen['knn_backend']})"
    if "neighbourhood_purity" in gen:
        line += f" class purity {gen['neighbourhood_purity']:.4f}"
    lines.append(line)
    quality = gen.get("quality")
    if quality:
        lines.append(
            f"    decoded-class accuracy {quality['decoded_class_acc']:.4f} on {quality['n']} test images "
            f"(classifier: {quality['classifier']}, {quality['real_class_acc']:.4f} on the real images)"
        )
    return "\n".join(lines)


def pretrain(cfg: DictConfig) -> dict[str, Any]:
    """Load or train ``cfg.public``; optionally save a grid of decoded features; return the provenance record."""
    import torch

    from dpsyn.public import load_public_models

    if cfg.get("num_threads") is not None:
        torch.set_num_threads(int(cfg.num_threads))
    models = load_public_models(cfg.public, cache_dir=cfg.paths.cache_dir, data_dir=cfg.paths.data_dir)
    if cfg.get("grid"):
        save_decoded_grid(models, cfg, str(cfg.grid))
    return models.record


def save_decoded_grid(models: Any, cfg: DictConfig, path: str, *, per_class: int = 10) -> None:
    """Rows = classes; in each row, pairs (real test image, decoded image of its feature)."""
    import numpy as np
    import torch
    from omegaconf import OmegaConf

    from dpsyn.data import load_dataset
    from dpsyn.results.grid import save_sample_grid

    data = load_dataset(OmegaConf.load(CONF_DIR / "dataset" / f"{cfg.public.dataset}.yaml"), seed=0,
                        data_dir=cfg.paths.data_dir)
    half = per_class // 2
    rows = np.concatenate([np.flatnonzero(data.eval.y == c)[:half] for c in range(data.num_classes)])
    real = data.eval.x[rows]
    decoded = models.decode(models.encode(real), generator=torch.Generator().manual_seed(0))
    x = np.stack([real, decoded], axis=1).reshape(-1, *real.shape[1:])  # real, decoded, real, decoded, ...
    y = np.repeat(data.eval.y[rows], 2)
    save_sample_grid(path, x, y, data.classes, per_class=2 * half,
                     title="pairs: test image, g(z, h(image)) (public models)")


@hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name="pretrain")
def _hydra_main(cfg: DictConfig) -> None:
    t0 = time.perf_counter()
    try:
        record = pretrain(cfg)
    except (ValueError, FileNotFoundError, ImportError) as err:
        print(f"dpsyn: pretrain: {err}", file=sys.stderr)
        sys.exit(2)
    print(format_summary(record, time.perf_counter() - t0))
    if cfg.get("grid"):
        print(f"  grid      : {cfg.grid}")


def main() -> None:
    _hydra_main()


if __name__ == "__main__":
    main()
