"""DP-SGD on several processes (``trainer=ddp``): one Poisson shard, one clipping, ONE noise draw per global step.

What a global step of ``trainer=ddp`` computes (W ranks, global expected batch B = ``method.batch_size``, clip C,
noise multiplier sigma):

* **sampling** (:class:`DistributedPoissonBatchSampler`): the rows are split into W disjoint shards; every rank keeps
  each row of its shard with probability q = B / n, independently, from its own sampling generator (OS entropy).
  Every row of the data set is thus in the step's batch with probability q independently of the others: the Poisson
  sampling of one-process DP-SGD, expected global batch B. Every rank yields a batch at every step, empty or not
  (Opacus's ``DistributedUniformWithReplacementSampler`` skips empty batches, which would desynchronise the ranks
  and reveal the emptiness);
* **clipping and noise** (Opacus's ``DistributedDPOptimizer``, :func:`dpsyn.lit.dpsgd.dp_optimizer` with
  ``distributed=True``, per-rank expected batch B/W): each rank clips its own rows' per-sample gradients and sums
  them (S_r); rank 0 alone adds Z ~ N(0, (sigma C)^2); each rank divides by B/W; the gradients are summed over the
  ranks and divided by W. The update is ``(S_1 + ... + S_W + Z) / B``, the one-process DP-SGD update: same
  sensitivity C, same noise, so the same sampled-Gaussian release, charged ONCE per global step at rate q;
* **no all-reduce in backward**: :class:`DPDDPStrategy` wraps the module in Opacus's
  ``DifferentiallyPrivateDistributedDataParallel`` (parameters broadcast from rank 0 once, nothing reduced in
  backward) instead of torch's DDP, whose backward all-reduce would average unclipped, un-noised gradients;
* the generator's gradients are averaged over the ranks (it is post-processing, but it must stay identical).

Launch: :func:`fit_gan_ddp` runs only the training in W child processes (``torch.multiprocessing.spawn``, the
process group on loopback: gloo on CPU, NCCL on GPUs). The parent process, the Hydra run itself, keeps everything
else: the ledger (charged once, for rank 0's step count), privacy.json, sampling, scoring and result.json. Lightning's
own ``ddp`` launcher re-runs the whole script per rank (every rank would load the data, score, write the run
directory and charge the ledger), which is why it is not used; this is ``ddp_spawn``'s model with what crosses the
process boundary chosen here: the data and the untrained networks go in, rank 0's trained networks and step count
come back, and the parent refuses the result if the ranks' networks differ.
"""

from __future__ import annotations

import logging
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch.strategies import DDPStrategy
from torch.utils.data import Dataset

from dpsyn.lit.poisson import DistributedPoissonBatchSampler, distributed_poisson_loader  # noqa: F401  (re-exported)

log = logging.getLogger(__name__)

DDP_STRATEGY = "dpsgd_ddp"
"""``trainer.strategy`` of ``conf/trainer/ddp.yaml``: multi-process DP-SGD, for the methods with ``supports_ddp``."""


def ddp_world_size(trainer: dict[str, Any] | None) -> int | None:
    """The number of ranks ``trainer`` asks for under ``trainer=ddp``, or None when it is not a DDP trainer.

    Raises:
        ValueError: ``devices`` is not an integer >= 1 under ``trainer=ddp``.
    """
    trainer = trainer or {}
    if trainer.get("strategy") != DDP_STRATEGY:
        return None
    devices = trainer.get("devices")
    if isinstance(devices, bool) or not isinstance(devices, int) or devices < 1:
        raise ValueError(f"trainer.devices={devices!r}: trainer=ddp needs the number of processes, an integer >= 1")
    return devices


class DPDDPStrategy(DDPStrategy):
    """Lightning's DDP strategy with Opacus's ``DifferentiallyPrivateDistributedDataParallel`` instead of torch's DDP.

    The wrapper broadcasts rank 0's parameters once and reduces nothing in backward: the reduction is the
    ``DistributedDPOptimizer``'s, after clipping and noise (module docstring). For manual-optimisation modules that
    reduce their own gradients (:class:`dpsyn.lit.gan.GANModule` with ``dp["distributed"]``).
    """

    def configure_ddp(self) -> None:
        from opacus.distributed import DifferentiallyPrivateDistributedDataParallel

        self.model = DifferentiallyPrivateDistributedDataParallel(self.model)

    def teardown(self) -> None:
        from opacus.distributed import DifferentiallyPrivateDistributedDataParallel

        if isinstance(self.model, DifferentiallyPrivateDistributedDataParallel):
            self.model = self.lightning_module
        super().teardown()


@dataclass
class GANDDPJob:
    """What every rank of :func:`fit_gan_ddp` receives (pickled once per rank): data, untrained networks, settings.

    ``module_kwargs`` are the :class:`~dpsyn.lit.gan.GANModule` arguments but ``generator``, ``discriminator``,
    ``expected_batch_size`` and ``dp``, which each rank sets itself (``expected_batch_size`` = ``batch / world``).
    """

    world_size: int
    accelerator: str
    data: Dataset
    G: torch.nn.Module
    D: torch.nn.Module
    module_cls: type
    module_kwargs: dict[str, Any]
    batch: int
    epochs: int
    trainer_kwargs: dict[str, Any]
    budget: Any
    seed: int
    deterministic_noise: bool
    accountant: str
    max_grad_norm: float
    grad_sample_mode: str
    name: str
    callbacks: list[Any] = field(default_factory=list)
    ckpt_path: str | None = None
    port: int = 0
    out_dir: str = ""


class DDPFitError(RuntimeError):
    """A rank failed; ``dp_steps`` is what the ledger must charge (rank 0's count, else the planned steps)."""

    def __init__(self, message: str, dp_steps: int) -> None:
        super().__init__(message)
        self.dp_steps = dp_steps


def _free_port() -> int:
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _gan_rank(rank: int, job: GANDDPJob) -> None:
    """One rank: join the process group, build this rank's loader/module/optimizers, fit, write its final state."""
    from types import SimpleNamespace

    import lightning as L
    import torch.distributed as dist

    from dpsyn.lit.dpsgd import private_discriminator_loader

    world = job.world_size
    gpu = job.accelerator in ("gpu", "cuda")
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(job.port), WORLD_SIZE=str(world), RANK=str(rank),
                      LOCAL_RANK=str(rank), NODE_RANK="0")  # LOCAL_RANK set: Lightning launches no processes itself
    if gpu:
        torch.cuda.set_device(rank)
    else:
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    dist.init_process_group("nccl" if gpu else "gloo", init_method=f"tcp://127.0.0.1:{job.port}", rank=rank,
                            world_size=world)
    module = None
    try:
        # each rank its own latents (fake rows, generator batches); the parameters are broadcast from rank 0
        L.seed_everything(job.seed + rank, verbose=False)
        ctx = SimpleNamespace(seed=job.seed, deterministic_noise=job.deterministic_noise, accountant=job.accountant)
        D, loader, dp = private_discriminator_loader(
            job.D, job.data, batch=job.batch, epochs=job.epochs,
            limit_train_batches=job.trainer_kwargs.get("limit_train_batches"), budget=job.budget, ctx=ctx,
            max_grad_norm=job.max_grad_norm, grad_sample_mode=job.grad_sample_mode, name=job.name, distributed=True,
            noise_device=f"cuda:{rank}" if gpu else "cpu")
        module = job.module_cls(generator=job.G, discriminator=D, expected_batch_size=job.batch // world, dp=dp,
                                **job.module_kwargs)
        trainer = L.Trainer(
            accelerator="gpu" if gpu else "cpu",
            devices=world,
            strategy=DPDDPStrategy(),
            max_epochs=job.epochs,
            logger=False,  # the run's logger lives in the parent; loss_g is not logged under trainer=ddp
            enable_checkpointing=False,
            use_distributed_sampler=False,  # the DistributedPoissonBatchSampler is the sampling the accountant assumes
            num_sanity_val_steps=0,
            callbacks=job.callbacks,
            **job.trainer_kwargs,
        )
        trainer.fit(module, train_dataloaders=loader, ckpt_path=job.ckpt_path)
    finally:
        if module is not None:
            state = {
                "G": {k: v.detach().cpu() for k, v in module.G.state_dict().items()},
                "G_ema": None if module.G_ema is None else {
                    k: v.detach().cpu() for k, v in module.G_ema.state_dict().items()},
                "D": {k: v.detach().cpu() for k, v in module.D._module.state_dict().items()},
                "dp_steps": int(module.dp_steps),
                "noise_multiplier": module.dp["noise_multiplier"],
            }
            torch.save(state, Path(job.out_dir) / f"rank{rank}.pt")
        if dist.is_initialized():
            dist.destroy_process_group()


def _same_networks(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return all(torch.allclose(a[net][k].float(), b[net][k].float(), rtol=1e-5, atol=1e-7)
               for net in ("G", "D") for k in a[net])


def fit_gan_ddp(job: GANDDPJob, *, planned_steps: int) -> dict[str, Any]:
    """Train a :class:`~dpsyn.lit.gan.GANModule` with DP-SGD on ``job.world_size`` processes (module docstring).

    Returns:
        rank 0's ``{"G": state_dict, "D": state_dict (the unwrapped discriminator), "dp_steps", "noise_multiplier"}``
        and ``"identical"``: whether every rank's G and D are bitwise rank 0's (they must agree within rounding, or
        this raises; on CPU/gloo they are equal).

    Raises:
        DDPFitError: a rank failed, or the ranks' networks differ at the end; its ``dp_steps`` is what to charge:
            rank 0's step count when it got to write it, else ``planned_steps`` (the releases cannot be counted).
        ValueError: ``job.batch`` is not a multiple of the world size (each rank's expected share must be B / W).
    """
    import torch.multiprocessing as mp

    world = job.world_size
    if job.batch % world:
        raise ValueError(f"method.batch_size={job.batch} must be a multiple of trainer.devices={world} under "
                         "trainer=ddp (each rank's expected batch and fake rows are batch_size / devices)")
    with tempfile.TemporaryDirectory(prefix="dpsyn-ddp-") as out:
        job.out_dir, job.port = out, _free_port()
        log.info("%s: DP-SGD on %d processes (%s), global expected batch %d (%d per rank)", job.name, world,
                 job.accelerator, job.batch, job.batch // world)
        states: list[dict[str, Any] | None] = []
        try:
            mp.spawn(_gan_rank, args=(job,), nprocs=world, join=True)
        except Exception as e:
            rank0 = Path(out) / "rank0.pt"
            steps = int(torch.load(rank0, weights_only=False)["dp_steps"]) if rank0.is_file() else planned_steps
            raise DDPFitError(f"{job.name}: a DDP rank failed ({e})", steps) from e
        for r in range(world):
            states.append(torch.load(Path(out) / f"rank{r}.pt", weights_only=False))
    first = states[0]
    assert first is not None
    for r, s in enumerate(states[1:], start=1):
        assert s is not None
        if s["dp_steps"] != first["dp_steps"] or not _same_networks(first, s):
            raise DDPFitError(f"{job.name}: rank {r} ended with other networks or another step count than rank 0 "
                              f"({s['dp_steps']} vs {first['dp_steps']} steps): refusing the result",
                              max(planned_steps, first["dp_steps"]))
    first["identical"] = all(torch.equal(first[net][k], s[net][k]) for s in states[1:] if s is not None
                             for net in ("G", "D") for k in first[net])
    return first
