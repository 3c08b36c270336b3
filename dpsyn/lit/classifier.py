"""LightningModule for a classifier, and ``train_classifier``: fit on one split, select on another, in memory.

Used by the embedded evaluation networks (trained on a dataset's real train split) and by downstream accuracy
(trained on synthetic data, the epoch selected on held-out *synthetic* data; the real test split is never seen here).
"""

from __future__ import annotations

import copy
from typing import Any

import lightning as L
import numpy as np
import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

from dpsyn.config.schema import LR_SCHEDULES as SCHEDULES  # the learning-rate schedules of ClassifierModule


class ClassifierModule(L.LightningModule):
    """Cross-entropy training of ``net`` with Adam; logs ``train/loss`` and ``val/acc``.

    ``schedule``: ``constant`` (Adam at ``lr`` throughout) or ``cosine`` (the learning rate annealed from ``lr`` to 0
    over the run, stepped per batch; the run's length is the Trainer's ``estimated_stepping_batches``, which follows
    ``max_epochs`` and ``limit_train_batches``).
    Keeps, in memory, the weights of the epoch with the best validation accuracy (no checkpoint files).
    """

    def __init__(self, net: nn.Module, *, lr: float, schedule: str = "constant") -> None:
        super().__init__()
        if schedule not in SCHEDULES:
            raise ValueError(f"schedule={schedule!r}; allowed: {', '.join(SCHEDULES)}")
        self.net, self.lr, self.schedule = net, lr, schedule
        self._correct = 0
        self._count = 0
        self.val_history: list[float] = []
        self.best_acc, self.best_epoch = -1.0, -1
        self.best_state: dict[str, Any] | None = None

    def configure_optimizers(self) -> Any:
        opt = torch.optim.Adam(self.net.parameters(), lr=self.lr)
        if self.schedule == "constant":
            return opt
        steps = max(1, int(self.trainer.estimated_stepping_batches))
        sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=steps)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = F.cross_entropy(self.net(x), y)
        self.log("train/loss", loss, prog_bar=True, batch_size=len(x))
        return loss

    def on_validation_epoch_start(self) -> None:
        self._correct, self._count = 0, 0

    def validation_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        x, y = batch
        self._correct += int((self.net(x).argmax(1) == y).sum())
        self._count += len(y)

    def on_validation_epoch_end(self) -> None:
        acc = self._correct / max(self._count, 1)
        self.val_history.append(acc)
        if acc > self.best_acc:
            self.best_acc, self.best_epoch = acc, self.current_epoch
            self.best_state = copy.deepcopy(self.net.state_dict())
        self.log("val/acc", acc, prog_bar=True)


def train_classifier(
    net: nn.Module,
    train: tuple[np.ndarray, np.ndarray],
    val: tuple[np.ndarray, np.ndarray],
    *,
    epochs: int,
    batch_size: int,
    lr: float,
    seed: int,
    limit_train_batches: int | float | None = None,
    progress: bool = True,
    schedule: str = "constant",
) -> dict[str, Any]:
    """Train ``net`` on ``train`` and load the weights of the epoch with the best accuracy on ``val``.

    ``schedule``: the learning-rate schedule (:class:`ClassifierModule`).

    Returns:
        ``{"val_acc": best validation accuracy, "best_epoch": int, "val_history": [...]}``.
    """
    L.seed_everything(seed, verbose=False)
    train_loader = DataLoader(
        TensorDataset(torch.from_numpy(train[0]), torch.from_numpy(train[1])),
        batch_size=batch_size,
        shuffle=True,
        generator=torch.Generator().manual_seed(seed),
    )
    module = ClassifierModule(net, lr=lr, schedule=schedule)
    val_loader = DataLoader(TensorDataset(torch.from_numpy(val[0]), torch.from_numpy(val[1])), batch_size=1024)
    trainer = L.Trainer(
        max_epochs=epochs,
        accelerator="auto",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_model_summary=False,
        enable_progress_bar=progress,
        num_sanity_val_steps=0,
        limit_train_batches=limit_train_batches,
    )
    trainer.fit(module, train_dataloaders=train_loader, val_dataloaders=val_loader)
    if module.best_state is not None:
        net.load_state_dict(module.best_state)
    net.eval()
    return {"val_acc": module.best_acc, "best_epoch": module.best_epoch, "val_history": list(module.val_history)}


@torch.no_grad()
def predict(
    net: nn.Module,
    x: np.ndarray,
    *,
    batch_size: int = 1024,
    features: bool = False,
    device: str | torch.device | None = None,
) -> np.ndarray:
    """Logits (or ``net.features`` when ``features=True``) for ``x``, in eval mode, as float64 numpy.

    ``device`` (None: the CPU) runs the network there for the call and moves it back to the CPU afterwards.
    """
    dev = torch.device(device) if device is not None else torch.device("cpu")
    net.to(dev).eval()
    fn = net.features if features else net
    try:
        out = [
            fn(torch.from_numpy(x[i : i + batch_size]).to(dev)).double().cpu().numpy()
            for i in range(0, len(x), batch_size)
        ]
    finally:
        if dev.type != "cpu":
            net.to("cpu")
    return np.concatenate(out) if out else np.empty((0,))
