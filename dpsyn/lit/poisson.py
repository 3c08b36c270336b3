"""What a DP-SGD trainer's sampling and step count are: the Poisson loaders (one process, or one rank's shard under
``trainer=ddp``) and the number of steps a Lightning Trainer will run, which the noise is calibrated for.

Shared by :mod:`dpsyn.lit.dpsgd`, :mod:`dpsyn.lit.gan` and :mod:`dpsyn.lit.ddp`, and importing none of them.
"""

from __future__ import annotations

import math

import torch
from opacus.utils.uniform_sampler import DistributedUniformWithReplacementSampler
from torch.utils.data import DataLoader, Dataset


def planned_steps(*, epochs: int, batches_per_epoch: int, limit_train_batches: int | float | None) -> int:
    """Number of discriminator steps a Trainer will run (what the noise is calibrated for).

    Follows Lightning's convention: a float ``limit_train_batches`` is a fraction of the epoch, an int a count.
    """
    if limit_train_batches is None:
        per_epoch = batches_per_epoch
    elif isinstance(limit_train_batches, float):
        per_epoch = max(1, int(math.floor(batches_per_epoch * limit_train_batches)))
    else:
        per_epoch = min(batches_per_epoch, int(limit_train_batches))
    return epochs * per_epoch


class DistributedPoissonBatchSampler(DistributedUniformWithReplacementSampler):
    """Opacus's distributed Poisson sampler (this rank's shard, each row kept with probability ``sample_rate``), but
    yielding every batch, empty ones included: all ranks make the same number of steps, and an empty shard batch
    still takes part in the step (clipped sum zero), as in one-process DP-SGD. The shards are a fixed partition
    (``shuffle=False``: rank r holds rows r, r + W, ...; the partition is public, the sampling is not)."""

    def __init__(self, *, total_size: int, sample_rate: float, generator: torch.Generator) -> None:
        super().__init__(total_size=total_size, sample_rate=sample_rate, shuffle=False, generator=generator)

    def __iter__(self):  # type: ignore[override]
        indices = torch.arange(self.rank, self.total_size, self.num_replicas)
        for _ in range(self.num_batches):
            mask = torch.rand(self.num_samples, generator=self.generator) < self.sample_rate
            yield indices[mask].tolist()


def distributed_poisson_loader(data: Dataset, *, sample_rate: float, generator: torch.Generator) -> DataLoader:
    """This rank's Poisson loader (:class:`DistributedPoissonBatchSampler`), empty batches shaped like full ones
    (Opacus's collate wrapper). Needs the process group initialised."""
    from opacus.data_loader import dtype_safe, shape_safe, wrap_collate_with_empty
    from torch.utils.data import default_collate

    first = data[0]
    sampler = DistributedPoissonBatchSampler(total_size=len(data), sample_rate=sample_rate,  # type: ignore[arg-type]
                                             generator=generator)
    collate = wrap_collate_with_empty(collate_fn=default_collate,
                                      sample_empty_shapes=[(0, *shape_safe(x)) for x in first],
                                      dtypes=[dtype_safe(x) for x in first])
    return DataLoader(data, batch_sampler=sampler, collate_fn=collate)
