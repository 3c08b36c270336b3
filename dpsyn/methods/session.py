"""The bookkeeping around a hand-written training loop, written once: resume, ledger charges, checkpoints, the bar.

G-PATE, PATE-GAN, GS-WGAN and PE train in a loop of their own (no Lightning Trainer). Each of them must resume a
killed run where its last checkpoint left it, charge every release in the ledger before the release is used, stop
before it would spend more than its budget or than its noise was calibrated for, checkpoint now and then, and show a
progress bar. :class:`FitSession` does all of that, so that a method's ``fit`` reads as its paper's algorithm::

    state = {"G": G, "opt_g": opt_g, "teachers": ens, "gen": gen, "dp_gen": dp_gen if deterministic else None}
    with FitSession(ctx, ledger, "g_pate.pt", fingerprint, state=state, total=steps, desc="g_pate rounds",
                    every=hp["checkpoint_every"]) as s:
        s.open(lambda: PATEEvent(...))          # the run's event: restored on resume, else recorded now
        for step in s.steps():
            ...                                 # the algorithm
            if s.would_exceed(s.event.with_queries(votes, ones)):
                break                           # s.stopped_by == "budget"
            s.charge_queries(votes, answered)   # journalled before it returns, before the answers are used
            ...
            s.show(eps=f"{ledger.epsilon():.3f}")
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from tqdm.auto import tqdm

from dpsyn.privacy import NonPrivateEvent, PrivacyEvent, PrivacyLedger
from dpsyn.results.checkpoint import Checkpoint, Checkpointer

if TYPE_CHECKING:
    from dpsyn.methods.base import RunContext

log = logging.getLogger(__name__)


def _state_of(obj: Any) -> Any:
    """What a checkpoint holds of ``obj``: a torch.Generator's state, a module's (optimiser's, ...) state dict."""
    return obj.get_state() if hasattr(obj, "get_state") else obj.state_dict()


def _load_into(obj: Any, value: Any) -> None:
    if hasattr(obj, "set_state"):
        obj.set_state(value)
    else:
        obj.load_state_dict(value)


class FitSession:
    """One ``fit``'s resume, ledger charges, checkpoints and progress bar (a context manager; see the module docstring).

    Contract:

    * **What is saved, when.** One file, ``run_dir/checkpoints/<checkpoint>`` (:class:`Checkpointer`; none without a
      run directory or with ``every=0``), written atomically: the step counter, the ledger as it stands, the state of
      every object in ``state`` and the plain ``values()``. :meth:`steps` writes it after each step whose count is a
      multiple of ``every``; :meth:`save` writes it when the method says (after a warm start, after a release whose
      output must be reused rather than made again). Nothing is saved on an exception: a crash leaves the last
      checkpoint as it was.
    * **What a resume restores.** Entering the session loads the checkpoint (one made under another ``fingerprint``
      or ``version`` is refused, before anything is released): :attr:`step` becomes its step, every object of
      ``state`` gets its saved state back in place (an object given as None is neither saved nor restored: the DP
      noise generator of a private run, which must stay secret), and :attr:`saved` holds the whole checkpoint for
      the plain values. A key the checkpoint lacks (teachers dropped as unreleased once training was over) is refused
      unless the saved step had reached ``total``. :meth:`open` then restores the checkpoint's ledger into the run's,
      event by event keeping the larger of the checkpoint's and the write-ahead journal's
      (:meth:`~dpsyn.privacy.PrivacyLedger.restore`): the charges an interrupted attempt made after its last
      checkpoint stay charged, and the steps redone from :attr:`step` are charged on top of them.
    * **What a crash at any point can lose: nothing charged.** Every charge (:meth:`open`, :meth:`charge`,
      :meth:`charge_steps`, :meth:`charge_queries`) goes through the ledger, which journals it before it returns, so
      before the release it pays for is used. A crash loses at most the steps since the last checkpoint: their work,
      never their charges.
    * **Stopping before overspending.** :meth:`would_exceed` answers whether a release would take the ledger past
      its target (a PATE method stops there: ``stopped_by == "budget"``); ``steps(charged=...)`` and
      :meth:`plan_spent` stop a run whose noise is calibrated for ``total`` (or ``planned``) charges once the ledger
      charges them all, an interrupted attempt's included (fewer steps after such a crash, epsilon within the
      target: ``stopped_by == "plan"``).
    * **The bar** (tqdm; shown on a terminal unless ``bar_disable``) counts the steps from :attr:`step` to ``total``
      and shows only what :meth:`show` is given: what the run may publish, never a secret draw.

    Args:
        ctx: the run's context (its run directory holds the checkpoint).
        ledger: the run's ledger.
        checkpoint: the checkpoint's file name under ``run_dir/checkpoints``.
        fingerprint: what a checkpoint must share with this run to be resumed (:meth:`Method.resume_fingerprint`).
        total: the steps the loop makes (the bar's total).
        desc: the bar's description, and the name the session's log lines give.
        state: the objects a checkpoint holds, by key: anything with ``state_dict``/``load_state_dict`` (modules,
            optimisers, partitions, ensembles) or ``get_state``/``set_state`` (torch generators), or None.
        values: plain values saved beside them (called at each save; read back from :attr:`saved`).
        every: checkpoint every ``every`` steps (0: no checkpoint at all).
        version: the format of the saved state (:class:`Checkpointer`).
        bar_disable: tqdm's ``disable`` (None: off when not on a terminal).
    """

    def __init__(self, ctx: RunContext, ledger: PrivacyLedger, checkpoint: str, fingerprint: Any, *, total: int,
                 desc: str, state: Mapping[str, Any] | None = None,
                 values: Callable[[], Mapping[str, Any]] | None = None, every: int = 1, version: int = 1,
                 bar_disable: bool | None = None) -> None:
        self.ledger = ledger
        self.total = int(total)
        self.desc = desc
        self.objects = dict(state or {})
        self.values = values
        self.ckpt = Checkpointer.in_run(ctx.run_dir, checkpoint, fingerprint, every=every, version=version)
        self.bar_disable = bar_disable
        self.saved: Checkpoint | None = None
        self.step = 0
        self.event_id: int | None = None
        self.stopped_by = "steps"
        self._bar: Any = None

    # ---- resume -------------------------------------------------------------------------------------------------

    def __enter__(self) -> FitSession:
        self.saved = self.ckpt.load()
        if self.saved is None:
            return self
        self.step = self.saved.step
        for key, obj in self.objects.items():
            if obj is None:
                continue
            if key not in self.saved.state:
                if self.step < self.total:
                    raise ValueError(f"{self.saved.path} holds no {key} and stopped at step {self.step} of "
                                     f"{self.total}; start a new run directory")
                continue
            if self.saved.state[key] is not None:
                _load_into(obj, self.saved.state[key])
        log.info("resuming %s from %s at step %d", self.desc, self.saved.path, self.step)
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._bar is not None:
            self._bar.close()

    @property
    def resumed(self) -> bool:
        """Whether the session started from a checkpoint."""
        return self.saved is not None

    # ---- the ledger ---------------------------------------------------------------------------------------------

    def open(self, event: PrivacyEvent | Callable[[], PrivacyEvent] | None = None) -> int | None:
        """The run's ledger from here on: on resume the checkpoint's events restored (merged with the journal, the
        larger of each kept), else ``event`` recorded now (a callable is called only then: e.g. a Renyi filter's
        budget, read from the ledger as it stands).

        Call it after the releases the run makes again before its loop (a table's class proportions, reused from
        their saved release): they are the prefix the checkpoint's ledger starts with.

        Returns:
            :attr:`event_id`: the id of the event the loop grows (:meth:`charge_steps`, :meth:`charge_queries`), the
            last one restored on resume; None when ``event`` is None or a non-private one.
        """
        if self.saved is not None:
            ids = self.saved.restore_ledger(self.ledger)
            event_id = ids[-1] if ids and event is not None else None
        elif event is not None:
            event_id = self.ledger.add(event() if callable(event) else event)
        else:
            event_id = None
        if event_id is not None and self.ledger.events[event_id].kind == NonPrivateEvent.kind:
            event_id = None
        self.event_id = event_id
        return event_id

    @property
    def event(self) -> Any:
        """The event the loop grows (as the ledger holds it now), or None."""
        return None if self.event_id is None else self.ledger.events[self.event_id]

    def charge(self, event: PrivacyEvent) -> int:
        """Record a new release (journalled before it returns); its id."""
        return self.ledger.add(event)

    def charge_steps(self, n: int = 1) -> None:
        """Add ``n`` steps to the session's DP-SGD or uniform-choice event, before the steps' releases are made."""
        self.ledger.record_steps(self._event_id(), n)

    def charge_queries(self, votes: Any, answered: Any) -> None:
        """Add a batch of Confident-GNMax queries to the session's PATE event, before the answers are used."""
        self.ledger.record_pate_queries(self._event_id(), votes, answered)

    def _event_id(self) -> int:
        if self.event_id is None:
            raise ValueError(f"{self.desc}: the session holds no event to charge (open one first)")
        return self.event_id

    def would_exceed(self, trial: PrivacyEvent) -> bool:
        """Stop before overspending: whether ``trial`` (the session's event with the next charges, e.g.
        :meth:`~dpsyn.privacy.ledger.PATEEvent.with_queries`; a new event when the session holds none) would take
        the ledger beyond its target. When it would, :attr:`stopped_by` becomes ``"budget"``; nothing is recorded."""
        if self.ledger.would_exceed(trial, replacing=self.event_id):
            self.stopped_by = "budget"
            return True
        return False

    def plan_spent(self, charged: int, planned: int) -> bool:
        """Whether a run whose noise is calibrated for ``planned`` charges has them all: ``charged`` (the ledger's,
        an interrupted attempt's after its last checkpoint included) reaches ``planned``. Then the run stops there
        (fewer steps, epsilon within the target): :attr:`stopped_by` becomes ``"plan"`` and the log says why."""
        if charged < planned:
            return False
        self.stopped_by = "plan"
        log.warning("%s: %d of the %d planned charges are charged (an interrupted attempt's after its last "
                    "checkpoint kept from the run's journal): stopping after step %d of %d (fewer steps, epsilon "
                    "within the target)", self.desc, charged, planned, self.step, self.total)
        return True

    # ---- the loop -----------------------------------------------------------------------------------------------

    def steps(self, *, charged: Callable[[], int] | None = None) -> Iterator[int]:
        """The steps from :attr:`step` (0, or the checkpoint's) to ``total``: yields each step's index, then counts
        it (:attr:`step`), moves the bar and checkpoints when due. A ``break`` in the body does not count the step.

        Args:
            charged: the steps the ledger charges so far, for a run whose noise is calibrated for ``total`` charged
                steps: the loop ends when they reach ``total`` (:meth:`plan_spent`), fewer steps after a crash whose
                charges the last checkpoint missed.
        """
        if charged is not None and charged() > self.step:
            lost = charged() - self.step
            log.warning("%s: %d steps of an interrupted attempt after its last checkpoint stay charged; the run "
                        "stops when %d are charged, %d steps short", self.desc, lost, self.total, lost)
        self._bar = tqdm(total=self.total, initial=self.step, desc=self.desc, leave=False, disable=self.bar_disable)
        while self.step < self.total:
            if charged is not None and charged() >= self.total:
                self.stopped_by = "plan"
                break
            yield self.step
            self.step += 1
            self._bar.update(1)
            if self.ckpt.due(self.step):
                self.save()

    def show(self, **postfix: Any) -> None:
        """Show ``postfix`` on the bar (what the run may publish only)."""
        if self._bar is not None:
            self._bar.set_postfix(**postfix, refresh=False)

    def save(self, **values: Any) -> None:
        """Checkpoint now (nothing without a checkpointer): :attr:`step`, the ledger, the objects' states, the
        ``values()`` given to the session and ``values`` (which take precedence)."""
        if not self.ckpt.enabled:
            return
        blob = {key: None if obj is None else _state_of(obj) for key, obj in self.objects.items()}
        if self.values is not None:
            blob.update(self.values())
        blob.update(values)
        self.ckpt.save(self.step, blob, self.ledger)


__all__ = ["FitSession"]
