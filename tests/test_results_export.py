"""Results kept in the repo: export of finished runs to results.csv, re-export replaces, tables rebuilt from it,
the README's generated blocks, the reproduce dry run."""

from __future__ import annotations

import csv
import os
from pathlib import Path

import pytest

from dpsyn.cli import tables as cli_tables
from dpsyn.paths import REPO_DIR
from dpsyn.results import export, tables
from dpsyn.results.io import atomic_write_json

EXPERIMENTS = REPO_DIR / "experiments"


def _run(root: Path, method: str, seed: int, acc: float, *, experiment: str = "rajotte2020_grid", owners=(0.05, 0.5),
         overrides: tuple[str, ...] = (), total_s: float = 60.0) -> dict:
    run = root / experiment / method / f"{owners[0]}_{owners[1]}" / f"seed{seed}{'_'.join(overrides)}"
    rec = {"method": method, "dataset": "digits", "eps": float("inf"), "seed": seed, "experiment": experiment,
           "profile": "quick", "epsilon_spent": float("inf"), "accountant": "non-private",
           "metrics": {"acc": acc, "acc_owner0": acc / 2, "mia_wb_acc_max": 0.3, "broken": float("nan")},
           "sample_provenance": {"owners": list(owners)}, "timings": {"total_s": total_s}, "git_sha": "abc",
           "overrides": [f"experiment={experiment}_quick", "skip_existing=true", "paths.output_dir=/x",
                         f"method={method}", f"f0={owners[0]}", f"f1={owners[1]}", "seed=%d" % seed, *overrides]}
    atomic_write_json(run / "result.json", rec)
    return rec


def test_export_writes_long_rows_and_a_rerun_replaces_its_rows(tmp_path: Path) -> None:
    runs, out = tmp_path / "runs", tmp_path / "experiments"
    (out / "rajotte2020").mkdir(parents=True)
    (out / "rajotte2020" / "grid.yaml").write_text((EXPERIMENTS / "rajotte2020" / "grid_digits.yaml").read_text())
    _run(runs, "privgan", 0, 0.6)
    _run(runs, "gan", 0, 0.4)
    _run(runs, "privgan", 0, 0.7, overrides=("method.epochs=5",))  # a variant: its own hash, its own rows
    _run(runs, "gan", 0, 0.9, experiment="tune_gan_digits_eps1.0")  # a tuning trial: no table or claim reads it
    written = export.export(tables.scan_results(runs), out)
    assert list(written) == [out / "rajotte2020" / "results.csv"] and not (out / "tune_gan").exists()
    rows = export.read_rows(out / "rajotte2020" / "results.csv")
    assert len(rows) == 3 * 3  # NaN metrics are not rows
    variant = {r["overrides_hash"] for r in rows if r["overrides"] == "f0=0.05 f1=0.5 method.epochs=5"}
    plain = {r["overrides_hash"] for r in rows if r["overrides"] == "f0=0.05 f1=0.5"}
    assert len(variant) == len(plain) == 1 and variant != plain  # plumbing (paths, skip_existing) is not hashed
    assert all(r["accountant"] == "non-private" and r["eps"] == "inf" and r["git_sha"] == "abc" and r["date"] for r in rows)
    # re-run one cell: its rows are replaced, the others kept
    _run(runs, "gan", 0, 0.45)
    export.export(tables.scan_results(runs), out)
    rows2 = export.read_rows(out / "rajotte2020" / "results.csv")
    assert len(rows2) == len(rows)
    assert [r["value"] for r in rows2 if r["method"] == "gan" and r["metric"] == "acc"] == ["0.45"]
    # a new seed appends
    _run(runs, "gan", 1, 0.5)
    export.export([tables.scan_results(runs)[0]] + [r for r in tables.scan_results(runs) if r["seed"] == 1], out)
    assert len(export.read_rows(out / "rajotte2020" / "results.csv")) == len(rows) + 3


def test_a_table_rebuilt_from_results_csv_equals_the_one_from_the_runs(tmp_path: Path) -> None:
    runs, out = tmp_path / "runs", tmp_path / "experiments"
    (out / "rajotte2020").mkdir(parents=True)
    spec_path = out / "rajotte2020" / "grid_digits.yaml"
    spec_path.write_text((EXPERIMENTS / "rajotte2020" / "grid_digits.yaml").read_text())
    for seed in range(3):
        for owners in ((0.05, 0.5), (0.5, 0.5)):
            _run(runs, "privgan", seed, 0.5 + 0.01 * seed + owners[0] / 10, owners=owners)
            _run(runs, "gan", seed, 0.3 + 0.02 * seed, owners=owners)
    from_runs = tables.scan_results(runs)
    export.export(from_runs, out)
    kept = export.load_records(out)
    spec = tables.load_spec(spec_path)  # rows: sample_provenance.owners (kept in the fields column)
    for metric in spec.metrics[:2]:
        a = tables.build_cells(from_runs, spec, metric)
        b = tables.build_cells(kept, spec, metric)
        assert a and a.keys() == b.keys()
        for k in a:
            assert (a[k].mean, a[k].n) == pytest.approx((b[k].mean, b[k].n))
        assert tables.render_markdown(*tables.table_rows(spec, metric, a), "t") == \
            tables.render_markdown(*tables.table_rows(spec, metric, b), "t")


def test_the_docs_generated_blocks_match_what_experiments_builds() -> None:
    from dpsyn.results.docs import doc_files

    texts = {p: p.read_text() for p in doc_files()}
    joined = "".join(texts.values())
    assert "<!-- dpsyn:claims" in joined and "<!-- dpsyn:table " in joined and "<!-- dpsyn:methods -->" in joined
    records = export.load_records(EXPERIMENTS)
    for path, text in texts.items():
        assert cli_tables.readme_blocks(text, records) == text, \
            f"{path.name}'s generated blocks are stale: run `python -m dpsyn.cli.tables readme`"


def test_readme_blocks_are_rewritten_from_records() -> None:
    text = "a\n<!-- dpsyn:table rajotte2020/grid_digits quick acc -->\nold\n<!-- dpsyn:end -->\nb\n"
    recs = [{"experiment": "rajotte2020_grid", "profile": "quick", "method": "gan", "seed": 0,
             "fields": {"sample_provenance.owners": "0.5/0.5", "dataset": "digits"}, "dataset": "digits",
             "metrics": {"acc": 0.25}}]
    new = cli_tables.readme_blocks(text, recs)
    assert "old" not in new and "0.250 (n=1)" in new and new.startswith("a\n") and new.endswith("<!-- dpsyn:end -->\nb\n")
    with pytest.raises(ValueError, match="unknown"):
        cli_tables.readme_blocks("<!-- dpsyn:nonsense -->\nx\n<!-- dpsyn:end -->\n", recs)


def test_dry_run_counts_finished_cells_and_estimates_from_their_timings(tmp_path: Path, monkeypatch,
                                                                          capsys: pytest.CaptureFixture) -> None:
    monkeypatch.setenv("DPSYN_OUTPUT_DIR", str(tmp_path))
    cells = cli_tables.experiment_cells("rajotte2020_grid_quick")
    assert len(cells) == 12 and all(str(c.run_dir).startswith(str(tmp_path)) for c in cells)
    for c, sec in zip([c for c in cells if "method=gan" in c.overrides][:2], (600.0, 1200.0)):
        atomic_write_json(c.run_dir / "result.json", {"method": "gan", "timings": {"total_s": sec}})
    total = cli_tables.dry_run("quick", ["rajotte2020/grid_digits"], [])
    out = capsys.readouterr().out
    assert "12 cells, 2 finished, 10 to run" in out
    # 4 gan cells left at the gan median (900 s); 6 privgan cells: no privgan timing, and a gan timing never stands
    # in for another method: counted as unknown
    assert total == pytest.approx(4 * 900.0)
    assert "gan: 2/6 finished, 15.0 min a cell" in out
    assert "(6 cells without a timing to go by)" in out and "privgan: 0/6 finished\n" in out
    assert os.environ["DPSYN_OUTPUT_DIR"] == str(tmp_path)


def test_dry_run_never_estimates_a_profile_from_another_profiles_timings(tmp_path: Path, monkeypatch,
                                                                           capsys: pytest.CaptureFixture) -> None:
    """A kept embedded dp_gan run (minutes) must not estimate a dib cell (DPImageBench's length, hours), nor a dib
    dp_gan run (1.5-2.6 h) a dib gs_wgan cell (a 64-291 h warm start on one CPU core)."""
    monkeypatch.setenv("DPSYN_OUTPUT_DIR", str(tmp_path))
    kept = [{"method": "dp_gan", "profile": "embedded", "timings": {"total_s": 200.0}}]
    assert cli_tables.dry_run("dib", ["dpimagebench/fmnist"], [], kept) == 0.0
    out = capsys.readouterr().out
    assert "4 cells, 0 finished, 4 to run (4 cells without a timing to go by)" in out
    kept.append({"method": "dp_gan", "profile": "dib", "timings": {"total_s": 7200.0}})
    assert cli_tables.dry_run("dib", ["dpimagebench/fmnist"], [], kept) == pytest.approx(2 * 7200.0)
    out = capsys.readouterr().out
    assert "(2 cells without a timing to go by)" in out and "gs_wgan: 0/2 finished\n" in out
    # a finished dib dp_gan cell in outputs/ does not estimate the gs_wgan cells either
    done = next(c for c in cli_tables.experiment_cells("dpimagebench_fmnist_dib") if "method=dp_gan" in c.overrides)
    atomic_write_json(done.run_dir / "result.json", {"method": "dp_gan", "timings": {"total_s": 5000.0}})
    assert cli_tables.dry_run("dib", ["dpimagebench/fmnist"], [], kept) == pytest.approx(5000.0)


def test_build_from_kept_results_writes_the_tables_the_readme_shows(tmp_path: Path) -> None:
    cli_tables.main(["build", "--from", str(EXPERIMENTS), "--profile", "quick", "--out", str(tmp_path),
                     "--only", "wu2023/table1_fmnist_shoes"])
    md = (tmp_path / "wu2023_table1_fmnist_shoes_quick.md").read_text()
    block = cli_tables.metric_table("wu2023/table1_fmnist_shoes", "quick", "fd_fmnist",
                                    export.load_records(EXPERIMENTS))
    assert block.split("\n", 1)[1] in md  # the FD table (under its title) is the file's first table
    assert not list(tmp_path.glob("*_samples.png"))  # no samples are kept, so no mosaic


def test_runs_go_to_the_paper_whose_table_names_their_experiment() -> None:
    papers = export.experiment_papers(sorted(EXPERIMENTS.glob("*/*.yaml")))
    # lin2023's claims compare with wu2023_table1's cells: those rows stay in wu2023/results.csv
    assert papers["wu2023_table1"] == "wu2023" and papers["lin2023_fig4"] == "lin2023"
    assert papers["rajotte2020_grid"] == "rajotte2020" and papers["long2021_table1"] == "long2021"
    for path in EXPERIMENTS.glob("*/results.csv"):  # and the kept files agree
        assert {r["experiment"] for r in export.read_rows(path)} <= {e for e, p in papers.items()
                                                                       if p == path.parent.name}, path


def _single_run(tmp_path: Path, name: str, overrides: list[str]) -> dict:
    """A finished single run's record and config.yaml, as train.py writes them (without training)."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from omegaconf import OmegaConf

    from dpsyn.paths import CONF_DIR

    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            cfg = compose("train", overrides=overrides)
    finally:
        GlobalHydra.instance().clear()
    run = tmp_path / name
    run.mkdir()
    kept = {k: OmegaConf.to_container(cfg[k], resolve=True) if OmegaConf.is_config(cfg[k]) else cfg[k]
            for k in export.CELL_SECTIONS}
    (run / "config.yaml").write_text(OmegaConf.to_yaml(OmegaConf.create(kept)))
    coords = dict(o.split("=", 1) for o in overrides if o.split("=", 1)[0] in ("method", "dataset", "eps", "seed"))
    return {"experiment": None, "profile": None, "method": coords["method"], "dataset": coords["dataset"],
            "eps": float(coords["eps"]), "seed": int(coords["seed"]), "overrides": overrides, "run_dir": str(run),
            "metrics": {"acc": 0.5}}


def test_single_runs_are_kept_as_cells_only_when_their_config_is_the_cell(tmp_path: Path) -> None:
    cell = ["method=g_pate", "dataset=fmnist", "eps=1", "seed=0"]
    same = _single_run(tmp_path, "same", [*cell, "metrics.names.image=[fd,acc,prdc]"])
    (rec,) = export.label_as_cells([same], "long2021_table1", "embedded")
    assert (rec["experiment"], rec["profile"]) == ("long2021_table1", "embedded")
    assert export.overrides_hash(rec["overrides"]) == "base"  # the plain cell, not a variant
    # a setting the cell does not have, hidden from the overrides (as a changed default would be)
    other = _single_run(tmp_path, "other", [*cell, "method.lr_g=0.1"])
    other["overrides"] = cell
    with pytest.raises(ValueError, match=r"differs in method\.lr_g"):
        export.label_as_cells([other], "long2021_table1", "embedded")
    # fewer metrics than the cell's: refused (a table would miss them)
    fewer = _single_run(tmp_path, "fewer", [*cell, "metrics.names.image=[fd]"])
    with pytest.raises(ValueError, match="metrics.names.image"):
        export.label_as_cells([fewer], "long2021_table1", "embedded")
    # a variant keeps its override, so it stays a variant of the cell
    variant = _single_run(tmp_path, "variant", [*cell, "method.lr_g=0.1"])
    (rec,) = export.label_as_cells([variant], "long2021_table1", "embedded")
    assert export.overrides_hash(rec["overrides"]) != "base"
    with pytest.raises(ValueError, match="already a cell"):
        export.label_as_cells([{**same, "experiment": "x"}], "long2021_table1", "embedded")


def test_a_single_run_is_exported_from_its_directory_as_itself_or_as_its_cell(make_cfg, tmp_path: Path, monkeypatch,
                                                                              capsys) -> None:
    """`tables export RUN_DIR ... --as EXPERIMENT:PROFILE`: the runs of a plain `python train.py ...` command kept in
    the store (what experiments/long2021/measured/collect.py did in a second format). As ``single``, each run is kept
    as itself, named by its directory (two runs of one command stay two); as a profile, the run is checked against
    the cell and kept as it, without a name (a re-run replaces it)."""
    import shutil

    import dpsyn.task
    from tests.tiny import TINY

    overrides = ["trainer=debug", *TINY["g_pate"], "eps=1", "seed=0"]
    monkeypatch.setattr(dpsyn.task, "task_overrides", lambda: list(overrides))  # what train.py's Hydra records
    run_dir = tmp_path / "runs" / "gp_tiny_s0"
    dpsyn.task.run(make_cfg(*overrides), run_dir)
    result = tables.scan_results(run_dir)[0]
    to = tmp_path / "experiments"
    (to / "long2021").mkdir(parents=True)
    for spec in (EXPERIMENTS / "long2021").glob("*.yaml"):
        shutil.copy(spec, to / "long2021")
    store = to / "long2021" / export.RESULTS_FILE

    with pytest.raises(SystemExit, match="--as EXPERIMENT:PROFILE"):
        cli_tables.main(["export", str(run_dir), "--to", str(to)])
    with pytest.raises(SystemExit, match="names experiment 'nope'"):
        cli_tables.main(["export", str(run_dir), "--as", "nope:single", "--to", str(to)])
    unfinished = tmp_path / "runs" / "unfinished"
    unfinished.mkdir()
    cli_tables.main(["export", str(run_dir), str(unfinished), "--as", "long2021_tabular:single", "--to", str(to)])
    assert "skipped (no result.json: unfinished)" in capsys.readouterr().err
    rows = export.read_rows(store)
    metrics = {k for k, v in result["metrics"].items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
    assert metrics and {r["metric"] for r in rows} == metrics
    (key,) = {tuple(r[k] for k in ("experiment", "profile", "method", "dataset", "eps", "seed", "run")) for r in rows}
    assert key == ("long2021_tabular", "single", "g_pate", "breast_cancer", "1.0", "0", "gp_tiny_s0")
    assert {r["overrides"] for r in rows} == {" ".join(export.kept_overrides(overrides))}
    assert {r["protocol"] for r in rows} == {result["protocol"]} and result["protocol"].startswith("dpsyn:tabular")

    # exported again: its rows replaced; the same command run again (another directory): a second run, not a seed
    again = tmp_path / "runs" / "gp_tiny_s0_again"
    shutil.copytree(run_dir, again)
    cli_tables.main(["export", str(run_dir), str(again), "--as", "long2021_tabular:single", "--to", str(to)])
    assert len(export.read_rows(store)) == 2 * len(rows)
    recs = export.load_records(to)
    assert sorted(r["run"] for r in recs) == ["gp_tiny_s0", "gp_tiny_s0_again"]
    assert not tables.records_for(recs, "long2021_tabular", "embedded")  # no table or claim reads single runs

    # as the cell it reproduces: checked against the cell's config, kept without a name beside the single runs
    cli_tables.main(["export", str(run_dir), "--as", "long2021_tabular:embedded", "--to", str(to)])
    cells = tables.records_for(export.load_records(to), "long2021_tabular", "embedded")
    assert [(c["run"], c["seed"], c["protocol"]) for c in cells] == [("", 0, result["protocol"])]


def test_every_csv_under_experiments_is_a_results_file_with_the_store_columns() -> None:
    """One results store: a CSV under experiments/ is read as results, so every one has the store's columns (a file
    written before a column was added lacks only that one, read empty: ``_ADDED_COLUMNS``). Other kept data, such as
    training snapshots (``*.snapshots.tsv``) and classifier studies (``*.study.tsv``), take another extension."""
    paths = sorted(EXPERIMENTS.rglob("*.csv"))
    assert paths
    for path in paths:
        with open(path, newline="") as f:
            header = tuple(next(csv.reader(f), ()))
        name = path.relative_to(REPO_DIR)
        assert header == tuple(c for c in export.COLUMNS if c in header), (
            f"{name}: not the results store's columns {export.COLUMNS} (a file of another kind takes another "
            f"extension, e.g. .study.tsv): {header}")
        assert set(export.COLUMNS) - set(header) <= set(export._ADDED_COLUMNS), f"{name}: lacks columns"
        assert export.read_rows(path), f"{name}: no rows"
    assert not list((EXPERIMENTS / "long2021" / "measured").glob("*.csv"))  # no second format beside the store
