"""Dataclass schemas of every config group, with the ranges of their fields and their cross-field rules.

Each ``conf/<group>/*.yaml`` extends its schema through its defaults list (``/schema/<group>/<name>@_here_``), so
Hydra checks types and unknown keys at compose time, and :func:`dpsyn.config.validate` checks the ranges declared
here (field metadata: ``ge``, ``gt``, ``le``, ``lt``, ``choices``, ``items`` for list elements, ``nonempty``) and
each schema's ``check`` (cross-field rules).

The defaults are stated here, once: a yaml sets only what differs from its schema (a dataset's name and shape, a
trainer's accelerator), so a method's yaml is its description and its defaults list. Each field's ``help`` (metadata)
says what it does and, where a paper's setting differs from the embedded default, what the paper used; docs/config.md
is generated from them (``make docs``). This module imports neither torch nor a method module: the preflight
runs on it alone.

Facts about a method are its class's (:class:`dpsyn.methods.base.Method`); what the preflight needs of them before
importing a method (dataset kinds, whether it needs public data) is :mod:`dpsyn.config.catalog`, generated.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

# Hydra/OmegaConf read the annotations at runtime: ``Optional[int]``, ``List[int]`` (not ``int | None``) keep them
# readable on every Python version OmegaConf supports.


def f(default: Any = None, **rules: Any) -> Any:
    """A field with its ``default``, its range ``rules`` and its ``help`` (``help="..."``: the one-line description
    docs/config.md shows; see the module docstring)."""
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: type(default)(default), metadata=rules)
    return field(default=default, metadata=rules)


POSITIVE = {"ge": 1}        # an integer >= 1
NON_NEGATIVE = {"ge": 0}    # an integer (or number) >= 0
GT0 = {"gt": 0}             # a number > 0
FRACTION = {"gt": 0, "le": 1}   # in (0, 1]
ADAM_BETA = {"ge": 0, "lt": 1}  # in [0, 1)
WIDTHS = {"nonempty": True, "items": {"ge": 1}}  # a non-empty list of layer widths >= 1

# choices the code and the schemas share: stated here, imported by the code that branches on them
NN_INDEXES = ("auto", "flat", "ivf", "hnsw")
TEACHER_ARCHS = ("auto", "gpate", "conv", "dcgan", "mlp")
CLASS_COUNTS = ("dp", "public")
MOMENTS = ("m1", "m1_and_m2")
OTHER_CLASSES = ("nearest", "exclude")
PE_EMBEDDINGS = ("encoder", "inception")
PE_CLASS_PROPORTIONS = ("uniform", "public", "dp")
PE_BACKENDS = ("icgan", "diffusion")
PE_CONDITIONS = ("random_class", "none")
KNN_BACKENDS = ("auto", "faiss", "torch")
PE_SELECTIONS = ("sample", "rank")
CALIBRATIONS = ("classic", "analytic")
PATE_BOUNDS = ("data_independent", "data_dependent", "renyi_filter")
GAN_LOSSES = ("bce", "hinge")
LR_SCHEDULES = ("constant", "cosine")
DP_GAN_ARCHS = ("dcgan", "dib")
PROTOCOLS = ("dpsyn", "dpimagebench")
DIB_CLASSIFIERS = ("resnet_110", "wrn_40_4", "resnext_29")
DIB_SELECTIONS = ("real_val", "noisy_max")


class ConfigError(ValueError):
    """A configuration mistake; ``str(err)`` is the one line the user sees (``<key>=<value>: <what is allowed>``)."""


PATE_NOISE_KEYS = ("sigma_threshold", "sigma", "threshold")


def resolve_pate_noise(cfg: Any) -> dict[str, float]:
    """The Confident-GNMax noise of a PATE method in votes: ``sigma_threshold`` (sigma1), ``sigma`` (sigma2) and
    ``threshold`` (T), each the absolute key when set, else its ``*_ratio`` times ``teachers``.

    Raises:
        ConfigError: a quantity with neither key set.
    """
    out: dict[str, float] = {}
    for key in PATE_NOISE_KEYS:
        absolute, ratio = cfg.get(key), cfg.get(f"{key}_ratio")
        if absolute is not None:
            out[key] = float(absolute)
        elif ratio is not None:
            out[key] = float(ratio) * int(cfg.get("teachers"))
        else:
            raise ConfigError(f"method.{key}=null: set method.{key} (votes) or method.{key}_ratio (of the teachers)")
    return out


class SchemaError(ValueError):
    """A cross-field rule broken: ``key`` (relative to the schema's node), its value and what is allowed."""

    def __init__(self, key: str, value: Any, allowed: str) -> None:
        super().__init__(f"{key}={value}: {allowed}")
        self.key, self.value, self.allowed = key, value, allowed


# ---- method ----------------------------------------------------------------------------------------------------


@dataclass
class MethodSchema:
    """Fields every method has; ``check`` holds a schema's cross-field rules (raise :class:`SchemaError`)."""

    name: str = "???"

    def check(self, node: Any, root: Any = None) -> None:  # noqa: B027  (no rule by default)
        """Cross-field rules on the composed ``node`` (DictConfig; ``root``: the whole config, when there is one);
        raise :class:`SchemaError`."""


@dataclass
class RealSchema(MethodSchema):
    name: str = "real"


@dataclass
class ICGANNonPrivateSchema(MethodSchema):
    name: str = "icgan_nonprivate"


@dataclass
class PublicUniformSchema(MethodSchema):
    name: str = "public_uniform"
    public_pool: Optional[int] = f(
        None, **POSITIVE,
        help="public rows (seeded subsample) to draw from; null = the whole public split")
    other_classes: str = f(
        "nearest", choices=OTHER_CLASSES,
        help="drawn public rows of non-private classes: nearest (public centroid's label) | exclude")


@dataclass
class DPGANSchema(MethodSchema):
    name: str = "dp_gan"
    epochs: int = f(
        1, **POSITIVE,
        help="passes over the private data (the trainer's max_epochs overrides, e.g. trainer=debug)")
    batch_size: int = f(128, **POSITIVE, help="expected Poisson batch size; sample rate = batch_size / n_private")
    max_grad_norm: float = f(1.0, **GT0, help="per-sample clipping bound C of the discriminator's gradient")
    lr_g: float = f(2.0e-4, **GT0)
    lr_d: float = f(2.0e-4, **GT0)
    beta1: float = f(0.5, **ADAM_BETA)
    z_dim: int = f(
        64, **POSITIVE, help="latent size; arch=dib: a multiple of 3 at 28x28, of 4 at 32x32 (DPImageBench: 60)")
    arch: str = f(
        "dcgan", choices=DP_GAN_ARCHS,
        help="image networks: dcgan (dpsyn.nets.dcgan) | dib (dpsyn.nets.dib: DPImageBench's ResNet G with attention "
             "and spectral norm, ResNet D with GroupNorm; about 6.65M and 1.18M parameters); tables keep their MLPs")
    ngf: Optional[int] = f(None, **POSITIVE, help="generator width (null: the arch's, dcgan 32, dib 384)")
    ndf: Optional[int] = f(None, **POSITIVE, help="discriminator width (null: the arch's, dcgan 32, dib 160)")
    d_cond: str = f(
        "concat", choices=("concat", "projection", "both"),
        help="arch=dcgan: how D reads the label: concat (one-hot label maps as input channels) | projection "
             "(Miyato & Koyama 2018: logit = linear(h) + <embed(y), h>) | both; the fused engine computes each")
    grad_sample_mode: str = f(
        "fused", choices=("fused", "hooks", "functorch"),
        help="per-sample gradients: fused (dpsyn.lit.fused_grad_sample: the paired step of the DCGAN discriminator in"
             " one pass; elsewhere Opacus's hooks) | hooks | functorch (Opacus); the same gradients, at different "
             "costs (make bench prints each mode's)")
    dpsgd_step: str = f(
        "paired", choices=("paired", "split"),
        help="paired: real/fake rows clipped together (Opacus's DCGAN example); split: real rows clipped + noised, "
             "split_fake_rows fake rows clipped per row and added (docs/speed.md)")
    split_fake_rows: Optional[int] = f(
        None, ge=2,
        help="split only: the fixed number of fake rows per step (null: batch_size)")
    d_steps: int = f(
        1, **POSITIVE,
        help="discriminator steps per generator step (DPImageBench's d_updates: 5); every one is a DP release the "
             "ledger charges, the generator steps after each d_steps-th")
    loss: str = f(
        "bce", choices=GAN_LOSSES,
        help="bce (non-saturating) | hinge (DPImageBench's): each row's gradient; the clipping, noise and ledger are "
             "the same (dpsyn.lit.gan_loss)")
    ema: float = f(
        0.0, ge=0, lt=1,
        help="> 0: the samples come from an EMA of G's weights with this max decay, warm-up (1+t)/(10+t) over G steps"
             " t (DPImageBench: 0.999); post-processing, 0 = G")
    checkpoint_every: int = f(
        100, **NON_NEGATIVE,
        help="discriminator steps between checkpoints (run_dir/checkpoints/last.ckpt); 0 = none")
    table_g_hidden: List[int] = f(
        [64, 64], **WIDTHS,
        help="tables only (dataset kind \"table\"; G-PATE's Kaggle Credit protocol, paper 002 Sec. 5): conditional MLP "
             "generator's hidden widths (z + one-hot label -> rows in [0, 1])")
    table_d_hidden: List[int] = f([64, 64], **WIDTHS, help="conditional MLP discriminator's hidden widths")
    class_ratio_epsilon: float = f(
        0.01, **GT0,
        help="Laplace release of the class proportions first; DP-SGD is calibrated for eps - this")


@dataclass
class DPGANMISchema(MethodSchema):
    name: str = "dp_gan_mi"
    epochs: int = f(
        20, **POSITIVE,
        help="passes over the private features in the DP stage (the trainer's max_epochs overrides)")
    batch_size: int = f(128, **POSITIVE, help="expected Poisson batch size; sample rate = batch_size / n_private")
    max_grad_norm: float = f(1.0, **GT0, help="per-sample clipping bound C of the discriminator's gradient")
    lr_g: float = f(2.0e-4, **GT0, help="Adam learning rate of the feature generator (both stages)")
    lr_d: float = f(2.0e-4, **GT0, help="Adam learning rate of the feature discriminator (both stages)")
    beta1: float = f(0.5, **ADAM_BETA, help="Adam beta1 (beta2 = 0.999)")
    z_dim: int = f(32, **POSITIVE, help="latent size of the feature generator")
    hidden: int = f(
        128, **POSITIVE,
        help="width of the hidden layers of both MLPs (256: ~7x slower per DP-SGD step on CPU)")
    layers: int = f(4, ge=2, help="linear layers per MLP (paper 000: 4)")
    grad_sample_mode: str = f(
        "hooks", choices=("hooks", "functorch"),
        help="Opacus per-sample gradients: hooks | functorch (make bench prints each mode's cost)")
    dpsgd_step: str = f(
        "paired", choices=("paired", "split"),
        help="paired: real/fake rows clipped together (Opacus's DCGAN example); split: real rows clipped + noised, "
             "split_fake_rows fake rows clipped per row and added (docs/speed.md)")
    split_fake_rows: Optional[int] = f(
        None, ge=2,
        help="split only: the fixed number of fake rows per step (null: batch_size)")
    checkpoint_every: int = f(
        100, **NON_NEGATIVE,
        help="steps between checkpoints (run_dir/checkpoints/: last.ckpt DP stage, pretrain.ckpt); 0 = none")


@dataclass
class DPGANFTSchema(DPGANMISchema):
    name: str = "dp_gan_ft"
    pretrain_steps: int = f(
        2000, **NON_NEGATIVE,
        help="non-private discriminator/generator steps on public features (0 = no pretraining)")
    pretrain_batch_size: int = f(128, **POSITIVE, help="batch size of the public pretraining")
    max_public: Optional[int] = f(
        None, **POSITIVE,
        help="null = all public images; an integer pretrains on a seeded subsample (tests)")


@dataclass
class DPDRESchema(MethodSchema):
    name: str = "dp_dre"
    hidden: int = f(
        64, **POSITIVE,
        help="hidden width of the MLP (the paper: \"a simple MLP with a small hidden layer size\")")
    epochs: int = f(
        20, **POSITIVE,
        help="passes over the private data (expected); the trainer's max_epochs overrides (trainer=debug)")
    batch_size: int = f(
        256, **POSITIVE,
        help="expected Poisson batch of private rows; sample rate q = batch_size / n_private")
    public_batch_size: Optional[int] = f(
        None, **POSITIVE,
        help="public rows appended to each clipped batch (null = batch_size: both loss terms balanced)")
    lr: float = f(1.0e-3, **GT0, help="Adam learning rate")
    max_grad_norm: float = f(1.0, **GT0, help="per-row gradient clipping bound C of DP-SGD")
    ratio_power: float = f(
        1.0, **GT0,
        help="sampling weights ∝ r^ratio_power (1 = the paper; > 1 sharpens, < 1 flattens)")
    public_pool: Optional[int] = f(
        None, **POSITIVE,
        help="public rows (seeded subsample) to train D on and draw from; null = the whole public split")
    other_classes: str = f(
        "nearest", choices=OTHER_CLASSES,
        help="drawn public rows of non-private classes: nearest (public centroid's label) | exclude")


@dataclass
class DPMGESchema(MethodSchema):
    name: str = "dp_mge"
    calibration: str = f(
        "classic", choices=CALIBRATIONS,
        help="classic = paper 000's sigma formula for each release's share, basic composition (ledger: approx-DP "
             "events) analytic = one Balle-Wang calibration for the whole budget, shares composed exactly (ledger: "
             "Gaussian events)")
    mean_share: float = f(
        0.5, gt=0, lt=1,
        help="the mean's share of the budget (after the counts); the second moment gets the rest (paper: 1/2)")
    conditional: bool = f(
        False,
        help="true = one Gaussian per private class (disjoint sums: parallel composition); false = the paper's")
    class_counts: str = f(
        "dp", choices=CLASS_COUNTS,
        help="per-class counts (conditional only): dp = a Gaussian release | public = declared known")
    count_share: float = f(
        0.05, ge=0, lt=1,
        help="share of (eps, delta) spent on the per-class counts when conditional and class_counts=dp")


@dataclass
class BudgetSplitSchema:
    m1: float = f(0.45, ge=0, le=1)
    m2: float = f(0.45, ge=0, le=1, help="0 when moments=m1")
    counts: float = f(0.1, ge=0, le=1, help="0 when class_counts=public")


@dataclass
class DPMEPFSchema(MethodSchema):
    name: str = "dp_mepf"
    feature_layers: Any = f(
        "auto",
        help="encoder layers whose activations join h(x) in phi: auto (the embedded encoder's 2 pooled conv blocks) |"
             " null | [names] (auto | null | a list of encoder layer names (checked against the encoder))")
    layer_pool: Optional[int] = f(
        None, **POSITIVE,
        help="average-pool each 4-D activation to this side first (null = full maps; e.g. 4 for ResNet-50)")
    moments: str = f(
        "m1_and_m2", choices=MOMENTS,
        help="m1 (mean embedding) | m1_and_m2 (+ element-wise second moment)")
    class_conditional: bool = f(
        True,
        help="per-class embeddings, class-conditional generator (false: one embedding, unlabelled samples)")
    class_counts: str = f(
        "dp", choices=CLASS_COUNTS,
        help="dp (counts released with the Gaussian mechanism) | public (taken as known, not noised)")
    budget_split: BudgetSplitSchema = field(
        default_factory=BudgetSplitSchema,
        metadata={"help": "fractions of (eps, delta) per release; those of the releases made must sum to 1"})
    calibration: str = f(
        "classic", choices=CALIBRATIONS,
        help="Gaussian noise per release: classic (paper 000's formula) | analytic (Balle & Wang 2018)")
    steps: int = f(
        1000, **NON_NEGATIVE,
        help="generator Adam steps on the released embeddings (post-processing; eps=1: at the noise floor)")
    batch_size: int = f(120, **POSITIVE, help="generated images per step, balanced over the classes")
    lr: float = f(1.0e-3, **GT0, help="Adam learning rate of the generator")
    beta1: float = f(0.5, **ADAM_BETA, help="Adam beta1 (beta2 = 0.999)")
    z_dim: int = f(64, **POSITIVE, help="latent size of the generator")
    ngf: int = f(32, **POSITIVE, help="width of the DCGAN generator (dpsyn.nets.dcgan)")
    pretrain_steps: int = f(
        0, **NON_NEGATIVE,
        help="optional steps matching the PUBLIC split's (unconditional) embedding first (no privacy cost)")
    max_public: Optional[int] = f(
        10000, **POSITIVE,
        help="public images embedded for that pretraining (seeded subsample; null = all)")

    def check(self, node: Any, root: Any = None) -> None:
        if root is not None and math.isinf(float(root.get("eps", 1.0))):
            return  # a non-private run makes no release: the split is not used
        split = node.budget_split
        made = {"m1": True, "m2": node.moments == "m1_and_m2", "counts": node.class_counts == "dp"}
        for key, is_made in made.items():
            if is_made and not split[key] > 0:
                raise SchemaError(f"budget_split.{key}", split[key], "every release made needs a fraction > 0")
            if not is_made and split[key] != 0:
                raise SchemaError(f"budget_split.{key}", split[key], "must be 0: that release is not made "
                                  "(moments=m1 or class_counts=public)")
        total = sum(float(split[k]) for k, is_made in made.items() if is_made)
        if abs(total - 1.0) > 1e-9:
            raise SchemaError("budget_split", dict(split), f"the fractions of the releases made must sum to 1, "
                              f"got {total:g}")


@dataclass
class PATENoiseSchema(MethodSchema):
    """Confident-GNMax noise of the PATE methods, each quantity given in votes (absolute) or as a ratio to the
    number of teachers N (``*_ratio``); an absolute value, when set, wins (resolved by
    :func:`resolve_pate_noise`)."""

    teachers: int = f(1000, **POSITIVE)
    sigma_threshold: Optional[float] = f(
        None, **GT0,
        help="sigma1 in votes (null = sigma_threshold_ratio x teachers)")
    sigma: Optional[float] = f(None, **GT0, help="sigma2 in votes (null = sigma_ratio x teachers)")
    threshold: Optional[float] = f(None, ge=0, help="T in votes (null = threshold_ratio x teachers)")
    sigma_threshold_ratio: Optional[float] = f(None, **GT0)
    sigma_ratio: Optional[float] = f(None, **GT0)
    threshold_ratio: Optional[float] = f(None, ge=0, le=1)

    def check(self, node: Any, root: Any = None) -> None:
        for key in ("sigma_threshold", "sigma", "threshold"):
            if node[key] is None and node[f"{key}_ratio"] is None:
                raise SchemaError(key, None, f"set {key} (votes) or {key}_ratio (a fraction of the teachers)")
        # T is not bounded by the teachers: the paper's teacher ablation (conf/experiment/long2021_ablation*.yaml)
        # holds T = 1000 votes fixed down to 500 teachers (the ratio, threshold_ratio, lies in [0, 1])
        noise = resolve_pate_noise(node)
        if not math.isfinite(noise["threshold"]):
            raise SchemaError("threshold", noise["threshold"], "must be a finite vote count")


@dataclass
class GPATESchema(PATENoiseSchema):
    name: str = "g_pate"
    teachers: int = f(
        4000, **POSITIVE,
        help="N teacher discriminators on N disjoint partitions (paper: 4000; 15 rows each on 60k)")
    projection_dim: int = f(10, **POSITIVE, help="k, random projection dimensions per sample (paper: 10)")
    projection: str = f(
        "gaussian", choices=("gaussian", "dct"),
        help="gaussian (paper: entries N(0, 1/k) over all pixels) | dct (Gaussian directions inside the span of the "
             "lowest projection_frequencies^2 2-D DCT frequencies per channel: data-independent)")
    projection_frequencies: int = f(7, **POSITIVE, help="m of projection=dct (m x m frequencies per channel)")
    output_frequencies: Optional[int] = f(
        None, **POSITIVE,
        help="images: G's output kept to its m x m lowest 2-D DCT frequencies per channel (a fixed, data-independent "
             "low-pass layer after G, in training and sampling); null = none (the paper; fmnist private runs: 7, "
             "chosen on validation, conf/method_dataset/g_pate_fmnist.yaml)")
    clip: float = f(
        1.0e-4, **GT0,
        help="c, projected gradients clipped to [-c, c] (gradient of the batch-mean loss; paper: 1e-4)")
    bins: int = f(10, ge=2, help="B, equal bins on [-c, c] (paper: 10)")
    batch_size: int = f(
        64, **POSITIVE,
        help="b, generated samples per round; b*k queries per round (paper: 64, cut to the partition size)")
    batch_from_partition: bool = f(
        True,
        help="b = min(batch_size, partition size) where partitions hold >= 15 rows (the reference code: 15 at 4000 "
             "teachers on 60k), so every teacher steps on its whole partition each round; smaller partitions (digits,"
             " tables) keep batch_size for G and min(batch_size, partition) for teachers")
    teacher_batch: Optional[int] = f(
        None, **POSITIVE,
        help="real rows per teacher per round; null = min(b, partition size) (the reference code)")
    teacher_steps: int = f(1, **POSITIVE, help="teacher Adam steps per generator step (paper: 1)")
    teacher_fakes: int = f(
        1, **POSITIVE,
        help="Diagnostic: fakes per real row in a teacher's step; isolates whether the teachers see too little of G's "
             "distribution: r > 1 shows every teacher r*tb label-matched fakes from fresh latents. Any eps, accounting "
             "unchanged (fakes are G's output; the queries stay the round's b samples'). Not a setting of the "
             "published method (paper and reference code: 1, the round's b fakes); docs/papers/long2021.md, The "
             "ladders")
    steps: int = f(
        200, **POSITIVE,
        help="maximum generator steps (CPU cap, ~15 min on 2 cores; at eps=1 the budget stops first; fmnist eps >= "
             "10: 350; fmnist eps < 10: 400, conf/method_dataset/g_pate_fmnist.yaml)")
    bound: str = f(
        "data_independent", choices=PATE_BOUNDS,
        help="RDP bound for stopping and for the reported eps: data_independent | renyi_filter (GNMax paid only when "
             "answered; a true DP bound; fmnist eps < 10) | data_dependent (paper)")
    inf_aggregate: str = f(
        "mean", choices=("mean", "projected", "vote"),
        help="Diagnostic: the G-PATE ladder's rungs, what an eps=inf run aggregates, isolating the step of DPGradAgg "
             "where learning stops: mean (the teachers' mean gradient, the reference code's non-private aggregation) | "
             "projected (+ the projection: mean of the projected gradients) | vote (+ clip, bins and vote: DPGradAgg's "
             "plain argmax, no noise). Read at eps=inf only (a private run always votes, accounted as usual); not a "
             "setting of the published method. docs/papers/long2021.md, The ladders")
    latent: str = f("uniform", choices=("uniform", "normal"), help="z ~ U(-1, 1) (the reference code) | normal")
    z_dim: int = f(50, **POSITIVE, help="(paper: 50 for MNIST)")
    ngf: int = f(32, **POSITIVE, help="generator width (dpsyn.nets.dcgan.CondDCGANGenerator)")
    teacher_arch: str = f(
        "auto", choices=TEACHER_ARCHS,
        help="auto (gpate on images, mlp on tables) | gpate (the authors' teacher: conv, conv, fc, the label at every"
             " layer; dpsyn.nets.ensemble.CondPATETeacher) | conv (label at the first layer only) | dcgan | mlp")
    ndf: int = f(
        4, **POSITIVE,
        help="teacher width: first conv (the second 2 ndf); the authors' ~0.55M-parameter teacher: ndf 21")
    teacher_hidden: int = f(
        32, **POSITIVE,
        help="gpate teachers' fully connected layer (authors: dfc_dim 256); 4 / 32: 13.6k parameters")
    d_hidden: List[int] = f([32], **WIDTHS, help="teacher hidden widths (mlp)")
    lr_g: float = f(
        1.0e-3, **GT0,
        help="Adam, student generator (paper: 1e-3, beta1 0.5; fmnist eps<inf: 5e-3, method_dataset/)")
    lr_d: float = f(
        1.0e-3, **GT0,
        help="Adam, teachers (paper: 1e-3; fmnist: 3e-3, eps=inf 1e-2, chosen on validation, "
             "method_dataset/g_pate_fmnist.yaml)")
    lr_g_decay_start: Optional[float] = f(
        None, ge=0, lt=1,
        help="the generator's lr falls linearly from lr_g to 0 over the rounds after this share of the round cap "
             "(method.steps), e.g. 0.5: constant for the first half; null = constant (the paper)")
    beta1: float = f(0.5, **ADAM_BETA)
    ema: float = f(
        0.0, ge=0, lt=1,
        help="samples from an EMA of G's weights (max decay; dpsyn.lit.ema, post-processing of the released G, free "
             "of privacy); 0 = G itself (the paper; fmnist eps >= 10: 0.99, method_dataset/)")
    teacher_chunk: Optional[int] = f(
        100, **POSITIVE,
        help="teachers per batched call; null = all (CPU: 50-200 fastest for conv teachers, make bench)")
    checkpoint_every: int = f(
        50, **NON_NEGATIVE,
        help="generator steps between checkpoints (run_dir/checkpoints/g_pate.pt); 0 = none")
    g_hidden: List[int] = f(
        [64, 64], **WIDTHS,
        help="generator hidden widths on tables (dpsyn.nets.mlp_gan.CondMLPGenerator; images: DCGAN)")
    class_ratio_epsilon: float = f(
        0.01, **GT0,
        help="tables: Laplace release of the class proportions first (paper: 0.01 of eps=1, Sec. 5)")
    sigma_threshold_ratio: Optional[float] = f(
        0.75, **GT0,
        help="the noise as fractions of N (2000 teachers: sigma1 1500, sigma2 500, T 1000 votes); an absolute value "
             "in votes (method.sigma_threshold=3000 ...), when set, wins over its ratio sigma1 / N, noise on the "
             "maximum vote count (paper: 3000 = 0.75 N)")
    sigma_ratio: Optional[float] = f(0.25, **GT0, help="sigma2 / N, GNMax noise on each count (paper: 1000 = 0.25 N)")
    threshold_ratio: Optional[float] = f(
        0.5, ge=0, le=1,
        help="T / N, votes the noisy maximum must reach to answer (paper: 2000 = 0.5 N)")


@dataclass
class PATEGANSchema(PATENoiseSchema):
    name: str = "pate_gan"
    teachers: int = f(
        1000, **POSITIVE,
        help="N teacher discriminators on N disjoint partitions (60 rows each on fmnist)")
    batch_size: int = f(
        32, **POSITIVE,
        help="b generated samples per step = b queries per step (eps=1: 195 steps, ~1.6 s each on 1 CPU core)")
    teacher_batch: Optional[int] = f(
        16, **POSITIVE,
        help="real rows per teacher per step (of its 60); null = min(batch_size, partition size)")
    teacher_steps: int = f(1, **POSITIVE, help="teacher Adam steps per generator step")
    student_steps: int = f(
        1, **POSITIVE,
        help="student Adam steps on each step's answered samples (post-processing: free)")
    vote_quantile: Optional[float] = f(
        None, gt=0, lt=1,
        help="Diagnostic: teacher i votes \"real\" above this quantile (in (0, 1)) of its logits on the step's "
             "generated samples instead of above logit 0; isolates whether the all-\"fake\" labels stop the student. "
             "Any eps, accounting unchanged (each teacher's own cut: sensitivity unchanged). Not a setting of the "
             "published method (null = above logit 0, Jordon et al.); neither rule learns classes at eps=inf on the "
             "embedded setting: docs/papers/long2021.md, The ladders")
    inf_signal: str = f(
        "student", choices=("student", "teachers"),
        help="Diagnostic: the PATE-GAN ladder's rungs, what G learns from, isolating whether learning stops at the "
             "student: student (Algorithm 1, the published method) | teachers (G against the teacher ensemble itself, "
             "the student unread: not DP, so eps=inf only, refused at finite eps; not a setting of the published "
             "method). docs/papers/long2021.md, The ladders")
    steps: int = f(
        500, **POSITIVE,
        help="maximum generator steps (CPU cap; at eps=1 the budget stops training first: 195 steps)")
    bound: str = f(
        "data_independent", choices=PATE_BOUNDS,
        help="RDP bound for stopping and the reported eps: data_independent | renyi_filter | data_dependent")
    class_ratio_epsilon: float = f(
        0.01, **GT0,
        help="tables: Laplace release of the class proportions (G-PATE's protocol), out of eps")
    z_dim: int = f(50, **POSITIVE, help="latent dimension (images and tables)")
    ngf: int = f(32, **POSITIVE, help="image generator width (dpsyn.nets.dcgan.CondDCGANGenerator)")
    g_hidden: List[int] = f(
        [64, 64], **WIDTHS,
        help="table generator hidden widths (dpsyn.nets.mlp_gan.CondMLPGenerator; sigmoid output)")
    teacher_arch: str = f(
        "auto", choices=TEACHER_ARCHS,
        help="auto = conv for images, mlp for tables | gpate (G-PATE's teacher: conv, conv, fc, the label at every "
             "layer) | conv | dcgan | mlp (as g_pate; tables: mlp only)")
    ndf: int = f(4, **POSITIVE, help="teacher width (gpate: first conv, the second 2 ndf; conv; dcgan)")
    teacher_hidden: int = f(
        32, **POSITIVE,
        help="gpate teachers' fully connected layer (as g_pate's embedded default)")
    d_hidden: List[int] = f(
        [32], **WIDTHS,
        help="teacher hidden widths (mlp teachers: tables, or images with teacher_arch=mlp)")
    student_ndf: int = f(32, **POSITIVE, help="image student width (dpsyn.nets.dcgan.CondDCGANDiscriminator)")
    s_hidden: List[int] = f(
        [64, 64], **WIDTHS,
        help="table student hidden widths (dpsyn.nets.mlp_gan.CondMLPDiscriminator)")
    lr_g: float = f(2.0e-4, **GT0, help="Adam, generator")
    lr_s: float = f(2.0e-4, **GT0, help="Adam, student")
    lr_d: float = f(1.0e-3, **GT0, help="Adam, teachers (as g_pate)")
    beta1: float = f(0.5, **ADAM_BETA)
    teacher_chunk: Optional[int] = f(100, **POSITIVE, help="teachers per batched call; null = all")
    checkpoint_every: int = f(
        50, **NON_NEGATIVE,
        help="generator steps between checkpoints (run_dir/checkpoints/pate_gan.pt); 0 = none")
    sigma_threshold_ratio: Optional[float] = f(
        0.75, **GT0,
        help="sigma1 / N, noise on the maximum vote count (1000 teachers: 750 votes)")
    sigma_ratio: Optional[float] = f(0.5, **GT0, help="sigma2 / N, GNMax noise on each of the 2 counts (500 votes)")
    threshold_ratio: Optional[float] = f(
        0.5, ge=0, le=1,
        help="T / N, votes the noisy maximum must reach to answer (500 votes)")


@dataclass
class GSWGANSchema(MethodSchema):
    name: str = "gs_wgan"
    critics: int = f(
        100, **POSITIVE,
        help="K critics on K disjoint partitions; sample rate 1/K (authors: 1000; fmnist eps=inf: 10, chosen on "
             "validation, method_dataset/gs_wgan_fmnist.yaml)")
    iterations: int = f(
        1000, **POSITIVE,
        help="generator iterations: one critic trains, one is drawn, one sanitised G step (authors: 20000)")
    batch_size: int = f(
        32, **POSITIVE,
        help="b generated samples = sanitised releases per iteration; critics' real batch too (authors: 32)")
    critic_steps: int = f(5, **POSITIVE, help="critic Adam steps per iteration (authors: critic_iters 5)")
    clip: float = f(
        1.0, **GT0,
        help="C, per-sample L2 clip of the gradient of -D(x_j) w.r.t. x_j (authors: CLIP_BOUND 1)")
    gp_weight: float = f(10.0, **GT0, help="lambda of WGAN-GP's gradient penalty (authors: L_gp 10)")
    drift: float = f(1.0e-3, ge=0, help="weight of mean D(real)^2, the authors' \"epsilon penalty\" (L_epsilon 1e-3)")
    lr_g: float = f(
        0.001, **GT0,
        help="Adam, generator (authors: 1e-4 over 20000 iterations; 1e-3 for the embedded 1000)")
    lr_d: float = f(0.001, **GT0, help="Adam, each critic (authors: 1e-4)")
    beta1: float = f(0.5, **ADAM_BETA, help="Adam beta1 (authors: 0.5)")
    beta2: float = f(0.9, **ADAM_BETA, help="Adam beta2 (authors: 0.9)")
    z_dim: int = f(10, **POSITIVE, help="Gaussian latent (authors: 10, Bernoulli latent by default)")
    ngf: int = f(
        32, **POSITIVE,
        help="generator width (dpsyn.nets.dcgan.CondDCGANGenerator; authors: a ResNet G, model_dim 64)")
    ndf: int = f(16, **POSITIVE, help="critic width (dpsyn.nets.ensemble.CondConvTeacher, no normalisation layer)")
    ema: float = f(
        0.99, ge=0, lt=1,
        help="samples from an EMA of G (authors: 0.999 over 20000 iterations); 0 = G itself")
    clip_at_inf: bool = f(
        True,
        help="eps=inf: still clip the per-sample gradient (no noise); false: the raw gradient")
    bound: str = f(
        "convexity", choices=("convexity", "wang2019", "poisson_argument"),
        help="per-iteration bound on one of K critics drawn uniformly (dpsyn.privacy.uniform_choice): convexity (a "
             "written proof, docs/privacy.md) | wang2019 (Wang, Balle & Kasiviswanathan 2019, cited; looser) | "
             "poisson_argument (Poisson RDP at rate 1/K: assumed, not proven)")
    critic_schedule: str = f(
        "round_robin", choices=("round_robin", "drawn"),
        help="which critic trains at iteration t: round_robin (critic t mod K, a public schedule, so no critic "
             "depends on the secret draws) | drawn (the authors' loop: eps=inf only)")
    fresh_steps: int = f(
        0, **NON_NEGATIVE,
        help="extra Adam steps of a throw-away copy of the critic drawn, on its partition, before its release (not "
             "kept); 0 = the critic as the schedule left it")
    checkpoint_every: int = f(
        100, **NON_NEGATIVE,
        help="iterations between checkpoints (run_dir/checkpoints/gs_wgan.pt); 0 = none")
    warm_start_iterations: int = f(
        50, **NON_NEGATIVE,
        help="non-private pre-training iterations per critic on its own partition, against its own throw-away "
             "generator; not charged (the critics are never released) (authors: 2000)")
    warm_start_chunk: int = f(
        1, **POSITIVE,
        help="critics warmed up together, each step one torch.func.vmap call over them and their throw-away "
             "generators: the same critics as one at a time (tested), only the speed differs; 1 = one at a time (on a"
             " CPU batching gains little, 1.13x at 10: benchmarks/gs_wgan_warm_start.py; for GPUs)")
    output_frequencies: Optional[int] = f(
        None, **POSITIVE,
        help="m: G's output kept to its m x m lowest 2-D DCT frequencies per channel, and the gradient into it "
             "sanitised (clipped, noised) in those m^2 coefficients, so the noise keeps m^2 of its d dimensions; the "
             "same mechanism and accounting (dpsyn.nets.lowpass; fmnist's private runs take 7: "
             "method_dataset/gs_wgan_fmnist.yaml). null = off (the authors)")


@dataclass
class PESchema(MethodSchema):
    name: str = "pe"
    backend: str = f(
        "icgan", choices=PE_BACKENDS,
        help="icgan (paper 000's public IC-GAN: cheap on CPU) | diffusion (public.diffusion: DDIM + SDEdit)")
    embedding: str = f(
        "encoder", choices=PE_EMBEDDINGS,
        help="voting space: encoder (the public encoder h) | inception (InceptionV3, local weights; GPUs)")
    population: int = f(
        2000, **POSITIVE,
        help="N_syn, synthetic samples per iteration (the paper: 50000 on CIFAR-10)")
    degrees: List[float] = f(
        [0.8, 0.6, 0.5, 0.4, 0.3, 0.25], nonempty=True, items=FRACTION,
        help="one variation degree per iteration, in (0, 1], larger = more variation (diffusion: the fraction of the "
             "noise schedule SDEdit starts from); T = len(degrees) DP histograms. The paper: 20 iterations from "
             "strong to weak.")
    noise_multiplier: Optional[float] = f(
        None, **GT0,
        help="sigma of every histogram; null = calibrated from eps for T releases (exactly one of the two)")
    threshold: float = f(
        4.0, ge=0,
        help="H: noisy counts below H become 0 (the paper: 10 with sigma 5*sqrt(2) on CIFAR-10)")
    lookahead: int = f(
        4, **NON_NEGATIVE,
        help="k: vote with the mean embedding of k variations (0 = the sample's own; the paper: 8)")
    num_nearest: int = f(
        1, **POSITIVE,
        help="neighbours each private sample votes for (votes weighted 1/sqrt(num_nearest): sensitivity 1)")
    selection: str = f(
        "sample", choices=PE_SELECTIONS,
        help="sample (i.i.d. draws in proportion to the histogram, the paper) | rank (top rank_keep * N)")
    rank_keep: float = f(0.5, **FRACTION)
    conditional: bool = f(
        False,
        help="true = Alg. 3: class-c private samples vote among class-c synthetic samples only")
    class_proportions: str = f(
        "uniform", choices=PE_CLASS_PROPORTIONS,
        help="conditional: uniform | public (private proportions declared public) | dp (one more release)")
    condition: str = f(
        "random_class", choices=PE_CONDITIONS,
        help="diffusion, unconditional: public condition of new samples: random_class | none")
    feature_noise: float = f(
        0.5, ge=0,
        help="icgan: size of the instance-feature perturbation at degree 1 (its norm is about this). 0.5: at the late"
             " degrees (0.25-0.3) a variation moves a feature by about one nearest-neighbour spacing of the public "
             "features (median 1-NN distance 0.14 on fmnist_public, measured on public data only). Chosen on the "
             "validation split, never the test split: `python train.py -m experiment=tune_pe dataset=fmnist_shoes "
             "eps=1` (900 held-out private rows, seed 0): validation FD 8.23 / 6.23 / 7.50 / 33.3 at 0.25 / 0.5 / 1.0"
             " / 2.0 (earlier it had been picked from test-split FD).")
    final_degree: Optional[float] = f(
        None, **FRACTION,
        help="\"unlimited samples\": degree of the extra variations when more samples than N are asked")
    public_pool: Optional[int] = f(
        None, **POSITIVE,
        help="icgan: public rows (seeded subsample) to start from; null = the whole public split")
    other_classes: str = f(
        "nearest", choices=OTHER_CLASSES,
        help="labels of public rows of non-private classes (see public_uniform): nearest | exclude")
    knn_backend: str = f(
        "auto", choices=KNN_BACKENDS,
        help="histogram search: auto (faiss when importable) | faiss | torch")
    nn_index: str = f(
        "auto", choices=NN_INDEXES,
        help="faiss index of the histogram search: flat (exact) | ivf | hnsw (approximate; built on the synthetic "
             "embeddings only, so sensitivity stays 1) | auto (flat below 20000 synthetic samples and on a GPU, ivf "
             "above on a CPU)")
    monitor: bool = f(
        True,
        help="log each population's FD / precision / recall vs the eval split (never selected on)")
    checkpoint: bool = f(
        True,
        help="<run_dir>/checkpoints/pe.pt after every histogram and iteration; a rerun in it resumes")


@dataclass
class UtilitySchema:
    epochs: int = f(5, **POSITIVE)
    batch_size: int = f(128, **POSITIVE)
    lr: float = f(1.0e-3, **GT0)


@dataclass
class AttackSchema:
    n_members: int = f(500, **POSITIVE)
    non_member_ratio: int = f(
        9, **POSITIVE,
        help="non-members per member: random guess = 1/(1+9) = 0.1, as in privGAN's notebooks")
    monte_carlo: int = f(
        1, ge=0, le=1,
        help="also the Monte-Carlo attack (Hilprecht et al. 2019) on the released samples")
    mc_components: int = f(40, **POSITIVE, help="its PCA dimensions")
    mc_percentile: Optional[float] = f(
        None, gt=0, le=100,
        help="its eps-ball radius: null = median nearest-sample distance; a number = that percentile")
    per_owner_utility: int = f(
        1, ge=0, le=1,
        help="also report acc_owner<k>: a classifier trained on owner k's generator alone")
    utility: UtilitySchema = field(default_factory=UtilitySchema)


@dataclass
class PrivGANSchema(MethodSchema):
    name: str = "privgan"
    owners: List[float] = f(
        [0.5, 0.5], nonempty=True, items=FRACTION,
        help="each owner's fraction of every class's private data (disjoint; sum <= 1)")
    lam: float = f(
        1.0, ge=0,
        help="weight of the central discriminator's term in each generator's loss (privGAN's privacy_ratio)")
    dp_delay: int = f(
        0, **NON_NEGATIVE,
        help="epochs before the central discriminator D_p is updated (microsoft/privGAN: 100 of 500)")
    dp_pretrain: bool = f(
        False,
        help="D_p pretraining on real data: off, as in Rajotte & Ng (real data never leaves its owner)")
    dp_pretrain_epochs: int = f(50, **NON_NEGATIVE, help="used only with dp_pretrain: true (privGAN's disc_epochs)")
    per_class: bool = f(
        True,
        help="one privGAN per class (the paper's per-digit models); false: one class-conditional privGAN")
    arch: str = f("mlp", choices=("mlp", "dcgan"), help="mlp (the paper's MLPs) | dcgan")
    epochs: int = f(20, **POSITIVE, help="the paper: 200 (privGAN) / 250 (GAN) on GPUs")
    batch_size: int = f(256, **POSITIVE)
    lr: float = f(2.0e-4, **GT0)
    beta1: float = f(0.5, **ADAM_BETA)
    label_smoothing: float = f(
        0.95, **FRACTION,
        help="target of real samples for the owners' discriminators (privGAN)")
    z_dim: int = f(100, **POSITIVE)
    g_hidden: List[int] = f(
        [256, 512], **WIDTHS,
        help="the paper's MNIST MLP: 512-512-1024 (generator), 2048-512-256 (discriminator)")
    d_hidden: List[int] = f([512, 256], **WIDTHS)
    attack: AttackSchema = field(
        default_factory=AttackSchema,
        metadata={"help": "membership attacks on the owners' discriminators (white-box) and on the samples (Monte-"
                          "Carlo)"})
    mode: str = f(
        "single", choices=("single", "decentralized"),
        help="single (one process) | decentralized (one process per owner; only D_p's updates cross)")

    def check(self, node: Any, root: Any = None) -> None:
        owners = [float(x) for x in node.owners]
        if sum(owners) > 1 + 1e-9:
            raise SchemaError("owners", owners, "each fraction must lie in (0, 1] and their sum <= 1")


# name -> schema, one per conf/method/*.yaml (gan extends privgan's yaml, so it has privgan's schema)
METHOD_SCHEMAS: Dict[str, type] = {
    "real": RealSchema, "icgan_nonprivate": ICGANNonPrivateSchema, "public_uniform": PublicUniformSchema,
    "dp_gan": DPGANSchema, "dp_gan_ft": DPGANFTSchema, "dp_gan_mi": DPGANMISchema, "dp_dre": DPDRESchema,
    "dp_mge": DPMGESchema, "dp_mepf": DPMEPFSchema, "g_pate": GPATESchema, "pate_gan": PATEGANSchema,
    "gs_wgan": GSWGANSchema, "pe": PESchema, "privgan": PrivGANSchema, "gan": PrivGANSchema,
}


# ---- dataset ---------------------------------------------------------------------------------------------------


@dataclass
class DatasetSchema:
    """Keys every dataset has (conf/dataset/*.yaml); the subclasses add their own."""

    name: str = "???"
    kind: str = f("image", choices=("image", "table"))
    family: str = "???"
    resolution: Optional[int] = f(None, **POSITIVE, help="images only")
    channels: Optional[int] = f(None, choices=(1, 3), help="images only")
    public: Optional[str] = f(
        None,
        help="the private set is the whole train split, so no public data can be disjoint from it")
    classes: Optional[List[str]] = f(
        None, nonempty=True,
        help="null = all 10 classes; a list of names selects (and re-indexes) a subset")
    split_seed: int = f(0, **NON_NEGATIVE, help="unused here (no split of train); kept for a uniform schema")
    n_private: Optional[int] = f(
        None, **POSITIVE,
        help="null = all; an integer draws that many private examples with the run seed")
    download: bool = f(False, help="true lets torchvision download the files into ${paths.data_dir}")
    # rows of the private split held out for tuning (metrics.split=validation): a fraction (< 1) or a count;
    # carved only in such runs, so ordinary runs keep their data (dpsyn.data.carve_validation)
    validation_size: float = f(
        0.1, gt=0,
        help="tuning only (metrics.split=validation): private rows held out and scored against")

    def check(self, node: Any, root: Any = None) -> None:
        if node.kind == "image" and (node.resolution is None or node.channels is None):
            raise SchemaError("resolution" if node.resolution is None else "channels", None,
                              "an image dataset needs a resolution and a channel count")
        v = node.validation_size
        if v >= 1 and float(v) != int(v):
            raise SchemaError("validation_size", v, "a count of rows (>= 1) must be an integer; a fraction is < 1")


@dataclass
class PublicPoolDatasetSchema(DatasetSchema):
    """Datasets with an optional public pool read from files (cifar10, birds, cars, pets)."""

    n_public: Optional[int] = f(
        None, **POSITIVE,
        help="with imagenet_val: null = all 50k validation images; an integer reads a seeded subsample")


@dataclass
class CelebADatasetSchema(PublicPoolDatasetSchema):
    """CelebA (celeba_gender, celeba_hair): a centre crop before the resize."""

    crop: Optional[int] = f(
        108, **POSITIVE,
        help="centre crop side in pixels before the resize (null = the shorter side)")


@dataclass
class EvalSplitDatasetSchema(DatasetSchema):
    """Datasets whose eval split is cut from one set (digits, breast_cancer)."""

    eval_fraction: float = f(0.2, gt=0, lt=1, help="share of each class held out for evaluation")


@dataclass
class KaggleCreditDatasetSchema(EvalSplitDatasetSchema):
    path: Optional[str] = f(
        None,
        help="null = ${paths.data_dir}/kaggle_credit/creditcard.csv; else the path of creditcard.csv")


DATASET_SCHEMAS: Dict[str, type] = {
    "base": DatasetSchema, "public_pool": PublicPoolDatasetSchema, "eval_split": EvalSplitDatasetSchema,
    "kaggle_credit": KaggleCreditDatasetSchema, "celeba": CelebADatasetSchema,
}


# ---- privacy, trainer, metrics, public ------------------------------------------------------------------------

ACCOUNTANTS = ("rdp", "prv")  # DP-SGD accountants (Opacus): dpsyn.privacy.dpsgd reads them from here


@dataclass
class PrivacySchema:
    delta: float = f(1.0e-5, gt=0, lt=1, help="must lie in (0, 1/n_private)")
    accountant: str = f(
        "rdp", choices=ACCOUNTANTS,
        help="DP-SGD accountant: rdp | prv (Opacus). Named explicitly: Opacus's default changed once.")
    deterministic_noise: bool = f(
        False,
        help="true seeds DP noise from `seed` (tests only): such a run is NOT private")


@dataclass
class TrainerSchema:
    accelerator: str = f("cpu", choices=("cpu", "gpu", "cuda", "mps", "auto"))
    devices: Any = 1                      # an int, a list or "auto" (Lightning); the number of ranks under ddp
    # "auto": Lightning's choice for one device; "dpsgd_ddp": multi-process DP-SGD (conf/trainer/ddp.yaml,
    # dpsyn.lit.ddp), for the methods with Method.supports_ddp
    strategy: str = f("auto", choices=("auto", "dpsgd_ddp"))
    max_epochs: Optional[int] = f(None, **POSITIVE)
    limit_train_batches: Any = f(None, gt=0)   # an int (batches) or a float fraction (Lightning): kept as given
    enable_progress_bar: bool = True
    enable_model_summary: bool = False
    log_every_n_steps: int = f(20, **POSITIVE)


@dataclass
class EvalNetSchema:
    epochs: int = f(2, **POSITIVE)
    batch_size: int = f(128, **POSITIVE)
    lr: float = f(1.0e-3, **GT0)
    val_fraction: float = f(0.1, gt=0, lt=1)
    limit_train_batches: Optional[int] = f(None, **POSITIVE)


@dataclass
class ClassifierSchema:
    name: str = f(
        "cnn_bn", choices=("cnn_bn", "small_cnn", "wrn_40_4"),
        help="cnn_bn (0.39M, BatchNorm; docs/metrics.md has the measured choice) | small_cnn (the default before) |"
             " wrn_40_4 (PE's CIFAR-10 classifier)")
    ensemble: int = f(1, **POSITIVE, help="members with averaged logits (PE: 5)")
    epochs: int = f(8, **POSITIVE)
    schedule: str = f("cosine", choices=LR_SCHEDULES, help="Adam's learning rate: constant | cosine to 0")
    batch_size: int = f(128, **POSITIVE)
    lr: float = f(1.0e-3, **GT0)
    val_fraction: float = f(0.1, gt=0, lt=1)


@dataclass
class DPImageBenchSchema:
    """DPImageBench's downstream protocol (2019ChenGong/DPImageBench @565f8d7, evaluation/evaluator.py and
    data/dataset_loader.py; their 28x28 settings, the CIFAR ones differ): see :mod:`dpsyn.metrics.dpimagebench`."""

    classifiers: List[str] = f(
        list(DIB_CLASSIFIERS), nonempty=True, items={"choices": DIB_CLASSIFIERS},
        help="trained in turn, the mean of their test accuracies reported (theirs: all three)")
    epochs: int = f(50, **POSITIVE, help="epochs per classifier, each a selection candidate (theirs: 50)")
    lr: float = f(0.01, **GT0, help="Adam's learning rate (theirs: 0.01)")
    lr_step: int = f(20, **POSITIVE, help="epochs between learning-rate decays (theirs: StepLR 20)")
    lr_gamma: float = f(0.2, gt=0, le=1, help="learning-rate decay factor (theirs: 0.2)")
    batch_size: int = f(256, **POSITIVE, help="theirs: 256")
    ema_decay: float = f(0.9999, ge=0, lt=1, help="EMA of the weights, the averaged weights scored (theirs: 0.9999)")
    wrn_dropout: float = f(0.3, ge=0, lt=1, help="WRN-40-4's dropout (theirs: 0.3)")
    n_train: int = f(55000, **POSITIVE, help="synthetic images trained on, a seeded draw (theirs: 55000)")
    validation_rows: int = f(
        5000, **POSITIVE,
        help="real rows held out of the private split for the selection; the method trains without them (theirs: "
             "5000 of the 60k F-MNIST/MNIST train images)")
    selection: str = f(
        "real_val", choices=DIB_SELECTIONS,
        help="real_val (theirs: best epoch on the validation rows, not accounted) | noisy_max (report noisy max, "
             "charged in the ledger at selection_eps)")
    selection_eps: Optional[float] = f(
        None, **GT0,
        help="noisy_max only: the selection's epsilon, split between the classifiers, taken out of eps (the method "
             "gets eps - selection_eps)")
    width_divisor: int = f(1, choices=(1, 2, 4, 8, 16), help="divides the networks' widths (1: the papers'; tests)")

    def check(self, node: Any, root: Any = None) -> None:
        if node.selection == "real_val" and node.selection_eps is not None:
            raise SchemaError("selection_eps", node.selection_eps, "only with selection=noisy_max (real_val "
                              "spends nothing: its selection is not accounted)")
        if node.selection != "noisy_max":
            return
        if node.selection_eps is None:
            raise SchemaError("selection_eps", None, "required with selection=noisy_max: a number > 0, below eps")
        eps = float(root.get("eps", math.inf)) if root is not None else math.inf
        if math.isfinite(eps) and not float(node.selection_eps) < eps:
            raise SchemaError("selection_eps", node.selection_eps, f"must be below eps={eps:g} (the method gets "
                              "eps - selection_eps)")


@dataclass
class KIDSchema:
    subsets: int = f(100, **POSITIVE)
    subset_size: int = f(1000, **POSITIVE)


@dataclass
class PRDCSchema:
    k_pr: int = f(3, **POSITIVE)
    k_dc: int = f(5, **POSITIVE)


@dataclass
class NDBSchema:
    K: int = f(100, ge=2)
    alpha: float = f(0.05, gt=0, lt=1)
    space: str = "pixels"
    n_train: int = f(10000, **POSITIVE)
    seed: int = f(0, **NON_NEGATIVE)


@dataclass
class TabularSchema:
    classifiers: List[str] = f(["logreg", "random_forest", "gradient_boosting", "mlp"], nonempty=True)


@dataclass
class MIASchema:
    n_members: int = f(1000, **POSITIVE)
    confidence: float = f(0.95, gt=0, lt=1)
    calibration_fraction: float = f(0.5, gt=0, lt=1)


@dataclass
class MetricNamesSchema:
    image: List[str] = f(
        ["fd", "acc"],
        help="fd -> fd_<family> (embedded evaluation network) or fid (extractor=inception)")
    table: List[str] = f(["auroc"])


@dataclass
class MetricsSchema:
    names: MetricNamesSchema = field(default_factory=MetricNamesSchema)
    protocol: str = f(
        "dpsyn", choices=PROTOCOLS,
        help="how acc is measured: dpsyn (selection on held-out synthetic data) | dpimagebench (their three "
             "classifiers, selected on real rows held out of the private split; see dpimagebench)")
    # what every metric scores against: eval (the sealed test split) | validation (carved from the private split;
    # tuning runs: the test split is then not read at all)
    split: str = f(
        "eval", choices=("eval", "validation"),
        help="eval (sealed test split) | validation (carved from private: tuning, experiment=tune)")
    n_samples: int = f(
        20000, **POSITIVE,
        help="synthetic samples generated, scored and saved (the classifier trains on 1 - val_fraction of them)")
    extractor: str = f(
        "evalnet", choices=("evalnet", "inception", "clip"),
        help="evalnet (embedded: fd_<family>) | inception (fid/kid/is: local InceptionV3 weights) | clip")
    n_real: int = f(10000, **POSITIVE, help="real reference images (the eval split) for fd/kid/prdc")
    kid: KIDSchema = field(default_factory=KIDSchema)
    prdc: PRDCSchema = field(
        default_factory=PRDCSchema,
        metadata={"help": "k of precision/recall (Kynkaanniemi et al.: 3) and density/coverage (Naeem et al.: 5)"})
    is_splits: int = f(10, **POSITIVE)
    ndb: NDBSchema = field(
        default_factory=NDBSchema,
        metadata={"help": "K-means bins (fixed seed) on real training samples"})
    evalnet: EvalNetSchema = field(
        default_factory=EvalNetSchema,
        metadata={"help": "the embedded evaluation network (cached by a hash of these settings)"})
    classifier: ClassifierSchema = field(
        default_factory=ClassifierSchema,
        metadata={"help": "downstream classifier trained on synthetic data, selected on held-out synthetic data"})
    dpimagebench: DPImageBenchSchema = field(
        default_factory=DPImageBenchSchema,
        metadata={"help": "metrics.protocol=dpimagebench: DPImageBench's classifiers, training and selection"})
    tabular: TabularSchema = field(default_factory=TabularSchema)
    mia: MIASchema = field(
        default_factory=MIASchema,
        metadata={"help": "black-box distance attack: private members vs held-out non-members"})

    def check(self, node: Any, root: Any = None) -> None:
        if node.get("protocol") == "dpimagebench" and node.get("split") == "validation":
            raise SchemaError("protocol", "dpimagebench", "tuning (metrics.split=validation) scores with protocol "
                              "dpsyn: dpimagebench holds out validation rows of its own")


@dataclass
class EmbeddedPublicSchema:
    """Public models trained here (conf/public/fmnist.yaml); the model blocks are checked by dpsyn.public."""

    name: str = "???"
    kind: str = f(
        "embedded", choices=("embedded",),
        help="embedded (trained here) | real (released checkpoints, see imagenet.yaml)")
    dataset: str = "???"
    seed: int = f(0, **NON_NEGATIVE, help="fixed, not the run seed: every run must see the same public models")
    n_public: Optional[int] = f(
        None, **POSITIVE,
        help="null = the whole public split; an integer trains on a seeded subsample (tests)")
    encoder: Dict[str, Any] = field(default_factory=dict)
    generator: Dict[str, Any] = field(default_factory=dict)
    quality: Optional[Dict[str, Any]] = None
    diffusion: Optional[Dict[str, Any]] = None   # PE's models; null = none (pretrain diffusion=true refuses)


@dataclass
class RealPublicSchema:
    """Released public checkpoints (conf/public/imagenet.yaml)."""

    name: str = "???"
    kind: str = f("real", choices=("real",))
    encoder: Dict[str, Any] = field(default_factory=dict)
    generator: Dict[str, Any] = field(default_factory=dict)
    diffusion: Optional[Dict[str, Any]] = None


PUBLIC_SCHEMAS: Dict[str, type] = {"embedded": EmbeddedPublicSchema, "real": RealPublicSchema}

# group -> {name: schema}: what dpsyn.config.register puts in Hydra's ConfigStore as schema/<group>/<name>
SCHEMAS: Dict[str, Dict[str, type]] = {
    "method": METHOD_SCHEMAS,
    "dataset": DATASET_SCHEMAS,
    "privacy": {"default": PrivacySchema},
    "trainer": {"default": TrainerSchema},
    "metrics": {"default": MetricsSchema},
    "public": PUBLIC_SCHEMAS,
}
