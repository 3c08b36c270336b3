"""Utility metrics: the sealed test split, downstream accuracy (ensembles, WRN-40-4), tabular AUROC/AUPRC."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dpsyn.metrics import tabular, utility
from dpsyn.metrics.sealed import SealedSplit, TestSetReuseError, seal
from dpsyn.nets.wrn import WideResNet, wrn_40_4

# ------------------------------------------------------------------------------------------------ sealed split


def test_sealed_split_refuses_a_second_read_and_logs_readers() -> None:
    x, y = np.arange(10.0)[:, None], np.arange(10) % 2
    split = SealedSplit(x, y, name="toy/test")
    seen = []

    def predict_fn(inputs):
        seen.append(inputs)
        return inputs[:, 0] % 2  # predicted labels

    out = split.evaluate_once(predict_fn, reader="first")
    assert out == {"acc": 1.0}
    assert split.n_reads == 1 and split.reads_left == 0 and split.reads[0]["reader"] == "first"
    with pytest.raises(TestSetReuseError, match="already read 1 time.*first"):
        split.evaluate_once(predict_fn, reader="second")
    assert len(seen) == 1, "a refused read must not hand the inputs out"
    assert split.n_reads == 1


def test_sealed_split_gives_labels_only_to_the_metric_and_honours_max_reads() -> None:
    x, y = np.zeros((4, 3)), np.array([0, 1, 1, 0])
    split = SealedSplit(x, y, max_reads=2)
    got = {}

    def predict_fn(*args):
        got["predict_args"] = len(args)
        return np.ones(4)

    def metric_fn(labels, pred):
        got["labels"] = labels
        return {"n": len(pred)}

    assert split.evaluate_once(predict_fn, metric_fn) == {"n": 4}
    assert got["predict_args"] == 1 and got["labels"] is split._y
    assert split.reads[0]["reader"].endswith("test_sealed_split_gives_labels_only_to_the_metric_and_honours_max_reads")
    split.evaluate_once(predict_fn, metric_fn)
    with pytest.raises(TestSetReuseError):
        split.evaluate_once(predict_fn, metric_fn)
    assert seal(split) is split
    assert seal((x, y)).max_reads == 1
    with pytest.raises(ValueError, match="rows"):
        SealedSplit(x, y[:3])
    with pytest.raises(ValueError, match="max_reads"):
        SealedSplit(x, y, max_reads=0)
    with pytest.raises(ValueError, match="SealedSplit or an"):
        seal(x)


# ------------------------------------------------------------------------------------------- downstream accuracy


def _images(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Two visually distinct classes (dark vs bright 28x28 images)."""
    rng = np.random.default_rng(seed)
    y = (np.arange(n) % 2).astype(np.int64)
    x = (rng.random((n, 1, 28, 28)) * 0.3 + 0.6 * y[:, None, None, None]).astype(np.float32)
    return x, y


def test_downstream_ensemble_of_three_reads_the_sealed_test_split_once(monkeypatch: pytest.MonkeyPatch) -> None:
    synthetic, (tx, ty) = _images(240, 1), _images(200, 2)
    split = SealedSplit(tx, ty, name="toy/test")
    calls = []
    real_predict = utility.predict

    def spy(net, x, **kw):
        calls.append((x is tx, split.n_reads))
        return real_predict(net, x, **kw)

    monkeypatch.setattr(utility, "predict", spy)
    out = utility.downstream_accuracy(synthetic, split, num_classes=2, epochs=2, batch_size=32, lr=1e-3,
                                      val_fraction=0.25, seed=3, ensemble=3, progress=False)
    assert split.n_reads == 1 and out["test_reads"] == 1
    assert "downstream_accuracy" in split.reads[0]["reader"]
    # three members predicted the test inputs, all inside the one read (plus three predictions on held-out synthetic)
    assert sum(is_test for is_test, _ in calls) == 3
    assert all(n_reads == 1 for is_test, n_reads in calls if is_test)
    assert out["ensemble"] == 3 and len(out["best_epochs"]) == 3 and out["member_seeds"] == [3, 4, 5]
    assert out["n_val"] == 60 and out["n_train"] == 180 and out["n_test"] == 200
    assert out["acc"] > 0.9 and out["acc_synthetic_val"] > 0.9
    with pytest.raises(TestSetReuseError):
        split.evaluate_once(lambda x: np.zeros((len(x), 2)))


def test_downstream_refuses_an_exhausted_split_before_training(monkeypatch: pytest.MonkeyPatch) -> None:
    tx, ty = _images(20, 2)
    split = SealedSplit(tx, ty)
    split.evaluate_once(lambda x: np.zeros((len(x), 2)), reader="someone else")

    def no_training(*a, **k):
        raise AssertionError("must not train when the test split cannot be read")

    monkeypatch.setattr(utility, "train_classifier", no_training)
    with pytest.raises(TestSetReuseError, match="no read left"):
        utility.downstream_accuracy(_images(40, 1), split, num_classes=2, epochs=1, batch_size=8, lr=1e-3,
                                    val_fraction=0.2, seed=0)
    with pytest.raises(ValueError, match="unknown downstream classifier"):
        utility.downstream_accuracy(_images(40, 1), _images(20, 2), num_classes=2, epochs=1, batch_size=8, lr=1e-3,
                                    val_fraction=0.2, seed=0, classifier="resnet_9000")
    with pytest.raises(ValueError, match="ensemble"):
        utility.downstream_accuracy(_images(40, 1), _images(20, 2), num_classes=2, epochs=1, batch_size=8, lr=1e-3,
                                    val_fraction=0.2, seed=0, ensemble=0)


def test_ensemble_averages_logits_not_votes(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two members lean weakly to class 0, one strongly to class 1: averaged logits say 1, a vote would say 0."""
    member_logits = {10: [1.0, 0.0], 11: [1.0, 0.0], 12: [0.0, 10.0]}  # by member seed

    def fake_training(net, train, val, *, seed, **kw):
        with torch.no_grad():  # a constant classifier: the head ignores the features
            net.head.weight.zero_()
            net.head.bias.copy_(torch.tensor(member_logits[seed]))
        net.eval()
        return {"val_acc": 0.5, "best_epoch": seed - 10, "val_history": [0.5]}

    monkeypatch.setattr(utility, "train_classifier", fake_training)
    tx = _images(50, 2)[0]
    ty = np.ones(50, dtype=np.int64)  # every test example is class 1
    out = utility.downstream_accuracy(_images(40, 1), (tx, ty), num_classes=2, epochs=1, batch_size=8, lr=1e-3,
                                      val_fraction=0.2, seed=10, ensemble=3)
    assert out["acc"] == 1.0  # majority voting would give 0.0
    assert out["best_epochs"] == [0, 1, 2]
    # and the helper itself: the mean of the members' logits
    nets = [utility.build_classifier("small_cnn", channels=1, num_classes=2, resolution=28) for _ in range(2)]
    x = tx[:5]
    expected = (utility.predict(nets[0], x) + utility.predict(nets[1], x)) / 2
    np.testing.assert_allclose(utility.ensemble_logits(nets, x), expected, rtol=1e-12)


def test_wrn_40_4_has_the_published_size_and_output_shape() -> None:
    net = wrn_40_4(num_classes=10, channels=3)
    n_params = sum(p.numel() for p in net.parameters())
    assert n_params == 8_949_210  # "8.9M" in Zagoruyko & Komodakis, Table 1
    assert sum(p.numel() for p in WideResNet(depth=28, widen=10).parameters()) == pytest.approx(36.5e6, rel=2e-3)
    net.eval()
    with torch.no_grad():
        assert net(torch.zeros(2, 3, 32, 32)).shape == (2, 10)
        assert net.features(torch.zeros(2, 3, 32, 32)).shape == (2, 256)
        gray = utility.build_classifier("wrn_40_4", channels=1, num_classes=3, resolution=28).eval()
        assert gray(torch.zeros(2, 1, 28, 28)).shape == (2, 3)
    assert sum(isinstance(m, torch.nn.Conv2d) and m.kernel_size == (3, 3) for m in net.modules()) == 37  # 1 + 36
    with pytest.raises(ValueError, match="6n \\+ 4"):
        WideResNet(depth=41)


# ------------------------------------------------------------------------------------------------ tabular


def _table(n: int, seed: int, *, classes: int = 2) -> tuple[np.ndarray, np.ndarray]:
    """16-d Gaussian rows whose label is a deterministic function of the sum of four coordinates."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 16))
    signal = x[:, :4].sum(1)
    y = (signal > 0).astype(np.int64) if classes == 2 else np.digitize(signal, [-1.2, 1.2]).astype(np.int64)
    return x.astype(np.float32), y


def test_tabular_auroc_is_high_on_separable_data_and_reads_the_test_split_once() -> None:
    split = SealedSplit(*_table(800, 2))
    out = tabular.tabular_auroc(_table(600, 1), split, seed=0)
    for name in tabular.TABULAR_CLASSIFIERS:
        assert out[f"auroc_{name}"] > 0.93, name
        assert out[f"auprc_{name}"] > 0.9, name
    assert out["auroc"] > 0.95
    assert out["auroc"] == pytest.approx(np.mean([out[f"auroc_{n}"] for n in tabular.TABULAR_CLASSIFIERS]))
    assert split.n_reads == 1 and out["test_reads"] == 1
    with pytest.raises(TestSetReuseError):
        tabular.tabular_auroc(_table(600, 1), split, seed=0)


def test_tabular_auroc_is_chance_with_shuffled_synthetic_labels() -> None:
    """A model fitted to shuffled labels is a random function: its AUROC on real labels is 0.5 in expectation.

    The spread around 0.5 is intrinsic (a random linear direction in 16-d still correlates a little with the true one:
    about +-0.05 per classifier over seeds), hence the tolerances; a leak of test labels or a scoring bug gives ~1.
    """
    x, y = _table(600, 1)
    shuffled = np.random.default_rng(0).permutation(y)
    out = tabular.tabular_auroc((x, shuffled), _table(1000, 2), seed=0)
    for name in tabular.TABULAR_CLASSIFIERS:
        assert abs(out[f"auroc_{name}"] - 0.5) < 0.12, (name, out[f"auroc_{name}"])
        assert abs(out[f"auprc_{name}"] - 0.5) < 0.12, (name, out[f"auprc_{name}"])  # ~ the positive rate
    assert abs(out["auroc"] - 0.5) < 0.06


def test_tabular_multiclass_macro_and_degenerate_synthetic_sets() -> None:
    out = tabular.tabular_auroc(_table(600, 1, classes=3), _table(600, 2, classes=3), seed=0,
                                classifiers=["logreg", "random_forest"])
    assert out["n_classes"] == 3 and out["auroc"] > 0.9 and out["auprc"] > 0.75
    # macro one-vs-rest by hand for a fixed score matrix
    y = np.array([0, 1, 2, 2])
    s = np.array([[0.8, 0.1, 0.1], [0.1, 0.05, 0.5], [0.1, 0.3, 0.6], [0.2, 0.2, 0.6]])
    auroc, auprc = tabular.auroc_auprc(y, s, np.array([0, 1, 2]))
    assert auroc == pytest.approx((1.0 + 0.0 + 1.0) / 3)
    assert auprc == pytest.approx((1.0 + 0.25 + 1.0) / 3)
    x, y1 = _table(50, 1)
    with pytest.raises(ValueError, match="single class"):
        tabular.tabular_auroc((x, np.zeros_like(y1)), _table(50, 2), seed=0)
    with pytest.raises(ValueError, match="unknown tabular classifiers"):
        tabular.tabular_auroc((x, y1), _table(50, 2), seed=0, classifiers=["svm"])


@pytest.mark.slow
def test_downstream_wrn_40_4_trains_through_lightning_and_reads_once() -> None:
    """WRN-40-4 end to end on 32x32 RGB toy images (slow on a CPU: ~9M parameters)."""
    rng = np.random.default_rng(0)

    def rgb(n: int) -> tuple[np.ndarray, np.ndarray]:
        y = (np.arange(n) % 2).astype(np.int64)
        return (rng.random((n, 3, 32, 32)) * 0.3 + 0.6 * y[:, None, None, None]).astype(np.float32), y

    split = SealedSplit(*rgb(64))
    out = utility.downstream_accuracy(rgb(96), split, num_classes=2, epochs=2, batch_size=16, lr=1e-3,
                                      val_fraction=0.25, seed=0, classifier="wrn_40_4", ensemble=2,
                                      limit_train_batches=3, progress=False)
    assert split.n_reads == 1 and out["classifier"] == "wrn_40_4" and len(out["best_epochs"]) == 2
    assert 0.0 <= out["acc"] <= 1.0 and 0.0 <= out["acc_synthetic_val"] <= 1.0


def test_cnn_bn_size_shapes_and_eval_mode() -> None:
    """The dpsyn protocol's classifier: 0.39M parameters at 28x28, one logit per class, and deterministic in eval
    mode (dropout and BatchNorm's batch statistics off)."""
    from dpsyn.nets.classifier import BNCNN

    net = utility.build_classifier("cnn_bn", channels=1, num_classes=10, resolution=28)
    assert isinstance(net, BNCNN)
    assert sum(p.numel() for p in net.parameters()) == 390_634
    rgb = utility.build_classifier("cnn_bn", channels=3, num_classes=4, resolution=32).eval()
    with torch.no_grad():
        assert rgb(torch.zeros(2, 3, 32, 32)).shape == (2, 4)
        net.eval()
        x = torch.rand(5, 1, 28, 28)
        torch.testing.assert_close(net(x), net(x))
        torch.testing.assert_close(net(x[:1]), net(x)[:1])  # a row's logits do not depend on the batch in eval


def test_cosine_schedule_anneals_the_learning_rate_to_zero_over_the_run() -> None:
    """``schedule=cosine``: stepped per batch, from lr at the first batch to 0 after the last (3 epochs of 4
    batches: the run's length comes from the Trainer)."""
    import lightning as L

    from dpsyn.lit.classifier import ClassifierModule

    seen: list[float] = []

    class Spy(L.Callback):
        def on_train_batch_start(self, trainer, module, *args) -> None:
            seen.append(trainer.optimizers[0].param_groups[0]["lr"])

    rng = np.random.default_rng(0)
    x, y = rng.random((40, 1, 8, 8)).astype(np.float32), (np.arange(40) % 2).astype(np.int64)
    module = ClassifierModule(torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 2)), lr=0.1,
                              schedule="cosine")
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.from_numpy(x), torch.from_numpy(y)),
                                         batch_size=10)
    trainer = L.Trainer(max_epochs=3, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, callbacks=[Spy()], limit_val_batches=0)
    trainer.fit(module, train_dataloaders=loader)
    assert len(seen) == 12 and seen[0] == pytest.approx(0.1)
    assert seen == sorted(seen, reverse=True) and seen[-1] == pytest.approx(0.1 * (1 + np.cos(np.pi * 11 / 12)) / 2)
    with pytest.raises(ValueError, match="schedule='step'"):
        ClassifierModule(torch.nn.Linear(1, 1), lr=0.1, schedule="step")
