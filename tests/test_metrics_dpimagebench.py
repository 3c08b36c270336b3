"""metrics.protocol=dpimagebench: DPImageBench's classifiers selected on real validation rows, the sealed eval split
read once after the selection, the labels of result.json and the noisy-max selection's charge. Tiny settings: a few
rows, one or two epochs, widths divided by 16 (seconds on a CPU)."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest
from omegaconf import OmegaConf

import dpsyn.metrics.dpimagebench as dib
from dpsyn.config import ConfigError, validate
from dpsyn.data.base import DataBundle, Split, hold_out_validation
from dpsyn.metrics import evaluate
from dpsyn.metrics.sealed import SealedSplit, TestSetReuseError
from dpsyn.privacy import PrivacyLedger

TINY = dict(classifiers=["resnet_110", "wrn_40_4", "resnext_29"], epochs=2, batch_size=16, lr=0.01, lr_step=20,
            lr_gamma=0.2, ema_decay=0.9999, wrn_dropout=0.3, n_train=40, width_divisor=16)


def _images(n: int, seed: int, side: int = 28) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 3, n)
    x = rng.random((n, 1, side, side), dtype=np.float32) * 0.3
    for c in range(3):  # a learnable stripe per class
        x[y == c, 0, :, c * 9:(c + 1) * 9] += 0.7
    return x.clip(0, 1), y.astype(np.int64)


class _Recorder(SealedSplit):
    """A sealed split that logs its reads into ``log``."""

    def __init__(self, x, y, log: list[str]) -> None:
        super().__init__(x, y, name="tiny/test")
        self.log = log

    def evaluate_once(self, predict_fn, metric_fn=None, *, reader=None):
        self.log.append("test")
        return super().evaluate_once(predict_fn, metric_fn, reader=reader)


def test_selection_reads_only_the_validation_rows_and_the_test_split_once_after_it(monkeypatch) -> None:
    """Every validation score comes before the one read of the test split, and none is of the test rows."""
    test_x, test_y = _images(30, 2)
    val = _images(24, 1)
    log: list[str] = []
    scored = dib._correct

    def correct(net, split, device):
        assert split[0] is not test_x and len(split[0]) == len(val[0])  # never the eval split
        log.append("val")
        return scored(net, split, device)

    monkeypatch.setattr(dib, "_correct", correct)
    sealed = _Recorder(test_x, test_y, log)
    out = dib.dpimagebench_accuracy(_images(60, 0), val, sealed, num_classes=3, seed=0, **TINY)
    assert log == ["val"] * 6 + ["test"] and sealed.n_reads == 1 and out["test_reads"] == 1
    assert set(out["per_classifier"]) == set(TINY["classifiers"]) and out["n_train"] == 40
    assert out["acc"] == pytest.approx(np.mean(list(out["per_classifier"].values())))
    assert all(e in (0, 1) for e in out["selected_epochs"].values()) and out["n_validation"] == 24
    assert set(out["val_accs"]) == set(TINY["classifiers"]) and out["selection_events"] == []
    with pytest.raises(TestSetReuseError):  # a used seal is refused before any training
        dib.dpimagebench_accuracy(_images(60, 0), val, sealed, num_classes=3, seed=0, **TINY)


def test_real_val_keeps_the_later_epoch_on_a_tie(monkeypatch) -> None:
    monkeypatch.setattr(dib, "_correct", lambda net, split, device: 5)
    out = dib.dpimagebench_accuracy(_images(20, 0), _images(8, 1), _images(8, 2), num_classes=3, seed=0,
                                    **{**TINY, "classifiers": ["resnet_110"], "epochs": 3})
    assert out["selected_epochs"] == {"resnet_110": 2} and out["val_accs"] == {"resnet_110": 5 / 8}


def test_noisy_max_is_charged_before_its_noise_and_releases_no_validation_accuracy(monkeypatch) -> None:
    from dpsyn.privacy import dp_numpy_generator

    ledger = PrivacyLedger(target_epsilon=2.0, delta=1e-5)
    drawn: list[int] = []
    import dpsyn.privacy as privacy  # dpimagebench_accuracy imports NoisyMax from here when it runs

    class Spy(privacy.NoisyMax):
        def offer(self, count):
            drawn.append(len(ledger))  # events recorded when each draw is made
            return super().offer(count)

    monkeypatch.setattr(privacy, "NoisyMax", Spy)
    out = dib.dpimagebench_accuracy(_images(40, 0), _images(16, 1), _images(16, 2), num_classes=3, seed=0,
                                    selection="noisy_max", selection_eps=0.5, ledger=ledger,
                                    generator=dp_numpy_generator(deterministic=True, seed=3),
                                    **{**TINY, "classifiers": ["resnet_110", "resnext_29"]})
    assert drawn == [1, 1, 2, 2]  # each classifier's charge is in the ledger before its first draw
    assert ledger.epsilon() == pytest.approx(0.5) and len(out["selection_events"]) == 2
    assert all(e["delta"] == 0.0 and "noisy max" in e["label"] for e in ledger.to_dict()["events"])
    assert out["val_accs"] == {}
    with pytest.raises(ValueError, match="selection_eps, the run's ledger"):
        dib.dpimagebench_accuracy(_images(40, 0), _images(16, 1), _images(16, 2), num_classes=3, seed=0,
                                  selection="noisy_max", selection_eps=0.5, **TINY)


def _bundle(n_private: int = 80) -> DataBundle:
    x, y = _images(n_private, 5)
    ex, ey = _images(20, 6)
    return DataBundle(name="tiny", kind="image", private=Split(x, y, np.arange(n_private)), eval=Split(ex, ey),
                      classes=["a", "b", "c"], family="fmnist")


def test_validation_rows_are_disjoint_from_the_method_rows_and_the_eval_split_is_kept() -> None:
    data = _bundle()
    held = hold_out_validation(data, 25, split_seed=0)
    assert len(held.validation) + len(held.private) == 80 and held.eval is data.eval
    assert 10 <= len(held.validation) <= 40  # a binomial(80, 25/80) count
    assert not set(held.validation.index) & set(held.private.index)
    assert set(held.validation.index) | set(held.private.index) == set(range(80))
    assert held.info["validation"]["rows"] == 25 and held.info["validation"]["held_out"] == len(held.validation)
    np.testing.assert_array_equal(hold_out_validation(data, 25, split_seed=0).validation.index, held.validation.index)
    with pytest.raises(ValueError, match="already holds"):
        hold_out_validation(held, 5, split_seed=0)
    with pytest.raises(ValueError, match="validation_rows"):
        hold_out_validation(data, 80, split_seed=0)
    no_ids = DataBundle(name="tiny", kind="image", private=Split(data.private.x, data.private.y), eval=data.eval,
                        classes=data.classes, family="fmnist")
    with pytest.raises(ValueError, match="source ids"):
        hold_out_validation(no_ids, 25, split_seed=0)


@pytest.mark.parametrize("removed", [0, 1, 40, 79])
def test_removing_a_row_moves_no_other_row_across_the_validation_cut(removed: int) -> None:
    """The neighbour relation (docs/privacy.md): the method's rows and the selection's rows of the dataset with one
    row removed are those of the full dataset less that row, whichever row it is and in any row order (a cut of a
    permutation of positions moves rows of both sides)."""
    data = _bundle(200)
    full = hold_out_validation(data, 50, split_seed=3)
    keep = np.array([i for i in range(200) if i != removed])
    rng = np.random.default_rng(removed)
    keep = keep[rng.permutation(len(keep))]  # the rows in another order too
    smaller = DataBundle(name="tiny", kind="image", private=Split(data.private.x[keep], data.private.y[keep], keep),
                         eval=data.eval, classes=data.classes, family="fmnist")
    cut = hold_out_validation(smaller, 50, split_seed=3)
    assert set(cut.validation.index) == set(full.validation.index) - {removed}
    assert set(cut.private.index) == set(full.private.index) - {removed}
    other = hold_out_validation(data, 50, split_seed=4)  # the key is the split seed's
    assert set(other.validation.index) != set(full.validation.index)


def _metrics_cfg(**dib_settings):
    from dpsyn.config.schema import MetricsSchema

    cfg = OmegaConf.structured(MetricsSchema)
    cfg.names.image = ["acc"]
    cfg.protocol = "dpimagebench"
    for k, v in {**TINY, **dib_settings}.items():
        cfg.dpimagebench[k] = v
    return cfg


@pytest.mark.parametrize("selection", ["real_val", "noisy_max"])
def test_the_whole_protocol_through_evaluate_labels_its_selection(selection: str, tmp_path) -> None:
    data = hold_out_validation(_bundle(), 20, split_seed=0)
    samples = SimpleNamespace(x=_images(50, 7)[0], y=_images(50, 7)[1])
    extra = {"selection": selection, "selection_eps": 0.3 if selection == "noisy_max" else None}
    ledger = PrivacyLedger(target_epsilon=1.0, delta=1e-5)
    values, _, info = evaluate(samples, data, _metrics_cfg(**extra), cache_dir=tmp_path, seed=0,
                               load_family=lambda f: None, ledger=ledger, deterministic_noise=True)
    assert {"acc", "acc_std", "acc_resnet_110", "acc_wrn_40_4", "acc_resnext_29"} <= set(values)
    assert info["acc"]["protocol"] == "dpimagebench" and info["acc"]["n_validation"] == len(data.validation)
    assert len(info["eval_reads"]) == 1 and "dpimagebench" in info["eval_reads"][0]["reader"]
    if selection == "real_val":
        assert info["acc"]["selection"] == "real validation rows of the private split (not accounted)"
        assert len(ledger) == 0
    else:
        assert "accounted" in info["acc"]["selection"] and "not accounted" not in info["acc"]["selection"]
        assert ledger.epsilon() == pytest.approx(0.3) and "val_accs" not in info["acc"]
    with pytest.raises(ValueError, match="validation rows"):  # no held-out rows: refused
        evaluate(samples, _bundle(), _metrics_cfg(**extra), cache_dir=tmp_path, seed=0,
                 load_family=lambda f: None, ledger=ledger)


def test_settings_are_checked_at_compose_time() -> None:
    from dpsyn.config.schema import MetricsSchema

    def check(eps: float, **kw) -> None:
        metrics = OmegaConf.structured(MetricsSchema)
        for k, v in kw.items():
            OmegaConf.update(metrics, k, v)
        validate(OmegaConf.create({"eps": eps, "metrics": metrics}), groups=("metrics",))

    check(1.0, protocol="dpimagebench")
    check(1.0, **{"protocol": "dpimagebench", "dpimagebench.selection": "noisy_max", "dpimagebench.selection_eps": 0.1})
    check(math.inf, **{"dpimagebench.selection": "noisy_max", "dpimagebench.selection_eps": 5.0})
    with pytest.raises(ConfigError, match="selection_eps=null: required"):
        check(1.0, **{"dpimagebench.selection": "noisy_max"})
    with pytest.raises(ConfigError, match="below eps=1"):
        check(1.0, **{"dpimagebench.selection": "noisy_max", "dpimagebench.selection_eps": 1.0})
    with pytest.raises(ConfigError, match="only with selection=noisy_max"):
        check(1.0, **{"dpimagebench.selection_eps": 0.1})
    with pytest.raises(ConfigError, match="metrics.protocol=dpimagebench: tuning"):
        check(1.0, protocol="dpimagebench", split="validation")
    with pytest.raises(ConfigError, match="allowed: dpsyn, dpimagebench"):
        check(1.0, protocol="g_pate")
    with pytest.raises(ConfigError, match="classifiers"):
        check(1.0, **{"dpimagebench.classifiers": ["small_cnn"]})


def test_a_run_holds_the_rows_out_charges_the_selection_and_labels_the_result(make_cfg, tmp_path) -> None:
    """The whole run (method ``real``, 300 F-MNIST rows): the method sees 300 - 50 rows, the selection is an event of
    the run's privacy.json, result.json says how acc was selected and that the test split was read once."""
    import json

    from dpsyn.task import fit_fingerprint, run

    tiny = [f"metrics.dpimagebench.{k}={v}" for k, v in TINY.items() if k != "classifiers"]
    cfg = make_cfg("method=real", "dataset=fmnist", "dataset.n_private=300", "metrics.names.image=[acc]",
                   "metrics.n_samples=60", "metrics.protocol=dpimagebench", "metrics.dpimagebench.validation_rows=50",
                   "metrics.dpimagebench.classifiers=[resnet_110]", "metrics.dpimagebench.selection=noisy_max",
                   "metrics.dpimagebench.selection_eps=0.5", "privacy.deterministic_noise=true", *tiny)
    result = run(cfg, tmp_path / "run")
    held = result["data"]["validation"]["held_out"]
    assert result["n_private"] == 300 - held and result["data"]["validation"]["rows"] == 50 and 20 <= held <= 80
    info = result["metric_info"]["acc"]
    assert info["protocol"] == "dpimagebench" and info["selection_eps"] == 0.5 and info["n_validation"] == held
    assert len(result["metric_info"]["eval_reads"]) == 1
    events = json.loads((tmp_path / "run" / "privacy.json").read_text())["events"]
    assert [e["epsilon"] for e in events if "noisy max" in e.get("label", "")] == [0.5]
    assert fit_fingerprint(cfg, 1e-5)["protocol"] == {"name": "dpimagebench", "validation_rows": 50,
                                                      "selection_eps": 0.5}


def test_a_method_that_stops_by_the_ledger_leaves_the_selection_its_share(make_cfg, tmp_path) -> None:
    """G-PATE answers queries until the ledger's limit: under a noisy-max selection of 0.2 the limit is eps - 0.2
    while it trains (ledger.reserving), so the run ends at eps (its votes about 0.8, the selection 0.2), not over."""
    import json

    from dpsyn.task import run

    tiny = [f"metrics.dpimagebench.{k}={v}" for k, v in TINY.items() if k not in ("classifiers", "epochs")]
    cfg = make_cfg("method=g_pate", "dataset=fmnist", "dataset.n_private=300", "method.teachers=10",
                   "method.batch_size=4", "method.projection_dim=2", "method.sigma_threshold=100", "method.sigma=50",
                   "method.threshold=10", "method.z_dim=4", "metrics.names.image=[acc]", "metrics.n_samples=60",
                   "metrics.protocol=dpimagebench", "metrics.dpimagebench.validation_rows=50",
                   "metrics.dpimagebench.classifiers=[resnet_110]", "metrics.dpimagebench.epochs=1",
                   "metrics.dpimagebench.selection=noisy_max", "metrics.dpimagebench.selection_eps=0.2",
                   "privacy.deterministic_noise=true", *tiny)
    result = run(cfg, tmp_path / "run")
    assert result["epsilon_spent"] <= 1.0 * (1 + 1e-9)
    events = json.loads((tmp_path / "run" / "privacy.json").read_text())["events"]
    assert [e["kind"] for e in events] == ["pate", "approx_dp"] and events[1]["epsilon"] == 0.2
    assert result["epsilon_spent"] > 0.95  # the votes took their share: the stop was the reserved limit
