"""``python -m dpsyn.cli.audit [mechanisms=all] [eps=1] [delta=1e-5] [trials=4000000]``: an empirical privacy audit.

Every DP mechanism dpsyn uses is run, as the methods call it, many times on a worst-case neighbouring pair
(:mod:`dpsyn.privacy.audit.mechanisms`); a distinguishing test on its outputs gives a lower bound on its epsilon,
compared with what the ledger charges (:mod:`dpsyn.privacy.audit.runner`). A lower bound above the claim: the
command exits 1 and names the mechanism.

This module only reads the Hydra config (conf/audit.yaml), runs the audit and writes its rows.

Output: a table on the console and ``audit.json`` in the run directory (``outputs/audit/<time>``), one row per
mechanism: ``mechanism``, ``eps_claimed``, ``delta``, ``eps_lower``, ``trials`` and how the bound was obtained;
with ``keep=true``, the rows in docs/data/audit.csv too.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import hydra
from omegaconf import DictConfig, OmegaConf

from dpsyn.paths import CONF_DIR
from dpsyn.privacy.audit.runner import format_table, keep_rows, run_audit, select_mechanisms


@hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name="audit")
def _hydra_main(cfg: DictConfig) -> None:
    from hydra.core.hydra_config import HydraConfig

    from dpsyn.results.io import atomic_write_json

    logging.getLogger("faiss.loader").setLevel(logging.WARNING)  # which CPU build it loads: not the audit's news
    mechanisms = OmegaConf.to_container(cfg.mechanisms) if OmegaConf.is_list(cfg.mechanisms) else cfg.mechanisms
    try:
        names = select_mechanisms(mechanisms)
        rows = run_audit(names, eps=float(cfg.eps), delta=float(cfg.delta), trials=int(cfg.trials),
                         confidence=float(cfg.confidence), deterministic=bool(cfg.deterministic), seed=int(cfg.seed))
    except ValueError as e:
        print(f"dpsyn: config error: {e}", file=sys.stderr)
        sys.exit(2)
    run_dir = Path(HydraConfig.get().runtime.output_dir)
    atomic_write_json(run_dir / "audit.json", {
        "eps": float(cfg.eps), "delta": float(cfg.delta), "trials": int(cfg.trials),
        "confidence": float(cfg.confidence), "deterministic": bool(cfg.deterministic), "rows": rows})
    print(format_table(rows, confidence=float(cfg.confidence)))
    print(f"  outputs : {run_dir / 'audit.json'}")
    if cfg.get("keep"):
        print(f"  kept    : {keep_rows(rows, confidence=float(cfg.confidence))} (make docs rebuilds docs/audit.md)")
    failed = [r["mechanism"] for r in rows if not r["passed"]]
    if failed:
        print(f"dpsyn: audit FAILED: eps_lower > eps_claimed for {', '.join(failed)}", file=sys.stderr)
        sys.exit(1)


def main() -> None:
    """Console entry point."""
    _hydra_main()


if __name__ == "__main__":
    main()
