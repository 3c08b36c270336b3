"""The privacy ledger: every release a run makes, as an event, and their composition into one epsilon.

A method records each release with :meth:`PrivacyLedger.add`; the run asks :meth:`PrivacyLedger.epsilon` what was
spent, refuses to write a result that overspends (:meth:`PrivacyLedger.check_within_budget`), and saves the ledger
as ``privacy.json`` in the run directory, so that an interrupted run resumes with the ledger restored.

This package holds :class:`PrivacyLedger` (recording, the write-ahead journal, the budget checks); the rest is in
modules of one job each, whose public names it re-exports:

* :mod:`dpsyn.privacy.ledger.events`: the event kinds (:class:`GaussianEvent`, :class:`SampledGaussianEvent`,
  :class:`UniformChoiceGaussianEvent`, :class:`ApproxDPEvent`, :class:`NonPrivateEvent`, :class:`PATEEvent`,
  :class:`RepeatAndSelectEvent`), their RDP curves (:func:`events_rdp`) and the neighbour relation
  (:data:`ADJACENCY`);
* :mod:`dpsyn.privacy.ledger.composition`: the events composed into the epsilon spent at a delta (GDP, a DP-SGD
  accountant, RDP composition; basic composition of the approximate-DP events);
* :mod:`dpsyn.privacy.ledger.filter`: the order and budget of a Renyi filter of PATE queries;
* :mod:`dpsyn.privacy.ledger.writer`: privacy.json in and out, and the accountant described in words.

Recording PATE queries (one event per teacher ensemble, queries added per batch)::

    event_id = ledger.add(PATEEvent(sigma_threshold=3000.0, sigma=1000.0, threshold=2000.0,
                                    bound="data_independent", label="G-PATE gradient votes"))
    answered, label = confident_gnmax(votes, sigma_threshold=..., sigma=..., threshold=..., generator=gen)
    ledger.record_pate_queries(event_id, votes, answered)   # before the answers are used
    ledger.check_within_budget()
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from dpsyn.privacy.dpsgd import ACCOUNTANTS
from dpsyn.privacy.gaussian import _check_delta, _check_positive
from dpsyn.privacy.ledger import composition, filter, writer
from dpsyn.privacy.ledger.events import (
    _BUDGET_RTOL,
    ADJACENCY,
    EVENT_KINDS,
    SAMPLINGS,
    ApproxDPEvent,
    GaussianEvent,
    NonPrivateEvent,
    PATEEvent,
    PrivacyEvent,
    RepeatAndSelectEvent,
    SampledGaussianEvent,
    UniformChoiceGaussianEvent,
    _decode_float,
    events_rdp,
)
from dpsyn.privacy.ledger.writer import ADJACENCY_TEXT, LEDGER_FORMAT, LEDGER_VERSION, PRIVACY_FILENAME
from dpsyn.privacy.pate import PATESmoothRelease

logger = logging.getLogger(__name__)


class BudgetExceededError(RuntimeError):
    """The ledger's epsilon exceeds its target: the run must stop and write no result."""


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
        self._reserved = 0.0  # epsilon held back for a release after the method's (reserving)
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

    # ---- composition (dpsyn.privacy.ledger.composition) --------------------------------------------------------

    @property
    def is_private(self) -> bool:
        """False once a :class:`NonPrivateEvent` has been recorded."""
        return not composition.plan_events(self._events).non_private

    def epsilon(self, delta: float | None = None) -> float:
        """Compose all events into the epsilon spent at ``delta``
        (:func:`~dpsyn.privacy.ledger.composition.events_epsilon`).

        Args:
            delta: Delta in (0, 1); the ledger's own delta by default.

        Returns:
            Epsilon spent (``inf`` once a non-private release was recorded; 0.0 before any release).

        Raises:
            ValueError: If the approximate-DP events' deltas leave no delta for the rest (or exceed ``delta``).
        """
        delta = self._delta if delta is None else _check_delta("delta", delta)
        return composition.events_epsilon(self._events, delta)

    def raw_data_dependent(self) -> bool:
        """Whether the reported epsilon is a raw data-dependent PATE bound: a function of the private votes, not
        itself a DP release (a ``data_dependent`` PATE event without a smooth-sensitivity release)."""
        return composition.raw_data_dependent(self._events)

    def accountant_description(self) -> str:
        """Which accountant :meth:`epsilon` uses, for result rows.

        E.g. ``"rdp (opacus 1.6.0, orders 1.1-1024), poisson sampling"``, ``"prv (opacus 1.6.0), poisson sampling"``,
        ``"gdp (exact)"``, ``"non-private"``, ``"rdp (opacus 1.6.0, orders 1.1-1024) composition of 1 pate
        confident-gnmax event(s) (data-independent bound)"``, with ``" + basic composition of N approx-DP
        event(s)"`` where needed (:func:`dpsyn.privacy.ledger.writer.accountant_description`).
        """
        return writer.accountant_description(self._events)

    def _limit(self) -> float:
        """The epsilon the releases may reach now: the target less what :meth:`reserving` holds back."""
        return self._target_epsilon - self._reserved

    def _exceeds(self, epsilon: float) -> bool:
        """Whether ``epsilon`` is beyond the limit (:meth:`_limit`): the one place with the rounding tolerance
        (``1 + 1e-9``)."""
        return epsilon > self._limit() * (1.0 + _BUDGET_RTOL)

    @contextlib.contextmanager
    def reserving(self, epsilon: float) -> Iterator[None]:
        """Hold ``epsilon`` of the target back while the block runs: :meth:`would_exceed`,
        :meth:`check_within_budget` and :meth:`renyi_filter` answer for ``target_epsilon - epsilon``.

        For a pure-DP release made after the method's (the noisy-max selection of ``metrics.protocol=dpimagebench``,
        an :class:`~dpsyn.privacy.ledger.events.ApproxDPEvent` of delta 0): basic composition adds its epsilon to the
        method's, so a method that stops at the lowered limit leaves exactly ``epsilon`` for it. Methods that
        calibrate their noise in advance read :class:`~dpsyn.methods.base.PrivacyBudget`'s epsilon (the same
        share); methods that stop by the ledger (G-PATE's and PATE-GAN's vote checks) read this limit.

        Raises:
            ValueError: ``epsilon`` negative, not below a finite target, or a reservation already held.
        """
        epsilon = float(epsilon)
        if not (0 <= epsilon and (math.isinf(self._target_epsilon) or epsilon < self._target_epsilon)):
            raise ValueError(f"reserving eps {epsilon:g} of a target of {self._target_epsilon:g}: needs 0 <= eps < "
                             "target")
        if self._reserved:
            raise ValueError(f"eps {self._reserved:g} is reserved already")
        self._reserved = 0.0 if math.isinf(self._target_epsilon) else epsilon
        try:
            yield
        finally:
            self._reserved = 0.0

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
        (a ``renyi_filter`` :class:`PATEEvent`), fixed before any of its queries: the most the queries may add with
        the epsilon at the ledger's delta within the target (:func:`dpsyn.privacy.ledger.filter.renyi_filter`).

        A filter of the same noise that an interrupted attempt started (restored from the journal,
        :meth:`attach_journal`, and not taken up yet) is continued: its order and budget are returned, so that the
        event recorded with them takes it up (:meth:`add`) and the queries of both attempts stay within one budget.

        Returns:
            ``(order, budget)``.

        Raises:
            ValueError: On a non-private ledger, or if no order leaves a positive budget.
        """
        return filter.renyi_filter(self._events, restored=[self._events[i] for i in sorted(self._unclaimed)],
                                   target_epsilon=self._limit(), delta=self._delta,
                                   sigma_threshold=sigma_threshold, sigma=sigma)

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
                f"privacy budget exceeded: epsilon spent {eps:.6g} > target {self._target_epsilon:.6g}"
                + (f" less eps {self._reserved:g} reserved" if self._reserved else "") + " "
                f"at delta {self._delta:g} ({self.accountant_description()})"
            )
        return eps

    # ---- persistence (dpsyn.privacy.ledger.writer) -------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        """The ledger as a JSON-serialisable dict (``inf`` written as ``"inf"``).

        Keys: format, version, target_epsilon, delta, adjacency, events (each with its sampling scheme and how its
        analysis meets the relation), epsilon_spent, accountant, opacus_version (and epsilon_error when the events
        cannot be composed at the ledger's delta).
        """
        return writer.ledger_to_dict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> PrivacyLedger:
        """Rebuild a ledger from :meth:`to_dict` output (epsilon is recomputed, not trusted).

        Raises:
            ValueError: If ``data`` is not a dpsyn privacy ledger of a supported version.
        """
        return cls(**writer.ledger_arguments(data))

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write the ledger as JSON, atomically (:func:`dpsyn.results.io.atomic_write_json`: a temporary file in the
        same folder, fsynced, then ``os.replace``).

        Args:
            path: The file to write, or a directory (then ``privacy.json`` in it).

        Returns:
            The path written.
        """
        return writer.save_ledger(self, path)

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> PrivacyLedger:
        """Read a ledger written by :meth:`save` (``path`` may be the file or its directory)."""
        return cls.from_dict(writer.read_ledger(path))

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
    "ADJACENCY_TEXT",
    "LEDGER_FORMAT",
    "LEDGER_VERSION",
    "PRIVACY_FILENAME",
    "RepeatAndSelectEvent",
    "SAMPLINGS",
    "events_rdp",
]
