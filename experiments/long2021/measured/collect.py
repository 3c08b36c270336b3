"""Collect finished runs' result.json files into one CSV row each (the rows behind README's paper-002 section), so
that the numbers survive the machine: `outputs/` is not kept.

    python experiments/long2021/measured/collect.py OUT.csv RUN_DIR [RUN_DIR ...]

Each row: what ran (method, dataset, eps, seed, the command-line overrides, G-PATE's projection and the teacher or
critic count from the run's config.yaml: defaults change, the git sha says which), what it spent
(epsilon, the accountant and bound, rounds or iterations), what it scored (downstream accuracy, FD, and PRDC where
the run was scored with it, and on which split: ``eval``, the sealed test split, or ``validation``, rows carved from
the private training set, the only split a setting may be chosen on) and how long it took (wall seconds, CPU
model). Rows already in OUT.csv for the same run directory name are replaced.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from pathlib import Path

from dpsyn.machine import cpu_model

PRDC = ("precision", "recall", "density", "coverage")  # where the run was scored with prdc (empty otherwise)
FIELDS = ["run", "method", "dataset", "eps", "seed", "overrides", "projection", "teachers", "metrics_split", "acc", "fd",
          *PRDC,
          "epsilon_spent", "accountant", "bound", "aggregate", "rounds", "answered_rate", "fit_s", "wall_s", "cpu", "git_sha"]


def accountant(r: dict) -> str:
    """The run's accountant, and what the method says it charged where it says more (gs_wgan: one step an
    iteration)."""
    said = (r.get("sample_provenance") or {}).get("accountant")
    return "; ".join(a for a in (r.get("accountant", ""), said) if isinstance(a, str) and a)


def row(run_dir: Path) -> dict[str, object]:
    r = json.loads((run_dir / "result.json").read_text())
    prov = r.get("sample_provenance") or {}
    metrics = r.get("metrics") or {}
    over = " ".join(o for o in r.get("overrides") or [] if not o.startswith(("logger=", "hydra.")))
    method_cfg = {}
    if (run_dir / "config.yaml").exists():
        import yaml

        method_cfg = (yaml.safe_load((run_dir / "config.yaml").read_text()) or {}).get("method") or {}
    fd = next((v for k, v in metrics.items() if k.startswith("fd")), "")
    timings = r.get("timings") or {}
    return {
        "run": run_dir.name, "method": r.get("method"), "dataset": r.get("dataset"), "eps": r.get("eps"),
        "seed": r.get("seed"), "overrides": over,
        "projection": method_cfg.get("projection", ""),
        "teachers": method_cfg.get("teachers", method_cfg.get("critics", "")),
        "metrics_split": r.get("metrics_split") or "eval", "acc": metrics.get("acc", ""), "fd": fd,
        **{k: metrics.get(k, "") for k in PRDC},
        "epsilon_spent": r.get("epsilon_spent"), "accountant": accountant(r),
        "bound": prov.get("bound", ""), "aggregate": prov.get("aggregate", ""),
        "rounds": prov.get("steps", prov.get("iterations", "")), "answered_rate": round(prov["answered"] / prov["queries"], 3) if prov.get("queries") else "",
        "fit_s": round(float(timings.get("fit_s", 0) or 0), 1),
        "wall_s": round(float(timings.get("total_s", 0) or 0), 1), "cpu": cpu_model(),
        "git_sha": r.get("git_sha", "") + ("-dirty" if r.get("git_dirty") else ""),
    }


def main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path, help="the CSV to write (rows of the same run directory name are replaced)")
    ap.add_argument("run_dirs", type=Path, nargs="+", help="finished run directories (with result.json)")
    args = ap.parse_args(argv)  # an option such as --help is never taken for the output file
    out, dirs = args.out, args.run_dirs
    rows = {}
    if out.exists():
        with out.open() as f:
            rows = {r["run"]: r for r in csv.DictReader(f)}
    for d in dirs:
        if (d / "result.json").exists():
            rows[d.name] = row(d)
        else:
            print(f"skipped (no result.json: unfinished): {d}", file=sys.stderr)
    with out.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=FIELDS)
        w.writeheader()
        for key in sorted(rows):
            w.writerow(rows[key])
    print(f"{len(rows)} rows in {out}")


if __name__ == "__main__":
    main(sys.argv[1:])
