"""A fixed low-pass layer for image generators: the lowest 2-D DCT frequencies (:func:`dct_basis`) and a generator
whose output is kept to their span (:class:`LowPassOutput`).

Both are data-independent, so what passes through them is post-processing and costs no privacy. G-PATE projects its
votes into the basis and keeps its generator's output there (``method.projection=dct``,
``method.output_frequencies``); GS-WGAN keeps its generator's output there and sanitises the gradient into the
generator in the basis' coefficients (``method.output_frequencies``; :func:`dpsyn.methods.gs_wgan.sanitize`).
Written here rather than taken from ``scipy.fft`` because the basis is needed as a torch matrix on the run's device;
the tests check it against scipy's orthonormal DCT-II.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from dpsyn.nets.dcgan import CondDCGANGenerator


def dct_basis(shape: tuple[int, ...], frequencies: int) -> torch.Tensor:
    """(d, C m^2) orthonormal columns: the ``m x m`` lowest 2-D DCT-II frequencies of each of the C channels of an
    image of ``shape`` (C, H, W), ``m = frequencies``. Data-independent (a fixed low-pass basis)."""
    c, h, w = (int(v) for v in shape)
    if not 1 <= frequencies <= min(h, w):
        raise ValueError(f"the number of DCT frequencies must lie in [1, {min(h, w)}] for images of {h}x{w}, "
                         f"got {frequencies}")

    def cosines(n: int) -> torch.Tensor:  # (m, n) orthonormal DCT-II rows
        i = torch.arange(n, dtype=torch.float64)
        f = torch.arange(frequencies, dtype=torch.float64)[:, None]
        rows = torch.cos(math.pi * (i + 0.5) * f / n) * math.sqrt(2.0 / n)
        rows[0] /= math.sqrt(2.0)
        return rows

    two_d = torch.einsum("ax,by->abxy", cosines(h), cosines(w)).reshape(frequencies**2, h * w)  # (m^2, h w)
    basis = torch.block_diag(*([two_d] * c))  # (C m^2, C h w): channel by channel
    return basis.T.contiguous().float()


class LowPassOutput(nn.Module):
    """A :class:`CondDCGANGenerator` whose logits (before its final sigmoid) are kept to the span of ``basis`` (d, m)
    orthonormal columns (:func:`dct_basis`: the lowest 2-D DCT frequencies): ``sigmoid(basis basis^T logits)``. A fixed,
    data-independent layer: the generator's output stays post-processing of what it learnt and costs no privacy;
    the sigmoid keeps images in [0, 1] and lets a smooth logit draw a sharp edge.

    Why (docs/papers/long2021.md, Departures from the paper): in G-PATE with ``projection=dct`` every vote lies in
    the low band, so nothing the teachers say ever reaches the frequencies above it, and the generator's upsampling
    fills them with a grid that no vote corrects. In GS-WGAN the gradient into the generator is then sanitised in the
    band's m^2 coefficients (:func:`dpsyn.methods.gs_wgan.sanitize` with a basis), so the per-sample noise keeps
    m^2 / d of its energy."""

    def __init__(self, generator: CondDCGANGenerator, basis: torch.Tensor) -> None:
        super().__init__()
        if not isinstance(getattr(generator, "net", [None])[-1], nn.Sigmoid):
            raise TypeError("LowPassOutput expects a generator that ends with a sigmoid")
        generator.net[-1] = nn.Identity()  # the logits; the sigmoid comes after the low-pass
        self.generator = generator
        self.register_buffer("basis", basis, persistent=False)

    def forward(self, z: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        logits = self.generator(z, y)
        flat = logits.flatten(1)
        return torch.sigmoid((flat @ self.basis) @ self.basis.T).view_as(logits)
