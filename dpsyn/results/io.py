"""Atomic file writers: a reader (or a table builder scanning run directories) sees the old file or the new one,
never a partial one — a run killed mid-write leaves no truncated ``result.json``.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

import numpy as np


def atomic_write(path: str | Path, write: Callable[[IO[bytes]], None]) -> Path:
    """Call ``write(fileobj)`` on a temporary file beside ``path``, fsync it, then rename it onto ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600 files; outputs get the usual permissions
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _jsonable(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, (np.floating, float)):
        v = float(obj)
        # JSON has no inf/nan: write them as strings so any JSON reader can load the file
        return v if math.isfinite(v) else str(v)
    if isinstance(obj, np.integer):
        return int(obj)
    if isinstance(obj, np.ndarray):
        return _jsonable(obj.tolist())
    if isinstance(obj, Path):
        return str(obj)
    return obj


def atomic_write_json(path: str | Path, data: Any) -> Path:
    """Write ``data`` as indented JSON atomically; inf and nan become the strings "inf" / "nan"."""
    text = json.dumps(_jsonable(data), indent=2, sort_keys=False, allow_nan=False) + "\n"
    return atomic_write(path, lambda f: f.write(text.encode()))


def atomic_write_text(path: str | Path, text: str) -> Path:
    return atomic_write(path, lambda f: f.write(text.encode()))


def atomic_save_npz(path: str | Path, **arrays: np.ndarray) -> Path:
    """``np.savez_compressed`` atomically."""
    return atomic_write(path, lambda f: np.savez_compressed(f, **arrays))


def atomic_torch_save(path: str | Path, obj: Any) -> Path:
    """``torch.save(obj)`` atomically (a kill during the write leaves the previous file intact); torch is imported
    here only, so that reading results never needs it."""
    import torch

    return atomic_write(path, lambda f: torch.save(obj, f))


def read_json(path: str | Path) -> Any:
    """Load JSON written by :func:`atomic_write_json`, turning "inf"/"-inf"/"nan" strings back into floats."""

    def fix(o: Any) -> Any:
        if isinstance(o, dict):
            return {k: fix(v) for k, v in o.items()}
        if isinstance(o, list):
            return [fix(v) for v in o]
        if o in ("inf", "-inf", "nan"):
            return float(o)
        return o

    return fix(json.loads(Path(path).read_text()))
