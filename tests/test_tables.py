"""Table builder on synthetic result.json fixtures, experiment configs, resume logic, plots."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from PIL import Image

from dpsyn.cli import tables as cli_tables
from dpsyn.results import tables
from dpsyn.results.io import atomic_save_npz, atomic_write_json
from dpsyn.paths import REPO_DIR

SPEC = REPO_DIR / "experiments" / "dpimagebench" / "fmnist.yaml"


def _result(root: Path, method: str, eps: float, seed: int, acc: float, fd: float = 10.0, dataset: str = "fmnist") -> Path:
    run = root / method / dataset / f"eps{eps}" / f"seed{seed}"
    atomic_write_json(run / "result.json", {"method": method, "dataset": dataset, "eps": eps, "seed": seed,
                                           "metrics": {"acc": acc, "fd_fmnist": fd}})
    return run


@pytest.fixture
def spec() -> tables.TableSpec:
    return tables.load_spec(SPEC)


def test_cells_mean_std_and_counts(tmp_path: Path, spec: tables.TableSpec) -> None:
    for seed, acc in enumerate([0.5, 0.6, 0.7]):
        _result(tmp_path, "dp_gan", 1.0, seed, acc)
    _result(tmp_path, "dp_gan", math.inf, 0, 0.8)
    _result(tmp_path, "real", math.inf, 0, 0.9)
    _result(tmp_path, "dp_gan", 1.0, 0, 0.1, dataset="digits")  # another dataset: not selected
    acc = spec.metrics[0]
    cells = tables.build_cells(tables.scan_results(tmp_path), spec, acc)
    assert cells[("dp_gan", 1.0)].n == 3
    assert cells[("dp_gan", 1.0)].mean == pytest.approx(60.0)
    assert cells[("dp_gan", 1.0)].std == pytest.approx(10.0)  # sample std (n-1) of 50, 60, 70
    assert cells[("real", math.inf)].n == 1 and math.isnan(cells[("real", math.inf)].std)


def test_missing_cells_and_published_column(tmp_path: Path, spec: tables.TableSpec) -> None:
    _result(tmp_path, "dp_gan", 1.0, 0, 0.5)
    acc = spec.metrics[0]
    cells = tables.build_cells(tables.scan_results(tmp_path), spec, acc)
    expected = [("dp_gan", "10"), ("real", "inf"), ("dp_gan", "1")]
    header, body, notes = tables.table_rows(spec, acc, cells, expected)
    assert header[:3] == ["method", "eps=1", "eps=1 published[1]"]
    rows = {r[0]: r for r in body}
    assert rows["dp_gan"][1] == "50.0 (n=1)"
    assert rows["dp_gan"][2] == "71.8"  # DPImageBench, eps=1
    assert rows["dp_gan"][header.index("eps=10")] == tables.MISSING
    assert rows["real"][header.index("eps=inf")] == tables.MISSING
    assert any("DPImageBench" in n for n in notes)
    md = tables.render_markdown(header, body, notes, "t")
    assert "| dp_gan | 50.0 (n=1) | 71.8 |" in md
    csv_text = tables.render_csv(spec, acc, cells, expected)
    assert "dp_gan,1,acc,50,,1,71.8,10.53" in csv_text and "dp_gan,10,acc,,,0,70.3,60.98" in csv_text


def test_latex_escapes() -> None:
    assert tables.latex_escape("fd_fmnist 50% & #1 {x} ~ ^ $ \\") == (
        r"fd\_fmnist 50\% \& \#1 \{x\} \textasciitilde{} \textasciicircum{} \$ \textbackslash{}"
    )
    tex = tables.render_latex(["method", "eps=1"], [["dp_gan", "1.0 ± 0.1 (n=2)"]], ["note_1"], "T_1")
    assert r"dp\_gan & 1.0 $\pm$ 0.1 (n=2) \\" in tex and r"\caption{T\_1}" in tex and "note\\_1" in tex


def test_unreadable_result_is_skipped(tmp_path: Path) -> None:
    _result(tmp_path, "dp_gan", 1.0, 0, 0.5)
    bad = tmp_path / "broken" / "result.json"
    bad.parent.mkdir()
    bad.write_text('{"method": "dp_gan", "eps": ')  # a truncated file (not written by dpsyn's atomic writer)
    assert len(tables.scan_results(tmp_path)) == 1


def test_plots_are_real_images(tmp_path: Path, spec: tables.TableSpec) -> None:
    import numpy as np

    from dpsyn.results import plots

    runs = {}
    for m in ("dp_gan", "real"):
        for e in (0.1, 1.0, math.inf):
            for seed in (0, 1):
                run = _result(tmp_path / "runs", m, e, seed, 0.5 + 0.1 * seed + (0.2 if m == "real" else 0))
                atomic_save_npz(run / "samples.npz", x=np.random.default_rng(0).random((20, 1, 28, 28)).astype("float32"),
                                y=np.arange(20) % 10)
                runs[(m, e)] = run
    cells = tables.build_cells(tables.scan_results(tmp_path / "runs"), spec, spec.metrics[0])
    p1 = plots.privacy_utility_plot(spec, spec.metrics[0], cells, tmp_path / "curve.png")
    runs[("dp_gan", 10.0)] = tmp_path / "nowhere"
    p2 = plots.sample_mosaic(runs, tmp_path / "mosaic.png", title="t")
    for p in (p1, p2):
        with Image.open(p) as im:
            im.load()
            assert im.format == "PNG" and im.size[0] > 300 and im.size[1] > 200


@pytest.mark.parametrize("profile", [p if p == "embedded" else pytest.param(p, marks=pytest.mark.slow)
                                     for p in cli_tables.PROFILES])  # the paper profile's Table 1 cells: test_config
def test_every_experiment_composes_for_every_profile(profile: str) -> None:
    specs = cli_tables.specs()
    if profile == "quick":  # only the experiments the claims compare have a quick profile
        specs = [p for p in specs if cli_tables.has_profile(tables.load_spec(p).experiment, profile)]
        assert {tables.load_spec(p).experiment for p in specs} == {
            "wu2023_table1", "lin2023_fig4", "lin2023_ablation", "long2021_table1", "rajotte2020_grid"}
    if profile == "dib":  # DPImageBench's own settings: their spec only
        specs = [p for p in specs if cli_tables.has_profile(tables.load_spec(p).experiment, profile)]
        assert {tables.load_spec(p).experiment for p in specs} == {"dpimagebench_fmnist"}
    experiments = {cli_tables.experiment_for(tables.load_spec(p).experiment, profile): p for p in specs}
    for experiment, spec_path in experiments.items():  # specs may share an experiment: compose each once
        cells = cli_tables.experiment_cells(experiment)
        assert cells, spec_path
        dirs = {c.run_dir for c in cells}
        assert len(dirs) == len(cells), "two cells share a run directory"
        assert all(profile in str(d) and "${" not in str(d) for d in dirs)


def test_cell_status_and_resume_after_a_kill(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Finished cells (result.json) are found; a killed cell (no result.json) and a failed one (error.txt) are not."""
    monkeypatch.setenv("DPSYN_OUTPUT_DIR", str(tmp_path))
    cells = cli_tables.experiment_cells("dpimagebench_fmnist")
    assert len(cells) == 8 and all(c.status == "missing" for c in cells)
    done, killed, failed = cells[0], cells[1], cells[2]
    _result(done.run_dir.parent.parent.parent.parent, "x", 1.0, 0, 0.5)  # unrelated file: does not count
    atomic_write_json(done.run_dir / "result.json", {"method": "dp_gan"})
    (killed.run_dir).mkdir(parents=True)
    (killed.run_dir / "privacy.json").write_text("{}")  # a run killed after training: no result.json
    (failed.run_dir).mkdir(parents=True)
    (failed.run_dir / "error.txt").write_text("Traceback ...")
    assert [c.status for c in cells[:4]] == ["done", "missing", "failed", "missing"]
    assert cells[0].run_dir.is_relative_to(tmp_path / "experiments" / "dpimagebench_fmnist" / "embedded")


@pytest.mark.slow  # three CLI processes; the cell status and resume logic: test_cell_status_and_resume_after_a_kill
def test_reproduce_resumes_and_reruns_only_a_deleted_cell(
    tmp_path: Path, cache_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """End to end, two cheap cells: the first call runs both, the second trains nothing, a deleted cell alone re-runs."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "DPSYN_OUTPUT_DIR": str(tmp_path / "out"), "DPSYN_CACHE_DIR": str(cache_dir)}
    cmd = [sys.executable, "-m", "dpsyn.cli.tables", "reproduce", "--out", str(tmp_path / "tables"),
           "trainer=debug", "method=real", "eps=1,inf", "metrics.names.image=[fd]", "--only", "dpimagebench"]

    def reproduce() -> str:
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=REPO_DIR, timeout=600)
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
        return proc.stdout

    first = reproduce()
    # real is eps-free: the first cell trains and scores, the second reuses its result (reuse_eps_free_result)
    assert "2 cells, 0 found, 2 to run" in first and first.count("dpsyn: real on fmnist, seed 0") == 1
    assert first.count("does not depend on eps; result of") == 1
    second = reproduce()
    assert "2 cells, 2 found, 0 to run" in second and "dpsyn: real on fmnist" not in second
    monkeypatch.setenv("DPSYN_OUTPUT_DIR", env["DPSYN_OUTPUT_DIR"])
    cells = cli_tables.experiment_cells("dpimagebench_fmnist", ["method=real", "eps=1,inf"])
    assert len(cells) == 2 and all(c.status == "done" for c in cells)
    import shutil

    shutil.rmtree(cells[0].run_dir)
    third = reproduce()
    assert "2 cells, 1 found, 1 to run" in third and "result found, skipped" in third
    assert third.count("does not depend on eps; result of") == 1 and (cells[0].run_dir / "result.json").is_file()
    md = (tmp_path / "tables" / "dpimagebench_fmnist_embedded.md").read_text()
    assert "| real |" in md
    with Image.open(tmp_path / "tables" / "dpimagebench_fmnist_embedded_fd_fmnist.png") as im:
        im.load()


def test_owner_grid_table_and_figures(tmp_path: Path) -> None:
    """Rajotte & Ng's grid spec: rows from a dotted list field, methods as columns, published row, figures."""
    import numpy as np

    spec = tables.load_spec(REPO_DIR / "experiments" / "rajotte2020" / "grid_fmnist.yaml")
    assert not spec.privacy_utility and len(spec.figures) == 4
    runs = tmp_path / "runs"
    for method, bonus in (("privgan", 0.1), ("gan", 0.0)):
        for f0 in (0.01, 0.5):
            for f1 in (0.01, 0.05, 0.5):
                acc = 0.3 + f0 + f1 / 2 + bonus
                atomic_write_json(runs / method / f"{f0}_{f1}" / "result.json", {
                    "method": method, "dataset": "fmnist", "seed": 0,
                    "sample_provenance": {"owners": [f0, f1]},
                    "metrics": {"acc": acc, "acc_owner0": acc - 0.1, "mia_wb_acc_max": 0.2 - bonus,
                                "mia_wb_acc_mean": 0.15, "mia_wb_baseline": 0.1, "mia_mc_acc": 0.1}})
    records = tables.scan_results(runs)
    assert tables._field(records[0], "sample_provenance.owners") in {"0.01/0.01", "0.01/0.05", "0.01/0.5", "0.5/0.01",
                                                                     "0.5/0.05", "0.5/0.5"}
    assert tables._field(records[0], "sample_provenance.owners.5") is None
    acc = spec.metrics[0]
    cells = tables.build_cells(records, spec, acc)
    assert cells[("0.5/0.05", "privgan")].mean == pytest.approx(0.3 + 0.5 + 0.025 + 0.1)
    attack = next(m for m in spec.metrics if m.name == "mia_wb_acc_max")
    header, body, _ = tables.table_rows(spec, attack, tables.build_cells(records, spec, attack))
    pub = next(r for r in body if r[0].startswith("published"))
    assert pub[header.index("method=gan published[1]")] == "0.466"  # the notebook's FMNIST number
    written = cli_tables.build_tables(spec_path=REPO_DIR / "experiments" / "rajotte2020" / "grid_fmnist.yaml",
                                      profile="embedded", out_dir=tmp_path / "out",
                                      cells=[cli_tables.CellRun(("method=privgan",), p.parent)
                                             for p in runs.rglob("result.json")])
    names = {p.name for p in written}
    assert "rajotte2020_grid_fmnist_embedded_fig5_utility_heatmap.png" in names
    assert "rajotte2020_grid_fmnist_embedded_fig7_attack_vs_fraction.png" in names
    assert not any(n.endswith("_acc.png") for n in names)  # no privacy-utility curve for method columns
    img = np.asarray(Image.open(tmp_path / "out" / "rajotte2020_grid_fmnist_embedded_fig5_utility_heatmap.png"))
    assert img.shape[0] > 100 and img.std() > 10
    from dpsyn.results import plots

    assert plots.figure({"kind": "curve", "metric": "nope", "x": "f"}, records, tmp_path / "x.png") is None
    with pytest.raises(ValueError, match="unknown"):
        plots.figure({"kind": "pie", "metric": "acc"}, records, tmp_path / "y.png")


def test_sample_mosaics_are_for_images_only(tmp_path: Path) -> None:
    """Table rows (N, D) get no mosaic (the tabular table once crashed the build); images (N, C, H, W) do."""
    import numpy as np

    from dpsyn.results import plots

    table, image = tmp_path / "table", tmp_path / "image"
    atomic_save_npz(table / "samples.npz", x=np.random.rand(20, 30).astype(np.float32), y=np.zeros(20))
    atomic_save_npz(image / "samples.npz", x=np.random.rand(20, 1, 8, 8).astype(np.float32), y=np.zeros(20))
    assert not plots.has_image_samples({("g_pate", 1.0): table, ("real", 1.0): image})
    assert plots.has_image_samples({("missing", 1.0): tmp_path / "nowhere", ("g_pate", 1.0): image})
    assert not plots.has_image_samples({})



def test_select_with_a_list_matches_any_of_its_values(tmp_path: Path) -> None:
    """experiments/wu2023/table3.yaml selects one method and rows = datasets: only the listed datasets appear."""
    spec = tables.load_spec(REPO_DIR / "experiments" / "wu2023" / "table3.yaml")
    assert spec.select == {"method": "dp_dre", "dataset": ["fmnist_shoes", "fmnist_tops", "birds", "cars"]}
    for ds in ("fmnist_shoes", "digits", "fmnist_tops"):
        run = tmp_path / ds
        atomic_write_json(run / "result.json", {"method": "dp_dre", "dataset": ds, "eps": 1.0, "seed": 0,
                                               "metrics": {"dre_private_class_mass": 0.9}})
    atomic_write_json(tmp_path / "other" / "result.json", {"method": "dp_mge", "dataset": "fmnist_shoes", "eps": 1.0,
                                                           "seed": 0, "metrics": {"dre_private_class_mass": 0.1}})
    picked = tables.select_runs(tables.scan_results(tmp_path), spec)
    assert sorted(r["dataset"] for r in picked) == ["fmnist_shoes", "fmnist_tops"]
    plain = tables.TableSpec(name="t", title="t", experiment="e", select={"dataset": "digits"}, rows="method",
                             columns="eps", metrics=spec.metrics)
    assert [r["dataset"] for r in tables.select_runs(tables.scan_results(tmp_path), plain)] == ["digits"]


def test_a_cell_never_averages_two_protocols(spec: tables.TableSpec) -> None:
    """Runs of one cell scored two ways: the main protocol's fill it, the other's get a marked row of their own."""
    old, new = "dpsyn:small_cnn,x1,5ep,constant,n9000", "dpsyn:wrn_40_4,x5,5ep,constant,n9000"
    runs = [{"method": "dp_gan", "dataset": "fmnist", "eps": 1.0, "seed": s, "protocol": p, "metrics": {"acc": v}}
            for s, p, v in ((0, old, 0.5), (1, old, 0.6), (2, new, 0.9))]
    acc = spec.metrics[0]
    cells = tables.build_cells(runs, spec, acc)
    assert cells[("dp_gan", 1.0)] == tables.Cell(pytest.approx(55.0), pytest.approx(math.sqrt(50)), 2, old)
    assert cells[(f"dp_gan [{new}]", 1.0)].mean == pytest.approx(90.0) and cells[(f"dp_gan [{new}]", 1.0)].n == 1
    header, body, notes = tables.table_rows(spec, acc, cells)
    assert f"evaluation protocol: `{old}`; rows marked [...] were measured under another protocol" in notes[1]
    assert {r[0] for r in body} >= {"dp_gan", f"dp_gan [{new}]"}
    assert tables.render_csv(spec, acc, cells).splitlines()[0].endswith(",protocol")
    # one protocol: named under the table, no marked rows
    one = tables.build_cells(runs[:2], spec, acc)
    assert list(one) == [("dp_gan", 1.0)] and tables.table_rows(spec, acc, one)[2][1] == f"evaluation protocol: `{old}`"
