"""Benchmark: one DP-SGD step of ``dp_gan``'s ``arch=dib`` discriminator (:class:`dpsyn.nets.dib.DIBDiscriminator`,
DPImageBench's GroupNorm ResNet) relative to a plain step, in the same run, at full width (160) and a reduced one.

dpsyn's fused engine covers the DCGAN discriminator only, so ``arch=dib`` runs on Opacus's per-sample gradients.
Printed, as ratios to a plain (non-private) Adam step on the same 2B rows:

* ``hooks`` / ``functorch``: Opacus's ``GradSampleModule``, the paired step dp_gan makes (real row i + fake row i
  clipped together), through ``DPOptimizer`` as :func:`dpsyn.lit.dpsgd.dp_optimizer` builds it;
* ``ghost``: Opacus's fast gradient clipping (``GradSampleModuleFastGradientClipping`` with ghost clipping,
  ``DPLossFastGradientClipping``, ``DPOptimizerFastGradientClipping``): two backward passes, no per-sample gradients
  stored for the layers with a norm sampler (in opacus 1.6 Linear and Embedding only; this net's convs and GroupNorms
  get per-sample gradients to take their norms). Its loss is one per row, so it is timed on the 2B rows clipped one
  by one, not paired: a cost comparison, not dp_gan's step.

The modes are timed in turns (one call of each, round after round), the median reported. The CPU model is printed
first. Usage: python benchmarks/dib_step.py [--batch 64] [--steps 3] [--widths 160,32] [--threads N]
"""

from __future__ import annotations

import argparse
import statistics
import time
import warnings
from collections.abc import Callable

import torch
from torch import nn
from torch.nn import functional as F

from dpsyn.lit.dpsgd import dp_optimizer
from dpsyn.machine import cpu_model
from dpsyn.nets.dib import DIBDiscriminator

MODES = ("plain", "hooks", "functorch", "ghost")


def _bce(logits: torch.Tensor, target: float) -> torch.Tensor:
    return F.binary_cross_entropy_with_logits(logits, torch.full_like(logits, target), reduction="sum")


def make_step(mode: str, *, batch: int, ndf: int, device: str = "cpu", clip: float = 1e-3,
              noise: float = 1.0) -> Callable[[], None]:
    """One discriminator step of ``mode`` (:data:`MODES`) on a fixed batch of ``batch`` real and ``batch`` fake rows."""
    torch.manual_seed(0)
    D = DIBDiscriminator(num_classes=10, channels=1, resolution=28, ndf=ndf).to(device)
    x, fake = torch.rand(batch, 1, 28, 28, device=device), torch.rand(batch, 1, 28, 28, device=device)
    y = torch.randint(0, 10, (batch,), device=device)
    adam = torch.optim.Adam(D.parameters(), lr=5e-4, betas=(0.0, 0.999))
    gen = torch.Generator(device=device).manual_seed(1)
    if mode == "plain":
        def plain() -> None:
            adam.zero_grad(set_to_none=True)
            ((_bce(D(x, y), 1.0) + _bce(D(fake, y), 0.0)) / batch).backward()
            adam.step()
        return plain
    if mode in ("hooks", "functorch"):
        from opacus import GradSampleModule

        gsm = GradSampleModule(D, loss_reduction="sum", force_functorch=mode == "functorch")
        opt = dp_optimizer(torch.optim.Adam(gsm.parameters(), lr=5e-4, betas=(0.0, 0.999)), noise_multiplier=noise,
                           max_grad_norm=clip, expected_batch_size=batch, generator=gen)

        def paired() -> None:
            opt.zero_grad(set_to_none=True)
            (_bce(gsm(x, y), 1.0) + _bce(gsm(fake, y), 0.0)).backward()
            opt.step()
        return paired
    if mode == "ghost":
        from opacus.grad_sample import GradSampleModuleFastGradientClipping
        from opacus.optimizers import DPOptimizerFastGradientClipping
        from opacus.utils.fast_gradient_clipping_utils import DPLossFastGradientClipping

        gsm = GradSampleModuleFastGradientClipping(D, loss_reduction="sum", max_grad_norm=clip,
                                                   use_ghost_clipping=True)
        opt = DPOptimizerFastGradientClipping(
            torch.optim.Adam(gsm.parameters(), lr=5e-4, betas=(0.0, 0.999)), noise_multiplier=noise,
            max_grad_norm=clip, expected_batch_size=2 * batch, loss_reduction="sum", generator=gen)
        criterion = DPLossFastGradientClipping(gsm, opt, nn.BCEWithLogitsLoss(reduction="sum"), loss_reduction="sum")
        rows, ys = torch.cat([x, fake]), torch.cat([y, y])
        targets = torch.cat([torch.ones(batch, device=device), torch.zeros(batch, device=device)])

        def ghost() -> None:
            opt.zero_grad(set_to_none=True)
            criterion(gsm(rows, ys), targets).backward()
            opt.step()
        return ghost
    raise ValueError(f"mode={mode!r}; allowed: {', '.join(MODES)}")


def time_modes(*, batch: int, ndf: int, steps: int, modes: tuple[str, ...] = MODES) -> dict[str, float]:
    """Median seconds per step of each mode, timed in turns after one warm-up call each."""
    fns = {m: make_step(m, batch=batch, ndf=ndf) for m in modes}
    for fn in fns.values():
        fn()
    times: dict[str, list[float]] = {m: [] for m in modes}
    for _ in range(steps):
        for m, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            times[m].append(time.perf_counter() - t0)
    return {m: statistics.median(t) for m, t in times.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=64, help="real rows (as many fake rows) a step")
    ap.add_argument("--steps", type=int, default=3, help="timed rounds (after one warm-up call of each mode)")
    ap.add_argument("--widths", default="160,32", help="discriminator widths (ndf), comma-separated")
    ap.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore")  # Opacus's full-backward-hook and secure-RNG notices
    print(f"CPU: {cpu_model()} | torch {torch.__version__} | {torch.get_num_threads()} threads | batch "
          f"{args.batch} real + {args.batch} fake, 28x28x1")
    for ndf in (int(w) for w in args.widths.split(",")):
        params = sum(p.numel() for p in DIBDiscriminator(num_classes=10, channels=1, resolution=28,
                                                          ndf=ndf).parameters())
        t = time_modes(batch=args.batch, ndf=ndf, steps=args.steps)
        print(f"dib D ndf {ndf} ({params:,} parameters): plain {t['plain']:.3f} s/step")
        for m in MODES[1:]:
            print(f"  {m:9s} {t[m]:.3f} s/step  {t[m] / t['plain']:.2f}x plain")


if __name__ == "__main__":
    main()
