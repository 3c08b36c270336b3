"""``dp_dre``: DP-DRE, DP Density-Ratio Estimation over public features (paper 000, Wu et al. 2023, Sec. 3.2).

A discriminator D on features of a public encoder h tells private features (label 1) from public ones (label 0).
It minimises ``-mean_i log D(v_i^priv) - mean_j log(1 - D(v_j^pub))``, whose optimum is
``D* = P_priv / (P_priv + P_pub)``, so ``r = D / (1 - D) = exp(logit)`` estimates the density ratio
``P_priv / P_pub``. Samples: public rows drawn with probability proportional to ``r(h(x_j^pub))`` (optionally
``r^ratio_power``), each decoded by the public instance-conditioned generator g with fresh noise z.

Privacy: D is a 2-layer MLP trained with DP-SGD + Adam through Opacus (per-sample clipping at ``max_grad_norm``,
Gaussian noise). Only the private examples are Poisson-sampled (rate ``q = batch_size / n_private``, the scheme the
RDP accountant assumes, drawn from OS entropy like the noise) and accounted: one ``SampledGaussianEvent`` with that
``q`` and the steps actually made. The noise multiplier is calibrated before training for the planned number of
steps, so the run spends at most its target.

How the public examples enter (the "same clipped batch" construction, as dp_gan pairs real and fake rows): every
step, ``public_batch_size`` public features, drawn with the run seed independently of the private data, are
appended to the Poisson batch with label 0. Opacus clips every row's gradient at ``max_grad_norm``, sums the rows,
adds ``N(0, (noise_multiplier * max_grad_norm)^2)`` once and divides by the expected private batch size. Adding or
removing one private record adds or removes one row, so the L2 sensitivity of the sum stays ``max_grad_norm``:
the public rows change nothing in the accounting (they are a function of public data and the seed), and both
terms of the loss are clipped alike, which keeps them balanced. With ``public_batch_size = batch_size`` the step
is the gradient of the loss above; another size scales the public term, i.e. ``r`` by a constant, which the
normalised sampling weights do not see.

Nothing computed on private data leaves the method except through D: no private losses are logged or reported, and
how many private feature rows needed clipping to the unit ball is not counted (a private count; see
:mod:`dpsyn.methods.dp_mge` and docs/published-fields.md).
Labels of samples: see :mod:`dpsyn.methods.public_baselines` (a public row's own class when it is a private class;
other rows by the nearest public class centroid, or excluded). report() gives the weight mass on public rows of the
private classes (the paper's Table 3 measure). The paper's appendix (MLP width, epochs, batch size, learning rate,
clipping norm) was not available: the defaults in ``conf/method/dp_dre.yaml`` are our choices, and this file is a
reconstruction from the paper's text, not a port of the authors' code.
"""

from __future__ import annotations

import logging
import math
import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from dpsyn.data.base import Split
from dpsyn.lit.dpsgd import calibrate_dpsgd, charge_dpsgd, dp_optimizer, poisson_mask
from dpsyn.methods.base import DPSGD_ACCOUNTING_KEYS, METHODS, Method, PrivacyBudget, RunContext, Samples
from dpsyn.methods.public_baselines import (
    build_public_pool,
    decode_seeded,
)
from dpsyn.privacy import PrivacyLedger, dp_generator
from dpsyn.methods.tiny import SHOES

log = logging.getLogger(__name__)


# ----------------------------------------------------------------------------------------------------------------
# the discriminator and its training (pure: arrays in, a fitted model out)


class RatioMLP(nn.Module):
    """D's logit: ``Linear(d, hidden) -> LeakyReLU(0.2) -> Linear(hidden, 1)`` on ``sqrt(d) * v``.

    Unit-norm features have coordinates of size about ``1/sqrt(d)``; the fixed ``sqrt(d)`` scale brings them to
    unit size for the default initialisation. No BatchNorm (per-sample gradients need independent rows).
    """

    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.scale = math.sqrt(dim)
        self.net = nn.Sequential(nn.Linear(dim, hidden), nn.LeakyReLU(0.2), nn.Linear(hidden, 1))

    def forward(self, v: torch.Tensor) -> torch.Tensor:
        return self.net(v * self.scale).squeeze(-1)


@dataclass
class DPSGDSettings:
    """What makes the discriminator's training DP.

    Attributes:
        noise_multiplier: noise std / max_grad_norm, calibrated for the planned steps.
        max_grad_norm: per-row clipping bound C.
        noise_generator: torch generator of the DP noise (OS entropy unless deterministic noise).
        sampling_generator: torch generator of the Poisson sampling of private rows (same rule).
    """

    noise_multiplier: float
    max_grad_norm: float
    noise_generator: torch.Generator
    sampling_generator: torch.Generator


class DensityRatioEstimator:
    """Trains :class:`RatioMLP` on private (1) vs public (0) features, DP or not; ``steps_done`` counts the
    optimiser steps made so far (what the ledger charges, even if training stops early).

    Args:
        dim: feature size d.
        hidden: the MLP's hidden width.
        lr: Adam's learning rate.
        seed: initialisation and public minibatches (never the DP noise or the Poisson sampling).
    """

    def __init__(self, dim: int, *, hidden: int, lr: float, seed: int) -> None:
        with torch.random.fork_rng():
            torch.manual_seed(seed)
            self.model = RatioMLP(dim, hidden)
        self.lr, self.seed = float(lr), int(seed)
        self.steps_done = 0

    def fit(
        self,
        private: np.ndarray,
        public: np.ndarray,
        *,
        steps: int,
        batch_size: int,
        public_batch_size: int,
        dp: DPSGDSettings | None,
    ) -> None:
        """Run ``steps`` Adam steps.

        DP (``dp`` given): each step Poisson-samples the private rows at rate ``batch_size / n``, appends
        ``public_batch_size`` public rows, clips every row's gradient, adds the noise once, divides by ``batch_size``
        (module docstring). Non-private: uniform minibatches of ``batch_size`` private rows (reshuffled every pass)
        and the same public rows, no clipping or noise.
        """
        priv = torch.from_numpy(np.ascontiguousarray(private, dtype=np.float32))
        pub = torch.from_numpy(np.ascontiguousarray(public, dtype=np.float32))
        n, m = len(priv), len(pub)
        if n == 0 or m == 0:
            raise ValueError(f"density-ratio estimation needs private and public rows, got {n} and {m}")
        if batch_size > n:
            raise ValueError(f"method.batch_size={batch_size} exceeds the {n} private examples")
        public_gen = torch.Generator().manual_seed(self.seed + 17)
        model: nn.Module = self.model
        model.train()
        if dp is None:
            opt = torch.optim.Adam(model.parameters(), lr=self.lr)
            order_gen = torch.Generator().manual_seed(self.seed + 29)
            order = torch.randperm(n, generator=order_gen)
            cursor = 0
            for _ in range(steps):
                if cursor + batch_size > n:
                    order, cursor = torch.randperm(n, generator=order_gen), 0
                xb = priv[order[cursor : cursor + batch_size]]
                cursor += batch_size
                pb = pub[torch.randint(m, (public_batch_size,), generator=public_gen)]
                loss = (F.binary_cross_entropy_with_logits(model(xb), torch.ones(len(xb)), reduction="sum")
                        + F.binary_cross_entropy_with_logits(model(pb), torch.zeros(len(pb)), reduction="sum"))
                opt.zero_grad(set_to_none=True)
                (loss / batch_size).backward()
                opt.step()
                self.steps_done += 1
            model.eval()
            return

        from opacus import GradSampleModule

        gsm = GradSampleModule(model, loss_reduction="sum")
        # the noisy clipped sum is divided by the expected private batch size
        opt_dp = dp_optimizer(torch.optim.Adam(gsm.parameters(), lr=self.lr), noise_multiplier=dp.noise_multiplier,
                              max_grad_norm=dp.max_grad_norm, expected_batch_size=batch_size,
                              generator=dp.noise_generator)
        q = batch_size / n
        try:
            with warnings.catch_warnings():
                # features carry no gradient, so torch notes that Opacus's full backward hooks fire on module
                # outputs; the per-sample gradients are what they should be (tests/test_paper000_methods.py)
                warnings.filterwarnings("ignore", message="Full backward hook is firing")
                for _ in range(steps):
                    # Poisson sampling of the private rows only (the accountant's assumption)
                    mask = poisson_mask(n, sample_rate=q, generator=dp.sampling_generator)
                    xb = priv[mask]
                    pb = pub[torch.randint(m, (public_batch_size,), generator=public_gen)]
                    batch = torch.cat([xb, pb])
                    target = torch.cat([torch.ones(len(xb)), torch.zeros(len(pb))])
                    opt_dp.zero_grad(set_to_none=True)
                    loss = F.binary_cross_entropy_with_logits(gsm(batch), target, reduction="sum")
                    loss.backward()
                    opt_dp.step()
                    self.steps_done += 1
        finally:
            opt_dp.zero_grad(set_to_none=True)
            gsm.remove_hooks()  # self.model (updated in place) is a plain module again
        model.eval()

    @torch.no_grad()
    def log_ratio(self, feats: np.ndarray, batch_size: int = 8192) -> np.ndarray:
        """``log r(v) = logit D(v)`` for each row, float64 (n,)."""
        self.model.eval()
        x = torch.from_numpy(np.ascontiguousarray(feats, dtype=np.float32))
        out = [self.model(x[i : i + batch_size]).double() for i in range(0, len(x), batch_size)]
        return torch.cat(out).numpy() if out else np.zeros(0)


def sampling_weights(log_ratio: np.ndarray, power: float = 1.0) -> np.ndarray:
    """Normalised weights ``p_j ∝ r_j^power = exp(power * log r_j)`` (paper: power 1), computed stably."""
    z = float(power) * np.asarray(log_ratio, dtype=np.float64)
    z = z - z.max()
    w = np.exp(z)
    return w / w.sum()


def effective_sample_size(weights: np.ndarray) -> float:
    """``1 / sum p^2`` of normalised weights: how many rows the weights effectively spread over."""
    w = np.asarray(weights, dtype=np.float64)
    return float(1.0 / np.sum(w * w)) if len(w) else 0.0


# ----------------------------------------------------------------------------------------------------------------
# the method


@METHODS.register("dp_dre")
class DPDRE(Method):
    """DP-DRE on images (see the module docstring)."""

    # the public rows are appended, not accounted
    accounting_keys = DPSGD_ACCOUNTING_KEYS
    tunable_keys = ("hidden", "lr", "max_grad_norm", "ratio_power", "public_batch_size", "public_pool", "other_classes")
    tiny = ("method=dp_dre", *SHOES, "method.public_pool=600")

    needs_public = True
    kinds = ("image",)
    fitted_attrs = ("models", "pool", "estimator", "dp_info", "log_r", "weights")

    def __init__(self, cfg: Any, ctx: RunContext) -> None:
        super().__init__(cfg, ctx)
        self.other_classes = str(cfg.other_classes)  # the ranges: checked at compose time (dpsyn.config.schema)
        self.public_pool = cfg.get("public_pool")
        self.public_batch_size = cfg.get("public_batch_size") or int(cfg.batch_size)

    def fit(
        self, private: Split, budget: PrivacyBudget, ledger: PrivacyLedger, public: Split | None = None
    ) -> None:
        from dpsyn.lit.gan import planned_steps
        from dpsyn.public import clip_to_unit_ball

        cfg, ctx = self.cfg, self.ctx
        if public is None:
            raise ValueError("dp_dre needs a dataset with public data")
        self.models = self.public_models()
        # public features: a public function of public data (no privacy cost)
        self.pool = build_public_pool(self.models, public, ctx, max_rows=self.public_pool,
                                      other_classes=self.other_classes)
        priv, _ = clip_to_unit_ball(  # how many rows needed clipping is a private count: not kept
            np.asarray(self.models.encode(private.x), dtype=np.float32))
        n, batch = len(priv), int(cfg.batch_size)
        epochs = int(ctx.max_epochs or cfg.epochs)
        steps = planned_steps(epochs=epochs, batches_per_epoch=math.ceil(n / batch),
                              limit_train_batches=ctx.batch_limit)
        self.estimator = DensityRatioEstimator(priv.shape[1], hidden=int(cfg.hidden), lr=float(cfg.lr), seed=ctx.seed)
        self.dp_info: dict[str, Any] = {"steps_planned": steps, "epochs": epochs, "batch_size": batch,
                                        "public_batch_size": self.public_batch_size}
        dp: DPSGDSettings | None = None
        if budget.private:
            cal = calibrate_dpsgd(budget=budget, n=n, batch=batch, steps=steps, accountant=ctx.accountant,
                                  name="dp_dre")
            q, nm = cal.sample_rate, cal.noise_multiplier
            dp = DPSGDSettings(
                noise_multiplier=nm, max_grad_norm=float(cfg.max_grad_norm),
                noise_generator=dp_generator(deterministic=ctx.deterministic_noise, seed=ctx.seed),
                sampling_generator=dp_generator(deterministic=ctx.deterministic_noise, seed=ctx.seed + 1),
            )
            self.dp_info.update(noise_multiplier=nm, sample_rate=q, max_grad_norm=float(cfg.max_grad_norm),
                                accountant=ctx.accountant)
        try:
            self.estimator.fit(priv, self.pool.feats, steps=steps, batch_size=batch,
                               public_batch_size=self.public_batch_size, dp=dp)
        finally:
            # charge every step made, even when training stopped early or crashed
            charge_dpsgd(ledger, noise_multiplier=dp.noise_multiplier if dp else None, sample_rate=batch / n,
                         steps_done=self.estimator.steps_done, accountant=ctx.accountant,
                         label=f"dp_dre discriminator (DP-SGD + Adam, clip {float(cfg.max_grad_norm):g}; only "
                               f"private rows Poisson-sampled and accounted, public rows appended to each clipped "
                               f"batch)",
                         non_private_label="dp_dre discriminator trained without noise (eps=inf)")
        self.dp_info["steps"] = self.estimator.steps_done
        # post-processing: the density ratio over the public pool
        self.log_r = self.estimator.log_ratio(self.pool.feats)
        self.weights = sampling_weights(self.log_r, float(cfg.get("ratio_power", 1.0)))

    def sample(self, n: int, labels: np.ndarray | None = None) -> Samples:
        rng = np.random.default_rng(self.ctx.seed)
        idx, y = self.pool.sample(n, self.weights, rng, labels)
        x = decode_seeded(self.models, self.pool.feats[idx], self.ctx.seed)
        prov = {"method": "dp_dre", "features": "public rows drawn with probability ∝ r^ratio_power",
                "ratio_power": float(self.cfg.get("ratio_power", 1.0)),
                "distinct_public_rows": int(len(np.unique(idx))), **self.dp_info, **self.pool.info}
        return Samples(x, y, prov)

    def private_class_mass(self, public_classes: list[str] | None = None) -> float:
        """Weight mass on public rows whose class is a private class (paper 000, Table 3).

        ``public_classes`` (the dataset's, in label order) decides which rows those are; without it, the pool's own
        mapping is used.
        """
        if public_classes is not None:
            wanted = {c.casefold() for c in self.ctx.classes}
            is_private = np.array([public_classes[int(c)].casefold() in wanted for c in self.pool.public_y])
        else:
            is_private = self.pool.private_class >= 0
        return float(self.weights[is_private].sum()) if len(self.weights) else 0.0

    def report(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """Private-class weight mass (and what uniform weights would give), effective sample size, DP-SGD settings."""
        names = self.ctx.public_classes
        mass = self.private_class_mass(names)
        if names is not None:
            wanted = {c.casefold() for c in self.ctx.classes}
            uniform = float(np.mean([names[int(c)].casefold() in wanted for c in self.pool.public_y]))
        else:
            uniform = float(np.mean(self.pool.private_class >= 0))
        values: dict[str, Any] = {
            "dre_private_class_mass": mass,
            "dre_private_class_mass_uniform": uniform,
            "dre_effective_sample_size": effective_sample_size(self.weights),
        }
        if "noise_multiplier" in self.dp_info:
            values["dre_noise_multiplier"] = float(self.dp_info["noise_multiplier"])
        values["dre_steps"] = int(self.dp_info["steps"])
        what = {"what": "sum of DP-DRE's sampling weights over public rows whose class is a private class "
                        "(paper 000 Table 3); _uniform: the same under uniform weights",
                "public_rows": len(self.pool), "classes": list(self.ctx.classes)}
        return values, {k: what for k in values}
