"""What a private search costs (README "Private tuning"): for DP-GAN's default DP-SGD on a dataset's private rows
minus the validation rows, the largest per-trial epsilon (tuning.trial_eps) whose search fits a target, by the
distribution of the number of trials. Accounting only: nothing is trained.

    python benchmarks/private_tuning_cost.py [--n-private 54000] [--batch-size 128] [--epochs 1] [--targets 1 10]
"""

from __future__ import annotations

import argparse
import math

from dpsyn.privacy import GaussianEvent, PrivacyLedger, RepeatAndSelectEvent, SampledGaussianEvent
from dpsyn.privacy.dpsgd import dpsgd_noise_multiplier


def search_epsilon(trial_eps: float, *, q: float, steps: int, delta: float, mean: float, shape: float,
                   score_nm: float) -> float:
    nm = dpsgd_noise_multiplier(epsilon=trial_eps, sample_rate=q, steps=steps, delta=delta, accountant="rdp")
    trial = [SampledGaussianEvent(sampling="poisson",
                                  noise_multiplier=nm, sample_rate=q, steps=steps, accountant="rdp", label="D"),
             GaussianEvent(noise_multiplier=score_nm, label="score")]
    event = RepeatAndSelectEvent(trial_events=[e.to_dict() for e in trial], mean_trials=mean,
                                 shape="inf" if math.isinf(shape) else shape, label="search")
    return PrivacyLedger(target_epsilon=math.inf, delta=delta, events=[event]).epsilon()


def largest_trial_eps(target: float, **kw) -> float:
    lo, hi = 1e-3, target
    for _ in range(20):  # the search's epsilon grows with the trial's
        mid = math.sqrt(lo * hi)
        lo, hi = (mid, hi) if search_epsilon(mid, **kw) <= target else (lo, mid)
    return lo


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n-private", type=int, default=54000, help="private rows left after the validation split")
    ap.add_argument("--batch-size", type=int, default=128)
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--delta", type=float, default=1e-5)
    ap.add_argument("--score-noise-multiplier", type=float, default=20.0)
    ap.add_argument("--targets", type=float, nargs="+", default=[1.0, 10.0])
    args = ap.parse_args()
    q = args.batch_size / args.n_private
    steps = args.epochs * math.ceil(args.n_private / args.batch_size)
    print(f"DP-SGD: q = {q:.5f}, {steps} steps, delta {args.delta:g}; DP score noise multiplier "
          f"{args.score_noise_multiplier:g}")
    print("| mean trials | distribution | " + " | ".join(f"trial_eps for eps={t:g}" for t in args.targets) + " |")
    print("|---|---|" + "---|" * len(args.targets))
    for mean in (3.0, 10.0):
        for shape, name in ((0.0, "logarithmic (default)"), (1.0, "geometric"), (math.inf, "Poisson")):
            cells = [largest_trial_eps(t, q=q, steps=steps, delta=args.delta, mean=mean, shape=shape,
                                       score_nm=args.score_noise_multiplier) for t in args.targets]
            print(f"| {mean:g} | {name} | " + " | ".join(f"{c:.3f}" for c in cells) + " |")


if __name__ == "__main__":
    main()
