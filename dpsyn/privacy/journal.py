"""The write-ahead journal of a run's ledger: every charge on disk before the release it pays for can be used.

A run's :class:`~dpsyn.privacy.PrivacyLedger` (attached with :meth:`~dpsyn.privacy.PrivacyLedger.attach_journal`
by :mod:`dpsyn.task`) writes its events to ``checkpoints/ledger.journal.json`` inside every recording call,
atomically (:func:`dpsyn.results.io.atomic_write`: a temporary file, fsynced, renamed), before the call returns. A
SIGKILL skips every ``finally``, so privacy.json may be stale; the journal is not: it holds at least every charge
whose release may have left the process (a logged loss, an answered share on the console, a W&B point).

A rerun in the same run directory starts its ledger from the journal (the releases of the killed attempt happened,
whatever its checkpoints say), and merges a checkpoint into it event by event (:func:`merge_events`): event ``i`` of
the journal and of the checkpoint are two states of the same release record, and the later one, the one with more
charges, is kept. The rounds the rerun redoes after the checkpoint are new releases, charged on top.

What grows in an event (its *charges*, :data:`CHARGE_FIELDS`): a DP-SGD or uniform-choice event's ``steps``, a
Gaussian event's
``count``, a PATE event's queries (``queries``, ``answered``, ``rdp_data_dependent``, ``smooth_release``). Every
other field is the event's *header* (its mechanism and label): two states of one event have the same header.

The file holds only what privacy.json holds (the events, the target and delta) and the fingerprint of the run's
configuration (derived from config.yaml): a journal written under another configuration is refused, as the
checkpoints are (:class:`dpsyn.results.checkpoint.Checkpointer`). It is written compactly (no indentation) to keep
the write small: measured 0.5 ms a write on the development machine's disk (ext4 on virtio; fsync included).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

JOURNAL_FORMAT = "dpsyn.ledger_journal"
JOURNAL_VERSION = 1
JOURNAL_PATH = Path("checkpoints") / "ledger.journal.json"
"""Where a run keeps its journal, relative to the run directory."""

CHARGE_FIELDS: dict[str, tuple[str, ...]] = {
    "gaussian": ("count",),
    "sampled_gaussian": ("steps",),
    "uniform_choice_gaussian": ("steps",),
    "pate": ("queries", "answered", "rdp_data_dependent", "smooth_release"),
}
"""Per event kind, the fields that grow as releases are recorded; an event of another kind never grows."""


def _encode(x: float) -> float | str:
    return "inf" if math.isinf(x) else float(x)


def _finite(obj: Any) -> Any:
    """``obj`` as strict JSON values: infinities and nan as the strings "inf", "-inf", "nan" (eps=inf runs)."""
    if isinstance(obj, Mapping):
        return {str(k): _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v) for v in obj]
    if isinstance(obj, float) and not math.isfinite(obj):
        return str(obj)
    return obj


class JournalError(ValueError):
    """A journal that cannot be merged: another configuration, or events that are not states of the same records."""


def header(event: Mapping[str, Any]) -> dict[str, Any]:
    """The event (a :meth:`~dpsyn.privacy.PrivacyEvent.to_dict` dict) without its charges."""
    charges = CHARGE_FIELDS.get(event["kind"], ())
    return {k: v for k, v in event.items() if k not in charges}


def is_empty(event: Mapping[str, Any]) -> bool:
    """Whether the event records no release yet (a DP-SGD event of 0 steps, a PATE event without queries, ...)."""
    kind = event["kind"]
    if kind in ("sampled_gaussian", "uniform_choice_gaussian"):
        return event["steps"] == 0
    if kind == "gaussian":
        return event["count"] == 0
    if kind == "pate":
        return event["queries"] == 0 and event.get("smooth_release") is None
    return False


def dominates(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    """Whether ``a`` holds at least every charge of ``b`` (two states of one event: same header)."""
    if header(a) != header(b):
        return False
    for key in CHARGE_FIELDS.get(a["kind"], ()):
        x, y = a.get(key), b.get(key)
        if key == "smooth_release":
            if y is not None and x != y:
                return False
        elif key == "rdp_data_dependent":
            if len(x) != len(y) or any(p < q for p, q in zip(x, y)):
                return False
        elif x < y:
            return False
    return True


def merge_events(journal: Sequence[Mapping[str, Any]], saved: Sequence[Mapping[str, Any]], *,
                 source: str = "the checkpoint") -> list[dict[str, Any]]:
    """The events of a run resumed from ``saved`` (a checkpoint's) after an attempt that journalled ``journal``.

    Position by position, the event with more charges (the journal's, normally: it is written ahead of every
    release, the checkpoint now and then); the events only one of them holds are kept too (the journal's releases
    after the checkpoint, or a checkpoint's beyond a journal that lost them).

    Raises:
        JournalError: the two disagree at a position: another mechanism or label, or neither holds the other's charges.
    """
    out: list[dict[str, Any]] = []
    for i in range(max(len(journal), len(saved))):
        if i >= len(saved):
            out.append(dict(journal[i]))
        elif i >= len(journal):
            out.append(dict(saved[i]))
        elif dominates(journal[i], saved[i]):
            out.append(dict(journal[i]))
        elif dominates(saved[i], journal[i]):
            out.append(dict(saved[i]))
        else:
            raise JournalError(f"cannot resume from {source}: its ledger event {i} ({saved[i].get('label')!r}) is not a "
                               f"state of the journal's ({journal[i].get('label')!r}): the run directory holds the "
                               "records of another run; use a new run directory")
    return out


def charges_beyond(merged: Sequence[Mapping[str, Any]], saved: Sequence[Mapping[str, Any]]) -> list[str]:
    """What ``merged`` charges beyond ``saved``, one short phrase per event (for the resume's warning)."""
    out = []
    for i, e in enumerate(merged):
        if i >= len(saved):
            out.append(f"event {i} ({e.get('label') or e['kind']}) whole")
            continue
        for key in CHARGE_FIELDS.get(e["kind"], ()):
            if key in ("queries", "steps", "count") and e[key] != saved[i][key]:
                out.append(f"{e[key] - saved[i][key]} {key} of event {i} ({e.get('label') or e['kind']})")
    return out


def _differing(saved: Any, wanted: Any) -> list[str]:
    if isinstance(saved, Mapping) and isinstance(wanted, Mapping):
        return sorted(str(k) for k in set(saved) | set(wanted) if saved.get(k) != wanted.get(k))
    return []


class Journal:
    """One run's journal file: written by the ledger it is attached to, read by the run that resumes.

    Args:
        path: the file (``run_dir / JOURNAL_PATH``).
        fingerprint: what a journal must share with the run to be merged (a JSON-serialisable value; the run's
            :func:`dpsyn.task.fit_fingerprint`).
    """

    def __init__(self, path: str | os.PathLike[str], fingerprint: Any) -> None:
        self.path = Path(path)
        self.fingerprint = _finite(json.loads(json.dumps(fingerprint, sort_keys=True, default=str)))
        # the constant part of every write, serialised once
        self._head = json.dumps({"format": JOURNAL_FORMAT, "version": JOURNAL_VERSION,
                                 "fingerprint": self.fingerprint}, separators=(",", ":"), allow_nan=False)[:-1]

    def read(self) -> dict[str, Any] | None:
        """The journal on disk (``{"fingerprint", "target_epsilon", "delta", "events"}``), or None without one.

        Raises:
            JournalError: it is not a dpsyn journal of this version, or it holds events journalled under another
                fingerprint (a journal of another configuration that holds no event is ignored: nothing to lose).
        """
        if not self.path.is_file():
            return None
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except ValueError as e:
            raise JournalError(f"{self.path} is not a readable ledger journal ({e}): use a new run directory") from e
        if not isinstance(data, Mapping) or data.get("format") != JOURNAL_FORMAT:
            raise JournalError(f"{self.path} is not a dpsyn ledger journal: use a new run directory")
        if data.get("version") != JOURNAL_VERSION:
            raise JournalError(f"{self.path} has journal version {data.get('version')!r}, expected {JOURNAL_VERSION}: "
                               "use a new run directory")
        events = list(data.get("events") or [])
        if data.get("fingerprint") != self.fingerprint:
            if not events:
                return None
            diff = _differing(data.get("fingerprint"), self.fingerprint)
            detail = f" (differing: {', '.join(diff)})" if diff else ""
            raise JournalError(f"{self.path} was journalled under another configuration{detail}: its charges would be "
                               "merged into this run's; resume with the same config, or use a new run directory")
        return {"fingerprint": data["fingerprint"], "target_epsilon": data.get("target_epsilon"),
                "delta": data.get("delta"), "events": events}

    def write(self, *, target_epsilon: float, delta: float, events: Sequence[Mapping[str, Any]]) -> None:
        """Write the ledger's events atomically (fsynced, renamed): a kill leaves the previous version or this one."""
        from dpsyn.results.io import atomic_write

        body = json.dumps({"target_epsilon": _encode(target_epsilon), "delta": delta, "events": list(events)},
                          separators=(",", ":"), allow_nan=False)
        text = f"{self._head},{body[1:]}\n".encode()
        atomic_write(self.path, lambda f: f.write(text))

    def __repr__(self) -> str:
        return f"Journal({str(self.path)!r})"


__all__ = ["CHARGE_FIELDS", "JOURNAL_PATH", "Journal", "JournalError", "charges_beyond", "dominates", "header",
           "is_empty", "merge_events"]
