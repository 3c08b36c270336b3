"""Paper 000's two reference points built on the public models, and the public-row helpers its methods share.

Wu et al. 2023 ("Large-scale public data improves differentially private image generation quality"; DP-MGE and
DP-DRE) compare their methods with:

* ``public_uniform``: the "sanity check" baseline — feature vectors of public images drawn uniformly, decoded by the
  instance-conditioned generator g. It never touches private data, so it spends nothing: its ledger holds no event
  (epsilon spent 0, within any target).
* ``icgan_nonprivate``: the features of the *private* images fed to g directly — "an upper bound for any IC-GAN based
  image generation algorithm". Not DP: a reference (like ``real``), its ledger records one non-private release.

Labels. The downstream-accuracy metric needs a private-space label for every synthetic image. An image decoded from a
public row gets that row's public class when that class is one of the private classes (matched by class name:
``public_classes`` vs ``classes``). A public row of any other class is, by ``other_classes``:

* ``nearest`` (default): labelled with the private class whose *public* centroid (the normalised mean feature of the
  public rows of that class) is closest in cosine similarity; or
* ``exclude``: never drawn (a stronger use of the public labels than the paper makes: it filters the public pool).

Both use public data only, so neither costs privacy. :class:`PublicPool` holds the encoded public rows with these
labels; :func:`public_class_names` finds the public label names (see its docstring for where they come from).
This module is a reconstruction of the paper's baselines (its appendix was not available), not a port of its code.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from dpsyn.data.base import Split
from dpsyn.methods.base import METHODS, Method, PrivacyBudget, RunContext, Samples
from dpsyn.privacy import NonPrivateEvent, PrivacyLedger
from dpsyn.methods.tiny import SHOES
from dpsyn.config.schema import OTHER_CLASSES

log = logging.getLogger(__name__)

"""Allowed values of ``method.other_classes``."""


# ----------------------------------------------------------------------------------------------------------------
# config helpers


# ----------------------------------------------------------------------------------------------------------------
# public labels


def public_class_names(ctx: RunContext, models: Any, public: Split) -> tuple[list[str] | None, str]:
    """Names of the public split's labels, in label order, and where they were found.

    Looked up, in order: ``ctx.public_classes`` (when the run context carries the dataset's ``public_classes``);
    else the class names recorded with the embedded public models' training data (``record["encoder"]["data"]``:
    the models are trained on the public dataset itself, so its label space is the public split's). Real
    checkpoints (ImageNet) carry no such record: then None.

    Returns:
        ``(names or None, source)``; names are rejected (None) when the public labels do not fit them.
    """
    names = getattr(ctx, "public_classes", None)
    source = "run context (dataset public_classes)"
    if names is None:
        record = getattr(models, "record", None) or {}
        names = ((record.get("encoder") or {}).get("data") or {}).get("classes")
        source = "public models' training-data record"
    if names is None:
        return None, "unknown (no public class names available)"
    names = [str(n) for n in names]
    if len(public) and (int(public.y.min()) < 0 or int(public.y.max()) >= len(names)):
        log.warning("public labels range over %d..%d but %d public class names were found (%s): names ignored",
                    int(public.y.min()), int(public.y.max()), len(names), source)
        return None, f"rejected ({source}: labels out of range)"
    return names, source


def private_label_map(public_names: list[str] | None, private_names: list[str]) -> np.ndarray:
    """For each public label, the private label with the same class name (case-insensitive), or -1.

    Args:
        public_names: the public split's class names in label order (None: nothing maps).
        private_names: the private classes in label order.

    Returns:
        int64 array of ``len(public_names)`` entries (empty when ``public_names`` is None).
    """
    if public_names is None:
        return np.zeros(0, dtype=np.int64)
    lookup = {name.casefold(): i for i, name in enumerate(private_names)}
    return np.array([lookup.get(name.casefold(), -1) for name in public_names], dtype=np.int64)


@dataclass
class PublicPool:
    """Encoded public rows and their private-space labels.

    Attributes:
        feats: (m, d) float32 features, norms <= 1.
        public_y: (m,) the rows' public labels.
        private_class: (m,) the private label of the row's public class, -1 when it is not a private class.
        labels: (m,) the label an image decoded from the row gets; -1 = never drawn (``other_classes=exclude``, or
            no label could be given).
        rows: (m,) positions of the rows in the public split.
        info: how the labels were made (JSON-serialisable).
    """

    feats: np.ndarray
    public_y: np.ndarray
    private_class: np.ndarray
    labels: np.ndarray
    rows: np.ndarray
    info: dict[str, Any] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.feats)

    @property
    def drawable(self) -> np.ndarray:
        """Mask of rows that may be drawn."""
        return self.labels >= 0

    def sample(
        self, n: int, weights: np.ndarray | None, rng: np.random.Generator, labels: np.ndarray | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """``n`` row indices drawn with replacement with probability proportional to ``weights`` (None: uniform)
        among drawable rows, and the labels of the images decoded from them. With ``labels``, row i is drawn among
        the rows labelled ``labels[i]``.

        Raises:
            ValueError: when no drawable row (of a requested label) has positive weight.
        """
        w = np.ones(len(self)) if weights is None else np.asarray(weights, dtype=np.float64)
        w = np.where(self.drawable, w, 0.0)
        if labels is None:
            idx = self._choose(n, w, rng, "any class")
            return idx, self.labels[idx]
        labels = np.asarray(labels, dtype=np.int64)
        idx = np.empty(len(labels), dtype=np.int64)
        for c in np.unique(labels):
            where = np.flatnonzero(labels == c)
            idx[where] = self._choose(len(where), np.where(self.labels == c, w, 0.0), rng, f"label {c}")
        return idx, labels

    @staticmethod
    def _choose(n: int, w: np.ndarray, rng: np.random.Generator, what: str) -> np.ndarray:
        total = float(w.sum())
        if not total > 0 or not np.isfinite(total):
            raise ValueError(f"no public row of {what} can be drawn (all weights are zero)")
        return rng.choice(len(w), size=n, replace=True, p=w / total)


def centroid_labels(feats: np.ndarray, centroid_feats: np.ndarray, centroid_labels_: np.ndarray,
                    num_classes: int) -> tuple[np.ndarray, list[int]]:
    """Label each row of ``feats`` with the class whose normalised mean feature (over ``centroid_feats`` rows of
    that class) has the largest inner product with it. Classes without rows are skipped.

    Returns:
        ``(labels, classes_with_a_centroid)``; labels are -1 when no class has a centroid.
    """
    present = [c for c in range(num_classes) if np.any(centroid_labels_ == c)]
    if not present:
        return np.full(len(feats), -1, dtype=np.int64), []
    cents = np.stack([centroid_feats[centroid_labels_ == c].mean(0) for c in present]).astype(np.float64)
    cents /= np.maximum(np.linalg.norm(cents, axis=1, keepdims=True), 1e-12)
    best = np.argmax(np.asarray(feats, dtype=np.float64) @ cents.T, axis=1)
    return np.asarray(present, dtype=np.int64)[best], present


def build_public_pool(
    models: Any,
    public: Split,
    ctx: RunContext,
    *,
    max_rows: int | None,
    other_classes: str,
) -> PublicPool:
    """Encode the public split (or a seeded subsample of ``max_rows`` rows) and label its rows (module docstring).

    Only public data is used: no privacy cost.
    """
    rows = np.arange(len(public))
    if max_rows is not None and max_rows < len(public):
        rows = np.sort(np.random.default_rng(ctx.seed).choice(len(public), size=max_rows, replace=False))
    feats = np.asarray(models.encode(public.x[rows]), dtype=np.float32)
    public_y = np.asarray(public.y[rows], dtype=np.int64)
    names, source = public_class_names(ctx, models, public)
    mapping = private_label_map(names, list(ctx.classes))
    private_class = mapping[public_y] if len(mapping) else np.full(len(rows), -1, dtype=np.int64)
    mapped = private_class >= 0
    labels = private_class.copy()
    info: dict[str, Any] = {
        "public_class_names": source,
        "private_classes_found_in_public": sorted({ctx.classes[c] for c in private_class[mapped]}),
        "public_rows": int(len(rows)),
        "public_rows_of_private_classes": int(mapped.sum()),
        "other_classes": other_classes,
    }
    if other_classes == "nearest" and (~mapped).any():
        lab, present = centroid_labels(feats[~mapped], feats[mapped], private_class[mapped], ctx.num_classes)
        labels[~mapped] = lab
        info["other_classes_rule"] = ("rows of non-private public classes get the private class whose public centroid "
                                      "is nearest (cosine); public data only")
        if len(present) < ctx.num_classes:
            info["classes_without_public_rows"] = [ctx.classes[c] for c in range(ctx.num_classes) if c not in present]
    elif other_classes == "exclude":
        info["other_classes_rule"] = "rows of non-private public classes are never drawn"
    if not (labels >= 0).any():
        # No public class matches a private one (e.g. real ImageNet checkpoints without names, or digits): every
        # row stays drawable, labels are uniform over the private classes and downstream accuracy means nothing.
        log.warning("no public row could be given a private label (%s): labels will be uniform", source)
        labels = np.random.default_rng(ctx.seed).permutation(np.arange(len(rows)) % ctx.num_classes).astype(np.int64)
        info["other_classes_rule"] = "no public class matches a private class: uniform labels (accuracy meaningless)"
    return PublicPool(feats=feats, public_y=public_y, private_class=private_class, labels=labels, rows=rows, info=info)


def decode_seeded(models: Any, feats: np.ndarray, seed: int) -> np.ndarray:
    """Images g(z, v) for the feature rows, the generator noise z seeded from the run seed (post-processing)."""
    return np.asarray(models.decode(feats, generator=torch.Generator().manual_seed(seed)), dtype=np.float32)


# ----------------------------------------------------------------------------------------------------------------
# the methods


@METHODS.register("public_uniform")
class PublicUniform(Method):
    """Uniformly drawn public feature vectors, decoded by g: paper 000's sanity baseline (no private data used)."""

    # reads no private row: spends nothing whatever its settings
    tunable_keys = ("public_pool", "other_classes")
    tiny = ("method=public_uniform", *SHOES, "method.public_pool=600")

    needs_public = True
    kinds = ("image",)
    eps_free = True  # reads no private data: the same samples at every target eps

    def __init__(self, cfg: Any, ctx: RunContext) -> None:
        super().__init__(cfg, ctx)
        self.other_classes = str(cfg.other_classes)  # checked at compose time (dpsyn.config.schema)
        self.public_pool = cfg.get("public_pool")

    def fit(
        self, private: Split, budget: PrivacyBudget, ledger: PrivacyLedger, public: Split | None = None
    ) -> None:
        if public is None:
            raise ValueError("public_uniform needs a dataset with public data")
        # Nothing private is read, so nothing is recorded: the ledger's epsilon stays 0, within any target.
        self.models = self.public_models()
        self.pool = build_public_pool(self.models, public, self.ctx, max_rows=self.public_pool,
                                      other_classes=self.other_classes)

    def sample(self, n: int, labels: np.ndarray | None = None) -> Samples:
        rng = np.random.default_rng(self.ctx.seed)
        idx, y = self.pool.sample(n, None, rng, labels)
        x = decode_seeded(self.models, self.pool.feats[idx], self.ctx.seed)
        return Samples(x, y, {"method": "public_uniform", "features": "public rows drawn uniformly",
                              "privacy": "no private data used", **self.pool.info})

    def report(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """Share of the public pool whose public class is a private class (what uniform weights put there)."""
        mass = float(np.mean(self.pool.private_class >= 0)) if len(self.pool) else 0.0
        return ({"public_private_class_mass": mass},
                {"public_private_class_mass": {"what": "fraction of public rows whose class is a private class "
                                                       "(the weight mass uniform sampling puts there)"}})


@METHODS.register("icgan_nonprivate")
class ICGANNonPrivate(Method):
    """Private features decoded by g directly: the non-private upper bound of paper 000 (a reference)."""

    tiny = ("method=icgan_nonprivate", *SHOES)

    needs_public = True
    kinds = ("image",)
    reference = True

    def fit(
        self, private: Split, budget: PrivacyBudget, ledger: PrivacyLedger, public: Split | None = None
    ) -> None:
        from dpsyn.public import clip_to_unit_ball

        ledger.add(NonPrivateEvent(label="icgan_nonprivate: private features fed to the public generator as is"))
        self.models = self.public_models()
        self.feats, self.n_clipped = clip_to_unit_ball(np.asarray(self.models.encode(private.x), dtype=np.float32))
        self.y = np.asarray(private.y, dtype=np.int64)

    def sample(self, n: int, labels: np.ndarray | None = None) -> Samples:
        rng = np.random.default_rng(self.ctx.seed)
        if labels is None:
            idx = rng.choice(len(self.feats), size=n, replace=n > len(self.feats))
        else:
            idx = np.empty(len(labels), dtype=np.int64)
            for c in np.unique(labels):
                pool = np.flatnonzero(self.y == c)
                if len(pool) == 0:
                    raise ValueError(f"no private example of class {c}")
                where = np.flatnonzero(labels == c)
                idx[where] = rng.choice(pool, size=len(where), replace=len(where) > len(pool))
        x = decode_seeded(self.models, self.feats[idx], self.ctx.seed)
        return Samples(x, self.y[idx], {"method": "icgan_nonprivate", "features": "private rows (seeded resample)",
                                        "clipped_rows": int(self.n_clipped)})
