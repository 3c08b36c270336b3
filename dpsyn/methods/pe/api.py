"""PE's two model APIs (Lin et al. 2023, Sec. 3): ``RANDOM_API`` and ``VARIATION_API`` over a public model.

PE never trains on private data: it only asks a public generative model for random samples and for variations of
given samples. A :class:`Population` carries, per sample, the image, its private-space label (class-conditional PE;
-1 otherwise) and the backend's *public condition* (a public class id, an instance feature and its noise z), which
variations keep (the paper's App. G: a variation of a sample generated for a condition stays under that condition).

Backends (``method.backend``):

* ``diffusion``: the public diffusion model of ``public.diffusion`` (:mod:`dpsyn.public.diffusion`: the embedded
  UNet2DModel trained on ``fmnist_public``, improved-diffusion's ImageNet checkpoints, or Stable Diffusion). RANDOM_API
  = DDIM sampling under a public condition; VARIATION_API = SDEdit (noise to the degree's timestep, denoise).
  Condition of a sample: the public class with the same name as its private class (class-conditional PE), else a
  uniformly drawn public class (``condition: random_class``, what DPSDA does with ImageNet's classes) or none.
* ``icgan``: the instance-conditioned generator g(z, h) of paper 000's public models. RANDOM_API = a public image's
  feature h (of the sample's class when conditional) with a fresh z; VARIATION_API at degree s in (0, 1]:
  ``z' = sqrt(1 - s^2) z + s e`` (e ~ N(0, I): z' stays N(0, I), s = 1 is a fresh z) and
  ``h' = normalise(h + s * feature_noise * u / sqrt(d))`` (u ~ N(0, I)): the larger the degree, the further the
  sample moves. Cheap on CPU, and it lets PE and DP-MGE/DP-DRE share one public model.

Degrees are one convention for every backend: a number in (0, 1], larger = more variation (for diffusion the
fraction of the noise schedule SDEdit starts from). Randomness here (latents, diffusion noise) follows the run seed
through the ``generator`` passed in: it is not DP noise (the private data never reach this module).
"""

from __future__ import annotations

import abc
import logging
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from dpsyn.config.schema import PE_BACKENDS as BACKENDS
from dpsyn.config.schema import PE_CONDITIONS as CONDITIONS

log = logging.getLogger(__name__)



@dataclass
class Population:
    """Synthetic samples and what their variations must keep.

    Attributes:
        x: float32 (N, C, H, W) images in [0, 1].
        labels: int64 (N,) private-space class of each sample (class-conditional PE), -1 when unconditional.
        cond: backend state per row (each array has N rows): ``public_label`` (diffusion), ``feature`` and ``z``
            (icgan).
    """

    x: np.ndarray
    labels: np.ndarray
    cond: dict[str, np.ndarray] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.x)

    def take(self, idx: np.ndarray) -> Population:
        """The rows ``idx`` (repeats allowed), as a new population."""
        return Population(self.x[idx], self.labels[idx], {k: v[idx] for k, v in self.cond.items()})

    def state(self) -> dict[str, np.ndarray]:
        """Flat arrays for a checkpoint."""
        return {"x": self.x, "labels": self.labels, **{f"cond/{k}": v for k, v in self.cond.items()}}

    @staticmethod
    def from_state(state: dict[str, np.ndarray]) -> Population:
        cond = {k.removeprefix("cond/"): np.asarray(v) for k, v in state.items() if k.startswith("cond/")}
        return Population(np.asarray(state["x"], dtype=np.float32), np.asarray(state["labels"], dtype=np.int64), cond)


class PEAPI(abc.ABC):
    """RANDOM_API and VARIATION_API of one public model (DPSDA's API: ``random_api(label_info, n)``,
    ``variation_api(samples)``)."""

    name: str = ""

    @abc.abstractmethod
    def random_api(self, labels: np.ndarray, *, generator: torch.Generator) -> Population:
        """One fresh sample per entry of ``labels`` (private-space class, or -1 = unconditional)."""

    @abc.abstractmethod
    def variation_api(self, population: Population, *, degree: float, generator: torch.Generator) -> Population:
        """One variation of every sample, at ``degree`` in (0, 1]; labels and public conditions are kept."""

    def describe(self) -> dict[str, Any]:
        """Provenance of the public model (JSON-serialisable)."""
        return {"backend": self.name}


def check_degree(degree: float) -> float:
    """``degree`` as a float in (0, 1], else a one-line ValueError."""
    d = float(degree)
    if not 0 < d <= 1:
        raise ValueError(f"PE variation degree {degree!r} must be in (0, 1] (1 = a fresh sample)")
    return d


def _rng_from(generator: torch.Generator) -> np.random.Generator:
    """A numpy generator derived from a torch one (for index draws), advancing the torch generator."""
    return np.random.default_rng(int(torch.randint(0, 2**62, (1,), generator=generator).item()))


class ICGANAPI(PEAPI):
    """PE over paper 000's instance-conditioned generator (module docstring).

    Args:
        models: :class:`dpsyn.public.PublicModels` (encoder h, generator g).
        pool: the encoded public rows with private-space labels (:func:`dpsyn.methods.public_baselines.build_public_pool`):
            conditional random samples start from public rows of their class (``pool.labels``).
        feature_noise: scale of the feature perturbation at degree 1.
    """

    name = "icgan"

    def __init__(self, models: Any, pool: Any, *, feature_noise: float = 1.0) -> None:
        if not feature_noise > 0:
            raise ValueError(f"method.feature_noise={feature_noise!r} must be > 0")
        self.models, self.pool, self.feature_noise = models, pool, float(feature_noise)
        self.z_dim = int(models.generator.z_dim)

    def _decode(self, feature: np.ndarray, z: np.ndarray) -> np.ndarray:
        return np.asarray(self.models.generator.decode(feature, z=z), dtype=np.float32)

    def random_api(self, labels: np.ndarray, *, generator: torch.Generator) -> Population:
        labels = np.asarray(labels, dtype=np.int64)
        rng = _rng_from(generator)
        rows = np.empty(len(labels), dtype=np.int64)
        uncond = labels < 0
        if uncond.any():
            rows[uncond] = rng.choice(len(self.pool), size=int(uncond.sum()), replace=True)
        for c in np.unique(labels[~uncond]):
            where = np.flatnonzero(labels == c)
            pool_rows = np.flatnonzero(self.pool.labels == c)
            if len(pool_rows) == 0:
                raise ValueError(f"icgan RANDOM_API: no public row is labelled with private class {c}")
            rows[where] = rng.choice(pool_rows, size=len(where), replace=True)
        feature = self.pool.feats[rows].astype(np.float32)
        z = torch.randn(len(labels), self.z_dim, generator=generator).numpy()
        return Population(self._decode(feature, z), labels, {"feature": feature, "z": z})

    def variation_api(self, population: Population, *, degree: float, generator: torch.Generator) -> Population:
        s = check_degree(degree)
        z, h = population.cond["z"], population.cond["feature"]
        e = torch.randn(z.shape, generator=generator).numpy()
        u = torch.randn(h.shape, generator=generator).numpy()
        z2 = (np.sqrt(1.0 - s * s) * z + s * e).astype(np.float32)
        h2 = h + s * self.feature_noise * u / np.sqrt(h.shape[1])
        h2 = (h2 / np.maximum(np.linalg.norm(h2, axis=1, keepdims=True), 1e-12)).astype(np.float32)
        return Population(self._decode(h2, z2), population.labels.copy(), {"feature": h2, "z": z2})

    def describe(self) -> dict[str, Any]:
        return {"backend": self.name, "feature_noise": self.feature_noise,
                "public_models": {k: (v.get("key") if isinstance(v, dict) else v)
                                  for k, v in (self.models.record or {}).items() if k in ("encoder", "generator")}}


class DiffusionAPI(PEAPI):
    """PE over a public diffusion model (:mod:`dpsyn.public.diffusion`), public class ids as conditions.

    Args:
        model: has ``random(labels, *, generator)``, ``variation(images, labels, *, degree, generator)`` and
            ``num_classes`` (public conditions; 0 = unconditional).
        public_of_private: (num_private_classes,) the public class id with the same name as each private class,
            -1 where none (from the public class names; no private data involved).
        condition: how an unconditional sample gets its public condition: ``random_class`` or ``none``.
    """

    name = "diffusion"

    def __init__(self, model: Any, public_of_private: np.ndarray, *, condition: str = "random_class") -> None:
        if condition not in CONDITIONS:
            raise ValueError(f"method.condition={condition!r}; allowed: {', '.join(CONDITIONS)}")
        self.model, self.condition = model, condition
        self.public_of_private = np.asarray(public_of_private, dtype=np.int64)

    def public_labels(self, labels: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """The public condition of new samples with these private-space labels (see the class docstring)."""
        labels = np.asarray(labels, dtype=np.int64)
        out = np.full(len(labels), -1, dtype=np.int64)
        k = int(getattr(self.model, "num_classes", 0) or 0)
        cond = labels >= 0
        if cond.any() and len(self.public_of_private):
            out[cond] = self.public_of_private[labels[cond]]
        draw = out < 0
        if self.condition == "random_class" and k > 0 and draw.any():
            out[draw] = rng.integers(0, k, size=int(draw.sum()))
        return out

    def random_api(self, labels: np.ndarray, *, generator: torch.Generator) -> Population:
        labels = np.asarray(labels, dtype=np.int64)
        public = self.public_labels(labels, _rng_from(generator))
        x = np.asarray(self.model.random(public, generator=generator), dtype=np.float32)
        return Population(x, labels, {"public_label": public})

    def variation_api(self, population: Population, *, degree: float, generator: torch.Generator) -> Population:
        s = check_degree(degree)
        public = population.cond["public_label"]
        x = np.asarray(self.model.variation(population.x, public, degree=s, generator=generator), dtype=np.float32)
        return Population(x, population.labels.copy(), {"public_label": public.copy()})

    def describe(self) -> dict[str, Any]:
        record = getattr(self.model, "record", {}) or {}
        return {"backend": self.name, "condition": self.condition,
                "model": {k: record.get(k) for k in ("key", "name", "checkpoint", "sha256", "shipped") if k in record}}
