"""``dp_mepf``: DP mean embeddings with perceptual features (DP-MEPF; Harder et al. 2022), a baseline of paper 000.

DP-MEPF releases, once and with the Gaussian mechanism, the first and second moments of the private data's
perceptual features — the mean embedding of the data under the kernel ``k(x, x') = <phi(x), phi(x')>`` — and then
trains an image generator, non-privately, to match them: minimise the MMD with that kernel,
``|| mean_j phi(G(z_j)) - m1_dp ||^2 + || mean_j phi(G(z_j))^2 - m2_dp ||^2`` (squares element-wise). Only the
release touches private data, so the generator's training is post-processing and may run as long as it likes.

This is a reconstruction on dpsyn's public models (Harder et al.'s code was read to understand the method; none of
it is copied):

* Perceptual features. The paper takes the activations of every layer of an ImageNet VGG-19 (paper 000: of a
  ResNet-50 for its 128-px datasets). Here the extractor is the run's public encoder h (:mod:`dpsyn.public`; the
  embedded one is trained on ``fmnist_public``, the stand-in for ImageNet): phi(x) concatenates the flattened
  activations of the encoder layers named in ``feature_layers`` (``auto``: the embedded encoder's two pooled conv
  blocks) and h(x) itself, each part L2-normalised and the whole divided by sqrt(#parts), so ``||phi(x)|| = 1``.
  :func:`dpsyn.public.clip_to_unit_ball` enforces the bound before the sums are formed.
* Sensitivity. With ``||phi(x)|| <= 1``, the sum of phi over the private set and the sum of phi^2 (element-wise;
  ``||phi^2|| <= ||phi||^2 <= 1``) each have L2 sensitivity 1 under adding or removing one example. Per class
  (``class_conditional``), an example adds to one class's row only, so the (classes x d) matrix of sums keeps
  sensitivity 1. Released: ``m1_dp[c] = (sum_{y_i=c} phi(x_i) + N(0, s1^2 I)) / n_c``, likewise ``m2_dp``.
* The counts ``n_c`` (the dataset size when unconditional) are either released with the Gaussian mechanism
  (``class_counts: dp``, sensitivity 1, noisy counts floored at 1) or taken as public (``class_counts: public``:
  what DP-MEPF's code and paper 000's DP-MGE do with n). The ledger says which in its labels.
* Budget. ``(eps, delta)`` is split between the releases by ``budget_split``; release r gets
  ``(f_r eps, f_r delta)`` and noise ``gaussian_sigma(epsilon=f_r eps, delta=f_r delta, calibration=...)``
  (``classic`` is paper 000's formula), recorded as one ``ApproxDPEvent`` each (basic composition). DP-MEPF itself
  calibrates one joint noise level for the two moments with autodp; the split is the simpler, looser equivalent.
* Generator. The repo's class-conditional DCGAN generator (:mod:`dpsyn.nets.dcgan`; the paper uses a ResNet
  generator), trained with Adam on class-balanced batches; optionally first pretrained on the public split's
  (unconditional) embedding, which costs no privacy. ``eps=inf``: exact moments, a ``NonPrivateEvent``.
* Crash safety. The release is saved with its charges to ``run_dir/checkpoints/dp_mepf_release.pt`` before the
  ledger records it and before it is used; a rerun in that run directory (after a kill while the generator trains)
  reuses it, charged once, instead of releasing a second time (which would spend the budget twice).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from dpsyn.data.base import Split
from dpsyn.methods.base import METHODS, Method, PrivacyBudget, Samples, generate_conditional
from dpsyn.methods.dp_gan_ft import public_subsample
from dpsyn.nets.dcgan import CondDCGANGenerator
from dpsyn.privacy import (
    ApproxDPEvent,
    NonPrivateEvent,
    PrivacyLedger,
    calibrate_releases,
    dp_numpy_generator,
    gaussian_mechanism,
)
from dpsyn.public import clip_to_unit_ball
from dpsyn.results.checkpoint import Checkpointer
from dpsyn.methods.tiny import SHOES
from dpsyn.config.schema import MOMENTS
from dpsyn.config.schema import CLASS_COUNTS as COUNTS

log = logging.getLogger(__name__)

RELEASE_CHECKPOINT = "dp_mepf_release.pt"
"""The private release (the noisy moments and their ledger), in ``run_dir/checkpoints``: a rerun reuses it."""

AUTO_LAYERS: dict[str, tuple[str, ...]] = {"EmbeddedEncoder": ("body.3", "body.7")}
"""``feature_layers: auto``: the two max-pooled conv blocks of the embedded encoder (14x14x32 and 7x7x64 maps).
Other encoders get h alone unless their layers are named."""



# ---------------------------------------------------------------------------------------------------------------
# perceptual features


class PerceptualFeatures(nn.Module):
    """phi(x): the named encoder layers' flattened activations and h(x), each L2-normalised, concatenated, divided
    by sqrt(number of parts) — so ``||phi(x)|| = 1``. Differentiable in x; the encoder's weights are frozen.

    Args:
        encoder: the public encoder h (an ``nn.Module`` whose forward returns h(x)).
        layers: names (``encoder.named_modules()``) of the layers whose outputs join h(x).
        pool: average-pool every 4-D activation to ``pool x pool`` first (None: the full maps).

    Raises:
        ValueError: a name that is not a module of the encoder (the message lists the candidates).
    """

    def __init__(self, encoder: nn.Module, layers: Sequence[str], *, pool: int | None = None) -> None:
        super().__init__()
        modules = dict(encoder.named_modules())
        for name in layers:
            if name not in modules or not name:
                options = ", ".join(n for n in modules if n)
                raise ValueError(f"method.feature_layers: {name!r} is not a layer of the encoder; allowed: {options}")
        self.encoder, self.layers, self.pool = encoder, list(layers), pool
        self._modules_by_name = {n: modules[n] for n in self.layers}
        for p in encoder.parameters():
            p.requires_grad_(False)
        encoder.eval()

    def train(self, mode: bool = True) -> PerceptualFeatures:
        super().train(mode)
        self.encoder.eval()  # frozen: BatchNorm keeps its running statistics
        return self

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        taps: dict[str, torch.Tensor] = {}
        handles = [
            module.register_forward_hook(lambda _m, _i, out, name=name: taps.__setitem__(name, out))
            for name, module in self._modules_by_name.items()
        ]
        try:
            h = self.encoder(x)
        finally:
            for handle in handles:
                handle.remove()
        parts = []
        for name in self.layers:
            t = taps[name]
            if self.pool is not None and t.dim() == 4:
                t = F.adaptive_avg_pool2d(t, self.pool)
            parts.append(t.flatten(1))
        parts.append(h.flatten(1))
        return torch.cat([F.normalize(p, dim=1) for p in parts], dim=1) / math.sqrt(len(parts))


def resolve_layers(encoder: nn.Module, layers: Any) -> list[str]:
    """``feature_layers`` as a list of names (``auto`` -> :data:`AUTO_LAYERS` for the encoder's class)."""
    if layers is None:
        return []
    if isinstance(layers, str):
        if layers != "auto":
            raise ValueError(f"method.feature_layers={layers!r}; allowed: auto, null, or a list of layer names")
        names = AUTO_LAYERS.get(type(encoder).__name__)
        if names is None:
            log.warning("dp_mepf: no automatic layers for %s; matching h(x) only", type(encoder).__name__)
            return []
        return list(names)
    return [str(n) for n in layers]


# ---------------------------------------------------------------------------------------------------------------
# the release (pure functions)


def moment_sums(
    batches: Iterator[tuple[np.ndarray, np.ndarray]], groups: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """Per-group sums of phi and phi^2 (float64, (groups, d) each), counts, and how many rows needed clipping.

    Args:
        batches: ``(phi, group)`` pairs: features (B, d) and group indices (B,) in ``range(groups)``.
        groups: number of groups (classes, or 1).

    Every feature row is clipped to the unit ball first (:func:`dpsyn.public.clip_to_unit_ball`), so each
    example moves each sum by at most 1 in L2 norm.
    """
    s1: np.ndarray | None = None
    s2: np.ndarray | None = None
    counts = np.zeros(groups, dtype=np.int64)
    n_clipped = 0
    for phi, g in batches:
        phi, clipped = clip_to_unit_ball(np.asarray(phi, dtype=np.float32))
        n_clipped += clipped
        v = phi.astype(np.float64)
        if s1 is None:
            s1 = np.zeros((groups, v.shape[1]))
            s2 = np.zeros((groups, v.shape[1]))
        np.add.at(s1, g, v)
        np.add.at(s2, g, v * v)
        counts += np.bincount(g, minlength=groups)
    if s1 is None or s2 is None:
        raise ValueError("no private examples to embed")
    return s1, s2, counts, n_clipped


def release_means(
    sums: np.ndarray, counts: np.ndarray, sigma: float | None, rng: np.random.Generator | None
) -> np.ndarray:
    """``(sums + N(0, sigma^2 I)) / counts[:, None]`` (no noise when ``sigma`` is None), float32."""
    noisy = sums if sigma is None else gaussian_mechanism(sums, sigma, generator=rng)
    return (noisy / counts[:, None]).astype(np.float32)


def mepf_loss(
    phi: torch.Tensor, groups: torch.Tensor, m1: torch.Tensor, m2: torch.Tensor | None
) -> torch.Tensor:
    """The mean-embedding MMD^2 per group, averaged over the groups present in the batch:
    ``|| mean phi - m1[c] ||^2 (+ || mean phi^2 - m2[c] ||^2)``.

    Args:
        phi: features of generated images (B, d).
        groups: their groups (B,).
        m1, m2: released embeddings (G, d); ``m2`` None matches the first moment only.
    """
    onehot = F.one_hot(groups, m1.shape[0]).to(phi.dtype)  # (B, G)
    n = onehot.sum(0)
    present = n > 0
    inv = torch.where(present, 1.0 / n.clamp_min(1.0), torch.zeros_like(n))[:, None]
    loss = ((onehot.t() @ phi * inv - m1) ** 2).sum(1)
    if m2 is not None:
        loss = loss + ((onehot.t() @ (phi * phi) * inv - m2) ** 2).sum(1)
    return loss[present].mean()


# ---------------------------------------------------------------------------------------------------------------
# the method


@METHODS.register("dp_mepf")
class DPMEPF(Method):
    """DP-MEPF (see the module docstring): one DP release of mean embeddings, then a generator matched to them."""

    # the embeddings' releases; the generator is post-processing
    accounting_keys = ("budget_split", "calibration", "moments", "class_counts", "class_conditional")
    tunable_keys = ("steps", "batch_size", "lr", "beta1", "z_dim", "ngf", "pretrain_steps", "max_public")
    tiny = ("method=dp_mepf", *SHOES, "method.steps=3", "method.batch_size=12")

    needs_public = True
    kinds = ("image",)
    fitted_attrs = ("release", "train_log", "G", "conditional")

    def _features(self, phi: PerceptualFeatures, x: np.ndarray, device: torch.device, batch: int = 256
                  ) -> Iterator[np.ndarray]:
        phi.to(device)
        with torch.no_grad():
            for i in range(0, len(x), batch):
                chunk = torch.from_numpy(np.ascontiguousarray(x[i : i + batch], dtype=np.float32)).to(device)
                yield phi(chunk).float().cpu().numpy()

    def _releases(self, budget: PrivacyBudget) -> dict[str, float]:
        """The releases made and their budget fractions."""
        cfg = self.cfg
        made = ["m1"] + (["m2"] if cfg.moments == "m1_and_m2" else [])
        made += ["counts"] if cfg.class_counts == "dp" else []
        split = {str(k): float(v) for k, v in dict(cfg.budget_split).items()}
        unknown = sorted(set(split) - {"m1", "m2", "counts"})
        if unknown:
            raise ValueError(f"method.budget_split.{unknown[0]}: unknown release; allowed: m1, m2, counts")
        idle = sorted(k for k, v in split.items() if k not in made and v != 0)
        if idle and budget.private:
            raise ValueError(f"method.budget_split.{idle[0]}={split[idle[0]]} but that release is not made "
                             f"(moments={cfg.moments}, class_counts={cfg.class_counts}); set it to 0")
        return {k: split.get(k, 0.0) for k in made}

    def fit(
        self, private: Split, budget: PrivacyBudget, ledger: PrivacyLedger, public: Split | None = None
    ) -> None:
        cfg, ctx = self.cfg, self.ctx
        device = torch.device(ctx.device)
        models = self.public_models()
        # seeded once the public models are loaded: training them (a cache miss) draws from the global generator,
        # and what follows must not depend on whether the cache held them
        torch.manual_seed(ctx.seed)
        layers = resolve_layers(models.encoder, cfg.feature_layers)
        phi = PerceptualFeatures(models.encoder, layers, pool=cfg.layer_pool)  # type: ignore[arg-type]
        conditional = bool(cfg.class_conditional)
        groups = ctx.num_classes if conditional else 1
        fractions = self._releases(budget)

        # --- the one private release (a rerun in this run directory reuses it, charged once: see _release)
        counts_how = "DP (Gaussian)" if cfg.class_counts == "dp" else "public (not noised)"
        what = "per-class" if conditional else "whole-set"
        release_ckpt = Checkpointer.in_run(ctx.run_dir, RELEASE_CHECKPOINT,
                                           self.resume_fingerprint(budget, shape=list(ctx.shape),
                                                                   classes=ctx.num_classes), what="released")
        saved = release_ckpt.load() if budget.private else None
        if saved is not None:
            m1, m2 = saved.state["m1"], saved.state["m2"]
            self.release = dict(saved.state["release"])
            saved.restore_ledger(ledger)
            log.info("dp_mepf: reusing the embeddings this run released before (%s): charged once", release_ckpt.path)
        else:
            m1, m2 = self._release(private, budget, ledger, phi, layers=layers, groups=groups, fractions=fractions,
                                   conditional=conditional, device=device, release_ckpt=release_ckpt, what=what,
                                   counts_how=counts_how)

        # --- post-processing: a generator matched to the released embeddings
        self._fit_generator(m1, m2, groups, phi, public, device)
        self.conditional = conditional

    def _release(self, private: Split, budget: PrivacyBudget, ledger: PrivacyLedger, phi: Any, *, layers: list[str],
                 groups: int, fractions: dict[str, float], conditional: bool, device: torch.device,
                 release_ckpt: Checkpointer, what: str, counts_how: str) -> tuple[np.ndarray, np.ndarray | None]:
        """The one private release: ``(m1_dp, m2_dp or None)`` (the exact moments at eps=inf), recorded in the
        ledger; under a budget saved to ``release_ckpt`` with its charges before the ledger records them, so that a
        rerun after a crash (in the generator's training, say) reuses it instead of releasing again."""
        cfg, ctx = self.cfg, self.ctx
        y = private.y.astype(np.int64) if conditional else np.zeros(len(private), dtype=np.int64)
        batches = zip(self._features(phi, private.x, device), (y[i : i + 256] for i in range(0, len(y), 256)))
        s1, s2, counts, _ = moment_sums(batches, groups)  # how many rows needed clipping: private, not kept
        self.release: dict[str, Any] = {
            "feature_dim": int(s1.shape[1]), "layers": layers + ["h"], "groups": groups, "counts": cfg.class_counts,
            "calibration": str(cfg.calibration), "sensitivity": 1.0,
        }
        if budget.private:
            plan = calibrate_releases(epsilon=budget.epsilon, delta=budget.delta, fractions=fractions,
                                      calibration=str(cfg.calibration), what="method.budget_split")
            shares = {k: (r.epsilon, r.delta) for k, r in plan.items()}
            rng = dp_numpy_generator(deterministic=ctx.deterministic_noise, seed=ctx.seed)
            sigma = {k: r.sigma for k, r in plan.items()}
            if "counts" in sigma:
                noisy = gaussian_mechanism(counts, sigma["counts"], generator=rng)
                n_used = np.maximum(noisy, 1.0)
            else:
                n_used = counts.astype(np.float64)
            m1 = release_means(s1, n_used, sigma["m1"], rng)
            m2 = release_means(s2, n_used, sigma["m2"], rng) if "m2" in sigma else None
            events = []
            for k, (e, d) in shares.items():
                stat = {"m1": f"{what} sums of phi", "m2": f"{what} sums of phi^2",
                        "counts": f"{what} example counts"}[k]
                events.append(ApproxDPEvent(
                    epsilon=e, delta=d,
                    label=f"dp_mepf {k}: {stat}, Gaussian sigma={sigma[k]:.6g} ({cfg.calibration}, sensitivity 1); "
                          f"counts {counts_how}",
                ))
            self.release.update(sigma=sigma, shares={k: list(v) for k, v in shares.items()})
            # on disk with its charges first: a kill after this line leaves a release that a rerun reuses (charged
            # once, from this file); before it, the release never left the process
            with_release = PrivacyLedger(target_epsilon=ledger.target_epsilon, delta=ledger.delta,
                                         events=[*ledger.events, *events])
            release_ckpt.save(0, {"m1": m1, "m2": m2, "release": dict(self.release)}, with_release)
            for event in events:
                ledger.add(event)
            log.info("dp_mepf: released %s embeddings (d=%d) with sigma %s; counts %s",
                     what, s1.shape[1], {k: round(v, 4) for k, v in sigma.items()}, counts_how)
        else:
            n_used = counts.astype(np.float64)
            m1 = release_means(s1, n_used, None, None)
            m2 = release_means(s2, n_used, None, None) if cfg.moments == "m1_and_m2" else None
            ledger.add(NonPrivateEvent(label=f"dp_mepf {what} embeddings released without noise (eps=inf)"))
        return m1, m2

    def _fit_generator(self, m1: np.ndarray, m2: np.ndarray | None, groups: int, phi: Any, public: Split | None,
                       device: torch.device) -> None:
        """Post-processing: the generator matched to the released embeddings (after an optional public pretraining)."""
        cfg, ctx = self.cfg, self.ctx
        channels, resolution = ctx.shape[0], ctx.shape[1]
        G = CondDCGANGenerator(z_dim=int(cfg.z_dim), num_classes=groups, channels=channels, resolution=resolution,
                               ngf=int(cfg.ngf)).to(device)
        opt = torch.optim.Adam(G.parameters(), lr=float(cfg.lr), betas=(float(cfg.beta1), 0.999))
        gen = torch.Generator().manual_seed(ctx.seed)
        self.train_log: dict[str, Any] = {}
        if int(cfg.pretrain_steps) > 0:
            if public is None:
                raise ValueError("dp_mepf: pretrain_steps > 0 needs a dataset with public data")
            pub = public_subsample(public, cfg.max_public, ctx.seed)
            p1, p2, pc, _ = moment_sums(
                ((f, np.zeros(len(f), dtype=np.int64)) for f in self._features(phi, pub.x, device)), 1)
            t1 = np.repeat(release_means(p1, pc.astype(np.float64), None, None), groups, axis=0)
            t2 = np.repeat(release_means(p2, pc.astype(np.float64), None, None), groups, axis=0)
            self.train_log["pretrain_loss"] = self._train(G, opt, phi, t1, t2 if m2 is not None else None,
                                                          int(cfg.pretrain_steps), groups, gen, device, "pretrain")
        self.train_log["loss"] = self._train(G, opt, phi, m1, m2, int(cfg.steps), groups, gen, device, "private")
        self.G = G.cpu().eval()

    def _train(self, G: nn.Module, opt: torch.optim.Optimizer, phi: PerceptualFeatures, m1: np.ndarray,
               m2: np.ndarray | None, steps: int, groups: int, gen: torch.Generator, device: torch.device,
               what: str) -> float | None:
        """``steps`` Adam steps of the generator on :func:`mepf_loss` with class-balanced batches."""
        t1 = torch.from_numpy(m1).to(device)
        t2 = torch.from_numpy(m2).to(device) if m2 is not None else None
        batch = int(self.cfg.batch_size)
        G.train()
        last = None
        for step in range(steps):
            y = (torch.arange(batch) % groups)[torch.randperm(batch, generator=gen)]
            z = torch.randn(batch, int(self.cfg.z_dim), generator=gen)
            y, z = y.to(device), z.to(device)
            loss = mepf_loss(phi(G(z, y)), y, t1, t2)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            last = float(loss.detach())
            if (step + 1) % 200 == 0 or step + 1 == steps:
                log.info("dp_mepf %s step %d/%d: loss %.6g", what, step + 1, steps, last)
                if self.ctx.logger is not None:
                    self.ctx.logger.log_metrics({f"train/{what}_loss": last}, step=step)
        return last

    def sample(self, n: int, labels: np.ndarray | None = None) -> Samples:
        """``n`` images; class-conditional: labels uniform over the classes (a public choice) or as given.
        Unconditional: the generator takes no label, and the samples carry none (``acc`` cannot be scored)."""
        rng = np.random.default_rng(self.ctx.seed)
        conditional = self.conditional
        if labels is None and conditional:
            labels = self.uniform_labels(n, rng)
        groups = np.asarray(labels, dtype=np.int64) if conditional else np.zeros(n, dtype=np.int64)
        with torch.no_grad():
            x = generate_conditional(self.G, groups, z_dim=int(self.cfg.z_dim), shape=self.ctx.shape,
                                     generator=torch.Generator().manual_seed(self.ctx.seed))
        provenance = {
            "method": "dp_mepf",
            "labels": "uniform over classes (public choice)" if conditional else "none (unconditional generator)",
            "release": dict(self.release),
            "generator_loss": self.train_log,
        }
        return Samples(x.astype(np.float32), groups if conditional else None, provenance)
