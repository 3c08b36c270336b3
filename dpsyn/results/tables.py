"""The table builder: scan run directories' ``result.json``, group runs into cells, render Markdown/LaTeX/CSV.

No torch import here (tables are rebuilt on machines without a GPU stack). A table spec
(``experiments/<paper>/<table>.yaml``) says which runs fill which cells (``select``, ``rows``, ``columns``), which
metrics to show and in which direction they improve, and the published numbers to print beside ours.

A cell never averages runs of two evaluation protocols (:mod:`dpsyn.results.protocol`): the table's main protocol
(the one of most runs) keeps the row labels, a run of another gets a row of its own, ``<row> [<protocol id>]``, and
the notes under the table name the protocols.
"""

from __future__ import annotations

import csv
import io
import logging
import math
import statistics
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dpsyn.results.io import read_json

log = logging.getLogger(__name__)

MISSING = "—"


@dataclass(frozen=True)
class MetricSpec:
    name: str
    label: str = ""
    direction: str = "max"  # "max": higher is better; "min": lower is better
    scale: float = 1.0
    digits: int = 3


@dataclass(frozen=True)
class PublishedSpec:
    source: str
    metric: str
    values: dict[str, dict[float, float]]
    scale: float = 1.0
    note: str = ""


@dataclass
class TableSpec:
    """A table: runs matching ``select`` grouped by ``rows`` x ``columns`` (result.json fields)."""

    name: str
    title: str
    experiment: str
    select: dict[str, Any]
    rows: str
    columns: str
    metrics: list[MetricSpec]
    published: list[PublishedSpec] = field(default_factory=list)
    row_order: list[str] = field(default_factory=list)
    privacy_utility: bool = True  # draw metric-vs-eps curves (off when the columns are not epsilons)
    figures: list[dict[str, Any]] = field(default_factory=list)  # extra plots (see dpsyn.results.plots.figure)


@dataclass(frozen=True)
class Cell:
    """Mean, standard deviation (over seeds, n-1) and number of runs of one metric in one cell, and the evaluation
    protocol of those runs ("" for runs written before protocol ids)."""

    mean: float
    std: float
    n: int
    protocol: str = ""


def _key(v: Any) -> Any:
    """Normalise a cell coordinate: numbers (eps) as floats, "inf" strings as inf."""
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return float(v)
    if isinstance(v, str):
        try:
            return float(v)
        except ValueError:
            return v
    return v


def load_spec(path: str | Path) -> TableSpec:
    """Read a table spec YAML (see ``experiments/``)."""
    from omegaconf import OmegaConf

    path = Path(path)
    raw = OmegaConf.to_container(OmegaConf.load(path), resolve=True)
    for key in ("title", "experiment", "rows", "columns", "metrics"):
        if key not in raw:
            raise ValueError(f"{path}: table spec lacks '{key}'")
    return TableSpec(
        name=f"{path.parent.name}_{path.stem}",
        title=raw["title"],
        experiment=raw["experiment"],
        select=dict(raw.get("select") or {}),
        rows=raw["rows"],
        columns=raw["columns"],
        metrics=[MetricSpec(**m) for m in raw["metrics"]],
        published=[
            PublishedSpec(
                source=p["source"],
                metric=p["metric"],
                scale=float(p.get("scale", 1.0)),
                note=p.get("note", ""),
                values={str(r): {_key(c): float(v) for c, v in cols.items()} for r, cols in p["values"].items()},
            )
            for p in raw.get("published") or []
        ],
        row_order=[str(r) for r in raw.get("row_order") or []],
        privacy_utility=bool(raw.get("privacy_utility", True)),
        figures=[dict(f) for f in raw.get("figures") or []],
    )


def records_for(records: list[dict[str, Any]], experiment: str, profile: str) -> list[dict[str, Any]]:
    """The records (results.csv rows grouped per run) of one experiment's profile."""
    return [r for r in records if r.get("experiment") == experiment and r.get("profile") == profile]


def scan_results(root: str | Path) -> list[dict[str, Any]]:
    """Every readable ``result.json`` below ``root`` (unreadable ones are logged and skipped)."""
    out = []
    for path in sorted(Path(root).rglob("result.json")):
        try:
            rec = read_json(path)
        except (OSError, ValueError) as e:
            log.warning("skipping unreadable %s: %s", path, e)
            continue
        rec.setdefault("run_dir", str(path.parent))
        out.append(rec)
    return out


def _field(rec: dict[str, Any], name: str) -> Any:
    """A result field by name: top level, then metrics, then a dotted path (``sample_provenance.owners.0``; integer
    parts index lists). A list value is returned as a label joined by "/" (``[0.01, 0.5]`` -> ``"0.01/0.5"``)."""
    if name in rec:
        value = rec[name]
    elif name in rec.get("metrics", {}):
        value = rec["metrics"][name]
    elif name in (rec.get("fields") or {}):  # a record read back from results.csv (dpsyn.results.export)
        value = rec["fields"][name]
    else:
        value = rec
        for part in name.split("."):
            if isinstance(value, dict):
                value = value.get(part)
            elif isinstance(value, list) and part.lstrip("-").isdigit() and -len(value) <= int(part) < len(value):
                value = value[int(part)]
            else:
                return None
    if isinstance(value, list):
        return "/".join(f"{v:g}" if isinstance(v, float) else str(v) for v in value)
    return value


def select_runs(results: Iterable[dict[str, Any]], spec: TableSpec) -> list[dict[str, Any]]:
    """Runs matching every ``spec.select`` field (a list value: any of its items)."""

    def match(r: dict[str, Any], k: str, v: Any) -> bool:
        got = _key(_field(r, k))
        return any(got == _key(x) for x in v) if isinstance(v, (list, tuple)) else got == _key(v)

    return [r for r in results if all(match(r, k, v) for k, v in spec.select.items())]


def main_protocol(protocols: Iterable[str]) -> str:
    """The protocol of most runs (ties: the first in sorted order); "" for none."""
    counts: dict[str, int] = defaultdict(int)
    for p in protocols:
        counts[p] += 1
    return min(counts, key=lambda p: (-counts[p], p)) if counts else ""


def build_cells(results: Iterable[dict[str, Any]], spec: TableSpec, metric: MetricSpec) -> dict[tuple[Any, Any], Cell]:
    """Group ``results`` by (row, column) and aggregate ``metric`` (scaled) over the runs (seeds) of each cell.

    Runs of one (row, column) under two protocols are never averaged: those of the main protocol
    (:func:`main_protocol`) fill the cell, the others the row ``<row> [<protocol>]``."""
    groups: dict[tuple[Any, Any, str], list[float]] = defaultdict(list)
    for r in select_runs(results, spec):
        value = _field(r, metric.name)
        if value is None or not isinstance(value, (int, float)) or math.isnan(value):
            continue
        key = (str(_field(r, spec.rows)), _key(_field(r, spec.columns)), str(r.get("protocol") or ""))
        groups[key].append(float(value) * metric.scale)
    main = main_protocol(p for (_, _, p), v in groups.items() for _ in v)
    return {
        (row if p == main else f"{row} [{p or 'no protocol recorded'}]", col):
            Cell(statistics.fmean(v), statistics.stdev(v) if len(v) > 1 else float("nan"), len(v), p)
        for (row, col, p), v in groups.items()
    }


def protocol_note(cells: dict[tuple[Any, Any], Cell]) -> str | None:
    """The notes' line that names the cells' evaluation protocols (None for a table without cells)."""
    protocols = sorted({c.protocol for c in cells.values()})
    if not protocols:
        return None
    main = main_protocol(c.protocol for c in cells.values() for _ in range(c.n))
    name = f"`{main}`" if main else "not recorded (runs before protocol ids)"
    if len(protocols) == 1:
        return f"evaluation protocol: {name}"
    return (f"evaluation protocol: {name}; rows marked [...] were measured under another protocol and are not "
            "averaged with it")


def _sort_cols(cols: Iterable[Any]) -> list[Any]:
    return sorted(set(cols), key=lambda c: (0, c) if isinstance(c, float) else (1, str(c)))


def axes(spec: TableSpec, cells: dict[tuple[Any, Any], Cell], expected: Iterable[tuple[Any, Any]] = ()) -> tuple[list[str], list[Any]]:
    """Row and column labels: those with results, plus expected cells (so missing ones show), in a stable order."""
    keys = list(cells) + [(str(r), _key(c)) for r, c in expected]
    pub_rows = [r for p in spec.published for r in p.values]
    rows = list(dict.fromkeys(spec.row_order + sorted({r for r, _ in keys} | set(pub_rows) - set(spec.row_order))))
    rows = [r for r in rows if any(k[0] == r for k in keys) or r in spec.row_order]
    cols = _sort_cols(c for _, c in keys)
    return rows, cols


def fmt_col(c: Any) -> str:
    if isinstance(c, float):
        return "inf" if math.isinf(c) else f"{c:g}"
    return str(c)


def fmt_cell(cell: Cell | None, digits: int) -> str:
    if cell is None:
        return MISSING
    if cell.n > 1:
        return f"{cell.mean:.{digits}f} ± {cell.std:.{digits}f} (n={cell.n})"
    return f"{cell.mean:.{digits}f} (n=1)"


def table_rows(
    spec: TableSpec, metric: MetricSpec, cells: dict[tuple[Any, Any], Cell], expected: Iterable[tuple[Any, Any]] = ()
) -> tuple[list[str], list[list[str]], list[str]]:
    """Header, body rows and footnotes of one metric's table, with a published column after each of ours."""
    rows, cols = axes(spec, cells, expected)
    pubs = [p for p in spec.published if p.metric == metric.name]
    header = [spec.rows]
    for c in cols:
        header.append(f"{spec.columns}={fmt_col(c)}")
        header.extend(f"{spec.columns}={fmt_col(c)} published[{i + 1}]" for i, p in enumerate(pubs) if _has_col(p, c))
    body = []
    for r in rows:
        line = [r]
        for c in cols:
            line.append(fmt_cell(cells.get((r, c)), metric.digits))
            for p in pubs:
                if _has_col(p, c):
                    v = p.values.get(r, {}).get(c)
                    line.append("" if v is None else f"{v * p.scale:.{metric.digits}f}")
        body.append(line)
    notes = [f"[{i + 1}] {p.source}" + (f" — {p.note}" if p.note else "") for i, p in enumerate(pubs)]
    direction = "higher is better" if metric.direction == "max" else "lower is better"
    notes.insert(0, f"{metric.label or metric.name}: mean ± std over seeds (n runs); {direction}; {MISSING} = no run yet")
    protocols = protocol_note(cells)
    if protocols:
        notes.insert(1, protocols)
    return header, body, notes


def _has_col(p: PublishedSpec, c: Any) -> bool:
    return any(c in cols for cols in p.values.values())


def render_markdown(header: Sequence[str], body: Sequence[Sequence[str]], notes: Sequence[str], title: str) -> str:
    out = [f"### {title}", "", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(r) + " |" for r in body]
    out += [""] + [f"{n}  " for n in notes]
    return "\n".join(out) + "\n"


_LATEX_SPECIAL = {"\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_",
                  "{": r"\{", "}": r"\}", "~": r"\textasciitilde{}", "^": r"\textasciicircum{}", "±": r"$\pm$",
                  "—": "--"}


def latex_escape(text: str) -> str:
    """Escape LaTeX's special characters (and typeset ± and the missing-cell dash)."""
    return "".join(_LATEX_SPECIAL.get(ch, ch) for ch in text)


def render_latex(header: Sequence[str], body: Sequence[Sequence[str]], notes: Sequence[str], title: str) -> str:
    cols = "l" + "r" * (len(header) - 1)
    out = [r"\begin{table}[t]", r"\centering", rf"\caption{{{latex_escape(title)}}}", rf"\begin{{tabular}}{{{cols}}}",
           r"\toprule", " & ".join(latex_escape(h) for h in header) + r" \\", r"\midrule"]
    out += [" & ".join(latex_escape(c) for c in r) + r" \\" for r in body]
    out += [r"\bottomrule", r"\end{tabular}"]
    out += [rf"\\{{\footnotesize {latex_escape(n)}}}" for n in notes]
    out += [r"\end{table}"]
    return "\n".join(out) + "\n"


def render_csv(spec: TableSpec, metric: MetricSpec, cells: dict[tuple[Any, Any], Cell],
               expected: Iterable[tuple[Any, Any]] = ()) -> str:
    """Long-format CSV (one line per cell): row, column, metric, mean, std, n, each published value, the protocol."""
    rows, cols = axes(spec, cells, expected)
    pubs = [p for p in spec.published if p.metric == metric.name]
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow([spec.rows, spec.columns, "metric", "mean", "std", "n"] + [f"published[{i + 1}]" for i in range(len(pubs))]
               + ["protocol"])
    for r in rows:
        for c in cols:
            cell = cells.get((r, c))
            pv = [p.values.get(r, {}).get(c) for p in pubs]
            w.writerow(
                [r, fmt_col(c), metric.name]
                + (["", "", 0] if cell is None else [f"{cell.mean:.6g}", "" if math.isnan(cell.std) else f"{cell.std:.6g}", cell.n])
                + ["" if v is None else f"{v * p.scale:.6g}" for v, p in zip(pv, pubs)]
                + ["" if cell is None else cell.protocol]
            )
    return buf.getvalue()
