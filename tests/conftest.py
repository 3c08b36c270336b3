"""Shared fixtures: compose the real Hydra configs (shrunk for speed), isolated cache and output folders."""

from __future__ import annotations

import importlib.util
import os
import sys
from types import ModuleType
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from omegaconf import DictConfig, OmegaConf, open_dict

from dpsyn.paths import CONF_DIR, REPO_DIR


def pytest_configure(config: pytest.Config) -> None:
    """Under pytest-xdist (``make test``), each worker gets its share of the cores for torch's intra-op threads:
    two workers of two threads each on two cores would contend (and run slower than one thread each). The processes
    a test starts (``python train.py``, the audit CLI, ...) inherit the same share through OMP_NUM_THREADS, unless
    it is set already."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0") or 0)
    if workers > 1:
        import torch

        threads = max(1, (os.cpu_count() or 1) // workers)
        torch.set_num_threads(threads)
        os.environ.setdefault("OMP_NUM_THREADS", str(threads))


# The longest tests at the end of the collection (seconds each, `make test` on the 2-core machine), run first:
# under pytest-xdist the suite ends when the last dispatched test ends, and these made the last 4% of the
# collection hold 18% of its time (one worker idled ~30 s waiting for the other). Only the order changes; an entry
# that no longer matches a test is ignored.
RUN_FIRST = (
    "tests/test_tuning.py::test_a_tuning_sweep_never_reads_the_eval_split_and_the_final_run_reads_it_once",  # 44
    "tests/test_tables.py::test_every_experiment_composes_for_every_profile[embedded]",  # 24
    "tests/test_train.py::test_cli_multirun_writes_one_result_per_job",  # 16
    "tests/test_train.py::test_missing_data_is_one_clear_line_not_a_traceback",  # 11
    "tests/test_train.py::test_dp_gan_run_spends_at_most_its_target",  # 11
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    first = [item for item in items if item.nodeid in RUN_FIRST]
    if first:
        items[:] = first + [item for item in items if item.nodeid not in RUN_FIRST]


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One cache per test session (evaluation networks and the tiny public models are trained once, then reused).

    Under pytest-xdist the workers share it (a folder of the session's temporary root, which xdist gives every
    worker's own temporary folder as parent): what one worker trained, the other loads. Every writer of the cache
    writes atomically (a temporary file renamed into place, the sidecar last), so two workers that miss the same
    entry at once both train it and one copy wins, whole."""
    if os.environ.get("DPSYN_TEST_CACHE_DIR"):
        return Path(os.environ["DPSYN_TEST_CACHE_DIR"])
    if os.environ.get("PYTEST_XDIST_WORKER"):
        shared = tmp_path_factory.getbasetemp().parent / "cache"
        shared.mkdir(exist_ok=True)
        return shared
    return tmp_path_factory.mktemp("cache")


def compose_cfg(overrides: list[str] | None = None) -> DictConfig:
    """``train.yaml`` composed with ``overrides`` (without Hydra's runtime config)."""
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose(config_name="train", overrides=overrides or [], return_hydra_config=False)
    GlobalHydra.instance().clear()
    return cfg


@pytest.fixture
def make_cfg(tmp_path: Path, cache_dir: Path):
    """Compose a debug-sized config whose outputs and cache go to temporary folders."""

    def make(*overrides: str) -> DictConfig:
        cfg = compose_cfg(["trainer=debug", "logger=none", *overrides])
        with open_dict(cfg):
            cfg.paths.output_dir = str(tmp_path / "outputs")
            cfg.paths.cache_dir = str(cache_dir)
            cfg.paths.data_dir = str(tmp_path / "data")
        OmegaConf.set_struct(cfg, True)
        return cfg

    return make


@pytest.fixture
def cli_env(tmp_path: Path, cache_dir: Path) -> dict[str, str]:
    """Environment for running ``python train.py`` in a subprocess with isolated outputs and cache."""
    env = dict(os.environ)
    env.update(
        DPSYN_OUTPUT_DIR=str(tmp_path / "outputs"),
        DPSYN_CACHE_DIR=str(cache_dir),
        DPSYN_DATA_DIR=str(tmp_path / "data"),
        WANDB_MODE="offline",
        WANDB_SILENT="true",
        PYTHONPATH=str(REPO_DIR),
    )
    return env


def run_context(
    *,
    kind: str = "image",
    shape: Sequence[int] | None = None,
    classes: Sequence[str] = ("a", "b", "c"),
    data: Any = None,
    cfg: DictConfig | None = None,
    **kw: Any,
):
    """A :class:`~dpsyn.methods.RunContext` built the way a test needs it, in one place.

    Defaults: seed 0, reproducible DP noise (``deterministic_noise=True``: tests only), the rdp accountant, 28x28
    grey images (a table of 4 columns for ``kind="table"``) of classes a, b, c, no trainer settings.

    Args:
        kind, shape, classes: the dataset's, when neither ``data`` nor ``cfg`` gives them.
        data: a :class:`~dpsyn.data.DataBundle`: its kind, shape, classes and public class names.
        cfg: a composed config (``make_cfg``): its seed, noise mode, accountant, trainer and public models, and its
            paths as the context's cache and data folders (as ``dpsyn.task.run`` builds it).
        **kw: any other RunContext field (``run_dir``, ``trainer``, ``deterministic_noise``, ...), applied last.
    """
    from dpsyn.methods import RunContext
    from dpsyn.methods.base import run_limits

    if shape is None:
        shape = (1, 28, 28) if kind == "image" else (4,)
    fields: dict[str, Any] = dict(seed=0, deterministic_noise=True, accountant="rdp", kind=kind, shape=tuple(shape),
                                  num_classes=len(classes), classes=list(classes))
    if data is not None:
        fields.update(kind=data.kind, shape=tuple(data.shape), num_classes=data.num_classes, classes=list(data.classes),
                      public_classes=list(data.public_classes) if data.public_classes else None)
    if cfg is not None:
        fields.update(seed=int(cfg.seed), deterministic_noise=bool(cfg.privacy.deterministic_noise),
                      accountant=str(cfg.privacy.accountant), public=cfg.get("public"),
                      trainer={k: v for k, v in OmegaConf.to_container(cfg.trainer, resolve=True).items()
                               if v is not None},
                      cache_dir=str(cfg.paths.cache_dir), data_dir=str(cfg.paths.data_dir))
    fields.update(kw)
    # device, max_steps, ...: resolved from the trainer settings as the run does, unless given
    for key, value in run_limits(fields.get("trainer")).items():
        fields.setdefault(key, value)
    return RunContext(**fields)


@pytest.fixture
def make_ctx():
    """``make_ctx(**kw)``: :func:`run_context` (a RunContext for a test's dataset and config)."""
    return run_context


def crash_on_call(original, n: int = 4):
    """``original`` wrapped to raise ``RuntimeError("killed")`` on its ``n``-th call (a run killed mid-training)."""
    calls = {"n": 0}

    def wrapper(*a, **k):
        calls["n"] += 1
        if calls["n"] == n:
            raise RuntimeError("killed")
        return original(*a, **k)

    return wrapper


class RecordingBar:
    """A stand-in for tqdm that keeps what a method shows: ``RecordingBar.made`` holds every bar built (monkeypatch
    a method module's ``tqdm`` with this class, after clearing ``made``)."""

    made: list["RecordingBar"] = []

    def __init__(self, iterable=None, *, total=None, initial=0, desc="", **_: object) -> None:
        self.iterable, self.total, self.n, self.desc = iterable, total, initial, desc
        self.postfixes: list[dict] = []
        self.closed = False
        RecordingBar.made.append(self)

    def __iter__(self):
        for item in self.iterable:
            yield item
            self.n += 1

    def update(self, n: int = 1) -> None:
        self.n += n

    def set_postfix(self, refresh: bool = True, **kw: object) -> None:
        self.postfixes.append(dict(kw))

    def close(self) -> None:
        self.closed = True


def load_script(path: Path, name: str) -> ModuleType:
    """A script of the repository that is not a package module (benchmarks/, experiments/), imported from its path
    under ``name`` (registered in ``sys.modules``: dataclasses look their module up there)."""
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None, path
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
