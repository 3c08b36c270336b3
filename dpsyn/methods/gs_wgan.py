"""``gs_wgan``: GS-WGAN (Chen, Orekondy & Fritz, NeurIPS 2020), a baseline of paper 002 — a generator trained
through K non-private WGAN-GP critics on disjoint partitions, with only the gradient that flows from the critic
into the generated samples sanitised (per-sample clipping + Gaussian noise).

Algorithm (the authors' ``source/main.py``, with the critics' training put on a public schedule), per generator
iteration t:

1. *Critic training* (``method.critic_schedule=round_robin``, the default): critic ``t mod K`` takes
   ``critic_steps`` Adam steps on the WGAN-GP loss ``mean D(fake) - mean D(real) + lambda GP + drift mean D(real)^2``
   (the authors' "epsilon penalty" 1e-3), its real rows drawn from its own partition only
   (:class:`dpsyn.data.partitions.KeyedPartitions`), its fakes G(z, y_real). No privacy: a critic is never
   released, only the sanitised gradient below is.
2. *Subsampling*: one critic index J is drawn uniformly from K with a DP generator (OS entropy, like DP noise: the
   choice is part of the mechanism and stays secret). With ``method.fresh_steps=f > 0`` a throw-away copy of critic
   J takes f more steps on its partition first (its rows by a stateless keyed order), so the release reads a critic
   fitted to the current G; the copy is dropped.
3. *Generator*: x = G(z, y) (labels uniform, a public choice), loss ``-mean_j D_J(x_j, y_j)``; a hook on x replaces
   the gradient flowing from D_J into x by its sanitised version (:func:`sanitize`): per sample j, the gradient of
   -D_J(x_j) w.r.t. x_j is clipped to L2 norm C and N(0, (sigma C)^2 I) noise is added (noise from
   :func:`dpsyn.privacy.dp_generator`, never from the run seed); the batch mean of those then flows into G. G's own
   parameter gradient is post-processing of the b sanitised per-sample gradients.

**Why the schedule.** The authors train the critic drawn, so critic j's state depends on the secret draws of the
earlier iterations (it trains only when drawn): hidden state, under which a per-iteration subsampling argument does
not compose (a toy model beats Poisson accounting: docs/privacy.md). With the public schedule every critic is a
function of its own partition, the public randomness and the released history only, and the draw of step 2 is fresh
and independent: each iteration is then one Gaussian mechanism applied to one of K units chosen uniformly, and RDP
composes over iterations. ``method.critic_schedule=drawn`` (the authors' loop) is for eps=inf only.

Privacy. dpsyn's neighbours differ by removing or adding one row, which changes one partition (keyed by the rows'
source ids), hence one critic. An iteration releases b sanitised gradients, all read through the critic drawn:
any two critics' b clipped gradients are within 2C sqrt(b) of each other, so the iteration is one Gaussian
mechanism of sensitivity 2C sqrt(b) and noise std sigma C (noise multiplier ``sigma / (2 sqrt(b))``) on one of K
critics drawn uniformly. dpsyn records ONE :class:`~dpsyn.privacy.ledger.UniformChoiceGaussianEvent`
``(noise_multiplier=sigma / (2 sqrt(b)), population=K, steps=iterations, bound=method.bound)`` (:func:`privacy_event`)
and calibrates sigma for it before training (:func:`gs_wgan_sigma`). ``method.bound`` names the per-iteration bound
(:mod:`dpsyn.privacy.uniform_choice`): ``convexity`` (default; a written proof, docs/privacy.md), ``wang2019``
(Wang, Balle & Kasiviswanathan 2019, cited theorem) or ``poisson_argument`` (Opacus's Poisson-subsampled RDP at
rate 1/K; assumed, not proven, for a uniform draw).

**Departure from the authors' analysis** (``evaluation/privacy_analysis.py``: autodp's
``compose_subsampled_mechanism(gaussian(noise_multiplier), 1/K, coeff=iterations * batch_size)``): they compose
``iterations * b`` releases as if each drew its own critic, so each release gets the 1/K amplification on its own
(the first author explains the factor b in DingfanChen/GS-WGAN issue #12: a row reaches every gradient of the batch).
The b releases of an iteration share one draw, and a subsampled composition is not the composition of subsampled
releases: for the authors' MNIST setting (K = 1000, noise_multiplier 1.07, 20000 iterations of 32, delta 1e-5) the
per-release composition gives eps 4.45 under Opacus's RDP accountant, the per-iteration mechanism 366.
:func:`published_analysis_epsilon` computes the former (recorded beside a run's epsilon, never charged); the audit
row ``gs_wgan_iteration`` (``python -m dpsyn.cli.audit``) runs the sanitizer on b releases sharing a draw, and with
sigma calibrated the authors' way its lower bound exceeds their claim (tests/test_audit.py); the row
``gs_wgan_hidden_state`` runs several iterations with critics that keep state.

Warm start (the authors' ``source/pretrain.py``; :func:`warm_start`): before the main run every critic k trains for
``warm_start_iterations`` iterations (``critic_steps`` critic steps, then one generator step) on its own partition
against its own throw-away generator, without noise (authors: 2000 iterations). It is not charged to privacy, as in
the authors' analysis: the critics never leave the method (checkpoints list them as unreleased) and the throw-away
generators are discarded; what leaves is only the sanitised gradient of the main run. The critics' Adam states are
reset afterwards (the authors load the pre-trained weights into fresh optimisers). The latent is
Gaussian (the authors default to a Bernoulli latent) and the generator is :class:`dpsyn.nets.dcgan.CondDCGANGenerator`
(theirs: a ResNet generator).
The critics are :class:`dpsyn.nets.ensemble.CondConvTeacher` (no normalisation layer, which WGAN-GP needs), stored
stacked in a :class:`CriticBank` with their Adam states (K = 1000 small critics take a few tens of MB).
Samples come from an exponential moving average of G (the authors' ``netGS``; ``method.ema``, 0 = G itself).
Non-private runs (eps=inf) add no noise; the per-sample gradient is still clipped unless ``method.clip_at_inf=false``.

Partitions differ in size (a keyed hash: :mod:`dpsyn.data.partitions`); a critic whose partition holds fewer rows
than the batch uses all of them and gives the other slots no weight, so no critic's batch depends on another's rows.

Output low-pass (``method.output_frequencies=m``, a dpsyn departure, off in the authors' setting): G's output is kept
to its m x m lowest 2-D DCT frequencies a channel (:class:`dpsyn.nets.lowpass.LowPassOutput`), and each per-sample
gradient is sanitised in those m^2 coefficients instead of the d pixels (:func:`sanitize` with a basis): the clip and
the sensitivity are the same, the noise keeps m^2 / d of its energy. The basis is fixed and data-independent, so the
mechanism and its accounting are unchanged.
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
from torch.func import functional_call, grad, stack_module_state, vmap
from tqdm.auto import tqdm

from dpsyn.data.base import Split
from dpsyn.data.partitions import KeyedPartitions, partition_key, source_ids
from dpsyn.lit.ema import update_ema
from dpsyn.methods.base import METHODS, Method, PrivacyBudget, Samples, generate_conditional
from dpsyn.methods.session import FitSession
from dpsyn.nets.dcgan import CondDCGANGenerator
from dpsyn.nets.ensemble import CondConvTeacher
from dpsyn.nets.lowpass import LowPassOutput, dct_basis
from dpsyn.privacy import (
    REPLACE_ONE_SENSITIVITY_FACTOR,
    NonPrivateEvent,
    PrivacyLedger,
    dp_generator,
    dpsgd_epsilon,
    gaussian_mechanism,
)
from dpsyn.privacy.ledger import UniformChoiceGaussianEvent
from dpsyn.privacy.uniform_choice import BOUND_BASIS, SAMPLING, uniform_choice_noise_multiplier
from dpsyn.methods.tiny import IMAGE_METRICS, TINY_GS_WGAN

log = logging.getLogger(__name__)

CHECKPOINT = "gs_wgan.pt"
SENSITIVITY_FACTOR = REPLACE_ONE_SENSITIVITY_FACTOR
"""Two clipped per-sample gradients (of two critics that differ in one partition) differ by at most 2C
(:data:`dpsyn.privacy.REPLACE_ONE_SENSITIVITY_FACTOR`)."""
SAMPLING_NOTE = f"sampling: one of K critics drawn uniformly per iteration ({SAMPLING})"
CRITIC_SCHEDULES = {
    "round_robin": "critic t mod K trains at iteration t (a public schedule: no critic depends on the secret draws)",
    "drawn": "the critic drawn trains (the authors' loop; its critics depend on earlier draws: eps=inf only)",
}
_WARM_STREAM, _FRESH_STREAM = 1, 2  # keyed row orders of the warm start and of the fresh steps (stateless)


# ---------------------------------------------------------------------------------------------------------------
# the sanitisation and the privacy calibration, pure functions


def clip_per_sample(grad: torch.Tensor, clip: float) -> torch.Tensor:
    """Each row ``grad[j]`` scaled to L2 norm at most ``clip`` (rows already within it are unchanged)."""
    flat = grad.flatten(1)
    norms = flat.norm(dim=1, keepdim=True)
    coef = (clip / (norms + 1e-12)).clamp(max=1.0)
    return (flat * coef).view_as(grad)


def sanitize(
    grad: torch.Tensor, *, clip: float | None, sigma: float, generator: torch.Generator | None,
    basis: torch.Tensor | None = None,
) -> torch.Tensor:
    """GS-WGAN's gradient sanitisation of per-sample gradients: clip each to L2 norm ``clip``, add N(0, (sigma C)^2).

    Args:
        grad: (b, ...) per-sample gradients (row j: the gradient of D(x_j) w.r.t. x_j).
        clip: C > 0, or None for no clipping (a non-private run only; then ``sigma`` must be 0).
        sigma: noise std in units of C; 0 adds no noise.
        generator: the DP noise generator (:func:`dpsyn.privacy.dp_generator`); required when ``sigma > 0``.
        basis: None, or (d, m) orthonormal columns (:func:`dpsyn.nets.lowpass.dct_basis`), d the size of one row.
            Each row is first written as its m coefficients in the basis; the clip and the noise act on those, and
            the result is mapped back, so every row lies in the basis' span. It is the same Gaussian mechanism on an
            m-vector of norm at most C (sensitivity 2C), so the accounting does not change, while the noise keeps m
            of its d dimensions (``method.output_frequencies``: the generator draws nothing outside the span).

    Returns:
        (b, ...) the sanitised gradients.

    Raises:
        ValueError: noise without a clip bound or without a generator, a negative sigma, or a basis whose rows do
            not match the gradient's.
    """
    if sigma < 0:
        raise ValueError(f"sigma must be >= 0, got {sigma}")
    if sigma > 0 and (clip is None or generator is None):
        raise ValueError("noise needs a clip bound and a DP generator")
    work = grad
    if basis is not None:  # the rows' coefficients in the basis
        work = grad.flatten(1)
        if basis.shape[0] != work.shape[1]:
            raise ValueError(f"a basis of {basis.shape[0]} rows for gradients of {work.shape[1]} entries")
        work = work @ basis
    out = work if clip is None else clip_per_sample(work, clip)
    if sigma > 0:
        out = gaussian_mechanism(out, sigma * clip, generator=generator)
    return out if basis is None else (out @ basis.T).view_as(grad)


def draw_critics(critics: int, n: int, generator: torch.Generator) -> torch.Tensor:
    """``n`` critic indices drawn uniformly from ``critics`` with the DP ``generator``: an iteration's draw (n = 1),
    the subsampling its releases share; the audit row ``gs_wgan_iteration`` draws its trials with it."""
    return torch.randint(critics, (n,), generator=generator)


def trained_critic(iteration: int, critics: int, drawn: Any, schedule: str) -> Any:
    """The critic that trains (and keeps its update) at ``iteration``: ``iteration mod K`` under the public
    ``round_robin`` schedule, whatever was drawn; the critic ``drawn`` under the authors' ``drawn`` loop (then every
    critic's state depends on the secret draws: eps=inf only). ``drawn`` may be an int or a tensor of draws (the audit
    row ``gs_wgan_hidden_state`` runs it on many trials at once)."""
    if schedule == "round_robin":
        return iteration % critics
    if schedule == "drawn":
        return drawn
    raise ValueError(f"unknown critic schedule {schedule!r}; allowed: {', '.join(CRITIC_SCHEDULES)}")


def iteration_noise_multiplier(sigma: float, batch_size: int) -> float:
    """The noise multiplier of one iteration: b releases of noise std sigma C, all read through the critic drawn, so
    of joint L2 sensitivity 2C sqrt(b): ``sigma / (2 sqrt(b))``."""
    return sigma / (SENSITIVITY_FACTOR * math.sqrt(batch_size))


def gs_wgan_sigma(
    *, epsilon: float, delta: float, critics: int, iterations: int, batch_size: int, bound: str = "convexity"
) -> float:
    """Noise std ``sigma`` (in units of C) that keeps ``iterations`` generator iterations within (epsilon, delta).

    Each iteration is one Gaussian mechanism of sensitivity 2C sqrt(b) (its b releases share the critic drawn) on
    one of ``critics`` critics drawn uniformly: ``sigma = 2 sqrt(b) * nm`` with ``nm`` the smallest noise multiplier
    that ``bound`` (:mod:`dpsyn.privacy.uniform_choice`) keeps within budget for ``iterations`` steps, the inverse of
    :func:`iteration_noise_multiplier`. Larger than the authors' analysis gives (module docstring).
    """
    nm = uniform_choice_noise_multiplier(epsilon=epsilon, delta=delta, population=critics, steps=iterations,
                                         bound=bound)
    return nm * SENSITIVITY_FACTOR * math.sqrt(batch_size)


def privacy_event(*, sigma: float, critics: int, batch_size: int, iterations: int, bound: str,
                  label: str) -> UniformChoiceGaussianEvent:
    """What a run charges for ``iterations`` iterations: ONE uniform-choice Gaussian event, noise multiplier
    :func:`iteration_noise_multiplier`, K = critics, a step per iteration (grown as the run goes)."""
    return UniformChoiceGaussianEvent(noise_multiplier=iteration_noise_multiplier(sigma, batch_size),
                                      population=critics, steps=iterations, bound=bound, label=label)


def published_analysis_epsilon(*, sigma: float, critics: int, batch_size: int, iterations: int, delta: float,
                               accountant: str) -> float:
    """The epsilon the GS-WGAN authors' analysis would state for this noise: ``iterations * batch_size`` releases of
    noise multiplier sigma / 2, each subsampled at rate 1/critics on its own. NOT a privacy bound (the releases of an
    iteration share one critic draw; module docstring): recorded beside a run's true epsilon to compare with
    published numbers, never charged."""
    return dpsgd_epsilon(noise_multiplier=sigma / SENSITIVITY_FACTOR, sample_rate=1.0 / critics,
                         steps=iterations * batch_size, delta=delta, accountant=accountant)


def generator_step(
    G: nn.Module, critic: nn.Module, *, z: torch.Tensor, y: torch.Tensor, clip: float | None, sigma: float,
    generator: torch.Generator | None, basis: torch.Tensor | None = None,
) -> torch.Tensor:
    """Forward x = G(z, y), backward ``-mean_j critic(x_j, y_j)`` with the gradient into x sanitised: fills G's
    ``.grad`` (accumulating, as ``backward`` does); the critic's parameters get no gradient. With ``basis`` the
    sanitisation acts in the basis' coefficients (:func:`sanitize`).

    The hook sees the gradient of the batch-mean loss, -(1/b) dD(x_j)/dx_j per row; it sanitises the per-sample
    gradient -dD(x_j)/dx_j of the loss -D(x_j) (:func:`sanitize`) and passes on its batch mean, 1/b of it (the
    authors clip the batch-mean gradient at C/b instead: the same).

    Returns:
        (b, ...) the sanitised per-sample gradients (before the 1/b of the mean): what was released.
    """
    for p in critic.parameters():
        p.requires_grad_(False)
    x = G(z, y)
    b = x.shape[0]
    released: list[torch.Tensor] = []

    def hook(g: torch.Tensor) -> torch.Tensor:
        out = sanitize(g * b, clip=clip, sigma=sigma, generator=generator, basis=basis)
        released.append(out.detach())
        return out / b

    x.register_hook(hook)
    loss = -critic(x, y).mean()
    loss.backward()
    return released[0]


# ---------------------------------------------------------------------------------------------------------------
# K critics stored as stacked tensors


class CriticBank:
    """K critics of one architecture as stacked tensors (leading dim K) with their own Adam states.

    Only one critic trains at a time: :meth:`checkout` loads critic k into one module and a fresh ``torch.optim.Adam``
    carrying k's moments and step count, :meth:`checkin` writes both back. K independent Adams, each stepping only on
    its own turns (unlike :class:`dpsyn.nets.ensemble.TeacherEnsemble`, whose one Adam steps every teacher together).

    Args:
        make_module: builds one critic (called K times, from torch's global RNG: seed it first).
        critics: K >= 1.
        lr, betas: each critic's Adam.
        device: where the stacked tensors and the working module live.
    """

    def __init__(self, make_module: Callable[[], nn.Module], critics: int, *, lr: float,
                 betas: tuple[float, float], device: torch.device | str = "cpu") -> None:
        if critics < 1:
            raise ValueError(f"critics must be >= 1, got {critics}")
        self.k, self.lr, self.betas = int(critics), float(lr), (float(betas[0]), float(betas[1]))
        mods = [make_module() for _ in range(self.k)]
        params, buffers = stack_module_state(mods)
        self.names = [n for n, _ in mods[0].named_parameters()]
        self.params = {n: params[n].detach().to(device) for n in self.names}
        self.buffers = {n: t.detach().to(device) for n, t in buffers.items()}
        self.exp_avg = {n: torch.zeros_like(p) for n, p in self.params.items()}
        self.exp_avg_sq = {n: torch.zeros_like(p) for n, p in self.params.items()}
        self.steps = torch.zeros(self.k, dtype=torch.float32)
        self.module = mods[0].to(device)  # the working copy: holds the checked-out critic
        del mods

    def _check(self, k: int) -> int:
        if not 0 <= k < self.k:
            raise IndexError(f"critic {k} of {self.k}")
        return int(k)

    def checkout(self, k: int) -> tuple[nn.Module, torch.optim.Optimizer]:
        """Critic k as a module (trainable) and its Adam, restored to k's moments and step count."""
        k = self._check(k)
        with torch.no_grad():
            for name, p in self.module.named_parameters():
                p.copy_(self.params[name][k])
                p.requires_grad_(True)
            for name, b in self.module.named_buffers():
                b.copy_(self.buffers[name][k])
        opt = torch.optim.Adam(self.module.parameters(), lr=self.lr, betas=self.betas)
        if self.steps[k] > 0:
            state = opt.state_dict()
            state["state"] = {
                i: {"step": self.steps[k].clone(), "exp_avg": self.exp_avg[n][k].clone(),
                    "exp_avg_sq": self.exp_avg_sq[n][k].clone()}
                for i, n in enumerate(self.names)
            }
            opt.load_state_dict(state)
        return self.module, opt

    def checkin(self, k: int, opt: torch.optim.Optimizer) -> None:
        """Write the working module's weights and ``opt``'s Adam state back as critic k."""
        k = self._check(k)
        with torch.no_grad():
            for name, p in self.module.named_parameters():
                self.params[name][k].copy_(p)
                st = opt.state.get(p)
                if st:
                    self.exp_avg[name][k].copy_(st["exp_avg"])
                    self.exp_avg_sq[name][k].copy_(st["exp_avg_sq"])
                    step = st["step"]
                    self.steps[k] = float(step.item() if torch.is_tensor(step) else step)
            for name, b in self.module.named_buffers():
                self.buffers[name][k].copy_(b)

    def flat(self, k: int) -> torch.Tensor:
        """Critic k's parameters, flattened (tests, diagnostics)."""
        k = self._check(k)
        return torch.cat([self.params[n][k].flatten() for n in self.names])

    def state_dict(self) -> dict[str, Any]:
        return {"params": self.params, "buffers": self.buffers, "exp_avg": self.exp_avg,
                "exp_avg_sq": self.exp_avg_sq, "steps": self.steps}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for key in ("params", "buffers", "exp_avg", "exp_avg_sq"):
            mine = getattr(self, key)
            for name, t in mine.items():
                if tuple(state[key][name].shape) != tuple(t.shape):
                    got = tuple(state[key][name].shape)
                    raise ValueError(f"critic bank {key}.{name}: shape {got} != {tuple(t.shape)}")
                t.copy_(state[key][name])
        self.steps = state["steps"].clone().float()


def _autograd_input_grad(f: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    """grad_x sum f(x), kept in the graph (create_graph) so that the penalty on it trains the critic."""
    x = x.requires_grad_(True)
    (g,) = torch.autograd.grad(f(x).sum(), x, create_graph=True)
    return g


def gradient_penalty(
    critic: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], real: torch.Tensor, fake: torch.Tensor,
    y: torch.Tensor, alpha: torch.Tensor,
    input_grad: Callable[[Callable[[torch.Tensor], torch.Tensor], torch.Tensor], torch.Tensor] = _autograd_input_grad,
    weight: torch.Tensor | None = None,
) -> torch.Tensor:
    """WGAN-GP's penalty: mean_j (||grad_x D(x_hat_j, y_j)|| - 1)^2 at x_hat = alpha real + (1 - alpha) fake.
    ``input_grad`` computes the gradient: autograd for a module, ``torch.func.grad`` under the warm start's vmap.
    ``weight`` (b,): a weighted mean instead (:func:`_wmean`)."""
    a = alpha.view(-1, *([1] * (real.dim() - 1)))
    g = input_grad(lambda xh: critic(xh, y), a * real + (1 - a) * fake)
    return _wmean((g.flatten(1).norm(dim=1) - 1) ** 2, weight)


def _wmean(v: torch.Tensor, weight: torch.Tensor | None) -> torch.Tensor:
    """The mean of ``v`` (b,), or its mean over the slots of weight 1 (a 0/1 ``weight``; 0 when there are none):
    masked slots of a small partition's batch contribute exactly nothing."""
    if weight is None:
        return v.mean()
    return torch.where(weight > 0, v, torch.zeros((), dtype=v.dtype)).sum() / weight.sum().clamp(min=1.0)


def critic_loss(
    critic: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], real: torch.Tensor, fake: torch.Tensor,
    y: torch.Tensor, alpha: torch.Tensor, *, gp_weight: float, drift: float,
    input_grad: Callable[[Callable[[torch.Tensor], torch.Tensor], torch.Tensor], torch.Tensor] = _autograd_input_grad,
    weight: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One critic's WGAN-GP loss ``mean D(fake) - mean D(real) + gp_weight penalty + drift mean D(real)^2``, with
    ``D(real)`` and ``D(fake)``; the main loop and both warm starts (one module, or stacked under vmap) use it.
    ``weight`` (b,) 0/1: every mean over the slots of weight 1 only (a partition smaller than the batch)."""
    d_real, d_fake = critic(real, y), critic(fake, y)
    loss = (_wmean(d_fake, weight) - _wmean(d_real, weight)
            + gp_weight * gradient_penalty(critic, real, fake, y, alpha, input_grad, weight))
    return loss + drift * _wmean(d_real**2, weight), d_real, d_fake


def _critic_noise(g: torch.Generator, *, batch: int, z_dim: int, num_classes: int
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One critic step's public draws, of fixed shapes: latents, the penalty's mixing weights, and labels for the
    masked slots (so that no draw depends on a partition's size)."""
    return (torch.randn(batch, z_dim, generator=g), torch.rand(batch, generator=g),
            torch.randint(0, num_classes, (batch,), generator=g))


def _real_batch(x: torch.Tensor, y: torch.Tensor, rows: torch.Tensor, mask: torch.Tensor, fill: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Real images, labels and 0/1 weights of a critic's batch slots (:meth:`KeyedPartitions.batch`): masked slots
    hold a zero image and a public label ``fill``, so nothing in them comes from another partition's rows."""
    m = mask.to(x.device)
    real = torch.where(m.view(-1, *([1] * (x.dim() - 1))), x[rows.to(x.device)], 0.0)
    return real, torch.where(m, y[rows.to(x.device)], fill.to(x.device)), m.to(x.dtype)


def critic_steps_on(
    critic: nn.Module, opt: torch.optim.Optimizer, *, x: torch.Tensor, y: torch.Tensor,
    batches: list[tuple[torch.Tensor, torch.Tensor]], G: nn.Module, z_dim: int, num_classes: int, gp_weight: float,
    drift: float, generator: torch.Generator,
) -> float:
    """One Adam step of ``critic`` on WGAN-GP per ``(rows, mask)`` of ``batches`` (its own partition's rows, from
    :meth:`KeyedPartitions.batch`); returns the Wasserstein estimate ``mean D(real) - mean D(fake)`` of the last."""
    w = math.nan
    for rows, mask in batches:
        z, alpha, fill = (t.to(x.device) for t in _critic_noise(generator, batch=len(rows), z_dim=z_dim,
                                                               num_classes=num_classes))
        real, ry, weight = _real_batch(x, y, rows, mask, fill)
        with torch.no_grad():
            fake = G(z, ry)
        loss, d_real, d_fake = critic_loss(critic, real, fake, ry, alpha, gp_weight=gp_weight, drift=drift,
                                           weight=weight)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        w = float((_wmean(d_real, weight) - _wmean(d_fake, weight)).detach())
    return w


def _warm_streams(generator: torch.Generator, k: int) -> list[int]:
    """One seed per critic, drawn once from the run-seed ``generator``: critic k's throw-away generator, latents and
    mixing weights come from its own stream, so they are the same whichever critics warm up beside it."""
    return [int(s) for s in torch.randint(0, 2**62, (k,), generator=generator)]


def _seeded(make: Callable[[], nn.Module], seed: int) -> nn.Module:
    """``make()`` with torch's global RNG at ``seed``, restored afterwards."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return make()


def _warm_batches(parts: KeyedPartitions, critics: list[int], *, iteration: int, steps: int, batch: int
                  ) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The warm start's real batches of ``critics`` at one iteration, one ``(rows (m, batch), mask)`` per critic
    step: a stateless keyed order of each critic's own partition (:meth:`KeyedPartitions.batch`, stream 1)."""
    return [parts.batch(critics, batch, stream=_WARM_STREAM, calls=[iteration * steps + s] * len(critics))
            for s in range(steps)]


def _warm_draws(g: torch.Generator, *, steps: int, batch: int, z_dim: int, num_classes: int
                ) -> tuple[list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]], torch.Tensor, torch.Tensor]:
    """One warm-start iteration's public draws from a critic's own stream, in :func:`critic_steps_on`'s order: per
    critic step the latents, mixing weights and fill labels; then the throw-away generator's latents and labels."""
    steps_ = [_critic_noise(g, batch=batch, z_dim=z_dim, num_classes=num_classes) for _ in range(steps)]
    return steps_, torch.randn(batch, z_dim, generator=g), torch.randint(0, num_classes, (batch,), generator=g)


def warm_start(
    bank: CriticBank, parts: KeyedPartitions, *, x: torch.Tensor, y: torch.Tensor,
    make_generator: Callable[[], nn.Module], iterations: int, critic_steps: int, batch: int, z_dim: int,
    num_classes: int, gp_weight: float, drift: float, lr_g: float, betas: tuple[float, float],
    generator: torch.Generator, chunk: int = 1, progress: bool | None = None,
) -> None:
    """The authors' warm start (``source/pretrain.py``): every critic k trains ``iterations`` iterations of WGAN-GP
    (``critic_steps`` critic steps on partition k, then one Adam step of its own throw-away generator, made by
    ``make_generator`` and discarded), without noise. Afterwards every critic's Adam state is reset.

    ``chunk`` critics warm up together: with ``chunk`` > 1 the critics and their throw-away generators are stacked
    and each step runs as one ``torch.func.vmap`` call (:func:`_warm_start_stacked`), which computes for every critic
    exactly what its own loop computes (tested); it pays where a step is too small to fill the device (a GPU). Each
    critic draws from its own stream (:func:`_warm_streams`) and reads its rows in a keyed order of its own partition
    (:func:`_warm_batches`), so the result does not depend on ``chunk`` nor on any other partition.

    Nothing here is released: the critics stay in ``bank`` (never published) and the throw-away generators are
    dropped, so no ledger entry is made (the privacy cost is in the sanitised gradients of the main run only).
    Critic k reads partition k only, and no generator is shared, so a row still reaches one critic (tested).
    """
    if chunk < 1:
        raise ValueError(f"warm-start chunk must be >= 1, got {chunk}")
    seeds = _warm_streams(generator, bank.k)
    bar = tqdm(total=bank.k, desc="gs_wgan warm start (critics)", leave=False, disable=progress)
    kw = dict(x=x, y=y, make_generator=make_generator, iterations=iterations, critic_steps=critic_steps, batch=batch,
              z_dim=z_dim, num_classes=num_classes, gp_weight=gp_weight, drift=drift, lr_g=lr_g, betas=betas)
    for s in range(0, bank.k, chunk):
        e = min(s + chunk, bank.k)
        if e - s == 1:
            _warm_start_one(bank, s, parts, seed=seeds[s], **kw)
        else:
            _warm_start_stacked(bank, s, e, parts, seeds=seeds[s:e], **kw)
        bar.update(e - s)
    bar.close()
    for t in (*bank.exp_avg.values(), *bank.exp_avg_sq.values()):
        t.zero_()
    bank.steps.zero_()


def _warm_start_one(
    bank: CriticBank, k: int, parts: KeyedPartitions, *, seed: int, x: torch.Tensor, y: torch.Tensor,
    make_generator: Callable[[], nn.Module], iterations: int, critic_steps: int, batch: int, z_dim: int,
    num_classes: int, gp_weight: float, drift: float, lr_g: float, betas: tuple[float, float],
) -> None:
    """Critic k's warm start, one module at a time (the authors' loop)."""
    g = torch.Generator().manual_seed(seed)
    G_k = _seeded(make_generator, seed).to(x.device)
    opt_g = torch.optim.Adam(G_k.parameters(), lr=lr_g, betas=betas)
    critic, opt = bank.checkout(k)
    for i in range(iterations):
        batches = [(r[0], m[0]) for r, m in _warm_batches(parts, [k], iteration=i, steps=critic_steps, batch=batch)]
        critic_steps_on(critic, opt, x=x, y=y, batches=batches, G=G_k, z_dim=z_dim, num_classes=num_classes,
                        gp_weight=gp_weight, drift=drift, generator=g)
        z = torch.randn(batch, z_dim, generator=g).to(x.device)
        yz = torch.randint(0, num_classes, (batch,), generator=g).to(x.device)
        loss = -critic(G_k(z, yz), yz).mean()
        grads = torch.autograd.grad(loss, list(G_k.parameters()))  # the critic's own parameters untouched
        for p, gr in zip(G_k.parameters(), grads):
            p.grad = gr
        opt_g.step()
    bank.checkin(k, opt)


def _warm_start_stacked(
    bank: CriticBank, s: int, e: int, parts: KeyedPartitions, *, seeds: list[int], x: torch.Tensor, y: torch.Tensor,
    make_generator: Callable[[], nn.Module], iterations: int, critic_steps: int, batch: int, z_dim: int,
    num_classes: int, gp_weight: float, drift: float, lr_g: float, betas: tuple[float, float],
) -> None:
    """Critics s..e-1 warmed up together: their parameters and their throw-away generators' are stacked (leading
    dim e - s) and every step is one ``vmap`` of the per-critic loss, so critic k's gradient is that of its own loss
    on its own rows and fakes. One Adam over stacked tensors is e - s independent Adams (elementwise, all stepping
    together, as each critic's own loop does)."""
    device = x.device
    streams = [torch.Generator().manual_seed(seed) for seed in seeds]
    gens = [_seeded(make_generator, seed).to(device) for seed in seeds]
    g_params, g_buffers = stack_module_state(gens)  # leaves requiring grad; BatchNorm statistics stacked too
    g_base = copy.deepcopy(gens[0]).to("meta")
    c_base = copy.deepcopy(bank.module).to("meta")
    c_params = {n: bank.params[n][s:e].clone().requires_grad_(True) for n in bank.names}
    c_buffers = {n: t[s:e].clone() for n, t in bank.buffers.items()}
    del gens
    opt_c = torch.optim.Adam(list(c_params.values()), lr=bank.lr, betas=bank.betas)
    opt_g = torch.optim.Adam(list(g_params.values()), lr=lr_g, betas=betas)

    def D(p: dict, b: dict, xs: torch.Tensor, ys: torch.Tensor) -> torch.Tensor:
        return functional_call(c_base, (p, b), (xs, ys))

    def G(p: dict, b: dict, zs: torch.Tensor, ys: torch.Tensor) -> torch.Tensor:
        return functional_call(g_base, (p, b), (zs, ys))

    def func_input_grad(f: Callable[[torch.Tensor], torch.Tensor], xh: torch.Tensor) -> torch.Tensor:
        return grad(lambda xx: f(xx).sum())(xh)  # autograd.grad cannot run under vmap

    def stacked_loss(p: dict, b: dict, real: torch.Tensor, fake: torch.Tensor, ys: torch.Tensor,
                     alpha: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return critic_loss(lambda xs, yy: D(p, b, xs, yy), real, fake, ys, alpha, gp_weight=gp_weight, drift=drift,
                           input_grad=func_input_grad, weight=weight)[0]

    def generator_loss(gp: dict, gb: dict, p: dict, b: dict, zs: torch.Tensor, ys: torch.Tensor) -> torch.Tensor:
        return -D(p, b, G(gp, gb, zs, ys), ys).mean()

    critic_grads = vmap(grad(stacked_loss))
    generator_grads = vmap(grad(generator_loss))
    fakes = vmap(G)
    critics = list(range(s, e))
    for i in range(iterations):
        draws = [_warm_draws(g, steps=critic_steps, batch=batch, z_dim=z_dim, num_classes=num_classes)
                 for g in streams]
        for step, (rows, mask) in enumerate(_warm_batches(parts, critics, iteration=i, steps=critic_steps,
                                                          batch=batch)):
            z = torch.stack([d[0][step][0] for d in draws]).to(device)
            alpha = torch.stack([d[0][step][1] for d in draws]).to(device)
            fill = torch.stack([d[0][step][2] for d in draws]).to(device)
            m = mask.to(device)
            real = torch.where(m.view(*m.shape, *([1] * (x.dim() - 1))), x[rows.to(device)], 0.0)
            ry = torch.where(m, y[rows.to(device)], fill)
            with torch.no_grad():
                fake = fakes(g_params, g_buffers, z, ry)
            grads = critic_grads({n: p.detach() for n, p in c_params.items()}, c_buffers, real, fake, ry, alpha,
                                 m.to(x.dtype))
            for n, p in c_params.items():
                p.grad = grads[n]
            opt_c.step()
        z = torch.stack([d[1] for d in draws]).to(device)
        yz = torch.stack([d[2] for d in draws]).to(device)
        grads = generator_grads({n: p.detach() for n, p in g_params.items()}, g_buffers,
                                {n: p.detach() for n, p in c_params.items()}, c_buffers, z, yz)
        for n, p in g_params.items():
            p.grad = grads[n]
        opt_g.step()
    with torch.no_grad():
        for n in bank.names:
            bank.params[n][s:e].copy_(c_params[n])
        for n, t in bank.buffers.items():
            t[s:e].copy_(c_buffers[n])


def critic_turn(
    bank: CriticBank, k: int, *, x: torch.Tensor, y: torch.Tensor, batches: list[tuple[torch.Tensor, torch.Tensor]],
    G: nn.Module, z_dim: int, num_classes: int, gp_weight: float, drift: float, generator: torch.Generator,
    keep: bool = True,
) -> tuple[nn.Module, float]:
    """Critic k's turn: one Adam step on WGAN-GP per ``(rows, mask)`` of ``batches``, rows of its partition only.

    Args:
        bank: the critics; critic k is checked out, trained and, with ``keep``, checked back in.
        x, y: all private rows and labels (on the bank's device); only ``x[rows]`` is read.
        batches: ``(rows (b,), mask (b,))`` per step (:meth:`KeyedPartitions.batch`: critic k's rows only).
        G: the generator (fakes G(z, y_real), no gradient into G).
        z_dim, num_classes: latent size and classes (labels of masked slots).
        gp_weight, drift: lambda of the gradient penalty, weight of ``mean D(real)^2``.
        generator: run-seed generator (latents, GP mixing weights, fill labels: fixed shapes).
        keep: False for a throw-away copy (``method.fresh_steps``): the bank keeps critic k as it was.

    Returns:
        ``(critic module holding k's new weights, Wasserstein estimate mean D(real) - mean D(fake) of the last step)``.
    """
    critic, opt = bank.checkout(k)
    w = critic_steps_on(critic, opt, x=x, y=y, batches=batches, G=G, z_dim=z_dim, num_classes=num_classes,
                        gp_weight=gp_weight, drift=drift, generator=generator)
    if keep:
        bank.checkin(k, opt)
    return critic, w


# ---------------------------------------------------------------------------------------------------------------
# the method


@METHODS.register("gs_wgan")
class GSWGAN(Method):
    """GS-WGAN on images (see the module docstring)."""

    # one uniform-choice Gaussian event: noise std in units of the clip C, K critics, iterations x b releases
    accounting_keys = ("critics", "iterations", "batch_size", "bound", "critic_schedule")
    tunable_keys = ("lr_g", "lr_d", "beta1", "beta2", "z_dim", "ngf", "ndf", "gp_weight", "drift", "ema", "clip", "critic_steps",
                    "warm_start_iterations")
    tiny = ("method=gs_wgan", "dataset=fmnist", *TINY_GS_WGAN, *IMAGE_METRICS)

    kinds = ("image",)
    fitted_attrs = ("G", "device", "train_log")
    unreleased_checkpoint_keys = {CHECKPOINT: ("critics",)}  # trained on private partitions without noise
    resume_free_keys = ("checkpoint_every", "warm_start_chunk")  # warm_start_chunk: the same critics, another speed

    def __init__(self, cfg: Any, ctx: Any) -> None:
        super().__init__(cfg, ctx)
        self.hp = self._check(cfg)

    @staticmethod
    def _check(cfg: Any) -> dict[str, Any]:
        """Every hyperparameter (checked at compose time by the schema, dpsyn.config.schema.GSWGANSchema)."""
        hp: dict[str, Any] = {}
        for key in ("critics", "iterations", "batch_size", "critic_steps", "z_dim", "ngf", "ndf", "checkpoint_every",
                    "warm_start_iterations", "warm_start_chunk", "fresh_steps"):
            hp[key] = int(cfg.get(key))
        for key in ("clip", "gp_weight", "lr_g", "lr_d", "beta1", "beta2", "ema", "drift"):
            hp[key] = float(cfg.get(key))
        hp["clip_at_inf"] = bool(cfg.get("clip_at_inf"))
        hp["bound"] = str(cfg.get("bound"))
        hp["critic_schedule"] = str(cfg.get("critic_schedule"))
        m = cfg.get("output_frequencies")
        hp["output_frequencies"] = None if m is None else int(m)
        return hp

    def _fingerprint(self, budget: PrivacyBudget, iterations: int, sigma: float) -> dict[str, Any]:
        """What a checkpoint must share with this run to be resumed (the typed config, :meth:`resume_fingerprint`),
        with the iterations run (capped by the trainer) and the sigma calibrated for them."""
        return self.resume_fingerprint(budget, iterations=iterations, sigma=sigma)

    def _make_generator(self) -> nn.Module:
        """A fresh generator of the run's shape: the main G (its EMA is released) and each critic's throw-away
        warm-start generator; ``snapshot_eval.py`` rebuilds checkpoints with it."""
        hp, ctx = self.hp, self.ctx
        g = CondDCGANGenerator(z_dim=hp["z_dim"], num_classes=ctx.num_classes, channels=ctx.shape[0],
                               resolution=ctx.shape[1], ngf=hp["ngf"])
        if hp["output_frequencies"] is None:
            return g
        return LowPassOutput(g, dct_basis(ctx.shape, hp["output_frequencies"]))

    def fit(
        self, private: Split, budget: PrivacyBudget, ledger: PrivacyLedger, public: Split | None = None
    ) -> None:
        hp, ctx = self.hp, self.ctx
        device = torch.device(ctx.device)
        n_rows, K, b = len(private), hp["critics"], hp["batch_size"]
        if n_rows < K:
            raise ValueError(f"method.critics={K} exceeds the {n_rows} private examples (one row at least each)")
        if budget.private and hp["critic_schedule"] != "round_robin":
            raise ValueError(f"method.critic_schedule={hp['critic_schedule']} trains the critic drawn, so every critic "
                             f"depends on the secret draws of earlier iterations, which no bound here covers: it is "
                             f"the authors' loop, for eps=inf only (this run has eps={budget.epsilon}); private runs "
                             f"take method.critic_schedule=round_robin")
        iterations = ctx.capped_steps(hp["iterations"])
        if budget.private:
            sigma = gs_wgan_sigma(epsilon=budget.epsilon, delta=budget.delta, critics=K, iterations=iterations,
                                  batch_size=b, bound=hp["bound"])
            clip: float | None = hp["clip"]
            log.info("gs_wgan: sigma %.4f C a release (noise multiplier %.4f an iteration of %d releases, sensitivity "
                     "2C sqrt(b)) for %d iterations, one of %d critics drawn uniformly (%s bound: %s; eps=%g, "
                     "delta=%g)", sigma, iteration_noise_multiplier(sigma, b), b, iterations, K, hp["bound"],
                     BOUND_BASIS[hp["bound"]], budget.epsilon, budget.delta)
        else:
            sigma, clip = 0.0, (hp["clip"] if hp["clip_at_inf"] else None)

        torch.manual_seed(ctx.seed)  # initialisation of G and of the critics
        gen = torch.Generator().manual_seed(ctx.seed)  # latents, labels, warm-start streams (public; fixed shapes)
        # a row's critic: a keyed hash of its source id (removing a row changes its own partition only)
        parts = KeyedPartitions(source_ids(private, "gs_wgan"), K, key=partition_key(ctx.seed, "critics"))
        critic_batch = b
        channels, resolution = ctx.shape[0], ctx.shape[1]
        make_generator = self._make_generator  # the main G, and each critic's throw-away warm-start generator
        G = make_generator().to(device)
        G_ema = copy.deepcopy(G)
        bank = CriticBank(
            lambda: CondConvTeacher(num_classes=ctx.num_classes, channels=channels, resolution=resolution,
                                    ndf=hp["ndf"]),
            K, lr=hp["lr_d"], betas=(hp["beta1"], hp["beta2"]), device=device,
        )
        opt_g = torch.optim.Adam(G.parameters(), lr=hp["lr_g"], betas=(hp["beta1"], hp["beta2"]))
        # output_frequencies: G draws only in its band, so the gradient is sanitised in the band's coefficients
        basis = G.basis if isinstance(G, LowPassOutput) else None
        x_all = torch.from_numpy(np.ascontiguousarray(private.x, dtype=np.float32)).to(device)
        y_all = torch.from_numpy(private.y.astype(np.int64)).to(device)
        if budget.private:
            # the critic choice is the subsampling of the mechanism: drawn like DP noise, not from the run seed
            picker = dp_generator(deterministic=ctx.deterministic_noise, seed=ctx.seed + 1)
            dp_gen = dp_generator(deterministic=ctx.deterministic_noise, seed=ctx.seed, device=str(device))
        else:
            picker, dp_gen = torch.Generator().manual_seed(ctx.seed + 1), None

        keep = ctx.deterministic_noise or not budget.private  # the DP generators' states are secret otherwise
        state = {"G": G, "G_ema": G_ema, "opt_g": opt_g, "critics": bank, "partitions": parts, "gen": gen,
                 "picker": picker if keep else None, "dp_gen": dp_gen if ctx.deterministic_noise else None}
        # under DP the bar shows iterations and the epsilon spent only (never the critic drawn nor its W estimate)
        with FitSession(ctx, ledger, CHECKPOINT, self._fingerprint(budget, iterations, sigma), state=state,
                        total=iterations, desc="gs_wgan iterations", every=hp["checkpoint_every"]) as s:
            # one event, added before the first release and grown before each one: a crash leaves it complete
            if budget.private:
                m = hp["output_frequencies"]
                band = "" if m is None else f", in the {m}x{m} lowest DCT frequencies a channel"
                s.open(lambda: privacy_event(
                    sigma=sigma, critics=K, batch_size=b, iterations=0, bound=hp["bound"],
                    label=f"gs_wgan sanitised generator gradients ({b} a step through the critic drawn: "
                          f"clip {hp['clip']:g}, noise std {sigma:.4g} C each, sensitivity 2C sqrt({b}) a step, "
                          f"{K} critics{band}; {SAMPLING_NOTE}; critics trained {hp['critic_schedule']})",
                ))
            else:
                s.open(NonPrivateEvent(label="gs_wgan trained without noise (eps=inf)"))
            private_run = s.event is not None

            self.train_log: dict[str, Any] = {"partition_size": parts.nominal_size, "critic_batch": critic_batch,
                                              "critic_schedule": hp["critic_schedule"],
                                              "fresh_steps": hp["fresh_steps"]}
            t0 = time.perf_counter()
            warm = ctx.capped_steps(hp["warm_start_iterations"]) if hp["warm_start_iterations"] else 0
            if not s.resumed and warm:
                log.info("gs_wgan warm start: %d critics x %d non-private iterations on their own partitions "
                         "(not released, not charged)", K, warm)
                warm_start(bank, parts, x=x_all, y=y_all, iterations=warm, critic_steps=hp["critic_steps"],
                           batch=critic_batch, z_dim=hp["z_dim"], num_classes=ctx.num_classes,
                           gp_weight=hp["gp_weight"], drift=hp["drift"], lr_g=hp["lr_g"],
                           betas=(hp["beta1"], hp["beta2"]), generator=gen, make_generator=make_generator,
                           chunk=hp["warm_start_chunk"])
                self.train_log["warm_start_s"] = time.perf_counter() - t0
                s.save()  # the warm start is not repeated after a crash
            self.train_log["warm_start_iterations"] = warm
            w = math.nan
            kw = dict(x=x_all, y=y_all, G=G, z_dim=hp["z_dim"], num_classes=ctx.num_classes,
                      gp_weight=hp["gp_weight"], drift=hp["drift"], generator=gen)
            G.train()
            # sigma is calibrated for `iterations` charged iterations: the run stops when the ledger charges them
            for it in s.steps(charged=(lambda: s.event.steps) if private_run else None):
                k = int(draw_critics(K, 1, picker))  # the secret, fresh draw: the mechanism's subsampling
                # the critic that trains: under round_robin critic it mod K (a public schedule, whatever was drawn)
                c = trained_critic(it, K, k, hp["critic_schedule"])
                critic, w = critic_turn(bank, c, batches=[(r[0], m[0]) for r, m in
                                                          (parts.batch([c], critic_batch)
                                                           for _ in range(hp["critic_steps"]))], **kw)
                if hp["fresh_steps"]:  # a throw-away copy of critic k fitted to the current G (rows: stateless)
                    fresh = [(r[0], m[0]) for r, m in
                             (parts.batch([k], critic_batch, stream=_FRESH_STREAM, calls=[it * hp["fresh_steps"] + i])
                              for i in range(hp["fresh_steps"]))]
                    critic, w = critic_turn(bank, k, batches=fresh, keep=False, **kw)
                elif c != k:
                    critic, _ = bank.checkout(k)
                z = torch.randn(b, hp["z_dim"], generator=gen).to(device)
                y = torch.randint(0, ctx.num_classes, (b,), generator=gen).to(device)  # labels uniform (public)
                if private_run:
                    s.charge_steps(1)  # the iteration's b releases, charged before they are made
                opt_g.zero_grad(set_to_none=True)
                generator_step(G, critic, z=z, y=y, clip=clip, sigma=sigma, generator=dp_gen, basis=basis)
                opt_g.step()
                update_ema(G_ema, G, step=it, max_decay=hp["ema"], warmup="mean")
                done = it + 1
                spent = None  # the accountant is not free: at most once an iteration, and every 20 on the bar
                if private_run and (done % 20 == 0 or done == iterations):
                    spent = ledger.epsilon()
                    s.show(eps=f"{spent:.3f}")
                if done % 100 == 0 or done == 1:
                    # Under DP the log names neither the critic drawn (the secret subsample that the 1/K amplification
                    # relies on) nor a W estimate (read from private rows without noise): logs are published with a
                    # run.
                    if not private_run:
                        log.info("gs_wgan iteration %d/%d: critic %d, W estimate %.4f", done, iterations, k, w)
                    else:
                        log.info("gs_wgan iteration %d/%d: eps %.4f", done, iterations,
                                 ledger.epsilon() if spent is None else spent)
        it, released = s.step, s.step * b  # every iteration makes b sanitised releases
        G.eval()
        G_ema.eval()
        self.G = G_ema if hp["ema"] > 0 else G
        self.device = device
        self.train_log.update(iterations=it, releases=released, sigma=sigma,
                              noise_multiplier=iteration_noise_multiplier(sigma, b),
                              fit_s=time.perf_counter() - t0)
        if private_run:  # for comparison with published numbers only; the ledger holds the true epsilon
            self.train_log["epsilon_published_analysis"] = published_analysis_epsilon(
                sigma=sigma, critics=K, batch_size=b, iterations=it, delta=budget.delta, accountant=ctx.accountant)
        else:  # non-private only: W is read from private rows without noise
            self.train_log["last_w"] = w
        log.info("gs_wgan: %d iterations, %d sanitised releases, sigma %.4g", it, released, sigma)

    @torch.no_grad()
    def sample(self, n: int, labels: np.ndarray | None = None) -> Samples:
        rng = np.random.default_rng(self.ctx.seed)
        if labels is None:
            labels = self.uniform_labels(n, rng)
        x = generate_conditional(self.G, labels, z_dim=self.hp["z_dim"], shape=self.ctx.shape, device=self.device,
                                 generator=torch.Generator().manual_seed(self.ctx.seed + 1))
        prov = {
            "method": "gs_wgan",
            "labels": "uniform over classes (public choice)",
            "accountant": f"uniform-choice gaussian rdp ({self.hp['bound']} bound: {BOUND_BASIS[self.hp['bound']]}), "
                          f"one step an iteration: its b releases share the critic drawn (noise multiplier "
                          f"sigma / (2 sqrt(b)), sensitivity 2C sqrt(b)), one of K; {SAMPLING_NOTE}",
            "critics": self.hp["critics"],
            "warm_start": f"{self.train_log.get('warm_start_iterations', 0)} non-private iterations per critic "
                          "(authors: 2000; not charged: the critics are not released)",
            "generator": "EMA of G" if self.hp["ema"] > 0 else "G",
            "output_frequencies": self.hp["output_frequencies"],
            **{k: v for k, v in self.train_log.items() if k != "fit_s"},
        }
        return Samples(x, labels, prov)
