"""Splitting an (epsilon, delta) budget between Gaussian releases, and the noise of each: the one calibration path of
dp_mge, dp_mepf, PE and gs_wgan.

Two ways to compose the releases of one run (:data:`COMPOSITIONS`):

* ``"basic"``: release r gets the share ``(f_r epsilon, f_r delta)`` (:func:`split_budget`) and the sigma of a
  single Gaussian mechanism at that share, "classic" (paper 000's formula) or "analytic" (Balle & Wang 2018)
  (:func:`dpsyn.privacy.gaussian_sigma`). The shares add up to at most (epsilon, delta); the ledger records each as
  an ``ApproxDPEvent``. dp_mepf (both calibrations) and dp_mge's "classic" calibration.
* ``"gdp"``: the releases share one analytic Gaussian budget. ``sigma`` is the analytic noise of a single
  sensitivity-1 release at (epsilon, delta), i.e. ``mu = 1/sigma``; release r gets ``sigma_r = sigma/sqrt(f_r)``,
  i.e. ``mu_r^2 = f_r mu^2``, and the releases compose exactly to ``mu`` (Dong, Roth & Su 2019); the ledger records
  each as a ``GaussianEvent``. dp_mge's "analytic" calibration. (PE's T equal releases are the same composition,
  calibrated over the T releases at once by :func:`dpsyn.privacy.gdp_noise_multiplier`.)

DP-SGD-style releases whose neighbouring relation is replace-one (GS-WGAN's critics: two clipped gradients differ by
up to 2C) double the noise multiplier of the add/remove accountants: :func:`replace_one_noise_std`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from dpsyn.privacy.gaussian import CALIBRATIONS, _check_delta, _check_positive, gaussian_sigma

COMPOSITIONS: tuple[str, ...] = ("basic", "gdp")
"""Allowed values of ``calibrate_releases(composition=...)``."""

REPLACE_ONE_SENSITIVITY_FACTOR = 2.0
"""L2 sensitivity, in units of the clip bound C, of one clipped per-sample gradient when a neighbouring dataset
replaces one record (GS-WGAN: a critic that sees another partition): ``||g - g'|| <= ||g|| + ||g'|| <= 2C``."""


def split_budget(
    *, epsilon: float, delta: float, fractions: Mapping[str, float], what: str = "fractions"
) -> dict[str, tuple[float, float]]:
    """``(f_r epsilon, f_r delta)`` for each release r, whose epsilons and deltas sum to at most the totals.

    Args:
        epsilon: total epsilon (finite, > 0).
        delta: total delta in (0, 1).
        fractions: release name -> fraction > 0; the fractions must sum to 1 (within 1e-9).
        what: how error messages name the fractions (e.g. the config key ``method.budget_split``).

    Returns:
        release name -> (epsilon_r, delta_r). Float rounding is resolved towards the safe side (the largest share is
        nudged down by an ulp until the sums do not exceed the totals).

    Raises:
        ValueError: a fraction <= 0, or fractions that do not sum to 1.
    """
    if not fractions or any(not (isinstance(f, (int, float)) and f > 0) for f in fractions.values()):
        raise ValueError(f"{what}: every release made needs a fraction > 0, got {dict(fractions)}")
    total = math.fsum(float(f) for f in fractions.values())
    if abs(total - 1.0) > 1e-9:
        raise ValueError(f"{what}: the fractions of the releases made must sum to 1, got {dict(fractions)}"
                         f" (sum {total:g})")
    names = list(fractions)
    eps = {k: epsilon * float(fractions[k]) for k in names}
    dlt = {k: delta * float(fractions[k]) for k in names}
    for shares, limit in ((eps, epsilon), (dlt, delta)):
        while math.fsum(shares.values()) > limit:
            k = max(shares, key=shares.__getitem__)
            shares[k] = math.nextafter(shares[k], 0.0)
    return {k: (eps[k], dlt[k]) for k in names}


@dataclass(frozen=True)
class CalibratedRelease:
    """One Gaussian release of a split budget (sensitivity-scaled noise std ``sigma``).

    Attributes:
        name: the release.
        sigma: noise standard deviation (already times the sensitivity).
        share: its fraction of the budget.
        calibration: ``"classic"`` or ``"analytic"``.
        composition: ``"basic"`` (it is ``(epsilon, delta)``-DP on its own) or ``"gdp"`` (its ``mu`` is
            ``sensitivity/sigma``; ``epsilon`` and ``delta`` are None).
        epsilon: its epsilon under basic composition.
        delta: its delta under basic composition.
    """

    name: str
    sigma: float
    share: float
    calibration: str
    composition: str
    epsilon: float | None = None
    delta: float | None = None


def calibrate_releases(
    *,
    epsilon: float,
    delta: float,
    fractions: Mapping[str, float],
    calibration: str = "classic",
    composition: str = "basic",
    sensitivity: float = 1.0,
    what: str = "fractions",
) -> dict[str, CalibratedRelease]:
    """Split (epsilon, delta) between Gaussian releases by ``fractions`` and calibrate each one's sigma.

    Args:
        epsilon: the total budget, finite and > 0.
        delta: the total delta in (0, 1).
        fractions: release name -> fraction > 0, summing to 1.
        calibration: ``"classic"`` or ``"analytic"`` (:func:`dpsyn.privacy.gaussian_sigma`).
        composition: ``"basic"`` or ``"gdp"`` (analytic only); see the module docstring.
        sensitivity: L2 sensitivity of every release, > 0.
        what: how error messages name the fractions.

    Returns:
        ``{name: CalibratedRelease}`` in the order of ``fractions``.

    Raises:
        ValueError: on an unknown calibration or composition, "gdp" with "classic", or invalid fractions/budget.
    """
    if calibration not in CALIBRATIONS:
        raise ValueError(f"unknown Gaussian calibration {calibration!r}; allowed: {', '.join(CALIBRATIONS)}")
    if composition not in COMPOSITIONS:
        raise ValueError(f"unknown composition {composition!r}; allowed: {', '.join(COMPOSITIONS)}")
    epsilon = _check_positive("epsilon", epsilon)
    delta = _check_delta("delta", delta)
    if composition == "gdp":
        if calibration != "analytic":
            raise ValueError("composition='gdp' shares one analytic Gaussian budget: it needs calibration='analytic'")
        split_budget(epsilon=epsilon, delta=delta, fractions=fractions, what=what)  # validates the fractions
        sigma = gaussian_sigma(epsilon=epsilon, delta=delta, sensitivity=sensitivity, calibration="analytic")
        return {k: CalibratedRelease(k, sigma / math.sqrt(float(f)), float(f), "analytic", "gdp")
                for k, f in fractions.items()}
    out = {}
    for k, (eps_k, delta_k) in split_budget(epsilon=epsilon, delta=delta, fractions=fractions, what=what).items():
        sigma = gaussian_sigma(epsilon=eps_k, delta=delta_k, sensitivity=sensitivity, calibration=calibration)
        out[k] = CalibratedRelease(k, sigma, float(fractions[k]), calibration, "basic", eps_k, delta_k)
    return out


def replace_one_noise_std(noise_multiplier: float) -> float:
    """The noise std (in units of the clip bound C) that gives a replace-one release the privacy an add/remove
    accountant reports for ``noise_multiplier``.

    dpsyn's DP-SGD accountants (Opacus's RDP/PRV of the sampled Gaussian) assume add/remove neighbours, where one
    clipped per-sample gradient has L2 sensitivity C. When neighbours replace one record instead (GS-WGAN: the critic
    of one partition sees another record), two clipped gradients differ by up to
    :data:`REPLACE_ONE_SENSITIVITY_FACTOR` C = 2C, so the noise std must be ``2 * noise_multiplier * C`` for the
    accountant's ``noise_multiplier`` (std / sensitivity) to hold.

    Raises:
        ValueError: on a noise multiplier that is not finite and > 0.
    """
    return REPLACE_ONE_SENSITIVITY_FACTOR * _check_positive("noise_multiplier", noise_multiplier)
