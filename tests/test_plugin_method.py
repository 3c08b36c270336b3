"""A method added from outside dpsyn gets every harness dpsyn's own methods get (docs/adding-a-method.md).

The toy below (one Gaussian release of each class's clipped sum and count, samples drawn around the released means)
is one file in a temporary folder: its class states its facts, its schema its defaults, and ``register_method``
registers both. Nothing in dpsyn is edited. It then runs through the budget harness (tests/test_all_methods.py), the
neighbouring-run leak test (tests/test_neighbouring_runs.py) and, as a plugin of a ``python train.py`` process
(``DPSYN_PLUGINS``), the kill-and-rerun harness (tests/test_crash_safety.py).
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest

from dpsyn.paths import REPO_DIR

NAME = "class_means"

TOY = '''\
"""class_means: each class's mean row, released once by the Gaussian mechanism; samples drawn around it."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from dpsyn.config.schema import MethodSchema, f
from dpsyn.methods import Method, Samples, register_method
from dpsyn.methods.tiny import TABLE_METRICS
from dpsyn.privacy import GaussianEvent, NonPrivateEvent, dp_numpy_generator, gaussian_mechanism, gdp_noise_multiplier


@dataclass
class ClassMeansSchema(MethodSchema):
    name: str = "class_means"
    spread: float = f(0.05, gt=0, help="std of the samples around each released mean (post-processing)")


@register_method("class_means", schema=ClassMeansSchema)
class ClassMeans(Method):
    """Rows scaled by 1/sqrt(d) and clipped to norm 1: one row moves its class's sum by at most 1 and its count by
    1, so the sums and counts together have L2 sensitivity sqrt(2); one Gaussian release of both."""

    kinds = ("image", "table")
    tunable_keys = ("spread",)
    fitted_attrs = ("means", "weights")
    tiny = ("method=class_means", "dataset=breast_cancer", *TABLE_METRICS)

    def fit(self, private, budget, ledger, public=None):
        x = private.x.reshape(len(private.x), -1).astype(np.float64)
        k, d = self.ctx.num_classes, x.shape[1]
        rows = x / math.sqrt(d)
        rows /= np.maximum(1.0, np.linalg.norm(rows, axis=1, keepdims=True))
        sums, counts = np.zeros((k, d)), np.zeros(k)
        np.add.at(sums, private.y, rows)
        np.add.at(counts, private.y, 1.0)
        stats = np.concatenate([sums.ravel(), counts])
        if budget.private:
            nm = gdp_noise_multiplier(epsilon=budget.epsilon, steps=1, delta=budget.delta)
            ledger.add(GaussianEvent(noise_multiplier=nm, label="class_means: class sums and counts"))
            gen = dp_numpy_generator(deterministic=self.ctx.deterministic_noise, seed=self.ctx.seed)
            stats = gaussian_mechanism(stats, nm * math.sqrt(2.0), generator=gen)
        else:
            ledger.add(NonPrivateEvent(label="class_means at eps=inf: class sums and counts without noise"))
        sums, counts = stats[: k * d].reshape(k, d), np.maximum(stats[k * d:], 1.0)
        self.means = np.clip(sums / counts[:, None] * math.sqrt(d), 0.0, 1.0)
        self.weights = counts / counts.sum()

    def sample(self, n, labels=None):
        rng = np.random.default_rng(self.ctx.seed)
        y = labels if labels is not None else rng.choice(len(self.weights), size=n, p=self.weights)
        x = np.clip(self.means[y] + rng.normal(0.0, float(self.cfg.spread), size=(n, self.means.shape[1])), 0, 1)
        return Samples(x.reshape((n, *self.ctx.shape)).astype(np.float32), np.asarray(y, dtype=np.int64),
                       {"method": "class_means"})
'''


def _dpsyn_files() -> dict[Path, int]:
    return {p: p.stat().st_mtime_ns for d in ("dpsyn", "conf", "docs") for p in (REPO_DIR / d).rglob("*")
            if p.is_file() and "__pycache__" not in p.parts}


@pytest.fixture
def plugin(tmp_path: Path):
    """The toy written to its own folder and imported (registered), unregistered afterwards."""
    from hydra.core.config_store import ConfigStore

    from dpsyn.config import METHOD_SCHEMAS, SCHEMAS
    from dpsyn.methods import METHODS
    from dpsyn.plugins import PLUGIN_METHODS

    folder = tmp_path / "plugin"
    folder.mkdir()
    (folder / f"{NAME}.py").write_text(TOY)
    before = _dpsyn_files()
    sys.path.insert(0, str(folder))
    try:
        importlib.import_module(NAME)
        yield folder
    finally:
        sys.path.remove(str(folder))
        sys.modules.pop(NAME, None)
        METHODS._entries.pop(NAME, None)
        PLUGIN_METHODS.pop(NAME, None)
        SCHEMAS["method"].pop(NAME, None)
        METHOD_SCHEMAS.pop(NAME, None)
        repo = ConfigStore.instance().repo
        repo.get("method", {}).pop(f"{NAME}.yaml", None)
        repo.get("schema", {}).get("method", {}).pop(f"{NAME}.yaml", None)
    assert _dpsyn_files() == before, "adding the plugin changed a file of dpsyn"


def test_the_plugin_is_one_file_and_registered_with_its_facts(plugin: Path) -> None:
    from dpsyn.cli.config_check import preflight
    from dpsyn.config import method_facts, method_names
    from dpsyn.methods import METHODS

    assert sorted(p.name for p in plugin.iterdir() if p.is_file()) == [f"{NAME}.py"]  # at most 4: here 1
    assert NAME in METHODS and NAME in method_names()
    facts = method_facts(NAME)
    assert facts.kinds == ("image", "table") and facts.needs_public is False
    preflight([f"method={NAME}", "dataset=breast_cancer", "method.spread=0.1"])  # composes from its schema
    from dpsyn.config import ConfigError

    with pytest.raises(ConfigError, match=r"method.spread=-1.0: must be a number > 0"):
        preflight([f"method={NAME}", "dataset=breast_cancer", "method.spread=-1"])


def test_the_budget_and_neighbouring_run_harnesses_cover_the_plugin(plugin: Path, make_cfg, tmp_path: Path,
                                                                     cache_dir: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.test_all_methods import check_end_to_end
    from tests.test_neighbouring_runs import check_neighbouring, neighbour_case, neighbour_cases

    check_end_to_end(NAME, make_cfg, tmp_path / "budget")
    assert NAME in neighbour_cases()
    diff = check_neighbouring(NAME, neighbour_case(NAME), tmp_path / "neighbours", cache_dir, monkeypatch)
    assert diff  # the released means changed with the row removed; nothing else did (checked inside)


def test_the_crash_harness_covers_the_plugin(plugin: Path, make_cfg, cli_env: dict[str, str],
                                            tmp_path: Path) -> None:
    from tests.test_crash_safety import check_kill_and_rerun, crash_cases

    assert NAME in crash_cases()
    env = {**cli_env, "DPSYN_PLUGINS": NAME, "PYTHONPATH": f"{plugin}:{cli_env['PYTHONPATH']}"}
    check_kill_and_rerun(NAME, make_cfg, env, tmp_path)
