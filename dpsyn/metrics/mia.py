"""Membership inference: privGAN's white-box discriminator attack, black-box nearest-synthetic-sample and Monte-Carlo
attacks.

White-box (Mukherjee et al. 2021, privGAN; the protocol of microsoft/privGAN's ``WBattack``, reconstructed from its
description): the candidate pool is the training set ``X`` (members) plus held-out real data ``X_comp``
(non-members). Each discriminator scores every candidate; with several discriminators (privGAN trains N generator/
discriminator pairs) the per-candidate score is the max or the mean over discriminators. The ``|X|`` top-scored
candidates are predicted members; the attack accuracy is the fraction of them that are members, to be compared with
the random-guess baseline ``|X| / (|X| + |X_comp|)``. We also report the ROC AUC of each aggregated score (0.5 =
chance). Ties in the ranking are broken at random (seeded), so a constant discriminator scores at chance rather than
picking whichever candidates come first.

Black-box (usable on any method's samples): the score of a candidate is minus its L2 distance to the nearest
synthetic sample (on flattened images or on given features). Reported as the ROC AUC of members vs non-members, and
as an empirical epsilon lower bound (:func:`epsilon_lower_bound`): the candidates are split (stratified, seeded) into
a calibration half, on which a threshold is chosen, and a reporting half, on which the threshold's TPR and FPR are
measured and bounded with Clopper-Pearson intervals. The threshold never sees the reporting half.

The epsilon bound (the standard DP-auditing bound at delta = 0, e.g. Jagielski et al. 2020; Nasr et al. 2021): an
eps-DP training procedure forces every membership test to satisfy ``TPR <= e^eps FPR`` and
``1 - FPR <= e^eps (1 - TPR)``, so with a lower confidence bound ``TPR_lo`` on the TPR and an upper bound ``FPR_hi`` on
the FPR (one-sided Clopper-Pearson, each at level ``(1 - confidence) / 2`` so that both hold jointly with probability
``>= confidence``)::

    eps_lb = max(log(TPR_lo / FPR_hi), log((1 - FPR_hi) / (1 - TPR_lo)), 0)

This is a lower bound on the true epsilon *of the training procedure* only when the candidates are chosen as in an
audit: members and non-members drawn from the same distribution, each candidate's membership decided at random
independently before training, and the membership outcomes of the candidates independent trials (strictly: one
canary per training run over many runs; with many candidates in a single run the Clopper-Pearson bound treats
dependent outcomes as independent, see Steinke, Nasr & Jagielski 2023 for a one-run analysis). Computed on a
dataset's fixed train/test split it measures memorisation by the released samples, not a certified bound.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
from scipy import stats
from sklearn.metrics import roc_auc_score
from torch import nn

log = logging.getLogger(__name__)

Scorer = Callable[..., Any]


# ----------------------------------------------------------------------------------------------- candidate pools


def candidate_pool(members: np.ndarray, non_members: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Concatenate members and non-members into one pool.

    Args:
        members: (M, ...) training examples.
        non_members: (K, ...) held-out examples of the same shape.

    Returns:
        ``(candidates, is_member)``: (M + K, ...) and a (M + K,) boolean mask.

    Raises:
        ValueError: if either set is empty or their example shapes differ.
    """
    if len(members) == 0 or len(non_members) == 0:
        raise ValueError(f"need members and non-members, got {len(members)} and {len(non_members)}")
    if members.shape[1:] != non_members.shape[1:]:
        raise ValueError(f"members have shape {members.shape[1:]}, non-members {non_members.shape[1:]}")
    is_member = np.concatenate([np.ones(len(members), bool), np.zeros(len(non_members), bool)])
    return np.concatenate([members, non_members]), is_member


def _check_membership(is_member: np.ndarray, n: int) -> np.ndarray:
    is_member = np.asarray(is_member)
    if is_member.shape != (n,):
        raise ValueError(f"is_member must have shape ({n},), got {is_member.shape}")
    if is_member.dtype != bool:
        if not np.isin(is_member, (0, 1)).all():
            raise ValueError("is_member must be boolean (or 0/1)")
        is_member = is_member.astype(bool)
    if is_member.all() or not is_member.any():
        raise ValueError(f"the pool needs members and non-members, got {int(is_member.sum())} members of {n}")
    return is_member


# ----------------------------------------------------------------------------------------------- white-box attack


@torch.no_grad()
def discriminator_scores(
    discriminators: Sequence[Scorer],
    candidates: np.ndarray,
    *,
    labels: np.ndarray | None = None,
    sigmoid: bool = True,
    batch_size: int = 1024,
) -> np.ndarray:
    """Score every candidate with every discriminator.

    Args:
        discriminators: ``nn.Module``s (called on float32 tensors on the module's device, in eval mode, under
            no_grad; their logits pass through a sigmoid when ``sigmoid``) or other callables (called on numpy
            batches, their output used as is). Each is called as ``d(x)``, or ``d(x, y)`` when ``labels`` is given
            (conditional discriminators such as :class:`~dpsyn.nets.dcgan.CondDCGANDiscriminator`).
        candidates: (N, ...) candidate examples.
        labels: (N,) labels for conditional discriminators, or None.
        sigmoid: map module outputs (logits) to probabilities D(x) in (0, 1); privGAN's mean aggregation averages
            probabilities.
        batch_size: scoring batch size.

    Returns:
        (n_discriminators, N) float64 score matrix (higher = more member-like).

    Raises:
        ValueError: if there is no discriminator, or one returns the wrong number of scores.
    """
    if len(discriminators) == 0:
        raise ValueError("need at least one discriminator")
    if labels is not None and len(labels) != len(candidates):
        raise ValueError(f"{len(labels)} labels for {len(candidates)} candidates")
    rows = []
    for i, d in enumerate(discriminators):
        out = []
        for s in range(0, len(candidates), batch_size):
            xb = candidates[s : s + batch_size]
            yb = None if labels is None else labels[s : s + batch_size]
            if isinstance(d, nn.Module):
                was_training = d.training
                d.eval()
                param = next(d.parameters(), None)
                dev = param.device if param is not None else torch.device("cpu")
                xt = torch.as_tensor(np.ascontiguousarray(xb, dtype=np.float32), device=dev)
                o = d(xt) if yb is None else d(xt, torch.as_tensor(np.asarray(yb, dtype=np.int64), device=dev))
                d.train(was_training)
                out.append((torch.sigmoid(o) if sigmoid else o).double().reshape(-1).cpu().numpy())
            else:
                out.append(np.asarray(d(xb) if yb is None else d(xb, yb), dtype=np.float64).reshape(-1))
        row = np.concatenate(out)
        if row.shape != (len(candidates),):
            raise ValueError(f"discriminator {i} returned {row.shape} scores for {len(candidates)} candidates")
        rows.append(row)
    return np.stack(rows)


def top_k_accuracy(score: np.ndarray, is_member: np.ndarray, *, seed: int = 0) -> float:
    """Fraction of members among the ``|members|`` top-scored candidates (ties broken at random, seeded).

    Args:
        score: (N,) per-candidate score (higher = more member-like).
        is_member: (N,) boolean membership.
        seed: seed of the random tie-breaking order.

    Returns:
        The attack accuracy (the precision of the predicted member set).
    """
    k = int(is_member.sum())
    order = np.random.default_rng(seed).permutation(len(score))
    ranked = order[np.argsort(-score[order], kind="stable")]
    return float(is_member[ranked[:k]].mean())


def whitebox_mia(
    scores: np.ndarray | Sequence[Scorer],
    is_member: np.ndarray,
    *,
    candidates: np.ndarray | None = None,
    labels: np.ndarray | None = None,
    sigmoid: bool = True,
    seed: int = 0,
    batch_size: int = 1024,
) -> dict[str, Any]:
    """privGAN's white-box attack: top-|members| discriminator scores are predicted members.

    Args:
        scores: a precomputed (n_discriminators, n_candidates) score matrix (a 1-D array is one discriminator), or
            a sequence of discriminators (see :func:`discriminator_scores`; then ``candidates`` is required).
        is_member: (n_candidates,) boolean membership of each candidate.
        candidates: the candidate pool (members + non-members), when ``scores`` are discriminators.
        labels: candidate labels for conditional discriminators.
        sigmoid: see :func:`discriminator_scores`.
        seed: seed of the tie-breaking order.
        batch_size: scoring batch size.

    Returns:
        ``acc_max``/``acc_mean`` (attack accuracy with max/mean aggregation over discriminators), ``auc_max``/
        ``auc_mean`` (ROC AUC of the aggregated scores), ``baseline`` (random guess: ``|members| / |pool|``),
        ``n_members``, ``n_candidates``, ``n_discriminators``.

    Raises:
        ValueError: for a malformed score matrix, non-finite scores, a pool without members or non-members, or
            discriminators without candidates.
    """
    if isinstance(scores, np.ndarray) or (isinstance(scores, Sequence) and len(scores) and not callable(scores[0])):
        matrix = np.asarray(scores, dtype=np.float64)
        if matrix.ndim == 1:
            matrix = matrix[None]
        if matrix.ndim != 2:
            raise ValueError(f"score matrix must be (n_discriminators, n_candidates), got shape {matrix.shape}")
    else:
        if candidates is None:
            raise ValueError("pass the candidate pool (`candidates`) to score with discriminators")
        matrix = discriminator_scores(scores, candidates, labels=labels, sigmoid=sigmoid, batch_size=batch_size)
    if not np.isfinite(matrix).all():
        raise ValueError("discriminator scores contain NaN or infinite values")
    is_member = _check_membership(is_member, matrix.shape[1])
    out: dict[str, Any] = {}
    for agg, fn in (("max", np.max), ("mean", np.mean)):
        s = fn(matrix, axis=0)
        out[f"acc_{agg}"] = top_k_accuracy(s, is_member, seed=seed)
        out[f"auc_{agg}"] = float(roc_auc_score(is_member, s))
    out.update(
        baseline=float(is_member.mean()),
        n_members=int(is_member.sum()),
        n_candidates=int(len(is_member)),
        n_discriminators=int(matrix.shape[0]),
    )
    log.info("white-box MIA: acc max %.4f mean %.4f (baseline %.4f), AUC max %.4f mean %.4f",
             out["acc_max"], out["acc_mean"], out["baseline"], out["auc_max"], out["auc_mean"])
    return out


# ----------------------------------------------------------------------------------------------- black-box attack


def _as_rows(x: np.ndarray, features: Callable[[np.ndarray], np.ndarray] | None) -> np.ndarray:
    rows = np.asarray(features(x) if features is not None else x)
    return rows.reshape(len(rows), -1)


@torch.no_grad()
def nearest_synthetic_distance(
    candidates: np.ndarray,
    synthetic: np.ndarray,
    *,
    features: Callable[[np.ndarray], np.ndarray] | None = None,
    chunk_size: int = 2048,
    device: str | torch.device | None = None,
) -> np.ndarray:
    """L2 distance of each candidate to its nearest synthetic sample (``torch.cdist`` in chunks, float32).

    Args:
        candidates: (N, ...) candidates.
        synthetic: (S, ...) synthetic samples.
        features: optional map applied to both sets before the distance (else the examples are flattened).
        chunk_size: rows per chunk on each side (memory ~ chunk_size^2 floats).
        device: where to compute (default: the CPU).

    Returns:
        (N,) float64 distances.

    Raises:
        ValueError: for empty sets or mismatched dimensions.
    """
    a, b = _as_rows(candidates, features), _as_rows(synthetic, features)
    if len(a) == 0 or len(b) == 0:
        raise ValueError(f"need candidates and synthetic samples, got {len(a)} and {len(b)}")
    if a.shape[1] != b.shape[1]:
        raise ValueError(f"candidates have {a.shape[1]} dimensions, synthetic samples {b.shape[1]}")
    dev = torch.device(device) if device is not None else torch.device("cpu")
    bt = [torch.as_tensor(np.ascontiguousarray(b[j : j + chunk_size], dtype=np.float32), device=dev)
          for j in range(0, len(b), chunk_size)]
    out = np.empty(len(a), dtype=np.float64)
    for i in range(0, len(a), chunk_size):
        at = torch.as_tensor(np.ascontiguousarray(a[i : i + chunk_size], dtype=np.float32), device=dev)
        best = torch.full((len(at),), float("inf"), device=dev)
        for chunk in bt:
            best = torch.minimum(best, torch.cdist(at, chunk).min(dim=1).values)
        out[i : i + len(at)] = best.double().cpu().numpy()
    return out


def clopper_pearson(k: np.ndarray | int, n: np.ndarray | int, alpha: float) -> tuple[np.ndarray, np.ndarray]:
    """One-sided Clopper-Pearson bounds of a binomial proportion, each at level ``alpha``.

    Args:
        k: successes.
        n: trials (> 0).
        alpha: the probability that the true proportion lies below ``lower`` (and, separately, above ``upper``).

    Returns:
        ``(lower, upper)``: ``lower = Beta^{-1}(alpha; k, n - k + 1)`` (0 when k = 0) and
        ``upper = Beta^{-1}(1 - alpha; k + 1, n - k)`` (1 when k = n).

    Raises:
        ValueError: if ``alpha`` is not in (0, 1) or the counts are invalid.
    """
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"alpha must be in (0, 1), got {alpha}")
    k, n = np.asarray(k, dtype=np.float64), np.asarray(n, dtype=np.float64)
    if (n <= 0).any() or (k < 0).any() or (k > n).any():
        raise ValueError("Clopper-Pearson needs 0 <= k <= n and n > 0")
    with np.errstate(invalid="ignore", divide="ignore"):
        lower = np.where(k > 0, stats.beta.ppf(alpha, np.maximum(k, 1e-300), n - k + 1), 0.0)
        upper = np.where(k < n, stats.beta.ppf(1 - alpha, k + 1, np.maximum(n - k, 1e-300)), 1.0)
    return lower, upper


def epsilon_from_rates(tpr_lo: np.ndarray | float, fpr_hi: np.ndarray | float) -> np.ndarray:
    """``max(log(TPR_lo / FPR_hi), log((1 - FPR_hi) / (1 - TPR_lo)), 0)``: the delta = 0 auditing bound.

    Args:
        tpr_lo: lower confidence bound(s) on the true positive rate.
        fpr_hi: upper confidence bound(s) on the false positive rate.

    Returns:
        The epsilon lower bound(s), >= 0.
    """
    tpr_lo, fpr_hi = np.asarray(tpr_lo, dtype=np.float64), np.asarray(fpr_hi, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        e1 = np.where((tpr_lo > 0) & (fpr_hi > 0), np.log(tpr_lo / fpr_hi), -np.inf)
        e2 = np.where((1 - fpr_hi > 0) & (1 - tpr_lo > 0), np.log((1 - fpr_hi) / (1 - tpr_lo)), -np.inf)
    return np.maximum(np.maximum(e1, e2), 0.0)


def _rates_at_thresholds(
    score: np.ndarray, is_member: np.ndarray, thresholds: np.ndarray
) -> tuple[np.ndarray, np.ndarray, int, int]:
    """Counts ``(tp, fp, n_pos, n_neg)`` of the rule "member iff score >= t" for each threshold t."""
    pos, neg = np.sort(score[is_member]), np.sort(score[~is_member])
    tp = len(pos) - np.searchsorted(pos, thresholds, side="left")
    fp = len(neg) - np.searchsorted(neg, thresholds, side="left")
    return tp, fp, len(pos), len(neg)


def _select_threshold(score: np.ndarray, is_member: np.ndarray, alpha: float) -> float:
    """The threshold maximising the epsilon bound *on the calibration candidates given here*.

    Maximising the Clopper-Pearson bound (not the raw ratio) favours thresholds backed by enough candidates.
    """
    thresholds = np.unique(score)
    tp, fp, n_pos, n_neg = _rates_at_thresholds(score, is_member, thresholds)
    tpr_lo, _ = clopper_pearson(tp, n_pos, alpha)
    _, fpr_hi = clopper_pearson(fp, n_neg, alpha)
    eps = epsilon_from_rates(tpr_lo, fpr_hi)
    return float(thresholds[int(np.argmax(eps))])


def split_calibration(is_member: np.ndarray, *, fraction: float = 0.5, seed: int = 0) -> np.ndarray:
    """A stratified random calibration mask: ``fraction`` of the members and of the non-members (at least one each).

    Args:
        is_member: (N,) boolean membership.
        fraction: share of each group put in the calibration half, in (0, 1).
        seed: seed of the split.

    Returns:
        (N,) boolean mask, True for calibration candidates.

    Raises:
        ValueError: if ``fraction`` is not in (0, 1) or a group has fewer than two candidates.
    """
    if not 0.0 < fraction < 1.0:
        raise ValueError(f"calibration fraction must be in (0, 1), got {fraction}")
    rng = np.random.default_rng(seed)
    mask = np.zeros(len(is_member), dtype=bool)
    for group in (np.flatnonzero(is_member), np.flatnonzero(~is_member)):
        if len(group) < 2:
            raise ValueError("each of members and non-members needs >= 2 candidates to split calibration/report")
        n_cal = min(max(1, int(round(len(group) * fraction))), len(group) - 1)
        mask[rng.permutation(group)[:n_cal]] = True
    return mask


def epsilon_lower_bound(
    score: np.ndarray,
    is_member: np.ndarray,
    *,
    confidence: float = 0.95,
    calibration: np.ndarray | None = None,
    calibration_fraction: float = 0.5,
    seed: int = 0,
) -> dict[str, Any]:
    """Empirical epsilon lower bound of a membership score (see the module docstring for what it bounds).

    The threshold of the rule "member iff score >= t" is chosen on the calibration candidates only; TPR and FPR are
    counted on the other (reporting) candidates, and bounded with one-sided Clopper-Pearson intervals at level
    ``(1 - confidence) / 2`` each.

    Args:
        score: (N,) membership score (higher = more member-like).
        is_member: (N,) boolean membership.
        confidence: joint confidence of the two rate bounds (e.g. 0.95).
        calibration: (N,) boolean mask of the calibration candidates; default a stratified random split.
        calibration_fraction: calibration share when ``calibration`` is not given.
        seed: seed of the random split.

    Returns:
        ``eps_lb``, ``confidence``, ``threshold``, ``tpr``/``fpr`` (on the reporting half), ``tpr_lo``/``fpr_hi``,
        ``n_calibration``, ``n_report``.

    Raises:
        ValueError: for a bad confidence, mask, or pool.
    """
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    score = np.asarray(score, dtype=np.float64)
    if score.ndim != 1 or not np.isfinite(score).all():
        raise ValueError("score must be a finite 1-D array")
    is_member = _check_membership(is_member, len(score))
    if calibration is None:
        calibration = split_calibration(is_member, fraction=calibration_fraction, seed=seed)
    calibration = np.asarray(calibration, dtype=bool)
    if calibration.shape != score.shape:
        raise ValueError(f"calibration mask must have shape {score.shape}, got {calibration.shape}")
    report = ~calibration
    for part, name in ((calibration, "calibration"), (report, "reporting")):
        if not (is_member[part].any() and (~is_member[part]).any()):
            raise ValueError(f"the {name} half needs members and non-members")
    alpha = (1.0 - confidence) / 2.0  # Bonferroni: TPR and FPR bounds hold jointly with probability >= confidence
    threshold = _select_threshold(score[calibration], is_member[calibration], alpha)
    tp, fp, n_pos, n_neg = _rates_at_thresholds(score[report], is_member[report], np.array([threshold]))
    tpr_lo, _ = clopper_pearson(tp, n_pos, alpha)
    _, fpr_hi = clopper_pearson(fp, n_neg, alpha)
    eps = float(epsilon_from_rates(tpr_lo, fpr_hi)[0])
    return {
        "eps_lb": eps,
        "confidence": float(confidence),
        "threshold": threshold,
        "tpr": float(tp[0] / n_pos),
        "fpr": float(fp[0] / n_neg),
        "tpr_lo": float(tpr_lo[0]),
        "fpr_hi": float(fpr_hi[0]),
        "n_calibration": int(calibration.sum()),
        "n_report": int(report.sum()),
    }


def distance_mia(
    candidates: np.ndarray,
    is_member: np.ndarray,
    synthetic: np.ndarray,
    *,
    features: Callable[[np.ndarray], np.ndarray] | None = None,
    confidence: float = 0.95,
    calibration_fraction: float = 0.5,
    seed: int = 0,
    chunk_size: int = 2048,
    device: str | torch.device | None = None,
) -> dict[str, Any]:
    """Black-box attack: score = -(distance to the nearest synthetic sample); AUC and an epsilon lower bound.

    Args:
        candidates: (N, ...) members + non-members (see :func:`candidate_pool`).
        is_member: (N,) boolean membership.
        synthetic: (S, ...) the method's released samples.
        features: optional feature map applied to candidates and samples (default: flattened pixels/rows).
        confidence: confidence of the epsilon lower bound.
        calibration_fraction: share of the candidates used to choose the threshold.
        seed: seed of the calibration/reporting split.
        chunk_size: distance chunk size.
        device: where to compute distances.

    Returns:
        ``auc`` (all candidates; threshold-free), the keys of :func:`epsilon_lower_bound` (``eps_lb``,
        ``confidence``, ``threshold``, ``tpr``, ``fpr``, ``tpr_lo``, ``fpr_hi``, ``n_calibration``, ``n_report``),
        ``n_members``, ``n_non_members``, ``n_synthetic``, ``mean_distance_members``,
        ``mean_distance_non_members``.

    Raises:
        ValueError: for empty or mismatched inputs.
    """
    is_member = _check_membership(is_member, len(candidates))
    dist = nearest_synthetic_distance(candidates, synthetic, features=features, chunk_size=chunk_size, device=device)
    score = -dist
    out: dict[str, Any] = {"auc": float(roc_auc_score(is_member, score))}
    out.update(epsilon_lower_bound(score, is_member, confidence=confidence,
                                   calibration_fraction=calibration_fraction, seed=seed))
    out.update(
        n_members=int(is_member.sum()),
        n_non_members=int((~is_member).sum()),
        n_synthetic=int(len(synthetic)),
        mean_distance_members=float(dist[is_member].mean()),
        mean_distance_non_members=float(dist[~is_member].mean()),
    )
    log.info("distance MIA: AUC %.4f, eps lower bound %.3f at %.0f%% confidence",
             out["auc"], out["eps_lb"], 100 * confidence)
    return out


# ----------------------------------------------------------------------------------------------- Monte-Carlo attack


@torch.no_grad()
def monte_carlo_mia(
    candidates: np.ndarray,
    is_member: np.ndarray,
    synthetic: np.ndarray,
    *,
    n_components: int = 40,
    percentile: float | None = None,
    seed: int = 0,
    chunk_size: int = 2048,
) -> dict[str, Any]:
    """The Monte-Carlo attack of Hilprecht et al. (2019), used against privGAN: a candidate's score is the share of
    released samples that fall in an eps-ball around it; the ``|members|`` top-scored candidates are predicted members
    (the white-box attack's decision rule, ties broken at random).

    Distances are Euclidean in a PCA space fitted on the *synthetic* samples only (the attacker's data; Hilprecht et
    al. use PCA for MNIST). The ball radius follows one of their two heuristics: by default the median over
    candidates of the distance to the nearest sample (median heuristic), or with ``percentile`` the ``percentile``-th
    percentile of all candidate-to-sample distances (percentile heuristic; it needs the leak to cover at least that
    share of all pairs, so it is the more fragile of the two).

    Args:
        candidates: (N, ...) members + non-members.
        is_member: (N,) boolean membership.
        synthetic: (S, ...) the released samples.
        n_components: PCA dimensions (capped by the data).
        percentile: None (median heuristic) or the radius percentile in (0, 100).
        seed: PCA solver seed and tie-breaking order.
        chunk_size: candidates per distance chunk.

    Returns:
        ``acc`` (attack accuracy), ``auc``, ``baseline`` (``|members| / N``), ``eps_ball``, ``radius`` (which
        heuristic), ``n_components``, ``n_synthetic``.

    Raises:
        ValueError: for empty inputs or a percentile outside (0, 100).
    """
    from sklearn.decomposition import PCA

    if percentile is not None and not 0 < percentile < 100:
        raise ValueError(f"percentile={percentile}: must be in (0, 100)")
    is_member = _check_membership(is_member, len(candidates))
    a, b = _as_rows(candidates, None), _as_rows(synthetic, None)
    if len(b) < 2:
        raise ValueError(f"need at least 2 synthetic samples, got {len(b)}")
    k = max(1, min(int(n_components), a.shape[1], len(b) - 1))
    pca = PCA(n_components=k, random_state=seed).fit(b)
    at = torch.as_tensor(pca.transform(a), dtype=torch.float32)
    bt = torch.as_tensor(pca.transform(b), dtype=torch.float32)
    dist = torch.cat([torch.cdist(at[i : i + chunk_size], bt) for i in range(0, len(at), chunk_size)])
    if percentile is None:
        eps_ball = float(dist.min(dim=1).values.median())
        radius = "median of the candidates' nearest-sample distances"
    else:  # kthvalue: an exact percentile without sorting a copy of the N x S matrix
        flat = dist.flatten()
        eps_ball = float(flat.kthvalue(max(1, int(np.ceil(percentile / 100 * flat.numel())))).values)
        radius = f"{percentile:g}th percentile of the candidate-sample distances"
    score = (dist <= eps_ball).double().mean(dim=1).numpy()
    out = {
        "acc": top_k_accuracy(score, is_member, seed=seed),
        "auc": float(roc_auc_score(is_member, score)),
        "baseline": float(is_member.mean()),
        "eps_ball": eps_ball,
        "radius": radius,
        "n_components": int(k),
        "n_synthetic": int(len(b)),
    }
    log.info("Monte-Carlo MIA: acc %.4f (baseline %.4f), AUC %.4f", out["acc"], out["baseline"], out["auc"])
    return out
