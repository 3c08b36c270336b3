"""``gs_wgan``: GS-WGAN (Chen, Orekondy & Fritz, NeurIPS 2020), a baseline of paper 002 — a generator trained
through K non-private WGAN-GP critics on disjoint partitions, with only the gradient that flows from the critic
into the generated samples sanitised (per-sample clipping + Gaussian noise).

Algorithm (the authors' ``source/main.py``), per generator iteration:

1. *Subsampling*: one critic index k is drawn uniformly from K (drawn from a DP generator, like DP-SGD's Poisson
   sampling: the choice is part of the mechanism).
2. *Critic*: D_k takes ``critic_steps`` Adam steps on the WGAN-GP loss ``mean D(fake) - mean D(real) + lambda GP +
   drift mean D(real)^2`` (the authors' "epsilon penalty" 1e-3), its real rows drawn from the k-th of K disjoint
   partitions only (:class:`dpsyn.nets.ensemble.TeacherPartitions`), its fakes G(z, y_real). No privacy: D_k is never
   released, only the sanitised gradient below is.
3. *Generator*: x = G(z, y) (labels uniform, a public choice), loss ``-mean_j D_k(x_j, y_j)``; a hook on x replaces
   the gradient flowing from D_k into x by its sanitised version (:func:`sanitize`): per sample j, the gradient of
   -D_k(x_j) w.r.t. x_j is clipped to L2 norm C and N(0, (sigma C)^2 I) noise is added (noise from
   :func:`dpsyn.privacy.dp_generator`, never from the run seed); the batch mean of those then flows into G. G's own
   parameter gradient is post-processing of the b sanitised per-sample gradients.

Privacy. Neighbouring datasets differ in one row, hence in one partition and one critic; two clipped per-sample
gradients differ by at most 2C (the paper's sensitivity; the authors' code adds noise ``C * noise_multiplier *
SENSITIVITY`` with ``SENSITIVITY = 2``). An iteration releases b sanitised gradients, and ALL b are read through the
one critic drawn: when the critic holding a row is drawn, each of the b gradients can move by 2C, so the iteration
is one Gaussian mechanism of L2 sensitivity 2C sqrt(b) and noise std sigma C, i.e. noise multiplier
``sigma / (2 sqrt(b))`` (b Gaussian releases of multiplier sigma / 2 compose to exactly that), subsampled with rate
1/K (the critic drawn). dpsyn records ONE :class:`~dpsyn.privacy.SampledGaussianEvent`
``(noise_multiplier=sigma / (2 sqrt(b)), sample_rate=1/K, steps=iterations)`` (:func:`privacy_event`) and calibrates
``sigma = 2 sqrt(b) * dpsgd_noise_multiplier(eps, delta, 1/K, iterations)`` before training (:func:`gs_wgan_sigma`).

**Departure from the authors' analysis** (``evaluation/privacy_analysis.py``: autodp's
``compose_subsampled_mechanism(gaussian(noise_multiplier), 1/K, coeff=iterations * batch_size)``): they compose
``iterations * b`` releases as if each drew its own critic, so each release gets the 1/K amplification on its own
(the first author explains the factor b in DingfanChen/GS-WGAN issue #12: a row reaches every gradient of the batch).
The b releases of an iteration share one draw, and a subsampled composition is not the composition of subsampled
releases: for the authors' MNIST setting (K = 1000, noise_multiplier 1.07, 20000 iterations of 32, delta 1e-5) the
per-release composition gives eps 4.45 under Opacus's RDP accountant, the per-iteration mechanism 366 (329 under
Opacus's PRV accountant). :func:`published_analysis_epsilon` computes the former (recorded beside a run's epsilon,
never charged); the audit row ``gs_wgan_iteration`` (``python -m dpsyn.cli.audit``) runs the sanitizer on b releases
sharing a draw, and with sigma calibrated the authors' way its lower bound exceeds their claim (tests/test_audit.py).
So dpsyn's sigma at a given eps is larger than the authors' analysis gives: at the embedded setting (100 critics,
1000 iterations of 32) 6.49 C against 2.33 C at eps=10, 17.2 C against 14.7 C at eps=1. Caveat kept: the accountant
(Opacus's sampled-Gaussian RDP) analyses Poisson subsampling under add/remove adjacency, while GS-WGAN draws exactly
one of K critics uniformly (replace-one adjacency).

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
from dpsyn.lit.ema import update_ema
from dpsyn.methods.base import METHODS, Method, PrivacyBudget, Samples, generate_conditional
from dpsyn.nets.dcgan import CondDCGANGenerator
from dpsyn.nets.ensemble import CondConvTeacher, TeacherPartitions
from dpsyn.nets.lowpass import LowPassOutput, dct_basis
from dpsyn.privacy import (
    REPLACE_ONE_SENSITIVITY_FACTOR,
    NonPrivateEvent,
    PrivacyLedger,
    SampledGaussianEvent,
    dp_generator,
    dpsgd_noise_multiplier,
    gaussian_mechanism,
    replace_one_noise_std,
)
from dpsyn.results.checkpoint import Checkpointer

log = logging.getLogger(__name__)

CHECKPOINT = "gs_wgan.pt"
SENSITIVITY_FACTOR = REPLACE_ONE_SENSITIVITY_FACTOR
"""Two clipped per-sample gradients (of two critics that differ in one partition) differ by at most 2C
(:data:`dpsyn.privacy.REPLACE_ONE_SENSITIVITY_FACTOR`)."""
SAMPLING_NOTE = "sampling: one of K critics per step (GS-WGAN's analysis)"


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


def iteration_noise_multiplier(sigma: float, batch_size: int) -> float:
    """The noise multiplier of one iteration: b releases of noise std sigma C, all read through the critic drawn, so
    of joint L2 sensitivity 2C sqrt(b): ``sigma / (2 sqrt(b))``."""
    return sigma / (SENSITIVITY_FACTOR * math.sqrt(batch_size))


def gs_wgan_sigma(
    *, epsilon: float, delta: float, critics: int, iterations: int, batch_size: int, accountant: str
) -> float:
    """Noise std ``sigma`` (in units of C) that keeps ``iterations`` generator iterations within (epsilon, delta).

    Each iteration is one Gaussian mechanism of sensitivity 2C sqrt(b) (its b releases share the critic drawn),
    subsampled at rate 1/critics: ``sigma = 2 sqrt(b) * dpsgd_noise_multiplier(eps, delta, 1/critics, iterations)``,
    the inverse of :func:`iteration_noise_multiplier`. Larger than the authors' analysis gives (module docstring).
    """
    nm = dpsgd_noise_multiplier(epsilon=epsilon, delta=delta, sample_rate=1.0 / critics, steps=iterations,
                                accountant=accountant)
    return replace_one_noise_std(nm) * math.sqrt(batch_size)


def privacy_event(*, sigma: float, critics: int, batch_size: int, iterations: int, accountant: str,
                  label: str) -> SampledGaussianEvent:
    """What a run charges for ``iterations`` iterations: ONE sampled-Gaussian event, noise multiplier
    :func:`iteration_noise_multiplier`, rate 1/critics, a step per iteration (grown as the run goes)."""
    return SampledGaussianEvent(noise_multiplier=iteration_noise_multiplier(sigma, batch_size),
                                sample_rate=1.0 / critics, steps=iterations, accountant=accountant, label=label)


def published_analysis_epsilon(*, sigma: float, critics: int, batch_size: int, iterations: int, delta: float,
                               accountant: str) -> float:
    """The epsilon the GS-WGAN authors' analysis would state for this noise: ``iterations * batch_size`` releases of
    noise multiplier sigma / 2, each subsampled at rate 1/critics on its own. NOT a privacy bound (the releases of an
    iteration share one critic draw; module docstring): recorded beside a run's true epsilon to compare with
    published numbers, never charged."""
    from dpsyn.privacy import dpsgd_epsilon

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
) -> torch.Tensor:
    """WGAN-GP's penalty: mean_j (||grad_x D(x_hat_j, y_j)|| - 1)^2 at x_hat = alpha real + (1 - alpha) fake.
    ``input_grad`` computes the gradient: autograd for a module, ``torch.func.grad`` under the warm start's vmap."""
    a = alpha.view(-1, *([1] * (real.dim() - 1)))
    g = input_grad(lambda xh: critic(xh, y), a * real + (1 - a) * fake)
    return ((g.flatten(1).norm(dim=1) - 1) ** 2).mean()


def critic_loss(
    critic: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], real: torch.Tensor, fake: torch.Tensor,
    y: torch.Tensor, alpha: torch.Tensor, *, gp_weight: float, drift: float,
    input_grad: Callable[[Callable[[torch.Tensor], torch.Tensor], torch.Tensor], torch.Tensor] = _autograd_input_grad,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One critic's WGAN-GP loss ``mean D(fake) - mean D(real) + gp_weight penalty + drift mean D(real)^2``, with
    ``D(real)`` and ``D(fake)``; the main loop and both warm starts (one module, or stacked under vmap) use it."""
    d_real, d_fake = critic(real, y), critic(fake, y)
    loss = d_fake.mean() - d_real.mean() + gp_weight * gradient_penalty(critic, real, fake, y, alpha, input_grad)
    return loss + drift * (d_real**2).mean(), d_real, d_fake


def _critic_draw(g: torch.Generator, rows: torch.Tensor, *, batch: int, z_dim: int
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One critic step's draws: ``batch`` of ``rows`` (at most all), their latents and the penalty's mixing weights."""
    pick = rows[torch.randperm(len(rows), generator=g)[:batch]]
    return pick, torch.randn(len(pick), z_dim, generator=g), torch.rand(len(pick), generator=g)


def critic_steps_on(
    critic: nn.Module, opt: torch.optim.Optimizer, *, x: torch.Tensor, y: torch.Tensor, rows: torch.Tensor,
    G: nn.Module, z_dim: int, steps: int, batch: int, gp_weight: float, drift: float, generator: torch.Generator,
) -> float:
    """``steps`` Adam steps of ``critic`` on WGAN-GP, real rows drawn from ``rows`` only (see :func:`critic_turn`);
    returns the Wasserstein estimate ``mean D(real) - mean D(fake)`` of the last step."""
    device = x.device
    w = math.nan
    for _ in range(steps):
        pick, z, alpha = (t.to(device) for t in _critic_draw(generator, rows, batch=batch, z_dim=z_dim))
        real, ry = x[pick], y[pick]
        with torch.no_grad():
            fake = G(z, ry)
        loss, d_real, d_fake = critic_loss(critic, real, fake, ry, alpha, gp_weight=gp_weight, drift=drift)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        w = float((d_real.mean() - d_fake.mean()).detach())
    return w


def _warm_streams(generator: torch.Generator, k: int) -> list[int]:
    """One seed per critic, drawn once from the run-seed ``generator``: critic k's throw-away generator, row draws,
    latents and mixing weights come from its own stream, so they are the same whichever critics warm up beside it."""
    return [int(s) for s in torch.randint(0, 2**62, (k,), generator=generator)]


def _seeded(make: Callable[[], nn.Module], seed: int) -> nn.Module:
    """``make()`` with torch's global RNG at ``seed``, restored afterwards."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return make()


def _warm_draws(g: torch.Generator, rows: torch.Tensor, *, steps: int, batch: int, z_dim: int, num_classes: int
                ) -> tuple[list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]], torch.Tensor, torch.Tensor]:
    """One warm-start iteration's draws from a critic's own stream, in :func:`critic_steps_on`'s order: per critic
    step the rows, latents and mixing weights; then the throw-away generator's latents and labels."""
    steps_ = [_critic_draw(g, rows, batch=batch, z_dim=z_dim) for _ in range(steps)]
    return steps_, torch.randn(batch, z_dim, generator=g), torch.randint(0, num_classes, (batch,), generator=g)


def warm_start(
    bank: CriticBank, parts: TeacherPartitions, *, x: torch.Tensor, y: torch.Tensor,
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
    critic draws from its own stream (:func:`_warm_streams`), so the result does not depend on ``chunk``.

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
            _warm_start_one(bank, s, parts.rows[s], seed=seeds[s], **kw)
        else:
            _warm_start_stacked(bank, s, e, [parts.rows[k] for k in range(s, e)], seeds=seeds[s:e], **kw)
        bar.update(e - s)
    bar.close()
    for t in (*bank.exp_avg.values(), *bank.exp_avg_sq.values()):
        t.zero_()
    bank.steps.zero_()


def _warm_start_one(
    bank: CriticBank, k: int, rows: torch.Tensor, *, seed: int, x: torch.Tensor, y: torch.Tensor,
    make_generator: Callable[[], nn.Module], iterations: int, critic_steps: int, batch: int, z_dim: int,
    num_classes: int, gp_weight: float, drift: float, lr_g: float, betas: tuple[float, float],
) -> None:
    """Critic k's warm start, one module at a time (the authors' loop)."""
    g = torch.Generator().manual_seed(seed)
    G_k = _seeded(make_generator, seed).to(x.device)
    opt_g = torch.optim.Adam(G_k.parameters(), lr=lr_g, betas=betas)
    critic, opt = bank.checkout(k)
    for _ in range(iterations):
        critic_steps_on(critic, opt, x=x, y=y, rows=rows, G=G_k, z_dim=z_dim, steps=critic_steps, batch=batch,
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
    bank: CriticBank, s: int, e: int, rows: list[torch.Tensor], *, seeds: list[int], x: torch.Tensor, y: torch.Tensor,
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
                     alpha: torch.Tensor) -> torch.Tensor:
        return critic_loss(lambda xs, yy: D(p, b, xs, yy), real, fake, ys, alpha, gp_weight=gp_weight, drift=drift,
                           input_grad=func_input_grad)[0]

    def generator_loss(gp: dict, gb: dict, p: dict, b: dict, zs: torch.Tensor, ys: torch.Tensor) -> torch.Tensor:
        return -D(p, b, G(gp, gb, zs, ys), ys).mean()

    critic_grads = vmap(grad(stacked_loss))
    generator_grads = vmap(grad(generator_loss))
    fakes = vmap(G)
    for _ in range(iterations):
        draws = [_warm_draws(g, r, steps=critic_steps, batch=batch, z_dim=z_dim, num_classes=num_classes)
                 for g, r in zip(streams, rows)]
        for step in range(critic_steps):
            pick = torch.stack([d[0][step][0] for d in draws]).to(device)
            z = torch.stack([d[0][step][1] for d in draws]).to(device)
            alpha = torch.stack([d[0][step][2] for d in draws]).to(device)
            real, ry = x[pick], y[pick]
            with torch.no_grad():
                fake = fakes(g_params, g_buffers, z, ry)
            grads = critic_grads({n: p.detach() for n, p in c_params.items()}, c_buffers, real, fake, ry, alpha)
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
    bank: CriticBank, k: int, *, x: torch.Tensor, y: torch.Tensor, rows: torch.Tensor, G: nn.Module, z_dim: int,
    steps: int, batch: int, gp_weight: float, drift: float, generator: torch.Generator,
) -> tuple[nn.Module, float]:
    """Critic k's turn: ``steps`` Adam steps on WGAN-GP with real rows drawn from ``rows`` (its partition) only.

    Args:
        bank: the critics; critic k is checked out, trained, checked back in.
        x, y: all private rows and labels (on the bank's device); only ``x[rows]`` is read.
        rows: (m,) row ids of critic k's partition.
        G: the generator (fakes G(z, y_real), no gradient into G).
        z_dim, steps, batch: latent size, critic steps, real rows per step (at most m).
        gp_weight, drift: lambda of the gradient penalty, weight of ``mean D(real)^2``.
        generator: run-seed generator (row draws, latents, GP mixing weights).

    Returns:
        ``(critic module holding k's new weights, Wasserstein estimate mean D(real) - mean D(fake) of the last step)``.
    """
    critic, opt = bank.checkout(k)
    w = critic_steps_on(critic, opt, x=x, y=y, rows=rows, G=G, z_dim=z_dim, steps=steps, batch=batch,
                        gp_weight=gp_weight, drift=drift, generator=generator)
    bank.checkin(k, opt)
    return critic, w


# ---------------------------------------------------------------------------------------------------------------
# the method


@METHODS.register("gs_wgan")
class GSWGAN(Method):
    """GS-WGAN on images (see the module docstring)."""

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
                    "warm_start_iterations", "warm_start_chunk"):
            hp[key] = int(cfg.get(key))
        for key in ("clip", "gp_weight", "lr_g", "lr_d", "beta1", "beta2", "ema", "drift"):
            hp[key] = float(cfg.get(key))
        for key in ("clip_at_inf", "shuffle_partitions"):
            hp[key] = bool(cfg.get(key))
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
        iterations = ctx.capped_steps(hp["iterations"])
        if budget.private:
            sigma = gs_wgan_sigma(epsilon=budget.epsilon, delta=budget.delta, critics=K, iterations=iterations,
                                  batch_size=b, accountant=ctx.accountant)
            clip: float | None = hp["clip"]
            log.info("gs_wgan: sigma %.4f C a release (noise multiplier %.4f an iteration of %d releases, sensitivity "
                     "2C sqrt(b)) for %d iterations at rate 1/%d (%s accountant, eps=%g, delta=%g)", sigma,
                     iteration_noise_multiplier(sigma, b), b, iterations, K, ctx.accountant, budget.epsilon,
                     budget.delta)
        else:
            sigma, clip = 0.0, (hp["clip"] if hp["clip_at_inf"] else None)

        torch.manual_seed(ctx.seed)  # initialisation of G and of the critics
        gen = torch.Generator().manual_seed(ctx.seed)  # partitions, latents, labels, critic batches
        parts = TeacherPartitions(n_rows, K, generator=gen, shuffle=hp["shuffle_partitions"])
        critic_batch = min(b, parts.size)
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

        fingerprint = self._fingerprint(budget, iterations, sigma)
        start, released = 0, 0
        ckpt = Checkpointer.in_run(ctx.run_dir, CHECKPOINT, fingerprint, every=hp["checkpoint_every"])
        saved = ckpt.load()
        if saved is not None:
            state, start = saved.state, saved.step
            released = int(state["releases"])
            G.load_state_dict(state["G"])
            G_ema.load_state_dict(state["G_ema"])
            opt_g.load_state_dict(state["opt_g"])
            if "critics" in state:
                bank.load_state_dict(state["critics"])
            elif start < iterations:  # the critics are dropped from a finished run's checkpoint (unreleased)
                raise ValueError(f"{ckpt.path} holds no critics and stopped at iteration {start} of {iterations}; "
                                 "start a new run directory")
            parts.load_state_dict(state["partitions"])
            gen.set_state(state["gen"])
            if ctx.deterministic_noise or not budget.private:
                picker.set_state(state["picker"])
                if dp_gen is not None:
                    dp_gen.set_state(state["dp_gen"])
            # the ledger as saved: its one event holds the sanitised releases already made, charged once
            restored = saved.restore_ledger(ledger)
            event_id: int | None = restored[0] if budget.private else None
            log.info("resuming gs_wgan from %s at iteration %d (%d sanitised releases already charged)", ckpt.path,
                     start, released)
        elif budget.private:
            # one event, added before the first release and grown before each one: a crash leaves it complete
            m = hp["output_frequencies"]
            band = "" if m is None else f", in the {m}x{m} lowest DCT frequencies a channel"
            event_id = ledger.add(privacy_event(
                sigma=sigma, critics=K, batch_size=b, iterations=start, accountant=ctx.accountant,
                label=f"gs_wgan sanitised generator gradients ({b} a step through the critic drawn: "
                      f"clip {hp['clip']:g}, noise std {sigma:.4g} C each, sensitivity 2C sqrt({b}) a step, "
                      f"{K} critics{band}; {SAMPLING_NOTE})",
            ))
        else:
            event_id = None
            ledger.add(NonPrivateEvent(label="gs_wgan trained without noise (eps=inf)"))

        self.train_log: dict[str, Any] = {"partition_size": parts.size, "critic_batch": critic_batch}
        t0 = time.perf_counter()
        warm = ctx.capped_steps(hp["warm_start_iterations"]) if hp["warm_start_iterations"] else 0
        if saved is None and warm:
            log.info("gs_wgan warm start: %d critics x %d non-private iterations on their own partitions "
                     "(not released, not charged)", K, warm)
            warm_start(bank, parts, x=x_all, y=y_all, iterations=warm, critic_steps=hp["critic_steps"],
                       batch=critic_batch, z_dim=hp["z_dim"], num_classes=ctx.num_classes, gp_weight=hp["gp_weight"],
                       drift=hp["drift"], lr_g=hp["lr_g"], betas=(hp["beta1"], hp["beta2"]), generator=gen,
                       make_generator=make_generator, chunk=hp["warm_start_chunk"])
            self.train_log["warm_start_s"] = time.perf_counter() - t0
            if ckpt.enabled:  # the warm start is not repeated after a crash
                ckpt.save(0, self._state(released, G, G_ema, opt_g, bank, parts, gen, picker, dp_gen, budget), ledger)
        self.train_log["warm_start_iterations"] = warm
        it, w = start, math.nan
        G.train()
        # under DP the bar shows iterations and the epsilon spent only (never the critic drawn nor its W estimate)
        bar = tqdm(total=iterations, initial=start, desc="gs_wgan iterations", leave=False, disable=None)
        while it < iterations:
            k = int(draw_critics(K, 1, picker))
            critic, w = critic_turn(bank, k, x=x_all, y=y_all, rows=parts.rows[k], G=G, z_dim=hp["z_dim"],
                                    steps=hp["critic_steps"], batch=critic_batch, gp_weight=hp["gp_weight"],
                                    drift=hp["drift"], generator=gen)
            z = torch.randn(b, hp["z_dim"], generator=gen).to(device)
            y = torch.randint(0, ctx.num_classes, (b,), generator=gen).to(device)  # labels uniform (public)
            if event_id is not None:
                ledger.record_steps(event_id, 1)  # the iteration's b releases, charged before they are used
            released += b
            opt_g.zero_grad(set_to_none=True)
            generator_step(G, critic, z=z, y=y, clip=clip, sigma=sigma, generator=dp_gen, basis=basis)
            opt_g.step()
            update_ema(G_ema, G, step=it, max_decay=hp["ema"], warmup="mean")
            it += 1
            bar.update(1)
            spent = None  # the accountant is not free: at most once an iteration, and every 20 on the bar
            if event_id is not None and (it % 20 == 0 or it == iterations):
                spent = ledger.epsilon()
                bar.set_postfix(eps=f"{spent:.3f}", refresh=False)
            if it % 100 == 0 or it == 1:
                # Under DP the log names neither the critic drawn (the secret subsample that the 1/K amplification
                # relies on) nor its W estimate (read from private rows without noise): logs are published with a run.
                if event_id is None:
                    log.info("gs_wgan iteration %d/%d: critic %d, W estimate %.4f", it, iterations, k, w)
                else:
                    log.info("gs_wgan iteration %d/%d: eps %.4f", it, iterations,
                             ledger.epsilon() if spent is None else spent)
            if ckpt.due(it):
                ckpt.save(it, self._state(released, G, G_ema, opt_g, bank, parts, gen, picker, dp_gen, budget), ledger)
        bar.close()
        G.eval()
        G_ema.eval()
        self.G = G_ema if hp["ema"] > 0 else G
        self.device = device
        self.train_log.update(iterations=it, releases=released, sigma=sigma,
                              noise_multiplier=iteration_noise_multiplier(sigma, b),
                              fit_s=time.perf_counter() - t0)
        if event_id is not None:  # for comparison with published numbers only; the ledger holds the true epsilon
            self.train_log["epsilon_published_analysis"] = published_analysis_epsilon(
                sigma=sigma, critics=K, batch_size=b, iterations=it, delta=budget.delta, accountant=ctx.accountant)
        if event_id is None:  # non-private only: W is read from private rows without noise
            self.train_log["last_w"] = w
        log.info("gs_wgan: %d iterations, %d sanitised releases, sigma %.4g", it, released, sigma)

    def _state(self, released: int, G: nn.Module, G_ema: nn.Module, opt_g: torch.optim.Optimizer, bank: CriticBank,
               parts: TeacherPartitions, gen: torch.Generator, picker: torch.Generator,
               dp_gen: torch.Generator | None, budget: PrivacyBudget) -> dict[str, Any]:
        """The checkpoint's state; the DP generators' states only where they are not secret (deterministic noise or
        eps=inf)."""
        keep = self.ctx.deterministic_noise or not budget.private
        return {
            "releases": released, "G": G.state_dict(), "G_ema": G_ema.state_dict(), "opt_g": opt_g.state_dict(),
            "critics": bank.state_dict(), "partitions": parts.state_dict(), "gen": gen.get_state(),
            "picker": picker.get_state() if keep else None,
            "dp_gen": dp_gen.get_state() if (dp_gen is not None and self.ctx.deterministic_noise) else None,
        }

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
            "accountant": f"sampled-Gaussian {self.ctx.accountant}, one step an iteration: its b releases share the "
                          f"critic drawn (noise multiplier sigma / (2 sqrt(b)), sensitivity 2C sqrt(b)), rate 1/K; "
                          f"{SAMPLING_NOTE}",
            "critics": self.hp["critics"],
            "warm_start": f"{self.train_log.get('warm_start_iterations', 0)} non-private iterations per critic "
                          "(authors: 2000; not charged: the critics are not released)",
            "generator": "EMA of G" if self.hp["ema"] > 0 else "G",
            "output_frequencies": self.hp["output_frequencies"],
            **{k: v for k, v in self.train_log.items() if k != "fit_s"},
        }
        return Samples(x, labels, prov)
