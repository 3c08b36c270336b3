"""RDP of a Gaussian mechanism applied to ONE of K units drawn uniformly at random (GS-WGAN's critic draw).

The mechanism (:mod:`dpsyn.methods.gs_wgan`): K units (critics), unit j a function of the j-th of K disjoint
partitions of the private rows and of the public history; each step draws J uniformly from {1..K}, secretly and
afresh, and releases ``F(unit_J) + N(0, s^2 I)`` where every ``F(.)`` lies in a ball of radius rho (per-sample
clipping), so that any two units' outputs are within ``Delta = 2 rho``. dpsyn's neighbouring datasets differ by
removing or adding one row (docs/privacy.md); with partitions that depend on the row alone
(:class:`dpsyn.data.partitions.KeyedPartitions`) that changes ONE unit: at the unit level the relation is
replace-one, with K fixed. The noise multiplier is ``s / Delta`` and the rate ``q = 1/K``.

Three bounds (``method.bound`` of gs_wgan):

``convexity`` (the default; the proof is in docs/privacy.md, "GS-WGAN's accounting"). Write the two output
distributions as ``P = (1-q) R + q A`` and ``Q = (1-q) R + q B`` (R: the mixture over the K-1 unchanged units; A, B:
the changed unit before and after). By advanced joint convexity (Balle, Barthe & Gaboardi 2018, Thm 2), for
``gamma' = 1 + q (gamma - 1)``, ``H_gamma'(P || Q) = q H_gamma(A || (1-beta) R + beta B)``; joint convexity of the
hockey-stick divergence and the ball geometry (every component within Delta of A) bound it by
``q H_gamma(N(Delta) || N(0))``, which is exactly ``h(gamma') = H_gamma'(P_r || Q_r)`` of Poisson subsampling's
"remove" pair ``P_r = (1-q) N(0) + q N(Delta)``, ``Q_r = N(0)``. The same holds for ``H(Q || P)``. The Renyi
divergence of order alpha is an integral of hockey-stick divergences (Taylor's formula with integral remainder for
``x^alpha`` at 1)::

    E_Q[(dP/dQ)^alpha] = 1 + alpha (alpha-1) [ int_0^1 g^(alpha-1) H_(1/g)(Q || P) dg + int_1^inf g^(alpha-2) H_g(P || Q) dg ]

so bounding both hockey-stick terms by ``h`` gives, per step, the remove pair's RDP (Opacus's sampled-Gaussian RDP,
Mironov, Talwar & Zhang 2019, which uses the "add" curve ``H(Q_r || P_r)`` in the first integral) plus
``alpha (alpha-1) int_0^inf e^(-alpha u) [h(e^u) - h_add(e^u)] du`` (:func:`convexity_rdp`). It holds for every
history as long as no unit's state depends on the earlier secret draws (GS-WGAN's critics then train on a public
schedule), so RDP composes over the steps (Mironov 2017, Prop. 1).

``wang2019``: Wang, Balle & Kasiviswanathan (AISTATS 2019), subsampling without replacement (a subset of size 1 of
K) under replace-one, as dp_accounting implements it (``SampledWithoutReplacementDpEvent`` with
``NeighboringRelation.REPLACE_ONE``): a cited theorem, looser (eps 2.13 where ``convexity`` gives 1.08, K 100,
noise multiplier 4.53, 12,000 steps, delta 1e-5).

``poisson_argument``: Opacus's Poisson-subsampled RDP at rate 1/K (the GS-WGAN authors' kind of charge). It assumes
the reverse hockey-stick term is bounded by the "add" curve, which the argument above does not show; dpsyn keeps it
as a labelled option, never the default.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence

import numpy as np

UNIFORM_CHOICE_BOUNDS: tuple[str, ...] = ("convexity", "wang2019", "poisson_argument")
"""The per-step bounds :func:`uniform_choice_rdp` offers (module docstring)."""
SAMPLING = "uniform_one_of_k"
"""The sampling scheme these bounds analyse: one of K units, uniformly, without replacement, fresh each step."""
BOUND_BASIS = {
    "convexity": "advanced joint convexity + the ball geometry, a written proof (docs/privacy.md)",
    "wang2019": "Wang, Balle & Kasiviswanathan 2019, sampling without replacement under replace-one (dp_accounting)",
    "poisson_argument": "Opacus's Poisson-subsampled RDP at rate 1/K: assumed, not proven, for a uniform one-of-K draw",
}
_GRID = 4000  # points of the correction's integration grid (its upper/lower sums differ by < 1%, measured)


def check_bound(bound: str) -> str:
    """``bound`` if it is one of :data:`UNIFORM_CHOICE_BOUNDS`, else ValueError naming them."""
    if bound not in UNIFORM_CHOICE_BOUNDS:
        raise ValueError(f"unknown uniform-choice bound {bound!r}; allowed: {', '.join(UNIFORM_CHOICE_BOUNDS)}")
    return bound


def _log_hockey_stick_remove(u: np.ndarray, q: float, mu: float) -> np.ndarray:
    """``log h(e^u)``, ``h(g) = H_g(P_r || Q_r) = q H_(1 + (g-1)/q)(N(mu, 1) || N(0, 1))`` for ``u >= 0``."""
    from scipy.special import log_ndtr

    with np.errstate(divide="ignore"):
        # l = log(1 + (e^u - 1)/q), without overflow for large u
        l = np.logaddexp(0.0, u + np.log1p(-np.exp(-u)) - math.log(q))
    a = log_ndtr(mu / 2 - l / mu)
    b = l + log_ndtr(-mu / 2 - l / mu)
    return math.log(q) + a + np.log1p(-np.exp(np.minimum(b - a, 0.0)))


def _hockey_stick_add(u: np.ndarray, q: float, mu: float) -> np.ndarray:
    """``H_g(Q_r || P_r)`` at ``g = e^u`` (``u >= 0``): 0 from ``g >= 1/(1-q)`` on."""
    from scipy.stats import norm

    g = np.exp(u)
    inner = (1.0 - g * (1.0 - q)) / (g * q)
    out = np.zeros_like(u)
    ok = inner > 0
    x = (np.log(inner[ok]) + mu * mu / 2) / mu
    out[ok] = norm.cdf(x) * (1.0 - g[ok] * (1.0 - q)) - g[ok] * q * norm.cdf(x - mu)
    return np.clip(out, 0.0, None)


def _log_correction(orders: np.ndarray, q: float, mu: float) -> np.ndarray:
    """An upper bound on ``log int_0^inf e^(-alpha u) [h(e^u) - h_add(e^u)] du`` at each order (``-inf`` if 0).

    Both terms are decreasing in u: the integral of ``h`` is bounded above by its upper (left) sum and that of
    ``h_add`` below by its lower (right) sum on a grid dense where ``h`` varies (scale q near 0); beyond the grid's
    end U the rest of ``h``'s integral is at most ``h(e^U) e^(-alpha U) / alpha``."""
    from scipy.special import logsumexp

    end = max(60.0 / float(np.min(orders)), 10.0)
    u = np.unique(np.concatenate([[0.0], np.geomspace(q * 1e-7, end, _GRID), np.linspace(0.0, end, _GRID // 4)]))
    width = np.diff(u)
    log_h = _log_hockey_stick_remove(u, q, mu)
    add = _hockey_stick_add(u, q, mu)
    out = np.empty(len(orders))
    for i, alpha in enumerate(orders):
        upper = logsumexp(-alpha * u[:-1] + log_h[:-1], b=width)  # decreasing integrand: left sums are upper sums
        tail = log_h[-1] - alpha * u[-1] - math.log(alpha)
        upper = np.logaddexp(upper, tail)
        lower = float(np.sum(np.exp(-alpha * u[1:]) * add[1:] * width))  # right sums are lower sums
        diff = math.exp(upper) - lower
        out[i] = math.log(diff) if diff > 0 else -math.inf
    return out


@functools.lru_cache(maxsize=256)
def _per_step(bound: str, q: float, noise_multiplier: float, orders: tuple[float, ...]) -> np.ndarray:
    alphas = np.asarray(orders, dtype=np.float64)
    if q >= 1.0:  # every step reads the changed unit: the Gaussian mechanism itself
        return alphas / (2.0 * noise_multiplier**2)
    if bound == "wang2019":
        from dp_accounting.rdp import rdp_privacy_accountant as rdp

        return np.asarray(rdp._compute_rdp_sample_wor_gaussian(q, noise_multiplier, list(alphas)), dtype=np.float64)
    from opacus.accountants.analysis.rdp import compute_rdp

    poisson = np.asarray(compute_rdp(q=q, noise_multiplier=noise_multiplier, steps=1, orders=list(alphas)),
                         dtype=np.float64)
    if bound == "poisson_argument":
        return poisson
    # convexity: log M = log(exp((alpha-1) poisson) + alpha (alpha-1) correction)
    corr = np.log(alphas * (alphas - 1.0)) + _log_correction(alphas, q, 1.0 / noise_multiplier)
    log_m = np.logaddexp((alphas - 1.0) * poisson, corr)
    return np.maximum(log_m / (alphas - 1.0), poisson)


def uniform_choice_rdp(*, population: int, noise_multiplier: float, orders: Sequence[float],
                       bound: str = "convexity") -> np.ndarray:
    """Per-step RDP at ``orders`` of a Gaussian mechanism (noise multiplier ``s / Delta``) on one of ``population``
    units drawn uniformly (module docstring); multiply by the steps to compose.

    Raises:
        ValueError: ``population < 1``, a noise multiplier <= 0, or an unknown bound.
    """
    check_bound(bound)
    if isinstance(population, bool) or int(population) != population or population < 1:
        raise ValueError(f"population must be an integer >= 1, got {population!r}")
    if not noise_multiplier > 0:
        raise ValueError(f"noise_multiplier must be > 0, got {noise_multiplier!r}")
    return _per_step(bound, 1.0 / int(population), float(noise_multiplier), tuple(float(a) for a in orders)).copy()


def uniform_choice_epsilon(*, population: int, noise_multiplier: float, steps: int, delta: float,
                           bound: str = "convexity", orders: Sequence[float] | None = None) -> float:
    """Epsilon at ``delta`` of ``steps`` such steps (dpsyn's RDP -> epsilon conversion, at dpsyn's orders)."""
    from dpsyn.privacy.dpsgd import rdp_orders, rdp_to_epsilon

    orders = rdp_orders() if orders is None else list(orders)
    if steps == 0:
        return 0.0
    rdp = steps * uniform_choice_rdp(population=population, noise_multiplier=noise_multiplier, orders=orders,
                                     bound=bound)
    return rdp_to_epsilon(rdp=rdp, orders=orders, delta=delta)[0]


def uniform_choice_noise_multiplier(*, epsilon: float, delta: float, population: int, steps: int,
                                    bound: str = "convexity") -> float:
    """The smallest noise multiplier (to 0.01%) whose ``steps`` steps stay within ``(epsilon, delta)``; never one
    whose epsilon exceeds the target (:func:`uniform_choice_epsilon` at dpsyn's orders is checked at the end).

    Raises:
        ValueError: a non-finite or non-positive epsilon, no step, or no noise multiplier up to 1e6 that suffices.
    """
    from dpsyn.privacy.dpsgd import rdp_orders

    if not epsilon > 0 or not math.isfinite(epsilon):
        raise ValueError(f"epsilon must be finite and > 0, got {epsilon!r}")
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps!r}")
    orders = rdp_orders()

    def eps(nm: float) -> float:
        return uniform_choice_epsilon(population=population, noise_multiplier=nm, steps=steps, delta=delta,
                                      bound=bound, orders=orders)

    lo, hi = 1e-3, 1.0
    while eps(hi) > epsilon:
        lo, hi = hi, hi * 2.0
        if hi > 1e6:
            raise ValueError(f"no noise multiplier up to 1e6 gives eps={epsilon} at delta={delta} in {steps} steps")
    while hi / lo > 1.0001:
        mid = math.sqrt(lo * hi)
        lo, hi = (lo, mid) if eps(mid) <= epsilon else (mid, hi)
    return hi  # eps(hi) <= epsilon: the invariant of the search
