"""One checkpointer for every resuming part of a run: the step, the training state and the ledger, saved atomically
in one file under ``run_dir/checkpoints`` and restored together.

Its callers:

* the hand-written training loops (G-PATE, PATE-GAN, GS-WGAN, PE) never call it themselves: their ``fit`` runs
  inside a :class:`dpsyn.methods.session.FitSession`, which owns one :class:`Checkpointer` (``run_dir/checkpoints/
  <method>.pt``, written every ``every`` steps), loads it on entry (another fingerprint is refused), restores the
  objects of its ``state`` in place (its plain ``values`` are in ``session.saved``) and the saved ledger into the
  run's, and saves after each due step::

      with FitSession(ctx, ledger, "g_pate.pt", fingerprint, state={"G": G, "opt_g": opt_g, ...}, total=steps,
                      desc="g_pate rounds", every=hp["checkpoint_every"]) as s:
          s.open(lambda: PATEEvent(...))      # the run's event: restored on resume, else recorded now
          for step in s.steps():              # from the saved step on; checkpoints written as they fall due
              ...

* the run itself (``checkpoints/fitted.pt``: the fitted state with the ledger it was fitted under,
  :func:`dpsyn.task.save_fitted_state`);
* a one-off release reused by a rerun (``checkpoints/dp_mepf_release.pt``, :mod:`dpsyn.methods.dp_mepf`), which
  calls :meth:`Checkpointer.load` / :meth:`Checkpointer.save` and :meth:`Checkpoint.restore_ledger` directly.

It lives in :mod:`dpsyn.results` beside the atomic writers it uses (:func:`dpsyn.results.io.atomic_torch_save`):
a checkpoint is a run-directory artefact written by the CLI as well as by methods, and keeping it here lets the
CLI use it without importing a method module. torch is imported only when a checkpoint is read or written.

The file is one dict: the caller's state keys at the top level (so that
:meth:`~dpsyn.methods.base.Method.drop_unreleased_checkpoint_state` can remove teachers or critics by key), with
``step``, ``fingerprint``, ``version`` and ``ledger`` (:meth:`PrivacyLedger.to_dict`) beside them. It must hold no
DP noise generator of a private run (docs/published-fields.md): the callers keep those out.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

#: keys the checkpointer writes beside the caller's state
RESERVED_KEYS = ("step", "fingerprint", "version", "ledger")


def _differing(saved: Any, wanted: Any) -> list[str]:
    if isinstance(saved, Mapping) and isinstance(wanted, Mapping):
        return sorted(str(k) for k in set(saved) | set(wanted) if saved.get(k) != wanted.get(k))
    return []


@dataclass
class Checkpoint:
    """What :meth:`Checkpointer.load` found: the step reached, the caller's state and the ledger's dict (or None)."""

    path: Path
    step: int
    state: dict[str, Any]
    ledger: dict[str, Any] | None

    def restored_ledger(self) -> Any:
        """The saved ledger as a :class:`~dpsyn.privacy.PrivacyLedger` (its epsilon recomputed, not trusted).

        Raises:
            ValueError: the checkpoint holds no ledger.
        """
        from dpsyn.privacy import PrivacyLedger

        if self.ledger is None:
            raise ValueError(f"{self.path} holds no ledger")
        return PrivacyLedger.from_dict(self.ledger)

    def restore_ledger(self, ledger: Any) -> list[int]:
        """Put the saved events into ``ledger``, the run's, so that every release made before the interruption is
        charged once: not forgotten, not charged twice (:meth:`~dpsyn.privacy.PrivacyLedger.restore`).

        ``ledger`` may already hold a prefix of the saved events, those the resumed run charged again before
        restoring (e.g. the class proportions reused from ``checkpoints/class_proportions.json``): they must equal
        the saved ones, and only the rest is added.

        A run's ledger (:mod:`dpsyn.task`) starts from its write-ahead journal
        (:meth:`~dpsyn.privacy.PrivacyLedger.attach_journal`), which holds every charge of the interrupted attempt,
        those made after this checkpoint too: each event restored is the later of its journal and checkpoint states
        (the one with more charges), and the journal's events after the checkpoint's stay. The rounds the resumed
        run redoes from :attr:`step` are charged on top: both their first and their second releases happened.

        Returns:
            the ids (indices in ``ledger``) of the saved events after the re-charged prefix, in order.

        Raises:
            ValueError: the checkpoint holds no ledger, ``ledger`` holds events that are not a prefix of it, or the
                journal holds another run's records.
        """
        if self.ledger is None:
            raise ValueError(f"{self.path} holds no ledger")
        return ledger.restore(list(self.ledger.get("events", [])), source=str(self.path))


class Checkpointer:
    """Saves and restores one checkpoint file (see the module docstring).

    Args:
        path: the checkpoint file; None: checkpointing is off (``load`` returns None, ``save`` writes nothing).
        fingerprint: what the checkpoint must share with a run to be resumed (a JSON-like dict, or any value
            compared with ``==``); a checkpoint made under another one is refused.
        every: ``due(step)`` every ``every`` steps (0: never).
        version: the format of the caller's state; a checkpoint of another version is refused.
        what: how the message names the checkpoint's making ("made", "fitted", "trained").
    """

    def __init__(self, path: str | Path | None, fingerprint: Any, *, every: int = 1, version: int = 1,
                 what: str = "made") -> None:
        if isinstance(every, bool) or not isinstance(every, int) or every < 0:
            raise ValueError(f"checkpoint every={every!r}: must be an integer >= 0")
        self.path = Path(path) if path is not None else None
        self.fingerprint = fingerprint
        self.every = every
        self.version = version
        self.what = what

    @classmethod
    def in_run(cls, run_dir: str | Path | None, name: str, fingerprint: Any, *, every: int = 1, version: int = 1,
               what: str = "made") -> Checkpointer:
        """The checkpointer of ``run_dir/checkpoints/name``; off (path None) without a run directory or when
        ``every`` is 0."""
        path = Path(run_dir) / "checkpoints" / name if run_dir is not None and every else None
        return cls(path, fingerprint, every=every, version=version, what=what)

    @property
    def enabled(self) -> bool:
        return self.path is not None

    def due(self, step: int) -> bool:
        """Whether step ``step`` (counted from 1) is one to checkpoint."""
        return self.path is not None and self.every > 0 and step % self.every == 0

    def exists(self) -> bool:
        return self.path is not None and self.path.is_file()

    def save(self, step: int, state: Mapping[str, Any], ledger: Any = None) -> Path | None:
        """Write ``state`` with the step, the fingerprint and ``ledger`` (a PrivacyLedger, or None) atomically: a kill
        during the write leaves the previous checkpoint intact.

        Raises:
            ValueError: ``state`` uses one of :data:`RESERVED_KEYS`.
        """
        if self.path is None:
            return None
        from dpsyn.results.io import atomic_torch_save

        clash = sorted(set(state) & set(RESERVED_KEYS))
        if clash:
            raise ValueError(f"checkpoint state keys {clash} are reserved by the checkpointer")
        blob = {**state, "step": int(step), "fingerprint": self.fingerprint, "version": self.version,
                "ledger": ledger.to_dict() if ledger is not None else None}
        return atomic_torch_save(self.path, blob)

    def load(self, *, map_location: Any = "cpu") -> Checkpoint | None:
        """The checkpoint saved at :attr:`path`, or None.

        Args:
            map_location: for ``torch.load``: "cpu" (``load_state_dict`` moves tensors where they belong), or None
                to keep tensors on the device they were saved from (whole modules, as in ``fitted.pt``).

        Raises:
            ValueError: it was made under another fingerprint or version (resume with the same config, or use a new
                run directory).
        """
        if self.path is None or not self.path.is_file():
            return None
        import torch

        blob = torch.load(self.path, map_location=map_location, weights_only=False)
        if blob.get("version") != self.version:
            raise ValueError(f"{self.path} has checkpoint version {blob.get('version')!r}, expected {self.version}: "
                             "use a new run directory")
        saved = blob.get("fingerprint")
        if saved != self.fingerprint:
            diff = _differing(saved, self.fingerprint)
            detail = f" (differing: {', '.join(diff)})" if diff else ""
            raise ValueError(f"{self.path} was {self.what} under another configuration{detail}: resume with the same "
                             "config, or use a new run directory")
        state = {k: v for k, v in blob.items() if k not in RESERVED_KEYS}
        return Checkpoint(path=self.path, step=int(blob["step"]), state=state, ledger=blob.get("ledger"))


def drop_keys(path: str | Path, keys: tuple[str, ...] | list[str]) -> bool:
    """Rewrite the checkpoint at ``path`` without the state ``keys`` (atomically), e.g. teachers trained without
    noise once training is over.

    Returns:
        True when the file was rewritten (it exists and held one of ``keys``).
    """
    path = Path(path)
    if not path.is_file():
        return False
    import torch

    from dpsyn.results.io import atomic_torch_save

    blob = torch.load(path, map_location="cpu", weights_only=False)
    if not any(k in blob for k in keys):
        return False
    atomic_torch_save(path, {k: v for k, v in blob.items() if k not in keys})
    return True


def lightning_dp_steps(path: str | Path, dp: Mapping[str, Any] | None) -> int:
    """The DP-SGD steps already made by the Lightning checkpoint at ``path`` (written by
    :class:`dpsyn.lit.gan.PeriodicCheckpoint`, atomically; ``checkpoint["dpsyn"]`` holds the steps and the
    calibration), for the Lightning methods that resume with ``Trainer.fit(ckpt_path=...)``. Its fingerprint is the
    DP calibration: a checkpoint made under another noise multiplier or step budget is refused.

    Args:
        dp: this run's DP settings (``noise_multiplier``, ``max_steps``), or None for a non-private run.

    Raises:
        ValueError: the checkpoint's noise multiplier or step budget differs from this run's.
    """
    import torch

    state = torch.load(path, map_location="cpu", weights_only=False)["dpsyn"]
    want = (None, None) if dp is None else (dp["noise_multiplier"], dp["max_steps"])
    if (state["noise_multiplier"], state["max_steps"]) != want:
        raise ValueError(
            f"{path} was trained with noise multiplier {state['noise_multiplier']} for {state['max_steps']} steps, "
            f"this config calibrates {want[0]} for {want[1]}: resume with the same config, or use a new run directory"
        )
    return int(state["dp_steps"])
