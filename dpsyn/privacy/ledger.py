"""The privacy ledger: every release a run makes, as an event, and their composition into one epsilon.

A method records each release with :meth:`PrivacyLedger.add`; the run asks :meth:`PrivacyLedger.epsilon` what was
spent, refuses to write a result that overspends (:meth:`PrivacyLedger.check_within_budget`), and saves the ledger
as ``privacy.json`` in the run directory, so that an interrupted run resumes with the ledger restored.

Event kinds (each a dataclass with a ``kind`` and its parameters, JSON-serialisable):

* :class:`GaussianEvent`: ``count`` adaptive sensitivity-1 Gaussian releases with noise multiplier ``nm``
  (``mu``-GDP with ``mu = sqrt(count)/nm``).
* :class:`SampledGaussianEvent`: a DP-SGD run (Poisson-subsampled Gaussian), its steps growing as training goes.
* :class:`UniformChoiceGaussianEvent`: steps of a Gaussian mechanism on one of K units drawn uniformly (GS-WGAN's
  critics; :mod:`dpsyn.privacy.uniform_choice`), its steps growing as training goes.
* :class:`ApproxDPEvent`: a mechanism already calibrated to ``(epsilon, delta)`` (classic Gaussian, Laplace, ...).
* :class:`NonPrivateEvent`: a release without DP (epsilon = inf).
* :class:`PATEEvent`: Confident-GNMax queries to a teacher ensemble (G-PATE, PATE-GAN), growing as training goes.

Neighbouring datasets differ by removing or adding one private row (:data:`ADJACENCY`), for every event: each
event's analysis is stated under that relation, or converts to it (:attr:`PrivacyEvent.relation`; docs/privacy.md
says what each mechanism's analysis assumes). privacy.json records the relation and, per event, its sampling scheme.

Composition in :meth:`PrivacyLedger.epsilon` (the simplest exact-enough rule that applies):

1. any non-private event: ``inf``;
2. approximate-DP events compose by basic composition: their epsilons add and their deltas are taken from the
   delta available to the other events (a Laplace release of class counts, as G-PATE's and PATE-GAN's tabular
   two-step class-ratio release, is ``ApproxDPEvent(epsilon=..., delta=0.0)``);
3. the other events: only Gaussian events -> exact GDP; a single DP-SGD event -> its own accountant (rdp/prv);
   otherwise (and whenever a PATE event has queries) RDP composition at dpsyn's orders
   (:func:`dpsyn.privacy.dpsgd.rdp_orders`): Opacus's sampled Gaussian RDP for DP-SGD, ``count * alpha/(2 nm^2)``
   for Gaussian events, each PATE event's RDP curve (:meth:`PATEEvent.rdp`), converted with
   :func:`dpsyn.privacy.dpsgd.rdp_to_epsilon` (Opacus's ``get_privacy_spent``, Balle et al. 2020), the conversion
   the PATE analysis uses too.

Recording PATE queries (one event per teacher ensemble, queries added per batch)::

    event_id = ledger.add(PATEEvent(sigma_threshold=3000.0, sigma=1000.0, threshold=2000.0,
                                    bound="data_independent", label="G-PATE gradient votes"))
    answered, label = confident_gnmax(votes, sigma_threshold=..., sigma=..., threshold=..., generator=gen)
    ledger.record_pate_queries(event_id, votes, answered)   # before the answers are used
    ledger.check_within_budget()
"""

from __future__ import annotations

import contextlib
import copy
import json
import logging
import math
import os
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from dpsyn.privacy.dpsgd import (
    ACCOUNTANTS,
    check_accountant,
    dpsgd_epsilon,
    opacus_version,
    rdp_orders,
    rdp_orders_description,
    rdp_to_epsilon,
)
from dpsyn.privacy.gaussian import (
    _check_count,
    _check_delta,
    _check_positive,
    gaussian_rdp,
    gdp_epsilon_from_mu,
)
from dpsyn.privacy.pate import (
    PATE_BOUNDS,
    PATESmoothRelease,
    check_pate_bound,
    confident_gnmax_rdp,
    gnmax_rdp_data_independent,
    gnss_rdp,
    threshold_rdp_data_independent,
)
from dpsyn.results.io import atomic_write_json

logger = logging.getLogger(__name__)

LEDGER_FORMAT = "dpsyn.privacy_ledger"
LEDGER_VERSION = 1
PRIVACY_FILENAME = "privacy.json"
SAMPLINGS: tuple[str, ...] = ("poisson",)
"""Sampling schemes the DP-SGD accountants support (both assume Poisson subsampling)."""
ADJACENCY = "add_remove"
"""dpsyn's one neighbour relation: two datasets are neighbours when one is the other with one private row removed."""
ADJACENCY_TEXT = "add/remove one private row (the same relation for every event)"

_BUDGET_RTOL = 1e-9


class BudgetExceededError(RuntimeError):
    """The ledger's epsilon exceeds its target: the run must stop and write no result."""


def _check_label(label: str) -> str:
    if not isinstance(label, str):
        raise ValueError(f"label must be a string, got {label!r}")
    return label


# --------------------------------------------------------------------------------------------------------------------
# events
# --------------------------------------------------------------------------------------------------------------------


@dataclass(kw_only=True)
class PrivacyEvent:
    """Base class of ledger events: a ``kind`` (class attribute) and the release's parameters."""

    kind: ClassVar[str] = ""
    label: str = ""
    relation: ClassVar[str] = "add/remove one row: the mechanism's own analysis"
    """How the event's analysis meets :data:`ADJACENCY` (written to privacy.json, not read back)."""
    sampling_scheme: ClassVar[str] = "none"
    """The sampling its accounting assumes, for events without a ``sampling`` field (written, not read back)."""

    def to_dict(self) -> dict[str, Any]:
        """The event as a JSON-serialisable dict: ``{"kind": ..., <field>: <value>, ..., "relation": ...}``, with
        ``sampling`` for every kind (a field where the event has one)."""
        out = {"kind": self.kind, **{f.name: getattr(self, f.name) for f in fields(self)}}
        out.setdefault("sampling", self.sampling_scheme)
        out["relation"] = self.relation
        return out

    @staticmethod
    def from_dict(data: Mapping[str, Any]) -> PrivacyEvent:
        """Rebuild an event from :meth:`to_dict` output.

        Raises:
            ValueError: On an unknown kind or unexpected fields.
        """
        if not isinstance(data, Mapping) or "kind" not in data:
            raise ValueError(f"a privacy event must be a mapping with a 'kind', got {data!r}")
        kind = data["kind"]
        cls = EVENT_KINDS.get(kind)
        if cls is None:
            raise ValueError(f"unknown privacy event kind {kind!r}; known: {', '.join(sorted(EVENT_KINDS))}")
        allowed = {f.name for f in fields(cls)}
        # written by to_dict for the reader, not parameters (a field "sampling" is read back and checked)
        params = {k: v for k, v in data.items()
                  if k != "kind" and k != "relation" and not (k == "sampling" and k not in allowed)}
        unknown = sorted(set(params) - allowed)
        if unknown:
            raise ValueError(f"unexpected fields {unknown} for privacy event kind {kind!r}; allowed: {sorted(allowed)}")
        return cls(**params)


@dataclass(kw_only=True)
class GaussianEvent(PrivacyEvent):
    """``count`` adaptive sensitivity-1 Gaussian releases with noise std ``noise_multiplier`` (times sensitivity).

    Attributes:
        noise_multiplier: Noise std divided by the L2 sensitivity, > 0.
        count: Number of such releases, >= 0.
        label: Free text saying what was released.
    """

    kind: ClassVar[str] = "gaussian"
    noise_multiplier: float
    count: int = 1

    def __post_init__(self) -> None:
        self.noise_multiplier = _check_positive("noise_multiplier", self.noise_multiplier)
        self.count = _check_count("count", self.count)
        self.label = _check_label(self.label)

    @property
    def inverse_variance(self) -> float:
        """``count / noise_multiplier^2``, i.e. ``mu^2`` of this event."""
        return self.count / self.noise_multiplier**2


@dataclass(kw_only=True)
class SampledGaussianEvent(PrivacyEvent):
    """A DP-SGD run: ``steps`` Poisson-subsampled Gaussian steps, accounted by ``accountant``.

    ``steps`` grows in place as training proceeds (:meth:`add_steps` or :meth:`PrivacyLedger.record_steps`).

    Attributes:
        noise_multiplier: Noise std divided by the clipping norm, > 0.
        sample_rate: Poisson sampling rate in (0, 1].
        steps: Optimiser steps taken so far, >= 0.
        accountant: ``"rdp"`` or ``"prv"`` (always explicit).
        sampling: The data loader's sampling scheme, stated by the code that draws the batches
            (:data:`dpsyn.lit.dpsgd.POISSON`); only ``"poisson"`` is accounted for: any other scheme (a uniform
            choice of one of K critics, a shuffled loader) is refused, whatever its noise.
        label: Free text saying what was trained.
    """

    kind: ClassVar[str] = "sampled_gaussian"
    relation: ClassVar[str] = "add/remove one row: Opacus's Poisson-subsampled RDP/PRV analysis"
    noise_multiplier: float
    sample_rate: float
    steps: int
    accountant: str
    sampling: str

    def __post_init__(self) -> None:
        self.noise_multiplier = _check_positive("noise_multiplier", self.noise_multiplier)
        q = _check_positive("sample_rate", self.sample_rate)
        if q > 1.0:
            raise ValueError(f"sample_rate must lie in (0, 1], got {self.sample_rate!r}")
        self.sample_rate = q
        self.steps = _check_count("steps", self.steps)
        check_accountant(self.accountant)
        if self.sampling not in SAMPLINGS:
            raise ValueError(
                f"sampling {self.sampling!r} is not accounted for: the DP-SGD accountants assume "
                f"{', '.join(repr(s) for s in SAMPLINGS)} sampling; use a Poisson data loader"
            )
        self.label = _check_label(self.label)

    def add_steps(self, n: int = 1) -> None:
        """Record ``n`` more optimiser steps.

        Raises:
            ValueError: If ``n`` is not an integer >= 0.
        """
        self.steps += _check_count("n", n)


@dataclass(kw_only=True)
class ApproxDPEvent(PrivacyEvent):
    """A mechanism already calibrated to ``(epsilon, delta)``-DP (classic Gaussian, Laplace, ...).

    Attributes:
        epsilon: Its epsilon, finite and >= 0 (a non-private release is a :class:`NonPrivateEvent`).
        delta: Its delta in [0, 1).
        label: Free text saying what was released.
    """

    kind: ClassVar[str] = "approx_dp"
    epsilon: float
    delta: float

    def __post_init__(self) -> None:
        e = self.epsilon
        if isinstance(e, bool) or not isinstance(e, (int, float)) or not 0.0 <= float(e) < math.inf:
            raise ValueError(f"epsilon must be finite and >= 0 (use NonPrivateEvent for eps = inf), got {e!r}")
        self.epsilon = float(e)
        d = self.delta
        if isinstance(d, bool) or not isinstance(d, (int, float)) or not 0.0 <= float(d) < 1.0:
            raise ValueError(f"delta must lie in [0, 1), got {d!r}")
        self.delta = float(d)
        self.label = _check_label(self.label)


@dataclass(kw_only=True)
class NonPrivateEvent(PrivacyEvent):
    """A release without differential privacy: the ledger's epsilon becomes ``inf`` ("non-private")."""

    kind: ClassVar[str] = "non_private"

    def __post_init__(self) -> None:
        self.label = _check_label(self.label)


_SMOOTH_KEYS = tuple(PATESmoothRelease.__dataclass_fields__)


@dataclass(kw_only=True)
class PATEEvent(PrivacyEvent):
    """Confident-GNMax queries to one teacher ensemble (Papernot et al. 2018; :mod:`dpsyn.privacy.pate`).

    The queries grow in place as training goes (:meth:`add_queries` or :meth:`PrivacyLedger.record_pate_queries`),
    which also accumulates their data-dependent RDP at ``orders`` when ``bound`` is ``"data_dependent"`` (the votes
    themselves are not kept). Under the data-independent bound it is not accumulated and stays zero: it is a function
    of the private votes without noise, and the event is published in privacy.json and result.json. ``bound`` says
    which RDP the ledger's epsilon uses:

    * ``"data_independent"``: ``queries * (alpha/(2 sigma_threshold^2) + alpha/sigma^2)``: every query charged
      the threshold check and GNMax (whether it was answered depends on the data); the default, a true DP bound.
    * ``"data_dependent"``: the accumulated data-dependent RDP (threshold for every query, GNMax for the answered
      ones), as Papernot et al. and G-PATE report; it depends on the votes, so publishing it is not private unless
      it goes through a smooth-sensitivity release (:meth:`PrivacyLedger.record_pate_smooth_release`).
    * ``"renyi_filter"``: a Renyi filter (Feldman & Zrnic 2021, Thm 3.1; Lecuyer 2021) at one order
      ``filter_order`` fixed before the run. Each threshold check is a Gaussian mechanism of RDP
      ``alpha/(2 sigma_threshold^2)``; GNMax runs only on the queries the check answered, a choice made on that
      check's released output, so a query pays ``alpha/sigma^2`` only if answered. The filter's theorem: mechanisms
      whose RDP at ``alpha`` is chosen from the outputs so far, stopped before their sum could pass ``B``
      (``filter_budget``, fixed before the run), compose to ``(alpha, B)``-RDP. The realised sum
      ``alpha (queries/(2 sigma_threshold^2) + answered/sigma^2)`` is a function of released outputs only (which
      queries were answered); the method stops before a round could take it past ``B``
      (:meth:`PrivacyLedger.would_exceed` on :meth:`with_queries` with every query answered). The guarantee reported
      is ``B`` at ``filter_order`` (never the realised sum, which is not a guarantee), and, at every order, the
      data-independent bound of ``max_queries`` (the most queries the run can make, fixed before it; None: no bound
      there). A run that passes ``B`` has no guarantee: its RDP is ``inf`` and the ledger refuses it.
      :meth:`PrivacyLedger.renyi_filter` picks the order and ``B`` for a target.

    A smooth-sensitivity release, once recorded in ``smooth_release``, adds its own RDP (Thm 23) to the event's.

    Attributes:
        sigma_threshold: Std of the noise on the maximum count (G-PATE's sigma1), > 0.
        sigma: Std of the GNMax noise on each count (G-PATE's sigma2), > 0.
        threshold: The threshold ``T`` on the noisy maximum count.
        bound: ``"data_independent"`` or ``"data_dependent"``.
        queries: Queries made so far, >= 0.
        answered: Of which answered, ``0 <= answered <= queries``.
        orders: The RDP orders of ``rdp_data_dependent`` (dpsyn's :func:`~dpsyn.privacy.dpsgd.rdp_orders` by
            default; the ledger composes at those).
        rdp_data_dependent: Accumulated data-dependent RDP, one value per order (zeros by default, and always zeros
            under the data-independent bound: not a function of the votes then).
        filter_order, filter_budget: The Renyi filter's order and RDP budget (``renyi_filter`` only; None else).
        max_queries: The most queries the run can make, fixed before it (``renyi_filter``; None: unbounded).
        smooth_release: The smooth-sensitivity release's :meth:`~dpsyn.privacy.pate.PATESmoothRelease.to_dict`,
            or None.
        label: Free text saying what was queried.
    """

    kind: ClassVar[str] = "pate"
    sigma_threshold: float
    sigma: float
    threshold: float
    bound: str = "data_independent"
    queries: int = 0
    answered: int = 0
    orders: list[float] = field(default_factory=list)
    rdp_data_dependent: list[float] = field(default_factory=list)
    smooth_release: dict[str, Any] | None = None
    filter_order: float | None = None
    filter_budget: float | None = None
    max_queries: int | None = None

    def __post_init__(self) -> None:
        self.sigma_threshold = _check_positive("sigma_threshold", self.sigma_threshold)
        self.sigma = _check_positive("sigma", self.sigma)
        t = self.threshold
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(float(t)):
            raise ValueError(f"threshold must be a finite real number, got {t!r}")
        self.threshold = float(t)
        check_pate_bound(self.bound)
        self.queries = _check_count("queries", self.queries)
        self.answered = _check_count("answered", self.answered)
        if self.answered > self.queries:
            raise ValueError(f"answered ({self.answered}) cannot exceed queries ({self.queries})")
        if not isinstance(self.orders, (list, tuple)) or not isinstance(self.rdp_data_dependent, (list, tuple)):
            raise ValueError("orders and rdp_data_dependent must be lists of numbers")
        self.orders = [float(a) for a in self.orders] or rdp_orders()
        if not all(a > 1 and math.isfinite(a) for a in self.orders):
            raise ValueError(f"RDP orders must be finite numbers > 1, got {self.orders!r}")
        self.rdp_data_dependent = [float(r) for r in self.rdp_data_dependent] or [0.0] * len(self.orders)
        if len(self.rdp_data_dependent) != len(self.orders):
            raise ValueError(
                f"rdp_data_dependent has {len(self.rdp_data_dependent)} values for {len(self.orders)} orders"
            )
        if not all(r >= 0 and math.isfinite(r) for r in self.rdp_data_dependent):
            raise ValueError("rdp_data_dependent must hold finite values >= 0")
        # The data-dependent bound never exceeds the data-independent one (a corrupted privacy.json would).
        independent = self._rdp_data_independent(np.asarray(self.orders))
        if np.any(np.asarray(self.rdp_data_dependent) > independent * (1 + 1e-9) + 1e-300):
            raise ValueError("rdp_data_dependent exceeds the data-independent bound of the recorded queries")
        if self.bound == "renyi_filter":
            if self.filter_order is None or self.filter_budget is None:
                raise ValueError("a renyi_filter PATE event needs filter_order and filter_budget "
                                 "(PrivacyLedger.renyi_filter picks them before the run)")
            self.filter_order = _check_positive("filter_order", self.filter_order)
            if not self.filter_order > 1:
                raise ValueError(f"filter_order must be an RDP order > 1, got {self.filter_order!r}")
            if not any(math.isclose(self.filter_order, a, rel_tol=1e-12) for a in self.orders):
                raise ValueError(f"filter_order {self.filter_order!r} is not one of the event's RDP orders")
            self.filter_budget = _check_positive("filter_budget", self.filter_budget)
            if self.max_queries is not None:
                self.max_queries = _check_count("max_queries", self.max_queries)
            if self.smooth_release is not None:
                raise ValueError("a renyi_filter PATE event takes no smooth-sensitivity release")
        elif (self.filter_order, self.filter_budget, self.max_queries) != (None, None, None):
            raise ValueError(f"filter_order, filter_budget and max_queries belong to the renyi_filter bound, "
                             f"not {self.bound!r}")
        if self.smooth_release is not None:
            if not isinstance(self.smooth_release, Mapping) or set(self.smooth_release) != set(_SMOOTH_KEYS):
                raise ValueError(f"smooth_release must be a mapping with keys {sorted(_SMOOTH_KEYS)}")
            self.smooth_release = dict(self.smooth_release)
        self.label = _check_label(self.label)

    def query_rdp(self, orders: Sequence[float] | np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The data-independent RDP at ``orders`` of one query's threshold check and of one GNMax answer."""
        return (threshold_rdp_data_independent(sigma_threshold=self.sigma_threshold, orders=orders),
                gnmax_rdp_data_independent(sigma=self.sigma, orders=orders))

    def _rdp_data_independent(self, orders: np.ndarray) -> np.ndarray:
        return self.queries * sum(self.query_rdp(orders))

    def filter_spent(self) -> float:
        """The Renyi filter's realised RDP at ``filter_order``: every query's threshold check, GNMax for the
        answered ones (a function of released outputs; the stopping rule, not the guarantee)."""
        if self.bound != "renyi_filter":
            raise ValueError(f"filter_spent is the renyi_filter bound's, not {self.bound!r}'s")
        threshold, gnmax = self.query_rdp([float(self.filter_order)])
        return float(self.queries * threshold[0] + self.answered * gnmax[0])

    def _rdp_renyi_filter(self, orders: np.ndarray) -> np.ndarray:
        if self.filter_spent() > self.filter_budget * (1.0 + _BUDGET_RTOL):
            return np.full(orders.shape, math.inf)  # the filter was overrun: no guarantee at any order
        if self.max_queries is None or self.queries > self.max_queries:  # (a resumed run given more steps)
            out = np.full(orders.shape, math.inf)
        else:  # the data-independent bound of the most queries the run can make, valid at every order
            out = self.max_queries * sum(self.query_rdp(orders))
        at = np.isclose(orders, self.filter_order, rtol=1e-12, atol=0.0)
        out[at] = np.minimum(out[at], self.filter_budget)
        return out

    def add_queries(self, votes: Any, answered: Any) -> None:
        """Record a batch of queries: their number, how many were answered (the noisy threshold check's output), and,
        under the data-dependent bound only, their data-dependent RDP (a function of the votes without noise).

        Args:
            votes: Vote counts, shape (queries, bins) (numpy or torch, any device).
            answered: Which queries were answered, shape (queries,) (the mechanism's first output).

        Raises:
            ValueError: On invalid votes or flags, or once a smooth-sensitivity release has been recorded.
        """
        if self.smooth_release is not None:
            raise ValueError("this PATE event's RDP was already released with smooth sensitivity: add a new event")
        from dpsyn.privacy.pate.analysis import _check_answered, _check_votes

        v = _check_votes(votes)
        mask = _check_answered(answered, v.shape[0])
        if self.bound == "data_dependent":
            rdp = confident_gnmax_rdp(
                votes=v,
                sigma_threshold=self.sigma_threshold,
                sigma=self.sigma,
                threshold=self.threshold,
                orders=self.orders,
                answered=mask,
            )
            self.rdp_data_dependent = [float(a + b) for a, b in zip(self.rdp_data_dependent, rdp)]
        self.queries += int(v.shape[0])
        self.answered += int(mask.sum())

    def with_queries(self, votes: Any, answered: Any) -> PATEEvent:
        """A copy of this event with a batch of queries added (:meth:`add_queries`); this event is not changed.

        For :meth:`PrivacyLedger.would_exceed` (``replacing=`` this event's id): would these queries overspend?
        """
        trial = copy.copy(self)
        trial.orders, trial.rdp_data_dependent = list(self.orders), list(self.rdp_data_dependent)
        trial.smooth_release = None if self.smooth_release is None else dict(self.smooth_release)
        trial.add_queries(votes, answered)
        return trial

    def rdp(self, orders: Sequence[float]) -> np.ndarray:
        """This event's RDP at ``orders`` under its ``bound`` (plus a recorded smooth release's cost).

        Raises:
            ValueError: If the data-dependent bound is asked at orders other than those it was recorded at.
        """
        alphas = np.asarray(orders, dtype=np.float64)
        if self.bound == "data_independent":
            out = self._rdp_data_independent(alphas)
        elif self.bound == "renyi_filter":
            out = self._rdp_renyi_filter(alphas)
        else:
            if [float(a) for a in alphas] != self.orders:
                raise ValueError(
                    f"PATE event {self.label!r} holds its data-dependent RDP at other orders than the ledger's "
                    f"({len(self.orders)} vs {len(alphas)} orders)"
                )
            out = np.asarray(self.rdp_data_dependent, dtype=np.float64)
        if self.smooth_release is not None:
            out = out + gnss_rdp(
                beta=self.smooth_release["beta"], sigma_ss=self.smooth_release["sigma_ss"], orders=alphas
            )
        return out

    @property
    def spends(self) -> bool:
        """Whether the event has spent anything (queries made, or a smooth release recorded)."""
        return self.queries > 0 or self.smooth_release is not None


@dataclass(kw_only=True)
class UniformChoiceGaussianEvent(PrivacyEvent):
    """``steps`` steps of a Gaussian mechanism on ONE of ``population`` units drawn uniformly and secretly at each
    step (GS-WGAN: the critic drawn), accounted by :func:`dpsyn.privacy.uniform_choice.uniform_choice_rdp`.

    Removing a row changes one unit (its partition's critic: :class:`dpsyn.data.partitions.KeyedPartitions`), so the
    analysis is replace-one at the unit level with K fixed; ``bound`` names the per-step bound (``convexity``, a
    written proof; ``wang2019``, a cited theorem; ``poisson_argument``, an assumption). ``steps`` grows in place.

    Attributes:
        noise_multiplier: Noise std divided by the L2 distance any two units' outputs can have, > 0.
        population: K >= 1.
        steps: Steps taken so far, >= 0.
        bound: One of :data:`dpsyn.privacy.uniform_choice.UNIFORM_CHOICE_BOUNDS`.
        sampling: ``"uniform_one_of_k"``, the only scheme these bounds analyse.
        label: Free text saying what was released.
    """

    kind: ClassVar[str] = "uniform_choice_gaussian"
    relation: ClassVar[str] = ("add/remove one row changes one unit's partition: replace-one of K units, K fixed "
                               "(dpsyn.privacy.uniform_choice)")
    noise_multiplier: float
    population: int
    steps: int
    bound: str = "convexity"
    sampling: str = "uniform_one_of_k"

    def __post_init__(self) -> None:
        from dpsyn.privacy.uniform_choice import SAMPLING, check_bound

        self.noise_multiplier = _check_positive("noise_multiplier", self.noise_multiplier)
        self.population = _check_count("population", self.population)
        if self.population < 1:
            raise ValueError("population must be >= 1")
        self.steps = _check_count("steps", self.steps)
        check_bound(self.bound)
        if self.sampling != SAMPLING:
            raise ValueError(f"sampling {self.sampling!r}: a uniform-choice event analyses {SAMPLING!r} only")
        self.label = _check_label(self.label)

    def add_steps(self, n: int = 1) -> None:
        """Record ``n`` more steps."""
        self.steps += _check_count("n", n)

    def rdp(self, orders: Sequence[float]) -> np.ndarray:
        """The RDP curve of its steps at ``orders``."""
        from dpsyn.privacy.uniform_choice import uniform_choice_rdp

        if self.steps == 0:
            return np.zeros(len(list(orders)))
        return self.steps * uniform_choice_rdp(population=self.population, noise_multiplier=self.noise_multiplier,
                                               orders=orders, bound=self.bound)


def events_rdp(events: Sequence[PrivacyEvent], orders: Sequence[float]) -> np.ndarray:
    """The RDP curve at ``orders`` of ``events`` composed: Opacus's sampled Gaussian RDP for DP-SGD,
    ``count * alpha / (2 nm^2)`` for Gaussian events, each PATE event's curve, a repeat-and-select event's curve,
    ``min(eps, alpha eps^2 / 2)`` for a pure-DP (delta 0) approximate-DP event.

    Raises:
        ValueError: For a non-private event or an approximate-DP event with delta > 0 (no RDP curve).
    """
    from opacus.accountants.analysis.rdp import compute_rdp

    from dpsyn.privacy.tuning import pure_dp_rdp

    orders = list(orders)
    rdp = np.zeros(len(orders))
    for e in events:
        if isinstance(e, NonPrivateEvent):
            raise ValueError(f"a non-private release has no RDP curve: {e.label!r}")
        if isinstance(e, ApproxDPEvent):
            if e.delta > 0.0:
                raise ValueError(f"an (epsilon, delta)-DP event with delta > 0 has no RDP curve: {e.label!r}")
            rdp += pure_dp_rdp(epsilon=e.epsilon, orders=orders)
        elif isinstance(e, SampledGaussianEvent):
            if e.steps > 0:
                rdp += np.asarray(compute_rdp(q=e.sample_rate, noise_multiplier=e.noise_multiplier, steps=e.steps,
                                              orders=orders))
        elif isinstance(e, GaussianEvent):
            rdp += e.count * gaussian_rdp(noise_multiplier=e.noise_multiplier, orders=orders)
        elif isinstance(e, UniformChoiceGaussianEvent):
            rdp += e.rdp(orders)
        elif isinstance(e, (PATEEvent, RepeatAndSelectEvent)):
            if e.spends:
                rdp += e.rdp(orders)
        else:
            raise ValueError(f"not a privacy event: {e!r}")
    return rdp


@dataclass(kw_only=True)
class RepeatAndSelectEvent(PrivacyEvent):
    """Private tuning (Papernot & Steinke 2022): a random number K of trials, each spending ``trial_events``, of which
    only the best-scoring one is released (:mod:`dpsyn.privacy.tuning`; ``python train.py tuning.private=true``).

    K is never recorded: it is part of the mechanism and stays secret. Every trial must have spent the same
    data-independent RDP curve (the tuner checks it), which is why a data-dependent PATE bound is refused here.

    Attributes:
        trial_events: One trial's events, as :meth:`PrivacyEvent.to_dict` dicts (its training and its DP score).
        mean_trials: E[K].
        shape: The distribution of K: ``"inf"`` (Poisson; K = 0 releases nothing) or eta >= 0 of a truncated negative
            binomial (0 logarithmic, 1 geometric).
        label: Free text saying what was tuned.
    """

    kind: ClassVar[str] = "repeat_and_select"
    trial_events: list
    mean_trials: float
    shape: Any

    def __post_init__(self) -> None:
        from dpsyn.privacy.tuning import check_trials_distribution

        events = [e if isinstance(e, PrivacyEvent) else PrivacyEvent.from_dict(e) for e in self.trial_events]
        for e in events:
            if isinstance(e, RepeatAndSelectEvent):
                raise ValueError("a tuning trial cannot itself be a tuning search")
            if isinstance(e, PATEEvent) and e.bound == "data_dependent":
                raise ValueError("a tuning trial's privacy must not depend on the data: the data-dependent PATE bound "
                                 "is refused (use privacy bound data_independent)")
        self.trial_events = [e.to_dict() for e in events]
        mean, shape = check_trials_distribution(mean=self.mean_trials, shape=_decode_float(self.shape))
        self.mean_trials, self.shape = mean, _encode_float(shape)
        events_rdp(events, rdp_orders()[:1])  # refuses events without an RDP curve now, not when composing
        self.label = _check_label(self.label)

    def events(self) -> list[PrivacyEvent]:
        """One trial's events, rebuilt."""
        return [PrivacyEvent.from_dict(e) for e in self.trial_events]

    @property
    def spends(self) -> bool:
        return True

    def trial_rdp(self, orders: Sequence[float]) -> np.ndarray:
        """One trial's RDP curve."""
        return events_rdp(self.events(), orders)

    def rdp(self, orders: Sequence[float]) -> np.ndarray:
        """The search's RDP curve (:func:`dpsyn.privacy.tuning.repeat_and_select_rdp`)."""
        from dpsyn.privacy.tuning import repeat_and_select_rdp

        return repeat_and_select_rdp(rdp=self.trial_rdp(orders), orders=orders, mean=self.mean_trials,
                                     shape=_decode_float(self.shape))


EVENT_KINDS: dict[str, type[PrivacyEvent]] = {
    cls.kind: cls
    for cls in (GaussianEvent, SampledGaussianEvent, ApproxDPEvent, NonPrivateEvent, PATEEvent, RepeatAndSelectEvent,
                UniformChoiceGaussianEvent)
}


# --------------------------------------------------------------------------------------------------------------------
# JSON helpers: JSON has no infinity, so inf is written as the string "inf"
# --------------------------------------------------------------------------------------------------------------------


def _encode_float(x: float | None) -> float | str | None:
    if x is None:
        return None
    return "inf" if math.isinf(x) and x > 0 else float(x)


def _decode_float(x: Any) -> float:
    if x == "inf":
        return math.inf
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        raise ValueError(f"expected a number or 'inf', got {x!r}")
    return float(x)


# --------------------------------------------------------------------------------------------------------------------
# the ledger
# --------------------------------------------------------------------------------------------------------------------


@dataclass
class _Plan:
    """How the ledger composes its events (shared by epsilon() and accountant_description())."""

    non_private: bool = False
    approx: list[ApproxDPEvent] = field(default_factory=list)
    gaussian: list[GaussianEvent] = field(default_factory=list)
    sampled: list[SampledGaussianEvent] = field(default_factory=list)
    pate: list[PATEEvent] = field(default_factory=list)
    select: list[RepeatAndSelectEvent] = field(default_factory=list)
    uniform: list[UniformChoiceGaussianEvent] = field(default_factory=list)

    @property
    def rest(self) -> str:
        """Which rule composes the non-approximate events: "none", "gdp", "single", or "rdp"."""
        if self.pate or self.select or self.uniform:
            return "rdp"
        if not self.gaussian and not self.sampled:
            return "none"
        if not self.sampled:
            return "gdp"
        if not self.gaussian and len(self.sampled) == 1:
            return "single"
        return "rdp"


class PrivacyLedger:
    """Records every private release of a run and composes them into the epsilon spent.

    Args:
        target_epsilon: The run's budget, > 0 (``math.inf`` for a non-private run).
        delta: The run's delta in (0, 1).
        events: Events to start from (used by :meth:`from_dict`).

    Raises:
        ValueError: On an invalid target or delta.
    """

    def __init__(self, *, target_epsilon: float, delta: float, events: Iterable[PrivacyEvent] = ()) -> None:
        self._target_epsilon = _check_positive("target_epsilon", target_epsilon, allow_inf=True)
        self._delta = _check_delta("delta", delta)
        self._events: list[PrivacyEvent] = []
        # the write-ahead journal (attach_journal): the events [0, _carried) came from an interrupted attempt's
        # journal; _unclaimed: those of them that no restore or re-recording has taken up yet
        self._journal: Any = None
        self._refused: Exception | None = None  # a journal that must not be merged: raised at the first recording
        self._carried = 0
        self._unclaimed: set[int] = set()
        self._reusing = False
        for event in events:
            self.add(event)

    # ---- recording ---------------------------------------------------------------------------------------------

    @property
    def target_epsilon(self) -> float:
        """The budget's epsilon (``inf`` for a non-private run)."""
        return self._target_epsilon

    @property
    def delta(self) -> float:
        """The budget's delta."""
        return self._delta

    @property
    def events(self) -> tuple[PrivacyEvent, ...]:
        """The recorded events, in order (the objects themselves; their index is the event id)."""
        return tuple(self._events)

    def __len__(self) -> int:
        return len(self._events)

    def add(self, event: PrivacyEvent) -> int:
        """Record a release (journalled before it returns, when a journal is attached).

        After :meth:`attach_journal` restored an interrupted attempt's events, an event that records no release yet
        (0 steps, 0 queries, count 0) or a non-private one takes up the first such restored event of the same
        header (mechanism and label) instead of being appended: the new releases are then charged on top of the
        interrupted attempt's, in one event (the same charges as two events, composed more tightly). Inside
        :meth:`reusing`, an event equal to a restored one takes that one up too.

        Args:
            event: One of :class:`GaussianEvent`, :class:`SampledGaussianEvent`, :class:`ApproxDPEvent`,
                :class:`NonPrivateEvent`, :class:`PATEEvent`.

        Returns:
            The event id (its index), for :meth:`record_steps` and :meth:`record_pate_queries`.

        Raises:
            ValueError: If ``event`` is not a privacy event.
        """
        if not isinstance(event, tuple(EVENT_KINDS.values())):
            raise ValueError(f"not a privacy event: {event!r}; kinds: {', '.join(sorted(EVENT_KINDS))}")
        self._refuse_journal()
        taken = self._take_up(event)
        if taken is not None:
            return taken
        self._events.append(event)
        logger.debug("ledger: recorded %s", event)
        self._write_journal()
        return len(self._events) - 1

    def record_steps(self, event_id: int, n: int = 1) -> None:
        """Add ``n`` steps to the DP-SGD or uniform-choice event ``event_id`` (journalled before it returns).

        Raises:
            ValueError: If ``event_id`` is not the id of a :class:`SampledGaussianEvent` or a
                :class:`UniformChoiceGaussianEvent`, or ``n`` is invalid.
        """
        event = self._event(event_id)
        if not isinstance(event, (SampledGaussianEvent, UniformChoiceGaussianEvent)):
            raise ValueError(f"event {event_id} is a {event.kind!r} event, not a DP-SGD ('sampled_gaussian') or "
                             "'uniform_choice_gaussian' one")
        event.add_steps(n)
        self._write_journal()

    def _event(self, event_id: int) -> PrivacyEvent:
        if isinstance(event_id, bool) or not isinstance(event_id, int) or not 0 <= event_id < len(self._events):
            raise ValueError(f"no event with id {event_id!r} (the ledger has {len(self._events)} events)")
        return self._events[event_id]

    def _pate_event(self, event_id: int) -> PATEEvent:
        event = self._event(event_id)
        if not isinstance(event, PATEEvent):
            raise ValueError(f"event {event_id} is a {event.kind!r} event, not a PATE ('pate') one")
        return event

    def record_pate_queries(self, event_id: int, votes: Any, answered: Any) -> None:
        """Add a batch of Confident-GNMax queries to the PATE event ``event_id`` (see :meth:`PATEEvent.add_queries`).

        Call it once per batch, with the votes the mechanism saw and its ``answered`` output, before the answers
        are used; then :meth:`check_within_budget` stops a run that would overspend.

        Args:
            event_id: The id :meth:`add` returned for a :class:`PATEEvent`.
            votes: Vote counts, shape (queries, bins) (numpy or torch, any device).
            answered: Which queries were answered, shape (queries,).

        Raises:
            ValueError: If ``event_id`` is not a PATE event's id, or on invalid votes or flags.
        """
        self._pate_event(event_id).add_queries(votes, answered)
        self._write_journal()

    def record_pate_smooth_release(self, event_id: int, release: PATESmoothRelease) -> None:
        """Record a smooth-sensitivity release (:func:`dpsyn.privacy.pate.pate_smooth_release`) of a PATE event.

        The release's own RDP (Thm 23, at every order below ``1/(2 beta)``) is added to the event's from then on;
        the event takes no more queries. The published (noisy) epsilon is kept in the event for reporting; the
        ledger's epsilon stays the upper bound of its ``bound`` plus the release's cost.

        Raises:
            ValueError: If ``event_id`` is not a PATE event's id, the release covers another number of queries or
                answers than the event, or a release was already recorded.
        """
        event = self._pate_event(event_id)
        if not isinstance(release, PATESmoothRelease):
            raise ValueError(f"release must be a PATESmoothRelease (pate_smooth_release), got {release!r}")
        if event.smooth_release is not None:
            raise ValueError(f"PATE event {event_id} already has a smooth-sensitivity release")
        if (release.queries, release.answered) != (event.queries, event.answered):
            raise ValueError(
                f"the release covers {release.queries} queries ({release.answered} answered) but event {event_id} "
                f"recorded {event.queries} ({event.answered} answered)"
            )
        event.smooth_release = release.to_dict()
        self._write_journal()

    # ---- write-ahead journal (dpsyn.privacy.journal) -------------------------------------------------------------

    def attach_journal(self, path: str | os.PathLike[str], *, fingerprint: Any) -> int:
        """Write this ledger to the journal ``path`` inside every recording call from now on, and start it from the
        events an interrupted attempt of the same run journalled there (:mod:`dpsyn.privacy.journal`).

        The ledger must be the run's fresh one. The journal's events are restored as they are: those releases
        happened, whatever the checkpoints say. A checkpoint restored later (:meth:`restore`) is merged into them;
        an event recorded again (see :meth:`add`) takes one of them up; the others stay charged.

        Args:
            path: the journal file (``run_dir / dpsyn.privacy.journal.JOURNAL_PATH``).
            fingerprint: the run's configuration; a journal with events made under another one is refused.

        A journal that must not be merged (another configuration's, unreadable) is left as it is and refused at the
        ledger's first recording (:meth:`add`, :meth:`restore`), before anything is released: the checks a method
        makes first (its checkpoint's calibration, a saved release's epsilon) keep their own messages.

        Returns:
            The number of events restored from the journal.

        Raises:
            ValueError: the ledger already holds events or a journal.
        """
        from dpsyn.privacy.journal import Journal, JournalError

        if self._events or self._journal is not None:
            raise ValueError("attach_journal takes the run's fresh ledger (no events, no journal yet)")
        journal = Journal(path, fingerprint)
        try:
            found = journal.read()
            if found is not None and found["events"] and (
                    (_decode_float(found["target_epsilon"]), float(found["delta"])) != (self._target_epsilon,
                                                                                         self._delta)):
                raise JournalError(f"{journal.path} was journalled for eps={found['target_epsilon']}, "
                                   f"delta={found['delta']}, not this run's: use a new run directory")
        except JournalError as e:
            self._refused = e
            return 0
        if found is not None and found["events"]:
            self._events = [PrivacyEvent.from_dict(e) for e in found["events"]]
            self._carried = len(self._events)
            self._unclaimed = set(range(self._carried))
            try:
                spent = f"{self.epsilon():.4g}"
            except ValueError:
                spent = "n/a"
            logger.warning("ledger: %d event(s) of an interrupted attempt restored from %s (epsilon %s): its releases "
                           "stay charged, a checkpoint restored is merged into them", self._carried, journal.path, spent)
        self._journal = journal
        self._write_journal()
        return self._carried

    def detach_journal(self) -> None:
        """Stop journalling (e.g. a DDP rank other than 0 holding a copy of the run's ledger)."""
        self._journal = None

    @property
    def journal_path(self) -> Path | None:
        """The attached journal's file, or None."""
        return None if self._journal is None else self._journal.path

    def _refuse_journal(self) -> None:
        if self._refused is not None:
            raise self._refused

    def _write_journal(self) -> None:
        if self._journal is not None:
            self._journal.write(target_epsilon=self._target_epsilon, delta=self._delta,
                                events=[e.to_dict() for e in self._events])

    def _take_up(self, event: PrivacyEvent) -> int | None:
        """The id of the restored, not yet taken up journal event that ``event`` records again (see :meth:`add`)."""
        if not self._unclaimed:
            return None
        from dpsyn.privacy.journal import header, is_empty

        new = event.to_dict()
        continues = is_empty(new) or event.kind == NonPrivateEvent.kind
        if not (continues or self._reusing):
            return None
        for i in sorted(self._unclaimed):
            old = self._events[i].to_dict()
            if (self._reusing and old == new) or (continues and header(old) == header(new)):
                self._unclaimed.discard(i)
                logger.info("ledger: event %d (%s) continues the interrupted attempt's event of the journal", i,
                            event.label or event.kind)
                return i
        return None

    @contextlib.contextmanager
    def reusing(self) -> Iterator[None]:
        """Inside: an event recorded that equals one restored from the journal is that release, recorded again (its
        saved output reused, e.g. ``checkpoints/class_proportions.json``), not a new one: it is not charged twice.
        Only for a caller that knows the release is reused whenever the journal holds it."""
        before, self._reusing = self._reusing, True
        try:
            yield
        finally:
            self._reusing = before

    def restore(self, saved: Sequence[Mapping[str, Any]], *, source: str = "the checkpoint") -> list[int]:
        """Put a checkpoint's events (:meth:`PrivacyEvent.to_dict` dicts) into this ledger, the run's, so that every
        release made before the interruption is charged once: not forgotten, not charged twice.

        The ledger may hold, after the journal's events (:meth:`attach_journal`), a prefix of the saved events that
        the resumed run charged again before restoring (e.g. the class proportions reused from
        ``checkpoints/class_proportions.json``): they must equal the saved ones, and are that release. With a
        journal, event ``i`` becomes the later state of the journal's and the checkpoint's (the one with more
        charges: :func:`dpsyn.privacy.journal.merge_events`), and the journal's events after the checkpoint's stay:
        the releases the interrupted attempt made after its checkpoint are kept; the rounds redone are charged on
        top of them.

        Returns:
            The ids of the saved events the ledger did not hold (those after the re-charged prefix), in order.

        Raises:
            ValueError: the ledger's own events are not a prefix of the saved ones, or the journal and the
                checkpoint are not the same run's records.
        """
        from dpsyn.privacy.journal import charges_beyond, merge_events

        self._refuse_journal()
        saved = [dict(e) for e in saved]
        own = [e.to_dict() for e in self._events[self._carried:]]
        if len(own) > len(saved) or own != saved[: len(own)]:
            raise ValueError(f"cannot resume from {source}: the run's ledger holds {len(own)} events that are not "
                             f"the first of the {len(saved)} saved ones")
        if not self._carried:
            ids = [self.add(PrivacyEvent.from_dict(e)) for e in saved[len(own):]]
            return ids
        journal = [e.to_dict() for e in self._events[: self._carried]]
        merged = merge_events(journal, saved, source=source)
        events = []
        for i, d in enumerate(merged):  # keep the journal's own objects where they are the later state
            events.append(self._events[i] if i < self._carried and journal[i] == d else PrivacyEvent.from_dict(d))
        self._events = events
        self._unclaimed = {i for i in self._unclaimed if i >= len(saved)}
        self._carried = len(events)
        beyond = charges_beyond(merged, saved)
        if beyond:
            logger.warning("ledger: the interrupted attempt released more than %s holds: %s stay charged (from the "
                           "journal); the rounds redone are charged on top", source, "; ".join(beyond))
        self._write_journal()
        return list(range(len(own), len(saved)))

    def absorb_journal(self) -> None:
        """Take up the charges another process of this run wrote into the attached journal (a DDP rank holding a
        copy of this ledger): each event becomes the later of its state here and in the file.

        Raises:
            ValueError: the file holds events that are not states of this ledger's.
        """
        if self._journal is None:
            return
        from dpsyn.privacy.journal import JournalError, merge_events

        found = self._journal.read()
        if found is None:
            return
        mine = [e.to_dict() for e in self._events]
        if len(found["events"]) > len(mine):
            raise JournalError(f"{self._journal.path} holds events this ledger does not")
        merged = merge_events(mine, found["events"], source=str(self._journal.path))
        for i, d in enumerate(merged):
            if d != mine[i]:
                self._events[i] = PrivacyEvent.from_dict(d)
        self._write_journal()

    # ---- composition -------------------------------------------------------------------------------------------

    def _plan(self) -> _Plan:
        plan = _Plan()
        for event in self._events:
            if isinstance(event, NonPrivateEvent):
                plan.non_private = True
            elif isinstance(event, ApproxDPEvent):
                plan.approx.append(event)
            elif isinstance(event, GaussianEvent):
                if event.count > 0:  # an event with nothing released yet spends nothing
                    plan.gaussian.append(event)
            elif isinstance(event, SampledGaussianEvent):
                if event.steps > 0:
                    plan.sampled.append(event)
            elif isinstance(event, UniformChoiceGaussianEvent):
                if event.steps > 0:
                    plan.uniform.append(event)
            elif isinstance(event, PATEEvent):
                if event.spends:
                    plan.pate.append(event)
            elif isinstance(event, RepeatAndSelectEvent):
                plan.select.append(event)
        return plan

    @property
    def is_private(self) -> bool:
        """False once a :class:`NonPrivateEvent` has been recorded."""
        return not self._plan().non_private

    def epsilon(self, delta: float | None = None) -> float:
        """Compose all events into the epsilon spent at ``delta``.

        Args:
            delta: Delta in (0, 1); the ledger's own delta by default.

        Returns:
            Epsilon spent (``inf`` once a non-private release was recorded; 0.0 before any release).

        Raises:
            ValueError: If the approximate-DP events' deltas leave no delta for the rest (or exceed ``delta``).
        """
        delta = self._delta if delta is None else _check_delta("delta", delta)
        plan = self._plan()
        if plan.non_private:
            return math.inf
        eps_approx = math.fsum(e.epsilon for e in plan.approx)
        delta_approx = math.fsum(e.delta for e in plan.approx)
        rest = plan.rest
        if rest == "none":
            if delta_approx > delta:
                raise ValueError(
                    f"the approximate-DP events use delta {delta_approx:.3g} > the available delta {delta:.3g}"
                )
            return eps_approx
        delta_rest = delta - delta_approx
        if not delta_rest > 0.0:
            raise ValueError(
                f"the approximate-DP events use delta {delta_approx:.3g} of {delta:.3g}: "
                "no delta is left for the other releases"
            )
        return eps_approx + self._epsilon_rest(plan, delta_rest)

    @staticmethod
    def _epsilon_rest(plan: _Plan, delta: float) -> float:
        rest = plan.rest
        if rest == "gdp":
            mu = math.sqrt(math.fsum(e.inverse_variance for e in plan.gaussian))
            return gdp_epsilon_from_mu(mu=mu, delta=delta)
        if rest == "single":
            e = plan.sampled[0]
            return dpsgd_epsilon(
                noise_multiplier=e.noise_multiplier,
                sample_rate=e.sample_rate,
                steps=e.steps,
                delta=delta,
                accountant=e.accountant,
            )
        # Mixed events: RDP composes additively across mechanisms at each order.
        orders = rdp_orders()
        rdp = events_rdp([*plan.sampled, *plan.gaussian, *plan.pate, *plan.select, *plan.uniform], orders)
        return rdp_to_epsilon(rdp=rdp, orders=orders, delta=delta)[0]

    def raw_data_dependent(self) -> bool:
        """Whether the reported epsilon is a raw data-dependent PATE bound: a function of the private votes, not
        itself a DP release (a ``data_dependent`` PATE event without a smooth-sensitivity release)."""
        return any(e.bound == "data_dependent" and e.smooth_release is None for e in self._plan().pate)

    def accountant_description(self) -> str:
        """Which accountant :meth:`epsilon` uses, for result rows.

        E.g. ``"rdp (opacus 1.6.0, orders 1.1-1024), poisson sampling"``, ``"prv (opacus 1.6.0), poisson sampling"``,
        ``"gdp (exact)"``, ``"non-private"``, ``"rdp (opacus 1.6.0, orders 1.1-1024) composition of 1 pate
        confident-gnmax event(s) (data-independent bound)"``, with ``" + basic composition of N approx-DP
        event(s)"`` where needed.
        """
        plan = self._plan()
        if plan.non_private:
            return "non-private"
        rest = plan.rest
        ver = opacus_version()
        if rest == "none":
            desc = "none (no releases)" if not plan.approx else ""
        elif rest == "gdp":
            desc = "gdp (exact)"
        elif rest == "single":
            e = plan.sampled[0]
            orders = f", {rdp_orders_description()}" if e.accountant == "rdp" else ""
            desc = f"{e.accountant} (opacus {ver}{orders}), {e.sampling} sampling"
        elif not plan.pate and not plan.select and not plan.uniform:
            samplings = sorted({e.sampling for e in plan.sampled})
            desc = (
                f"rdp (opacus {ver}, {rdp_orders_description()}) composition of mixed events, "
                f"{'/'.join(samplings)} sampling"
            )
        elif not plan.pate and not plan.select and not plan.sampled and not plan.gaussian:
            bounds = sorted({e.bound.replace("_", "-") for e in plan.uniform})
            desc = (f"rdp (opacus {ver}, {rdp_orders_description()}) of {len(plan.uniform)} uniform-choice gaussian "
                    f"event(s) ({'/'.join(bounds)} bound), uniform one-of-k sampling")
        else:
            parts = []
            for bound in PATE_BOUNDS:
                events = [e for e in plan.pate if e.bound == bound]
                if events:
                    smooth = sum(e.smooth_release is not None for e in events)
                    extra = f", {smooth} smooth-sensitivity release(s)" if smooth else ""
                    if bound == "data_dependent" and smooth < len(events):
                        # the epsilon then depends on the private votes without noise (docs/published-fields.md)
                        extra += "; raw: a function of the private votes, not itself a DP release"
                    name = bound.replace("_", "-")
                    parts.append(f"{len(events)} pate confident-gnmax event(s) ({name} bound{extra})")
            if plan.select:
                from dpsyn.privacy.tuning import trials_distribution_name

                for r in plan.select:
                    dist = trials_distribution_name(mean=r.mean_trials, shape=_decode_float(r.shape))
                    kinds = [e.kind.replace("_", "-") for e in r.events()]
                    inner = ", ".join(f"{kinds.count(k)} {k}" for k in dict.fromkeys(kinds))
                    parts.append(f"repeat-and-select (Papernot & Steinke 2022, {dist} trials) of a trial's RDP "
                                 f"({inner} event(s))")
            if plan.uniform:
                bounds = sorted({e.bound.replace("_", "-") for e in plan.uniform})
                parts.append(f"{len(plan.uniform)} uniform-choice gaussian event(s) ({'/'.join(bounds)} bound, "
                             "uniform one-of-k sampling)")
            if plan.sampled:
                samplings = sorted({e.sampling for e in plan.sampled})
                parts.append(f"{len(plan.sampled)} dp-sgd event(s) ({'/'.join(samplings)} sampling)")
            if plan.gaussian:
                parts.append(f"{len(plan.gaussian)} gaussian event(s)")
            desc = f"rdp (opacus {ver}, {rdp_orders_description()}) composition of {', '.join(parts)}"
        if plan.approx:
            basic = f"basic composition of {len(plan.approx)} approx-DP event(s)"
            desc = f"{desc} + {basic}" if desc else basic
        return desc

    def _exceeds(self, epsilon: float) -> bool:
        """Whether ``epsilon`` is beyond the target: the one place with the rounding tolerance (``1 + 1e-9``)."""
        return epsilon > self._target_epsilon * (1.0 + _BUDGET_RTOL)

    def epsilon_if(self, event: PrivacyEvent, *, replacing: int | None = None) -> float:
        """The epsilon spent (at the ledger's delta) if ``event`` were recorded too; the ledger is not changed.

        Args:
            event: A privacy event, not recorded.
            replacing: The id of a recorded event that ``event`` would stand in for (a PATE event with this step's
                queries added, :meth:`PATEEvent.with_queries`); None to add ``event`` after the others.

        Raises:
            ValueError: If ``event`` is not a privacy event, ``replacing`` is not a recorded id, or the events cannot
                be composed (see :meth:`epsilon`).
        """
        if not isinstance(event, tuple(EVENT_KINDS.values())):
            raise ValueError(f"not a privacy event: {event!r}; kinds: {', '.join(sorted(EVENT_KINDS))}")
        events = list(self._events)  # the event objects themselves: composing does not change them
        if replacing is None:
            events.append(event)
        else:
            self._event(replacing)
            events[replacing] = event
        trial = PrivacyLedger(target_epsilon=self._target_epsilon, delta=self._delta, events=events)
        return trial.epsilon(self._delta)

    def renyi_filter(self, *, sigma_threshold: float, sigma: float) -> tuple[float, float]:
        """The order and RDP budget of a Renyi filter for Confident-GNMax queries recorded after the events so far
        (a ``renyi_filter`` :class:`PATEEvent`), fixed before any of its queries.

        At each order ``alpha`` the budget is the most RDP the queries may add with the epsilon at the ledger's
        delta within the target: Balle et al.'s conversion (:func:`~dpsyn.privacy.dpsgd.rdp_to_epsilon`) inverted,
        ``B(alpha) = eps - log((alpha-1)/alpha) + (log delta + log alpha)/(alpha-1) - RDP_before(alpha)``, after the
        approximate-DP events' epsilon and delta (basic composition, as :meth:`epsilon`). Every query costs a
        multiple of ``alpha`` (Gaussian mechanisms), so the order that allows the most queries maximises
        ``B(alpha)/alpha``; it depends on the budget and the events before, not on the data.

        A filter of the same noise that an interrupted attempt started (restored from the journal,
        :meth:`attach_journal`, and not taken up yet) is continued: its order and budget are returned, so that the
        event recorded with them takes it up (:meth:`add`) and the queries of both attempts stay within one budget.

        Returns:
            ``(order, budget)``.

        Raises:
            ValueError: On a non-private ledger, or if no order leaves a positive budget.
        """
        s1, s2 = _check_positive("sigma_threshold", sigma_threshold), _check_positive("sigma", sigma)
        plan = self._plan()
        if plan.non_private or not math.isfinite(self._target_epsilon):
            raise ValueError("a Renyi filter needs a private ledger with a finite target epsilon")
        for i in sorted(self._unclaimed):
            e = self._events[i]
            if isinstance(e, PATEEvent) and e.bound == "renyi_filter" and (e.sigma_threshold, e.sigma) == (s1, s2):
                return float(e.filter_order), float(e.filter_budget)
        eps_left = self._target_epsilon - math.fsum(e.epsilon for e in plan.approx)
        delta_left = self._delta - math.fsum(e.delta for e in plan.approx)
        orders = np.asarray(rdp_orders(), dtype=np.float64)
        before = [*plan.sampled, *plan.gaussian, *plan.pate, *plan.select]
        rdp_before = events_rdp(before, orders) if before else np.zeros_like(orders)
        if not (eps_left > 0 and delta_left > 0):
            raise ValueError(f"the events so far leave no budget for a Renyi filter (eps {eps_left:.4g}, "
                             f"delta {delta_left:.3g} left)")
        budgets = (eps_left - np.log((orders - 1.0) / orders) + (math.log(delta_left) + np.log(orders)) / (orders - 1.0)
                   - rdp_before)
        if not np.any(budgets > 0):
            raise ValueError(f"no RDP order leaves a positive budget for a Renyi filter at eps {eps_left:.4g}")
        i = int(np.argmax(np.where(budgets > 0, budgets / orders, -np.inf)))
        order, budget = float(orders[i]), float(budgets[i])
        # the inverse above and Opacus's forward conversion may differ in the last bits: never claim past the target
        def composed(b: float) -> float:
            curve = np.full(orders.shape, math.inf)
            curve[i] = b
            return rdp_to_epsilon(rdp=rdp_before + curve, orders=orders, delta=delta_left)[0]

        while composed(budget) > eps_left:
            budget *= 1.0 - 1e-12
        logger.debug("renyi filter: order %g, budget %.6g (per query: %.3g threshold, %.3g GNMax)", order, budget,
                     order / (2 * s1 * s1), order / (s2 * s2))
        return order, budget

    def would_exceed(self, event: PrivacyEvent, *, replacing: int | None = None) -> bool:
        """Stop before overspending: whether recording ``event`` would take the epsilon spent beyond the target.

        The same test as :meth:`check_within_budget` (with its tolerance) on :meth:`epsilon_if`, without copying the
        ledger or its events; nothing is recorded.

        Args:
            event: The release about to be made.
            replacing: See :meth:`epsilon_if`.

        Returns:
            True if the epsilon would exceed ``target_epsilon * (1 + 1e-9)``.
        """
        return self._exceeds(self.epsilon_if(event, replacing=replacing))

    def check_within_budget(self) -> float:
        """Raise unless the epsilon spent at the ledger's delta is within the target.

        Returns:
            The epsilon spent.

        Raises:
            BudgetExceededError: If ``epsilon(delta) > target_epsilon * (1 + 1e-9)``.
        """
        eps = self.epsilon(self._delta)
        if self._exceeds(eps):
            raise BudgetExceededError(
                f"privacy budget exceeded: epsilon spent {eps:.6g} > target {self._target_epsilon:.6g} "
                f"at delta {self._delta:g} ({self.accountant_description()})"
            )
        return eps

    # ---- persistence -------------------------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        """The ledger as a JSON-serialisable dict (``inf`` written as ``"inf"``).

        Keys: format, version, target_epsilon, delta, adjacency, events (each with its sampling scheme and how its
        analysis meets the relation), epsilon_spent, accountant, opacus_version (and epsilon_error when the events
        cannot be composed at the ledger's delta).
        """
        out: dict[str, Any] = {
            "format": LEDGER_FORMAT,
            "version": LEDGER_VERSION,
            "target_epsilon": _encode_float(self._target_epsilon),
            "delta": self._delta,
            "adjacency": ADJACENCY_TEXT,
            "events": [e.to_dict() for e in self._events],
        }
        try:
            out["epsilon_spent"] = _encode_float(self.epsilon(self._delta))
        except ValueError as err:  # still saveable, so that a run can be inspected and resumed
            out["epsilon_spent"] = None
            out["epsilon_error"] = str(err)
        out["accountant"] = self.accountant_description()
        out["opacus_version"] = opacus_version()
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> PrivacyLedger:
        """Rebuild a ledger from :meth:`to_dict` output (epsilon is recomputed, not trusted).

        Raises:
            ValueError: If ``data`` is not a dpsyn privacy ledger of a supported version.
        """
        if not isinstance(data, Mapping) or data.get("format") != LEDGER_FORMAT:
            raise ValueError(f"not a dpsyn privacy ledger (format != {LEDGER_FORMAT!r})")
        if data.get("version") != LEDGER_VERSION:
            raise ValueError(f"unsupported privacy ledger version {data.get('version')!r}; expected {LEDGER_VERSION}")
        events = [PrivacyEvent.from_dict(e) for e in data.get("events", [])]
        return cls(
            target_epsilon=_decode_float(data["target_epsilon"]), delta=_decode_float(data["delta"]), events=events
        )

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write the ledger as JSON, atomically (:func:`dpsyn.results.io.atomic_write_json`: a temporary file in the
        same folder, fsynced, then ``os.replace``).

        Args:
            path: The file to write, or a directory (then ``privacy.json`` in it).

        Returns:
            The path written.
        """
        path = Path(path)
        if path.is_dir():
            path = path / PRIVACY_FILENAME
        data = self.to_dict()
        atomic_write_json(path, data)
        logger.info("privacy ledger written to %s (epsilon spent %s)", path, data["epsilon_spent"])
        return path

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> PrivacyLedger:
        """Read a ledger written by :meth:`save` (``path`` may be the file or its directory)."""
        path = Path(path)
        if path.is_dir():
            path = path / PRIVACY_FILENAME
        with open(path, encoding="utf-8") as f:
            return cls.from_dict(json.load(f))

    def __repr__(self) -> str:
        return (
            f"PrivacyLedger(target_epsilon={self._target_epsilon}, delta={self._delta}, "
            f"events={len(self._events)})"
        )


__all__ = [
    "ACCOUNTANTS",
    "ApproxDPEvent",
    "BudgetExceededError",
    "EVENT_KINDS",
    "GaussianEvent",
    "NonPrivateEvent",
    "PATEEvent",
    "PrivacyEvent",
    "PrivacyLedger",
    "SampledGaussianEvent",
    "UniformChoiceGaussianEvent",
    "ADJACENCY",
]
