"""CelebA-Gender and CelebA-Hair (paper 002) on tiny files in CelebA's official on-disk format.

The writer lays out ``celeba/img_align_celeba/*.jpg`` (178x218 like the aligned release) with
``list_attr_celeba.txt`` (a count line, the 40 attribute names, then one line per image with its 40 values of -1/1,
space-aligned as in the release) and ``list_eval_partition.txt``. Each image is one flat colour in its centred
108x108 square and white outside, so the mean colour of a loaded image proves the label pairing and the crop.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from dpsyn.data import DataFormatError, load_dataset
from dpsyn.data.real import read_celeba_index
from tests.test_data import check_images, dataset_cfg

ATTRS = ("5_o_Clock_Shadow Arched_Eyebrows Attractive Bags_Under_Eyes Bald Bangs Big_Lips Big_Nose Black_Hair "
         "Blond_Hair Blurry Brown_Hair Bushy_Eyebrows Chubby Double_Chin Eyeglasses Goatee Gray_Hair Heavy_Makeup "
         "High_Cheekbones Male Mouth_Slightly_Open Mustache Narrow_Eyes No_Beard Oval_Face Pale_Skin Pointy_Nose "
         "Receding_Hairline Rosy_Cheeks Sideburns Smiling Straight_Hair Wavy_Hair Wearing_Earrings Wearing_Hat "
         "Wearing_Lipstick Wearing_Necklace Wearing_Necktie Young").split()
HAIR = {"black": "Black_Hair", "blond": "Blond_Hair", "brown": "Brown_Hair"}
# (file, partition, male, hair colours at 1, colour in the centre)
ROWS = [
    ("000001.jpg", 0, False, ["black"], (200, 30, 30)),
    ("000002.jpg", 0, True, ["blond"], (30, 160, 40)),
    ("000003.jpg", 0, True, [], (40, 60, 210)),             # no hair colour: not in celeba_hair
    ("000004.jpg", 1, False, ["brown"], (90, 90, 20)),       # validation partition: unused
    ("000005.jpg", 2, True, ["brown"], (20, 120, 120)),
    ("000006.jpg", 2, False, ["black", "brown"], (150, 20, 150)),  # two colours: not in celeba_hair
    ("000007.jpg", 0, False, ["brown"], (120, 200, 40)),
]


def write_fake_celeba(data_dir: Path) -> Path:
    from PIL import Image

    root = data_dir / "celeba"
    (root / "img_align_celeba").mkdir(parents=True)
    lines = [str(len(ROWS)), " ".join(ATTRS) + " "]
    parts = []
    for name, part, male, hair, colour in ROWS:
        pixels = np.full((218, 178, 3), 255, dtype=np.uint8)
        top, left = (218 - 108) // 2, (178 - 108) // 2  # 55, 35
        pixels[top : top + 108, left : left + 108] = colour
        Image.fromarray(pixels).save(root / "img_align_celeba" / name, format="JPEG", quality=95)
        on = {HAIR[h] for h in hair} | ({"Male"} if male else set())
        lines.append(name + "".join(f" {1 if a in on else -1:>2}" for a in ATTRS))
        parts.append(f"{name} {part}")
    (root / "list_attr_celeba.txt").write_text("\n".join(lines) + "\n")
    (root / "list_eval_partition.txt").write_text("\n".join(parts) + "\n")
    return root


def test_celeba_gender_reads_the_official_partition_labels_and_crop(tmp_path: Path) -> None:
    write_fake_celeba(tmp_path)
    bundle = load_dataset(dataset_cfg("celeba_gender", resolution=16), seed=0, data_dir=tmp_path)
    assert tuple(bundle.classes) == ("female", "male")
    train = [r for r in ROWS if r[1] == 0]
    test = [r for r in ROWS if r[1] == 2]
    check_images(bundle.private, n=len(train), shape=(3, 16, 16), num_classes=2)
    check_images(bundle.eval, n=len(test), shape=(3, 16, 16), num_classes=2)
    assert bundle.private.y.tolist() == [int(r[2]) for r in train]
    assert bundle.eval.y.tolist() == [int(r[2]) for r in test]
    # the 108-pixel centre crop holds one colour only: the mean is that colour (no white margin)
    for split, rows in ((bundle.private, train), (bundle.eval, test)):
        got = split.x.mean(axis=(2, 3)) * 255
        np.testing.assert_allclose(got, np.array([r[4] for r in rows], float), atol=4)


def test_celeba_hair_keeps_images_with_exactly_one_hair_colour(tmp_path: Path) -> None:
    write_fake_celeba(tmp_path)
    bundle = load_dataset(dataset_cfg("celeba_hair", resolution=8), seed=0, data_dir=tmp_path)
    assert tuple(bundle.classes) == ("black", "blond", "brown")
    assert bundle.private.y.tolist() == [0, 1, 2]  # files 1, 2, 7 (3 has none)
    assert bundle.eval.y.tolist() == [2]  # file 5 (6 has two)
    index = read_celeba_index(tmp_path, "hair")
    assert [f.name for f in index.train_files] == ["000001.jpg", "000002.jpg", "000007.jpg"]


def test_celeba_without_the_crop_sees_the_white_margin(tmp_path: Path) -> None:
    write_fake_celeba(tmp_path)
    bundle = load_dataset(dataset_cfg("celeba_gender", resolution=16, crop=None), seed=0, data_dir=tmp_path)
    assert (bundle.private.x.mean(axis=(1, 2, 3)) * 255 > np.array([sum(r[4]) / 3 for r in ROWS if r[1] == 0]) + 20).all()


def test_celeba_errors_name_the_file_and_line(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="list_attr_celeba.txt"):
        read_celeba_index(tmp_path, "gender")
    root = write_fake_celeba(tmp_path)
    with pytest.raises(ValueError, match="task"):
        read_celeba_index(tmp_path, "age")
    attr = root / "list_attr_celeba.txt"
    text = attr.read_text().splitlines()
    attr.write_text("\n".join([*text[:3], text[3].rsplit(" ", 2)[0], *text[4:]]) + "\n")
    with pytest.raises(DataFormatError, match=r"list_attr_celeba.txt:4"):
        read_celeba_index(tmp_path, "gender")
    attr.write_text("\n".join(text) + "\n")
    (root / "img_align_celeba" / "000005.jpg").unlink()
    with pytest.raises(FileNotFoundError, match="000005.jpg"):
        read_celeba_index(tmp_path, "gender")
    with pytest.raises(ValueError, match="download"):
        read_celeba_index(tmp_path, "gender", download=True)
