"""Shared fixtures: compose the real Hydra configs (shrunk for speed), isolated cache and output folders."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from omegaconf import DictConfig, OmegaConf, open_dict

from dpsyn.paths import CONF_DIR, REPO_DIR


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One cache per test session (evaluation networks are trained once, then reused)."""
    return Path(os.environ.get("DPSYN_TEST_CACHE_DIR") or tmp_path_factory.mktemp("cache"))


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


def crash_on_call(original, n: int = 4):
    """``original`` wrapped to raise ``RuntimeError("killed")`` on its ``n``-th call (a run killed mid-training)."""
    calls = {"n": 0}

    def wrapper(*a, **k):
        calls["n"] += 1
        if calls["n"] == n:
            raise RuntimeError("killed")
        return original(*a, **k)

    return wrapper
