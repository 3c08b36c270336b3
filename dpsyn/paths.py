"""Where dpsyn's own files live: the Hydra config tree and, in a checkout, the repository.

The config tree is ``conf/`` at the repository root. A wheel carries a copy of it inside the package, as
``dpsyn/conf`` (Hydra: ``pkg://dpsyn.conf``), since an installed package has no repository around it.
:data:`CONF_DIR` is the repository's ``conf/`` when dpsyn runs from a checkout (an editable install, or the
source tree on ``PYTHONPATH``), else the packaged copy, so that editing ``conf/`` in a checkout takes effect at once.

:data:`REPO_DIR` is the directory above the package in both cases; only in a checkout (:data:`IN_CHECKOUT`) is it
the repository, with ``experiments/``, ``docs/`` and ``.git``. Code that reads those calls :func:`require_checkout`,
which fails with a message saying so instead of a missing-file error deep inside.
"""

from __future__ import annotations

from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent
REPO_DIR = PACKAGE_DIR.parent
PACKAGED_CONF = "conf"
"""The config tree's folder inside the package of a wheel (``dpsyn/conf``); the build copies ``conf/`` there."""


def is_checkout(repo_dir: Path) -> bool:
    """Whether ``repo_dir`` (the directory above the package) is dpsyn's source tree: its ``pyproject.toml`` and
    ``conf/train.yaml`` are there. An installed package's parent is ``site-packages``, which holds neither."""
    return (repo_dir / "pyproject.toml").is_file() and (repo_dir / "conf" / "train.yaml").is_file()


def conf_dir(package_dir: Path = PACKAGE_DIR) -> Path:
    """The config tree dpsyn composes from: the checkout's ``conf/`` when the package lies in a checkout, else the
    copy a wheel carries in the package (``<package>/conf``).

    Raises:
        FileNotFoundError: neither exists (a package built without its config tree).
    """
    repo = package_dir.parent
    if is_checkout(repo):
        return repo / "conf"
    packaged = package_dir / PACKAGED_CONF
    if (packaged / "train.yaml").is_file():
        return packaged
    raise FileNotFoundError(f"dpsyn's config tree is missing: neither {repo / 'conf'} (a checkout) nor {packaged} "
                            "(an installed wheel) holds train.yaml; reinstall dpsyn (pip install .)")


IN_CHECKOUT = is_checkout(REPO_DIR)
CONF_DIR = conf_dir()


def require_checkout(what: str) -> Path:
    """The repository root, for code that reads files only a checkout has (``experiments/``, ``docs/``,
    ``train.py``); ``what`` says what needed it.

    Raises:
        RuntimeError: dpsyn runs from an installed package, not from a checkout.
    """
    if not IN_CHECKOUT:
        raise RuntimeError(f"{what} needs dpsyn's repository (experiments/, docs/); this dpsyn is an installed package "
                           f"at {PACKAGE_DIR}. Clone the repository and run it from there (pip install -e .)")
    return REPO_DIR
