"""The audit's mechanism harnesses: every DP mechanism dpsyn uses, run as the methods call it (the same functions, not
a re-implementation), on a worst-case neighbouring pair, its outputs turned into test scores.

Each row of :data:`MECHANISMS` is a :class:`Mechanism` whose ``run(eps, delta, trials, noise)`` calibrates the
mechanism to ``(eps, delta)`` as the method does, runs it ``trials`` times on each side of the pair and returns
:class:`Scores`: the scores (larger = more like D1) and ``eps_claimed``, what the ledger charges for that single
release at the audited parameters (the same event type the method adds, composed by
:class:`~dpsyn.privacy.PrivacyLedger`). :mod:`dpsyn.privacy.audit.runner` turns the scores into lower bounds.

**Many trials per call.** The Gaussian and Laplace mechanisms add independent noise to each coordinate of a sum. A
call on a set of canary rows, each with its whole contribution (norm = the sensitivity) on its own coordinate, with
half of the coordinates left without a canary, gives one draw of the pair's D1 side per canary coordinate and one
of its D0 side per empty coordinate: coordinate j depends only on canary j and on its own noise. Which coordinates
carry canaries is redrawn at every call. Correlated noise between coordinates would break the trials' independence,
and the audit would catch it (the two halves would separate within a call). Mechanisms that answer queries (PATE)
are run on a batch of independent queries.

The sampling (Poisson inclusion) is not part of the audited releases, which are audited at sampling rate 1 (no
amplification claimed); its distribution is tested separately (tests/test_audit.py). One row is subsampled on
purpose: ``gs_wgan_iteration``, where b releases share one draw of a critic, so that charging them as b separate
draws (the GS-WGAN authors' analysis) shows up as a lower bound above the claim. One row runs several iterations:
``gs_wgan_hidden_state``, GS-WGAN over 10 iterations of 3 critics that keep state (the method's draw, schedule and
sanitizer; score: the exact likelihood ratio of a trial's releases), charged as the ledger charges the iterations;
under the authors' schedule and critics whose state reveals the draws (the review's toy) the same machinery exceeds
even the tightest per-step charge (tests/test_audit.py).

Torch, Opacus and the methods are imported inside the harnesses that need them.
"""

from __future__ import annotations

import math
import sys
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass
class Scores:
    """What a mechanism's runs gave: the test scores on each side (larger = more like D1), and the claim."""

    scores0: np.ndarray
    scores1: np.ndarray
    eps_claimed: float
    params: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Mechanism:
    """One audited mechanism: ``run(eps, delta, trials, noise)`` returns its :class:`Scores` (``noise``: a
    :class:`NoiseSource`, which hands out its DP generators)."""

    name: str
    what: str
    run: Callable[..., Scores]


class NoiseSource:
    """DP generators for the audited mechanisms: OS entropy, or seeded from ``seed`` when ``deterministic`` (tests:
    a reproducible audit)."""

    def __init__(self, *, deterministic: bool, seed: int, shared: dict[Any, Any] | None = None) -> None:
        self.deterministic, self.seed, self.calls = bool(deterministic), int(seed), 0
        self.shared = {} if shared is None else shared  # outputs two rows share (the DP-SGD steps)

    def torch(self) -> Any:
        from dpsyn.privacy import dp_generator

        self.calls += 1
        return dp_generator(deterministic=self.deterministic, seed=self.seed * 1009 + self.calls)

    def numpy(self) -> np.random.Generator:
        from dpsyn.privacy import dp_numpy_generator

        self.calls += 1
        return dp_numpy_generator(deterministic=self.deterministic, seed=self.seed * 1009 + self.calls)


def _claimed(*events: Any, delta: float) -> float:
    """The epsilon the ledger charges for ``events`` (one release's) alone."""
    from dpsyn.privacy import PrivacyLedger

    ledger = PrivacyLedger(target_epsilon=math.inf, delta=delta)
    for event in events:
        ledger.add(event)
    return float(ledger.epsilon(delta))


def _calibrate(claim: Callable[[float], float], eps: float, lo: float = 1e-3, hi: float = 1e4) -> float:
    """The smallest noise scale s in [lo, hi] whose ``claim(s)`` is <= ``eps`` (bisection; claim decreasing in s)."""
    for _ in range(80):
        mid = math.sqrt(lo * hi)
        lo, hi = (lo, mid) if claim(mid) <= eps else (mid, hi)
    return hi


ARMS = 8  # neighbouring pairs (vote distances) tried for a mechanism with a discrete output


def _split_coordinates(d: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    perm = rng.permutation(d)
    return np.sort(perm[: d // 2]), np.sort(perm[d // 2 :])


def _progress(total: int, desc: str) -> Any:
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit="trial", unit_scale=True, leave=False, file=sys.stderr,
                disable=None)


# ---------------------------------------------------------------------------------------------------------------
# the mechanisms, as the methods call them


def _dpsgd_outputs(eps: float, delta: float, trials: int, noise: NoiseSource, *, accountant: str = "rdp",
                   dim: int = 1024, clip: float = 1.0) -> dict[str, Any]:
    """DP-SGD at sampling rate 1 with Opacus's DPOptimizer as :func:`dpsyn.lit.dpsgd.dp_optimizer` builds it for
    dp_gan (GANModule) and dp_dre: a linear layer whose per-sample gradient of row j is ``clip * e_j`` (a canary of
    norm C), on half of the coordinates. The released quantity is the privatised gradient (what the inner optimizer
    receives: SGD with lr 1 here, so it is the parameter change; Adam in the methods is post-processing), scaled
    back by ``batch / C``.

    Returns the canary coordinates (D1), the empty coordinates of the same steps (D0 of ``dpsgd_step``) and the
    outputs of GANModule's step for an empty Poisson batch (:func:`dpsyn.lit.gan.noise_only_step`, D0 of
    ``dpsgd_empty_batch``), computed once per audit and shared by the rows. ``dpsgd_split_step`` audits dp_gan's
    default step (:func:`dpsyn.lit.gan.split_dp_step`) on the same canaries, with a fixed batch of data-independent
    "fake" rows whose known unclipped gradient is subtracted from the output (post-processing with public
    information) before scoring."""
    key = ("dpsgd", eps, delta, trials, accountant)
    if key in noise.shared:
        return noise.shared[key]
    import torch
    from opacus import GradSampleModule

    from dpsyn.lit import dpsgd, gan
    from dpsyn.privacy import SampledGaussianEvent, dpsgd_noise_multiplier

    nm = dpsgd_noise_multiplier(epsilon=eps, delta=delta, sample_rate=1.0, steps=1, accountant=accountant)
    claimed = _claimed(SampledGaussianEvent(sampling="poisson", noise_multiplier=nm, sample_rate=1.0, steps=1,
                                            accountant=accountant,
                                            label="one DP-SGD step at sampling rate 1"), delta=delta)
    half = dim // 2
    layer = torch.nn.Linear(dim, 1, bias=False)
    torch.nn.init.zeros_(layer.weight)
    gsm = GradSampleModule(layer, loss_reduction="sum")
    opt = dpsgd.dp_optimizer(torch.optim.SGD(gsm.parameters(), lr=1.0), noise_multiplier=nm, max_grad_norm=clip,
                             expected_batch_size=half, generator=noise.torch())
    layout = np.random.default_rng(noise.seed)
    out: dict[str, list[np.ndarray]] = {"canary": [], "empty": [], "empty_batch": [], "split_canary": [],
                                        "split_empty": []}
    n = 0
    eye = torch.eye(dim) * clip
    fake = torch.from_numpy(np.random.default_rng(noise.seed + 2).standard_normal((4, dim)).astype(np.float32))
    # the fake rows' gradients clipped per row to `clip` and averaged (what split_dp_step adds), in the released units
    f64 = fake.double()
    clipped = f64 * (clip / f64.norm(dim=1, keepdim=True)).clamp(max=1.0)
    fake_term = (clipped.mean(0) * half / clip).numpy()

    def released(step: Callable[[], None]) -> np.ndarray:
        before = layer.weight.detach().clone()
        step()
        return ((before - layer.weight.detach()) * half / clip).flatten().double().numpy()

    def canary_step(rows: torch.Tensor) -> None:
        opt.zero_grad(set_to_none=True)
        gsm(rows).sum().backward()
        opt.step()

    with _progress(trials, "dpsgd") as bar, warnings.catch_warnings():
        # the canary rows need no gradient, so torch notes that Opacus's full backward hooks fire on module outputs
        warnings.filterwarnings("ignore", message="Full backward hook is firing")
        while n < trials:
            canary, empty = _split_coordinates(dim, layout)
            rows = eye[torch.from_numpy(canary)]
            g = released(lambda: canary_step(rows))
            out["canary"].append(g[canary])
            out["empty"].append(g[empty])
            if sum(len(a) for a in out["empty_batch"]) < trials:
                out["empty_batch"].append(released(lambda: gan.noise_only_step(opt)))
            g = released(lambda: gan.split_dp_step(opt, gsm, fake_loss=lambda: gsm(fake).sum(),
                                                   real_loss=lambda: gsm(rows).sum())) - fake_term
            out["split_canary"].append(g[canary])
            out["split_empty"].append(g[empty])
            n += len(canary)
            bar.update(min(n, trials) - bar.n)
    gsm.remove_hooks()
    res = {k: np.concatenate(v)[:trials] for k, v in out.items()}
    res.update(claimed=claimed, params={"noise_multiplier": nm, "max_grad_norm": clip, "sample_rate": 1.0,
                                        "accountant": accountant, "dim": dim})
    noise.shared[key] = res
    return res


def _dpsgd(eps: float, delta: float, trials: int, noise: NoiseSource, *, empty_batch: bool = False,
           split: bool = False) -> Scores:
    """One DP-SGD row: D1 = canary coordinates, D0 = empty coordinates of the same steps, or the noise-only step
    for an empty Poisson batch (``empty_batch``); ``split``: the same for dp_gan's split step. See
    :func:`_dpsgd_outputs`."""
    o = _dpsgd_outputs(eps, delta, trials, noise)
    if split:
        return Scores(o["split_empty"], o["split_canary"], o["claimed"], {**o["params"], "step": "split"})
    return Scores(o["empty_batch"] if empty_batch else o["empty"], o["canary"], o["claimed"], o["params"])


def _dp_mge(eps: float, delta: float, trials: int, noise: NoiseSource, *, calibration: str = "classic",
            dim: int = 128) -> Scores:
    """dp_mge's release (:func:`dpsyn.methods.dp_mge.dp_moments`, sigmas from its ``plan_releases``, the default
    unconditional estimator): canary features ``e_j`` (norm 1, as the unit-ball clip guarantees). The test is the
    likelihood ratio of coordinate j's two released sums, ``s1_j / sigma_mean^2 + s2_j / sigma_second^2``."""
    from dpsyn.methods import dp_mge

    rel = dp_mge.plan_releases(epsilon=eps, delta=delta, calibration=calibration, mean_share=0.5, count_share=0.0)
    sm, ss = rel["mean"].sigma, rel["second_moment"].sigma
    claimed = _claimed(rel["mean"].event("audit: sum of features"),
                       rel["second_moment"].event("audit: sum of squared features"), delta=delta)
    layout, rng = np.random.default_rng(noise.seed), noise.numpy()
    s0, s1, n = [], [], 0
    eye = np.eye(dim)
    with _progress(trials, f"dp_mge_{calibration}") as bar:
        while n < trials:
            canary, empty = _split_coordinates(dim, layout)
            est = dp_mge.dp_moments(eye[canary], np.zeros(len(canary), dtype=np.int64), 1, sigma_mean=sm,
                                    sigma_second=ss, sigma_counts=None, rng=rng)
            count = float(est.counts[0])  # the declared-public n
            score = est.mean[0] * count / sm**2 + est.second[0] * count / ss**2
            s0.append(score[empty])
            s1.append(score[canary])
            n += len(canary)
            bar.update(min(n, trials) - bar.n)
    return Scores(np.concatenate(s0)[:trials], np.concatenate(s1)[:trials], claimed,
                  {"sigma_mean": sm, "sigma_second": ss, "calibration": calibration})


def _dp_mepf(eps: float, delta: float, trials: int, noise: NoiseSource, *, calibration: str = "classic") -> Scores:
    """dp_mepf's release of one embedding (:func:`dpsyn.methods.dp_mepf.release_means`, sigma from
    :func:`dpsyn.privacy.gaussian_sigma` as dp_mepf calibrates each share, sensitivity 1, charged as an
    ``ApproxDPEvent`` of that share): sums with a canary of norm 1 on half of the coordinates."""
    from dpsyn.methods import dp_mepf
    from dpsyn.privacy import ApproxDPEvent, gaussian_sigma

    sigma = gaussian_sigma(epsilon=eps, delta=delta, sensitivity=1.0, calibration=calibration)
    claimed = _claimed(ApproxDPEvent(epsilon=eps, delta=delta, label="audit: one dp_mepf embedding"), delta=delta)
    layout, rng = np.random.default_rng(noise.seed), noise.numpy()
    dim, n_rows = 2 * trials, 1000.0
    canary, empty = _split_coordinates(dim, layout)
    sums = np.zeros((1, dim))
    sums[0, canary] = 1.0
    released = dp_mepf.release_means(sums, np.array([n_rows]), sigma, rng)[0].astype(np.float64) * n_rows
    return Scores(released[empty], released[canary], claimed, {"sigma": sigma, "calibration": calibration})


def _pe_histogram(eps: float, delta: float, trials: int, noise: NoiseSource, *, dim: int = 16384) -> Scores:
    """PE's DP nearest-neighbour histogram (:func:`dpsyn.methods.pe.histogram.dp_nn_histogram`, faiss search, sigma
    for one histogram by :func:`dpsyn.privacy.gdp_noise_multiplier`, charged as PE's ``GaussianEvent``): synthetic
    points far apart, private canaries on half of them (each votes for its own point)."""
    from dpsyn.methods.pe import histogram
    from dpsyn.privacy import GaussianEvent, gdp_noise_multiplier

    sigma = gdp_noise_multiplier(epsilon=eps, steps=1, delta=delta)
    claimed = _claimed(GaussianEvent(noise_multiplier=sigma, count=1, label="audit: one PE histogram"), delta=delta)
    layout, rng = np.random.default_rng(noise.seed), noise.numpy()
    synthetic = (np.random.default_rng(noise.seed + 1).standard_normal((dim, 16)) * 100.0).astype(np.float32)
    s0, s1, n = [], [], 0
    with _progress(trials, "pe_histogram") as bar:
        while n < trials:
            canary, empty = _split_coordinates(dim, layout)
            h = histogram.dp_nn_histogram(synthetic[canary], synthetic, noise_multiplier=sigma, threshold=0.0,
                                          rng=rng)
            s0.append(h.noisy[empty])
            s1.append(h.noisy[canary])
            n += len(canary)
            bar.update(min(n, trials) - bar.n)
    return Scores(np.concatenate(s0)[:trials], np.concatenate(s1)[:trials], claimed, {"noise_multiplier": sigma})


def _pate_claim(sigma_threshold: float, sigma: float, threshold: float, delta: float) -> float:
    from dpsyn.privacy import PATEEvent

    return _claimed(PATEEvent(sigma_threshold=sigma_threshold, sigma=sigma, threshold=threshold, queries=1,
                              answered=1, bound="data_independent", label="audit: one Confident-GNMax query"),
                    delta=delta)


def _gnmax(eps: float, delta: float, trials: int, noise: NoiseSource, *, part: str, arms: int = ARMS,
           chunk: int = 250_000) -> Scores:
    """Confident-GNMax (:func:`dpsyn.privacy.confident_gnmax`) on one query, charged as a data-independent
    ``PATEEvent`` of one query. Neighbours: one teacher moves its vote. ``part="threshold"``: the released bit is
    "answered", the max count one vote apart (GNMax noise 10x the threshold noise, so the claim is the threshold's);
    ``part="argmax"``: always answered, the released bit is "label = bin 1", the gap between the bins one vote apart
    each way (threshold noise 10x). Arms: several distances from the decision (the output is a bit, so the test's
    threshold is the vote distance), chosen on the first half of the trials; ``trials // arms`` trials per arm."""
    import torch

    from dpsyn.privacy import confident_gnmax

    ratio, trials = 10.0, max(trials // arms, 100)
    if part == "threshold":
        s1 = _calibrate(lambda s: _pate_claim(s, ratio * s, 0.0, delta), eps)
        s2 = ratio * s1
        threshold = 200.0
        top = threshold - np.round(np.linspace(-1.0, 4.0, arms) * s1)  # the max count on D1: every teacher
        teachers = int(top.max())  # (the largest ensemble; each arm has its own)
        v1 = np.stack([top, np.zeros(arms)], 1)
        v0 = np.stack([top - 1, np.ones(arms)], 1)  # one teacher moves to the other bin
    elif part == "argmax":
        s2 = _calibrate(lambda s: _pate_claim(ratio * s, s, -1e9, delta), eps)
        s1, threshold, teachers = ratio * s2, -1e9, 400
        gap = np.round(np.linspace(-1.0, 4.0, arms) * math.sqrt(2.0) * s2)  # votes(bin 0) - votes(bin 1) on D1
        b1 = (teachers - gap) / 2
        v1 = np.stack([teachers - b1, b1], 1)
        v0 = np.stack([teachers - b1 + 1, b1 - 1], 1)  # one teacher moves from bin 1 to bin 0
    else:
        raise ValueError(f"part={part!r}")
    claimed = _pate_claim(s1, s2, threshold, delta)
    gen = noise.torch()
    out0, out1 = np.zeros((arms, 0)), np.zeros((arms, 0))
    with _progress(trials, f"confident_gnmax_{part}") as bar:
        while out0.shape[1] < trials:
            m = min(chunk, trials - out0.shape[1])
            for v, side in ((v0, 0), (v1, 1)):
                votes = torch.from_numpy(np.repeat(v, m, axis=0))
                answered, label = confident_gnmax(votes, sigma_threshold=s1, sigma=s2, threshold=threshold,
                                                  generator=gen)
                bit = (answered if part == "threshold" else label == 1).double().numpy().reshape(arms, m)
                if side == 0:
                    out0 = np.concatenate([out0, bit], 1)
                else:
                    out1 = np.concatenate([out1, bit], 1)
            bar.update(out0.shape[1] - bar.n)
    return Scores(out0, out1, claimed, {"sigma_threshold": s1, "sigma": s2, "threshold": threshold,
                                        "teachers": teachers, "bound": "data_independent"})


def _g_pate(eps: float, delta: float, trials: int, noise: NoiseSource, *, arms: int = ARMS,
            chunk: int = 20_000) -> Scores:
    """G-PATE's DPGradAgg (:func:`dpsyn.methods.g_pate.dp_grad_agg`: project, clip, discretise, Confident-GNMax,
    back-project) on one projected coordinate per sample, 2 bins, the paper's threshold-to-GNMax noise ratio of 3,
    charged as a data-independent ``PATEEvent`` per query. Neighbours: teacher 0's gradient moves from bin 1 to
    bin 0 on every sample; each sample is one query (independent noise). Arms: vote gaps, as for GNMax, with
    ``trials // arms`` trials each."""
    import torch

    from dpsyn.methods import g_pate

    teachers, threshold, trials = 100, 0.0, max(trials // arms, 100)
    s2 = _calibrate(lambda s: _pate_claim(3.0 * s, s, threshold, delta), eps)
    s1 = 3.0 * s2
    claimed = _pate_claim(s1, s2, threshold, delta)
    gap = np.round(np.linspace(-1.0, 4.0, arms) * math.sqrt(2.0) * s2).astype(int)
    ones_d1 = np.clip((teachers - gap) // 2, 1, teachers)  # teachers voting bin 1 on D1 (teacher 0 among them)
    gen = noise.torch()
    out = {0: np.zeros((arms, 0)), 1: np.zeros((arms, 0))}
    with _progress(trials, "g_pate_dpgradagg") as bar:
        while out[0].shape[1] < trials:
            m = min(chunk, trials - out[0].shape[1])
            per_arm = np.repeat(ones_d1, m)  # (arms * m,) samples
            b = len(per_arm)
            rank = torch.arange(teachers)[:, None]
            for side in (0, 1):
                ones = torch.from_numpy(per_arm - (1 - side))[None, :]  # D0: teacher 0 votes bin 0
                vote_one = (rank < ones) if side == 1 else ((rank >= 1) & (rank <= ones))
                grads = torch.where(vote_one, 0.5, -0.5).to(torch.float32)[:, :, None]  # (teachers, b, 1)
                proj = torch.ones(b, 1, 1)
                g_hat, _, _ = g_pate.dp_grad_agg(grads, proj, clip=1.0, bins=2, sigma_threshold=s1, sigma=s2,
                                                 threshold=threshold, generator=gen)
                out[side] = np.concatenate([out[side], g_hat.double().numpy().reshape(arms, m)], 1)
            bar.update(out[0].shape[1] - bar.n)
    return Scores(out[0], out[1], claimed, {"sigma_threshold": s1, "sigma": s2, "threshold": threshold,
                                            "teachers": teachers, "bins": 2, "clip": 1.0,
                                            "bound": "data_independent"})


def _gs_wgan_claim(eps: float, delta: float, accountant: str) -> tuple[float, float]:
    """GS-WGAN's sigma (in units of C) for one release at eps, and the epsilon claimed for it, charged as gs_wgan
    charges it (:func:`dpsyn.methods.gs_wgan.gs_wgan_sigma`, :func:`~dpsyn.methods.gs_wgan.privacy_event`) for one
    critic and one release an iteration: a uniform-choice event of noise multiplier sigma / 2 (sensitivity 2C) on one
    of one critic (the Gaussian mechanism itself)."""
    from dpsyn.methods import gs_wgan

    sigma = gs_wgan.gs_wgan_sigma(epsilon=eps, delta=delta, critics=1, iterations=1, batch_size=1)
    claimed = _claimed(gs_wgan.privacy_event(sigma=sigma, critics=1, batch_size=1, iterations=1, bound="convexity",
                                             label="audit: one sanitised gradient"), delta=delta)
    return sigma, claimed


def _gs_wgan(eps: float, delta: float, trials: int, noise: NoiseSource, *, accountant: str = "rdp") -> Scores:
    """GS-WGAN's gradient sanitizer (:func:`dpsyn.methods.gs_wgan.sanitize`: clip each per-sample gradient to C, add
    N(0, (sigma C)^2)), charged as gs_wgan charges it, a uniform-choice event of noise multiplier sigma / 2
    (sensitivity 2C), here of one critic (the critic holding the canary is the one drawn). Neighbours: the
    critic's gradient into a fake is +C e on D1, -C e on D0 (the worst case: distance 2C)."""
    import torch

    from dpsyn.methods import gs_wgan

    sigma, claimed = _gs_wgan_claim(eps, delta, accountant)
    gen, clip = noise.torch(), 1.0
    grad = torch.full((trials, 1), 3.0 * clip)  # norm 3C, clipped to C
    out1 = gs_wgan.sanitize(grad, clip=clip, sigma=sigma, generator=gen)[:, 0].double().numpy()
    out0 = gs_wgan.sanitize(-grad, clip=clip, sigma=sigma, generator=gen)[:, 0].double().numpy()
    return Scores(out0, out1, claimed, {"sigma": sigma, "clip": clip, "accountant": accountant})


def _gs_wgan_band(eps: float, delta: float, trials: int, noise: NoiseSource, *, accountant: str = "rdp") -> Scores:
    """GS-WGAN's sanitizer in a band (``method.output_frequencies``: :func:`dpsyn.methods.gs_wgan.sanitize` with a
    basis: the gradient written as its low DCT coefficients, clipped to C and noised there, mapped back), charged as
    without the band. Images of 4x4 pixels and their 2x2 lowest frequencies; neighbours: the critic's gradient is
    +3C along the first basis image on D1, -3C on D0 (clipped: distance 2C). Score: the output's coefficient on that
    basis image."""
    from dpsyn.methods import gs_wgan
    from dpsyn.nets.lowpass import dct_basis

    sigma, claimed = _gs_wgan_claim(eps, delta, accountant)
    gen, clip = noise.torch(), 1.0
    basis = dct_basis((1, 4, 4), 2)
    first = basis[:, 0]
    scores = []
    for sign in (-1.0, 1.0):
        grad = (sign * 3.0 * clip * first).expand(trials, -1).reshape(trials, 1, 4, 4)
        out = gs_wgan.sanitize(grad, clip=clip, sigma=sigma, generator=gen, basis=basis)
        scores.append((out.flatten(1) @ first).double().numpy())
    return Scores(scores[0], scores[1], claimed, {"sigma": sigma, "clip": clip, "accountant": accountant,
                                                  "band": "2x2 of 4x4"})


ITERATION_CRITICS, ITERATION_BATCH = 10, 16  # the gs_wgan_iteration row: rate 1/10, 16 releases an iteration


def _gs_wgan_iteration(eps: float, delta: float, trials: int, noise: NoiseSource, *,
                       accountant: str = "rdp") -> Scores:
    """One GS-WGAN iteration as the ledger charges it (:func:`dpsyn.methods.gs_wgan.privacy_event`, with the sigma
    of :func:`~dpsyn.methods.gs_wgan.gs_wgan_sigma`): a critic drawn uniformly from K, then b sanitised gradients
    (:func:`~dpsyn.methods.gs_wgan.sanitize`), all read through that critic. Neighbours (add/remove, the
    accountant's): on D0 every critic's gradient into a fake is -3C e (clipped to -C); on D1 the critic holding the
    canary (index 0) gives +3C e. Score: the sum of the b outputs along e. Unlike the rows above, this one is
    subsampled (rate 1/K): it is the row that tells whether the b releases of an iteration are charged as one draw
    (they are) or as b independent draws (the GS-WGAN authors' analysis, which it catches: tests/test_audit.py)."""
    import torch

    from dpsyn.methods import gs_wgan

    K, b, clip = ITERATION_CRITICS, ITERATION_BATCH, 1.0
    sigma = gs_wgan.gs_wgan_sigma(epsilon=eps, delta=delta, critics=K, iterations=1, batch_size=b)
    claimed = _claimed(gs_wgan.privacy_event(sigma=sigma, critics=K, batch_size=b, iterations=1, bound="convexity",
                                             label="audit: one gs_wgan iteration"), delta=delta)
    gen = noise.torch()
    scores = []
    for side in (0, 1):
        drawn = gs_wgan.draw_critics(K, trials, gen)  # the critic of each trial, drawn as fit draws it
        sign = torch.where((drawn == 0) & (side == 1), 1.0, -1.0)
        grad = (3.0 * clip * sign)[:, None, None].expand(trials, b, 1).reshape(trials * b, 1)
        out = gs_wgan.sanitize(grad, clip=clip, sigma=sigma, generator=gen)
        scores.append(out.view(trials, b).sum(1).double().numpy())
    return Scores(scores[0], scores[1], claimed, {"sigma": sigma, "clip": clip, "accountant": accountant,
                                                  "critics": K, "batch_size": b})


HIDDEN_CRITICS, HIDDEN_ITERATIONS = 3, 10  # the gs_wgan_hidden_state row: 3 critics, 10 iterations of one release


def _hidden_means(j: np.ndarray, state: np.ndarray, side: int, dynamics: str) -> np.ndarray:
    """The toy critics' outputs (in units of C, before the clip) when critic ``j`` is drawn, given its ``state``.

    Critic 0 holds the canary: +3C on D1, -3C on D0 (clipped to +-C). The others keep state:

    * ``own`` (what GS-WGAN's critics can do): a critic's output depends on its own training history, -3C if it
      trained at the previous iteration, else +3C; ``state`` is the critic trained then (-1: none).
    * ``changed`` (the review's toy, not a GS-WGAN critic: an unchanged critic cannot see another's training): the
      unchanged critics give +3C if critic 0 trained at the previous iteration, else -3C; ``state`` is 1 or 0.
    """
    canary = 3.0 if side == 1 else -3.0
    if dynamics == "own":
        other = np.where(state == j, -3.0, 3.0)
    else:
        other = np.where(state == 1, 3.0, -3.0)
    return np.where(j == 0, canary, other)


def hidden_state_releases(*, critics: int, iterations: int, sigma: float, schedule: str, dynamics: str, side: int,
                          trials: int, generator: Any) -> np.ndarray:
    """(trials, iterations) sanitised releases of a toy GS-WGAN whose critics keep state: each iteration draws a
    critic (:func:`dpsyn.methods.gs_wgan.draw_critics`), the critic :func:`~dpsyn.methods.gs_wgan.trained_critic`
    names trains (its state moves), and the drawn critic's gradient is sanitised (:func:`~dpsyn.methods.gs_wgan
    .sanitize`, clip C = 1, b = 1) — the method's own functions."""
    import torch

    from dpsyn.methods import gs_wgan

    drawn = gs_wgan.draw_critics(critics, trials * iterations, generator).view(trials, iterations).numpy()
    trained_before = np.full(trials, -1)  # the critic trained at the previous iteration
    means = np.empty((trials, iterations))
    for t in range(iterations):
        j = drawn[:, t]
        state = trained_before if dynamics == "own" else (trained_before == 0).astype(int)
        means[:, t] = _hidden_means(j, state, side, dynamics)
        trained = gs_wgan.trained_critic(t, critics, torch.from_numpy(j), schedule)
        trained_before = np.asarray(trained.numpy() if isinstance(trained, torch.Tensor) else
                                    np.full(trials, trained))
    grad = torch.from_numpy(means.reshape(-1, 1)).float()
    out = gs_wgan.sanitize(grad, clip=1.0, sigma=sigma, generator=generator)
    return out.view(trials, iterations).double().numpy()


def hidden_state_log_likelihood(y: np.ndarray, *, critics: int, sigma: float, schedule: str, dynamics: str,
                                side: int) -> np.ndarray:
    """log p(y | D_side) of each trial's releases under the toy (:func:`hidden_state_releases`), by a forward pass
    over the hidden state (the critic trained at the previous iteration): the optimal statistic's ingredient."""
    from scipy.special import logsumexp
    from scipy.stats import norm

    trials, iterations = y.shape
    lk = -math.log(critics)
    if dynamics == "changed" and schedule == "drawn":
        # only "was critic 0 trained before" matters: a two-state forward (index 1: it was)
        canary = 1.0 if side == 1 else -1.0
        l0 = norm.logpdf(y, loc=canary, scale=sigma)
        lp, lm = norm.logpdf(y, loc=1.0, scale=sigma), norm.logpdf(y, loc=-1.0, scale=sigma)
        la = np.stack([np.zeros(trials), np.full(trials, -np.inf)], axis=1)
        rest = math.log1p(-1.0 / critics)
        for t in range(iterations):
            drawn0 = logsumexp(la, axis=1) + lk + l0[:, t]
            other = np.logaddexp(la[:, 1] + lp[:, t], la[:, 0] + lm[:, t]) + rest
            la = np.stack([other, drawn0], axis=1)
        return logsumexp(la, axis=1)
    # forward variable: log P(state after iteration t, y_<=t) over the K + 1 values of "trained before" (-1 = none)
    values = np.arange(-1, critics)
    la = np.where(values == -1, 0.0, -np.inf)[None, :].repeat(trials, 0)
    for t in range(iterations):
        new = np.full((trials, len(values)), -np.inf)
        for jj in range(critics):
            for vi, v in enumerate(values):
                if not np.isfinite(la[:, vi]).any():
                    continue
                state = np.full(trials, v) if dynamics == "own" else np.full(trials, int(v == 0))
                mean = np.clip(_hidden_means(np.full(trials, jj), state, side, dynamics), -1.0, 1.0)
                term = la[:, vi] + lk + norm.logpdf(y[:, t], loc=mean, scale=sigma)
                nxt = int(jj) if schedule == "drawn" else t % critics
                ni = nxt + 1
                new[:, ni] = np.logaddexp(new[:, ni], term)
        la = new
    return logsumexp(la, axis=1)


def _gs_wgan_hidden_state(eps: float, delta: float, trials: int, noise: NoiseSource, *, schedule: str | None = None,
                          dynamics: str = "own") -> Scores:
    """GS-WGAN over several iterations with critics that keep state (:func:`hidden_state_releases`), charged as the
    ledger charges ``HIDDEN_ITERATIONS`` iterations (:func:`dpsyn.methods.gs_wgan.privacy_event` with the sigma of
    :func:`~dpsyn.methods.gs_wgan.gs_wgan_sigma`, the default bound). Score: the exact log-likelihood ratio of a
    trial's releases (:func:`hidden_state_log_likelihood`), the most powerful test. ``schedule``: the method's
    (``round_robin``; None) or the authors' ``drawn`` (a test double: the critics then depend on the secret draws);
    ``dynamics``: see :func:`_hidden_means`."""
    from dpsyn.methods import gs_wgan

    K, T = HIDDEN_CRITICS, HIDDEN_ITERATIONS
    schedule = schedule or "round_robin"
    sigma = gs_wgan.gs_wgan_sigma(epsilon=eps, delta=delta, critics=K, iterations=T, batch_size=1)
    claimed = _claimed(gs_wgan.privacy_event(sigma=sigma, critics=K, batch_size=1, iterations=T, bound="convexity",
                                             label="audit: gs_wgan iterations with stateful critics"), delta=delta)
    gen = noise.torch()
    scores = []
    for side in (0, 1):
        y = hidden_state_releases(critics=K, iterations=T, sigma=sigma, schedule=schedule, dynamics=dynamics,
                                  side=side, trials=trials, generator=gen)
        kw = dict(critics=K, sigma=sigma, schedule=schedule, dynamics=dynamics)
        scores.append(hidden_state_log_likelihood(y, side=1, **kw) - hidden_state_log_likelihood(y, side=0, **kw))
    return Scores(scores[0], scores[1], claimed, {"sigma": sigma, "critics": K, "iterations": T,
                                                  "schedule": schedule, "dynamics": dynamics})


def _laplace(eps: float, delta: float, trials: int, noise: NoiseSource) -> Scores:
    """The class-ratio release (:func:`dpsyn.privacy.dp_class_counts`, what ``Method.release_class_proportions``
    draws), charged as ``ApproxDPEvent(eps, 0)``: one canary row in half of the classes."""
    from dpsyn.privacy import ApproxDPEvent, dp_class_counts

    claimed = _claimed(ApproxDPEvent(epsilon=eps, delta=0.0, label="audit: class counts"), delta=delta)
    canary, empty = _split_coordinates(2 * trials, np.random.default_rng(noise.seed))
    counts = dp_class_counts(canary, 2 * trials, epsilon=eps, generator=noise.numpy())
    return Scores(counts[empty], counts[canary], claimed, {"scale": 1.0 / eps, "delta_of_claim": 0.0})


def _tuning_score(eps: float, delta: float, trials: int, noise: NoiseSource) -> Scores:
    """Private tuning's DP score (:func:`dpsyn.trial.noised_count`: a trial's count of correct validation
    predictions + N(0, nm^2)), charged as ``GaussianEvent(nm)`` (sensitivity 1): a canary validation row, predicted
    right, in half of the counts."""
    from dpsyn.trial import noised_count
    from dpsyn.privacy import GaussianEvent

    def claim(nm: float) -> float:
        return _claimed(GaussianEvent(noise_multiplier=nm, label="audit: a DP score"), delta=delta)

    nm = _calibrate(claim, eps)
    canary, empty = _split_coordinates(2 * trials, np.random.default_rng(noise.seed))
    counts = np.full(2 * trials, 500.0)
    counts[canary] += 1.0
    out = noised_count(counts, noise_multiplier=nm, generator=noise.numpy())
    return Scores(out[empty], out[canary], claim(nm), {"noise_multiplier": nm})


def _noisy_max(eps: float, delta: float, trials: int, noise: NoiseSource, *, arms: int = ARMS) -> Scores:
    """Report noisy max (:class:`dpsyn.privacy.NoisyMax`, the DPImageBench protocol's accounted selection) over two
    candidates, charged as ``ApproxDPEvent(eps, 0)``. Neighbours: a canary validation row that candidate 0 alone
    gets right, so its count is one more on D1; the released bit is "candidate 0 selected". Arms: candidate 0 behind
    candidate 1 by several gaps on D0 (the bit's likelihood ratio grows towards e^eps in the tail); ``trials // arms``
    selections per arm."""
    from dpsyn.privacy import NoisyMax, noisy_max_event

    claimed = _claimed(noisy_max_event(epsilon=eps, label="audit: one noisy-max selection"), delta=delta)
    trials = max(trials // arms, 100)
    gaps = np.round(np.linspace(0.0, 6.0, arms) / eps)
    gen = noise.numpy()
    out = np.zeros((2, arms, trials))
    for side in (0, 1):
        selector = NoisyMax(epsilon=eps, generator=gen)  # arms x trials selections side by side
        selector.offer(np.repeat((500.0 - gaps + side)[:, None], trials, axis=1))
        selector.offer(np.full((arms, trials), 500.0))
        out[side] = selector.best == 0
    return Scores(out[0], out[1], claimed, {"scale": 1.0 / eps, "candidates": 2, "gaps": gaps.tolist()})


MECHANISMS: dict[str, Mechanism] = {m.name: m for m in (
    Mechanism("dpsgd_step", "DP-SGD step (dp_gan, dp_dre: Opacus DPOptimizer), rate 1",
              lambda *a: _dpsgd(*a, empty_batch=False)),
    Mechanism("dpsgd_empty_batch", "DP-SGD noise-only step for an empty Poisson batch (dp_gan)",
              lambda *a: _dpsgd(*a, empty_batch=True)),
    Mechanism("dpsgd_split_step", "DP-SGD split step (dp_gan's default: real rows clipped + noised, fake rows added)",
              lambda *a: _dpsgd(*a, split=True)),
    Mechanism("dp_mge_classic", "dp_mge mean + second moment, classic calibration (default)",
              lambda *a: _dp_mge(*a, calibration="classic")),
    Mechanism("dp_mge_analytic", "dp_mge mean + second moment, analytic calibration",
              lambda *a: _dp_mge(*a, calibration="analytic")),
    Mechanism("dp_mepf", "dp_mepf embedding release (classic calibration)", _dp_mepf),
    Mechanism("pe_histogram", "PE DP nearest-neighbour histogram", _pe_histogram),
    Mechanism("gnmax_threshold", "Confident-GNMax threshold check", lambda *a: _gnmax(*a, part="threshold")),
    Mechanism("gnmax_argmax", "Confident-GNMax noisy argmax", lambda *a: _gnmax(*a, part="argmax")),
    Mechanism("g_pate_dpgradagg", "G-PATE DPGradAgg", _g_pate),
    Mechanism("gs_wgan_sanitize", "GS-WGAN gradient sanitizer", _gs_wgan),
    Mechanism("gs_wgan_sanitize_band", "GS-WGAN gradient sanitizer in the DCT band (output_frequencies)",
              _gs_wgan_band),
    Mechanism("gs_wgan_iteration", "GS-WGAN iteration: b sanitised gradients through one critic drawn of K",
              _gs_wgan_iteration),
    Mechanism("gs_wgan_hidden_state", "GS-WGAN over 10 iterations, 3 critics that keep state, the method's schedule",
              _gs_wgan_hidden_state),
    Mechanism("laplace_class_counts", "Laplace class-ratio release (g_pate, pate_gan, dp_gan on tables)",
              _laplace),
    Mechanism("private_tuning_score", "private tuning's DP score (noised count of correct validation rows)",
              _tuning_score),
    Mechanism("noisy_max_selection", "report noisy max over classifier epochs (metrics.protocol=dpimagebench)",
              _noisy_max),
)}
