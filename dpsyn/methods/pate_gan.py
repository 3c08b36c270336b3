"""``pate_gan``: PATE-GAN (Jordon, Yoon & van der Schaar, ICLR 2019), a baseline of paper 002 (G-PATE) — a
generator trained against a student discriminator that only ever sees generated samples, labelled real/fake by the
privately aggregated votes of N teacher discriminators trained on disjoint partitions of the private data.

Per step (Algorithm 1 of Jordon et al., with the data kept where it belongs):

* Teachers (:func:`teacher_update`): N binary classifiers real-vs-fake, teacher i trained ONLY on the i-th of N
  disjoint partitions of the private rows (:class:`dpsyn.data.partitions.KeyedPartitions`, a keyed hash of each
  row's source id, so removing a row changes its own partition only; label 1) against the
  generator's current samples (label 0), ``teacher_steps`` Adam steps each
  (:class:`dpsyn.nets.ensemble.TeacherEnsemble`, the N teachers as one batched computation).
* Student labels (:func:`binary_votes`, :func:`student_labels`): ``batch_size`` fresh generated samples, one query
  each; teacher i votes 1 ("real") where its logit is > 0 (or, with the diagnostic switch ``method.vote_quantile``,
  above its own cut: :func:`vote_cuts`), else 0; the (b, 2) vote histogram is answered by
  Confident-GNMax (:func:`dpsyn.privacy.confident_gnmax`: a noisy threshold check with ``sigma_threshold`` against
  ``threshold``, then the noisy argmax with ``sigma``). Unanswered samples are dropped from the student's batch.
* Student S (:func:`student_step`): BCE on the answered generated samples and their aggregated labels, nothing else.
* Generator G(z, y): the non-saturating loss BCE(S(G(z, y)), 1). G only sees S.

Two bugs shipped by other implementations are ruled out by construction and by tests: teachers trained on the same
or overlapping data (here each teacher's batch comes from its own partition only), and a student trained on real
rows (here S's inputs are generator outputs only).

Departure from Jordon et al.: they aggregate with the Laplace noisy max (PATE, Papernot et al. 2017) and account
with the moments accountant; dpsyn uses Confident-GNMax (Papernot et al. 2018), the tighter aggregator whose RDP
composes in dpsyn's PATE accountant (:mod:`dpsyn.privacy.pate`), as G-PATE does, so the two methods of paper 002
are accounted the same way.

Privacy: S, and through it G, only see the aggregated answers, so the run's privacy is that of the queries, ``b``
per step: one :class:`dpsyn.privacy.PATEEvent` in the ledger, every step's votes recorded before their answers are
used; ``method.bound`` as in :mod:`dpsyn.methods.g_pate` (``data_independent`` by default). Training stops before a
step whose queries would take the ledger past the target, or at ``method.steps``. On tables the class proportions
are first released with the Laplace mechanism at ``method.class_ratio_epsilon`` (G-PATE's tabular protocol,
:meth:`~dpsyn.methods.base.Method.release_class_proportions`) and generated labels are drawn from them; on images
labels are uniform over the classes (a public choice). Non-private runs (eps=inf) use the plain argmax of the votes.

The PATE-GAN ladder (eps=inf; docs/papers/long2021.md, The ladders): with the diagnostic switch
``method.inf_signal=teachers`` G is trained on the teacher ensemble itself (:func:`ensemble_generator_loss`) instead
of the student, which locates where learning stops: the teachers carry class-conditional signal, the student trained
on generated samples only does not pass it on.
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
from torch.nn import functional as F

from dpsyn.config import PATE_NOISE_KEYS
from dpsyn.data.base import Split
from dpsyn.data.partitions import KeyedPartitions, partition_key, source_ids
from dpsyn.methods.base import METHODS, PATE_ACCOUNTING_KEYS, Method, PrivacyBudget, Samples, generate_conditional
from dpsyn.methods.g_pate import (
    TEACHER_ARCHS,
    filter_fill,
    filter_record,
    log_pate_allowance,
    new_pate_event,
    pate_hyperparameters,
)
from dpsyn.methods.session import FitSession
from dpsyn.nets.dcgan import CondDCGANDiscriminator, CondDCGANGenerator
from dpsyn.nets.ensemble import (
    CondConvTeacher,
    CondMLPTeacher,
    CondPATETeacher,
    TeacherEnsemble,
)
from dpsyn.nets.mlp_gan import CondMLPDiscriminator, CondMLPGenerator
from dpsyn.privacy import (
    NonPrivateEvent,
    PrivacyLedger,
    confident_gnmax,
    dp_generator,
)
from dpsyn.methods.tiny import TABLE_METRICS, TINY_PATE_GAN

log = logging.getLogger(__name__)

CHECKPOINT = "pate_gan.pt"
IMAGE_TEACHERS = TEACHER_ARCHS  # auto (conv on images) | gpate | conv | dcgan | mlp
TABLE_TEACHERS = ("auto", "mlp")


# ---------------------------------------------------------------------------------------------------------------
# the four steps, as small functions


def teacher_update(
    ens: TeacherEnsemble, parts: KeyedPartitions, x_all: torch.Tensor, y_all: torch.Tensor, fake: torch.Tensor,
    fake_y: torch.Tensor, *, steps: int, batch: int,
) -> torch.Tensor:
    """``steps`` Adam steps of every teacher on ``batch`` rows of ITS OWN partition (label 1) vs ``fake`` (label 0).

    Args:
        ens: the N teachers.
        parts: the N disjoint partitions of the private rows; row i of ``parts.batch`` belongs to teacher i only
            (a partition smaller than ``batch`` masks the rest of its slots).
        x_all, y_all: all private rows and labels (indexed by the partitions' row ids).
        fake, fake_y: (b, ...) / (b,) generated samples, shared by all teachers (no privacy cost).
        steps, batch: Adam steps and real rows per teacher per step.

    Returns:
        (N,) the teachers' losses before their last step.
    """
    fake, fake_y = fake.detach(), fake_y.detach()
    losses = torch.zeros(ens.n_teachers)
    for _ in range(steps):
        rows, mask = (t.to(x_all.device) for t in parts.batch(None, batch))  # (N, batch): row i from partition i
        real = torch.where(mask.view(*mask.shape, *([1] * (x_all.dim() - 1))), x_all[rows], 0.0)
        losses = ens.train_step(real, torch.where(mask, y_all[rows], 0), fake, fake_y, real_mask=mask)
    return losses


def binary_votes(logits: torch.Tensor, cut: torch.Tensor | None = None) -> torch.Tensor:
    """(N, b) teacher logits -> (b, 2) vote histogram: column 0 "fake" (logit <= cut), column 1 "real" (logit > cut).

    Args:
        logits: (N, b) each teacher's logit on each query.
        cut: (N,) each teacher's own decision threshold (:func:`vote_cuts`); None = 0, Jordon et al.'s rule.
    """
    real = (logits > (0 if cut is None else cut[:, None])).sum(0)
    return torch.stack([logits.shape[0] - real, real], dim=1).long()


def vote_cuts(ref_logits: torch.Tensor, quantile: float) -> torch.Tensor:
    """Each teacher's decision threshold: the ``quantile`` of its own logits on the step's generated samples.

    Why: a teacher that separates its real rows from the generator's samples (as a discriminator soon does) calls
    every generated sample "fake"; with the cut at 0 every aggregated label is then "fake", the student sees one class
    and the generator gets no direction (measured: chance accuracy at eps=inf). With the cut at the median of its
    logits on the current samples, teacher i votes "real" on the half of the samples it finds the most realistic:
    the aggregated label says which samples most teachers rank in their upper half, the student learns that ranking
    and the generator is meant to climb it (up the teachers' log density ratio). Measured on fmnist at eps=inf: the
    labels split (0.38-0.69 voted real) and the student fits them, but the generator still drifts to textures
    (docs/papers/long2021.md, Findings; the runs: experiments/long2021/LOG.md), so the option is off by default.

    Privacy: teacher i's cut is a function of teacher i (trained on its own partition only) and of generated
    samples, so changing one private row still changes one teacher's votes, one per query: the vote histogram's
    sensitivity, and the PATE accounting, are unchanged.

    Args:
        ref_logits: (N, m) each teacher's logits on m generated samples (the samples it was just trained against).
        quantile: in (0, 1).

    Returns:
        (N,) cuts.
    """
    return torch.quantile(ref_logits.float(), quantile, dim=1).to(ref_logits.dtype)


def student_labels(
    votes: torch.Tensor, *, sigma_threshold: float | None, sigma: float | None, threshold: float | None,
    generator: torch.Generator | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The aggregated teacher label of each query: Confident-GNMax, or the plain argmax when ``sigma`` is None
    (non-private runs; every query answered).

    Args:
        votes: (b, 2) vote counts.
        sigma_threshold, sigma, threshold, generator: Confident-GNMax's (all None for the plain argmax).

    Returns:
        ``(answered (b,) bool, label (b,) int64)``, ``label = -1`` where not answered.
    """
    if sigma is None:
        return torch.ones(votes.shape[0], dtype=torch.bool, device=votes.device), torch.argmax(votes, dim=1)
    return confident_gnmax(votes, sigma_threshold=sigma_threshold, sigma=sigma, threshold=threshold,
                           generator=generator)


def student_step(
    student: nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor, labels: torch.Tensor
) -> float:
    """One Adam step of the student on BCE(S(x, y), labels): ``x`` are generated samples only (never private rows),
    ``labels`` the teachers' aggregated answers (1 real, 0 fake). Returns the loss (nan for an empty batch)."""
    if len(x) == 0:
        return math.nan
    loss = F.binary_cross_entropy_with_logits(student(x.detach(), y), labels.to(x.dtype))
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    return float(loss.detach())


def ensemble_generator_loss(ens: TeacherEnsemble, fake: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """G's non-saturating loss against the teacher ensemble itself: ``-log((1/N) sum_i sigmoid(D_i(G(z), y)))``,
    averaged over the batch (the log of the ensemble's mean probability "real", computed in log space).

    The first rung of the PATE-GAN ladder (``method.inf_signal=teachers``, eps=inf only; docs/papers/long2021.md, The
    ladders): G's gradient comes from the teachers' outputs on its samples, with no student and no vote in between.
    That is not DP (each teacher saw its private partition and G sees its gradient), so private runs refuse it.
    """
    logits = ens.forward_shared(fake, y)  # (N, b)
    log_mean = torch.logsumexp(F.logsigmoid(logits), dim=0) - math.log(logits.shape[0])
    return -log_mean.mean()


# ---------------------------------------------------------------------------------------------------------------
# the method


@METHODS.register("pate_gan")
class PATEGAN(Method):
    """PATE-GAN on images and tables (see the module docstring)."""

    accounting_keys = (*PATE_ACCOUNTING_KEYS, "inf_signal")
    tunable_keys = ("lr_g", "lr_s", "lr_d", "beta1", "z_dim", "ngf", "ndf", "student_ndf", "teacher_hidden", "d_hidden",
                    "g_hidden", "s_hidden", "teacher_steps", "student_steps")
    tiny = ("method=pate_gan", "dataset=breast_cancer", *TINY_PATE_GAN, *TABLE_METRICS)

    resume_free_keys = ("checkpoint_every", "teacher_chunk", "steps")  # teacher_chunk: the same votes

    kinds = ("image", "table")
    fitted_attrs = ("G", "device", "proportions", "train_log")
    unreleased_checkpoint_keys = {CHECKPOINT: ("teachers", "opt_teachers")}  # trained without noise

    def __init__(self, cfg: Any, ctx: Any) -> None:
        super().__init__(cfg, ctx)
        self.hp = self._check(cfg, ctx.kind)

    @staticmethod
    def _check(cfg: Any, kind: str) -> dict[str, Any]:
        """Every hyperparameter (ranges checked at compose time by the schema, dpsyn.config.schema.PATEGANSchema);
        the teacher architecture against the data kind."""
        hp = pate_hyperparameters(
            cfg, ints=("teachers", "steps", "batch_size", "z_dim", "ngf", "ndf", "student_ndf", "teacher_steps",
                       "student_steps", "checkpoint_every"),
            floats=("sigma_threshold", "sigma", "lr_g", "lr_s", "lr_d"), hidden=("d_hidden", "g_hidden", "s_hidden"),
        )
        allowed = TABLE_TEACHERS if kind == "table" else IMAGE_TEACHERS
        arch = cfg.get("teacher_arch")
        if arch not in allowed:
            raise ValueError(f"method.teacher_arch={arch!r} for {kind} data; allowed: {', '.join(allowed)}")
        hp["teacher_arch"] = ("mlp" if kind == "table" else "conv") if arch == "auto" else str(arch)
        hp["teacher_hidden"] = int(cfg.get("teacher_hidden"))
        q = cfg.get("vote_quantile")
        hp["vote_quantile"] = None if q is None else float(q)
        hp["inf_signal"] = str(cfg.get("inf_signal"))
        return hp

    # ---- building blocks ----------------------------------------------------------------------------------

    def _make_teacher(self) -> Callable[[], nn.Module]:
        hp, ctx = self.hp, self.ctx
        if hp["teacher_arch"] == "mlp":
            return lambda: CondMLPTeacher(num_classes=ctx.num_classes, shape=ctx.shape, hidden=hp["d_hidden"])
        channels, resolution = ctx.shape[0], ctx.shape[1]
        if hp["teacher_arch"] == "gpate":  # G-PATE's teacher (the authors': conv, conv, fc, the label at every layer)
            return lambda: CondPATETeacher(num_classes=ctx.num_classes, channels=channels, resolution=resolution,
                                           ndf=hp["ndf"], hidden=hp["teacher_hidden"])
        arch = CondConvTeacher if hp["teacher_arch"] == "conv" else CondDCGANDiscriminator
        return lambda: arch(num_classes=ctx.num_classes, channels=channels, resolution=resolution, ndf=hp["ndf"])

    def _make_generator(self) -> nn.Module:
        hp, ctx = self.hp, self.ctx
        if ctx.kind == "table":  # sigmoid output: tables are min-max scaled to [0, 1]
            return CondMLPGenerator(z_dim=hp["z_dim"], num_classes=ctx.num_classes, shape=ctx.shape,
                                    hidden=tuple(hp["g_hidden"]))
        return CondDCGANGenerator(z_dim=hp["z_dim"], num_classes=ctx.num_classes, channels=ctx.shape[0],
                                  resolution=ctx.shape[1], ngf=hp["ngf"])

    def _make_student(self) -> nn.Module:
        hp, ctx = self.hp, self.ctx
        if ctx.kind == "table":
            return CondMLPDiscriminator(num_classes=ctx.num_classes, shape=ctx.shape, hidden=tuple(hp["s_hidden"]))
        return CondDCGANDiscriminator(num_classes=ctx.num_classes, channels=ctx.shape[0], resolution=ctx.shape[1],
                                      ndf=hp["student_ndf"])

    def _fingerprint(self, budget: PrivacyBudget) -> dict[str, Any]:
        """What a checkpoint must share with this run to be resumed (the typed config, :meth:`resume_fingerprint`),
        with the noise in votes."""
        return self.resume_fingerprint(budget, votes={k: self.hp[k] for k in PATE_NOISE_KEYS})

    def _labels(self, n: int, gen: torch.Generator) -> torch.Tensor:
        """Labels of generated samples: uniform (images) or from the released class proportions (tables)."""
        if self.proportions is None:
            return torch.randint(0, self.ctx.num_classes, (n,), generator=gen)
        p = torch.as_tensor(self.proportions, dtype=torch.float64)
        return torch.multinomial(p / p.sum(), n, replacement=True, generator=gen)

    # ---- training -----------------------------------------------------------------------------------------

    def fit(
        self, private: Split, budget: PrivacyBudget, ledger: PrivacyLedger, public: Split | None = None
    ) -> None:
        hp, ctx = self.hp, self.ctx
        device = torch.device(ctx.device)
        n_rows, n_teachers, b = len(private), hp["teachers"], hp["batch_size"]
        if n_rows < n_teachers:
            raise ValueError(f"method.teachers={n_teachers} exceeds the {n_rows} private examples (one row at least "
                             "each): lower method.teachers")
        if budget.private and hp["inf_signal"] != "student":
            raise ValueError(f"method.inf_signal={hp['inf_signal']} trains G on the teachers' own outputs, which are not "
                             f"differentially private: it is a rung of the non-private ladder, for eps=inf only (this "
                             f"run has eps={budget.epsilon}); private runs take method.inf_signal=student")
        torch.manual_seed(ctx.seed)  # initialisation of G, S and the teachers
        gen = torch.Generator().manual_seed(ctx.seed)  # latents, labels (public; fixed shapes)
        # a row's teacher: a keyed hash of its source id (removing a row changes its own partition only)
        parts = KeyedPartitions(source_ids(private, "pate_gan"), n_teachers, key=partition_key(ctx.seed, "teachers"))
        m = parts.nominal_size  # n // N of the declared-public n; the partitions' own sizes vary and are not read
        tb = hp["teacher_batch"] or min(b, m)
        if tb > m:
            raise ValueError(f"method.teacher_batch={tb} exceeds the {m} rows a partition holds on average "
                             f"(n // {n_teachers} teachers)")
        G, S = self._make_generator().to(device), self._make_student().to(device)
        ens = TeacherEnsemble(self._make_teacher(), n_teachers, lr=hp["lr_d"], betas=(hp["beta1"], 0.999),
                              chunk_size=hp["teacher_chunk"], device=device)
        opt_g = torch.optim.Adam(G.parameters(), lr=hp["lr_g"], betas=(hp["beta1"], 0.999))
        opt_s = torch.optim.Adam(S.parameters(), lr=hp["lr_s"], betas=(hp["beta1"], 0.999))
        x_all = torch.from_numpy(np.ascontiguousarray(private.x, dtype=np.float32)).to(device)
        y_all = torch.from_numpy(private.y.astype(np.int64)).to(device)

        dp_gen = (dp_generator(deterministic=ctx.deterministic_noise, seed=ctx.seed, device=str(device))
                  if budget.private else None)
        max_steps = ctx.capped_steps(hp["steps"])
        state = {"G": G, "opt_g": opt_g, "S": S, "opt_s": opt_s, "teachers": ens, "opt_teachers": ens.optimizer,
                 "partitions": parts, "gen": gen, "dp_gen": dp_gen if ctx.deterministic_noise else None}
        # the bar shows what the run may publish: steps, epsilon spent and the answered share (Confident-GNMax outputs)
        with FitSession(ctx, ledger, CHECKPOINT, self._fingerprint(budget), state=state, total=max_steps,
                        desc="pate_gan steps", every=hp["checkpoint_every"]) as s:
            # labels of the generated samples: uniform on images; on tables the Laplace-released class proportions
            self.proportions: np.ndarray | None = None
            rest = budget  # what the PATE queries may spend
            if ctx.kind == "table":  # released once per run directory: a re-run reuses (and charges once) that release
                self.proportions, rest = self.release_class_proportions(private, budget, ledger,
                                                                        hp["class_ratio_epsilon"])
            # the run's Confident-GNMax event (its queries grown each step), restored with the ledger on resume
            if budget.private:
                s.open(lambda: new_pate_event(ledger, hp, label=f"pate_gan student labels ({n_teachers} teachers, "
                                              "2 bins)", max_queries=max_steps * b))
                log_pate_allowance("pate_gan", s.event, rest, per_step=b, unit="steps")
            else:
                s.open(NonPrivateEvent(label="pate_gan trained without noise (eps=inf): plain argmax of the votes"))
            private_run = s.event is not None

            self.train_log: dict[str, Any] = {"stopped_by": "steps", "teacher_batch": tb, "partition_size": m}
            t0 = time.perf_counter()
            s_loss = math.nan
            G.train()
            S.train()
            for step in s.steps():
                y = self._labels(b, gen).to(device)
                z = torch.randn(b, hp["z_dim"], generator=gen).to(device)
                fake = G(z, y)
                # teachers: their own partitions' rows vs the generator's current samples
                teacher_update(ens, parts, x_all, y_all, fake, y, steps=hp["teacher_steps"], batch=tb)
                # queries: fresh generated samples, labelled by the teachers' aggregated votes
                yq = self._labels(b, gen).to(device)
                zq = torch.randn(b, hp["z_dim"], generator=gen).to(device)
                with torch.no_grad():
                    xq = G(zq, yq)
                    cut = None if hp["vote_quantile"] is None else vote_cuts(
                        ens.forward_shared(fake.detach(), y), hp["vote_quantile"])
                    votes = binary_votes(ens.forward_shared(xq, yq), cut)
                # would this step's queries (GNMax charged for all) overspend? then stop: s.stopped_by == "budget"
                if private_run and s.would_exceed(s.event.with_queries(votes, torch.ones(b, dtype=torch.bool))):
                    break
                answered, label = student_labels(
                    votes, generator=dp_gen,
                    sigma_threshold=hp["sigma_threshold"] if private_run else None,
                    sigma=hp["sigma"] if private_run else None,
                    threshold=hp["threshold"] if private_run else None,
                )
                if private_run:
                    s.charge_queries(votes, answered)  # before the answers are used
                # student: only the answered generated samples, with the teachers' labels
                for _ in range(hp["student_steps"]):
                    s_loss = student_step(S, opt_s, xq[answered], yq[answered], label[answered])
                # generator: fool the student (non-saturating loss); the ladder's first rung: fool the teachers
                if hp["inf_signal"] == "teachers":
                    g_loss = ensemble_generator_loss(ens, fake, y)
                else:
                    logits = S(fake, y)
                    g_loss = F.binary_cross_entropy_with_logits(logits, torch.ones_like(logits))
                opt_g.zero_grad(set_to_none=True)
                g_loss.backward(inputs=list(G.parameters()))  # only G's gradients (never into S or the teachers)
                opt_g.step()
                eps_now = ledger.epsilon() if private_run else math.inf  # once a step: for the bar and the log
                s.show(eps=f"{eps_now:.3f}", answered=f"{float(answered.float().mean()):.2f}", **filter_fill(s.event))
                if (step + 1) % 50 == 0 or step == 0:
                    log.info("pate_gan step %d: %d of %d answered, %.3f voted real; S loss %.3f, G loss %.3f; eps %.4f "
                             "(%s)", step + 1, int(answered.sum()), b,
                             float(label[answered].float().mean()) if answered.any() else 0.0, s_loss, g_loss.item(),
                             eps_now, hp["bound"])
        event = s.event
        G.eval()
        self.G, self.device = G, device
        self.train_log.update(stopped_by=s.stopped_by, steps=s.step, fit_s=time.perf_counter() - t0,
                              queries=0 if event is None else event.queries,
                              answered=0 if event is None else event.answered, **filter_record(event))
        log.info("pate_gan: %d steps (stopped by %s), %s", s.step, s.stopped_by,
                 f"{event.queries} queries, {event.answered} answered" if event is not None else "non-private")

    @torch.no_grad()
    def sample(self, n: int, labels: np.ndarray | None = None) -> Samples:
        rng = np.random.default_rng(self.ctx.seed)
        if labels is None:
            if self.proportions is None:
                labels, rule = self.uniform_labels(n, rng), "uniform over classes (public choice)"
            else:
                labels = self.labels_from_proportions(n, self.proportions, rng)
                rule = "drawn from the Laplace-released class proportions"
        else:
            rule = "given"
        x = generate_conditional(self.G, labels, z_dim=self.hp["z_dim"], shape=self.ctx.shape, device=self.device,
                                 generator=torch.Generator().manual_seed(self.ctx.seed + 1))
        prov = {
            "method": "pate_gan",
            "labels": rule,
            "class_proportions": None if self.proportions is None else [float(p) for p in self.proportions],
            "accountant": "confident-gnmax rdp (Papernot et al. 2018; dpsyn.privacy.pate)",
            "bound": self.hp["bound"],
            "teachers": self.hp["teachers"],
            "inf_signal": self.hp["inf_signal"],  # teachers: the non-private ladder's rung 0, not PATE-GAN's student
            **{k: v for k, v in self.train_log.items() if k != "fit_s"},
        }
        return Samples(x, np.asarray(labels, dtype=np.int64), prov)
