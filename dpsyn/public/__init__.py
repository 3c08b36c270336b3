"""Public models of paper 000 (DP-MGE / DP-DRE): an encoder h with ``||h(x)|| <= 1`` and an instance-conditioned
generator g(z, h) that decodes feature vectors into images.

``load_public_models(cfg.public, cache_dir=..., data_dir=...)`` returns a :class:`PublicModels`:

* ``kind: embedded`` (``conf/public/fmnist.yaml``): a conv encoder and a small IC-GAN trained by dpsyn on the
  dataset's public split (``fmnist_public``, the stand-in for ImageNet), loaded from
  ``${paths.cache_dir}/public/`` when cached there (safetensors weights + a JSON sidecar keyed by a hash of the
  architecture version, the settings, the seed and the data's provenance), trained and cached otherwise;
* ``kind: real`` (``conf/public/imagenet.yaml``): adapters around released checkpoints (SwAV or torchvision
  ResNet-50, IC-GAN through the user's ic_gan checkout), read from local files only.

Only public data is touched here, so nothing here spends privacy budget.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch

from dpsyn.lit.classifier import predict, train_classifier
from dpsyn.public.cache import (  # noqa: F401  (SHIPPED_DIR: the shipped checkpoints, re-exported)
    SHIPPED_DIR,
    _as_dict,
    _key,
    _load_cached,
    _positive_int,
    _public_data,
    _resolve,
    _save,
    _sha256,
)
from dpsyn.public.encoder import (
    ENCODER_ARCH_VERSION,
    EmbeddedEncoder,
    EncoderClassifier,
    ResNet50Encoder,
    SwAVEncoder,
    clip_to_unit_ball,
)
from dpsyn.public.icgan import (
    GENERATOR_ARCH_VERSION,
    ICGANGenerator,
    InstanceConditionedGenerator,
    knn_indices,
    train_icgan,
)

__all__ = [
    "EmbeddedEncoder",
    "ICGANGenerator",
    "InstanceConditionedGenerator",
    "PublicModels",
    "ResNet50Encoder",
    "SwAVEncoder",
    "check_public_config",
    "check_diffusion_config",
    "clip_to_unit_ball",
    "decoded_class_accuracy",
    "knn_indices",
    "load_diffusion_model",
    "load_public_models",
]

log = logging.getLogger(__name__)


class Encoder(Protocol):
    feature_dim: int

    def encode(self, images: np.ndarray, *, batch_size: int = ..., device: Any = ...) -> np.ndarray: ...


class Decoder(Protocol):
    feature_dim: int

    def decode(self, features: np.ndarray, *, generator: torch.Generator | None = ..., **kwargs: Any) -> np.ndarray: ...


@dataclass
class PublicModels:
    """An encoder h (images -> unit-ball features) and a generator g (features -> images) that belong together.

    Attributes:
        encoder: has ``encode(images) -> (N, feature_dim)`` and ``feature_dim``.
        generator: has ``decode(features, *, generator) -> images in [0, 1]``.
        feature_dim: d.
        record: provenance: the config, cache keys / checkpoint files and their hashes, measured quality.
    """

    encoder: Encoder
    generator: Decoder
    feature_dim: int
    record: dict[str, Any] = field(default_factory=dict)

    def encode(self, images: np.ndarray, *, batch_size: int | None = None, device: Any = None) -> np.ndarray:
        """Features of ``images`` (N, C, H, W) in [0, 1], in batches, without gradients: float32 (N, d), norms <= 1.

        ``batch_size`` None uses the encoder's own default (large for the embedded net, small for ResNet-50).
        """
        kwargs = {} if batch_size is None else {"batch_size": batch_size}
        return self.encoder.encode(images, device=device, **kwargs)

    def decode(
        self,
        features: np.ndarray,
        *,
        generator: torch.Generator | None = None,
        batch_size: int | None = None,
        device: Any = None,
    ) -> np.ndarray:
        """One image in [0, 1] per feature row (rows are projected onto the unit sphere first); the noise z comes
        from ``generator`` (None: torch's global RNG)."""
        kwargs = {} if batch_size is None else {"batch_size": batch_size}
        return self.generator.decode(features, generator=generator, device=device, **kwargs)


# ----------------------------------------------------------------------------------------------------------------
# Config checks (one line naming the key and the allowed values, before any work)

_EMBEDDED_KEYS = {
    "": {"name", "kind", "dataset", "seed", "n_public", "encoder", "generator", "quality"},
    "encoder": {"name", "feature_dim", "width", "epochs", "batch_size", "lr", "val_fraction", "limit_train_batches"},
    "generator": {"name", "z_dim", "ngf", "ndf", "k", "knn_backend", "steps", "batch_size", "lr_g", "lr_d", "beta1",
                  "ema_decay"},
    "quality": {"n", "evalnet"},
}
_REAL_KEYS = {
    "": {"name", "kind", "encoder", "generator"},
    "encoder": {"name", "checkpoint", "resolution"},
    "generator": {"name", "checkpoint", "truncation", "trust_pickle"},
}
_OPTIONAL_SECTIONS = {"diffusion"}  # PE's diffusion model: dpsyn.public.diffusion.check_diffusion_config validates it
_ENCODERS = {"embedded": ("conv",), "real": ("swav", "resnet50")}
_GENERATORS = {"embedded": ("icgan",), "real": ("icgan",)}


def check_public_config(cfg: dict[str, Any]) -> None:
    """Validate a ``conf/public`` node (as a plain dict).

    Raises:
        ValueError: naming the offending key (``public.encoder.name``) and the allowed values.
    """
    kind = cfg.get("kind")
    if kind not in ("embedded", "real"):
        raise ValueError(f"public.kind={kind!r}; allowed: embedded, real")
    schema = _EMBEDDED_KEYS if kind == "embedded" else _REAL_KEYS
    for section, allowed in schema.items():
        node = cfg if not section else cfg.get(section)
        if not section:
            allowed = allowed | _OPTIONAL_SECTIONS
        prefix = "public." + (f"{section}." if section else "")
        listed = ", ".join(sorted(allowed))
        if not isinstance(node, dict):
            raise ValueError(f"public.{section} is missing or not a mapping; allowed keys: {listed}")
        unknown = sorted(set(node) - allowed)
        if unknown:
            raise ValueError(f"unknown key {prefix}{unknown[0]} for public.kind={kind}; allowed: {listed}")
        missing = sorted(allowed - set(node) - {"knn_backend", "limit_train_batches", "truncation", "trust_pickle"}
                         - _OPTIONAL_SECTIONS)
        if missing:
            raise ValueError(f"public config lacks {prefix}{missing[0]}")
    for section, options in (("encoder", _ENCODERS[kind]), ("generator", _GENERATORS[kind])):
        name = cfg[section]["name"]
        if name not in options:
            raise ValueError(f"public.{section}.name={name!r} for public.kind={kind}; allowed: {', '.join(options)}")
    if kind == "embedded":
        for key in ("feature_dim", "epochs", "batch_size", "width"):
            _positive_int(cfg["encoder"][key], f"public.encoder.{key}")
        for key in ("z_dim", "ngf", "ndf", "k", "steps", "batch_size"):
            _positive_int(cfg["generator"][key], f"public.generator.{key}")
        if cfg.get("n_public") is not None:
            _positive_int(cfg["n_public"], "public.n_public")
        backend = cfg["generator"].get("knn_backend", "auto")
        if backend not in ("auto", "faiss", "torch"):
            raise ValueError(f"public.generator.knn_backend={backend!r}; allowed: auto, faiss, torch")
        if not isinstance(cfg["quality"]["n"], int) or cfg["quality"]["n"] < 0:
            raise ValueError(f"public.quality.n={cfg['quality']['n']!r} must be a non-negative integer (0 skips)")
    if "diffusion" in cfg:
        check_diffusion_config(cfg)


# ----------------------------------------------------------------------------------------------------------------
# Loading


def load_public_models(
    public_cfg: Any, *, cache_dir: str | Path, data_dir: str | Path, progress: bool = True
) -> PublicModels:
    """Load (from the cache), train (embedded) or build (real adapters) the public models ``public_cfg`` describes.

    Args:
        public_cfg: a ``conf/public/<name>.yaml`` node (DictConfig or dict).
        cache_dir: ``${paths.cache_dir}``; embedded models are cached under ``<cache_dir>/public``.
        data_dir: ``${paths.data_dir}``: where the public dataset is looked for, and what relative checkpoint
            paths of real models are resolved against.
        progress: show progress bars while training.

    Returns:
        The encoder, the generator, d, and their provenance record.

    Raises:
        ValueError: for an invalid config (before any work).
        FileNotFoundError: for missing data or checkpoint files (the message says what to get and where).
        ImportError: for a real IC-GAN without ic_gan's code importable.
    """
    cfg = _as_dict(public_cfg)
    check_public_config(cfg)
    if cfg["kind"] == "real":
        return _build_real(cfg, data_dir=Path(data_dir))
    return _load_embedded(cfg, cache_dir=Path(cache_dir), data_dir=Path(data_dir), progress=progress)


def _load_embedded(cfg: dict[str, Any], *, cache_dir: Path, data_dir: Path, progress: bool) -> PublicModels:
    seed = int(cfg["seed"])
    enc_cfg, gen_cfg = cfg["encoder"], cfg["generator"]
    folder = cache_dir / "public"
    public, data, provenance = _public_data(cfg, data_dir)
    c, res = public.x.shape[1], public.x.shape[2]

    # encoder
    enc_key = _key(f"{cfg['name']}-encoder",
                   {"arch": ENCODER_ARCH_VERSION, "settings": enc_cfg, "seed": seed, "data": provenance})
    with torch.random.fork_rng():  # initial weights follow `seed`, not the caller's RNG state
        torch.manual_seed(seed)
        encoder = EmbeddedEncoder(feature_dim=int(enc_cfg["feature_dim"]), width=int(enc_cfg["width"]),
                                  channels=c, resolution=res)
    enc_w, enc_m = folder / f"{enc_key}.safetensors", folder / f"{enc_key}.json"
    enc_record = _load_cached(encoder, enc_w, enc_m)
    if enc_record is not None:
        log.info("public encoder %s loaded from %s", enc_key, enc_w)
    else:
        log.info("training the public encoder %s on %s (%d images)", enc_key, cfg["dataset"], len(public))
        t0 = time.perf_counter()
        num_classes = len(data.public_classes or data.classes)
        with torch.random.fork_rng():
            torch.manual_seed(seed)
            model = EncoderClassifier(encoder, num_classes)
        perm = np.random.default_rng(seed).permutation(len(public))
        n_val = max(1, int(len(public) * float(enc_cfg["val_fraction"])))
        val, tr = perm[:n_val], perm[n_val:]
        fit = train_classifier(
            model, (public.x[tr], public.y[tr]), (public.x[val], public.y[val]),
            epochs=int(enc_cfg["epochs"]), batch_size=int(enc_cfg["batch_size"]), lr=float(enc_cfg["lr"]),
            seed=seed, limit_train_batches=enc_cfg.get("limit_train_batches"), progress=progress,
        )
        test_acc = float((predict(model, data.eval.x).argmax(1) == data.eval.y).mean())
        enc_record = {
            "key": enc_key, "arch_version": ENCODER_ARCH_VERSION, "settings": enc_cfg, "seed": seed,
            "data": provenance, "feature_dim": encoder.feature_dim, "head": "cosine classifier on public labels",
            "val_acc": fit["val_acc"], "best_epoch": fit["best_epoch"], "test_acc": test_acc,
            "train_seconds": round(time.perf_counter() - t0, 2),
        }
        encoder.eval()
        _save(encoder, enc_w, enc_m, enc_record)
        log.info("public encoder %s: test accuracy %.4f (cached at %s)", enc_key, test_acc, enc_w)

    # generator
    # both k-NN backends are exact, so the backend does not change the weights' key
    gen_settings = {k: v for k, v in gen_cfg.items() if k != "knn_backend"}
    gen_key = _key(f"{cfg['name']}-icgan", {"arch": GENERATOR_ARCH_VERSION, "settings": gen_settings, "seed": seed,
                                             "encoder": enc_key, "data": provenance})
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        generator = InstanceConditionedGenerator(z_dim=int(gen_cfg["z_dim"]), feature_dim=encoder.feature_dim,
                                                 ngf=int(gen_cfg["ngf"]), channels=c, resolution=res)
    gen_w, gen_m = folder / f"{gen_key}.safetensors", folder / f"{gen_key}.json"
    gen_record = _load_cached(generator, gen_w, gen_m)
    if gen_record is not None:
        log.info("public generator %s loaded from %s", gen_key, gen_w)
    else:
        log.info("training the public IC-GAN %s (%d steps)", gen_key, int(gen_cfg["steps"]))
        feats = encoder.encode(public.x)
        with torch.random.fork_rng():
            trained, fit_record = train_icgan(public.x, feats, settings=gen_cfg, seed=seed, labels=public.y,
                                              progress=progress)
        generator.load_state_dict(trained.state_dict())
        generator.eval()
        gen_record = {
            "key": gen_key, "arch_version": GENERATOR_ARCH_VERSION, "settings": gen_cfg, "seed": seed,
            "encoder": enc_key, "data": provenance, **fit_record,
        }
        if int(cfg["quality"]["n"]) > 0:
            gen_record["quality"] = _measure_quality(encoder, generator, data, cfg, cache_dir=cache_dir,
                                                     data_dir=data_dir, progress=progress)
        _save(generator, gen_w, gen_m, gen_record)
        log.info("public IC-GAN %s cached at %s", gen_key, gen_w)

    record = {
        "kind": "embedded",
        "config": cfg,
        "cache": {"encoder": str(enc_w), "generator": str(gen_w)},
        "encoder": enc_record,
        "generator": gen_record,
    }
    return PublicModels(encoder=encoder, generator=generator, feature_dim=encoder.feature_dim, record=record)


def decoded_class_accuracy(
    models: PublicModels | tuple[Encoder, Decoder],
    images: np.ndarray,
    labels: np.ndarray,
    classifier: torch.nn.Module,
    *,
    seed: int = 0,
) -> dict[str, float]:
    """How often the decoded image of h(x) is classified as x's class, by an independent ``classifier``.

    Returns:
        ``{"decoded_class_acc": ..., "real_class_acc": ...}``: the classifier's accuracy on ``g(z, h(x))`` and, for
        reference, on ``x`` itself.
    """
    encoder, generator = (models.encoder, models.generator) if isinstance(models, PublicModels) else models
    feats = encoder.encode(images)
    decoded = generator.decode(feats, generator=torch.Generator().manual_seed(seed))
    return {
        "decoded_class_acc": float((predict(classifier, decoded).argmax(1) == labels).mean()),
        "real_class_acc": float((predict(classifier, images).argmax(1) == labels).mean()),
    }


def _measure_quality(
    encoder: EmbeddedEncoder,
    generator: InstanceConditionedGenerator,
    data: Any,
    cfg: dict[str, Any],
    *,
    cache_dir: Path,
    data_dir: Path,
    progress: bool,
) -> dict[str, Any]:
    """Decoded-class accuracy on ``quality.n`` test-split images, judged by the family's evaluation network."""
    from dpsyn.data import load_dataset
    from dpsyn.metrics.evalnet import load_or_train_evalnet
    from dpsyn.config import load_group as _load_group

    n = min(int(cfg["quality"]["n"]), len(data.eval))
    rows = np.sort(np.random.default_rng(int(cfg["seed"])).choice(len(data.eval), size=n, replace=False))
    family = load_dataset(_load_group("dataset", data.family), seed=0, data_dir=data_dir)
    net, net_record = load_or_train_evalnet(family, settings=dict(cfg["quality"]["evalnet"]), cache_dir=cache_dir)
    scores = decoded_class_accuracy((encoder, generator), data.eval.x[rows], data.eval.y[rows], net,
                                    seed=int(cfg["seed"]))
    return {"n": n, "split": "eval", "classifier": f"evalnet {net_record['key']}",
            "classifier_test_acc": net_record.get("test_acc"), **scores}


def _build_real(cfg: dict[str, Any], *, data_dir: Path) -> PublicModels:
    enc_cfg, gen_cfg = cfg["encoder"], cfg["generator"]
    enc_path = _resolve(enc_cfg["checkpoint"], data_dir)
    enc_cls = SwAVEncoder if enc_cfg["name"] == "swav" else ResNet50Encoder
    encoder = enc_cls(enc_path, resolution=enc_cfg.get("resolution", 224))
    gen_path = _resolve(gen_cfg["checkpoint"], data_dir)
    generator = ICGANGenerator(gen_path, truncation=gen_cfg.get("truncation"),
                               trust_pickle=bool(gen_cfg.get("trust_pickle", False)))
    if generator.feature_dim != encoder.feature_dim:
        raise ValueError(
            f"public.generator expects {generator.feature_dim}-d features but public.encoder "
            f"({enc_cfg['name']}) gives {encoder.feature_dim}-d ones"
        )
    record = {
        "kind": "real",
        "config": cfg,
        "encoder": {"name": enc_cfg["name"], "checkpoint": str(enc_path), "sha256": _sha256(enc_path)},
        "generator": {**generator.record, "sha256": _sha256(Path(generator.record["checkpoint"]))},
    }
    return PublicModels(encoder=encoder, generator=generator, feature_dim=encoder.feature_dim, record=record)


# last: dpsyn.public.diffusion uses the cache helpers above (its heavy imports, diffusers, are lazy)
from dpsyn.public.diffusion import check_diffusion_config, load_diffusion_model  # noqa: E402
