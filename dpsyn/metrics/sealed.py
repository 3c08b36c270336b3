"""A sealed evaluation split: the real test data behind an object that counts, limits and logs every read.

Published pipelines leak the test set by selecting epochs or checkpoints on it (G-PATE keeps the best of 600 epochs
by test accuracy; DPImageBench's README admits the same). Here the test split is wrapped in a :class:`SealedSplit`
whose only reader is :meth:`SealedSplit.evaluate_once`: the caller hands in a prediction function (it sees the inputs,
never the labels) and a metric function (it sees the labels and the predictions, never the inputs). Each call is one
*read*; by default a split can be read once, and a second read raises :class:`TestSetReuseError` *before* any data
is handed out. Every read is recorded (who, when) so ``result.json`` can show that the protocol touched the test
split exactly as often as it claims.

The arrays are kept as private attributes; Python cannot make them unreachable, so the seal is a protocol guarantee
(all dpsyn metrics go through :meth:`~SealedSplit.evaluate_once`, and the tests check the read counts), not a
security boundary.
"""

from __future__ import annotations

import datetime as _dt
import inspect
import logging
import threading
from collections.abc import Callable
from typing import Any, TypeVar

import numpy as np

log = logging.getLogger(__name__)

P = TypeVar("P")


class TestSetReuseError(RuntimeError):
    """Raised when a sealed split is read more often than its ``max_reads`` allows."""

    __test__ = False  # not a pytest test class, despite the name


def accuracy_from_logits(y: np.ndarray, scores: np.ndarray) -> dict[str, float]:
    """Default metric: accuracy of ``argmax(scores, 1)`` (or of ``scores`` itself when it is 1-D labels).

    Args:
        y: (N,) true labels.
        scores: (N, C) scores/logits or (N,) predicted labels.

    Returns:
        ``{"acc": float}``.

    Raises:
        ValueError: if the number of predictions differs from the number of labels.
    """
    scores = np.asarray(scores)
    pred = scores.argmax(1) if scores.ndim == 2 else scores
    if len(pred) != len(y):
        raise ValueError(f"got {len(pred)} predictions for {len(y)} test examples")
    return {"acc": float((pred == y).mean())}


class SealedSplit:
    """The real evaluation split, readable only through :meth:`evaluate_once`, at most ``max_reads`` times.

    Args:
        x: (N, ...) inputs (images or table rows). Stored by reference (no copy).
        y: (N,) labels.
        name: what the split is (recorded in read logs and error messages), e.g. ``"fmnist/test"``.
        max_reads: how many reads are allowed (1: the honest protocol; raise it only for a documented reason such
            as several metrics sharing one split, each reading it once).

    Raises:
        ValueError: if ``x`` and ``y`` differ in length, the split is empty, or ``max_reads < 1``.
    """

    def __init__(self, x: np.ndarray, y: np.ndarray, *, name: str = "test", max_reads: int = 1) -> None:
        if y is None:
            raise ValueError(f"sealed split {name!r} needs labels (y is None)")
        if len(x) != len(y):
            raise ValueError(f"sealed split {name!r}: x has {len(x)} rows but y has {len(y)}")
        if len(x) == 0:
            raise ValueError(f"sealed split {name!r} is empty")
        if int(max_reads) < 1:
            raise ValueError(f"max_reads must be >= 1, got {max_reads}")
        self._x, self._y = x, np.asarray(y)
        self.name = name
        self.max_reads = int(max_reads)
        self._reads: list[dict[str, Any]] = []
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._x)

    def __repr__(self) -> str:
        return f"SealedSplit(name={self.name!r}, n={len(self)}, reads={self.n_reads}/{self.max_reads})"

    @property
    def n_reads(self) -> int:
        """How many reads have been made (including any that raised inside the caller's functions)."""
        return len(self._reads)

    @property
    def reads_left(self) -> int:
        """How many reads are still allowed."""
        return self.max_reads - self.n_reads

    @property
    def reads(self) -> list[dict[str, Any]]:
        """A copy of the read log: one ``{"reader", "time", "n"}`` record per read, in order."""
        return [dict(r) for r in self._reads]

    def evaluate_once(
        self,
        predict_fn: Callable[[np.ndarray], P],
        metric_fn: Callable[[np.ndarray, P], dict[str, Any]] | None = None,
        *,
        reader: str | None = None,
    ) -> dict[str, Any]:
        """Read the split: ``metric_fn(y, predict_fn(x))``. Counts as one read even if either function raises.

        Args:
            predict_fn: maps the inputs to predictions (it never sees the labels). Any return type ``metric_fn``
                understands (an array of logits, a dict of per-model scores, ...).
            metric_fn: maps (labels, predictions) to a dict of metric values; default
                :func:`accuracy_from_logits`.
            reader: who reads (recorded in :attr:`reads`); default: the calling function's ``module.qualname``.

        Returns:
            The dict returned by ``metric_fn``.

        Raises:
            TestSetReuseError: if the split has already been read ``max_reads`` times (raised before any data is
                handed out).
        """
        if reader is None:
            caller = inspect.currentframe().f_back  # type: ignore[union-attr]
            reader = f"{caller.f_globals.get('__name__', '?')}.{caller.f_code.co_name}" if caller else "?"
        with self._lock:
            if len(self._reads) >= self.max_reads:
                previous = ", ".join(r["reader"] for r in self._reads)
                raise TestSetReuseError(
                    f"sealed split {self.name!r} was already read {len(self._reads)} time(s) (max_reads="
                    f"{self.max_reads}; by {previous}); refused read by {reader}. Select models on held-out "
                    "synthetic data, not on the test split."
                )
            self._reads.append(
                {"reader": reader, "time": _dt.datetime.now(_dt.timezone.utc).isoformat(), "n": len(self._x)}
            )
        log.info("sealed split %r read %d/%d by %s", self.name, self.n_reads, self.max_reads, reader)
        predictions = predict_fn(self._x)
        return (metric_fn or accuracy_from_logits)(self._y, predictions)


def seal(test: SealedSplit | tuple[np.ndarray, np.ndarray], *, name: str = "test") -> SealedSplit:
    """Return ``test`` if it is already a :class:`SealedSplit`, else seal an ``(x, y)`` pair (one read allowed).

    Args:
        test: a sealed split, or an ``(x, y)`` tuple (any object with ``x`` and ``y`` attributes works too).
        name: name for a newly sealed split.

    Returns:
        The sealed split.

    Raises:
        ValueError: if ``test`` is neither a sealed split nor an ``(x, y)`` pair.
    """
    if isinstance(test, SealedSplit):
        return test
    if hasattr(test, "x") and hasattr(test, "y"):
        return SealedSplit(test.x, test.y, name=name)
    if isinstance(test, tuple | list) and len(test) == 2:
        return SealedSplit(test[0], test[1], name=name)
    raise ValueError(f"expected a SealedSplit or an (x, y) pair for the test split, got {type(test).__name__}")
