"""The README and docs/ as a reader gets them: generated blocks fresh, every method and dataset listed, no dated
notebook text, every linked file present."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from dpsyn.cli import tables as cli_tables
from dpsyn.paths import REPO_DIR
from dpsyn.results import docs, export

EXPERIMENTS = REPO_DIR / "experiments"
README = REPO_DIR / "README.md"
DATE = re.compile(r"20[0-9][0-9]-[0-9][0-9]-[0-9][0-9]")
LINK = re.compile(r"!?\[[^\]]*\]\((?P<target>[^)#\s]*)(?:#(?P<anchor>[^)]*))?\)")


def slug(heading: str) -> str:
    """GitHub's anchor of a Markdown heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower().replace("`", ""))
    return text.replace(" ", "-")


def test_readme_fits_on_a_few_screens() -> None:
    assert len(README.read_text().splitlines()) <= 200


@pytest.mark.parametrize("path", docs.doc_files(), ids=lambda p: str(p.relative_to(REPO_DIR)))
def test_generated_blocks_are_fresh(path: Path) -> None:
    text = path.read_text()
    rebuilt = cli_tables.readme_blocks(text, export.load_records(EXPERIMENTS))
    assert rebuilt == text, f"{path.name}: generated blocks are stale: run `python -m dpsyn.cli.tables readme`"


@pytest.mark.parametrize("path", docs.doc_files(), ids=lambda p: str(p.relative_to(REPO_DIR)))
def test_docs_state_what_holds_without_dates(path: Path) -> None:
    for i, line in enumerate(path.read_text().splitlines(), 1):
        assert not DATE.search(line), f"{path.name}:{i}: a date (research logs go to experiments/<paper>/LOG.md)"
        assert "since the" not in line.lower(), f"{path.name}:{i}: 'since the' (state what holds now)"


@pytest.mark.parametrize("path", [*docs.doc_files(), *sorted(EXPERIMENTS.glob("*/LOG.md"))],
                         ids=lambda p: str(p.relative_to(REPO_DIR)))
def test_every_linked_file_exists(path: Path) -> None:
    for m in LINK.finditer(path.read_text()):
        target, anchor = m.group("target"), m.group("anchor")
        if "://" in target or target.startswith("mailto:"):
            continue
        file = path.parent / target if target else path
        assert file.exists(), f"{path.relative_to(REPO_DIR)} links {target}, which is missing"
        if anchor and file.suffix == ".md":
            anchors = {slug(h) for h in re.findall(r"^#+ (.*)$", file.read_text(), re.M)}
            assert anchor in anchors, f"{path.relative_to(REPO_DIR)} links {target}#{anchor}: no such heading"


def test_every_registered_method_and_dataset_is_in_the_generated_tables() -> None:
    from dpsyn.data import DATASETS
    from dpsyn.methods import METHODS

    facts = docs.load_facts()
    assert sorted(facts["methods"]) == METHODS.names() == docs.registered("method")
    assert DATASETS.names() == docs.registered("dataset")
    readme = README.read_text()
    for name in METHODS.names():
        assert f"| `{name}` |" in readme, f"method {name} missing from the README's methods table"
    datasets_page = (REPO_DIR / "docs" / "usage.md").read_text() + (REPO_DIR / "docs" / "config.md").read_text()
    for name in DATASETS.names():
        assert f"| `{name}` |" in datasets_page, f"dataset {name} missing from the docs' dataset table"
    config = (REPO_DIR / "docs" / "config.md").read_text()
    for name in METHODS.names():
        if name != "gan":  # gan runs privgan's schema
            assert f"`method={name}`" in config, f"method {name} missing from docs/config.md"
    for paper in facts["papers"]:
        assert (REPO_DIR / "docs" / "papers" / f"{paper}.md").is_file()


def test_the_methods_block_reads_the_store_and_the_facts() -> None:
    """The status column is computed from the records: change a record, the cell changes."""
    facts = {"methods": {"m": {"paper": "p", "what": "w", "releases": "r", "accountant": "a", "sampling": "s",
                               "caveat": "", "headline": {"experiment": "e", "method": "m", "dataset": "d",
                                                          "eps": 1, "metric": "acc"}}}, "papers": {}}
    recs = [{"experiment": "e", "profile": "embedded", "method": "m", "dataset": "d", "eps": 1.0, "seed": s,
             "overrides": [], "metrics": {"acc": v}} for s, v in enumerate((0.4, 0.5, 0.6))]
    block = docs.methods_block(recs, facts)
    assert "| `m` | [p](docs/papers/p.md) | w | r; a | 0.5 [0.252, 0.748] (n=3; acc, d eps=1) |" in block
    assert "not run yet" in docs.methods_block([], facts)
    recs.append({**recs[0], "overrides": ["method.lr=1"], "seed": 9, "metrics": {"acc": 0.0}})  # a variant: not a seed
    assert "(n=3;" in docs.methods_block(recs, facts)


def test_unknown_blocks_are_refused() -> None:
    with pytest.raises(ValueError, match="unknown"):
        cli_tables.readme_blocks("<!-- dpsyn:nonsense -->\nx\n<!-- dpsyn:end -->\n", [])


def test_the_audit_table_is_built_from_the_kept_audit(tmp_path: Path) -> None:
    from dpsyn.privacy.audit.runner import keep_rows

    rows = [{"mechanism": "m1", "what": "a release", "eps_claimed": 1.0, "eps_lower": 0.61, "trials": 4_000_000,
             "seconds": 30.0}, {"mechanism": "m2", "what": "votes", "eps_claimed": 0.5, "eps_lower": 0.2,
                                "trials": 500_000, "seconds": 30.0}]
    path = keep_rows(rows, confidence=0.95, path=tmp_path / "audit.csv", cpu="cpu x", git_sha="abcdef0123")
    block = docs.audit_block(path)
    assert "| `m1` | a release | 1.000 | 0.610 | 0.61 | 4M |" in block
    assert "| `m2` | votes | 0.500 | 0.200 | 0.40 | 500k |" in block
    assert "2 mechanisms, 95% family-wise confidence, 1.0 min of auditing on cpu x, code abcdef0" in block


def test_the_speed_table_is_built_from_the_kept_benchmark(tmp_path: Path) -> None:
    import importlib.util

    spec = importlib.util.spec_from_file_location("dpsgd_step_bench", REPO_DIR / "benchmarks" / "dpsgd_step.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    path = tmp_path / "speed.csv"
    bench.keep({"plain_ms": 40.0, "paired/fused": 1.25, "split/hooks": 2.0}, "paired/fused", batch=128, steps=30,
               path=path)
    block = docs.speed_block(path)
    assert "| `plain` | 40.0 ms, 1.00x |" in block
    assert "| `paired/fused` (default) | 50.0 ms, 1.25x |" in block and "| `split/hooks` | 80.0 ms, 2.00x |" in block
    assert "Batch 128, median of 30 rounds" in block


def test_a_kept_benchmark_is_rendered_from_its_csv(tmp_path: Path) -> None:
    from dpsyn.results.kept import keep_rows as keep

    path = keep("t", [{"teachers": 100, "training step": "3.0x"}, {"teachers": 1000, "training step": "2.4x"}],
                key=("teachers",), path=tmp_path / "t.csv")
    keep("t", [{"teachers": 100, "training step": "2.6x"}], key=("teachers",), path=path)  # replaces its row only
    block = docs.csv_block("t", data_dir=tmp_path)
    assert "| 1000 | 2.4x |" in block and "| 100 | 2.6x |" in block and "3.0x" not in block
    assert block.startswith("| teachers | training step |")
