"""experiments/long2021/measured/vote_bins.py: observes G-PATE's votes without changing them, and reports where
they fall (the README's finding that at the paper's clip the vote is a sign vote)."""

from __future__ import annotations

from pathlib import Path

import torch

import dpsyn.methods.g_pate as g_pate
from tests.conftest import load_script

SCRIPT = Path(__file__).resolve().parents[1] / "experiments" / "long2021" / "measured" / "vote_bins.py"


def _round(recorder, grads: torch.Tensor, proj: torch.Tensor, *, clip: float, bins: int, chunks: int = 2):
    """One round as g_pate runs it: teacher_votes summed over teacher chunks, then aggregate_votes (no noise)."""
    votes = sum(recorder.teacher_votes(g, proj, clip=clip, bins=bins) for g in grads.chunk(chunks))
    return votes, recorder.aggregate_votes(votes, proj, clip=clip, sigma_threshold=None, sigma=None, threshold=None,
                                           generator=None)


def test_the_recorder_returns_what_g_pate_s_functions_return_and_leaves_the_module_alone_until_installed() -> None:
    recorder = load_script(SCRIPT, "vote_bins").VoteRecorder()
    gen = torch.Generator().manual_seed(0)
    grads, proj = torch.randn(12, 3, 8, generator=gen), torch.randn(3, 8, 4, generator=gen)
    votes, (g_hat, answered) = _round(recorder, grads, proj, clip=0.5, bins=10)
    want = g_pate.teacher_votes(grads, proj, clip=0.5, bins=10)
    assert torch.equal(votes, want)
    want_g, want_answered = g_pate.aggregate_votes(want, proj, clip=0.5, sigma_threshold=None, sigma=None,
                                                   threshold=None, generator=None)
    assert torch.equal(g_hat, want_g) and torch.equal(answered, want_answered)
    assert g_pate.teacher_votes is recorder._teacher_votes  # not installed: the module is untouched


def test_gradients_far_beyond_the_clip_put_every_vote_in_the_outer_bins() -> None:
    recorder = load_script(SCRIPT, "vote_bins").VoteRecorder()
    gen = torch.Generator().manual_seed(1)
    proj = torch.randn(2, 6, 3, generator=gen)
    direction = torch.randn(2, 6, generator=gen)
    # 10 teachers agree on the direction, at 1000x the clip; 10 more at 1e-3 of it (the central bins)
    grads = torch.cat([1e3 * direction.expand(10, 2, 6), 1e-3 * direction.expand(10, 2, 6)])
    _round(recorder, grads, proj, clip=1.0, bins=10)
    (r,) = recorder.rounds
    assert abs(sum(r["bin_share"]) - 1.0) < 1e-3
    assert r["outer"] == 0.5  # half the teachers beyond the clip, half inside the two central bins
    assert r["sign_agree"] == 1.0 and r["answered"] == 1.0
    assert r["top_share"] == 0.5
    _round(recorder, 1e3 * direction.expand(20, 2, 6), proj, clip=1.0, bins=10)
    assert recorder.rounds[1]["outer"] == 1.0 and recorder.rounds[1]["median_u_over_c"] > 10
