"""DP noise generators: OS entropy unless explicitly deterministic; importing dpsyn.privacy stays light."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import torch

from dpsyn.privacy import dp_generator, dp_numpy_generator


def test_non_deterministic_generators_differ():
    a = torch.randn(8, generator=dp_generator())
    b = torch.randn(8, generator=dp_generator())
    assert not torch.equal(a, b)
    # a seed passed without deterministic=True is ignored: the noise still comes from OS entropy
    c = torch.randn(8, generator=dp_generator(seed=0))
    d = torch.randn(8, generator=dp_generator(seed=0))
    assert not torch.equal(c, d)
    assert not np.array_equal(dp_numpy_generator().normal(size=8), dp_numpy_generator().normal(size=8))
    assert not np.array_equal(dp_numpy_generator(seed=0).normal(size=8), dp_numpy_generator(seed=0).normal(size=8))


def test_deterministic_generators_repeat():
    a = torch.randn(8, generator=dp_generator(deterministic=True, seed=123))
    b = torch.randn(8, generator=dp_generator(deterministic=True, seed=123))
    c = torch.randn(8, generator=dp_generator(deterministic=True, seed=124))
    assert torch.equal(a, b) and not torch.equal(a, c)
    x = dp_numpy_generator(deterministic=True, seed=7).normal(size=8)
    y = dp_numpy_generator(deterministic=True, seed=7).normal(size=8)
    assert np.array_equal(x, y)


def test_deterministic_without_seed_is_refused():
    with pytest.raises(ValueError, match="seed"):
        dp_generator(deterministic=True)
    with pytest.raises(ValueError, match="seed"):
        dp_numpy_generator(deterministic=True)
    with pytest.raises(ValueError, match="seed"):
        dp_generator(deterministic=True, seed=-1)


def test_generator_device():
    assert dp_generator(device="cpu").device.type == "cpu"
    if torch.cuda.is_available():  # pragma: no cover - GPU machines only
        assert dp_generator(device="cuda").device.type == "cuda"


def test_import_is_light():
    code = "import sys, dpsyn.privacy; print('torch' in sys.modules, 'opacus' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["False", "False"]
