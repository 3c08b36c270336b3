"""Report noisy max: choose the best of several candidates by their counts on private rows, with Laplace noise.

A candidate's score is a count over private rows (the DPImageBench protocol: how many of the real validation rows a
classifier at one epoch gets right). Neighbouring datasets differ by adding or removing one row (dpsyn's relation),
which raises every count by 0 or 1 (or lowers every count by 0 or 1): the counts have sensitivity 1 and move in
one direction together. Adding Laplace(1/eps) noise to each count and releasing only the index of the largest
noisy count is then eps-DP, whatever the number of candidates (Dwork & Roth 2014, "The Algorithmic Foundations of
Differential Privacy", Claim 3.9). The noisy counts themselves are not released. The ledger records the selection
as ``ApproxDPEvent(epsilon=eps, delta=0)`` (:func:`noisy_max_event`); ``python -m dpsyn.cli.audit`` checks it (row
``noisy_max_selection``).

:class:`NoisyMax` takes the candidates one at a time (a classifier's epochs, whose weights cannot all be kept), which
is the same mechanism: each count gets its own independent draw and only the running argmax is kept.
:func:`dpsyn.privacy.noise.laplace_mechanism` draws the noise.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

from dpsyn.privacy.laplace import laplace_scale
from dpsyn.privacy.ledger import ApproxDPEvent
from dpsyn.privacy.noise import laplace_mechanism


class NoisyMax:
    """Report noisy max over candidates offered one at a time (see the module docstring).

    Each :meth:`offer` may also hand in an array of counts: one per independent selection run side by side (the
    audit runs millions of selections this way); :attr:`best` is then an array of indices.

    Args:
        epsilon: the selection's epsilon (finite, > 0); each count gets Laplace(1/epsilon) noise.
        generator: a DP generator (:func:`dpsyn.privacy.dp_numpy_generator`), never the run seed's.

    Raises:
        ValueError: epsilon not finite and > 0, or a generator that is not a numpy Generator.
    """

    def __init__(self, *, epsilon: float, generator: np.random.Generator) -> None:
        self.scale = laplace_scale(epsilon=epsilon)
        self.epsilon = float(epsilon)
        if not isinstance(generator, np.random.Generator):
            raise ValueError(f"generator must be a numpy Generator (dpsyn.privacy.dp_numpy_generator), got {generator!r}")
        self._generator = generator
        self._best_noisy: Any = None
        self.best: Any = None  # index of the selected candidate so far (None before the first offer)
        self.n = 0

    def offer(self, count: Any) -> Any:
        """Score the next candidate (index ``self.n``).

        Args:
            count: the candidate's count on the private rows (sensitivity 1), or an array of counts (one per
                selection run side by side).

        Returns:
            Whether this candidate now has the largest noisy count (a bool, or an array of bools).

        Raises:
            ValueError: a count array whose shape differs from the earlier offers'.
        """
        noisy = laplace_mechanism(np.asarray(count, dtype=np.float64) if np.ndim(count) else float(count),
                                  self.scale, generator=self._generator)
        index, self.n = self.n, self.n + 1
        if self._best_noisy is None:
            self._best_noisy = noisy
            self.best = index if np.ndim(noisy) == 0 else np.zeros(np.shape(noisy), dtype=np.int64)
            return True if np.ndim(noisy) == 0 else np.ones(np.shape(noisy), dtype=bool)
        if np.shape(noisy) != np.shape(self._best_noisy):
            raise ValueError(f"count shape {np.shape(noisy)} differs from the earlier offers' "
                             f"{np.shape(self._best_noisy)}")
        won = noisy > self._best_noisy
        if np.ndim(noisy) == 0:
            if won:
                self._best_noisy, self.best = noisy, index
            return bool(won)
        self._best_noisy = np.where(won, noisy, self._best_noisy)
        self.best = np.where(won, index, self.best)
        return won


def report_noisy_max(counts: Iterable[float], *, epsilon: float, generator: np.random.Generator) -> int:
    """The index of the largest of ``counts + Laplace(1/epsilon)`` (eps-DP for sensitivity-1 counts): one
    selection, its candidates offered in order to a :class:`NoisyMax`.

    Args:
        counts: the candidates' counts on the private rows.
        epsilon: the selection's epsilon (finite, > 0).
        generator: a DP generator (:func:`dpsyn.privacy.dp_numpy_generator`).

    Returns:
        The selected index.

    Raises:
        ValueError: no candidates, or a bad epsilon or generator.
    """
    selector = NoisyMax(epsilon=epsilon, generator=generator)
    for c in counts:
        selector.offer(c)
    if selector.best is None:
        raise ValueError("report noisy max needs at least one candidate")
    return int(selector.best)


def noisy_max_event(*, epsilon: float, label: str) -> ApproxDPEvent:
    """The ledger's record of one report-noisy-max selection: ``(epsilon, 0)``-DP, whatever the candidates."""
    return ApproxDPEvent(epsilon=float(epsilon), delta=0.0, label=label)
