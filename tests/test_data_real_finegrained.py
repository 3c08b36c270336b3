"""Tests of paper 000's fine-grained datasets ``pets``, ``cars``, ``birds`` on tiny files in their true on-disk formats.

Each writer builds a handful of small JPEGs (PIL) plus the annotation files exactly as the official archives lay them
out (Oxford-IIIT Pet's text lists, Stanford Cars' .mat struct arrays via ``scipy.io.savemat``, CUB-200-2011's id
lists), loads them through the registered loader with the shipped ``conf/dataset/*.yaml`` and, where torchvision has
a reader for the layout, checks that it reads the same files and labels.

Every image is one flat colour inside its centred square and white outside it, so the mean colour of a loaded image
proves both the label/image pairing and the centre crop.
"""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

import numpy as np
import pytest

from dpsyn.data import DataFormatError, load_dataset
from tests.test_data import check_images, dataset_cfg, write_fake_imagenet_val

RES = 16
COLOURS = [(200, 30, 30), (30, 160, 40), (40, 60, 210)]
SIZES = [(40, 24), (24, 40), (24, 24), (16, 16), (48, 32)]  # wide, tall, square, already RES, wide again


class Fake(NamedTuple):
    """What a writer wrote: labels (0-based) and expected mean colours of the train and test images, class names."""

    train_y: list[int]
    test_y: list[int]
    train_rgb: list[tuple[int, int, int]]
    test_rgb: list[tuple[int, int, int]]
    classes: list[str]
    images: list[Path]


def write_jpeg(path: Path, size: tuple[int, int], colour: tuple[int, int, int], *, grey: bool = False) -> tuple:
    """A JPEG of ``size`` (w, h): ``colour`` in the centred square (side = shorter side), white margins.

    The margins are 8-pixel aligned so that JPEG's 8x8 blocks do not bleed white into the square. Returns the colour
    the loader should see (grey images: the luma PIL's ``L`` mode stores, repeated).
    """
    from PIL import Image

    w, h = size
    side = min(size)
    pixels = np.full((h, w, 3), 255, dtype=np.uint8)
    left, top = (w - side) // 2, (h - side) // 2
    pixels[top : top + side, left : left + side] = colour
    image = Image.fromarray(pixels)
    if grey:
        image = image.convert("L")
        colour = (int(np.asarray(image)[h // 2, w // 2]),) * 3
    path.parent.mkdir(parents=True, exist_ok=True)
    image.save(path, format="JPEG", quality=95)
    return colour


# ---------------------------------------------------------------------------------------------------- writers


PET_BREEDS = ["Abyssinian", "american_bulldog", "Bengal"]  # class ids 1..3 (cat, dog, cat)


def write_fake_pets(root: Path) -> Fake:
    """``oxford-iiit-pet/images/<Breed>_<n>.jpg`` and ``annotations/{trainval,test}.txt`` (id species breed_id)."""
    folder = root / "oxford-iiit-pet"
    fake = Fake([], [], [], [], ["Abyssinian", "American Bulldog", "Bengal"], [])
    lists = {"trainval": ["# Image CLASS-ID SPECIES BREED ID", "# comment lines as in list.txt"], "test": []}
    n = 0
    for split, per_class in (("trainval", 2), ("test", 1)):
        for k, breed in enumerate(PET_BREEDS):
            for _ in range(per_class):
                n += 1
                name = f"{breed}_{100 + n}"
                path = folder / "images" / f"{name}.jpg"
                rgb = write_jpeg(path, SIZES[n % len(SIZES)], COLOURS[k], grey=(n == 4))
                lists[split].append(f"{name} {k + 1} {1 if k != 1 else 2} {k + 1}")
                (fake.train_y if split == "trainval" else fake.test_y).append(k)
                (fake.train_rgb if split == "trainval" else fake.test_rgb).append(rgb)
                fake.images.append(path)
    (folder / "annotations").mkdir(parents=True)
    for split, lines in lists.items():
        (folder / "annotations" / f"{split}.txt").write_text("\n".join(lines) + "\n")
    return fake


CAR_NAMES = ["AM General Hummer SUV 2000", "Acura RL Sedan 2012", "Volvo XC90 SUV 2007"]


def _car_annotations(records: list[tuple[int, str]]) -> np.ndarray:
    """A struct array like the devkit's: bbox_x1, bbox_y1, bbox_x2, bbox_y2, class (1-based), fname."""
    fields = ["bbox_x1", "bbox_y1", "bbox_x2", "bbox_y2", "class", "fname"]
    rows = [(np.uint16(1), np.uint16(2), np.uint16(20), np.uint16(14), np.uint8(c), f) for c, f in records]
    return np.array(rows, dtype=[(f, "O") for f in fields])


def write_fake_cars(root: Path) -> Fake:
    """torchvision's StanfordCars layout: cars_{train,test}/*.jpg, devkit/*.mat, cars_test_annos_withlabels.mat."""
    import scipy.io

    folder = root / "stanford_cars"
    fake = Fake([], [], [], [], list(CAR_NAMES), [])
    train_labels, test_labels = [2, 0, 1, 2, 0], [1, 2, 0]
    records: dict[str, list[tuple[int, str]]] = {"train": [], "test": []}
    for split, labels in (("train", train_labels), ("test", test_labels)):
        for i, k in enumerate(labels):
            fname = f"{i + 1:05d}.jpg"
            path = folder / f"cars_{split}" / fname
            rgb = write_jpeg(path, SIZES[(i + len(split)) % len(SIZES)], COLOURS[k])
            records[split].append((k + 1, fname))
            (fake.train_y if split == "train" else fake.test_y).append(k)
            (fake.train_rgb if split == "train" else fake.test_rgb).append(rgb)
            fake.images.append(path)
    (folder / "devkit").mkdir(parents=True)
    scipy.io.savemat(folder / "devkit" / "cars_meta.mat", {"class_names": np.array([CAR_NAMES], dtype=object)})
    scipy.io.savemat(folder / "devkit" / "cars_train_annos.mat", {"annotations": _car_annotations(records["train"])})
    scipy.io.savemat(folder / "cars_test_annos_withlabels.mat", {"annotations": _car_annotations(records["test"])})
    return fake


BIRD_CLASSES = ["001.Black_footed_Albatross", "002.Laysan_Albatross", "003.Sooty_Albatross"]


def write_fake_birds(root: Path) -> Fake:
    """CUB_200_2011/{images.txt, image_class_labels.txt, train_test_split.txt, classes.txt, images/<class>/*.jpg}."""
    folder = root / "CUB_200_2011"
    fake = Fake([], [], [], [], list(BIRD_CLASSES), [])
    labels = [0, 0, 0, 1, 1, 1, 2, 2, 2]
    is_train = [1, 0, 1, 1, 1, 0, 0, 1, 1]
    images, class_lines, split_lines = [], [], []
    for image_id, (k, train) in enumerate(zip(labels, is_train), start=1):
        rel = f"{BIRD_CLASSES[k]}/{BIRD_CLASSES[k][4:]}_{image_id:04d}_{1000 + image_id}.jpg"
        path = folder / "images" / rel
        rgb = write_jpeg(path, SIZES[image_id % len(SIZES)], COLOURS[k])
        images.append(f"{image_id} {rel}")
        class_lines.append(f"{image_id} {k + 1}")
        split_lines.append(f"{image_id} {train}")
        (fake.train_y if train else fake.test_y).append(k)
        (fake.train_rgb if train else fake.test_rgb).append(rgb)
        fake.images.append(path)
    (folder / "images.txt").write_text("\n".join(images) + "\n")
    (folder / "image_class_labels.txt").write_text("\n".join(reversed(class_lines)) + "\n")  # matched by id, not line
    (folder / "train_test_split.txt").write_text("\n".join(split_lines) + "\n")
    (folder / "classes.txt").write_text("\n".join(f"{k + 1} {c}" for k, c in enumerate(BIRD_CLASSES)) + "\n")
    return fake


WRITERS = {"pets": write_fake_pets, "cars": write_fake_cars, "birds": write_fake_birds}


@pytest.fixture(scope="module", params=sorted(WRITERS))
def fake(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path, Fake]:
    """(dataset name, data_dir, what was written), one tiny dataset per name, shared by the tests that only read."""
    root = tmp_path_factory.mktemp(f"fake_{request.param}")
    return request.param, root, WRITERS[request.param](root)


def mean_colours(x: np.ndarray) -> np.ndarray:
    """Mean RGB of each float image, on the 0..255 scale."""
    return x.mean(axis=(2, 3)) * 255


# -------------------------------------------------------------------------------------------------------- tests


def test_official_split_labels_and_centre_crop(fake: tuple[str, Path, Fake]) -> None:
    name, root, written = fake
    bundle = load_dataset(dataset_cfg(name, resolution=RES), seed=0, data_dir=root, public=False)
    assert bundle.name == name and bundle.family == name and bundle.public is None
    assert bundle.classes == written.classes
    check_images(bundle.private, n=len(written.train_y), shape=(3, RES, RES), num_classes=3)
    check_images(bundle.eval, n=len(written.test_y), shape=(3, RES, RES), num_classes=3)
    assert bundle.private.y.tolist() == written.train_y and bundle.eval.y.tolist() == written.test_y
    assert bundle.private.index.tolist() == list(range(len(written.train_y)))
    # flat colour inside the centred square, white outside: any crop but the centre one would pull the mean up
    np.testing.assert_allclose(mean_colours(bundle.private.x), written.train_rgb, atol=4)
    np.testing.assert_allclose(mean_colours(bundle.eval.x), written.test_rgb, atol=4)
    assert bundle.info["sizes"] == {"private": len(written.train_y), "eval": len(written.test_y), "public": 0}
    assert "centre square crop" in bundle.info["preprocessing"]


def test_class_subset_n_private_and_grey(fake: tuple[str, Path, Fake]) -> None:
    name, root, written = fake
    third, first = written.classes[2], written.classes[0]
    sub = load_dataset(dataset_cfg(name, resolution=RES, classes=[third.upper(), first]), seed=0, data_dir=root,
                       public=False)
    assert sub.classes == [third, first]
    train_y, test_y = np.array(written.train_y), np.array(written.test_y)
    assert sub.private.index.tolist() == np.flatnonzero(np.isin(train_y, [2, 0])).tolist()
    assert np.array_equal(np.array([2, 0])[sub.private.y], train_y[sub.private.index])
    assert np.array_equal(np.array([2, 0])[sub.eval.y], test_y[sub.eval.index])
    assert set(sub.eval.y.tolist()) <= {0, 1} and len(sub.eval) == int(np.isin(test_y, [2, 0]).sum())
    few = load_dataset(dataset_cfg(name, resolution=RES, n_private=2, channels=1), seed=3, data_dir=root, public=False)
    check_images(few.private, n=2, shape=(1, RES, RES), num_classes=3)
    assert np.array_equal(few.private.y, train_y[few.private.index])
    assert len(few.eval) == len(test_y)


def test_torchvision_reads_the_same_layout(tmp_path: Path) -> None:
    """The fakes are in torchvision's layouts: its OxfordIIITPet and StanfordCars agree with dpsyn's readers."""
    from torchvision.datasets import OxfordIIITPet, StanfordCars

    from dpsyn.data.real import read_cars_index, read_pets_index

    pets = write_fake_pets(tmp_path)
    tv = OxfordIIITPet(root=str(tmp_path), split="test")  # trainval.txt has comment lines, which torchvision rejects
    index = read_pets_index(tmp_path)
    assert tv.classes == pets.classes == list(index.classes)
    assert [str(p) for p in tv._images] == [str(p) for p in index.test_files] and tv._labels == index.test_y.tolist()
    write_fake_cars(tmp_path)
    cars_index = read_cars_index(tmp_path)
    for split, files, labels in (("train", cars_index.train_files, cars_index.train_y),
                                 ("test", cars_index.test_files, cars_index.test_y)):
        tv_cars = StanfordCars(root=str(tmp_path), split=split)
        assert tv_cars._samples == [(str(f), int(y)) for f, y in zip(files, labels)]
        assert tv_cars.classes == list(cars_index.classes) == CAR_NAMES


@pytest.mark.parametrize(
    ("name", "phrases"),
    [
        ("pets", ["oxford-iiit-pet lacks annotations/trainval.txt", "robots.ox.ac.uk/~vgg/data/pets",
                  "dataset.download=true"]),
        ("cars", ["stanford_cars lacks devkit/cars_meta.mat", "cars_test_annos_withlabels.mat", "StanfordCars layout"]),
        ("birds", ["CUB_200_2011 lacks images.txt", "data.caltech.edu", "CUB_200_2011.tgz"]),
    ],
)
def test_missing_files_say_what_to_get_and_where(name: str, phrases: list[str], tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError) as info:
        load_dataset(dataset_cfg(name), seed=0, data_dir=tmp_path)
    message = str(info.value)
    assert "\n" not in message and str(tmp_path) in message and "paths.data_dir" in message
    for phrase in phrases:
        assert phrase in message


def test_missing_or_corrupt_image_and_bad_annotations(tmp_path: Path) -> None:
    pets = write_fake_pets(tmp_path / "pets")
    assert pets.images[4].name == "Bengal_105.jpg"
    pets.images[4].unlink()
    with pytest.raises(FileNotFoundError, match=r"1 of the 9 images .* are missing, e.g. .*Bengal_105\.jpg"):
        load_dataset(dataset_cfg("pets"), seed=0, data_dir=tmp_path / "pets")
    pets.images[4].write_bytes(b"not a jpeg")
    with pytest.raises(DataFormatError, match="Bengal_105.jpg: not a readable image"):
        load_dataset(dataset_cfg("pets", resolution=RES), seed=0, data_dir=tmp_path / "pets")
    (tmp_path / "pets" / "oxford-iiit-pet" / "annotations" / "test.txt").write_text("Abyssinian_1 x 1 1\n")
    with pytest.raises(DataFormatError, match=r"test.txt:1: 'x' is not an integer"):
        load_dataset(dataset_cfg("pets"), seed=0, data_dir=tmp_path / "pets")

    write_fake_cars(tmp_path / "cars")
    (tmp_path / "cars" / "stanford_cars" / "devkit" / "cars_train_annos.mat").write_bytes(b"MATLAB 5.0 garbage")
    with pytest.raises(DataFormatError, match="cars_train_annos.mat: not a readable MATLAB file"):
        load_dataset(dataset_cfg("cars"), seed=0, data_dir=tmp_path / "cars")
    # torchvision cannot download Stanford Cars any more: download=true fails with that reason and the same hint
    with pytest.raises(FileNotFoundError, match="download failed .*mirror"):
        load_dataset(dataset_cfg("cars", download=True), seed=0, data_dir=tmp_path / "nothing")

    write_fake_birds(tmp_path / "birds")
    split = tmp_path / "birds" / "CUB_200_2011" / "train_test_split.txt"
    split.write_text(split.read_text().replace("9 1", "10 1"))
    with pytest.raises(DataFormatError, match="train_test_split.txt: its image ids differ"):
        load_dataset(dataset_cfg("birds"), seed=0, data_dir=tmp_path / "birds")


@pytest.mark.parametrize(
    ("overrides", "phrase"),
    [
        ({"classes": ["Abyssinian", "Sphynx"]}, "unknown class 'Sphynx' for dataset 'pets'; allowed: Abyssinian, "),
        ({"classes": "Bengal"}, "dataset.classes='Bengal' must be null"),
        ({"classes": ["Bengal", "bengal"]}, "listed twice"),
        ({"resolution": None}, "dataset.resolution=null: .* allowed: a positive integer"),
        ({"public": "imagenet"}, "dataset.public='imagenet' .* allowed: null, 'imagenet_val'"),
        ({"n_private": 7}, "dataset.n_private=7 but pets private has only 6"),
    ],
)
def test_config_errors_fail_before_any_image_is_decoded(
    overrides: dict, phrase: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from dpsyn.data import real

    write_fake_pets(tmp_path)
    monkeypatch.setattr(real, "read_square_images", lambda *a, **k: pytest.fail("decoded images before failing"))
    with pytest.raises(ValueError, match=phrase):
        load_dataset(dataset_cfg("pets", **overrides), seed=0, data_dir=tmp_path)


def test_imagenet_val_public_data_at_the_private_resolution(tmp_path: Path) -> None:
    write_fake_birds(tmp_path)
    wnids = write_fake_imagenet_val(tmp_path)
    bundle = load_dataset(dataset_cfg("birds", resolution=RES, public="imagenet_val", n_public=4), seed=0,
                          data_dir=tmp_path)
    assert bundle.public.x.shape == (4, 3, RES, RES) and bundle.public.x.dtype == np.float32
    assert 0 <= bundle.public.x.min() and bundle.public.x.max() <= 1
    assert bundle.public_classes == wnids and bundle.info["sizes"]["public"] == 4
    assert bundle.info["public"] == "imagenet_val"


def test_paper000_methods_compose_with_imagenet_public_data(make_cfg) -> None:
    for name in WRITERS:
        cfg = make_cfg("method=dp_mge", f"dataset={name}")
        assert cfg.dataset.public == "imagenet_val" and cfg.public.name == "imagenet"
        assert cfg.dataset.resolution == 128 and cfg.dataset.family == name
