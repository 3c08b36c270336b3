"""The generated parts of the README and of docs/: lists and tables built from the registry, the schemas, the facts
in ``docs/methods.yaml`` and the results kept in ``experiments/``, never kept by hand.

A generated block is ``<!-- dpsyn:<what> -->`` ... ``<!-- dpsyn:end -->`` in a Markdown file;
:func:`dpsyn.cli.tables.readme_blocks` rebuilds them and ``python -m dpsyn.cli.tables readme`` (``make docs``) writes
them; ``tests/test_docs.py`` fails when one is stale. The blocks this module builds:

- ``methods``: method | paper | what it releases and how it is accounted | status (the headline cell);
- ``papers``: paper | the command of its tables | claims held / failed / open;
- ``guarantees``: method | released | accountant | sampling | caveat (docs/privacy.md);
- ``datasets``: the registered datasets and their config files;
- ``audit``: the last kept audit (``docs/data/audit.csv``);
- ``speed``: the last kept DP-SGD step benchmark (``docs/data/speed_dpsgd_step.csv``);
- ``csv <name>``: a kept benchmark's rows (``docs/data/<name>.csv``);
- ``config``: every config group's options with their defaults and allowed values (docs/config.md);
- ``claims <paper>``: one paper's claims (``claims`` alone: all of them);
- ``measured <paper>``: every table of the paper's specs, for each profile with kept results.

No torch import: the registry's names come from the config files, which a test checks against the registry.
"""

from __future__ import annotations

import dataclasses
import math
import re
import statistics
from pathlib import Path
from typing import Any

from dpsyn.paths import CONF_DIR, REPO_DIR

METHODS_FILE = REPO_DIR / "docs" / "methods.yaml"
EXPERIMENTS_DIR = REPO_DIR / "experiments"
DOC_FILES = ("README.md", "docs/*.md", "docs/papers/*.md")  # the files whose blocks `tables readme` rewrites


def doc_files(repo: Path = REPO_DIR) -> list[Path]:
    """The Markdown files with generated blocks (research logs under experiments/ are never rewritten)."""
    return sorted({p for pattern in DOC_FILES for p in repo.glob(pattern)})


def load_facts(path: Path = METHODS_FILE) -> dict[str, Any]:
    import yaml

    facts = yaml.safe_load(path.read_text())
    for name, m in facts["methods"].items():
        missing = {"paper", "what", "releases", "accountant", "sampling", "caveat", "headline"} - set(m)
        if missing:
            raise ValueError(f"{path}: method {name} lacks {', '.join(sorted(missing))}")
    return facts


def registered(group: str, conf_dir: Path = CONF_DIR) -> list[str]:
    """The options of a config group (``conf/<group>/*.yaml``): the registered methods or datasets."""
    return sorted(p.stem for p in (conf_dir / group).glob("*.yaml"))


def _cell(x: str) -> str:
    return str(x).replace("|", "\\|").replace("\n", " ")


def table(header: list[str], rows: list[list[Any]]) -> str:
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(_cell(c) for c in r) + " |" for r in rows]
    return "\n".join(out) + "\n"


def headline_cell(records: list[dict[str, Any]], sel: dict[str, Any] | None) -> str:
    """``mean [95% CI] (n)`` of the headline cell's metric over seeds, with where it comes from."""
    if not sel:
        return "no kept cell"
    from dpsyn.results.claims import DEFAULT_PROFILES, Side, mixed_protocols, side_runs, welch_interval

    sel = dict(sel)
    metric = sel.pop("metric")
    profiles = tuple(sel.pop("profiles", DEFAULT_PROFILES))
    runs = side_runs(records, Side(sel), metric, profiles)
    values = [v for v, _ in runs]
    where = f"{metric}, {sel.get('dataset')}" + (f" eps={_num(sel['eps'])}" if "eps" in sel else "")
    if not values:
        return f"not run yet ({where})"
    refused = mixed_protocols([p for _, p in runs], [])
    if refused:  # seeds scored two ways are not one number
        return f"{refused} ({where})"
    mean = statistics.fmean(values)
    if len(values) < 2:
        return f"{mean:.3g} (n=1; {where})"
    _, lo, hi, _ = welch_interval(values, 0.0)
    return f"{mean:.3g} [{lo:.3g}, {hi:.3g}] (n={len(values)}; {where})"


def _num(v: Any) -> str:
    v = float(v)
    return "inf" if math.isinf(v) else f"{v:g}"


def methods_block(records: list[dict[str, Any]], facts: dict[str, Any] | None = None) -> str:
    facts = facts or load_facts()
    rows = []
    for name, m in facts["methods"].items():
        paper = m["paper"]
        link = f"[{paper}](docs/papers/{paper}.md)" if paper else "reference"
        rows.append([f"`{name}`", link, m["what"], f"{m['releases']}; {m['accountant']}",
                     headline_cell(records, m["headline"])])
    return table(["method", "paper", "what it is", "released; accounted", "status: mean [95% CI] (n seeds)"], rows) + (
        "\nStatus: the headline cell of the results kept in `experiments/` (the paper's page has the rest): its metric "
        "(acc: downstream accuracy, higher is better; fd: Frechet distance, lower is better; mia_wb_acc_max: the white-box "
        "membership attack's accuracy, lower is better), its mean and 95% t interval over seeds.\n")


def claim_counts(verdicts: list[Any]) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for v in verdicts:
        c = out.setdefault(v.claim.paper, {"holds": 0, "fails": 0, "inconclusive": 0})
        # open: undecided, for want of seeds (inconclusive) or of one protocol on both sides (refused)
        verdict = "inconclusive" if v.verdict == "refused" else v.verdict
        c[verdict] = c.get(verdict, 0) + 1
    return out


def papers_block(verdicts: list[Any], facts: dict[str, Any] | None = None) -> str:
    facts = facts or load_facts()
    counts = claim_counts(verdicts)
    rows = []
    for paper, p in facts["papers"].items():
        c = counts.get(paper, {"holds": 0, "fails": 0, "inconclusive": 0})
        number = f"{p['number']}: " if p["number"] else ""
        rows.append([f"[{number}{p['title']}](docs/papers/{paper}.md)",
                     f"`{p['command']}`",
                     f"{c['holds']} / {c['fails']} / {c['inconclusive']}"])
    return table(["paper", "its tables and claims", "claims held / failed / open"], rows)


def guarantees_block(facts: dict[str, Any] | None = None) -> str:
    facts = facts or load_facts()
    rows = [[f"`{name}`", m["releases"], m["accountant"], m["sampling"], m["caveat"] or ""]
            for name, m in facts["methods"].items()]
    return table(["method", "released", "accountant", "sampling", "caveat"], rows) + (
        "\nEvery epsilon is under one relation: neighbours differ by one private row added or removed (above).\n")


def datasets_block(conf_dir: Path = CONF_DIR) -> str:
    rows = []
    for name in registered("dataset", conf_dir):
        lines = (conf_dir / "dataset" / f"{name}.yaml").read_text().splitlines()
        head = []
        for ln in lines:
            if not ln.startswith("#"):
                break
            if not ln.startswith("# @package"):
                head.append(ln.lstrip("#").strip())
        text = " ".join(head)
        first = re.split(r"(?<=[a-z0-9)])[.:] ", text, maxsplit=1)[0].split("; ")[0]
        first += ")" * (first.count("(") - first.count(")"))
        rows.append([f"`{name}`", first, f"`conf/dataset/{name}.yaml`"])
    return table(["dataset", "what it is", "config"], rows)


_COMMENT = re.compile(r"^(?P<key>[A-Za-z_][\w]*):[^#]*#\s*(?P<text>.*)$")


def _yaml_comments(path: Path) -> dict[str, str]:
    """Top-level keys' trailing comments in a config file: their one-line descriptions."""
    out: dict[str, str] = {}
    last = None
    for line in path.read_text().splitlines():
        m = _COMMENT.match(line)
        if m:
            last = m.group("key")
            out[last] = m.group("text").strip()
        elif last and re.match(r"^\s+#", line):  # the comment goes on, aligned under the first line
            out[last] += " " + line.strip().lstrip("#").strip()
        else:
            last = None
    return out


def _rules(meta: Any) -> str:
    parts = []
    for k, sym in (("ge", ">="), ("gt", ">"), ("le", "<="), ("lt", "<")):
        if k in meta:
            parts.append(f"{sym} {meta[k]}")
    if "choices" in meta:
        parts.append("one of " + ", ".join(f"`{c}`" for c in meta["choices"]))
    if meta.get("nonempty"):
        parts.append("non-empty")
    return "; ".join(parts)


def _fmt_default(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return str(v).lower()
    return str(v)


def _group_defaults(group: str, option: str, conf_dir: Path) -> dict[str, Any]:
    """The option's yaml values (its own keys, without the defaults list): what the schema's defaults become."""
    import yaml

    path = conf_dir / group / f"{option}.yaml"
    if not path.is_file():
        return {}
    data = yaml.safe_load(path.read_text()) or {}
    data.pop("defaults", None)
    return data


def config_block(conf_dir: Path = CONF_DIR) -> str:
    """Every option of every config group with a schema: key | default | allowed | what it does."""
    from dpsyn.config.schema import SCHEMAS

    out = []
    for group in ("method", "dataset", "privacy", "trainer", "metrics", "public"):
        options = SCHEMAS[group]
        if group in ("method",):
            pairs = [(name, options[name]) for name in registered("method", conf_dir) if name in options]
        elif group == "dataset":
            pairs = [(name, schema) for name, schema in options.items()]
        else:
            pairs = list(options.items())
        out.append(f"### `{group}`\n")
        for name, schema in pairs:
            yaml_vals = _group_defaults(group, name, conf_dir) if group == "method" else (
                _group_defaults(group, "default", conf_dir) if group in ("privacy", "trainer", "metrics") else {})
            comments = _yaml_comments(conf_dir / group / f"{name}.yaml") if group == "method" else {}
            title = {"method": f"`{group}={name}` (`conf/method/{name}.yaml`)",
                     "dataset": f"dataset schema `{name}`",
                     "public": f"public models of kind `{name}`"}.get(group, f"`{group}` (`conf/{group}/`)")
            rows = []
            for fld in dataclasses.fields(schema):
                if fld.name == "name":
                    continue
                if fld.default is not dataclasses.MISSING:
                    default = fld.default
                elif fld.default_factory is not dataclasses.MISSING:
                    default = fld.default_factory()
                else:
                    default = "???"
                if fld.name in yaml_vals:
                    default = yaml_vals[fld.name]
                rows.append([f"`{fld.name}`", f"`{_fmt_default(default)}`", _rules(fld.metadata),
                             comments.get(fld.name) or fld.metadata.get("help", "")])
            out.append(f"#### {title}\n")
            out.append(table(["key", "default", "allowed", "note"], rows) if rows else "No options.\n")
    return "\n".join(out)


def measured_block(paper: str, records: list[dict[str, Any]]) -> str:
    """Every table of ``paper``'s specs (``experiments/<paper>/*.yaml``) for each profile with kept results."""
    from dpsyn.results import tables

    parts = []
    for spec_path in sorted((EXPERIMENTS_DIR / paper).glob("*.yaml")):
        if spec_path.name == "claims.yaml":
            continue
        spec = tables.load_spec(spec_path)
        for profile in ("embedded", "quick", "dib", "paper"):
            if not tables.records_for(records, spec.experiment, profile):
                continue
            for m in spec.metrics:
                # a table none of whose cells has run says nothing: left out
                if not tables.build_cells(tables.records_for(records, spec.experiment, profile), spec, m):
                    continue
                parts.append(metric_table(f"{paper}/{spec_path.stem}", profile, m.name, records))
    return "\n".join(parts) if parts else "No results kept for this paper yet.\n"


AUDIT_CSV = REPO_DIR / "docs" / "data" / "audit.csv"


def audit_block(path: Path = AUDIT_CSV) -> str:
    """The last kept audit (``python -m dpsyn.cli.audit keep=true``): one row per mechanism."""
    import csv

    rows = list(csv.DictReader(path.open()))
    if not rows:
        return "No audit kept yet: run `python -m dpsyn.cli.audit keep=true`.\n"
    body = []
    for r in rows:
        claimed, lower = float(r["eps_claimed"]), float(r["eps_lower"])
        trials = int(r["trials"])
        body.append([f"`{r['mechanism']}`", r["what"], f"{claimed:.3f}", f"{lower:.3f}",
                     f"{lower / claimed:.2f}" if claimed > 0 else "", f"{trials / 1e6:g}M" if trials >= 1e6
                     else f"{trials // 1000}k"])
    seconds = sum(float(r["seconds"]) for r in rows)
    machines = sorted({r["cpu"] for r in rows})
    shas = sorted({r["git_sha"][:7] for r in rows})
    return table(["mechanism", "what", "eps_claimed", "eps_lower", "lower / claimed", "trials"], body) + (
        f"\n{len(rows)} mechanisms, {float(rows[0]['confidence']):.0%} family-wise confidence, "
        f"{seconds / 60:.1f} min of auditing on {', '.join(machines)}, code {', '.join(shas)} "
        "(`docs/data/audit.csv`).\n")


SPEED_CSV = REPO_DIR / "docs" / "data" / "speed_dpsgd_step.csv"


def speed_block(path: Path = SPEED_CSV) -> str:
    """The kept DP-SGD step benchmark (``python benchmarks/dpsgd_step.py --keep``): each mode's time and its ratio
    to a plain step of the same run, one column pair per thread count."""
    import csv

    rows = list(csv.DictReader(path.open())) if path.is_file() else []
    if not rows:
        return "No benchmark kept yet: run `python benchmarks/dpsgd_step.py --keep`.\n"
    threads = sorted({int(r["threads"]) for r in rows}, reverse=True)
    modes = list(dict.fromkeys(r["mode"] for r in rows))
    cell = {(r["mode"], int(r["threads"])): r for r in rows}
    body = []
    for mode in modes:
        default = any(cell.get((mode, t), {}).get("default") == "yes" for t in threads)
        line = [f"`{mode}`" + (" (default)" if default else "")]
        for t in threads:
            r = cell.get((mode, t))
            line.append(f"{float(r['ms']):.1f} ms, {float(r['ratio']):.2f}x" if r else "")
        body.append(line)
    first = rows[0]
    return table(["step", *[f"{t} thread{'s' if t > 1 else ''}" for t in threads]], body) + (
        f"\nBatch {first['batch']}, median of {first['steps']} rounds, on {', '.join(sorted({r['cpu'] for r in rows}))}, "
        f"torch {first['torch']}, code {', '.join(sorted({r['git_sha'][:7] for r in rows}))} "
        "(`docs/data/speed_dpsgd_step.csv`).\n")


def csv_block(name: str, data_dir: Path = REPO_DIR / "docs" / "data") -> str:
    """A kept benchmark's rows (``docs/data/<name>.csv``, written by a benchmark's ``--keep``) as a table; the
    machine, torch and code they ran on in the caption."""
    import csv

    path = data_dir / f"{name}.csv"
    rows = list(csv.DictReader(path.open())) if path.is_file() else []
    if not rows:
        return f"No rows kept in `docs/data/{name}.csv` yet (the benchmark's `--keep`).\n"
    provenance = ("cpu", "torch", "git_sha")
    header = [k for k in rows[0] if k not in provenance]
    body = [[r[k] for k in header] for r in rows]
    cpus = sorted({r.get("cpu", "") for r in rows})
    shas = sorted({r.get("git_sha", "")[:7] for r in rows})
    return table(header, body) + (f"\nOn {', '.join(cpus)}, torch {rows[0].get('torch', '')}, code "
                                  f"{', '.join(shas)} (`docs/data/{name}.csv`).\n")


def claims_block(verdicts: list[Any], paper: str | None) -> str:
    from dpsyn.results.claims import render_markdown

    chosen = [v for v in verdicts if paper is None or v.claim.paper == paper]
    return render_markdown(chosen) if chosen else "No claims for this paper.\n"


def metric_table(spec_ref: str, profile: str, metric: str, records: list[dict[str, Any]]) -> str:
    """One metric's table of one spec (``paper/stem``) as Markdown, from records (no missing-cell rows)."""
    from dpsyn.results import tables

    spec = tables.load_spec(EXPERIMENTS_DIR / f"{spec_ref}.yaml")
    m = next((x for x in spec.metrics if x.name == metric), None)
    if m is None:
        raise ValueError(f"{spec_ref}: no metric {metric} (has: {', '.join(x.name for x in spec.metrics)})")
    agg = tables.build_cells(tables.records_for(records, spec.experiment, profile), spec, m)
    header, body, notes = tables.table_rows(spec, m, agg)
    return tables.render_markdown(header, body, notes, f"{spec.title} — {m.label or m.name} ({profile} profile)")


README_BLOCK = re.compile(r"(<!-- dpsyn:(?P<what>[^>]*?) -->\n)(?P<body>.*?)(<!-- dpsyn:end -->)", re.S)


def readme_blocks(text: str, records: list[dict[str, Any]]) -> str:
    """``text`` with every generated block rebuilt, each opened by ``<!-- dpsyn:<what> -->`` and closed by
    ``<!-- dpsyn:end -->``: ``claims [<paper>]``, ``table <paper>/<spec> <profile> <metric>`` (one metric's table),
    and the blocks of :mod:`dpsyn.results.docs` (``methods``, ``papers``, ``guarantees``, ``datasets``, ``config``,
    ``measured <paper>``)."""
    verdicts: list[Any] | None = None

    def claims() -> list[Any]:
        nonlocal verdicts
        if verdicts is None:
            from dpsyn.results.claims import evaluate_all

            verdicts = evaluate_all(records, EXPERIMENTS_DIR)
        return verdicts

    def build(m: re.Match) -> str:
        what = m.group("what").split()
        if what and what[0] == "claims" and len(what) <= 2:
            body = claims_block(claims(), what[1] if len(what) == 2 else None)
        elif len(what) == 4 and what[0] == "table":
            body = metric_table(what[1], what[2], what[3], records)
        elif what == ["methods"]:
            body = methods_block(records)
        elif what == ["papers"]:
            body = papers_block(claims())
        elif what == ["guarantees"]:
            body = guarantees_block()
        elif what == ["datasets"]:
            body = datasets_block()
        elif what == ["config"]:
            body = config_block()
        elif len(what) == 2 and what[0] == "csv":
            body = csv_block(what[1])
        elif what == ["speed"]:
            body = speed_block()
        elif what == ["audit"]:
            body = audit_block()
        elif len(what) == 2 and what[0] == "measured":
            body = measured_block(what[1], records)
        else:
            raise ValueError(f"generated block <!-- dpsyn:{m.group('what')} -->: unknown; use 'claims [<paper>]', "
                             "'table <paper>/<spec> <profile> <metric>', 'measured <paper>', 'methods', 'papers', "
                             "'guarantees', 'datasets', 'audit', 'speed', 'csv <name>' or 'config'")
        return m.group(1) + body + m.group(4)

    return README_BLOCK.sub(build, text)
