"""Dataclass schemas of every config group, with the ranges of their fields and their cross-field rules.

Each ``conf/<group>/*.yaml`` extends its schema through its defaults list (``/schema/<group>/<name>@_here_``), so
Hydra checks types and unknown keys at compose time, and :func:`dpsyn.config.validate` checks the ranges declared
here (field metadata: ``ge``, ``gt``, ``le``, ``lt``, ``choices``, ``items`` for list elements, ``nonempty``) and
each schema's ``check`` (cross-field rules). This module imports neither torch nor a method module: the preflight
runs on it alone.

Facts the preflight needs about a method before importing it (dataset kinds, whether it needs public data) are in
:data:`METHOD_FACTS`; ``tests/test_config.py`` checks them against the registered method classes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

# Hydra/OmegaConf read the annotations at runtime: ``Optional[int]``, ``List[int]`` (not ``int | None``) keep them
# readable on every Python version OmegaConf supports.


def f(default: Any = None, **rules: Any) -> Any:
    """A field with its ``default`` and its range ``rules`` (see the module docstring)."""
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: type(default)(default), metadata=rules)
    return field(default=default, metadata=rules)


POSITIVE = {"ge": 1}        # an integer >= 1
NON_NEGATIVE = {"ge": 0}    # an integer (or number) >= 0
GT0 = {"gt": 0}             # a number > 0
FRACTION = {"gt": 0, "le": 1}   # in (0, 1]
ADAM_BETA = {"ge": 0, "lt": 1}  # in [0, 1)
WIDTHS = {"nonempty": True, "items": {"ge": 1}}  # a non-empty list of layer widths >= 1


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
    public_pool: Optional[int] = f(None, **POSITIVE)
    other_classes: str = f("nearest", choices=("nearest", "exclude"))


@dataclass
class DPGANSchema(MethodSchema):
    name: str = "dp_gan"
    epochs: int = f(1, **POSITIVE)
    batch_size: int = f(128, **POSITIVE)
    max_grad_norm: float = f(1.0, **GT0)
    lr_g: float = f(2.0e-4, **GT0)
    lr_d: float = f(2.0e-4, **GT0)
    beta1: float = f(0.5, **ADAM_BETA)
    z_dim: int = f(64, **POSITIVE)
    ngf: int = f(32, **POSITIVE)
    ndf: int = f(32, **POSITIVE)
    grad_sample_mode: str = f("fused", choices=("fused", "hooks", "functorch"))
    dpsgd_step: str = f("paired", choices=("paired", "split"))
    split_fake_rows: Optional[int] = f(None, ge=2)
    d_steps: int = f(1, **POSITIVE)
    checkpoint_every: int = f(100, **NON_NEGATIVE)
    table_g_hidden: List[int] = f([64, 64], **WIDTHS)
    table_d_hidden: List[int] = f([64, 64], **WIDTHS)
    class_ratio_epsilon: float = f(0.01, **GT0)


@dataclass
class DPGANMISchema(MethodSchema):
    name: str = "dp_gan_mi"
    epochs: int = f(20, **POSITIVE)
    batch_size: int = f(128, **POSITIVE)
    max_grad_norm: float = f(1.0, **GT0)
    lr_g: float = f(2.0e-4, **GT0)
    lr_d: float = f(2.0e-4, **GT0)
    beta1: float = f(0.5, **ADAM_BETA)
    z_dim: int = f(32, **POSITIVE)
    hidden: int = f(128, **POSITIVE)
    layers: int = f(4, ge=2)
    grad_sample_mode: str = f("hooks", choices=("hooks", "functorch"))
    dpsgd_step: str = f("paired", choices=("paired", "split"))
    split_fake_rows: Optional[int] = f(None, ge=2)
    checkpoint_every: int = f(100, **NON_NEGATIVE)


@dataclass
class DPGANFTSchema(DPGANMISchema):
    name: str = "dp_gan_ft"
    pretrain_steps: int = f(2000, **NON_NEGATIVE)
    pretrain_batch_size: int = f(128, **POSITIVE)
    max_public: Optional[int] = f(None, **POSITIVE)


@dataclass
class DPDRESchema(MethodSchema):
    name: str = "dp_dre"
    hidden: int = f(64, **POSITIVE)
    epochs: int = f(20, **POSITIVE)
    batch_size: int = f(256, **POSITIVE)
    public_batch_size: Optional[int] = f(None, **POSITIVE)
    lr: float = f(1.0e-3, **GT0)
    max_grad_norm: float = f(1.0, **GT0)
    ratio_power: float = f(1.0, **GT0)
    public_pool: Optional[int] = f(None, **POSITIVE)
    other_classes: str = f("nearest", choices=("nearest", "exclude"))


@dataclass
class DPMGESchema(MethodSchema):
    name: str = "dp_mge"
    calibration: str = f("classic", choices=("classic", "analytic"))
    mean_share: float = f(0.5, gt=0, lt=1)
    conditional: bool = False
    class_counts: str = f("dp", choices=("dp", "public"))
    count_share: float = f(0.05, ge=0, lt=1)


@dataclass
class BudgetSplitSchema:
    m1: float = f(0.45, ge=0, le=1)
    m2: float = f(0.45, ge=0, le=1)
    counts: float = f(0.1, ge=0, le=1)


@dataclass
class DPMEPFSchema(MethodSchema):
    name: str = "dp_mepf"
    feature_layers: Any = "auto"  # auto | null | a list of encoder layer names (checked against the encoder)
    layer_pool: Optional[int] = f(None, **POSITIVE)
    moments: str = f("m1_and_m2", choices=("m1", "m1_and_m2"))
    class_conditional: bool = True
    class_counts: str = f("dp", choices=("dp", "public"))
    budget_split: BudgetSplitSchema = field(default_factory=BudgetSplitSchema)
    calibration: str = f("classic", choices=("classic", "analytic"))
    steps: int = f(1000, **NON_NEGATIVE)
    batch_size: int = f(120, **POSITIVE)
    lr: float = f(1.0e-3, **GT0)
    beta1: float = f(0.5, **ADAM_BETA)
    z_dim: int = f(64, **POSITIVE)
    ngf: int = f(32, **POSITIVE)
    pretrain_steps: int = f(0, **NON_NEGATIVE)
    max_public: Optional[int] = f(10000, **POSITIVE)

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
    sigma_threshold: Optional[float] = f(None, **GT0)
    sigma: Optional[float] = f(None, **GT0)
    threshold: Optional[float] = f(None, ge=0)
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
    teachers: int = f(2000, **POSITIVE)
    projection_dim: int = f(10, **POSITIVE)
    projection: str = f("gaussian", choices=("gaussian", "dct"))
    projection_frequencies: int = f(7, **POSITIVE)
    output_frequencies: Optional[int] = f(None, **POSITIVE)
    clip: float = f(1.0e-4, **GT0)
    bins: int = f(10, ge=2)
    batch_size: int = f(64, **POSITIVE)
    batch_from_partition: bool = True
    teacher_batch: Optional[int] = f(None, **POSITIVE)
    teacher_steps: int = f(1, **POSITIVE)
    teacher_fakes: int = f(1, **POSITIVE)
    steps: int = f(500, **POSITIVE)
    bound: str = f("data_independent", choices=("data_independent", "data_dependent", "renyi_filter"))
    inf_aggregate: str = f("mean", choices=("mean", "projected", "vote"))
    latent: str = f("uniform", choices=("uniform", "normal"))
    z_dim: int = f(50, **POSITIVE)
    ngf: int = f(32, **POSITIVE)
    teacher_arch: str = f("auto", choices=("auto", "gpate", "conv", "dcgan", "mlp"))
    ndf: int = f(4, **POSITIVE)
    teacher_hidden: int = f(32, **POSITIVE)
    d_hidden: List[int] = f([32], **WIDTHS)
    lr_g: float = f(1.0e-3, **GT0)
    lr_d: float = f(1.0e-3, **GT0)
    lr_g_decay_start: Optional[float] = f(None, ge=0, lt=1)
    beta1: float = f(0.5, **ADAM_BETA)
    ema: float = f(0.0, ge=0, lt=1)
    teacher_chunk: Optional[int] = f(100, **POSITIVE)
    checkpoint_every: int = f(50, **NON_NEGATIVE)
    g_hidden: List[int] = f([64, 64], **WIDTHS)
    class_ratio_epsilon: float = f(0.01, **GT0)


@dataclass
class PATEGANSchema(PATENoiseSchema):
    name: str = "pate_gan"
    teachers: int = f(1000, **POSITIVE)
    batch_size: int = f(32, **POSITIVE)
    teacher_batch: Optional[int] = f(16, **POSITIVE)
    teacher_steps: int = f(1, **POSITIVE)
    student_steps: int = f(1, **POSITIVE)
    vote_quantile: Optional[float] = f(None, gt=0, lt=1)
    inf_signal: str = f("student", choices=("student", "teachers"))
    steps: int = f(500, **POSITIVE)
    bound: str = f("data_independent", choices=("data_independent", "data_dependent", "renyi_filter"))
    class_ratio_epsilon: float = f(0.01, **GT0)
    z_dim: int = f(50, **POSITIVE)
    ngf: int = f(32, **POSITIVE)
    g_hidden: List[int] = f([64, 64], **WIDTHS)
    teacher_arch: str = f("auto", choices=("auto", "gpate", "conv", "dcgan", "mlp"))
    ndf: int = f(4, **POSITIVE)
    teacher_hidden: int = f(32, **POSITIVE)
    d_hidden: List[int] = f([32], **WIDTHS)
    student_ndf: int = f(32, **POSITIVE)
    s_hidden: List[int] = f([64, 64], **WIDTHS)
    lr_g: float = f(2.0e-4, **GT0)
    lr_s: float = f(2.0e-4, **GT0)
    lr_d: float = f(1.0e-3, **GT0)
    beta1: float = f(0.5, **ADAM_BETA)
    teacher_chunk: Optional[int] = f(100, **POSITIVE)
    checkpoint_every: int = f(50, **NON_NEGATIVE)


@dataclass
class GSWGANSchema(MethodSchema):
    name: str = "gs_wgan"
    critics: int = f(100, **POSITIVE)
    iterations: int = f(1000, **POSITIVE)
    batch_size: int = f(32, **POSITIVE)
    critic_steps: int = f(5, **POSITIVE)
    clip: float = f(1.0, **GT0)
    gp_weight: float = f(10.0, **GT0)
    drift: float = f(1.0e-3, ge=0)
    lr_g: float = f(1.0e-4, **GT0)
    lr_d: float = f(1.0e-4, **GT0)
    beta1: float = f(0.5, **ADAM_BETA)
    beta2: float = f(0.9, **ADAM_BETA)
    z_dim: int = f(10, **POSITIVE)
    ngf: int = f(32, **POSITIVE)
    ndf: int = f(16, **POSITIVE)
    ema: float = f(0.99, ge=0, lt=1)
    clip_at_inf: bool = True
    bound: str = f("convexity", choices=("convexity", "wang2019", "poisson_argument"))
    critic_schedule: str = f("round_robin", choices=("round_robin", "drawn"))
    fresh_steps: int = f(0, **NON_NEGATIVE)
    checkpoint_every: int = f(100, **NON_NEGATIVE)
    warm_start_iterations: int = f(50, **NON_NEGATIVE)
    warm_start_chunk: int = f(1, **POSITIVE)
    output_frequencies: Optional[int] = f(None, **POSITIVE)


@dataclass
class PESchema(MethodSchema):
    name: str = "pe"
    backend: str = f("icgan", choices=("icgan", "diffusion"))
    embedding: str = f("encoder", choices=("encoder", "inception"))
    population: int = f(2000, **POSITIVE)
    degrees: List[float] = f([0.8, 0.6, 0.5, 0.4, 0.3, 0.25], nonempty=True, items=FRACTION)
    noise_multiplier: Optional[float] = f(None, **GT0)
    threshold: float = f(4.0, ge=0)
    lookahead: int = f(4, **NON_NEGATIVE)
    num_nearest: int = f(1, **POSITIVE)
    selection: str = f("sample", choices=("sample", "rank"))
    rank_keep: float = f(0.5, **FRACTION)
    conditional: bool = False
    class_proportions: str = f("uniform", choices=("uniform", "public", "dp"))
    condition: str = f("random_class", choices=("random_class", "none"))
    feature_noise: float = f(0.5, ge=0)
    final_degree: Optional[float] = f(None, **FRACTION)
    public_pool: Optional[int] = f(None, **POSITIVE)
    other_classes: str = f("nearest", choices=("nearest", "exclude"))
    knn_backend: str = f("auto", choices=("auto", "faiss", "torch"))
    nn_index: str = f("auto", choices=("auto", "flat", "ivf", "hnsw"))
    monitor: bool = True
    checkpoint: bool = True


@dataclass
class UtilitySchema:
    epochs: int = f(5, **POSITIVE)
    batch_size: int = f(128, **POSITIVE)
    lr: float = f(1.0e-3, **GT0)


@dataclass
class AttackSchema:
    n_members: int = f(500, **POSITIVE)
    non_member_ratio: int = f(9, **POSITIVE)
    monte_carlo: int = f(1, ge=0, le=1)
    mc_components: int = f(40, **POSITIVE)
    mc_percentile: Optional[float] = f(None, gt=0, le=100)
    per_owner_utility: int = f(1, ge=0, le=1)
    utility: UtilitySchema = field(default_factory=UtilitySchema)


@dataclass
class PrivGANSchema(MethodSchema):
    name: str = "privgan"
    owners: List[float] = f([0.5, 0.5], nonempty=True, items=FRACTION)
    lam: float = f(1.0, ge=0)
    dp_delay: int = f(0, **NON_NEGATIVE)
    dp_pretrain: bool = False
    dp_pretrain_epochs: int = f(50, **NON_NEGATIVE)
    per_class: bool = True
    arch: str = f("mlp", choices=("mlp", "dcgan"))
    epochs: int = f(20, **POSITIVE)
    batch_size: int = f(256, **POSITIVE)
    lr: float = f(2.0e-4, **GT0)
    beta1: float = f(0.5, **ADAM_BETA)
    label_smoothing: float = f(0.95, **FRACTION)
    z_dim: int = f(100, **POSITIVE)
    g_hidden: List[int] = f([256, 512], **WIDTHS)
    d_hidden: List[int] = f([512, 256], **WIDTHS)
    attack: AttackSchema = field(default_factory=AttackSchema)
    mode: str = f("single", choices=("single", "decentralized"))

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


@dataclass(frozen=True)
class MethodFacts:
    """What the preflight must know about a method without importing it (its module imports torch); ``kinds`` and
    ``needs_public`` equal the method class's (a test checks).

    Private tuning (:mod:`dpsyn.private_tuning`) reads the other two, checked by a search before it draws its
    number of trials: every trial must spend the same RDP curve, so the search space may hold only keys that cannot
    change it. Both name top-level fields of the method's schema (a nested key such as ``budget_split.m1`` counts as
    its field, ``budget_split``); a test checks that they do, and that they are disjoint.

    Attributes:
        accounting_keys: the method keys its privacy accounting reads (with the run's n, eps, delta, accountant and
            trainer step limits): the noise calibration, the number of steps, queries or releases, the sample rate,
            the budget split. Read from the method's ``fit`` (dpsyn/methods/*.py, dpsyn/lit/dpsgd.py).
        tunable_keys: the method keys shown NOT to enter its accounting (optimiser and architecture settings,
            post-processing, the clip norm of a noise calibrated in units of it): the ONLY keys a private search may
            tune (an allowlist: a key in neither tuple, such as a new field, is refused until someone reads the
            accounting and lists it). Empty for a method that is not DP (a reference) or has nothing to tune.
    """

    kinds: tuple = ("image", "table")
    needs_public: bool = False
    accounting_keys: tuple = ()
    tunable_keys: tuple = ()


_IMAGE = ("image",)
# DP-SGD methods: the noise multiplier is calibrated from (eps, delta, q = batch_size / n, the planned steps =
# epochs x batches, or the trainer's max_epochs / limit_train_batches); the clip norm scales the noise with it
_DPSGD_ACCOUNTING = ("epochs", "batch_size")
_DPSGD_GAN_TUNABLE = ("lr_g", "lr_d", "beta1", "z_dim", "max_grad_norm", "dpsgd_step", "split_fake_rows")
# PATE methods (data-independent bound): queries x (alpha / (2 sigma_threshold^2) + alpha / sigma^2), the noise in
# votes or as ratios of the teachers, queries = steps x queries a step (stopped where the budget ends)
_PATE_ACCOUNTING = ("teachers", "sigma_threshold", "sigma", "threshold", "sigma_threshold_ratio", "sigma_ratio",
                    "threshold_ratio", "bound", "steps", "batch_size", "class_ratio_epsilon")
METHOD_FACTS: Dict[str, MethodFacts] = {
    # not DP (their ledgers record a non-private release): nothing to tune privately
    "real": MethodFacts(),
    "privgan": MethodFacts(_IMAGE),
    "gan": MethodFacts(_IMAGE),
    "icgan_nonprivate": MethodFacts(_IMAGE, True),
    # reads no private row: spends nothing whatever its settings
    "public_uniform": MethodFacts(_IMAGE, True, tunable_keys=("public_pool", "other_classes")),
    "dp_gan": MethodFacts(
        accounting_keys=(*_DPSGD_ACCOUNTING, "class_ratio_epsilon"),  # tables: Laplace release, DP-SGD the rest
        tunable_keys=(*_DPSGD_GAN_TUNABLE, "ngf", "ndf", "d_steps", "table_g_hidden", "table_d_hidden")),
    "dp_gan_mi": MethodFacts(_IMAGE, True, accounting_keys=_DPSGD_ACCOUNTING,
                             tunable_keys=(*_DPSGD_GAN_TUNABLE, "hidden", "layers")),
    "dp_gan_ft": MethodFacts(_IMAGE, True, accounting_keys=_DPSGD_ACCOUNTING,  # pretraining: public rows only
                             tunable_keys=(*_DPSGD_GAN_TUNABLE, "hidden", "layers", "pretrain_steps",
                                           "pretrain_batch_size", "max_public")),
    "dp_dre": MethodFacts(_IMAGE, True, accounting_keys=_DPSGD_ACCOUNTING,  # public rows: appended, not accounted
                          tunable_keys=("hidden", "lr", "max_grad_norm", "ratio_power", "public_batch_size",
                                        "public_pool", "other_classes")),
    # Gaussian releases: the shares of the budget and which releases are made
    "dp_mge": MethodFacts(_IMAGE, True, accounting_keys=("calibration", "mean_share", "conditional", "class_counts",
                                                         "count_share")),
    # the embeddings' releases (budget_split, calibration, moments, counts); the generator is post-processing
    "dp_mepf": MethodFacts(_IMAGE, True,
                           accounting_keys=("budget_split", "calibration", "moments", "class_counts",
                                            "class_conditional"),
                           tunable_keys=("steps", "batch_size", "lr", "beta1", "z_dim", "ngf", "pretrain_steps",
                                         "max_public")),
    "g_pate": MethodFacts(
        accounting_keys=(*_PATE_ACCOUNTING, "batch_from_partition", "projection_dim"),  # b x k queries a round
        tunable_keys=("lr_g", "lr_d", "lr_g_decay_start", "beta1", "ema", "z_dim", "ngf", "ndf", "teacher_hidden",
                      "d_hidden", "g_hidden", "latent", "teacher_steps", "teacher_fakes", "clip", "bins")),
    "pate_gan": MethodFacts(
        accounting_keys=(*_PATE_ACCOUNTING, "inf_signal"),
        tunable_keys=("lr_g", "lr_s", "lr_d", "beta1", "z_dim", "ngf", "ndf", "student_ndf", "teacher_hidden",
                      "d_hidden", "g_hidden", "s_hidden", "teacher_steps", "student_steps")),
    # one uniform-choice Gaussian event: noise std in units of the clip C, K critics, iterations x b releases
    "gs_wgan": MethodFacts(
        _IMAGE, accounting_keys=("critics", "iterations", "batch_size", "bound", "critic_schedule"),
        tunable_keys=("lr_g", "lr_d", "beta1", "beta2", "z_dim", "ngf", "ndf", "gp_weight", "drift", "ema", "clip",
                      "critic_steps", "warm_start_iterations")),
    # T = len(degrees) sensitivity-1 histograms (+1 for DP class counts) at one sigma (given, or calibrated)
    "pe": MethodFacts(_IMAGE, True, accounting_keys=("degrees", "noise_multiplier", "conditional", "class_proportions"),
                      tunable_keys=("threshold", "lookahead", "selection", "rank_keep", "feature_noise", "population",
                                    "final_degree", "num_nearest")),
}


# ---- dataset ---------------------------------------------------------------------------------------------------


@dataclass
class DatasetSchema:
    """Keys every dataset has (conf/dataset/*.yaml); the subclasses add their own."""

    name: str = "???"
    kind: str = f("image", choices=("image", "table"))
    family: str = "???"
    resolution: Optional[int] = f(None, **POSITIVE)
    channels: Optional[int] = f(None, choices=(1, 3))
    public: Optional[str] = None
    classes: Optional[List[str]] = f(None, nonempty=True)
    split_seed: int = f(0, **NON_NEGATIVE)
    n_private: Optional[int] = f(None, **POSITIVE)
    download: bool = False
    # rows of the private split held out for tuning (metrics.split=validation): a fraction (< 1) or a count;
    # carved only in such runs, so ordinary runs keep their data (dpsyn.data.carve_validation)
    validation_size: float = f(0.1, gt=0)

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

    n_public: Optional[int] = f(None, **POSITIVE)


@dataclass
class CelebADatasetSchema(PublicPoolDatasetSchema):
    """CelebA (celeba_gender, celeba_hair): a centre crop before the resize."""

    crop: Optional[int] = f(108, **POSITIVE)


@dataclass
class EvalSplitDatasetSchema(DatasetSchema):
    """Datasets whose eval split is cut from one set (digits, breast_cancer)."""

    eval_fraction: float = f(0.2, gt=0, lt=1)


@dataclass
class KaggleCreditDatasetSchema(EvalSplitDatasetSchema):
    path: Optional[str] = None


DATASET_SCHEMAS: Dict[str, type] = {
    "base": DatasetSchema, "public_pool": PublicPoolDatasetSchema, "eval_split": EvalSplitDatasetSchema,
    "kaggle_credit": KaggleCreditDatasetSchema, "celeba": CelebADatasetSchema,
}


# ---- privacy, trainer, metrics, public ------------------------------------------------------------------------

ACCOUNTANTS = ("rdp", "prv")  # DP-SGD accountants (Opacus); equal to dpsyn.privacy.ACCOUNTANTS (a test checks)


@dataclass
class PrivacySchema:
    delta: float = f(1.0e-5, gt=0, lt=1)
    accountant: str = f("rdp", choices=ACCOUNTANTS)
    deterministic_noise: bool = False


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
    name: str = f("small_cnn", choices=("small_cnn", "wrn_40_4"))
    ensemble: int = f(1, **POSITIVE)
    epochs: int = f(5, **POSITIVE)
    batch_size: int = f(128, **POSITIVE)
    lr: float = f(1.0e-3, **GT0)
    val_fraction: float = f(0.1, gt=0, lt=1)


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
    image: List[str] = f(["fd", "acc"])
    table: List[str] = f(["auroc"])


@dataclass
class MetricsSchema:
    names: MetricNamesSchema = field(default_factory=MetricNamesSchema)
    # what every metric scores against: eval (the sealed test split) | validation (carved from the private split;
    # tuning runs: the test split is then not read at all)
    split: str = f("eval", choices=("eval", "validation"))
    n_samples: int = f(10000, **POSITIVE)
    extractor: str = f("evalnet", choices=("evalnet", "inception", "clip"))
    n_real: int = f(10000, **POSITIVE)
    kid: KIDSchema = field(default_factory=KIDSchema)
    prdc: PRDCSchema = field(default_factory=PRDCSchema)
    is_splits: int = f(10, **POSITIVE)
    ndb: NDBSchema = field(default_factory=NDBSchema)
    evalnet: EvalNetSchema = field(default_factory=EvalNetSchema)
    classifier: ClassifierSchema = field(default_factory=ClassifierSchema)
    tabular: TabularSchema = field(default_factory=TabularSchema)
    mia: MIASchema = field(default_factory=MIASchema)


@dataclass
class EmbeddedPublicSchema:
    """Public models trained here (conf/public/fmnist.yaml); the model blocks are checked by dpsyn.public."""

    name: str = "???"
    kind: str = f("embedded", choices=("embedded",))
    dataset: str = "???"
    seed: int = f(0, **NON_NEGATIVE)
    n_public: Optional[int] = f(None, **POSITIVE)
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
