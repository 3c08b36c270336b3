"""Config checks that run before any work and fail in one line naming the key and the allowed values.

Hydra itself rejects unknown keys and wrong types (each group's yaml extends its typed schema, dpsyn.config);
these add what Hydra cannot know: the registered methods and datasets, the ranges and cross-field rules the schemas
declare (:func:`dpsyn.config.validate`), and which methods need a dataset with public data. Nothing here imports
torch (the facts about dpsyn's own methods come from dpsyn.config.catalog; a plugin's, from its class).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from dpsyn.config import ACCOUNTANTS, ConfigError, hydra_error_line, load_group, method_facts, method_names, validate
from dpsyn.paths import CONF_DIR

__all__ = ["ConfigError", "check_composed", "check_delta", "check_eps", "group_options", "preflight"]


GROUPS = ("method", "dataset", "privacy", "metrics", "trainer", "logger", "paths", "experiment")


def group_options(group: str, conf_dir: Path = CONF_DIR) -> list[str]:
    """The config files of a group (``conf/<group>/*.yaml``), by name; a name starting with ``_`` is a part other
    files include (``experiment/_base``), not a choice."""
    return sorted(p.stem for p in (conf_dir / group).glob("*.yaml") if not p.stem.startswith("_"))


def datasets_with_public(conf_dir: Path = CONF_DIR) -> list[str]:
    """Datasets whose config names a public source."""
    return [d for d in group_options("dataset", conf_dir) if load_group("dataset", d, conf_dir).get("public")]


def check_eps(value: Any) -> float:
    """``eps`` must be a number > 0 (``inf`` for non-private)."""
    try:
        eps = float(value)
    except (TypeError, ValueError):
        raise ConfigError(f"eps={value!r}: must be a number > 0, or inf for a non-private run") from None
    if not eps > 0 or math.isnan(eps):
        raise ConfigError(f"eps={value}: must be > 0 (e.g. 0.1, 1, 10), or inf for a non-private run")
    return eps


def check_delta(value: Any, n_private: int | None = None) -> float:
    """``privacy.delta`` must lie in (0, 1) and, once the private set is known, in (0, 1/n)."""
    try:
        delta = float(value)
    except (TypeError, ValueError):
        raise ConfigError(f"privacy.delta={value!r}: must be a number in (0, 1/n_private)") from None
    upper = 1.0 if n_private is None else 1.0 / n_private
    if not 0 < delta < upper:
        bound = "1" if n_private is None else f"1/n = {upper:.3g} (n = {n_private} private examples)"
        raise ConfigError(f"privacy.delta={value}: must lie in (0, {bound})")
    return delta


def check_composed(cfg: Any) -> None:
    """Checks on a composed config (single run or one job of a sweep): names, eps and delta, the schemas' ranges and
    cross-field rules, and the method's dataset kinds and public data."""
    from dpsyn.data import DATASETS

    facts = method_facts(cfg.method.name)
    if facts is None:
        raise ConfigError(f"method={cfg.method.name}: unknown method; allowed: {', '.join(method_names())}")
    if cfg.dataset.name not in DATASETS:
        raise ConfigError(f"dataset={cfg.dataset.name}: unknown dataset; allowed: {', '.join(DATASETS.names())}")
    check_eps(cfg.eps)
    check_delta(cfg.privacy.delta)
    if cfg.privacy.accountant not in ACCOUNTANTS:
        raise ConfigError(
            f"privacy.accountant={cfg.privacy.accountant}: unknown accountant; allowed: {', '.join(ACCOUNTANTS)}"
        )
    validate(cfg)
    if facts.needs_public and not cfg.dataset.get("public"):
        raise ConfigError(
            f"dataset={cfg.dataset.name}: method {cfg.method.name} needs public data and this dataset has none; "
            f"allowed: {', '.join(datasets_with_public())}"
        )
    if cfg.dataset.kind not in facts.kinds:
        allowed = [d for d in group_options("dataset") if load_group("dataset", d).kind in facts.kinds]
        raise ConfigError(
            f"dataset={cfg.dataset.name}: method {cfg.method.name} supports {'/'.join(facts.kinds)} data "
            f"only; allowed: {', '.join(allowed)}"
        )


def _values(override: Any) -> list[Any]:
    """All values an override takes (one, or each of a sweep)."""
    if override.is_sweep_override():
        if override.is_discrete_sweep():
            return list(override.sweep_iterator())
        # an interval (a search space: hydra/sweeper=optuna draws from it): both ends are checked; a rule that
        # holds at both ends of a range holds inside it for every rule the schemas declare (bounds, not gaps)
        sweep = override.value()
        return [sweep.start, sweep.end]
    return [override.value()]


def preflight(argv: Sequence[str], conf_dir: Path = CONF_DIR) -> None:
    """Check the command line before Hydra starts any job (so a sweep fails before its first run).

    The sweep is the command line's swept values plus, with ``-m``, those of ``hydra.sweeper.params`` (set by
    experiment files) that the command line does not override. Every combination of the swept values (``eps`` and
    ``seed`` aside, checked value by value) is composed and checked (:func:`check_composed`), so a bad value fails
    before the first job.

    Raises:
        ConfigError: the first mistake found, as one line.
    """
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.errors import HydraException

    args = _override_args(argv)
    multirun = any(a in ("-m", "--multirun") for a in argv)
    combos: dict[str, list[Any]] = {}
    # user config directories (hydra.searchpath): their options are allowed, and every compose below sees them
    searchpath = [a for a in args if a.split("=", 1)[0].lstrip("+~") == "hydra.searchpath"]

    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(conf_dir), version_base="1.3"):
            fixed = searchpath + _check_overrides(args, combos, conf_dir, searchpath)
            if multirun:
                # the groups the command line chose (their first value) must be in the base too: its method.* keys
                # belong to the method it names, not to the default one
                chosen = [f"{k}={v[0]}" for k, v in combos.items() if not _plain_key(k) and v]
                try:
                    base = compose(config_name="train", overrides=fixed + chosen, return_hydra_config=True)
                except HydraException as e:
                    raise ConfigError(hydra_error_line(e)) from None
                params = base.hydra.sweeper.get("params") or {}
                swept = [f"{k}={v}" for k, v in params.items() if str(k) not in combos and not _overridden(k, fixed)]
                fixed = fixed + _check_overrides(swept, combos, conf_dir, searchpath)
            # swept groups (method, dataset, ...) are composed per combination; swept plain keys are then set on
            # a copy of each composed config (typed: a wrong type fails as in a compose), which is much faster
            groups = [k for k in combos if not _plain_key(k)]
            plain = [k for k in combos if _plain_key(k)]
            for choice in itertools.product(*(combos[k] for k in groups)):
                extra = [f"{k}={v}" for k, v in zip(groups, choice)]
                try:
                    composed = compose(config_name="train", overrides=fixed + extra)
                except HydraException as e:
                    raise ConfigError(hydra_error_line(e)) from None
                for values in itertools.product(*(combos[k] for k in plain)):
                    cfg = composed.copy() if plain else composed
                    for key, value in zip(plain, values):
                        try:
                            OmegaConf.update(cfg, key, value, merge=False)
                        except Exception as e:  # noqa: BLE001  (OmegaConf's type and key errors)
                            raise ConfigError(hydra_error_line(e)) from None
                    check_composed(cfg)
    finally:
        GlobalHydra.instance().clear()


def _plain_key(name: str) -> bool:
    """A swept key that is set on a composed config (``method.teachers``, ``f0``), not a config group choice."""
    return name not in GROUPS and not name.startswith(("+", "~", "hydra")) and "/" not in name and "@" not in name


def _overridden(key: str, overrides: Sequence[str]) -> bool:
    return any(o.split("=", 1)[0].lstrip("+~") == str(key) for o in overrides)


# swept keys checked value by value here, not composed once per value (they enter no cross-field rule)
_VALUE_BY_VALUE = ("eps", "seed", "skip_existing", "experiment_name", "profile")


def _check_overrides(args: list[str], combos: dict[str, list[Any]], conf_dir: Path,
                     searchpath: Sequence[str] = ()) -> list[str]:
    """Check override strings value by value; record swept method/dataset and other swept keys in ``combos``
    (composed and validated for every combination); return the others (a sweep of eps or seed replaced by its first
    value) for composition. With ``searchpath`` (the command line's ``hydra.searchpath`` overrides; Hydra
    initialized), a group's options are those Hydra finds there too."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    try:
        overrides = OverridesParser.create().parse_overrides(args)
    except HydraException as e:  # a malformed override
        raise ConfigError(hydra_error_line(e)) from None
    fixed: list[str] = []
    for o, text in zip(overrides, args):
        key = o.key_or_group
        if key.startswith("hydra") or (o.package is not None and o.package.startswith("hydra")):
            continue
        values = _values(o)
        if key in GROUPS:
            allowed = group_options(key, conf_dir)
            if key == "method":  # and the plugins' (dpsyn.plugins), registered without a yaml
                allowed = sorted(set(allowed) | set(method_names()))
            if searchpath:
                from hydra.core.global_hydra import GlobalHydra

                found = GlobalHydra.instance().config_loader().get_group_options(key, config_name="train",
                                                                                  overrides=list(searchpath))
                allowed = sorted(set(allowed) | {o for o in found if not o.startswith("_")})
            for v in values:
                if v is not None and str(v) not in allowed:
                    raise ConfigError(f"{key}={v}: unknown {key}; allowed: {', '.join(allowed)}")
        if key == "eps":
            for v in values:
                check_eps(v)
        if key == "privacy.delta":
            for v in values:
                check_delta(v)
        if key in ("method", "dataset"):
            combos[key] = values
        elif o.is_sweep_override() and key not in _VALUE_BY_VALUE:  # every swept value is composed and validated
            combos[text.split("=", 1)[0]] = values
        elif o.is_sweep_override():
            fixed.append(f"{text.split('=', 1)[0]}={values[0]}")
        else:
            fixed.append(text)
    return fixed


# Hydra flags that take the next argument as their value (``--cfg job``, ``-cn other``)
_VALUE_FLAGS = {"--cfg", "-c", "--package", "-p", "--config-path", "-cp", "--config-name", "-cn", "--config-dir",
                "-cd", "--experimental-rerun", "--info", "-i"}


def _override_args(argv: Sequence[str]) -> list[str]:
    """The overrides of a Hydra command line, without its flags and their values."""
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
            # --info / -i take an optional value; an override always contains "="
            if "=" not in a:
                continue
        if a.startswith("-"):
            skip = a in _VALUE_FLAGS
            continue
        out.append(a)
    return out
