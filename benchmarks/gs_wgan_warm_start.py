"""Benchmark: GS-WGAN's warm start (dpsyn.methods.gs_wgan.warm_start) with its critics warmed up one at a time
(``chunk`` 1, the authors' loop) against ``chunk`` critics a ``torch.func.vmap`` call (``method.warm_start_chunk``).

Both give the same critics (tests/test_gs_wgan.py); this measures the time only, as milliseconds per critic-iteration
(``critic_steps`` WGAN-GP steps of one critic plus one step of its throw-away generator) and the ratio loop / chunk,
in the same run. The default sizes are the embedded fmnist run's: critics of width 16, generators of width 32 with
G's 7x7 band, batch 32, 5 critic steps.
Usage: python benchmarks/gs_wgan_warm_start.py [--critics 40] [--chunks 10 40] [--iterations 2] [--device cpu|cuda]
       [--threads 1] [--ndf 16] [--ngf 32]
"""

from __future__ import annotations

import argparse
import platform
import time

import torch

from dpsyn.machine import cpu_model
from dpsyn.methods.gs_wgan import CriticBank, warm_start
from dpsyn.nets.dcgan import CondDCGANGenerator
from dpsyn.data.partitions import KeyedPartitions, partition_key
from dpsyn.nets.ensemble import CondConvTeacher
from dpsyn.nets.lowpass import LowPassOutput, dct_basis


def run(chunk: int, args: argparse.Namespace, device: torch.device) -> tuple[float, torch.Tensor]:
    """Seconds for the whole warm start, and the critics it left (flattened)."""
    torch.manual_seed(0)
    n = args.critics * args.rows
    x, y = torch.rand(n, 1, 28, 28, device=device), torch.randint(0, 10, (n,), device=device)
    parts = KeyedPartitions(torch.arange(n).numpy(), args.critics, key=partition_key(0, "critics"))
    bank = CriticBank(lambda: CondConvTeacher(num_classes=10, channels=1, resolution=28, ndf=args.ndf), args.critics,
                      lr=1e-3, betas=(0.5, 0.9), device=device)

    def make_generator() -> torch.nn.Module:
        g = CondDCGANGenerator(z_dim=10, num_classes=10, channels=1, resolution=28, ngf=args.ngf)
        return LowPassOutput(g, dct_basis((1, 28, 28), 7)) if args.band else g

    if device.type == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    warm_start(bank, parts, x=x, y=y, make_generator=make_generator, iterations=args.iterations,
               critic_steps=args.critic_steps, batch=args.batch, z_dim=10, num_classes=10, gp_weight=10.0,
               drift=1e-3, lr_g=1e-3, betas=(0.5, 0.9), generator=torch.Generator().manual_seed(0), chunk=chunk,
               progress=True)
    if device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - t0, torch.stack([bank.flat(k) for k in range(bank.k)]).cpu()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--critics", type=int, default=40)
    ap.add_argument("--chunks", type=int, nargs="+", default=[10, 40])
    ap.add_argument("--iterations", type=int, default=2, help="warm-start iterations per critic")
    ap.add_argument("--rows", type=int, default=60, help="rows a partition (fmnist with 1000 critics: 60)")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--critic-steps", type=int, default=5)
    ap.add_argument("--ndf", type=int, default=16)
    ap.add_argument("--ngf", type=int, default=32)
    ap.add_argument("--no-band", dest="band", action="store_false", help="all pixels (the authors' generator)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (0: leave torch's default)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else f"{cpu_model()} ({platform.machine()})"
    print(f"GS-WGAN warm start, {args.critics} critics x {args.iterations} iterations, {where}, "
          f"{torch.get_num_threads()} thread(s); critics ndf {args.ndf}, generators ngf {args.ngf}"
          f"{' with the 7x7 band' if args.band else ''}, batch {args.batch}, {args.critic_steps} critic steps")
    base_s, base = run(1, args, device)
    per = 1000 * base_s / (args.critics * args.iterations)
    print(f"{'chunk':>6} | {'ms / critic-iteration':>22} | {'loop / chunk':>12} | {'max |critic - loop|':>20}")
    print(f"{1:>6} | {per:>22.1f} | {1.0:>11.2f}x | {0.0:>20.2e}", flush=True)
    for chunk in args.chunks:
        s, critics = run(chunk, args, device)
        print(f"{chunk:>6} | {1000 * s / (args.critics * args.iterations):>22.1f} | {base_s / s:>11.2f}x | "
              f"{float((critics - base).abs().max()):>20.2e}", flush=True)


if __name__ == "__main__":
    main()
