"""Benchmark: cost of one DP-SGD discriminator step of dp_gan relative to a non-private step, in the same run.

Prints the ratio (DP step time / plain step time) for Opacus's per-sample-gradient modes available here:
hooks (GradSampleModule's backward hooks, what dp_gan uses) and functorch (vmap over per-sample grads), each with
dp_gan's D step: forward on real + fake (paired rows), backward, clip, noise, Adam update. "split" measures the
alternative of per-sample gradients for the real rows only, the (data-independent) fake rows' gradient added
unclipped after the noise.
Usage: python benchmarks/dpsgd_step.py [--batch 128] [--steps 30] [--threads N]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from torch.nn import functional as F

from dpsyn.nets.dcgan import CondDCGANDiscriminator


def make_step(mode: str, batch: int):
    torch.manual_seed(0)
    D = CondDCGANDiscriminator(num_classes=10, channels=1, resolution=28, ndf=32)
    opt = torch.optim.Adam(D.parameters(), lr=2e-4)
    if mode != "plain":
        from opacus import GradSampleModule
        from opacus.optimizers import DPOptimizer

        D = GradSampleModule(D, loss_reduction="sum", force_functorch=(mode == "functorch"))  # split: hooks
        opt = DPOptimizer(opt, noise_multiplier=1.0, max_grad_norm=1.0, expected_batch_size=batch)
    x = torch.rand(batch, 1, 28, 28)
    fake = torch.rand(batch, 1, 28, 28)
    y = torch.randint(0, 10, (batch,))

    if mode == "split":
        # per-sample gradients for the real rows only; the fake rows' gradient (data-independent) added unclipped
        def step() -> None:
            opt.zero_grad(set_to_none=True)
            D.disable_hooks()
            F.binary_cross_entropy_with_logits(D(fake, y), torch.zeros(batch), reduction="sum").backward()
            fake_grads = [p.grad.detach().clone() for p in D.parameters()]
            for p in D.parameters():
                p.grad = None
            D.enable_hooks()
            F.binary_cross_entropy_with_logits(D(x, y), torch.ones(batch), reduction="sum").backward()
            opt.pre_step()
            for p, g in zip(D.parameters(), fake_grads):
                p.grad += g / batch
            opt.original_optimizer.step()

        return step

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        loss = F.binary_cross_entropy_with_logits(D(x, y), torch.ones(batch), reduction="sum")
        loss = loss + F.binary_cross_entropy_with_logits(D(fake, y), torch.zeros(batch), reduction="sum")
        loss.backward()
        opt.step()

    return step


def time_step(step, steps: int) -> float:
    for _ in range(3):
        step()  # warm-up
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: leave torch's default)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    base = time_step(make_step("plain", args.batch), args.steps)
    print(f"dp_gan discriminator step, batch {args.batch}, {torch.get_num_threads()} threads, median of {args.steps}")
    print(f"  plain (non-private)  {base * 1e3:8.2f} ms   1.00x")
    for mode in ("hooks", "functorch", "split"):
        t = time_step(make_step(mode, args.batch), args.steps)
        print(f"  DP-SGD {mode:<13} {t * 1e3:8.2f} ms   {t / base:.2f}x")


if __name__ == "__main__":
    main()
