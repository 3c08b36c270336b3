"""Results kept in the repo: finished runs' measured metrics as long rows in ``experiments/<paper>/results.csv``.

``outputs/`` does not survive a new machine; these files do. One row per (run, metric): the run's coordinates
(experiment, profile, method, dataset, eps, seed), a hash of the overrides that are not coordinates (so that variant
runs, ``method.conditional=true`` or ``f0=0.05``, never collide with the plain cell), the run's evaluation protocol
(:func:`dpsyn.results.protocol.protocol_id`: claims and tables never mix two), the metric and its value, what
was spent under which accountant (with the PATE bound and the sampling scheme), the code's git sha, the date the run
finished and its wall time. No samples. ``fields`` keeps, as JSON, the result fields the table specs group by
(``sample_provenance.variant``, ``sample_provenance.owners``...), so that every table can be rebuilt from these rows
alone (:func:`load_records` gives back result-like records that :mod:`dpsyn.results.tables` reads as it reads
``result.json``).

Exporting again replaces a run's rows (same experiment, profile, method, dataset, eps, seed, overrides hash and run
name) and keeps every other row: new runs append, a re-run cell replaces its row.

Single runs (``python train.py ...`` outside a sweep) are kept two ways (``python -m dpsyn.cli.tables export RUN_DIR
... --as EXPERIMENT:PROFILE``): as the cells of an experiment's profile they reproduce (:func:`label_as_cells`: the
run's config is checked against the cell's; ``run`` stays empty, so a re-run of the cell replaces it), or, with the
profile :data:`SINGLE_PROFILE`, as themselves (:func:`label_as_single`: variants, tuning runs on the validation
split, runs at the defaults of an older commit). Those carry their run directory's name in the ``run`` column, which
keys them: two single runs with the same overrides (the same command at two commits, a local edit of the code that
no override says) stay two runs. No table, claim or generated doc block reads the single profile: tables and docs
read ``embedded``, ``quick``, ``paper`` and ``dib``, claims ``embedded`` and ``quick`` unless they list others.
No torch import here.
"""

from __future__ import annotations

import csv
import datetime as dt
import hashlib
import io
import json
import math
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from dpsyn.results.io import atomic_write_text

RESULTS_FILE = "results.csv"
COLUMNS = ("experiment", "profile", "method", "dataset", "eps", "seed", "overrides_hash", "overrides", "protocol",
           "metric", "value", "epsilon_spent", "accountant", "git_sha", "date", "run_s", "fields", "run")
# columns added after files were written: read with them empty (protocol: before protocol ids, filled by
# dpsyn.results.protocol.backfill; run: before single runs were kept, every row a cell)
_ADDED_COLUMNS = ("protocol", "run")
RUN_KEY = ("experiment", "profile", "method", "dataset", "eps", "seed", "overrides_hash", "run")
# the profile of single runs kept as themselves (label_as_single), not as an experiment's cells: no table, claim or
# generated doc block reads it
SINGLE_PROFILE = "single"
# Overrides that are coordinates (own columns) or that do not change what a run computes (where it writes, how it
# logs, whether a finished cell is skipped): left out of the hash.
# (``method.lr=...`` is a variant: only the group choice ``method=...`` is a coordinate.)
_NOT_HASHED = ("experiment", "method", "dataset", "eps", "seed", "skip_existing", "trainer.progress_bar")
_NOT_HASHED_TREES = ("logger", "paths", "hydra", "wandb")


def kept_overrides(overrides: Iterable[str]) -> list[str]:
    """The overrides that make a run a variant of its cell (sorted): everything but coordinates and plumbing."""
    out = []
    for o in overrides:
        key = o.split("=", 1)[0].lstrip("+~")
        if key in _NOT_HASHED or any(key == k or key.startswith((k + ".", k + "/")) for k in _NOT_HASHED_TREES):
            continue
        out.append(o)
    return sorted(out)


def overrides_hash(overrides: Iterable[str]) -> str:
    """12 hex digits of sha256 over the kept overrides; ``"base"`` when there are none (the plain cell)."""
    kept = kept_overrides(overrides)
    return hashlib.sha256("\n".join(kept).encode()).hexdigest()[:12] if kept else "base"


def experiment_papers(spec_paths: Iterable[Path]) -> dict[str, str]:
    """{experiment: its ``experiments/<paper>`` folder} for every experiment a table spec or a claim names.

    A table spec's folder wins: a claim may compare with another paper's cells (PE against paper 000's DP-MEPF),
    which stay with that paper."""
    from omegaconf import OmegaConf

    from_specs: dict[str, str] = {}
    from_claims: dict[str, str] = {}
    for p in spec_paths:
        raw = OmegaConf.to_container(OmegaConf.load(p), resolve=False)
        if raw.get("experiment"):
            from_specs.setdefault(str(raw["experiment"]), p.parent.name)
        for c in raw.get("claims") or []:
            for side in (c.get("a") or {}, c.get("b") or {}):
                if side.get("experiment"):
                    from_claims.setdefault(str(side["experiment"]), p.parent.name)
    return {**from_claims, **from_specs}


def referenced_fields(spec_paths: Iterable[Path]) -> list[str]:
    """Result fields the table specs group or select by that are not columns of results.csv (kept in ``fields``)."""
    from omegaconf import OmegaConf

    names: set[str] = set()
    for p in spec_paths:
        raw = OmegaConf.to_container(OmegaConf.load(p), resolve=True)
        if "rows" not in raw:  # claims.yaml and other non-table files
            continue
        names.update([raw["rows"], raw["columns"], *(raw.get("select") or {})])
        for fig in raw.get("figures") or []:
            names.update(str(fig[k]) for k in ("x", "y", "by") if fig.get(k))
            names.update(fig.get("select") or {})
    return sorted(n for n in names if n not in COLUMNS)


def _num(v: Any) -> str:
    if v is None:
        return ""
    if isinstance(v, float) and math.isinf(v):
        return "inf" if v > 0 else "-inf"
    return repr(float(v)) if isinstance(v, float) else str(v)


def rows_of(rec: dict[str, Any], fields: Iterable[str] = ()) -> list[dict[str, str]]:
    """The rows of one finished run (``result.json`` as a dict): one per numeric metric."""
    from dpsyn.results.tables import _field

    overrides = list(rec.get("overrides") or [])
    run_dir = rec.get("run_dir")
    date = ""
    if run_dir and (Path(run_dir) / "result.json").is_file():
        mtime = (Path(run_dir) / "result.json").stat().st_mtime
        date = dt.datetime.fromtimestamp(mtime, dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    extra = {}
    for name in fields:
        v = _field(rec, name)
        if v is not None:
            extra[name] = v
    run_s = (rec.get("timings") or {}).get("total_s")
    base = {
        "experiment": str(rec.get("experiment") or ""),
        "profile": str(rec.get("profile") or ""),
        "method": str(rec.get("method", "")),
        "dataset": str(rec.get("dataset", "")),
        "eps": _num(rec.get("eps")),
        "seed": str(rec.get("seed", "")),
        "overrides_hash": overrides_hash(overrides),
        "overrides": " ".join(kept_overrides(overrides)),
        "protocol": str(rec.get("protocol") or ""),
        "epsilon_spent": _num(rec.get("epsilon_spent")),
        "accountant": str(rec.get("accountant") or ""),
        "git_sha": str(rec.get("git_sha") or ""),
        "date": date,
        "run_s": "" if run_s is None else _num(round(float(run_s), 1)),
        "fields": json.dumps(extra, sort_keys=True) if extra else "",
        "run": str(rec.get("run") or ""),
    }
    out = []
    for metric, value in sorted((rec.get("metrics") or {}).items()):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
            continue
        out.append({**base, "metric": metric, "value": _num(float(value))})
    return out


def read_rows(path: Path) -> list[dict[str, str]]:
    if not path.is_file():
        return []
    with open(path, newline="") as f:
        rows = [{**dict.fromkeys(_ADDED_COLUMNS, ""), **r} for r in csv.DictReader(f)]
    missing = set(COLUMNS) - set(rows[0] if rows else COLUMNS) - set(_ADDED_COLUMNS)
    if missing:
        raise ValueError(f"{path}: not a dpsyn results file (missing columns: {', '.join(sorted(missing))})")
    return rows


def _sort_key(row: dict[str, str]) -> tuple:
    def f(v: str) -> tuple:
        try:
            return (0, float(v), "")
        except ValueError:
            return (1, 0.0, v)

    return tuple(f(row[k]) for k in (*RUN_KEY, "metric"))


def write_rows(path: Path, rows: list[dict[str, str]]) -> Path:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=COLUMNS, lineterminator="\n")
    w.writeheader()
    for r in sorted(rows, key=_sort_key):
        w.writerow({k: r.get(k, "") for k in COLUMNS})
    return atomic_write_text(path, buf.getvalue())


def merge(existing: list[dict[str, str]], new: list[dict[str, str]]) -> list[dict[str, str]]:
    """``existing`` with every run of ``new`` replaced (all its metric rows) or appended."""
    replaced = {tuple(r[k] for k in RUN_KEY) for r in new}
    return [r for r in existing if tuple(r[k] for k in RUN_KEY) not in replaced] + list(new)


def export(results: Iterable[dict[str, Any]], experiments_dir: Path) -> dict[Path, int]:
    """Write the runs' rows into ``experiments_dir/<paper>/results.csv``; returns {file: runs exported}."""
    papers = experiment_papers(sorted(experiments_dir.glob("*/*.yaml")))
    by_paper: dict[str, list[dict[str, Any]]] = {}
    for rec in results:
        # a single run, or a sweep no table or claim reads (a tuning sweep's trials): not kept
        paper = papers.get(str(rec.get("experiment")))
        if paper is not None:
            by_paper.setdefault(paper, []).append(rec)
    written = {}
    for paper, recs in sorted(by_paper.items()):
        fields = referenced_fields(sorted((experiments_dir / paper).glob("*.yaml")))
        new = [row for rec in recs for row in rows_of(rec, fields)]
        path = experiments_dir / paper / RESULTS_FILE
        write_rows(path, merge(read_rows(path), new))
        written[path] = len(recs)
    return written


def _value(v: str) -> Any:
    if v == "":
        return None
    try:
        return float(v)
    except ValueError:
        return v


def load_records(experiments_dir: Path) -> list[dict[str, Any]]:
    """Result-like records (one per run) from every ``experiments_dir/*/results.csv``: what the table builder and
    the claims read in place of ``result.json`` files."""
    records: dict[tuple, dict[str, Any]] = {}
    for path in sorted(experiments_dir.glob(f"*/{RESULTS_FILE}")):
        for row in read_rows(path):
            key = tuple(row[k] for k in RUN_KEY)
            rec = records.get(key)
            if rec is None:
                seed = _value(row["seed"])
                rec = records[key] = {
                    "experiment": row["experiment"], "profile": row["profile"], "method": row["method"],
                    "dataset": row["dataset"], "eps": _value(row["eps"]),
                    "seed": int(seed) if isinstance(seed, float) else seed,
                    "overrides": row["overrides"].split() if row["overrides"] else [],
                    "overrides_hash": row["overrides_hash"], "protocol": row["protocol"],
                    "epsilon_spent": _value(row["epsilon_spent"]),
                    "accountant": row["accountant"], "git_sha": row["git_sha"], "date": row["date"],
                    "timings": {"total_s": _value(row["run_s"])} if row["run_s"] else {},
                    "fields": json.loads(row["fields"]) if row["fields"] else {},
                    "run": row["run"], "metrics": {}, "source": str(path),
                }
            rec["metrics"][row["metric"]] = _value(row["value"])
    return list(records.values())


# The config sections a single run must share with an experiment's cell to be kept as that cell: everything that
# decides what the run computes. ``metrics.names`` may name more metrics than the cell (a score more changes no
# other: each metric seeds its own randomness, the classifier by seed_everything), never fewer; logger, paths and
# the run labels are plumbing.
CELL_SECTIONS = ("eps", "seed", "tuning", "method", "public", "dataset", "privacy", "trainer", "metrics")


def _cell_mismatch(run_cfg: dict[str, Any], cell_cfg: dict[str, Any]) -> list[str]:
    """The dotted keys where a run's config departs from its cell's (empty: the run is the cell)."""
    def walk(a: Any, b: Any, where: str) -> list[str]:
        if where == "metrics.names":
            if not isinstance(a, dict) or not isinstance(b, dict):
                return [] if a == b else [where]
            return [f"{where}.{k} (lacks {sorted(set(v) - set(a.get(k) or []))})" for k, v in b.items()
                    if not set(v or []) <= set(a.get(k) or [])]
        if isinstance(a, dict) and isinstance(b, dict):
            return [x for k in sorted(set(a) | set(b)) for x in walk(a.get(k), b.get(k), f"{where}.{k}" if where else k)]
        return [] if a == b else [where]

    return [x for s in CELL_SECTIONS for x in walk(run_cfg.get(s), cell_cfg.get(s), s)]


def label_as_cells(results: Iterable[dict[str, Any]], experiment: str, profile: str,
                   conf_dir: Path | None = None) -> list[dict[str, Any]]:
    """Single runs (``python train.py method=... dataset=... eps=... seed=...``, no ``experiment=``) labelled as the
    cells of ``experiment``'s ``profile`` they reproduce, so that tables and claims read them.

    Each run's saved ``config.yaml`` is compared with the config Hydra composes for that cell (the experiment, the
    run's method, dataset, eps and seed, and the run's own variant overrides): any difference in
    :data:`CELL_SECTIONS` refuses the run, naming the keys. Runs that already belong to an experiment are refused too.

    Raises:
        ValueError: a run without its config.yaml, already labelled, or different from the cell.
    """
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from omegaconf import OmegaConf

    from dpsyn.paths import CONF_DIR

    conf_dir = conf_dir or CONF_DIR
    exp_cfg = experiment if profile == "embedded" else f"{experiment}_{profile}"
    out = []
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(conf_dir), version_base="1.3"):
            for rec in results:
                run_dir = Path(str(rec.get("run_dir", "")))
                if rec.get("experiment"):
                    raise ValueError(f"{run_dir}: already a cell of {rec['experiment']} ({rec.get('profile')})")
                if not (run_dir / "config.yaml").is_file():
                    raise ValueError(f"{run_dir}: no config.yaml, so it cannot be checked against a cell")
                run_cfg = OmegaConf.to_container(OmegaConf.load(run_dir / "config.yaml"), resolve=False)
                own = [o for o in kept_overrides(rec.get("overrides") or []) if not o.startswith("metrics.names")]
                coords = [f"{k}={rec[k]}" for k in ("method", "dataset", "eps", "seed")]
                cell = compose("train", overrides=[f"experiment={exp_cfg}", *coords, *own])
                cell_cfg = {k: OmegaConf.to_container(cell[k], resolve=True) if OmegaConf.is_config(cell[k]) else cell[k]
                            for k in CELL_SECTIONS if k in cell}
                bad = _cell_mismatch(run_cfg, cell_cfg)
                if bad:
                    raise ValueError(f"{run_dir}: not the {exp_cfg} cell {' '.join(coords + own)}: differs in "
                                     + ", ".join(bad[:8]) + (f" and {len(bad) - 8} more" if len(bad) > 8 else ""))
                out.append({**rec, "experiment": str(cell.experiment_name), "profile": str(cell.profile),
                            "overrides": [*coords, *own]})
    finally:
        GlobalHydra.instance().clear()
    return out


def label_as_single(results: Iterable[dict[str, Any]], experiment: str) -> list[dict[str, Any]]:
    """Single runs kept as themselves under ``experiment`` (profile :data:`SINGLE_PROFILE`), each named by its run
    directory (the ``run`` column), with its kept overrides as it ran them: no check against a cell, since these are
    the runs that are not one (variants, tuning runs, runs at an older commit's defaults; ``git_sha`` says which).

    Raises:
        ValueError: a run that already belongs to an experiment (a sweep's cell is exported as such).
    """
    out = []
    for rec in results:
        run_dir = Path(str(rec.get("run_dir", "")))
        if rec.get("experiment"):
            raise ValueError(f"{run_dir}: already a cell of {rec['experiment']} ({rec.get('profile')})")
        out.append({**rec, "experiment": experiment, "profile": SINGLE_PROFILE, "run": run_dir.name})
    return out
