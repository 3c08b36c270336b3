"""Where G-PATE's votes fall: the share of teacher votes in each of the B bins, round by round.

A development diagnostic, not a release: it reads the teachers' raw votes and their unclipped projected gradients,
which are private, and prints them. Run it on the embedded data only, to see what DPGradAgg passes to the generator.

It runs ``python -m dpsyn.cli.train`` unchanged (the same Hydra overrides) with two wrappers around
``dpsyn.methods.g_pate``'s ``teacher_votes`` and ``aggregate_votes`` that observe and never alter what they return.
For each round it records:

- ``bin_share``: the share of all votes in each bin (B values summing to 1);
- ``outer``: the share in the two outer bins, i.e. of projected gradients at or beyond the clip c;
- ``median_u_over_c``: the median |g_i^T R_j| / c over teachers, samples and coordinates (a 1% subsample);
- ``sign_agree``: the share of coordinates whose winning bin has the sign of the teachers' mean projected
  gradient (unclipped);
- ``top_share``: the winning bin's votes / N, and ``answered``: the answered share of the round's queries.

Usage (the README's numbers, 2026-12-05)::

    python experiments/long2021/measured/vote_bins.py --out vote_bins.json -- method=g_pate dataset=fmnist eps=10 \\
        method.teachers=3600 metrics.split=validation method.steps=21 'metrics.names.image=[]'
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

import dpsyn.methods.g_pate as g_pate


class VoteRecorder:
    """Wraps ``teacher_votes`` (called once per teacher chunk) and ``aggregate_votes`` (once per round)."""

    def __init__(self) -> None:
        self.rounds: list[dict] = []
        self._sum_u: torch.Tensor | None = None
        self._abs_u: list[torch.Tensor] = []
        self._teachers = 0
        self._teacher_votes = g_pate.teacher_votes
        self._aggregate_votes = g_pate.aggregate_votes

    def install(self) -> None:
        g_pate.teacher_votes = self.teacher_votes
        g_pate.aggregate_votes = self.aggregate_votes

    def teacher_votes(self, grads: torch.Tensor, proj: torch.Tensor, *, clip: float, bins: int) -> torch.Tensor:
        u = torch.einsum("nbd,bdk->nbk", grads.flatten(2).to(proj.dtype), proj)  # (chunk, b, k), unclipped
        self._sum_u = u.sum(0) if self._sum_u is None else self._sum_u + u.sum(0)
        self._abs_u.append((u.abs() / clip).flatten()[::97])
        self._teachers += u.shape[0]
        return self._teacher_votes(grads, proj, clip=clip, bins=bins)

    def aggregate_votes(self, votes: torch.Tensor, proj: torch.Tensor, **kwargs):
        g_hat, answered = self._aggregate_votes(votes, proj, **kwargs)
        share = votes.sum((0, 1)).double() / votes.sum()
        winner = votes.argmax(-1)
        centres = g_pate.bin_centres(clip=kwargs["clip"], bins=votes.shape[-1])
        self.rounds.append({
            "round": len(self.rounds) + 1,
            "bin_share": [round(float(s), 4) for s in share],
            "outer": round(float(share[0] + share[-1]), 4),
            "median_u_over_c": round(float(torch.cat(self._abs_u).median()), 2),
            "sign_agree": round(float((torch.sign(centres[winner]) == torch.sign(self._sum_u)).double().mean()), 4),
            "top_share": round(float(votes.max(-1).values.double().mean() / self._teachers), 4),
            "answered": round(float(answered.double().mean()), 4),
        })
        self._sum_u, self._abs_u, self._teachers = None, [], 0
        return g_hat, answered


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="JSON file for the per-round records")
    parser.add_argument("overrides", nargs="*", help="train.py's Hydra overrides (after --)")
    args = parser.parse_args()
    recorder = VoteRecorder()
    recorder.install()
    from dpsyn.cli.train import main as train

    sys.argv = [sys.argv[0], *args.overrides]
    try:
        train()
    finally:
        args.out.write_text(json.dumps(recorder.rounds, indent=1))
        print(f"{'round':>5} {'outer':>6} {'|u|/c':>8} {'sign_agree':>10} {'top/N':>6} {'answered':>8}")
        for r in recorder.rounds:
            print(f"{r['round']:5d} {r['outer']:6.3f} {r['median_u_over_c']:8.1f} {r['sign_agree']:10.3f} "
                  f"{r['top_share']:6.3f} {r['answered']:8.3f}")


if __name__ == "__main__":
    main()
