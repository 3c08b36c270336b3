"""Fashion-MNIST: file discovery, a cached reader, the fixed public/private halving, and the ``fmnist*`` datasets.

The four IDX files ``{train,t10k}-{images-idx3,labels-idx1}-ubyte[.gz]`` are looked for, in order, in
``data_dir``, ``data_dir/fashion-mnist``, ``data_dir/FashionMNIST/raw`` (torchvision's layout), then
:data:`SYSTEM_DIRS` (Debian's ``dataset-fashion-mnist`` package), and are downloaded by torchvision into
``data_dir`` only when the config says ``download: true``.

The train split is halved once, stratified by class, with ``split_seed`` (a fixed config value, default 0), never
with the run seed: one half is ``fmnist_public`` (the embedded stand-in for ImageNet, on which the public models are
trained), the other half is where the private data of ``fmnist_all``, ``fmnist_shoes`` and ``fmnist_tops`` is drawn
from. So a public model trained on ``fmnist_public`` never saw a private example of any run, whatever its seed.
"""

from __future__ import annotations

import functools
import logging
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from dpsyn.data.base import DataBundle, Split
from dpsyn.data.common import (
    DATASETS,
    cfg_get,
    check_config,
    finish_image_bundle,
    resolve_class_names,
    select_classes,
    stratified_split,
    subsample,
    to_float_images,
)
from dpsyn.data.idx import DataFormatError, read_idx

__all__ = [
    "FMNIST_CLASSES",
    "FMNIST_FILES",
    "SYSTEM_DIRS",
    "FashionMNISTArrays",
    "find_fashion_mnist",
    "fmnist_halves",
    "fmnist_public_split",
    "read_fashion_mnist",
    "search_dirs",
]

log = logging.getLogger(__name__)

FMNIST_CLASSES: tuple[str, ...] = (
    "T-shirt/top",
    "Trouser",
    "Pullover",
    "Dress",
    "Coat",
    "Sandal",
    "Shirt",
    "Sneaker",
    "Bag",
    "Ankle boot",
)
"""Class names in label order (0..9), as in the Fashion-MNIST release."""

FMNIST_FILES: dict[str, str] = {
    "train_images": "train-images-idx3-ubyte",
    "train_labels": "train-labels-idx1-ubyte",
    "test_images": "t10k-images-idx3-ubyte",
    "test_labels": "t10k-labels-idx1-ubyte",
}
"""Role -> file name stem; each file may also be present with a ``.gz`` suffix."""

SYSTEM_DIRS: tuple[Path, ...] = (Path("/usr/share/datasets/fashion-mnist"),)
"""System-wide locations searched after ``data_dir`` (Debian's ``dataset-fashion-mnist`` installs the first)."""

SHOES: tuple[str, ...] = ("Sandal", "Sneaker", "Ankle boot")
TOPS: tuple[str, ...] = ("T-shirt/top", "Pullover", "Coat", "Shirt")


class FashionMNISTArrays(NamedTuple):
    """The parsed files: uint8 images (N, 28, 28) and uint8 labels (N,), read-only (shared by the cache)."""

    train_x: np.ndarray
    train_y: np.ndarray
    test_x: np.ndarray
    test_y: np.ndarray
    files: dict[str, str]


def search_dirs(data_dir: str | Path) -> list[Path]:
    """The directories searched for the IDX files, in order."""
    root = Path(data_dir)
    return [root, root / "fashion-mnist", root / "FashionMNIST" / "raw", *SYSTEM_DIRS]


def _files_in(directory: Path) -> dict[str, Path] | None:
    """The four files in ``directory`` (plain preferred over ``.gz``: faster), or None if any is missing."""
    found: dict[str, Path] = {}
    for role, stem in FMNIST_FILES.items():
        for candidate in (directory / stem, directory / f"{stem}.gz"):
            if candidate.is_file():
                found[role] = candidate
                break
        else:
            return None
    return found


def _download(data_dir: Path) -> None:
    """Let torchvision download Fashion-MNIST into ``data_dir/FashionMNIST/raw``."""
    from torchvision.datasets import FashionMNIST

    log.info("downloading Fashion-MNIST into %s with torchvision", data_dir / "FashionMNIST" / "raw")
    data_dir.mkdir(parents=True, exist_ok=True)
    FashionMNIST(root=str(data_dir), train=True, download=True)


def find_fashion_mnist(data_dir: str | Path, *, download: bool = False) -> dict[str, Path]:
    """Locate the four Fashion-MNIST IDX files.

    Args:
        data_dir: The run's ``${paths.data_dir}``.
        download: Whether torchvision may download the files into ``data_dir`` when none are found.

    Returns:
        Role (``train_images``, ``train_labels``, ``test_images``, ``test_labels``) -> file path.

    Raises:
        FileNotFoundError: naming every place looked and how to get the data.
    """
    dirs = search_dirs(data_dir)
    for directory in dirs:
        files = _files_in(directory)
        if files is not None:
            log.debug("Fashion-MNIST found in %s", directory)
            return files
    problem = "not found"
    if download:
        # torchvision does not accept Debian's .gz files (their md5s differ from its table), so it is only asked
        # to download, never to read; the files it writes are then found in data_dir/FashionMNIST/raw.
        try:
            _download(Path(data_dir))
        except Exception as err:  # noqa: BLE001 - any network/IO failure becomes the message below
            problem = f"not found, and the download failed ({type(err).__name__}: {err})"
        else:
            files = _files_in(Path(data_dir) / "FashionMNIST" / "raw")
            if files is not None:
                return files
            problem = "not found, even after torchvision's download"
    names = ", ".join(f"{stem}[.gz]" for stem in FMNIST_FILES.values())
    raise FileNotFoundError(
        f"Fashion-MNIST {problem}: looked for {names} in "
        + ", ".join(str(d) for d in dirs)
        + ". To get it: `apt-get install dataset-fashion-mnist` (Debian/Ubuntu), or put the four IDX files in "
        f"{Path(data_dir)}, or set dataset.download=true to let torchvision download them into {Path(data_dir)}."
    )


@functools.lru_cache(maxsize=4)
def _read_cached(key: tuple[tuple[str, str, int, int], ...]) -> FashionMNISTArrays:
    """Parse the files named in ``key`` ((role, path, size, mtime_ns) per file: a changed file is re-read)."""
    paths = {role: Path(path) for role, path, _, _ in key}
    arrays = {}
    for role, path in paths.items():
        arrays[role] = read_idx(path, ndim=3 if role.endswith("images") else 1)
        if arrays[role].dtype != np.uint8:
            raise DataFormatError(f"{path}: IDX values are {arrays[role].dtype}, Fashion-MNIST files hold uint8")
    for split in ("train", "test"):
        x, y = arrays[f"{split}_images"], arrays[f"{split}_labels"]
        if x.shape[1:] != (28, 28):
            raise DataFormatError(f"{paths[f'{split}_images']}: images are {x.shape[1:]}, Fashion-MNIST's are 28x28")
        if len(x) != len(y):
            raise DataFormatError(
                f"{paths[f'{split}_labels']}: {len(y)} labels for the {len(x)} images of {paths[f'{split}_images']}"
            )
        if len(y) and int(y.max()) >= len(FMNIST_CLASSES):
            raise DataFormatError(f"{paths[f'{split}_labels']}: label {int(y.max())} outside 0..9")
    log.info("read Fashion-MNIST from %s", paths["train_images"].parent)
    return FashionMNISTArrays(
        arrays["train_images"],
        arrays["train_labels"],
        arrays["test_images"],
        arrays["test_labels"],
        {role: str(path) for role, path in paths.items()},
    )


def read_fashion_mnist(data_dir: str | Path, *, download: bool = False) -> FashionMNISTArrays:
    """Find (see :func:`find_fashion_mnist`) and parse Fashion-MNIST, cached in-process.

    The cache is keyed by the files' paths, sizes and modification times, so a test session parses them once.

    Raises:
        FileNotFoundError: if the files are nowhere to be found.
        DataFormatError: if a file is corrupt or truncated.
    """
    files = find_fashion_mnist(data_dir, download=download)
    key = []
    for role, path in files.items():
        stat = path.stat()
        key.append((role, str(path.resolve()), stat.st_size, stat.st_mtime_ns))
    return _read_cached(tuple(key))


def fmnist_halves(train_labels: np.ndarray, split_seed: int) -> tuple[np.ndarray, np.ndarray]:
    """The fixed halving of the train split: ``(public_idx, private_idx)``, stratified by class.

    Depends only on the labels and ``split_seed`` (never on the run seed), so ``fmnist_public`` and the private
    half of every ``fmnist_*`` run are disjoint for every run seed.
    """
    return stratified_split(train_labels, 0.5, split_seed)


def fmnist_public_split(
    data_dir: str | Path, *, split_seed: int, download: bool = False
) -> tuple[Split, dict[str, Any]]:
    """``fmnist_public``'s half of the train split (all 10 classes, original labels) as float images.

    Returns:
        ``(split, info)`` where ``info`` names the source files and the split seed.
    """
    arrays = read_fashion_mnist(data_dir, download=download)
    public_idx, _ = fmnist_halves(arrays.train_y, split_seed)
    return _train_rows(arrays, public_idx), {"source": "fmnist_public", "files": arrays.files, "split_seed": split_seed}


def _train_rows(arrays: FashionMNISTArrays, index: np.ndarray) -> Split:
    """Train rows ``index`` as float images with their original labels (0..9)."""
    return Split(to_float_images(arrays.train_x[index]), arrays.train_y[index].astype(np.int64), index)


def _load_fmnist(
    cfg: Any,
    *,
    seed: int,
    data_dir: Path,
    private_from: str,
    default_classes: tuple[str, ...] | None,
    public_options: tuple[str | None, ...],
) -> DataBundle:
    """Shared body of the ``fmnist*`` loaders.

    Args:
        cfg: The dataset config.
        seed: The run seed (only for the ``n_private`` subsample).
        data_dir: Where to look for / download the files.
        private_from: ``"train"`` (all 60k), ``"public_half"`` or ``"private_half"``.
        default_classes: Class subset when ``cfg.classes`` is null or absent (None = all classes).
        public_options: Allowed values of ``cfg.public``.
    """
    name = str(cfg_get(cfg, "name"))
    check_config(cfg, kind="image", family="fmnist", public_options=public_options, class_names=FMNIST_CLASSES)
    split_seed = int(cfg_get(cfg, "split_seed", 0))
    requested = cfg_get(cfg, "classes")
    if requested is None and default_classes is not None:
        requested = list(default_classes)  # null = this dataset's own subset (its name promises it)
    classes = resolve_class_names(requested, FMNIST_CLASSES, dataset=name) if requested is not None else None
    download = bool(cfg_get(cfg, "download", False))

    arrays = read_fashion_mnist(data_dir, download=download)
    public_idx, private_idx = fmnist_halves(arrays.train_y, split_seed)
    source = {
        "train": np.arange(len(arrays.train_y), dtype=np.int64),
        "public_half": public_idx,
        "private_half": private_idx,
    }[private_from]

    rows, labels, names = select_classes(arrays.train_y[source], FMNIST_CLASSES, classes)
    candidates = source[rows]
    keep = subsample(np.arange(len(candidates)), cfg_get(cfg, "n_private"), seed, what=f"{name} private")
    private_index = candidates[keep]
    private = Split(to_float_images(arrays.train_x[private_index]), labels[keep], private_index)

    eval_rows, eval_labels, _ = select_classes(arrays.test_y, FMNIST_CLASSES, classes)
    eval_split = Split(to_float_images(arrays.test_x[eval_rows]), eval_labels, eval_rows)

    public: Split | None = None
    if cfg_get(cfg, "public") == "fmnist_public":
        if np.array_equal(private_index, public_idx) and classes is None:
            public = private  # fmnist_public with all classes: the same half, shared rather than copied
        else:
            public = _train_rows(arrays, public_idx)
    info = {
        "source": "Fashion-MNIST",
        "files": arrays.files,
        "split_seed": split_seed,
        "seed": seed,
        "private_from": private_from,
        "n_private": cfg_get(cfg, "n_private"),
        "classes": names,
        "public": cfg_get(cfg, "public"),
    }
    return finish_image_bundle(
        cfg,
        name=name,
        family="fmnist",
        private=private,
        eval_split=eval_split,
        classes=names,
        public=public,
        public_classes=list(FMNIST_CLASSES) if public is not None else None,
        info=info,
    )


@DATASETS.register("fmnist")
def load_fmnist(cfg: Any, *, seed: int, data_dir: Path) -> DataBundle:
    """``fmnist``: private = the 60k train split, eval = the 10k test split, no public data."""
    return _load_fmnist(
        cfg,
        seed=seed,
        data_dir=data_dir,
        private_from="train",
        default_classes=None,
        public_options=(None,),
    )


@DATASETS.register("fmnist_public")
def load_fmnist_public(cfg: Any, *, seed: int, data_dir: Path) -> DataBundle:
    """``fmnist_public``: the fixed ``split_seed`` half of train, as private (to train public models with the same
    API) and as public; eval = the test split."""
    return _load_fmnist(
        cfg,
        seed=seed,
        data_dir=data_dir,
        private_from="public_half",
        default_classes=None,
        public_options=("fmnist_public", None),
    )


@DATASETS.register("fmnist_all")
def load_fmnist_all(cfg: Any, *, seed: int, data_dir: Path) -> DataBundle:
    """``fmnist_all``: private = the other half of train (all classes); public = ``fmnist_public``."""
    return _load_fmnist(
        cfg,
        seed=seed,
        data_dir=data_dir,
        private_from="private_half",
        default_classes=None,
        public_options=("fmnist_public", None),
    )


@DATASETS.register("fmnist_shoes")
def load_fmnist_shoes(cfg: Any, *, seed: int, data_dir: Path) -> DataBundle:
    """``fmnist_shoes``: sandal, sneaker, ankle boot from the private half; public = ``fmnist_public``."""
    return _load_fmnist(
        cfg,
        seed=seed,
        data_dir=data_dir,
        private_from="private_half",
        default_classes=SHOES,
        public_options=("fmnist_public", None),
    )


@DATASETS.register("fmnist_tops")
def load_fmnist_tops(cfg: Any, *, seed: int, data_dir: Path) -> DataBundle:
    """``fmnist_tops``: t-shirt/top, pullover, coat, shirt from the private half; public = ``fmnist_public``."""
    return _load_fmnist(
        cfg,
        seed=seed,
        data_dir=data_dir,
        private_from="private_half",
        default_classes=TOPS,
        public_options=("fmnist_public", None),
    )
