"""Empirical privacy auditing: a lower bound on epsilon from a distinguishing test (Jagielski et al. 2020).

A mechanism M is (eps, delta)-DP only if, for every neighbouring pair (D0, D1) and every test S,
``P[M(D1) in S] <= e^eps P[M(D0) in S] + delta`` (and with D0, D1 swapped). Run M many times on a pair, turn each
output into a score (larger = "looks like D1"), and the test "score > t" has a false-positive rate
``FPR = P[score(M(D0)) > t]`` and a false-negative rate ``FNR = P[score(M(D1)) <= t]``. DP then forces

    eps >= log((1 - delta - FNR) / FPR)   and   eps >= log((1 - delta - FPR) / FNR).

With Clopper-Pearson upper bounds on FPR and FNR (confidence 1 - alpha each), the right-hand side is a lower bound
on the mechanism's true epsilon, valid with probability >= 1 - 2 alpha; a lower bound above the epsilon the ledger
charges is evidence of a bug in the code that adds the noise.

The threshold t must not be chosen on the outputs it is evaluated on (the max over thresholds of an estimate is
biased upwards): :func:`audit_scores` picks t on one half of the trials and bounds the rates on the other half.

Pure numpy/scipy (no torch): the mechanisms themselves are run by :mod:`dpsyn.privacy.audit.mechanisms`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


def clopper_pearson_upper(k: int, n: int, *, alpha: float) -> float:
    """One-sided (1 - alpha) Clopper-Pearson upper bound on a binomial rate from ``k`` successes in ``n`` trials.

    Raises:
        ValueError: n < 1, k outside [0, n], or alpha outside (0, 1).
    """
    from scipy.stats import beta

    if not (isinstance(n, (int, np.integer)) and n >= 1 and 0 <= k <= n):
        raise ValueError(f"need integers 0 <= k <= n, n >= 1; got k={k!r}, n={n!r}")
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"alpha must lie in (0, 1), got {alpha!r}")
    if k == n:
        return 1.0
    return float(beta.ppf(1.0 - alpha, k + 1, n - k))


def epsilon_from_rates(fpr: float, fnr: float, *, delta: float) -> float:
    """The largest epsilon that a test with these error rates proves, at ``delta`` (0 if it proves none)."""
    best = 0.0
    for a, b in ((fpr, fnr), (fnr, fpr)):  # "score > t means D1" and its complement
        num = 1.0 - delta - b
        if num > 0 and a > 0:
            best = max(best, math.log(num / a))
        elif num > 0 and a == 0:
            return math.inf
    return best


def _counts_above(scores0: np.ndarray, scores1: np.ndarray, t: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For each threshold in ``t``: #scores0 > t (false positives) and #scores1 <= t (false negatives)."""
    s0, s1 = np.sort(scores0), np.sort(scores1)
    fp = len(s0) - np.searchsorted(s0, t, side="right")
    fn = np.searchsorted(s1, t, side="right")
    return fp, fn


def _bounded_epsilon(fp: np.ndarray, fn: np.ndarray, n0: int, n1: int, *, delta: float, alpha: float,
                     min_errors: int = 0) -> np.ndarray:
    """Vectorised :func:`epsilon_from_rates` over thresholds, with the rates' Clopper-Pearson upper bounds.

    ``min_errors``: a direction of the test whose rate in the denominator rests on fewer errors is scored 0 (its
    bound is noise there: selecting on it only loses on the other half, and near delta it collapses)."""
    from scipy.stats import beta

    fpr = np.where(fp >= n0, 1.0, beta.ppf(1.0 - alpha, fp + 1, np.maximum(n0 - fp, 1)))
    fnr = np.where(fn >= n1, 1.0, beta.ppf(1.0 - alpha, fn + 1, np.maximum(n1 - fn, 1)))
    with np.errstate(divide="ignore", invalid="ignore"):
        e1 = np.where(1.0 - delta - fnr > 0, np.log(np.maximum(1.0 - delta - fnr, 1e-300) / fpr), 0.0)
        e2 = np.where(1.0 - delta - fpr > 0, np.log(np.maximum(1.0 - delta - fpr, 1e-300) / fnr), 0.0)
    e1 = np.where(fp >= min_errors, e1, 0.0)
    e2 = np.where(fn >= min_errors, e2, 0.0)
    return np.maximum(np.maximum(e1, e2), 0.0)


MIN_ERRORS = 20  # a threshold is selected only where the rate it divides by rests on at least this many errors


@dataclass(frozen=True)
class AuditResult:
    """One audited release: the proven lower bound and how it was obtained."""

    eps_lower: float
    threshold: float
    fpr_upper: float
    fnr_upper: float
    trials: int  # outputs per dataset of the pair and arm (both halves)
    alpha: float
    arm: int = 0  # the neighbouring pair chosen, for scores with several arms


def _as_arms(scores: np.ndarray) -> np.ndarray:
    a = np.asarray(scores, dtype=np.float64)
    return a[None, :] if a.ndim == 1 else a


def audit_scores(scores0: np.ndarray, scores1: np.ndarray, *, delta: float, alpha: float,
                 rng: np.random.Generator, candidates: int = 400) -> AuditResult:
    """Lower-bound epsilon from the scores of outputs on D0 (``scores0``) and on D1 (``scores1``).

    The trials of each side are split at random in two halves: the threshold that maximises the bounded epsilon on
    the first half is then evaluated on the second half, with one-sided Clopper-Pearson bounds at confidence
    ``1 - alpha`` each on FPR and FNR. Candidate thresholds: ``candidates`` quantiles of the first half's pooled
    scores, denser in the tails (where the best tests of a tight mechanism lie), and only where the rate a bound
    divides by rests on at least :data:`MIN_ERRORS` errors of the first half.

    Scores may be 2-d, ``(arms, trials)``: one neighbouring pair per arm (e.g. vote histograms at several distances
    from a threshold, for a mechanism whose output is discrete). The arm is then chosen on the first half too.

    Args:
        scores0: scores of M(D0) (larger = more like D1), (trials,) or (arms, trials).
        scores1: scores of M(D1), the same shape.
        delta: the delta of the claim.
        alpha: the error probability of each of the two Clopper-Pearson bounds.
        rng: randomness of the split (not of the mechanism).
        candidates: number of candidate thresholds per arm.

    Returns:
        The :class:`AuditResult`; its ``eps_lower`` holds with probability >= 1 - 2 alpha.

    Raises:
        ValueError: fewer than 4 scores per arm and side, non-finite scores, or mismatched arms.
    """
    s0, s1 = _as_arms(scores0), _as_arms(scores1)
    if s0.ndim != 2 or s1.ndim != 2 or len(s0) != len(s1):
        raise ValueError(f"scores must be (trials,) or (arms, trials) with as many arms on both sides, got "
                         f"{np.shape(scores0)} and {np.shape(scores1)}")
    if s0.shape[1] < 4 or s1.shape[1] < 4:
        raise ValueError(f"need at least 4 scores per side, got {s0.shape[1]} and {s1.shape[1]}")
    if not (np.all(np.isfinite(s0)) and np.all(np.isfinite(s1))):
        raise ValueError("scores must be finite")
    n0, n1 = s0.shape[1], s1.shape[1]
    p0, p1 = rng.permutation(n0), rng.permutation(n1)
    a0, b0 = s0[:, p0[: n0 // 2]], s0[:, p0[n0 // 2 :]]
    a1, b1 = s1[:, p1[: n1 // 2]], s1[:, p1[n1 // 2 :]]
    tail = np.geomspace(min(0.5, MIN_ERRORS / min(a0.shape[1], a1.shape[1])), 0.5, candidates // 4)
    qs = np.unique(np.concatenate([np.linspace(0.0, 1.0, candidates // 2), tail, 1.0 - tail]))
    best = (-1.0, 0, 0.0)
    for arm in range(len(s0)):
        ts = np.unique(np.quantile(np.concatenate([a0[arm], a1[arm]]), qs))
        fp, fn = _counts_above(a0[arm], a1[arm], ts)
        eps = _bounded_epsilon(fp, fn, a0.shape[1], a1.shape[1], delta=delta, alpha=alpha, min_errors=MIN_ERRORS)
        i = int(np.argmax(eps))
        if eps[i] > best[0]:
            best = (float(eps[i]), arm, float(ts[i]))
    _, arm, t = best
    fp_b, fn_b = _counts_above(b0[arm], b1[arm], np.array([t]))
    fpr = clopper_pearson_upper(int(fp_b[0]), b0.shape[1], alpha=alpha)
    fnr = clopper_pearson_upper(int(fn_b[0]), b1.shape[1], alpha=alpha)
    return AuditResult(eps_lower=epsilon_from_rates(fpr, fnr, delta=delta), threshold=t, fpr_upper=fpr,
                       fnr_upper=fnr, trials=min(n0, n1), alpha=alpha, arm=arm)
