"""Metrics: registered by name in :data:`METRICS`; :func:`evaluate` runs the configured ones on a run's samples.

Names say which feature space they use: ``fd_<family>`` is the Frechet distance in the embedded evaluation
network's features (``fid`` is reserved for InceptionV3, issue "metrics suite").
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dpsyn.data.base import DataBundle
from dpsyn.metrics.evalnet import extract_features, load_or_train_evalnet
from dpsyn.metrics.fidelity import frechet_distance_from_features
from dpsyn.metrics.utility import downstream_accuracy
from dpsyn.registry import Registry

log = logging.getLogger(__name__)

METRICS: Registry = Registry("metric")


@METRICS.register("fd")
def _fd(samples: Any, data: DataBundle, cfg: Any, env: dict[str, Any]) -> dict[str, Any]:
    """Frechet distance between synthetic samples and the real evaluation split, in evaluation-network features."""
    if data.kind != "image":
        return {}
    family = env["load_family"](data.family)
    net, record = load_or_train_evalnet(family, settings=dict(cfg.evalnet), cache_dir=env["cache_dir"])
    value = frechet_distance_from_features(extract_features(net, samples.x), extract_features(net, data.eval.x))
    return {f"fd_{data.family}": value, f"evalnet_{data.family}_test_acc": record["test_acc"]}


@METRICS.register("acc")
def _acc(samples: Any, data: DataBundle, cfg: Any, env: dict[str, Any]) -> dict[str, Any]:
    """Downstream accuracy (see :mod:`dpsyn.metrics.utility`)."""
    if data.kind != "image":
        return {}
    c = cfg.classifier
    out = downstream_accuracy(
        (samples.x, samples.y),
        (data.eval.x, data.eval.y),
        num_classes=data.num_classes,
        epochs=int(c.epochs),
        batch_size=int(c.batch_size),
        lr=float(c.lr),
        val_fraction=float(c.val_fraction),
        seed=env["seed"],
    )
    return {"acc": out["acc"], "acc_synthetic_val": out["acc_synthetic_val"], "acc_best_epoch": out["best_epoch"]}


def evaluate(
    samples: Any,
    data: DataBundle,
    cfg: Any,
    *,
    cache_dir: str | Path,
    seed: int,
    load_family: Callable[[str], DataBundle],
) -> tuple[dict[str, Any], dict[str, float]]:
    """Run every metric named in ``cfg.names``.

    Returns:
        (metric values, seconds per metric).
    """
    env = {"cache_dir": cache_dir, "seed": seed, "load_family": load_family}
    values: dict[str, Any] = {}
    timings: dict[str, float] = {}
    for name in cfg.names:
        t0 = time.perf_counter()
        values.update(METRICS.get(name)(samples, data, cfg, env))
        timings[name] = time.perf_counter() - t0
        log.info("metric %s done in %.1fs", name, timings[name])
    return values, timings
