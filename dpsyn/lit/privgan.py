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

    def _latent(self, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        return (torch.randn(n, self.z_dim, device=self.device),
                torch.randint(0, self.num_classes, (n,), device=self.device))

    def training_step(self, batch: dict[str, tuple[torch.Tensor, torch.Tensor]], batch_idx: int) -> None:
        opts = self.optimizers()
        opts = opts if isinstance(opts, list) else [opts]
        opt_g, opt_d = opts[: self.n], opts[self.n : 2 * self.n]
        opt_p = opts[2 * self.n] if self.Dp is not None else None
        logs = {}
        fakes = []
        for i in range(self.n):
            x, y = batch[f"owner{i}"]  # owner i's data only ever reaches G_i / D_i
            b = len(x)
            z, y_f = self._latent(b)
            fake = self.G[i](z, y_f)
            # D_i: owner i's real data vs G_i's samples
            d_loss = F.binary_cross_entropy_with_logits(self.D[i](x, y), torch.full((b,), self.smooth, device=self.device)) \
                + F.binary_cross_entropy_with_logits(self.D[i](fake.detach(), y_f), torch.zeros(b, device=self.device))
            opt_d[i].zero_grad()
            self.manual_backward(d_loss)
            opt_d[i].step()
            # G_i: fool D_i, and (privGAN) make D_p attribute its samples to another owner
            g_loss = F.binary_cross_entropy_with_logits(self.D[i](fake, y_f), torch.ones(b, device=self.device))
            if self.Dp is not None and self.lam > 0:
                other = (i + torch.randint(1, self.n, (b,), device=self.device)) % self.n
                g_loss = g_loss + self.lam * F.cross_entropy(self.Dp(fake, y_f), other)
            opt_g[i].zero_grad()
            self.manual_backward(g_loss)
            opt_g[i].step()
            fakes.append((fake.detach(), y_f))
            logs[f"train/d{i}"], logs[f"train/g{i}"] = d_loss.item(), g_loss.item()
        if self.Dp is not None and self.current_epoch >= self.dp_delay:
            # D_p sees generated samples only, labelled by the generator that made them
            x_p = torch.cat([f for f, _ in fakes])
            y_p = torch.cat([yf for _, yf in fakes])
            owner = torch.cat([torch.full((len(f),), i, device=self.device) for i, (f, _) in enumerate(fakes)])
            p_loss = F.cross_entropy(self.Dp(x_p, y_p), owner)
            opt_p.zero_grad()
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
