"""``real``: the private data itself, released as is — the utility ceiling every table compares against.

Not a DP method: its ledger records one non-private release and its result is flagged as a reference.
"""

from __future__ import annotations

import numpy as np

from dpsyn.data.base import Split
from dpsyn.methods.base import METHODS, Method, PrivacyBudget, Samples
from dpsyn.methods.tiny import TABLE_METRICS
from dpsyn.privacy import NonPrivateEvent, PrivacyLedger


@METHODS.register("real")
class RealData(Method):
    """Returns (a seeded resample of) the private data."""

    tiny = ("method=real", "dataset=breast_cancer", *TABLE_METRICS)

    reference = True

    def fit(
        self, private: Split, budget: PrivacyBudget, ledger: PrivacyLedger, public: Split | None = None
    ) -> None:
        ledger.add(NonPrivateEvent(label="real: private data released as is"))
        self._data = private

    def sample(self, n: int, labels: np.ndarray | None = None) -> Samples:
        rng = np.random.default_rng(self.ctx.seed)
        if labels is None:
            idx = rng.choice(len(self._data), size=n, replace=n > len(self._data))
        else:
            # for each requested label, a private example of that class
            idx = np.empty(len(labels), dtype=np.int64)
            for c in np.unique(labels):
                pool = np.flatnonzero(self._data.y == c)
                if len(pool) == 0:
                    raise ValueError(f"no private example of class {c}")
                where = np.flatnonzero(labels == c)
                idx[where] = rng.choice(pool, size=len(where), replace=len(where) > len(pool))
        return Samples(self._data.x[idx], self._data.y[idx], {"method": "real", "indices": "seeded resample"})
