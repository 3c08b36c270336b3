"""Tests of the data package: IDX reader, Fashion-MNIST discovery and halving, every registered dataset.

Most tests run on tiny files written in the true on-disk formats (IDX via struct + gzip, CIFAR-10 pickles), so they
need neither the network nor the real data; the tests marked ``real_fmnist`` use Debian's Fashion-MNIST when it is
installed and are skipped otherwise.
"""

from __future__ import annotations

import gzip
import json
import pickle
import struct
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from omegaconf import DictConfig, OmegaConf

from dpsyn.config import load_group

from dpsyn.data import DATASETS, DataFormatError, load_dataset, read_idx
from dpsyn.data import fmnist as fmnist_mod
from dpsyn.data.common import COMMON_KEYS
from dpsyn.data.fmnist import FMNIST_CLASSES, fmnist_halves, read_fashion_mnist, search_dirs

CONF_DIR = Path(__file__).resolve().parents[1] / "conf" / "dataset"
DEBIAN_FMNIST = Path("/usr/share/datasets/fashion-mnist")
real_fmnist = pytest.mark.skipif(
    not (DEBIAN_FMNIST / "train-images-idx3-ubyte.gz").is_file(),
    reason="Debian's dataset-fashion-mnist is not installed",
)

N_TRAIN_PER_CLASS, N_TEST_PER_CLASS = 20, 5


# ------------------------------------------------------------------------------------------------------- helpers


def write_idx(path: Path, array: np.ndarray, *, gz: bool = False) -> Path:
    """Write ``array`` as an IDX file (uint8 -> type 0x08, int32 -> 0x0C big-endian)."""
    code = {np.dtype(np.uint8): 0x08, np.dtype(np.int32): 0x0C}[array.dtype]
    header = struct.pack(">BBBB", 0, 0, code, array.ndim) + struct.pack(f">{array.ndim}I", *array.shape)
    payload = header + array.astype(array.dtype.newbyteorder(">")).tobytes()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(gzip.compress(payload) if gz else payload)
    return path


def fake_mnist_like(rng: np.random.Generator, per_class: int) -> tuple[np.ndarray, np.ndarray]:
    """Random distinct uint8 28x28 images with shuffled labels, ``per_class`` of each of 10 classes."""
    labels = rng.permutation(np.repeat(np.arange(10, dtype=np.uint8), per_class))
    images = rng.integers(0, 256, size=(len(labels), 28, 28), dtype=np.uint8)
    images[:, 0, 0] = 0
    images[:, 0, 1] = 255  # every image spans the full range
    return images, labels


def write_fake_fmnist(directory: Path, *, gz: bool = True, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    train_x, train_y = fake_mnist_like(rng, N_TRAIN_PER_CLASS)
    test_x, test_y = fake_mnist_like(rng, N_TEST_PER_CLASS)
    suffix = ".gz" if gz else ""
    write_idx(directory / f"train-images-idx3-ubyte{suffix}", train_x, gz=gz)
    write_idx(directory / f"train-labels-idx1-ubyte{suffix}", train_y, gz=gz)
    write_idx(directory / f"t10k-images-idx3-ubyte{suffix}", test_x, gz=gz)
    write_idx(directory / f"t10k-labels-idx1-ubyte{suffix}", test_y, gz=gz)
    return {"train_x": train_x, "train_y": train_y, "test_x": test_x, "test_y": test_y}


def dataset_cfg(name: str, **overrides: object) -> DictConfig:
    """The shipped ``conf/dataset/<name>.yaml`` with overrides, in struct mode as Hydra composes it."""
    cfg = OmegaConf.merge(OmegaConf.to_container(load_group("dataset", name)), overrides)  # untyped
    OmegaConf.set_struct(cfg, True)
    return cfg


@pytest.fixture(scope="module")
def fake_fmnist(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, np.ndarray]]:
    """A data_dir holding tiny Fashion-MNIST-format files (200 train, 50 test)."""
    root = tmp_path_factory.mktemp("fake_fmnist")
    return root, write_fake_fmnist(root)


@pytest.fixture
def no_system_fmnist(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """Pretend Debian's Fashion-MNIST is not installed."""
    nowhere = tmp_path / "system-datasets" / "fashion-mnist"
    monkeypatch.setattr(fmnist_mod, "SYSTEM_DIRS", (nowhere,))
    return nowhere


def check_images(split, *, n: int, shape: tuple[int, ...], num_classes: int) -> None:
    assert split.x.dtype == np.float32 and split.y.dtype == np.int64
    assert split.x.shape == (n, *shape)
    assert split.x.min() >= 0.0 and split.x.max() <= 1.0
    assert split.y.min() >= 0 and split.y.max() < num_classes


# -------------------------------------------------------------------------------------------------------- IDX


@pytest.mark.parametrize("gz", [False, True])
def test_read_idx_roundtrip(tmp_path: Path, gz: bool) -> None:
    images = np.arange(2 * 3 * 4, dtype=np.uint8).reshape(2, 3, 4)
    path = write_idx(tmp_path / ("a.idx.gz" if gz else "a.idx"), images, gz=gz)
    out = read_idx(path, ndim=3)
    assert out.dtype == np.uint8 and np.array_equal(out, images)
    assert not out.flags.writeable
    ints = np.array([1, -2, 70000], dtype=np.int32)
    assert np.array_equal(read_idx(write_idx(tmp_path / "i.idx", ints, gz=gz)), ints)


def _corrupt(tmp_path: Path, how: str) -> Path:
    images = np.arange(5 * 28 * 28, dtype=np.uint64).astype(np.uint8).reshape(5, 28, 28)
    good = write_idx(tmp_path / "good", images).read_bytes()
    path = tmp_path / "case-images-idx3-ubyte"  # a neutral name: the phrase checks must not match the path
    if how == "bad_magic":
        path.write_bytes(b"\x08\x03\x00\x00" + good[4:])
    elif how == "cut_bytes":
        path.write_bytes(good[:-100])
    elif how == "cut_header":
        path.write_bytes(good[:10])
    elif how == "extra_bytes":
        path.write_bytes(good + b"\x00" * 7)
    elif how == "tiny":
        path.write_bytes(b"\x00\x00")
    elif how == "broken_gzip":
        packed = bytearray(gzip.compress(good))
        packed[20:40] = b"\xff" * 20
        path = path.with_suffix(".gz")
        path.write_bytes(bytes(packed))
    elif how == "cut_gzip":
        path = path.with_suffix(".gz")
        path.write_bytes(gzip.compress(good)[:-30])
    elif how == "not_gzip":
        path = path.with_suffix(".gz")
        path.write_bytes(b"\x1f\x8b this is not deflate data at all")
    return path


@pytest.mark.parametrize(
    ("how", "phrase"),
    [
        ("bad_magic", "magic"),
        ("cut_bytes", "too few bytes"),
        ("cut_header", "truncated IDX header"),
        ("extra_bytes", "unexpected bytes"),
        ("tiny", "too short"),
        ("broken_gzip", "broken gzip stream"),
        ("cut_gzip", "gzip stream ends early"),
        ("not_gzip", "broken gzip stream"),
    ],
)
def test_read_idx_rejects_corrupt_files(tmp_path: Path, how: str, phrase: str) -> None:
    path = _corrupt(tmp_path, how)
    with pytest.raises(DataFormatError, match=phrase) as info:
        read_idx(path)
    assert str(path) in str(info.value)
    assert isinstance(info.value, ValueError)


def test_read_idx_wrong_dims_and_missing(tmp_path: Path) -> None:
    path = write_idx(tmp_path / "labels", np.zeros(4, dtype=np.uint8))
    with pytest.raises(DataFormatError, match="1 dimensions, expected 3") as info:
        read_idx(path, ndim=3)
    assert str(path) in str(info.value)
    with pytest.raises(FileNotFoundError, match="nothing-here"):
        read_idx(tmp_path / "nothing-here")


def test_corrupt_fashion_mnist_file_fails_load(tmp_path: Path, no_system_fmnist: Path) -> None:
    write_fake_fmnist(tmp_path, gz=False)
    bad = tmp_path / "train-images-idx3-ubyte"
    bad.write_bytes(bad.read_bytes()[:-1000])
    with pytest.raises(DataFormatError, match="too few bytes") as info:
        load_dataset(dataset_cfg("fmnist"), seed=0, data_dir=tmp_path)
    assert str(bad.resolve()) in str(info.value)


def test_fashion_mnist_labels_must_match_images(tmp_path: Path, no_system_fmnist: Path) -> None:
    write_fake_fmnist(tmp_path, gz=False)
    write_idx(tmp_path / "t10k-labels-idx1-ubyte", np.zeros(3, dtype=np.uint8))
    with pytest.raises(DataFormatError, match="3 labels for the 50 images") as info:
        read_fashion_mnist(tmp_path)
    assert "t10k-labels-idx1-ubyte" in str(info.value)


# ----------------------------------------------------------------------------------------- Fashion-MNIST discovery


def test_missing_fashion_mnist_names_every_place(tmp_path: Path, no_system_fmnist: Path) -> None:
    with pytest.raises(FileNotFoundError) as info:
        load_dataset(dataset_cfg("fmnist_shoes"), seed=0, data_dir=tmp_path)
    message = str(info.value)
    for place in [tmp_path, tmp_path / "fashion-mnist", tmp_path / "FashionMNIST" / "raw", no_system_fmnist]:
        assert str(place) in message
    assert search_dirs(tmp_path)[-1] == no_system_fmnist
    assert "apt-get install dataset-fashion-mnist" in message
    assert "dataset.download=true" in message


@pytest.mark.parametrize("sub", ["fashion-mnist", "FashionMNIST/raw"])
def test_fashion_mnist_found_in_data_dir_subfolders(tmp_path: Path, no_system_fmnist: Path, sub: str) -> None:
    arrays = write_fake_fmnist(tmp_path / sub, gz=False)
    bundle = load_dataset(dataset_cfg("fmnist"), seed=0, data_dir=tmp_path)
    assert bundle.info["files"]["train_images"].startswith(str((tmp_path / sub).resolve()))
    assert np.array_equal(bundle.private.x[:, 0], arrays["train_x"] / np.float32(255))


def test_partial_fashion_mnist_is_skipped(tmp_path: Path, no_system_fmnist: Path) -> None:
    write_fake_fmnist(tmp_path / "fashion-mnist")
    (tmp_path / "fashion-mnist" / "t10k-labels-idx1-ubyte.gz").unlink()
    with pytest.raises(FileNotFoundError, match="t10k-labels-idx1-ubyte"):
        load_dataset(dataset_cfg("fmnist"), seed=0, data_dir=tmp_path)


def test_reader_is_cached(fake_fmnist) -> None:
    root, _ = fake_fmnist
    first = read_fashion_mnist(root)
    hits = fmnist_mod._read_cached.cache_info().hits
    again = read_fashion_mnist(root)
    assert again is first
    assert fmnist_mod._read_cached.cache_info().hits == hits + 1


# ------------------------------------------------------------------------------------------------ fmnist datasets


def test_fmnist_whole(fake_fmnist) -> None:
    root, arrays = fake_fmnist
    bundle = load_dataset(dataset_cfg("fmnist"), seed=0, data_dir=root)
    check_images(bundle.private, n=200, shape=(1, 28, 28), num_classes=10)
    check_images(bundle.eval, n=50, shape=(1, 28, 28), num_classes=10)
    assert bundle.public is None and bundle.family == "fmnist" and bundle.kind == "image"
    assert bundle.classes == list(FMNIST_CLASSES)
    assert bundle.private.x.max() == 1.0 and bundle.private.x.min() == 0.0
    assert np.array_equal(bundle.private.y, arrays["train_y"])
    assert np.allclose(bundle.eval.x[:, 0] * 255, arrays["test_x"])
    assert bundle.info["sizes"] == {"private": 200, "eval": 50, "public": 0}


def test_fmnist_public_is_a_stratified_half(fake_fmnist) -> None:
    root, arrays = fake_fmnist
    bundle = load_dataset(dataset_cfg("fmnist_public"), seed=0, data_dir=root)
    assert len(bundle.private) == len(bundle.public) == 100
    assert np.array_equal(bundle.private.index, bundle.public.index)
    assert np.bincount(bundle.public.y, minlength=10).tolist() == [N_TRAIN_PER_CLASS // 2] * 10
    assert np.array_equal(bundle.public.y, arrays["train_y"][bundle.public.index])
    assert np.allclose(bundle.public.x[:, 0] * 255, arrays["train_x"][bundle.public.index])
    assert bundle.public_classes == list(FMNIST_CLASSES)
    assert bundle.info["split_seed"] == 0


def test_fmnist_all_private_and_public_halves_disjoint_and_cover_train(fake_fmnist) -> None:
    root, arrays = fake_fmnist
    bundle = load_dataset(dataset_cfg("fmnist_all"), seed=0, data_dir=root)
    private, public = set(bundle.private.index.tolist()), set(bundle.public.index.tolist())
    assert not private & public
    assert private | public == set(range(len(arrays["train_y"])))
    # the images themselves (all distinct in the fake data) are disjoint too
    hashes = {row.tobytes() for row in bundle.private.x}
    assert not hashes & {row.tobytes() for row in bundle.public.x}
    check_images(bundle.private, n=100, shape=(1, 28, 28), num_classes=10)
    assert len(bundle.eval) == 50 and bundle.public_classes == list(FMNIST_CLASSES)


def test_public_half_depends_on_split_seed_not_run_seed(fake_fmnist) -> None:
    root, _ = fake_fmnist
    runs = [load_dataset(dataset_cfg("fmnist_shoes"), seed=s, data_dir=root) for s in (0, 1, 0)]
    assert np.array_equal(runs[0].public.index, runs[1].public.index)
    assert np.array_equal(runs[0].public.x, runs[1].public.x)
    assert np.array_equal(runs[0].private.index, runs[2].private.index)
    public_of_fmnist_public = load_dataset(dataset_cfg("fmnist_public"), seed=7, data_dir=root).public.index
    assert np.array_equal(runs[0].public.index, public_of_fmnist_public)
    other = load_dataset(dataset_cfg("fmnist_shoes", split_seed=1), seed=0, data_dir=root)
    assert not np.array_equal(other.public.index, runs[0].public.index)
    assert other.info["split_seed"] == 1


def test_n_private_subsample_uses_run_seed(fake_fmnist) -> None:
    root, _ = fake_fmnist
    cfg = dataset_cfg("fmnist_all", n_private=30)
    a, b, a2 = (load_dataset(cfg, seed=s, data_dir=root) for s in (0, 1, 0))
    assert len(a.private) == len(b.private) == 30
    assert not np.array_equal(a.private.index, b.private.index)
    assert np.array_equal(a.private.index, a2.private.index)
    full = set(load_dataset(dataset_cfg("fmnist_all"), seed=0, data_dir=root).private.index.tolist())
    assert set(a.private.index.tolist()) <= full and set(b.private.index.tolist()) <= full
    assert np.array_equal(a.public.index, b.public.index)
    with pytest.raises(ValueError, match=r"n_private=101 .* only 100"):
        load_dataset(dataset_cfg("fmnist_all", n_private=101), seed=0, data_dir=root)


@pytest.mark.parametrize(
    ("name", "original"),
    [("fmnist_shoes", [5, 7, 9]), ("fmnist_tops", [0, 2, 4, 6])],
)
def test_class_subsets_reindexed(fake_fmnist, name: str, original: list[int]) -> None:
    root, arrays = fake_fmnist
    bundle = load_dataset(dataset_cfg(name), seed=0, data_dir=root)
    k = len(original)
    assert bundle.classes == [FMNIST_CLASSES[i] for i in original]
    assert bundle.num_classes == k
    check_images(bundle.private, n=k * N_TRAIN_PER_CLASS // 2, shape=(1, 28, 28), num_classes=k)
    check_images(bundle.eval, n=k * N_TEST_PER_CLASS, shape=(1, 28, 28), num_classes=k)
    assert sorted(set(bundle.eval.y.tolist())) == list(range(k))
    # re-indexed labels map back onto the original ones in the listed order
    assert np.array_equal(np.array(original)[bundle.private.y], arrays["train_y"][bundle.private.index])
    assert np.array_equal(np.array(original)[bundle.eval.y], arrays["test_y"][bundle.eval.index])
    # public keeps all 10 classes with their original labels
    assert sorted(set(bundle.public.y.tolist())) == list(range(10))
    assert np.array_equal(bundle.public.y, arrays["train_y"][bundle.public.index])
    assert not set(bundle.private.index.tolist()) & set(bundle.public.index.tolist())


def test_custom_class_order_and_no_public(fake_fmnist) -> None:
    root, arrays = fake_fmnist
    bundle = load_dataset(dataset_cfg("fmnist_all", classes=["sneaker", "Bag"], public=None), seed=0, data_dir=root)
    assert bundle.classes == ["Sneaker", "Bag"] and bundle.public is None
    assert np.array_equal(np.array([7, 8])[bundle.private.y], arrays["train_y"][bundle.private.index])


def test_resolution_and_channels(fake_fmnist) -> None:
    root, _ = fake_fmnist
    bundle = load_dataset(dataset_cfg("fmnist_shoes", resolution=32, channels=3), seed=0, data_dir=root)
    check_images(bundle.private, n=30, shape=(3, 32, 32), num_classes=3)
    check_images(bundle.public, n=100, shape=(3, 32, 32), num_classes=10)
    assert np.array_equal(bundle.private.x[:, 0], bundle.private.x[:, 2])
    assert bundle.info["native_shape"] == [1, 28, 28] and bundle.shape == (3, 32, 32)


@real_fmnist
def test_real_fashion_mnist(tmp_path: Path) -> None:
    whole = load_dataset(dataset_cfg("fmnist"), seed=0, data_dir=tmp_path)
    check_images(whole.private, n=60000, shape=(1, 28, 28), num_classes=10)
    check_images(whole.eval, n=10000, shape=(1, 28, 28), num_classes=10)
    assert whole.info["files"]["train_images"].startswith(str(DEBIAN_FMNIST))
    shoes = load_dataset(dataset_cfg("fmnist_shoes"), seed=0, data_dir=tmp_path)
    assert len(shoes.private) == 9000 and len(shoes.eval) == 3000 and len(shoes.public) == 30000
    assert not set(shoes.private.index.tolist()) & set(shoes.public.index.tolist())
    public_idx, private_idx = fmnist_halves(read_fashion_mnist(tmp_path).train_y, 0)
    assert len(public_idx) == len(private_idx) == 30000
    assert np.array_equal(public_idx, shoes.public.index)


# ------------------------------------------------------------------------------------------------ scikit-learn sets


def test_digits(fake_fmnist) -> None:
    root, _ = fake_fmnist
    bundle = load_dataset(dataset_cfg("digits"), seed=0, data_dir=root)
    assert bundle.family == "digits" and bundle.classes == [str(d) for d in range(10)]
    assert len(bundle.private) + len(bundle.eval) == 1797
    check_images(bundle.private, n=len(bundle.private), shape=(1, 28, 28), num_classes=10)
    check_images(bundle.eval, n=len(bundle.eval), shape=(1, 28, 28), num_classes=10)
    assert abs(len(bundle.eval) - 0.2 * 1797) <= 10 and bundle.private.x.max() > 0.9
    assert not set(bundle.private.index.tolist()) & set(bundle.eval.index.tolist())
    counts = np.bincount(bundle.eval.y, minlength=10)
    assert counts.min() >= 34 and counts.max() <= 37  # stratified: ~20% of each ~180-image class
    # public is Fashion-MNIST's public half: the support assumption is violated
    assert len(bundle.public) == 100 and bundle.public_classes == list(FMNIST_CLASSES)
    again = load_dataset(dataset_cfg("digits", public=None), seed=5, data_dir=root)
    assert again.public is None
    assert np.array_equal(again.eval.index, bundle.eval.index)  # the split depends on split_seed only


def test_breast_cancer() -> None:
    bundle = load_dataset(dataset_cfg("breast_cancer"), seed=0, data_dir="unused")
    assert bundle.kind == "table" and bundle.family == "breast_cancer"
    assert bundle.classes == ["malignant", "benign"] and bundle.public is None
    assert len(bundle.private) + len(bundle.eval) == 569 and bundle.shape == (30,)
    assert abs(len(bundle.eval) - 114) <= 2
    x = np.concatenate([bundle.private.x, bundle.eval.x])
    assert x.dtype == np.float32 and bundle.private.y.dtype == np.int64
    assert np.allclose(x.min(axis=0), 0.0) and np.allclose(x.max(axis=0), 1.0)
    y = np.concatenate([bundle.private.y, bundle.eval.y])
    assert np.bincount(y).tolist() == [212, 357]
    subsample = load_dataset(dataset_cfg("breast_cancer", n_private=50), seed=3, data_dir="unused")
    assert len(subsample.private) == 50


# ------------------------------------------------------------------------------------------------ real loaders


def test_mnist_from_raw_idx_files(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    train_x, train_y = fake_mnist_like(rng, 3)
    test_x, test_y = fake_mnist_like(rng, 2)
    raw = tmp_path / "MNIST" / "raw"
    write_idx(raw / "train-images-idx3-ubyte", train_x)
    write_idx(raw / "train-labels-idx1-ubyte", train_y)
    write_idx(raw / "t10k-images-idx3-ubyte", test_x)
    write_idx(raw / "t10k-labels-idx1-ubyte", test_y)
    bundle = load_dataset(dataset_cfg("mnist"), seed=0, data_dir=tmp_path)
    check_images(bundle.private, n=30, shape=(1, 28, 28), num_classes=10)
    check_images(bundle.eval, n=20, shape=(1, 28, 28), num_classes=10)
    assert np.array_equal(bundle.private.y, train_y) and bundle.family == "mnist" and bundle.public is None
    assert np.allclose(bundle.eval.x[:, 0] * 255, test_x)
    assert bundle.classes == [str(d) for d in range(10)]
    sub = load_dataset(dataset_cfg("mnist", classes=["3", "1"]), seed=0, data_dir=tmp_path)
    assert np.array_equal(np.array([3, 1])[sub.private.y], train_y[sub.private.index])

    write_idx(raw / "t10k-images-idx3-ubyte", test_x[:, :27])  # wrong image size -> truncated-looking file
    (raw / "t10k-images-idx3-ubyte").write_bytes((raw / "t10k-images-idx3-ubyte").read_bytes()[:-50])
    with pytest.raises(DataFormatError, match="t10k-images-idx3-ubyte"):
        load_dataset(dataset_cfg("mnist"), seed=0, data_dir=tmp_path)


def test_mnist_missing(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="dataset.download=true") as info:
        load_dataset(dataset_cfg("mnist"), seed=0, data_dir=tmp_path)
    assert str(tmp_path / "MNIST" / "raw") in str(info.value)


CIFAR_NAMES = [b"airplane", b"automobile", b"bird", b"cat", b"deer", b"dog", b"frog", b"horse", b"ship", b"truck"]


def write_fake_cifar10(root: Path, *, per_batch: int = 4) -> dict[str, np.ndarray]:
    """Five train batches, a test batch and batches.meta, pickled like the official python version."""
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    rng = np.random.default_rng(2)
    xs, ys = [], []
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        data = rng.integers(0, 256, size=(per_batch, 3072), dtype=np.uint8)
        labels = rng.integers(0, 10, size=per_batch).tolist()
        batch = {b"batch_label": name.encode(), b"labels": labels, b"data": data, b"filenames": [b"x.png"] * per_batch}
        (folder / name).write_bytes(pickle.dumps(batch, protocol=2))
        xs.append(data)
        ys.append(labels)
    meta = {b"num_cases_per_batch": per_batch, b"label_names": CIFAR_NAMES, b"num_vis": 3072}
    (folder / "batches.meta").write_bytes(pickle.dumps(meta, protocol=2))
    return {"train_x": np.concatenate(xs[:5]), "train_y": np.concatenate(ys[:5]), "test_x": xs[5], "test_y": ys[5]}


def test_cifar10_from_python_batches(tmp_path: Path) -> None:
    arrays = write_fake_cifar10(tmp_path)
    bundle = load_dataset(dataset_cfg("cifar10"), seed=0, data_dir=tmp_path, public=False)
    check_images(bundle.private, n=20, shape=(3, 32, 32), num_classes=10)
    check_images(bundle.eval, n=4, shape=(3, 32, 32), num_classes=10)
    assert bundle.classes == [n.decode() for n in CIFAR_NAMES] and bundle.family == "cifar10"
    assert np.array_equal(bundle.private.y, arrays["train_y"])
    # channel-major rows: row[c * 1024 + h * 32 + w] is pixel (c, h, w)
    i, c, h, w = 7, 2, 5, 9
    assert bundle.private.x[i, c, h, w] == np.float32(arrays["train_x"][i, c * 1024 + h * 32 + w]) / np.float32(255)
    grey = load_dataset(dataset_cfg("cifar10", channels=1, n_private=5), seed=0, data_dir=tmp_path, public=False)
    check_images(grey.private, n=5, shape=(1, 32, 32), num_classes=10)


def test_cifar10_missing_and_corrupt(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="dataset.download=true") as info:
        load_dataset(dataset_cfg("cifar10"), seed=0, data_dir=tmp_path)
    assert str(tmp_path / "cifar-10-batches-py") in str(info.value)
    write_fake_cifar10(tmp_path)
    bad = tmp_path / "cifar-10-batches-py" / "data_batch_3"
    bad.write_bytes(bad.read_bytes()[:500])
    with pytest.raises(DataFormatError, match="data_batch_3"):
        load_dataset(dataset_cfg("cifar10"), seed=0, data_dir=tmp_path)


# ------------------------------------------------------------------------------------------------ configs


def test_unknown_dataset_lists_registered_names() -> None:
    with pytest.raises(ValueError, match="unknown dataset 'fmnsit'") as info:
        load_dataset(OmegaConf.create({"name": "fmnsit"}), seed=0, data_dir=".")
    for name in ("fmnist", "fmnist_shoes", "digits", "breast_cancer", "mnist", "cifar10"):
        assert name in str(info.value)


@pytest.mark.parametrize(
    ("name", "overrides", "phrase"),
    [
        ("fmnist", {"public": "fmnist_public"}, "dataset.public='fmnist_public' .* allowed: null"),
        ("fmnist_shoes", {"classes": ["Sandal", "Boot"]}, "unknown class 'Boot'.*Ankle boot"),
        ("fmnist_all", {"n_private": 0}, "dataset.n_private=0"),
        ("fmnist_all", {"family": "mnist"}, "dataset.family='mnist'.*allowed: 'fmnist'"),
        ("breast_cancer", {"resolution": 28}, "dataset.resolution=28 .* allowed: null"),
        ("digits", {"eval_fraction": 1.5}, "dataset.eval_fraction=1.5"),
    ],
)
def test_config_errors_name_key_and_allowed_values(name: str, overrides: dict, phrase: str, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=phrase):
        load_dataset(dataset_cfg(name, **overrides), seed=0, data_dir=tmp_path)


def test_unknown_key_rejected(tmp_path: Path) -> None:
    cfg = {**OmegaConf.to_container(load_group("dataset", "fmnist")), "n_privat": 10}
    with pytest.raises(ValueError, match="unknown key dataset.n_privat"):
        load_dataset(cfg, seed=0, data_dir=tmp_path)


def test_every_registered_dataset_has_a_yaml() -> None:
    files = {p.stem for p in CONF_DIR.glob("*.yaml")}
    assert files == set(DATASETS.names())
    for stem in files:
        cfg = load_group("dataset", stem)  # the file over its schema
        assert cfg.name == stem
        assert COMMON_KEYS <= set(cfg.keys()), f"{stem}.yaml lacks {COMMON_KEYS - set(cfg.keys())}"
        assert cfg.split_seed == 0 and cfg.n_private is None and cfg.download is False


def test_fashion_mnist_download_only_when_allowed(
    tmp_path: Path, no_system_fmnist: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[Path] = []

    def fake_download(data_dir: Path) -> None:  # what torchvision's FashionMNIST(download=True) leaves behind
        calls.append(data_dir)
        write_fake_fmnist(data_dir / "FashionMNIST" / "raw")

    monkeypatch.setattr(fmnist_mod, "_download", fake_download)
    with pytest.raises(FileNotFoundError):
        load_dataset(dataset_cfg("fmnist"), seed=0, data_dir=tmp_path)
    assert calls == []
    bundle = load_dataset(dataset_cfg("fmnist", download=True), seed=0, data_dir=tmp_path)
    assert calls == [tmp_path] and len(bundle.private) == 200
    assert "FashionMNIST/raw" in bundle.info["files"]["train_images"]


def test_fashion_mnist_failed_download_is_reported(
    tmp_path: Path, no_system_fmnist: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def offline(data_dir: Path) -> None:
        raise OSError("network is unreachable")

    monkeypatch.setattr(fmnist_mod, "_download", offline)
    with pytest.raises(FileNotFoundError, match="download failed .*network is unreachable") as info:
        load_dataset(dataset_cfg("fmnist_all", download=True), seed=0, data_dir=tmp_path)
    assert "apt-get install dataset-fashion-mnist" in str(info.value)


def test_attribute_config_and_json_info(fake_fmnist) -> None:
    root, _ = fake_fmnist
    cfg = SimpleNamespace(**OmegaConf.to_container(load_group("dataset", "fmnist_tops")))
    bundle = load_dataset(cfg, seed=0, data_dir=root)
    assert bundle.classes == ["T-shirt/top", "Pullover", "Coat", "Shirt"]
    info = json.loads(json.dumps(bundle.info))  # result.json must be able to record it
    assert info["split_seed"] == 0 and info["sizes"] == {"private": 40, "eval": 20, "public": 100}
    assert info["files"]["train_images"].endswith("train-images-idx3-ubyte.gz")
    table = load_dataset(dataset_cfg("breast_cancer"), seed=0, data_dir=root)
    assert json.loads(json.dumps(table.info))["sizes"]["private"] == len(table.private)


def write_fake_imagenet_val(root: Path) -> list[str]:
    """Two class folders of JPEGs of different sizes, as ILSVRC2012's validation set sorted into class folders."""
    from PIL import Image

    wnids = ["n01440764", "n01443537"]
    rng = np.random.default_rng(3)
    for k, wnid in enumerate(wnids):
        folder = root / "imagenet" / "val" / wnid
        folder.mkdir(parents=True)
        for i, size in enumerate([(64, 48), (40, 80), (33, 33)]):
            pixels = rng.integers(0, 256, size=(size[1], size[0], 3), dtype=np.uint8)
            Image.fromarray(pixels).save(folder / f"ILSVRC2012_val_{k}{i:07d}.JPEG", format="JPEG")
    return wnids


def test_cifar10_with_imagenet_val_as_public_data(tmp_path: Path) -> None:
    write_fake_cifar10(tmp_path)
    with pytest.raises(FileNotFoundError, match="ILSVRC2012"):
        load_dataset(dataset_cfg("cifar10", public="imagenet_val"), seed=0, data_dir=tmp_path)
    wnids = write_fake_imagenet_val(tmp_path)
    bundle = load_dataset(dataset_cfg("cifar10", public="imagenet_val"), seed=0, data_dir=tmp_path)
    assert bundle.public.x.shape == (6, 3, 32, 32) and bundle.public.x.dtype == np.float32
    assert 0 <= bundle.public.x.min() and bundle.public.x.max() <= 1 and bundle.public.x.std() > 0.1
    assert bundle.public.y.tolist() == [0, 0, 0, 1, 1, 1] and bundle.public_classes == wnids
    few = load_dataset(dataset_cfg("cifar10", public="imagenet_val", n_public=4), seed=0, data_dir=tmp_path)
    assert len(few.public) == 4
    assert load_dataset(dataset_cfg("cifar10", public=None), seed=0, data_dir=tmp_path).public is None
    # the shipped config names imagenet_val; a method that uses no public data loads none
    assert dataset_cfg("cifar10").public == "imagenet_val"
    assert load_dataset(dataset_cfg("cifar10"), seed=0, data_dir=tmp_path, public=False).public is None


def test_paper000_on_cifar10_fails_only_where_a_checkpoint_is_missing(tmp_path: Path, make_cfg) -> None:
    """dp_dre on cifar10 composes with ImageNet public data and models; with the data present, it stops at the
    missing SwAV checkpoint and says what to download."""
    from dpsyn.task import run

    cfg = make_cfg("method=dp_dre", "dataset=cifar10", "eps=1")
    assert cfg.dataset.public == "imagenet_val" and cfg.public.name == "imagenet"
    write_fake_cifar10(Path(cfg.paths.data_dir))
    write_fake_imagenet_val(Path(cfg.paths.data_dir))
    with pytest.raises(FileNotFoundError, match="swav_800ep_pretrain"):
        run(cfg, tmp_path / "run")
