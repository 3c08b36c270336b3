"""``g_pate``: G-PATE (Long et al. 2021, paper 002) — a student generator trained on the privately aggregated
gradients of an ensemble of teacher discriminators (Algorithms 1 and 2 of the paper).

* Teachers: N conditional discriminators, teacher i trained only on the i-th of N disjoint contiguous partitions
  of the private rows (real, label 1) against the student's fakes (label 0), one Adam step each per generator step
  (:class:`dpsyn.nets.ensemble.TeacherEnsemble`: the N teachers run as one batched computation).
* DPGradAgg (:func:`dp_grad_agg`), per generated sample x_j: every teacher's gradient g_i = -grad_x BCE(D_i(x_j), 1)
  is projected on a fresh random matrix R_j in R^{d x k} (entries N(0, 1/k); data-independent, drawn from the run
  seed), clipped to [-c, c], discretised into B equal bins; for each of the k coordinates the teachers' votes form
  a histogram (one query), answered by Confident-GNMax (:func:`dpsyn.privacy.confident_gnmax`): the bin centre of
  the noisy argmax where the noisy maximum count passes the threshold T, else 0; g_hat_j = out_j R_j^T.
* Student: G(z, y) (labels uniform over the classes) regresses onto x + g_hat: Adam on sum ||G(z) - (x + g_hat)||^2.

Privacy: the generator only sees the aggregated answers, so the run's privacy is that of the Confident-GNMax
queries, b*k per step (b generated samples, k projections): one :class:`dpsyn.privacy.PATEEvent` in the ledger, the
votes of every step recorded before their answers are used. ``method.bound`` names the RDP bound used to stop
training and to report epsilon: ``data_independent`` (default: every query charged ``lambda/(2 sigma1^2) +
lambda/sigma2^2``, a function of public parameters only) or ``data_dependent`` (Papernot et al.'s bound, as the paper
reports it; not itself private to publish). Training stops before a step whose queries would take the ledger past
the target (for the data-dependent bound: judged with GNMax charged for all of the step's queries), or at
``method.steps``. The gradients follow the reference code's convention: of the batch-MEAN generator loss (so the
clip ``c = 1e-4`` has the paper's meaning), i.e. the per-sample gradient divided by b.

Teachers as the paper: the reference code shrinks the batch to the partition size when partitions are small
(15 rows per teacher for 4000 teachers on 60k images); here the teachers' batch is ``min(batch_size, partition)``
unless ``method.teacher_batch`` is set, and the generator keeps ``batch_size``.

Tables (the paper's Kaggle Credit protocol, Sec. 5): fully connected teachers (:class:`CondMLPTeacher`) and
generator (:class:`dpsyn.nets.mlp_gan.CondMLPGenerator`, rows in [0, 1] like the min-max scaled tables), and two
steps: the class proportions are released first with the Laplace mechanism at ``method.class_ratio_epsilon`` (the
paper: 0.01 of eps=1; :meth:`Method.release_class_proportions`, an ``ApproxDPEvent`` in the ledger), then the
generator trains on the rest of the budget with labels drawn from the released proportions, and samples follow them.
Images use labels uniform over the classes (a public choice).
Non-private runs (eps=inf) use the same votes without noise or threshold (their plain argmax).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch import nn

from dpsyn.config import PATE_NOISE_KEYS, resolve_pate_noise
from dpsyn.data.base import Split
from dpsyn.methods.base import METHODS, Method, PrivacyBudget, Samples, generate_conditional
from dpsyn.nets.dcgan import CondDCGANDiscriminator, CondDCGANGenerator
from dpsyn.nets.ensemble import (
    CondConvTeacher,
    CondMLPTeacher,
    TeacherEnsemble,
    TeacherPartitions,
)
from dpsyn.nets.mlp_gan import CondMLPGenerator
from dpsyn.privacy import (
    NonPrivateEvent,
    PATEEvent,
    PrivacyLedger,
    confident_gnmax,
    dp_generator,
    pate_max_queries,
)
from dpsyn.results.checkpoint import Checkpointer

log = logging.getLogger(__name__)

TEACHER_ARCHS = ("auto", "conv", "dcgan", "mlp")  # auto: conv on images, mlp on tables
CHECKPOINT = "g_pate.pt"


# ---------------------------------------------------------------------------------------------------------------
# DPGradAgg (Algorithm 2), pure functions


def random_projections(b: int, d: int, k: int, *, generator: torch.Generator, device: Any = "cpu") -> torch.Tensor:
    """(b, d, k) independent Gaussian projection matrices, one per sample, entries N(0, 1/k) (scikit-learn's
    ``GaussianRandomProjection``, as the reference code). Data-independent: no privacy cost."""
    r = torch.randn(b, d, k, generator=generator, dtype=torch.float32)
    return (r / math.sqrt(k)).to(device)


def bin_centres(*, clip: float, bins: int, device: Any = "cpu") -> torch.Tensor:
    """(bins,) centres of ``bins`` equal bins on [-clip, clip]."""
    width = 2.0 * clip / bins
    return -clip + width * (torch.arange(bins, device=device, dtype=torch.float32) + 0.5)


def teacher_votes(grads: torch.Tensor, proj: torch.Tensor, *, clip: float, bins: int) -> torch.Tensor:
    """Each teacher's vote per (sample, projected coordinate): the bin of clip(g_i^T R_j, -c, c).

    Additive over teachers, so it can be summed over chunks of teachers.

    Args:
        grads: (n, b, d) gradients of n teachers on b samples (flattened).
        proj: (b, d, k) the samples' projection matrices.
        clip: c > 0; bins on [-c, c], the last bin closed (``numpy.histogram``'s convention).
        bins: B >= 2.

    Returns:
        (b, k, B) int64 vote counts (each (j, l) row sums to n).
    """
    u = torch.einsum("nbd,bdk->nbk", grads.flatten(2).to(proj.dtype), proj).clamp_(-clip, clip)
    idx = torch.floor((u + clip) * (bins / (2.0 * clip))).long().clamp_(0, bins - 1)  # (n, b, k)
    b, k = u.shape[1], u.shape[2]
    flat = (torch.arange(b * k, device=idx.device).view(b, k) * bins + idx).flatten()
    return torch.bincount(flat, minlength=b * k * bins).view(b, k, bins)


def aggregate_votes(
    votes: torch.Tensor,
    proj: torch.Tensor,
    *,
    clip: float,
    sigma_threshold: float | None,
    sigma: float | None,
    threshold: float | None,
    generator: torch.Generator | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Confident-GNMax per projected coordinate, then back-projection: the aggregated gradient of each sample.

    Args:
        votes: (b, k, B) vote counts (:func:`teacher_votes`).
        proj: (b, d, k) the projection matrices the votes were cast in.
        clip: c (bin centres on [-c, c]).
        sigma_threshold, sigma, threshold, generator: Confident-GNMax's parameters and DP noise source; all None
            for the non-private aggregate (the plain argmax, every coordinate answered).

    Returns:
        ``(g_hat (b, d), answered (b, k) bool)``: g_hat_j = out_j R_j^T, out = the answered bins' centres, else 0.
    """
    b, k, nbins = votes.shape
    flat = votes.reshape(b * k, nbins)
    if generator is None:
        answered = torch.ones(b * k, dtype=torch.bool, device=votes.device)
        label = flat.argmax(dim=1)
    else:
        answered, label = confident_gnmax(
            flat, sigma_threshold=sigma_threshold, sigma=sigma, threshold=threshold, generator=generator
        )
    centres = bin_centres(clip=clip, bins=nbins, device=votes.device)
    out = torch.where(answered, centres[label.clamp(min=0)], torch.zeros((), device=votes.device))
    g_hat = torch.einsum("bk,bdk->bd", out.view(b, k).to(proj.dtype), proj)
    return g_hat, answered.view(b, k)


def dp_grad_agg(
    grads: torch.Tensor,
    proj: torch.Tensor,
    *,
    clip: float,
    bins: int,
    sigma_threshold: float | None,
    sigma: float | None,
    threshold: float | None,
    generator: torch.Generator | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """DPGradAgg (Algorithm 2) on the teachers' gradients: project, clip, discretise, vote, Confident-GNMax,
    back-project. Vectorised over teachers and samples.

    Args:
        grads: (N, b, ...) every teacher's gradient on every sample.
        proj: (b, d, k) one projection matrix per sample (d = prod of the sample shape).
        clip, bins: c and B.
        sigma_threshold, sigma, threshold, generator: see :func:`aggregate_votes`.

    Returns:
        ``(g_hat (b, ...), votes (b*k, B), answered (b*k,))``: the votes are what the ledger must record.
    """
    votes = teacher_votes(grads, proj, clip=clip, bins=bins)
    g_hat, answered = aggregate_votes(
        votes, proj, clip=clip, sigma_threshold=sigma_threshold, sigma=sigma, threshold=threshold, generator=generator
    )
    return g_hat.view(grads.shape[1:]), votes.view(-1, bins), answered.flatten()


# ---------------------------------------------------------------------------------------------------------------
# the method


def pate_hyperparameters(
    cfg: Any, *, ints: tuple[str, ...], floats: tuple[str, ...], hidden: tuple[str, ...]
) -> dict[str, Any]:
    """The hyperparameters G-PATE and PATE-GAN share (their ranges are checked at compose time by the schemas,
    dpsyn.config.schema): the integers ``ints``, numbers ``floats``, the Confident-GNMax noise in votes
    (``sigma_threshold``, ``sigma``, ``threshold``: :func:`dpsyn.config.resolve_pate_noise`, absolute or a ratio to
    the teachers), Adam's ``beta1``, ``teacher_batch``, ``bound``, the layer-width lists ``hidden``,
    ``class_ratio_epsilon`` (tables), ``teacher_chunk`` and ``shuffle_partitions`` (as ``shuffle``)."""
    hp: dict[str, Any] = {key: int(cfg.get(key)) for key in ints}
    hp.update({key: float(cfg.get(key)) for key in floats if key not in PATE_NOISE_KEYS})
    hp.update(resolve_pate_noise(cfg))
    hp["beta1"] = float(cfg.beta1)
    hp["teacher_batch"] = cfg.get("teacher_batch")
    hp["bound"] = str(cfg.bound)
    for key in hidden:
        hp[key] = [int(h) for h in cfg.get(key)]
    hp["class_ratio_epsilon"] = float(cfg.class_ratio_epsilon)
    hp["teacher_chunk"] = cfg.get("teacher_chunk")
    hp["shuffle"] = bool(cfg.get("shuffle_partitions"))
    return hp


@METHODS.register("g_pate")
class GPATE(Method):
    """G-PATE on images and tables (see the module docstring)."""

    resume_free_keys = ("checkpoint_every", "teacher_chunk", "steps")  # teacher_chunk: the same votes

    kinds = ("image", "table")
    fitted_attrs = ("G", "device", "proportions", "train_log")
    unreleased_checkpoint_keys = {CHECKPOINT: ("teachers", "opt_teachers")}  # trained without noise

    def __init__(self, cfg: Any, ctx: Any) -> None:
        super().__init__(cfg, ctx)
        self.hp = self._check(cfg)

    @staticmethod
    def _check(cfg: Any) -> dict[str, Any]:
        """Every hyperparameter (checked at compose time by the schema, dpsyn.config.schema.GPATESchema)."""
        hp = pate_hyperparameters(
            cfg, ints=("teachers", "steps", "batch_size", "projection_dim", "bins", "z_dim", "ngf", "ndf",
                       "teacher_steps", "checkpoint_every"),
            floats=("sigma_threshold", "sigma", "clip", "lr_g", "lr_d"), hidden=("d_hidden", "g_hidden"),
        )
        hp["teacher_arch"] = str(cfg.teacher_arch)
        return hp

    # ---- building blocks ----------------------------------------------------------------------------------

    def _arch(self) -> str:
        """The teacher architecture: ``auto`` is conv on images and mlp on tables; conv/dcgan need images."""
        arch, kind = self.hp["teacher_arch"], self.ctx.kind
        if arch == "auto":
            return "conv" if kind == "image" else "mlp"
        if kind != "image" and arch != "mlp":
            raise ValueError(f"method.teacher_arch={arch} needs images; a {kind} dataset takes mlp (or auto)")
        return arch

    def _make_teacher(self) -> Callable[[], nn.Module]:
        hp, ctx = self.hp, self.ctx
        arch = self._arch()
        if arch == "mlp":
            return lambda: CondMLPTeacher(num_classes=ctx.num_classes, shape=ctx.shape, hidden=hp["d_hidden"])
        channels, resolution = ctx.shape[0], ctx.shape[1]
        if arch == "conv":
            return lambda: CondConvTeacher(
                num_classes=ctx.num_classes, channels=channels, resolution=resolution, ndf=hp["ndf"]
            )
        return lambda: CondDCGANDiscriminator(
            num_classes=ctx.num_classes, channels=channels, resolution=resolution, ndf=hp["ndf"]
        )

    def _make_generator(self) -> nn.Module:
        hp, ctx = self.hp, self.ctx
        if ctx.kind == "image":
            return CondDCGANGenerator(z_dim=hp["z_dim"], num_classes=ctx.num_classes, channels=ctx.shape[0],
                                      resolution=ctx.shape[1], ngf=hp["ngf"])
        return CondMLPGenerator(z_dim=hp["z_dim"], num_classes=ctx.num_classes, shape=ctx.shape,
                                hidden=tuple(hp["g_hidden"]))

    def _fingerprint(self, budget: PrivacyBudget) -> dict[str, Any]:
        """What a checkpoint must share with this run to be resumed (the typed config, :meth:`resume_fingerprint`),
        with the noise in votes (a ratio and an absolute value giving the same votes are the same run)."""
        return self.resume_fingerprint(budget, votes={k: self.hp[k] for k in PATE_NOISE_KEYS})

    # ---- training -----------------------------------------------------------------------------------------

    def fit(
        self, private: Split, budget: PrivacyBudget, ledger: PrivacyLedger, public: Split | None = None
    ) -> None:
        hp, ctx = self.hp, self.ctx
        device = torch.device(ctx.device)
        n_rows, n_teachers = len(private), hp["teachers"]
        if n_rows < n_teachers:
            raise ValueError(f"method.teachers={n_teachers} exceeds the {n_rows} private examples (one row at least each)")
        torch.manual_seed(ctx.seed)  # initialisation of G and of the teachers
        gen = torch.Generator().manual_seed(ctx.seed)  # latents, labels, projections, teacher batches
        parts = TeacherPartitions(n_rows, n_teachers, generator=gen, shuffle=hp["shuffle"])
        tb = hp["teacher_batch"] or min(hp["batch_size"], parts.size)
        if tb > parts.size:
            raise ValueError(f"method.teacher_batch={tb} exceeds the {parts.size} rows of each of the {n_teachers} partitions")
        G = self._make_generator().to(device)
        ens = TeacherEnsemble(self._make_teacher(), n_teachers, lr=hp["lr_d"], betas=(hp["beta1"], 0.999),
                              chunk_size=hp["teacher_chunk"], device=device)
        opt_g = torch.optim.Adam(G.parameters(), lr=hp["lr_g"], betas=(hp["beta1"], 0.999))
        x_all = torch.from_numpy(np.ascontiguousarray(private.x, dtype=np.float32)).to(device)
        y_all = torch.from_numpy(private.y.astype(np.int64)).to(device)
        d, k, b = int(np.prod(ctx.shape)), hp["projection_dim"], hp["batch_size"]

        if budget.private:
            event = PATEEvent(sigma_threshold=hp["sigma_threshold"], sigma=hp["sigma"], threshold=hp["threshold"],
                              bound=hp["bound"], label=f"g_pate gradient votes ({n_teachers} teachers, k={k}, B={hp['bins']})")
            dp_gen = dp_generator(deterministic=ctx.deterministic_noise, seed=ctx.seed, device=str(device))
        else:
            event, dp_gen = None, None
        start = 0
        ckpt = Checkpointer.in_run(ctx.run_dir, CHECKPOINT, self._fingerprint(budget), every=hp["checkpoint_every"])
        saved = ckpt.load()
        # tables: the class proportions, released once (Laplace) before anything else; a re-run in this run
        # directory reuses them (Method.release_class_proportions keeps them there)
        self.proportions: np.ndarray | None = None
        if ctx.kind != "image":
            self.proportions, rest = self.release_class_proportions(private, budget, ledger, hp["class_ratio_epsilon"])
        else:
            rest = budget
        if saved is not None:
            state, start = saved.state, saved.step
            G.load_state_dict(state["G"])
            opt_g.load_state_dict(state["opt_g"])
            ens.load_state_dict(state["teachers"])
            ens.optimizer.load_state_dict(state["opt_teachers"])
            parts.load_state_dict(state["partitions"])
            gen.set_state(state["gen"])
            # the ledger as saved: the queries made before the checkpoint, charged once (the class proportions were
            # charged again just above, from their saved release)
            restored = saved.restore_ledger(ledger)
            event_id: int | None = None
            if event is not None:
                event_id = restored[-1]
                event = ledger.events[event_id]
                if ctx.deterministic_noise:
                    dp_gen.set_state(state["dp_gen"])  # generator states are CPU byte tensors
            log.info("resuming g_pate from %s at step %d", ckpt.path, start)
        elif event is not None:
            event_id = ledger.add(event)
        else:
            event_id = None
            ledger.add(NonPrivateEvent(label="g_pate trained without noise (eps=inf): plain argmax of the votes"))
        if event is not None and hp["bound"] == "data_independent":
            q = pate_max_queries(epsilon=rest.epsilon, sigma_threshold=hp["sigma_threshold"], sigma=hp["sigma"],
                                 delta=rest.delta)
            log.info("g_pate: the data-independent bound allows about %d queries = %d steps of %d (eps=%g, delta=%g)",
                     q, q // (b * k), b * k, rest.epsilon, rest.delta)
        # training labels: uniform over the classes (images), or drawn from the released proportions (tables)
        label_probs = None if self.proportions is None else torch.as_tensor(self.proportions, dtype=torch.float32)

        max_steps = ctx.capped_steps(hp["steps"])
        self.train_log: dict[str, Any] = {"stopped_by": "steps", "teacher_batch": tb, "partition_size": parts.size}
        t0 = time.perf_counter()
        step = start
        G.train()
        while step < max_steps:
            z = torch.randn(b, hp["z_dim"], generator=gen).to(device)
            if label_probs is None:
                y = torch.randint(0, ctx.num_classes, (b,), generator=gen).to(device)  # labels uniform (public)
            else:
                y = torch.multinomial(label_probs, b, replacement=True, generator=gen).to(device)
            fake = G(z, y)
            # teachers: Adam steps on their own partitions' rows vs the student's current fakes (shared by all)
            for _ in range(hp["teacher_steps"]):
                rows = parts.sample(tb).to(device)
                ens.train_step(x_all[rows], y_all[rows], fake.detach(), y)
            # DPGradAgg: the teachers' votes on the projected, clipped, discretised gradients
            proj = random_projections(b, d, k, generator=gen, device=device)
            votes = torch.zeros(b, k, hp["bins"], dtype=torch.long, device=device)
            for _, g in ens.input_gradient_chunks(fake.detach(), y):
                votes += teacher_votes(g / b, proj, clip=hp["clip"], bins=hp["bins"])  # grad of the batch-mean loss
            if event is not None:
                flat = votes.view(b * k, hp["bins"])
                # would this step's queries (GNMax charged for all) overspend?
                trial = ledger.events[event_id].with_queries(flat, torch.ones(b * k, dtype=torch.bool))
                if ledger.would_exceed(trial, replacing=event_id):
                    self.train_log["stopped_by"] = "budget"
                    break
            g_hat, answered = aggregate_votes(
                votes, proj, clip=hp["clip"], generator=dp_gen,
                sigma_threshold=hp["sigma_threshold"] if event is not None else None,
                sigma=hp["sigma"] if event is not None else None,
                threshold=hp["threshold"] if event is not None else None,
            )
            if event is not None:
                ledger.record_pate_queries(event_id, flat, answered.flatten())  # before the answers are used
            # student: regress G(z) onto x + g_hat (sum of squares, as the reference code)
            target = (fake.detach() + g_hat.view_as(fake)).detach()
            loss = ((fake - target) ** 2).sum()
            opt_g.zero_grad(set_to_none=True)
            loss.backward()
            opt_g.step()
            step += 1
            if step % 50 == 0 or step == 1:
                log.info("g_pate step %d: answered %.3f of %d queries, eps %.4f (%s)", step,
                         answered.float().mean().item(), b * k, ledger.epsilon() if event is not None else math.inf,
                         hp["bound"])
            if ckpt.due(step):
                ckpt.save(step, {
                    "G": G.state_dict(),
                    "opt_g": opt_g.state_dict(), "teachers": ens.state_dict(), "opt_teachers": ens.optimizer.state_dict(),
                    "partitions": parts.state_dict(), "gen": gen.get_state(),
                    "dp_gen": dp_gen.get_state() if (dp_gen is not None and ctx.deterministic_noise) else None,
                }, ledger)
        G.eval()
        self.G, self.device = G, device
        self.train_log.update(steps=step, fit_s=time.perf_counter() - t0, queries=0 if event is None else event.queries,
                              answered=0 if event is None else event.answered)
        log.info("g_pate: %d steps (stopped by %s), %s", step, self.train_log["stopped_by"],
                 f"{event.queries} queries, {event.answered} answered" if event is not None else "non-private")

    @torch.no_grad()
    def sample(self, n: int, labels: np.ndarray | None = None) -> Samples:
        rng = np.random.default_rng(self.ctx.seed)
        if labels is None and self.proportions is not None:
            labels = self.labels_from_proportions(n, self.proportions, rng)
        elif labels is None:
            labels = self.uniform_labels(n, rng)
        x = generate_conditional(self.G, labels, z_dim=self.hp["z_dim"], shape=self.ctx.shape, device=self.device,
                                 generator=torch.Generator().manual_seed(self.ctx.seed + 1))
        prov = {
            "method": "g_pate",
            "labels": "uniform over classes (public choice)" if self.proportions is None else
                      "drawn from the Laplace-released class proportions",
            "class_proportions": None if self.proportions is None else [float(p) for p in self.proportions],
            "accountant": "confident-gnmax rdp (Papernot et al. 2018; dpsyn.privacy.pate)",
            "bound": self.hp["bound"],
            "teachers": self.hp["teachers"],
            "projection_dim": self.hp["projection_dim"],
            **{k: v for k, v in self.train_log.items() if k != "fit_s"},
        }
        return Samples(x, labels, prov)

