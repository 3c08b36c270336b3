"""experiments/long2021/measured/snapshot_eval.py: scores the copies of a run's checkpoint that it is asked for,
with the released generator (gs_wgan: the EMA), and writes the curve and the picture."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from dpsyn.nets.dcgan import CondDCGANGenerator
from tests.conftest import load_script

SCRIPT = Path(__file__).resolve().parents[1] / "experiments" / "long2021" / "measured" / "snapshot_eval.py"


def _script():
    return load_script(SCRIPT, "snapshot_eval")


def test_pick_spreads_the_points_and_keeps_the_ends() -> None:
    pick = _script().pick
    copies = {s: Path(f"{s}.pt") for s in (50, 100, 200, 300, 400, 500, 600)}
    assert list(pick(copies, every=100, points=0)) == [100, 200, 300, 400, 500, 600]
    assert list(pick(copies, every=100, points=3)) == [100, 300, 600]
    assert list(pick(copies, every=50, points=10)) == sorted(copies)
    assert list(pick(copies, every=100, points=1)) == [100, 600]


@pytest.mark.slow  # ~10 s: a research script's scoring path (make test-full)
def test_each_copy_is_scored_with_the_ema_generator(make_cfg, tmp_path) -> None:
    cfg = make_cfg("method=gs_wgan", "dataset=digits", "method.z_dim=4", "method.ngf=4", "metrics.names.image=[fd]")
    run = tmp_path / "run"
    (run / "snap").mkdir(parents=True)
    OmegaConf.save(cfg, run / "config.yaml")
    for step, scale in ((100, 0.0), (200, 1.0)):
        torch.manual_seed(0)
        G = CondDCGANGenerator(z_dim=4, num_classes=10, channels=1, resolution=28, ngf=4)  # digits are 28 px in dpsyn
        with torch.no_grad():
            for p in G.parameters():
                p.mul_(scale)  # step 100: a generator of constant images
        # the raw G is not loadable: only the EMA (what gs_wgan releases) may be read
        torch.save({"step": step, "G": {}, "G_ema": G.state_dict()}, run / "snap" / f"ck_{step}.pt")
    rows = _script().score(run, every=100, n=200)
    assert [r["step"] for r in rows] == [100, 200]
    fds = {r["step"]: r["fd_digits"] for r in rows}
    assert fds[100] > fds[200] > 0  # constant images are further from digits than the untouched generator's
    with open(run / "snapshots.tsv") as f:
        assert [int(r["step"]) for r in csv.DictReader(f, delimiter="\t")] == [100, 200]
    assert (run / "snapshots.png").stat().st_size > 0


def test_the_watcher_copies_each_new_checkpoint_until_the_run_ends(tmp_path) -> None:
    import threading
    import time

    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    ck = run / "checkpoints" / "g_pate.pt"
    out: list[int] = []
    thread = threading.Thread(target=lambda: out.append(_script().watch(run, "g_pate.pt", interval=0.02, timeout=30)))
    thread.start()

    def wait_for(n: int) -> None:
        deadline = time.monotonic() + 10
        while len(list((run / "snap").glob("*.pt"))) < n:
            assert time.monotonic() < deadline, f"no copy {n}"
            time.sleep(0.01)

    for step in (50, 100):
        tmp = ck.with_suffix(".tmp")
        torch.save({"step": step}, tmp)
        tmp.replace(ck)  # written as the checkpointer writes: a renamed temporary file
        wait_for(step // 50)
    (run / "result.json").write_text("{}")
    thread.join(timeout=10)
    assert out == [2]
    steps = [torch.load(p, weights_only=False)["step"] for p in sorted((run / "snap").glob("*.pt"))]
    assert steps == [50, 100]


def test_a_low_pass_g_pate_checkpoint_loads_into_its_released_generator(make_cfg) -> None:
    """With ``method.output_frequencies`` the released generator is G inside the output low-pass; the copy must load
    into that (a bare G refuses the wrapped keys) and draw what the wrapped generator draws."""
    from dpsyn.methods.g_pate import LowPassOutput, dct_basis

    cfg = make_cfg("method=g_pate", "dataset=digits", "method.z_dim=4", "method.ngf=4",
                   "method.output_frequencies=5", "method.ema=0")
    torch.manual_seed(0)
    released = LowPassOutput(CondDCGANGenerator(z_dim=4, num_classes=10, channels=1, resolution=28, ngf=4),
                             dct_basis((1, 28, 28), 5)).eval()
    G, latent = _script().generator_of(cfg, {"G": released.state_dict()}, shape=(1, 28, 28), num_classes=10)
    assert latent == "uniform" and isinstance(G, LowPassOutput)
    z, y = torch.rand(6, 4) * 2 - 1, torch.arange(6)
    with torch.no_grad():
        assert torch.allclose(G(z, y), released(z, y))
