"""One run of method x dataset x eps x seed, as a function: :func:`run` checks the composed config, loads the data,
fits the method under its budget (every release in the ledger), refuses to write a result if the ledger exceeds the
target, samples, scores and writes the run directory atomically (result.json last).

The command line (:mod:`dpsyn.cli.train`) parses and hands the composed config here; private tuning
(:mod:`dpsyn.private_tuning`) calls :func:`run` once per trial.

Crash safety: right after fit, the method's fitted state (:meth:`~dpsyn.methods.base.Method.fitted_state`) and the
ledger are saved to ``checkpoints/fitted.pt`` with a fingerprint of the config; a rerun in the same run directory
(after a kill while sampling or scoring) restores them and skips fit, so nothing is released or charged twice. A
state made under another config is refused.

Charges are written ahead: the run's ledger journals itself to ``checkpoints/ledger.journal.json`` inside every
recording call (:meth:`dpsyn.privacy.PrivacyLedger.attach_journal`), since a SIGKILL skips the ``finally`` that writes
privacy.json. A rerun starts its ledger from that journal, and a checkpoint it resumes from is merged into it (the
later state of each event is kept), so the releases a killed attempt made after its last checkpoint stay charged.
"""

from __future__ import annotations

import json
import logging
import math
import platform
import subprocess
import time
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from dpsyn.cli.config_check import ConfigError, check_composed, check_delta
from dpsyn.config import load_group
from dpsyn.paths import IN_CHECKOUT, REPO_DIR

log = logging.getLogger("dpsyn")


def _git(*args: str) -> str | None:
    """``git <args>``'s output in the repository, stripped; None outside a git checkout or when git fails (an
    installed dpsyn asks no git: a repository around its site-packages is not dpsyn's)."""
    if not IN_CHECKOUT:
        return None
    try:
        out = subprocess.run(["git", *args], cwd=REPO_DIR, capture_output=True, text=True, timeout=10, check=True)
        return out.stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None


def git_sha() -> str | None:
    return _git("rev-parse", "HEAD") or None


def git_dirty() -> bool | None:
    """Whether tracked files differ from HEAD (untracked files are not counted); None outside a git checkout."""
    status = _git("status", "--porcelain", "--untracked-files=no")
    return None if status is None else bool(status)


def versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {"python": platform.python_version()}
    for pkg in ("dpsyn", "torch", "torchvision", "opacus", "lightning", "hydra-core", "numpy"):
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            pass
    return out


def _make_logger(cfg: DictConfig) -> Any:
    import hydra

    from dpsyn.console import quiet_logger

    if cfg.logger.get("_target_") is None:
        return None
    return quiet_logger(hydra.utils.instantiate(cfg.logger))


def family_loader(cfg: DictConfig):
    """``load(family)``: a dataset family's evaluation data (its yaml on its own, seed 0), for the evaluation
    networks and PE's monitor."""
    from dpsyn.data import load_dataset

    def load(family: str) -> Any:
        fam_cfg = load_group("dataset", family)
        # the evaluation network never needs ImageNet's validation images (the public split cifar10/pets/cars/birds
        # name); an embedded public split is still read, so the cached networks keep their keys (the data record)
        return load_dataset(fam_cfg, seed=0, data_dir=cfg.paths.data_dir,
                            public=fam_cfg.get("public") != "imagenet_val")

    return load


FITTED_STATE = Path("checkpoints") / "fitted.pt"
FITTED_STATE_VERSION = 1


def selection_eps(cfg: DictConfig) -> float:
    """The epsilon a DP selection in the metrics takes out of the run's eps: ``metrics.dpimagebench.selection_eps``
    with ``metrics.protocol=dpimagebench`` and ``selection=noisy_max``, else 0 (a non-private run: 0 too)."""
    from dpsyn.metrics import protocol

    m = cfg.metrics
    if protocol(m) != "dpimagebench" or m.dpimagebench.selection != "noisy_max" or math.isinf(float(cfg.eps)):
        return 0.0
    return float(m.dpimagebench.selection_eps)


def fit_fingerprint(cfg: DictConfig, delta: float) -> dict[str, Any]:
    """What a fitted state depends on: the method's, dataset's, privacy and trainer settings, eps, delta, seed and
    the public models. The sampling and metric settings are not in it (sampling and scoring are post-processing).
    Each group counts with every field of its typed schema (:func:`dpsyn.config.fingerprint`), so a new
    hyperparameter cannot be missed."""
    from dpsyn.config import fingerprint

    def node(key: str) -> Any:
        value = cfg.get(key)
        return fingerprint(value, key) if isinstance(value, DictConfig) else value

    return json.loads(json.dumps({
        "method": node("method"), "dataset": node("dataset"), "eps": float(cfg.eps), "delta": float(delta),
        "seed": int(cfg.seed), "privacy": node("privacy"), "trainer": node("trainer"), "public": node("public"),
        # a tuning run fits on the private rows left after the validation split: another fit
        **({"metrics_split": "validation"} if cfg.metrics.get("split") == "validation" else {}),
        # protocol dpimagebench: the method fits without the validation rows, at eps less the selection's share
        **({"protocol": {"name": "dpimagebench", "validation_rows": int(cfg.metrics.dpimagebench.validation_rows),
                         "selection_eps": selection_eps(cfg)}}
           if cfg.metrics.get("protocol") == "dpimagebench" else {}),
    }, sort_keys=True, default=str))


def journal_fingerprint(fingerprint: dict[str, Any], method_cls: Any) -> dict[str, Any]:
    """What a ledger journal must share with the run that merges it: the fit fingerprint without the method's
    ``resume_free_keys`` (settings a resumed training checkpoint may change too, such as its interval)."""
    free = set(getattr(method_cls, "resume_free_keys", ()))
    method = fingerprint.get("method")
    if not isinstance(method, dict) or not free:
        return fingerprint
    return {**fingerprint, "method": {k: v for k, v in method.items() if k not in free}}


def _fitted_checkpointer(path: Path, fingerprint: dict[str, Any]) -> Any:
    from dpsyn.results.checkpoint import Checkpointer

    return Checkpointer(path, fingerprint, version=FITTED_STATE_VERSION, what="fitted")


def save_fitted_state(path: Path, method: Any, ledger: Any, fingerprint: dict[str, Any], fit_s: float) -> bool:
    """Write the method's fitted state with the ledger it was fitted under to ``path``, atomically (through the one
    checkpointer, :class:`dpsyn.results.checkpoint.Checkpointer`).

    Returns:
        False (nothing written) when the method keeps no fitted state (:meth:`Method.fitted_state` is None).
    """
    state = method.fitted_state()
    if state is None:
        return False
    _fitted_checkpointer(path, fingerprint).save(0, {"fit_s": float(fit_s), "state": state}, ledger)
    log.info("fitted state and ledger saved to %s", path)
    return True


def load_fitted_state(path: Path, fingerprint: dict[str, Any]) -> dict[str, Any] | None:
    """The fitted state a run saved at ``path`` (:func:`save_fitted_state`): ``{"state", "ledger", "fit_s"}``, or
    None when there is none.

    Raises:
        ValueError: the state was made under another configuration (or by another version of this file).
    """
    # on the device it was saved from (the same machine's run): the fitted attributes are whole modules
    saved = _fitted_checkpointer(path, fingerprint).load(map_location=None)
    if saved is None:
        return None
    return {"state": saved.state["state"], "ledger": saved.ledger, "fit_s": saved.state["fit_s"]}


def run(cfg: DictConfig, run_dir: Path) -> dict[str, Any]:
    """Execute one run and write its outputs into ``run_dir``; return the result record.

    Raises:
        ConfigError: a configuration mistake (found before any training).
        dpsyn.privacy.BudgetExceededError: the ledger exceeds the target; nothing is written but privacy.json.
    """
    from dpsyn.data import load_dataset
    from dpsyn.methods import METHODS, PrivacyBudget, RunContext
    from dpsyn.methods.base import run_limits
    from dpsyn.metrics import evaluate, make_monitor
    from dpsyn.metrics import protocol as metric_protocol
    from dpsyn.trial import is_private_trial, trial_score
    from dpsyn.privacy import PrivacyLedger
    from dpsyn.privacy.journal import JOURNAL_PATH
    from dpsyn.results.grid import save_sample_grid
    from dpsyn.results.protocol import protocol_record
    from dpsyn.results.io import atomic_save_npz, atomic_write_json, atomic_write_text

    from dpsyn.console import settle_library_handlers

    t_start = time.perf_counter()
    # the code that trains is the code at the start: HEAD may move during a long run
    code = {"git_sha": git_sha(), "git_dirty": git_dirty()}
    settle_library_handlers()  # the libraries are imported now: each of their log lines printed once
    check_composed(cfg)
    private_trial = is_private_trial(cfg)
    method_cls = METHODS.get(cfg.method.name)
    if cfg.trainer.get("strategy") == "dpsgd_ddp" and not method_cls.supports_ddp:
        raise ConfigError(f"trainer=ddp: method {cfg.method.name} does not train with multi-process DP-SGD; methods "
                          f"that do: {', '.join(sorted(n for n in METHODS.names() if METHODS.get(n).supports_ddp))}")
    # the dataset's yaml names its public split; it is read only for a method that uses public data
    data = load_dataset(cfg.dataset, seed=int(cfg.seed), data_dir=cfg.paths.data_dir, public=method_cls.needs_public)
    if cfg.metrics.split == "validation":  # tuning: every metric (and PE's monitor) reads rows carved from private
        from dpsyn.data import carve_validation

        data = carve_validation(data, float(cfg.dataset.validation_size), int(cfg.dataset.split_seed))
        log.info("metrics.split=validation: %d private rows held out and scored against; the eval split is not read",
                 len(data.eval))
    if metric_protocol(cfg.metrics) == "dpimagebench":  # the selection's real rows: held out of what the method sees
        from dpsyn.data import hold_out_validation

        data = hold_out_validation(data, int(cfg.metrics.dpimagebench.validation_rows), int(cfg.dataset.split_seed))
        log.info("metrics.protocol=dpimagebench: %d private rows held out for the classifiers' selection",
                 len(data.validation))
    eps = float(cfg.eps)
    delta = check_delta(cfg.privacy.delta, n_private=len(data.private))
    run_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_text(run_dir / "config.yaml", OmegaConf.to_yaml(cfg, resolve=True))

    logger = _make_logger(cfg)
    trainer_cfg = {k: v for k, v in OmegaConf.to_container(cfg.trainer, resolve=True).items() if v is not None}
    ctx = RunContext(
        seed=int(cfg.seed),
        deterministic_noise=bool(cfg.privacy.deterministic_noise),
        accountant=str(cfg.privacy.accountant),
        kind=data.kind,
        shape=data.shape,
        num_classes=data.num_classes,
        classes=list(data.classes),
        trainer=trainer_cfg,
        **run_limits(trainer_cfg),
        logger=logger,
        run_dir=run_dir,
        public=cfg.get("public"),
        cache_dir=str(cfg.paths.cache_dir),
        data_dir=str(cfg.paths.data_dir),
        public_classes=list(data.public_classes) if data.public_classes else None,
        # a private tuning trial computes nothing on the validation rows but its DP score (dpsyn.private_tuning)
        monitor=None if private_trial else make_monitor(data, cfg.metrics, cache_dir=cfg.paths.cache_dir,
                                                        load_family=family_loader(cfg)),
    )
    method = method_cls(cfg.method, ctx)
    # a DP selection in the metrics (protocol dpimagebench, noisy_max) is paid out of eps: the method gets the rest
    method_eps = eps - selection_eps(cfg)
    budget = PrivacyBudget(epsilon=method_eps, delta=delta)
    fingerprint = fit_fingerprint(cfg, delta)
    fitted = load_fitted_state(run_dir / FITTED_STATE, fingerprint)  # a mismatch is refused before any work
    ledger = PrivacyLedger(target_epsilon=eps, delta=delta)
    if not private_trial:  # (a private tuning trial runs once, in a directory of its own, never resumed)
        # write-ahead: every charge on disk before its release can be used; a rerun keeps the killed attempt's
        # charges, those made after its last checkpoint too (another configuration's journal is refused here)
        # (the method's resume-free keys, e.g. a checkpoint interval, may change between attempts: not in it)
        ledger.attach_journal(run_dir / JOURNAL_PATH, fingerprint=journal_fingerprint(fingerprint, method_cls))
    try:
        if logger is not None:
            logger.log_hyperparams(OmegaConf.to_container(cfg, resolve=True))
        if fitted is not None:
            # killed after fit (sampling, scoring): the fitted state and its ledger are restored, nothing is released
            # again (fitting again would draw fresh noise: a second release of the same private data); what the
            # journal holds beyond the fitted ledger (a DP score of a killed attempt) stays charged
            ledger.restore(fitted["ledger"]["events"], source=str(run_dir / FITTED_STATE))
            method.load_fitted_state(fitted["state"])
            ledger.save(run_dir / "privacy.json")
            fit_s = float(fitted["fit_s"])
            log.info("%s: fitted state restored from %s (fit skipped, %d ledger events restored)", cfg.method.name,
                     run_dir / FITTED_STATE, len(ledger))
        else:
            t0 = time.perf_counter()
            try:
                # a DP selection in the metrics is paid out of eps: methods that stop by the ledger stop short of it
                with ledger.reserving(selection_eps(cfg)):
                    method.fit(data.private, budget, ledger, public=data.public)
            finally:
                ledger.save(run_dir / "privacy.json")  # whatever was spent is on disk, even after a crash
            fit_s = time.perf_counter() - t0
            save_fitted_state(run_dir / FITTED_STATE, method, ledger, fingerprint, fit_s)
        if (run_dir / FITTED_STATE).is_file():  # teachers, critics: not DP outputs, not left in the run directory
            method.drop_unreleased_checkpoint_state()
        spent = ledger.epsilon(delta)
        if not method_cls.reference:
            ledger.check_within_budget()  # no result row for a run over its target
            if method_eps < eps and ledger.epsilon(delta) > method_eps * (1 + 1e-9):
                from dpsyn.privacy import BudgetExceededError

                raise BudgetExceededError(f"the method spent eps {spent:.6g} > {method_eps:.6g}, the share of eps "
                                          f"left after metrics.dpimagebench.selection_eps={selection_eps(cfg):g}")

        t0 = time.perf_counter()
        samples = method.sample(int(cfg.metrics.n_samples))
        sample_s = time.perf_counter() - t0
        atomic_save_npz(run_dir / "samples.npz", x=samples.x, y=samples.y if samples.y is not None else [])
        if data.kind == "image":
            # a raw data-dependent PATE epsilon is labelled as such wherever it is shown (not itself a DP release)
            raw = ", raw data-dependent" if ledger.raw_data_dependent() else ""
            save_sample_grid(
                run_dir / "samples.png",
                samples.x,
                samples.y,
                data.classes,
                title=f"{cfg.method.name} on {cfg.dataset.name}, eps={eps:g} (spent {spent:.3g}{raw})",
            )
        metrics, metric_s, metric_info = evaluate(
            samples, data, cfg.metrics, cache_dir=cfg.paths.cache_dir, seed=int(cfg.seed), load_family=family_loader(cfg),
            ledger=ledger, deterministic_noise=bool(cfg.privacy.deterministic_noise),
        )
        if metric_protocol(cfg.metrics) == "dpimagebench" and cfg.metrics.dpimagebench.selection == "noisy_max":
            # the classifiers' DP selection is in the ledger now
            ledger.save(run_dir / "privacy.json")
            spent = ledger.epsilon(delta)
            if not method_cls.reference:
                ledger.check_within_budget()
        if private_trial:  # the DP score replaces every metric; its noise is recorded in the ledger
            metrics, metric_info = trial_score(metrics, metric_info, cfg, ledger)
            ledger.save(run_dir / "privacy.json")
            spent = ledger.epsilon(delta)
        tuning = tuning_release(cfg, ledger)
        if tuning:
            ledger.save(run_dir / "privacy.json")
            spent = ledger.epsilon(delta)
        extra, extra_info = method.report()  # facts of the fitted method: it never gets the data
        metrics.update(extra)
        metric_info.update(extra_info)
        target = None if private_trial else method.membership_target()
        if target is not None:  # attacks on the released models: dpsyn.metrics reads the private and eval rows
            from dpsyn.metrics.membership import evaluate_membership

            extra, extra_info = evaluate_membership(target, data.private, data.eval, seed=int(cfg.seed),
                                                    dataset=data.name, num_classes=data.num_classes,
                                                    split=data.eval_split)
            metrics.update(extra)
            metric_info.update(extra_info)
        if logger is not None:
            logger.log_metrics({f"final/{k}": v for k, v in metrics.items() if isinstance(v, (int, float))})
            if hasattr(logger, "log_image") and (run_dir / "samples.png").exists():
                logger.log_image(key="samples", images=[str(run_dir / "samples.png")])
        result = {
            "method": cfg.method.name,
            "dataset": cfg.dataset.name,
            "eps": eps,
            "delta": delta,
            "seed": int(cfg.seed),
            "experiment": cfg.experiment_name,
            "profile": cfg.profile,
            "epsilon_spent": spent,
            "non_private_reference": bool(method_cls.reference),
            **privacy_record(cfg, ledger),
            "metrics": metrics,
            "metric_info": metric_info,
            "n_private": len(data.private),
            "n_samples": len(samples),
            "sample_provenance": samples.provenance,
            "data": data.info,
            "fit_restored": fitted is not None,
            "metrics_split": data.eval_split,
            **protocol_record(cfg),  # what measured the metrics: claims and tables never mix two
            **({"tuning": tuning} if tuning else {}),
            "timings": {"fit_s": fit_s, "sample_s": sample_s, **{f"metric_{k}_s": v for k, v in metric_s.items()}},
            **code,  # git_sha, git_dirty: at the start of this process (a resumed run: of the resume)
            "versions": versions(),
            "run_dir": str(run_dir),
            "overrides": list(task_overrides()),
        }
        result["timings"]["total_s"] = time.perf_counter() - t_start
        atomic_write_json(run_dir / "result.json", result)  # last: its presence means the run is complete
        if logger is not None:
            logger.finalize("success")
        return result
    finally:
        if logger is not None and cfg.logger._target_.endswith("WandbLogger"):
            import wandb

            wandb.finish()


def privacy_record(cfg: DictConfig, ledger: Any) -> dict[str, Any]:
    """What every result.json says of its privacy: the accountant, the neighbour relation of every epsilon in it, the
    ledger's events and whether the noise was seeded deterministically (not private)."""
    from dpsyn.privacy.ledger import ADJACENCY_TEXT

    return {"accountant": ledger.accountant_description(), "adjacency": ADJACENCY_TEXT,
            "privacy_events": ledger.to_dict()["events"],
            "deterministic_noise": bool(cfg.privacy.deterministic_noise)}


def tuning_release(cfg: DictConfig, ledger: Any) -> dict[str, Any] | None:
    """Record what tuning releases, as non-private ledger events (the ledger's epsilon becomes inf).

    A trial of a tuning sweep (``tuning.objective`` set) hands its validation score to the sweeper, which chooses the
    next trial's settings from it: a release of private data without DP. A run whose settings were chosen that way
    (``tuning.tuned_on``, set by ``python -m dpsyn.cli.tune final``) depends on those scores: its output is not
    covered by its own epsilon either. Private tuning (``tuning.private=true``, :mod:`dpsyn.private_tuning`) charges a
    DP score per trial and a random number of trials instead, and records neither of these events.
    """
    from dpsyn.privacy import NonPrivateEvent

    t = cfg.get("tuning")
    if t is None or (t.get("objective") is None and t.get("tuned_on") is None):
        return None
    if cfg.metrics.get("split") == "validation" and t.get("objective") is not None:
        ledger.add(NonPrivateEvent(label=f"tuning trial: validation {t.objective} released to the sweeper (non-private)"))
        return {"role": "trial", "objective": str(t.objective), "split": "validation"}
    ledger.add(NonPrivateEvent(label=f"settings chosen on {t.get('trials')} trials' validation scores of "
                                     f"{t.tuned_on} (non-private tuning)"))
    return {"role": "final", "tuned_on": str(t.tuned_on), "trials": t.get("trials")}


def task_overrides() -> list[str]:
    from hydra.core.hydra_config import HydraConfig

    try:
        return list(HydraConfig.get().overrides.task)
    except ValueError:
        return []


def _without_eps(overrides: list[str]) -> set[str]:
    return {o for o in overrides if not o.startswith(("eps=", "skip_existing="))}


def reuse_eps_free_result(cfg: DictConfig, run_dir: Path, sweep_dir: Path, overrides: list[str]) -> dict[str, Any] | None:
    """Fill the cell ``run_dir`` of an eps-free method from a finished cell of the same sweep at another eps.

    A sweep over eps runs ``public_uniform`` (reads no private data) and the references (``real``,
    ``icgan_nonprivate``) once per eps although their output is the same at every eps. With ``skip_existing=true``
    a cell of such a method (``Method.output_depends_on_eps() is False``) whose twin — same method, dataset and
    seed, the same command-line overrides but eps, scored under the same protocol — is finished under ``sweep_dir``
    gets the twin's outputs (samples linked, ledger copied) and a result.json with this cell's eps, ``reused_from``
    naming the twin. A twin whose ledger exceeds this cell's target (possible only for a non-reference method) is not
    reused.

    Returns:
        the result written, or None when the method depends on eps or no twin is finished (then the cell runs).
    """
    import os
    import shutil

    from dpsyn.methods import METHODS
    from dpsyn.results.io import atomic_write_json, atomic_write_text
    from dpsyn.results.protocol import protocol_id

    method_cls = METHODS.get(cfg.method.name)
    if method_cls.output_depends_on_eps():
        return None
    t0 = time.perf_counter()
    eps, key = float(cfg.eps), _without_eps(overrides)
    protocol = protocol_id(cfg)
    for path in sorted(Path(sweep_dir).rglob("result.json")):
        if path.parent.resolve() == run_dir.resolve():
            continue
        try:
            twin = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if (twin.get("method"), twin.get("dataset"), twin.get("seed")) != (cfg.method.name, cfg.dataset.name,
                                                                           int(cfg.seed)):
            continue
        if _without_eps(list(twin.get("overrides") or [])) != key:
            continue
        if twin.get("protocol") != protocol:  # scored another way (code defaults moved since): scored again
            continue
        if not twin.get("non_private_reference") and not float(twin.get("epsilon_spent", math.inf)) <= eps:
            continue
        source = Path(twin.get("reused_from") or path.parent)
        run_dir.mkdir(parents=True, exist_ok=True)
        for name in ("samples.npz", "samples.png", "privacy.json"):
            if (source / name).is_file():
                (run_dir / name).unlink(missing_ok=True)
                try:  # a hard link: the samples are not stored twice
                    os.link(source / name, run_dir / name)
                except OSError:
                    shutil.copy2(source / name, run_dir / name)
        atomic_write_text(run_dir / "config.yaml", OmegaConf.to_yaml(cfg, resolve=True))
        result = {**twin, "eps": eps, "run_dir": str(run_dir), "overrides": list(overrides),
                  "reused_from": str(source),
                  "timings": {**twin.get("timings", {}), "total_s": time.perf_counter() - t0}}
        atomic_write_json(run_dir / "result.json", result)
        return result
    return None
