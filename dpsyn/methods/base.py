"""The Method interface every algorithm implements, and the objects it exchanges with the run.

``fit(private, budget, ledger, public=None)`` spends at most ``budget`` and records every release in ``ledger``;
``sample(n, labels=None)`` is post-processing and returns :class:`Samples`.
"""

from __future__ import annotations

import copy
import logging
import math
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from dpsyn.data.base import Split
from dpsyn.privacy import ApproxDPEvent, PrivacyLedger, dp_class_proportions, dp_numpy_generator
from dpsyn.plugins import PLUGIN_METHODS
from dpsyn.registry import Registry
from dpsyn.results.io import atomic_write_json, read_json

log = logging.getLogger(__name__)

METHODS: Registry = Registry("method")
# the method keys the accounting of a family of methods reads (Method.accounting_keys, private tuning's denylist):
# DP-SGD: the noise multiplier is calibrated from (eps, delta, q = batch_size / n, the planned steps = epochs x
# batches, or the trainer's max_epochs / limit_train_batches); the clip norm scales the noise with it
DPSGD_ACCOUNTING_KEYS = ("epochs", "batch_size")
DPSGD_GAN_TUNABLE_KEYS = ("lr_g", "lr_d", "beta1", "z_dim", "max_grad_norm", "dpsgd_step", "split_fake_rows")
# PATE (data-independent bound): queries x (alpha / (2 sigma_threshold^2) + alpha / sigma^2), the noise in votes or
# as ratios of the teachers, queries = steps x queries a step (stopped where the budget ends)
PATE_ACCOUNTING_KEYS = ("teachers", "sigma_threshold", "sigma", "threshold", "sigma_threshold_ratio", "sigma_ratio",
                        "threshold_ratio", "bound", "steps", "batch_size", "class_ratio_epsilon")

_PUBLIC_MODELS = "<public models: loaded again with Method.public_models()>"


def _without_noise_streams(value: Any) -> Any:
    """``value``, or a shallow copy of it whose DP settings (a ``dp`` dict attribute, as the DP-SGD Lightning modules
    hold) keep no ``torch.Generator``: the DP noise and Poisson-sampling streams are secret (their state would let
    anyone replay the noise), and the fitted state is saved in the run directory (docs/published-fields.md)."""
    import torch

    dp = getattr(value, "dp", None)
    if not isinstance(dp, dict) or not any(isinstance(v, torch.Generator) for v in dp.values()):
        return value
    out = copy.copy(value)
    object.__setattr__(out, "dp", {k: None if isinstance(v, torch.Generator) else v for k, v in dp.items()})
    return out


@dataclass(frozen=True)
class PrivacyBudget:
    """The target (epsilon, delta); ``epsilon = inf`` means a non-private run."""

    epsilon: float
    delta: float

    @property
    def private(self) -> bool:
        return math.isfinite(self.epsilon)


@dataclass
class Samples:
    """Synthetic data: images float32 in [0, 1] NCHW (or table rows), labels, and where they came from."""

    x: np.ndarray
    y: np.ndarray | None
    provenance: dict[str, Any] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.x)


def draw_latent(n: int, z_dim: int, *, generator: Any, latent: str = "normal") -> Any:
    """(n, z_dim) latents on the CPU from ``generator``: N(0, I) for ``"normal"``, U(-1, 1) for ``"uniform"``."""
    import torch

    if latent == "normal":
        return torch.randn(n, z_dim, generator=generator)
    if latent == "uniform":
        return torch.rand(n, z_dim, generator=generator) * 2.0 - 1.0
    raise ValueError(f"latent must be 'normal' or 'uniform', got {latent!r}")


def generate_conditional(
    G: Any, labels: np.ndarray, *, z_dim: int, shape: tuple[int, ...], generator: Any, device: Any = "cpu",
    batch_size: int = 1000, latent: str = "normal",
) -> np.ndarray:
    """``G(z, y)`` for every label, ``batch_size`` at a time: z ~ N(0, I) (``latent="normal"``) or U(-1, 1)^z_dim
    (``"uniform"``, G-PATE's) drawn on the CPU from ``generator`` (the same samples from a seed on any device), outputs
    moved back to the CPU. Call it under ``torch.no_grad()``.

    Returns:
        float32 array (len(labels), *shape).
    """
    import torch

    y_all = np.asarray(labels, dtype=np.int64)
    out = []
    for i in range(0, len(y_all), batch_size):
        y = torch.from_numpy(y_all[i : i + batch_size]).to(device)
        z = draw_latent(len(y), z_dim, generator=generator, latent=latent).to(device)
        out.append(G(z, y).cpu())
    return torch.cat(out).numpy().astype(np.float32) if out else np.zeros((0, *shape), np.float32)


@dataclass
class RunContext:
    """What a method needs to know about the run besides its own hyperparameters.

    Attributes:
        seed: the run seed (initialisation, latent draws); never seeds DP noise.
        deterministic_noise: seed DP noise from ``seed`` (tests only; such a run is not private).
        accountant: DP-SGD accountant name ("rdp" or "prv").
        kind, shape, num_classes, classes: the dataset's.
        trainer: Lightning Trainer keyword arguments (from ``conf/trainer``), for methods that build a Lightning
            Trainer; hand-written loops read the resolved ``device`` and step limits below instead.
        device: the torch device string hand-written loops train on, resolved from the trainer's accelerator by
            :func:`run_limits` ("cuda" when the accelerator asks for a GPU and one is there, else "cpu").
        max_steps: a cap on a hand-written loop's steps (an integer ``trainer.limit_train_batches``, e.g.
            ``trainer=debug``: 5), or None; :meth:`capped_steps` applies it.
        max_epochs: the trainer's ``max_epochs`` (overrides a method's own epoch count), or None.
        batch_limit: the trainer's ``limit_train_batches`` as Lightning reads it (a float is a fraction of an epoch,
            an int a count), for epoch-based loops that plan their steps; or None.
        logger: a Lightning logger or None.
        run_dir: the run directory (checkpoints go here).
        public: the ``conf/public`` node (public models of paper 000), loaded on demand by :meth:`Method.public_models`.
        cache_dir, data_dir: the run's ``paths`` (caches of trained public models; real checkpoints and data).
        public_classes: class names of the public split's labels, or None.
        monitor: ``monitor(images) -> {metric: value}`` (FD, precision/recall against the evaluation split) for
            iterative methods to log their progress (:func:`dpsyn.metrics.make_monitor`); monitoring only, never
            used to select anything. None in tests that build a context by hand.
    """

    seed: int
    deterministic_noise: bool
    accountant: str
    kind: str
    shape: tuple[int, ...]
    num_classes: int
    classes: list[str]
    trainer: dict[str, Any] = field(default_factory=dict)
    logger: Any = None
    run_dir: Path | None = None
    public: Any = None
    cache_dir: str | None = None
    data_dir: str | None = None
    public_classes: list[str] | None = None
    monitor: Any = None
    device: str = "cpu"
    max_steps: int | None = None
    max_epochs: int | None = None
    batch_limit: int | float | None = None

    def capped_steps(self, steps: int) -> int:
        """``steps``, capped by :attr:`max_steps` when set."""
        return steps if self.max_steps is None else min(steps, int(self.max_steps))


def run_limits(trainer: dict[str, Any] | None) -> dict[str, Any]:
    """The :class:`RunContext` fields resolved from the trainer config (``conf/trainer``): ``device``,
    ``max_steps``, ``max_epochs``, ``batch_limit``. :func:`dpsyn.task.run` fills the run's context with them, so that
    methods never read Trainer settings themselves."""
    trainer = trainer or {}
    acc = str(trainer.get("accelerator", "cpu"))
    device = "cpu"
    if acc in ("gpu", "cuda", "auto"):
        import torch

        device = "cuda" if torch.cuda.is_available() else "cpu"
    limit = trainer.get("limit_train_batches")
    max_steps = int(limit) if isinstance(limit, int) and not isinstance(limit, bool) else None
    epochs = trainer.get("max_epochs")
    return {"device": device, "max_steps": max_steps, "max_epochs": int(epochs) if epochs else None,
            "batch_limit": limit}


class Method(ABC):
    """Base class of every registered method.

    Class attributes (each fact about a method is stated here, once; the preflight reads ``kinds`` and
    ``needs_public`` of dpsyn's own methods from :mod:`dpsyn.config.catalog`, generated from these by ``make docs``):
        needs_public: the method uses public data; datasets without it are refused before any work.
        kinds: dataset kinds the method supports.
        accounting_keys: the method keys its privacy accounting reads (with the run's n, eps, delta, accountant and
            trainer step limits): the noise calibration, the number of steps, queries or releases, the sample rate,
            the budget split; read from ``fit``. Private tuning (:mod:`dpsyn.private_tuning`) refuses to tune them.
        tunable_keys: the method keys shown NOT to enter its accounting (optimiser and architecture settings,
            post-processing, the clip norm of a noise calibrated in units of it): the ONLY keys a private search may
            tune (an allowlist: a key in neither tuple, such as a new field, is refused until someone reads the
            accounting and lists it). Empty for a method that is not DP (a reference) or has nothing to tune. Both
            name top-level fields of the method's schema (``budget_split.m1`` counts as ``budget_split``).
        tiny: the overrides of the method's fastest end-to-end run (its dataset included; with ``trainer=debug``,
            seconds): every harness of the test suite (the budget, crash-safety and neighbouring-run checks,
            tests/test_all_methods.py) runs the method with them, so a new method is covered by default.
        reference: a non-private reference (``real``, ``gan``): its result is written whatever the target eps,
            flagged ``non_private_reference`` with epsilon spent = inf.
        eps_free: the method's output does not depend on the target eps (a reference, or a method that never reads
            private data): a sweep run with ``skip_existing=true`` copies its finished cell at another eps instead of
            running it again (``dpsyn.task.reuse_eps_free_result``). None = the same as ``reference``.
    """

    needs_public: ClassVar[bool] = False
    kinds: ClassVar[tuple[str, ...]] = ("image", "table")
    accounting_keys: ClassVar[tuple[str, ...]] = ()
    tunable_keys: ClassVar[tuple[str, ...]] = ()
    tiny: ClassVar[tuple[str, ...]] = ()
    reference: ClassVar[bool] = False
    eps_free: ClassVar[bool | None] = None
    #: the method trains with ``trainer=ddp`` (multi-process DP-SGD, :mod:`dpsyn.lit.ddp`); others refuse it
    supports_ddp: ClassVar[bool] = False
    #: the attributes ``fit`` sets that ``sample`` and ``report`` read (:meth:`fitted_state`); None: the method keeps
    #: no fitted state and a re-run fits again (only for methods that spend no privacy). ``"models"`` (the public
    #: models) is not stored: it is loaded again with :meth:`public_models`.
    fitted_attrs: ClassVar[tuple[str, ...] | None] = None
    #: what the method's training checkpoints (under ``run_dir/checkpoints``) hold that is not a DP output, e.g.
    #: teachers or critics trained on private partitions without noise: ``{file name: keys}``. Needed to resume
    #: training after a crash; dropped by :meth:`drop_unreleased_checkpoint_state` once the fitted state is saved.
    unreleased_checkpoint_keys: ClassVar[dict[str, tuple[str, ...]]] = {}

    #: method keys that may differ between a training checkpoint and the run that resumes it: they change neither the
    #: releases nor the state trained so far (how often to checkpoint, a cap on steps, how many teachers per batched
    #: call). Every other key of the typed method config is in :meth:`resume_fingerprint`.
    resume_free_keys: ClassVar[tuple[str, ...]] = ("checkpoint_every",)

    def resume_fingerprint(self, budget: PrivacyBudget, **facts: Any) -> dict[str, Any]:
        """What a training checkpoint must share with this run to be resumed: every field of the typed method config
        (:func:`dpsyn.config.fingerprint`: a new hyperparameter cannot be missed) but :attr:`resume_free_keys`, the
        target (eps, delta), the seed, the accountant, and the run ``facts`` the method derives (e.g. its sigma)."""
        from dpsyn.config import fingerprint

        method = {k: v for k, v in fingerprint(self.cfg, "method").items() if k not in self.resume_free_keys}
        return {"method": method, "eps": budget.epsilon, "delta": budget.delta, "seed": self.ctx.seed,
                "accountant": self.ctx.accountant, "kind": self.ctx.kind, **facts}

    @classmethod
    def output_depends_on_eps(cls) -> bool:
        """False when the method's samples, metrics and ledger are the same at every target eps."""
        return not (cls.reference if cls.eps_free is None else cls.eps_free)

    def __init__(self, cfg: Any, ctx: RunContext) -> None:
        self.cfg = cfg
        self.ctx = ctx

    @abstractmethod
    def fit(
        self, private: Split, budget: PrivacyBudget, ledger: PrivacyLedger, public: Split | None = None
    ) -> None:
        """Train on ``private`` under ``budget``, recording every release in ``ledger``."""

    @abstractmethod
    def sample(self, n: int, labels: np.ndarray | None = None) -> Samples:
        """Generate ``n`` samples (with the given labels, or labels drawn by the method)."""

    def fitted_state(self) -> dict[str, Any] | None:
        """What ``sample`` and ``report`` need after ``fit``, for ``checkpoints/fitted.pt`` (:mod:`dpsyn.task`):
        a run killed after fit (while sampling or scoring) restores it instead of fitting again, which would make a
        second release of the private data.

        Default: the attributes named by :attr:`fitted_attrs` that are set (``torch.save`` pickles them), the public
        models as a marker. Returns None when the method keeps no fitted state (``fitted_attrs`` None).
        """
        if self.fitted_attrs is None:
            return None
        state: dict[str, Any] = {}
        for name in self.fitted_attrs:
            if not hasattr(self, name):  # set by some configurations only
                continue
            value = getattr(self, name)
            state[name] = _PUBLIC_MODELS if name == "models" and value is not None else _without_noise_streams(value)
        return state

    def load_fitted_state(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`fitted_state` returned, so that ``sample`` and ``report`` work without ``fit``."""
        for name, value in state.items():
            setattr(self, name, self.public_models() if isinstance(value, str) and value == _PUBLIC_MODELS else value)

    def drop_unreleased_checkpoint_state(self) -> list[str]:
        """Remove :attr:`unreleased_checkpoint_keys` from the run's training checkpoints (rewritten atomically).

        Called by the run once ``checkpoints/fitted.pt`` holds the fitted state: the run directory is published, and
        what is left in it must be a DP output or post-processing of one (docs/published-fields.md). A rerun after
        that restores the fitted state and does not train again, so it needs none of what is dropped.

        Returns:
            the checkpoint files rewritten.
        """
        if not self.unreleased_checkpoint_keys or self.ctx.run_dir is None:
            return []
        from dpsyn.results.checkpoint import drop_keys

        done = []
        for name, keys in self.unreleased_checkpoint_keys.items():
            path = Path(self.ctx.run_dir) / "checkpoints" / name
            if not drop_keys(path, keys):
                continue
            done.append(str(path))
            log.info("dropped %s (not DP outputs) from %s: training is over", ", ".join(keys), path)
        return done

    def report(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """Facts about the fitted method added to result.json's metrics (noise levels, weight masses, the monitored
        metrics of its iterations): (values, per-value info). It gets no data: anything measured against private or
        evaluation rows is a metric (:mod:`dpsyn.metrics`), e.g. the attacks on :meth:`membership_target`.
        Default: none."""
        return {}, {}

    def membership_target(self) -> Any:
        """What membership attacks on this method's released models need (a
        :class:`dpsyn.metrics.membership.MembershipTarget`), or None (default) when the method is not measured that
        way. The run evaluates it with :func:`dpsyn.metrics.membership.evaluate_membership`, which alone sees the
        evaluation split."""
        return None

    def public_models(self) -> Any:
        """The run's public models (encoder h, generator g; :mod:`dpsyn.public`), loaded from the cache or trained
        on public data on first use (no privacy cost). Raises a clear error when a real checkpoint is missing."""
        from dpsyn.public import load_public_models

        if self.ctx.public is None:
            raise ValueError(f"method {type(self).__name__} needs public models but the config has no `public` group")
        return load_public_models(self.ctx.public, cache_dir=self.ctx.cache_dir or ".", data_dir=self.ctx.data_dir or ".")

    def uniform_labels(self, n: int, rng: np.random.Generator) -> np.ndarray:
        """Labels spread evenly over the classes (a public choice: the private class proportions are not used)."""
        return rng.permutation(np.arange(n) % self.ctx.num_classes).astype(np.int64)

    def release_class_proportions(
        self, private: Split, budget: PrivacyBudget, ledger: PrivacyLedger, epsilon: float,
    ) -> tuple[np.ndarray, PrivacyBudget]:
        """G-PATE's first step on tables: the class proportions released with the Laplace mechanism at ``epsilon``
        (:func:`dpsyn.privacy.dp_class_proportions`, recorded as ``ApproxDPEvent(epsilon, delta=0)``), and the budget
        left for the generator (basic composition: ``budget.epsilon - epsilon``, same delta).

        A non-private run (eps = inf) uses the exact proportions and charges nothing here (its ledger is already
        non-private). With a run directory, a fresh draw is written at once to ``checkpoints/class_proportions.json``
        and a re-run in that directory (after a crash, whenever it came) reuses it, charged again in its (fresh)
        ledger: the noise is drawn once per run (a second draw would be a second release).

        Raises:
            ValueError: ``epsilon`` not in (0, budget.epsilon); a saved release made at another epsilon.
        """
        y = np.asarray(private.y).astype(np.int64)
        if not budget.private:
            return np.bincount(y, minlength=self.ctx.num_classes) / max(len(y), 1), budget
        if isinstance(epsilon, bool) or not isinstance(epsilon, (int, float)) or not 0 < epsilon < budget.epsilon:
            raise ValueError(f"class-ratio epsilon {epsilon!r} must lie in (0, eps={budget.epsilon:g})")
        saved = Path(self.ctx.run_dir) / "checkpoints" / "class_proportions.json" if self.ctx.run_dir else None
        if saved is not None and saved.is_file():
            state = read_json(saved)
            if state["epsilon"] != float(epsilon):
                raise ValueError(f"{saved} was released at class-ratio epsilon {state['epsilon']}, this config asks "
                                 f"for {epsilon}: resume with the same config, or use a new run directory")
            log.info("reusing the class proportions this run released before (%s)", saved)
            props = np.asarray(state["proportions"], dtype=np.float64)
            if props.shape != (self.ctx.num_classes,):
                raise ValueError(f"released class proportions of shape {props.shape} for {self.ctx.num_classes} classes")
        else:
            gen = dp_numpy_generator(deterministic=self.ctx.deterministic_noise, seed=self.ctx.seed)
            props = dp_class_proportions(y, self.ctx.num_classes, epsilon=float(epsilon), generator=gen)
            if saved is not None:  # before anything else can fail: a re-run must not draw again
                atomic_write_json(saved, {"epsilon": float(epsilon), "proportions": props.tolist()})
        ledger.add(ApproxDPEvent(epsilon=float(epsilon), delta=0.0,
                                 label=f"class proportions (Laplace mechanism, L1 sensitivity 1, eps={epsilon:g})"))
        return props, PrivacyBudget(budget.epsilon - float(epsilon), budget.delta)

    def labels_from_proportions(self, n: int, proportions: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """``n`` labels drawn i.i.d. from the (released) class ``proportions``."""
        p = np.asarray(proportions, dtype=np.float64)
        return rng.choice(len(p), size=n, p=p / p.sum()).astype(np.int64)


def register_method(name: str, schema: type | None = None) -> Any:
    """Class decorator registering a :class:`Method` under ``name``: what a method from outside dpsyn (a plugin,
    :mod:`dpsyn.plugins`) calls when its module is imported. With ``schema`` (its config dataclass, a subclass of
    :class:`dpsyn.config.schema.MethodSchema` whose ``name`` defaults to ``name``), ``method=<name>`` composes with
    no yaml file (the schema's defaults are the method's) and the preflight reads the class's facts; a yaml on a
    user config path (``hydra.searchpath``) may still extend ``/schema/method/<name>@_here_``.

    Raises:
        ValueError: ``name`` is registered already, or the schema's ``name`` default differs.
    """

    def deco(cls: type) -> type:
        if schema is not None:
            from dpsyn.config import add_method_schema

            add_method_schema(name, schema)
            PLUGIN_METHODS[name] = cls
        return METHODS.register(name)(cls)

    return deco
