"""``python train.py`` / ``dpsyn-train``: one run (or, with ``-m``, a sweep) of method x dataset x eps x seed.

The command line only: check the arguments (:func:`dpsyn.cli.config_check.preflight`, before Hydra and torch), let
Hydra compose the config, hand it to :func:`dpsyn.task.run` (or :func:`dpsyn.private_tuning.private_search`), print a
summary, and turn a config mistake or a missing input into one line and an exit status (2, 3). What a run does and
how it survives a crash: :mod:`dpsyn.task`.
"""

from __future__ import annotations

import math
import sys
import traceback
from pathlib import Path
from typing import Any

import hydra
from omegaconf import DictConfig

from dpsyn.cli.config_check import ConfigError, preflight
from dpsyn.paths import CONF_DIR
from dpsyn.task import reuse_eps_free_result, run, task_overrides

def format_summary(result: dict[str, Any]) -> str:
    """The few lines the CLI prints at the end of a run."""
    eps_t, spent = result["eps"], result["epsilon_spent"]
    lines = [f"dpsyn: {result['method']} on {result['dataset']}, seed {result['seed']}"]
    if result["non_private_reference"]:
        lines.append("  privacy : not differentially private (epsilon spent = inf): a reference, not a DP result")
    elif math.isinf(eps_t):
        lines.append("  privacy : non-private run (eps=inf, no noise)")
    elif "tuning" in result and result["tuning"]["role"] == "private":
        t = result["tuning"]
        lines.append(f"  privacy : epsilon spent {spent:.4f} <= target {eps_t:g} at delta {result['delta']:g}, private "
                     f"tuning of {', '.join(t['selected'])} (best of a {t['trials_distribution']} number of trials "
                     f"at eps {t['trial_eps']:g} each; selected {t['selected']}, DP score {t['selected_dp_score']:.4f})")
        lines.append(f"  accountant: {result['accountant']}")
    elif "tuning" in result:
        lines.append(f"  privacy : epsilon spent inf: the run spent its target {eps_t:g}, then non-private tuning "
                     + ("released its validation score" if result["tuning"]["role"] == "trial"
                        else "chose its settings") + " (see privacy.json)")
    else:
        lines.append(f"  privacy : epsilon spent {spent:.4f} <= target {eps_t:g} at delta {result['delta']:g}")
        lines.append(f"  accountant: {result['accountant']}")
    width = max([len(k) for k in result["metrics"]] + [6])
    for k, v in result["metrics"].items():
        lines.append(f"  {k:<{width}} : {v:.4f}" if isinstance(v, float) else f"  {k:<{width}} : {v}")
    if result["timings"].get("total_s") is not None:
        lines.append(f"  time    : {result['timings']['total_s']:.1f}s")
    lines.append(f"  outputs : {result['run_dir']}")
    return "\n".join(lines)


@hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name="train")
def _hydra_main(cfg: DictConfig) -> float | None:
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    run_dir = Path(HydraConfig.get().runtime.output_dir)
    if cfg.skip_existing and (run_dir / "result.json").is_file():
        print(f"dpsyn: {cfg.method.name} on {cfg.dataset.name}, eps={cfg.eps}, seed {cfg.seed}: result found, skipped")
        return None
    if cfg.skip_existing and HydraConfig.get().mode == RunMode.MULTIRUN:
        reused = reuse_eps_free_result(cfg, run_dir, Path(HydraConfig.get().sweep.dir), task_overrides())
        if reused is not None:
            print(f"dpsyn: {cfg.method.name} on {cfg.dataset.name}, eps={cfg.eps}, seed {cfg.seed}: its output does "
                  f"not depend on eps; result of {reused['reused_from']} reused")
            return reused["metrics"].get("acc")
    try:
        if cfg.tuning.get("private"):
            from dpsyn.private_tuning import private_search

            result = private_search(cfg, run_dir)
        else:
            result = run(cfg, run_dir)
    except ConfigError as e:
        print(f"dpsyn: config error: {e}", file=sys.stderr)
        sys.exit(2)
    except FileNotFoundError as e:
        # data or a checkpoint the user must provide: the loaders' messages say what to download and where
        from dpsyn.results.io import atomic_write_text

        atomic_write_text(run_dir / "error.txt", traceback.format_exc())
        print(f"dpsyn: missing input: {e}", file=sys.stderr)
        sys.exit(3)
    except Exception:
        # keep the cause beside the (absent) result, so a sweep's failed cells can be reported and re-run
        from dpsyn.results.io import atomic_write_text

        atomic_write_text(run_dir / "error.txt", traceback.format_exc())
        raise
    (run_dir / "error.txt").unlink(missing_ok=True)
    print(format_summary(result))
    objective = cfg.get("tuning", {}).get("objective") if cfg.metrics.split == "validation" else None
    if objective is not None:  # a tuning trial: the sweeper (hydra/sweeper=optuna) reads this value
        if objective not in result["metrics"]:
            raise ConfigError(f"tuning.objective={objective}: not a metric of this run (has: "
                              f"{', '.join(sorted(result['metrics']))})")
        return float(result["metrics"][objective])
    return result["metrics"].get("acc")


def main() -> None:
    """Console entry point: check the command line, then hand over to Hydra."""
    from dpsyn.console import quiet

    quiet(sys.argv[1:])  # known library noise off, unless DPSYN_VERBOSE=1 or hydra.verbose=true
    try:
        preflight(sys.argv[1:])
    except ConfigError as e:
        print(f"dpsyn: config error: {e}", file=sys.stderr)
        sys.exit(2)
    _hydra_main()


if __name__ == "__main__":
    main()
