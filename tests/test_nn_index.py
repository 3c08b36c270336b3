"""dpsyn.nn_index: which faiss index and which device (GPU when faiss has one), checked on a CPU with a stand-in faiss
that claims a GPU (its ``index_cpu_to_gpu`` records the move and keeps the CPU index, so the searches still run)."""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import pytest

from dpsyn import nn_index
from dpsyn.methods.pe.histogram import nn_counts
from dpsyn.public.icgan import knn_indices

real_faiss = pytest.importorskip("faiss")


class GpuFaiss:
    """faiss as a GPU build that sees ``gpus`` devices: the real module for everything but the GPU calls."""

    def __init__(self, gpus: int) -> None:
        self.gpus, self.moved = gpus, []

    def __getattr__(self, name: str) -> Any:
        return getattr(real_faiss, name)

    def StandardGpuResources(self) -> object:  # noqa: N802 - faiss's name
        return object()

    def get_num_gpus(self) -> int:
        return self.gpus

    def index_cpu_to_gpu(self, resources: Any, device: int, index: Any) -> Any:
        self.moved.append((device, type(index).__name__))
        return index


@pytest.fixture
def fake_faiss(monkeypatch):
    def install(gpus: int) -> GpuFaiss:
        fake = GpuFaiss(gpus)
        monkeypatch.setattr(nn_index, "faiss", fake)
        monkeypatch.setattr(nn_index, "_gpu_resources", None)
        monkeypatch.setattr(nn_index, "_logged", set())  # each test sees its own first-use log lines
        return fake

    return install


def test_the_cpu_build_here_has_no_gpu() -> None:
    if not hasattr(real_faiss, "StandardGpuResources"):
        assert not nn_index.faiss_gpu_available() and not nn_index.use_gpu(None)


def test_gpu_index_when_faiss_sees_a_gpu(fake_faiss, caplog) -> None:
    fake = fake_faiss(1)
    rng = np.random.default_rng(0)
    priv, syn = rng.normal(size=(50, 4)), rng.normal(size=(20, 4))
    with caplog.at_level(logging.INFO, logger="dpsyn.nn_index"):
        counts = nn_counts(priv, syn)  # the default: a GPU when there is one
        nn_counts(priv, syn)  # the same choice again: no second log line
    assert counts.sum() == 50 and fake.moved == [(0, "IndexFlatL2"), (0, "IndexFlatL2")]
    lines = [r.getMessage() for r in caplog.records if r.name == "dpsyn.nn_index"]
    assert lines == ["PE histogram: faiss IndexFlatL2 on GPU 0 (faiss-gpu)"]
    # the IC-GAN neighbourhoods make the same choice through the same helper
    with caplog.at_level(logging.INFO, logger="dpsyn.nn_index"):
        ids = knn_indices(syn / np.linalg.norm(syn, axis=1, keepdims=True), 3, backend="faiss")  # unit rows
    assert fake.moved[-1] == (0, "IndexFlatIP") and (ids[:, 0] == np.arange(20)).all()
    assert "IC-GAN neighbourhoods: faiss IndexFlatIP on GPU 0 (faiss-gpu)" in caplog.text
    # ivf goes to the GPU trained and filled; hnsw has no GPU version and stays on the CPU, saying why
    big = rng.normal(size=(400, 4))
    with caplog.at_level(logging.INFO, logger="dpsyn.nn_index"):
        nn_counts(priv, big, nn_index="ivf")
        nn_counts(priv, big, nn_index="hnsw")
    assert fake.moved[-1] == (0, "IndexIVFFlat") and len(fake.moved) == 4
    assert "IndexHNSWFlat(M=16, efConstruction=40, efSearch=32) on CPU (faiss has no GPU HNSW)" in caplog.text


def test_cpu_index_without_a_gpu_or_when_asked(fake_faiss, caplog) -> None:
    rng = np.random.default_rng(1)
    priv, syn = rng.normal(size=(30, 4)), rng.normal(size=(10, 4))
    fake = fake_faiss(0)  # a GPU build on a machine without a visible device
    with caplog.at_level(logging.INFO, logger="dpsyn.nn_index"):
        nn_counts(priv, syn)
    assert fake.moved == [] and "PE histogram: faiss IndexFlatL2 on CPU" in caplog.text
    fake = fake_faiss(2)
    nn_counts(priv, syn, gpu=False)  # forced CPU
    assert fake.moved == []
    # a CPU build (no StandardGpuResources) never tries the GPU, even when asked
    monkey_cpu = type("CpuFaiss", (), {"__getattr__": lambda self, name: getattr(real_faiss, name)})()
    nn_index.faiss = monkey_cpu  # restored by the fixture's monkeypatch
    assert not nn_index.faiss_gpu_available()
    with caplog.at_level(logging.INFO, logger="dpsyn.nn_index"):
        nn_counts(priv, syn, gpu=True)
    assert "on CPU (gpu asked, but faiss has no GPU support or sees no GPU)" in caplog.text


def test_auto_picks_exact_search_where_approximate_does_not_pay() -> None:
    n = nn_index.AUTO_MIN_ROWS
    assert nn_index.resolve_kind("auto", n - 1, gpu=False) == "flat"
    assert nn_index.resolve_kind("auto", n, gpu=False) == "ivf"
    assert nn_index.resolve_kind("auto", 10 * n, gpu=True) == "flat"  # exact search is cheap on a GPU
    assert nn_index.resolve_kind("hnsw", 10, gpu=True) == "hnsw"
    with pytest.raises(ValueError, match="nn_index='kd'; allowed: auto, flat, ivf, hnsw"):
        nn_index.resolve_kind("kd", 10, gpu=False)
    # ivf's cells: about sqrt(rows), never fewer than 39 training rows per cell, nprobe >= 1
    assert nn_index.ivf_params(50_000) == (224, 8)
    assert nn_index.ivf_params(100) == (2, 1) and nn_index.ivf_params(10) == (1, 1)
