"""One short check of dpsyn on a GPU (``make gpu-check``): every method, the paper profiles' shapes, the speed ratios.

Run from the repository root with the repository on the path: ``PYTHONPATH=. python benchmarks/gpu_check.py``.
It writes ``gpu-check.json`` and ``gpu-check.md`` into ``--out`` (default: ``$OUT`` when set, else the repository
root) after EVERY check, atomically, so a run cut short keeps what it measured. It starts no new check once the next
one's time budget would pass the overall limit (``--limit``, 300 s), and a check past its own budget is stopped
(SIGALRM) and recorded as failed.

Checks, in order:

* ``deps``: which dependencies import here, with their versions. A check whose imports are missing is skipped with
  the missing module's name (a ModuleNotFoundError inside a check counts as missing, not as a failure).
* ``method/<name>``: every registered method (``dpsyn.methods.METHODS``) end to end through
  ``dpsyn.task.run`` on its embedded dataset with the tiny overrides of ``tests/tiny.py`` (the table the test
  suite uses), ``trainer=gpu`` (``trainer=cpu`` in CPU mode), one epoch of at most 5 batches. Global forward
  pre-hooks record, during ``fit`` and ``sample``, the device of every module call's parameters, buffers and tensor
  inputs: any call off the GPU fails the check and names the module classes (a silent CPU fallback). Also: the run
  wrote result.json, and epsilon spent <= the target (a non-private reference: inf, flagged). Measured: fit and
  sample seconds, optimizer steps/s (torch.optim steps during fit), rows/s through the outermost modules, samples/s
  of ``sample``, and the peak GPU memory (``torch.cuda.max_memory_allocated``). Fashion-MNIST is read where
  installed; elsewhere (a GPU machine) random stand-in IDX files of its format are written to a temporary folder.
* ``paper/*``: the ``_paper`` profiles' network shapes, random weights, synthetic inputs:
  ``paper/g_pate_mnist`` (long2021_*_paper: G-PATE at MNIST eps=1 from ``conf/method_dataset/g_pate_mnist.yaml``,
  4000 of the authors' ~0.55M-parameter teachers: one ensemble train step on 15 real + 15 fake rows per teacher,
  every teacher's input gradients, one generator forward/backward), ``paper/dp_gan_dib`` (the dib profile's DP-GAN
  on DPImageBench's networks, ``method.arch=dib``: one DP discriminator step with Opacus's hooks and one generator
  step at batch 4096, and the hours of a full run at dpsyn's 1950/390 steps and DPImageBench's 2100/420),
  ``paper/gs_wgan_1000_critics`` (run last,
  after the ratios: long2021_table1_paper and the dib profile: GS-WGAN's 1000 critics at width 64 on the device, 20
  warm-start and 20 main iterations timed, and the hours the 2M warm-start iterations and the 20000 iterations would
  take at that pace; the warm start also with the profile's ``method.warm_start_chunk`` critics a vmap call, its
  speed-up over one at a time and its hours), ``paper/wu2023_swav_32px`` and
  ``paper/wu2023_swav_128px`` (wu2023_table1_paper: the SwAV ResNet-50 adapter loading a stand-in checkpoint of
  SwAV's layout, random weights with DataParallel's ``module.`` prefix, then encoding a batch of CIFAR-10-sized
  32 px and Pet/Car/Bird-sized 128 px images resized to the configured 224 px; IC-GAN's BigGAN generator needs
  ic_gan's code and is not built), ``paper/pe_cifar10_histogram`` (lin2023_fig4_paper: PE's DP nearest-neighbour
  histogram at the paper's population, 50k synthetic vs 50k private 2048-d Inception-sized stand-in embeddings,
  class-conditional over 10 classes, torch backend on the device; improved-diffusion's 270M model needs openai's
  code and is not built).
* ``ratio/*``: ``ratio/dpsgd_vs_plain`` (benchmarks/dpsgd_step.py's steps, batch 128, each DP-SGD mode / a plain
  step), ``ratio/teachers_vmap_vs_loop`` (benchmarks/teachers.py's ``bench`` at 2000 teachers; goal >= 10x),
  ``ratio/pe_faiss_gpu_vs_cpu`` (PE's histogram, faiss's GPU index vs its CPU index, 50k x 50k x 64-d, skipped when
  faiss has no GPU support).

Without CUDA it prints ``no CUDA device: nothing checked`` and exits 3 (only torch is imported before that).
``--device cpu`` (or ``DPSYN_GPU_CHECK_DEVICE=cpu``) runs the same checks on the CPU at the smallest sizes, so the
test suite can run the script's logic end to end (tests/test_gpu_check.py). Exit status: 0 when nothing failed,
1 when a check failed, 3 without CUDA.

What a GPU machine needs: torch (its own build) and dpsyn's dependencies. Images with torch, torchvision, numpy,
lightning, torchmetrics, scikit-learn, scipy and safetensors (this project's GPU machines have them) need only these
pure-Python wheels carried with the tree (``make gpu-check-wheels`` downloads them into ``.whl/``): hydra-core,
omegaconf, antlr4-python3-runtime (hydra's parser), opacus, dp-accounting; optional, for more checks: diffusers
(+ importlib-metadata) and torch-fidelity. faiss-gpu is a binary wheel tied to a CUDA version and too large to
carry; without it the faiss ratio is skipped (PE then uses the torch backend).

Usage: PYTHONPATH=. python benchmarks/gpu_check.py [--device cuda|cpu] [--out DIR] [--limit 300] [--only GLOB ...]
"""

from __future__ import annotations

import argparse
import fnmatch
import importlib
import importlib.util
import json
import math
import os
import platform
import signal
import sys
import tempfile
import time
import traceback
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

NO_CUDA = "no CUDA device: nothing checked"
REPO = Path(__file__).resolve().parents[1]
BENCH_DIR = Path(__file__).resolve().parent
DEPENDENCIES = ("torch", "torchvision", "numpy", "hydra", "omegaconf", "lightning", "opacus", "faiss", "diffusers",
                "torchmetrics", "torch_fidelity", "sklearn", "scipy", "safetensors", "dp_accounting", "transformers")
EPS = 1.0
TEACHERS_GOAL = 10.0


# ------------------------------------------------------------------------------------------------------ the report


class Report:
    """The results so far, rewritten (json + md, each atomically) after every check."""

    def __init__(self, out_dir: Path, header: dict[str, Any]) -> None:
        self.out_dir = out_dir
        self.header = header
        self.checks: list[dict[str, Any]] = []
        out_dir.mkdir(parents=True, exist_ok=True)
        self.write()

    @property
    def json_path(self) -> Path:
        return self.out_dir / "gpu-check.json"

    @property
    def md_path(self) -> Path:
        return self.out_dir / "gpu-check.md"

    def add(self, entry: dict[str, Any]) -> None:
        self.checks.append(entry)
        self.write()

    def finish(self, **fields: Any) -> None:
        self.header.update(fields)
        self.write()

    def as_dict(self) -> dict[str, Any]:
        counts = Counter(c["status"] for c in self.checks)
        return {**self.header, "summary": dict(counts), "checks": self.checks}

    def write(self) -> None:
        data = self.as_dict()
        _atomic_write(self.json_path, json.dumps(data, indent=2, default=_jsonable) + "\n")
        _atomic_write(self.md_path, render_markdown(data))


def _jsonable(obj: Any) -> Any:
    if isinstance(obj, float) and not math.isfinite(obj):
        return str(obj)
    if isinstance(obj, Path):
        return str(obj)
    return repr(obj)


def _atomic_write(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, dict):
        return ", ".join(f"{k} {_fmt(v)}" for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return ", ".join(_fmt(v) for v in value)
    return str(value)


def render_markdown(data: dict[str, Any]) -> str:
    lines = ["# dpsyn GPU check", ""]
    for key in ("device", "device_name", "mode", "started", "state", "elapsed_s", "limit_s", "torch", "python"):
        if key in data:
            lines.append(f"- {key}: {_fmt(data[key])}")
    lines.append(f"- summary: {_fmt(data.get('summary', {})) or 'no check finished yet'}")
    lines += ["", "| check | status | s | what was measured / why |", "| --- | --- | --- | --- |"]
    for c in data["checks"]:
        what = c.get("reason") or _fmt(c.get("measured", {}))
        if c.get("failures"):
            what = "; ".join(c["failures"]) + (f" ({what})" if what else "")
        lines.append(f"| {c['name']} | {c['status']} | {c.get('seconds', 0):.1f} | {what.replace('|', '/')} |")
    lines.append("")
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------------------ the runner


class CheckTimeout(BaseException):
    """A check ran past its own time budget (a BaseException: the ``except Exception`` of the code under check must
    not swallow it)."""


class CheckFailed(Exception):
    """A check's assertion failed; ``failures`` lists what, ``measured`` what was measured before."""

    def __init__(self, failures: list[str], measured: dict[str, Any]) -> None:
        super().__init__("; ".join(failures))
        self.failures, self.measured = failures, measured


@dataclass
class Check:
    name: str
    budget_s: float
    fn: Callable[[], dict[str, Any]]
    needs: tuple[str, ...] = ()


@contextmanager
def time_budget(seconds: float) -> Iterator[None]:
    """Raise :class:`CheckTimeout` in the main thread after ``seconds`` (SIGALRM; at the next Python bytecode)."""

    def on_alarm(signum: int, frame: Any) -> None:
        raise CheckTimeout(f"past its budget of {seconds:g} s")

    previous = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, max(seconds, 0.01))
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def missing_modules(names: tuple[str, ...]) -> list[str]:
    return [n for n in names if importlib.util.find_spec(n) is None]


def run_checks(checks: list[Check], report: Report, *, deadline: float, selected: Callable[[str], bool]) -> None:
    """Run ``checks`` in order, each recorded in ``report`` as passed, failed or skipped (with why)."""
    for check in checks:
        entry: dict[str, Any] = {"name": check.name, "budget_s": check.budget_s}
        left = deadline - time.monotonic()
        missing = missing_modules(check.needs)
        if not selected(check.name):
            report.add({**entry, "status": "skipped", "reason": "not selected (--only)", "seconds": 0.0})
            continue
        if missing:
            report.add({**entry, "status": "skipped", "reason": f"needs {', '.join(missing)} (not importable here)",
                        "seconds": 0.0})
            continue
        if left < check.budget_s:
            report.add({**entry, "status": "skipped", "seconds": 0.0,
                        "reason": f"not started: {max(left, 0):.0f} s left of the overall limit, budget {check.budget_s:g} s"})
            continue
        t0 = time.monotonic()
        try:
            with time_budget(check.budget_s):
                measured = check.fn()
            entry.update(status="passed", measured=measured)
        except ModuleNotFoundError as e:
            entry.update(status="skipped", reason=f"needs {e.name} (not importable here)")
        except SkipCheck as e:
            entry.update(status="skipped", reason=str(e))
        except CheckFailed as e:
            entry.update(status="failed", failures=e.failures, measured=e.measured)
        except CheckTimeout as e:
            entry.update(status="failed", failures=[str(e)])
        except Exception as e:  # noqa: BLE001 - one broken check must not stop the others
            entry.update(status="failed", failures=[f"{type(e).__name__}: {e}"],
                         traceback=traceback.format_exc(limit=8))
        entry["seconds"] = time.monotonic() - t0
        _print_line(entry)
        report.add(entry)


class SkipCheck(Exception):
    """A check that cannot run here (the reason is recorded)."""


def _print_line(entry: dict[str, Any]) -> None:
    why = entry.get("reason") or "; ".join(entry.get("failures", [])) or ""
    print(f"[{entry['status']:>7}] {entry['name']} ({entry.get('seconds', 0):.1f} s){': ' + why if why else ''}",
          flush=True)


# ---------------------------------------------------------------------------------------------------- the helpers


@dataclass
class Env:
    """What the checks share: the device, the sizes of this mode, the temporary folders."""

    device: str
    work: Path
    sizes: dict[str, int]
    data_dir: Path | None = None
    data_note: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def cuda(self) -> bool:
        return self.device == "cuda"


SIZES = {
    "cuda": dict(g_pate_teachers=0, gs_wgan_critics=0, gs_wgan_iterations=20, swav_batch=256, pe_n=50_000,
                 pe_dim=2048, dpsgd_batch=128, dpsgd_steps=20, teachers=2000, teachers_repeats=2, faiss_n=50_000,
                 dib_batch=0, dib_ngf=0, dib_ndf=0),
    # the smallest sizes that still run every code path (0 teachers: the paper's own count)
    "cpu": dict(g_pate_teachers=4, gs_wgan_critics=4, gs_wgan_iterations=2, swav_batch=2, pe_n=300, pe_dim=2048,
                dpsgd_batch=8, dpsgd_steps=2, teachers=8, teachers_repeats=1, faiss_n=300,
                dib_batch=8, dib_ngf=16, dib_ndf=8),
}


def load_benchmark(name: str) -> Any:
    """A module of benchmarks/ (``dpsgd_step``, ``teachers``, ``pe_histogram``): its functions are reused, not copied."""
    key = f"dpsyn_benchmarks_{name}"
    if key in sys.modules:
        return sys.modules[key]
    spec = importlib.util.spec_from_file_location(key, BENCH_DIR / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[key] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[key]
        raise
    return module


def compose(overrides: list[str]) -> Any:
    """``conf/train.yaml`` composed with ``overrides`` (no Hydra runtime)."""
    from hydra import compose as hydra_compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        cfg = hydra_compose(config_name="train", overrides=overrides)
    GlobalHydra.instance().clear()
    return cfg


def _sync(device: str) -> None:
    import torch

    if device == "cuda":
        torch.cuda.synchronize()


@contextmanager
def peak_memory(env: Env, out: dict[str, Any]) -> Iterator[None]:
    """``out["peak_mem_mb"]``: the peak of torch.cuda.max_memory_allocated over the block (GPU only)."""
    import torch

    if env.cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    try:
        yield
    finally:
        if env.cuda:
            torch.cuda.synchronize()
            out["peak_mem_mb"] = torch.cuda.max_memory_allocated() / 2**20


def _tensors(obj: Any) -> Iterator[Any]:
    import torch

    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, (list, tuple)):
        for item in obj:
            if isinstance(item, torch.Tensor):
                yield item


class DeviceRecorder:
    """Global module hooks: the device of each module call's parameters, buffers and tensor inputs, the rows fed to
    the outermost calls, and the torch.optim steps, while :meth:`phase` is active."""

    def __init__(self, expected: str) -> None:
        self.expected = expected
        self.calls: Counter[str] = Counter()  # device type -> module calls
        self.off: Counter[str] = Counter()  # module class -> calls with a tensor off the expected device
        self.rows = 0
        self.steps = 0
        self._depth = 0
        self._active = False
        self._handles: list[Any] = []

    def __enter__(self) -> DeviceRecorder:
        from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook
        from torch.optim.optimizer import register_optimizer_step_post_hook

        self._handles = [register_module_forward_pre_hook(self._pre), register_module_forward_hook(self._post),
                         register_optimizer_step_post_hook(self._step)]
        return self

    def __exit__(self, *exc: Any) -> None:
        for h in self._handles:
            h.remove()

    @contextmanager
    def phase(self) -> Iterator[None]:
        self._active, self._depth = True, 0
        try:
            yield
        finally:
            self._active, self._depth = False, 0

    def _pre(self, module: Any, args: Any) -> None:
        if not self._active:
            return
        inputs = list(_tensors(args))
        if self._depth == 0 and inputs and inputs[0].dim() > 0:
            self.rows += int(inputs[0].shape[0])
        self._depth += 1
        devices = {t.device.type for t in (*module.parameters(recurse=False), *module.buffers(recurse=False), *inputs)}
        devices.discard("meta")
        for d in devices:
            self.calls[d] += 1
        if devices - {self.expected}:
            self.off[type(module).__name__] += 1

    def _post(self, module: Any, args: Any, output: Any) -> None:
        if self._active:
            self._depth = max(self._depth - 1, 0)

    def _step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if self._active:
            self.steps += 1


@contextmanager
def recorded_phases(cls: type, recorder: DeviceRecorder) -> Iterator[None]:
    """``cls.fit`` and ``cls.sample`` wrapped so that ``recorder`` records during them (restored afterwards)."""
    own = {name: cls.__dict__.get(name) for name in ("fit", "sample")}
    for name in own:
        original = getattr(cls, name)

        def wrapped(self: Any, *a: Any, _original: Callable = original, **k: Any) -> Any:
            with recorder.phase():
                return _original(self, *a, **k)

        setattr(cls, name, wrapped)
    try:
        yield
    finally:
        for name, value in own.items():
            if value is None:
                delattr(cls, name)
            else:
                setattr(cls, name, value)


def write_standin_fmnist(directory: Path, *, n_train: int = 12_000, n_test: int = 2_000, seed: int = 0) -> None:
    """Random images and labels in Fashion-MNIST's four IDX files (the format only; for machines without the data)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    directory.mkdir(parents=True, exist_ok=True)
    for split, n in (("train", n_train), ("t10k", n_test)):
        images = rng.integers(0, 256, size=(n, 28, 28), dtype=np.uint8)
        labels = np.tile(np.arange(10, dtype=np.uint8), n // 10 + 1)[:n]
        rng.shuffle(labels)
        (directory / f"{split}-images-idx3-ubyte").write_bytes(
            bytes([0, 0, 8, 3]) + np.array([n, 28, 28], ">u4").tobytes() + images.tobytes())
        (directory / f"{split}-labels-idx1-ubyte").write_bytes(
            bytes([0, 0, 8, 1]) + np.array([n], ">u4").tobytes() + labels.tobytes())


def prepare_data(env: Env, *, standin: bool) -> None:
    """Real Fashion-MNIST where installed, else (or with ``standin``) random stand-in files in a temporary folder."""
    from dpsyn.data.fmnist import find_fashion_mnist

    env.data_dir = env.work / "data"
    if not standin:
        try:
            find_fashion_mnist(env.data_dir)
            env.data_note = "Fashion-MNIST found"
            return
        except (FileNotFoundError, OSError):
            pass
    write_standin_fmnist(env.data_dir)
    env.data_note = "Fashion-MNIST not found: random stand-in IDX files (12k train, 2k test)"


# ---------------------------------------------------------------------------------------------------- the checks


def deps_check() -> dict[str, Any]:
    from importlib.metadata import PackageNotFoundError, version

    found: dict[str, str] = {}
    for name in DEPENDENCIES:
        try:
            module = importlib.import_module(name)
            found[name] = str(getattr(module, "__version__", ""))
            if not found[name]:
                try:
                    found[name] = version(name.replace("_", "-"))
                except PackageNotFoundError:
                    found[name] = "?"
        except Exception as e:  # noqa: BLE001 - a broken install is reported, not raised
            found[name] = f"missing ({type(e).__name__}: {str(e).splitlines()[0][:80] if str(e) else ''})"
    return found


def method_check(name: str, env: Env) -> dict[str, Any]:
    import torch
    from omegaconf import OmegaConf, open_dict

    from dpsyn.task import run
    from dpsyn.methods import METHODS
    from tests.tiny import TINY

    cfg = compose(["logger=none", f"eps={EPS}", "privacy.deterministic_noise=true", *TINY[name],
                   f"trainer={'gpu' if env.cuda else 'cpu'}", "trainer.max_epochs=1", "trainer.limit_train_batches=5",
                   "trainer.enable_progress_bar=false", "metrics.classifier.epochs=1"])
    with open_dict(cfg):
        cfg.paths.output_dir = str(env.work / "outputs")
        cfg.paths.cache_dir = str(env.work / "cache")
        cfg.paths.data_dir = str(env.data_dir)
    OmegaConf.set_struct(cfg, True)
    cls = METHODS.get(name)
    measured: dict[str, Any] = {"dataset": str(cfg.dataset.name)}
    failures: list[str] = []
    run_dir = env.work / "runs" / name
    with DeviceRecorder(env.device) as rec, recorded_phases(cls, rec), peak_memory(env, measured):
        result = run(cfg, run_dir)
    timings = result["timings"]
    fit_s, sample_s = float(timings["fit_s"]), float(timings["sample_s"])
    measured.update(
        fit_s=fit_s, sample_s=sample_s, total_s=float(timings["total_s"]), optimizer_steps=rec.steps,
        steps_per_s=rec.steps / fit_s if fit_s > 0 else None,
        rows_per_s=rec.rows / (fit_s + sample_s) if fit_s + sample_s > 0 else None,
        samples_per_s=int(result["n_samples"]) / sample_s if sample_s > 0 else None,
        module_calls=dict(rec.calls), epsilon_spent=float(result["epsilon_spent"]), eps=EPS,
    )
    if not (run_dir / "result.json").is_file():
        failures.append("no result.json")
    if rec.off:
        failures.append(f"module calls off {env.device} (CPU fallback): {dict(rec.off.most_common(5))}")
    if not rec.calls:
        measured["note"] = "no network ran in fit/sample"
    spent = float(result["epsilon_spent"])
    if cls.reference:
        measured["note"] = "non-private reference"
        if not (math.isinf(spent) and result["non_private_reference"]):
            failures.append(f"a reference must report epsilon inf, got {spent}")
    elif not 0 <= spent <= EPS * (1 + 1e-9):
        failures.append(f"epsilon spent {spent} > target {EPS}")
    if env.cuda:
        torch.cuda.empty_cache()
    if failures:
        raise CheckFailed(failures, measured)
    return measured


def _run_context(env: Env, *, shape: tuple[int, ...], num_classes: int) -> Any:
    from dpsyn.methods import RunContext

    return RunContext(seed=0, deterministic_noise=True, accountant="rdp", kind="image", shape=shape,
                      num_classes=num_classes, classes=[str(i) for i in range(num_classes)], device=env.device)


def paper_g_pate_check(env: Env) -> dict[str, Any]:
    import torch
    from torch.nn import functional as F

    from dpsyn.methods import METHODS
    from dpsyn.nets.ensemble import TeacherEnsemble

    # long2021_table1_paper / _ablation_paper / _bounds_paper: MNIST, eps=1 -> conf/method_dataset/g_pate_mnist.yaml
    cfg = compose(["method=g_pate", "dataset=mnist", "eps=1", "trainer=gpu"])
    ctx = _run_context(env, shape=(int(cfg.dataset.channels), int(cfg.dataset.resolution), int(cfg.dataset.resolution)),
                       num_classes=10)
    method = METHODS.get("g_pate")(cfg.method, ctx)
    hp, dev = method.hp, torch.device(env.device)
    paper_n = int(hp["teachers"])
    n = env.sizes["g_pate_teachers"] or paper_n
    b, tb, rule = method._batches(60_000 // paper_n)  # MNIST's 60k rows cut into the paper's partitions
    out: dict[str, Any] = {"paper_teachers": paper_n, "teachers_built": n, "arch": hp.get("teacher_arch"),
                           "batch": b, "teacher_batch": tb}
    with peak_memory(env, out):
        ens = TeacherEnsemble(method._make_teacher(), n, lr=hp["lr_d"], betas=(hp["beta1"], 0.999),
                              chunk_size=hp["teacher_chunk"], device=dev)
        out["params_per_teacher"] = sum(p.numel() for p in method._make_teacher()().parameters())
        shape = ctx.shape
        real_x, real_y = torch.rand(n, tb, *shape, device=dev), torch.randint(0, 10, (n, tb), device=dev)
        fake_x, fake_y = torch.rand(b, *shape, device=dev), torch.randint(0, 10, (b,), device=dev)
        t0 = time.perf_counter()
        losses = ens.train_step(real_x, real_y, fake_x, fake_y)
        _sync(env.device)
        out["train_step_s"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        grads = ens.input_gradients(fake_x, fake_y)
        _sync(env.device)
        out["input_gradients_s"] = time.perf_counter() - t0
        G = method._make_generator().to(dev)
        z = torch.rand(b, int(hp["z_dim"]), device=dev) * 2 - 1
        x = G(z, fake_y)
        F.mse_loss(x, fake_x).backward()
    failures = []
    if tuple(losses.shape) != (n,) or not torch.isfinite(losses).all():
        failures.append(f"teacher losses {tuple(losses.shape)}, finite: {bool(torch.isfinite(losses).all())}")
    if tuple(grads.shape) != (n, b, *shape):
        failures.append(f"input gradients {tuple(grads.shape)}, want {(n, b, *shape)}")
    if tuple(x.shape) != (b, *shape) or any(p.grad is None for p in G.parameters()):
        failures.append(f"generator output {tuple(x.shape)} or a parameter without gradient")
    if failures:
        raise CheckFailed(failures, out)
    return out


def paper_gs_wgan_check(env: Env) -> dict[str, Any]:
    """GS-WGAN at its authors' setting (long2021_table1_paper:
    conf/method_experiment/gs_wgan_long2021_table1_paper.yaml; DPImageBench's dib profile is the same size): the 1000
    critics at width 64 on the device, a few warm-start iterations of one critic and a few main iterations (a critic's
    turn, one sanitised generator step), timed, and the hours the full warm start (critics x warm-start iterations)
    and main run would take at that pace."""
    import torch

    from dpsyn.methods import gs_wgan
    from dpsyn.nets.dcgan import CondDCGANGenerator
    from dpsyn.data.partitions import KeyedPartitions, partition_key
    from dpsyn.nets.ensemble import CondConvTeacher
    from dpsyn.privacy import dp_generator

    cfg = compose(["experiment=long2021_table1_paper", "method=gs_wgan", "dataset=mnist", "eps=1", "trainer=gpu"])
    m, dev = cfg.method, torch.device(env.device)
    paper_k, shape = int(m.critics), (1, 28, 28)
    k, iters = env.sizes["gs_wgan_critics"] or paper_k, env.sizes["gs_wgan_iterations"]
    rows = 60_000 // paper_k  # MNIST's 60k rows in the paper's partitions
    b = min(int(m.batch_size), rows)
    out: dict[str, Any] = {"paper_critics": paper_k, "critics_built": k, "ndf": int(m.ndf), "ngf": int(m.ngf),
                           "warm_start_iterations": int(m.warm_start_iterations), "iterations": int(m.iterations)}
    gen = torch.Generator().manual_seed(0)

    def make_critic() -> torch.nn.Module:
        return CondConvTeacher(num_classes=10, channels=1, resolution=28, ndf=int(m.ndf))

    def make_generator() -> torch.nn.Module:
        return CondDCGANGenerator(z_dim=int(m.z_dim), num_classes=10, channels=1, resolution=28, ngf=int(m.ngf))

    common = dict(z_dim=int(m.z_dim), gp_weight=float(m.gp_weight), drift=float(m.drift), generator=gen)
    betas = (float(m.beta1), float(m.beta2))

    def bank_of(n: int) -> Any:
        return gs_wgan.CriticBank(make_critic, n, lr=float(m.lr_d), betas=betas, device=dev)

    with peak_memory(env, out):
        x, y = torch.rand(k * rows, *shape, device=dev), torch.randint(0, 10, (k * rows,), device=dev)
        parts = KeyedPartitions(torch.arange(k * rows).numpy(), k, key=partition_key(0, "critics"))
        bank = bank_of(k)
        out["params_per_critic"] = sum(p.numel() for p in make_critic().parameters())
        one = bank_of(1)
        _sync(env.device)
        t0 = time.perf_counter()
        gs_wgan.warm_start(one, parts, x=x, y=y, make_generator=make_generator, iterations=iters,
                           critic_steps=int(m.critic_steps), batch=b, num_classes=10, lr_g=float(m.lr_g),
                           betas=betas, progress=True, **common)
        _sync(env.device)
        out["warm_start_iteration_s"] = (time.perf_counter() - t0) / iters
        # the profile's method.warm_start_chunk: that many critics a vmap call (the same critics, tested on CPU)
        chunk = min(k, int(m.warm_start_chunk))
        together = bank_of(chunk)
        _sync(env.device)
        t0 = time.perf_counter()
        gs_wgan.warm_start(together, parts, x=x, y=y, make_generator=make_generator, iterations=iters,
                           critic_steps=int(m.critic_steps), batch=b, num_classes=10, lr_g=float(m.lr_g),
                           betas=betas, progress=True, chunk=chunk, **common)
        _sync(env.device)
        out["warm_start_chunk"] = chunk
        out["warm_start_chunked_iteration_s"] = (time.perf_counter() - t0) / (iters * chunk)  # per critic-iteration
        out["warm_start_chunk_speedup"] = out["warm_start_iteration_s"] / out["warm_start_chunked_iteration_s"]
        G = make_generator().to(dev)
        sigma = gs_wgan.gs_wgan_sigma(epsilon=1.0, delta=float(cfg.privacy.delta), critics=paper_k,
                                      iterations=int(m.iterations), batch_size=int(m.batch_size),
                                      bound=str(m.bound))
        dp_gen = dp_generator(deterministic=False, seed=0, device=str(dev))  # OS entropy, as in a run
        t0 = time.perf_counter()
        for it in range(iters):
            j = int(torch.randint(k, (1,), generator=gen))
            s = gs_wgan.trained_critic(it, k, j, str(m.critic_schedule))
            batches = [(r[0], mk[0]) for r, mk in (parts.batch([s], b) for _ in range(int(m.critic_steps)))]
            gs_wgan.critic_turn(bank, s, x=x, y=y, batches=batches, G=G, num_classes=10, **common)
            critic, _ = bank.checkout(j)
            z = torch.randn(int(m.batch_size), int(m.z_dim), device=dev)
            yz = torch.randint(0, 10, (int(m.batch_size),), device=dev)
            released = gs_wgan.generator_step(G, critic, z=z, y=yz, clip=float(m.clip), sigma=sigma, generator=dp_gen)
        _sync(env.device)
        out["iteration_s"] = (time.perf_counter() - t0) / iters
    out["sigma"] = sigma
    out["warm_start_estimate_h"] = out["warm_start_iteration_s"] * paper_k * int(m.warm_start_iterations) / 3600
    out["warm_start_chunked_estimate_h"] = (out["warm_start_chunked_iteration_s"] * paper_k
                                            * int(m.warm_start_iterations) / 3600)
    out["main_estimate_h"] = out["iteration_s"] * int(m.iterations) / 3600
    failures = []
    if tuple(released.shape) != (int(m.batch_size), *shape) or not torch.isfinite(released).all():
        failures.append(f"sanitised gradients {tuple(released.shape)}, finite: {bool(torch.isfinite(released).all())}")
    if any(p.grad is None for p in G.parameters()):
        failures.append("a generator parameter without gradient")
    if failures:
        raise CheckFailed(failures, out)
    return out


DIB_PAPER_STEPS = (2100, 420)
"""DPImageBench's DP-GAN on F-MNIST: discriminator and generator steps (configs/DPGAN/fmnist_28_eps1.0.yaml)."""


def paper_dp_gan_dib_check(env: Env) -> dict[str, Any]:
    """DP-GAN on DPImageBench's networks (profile dib: conf/method_experiment/dp_gan_dpimagebench_fmnist_dib.yaml,
    ``method.arch=dib``): one DP discriminator step with Opacus's hooks (dpsyn's fused engine covers the DCGAN only)
    and one generator step at the profile's batch (0 in the sizes: the profile's, else that many rows and narrow
    widths), timed, and the hours a full run would take at that pace with dpsyn's step counts and DPImageBench's."""
    import torch
    from opacus import GradSampleModule
    from torch.nn import functional as F

    from dpsyn.lit.dpsgd import dp_optimizer
    from dpsyn.methods.dp_gan import image_networks

    cfg = compose(["experiment=dpimagebench_fmnist_dib", "method=dp_gan", "eps=1", "trainer=gpu"])
    m, dev = cfg.method, torch.device(env.device)
    if str(m.arch) != "dib":
        raise CheckFailed([f"the dib profile composes method.arch={m.arch}, not dib"], {})
    b = env.sizes["dib_batch"] or int(m.batch_size)
    G, D = image_networks("dib", z_dim=int(m.z_dim), num_classes=10, channels=1, resolution=28,
                          ngf=env.sizes["dib_ngf"] or m.ngf, ndf=env.sizes["dib_ndf"] or m.ndf)
    # the profile trains on F-MNIST's 60k training images (n_private null) less the rows its protocol holds out
    n_private = 60000 if cfg.dataset.n_private is None else int(cfg.dataset.n_private)
    if cfg.metrics.get("protocol") == "dpimagebench":
        n_private -= int(cfg.metrics.dpimagebench.validation_rows)
    d_steps = int(m.d_steps)
    steps = int(cfg.trainer.max_epochs) * (n_private // int(m.batch_size))
    out: dict[str, Any] = {"batch": b, "g_params": sum(p.numel() for p in G.parameters()),
                           "d_params": sum(p.numel() for p in D.parameters()), "d_steps_dpsyn": steps,
                           "g_steps_dpsyn": steps // d_steps, "d_steps_dpimagebench": DIB_PAPER_STEPS[0],
                           "g_steps_dpimagebench": DIB_PAPER_STEPS[1]}
    G, D = G.to(dev), GradSampleModule(D.to(dev), loss_reduction="sum")
    gen = torch.Generator(device=dev).manual_seed(0)
    opt_d = dp_optimizer(torch.optim.Adam(D.parameters(), lr=float(m.lr_d), betas=(float(m.beta1), 0.999)),
                         noise_multiplier=1.0, max_grad_norm=float(m.max_grad_norm), expected_batch_size=b,
                         generator=gen)
    opt_g = torch.optim.Adam(G.parameters(), lr=float(m.lr_g), betas=(float(m.beta1), 0.999))
    x, y = torch.rand(b, 1, 28, 28, device=dev), torch.randint(0, 10, (b,), device=dev)

    def d_step() -> None:  # GANModule's paired step: fakes generated, real i + fake i clipped together
        opt_d.zero_grad(set_to_none=True)
        with torch.no_grad():
            fake = G(torch.randn(b, int(m.z_dim), device=dev), y)
        loss = (F.binary_cross_entropy_with_logits(D(x, y), torch.ones(b, device=dev), reduction="sum")
                + F.binary_cross_entropy_with_logits(D(fake, y), torch.zeros(b, device=dev), reduction="sum"))
        loss.backward()
        opt_d.step()

    def g_step() -> None:  # D frozen, its hooks off
        D.disable_hooks()
        for p in D.parameters():
            p.requires_grad_(False)
        opt_g.zero_grad(set_to_none=True)
        logits = D(G(torch.randn(b, int(m.z_dim), device=dev), y), y)
        F.binary_cross_entropy_with_logits(logits, torch.ones(b, device=dev)).backward()
        opt_g.step()
        for p in D.parameters():
            p.requires_grad_(True)
        D.enable_hooks()

    with peak_memory(env, out):
        for name, fn in (("d_step_s", d_step), ("g_step_s", g_step)):
            fn()  # warm-up (kernels, allocator)
            _sync(env.device)
            t0 = time.perf_counter()
            fn()
            _sync(env.device)
            out[name] = time.perf_counter() - t0
    out["run_estimate_h_dpsyn"] = (steps * out["d_step_s"] + steps // d_steps * out["g_step_s"]) / 3600
    out["run_estimate_h_dpimagebench"] = (DIB_PAPER_STEPS[0] * out["d_step_s"]
                                          + DIB_PAPER_STEPS[1] * out["g_step_s"]) / 3600
    if any(p.grad is None for p in G.parameters()):
        raise CheckFailed(["a generator parameter without gradient"], out)
    return out


def paper_swav_check(env: Env, resolution: int, datasets: tuple[str, ...]) -> dict[str, Any]:
    import torch

    from dpsyn.public.encoder import SwAVEncoder

    # wu2023_table1_paper: datasets with conf/public/imagenet.yaml's SwAV encoder
    cfgs = {d: compose(["method=dp_mge", f"dataset={d}", "trainer=gpu"]) for d in datasets}
    res = {int(c.dataset.resolution) for c in cfgs.values()}
    if res != {resolution}:
        raise CheckFailed([f"datasets {datasets} have resolutions {sorted(res)}, this check is for {resolution}"], {})
    enc_cfg = next(iter(cfgs.values())).public.encoder
    ckpt = env.work / "swav_standin.pth.tar"
    if not ckpt.is_file():  # SwAV's layout: {"state_dict": {"module.<resnet50 key>": ...}} plus a projection head
        import torchvision

        state = {f"module.{k}": v for k, v in torchvision.models.resnet50(weights=None).state_dict().items()}
        state["module.projection_head.0.weight"] = torch.zeros(2, 2)
        torch.save({"state_dict": state}, ckpt)
    out: dict[str, Any] = {"datasets": list(datasets), "resolution": resolution,
                           "encoder_resolution": int(enc_cfg.resolution), "batch": env.sizes["swav_batch"]}
    with peak_memory(env, out):
        enc = SwAVEncoder(ckpt, resolution=int(enc_cfg.resolution)).to(env.device)
        x = torch.rand(env.sizes["swav_batch"], 3, resolution, resolution, device=env.device)
        with torch.no_grad():
            enc(x[:1])  # warm-up
            _sync(env.device)
            t0 = time.perf_counter()
            f = enc(x)
            _sync(env.device)
        out["images_per_s"] = len(x) / (time.perf_counter() - t0)
    out["generator"] = "IC-GAN BigGAN not built (needs ic_gan's BigGAN_PyTorch code)"
    norms = f.norm(dim=1)
    if tuple(f.shape) != (len(x), 2048) or not torch.allclose(norms, torch.ones_like(norms), atol=1e-4):
        raise CheckFailed([f"features {tuple(f.shape)}, want ({len(x)}, 2048) of unit norm"], out)
    return out


def paper_pe_check(env: Env) -> dict[str, Any]:
    import numpy as np

    from dpsyn.methods.pe.histogram import dp_nn_histogram
    from dpsyn.privacy import dp_numpy_generator

    cfg = compose(["method=pe", "dataset=cifar10", "experiment=lin2023_fig4_paper"])
    paper_pop, n, d = int(cfg.method.population), env.sizes["pe_n"], env.sizes["pe_dim"]
    n = min(n, paper_pop)
    rng = np.random.default_rng(0)
    private = rng.standard_normal((n, d), dtype=np.float32)  # CIFAR-10's 50k training images, embedded
    synthetic = rng.standard_normal((n, d), dtype=np.float32)
    labels = np.arange(n) % 10
    out: dict[str, Any] = {"paper_population": paper_pop, "population": n, "private": n, "dim": d,
                           "conditional": bool(cfg.method.conditional), "threshold": float(cfg.method.threshold)}
    with peak_memory(env, out):
        t0 = time.perf_counter()
        hist = dp_nn_histogram(private, synthetic, noise_multiplier=5.0, threshold=float(cfg.method.threshold),
                               rng=dp_numpy_generator(), private_labels=labels, synthetic_labels=labels,
                               backend="torch", gpu=env.cuda)
        out["histogram_s"] = time.perf_counter() - t0
    out["diffusion"] = "improved-diffusion 270M not built (needs openai/improved-diffusion's code)"
    clean = np.asarray(hist.clean)
    if clean.shape != (n,) or clean.sum() != n:
        raise CheckFailed([f"clean histogram {clean.shape} with {clean.sum()} votes, want ({n},) with {n}"], out)
    return out


def _cpu_model() -> str:
    from dpsyn.machine import cpu_model

    return cpu_model()


def ratio_dpsgd_check(env: Env) -> dict[str, Any]:
    import torch

    bench = load_benchmark("dpsgd_step")
    batch, steps = env.sizes["dpsgd_batch"], env.sizes["dpsgd_steps"]
    out: dict[str, Any] = {"batch": batch, "steps": steps}
    # every DP-SGD construction and per-sample engine dpsgd_step offers, each / a plain step, on the device
    out.update(bench.ratios(batch, steps, device=env.device))
    out["default"] = "/".join(bench.default_mode())
    return out


def ratio_teachers_check(env: Env) -> dict[str, Any]:
    import torch

    bench = load_benchmark("teachers")
    n = env.sizes["teachers"]
    args = argparse.Namespace(arch="conv", width=4, teacher_batch=15, batch=16, chunk=None,
                              repeats=env.sizes["teachers_repeats"])
    r = bench.bench(n, args, torch.device(env.device))
    train, grads = r["loop_train"] / r["vec_train"], r["loop_grads"] / r["vec_grads"]
    return {"teachers": n, "arch": "conv ndf 4", "train_x": train, "input_gradients_x": grads,
            "goal_x": TEACHERS_GOAL, "goal_met": bool(min(train, grads) >= TEACHERS_GOAL),
            "train_tput_vec": r["train_tput_vec"], "grads_tput_vec": r["grads_tput_vec"]}


def ratio_faiss_check(env: Env) -> dict[str, Any]:
    import numpy as np

    from dpsyn.methods.pe.histogram import dp_nn_histogram, faiss

    if faiss is None:
        raise SkipCheck("faiss not importable")
    if not hasattr(faiss, "StandardGpuResources") or faiss.get_num_gpus() < 1:
        raise SkipCheck("faiss has no GPU support here (faiss-cpu, or no GPU visible to faiss)")
    bench = load_benchmark("pe_histogram")
    n = env.sizes["faiss_n"]
    emb = bench.Embeddings(n, n, 64, 0)
    out: dict[str, Any] = {"private": n, "synthetic": n, "dim": 64}
    hists = {}
    for name, gpu in (("gpu", True), ("cpu", False)):
        fn = lambda: dp_nn_histogram(emb.private, emb.synthetic, noise_multiplier=0.0, threshold=0.0,  # noqa: E731
                                     rng=None, backend="faiss", gpu=gpu)
        fn()  # warm-up (index transfer, kernels)
        seconds, hists[name] = bench.timed(fn)
        out[f"{name}_s"] = seconds
    out["cpu_over_gpu_x"] = out["cpu_s"] / out["gpu_s"]
    moved = int(np.abs(np.asarray(hists["gpu"].clean) - np.asarray(hists["cpu"].clean)).sum() // 2)
    out["votes_moved"] = moved
    return out


def all_checks(env: Env, method_names: list[str]) -> list[Check]:
    core = ("hydra", "omegaconf", "lightning")
    checks = [Check(f"method/{m}", 40.0, lambda m=m: method_check(m, env), needs=core) for m in method_names]
    checks += [
        Check("paper/g_pate_mnist", 40.0, lambda: paper_g_pate_check(env), needs=("hydra", "omegaconf")),
        Check("paper/wu2023_swav_32px", 30.0, lambda: paper_swav_check(env, 32, ("cifar10",)),
              needs=("hydra", "omegaconf", "torchvision")),
        Check("paper/wu2023_swav_128px", 30.0, lambda: paper_swav_check(env, 128, ("pets", "cars", "birds")),
              needs=("hydra", "omegaconf", "torchvision")),
        Check("paper/pe_cifar10_histogram", 30.0, lambda: paper_pe_check(env), needs=("hydra", "omegaconf")),
        Check("ratio/dpsgd_vs_plain", 30.0, lambda: ratio_dpsgd_check(env), needs=("opacus",)),
        Check("ratio/teachers_vmap_vs_loop", 60.0, lambda: ratio_teachers_check(env)),
        Check("ratio/pe_faiss_gpu_vs_cpu", 30.0, lambda: ratio_faiss_check(env), needs=("faiss",)),
        # last: timings for planning GPU runs, the checks least needed when the 5 minutes run short
        Check("paper/dp_gan_dib", 30.0, lambda: paper_dp_gan_dib_check(env), needs=("hydra", "omegaconf", "opacus")),
        Check("paper/gs_wgan_1000_critics", 30.0, lambda: paper_gs_wgan_check(env), needs=("hydra", "omegaconf")),
    ]
    return checks


def registered_methods() -> list[str]:
    """The registered method names, or the names of tests/tiny.py's table when dpsyn.methods cannot be imported."""
    try:
        from dpsyn.methods import METHODS

        return METHODS.names()
    except ImportError:
        from tests.tiny import TINY

        return sorted(TINY)


# ---------------------------------------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", choices=("cuda", "cpu"), default=os.environ.get("DPSYN_GPU_CHECK_DEVICE", "cuda"),
                    help="cpu: the same checks at the smallest sizes (for the test suite)")
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT") or REPO), help="folder of the reports")
    ap.add_argument("--limit", type=float, default=300.0, help="no check starts past this many seconds")
    ap.add_argument("--only", nargs="+", default=None, help="run only the checks whose names match these globs")
    ap.add_argument("--standin-data", action="store_true", help="use random Fashion-MNIST stand-ins even where found")
    args = ap.parse_args(argv)
    start = time.monotonic()
    deadline = start + args.limit

    try:
        import torch  # the only heavy import before the CUDA check
    except ImportError as e:
        print(NO_CUDA)
        print(f"(torch is not importable: {e})", file=sys.stderr)
        return 3
    if args.device == "cuda" and not torch.cuda.is_available():
        print(NO_CUDA)
        return 3
    if args.device == "cpu":
        torch.set_num_threads(max(1, min(2, torch.get_num_threads())))
    header = {
        "device": args.device, "mode": "full sizes" if args.device == "cuda" else "CPU, smallest sizes",
        "device_name": torch.cuda.get_device_name(0) if args.device == "cuda" else _cpu_model(),
        "started": time.strftime("%Y-%m-%d %H:%M:%S"), "state": "running", "limit_s": args.limit,
        "torch": torch.__version__, "python": platform.python_version(),
    }
    report = Report(args.out, header)
    print(f"dpsyn GPU check on {header['device_name']} ({header['mode']}); writing {report.json_path} and "
          f"{report.md_path}", flush=True)
    selected = (lambda name: True) if not args.only else (
        lambda name: name == "deps" or any(fnmatch.fnmatch(name, p) for p in args.only))
    with tempfile.TemporaryDirectory(prefix="dpsyn-gpu-check-") as work:
        env = Env(device=args.device, work=Path(work), sizes=SIZES[args.device])
        run_checks([Check("deps", 60.0, deps_check)], report, deadline=deadline, selected=selected)
        try:
            methods = registered_methods()
            if any(selected(f"method/{m}") for m in methods) and not missing_modules(("hydra", "omegaconf")):
                prepare_data(env, standin=args.standin_data)
                report.finish(data=env.data_note)
        except ImportError as e:
            methods = []
            report.finish(setup_error=f"dpsyn not importable: {e}")
        state = "interrupted"
        try:
            run_checks(all_checks(env, methods), report, deadline=deadline, selected=selected)
            state = "finished"
        finally:
            report.finish(state=state, elapsed_s=time.monotonic() - start)
    summary = report.as_dict()["summary"]
    print(f"done in {time.monotonic() - start:.0f} s: {summary}; see {report.md_path}")
    return 1 if summary.get("failed") else 0


if __name__ == "__main__":
    sys.exit(main())
