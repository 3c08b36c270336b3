"""dpsyn as an installed package: which config tree it composes from (the checkout's ``conf/`` or the copy a wheel
carries as ``dpsyn/conf``), user config directories added with ``hydra.searchpath``, and (slow) a wheel installed
in a fresh venv running the default config outside the repository (tools/wheel-check)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra

from dpsyn import paths
from dpsyn.cli.config_check import ConfigError, check_composed, preflight
from dpsyn.paths import CONF_DIR, REPO_DIR


def _tree(root: Path, files: list[str]) -> None:
    for f in files:
        (root / f).parent.mkdir(parents=True, exist_ok=True)
        (root / f).write_text("")


def test_conf_dir_of_a_checkout_is_the_repository_conf(tmp_path: Path) -> None:
    """In a checkout the top-level conf/ wins, also over a packaged copy (edits to conf/ take effect at once)."""
    _tree(tmp_path, ["pyproject.toml", "conf/train.yaml", "dpsyn/__init__.py", "dpsyn/conf/train.yaml"])
    assert paths.is_checkout(tmp_path)
    assert paths.conf_dir(tmp_path / "dpsyn") == tmp_path / "conf"


def test_conf_dir_of_a_wheel_is_the_packaged_copy(tmp_path: Path) -> None:
    site = tmp_path / "site-packages"
    _tree(site, ["dpsyn/__init__.py", "dpsyn/conf/__init__.py", "dpsyn/conf/train.yaml"])
    assert not paths.is_checkout(site)
    assert paths.conf_dir(site / "dpsyn") == site / "dpsyn" / "conf"


def test_conf_dir_missing_says_so(tmp_path: Path) -> None:
    _tree(tmp_path, ["dpsyn/__init__.py", "conf/train.yaml"])  # no pyproject.toml: not a checkout
    with pytest.raises(FileNotFoundError, match="config tree is missing"):
        paths.conf_dir(tmp_path / "dpsyn")


def test_this_test_run_is_a_checkout() -> None:
    assert paths.IN_CHECKOUT and CONF_DIR == REPO_DIR / "conf" and paths.require_checkout("a test") == REPO_DIR


def test_require_checkout_outside_one(monkeypatch: pytest.MonkeyPatch) -> None:
    """Commands that read experiments/ or docs/ fail with one message from an installed package."""
    from dpsyn.cli import tables

    monkeypatch.setattr(paths, "IN_CHECKOUT", False)
    with pytest.raises(RuntimeError, match="needs dpsyn's repository"):
        paths.require_checkout("reading experiments/")
    with pytest.raises(SystemExit, match="python -m dpsyn.cli.tables readme needs dpsyn's repository"):
        tables.main(["readme", "--check"])


def test_no_git_sha_outside_a_checkout(monkeypatch: pytest.MonkeyPatch) -> None:
    """An installed dpsyn records no commit, though its site-packages may lie in some other git repository."""
    from dpsyn import task
    from dpsyn.results import kept

    monkeypatch.setattr(task, "IN_CHECKOUT", False)
    monkeypatch.setattr(kept, "IN_CHECKOUT", False)
    assert task.git_sha() is None and task.git_dirty() is None and kept.git_head() == ""


USER_DATASET = """\
# a smaller Fashion-MNIST: fmnist's settings, 500 private examples; `name` stays fmnist (it selects the loader)
defaults:
  - fmnist
  - _self_
n_private: 500
"""

USER_METHOD = """\
# DP-GAN with a wider generator and discriminator
defaults:
  - dp_gan
  - _self_
ngf: 48
ndf: 48
"""


@pytest.fixture
def user_conf(tmp_path: Path) -> Path:
    _tree(tmp_path, ["myconf/dataset/fmnist_small.yaml", "myconf/method/dp_gan_wide.yaml"])
    (tmp_path / "myconf/dataset/fmnist_small.yaml").write_text(USER_DATASET)
    (tmp_path / "myconf/method/dp_gan_wide.yaml").write_text(USER_METHOD)
    return tmp_path / "myconf"


def test_searchpath_adds_user_configs(user_conf: Path) -> None:
    """A user's config directory on hydra.searchpath: its dataset and method extend dpsyn's and compose."""
    over = [f"hydra.searchpath=[file://{user_conf}]", "dataset=fmnist_small", "method=dp_gan_wide"]
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            cfg = compose(config_name="train", overrides=over)
    finally:
        GlobalHydra.instance().clear()
    assert cfg.dataset.name == "fmnist" and cfg.dataset.n_private == 500 and cfg.dataset.kind == "image"
    assert cfg.method.name == "dp_gan" and (cfg.method.ngf, cfg.method.ndf) == (48, 48)
    assert cfg.method.lr_g == 2.0e-4  # the rest is dp_gan's
    check_composed(cfg)


def test_preflight_allows_searchpath_options(user_conf: Path) -> None:
    """The command line's check knows the options a searchpath adds, for a single run and a sweep."""
    search = f"hydra.searchpath=[file://{user_conf}]"
    preflight([search, "dataset=fmnist_small", "method=dp_gan_wide"])
    preflight(["-m", search, "dataset=fmnist_small,fmnist", "eps=1,2"])
    with pytest.raises(ConfigError, match="dataset=fmnist_small: unknown dataset"):
        preflight(["dataset=fmnist_small"])
    with pytest.raises(ConfigError, match=r"dataset=nope: unknown dataset; allowed: .*fmnist_small"):
        preflight([search, "dataset=nope"])


@pytest.mark.slow
def test_wheel_check(tmp_path: Path) -> None:
    """tools/wheel-check: the wheel holds conf/ and the shipped weights, and `dpsyn-train trainer=debug` runs from a
    fresh venv holding it, outside the repository (about half a minute)."""
    env = {**os.environ, "PY": sys.executable, "TMPDIR": str(tmp_path), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(["bash", str(REPO_DIR / "tools" / "wheel-check"), "logger=none"], capture_output=True,
                          text=True, env=env, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "wheel-check: OK" in proc.stdout
