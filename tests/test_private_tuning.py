"""Private tuning (Papernot & Steinke 2022): the repeat-and-select RDP bound against dp_accounting, the secret number
of trials, the ledger event, the DP score, and the search end to end (only the best trial published, the eval split
read once, aborts that release nothing)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from omegaconf import OmegaConf, open_dict

from dpsyn.cli.config_check import ConfigError
from dpsyn.privacy import (
    ApproxDPEvent,
    GaussianEvent,
    NonPrivateEvent,
    PATEEvent,
    PrivacyEvent,
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
    return [SampledGaussianEvent(sampling="poisson",
                                 noise_multiplier=NM, sample_rate=Q, steps=STEPS, accountant="rdp", label="D"),
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

    from dpsyn.trial import trial_score

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


def _search_cfg(make_cfg, *extra: str, method: str = "dp_gan"):
    return make_cfg("experiment=tune_private", f"method={method}", "dataset=digits", "eps=1",
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
    trial = PrivacyLedger(target_epsilon=1.0, delta=1e-5, events=list(PrivacyEvent.from_dict(event).events()))
    assert 0.5 <= trial.epsilon() < ledger.epsilon()  # the trial spent its own target, the search more
    t = result["tuning"]
    assert t["role"] == "private" and set(t["selected"]) == {"method.lr_d", "method.lr_g"}
    assert "geometric" in t["trials_distribution"] and t["trial_eps"] == 0.5
    published = (run_dir / "config.yaml").read_text()
    assert f"lr_d: {t['selected']['method.lr_d']}" in published and "role: null" in published


def _no_trial_may_run(monkeypatch) -> None:
    """Make drawing K or running a trial fail the test: a refusal must come before both."""
    import dpsyn.task as task
    import dpsyn.privacy.tuning as tuning

    def drawn(**_: object) -> int:
        raise AssertionError("K was drawn before the search space was checked")

    def ran(*_: object) -> dict:
        raise AssertionError("a trial ran before the search space was checked")

    monkeypatch.setattr(tuning, "draw_trial_count", drawn)
    monkeypatch.setattr(task, "run", ran)


@pytest.mark.parametrize("method, key, spec, why", [
    ("dp_gan", "method.batch_size", "choice(16, 32, 64)", "method.batch_size enters dp_gan's privacy accounting"),
    ("dp_gan", "method.epochs", "range(1, 4)", "method.epochs enters dp_gan's privacy accounting"),
    ("gs_wgan", "method.iterations", "int(interval(100, 1000))", "method.iterations enters gs_wgan's privacy"),
    ("g_pate", "method.teachers", "choice(100, 200)", "method.teachers enters g_pate's privacy accounting"),
    ("g_pate", "method.sigma_ratio", "interval(0.1, 0.5)", "method.sigma_ratio enters g_pate's privacy"),
    ("dp_gan", "trainer.max_epochs", "choice(1, 2)", "trainer.max_epochs sets the steps"),
    ("dp_gan", "trainer.limit_train_batches", "choice(2, 5)", "trainer.limit_train_batches sets the steps"),
    ("dp_gan", "dataset.n_private", "choice(500, 1000)", "dataset.n_private sets the private rows"),
    ("dp_gan", "privacy.delta", "choice(1e-5, 1e-6)", "privacy.delta sets the delta"),
    ("dp_gan", "metrics.classifier.epochs", "choice(1, 2)", "metrics.classifier.epochs sets the DP score"),
    ("dp_gan", "public.n_public", "choice(100, 200)", "public.n_public is not a method setting"),
    ("dp_gan", "method.name", "choice(dp_gan, pe)", "method.name is not declared free of dp_gan's accounting"),
    ("dp_gan", "method.checkpoint_every", "choice(10, 20)", "method.checkpoint_every is not declared free"),
    ("dp_gan", "method.teachers", "choice(10, 20)", "method.teachers is not a setting of dp_gan"),
])
def test_a_space_that_could_change_the_accounting_is_refused_before_k_is_drawn(
        make_cfg, tmp_path: Path, monkeypatch, method: str, key: str, spec: str, why: str) -> None:
    """Stopping at the first trial whose curve differs would reveal K >= i: the space is judged from the config
    alone, before K is drawn and before any trial trains."""
    from dpsyn.private_tuning import private_search

    _no_trial_may_run(monkeypatch)
    cfg = _search_cfg(make_cfg, method=method)
    with open_dict(cfg):
        cfg.tuning.space = {"method.lr_d": "tag(log, interval(1e-4, 1e-3))", key: spec}
    run_dir = tmp_path / "s" / "run"
    with pytest.raises(ConfigError) as err:
        private_search(cfg, run_dir)
    msg = str(err.value)
    assert why in msg and "\n" not in msg and "nothing was trained or released" in msg
    assert "method.lr_d " not in msg  # the tunable key is not named as an offender
    assert f"tunable for {method}: method." in msg
    assert not (tmp_path / "s").exists()  # no run directory, no hidden trials folder


def test_a_value_the_trials_would_refuse_is_refused_before_k_is_drawn(make_cfg, tmp_path: Path,
                                                                      monkeypatch) -> None:
    """A draw that fails its trial's config check at trial i would reveal K >= i too: every choice and both ends of
    every interval are checked against the schemas up front."""
    from dpsyn.private_tuning import private_search

    _no_trial_may_run(monkeypatch)
    for space, match in [({"method.lr_d": "interval(-1e-3, 1e-3)"}, r"method.lr_d=-0.001: must"),
                         ({"method.d_steps": "choice(1, 0)", "method.lr_g": "interval(1e-4, 1e-3)"},
                          r"method.d_steps=0: must"),
                         ({"method.beta1": "interval(0.5, 1.0)"}, r"method.beta1=1.0: must")]:
        cfg = _search_cfg(make_cfg)
        with open_dict(cfg):
            cfg.tuning.space = space
        with pytest.raises(ConfigError, match=match) as err:
            private_search(cfg, tmp_path / "run")
        assert "which its trial refuses" in str(err.value)
    assert not (tmp_path / "run").exists()


def test_a_space_of_settings_outside_the_accounting_runs_every_trial(make_cfg, tmp_path: Path, monkeypatch) -> None:
    """Learning rates, the clip norm, widths and d_steps pass the check; the search runs its K trials as before."""
    import dpsyn.task as task
    import dpsyn.privacy.tuning as tuning
    from dpsyn.private_tuning import check_space, parse_space, private_search

    drawn: list[int] = []
    real_draw = tuning.draw_trial_count

    def spy(**kw: object) -> int:
        drawn.append(real_draw(**kw))
        return drawn[-1]

    calls: list[dict] = []

    def fake_run(tcfg, tdir: Path) -> dict:
        tdir.mkdir(parents=True)
        np.savez(tdir / "samples.npz", x=np.zeros((40, 1, 28, 28), np.float32), y=np.arange(40) % 10)
        calls.append({k: OmegaConf.select(tcfg, k) for k in space})
        ev = [SampledGaussianEvent(sampling="poisson",
                                   noise_multiplier=4.0, sample_rate=0.1, steps=100, accountant="rdp",
                                   label="D").to_dict(), GaussianEvent(noise_multiplier=20.0, label="s").to_dict()]
        return {"privacy_events": ev, "metrics": {"dp_score": 0.1 * len(calls)}, "n_private": 1000,
                "sample_provenance": {}, "timings": {"fit_s": 1.0}, "metric_info": {"dp_score": {"n_validation": 9}}}

    space = {"method.lr_d": "tag(log, interval(1e-4, 1e-2))", "method.max_grad_norm": "choice(0.5, 1.0, 2.0)",
             "method.ndf": "choice(16, 32)", "method.d_steps": "range(1, 4)"}
    monkeypatch.setattr(tuning, "draw_trial_count", spy)
    monkeypatch.setattr(task, "run", fake_run)
    cfg = _search_cfg(make_cfg, "tuning.mean_trials=6", "tuning.trials_shape=1", "tuning.trial_eps=0.1", "eps=10")
    with open_dict(cfg):
        cfg.tuning.space = space
    check_space(cfg, parse_space(cfg.tuning.space), 0.1)  # no error
    result = private_search(cfg, tmp_path / "run")
    assert drawn and len(calls) == drawn[0] >= 2  # every trial ran
    assert len({tuple(c.values()) for c in calls}) == len(calls)  # each with its own draw of the settings
    assert set(result["tuning"]["selected"]) == set(space)


def test_every_declared_tunable_key_passes_and_every_accounting_key_is_refused() -> None:
    """The check is the declared facts, for every registered method (a key in neither list is refused)."""
    from dpsyn.config import METHOD_SCHEMAS
    from dpsyn.methods import METHODS
    from dpsyn.private_tuning import untunable_keys

    for name in METHODS.names():
        facts = METHODS.get(name)
        assert untunable_keys(name, [f"method.{k}" for k in facts.tunable_keys]) == {}, name
        bad = untunable_keys(name, [f"method.{k}" for k in facts.accounting_keys])
        assert set(bad) == {f"method.{k}" for k in facts.accounting_keys}
        assert all("privacy accounting" in why for why in bad.values())
        other = set(METHOD_SCHEMAS[name].__dataclass_fields__) - set(facts.tunable_keys)
        assert set(untunable_keys(name, [f"method.{k}" for k in other])) == {f"method.{k}" for k in other}
        outside = ["trainer.max_epochs", "dataset.n_private", "privacy.accountant", "eps", "seed",
                   "tuning.trial_eps", "metrics.classifier.epochs", "public.n_public"]
        assert set(untunable_keys(name, outside)) == set(outside)
    # a nested key counts as its top-level field
    assert "method.budget_split.m1" in untunable_keys("dp_mepf", ["method.budget_split.m1", "method.lr"])
    assert untunable_keys("dp_mepf", ["method.lr", "method.steps"]) == {}  # post-processing of the release


def test_a_curve_that_differs_anyway_is_reported_as_a_dpsyn_bug(make_cfg, tmp_path: Path, monkeypatch) -> None:
    """The after-trial comparison stays as an internal check: reached only if a method class wrongly declares a key
    tunable (simulated here), it says it is a bug, names neither the trial nor its settings, and releases nothing."""
    import dpsyn.task as task
    from dpsyn.methods import METHODS
    from dpsyn.private_tuning import private_search

    dp_gan = METHODS.get("dp_gan")
    monkeypatch.setattr(dp_gan, "tunable_keys", (*dp_gan.tunable_keys, "batch_size"))
    calls: list[int] = []

    def fake_run(tcfg, tdir: Path) -> dict:
        tdir.mkdir(parents=True)
        (tdir / "samples.npz").write_bytes(b"x")
        b = int(tcfg.method.batch_size)
        calls.append(b)
        ev = [SampledGaussianEvent(sampling="poisson",
                                   noise_multiplier=4.0, sample_rate=b / 1000, steps=100, accountant="rdp",
                                   label="D").to_dict(), GaussianEvent(noise_multiplier=20.0, label="s").to_dict()]
        return {"privacy_events": ev, "metrics": {"dp_score": 0.5}}

    monkeypatch.setattr(task, "run", fake_run)
    cfg = _search_cfg(make_cfg, "tuning.mean_trials=20", "tuning.trials_shape=1", "tuning.trial_eps=0.1", "eps=10")
    with open_dict(cfg):
        cfg.tuning.space = {"method.batch_size": "choice(16, 32, 64, 128)"}
    run_dir = tmp_path / "s" / "run"
    with pytest.raises(RuntimeError, match="dpsyn bug") as err:
        private_search(cfg, run_dir)
    assert not isinstance(err.value, ConfigError)
    assert "trial 2" not in str(err.value) and str(calls[-1]) not in str(err.value)
    assert len(set(calls)) == 2  # stopped at the first trial that differs
    assert [p.name for p in run_dir.parent.iterdir()] == ["run"] and not any(run_dir.iterdir())


# ---- the declared facts against the ledgers the methods write ------------------------------------------------------

_RUN = ("trainer=debug", "logger=none", "eps=1", "privacy.deterministic_noise=true",
        "trainer.enable_progress_bar=false")


def _curve(make_cfg, tmp_path: Path, method: str, *extra: str):
    """The privacy curve (events_rdp of the ledger's events) of the tiny run of ``method`` with ``extra``; for a
    ledger without one (an approximate-DP event with delta > 0), its events without their labels."""
    from dpsyn.task import run
    from tests.tiny import TINY

    result = run(make_cfg(*_RUN, *TINY[method], *extra), tmp_path / f"run-{len(list(tmp_path.iterdir()))}")
    events = [PrivacyEvent.from_dict(e) for e in result["privacy_events"]]
    try:
        return events_rdp(events, rdp_orders())
    except ValueError:
        return [{k: v for k, v in e.to_dict().items() if k != "label"} for e in events]


def _same(a, b) -> bool:
    if isinstance(a, np.ndarray) and isinstance(b, np.ndarray):
        return a.shape == b.shape and bool(np.allclose(a, b, rtol=1e-12, atol=0.0))
    return a == b


def test_a_tunable_key_leaves_pate_gans_curve_unchanged_and_an_accounting_key_changes_it(make_cfg,
                                                                                         tmp_path: Path) -> None:
    from dpsyn.methods import METHODS

    facts = METHODS.get("pate_gan")
    assert {"lr_g", "student_steps"} <= set(facts.tunable_keys)
    assert {"batch_size", "teachers", "sigma"} <= set(facts.accounting_keys)
    base = _curve(make_cfg, tmp_path, "pate_gan")
    assert isinstance(base, np.ndarray) and base.max() > 0
    assert _same(base, _curve(make_cfg, tmp_path, "pate_gan", "method.lr_g=1e-3", "method.student_steps=2"))
    for changed in ("method.batch_size=5", "method.steps=3", "method.sigma=40", "method.sigma_threshold=80"):
        assert not _same(base, _curve(make_cfg, tmp_path, "pate_gan", changed)), changed
    # the teachers enter through the noise given as ratios of them (the tiny run gives it in votes)
    ratio = ("method.sigma=null", "method.sigma_ratio=5")
    assert not _same(_curve(make_cfg, tmp_path, "pate_gan", *ratio),
                     _curve(make_cfg, tmp_path, "pate_gan", *ratio, "method.teachers=12"))


# every tunable key of every method, a valid other value for its tiny run (tests/tiny.py)
_OTHER_VALUES: dict[str, tuple[str, ...]] = {
    "real": (), "privgan": (), "gan": (), "icgan_nonprivate": (), "dp_mge": (),
    "public_uniform": ("method.public_pool=500", "method.other_classes=exclude"),
    "dp_gan": ("method.lr_g=1e-3", "method.lr_d=1e-3", "method.beta1=0.3", "method.z_dim=16",
               "method.max_grad_norm=2.0", "method.dpsgd_step=split", "method.split_fake_rows=4", "method.ngf=8",
               "method.ndf=8", "method.d_cond=projection", "method.d_steps=2", "method.loss=hinge", "method.ema=0.5",
               "method.table_g_hidden=[16]", "method.table_d_hidden=[16]"),
    "dp_gan_mi": ("method.lr_g=1e-3", "method.lr_d=1e-3", "method.beta1=0.3", "method.z_dim=16",
                  "method.max_grad_norm=2.0", "method.dpsgd_step=split", "method.split_fake_rows=4",
                  "method.hidden=32", "method.layers=3"),
    "dp_gan_ft": ("method.lr_g=1e-3", "method.lr_d=1e-3", "method.beta1=0.3", "method.z_dim=16",
                  "method.max_grad_norm=2.0", "method.dpsgd_step=split", "method.split_fake_rows=4",
                  "method.hidden=32", "method.layers=3", "method.pretrain_steps=5", "method.pretrain_batch_size=32",
                  "method.max_public=300"),
    "dp_dre": ("method.hidden=32", "method.lr=1e-2", "method.max_grad_norm=2.0", "method.ratio_power=0.5",
               "method.public_batch_size=64", "method.public_pool=500", "method.other_classes=exclude"),
    "dp_mepf": ("method.steps=2", "method.batch_size=8", "method.lr=1e-2", "method.beta1=0.3", "method.z_dim=16",
                "method.ngf=8", "method.pretrain_steps=2", "method.max_public=300"),
    "g_pate": ("method.lr_g=1e-2", "method.lr_d=1e-2", "method.lr_g_decay_start=0.5", "method.beta1=0.3",
               "method.ema=0.9", "method.z_dim=6", "method.ngf=8", "method.ndf=3", "method.teacher_hidden=16",
               "method.d_hidden=[4]", "method.g_hidden=[4]", "method.latent=normal", "method.teacher_steps=2",
               "method.teacher_fakes=2", "method.clip=1e-3", "method.bins=5"),
    "pate_gan": ("method.lr_g=1e-3", "method.lr_s=1e-3", "method.lr_d=1e-2", "method.beta1=0.3", "method.z_dim=6",
                 "method.ngf=8", "method.ndf=3", "method.student_ndf=5", "method.teacher_hidden=16",
                 "method.d_hidden=[4]", "method.g_hidden=[4]", "method.s_hidden=[4]", "method.teacher_steps=2",
                 "method.student_steps=2"),
    "gs_wgan": ("method.lr_g=1e-3", "method.lr_d=1e-3", "method.beta1=0.3", "method.beta2=0.8", "method.z_dim=6",
                "method.ngf=8", "method.ndf=3", "method.gp_weight=5.0", "method.drift=0.01", "method.ema=0.9",
                "method.clip=0.5", "method.critic_steps=2", "method.warm_start_iterations=2"),
    "pe": ("method.threshold=2.0", "method.lookahead=2", "method.selection=rank", "method.rank_keep=0.4",
           "method.feature_noise=0.3", "method.population=50", "method.final_degree=0.2", "method.num_nearest=2"),
}


def test_the_curve_check_covers_every_tunable_key_of_every_method() -> None:
    from dpsyn.methods import METHODS

    assert set(_OTHER_VALUES) == set(METHODS.names())
    for name, overrides in _OTHER_VALUES.items():
        keys = [o.split("=", 1)[0].removeprefix("method.") for o in overrides]
        assert sorted(keys) == sorted(METHODS.get(name).tunable_keys), name


@pytest.mark.slow
@pytest.mark.parametrize("method", sorted(m for m, o in _OTHER_VALUES.items() if o))
def test_no_tunable_key_changes_the_curve_so_the_after_trial_check_is_unreachable(make_cfg, tmp_path: Path,
                                                                                  method: str) -> None:
    """Every tunable key of the method set to another value at once: the tiny run's curve (or, without one, its
    events) is the same, so two trials of a search that passed check_space cannot spend different curves."""
    base = _curve(make_cfg, tmp_path, method)
    assert _same(base, _curve(make_cfg, tmp_path, method, *_OTHER_VALUES[method])), method


def test_a_search_over_its_target_stops_after_the_first_trial(make_cfg, tmp_path: Path, monkeypatch) -> None:
    import dpsyn.task as task
    from dpsyn.private_tuning import private_search

    calls = []

    def fake_run(tcfg, tdir: Path) -> dict:
        tdir.mkdir(parents=True)
        calls.append(tdir)
        ev = [SampledGaussianEvent(sampling="poisson",
                                   noise_multiplier=0.8, sample_rate=0.1, steps=100, accountant="rdp",
                                   label="D").to_dict()]
        return {"privacy_events": ev, "metrics": {"dp_score": 0.5}}

    monkeypatch.setattr(task, "run", fake_run)
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
    import dpsyn.task as task
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

    monkeypatch.setattr(task, "run", fake_run)
    cfg = _search_cfg(make_cfg, "tuning.mean_trials=6", "tuning.trials_shape=1")
    result = private_search(cfg, tmp_path / "run")
    assert len(calls) >= 3  # the seeded (deterministic) draw of K here; the best is not the first
    best = int(np.argmax(calls))
    with np.load(tmp_path / "run" / "samples.npz") as z:
        assert np.allclose(z["x"], best / 10)
    assert result["tuning"]["selected_dp_score"] == max(calls) and result["sample_provenance"] == {"trial": best}
