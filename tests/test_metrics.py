"""First metrics: Frechet distance (cross-checked with torchmetrics), the evaluation-network cache, downstream accuracy."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dpsyn.data.base import DataBundle, Split
from dpsyn.metrics import evalnet as evalnet_mod
from dpsyn.metrics import utility
from dpsyn.metrics.fidelity import feature_statistics, frechet_distance, frechet_distance_from_features


def test_frechet_distance_matches_torchmetrics() -> None:
    from torchmetrics.image.fid import _compute_fid

    rng = np.random.default_rng(0)
    a = rng.normal(size=(500, 16))
    b = rng.normal(loc=0.3, scale=1.5, size=(400, 16)) @ rng.normal(size=(16, 16)) * 0.5
    mu1, s1 = feature_statistics(a)
    mu2, s2 = feature_statistics(b)
    ref = _compute_fid(torch.from_numpy(mu1), torch.from_numpy(s1), torch.from_numpy(mu2), torch.from_numpy(s2)).item()
    assert frechet_distance(mu1, s1, mu2, s2) == pytest.approx(ref, rel=1e-6)


def test_frechet_distance_of_gaussians_in_closed_form() -> None:
    # diagonal covariances: FD = |mu1-mu2|^2 + sum (s1 + s2 - 2 sqrt(s1 s2))
    mu1, mu2 = np.zeros(3), np.array([1.0, 2.0, 0.0])
    s1, s2 = np.diag([1.0, 4.0, 9.0]), np.diag([4.0, 1.0, 9.0])
    assert frechet_distance(mu1, s1, mu2, s2) == pytest.approx(5 + (1 + 4 - 4) + (4 + 1 - 4) + 0)
    x = np.random.default_rng(1).normal(size=(300, 4))
    assert frechet_distance_from_features(x, x) == pytest.approx(0, abs=1e-8)


def _bundle(n: int = 400, seed: int = 0) -> DataBundle:
    """Two visually distinct classes (dark vs bright images): learnable in a few steps."""
    rng = np.random.default_rng(seed)
    y = (np.arange(n) % 2).astype(np.int64)
    x = (rng.random((n, 1, 28, 28)) * 0.3 + 0.6 * y[:, None, None, None]).astype(np.float32)
    split = Split(x, y)
    return DataBundle(name="toy", kind="image", private=split, eval=split, classes=["dark", "bright"], family="toy",
                      info={"source": "synthetic"})


def test_evalnet_is_trained_once_then_loaded_from_cache(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    settings = {"epochs": 1, "batch_size": 64, "lr": 1e-3, "val_fraction": 0.1, "limit_train_batches": None}
    net, record = evalnet_mod.load_or_train_evalnet(_bundle(), settings=settings, cache_dir=tmp_path)
    assert record["test_acc"] > 0.9
    assert (tmp_path / "evalnet" / f"{record['key']}.safetensors").exists()

    def no_training(*a, **k):
        raise AssertionError("the cached evaluation network must be reused")

    monkeypatch.setattr(evalnet_mod, "train_classifier", no_training)
    net2, record2 = evalnet_mod.load_or_train_evalnet(_bundle(), settings=settings, cache_dir=tmp_path)
    assert (record["source"], record2["source"]) == ("trained", "cache")
    assert {k: v for k, v in record2.items() if k not in ("source", "sha256")} == {
        k: v for k, v in record.items() if k != "source"}
    x = torch.from_numpy(_bundle().private.x[:8])
    torch.testing.assert_close(net.features(x), net2.features(x))
    # other settings -> another key -> trained again (here: refused, proving the key changed)
    with pytest.raises(AssertionError, match="cached"):
        evalnet_mod.load_or_train_evalnet(_bundle(), settings={**settings, "lr": 2e-3}, cache_dir=tmp_path)


def test_downstream_accuracy_touches_the_test_split_once(monkeypatch: pytest.MonkeyPatch) -> None:
    synthetic, test = _bundle(seed=1).private, _bundle(seed=2).private
    calls = []
    real_predict = utility.predict

    def spy(net, x, **kw):
        calls.append(x)
        return real_predict(net, x, **kw)

    monkeypatch.setattr(utility, "predict", spy)
    out = utility.downstream_accuracy((synthetic.x, synthetic.y), (test.x, test.y), num_classes=2, epochs=2,
                                      batch_size=32, lr=1e-3, val_fraction=0.2, seed=0)
    assert sum(c is test.x for c in calls) == 1 and len(calls) == 1
    assert out["acc"] > 0.9 and out["acc_synthetic_val"] > 0.9


def test_downstream_accuracy_reflects_label_quality() -> None:
    """Synthetic data with shuffled labels must score near chance: the metric measures the data, not the setup."""
    good, test = _bundle(seed=1).private, _bundle(seed=2).private
    bad_y = np.random.default_rng(0).permutation(good.y)
    out = utility.downstream_accuracy((good.x, bad_y), (test.x, test.y), num_classes=2, epochs=2, batch_size=32,
                                      lr=1e-3, val_fraction=0.2, seed=0)
    assert out["acc"] < 0.75
