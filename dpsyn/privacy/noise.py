"""Random generators for DP noise.

DP noise must be unpredictable to whoever sees the output: a noise draw that can be reproduced from a published
seed (the run's ``seed`` is in ``result.json``) can be subtracted again, and the release is then not private at all.
So DP noise comes from a generator seeded from OS entropy (``secrets``), never from the run seed, unless the caller
asks for ``deterministic=True`` (``privacy.deterministic_noise=true``: tests and debugging only; such a run is not
private). Everything else random in a run (splits, initialisation, sampling) is seeded from ``seed`` as usual.

These are ordinary PRNGs (torch's Mersenne Twister/Philox, numpy's PCG64) with 63/128-bit OS-entropy seeds, the
standard in DP research code; they are not cryptographically secure (for that, see Opacus's ``secure_mode``).

The two mechanisms that draw DP noise, :func:`gaussian_mechanism` and :func:`laplace_mechanism`, live here too: no
code outside ``dpsyn.privacy`` draws from a DP generator (``tests/test_privacy_noise_sites.py`` checks it).

torch is imported inside :func:`dp_generator` so that ``import dpsyn.privacy`` stays light.
"""

from __future__ import annotations

import logging
import math
import secrets
import sys
from numbers import Integral, Real
from typing import TYPE_CHECKING, Any

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


# --------------------------------------------------------------------------------------------------------------------
# the mechanisms: every DP noise draw of dpsyn goes through these two functions
# --------------------------------------------------------------------------------------------------------------------


def _check_scale(name: str, value: float) -> float:
    if isinstance(value, bool) or not isinstance(value, Real) or not 0.0 < float(value) < math.inf:
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
    return float(value)


def _is_tensor(value: Any) -> bool:
    torch = sys.modules.get("torch")  # a tensor can only exist once torch is imported
    return torch is not None and isinstance(value, torch.Tensor)


def gaussian_mechanism(value: Any, sigma: float, *, generator: Any) -> Any:
    """``value + N(0, sigma^2 I)``: the Gaussian mechanism, noise drawn from a DP generator.

    The caller calibrates ``sigma`` (std of the noise, already multiplied by the L2 sensitivity) and charges the
    release to its ledger; this function only draws. The noise is drawn as the methods drew it by hand before, so a
    run with ``privacy.deterministic_noise=true`` gives the same numbers:

    * numpy (``value`` an array or a number): ``generator.normal(0.0, sigma, size=shape)``, one draw per entry in C
      order (numpy computes ``0.0 + sigma * z``, so this equals ``sigma * generator.standard_normal(shape)``).
    * torch (``value`` a tensor): ``torch.normal(0.0, sigma, size=shape, generator=generator)`` on the generator's
      device in ``value``'s dtype, moved to ``value``'s device (Opacus's own draw in ``DPOptimizer``).

    Args:
        value: The statistic to release (numpy array, number, or torch tensor).
        sigma: Noise standard deviation, finite and > 0 (a non-private release calls nothing).
        generator: ``numpy.random.Generator`` from :func:`dp_numpy_generator` for numpy values, ``torch.Generator``
            from :func:`dp_generator` for tensors.

    Returns:
        The noisy value: a tensor for a tensor, a float for a Python/numpy scalar, else a float64 array.

    Raises:
        ValueError: On a sigma that is not finite and > 0, or a generator of the wrong kind.
    """
    sigma = _check_scale("sigma", sigma)
    if _is_tensor(value):
        import torch

        if not isinstance(generator, torch.Generator):
            raise ValueError(f"a tensor needs a torch.Generator (dpsyn.privacy.dp_generator), got {generator!r}")
        noise = torch.normal(0.0, sigma, size=tuple(value.shape), generator=generator, device=generator.device,
                             dtype=value.dtype if value.is_floating_point() else None)
        return value + noise.to(value.device)
    if not isinstance(generator, np.random.Generator):
        raise ValueError(f"a numpy value needs a numpy Generator (dpsyn.privacy.dp_numpy_generator), got {generator!r}")
    if np.ndim(value) == 0:
        return float(value) + float(generator.normal(0.0, sigma))
    return value + generator.normal(0.0, sigma, size=np.shape(value))


def laplace_mechanism(value: Any, scale: float, *, generator: np.random.Generator) -> Any:
    """``value + Laplace(0, scale)`` on every entry: the Laplace mechanism, noise drawn from a DP generator.

    ``scale`` is the L1 sensitivity over epsilon (:func:`dpsyn.privacy.laplace_scale`); numpy's
    ``Generator.laplace(0.0, scale, size=shape)`` draws the noise, one draw per entry in C order.

    Args:
        value: The statistic to release (numpy array or number).
        scale: The Laplace scale b, finite and > 0.
        generator: A ``numpy.random.Generator`` from :func:`dp_numpy_generator`.

    Returns:
        The noisy value: a float for a scalar, else a float64 array.

    Raises:
        ValueError: On a scale that is not finite and > 0, or a generator that is not a numpy Generator.
    """
    scale = _check_scale("scale", scale)
    if not isinstance(generator, np.random.Generator):
        raise ValueError(f"generator must be a numpy Generator (dpsyn.privacy.dp_numpy_generator), got {generator!r}")
    if np.ndim(value) == 0:
        return float(value) + float(generator.laplace(0.0, scale))
    return value + generator.laplace(0.0, scale, size=np.shape(value))
