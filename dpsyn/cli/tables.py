"""``python -m dpsyn.cli.tables``: run the table sweeps (resuming), then build tables and plots from the runs.

``reproduce --profile embedded|paper``: for each table spec in ``experiments/``, list its cells (from the
experiment's ``hydra.sweeper.params``), run the missing ones as one Hydra multirun with ``skip_existing=true`` (a
cell whose ``result.json`` exists is not trained again; a failing cell is reported and the others go on), then build.
``build``: only rebuild tables and plots from the runs on disk.
"""

from __future__ import annotations

import argparse
import itertools
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dpsyn.paths import CONF_DIR, REPO_DIR

EXPERIMENTS_DIR = REPO_DIR / "experiments"
PROFILES = ("embedded", "quick", "paper")


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
    """The experiment config of a profile: ``<name>`` (embedded) or ``<name>_paper``."""
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
    paths = sorted(EXPERIMENTS_DIR.glob("*/*.yaml"))
    if only:
        paths = [p for p in paths if p.stem in only or f"{p.parent.name}/{p.stem}" in only or p.parent.name in only]
    return paths


def build_tables(spec_path: Path, profile: str, out_dir: Path, cells: list[CellRun] | None = None) -> list[Path]:
    """Render one spec's tables (Markdown, LaTeX, CSV) and plots (privacy-utility per metric, sample mosaic)."""
    from dpsyn.results import plots, tables
    from dpsyn.results.io import atomic_write_text

    spec = tables.load_spec(spec_path)
    exp = experiment_for(spec.experiment, profile)
    cells = cells if cells is not None else experiment_cells(exp)
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
        seed0.setdefault((str(tables._field(r, spec.rows)), tables._key(tables._field(r, spec.columns))), Path(r["run_dir"]))
    if seed0 and plots.has_image_samples(seed0):  # tables: no sample mosaic
        written.append(plots.sample_mosaic(seed0, out_dir / f"{stem}_samples.png", title=spec.title))
    return written


def reproduce(profile: str, out_dir: Path, only: list[str] | None, launcher: str | None, train_args: list[str]) -> int:
    """Run every spec's missing cells, then build; returns the number of cells that are not done."""
    not_done = 0
    for spec_path in specs(only):
        from dpsyn.results.tables import load_spec

        spec = load_spec(spec_path)
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
            p.add_argument("train_args", nargs="*", help="extra overrides passed to every run (e.g. trainer=debug)")
    args = ap.parse_args(argv)
    if args.cmd == "reproduce":
        not_done = reproduce(args.profile, args.out, args.only, args.launcher, args.train_args)
        print(f"tables and plots in {args.out}/" + (f"; {not_done} cells not done" if not_done else ""))
        sys.exit(1 if not_done else 0)
    for spec_path in specs(args.only):
        for path in build_tables(spec_path, args.profile, args.out):
            print(f"wrote {path}")


if __name__ == "__main__":
    main()
