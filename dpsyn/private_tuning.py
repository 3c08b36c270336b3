"""Private tuning: ``python train.py experiment=tune_private method=dp_gan dataset=fmnist eps=1 tuning.trial_eps=0.5``.

Papernot & Steinke (2022): random search over a random number of trials, each a DP run with a DP score, releasing
only the best trial. ``eps`` is the target of the whole search; each trial trains with ``tuning.trial_eps``:

1. K, the number of trials, is drawn from ``tuning.mean_trials`` / ``tuning.trials_shape`` with a DP-noise
   generator (OS entropy unless ``privacy.deterministic_noise``): K stays secret.
2. Each trial draws its settings from ``tuning.space`` (Hydra's sweep syntax: ``choice(...)``, ``interval(a, b)``,
   ``tag(log, interval(a, b))``, ``int(interval(a, b))``, ``range(...)``) with a generator seeded by ``seed`` (the search space is public),
   trains on the private rows minus the validation rows (``metrics.split=validation``), and scores itself with a DP
   score: the number of validation rows its synthetic data's downstream classifier gets right, plus Gaussian noise
   of std ``tuning.score_noise_multiplier`` (sensitivity 1: one row changes the count by at most 1), recorded in its
   ledger. Nothing else is computed on the validation rows (no FD, no monitor, no membership attack): each would be
   a release without DP.
3. Every trial must spend the same data-independent RDP curve, and whether it will is decided from the
   configuration alone, before K is drawn and before anything trains (:func:`check_space`): a search whose space
   holds a key that could change a trial's accounting is refused in one line naming the key and why. Stopping at
   trial i instead, when its curve turned out to differ, would reveal K >= i, and K must stay secret. The rule is
   an allowlist: only ``method.<key>`` settings whose ``<key>`` the method's
   class (:class:`dpsyn.methods.base.Method`) lists in ``tunable_keys`` may be tuned, the keys read from its ``fit``
   and shown not to enter its accounting (learning rates, widths, post-processing, a clip norm the noise is
   calibrated in units of); its ``accounting_keys`` (batch size, epochs, steps, iterations, teachers or critics,
   noise, budget shares, ...) are refused, and so is any key in neither list (a new hyperparameter is not tunable
   until someone reads the accounting: a denylist would let it through silently). Settings outside ``method`` are
   refused too: ``dataset.*`` sets the private rows (n, hence the sample rate), ``privacy.*`` the delta and the
   accountant, ``trainer.*`` the steps (``max_epochs``, ``limit_train_batches``, ``devices``), ``eps``,
   ``tuning.*`` and ``metrics.*`` are the search's own, fixed for all its trials. The values each key can draw
   (every choice, the ends of an interval or range) are checked against the schemas up front as well, so no draw
   fails its trial's config check mid-search. After each trial its curve is still compared with the first
   trial's: a difference is a dpsyn bug (a key wrongly declared tunable), reported as such. After the first trial
   the search's cost (:class:`dpsyn.privacy.RepeatAndSelectEvent`) is checked against ``eps`` and the search
   stops, releasing nothing, if it is over (that reveals only K >= 1, as the outcome of K = 0 does).
4. The best trial (highest DP score) is published in the run directory: its samples, fitted state, settings and DP
   score, and a ledger holding one repeat-and-select event. The other trials are deleted, and nothing written to
   the run directory says how many ran (the trials run in a hidden sibling folder; Hydra's log file is paused while
   they run). The console shows them: the curator's view, not a release.
5. The published samples are scored once on the sealed eval split, as an ordinary run's are. Membership attacks
   are not run (the trial trained on the private rows minus the validation rows).
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import math
import shutil
import uuid
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
from omegaconf import DictConfig, OmegaConf, open_dict

from dpsyn.cli.config_check import ConfigError
from dpsyn.trial import SCORE, TRIAL_ROLE

log = logging.getLogger(__name__)

# ---- the search space ---------------------------------------------------------------------------------------------


def parse_space(space: Any) -> dict[str, Any]:
    """``{key: Hydra sweep object}`` from ``tuning.space`` (``{key: "tag(log, interval(1e-4, 1e-2))", ...}``)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.core.override_parser.types import ChoiceSweep, IntervalSweep, RangeSweep

    items = OmegaConf.to_container(space, resolve=True) if isinstance(space, DictConfig) else dict(space or {})
    if not items:
        raise ConfigError("tuning.space: empty; give the settings to tune, e.g. "
                          "tuning.space='{method.lr_d: \"tag(log, interval(5e-5, 2e-3))\"}' (experiment=tune_private)")
    parser = OverridesParser.create()
    out: dict[str, Any] = {}
    for key, spec in items.items():
        if "." not in key:
            raise ConfigError(f"tuning.space: {key}: only dotted settings (method.lr_d, ...) can be tuned privately, "
                              "not config groups")
        try:
            value = parser.parse_override(f"{key}={spec}").value()
        except Exception as e:  # Hydra's grammar errors
            raise ConfigError(f"tuning.space: {key}={spec}: {e}") from None
        if not isinstance(value, (ChoiceSweep, IntervalSweep, RangeSweep)):
            raise ConfigError(f"tuning.space: {key}={spec}: not a search space (use choice(...), interval(a, b), "
                              "tag(log, interval(a, b)) or range(...))")
        out[key] = value
    return out


def sample_space(space: dict[str, Any], rng: np.random.Generator) -> dict[str, Any]:
    """One draw from every key's space: uniform over a choice or range, uniform (log-uniform with the ``log`` tag)
    over an interval, integer when both interval ends are integers."""
    from hydra.core.override_parser.types import ChoiceSweep, IntervalSweep, RangeSweep

    out: dict[str, Any] = {}
    for key, sweep in space.items():
        if isinstance(sweep, ChoiceSweep):
            out[key] = sweep.list[int(rng.integers(len(sweep.list)))]
        elif isinstance(sweep, RangeSweep):
            values = list(np.arange(sweep.start, sweep.stop, sweep.step))
            out[key] = values[int(rng.integers(len(values)))].item()
        else:
            assert isinstance(sweep, IntervalSweep)
            lo, hi = float(sweep.start), float(sweep.end)
            if "log" in sweep.tags:
                if lo <= 0:
                    raise ConfigError(f"tuning.space: {key}: a log interval needs a start > 0, got {lo}")
                v = math.exp(rng.uniform(math.log(lo), math.log(hi)))
            else:
                v = float(rng.uniform(lo, hi))
            out[key] = int(round(v)) if isinstance(sweep.start, int) and isinstance(sweep.end, int) else v
    return out


# ---- which settings a private search may tune -----------------------------------------------------------------

# why a setting outside ``method`` is never tuned privately (module docstring, item 3)
_NOT_METHOD = {
    "dataset": "sets the private rows (n, hence the sample rate)",
    "privacy": "sets the delta, the accountant or the noise",
    "trainer": "sets the steps (max_epochs, limit_train_batches, devices)",
    "eps": "is the search's target (each trial spends tuning.trial_eps)",
    "tuning": "is the search's own setting",
    "metrics": "sets the DP score, the same for every trial",
}


def untunable_keys(method: str, keys: Iterable[str]) -> dict[str, str]:
    """``{key: why}`` for every key of ``keys`` that a private search of ``method`` may not tune: only
    ``method.<key>`` with ``<key>`` (the first part of a nested key) in the method class's ``tunable_keys`` may
    (module docstring, item 3)."""
    from dpsyn.config import METHOD_SCHEMAS
    from dpsyn.methods import METHODS

    facts = METHODS.get(method) if method in METHODS else None
    schema = METHOD_SCHEMAS.get(method)
    fields = set(schema.__dataclass_fields__) if schema is not None else set()
    out: dict[str, str] = {}
    for key in keys:
        group, _, rest = str(key).partition(".")
        field = rest.split(".", 1)[0]
        if group != "method":
            out[key] = _NOT_METHOD.get(group, "is not a method setting")
        elif facts is None:
            out[key] = f"belongs to method {method}, which has no declared facts"
        elif field in facts.tunable_keys:
            continue
        elif field in facts.accounting_keys:
            out[key] = f"enters {method}'s privacy accounting"
        elif field not in fields:
            out[key] = f"is not a setting of {method}"
        else:
            out[key] = f"is not declared free of {method}'s accounting"
    return out


def check_space(cfg: DictConfig, space: dict[str, Any], trial_eps: float) -> None:
    """Refuse, before K is drawn and before anything trains, a search space that could make two trials spend
    different RDP curves (:func:`untunable_keys`), or draw a value its trial's config check refuses (every choice,
    both ends of an interval or range, in every combination up to :data:`_MAX_CORNERS`, else key by key).

    Raises:
        ConfigError: one line naming the offending keys and why; nothing trained or released.
    """
    from dpsyn.config import validate
    from dpsyn.methods import METHODS

    method = str(cfg.method.name)
    bad = untunable_keys(method, space)
    if bad:
        facts = METHODS.get(method) if method in METHODS else None
        tunable = ", ".join(f"method.{k}" for k in facts.tunable_keys) if facts and facts.tunable_keys else "none"
        raise ConfigError(
            f"tuning.space: {'; '.join(f'{k} {why}' for k, why in bad.items())}: a private search tunes only "
            "settings that leave every trial's RDP curve the same (decided before the secret number of trials is "
            f"drawn); tunable for {method}: {tunable} (its class's tunable_keys); nothing was trained or "
            "released")
    corners = {key: _corners(sweep) for key, sweep in space.items()}
    combos = math.prod(len(v) for v in corners.values())
    if combos <= _MAX_CORNERS:
        draws: Iterable[dict[str, Any]] = (dict(zip(corners, values))
                                           for values in itertools.product(*corners.values()))
    else:
        first = {k: v[0] for k, v in corners.items()}
        draws = ({**first, key: value} for key, values in corners.items() for value in values)
    for params in draws:
        try:
            validate(trial_config(cfg, params, trial_eps))
        except ConfigError as e:
            raise ConfigError(f"tuning.space can draw {params}, which its trial refuses: {e}; nothing was trained or "
                              "released") from None


_MAX_CORNERS = 256  # combinations of the space's extreme values checked together (beyond: key by key)


def _corners(sweep: Any) -> list[Any]:
    """The values of a sweep the schemas' range rules (bounds, no gaps) are checked at: every choice, both ends of
    an interval (integers when both are), the first and last value of a range."""
    from hydra.core.override_parser.types import ChoiceSweep, IntervalSweep, RangeSweep

    if isinstance(sweep, ChoiceSweep):
        return list(sweep.list)
    if isinstance(sweep, RangeSweep):
        values = list(np.arange(sweep.start, sweep.stop, sweep.step))
        return [v.item() for v in (values[:1] + values[-1:] if len(values) > 1 else values)]
    assert isinstance(sweep, IntervalSweep)
    if isinstance(sweep.start, int) and isinstance(sweep.end, int):
        return [int(sweep.start), int(sweep.end)]
    return [float(sweep.start), float(sweep.end)]


# ---- the search ---------------------------------------------------------------------------------------------------


def _check(cfg: DictConfig) -> dict[str, Any]:
    from dpsyn.privacy.tuning import check_trials_distribution

    t = cfg.tuning
    eps = float(cfg.eps)
    if not math.isfinite(eps):
        raise ConfigError("tuning.private=true needs a finite eps (the whole search's target)")
    if t.get("trial_eps") is None:
        raise ConfigError("tuning.trial_eps: required with tuning.private=true: each trial's target epsilon, below "
                          f"eps={eps:g} (the search's cost is checked after the first trial; what a search costs: "
                          "docs/tuning.md, 'What a private search costs')")
    trial_eps = float(t.trial_eps)
    if not 0 < trial_eps <= eps:
        raise ConfigError(f"tuning.trial_eps={trial_eps:g}: must lie in (0, eps={eps:g}]")
    try:
        mean, shape = check_trials_distribution(mean=t.mean_trials, shape=t.trials_shape)
    except ValueError as e:
        raise ConfigError(f"tuning.mean_trials / tuning.trials_shape: {e}") from None
    nm = float(t.score_noise_multiplier)
    if not nm > 0:
        raise ConfigError(f"tuning.score_noise_multiplier={nm}: must be > 0")
    if cfg.dataset.get("kind") != "image":
        raise ConfigError(f"tuning.private=true: dataset={cfg.dataset.name} is a {cfg.dataset.get('kind')} dataset; "
                          "trials score by downstream accuracy, so image datasets only")
    if cfg.metrics.split != "eval":
        raise ConfigError("tuning.private=true: leave metrics.split=eval (the trials score on validation rows, the "
                          "published run on the eval split)")
    return {"eps": eps, "trial_eps": trial_eps, "mean": mean, "shape": shape, "score_nm": nm}


def trial_config(cfg: DictConfig, params: dict[str, Any], trial_eps: float) -> DictConfig:
    """The configuration of one trial: the run's, with the drawn settings, ``eps=trial_eps``, scored by the DP score
    on the validation split, no logger, no monitor."""
    tcfg = OmegaConf.create(OmegaConf.to_container(cfg, resolve=True))
    with open_dict(tcfg):
        for key, value in params.items():
            if OmegaConf.select(tcfg, key, default="__missing__") == "__missing__":
                raise ConfigError(f"tuning.space: {key}: no such setting in this run's configuration")
            OmegaConf.update(tcfg, key, value, merge=False)
        tcfg.eps = trial_eps
        tcfg.metrics.split = "validation"
        tcfg.metrics.names.image = ["acc"]
        tcfg.logger = {"_target_": None}
        tcfg.tuning.private = False
        tcfg.tuning.role = TRIAL_ROLE
        tcfg.tuning.objective = None
    return tcfg


@contextlib.contextmanager
def _log_files_paused() -> Iterator[None]:
    """Detach the root logger's file handlers (Hydra's ``<job>.log`` in the run directory) while trials run: their
    log lines would say how many there were."""
    root = logging.getLogger()
    files = [h for h in root.handlers if isinstance(h, logging.FileHandler)]
    for h in files:
        root.removeHandler(h)
    try:
        yield
    finally:
        for h in files:
            root.addHandler(h)


def private_search(cfg: DictConfig, run_dir: Path) -> dict[str, Any]:
    """Run the search (module docstring) and publish the best trial in ``run_dir``; returns its result record."""
    from dpsyn.results.protocol import protocol_record
    from dpsyn.task import family_loader, git_sha, privacy_record, run, versions
    from dpsyn.data import load_dataset
    from dpsyn.methods import Samples
    from dpsyn.metrics import evaluate
    from dpsyn.privacy import PrivacyEvent, PrivacyLedger, RepeatAndSelectEvent, dp_numpy_generator
    from dpsyn.privacy.dpsgd import rdp_orders
    from dpsyn.privacy.ledger import events_rdp
    from dpsyn.privacy.tuning import draw_trial_count, trials_distribution_name
    from dpsyn.results.io import atomic_write_json, atomic_write_text

    opts = _check(cfg)
    space = parse_space(cfg.tuning.space)
    check_space(cfg, space, opts["trial_eps"])  # before K is drawn: no trial can then stop the search (item 3)
    orders = rdp_orders()
    k = draw_trial_count(mean=opts["mean"], shape=opts["shape"],
                         generator=dp_numpy_generator(deterministic=bool(cfg.privacy.deterministic_noise),
                                                      seed=int(cfg.seed) + 15485863))
    search_rng = np.random.default_rng([int(cfg.seed), 0x7475])  # the settings tried: public randomness
    dist = trials_distribution_name(mean=opts["mean"], shape=opts["shape"])
    run_dir.mkdir(parents=True, exist_ok=True)
    trials_dir = run_dir.parent / f".{run_dir.name}.trials-{uuid.uuid4().hex}"
    log.info("private tuning (Papernot & Steinke 2022): a %s number of trials at eps=%g each, search target eps=%g; "
             "only the best trial is published", dist, opts["trial_eps"], opts["eps"])
    best: dict[str, Any] | None = None
    trial_events: list[PrivacyEvent] | None = None
    curve: np.ndarray | None = None
    try:
        with _log_files_paused():
            for i in range(k):
                params = sample_space(space, search_rng)
                print(f"dpsyn: private tuning, trial {i + 1}: {params} (console only: not published)", flush=True)
                tdir = trials_dir / uuid.uuid4().hex
                result = run(trial_config(cfg, params, opts["trial_eps"]), tdir)
                events = [PrivacyEvent.from_dict(e) for e in result["privacy_events"]]
                c = events_rdp(events, orders)
                if curve is None:
                    trial_events, curve = events, c
                    cost = PrivacyLedger(target_epsilon=opts["eps"], delta=float(cfg.privacy.delta), events=[
                        RepeatAndSelectEvent(trial_events=[e.to_dict() for e in events], mean_trials=opts["mean"],
                                             shape=opts["shape"], label="private tuning")])
                    if cost.epsilon() > opts["eps"] * (1 + 1e-9):
                        raise ConfigError(
                            f"private tuning: a trial at tuning.trial_eps={opts['trial_eps']:g} makes the search "
                            f"cost eps {cost.epsilon():.4g} > eps={opts['eps']:g} ({dist} trials): lower "
                            "tuning.trial_eps or tuning.mean_trials; nothing was released")
                elif not np.allclose(c, curve, rtol=1e-9, atol=1e-12):
                    # unreachable when the classes' tunable_keys are right (check_space); neither the trial's index nor its
                    # settings (drawn from public randomness, they would give the index) are named
                    raise RuntimeError(
                        f"dpsyn bug: a private-tuning trial spent another RDP curve than the first, although every "
                        f"key of tuning.space ({', '.join(space)}) is declared free of {cfg.method.name}'s accounting "
                        "(its class's tunable_keys): one is not; please report it. Stopping here reveals "
                        "that the secret number of trials is at least 2; nothing was released")
                if best is None or result["metrics"][SCORE] > best["score"]:
                    best = {"score": float(result["metrics"][SCORE]), "params": params, "dir": tdir, "result": result}
        if best is None:
            raise ConfigError(f"private tuning drew no trial ({dist}: K = 0 has probability "
                              f"{math.exp(-opts['mean']):.3g}); nothing was trained or released. Running it again "
                              "is another search (a truncated negative binomial, tuning.trials_shape >= 0, never "
                              "draws 0)")
        # publish the best trial: its DP outputs move into the run directory
        for name in ("samples.npz", "samples.png", "checkpoints"):
            src = best["dir"] / name
            if src.exists():
                dst = run_dir / name
                if dst.is_dir():
                    shutil.rmtree(dst)
                shutil.move(str(src), str(dst))
    finally:
        shutil.rmtree(trials_dir, ignore_errors=True)

    assert trial_events is not None
    published = OmegaConf.create(OmegaConf.to_container(cfg, resolve=True))  # the search's settings + the selected
    for key, value in best["params"].items():
        OmegaConf.update(published, key, value, merge=False)
    atomic_write_text(run_dir / "config.yaml", OmegaConf.to_yaml(published))
    delta = float(cfg.privacy.delta)
    ledger = PrivacyLedger(target_epsilon=opts["eps"], delta=delta)
    ledger.add(RepeatAndSelectEvent(trial_events=[e.to_dict() for e in trial_events], mean_trials=opts["mean"],
                                    shape=opts["shape"],
                                    label=f"private tuning of {', '.join(space)}: best of a {dist} number of trials"))
    ledger.check_within_budget()
    ledger.save(run_dir / "privacy.json")
    spent = ledger.epsilon(delta)

    # the published samples, scored once on the sealed eval split
    data = load_dataset(cfg.dataset, seed=int(cfg.seed), data_dir=cfg.paths.data_dir, public=False)
    with np.load(run_dir / "samples.npz") as z:
        samples = Samples(z["x"], z["y"] if z["y"].size else None, {"loaded_from": "the selected trial"})
    metrics, metric_s, metric_info = evaluate(samples, data, cfg.metrics, cache_dir=cfg.paths.cache_dir,
                                              seed=int(cfg.seed), load_family=family_loader(cfg))
    tr = best["result"]
    result = {
        "method": cfg.method.name,
        "dataset": cfg.dataset.name,
        "eps": opts["eps"],
        "delta": delta,
        "seed": int(cfg.seed),
        "experiment": cfg.experiment_name,
        "profile": cfg.profile,
        "epsilon_spent": spent,
        "non_private_reference": False,
        **privacy_record(cfg, ledger),
        "metrics": metrics,
        "metric_info": metric_info,
        "n_private": tr["n_private"],
        "n_samples": len(samples),
        "sample_provenance": tr["sample_provenance"],
        "data": data.info,
        "fit_restored": False,
        "metrics_split": data.eval_split,
        **protocol_record(cfg),
        "tuning": {
            "role": "private",
            "method": "Papernot & Steinke 2022 (random search, random number of trials, best trial released)",
            "trials_distribution": dist,
            "mean_trials": opts["mean"],
            "trials_shape": opts["shape"] if math.isfinite(opts["shape"]) else "inf",
            "trial_eps": opts["trial_eps"],
            "score": "(correct validation predictions + Gaussian noise) / n_validation",
            "score_noise_multiplier": opts["score_nm"],
            "space": {k_: str(v) for k_, v in OmegaConf.to_container(cfg.tuning.space, resolve=True).items()},
            "selected": best["params"],
            "selected_dp_score": best["score"],
            "n_validation": tr["metric_info"][SCORE]["n_validation"],
        },
        "timings": {"selected_fit_s": tr["timings"]["fit_s"], **{f"metric_{k_}_s": v for k_, v in metric_s.items()}},
        "git_sha": git_sha(),
        "versions": versions(),
        "run_dir": str(run_dir),
        "overrides": list(tr.get("overrides", [])),
    }
    # no total time: it grows with the number of trials, which stays secret
    atomic_write_json(run_dir / "result.json", result)
    return result
