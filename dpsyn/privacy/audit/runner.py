"""Running the audit: the mechanisms' scores (:mod:`dpsyn.privacy.audit.mechanisms`) turned into epsilon lower
bounds, one row per mechanism, and the rows as a console table or kept in docs/data/audit.csv.

A distinguishing test on a mechanism's outputs gives a lower bound on its epsilon
(:func:`dpsyn.privacy.audit.stats.audit_scores`: threshold chosen on one half of the trials, Clopper-Pearson bounds on
the other). A lower bound above ``eps_claimed`` is evidence that the code adding the noise is wrong (a std off by a
factor, a clip after the sum, noise shared between coordinates...): the row fails.

Confidence is family-wise: ``confidence`` (95% by default) over all audited mechanisms together (Bonferroni), so a
correct implementation fails by chance with probability at most 1 - confidence, although some mechanisms (the
Laplace release) are exactly tight.

Rows (:func:`run_audit`): ``mechanism``, ``eps_claimed``, ``delta``, ``eps_lower``, ``trials``, ``passed`` and how
the bound was obtained.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from dpsyn.privacy.audit.mechanisms import MECHANISMS, NoiseSource
from dpsyn.privacy.audit.stats import audit_scores

log = logging.getLogger("dpsyn.audit")


def select_mechanisms(spec: Any) -> list[str]:
    """``"all"``, one name, or a list of names -> the names, in table order.

    Raises:
        ValueError: an unknown name (the message lists the allowed ones).
    """
    names = list(MECHANISMS) if spec in ("all", None) else [spec] if isinstance(spec, str) else list(spec)
    unknown = [n for n in names if n not in MECHANISMS]
    if unknown or not names:
        raise ValueError(f"mechanisms={','.join(map(str, unknown)) or '[]'}: unknown; allowed: all, "
                         f"{', '.join(MECHANISMS)}")
    return names


def run_audit(names: list[str], *, eps: float, delta: float, trials: int, confidence: float = 0.95,
              deterministic: bool = False, seed: int = 0) -> list[dict[str, Any]]:
    """Audit the mechanisms ``names``; one row per mechanism (see the module docstring).

    Args:
        names: mechanism names (:data:`MECHANISMS`).
        eps, delta: the claim each mechanism is calibrated to.
        trials: outputs per side of the neighbouring pair (and arm, for discrete outputs).
        confidence: family-wise confidence of all the lower bounds together.
        deterministic: seed the mechanisms' noise from ``seed`` (a reproducible audit; tests).
        seed: seeds the canary layout and the half split (and the noise when ``deterministic``).

    Raises:
        ValueError: on bad arguments.
    """
    if not (0 < eps < math.inf) or not 0 < delta < 1:
        raise ValueError(f"eps must be finite and > 0 and delta in (0, 1); got eps={eps!r}, delta={delta!r}")
    if isinstance(trials, bool) or not isinstance(trials, int) or trials < 100:
        raise ValueError(f"trials={trials!r}: must be an integer >= 100")
    if not 0 < confidence < 1:
        raise ValueError(f"confidence={confidence!r}: must lie in (0, 1)")
    alpha = (1.0 - confidence) / (2 * len(names))  # Bonferroni: two Clopper-Pearson bounds per mechanism
    rows, shared = [], {}
    for i, name in enumerate(names):
        t0 = time.perf_counter()
        noise = NoiseSource(deterministic=deterministic, seed=seed + 7919 * i, shared=shared)
        out = MECHANISMS[name].run(float(eps), float(delta), int(trials), noise)
        res = audit_scores(out.scores0, out.scores1, delta=float(delta), alpha=alpha,
                           rng=np.random.default_rng(seed + 104729 * (i + 1)))
        row = {"mechanism": name, "eps_claimed": out.eps_claimed, "delta": float(delta), "eps_lower": res.eps_lower,
               "trials": res.trials, "passed": bool(res.eps_lower <= out.eps_claimed), "what": MECHANISMS[name].what,
               "test": {k: v for k, v in asdict(res).items() if k not in ("eps_lower", "trials")},
               "params": out.params, "seconds": time.perf_counter() - t0}
        log.info("%s: eps_lower %.3f, eps_claimed %.3f (%.1f s)", name, res.eps_lower, out.eps_claimed,
                 row["seconds"])
        rows.append(row)
    return rows


def keep_rows(rows: list[dict[str, Any]], *, confidence: float, path: Path | None = None, **given: str) -> Path:
    """Write an audit's rows to docs/data/audit.csv, the table of docs/audit.md (``keep=true``; replaces the last)."""
    from dpsyn.results import kept

    table = [{"mechanism": r["mechanism"], "what": r["what"], "eps_claimed": f"{r['eps_claimed']:.4f}",
              "eps_lower": f"{r['eps_lower']:.4f}", "trials": r["trials"], "seconds": f"{r['seconds']:.1f}",
              "confidence": confidence} for r in rows]
    return kept.keep_rows("audit", table, key=(), path=path, **given)


def format_table(rows: list[dict[str, Any]], *, confidence: float) -> str:
    """The console table."""
    lines = [f"dpsyn audit: epsilon lower bounds at {confidence:.0%} family-wise confidence (Clopper-Pearson, "
             "Bonferroni)",
             f"  {'mechanism':<22} {'eps_claimed':>11} {'eps_lower':>9} {'lower/claimed':>13} {'trials':>9}  verdict"]
    for r in rows:
        ratio = r["eps_lower"] / r["eps_claimed"] if r["eps_claimed"] > 0 else math.nan
        lines.append(f"  {r['mechanism']:<22} {r['eps_claimed']:>11.4f} {r['eps_lower']:>9.4f} {ratio:>13.2f} "
                     f"{r['trials']:>9d}  {'ok' if r['passed'] else 'FAIL: eps_lower > eps_claimed'}")
    return "\n".join(lines)

