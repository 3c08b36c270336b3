"""Membership inference: privGAN's white-box attack and the black-box distance attack with its epsilon lower bound."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from dpsyn.metrics import mia

DIM = 10


def _memorising_discriminator(members: np.ndarray, seed: int, steps: int = 200) -> nn.Module:
    """An overfit toy-GAN discriminator: real = a small member set, fake = fresh draws from the data distribution.

    The fakes come from a perfect generator (the data distribution itself), so the only thing D can learn is the
    member set: its scores are pure memorisation.
    """
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    d = nn.Sequential(nn.Linear(DIM, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, 1))
    opt = torch.optim.Adam(d.parameters(), lr=1e-3)
    real = torch.as_tensor(members)
    target = torch.cat([torch.ones(len(real)), torch.zeros(2 * len(real))])
    for _ in range(steps):
        fake = torch.randn(2 * len(real), DIM, generator=gen)
        loss = nn.functional.binary_cross_entropy_with_logits(d(torch.cat([real, fake])).squeeze(1), target)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return d


@pytest.fixture(scope="module")
def overfit_gan() -> dict:
    """privGAN-style: three discriminators, each memorising its own third of 60 members."""
    rng = np.random.default_rng(0)
    members = rng.normal(size=(60, DIM)).astype(np.float32)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny MLPs: one thread is ~10x faster than several contending ones
    try:
        discs = [_memorising_discriminator(members[i::3], seed=i) for i in range(3)]
    finally:
        torch.set_num_threads(threads)
    return {"members": members, "discs": discs, "rng": rng}


# ------------------------------------------------------------------------------------------------ white-box


def test_whitebox_max_and_mean_aggregation_by_hand() -> None:
    # member 0 is memorised by D0, member 1 by D1; the two non-members get 0.6 from both
    scores = np.array([[0.9, 0.1, 0.6, 0.6], [0.1, 0.8, 0.6, 0.6]])
    out = mia.whitebox_mia(scores, np.array([True, True, False, False]))
    assert out["acc_max"] == 1.0 and out["auc_max"] == 1.0  # max: 0.9, 0.8 > 0.6
    assert out["acc_mean"] == 0.0 and out["auc_mean"] == 0.0  # mean: 0.5, 0.45 < 0.6
    assert out["baseline"] == 0.5 and out["n_discriminators"] == 2 and out["n_candidates"] == 4


def test_whitebox_attack_beats_chance_on_an_overfit_discriminator(overfit_gan: dict) -> None:
    rng = overfit_gan["rng"]
    non_members = rng.normal(size=(540, DIM)).astype(np.float32)
    candidates, is_member = mia.candidate_pool(overfit_gan["members"], non_members)
    out = mia.whitebox_mia(overfit_gan["discs"], is_member, candidates=candidates)
    assert out["baseline"] == pytest.approx(0.1)
    assert out["acc_max"] > 0.5 and out["acc_mean"] > 0.5  # >5x the random guess
    assert out["auc_max"] > 0.9 and out["auc_mean"] > 0.9
    # the same numbers from a precomputed score matrix
    matrix = mia.discriminator_scores(overfit_gan["discs"], candidates)
    assert matrix.shape == (3, 600) and ((matrix > 0) & (matrix < 1)).all()  # sigmoid applied to the logits
    assert mia.whitebox_mia(matrix, is_member) == out
    # a single discriminator only knows its own third of the members
    single = mia.whitebox_mia(matrix[0], is_member)
    assert single["n_discriminators"] == 1 and single["acc_max"] == single["acc_mean"] < out["acc_max"]


def test_whitebox_attack_is_at_chance_on_data_the_discriminators_never_saw(overfit_gan: dict) -> None:
    rng = overfit_gan["rng"]
    candidates, is_member = mia.candidate_pool(rng.normal(size=(500, DIM)).astype(np.float32),
                                               rng.normal(size=(4500, DIM)).astype(np.float32))
    out = mia.whitebox_mia(overfit_gan["discs"], is_member, candidates=candidates)
    for agg in ("max", "mean"):
        assert abs(out[f"acc_{agg}"] - out["baseline"]) < 0.05, out
        assert abs(out[f"auc_{agg}"] - 0.5) < 0.05, out


def test_whitebox_breaks_ties_at_random_and_validates_inputs() -> None:
    is_member = np.arange(1000) < 100  # members first: a stable sort of constant scores would pick them all
    out = mia.whitebox_mia(np.full((2, 1000), 0.5), is_member)
    assert abs(out["acc_max"] - 0.1) < 0.06 and out["auc_max"] == 0.5

    def conditional(x, y):  # a plain callable on numpy batches, conditioned on labels
        return x[:, 0] * (y == 1)

    x, y = np.array([[3.0], [2.0], [1.0], [0.0]]), np.array([1, 1, 1, 0])
    res = mia.whitebox_mia([conditional], np.array([True, False, False, False]), candidates=x, labels=y)
    assert res["acc_max"] == 1.0
    with pytest.raises(ValueError, match="members and non-members"):
        mia.whitebox_mia(np.ones((1, 4)), np.ones(4, bool))
    with pytest.raises(ValueError, match="shape"):
        mia.whitebox_mia(np.ones((1, 4)), np.ones(5, bool))
    with pytest.raises(ValueError, match="candidate pool"):
        mia.whitebox_mia([conditional], np.array([True, False]))
    with pytest.raises(ValueError, match="NaN"):
        mia.whitebox_mia(np.array([[np.nan, 1.0]]), np.array([True, False]))


# ------------------------------------------------------------------------------------------------ black-box


def _pool(seed: int, n: int = 200, dim: int = 20) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.random.Generator]:
    rng = np.random.default_rng(seed)
    members = rng.normal(size=(n, dim)).astype(np.float32)
    candidates, is_member = mia.candidate_pool(members, rng.normal(size=(n, dim)).astype(np.float32))
    return candidates, is_member, members, rng


def test_nearest_synthetic_distance_matches_brute_force_across_chunks() -> None:
    rng = np.random.default_rng(0)
    a, b = rng.normal(size=(37, 2, 3, 3)), rng.normal(size=(53, 2, 3, 3))  # images are flattened
    brute = np.sqrt(((a.reshape(37, 1, -1) - b.reshape(1, 53, -1)) ** 2).sum(-1)).min(1)
    np.testing.assert_allclose(mia.nearest_synthetic_distance(a, b, chunk_size=8), brute, rtol=1e-5)
    feats = mia.nearest_synthetic_distance(a, b, features=lambda z: z.reshape(len(z), -1)[:, :2], chunk_size=5)
    brute2 = np.sqrt(((a.reshape(37, 1, -1)[..., :2] - b.reshape(1, 53, -1)[..., :2]) ** 2).sum(-1)).min(1)
    np.testing.assert_allclose(feats, brute2, rtol=1e-5)


def test_distance_attack_detects_copied_members() -> None:
    candidates, is_member, members, rng = _pool(0)
    copies = members + 0.05 * rng.normal(size=members.shape).astype(np.float32)
    synthetic = np.concatenate([copies, rng.normal(size=(200, 20)).astype(np.float32)])
    out = mia.distance_mia(candidates, is_member, synthetic, seed=0)
    assert out["auc"] > 0.99
    assert out["eps_lb"] > 2.0 and out["confidence"] == 0.95
    assert out["n_calibration"] == 200 and out["n_report"] == 200
    assert out["mean_distance_members"] < out["mean_distance_non_members"]


def test_distance_attack_is_at_chance_on_independent_samples() -> None:
    bounds = []
    for seed in range(5):
        candidates, is_member, _, rng = _pool(seed)
        out = mia.distance_mia(candidates, is_member, rng.normal(size=(400, 20)).astype(np.float32), seed=seed)
        assert abs(out["auc"] - 0.5) < 0.1, out
        bounds.append(out["eps_lb"])
    assert max(bounds) < 0.3 and np.mean(bounds) < 0.1, bounds


def test_threshold_is_chosen_on_the_calibration_half_only(monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(0)
    is_member = np.arange(400) < 200
    score = rng.normal(size=400) + 1.5 * is_member
    calibration = mia.split_calibration(is_member, fraction=0.5, seed=1)
    report = ~calibration
    base = mia.epsilon_lower_bound(score, is_member, calibration=calibration)
    # by construction: scrambling the reporting half changes the reported rates, never the threshold
    scrambled = score.copy()
    scrambled[report] = rng.permutation(scrambled[report]) * 3 - 1
    other = mia.epsilon_lower_bound(scrambled, is_member, calibration=calibration)
    assert other["threshold"] == base["threshold"]
    assert (other["tpr"], other["fpr"]) != (base["tpr"], base["fpr"])
    # and by inspection: the selection function receives exactly the calibration candidates
    seen = []
    real_select = mia._select_threshold

    def spy(s, m, alpha):
        seen.append((s.copy(), m.copy(), alpha))
        return real_select(s, m, alpha)

    monkeypatch.setattr(mia, "_select_threshold", spy)
    mia.epsilon_lower_bound(score, is_member, calibration=calibration, confidence=0.9)
    (s, m, alpha), = seen
    np.testing.assert_array_equal(s, score[calibration])
    np.testing.assert_array_equal(m, is_member[calibration])
    assert alpha == pytest.approx(0.05)  # (1 - confidence) / 2: the TPR and FPR bounds hold jointly at 90%
    # the default split is stratified, disjoint, and half of each group
    mask = mia.split_calibration(is_member, seed=3)
    assert mask[is_member].sum() == 100 and mask[~is_member].sum() == 100
    seen.clear()
    out = mia.distance_mia(*_pool(1)[:2], _pool(1)[2], seed=2)
    assert len(seen) == 1 and len(seen[0][0]) == out["n_calibration"] == 200 and out["n_report"] == 200


def test_epsilon_lower_bound_is_sound_and_has_power_on_randomised_response() -> None:
    """A membership signal that is exactly eps-DP (randomised response): the 95% bound may exceed eps in <= ~5% of
    trials, and is well above 0 otherwise."""
    eps = 1.0
    p = np.exp(eps) / (1 + np.exp(eps))
    is_member = np.arange(2000) < 1000
    bounds = []
    for trial in range(200):
        rng = np.random.default_rng(trial)
        bit = np.where(is_member, rng.random(2000) < p, rng.random(2000) < 1 - p).astype(float)
        bounds.append(mia.epsilon_lower_bound(bit, is_member, seed=trial)["eps_lb"])
    bounds = np.array(bounds)
    assert (bounds > eps).mean() <= 0.08
    assert bounds.mean() > 0.6


def test_clopper_pearson_and_epsilon_formula() -> None:
    lo, hi = mia.clopper_pearson(np.array([0, 10]), np.array([10, 10]), 0.025)
    assert lo[0] == 0.0 and hi[1] == 1.0
    assert hi[0] == pytest.approx(1 - 0.025 ** (1 / 10)) and lo[1] == pytest.approx(0.025 ** (1 / 10))
    lo3, _ = mia.clopper_pearson(3, 10, 0.05)
    _, hi7 = mia.clopper_pearson(7, 10, 0.05)
    assert lo3 == pytest.approx(1 - hi7)  # symmetry
    assert mia.epsilon_from_rates(0.5, 0.05) == pytest.approx(np.log(10))
    assert mia.epsilon_from_rates(0.05, 0.5) == pytest.approx(0.0)  # worse than chance: no evidence
    assert mia.epsilon_from_rates(0.99, 0.9) == pytest.approx(np.log(0.1 / 0.01))  # the complementary test
    with pytest.raises(ValueError, match="alpha"):
        mia.clopper_pearson(1, 2, 0.0)


def test_monte_carlo_attack_finds_copied_members_and_is_at_chance_on_independent_samples() -> None:
    from dpsyn.metrics.mia import monte_carlo_mia

    rng = np.random.default_rng(0)
    members, non_members = rng.normal(size=(50, 30)), rng.normal(size=(450, 30))
    candidates = np.concatenate([members, non_members])
    is_member = np.arange(500) < 50
    # a generator that partly memorises: fresh samples of the distribution plus noisy copies of every member
    leaky = np.concatenate([rng.normal(size=(1000, 30)), np.repeat(members, 4, axis=0) + 0.01 * rng.normal(size=(200, 30))])
    out = monte_carlo_mia(candidates, is_member, leaky, n_components=10, seed=0)
    assert out["baseline"] == pytest.approx(0.1)
    assert out["acc"] > 0.35 and out["auc"] > 0.85  # measured: 0.44 and 0.94
    # samples independent of a fresh pool each time: chance (0.1) on average
    accs = [monte_carlo_mia(rng.normal(size=(500, 30)), is_member, rng.normal(size=(1200, 30)), n_components=10,
                            seed=s)["acc"] for s in range(10)]
    assert abs(np.mean(accs) - 0.1) < 0.05
    with pytest.raises(ValueError, match="percentile"):
        monte_carlo_mia(candidates, is_member, leaky, percentile=0)
