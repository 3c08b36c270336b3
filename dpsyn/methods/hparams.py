"""Checks of method hyperparameters shared by several method files (G-PATE, PATE-GAN, GS-WGAN): one-line errors
naming the key and what is allowed. They lived in g_pate.py, and gs_wgan imported them from there; a method file
imports nothing private from another method file.
"""

from __future__ import annotations

import math
from typing import Any


def positive_int(cfg: Any, key: str, minimum: int = 1) -> int:
    """``cfg[key]`` as an int >= ``minimum``.

    Raises:
        ValueError: not an integer (a bool is not one), or below ``minimum``.
    """
    v = cfg.get(key)
    if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
        raise ValueError(f"method.{key}={v!r}: must be an integer >= {minimum}")
    return int(v)


def optional_int(cfg: Any, key: str, null_means: str) -> int | None:
    """``cfg[key]``: None (which means ``null_means``) or an int >= 1.

    Raises:
        ValueError: anything else.
    """
    v = cfg.get(key)
    if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
        raise ValueError(f"method.{key}={v!r}: must be null ({null_means}) or >= 1")
    return v


def positive_float(cfg: Any, key: str) -> float:
    """``cfg[key]`` as a finite number > 0.

    Raises:
        ValueError: not a number (a bool is not one), <= 0 or infinite.
    """
    v = cfg.get(key)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < float(v) < math.inf:
        raise ValueError(f"method.{key}={v!r}: must be a number > 0")
    return float(v)
