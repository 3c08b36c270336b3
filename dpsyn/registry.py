"""One small registry, used for methods, datasets, feature extractors and metrics.

Registration happens by explicit imports in each package's ``__init__`` (``dpsyn/methods/__init__.py`` etc.), never
by scanning modules, so what is registered is what the code says.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Generic, TypeVar

T = TypeVar("T")


class Registry(Generic[T]):
    """A named mapping from a user-facing name (``"dp_gan"``) to a class or factory.

    Args:
        kind: What the registry holds, used in error messages ("method", "dataset", ...).
    """

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._entries: dict[str, T] = {}

    def register(self, name: str) -> Callable[[T], T]:
        """Decorator registering ``obj`` under ``name``.

        Raises:
            ValueError: if ``name`` is already registered.
        """

        def deco(obj: T) -> T:
            if name in self._entries:
                raise ValueError(f"{self.kind} {name!r} is registered twice")
            self._entries[name] = obj
            return obj

        return deco

    def get(self, name: str) -> T:
        """Return the entry for ``name``.

        Raises:
            ValueError: if ``name`` is unknown; the message lists the registered names.
        """
        try:
            return self._entries[name]
        except KeyError:
            raise ValueError(
                f"unknown {self.kind} {name!r}; registered: {', '.join(self.names())}"
            ) from None

    def build(self, cfg: Any, *args: Any, **kwargs: Any) -> Any:
        """Look up ``cfg.name`` and call the entry with ``cfg`` and the extra arguments."""
        return self.get(cfg.name)(cfg, *args, **kwargs)

    def names(self) -> list[str]:
        """Registered names, sorted."""
        return sorted(self._entries)

    def __contains__(self, name: object) -> bool:
        return name in self._entries
