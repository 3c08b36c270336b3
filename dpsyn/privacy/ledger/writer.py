"""The ledger written out: privacy.json (JSON in and out) and the accountant's description in words.

:func:`ledger_to_dict` is privacy.json's content (``inf`` written as ``"inf"``: JSON has no infinity), with the
epsilon spent and :func:`accountant_description`, the human-readable summary of how the events compose (result rows
carry it too); :func:`ledger_arguments` reads it back (the epsilon is recomputed, not trusted). :func:`save_ledger`
writes it atomically in the run directory, so that an interrupted run resumes with the ledger restored
(:meth:`dpsyn.privacy.ledger.PrivacyLedger.save` and :meth:`~dpsyn.privacy.ledger.PrivacyLedger.load`).
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dpsyn.privacy.dpsgd import opacus_version, rdp_orders_description
from dpsyn.privacy.ledger.composition import plan_events
from dpsyn.privacy.ledger.events import PrivacyEvent, _decode_float, _encode_float
from dpsyn.privacy.pate import PATE_BOUNDS
from dpsyn.results.io import atomic_write_json

if TYPE_CHECKING:
    from dpsyn.privacy.ledger import PrivacyLedger

logger = logging.getLogger(__name__)

LEDGER_FORMAT = "dpsyn.privacy_ledger"
LEDGER_VERSION = 1
PRIVACY_FILENAME = "privacy.json"
ADJACENCY_TEXT = "add/remove one private row (the same relation for every event)"


def accountant_description(events: Sequence[PrivacyEvent]) -> str:
    """Which accountant composes ``events`` (:func:`~dpsyn.privacy.ledger.composition.events_epsilon`), for result
    rows and privacy.json.

    E.g. ``"rdp (opacus 1.6.0, orders 1.1-1024), poisson sampling"``, ``"prv (opacus 1.6.0), poisson sampling"``,
    ``"gdp (exact)"``, ``"non-private"``, ``"rdp (opacus 1.6.0, orders 1.1-1024) composition of 1 pate
    confident-gnmax event(s) (data-independent bound)"``, with ``" + basic composition of N approx-DP
    event(s)"`` where needed.
    """
    plan = plan_events(events)
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


def ledger_to_dict(ledger: PrivacyLedger) -> dict[str, Any]:
    """``ledger`` as a JSON-serialisable dict (``inf`` written as ``"inf"``).

    Keys: format, version, target_epsilon, delta, adjacency, events (each with its sampling scheme and how its
    analysis meets the relation), epsilon_spent, accountant, opacus_version (and epsilon_error when the events
    cannot be composed at the ledger's delta).
    """
    out: dict[str, Any] = {
        "format": LEDGER_FORMAT,
        "version": LEDGER_VERSION,
        "target_epsilon": _encode_float(ledger.target_epsilon),
        "delta": ledger.delta,
        "adjacency": ADJACENCY_TEXT,
        "events": [e.to_dict() for e in ledger.events],
    }
    try:
        out["epsilon_spent"] = _encode_float(ledger.epsilon(ledger.delta))
    except ValueError as err:  # still saveable, so that a run can be inspected and resumed
        out["epsilon_spent"] = None
        out["epsilon_error"] = str(err)
    out["accountant"] = ledger.accountant_description()
    out["opacus_version"] = opacus_version()
    return out


def ledger_arguments(data: Mapping[str, Any]) -> dict[str, Any]:
    """The :class:`~dpsyn.privacy.ledger.PrivacyLedger` arguments (``target_epsilon``, ``delta``, ``events``) of
    :func:`ledger_to_dict` output (the epsilon written is not read: the ledger recomputes it).

    Raises:
        ValueError: If ``data`` is not a dpsyn privacy ledger of a supported version.
    """
    if not isinstance(data, Mapping) or data.get("format") != LEDGER_FORMAT:
        raise ValueError(f"not a dpsyn privacy ledger (format != {LEDGER_FORMAT!r})")
    if data.get("version") != LEDGER_VERSION:
        raise ValueError(f"unsupported privacy ledger version {data.get('version')!r}; expected {LEDGER_VERSION}")
    events = [PrivacyEvent.from_dict(e) for e in data.get("events", [])]
    return dict(
        target_epsilon=_decode_float(data["target_epsilon"]), delta=_decode_float(data["delta"]), events=events
    )


def save_ledger(ledger: PrivacyLedger, path: str | os.PathLike[str]) -> Path:
    """Write ``ledger`` (its :meth:`~dpsyn.privacy.ledger.PrivacyLedger.to_dict`) as JSON, atomically
    (:func:`dpsyn.results.io.atomic_write_json`: a temporary file in the same folder, fsynced, then ``os.replace``).

    Args:
        ledger: The ledger.
        path: The file to write, or a directory (then ``privacy.json`` in it).

    Returns:
        The path written.
    """
    path = Path(path)
    if path.is_dir():
        path = path / PRIVACY_FILENAME
    data = ledger.to_dict()
    atomic_write_json(path, data)
    logger.info("privacy ledger written to %s (epsilon spent %s)", path, data["epsilon_spent"])
    return path


def read_ledger(path: str | os.PathLike[str]) -> Any:
    """The JSON a ledger's :func:`save_ledger` wrote (``path`` may be the file or its directory)."""
    path = Path(path)
    if path.is_dir():
        path = path / PRIVACY_FILENAME
    with open(path, encoding="utf-8") as f:
        return json.load(f)


__all__ = ["ADJACENCY_TEXT", "LEDGER_FORMAT", "LEDGER_VERSION", "PRIVACY_FILENAME", "accountant_description",
           "ledger_arguments", "ledger_to_dict", "read_ledger", "save_ledger"]
