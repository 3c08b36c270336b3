"""Tabular utility: AUROC and AUPRC of scikit-learn classifiers trained on synthetic rows, tested once on real rows.

The PATE-GAN (Jordon et al. 2019) / G-PATE (Long et al. 2021) protocol: train predictive models on the synthetic
table, evaluate them on the real test table, and report AUROC and AUPRC per model and averaged. The four models here
are scikit-learn's LogisticRegression, RandomForestClassifier, GradientBoostingClassifier and MLPClassifier, each
seeded; logistic regression and the MLP see standardised features (the scaler is fitted on the synthetic rows only).
No hyper-parameter is tuned, on the test split or elsewhere: the real test split, sealed in a
:class:`~dpsyn.metrics.sealed.SealedSplit`, is read exactly once, for all four models together.

Binary labels: AUROC/AUPRC of the positive class (the larger label). More classes: macro one-vs-rest AUROC and macro
AUPRC (average precision) over the classes present in the test split. A synthetic table with a single class cannot
train a classifier: that raises ``ValueError`` (rather than reporting NaN, so a degenerate generator is noticed).
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from sklearn.base import ClassifierMixin
from sklearn.ensemble import GradientBoostingClassifier, RandomForestClassifier
from sklearn.exceptions import ConvergenceWarning
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import average_precision_score, roc_auc_score
from sklearn.neural_network import MLPClassifier
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler

from dpsyn.metrics.sealed import SealedSplit, TestSetReuseError, seal

log = logging.getLogger(__name__)

#: model name -> builder(seed) of an unfitted scikit-learn classifier
TABULAR_CLASSIFIERS: dict[str, Callable[[int], ClassifierMixin]] = {
    "logreg": lambda seed: make_pipeline(StandardScaler(), LogisticRegression(max_iter=2000, random_state=seed)),
    "random_forest": lambda seed: RandomForestClassifier(n_estimators=100, random_state=seed, n_jobs=1),
    "gradient_boosting": lambda seed: GradientBoostingClassifier(random_state=seed),
    "mlp": lambda seed: make_pipeline(
        StandardScaler(), MLPClassifier(hidden_layer_sizes=(100,), max_iter=500, random_state=seed)
    ),
}


def _class_scores(model: Any, x: np.ndarray, classes: np.ndarray) -> np.ndarray:
    """``predict_proba`` columns aligned to ``classes`` (zeros for classes the model never saw)."""
    proba = model.predict_proba(x)
    out = np.zeros((len(x), len(classes)), dtype=np.float64)
    col = {c: i for i, c in enumerate(classes)}
    for j, c in enumerate(model.classes_):
        out[:, col[c]] = proba[:, j]
    return out


def auroc_auprc(y: np.ndarray, scores: np.ndarray, classes: np.ndarray) -> tuple[float, float]:
    """AUROC and AUPRC of class scores.

    Args:
        y: (N,) true labels.
        scores: (N, len(classes)) class scores (probabilities).
        classes: the label of each score column, sorted.

    Returns:
        ``(auroc, auprc)``: of the positive class ``classes[1]`` when there are two classes; else the macro averages
        of one-vs-rest AUROC and of average precision over the classes present in ``y`` (a class needs positives
        and negatives in ``y`` to have an AUROC).

    Raises:
        ValueError: if ``y`` has labels outside ``classes`` or too few classes to score.
    """
    unknown = np.setdiff1d(np.unique(y), classes)
    if len(unknown):
        raise ValueError(f"test labels {unknown.tolist()} are not among the classes {classes.tolist()}; "
                         "pass every class of the task as `classes`")
    if len(classes) == 2:
        pos = y == classes[1]
        if pos.all() or not pos.any():
            raise ValueError("the test split has a single class: AUROC is undefined")
        return float(roc_auc_score(pos, scores[:, 1])), float(average_precision_score(pos, scores[:, 1]))
    aurocs, auprcs = [], []
    for j, c in enumerate(classes):
        pos = y == c
        if pos.any() and not pos.all():
            aurocs.append(roc_auc_score(pos, scores[:, j]))
            auprcs.append(average_precision_score(pos, scores[:, j]))
    if not aurocs:
        raise ValueError("the test split has a single class: AUROC is undefined")
    return float(np.mean(aurocs)), float(np.mean(auprcs))


def tabular_auroc(
    synthetic: tuple[np.ndarray, np.ndarray],
    test: SealedSplit | tuple[np.ndarray, np.ndarray],
    *,
    seed: int,
    classifiers: Sequence[str] = tuple(TABULAR_CLASSIFIERS),
    classes: Sequence[int] | np.ndarray | None = None,
) -> dict[str, Any]:
    """AUROC/AUPRC on the real test table of the PATE-GAN/G-PATE classifiers trained on a synthetic table.

    Args:
        synthetic: ``(x, y)``: (N, D) synthetic rows and (N,) labels.
        test: the real test table, as a :class:`SealedSplit` (with a read left) or an ``(x, y)`` pair (sealed here).
        seed: ``random_state`` of every classifier.
        classifiers: which of :data:`TABULAR_CLASSIFIERS` to train (default: all four).
        classes: every label of the task (default: the labels present in the synthetic table). Give it when the
            synthetic table may miss a class that the test split has.

    Returns:
        ``auroc`` and ``auprc`` (means over the classifiers), ``auroc_<name>`` and ``auprc_<name>`` per classifier,
        ``classifiers``, ``n_classes``, ``n_train``, ``n_test``, ``test_reads``.

    Raises:
        ValueError: if the synthetic table has fewer than two classes (no classifier can be trained: a clear error
            rather than NaN), unlabelled or mismatched data, an unknown classifier name, or test labels outside
            ``classes``.
        TestSetReuseError: if ``test`` is a sealed split with no read left (checked before any training).
    """
    x, y = synthetic
    if y is None:
        raise ValueError("tabular AUROC needs labelled synthetic rows (the method returned no labels)")
    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y)
    if x.ndim != 2 or len(x) != len(y):
        raise ValueError(f"synthetic rows must be (N, D) with N labels, got x {x.shape} and y {y.shape}")
    if not np.isfinite(x).all():
        raise ValueError("synthetic rows contain NaN or infinite values")
    unknown = [c for c in classifiers if c not in TABULAR_CLASSIFIERS]
    if unknown or not classifiers:
        raise ValueError(f"unknown tabular classifiers {unknown}; choose from {sorted(TABULAR_CLASSIFIERS)}")
    present = np.unique(y)
    if len(present) < 2:
        raise ValueError(
            f"the synthetic table has a single class ({present.tolist()}): no classifier can be trained, so "
            "AUROC/AUPRC are undefined (the generator collapsed to one label)"
        )
    all_classes = np.unique(np.concatenate([np.asarray(classes), present]) if classes is not None else present)
    sealed = seal(test, name="test")
    if sealed.reads_left < 1:
        raise TestSetReuseError(f"sealed split {sealed.name!r} has no read left ({sealed.n_reads} already made)")

    models = {}
    for name in classifiers:
        model = TABULAR_CLASSIFIERS[name](int(seed))
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", ConvergenceWarning)
            model.fit(x, y)
        for w in caught:
            if issubclass(w.category, ConvergenceWarning):
                log.warning("tabular classifier %s did not converge on the synthetic rows: %s", name, w.message)
            else:
                warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
        models[name] = model
        log.info("tabular classifier %s fitted on %d synthetic rows", name, len(x))

    def predict_all(test_x: np.ndarray) -> dict[str, np.ndarray]:
        test_x = np.asarray(test_x, dtype=np.float64)
        return {name: _class_scores(m, test_x, all_classes) for name, m in models.items()}

    def score_all(test_y: np.ndarray, scores: dict[str, np.ndarray]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for name, s in scores.items():
            out[f"auroc_{name}"], out[f"auprc_{name}"] = auroc_auprc(np.asarray(test_y), s, all_classes)
        return out

    # the only contact with the real test split
    result = sealed.evaluate_once(predict_all, score_all, reader=f"{__name__}.tabular_auroc")
    result["auroc"] = float(np.mean([result[f"auroc_{n}"] for n in classifiers]))
    result["auprc"] = float(np.mean([result[f"auprc_{n}"] for n in classifiers]))
    result.update(classifiers=list(classifiers), n_classes=len(all_classes), n_train=len(x), n_test=len(sealed),
                  test_reads=sealed.n_reads)
    return result
