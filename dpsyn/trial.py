"""A private tuning trial's side of a run (:mod:`dpsyn.private_tuning`): whether a composed config is a trial, and
the DP score that replaces its metrics.

:func:`dpsyn.task.run` reads these; the search (:func:`dpsyn.private_tuning.private_search`) calls the task, so
they live here, below both.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from omegaconf import DictConfig

from dpsyn.config import ConfigError

TRIAL_ROLE = "private_trial"
SCORE = "dp_score"


def is_private_trial(cfg: DictConfig) -> bool:
    t = cfg.get("tuning")
    return t is not None and t.get("role") == TRIAL_ROLE


def noised_count(counts: np.ndarray, *, noise_multiplier: float, generator: np.random.Generator) -> np.ndarray:
    """The DP score's mechanism: counts (sensitivity 1 each) + N(0, noise_multiplier^2); audited by
    ``python -m dpsyn.cli.audit`` (row ``private_tuning_score``)."""
    from dpsyn.privacy import gaussian_mechanism

    return gaussian_mechanism(np.asarray(counts, dtype=np.float64), float(noise_multiplier), generator=generator)


def trial_score(metrics: dict[str, Any], metric_info: dict[str, Any], cfg: DictConfig, ledger: Any
                ) -> tuple[dict[str, Any], dict[str, Any]]:
    """Replace a trial's metrics by its DP score: the count of correct validation predictions plus Gaussian noise
    (recorded in ``ledger`` first), divided by the number of validation rows."""
    from dpsyn.privacy import GaussianEvent, dp_numpy_generator

    if "acc" not in metrics:
        raise ConfigError("private tuning scores trials by downstream accuracy: metrics.names.image must hold acc "
                          "(an image dataset)")
    n = int(metric_info["acc"]["n_test"])
    correct = float(round(float(metrics["acc"]) * n))
    nm = float(cfg.tuning.score_noise_multiplier)
    ledger.add(GaussianEvent(noise_multiplier=nm, count=1,
                             label="private tuning: count of correct validation predictions + Gaussian noise "
                                   "(sensitivity 1)"))
    gen = dp_numpy_generator(deterministic=bool(cfg.privacy.deterministic_noise), seed=int(cfg.seed) + 104729)
    noisy = float(noised_count(np.array([correct]), noise_multiplier=nm, generator=gen)[0])
    values = {SCORE: noisy / n}
    info = {SCORE: {"what": "(correct validation predictions + N(0, nm^2)) / n_validation", "noise_multiplier": nm,
                    "n_validation": n, "sensitivity": 1}}
    return values, info
