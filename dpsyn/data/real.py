"""Real (non-embedded) image datasets read from their official on-disk formats: ``mnist`` and ``cifar10``.

The data comes from ``data_dir`` (the run's ``${paths.data_dir}``), or from the network through torchvision when
the config says ``download: true``. Neither has public data by default.

- ``mnist``: torchvision's layout, raw IDX files in ``data_dir/MNIST/raw``, read by ``torchvision.datasets.MNIST``.
- ``cifar10``: the "python version" batches in ``data_dir/cifar-10-batches-py`` (``data_batch_1`` .. ``_5``,
  ``test_batch``, ``batches.meta``), read by :func:`read_cifar10`.
"""

from __future__ import annotations

import dataclasses
import logging
import pickle
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from dpsyn.data.base import DataBundle, Split
from dpsyn.data.common import (
    DATASETS,
    adapt_images,
    cfg_get,
    check_config,
    finish_image_bundle,
    resolve_class_names,
    select_classes,
    subsample,
    to_float_images,
)
from dpsyn.data.idx import DataFormatError, read_idx

__all__ = [
    "CIFAR10_CLASSES",
    "CIFAR10_DIR",
    "MNIST_CLASSES",
    "MNIST_RAW_FILES",
    "ImageArrays",
    "load_cifar10",
    "load_mnist",
    "read_cifar10",
    "read_mnist",
]

log = logging.getLogger(__name__)

MNIST_CLASSES: tuple[str, ...] = tuple(str(d) for d in range(10))
MNIST_RAW_FILES: tuple[str, ...] = (
    "train-images-idx3-ubyte",
    "train-labels-idx1-ubyte",
    "t10k-images-idx3-ubyte",
    "t10k-labels-idx1-ubyte",
)
"""Files torchvision's MNIST reads from ``data_dir/MNIST/raw`` (gunzipped)."""

CIFAR10_DIR = "cifar-10-batches-py"
CIFAR10_TRAIN_FILES: tuple[str, ...] = tuple(f"data_batch_{i}" for i in range(1, 6))
CIFAR10_TEST_FILES: tuple[str, ...] = ("test_batch",)
CIFAR10_META = "batches.meta"
CIFAR10_CLASSES: tuple[str, ...] = (
    "airplane",
    "automobile",
    "bird",
    "cat",
    "deer",
    "dog",
    "frog",
    "horse",
    "ship",
    "truck",
)


class ImageArrays(NamedTuple):
    """uint8 images (N, H, W) or (N, C, H, W), int64 labels, class names and the files they came from."""

    train_x: np.ndarray
    train_y: np.ndarray
    test_x: np.ndarray
    test_y: np.ndarray
    classes: tuple[str, ...]
    files: dict[str, str]


def _ensure_files(
    what: str, folder: Path, names: Any, *, download: bool, hint: str, fetch: Callable[[], Any]
) -> None:
    """Check that ``folder`` holds every file in ``names``; else download them with ``fetch`` when allowed.

    Raises:
        FileNotFoundError: files missing and ``download`` false, or the download failed (the message names the
            folder, the missing files and ``hint``).
    """
    missing = [n for n in names if not (folder / n).is_file()]
    if not missing:
        return
    if not download:
        raise FileNotFoundError(f"{what} not found: {folder} lacks {', '.join(missing)}; {hint}")
    log.info("downloading %s into %s with torchvision", what, folder)
    try:
        fetch()
    except Exception as err:  # noqa: BLE001 - any network/IO failure becomes a FileNotFoundError
        raise FileNotFoundError(
            f"{what} not found in {folder} and torchvision's download failed ({type(err).__name__}: {err}); {hint}"
        ) from err


# ---------------------------------------------------------------------------------------------------------- MNIST


def read_mnist(data_dir: str | Path, *, download: bool = False) -> ImageArrays:
    """Read MNIST with ``torchvision.datasets.MNIST(root=data_dir)``.

    Args:
        data_dir: Root holding ``MNIST/raw/`` (torchvision's layout).
        download: Whether torchvision may download the files when they are missing.

    Raises:
        FileNotFoundError: if files are missing and ``download`` is false (or the download fails).
        DataFormatError: if a file is corrupt or truncated.
    """
    from torchvision.datasets import MNIST

    root = Path(data_dir)
    raw = root / "MNIST" / "raw"
    _ensure_files(
        "MNIST", raw, MNIST_RAW_FILES, download=download,
        hint=f"put the gunzipped IDX files there, or set dataset.download=true to let torchvision download them into {root}",
        fetch=lambda: MNIST(root=str(root), train=True, download=True),
    )
    files = {name: str(raw / name) for name in MNIST_RAW_FILES}
    splits = []
    for train in (True, False):
        try:
            ds = MNIST(root=str(root), train=train, download=False)
        except (AssertionError, RuntimeError, ValueError, TypeError, IndexError, KeyError) as err:
            # torchvision's parser fails with bare asserts / reshape errors: find the bad file with our reader.
            for name in MNIST_RAW_FILES:
                read_idx(raw / name, ndim=3 if "images" in name else 1)
            raise DataFormatError(f"{raw}: torchvision could not read MNIST ({type(err).__name__}: {err})") from err
        x, y = ds.data.numpy(), ds.targets.numpy().astype(np.int64)
        prefix = "train" if train else "t10k"
        if x.ndim != 3 or len(x) != len(y):
            raise DataFormatError(f"{raw}: {prefix} images {tuple(x.shape)} do not match {len(y)} labels")
        if len(y) and (y.min() < 0 or y.max() > 9):
            raise DataFormatError(f"{raw / f'{prefix}-labels-idx1-ubyte'}: labels outside 0..9")
        splits.append((x, y))
    (train_x, train_y), (test_x, test_y) = splits
    return ImageArrays(train_x, train_y, test_x, test_y, MNIST_CLASSES, files)


# -------------------------------------------------------------------------------------------------------- CIFAR-10


def _load_pickle(path: Path) -> dict[str, Any]:
    """Unpickle one CIFAR-10 batch file, with ``str`` keys whatever Python pickled it.

    The official files were pickled by Python 2; ``encoding="bytes"`` (what the CIFAR-10 page prescribes) yields
    ``bytes`` keys, files pickled by Python 3 keep ``str`` keys: both are normalised to ``str``.
    Note that unpickling runs code chosen by the file's author: only read files you trust (torchvision's CIFAR10
    reads the same pickles the same way).
    """
    try:
        with path.open("rb") as f:
            obj = pickle.load(f, encoding="bytes")  # noqa: S301 - the dataset's official format is a pickle
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError, ImportError, IndexError) as err:
        raise DataFormatError(f"{path}: not a readable CIFAR-10 pickle ({type(err).__name__}: {err})") from err
    if not isinstance(obj, dict):
        raise DataFormatError(f"{path}: expected a pickled dict, found {type(obj).__name__}")
    return {k.decode("latin1") if isinstance(k, bytes) else str(k): v for k, v in obj.items()}


def _read_cifar_batch(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """One batch: uint8 images (N, 3, 32, 32) and int64 labels (N,)."""
    batch = _load_pickle(path)
    for key in ("data", "labels"):
        if key not in batch:
            raise DataFormatError(f"{path}: no {key!r} entry (found {sorted(batch)})")
    data = np.asarray(batch["data"])
    if data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != 3 * 32 * 32:
        raise DataFormatError(f"{path}: 'data' is {data.dtype} {data.shape}, expected uint8 (N, 3072)")
    labels = np.asarray(batch["labels"])
    if labels.ndim != 1 or len(labels) != len(data) or (len(labels) and labels.dtype.kind not in "iu"):
        raise DataFormatError(f"{path}: 'labels' has shape {labels.shape}, expected {len(data)} integers")
    if len(labels) and (labels.min() < 0 or labels.max() >= len(CIFAR10_CLASSES)):
        raise DataFormatError(f"{path}: labels outside 0..{len(CIFAR10_CLASSES) - 1}")
    return data.reshape(-1, 3, 32, 32), labels.astype(np.int64)


def read_cifar10(data_dir: str | Path, *, download: bool = False) -> ImageArrays:
    """Read CIFAR-10's python-version batches from ``data_dir/cifar-10-batches-py``.

    The pickles are read by this small reader rather than ``torchvision.datasets.CIFAR10``, because torchvision
    checks the md5 of every official file and so rejects any other file in the same format (such as the tiny files
    the tests write); torchvision is used only to download (and md5-check) the official archive when ``download``
    is true and the files are missing.

    Raises:
        FileNotFoundError: if files are missing and ``download`` is false (or the download fails).
        DataFormatError: if a file is corrupt, truncated or has unexpected content.
    """
    root = Path(data_dir)
    folder = root / CIFAR10_DIR
    names = (*CIFAR10_TRAIN_FILES, *CIFAR10_TEST_FILES, CIFAR10_META)

    def fetch() -> None:
        from torchvision.datasets import CIFAR10

        CIFAR10(root=str(root), train=True, download=True)

    _ensure_files(
        "CIFAR-10", folder, names, download=download, fetch=fetch,
        hint="put the python-version batches (cifar-10-python.tar.gz, extracted) there, or set dataset.download=true "
        f"to let torchvision download them (~170 MB) into {root}",
    )

    meta = _load_pickle(folder / CIFAR10_META)
    raw_names = meta.get("label_names")
    if not isinstance(raw_names, (list, tuple)) or len(raw_names) != len(CIFAR10_CLASSES):
        raise DataFormatError(
            f"{folder / CIFAR10_META}: 'label_names' should list {len(CIFAR10_CLASSES)} names, found {raw_names!r}"
        )
    classes = tuple(n.decode("latin1") if isinstance(n, bytes) else str(n) for n in raw_names)

    def read(files: tuple[str, ...]) -> tuple[np.ndarray, np.ndarray]:
        parts = [_read_cifar_batch(folder / n) for n in files]
        return np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])

    train_x, train_y = read(CIFAR10_TRAIN_FILES)
    test_x, test_y = read(CIFAR10_TEST_FILES)
    return ImageArrays(train_x, train_y, test_x, test_y, classes, {n: str(folder / n) for n in names})


# ------------------------------------------------------------------------------------------- ImageNet (public)

IMAGENET_VAL_DIR = "imagenet/val"
IMAGE_SUFFIXES = (".jpeg", ".jpg", ".png")


def read_imagenet_val(data_dir: str | Path, *, resolution: int, n: int | None = None, seed: int = 0
                      ) -> tuple[np.ndarray, np.ndarray, list[str], str]:
    """ImageNet's validation images as public data (paper 000's public pool), from ``data_dir/imagenet/val`` in
    class folders (``val/<wnid>/*.JPEG``, the layout of torchvision's ``ImageFolder``), resized to ``resolution``
    (shorter side, centre crop) as uint8 RGB (N, 3, H, W).

    Args:
        n: read a seeded subsample of this many images (None = all 50k).

    Returns:
        (images, labels, class folder names, folder).

    Raises:
        FileNotFoundError: the folder is missing or holds no class folder with images (the message says what to get).
    """
    from PIL import Image

    folder = Path(data_dir) / IMAGENET_VAL_DIR
    hint = ("download the ILSVRC2012 validation images (ILSVRC2012_img_val.tar, image-net.org, needs an account), "
            f"sort them into one folder per class (e.g. with the valprep.sh script) and put the class folders in {folder}")
    classes = sorted(d.name for d in folder.iterdir() if d.is_dir()) if folder.is_dir() else []
    files = [(f, k) for k, c in enumerate(classes) for f in sorted((folder / c).iterdir())
             if f.suffix.lower() in IMAGE_SUFFIXES]
    if not files:
        raise FileNotFoundError(f"ImageNet validation images not found in {folder}; {hint}")
    if n is not None and n < len(files):
        pick = np.sort(np.random.default_rng(seed).choice(len(files), size=n, replace=False))
        files = [files[i] for i in pick]
    x = np.empty((len(files), 3, resolution, resolution), np.uint8)
    for i, (f, _) in enumerate(files):
        with Image.open(f) as im:
            im = im.convert("RGB")
            scale = resolution / min(im.size)
            im = im.resize((max(resolution, round(im.size[0] * scale)), max(resolution, round(im.size[1] * scale))),
                           Image.BILINEAR)
            left, top = (im.size[0] - resolution) // 2, (im.size[1] - resolution) // 2
            x[i] = np.asarray(im.crop((left, top, left + resolution, top + resolution))).transpose(2, 0, 1)
    return x, np.array([k for _, k in files], np.int64), classes, str(folder)


# --------------------------------------------------------------------------------------------------------- loaders


def _load_real(cfg: Any, *, seed: int, arrays: ImageArrays, family: str) -> DataBundle:
    """private = train split (class subset, ``n_private`` subsample), eval = test split, no public data."""
    name = str(cfg_get(cfg, "name"))
    requested = cfg_get(cfg, "classes")
    classes = resolve_class_names(requested, arrays.classes, dataset=name) if requested is not None else None
    rows, labels, names = select_classes(arrays.train_y, arrays.classes, classes)
    keep = subsample(np.arange(len(rows)), cfg_get(cfg, "n_private"), seed, what=f"{name} private")
    private_index = rows[keep]
    private = Split(to_float_images(arrays.train_x[private_index]), labels[keep], private_index)
    eval_rows, eval_labels, _ = select_classes(arrays.test_y, arrays.classes, classes)
    eval_split = Split(to_float_images(arrays.test_x[eval_rows]), eval_labels, eval_rows)
    info = {
        "source": family,
        "files": arrays.files,
        "split_seed": int(cfg_get(cfg, "split_seed", 0)),
        "seed": seed,
        "n_private": cfg_get(cfg, "n_private"),
        "classes": names,
        "public": None,
    }
    return finish_image_bundle(
        cfg,
        name=name,
        family=family,
        private=private,
        eval_split=eval_split,
        classes=names,
        public=None,
        public_classes=None,
        info=info,
    )


@DATASETS.register("mnist")
def load_mnist(cfg: Any, *, seed: int, data_dir: Path) -> DataBundle:
    """``mnist``: private = the 60k train split, eval = the 10k test split, classes "0".."9", no public data."""
    check_config(cfg, kind="image", family="mnist", public_options=(None,), class_names=MNIST_CLASSES)
    arrays = read_mnist(data_dir, download=bool(cfg_get(cfg, "download", False)))
    return _load_real(cfg, seed=seed, arrays=arrays, family="mnist")


@DATASETS.register("cifar10")
def load_cifar10(cfg: Any, *, seed: int, data_dir: Path) -> DataBundle:
    """``cifar10``: private = the 50k train split, eval = the 10k test split (32x32 RGB), no public data."""
    check_config(cfg, kind="image", family="cifar10", public_options=(None, "imagenet_val"),
                 class_names=CIFAR10_CLASSES, extra_keys=("n_public",))
    arrays = read_cifar10(data_dir, download=bool(cfg_get(cfg, "download", False)))
    bundle = _load_real(cfg, seed=seed, arrays=arrays, family="cifar10")
    if cfg_get(cfg, "public") != "imagenet_val":
        return bundle
    # paper 000's public data: ImageNet validation images at CIFAR-10's resolution (the public models' domain)
    x, y, wnids, folder = read_imagenet_val(data_dir, resolution=32, n=cfg_get(cfg, "n_public"), seed=0)
    public = Split(adapt_images(to_float_images(x), resolution=cfg_get(cfg, "resolution"),
                                channels=cfg_get(cfg, "channels")), y, np.arange(len(y)))
    info = {**bundle.info, "public": "imagenet_val", "public_files": folder}
    info["sizes"] = {**info.get("sizes", {}), "public": len(public)}
    return dataclasses.replace(bundle, public=public, public_classes=wnids, info=info)
