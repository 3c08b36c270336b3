"""The Confident-GNMax mechanism (Papernot et al. 2018, Algorithm 1) on torch tensors, where the votes are (GPU
included). Its accounting is :mod:`dpsyn.privacy.pate.analysis`; torch is imported inside the function.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dpsyn.privacy.gaussian import _check_positive
from dpsyn.privacy.pate.analysis import _check_real

if TYPE_CHECKING:  # pragma: no cover
    import torch


def confident_gnmax(
    votes: torch.Tensor, *, sigma_threshold: float, sigma: float, threshold: float, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """Confident-GNMax (Papernot et al. 2018, Algorithm 1) on a batch of queries.

    Query ``i`` is answered iff ``max_j votes[i, j] + N(0, sigma_threshold^2) >= threshold``; its answer is then
    ``argmax_j (votes[i, j] + N(0, sigma^2))``. The noise comes from ``generator`` only (get it from
    :func:`dpsyn.privacy.dp_generator`: OS entropy unless deterministic for tests), on the votes' device.

    Args:
        votes: Vote counts, shape (queries, bins), on any device.
        sigma_threshold: Std of the threshold noise, > 0.
        sigma: Std of the GNMax noise, > 0.
        threshold: The threshold ``T``.
        generator: A ``torch.Generator`` on the votes' device.

    Returns:
        ``(answered, label)``: bool (queries,) and int64 (queries,) with ``-1`` where not answered.

    Raises:
        ValueError: On invalid arguments or a generator on another device.
    """
    import torch

    if not isinstance(votes, torch.Tensor):
        raise ValueError(f"votes must be a torch.Tensor of shape (queries, bins), got {type(votes).__name__}")
    if votes.ndim != 2 or votes.shape[1] < 2:
        raise ValueError(f"votes must have shape (queries, bins) with at least 2 bins, got {tuple(votes.shape)}")
    if votes.dtype == torch.bool or votes.is_complex():
        raise ValueError(f"votes must hold vote counts, got dtype {votes.dtype}")
    s1 = _check_positive("sigma_threshold", sigma_threshold)
    s2 = _check_positive("sigma", sigma)
    t = _check_real("threshold", threshold)
    if not isinstance(generator, torch.Generator):
        raise ValueError(f"generator must be a torch.Generator (dpsyn.privacy.dp_generator), got {generator!r}")
    gdev, vdev = torch.device(generator.device), votes.device
    if gdev.type != vdev.type or (gdev.index is not None and vdev.index is not None and gdev.index != vdev.index):
        raise ValueError(f"generator is on {gdev} but the votes are on {vdev}")
    dtype = torch.float64 if votes.dtype == torch.float64 else torch.float32  # never half precision for DP noise
    counts = votes.to(dtype)
    q, b = counts.shape
    noise_max = torch.randn(q, generator=generator, device=counts.device, dtype=dtype)
    answered = counts.amax(dim=1) + s1 * noise_max >= t
    noise = torch.randn(q, b, generator=generator, device=counts.device, dtype=dtype)
    label = torch.argmax(counts + s2 * noise, dim=1)
    label = torch.where(answered, label, torch.full_like(label, -1))
    return answered, label
