"""Where dpsyn's own files live (the Hydra config tree is ``conf/`` at the repository root)."""

from __future__ import annotations

from pathlib import Path

REPO_DIR = Path(__file__).resolve().parents[1]
CONF_DIR = REPO_DIR / "conf"
