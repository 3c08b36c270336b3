"""``dp_gan_ft``: DP fine-tuning of a public GAN (DP-GAN-FT), a baseline of paper 000 (DP-MGE / DP-DRE).

Paper 000, "Baselines" 1: a GAN is trained on the public data (ImageNet) in the feature space of the pretrained
encoder h, generator and discriminator both 4-layer MLPs; it is then combined with the IC-GAN g and fine-tuned on
the private data with a differentially private Adam. This file is a reconstruction of that baseline on dpsyn's
public models (:mod:`dpsyn.public`: h and g; the embedded ones are trained on ``fmnist_public``):

1. *Public pretraining* (no privacy cost): the feature GAN (:mod:`dpsyn.lit.feature_gan`) is trained, non-privately,
   on ``h(x)`` of the dataset's public split, every row carrying the "no class" label.
2. *Private fine-tuning*: the same networks continue on the private features ``h(x_i)`` with their labels; the
   discriminator is trained with DP-SGD/DP-Adam through Opacus (per-sample clipping to ``max_grad_norm``, Gaussian
   noise, Poisson sampling), the noise multiplier calibrated once for the planned number of discriminator steps by
   the configured accountant (RDP by default) and the run recorded as one ``SampledGaussianEvent``; the generator is
   post-processing. ``eps=inf``: the same training without clipping or noise, recorded as a ``NonPrivateEvent``.
3. *Sampling*: ``v = G(z, y)`` on the unit sphere, decoded into an image by the public generator, ``x = g(z', v)``.

Departures from the paper, all for the embedded CPU setting: only the feature GAN is fine-tuned (the paper also
fine-tunes the IC-GAN generator and discriminator jointly with it); the feature GAN is class-conditional (dpsyn
scores downstream accuracy; labels drawn uniformly, a public choice); the h/g pair is dpsyn's embedded stand-in for
IC-GAN's SwAV ResNet-50 and BigGAN generator unless ``public=imagenet``.

The ``private`` features are computed by h, a fixed public function; the discriminator sees them only inside the
DP-SGD step (``tests/test_paper000_baselines.py`` checks this with a forward hook).

Resuming a crashed run (``checkpoint_every`` > 0 and a run directory; the pattern of ``dp_gan``): the DP stage writes
``run_dir/checkpoints/last.ckpt`` every ``checkpoint_every`` discriminator steps (:class:`~dpsyn.lit.gan.
PeriodicCheckpoint`), holding the DP steps made, the DP calibration and the record of the public pretraining the
weights descend from. A re-run in the same directory refuses a checkpoint made under another calibration or another
pretraining, skips the pretraining, and continues the DP stage from the steps already made; the ledger charges the
total once, each step before it is made (:class:`dpsyn.lit.dpsgd.ChargeAhead`), and with the steps a killed attempt
made after its last checkpoint (kept from the run's journal) training stops when the charged steps reach the
planned ones. The public pretraining is checkpointed the same way, to ``run_dir/checkpoints/pretrain.ckpt``: a
re-run finds it complete (and skips it) or continues it. It is a checkpoint in the run directory rather than a
cache keyed by a hash of the config because the DP stage's weights descend from one particular pretraining: a
cache shared across runs could be replaced under a resumed run, and its settings are kept in the checkpoint in
clear so that a refusal can say what differs.
"""

from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch
from torch.utils.data import DataLoader, TensorDataset

from dpsyn.data.base import Split
from dpsyn.lit.feature_gan import FeatureDiscriminator, FeatureGANModule, FeatureGenerator, fit_feature_gan_stage
from dpsyn.lit.dpsgd import ChargeAhead, open_dpsgd_event, private_discriminator_loader
from dpsyn.lit.gan import PeriodicCheckpoint
from dpsyn.methods.base import DPSGD_ACCOUNTING_KEYS, DPSGD_GAN_TUNABLE_KEYS, METHODS, Method, PrivacyBudget, Samples
from dpsyn.privacy import PrivacyLedger
from dpsyn.results.checkpoint import lightning_dp_steps
from dpsyn.methods.tiny import SHOES

log = logging.getLogger(__name__)


def public_subsample(public: Split, n: int | None, seed: int) -> Split:
    """A seeded subsample of ``n`` public rows (all when ``n`` is None or not smaller than the split)."""
    if n is None or n >= len(public):
        return public
    rows = np.sort(np.random.default_rng(seed).choice(len(public), size=n, replace=False))
    return Split(public.x[rows], public.y[rows], public.index[rows] if public.index is not None else None)


def _check_pretraining(ckpt: Path, saved: dict[str, Any] | None, settings: dict[str, Any] | None) -> None:
    """Refuse a checkpoint whose weights descend from another public pretraining than this config's.

    Args:
        ckpt: the checkpoint (for the message).
        saved: its ``checkpoint["dpsyn"]["pretraining"]`` record (None: no pretraining).
        settings: this config's pretraining settings (None: no pretraining).

    Raises:
        ValueError: the settings differ.
    """
    have = None if saved is None else saved["settings"]
    if have != settings:
        diff = sorted(k for k in {**(have or {}), **(settings or {})} if (have or {}).get(k) != (settings or {}).get(k))
        raise ValueError(
            f"{ckpt} descends from the public pretraining {have}, this config asks for {settings} (differing: "
            f"{', '.join(diff)}): resume with the same config, or use a new run directory"
        )


class FeatureGANMethod(Method):
    """A class-conditional GAN on h's features, decoded by g; optionally pretrained on public features first.

    Subclasses set :attr:`pretrain_on_public` (DP-GAN-FT: True, DP-GAN-MI: False) and :attr:`method_name`.
    """

    needs_public = True
    kinds = ("image",)
    pretrain_on_public: ClassVar[bool] = True
    fitted_attrs = ("module", "models", "pretrain_info")
    method_name: ClassVar[str] = "dp_gan_ft"

    def _nets(self, feature_dim: int) -> tuple[FeatureGenerator, FeatureDiscriminator]:
        cfg, labels = self.cfg, self.ctx.num_classes + 1  # + the "no class" token of public pretraining
        G = FeatureGenerator(z_dim=int(cfg.z_dim), feature_dim=feature_dim, num_labels=labels,
                             hidden=int(cfg.hidden), layers=int(cfg.layers))
        D = FeatureDiscriminator(feature_dim=feature_dim, num_labels=labels, hidden=int(cfg.hidden),
                                 layers=int(cfg.layers))
        return G, D

    def _module(self, G: Any, D: Any, *, stage: str, batch: int, dp: dict[str, Any] | None,
                max_steps: int | None = None, pretraining: dict[str, Any] | None = None) -> FeatureGANModule:
        cfg = self.cfg
        return FeatureGANModule(
            stage=stage, null_label=self.ctx.num_classes, max_steps=max_steps, pretraining=pretraining,
            generator=G, discriminator=D,
            z_dim=int(cfg.z_dim), num_classes=self.ctx.num_classes, expected_batch_size=batch,
            lr_g=float(cfg.lr_g), lr_d=float(cfg.lr_d), beta1=float(cfg.beta1), dp=dp,
            dpsgd_step=str(cfg.dpsgd_step),
            split_fake_rows=cfg.split_fake_rows,
        )

    def _pretrain_settings(self) -> dict[str, Any]:
        """What determines the public pretraining (compared on resume): its settings, the shared network settings,
        the seed and the public encoder."""
        cfg, enc = self.cfg, self.models.record.get("encoder") or {}
        return {
            "steps": int(cfg.pretrain_steps), "batch_size": int(cfg.pretrain_batch_size), "max_public": cfg.max_public,
            "lr_g": float(cfg.lr_g), "lr_d": float(cfg.lr_d), "beta1": float(cfg.beta1), "z_dim": int(cfg.z_dim),
            "hidden": int(cfg.hidden), "layers": int(cfg.layers), "seed": int(self.ctx.seed),
            "encoder": enc.get("key") or enc.get("sha256"),
        }

    def _pretrain(self, G: Any, D: Any, public: Split, trainer_kwargs: dict[str, Any], *,
                  settings: dict[str, Any], ckpt: Path | None) -> dict[str, Any]:
        """Stage 1: non-private training on public features (every row labelled "no class").

        With ``ckpt`` (``run_dir/checkpoints/pretrain.ckpt``), checkpointed as it goes; a complete checkpoint is
        loaded instead of training, an incomplete one is continued.

        Returns:
            The pretraining's record: ``settings``, ``n_public``, ``batch_size`` and the ``steps`` made.
        """
        cfg, ctx = self.cfg, self.ctx
        steps, batch = settings["steps"], settings["batch_size"]
        pub = public_subsample(public, cfg.max_public, ctx.seed)
        if batch > len(pub):
            raise ValueError(f"method.pretrain_batch_size={batch} exceeds the {len(pub)} public examples")
        record = {"settings": settings, "n_public": len(pub), "batch_size": batch}
        module = self._module(G, D, stage="public_pretrain", batch=batch, dp=None, max_steps=steps, pretraining=record)
        callbacks, ckpt_path = [], None
        if ckpt is not None:
            callbacks.append(PeriodicCheckpoint(ckpt, int(cfg.checkpoint_every)))
            if ckpt.is_file():
                state = torch.load(ckpt, map_location="cpu", weights_only=False)
                _check_pretraining(ckpt, state["dpsyn"].get("pretraining"), settings)
                done = int(state["dpsyn"]["dp_steps"])
                if done >= steps:
                    module.load_state_dict(state["state_dict"])  # G and D, pretrained
                    log.info("%s: public pretraining already done (%s, %d steps)", self.method_name, ckpt, done)
                    return {**record, "steps": done}
                ckpt_path = str(ckpt)
                log.info("%s: resuming the public pretraining from %s (%d of %d steps made)",
                         self.method_name, ckpt, done, steps)
        feats = self.models.encode(pub.x)
        data = TensorDataset(torch.from_numpy(feats), torch.full((len(feats),), ctx.num_classes, dtype=torch.long))
        loader = DataLoader(data, batch_size=batch, shuffle=True, drop_last=True,
                            generator=torch.Generator().manual_seed(ctx.seed))
        kwargs = {k: v for k, v in trainer_kwargs.items() if k != "limit_train_batches"}  # steps rule here
        fit_feature_gan_stage(module, loader, epochs=math.ceil(steps / len(loader)), trainer_kwargs=kwargs,
                              callbacks=callbacks, ckpt_path=ckpt_path)
        return {**record, "steps": module.dp_steps}

    def fit(
        self, private: Split, budget: PrivacyBudget, ledger: PrivacyLedger, public: Split | None = None
    ) -> None:
        import lightning as L

        cfg, ctx = self.cfg, self.ctx
        name = self.method_name
        self.models = self.public_models()
        # seeded once the public models are loaded: training them (a cache miss) draws from the global generators,
        # and the networks' initialisation must not depend on whether the cache held them
        L.seed_everything(ctx.seed, workers=True, verbose=False)
        G, D = self._nets(self.models.feature_dim)
        trainer_kwargs = dict(ctx.trainer)
        epochs = trainer_kwargs.pop("max_epochs", None) or int(cfg.epochs)

        every = int(cfg.checkpoint_every)
        ckpt_dir = Path(ctx.run_dir) / "checkpoints" if ctx.run_dir is not None and every > 0 else None
        last = ckpt_dir / "last.ckpt" if ckpt_dir is not None else None  # the DP stage's
        resuming = last is not None and last.is_file()
        pretraining = self.pretrain_on_public and int(cfg.pretrain_steps) > 0
        if pretraining and public is None:
            raise ValueError(f"{name} pretrains on public data, and this dataset has none")
        settings = self._pretrain_settings() if pretraining else None

        self.pretrain_info: dict[str, Any] | None = None
        if resuming:
            # the DP checkpoint holds the weights: the pretraining they descend from is not redone, only checked
            saved = torch.load(last, map_location="cpu", weights_only=False)["dpsyn"].get("pretraining")
            _check_pretraining(last, saved, settings)
            self.pretrain_info = saved
        elif pretraining:
            self.pretrain_info = self._pretrain(G, D, public, trainer_kwargs, settings=settings,
                                                ckpt=ckpt_dir / "pretrain.ckpt" if ckpt_dir is not None else None)

        # h is a fixed public function: encoding is pre-processing; the features are private from here on
        feats = self.models.encode(private.x)
        data = TensorDataset(torch.from_numpy(feats), torch.from_numpy(private.y.astype(np.int64)))
        n, batch = len(data), int(cfg.batch_size)
        if batch > n:
            raise ValueError(f"method.batch_size={batch} exceeds the {n} private examples")
        stage = "private_finetune" if self.pretrain_info is not None else "private_scratch"
        D, loader, dp = private_discriminator_loader(
            D, data, batch=batch, epochs=epochs, limit_train_batches=trainer_kwargs.get("limit_train_batches"),
            budget=budget, ctx=ctx, max_grad_norm=float(cfg.max_grad_norm), grad_sample_mode=cfg.grad_sample_mode,
            name=name,
        )
        self.module = self._module(G, D, stage=stage, batch=batch, dp=dp, pretraining=self.pretrain_info)
        callbacks: list[Any] = []
        ckpt_path = None
        if last is not None:
            callbacks.append(PeriodicCheckpoint(last, every))
            if resuming:
                ckpt_path = str(last)
                self.module.dp_steps = lightning_dp_steps(last, dp)  # refuses another calibration
                log.info("%s: resuming the DP stage from %s (%d discriminator steps already made)",
                         name, last, self.module.dp_steps)
        # the event before the first step, each step charged before it is made (write-ahead: the run's journal);
        # after a resume the steps of the interrupted attempts are charged once: those of the checkpoint, and those
        # the journal holds beyond it, and training stops when the steps charged reach the planned ones
        start = self.module.dp_steps
        event_id = open_dpsgd_event(
            ledger, noise_multiplier=dp["noise_multiplier"] if dp else None, sample_rate=batch / n,
            accountant=ctx.accountant,
            label=f"{name} feature-GAN discriminator on h(private) (DP-SGD, clip {float(cfg.max_grad_norm):g})",
            non_private_label=f"{name} feature GAN trained without noise (eps=inf)", steps_done=start,
            planned=dp["max_steps"] if dp else None, name=name)
        charger = ChargeAhead(ledger, event_id, dp["max_steps"]) if dp is not None and event_id is not None else None
        if charger is not None:
            callbacks.append(charger)
        try:
            fit_feature_gan_stage(self.module, loader, epochs=epochs, trainer_kwargs=trainer_kwargs,
                                  logger=ctx.logger, callbacks=callbacks, ckpt_path=ckpt_path)
        finally:
            if charger is not None:  # every release that happened is charged, even after a crash or an early stop
                charger.settle(self.module.dp_steps - start)
        self.module.G.eval()

    def sample(self, n: int, labels: np.ndarray | None = None) -> Samples:
        rng = np.random.default_rng(self.ctx.seed)
        if labels is None:
            labels = self.uniform_labels(n, rng)
        torch.manual_seed(self.ctx.seed)
        feats = self.module.generate(torch.from_numpy(np.asarray(labels, dtype=np.int64))).cpu().numpy()
        x = self.models.decode(feats, generator=torch.Generator().manual_seed(self.ctx.seed + 1))
        provenance = {
            "method": self.method_name,
            "labels": "uniform over classes (public choice)",
            "decoder": "public generator g(z, v), v = G(z, y) from the feature GAN",
            "pretraining": self.pretrain_info or "none (trained from scratch on private features)",
            "public_models": self.models.record.get("cache") or self.models.record.get("kind"),
        }
        return Samples(x.astype(np.float32), np.asarray(labels), provenance)


@METHODS.register("dp_gan_ft")
class DPGANFT(FeatureGANMethod):
    """DP-GAN-FT (see the module docstring): public pretraining, then DP fine-tuning, of a feature GAN."""

    # the pretraining reads public rows only
    accounting_keys = DPSGD_ACCOUNTING_KEYS
    tunable_keys = (*DPSGD_GAN_TUNABLE_KEYS, "hidden", "layers", "pretrain_steps", "pretrain_batch_size", "max_public")
    tiny = ("method=dp_gan_ft", *SHOES, "method.pretrain_steps=10", "method.max_public=400")

    pretrain_on_public = True
    method_name = "dp_gan_ft"
