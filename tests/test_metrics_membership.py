"""The sealed membership interface (dpsyn.metrics.membership): a method exposes its released models, the run
evaluates them against private members and eval non-members; Method.report gets no data."""

from __future__ import annotations

import inspect
import numpy as np
import pytest

from dpsyn.metrics.membership import MembershipTarget, attack_pool, evaluate_membership


class _Split:
    def __init__(self, x: np.ndarray, y: np.ndarray) -> None:
        self.x, self.y = x, y

    def __len__(self) -> int:
        return len(self.x)


SETTINGS = {"n_members": 20, "non_member_ratio": 9, "monte_carlo": 1, "mc_components": 2, "mc_percentile": None,
            "per_owner_utility": 0}


def _data(seed: int = 0):
    rng = np.random.default_rng(seed)
    private = _Split(rng.normal(size=(50, 3)).astype(np.float32) + 5.0, rng.integers(0, 2, 50))  # members: +5
    eval_split = _Split(rng.normal(size=(90, 3)).astype(np.float32), rng.integers(0, 2, 90))
    return private, eval_split


def test_pool_takes_members_from_private_rows_and_non_members_from_eval() -> None:
    private, eval_split = _data()
    target = MembershipTarget(members=np.arange(0, 50, 2), scores=lambda x, y: x[None, :, 0], settings=SETTINGS)
    x, y, is_member, n_mem, n_non = attack_pool(target, private, eval_split, seed=0)
    assert (n_mem, n_non) == (10, 90)  # 90 eval rows at ratio 9 allow 10 members
    assert is_member.sum() == n_mem and len(x) == n_mem + n_non
    assert (x[is_member] > 2).all() and (x[~is_member] < 4).all()  # members are private rows, the rest eval rows
    member_rows = {tuple(r) for r in private.x[::2]}
    assert all(tuple(r) in member_rows for r in x[is_member])  # ... and only the target's members


def test_a_scorer_that_separates_members_wins_and_the_values_are_reproducible() -> None:
    private, eval_split = _data()
    target = MembershipTarget(members=np.arange(50), scores=lambda x, y: x[None, :, 0], settings=SETTINGS,
                              samples=(private.x[:30], private.y[:30]), info={"discriminators": ["D_0"]})
    values, infos = evaluate_membership(target, private, eval_split, seed=0, dataset="toy", num_classes=2)
    assert values["mia_wb_baseline"] == pytest.approx(0.1)
    assert values["mia_wb_acc_max"] == 1.0 and values["mia_wb_auc_max"] == 1.0
    assert {"mia_mc_acc", "mia_mc_auc"} <= set(values)
    assert infos["mia_wb_acc_max"]["discriminators"] == ["D_0"]
    assert infos["mia_wb_acc_max"]["non_members"] == "90 rows of toy eval"
    again, _ = evaluate_membership(target, private, eval_split, seed=0, dataset="toy", num_classes=2)
    assert again == values
    blind = MembershipTarget(members=np.arange(50), scores=lambda x, y: np.zeros((1, len(x))), settings=SETTINGS)
    values, _ = evaluate_membership(blind, private, eval_split, seed=0, dataset="toy", num_classes=2)
    assert values["mia_wb_auc_max"] == pytest.approx(0.5) and "mia_mc_acc" not in values  # no samples: no MC attack


def test_report_gets_no_data_and_only_privgan_exposes_a_membership_target() -> None:
    from dpsyn.methods import METHODS
    from dpsyn.methods.base import Method

    for name in METHODS.names():
        cls = METHODS.get(name)
        assert list(inspect.signature(cls.report).parameters) == ["self"], name
        exposes = cls.membership_target is not Method.membership_target
        assert exposes == (name in ("privgan", "gan")), name
