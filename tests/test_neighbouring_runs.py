"""Nothing published is computed from private rows without noise (issue 15, part 4; docs/published-fields.md).

Each method runs twice in this process on neighbouring private sets (the second without one private row: the last
by default; the partitioned methods, whose privacy rests on a row reaching one teacher or critic, also without the
first, a middle and a random row),
with ``privacy.deterministic_noise=true`` and the same seeds. Everything the run publishes is then compared leaf by
leaf: result.json and privacy.json (walked recursively), config.yaml, the files of the run directory, the CSV
logger's columns and values, and the checkpoints' keys and non-tensor values (tensors and arrays by dtype and shape:
their values are the DP-trained models, or state derived from them). Apart from a short, named whitelist — the DP
outputs and what derives from them (metrics of the samples, losses of the DP-trained models, their checkpoints), and
fields derived from the declared-public private row count n — no published field may differ. A new field computed
from private rows without noise differs between the two runs, and fails the test.

The count of private feature rows clipped to the unit ball (once published by dp_mge and dp_dre) is 0 with the
shipped encoders, so neighbouring runs could not tell it apart: the dp_mge and dp_dre cases run with an encoder that
puts every feature outside the unit ball, so that such a count (n) would differ.

Two checks need no comparison: no checkpoint holds a ``torch.Generator`` (the DP noise and Poisson-sampling
streams are secret), and the teachers and critics (``Method.unreleased_checkpoint_keys``) are gone from the training
checkpoints once the run is over.

The every-method test is slow (``make test-full``); ``make test`` keeps the dp_mge case.
"""

from __future__ import annotations

import csv
import dataclasses
import fnmatch
import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from omegaconf import DictConfig, OmegaConf, open_dict

from tests.conftest import compose_cfg, run_context
from tests.tiny import IMAGE_METRICS, SHOES, TINY_PUBLIC

BASE = ("trainer=debug", "eps=1", "privacy.deterministic_noise=true", "trainer.enable_progress_bar=false")
PATE_GAN = ("method=pate_gan", "method.teachers=10", "method.batch_size=4", "method.teacher_batch=2",
            "method.sigma_threshold=100", "method.sigma=50", "method.threshold=5", "method.ndf=2", "method.student_ndf=4",
            "method.z_dim=8", "method.ngf=4", "method.teacher_chunk=null", "method.checkpoint_every=1", *IMAGE_METRICS)

# method -> tiny overrides (those of the methods' own tests)
CASES: dict[str, tuple[str, ...]] = {
    "dp_gan": ("method=dp_gan", "method.checkpoint_every=2", *IMAGE_METRICS),
    "dp_gan_ft": ("method=dp_gan_ft", *SHOES, "method.pretrain_steps=10", "method.max_public=400",
                  "method.checkpoint_every=2"),
    "dp_gan_mi": ("method=dp_gan_mi", *SHOES, "method.checkpoint_every=2"),
    "dp_dre": ("method=dp_dre", *SHOES, "method.public_pool=600"),
    "dp_mge": ("method=dp_mge", *SHOES),
    "dp_mepf": ("method=dp_mepf", *SHOES, "method.steps=3", "method.batch_size=12"),
    "pe": ("method=pe", "dataset=fmnist_shoes", *TINY_PUBLIC, "method.population=60", "method.degrees=[0.6,0.4,0.3]",
           "method.lookahead=1", "method.threshold=1.0", "dataset.n_private=300", "metrics.n_real=300",
           *IMAGE_METRICS),
    "g_pate": ("method=g_pate", "dataset=fmnist", "method.teachers=20", "method.batch_size=4",
               "method.projection_dim=2", "method.sigma_threshold=100", "method.sigma=50", "method.threshold=10",
               "method.teacher_arch=conv", "method.ndf=2", "method.z_dim=8", "method.ngf=4",
               "method.checkpoint_every=1", *IMAGE_METRICS),
    "pate_gan": PATE_GAN,
    "gs_wgan": ("method=gs_wgan", "method.critics=20", "method.batch_size=4", "method.critic_steps=1", "method.ndf=2",
                "method.ngf=4", "method.z_dim=8", "method.iterations=6", "method.checkpoint_every=1", *IMAGE_METRICS),
    # reads no private data: nothing but n may differ
    "public_uniform": ("method=public_uniform", *SHOES, "method.public_pool=600"),
}
FAST_CASE = "dp_mge"
PARTITIONED = ("g_pate", "pate_gan", "gs_wgan")  # their privacy rests on one row reaching one teacher or critic
# non-private by declaration (a NonPrivateEvent in the ledger, non_private_reference in result.json): not compared
REFERENCES: dict[str, tuple[str, ...]] = {
    "real": ("method=real", *IMAGE_METRICS),
    "gan": ("method=gan", "method.owners=[0.01,0.02]", "method.attack.per_owner_utility=0", *IMAGE_METRICS),
    "privgan": ("method=privgan", "method.owners=[0.01,0.02]", "method.attack.per_owner_utility=0", *IMAGE_METRICS),
    "icgan_nonprivate": ("method=icgan_nonprivate", *SHOES),
}
# methods whose private features go through clip_to_unit_ball: run with an encoder whose features all need clipping
CLIPPING_ENCODER = {"dp_mge", "dp_dre", "dp_mepf"}

# ---- the whitelist: published fields that may differ between neighbouring runs (fnmatch patterns on dotted paths)
ALWAYS = {
    # not data: wall-clock times, where the run was written
    "result.json:timings.*": "wall-clock times",
    "result.json:run_dir": "the run directory",
    "*fit_s": "wall-clock time of fit",
    "*fit_seconds": "wall-clock time of fit",
    "*warm_start_s": "wall-clock time of gs_wgan's warm start",
    # DP outputs and their post-processing
    # metrics.<k>, metric_info.<k> and the logged final/<k> of evaluate() (the samples against the public eval
    # split) may differ; those of Method.report() only where REPORT_VARYING names them
    # the declared-public n
    "result.json:n_private": "n, declared public (ledger labels)",
}
# per method: which provenance / ledger / log fields may differ, and why (docs/published-fields.md)
VARYING: dict[str, dict[str, str]] = {
    "dp_gan": {"csv:train/loss_g": "loss of fakes through the DP-trained D (post-processing)"},
    "dp_gan_ft": {"csv:train/loss_g": "loss of fakes through the DP-trained D (post-processing)"},
    "dp_gan_mi": {"csv:train/loss_g": "loss of fakes through the DP-trained D (post-processing)"},
    "dp_dre": {},
    "dp_mge": {},
    "dp_mepf": {"csv:train/private_loss": "generator loss against the DP-released embeddings (post-processing)"},
    "pe": {"csv:pe/*": "the DP population's metrics against the public eval split (post-processing)",
           "checkpoint:pe.pt:history.*": "the DP populations' metrics against the public eval split (post-processing)",
           "checkpoint:pe.pt:fingerprint": "a hash of the configuration and n (refuses resuming under another)"},
    "g_pate": {
        "*events.*.answered": "answered queries: the noisy threshold check's output (DP; also the checkpoints' ledger)",
    },
    "pate_gan": {
        "*events.*.answered": "answered queries: the noisy threshold check's output (DP; also the checkpoints' ledger)",
    },
    "gs_wgan": {},
    "public_uniform": {},
}
# Method.report() values that may differ, per method
REPORT_VARYING: dict[str, dict[str, str]] = {
    "dp_dre": {"dre_private_class_mass": "sum of the DP-trained ratio's weights (post-processing)",
               "dre_effective_sample_size": "of the DP-trained ratio's weights (post-processing)"},
    "dp_mge": {"mge_clamped_dims": "variances of the DP estimates clamped at 0 (post-processing)"},
    "pe": {"pe_*": "the DP populations' metrics against the public eval split (post-processing)"},
}
# sample_provenance keys that may differ, per method (the rest of the provenance must not)
PROVENANCE_VARYING: dict[str, set[str]] = {
    "dp_dre": {"distinct_public_rows"},  # how many public rows the DP-weighted draw hit (post-processing)
    "dp_mge": {"clamped_dims"},  # variances of the DP estimates clamped at 0 (post-processing)
    "dp_mepf": {"generator_loss", "loss"},  # the generator's losses against the DP release (post-processing)
    "pe": {"history"},  # the DP populations' metrics against the public eval split, their distinct parents (post)
    "g_pate": {"answered"},  # the noisy threshold check's output (DP)
    "pate_gan": {"answered", "voted_real"},  # DP outputs of Confident-GNMax
}


class ClippingModels:
    """The run's public models, but every feature is doubled (outside the unit ball): the methods must clip every
    private row, and a count of the clipped rows would be n, which differs between neighbouring runs."""

    def __init__(self, models: Any) -> None:
        self._models = models

    def __getattr__(self, name: str) -> Any:
        return getattr(self._models, name)

    def encode(self, images: Any, *args: Any, **kwargs: Any) -> np.ndarray:
        return 2.0 * np.asarray(self._models.encode(images, *args, **kwargs), dtype=np.float32)


class _PrivateTripwire:
    """``data.private`` as evaluate() and Method.report() see it here: records every read of its rows (its length,
    the declared-public n, is free)."""

    def __init__(self, split: Any, reads: list[str]) -> None:
        self._split, self._reads = split, reads

    def __len__(self) -> int:
        return len(self._split)

    def __getattr__(self, name: str) -> Any:
        self._reads.append(name)
        return getattr(self._split, name)


def _tripwired(data: Any, reads: list[str]) -> Any:
    """``data`` (a DataBundle) whose private split records its reads; its ``shape`` (public) read off the eval split."""
    from dpsyn.data.base import DataBundle

    class EvalView(DataBundle):
        @property
        def shape(self) -> tuple[int, ...]:
            return tuple(self.eval.x.shape[1:])

    fields = {f.name: getattr(data, f.name) for f in dataclasses.fields(data)}
    return EvalView(**{**fields, "private": _PrivateTripwire(data.private, reads)})


def _cfg(tmp_path: Path, cache_dir: Path, run_dir: Path, overrides: tuple[str, ...]) -> DictConfig:
    cfg = compose_cfg([*BASE, "logger=csv", *overrides])
    with open_dict(cfg):
        cfg.paths.output_dir = str(tmp_path / "outputs")
        cfg.paths.cache_dir = str(cache_dir)
        cfg.paths.data_dir = str(tmp_path / "data")
        cfg.logger.save_dir = str(run_dir)
    OmegaConf.set_struct(cfg, True)
    return cfg


def _run(cfg: DictConfig, run_dir: Path, monkeypatch: pytest.MonkeyPatch, *, drop: int | None,
         clipping: bool) -> dict[str, Any]:
    """``dpsyn.task.run`` with the loaded private split short of its row ``drop`` (an index; None: none)."""
    import dpsyn.data
    import dpsyn.metrics
    from dpsyn.task import run
    from dpsyn.methods import METHODS
    from dpsyn.methods.base import Method

    real_load = dpsyn.data.load_dataset
    calls = {"n": 0}

    def load(*args: Any, **kwargs: Any) -> Any:
        data = real_load(*args, **kwargs)
        calls["n"] += 1
        if drop is not None and calls["n"] == 1:  # the run's own dataset (a monitor's family loader comes later)
            p = data.private
            keep = np.delete(np.arange(len(p)), drop)
            data = dataclasses.replace(data, private=type(p)(p.x[keep], p.y[keep],
                                                             None if p.index is None else p.index[keep]))
        return data

    method_cls = METHODS.get(cfg.method.name)
    real_report = method_cls.report
    report_keys: list[str] = []

    private_reads: list[str] = []

    def report(self: Method) -> tuple[dict[str, Any], dict[str, Any]]:  # gets no data at all
        values, info = real_report(self)
        report_keys.extend(values)
        return values, info

    real_evaluate = dpsyn.metrics.evaluate

    def evaluate(samples: Any, data: Any, *args: Any, **kwargs: Any) -> Any:
        return real_evaluate(samples, _tripwired(data, private_reads), *args, **kwargs)

    with monkeypatch.context() as m:
        m.setattr(dpsyn.data, "load_dataset", load)
        m.setattr(method_cls, "report", report)
        m.setattr(dpsyn.metrics, "evaluate", evaluate)
        if clipping:
            real_models = Method.public_models
            m.setattr(Method, "public_models", lambda self: ClippingModels(real_models(self)))
        result = run(cfg, run_dir)
    # metrics and report() read the samples, the public eval split and public data, never a private row (the
    # opt-in ndb and mia_bb metrics do: docs/published-fields.md; references are non-private by declaration)
    assert method_cls.reference or not private_reads, f"evaluate()/report() read data.private.{private_reads[0]}"
    (run_dir / "report_keys.json").write_text(json.dumps(report_keys))  # read back by published()
    return result


def _leaves(obj: Any, prefix: str) -> Iterator[tuple[str, Any]]:
    """(dotted path, value) of every leaf; tensors and arrays as (kind, dtype, shape): their values are models."""
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _leaves(v, f"{prefix}.{k}")
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            yield from _leaves(v, f"{prefix}.{i}")
    elif isinstance(obj, torch.Generator):
        yield prefix, ("torch.Generator",)  # a random stream: never in a published file (see check_neighbouring)
    elif isinstance(obj, torch.Tensor):
        yield prefix, ("tensor", str(obj.dtype), tuple(obj.shape))
    elif isinstance(obj, np.ndarray):
        yield prefix, ("array", str(obj.dtype), obj.shape)
    elif dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        yield from _leaves({f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)}, prefix)
    elif isinstance(obj, (str, int, float, bool, type(None))):
        yield prefix, obj
    elif hasattr(obj, "state_dict"):
        yield from _leaves(obj.state_dict(), prefix)
    elif hasattr(obj, "__dict__"):
        yield from _leaves({k: v for k, v in vars(obj).items() if not k.startswith("_")}, prefix)
    else:
        yield prefix, type(obj).__name__


def published(run_dir: Path) -> dict[str, Any]:
    """Every published value of a run, flattened: ``{"<source>:<dotted path>": value}``."""
    out: dict[str, Any] = {}
    files = sorted(str(p.relative_to(run_dir)) for p in run_dir.rglob("*") if p.is_file())
    out["files"] = [f for f in files if f != "report_keys.json"]
    out["report_keys"] = json.loads((run_dir / "report_keys.json").read_text())
    for name in ("result.json", "privacy.json"):
        out.update(_leaves(json.loads((run_dir / name).read_text()), name + ":"))
    out["config.yaml"] = (run_dir / "config.yaml").read_text()
    for path in sorted(run_dir.rglob("metrics.csv")):
        with path.open() as f:
            rows = list(csv.DictReader(f))
        out["csv:columns"] = sorted(rows[0]) if rows else []
        for col in out["csv:columns"]:
            out[f"csv:{col}"] = [r[col] for r in rows]
    for path in sorted(run_dir.rglob("hparams.yaml")):
        out["csv:hparams.yaml"] = path.read_text()
    for path in sorted((run_dir / "checkpoints").glob("*")) if (run_dir / "checkpoints").is_dir() else []:
        if path.suffix in (".pt", ".ckpt"):
            state = torch.load(path, map_location="cpu", weights_only=False)
            out.update(_leaves(state, f"checkpoint:{path.name}:"))
        elif path.suffix == ".json":
            out.update(_leaves(json.loads(path.read_text()), f"checkpoint:{path.name}:"))
    here = str(run_dir)  # the run directory's path (in config.yaml: the CSV logger's save_dir) is not data
    return {k.replace(":.", ":"): v.replace(here, "<run_dir>") if isinstance(v, str) else v for k, v in out.items()}


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return type(a) is type(b) and a == b


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 200 else text[:200] + "..."


def differing(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    """Paths whose values differ, or that only one run published."""
    return sorted(k for k in set(a) | set(b) if k not in a or k not in b or not _same(a[k], b[k]))


def allowed(path: str, method: str, report_keys: set[str]) -> bool:
    """Whether ``path`` is on the whitelist for ``method`` (module docstring); ``report_keys``: the metrics that
    Method.report() gave (the others come from evaluate(), the samples against the public eval split).

    ``checkpoints/fitted.pt`` (the fitted state a rerun restores) holds the ledger (as privacy.json) and the method's
    fitted attributes: its ``train_log`` is what the sample provenance shows, its other attributes are judged by
    the provenance's rules too (e.g. PE's ``history``)."""
    path = path.replace("checkpoint:fitted.pt:ledger.", "privacy.json:")
    if any(fnmatch.fnmatchcase(path, p) for p in N_DERIVED):
        return True
    for prefix in ("checkpoint:fitted.pt:state.train_log.", "checkpoint:fitted.pt:state.dp_info.",
                   "checkpoint:fitted.pt:state.",
                   "result.json:sample_provenance."):
        if path.startswith(prefix):
            key = path[len(prefix):].split(".", 1)[0]
            return (key in PROVENANCE_VARYING.get(method, set()) or key in N_DERIVED_PROVENANCE
                    or any(fnmatch.fnmatchcase(path, p) for p in ALWAYS))
    for prefix in ("result.json:metrics.", "result.json:metric_info.", "csv:final/"):
        if path.startswith(prefix):
            key = path[len(prefix):].split(".", 1)[0]
            return key not in report_keys or any(fnmatch.fnmatchcase(key, p) for p in REPORT_VARYING.get(method, {}))
    return any(fnmatch.fnmatchcase(path, p) for p in {**ALWAYS, **VARYING.get(method, {})})


# derived from the declared-public n (q = batch/n, planned steps, calibrated noise, epsilon, partition sizes)
N_DERIVED = (
    "*events.*.sample_rate", "*events.*.noise_multiplier", "*events.*.steps", "*epsilon_spent",
    "result.json:metrics.*_noise_multiplier", "result.json:metrics.*_steps", "csv:final/*_noise_multiplier",
    "csv:final/*_steps",
)
# "fingerprint" (PE): a hash of the configuration and n, to refuse resuming under another one
N_DERIVED_PROVENANCE = {"sample_rate", "noise_multiplier", "steps", "steps_planned", "partition_size", "n_private",
                        "fingerprint"}


def check_neighbouring(method: str, overrides: tuple[str, ...], tmp_path: Path, cache_dir: Path,
                       monkeypatch: pytest.MonkeyPatch, *, drop: int = -1, must_change: bool = True) -> list[str]:
    """Run ``method`` on D and on D minus its row ``drop`` (the last by default); fail on a published difference off
    the whitelist. ``must_change``: also require the DP outputs to differ (the test's own power check).

    Returns:
        the paths that differed (all whitelisted).
    """
    clipping = method in CLIPPING_ENCODER
    runs = []
    for name, removed in (("full", None), ("neighbour", drop)):
        run_dir = tmp_path / name
        cfg = _cfg(tmp_path, cache_dir, run_dir, overrides)
        result = _run(cfg, run_dir, monkeypatch, drop=removed, clipping=clipping)
        runs.append((result, published(run_dir), run_dir))
    (full, a, dir_a), (neighbour, b, dir_b) = runs
    report_keys = set(a.pop("report_keys")) | set(b.pop("report_keys"))
    assert neighbour["n_private"] == full["n_private"] - 1  # the row was removed
    diff = differing(a, b)
    if must_change and method != "public_uniform":  # the DP outputs saw the change (dp_dre's pool draw may not)
        assert (not np.array_equal(np.load(dir_a / "samples.npz")["x"], np.load(dir_b / "samples.npz")["x"])
                or any(p.startswith("result.json:metrics.") for p in diff))
    leaks = [p for p in diff if not allowed(p, method, report_keys)]
    assert not leaks, "published fields that differ between neighbouring runs without being DP outputs:\n" + "\n".join(
        f"  {p}: {_short(a.get(p, '<absent>'))} vs {_short(b.get(p, '<absent>'))}" for p in leaks)
    # the run's own words must not name a clipped-row count either (it is 0 with the shipped encoders)
    assert not [p for p in a if "clipped" in p.rsplit(":", 1)[-1].rsplit(".", 1)[-1]]
    # no random stream is saved: the DP noise and Poisson-sampling streams are secret (their state replays the noise)
    assert not [p for p, v in a.items() if v == ("torch.Generator",)]
    # the write-ahead journal of the ledger publishes what privacy.json does: the same events
    for run_dir in (dir_a, dir_b):
        journal = json.loads((run_dir / "checkpoints" / "ledger.journal.json").read_text())
        assert journal["events"] == json.loads((run_dir / "privacy.json").read_text())["events"]
    # teachers and critics (trained without noise) are not left in the run directory's checkpoints
    from dpsyn.methods import METHODS

    for name, keys in METHODS.get(method).unreleased_checkpoint_keys.items():
        left = [p for p in a if any(p.startswith(f"checkpoint:{name}:{k}") for k in keys)]
        assert not left, f"{name} still holds {sorted({p.split(':')[2].split('.')[0] for p in left})}"
    return diff


def neighbour_case(method: str) -> tuple[str, ...]:
    """The overrides of ``method``'s leak test: the hand-made case above, else its class's ``tiny`` run."""
    from dpsyn.methods import METHODS

    return CASES.get(method) or tuple(METHODS.get(method).tiny)


def neighbour_cases() -> list[str]:
    """Every registered method but the references (non-private by declaration, checked below): a new method is
    covered by default, with nothing published allowed to differ beyond ALWAYS until it says why."""
    from dpsyn.methods import METHODS

    return [m for m in METHODS.names() if not METHODS.get(m).reference]


@pytest.mark.parametrize(
    "method", [pytest.param(m, marks=() if m == FAST_CASE else pytest.mark.slow) for m in neighbour_cases()]
)
def test_neighbouring_runs_publish_nothing_private_without_noise(method: str, tmp_path: Path, cache_dir: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    # a partitioned method's tiny run may never read the removed row (its partition's other rows are unchanged)
    check_neighbouring(method, neighbour_case(method), tmp_path, cache_dir, monkeypatch,
                       must_change=method not in PARTITIONED)


@pytest.mark.parametrize(("method", "where"), [
    pytest.param(m, w, marks=() if (m, w) == ("g_pate", "middle") else pytest.mark.slow)
    for m in PARTITIONED for w in ("first", "middle", "random")])
def test_partitioned_methods_publish_nothing_private_whichever_row_is_removed(method: str, where: str,
                                                                              tmp_path: Path, cache_dir: Path,
                                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """The partitioned methods' leak test, removing the first, a middle or a random row rather than the last: a
    partition cut by position would then move rows of every teacher (and a field computed from the partitions, such
    as their sizes, would differ); the keyed partitions move one row of one partition."""
    n = 60_000  # fmnist's private rows (the cases' dataset); any index below it removes a real row
    drop = {"first": 0, "middle": n // 2, "random": int(np.random.default_rng(59).integers(n))}[where]
    # a row that its teacher or critic does not read in the tiny run's few rounds changes nothing at all
    check_neighbouring(method, CASES[method], tmp_path, cache_dir, monkeypatch, drop=drop, must_change=False)


@pytest.mark.slow
@pytest.mark.parametrize("method", list(REFERENCES))
def test_references_declare_themselves_non_private(method: str, tmp_path: Path, cache_dir: Path) -> None:
    from dpsyn.task import run

    run_dir = tmp_path / "run"
    result = run(_cfg(tmp_path, cache_dir, run_dir, REFERENCES[method]), run_dir)
    assert result["non_private_reference"] is True and result["epsilon_spent"] == math.inf
    assert "non_private" in {e["kind"] for e in result["privacy_events"]}


def test_the_check_catches_a_clipped_row_count(tmp_path: Path, cache_dir: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """Power: a dp_mge that publishes its clipped-row count again (as it once did) fails the neighbouring check."""
    from dpsyn.methods.dp_mge import DPMGE

    real_report = DPMGE.report

    def leaky_report(self: DPMGE) -> tuple[dict[str, Any], dict[str, Any]]:
        values, info = real_report(self)
        values["mge_rows_outside_ball"] = int(self._private_rows)
        return values, info

    real_fit = DPMGE.fit

    def fit(self: DPMGE, private: Any, *args: Any, **kwargs: Any) -> None:
        self._private_rows = len(private)  # every row needs clipping with ClippingModels: the count is n
        real_fit(self, private, *args, **kwargs)

    monkeypatch.setattr(DPMGE, "report", leaky_report)
    monkeypatch.setattr(DPMGE, "fit", fit)
    with pytest.raises(AssertionError, match=r"result.json:metrics.mge_rows_outside_ball"):
        check_neighbouring("dp_mge", CASES["dp_mge"], tmp_path, cache_dir, monkeypatch)


class _NoisyModule(torch.nn.Module):
    """A DP-SGD module in miniature: a model and its DP settings with the noise stream (as GANModule.dp)."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(2, 2)
        self.dp = {"noise_multiplier": 1.5, "generator": torch.Generator().manual_seed(3)}


def test_fitted_state_keeps_no_noise_stream_and_training_checkpoints_drop_unreleased_state(tmp_path: Path) -> None:
    """The fitted state (checkpoints/fitted.pt) holds no DP noise generator, the method's own object keeps it; the
    teachers/critics named by ``unreleased_checkpoint_keys`` leave the training checkpoint, the rest stays."""
    from dpsyn.methods.base import Method, Samples
    from dpsyn.results.io import atomic_torch_save

    class Toy(Method):
        fitted_attrs = ("module",)
        unreleased_checkpoint_keys = {"toy.pt": ("teachers", "opt_teachers")}

        def fit(self, private: Any, budget: Any, ledger: Any, public: Any = None) -> None:
            self.module = _NoisyModule()

        def sample(self, n: int, labels: np.ndarray | None = None) -> Samples:
            return Samples(np.zeros((n, 2)), None)

    ctx = run_context(deterministic_noise=False, kind="table", shape=(2,), classes=["a", "b"], run_dir=tmp_path)
    toy = Toy(None, ctx)
    toy.fit(None, None, None)
    state = toy.fitted_state()
    assert state["module"].dp == {"noise_multiplier": 1.5, "generator": None}
    assert state["module"].lin is toy.module.lin  # a shallow copy: the model itself is saved
    assert isinstance(toy.module.dp["generator"], torch.Generator)  # the run's own module keeps its stream
    atomic_torch_save(tmp_path / "fitted.pt", state)
    assert not [p for p, v in _leaves(torch.load(tmp_path / "fitted.pt", weights_only=False), "")
                if v == ("torch.Generator",)]

    assert toy.drop_unreleased_checkpoint_state() == []  # no checkpoint yet
    ckpt = tmp_path / "checkpoints" / "toy.pt"
    atomic_torch_save(ckpt, {"step": 4, "G": {"w": torch.ones(2)}, "teachers": {"w": torch.ones(3)},
                             "opt_teachers": {}})
    assert toy.drop_unreleased_checkpoint_state() == [str(ckpt)]
    kept = torch.load(ckpt, weights_only=False)
    assert set(kept) == {"step", "G"} and kept["step"] == 4
    assert toy.drop_unreleased_checkpoint_state() == []  # nothing left to drop
