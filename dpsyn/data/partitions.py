"""Disjoint partitions of the private rows that depend on each row alone: the premise of PATE and GS-WGAN.

PATE-style methods (G-PATE, PATE-GAN) and GS-WGAN train N teachers or critics, each on its own partition of the
private rows, and their privacy analyses rest on one row reaching one teacher or critic. dpsyn's neighbouring
datasets differ by removing (or adding) one row (docs/privacy.md), so the partition of every other row must not
move when a row is removed. Cutting a permutation of ``range(n)`` into chunks of ``n // N`` does not have that
property: removing one row changes n, hence the permutation, and without shuffling it shifts every later row across
a chunk boundary (removing one row of 6,000 moved rows of all 400 partitions).

Here row r goes to partition ``H(key, id_r) mod N``, where ``id_r`` is the row's stable identity, its position in
the source file split (:attr:`dpsyn.data.base.Split.index`: e.g. its index among the 60,000 Fashion-MNIST training
images), and ``key`` is drawn from the run seed, never from the data. Removing or adding a row changes the members
of its own partition only: every other partition keeps exactly its rows (as a set of source ids), whichever row is
removed and in whatever order the rows come (tests/test_partitions.py).

Partitions then differ in size (a binomial count around n / N). Nothing sized from the data is shared between
partitions: the batch a teacher or critic trains on is drawn from its own rows only, by a keyed hash as well
(:meth:`KeyedPartitions.batch`: a fresh keyed order of the partition for each pass through it), so no shared
random stream advances by a data-dependent amount; batch shapes are fixed by the configuration and the declared
n (``nominal_size = n // N``, the partition size the paper's equal cut would give); a partition with fewer rows than
the batch fills it once with all its rows and masks the rest of the slots (an empty partition masks every slot). The
partition sizes themselves are counts of private rows without noise and are never published.

What the papers' equal-size partitions would need: an equal cut that moves one row only when one row changes
exists only when n is fixed, i.e. under replace-one adjacency; the DP-SGD methods' add/remove accounting would then
have to be redone for replace-one (twice the sensitivity), which dpsyn does not do.

The hash is SplitMix64's finaliser (Steele, Lea & Flood 2014), written here because numpy has no vectorised keyed
integer hash (``hashlib`` works one row at a time, and a round of G-PATE hashes ~10^5 ids). It needs no secrecy:
the analyses only need the assignment to be independent of the data.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_ASSIGN, _ORDER = np.uint64(0xA55A61), np.uint64(0x0D3E12)  # domains: which partition, the order inside one


def _mix(x: np.ndarray) -> np.ndarray:
    """SplitMix64's finaliser on uint64 (wrapping arithmetic)."""
    with np.errstate(over="ignore"):
        x = (x ^ (x >> np.uint64(30))) * _M1
        x = (x ^ (x >> np.uint64(27))) * _M2
    return x ^ (x >> np.uint64(31))


def keyed_hash(ids: np.ndarray | Sequence[int], key: np.ndarray | int) -> np.ndarray:
    """(n,) uint64 hashes of integer ``ids`` under ``key`` (an integer or an array broadcasting against ``ids``).

    Independent-looking 64-bit values for distinct (key, id) pairs; the same pair always gives the same value.
    """
    ids = np.asarray(ids).astype(np.int64).view(np.uint64)  # negative ids wrap: still distinct
    key = np.asarray(key, dtype=np.uint64)  # a Python int in [0, 2^64) or a uint64 array
    with np.errstate(over="ignore"):
        return _mix(_mix(key + _GOLDEN) ^ _mix(ids * _GOLDEN + np.uint64(1)))


def partition_key(seed: int, what: str) -> int:
    """A data-independent key in [0, 2^64) for the partitions of a run: a function of the run seed and the user's
    name (``"teachers"``, ``"critics"``), never of the data."""
    name = np.frombuffer(what.encode().ljust(8, b"\0")[:8], dtype=np.uint64)
    return int(keyed_hash(np.asarray([int(seed)]), name)[0])


class KeyedPartitions:
    """N disjoint partitions of the private rows by a keyed hash of each row's source id (module docstring).

    Args:
        ids: (n,) the rows' stable identities (:attr:`dpsyn.data.base.Split.index`); distinct rows should have
            distinct ids (a repeated id puts the repeats in one partition).
        n_parts: N >= 1.
        key: the run's data-independent key (:func:`partition_key`).

    Raises:
        ValueError: ``ids`` is not a 1-D integer array, there are fewer rows than partitions, or ``n_parts < 1``.
    """

    def __init__(self, ids: np.ndarray | Sequence[int], n_parts: int, *, key: int) -> None:
        ids = np.asarray(ids)
        if ids.ndim != 1 or not np.issubdtype(ids.dtype, np.integer):
            raise ValueError(f"partition ids must be a 1-D integer array (the rows' source index), got {ids.dtype} "
                             f"of shape {ids.shape}")
        if int(n_parts) < 1 or len(ids) < int(n_parts):
            raise ValueError(f"{n_parts} partitions need at least as many private rows, got {len(ids)}")
        self.n_parts, self.key = int(n_parts), int(key)
        self._ids = ids.astype(np.int64)
        owner = (keyed_hash(self._ids, np.uint64(self.key) ^ _ASSIGN) % np.uint64(self.n_parts)).astype(np.int64)
        self._owner = owner
        self._order = np.argsort(owner, kind="stable")  # row positions grouped by partition, in row order
        self._size = np.bincount(owner, minlength=self.n_parts).astype(np.int64)
        self._start = np.concatenate([[0], np.cumsum(self._size)[:-1]]).astype(np.int64)
        self.calls = torch.zeros(self.n_parts, dtype=torch.long)  # batches drawn from each partition so far
        self.nominal_size = len(ids) // self.n_parts

    def __len__(self) -> int:
        return self.n_parts

    def owner(self) -> np.ndarray:
        """(n,) the partition of each row, aligned with the rows (for tests and the audit; never published)."""
        return self._owner.copy()

    def members(self, i: int) -> torch.Tensor:
        """Row positions of partition ``i``, in row order."""
        if not 0 <= i < self.n_parts:
            raise IndexError(f"partition {i} of {self.n_parts}")
        s = int(self._start[i])
        return torch.from_numpy(self._order[s: s + int(self._size[i])].copy())

    def member_ids(self, i: int) -> set[int]:
        """Source ids of partition ``i`` (tests)."""
        return {int(v) for v in self._ids[self.members(i).numpy()]}

    def batch(self, parts: Sequence[int] | np.ndarray | torch.Tensor | None, batch: int, *, stream: int = 0,
              calls: Sequence[int] | np.ndarray | torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """``batch`` rows of each partition in ``parts``, drawn from that partition's rows only.

        Partition i's rows (s of them) are read in passes, each a fresh keyed order of its rows (pass p sorts them by
        ``H(key, stream, p, id)``) cut into ``s // batch`` batches (the last ``s mod batch`` rows of a pass wait for
        a later pass, as a reshuffling loader drops them), so a batch holds distinct rows and a pass reads each row at
        most once. A partition of fewer rows than ``batch`` gives all its rows (pass c's order) and masks the other
        slots. Nothing here depends on any other partition's rows, and no random stream is advanced.

        Args:
            parts: (m,) partition ids, or None for all N in order.
            batch: slots per partition, >= 1.
            stream: an independent family of orders (0: the partitions' own training batches, which advance
                :attr:`calls`; another value, with ``calls`` given, reads without advancing anything).
            calls: the batch counter of each partition in ``parts``; None: :attr:`calls`, which is then advanced.

        Returns:
            ``(rows (m, batch) int64 row positions, mask (m, batch) bool)``: masked slots hold row 0 and must be
            given no weight (and no input) by the caller.
        """
        if int(batch) < 1:
            raise ValueError(f"batch must be >= 1, got {batch}")
        b = int(batch)
        parts_np = (np.arange(self.n_parts) if parts is None else
                    np.asarray(parts.cpu() if isinstance(parts, torch.Tensor) else parts, dtype=np.int64).reshape(-1))
        if parts_np.size and (parts_np.min() < 0 or parts_np.max() >= self.n_parts):
            raise IndexError(f"partition ids must lie in [0, {self.n_parts}), got {parts_np}")
        advance = calls is None
        c_np = (self.calls.numpy()[parts_np] if advance else
                np.asarray(calls.cpu() if isinstance(calls, torch.Tensor) else calls, dtype=np.int64).reshape(-1))
        if c_np.shape != parts_np.shape:
            raise ValueError(f"{len(c_np)} calls for {len(parts_np)} partitions")
        m = len(parts_np)
        s = self._size[parts_np]
        per_pass = np.maximum(s // b, 1)  # batches a pass holds (a partition smaller than the batch: one, masked)
        p = c_np // per_pass  # the pass this batch is read from
        offset = (c_np % per_pass) * b  # where it starts inside the pass
        rows = np.zeros((m, b), dtype=np.int64)
        mask = np.zeros((m, b), dtype=bool)
        total = int(s.sum())
        if total:
            seg = np.repeat(np.arange(m), s)  # (total,) which requested partition
            first = np.concatenate([[0], np.cumsum(s)[:-1]])
            within = np.arange(total) - np.repeat(first, s)
            pos = self._order[np.repeat(self._start[parts_np], s) + within]
            key = keyed_hash(p[seg].astype(np.uint64), np.uint64(self.key) ^ _ORDER ^ np.uint64(int(stream) * 2 + 1))
            order = np.lexsort((keyed_hash(self._ids[pos], key), seg))  # by partition, then by the pass's hash
            ranked = pos[order]  # partition j's rows in pass order at [first_j, first_j + s_j)
            slot = np.arange(b)[None, :]
            mask = slot + offset[:, None] < s[:, None]
            idx = np.minimum(first[:, None] + offset[:, None] + slot, total - 1)
            rows = np.where(mask, ranked[idx], 0)
        if advance:
            self.calls[torch.from_numpy(parts_np)] += 1
        return torch.from_numpy(rows), torch.from_numpy(mask)

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The batch counters: functions of the public schedule only (the partitions are recomputed from the rows)."""
        return {"calls": self.calls.clone()}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        calls = state["calls"]
        if tuple(calls.shape) != (self.n_parts,):
            raise ValueError(f"partition state for {tuple(calls.shape)} partitions, this run has {self.n_parts}")
        self.calls = calls.clone().long()


def source_ids(split: object, what: str) -> np.ndarray:
    """The private rows' stable identities (``split.index``), required by the partitioned methods.

    Raises:
        ValueError: the split has no source index (a partition by position would move every later row when one is
            removed).
    """
    index = getattr(split, "index", None)
    if index is None:
        raise ValueError(f"{what} partitions the private rows by their source index (Split.index), which this "
                         "dataset does not provide: a partition by position is not stable under removing a row "
                         "(docs/privacy.md); give the loader's Split an index")
    return np.asarray(index)
