"""The tiny per-method overrides of the test suite, read from the method classes (:attr:`Method.tiny`).

``TINY[method]`` runs ``method`` end to end in seconds with ``trainer=debug``, on the cheapest dataset it supports
(the numbers it gives mean nothing). The method tests, the crash-safety and neighbouring-run harnesses and the
all-methods test (tests/test_all_methods.py) compose their cases from these; the pieces they are built of live in
:mod:`dpsyn.methods.tiny`.
"""

from __future__ import annotations

from dpsyn.methods import METHODS
from dpsyn.methods.tiny import (  # noqa: F401  (re-exported for the tests)
    IMAGE_METRICS,
    SHOES,
    TABLE_METRICS,
    TINIEST_LOCAL_GAN,
    TINY_G_PATE,
    TINY_G_PATE_IMAGE,
    TINY_GS_WGAN,
    TINY_LOCAL_GAN,
    TINY_PATE_GAN,
    TINY_PE,
    TINY_PUBLIC,
)

# method -> overrides of its fastest end-to-end run (dataset included): the class's ``tiny``
TINY: dict[str, tuple[str, ...]] = {name: tuple(METHODS.get(name).tiny) for name in METHODS.names()}
