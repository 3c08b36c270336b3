"""``python -m dpsyn.cli.pretrain [public=fmnist] [public.generator.steps=N ...]``: train and cache the public models.

Trains (or finds in ``${paths.cache_dir}/public``) the encoder and the instance-conditioned generator of
``conf/public/<name>.yaml`` with progress bars, then prints where they are cached and their recorded quality:
the encoder's test accuracy and how often a decoded test feature is classified as its image's class. For
``kind: real`` it checks that the checkpoints load. ``grid=PATH`` also saves decoded test features as a PNG grid.

``diffusion=true`` also trains (or loads) PE's diffusion model of the config's ``diffusion`` section and prints
where it is cached, its training time and its measured quality (class accuracy of conditional samples, Frechet
distances in the evaluation network's feature space); ``diffusion_grid=PATH`` saves samples per class and SDEdit
variations at degrees 0.2 / 0.5 / 0.8.

``evalnet=<family>`` (``fmnist``, ``digits``, ...) handles that family's evaluation network instead of the public
models: loaded from the cache or the shipped weights, or trained, with the settings of ``metrics.evalnet``
(``conf/metrics/default.yaml``, the ones a run uses; ``metrics.evalnet.epochs=3`` etc. override them), and loaded
from ``paths.data_dir`` as a run loads it, so the key is the one a run looks for. ``ship=true`` trains it afresh and
writes it, with its sidecar (key, settings, test accuracy, sha256), into the package's shipped weights
(``dpsyn/metrics/weights/``), replacing the family's previously shipped network.
"""

from __future__ import annotations

import sys
import time
from typing import Any

import hydra
from omegaconf import DictConfig, OmegaConf

from dpsyn.config import load_group
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
    if record.get("diffusion"):
        lines.extend(format_diffusion_summary(record["diffusion"]))
    return "\n".join(lines)


def format_diffusion_summary(rec: dict[str, Any]) -> list[str]:
    """The diffusion model's lines: cache (or checkpoint), training time, measured quality."""
    if rec.get("kind") == "real":
        where = rec.get("checkpoint") or rec.get("model")
        return [f"  diffusion : {rec['name']} {where}, {rec['ddim_steps']} DDIM steps"]
    where = rec.get("shipped") or rec["cache"]
    lines = [f"  diffusion : {where}" + (" (shipped with dpsyn)" if rec.get("shipped") else "")]
    lines.append(f"    {rec['parameters']} parameters, {rec['steps']} steps of {rec['batch_size']} in "
                 f"{rec['train_seconds']:.1f}s, final loss {rec['final_loss']:.4f}")
    q = rec.get("quality")
    if q:
        line = f"    {q['n']} samples ({q['ddim_steps']} DDIM steps, guidance {q['guidance_scale']}):"
        if "class_acc" in q:
            line += f" class accuracy {q['class_acc']:.4f},"
        line += (f" fd_evalnet {q['fd_evalnet']:.2f} (real images: {q['fd_evalnet_real']:.2f}, "
                 f"unconditional samples: {q['fd_evalnet_uncond']:.2f}); classifier {q['classifier']}")
        lines.append(line)
        var = ", ".join(f"{d}: mse {v['mse']:.4f} acc {v['class_acc']:.3f}" for d, v in q["variation"].items())
        lines.append(f"    variations by degree: {var}")
    return lines


def format_evalnet_summary(record: dict[str, Any], seconds: float) -> str:
    """The lines ``evalnet=<family>`` prints: where the network is, where it came from, its recorded quality."""
    where = record.get("shipped") or record.get("path", "")
    lines = [f"dpsyn: evaluation network '{record['key']}' ({record['source']}), ready in {seconds:.1f}s",
             f"  weights  : {where}",
             f"  settings : {record['settings']}, seed {record['seed']}",
             f"  accuracy : val {record['val_acc']:.4f}, test {record['test_acc']:.4f}"
             + (f", trained in {record['train_seconds']:.1f}s" if "train_seconds" in record else "")]
    if "sha256" in record:
        lines.append(f"  sha256   : {record['sha256']}")
    return "\n".join(lines)


def pretrain_evalnet(cfg: DictConfig) -> dict[str, Any]:
    """Load or train (``ship=true``: train afresh and ship) the evaluation network of the family ``cfg.evalnet``."""
    from pathlib import Path

    from dpsyn.task import family_loader
    from dpsyn.metrics.evalnet import load_or_train_evalnet, ship_evalnet

    family = str(cfg.evalnet)
    options = sorted(p.stem for p in (CONF_DIR / "dataset").glob("*.yaml"))
    if family not in options:
        raise ValueError(f"evalnet={family!r}: no such dataset config; allowed: {', '.join(options)}")
    data = family_loader(cfg)(family)
    if data.kind != "image":
        raise ValueError(f"evalnet={family!r}: evaluation networks are for image datasets, {family} is {data.kind}")
    if data.family != family:
        raise ValueError(f"evalnet={family!r}: {family}'s evaluation network is its family's: evalnet={data.family}")
    settings = OmegaConf.to_container(cfg.metrics.evalnet, resolve=True)
    if cfg.get("ship"):
        weights, record = ship_evalnet(data, settings=settings)
        return {**record, "source": "trained and shipped", "path": str(weights)}
    _, record = load_or_train_evalnet(data, settings=settings, cache_dir=cfg.paths.cache_dir)
    path = Path(cfg.paths.cache_dir) / "evalnet" / f"{record['key']}.safetensors"
    return {**record, "path": str(path)}


def pretrain(cfg: DictConfig) -> dict[str, Any]:
    """Load or train ``cfg.public``; optionally save a grid of decoded features; return the provenance record.
    With ``cfg.evalnet`` set, the family's evaluation network instead (:func:`pretrain_evalnet`)."""
    import torch

    from dpsyn.public import load_public_models

    if cfg.get("num_threads") is not None:
        torch.set_num_threads(int(cfg.num_threads))
    if cfg.get("evalnet"):
        return pretrain_evalnet(cfg)
    if cfg.get("ship"):
        raise ValueError("ship=true ships an evaluation network: give its family, evalnet=<family> (e.g. fmnist)")
    if cfg.get("diffusion"):  # the config error, if any, before any training
        from dpsyn.public.diffusion import check_diffusion_config

        if cfg.public.get("diffusion") is None:
            raise ValueError(f"diffusion=true but public={cfg.public.name} has no diffusion section (public.diffusion)")
        check_diffusion_config(OmegaConf.to_container(cfg.public, resolve=True))
    models = load_public_models(cfg.public, cache_dir=cfg.paths.cache_dir, data_dir=cfg.paths.data_dir)
    if cfg.get("grid"):
        save_decoded_grid(models, cfg, str(cfg.grid))
    if not cfg.get("diffusion"):
        return models.record
    from dpsyn.public.diffusion import load_diffusion_model

    model = load_diffusion_model(cfg.public, cache_dir=cfg.paths.cache_dir, data_dir=cfg.paths.data_dir)
    if cfg.get("diffusion_grid"):
        save_diffusion_grid(model, cfg, str(cfg.diffusion_grid))
    return {**models.record, "diffusion": model.record}


def save_diffusion_grid(model: Any, cfg: DictConfig, path: str, *, per_class: int = 8) -> None:
    """Left: ``per_class`` samples per class (rows). Right: per class, a test image and two SDEdit variations of it
    at each of the degrees 0.2, 0.5, 0.8."""
    import io

    import matplotlib
    import numpy as np
    import torch

    from dpsyn.data import load_dataset
    from dpsyn.results.io import atomic_write

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    data = load_dataset(load_group("dataset", cfg.public.dataset), seed=0,
                        data_dir=cfg.paths.data_dir)
    k = max(1, model.num_classes)
    labels = np.repeat(np.arange(k), per_class) if model.num_classes else np.full(per_class, -1)
    samples = model.random(labels, generator=torch.Generator().manual_seed(0))
    rows = np.array([np.flatnonzero(data.eval.y == c)[0] for c in range(min(k, data.num_classes))])
    x, y = data.eval.x[rows], data.eval.y[rows]
    degrees = (0.2, 0.5, 0.8)
    var = [model.variation(np.repeat(x, 2, axis=0), np.repeat(y, 2), degree=d,
                           generator=torch.Generator().manual_seed(1)) for d in degrees]
    cols = per_class + 1 + 1 + 2 * len(degrees)
    fig, axes = plt.subplots(k, cols, figsize=(cols * 0.7 + 1.4, k * 0.7 + 0.6), squeeze=False)
    names = data.classes if len(data.classes) == k else [str(c) for c in range(k)]
    titles = ["samples"] + [""] * (per_class - 1) + ["", "input"] + [f"d={d}" if j == 0 else ""
                                                                      for d in degrees for j in range(2)]
    for r in range(k):
        tiles = [samples[r * per_class + j] for j in range(per_class)] + [None]
        tiles += [x[r]] + [var[i][2 * r + j] for i in range(len(degrees)) for j in range(2)] if r < len(x) else []
        for j in range(cols):
            ax = axes[r][j]
            ax.set_xticks([])
            ax.set_yticks([])
            for spine in ax.spines.values():
                spine.set_visible(False)
            if j < len(tiles) and tiles[j] is not None:
                img = np.clip(tiles[j], 0, 1)
                ax.imshow(img[0] if img.shape[0] == 1 else np.transpose(img, (1, 2, 0)), cmap="gray", vmin=0, vmax=1)
            if r == 0 and titles[j]:
                ax.set_title(titles[j], fontsize=7)
        axes[r][0].set_ylabel(names[r], rotation=0, ha="right", va="center", fontsize=7)
    fig.suptitle(f"diffusion model: class-conditional samples | SDEdit variations ({model.record.get('key', '')})",
                 fontsize=8)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    plt.close(fig)
    atomic_write(path, lambda f: f.write(buf.getvalue()))


def save_decoded_grid(models: Any, cfg: DictConfig, path: str, *, per_class: int = 10) -> None:
    """Rows = classes; in each row, pairs (real test image, decoded image of its feature)."""
    import numpy as np
    import torch

    from dpsyn.data import load_dataset
    from dpsyn.results.grid import save_sample_grid

    data = load_dataset(load_group("dataset", cfg.public.dataset), seed=0,
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
    if cfg.get("evalnet"):
        print(format_evalnet_summary(record, time.perf_counter() - t0))
        return
    print(format_summary(record, time.perf_counter() - t0))
    if cfg.get("grid"):
        print(f"  grid      : {cfg.grid}")
    if cfg.get("diffusion") and cfg.get("diffusion_grid"):
        print(f"  diffusion grid: {cfg.diffusion_grid}")


def main() -> None:
    _hydra_main()


if __name__ == "__main__":
    main()
