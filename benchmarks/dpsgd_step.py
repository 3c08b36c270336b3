"""Benchmark: cost of one DP-SGD discriminator step of dp_gan relative to a non-private step, in the same run.

Prints the ratio (DP step time / plain step time) of each way dpsyn can make the step, with dp_gan's discriminator
(conditional DCGAN, ndf 32, 28x28) and the code the methods run (:class:`dpsyn.lit.gan.GANModule`'s two
constructions, :func:`dpsyn.lit.gan.split_dp_step` and Opacus's ``DPOptimizer`` as
:func:`dpsyn.lit.dpsgd.dp_optimizer` builds it):

* ``paired``: real row i and fake row i clipped together (Opacus's DCGAN example), per-sample gradients for all 2B
  rows (``method.dpsgd_step=paired``, the default);
* ``split``: the real rows clipped and noised; m fake rows clipped per row (no noise: nothing private in them),
  averaged and added (``method.dpsgd_step=split``, m = ``method.split_fake_rows``, default B; ``split_m32``: m = 32);
* with per-sample gradients from dpsyn's one-pass engine (``fused``, :mod:`dpsyn.lit.fused_grad_sample`, paired
  only; the default) or Opacus's ``hooks`` or ``functorch`` (``method.grad_sample_mode``).

The steps are timed in turns (one call of each, round after round), so a machine that speeds up or slows down
during the run moves every mode alike. The line of the configured default (conf/method/dp_gan.yaml) is marked
``(default)``. Ratios differ between CPUs, so the CPU model is printed first.
Usage: python benchmarks/dpsgd_step.py [--batch 128] [--steps 30] [--threads N] [--keep]
``--keep`` also writes the run's rows into docs/data/speed_dpsgd_step.csv (replacing the rows of the same thread
count), the table docs/speed.md shows after ``make docs``.
"""

from __future__ import annotations

import argparse
import statistics
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import torch
from torch.nn import functional as F

from dpsyn.lit import fused_grad_sample
from dpsyn.lit.dpsgd import dp_optimizer
from dpsyn.lit.gan import split_dp_step
from dpsyn.machine import cpu_model
from dpsyn.nets.dcgan import CondDCGANDiscriminator

MODES: tuple[tuple[str, str], ...] = (
    ("paired", "fused"), ("paired", "hooks"), ("paired", "functorch"), ("split", "hooks"), ("split", "functorch"),
    ("split_m32", "hooks"), ("split_m32", "functorch"),
)
"""(construction, per-sample engine); ``split_m32``: a split step with 32 fake rows (``method.split_fake_rows=32``)."""


def default_mode() -> tuple[str, str]:
    """(dpsgd_step, grad_sample_mode) of ``method=dp_gan`` (its yaml over its schema)."""
    from dpsyn.config import load_group

    cfg = load_group("method", "dp_gan")
    return str(cfg.dpsgd_step), str(cfg.grad_sample_mode)


def _bce(logits: torch.Tensor, target: float) -> torch.Tensor:
    return F.binary_cross_entropy_with_logits(logits, torch.full_like(logits, target), reduction="sum")


def make_step(step_kind: str, engine: str, batch: int, device: str = "cpu") -> Callable[[], None]:
    """One discriminator step of the given kind (``plain``, or a DP construction and per-sample engine)."""
    torch.manual_seed(0)
    D = CondDCGANDiscriminator(num_classes=10, channels=1, resolution=28, ndf=32).to(device)
    x = torch.rand(batch, 1, 28, 28, device=device)
    fake = torch.rand(batch, 1, 28, 28, device=device)
    y = torch.randint(0, 10, (batch,), device=device)
    m = min(32, batch) if step_kind == "split_m32" else batch
    fake_m, y_m = fake[:m], y[:m]
    adam = torch.optim.Adam(D.parameters(), lr=2e-4)
    if step_kind == "plain":
        def plain() -> None:
            adam.zero_grad(set_to_none=True)
            ((_bce(D(x, y), 1.0) + _bce(D(fake, y), 0.0)) / batch).backward()
            adam.step()
        return plain

    gen = torch.Generator(device=device).manual_seed(1)
    from opacus import GradSampleModule

    gsm = GradSampleModule(D, loss_reduction="sum", force_functorch=engine == "functorch")
    opt = dp_optimizer(torch.optim.Adam(gsm.parameters(), lr=2e-4), noise_multiplier=1.0, max_grad_norm=1.0,
                       expected_batch_size=batch, generator=gen)
    if step_kind.startswith("split"):
        def split() -> None:
            split_dp_step(opt, gsm, fake_loss=lambda: _bce(gsm(fake_m, y_m), 0.0),
                          real_loss=lambda: _bce(gsm(x, y), 1.0))
        return split

    if engine == "fused":
        rows, labels = torch.cat([x, fake]), torch.cat([y, y])
        targets = torch.cat([torch.ones(batch, device=device), torch.zeros(batch, device=device)])

        def paired_fused() -> None:
            opt.zero_grad(set_to_none=True)
            fused_grad_sample.set_grad_samples(
                opt, fused_grad_sample.grad_samples(gsm, rows, labels, targets, paired=True))
            opt.step()
        return paired_fused

    def paired() -> None:
        opt.zero_grad(set_to_none=True)
        (_bce(gsm(x, y), 1.0) + _bce(gsm(fake, y), 0.0)).backward()
        opt.step()
    return paired


def time_steps(steps_by_name: dict[str, Callable[[], None]], rounds: int,
               sync: Callable[[], None] = lambda: None) -> dict[str, float]:
    """Median wall time of each step over ``rounds`` rounds, after 3 warm-up calls each. Each round calls every step
    once, in turn, so that drift in the machine's speed (other tenants, frequency) falls on all of them alike."""
    for step in steps_by_name.values():
        for _ in range(3):
            step()
    sync()
    times: dict[str, list[float]] = {name: [] for name in steps_by_name}
    for _ in range(rounds):
        for name, step in steps_by_name.items():
            t0 = time.perf_counter()
            step()
            sync()
            times[name].append(time.perf_counter() - t0)
    return {name: statistics.median(t) for name, t in times.items()}


def ratios(batch: int, steps: int, device: str = "cpu") -> dict[str, float | str]:
    """``{"plain_ms": ..., "<step>/<engine>": ratio or "failed: ..."}``, all measured in this call."""
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    built: dict[str, Callable[[], None]] = {"plain": make_step("plain", "", batch, device)}
    out: dict[str, float | str] = {}
    for kind, engine in MODES:
        name = f"{kind}/{engine}"
        try:
            step = make_step(kind, engine, batch, device)
            step()  # an engine Opacus cannot run on this device fails here, before the timed rounds
            built[name] = step
        except Exception as e:  # noqa: BLE001 - reported, not fatal
            out[name] = f"failed: {type(e).__name__}: {str(e).splitlines()[0][:100]}"
    med = time_steps(built, steps, sync)
    base = med.pop("plain")
    res: dict[str, float | str] = {"plain_ms": base * 1e3}
    for kind, engine in MODES:
        name = f"{kind}/{engine}"
        res[name] = med[name] / base if name in med else out[name]
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: leave torch's default)")
    ap.add_argument("--keep", action="store_true", help="write the rows to docs/data/speed_dpsgd_step.csv")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    # Opacus's full backward hooks note that the input images need no gradient: true, and harmless here
    warnings.filterwarnings("ignore", message="Full backward hook is firing")
    print(f"CPU: {cpu_model()}; torch {torch.__version__}, {torch.get_num_threads()} threads")
    res = ratios(args.batch, args.steps)
    default = "/".join(default_mode())
    print(f"dp_gan discriminator step, batch {args.batch}, median of {args.steps} rounds")
    print(f"  plain (non-private)           {res['plain_ms']:8.2f} ms   1.00x")
    for key, r in res.items():
        if key == "plain_ms":
            continue
        mark = "  (default)" if key == default else ""
        line = f"{r * res['plain_ms']:8.2f} ms   {r:.2f}x" if isinstance(r, float) else r
        print(f"  DP-SGD {key:<22} {line}{mark}")
    if args.keep:
        print(f"kept in {keep(res, default, batch=args.batch, steps=args.steps)}")


def keep(res: dict, default: str, *, batch: int, steps: int, path: Path | None = None) -> Path:
    """The run's rows into docs/data/speed_dpsgd_step.csv, replacing earlier rows of the same thread count."""
    from dpsyn.results.kept import keep_rows

    threads = torch.get_num_threads()
    rows = [{"threads": threads, "mode": "plain", "ms": f"{res['plain_ms']:.2f}", "ratio": "1.00", "default": "",
             "batch": batch, "steps": steps}]
    for key, r in res.items():
        if key != "plain_ms" and isinstance(r, float):
            rows.append({"threads": threads, "mode": key, "ms": f"{r * res['plain_ms']:.2f}", "ratio": f"{r:.2f}",
                         "default": "yes" if key == default else "", "batch": batch, "steps": steps})
    return keep_rows("speed_dpsgd_step", rows, key=("threads",), path=path)


if __name__ == "__main__":
    main()
