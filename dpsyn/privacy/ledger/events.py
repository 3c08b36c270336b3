"""The ledger's events: one dataclass per kind of release, with its parameters and its RDP curve.

Event kinds (each a dataclass with a ``kind`` and its parameters, JSON-serialisable):

* :class:`GaussianEvent`: ``count`` adaptive sensitivity-1 Gaussian releases with noise multiplier ``nm``
  (``mu``-GDP with ``mu = sqrt(count)/nm``).
* :class:`SampledGaussianEvent`: a DP-SGD run (Poisson-subsampled Gaussian), its steps growing as training goes.
* :class:`UniformChoiceGaussianEvent`: steps of a Gaussian mechanism on one of K units drawn uniformly (GS-WGAN's
  critics; :mod:`dpsyn.privacy.uniform_choice`), its steps growing as training goes.
* :class:`ApproxDPEvent`: a mechanism already calibrated to ``(epsilon, delta)`` (classic Gaussian, Laplace, ...).
* :class:`NonPrivateEvent`: a release without DP (epsilon = inf).
* :class:`PATEEvent`: Confident-GNMax queries to a teacher ensemble (G-PATE, PATE-GAN), growing as training goes.
* :class:`RepeatAndSelectEvent`: private tuning, the best of a random number of trials (:mod:`dpsyn.privacy.tuning`).

Neighbouring datasets differ by removing or adding one private row (:data:`ADJACENCY`), for every event: each
event's analysis is stated under that relation, or converts to it (:attr:`PrivacyEvent.relation`; docs/privacy.md
says what each mechanism's analysis assumes). privacy.json records the relation and, per event, its sampling scheme.

:func:`events_rdp` composes the RDP curves of several events (a repeat-and-select event composes its trial's with
it). Composing events into an epsilon is :mod:`dpsyn.privacy.ledger.composition`'s.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar

import numpy as np

from dpsyn.privacy.dpsgd import check_accountant, rdp_orders
from dpsyn.privacy.gaussian import _check_count, _check_positive, gaussian_rdp
from dpsyn.privacy.pate import (
    PATESmoothRelease,
    check_pate_bound,
    confident_gnmax_rdp,
    gnmax_rdp_data_independent,
    gnss_rdp,
    threshold_rdp_data_independent,
)

SAMPLINGS: tuple[str, ...] = ("poisson",)
"""Sampling schemes the DP-SGD accountants support (both assume Poisson subsampling)."""
ADJACENCY = "add_remove"
"""dpsyn's one neighbour relation: two datasets are neighbours when one is the other with one private row removed."""

_BUDGET_RTOL = 1e-9


def _check_label(label: str) -> str:
    if not isinstance(label, str):
        raise ValueError(f"label must be a string, got {label!r}")
    return label


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

