"""The Laplace mechanism on class counts: G-PATE's (and PATE-GAN's) first step on unbalanced tables.

G-PATE (paper 002, Sec. 5, Kaggle Credit) releases the class distribution of the private table with the Laplace
mechanism at eps = 0.01, then trains a (0.99, 1e-5)-DP generator and samples labels from the released distribution;
basic composition makes the whole (1, 1e-5)-DP. :func:`dp_class_proportions` is that first step.

Neighbouring tables differ by adding or removing one row (the relation of every other dpsyn accountant), which
changes exactly one class count by 1: the histogram's L1 sensitivity is 1, and Laplace noise of scale 1/eps on each
count is eps-DP (Dwork & Roth 2014, Thm 3.6). The clamping at 0 and the normalisation are post-processing. The
ledger records it as ``ApproxDPEvent(epsilon=eps, delta=0)``.

:func:`dpsyn.privacy.noise.laplace_mechanism` draws the noise (numpy's ``Generator.laplace``).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from dpsyn.privacy.noise import laplace_mechanism


def laplace_scale(*, epsilon: float, sensitivity: float = 1.0) -> float:
    """Scale b = sensitivity / epsilon of the eps-DP Laplace mechanism.

    Raises:
        ValueError: epsilon not finite and > 0, or sensitivity not > 0.
    """
    for name, v in (("epsilon", epsilon), ("sensitivity", sensitivity)):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < float(v) < math.inf:
            raise ValueError(f"{name} must be a finite number > 0, got {v!r}")
    return float(sensitivity) / float(epsilon)


def dp_class_counts(labels: Any, num_classes: int, *, epsilon: float, generator: np.random.Generator) -> np.ndarray:
    """The class histogram of ``labels`` plus Laplace(1/epsilon) noise on every count (eps-DP; not clamped).

    Args:
        labels: Integer labels in [0, num_classes).
        num_classes: Number of classes (a public fact: classes absent from the data still get a noisy count).
        epsilon: The release's epsilon.
        generator: DP noise source (:func:`dpsyn.privacy.dp_numpy_generator`; never from the run seed).

    Returns:
        (num_classes,) float64 noisy counts.
    """
    if isinstance(num_classes, bool) or not isinstance(num_classes, (int, np.integer)) or num_classes < 1:
        raise ValueError(f"num_classes must be an integer >= 1, got {num_classes!r}")
    y = np.asarray(labels)
    # fractional labels would be truncated silently by the cast below: refuse them
    integral = y.dtype.kind in "iu" or (y.dtype.kind == "f" and bool(np.all(y == np.floor(y))))
    if y.ndim != 1 or not integral or (y.size and (y.min() < 0 or y.max() >= num_classes)):
        raise ValueError(f"labels must be a 1-d array of integers in [0, {num_classes})")
    counts = np.bincount(y.astype(np.int64), minlength=num_classes).astype(np.float64)
    return laplace_mechanism(counts, laplace_scale(epsilon=epsilon), generator=generator)


def dp_class_proportions(
    labels: Any, num_classes: int, *, epsilon: float, generator: np.random.Generator
) -> np.ndarray:
    """eps-DP class proportions: :func:`dp_class_counts`, clamped at 0 and normalised (uniform when every noisy count
    is <= 0). Post-processing of the noisy counts, so eps-DP as well."""
    noisy = np.maximum(dp_class_counts(labels, num_classes, epsilon=epsilon, generator=generator), 0.0)
    if not noisy.sum() > 0:
        return np.full(num_classes, 1.0 / num_classes)
    return noisy / noisy.sum()
