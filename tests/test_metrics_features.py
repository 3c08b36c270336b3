"""Feature extractors and the feature cache: InceptionV3 and CLIP loading paths exercised with stand-in checkpoints
written by the tests (no network, no real weights), the evaluation-network adapter, and cache hits/misses."""

from __future__ import annotations

import sys
import types
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from dpsyn.data.base import DataBundle, Split
from dpsyn.metrics import features as feat
from dpsyn.metrics.features import (
    FEATURE_EXTRACTORS,
    FeatureExtractor,
    build_feature_extractor,
    cached_features,
    check_images,
    features_cache_path,
    to_uint8,
)


@pytest.fixture(autouse=True)
def _keep_global_rng() -> Iterator[None]:
    """These tests seed and draw from torch's global RNG (stand-in weights, evaluation-network training): restore it
    afterwards so that tests running later see the state they would have seen without these."""
    with torch.random.fork_rng():
        yield


def _images(n: int = 4, c: int = 1, side: int = 28, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).random((n, c, side, side), dtype=np.float32)


def test_registry_names_the_extractors() -> None:
    assert {"inception", "evalnet", "clip"} <= set(FEATURE_EXTRACTORS.names())
    with pytest.raises(ValueError, match="inception"):
        build_feature_extractor("vgg")
    with pytest.raises(ValueError, match="evalnet_<family>"):
        build_feature_extractor("evalnet")


def test_images_are_validated_and_quantised_like_png() -> None:
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        check_images(_images() * 2)
    with pytest.raises(ValueError, match=r"\(N, C, H, W\)"):
        check_images(_images()[0])
    with pytest.raises(ValueError, match="channels"):
        check_images(_images(c=2), channels=(1, 3))
    np.testing.assert_array_equal(to_uint8(np.array([0.0, 0.5 / 255, 0.49 / 255, 1.0])), [0, 1, 0, 255])


# ----------------------------------------------------------------------------------------------------- cache


class _Counting(FeatureExtractor):
    """A cheap extractor that counts how often it really computes."""

    name = "counting"
    provides = ("features", "logits")
    feature_dim = 3
    resolution = None

    def __init__(self, tag: str = "v1") -> None:
        self.calls = 0
        self.tag = tag

    @property
    def identity(self) -> str:
        return f"counting-{self.tag}"

    def extract(self, x: np.ndarray) -> dict[str, np.ndarray]:
        self.calls += 1
        flat = x.reshape(len(x), -1).astype(np.float64)
        f = np.stack([flat.mean(1), flat.std(1), flat.max(1)], axis=1)
        return {"features": f, "logits": f[:, :2] * 2}


def test_feature_cache_computes_once_per_content_and_extractor(tmp_path: Path) -> None:
    ex, x = _Counting(), _images()
    first = cached_features(ex, x, key="toy/eval", cache_dir=tmp_path)
    assert ex.calls == 1 and first.shape == (4, 3) and first.dtype == np.float64
    again = cached_features(ex, x.copy(), key="toy/eval", cache_dir=tmp_path)
    logits = cached_features(ex, x, key="toy/eval", cache_dir=tmp_path, layer="logits")  # stored by the same pass
    assert ex.calls == 1
    np.testing.assert_array_equal(again, first)
    np.testing.assert_array_equal(logits, first[:, :2] * 2)
    assert features_cache_path(ex, x, key="toy/eval", cache_dir=tmp_path).parent == tmp_path / "features"

    other = x.copy()
    other[0, 0, 0, 0] = 0.123  # one pixel differs -> another key -> computed
    assert features_cache_path(ex, other, key="toy/eval", cache_dir=tmp_path) != features_cache_path(
        ex, x, key="toy/eval", cache_dir=tmp_path
    )
    cached_features(ex, other, key="toy/eval", cache_dir=tmp_path)
    assert ex.calls == 2
    retrained = _Counting(tag="v2")  # same name, other weights -> computed
    cached_features(retrained, x, key="toy/eval", cache_dir=tmp_path)
    assert retrained.calls == 1
    with pytest.raises(ValueError, match="provides"):
        cached_features(ex, x, key="toy/eval", cache_dir=tmp_path, layer="pool3")


# --------------------------------------------------------------------------------------------------- inception


def _write_inception_stand_in(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Save a randomly initialised torch-fidelity InceptionV3 state dict (the real structure, random weights).

    torch-fidelity's constructor always loads weights; both loaders are disabled while building the stand-in.
    """
    import torch_fidelity.feature_extractor_inceptionv3 as tf_inception

    cls = tf_inception.FeatureExtractorInceptionV3
    with monkeypatch.context() as m:
        m.setattr(tf_inception, "load_state_dict_from_url", lambda *a, **k: None)
        m.setattr(cls, "load_state_dict", lambda self, *a, **k: None)
        torch.manual_seed(0)
        net = cls("stand-in", ["2048"])
    torch.save(net.state_dict(), path)


def test_inception_loads_a_stand_in_checkpoint_and_gives_2048_d_features(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    weights = tmp_path / "inception.pth"
    _write_inception_stand_in(weights, monkeypatch)
    monkeypatch.setenv(feat.INCEPTION_WEIGHTS_ENV, str(weights))  # found through the environment variable
    ex = build_feature_extractor("inception", device="cpu")
    assert (ex.name, ex.feature_dim, ex.resolution, ex.provides) == ("inception", 2048, 299, ("features", "logits"))
    assert ex.weights_path == weights and ex.identity.startswith("inception-v3-compat-")

    grey = _images(n=1, c=1, side=32)
    out = ex.extract(grey)
    assert out["features"].shape == (1, 2048) and out["logits"].shape == (1, 1008)
    assert out["features"].dtype == np.float64 and np.isfinite(out["features"]).all()
    # grey is repeated to 3 channels and quantised to uint8 before torch-fidelity's network
    with torch.inference_mode():
        ref = ex.net(torch.from_numpy(np.repeat(to_uint8(grey), 3, axis=1)))[0].double().numpy()
    np.testing.assert_array_equal(out["features"], ref)


def test_inception_without_weights_says_where_it_looked_and_names_the_alternative(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(feat.INCEPTION_WEIGHTS_ENV, raising=False)
    monkeypatch.setattr(torch.hub, "get_dir", lambda: str(tmp_path / "hub"))
    with pytest.raises(FileNotFoundError) as err:
        feat.inception()
    msg = str(err.value)
    assert str(tmp_path / "hub" / "checkpoints" / feat.INCEPTION_WEIGHTS_FILE) in msg
    assert "evalnet_<family>" in msg and "fd_<family>" in msg and feat.INCEPTION_WEIGHTS_ENV in msg
    with pytest.raises(FileNotFoundError, match="nowhere.pth"):
        feat.inception(tmp_path / "nowhere.pth")
    wrong = tmp_path / "wrong.pth"
    torch.save(nn.Linear(2, 2).state_dict(), wrong)
    with pytest.raises(ValueError, match="not an InceptionV3 state dict"):
        feat.inception(wrong)


# ------------------------------------------------------------------------------------------------------- clip


def test_clip_without_open_clip_raises_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "open_clip", None)  # makes `import open_clip` fail even where it is installed
    with pytest.raises(ImportError, match="open_clip.*pip install open_clip_torch"):
        build_feature_extractor("clip", checkpoint_path="whatever.pt")


class _TinyVisual(nn.Module):
    image_size = 16
    output_dim = 8

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(3 * 16 * 16, 8)


class _TinyClip(nn.Module):
    """Stand-in of an open_clip model: ``visual`` with ``image_size``/``output_dim`` and ``encode_image``."""

    def __init__(self) -> None:
        super().__init__()
        self.visual = _TinyVisual()

    def encode_image(self, x: torch.Tensor) -> torch.Tensor:
        assert x.shape[1:] == (3, 16, 16), x.shape  # the adapter resized and expanded the images
        return self.visual.proj(x.flatten(1))


def _fake_open_clip() -> types.ModuleType:
    mod = types.ModuleType("open_clip")

    def create_model_and_transforms(name: str, pretrained: str, device: torch.device):
        model = _TinyClip()
        model.load_state_dict(torch.load(pretrained))
        return model.to(device), None, None

    mod.create_model_and_transforms = create_model_and_transforms
    return mod


def test_clip_adapter_loads_a_stand_in_checkpoint(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "open_clip", _fake_open_clip())
    monkeypatch.delenv(feat.CLIP_CHECKPOINT_ENV, raising=False)
    with pytest.raises(FileNotFoundError, match=feat.CLIP_CHECKPOINT_ENV):
        build_feature_extractor("clip")
    torch.manual_seed(0)
    reference = _TinyClip()
    ckpt = tmp_path / "clip.pt"
    torch.save(reference.state_dict(), ckpt)
    ex = build_feature_extractor("clip", checkpoint_path=ckpt, model_name="tiny", device="cpu")
    assert (ex.feature_dim, ex.resolution, ex.provides) == (8, 16, ("features",))
    x = _images(n=3, c=1, side=16)
    got = ex.features(x)
    mean = torch.tensor(feat._CLIP_MEAN).view(1, 3, 1, 1)
    std = torch.tensor(feat._CLIP_STD).view(1, 3, 1, 1)
    with torch.no_grad():
        expected = reference.encode_image((torch.from_numpy(x).repeat(1, 3, 1, 1) - mean) / std).double().numpy()
    np.testing.assert_allclose(got, expected, rtol=1e-6)
    assert ex.features(_images(n=2, c=3, side=28)).shape == (2, 8)  # resized to the model's side
    with pytest.raises(ValueError, match="not logits"):
        ex.logits(x)


# ---------------------------------------------------------------------------------------------------- evalnet


def _bundle(n: int = 300) -> DataBundle:
    rng = np.random.default_rng(0)
    y = (np.arange(n) % 2).astype(np.int64)
    x = (rng.random((n, 1, 28, 28)) * 0.3 + 0.6 * y[:, None, None, None]).astype(np.float32)
    split = Split(x, y)
    return DataBundle(name="toy", kind="image", private=split, eval=split, classes=["dark", "bright"], family="toy",
                      info={"source": "synthetic"})


def test_evalnet_adapter_gives_the_networks_features_and_logits(tmp_path: Path) -> None:
    from dpsyn.lit.classifier import predict
    from dpsyn.metrics.evalnet import extract_features

    settings = {"epochs": 1, "batch_size": 64, "lr": 1e-3, "val_fraction": 0.1, "limit_train_batches": 2}
    ex = build_feature_extractor("evalnet_toy", family_data=_bundle(), settings=settings, cache_dir=tmp_path)
    assert (ex.name, ex.feature_dim, ex.resolution, ex.provides) == ("evalnet_toy", 128, 28, ("features", "logits"))
    assert ex.identity.startswith(ex.record["key"])
    x = _bundle().eval.x[:16]
    np.testing.assert_allclose(ex.features(x), extract_features(ex.net, x), rtol=1e-6)
    np.testing.assert_allclose(ex.logits(x), predict(ex.net, x), rtol=1e-6)
    with pytest.raises(ValueError, match="28x28"):
        ex.features(_images(side=32))
    with pytest.raises(ValueError, match="family"):
        build_feature_extractor("evalnet_cifar10", family_data=_bundle(), settings=settings, cache_dir=tmp_path)
