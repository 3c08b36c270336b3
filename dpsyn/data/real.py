"""Real (non-embedded) image datasets read from their official on-disk formats: ``mnist``, ``cifar10`` and paper
000's fine-grained sets ``pets``, ``cars``, ``birds``.

The data comes from ``data_dir`` (the run's ``${paths.data_dir}``), or from the network when the config says
``download: true`` (where a download still exists). None has public data by default.

- ``mnist``: torchvision's layout, raw IDX files in ``data_dir/MNIST/raw``, read by ``torchvision.datasets.MNIST``.
- ``cifar10``: the "python version" batches in ``data_dir/cifar-10-batches-py`` (``data_batch_1`` .. ``_5``,
  ``test_batch``, ``batches.meta``), read by :func:`read_cifar10`.
- ``pets``: Oxford-IIIT Pet as its two archives extract (torchvision's ``OxfordIIITPet`` layout):
  ``data_dir/oxford-iiit-pet/images/*.jpg``, ``annotations/{trainval,test}.txt``; read by :func:`read_pets_index`.
- ``cars``: Stanford Cars in torchvision's ``StanfordCars`` layout: ``data_dir/stanford_cars/{cars_train,cars_test}/``,
  ``devkit/{cars_meta,cars_train_annos}.mat``, ``cars_test_annos_withlabels.mat``; read by :func:`read_cars_index`.
- ``birds``: CUB-200-2011 as ``CUB_200_2011.tgz`` extracts: ``data_dir/CUB_200_2011/{images.txt,
  image_class_labels.txt, train_test_split.txt, classes.txt, images/}``; read by :func:`read_birds_index`.
- ``celeba_gender``, ``celeba_hair`` (paper 002's CelebA-Gender and CelebA-Hair): CelebA's aligned images as the
  official release (and torchvision's ``CelebA`` layout) has them: ``data_dir/celeba/img_align_celeba/*.jpg``,
  ``list_attr_celeba.txt``, ``list_eval_partition.txt``; read by :func:`read_celeba_index`.

The fine-grained sets are JPEGs of every size: their annotation files are read first (so that a bad class name
fails before any image is decoded), then only the images a run uses are decoded with PIL, centre-cropped to a square
and resized (bilinear) to ``resolution`` (:func:`read_square_images`). Nothing is cached: every load decodes again.
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
    "ImageIndex",
    "CELEBA_TASKS",
    "load_birds",
    "load_cars",
    "load_celeba",
    "load_cifar10",
    "load_mnist",
    "load_pets",
    "read_birds_index",
    "read_cars_index",
    "read_celeba_index",
    "read_cifar10",
    "read_mnist",
    "read_pets_index",
    "read_square_images",
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


# ------------------------------------------------------------------- Oxford-IIIT Pet, Stanford Cars, CUB-200-2011

PETS_DIR = "oxford-iiit-pet"
PETS_ANNOTATIONS: tuple[str, ...] = ("annotations/trainval.txt", "annotations/test.txt")
PETS_URL = "https://www.robots.ox.ac.uk/~vgg/data/pets/"
CARS_DIR = "stanford_cars"
CARS_META = "devkit/cars_meta.mat"
CARS_TRAIN_ANNOS = "devkit/cars_train_annos.mat"
CARS_TEST_ANNOS = "cars_test_annos_withlabels.mat"
BIRDS_DIR = "CUB_200_2011"
BIRDS_FILES: tuple[str, ...] = ("images.txt", "image_class_labels.txt", "train_test_split.txt", "classes.txt")
BIRDS_URL = "https://data.caltech.edu/records/65de6-vp158/files/CUB_200_2011.tgz"
BIRDS_MD5 = "97eceeb196236b17998738112f37df78"


class ImageIndex(NamedTuple):
    """Image files and int64 labels (0-based) of a dataset's official train and test splits, before decoding."""

    train_files: list[Path]
    train_y: np.ndarray
    test_files: list[Path]
    test_y: np.ndarray
    classes: tuple[str, ...]
    files: dict[str, str]


def _check_images_exist(what: str, index: ImageIndex, hint: str) -> ImageIndex:
    """Fail at once (not after minutes of decoding) when an image the annotations list is missing."""
    listed = [*index.train_files, *index.test_files]
    missing = [f for f in listed if not f.is_file()]
    if missing:
        raise FileNotFoundError(
            f"{what}: {len(missing)} of the {len(listed)} images its annotation files list are missing, e.g. "
            f"{missing[0]}; {hint}"
        )
    return index


def _text_rows(path: Path, *, min_fields: int, form: str) -> list[tuple[int, list[str]]]:
    """Non-empty, non-comment (``#``) lines of a whitespace-separated annotation file, with their line numbers."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise DataFormatError(f"{path}: unreadable ({type(err).__name__}: {err})") from err
    rows = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        fields = line.split()
        if len(fields) < min_fields:
            raise DataFormatError(f"{path}:{number}: expected {form!r}, found {line!r}")
        rows.append((number, fields))
    return rows


def _int_field(path: Path, number: int, value: str, *, low: int, high: int | None = None) -> int:
    """An integer annotation field, checked to lie in ``low..high``."""
    try:
        out = int(value)
    except ValueError:
        raise DataFormatError(f"{path}:{number}: {value!r} is not an integer") from None
    if out < low or (high is not None and out > high):
        raise DataFormatError(f"{path}:{number}: {out} outside {low}..{high if high is not None else ''}")
    return out


def read_pets_index(data_dir: str | Path, *, download: bool = False) -> ImageIndex:
    """Oxford-IIIT Pet's trainval (private) and test (eval) lists from ``data_dir/oxford-iiit-pet``.

    Each line of ``annotations/{trainval,test}.txt`` reads ``<image> <class id 1..37> <species> <breed id>``
    (``Abyssinian_100 1 1 1``); the image is ``images/<image>.jpg``. Class names are the breeds of the image names
    written as torchvision's ``OxfordIIITPet`` writes them (``american_bulldog`` -> ``American Bulldog``). The lists
    are parsed here rather than by ``OxfordIIITPet``, which says only "Dataset not found" for any missing file;
    torchvision is used to download (and md5-check) the official archives when ``download`` is true.

    Raises:
        FileNotFoundError: an annotation file or a listed image is missing (the message says what to get, where).
        DataFormatError: a malformed line, a class id out of range or two breeds under one class id.
    """
    root = Path(data_dir)
    folder = root / PETS_DIR
    hint = (f"download images.tar.gz and annotations.tar.gz from {PETS_URL} and extract both into {folder} "
            f"(images/*.jpg, annotations/trainval.txt, annotations/test.txt; {root} is paths.data_dir), or set "
            "dataset.download=true to let torchvision download them (~800 MB)")

    def fetch() -> None:
        from torchvision.datasets import OxfordIIITPet

        OxfordIIITPet(root=str(root), split="trainval", download=True)

    _ensure_files("Oxford-IIIT Pet", folder, PETS_ANNOTATIONS, download=download, hint=hint, fetch=fetch)
    breeds: dict[int, str] = {}
    splits = []
    for name in PETS_ANNOTATIONS:
        path = folder / name
        files, labels = [], []
        for number, fields in _text_rows(path, min_fields=2, form="<image> <class id> <species> <breed id>"):
            image, class_id = fields[0], _int_field(path, number, fields[1], low=1)
            breed = " ".join(part.title() for part in image.rsplit("_", 1)[0].split("_"))
            if breeds.setdefault(class_id, breed) != breed:
                raise DataFormatError(
                    f"{path}:{number}: class {class_id} is {breeds[class_id]!r} elsewhere, not {breed!r}"
                )
            files.append(folder / "images" / f"{image}.jpg")
            labels.append(class_id - 1)
        splits.append((files, np.array(labels, dtype=np.int64)))
    if sorted(breeds) != list(range(1, len(breeds) + 1)):
        raise DataFormatError(f"{folder / 'annotations'}: class ids {sorted(breeds)} are not 1..{len(breeds)}")
    classes = tuple(breeds[k] for k in range(1, len(breeds) + 1))
    (train_files, train_y), (test_files, test_y) = splits
    provenance = {n: str(folder / n) for n in PETS_ANNOTATIONS} | {"images": str(folder / "images")}
    index = ImageIndex(train_files, train_y, test_files, test_y, classes, provenance)
    return _check_images_exist("Oxford-IIIT Pet", index, hint)


def _loadmat(path: Path, key: str) -> np.ndarray:
    """``scipy.io.loadmat(path, squeeze_me=True)[key]`` as an at-least-1-d array, or a DataFormatError."""
    import scipy.io

    try:
        mat = scipy.io.loadmat(str(path), squeeze_me=True)
    except Exception as err:  # noqa: BLE001 - scipy raises ValueError, TypeError, MatReadError, ... on a bad file
        raise DataFormatError(f"{path}: not a readable MATLAB file ({type(err).__name__}: {err})") from err
    if key not in mat:
        raise DataFormatError(f"{path}: no {key!r} variable (found {sorted(k for k in mat if not k.startswith('__'))})")
    return np.atleast_1d(mat[key])


def _cars_annotations(path: Path, images: Path, n_classes: int) -> tuple[list[Path], np.ndarray]:
    """The ``annotations`` struct array of a Stanford Cars .mat file: image files and 0-based labels."""
    annotations = _loadmat(path, "annotations")
    fields = annotations.dtype.names or ()
    if "fname" not in fields or "class" not in fields:
        raise DataFormatError(f"{path}: 'annotations' should be a struct array with fields fname and class "
                              f"(found {list(fields)})")
    files, labels = [], []
    for i, record in enumerate(annotations):
        label = int(np.asarray(record["class"]).item())
        if not 1 <= label <= n_classes:
            raise DataFormatError(f"{path}: annotation {i} has class {label}, outside 1..{n_classes}")
        files.append(images / str(record["fname"]))
        labels.append(label - 1)
    return files, np.array(labels, dtype=np.int64)


def read_cars_index(data_dir: str | Path, *, download: bool = False) -> ImageIndex:
    """Stanford Cars' train (private) and test (eval) annotations from ``data_dir/stanford_cars``.

    torchvision's ``StanfordCars`` layout and reading: ``devkit/cars_meta.mat`` (``class_names``, 196 names),
    ``devkit/cars_train_annos.mat`` and ``cars_test_annos_withlabels.mat`` (``annotations`` struct arrays with
    ``fname`` and ``class`` 1..196), images in ``cars_train/`` and ``cars_test/``. Parsed here with
    ``scipy.io.loadmat`` (what ``StanfordCars`` calls) to name the bad file on failure; the dataset has no download
    any more (torchvision's ``download=True`` raises, and the error says so).

    Raises:
        FileNotFoundError: a .mat file or a listed image is missing (the message says what to get, where).
        DataFormatError: an unreadable .mat file, a missing variable or field, a class out of range.
    """
    root = Path(data_dir)
    folder = root / CARS_DIR
    hint = ("the original Stanford URL (https://ai.stanford.edu/~jkrause/cars/car_dataset.html) is gone: get "
            "cars_train.tgz, cars_test.tgz, car_devkit.tgz and cars_test_annos_withlabels.mat from a mirror and "
            f"arrange them in {folder} as cars_train/*.jpg, cars_test/*.jpg, {CARS_META}, {CARS_TRAIN_ANNOS}, "
            f"{CARS_TEST_ANNOS} "
            f"(torchvision's StanfordCars layout; {root} is paths.data_dir)")

    def fetch() -> None:
        from torchvision.datasets import StanfordCars

        StanfordCars(root=str(root), split="train", download=True)

    names = (CARS_META, CARS_TRAIN_ANNOS, CARS_TEST_ANNOS)
    _ensure_files("Stanford Cars", folder, names, download=download, hint=hint, fetch=fetch)
    classes = tuple(str(c) for c in _loadmat(folder / CARS_META, "class_names").tolist())
    train_files, train_y = _cars_annotations(folder / CARS_TRAIN_ANNOS, folder / "cars_train", len(classes))
    test_files, test_y = _cars_annotations(folder / CARS_TEST_ANNOS, folder / "cars_test", len(classes))
    provenance = {n: str(folder / n) for n in names} | {"images": str(folder)}
    index = ImageIndex(train_files, train_y, test_files, test_y, classes, provenance)
    return _check_images_exist("Stanford Cars", index, hint)


def read_birds_index(data_dir: str | Path, *, download: bool = False) -> ImageIndex:
    """CUB-200-2011's official train (private) and test (eval) split from ``data_dir/CUB_200_2011``.

    ``images.txt`` (``<image id> <path under images/>``), ``image_class_labels.txt`` (``<image id> <class 1..200>``),
    ``train_test_split.txt`` (``<image id> <1 = train, 0 = test>``) and ``classes.txt`` (``<class id> <name>``,
    names such as ``001.Black_footed_Albatross`` kept as written). torchvision has no CUB class: with ``download``
    true, torchvision's ``download_and_extract_archive`` fetches and md5-checks ``CUB_200_2011.tgz`` from CaltechDATA.

    Raises:
        FileNotFoundError: a list file or a listed image is missing (the message says what to get, where).
        DataFormatError: a malformed line, ids that do not agree across the files, a class or flag out of range.
    """
    root = Path(data_dir)
    folder = root / BIRDS_DIR
    hint = (f"download CUB_200_2011.tgz ({BIRDS_URL}, from https://www.vision.caltech.edu/datasets/cub_200_2011/) and "
            f"extract it into {root} (paths.data_dir), giving {folder}/images.txt and {folder}/images/, or set "
            "dataset.download=true to download it (~1.1 GB)")

    def fetch() -> None:
        from torchvision.datasets.utils import download_and_extract_archive

        download_and_extract_archive(BIRDS_URL, download_root=str(root), md5=BIRDS_MD5)

    _ensure_files("CUB-200-2011", folder, BIRDS_FILES, download=download, hint=hint, fetch=fetch)

    def mapping(name: str, form: str) -> dict[int, tuple[int, str]]:
        path = folder / name
        out: dict[int, tuple[int, str]] = {}
        for number, fields in _text_rows(path, min_fields=2, form=form):
            key = _int_field(path, number, fields[0], low=1)
            if key in out:
                raise DataFormatError(f"{path}:{number}: id {key} appears twice")
            out[key] = (number, " ".join(fields[1:]))
        return out

    paths = mapping("images.txt", "<image id> <image path>")
    labels = mapping("image_class_labels.txt", "<image id> <class id>")
    split = mapping("train_test_split.txt", "<image id> <is training image>")
    names = mapping("classes.txt", "<class id> <class name>")
    if sorted(names) != list(range(1, len(names) + 1)):
        raise DataFormatError(f"{folder / 'classes.txt'}: class ids are not 1..{len(names)}")
    for other, table in (("image_class_labels.txt", labels), ("train_test_split.txt", split)):
        if table.keys() != paths.keys():
            odd = sorted(table.keys() ^ paths.keys())[0]
            raise DataFormatError(f"{folder / other}: its image ids differ from images.txt's (e.g. id {odd})")
    train_files, train_y, test_files, test_y = [], [], [], []
    for image_id in sorted(paths):
        number, value = labels[image_id]
        label = _int_field(folder / "image_class_labels.txt", number, value, low=1, high=len(names)) - 1
        number, value = split[image_id]
        is_train = _int_field(folder / "train_test_split.txt", number, value, low=0, high=1)
        (train_files if is_train else test_files).append(folder / "images" / paths[image_id][1])
        (train_y if is_train else test_y).append(label)
    classes = tuple(names[k][1] for k in range(1, len(names) + 1))
    provenance = {n: str(folder / n) for n in BIRDS_FILES} | {"images": str(folder / "images")}
    index = ImageIndex(train_files, np.array(train_y, dtype=np.int64), test_files, np.array(test_y, dtype=np.int64),
                       classes, provenance)
    return _check_images_exist("CUB-200-2011", index, hint)


CELEBA_DIR = "celeba"
CELEBA_TASKS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "gender": (("Male",), ("female", "male")),
    "hair": (("Black_Hair", "Blond_Hair", "Brown_Hair"), ("black", "blond", "brown")),
}
"""Paper 002's CelebA tasks: the attributes read and the class names. ``gender``: ``Male`` -1/1 -> female/male, every
image. ``hair``: the images with exactly one of the three hair-colour attributes at 1, labelled by it (the paper's
"three hair color attributes (black/blonde/brown)"; images with none or several are left out: a reconstruction, the
paper does not say)."""


def read_celeba_index(data_dir: str | Path, task: str, *, download: bool = False) -> ImageIndex:
    """CelebA's official train (partition 0: private) and test (partition 2: eval) images for ``task`` from
    ``data_dir/celeba``: ``list_attr_celeba.txt`` (a count line, a line of 40 attribute names, then one line per image:
    its file name and 40 values of -1 or 1), ``list_eval_partition.txt`` (file name, 0 train / 1 valid / 2 test) and
    ``img_align_celeba/``. The validation partition is not used (the paper follows the official train/test split).

    Raises:
        FileNotFoundError: a missing file (the message says where to put it).
        DataFormatError: a malformed line (path and line number), or files the two lists disagree on.
        ValueError: an unknown task.
    """
    if task not in CELEBA_TASKS:
        raise ValueError(f"CelebA task {task!r}; allowed: {', '.join(CELEBA_TASKS)}")
    if download:
        raise ValueError("dataset.download=true: dpsyn does not download CelebA (Google Drive needs a browser); put "
                         "img_align_celeba/, list_attr_celeba.txt and list_eval_partition.txt in "
                         f"{Path(data_dir) / CELEBA_DIR}")
    root = Path(data_dir) / CELEBA_DIR
    attr_path, part_path = root / "list_attr_celeba.txt", root / "list_eval_partition.txt"
    images = root / "img_align_celeba"
    hint = (f"put CelebA's aligned images and annotation files (img_align_celeba/, list_attr_celeba.txt, "
            f"list_eval_partition.txt) in {root}")
    for path in (attr_path, part_path):
        if not path.is_file():
            raise FileNotFoundError(f"CelebA: {path} not found; {hint}")
    rows = _text_rows(attr_path, min_fields=1, form="count, then attribute names, then 'file v1 .. v40'")
    if len(rows) < 2:
        raise DataFormatError(f"{attr_path}: expected a count line and an attribute-name line")
    (_, count_fields), (_, names) = rows[0], rows[1]
    count = _int_field(attr_path, rows[0][0], count_fields[0], low=0)
    attributes, classes = CELEBA_TASKS[task]
    missing = [a for a in attributes if a not in names]
    if missing:
        raise DataFormatError(f"{attr_path}: attribute {missing[0]!r} not among the names on line {rows[1][0]}")
    cols = [names.index(a) for a in attributes]
    values: dict[str, list[int]] = {}
    for number, fields in rows[2:]:
        if len(fields) != len(names) + 1:
            raise DataFormatError(f"{attr_path}:{number}: expected a file name and {len(names)} values, found "
                                  f"{len(fields)} fields")
        values[fields[0]] = [_int_field(attr_path, number, fields[1 + c], low=-1, high=1) for c in cols]
    if len(values) != count:
        raise DataFormatError(f"{attr_path}: the first line says {count} images, {len(values)} lines follow")
    split: dict[str, int] = {}
    for number, fields in _text_rows(part_path, min_fields=2, form="file partition"):
        split[fields[0]] = _int_field(part_path, number, fields[1], low=0, high=2)
    if set(split) != set(values):
        extra = sorted(set(split) ^ set(values))[0]
        raise DataFormatError(f"{attr_path} and {part_path} list different images (e.g. {extra})")
    out: dict[int, tuple[list[Path], list[int]]] = {0: ([], []), 2: ([], [])}
    for name in sorted(values):
        v = values[name]
        if task == "gender":
            label = int(v[0] == 1)
        else:
            on = [i for i, x in enumerate(v) if x == 1]
            if len(on) != 1:
                continue
            label = on[0]
        if split[name] in out:
            out[split[name]][0].append(images / name)
            out[split[name]][1].append(label)
    index = ImageIndex(out[0][0], np.asarray(out[0][1], np.int64), out[2][0], np.asarray(out[2][1], np.int64),
                       classes, {"attributes": str(attr_path), "partition": str(part_path), "images": str(images)})
    return _check_images_exist("CelebA", index, hint)


def read_square_images(files: list[Path], *, resolution: int, what: str = "images",
                       crop: int | None = None) -> np.ndarray:
    """Decode image files with PIL as uint8 RGB (N, 3, resolution, resolution), with a progress bar on a terminal.

    Each image (grey, CMYK or RGB) is converted to RGB, centre-cropped to the largest square (side = its shorter
    side; or ``crop`` x ``crop`` pixels where given, at most the shorter side) and resized to ``resolution`` with
    PIL's bilinear filter (antialiased when shrinking).

    Raises:
        DataFormatError: a file PIL cannot read (the message names it).
    """
    from PIL import Image
    from tqdm.auto import tqdm

    out = np.empty((len(files), 3, resolution, resolution), dtype=np.uint8)
    log.info("decoding %d %s at %dx%d", len(files), what, resolution, resolution)
    for i, path in enumerate(tqdm(files, desc=what, unit="img", leave=False, disable=None)):
        try:
            with Image.open(path) as im:
                im = im.convert("RGB")
                side = min(im.size) if crop is None else min(int(crop), *im.size)
                left, top = (im.size[0] - side) // 2, (im.size[1] - side) // 2
                im = im.crop((left, top, left + side, top + side))
                if side != resolution:
                    im = im.resize((resolution, resolution), Image.Resampling.BILINEAR)
                out[i] = np.asarray(im).transpose(2, 0, 1)
        except (OSError, ValueError, SyntaxError) as err:  # PIL's UnidentifiedImageError is an OSError
            raise DataFormatError(f"{path}: not a readable image ({type(err).__name__}: {err})") from err
    return out



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


def _check_finegrained_config(cfg: Any, *, family: str, extra_keys: tuple[str, ...] = (),
                              public_options: tuple[str | None, ...] = (None, "imagenet_val")) -> None:
    """:func:`check_config` for ``pets``/``cars``/``birds``, whose class names come from their annotation files.

    Here the form of ``classes`` is checked (a non-empty list of distinct names); the names themselves are checked
    against the annotation files by :func:`_load_finegrained`, still before any image is decoded.
    """
    name = cfg_get(cfg, "name")
    requested = cfg_get(cfg, "classes")
    if requested is not None and (isinstance(requested, str) or not isinstance(requested, list) or not requested):
        raise ValueError(f"dataset.classes={requested!r} must be null (all) or a non-empty list of class names of "
                         f"dataset {name!r}")
    check_config(cfg, kind="image", family=family, public_options=public_options,
                 class_names=[str(c) for c in requested] if requested is not None else None,
                 extra_keys=("n_public", *extra_keys))
    if cfg_get(cfg, "resolution") is None:
        raise ValueError(f"dataset.resolution=null: the images of dataset {name!r} have no common native size; "
                         "allowed: a positive integer (paper 000: 128)")


def _load_finegrained(cfg: Any, *, seed: int, data_dir: Path, index: ImageIndex, family: str,
                      crop: int | None = None) -> DataBundle:
    """private = official train split (class subset, ``n_private`` subsample), eval = official test split of the
    same classes, both decoded at ``resolution``; public = ImageNet validation images with ``public: imagenet_val``.

    Only the images a run uses are decoded (a class subset or ``n_private`` decodes fewer), after the class names
    have been checked against the annotation files.
    """
    name = str(cfg_get(cfg, "name"))
    resolution = int(cfg_get(cfg, "resolution"))
    requested = cfg_get(cfg, "classes")
    classes = resolve_class_names(requested, index.classes, dataset=name) if requested is not None else None
    rows, labels, names = select_classes(index.train_y, index.classes, classes)
    keep = subsample(np.arange(len(rows)), cfg_get(cfg, "n_private"), seed, what=f"{name} private")
    private_index = rows[keep]
    eval_rows, eval_labels, _ = select_classes(index.test_y, index.classes, classes)
    private_x = read_square_images([index.train_files[i] for i in private_index], resolution=resolution,
                                   what=f"{name} train images", crop=crop)
    eval_x = read_square_images([index.test_files[i] for i in eval_rows], resolution=resolution,
                                what=f"{name} test images", crop=crop)
    info = {
        "source": family,
        "files": index.files,
        "split_seed": int(cfg_get(cfg, "split_seed", 0)),
        "seed": seed,
        "n_private": cfg_get(cfg, "n_private"),
        "classes": names,
        "public": None,
        "preprocessing": f"RGB, centre {'square' if crop is None else f'{crop}x{crop}'} crop, PIL bilinear resize "
                         f"to {resolution}x{resolution}",
    }
    bundle = finish_image_bundle(
        cfg,
        name=name,
        family=family,
        private=Split(to_float_images(private_x), labels[keep], private_index),
        eval_split=Split(to_float_images(eval_x), eval_labels, eval_rows),
        classes=names,
        public=None,
        public_classes=None,
        info=info,
    )
    if cfg_get(cfg, "public") != "imagenet_val":
        return bundle
    # paper 000's public data: ImageNet validation images at the private data's resolution
    x, y, wnids, folder = read_imagenet_val(data_dir, resolution=resolution, n=cfg_get(cfg, "n_public"), seed=0)
    public = Split(adapt_images(to_float_images(x), resolution=resolution, channels=cfg_get(cfg, "channels")),
                   y, np.arange(len(y)))
    info = {**bundle.info, "public": "imagenet_val", "public_files": folder}
    info["sizes"] = {**info.get("sizes", {}), "public": len(public)}
    return dataclasses.replace(bundle, public=public, public_classes=wnids, info=info)


@DATASETS.register("pets")
def load_pets(cfg: Any, *, seed: int, data_dir: Path) -> DataBundle:
    """``pets``: Oxford-IIIT Pet, private = the trainval split (3680), eval = the test split (3669), 37 breeds."""
    _check_finegrained_config(cfg, family="pets")
    index = read_pets_index(data_dir, download=bool(cfg_get(cfg, "download", False)))
    return _load_finegrained(cfg, seed=seed, data_dir=data_dir, index=index, family="pets")


@DATASETS.register("cars")
def load_cars(cfg: Any, *, seed: int, data_dir: Path) -> DataBundle:
    """``cars``: Stanford Cars, private = the train split (8144), eval = the test split (8041), 196 models."""
    _check_finegrained_config(cfg, family="cars")
    index = read_cars_index(data_dir, download=bool(cfg_get(cfg, "download", False)))
    return _load_finegrained(cfg, seed=seed, data_dir=data_dir, index=index, family="cars")


@DATASETS.register("birds")
def load_birds(cfg: Any, *, seed: int, data_dir: Path) -> DataBundle:
    """``birds``: CUB-200-2011, private = the official train split (5994), eval = the test split (5794), 200 species."""
    _check_finegrained_config(cfg, family="birds")
    index = read_birds_index(data_dir, download=bool(cfg_get(cfg, "download", False)))
    return _load_finegrained(cfg, seed=seed, data_dir=data_dir, index=index, family="birds")


def load_celeba(cfg: Any, *, seed: int, data_dir: Path, task: str) -> DataBundle:
    """CelebA for paper 002: private = the official train partition, eval = the test partition, of ``task``'s images
    (:data:`CELEBA_TASKS`), each centre-cropped to ``crop`` pixels and resized to ``resolution``; no public data."""
    family = f"celeba_{task}"
    _check_finegrained_config(cfg, family=family, extra_keys=("crop",), public_options=(None,))
    index = read_celeba_index(data_dir, task, download=bool(cfg_get(cfg, "download", False)))
    return _load_finegrained(cfg, seed=seed, data_dir=data_dir, index=index, family=family,
                             crop=cfg_get(cfg, "crop"))


@DATASETS.register("celeba_gender")
def load_celeba_gender(cfg: Any, *, seed: int, data_dir: Path) -> DataBundle:
    """``celeba_gender``: CelebA-Gender (paper 002), female/male; 162770 train and 19962 test images."""
    return load_celeba(cfg, seed=seed, data_dir=data_dir, task="gender")


@DATASETS.register("celeba_hair")
def load_celeba_hair(cfg: Any, *, seed: int, data_dir: Path) -> DataBundle:
    """``celeba_hair``: CelebA-Hair (paper 002), black/blond/brown, the images with exactly one of the three."""
    return load_celeba(cfg, seed=seed, data_dir=data_dir, task="hair")
