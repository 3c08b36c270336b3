"""Comparisons shared by the test suite and the benchmarks (one function, used by both).

:func:`assert_close_but_for_kinks` compares two computations of the same piecewise-linear network that differ only
in the order of their floating-point operations, e.g. G-PATE's vectorised teacher ensemble against a Python loop
over the same teachers. Where a pre-activation sits within rounding of a ReLU / LeakyReLU kink (seen: 4.6e-9 in
float32), the two orders can put it on different sides, and every input gradient that flows through that unit
changes by the slope difference: a few hundred elements of one (teacher, sample) slice out of tens of millions.
That is rounding, not a bug; a bug (wrong teacher, wrong sample, wrong sign) moves most elements.
"""

from __future__ import annotations

import torch

__all__ = ["assert_close_but_for_kinks"]


def assert_close_but_for_kinks(
    actual: torch.Tensor,
    expected: torch.Tensor,
    *,
    rtol: float = 1e-4,
    atol: float = 1e-6,
    max_fraction: float = 1e-4,
    what: str = "tensors",
) -> int:
    """Assert ``actual`` matches ``expected`` elementwise except for at most ``max_fraction`` of the elements.

    An element matches when ``|actual - expected| <= atol + rtol * |expected|`` (``torch.isclose``, computed in
    float64; NaN matches NaN only). At most ``floor(max_fraction * numel)`` elements may lie beyond that margin: the
    ones a rounding flip at an activation kink moves.

    Args:
        actual, expected: tensors of the same shape (any float dtype, any device).
        rtol, atol: the rounding margin of one element.
        max_fraction: the share of elements allowed beyond the margin (0: none, as ``torch.testing.assert_close``).
        what: what is compared, for the error message.

    Returns:
        The number of elements beyond the margin (within the allowance).

    Raises:
        AssertionError: on a shape mismatch, or when more elements than allowed lie beyond the margin; the message
            gives the count, the allowance and the greatest absolute difference.
    """
    if tuple(actual.shape) != tuple(expected.shape):
        raise AssertionError(f"{what}: shapes differ, {tuple(actual.shape)} vs {tuple(expected.shape)}")
    a = actual.detach().to("cpu", torch.float64)
    e = expected.detach().to("cpu", torch.float64)
    off = ~torch.isclose(a, e, rtol=rtol, atol=atol, equal_nan=True)
    n_off, numel = int(off.sum()), a.numel()
    allowed = int(max_fraction * numel)
    if n_off > allowed:
        diff = (a - e).abs()[off]
        worst = float(diff.nan_to_num(nan=float("inf")).max())
        raise AssertionError(
            f"{what}: {n_off} of {numel} elements differ beyond atol {atol:g} + rtol {rtol:g} (allowed: {allowed}, "
            f"a fraction {max_fraction:g} for rounding at activation kinks); greatest absolute difference {worst:.3g}"
        )
    return n_off
