"""The DP-SGD set-up every DP-SGD method of dpsyn shares: calibrate once, sample as the accountant assumes, charge.

``dp_gan``, ``dp_gan_ft``/``dp_gan_mi`` and ``dp_dre`` train a network on private rows with Opacus DP-SGD. The
privacy-critical steps are the same in each and written once here:

* :func:`calibrate_dpsgd`: the noise multiplier for the exact number of planned steps at sample rate
  ``batch / n``, by the configured accountant (RDP by default), logged;
* :func:`private_discriminator_loader`: for the Lightning GANs, the private loader (Opacus's ``DPDataLoader``:
  Poisson sampling, the scheme the accountant assumes, its randomness drawn from OS entropy like the noise, never
  from the run seed), the discriminator wrapped in a ``GradSampleModule`` and the ``dp`` settings
  :class:`~dpsyn.lit.gan.GANModule` and :class:`~dpsyn.lit.feature_gan.FeatureGANModule` read; without a budget
  (eps=inf) a seeded shuffled loader and no wrapping;
* :func:`dp_optimizer`: Opacus's ``DPOptimizer`` around a plain optimizer, with dpsyn's conventions (the noisy
  clipped sum divided by the *expected* batch size, the noise from the DP generator); the optimizer every DP-SGD loop
  of dpsyn steps with, and the one :mod:`dpsyn.cli.audit` audits;
* :func:`poisson_mask`: the Poisson sample of a hand-written DP-SGD loop (dp_dre), each row kept with probability
  ``sample_rate``, independently;
* :func:`open_dpsgd_event` and :class:`ChargeAhead`: the ledger's DP-SGD event, recorded before the first step, and
  a Trainer callback that charges each step before it is made (write-ahead: with the run's journal attached,
  :meth:`~dpsyn.privacy.PrivacyLedger.attach_journal`, the charge is on disk before the noisy step's result can
  leave the process). The steps charged include those of an interrupted attempt after its last checkpoint (kept
  from the journal), so training stops when the steps *charged* reach the planned ones: the noise was calibrated
  for that many, and fewer updates keep the run within its target;
* :func:`charge_dpsgd`: the ledger entry for the steps made, recorded after training (a hand-written loop's, dp_dre).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import lightning as L
import torch
from torch.utils.data import DataLoader, Dataset

from dpsyn.lit.poisson import distributed_poisson_loader, planned_steps
from dpsyn.privacy import NonPrivateEvent, PrivacyLedger, SampledGaussianEvent, dp_generator, dpsgd_noise_multiplier

if TYPE_CHECKING:  # dpsyn.methods imports this module
    from dpsyn.methods.base import PrivacyBudget

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DPSGDCalibration:
    """One DP-SGD calibration: what the ledger charges per step made."""

    noise_multiplier: float
    sample_rate: float
    steps: int
    accountant: str


def calibrate_dpsgd(*, budget: PrivacyBudget, n: int, batch: int, steps: int, accountant: str,
                    name: str) -> DPSGDCalibration:
    """The noise multiplier that spends at most ``budget`` in ``steps`` Poisson-sampled steps of rate ``batch/n``."""
    q = batch / n
    nm = dpsgd_noise_multiplier(epsilon=budget.epsilon, delta=budget.delta, sample_rate=q, steps=steps,
                                accountant=accountant)
    log.info("%s DP-SGD: noise multiplier %.4f for %d steps at sample rate %.5f (%s accountant, eps=%g, delta=%g)",
             name, nm, steps, q, accountant, budget.epsilon, budget.delta)
    return DPSGDCalibration(noise_multiplier=nm, sample_rate=q, steps=steps, accountant=accountant)


def private_discriminator_loader(
    D: torch.nn.Module,
    data: Dataset,
    *,
    batch: int,
    epochs: int,
    limit_train_batches: int | float | None,
    budget: PrivacyBudget,
    ctx: Any,
    max_grad_norm: float,
    grad_sample_mode: str,
    name: str,
    distributed: bool = False,
    noise_device: str = "cpu",
) -> tuple[torch.nn.Module, DataLoader, dict[str, Any] | None]:
    """``(D, loader, dp)`` for a Lightning GAN whose discriminator reads ``data`` (private rows).

    Under a budget: ``D`` wrapped for per-sample gradients (``grad_sample_mode`` ``functorch`` forces Opacus's
    functorch path; ``fused`` wraps with hooks, and the module's paired step computes them with
    :mod:`dpsyn.lit.fused_grad_sample` instead where that supports ``D``), a Poisson ``DPDataLoader`` at rate
    ``batch / len(data)``, and ``dp`` = noise multiplier (for the Trainer's exact step count), clip norm, the noise
    generator (OS entropy unless ``ctx.deterministic_noise``), ``max_steps`` and ``grad_sample_mode``. Without one
    (eps=inf): ``D`` as it is, a shuffled loader seeded by ``ctx.seed``, ``dp`` None.

    ``distributed`` (one rank of ``trainer=ddp``, :mod:`dpsyn.lit.ddp`; the process group initialised): the loader
    samples this rank's shard of ``data`` at the same rate ``batch / len(data)`` (so the expected global batch is
    ``batch``), with this rank's own sampling generator, and ``dp["distributed"]`` is True (the module then builds
    Opacus's ``DistributedDPOptimizer``). The calibration is the same as in one process: one release per global step.
    ``noise_device``: where the noise generator lives (the rank's GPU under ``trainer=ddp`` on GPUs).
    """
    n = len(data)  # type: ignore[arg-type]
    if not budget.private:
        loader = DataLoader(data, batch_size=batch, shuffle=True, drop_last=True,
                            generator=torch.Generator().manual_seed(ctx.seed))
        return D, loader, None
    from opacus import GradSampleModule
    from opacus.data_loader import DPDataLoader

    # Poisson sampling: the scheme the accountant assumes. Its randomness is part of the mechanism, so it is drawn
    # from OS entropy like the noise, not from the run seed.
    if distributed:
        import torch.distributed as dist


        rank = dist.get_rank()
        # each rank's own sampling randomness (OS entropy; distinct seeds when deterministic): rows of different
        # shards must be kept independently of each other, as the accountant assumes
        loader = distributed_poisson_loader(
            data, sample_rate=batch / n,
            generator=dp_generator(deterministic=ctx.deterministic_noise, seed=ctx.seed + 1 + rank))
    else:
        loader = DPDataLoader(data, sample_rate=batch / n,
                              generator=dp_generator(deterministic=ctx.deterministic_noise, seed=ctx.seed + 1))
    steps = planned_steps(epochs=epochs, batches_per_epoch=len(loader), limit_train_batches=limit_train_batches)
    cal = calibrate_dpsgd(budget=budget, n=n, batch=batch, steps=steps, accountant=ctx.accountant, name=name)
    D = GradSampleModule(D, loss_reduction="sum", force_functorch=grad_sample_mode == "functorch")
    dp = {
        "noise_multiplier": cal.noise_multiplier,
        "max_grad_norm": float(max_grad_norm),
        "generator": dp_generator(deterministic=ctx.deterministic_noise, seed=ctx.seed, device=noise_device),
        "max_steps": steps,
        "distributed": bool(distributed),
        "grad_sample_mode": grad_sample_mode,
    }
    return D, loader, dp


def dp_optimizer(optimizer: torch.optim.Optimizer, *, noise_multiplier: float, max_grad_norm: float,
                 expected_batch_size: int, generator: torch.Generator, distributed: bool = False) -> Any:
    """``optimizer`` wrapped in Opacus's ``DPOptimizer``: per-sample gradients (from a ``GradSampleModule`` built with
    ``loss_reduction="sum"``) clipped to ``max_grad_norm``, summed, N(0, (noise_multiplier * max_grad_norm)^2) added
    once per step from ``generator``, divided by ``expected_batch_size`` (Poisson DP-SGD must not divide by the
    realised batch size).

    ``distributed`` (one rank of ``trainer=ddp``): Opacus's ``DistributedDPOptimizer`` instead, and
    ``expected_batch_size`` is then this rank's share ``B / world_size`` of the global expected batch B. Each rank
    clips its own rows; only rank 0 adds the noise; each rank divides by ``B / world_size``; ``reduce_gradients``
    sums over the ranks and divides by ``world_size``. The update is therefore
    ``(sum over all ranks of the clipped per-sample gradients + ONE N(0, (sigma C)^2) draw) / B``, exactly the
    one-process DP-SGD update of a Poisson batch of expected size B.

    Raises:
        ValueError: a noise multiplier <= 0, a clip norm <= 0 or an expected batch size < 1.
    """
    from opacus.optimizers import DistributedDPOptimizer, DPOptimizer

    if not noise_multiplier > 0 or not max_grad_norm > 0 or not expected_batch_size >= 1:
        raise ValueError(f"DP-SGD needs noise_multiplier > 0, max_grad_norm > 0, expected_batch_size >= 1; got "
                         f"{noise_multiplier!r}, {max_grad_norm!r}, {expected_batch_size!r}")
    cls = DistributedDPOptimizer if distributed else DPOptimizer
    return cls(optimizer, noise_multiplier=float(noise_multiplier), max_grad_norm=float(max_grad_norm),
               expected_batch_size=int(expected_batch_size), loss_reduction="mean", generator=generator)


POISSON = "poisson"
"""The sampling scheme of :func:`poisson_mask` and of the DP-SGD loaders: what their ledger events state."""


def poisson_mask(n: int, *, sample_rate: float, generator: torch.Generator) -> torch.Tensor:
    """(n,) bool: row i is in the batch with probability ``sample_rate``, independently of the others (Poisson
    sampling, the scheme the DP-SGD accountants assume). ``generator`` is a DP generator (OS entropy)."""
    if not 0.0 < sample_rate <= 1.0:
        raise ValueError(f"sample_rate must lie in (0, 1], got {sample_rate!r}")
    return torch.rand(n, generator=generator) < sample_rate


def charge_dpsgd(ledger: PrivacyLedger, *, noise_multiplier: float | None, sample_rate: float, steps_done: int,
                 accountant: str, label: str, non_private_label: str) -> None:
    """Record the DP-SGD steps made (``noise_multiplier`` None: the run had no budget, one non-private event)."""
    if noise_multiplier is None:
        ledger.add(NonPrivateEvent(label=non_private_label))
    else:
        ledger.add(SampledGaussianEvent(sampling=POISSON, noise_multiplier=noise_multiplier, sample_rate=sample_rate,
                                        steps=steps_done, accountant=accountant, label=label))


def open_dpsgd_event(ledger: PrivacyLedger, *, noise_multiplier: float | None, sample_rate: float, accountant: str,
                     label: str, non_private_label: str, steps_done: int = 0, planned: int | None = None,
                     name: str = "DP-SGD") -> int | None:
    """Record the DP-SGD event before the first step and return its id (``noise_multiplier`` None: a run without a
    budget; one non-private event is recorded and None returned).

    A run resumed in its run directory gets, from the journal, the event of the interrupted attempt
    (:meth:`~dpsyn.privacy.PrivacyLedger.add` takes it up): its steps are charged already, those made after the last
    checkpoint too. ``steps_done``, the steps of the checkpoint resumed from, is charged if no journal holds it.

    Args:
        steps_done: DP-SGD steps the training state resumed from has made (:func:`~dpsyn.results.checkpoint.
            lightning_dp_steps`; 0 for a fresh start).
        planned: the steps the noise was calibrated for (for the warning on lost steps).
        name: the method, for the log.
    """
    if noise_multiplier is None:
        ledger.add(NonPrivateEvent(label=non_private_label))
        return None
    event_id = ledger.add(SampledGaussianEvent(sampling=POISSON, noise_multiplier=noise_multiplier,
                                               sample_rate=sample_rate, steps=0,
                                               accountant=accountant, label=label))
    event = ledger.events[event_id]
    if event.steps < steps_done:  # a checkpoint that no journal covers (a run directory of an earlier dpsyn)
        ledger.record_steps(event_id, steps_done - event.steps)
    lost = event.steps - steps_done
    if lost > 0:
        left = max(0, planned - event.steps) if planned is not None else None
        log.warning("%s: %d DP-SGD step(s) of an interrupted attempt made after its last checkpoint are charged (from "
                    "the run's journal); training stops when the charged steps reach the %s planned: %s more step(s) "
                    "instead of %s (fewer updates, epsilon within the target)", name, lost, planned, left,
                    None if left is None else left + lost)
    return event_id


class ChargeAhead(L.Callback):
    """Charge each DP-SGD step of a :class:`~dpsyn.lit.gan.GANModule` in the ledger before the step is made, and stop
    training when the steps charged reach ``planned`` (the steps the noise was calibrated for).

    While the Trainer runs, the module's ``charge_step`` is :meth:`charge_step`: its ``training_step`` calls it
    before a DP step, which is then charged (:meth:`~dpsyn.privacy.PrivacyLedger.record_steps` writes the run's
    journal) or, when the charged steps (the interrupted attempts' included) already reach ``planned``, not made:
    training stops. Under ``trainer=ddp`` every rank holds a copy of the ledger and decides alike; only rank 0's
    copy writes the journal, and the parent takes its charges up afterwards
    (:meth:`~dpsyn.privacy.PrivacyLedger.absorb_journal`, :meth:`settle`).

    Args:
        ledger: the run's ledger.
        event_id: its DP-SGD event (:func:`open_dpsgd_event`).
        planned: the steps the noise was calibrated for.
    """

    def __init__(self, ledger: PrivacyLedger, event_id: int, planned: int) -> None:
        self.ledger, self.event_id, self.planned = ledger, int(event_id), int(planned)
        self.start_charged = self.charged

    @property
    def charged(self) -> int:
        """The steps charged in the event so far."""
        return int(self.ledger.events[self.event_id].steps)

    def charge_step(self) -> bool:
        """Charge one DP step before it is made; False (nothing charged, no step) once ``planned`` are charged."""
        if self.charged >= self.planned:
            return False
        self.ledger.record_steps(self.event_id, 1)
        return True

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if not trainer.is_global_zero:
            self.ledger.detach_journal()  # a copy in a DDP rank: rank 0's copy journals the charges
        pl_module.charge_step = self.charge_step

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        pl_module.charge_step = None  # the fitted module keeps no ledger

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        pl_module.charge_step = None

    def settle(self, steps_made: int) -> None:
        """After training: make sure the ``steps_made`` DP steps (since this callback was built) are charged, in case
        some were made without it (a rank's journal not read back); charges the missing ones."""
        short = self.start_charged + int(steps_made) - self.charged
        if short > 0:
            log.error("%d DP-SGD step(s) were made without being charged ahead: charged now", short)
            self.ledger.record_steps(self.event_id, short)

