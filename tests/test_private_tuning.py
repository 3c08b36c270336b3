"""Private tuning (Papernot & Steinke 2022): the repeat-and-select RDP bound against dp_accounting, the secret number
of trials, the ledger event, the DP score, and the search end to end (only the best trial published, the eval split
read once, aborts that release nothing)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from omegaconf import open_dict

from dpsyn.cli.config_check import ConfigError
from dpsyn.privacy import (
    ApproxDPEvent,
    GaussianEvent,
    NonPrivateEvent,
    PATEEvent,
    PrivacyLedger,
    RepeatAndSelectEvent,
    SampledGaussianEvent,
)
from dpsyn.privacy.dpsgd import rdp_orders, rdp_to_epsilon
from dpsyn.privacy.ledger import events_rdp
from dpsyn.privacy.tuning import (
    draw_trial_count,
    rdp_to_delta,
    repeat_and_select_rdp,
    tnb_gamma,
    tnb_mean,
)

SHAPES = [math.inf, 0.0, 0.5, 1.0, 2.0]
Q, NM, STEPS, SCORE_NM = 128 / 54000, 1.2, 2000, 20.0


def _trial_events() -> list:
    return [SampledGaussianEvent(noise_multiplier=NM, sample_rate=Q, steps=STEPS, accountant="rdp", label="D"),
            GaussianEvent(noise_multiplier=SCORE_NM, label="score")]


def _dp_accounting_epsilon(mean: float, shape: float, delta: float) -> float:
    from dp_accounting import dp_event as E
    from dp_accounting.rdp.rdp_privacy_accountant import RdpAccountant

    trial = E.ComposedDpEvent([E.SelfComposedDpEvent(E.PoissonSampledDpEvent(Q, E.GaussianDpEvent(NM)), STEPS),
                               E.GaussianDpEvent(SCORE_NM)])
    acc = RdpAccountant(orders=rdp_orders())
    acc.compose(E.RepeatAndSelectDpEvent(trial, mean, shape))
    return acc.get_epsilon(delta)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("mean", [1.5, 3.0, 10.0])
def test_the_ledger_matches_dp_accounting_repeat_and_select(mean: float, shape: float) -> None:
    """dp_accounting's RDP accountant (RepeatAndSelectDpEvent over its own DpEvents) is the independent reference."""
    ledger = PrivacyLedger(target_epsilon=10.0, delta=1e-5)
    ledger.add(RepeatAndSelectEvent(trial_events=[e.to_dict() for e in _trial_events()], mean_trials=mean,
                                    shape="inf" if math.isinf(shape) else shape, label="tune"))
    ours = ledger.epsilon()
    theirs = _dp_accounting_epsilon(mean, shape, 1e-5)
    assert ours == pytest.approx(theirs, rel=1e-6)
    one = PrivacyLedger(target_epsilon=10.0, delta=1e-5, events=_trial_events()).epsilon()
    assert ours > one  # tuning costs something


@pytest.mark.parametrize("shape", SHAPES)
def test_the_rdp_curve_matches_dp_accounting_at_every_order(shape: float) -> None:
    from dp_accounting.rdp.rdp_privacy_accountant import _compute_rdp_repeat_and_select

    orders = np.asarray(rdp_orders())
    trial = events_rdp(_trial_events(), orders)
    ours = repeat_and_select_rdp(rdp=trial, orders=orders, mean=4.0, shape=shape)
    theirs = np.asarray(_compute_rdp_repeat_and_select(orders, trial, 4.0, shape))
    np.testing.assert_allclose(ours, theirs, rtol=1e-8)
    assert np.all(np.diff(ours[np.argsort(orders)]) >= -1e-12) or math.isinf(shape)


def test_rdp_to_delta_inverts_rdp_to_epsilon() -> None:
    orders = rdp_orders()
    rdp = events_rdp(_trial_events(), orders)
    for delta in (1e-3, 1e-5, 1e-8):
        eps = rdp_to_epsilon(rdp=rdp, orders=orders, delta=delta)[0]
        assert rdp_to_delta(rdp=rdp, orders=orders, epsilon=eps) == pytest.approx(delta, rel=1e-6)
    assert rdp_to_delta(rdp=rdp, orders=orders, epsilon=0.0) <= 1.0


@pytest.mark.parametrize("shape", [0.0, 0.5, 1.0, 2.0])
def test_gamma_gives_the_requested_mean(shape: float) -> None:
    for mean in (1.2, 3.0, 20.0):
        assert tnb_mean(shape=shape, gamma=tnb_gamma(shape=shape, mean=mean)) == pytest.approx(mean, rel=1e-9)
    assert tnb_gamma(shape=1.0, mean=4.0) == pytest.approx(0.25)  # geometric: mean 1/gamma


@pytest.mark.parametrize("shape", SHAPES)
def test_the_number_of_trials_has_the_requested_distribution(shape: float) -> None:
    rng = np.random.default_rng(0)
    k = np.array([draw_trial_count(mean=3.0, shape=shape, generator=rng) for _ in range(20000)])
    assert abs(k.mean() - 3.0) < 5 * k.std() / math.sqrt(len(k))
    if math.isfinite(shape):
        assert k.min() >= 1  # truncated: never an empty search
    else:
        assert (k == 0).mean() == pytest.approx(math.exp(-3.0), abs=0.01)
    if shape == 1.0:  # geometric on {1, 2, ...}: P[K = 1] = gamma
        assert (k == 1).mean() == pytest.approx(1 / 3, abs=0.015)


def test_bad_distributions_and_events_are_refused() -> None:
    with pytest.raises(ValueError, match=">= 0"):
        draw_trial_count(mean=3.0, shape=-0.5, generator=np.random.default_rng(0))
    with pytest.raises(ValueError, match="> 1"):
        tnb_gamma(shape=1.0, mean=1.0)
    good = [e.to_dict() for e in _trial_events()]
    for bad, match in [
        (NonPrivateEvent(label="x"), "non-private"),
        (ApproxDPEvent(epsilon=1.0, delta=1e-6, label="x"), "delta > 0"),
        (PATEEvent(sigma_threshold=3.0, sigma=1.0, threshold=5.0, bound="data_dependent", label="x"), "data-dependent"),
        (RepeatAndSelectEvent(trial_events=good, mean_trials=2, shape=1.0, label="x"), "itself"),
    ]:
        with pytest.raises(ValueError, match=match):
            RepeatAndSelectEvent(trial_events=[*good, bad.to_dict()], mean_trials=2, shape=1.0, label="t")


def test_the_event_round_trips_and_names_its_analysis() -> None:
    ledger = PrivacyLedger(target_epsilon=2.0, delta=1e-5)
    ledger.add(RepeatAndSelectEvent(trial_events=[e.to_dict() for e in _trial_events()], mean_trials=3,
                                    shape="inf", label="tune"))
    again = PrivacyLedger.from_dict(json.loads(json.dumps(ledger.to_dict())))
    assert again.epsilon() == ledger.epsilon()
    desc = again.accountant_description()
    assert "repeat-and-select (Papernot & Steinke 2022, Poisson (mean 3) trials)" in desc and "sampled-gaussian" in desc
    # a pure-DP trial: min(eps, alpha eps^2 / 2) per order
    pure = RepeatAndSelectEvent(trial_events=[ApproxDPEvent(epsilon=0.1, delta=0.0, label="x").to_dict()],
                                mean_trials=2, shape=1.0, label="t")
    np.testing.assert_allclose(pure.trial_rdp([2.0, 100.0, 1000.0]), [0.01, 0.1, 0.1])


def test_the_search_space_is_drawn_from_hydra_sweep_syntax() -> None:
    from dpsyn.private_tuning import parse_space, sample_space

    space = parse_space({"method.lr": "tag(log, interval(1e-4, 1e-2))", "method.width": "int(interval(8, 64))",
                         "method.act": "choice(relu, elu)", "method.x": "interval(0.0, 1.0)"})
    rng = np.random.default_rng(0)
    draws = [sample_space(space, rng) for _ in range(4000)]
    lr = np.array([d["method.lr"] for d in draws])
    assert lr.min() >= 1e-4 and lr.max() <= 1e-2
    assert abs(np.mean(np.log10(lr)) + 3.0) < 0.05  # log-uniform: log10 uniform on [-4, -2]
    assert all(isinstance(d["method.width"], int) and 8 <= d["method.width"] <= 64 for d in draws)
    assert {d["method.act"] for d in draws} == {"relu", "elu"}
    assert abs(np.mean([d["method.x"] for d in draws]) - 0.5) < 0.03
    with pytest.raises(ConfigError, match="dotted"):
        parse_space({"method": "choice(dp_gan, pe)"})
    with pytest.raises(ConfigError, match="not a search space"):
        parse_space({"method.lr": "0.1"})
    with pytest.raises(ConfigError, match="empty"):
        parse_space({})


def test_a_trial_score_is_the_noised_count_recorded_before_release() -> None:
    from omegaconf import OmegaConf

    from dpsyn.private_tuning import trial_score

    cfg = OmegaConf.create({"tuning": {"score_noise_multiplier": 4.0}, "privacy": {"deterministic_noise": True},
                            "seed": 3})
    ledger = PrivacyLedger(target_epsilon=10.0, delta=1e-5)
    values, info = trial_score({"acc": 0.5, "fd": 1.0}, {"acc": {"n_test": 200}}, cfg, ledger)
    assert set(values) == {"dp_score"}  # nothing else computed on the validation rows is released
    assert ledger.events[-1].kind == "gaussian" and ledger.events[-1].noise_multiplier == 4.0
    again, _ = trial_score({"acc": 0.5}, {"acc": {"n_test": 200}}, cfg, PrivacyLedger(target_epsilon=10.0, delta=1e-5))
    assert again == values  # deterministic noise: the same draw
    assert values["dp_score"] != 0.5 and abs(values["dp_score"] * 200 - 100) < 6 * 4.0  # noised, at its scale
    assert info["dp_score"]["n_validation"] == 200


# ---- the search ---------------------------------------------------------------------------------------------------


def _search_cfg(make_cfg, *extra: str):
    return make_cfg("experiment=tune_private", "method=dp_gan", "dataset=digits", "eps=1",
                    "tuning.trial_eps=0.5", "privacy.deterministic_noise=true", "metrics.names.image=[acc]", *extra)


def test_a_private_search_publishes_only_the_best_trial_and_reads_the_eval_split_once(make_cfg, tmp_path: Path) -> None:
    from dpsyn.private_tuning import private_search

    cfg = _search_cfg(make_cfg, "tuning.mean_trials=2", "tuning.trials_shape=1")
    run_dir = tmp_path / "search" / "run"
    result = private_search(cfg, run_dir)
    # nothing but the published run is left: the trials' hidden folder is gone
    assert [p.name for p in run_dir.parent.iterdir()] == ["run"]
    assert {p.name for p in run_dir.iterdir()} >= {"samples.npz", "privacy.json", "result.json", "config.yaml"}
    on_disk = json.loads((run_dir / "result.json").read_text())
    assert on_disk == json.loads(json.dumps(result))
    text = (run_dir / "result.json").read_text() + (run_dir / "privacy.json").read_text()
    assert '"k"' not in text.lower() and "trial 1" not in text  # the number of trials is not published
    # the published samples were scored once, on the eval split; the trials never read it
    reads = result["metric_info"]["eval_reads"]
    assert result["metrics_split"] == "eval" and [r["n"] for r in reads] == [359]
    # the ledger: one repeat-and-select event over one trial's DP-SGD and DP score, within the search's target
    (event,) = result["privacy_events"]
    assert event["kind"] == "repeat_and_select" and [e["kind"] for e in event["trial_events"]] == [
        "sampled_gaussian", "gaussian"]
    ledger = PrivacyLedger.from_dict(json.loads((run_dir / "privacy.json").read_text()))
    assert result["epsilon_spent"] == pytest.approx(ledger.epsilon()) and ledger.epsilon() <= 1.0
    trial = PrivacyLedger(target_epsilon=1.0, delta=1e-5, events=[
        e for e in RepeatAndSelectEvent(**{k: v for k, v in event.items() if k != "kind"}).events()])
    assert 0.5 <= trial.epsilon() < ledger.epsilon()  # the trial spent its own target, the search more
    t = result["tuning"]
    assert t["role"] == "private" and set(t["selected"]) == {"method.lr_d", "method.lr_g"}
    assert "geometric" in t["trials_distribution"] and t["trial_eps"] == 0.5
    published = (run_dir / "config.yaml").read_text()
    assert f"lr_d: {t['selected']['method.lr_d']}" in published and "role: null" in published


def test_a_search_over_the_batch_size_is_refused_and_releases_nothing(make_cfg, tmp_path: Path, monkeypatch) -> None:
    """Trials that spend different RDP curves break the analysis: the search stops after the first that differs."""
    import dpsyn.cli.train as train
    from dpsyn.private_tuning import private_search

    calls: list[dict] = []

    def fake_run(tcfg, tdir: Path) -> dict:
        tdir.mkdir(parents=True)
        (tdir / "samples.npz").write_bytes(b"x")
        b = int(tcfg.method.batch_size)
        calls.append({"batch_size": b, "split": tcfg.metrics.split, "eps": tcfg.eps, "role": tcfg.tuning.role})
        ev = [SampledGaussianEvent(noise_multiplier=4.0, sample_rate=b / 1000, steps=100, accountant="rdp",
                                   label="D").to_dict(), GaussianEvent(noise_multiplier=20.0, label="s").to_dict()]
        return {"privacy_events": ev, "metrics": {"dp_score": 0.5}}

    monkeypatch.setattr(train, "run", fake_run)
    cfg = _search_cfg(make_cfg, "tuning.mean_trials=20", "tuning.trials_shape=1", "tuning.trial_eps=0.1",
                      "eps=10")
    with open_dict(cfg):
        cfg.tuning.space = {"method.batch_size": "choice(16, 32, 64, 128)"}
    run_dir = tmp_path / "s" / "run"
    with pytest.raises(ConfigError, match="another RDP curve"):
        private_search(cfg, run_dir)
    assert len({c["batch_size"] for c in calls}) == 2  # stopped at the first trial that differs
    assert all(c["split"] == "validation" and c["eps"] == 0.1 and c["role"] == "private_trial" for c in calls)
    assert [p.name for p in run_dir.parent.iterdir()] == ["run"] and not any(run_dir.iterdir())


def test_a_search_over_its_target_stops_after_the_first_trial(make_cfg, tmp_path: Path, monkeypatch) -> None:
    import dpsyn.cli.train as train
    from dpsyn.private_tuning import private_search

    calls = []

    def fake_run(tcfg, tdir: Path) -> dict:
        tdir.mkdir(parents=True)
        calls.append(tdir)
        ev = [SampledGaussianEvent(noise_multiplier=0.8, sample_rate=0.1, steps=100, accountant="rdp",
                                   label="D").to_dict()]
        return {"privacy_events": ev, "metrics": {"dp_score": 0.5}}

    monkeypatch.setattr(train, "run", fake_run)
    cfg = _search_cfg(make_cfg, "tuning.mean_trials=20", "tuning.trials_shape=1", "tuning.trial_eps=1", "eps=1")
    with pytest.raises(ConfigError, match="lower tuning.trial_eps"):
        private_search(cfg, tmp_path / "s" / "run")
    assert len(calls) == 1 and not calls[0].exists()


def test_the_number_of_trials_comes_from_os_entropy_unless_deterministic(make_cfg, tmp_path: Path,
                                                                         monkeypatch) -> None:
    import dpsyn.privacy as privacy
    from dpsyn.private_tuning import private_search

    seen = []
    real = privacy.dp_numpy_generator

    def spy(*, deterministic: bool = False, seed: int | None = None):
        seen.append(deterministic)
        raise RuntimeError("stop")

    monkeypatch.setattr(privacy, "dp_numpy_generator", spy)
    cfg = _search_cfg(make_cfg, "privacy.deterministic_noise=false")
    with pytest.raises(RuntimeError, match="stop"):
        private_search(cfg, tmp_path / "run")
    assert seen == [False] and real is not spy


@pytest.mark.parametrize("extra, match", [
    (("tuning.trial_eps=null",), "trial_eps: required"),
    (("tuning.trial_eps=2",), r"\(0, eps=1\]"),
    (("eps=inf",), "finite eps"),
    (("tuning.mean_trials=0.5",), ">= 1"),
    (("metrics.split=validation",), "leave metrics.split=eval"),
    (("dataset=breast_cancer",), "image datasets only"),
])
def test_bad_search_settings_are_refused_before_any_trial(make_cfg, tmp_path: Path, extra, match) -> None:
    from dpsyn.private_tuning import private_search

    with pytest.raises(ConfigError, match=match):
        private_search(_search_cfg(make_cfg, *extra), tmp_path / "run")
    assert not (tmp_path / "run").exists()


def test_the_trial_with_the_highest_dp_score_is_the_one_published(make_cfg, tmp_path: Path, monkeypatch) -> None:
    import dpsyn.cli.train as train
    from dpsyn.private_tuning import private_search

    scores = [0.2, 0.9, 0.5, 0.7]
    calls: list[float] = []

    def fake_run(tcfg, tdir: Path) -> dict:
        tdir.mkdir(parents=True)
        i = len(calls)
        calls.append(scores[i % 4])
        x = np.full((40, 1, 28, 28), i / 10, np.float32)  # each trial's samples carry its index
        np.savez(tdir / "samples.npz", x=x, y=np.arange(40) % 10)
        ev = [GaussianEvent(noise_multiplier=30.0, count=10, label="D").to_dict()]
        return {"privacy_events": ev, "metrics": {"dp_score": scores[i % 4]}, "n_private": 1294,
                "sample_provenance": {"trial": i}, "timings": {"fit_s": 1.0},
                "metric_info": {"dp_score": {"n_validation": 144}}}

    monkeypatch.setattr(train, "run", fake_run)
    cfg = _search_cfg(make_cfg, "tuning.mean_trials=6", "tuning.trials_shape=1")
    result = private_search(cfg, tmp_path / "run")
    assert len(calls) >= 3  # the seeded (deterministic) draw of K here; the best is not the first
    best = int(np.argmax(calls))
    with np.load(tmp_path / "run" / "samples.npz") as z:
        assert np.allclose(z["x"], best / 10)
    assert result["tuning"]["selected_dp_score"] == max(calls) and result["sample_provenance"] == {"trial": best}
