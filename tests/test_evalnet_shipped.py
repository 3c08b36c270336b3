"""The shipped evaluation network: intact, keyed for the default config, used instead of training; the lookup order
(cache, shipped, trained), the sha256 check, and the command that regenerates it (``pretrain evalnet=... ship=true``).
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra

from dpsyn.config import load_group
from dpsyn.data import fmnist as fmnist_mod
from dpsyn.metrics import evalnet as evalnet_mod
from dpsyn.paths import CONF_DIR
from tests.conftest import compose_cfg
from tests.test_data import write_fake_fmnist
from tests.test_metrics import _bundle

DEBIAN_FMNIST = Path("/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz")
TOY = {"epochs": 1, "batch_size": 64, "lr": 1e-3, "val_fraction": 0.1, "limit_train_batches": None}


def _no_training(*args, **kwargs):
    raise AssertionError("the evaluation network was trained")


def _shipped() -> list[Path]:
    return sorted(evalnet_mod.SHIPPED_DIR.glob("*.safetensors"))


def _default_settings() -> dict:
    return dict(load_group("metrics", "default")["evalnet"])


# ------------------------------------------------------------------------------------------ the package's file


def test_shipped_evalnet_is_intact_small_and_for_the_default_settings() -> None:
    """One network is shipped, fmnist's: its sha256 is the sidecar's, its sidecar describes its key (recomputed from
    the recorded settings, seed and data provenance), the settings are conf/metrics/default.yaml's, and it is small."""
    shipped = _shipped()
    assert [p.name.split("-")[0] for p in shipped] == ["fmnist"], shipped
    weights = shipped[0]
    record = json.loads(weights.with_suffix(".json").read_text())
    assert hashlib.sha256(weights.read_bytes()).hexdigest() == record["sha256"]
    assert record["key"] == weights.stem
    assert record["key"] == evalnet_mod.evalnet_key(record["family"], {**record["settings"], "seed": record["seed"]},
                                                    record["data"])
    assert record["arch_version"] == evalnet_mod.ARCH_VERSION and record["seed"] == 0
    assert record["settings"] == _default_settings()
    assert record["data"]["name"] == "fmnist" and record["data"]["sizes"] == {"private": 60000, "eval": 10000,
                                                                               "public": 0}
    assert record["test_acc"] > 0.8 and record["train_seconds"] > 0
    assert weights.stat().st_size < 1 << 20  # 0.5 MB: the whole working tree travels in 64 MiB


def test_the_wheel_carries_the_shipped_evalnet() -> None:
    """pyproject's package-data names the shipped files: an install without them would train at the first run."""
    import fnmatch
    import tomllib

    from dpsyn.paths import REPO_DIR

    globs = tomllib.loads((REPO_DIR / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["dpsyn"]
    package = evalnet_mod.SHIPPED_DIR.parent.parent
    for path in (*_shipped(), *(p.with_suffix(".json") for p in _shipped())):
        assert any(fnmatch.fnmatch(path.relative_to(package).as_posix(), g) for g in globs), path


def test_default_run_settings_load_the_shipped_evalnet_without_training(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """With an empty cache, the default config's evaluation network (train.yaml's metrics, fmnist loaded as a run
    loads it) comes from the package: no training, and the features are the shipped weights'."""
    if not DEBIAN_FMNIST.is_file():
        pytest.skip("the shipped key is for Debian's dataset-fashion-mnist files")
    from dpsyn.task import family_loader
    from dpsyn.metrics.features import build_feature_extractor

    monkeypatch.setattr(evalnet_mod, "train_classifier", _no_training)
    cfg = compose_cfg([f"paths.cache_dir={tmp_path / 'empty'}", f"paths.data_dir={tmp_path / 'data'}"])
    assert (cfg.method.name, cfg.dataset.name, cfg.dataset.family) == ("dp_gan", "fmnist", "fmnist")
    family = family_loader(cfg)(cfg.dataset.family)
    ext = build_feature_extractor(f"evalnet_{family.family}", family_data=family, settings=dict(cfg.metrics.evalnet),
                                  cache_dir=cfg.paths.cache_dir)
    (weights,) = _shipped()
    assert ext.record["source"] == "shipped" and Path(ext.record["shipped"]) == weights
    assert ext.record["key"] == weights.stem
    assert not (tmp_path / "empty" / "evalnet").exists()  # read from the package, nothing copied or trained
    feats = ext.extract(family.eval.x[:256])
    assert feats["features"].shape == (256, 128)
    # the shipped network is the instrument it claims to be: its recorded test accuracy, on a slice of the test split
    acc = (feats["logits"].argmax(1) == family.eval.y[:256]).mean()
    assert acc > 0.75


def test_a_corrupted_shipped_file_is_an_error_not_a_retrain(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    if not DEBIAN_FMNIST.is_file():
        pytest.skip("the shipped key is for Debian's dataset-fashion-mnist files")
    from dpsyn.task import family_loader

    (weights,) = _shipped()
    copy = tmp_path / "shipped"
    copy.mkdir()
    shutil.copy(weights, copy / weights.name)
    shutil.copy(weights.with_suffix(".json"), copy / weights.with_suffix(".json").name)
    blob = bytearray((copy / weights.name).read_bytes())
    blob[-1] ^= 0x01  # one bit of the last weight
    (copy / weights.name).write_bytes(bytes(blob))
    monkeypatch.setattr(evalnet_mod, "SHIPPED_DIR", copy)
    monkeypatch.setattr(evalnet_mod, "train_classifier", _no_training)
    cfg = compose_cfg([f"paths.cache_dir={tmp_path / 'empty'}", f"paths.data_dir={tmp_path / 'data'}"])
    family = family_loader(cfg)("fmnist")
    with pytest.raises(RuntimeError, match=r"does not match the sha256 .*Reinstall dpsyn, or regenerate"):
        evalnet_mod.load_or_train_evalnet(family, settings=dict(cfg.metrics.evalnet), cache_dir=tmp_path / "empty")


# ------------------------------------------------------------------------------ lookup order (toy family, fast)


def test_lookup_order_cache_then_shipped_then_trained(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    shipped_dir = tmp_path / "shipped"
    monkeypatch.setattr(evalnet_mod, "SHIPPED_DIR", shipped_dir)
    weights, record = evalnet_mod.ship_evalnet(_bundle(), settings=TOY)
    assert weights.parent == shipped_dir and record["sha256"] == hashlib.sha256(weights.read_bytes()).hexdigest()
    assert record["test_acc"] > 0.9

    real_train = evalnet_mod.train_classifier
    monkeypatch.setattr(evalnet_mod, "train_classifier", _no_training)
    _, got = evalnet_mod.load_or_train_evalnet(_bundle(), settings=TOY, cache_dir=tmp_path / "cache")
    assert got["source"] == "shipped" and got["shipped"] == str(weights) and got["key"] == record["key"]

    # the cache comes first (here: a copy of the shipped file under the same key)
    (tmp_path / "cache" / "evalnet").mkdir(parents=True)
    for p in (weights, weights.with_suffix(".json")):
        shutil.copy(p, tmp_path / "cache" / "evalnet" / p.name)
    _, got = evalnet_mod.load_or_train_evalnet(_bundle(), settings=TOY, cache_dir=tmp_path / "cache")
    assert got["source"] == "cache"

    # another setting (or seed) is another key: the shipped network is not used for it, the network is trained
    for kwargs in ({"settings": {**TOY, "lr": 2e-3}}, {"settings": TOY, "seed": 1}):
        with pytest.raises(AssertionError, match="was trained"):
            evalnet_mod.load_or_train_evalnet(_bundle(), cache_dir=tmp_path / "cache", **kwargs)
    monkeypatch.setattr(evalnet_mod, "train_classifier", real_train)
    _, got = evalnet_mod.load_or_train_evalnet(_bundle(), settings={**TOY, "lr": 2e-3}, cache_dir=tmp_path / "cache")
    assert got["source"] == "trained" and got["key"] != record["key"]


def test_shipped_sha256_and_sidecar_are_checked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(evalnet_mod, "SHIPPED_DIR", tmp_path / "shipped")
    weights, record = evalnet_mod.ship_evalnet(_bundle(), settings=TOY)
    monkeypatch.setattr(evalnet_mod, "train_classifier", _no_training)
    good = weights.read_bytes()

    weights.write_bytes(good[:-4] + bytes(4))  # damaged: the last float zeroed
    with pytest.raises(RuntimeError, match="does not match the sha256"):
        evalnet_mod.load_or_train_evalnet(_bundle(), settings=TOY, cache_dir=tmp_path / "cache")
    assert not (tmp_path / "cache" / "evalnet").exists()  # nothing trained or cached instead

    # intact weights under a sidecar that describes other settings than its key: refused too
    weights.write_bytes(good)
    meta = weights.with_suffix(".json")
    meta.write_text(json.dumps({**record, "settings": {**TOY, "epochs": 9}}))
    with pytest.raises(RuntimeError, match="settings do not match the key"):
        evalnet_mod.load_or_train_evalnet(_bundle(), settings=TOY, cache_dir=tmp_path / "cache")


def test_ship_replaces_the_familys_previous_network(tmp_path: Path) -> None:
    folder = tmp_path / "shipped"
    first, _ = evalnet_mod.ship_evalnet(_bundle(), settings=TOY, folder=folder)
    (folder / "other-0123456789ab.json").write_text("{}")  # another family's file stays
    second, _ = evalnet_mod.ship_evalnet(_bundle(), settings={**TOY, "lr": 2e-3}, folder=folder)
    assert first != second
    assert sorted(p.name for p in folder.iterdir()) == sorted([second.name, second.with_suffix(".json").name,
                                                               "other-0123456789ab.json"])


# ------------------------------------------------------------------------------------------------ the command


def test_pretrain_command_ships_then_loads_the_evalnet(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`pretrain evalnet=fmnist ship=true` writes weights + sidecar into the shipped folder; `pretrain evalnet=fmnist`
    with an empty cache then finds them under the same key (the key a run computes), without training."""
    from dpsyn.cli import pretrain as pretrain_mod

    monkeypatch.setattr(fmnist_mod, "SYSTEM_DIRS", (tmp_path / "nowhere",))
    write_fake_fmnist(tmp_path / "data")
    monkeypatch.setattr(evalnet_mod, "SHIPPED_DIR", tmp_path / "shipped")

    def cfg(*overrides: str):
        GlobalHydra.instance().clear()
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            out = compose("pretrain", overrides=["evalnet=fmnist", f"paths.data_dir={tmp_path / 'data'}",
                                                 f"paths.cache_dir={tmp_path / 'cache'}", "metrics.evalnet.epochs=1",
                                                 *overrides])
        GlobalHydra.instance().clear()
        return out

    shipped = pretrain_mod.pretrain(cfg("ship=true"))
    weights = tmp_path / "shipped" / f"{shipped['key']}.safetensors"
    assert Path(shipped["path"]) == weights and weights.is_file()
    sidecar = json.loads(weights.with_suffix(".json").read_text())
    assert sidecar["sha256"] == hashlib.sha256(weights.read_bytes()).hexdigest()
    assert sidecar["settings"] == {**_default_settings(), "epochs": 1} and "test_acc" in sidecar
    summary = pretrain_mod.format_evalnet_summary(shipped, 1.0)
    assert shipped["key"] in summary and sidecar["sha256"] in summary and "test" in summary

    monkeypatch.setattr(evalnet_mod, "train_classifier", _no_training)
    loaded = pretrain_mod.pretrain(cfg())
    assert loaded["source"] == "shipped" and loaded["key"] == shipped["key"]
    # a run's metric on the same data looks for the same key
    from dpsyn.task import family_loader

    run_cfg = compose_cfg([f"paths.data_dir={tmp_path / 'data'}", f"paths.cache_dir={tmp_path / 'cache'}",
                           "metrics.evalnet.epochs=1"])
    _, record = evalnet_mod.load_or_train_evalnet(family_loader(run_cfg)("fmnist"),
                                                  settings=dict(run_cfg.metrics.evalnet),
                                                  cache_dir=run_cfg.paths.cache_dir)
    assert record["source"] == "shipped" and record["key"] == shipped["key"]


def test_pretrain_command_refuses_bad_evalnet_requests(tmp_path: Path) -> None:
    from dpsyn.cli import pretrain as pretrain_mod

    def cfg(*overrides: str):
        GlobalHydra.instance().clear()
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            out = compose("pretrain", overrides=[f"paths.cache_dir={tmp_path / 'cache'}", *overrides])
        GlobalHydra.instance().clear()
        return out

    with pytest.raises(ValueError, match="evalnet='nope': no such dataset config; allowed: .*fmnist"):
        pretrain_mod.pretrain(cfg("evalnet=nope"))
    with pytest.raises(ValueError, match="ship=true ships an evaluation network"):
        pretrain_mod.pretrain(cfg("ship=true"))
