"""LightningModule for privGAN (Mukherjee et al. 2021; Rajotte & Ng's decentralized setting) and a local GAN.

N owners, each with a generator/discriminator pair trained only on that owner's data, and a central
discriminator D_p that sees only generated samples and learns which generator made them. Objective (methods.md):

    min_G max_{D_i, D_p} sum_i [E log D_i(x) + E log(1 - D_i(G_i(z))) + lambda E log D_p^{(i)}(G_i(z))]

Generator i's loss: BCE(D_i(G_i(z)), 1) + lambda * CE(D_p(G_i(z)), j) with j drawn uniformly among the *other*
owners (microsoft/privGAN's form: each generator tries to pass for another one). D_p is updated on generated
samples (label = which generator) only after ``dp_delay`` epochs. With one owner and lambda = 0 it is a plain
(conditional) GAN on that owner's data: the ``gan`` baseline.
"""

from __future__ import annotations

from typing import Any

import lightning as L
import torch
from torch import nn
from torch.nn import functional as F


class PrivGANModule(L.LightningModule):
    """privGAN with ``len(generators)`` owners (see the module docstring).

    Args:
        generators, discriminators: one per owner.
        central: D_p, an N-way classifier of generated samples (None for one owner).
        z_dim, num_classes: latent size and label range.
        lam: weight of the D_p term in the generators' loss.
        dp_delay: epochs before D_p is updated.
        lr, beta1: Adam settings (privGAN: 2e-4, 0.5).
        label_smoothing: target for real samples in the owners' discriminators (privGAN: 0.95).
    """

    def __init__(
        self,
        *,
        generators: list[nn.Module],
        discriminators: list[nn.Module],
        central: nn.Module | None,
        z_dim: int,
        num_classes: int,
        lam: float,
        dp_delay: int,
        lr: float,
        beta1: float,
        label_smoothing: float,
    ) -> None:
        super().__init__()
        self.automatic_optimization = False
        self.G = nn.ModuleList(generators)
        self.D = nn.ModuleList(discriminators)
        self.Dp = central
        self.n = len(generators)
        self.z_dim, self.num_classes = z_dim, num_classes
        self.lam, self.dp_delay, self.lr, self.beta1, self.smooth = lam, dp_delay, lr, beta1, label_smoothing
        self.dp_updates = 0

    def configure_optimizers(self) -> list[torch.optim.Optimizer]:
        adam = lambda m: torch.optim.Adam(m.parameters(), lr=self.lr, betas=(self.beta1, 0.999))  # noqa: E731
        opts = [adam(g) for g in self.G] + [adam(d) for d in self.D]
        if self.Dp is not None:
            opts.append(adam(self.Dp))
        return opts

    def training_step(self, batch: dict[str, tuple[torch.Tensor, torch.Tensor]], batch_idx: int) -> None:
        opts = self.optimizers()
        opts = opts if isinstance(opts, list) else [opts]
        opt_g, opt_d = opts[: self.n], opts[self.n : 2 * self.n]
        logs = {}
        fakes = []
        for i in range(self.n):
            x, y = batch[f"owner{i}"]  # owner i's data only ever reaches G_i / D_i
            fake, y_f, d_loss, g_loss = owner_step(
                self.G[i], self.D[i], self.Dp, opt_g[i], opt_d[i], x, y, owner=i, n_owners=self.n, z_dim=self.z_dim,
                num_classes=self.num_classes, lam=self.lam, smooth=self.smooth, backward=self.manual_backward,
            )
            fakes.append((fake, y_f))
            logs[f"train/d{i}"], logs[f"train/g{i}"] = d_loss, g_loss
        if self.Dp is not None and self.current_epoch >= self.dp_delay:
            opt_p = opts[2 * self.n]
            opt_p.zero_grad()
            total = sum(len(f) for f, _ in fakes)
            p_loss = sum(central_loss(self.Dp, f, yf, owner=i, total=total) for i, (f, yf) in enumerate(fakes))
            self.manual_backward(p_loss)
            opt_p.step()
            self.dp_updates += 1
            logs["train/dp"] = p_loss.item()
        self.log_dict(logs, prog_bar=True, on_step=True, batch_size=1)

    @torch.no_grad()
    def generate(self, owner: int, labels: torch.Tensor, batch_size: int = 1000) -> torch.Tensor:
        self.G[owner].eval()
        out = [self.G[owner](torch.randn(len(y), self.z_dim), y) for y in labels.split(batch_size)]
        self.G[owner].train()
        return torch.cat(out) if out else torch.empty(0)

    @torch.no_grad()
    def scores(self, x: torch.Tensor, y: torch.Tensor, batch_size: int = 2048) -> torch.Tensor:
        """(n_owners, n) sigmoid scores of every owner's discriminator: the white-box attack's input."""
        out = []
        for d in self.D:
            d.eval()
            out.append(torch.cat([torch.sigmoid(d(xb, yb)) for xb, yb in zip(x.split(batch_size), y.split(batch_size))]))
            d.train()
        return torch.stack(out)


def owner_step(
    G: nn.Module,
    D: nn.Module,
    Dp: nn.Module | None,
    opt_g: torch.optim.Optimizer,
    opt_d: torch.optim.Optimizer,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    owner: int,
    n_owners: int,
    z_dim: int,
    num_classes: int,
    lam: float,
    smooth: float,
    backward: Any = None,
) -> tuple[torch.Tensor, torch.Tensor, float, float]:
    """One owner's update, the same in the single-process and the decentralized modes: D_owner on the owner's real
    batch vs G_owner's samples, then G_owner against D_owner and (privGAN) the central discriminator.

    Returns:
        (G_owner's samples, detached; their labels; D loss; G loss).
    """
    backward = backward or (lambda loss: loss.backward())
    b = len(x)
    z = torch.randn(b, z_dim, device=x.device)
    y_f = torch.randint(0, num_classes, (b,), device=x.device)
    fake = G(z, y_f)
    d_loss = F.binary_cross_entropy_with_logits(D(x, y), torch.full((b,), smooth, device=x.device)) \
        + F.binary_cross_entropy_with_logits(D(fake.detach(), y_f), torch.zeros(b, device=x.device))
    opt_d.zero_grad()
    backward(d_loss)
    opt_d.step()
    g_loss = F.binary_cross_entropy_with_logits(D(fake, y_f), torch.ones(b, device=x.device))
    if Dp is not None and lam > 0:
        # privGAN: G_owner is rewarded when D_p attributes its samples to another owner
        other = (owner + torch.randint(1, n_owners, (b,), device=x.device)) % n_owners
        g_loss = g_loss + lam * F.cross_entropy(Dp(fake, y_f), other)
    opt_g.zero_grad()
    backward(g_loss)
    opt_g.step()
    return fake.detach(), y_f, d_loss.item(), g_loss.item()


def central_loss(Dp: nn.Module, fake: torch.Tensor, y_f: torch.Tensor, *, owner: int, total: int) -> torch.Tensor:
    """Owner ``owner``'s share of D_p's loss: cross-entropy of its generated samples labelled ``owner``, summed and
    divided by the number of generated samples of all owners, so the owners' shares add up to the mean loss."""
    target = torch.full((len(fake),), owner, device=fake.device)
    return F.cross_entropy(Dp(fake, y_f), target, reduction="sum") / total


def owner_loaders(parts: list[tuple[torch.Tensor, torch.Tensor]], *, batch_size: int, seed: int) -> Any:
    """One shuffled loader per owner, cycled together (an epoch = the largest owner's batches)."""
    from lightning.pytorch.utilities import CombinedLoader
    from torch.utils.data import DataLoader, TensorDataset

    loaders = {
        f"owner{i}": DataLoader(TensorDataset(x, y), batch_size=min(batch_size, len(x)), shuffle=True, drop_last=True,
                                generator=torch.Generator().manual_seed(seed + i))
        for i, (x, y) in enumerate(parts)
    }
    return CombinedLoader(loaders, mode="max_size_cycle")
