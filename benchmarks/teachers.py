"""Benchmark: teacher-ensemble throughput of dpsyn.nets.ensemble.TeacherEnsemble (vmap over stacked parameters)
against a Python loop over the same teacher modules (same weights), for G-PATE's two per-step teacher operations:

* train: one Adam step of every teacher on its own real rows (``--teacher-batch``) + the shared fakes (``--batch``);
* input_gradients: every teacher's gradient of -BCE(D_i(x), 1) w.r.t. each of ``--batch`` shared samples.

Throughput = teachers x samples per second (samples = real + fake rows for train, generated samples for input
gradients); the ratio is vectorised / loop. Both sides use the same Adam (fused where available).
Usage: python benchmarks/teachers.py [--teachers 100 1000 2000] [--arch conv|mlp|dcgan] [--device cpu|cuda]
       [--threads 1] [--repeats 3]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch
from torch import nn
from torch.nn import functional as F

from dpsyn.nets.dcgan import CondDCGANDiscriminator
from dpsyn.nets.ensemble import CondConvTeacher, CondMLPTeacher, TeacherEnsemble
from dpsyn.testing import assert_close_but_for_kinks


def make_teacher(arch: str, width: int) -> Callable[[], nn.Module]:
    if arch == "mlp":
        return lambda: CondMLPTeacher(num_classes=10, shape=(1, 28, 28), hidden=(width,))
    if arch == "conv":
        return lambda: CondConvTeacher(num_classes=10, channels=1, resolution=28, ndf=width)
    return lambda: CondDCGANDiscriminator(num_classes=10, channels=1, resolution=28, ndf=width)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def median_time(fn: Callable[[], object], repeats: int, device: torch.device) -> float:
    fn()  # warm-up
    _sync(device)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        _sync(device)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def bench(n: int, args: argparse.Namespace, device: torch.device) -> dict[str, float]:
    torch.manual_seed(0)
    modules = [make_teacher(args.arch, args.width)().to(device) for _ in range(n)]
    ens = TeacherEnsemble.from_modules(modules, lr=1e-3, chunk_size=args.chunk)  # copies: same initial weights
    opts = [torch.optim.Adam(m.parameters(), lr=1e-3, betas=(0.5, 0.999), fused=True) for m in modules]
    tb, b = args.teacher_batch, args.batch
    real_x, real_y = torch.rand(n, tb, 1, 28, 28, device=device), torch.randint(0, 10, (n, tb), device=device)
    fake_x, fake_y = torch.rand(b, 1, 28, 28, device=device), torch.randint(0, 10, (b,), device=device)
    ones, zeros = torch.ones(tb, device=device), torch.zeros(b, device=device)

    def loop_train() -> None:
        for i, (m, opt) in enumerate(zip(modules, opts)):
            opt.zero_grad(set_to_none=True)
            loss = F.binary_cross_entropy_with_logits(m(real_x[i], real_y[i]), ones)
            loss = loss + F.binary_cross_entropy_with_logits(m(fake_x, fake_y), zeros)
            loss.backward()
            opt.step()

    def loop_grads() -> torch.Tensor:
        out = []
        for m in modules:
            x = fake_x.clone().requires_grad_(True)
            (g,) = torch.autograd.grad(F.logsigmoid(m(x, fake_y)).sum(), x)
            out.append(g)
        return torch.stack(out)

    # the two agree before timing (same weights, same inputs), but for the rare element where float32 rounding puts
    # a pre-activation on the other side of a LeakyReLU kink in one of the two orders of operations (seen at 2000
    # teachers: 99 of 25,088,000 elements, one pre-activation of 4.6e-9)
    assert_close_but_for_kinks(ens.input_gradients(fake_x, fake_y), loop_grads(), rtol=1e-4, atol=1e-6,
                               what=f"input gradients of {n} teachers, vectorised vs loop")
    r = args.repeats
    t = {
        "loop_train": median_time(loop_train, r, device),
        "vec_train": median_time(lambda: ens.train_step(real_x, real_y, fake_x, fake_y), r, device),
        "loop_grads": median_time(loop_grads, r, device),
        "vec_grads": median_time(lambda: ens.input_gradients(fake_x, fake_y), r, device),
    }
    return {
        **t,
        "train_tput_loop": n * (tb + b) / t["loop_train"],
        "train_tput_vec": n * (tb + b) / t["vec_train"],
        "grads_tput_loop": n * b / t["loop_grads"],
        "grads_tput_vec": n * b / t["vec_grads"],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--teachers", type=int, nargs="+", default=[100, 1000, 2000])
    ap.add_argument("--arch", choices=("mlp", "conv", "dcgan"), default="conv", help="g_pate's teacher_arch")
    ap.add_argument("--width", type=int, default=None, help="mlp hidden width / conv ndf (default: g_pate's: 32 / 4)")
    ap.add_argument("--teacher-batch", type=int, default=15, help="real rows per teacher (G-PATE, 4000 teachers: 15)")
    ap.add_argument("--batch", type=int, default=16, help="generated samples (shared by all teachers)")
    ap.add_argument("--chunk", type=int, default=100, help="teachers per batched call (g_pate's teacher_chunk)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (0: leave torch's default)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--keep", action="store_true", help="write the rows to docs/data/speed_teachers.csv (docs/speed.md)")
    args = ap.parse_args()
    if args.width is None:
        args.width = 32 if args.arch == "mlp" else 4
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    print(
        f"teacher ensemble ({args.arch}, width {args.width}) vs a Python loop, {args.device}, "
        f"{torch.get_num_threads()} thread(s), teacher batch {args.teacher_batch} real + {args.batch} fake, "
        f"median of {args.repeats}; throughput = teachers x samples / s"
    )
    print(f"{'teachers':>8} | {'train loop':>11} {'vectorised':>11} {'ratio':>6} | {'grads loop':>11} {'vectorised':>11} {'ratio':>6}")
    kept = []
    for n in args.teachers:
        r = bench(n, args, device)
        kept.append({"arch": args.arch, "width": args.width, "threads": torch.get_num_threads(), "teachers": n,
                     "training step": f"{r['loop_train'] / r['vec_train']:.1f}x",
                     "input gradients": f"{r['loop_grads'] / r['vec_grads']:.1f}x"})
        print(
            f"{n:>8} | {r['train_tput_loop']:>11.0f} {r['train_tput_vec']:>11.0f} "
            f"{r['loop_train'] / r['vec_train']:>5.1f}x | {r['grads_tput_loop']:>11.0f} {r['grads_tput_vec']:>11.0f} "
            f"{r['loop_grads'] / r['vec_grads']:>5.1f}x",
            flush=True,
        )
    if args.keep:
        from dpsyn.results.kept import keep_rows

        print(f"kept in {keep_rows('speed_teachers', kept, key=('arch', 'width', 'threads', 'teachers'))}")


if __name__ == "__main__":
    main()
