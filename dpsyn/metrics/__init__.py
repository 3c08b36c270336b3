"""Metrics: registered by name in :data:`METRICS`; :func:`evaluate` runs the configured ones on a run's samples.

Each metric is ``fn(samples, data, cfg, env) -> (values, info)``: ``values`` go to ``result.json["metrics"]``
(and W&B), ``info`` to ``result.json["metric_info"]`` (the feature extractor, sample counts, the reference split).
Names say which feature space they use: ``fid``/``kid``/``is`` only with InceptionV3; with the embedded evaluation
network they are ``fd_<family>``, ``kid_<family>``, ``is_<family>``. Every read of the real evaluation split by a
*trained model* goes through one :class:`~dpsyn.metrics.sealed.SealedSplit` that allows one read per such metric.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from dpsyn.data.base import DataBundle
from dpsyn.registry import Registry

log = logging.getLogger(__name__)

METRICS: Registry = Registry("metric")

# metrics whose trained model reads the evaluation split (each gets one sealed read)
SEALED_READERS = ("acc", "auroc", "mia_bb")


def _extractor(env: dict[str, Any], data: DataBundle, cfg: Any) -> Any:
    """The configured feature extractor, built once per evaluation."""
    if "extractor" not in env:
        from dpsyn.metrics.features import build_feature_extractor

        name = str(cfg.extractor)
        if name == "evalnet":
            env["extractor"] = build_feature_extractor(
                f"evalnet_{data.family}",
                family_data=env["load_family"](data.family),
                settings=dict(cfg.evalnet),
                cache_dir=env["cache_dir"],
            )
        else:
            env["extractor"] = build_feature_extractor(name)
    return env["extractor"]


def _suffix(extractor: Any) -> str:
    """"" for InceptionV3 (fid, kid, is), ``_<family>`` / ``_clip`` otherwise."""
    if extractor.name == "inception":
        return ""
    return "_" + extractor.name.removeprefix("evalnet_")


def _features(env: dict[str, Any], data: DataBundle, cfg: Any, which: str, layer: str = "features") -> np.ndarray:
    """A layer of the samples' features (``which="samples"``: computed once per evaluation, all layers in one pass,
    not cached on disk) or of the real reference split (``"real"``: cached on disk by content)."""
    from dpsyn.metrics.features import cached_features

    ext = _extractor(env, data, cfg)
    if which == "samples":
        if "samples" not in env["feats"]:
            env["feats"]["samples"] = ext.extract(env["samples"].x)
        return env["feats"]["samples"][layer]
    if ("real", layer) not in env["feats"]:
        env["feats"][("real", layer)] = cached_features(
            ext, _real_reference(env, data, cfg), key=f"{data.name}-{data.eval_split}", cache_dir=env["cache_dir"], layer=layer
        )
    return env["feats"][("real", layer)]


def _real_reference(env: dict[str, Any], data: DataBundle, cfg: Any) -> np.ndarray:
    """The real images fidelity metrics compare with: up to ``n_real`` of the evaluation split (seeded)."""
    n = min(int(cfg.n_real), len(data.eval))
    if n == len(data.eval):
        return data.eval.x
    idx = np.sort(np.random.default_rng(0).choice(len(data.eval), size=n, replace=False))
    return data.eval.x[idx]


def _fidelity_info(env: dict[str, Any], data: DataBundle, cfg: Any, **extra: Any) -> dict[str, Any]:
    ext = _extractor(env, data, cfg)
    source = {"extractor_source": ext.record["source"]} if "source" in getattr(ext, "record", {}) else {}
    return {"extractor": ext.name, "extractor_identity": ext.identity, **source, "n_generated": len(env["samples"]),
            "n_real": min(int(cfg.n_real), len(data.eval)), "reference": f"{data.name} {data.eval_split} split", **extra}


@METRICS.register("fd")
def _fd(samples: Any, data: DataBundle, cfg: Any, env: dict[str, Any]) -> tuple[dict, dict]:
    """Frechet distance (``fid`` with InceptionV3, ``fd_<family>`` otherwise)."""
    from dpsyn.metrics.fidelity import frechet_distance_from_features

    if data.kind != "image":
        return {}, {}
    ext = _extractor(env, data, cfg)
    name = "fid" if ext.name == "inception" else f"fd{_suffix(ext)}"
    value = frechet_distance_from_features(_features(env, data, cfg, "samples"), _features(env, data, cfg, "real"))
    values = {name: value}
    if hasattr(ext, "record") and data.eval_split == "eval":
        # the instrument's own test accuracy (measured once, when it was built and cached); a tuning run
        # (metrics.split=validation) reports no test-split number at all
        values[f"{ext.name}_test_acc"] = ext.record["test_acc"]
    return values, {name: _fidelity_info(env, data, cfg)}


@METRICS.register("kid")
def _kid(samples: Any, data: DataBundle, cfg: Any, env: dict[str, Any]) -> tuple[dict, dict]:
    """Kernel distance (torch-fidelity's KID): mean and std over subsets."""
    from dpsyn.metrics.fidelity import kid

    if data.kind != "image":
        return {}, {}
    g, r = _features(env, data, cfg, "samples"), _features(env, data, cfg, "real")
    size = min(int(cfg.kid.subset_size), len(g), len(r))
    if size < 2:
        raise ValueError(f"kid needs at least 2 generated and 2 real samples, got {len(g)} and {len(r)}")
    mean, std = kid(g, r, subsets=int(cfg.kid.subsets), subset_size=size, seed=env["seed"])
    name = f"kid{_suffix(_extractor(env, data, cfg))}"
    return {name: mean, f"{name}_std": std}, {name: _fidelity_info(env, data, cfg, subsets=int(cfg.kid.subsets), subset_size=size)}


@METRICS.register("prdc")
def _prdc(samples: Any, data: DataBundle, cfg: Any, env: dict[str, Any]) -> tuple[dict, dict]:
    """Precision/recall (k-NN manifolds, k = prdc.k_pr) and density/coverage (k = prdc.k_dc)."""
    from dpsyn.metrics.fidelity import density_coverage, precision_recall

    if data.kind != "image":
        return {}, {}
    g, r = _features(env, data, cfg, "samples"), _features(env, data, cfg, "real")
    values = {**precision_recall(g, r, k=int(cfg.prdc.k_pr)), **density_coverage(g, r, k=int(cfg.prdc.k_dc))}
    info = _fidelity_info(env, data, cfg, k_pr=int(cfg.prdc.k_pr), k_dc=int(cfg.prdc.k_dc))
    return values, {k: info for k in values}


@METRICS.register("is")
def _is(samples: Any, data: DataBundle, cfg: Any, env: dict[str, Any]) -> tuple[dict, dict]:
    """Inception Score (``is`` with InceptionV3, ``is_<family>`` with the evaluation classifier's logits)."""
    from dpsyn.metrics.fidelity import inception_score

    if data.kind != "image":
        return {}, {}
    ext = _extractor(env, data, cfg)
    logits = _features(env, data, cfg, "samples", layer="logits")
    mean, std = inception_score(logits, splits=int(cfg.is_splits), seed=env["seed"])
    name = f"is{_suffix(ext)}"
    return {name: mean, f"{name}_std": std}, {name: _fidelity_info(env, data, cfg, splits=int(cfg.is_splits))}


@METRICS.register("ndb")
def _ndb(samples: Any, data: DataBundle, cfg: Any, env: dict[str, Any]) -> tuple[dict, dict]:
    """NDB/K and the bins' JS divergence, K-means on real training samples (pixels or features)."""
    from dpsyn.metrics.ndb import ndb

    n = min(int(cfg.ndb.n_train), len(data.private))
    idx = np.sort(np.random.default_rng(0).choice(len(data.private), size=n, replace=False))
    real_train = data.private.x[idx]
    gen = samples.x
    if cfg.ndb.space == "features" and data.kind == "image":
        from dpsyn.metrics.features import cached_features

        ext = _extractor(env, data, cfg)
        real_train = cached_features(ext, real_train, key=f"{data.name}-train", cache_dir=env["cache_dir"])
        gen = _features(env, data, cfg, "samples")
    # a fixed K-means seed: every run of a table is scored against the same bins
    out = ndb(gen, real_train, k=int(cfg.ndb.K), alpha=float(cfg.ndb.alpha), seed=int(cfg.ndb.seed))
    info = {"space": str(cfg.ndb.space), "K": int(cfg.ndb.K), "alpha": float(cfg.ndb.alpha), "n_real_train": n,
            "n_generated": len(gen), "reference": f"{data.name} private (train) split, evaluation only"}
    values = {"ndb": out["ndb"], "ndb_k": out["ndb_k"], "ndb_js": out["js"]}
    return values, {k: info for k in values}


def _acc_dpsyn(samples: Any, data: DataBundle, cfg: Any, env: dict[str, Any]) -> tuple[dict, dict]:
    """Protocol dpsyn: selection on held-out synthetic data (:func:`dpsyn.metrics.utility.downstream_accuracy`)."""
    from dpsyn.metrics.utility import downstream_accuracy

    c = cfg.classifier
    out = downstream_accuracy(
        (samples.x, samples.y),
        env["sealed_eval"],
        num_classes=data.num_classes,
        epochs=int(c.epochs),
        batch_size=int(c.batch_size),
        lr=float(c.lr),
        val_fraction=float(c.val_fraction),
        seed=env["seed"],
        classifier=str(c.name),
        ensemble=int(c.ensemble),
        schedule=str(c.schedule),
    )
    values = {"acc": out["acc"], "acc_synthetic_val": out["acc_synthetic_val"], "acc_best_epoch": out["best_epoch"]}
    info = {"classifier": out["classifier"], "ensemble": out["ensemble"], "n_train": out["n_train"],
            "n_val_synthetic": out["n_val"], "n_test": out["n_test"], "best_epochs": out["best_epochs"],
            "selection": "held-out synthetic split", "reference": f"{data.name} {data.eval_split} split (sealed, read once)"}
    return values, {"acc": info}


def _acc_dpimagebench(samples: Any, data: DataBundle, cfg: Any, env: dict[str, Any]) -> tuple[dict, dict]:
    """Protocol dpimagebench: their three classifiers, selected on real validation rows held out of the private
    split (:func:`dpsyn.metrics.dpimagebench.dpimagebench_accuracy`); a noisy-max selection is charged to the
    run's ledger."""
    from dpsyn.metrics.dpimagebench import SELECTION_TEXT, dpimagebench_accuracy

    d = cfg.dpimagebench
    noisy = d.selection == "noisy_max"
    if noisy and env.get("ledger") is None:
        raise ValueError("metrics.dpimagebench.selection=noisy_max is a DP release: it needs the run's privacy ledger "
                         "(evaluate(..., ledger=...))")
    generator = None
    if noisy:
        from dpsyn.privacy import dp_numpy_generator

        generator = dp_numpy_generator(deterministic=bool(env.get("deterministic_noise", False)),
                                       seed=int(env["seed"]) + 7919)
    val = data.validation
    out = dpimagebench_accuracy(
        (samples.x, samples.y), None if val is None else (val.x, val.y), env["sealed_eval"],
        num_classes=data.num_classes, classifiers=list(d.classifiers), epochs=int(d.epochs),
        batch_size=int(d.batch_size), lr=float(d.lr), lr_step=int(d.lr_step), lr_gamma=float(d.lr_gamma),
        ema_decay=float(d.ema_decay), wrn_dropout=float(d.wrn_dropout), n_train=int(d.n_train), seed=env["seed"],
        selection=str(d.selection), selection_eps=None if d.selection_eps is None else float(d.selection_eps),
        ledger=env.get("ledger"), generator=generator, width_divisor=int(d.width_divisor),
    )
    values = {"acc": out["acc"], "acc_std": out["acc_std"], **{f"acc_{n}": v for n, v in out["per_classifier"].items()}}
    info = {"protocol": "dpimagebench", "classifiers": list(d.classifiers), "epochs": int(d.epochs),
            "n_train": out["n_train"], "n_validation": out["n_validation"], "n_test": out["n_test"],
            "selected_epochs": out["selected_epochs"], "selection": SELECTION_TEXT[str(d.selection)],
            "reference": f"{data.name} {data.eval_split} split (sealed, read once, after the selection)"}
    if noisy:
        info["selection_eps"] = float(d.selection_eps)
    else:
        info["val_accs"] = out["val_accs"]  # already released without DP by this protocol's selection
    return values, {k: info for k in values}


#: metrics.protocol -> how the acc metric measures downstream accuracy
ACC_PROTOCOLS: dict[str, Callable[..., tuple[dict, dict]]] = {"dpsyn": _acc_dpsyn, "dpimagebench": _acc_dpimagebench}


def protocol(cfg: Any) -> str:
    """The metrics config's evaluation protocol (absent: ``dpsyn``)."""
    return str(cfg.get("protocol") or "dpsyn") if hasattr(cfg, "get") else "dpsyn"


@METRICS.register("acc")
def _acc(samples: Any, data: DataBundle, cfg: Any, env: dict[str, Any]) -> tuple[dict, dict]:
    """Downstream accuracy by ``metrics.protocol`` (see :data:`ACC_PROTOCOLS`)."""
    if data.kind != "image":
        return {}, {}
    name = protocol(cfg)
    if name not in ACC_PROTOCOLS:
        raise ValueError(f"metrics.protocol={name}: allowed: {', '.join(ACC_PROTOCOLS)}")
    return ACC_PROTOCOLS[name](samples, data, cfg, env)


@METRICS.register("auroc")
def _auroc(samples: Any, data: DataBundle, cfg: Any, env: dict[str, Any]) -> tuple[dict, dict]:
    """Tabular AUROC/AUPRC of the four PATE-GAN/G-PATE classifiers (see :mod:`dpsyn.metrics.tabular`)."""
    from dpsyn.metrics.tabular import tabular_auroc

    if data.kind != "table":
        return {}, {}
    out = tabular_auroc((samples.x, samples.y), env["sealed_eval"], seed=env["seed"],
                        classifiers=list(cfg.tabular.classifiers), classes=list(range(data.num_classes)))
    values = {k: v for k, v in out.items() if k.startswith(("auroc", "auprc"))}
    info = {"classifiers": out["classifiers"], "n_train": out["n_train"], "n_test": out["n_test"],
            "reference": f"{data.name} {data.eval_split} split (sealed, read once)"}
    return values, {k: info for k in values}


@METRICS.register("mia_bb")
def _mia_bb(samples: Any, data: DataBundle, cfg: Any, env: dict[str, Any]) -> tuple[dict, dict]:
    """Black-box distance attack: private members vs held-out non-members, AUC and an epsilon lower bound."""
    from dpsyn.metrics.mia import candidate_pool, distance_mia

    m = cfg.mia
    rng = np.random.default_rng(env["seed"])
    n = min(int(m.n_members), len(data.private), len(data.eval))
    members = data.private.x[rng.choice(len(data.private), size=n, replace=False)]
    non_idx = rng.choice(len(data.eval), size=n, replace=False)

    def attack(eval_x: np.ndarray) -> dict[str, Any]:
        cand, is_member = candidate_pool(members, eval_x[non_idx])
        return distance_mia(cand, is_member, samples.x, confidence=float(m.confidence),
                            calibration_fraction=float(m.calibration_fraction), seed=env["seed"])

    out = env["sealed_eval"].evaluate_once(attack, lambda _y, r: r, reader="metrics.mia_bb")
    values = {f"mia_bb_{k}": out[k] for k in ("auc", "eps_lb")}
    info = {"n_members": n, "n_non_members": n, "n_synthetic": len(samples), "confidence": float(m.confidence),
            "space": "pixels" if data.kind == "image" else "rows", "non_members": f"{data.name} {data.eval_split} split",
            **{k: out[k] for k in ("tpr", "fpr", "tpr_lo", "fpr_hi", "threshold") if k in out}}
    return values, {k: info for k in values}


def make_monitor(
    data: DataBundle, cfg: Any, *, cache_dir: str | Path, load_family: Callable[[str], DataBundle]
) -> Callable[[np.ndarray], dict[str, float]]:
    """A function ``images -> {fd_<family> (or fid), precision, recall}`` against the evaluation split, in the
    configured feature space, for methods that log their progress (PE's iterations).

    Monitoring only: nothing may be selected on it (the values go to the logs, never into a choice), so it does not
    count as a read of the sealed evaluation split. The extractor and the real features are built on first use and
    kept. Images of a non-image dataset give ``{}``.
    """
    from dpsyn.metrics.fidelity import frechet_distance_from_features, precision_recall, real_squared_knn_radii

    env: dict[str, Any] = {"cache_dir": cache_dir, "seed": 0, "load_family": load_family, "feats": {}}

    def monitor(images: np.ndarray) -> dict[str, float]:
        if data.kind != "image" or len(images) < 2:
            return {}
        ext = _extractor(env, data, cfg)
        real = _features(env, data, cfg, "real")
        gen = ext.extract(images)["features"]
        name = "fid" if ext.name == "inception" else f"fd{_suffix(ext)}"
        values = {name: float(frechet_distance_from_features(gen, real))}
        k = int(cfg.prdc.k_pr)
        if len(gen) > k and len(real) > k:
            if ("real_r2", k) not in env:  # the real set is the same at every call: its k-NN radii are computed once
                env[("real_r2", k)] = real_squared_knn_radii(real, k=k)
            pr = precision_recall(gen, real, k=k, real_squared_radii=env[("real_r2", k)])
            values.update({key: float(v) for key, v in pr.items()})
        return values

    return monitor


def metric_names(cfg: Any, kind: str) -> list[str]:
    """The metrics configured for a dataset kind (``cfg.names.image`` / ``cfg.names.table``)."""
    names = cfg.names.get(kind) if hasattr(cfg.names, "get") else None
    return list(names or [])


def evaluate(
    samples: Any,
    data: DataBundle,
    cfg: Any,
    *,
    cache_dir: str | Path,
    seed: int,
    load_family: Callable[[str], DataBundle],
    ledger: Any = None,
    deterministic_noise: bool = False,
) -> tuple[dict[str, Any], dict[str, float], dict[str, Any]]:
    """Run every metric configured for the dataset's kind.

    ``ledger`` (the run's :class:`~dpsyn.privacy.PrivacyLedger`) is charged by a metric that makes a DP release
    (``metrics.protocol=dpimagebench`` with ``selection=noisy_max``); ``deterministic_noise`` is
    ``privacy.deterministic_noise`` for that release's noise.

    Returns:
        (metric values, seconds per metric, per-metric info incl. the sealed split's read log under "eval_reads").
    """
    from dpsyn.metrics.sealed import SealedSplit

    names = metric_names(cfg, data.kind)
    for n in names:
        METRICS.get(n)  # unknown names fail before any metric runs
    readers = [n for n in names if n in SEALED_READERS]
    env: dict[str, Any] = {
        "cache_dir": cache_dir, "seed": seed, "load_family": load_family, "samples": samples, "feats": {},
        "ledger": ledger, "deterministic_noise": bool(deterministic_noise),
        "sealed_eval": SealedSplit(data.eval.x, data.eval.y, name=f"{data.name}/{data.eval_split}",
                                   max_reads=max(1, len(readers))),
    }
    values: dict[str, Any] = {}
    infos: dict[str, Any] = {}
    timings: dict[str, float] = {}
    for name in names:
        t0 = time.perf_counter()
        v, info = METRICS.get(name)(samples, data, cfg, env)
        values.update(v)
        infos.update(info)
        timings[name] = time.perf_counter() - t0
        log.info("metric %s done in %.1fs", name, timings[name])
    infos[f"{data.eval_split}_reads"] = [{k: r[k] for k in ("reader", "n") if k in r} for r in env["sealed_eval"].reads]
    return values, timings, infos
