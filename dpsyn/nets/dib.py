"""DPImageBench's DP-GAN networks (``method.arch=dib`` of ``dp_gan``): a BigGAN-style ResNet generator and a ResNet
discriminator with GroupNorm and a projection head, for 28x28 or 32x32 images with 1 or 3 channels.

Written from the description of 2019ChenGong/DPImageBench @565f8d7 (models/DP_GAN/generator.py, discriminator.py,
ops.py, themselves from PyTorch-StudioGAN's big_resnet; configs/DPGAN/fmnist_28_eps1.0.yaml), not from its code.

Generator (their ``g_conv_dim`` 96, i.e. ``ngf`` = 4 x 96 = 384 channels in every block): the latent z is split into
``blocks + 1`` equal chunks (hierarchical latent; 60 = 3 x 20 at 28x28, 2 up-blocks from 7x7; 4 chunks, 3 up-blocks
from 4x4 at 32x32). The first chunk goes through a linear layer to a (ngf, s, s) map; each up-block is conditioned on
[shared class embedding (128-d, one table for all blocks), its own chunk] through conditional BatchNorm
(BatchNorm without affine, gain 1 + W_g c and bias W_b c). A block: cBN, ReLU, nearest x2, 3x3 conv, cBN, ReLU, 3x3
conv, plus the shortcut nearest x2, 1x1 conv. Self-attention (SAGAN: 1x1 convs to C/8, C/8, C/2 channels, 2x2 max-pool
of keys and values, zero-initialised residual gain) follows the second block (at 28x28; at 16x16 for 32x32). Then
BatchNorm, ReLU, a 3x3 conv to the image channels, tanh. Every conv and linear layer has spectral norm (eps 1e-6);
the class embedding has none. About 6.65M parameters at 28x28x1 with 10 classes.

Discriminator (their ``d_conv_dim`` 80, i.e. ``ndf`` = 160 channels): an "optimised" first block (3x3 conv, GroupNorm,
ReLU, 3x3 conv, 2x2 average pool; shortcut: average pool, GroupNorm, 1x1 conv), then pre-activation blocks
(GroupNorm, ReLU, 3x3 conv, GroupNorm, ReLU, 3x3 conv, average pool when downsampling; shortcut GroupNorm, 1x1 conv,
pool where the block downsamples, the identity otherwise): at 28x28 one downsampling block and one not (28 -> 14 -> 7
-> 7), at 32x32 one downsampling block and two not. GroupNorm has min(32, C) groups. The head: ReLU, a sum over the
spatial positions, a linear logit plus the projection <embed(y), h>. No spectral norm: their discriminator builds
with ``apply_d_sn=False`` (the default, not overridden by the config), so GroupNorm is where their normalisation is and
nothing here departs from it. No self-attention (``apply_attn=False``). About 1.18M parameters at 28x28x1, 10 classes.
Every layer (Conv2d, GroupNorm, Linear, Embedding) has an Opacus grad sampler, and there is no BatchNorm, so Opacus's
``GradSampleModule`` computes exact per-sample gradients (tests/test_dib_nets.py checks them row by row).

Ranges: their generator's tanh output and their real images scaled by ``2x - 1`` are what their discriminator sees,
and their samples are ``(t + 1) / 2``. dpsyn's images live in [0, 1], so :class:`DIBGenerator` returns ``(t + 1) / 2``
and :class:`DIBDiscriminator` maps its input by ``2x - 1`` first: the same functions as theirs.

Initialisation: orthogonal weights (``nn.init.orthogonal_``) and zero biases for every conv, linear and embedding.
DPImageBench builds its two class tables with max(private classes, public classes) = max(10, 1000) rows (its
ImageNet pretraining labels) and uses only the first 10: an orthogonal 1000 x d matrix has rows of norm about
sqrt(d / 1000), not 1. ``label_rows`` (default 1000) draws the tables as the first ``num_classes`` rows of such a
matrix, so the label terms start at their scale; the unused rows are not built (their run's counts with them:
6,771,970 and 1,342,563). Spectral norm is ``torch.nn.utils.spectral_norm`` (one power iteration per training forward),
as theirs: its hook-based modules pickle, which dpsyn's fitted-state file needs (the ``parametrizations`` version
refuses ``torch.save`` of the module). The only departure: ReLUs are not in-place.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F
from torch.nn.utils import spectral_norm

DIB_NGF = 384
"""DPImageBench's generator width: ``4 * g_conv_dim`` with ``g_conv_dim`` 96."""
DIB_NDF = 160
"""DPImageBench's discriminator width: ``2 * d_conv_dim`` with ``d_conv_dim`` 80."""
DIB_SHARED_DIM = 128
"""DPImageBench's ``g_shared_dim``: the generator's class embedding."""
DIB_LABEL_ROWS = 1000
"""Rows of DPImageBench's class tables (max of 10 private and 1000 public classes), for the initialisation only."""

_LAYOUTS = {28: (7, 2), 32: (4, 3)}  # resolution -> (generator's bottom side, its up-blocks)


def generator_blocks(resolution: int) -> int:
    """The number of up-blocks of :class:`DIBGenerator` at ``resolution``; ``z_dim`` must be a multiple of it + 1.

    Raises:
        ValueError: ``resolution`` is neither 28 nor 32.
    """
    if resolution not in _LAYOUTS:
        raise ValueError(f"the dib networks are built for 28x28 or 32x32 images, got resolution {resolution}")
    return _LAYOUTS[resolution][1]


def _ortho(module: nn.Module) -> nn.Module:
    """``module`` with orthogonal weight and zero bias (their ``init_weights(..., "ortho")``)."""
    nn.init.orthogonal_(module.weight)
    if getattr(module, "bias", None) is not None:
        nn.init.zeros_(module.bias)
    return module


def _sn(module: nn.Module) -> nn.Module:
    """Orthogonally initialised, then spectrally normalised (the weight the power iteration starts from)."""
    return spectral_norm(_ortho(module), eps=1e-6)


def _label_table(num_classes: int, dim: int, label_rows: int | None) -> nn.Embedding:
    """An embedding whose rows are the first ``num_classes`` rows of an orthogonal ``(label_rows, dim)`` matrix."""
    table = nn.Embedding(num_classes, dim)
    rows = max(num_classes, label_rows or num_classes)
    with torch.no_grad():
        table.weight.copy_(nn.init.orthogonal_(torch.empty(rows, dim))[:num_classes])
    return table


class _CondBatchNorm(nn.Module):
    """BatchNorm without affine, then ``x * (1 + W_g c) + W_b c`` for a conditioning vector ``c`` per row."""

    def __init__(self, channels: int, cond_dim: int) -> None:
        super().__init__()
        self.bn = nn.BatchNorm2d(channels, eps=1e-4, momentum=0.1, affine=False)
        self.gain = _sn(nn.Linear(cond_dim, channels, bias=False))
        self.bias = _sn(nn.Linear(cond_dim, channels, bias=False))

    def forward(self, x: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        return self.bn(x) * (1 + self.gain(c))[:, :, None, None] + self.bias(c)[:, :, None, None]


class _GenBlock(nn.Module):
    """cBN, ReLU, nearest x2, 3x3 conv, cBN, ReLU, 3x3 conv; shortcut nearest x2, 1x1 conv."""

    def __init__(self, in_ch: int, out_ch: int, cond_dim: int) -> None:
        super().__init__()
        self.bn1, self.bn2 = _CondBatchNorm(in_ch, cond_dim), _CondBatchNorm(out_ch, cond_dim)
        self.conv1 = _sn(nn.Conv2d(in_ch, out_ch, 3, 1, 1))
        self.conv2 = _sn(nn.Conv2d(out_ch, out_ch, 3, 1, 1))
        self.skip = _sn(nn.Conv2d(in_ch, out_ch, 1))

    def forward(self, x: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        h = self.conv1(F.interpolate(F.relu(self.bn1(x, c)), scale_factor=2, mode="nearest"))
        h = self.conv2(F.relu(self.bn2(h, c)))
        return h + self.skip(F.interpolate(x, scale_factor=2, mode="nearest"))


class _SelfAttention(nn.Module):
    """SAGAN self-attention: queries C/8, keys C/8 and values C/2 (keys and values 2x2 max-pooled), the attended
    values back to C channels by a 1x1 conv, added with a learnt gain that starts at 0."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.query = _sn(nn.Conv2d(channels, channels // 8, 1, bias=False))
        self.key = _sn(nn.Conv2d(channels, channels // 8, 1, bias=False))
        self.value = _sn(nn.Conv2d(channels, channels // 2, 1, bias=False))
        self.out = _sn(nn.Conv2d(channels // 2, channels, 1, bias=False))
        self.gamma = nn.Parameter(torch.zeros(1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n, _, h, w = x.shape
        q = self.query(x).flatten(2)  # (n, C/8, hw)
        k = F.max_pool2d(self.key(x), 2).flatten(2)  # (n, C/8, hw/4)
        v = F.max_pool2d(self.value(x), 2).flatten(2)  # (n, C/2, hw/4)
        attn = torch.softmax(q.transpose(1, 2) @ k, dim=-1)  # (n, hw, hw/4)
        o = (v @ attn.transpose(1, 2)).view(n, -1, h, w)
        return x + self.gamma * self.out(o)


class DIBGenerator(nn.Module):
    """G(z, y) -> images in [0, 1]: DPImageBench's DP-GAN generator (module docstring).

    Args:
        z_dim: latent size; a multiple of ``blocks + 1`` (3 at 28x28, 4 at 32x32; theirs: 60 at 28x28).
        num_classes: number of classes.
        channels: image channels (1 or 3).
        resolution: image side, 28 or 32.
        ngf: channels of every block (theirs: 384); a multiple of 8 (the attention's query width is ngf / 8).
        shared_dim: size of the shared class embedding (theirs: 128).
        attention: self-attention after the second block (theirs: on).
        label_rows: the class embedding is initialised as the first ``num_classes`` rows of an orthogonal
            ``(label_rows, shared_dim)`` matrix (module docstring); None: of a ``(num_classes, shared_dim)`` one.

    Raises:
        ValueError: an unsupported resolution or channel count, ``ngf`` not a multiple of 8, or ``z_dim`` not a
            multiple of the number of chunks.
    """

    def __init__(self, *, z_dim: int, num_classes: int, channels: int, resolution: int, ngf: int = DIB_NGF,
                 shared_dim: int = DIB_SHARED_DIM, attention: bool = True,
                 label_rows: int | None = DIB_LABEL_ROWS) -> None:
        super().__init__()
        blocks = generator_blocks(resolution)
        if channels not in (1, 3):
            raise ValueError(f"the dib networks are built for 1 or 3 channels, got {channels}")
        if ngf < 8 or ngf % 8:
            raise ValueError(f"DIBGenerator: ngf={ngf} must be a positive multiple of 8 (attention width ngf / 8)")
        if z_dim % (blocks + 1):
            raise ValueError(f"DIBGenerator: z_dim={z_dim} must be a multiple of {blocks + 1} at resolution "
                             f"{resolution} (one chunk for the input and one per block; DPImageBench: 60 at 28x28)")
        self.z_dim, self.num_classes, self.ngf = z_dim, num_classes, ngf
        self.chunk, self.bottom = z_dim // (blocks + 1), _LAYOUTS[resolution][0]
        self.shared = _label_table(num_classes, shared_dim, label_rows)
        self.fc = _sn(nn.Linear(self.chunk, ngf * self.bottom * self.bottom))
        self.blocks = nn.ModuleList([_GenBlock(ngf, ngf, self.chunk + shared_dim) for _ in range(blocks)])
        self.attention = _SelfAttention(ngf) if attention else None
        self.bn = nn.BatchNorm2d(ngf, eps=1e-4, momentum=0.1)
        self.to_image = _sn(nn.Conv2d(ngf, channels, 3, 1, 1))

    def forward(self, z: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        chunks = torch.split(z, self.chunk, dim=1)
        shared = self.shared(y)
        h = self.fc(chunks[0]).view(len(z), self.ngf, self.bottom, self.bottom)
        for i, (block, chunk) in enumerate(zip(self.blocks, chunks[1:])):
            h = block(h, torch.cat([shared, chunk], dim=1))
            if i == 1 and self.attention is not None:
                h = self.attention(h)
        t = torch.tanh(self.to_image(F.relu(self.bn(h))))
        return (t + 1) / 2  # dpsyn's images live in [0, 1]; theirs in [-1, 1]


class _DiscOptBlock(nn.Module):
    """The first block: 3x3 conv, GroupNorm, ReLU, 3x3 conv, average pool; shortcut average pool, GroupNorm, 1x1
    conv."""

    def __init__(self, in_ch: int, out_ch: int) -> None:
        super().__init__()
        self.conv1 = _ortho(nn.Conv2d(in_ch, out_ch, 3, 1, 1))
        self.norm1 = nn.GroupNorm(min(32, out_ch), out_ch)
        self.conv2 = _ortho(nn.Conv2d(out_ch, out_ch, 3, 1, 1))
        self.skip_norm = nn.GroupNorm(min(32, in_ch), in_ch)
        self.skip = _ortho(nn.Conv2d(in_ch, out_ch, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.avg_pool2d(self.conv2(F.relu(self.norm1(self.conv1(x)))), 2)
        return h + self.skip(self.skip_norm(F.avg_pool2d(x, 2)))


class _DiscBlock(nn.Module):
    """GroupNorm, ReLU, 3x3 conv, GroupNorm, ReLU, 3x3 conv, average pool if ``down``; shortcut GroupNorm, 1x1 conv,
    average pool where the block downsamples or changes width, the identity otherwise."""

    def __init__(self, in_ch: int, out_ch: int, down: bool) -> None:
        super().__init__()
        self.down = down
        self.norm1 = nn.GroupNorm(min(32, in_ch), in_ch)
        self.conv1 = _ortho(nn.Conv2d(in_ch, out_ch, 3, 1, 1))
        self.norm2 = nn.GroupNorm(min(32, out_ch), out_ch)
        self.conv2 = _ortho(nn.Conv2d(out_ch, out_ch, 3, 1, 1))
        self.skip_norm = self.skip = None
        if down or in_ch != out_ch:
            self.skip_norm = nn.GroupNorm(min(32, in_ch), in_ch)
            self.skip = _ortho(nn.Conv2d(in_ch, out_ch, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.conv2(F.relu(self.norm2(self.conv1(F.relu(self.norm1(x))))))
        s = x if self.skip is None else self.skip(self.skip_norm(x))
        if self.down:
            h, s = F.avg_pool2d(h, 2), (s if self.skip is None else F.avg_pool2d(s, 2))
        return h + s


class DIBDiscriminator(nn.Module):
    """D(x, y) -> logits (N,) for images x in [0, 1]: DPImageBench's DP-GAN discriminator (module docstring).

    Args:
        num_classes: number of classes (the label enters by projection).
        channels: image channels (1 or 3).
        resolution: image side, 28 or 32.
        ndf: channels of every block (theirs: 160); a multiple of 32 from 32 on (GroupNorm's min(32, ndf) groups).
        label_rows: the projection table is initialised as the first ``num_classes`` rows of an orthogonal
            ``(label_rows, ndf)`` matrix (module docstring); None: of a ``(num_classes, ndf)`` one.

    Raises:
        ValueError: an unsupported resolution or channel count, or ``ndf`` not divisible into GroupNorm's groups.
    """

    def __init__(self, *, num_classes: int, channels: int, resolution: int, ndf: int = DIB_NDF,
                 label_rows: int | None = DIB_LABEL_ROWS) -> None:
        super().__init__()
        generator_blocks(resolution)  # checks the resolution
        if channels not in (1, 3):
            raise ValueError(f"the dib networks are built for 1 or 3 channels, got {channels}")
        if ndf < 1 or ndf % min(32, ndf):
            raise ValueError(f"DIBDiscriminator: ndf={ndf} must be below 32 or a multiple of 32 (GroupNorm groups)")
        self.num_classes = num_classes
        keep = 1 if resolution == 28 else 2  # blocks after the two downsampling ones that keep the side
        self.blocks = nn.Sequential(
            _DiscOptBlock(channels, ndf),
            _DiscBlock(ndf, ndf, down=True),
            *[_DiscBlock(ndf, ndf, down=False) for _ in range(keep)],
        )
        self.linear = _ortho(nn.Linear(ndf, 1))
        self.embed = _label_table(num_classes, ndf, label_rows)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        h = F.relu(self.blocks(2 * x - 1)).sum(dim=(2, 3))  # theirs sees [-1, 1]
        return self.linear(h).squeeze(1) + (self.embed(y) * h).sum(dim=1)
