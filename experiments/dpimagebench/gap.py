"""Where DP-GAN's accuracy goes (issue 60, item 3 (a) and (b)), on the samples of one dpsyn run scored on the
validation split (``python train.py metrics.split=validation ...``: the GAN never saw the validation rows).

(a) Label agreement: the embedded evaluation network (0.875 on the real test split) classifies the samples; the
    confusion matrix of the conditioning label against its prediction says whether G draws the class it is asked for.
(b) What the protocol is worth: one classifier trained on the samples for ``--epochs`` epochs and scored on the real
    test split at three epochs: the last one, the one selected on held-out synthetic samples (dpsyn's rule) and the one
    selected on the real validation rows (DPImageBench's rule, which reads private data). The test split is read once
    per epoch here: this is a diagnostic of the selection rules, never a reported result.

``python experiments/dpimagebench/gap.py RUN_DIR [--classifier small_cnn] [--epochs 30] [--out gap.json]``
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch
from omegaconf import OmegaConf

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from dpsyn.data import carve_validation, load_dataset  # noqa: E402
from dpsyn.lit.classifier import ClassifierModule, predict  # noqa: E402
from dpsyn.metrics.evalnet import load_or_train_evalnet  # noqa: E402
from dpsyn.metrics.utility import build_classifier  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run_dir", type=Path)
    ap.add_argument("--classifier", default="small_cnn")
    ap.add_argument("--epochs", type=int, default=30)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    cfg = OmegaConf.load(args.run_dir / ".hydra" / "config.yaml")
    if cfg.metrics.split != "validation":
        raise SystemExit("the run must be scored on the validation split (metrics.split=validation): its GAN must not "
                         "have trained on the rows that select an epoch")
    full = load_dataset(cfg.dataset, seed=int(cfg.seed), data_dir=cfg.paths.data_dir, public=False)
    val = carve_validation(full, float(cfg.dataset.validation_size), int(cfg.dataset.split_seed)).eval
    test = full.eval
    s = np.load(args.run_dir / "samples.npz")
    x, y = s["x"].astype(np.float32), s["y"].astype(np.int64)
    k = full.num_classes

    # (a)
    family = load_dataset(OmegaConf.create({**OmegaConf.to_container(cfg.dataset), "name": full.family}), seed=0,
                          data_dir=cfg.paths.data_dir, public=False)
    net, record = load_or_train_evalnet(family, settings=dict(cfg.metrics.evalnet), cache_dir=cfg.paths.cache_dir)
    pred = predict(net, x).argmax(1)
    confusion = np.zeros((k, k), dtype=int)
    np.add.at(confusion, (y, pred), 1)
    agreement = float((pred == y).mean())

    # (b): one training run, every epoch scored on the three splits
    rng = np.random.default_rng(int(cfg.seed))
    perm = rng.permutation(len(x))
    n_ho = int(round(len(x) * float(cfg.metrics.classifier.val_fraction)))
    ho, tr = perm[:n_ho], perm[n_ho:]
    torch.manual_seed(int(cfg.seed))
    clf = build_classifier(args.classifier, channels=x.shape[1], num_classes=k, resolution=x.shape[2])
    opt = ClassifierModule(clf, lr=float(cfg.metrics.classifier.lr)).configure_optimizers()
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.from_numpy(x[tr]), torch.from_numpy(y[tr])),
                                         batch_size=128, shuffle=True, generator=torch.Generator().manual_seed(0))
    history = []
    for epoch in range(args.epochs):
        clf.train()
        for xb, yb in loader:
            opt.zero_grad()
            torch.nn.functional.cross_entropy(clf(xb), yb).backward()
            opt.step()
        acc = {name: float((predict(clf, xs).argmax(1) == ys).mean())
               for name, (xs, ys) in {"synthetic_heldout": (x[ho], y[ho]), "real_validation": (val.x, val.y),
                                      "test": (test.x, test.y)}.items()}
        history.append(acc)
        print(epoch, acc, flush=True)
    by = {rule: max(range(len(history)), key=lambda e: history[e][rule]) for rule in ("synthetic_heldout", "real_validation")}
    out = {
        "run_dir": str(args.run_dir), "method": cfg.method.name, "eps": float(cfg.eps), "seed": int(cfg.seed),
        "evalnet_test_acc": record.get("test_acc"), "label_agreement": agreement, "confusion": confusion.tolist(),
        "classifier": args.classifier, "epochs": args.epochs, "history": history,
        "test_acc_last_epoch": history[-1]["test"],
        "test_acc_selected_on_synthetic": history[by["synthetic_heldout"]]["test"],
        "test_acc_selected_on_real_validation": history[by["real_validation"]]["test"],
        "epoch_selected": {rule: e + 1 for rule, e in by.items()},
    }
    print(json.dumps({k: v for k, v in out.items() if k != "history"}, indent=1))
    if args.out:
        args.out.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
