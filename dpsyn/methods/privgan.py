"""``privgan`` and ``gan``: privGAN for N data owners (Rajotte & Ng, paper 003; objective of Mukherjee et al.) and
the non-private local GAN baseline trained on one owner's data alone.

Each owner k holds a disjoint share ``owners[k]`` of every class of the private data; owner k's data only reaches
G_k and D_k; the central discriminator D_p only sees generated samples. privGAN gives no formal DP guarantee: its
ledger records a non-private release and its privacy is measured empirically, by the white-box membership attack
of the paper (every owner's discriminator scores members and held-out non-members; max and mean aggregation;
top-|members| predicted members; accuracy against the random-guess rate), reported in result.json.

A second, black-box attack (the Monte-Carlo attack of Hilprecht et al. 2019) uses only the released samples.

Options: ``per_class: true`` trains one privGAN per class (the paper's per-digit models; labels come from which
model made a sample), ``false`` one class-conditional privGAN; ``arch: mlp`` (privGAN's MLPs) or ``dcgan``;
``dp_pretrain: true`` pretrains D_p on the owners' real data (privGAN's ``disc_epochs``; off in Rajotte & Ng, since
real data would then reach D_p; the ledger and result say so); ``mode: single`` (one process, Lightning) or
``mode: decentralized`` (one process per owner, only D_p's gradient updates cross: :mod:`dpsyn.lit.privgan_dist`).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np
import torch

from dpsyn.data.base import Split
from dpsyn.methods.base import METHODS, Method, PrivacyBudget, Samples
from dpsyn.privacy import NonPrivateEvent, PrivacyLedger
from dpsyn.methods.tiny import IMAGE_METRICS, TINIEST_LOCAL_GAN

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

    tiny = ("method=privgan", "dataset=fmnist", *TINIEST_LOCAL_GAN, *IMAGE_METRICS)

    kinds = ("image",)
    reference = True  # no formal DP guarantee: epsilon spent is inf; privacy is measured by the attacks
    central = True  # privGAN's central discriminator D_p (the local GAN baseline has none)

    def _fractions(self) -> list[float]:
        return [float(f) for f in self.cfg.owners]

    def _hp(self, num_classes: int, epochs: int) -> dict[str, Any]:
        cfg, ctx = self.cfg, self.ctx
        n = len(self._fractions())
        return {"seed": ctx.seed, "epochs": epochs, "batch_size": int(cfg.batch_size), "lr": float(cfg.lr),
                "beta1": float(cfg.beta1), "lam": float(cfg.lam) if self.central and n > 1 else 0.0,
                "dp_delay": int(cfg.dp_delay), "label_smoothing": float(cfg.label_smoothing), "z_dim": int(cfg.z_dim),
                "num_classes": num_classes, "g_hidden": list(cfg.g_hidden), "d_hidden": list(cfg.d_hidden),
                "arch": str(cfg.get("arch", "mlp")),
                "dp_pretrain_epochs": int(cfg.get("dp_pretrain_epochs", 0)) if self._pretrain() else 0}

    def _pretrain(self) -> bool:
        return bool(self.cfg.get("dp_pretrain", False)) and self.central and len(self._fractions()) > 1

    def _event_label(self, mode: str) -> str:
        n = len(self._fractions())
        what = f"{self.cfg.name}{' (decentralized)' if mode == 'decentralized' else ''}: {n} owner(s) {self._fractions()}"
        if self._pretrain():
            what += ", D_p pretrained on the owners' real data"
        return what + ", no formal DP guarantee"

    def fit(
        self, private: Split, budget: PrivacyBudget, ledger: PrivacyLedger, public: Split | None = None
    ) -> None:
        import lightning as L

        from dpsyn.lit.privgan import owner_loaders

        cfg, ctx = self.cfg, self.ctx
        mode = str(cfg.get("mode", "single"))  # single | decentralized (checked at compose time)
        L.seed_everything(ctx.seed, verbose=False)
        self.owner_idx = split_owners(private.y, self._fractions(), seed=ctx.seed)
        trainer_kwargs = dict(ctx.trainer)
        epochs = trainer_kwargs.pop("max_epochs", None) or int(cfg.epochs)
        self.per_class = bool(cfg.get("per_class", False))
        groups: list[int | None] = list(range(ctx.num_classes)) if self.per_class else [None]
        hp = self._hp(1 if self.per_class else ctx.num_classes, epochs)
        n = len(self.owner_idx)
        parts: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
        for g, c in enumerate(groups):
            for i, idx in enumerate(self.owner_idx):
                rows = idx if c is None else idx[private.y[idx] == c]
                y = private.y[rows] if c is None else np.zeros(len(rows), np.int64)  # one model per class
                parts[f"g{g}/owner{i}"] = (torch.from_numpy(private.x[rows]), torch.from_numpy(y))
        if self.per_class:
            log.info("%s: one model per class (%d), owners hold %s rows of each", cfg.name, len(groups),
                     [len(parts[f"g0/owner{i}"][0]) for i in range(n)])
        self.module = self._module(hp, len(groups))
        try:
            if mode == "decentralized" and n > 1:
                for g in range(len(groups)):
                    own = [parts[f"g{g}/owner{i}"] for i in range(n)]
                    sub = "owners" if not self.per_class else f"owners/class{g}"
                    self._fit_decentralized(self.module, own, hp, Path(ctx.run_dir or ".") / sub, group=g)
            else:
                self.module.pretrain_central(parts, epochs=hp["dp_pretrain_epochs"], batch_size=hp["batch_size"],
                                             seed=ctx.seed)
                trainer = L.Trainer(max_epochs=epochs, logger=ctx.logger if ctx.logger is not None else False,
                                    enable_checkpointing=False, num_sanity_val_steps=0, **trainer_kwargs)
                trainer.fit(self.module, train_dataloaders=owner_loaders(parts, batch_size=hp["batch_size"], seed=ctx.seed))
        finally:
            ledger.add(NonPrivateEvent(label=self._event_label(mode)))

    def _module(self, hp: dict[str, Any], n_groups: int) -> Any:
        from dpsyn.lit.privgan import PrivGANModule, make_discriminator, make_generator

        n, shape = len(self.owner_idx), tuple(self.ctx.shape)
        centrals = [make_discriminator(hp, shape, out=n) for _ in range(n_groups)] if self.central and n > 1 else None
        return PrivGANModule(
            generators=[make_generator(hp, shape) for _ in range(n_groups * n)],
            discriminators=[make_discriminator(hp, shape) for _ in range(n_groups * n)],
            centrals=centrals, n_owners=n, z_dim=hp["z_dim"], num_classes=hp["num_classes"], lam=hp["lam"],
            dp_delay=hp["dp_delay"], lr=hp["lr"], beta1=hp["beta1"], label_smoothing=hp["label_smoothing"],
        )

    @staticmethod
    def _fit_decentralized(module: Any, parts: list[tuple[torch.Tensor, torch.Tensor]], hp: dict[str, Any],
                           work: Path, *, group: int) -> None:
        """One process per owner (see :mod:`dpsyn.lit.privgan_dist`); the owners' final G/D are loaded here to
        sample and to attack, as the released models would be."""
        from dpsyn.lit.privgan_dist import train_decentralized

        states = train_decentralized([(x.numpy(), y.numpy()) for x, y in parts], hp=hp, work_dir=work)
        for k, st in enumerate(states):
            module.G[group * module.n + k].load_state_dict(st["G"])
            module.D[group * module.n + k].load_state_dict(st["D"])
        if module.Dp is not None:
            module.Dp[group].load_state_dict(states[0]["Dp"])

    def _by_class(self, labels: np.ndarray, fn: Any) -> list[tuple[np.ndarray, Any]]:
        """``fn(group, model_labels, rows)`` per model: the conditional model (group 0) on every row, or each class's model
        on its rows (labels 0 inside a per-class model); returns (rows, result) pairs."""
        if not self.per_class:
            rows = np.arange(len(labels))
            return [(rows, fn(0, torch.from_numpy(labels), rows))]
        out = []
        for c in np.unique(labels):
            rows = np.flatnonzero(labels == c)
            out.append((rows, fn(int(c), torch.zeros(len(rows), dtype=torch.int64), rows)))
        return out

    def sample(self, n: int, labels: np.ndarray | None = None) -> Samples:
        """n samples split evenly over the owners' generators (the paper: 1500 per generator of 3000)."""
        rng = np.random.default_rng(self.ctx.seed)
        if labels is None:
            labels = self.uniform_labels(n, rng)
        torch.manual_seed(self.ctx.seed)
        chunks = np.array_split(np.arange(n), len(self.owner_idx))
        x = np.empty((n, *self.ctx.shape), np.float32)
        for k, c in enumerate(chunks):
            for rows, imgs in self._by_class(labels[c], lambda g, y, rows, k=k: self.module.generate(k, y, group=g).numpy()):
                x[c[rows]] = imgs
        self._samples = (x, labels)
        self._chunks = chunks
        return Samples(x, labels, {"method": self.cfg.name, "owners": self._fractions(),
                                   "per_owner": [len(c) for c in chunks], "owner_of_row": "rows in owner order",
                                   "per_class_models": self.per_class})

    def membership_target(self) -> Any:
        """What the attacks need, all of it released (:mod:`dpsyn.metrics.membership` runs them with the private
        members and the eval non-members; this class never sees the eval split): the owners' training rows as
        candidate members, every owner's discriminator as the white-box scorer, the released samples (Monte-Carlo
        attack) and each owner's share of them (per-owner utility)."""
        from dpsyn.metrics.membership import MembershipTarget

        samples = getattr(self, "_samples", None)
        groups = [(f"acc_owner{k}", rows, f"G_{k} (owner {k}, fraction {self._fractions()[k]})")
                  for k, rows in enumerate(self._chunks)] if samples is not None else []
        return MembershipTarget(
            members=np.concatenate(self.owner_idx), scores=self._scores, settings=self.cfg.attack, samples=samples,
            sample_groups=groups if len(self.owner_idx) > 1 else [],
            info={"discriminators": [f"D_{k} (owner {k})" + (" x per-class models" if self.per_class else "")
                                     for k in range(len(self.owner_idx))]})

    def _scores(self, x: np.ndarray, y: np.ndarray) -> np.ndarray:
        """(n_owners, n) discriminator scores; a per-class model's discriminators score the rows of its class."""
        scores = np.empty((len(self.owner_idx), len(x)))
        for rows, s in self._by_class(y, lambda g, yy, rows: self.module.scores(torch.from_numpy(x[rows]), yy, group=g)):
            scores[:, rows] = s.numpy()
        return scores


@METHODS.register("gan")
class LocalGAN(PrivGAN):
    """The non-private local GAN: each owner trains a GAN on its own share alone, with no central discriminator and
    nothing shared (the paper's comparison); ``owners: [f]`` is one owner, ``[f0, f1]`` gives the local GANs of the
    same split as a privGAN run with those owners."""

    tiny = ("method=gan", "dataset=fmnist", *TINIEST_LOCAL_GAN, *IMAGE_METRICS)

    central = False
