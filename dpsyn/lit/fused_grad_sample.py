"""Per-sample gradients of dp_gan's paired DP-SGD step in one pass (``method.grad_sample_mode=fused``, the default).

Written by hand, although Opacus computes per-sample gradients, because Opacus's ``hooks`` and ``functorch`` engines
make dp_gan's DP discriminator step 2.0-2.5x a plain step on the 2-core CPUs here (``make bench``; this engine:
1.1-1.3x), for three reasons that this module removes:

* autograd still computes every weight gradient of the batch, which the DP optimizer then discards;
* a convolution's per-sample gradient goes through ``unfold`` (im2col), which on a CPU costs more than the matrix
  product that follows; here the patches are a strided view of the channels-last input, copied once;
* :class:`~dpsyn.nets.dcgan.CondDCGANDiscriminator`'s one-hot label maps are 10 of the first convolution's 11 input
  channels. Their per-sample gradient is exact and cheap without unfolding them: for row i, the kernel slice of
  channel ``C + y_i`` gets the output gradient summed over the positions where each tap lies inside the image
  (a fixed 0/1 mask), and the other label channels get 0.

Only the per-sample gradients are computed here. They are handed to Opacus's ``DPOptimizer`` as ``p.grad_sample``,
so clipping, the noise and the division by the expected batch size stay Opacus's (the code
:mod:`dpsyn.cli.audit` audits). tests/test_fused_grad_sample.py checks the gradients against Opacus's own per-sample
gradients and against a row-by-row reference, and checks that a row's gradient depends on that row alone (the
sensitivity argument of the paired step).

The function differentiated is the module's own forward, with the same parameters in the same layout; only the first
convolution is summed in two parts, its image channels and its label maps, equal up to rounding. Nothing about the
discriminator changes, so checkpoints, eps=inf runs and the generator step are untouched.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from dpsyn.lit.gan_loss import discriminator_loss
from dpsyn.nets.dcgan import CondDCGANDiscriminator

_PARAMETER_FREE = (nn.LeakyReLU, nn.ReLU, nn.Flatten, nn.Identity, nn.Tanh, nn.Sigmoid)


def unwrap(module: nn.Module) -> nn.Module:
    """The network inside Opacus's ``GradSampleModule`` (under ``trainer=ddp`` too: DPDDP wraps the LightningModule,
    not the discriminator)."""
    while (inner := getattr(module, "_module", None)) is not None:
        module = inner
    return module


def _conv_supported(layer: nn.Conv2d) -> bool:
    return (layer.groups == 1 and layer.padding_mode == "zeros" and not isinstance(layer.padding, str)
            and layer.weight.requires_grad)


def supports(discriminator: nn.Module) -> bool:
    """Whether :func:`grad_samples` can compute ``discriminator``'s per-sample gradients: a
    :class:`CondDCGANDiscriminator` with one logit (possibly wrapped) whose layers are groups-1 zero-padded ``Conv2d``, 2-d
    ``Linear`` and parameter-free activations, the first layer a ``Conv2d``, the last a ``Linear`` when it has a
    projection head (``cond="projection"`` or ``"both"``: a plain ``nn.Embedding``)."""
    D = unwrap(discriminator)
    if type(D) is not CondDCGANDiscriminator or D.out != 1:  # one logit per row: a GAN discriminator
        return False
    embed = getattr(D, "embed", None)
    if embed is not None and (type(embed) is not nn.Embedding or not embed.weight.requires_grad
                              or embed.max_norm is not None or embed.padding_idx is not None
                              or any(True for _ in embed.buffers())):
        return False  # the projection head: a plain embedding table, gathered row by row
    layers = list(D.net)
    if not layers or not isinstance(layers[0], nn.Conv2d):
        return False
    if embed is not None and not isinstance(layers[-1], nn.Linear):
        return False
    for m in layers:
        if isinstance(m, nn.Conv2d):
            if not _conv_supported(m):
                return False
        elif isinstance(m, nn.Linear):
            if not m.weight.requires_grad:
                return False
        elif not isinstance(m, _PARAMETER_FREE) or any(True for _ in m.parameters()):
            return False
    return True


class _Scratch:
    """Scratch tensors reused from step to step, sliced to the step's row count (a Poisson batch changes size every
    step, so each keeps the largest row count seen, plus a margin).

    Why: on a CPU, a fresh tensor of tens of MB per step is handed back to the OS when freed, and faulting its pages
    in again measured more than the copy that fills it (the conv patches: 10-22 ms a step in place against 3 ms for
    the copy alone). Only what is used within one call lives here, never a returned gradient.
    """

    def __init__(self) -> None:
        self._bufs: dict[str, torch.Tensor] = {}

    def get(self, tag: str, n: int, tail: tuple[int, ...], like: torch.Tensor, *, zero: bool = False) -> torch.Tensor:
        """(n, *tail) of ``like``'s dtype and device; with ``zero``, all zeros when allocated (callers that write only
        an interior keep its border zero)."""
        buf = self._bufs.get(tag)
        if buf is None or tuple(buf.shape[1:]) != tail or buf.dtype != like.dtype or buf.device != like.device:
            buf = None
        if buf is None or len(buf) < n:
            cap = n if buf is None else max(n, len(buf) + len(buf) // 4)
            buf = (torch.zeros if zero else torch.empty)((cap, *tail), dtype=like.dtype, device=like.device)
            self._bufs[tag] = buf
        return buf[:n]


    def clear(self) -> None:
        self._bufs.clear()


_SCRATCH = _Scratch()


def release_scratch() -> None:
    """Free the scratch tensors (at the end of training; the next call allocates them again)."""
    _SCRATCH.clear()


def _patches(a: torch.Tensor, layer: nn.Conv2d, out_hw: tuple[int, int], tag: str) -> torch.Tensor:
    """(n, Ho*Wo, kh*kw*C): the input patch of every output position of ``layer`` (its kernel, stride, padding and
    dilation), taps outer and channels inner: the order a channels-last strided view gives without im2col. The result
    is a scratch tensor (:class:`_Scratch`, under ``tag``), valid until the next call with the same tag."""
    n, c, h, w = a.shape
    (kh, kw), (sh, sw), (ph, pw), (dh, dw) = layer.kernel_size, layer.stride, layer.padding, layer.dilation
    # the zero-padded input, channels last (its border is never written, so it stays zero)
    padded = _SCRATCH.get(f"{tag}/padded", n, (h + 2 * ph, w + 2 * pw, c), a, zero=True)
    ap = padded.permute(0, 3, 1, 2)
    ap[:, :, ph:ph + h, pw:pw + w] = a
    s0, s1, s2, s3 = ap.stride()
    ho, wo = out_hw
    view = ap.as_strided((n, ho, wo, kh, kw, c), (s0, sh * s2, sw * s3, dh * s2, dw * s3, s1))
    out = _SCRATCH.get(f"{tag}/patches", n, (ho, wo, kh, kw, c), a)
    out.copy_(view)
    return out.view(n, ho * wo, kh * kw * c)


def _pair_sum(t: torch.Tensor, b: int, paired: bool) -> torch.Tensor:
    return t[:b] + t[b:] if paired else t


def _conv_weight_samples(a: torch.Tensor, g: torch.Tensor, layer: nn.Conv2d, b: int, paired: bool,
                         tag: str) -> torch.Tensor:
    """(b, O, C, kh, kw): per-row (per-pair when ``paired``) gradients of a convolution's weight."""
    n, o = g.shape[:2]
    kh, kw = layer.kernel_size
    c = a.shape[1]
    G = g.reshape(n, o, -1)
    P = _patches(a, layer, (g.shape[2], g.shape[3]), tag)
    if paired:
        ws = torch.bmm(G[:b], P[:b])
        ws.baddbmm_(G[b:], P[b:])
    else:
        ws = torch.bmm(G, P)
    return ws.view(b, o, kh, kw, c).permute(0, 1, 4, 2, 3).contiguous()


def _label_tap_mask(layer: nn.Conv2d, hw: tuple[int, int], like: torch.Tensor) -> torch.Tensor:
    """(Ho*Wo, kh*kw) 0/1: whether tap (kh, kw) of output position l reads a pixel inside the image (a constant 1
    label map) or the zero padding."""
    ones = torch.ones(1, 1, *hw, dtype=like.dtype, device=like.device)
    return _patches(ones, layer, _out_hw(layer, hw), "mask")[0].clone()


def _out_hw(layer: nn.Conv2d, hw: tuple[int, int]) -> tuple[int, int]:
    return tuple((s + 2 * p - d * (k - 1) - 1) // st + 1  # type: ignore[return-value]
                 for s, p, d, k, st in zip(hw, layer.padding, layer.dilation, layer.kernel_size, layer.stride))


def _label_responses(w_label: torch.Tensor, layer: nn.Conv2d, hw: tuple[int, int]) -> torch.Tensor:
    """(K, O, Ho, Wo): the first convolution's output for a constant-1 map in label channel k and zeros in every
    other input channel (bias excluded), for each class k; its weight's label slice ``w_label`` is (O, K, kh, kw)."""
    o, k = w_label.shape[:2]
    per_class = w_label.transpose(0, 1).reshape(k * o, 1, *w_label.shape[2:])
    ones = torch.ones(1, 1, *hw, dtype=w_label.dtype, device=w_label.device)
    out = F.conv2d(ones, per_class, None, layer.stride, layer.padding, layer.dilation)
    return out.view(k, o, *out.shape[2:])


def _first_conv_weight_samples(x: torch.Tensor, y: torch.Tensor, g: torch.Tensor, layer: nn.Conv2d,
                               num_classes: int, b: int, paired: bool) -> torch.Tensor:
    """(b, O, C + K, kh, kw): the first convolution's per-row (per-pair) weight gradients, its input being the image
    channels ``x`` followed by the one-hot label maps of ``y`` (module docstring)."""
    n, o = g.shape[:2]
    kh, kw = layer.kernel_size
    c = x.shape[1]
    out = torch.zeros(b, o, c + num_classes, kh * kw, dtype=g.dtype, device=g.device)
    image = _conv_weight_samples(x, g, layer, b, paired, "layer0")  # (b, O, C, kh, kw)
    out[:, :, :c] = image.reshape(b, o, c, kh * kw)
    mask = _label_tap_mask(layer, (x.shape[2], x.shape[3]), g)  # (L, kh*kw)
    label = (g.reshape(n * o, -1) @ mask).view(n, o, kh * kw)
    rows = torch.arange(b, device=g.device)
    out[rows, :, c + y[:b]] += label[:b]
    if paired:  # a separate statement: y[i] and y[b + i] may be the same class
        out[rows, :, c + y[b:]] += label[b:]
    return out.view(b, o, c + num_classes, kh, kw)


def grad_samples(discriminator: nn.Module, x: torch.Tensor, y: torch.Tensor, targets: torch.Tensor, *,
                 paired: bool, loss: str = "bce") -> dict[nn.Parameter, torch.Tensor]:
    """Per-sample gradients of ``sum_i loss(D(x_i, y_i), targets_i)`` for every parameter of ``D``.

    ``loss`` is the discriminator loss of :func:`dpsyn.lit.gan_loss.discriminator_loss` (``bce``: BCE with logits;
    ``hinge``: ``relu(1 - s_i * D(x_i, y_i))`` with ``s_i = 2 * targets_i - 1``).

    ``paired``: ``x`` holds b real rows then b fake rows, and row i's gradient is that of real row i plus fake
    row i (the paired DP-SGD step, :mod:`dpsyn.lit.gan`): the result has b rows. Otherwise one gradient per row.
    The discriminator's parameters get no ``.grad``; the result is what Opacus's ``GradSampleModule`` would leave
    in ``p.grad_sample``.

    Raises:
        ValueError: an unsupported discriminator (:func:`supports`), or an odd row count with ``paired``.
    """
    if not supports(discriminator):
        raise ValueError(f"fused per-sample gradients support CondDCGANDiscriminator only, got "
                         f"{type(unwrap(discriminator)).__name__} (use method.grad_sample_mode=hooks)")
    D: Any = unwrap(discriminator)
    n = len(x)
    if paired and n % 2:
        raise ValueError(f"paired per-sample gradients need real and fake rows in equal numbers, got {n} rows")
    b = n // 2 if paired else n
    layers = list(D.net)
    label_maps = getattr(D, "label_maps", True)
    embed = getattr(D, "embed", None)
    features: torch.Tensor | None = None  # the last layer's input, in the graph (the projection head's h)
    inputs: list[torch.Tensor] = []  # the input of each parametrised layer (no graph)
    outputs: list[torch.Tensor] = []  # its output (in the graph, for the output gradients)
    with torch.enable_grad():
        a: torch.Tensor = x.detach()
        for i, m in enumerate(layers):
            if isinstance(m, (nn.Conv2d, nn.Linear)):
                inputs.append(a.detach())
                w = m.weight.detach()
                bias = None if m.bias is None else m.bias.detach()
                if i == len(layers) - 1:
                    features = a
                if not outputs and not label_maps:
                    # the image alone (cond="projection"); the graph starts at its output
                    z = F.conv2d(a, w, bias, m.stride, m.padding, m.dilation).requires_grad_(True)
                elif not outputs:
                    # the first convolution without its one-hot input maps: the image channels' convolution plus
                    # each class's response to a constant-1 map (the same sum, 1/(C+K) of the work); the graph
                    # starts at its output, since the input needs no gradient
                    c = x.shape[1]
                    z = F.conv2d(a, w[:, :c], bias, m.stride, m.padding, m.dilation)
                    z = (z + _label_responses(w[:, c:], m, (x.shape[2], x.shape[3]))[y]).requires_grad_(True)
                elif isinstance(m, nn.Conv2d):
                    z = F.conv2d(a, w, bias, m.stride, m.padding, m.dilation)
                else:
                    z = F.linear(a, w, bias)
                outputs.append(z)
                a = z
            else:
                a = m(a)
        logits = a.squeeze(1)
        if embed is not None:  # the projection head: + <embed(y_i), h_i>
            assert features is not None
            logits = logits + (embed.weight.detach()[y] * features).sum(dim=1)
        total = discriminator_loss(logits, targets.to(logits.dtype), loss)
        out_grads = torch.autograd.grad(total, outputs)

    result: dict[nn.Parameter, torch.Tensor] = {}
    k = 0
    for m in layers:
        if not isinstance(m, (nn.Conv2d, nn.Linear)):
            continue
        a_in, g = inputs[k], out_grads[k]
        if isinstance(m, nn.Conv2d):
            if k == 0 and label_maps:
                ws = _first_conv_weight_samples(x.detach(), y, g, m, D.num_classes, b, paired)
            else:
                ws = _conv_weight_samples(a_in, g, m, b, paired, f"layer{k}")
            bs = g.sum(dim=(2, 3))
        else:
            if a_in.dim() != 2:
                raise ValueError("fused per-sample gradients take 2-d inputs to Linear layers")
            ws = g[:, :, None] * a_in[:, None, :]
            bs = g
            ws = _pair_sum(ws, b, paired)
        result[m.weight] = ws
        if m.bias is not None and m.bias.requires_grad:
            result[m.bias] = _pair_sum(bs, b, paired)
        k += 1
    if embed is not None:
        # d logit_i / d embed[y_i] = h_i, times d loss / d logit_i (the last layer's output gradient); other rows 0
        assert features is not None
        g_logit = out_grads[-1].reshape(n)
        rows_g = g_logit[:, None] * features.detach()
        es = torch.zeros(b, *embed.weight.shape, dtype=rows_g.dtype, device=rows_g.device)
        idx = torch.arange(b, device=rows_g.device)
        es[idx, y[:b]] += rows_g[:b]
        if paired:  # a separate statement: y[i] and y[b + i] may be the same class
            es[idx, y[b:]] += rows_g[b:]
        result[embed.weight] = es
    return result


def set_grad_samples(optimizer: Any, samples: dict[nn.Parameter, torch.Tensor]) -> None:
    """Give each of ``optimizer``'s parameters (an Opacus ``DPOptimizer``) its per-sample gradient, as
    ``GradSampleModule``'s backward would, so that the next ``optimizer.step()`` clips, noises and scales them."""
    params = list(optimizer.params)
    missing = [p for p in params if p not in samples]
    if missing or len(samples) != len(params):
        raise ValueError("the per-sample gradients do not cover the optimizer's parameters one to one")
    for p in params:
        p.grad_sample = samples[p]
