"""Run-output writers: atomic JSON/npz, inf handling, the labelled sample grid."""

from __future__ import annotations

import math
import os

import numpy as np
import pytest
from PIL import Image

from dpsyn.results import io
from dpsyn.results.grid import save_sample_grid


def test_json_round_trips_inf_and_numpy_types(tmp_path) -> None:
    data = {"eps": math.inf, "acc": np.float32(0.5), "n": np.int64(3), "arr": np.arange(3), "nested": [-math.inf]}
    io.atomic_write_json(tmp_path / "r.json", data)
    back = io.read_json(tmp_path / "r.json")
    assert back == {"eps": math.inf, "acc": 0.5, "n": 3, "arr": [0, 1, 2], "nested": [-math.inf]}


def test_a_write_killed_midway_leaves_the_old_file_and_no_temp(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "result.json"
    io.atomic_write_json(target, {"v": 1})

    def killed(src, dst):
        raise KeyboardInterrupt("killed between write and rename")

    monkeypatch.setattr(os, "replace", killed)
    with pytest.raises(KeyboardInterrupt):
        io.atomic_write_json(target, {"v": 2})
    assert io.read_json(target) == {"v": 1}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["result.json"]


def test_a_new_file_killed_midway_does_not_appear(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    def write_then_die(f):
        f.write(b'{"partial": ')
        raise RuntimeError("crash")

    with pytest.raises(RuntimeError):
        io.atomic_write(tmp_path / "result.json", write_then_die)
    assert list(tmp_path.iterdir()) == []


def test_npz_is_written_atomically_and_loads(tmp_path) -> None:
    x = np.random.default_rng(0).random((4, 1, 28, 28)).astype(np.float32)
    io.atomic_save_npz(tmp_path / "samples.npz", x=x, y=np.arange(4))
    with np.load(tmp_path / "samples.npz") as z:
        np.testing.assert_array_equal(z["x"], x)


@pytest.mark.parametrize("channels", [1, 3])
def test_sample_grid_is_a_png_with_one_row_per_class(tmp_path, channels: int) -> None:
    rng = np.random.default_rng(0)
    x = rng.random((30, channels, 28, 28)).astype(np.float32)
    y = np.arange(30) % 3
    path = save_sample_grid(tmp_path / "samples.png", x, y, ["a", "b", "c"], per_class=5)
    with Image.open(path) as im:
        assert im.format == "PNG"
        w, h = im.size
    path2 = save_sample_grid(tmp_path / "six.png", x, np.arange(30) % 6, list("abcdef"), per_class=5)
    with Image.open(path2) as im2:
        assert im2.size[1] > h  # more classes, more rows


def test_outputs_get_the_usual_permissions(tmp_path) -> None:
    old = os.umask(0o022)
    try:
        path = io.atomic_write_json(tmp_path / "result.json", {"v": 1})
    finally:
        os.umask(old)
    assert path.stat().st_mode & 0o777 == 0o644
