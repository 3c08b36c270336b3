"""Typed configs (dpsyn.config): every bad value fails at compose time in one line naming the key, before any work;
the schemas agree with the methods; fingerprints cover every field; PATE noise ratios give today's votes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf, open_dict

from dpsyn.cli.config_check import ConfigError, check_composed, group_options, preflight
from dpsyn.config import METHOD_SCHEMAS, fingerprint, resolve_pate_noise, validate
from dpsyn.paths import REPO_DIR
from tests.conftest import compose_cfg

ACCEPTANCE = [
    (["method=g_pate", "method.teachers=0"], "method.teachers=0: must be an integer >= 1"),
    (["method=dp_gan", "method.batch_size=-3"], "method.batch_size=-3: must be an integer >= 1"),
    (["method=privgan", "method.owners=[0.7,0.6]"], "method.owners=[0.7, 0.6]: each fraction must lie in (0, 1] and "
                                                    "their sum <= 1"),
    (["method=pe", "dataset=fmnist_all", "method.population=0"], "method.population=0: must be an integer >= 1"),
    (["method=dp_dre", "eps=1", "dataset=fmnist_shoes", "method.batch_size=0"],
     "method.batch_size=0: must be an integer >= 1"),
]


@pytest.mark.parametrize(("argv", "line"), ACCEPTANCE, ids=[" ".join(a) for a, _ in ACCEPTANCE])
def test_cli_bad_value_exits_2_in_one_line_and_writes_nothing(cli_env, tmp_path: Path, argv, line) -> None:
    # fast because the preflight imports no torch (test_preflight_imports_no_torch_and_no_method_module), not timed
    # here: a timing assertion depends on the machine's load (the time is measured in the note)
    proc = subprocess.run([sys.executable, str(REPO_DIR / "train.py"), *argv], capture_output=True, text=True,
                          env=cli_env, cwd=tmp_path, timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert [ln for ln in proc.stderr.splitlines() if ln.strip()] == [f"dpsyn: config error: {line}"]
    assert not (tmp_path / "outputs").exists() and not any(tmp_path.iterdir())  # no run directory, no file


def test_preflight_imports_no_torch_and_no_method_module() -> None:
    code = ("import sys\nfrom dpsyn.cli.config_check import ConfigError, preflight\n"
            "preflight(['method=g_pate', 'dataset=digits'])\n"
            "try:\n    preflight(['method=g_pate', 'method.teachers=0'])\nexcept ConfigError:\n    pass\n"
            "bad = sorted(m for m in sys.modules if m == 'torch' or m.startswith(('torch.', 'dpsyn.methods')))\n"
            "assert not bad, bad\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO_DIR, timeout=120)
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (["method=g_pate", "method.bins=1"], "method.bins=1: must be an integer >= 2"),
        (["method=g_pate", "method.clip=-1"], "method.clip=-1.0: must be a number > 0"),
        (["method=g_pate", "method.bound=smooth"], "method.bound=smooth: allowed: data_independent, data_dependent"),
        (["method=g_pate", "method.teacher_arch=resnet"], "method.teacher_arch=resnet: allowed: auto, gpate, conv"),
        (["method=g_pate", "method.d_hidden=[]"], "method.d_hidden=[]: must not be empty"),
        (["method=g_pate", "method.g_hidden=[64,0]"], "method.g_hidden=[64, 0]: each item must be an integer >= 1"),
        (["method=g_pate", "method.threshold=inf"], "method.threshold=inf: must be a finite vote count"),
        (["method=g_pate", "method.sigma_threshold_ratio=0", "method.sigma_threshold=null"],
         "method.sigma_threshold_ratio=0.0: must be a number > 0"),
        (["method=pate_gan", "method.threshold_ratio=1.5"], "method.threshold_ratio=1.5: must lie in [0, 1]"),
        (["method=gs_wgan", "method.ema=1"], "method.ema=1.0: must lie in [0, 1)"),
        (["method=gs_wgan", "method.drift=-0.1"], "method.drift=-0.1: must be a number >= 0"),
        (["method=gs_wgan", "method.critics=0"], "method.critics=0: must be an integer >= 1"),
        (["method=pe", "method.degrees=[0.5,1.5]"], "method.degrees=[0.5, 1.5]: each item must lie in (0, 1]"),
        (["method=privgan", "method.owners=[0.5,0]"], "method.owners=[0.5, 0.0]: each item must lie in (0, 1]"),
        (["method=privgan", "method.attack.utility.epochs=0"], "method.attack.utility.epochs=0: must be an integer"),
        (["method=dp_mepf", "method.moments=m1"], "method.budget_split.m2=0.45: must be 0"),
        (["method=dp_mepf", "method.budget_split.m1=0.5"], "method.budget_split="),
        (["method=dp_mge", "method.mean_share=1"], "method.mean_share=1.0: must lie in (0, 1)"),
        (["trainer.max_epochs=0"], "trainer.max_epochs=0: must be an integer >= 1"),
        (["metrics.n_samples=0"], "metrics.n_samples=0: must be an integer >= 1"),
        (["dataset.n_private=0"], "dataset.n_private=0: must be an integer >= 1"),
    ],
)
def test_validator_names_key_value_and_what_is_allowed(overrides: list[str], expected: str) -> None:
    cfg = compose_cfg(overrides)
    with pytest.raises(ConfigError) as err:
        validate(cfg)
    assert str(err.value).startswith(expected) and "\n" not in str(err.value)
    with pytest.raises(ConfigError, match="^" + expected.split("=")[0].replace(".", r"\.")):
        check_composed(cfg)  # run() and every job of a sweep go through check_composed


def test_every_method_default_validates() -> None:
    for m in group_options("method"):
        validate(compose_cfg([f"method={m}"]))


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["method=g_pate", "method.teachers=abc"], "method.teachers=abc: must be an integer"),
        (["privacy.deterministic_noise=maybe"], "privacy.deterministic_noise=maybe: must be true or false"),
        (["method.lr_g=null"], "method.lr_g=null: must not be null"),
        (["privacy.deltaa=3"], "privacy.deltaa=3: unknown key; allowed: delta, accountant, deterministic_noise"),
        (["method=g_pate", "method.teacherz=3"], "method.teacherz=3: unknown key"),
        (["-m", "method=g_pate", "method.teachers=100,0"], "method.teachers=0: must be an integer >= 1"),
        (["-m", "method=g_pate", "method.threshold=10,-1"], "method.threshold=-1.0: must be a number >= 0"),
        (["-m", "method=dp_gan,g_pate", "method.batch_size=-1"], "method.batch_size=-1"),
    ],
)
def test_preflight_turns_hydra_errors_and_every_swept_value_into_one_line(argv: list[str], expected: str) -> None:
    with pytest.raises(ConfigError) as err:
        preflight(argv)
    assert str(err.value).startswith(expected) and "\n" not in str(err.value)


def test_the_preflight_catalog_is_generated_from_the_method_classes() -> None:
    """dpsyn/config/catalog.py (what the preflight knows of each method without importing it) is what
    ``make docs`` writes from the classes now, and every method has its schema and its yaml."""
    from dpsyn.config.catalog import METHODS as CATALOG
    from dpsyn.methods import METHODS
    from dpsyn.methods.catalog import CATALOG_PATH, catalog_text

    assert CATALOG_PATH.read_text() == catalog_text(), "dpsyn/config/catalog.py is stale: run `make docs`"
    names = set(METHODS.names())
    assert set(CATALOG) == names == set(METHOD_SCHEMAS) == set(group_options("method"))
    for name in names:
        assert OmegaConf.get_type(compose_cfg([f"method={name}"]).method) is METHOD_SCHEMAS[name]


def test_the_private_tuning_facts_name_fields_of_the_methods_schemas() -> None:
    """``accounting_keys`` and ``tunable_keys`` (dpsyn.private_tuning's allowlist) are fields of the method's schema,
    disjoint, never ``name``; a method that is not DP (a reference: its ledger is non-private) has nothing tunable.
    tests/test_private_tuning.py shows on the methods' own ledgers that no tunable key changes the curve."""
    from dpsyn.methods import METHODS

    for name in METHODS.names():
        facts = METHODS.get(name)
        fields = set(METHOD_SCHEMAS[name].__dataclass_fields__)
        acc, tun = set(facts.accounting_keys), set(facts.tunable_keys)
        assert acc <= fields and tun <= fields, (name, sorted((acc | tun) - fields))
        assert not acc & tun, (name, sorted(acc & tun))
        assert "name" not in acc | tun
        assert len(facts.tunable_keys) == len(tun) and len(facts.accounting_keys) == len(acc), name
        if METHODS.get(name).reference:
            assert not tun, name
        elif METHODS.get(name).output_depends_on_eps():  # spends privacy: its accounting reads something
            assert acc, name


# ---- fingerprints ------------------------------------------------------------------------------------------------


def test_fingerprint_holds_every_schema_field_resolved() -> None:
    cfg = compose_cfg(["method=g_pate"])
    fp = fingerprint(cfg.method)
    assert set(fp) == set(METHOD_SCHEMAS["g_pate"].__dataclass_fields__)
    assert fp["sigma_ratio"] == 0.25 and fp["sigma"] is None
    # a node built by hand without a key still fingerprints it (the schema's default): nothing can be missed
    hand = OmegaConf.create({k: v for k, v in OmegaConf.to_container(cfg.method, resolve=True).items() if k != "bins"})
    assert fingerprint(hand)["bins"] == fp["bins"] and set(fingerprint(hand)) == set(fp)
    for override in ("method.bins=5", "method.sigma=400", "method.teacher_chunk=null"):
        assert fingerprint(compose_cfg(["method=g_pate", override]).method) != fp, override


def test_train_fit_fingerprint_uses_the_typed_method_config() -> None:
    from dpsyn.task import fit_fingerprint

    cfg = compose_cfg(["method=gs_wgan"])
    assert fit_fingerprint(cfg, 1e-5)["method"] == fingerprint(cfg.method)
    with open_dict(cfg):
        cfg.method.ema = 0.5
    assert fit_fingerprint(cfg, 1e-5)["method"]["ema"] == 0.5


# ---- PATE noise as ratios to the teacher count ------------------------------------------------------------------

# (method, dataset, extra overrides) -> the absolute votes the yaml files gave before the ratios (sigma1, sigma2, T)
TODAY = [
    ("g_pate", "fmnist", [], (3000.0, 1000.0, 2000.0)),
    ("g_pate", "fmnist", ["eps=10"], (1200.0, 200.0, 2000.0)),  # the paper's eps=10 ratios (0.3 N, 0.05 N, 0.5 N)
    ("g_pate", "digits", ["eps=10"], (375.0, 125.0, 250.0)),  # per-eps ratios only where the paper's setting applies
    ("g_pate", "digits", [], (375.0, 125.0, 250.0)),
    ("g_pate", "breast_cancer", [], (37.5, 12.5, 25.0)),
    ("g_pate", "kaggle_credit", [], (3000.0, 1000.0, 2000.0)),
    ("g_pate", "mnist", [], (3000.0, 1000.0, 2000.0)),
    ("pate_gan", "fmnist", [], (750.0, 500.0, 500.0)),
    ("pate_gan", "digits", [], (375.0, 250.0, 250.0)),
    ("pate_gan", "breast_cancer", [], (68.0, 45.0, 45.0)),
    ("g_pate", "fmnist", ["method.teachers=4000", "method.sigma_threshold=600", "method.sigma=100"],
     (600.0, 100.0, 2000.0)),  # absolute values win over the ratios
]


@pytest.mark.parametrize(("method", "dataset", "extra", "votes"), TODAY)
def test_pate_noise_resolves_to_todays_votes(method: str, dataset: str, extra: list[str], votes) -> None:
    cfg = compose_cfg([f"method={method}", f"dataset={dataset}", *extra])
    check_composed(cfg)
    noise = resolve_pate_noise(cfg.method)
    assert (noise["sigma_threshold"], noise["sigma"], noise["threshold"]) == votes


def test_pate_methods_use_the_resolved_noise() -> None:
    from dpsyn.methods.g_pate import GPATE
    from dpsyn.methods.pate_gan import PATEGAN

    g = GPATE._check(compose_cfg(["method=g_pate", "dataset=digits"]).method)
    p = PATEGAN._check(compose_cfg(["method=pate_gan"]).method, "image")
    assert (g["sigma_threshold"], g["sigma"], g["threshold"]) == (375.0, 125.0, 250.0)
    assert (p["sigma_threshold"], p["sigma"], p["threshold"]) == (750.0, 500.0, 500.0)


def test_pate_noise_needs_a_ratio_or_an_absolute_value() -> None:
    cfg = compose_cfg(["method=g_pate", "method.sigma_ratio=null"])
    with pytest.raises(ConfigError, match=r"^method\.sigma=null: set sigma \(votes\) or sigma_ratio"):
        validate(cfg)


@pytest.mark.parametrize(("experiment", "votes"), [("long2021_ablation", (1500.0, 500.0, 1000.0)),
                                                    ("long2021_ablation_paper", (3000.0, 1000.0, 2000.0))])
def test_teacher_ablations_keep_the_noise_fixed_in_votes(experiment: str, votes) -> None:
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from dpsyn.paths import CONF_DIR

    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        base = compose(config_name="train", overrides=[f"experiment={experiment}"], return_hydra_config=True)
        params = dict(base.hydra.sweeper.params)
        fixed = [f"{k}={v}" for k, v in params.items() if "," not in str(v)]
        for teachers in str(params["method.teachers"]).split(","):
            cfg = compose(config_name="train", overrides=[f"experiment={experiment}", *fixed,
                                                          f"method.teachers={teachers}"])
            noise = resolve_pate_noise(cfg.method)
            assert (noise["sigma_threshold"], noise["sigma"], noise["threshold"]) == votes
    GlobalHydra.instance().clear()
    preflight(["-m", f"experiment={experiment}"])
