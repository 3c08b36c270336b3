"""The Renyi filter of Confident-GNMax queries: its order and RDP budget, fixed before the queries.

A ``renyi_filter`` :class:`~dpsyn.privacy.ledger.events.PATEEvent` (Feldman & Zrnic 2021, Thm 3.1; Lecuyer 2021)
charges its queries at one RDP order against a budget ``B`` that neither the data nor the queries may choose: the
event's docstring states the theorem and the guarantee reported. :func:`renyi_filter` picks the order and ``B`` for
the ledger's target, after the events recorded so far (:meth:`dpsyn.privacy.ledger.PrivacyLedger.renyi_filter`).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence

import numpy as np

from dpsyn.privacy.dpsgd import rdp_orders, rdp_to_epsilon
from dpsyn.privacy.gaussian import _check_positive
from dpsyn.privacy.ledger.composition import plan_events
from dpsyn.privacy.ledger.events import PATEEvent, PrivacyEvent, events_rdp

logger = logging.getLogger(__name__)


def renyi_filter(events: Sequence[PrivacyEvent], *, restored: Sequence[PrivacyEvent], target_epsilon: float,
                 delta: float, sigma_threshold: float, sigma: float) -> tuple[float, float]:
    """The order and RDP budget of a Renyi filter for Confident-GNMax queries recorded after ``events``, within
    ``target_epsilon`` at ``delta``, fixed before any of its queries.

    At each order ``alpha`` the budget is the most RDP the queries may add with the epsilon at ``delta`` within the
    target: Balle et al.'s conversion (:func:`~dpsyn.privacy.dpsgd.rdp_to_epsilon`) inverted,
    ``B(alpha) = eps - log((alpha-1)/alpha) + (log delta + log alpha)/(alpha-1) - RDP_before(alpha)``, after the
    approximate-DP events' epsilon and delta (basic composition, as
    :func:`~dpsyn.privacy.ledger.composition.events_epsilon`). Every query costs a multiple of ``alpha`` (Gaussian
    mechanisms), so the order that allows the most queries maximises ``B(alpha)/alpha``; it depends on the budget
    and the events before, not on the data.

    A filter of the same noise among ``restored`` (the events an interrupted attempt journalled that the ledger has
    not taken up yet, in id order) is continued: its order and budget are returned, so that the event recorded with
    them takes it up and the queries of both attempts stay within one budget.

    Returns:
        ``(order, budget)``.

    Raises:
        ValueError: On a non-private ledger, or if no order leaves a positive budget.
    """
    s1, s2 = _check_positive("sigma_threshold", sigma_threshold), _check_positive("sigma", sigma)
    plan = plan_events(events)
    if plan.non_private or not math.isfinite(target_epsilon):
        raise ValueError("a Renyi filter needs a private ledger with a finite target epsilon")
    for e in restored:
        if isinstance(e, PATEEvent) and e.bound == "renyi_filter" and (e.sigma_threshold, e.sigma) == (s1, s2):
            return float(e.filter_order), float(e.filter_budget)
    eps_left = target_epsilon - math.fsum(e.epsilon for e in plan.approx)
    delta_left = delta - math.fsum(e.delta for e in plan.approx)
    orders = np.asarray(rdp_orders(), dtype=np.float64)
    before = [*plan.sampled, *plan.gaussian, *plan.pate, *plan.select]
    rdp_before = events_rdp(before, orders) if before else np.zeros_like(orders)
    if not (eps_left > 0 and delta_left > 0):
        raise ValueError(f"the events so far leave no budget for a Renyi filter (eps {eps_left:.4g}, "
                         f"delta {delta_left:.3g} left)")
    budgets = (eps_left - np.log((orders - 1.0) / orders) + (math.log(delta_left) + np.log(orders)) / (orders - 1.0)
               - rdp_before)
    if not np.any(budgets > 0):
        raise ValueError(f"no RDP order leaves a positive budget for a Renyi filter at eps {eps_left:.4g}")
    i = int(np.argmax(np.where(budgets > 0, budgets / orders, -np.inf)))
    order, budget = float(orders[i]), float(budgets[i])
    # the inverse above and Opacus's forward conversion may differ in the last bits: never claim past the target
    def composed(b: float) -> float:
        curve = np.full(orders.shape, math.inf)
        curve[i] = b
        return rdp_to_epsilon(rdp=rdp_before + curve, orders=orders, delta=delta_left)[0]

    while composed(budget) > eps_left:
        budget *= 1.0 - 1e-12
    logger.debug("renyi filter: order %g, budget %.6g (per query: %.3g threshold, %.3g GNMax)", order, budget,
                 order / (2 * s1 * s1), order / (s2 * s2))
    return order, budget
