"""The papers' claims as checked data: ``experiments/<paper>/claims.yaml`` -> one verdict per claim, with its interval.

A claim compares two table cells (``a``, ``b``: selectors over runs) on one metric, or one cell with a number
(``b: {value: ...}``, a published figure or a threshold):

- ``less`` / ``greater``: the mean of ``a`` is below / above that of ``b``;
- ``within``: the means differ by at most ``margin``.

The difference of the means gets a 95% Welch interval over the seeds (each seed is one run; unequal variances; a
number as ``b`` gives a one-sample t interval). The verdict: ``holds`` when the whole interval lies on the claimed
side (inside ``[-margin, margin]`` for ``within``), ``fails`` when the whole interval lies on the other side
(outside it), ``inconclusive`` otherwise, and whenever a side has fewer than 2 seeds (no interval) or no runs.
Each claim is tested at 95% on its own (no correction over claims: with 20 claims, one spurious verdict is expected).

A claim compares cells of one evaluation protocol only (:mod:`dpsyn.results.protocol`): when the runs it reads (both
sides, every seed) carry more than one protocol id, the verdict is ``refused``, its reason naming the ids, and it
counts as neither holding nor failing. A verdict rather than an error: the other claims are still judged, and the
claims table shows which comparison needs a rerun. Profiles are mixed only as the claim's ``profiles`` list allows (a
seed is read from the first of them that has it; ``quick`` is the embedded profile's settings on fewer cells); the
protocol check holds across them too.

Why Welch and not a bootstrap: with 3 seeds a side, a percentile bootstrap has only 10 distinct resampled means per
side and its interval is too narrow; the t interval is the honest one at that n (``tests/test_claims.py`` checks it
against scipy's ``ttest_ind(equal_var=False)``).
No torch import here.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

KINDS = ("less", "greater", "within")
VERDICTS = ("holds", "fails", "inconclusive", "refused")
COORDS = ("experiment", "method", "dataset", "eps")
DEFAULT_PROFILES = ("embedded", "quick")


@dataclass(frozen=True)
class Side:
    """Runs of one cell: coordinates plus any override (``f0: 0.05``) or result field; or a fixed ``value``."""

    select: dict[str, Any]
    metric: str | None = None
    value: float | None = None

    def label(self) -> str:
        if self.value is not None:
            return f"{self.value:g}"
        parts = [str(self.select[k]) for k in ("method", "dataset") if k in self.select]
        if "eps" in self.select:
            parts.append(f"eps={self.select['eps']}")
        parts += [f"{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in self.select.items() if k not in COORDS]
        return " ".join(parts) + (f" [{self.metric}]" if self.metric else "")


@dataclass(frozen=True)
class Claim:
    paper: str
    id: str
    wording: str
    source: str
    metric: str
    kind: str
    a: Side
    b: Side
    margin: float = 0.0
    note: str = ""
    profiles: tuple[str, ...] = DEFAULT_PROFILES


@dataclass
class Verdict:
    claim: Claim
    verdict: str
    reason: str
    a_values: list[float] = field(default_factory=list)
    b_values: list[float] = field(default_factory=list)
    diff: float = math.nan
    ci: tuple[float, float] = (math.nan, math.nan)
    df: float = math.nan
    protocol: str | None = None  # the one protocol id of the runs compared (None: no runs, or refused)

    def to_dict(self) -> dict[str, Any]:
        c = self.claim

        def side(s: Side, values: list[float]) -> dict[str, Any]:
            d: dict[str, Any] = {"label": s.label(), "n": len(values), "values": values}
            if s.value is not None:
                d = {"label": s.label(), "value": s.value}
            elif values:
                d["mean"] = statistics.fmean(values)
                d["std"] = statistics.stdev(values) if len(values) > 1 else None
            return d

        return {
            "paper": c.paper, "id": c.id, "wording": c.wording, "source": c.source, "metric": c.metric,
            "claim": c.kind, "margin": c.margin if c.kind == "within" else None, "note": c.note,
            "a": side(c.a, self.a_values), "b": side(c.b, self.b_values),
            "diff": None if math.isnan(self.diff) else self.diff,
            "ci95": None if math.isnan(self.ci[0]) else list(self.ci),
            "df": None if math.isnan(self.df) else self.df,
            "test": "welch t (95%)" if c.b.value is None else "one-sample t (95%)",
            "protocol": self.protocol, "verdict": self.verdict, "reason": self.reason,
        }


def _side(raw: dict[str, Any] | None, where: str) -> Side:
    if not isinstance(raw, dict) or not raw:
        raise ValueError(f"{where}: a side needs a selector (method, dataset, eps, ...) or {{value: number}}")
    raw = dict(raw)
    if "value" in raw:
        if len(raw) != 1:
            raise ValueError(f"{where}: a fixed value takes no selector")
        return Side({}, value=float(raw["value"]))
    metric = raw.pop("metric", None)
    return Side(raw, metric=metric)


def load_claims(path: str | Path) -> list[Claim]:
    """Read one ``claims.yaml``; raises ValueError naming the claim on a malformed entry."""
    from omegaconf import OmegaConf

    path = Path(path)
    raw = OmegaConf.to_container(OmegaConf.load(path), resolve=True)
    paper = str(raw.get("paper") or path.parent.name)
    profiles = tuple(raw.get("profiles") or DEFAULT_PROFILES)
    out, seen = [], set()
    for i, c in enumerate(raw.get("claims") or []):
        where = f"{path}: claim {c.get('id', i)}"
        for key in ("id", "wording", "source", "metric", "claim", "a", "b"):
            if key not in c:
                raise ValueError(f"{where}: lacks '{key}'")
        if c["claim"] not in KINDS:
            raise ValueError(f"{where}: claim={c['claim']}; allowed: {', '.join(KINDS)}")
        if c["claim"] == "within" and "margin" not in c:
            raise ValueError(f"{where}: a 'within' claim needs a margin")
        if c["id"] in seen:
            raise ValueError(f"{where}: duplicate id")
        seen.add(c["id"])
        a, b = _side(c["a"], f"{where}, a"), _side(c["b"], f"{where}, b")
        if a.value is not None:
            raise ValueError(f"{where}: side a must select runs (put the number in b)")
        out.append(Claim(paper=paper, id=str(c["id"]), wording=str(c["wording"]), source=str(c["source"]),
                         metric=str(c["metric"]), kind=c["claim"], a=a, b=b, margin=float(c.get("margin", 0.0)),
                         note=str(c.get("note") or ""), profiles=tuple(c.get("profiles") or profiles)))
    return out


def _norm(v: Any) -> Any:
    if isinstance(v, bool):
        return str(v).lower()
    if isinstance(v, (int, float)):
        return float(v)
    if isinstance(v, str):
        try:
            return float(v)
        except ValueError:
            return v.lower() if v.lower() in ("true", "false") else v
    return v


def _overrides(rec: dict[str, Any]) -> dict[str, str]:
    out = {}
    for o in rec.get("overrides") or []:
        if "=" in o:
            k, v = o.split("=", 1)
            out[k.lstrip("+~")] = v
    return out


def matches(rec: dict[str, Any], select: dict[str, Any]) -> bool:
    """Whether a run (result.json or a record from results.csv) is in the cell ``select`` names.

    A run with an override the selector does not name is a variant of the cell (``method.conditional=true`` beside
    the plain runs), not one of its seeds: it does not match."""
    from dpsyn.results.export import kept_overrides
    from dpsyn.results.tables import _field

    ovr = _overrides(rec)
    if any(o.split("=", 1)[0].lstrip("+~") not in select for o in kept_overrides(rec.get("overrides") or [])):
        return False
    for k, want in select.items():
        if k in COORDS:
            got = rec.get(k)
        elif k in ovr:
            got = ovr[k]
        else:
            got = _field(rec, k)
        if got is None or _norm(got) != _norm(want):
            return False
    return True


def side_runs(records: Iterable[dict[str, Any]], side: Side, metric: str,
              profiles: Sequence[str]) -> list[tuple[float, str]]:
    """(value, protocol id) per seed, in seed order (a seed found in several profiles: the first profile in
    ``profiles``); the protocol is "" for a run written before protocol ids."""
    by_seed: dict[Any, tuple[int, float, str]] = {}
    for r in records:
        prof = r.get("profile")
        if prof not in profiles or not matches(r, side.select):
            continue
        v = (r.get("metrics") or {}).get(metric)
        if v is None or isinstance(v, str) or math.isnan(float(v)):
            continue
        rank = profiles.index(prof)
        seed = r.get("seed")
        if seed not in by_seed or rank < by_seed[seed][0]:
            by_seed[seed] = (rank, float(v), str(r.get("protocol") or ""))
    return [(v, p) for _, (_, v, p) in sorted(by_seed.items(), key=lambda kv: str(kv[0]))]


def side_values(records: Iterable[dict[str, Any]], side: Side, metric: str, profiles: Sequence[str]) -> list[float]:
    """One value per seed (a seed found in several profiles: the first profile in ``profiles``)."""
    return [v for v, _ in side_runs(records, side, metric, profiles)]


def _ids(protocols: Iterable[str]) -> str:
    return ", ".join(p or "(none recorded)" for p in sorted(set(protocols)))


def mixed_protocols(a: Sequence[str], b: Sequence[str]) -> str | None:
    """Why runs of protocols ``a`` (side a's seeds) and ``b`` (side b's) cannot be compared; None when they share one."""
    if len(set(a) | set(b)) < 2:
        return None
    for name, side in (("a", a), ("b", b)):
        if len(set(side)) > 1:
            return f"mixed protocols within {name}: {_ids(side)}"
    return f"mixed protocols: {_ids(a)} (a) vs {_ids(b)} (b)"


def welch_interval(a: Sequence[float], b: Sequence[float] | float, level: float = 0.95) -> tuple[float, float, float, float]:
    """(difference of means, lower, upper, degrees of freedom): Welch's t interval for mean(a) - mean(b), or the
    one-sample t interval for mean(a) - b when b is a number."""
    from scipy import stats

    na, ma = len(a), statistics.fmean(a)
    va = statistics.variance(a)
    if isinstance(b, (int, float)):
        diff, se2, df = ma - float(b), va / na, float(na - 1)
    else:
        nb, mb, vb = len(b), statistics.fmean(b), statistics.variance(b)
        diff, se2 = ma - mb, va / na + vb / nb
        denom = (va / na) ** 2 / (na - 1) + (vb / nb) ** 2 / (nb - 1)
        df = se2**2 / denom if denom > 0 else float(na + nb - 2)
    if se2 == 0:
        return diff, diff, diff, df
    half = stats.t.ppf(0.5 + level / 2, df) * math.sqrt(se2)
    return diff, diff - half, diff + half, df


def evaluate(claim: Claim, records: Sequence[dict[str, Any]]) -> Verdict:
    runs_a = side_runs(records, claim.a, claim.a.metric or claim.metric, claim.profiles)
    runs_b = [] if claim.b.value is not None else side_runs(
        records, claim.b, claim.b.metric or claim.metric, claim.profiles)
    a, b = [x for x, _ in runs_a], [x for x, _ in runs_b]
    v = Verdict(claim, "inconclusive", "", a, b)
    missing = [name for name, vals, s in (("a", a, claim.a), ("b", b, claim.b)) if s.value is None and not vals]
    if missing:
        v.reason = f"no runs for {' and '.join(missing)}"
        return v
    refused = mixed_protocols([p for _, p in runs_a], [p for _, p in runs_b])
    if refused:
        v.verdict, v.reason = "refused", refused
        return v
    v.protocol = runs_a[0][1]
    v.diff = statistics.fmean(a) - (claim.b.value if claim.b.value is not None else statistics.fmean(b))
    if len(a) < 2 or (claim.b.value is None and len(b) < 2):
        v.reason = "fewer than 2 seeds: no interval"
        return v
    v.diff, lo, hi, v.df = welch_interval(a, claim.b.value if claim.b.value is not None else b)
    # float noise is no evidence: 0.1 and 0.10000000000000002 (chance accuracy written two ways) are a tie
    tol = 1e-9 * max(1.0, abs(statistics.fmean(a)), abs(statistics.fmean(b) if b else claim.b.value or 0.0))
    lo, hi = (0.0 if abs(lo) < tol else lo), (0.0 if abs(hi) < tol else hi)
    v.ci = (lo, hi)
    m = claim.margin
    # a strict inequality is contradicted by an interval that reaches no further than the boundary (a zero-width
    # interval at 0: every seed tied, e.g. all at chance accuracy)
    if claim.kind == "less":
        v.verdict = "holds" if hi < 0 else "fails" if lo >= 0 else "inconclusive"
    elif claim.kind == "greater":
        v.verdict = "holds" if lo > 0 else "fails" if hi <= 0 else "inconclusive"
    else:
        v.verdict = "holds" if -m <= lo and hi <= m else "fails" if lo > m or hi < -m else "inconclusive"
    v.reason = {"holds": "the interval lies on the claimed side", "fails": "the interval lies on the other side",
                "inconclusive": "the interval crosses the boundary"}[v.verdict]
    return v


def claim_files(experiments_dir: Path) -> list[Path]:
    return sorted(experiments_dir.glob("*/claims.yaml"))


def evaluate_all(records: Sequence[dict[str, Any]], experiments_dir: Path) -> list[Verdict]:
    """Every claim of ``experiments_dir/*/claims.yaml``, judged on ``records``."""
    return [evaluate(c, records) for path in claim_files(experiments_dir) for c in load_claims(path)]


def _fmt(x: float | None, digits: int = 3) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "—"
    return f"{x:.{digits}g}" if abs(x) >= 1000 else f"{x:.{digits}f}"


def render_markdown(verdicts: Sequence[Verdict]) -> str:
    """The claims table (one line per claim) and its reading guide."""
    sym = {"less": "<", "greater": ">", "within": "≈"}
    out = ["| paper | claim (the paper's wording) | compared | a: mean ± std (n) | b: mean ± std (n) | "
           "a − b [95% CI] | verdict |", "|---|---|---|---|---|---|---|"]
    for v in verdicts:
        d = v.to_dict()
        c = v.claim

        def cell(s: dict[str, Any]) -> str:
            if "value" in s:
                return _fmt(s["value"])
            if not s["n"]:
                return "no runs"
            return f"{_fmt(s['mean'])} ± {_fmt(s['std'])} ({s['n']})" if s["n"] > 1 else f"{_fmt(s['mean'])} (1)"

        margin = f" ± {c.margin:g}" if c.kind == "within" else ""
        compared = f"`{c.a.label()}` {sym[c.kind]} `{c.b.label()}`{margin} on {c.metric}"
        ci = "—" if d["ci95"] is None else f"[{_fmt(d['ci95'][0])}, {_fmt(d['ci95'][1])}]"
        diff = _fmt(d["diff"])
        verdict = f"**{v.verdict}**" + ("" if v.verdict not in ("inconclusive", "refused") else f" ({v.reason})")
        wording = c.wording.replace("|", "/") + (f" ({c.source})" if c.source else "")
        if c.note:
            wording += f". *{c.note.replace('|', '/')}*"
        out.append(f"| {c.paper} | {wording} | {compared} | {cell(d['a'])} | {cell(d['b'])} | {diff} {ci} | {verdict} |")
    counts = {k: sum(v.verdict == k for v in verdicts) for k in VERDICTS}
    refused = f", {counts['refused']} refused (mixed protocols)" if counts["refused"] else ""
    out += ["", f"{len(verdicts)} claims: {counts['holds']} hold, {counts['fails']} fail, {counts['inconclusive']} "
            f"inconclusive{refused}. Interval: Welch t (one-sample t against a number), 95%, over seeds; each claim on "
            "its own."]
    used: dict[str, int] = {}
    for v in verdicts:
        if v.protocol is not None:
            used[v.protocol or "(none recorded)"] = used.get(v.protocol or "(none recorded)", 0) + 1
    if used:
        out.append("Each claim compares cells of one evaluation protocol: "
                   + ", ".join(f"`{p}` ({n})" for p, n in sorted(used.items())) + ".")
    return "\n".join(out) + "\n"
