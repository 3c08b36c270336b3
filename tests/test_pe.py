"""PE (paper 001): the DP nearest-neighbour histogram against brute force, threshold and noise, lookahead,
class-conditional voting, the GDP calibration, checkpoint/resume without re-spending, and the method end to end."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from dpsyn.methods.pe import api as pe_api
from dpsyn.methods.pe import method as pe_method
from dpsyn.methods.pe.api import DiffusionAPI, Population
from dpsyn.methods.pe.histogram import dp_nn_histogram, nearest_neighbours, nn_counts, select_parents
from dpsyn.methods.pe.method import class_sizes, pe_noise_multiplier
from dpsyn.privacy import dp_numpy_generator, gdp_epsilon
from tests.conftest import run_context
from tests.tiny import TINY_PUBLIC
from dpsyn.config import load_group

TINY_PE = ("method.population=60", "method.degrees=[0.6,0.4,0.3]", "method.lookahead=1", "method.threshold=1.0",
           "dataset.n_private=300", "metrics.n_samples=200", "metrics.n_real=300", "method.public_pool=300")
# for the runs whose metrics no test reads: no image metric, no per-iteration monitoring (both on in the end-to-end
# test below)
UNSCORED = ("metrics.names.image=[]", "method.monitor=false")


def _brute_force_counts(priv: np.ndarray, syn: np.ndarray, priv_y=None, syn_y=None) -> np.ndarray:
    """Written out again: each private row adds 1 to its nearest synthetic row (of its own class)."""
    counts = np.zeros(len(syn))
    for i, p in enumerate(priv):
        cand = range(len(syn)) if priv_y is None else [j for j in range(len(syn)) if syn_y[j] == priv_y[i]]
        best = min(cand, key=lambda j: float(((p - syn[j]) ** 2).sum()))
        counts[best] += 1
    return counts


# ------------------------------------------------------------------------------------------------- histogram


@pytest.mark.parametrize("backend,nn_index", [("faiss", "flat"), ("faiss", "auto"), ("torch", "flat"), ("torch", "auto")])
def test_histogram_equals_brute_force_count(backend: str, nn_index: str) -> None:
    rng = np.random.default_rng(0)
    priv, syn = rng.normal(size=(300, 8)), rng.normal(size=(40, 8))
    counts = nn_counts(priv, syn, backend=backend, nn_index=nn_index)  # flat (and auto at this size) stay exact
    np.testing.assert_array_equal(counts, _brute_force_counts(priv, syn))
    assert counts.sum() == 300


def test_conditional_votes_never_cross_classes() -> None:
    rng = np.random.default_rng(1)
    priv, syn = rng.normal(size=(200, 4)), rng.normal(size=(30, 4))
    priv_y, syn_y = rng.integers(0, 3, 200), np.arange(30) % 3
    counts = nn_counts(priv, syn, private_labels=priv_y, synthetic_labels=syn_y)
    np.testing.assert_array_equal(counts, _brute_force_counts(priv, syn, priv_y, syn_y))
    for c in range(3):  # each class's synthetic samples got exactly its private samples' votes
        assert counts[syn_y == c].sum() == (priv_y == c).sum()
    # a private row sitting on a synthetic row of another class still votes within its class
    priv1, syn1 = np.zeros((1, 2)), np.array([[0.0, 0.0], [5.0, 5.0]])
    assert nn_counts(priv1, syn1, private_labels=np.array([1]), synthetic_labels=np.array([0, 1])).tolist() == [0, 1]
    with pytest.raises(ValueError, match="no synthetic sample"):
        nn_counts(priv1, syn1, private_labels=np.array([2]), synthetic_labels=np.array([0, 1]))


def test_histogram_has_l2_sensitivity_one() -> None:
    rng = np.random.default_rng(2)
    priv, syn = rng.normal(size=(100, 5)), rng.normal(size=(20, 5))
    for k in (1, 4):
        base = nn_counts(priv, syn, num_nearest=k)
        plus = nn_counts(np.vstack([priv, rng.normal(size=(1, 5))]), syn, num_nearest=k)
        assert np.linalg.norm(plus - base) == pytest.approx(1.0)  # neighbours: add one private sample


def _clustered(seed: int, n_syn: int = 2000, n_priv: int = 3000, clusters: int = 20, d: int = 16):
    """Private and synthetic rows around the same well-separated centres (6 sd apart per axis), with their clusters."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(clusters, d)) * 6
    syn_y, priv_y = np.arange(n_syn) % clusters, rng.integers(0, clusters, n_priv)
    return centres[priv_y] + rng.normal(size=(n_priv, d)), centres[syn_y] + rng.normal(size=(n_syn, d)), syn_y


@pytest.fixture
def one_faiss_thread():
    """faiss builds HNSW graphs in parallel, in an order that varies between builds; one thread makes two builds on the
    same rows the same index, which the sensitivity test compares (the privacy argument does not need it)."""
    faiss = pytest.importorskip("faiss")
    before = faiss.omp_get_max_threads()
    faiss.omp_set_num_threads(1)
    yield
    faiss.omp_set_num_threads(before)


@pytest.mark.parametrize("nn_index", ["flat", "ivf", "hnsw"])
def test_approximate_index_sees_the_synthetic_rows_only(nn_index: str, monkeypatch) -> None:
    """The privacy argument of the approximate indexes (histogram.py's docstring): every array faiss trains or fills an
    index with is the synthetic embeddings (or, conditional, a class's part of them); no private row ever reaches it."""
    faiss = pytest.importorskip("faiss")
    seen: list[tuple[str, np.ndarray]] = []
    for cls in (faiss.IndexFlatL2, faiss.IndexIVFFlat, faiss.IndexHNSWFlat):
        for name in ("train", "add"):
            original = getattr(cls, name)

            def spy(self, x, *args, _original=original, _what=f"{cls.__name__}.{name}", **kwargs):
                seen.append((_what, np.array(x, copy=True)))
                return _original(self, x, *args, **kwargs)

            monkeypatch.setattr(cls, name, spy)
    priv, syn, syn_y = _clustered(0, n_syn=600, n_priv=900)
    priv_y = np.random.default_rng(1).integers(0, 20, len(priv))
    nn_counts(priv, syn, nn_index=nn_index)
    nn_counts(priv, syn, private_labels=priv_y, synthetic_labels=syn_y, nn_index=nn_index)
    expected_kind = {"flat": "IndexFlatL2", "ivf": "IndexIVFFlat", "hnsw": "IndexHNSWFlat"}[nn_index]
    assert any(what.startswith(expected_kind) for what, _ in seen), [what for what, _ in seen]
    syn32, priv32 = syn.astype(np.float32), priv.astype(np.float32)
    syn_rows = {row.tobytes() for row in syn32}
    for what, x in seen:
        rows = {row.tobytes() for row in x}
        assert rows <= syn_rows, f"{what} saw rows that are not synthetic"
        assert not rows & {row.tobytes() for row in priv32}, f"{what} saw private rows"
    # unconditional: the whole synthetic set, in order (the index's ids are the population's)
    assert any(x.shape == syn32.shape and np.array_equal(x, syn32) for what, x in seen if what.endswith(".add"))


@pytest.mark.parametrize("nn_index", ["ivf", "hnsw"])
def test_approximate_histogram_keeps_sensitivity_one(nn_index: str, one_faiss_thread) -> None:
    """Adding one private row adds its own vote(s) and moves no other: what the index depends on is unchanged. An index
    trained or filled with private rows would fail this (one more row moves the k-means cells or the graph)."""
    priv, syn, _ = _clustered(2, n_syn=1500, n_priv=2000)
    extra = np.random.default_rng(3).normal(size=(5, priv.shape[1])) * 6
    base = nn_counts(priv, syn, nn_index=nn_index)
    assert base.sum() == len(priv)  # every private row voted (none lost to an empty IVF cell)
    for row in extra:
        plus = nn_counts(np.vstack([priv, row]), syn, nn_index=nn_index)
        diff = plus - base
        assert np.count_nonzero(diff) == 1 and diff.sum() == 1.0, nn_index
    for k in (1, 4):  # num_nearest = k: k counts move by 1/sqrt(k), L2 norm 1
        base = nn_counts(priv, syn, num_nearest=k, nn_index=nn_index)
        plus = nn_counts(np.vstack([priv, extra[:1]]), syn, num_nearest=k, nn_index=nn_index)
        assert np.linalg.norm(plus - base) == pytest.approx(1.0)


@pytest.mark.parametrize("nn_index,min_vote", [("ivf", 0.8), ("hnsw", 0.9)])
def test_approximate_votes_agree_with_the_exact_search(nn_index: str, min_vote: float) -> None:
    """On a clustered problem the approximate index's votes mostly land on the exact nearest sample (measured here:
    ivf 0.95, hnsw 1.0), always within the right cluster, and the most-voted candidates are mostly the same (measured:
    ivf 0.89-0.91 of the top 100, hnsw 1.0). The bounds leave wide margins for other CPUs and thread counts."""
    pytest.importorskip("faiss")
    for seed in (0, 1):
        priv, syn, syn_y = _clustered(seed)
        exact = nearest_neighbours(priv, syn, nn_index="flat")[:, 0]
        approx = nearest_neighbours(priv, syn, nn_index=nn_index)[:, 0]
        assert np.mean(approx == exact) >= min_vote
        assert np.mean(syn_y[approx] == syn_y[exact]) >= 0.99
        c_exact, c_approx = (np.bincount(ids, minlength=len(syn)) for ids in (exact, approx))
        top = [set(np.argsort(-c, kind="stable")[:100].tolist()) for c in (c_exact, c_approx)]
        assert len(top[0] & top[1]) >= 70


def test_approximate_search_always_returns_k_neighbours() -> None:
    """k larger than what nprobe IVF cells hold: the short queries are searched again exactly (no -1 ids, no lost
    votes)."""
    pytest.importorskip("faiss")
    priv, syn, _ = _clustered(4, n_syn=800, n_priv=200)
    ids = nearest_neighbours(priv, syn, k=150, nn_index="ivf")
    assert ids.min() >= 0 and all(len(set(row)) == 150 for row in ids.tolist())
    assert nn_counts(priv, syn, num_nearest=150, nn_index="ivf").sum() == pytest.approx(len(priv) * 150 / math.sqrt(150))


def test_nn_index_choices_and_errors() -> None:
    rng = np.random.default_rng(5)
    priv, syn = rng.normal(size=(30, 4)), rng.normal(size=(10, 4))
    with pytest.raises(ValueError, match="needs faiss; method.knn_backend=torch"):
        nn_counts(priv, syn, backend="torch", nn_index="ivf")
    with pytest.raises(ValueError, match=r"method.nn_index='annoy'; allowed: auto, flat, ivf, hnsw"):
        nn_counts(priv, syn, nn_index="annoy")


def test_threshold_and_noise_are_as_specified() -> None:
    rng = np.random.default_rng(3)
    priv, syn = rng.normal(size=(5000, 3)), rng.normal(size=(4000, 3))
    h = dp_nn_histogram(priv, syn, noise_multiplier=2.5, threshold=3.0,
                        rng=dp_numpy_generator(deterministic=True, seed=7))
    again = dp_nn_histogram(priv, syn, noise_multiplier=2.5, threshold=3.0,
                            rng=dp_numpy_generator(deterministic=True, seed=7))
    np.testing.assert_array_equal(h.noisy, again.noisy)  # deterministic noise mode reproduces the draw
    noise = h.noisy - h.clean
    assert noise.std() == pytest.approx(2.5, rel=0.05) and abs(noise.mean()) < 0.15
    np.testing.assert_array_equal(h.thresholded, np.maximum(h.noisy - 3.0, 0.0))
    assert (h.thresholded[h.noisy < 3.0] == 0).all()
    exact = dp_nn_histogram(priv, syn, noise_multiplier=0.0, threshold=0.0, rng=None)  # non-private: no noise
    np.testing.assert_array_equal(exact.noisy, exact.clean)
    with pytest.raises(ValueError, match="noise generator"):
        dp_nn_histogram(priv, syn, noise_multiplier=1.0, threshold=0.0, rng=None)


def test_parent_selection_follows_the_histogram() -> None:
    rng = np.random.default_rng(4)
    w = np.array([0.0, 3.0, 1.0, 0.0])
    idx, note = select_parents(w, 20000, mode="sample", rng=rng)
    assert note == "" and set(idx.tolist()) <= {1, 2}
    assert np.mean(idx == 1) == pytest.approx(0.75, abs=0.02)
    top, _ = select_parents(np.array([0.0, 3.0, 1.0, 2.0]), 4, mode="rank", rng=rng, rank_keep=0.5)
    assert sorted(top.tolist()) == [1, 1, 3, 3]
    # all counts below the threshold: uniform fallback, said in the note
    idx, note = select_parents(np.zeros(5), 10, mode="sample", rng=rng)
    assert "uniform" in note and len(idx) == 10
    # class-conditional: class c's parents come from class c
    labels = np.array([0, 0, 1, 1])
    idx, _ = select_parents(np.array([1.0, 0.0, 0.0, 1.0]), 6, mode="sample", rng=rng, labels=labels,
                            per_class={0: 2, 1: 4})
    assert idx.tolist() == [0, 0, 3, 3, 3, 3]


def test_class_sizes_split_the_population() -> None:
    assert class_sizes(10, np.ones(3)) == {0: 4, 1: 3, 2: 3}
    assert sum(class_sizes(1000, np.array([5.0, 0.1, 94.9])).values()) == 1000
    assert class_sizes(4, np.array([1.0, 0.0, 0.0, 1000.0]))[0] >= 1


# ----------------------------------------------------------------------------------------------- calibration


def test_published_epsilon_check_and_calibration() -> None:
    # the paper / DPSDA: sigma = 5 sqrt(2), T = 20, delta = 1e-5 -> eps = 2.594; T = 10 -> 1.760
    assert gdp_epsilon(noise_multiplier=5 * math.sqrt(2), steps=20, delta=1e-5) == pytest.approx(2.594, abs=5e-4)
    assert gdp_epsilon(noise_multiplier=5 * math.sqrt(2), steps=10, delta=1e-5) == pytest.approx(1.760, abs=5e-4)
    for eps, T in ((1.0, 6), (0.1, 20), (10.0, 3)):
        sigma = pe_noise_multiplier(epsilon=eps, delta=1e-5, releases=T, noise_multiplier=None)
        assert gdp_epsilon(noise_multiplier=sigma, steps=T, delta=1e-5) <= eps * (1 + 1e-9)
        assert gdp_epsilon(noise_multiplier=sigma * 0.99, steps=T, delta=1e-5) > eps  # not wastefully large
    assert pe_noise_multiplier(epsilon=3.0, delta=1e-5, releases=20, noise_multiplier=5 * math.sqrt(2)) == 5 * 2**0.5
    with pytest.raises(ValueError, match="spends eps=2.594"):
        pe_noise_multiplier(epsilon=1.0, delta=1e-5, releases=20, noise_multiplier=5 * math.sqrt(2))
    assert pe_noise_multiplier(epsilon=math.inf, delta=1e-5, releases=5, noise_multiplier=None) == 0.0


# ---------------------------------------------------------------------------------------------- APIs (stubs)


class _StubDiffusion:
    """Images = public label / 10 everywhere plus noise scaled by the degree: conditions are visible in pixels."""

    num_classes = 10
    record = {"name": "stub"}

    def random(self, labels: np.ndarray, *, generator: torch.Generator) -> np.ndarray:
        base = np.clip(np.asarray(labels, dtype=np.float32) / 10.0, 0, 1)
        return np.broadcast_to(base[:, None, None, None], (len(labels), 1, 4, 4)).copy()

    def variation(self, images: np.ndarray, labels: np.ndarray, *, degree: float, generator: torch.Generator):
        noise = torch.rand(images.shape, generator=generator).numpy() * degree * 0.01
        return np.clip(images + noise, 0, 1).astype(np.float32)


def test_diffusion_api_carries_public_conditions_through_variations() -> None:
    api = DiffusionAPI(_StubDiffusion(), np.array([7, 5, -1]), condition="random_class")
    g = torch.Generator().manual_seed(0)
    pop = api.random_api(np.array([0, 1, 2, -1, -1]), generator=g)
    assert pop.cond["public_label"][:2].tolist() == [7, 5]  # private class -> public class of the same name
    assert (pop.cond["public_label"][2:] >= 0).all()  # no match / unconditional: a random public class
    child = api.variation_api(pop.take(np.array([0, 0, 1])), degree=0.5, generator=g)
    assert child.cond["public_label"].tolist() == [7, 7, 5] and child.labels.tolist() == [0, 0, 1]
    with pytest.raises(ValueError, match="degree"):
        api.variation_api(pop, degree=0.0, generator=g)
    none = DiffusionAPI(_StubDiffusion(), np.array([-1]), condition="none")
    assert none.random_api(np.array([-1, -1]), generator=g).cond["public_label"].tolist() == [-1, -1]


class _CountingAPI(pe_api.PEAPI):
    """1-d 'images' (the value is the pixel); variations add degree * N(0, 1); counts calls."""

    name = "counting"

    def __init__(self) -> None:
        self.variation_calls: list[float] = []

    def random_api(self, labels, *, generator):
        x = torch.rand((len(labels), 1, 1, 1), generator=generator).numpy()
        return Population(x, np.asarray(labels), {"z": x[:, 0, 0, 0].copy()})

    def variation_api(self, population, *, degree, generator):
        self.variation_calls.append(degree)
        x = population.x + degree * torch.randn(population.x.shape, generator=generator).numpy()
        return Population(x.astype(np.float32), population.labels.copy(), dict(population.cond))


def test_lookahead_averages_k_variations(monkeypatch) -> None:
    cfg = load_group("method", "pe")
    cfg.lookahead = 3
    ctx = run_context(shape=(1, 1, 1), classes=["a", "b"])
    pe = pe_method.PE(cfg, ctx)
    pe.api = _CountingAPI()
    pop = pe.api.random_api(np.full(5, -1), generator=torch.Generator().manual_seed(0))
    emb = pe._lookahead_embedding(pop, 0.7, lambda x: x.reshape(len(x), -1), t=2)
    assert pe.api.variation_calls == [0.7, 0.7, 0.7]  # k variations at the iteration's degree
    expected = np.mean([pe.api.variation_api(pop, degree=0.7, generator=pe._generator("lookahead", 2, i)).x
                        .reshape(5, -1) for i in range(3)], axis=0)
    np.testing.assert_allclose(emb, expected, rtol=1e-6)
    cfg.lookahead = 0
    pe0 = pe_method.PE(cfg, ctx)
    pe0.api = _CountingAPI()
    np.testing.assert_array_equal(pe0._lookahead_embedding(pop, 0.7, lambda x: x.reshape(len(x), -1), t=0),
                                  pop.x.reshape(5, -1))
    assert pe0.api.variation_calls == []


def test_icgan_variation_moves_further_with_the_degree() -> None:
    class _Gen:
        z_dim = 4

        def decode(self, feature, *, z=None, **_: Any):
            return np.zeros((len(feature), 1, 2, 2), dtype=np.float32)

    class _Models:
        generator = _Gen()
        record: dict = {}

    class _Pool:
        feats = np.eye(8, dtype=np.float32)
        labels = np.array([0, 0, 0, 0, 1, 1, 1, 1])

        def __len__(self) -> int:
            return 8

    api = pe_api.ICGANAPI(_Models(), _Pool(), feature_noise=1.0)
    g = torch.Generator().manual_seed(0)
    pop = api.random_api(np.array([1] * 200), generator=g)
    assert set(np.argmax(pop.cond["feature"], 1).tolist()) <= {4, 5, 6, 7}  # class-1 public rows only
    moved = {}
    for s in (0.1, 1.0):
        child = api.variation_api(pop, degree=s, generator=torch.Generator().manual_seed(1))
        moved[s] = float(np.linalg.norm(child.cond["feature"] - pop.cond["feature"], axis=1).mean())
        assert np.allclose(np.linalg.norm(child.cond["feature"], axis=1), 1.0, atol=1e-5)
        assert child.labels.tolist() == pop.labels.tolist()
    assert moved[0.1] < moved[1.0] / 3
    # degree 1: z is fresh (independent of the parent's)
    child = api.variation_api(pop, degree=1.0, generator=torch.Generator().manual_seed(2))
    assert abs(np.corrcoef(child.cond["z"].ravel(), pop.cond["z"].ravel())[0, 1]) < 0.1


# ---------------------------------------------------------------------------------------------- end to end


def test_pe_runs_end_to_end_and_stays_within_budget(make_cfg, tmp_path: Path) -> None:
    from dpsyn.task import run

    cfg = make_cfg("method=pe", "dataset=fmnist_shoes", "eps=1", *TINY_PUBLIC, *TINY_PE)
    result = run(cfg, tmp_path / "run")
    events = result["privacy_events"]
    assert [e["kind"] for e in events] == ["gaussian"] * 3 and 0 < result["epsilon_spent"] <= 1.0
    sigma = events[0]["noise_multiplier"]
    assert gdp_epsilon(noise_multiplier=sigma, steps=3, delta=result["delta"]) == pytest.approx(1.0, rel=1e-6)
    assert result["accountant"].startswith("gdp")
    prov = result["sample_provenance"]
    assert [h["iteration"] for h in prov["history"]] == [0, 1, 2, 3]
    assert prov["variations_beyond_population"] == 200 - 60  # "unlimited samples": 140 more variations
    m = result["metrics"]
    assert m["pe_fd_fmnist_iter0"] > 0 and m["pe_fd_fmnist_last"] > 0 and 0 <= m["acc"] <= 1
    samples = np.load(tmp_path / "run" / "samples.npz")
    assert samples["x"].shape == (200, 1, 28, 28) and set(samples["y"].tolist()) <= {0, 1, 2}


def test_pe_conditional_with_dp_class_counts(make_cfg, tmp_path: Path) -> None:
    from dpsyn.task import run

    cfg = make_cfg("method=pe", "dataset=fmnist_shoes", "eps=1", *TINY_PUBLIC, *TINY_PE, "method.conditional=true",
                   "method.class_proportions=dp", "method.lookahead=0", *UNSCORED)
    result = run(cfg, tmp_path / "run")
    events = result["privacy_events"]
    assert len(events) == 4 and "class counts" in events[0]["label"]  # 3 histograms + the counts, one sigma
    assert len({e["noise_multiplier"] for e in events}) == 1 and result["epsilon_spent"] <= 1.0
    assert result["sample_provenance"]["labels"] == "population's classes"


class _Killed(RuntimeError):
    pass


@pytest.mark.parametrize("stage", [pytest.param("after_iteration", marks=pytest.mark.slow), "after_histogram"])
def test_resume_after_a_kill_continues_with_the_same_ledger(make_cfg, tmp_path: Path, monkeypatch, stage) -> None:
    from dpsyn.task import run

    cfg = make_cfg("method=pe", "dataset=fmnist_shoes", "eps=1", *TINY_PUBLIC, *TINY_PE, *UNSCORED,
                   "privacy.deterministic_noise=true")
    real_select, real_look = pe_method.select_parents, pe_method.PE._lookahead_embedding
    calls = {"select": 0}

    def select_then_die(*args, **kwargs):
        calls["select"] += 1
        if calls["select"] == 2:  # the second iteration's histogram was released and checkpointed
            raise _Killed
        return real_select(*args, **kwargs)

    def die_before_second_histogram(self, pop, degree, embed, t):
        if t == 1:  # one iteration complete, the second histogram not yet computed
            raise _Killed
        return real_look(self, pop, degree, embed, t)

    if stage == "after_histogram":
        monkeypatch.setattr(pe_method, "select_parents", select_then_die)
    else:
        monkeypatch.setattr(pe_method.PE, "_lookahead_embedding", die_before_second_histogram)
    with pytest.raises(_Killed):
        run(cfg, tmp_path / "run")
    ckpt = torch.load(tmp_path / "run" / "checkpoints" / "pe.pt", weights_only=False)
    if stage == "after_histogram":
        assert (ckpt["iteration"], ckpt["stage"]) == (1, "histogram") and len(ckpt["ledger"]["events"]) == 2
        saved = np.asarray(ckpt["histogram"]["thresholded"]).copy()
    else:
        assert (ckpt["iteration"], ckpt["stage"]) == (1, "done") and len(ckpt["ledger"]["events"]) == 1
    monkeypatch.undo()

    seen = {}
    if stage == "after_histogram":
        def spy(weights, *args, **kwargs):
            seen.setdefault("first", np.asarray(weights).copy())
            return real_select(weights, *args, **kwargs)

        monkeypatch.setattr(pe_method, "select_parents", spy)
    result = run(cfg, tmp_path / "run")
    labels = [e["label"] for e in result["privacy_events"]]
    # exactly T = 3 histograms in the ledger: none spent twice, none forgotten
    assert [lab.split(":")[0] for lab in labels] == ["pe histogram 1/3", "pe histogram 2/3", "pe histogram 3/3"]
    assert result["epsilon_spent"] <= 1.0
    assert [h["iteration"] for h in result["sample_provenance"]["history"]] == [0, 1, 2, 3]
    if stage == "after_histogram":
        np.testing.assert_array_equal(seen["first"], saved)  # the released histogram was reused, not recomputed
        assert "reused" in result["sample_provenance"]["history"][2]["note"]


def test_resume_refuses_another_calibration(make_cfg, tmp_path: Path, monkeypatch) -> None:
    from dpsyn.task import run

    cfg = make_cfg("method=pe", "dataset=fmnist_shoes", "eps=1", *TINY_PUBLIC, *TINY_PE, *UNSCORED)
    real_log = pe_method.PE._log_iteration

    def die(self, t, pop, *, extra):
        real_log(self, t, pop, extra=extra)
        if t == 1:
            raise _Killed

    monkeypatch.setattr(pe_method.PE, "_log_iteration", die)
    with pytest.raises(_Killed):
        run(cfg, tmp_path / "run")
    monkeypatch.undo()
    cfg2 = make_cfg("method=pe", "dataset=fmnist_shoes", "eps=2", *TINY_PUBLIC, *TINY_PE, *UNSCORED)
    with pytest.raises(ValueError, match="another configuration"):
        run(cfg2, tmp_path / "run")


def test_pe_config_errors_name_the_key(make_cfg, tmp_path: Path) -> None:
    from dpsyn.task import run

    for override, key in (("method.backend=gan", "method.backend"), ("method.degrees=[0.5,1.5]", "degree"),
                          ("method.selection=best", "method.selection")):
        cfg = make_cfg("method=pe", "dataset=fmnist_shoes", *TINY_PUBLIC, *TINY_PE, override)
        with pytest.raises(ValueError, match=key):
            run(cfg, tmp_path / "run")
    cfg = make_cfg("method=pe", "dataset=fmnist_shoes", "eps=1", *TINY_PUBLIC, *TINY_PE, "method.noise_multiplier=1.0")
    with pytest.raises(ValueError, match="noise_multiplier"):
        run(cfg, tmp_path / "run2")
