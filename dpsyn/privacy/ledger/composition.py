"""Composition: the ledger's events composed into the epsilon spent at a delta, by the accountant that applies.

Composition in :func:`events_epsilon`, which :meth:`dpsyn.privacy.ledger.PrivacyLedger.epsilon` calls (the simplest
exact-enough rule that applies):

1. any non-private event: ``inf``;
2. approximate-DP events compose by basic composition: their epsilons add and their deltas are taken from the
   delta available to the other events (a Laplace release of class counts, as G-PATE's and PATE-GAN's tabular
   two-step class-ratio release, is ``ApproxDPEvent(epsilon=..., delta=0.0)``);
3. the other events: only Gaussian events -> exact GDP; a single DP-SGD event -> its own accountant (rdp/prv);
   otherwise (and whenever a PATE event has queries) RDP composition at dpsyn's orders
   (:func:`dpsyn.privacy.dpsgd.rdp_orders`): Opacus's sampled Gaussian RDP for DP-SGD, ``count * alpha/(2 nm^2)``
   for Gaussian events, each PATE event's RDP curve (:meth:`~dpsyn.privacy.ledger.events.PATEEvent.rdp`),
   converted with :func:`dpsyn.privacy.dpsgd.rdp_to_epsilon` (Opacus's ``get_privacy_spent``, Balle et al. 2020),
   the conversion the PATE analysis uses too.

The accountants of DP-SGD (:data:`ACCOUNTANTS`) are Opacus's, wrapped by :mod:`dpsyn.privacy.dpsgd`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from dpsyn.privacy.dpsgd import ACCOUNTANTS, dpsgd_epsilon, rdp_orders, rdp_to_epsilon
from dpsyn.privacy.gaussian import gdp_epsilon_from_mu
from dpsyn.privacy.ledger.events import (
    ApproxDPEvent,
    GaussianEvent,
    NonPrivateEvent,
    PATEEvent,
    PrivacyEvent,
    RepeatAndSelectEvent,
    SampledGaussianEvent,
    UniformChoiceGaussianEvent,
    events_rdp,
)


@dataclass
class _Plan:
    """How the ledger composes its events (shared by epsilon() and accountant_description())."""

    non_private: bool = False
    approx: list[ApproxDPEvent] = field(default_factory=list)
    gaussian: list[GaussianEvent] = field(default_factory=list)
    sampled: list[SampledGaussianEvent] = field(default_factory=list)
    pate: list[PATEEvent] = field(default_factory=list)
    select: list[RepeatAndSelectEvent] = field(default_factory=list)
    uniform: list[UniformChoiceGaussianEvent] = field(default_factory=list)

    @property
    def rest(self) -> str:
        """Which rule composes the non-approximate events: "none", "gdp", "single", or "rdp"."""
        if self.pate or self.select or self.uniform:
            return "rdp"
        if not self.gaussian and not self.sampled:
            return "none"
        if not self.sampled:
            return "gdp"
        if not self.gaussian and len(self.sampled) == 1:
            return "single"
        return "rdp"


def plan_events(events: Sequence[PrivacyEvent]) -> _Plan:
    """How ``events`` compose: sorted by the rule that composes them (events that spend nothing yet left out)."""
    plan = _Plan()
    for event in events:
        if isinstance(event, NonPrivateEvent):
            plan.non_private = True
        elif isinstance(event, ApproxDPEvent):
            plan.approx.append(event)
        elif isinstance(event, GaussianEvent):
            if event.count > 0:  # an event with nothing released yet spends nothing
                plan.gaussian.append(event)
        elif isinstance(event, SampledGaussianEvent):
            if event.steps > 0:
                plan.sampled.append(event)
        elif isinstance(event, UniformChoiceGaussianEvent):
            if event.steps > 0:
                plan.uniform.append(event)
        elif isinstance(event, PATEEvent):
            if event.spends:
                plan.pate.append(event)
        elif isinstance(event, RepeatAndSelectEvent):
            plan.select.append(event)
    return plan


def events_epsilon(events: Sequence[PrivacyEvent], delta: float) -> float:
    """Compose ``events`` into the epsilon spent at ``delta`` (the rules of the module docstring).

    Returns:
        Epsilon spent (``inf`` once a non-private release was recorded; 0.0 before any release).

    Raises:
        ValueError: If the approximate-DP events' deltas leave no delta for the rest (or exceed ``delta``).
    """
    plan = plan_events(events)
    if plan.non_private:
        return math.inf
    eps_approx = math.fsum(e.epsilon for e in plan.approx)
    delta_approx = math.fsum(e.delta for e in plan.approx)
    rest = plan.rest
    if rest == "none":
        if delta_approx > delta:
            raise ValueError(
                f"the approximate-DP events use delta {delta_approx:.3g} > the available delta {delta:.3g}"
            )
        return eps_approx
    delta_rest = delta - delta_approx
    if not delta_rest > 0.0:
        raise ValueError(
            f"the approximate-DP events use delta {delta_approx:.3g} of {delta:.3g}: "
            "no delta is left for the other releases"
        )
    return eps_approx + _epsilon_rest(plan, delta_rest)


def _epsilon_rest(plan: _Plan, delta: float) -> float:
    rest = plan.rest
    if rest == "gdp":
        mu = math.sqrt(math.fsum(e.inverse_variance for e in plan.gaussian))
        return gdp_epsilon_from_mu(mu=mu, delta=delta)
    if rest == "single":
        e = plan.sampled[0]
        return dpsgd_epsilon(
            noise_multiplier=e.noise_multiplier,
            sample_rate=e.sample_rate,
            steps=e.steps,
            delta=delta,
            accountant=e.accountant,
        )
    # Mixed events: RDP composes additively across mechanisms at each order.
    orders = rdp_orders()
    rdp = events_rdp([*plan.sampled, *plan.gaussian, *plan.pate, *plan.select, *plan.uniform], orders)
    return rdp_to_epsilon(rdp=rdp, orders=orders, delta=delta)[0]


def raw_data_dependent(events: Sequence[PrivacyEvent]) -> bool:
    """Whether the reported epsilon is a raw data-dependent PATE bound: a function of the private votes, not
    itself a DP release (a ``data_dependent`` PATE event without a smooth-sensitivity release)."""
    return any(e.bound == "data_dependent" and e.smooth_release is None for e in plan_events(events).pate)


__all__ = ["ACCOUNTANTS", "events_epsilon", "plan_events", "raw_data_dependent"]
