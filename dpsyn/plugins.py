"""Methods from outside dpsyn. A plugin is a module that registers its method when imported
(:func:`dpsyn.methods.register_method`, with the method's schema); dpsyn imports the plugins it finds:

* the ``dpsyn.methods`` entry points of the installed distributions, e.g. in a plugin's pyproject.toml::

      [project.entry-points."dpsyn.methods"]
      class_means = "my_package.class_means"

* the modules named in the environment variable ``DPSYN_PLUGINS`` (comma-separated, importable from the
  ``PYTHONPATH``): a module of one's own, without packaging.

A registered plugin method gets what dpsyn's own methods get: the preflight, the ledger and its checks, crash safety,
the metrics, the tables, and the test harnesses (docs/adding-a-method.md). With no plugin, nothing is imported: the
preflight of dpsyn's own methods stays free of torch.
"""

from __future__ import annotations

import importlib
import os
from importlib.metadata import entry_points

ENTRY_POINT_GROUP = "dpsyn.methods"
ENV = "DPSYN_PLUGINS"

#: the methods registered from outside dpsyn (:func:`dpsyn.methods.register_method` with a schema): name -> class
PLUGIN_METHODS: dict[str, type] = {}
_loaded: set[str] = set()


def plugin_modules() -> list[str]:
    """The modules of the plugins found: the entry points' (their module part), then ``DPSYN_PLUGINS``'."""
    found = [ep.value.split(":", 1)[0].strip() for ep in entry_points(group=ENTRY_POINT_GROUP)]
    found += [m.strip() for m in os.environ.get(ENV, "").split(",") if m.strip()]
    return list(dict.fromkeys(found))


def load_plugins() -> dict[str, type]:
    """Import every plugin found (once each) and return the methods registered from outside dpsyn, by name.

    Raises:
        ImportError: a plugin module that does not import (its name in the message).
    """
    modules = [m for m in plugin_modules() if m not in _loaded]
    for name in modules:
        try:
            importlib.import_module(name)
        except ImportError as e:
            raise ImportError(f"dpsyn plugin {name!r} (entry point group {ENTRY_POINT_GROUP!r} or {ENV}) does not "
                              f"import: {e}") from e
        _loaded.add(name)
    return dict(PLUGIN_METHODS)  # a method registered in-process (a notebook, a test) is one too
