"""Public models of paper 000: the unit-ball clip, the encoders (embedded and real adapters), k-NN neighbourhoods,
the embedded IC-GAN, the cache, the configs and the pretrain command.

Real checkpoints are replaced by stand-ins written in their true on-disk format (a torchvision ResNet-50
state_dict; a SwAV-style dict with DataParallel's ``module.`` prefix; an IC-GAN release folder whose generator class
comes from a fake ``BigGAN_PyTorch`` package); training runs on tiny fake Fashion-MNIST files for a few steps.
"""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from omegaconf import OmegaConf

import dpsyn.public as public_mod
from dpsyn.data import fmnist as fmnist_mod
from dpsyn.config import load_group
from dpsyn.paths import CONF_DIR
from dpsyn.public import (
    EmbeddedEncoder,
    ICGANGenerator,
    PublicModels,
    ResNet50Encoder,
    SwAVEncoder,
    clip_to_unit_ball,
    load_public_models,
)
from dpsyn.public import icgan as icgan_mod
from dpsyn.public.icgan import InstanceConditionedGenerator, knn_indices, train_icgan
from tests.test_data import write_fake_fmnist

TINY_GAN = {"z_dim": 8, "ngf": 8, "ndf": 8, "k": 4, "knn_backend": "auto", "steps": 2, "batch_size": 16,
            "lr_g": 2e-4, "lr_d": 2e-4, "beta1": 0.5, "ema_decay": 0.9}


def _norms(v: np.ndarray) -> np.ndarray:
    return np.linalg.norm(np.asarray(v, dtype=np.float64), axis=-1)


# ---------------------------------------------------------------------------------------------- clip to unit ball


def test_clip_to_unit_ball_clips_and_counts() -> None:
    v = np.array([[0.3, 0.4], [0.5, 0.5], [3.0, 4.0], [0.0, 0.0], [-30.0, 40.0]], dtype=np.float32)
    out, n = clip_to_unit_ball(v)
    assert n == 2
    np.testing.assert_array_equal(out[[0, 1, 3]], v[[0, 1, 3]])  # inside the ball: untouched
    assert np.all(_norms(out) <= 1.0)
    np.testing.assert_allclose(out[2], [0.6, 0.8], rtol=1e-6)  # shrunk along its own direction
    np.testing.assert_allclose(out[4], [-0.6, 0.8], rtol=1e-6)
    np.testing.assert_array_equal(v[2], [3.0, 4.0])  # the input is not modified
    # float32 (0.6, 0.8) has a float64 norm of 1 + 1.5e-8: a violation, counted and fixed, not assumed away
    edge, n_edge = clip_to_unit_ball(np.array([[0.6, 0.8]], dtype=np.float32))
    assert n_edge == 1 and _norms(edge)[0] <= 1.0

    single, n1 = clip_to_unit_ball(np.array([2.0, 0.0]))
    assert n1 == 1 and single.shape == (2,) and _norms(single) <= 1.0

    t, nt = clip_to_unit_ball(torch.tensor([[3.0, 4.0], [0.1, 0.1]]), max_norm=2.0)
    assert isinstance(t, torch.Tensor) and nt == 1
    torch.testing.assert_close(t[0], torch.tensor([1.2, 1.6]))


def test_clip_enforces_the_bound_exactly_on_rounded_unit_vectors() -> None:
    # float32 L2-normalisation leaves norms a few ulps above 1: the bound must hold after the clip, not "about"
    v = np.random.default_rng(0).normal(size=(5000, 64))
    v = (v / np.linalg.norm(v, axis=1, keepdims=True)).astype(np.float32) * np.float32(1.0 + 1e-7)
    out, n = clip_to_unit_ball(v)
    assert n > 0
    assert np.all(_norms(out) <= 1.0)
    np.testing.assert_allclose(_norms(out), 1.0, atol=1e-6)


def test_clip_rejects_non_finite_features() -> None:
    with pytest.raises(ValueError, match="NaN or infinite"):
        clip_to_unit_ball(np.array([[np.nan, 0.0]]))
    with pytest.raises(ValueError, match="max_norm"):
        clip_to_unit_ball(np.ones((1, 2)), max_norm=0.0)


# ---------------------------------------------------------------------------------------------------- encoders


def test_embedded_encoder_outputs_lie_in_the_unit_ball() -> None:
    torch.manual_seed(0)
    enc = EmbeddedEncoder(feature_dim=16, width=8)
    x = np.random.default_rng(0).random((37, 1, 28, 28), dtype=np.float32)
    f = enc.encode(x, batch_size=10)
    assert f.shape == (37, 16) and f.dtype == np.float32
    assert np.all(_norms(f) <= 1.0)
    np.testing.assert_allclose(_norms(f), 1.0, atol=1e-5)  # L2-normalised
    with pytest.raises(ValueError, match=r"\(1, 28, 28\)"):
        enc.encode(np.zeros((2, 3, 32, 32), dtype=np.float32))


@pytest.fixture(scope="module")
def resnet_state() -> dict[str, torch.Tensor]:
    import torchvision

    torch.manual_seed(0)
    return torchvision.models.resnet50(weights=None).state_dict()


def test_resnet50_adapter_loads_local_weights(tmp_path: Path, resnet_state) -> None:
    path = tmp_path / "resnet50-11ad3fa6.pth"
    torch.save(resnet_state, path)
    enc = ResNet50Encoder(path, resolution=64)
    torch.testing.assert_close(enc.net.conv1.weight, resnet_state["conv1.weight"])
    x = np.random.default_rng(0).random((2, 3, 64, 64), dtype=np.float32)
    f = enc.encode(x)
    assert f.shape == (2, 2048) and enc.feature_dim == 2048
    assert np.all(_norms(f) <= 1.0)
    assert enc.encode(x[:, :1]).shape == (2, 2048)  # grey images are repeated to RGB


def test_swav_adapter_strips_module_prefix(tmp_path: Path, resnet_state) -> None:
    state = {f"module.{k}": v for k, v in resnet_state.items() if not k.startswith("fc.")}
    state["module.projection_head.0.weight"] = torch.zeros(4, 2048)  # SwAV's head and prototypes: not backbone
    state["module.prototypes.weight"] = torch.zeros(3, 4)
    path = tmp_path / "swav_800ep_pretrain.pth.tar"
    torch.save(state, path)
    enc = SwAVEncoder(path, resolution=64)
    torch.testing.assert_close(enc.net.layer4[2].conv3.weight, resnet_state["layer4.2.conv3.weight"])
    f = enc.encode(np.random.default_rng(1).random((2, 3, 64, 64), dtype=np.float32))
    assert f.shape == (2, 2048) and np.all(_norms(f) <= 1.0)

    torch.save({"state_dict": {"module.conv1.weight": resnet_state["conv1.weight"]}}, path)  # truncated file
    with pytest.raises(ValueError, match="not a SwAV ResNet-50 checkpoint"):
        SwAVEncoder(path, resolution=64)


def test_missing_checkpoints_say_what_to_download(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"resnet50-11ad3fa6\.pth") as err:
        ResNet50Encoder(tmp_path / "checkpoints" / "resnet50-11ad3fa6.pth")
    assert "download.pytorch.org" in str(err.value)
    with pytest.raises(FileNotFoundError, match=r"swav_800ep_pretrain\.pth\.tar"):
        SwAVEncoder(tmp_path / "checkpoints" / "swav_800ep_pretrain.pth.tar")
    with pytest.raises(FileNotFoundError, match=r"icgan_biggan_imagenet_res256\.tar\.gz"):
        ICGANGenerator(tmp_path / "checkpoints" / "icgan_biggan_imagenet_res256")
    # the shipped real config points under data_dir/checkpoints and fails the same way
    with pytest.raises(FileNotFoundError, match=r"swav_800ep_pretrain\.pth\.tar") as err:
        load_public_models(load_group("public", "imagenet"), cache_dir=tmp_path,
                           data_dir=tmp_path)
    assert str(tmp_path / "checkpoints") in str(err.value)


# ------------------------------------------------------------------------------------------------ IC-GAN adapter

FAKE_BIGGAN = '''
import torch
from torch import nn


class Generator(nn.Module):
    def __init__(self, dim_z=8, resolution=8, shared_dim_feat=16, skip_init=False, no_optim=False, **kwargs):
        super().__init__()
        assert skip_init and no_optim
        self.dim_z, self.resolution = dim_z, resolution
        self.fc = nn.Linear(dim_z + shared_dim_feat, 3 * resolution * resolution)

    def forward(self, z, label=None, feats=None):
        assert label is None
        out = self.fc(torch.cat([z, feats], 1)).view(len(z), 3, self.resolution, self.resolution)
        return torch.tanh(out)
'''


def _fake_icgan_release(tmp_path: Path) -> Path:
    """An ic_gan checkout (only BigGAN_PyTorch/BigGAN.py) and a release folder in its on-disk layout."""
    code = tmp_path / "ic_gan" / "BigGAN_PyTorch"
    code.mkdir(parents=True)
    (code / "__init__.py").write_text("")
    (code / "BigGAN.py").write_text(textwrap.dedent(FAKE_BIGGAN))
    release = tmp_path / "checkpoints" / "icgan_biggan_imagenet_res256"
    release.mkdir(parents=True)
    config = {"dim_z": 8, "resolution": 8, "shared_dim_feat": 16, "G_lr": 1e-4, "experiment_name": "x"}
    torch.save({"config": config, "best_FID": 9.0}, release / "state_dict_best0.pth")
    torch.save({"config": config, "best_FID": 7.0}, release / "state_dict_best1.pth")  # the better one
    torch.manual_seed(0)
    fc = torch.nn.Linear(24, 192)
    torch.save({"fc.weight": fc.weight.detach(), "fc.bias": fc.bias.detach()}, release / "G_ema_best1.pth")
    return release


@pytest.fixture
def isolated_biggan(monkeypatch: pytest.MonkeyPatch):
    """Whatever ``BigGAN_PyTorch`` a test imports is forgotten afterwards (and a real one is hidden meanwhile)."""
    names = ("BigGAN_PyTorch", "BigGAN_PyTorch.BigGAN")
    for name in names:
        monkeypatch.delitem(sys.modules, name, raising=False)
    yield monkeypatch
    for name in names:
        sys.modules.pop(name, None)


def test_icgan_adapter_needs_ic_gan_code(tmp_path: Path, isolated_biggan: pytest.MonkeyPatch) -> None:
    release = _fake_icgan_release(tmp_path)
    isolated_biggan.setitem(sys.modules, "BigGAN_PyTorch", None)  # None in sys.modules: the import fails
    with pytest.raises(ImportError, match="facebookresearch/ic_gan"):
        ICGANGenerator(release)


def test_icgan_adapter_loads_a_release_through_ic_gan(tmp_path: Path, isolated_biggan: pytest.MonkeyPatch) -> None:
    release = _fake_icgan_release(tmp_path)
    isolated_biggan.syspath_prepend(str(tmp_path / "ic_gan"))
    gen = ICGANGenerator(release, truncation=1.0)
    assert gen.record["best_fid"] == 7.0 and gen.record["checkpoint"].endswith("G_ema_best1.pth")
    assert (gen.z_dim, gen.feature_dim, gen.image_shape) == (8, 16, (3, 8, 8))
    feats = np.random.default_rng(0).normal(size=(5, 16)).astype(np.float32)
    a = gen.decode(feats, generator=torch.Generator().manual_seed(1))
    b = gen.decode(feats, generator=torch.Generator().manual_seed(1))
    assert a.shape == (5, 3, 8, 8) and a.min() >= 0 and a.max() <= 1
    np.testing.assert_array_equal(a, b)


# -------------------------------------------------------------------------------------------- k-NN and IC-GAN


def _unit_rows(n: int, d: int, seed: int) -> np.ndarray:
    v = np.random.default_rng(seed).normal(size=(n, d))
    return (v / np.linalg.norm(v, axis=1, keepdims=True)).astype(np.float32)


def _brute_force_knn(f: np.ndarray, k: int) -> np.ndarray:
    sims = f.astype(np.float64) @ f.astype(np.float64).T
    return np.argsort(-sims, axis=1, kind="stable")[:, :k]


@pytest.mark.parametrize("backend", ["torch", "faiss"])
def test_knn_neighbourhoods_equal_brute_force_top_k(backend: str) -> None:
    if backend == "faiss":
        pytest.importorskip("faiss")
    f = _unit_rows(700, 16, seed=0)
    got = knn_indices(f, 7, backend=backend, batch_size=128)
    want = _brute_force_knn(f, 7)
    assert got.shape == (700, 7) and got.dtype == np.int64
    assert all(set(g) == set(w) for g, w in zip(got, want))
    np.testing.assert_array_equal(got[:, 0], np.arange(700))  # an instance is its own nearest neighbour
    with pytest.raises(ValueError, match="k=0"):
        knn_indices(f, 0)


def test_icgan_trains_and_decodes_images_in_unit_range() -> None:
    rng = np.random.default_rng(0)
    x = rng.random((64, 1, 28, 28), dtype=np.float32)
    y = np.arange(64) % 4
    gen, record = train_icgan(x, _unit_rows(64, 12, seed=1), settings=TINY_GAN, seed=0, labels=y, progress=False)
    assert record["steps"] == 2 and 0.0 <= record["neighbourhood_purity"] <= 1.0
    assert np.isfinite(record["final_loss_d"]) and np.isfinite(record["final_loss_g"])
    feats = rng.normal(size=(9, 12)).astype(np.float32)  # off the sphere: decode normalises
    a = gen.decode(feats, generator=torch.Generator().manual_seed(3), batch_size=4)
    assert a.shape == (9, 1, 28, 28) and a.dtype == np.float32
    assert a.min() >= 0.0 and a.max() <= 1.0
    np.testing.assert_array_equal(a, gen.decode(feats, generator=torch.Generator().manual_seed(3), batch_size=4))
    # the noise does not depend on the batch size (only float rounding of batched convs does)
    np.testing.assert_allclose(a, gen.decode(feats, generator=torch.Generator().manual_seed(3)), atol=1e-5)
    assert not np.array_equal(a, gen.decode(feats, generator=torch.Generator().manual_seed(4)))
    with pytest.raises(ValueError, match=r"\(N, 12\)"):
        gen.decode(np.zeros((2, 5), dtype=np.float32))


# --------------------------------------------------------------------------------------- cache and configs


@pytest.fixture
def fake_fmnist_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A data_dir with tiny Fashion-MNIST files (200 train, 50 test) and Debian's copy hidden."""
    monkeypatch.setattr(fmnist_mod, "SYSTEM_DIRS", (tmp_path / "nowhere",))
    write_fake_fmnist(tmp_path / "data")
    return tmp_path / "data"


def _tiny_cfg(**extra: object):
    cfg = load_group("public", "fmnist")
    tiny = {"encoder": {"feature_dim": 8, "width": 4, "epochs": 1, "batch_size": 32}, "generator": TINY_GAN,
            "quality": {"n": 0}}
    return OmegaConf.merge(cfg, tiny, extra)


def test_cache_round_trip_does_not_retrain(tmp_path: Path, fake_fmnist_dir: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    cache = tmp_path / "cache"
    first = load_public_models(_tiny_cfg(), cache_dir=cache, data_dir=fake_fmnist_dir, progress=False)
    assert isinstance(first, PublicModels) and first.feature_dim == 8
    rec = first.record
    assert rec["encoder"]["data"]["n_public"] == 100 and "test_acc" in rec["encoder"]
    for part in ("encoder", "generator"):
        assert Path(rec["cache"][part]).is_file() and Path(rec["cache"][part]).with_suffix(".json").is_file()
        assert len(rec[part]["sha256"]) == 64

    def no_training(*args, **kwargs):
        raise AssertionError("cached public models must not be retrained")

    monkeypatch.setattr(public_mod, "train_classifier", no_training)
    monkeypatch.setattr(public_mod, "train_icgan", no_training)
    second = load_public_models(_tiny_cfg(), cache_dir=cache, data_dir=fake_fmnist_dir, progress=False)
    assert second.record["encoder"] == rec["encoder"] and second.record["generator"] == rec["generator"]
    for a, b in ((first.encoder, second.encoder), (first.generator, second.generator)):
        sa, sb = a.state_dict(), b.state_dict()
        assert sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)

    x = np.random.default_rng(0).random((6, 1, 28, 28), dtype=np.float32)
    f = second.encode(x, batch_size=4)
    assert f.shape == (6, 8) and np.all(_norms(f) <= 1.0)
    np.testing.assert_array_equal(f, first.encode(x))
    img = second.decode(f, generator=torch.Generator().manual_seed(0))
    assert img.shape == (6, 1, 28, 28) and img.min() >= 0 and img.max() <= 1

    # another generator setting -> another key: the encoder is reused, the generator would be retrained
    with pytest.raises(AssertionError, match="must not be retrained"):
        load_public_models(_tiny_cfg(generator={"steps": 3}), cache_dir=cache, data_dir=fake_fmnist_dir,
                           progress=False)


def test_public_configs_load_stand_alone_and_are_checked() -> None:
    for name in ("fmnist", "imagenet"):
        cfg = load_group("public", name)
        public_mod.check_public_config(OmegaConf.to_container(cfg, resolve=True))
    bad = OmegaConf.to_container(_tiny_cfg())
    bad["encoder"]["dim"] = 3
    with pytest.raises(ValueError, match="unknown key public.encoder.dim"):
        public_mod.check_public_config(bad)
    bad = OmegaConf.to_container(_tiny_cfg(kind="pretrained"))
    with pytest.raises(ValueError, match="public.kind='pretrained'; allowed: embedded, real"):
        public_mod.check_public_config(bad)
    bad = OmegaConf.to_container(_tiny_cfg(generator={"knn_backend": "annoy"}))
    with pytest.raises(ValueError, match="knn_backend='annoy'; allowed"):
        public_mod.check_public_config(bad)


def test_pretrain_command_trains_and_reports(tmp_path: Path, fake_fmnist_dir: Path, capsys) -> None:
    from dpsyn.cli import pretrain as pretrain_mod

    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose("pretrain", overrides=[
            "public=fmnist", f"paths.cache_dir={tmp_path / 'cache'}", f"paths.data_dir={fake_fmnist_dir}",
            "public.encoder.width=4", "public.encoder.feature_dim=8", "public.encoder.epochs=1",
            "public.generator.steps=1", "public.generator.ngf=8", "public.generator.ndf=8",
            "public.generator.batch_size=16", "public.generator.k=4", "public.quality.n=0",
            f"grid={tmp_path / 'grid.png'}",
        ])
    GlobalHydra.instance().clear()
    record = pretrain_mod.pretrain(cfg)
    summary = pretrain_mod.format_summary(record, 1.0)
    assert record["cache"]["encoder"] in summary and record["cache"]["generator"] in summary
    assert "test acc" in summary
    assert (tmp_path / "grid.png").stat().st_size > 0


def test_icgan_module_imports_faiss_or_falls_back() -> None:
    f = _unit_rows(50, 4, seed=2)
    if icgan_mod.faiss is None:
        with pytest.raises(ImportError, match="faiss-cpu"):
            knn_indices(f, 3, backend="faiss")
    np.testing.assert_array_equal(knn_indices(f, 3, backend="auto")[:, 0], np.arange(50))


def test_embedded_generator_decode_validates_features() -> None:
    gen = InstanceConditionedGenerator(z_dim=4, feature_dim=6, ngf=4)
    with pytest.raises(ValueError, match="NaN"):
        gen.decode(np.full((1, 6), np.nan, dtype=np.float32))


def test_shipped_public_models_match_the_default_config_and_load_without_training(tmp_path: Path, monkeypatch) -> None:
    """The package ships the default embedded models: their key is the one conf/public/fmnist.yaml gives on the
    embedded data (so the pretrain command's architecture and settings produced them), their sha256 matches the
    sidecar, and a run with an empty cache loads them instead of training."""
    import hashlib
    import json

    from dpsyn.public import SHIPPED_DIR

    # paper 000's models (the shipped diffusion model of PE is checked in tests/test_public_diffusion.py)
    shipped = sorted(p for p in SHIPPED_DIR.glob("*.safetensors") if "-diffusion-" not in p.name)
    assert {p.name.split("-")[1] for p in shipped} == {"encoder", "icgan"}
    for w in shipped:
        record = json.loads(w.with_suffix(".json").read_text())
        assert hashlib.sha256(w.read_bytes()).hexdigest() == record["sha256"]
        assert record["key"] == w.stem
    if not Path("/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz").is_file():
        pytest.skip("the shipped keys are for Debian's dataset-fashion-mnist files")

    def no_training(*args, **kwargs):
        raise AssertionError("trained although shipped weights exist")

    monkeypatch.setattr(public_mod, "train_icgan", no_training)
    monkeypatch.setattr(public_mod, "train_classifier", no_training)
    cfg = load_group("public", "fmnist")
    models = public_mod.load_public_models(cfg, cache_dir=tmp_path / "empty", data_dir=tmp_path / "data")
    assert {Path(models.record[k]["shipped"]).stem for k in ("encoder", "generator")} == {p.stem for p in shipped}
    x = np.random.default_rng(0).random((4, 1, 28, 28), dtype=np.float32)
    feats = models.encode(x)
    assert feats.shape == (4, 64) and np.all(np.linalg.norm(feats, axis=1) <= 1 + 1e-6)
    assert models.decode(feats, generator=torch.Generator().manual_seed(0)).shape == (4, 1, 28, 28)
