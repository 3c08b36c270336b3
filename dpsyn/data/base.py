"""Dataset containers shared by every loader, method and metric.

Images are float32 in [0, 1], NCHW; tables are float32 (N, D). Labels are int64 in 0..num_classes-1 (class
subsets such as ``fmnist_shoes`` are re-indexed, ``classes`` keeps their names in label order).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import numpy as np


@dataclass(frozen=True)
class Split:
    """One set of examples: ``x`` (N, C, H, W) images or (N, D) rows, ``y`` (N,) int64 labels.

    ``index`` (optional, (N,) int64) gives each row's position in the source file split it was drawn from (e.g. the
    60k Fashion-MNIST train split), so that disjointness of private and public data, and membership for
    membership-inference metrics, can be checked without comparing images.
    """

    x: np.ndarray
    y: np.ndarray
    index: np.ndarray | None = None

    def __post_init__(self) -> None:
        if len(self.x) != len(self.y):
            raise ValueError(f"x has {len(self.x)} rows but y has {len(self.y)}")
        if self.index is not None and len(self.index) != len(self.x):
            raise ValueError(f"index has {len(self.index)} entries but x has {len(self.x)} rows")

    def __len__(self) -> int:
        return len(self.x)


@dataclass(frozen=True)
class DataBundle:
    """What a dataset config resolves to: private data, optional public data, and the evaluation split.

    Attributes:
        name: the dataset's config name (``fmnist_shoes``).
        kind: ``"image"`` or ``"table"``.
        private: the sensitive data a method may only touch through a DP mechanism.
        eval: held-out real data for metrics only (the test split, restricted to the private classes); never used
            for training or model selection. In a tuning run (``metrics.split=validation``) it is the validation
            split carved from ``private`` instead (:func:`dpsyn.data.carve_validation`; ``eval_split`` says which).
        public: data a method may use freely, or None.
        classes: class names in label order.
        family: which evaluation network / feature space applies (``fmnist`` for every ``fmnist*``).
        info: provenance (source files, split seed, sizes) recorded in result.json.
        public_classes: class names of ``public``'s labels in label order (public data keeps its own label space,
            e.g. all 10 Fashion-MNIST classes while ``private`` holds 3 re-indexed ones), or None.
        validation: real rows held out of the private split for a protocol's model selection
            (:func:`hold_out_validation`; ``metrics.protocol=dpimagebench``), or None. The method never sees them.
    """

    name: str
    kind: Literal["image", "table"]
    private: Split
    eval: Split
    classes: list[str]
    family: str
    public: Split | None = None
    info: dict = field(default_factory=dict)
    public_classes: list[str] | None = None
    eval_split: str = "eval"  # what ``eval`` holds: the test split, or "validation" (carved from private, tuning)
    validation: Split | None = None

    @property
    def num_classes(self) -> int:
        return len(self.classes)

    @property
    def shape(self) -> tuple[int, ...]:
        """Shape of one example: (C, H, W) or (D,)."""
        return tuple(self.private.x.shape[1:])


def _validation_rows(n: int, size: float, split_seed: int, what: str) -> tuple[np.ndarray, np.ndarray]:
    """(validation, rest) row positions of a private split of ``n`` rows: ``size`` rows (a fraction when < 1, else
    a count), drawn with ``split_seed`` (fixed per dataset, not the run seed) in a stream of their own."""
    k = int(round(size * n)) if size < 1 else int(size)
    if not 1 <= k < n:
        raise ValueError(f"{what}={size}: {k} of {n} private rows; needs 1 <= rows < {n}")
    rng = np.random.default_rng([int(split_seed), 0x7A11D])  # its own stream: not the private/eval split's draws
    perm = rng.permutation(n)
    return np.sort(perm[:k]), np.sort(perm[k:])


def _take(split: Split, idx: np.ndarray) -> Split:
    return Split(split.x[idx], split.y[idx], None if split.index is None else split.index[idx])


def hold_out_validation(bundle: DataBundle, rows: int, split_seed: int) -> DataBundle:
    """The bundle with about ``rows`` private rows moved to ``validation``; ``eval`` (the sealed test split) unchanged.

    For a protocol that selects models on real data (``metrics.protocol=dpimagebench``): the method trains on the
    rest of the private rows, the selection reads only ``validation``, and the evaluation split is read once, at
    the end. A row's side is a keyed hash of its source id (:attr:`Split.index`, :mod:`dpsyn.data.partitions`)
    under a key drawn from ``split_seed``, never from the data: row r is held out iff ``H(key, id_r) < rows / n``
    (n the private rows), so removing or adding a row moves no other row across the cut, which the accounted
    selection (``selection=noisy_max``, composed after the method's release) relies on. The count is then a
    binomial around ``rows``; like the private split's size (DP-SGD's sample rate is batch / n, as in Opacus), the
    sizes of the two sides are treated as public.
    Disjoint from what the method trains on, from the public split and from the test split.

    Raises:
        ValueError: ``rows`` not in [1, n), rows without source ids, or the bundle already holds validation rows.
    """
    from dpsyn.data.partitions import keyed_hash, partition_key

    if bundle.validation is not None:
        raise ValueError("the bundle already holds validation rows")
    n, ids = len(bundle.private), bundle.private.index
    if not 1 <= int(rows) < n:
        raise ValueError(f"metrics.dpimagebench.validation_rows={rows}: needs 1 <= rows < {n} private rows")
    if ids is None:
        raise ValueError(f"{bundle.name}'s private rows carry no source ids (Split.index): the validation rows are "
                         "cut by a keyed hash of them")
    key = partition_key(int(split_seed), "dibval")
    # H / 2^64 < rows / n, in exact integer arithmetic on the uint64 hashes
    held = keyed_hash(np.asarray(ids), np.uint64(key)) < np.uint64(int(rows) * (2 ** 64 // n))
    val, rest = np.flatnonzero(held), np.flatnonzero(~held)
    if len(val) == 0 or len(rest) == 0:
        raise ValueError(f"metrics.dpimagebench.validation_rows={rows} of {n}: the keyed cut left one side empty")
    info = {**bundle.info, "validation": {"rows": int(rows), "of_private": n, "split_seed": int(split_seed),
                                          "carved_from": "private", "held_out": len(val),
                                          "cut": "keyed hash of the rows' source ids (a binomial count around rows)",
                                          "eval_split": "kept (read once, after the selection)"}}
    return DataBundle(name=bundle.name, kind=bundle.kind, private=_take(bundle.private, rest), eval=bundle.eval,
                      classes=bundle.classes, family=bundle.family, public=bundle.public, info=info,
                      public_classes=bundle.public_classes, eval_split=bundle.eval_split,
                      validation=_take(bundle.private, val))


def carve_validation(bundle: DataBundle, size: float, split_seed: int) -> DataBundle:
    """The bundle with a validation split carved from its private rows, in place of the evaluation split.

    For tuning (``metrics.split=validation``): ``size`` rows (a fraction of the private rows when < 1, else a count)
    leave ``private`` (the method never sees them) and become ``eval``, which every metric reads; the real
    evaluation split is dropped from the bundle, so nothing in the run can read it. The rows are drawn with
    ``split_seed`` (fixed per dataset, not the run seed): every trial of a sweep is scored on the same rows.
    Disjoint from the public split and the test split by construction (it is part of the private split).
    """
    n = len(bundle.private)
    val, rest = _validation_rows(n, size, split_seed, "dataset.validation_size")
    k = len(val)
    info = {**bundle.info, "validation": {"rows": k, "of_private": n, "split_seed": int(split_seed),
                                          "carved_from": "private", "eval_split": "dropped (not read by this run)"}}
    return DataBundle(name=bundle.name, kind=bundle.kind, private=_take(bundle.private, rest),
                      eval=_take(bundle.private, val), classes=bundle.classes, family=bundle.family,
                      public=bundle.public, info=info, public_classes=bundle.public_classes,
                      eval_split="validation")
