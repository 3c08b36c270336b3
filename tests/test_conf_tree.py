"""The lean config tree: a dataset's yaml names its public split, which is read only for methods that use it;
conf/method_dataset holds only real per-pair deviations; the experiment files share one base."""

from __future__ import annotations

from pathlib import Path

import pytest
from omegaconf import OmegaConf

from dpsyn.cli.config_check import ConfigError, check_composed, datasets_with_public, group_options
from dpsyn.cli.tables import PROFILES
from dpsyn.paths import CONF_DIR
from tests.tiny import IMAGE_METRICS, TINY


def test_method_dataset_files_hold_real_per_pair_deviations() -> None:
    """No file of conf/method_dataset only restates the dataset's public split (the dataset's yaml names it)."""
    files = sorted((CONF_DIR / "method_dataset").glob("*.yaml"))
    assert files
    for path in files:
        body = OmegaConf.to_container(OmegaConf.load(path))
        assert body, path
        assert set(body) != {"dataset"} or set(body["dataset"]) != {"public"}, f"{path.name} only sets dataset.public"
        method, dataset = None, None
        for m in group_options("method"):
            if path.stem.startswith(m + "_") and path.stem[len(m) + 1:] in group_options("dataset"):
                method, dataset = m, path.stem[len(m) + 1:]
        assert method and dataset, f"{path.name} names no <method>_<dataset> pair"


def test_method_experiment_files_name_a_method_their_experiment_sweeps() -> None:
    """conf/method_experiment/<method>_<experiment>.yaml is loaded as an ``optional`` default, so a misspelt file name
    would be skipped without a word: each must name an experiment of conf/experiment and a method that experiment
    sweeps, and must change that method's settings."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    files = sorted((CONF_DIR / "method_experiment").glob("*.yaml"))
    assert {p.stem for p in files} >= {"dp_gan_dpimagebench_fmnist_dib", "gs_wgan_dpimagebench_fmnist_dib",
                                        "gs_wgan_long2021_table1_paper"}
    experiments = group_options("experiment")
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            for path in files:
                pairs = [(m, path.stem[len(m) + 1:]) for m in group_options("method")
                         if path.stem.startswith(m + "_") and path.stem[len(m) + 1:] in experiments]
                assert len(pairs) == 1, f"{path.name} names no <method>_<experiment> pair"
                method, experiment = pairs[0]
                sweep = compose(config_name="train", overrides=[f"experiment={experiment}"],
                                return_hydra_config=True).hydra.sweeper.params
                assert method in str(sweep.method).split(","), f"{experiment} does not sweep {method}"
                body = OmegaConf.to_container(OmegaConf.load(path))
                assert body and set(body["method"]), path
                with_file = compose(config_name="train", overrides=[f"experiment={experiment}", f"method={method}"])
                for key, value in body["method"].items():
                    assert with_file.method[key] == value, (path.name, key)
                assert any(OmegaConf.select(compose(config_name="train", overrides=[f"method={method}"]),
                                            f"method.{k}") != v for k, v in body["method"].items()), path
    finally:
        GlobalHydra.instance().clear()


def test_gs_wgan_paper_profile_holds_the_authors_setting(make_cfg) -> None:
    """DingfanChen/GS-WGAN source/config.py and pretrain.sh: 1000 critics warm-started 2000 iterations each, 20000
    iterations of batch 32, 5 critic steps, Adam 1e-4 (0.5, 0.9), EMA 0.999; the embedded table keeps its CPU sizes."""
    paper = make_cfg("experiment=long2021_table1_paper", "method=gs_wgan", "dataset=mnist").method
    assert (paper.critics, paper.warm_start_iterations, paper.iterations, paper.batch_size) == (1000, 2000, 20000, 32)
    assert (paper.critic_steps, paper.lr_g, paper.lr_d) == (5, 1e-4, 1e-4)
    assert (paper.beta1, paper.beta2, paper.ema) == (0.5, 0.9, 0.999)
    embedded = make_cfg("experiment=long2021_table1", "method=gs_wgan").method  # fmnist, eps=1: gs_wgan_fmnist.yaml
    assert (embedded.critics, embedded.warm_start_iterations, embedded.iterations, embedded.batch_size) == (
        100, 150, 12000, 8)
    # on fmnist the authors' and DPImageBench's profiles keep the authors' generator, clip and schedule, not the
    # embedded band nor its batch 8
    for experiment in ("long2021_table1_paper", "dpimagebench_fmnist_dib"):
        for eps in ("1", "10"):
            m = make_cfg(f"experiment={experiment}", "method=gs_wgan", "dataset=fmnist", f"eps={eps}").method
            got = (m.critics, m.output_frequencies, m.clip, m.iterations, m.batch_size, m.warm_start_iterations)
            assert got == (1000, None, 1.0, 20000, 32, 2000), (experiment, eps)


@pytest.mark.parametrize("dataset", ["cifar10", "pets", "cars", "birds"])
def test_imagenet_datasets_name_their_public_split(dataset: str, make_cfg) -> None:
    """Paper 000's real datasets name ImageNet's validation images as their public split, for every method (the
    per-pair files that said so are gone); a method that needs public data composes and passes the check."""
    assert OmegaConf.load(CONF_DIR / "dataset" / f"{dataset}.yaml").public == "imagenet_val"
    for method in ("dp_dre", "dp_mge", "pe", "dp_gan"):
        cfg = make_cfg(f"method={method}", f"dataset={dataset}")
        assert cfg.dataset.public == "imagenet_val" and cfg.public.name == "imagenet"


def test_needs_public_check_still_refuses_datasets_without_public_data(make_cfg) -> None:
    with_public = datasets_with_public()
    assert {"cifar10", "pets", "cars", "birds", "fmnist_all", "digits"} <= set(with_public)
    assert not {"fmnist", "mnist", "breast_cancer", "kaggle_credit"} & set(with_public)
    with pytest.raises(ConfigError, match="needs public data and this dataset has none; allowed: .*cifar10"):
        check_composed(make_cfg("method=dp_mge", "dataset=fmnist"))


def test_load_dataset_without_public_keeps_the_private_and_eval_splits(tmp_path: Path) -> None:
    """``public=False`` drops only the public split (as ``public: null`` would); private and eval are the same."""
    import numpy as np

    from dpsyn.data import load_dataset

    cfg = OmegaConf.load(CONF_DIR / "dataset" / "fmnist_shoes.yaml")
    cfg.n_private = 300
    full = load_dataset(cfg, seed=3, data_dir=tmp_path)
    lean = load_dataset(cfg, seed=3, data_dir=tmp_path, public=False)
    assert full.public is not None and len(full.public) > 0 and full.public_classes
    assert lean.public is None and lean.public_classes is None and lean.info["public"] is None
    assert cfg.public == "fmnist_public"  # the caller's config is not changed
    for a, b in ((full.private, lean.private), (full.eval, lean.eval)):
        np.testing.assert_array_equal(a.x, b.x)
        np.testing.assert_array_equal(a.y, b.y)


@pytest.mark.parametrize("method, loads_public", [("real", False), ("public_uniform", True)])
def test_run_loads_public_data_only_for_methods_that_use_it(method: str, loads_public: bool, make_cfg, tmp_path,
                                                            monkeypatch) -> None:
    """``dpsyn.task.run`` passes ``public=Method.needs_public`` to the loader; the run's data record says what it read."""
    import dpsyn.data
    from dpsyn.task import run
    from dpsyn.methods import METHODS

    assert METHODS.get(method).needs_public is loads_public
    seen: list[bool] = []
    original = dpsyn.data.load_dataset

    def spy(cfg, **kw):
        seen.append(kw.get("public", True))
        return original(cfg, **kw)

    monkeypatch.setattr(dpsyn.data, "load_dataset", spy)
    cfg = make_cfg(*TINY[method], "dataset=fmnist_shoes", *IMAGE_METRICS)  # no image metric: only the data is checked
    result = run(cfg, tmp_path / "run")
    assert seen and seen[0] is loads_public
    assert result["data"]["public"] == ("fmnist_public" if loads_public else None)


EXPERIMENTS = [e for e in group_options("experiment") if not e.startswith("_")]


@pytest.mark.parametrize("experiment", EXPERIMENTS)
def test_every_experiment_gets_the_shared_logger_and_sweep_dir_from_the_base(experiment: str) -> None:
    """conf/experiment/_base.yaml holds the csv logger and the fixed sweep folder; each experiment composes with them
    (whether it lists the base itself or extends an experiment that does), and no file restates them."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    text = (CONF_DIR / "experiment" / f"{experiment}.yaml").read_text()
    assert "override /logger: csv" not in text and "dir: ${paths.output_dir}/experiments/" not in text
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            cfg = compose(config_name="train", overrides=[f"experiment={experiment}"], return_hydra_config=True)
    finally:
        GlobalHydra.instance().clear()
    assert cfg.logger._target_ == "lightning.pytorch.loggers.CSVLogger"
    assert cfg.experiment_name and cfg.profile in PROFILES
    sweep = OmegaConf.to_container(cfg.hydra.sweep, resolve=False)
    assert sweep["dir"] == "${paths.output_dir}/experiments/${experiment_name}/${profile}"
    assert "${now:" not in sweep["subdir"] and sweep["subdir"].endswith("seed${seed}")


def test_make_ctx_builds_the_context_train_run_would(make_ctx, make_cfg) -> None:
    """The make_ctx fixture: test defaults, or a composed config's run settings (as dpsyn.task.run builds)."""
    ctx = make_ctx()
    assert (ctx.seed, ctx.deterministic_noise, ctx.accountant, ctx.kind) == (0, True, "rdp", "image")
    assert ctx.shape == (1, 28, 28) and ctx.num_classes == 3 and ctx.classes == ["a", "b", "c"]
    assert make_ctx(kind="table").shape == (4,)
    cfg = make_cfg("seed=3", "privacy.deterministic_noise=false", "privacy.accountant=prv")
    ctx = make_ctx(cfg=cfg, run_dir=Path("x"))
    assert (ctx.seed, ctx.deterministic_noise, ctx.accountant, ctx.run_dir) == (3, False, "prv", Path("x"))
    assert ctx.trainer["max_epochs"] == cfg.trainer.max_epochs and None not in ctx.trainer.values()
    assert ctx.cache_dir == str(cfg.paths.cache_dir) and ctx.public.name == cfg.public.name


def test_evaluation_data_of_an_imagenet_family_reads_no_imagenet(make_cfg) -> None:
    """cifar10's yaml names imagenet_val, but the family data of the evaluation network (and of re-scoring) is read
    without it: dp_gan on cifar10 needs no ImageNet files to be scored."""
    from dpsyn.task import family_loader
    from tests.test_data import write_fake_cifar10

    cfg = make_cfg("dataset=cifar10")
    write_fake_cifar10(Path(cfg.paths.data_dir))
    family = family_loader(cfg)("cifar10")
    assert family.public is None and family.info["public"] is None and len(family.private) > 0
