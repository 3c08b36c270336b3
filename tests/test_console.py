"""A quiet console: the default run's output holds none of the known library noise; DPSYN_VERBOSE=1 brings it back."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from dpsyn.console import NOISY_LOG_RECORDS, NOISY_WARNINGS, quiet_logger, verbose_requested
from dpsyn.paths import REPO_DIR

# the five lines of the issue (16, item 7), as the default run printed them
NOISE = (
    "The anonymous setting has no effect",
    "try installing [litlogger]",
    "`isinstance(treespec, LeafSpec)` is deprecated",
    "Full backward hook is firing",
    "`weights_only` was not set",
)

# emits each known noisy warning and log record, after dpsyn.console.quiet() (or not, in verbose mode)
EMIT = textwrap.dedent("""
    import logging, sys, warnings
    from dpsyn import console
    installed = console.quiet(sys.argv[1:])
    print("installed", installed, flush=True)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    warnings.warn("`isinstance(treespec, LeafSpec)` is deprecated, use ...", FutureWarning)
    warnings.warn("Full backward hook is firing when gradients are computed with respect to module outputs since "
                  "no inputs require gradients.", UserWarning)
    warnings.warn("Full backward hook is firing, as a DeprecationWarning: another category", DeprecationWarning)
    warnings.warn("an unrelated warning stays", UserWarning)
    for name in ("lightning.pytorch.utilities.rank_zero", "lightning.fabric.utilities.rank_zero"):
        logging.getLogger(name).info("Tip: try installing [litlogger](https://pypi.org/project/litlogger/)")
        logging.getLogger(name).info("GPU available: False, used: False")
""")


def _emit(env_extra: dict[str, str], *argv: str) -> str:
    import os

    env = {k: v for k, v in os.environ.items() if k != "DPSYN_VERBOSE"}
    env.update(PYTHONPATH=str(REPO_DIR), **env_extra)
    out = subprocess.run([sys.executable, "-c", EMIT, *argv], env=env, capture_output=True, text=True, timeout=120,
                         check=True)
    return out.stdout + out.stderr


def test_quiet_filters_only_the_known_messages() -> None:
    out = _emit({})
    assert "installed True" in out
    assert "LeafSpec" not in out and "when gradients are computed" not in out and "litlogger" not in out
    # the same text in another category, other warnings and other records of the same loggers still show
    assert "as a DeprecationWarning: another category" in out
    assert "an unrelated warning stays" in out
    assert out.count("GPU available: False") == 2


@pytest.mark.parametrize("how", [{"DPSYN_VERBOSE": "1"}, "hydra.verbose=true", "hydra.verbose=[dpsyn]"])
def test_verbose_installs_no_filter(how) -> None:
    env, argv = (how, ()) if isinstance(how, dict) else ({}, (how,))
    out = _emit(env, *argv)
    assert "installed False" in out
    assert "LeafSpec" in out and "when gradients are computed" in out and out.count("litlogger") >= 2


def test_verbose_requested() -> None:
    assert not verbose_requested([]) and not verbose_requested(["hydra.verbose=false", "eps=1"])
    assert verbose_requested(["hydra.verbose=true"]) and verbose_requested(["hydra.verbose=[dpsyn,__main__]"])
    assert {c for c, _, _ in NOISY_WARNINGS} == {FutureWarning, UserWarning} and NOISY_LOG_RECORDS


def test_quiet_logger_drops_only_wandbs_unset_anonymous_setting(monkeypatch) -> None:
    import dpsyn.console as console

    class Logger:
        def __init__(self, anonymous):
            self._wandb_init = {"project": "dpsyn", "anonymous": anonymous}

    monkeypatch.setattr(console, "_installed", [("test",)])
    assert quiet_logger(Logger(None))._wandb_init == {"project": "dpsyn"}
    assert quiet_logger(Logger("allow"))._wandb_init["anonymous"] == "allow"  # asked for: kept
    monkeypatch.setattr(console, "_installed", [])
    assert quiet_logger(Logger(None))._wandb_init == {"project": "dpsyn", "anonymous": None}  # verbose: untouched
    assert quiet_logger(None) is None


def test_default_run_prints_no_library_noise(cli_env: dict[str, str], tmp_path: Path) -> None:
    """The default run (dp_gan on fmnist, W&B offline), debug-sized: progress, dpsyn's lines and the summary only."""
    env = {**cli_env, "WANDB_MODE": "offline"}
    env.pop("DPSYN_VERBOSE", None)
    env.pop("WANDB_SILENT", None)  # as a user runs it (W&B's own lines are not noise; its anonymous warning is)
    out = subprocess.run(
        [sys.executable, str(REPO_DIR / "train.py"), "trainer=debug", "metrics.names.image=[]", "metrics.n_samples=60"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600,
    )
    text = out.stdout + out.stderr
    assert out.returncode == 0, text[-3000:]
    assert "dpsyn: dp_gan on fmnist" in text and "epsilon spent" in text  # the summary
    assert "dp_gan DP-SGD: noise multiplier" in text  # dpsyn's own INFO lines
    assert "Tracking run with wandb" in text  # W&B is on (offline), it only says nothing it need not
    for line in NOISE:
        assert line not in text, line
    assert "faiss.loader" not in text and "ModuleNotFoundError" not in text  # faiss's search for its SIMD builds
    assert text.count("GPU available: False") == 1  # Lightning's lines once (its own handler removed under Hydra)
