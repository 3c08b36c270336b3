"""``dp_mge``: DP-MGE, the DP Mean-and-Gaussian Estimator of paper 000 (Wu et al. 2023, Sec. 3.1).

The private feature distribution is modelled as ``N(mu, diag(s - mu^2))`` in the space of a public encoder h:

1. ``v_i = h(x_i)``, clipped to the unit ball (``||v_i|| <= 1``);
2. two Gaussian-mechanism releases, each of a sum with L2 sensitivity 1 (``||v|| <= 1`` implies ``||v^2|| <= 1``)::

       mu = (sum_i v_i   + N(0, sigma_1^2 I)) / n
       s  = (sum_i v_i^2 + N(0, sigma_2^2 I)) / n          (v^2 elementwise)

3. ``var = max(s - mu^2, 0)`` (the dimensions clamped at 0 are counted);
4. sampling: ``v ~ N(mu, diag(var))``, decoded by the public instance-conditioned generator g (which projects ``v``
   onto the unit sphere first). Steps 3-4 are post-processing.

Budget (``calibration``):

* ``classic`` (paper 000): each release gets its share of (eps, delta) — by default (eps/2, delta/2) each — and its
  sigma from the paper's formula ``(sqrt(2 log(1/delta) + 2 eps) + sqrt(2 log(1/delta))) / (2 eps)``. The ledger
  records one approximate-DP event per release and composes them by basic composition (the paper's Claim 1, whose
  proof we could not read: this is our reconstruction of it).
* ``analytic``: one joint calibration. Gaussian releases of sensitivity 1 with noise ``sigma_k`` compose exactly to
  ``mu``-GDP with ``mu^2 = sum_k 1/sigma_k^2``; sigma is the Balle-Wang analytic noise for the whole (eps, delta),
  and release k with budget share ``f_k`` gets ``sigma_k = sigma / sqrt(f_k)``. The ledger records Gaussian events
  and composes them exactly. Less noise than ``classic`` for the same budget.

Counts. Sensitivity 1 of a sum holds for add/remove-one neighbours, under which the counts are themselves private.
The total ``n`` is treated as public, as the paper does when it divides by ``n`` (and as every DP-SGD method here
does in its sample rate ``q = batch / n``); the ledger labels say so. The per-class counts of the class-conditional
option reveal the label histogram, so ``class_counts: dp`` (default) releases them with a third Gaussian release of
sensitivity 1 taking ``count_share`` of the budget; ``class_counts: public`` declares them known (ledger label).

Class-conditional option (``conditional: true``): the sums are taken per class. Each record lies in one class, so the
concatenated per-class sums still have L2 sensitivity 1 (parallel composition): the same sigmas, the same ledger
events, one Gaussian per class. Unconditional samples are labelled with the private class whose *public* centroid in
feature space is nearest (public data only; see :mod:`dpsyn.methods.public_baselines`).

Reported (provenance and report()): the sigmas and budget shares and the clamped variance dimensions
(post-processing of the DP estimates). How many private rows needed clipping is not counted anywhere: it is read off
the private data without noise (0 for encoders that normalise their output, like the embedded one and ResNet-50/SwAV,
a private count with any other); see docs/published-fields.md.

DP noise comes from :func:`dpsyn.privacy.dp_numpy_generator` (OS entropy unless ``privacy.deterministic_noise``);
the sampling of features and of the generator's z follows the run seed. This is a reconstruction from the paper's
text (its appendix and code were not available), not a port of the authors' code.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from typing import Any

import numpy as np

from dpsyn.data.base import Split
from dpsyn.methods.base import METHODS, Method, PrivacyBudget, RunContext, Samples
from dpsyn.methods.public_baselines import (
    centroid_labels,
    decode_seeded,
    private_label_map,
    public_class_names,
)
from dpsyn.privacy import (
    CALIBRATIONS,
    ApproxDPEvent,
    CalibratedRelease,
    GaussianEvent,
    NonPrivateEvent,
    PrivacyEvent,
    PrivacyLedger,
    dp_numpy_generator,
    calibrate_releases,
    gaussian_mechanism,
)
from dpsyn.methods.tiny import SHOES
from dpsyn.config.schema import CLASS_COUNTS

log = logging.getLogger(__name__)

"""Allowed values of ``method.class_counts``."""

RELEASES: tuple[str, ...] = ("mean", "second_moment", "counts")
"""The Gaussian releases DP-MGE can make, in the order they are recorded."""


# ----------------------------------------------------------------------------------------------------------------
# calibration (pure)


@dataclass(frozen=True)
class GaussianRelease(CalibratedRelease):
    """One sensitivity-1 Gaussian release of DP-MGE (:class:`dpsyn.privacy.CalibratedRelease`: ``name`` is ``"mean"``
    (sum of v), ``"second_moment"`` (sum of v^2) or ``"counts"``; ``sigma`` is the noise multiplier, the sensitivity
    being 1), with the ledger event that records it."""

    def event(self, what: str) -> PrivacyEvent:
        """The ledger event of this release; ``what`` says what was released."""
        if self.calibration == "classic":
            if self.epsilon is None or self.delta is None:
                raise ValueError(f"a classic release needs its own (epsilon, delta), got {self!r}")
            return ApproxDPEvent(
                epsilon=self.epsilon, delta=self.delta,
                label=f"dp_mge {what}: Gaussian sigma={self.sigma:.6g}, classic calibration (paper 000) to "
                      f"({self.epsilon:.6g}, {self.delta:.3g}) = share {self.share:.4g} of the budget",
            )
        return GaussianEvent(
            noise_multiplier=self.sigma, count=1,
            label=f"dp_mge {what}: Gaussian sigma={self.sigma:.6g}, share {self.share:.4g} of the joint analytic "
                  f"(GDP) budget",
        )


def plan_releases(
    *, epsilon: float, delta: float, calibration: str = "classic", mean_share: float = 0.5, count_share: float = 0.0
) -> dict[str, GaussianRelease]:
    """Split an (eps, delta) budget between DP-MGE's Gaussian releases and calibrate each one's sigma.

    Shares: ``counts`` gets ``count_share`` (0: no count release), ``mean`` ``(1 - count_share) * mean_share`` and
    ``second_moment`` the rest. ``classic``: release k is ``(share_k eps, share_k delta)``-DP with the paper's sigma
    (basic composition adds up to at most (eps, delta)). ``analytic``: sigma = Balle-Wang noise for (eps, delta) at
    sensitivity 1 and ``sigma_k = sigma / sqrt(share_k)``, so that the releases compose (GDP) to exactly that noise.
    Both are :func:`dpsyn.privacy.calibrate_releases` (composition "basic" and "gdp").

    Args:
        epsilon: the total budget, finite and > 0.
        delta: the total delta in (0, 1).
        calibration: ``"classic"`` or ``"analytic"``.
        mean_share: the mean's share of what the counts leave, in (0, 1).
        count_share: the counts' share, in [0, 1).

    Returns:
        ``{name: GaussianRelease}`` for ``mean``, ``second_moment`` and, when ``count_share > 0``, ``counts``.

    Raises:
        ValueError: on an unknown calibration or shares outside their ranges.
    """
    if calibration not in CALIBRATIONS:
        raise ValueError(f"method.calibration={calibration!r}; allowed: {', '.join(CALIBRATIONS)}")
    if not 0.0 < float(mean_share) < 1.0:
        raise ValueError(f"method.mean_share={mean_share!r}: must lie in (0, 1)")
    if not 0.0 <= float(count_share) < 1.0:
        raise ValueError(f"method.count_share={count_share!r}: must lie in [0, 1)")
    rest = 1.0 - float(count_share)
    shares = {"mean": rest * float(mean_share), "second_moment": rest * (1.0 - float(mean_share))}
    if count_share > 0:
        shares["counts"] = float(count_share)
    plan = calibrate_releases(epsilon=epsilon, delta=delta, fractions=shares, calibration=calibration,
                              composition="gdp" if calibration == "analytic" else "basic")
    return {k: GaussianRelease(**dataclasses.asdict(r)) for k, r in plan.items()}


# ----------------------------------------------------------------------------------------------------------------
# estimation (pure)


@dataclass
class MomentEstimate:
    """DP (or exact) per-class moments of the features.

    Attributes:
        mean: (C, d) estimated means.
        second: (C, d) estimated second moments (elementwise).
        var: (C, d) ``max(second - mean^2, 0)``.
        counts: (C,) the counts divided by (noisy and floored at ``min_count`` when released with DP).
        clamped_dims: how many of the C*d variances were negative and clamped to 0.
    """

    mean: np.ndarray
    second: np.ndarray
    var: np.ndarray
    counts: np.ndarray
    clamped_dims: int


def dp_moments(
    feats: np.ndarray,
    labels: np.ndarray,
    num_classes: int,
    *,
    sigma_mean: float | None,
    sigma_second: float | None,
    sigma_counts: float | None,
    rng: np.random.Generator | None,
    min_count: float = 1.0,
) -> MomentEstimate:
    """Per-class Gaussian-mechanism estimates of the mean and second moment of unit-ball features.

    Args:
        feats: (n, d) features, every row of norm <= 1 (the caller clips; the sensitivity rests on it).
        labels: (n,) classes in 0..num_classes-1 (all zeros for the unconditional estimator).
        num_classes: C.
        sigma_mean, sigma_second: noise std added to every coordinate of the (C, d) sums of v and of v^2
            (None: no noise, the eps=inf estimator).
        sigma_counts: noise std added to the (C,) counts (None: the counts are used exactly, i.e. public).
        rng: the DP-noise generator (required when any sigma is given).
        min_count: floor of a noisy count (a count is never below 1).

    Returns:
        The :class:`MomentEstimate`.

    Raises:
        ValueError: if a row's norm exceeds 1 or labels are out of range.
    """
    v = np.asarray(feats, dtype=np.float64)
    y = np.asarray(labels, dtype=np.int64)
    if v.ndim != 2 or len(v) != len(y):
        raise ValueError(f"feats must be (n, d) with n = len(labels), got {v.shape} and {y.shape}")
    if len(v) and float(np.max(np.linalg.norm(v, axis=1))) > 1.0:
        raise ValueError("feature rows must have norm <= 1 (clip them first): the sensitivity of the sums rests on it")
    if len(y) and (y.min() < 0 or y.max() >= num_classes):
        raise ValueError(f"labels must lie in 0..{num_classes - 1}")
    d = v.shape[1]
    s1 = np.zeros((num_classes, d))
    s2 = np.zeros((num_classes, d))
    np.add.at(s1, y, v)
    np.add.at(s2, y, v * v)
    counts = np.bincount(y, minlength=num_classes).astype(np.float64)
    if sigma_mean is not None or sigma_second is not None or sigma_counts is not None:
        if rng is None:
            raise ValueError("a DP-noise generator is needed to add noise")
    if sigma_mean is not None:
        s1 = gaussian_mechanism(s1, sigma_mean, generator=rng)
    if sigma_second is not None:
        s2 = gaussian_mechanism(s2, sigma_second, generator=rng)
    if sigma_counts is not None:
        counts = np.maximum(gaussian_mechanism(counts, sigma_counts, generator=rng), min_count)
    else:
        counts = np.maximum(counts, min_count)  # an empty class: sums of 0 (plus noise) over 1
    mean = s1 / counts[:, None]
    second = s2 / counts[:, None]
    raw_var = second - mean * mean
    clamped = int(np.sum(raw_var < 0))
    return MomentEstimate(mean=mean, second=second, var=np.maximum(raw_var, 0.0), counts=counts, clamped_dims=clamped)


def sample_features(est: MomentEstimate, labels: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """``v ~ N(mean[c], diag(var[c]))`` for each label c (post-processing), float32 (n, d)."""
    labels = np.asarray(labels, dtype=np.int64)
    z = rng.standard_normal((len(labels), est.mean.shape[1]))
    return (est.mean[labels] + np.sqrt(est.var[labels]) * z).astype(np.float32)


# ----------------------------------------------------------------------------------------------------------------
# the method


@METHODS.register("dp_mge")
class DPMGE(Method):
    """DP-MGE on images (see the module docstring)."""

    # Gaussian releases: the shares of the budget and which releases are made
    accounting_keys = ("calibration", "mean_share", "conditional", "class_counts", "count_share")
    tiny = ("method=dp_mge", *SHOES)

    needs_public = True
    kinds = ("image",)
    fitted_attrs = ("models", "releases", "est", "label_rule", "centroids")

    def __init__(self, cfg: Any, ctx: RunContext) -> None:
        super().__init__(cfg, ctx)
        self.calibration = str(cfg.calibration)  # checked at compose time (dpsyn.config.schema.DPMGESchema)
        self.class_counts = str(cfg.class_counts)
        self.conditional = bool(cfg.get("conditional", False))
        self.mean_share = float(cfg.get("mean_share", 0.5))
        # only the class-conditional option releases counts (n itself is public, see the module docstring)
        dp_counts = self.conditional and self.class_counts == "dp"
        self.count_share = float(cfg.get("count_share", 0.05)) if dp_counts else 0.0
        # fail on bad shares now, before any work
        plan_releases(epsilon=1.0, delta=1e-5, calibration=self.calibration, mean_share=self.mean_share,
                      count_share=self.count_share)

    def fit(
        self, private: Split, budget: PrivacyBudget, ledger: PrivacyLedger, public: Split | None = None
    ) -> None:
        from dpsyn.public import clip_to_unit_ball

        ctx = self.ctx
        self.models = self.public_models()
        # how many rows needed clipping is a private count (no noise): neither kept nor logged
        feats, _ = clip_to_unit_ball(np.asarray(self.models.encode(private.x), dtype=np.float32))
        num_classes = ctx.num_classes if self.conditional else 1
        labels = np.asarray(private.y, dtype=np.int64) if self.conditional else np.zeros(len(feats), dtype=np.int64)
        what_counts = "per-class counts" if self.conditional else "n"
        scope = "per class (disjoint sums: parallel composition)" if self.conditional else "all private rows"

        if budget.private:
            self.releases = plan_releases(epsilon=budget.epsilon, delta=budget.delta, calibration=self.calibration,
                                          mean_share=self.mean_share, count_share=self.count_share)
            rng = dp_numpy_generator(deterministic=ctx.deterministic_noise, seed=ctx.seed)
            counts_rel = self.releases.get("counts")
            self.est = dp_moments(
                feats, labels, num_classes, sigma_mean=self.releases["mean"].sigma,
                sigma_second=self.releases["second_moment"].sigma,
                sigma_counts=counts_rel.sigma if counts_rel is not None else None, rng=rng,
            )
            counts_note = (f"{what_counts} released with DP" if counts_rel is not None
                           else f"{what_counts} treated as public (paper 000's convention)" if not self.conditional
                           else f"{what_counts} declared public (class_counts=public; not protected)")
            ledger.add(self.releases["mean"].event(f"sum of features, {scope}; {counts_note}"))
            ledger.add(self.releases["second_moment"].event(f"sum of squared features, {scope}; {counts_note}"))
            if counts_rel is not None:
                ledger.add(counts_rel.event(f"{what_counts} (sensitivity 1)"))
        else:
            self.releases = {}
            self.est = dp_moments(feats, labels, num_classes, sigma_mean=None, sigma_second=None,
                                  sigma_counts=None, rng=None)
            ledger.add(NonPrivateEvent(label="dp_mge at eps=inf: exact feature moments, no noise"))
        if self.est.clamped_dims:
            log.info("dp_mge: %d of %d variances were negative and clamped to 0", self.est.clamped_dims,
                     self.est.var.size)

        self.label_rule = "the Gaussian's class" if self.conditional else "uniform"
        self.centroids: tuple[np.ndarray, np.ndarray] | None = None
        if not self.conditional and public is not None:
            # Label unconditional samples by the nearest public class centroid (public rows of the private classes
            # only are encoded; no private data involved).
            names, source = public_class_names(ctx, self.models, public)
            mapping = private_label_map(names, list(ctx.classes))
            mapped = mapping[public.y] if len(mapping) else np.full(len(public), -1)
            rows = np.flatnonzero(mapped >= 0)
            if len(rows):
                self.centroids = (np.asarray(self.models.encode(public.x[rows]), dtype=np.float32), mapped[rows])
                self.label_rule = f"nearest public class centroid (public class names from {source})"
            else:
                log.warning("dp_mge: no public class matches a private class: unconditional labels are uniform")

    # ---- sampling (post-processing) ----------------------------------------------------------------------------

    def sample(self, n: int, labels: np.ndarray | None = None) -> Samples:
        rng = np.random.default_rng(self.ctx.seed)
        if self.conditional:
            y = self.uniform_labels(n, rng) if labels is None else np.asarray(labels, dtype=np.int64)
            feats = sample_features(self.est, y, rng)
        else:
            if labels is not None:
                raise ValueError("dp_mge with conditional=false cannot sample given labels; "
                                 "set method.conditional=true")
            feats = sample_features(self.est, np.zeros(n, dtype=np.int64), rng)
            if self.centroids is not None:
                y, _ = centroid_labels(feats, self.centroids[0], self.centroids[1], self.ctx.num_classes)
            else:
                y = self.uniform_labels(n, rng)
        x = decode_seeded(self.models, feats, self.ctx.seed)
        return Samples(x, y, {"method": "dp_mge", "labels": self.label_rule, **self._summary()})

    def _summary(self) -> dict[str, Any]:
        """Calibration, sigmas and budget split, clamped dimensions (JSON-serialisable)."""
        out: dict[str, Any] = {
            "calibration": self.calibration if self.releases else "none (eps=inf)",
            "conditional": self.conditional,
            "counts": ("per-class, " + self.class_counts) if self.conditional else "n, public",
            "clamped_dims": int(self.est.clamped_dims),
            "variance_entries": int(self.est.var.size),
        }
        for name, r in self.releases.items():
            out[f"sigma_{name}"] = r.sigma
            out[f"share_{name}"] = r.share
            if r.epsilon is not None:
                out[f"budget_{name}"] = [r.epsilon, r.delta]
        return out

    def report(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """sigma of each release, clamped variance dimensions."""
        summary = self._summary()
        values: dict[str, Any] = {"mge_clamped_dims": summary["clamped_dims"]}
        for name in RELEASES:
            if f"sigma_{name}" in summary:
                values[f"mge_sigma_{name}"] = summary[f"sigma_{name}"]
        info = {k: {"dp_mge": summary} for k in values}
        return values, info
