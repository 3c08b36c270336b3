"""Writes :mod:`dpsyn.config.catalog`: the facts of dpsyn's own methods that the preflight reads before any method
module (and torch) is imported, taken from the method classes (:class:`dpsyn.methods.base.Method`), where they are
stated. ``make docs`` runs it; tests/test_config_schema.py checks that the file is current.
"""

from __future__ import annotations

from pathlib import Path

CATALOG_PATH = Path(__file__).resolve().parents[1] / "config" / "catalog.py"

HEADER = '''"""The facts of dpsyn's own methods that the preflight reads without importing them (their modules import torch):
each method's dataset kinds and whether it needs public data. Generated from the method classes by ``make docs``
(:mod:`dpsyn.methods.catalog`); edit the classes, not this file.
"""

'''


def catalog_text() -> str:
    """The text of dpsyn/config/catalog.py for the methods registered now (dpsyn's own; no plugin)."""
    from dpsyn.methods import METHODS
    from dpsyn.plugins import PLUGIN_METHODS

    lines = [HEADER + "METHODS = {"]
    for name in METHODS.names():
        if name in PLUGIN_METHODS:
            continue
        cls = METHODS.get(name)
        kinds = ", ".join(f'"{k}"' for k in cls.kinds) + ("," if len(cls.kinds) == 1 else "")
        lines.append(f'    "{name}": {{"kinds": ({kinds}), "needs_public": {bool(cls.needs_public)!r}}},')
    lines.append("}")
    return "\n".join(lines) + "\n"


def write(path: Path = CATALOG_PATH) -> bool:
    """Rewrite the catalog if it differs; True when it changed."""
    text = catalog_text()
    if path.is_file() and path.read_text() == text:
        return False
    path.write_text(text)
    return True


if __name__ == "__main__":
    print(f"{'rewrote' if write() else 'unchanged:'} {CATALOG_PATH}")
