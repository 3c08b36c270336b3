"""``privgan`` and ``gan``: privGAN for N data owners (Rajotte & Ng, paper 003; objective of Mukherjee et al.) and
the non-private local GAN baseline trained on one owner's data alone.

Each owner k holds a disjoint share ``owners[k]`` of every class of the private data; owner k's data only reaches
G_k and D_k; the central discriminator D_p only sees generated samples. privGAN gives no formal DP guarantee: its
ledger records a non-private release and its privacy is measured empirically, by the white-box membership attack
of the paper (every owner's discriminator scores members and held-out non-members; max and mean aggregation;
top-|members| predicted members; accuracy against the random-guess rate), reported in result.json.

Class-conditional MLPs; ``mode: single`` (one process, Lightning) or ``mode: decentralized`` (one process per owner,
only D_p's gradient updates cross: :mod:`dpsyn.lit.privgan_dist`). Not yet here: per-class models, D_p pretraining
on real data (the paper turns it off; ``dp_pretrain: true`` is refused).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np
import torch

from dpsyn.data.base import DataBundle, Split
from dpsyn.methods.base import METHODS, Method, PrivacyBudget, Samples
from dpsyn.privacy import NonPrivateEvent, PrivacyLedger

log = logging.getLogger(__name__)


def split_owners(y: np.ndarray, fractions: list[float], *, seed: int) -> list[np.ndarray]:
    """Disjoint row indices per owner: owner k takes ``fractions[k]`` of every class (seeded shuffle per class).

    Raises:
        ValueError: for fractions that are not in (0, 1] or that sum to more than 1.
    """
    if not fractions or any(not 0 < f <= 1 for f in fractions) or sum(fractions) > 1 + 1e-9:
        raise ValueError(f"owners={list(fractions)}: each fraction must be in (0, 1] and their sum <= 1")
    rng = np.random.default_rng(seed)
    parts: list[list[np.ndarray]] = [[] for _ in fractions]
    for c in np.unique(y):
        idx = rng.permutation(np.flatnonzero(y == c))
        start = 0
        for k, f in enumerate(fractions):
            take = max(1, int(round(f * len(idx))))
            parts[k].append(idx[start : start + take])
            start += take
    return [np.sort(np.concatenate(p)) for p in parts]


@METHODS.register("privgan")
class PrivGAN(Method):
    """privGAN with ``len(cfg.owners)`` owners (see the module docstring)."""

    kinds = ("image",)
    reference = True  # no formal DP guarantee: epsilon spent is inf; privacy is measured by the attacks

    def _fractions(self) -> list[float]:
        return [float(f) for f in self.cfg.owners]

    def _central(self) -> bool:
        return len(self._fractions()) > 1

    def fit(
        self, private: Split, budget: PrivacyBudget, ledger: PrivacyLedger, public: Split | None = None
    ) -> None:
        import lightning as L

        from dpsyn.lit.privgan import PrivGANModule, owner_loaders
        from dpsyn.nets.mlp_gan import CondMLPDiscriminator, CondMLPGenerator

        cfg, ctx = self.cfg, self.ctx
        if cfg.get("dp_pretrain", False):
            raise ValueError("method.dp_pretrain=true is not implemented (the paper turns it off); allowed: false")
        L.seed_everything(ctx.seed, verbose=False)
        self.owner_idx = split_owners(private.y, self._fractions(), seed=ctx.seed)
        self.private = private
        n = len(self.owner_idx)
        shape = tuple(ctx.shape)
        hid_g, hid_d = tuple(cfg.g_hidden), tuple(cfg.d_hidden)
        gens = [CondMLPGenerator(z_dim=cfg.z_dim, num_classes=ctx.num_classes, shape=shape, hidden=hid_g) for _ in range(n)]
        discs = [CondMLPDiscriminator(num_classes=ctx.num_classes, shape=shape, hidden=hid_d) for _ in range(n)]
        central = CondMLPDiscriminator(num_classes=ctx.num_classes, shape=shape, hidden=hid_d, out=n) if n > 1 else None
        self.module = PrivGANModule(
            generators=gens, discriminators=discs, central=central, z_dim=int(cfg.z_dim), num_classes=ctx.num_classes,
            lam=float(cfg.lam) if n > 1 else 0.0, dp_delay=int(cfg.dp_delay), lr=float(cfg.lr), beta1=float(cfg.beta1),
            label_smoothing=float(cfg.label_smoothing),
        )
        parts = [(torch.from_numpy(private.x[i]), torch.from_numpy(private.y[i])) for i in self.owner_idx]
        trainer_kwargs = dict(ctx.trainer)
        epochs = trainer_kwargs.pop("max_epochs", None) or int(cfg.epochs)
        mode = str(cfg.get("mode", "single"))
        if mode not in ("single", "decentralized"):
            raise ValueError(f"method.mode={mode}: unknown mode; allowed: single, decentralized")
        if mode == "decentralized" and n > 1:
            try:
                self._fit_decentralized(parts, epochs)
            finally:
                ledger.add(NonPrivateEvent(label=f"{cfg.name} (decentralized): {n} owners {self._fractions()}, "
                                                 "no formal DP guarantee"))
            return
        trainer = L.Trainer(max_epochs=epochs, logger=ctx.logger if ctx.logger is not None else False,
                            enable_checkpointing=False, num_sanity_val_steps=0, **trainer_kwargs)
        try:
            trainer.fit(self.module, train_dataloaders=owner_loaders(parts, batch_size=int(cfg.batch_size), seed=ctx.seed))
        finally:
            ledger.add(NonPrivateEvent(label=f"{cfg.name}: {n} owner(s) {self._fractions()}, no formal DP guarantee"))

    def _fit_decentralized(self, parts: list[tuple[torch.Tensor, torch.Tensor]], epochs: int) -> None:
        """One process per owner (see :mod:`dpsyn.lit.privgan_dist`); the owners' final G/D are loaded here to
        sample and to attack, as the released models would be."""
        from dpsyn.lit.privgan_dist import train_decentralized

        cfg, ctx = self.cfg, self.ctx
        hp = {"seed": ctx.seed, "epochs": epochs, "batch_size": int(cfg.batch_size), "lr": float(cfg.lr),
              "beta1": float(cfg.beta1), "lam": float(cfg.lam), "dp_delay": int(cfg.dp_delay),
              "label_smoothing": float(cfg.label_smoothing), "z_dim": int(cfg.z_dim), "num_classes": ctx.num_classes,
              "g_hidden": list(cfg.g_hidden), "d_hidden": list(cfg.d_hidden)}
        work = Path(ctx.run_dir or ".") / "owners"
        states = train_decentralized([(x.numpy(), y.numpy()) for x, y in parts], hp=hp, work_dir=work)
        for k, st in enumerate(states):
            self.module.G[k].load_state_dict(st["G"])
            self.module.D[k].load_state_dict(st["D"])
        self.module.Dp.load_state_dict(states[0]["Dp"])

    def sample(self, n: int, labels: np.ndarray | None = None) -> Samples:
        """n samples split evenly over the owners' generators (the paper: 1500 per generator of 3000)."""
        rng = np.random.default_rng(self.ctx.seed)
        if labels is None:
            labels = self.uniform_labels(n, rng)
        torch.manual_seed(self.ctx.seed)
        chunks = np.array_split(np.arange(n), len(self.owner_idx))
        xs = [self.module.generate(k, torch.from_numpy(labels[c])).numpy() for k, c in enumerate(chunks)]
        self._samples = (np.concatenate(xs).astype(np.float32), labels)
        self._chunks = chunks
        return Samples(np.concatenate(xs).astype(np.float32), labels,
                       {"method": self.cfg.name, "owners": self._fractions(),
                        "per_owner": [len(c) for c in chunks], "owner_of_row": "rows in owner order"})

    def report(self, data: DataBundle) -> tuple[dict[str, Any], dict[str, Any]]:
        """The white-box attack: members = owners' training rows, non-members = held-out real rows (eval split)."""
        from dpsyn.metrics.mia import whitebox_mia

        a = self.cfg.attack
        rng = np.random.default_rng(self.ctx.seed)
        members_all = np.concatenate(self.owner_idx)
        n_mem = min(int(a.n_members), len(members_all))
        n_non = min(int(round(n_mem * float(a.non_member_ratio))), len(data.eval))
        mem = rng.choice(members_all, size=n_mem, replace=False)
        non = rng.choice(len(data.eval), size=n_non, replace=False)
        x = np.concatenate([self.private.x[mem], data.eval.x[non]])
        y = np.concatenate([self.private.y[mem], data.eval.y[non]])
        is_member = np.concatenate([np.ones(n_mem, bool), np.zeros(n_non, bool)])
        scores = self.module.scores(torch.from_numpy(x), torch.from_numpy(y)).numpy()
        out = whitebox_mia(scores, is_member, seed=self.ctx.seed)
        values = {f"mia_wb_{k}": out[k] for k in ("acc_max", "acc_mean", "auc_max", "auc_mean", "baseline")}
        info = {"attack": "white-box discriminator scores (privGAN), top-|members| predicted members",
                "discriminators": [f"D_{k} (owner {k})" for k in range(len(self.owner_idx))],
                "members": f"{n_mem} of the owners' training rows", "non_members": f"{n_non} rows of {data.name} eval"}
        infos = {k: info for k in values}
        if int(a.get("per_owner_utility", 0)) and getattr(self, "_samples", None) is not None and len(self.owner_idx) > 1:
            values_u, info_u = self._per_owner_utility(data)
            values.update(values_u)
            infos.update(info_u)
        return values, infos

    def _per_owner_utility(self, data: DataBundle) -> tuple[dict[str, Any], dict[str, Any]]:
        """Downstream accuracy of each owner's generator alone (the paper's per-owner utility), one sealed read each."""
        from dpsyn.metrics.sealed import SealedSplit
        from dpsyn.metrics.utility import downstream_accuracy

        x, y = self._samples
        c = self.cfg.attack.utility
        sealed = SealedSplit(data.eval.x, data.eval.y, name=f"{data.name}/eval", max_reads=len(self._chunks))
        values, infos = {}, {}
        for k, rows in enumerate(self._chunks):
            out = downstream_accuracy((x[rows], y[rows]), sealed, num_classes=data.num_classes, epochs=int(c.epochs),
                                      batch_size=int(c.batch_size), lr=float(c.lr), val_fraction=0.1,
                                      seed=self.ctx.seed, progress=False)
            values[f"acc_owner{k}"] = out["acc"]
            infos[f"acc_owner{k}"] = {"generator": f"G_{k} (owner {k}, fraction {self._fractions()[k]})",
                                      "n_train": out["n_train"], "selection": "held-out synthetic split",
                                      "reference": f"{data.name} eval split (sealed)"}
        return values, infos


@METHODS.register("gan")
class LocalGAN(PrivGAN):
    """The non-private local GAN: one owner's share alone, no central discriminator (the paper's comparison)."""

    def _fractions(self) -> list[float]:
        return [float(self.cfg.owner_fraction)]
