"""``g_pate``: G-PATE (Long et al. 2021, paper 002) — a student generator trained on the privately aggregated
gradients of an ensemble of teacher discriminators (Algorithms 1 and 2 of the paper).

* Teachers: N conditional discriminators, teacher i trained only on the i-th of N disjoint partitions of the
  private rows (real, label 1; :class:`dpsyn.data.partitions.KeyedPartitions`: a row's partition is a keyed hash of
  its source id, so removing a row changes its own partition only) against the student's fakes (label 0), one Adam step each per generator step
  (:class:`dpsyn.nets.ensemble.TeacherEnsemble`: the N teachers run as one batched computation). On images the
  default is the authors' teacher (:class:`dpsyn.nets.ensemble.CondPATETeacher`: conv, conv, fc, the label at every
  layer); the embedded profile narrows it (ndf 4, fc 32: 13.6k parameters against the authors' ~0.55M, which take
  ~27 GB with Adam at 4000 teachers), the ``_paper`` profiles hold the authors' width.
* Batch (the reference code's rule, on the nominal partition size m = n // N of the declared-public n): where
  m >= ``MIN_PARTITION_BATCH``, b = min(batch_size, m), so each round a teacher steps on m rows of its partition
  (15 at 4000 teachers on 60k images: its whole partition when it holds at most m rows, the rest masked; m rows of a
  pass through it otherwise); smaller partitions (digits, tables) keep ``batch_size`` for the generator and
  min(batch_size, m) for the teachers. Teacher i's fakes carry its own real rows' labels (label-matched, as the reference code feeds the
  round's conditioning to both), drawn once per round from z ~ U(-1, 1) (``method.latent``).
  The diagnostic switch ``method.teacher_fakes=r`` (default 1, the paper and the reference code) shows each teacher
  r fakes per real row, from r*tb fresh latents, the j-th real row's label on fakes j, j+tb, ...: a sharper picture
  of the generator's distribution at no privacy cost (fakes are G's output; the queries and their count stay those
  of the round's b samples).
* DPGradAgg (:func:`dp_grad_agg`), per generated sample x_j: every teacher's gradient g_i = -grad_x BCE(D_i(x_j), 1)
  is projected on a fresh random matrix R_j in R^{d x k} (entries N(0, 1/k), or Gaussian directions inside the span
  of the low 2-D DCT frequencies with ``method.projection=dct``; data-independent, drawn from the run seed), clipped
  to [-c, c], discretised into B equal bins; for each of the k coordinates the teachers' votes form a histogram
  (one query), answered by Confident-GNMax (:func:`dpsyn.privacy.confident_gnmax`): the bin centre of the noisy
  argmax where the noisy maximum count passes the threshold T, else 0 (an unanswered coordinate contributes 0 and
  pays only the threshold under the data-dependent bound); g_hat_j = out_j R_j^T.
* Student: G(z, y) (labels uniform over the classes) regresses onto x + g_hat: Adam on sum ||G(z) - (x + g_hat)||^2.
  ``method.ema > 0`` releases an exponential moving average of G's weights (:func:`dpsyn.lit.ema.update_ema`)
  instead of G: post-processing of a generator that only the answers train, at no privacy cost.

Privacy: the generator only sees the aggregated answers, so the run's privacy is that of the Confident-GNMax
queries, b*k per step (b generated samples, k projections): one :class:`dpsyn.privacy.PATEEvent` in the ledger, the
votes of every step recorded before their answers are used. ``method.bound`` names the RDP bound used to stop
training and to report epsilon: ``data_independent`` (default: every query charged ``lambda/(2 sigma1^2) +
lambda/sigma2^2``, a function of public parameters only), ``renyi_filter`` (a Renyi filter at one order fixed before
the run, Feldman & Zrnic 2021: a query pays GNMax only if its threshold check, a released output, answered it; the
reported epsilon is the filter's budget, a true DP bound; :class:`dpsyn.privacy.ledger.PATEEvent`) or
``data_dependent`` (Papernot et al.'s bound, as the paper reports it; not itself private to publish). Training stops
before a step whose queries would take the ledger past the target (for the data-dependent bound and the filter:
judged with GNMax charged for all of the step's queries), or at ``method.steps``. The gradients follow the reference
code's convention: of the batch-MEAN generator loss (so the clip ``c = 1e-4`` has the paper's meaning), i.e. the
per-sample gradient divided by b.


Tables (the paper's Kaggle Credit protocol, Sec. 5): fully connected teachers (:class:`CondMLPTeacher`) and
generator (:class:`dpsyn.nets.mlp_gan.CondMLPGenerator`, rows in [0, 1] like the min-max scaled tables), and two
steps: the class proportions are released first with the Laplace mechanism at ``method.class_ratio_epsilon`` (the
paper: 0.01 of eps=1; :meth:`Method.release_class_proportions`, an ``ApproxDPEvent`` in the ledger), then the
generator trains on the rest of the budget with labels drawn from the released proportions, and samples follow them.
Images use labels uniform over the classes (a public choice).
Non-private runs (eps=inf) aggregate as ``method.inf_aggregate`` says, a diagnostic switch whose values are the rungs
of the G-PATE ladder (docs/papers/long2021.md, The ladders; not settings of the published method): ``mean`` (the
teachers' mean gradient, the reference code's non-private path), ``projected`` (mean of the projected gradients,
back-projected) or ``vote`` (DPGradAgg's votes without noise or threshold: their plain argmax).
"""

from __future__ import annotations

import copy
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
from dpsyn.data.partitions import KeyedPartitions, partition_key, source_ids
from dpsyn.lit.ema import update_ema
from dpsyn.methods.base import (
    METHODS,
    PATE_ACCOUNTING_KEYS,
    Method,
    PrivacyBudget,
    Samples,
    draw_latent,
    generate_conditional,
)
from dpsyn.methods.session import FitSession
from dpsyn.nets.dcgan import CondDCGANDiscriminator, CondDCGANGenerator
from dpsyn.nets.ensemble import (
    CondConvTeacher,
    CondMLPTeacher,
    CondPATETeacher,
    TeacherEnsemble,
)
from dpsyn.nets.lowpass import LowPassOutput, dct_basis
from dpsyn.nets.mlp_gan import CondMLPGenerator
from dpsyn.privacy import (
    NonPrivateEvent,
    PATEEvent,
    PrivacyLedger,
    confident_gnmax,
    dp_generator,
    pate_max_queries,
)
from dpsyn.methods.tiny import TABLE_METRICS, TINY_G_PATE
from dpsyn.config.schema import TEACHER_ARCHS  # auto: gpate on images, mlp on tables

log = logging.getLogger(__name__)

CHECKPOINT = "g_pate.pt"
MIN_PARTITION_BATCH = 15
"""Partitions of at least this many rows set the batch (the reference code's rule; 15 = 60k rows / 4000 teachers)."""
INF_AGGREGATES = {
    "mean": "the teachers' mean gradient (the reference code's non_private_aggregation)",
    "projected": "the mean of the teachers' projected gradients, back-projected (no clip, no bins)",
    "vote": "the plain argmax of the projected, clipped, discretised votes (DPGradAgg without noise)",
}
"""What a non-private run (eps=inf) aggregates (``method.inf_aggregate``): the rungs of the G-PATE ladder
(docs/papers/long2021.md, The ladders); a private run always votes."""


# ---------------------------------------------------------------------------------------------------------------
# DPGradAgg (Algorithm 2), pure functions


def random_projections(
    b: int, d: int, k: int, *, generator: torch.Generator, device: Any = "cpu", basis: torch.Tensor | None = None
) -> torch.Tensor:
    """(b, d, k) independent Gaussian projection matrices, one per sample. Data-independent: no privacy cost.

    Without ``basis``: entries N(0, 1/k) (scikit-learn's ``GaussianRandomProjection``, as the reference code). With
    ``basis`` (d, m) orthonormal columns (:func:`dct_basis`): ``basis @ W``, W (m, k) with entries N(0, d/(m k)), i.e.
    Gaussian directions inside the span of ``basis`` (a low-pass subspace for the DCT basis), each of the same
    expected norm as a full-space direction, so that the clip ``c`` keeps its meaning."""
    if basis is None:
        r = torch.randn(b, d, k, generator=generator, dtype=torch.float32)
        return (r / math.sqrt(k)).to(device)
    if basis.shape[0] != d:
        raise ValueError(f"basis has {basis.shape[0]} rows for gradients of dimension {d}")
    w = torch.randn(b, basis.shape[1], k, generator=generator, dtype=torch.float32) * math.sqrt(d / (basis.shape[1] * k))
    return torch.einsum("dm,bmk->bdk", basis, w).to(device)


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


def lr_decay(step: int, steps: int, start: float | None) -> float:
    """The generator's learning-rate factor at round ``step`` (0-based) of ``steps``: 1 until ``start x steps``, then
    falling linearly to ``1 / (steps (1 - start))`` at the last round (0 just after it); 1 throughout when ``start`` is
    None.

    A function of the round alone (not a ``torch.optim.lr_scheduler`` object), so a resumed run needs no scheduler
    state to continue the same schedule. ``method.steps`` may change on resume (``resume_free_keys``); the rounds left
    then follow the schedule of the new cap.
    """
    if start is None:
        return 1.0
    return min(1.0, (steps - step) / (steps * (1.0 - start)))


def pate_hyperparameters(
    cfg: Any, *, ints: tuple[str, ...], floats: tuple[str, ...], hidden: tuple[str, ...]
) -> dict[str, Any]:
    """The hyperparameters G-PATE and PATE-GAN share (their ranges are checked at compose time by the schemas,
    dpsyn.config.schema): the integers ``ints``, numbers ``floats``, the Confident-GNMax noise in votes
    (``sigma_threshold``, ``sigma``, ``threshold``: :func:`dpsyn.config.resolve_pate_noise`, absolute or a ratio to
    the teachers), Adam's ``beta1``, ``teacher_batch``, ``bound``, the layer-width lists ``hidden``,
    ``class_ratio_epsilon`` (tables) and ``teacher_chunk``."""
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
    return hp


def new_pate_event(ledger: PrivacyLedger, hp: dict[str, Any], *, label: str, max_queries: int) -> PATEEvent:
    """A run's Confident-GNMax event (G-PATE, PATE-GAN), made when it is recorded: under ``bound=renyi_filter`` the
    filter's order and RDP budget come from the ledger as it stands then (after a table's class proportions), and
    ``max_queries`` is the most queries the step cap allows (:class:`~dpsyn.privacy.ledger.PATEEvent`)."""
    noise = dict(sigma_threshold=hp["sigma_threshold"], sigma=hp["sigma"])
    extra: dict[str, Any] = {}
    if hp["bound"] == "renyi_filter":
        order, budget = ledger.renyi_filter(**noise)
        extra = dict(filter_order=order, filter_budget=budget, max_queries=int(max_queries))
    return PATEEvent(**noise, threshold=hp["threshold"], bound=hp["bound"], label=label, **extra)


def log_pate_allowance(name: str, event: PATEEvent, rest: PrivacyBudget, *, per_step: int, unit: str) -> None:
    """Log how many queries (and steps of ``per_step``) the budget ``rest`` allows: exactly under the
    data-independent bound; under the Renyi filter, with every query answered (the fewest) and with none."""
    if event.bound == "data_independent":
        q = (pate_max_queries(epsilon=rest.epsilon, sigma_threshold=event.sigma_threshold, sigma=event.sigma,
                              delta=rest.delta) if rest.epsilon > 0 else 0)
        log.info("%s: the data-independent bound allows about %d queries = %d %s of %d (eps=%g, delta=%g)",
                 name, q, q // per_step, unit, per_step, rest.epsilon, rest.delta)
    elif event.bound == "renyi_filter":
        a, budget = event.filter_order, event.filter_budget
        threshold, gnmax = (float(c[0]) for c in event.query_rdp([a]))
        most, fewest = int(budget / threshold), int(budget / (threshold + gnmax))
        log.info("%s: a Renyi filter at order %g (budget %.4g) allows %d-%d queries = %d-%d %s of %d, as more or "
                 "fewer are answered (eps=%g, delta=%g)", name, a, budget, fewest, most, fewest // per_step,
                 most // per_step, unit, per_step, rest.epsilon, rest.delta)


def filter_fill(event: PATEEvent | None) -> dict[str, str]:
    """``{"filter": share}``, the share of a Renyi filter's budget the realised queries have used (for a progress
    bar: the epsilon a filtered run reports is the budget's from its first query on), or ``{}``."""
    record = filter_record(event)
    return {"filter": f"{record['filter_spent'] / record['filter_budget']:.3f}"} if record else {}


def filter_record(event: PATEEvent | None) -> dict[str, float]:
    """A Renyi filter's order, budget and realised RDP for a run's train log (empty for other bounds)."""
    if event is None or event.bound != "renyi_filter":
        return {}
    return {"filter_order": float(event.filter_order), "filter_budget": float(event.filter_budget),
            "filter_spent": float(event.filter_spent())}


@METHODS.register("g_pate")
class GPATE(Method):
    """G-PATE on images and tables (see the module docstring)."""

    # b x k queries a round
    accounting_keys = (*PATE_ACCOUNTING_KEYS, "batch_from_partition", "projection_dim")
    tunable_keys = ("lr_g", "lr_d", "lr_g_decay_start", "beta1", "ema", "z_dim", "ngf", "ndf", "teacher_hidden", "d_hidden",
                    "g_hidden", "latent", "teacher_steps", "teacher_fakes", "clip", "bins")
    tiny = ("method=g_pate", "dataset=breast_cancer", *TINY_G_PATE, "method.d_hidden=[8]", "method.g_hidden=[8]",
            "method.z_dim=4", *TABLE_METRICS)

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
                       "teacher_hidden", "teacher_steps", "teacher_fakes", "checkpoint_every"),
            floats=("sigma_threshold", "sigma", "clip", "lr_g", "lr_d", "ema"), hidden=("d_hidden", "g_hidden"),
        )
        hp["teacher_arch"] = str(cfg.teacher_arch)
        hp["batch_from_partition"] = bool(cfg.batch_from_partition)
        hp["inf_aggregate"] = str(cfg.inf_aggregate)
        hp["latent"] = str(cfg.latent)
        hp["projection"] = str(cfg.projection)
        hp["projection_frequencies"] = int(cfg.projection_frequencies)
        hp["output_frequencies"] = None if cfg.output_frequencies is None else int(cfg.output_frequencies)
        hp["lr_g_decay_start"] = None if cfg.lr_g_decay_start is None else float(cfg.lr_g_decay_start)
        return hp

    # ---- building blocks ----------------------------------------------------------------------------------

    def _arch(self) -> str:
        """The teacher architecture: ``auto`` is conv on images and mlp on tables; conv/dcgan need images."""
        arch, kind = self.hp["teacher_arch"], self.ctx.kind
        if arch == "auto":
            return "gpate" if kind == "image" else "mlp"
        if kind != "image" and arch != "mlp":
            raise ValueError(f"method.teacher_arch={arch} needs images; a {kind} dataset takes mlp (or auto)")
        return arch

    def _make_teacher(self) -> Callable[[], nn.Module]:
        hp, ctx = self.hp, self.ctx
        arch = self._arch()
        if arch == "mlp":
            return lambda: CondMLPTeacher(num_classes=ctx.num_classes, shape=ctx.shape, hidden=hp["d_hidden"])
        channels, resolution = ctx.shape[0], ctx.shape[1]
        if arch == "gpate":
            return lambda: CondPATETeacher(num_classes=ctx.num_classes, channels=channels, resolution=resolution,
                                           ndf=hp["ndf"], hidden=hp["teacher_hidden"])
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
            g = CondDCGANGenerator(z_dim=hp["z_dim"], num_classes=ctx.num_classes, channels=ctx.shape[0],
                                   resolution=ctx.shape[1], ngf=hp["ngf"])
            if hp["output_frequencies"] is None:
                return g
            return LowPassOutput(g, dct_basis(ctx.shape, hp["output_frequencies"]))
        if hp["output_frequencies"] is not None:
            raise ValueError(f"method.output_frequencies needs images; a {ctx.kind} dataset takes null")
        return CondMLPGenerator(z_dim=hp["z_dim"], num_classes=ctx.num_classes, shape=ctx.shape,
                                hidden=tuple(hp["g_hidden"]))

    def _fingerprint(self, budget: PrivacyBudget) -> dict[str, Any]:
        """What a checkpoint must share with this run to be resumed (the typed config, :meth:`resume_fingerprint`),
        with the noise in votes (a ratio and an absolute value giving the same votes are the same run)."""
        return self.resume_fingerprint(budget, votes={k: self.hp[k] for k in PATE_NOISE_KEYS})

    # ---- training -----------------------------------------------------------------------------------------

    def _batches(self, partition: int) -> tuple[int, int, str]:
        """``(generator batch b, teacher batch, the rule used)`` for partitions of nominally ``partition`` rows
        (``n // N``, a function of the declared-public n: the keyed partitions' sizes vary around it and are never
        read here).

        The reference code cuts the batch to the partition size (``min(batch_size, partition)`` for generator and
        teachers alike: 15 at 4000 teachers on 60k images), so every teacher steps on its whole partition each round
        and a round makes ``b * k`` queries. That rule (``method.batch_from_partition``) applies where partitions hold
        at least :data:`MIN_PARTITION_BATCH` rows; below (digits: ~3 rows per teacher; tables) the generator keeps
        ``method.batch_size`` and the teachers take ``min(batch_size, partition)``. ``method.teacher_batch`` fixes the
        teachers' batch. A teacher whose partition holds fewer rows than its batch uses all of them and masks the
        other slots (:meth:`KeyedPartitions.batch`)."""
        hp = self.hp
        if hp["batch_from_partition"] and partition >= MIN_PARTITION_BATCH:
            b = min(hp["batch_size"], partition)
            rule = f"batch = min(batch_size, partition) = {b} (the reference code)"
        else:
            b = hp["batch_size"]
            rule = (f"partitions of {partition} < {MIN_PARTITION_BATCH} rows: generator batch {b}, teachers "
                    f"min(batch_size, partition)" if hp["batch_from_partition"] else f"generator batch {b}")
        tb = hp["teacher_batch"] or min(b, partition)
        if tb > partition:
            raise ValueError(f"method.teacher_batch={tb} exceeds the {partition} rows of each of the "
                             f"{hp['teachers']} partitions")
        return b, tb, rule

    def _latent(self, n: int, gen: torch.Generator) -> torch.Tensor:
        return draw_latent(n, self.hp["z_dim"], generator=gen, latent=self.hp["latent"])

    def fit(
        self, private: Split, budget: PrivacyBudget, ledger: PrivacyLedger, public: Split | None = None
    ) -> None:
        hp, ctx = self.hp, self.ctx
        device = torch.device(ctx.device)
        n_rows, n_teachers = len(private), hp["teachers"]
        if n_rows < n_teachers:
            raise ValueError(f"method.teachers={n_teachers} exceeds the {n_rows} private examples (one row at least each)")
        torch.manual_seed(ctx.seed)  # initialisation of G and of the teachers
        gen = torch.Generator().manual_seed(ctx.seed)  # latents, labels, projections (public; fixed shapes)
        # a row's teacher: a keyed hash of its source id (removing a row changes its own partition only)
        parts = KeyedPartitions(source_ids(private, "g_pate"), n_teachers, key=partition_key(ctx.seed, "teachers"))
        b, tb, batch_rule = self._batches(parts.nominal_size)
        G = self._make_generator().to(device)
        ens = TeacherEnsemble(self._make_teacher(), n_teachers, lr=hp["lr_d"], betas=(hp["beta1"], 0.999),
                              chunk_size=hp["teacher_chunk"], device=device)
        opt_g = torch.optim.Adam(G.parameters(), lr=hp["lr_g"], betas=(hp["beta1"], 0.999))
        # the released generator: an EMA of G's weights (post-processing of G, which only the answers train), or G
        G_ema = copy.deepcopy(G) if hp["ema"] > 0 else None
        x_all = torch.from_numpy(np.ascontiguousarray(private.x, dtype=np.float32)).to(device)
        y_all = torch.from_numpy(private.y.astype(np.int64)).to(device)
        k, C = hp["projection_dim"], ctx.num_classes
        if hp["projection"] == "dct" and ctx.kind != "image":
            raise ValueError(f"method.projection=dct needs images; a {ctx.kind} dataset takes gaussian")
        self._basis = (dct_basis(ctx.shape, hp["projection_frequencies"]).to(device) if hp["projection"] == "dct"
                       else None)

        if budget.private:
            dp_gen = dp_generator(deterministic=ctx.deterministic_noise, seed=ctx.seed, device=str(device))
            aggregate = "vote"
        else:
            dp_gen = None
            aggregate = hp["inf_aggregate"]
        max_steps = ctx.capped_steps(hp["steps"])
        state = {"G": G, "G_ema": G_ema, "opt_g": opt_g, "teachers": ens, "opt_teachers": ens.optimizer,
                 "partitions": parts, "gen": gen, "dp_gen": dp_gen if ctx.deterministic_noise else None}
        with FitSession(ctx, ledger, CHECKPOINT, self._fingerprint(budget), state=state, total=max_steps,
                        desc="g_pate rounds", every=hp["checkpoint_every"]) as s:
            # tables: the class proportions, released once (Laplace) before anything else; a re-run in this run
            # directory reuses them (Method.release_class_proportions keeps them there)
            self.proportions: np.ndarray | None = None
            if ctx.kind != "image":
                self.proportions, rest = self.release_class_proportions(private, budget, ledger,
                                                                        hp["class_ratio_epsilon"])
            else:
                rest = budget
            # the run's Confident-GNMax event (its queries grown each round), restored with the ledger on resume
            if budget.private:
                s.open(lambda: new_pate_event(ledger, hp, label=f"g_pate gradient votes ({n_teachers} teachers, "
                                              f"k={k}, B={hp['bins']})", max_queries=max_steps * b * k))
                log_pate_allowance("g_pate", s.event, rest, per_step=b * k, unit="rounds")
            else:
                s.open(NonPrivateEvent(label=f"g_pate trained without noise (eps=inf): {INF_AGGREGATES[aggregate]}"))
            log.info("g_pate: %d teachers of about %d rows (a keyed hash of the rows' source ids), %s", n_teachers,
                     parts.nominal_size, batch_rule)
            # training labels: uniform over the classes (images), or drawn from the released proportions (tables)
            label_probs = None if self.proportions is None else torch.as_tensor(self.proportions, dtype=torch.float32)

            r_fakes = hp["teacher_fakes"]  # the round's b fakes (the reference code) when 1
            self.train_log: dict[str, Any] = {"stopped_by": "steps", "batch": b, "teacher_batch": tb,
                                              "partition_size": parts.nominal_size, "batch_rule": batch_rule,
                                              "aggregate": aggregate}
            t0 = time.perf_counter()
            G.train()
            answered_s = "n/a"  # eps=inf's mean aggregate holds no vote, so there is no answered rate to show
            for step in s.steps():
                z = self._latent(b, gen).to(device)
                if label_probs is None:
                    y = torch.randint(0, C, (b,), generator=gen).to(device)  # labels uniform (public)
                else:
                    y = torch.multinomial(label_probs, b, replacement=True, generator=gen).to(device)
                # teachers: Adam steps on their own partitions' rows against fakes of the same labels (the reference
                # code feeds each teacher G(z, its real rows' labels)): G(z, c) for every class c once, then gathered
                for _ in range(hp["teacher_steps"]):
                    rows, mask = (t.to(device) for t in parts.batch(None, tb))  # (N, tb): row i from partition i only
                    # a masked slot's fakes take the round's (public) labels, never another partition's row's
                    ry = torch.where(mask, y_all[rows], y.repeat(tb // b + 1)[:tb])  # (N, tb)
                    fy = ry.repeat(1, r_fakes)  # (N, r tb): r fakes per real row, each with that row's label
                    nf = tb * r_fakes
                    zt = z[:nf] if nf <= b else self._latent(nf, gen).to(device)
                    with torch.no_grad():
                        table = G(zt.repeat(C, 1), torch.arange(C, device=device).repeat_interleave(nf))
                    table = table.view(C, nf, *table.shape[1:])
                    fakes = table[fy, torch.arange(nf, device=device)]  # (N, r tb, ...): teacher i's fake j, its label
                    real = torch.where(mask.view(*mask.shape, *([1] * (x_all.dim() - 1))), x_all[rows], 0.0)
                    ens.train_step(real, ry, fakes, fy, real_mask=mask)
                fake = G(z, y)
                g_hat, answered = self._aggregate(ens, fake.detach(), y, aggregate=aggregate, gen=gen, dp_gen=dp_gen,
                                                  session=s)
                if g_hat is None:  # the round's queries would overspend: s.stopped_by == "budget"
                    break
                # student: regress G(z) onto x + g_hat (sum of squares, as the reference code)
                target = (fake.detach() + g_hat.view_as(fake)).detach()
                loss = ((fake - target) ** 2).sum()
                for group in opt_g.param_groups:
                    group["lr"] = hp["lr_g"] * lr_decay(step, max_steps, hp["lr_g_decay_start"])
                opt_g.zero_grad(set_to_none=True)
                loss.backward()
                opt_g.step()
                if G_ema is not None:
                    update_ema(G_ema, G, step=step, max_decay=hp["ema"])
                if answered is not None:
                    answered_s = f"{answered.float().mean().item():.3f}"
                eps_now = ledger.epsilon() if s.event is not None else math.inf
                fill = filter_fill(s.event)
                s.show(eps=f"{eps_now:.3f}", answered=answered_s, **fill)
                if (step + 1) % 50 == 0 or step == 0:
                    log.info("g_pate round %d: answered %s of %d queries, eps %.4f (%s)%s", step + 1, answered_s,
                             b * k, eps_now, hp["bound"] if s.event is not None else aggregate,
                             f", Renyi filter {fill['filter']} used" if fill else "")
        event = s.event
        G.eval()
        if G_ema is not None:
            G_ema.eval()
        self.G, self.device = (G if G_ema is None else G_ema), device
        self.train_log.update(stopped_by=s.stopped_by, steps=s.step, fit_s=time.perf_counter() - t0,
                              queries=0 if event is None else event.queries,
                              answered=0 if event is None else event.answered, **filter_record(event))
        log.info("g_pate: %d rounds (stopped by %s), %s", s.step, s.stopped_by,
                 f"{event.queries} queries, {event.answered} answered" if event is not None else aggregate)

    def _aggregate(
        self, ens: TeacherEnsemble, fake: torch.Tensor, y: torch.Tensor, *, aggregate: str, gen: torch.Generator,
        dp_gen: torch.Generator | None, session: FitSession,
    ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """The aggregated gradient into the generated samples ``fake`` (b, ...), of the batch-mean generator loss.

        ``vote`` (private runs, and eps=inf with ``inf_aggregate=vote``): DPGradAgg, the teachers' votes on projected,
        clipped, discretised gradients, answered by Confident-GNMax (private; the ledger records the votes before the
        answers are used) or by their plain argmax (eps=inf). ``mean``: the teachers' mean gradient (the reference
        code's ``non_private_aggregation``); ``projected``: the mean of the projected gradients, back-projected (no
        clipping, no bins): the rungs of the G-PATE ladder (docs/papers/long2021.md, The ladders).

        Returns:
            ``(g_hat, answered (b*k,))``; ``(None, None)`` when the round's queries would take the ledger past its
            target (training stops); ``answered`` is None without a vote.
        """
        hp = self.hp
        b, d, k, bins = fake.shape[0], int(np.prod(fake.shape[1:])), hp["projection_dim"], hp["bins"]
        if aggregate == "mean":
            g_hat = torch.zeros_like(fake)
            for _, g in ens.input_gradient_chunks(fake, y):
                g_hat += g.sum(0) / b  # grad of the batch-mean loss
            return g_hat / ens.n_teachers, None
        proj = random_projections(b, d, k, generator=gen, device=fake.device, basis=self._basis)
        if aggregate == "projected":
            u = torch.zeros(b, k, device=fake.device)
            for _, g in ens.input_gradient_chunks(fake, y):
                u += torch.einsum("nbd,bdk->bk", (g / b).flatten(2).to(proj.dtype), proj)
            return torch.einsum("bk,bdk->bd", u / ens.n_teachers, proj).view_as(fake), None
        votes = torch.zeros(b, k, bins, dtype=torch.long, device=fake.device)
        for _, g in ens.input_gradient_chunks(fake, y):
            votes += teacher_votes(g / b, proj, clip=hp["clip"], bins=bins)  # grad of the batch-mean loss
        flat = votes.view(b * k, bins)
        private = session.event is not None
        if private:
            # would this round's queries (GNMax charged for all) overspend?
            if session.would_exceed(session.event.with_queries(flat, torch.ones(b * k, dtype=torch.bool))):
                return None, None
        g_hat, answered = aggregate_votes(
            votes, proj, clip=hp["clip"], generator=dp_gen,
            sigma_threshold=hp["sigma_threshold"] if private else None,
            sigma=hp["sigma"] if private else None,
            threshold=hp["threshold"] if private else None,
        )
        if private:
            session.charge_queries(flat, answered.flatten())  # before the answers are used
        return g_hat.view_as(fake), answered.flatten()

    @torch.no_grad()
    def sample(self, n: int, labels: np.ndarray | None = None) -> Samples:
        rng = np.random.default_rng(self.ctx.seed)
        if labels is None and self.proportions is not None:
            labels = self.labels_from_proportions(n, self.proportions, rng)
        elif labels is None:
            labels = self.uniform_labels(n, rng)
        x = generate_conditional(self.G, labels, z_dim=self.hp["z_dim"], shape=self.ctx.shape, device=self.device,
                                 generator=torch.Generator().manual_seed(self.ctx.seed + 1), latent=self.hp["latent"])
        prov = {
            "method": "g_pate",
            "labels": "uniform over classes (public choice)" if self.proportions is None else
                      "drawn from the Laplace-released class proportions",
            "class_proportions": None if self.proportions is None else [float(p) for p in self.proportions],
            "accountant": "confident-gnmax rdp (Papernot et al. 2018; dpsyn.privacy.pate)",
            "bound": self.hp["bound"],
            "teachers": self.hp["teachers"],
            "projection_dim": self.hp["projection_dim"],
            "generator": f"EMA of G (max decay {self.hp['ema']:g})" if self.hp["ema"] > 0 else "G",
            **{k: v for k, v in self.train_log.items() if k != "fit_s"},
        }
        return Samples(x, labels, prov)

