"""``python -m dpsyn.cli.tables``: run the table sweeps (resuming), then build tables and plots from the runs.

``reproduce --profile embedded|quick|paper|dib`` (dib: DPImageBench's settings, its spec only): for each table spec in ``experiments/``, list its cells (from the
experiment's ``hydra.sweeper.params``), run the missing ones as one Hydra multirun with ``skip_existing=true`` (a
cell whose ``result.json`` exists is not trained again; a failing cell is reported and the others go on), then build.
``build``: only rebuild tables and plots from the runs on disk, or with ``--from experiments/`` from the results kept
in the repo (``experiments/<paper>/results.csv``), without any run.
``export``: write the finished runs' metrics into ``experiments/<paper>/results.csv`` (a re-run cell replaces its rows);
``export RUN_DIR ... --as EXPERIMENT:PROFILE`` the single runs of ``python train.py ...`` commands (outside a sweep),
as the cells they reproduce or, with the profile ``single``, as themselves, named by their directory.
``protocols``: give the kept rows written before protocol ids the evaluation protocol of their run
(:func:`dpsyn.results.protocol.backfill`; rows that have one are left alone).
``claims``: evaluate ``experiments/<paper>/claims.yaml`` over seeds (from the runs or ``--from experiments/``), print
one verdict per claim with its interval, write ``claims.{md,json}``.
``readme``: rewrite the generated blocks (``<!-- dpsyn:... -->``) of README.md and docs/ from ``--from experiments/``, the
registry and the schemas (:mod:`dpsyn.results.docs`).
``reproduce --dry-run``: list the cells, how many are finished and the time the rest will take, and run nothing.
"""

from __future__ import annotations

import argparse
import itertools
import os
import statistics
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dpsyn.paths import CONF_DIR, REPO_DIR, require_checkout
from dpsyn.results.docs import README_BLOCK, metric_table, readme_blocks  # noqa: F401  (the readme command's; tests use them)
from dpsyn.results.export import SINGLE_PROFILE
from dpsyn.results.tables import records_for

EXPERIMENTS_DIR = REPO_DIR / "experiments"
PROFILES = ("embedded", "quick", "paper", "dib")  # dib: DPImageBench's own settings (dpimagebench only)


@dataclass(frozen=True)
class CellRun:
    overrides: tuple[str, ...]
    run_dir: Path

    @property
    def status(self) -> str:
        if (self.run_dir / "result.json").is_file():
            return "done"
        if (self.run_dir / "error.txt").is_file():
            return "failed"
        return "missing"


def experiment_for(spec_experiment: str, profile: str) -> str:
    """The experiment config of a profile: ``<name>`` (embedded) or ``<name>_<profile>``."""
    if profile not in PROFILES:
        raise ValueError(f"profile={profile}: unknown profile; allowed: {', '.join(PROFILES)}")
    return spec_experiment if profile == "embedded" else f"{spec_experiment}_{profile}"


def experiment_cells(experiment: str, extra: list[str] | None = None, conf_dir: Path = CONF_DIR) -> list[CellRun]:
    """Every cell of an experiment's sweep, with the run directory Hydra will give it."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from omegaconf import OmegaConf

    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(conf_dir), version_base="1.3"):
            extra = list(extra or [])
            sweeps = {o.key_or_group for o in OverridesParser.create().parse_overrides(extra) if o.is_sweep_override()}
            single = [a for a in extra if a.split("=", 1)[0].lstrip("+~") not in sweeps]
            base = compose("train", overrides=[f"experiment={experiment}", *single], return_hydra_config=True)
            params = {str(k): str(v) for k, v in OmegaConf.to_container(base.hydra.sweeper.params or {}).items()}
            fixed = []
            for arg in extra:  # the command line overrides the experiment's sweep, as in Hydra
                key = arg.split("=", 1)[0].lstrip("+~")
                if key in params or key in sweeps:
                    params[key] = arg.split("=", 1)[1]
                else:
                    fixed.append(arg)
            parsed = OverridesParser.create().parse_overrides([f"{k}={v}" for k, v in params.items()])
            axes = [
                [f"{o.key_or_group}={v}" for v in (o.sweep_string_iterator() if o.is_sweep_override() else [o.value()])]
                for o in parsed
            ]
            # Compose once per combination of config-group choices (method, dataset, ...); plain values (eps, seed)
            # are then set on that config (every combination sets all of them, so nothing stale remains), which
            # resolves the run directory as Hydra will, at a fraction of the cost of one compose per cell.
            groups = set(base.hydra.runtime.choices.keys())
            by_choice: dict[tuple[str, ...], Any] = {}
            cells = []
            for combo in itertools.product(*axes):
                choice = tuple(o for o in combo if o.split("=", 1)[0] in groups)
                if choice not in by_choice:
                    by_choice[choice] = compose("train", overrides=[f"experiment={experiment}", *fixed, *choice],
                                                return_hydra_config=True)
                cfg = by_choice[choice]
                for o in OverridesParser.create().parse_overrides([o for o in combo if o not in choice]):
                    OmegaConf.update(cfg, o.key_or_group, o.value(), force_add=True)
                sweep = cfg.hydra.sweep
                cells.append(CellRun(tuple(combo), Path(str(sweep.dir)) / str(sweep.subdir)))
            return cells
    finally:
        GlobalHydra.instance().clear()


def specs(only: list[str] | None = None) -> list[Path]:
    """The table specs (``experiments/<paper>/<table>.yaml``; not ``claims.yaml``)."""
    paths = sorted(p for p in EXPERIMENTS_DIR.glob("*/*.yaml") if p.name != "claims.yaml")
    if only:
        paths = [p for p in paths if p.stem in only or f"{p.parent.name}/{p.stem}" in only or p.parent.name in only]
    return paths


def runs_root() -> Path:
    """Where the sweeps write (``paths.output_dir``/experiments; ``DPSYN_OUTPUT_DIR`` moves it)."""
    return Path(os.environ.get("DPSYN_OUTPUT_DIR", "outputs")) / "experiments"


def build_tables(spec_path: Path, profile: str, out_dir: Path, cells: list[CellRun] | None = None,
                 records: list[dict[str, Any]] | None = None) -> list[Path]:
    """Render one spec's tables (Markdown, LaTeX, CSV) and plots (privacy-utility per metric, sample mosaic).

    ``records``: build from results kept in the repo (:func:`dpsyn.results.export.load_records`) instead of the run
    directories (no sample mosaic then: the samples are not kept)."""
    from dpsyn.results import plots, tables
    from dpsyn.results.io import atomic_write_text

    spec = tables.load_spec(spec_path)
    exp = experiment_for(spec.experiment, profile)
    cells = cells if cells is not None else experiment_cells(exp)
    if records is not None:
        results = records_for(records, spec.experiment, profile)
    else:
        results = [r for c in cells if c.status == "done" for r in tables.scan_results(c.run_dir)]
    expected = []
    for c in cells:  # cells the sweep will make, so that missing ones show as such (when rows/columns are overrides)
        kv = dict(o.split("=", 1) for o in c.overrides)
        if spec.rows in kv and spec.columns in kv and all(str(kv.get(k, v)) == str(v) for k, v in spec.select.items()):
            expected.append((kv[spec.rows], kv[spec.columns]))
    stem = f"{spec.name}_{profile}"
    out_dir.mkdir(parents=True, exist_ok=True)
    md, tex, csv_parts, written = [], [], [], []
    for metric in spec.metrics:
        agg = tables.build_cells(results, spec, metric)
        header, body, notes = tables.table_rows(spec, metric, agg, expected)
        title = f"{spec.title} — {metric.label or metric.name} ({profile} profile)"
        md.append(tables.render_markdown(header, body, notes, title))
        tex.append(tables.render_latex(header, body, notes, title))
        csv_parts.append(tables.render_csv(spec, metric, agg, expected))
        if agg and spec.privacy_utility:
            written.append(plots.privacy_utility_plot(spec, metric, agg, out_dir / f"{stem}_{metric.name}.png"))
    selected = tables.select_runs(results, spec)
    for i, fig in enumerate(spec.figures):
        name = fig.get("name") or f"figure{i + 1}"
        path = plots.figure(fig, selected, out_dir / f"{stem}_{name}.png", title=spec.title)
        if path is not None:
            written.append(path)
    written.append(atomic_write_text(out_dir / f"{stem}.md", "\n".join(md)))
    written.append(atomic_write_text(out_dir / f"{stem}.tex", "\n".join(tex)))
    written.append(atomic_write_text(out_dir / f"{stem}.csv", "".join(
        part if i == 0 else part.split("\n", 1)[1] for i, part in enumerate(csv_parts))))
    seed0 = {}
    for r in sorted(tables.select_runs(results, spec), key=lambda r: r.get("seed", 0)):
        if "run_dir" in r:
            seed0.setdefault((str(tables._field(r, spec.rows)), tables._key(tables._field(r, spec.columns))),
                             Path(r["run_dir"]))
    if records is None and seed0 and plots.has_image_samples(seed0):  # tables: no sample mosaic
        written.append(plots.sample_mosaic(seed0, out_dir / f"{stem}_samples.png", title=spec.title))
    return written


def has_profile(spec_experiment: str, profile: str, conf_dir: Path = CONF_DIR) -> bool:
    """Whether the experiment has a config for ``profile`` (``quick`` covers only the claims' experiments)."""
    return (conf_dir / "experiment" / f"{experiment_for(spec_experiment, profile)}.yaml").is_file()


def _cell_method(cell: CellRun, default: str) -> str:
    for o in cell.overrides:
        if o.startswith("method="):
            return o.split("=", 1)[1]
    return default


def _run_seconds(run_dir: Path) -> float | None:
    from dpsyn.results.io import read_json

    try:
        return float(read_json(run_dir / "result.json")["timings"]["total_s"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _fmt_duration(seconds: float) -> str:
    minutes = round(seconds / 60)
    return f"{minutes // 60} h {minutes % 60:02d} min" if minutes >= 60 else f"{max(minutes, 1)} min"


def dry_run(profile: str, only: list[str] | None, train_args: list[str], kept: list[dict[str, Any]] | None = None) -> float:
    """Print each experiment's cells, how many are finished, and the time the others will take one at a time,
    estimated from finished cells' own timings (same method in the same experiment, else the same method in any
    kept result of this profile). Returns the estimated seconds (unknown cells count 0, and are counted). Another
    profile's or another method's timings never stand in: a profile sets the training length (an embedded dp_gan run
    takes minutes, the same method at DPImageBench's length about 2 h), and methods of one profile differ as much
    (at DPImageBench's setting a GS-WGAN run's warm start alone is 64-291 h on one CPU core, a DP-GAN run 1.5-2.6 h)."""
    from dpsyn.results.tables import load_spec

    anywhere: dict[str, list[float]] = {}  # this profile's kept results' timings per method (any experiment)
    for r in kept or []:
        sec = (r.get("timings") or {}).get("total_s")
        if isinstance(sec, float) and r.get("profile") == profile:
            anywhere.setdefault(str(r.get("method")), []).append(sec)
    total, unknown_total, seen = 0.0, 0, set()
    for spec_path in specs(only):
        spec = load_spec(spec_path)
        if spec.experiment in seen:
            continue
        seen.add(spec.experiment)
        if not has_profile(spec.experiment, profile):
            print(f"[{spec.experiment}] no {profile} profile (conf/experiment/{experiment_for(spec.experiment, profile)}.yaml): skipped")
            continue
        exp = experiment_for(spec.experiment, profile)
        cells = experiment_cells(exp, train_args)
        default_method = _default_method(exp)
        done = [c for c in cells if c.status == "done"]
        timed: dict[str, list[float]] = {}
        for c in done:
            sec = _run_seconds(c.run_dir)
            if sec is not None:
                timed.setdefault(_cell_method(c, default_method), []).append(sec)
        est, unknown = 0.0, 0
        for c in cells:
            if c.status == "done":
                continue
            m = _cell_method(c, default_method)
            pool = timed.get(m) or anywhere.get(m)
            if pool:
                est += statistics.median(pool)
            else:
                unknown += 1
        todo = len(cells) - len(done)
        line = f"[{spec.experiment}] {exp}: {len(cells)} cells, {len(done)} finished, {todo} to run"
        if todo:
            line += f", about {_fmt_duration(est)} one at a time" if est else ""
            line += f" ({unknown} cells without a timing to go by)" if unknown else ""
        print(line)
        by_method: dict[str, list[CellRun]] = {}
        for c in cells:
            by_method.setdefault(_cell_method(c, default_method), []).append(c)
        for m, cs in by_method.items():
            n_done = sum(c.status == "done" for c in cs)
            t = statistics.median(timed[m]) if m in timed else (statistics.median(anywhere[m]) if m in anywhere else None)
            print(f"  {m}: {n_done}/{len(cs)} finished" + (f", {t / 60:.1f} min a cell" if t else ""))
        total += est
        unknown_total += unknown
    print(f"estimated: {_fmt_duration(total) if total else 'nothing to run'} one cell at a time"
          + (f", plus {unknown_total} cells without a timing" if unknown_total else "")
          + "; divide by the launcher's parallel jobs (e.g. hydra/launcher=joblib)")
    return total


def _default_method(experiment: str) -> str:
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            return str(compose("train", overrides=[f"experiment={experiment}"]).method.name)
    finally:
        GlobalHydra.instance().clear()


def reproduce(profile: str, out_dir: Path, only: list[str] | None, launcher: str | None, train_args: list[str]) -> int:
    """Run every spec's missing cells, then build; returns the number of cells that are not done."""
    not_done = 0
    for spec_path in specs(only):
        from dpsyn.results.tables import load_spec

        spec = load_spec(spec_path)
        if not has_profile(spec.experiment, profile):
            print(f"[{spec.name}] no {profile} profile for {spec.experiment}: skipped")
            continue
        exp = experiment_for(spec.experiment, profile)
        cells = experiment_cells(exp, train_args)
        todo = [c for c in cells if c.status != "done"]
        print(f"[{spec.name}] experiment {exp}: {len(cells)} cells, {len(cells) - len(todo)} found, {len(todo)} to run")
        for i, c in enumerate(cells, 1):
            print(f"  cell {i}/{len(cells)} {' '.join(c.overrides)}: {c.status}")
        if todo:
            cmd = [sys.executable, str(REPO_DIR / "train.py"), "-m", f"experiment={exp}", "skip_existing=true", *train_args]
            if launcher:
                cmd.append(f"hydra/launcher={launcher}")
            print("  running:", " ".join(cmd[1:]), flush=True)
            rc = subprocess.run(cmd).returncode
            if rc:
                print(f"  the sweep exited with code {rc}: failed cells are listed below; the others are kept")
        for i, c in enumerate(cells, 1):
            if c in todo:
                print(f"  cell {i}/{len(cells)} {' '.join(c.overrides)}: {c.status}"
                      + (f" (see {c.run_dir / 'error.txt'})" if c.status == "failed" else ""))
        not_done += sum(c.status != "done" for c in cells)
        for path in build_tables(spec_path, profile, out_dir, cells):
            print(f"  wrote {path}")
    return not_done


def load_kept(source: Path | None) -> list[dict[str, Any]]:
    """Records to build from: results kept in the repo (``source``, e.g. experiments/) or, when None, every
    ``result.json`` under the sweeps' output folder."""
    from dpsyn.results import export, tables

    if source is not None:
        if not any(source.glob(f"*/{export.RESULTS_FILE}")):
            raise SystemExit(f"--from {source}: no */{export.RESULTS_FILE} there (write them with "
                             "`python -m dpsyn.cli.tables export`)")
        return export.load_records(source)
    return tables.scan_results(runs_root()) if runs_root().is_dir() else []


def evaluate_claims(records: list[dict[str, Any]], experiments_dir: Path = EXPERIMENTS_DIR) -> list[Any]:
    from dpsyn.results.claims import evaluate_all

    return evaluate_all(records, experiments_dir)


def write_claims(verdicts: list[Any], markdown: str, out_dir: Path) -> list[Path]:
    import json

    from dpsyn.results.io import atomic_write_text

    out_dir.mkdir(parents=True, exist_ok=True)
    return [atomic_write_text(out_dir / "claims.md", markdown),
            atomic_write_text(out_dir / "claims.json", json.dumps([v.to_dict() for v in verdicts], indent=1) + "\n")]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m dpsyn.cli.tables", description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name in ("reproduce", "build"):
        p = sub.add_parser(name)
        p.add_argument("--profile", default="embedded", choices=PROFILES)
        p.add_argument("--out", type=Path, default=Path("outputs/tables"))
        p.add_argument("--only", nargs="+", help="table specs to use (stem, paper/stem or paper); put it after the "
                       "train overrides, since it takes every word that follows")
        if name == "reproduce":
            p.add_argument("--launcher", default=None, help="hydra/launcher for the sweeps (basic, joblib, submitit_slurm, ray)")
            p.add_argument("--dry-run", action="store_true", help="list the cells, the finished ones and the time "
                           "the others will take (from finished cells' timings); run nothing")
            p.add_argument("train_args", nargs="*", help="extra overrides passed to every run (e.g. trainer=debug)")
        else:
            p.add_argument("--from", dest="source", type=Path, default=None,
                           help="build from the results kept in the repo (experiments/) instead of the runs")
    p = sub.add_parser("export", help="write finished runs' metrics into experiments/<paper>/results.csv")
    p.add_argument("run_dirs", type=Path, nargs="*", metavar="RUN_DIR",
                   help="single runs' directories (python train.py ... outside a sweep; each with its result.json and "
                   "config.yaml) to export, with --as; without any, every run under --runs")
    p.add_argument("--runs", type=Path, default=None, help="folder of the runs (default: $DPSYN_OUTPUT_DIR or "
                   "outputs, /experiments)")
    p.add_argument("--to", type=Path, default=EXPERIMENTS_DIR)
    p.add_argument("--as", dest="as_cells", metavar="EXPERIMENT:PROFILE", default=None,
                   help="keep single runs (train.py without experiment=) as the cells of EXPERIMENT's PROFILE they "
                   "reproduce; each run's config.yaml is checked against the cell's, and any difference refuses it. "
                   f"PROFILE {SINGLE_PROFILE!r}: keep them as themselves (variants, tuning runs, an older commit's "
                   "defaults), named by their directory in the run column; no table or claim reads them")
    p = sub.add_parser("protocols", help="fill the protocol column of experiments/*/results.csv where it is empty, "
                       "composing each run's config (rows written before protocol ids)")
    p.add_argument("--to", type=Path, default=EXPERIMENTS_DIR)
    p = sub.add_parser("claims", help="evaluate experiments/*/claims.yaml over seeds")
    p.add_argument("--from", dest="source", type=Path, default=None,
                   help="evaluate from the results kept in the repo (experiments/) instead of the runs")
    p.add_argument("--out", type=Path, default=Path("outputs/tables"))
    p = sub.add_parser("readme", help="rewrite the generated blocks of README.md and docs/ from the results kept in "
                       "the repo, the registry and the schemas")
    p.add_argument("--from", dest="source", type=Path, default=EXPERIMENTS_DIR)
    p.add_argument("--readme", type=Path, default=None, help="one file only (default: README.md and docs/**/*.md)")
    p.add_argument("--check", action="store_true",
                   help="exit 1 if a generated block of README.md or docs/ differs from what would be written")
    args = ap.parse_args(argv)
    try:
        require_checkout(f"python -m dpsyn.cli.tables {args.cmd}")
    except RuntimeError as e:
        raise SystemExit(f"dpsyn: {e}") from None
    if args.cmd == "reproduce":
        if args.dry_run:
            from dpsyn.results.export import load_records

            dry_run(args.profile, args.only, args.train_args, load_records(EXPERIMENTS_DIR))
            return
        not_done = reproduce(args.profile, args.out, args.only, args.launcher, args.train_args)
        print(f"tables and plots in {args.out}/" + (f"; {not_done} cells not done" if not_done else ""))
        sys.exit(1 if not_done else 0)
    if args.cmd == "export":
        from dpsyn.results import export, tables
        from dpsyn.results.io import read_json

        if args.run_dirs:
            if not args.as_cells:
                raise SystemExit("RUN_DIR ...: say which experiment the runs belong to, --as EXPERIMENT:PROFILE "
                                 f"(PROFILE {SINGLE_PROFILE!r} to keep them as single runs)")
            results = []
            for d in args.run_dirs:
                if (d / "result.json").is_file():
                    results.append({**read_json(d / "result.json"), "run_dir": str(d)})
                else:
                    print(f"skipped (no result.json: unfinished): {d}", file=sys.stderr)
            if not results:
                raise SystemExit("no finished run among the RUN_DIRs")
        else:
            root = args.runs or runs_root()
            results = tables.scan_results(root) if root.is_dir() else []
            if not results:
                raise SystemExit(f"no finished runs (result.json) under {root}")
        if args.as_cells:
            experiment, _, profile = args.as_cells.partition(":")
            if experiment not in export.experiment_papers(sorted(args.to.glob("*/*.yaml"))):
                raise SystemExit(f"--as {args.as_cells}: no table spec or claim under {args.to} names experiment "
                                 f"{experiment!r}, so its runs would be kept nowhere")
            try:
                if profile == SINGLE_PROFILE:
                    results = export.label_as_single(results, experiment)
                else:
                    results = export.label_as_cells(results, experiment, profile or "embedded")
            except ValueError as e:
                raise SystemExit(f"--as {args.as_cells}: {e}") from None
        for path, n in export.export(results, args.to).items():
            print(f"{path}: {n} runs written ({len(export.read_rows(path))} rows in all)")
        return
    if args.cmd == "protocols":
        from dpsyn.results.protocol import backfill

        done = backfill(args.to)
        for path, counts in done.items():
            print(f"{path}: " + ", ".join(f"{n} rows {pid}" for pid, n in sorted(counts.items())))
        if not done:
            print(f"every row under {args.to} has its protocol")
        return
    if args.cmd == "claims":
        verdicts = evaluate_claims(load_kept(args.source))
        from dpsyn.results.claims import render_markdown

        markdown = render_markdown(verdicts)
        print(markdown)
        for path in write_claims(verdicts, markdown, args.out):
            print(f"wrote {path}")
        return
    if args.cmd == "readme":
        from dpsyn.results.docs import doc_files
        from dpsyn.results.io import atomic_write_text

        records = load_kept(args.source)
        stale = []
        for path in ([args.readme] if args.readme else doc_files()):
            text = path.read_text()
            new = readme_blocks(text, records)
            if new == text:
                continue
            stale.append(path)
            if not args.check:
                atomic_write_text(path, new)
                print(f"rewrote the {len(README_BLOCK.findall(text))} generated blocks of {path}")
        if args.check:
            for path in stale:
                print(f"{path}: generated blocks differ from what {args.source} builds; run "
                      "`python -m dpsyn.cli.tables readme`")
            if stale:
                sys.exit(1)
            print(f"generated blocks match {args.source}")
        elif not stale:
            print("every generated block is up to date")
        return
    records = load_kept(args.source) if args.source is not None else None
    for spec_path in specs(args.only):
        experiment = load_spec_experiment(spec_path)
        cells = None
        if not has_profile(experiment, args.profile):
            # no sweep of this profile: only results kept in the repo can fill it (no missing-cell rows then)
            if records is None or not records_for(records, experiment, args.profile):
                continue
            cells = []
        for path in build_tables(spec_path, args.profile, args.out, cells=cells, records=records):
            print(f"wrote {path}")


def load_spec_experiment(spec_path: Path) -> str:
    from dpsyn.results.tables import load_spec

    return load_spec(spec_path).experiment


if __name__ == "__main__":
    main()
