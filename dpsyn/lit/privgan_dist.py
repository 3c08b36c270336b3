"""privGAN's decentralized mode: one process per data owner, only D_p's updates cross process boundaries.

Each owner process holds only its own data (read from its own file), its own G/D and a replica of the central
discriminator D_p. All replicas start from the same seeded initialisation (so no parameters need to be sent), each
owner computes D_p's gradient on its own generated samples, and the gradients are summed across owners with
``torch.distributed.all_reduce`` (gloo; loopback here, hosts in the paper's setting); every replica then takes the
same Adam step. This is the paper's "the only shared pieces of information are the parameter updates of the central
discriminator". Every tensor sent goes through :class:`Transport`, which records its name, shape and dtype, so a test
can prove that nothing else crosses. The owner updates are :func:`dpsyn.lit.privgan.owner_step`, as in the
single-process mode.
"""

from __future__ import annotations

import json
import logging
import os
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

log = logging.getLogger(__name__)


class Transport:
    """The one channel between owners: sums D_p's gradients across processes and records every tensor sent."""

    def __init__(self) -> None:
        self.sent: list[dict[str, Any]] = []

    def allreduce_central_grads(self, Dp: torch.nn.Module) -> None:
        import torch.distributed as dist

        for name, p in Dp.named_parameters():
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            self.sent.append({"name": f"Dp.{name}.grad", "shape": list(p.grad.shape), "dtype": str(p.grad.dtype)})
            dist.all_reduce(p.grad, op=dist.ReduceOp.SUM)


@dataclass(frozen=True)
class OwnerJob:
    """What an owner process needs: its own data file, the shared hyperparameters, where to write its results."""

    data_file: str
    out_dir: str
    hp: dict[str, Any]
    steps_per_epoch: int
    total_batch: int  # generated samples per step over all owners (D_p's loss is their mean)
    port: int


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _owner_process(rank: int, jobs: list[OwnerJob]) -> None:
    import torch.distributed as dist

    from dpsyn.lit.privgan import central_loss, cycled_batch, make_discriminator, make_generator, owner_step

    job = jobs[rank]  # this process reads only its own job (its own data file)
    hp = job.hp
    world = len(jobs)
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{job.port}", rank=rank, world_size=world)
    try:
        with np.load(job.data_file) as z:
            x, y = torch.from_numpy(z["x"]), torch.from_numpy(z["y"])
        shape = tuple(x.shape[1:])
        torch.manual_seed(hp["seed"] + 1000 * (rank + 1))  # this owner's own G/D initialisation
        G, D = make_generator(hp, shape), make_discriminator(hp, shape)
        torch.manual_seed(hp["seed"])  # every replica of D_p starts identical: no parameters are sent
        Dp = make_discriminator(hp, shape, out=world)
        adam = lambda m: torch.optim.Adam(m.parameters(), lr=hp["lr"], betas=(hp["beta1"], 0.999))  # noqa: E731
        opt_g, opt_d, opt_p = adam(G), adam(D), adam(Dp)
        transport = Transport()
        gen = torch.Generator().manual_seed(hp["seed"] + rank)
        b = min(hp["batch_size"], len(x))
        total = job.total_batch
        if hp.get("dp_pretrain_epochs", 0) > 0:  # D_p on this owner's real data (off in Rajotte & Ng)
            opt_pre = adam(Dp)
            for _ in range(hp["dp_pretrain_epochs"]):
                order = torch.randperm(len(x), generator=gen)
                for step in range(job.steps_per_epoch):
                    idx = cycled_batch(order, step, b)
                    opt_pre.zero_grad()
                    central_loss(Dp, x[idx], y[idx], owner=rank, total=total).backward()
                    transport.allreduce_central_grads(Dp)  # still only D_p's gradients cross
                    opt_pre.step()
        for epoch in range(hp["epochs"]):
            order = torch.randperm(len(x), generator=gen)
            for step in range(job.steps_per_epoch):
                idx = cycled_batch(order, step, b)  # cycle the owner's data (max_size_cycle)
                fake, y_f, _, _ = owner_step(G, D, Dp, opt_g, opt_d, x[idx], y[idx], owner=rank, n_owners=world,
                                             z_dim=hp["z_dim"], num_classes=hp["num_classes"], lam=hp["lam"],
                                             smooth=hp["label_smoothing"])
                if epoch >= hp["dp_delay"]:
                    opt_p.zero_grad()
                    central_loss(Dp, fake, y_f, owner=rank, total=total).backward()
                    transport.allreduce_central_grads(Dp)  # the only communication
                    opt_p.step()
        out = Path(job.out_dir)
        torch.save({"G": G.state_dict(), "D": D.state_dict(), "Dp": Dp.state_dict()}, out / f"owner{rank}.pt")
        (out / f"transport_owner{rank}.json").write_text(json.dumps(transport.sent))
    finally:
        dist.destroy_process_group()


def train_decentralized(
    parts: list[tuple[np.ndarray, np.ndarray]], *, hp: dict[str, Any], work_dir: Path
) -> list[dict[str, Any]]:
    """Train privGAN with one process per owner; returns each owner's final state dicts.

    Args:
        parts: each owner's (x, y); written to that owner's own file, read only by that owner's process.
        hp: hyperparameters (seed, epochs, batch_size, lr, beta1, lam, dp_delay, label_smoothing, z_dim,
            num_classes, g_hidden, d_hidden).
        work_dir: where owners' files, states and transport logs go.
    """
    import torch.multiprocessing as mp

    work_dir.mkdir(parents=True, exist_ok=True)
    b = [min(hp["batch_size"], len(x)) for x, _ in parts]
    steps = max(len(x) // bk for (x, _), bk in zip(parts, b))  # an epoch = the largest owner's batches
    port = free_port()
    jobs = []
    for k, (x, y) in enumerate(parts):
        f = work_dir / f"owner{k}_data.npz"
        np.savez(f, x=x, y=y)
        jobs.append(OwnerJob(str(f), str(work_dir), dict(hp), steps, sum(b), port))
    try:
        mp.spawn(_owner_process, args=(jobs,), nprocs=len(parts), join=True)
    finally:
        for j in jobs:
            Path(j.data_file).unlink(missing_ok=True)  # owners' data copies do not outlive training
    return [torch.load(work_dir / f"owner{k}.pt", map_location="cpu", weights_only=True) for k in range(len(parts))]
