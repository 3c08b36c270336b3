"""``dp_gan``: DP-GAN (Xie et al. 2018) — a class-conditional GAN whose discriminator is trained with DP-SGD.

The baseline of papers 000 and 002. The discriminator is the only part that touches private data; it is trained
with Opacus DP-SGD (per-sample clipping, Gaussian noise) under Poisson sampling, accounted with the configured
accountant (RDP by default); the generator is post-processing. The noise multiplier is calibrated once, before
training, for the exact number of discriminator steps the Trainer will run, so the run spends at most its target.

Images: a conditional DCGAN (``arch=dcgan``) or DPImageBench's ResNets (``arch=dib``, :mod:`dpsyn.nets.dib`, whose
discriminator Opacus's hooks differentiate per sample; dpsyn's fused engine covers the DCGAN only); labels of the
samples are uniform over the classes (a public choice). ``method.loss`` picks the non-saturating BCE (the default) or
the hinge loss (DPImageBench's), and ``method.ema`` > 0 releases an exponential moving average of G's weights
(:class:`~dpsyn.lit.gan.GANModule`); neither changes what is clipped, noised or charged.
Tables (G-PATE's Kaggle protocol, paper 002 Sec. 5): conditional MLPs (``table_g_hidden``/``table_d_hidden``).
The class proportions are first released with the Laplace mechanism at ``class_ratio_epsilon``
(:meth:`~dpsyn.methods.base.Method.release_class_proportions`); DP-SGD is calibrated for the remaining
``eps - class_ratio_epsilon`` at the same delta (basic composition: the ledger adds the two), the generator's fake
labels during training and the samples' labels are drawn from the released proportions (post-processing), so an
unbalanced table such as Kaggle Credit (0.17% fraud) keeps its class ratio.

``trainer=ddp`` trains on several processes (:mod:`dpsyn.lit.ddp`): each rank Poisson-samples its shard at the same
rate and clips its own rows, the noise is drawn once per step (rank 0), and the ledger charges one step per global
step, as in one process. Only the training runs in the ranks; this process keeps the ledger and everything after fit.
"""

from __future__ import annotations

import copy
import logging
import math
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import TensorDataset

from dpsyn.data.base import Split
from dpsyn.lit.gan import GANModule, PeriodicCheckpoint
from dpsyn.methods.base import DPSGD_ACCOUNTING_KEYS, DPSGD_GAN_TUNABLE_KEYS, METHODS, Method, PrivacyBudget, Samples
from dpsyn.config.schema import DP_GAN_ARCHS
from dpsyn.nets.dcgan import CondDCGANDiscriminator, CondDCGANGenerator
from dpsyn.nets.dib import DIB_NDF, DIB_NGF, DIBDiscriminator, DIBGenerator, generator_blocks
from dpsyn.nets.mlp_gan import CondMLPDiscriminator, CondMLPGenerator
from dpsyn.lit.dpsgd import ChargeAhead, open_dpsgd_event, private_discriminator_loader
from dpsyn.privacy import PrivacyLedger
from dpsyn.results.checkpoint import lightning_dp_steps
from dpsyn.methods.tiny import TABLE_METRICS

log = logging.getLogger(__name__)


class _ProportionalLabelGAN(GANModule):
    """:class:`GANModule` whose fake labels are drawn from the released class proportions instead of uniformly.

    With uniform fake labels on an unbalanced table the conditional discriminator could tell fakes by their label
    alone (a "fraud" row would almost always be fake). The proportions are a DP release, so this is post-processing.
    """

    def __init__(self, *, label_probs: np.ndarray, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.register_buffer("label_probs", torch.as_tensor(np.asarray(label_probs), dtype=torch.float32))

    def _latent(self, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        z = torch.randn(n, self.z_dim, device=self.device)
        y = torch.multinomial(self.label_probs, n, replacement=True) if n > 0 else torch.zeros(0, dtype=torch.long)
        return z, y.to(self.device)


def _hidden(cfg: Any, key: str) -> tuple[int, ...]:
    """A config list of hidden-layer widths (checked at compose time, dpsyn.config.schema) as a tuple of ints."""
    value = cfg.get(key) if hasattr(cfg, "get") else getattr(cfg, key, None)
    return tuple(int(w) for w in value)


ARCH_WIDTHS = {"dcgan": (32, 32), "dib": (DIB_NGF, DIB_NDF)}
"""Each image architecture's (ngf, ndf) where ``method.ngf``/``method.ndf`` are null."""


def image_networks(
    arch: str, *, z_dim: int, num_classes: int, channels: int, resolution: int, ngf: int | None, ndf: int | None,
    d_cond: str = "concat",
) -> tuple[torch.nn.Module, torch.nn.Module]:
    """The generator and discriminator of ``arch`` (``method.arch``) for images of shape (channels, res, res).

    Args:
        arch: ``dcgan`` or ``dib``.
        z_dim: latent size.
        num_classes: number of classes.
        channels: image channels.
        resolution: image side.
        ngf: generator width; None: the arch's (:data:`ARCH_WIDTHS`).
        ndf: discriminator width; None: the arch's.
        d_cond: arch=dcgan: how D reads the label (:class:`CondDCGANDiscriminator`'s ``cond``); arch=dib has its own
            projection head and takes only ``concat`` (the default, which means "the arch's").

    Returns:
        ``(G, D)``.

    Raises:
        ValueError: an unknown ``arch``, or ``z_dim``/the image shape unsuited to it.
    """
    if arch not in ARCH_WIDTHS:
        raise ValueError(f"method.arch={arch!r}; allowed: {', '.join(DP_GAN_ARCHS)}")
    ngf = ARCH_WIDTHS[arch][0] if ngf is None else int(ngf)
    ndf = ARCH_WIDTHS[arch][1] if ndf is None else int(ndf)
    if arch == "dcgan":
        G: torch.nn.Module = CondDCGANGenerator(
            z_dim=z_dim, num_classes=num_classes, channels=channels, resolution=resolution, ngf=ngf)
        D: torch.nn.Module = CondDCGANDiscriminator(
            num_classes=num_classes, channels=channels, resolution=resolution, ndf=ndf, cond=d_cond)
        return G, D
    if d_cond != "concat":
        raise ValueError(f"method.d_cond={d_cond!r} is for arch=dcgan; arch=dib's discriminator has its own projection")
    chunks = generator_blocks(resolution) + 1
    if z_dim % chunks:
        raise ValueError(f"method.z_dim={z_dim}: arch=dib splits the latent into {chunks} equal chunks at resolution "
                         f"{resolution} (one for the input, one per block): a multiple of {chunks} (DPImageBench: 60)")
    G = DIBGenerator(z_dim=z_dim, num_classes=num_classes, channels=channels, resolution=resolution, ngf=ngf)
    D = DIBDiscriminator(num_classes=num_classes, channels=channels, resolution=resolution, ndf=ndf)
    return G, D


def _class_ratio_epsilon(cfg: Any, budget: PrivacyBudget) -> float:
    value = cfg.get("class_ratio_epsilon") if hasattr(cfg, "get") else getattr(cfg, "class_ratio_epsilon", None)
    bad = isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf
    if bad or (budget.private and not value < budget.epsilon):
        raise ValueError(
            f"method.class_ratio_epsilon={value!r} must be a number in (0, eps={budget.epsilon:g}) "
            "(the Laplace release of the class proportions; DP-SGD gets the rest)"
        )
    return float(value)


@METHODS.register("dp_gan")
class DPGAN(Method):
    """DP-GAN on images and tables (see the module docstring)."""

    # tables: a Laplace release, DP-SGD the rest
    accounting_keys = (*DPSGD_ACCOUNTING_KEYS, "class_ratio_epsilon")
    # (arch is not tunable: dib is a GPU-sized network, and tables refuse it)
    tunable_keys = (*DPSGD_GAN_TUNABLE_KEYS, "ngf", "ndf", "d_cond", "d_steps", "loss", "ema", "table_g_hidden",
                   "table_d_hidden")
    tiny = ("method=dp_gan", "dataset=breast_cancer", *TABLE_METRICS)

    kinds = ("image", "table")
    supports_ddp = True
    fitted_attrs = ("module", "label_probs", "_labels_note")
    label_probs: np.ndarray | None = None
    _labels_note = ""

    def _table_class_proportions(
        self, private: Split, budget: PrivacyBudget, ledger: PrivacyLedger
    ) -> tuple[np.ndarray, PrivacyBudget]:
        """Release the class proportions (once per run directory: a re-run reuses the release it made and charges
        it once, :meth:`Method.release_class_proportions`) and return them with the budget left for DP-SGD."""
        eps_ratio = _class_ratio_epsilon(self.cfg, budget)
        with ledger.reusing():  # recorded again from checkpoints/class_proportions.json when the journal holds it
            props, remaining = self.release_class_proportions(private, budget, ledger, eps_ratio)
        how = f"released with the Laplace mechanism at eps={eps_ratio:g}" if budget.private else "exact (eps=inf)"
        self._labels_note = f"drawn from the class proportions {how}"
        log.info("class proportions %s %s; DP-SGD gets eps=%g", np.round(props, 4).tolist(), how, remaining.epsilon)
        return props, remaining

    def fit(
        self, private: Split, budget: PrivacyBudget, ledger: PrivacyLedger, public: Split | None = None
    ) -> None:
        import lightning as L

        from dpsyn.lit.ddp import DDPFitError, GANDDPJob, ddp_world_size, fit_gan_ddp

        cfg, ctx = self.cfg, self.ctx
        L.seed_everything(ctx.seed, workers=True, verbose=False)
        table = ctx.kind == "table"
        arch = str(getattr(cfg, "arch", "dcgan"))
        if table:
            if arch != "dcgan":
                raise ValueError(f"method.arch={arch}: tables train conditional MLPs (method.table_g_hidden/"
                                 "table_d_hidden); arch chooses image networks only")
            g_hidden, d_hidden = _hidden(cfg, "table_g_hidden"), _hidden(cfg, "table_d_hidden")
        data = TensorDataset(torch.from_numpy(private.x), torch.from_numpy(private.y))
        n, batch = len(data), int(cfg.batch_size)
        if batch > n:
            raise ValueError(f"method.batch_size={batch} exceeds the {n} private examples")
        world = ddp_world_size(ctx.trainer)  # checked before any release
        if world is not None:
            if not budget.private:
                raise ValueError("trainer=ddp trains DP-SGD only: dp_gan at eps=inf runs on one process (trainer=cpu "
                                 "or trainer=gpu)")
            if batch % world:
                raise ValueError(f"method.batch_size={batch} must be a multiple of trainer.devices={world} under "
                                 "trainer=ddp (each rank's expected batch and fake rows are batch_size / devices)")
            gpus = torch.cuda.device_count()
            if str(ctx.trainer.get("accelerator", "gpu")) in ("gpu", "cuda") and gpus < world:
                raise ValueError(f"trainer=ddp with trainer.devices={world} GPUs, but {gpus} visible; on CPU processes "
                                 "(gloo): trainer.accelerator=cpu")
        self.label_probs = None
        if table:
            # first release (Laplace, eps = class_ratio_epsilon); DP-SGD is calibrated for what is left
            self.label_probs, budget = self._table_class_proportions(private, budget, ledger)
            G: Any = CondMLPGenerator(
                z_dim=int(cfg.z_dim), num_classes=ctx.num_classes, shape=ctx.shape, hidden=g_hidden
            )
            D: Any = CondMLPDiscriminator(num_classes=ctx.num_classes, shape=ctx.shape, hidden=d_hidden)
        else:
            G, D = image_networks(arch, z_dim=int(cfg.z_dim), num_classes=ctx.num_classes, channels=ctx.shape[0],
                                  resolution=ctx.shape[1], ngf=getattr(cfg, "ngf", None), ndf=getattr(cfg, "ndf", None),
                                  d_cond=str(getattr(cfg, "d_cond", "concat")))
        trainer_kwargs = dict(ctx.trainer)
        epochs = trainer_kwargs.pop("max_epochs", None) or int(cfg.epochs)
        if world is not None:
            for key in ("strategy", "devices", "accelerator"):
                trainer_kwargs.pop(key, None)
            D_plain = copy.deepcopy(D)  # what the ranks get: the untrained discriminator, unwrapped

        D, loader, dp = private_discriminator_loader(
            D, data, batch=batch, epochs=epochs, limit_train_batches=trainer_kwargs.get("limit_train_batches"),
            budget=budget, ctx=ctx, max_grad_norm=float(cfg.max_grad_norm), grad_sample_mode=cfg.grad_sample_mode,
            name="dp_gan",
        )
        shared: dict[str, Any] = dict(
            z_dim=int(cfg.z_dim),
            num_classes=ctx.num_classes,
            lr_g=float(cfg.lr_g),
            lr_d=float(cfg.lr_d),
            beta1=float(cfg.beta1),
            dpsgd_step=str(cfg.dpsgd_step),
            split_fake_rows=cfg.split_fake_rows,
            d_steps=int(cfg.d_steps),
            loss=str(cfg.loss),
            ema=float(cfg.ema),
        )
        module_cls: type[GANModule] = GANModule
        if self.label_probs is not None:
            module_cls, shared["label_probs"] = _ProportionalLabelGAN, self.label_probs
        self.module = module_cls(generator=G, discriminator=D, expected_batch_size=batch, dp=dp, **shared)
        callbacks: list[Any] = []
        ckpt_path = None
        if ctx.run_dir is not None and int(cfg.checkpoint_every) > 0:
            ckpt = Path(ctx.run_dir) / "checkpoints" / "last.ckpt"
            callbacks.append(PeriodicCheckpoint(ckpt, int(cfg.checkpoint_every)))
            if ckpt.is_file():
                ckpt_path = str(ckpt)
                self.module.dp_steps = lightning_dp_steps(ckpt, dp)
                log.info("resuming dp_gan from %s (%d discriminator steps already made)", ckpt, self.module.dp_steps)
        # the event before the first step, each step charged before it is made (write-ahead: the run's journal);
        # training stops when the steps charged (an interrupted attempt's included) reach the planned ones
        start = self.module.dp_steps
        event_id = open_dpsgd_event(
            ledger, noise_multiplier=dp["noise_multiplier"] if dp else None, sample_rate=batch / n,
            accountant=ctx.accountant, label="dp_gan discriminator (DP-SGD, clip %g)" % float(cfg.max_grad_norm),
            non_private_label="dp_gan trained without noise (eps=inf)", steps_done=start,
            planned=dp["max_steps"] if dp else None, name="dp_gan")
        charger = ChargeAhead(ledger, event_id, dp["max_steps"]) if dp is not None and event_id is not None else None
        if charger is not None:
            callbacks.append(charger)
        if world is not None:
            assert dp is not None
            job = GANDDPJob(
                world_size=world, accelerator=str(ctx.trainer.get("accelerator", "gpu")), data=data, G=copy.deepcopy(G),
                D=D_plain, module_cls=module_cls, module_kwargs=shared, batch=batch, epochs=epochs,
                trainer_kwargs=trainer_kwargs, budget=budget, seed=ctx.seed, deterministic_noise=ctx.deterministic_noise,
                accountant=ctx.accountant, max_grad_norm=float(cfg.max_grad_norm),
                grad_sample_mode=str(cfg.grad_sample_mode), name="dp_gan", callbacks=callbacks, ckpt_path=ckpt_path)
            try:
                state = fit_gan_ddp(job, planned_steps=int(dp["max_steps"]))
                if state["noise_multiplier"] != dp["noise_multiplier"]:
                    raise RuntimeError(f"dp_gan: the ranks calibrated noise multiplier {state['noise_multiplier']}, "
                                       f"this process {dp['noise_multiplier']}")
                self.module.G.load_state_dict(state["G"])
                if self.module.G_ema is not None:
                    self.module.G_ema.load_state_dict(state["G_ema"])
                self.module.D._module.load_state_dict(state["D"])
                self.module.dp_steps = int(state["dp_steps"])
            except DDPFitError as e:
                self.module.dp_steps = e.dp_steps  # what was (or may have been) released
                raise
            finally:
                # rank 0 charged into the journal; every step made is charged here too, at the least
                ledger.absorb_journal()
                self._settle(charger, start)
            if self.module.G.training:
                self.module.G.eval()
            return
        trainer = L.Trainer(
            max_epochs=epochs,
            logger=ctx.logger if ctx.logger is not None else False,
            enable_checkpointing=False,  # PeriodicCheckpoint writes the one checkpoint a resume needs
            use_distributed_sampler=False,
            num_sanity_val_steps=0,
            callbacks=callbacks,
            **trainer_kwargs,
        )
        try:
            trainer.fit(self.module, train_dataloaders=loader, ckpt_path=ckpt_path)
        finally:
            self._settle(charger, start)
        if self.module.G.training:
            self.module.G.eval()

    def _settle(self, charger: ChargeAhead | None, start: int) -> None:
        """Every release that happened is charged, even when training stopped early or crashed (under
        ``trainer=ddp``: one step per global step, the count of rank 0)."""
        if charger is not None:
            charger.settle(self.module.dp_steps - start)

    def sample(self, n: int, labels: np.ndarray | None = None) -> Samples:
        rng = np.random.default_rng(self.ctx.seed)
        how = "given"
        if labels is None and self.label_probs is not None:
            labels = self.labels_from_proportions(n, self.label_probs, rng)
            how = self._labels_note
        elif labels is None:
            labels = self.uniform_labels(n, rng)
            how = "uniform over classes (public choice)"
        torch.manual_seed(self.ctx.seed)
        x = self.module.generate(torch.from_numpy(np.asarray(labels, dtype=np.int64))).numpy().astype(np.float32)
        provenance: dict[str, Any] = {"method": "dp_gan", "labels": how}
        if self.label_probs is not None:
            provenance["class_proportions"] = [float(p) for p in self.label_probs]
        return Samples(x, labels, provenance)
