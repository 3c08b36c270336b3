"""gaussian_mechanism / laplace_mechanism: the same numbers, in the same order, as the hand-written draws they replaced.

Every "before" below is the formula a method used at 83123e5 (file:line in the comment), evaluated on a generator
with the same deterministic seed; "after" is the method's function now. Bit-identical, so a run with
``privacy.deterministic_noise=true`` gives the outputs it gave before.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from dpsyn.privacy import dp_generator, dp_numpy_generator, gaussian_mechanism, laplace_mechanism


def _np(seed: int = 11) -> np.random.Generator:
    return dp_numpy_generator(deterministic=True, seed=seed)


def _torch(seed: int = 11) -> torch.Generator:
    return dp_generator(deterministic=True, seed=seed)


@pytest.mark.parametrize("shape", [(1,), (4,), (3, 5), (20, 7)])
@pytest.mark.parametrize("sigma", [0.37, 1.0, 12.5])
def test_numpy_gaussian_equals_both_hand_written_forms(shape, sigma):
    value = np.arange(np.prod(shape), dtype=np.float64).reshape(shape) / 3.0
    got = gaussian_mechanism(value, sigma, generator=_np())
    assert np.array_equal(got, value + _np().normal(0.0, sigma, size=shape))  # dp_mge, PE
    assert np.array_equal(got, value + sigma * _np().standard_normal(shape))  # dp_mepf
    assert not np.array_equal(got, value)
    # a second release on the same generator continues the stream (the order of draws is kept)
    rng, ref = _np(), _np()
    a, b = gaussian_mechanism(value, sigma, generator=rng), gaussian_mechanism(value, 2 * sigma, generator=rng)
    a0, b0 = value + ref.normal(0.0, sigma, size=shape), value + ref.normal(0.0, 2 * sigma, size=shape)
    assert np.array_equal(a, a0) and np.array_equal(b, b0)


def test_scalar_and_laplace():
    assert gaussian_mechanism(2.5, 0.5, generator=_np()) == 2.5 + _np().normal(0.0, 0.5)
    counts = np.array([3.0, 0.0, 7.0, 1.0])
    assert np.array_equal(laplace_mechanism(counts, 2.0, generator=_np()),
                          counts + _np().laplace(0.0, 2.0, size=4))  # laplace.py: dp_class_counts
    assert laplace_mechanism(1.0, 0.3, generator=_np()) == 1.0 + _np().laplace(0.0, 0.3)


@pytest.mark.parametrize("shape", [(3,), (10,), (16,), (4, 1, 5, 5)])
def test_torch_gaussian_equals_opacus_draw(shape):
    value = torch.linspace(-1, 1, int(np.prod(shape))).reshape(shape)
    got = gaussian_mechanism(value, 0.7, generator=_torch())
    assert got.dtype == value.dtype and got.shape == value.shape
    assert torch.equal(got, value + torch.normal(0.0, 0.7, size=shape, generator=_torch()))  # lit/gan.py:204


def test_gs_wgan_sanitize_unchanged():
    """gs_wgan.py:123: ``out + (sigma * clip) * torch.randn(grad.shape, generator=..., dtype=grad.dtype)``."""
    from dpsyn.methods.gs_wgan import clip_per_sample, sanitize

    grad = torch.linspace(-3, 3, 4 * 1 * 6 * 6).reshape(4, 1, 6, 6)
    got = sanitize(grad, clip=0.8, sigma=1.3, generator=_torch(5))
    before = clip_per_sample(grad, 0.8) + (1.3 * 0.8) * torch.randn(grad.shape, generator=_torch(5), dtype=grad.dtype)
    assert torch.equal(got, before)


def test_noise_only_step_unchanged():
    """lit/gan.py:204: ``torch.normal(0, nm * C, size=p.shape, generator=opt.generator) / expected_batch_size``."""
    from dpsyn.lit.gan import noise_only_step

    params = [torch.nn.Parameter(torch.zeros(3, 4)), torch.nn.Parameter(torch.zeros(5))]
    inner = torch.optim.SGD(params, lr=1.0)
    opt = SimpleNamespace(params=params, generator=_torch(3), noise_multiplier=1.1, max_grad_norm=0.5,
                          expected_batch_size=8, original_optimizer=inner, zero_grad=inner.zero_grad)
    noise_only_step(opt)
    ref = _torch(3)
    for p in params:
        step = (torch.normal(0.0, 1.1 * 0.5, size=p.shape, generator=ref) / 8).to(p.dtype)
        assert torch.equal(p.detach(), -step)


def test_dp_mge_moments_unchanged():
    """dp_mge.py:242-246: mean sums, then second-moment sums, then counts, each ``+ rng.normal(0, sigma)``."""
    from dpsyn.methods.dp_mge import dp_moments

    feats = np.random.default_rng(0).uniform(-0.3, 0.3, size=(12, 4))
    labels = np.arange(12) % 3
    est = dp_moments(feats, labels, 3, sigma_mean=0.9, sigma_second=1.7, sigma_counts=2.3, rng=_np(21), min_count=1.0)
    rng = _np(21)
    s1, s2 = np.zeros((3, 4)), np.zeros((3, 4))
    np.add.at(s1, labels, feats)
    np.add.at(s2, labels, feats * feats)
    counts = np.bincount(labels, minlength=3).astype(np.float64)
    s1 = s1 + rng.normal(0.0, 0.9, size=s1.shape)
    s2 = s2 + rng.normal(0.0, 1.7, size=s2.shape)
    counts = np.maximum(counts + rng.normal(0.0, 2.3, size=counts.shape), 1.0)
    assert np.array_equal(est.counts, counts)
    assert np.array_equal(est.mean, s1 / counts[:, None]) and np.array_equal(est.second, s2 / counts[:, None])


def test_dp_mepf_release_means_unchanged():
    """dp_mepf.py:204: ``(sums + sigma * rng.standard_normal(sums.shape)) / counts``."""
    from dpsyn.methods.dp_mepf import release_means

    sums, counts = np.linspace(0, 5, 15).reshape(3, 5), np.array([2.0, 4.0, 9.0])
    before = ((sums + 0.6 * _np(4).standard_normal(sums.shape)) / counts[:, None]).astype(np.float32)
    assert np.array_equal(release_means(sums, counts, 0.6, _np(4)), before)


def test_pe_histogram_unchanged():
    """pe/histogram.py:192: ``clean + rng.normal(0, noise_multiplier, size=clean.shape)``."""
    from dpsyn.methods.pe.histogram import dp_nn_histogram, nn_counts

    priv = np.random.default_rng(1).normal(size=(30, 3)).astype(np.float32)
    syn = np.random.default_rng(2).normal(size=(8, 3)).astype(np.float32)
    h = dp_nn_histogram(priv, syn, noise_multiplier=1.4, threshold=0.5, rng=_np(8), backend="torch")
    clean = nn_counts(priv, syn, backend="torch")
    noisy = clean + _np(8).normal(0.0, 1.4, size=clean.shape)
    assert np.array_equal(h.noisy, noisy) and np.array_equal(h.thresholded, np.maximum(noisy - 0.5, 0.0))


def test_refusals():
    with pytest.raises(ValueError, match="sigma"):
        gaussian_mechanism(np.zeros(2), 0.0, generator=_np())
    with pytest.raises(ValueError, match="sigma"):
        gaussian_mechanism(np.zeros(2), float("nan"), generator=_np())
    with pytest.raises(ValueError, match="scale"):
        laplace_mechanism(np.zeros(2), -1.0, generator=_np())
    with pytest.raises(ValueError, match="torch.Generator"):
        gaussian_mechanism(torch.zeros(2), 1.0, generator=_np())
    with pytest.raises(ValueError, match="numpy Generator"):
        gaussian_mechanism(np.zeros(2), 1.0, generator=_torch())
    with pytest.raises(ValueError, match="numpy Generator"):
        laplace_mechanism(np.zeros(2), 1.0, generator=_torch())
