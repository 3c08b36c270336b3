"""``pe``: Private Evolution (Lin et al. 2023, "Differentially Private Synthetic Data via Foundation Model APIs 1:
Images", Alg. 1 and its class-conditional Alg. 3).

PE never trains on private data. It starts from ``S_0 = RANDOM_API(N)`` of a public model and, for t = 1..T:

1. embeds the population (lookahead: the mean embedding of k variations at the iteration's degree);
2. lets every private sample vote for its nearest synthetic sample: the DP nearest-neighbour histogram
   (:mod:`dpsyn.methods.pe.histogram`: Gaussian noise sigma on every count, threshold H) — one ledger event;
3. draws N parents in proportion to the thresholded histogram (``selection: sample``; ``rank`` keeps the top ones);
4. ``S_t = VARIATION_API(parents, degree_t)`` (:mod:`dpsyn.methods.pe.api`); parents are not kept.

Privacy (the paper's Theorem 1 via GDP): T adaptive sensitivity-1 Gaussian releases with noise multiplier sigma are
``mu``-GDP with ``mu = sqrt(T) / sigma``; sigma is calibrated once, before the loop, for the configured T
(:func:`dpsyn.privacy.gdp_noise_multiplier`), or given as ``method.noise_multiplier`` and then checked against the
target. The ledger gets one Gaussian event per histogram (and one for DP class counts when used), composed exactly.
Class-conditional PE (``conditional: true``): a private sample of class c votes only among class-c synthetic samples
(parallel composition: still one sensitivity-1 release per iteration). The number of synthetic samples per class is
``class_proportions``: ``uniform`` (N / classes, no private information), ``public`` (the private class proportions
declared public: the ledger labels say so, they are not protected) or ``dp`` (one more Gaussian release of the class
counts, with the same sigma, calibrated into the T + 1 releases).

Checkpoints (``checkpoint: true``): after every histogram (the noisy histogram and the ledger) and after every
iteration (the population and the ledger), atomically, in ``<run_dir>/checkpoints/pe.pt``. A resumed run restores
the ledger from the checkpoint and reuses a saved histogram instead of computing a new one, so no privacy is spent
twice or forgotten; a checkpoint made under another calibration or schedule is refused. Each histogram is charged
before it is computed (the run's journal holds it, :meth:`dpsyn.privacy.PrivacyLedger.attach_journal`); a histogram
of a killed attempt that its last checkpoint missed stays charged, and since sigma is calibrated for T releases the
loop stops when the charged releases reach them (fewer iterations after such a crash, epsilon within the target).

Monitoring: with ``monitor: true`` each population's FD and precision/recall against the evaluation split
(:func:`dpsyn.metrics.make_monitor`) are logged (W&B, the progress line, result.json's provenance). They are never
used to choose anything (no selection on the test set). ``sample(n)`` beyond the population size returns more
variations of the final population (the paper's "unlimited samples", Sec. 4.1): post-processing.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import time
from typing import Any

import numpy as np
import torch

from dpsyn.data.base import Split
from dpsyn.methods.base import METHODS, Method, PrivacyBudget, RunContext, Samples
from dpsyn.methods.pe.api import PEAPI, DiffusionAPI, ICGANAPI, Population
from dpsyn.methods.pe.histogram import dp_nn_histogram, select_parents
from dpsyn.methods.session import FitSession
from dpsyn.methods.public_baselines import (
    build_public_pool,
    centroid_labels,
    private_label_map,
    public_class_names,
)
from dpsyn.privacy import (
    GaussianEvent,
    NonPrivateEvent,
    PrivacyEvent,
    PrivacyLedger,
    dp_numpy_generator,
    gaussian_mechanism,
    gdp_noise_multiplier,
)
from dpsyn.methods.tiny import IMAGE_METRICS, TINY_PE, TINY_PUBLIC
from dpsyn.config.schema import PE_EMBEDDINGS as EMBEDDINGS
from dpsyn.config.schema import PE_CLASS_PROPORTIONS as CLASS_PROPORTIONS

log = logging.getLogger(__name__)

CHECKPOINT = "pe.pt"
CHECKPOINT_VERSION = 1


# ----------------------------------------------------------------------------------------------------------------
# calibration (pure)


def pe_releases(cfg: Any) -> int:
    """Sensitivity-1 Gaussian releases a PE run makes: one histogram per degree, plus the class counts when
    ``conditional`` and ``class_proportions: dp``."""
    extra = 1 if cfg.get("conditional") and cfg.get("class_proportions") == "dp" else 0
    return len(list(cfg.degrees)) + extra


def pe_noise_multiplier(*, epsilon: float, delta: float, releases: int, noise_multiplier: float | None) -> float:
    """Sigma of every release: calibrated from (epsilon, delta) for ``releases`` Gaussian releases, or the given
    ``noise_multiplier`` after checking that it stays within epsilon. 0 for a non-private run (eps = inf, none given).

    Raises:
        ValueError: a given noise multiplier that would spend more than epsilon (before any work).
    """
    if noise_multiplier is not None:
        nm = float(noise_multiplier)
        if not nm > 0 or not math.isfinite(nm):
            raise ValueError(f"method.noise_multiplier={noise_multiplier!r} must be a finite number > 0 (or null)")
        if math.isfinite(epsilon):
            plan = GaussianEvent(noise_multiplier=nm, count=releases, label="pe: the run's Gaussian releases")
            check = PrivacyLedger(target_epsilon=epsilon, delta=delta)
            if check.would_exceed(plan):
                spent = check.epsilon_if(plan)
                raise ValueError(
                    f"method.noise_multiplier={nm:g} with {releases} releases spends eps={spent:.4g} > target eps="
                    f"{epsilon:g} at delta={delta:g}: raise eps (eps>={spent:.4g}) or leave noise_multiplier null"
                )
        return nm
    if not math.isfinite(epsilon):
        return 0.0
    return gdp_noise_multiplier(epsilon=epsilon, steps=releases, delta=delta)


def class_sizes(n: int, proportions: np.ndarray) -> dict[int, int]:
    """``n`` split over classes in proportion (largest remainders; every class with positive weight gets >= 1)."""
    p = np.maximum(np.asarray(proportions, dtype=np.float64), 0.0)
    if not p.sum() > 0:
        p = np.ones_like(p)
    p = p / p.sum()
    base = np.floor(p * n).astype(np.int64)
    base[(p > 0) & (base == 0)] = 1
    while base.sum() > n:  # the minimum of 1 per class may overshoot
        base[np.argmax(base)] -= 1
    rest = np.argsort(-(p * n - base), kind="stable")
    for i in range(int(n - base.sum())):
        base[rest[i % len(rest)]] += 1
    return {c: int(k) for c, k in enumerate(base)}


def _fingerprint(blob: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(blob, sort_keys=True, default=str).encode()).hexdigest()[:16]


# ----------------------------------------------------------------------------------------------------------------
# the method


@METHODS.register("pe")
class PE(Method):
    """Private Evolution over a public model's APIs (module docstring)."""

    # T = len(degrees) sensitivity-1 histograms (+1 for DP class counts) at one sigma (given, or calibrated)
    accounting_keys = ("degrees", "noise_multiplier", "conditional", "class_proportions")
    tunable_keys = ("threshold", "lookahead", "selection", "rank_keep", "feature_noise", "population", "final_degree",
                    "num_nearest")
    tiny = ("method=pe", "dataset=fmnist_shoes", *TINY_PUBLIC, *TINY_PE, "dataset.n_private=300", "metrics.n_real=300",
            "method.monitor=false", "method.public_pool=300", *IMAGE_METRICS)

    needs_public = True
    kinds = ("image",)
    fitted_attrs = ("models", "pool", "final", "sigma", "T", "history", "per_class", "fit_seconds", "fingerprint")
    resume_free_keys = ("checkpoint", "monitor")  # whether to checkpoint; monitoring (never selected on)

    def __init__(self, cfg: Any, ctx: RunContext) -> None:
        super().__init__(cfg, ctx)
        # the choices and ranges are checked at compose time (dpsyn.config.schema.PESchema)
        self.backend = str(cfg.backend)
        self.embedding = str(cfg.embedding)
        self.selection = str(cfg.selection)
        self.knn_backend = str(cfg.knn_backend)
        self.nn_index = str(cfg.nn_index)
        self.condition = str(cfg.condition)
        self.class_proportions = str(cfg.class_proportions)
        self.other_classes = str(cfg.other_classes)
        self.conditional = bool(cfg.conditional)
        self.population = int(cfg.population)
        self.degrees = [float(d) for d in cfg.degrees]
        self.final_degree = float(cfg.final_degree) if cfg.get("final_degree") is not None else self.degrees[-1]
        self.lookahead = int(cfg.lookahead)
        self.num_nearest = int(cfg.num_nearest)
        self.threshold = float(cfg.threshold)
        if self.conditional and self.population < ctx.num_classes:
            raise ValueError(f"method.population={self.population} must be >= the number of classes "
                             f"({ctx.num_classes}) for class-conditional PE")
        self.history: list[dict[str, Any]] = []

    # ---------------------------------------------------------------- set-up

    def _api(self, models: Any, pool: Any, public: Split | None,
             public_of_private: np.ndarray | None = None) -> PEAPI:
        """The backend's APIs; ``public_of_private`` (diffusion: the public class of each private class) is mapped
        from the public split's class names unless given (a restored fitted state)."""
        if self.backend == "icgan":
            return ICGANAPI(models, pool, feature_noise=float(self.cfg.feature_noise))
        from dpsyn.public.diffusion import load_diffusion_model

        model = load_diffusion_model(self.ctx.public, cache_dir=self.ctx.cache_dir or ".",
                                     data_dir=self.ctx.data_dir or ".")
        if public_of_private is not None:
            return DiffusionAPI(model, public_of_private, condition=self.condition)
        names, _ = public_class_names(self.ctx, models, public)
        public_of_private = np.full(self.ctx.num_classes, -1, dtype=np.int64)
        for public_id, private_id in enumerate(private_label_map(names, list(self.ctx.classes))):
            if private_id >= 0:
                public_of_private[private_id] = public_id
        if self.conditional and (public_of_private < 0).any() and int(getattr(model, "num_classes", 0) or 0) > 0:
            missing = [self.ctx.classes[c] for c in np.flatnonzero(public_of_private < 0)]
            log.warning("pe: private classes without a public class of the same name (%s) get random public "
                        "conditions (condition=%s)", ", ".join(missing), self.condition)
        return DiffusionAPI(model, public_of_private, condition=self.condition)

    def _embedder(self, models: Any) -> Any:
        if self.embedding == "encoder":
            return lambda x: np.asarray(models.encode(x), dtype=np.float32)
        from dpsyn.metrics.features import build_feature_extractor

        ext = build_feature_extractor("inception")
        return lambda x: np.asarray(ext.extract(x)["features"], dtype=np.float32)

    def _generator(self, *parts: Any) -> torch.Generator:
        """Seeded from the run seed and ``parts`` (iteration, purpose): not DP noise, and a resumed run redraws the
        same latents."""
        digest = hashlib.sha256(json.dumps([self.ctx.seed, *parts]).encode()).digest()
        return torch.Generator().manual_seed(int.from_bytes(digest[:8], "little") >> 1)

    def fitted_state(self) -> dict[str, Any] | None:
        """The final population and its history; the API is named, not stored (it holds the public models)."""
        state = super().fitted_state() or {}
        state["api"] = ({"public_of_private": self.api.public_of_private} if isinstance(self.api, DiffusionAPI)
                        else {})
        return state

    def load_fitted_state(self, state: dict[str, Any]) -> None:
        """Restore the population and rebuild the API over the public models (loaded again)."""
        state = dict(state)
        api = state.pop("api")
        super().load_fitted_state(state)
        self.api = self._api(self.models, self.pool, None, public_of_private=api.get("public_of_private"))

    # ---------------------------------------------------------------- fit

    def fit(
        self, private: Split, budget: PrivacyBudget, ledger: PrivacyLedger, public: Split | None = None
    ) -> None:
        if public is None:
            raise ValueError("pe needs a dataset with public data (e.g. fmnist_all, fmnist_shoes, fmnist_tops, digits)")
        t_start = time.perf_counter()
        releases = pe_releases(self.cfg)
        sigma = pe_noise_multiplier(epsilon=budget.epsilon, delta=budget.delta, releases=releases,
                                    noise_multiplier=self.cfg.get("noise_multiplier"))
        self.sigma, self.T = sigma, len(self.degrees)
        # the typed config (a new hyperparameter cannot be missed), the sigma and the private set's size
        self.fingerprint = _fingerprint(self.resume_fingerprint(budget, sigma=sigma, n_private=len(private)))
        # paper 000's public models: the icgan backend, the encoder embedding, and the labels of unconditional
        # samples need them; conditional PE on a diffusion model with Inception embeddings (CIFAR-10) does not
        need_pool = self.backend == "icgan" or not self.conditional
        models = self.public_models() if need_pool or self.embedding == "encoder" else None
        self.models = models
        self.pool = build_public_pool(models, public, self.ctx, max_rows=self.cfg.get(
            "public_pool"), other_classes=self.other_classes) if need_pool else None
        self.api = self._api(models, self.pool, public)
        embed = self._embedder(models)
        noise_rng = dp_numpy_generator(deterministic=self.ctx.deterministic_noise, seed=self.ctx.seed) if sigma > 0 else None
        declared = " (class proportions declared public: not protected)" if (
            self.conditional and self.class_proportions == "public") else ""

        def event(what: str) -> PrivacyEvent:
            if sigma > 0:
                return GaussianEvent(noise_multiplier=sigma, count=1,
                                     label=f"pe {what}: sensitivity-1 Gaussian, sigma={sigma:.6g}{declared}")
            return NonPrivateEvent(label=f"pe {what}: no noise (eps=inf){declared}")

        pop: Population | None = None

        def values() -> dict[str, Any]:  # what a checkpoint holds: the population after iteration `iteration`
            return {"iteration": s.step, "stage": "done", "population": pop.state(), "per_class": self.per_class,
                    "history": self.history}

        # checkpoints (another calibration, schedule, population, backend or seed is refused): after RANDOM_API,
        # after every histogram (stage "histogram": reused on resume, never made again) and after every iteration
        with FitSession(self.ctx, ledger, CHECKPOINT, self.fingerprint, values=values, total=self.T, desc="pe",
                        every=1 if bool(self.cfg.get("checkpoint", True)) else 0, version=CHECKPOINT_VERSION,
                        bar_disable=False) as s:
            s.open()  # on resume: the checkpoint's ledger, merged with the journal of the interrupted attempt
            priv_emb = embed(private.x)
            priv_labels = np.asarray(private.y, dtype=np.int64) if self.conditional else None
            if s.resumed:
                state = s.saved.state
                self.history = list(state.get("history", []))
                pop = Population.from_state(state["population"])
                self.per_class = state["per_class"]
                saved_hist = state.get("histogram") if state["stage"] == "histogram" else None
                log.info("pe: resuming at iteration %d (%s); ledger restored with %d events", s.step, state["stage"],
                         len(ledger))
            else:
                per_class = self._class_sizes(private, ledger, event, noise_rng)
                if per_class is None:
                    labels0 = np.full(self.population, -1, dtype=np.int64)
                else:
                    labels0 = np.concatenate([np.full(k, c, dtype=np.int64) for c, k in sorted(per_class.items())])
                pop = self.api.random_api(labels0, generator=self._generator("random"))
                self.per_class = per_class
                self._log_iteration(0, pop, extra={"degree": None})
                saved_hist = None
                s.save()

            for t in s.steps():
                degree = self.degrees[t]
                if saved_hist is not None:  # the release was made before the interruption: reuse it, spend nothing
                    thresholded, note_hist = np.asarray(saved_hist["thresholded"]), "reused from checkpoint"
                    saved_hist = None
                else:
                    # sigma was calibrated for `releases`: a killed attempt's releases after its last checkpoint
                    # (kept from the journal) take the place of the last iterations
                    if sigma > 0 and s.plan_spent(self._releases_charged(ledger), releases):
                        break
                    syn_emb = self._lookahead_embedding(pop, degree, embed, t)
                    s.charge(event(f"histogram {t + 1}/{self.T}"))
                    hist = dp_nn_histogram(
                        priv_emb, syn_emb, noise_multiplier=sigma, threshold=self.threshold, rng=noise_rng,
                        private_labels=priv_labels, synthetic_labels=pop.labels if self.conditional else None,
                        num_nearest=self.num_nearest, backend=self.knn_backend, nn_index=self.nn_index,
                    )
                    thresholded, note_hist = hist.thresholded, ""
                    s.save(stage="histogram", histogram={"noisy": hist.noisy, "thresholded": hist.thresholded})
                parents, note = select_parents(
                    thresholded, self.population, mode=self.selection, rng=np.random.default_rng([self.ctx.seed, t]),
                    rank_keep=float(self.cfg.rank_keep), labels=pop.labels if self.conditional else None,
                    per_class=self.per_class,
                )
                pop = self.api.variation_api(pop.take(parents), degree=degree,
                                             generator=self._generator("variation", t))
                extra = {"degree": degree, "nonzero_counts": int((thresholded > 0).sum()),
                         "distinct_parents": int(len(np.unique(parents)))}
                if note or note_hist:
                    extra["note"] = "; ".join(x for x in (note, note_hist) if x)
                metrics = self._log_iteration(t + 1, pop, extra=extra)
                if metrics:
                    s.show(**{k: f"{v:.3g}" for k, v in metrics.items() if isinstance(v, float)})
        self.final = pop
        self.fit_seconds = time.perf_counter() - t_start

    def _releases_charged(self, ledger: PrivacyLedger) -> int:
        """The sensitivity-1 Gaussian releases at this run's sigma the ledger charges (those of interrupted attempts
        included): the loop stops when they reach :func:`pe_releases`, what sigma was calibrated for."""
        return sum(e.count for e in ledger.events if isinstance(e, GaussianEvent)
                   and e.noise_multiplier == self.sigma)

    def _class_sizes(self, private: Split, ledger: PrivacyLedger, event: Any,
                     noise_rng: np.random.Generator | None) -> dict[int, int] | None:
        """Synthetic samples per class (class-conditional PE), per ``class_proportions``; None when unconditional."""
        if not self.conditional:
            return None
        k = self.ctx.num_classes
        if self.class_proportions == "uniform":
            return class_sizes(self.population, np.ones(k))
        counts = np.bincount(np.asarray(private.y, dtype=np.int64), minlength=k).astype(np.float64)
        if self.class_proportions == "dp":
            ledger.add(event("class counts"))
            if self.sigma > 0:
                counts = gaussian_mechanism(counts, self.sigma, generator=noise_rng)
        return class_sizes(self.population, np.maximum(counts, 0.0))

    def _lookahead_embedding(self, pop: Population, degree: float, embed: Any, t: int) -> np.ndarray:
        """``Phi(z)`` (lookahead 0) or the mean embedding of ``lookahead`` variations of every sample."""
        if self.lookahead == 0:
            return embed(pop.x)
        total = None
        for i in range(self.lookahead):
            v = self.api.variation_api(pop, degree=degree, generator=self._generator("lookahead", t, i))
            e = embed(v.x).astype(np.float64)
            total = e if total is None else total + e
        return (total / self.lookahead).astype(np.float32)

    def _log_iteration(self, t: int, pop: Population, *, extra: dict[str, Any]) -> dict[str, Any]:
        """Record iteration ``t``'s monitoring metrics (FD etc. against the eval split: monitoring only)."""
        metrics: dict[str, Any] = {}
        monitor = getattr(self.ctx, "monitor", None)
        if monitor is not None and bool(self.cfg.get("monitor", True)):
            metrics = dict(monitor(pop.x))
        self.history.append({"iteration": t, **extra, **metrics})
        if self.ctx.logger is not None and metrics:
            self.ctx.logger.log_metrics({f"pe/{k}": v for k, v in metrics.items()}, step=t)
        if metrics:
            log.info("pe iteration %d/%d: %s", t, len(self.degrees),
                     ", ".join(f"{k}={v:.4g}" for k, v in metrics.items() if isinstance(v, float)))
        return metrics

    # ---------------------------------------------------------------- sampling (post-processing)

    def _labels_for(self, pop: Population) -> np.ndarray:
        """Private-space labels: the population's own (conditional), else the private class whose public centroid is
        nearest in the encoder's space (public data only)."""
        if self.conditional:
            return pop.labels
        feats = np.asarray(self.models.encode(pop.x), dtype=np.float32)
        drawable = self.pool.labels >= 0
        labels, _ = centroid_labels(feats, self.pool.feats[drawable], self.pool.labels[drawable], self.ctx.num_classes)
        return labels

    def sample(self, n: int, labels: np.ndarray | None = None) -> Samples:
        pop = self.final
        rng = np.random.default_rng([self.ctx.seed, 10**6])
        if labels is not None and self.conditional:
            idx = np.empty(len(labels), dtype=np.int64)
            for c in np.unique(labels):
                rows = np.flatnonzero(pop.labels == c)
                if len(rows) == 0:
                    raise ValueError(f"pe: the final population has no sample of class {c}")
                where = np.flatnonzero(labels == c)
                idx[where] = rng.choice(rows, size=len(where), replace=len(where) > len(rows))
            n = len(labels)
        else:
            idx = rng.permutation(len(pop))[:n] if n <= len(pop) else np.concatenate(
                [rng.permutation(len(pop)), rng.choice(len(pop), size=n - len(pop), replace=True)])
        # "unlimited samples": every repeat of a population row after its first becomes a variation of it
        fresh = np.ones(n, dtype=bool)
        fresh[np.unique(idx, return_index=True)[1]] = False
        out = pop.take(idx)
        if fresh.any():
            varied = self.api.variation_api(out.take(np.flatnonzero(fresh)), degree=self.final_degree,
                                            generator=self._generator("unlimited"))
            out.x[fresh] = varied.x
        y = self._labels_for(out)
        return Samples(out.x, y, {
            "method": "pe", "backend": self.backend, "api": self.api.describe(),
            "variant": f"{self.backend}, {'conditional' if self.conditional else 'unconditional'}", "embedding": self.embedding,
            "iterations": self.T, "population": self.population, "noise_multiplier": self.sigma,
            "threshold": self.threshold, "lookahead": self.lookahead, "selection": self.selection,
            "conditional": self.conditional, "class_proportions": self.class_proportions if self.conditional else None,
            "variations_beyond_population": int(fresh.sum()), "final_degree": self.final_degree,
            "labels": "population's classes" if self.conditional else "nearest public class centroid (encoder space)",
            "history": self.history, "accounting": f"GDP: mu = sqrt({pe_releases(self.cfg)})/sigma",
        })

    def report(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """The monitored metrics of the first (RANDOM_API) and the last population, at the population size."""
        if not self.history:
            return {}, {}
        first, last = self.history[0], self.history[-1]
        values, info = {}, {}
        for key, v in first.items():
            if key.startswith(("fd", "fid", "precision", "recall")) and isinstance(v, float) and key in last:
                values[f"pe_{key}_iter0"], values[f"pe_{key}_last"] = v, last[key]
                what = f"{key} of the population (n={self.population}) vs the eval split: monitoring, never selected on"
                info[f"pe_{key}_iter0"] = {"what": what + "; iteration 0 = RANDOM_API"}
                info[f"pe_{key}_last"] = {"what": what + f"; after iteration {self.T}"}
        return values, info
