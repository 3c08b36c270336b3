"""Random generators for DP noise.

DP noise must be unpredictable to whoever sees the output: a noise draw that can be reproduced from a published
seed (the run's ``seed`` is in ``result.json``) can be subtracted again, and the release is then not private at all.
So DP noise comes from a generator seeded from OS entropy (``secrets``), never from the run seed, unless the caller
asks for ``deterministic=True`` (``privacy.deterministic_noise=true``: tests and debugging only; such a run is not
private). Everything else random in a run (splits, initialisation, sampling) is seeded from ``seed`` as usual.

These are ordinary PRNGs (torch's Mersenne Twister/Philox, numpy's PCG64) with 63/128-bit OS-entropy seeds, the
standard in DP research code; they are not cryptographically secure (for that, see Opacus's ``secure_mode``).

torch is imported inside :func:`dp_generator` so that ``import dpsyn.privacy`` stays light.
"""

from __future__ import annotations

import logging
import secrets
from numbers import Integral
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:  # pragma: no cover
    import torch

logger = logging.getLogger(__name__)


def _resolve_seed(*, deterministic: bool, seed: int | None, bits: int) -> int:
    """The seed to use: ``seed`` when deterministic (then required), else ``bits`` bits of OS entropy."""
    if not isinstance(deterministic, bool):
        raise ValueError(f"deterministic must be True or False, got {deterministic!r}")
    if deterministic:
        if seed is None:
            raise ValueError("deterministic DP noise needs a seed (deterministic=True, seed=None)")
        if isinstance(seed, bool) or not isinstance(seed, Integral) or seed < 0:
            raise ValueError(f"seed must be an integer >= 0, got {seed!r}")
        logger.warning("DP noise is seeded deterministically (seed=%d): this run is NOT private", seed)
        return int(seed) % (1 << bits)
    if seed is not None:
        logger.debug("dp noise: seed %r ignored because deterministic=False (noise seeded from OS entropy)", seed)
    return secrets.randbits(bits)


def dp_generator(*, deterministic: bool = False, seed: int | None = None, device: str = "cpu") -> torch.Generator:
    """A ``torch.Generator`` for DP noise, seeded from OS entropy unless ``deterministic``.

    A noise draw reproducible from a published seed is not private, hence OS entropy by default.

    Args:
        deterministic: Seed from ``seed`` instead (tests only; the run is then not private).
        seed: The seed, required when ``deterministic`` and ignored otherwise.
        device: Device of the generator ("cpu", "cuda", "cuda:1", ...).

    Returns:
        A seeded ``torch.Generator`` on ``device``.

    Raises:
        ValueError: If ``deterministic`` is True and ``seed`` is missing or not an integer >= 0.
    """
    import torch

    gen = torch.Generator(device=device)
    gen.manual_seed(_resolve_seed(deterministic=deterministic, seed=seed, bits=63))
    return gen


def dp_numpy_generator(*, deterministic: bool = False, seed: int | None = None) -> np.random.Generator:
    """A ``numpy.random.Generator`` for DP noise, seeded from OS entropy unless ``deterministic``.

    A noise draw reproducible from a published seed is not private, hence OS entropy by default.

    Args:
        deterministic: Seed from ``seed`` instead (tests only; the run is then not private).
        seed: The seed, required when ``deterministic`` and ignored otherwise.

    Returns:
        A seeded ``numpy.random.Generator`` (PCG64).

    Raises:
        ValueError: If ``deterministic`` is True and ``seed`` is missing or not an integer >= 0.
    """
    return np.random.default_rng(_resolve_seed(deterministic=deterministic, seed=seed, bits=128))
