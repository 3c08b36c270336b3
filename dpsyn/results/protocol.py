"""Evaluation protocol identifiers: what measured a result's numbers, as one short readable string.

``metrics.protocol`` names how downstream accuracy is measured (absent: ``dpsyn``), but the name alone does not
identify a number: the classifier, its ensemble, its epochs and how many synthetic images it trains on move ``acc``
as much as a method does. :func:`protocol_id` writes all of them from the composed config, for instance
``dpsyn:small_cnn,x1,5ep,constant,n9000`` (small CNN, one member, 5 epochs at a constant learning rate, 9000 of 10000 synthetic images trained on, the
rest held out for the selection). Every result.json carries it (``protocol``, and the name alone as
``protocol_name``), every row of ``experiments/*/results.csv`` too, and claims and tables never put two ids in one
comparison or one cell (:mod:`dpsyn.results.claims`, :mod:`dpsyn.results.tables`).

The id is the run's, on every metric of it: ``n_samples`` also sizes the FD's sample and a protocol that holds out
private rows (``dpimagebench``) changes what the method trains on, so no metric of a run is comparable across ids
without looking. A claim across ids is refused rather than judged; rerun one side.

:func:`backfill` labels the rows kept before ids existed, composing each run's config (see its docstring for the
defaults it assumes). No torch import here.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterable
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

DEFAULT_PROTOCOL = "dpsyn"

# What the dpsyn protocol used before its default classifier changed: every row of experiments/*/results.csv written
# without a protocol was scored with these, where its experiment, profile or overrides did not set another value.
LEGACY_DPSYN = {"classifier.name": "small_cnn", "classifier.ensemble": 1, "classifier.epochs": 5,
                "classifier.schedule": "constant", "classifier.val_fraction": 0.1, "n_samples": 10000}

# classifier fields written into the id always (val_fraction through the training count); any other field appears as
# key=value only where it departs from its schema default, so a plain id stays short
_ID_FIELDS = ("name", "ensemble", "epochs", "schedule", "val_fraction")


def protocol_name(metrics: Any) -> str:
    """``metrics.protocol`` (absent or empty: ``dpsyn``)."""
    value = metrics.get("protocol") if hasattr(metrics, "get") else None
    return str(value or DEFAULT_PROTOCOL)


def dpsyn_train_count(n_samples: int, val_fraction: float) -> int:
    """Synthetic images the dpsyn protocol's classifier trains on: ``n_samples`` less the held-out part (the split
    of :func:`dpsyn.metrics.utility.downstream_accuracy`: ``max(1, round(n * val_fraction))`` held out)."""
    return int(n_samples) - max(1, int(round(int(n_samples) * float(val_fraction))))


def _num(v: Any) -> str:
    return f"{v:g}" if isinstance(v, float) else str(v)


def _departures(node: Any, schema: type, skip: Iterable[str]) -> list[str]:
    """``key=value`` for each field of ``schema`` whose value in ``node`` is not the schema's default."""
    out = []
    for fld in dataclasses.fields(schema):
        if fld.name in skip or fld.name not in node:
            continue
        default = fld.default if fld.default is not dataclasses.MISSING else (
            fld.default_factory() if fld.default_factory is not dataclasses.MISSING else None)
        value = node[fld.name]
        if value != default:
            out.append(f"{fld.name}={_num(value)}")
    return out


def protocol_id(cfg: Any) -> str:
    """The evaluation protocol of a composed run config, as ``<name>:<what decides its numbers>``.

    - ``dpsyn`` on images: classifier, ensemble size, epochs, learning-rate schedule, training-image count (``n_samples`` less the
      held-out part), then any other classifier setting off its default: ``dpsyn:small_cnn,x1,5ep,constant,n9000``;
    - ``dpimagebench`` on images: the classifiers, epochs, training-image count, the selection and the real rows it
      holds out: ``dpimagebench:resnet_110+wrn_40_4+resnext_29,50ep,n10000,real_val5000``;
    - tables (AUROC): the scikit-learn classifiers and the synthetic rows they train on (all of them):
      ``dpsyn:tabular[logreg+random_forest+gradient_boosting+mlp],n10000``.

    A tuning run (``metrics.split=validation``) scores on private rows, not the test split: ``,on-validation``.

    Args:
        cfg: the composed config (``metrics`` and ``dataset.kind`` are read).

    Returns:
        the id, e.g. ``dpsyn:small_cnn,x1,5ep,constant,n9000``.
    """
    from dpsyn.config.schema import ClassifierSchema

    m = cfg.metrics
    name = protocol_name(m)
    n = int(m.n_samples)
    kind = str(cfg.dataset.get("kind") or "image") if cfg.get("dataset") is not None else "image"
    if kind == "table":
        parts = [f"tabular[{'+'.join(str(c) for c in m.tabular.classifiers)}]", f"n{n}"]
    elif name == "dpimagebench":
        d = m.dpimagebench
        selection = str(d.selection)
        if selection == "noisy_max":
            selection += f"@eps{_num(float(d.selection_eps))}"
        parts = ["+".join(str(c) for c in d.classifiers), f"{int(d.epochs)}ep", f"n{min(int(d.n_train), n)}",
                 f"{selection}{int(d.validation_rows)}"]
        if int(d.get("width_divisor", 1)) != 1:
            parts.append(f"width/{int(d.width_divisor)}")
    else:
        c = m.classifier
        parts = [str(c.name), f"x{int(c.ensemble)}", f"{int(c.epochs)}ep", str(c.get("schedule") or "constant"),
                 f"n{dpsyn_train_count(n, float(c.val_fraction))}", *_departures(c, ClassifierSchema, _ID_FIELDS)]
    if m.get("split") == "validation":
        parts.append("on-validation")
    return f"{name}:{','.join(parts)}"


def protocol_record(cfg: Any) -> dict[str, str]:
    """What every result.json says of its evaluation protocol: ``protocol`` (:func:`protocol_id`) and
    ``protocol_name`` (``metrics.protocol``)."""
    return {"protocol": protocol_id(cfg), "protocol_name": protocol_name(cfg.metrics)}


def _legacy(cfg: Any, defaults: Any) -> Any:
    """``cfg`` with each setting of :data:`LEGACY_DPSYN` that is at today's default put back at the legacy one."""
    from omegaconf import OmegaConf

    out = OmegaConf.create({"metrics": OmegaConf.to_container(cfg.metrics, resolve=True),
                            "dataset": {"kind": str(cfg.dataset.kind)}})
    for key, old in LEGACY_DPSYN.items():
        if OmegaConf.select(out.metrics, key) == OmegaConf.select(defaults, key):
            OmegaConf.update(out.metrics, key, old)
    return out


def backfill(experiments_dir: Path, conf_dir: Path | None = None) -> dict[Path, dict[str, int]]:
    """Give every row of ``experiments_dir/*/results.csv`` without a protocol the protocol its run was scored by.

    Each run's config is composed as its cell (``experiment=<experiment>[_<profile>]``, its method, dataset, eps,
    seed and kept overrides; a single run of the ``single`` profile as the plain ``python train.py`` it was), then
    every :data:`LEGACY_DPSYN` setting that sits at today's default is set to the legacy value: such rows were written before protocol ids, when those were the defaults (a setting its experiment
    or overrides chose stays). Rows that have a protocol are left alone, so running it again changes nothing.

    Returns:
        {file: {protocol id: rows given it}} for each file changed.
    """
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from dpsyn.config import load_group
    from dpsyn.paths import CONF_DIR
    from dpsyn.results.export import RESULTS_FILE, SINGLE_PROFILE, read_rows, write_rows

    defaults = load_group("metrics", "default", conf_dir)
    done: dict[Path, dict[str, int]] = {}
    ids: dict[tuple[str, ...], str] = {}
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(conf_dir or CONF_DIR), version_base="1.3"):
            for path in sorted(Path(experiments_dir).glob(f"*/{RESULTS_FILE}")):
                rows = read_rows(path)
                counts: dict[str, int] = {}
                for row in rows:
                    if row.get("protocol"):
                        continue
                    if row["profile"] == SINGLE_PROFILE:  # a plain `python train.py ...`: no experiment config
                        exp = []
                    else:
                        exp = [f"experiment={row['experiment']}" if row["profile"] == "embedded"
                               else f"experiment={row['experiment']}_{row['profile']}"]
                    overrides = [*exp, *(f"{k}={row[k]}" for k in ("method", "dataset", "eps", "seed")),
                                 *row["overrides"].split()]
                    key = tuple(overrides)
                    if key not in ids:
                        ids[key] = protocol_id(_legacy(compose("train", overrides=overrides), defaults))
                    row["protocol"] = ids[key]
                    counts[ids[key]] = counts.get(ids[key], 0) + 1
                if counts:
                    write_rows(path, rows)
                    done[path] = counts
                    log.info("%s: %s", path, ", ".join(f"{n} rows {p}" for p, n in sorted(counts.items())))
    finally:
        GlobalHydra.instance().clear()
    return done
