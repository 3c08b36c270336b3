"""privGAN and the local GAN: owners' data isolation, D_p on generated data only, the white-box attack."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pytest
import torch

from dpsyn.cli.train import run
from dpsyn.methods.privgan import split_owners


def _row_hashes(x: np.ndarray | torch.Tensor) -> set[str]:
    arr = x.detach().cpu().numpy() if isinstance(x, torch.Tensor) else x
    return {hashlib.sha1(np.ascontiguousarray(r, dtype=np.float32).tobytes()).hexdigest() for r in arr}


def test_split_owners_is_disjoint_and_per_class() -> None:
    y = np.repeat(np.arange(4), 100)
    a, b = split_owners(y, [0.1, 0.5], seed=0)
    assert len(np.intersect1d(a, b)) == 0
    assert np.bincount(y[a]).tolist() == [10] * 4 and np.bincount(y[b]).tolist() == [50] * 4
    a2, _ = split_owners(y, [0.1, 0.5], seed=1)
    assert not np.array_equal(a, a2)
    for bad in ([0.6, 0.5], [0.0], [1.5], []):
        with pytest.raises(ValueError, match="owners="):
            split_owners(y, bad, seed=0)


def test_each_discriminator_sees_only_its_owner_and_central_only_generated(make_cfg, tmp_path: Path, monkeypatch) -> None:
    from dpsyn.lit import privgan as lit

    seen: dict[str, list[torch.Tensor]] = {}
    original = lit.PrivGANModule.training_step

    def record(self, batch, idx):
        if not getattr(self, "_wrapped", False):
            self._wrapped = True
            for name, mod in [(f"D{i}", d) for i, d in enumerate(self.D)] + [("Dp", self.Dp)]:
                # training-mode calls only (the attack scores in eval mode, on every owner's data by design)
                mod.register_forward_pre_hook(
                    lambda m, args, name=name: seen.setdefault(name, []).append(args[0].detach().clone()) if m.training else None
                )
        return original(self, batch, idx)

    monkeypatch.setattr(lit.PrivGANModule, "training_step", record)
    cfg = make_cfg("method=privgan", "method.owners=[0.01,0.02]", "metrics.names.image=[]", "metrics.n_samples=40")
    result = run(cfg, tmp_path / "run")
    assert {"mia_wb_acc_max", "mia_wb_acc_mean", "mia_wb_baseline", "acc_owner0", "acc_owner1"} <= set(result["metrics"])
    assert result["metric_info"]["acc_owner1"]["generator"] == "G_1 (owner 1, fraction 0.02)"
    assert result["metric_info"]["mia_wb_acc_max"]["discriminators"] == ["D_0 (owner 0)", "D_1 (owner 1)"]

    from dpsyn.data import load_dataset

    data = load_dataset(cfg.dataset, seed=0, data_dir=cfg.paths.data_dir)
    owners = split_owners(data.private.y, [0.01, 0.02], seed=0)
    owner_rows = [_row_hashes(data.private.x[idx]) for idx in owners]
    all_private = _row_hashes(data.private.x)
    for i in range(2):
        rows = set().union(*(_row_hashes(t) for t in seen[f"D{i}"]))
        real_seen = rows & all_private
        assert real_seen, f"D{i} saw no real data"
        assert real_seen <= owner_rows[i], f"D{i} saw another owner's data"
    dp_rows = set().union(*(_row_hashes(t) for t in seen["Dp"]))
    assert not dp_rows & all_private, "the central discriminator saw real data"


def test_attack_beats_chance_on_an_overfit_local_gan(make_cfg, tmp_path: Path) -> None:
    """60 training rows, 1500 epochs: the local GAN's discriminator memorises them (paper: GAN attacks succeed)."""
    cfg = make_cfg("method=gan", "method.owner_fraction=0.001", "method.epochs=1500", "method.batch_size=64",
                   "method.lr=1e-3", "method.label_smoothing=1.0", "trainer.max_epochs=null",
                   "trainer.limit_train_batches=null", "trainer.enable_progress_bar=false",
                   "metrics.names.image=[]", "metrics.n_samples=100")
    m = run(cfg, tmp_path / "run")["metrics"]
    assert m["mia_wb_baseline"] == pytest.approx(0.1)
    assert m["mia_wb_acc_max"] > 0.3 and m["mia_wb_auc_max"] > 0.75


def test_decentralized_mode_sends_only_central_discriminator_updates(make_cfg, tmp_path: Path) -> None:
    """One process per owner over gloo on loopback: every tensor sent is a gradient of D_p, nothing else."""
    import json

    cfg = make_cfg("method=privgan", "method.mode=decentralized", "method.owners=[0.005,0.01]", "method.epochs=2",
                   "method.batch_size=64", "trainer.max_epochs=null", "metrics.names.image=[fd]", "metrics.n_samples=200")
    result = run(cfg, tmp_path / "run")
    assert {"mia_wb_acc_max", "mia_wb_baseline", "fd_fmnist"} <= set(result["metrics"])
    assert "decentralized" in result["privacy_events"][0]["label"]

    from dpsyn.nets.mlp_gan import CondMLPDiscriminator

    central = CondMLPDiscriminator(num_classes=10, shape=(1, 28, 28), hidden=tuple(cfg.method.d_hidden), out=2)
    allowed = {f"Dp.{n}.grad": list(p.shape) for n, p in central.named_parameters()}
    steps = 2 * max(600 // 64, 300 // 64)  # epochs x the largest owner's batches (0.01 of 60k = 600 rows)
    for k in range(2):
        sent = json.loads((tmp_path / "run" / "owners" / f"transport_owner{k}.json").read_text())
        assert len(sent) == steps * len(allowed)
        assert all(allowed.get(t["name"]) == t["shape"] for t in sent), "a tensor other than D_p's gradient was sent"
    assert not list((tmp_path / "run" / "owners").glob("*_data.npz")), "owners' data copies must not outlive training"
