"""Datasets: specs and loaders, embedded (Fashion-MNIST, scikit-learn) and real (MNIST, CIFAR-10, Pets, Cars, Birds,
Kaggle Credit).

``load_dataset(cfg, seed=..., data_dir=...)`` turns a ``conf/dataset/<name>.yaml`` node into a
:class:`~dpsyn.data.base.DataBundle` by dispatching on ``cfg.name`` through :data:`DATASETS`. The loaders are
registered by the explicit imports below (nothing else registers datasets).

Seeds: the fixed ``cfg.split_seed`` decides every split of the source files (public/private halves, private/eval
splits), so that public data never overlaps any run's private data; the run ``seed`` only draws the optional
``cfg.n_private`` subsample of the private set.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dpsyn.data import fmnist, real, sklearn_sets  # noqa: F401 - explicit imports register the loaders
from dpsyn.data import tables  # noqa: F401 - registers kaggle_credit (real tables)
from dpsyn.data.base import DataBundle, Split, carve_validation, hold_out_validation
from dpsyn.data.common import DATASETS, cfg_get
from dpsyn.data.idx import DataFormatError, read_idx

__all__ = ["DATASETS", "DataBundle", "DataFormatError", "Split", "carve_validation", "hold_out_validation", "load_dataset",
           "read_idx"]


def load_dataset(cfg: Any, *, seed: int, data_dir: str | Path, public: bool = True) -> DataBundle:
    """Build the dataset described by ``cfg`` (a ``conf/dataset`` node: DictConfig, dict or attribute object).

    Args:
        cfg: The dataset config; ``cfg.name`` selects the loader.
        seed: The run seed; used only to draw the ``cfg.n_private`` subsample of the private set.
        data_dir: The run's ``${paths.data_dir}``, where data files are looked for and downloaded to.
        public: False loads no public split although ``cfg.public`` names one (as for ``public: null``): a method
            that does not use public data (``Method.needs_public`` False) neither reads nor holds it. The private
            and eval splits do not depend on it.

    Returns:
        The private, eval and (optional) public splits with class names, family and provenance.

    Raises:
        ValueError: for an unknown dataset name (listing the registered ones) or an invalid config value.
        FileNotFoundError: if the data files cannot be found (the message says where it looked and how to get them).
        DataFormatError: if a data file is corrupt or truncated.
    """
    name = cfg_get(cfg, "name")
    if name is None:
        raise ValueError(f"dataset config has no 'name'; registered: {', '.join(DATASETS.names())}")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ValueError(f"seed={seed!r} must be an integer")
    loader = DATASETS.get(str(name))
    if not public and cfg_get(cfg, "public") is not None:
        cfg = _without_public(cfg)
    return loader(cfg, seed=seed, data_dir=Path(data_dir))


def _without_public(cfg: Any) -> dict[str, Any]:
    """A plain copy of the dataset config ``cfg`` with ``public: null``."""
    from omegaconf import DictConfig, OmegaConf

    if isinstance(cfg, DictConfig):
        out = OmegaConf.to_container(cfg, resolve=True)
    elif hasattr(cfg, "keys"):
        out = {k: cfg[k] for k in cfg.keys()}
    else:
        out = dict(vars(cfg))
    return {**out, "public": None}
