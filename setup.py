"""The build step pyproject.toml cannot state: the wheel carries the repository's ``conf/`` as ``dpsyn/conf``.

``conf/`` stays at the repository root (the checkout composes from it, :mod:`dpsyn.paths`); ``build_py`` copies it
into the build tree only, never into the source tree, so a checkout has one config tree. An ``__init__.py`` is
written beside it so that Hydra also finds it as ``pkg://dpsyn.conf``. An editable install maps the package to the
source tree, where :mod:`dpsyn.paths` picks the checkout's ``conf/``, so nothing is copied then.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent


class build_py_with_conf(build_py):
    """``build_py``, plus ``conf/`` copied to ``<build_lib>/dpsyn/conf`` (hidden files and byte code left out)."""

    def run(self) -> None:
        super().run()
        if getattr(self, "editable_mode", False):
            return
        src, dst = ROOT / "conf", Path(self.build_lib) / "dpsyn" / "conf"
        if not (src / "train.yaml").is_file():
            raise FileNotFoundError(f"{src / 'train.yaml'} is missing: the wheel needs the config tree (conf/)")
        shutil.rmtree(dst, ignore_errors=True)
        shutil.copytree(src, dst, ignore=shutil.ignore_patterns(".*", "__pycache__", "*.py[cod]"))
        (dst / "__init__.py").write_text('"""dpsyn\'s Hydra config tree, packaged (pkg://dpsyn.conf)."""\n')


setup(cmdclass={"build_py": build_py_with_conf})
