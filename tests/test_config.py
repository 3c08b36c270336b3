"""Every config composes; configuration mistakes fail before any work, in one line naming key and allowed values."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import open_dict

from dpsyn.cli.config_check import ConfigError, check_composed, group_options, preflight
from dpsyn.methods import METHODS
from dpsyn.paths import CONF_DIR, REPO_DIR
from tests.conftest import compose_cfg

GROUP_CHOICES = [
    (group, option)
    for group in ("method", "dataset", "public", "privacy", "metrics", "trainer", "logger", "paths", "experiment")
    for option in group_options(group)
]


@pytest.mark.parametrize(("group", "option"), GROUP_CHOICES)
def test_every_config_composes(group: str, option: str) -> None:
    cfg = compose_cfg([f"{group}={option}"])
    assert cfg.method.name in METHODS
    assert cfg.dataset.name == (option if group == "dataset" else "fmnist")
    assert "delta" in cfg.privacy and "names" in cfg.metrics
    # no group may leak keys to the top level (a _global_ file's own defaults must name their package), except an
    # experiment's own sweep keys (rajotte2020_grid's owner fractions f0, f1)
    base = {"method", "dataset", "public", "privacy", "metrics", "trainer", "logger", "paths", "eps", "seed",
            "experiment_name", "profile", "skip_existing", "tuning"}
    sweep_keys: set[str] = set()
    if group == "experiment":
        from omegaconf import OmegaConf

        files = [option]
        while files:  # the experiment and the experiments it extends (a _paper profile lists its base first)
            exp = OmegaConf.load(REPO_DIR / "conf" / "experiment" / f"{files.pop()}.yaml")
            sweep_keys |= set(((exp.get("hydra") or {}).get("sweeper") or {}).get("params") or {})
            files += [d for d in exp.get("defaults", []) if isinstance(d, str) and d != "_self_"]
    assert base <= set(cfg) and set(cfg) - base <= sweep_keys, set(cfg) ^ base
    assert cfg.trainer.accelerator in ("cpu", "gpu")


def test_every_method_and_dataset_pair_is_checked() -> None:
    """Each (method, dataset) pair either passes the checks or is refused with a one-line ConfigError."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    GlobalHydra.instance().clear()
    # each method and each dataset composed once (a composition takes ~0.1 s), then every pair put together
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        methods = {m: compose(config_name="train", overrides=[f"method={m}"]).method for m in group_options("method")}
        datasets = {d: compose(config_name="train", overrides=[f"dataset={d}"]) for d in group_options("dataset")}
    GlobalHydra.instance().clear()
    checked = 0
    for m, method in methods.items():
        for d, base in datasets.items():
            cfg = base.copy()
            with open_dict(cfg):
                cfg.method = method
            assert (cfg.method.name, cfg.dataset.name) == (m, d)
            try:
                check_composed(cfg)
                checked += 1
            except ConfigError as e:
                assert "\n" not in str(e) and "allowed:" in str(e)
    assert checked >= len(methods)  # most pairs pass: the loop did check something


def test_config_names_match_registries() -> None:
    from dpsyn.data import DATASETS

    assert set(group_options("method")) == set(METHODS.names())
    assert set(group_options("dataset")) <= set(DATASETS.names())


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["method=nope"], "method=nope: unknown method; allowed: dp_dre, dp_gan, dp_gan_ft"),
        (["dataset=cifar100"], "dataset=cifar100: unknown dataset; allowed:"),
        (["-m", "method=real,nope"], "method=nope"),
        (["eps=0"], "eps=0"),
        (["eps=-1"], "must be > 0"),
        (["-m", "eps=1,0"], "eps=0"),
        (["privacy.delta=1.5"], "privacy.delta=1.5: must lie in (0, 1)"),
        (["privacy.accountant=moments"], "privacy.accountant=moments: unknown accountant; allowed: "),
        (["method=privgan", "dataset=breast_cancer"], "supports image data only; allowed:"),
        (["no_such_key=1"], "no_such_key"),
    ],
)
def test_preflight_rejects_with_one_line(argv: list[str], expected: str) -> None:
    with pytest.raises(ConfigError) as err:
        preflight(argv)
    assert expected in str(err.value)
    assert "\n" not in str(err.value)


def test_preflight_accepts_good_sweeps() -> None:
    preflight(["-m", "method=dp_gan,real", "dataset=fmnist", "eps=0.1,1,inf", "seed=0,1", "hydra/launcher=basic"])
    preflight(["--cfg", "job", "eps=3"])


def test_preflight_reads_method_keys_of_the_method_the_command_line_names_in_an_experiment_sweep() -> None:
    """An experiment sweeps several methods; ``method=gs_wgan method.critics=5`` on the command line runs gs_wgan
    only (Hydra: the command line wins over ``hydra.sweeper.params``), so ``method.critics`` is gs_wgan's key, not an
    unknown key of the default method, and its range is still checked."""
    preflight(["-m", "experiment=long2021_table1", "method=gs_wgan", "method.critics=5"])
    preflight(["-m", "experiment=dpimagebench_fmnist_dib", "method=gs_wgan", "method.warm_start_iterations=3"])
    with pytest.raises(ConfigError, match=r"^method.critics=0: must be an integer >= 1$"):
        preflight(["-m", "experiment=long2021_table1", "method=gs_wgan", "method.critics=0"])
    with pytest.raises(ConfigError, match="method.critics=5: unknown key"):  # dp_gan has no critics
        preflight(["-m", "experiment=long2021_table1", "method=dp_gan", "method.critics=5"])


def test_method_needing_public_data_is_refused_on_a_dataset_without(monkeypatch: pytest.MonkeyPatch) -> None:
    # the preflight reads a method's facts from the generated catalog (no torch), not from the method class
    from dpsyn.config import catalog

    monkeypatch.setitem(catalog.METHODS, "needs_public_stub", {"kinds": ("image", "table"), "needs_public": True})
    cfg = compose_cfg(["dataset=fmnist"])
    with open_dict(cfg):
        cfg.method.name = "needs_public_stub"
    with pytest.raises(ConfigError, match=r"dataset=fmnist: method needs_public_stub needs public data .*allowed: .*fmnist_shoes"):
        check_composed(cfg)
    cfg2 = compose_cfg(["dataset=fmnist_shoes"])
    with open_dict(cfg2):
        cfg2.method.name = "needs_public_stub"
    check_composed(cfg2)  # has public data: accepted


def test_delta_is_checked_against_the_private_set_size(make_cfg, tmp_path: Path) -> None:
    from dpsyn.task import run

    cfg = make_cfg("method=real", "dataset=digits", "privacy.delta=0.01")  # digits: ~1400 private rows
    with pytest.raises(ConfigError, match=r"privacy.delta=0.01: must lie in \(0, 1/n"):
        run(cfg, tmp_path / "run")
    assert not (tmp_path / "run" / "result.json").exists()


def test_cli_config_error_is_one_line_and_writes_nothing(cli_env: dict[str, str], tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, str(REPO_DIR / "train.py"), "method=dp_dree", "eps=1"],
        capture_output=True, text=True, env=cli_env, cwd=tmp_path, timeout=300,
    )
    assert proc.returncode == 2
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    allowed = ", ".join(sorted(METHODS.names()))
    assert lines == [f"dpsyn: config error: method=dp_dree: unknown method; allowed: {allowed}"]
    assert not (tmp_path / "outputs").exists()
