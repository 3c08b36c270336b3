"""``python -m dpsyn.cli.evaluate run_dir=DIR [metrics=full] [metrics.KEY=VALUE ...]``: re-score a run's saved samples.

Loads the run's resolved ``config.yaml`` and ``samples.npz``, runs the metrics (the run's own metric config, or
another group choice such as ``metrics=full``, with dotted overrides), and merges the new values into the run's
``result.json`` atomically, recording when and with which metric names it was re-scored. No training, no privacy
spent: the samples are the released, already-accounted output. Only completed runs (with ``result.json``) are scored.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
from omegaconf import OmegaConf, open_dict

from dpsyn.cli.config_check import ConfigError, group_options
from dpsyn.paths import CONF_DIR


def _metrics_group(name: str) -> Any:
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    if name not in group_options("metrics"):
        raise ConfigError(f"metrics={name}: unknown metrics config; allowed: {', '.join(group_options('metrics'))}")
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            return compose("train", overrides=[f"metrics={name}"]).metrics
    finally:
        GlobalHydra.instance().clear()


def rescore(run_dir: str | Path, overrides: list[str] | None = None) -> dict[str, Any]:
    """Re-run the metrics on ``run_dir``'s samples and update its ``result.json``; returns the updated record."""
    from dpsyn.task import family_loader
    from dpsyn.data import load_dataset
    from dpsyn.methods import Samples
    from dpsyn.metrics import evaluate
    from dpsyn.results.io import atomic_write_json, read_json

    run_dir = Path(run_dir)
    for name in ("config.yaml", "samples.npz", "result.json"):
        if not (run_dir / name).is_file():
            raise ConfigError(f"run_dir={run_dir}: no {name} (only completed runs can be re-scored)")
    cfg = OmegaConf.load(run_dir / "config.yaml")
    split = str(cfg.metrics.get("split", "eval"))
    overrides = list(overrides or [])
    group = [o for o in overrides if o.startswith("metrics=")]
    if group:
        with open_dict(cfg):
            cfg.metrics = _metrics_group(group[-1].split("=", 1)[1])
    dotted = [o for o in overrides if not o.startswith("metrics=")]
    bad = [o for o in dotted if not o.startswith("metrics.")]
    if bad:
        raise ConfigError(f"{bad[0]}: only metric settings can change when re-scoring; allowed: metrics=..., metrics.KEY=VALUE")
    if dotted:
        cfg = OmegaConf.merge(cfg, OmegaConf.from_dotlist(dotted))
    if str(cfg.metrics.get("split", "eval")) != split:
        raise ConfigError(f"metrics.split={cfg.metrics.split}: this run was scored on its {split} split; re-scoring "
                          "keeps it (a tuned run is scored on eval by `python -m dpsyn.cli.tune final`)")
    data = load_dataset(cfg.dataset, seed=int(cfg.seed), data_dir=cfg.paths.data_dir, public=False)  # metrics read none
    if split == "validation":  # the rows the run held out, as in the run: the eval split is not read
        from dpsyn.data import carve_validation

        data = carve_validation(data, float(cfg.dataset.validation_size), int(cfg.dataset.split_seed))
    with np.load(run_dir / "samples.npz") as z:
        y = z["y"] if z["y"].size else None
        samples = Samples(z["x"], y, {"loaded_from": str(run_dir / "samples.npz")})
    values, timings, info = evaluate(samples, data, cfg.metrics, cache_dir=cfg.paths.cache_dir, seed=int(cfg.seed),
                                     load_family=family_loader(cfg))
    result = read_json(run_dir / "result.json")
    result["metrics"] = {**result.get("metrics", {}), **values}
    result["metric_info"] = {**result.get("metric_info", {}), **info}
    result.setdefault("rescored", []).append(
        {"time": time.strftime("%Y-%m-%dT%H:%M:%S"), "metrics": list(values), "overrides": overrides,
         "timings": timings}
    )
    atomic_write_json(run_dir / "result.json", result)
    return result


def main(argv: list[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    run_dirs = [a.split("=", 1)[1] for a in args if a.startswith("run_dir=")]
    if len(run_dirs) != 1:
        print("usage: python -m dpsyn.cli.evaluate run_dir=DIR [metrics=NAME] [metrics.KEY=VALUE ...]", file=sys.stderr)
        sys.exit(2)
    try:
        result = rescore(run_dirs[0], [a for a in args if not a.startswith("run_dir=")])
    except ConfigError as e:
        print(f"dpsyn: config error: {e}", file=sys.stderr)
        sys.exit(2)
    print(f"dpsyn: re-scored {run_dirs[0]}")
    for k in result["rescored"][-1]["metrics"]:
        v = result["metrics"][k]
        print(f"  {k:<24} : {v:.4f}" if isinstance(v, float) else f"  {k:<24} : {v}")


if __name__ == "__main__":
    main()
