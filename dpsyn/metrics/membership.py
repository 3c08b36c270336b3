"""Membership-inference and per-owner utility evaluation of a method's released models, behind a sealed interface.

A method that is measured by attacks (privGAN, the local GAN baseline) does not read the evaluation split itself:
it exposes what it released in a :class:`MembershipTarget` (:meth:`~dpsyn.methods.base.Method.membership_target`),
and the run calls :func:`evaluate_membership` with that target, the private split (the members' source) and the
evaluation split (the non-members, and the sealed reference of the per-owner utility). The method's own code never
receives eval rows; the attack scores candidates with the released discriminators (a white-box attacker's view) and
compares them with the released samples (a black-box one).

Attacks (:mod:`dpsyn.metrics.mia`): the white-box discriminator attack of privGAN (every model scores members and
held-out non-members; max and mean aggregation; top-|members| predicted members) and the Monte-Carlo attack of
Hilprecht et al. 2019 on the released samples. Per-owner utility: downstream accuracy of each owner's generator's
samples alone, one sealed read of the evaluation split each.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass
class MembershipTarget:
    """What a method exposes for a membership evaluation (all of it released or public, no eval rows).

    Attributes:
        members: indices into the private split of the rows the models were trained on (the candidate members).
        scores: ``scores(x, y) -> (n_models, n)``: the released discriminators' scores of candidate rows.
        settings: the attack settings (the method's ``attack`` config): ``n_members``, ``non_member_ratio``,
            ``monte_carlo``, ``mc_components``, ``mc_percentile``, ``per_owner_utility``, ``utility``.
        samples: the released samples ``(x, y)``, or None before sampling.
        sample_groups: for per-owner utility, ``(name, rows of samples, description)`` per generator; empty: none.
        info: what the white-box attack's info names (e.g. the discriminators).
    """

    members: np.ndarray
    scores: Callable[[np.ndarray, np.ndarray], np.ndarray]
    settings: Mapping[str, Any]
    samples: tuple[np.ndarray, np.ndarray] | None = None
    sample_groups: Sequence[tuple[str, np.ndarray, str]] = ()
    info: dict[str, Any] = field(default_factory=dict)


def attack_pool(target: MembershipTarget, private: Any, eval_split: Any, *, seed: int
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray, int, int]:
    """Candidates ``(x, y, is_member, n_members, n_non_members)``: members drawn from ``target.members`` (rows of
    ``private``), non-members from ``eval_split``, as many members as the held-out split allows at the stated ratio
    (so the random-guess rate is the same 1 / (1 + ratio) at every owner fraction and on small datasets: digits'
    359 eval rows give 39 members)."""
    a = target.settings
    rng = np.random.default_rng(seed)
    members_all = np.asarray(target.members)
    ratio = float(a["non_member_ratio"])
    n_mem = max(1, min(int(a["n_members"]), len(members_all), int(len(eval_split) // ratio)))
    n_non = min(int(round(n_mem * ratio)), len(eval_split))
    mem = rng.choice(members_all, size=n_mem, replace=False)
    non = rng.choice(len(eval_split), size=n_non, replace=False)
    x = np.concatenate([private.x[mem], eval_split.x[non]])
    y = np.concatenate([private.y[mem], eval_split.y[non]])
    is_member = np.concatenate([np.ones(n_mem, bool), np.zeros(n_non, bool)])
    return x, y, is_member, n_mem, n_non


def evaluate_membership(target: MembershipTarget, private: Any, eval_split: Any, *, seed: int, dataset: str,
                        num_classes: int, split: str = "eval") -> tuple[dict[str, Any], dict[str, Any]]:
    """The attacks (and, when asked, per-owner utility) on ``target``: (values, per-value info) for result.json.

    Args:
        target: what the method released (:class:`MembershipTarget`).
        private: the private split (the members are its rows ``target.members``).
        eval_split: the held-out real split: the non-members, and the sealed reference of the per-owner utility.
        seed: the run seed (the candidate draw, the attacks' randomness).
        dataset: the dataset's name (for the info).
        num_classes: the dataset's classes (downstream classifiers).
        split: what ``eval_split`` is: ``eval`` (the test split) or ``validation`` (rows carved from private in a
            tuning run, :func:`dpsyn.data.carve_validation`), named in the info and the sealed split.
    """
    from dpsyn.metrics.mia import monte_carlo_mia, whitebox_mia

    a = target.settings
    x, y, is_member, n_mem, n_non = attack_pool(target, private, eval_split, seed=seed)
    out = whitebox_mia(target.scores(x, y), is_member, seed=seed)
    values = {f"mia_wb_{k}": out[k] for k in ("acc_max", "acc_mean", "auc_max", "auc_mean", "baseline")}
    pool = {"members": f"{n_mem} of the owners' training rows", "non_members": f"{n_non} rows of {dataset} eval"}
    info = {"attack": "white-box discriminator scores (privGAN), top-|members| predicted members", **target.info,
            **pool}
    infos = {k: info for k in values}
    if target.samples is not None and int(a.get("monte_carlo", 1)):
        mc = monte_carlo_mia(x, is_member, target.samples[0], n_components=int(a.get("mc_components", 40)),
                             percentile=a.get("mc_percentile"), seed=seed)
        mc_info = {"attack": "Monte-Carlo (Hilprecht et al. 2019): share of released samples within an "
                             "eps-ball of the candidate, PCA space fitted on the samples", "eps_ball": mc["eps_ball"],
                   "radius": mc["radius"], "n_components": mc["n_components"],
                   "n_synthetic": mc["n_synthetic"], **pool}
        for k in ("acc", "auc"):
            values[f"mia_mc_{k}"] = mc[k]
            infos[f"mia_mc_{k}"] = mc_info
    if int(a.get("per_owner_utility", 0)) and target.samples is not None and len(target.sample_groups) > 1:
        values_u, info_u = per_group_utility(target, eval_split, seed=seed, dataset=dataset, num_classes=num_classes,
                                             split=split)
        values.update(values_u)
        infos.update(info_u)
    return values, infos


def per_group_utility(target: MembershipTarget, eval_split: Any, *, seed: int, dataset: str,
                      num_classes: int, split: str = "eval") -> tuple[dict[str, Any], dict[str, Any]]:
    """Downstream accuracy of each generator's samples alone (the paper's per-owner utility), one sealed read of
    ``eval_split`` each."""
    from dpsyn.metrics.sealed import SealedSplit
    from dpsyn.metrics.utility import downstream_accuracy

    x, y = target.samples
    c = target.settings["utility"]
    groups = list(target.sample_groups)
    sealed = SealedSplit(eval_split.x, eval_split.y, name=f"{dataset}/{split}", max_reads=len(groups))
    values, infos = {}, {}
    for name, rows, what in groups:
        out = downstream_accuracy((x[rows], y[rows]), sealed, num_classes=num_classes, epochs=int(c["epochs"]),
                                  batch_size=int(c["batch_size"]), lr=float(c["lr"]), val_fraction=0.1,
                                  seed=seed, progress=False)
        values[name] = out["acc"]
        infos[name] = {"generator": what, "n_train": out["n_train"], "selection": "held-out synthetic split",
                       "reference": f"{dataset} {split} split (sealed)"}
    return values, infos
