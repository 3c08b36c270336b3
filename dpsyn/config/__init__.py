"""Typed configs: the schemas of every config group in Hydra's ConfigStore, one validator of their ranges and rules,
resume fingerprints from the typed method config, and the PATE noise resolved from ratios to the teacher count.

Importing this package registers the schemas (``schema/<group>/<name>``), which the yaml files under ``conf/``
extend through their defaults lists; ``dpsyn/__init__.py`` imports it, so any ``import dpsyn...`` does. Neither torch
nor a method module is imported here: the preflight runs on this package alone.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
import typing
from typing import Any

from dpsyn.config.schema import (
    ACCOUNTANTS,
    METHOD_SCHEMAS,
    PATE_NOISE_KEYS,  # noqa: F401  (re-exported)
    SCHEMAS,
    ConfigError,
    MethodSchema,
    SchemaError,
    resolve_pate_noise,
)

__all__ = ["ACCOUNTANTS", "METHOD_SCHEMAS", "SCHEMAS", "ConfigError", "MethodFacts", "SchemaError", "add_method_schema",
           "eps_at_least", "fingerprint", "hydra_error_line", "load_group", "method_facts", "method_names", "register",
           "resolve_pate_noise", "schema_of", "validate"]

VALIDATED_GROUPS = ("method", "dataset", "privacy", "trainer", "metrics", "public")


def register() -> None:
    """Put every schema in Hydra's ConfigStore as ``schema/<group>/<name>`` (idempotent)."""
    from hydra.core.config_store import ConfigStore

    cs = ConfigStore.instance()
    for group, schemas in SCHEMAS.items():
        for name, schema in schemas.items():
            cs.store(group=f"schema/{group}", name=name, node=schema)


def add_method_schema(name: str, schema: type) -> None:
    """Register a method's schema from outside dpsyn (:func:`dpsyn.methods.register_method`): in :data:`SCHEMAS`,
    and in Hydra's ConfigStore as ``schema/method/<name>`` (for a yaml to extend) and as the option
    ``method=<name>`` itself (its defaults: the method's).

    Raises:
        ValueError: ``name`` has a schema already, the schema is no :class:`MethodSchema` dataclass, or its ``name``
            default is not ``name``.
    """
    from hydra.core.config_store import ConfigStore

    if not (dataclasses.is_dataclass(schema) and issubclass(schema, MethodSchema)):
        raise ValueError(f"method {name!r}: its schema must be a dataclass subclassing dpsyn.config.schema.MethodSchema")
    default = next((f.default for f in dataclasses.fields(schema) if f.name == "name"), None)
    if default != name:
        raise ValueError(f"method {name!r}: its schema's name field defaults to {default!r}; set name: str = {name!r}")
    if SCHEMAS["method"].get(name, schema) is not schema:
        raise ValueError(f"method {name!r} has a schema already")
    SCHEMAS["method"][name] = METHOD_SCHEMAS[name] = schema
    cs = ConfigStore.instance()
    cs.store(group="schema/method", name=name, node=schema)
    cs.store(group="method", name=name, node=schema)


@dataclasses.dataclass(frozen=True)
class MethodFacts:
    """What the preflight must know about a method before importing it: the dataset kinds it supports and whether
    it needs public data (:class:`dpsyn.methods.base.Method`'s ``kinds`` and ``needs_public``)."""

    kinds: tuple = ("image", "table")
    needs_public: bool = False


def method_facts(name: str) -> MethodFacts | None:
    """The facts of method ``name``: dpsyn's own from :mod:`dpsyn.config.catalog` (no method module is imported), a
    plugin's from its class (:func:`dpsyn.plugins.load_plugins` imports the plugins, if any); None for an unknown
    name."""
    from dpsyn.config.catalog import METHODS

    if name in METHODS:
        return MethodFacts(**METHODS[name])
    from dpsyn.plugins import load_plugins

    cls = load_plugins().get(name)
    return None if cls is None else MethodFacts(tuple(cls.kinds), bool(cls.needs_public))


def method_names() -> list[str]:
    """Every method name the preflight accepts: dpsyn's own and the plugins'."""
    from dpsyn.config.catalog import METHODS
    from dpsyn.plugins import load_plugins

    return sorted({*METHODS, *load_plugins()})


def eps_at_least(eps: Any, at_least: Any, then: Any, otherwise: Any) -> Any:
    """The resolver ``${eps_at_least:${eps},10,a,b}``: ``a`` where the run's eps is at least 10, else ``b``.

    For settings a paper gives per budget (G-PATE's MNIST runs: 2000 teachers, sigma1 600, sigma2 100, T 1000 at
    eps=10; 4000, 3000, 1000, 2000 at eps=1); the composed config then holds the value used. ``eps=inf`` counts as
    at least anything."""
    return then if float(eps) >= float(at_least) else otherwise


def register_resolvers() -> None:
    """OmegaConf resolvers of dpsyn's yaml files (idempotent)."""
    from omegaconf import OmegaConf

    if not OmegaConf.has_resolver("eps_at_least"):
        OmegaConf.register_new_resolver("eps_at_least", eps_at_least)


def load_group(group: str, name: str, conf_dir: Any = None) -> Any:
    """``conf/<group>/<name>.yaml`` on its own, as composition would type it: the file's values over its schema
    (``/schema/<group>/<schema>@_here_`` in its defaults list: the schema's types and defaults), without the defaults
    list itself. For code that needs one group's node outside a composed run (a dataset family's evaluation data,
    the public models' training data).

    Raises:
        FileNotFoundError: no such file.
    """
    from pathlib import Path

    from omegaconf import OmegaConf

    from dpsyn.paths import CONF_DIR

    path = Path(conf_dir or CONF_DIR) / group / f"{name}.yaml"
    raw = OmegaConf.load(path)
    entries = raw.pop("defaults", None) or []
    base = None
    for entry in entries:
        m = re.fullmatch(rf"/schema/{group}/(\w+)@_here_", str(entry))
        if m is not None:
            base = OmegaConf.structured(SCHEMAS[group][m.group(1)])
    return raw if base is None else OmegaConf.merge(base, raw)


# ---- the validator ----------------------------------------------------------------------------------------------


def schema_of(node: Any, group: str) -> type | None:
    """The schema class of a composed ``node`` of ``group``: the dataclass it was typed with, else (a node built by
    hand) the method schema named by ``node.name`` or the group's only schema."""
    from omegaconf import DictConfig, OmegaConf

    if isinstance(node, DictConfig):
        t = OmegaConf.get_type(node)
        if t is not None and dataclasses.is_dataclass(t):
            return t
    if group == "method":
        return METHOD_SCHEMAS.get(str(node.get("name"))) if node is not None else None
    options = SCHEMAS.get(group, {})
    return next(iter(options.values())) if len(options) == 1 else None


def _fmt(value: Any) -> str:
    from omegaconf import DictConfig, ListConfig, OmegaConf

    if isinstance(value, (DictConfig, ListConfig)):
        value = OmegaConf.to_container(value, resolve=True)
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    return str(value)


def _range_text(rules: dict[str, Any], integer: bool) -> str | None:
    lo = ("ge", rules["ge"]) if "ge" in rules else ("gt", rules["gt"]) if "gt" in rules else None
    hi = ("le", rules["le"]) if "le" in rules else ("lt", rules["lt"]) if "lt" in rules else None
    if lo is None and hi is None:
        return None
    what = "an integer" if integer else "a number"
    if lo is not None and hi is not None:
        return f"must lie in {'[' if lo[0] == 'ge' else '('}{lo[1]:g}, {hi[1]:g}{']' if hi[0] == 'le' else ')'}"
    op, bound = lo or hi
    return f"must be {what} {dict(ge='>=', gt='>', le='<=', lt='<')[op]} {bound:g}"


def _in_range(value: Any, rules: dict[str, Any]) -> bool:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
        return False
    return (("ge" not in rules or value >= rules["ge"]) and ("gt" not in rules or value > rules["gt"])
            and ("le" not in rules or value <= rules["le"]) and ("lt" not in rules or value < rules["lt"]))


def _check_value(key: str, value: Any, rules: dict[str, Any], hint: Any) -> None:
    integer = int in _base_types(hint)
    if "choices" in rules and value not in rules["choices"]:
        raise ConfigError(f"{key}={_fmt(value)}: allowed: {', '.join(_fmt(c) for c in rules['choices'])}")
    text = _range_text(rules, integer)
    if text is not None and not _in_range(value, rules):
        raise ConfigError(f"{key}={_fmt(value)}: {text}")


def _base_types(hint: Any) -> tuple:
    """``Optional[int]`` -> (int, NoneType); ``List[int]`` -> (list,); ``int`` -> (int,)."""
    origin = typing.get_origin(hint)
    if origin is typing.Union:
        return typing.get_args(hint)
    return (origin or hint,)


def _item_hint(hint: Any) -> Any:
    """``List[int]`` or ``Optional[List[int]]`` -> int."""
    candidates = typing.get_args(hint) if typing.get_origin(hint) is typing.Union else (hint,)
    for h in candidates:
        if typing.get_origin(h) is list:
            args = typing.get_args(h)
            return args[0] if args else Any
    return Any


def _walk(node: Any, schema: type, prefix: str, root: Any = None) -> None:
    from omegaconf import DictConfig, ListConfig

    hints = typing.get_type_hints(schema)
    for fld in dataclasses.fields(schema):
        key = f"{prefix}.{fld.name}"
        if fld.name not in node:
            continue
        value = node[fld.name]
        hint = hints.get(fld.name, Any)
        sub = [t for t in _base_types(hint) if dataclasses.is_dataclass(t)]
        if sub and isinstance(value, DictConfig):
            _walk(value, sub[0], key, root)
            continue
        rules = {k: v for k, v in fld.metadata.items() if k != "help"}
        if value is None or not rules:
            continue
        if isinstance(value, ListConfig) or isinstance(value, list):
            items = list(value)
            if rules.get("nonempty") and not items:
                raise ConfigError(f"{key}=[]: must not be empty")
            item_rules = rules.get("items") or {}
            for item in items:
                try:
                    _check_value(key, item, item_rules, _item_hint(hint))
                except ConfigError:
                    what = _range_text(item_rules, int in _base_types(_item_hint(hint))) or "is not allowed"
                    raise ConfigError(f"{key}={_fmt(value)}: each item {what}") from None
            continue
        _check_value(key, value, rules, hint)
    if not hasattr(schema, "check"):  # a nested block (budget_split, attack, ...): ranges only
        return
    try:
        schema().check(node, root)
    except SchemaError as e:
        raise ConfigError(f"{prefix}.{e.key}={_fmt(e.value)}: {e.allowed}") from None


def validate(cfg: Any, groups: tuple[str, ...] = VALIDATED_GROUPS) -> None:
    """Check every typed node of a composed ``cfg`` against its schema's ranges and cross-field rules.

    Raises:
        ConfigError: the first bad value, as one line ``<key>=<value>: <what is allowed>``.
    """
    for group in groups:
        node = cfg.get(group) if hasattr(cfg, "get") else None
        if node is None:
            continue
        schema = schema_of(node, group)
        if schema is not None:
            _walk(node, schema, group, cfg)


# ---- fingerprints and PATE noise ------------------------------------------------------------------------------


def fingerprint(node: Any, group: str = "method") -> dict[str, Any]:
    """Every field of ``node``'s schema, resolved, as plain JSON data (sorted keys): what a resumed state must share
    with the run resuming it. A field the yaml does not set counts with the schema's default, so a new
    hyperparameter cannot be missed."""
    from omegaconf import DictConfig, OmegaConf

    schema = schema_of(node, group)
    if schema is not None and isinstance(node, DictConfig) and OmegaConf.get_type(node) is not schema:
        node = OmegaConf.merge(OmegaConf.structured(schema), node)
    data = OmegaConf.to_container(node, resolve=True) if isinstance(node, DictConfig) else dict(node)
    return json.loads(json.dumps(data, sort_keys=True, default=str))


# ---- Hydra's own errors in the same one-line form ----------------------------------------------------------------

_TYPE_WORDS = {"Integer": "must be an integer", "Float": "must be a number", "Boolean": "must be true or false",
               "String": "must be a string"}


def hydra_error_line(err: BaseException) -> str:
    """One line ``<key>=<value>: <what is allowed>`` for a Hydra/OmegaConf composition error (a wrong type for a
    typed key, an unknown key), else the error's first lines joined."""
    from omegaconf.errors import ConfigKeyError, OmegaConfBaseException, ValidationError

    chain, e = [], err
    while e is not None and e not in chain:
        chain.append(e)
        e = e.__cause__ or e.__context__
    for e in chain:
        if not isinstance(e, OmegaConfBaseException) or not getattr(e, "full_key", None):
            continue
        key = str(e.full_key)
        msg = str(getattr(e, "msg", "") or "").splitlines()[0] if getattr(e, "msg", None) else ""
        if isinstance(e, ValidationError):
            m = re.search(r"Value '(.*)' of type '\w+' could not be converted to (\w+)", msg)
            if m:
                return f"{key}={m.group(1)}: {_TYPE_WORDS.get(m.group(2), 'must be of type ' + m.group(2))}"
            m = re.search(r"Value '(.*)' is not a valid (\w+)", msg)
            if m:
                what = "must be true or false" if m.group(2) == "bool" else f"must be a valid {m.group(2)}"
                return f"{key}={m.group(1)}: {what}"
            m = re.search(r"Non optional field cannot be assigned None|is not Optional", msg)
            if m:
                return f"{key}=null: must not be null"
            return f"{key}: {msg}"
        if isinstance(e, ConfigKeyError) or "not in struct" in msg or "is not in" in msg:
            allowed = _allowed_keys(key)
            return f"{key}: unknown key" + (f"; allowed: {', '.join(allowed)}" if allowed else "")
    m = re.search(r"Could not override '([^']+)'\.\s+To append to your config use \+\1=(\S*)", str(err))
    if m:  # an unknown key in a typed (struct) node
        allowed = _allowed_keys(m.group(1))
        return (f"{m.group(1)}={m.group(2)}: unknown key"
                + (f"; allowed: {', '.join(allowed)}" if allowed else "; `python train.py --cfg job` lists the keys"))
    lines = [ln.strip() for ln in str(err).splitlines() if ln.strip()]
    return " ".join(lines[:2]) if lines else type(err).__name__


def _allowed_keys(full_key: str) -> list[str]:
    """The fields next to an unknown ``full_key`` (``method.teacherz`` -> g_pate's fields), where known."""
    parts = full_key.split(".")
    if len(parts) < 2 or parts[0] not in SCHEMAS:
        return []
    options = SCHEMAS[parts[0]]
    if len(options) != 1:
        return []
    schema = next(iter(options.values()))
    for part in parts[1:-1]:
        hints = typing.get_type_hints(schema)
        sub = [t for t in _base_types(hints.get(part, Any)) if dataclasses.is_dataclass(t)]
        if not sub:
            return []
        schema = sub[0]
    return [fl.name for fl in dataclasses.fields(schema)]


register()
register_resolvers()
