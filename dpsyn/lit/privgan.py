"""LightningModule for privGAN (Mukherjee et al. 2021; Rajotte & Ng's decentralized setting) and a local GAN.

N owners, each with a generator/discriminator pair trained only on that owner's data, and a central
discriminator D_p that sees only generated samples and learns which generator made them. Objective (methods.md):

    min_G max_{D_i, D_p} sum_i [E log D_i(x) + E log(1 - D_i(G_i(z))) + lambda E log D_p^{(i)}(G_i(z))]

Generator i's loss: BCE(D_i(G_i(z)), 1) + lambda * CE(D_p(G_i(z)), j) with j drawn uniformly among the *other*
owners (microsoft/privGAN's form: each generator tries to pass for another one). D_p is updated on generated
samples (label = which generator) only after ``dp_delay`` epochs. Without D_p and with lambda = 0 each owner trains
a plain (conditional) GAN on its own data alone: the ``gan`` baseline.

D_p pretraining (privGAN's ``disc_epochs``; Rajotte & Ng turn it off because it needs every owner's real data):
:func:`pretrain_central` teaches D_p which owner a *real* sample comes from before the adversarial training.
"""

from __future__ import annotations

from typing import Any

import lightning as L
import torch
from torch import nn
from torch.nn import functional as F


ARCHS = ("mlp", "dcgan")


def make_generator(hp: dict[str, Any], shape: tuple[int, ...]) -> nn.Module:
    """The owners' generator: privGAN's MLP (``arch: mlp``, widths ``g_hidden``) or a small DCGAN (``arch: dcgan``)."""
    from dpsyn.nets.dcgan import CondDCGANGenerator
    from dpsyn.nets.mlp_gan import CondMLPGenerator

    arch = hp.get("arch", "mlp")
    if arch == "mlp":
        return CondMLPGenerator(z_dim=hp["z_dim"], num_classes=hp["num_classes"], shape=shape, hidden=tuple(hp["g_hidden"]))
    if arch == "dcgan":
        return CondDCGANGenerator(z_dim=hp["z_dim"], num_classes=hp["num_classes"], channels=shape[0], resolution=shape[1])
    raise ValueError(f"method.arch={arch}: unknown architecture; allowed: {', '.join(ARCHS)}")


def make_discriminator(hp: dict[str, Any], shape: tuple[int, ...], *, out: int = 1) -> nn.Module:
    """An owner's discriminator (``out=1``) or the central discriminator D_p (``out`` = number of owners)."""
    from dpsyn.nets.dcgan import CondDCGANDiscriminator
    from dpsyn.nets.mlp_gan import CondMLPDiscriminator

    arch = hp.get("arch", "mlp")
    if arch == "mlp":
        return CondMLPDiscriminator(num_classes=hp["num_classes"], shape=shape, hidden=tuple(hp["d_hidden"]), out=out)
    if arch == "dcgan":
        return CondDCGANDiscriminator(num_classes=hp["num_classes"], channels=shape[0], resolution=shape[1], out=out)
    raise ValueError(f"method.arch={arch}: unknown architecture; allowed: {', '.join(ARCHS)}")


class PrivGANModule(L.LightningModule):
    """privGAN with ``n_owners`` owners, for ``n_groups`` independent models trained side by side (one per class with
    per-class models, else one), in one Lightning fit (so a small owner's one-batch epochs cost one loop, not ten).

    Networks are flat lists: model ``g``'s owner ``i`` has ``G[g * n_owners + i]`` and ``D[g * n_owners + i]``;
    ``Dp[g]`` is model g's central discriminator. Batches are dicts keyed ``g<g>/owner<i>`` (see
    :func:`owner_loaders`): owner i's data of model g only ever reaches G/D of (g, i).

    Args:
        generators, discriminators: ``n_groups * n_owners`` each, in that order.
        centrals: one D_p per model (an N-way classifier of generated samples), or None (one owner; local GANs).
        n_owners: N.
        z_dim, num_classes: latent size and label range (1 inside a per-class model).
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
        centrals: list[nn.Module] | None,
        n_owners: int,
        z_dim: int,
        num_classes: int,
        lam: float,
        dp_delay: int,
        lr: float,
        beta1: float,
        label_smoothing: float,
    ) -> None:
        super().__init__()
        if len(generators) % n_owners or len(discriminators) != len(generators):
            raise ValueError(f"{len(generators)} generators / {len(discriminators)} discriminators for {n_owners} owners")
        self.automatic_optimization = False
        self.G = nn.ModuleList(generators)
        self.D = nn.ModuleList(discriminators)
        self.Dp = nn.ModuleList(centrals) if centrals else None
        self.n = n_owners
        self.n_groups = len(generators) // n_owners
        self.z_dim, self.num_classes = z_dim, num_classes
        self.lam, self.dp_delay, self.lr, self.beta1, self.smooth = lam, dp_delay, lr, beta1, label_smoothing
        self.dp_updates = 0
        self.dp_pretrain_steps = 0

    def pretrain_central(self, parts: dict[str, tuple[torch.Tensor, torch.Tensor]], *, epochs: int, batch_size: int,
                         seed: int) -> None:
        """D_p pretraining on the owners' *real* data, labelled by owner (privGAN's ``disc_epochs``): D_p then sees
        real samples, which is why Rajotte & Ng switch it off. ``parts`` as for :func:`owner_loaders`."""
        if self.Dp is None or epochs <= 0:
            return
        gen = torch.Generator().manual_seed(seed)
        for g in range(self.n_groups):
            own = [parts[f"g{g}/owner{i}"] for i in range(self.n)]
            opt = torch.optim.Adam(self.Dp[g].parameters(), lr=self.lr, betas=(self.beta1, 0.999))
            b = [min(batch_size, len(x)) for x, _ in own]
            steps = max(len(x) // bk for (x, _), bk in zip(own, b))
            for _ in range(epochs):
                orders = [torch.randperm(len(x), generator=gen) for x, _ in own]
                for step in range(steps):
                    opt.zero_grad()
                    loss = 0.0
                    for k, ((x, y), bk, order) in enumerate(zip(own, b, orders)):
                        idx = cycled_batch(order, step, bk)
                        loss = loss + central_loss(self.Dp[g], x[idx], y[idx], owner=k, total=sum(b))
                    loss.backward()
                    opt.step()
                    self.dp_pretrain_steps += 1

    def configure_optimizers(self) -> list[torch.optim.Optimizer]:
        adam = lambda m: torch.optim.Adam(m.parameters(), lr=self.lr, betas=(self.beta1, 0.999))  # noqa: E731
        opts = [adam(g) for g in self.G] + [adam(d) for d in self.D]
        if self.Dp is not None:
            opts += [adam(p) for p in self.Dp]
        return opts

    def training_step(self, batch: dict[str, tuple[torch.Tensor, torch.Tensor]], batch_idx: int) -> None:
        opts = self.optimizers()
        opts = opts if isinstance(opts, list) else [opts]
        m = len(self.G)
        opt_g, opt_d, opt_p = opts[:m], opts[m : 2 * m], opts[2 * m :]
        logs = {}
        for g in range(self.n_groups):
            fakes = []
            Dp = self.Dp[g] if self.Dp is not None else None
            for i in range(self.n):
                k = g * self.n + i
                x, y = batch[f"g{g}/owner{i}"]  # owner i's data of model g only ever reaches G_k / D_k
                fake, y_f, d_loss, g_loss = owner_step(
                    self.G[k], self.D[k], Dp, opt_g[k], opt_d[k], x, y, owner=i, n_owners=self.n, z_dim=self.z_dim,
                    num_classes=self.num_classes, lam=self.lam, smooth=self.smooth, backward=self.manual_backward,
                )
                fakes.append((fake, y_f))
                if g == 0:
                    logs[f"train/d{i}"], logs[f"train/g{i}"] = d_loss, g_loss
            if Dp is not None and self.current_epoch >= self.dp_delay:
                opt_p[g].zero_grad()
                total = sum(len(f) for f, _ in fakes)
                p_loss = sum(central_loss(Dp, f, yf, owner=i, total=total) for i, (f, yf) in enumerate(fakes))
                self.manual_backward(p_loss)
                opt_p[g].step()
                self.dp_updates += 1
                if g == 0:
                    logs["train/dp"] = p_loss.item()
        self.log_dict(logs, prog_bar=True, on_step=True, batch_size=1)

    @torch.no_grad()
    def generate(self, owner: int, labels: torch.Tensor, *, group: int = 0, batch_size: int = 1000) -> torch.Tensor:
        G = self.G[group * self.n + owner]
        G.eval()
        out = [G(torch.randn(len(y), self.z_dim), y) for y in labels.split(batch_size)]
        G.train()
        return torch.cat(out) if out else torch.empty(0)

    @torch.no_grad()
    def scores(self, x: torch.Tensor, y: torch.Tensor, *, group: int = 0, batch_size: int = 2048) -> torch.Tensor:
        """(n_owners, n) sigmoid scores of model ``group``'s owners' discriminators: the white-box attack's input."""
        out = []
        for d in self.D[group * self.n : (group + 1) * self.n]:
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


def cycled_batch(order: torch.Tensor, step: int, b: int) -> torch.Tensor:
    """Rows of batch ``step`` when an owner's shuffled data (``order``) is cycled in batches of ``b``."""
    start = (step * b) % max(1, len(order) - b + 1)
    return order[start : start + b]


def central_loss(Dp: nn.Module, fake: torch.Tensor, y_f: torch.Tensor, *, owner: int, total: int) -> torch.Tensor:
    """Owner ``owner``'s share of D_p's loss: cross-entropy of its generated samples labelled ``owner``, summed and
    divided by the number of generated samples of all owners, so the owners' shares add up to the mean loss."""
    target = torch.full((len(fake),), owner, device=fake.device)
    return F.cross_entropy(Dp(fake, y_f), target, reduction="sum") / total


def owner_loaders(parts: dict[str, tuple[torch.Tensor, torch.Tensor]], *, batch_size: int, seed: int) -> Any:
    """One shuffled loader per (model, owner) key, cycled together (an epoch = the largest one's batches)."""
    from lightning.pytorch.utilities import CombinedLoader
    from torch.utils.data import DataLoader, TensorDataset

    loaders = {
        key: DataLoader(TensorDataset(x, y), batch_size=min(batch_size, len(x)), shuffle=True, drop_last=True,
                        generator=torch.Generator().manual_seed(seed + i))
        for i, (key, (x, y)) in enumerate(parts.items())
    }
    return CombinedLoader(loaders, mode="max_size_cycle")
