"""Partitions that depend on the row alone (dpsyn.data.partitions): removing any private row changes its own
partition only, for the keyed partitions and for the three methods that train on them (g_pate, pate_gan, gs_wgan);
a teacher or critic that did not hold the removed row trains bit for bit the same."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
import torch

from dpsyn.data.base import Split
from dpsyn.data.partitions import KeyedPartitions, keyed_hash, partition_key, source_ids
from tests.conftest import run_context

RNG = np.random.default_rng(20261207)


def _members(parts: KeyedPartitions, ids: np.ndarray) -> list[frozenset[int]]:
    """Each partition as a set of source ids."""
    return [frozenset(int(v) for v in ids[parts.members(i).numpy()]) for i in range(parts.n_parts)]


def _removals(n: int) -> list[int]:
    return [0, n // 2, n - 1, *RNG.choice(n, size=5, replace=False).tolist()]


@pytest.mark.parametrize("shuffled", [False, True])
def test_removing_any_row_changes_exactly_its_own_partition(shuffled: bool) -> None:
    """6,000 rows in 400 partitions (the cut into chunks moved rows of all 400): removing the first, a middle, the
    last or a random row leaves 399 partitions with exactly their source ids, in the rows' order or shuffled."""
    n, k = 6000, 400
    ids = 10_000 + np.arange(n) * 7  # source ids need not be 0..n-1
    order = RNG.permutation(n) if shuffled else np.arange(n)
    key = partition_key(3, "teachers")
    full = _members(KeyedPartitions(ids[order], k, key=key), ids[order])
    assert sorted(v for m in full for v in m) == sorted(ids.tolist())  # disjoint, and every row in one
    for r in _removals(n):
        kept = np.delete(ids[order], r)
        rest = _members(KeyedPartitions(kept, k, key=key), kept)
        changed = [i for i in range(k) if rest[i] != full[i]]
        assert len(changed) == 1 and full[changed[0]] - rest[changed[0]] == {int(ids[order][r])}
    # the row order does not matter: the same partitions, shuffled or not
    other = RNG.permutation(n)
    assert _members(KeyedPartitions(ids[other], k, key=key), ids[other]) == full


def test_the_key_is_data_independent_and_decides_the_partitions() -> None:
    ids = np.arange(1000)
    a = _members(KeyedPartitions(ids, 10, key=partition_key(0, "teachers")), ids)
    assert a == _members(KeyedPartitions(ids, 10, key=partition_key(0, "teachers")), ids)
    assert a != _members(KeyedPartitions(ids, 10, key=partition_key(1, "teachers")), ids)
    assert a != _members(KeyedPartitions(ids, 10, key=partition_key(0, "critics")), ids)
    sizes = [len(m) for m in a]
    assert min(sizes) > 60 and max(sizes) < 140  # binomial(1000, 0.1) around 100
    h = keyed_hash(ids, 5)
    assert h.dtype == np.uint64 and len(np.unique(h)) == 1000 and np.array_equal(h, keyed_hash(ids, 5))


def test_batches_come_from_the_partition_alone_and_a_small_one_masks_the_rest() -> None:
    ids = np.arange(103)
    parts = KeyedPartitions(ids, 10, key=partition_key(0, "teachers"))
    owner = parts.owner()
    sizes = np.bincount(owner, minlength=10)
    for c in range(6):
        rows, mask = parts.batch(None, 12)
        assert rows.shape == mask.shape == (10, 12)
        for i in range(10):
            got = rows[i][mask[i]].numpy()
            assert (owner[got] == i).all() and len(set(got.tolist())) == len(got) == min(12, sizes[i])
            assert (rows[i][~mask[i]] == 0).all()
    assert parts.calls.tolist() == [6] * 10
    # another stream, with counters given, reads other orders and advances nothing
    r1, _ = parts.batch([3], 4, stream=2, calls=[0])
    assert parts.calls.tolist() == [6] * 10 and (owner[r1[0].numpy()] == 3).all()
    # an empty partition masks every slot
    one = KeyedPartitions(np.array([5]), 1, key=1)
    empty = KeyedPartitions.__new__(KeyedPartitions)
    empty.__dict__.update(one.__dict__)
    empty._size = np.array([0, 1])
    empty._start = np.array([0, 0])
    empty.n_parts = 2
    empty.calls = torch.zeros(2, dtype=torch.long)
    rows, mask = empty.batch([0], 3)
    assert not mask.any()


def test_a_batch_sequence_depends_on_its_partition_only() -> None:
    """Teacher 2's batches are the same whether or not a row of another partition is removed (no shared stream)."""
    ids = np.arange(500)
    key = partition_key(0, "teachers")
    full = KeyedPartitions(ids, 20, key=key)
    victim = int(np.flatnonzero(full.owner() != 2)[17])
    kept = np.delete(ids, victim)
    less = KeyedPartitions(kept, 20, key=key)
    for _ in range(5):
        a, ma = full.batch(None, 16)
        b, mb = less.batch(None, 16)
        assert torch.equal(ma[2], mb[2])
        assert np.array_equal(ids[a[2][ma[2]].numpy()], kept[b[2][mb[2]].numpy()])


def test_a_split_without_source_ids_is_refused() -> None:
    with pytest.raises(ValueError, match="source index"):
        source_ids(Split(np.zeros((3, 2), np.float32), np.zeros(3, np.int64)), "g_pate")
    with pytest.raises(ValueError, match="at least as many"):
        KeyedPartitions(np.arange(3), 4, key=0)


# ---- the methods -------------------------------------------------------------------------------------------------

TINY = {
    "g_pate": ("method=g_pate", "dataset=fmnist", "method.teachers=8", "method.batch_size=4", "method.projection_dim=2",
               "method.sigma_threshold=100", "method.sigma=50", "method.threshold=10", "method.teacher_arch=conv",
               "method.ndf=2", "method.z_dim=8", "method.ngf=4", "method.teacher_chunk=null",
               "method.checkpoint_every=0", "method.steps=1"),
    "pate_gan": ("method=pate_gan", "dataset=fmnist", "method.teachers=8", "method.batch_size=4",
                 "method.teacher_batch=3", "method.sigma_threshold=100", "method.sigma=50", "method.threshold=5",
                 "method.ndf=2", "method.student_ndf=4", "method.z_dim=8", "method.ngf=4", "method.teacher_chunk=null",
                 "method.checkpoint_every=0", "method.steps=1"),
    "gs_wgan": ("method=gs_wgan", "dataset=fmnist", "method.critics=8", "method.batch_size=4", "method.critic_steps=1",
                "method.ndf=2", "method.ngf=4", "method.z_dim=8", "method.iterations=1", "method.checkpoint_every=0",
                "method.warm_start_iterations=2"),
}


def _images(n: int = 96) -> Split:
    g = np.random.default_rng(0)
    return Split(g.random((n, 1, 28, 28), dtype=np.float32), g.integers(0, 3, n).astype(np.int64),
                 5000 + np.arange(n) * 3)


def _fit_capturing(method: str, make_cfg: Any, data: Split, mp: pytest.MonkeyPatch) -> dict[str, Any]:
    """Fit ``method`` on ``data`` (eps=1, deterministic noise), capturing its partitions and its teachers or critics
    right after their first training (before any answer of the ledger's mechanism reached them)."""
    with mp.context() as monkeypatch:
        return _fit_and_capture(method, make_cfg, data, monkeypatch)


def _fit_and_capture(method: str, make_cfg: Any, data: Split, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    from dpsyn.methods import METHODS, PrivacyBudget
    from dpsyn.methods import gs_wgan as gs
    from dpsyn.nets.ensemble import TeacherEnsemble
    from dpsyn.privacy import PrivacyLedger

    got: dict[str, Any] = {}
    real_init = KeyedPartitions.__init__

    def init(self: KeyedPartitions, ids: Any, n_parts: int, *, key: int) -> None:
        real_init(self, ids, n_parts, key=key)
        got["parts"] = self
        got["ids"] = np.asarray(ids)

    monkeypatch.setattr(KeyedPartitions, "__init__", init)
    real_batch = KeyedPartitions.batch

    def batch(self: KeyedPartitions, *a: Any, **kw: Any) -> Any:
        rows, mask = real_batch(self, *a, **kw)
        got.setdefault("first_batch", rows[mask])  # rows read by the first training step
        return rows, mask

    monkeypatch.setattr(KeyedPartitions, "batch", batch)
    if method == "gs_wgan":
        real_warm = gs.warm_start

        def warm(bank: Any, parts: Any, **kw: Any) -> None:
            real_warm(bank, parts, **kw)
            got["trained"] = [bank.flat(i).clone() for i in range(bank.k)]

        monkeypatch.setattr(gs, "warm_start", warm)
    else:
        real_step = TeacherEnsemble.train_step

        def step(self: TeacherEnsemble, *a: Any, **kw: Any) -> Any:
            out = real_step(self, *a, **kw)
            got.setdefault("trained", [torch.cat([p.detach().flatten() for p in self.teacher(i).parameters()])
                                       for i in range(self.n_teachers)])
            return out

        monkeypatch.setattr(TeacherEnsemble, "train_step", step)
    cfg = make_cfg(*TINY[method], "eps=1", "privacy.deterministic_noise=true")
    ctx = run_context(cfg=cfg, shape=(1, 28, 28), classes=["a", "b", "c"])
    m = METHODS.get(method)(cfg.method, ctx)
    m.fit(data, PrivacyBudget(1.0, 1e-5), PrivacyLedger(target_epsilon=1.0, delta=1e-5))
    return got


@pytest.mark.parametrize("method", list(TINY))
def test_each_method_changes_one_partition_and_one_teacher_when_a_row_is_removed(method: str, make_cfg: Any,
                                                                                  monkeypatch: pytest.MonkeyPatch
                                                                                  ) -> None:
    """The methods' own partitions (as sets of source ids) differ in one partition only when the first, a middle
    or a random row is removed, and after their first training every teacher or critic but the one that held the
    row has bit-identical parameters (deterministic noise, tiny problem)."""
    data = _images()
    base = _fit_capturing(method, make_cfg, data, monkeypatch)
    full = _members(base["parts"], base["ids"])
    owner = base["parts"].owner()
    read = int(base["first_batch"][0])  # a row its teacher or critic read in its first step: that one must move
    for r in (0, len(data) // 2, int(RNG.integers(len(data))), read):
        keep = np.delete(np.arange(len(data)), r)
        less = _fit_capturing(method, make_cfg, Split(data.x[keep], data.y[keep], data.index[keep]), monkeypatch)
        rest = _members(less["parts"], less["ids"])
        changed = [i for i in range(len(full)) if rest[i] != full[i]]
        assert changed == [int(owner[r])], (method, r)
        same = {i for i in range(len(full)) if torch.equal(base["trained"][i], less["trained"][i])}
        assert same >= {i for i in range(len(full)) if i != owner[r]}, (method, r)
        if r == read:
            assert owner[r] not in same, (method, r)  # the one that held the row did change


def test_the_nominal_partition_size_is_the_declared_n_over_n() -> None:
    parts = KeyedPartitions(np.arange(60_000), 4000, key=partition_key(0, "teachers"))
    assert parts.nominal_size == 15
    assert math.isclose(float(np.mean([len(parts.members(i)) for i in range(4000)])), 15.0)
