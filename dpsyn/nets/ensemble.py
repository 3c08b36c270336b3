"""A vectorised ensemble of N teacher discriminators of one architecture.

PATE-style methods (G-PATE, paper 002) train thousands of small discriminators, each on its own disjoint slice of
the private data (:class:`dpsyn.data.partitions.KeyedPartitions`). A Python loop over N modules launches N small kernels per layer; here the N teachers' parameters
are stacked (``torch.func.stack_module_state``: every parameter gets a leading N dimension) and one
``torch.func.functional_call`` is ``vmap``-ed over that dimension, so each layer runs as ONE batched kernel
(a convolution with batched weights becomes a grouped convolution; with a shared input, one wider convolution).
``benchmarks/teachers.py`` measures the speed-up against the loop.

Teachers are independent: teacher i's logits depend on its parameters and inputs only. Hence

* the summed loss over teachers gives each teacher exactly the gradient of its own loss, and
* one ``torch.optim.Adam`` over the stacked parameters is N independent Adams (Adam is elementwise; its step count
  is shared, and all teachers step together), so ``train_step`` is one optimiser step for the whole ensemble;
* the gradient of the summed loss w.r.t. per-teacher copies of an input is every teacher's own input gradient.

Memory is bounded by running the teachers in chunks of ``chunk_size`` (gradients accumulate into the stacked
leaves across chunks). The modules must not use batch statistics (BatchNorm): a teacher's output on one sample must
not depend on the other samples of its batch (the discriminators of ``dpsyn.nets.dcgan``/``mlp_gan`` qualify).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Iterator, Sequence

import torch
from torch import nn
from torch.func import functional_call, grad, stack_module_state, vmap
from torch.nn import functional as F

from dpsyn.nets.dcgan import one_hot


def _key(name: str) -> str:
    return name.replace(".", "__")


class TeacherEnsemble(nn.Module):
    """N teachers D_i(x, y) -> logit of one architecture, run as one batched computation.

    Args:
        make_module: builds one teacher (called ``n_teachers`` times; each call initialises fresh weights from
            torch's global RNG, so seed it first for reproducible teachers).
        n_teachers: N >= 1.
        lr, betas: the ensemble's Adam (one Adam over the stacked parameters = N independent Adams).
        chunk_size: teachers per batched call (bounds memory); None = all at once.
        device: where the stacked parameters live (default: where ``make_module`` puts them). Build the ensemble
            there rather than moving it afterwards, so that its optimizer is made for that device.

    Raises:
        ValueError: on ``n_teachers < 1`` or ``chunk_size < 1``.
    """

    def __init__(
        self,
        make_module: Callable[[], nn.Module],
        n_teachers: int,
        *,
        lr: float = 2e-4,
        betas: tuple[float, float] = (0.5, 0.999),
        chunk_size: int | None = None,
        device: torch.device | str | None = None,
    ) -> None:
        if int(n_teachers) < 1:
            raise ValueError(f"n_teachers must be >= 1, got {n_teachers!r}")
        super().__init__()
        self._setup([make_module() for _ in range(int(n_teachers))], lr=lr, betas=betas, chunk_size=chunk_size,
                    device=device)

    @classmethod
    def from_modules(
        cls,
        modules: Sequence[nn.Module],
        *,
        lr: float = 2e-4,
        betas: tuple[float, float] = (0.5, 0.999),
        chunk_size: int | None = None,
        device: torch.device | str | None = None,
    ) -> TeacherEnsemble:
        """An ensemble with exactly the weights of ``modules`` (same architecture; the modules are not modified)."""
        if not modules:
            raise ValueError("from_modules needs at least one module")
        self = cls.__new__(cls)
        nn.Module.__init__(self)
        self._setup(list(modules), lr=lr, betas=betas, chunk_size=chunk_size, device=device)
        return self

    def _setup(
        self, modules: list[nn.Module], *, lr: float, betas: tuple[float, float], chunk_size: int | None,
        device: torch.device | str | None,
    ) -> None:
        if chunk_size is not None and int(chunk_size) < 1:
            raise ValueError(f"chunk_size must be None or >= 1, got {chunk_size!r}")
        self.n_teachers = len(modules)
        self.chunk_size = None if chunk_size is None else int(chunk_size)
        params, buffers = stack_module_state(modules)  # detached copies, leading dim N, leaves requiring grad
        self._names = list(params)
        self._buffer_names = list(buffers)
        for name, p in params.items():
            self.register_parameter(_key(name), nn.Parameter(p.to(device) if device is not None else p))
        for name, b in buffers.items():
            self.register_buffer(_key(name), b.to(device) if device is not None else b)
        # the architecture without weights: functional_call supplies each teacher's slice
        self._base = [copy.deepcopy(modules[0]).to("meta")]  # in a list: not a registered submodule
        # Adam is elementwise, and the teachers' losses are summed, so this one optimiser over the stacked leaves is
        # N independent Adams (each teacher's moments and update depend on its own gradient only).
        self.lr, self.betas = float(lr), (float(betas[0]), float(betas[1]))
        # fused: one kernel for all stacked tensors (measured 7x faster than the default on CPU for 500 MLP teachers)
        try:
            self.optimizer = torch.optim.Adam(self.parameters(), lr=self.lr, betas=self.betas, fused=True)
        except (RuntimeError, ValueError):  # a device or dtype without the fused kernel
            self.optimizer = torch.optim.Adam(self.parameters(), lr=self.lr, betas=self.betas)

    # ---- stacked state --------------------------------------------------------------------------------------

    def stacked(self) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        """The stacked parameters and buffers by their module names (leading dim N)."""
        params = {n: getattr(self, _key(n)) for n in self._names}
        buffers = {n: getattr(self, _key(n)) for n in self._buffer_names}
        return params, buffers

    def teacher(self, i: int) -> nn.Module:
        """A standalone copy of teacher ``i`` (an ordinary module with that teacher's current weights)."""
        if not 0 <= i < self.n_teachers:
            raise IndexError(f"teacher {i} of {self.n_teachers}")
        params, buffers = self.stacked()
        module = copy.deepcopy(self._base[0]).to_empty(device=self.device)
        state = {n: t[i].detach().clone() for n, t in {**params, **buffers}.items()}
        module.load_state_dict(state)
        return module

    @property
    def device(self) -> torch.device:
        return next(iter(self.parameters())).device

    def _chunks(self) -> list[tuple[int, int]]:
        step = self.chunk_size or self.n_teachers
        return [(s, min(s + step, self.n_teachers)) for s in range(0, self.n_teachers, step)]

    def _slice(self, s: int, e: int) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        params, buffers = self.stacked()
        return {n: t[s:e] for n, t in params.items()}, {n: t[s:e] for n, t in buffers.items()}

    def _call(self, params: dict[str, torch.Tensor], buffers: dict[str, torch.Tensor], x: torch.Tensor,
              y: torch.Tensor) -> torch.Tensor:
        return functional_call(self._base[0], (params, buffers), (x, y))

    def _logits(self, s: int, e: int, x: torch.Tensor, y: torch.Tensor, shared: bool) -> torch.Tensor:
        params, buffers = self._slice(s, e)
        dims = None if shared else 0
        return vmap(self._call, in_dims=(0, 0, dims, dims))(params, buffers, x, y)

    # ---- forward passes -------------------------------------------------------------------------------------

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Each teacher on its own batch.

        Args:
            x: (N, b, ...) inputs, row i for teacher i.
            y: (N, b) labels.

        Returns:
            (N, b) logits.
        """
        self._check_n(x, y)
        return torch.cat([self._logits(s, e, x[s:e], y[s:e], shared=False) for s, e in self._chunks()])

    def forward_shared(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """All teachers on the same batch: (b, ...), (b,) -> (N, b) logits."""
        return torch.cat([self._logits(s, e, x, y, shared=True) for s, e in self._chunks()])

    def _check_n(self, *tensors: torch.Tensor) -> None:
        for t in tensors:
            if t.shape[0] != self.n_teachers:
                raise ValueError(f"expected a leading dimension of {self.n_teachers} teachers, got shape {tuple(t.shape)}")

    # ---- training -------------------------------------------------------------------------------------------

    def train_step(
        self, real_x: torch.Tensor, real_y: torch.Tensor, fake_x: torch.Tensor, fake_y: torch.Tensor,
        real_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """One Adam step of every teacher on BCE(D_i(real), 1) + BCE(D_i(fake), 0) (means over its batch).

        Args:
            real_x, real_y: (N, b, ...) / (N, b): teacher i's real rows (from its own partition only).
            fake_x, fake_y: (N, b', ...) / (N, b') per-teacher fakes, or (b', ...) / (b',) fakes shared by all.
            real_mask: (N, b) bool, or None (all real slots used): teacher i's real term is the mean over its
                unmasked slots, and 0 where it has none (a partition smaller than the batch, or empty:
                :meth:`dpsyn.data.partitions.KeyedPartitions.batch`). Masked slots get exactly no weight.

        Returns:
            (N,) each teacher's loss before the step (detached).
        """
        self._check_n(real_x, real_y)
        if real_mask is not None and tuple(real_mask.shape) != tuple(real_y.shape):
            raise ValueError(f"real_mask of shape {tuple(real_mask.shape)} for real rows {tuple(real_y.shape)}")
        shared = fake_x.dim() == real_x.dim() - 1
        if not shared:
            self._check_n(fake_x, fake_y)
        full, buffers = self.stacked()
        chunks = self._chunks()
        if len(chunks) > 1:
            for p in full.values():
                if p.grad is None:
                    p.grad = torch.empty_like(p)  # every chunk writes its rows below
        losses = []
        for s, e in chunks:  # one chunk's activations alive at a time
            # gradients w.r.t. detached slices, written into the chunk's rows of .grad: backpropagating into views
            # of the stacked leaves would materialise a full-size zero gradient per chunk (measured: half the step)
            params = {n: (p[s:e] if len(chunks) > 1 else p).detach().requires_grad_(True) for n, p in full.items()}
            bufs = {n: t[s:e] for n, t in buffers.items()}
            fx = fake_x.expand(e - s, *fake_x.shape) if shared else fake_x[s:e]
            fy = fake_y.expand(e - s, *fake_y.shape) if shared else fake_y[s:e]
            # real and fake rows in one batched call: one weight-gradient product per layer instead of two plus a sum
            logits = vmap(self._call, in_dims=(0, 0, 0, 0))(
                params, bufs, torch.cat([real_x[s:e], fx], dim=1), torch.cat([real_y[s:e], fy], dim=1)
            )
            lr_, lf = logits[:, : real_x.shape[1]], logits[:, real_x.shape[1] :]
            real_loss = F.binary_cross_entropy_with_logits(lr_, torch.ones_like(lr_), reduction="none")
            if real_mask is None:
                loss = real_loss.mean(1)
            else:  # where() rather than a product: a masked slot contributes exactly nothing
                w = real_mask[s:e].to(real_loss.dtype)
                loss = torch.where(real_mask[s:e], real_loss, 0.0).sum(1) / w.sum(1).clamp(min=1.0)
            loss = loss + F.binary_cross_entropy_with_logits(lf, torch.zeros_like(lf), reduction="none").mean(1)
            # teachers are independent: the sum gives each exactly the gradient of its own loss
            grads = torch.autograd.grad(loss.sum(), list(params.values()))
            for name, g in zip(params, grads):
                if len(chunks) > 1:
                    full[name].grad[s:e] = g
                else:
                    # the whole ensemble in one call: no copy unless autograd returned another layout (the fused
                    # Adam kernel needs the parameter's strides)
                    full[name].grad = g if g.stride() == full[name].stride() else g.contiguous()
            losses.append(loss.detach())
        self.optimizer.step()
        return torch.cat(losses)

    def _generator_loss(self, params: dict[str, torch.Tensor], buffers: dict[str, torch.Tensor], x: torch.Tensor,
                        y: torch.Tensor) -> torch.Tensor:
        # -BCE(l, 1) = -softplus(-l) = log sigmoid(l), summed over the samples (which are independent)
        return F.logsigmoid(self._call(params, buffers, x, y)).sum()

    def input_gradient_chunks(self, x: torch.Tensor, y: torch.Tensor) -> Iterator[tuple[int, torch.Tensor]]:
        """:meth:`input_gradients` one chunk of teachers at a time: yields ``(first teacher, (e-s, b, ...))``."""
        grad_x = vmap(grad(self._generator_loss, argnums=2), in_dims=(0, 0, None, None))
        x = x.detach()
        for s, e in self._chunks():
            params, buffers = self._slice(s, e)
            # one vmap(grad) call: the shared x stays unbatched (a first layer with batched weights runs as one wide
            # layer), and each teacher gets the gradient of its own loss; measured 1.1-2.8x faster than autograd
            # on per-teacher copies of x (benchmarks/teachers.py)
            yield s, grad_x({n: p.detach() for n, p in params.items()}, buffers, x, y)

    def input_gradients(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Every teacher's gradient of its generator loss ``-BCE(D_i(x_j), 1)`` w.r.t. each sample x_j.

        The direction that makes x_j look more real to teacher i (G-PATE's ``img_grads``). Per-sample losses
        (not averaged over the batch); the teachers' parameters get no gradient.

        Args:
            x: (b, ...) samples, shared by all teachers.
            y: (b,) their labels.

        Returns:
            (N, b, ...) gradients.
        """
        return torch.cat([g for _, g in self.input_gradient_chunks(x, y)])


class CondConvTeacher(nn.Module):
    """A small conditional DCGAN discriminator for PATE teachers: conv(4, 2, 1) -> LeakyReLU -> conv(4, 2, 1) ->
    LeakyReLU -> linear, no normalisation layers.

    :class:`dpsyn.nets.dcgan.CondDCGANDiscriminator` feeds the label as ``num_classes`` one-hot input channels,
    which makes its first convolution ``(channels + num_classes)/channels`` times more expensive (11x on
    Fashion-MNIST); here the label adds a learned per-class bias to the first layer's feature maps, which is what
    the one-hot maps contribute away from the zero-padded border, at the cost of a ``channels``-input convolution.

    Args:
        num_classes: number of classes.
        channels: image channels.
        resolution: image side; divisible by 4.
        ndf: width of the first layer (the second has ``2 * ndf``).
    """

    def __init__(self, *, num_classes: int, channels: int, resolution: int, ndf: int = 8) -> None:
        super().__init__()
        if resolution % 4:
            raise ValueError(f"resolution must be divisible by 4, got {resolution}")
        self.num_classes = num_classes
        self.conv1 = nn.Conv2d(channels, ndf, 4, 2, 1)
        self.label = nn.Linear(num_classes, ndf, bias=False)
        self.conv2 = nn.Conv2d(ndf, 2 * ndf, 4, 2, 1)
        self.fc = nn.Linear(2 * ndf * (resolution // 4) ** 2, 1)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        h = self.conv1(x) + self.label(one_hot(y, self.num_classes, x.dtype))[:, :, None, None]
        h = F.leaky_relu(self.conv2(F.leaky_relu(h, 0.2)), 0.2)
        return self.fc(h.flatten(1)).squeeze(1)


class CondPATETeacher(nn.Module):
    """G-PATE's teacher discriminator (AI-secure/G-PATE ``model.py``: a conditional DCGAN discriminator with the
    one-hot label concatenated at every layer): conv(4, 2, 1) -> LeakyReLU -> conv(4, 2, 1) -> LeakyReLU ->
    linear(``hidden``) -> LeakyReLU -> linear(1), no normalisation layers.

    The label enters every layer as a learned per-class bias: concatenating ``num_classes`` one-hot maps (or columns)
    to a layer's input adds exactly such a bias to its output away from the zero-padded border, at a fraction of the
    cost (the one-hot maps made the first convolution 11x more expensive on Fashion-MNIST). The authors' teachers use
    batch normalisation in the two middle layers; an ensemble member's output must not depend on the other samples of
    its batch (:class:`TeacherEnsemble`), so there is none here. Their MNIST sizes are conv widths 11 and 42 and
    ``hidden`` 256 (~0.55M parameters): ``ndf=21, hidden=256`` here has about as many.

    Args:
        num_classes: number of classes.
        channels: image channels.
        resolution: image side; divisible by 4.
        ndf: width of the first convolution (the second has ``2 * ndf``).
        hidden: width of the fully connected hidden layer (the authors' ``dfc_dim``).
    """

    def __init__(self, *, num_classes: int, channels: int, resolution: int, ndf: int = 4, hidden: int = 32) -> None:
        super().__init__()
        if resolution % 4:
            raise ValueError(f"resolution must be divisible by 4, got {resolution}")
        self.num_classes = num_classes
        self.conv1 = nn.Conv2d(channels, ndf, 4, 2, 1)
        self.conv2 = nn.Conv2d(ndf, 2 * ndf, 4, 2, 1)
        self.fc = nn.Linear(2 * ndf * (resolution // 4) ** 2, hidden)
        self.out = nn.Linear(hidden, 1)
        # one bias per class and layer: the one-hot label concatenated to every layer's input
        self.label = nn.Linear(num_classes, ndf + 2 * ndf + hidden + 1, bias=False)
        self._cuts = (ndf, 3 * ndf, 3 * ndf + hidden)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        lab = self.label(F.one_hot(y, self.num_classes).to(x.dtype))
        a, b, c = self._cuts
        h = F.leaky_relu(self.conv1(x) + lab[:, :a, None, None], 0.2)
        h = F.leaky_relu(self.conv2(h) + lab[:, a:b, None, None], 0.2)
        h = F.leaky_relu(self.fc(h.flatten(1)) + lab[:, b:c], 0.2)
        return (self.out(h) + lab[:, c:]).squeeze(1)


class CondMLPTeacher(nn.Module):
    """A conditional MLP discriminator for PATE teachers: ``[x, onehot(y)] -> hidden (LeakyReLU 0.2) -> logit``.

    The same function as :class:`dpsyn.nets.mlp_gan.CondMLPDiscriminator`, but the label enters the first layer as
    a learned per-class bias instead of concatenated one-hot columns, which saves copying every input row (the
    concatenation was a third of an ensemble's training step on CPU).

    Args:
        num_classes: number of classes.
        shape: the shape of one input (image or table row); it is flattened.
        hidden: widths of the hidden layers (at least one).
    """

    def __init__(self, *, num_classes: int, shape: tuple[int, ...], hidden: Sequence[int]) -> None:
        super().__init__()
        if not hidden:
            raise ValueError("CondMLPTeacher needs at least one hidden layer")
        self.num_classes = num_classes
        widths = [int(math.prod(shape)), *[int(h) for h in hidden]]
        self.first = nn.Linear(widths[0], widths[1])
        self.label = nn.Linear(num_classes, widths[1], bias=False)
        self.rest = nn.ModuleList(nn.Linear(a, b) for a, b in zip(widths[1:-1], widths[2:]))
        self.out = nn.Linear(widths[-1], 1)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        h = F.leaky_relu(self.first(x.flatten(1)) + self.label(F.one_hot(y, self.num_classes).to(x.dtype)), 0.2)
        for layer in self.rest:
            h = F.leaky_relu(layer(h), 0.2)
        return self.out(h).squeeze(1)
