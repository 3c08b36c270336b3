"""A quiet console: the known noise of dpsyn's libraries, silenced at its source, in one place.

A run prints its progress bars, dpsyn's own INFO lines and the summary. :func:`quiet` (called once at CLI start)
silences each known library message by the narrowest means there is: a warnings filter for that exact message and
category, or a logging filter for that exact message on the library's own logger. Nothing else is hidden, and
stderr is never redirected. ``DPSYN_VERBOSE=1`` or ``hydra.verbose=true`` on the command line installs nothing:
every message comes back.
"""

from __future__ import annotations

import logging
import os
import warnings
from collections.abc import Sequence
from typing import Any

# (warning category, regex matching the start of the message, why it is noise)
NOISY_WARNINGS: tuple[tuple[type[Warning], str, str], ...] = (
    (FutureWarning, r"`isinstance\(treespec, LeafSpec\)` is deprecated",
     "torch deprecates LeafSpec; Lightning's _pytree still checks it (Lightning's to fix, nothing to do here)"),
    (UserWarning, r"Full backward hook is firing when gradients are computed with respect to module outputs",
     "Opacus's per-sample-gradient hooks on a module whose inputs need no gradient (the generator's samples fed to "
     "a DP discriminator): expected, gradients are still those of the parameters"),
)

# (logger name, text the message contains, why it is noise)
NOISY_LOG_RECORDS: tuple[tuple[str, str, str], ...] = (
    ("lightning.pytorch.utilities.rank_zero", "litlogger", "Lightning's advertisement for its cloud logger"),
    ("lightning.fabric.utilities.rank_zero", "litlogger", "the same, where Fabric's rank-zero logger prints it"),
)

# (logger name, level below which its records are dropped, why)
NOISY_LOGGER_LEVELS: tuple[tuple[str, int, str], ...] = (
    ("faiss.loader", logging.WARNING,
     "which SIMD build faiss loads: each absent build (AVX512, AVX2) is an INFO record quoting a ModuleNotFoundError"),
)

# loggers to which their library adds its own stderr handler when imported before logging is configured (Lightning:
# ``lightning/pytorch/__init__.py``); under Hydra's logging every record is then printed twice
DUPLICATING_LOGGERS: tuple[str, ...] = ("lightning",)

_installed: list[Any] = []  # what quiet() installed (warnings filters are global: installed once per process)


def verbose_requested(argv: Sequence[str] | None = None) -> bool:
    """True when the user asked for every library message: ``DPSYN_VERBOSE`` set to 1/true/yes, or
    ``hydra.verbose`` set (to anything but false) on the command line ``argv``."""
    if os.environ.get("DPSYN_VERBOSE", "").strip().lower() in ("1", "true", "yes", "on"):
        return True
    for arg in argv or ():
        key, _, value = arg.partition("=")
        if key.lstrip("+~") == "hydra.verbose" and value.strip().lower() not in ("false", "null", "[]", ""):
            return True
    return False


class _DropMessage(logging.Filter):
    """Drops a logger's records whose message contains ``text``; every other record passes."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.text = text

    def filter(self, record: logging.LogRecord) -> bool:
        return self.text not in record.getMessage()


def quiet(argv: Sequence[str] | None = None) -> bool:
    """Silence the known library noise (:data:`NOISY_WARNINGS`, :data:`NOISY_LOG_RECORDS`) unless the user asked
    for it (:func:`verbose_requested`).

    Returns:
        True when the filters are installed (now or by an earlier call), False in verbose mode.
    """
    if verbose_requested(argv):
        return False
    if _installed:
        return True
    for category, message, _why in NOISY_WARNINGS:
        warnings.filterwarnings("ignore", message=message, category=category)
        _installed.append(("warning", category, message))
    for name, text, _why in NOISY_LOG_RECORDS:
        flt = _DropMessage(text)
        logging.getLogger(name).addFilter(flt)
        _installed.append(("log", name, flt))
    for name, level, _why in NOISY_LOGGER_LEVELS:
        logging.getLogger(name).setLevel(level)
        _installed.append(("level", name, level))
    return True


def settle_library_handlers() -> list[str]:
    """Once the libraries are imported (the run calls it): where the root logger has handlers (Hydra's), remove the
    stderr handlers of :data:`DUPLICATING_LOGGERS`, so that each of their records is printed once, by Hydra's handler
    (and written to the run's log file). Only when :func:`quiet` is in force.

    Returns:
        the loggers whose handlers were removed.
    """
    done: list[str] = []
    if not is_quiet() or not logging.getLogger().handlers:
        return done
    for name in DUPLICATING_LOGGERS:
        logger = logging.getLogger(name)
        for handler in list(logger.handlers):
            if type(handler) is logging.StreamHandler:  # the library's own plain stderr handler, nothing else
                logger.removeHandler(handler)
                done.append(name)
    return done


def is_quiet() -> bool:
    """Whether :func:`quiet` installed its filters in this process."""
    return bool(_installed)


def quiet_logger(logger: Any) -> Any:
    """The experiment logger ``logger`` with the settings that only make its library complain removed.

    Lightning's ``WandbLogger`` always passes ``anonymous=None`` to ``wandb.init``; W&B (>= 0.19) warns that the
    setting "has no effect and will be removed" whenever it is passed at all. Unset (what ``None`` means: not
    anonymous), W&B behaves the same and says nothing. Only when :func:`quiet` is in force.
    """
    init = getattr(logger, "_wandb_init", None)
    if is_quiet() and isinstance(init, dict) and init.get("anonymous", "") is None:
        del init["anonymous"]
    return logger
