"""Paper 000's baselines DP-GAN-FT, DP-MEPF and DP-GAN-MI: end-to-end runs at smoke scale, their privacy
accounting, where private data may go, and that their DP noise is not reproducible from the run seed.

Tiny public models (600 public images, one encoder epoch, 20 IC-GAN steps) keep the whole file near a minute.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from dpsyn.privacy import PrivacyLedger, gaussian_sigma
from tests.tiny import TINY_PUBLIC

SMOKE = ("dataset=fmnist_shoes", "dataset.n_private=600", "metrics.names.image=[]", "metrics.n_samples=60",
         "trainer.enable_progress_bar=false", *TINY_PUBLIC)
FAST = {
    "dp_gan_ft": ("method.pretrain_steps=10", "method.max_public=400"),
    "dp_gan_mi": (),
    "dp_mepf": ("method.steps=3", "method.batch_size=12"),
}


def _run(make_cfg, tmp_path: Path, method: str, *over: str) -> dict[str, Any]:
    from dpsyn.task import run

    run_dir = tmp_path / f"run{len(list(tmp_path.glob('run*')))}"
    return run(make_cfg(f"method={method}", *SMOKE, *FAST[method], *over), run_dir)


# ------------------------------------------------------------------------------------------------ pure functions


def test_split_budget_never_exceeds_the_totals_and_rejects_bad_fractions() -> None:
    from dpsyn.privacy import split_budget  # dp_mepf's split, now dpsyn.privacy's (dp_mge's too)

    shares = split_budget(epsilon=1.0, delta=1e-5, fractions={"m1": 0.45, "m2": 0.45, "counts": 0.1})
    assert math.fsum(e for e, _ in shares.values()) <= 1.0
    assert math.fsum(d for _, d in shares.values()) <= 1e-5
    assert shares["m1"][0] == pytest.approx(0.45) and shares["counts"][1] == pytest.approx(1e-6)
    with pytest.raises(ValueError, match="sum to 1"):
        split_budget(epsilon=1.0, delta=1e-5, fractions={"m1": 0.5, "m2": 0.4})
    with pytest.raises(ValueError, match="> 0"):
        split_budget(epsilon=1.0, delta=1e-5, fractions={"m1": 1.0, "m2": 0.0})


def test_moment_sums_have_sensitivity_one_and_the_loss_vanishes_at_the_target() -> None:
    from dpsyn.methods.dp_mepf import mepf_loss, moment_sums

    rng = np.random.default_rng(0)
    phi = rng.normal(size=(50, 7)).astype(np.float32) * 3  # norms well above 1: the sums must clip them
    g = rng.integers(0, 3, size=50)
    s1, s2, counts, clipped = moment_sums(iter([(phi, g)]), 3)
    t1, t2, _, _ = moment_sums(iter([(phi[:-1], g[:-1])]), 3)  # the neighbour without the last example
    assert clipped == 50 and counts.sum() == 50
    assert np.linalg.norm(s1 - t1) <= 1.0 + 1e-12 and np.linalg.norm(s2 - t2) <= 1.0 + 1e-12
    m1, m2 = torch.tensor(s1 / counts[:, None]), torch.tensor(s2 / counts[:, None])
    v = torch.tensor(phi, dtype=torch.float64)
    v = v / v.norm(dim=1, keepdim=True).clamp_min(1.0)
    assert mepf_loss(v, torch.tensor(g), m1, m2).item() == pytest.approx(0.0, abs=1e-10)
    assert mepf_loss(v.flip(0), torch.tensor(g), m1, m2).item() > 1e-3


def test_perceptual_features_are_unit_norm_and_layer_names_are_checked() -> None:
    from dpsyn.methods.dp_mepf import PerceptualFeatures, resolve_layers
    from dpsyn.public import EmbeddedEncoder

    enc = EmbeddedEncoder(feature_dim=8, width=4)
    phi = PerceptualFeatures(enc, resolve_layers(enc, "auto"))
    x = torch.rand(5, 1, 28, 28, requires_grad=True)
    out = phi(x)
    assert out.shape == (5, 4 * 14 * 14 + 8 * 7 * 7 + 8)
    torch.testing.assert_close(out.norm(dim=1), torch.ones(5))
    out.sum().backward()  # differentiable in the image, the encoder frozen
    assert x.grad is not None and all(p.grad is None for p in enc.parameters())
    with pytest.raises(ValueError, match="not a layer of the encoder"):
        PerceptualFeatures(enc, ["body.99"])


# ------------------------------------------------------------------------------------------------ end to end


@pytest.mark.slow  # the run itself is covered by test_all_methods; this adds eps=inf and each event kind
@pytest.mark.parametrize("method", ["dp_gan_ft", "dp_mepf", "dp_gan_mi"])
@pytest.mark.parametrize("eps", ["1", "inf"])
def test_runs_end_to_end_within_budget(make_cfg, tmp_path: Path, method: str, eps: str) -> None:
    result = _run(make_cfg, tmp_path, method, f"eps={eps}")
    run_dir = Path(result["run_dir"])
    events = result["privacy_events"]
    ledger = PrivacyLedger.load(run_dir / "privacy.json")
    if eps == "inf":
        assert math.isinf(result["epsilon_spent"]) and [e["kind"] for e in events] == ["non_private"]
    else:
        assert result["epsilon_spent"] <= 1.0 and ledger.epsilon() <= 1.0
        kinds = {e["kind"] for e in events}
        assert kinds == ({"approx_dp"} if method == "dp_mepf" else {"sampled_gaussian"})
        if method != "dp_mepf":
            (event,) = events
            assert event["accountant"] == "rdp" and event["sampling"] == "poisson" and event["steps"] >= 1
    with np.load(run_dir / "samples.npz") as npz:
        x, y = npz["x"], npz["y"]
    assert x.shape == (60, 1, 28, 28) and x.dtype == np.float32 and 0.0 <= x.min() and x.max() <= 1.0
    assert set(np.unique(y)) == {0, 1, 2}  # labelled: downstream accuracy can be scored


def test_dp_mepf_noise_scale_is_gaussian_sigma_of_its_split(make_cfg, tmp_path: Path, monkeypatch) -> None:
    import dpsyn.methods.dp_mepf as mepf

    calls = []
    original = mepf.release_means

    def spy(sums, counts, sigma, rng):
        out = original(sums, counts, sigma, rng)
        calls.append({"sigma": sigma, "noise": out.astype(np.float64) * counts[:, None] - sums})
        return out

    monkeypatch.setattr(mepf, "release_means", spy)
    result = _run(make_cfg, tmp_path, "dp_mepf", "eps=1", "method.calibration=analytic",
                  "method.budget_split.m1=0.3", "method.budget_split.m2=0.6", "method.budget_split.counts=0.1")
    labels = [e["label"] for e in result["privacy_events"]]
    shares = {e["label"].split(":")[0].split()[-1]: (e["epsilon"], e["delta"]) for e in result["privacy_events"]}
    assert shares.keys() == {"m1", "m2", "counts"} and all("counts DP" in label for label in labels)
    assert shares["m1"] == pytest.approx((0.3, 3e-6)) and shares["m2"] == pytest.approx((0.6, 6e-6))
    for name, call in zip(("m1", "m2"), calls):
        want = gaussian_sigma(epsilon=shares[name][0], delta=shares[name][1], calibration="analytic")
        assert call["sigma"] == want
        # the noise actually added (noisy mean x count - exact sum) has that standard deviation
        assert call["noise"].std() == pytest.approx(want, rel=0.05)
    assert result["epsilon_spent"] <= 1.0


def test_feature_gan_discriminator_sees_private_features_only_in_dp_steps(make_cfg, tmp_path, monkeypatch) -> None:
    """A forward hook on D records every input: the public pretraining stage sees no private feature (and does see
    public ones); a private feature reaches D only in a discriminator step of the DP stage, with a DP optimizer."""
    from dpsyn.data import load_dataset
    from dpsyn.lit import feature_gan
    from dpsyn.methods.dp_gan_ft import public_subsample
    from dpsyn.public import load_public_models

    seen: list[dict[str, Any]] = []
    hooked: set[int] = set()
    running: dict[str, Any] = {}
    original = feature_gan.FeatureGANModule.training_step

    def hook(module, args):
        lit = running["module"]
        seen.append({"stage": lit.stage, "dp": lit.dp is not None,
                     "d_step": any(p.requires_grad for p in module.parameters()),
                     "rows": args[0].detach().cpu().numpy().copy()})

    def training_step(self, batch, idx):
        running["module"] = self
        inner = getattr(self.D, "_module", self.D)  # the same net in both stages (Opacus wraps it for DP)
        if id(inner) not in hooked:
            hooked.add(id(inner))
            inner.register_forward_pre_hook(hook)
        return original(self, batch, idx)

    monkeypatch.setattr(feature_gan.FeatureGANModule, "training_step", training_step)
    # the fitted-state checkpoint (tests/test_crash_safety.py) would pickle D with this test's local hook
    monkeypatch.setattr("dpsyn.task.save_fitted_state", lambda *a, **k: False)
    cfg = make_cfg("method=dp_gan_ft", "eps=1", *SMOKE, *FAST["dp_gan_ft"])
    from dpsyn.task import run

    result = run(cfg, tmp_path / "run")

    data = load_dataset(cfg.dataset, seed=int(cfg.seed), data_dir=cfg.paths.data_dir)
    models = load_public_models(cfg.public, cache_dir=cfg.paths.cache_dir, data_dir=cfg.paths.data_dir)
    private = {r.tobytes() for r in models.encode(data.private.x)}
    public = {r.tobytes() for r in models.encode(public_subsample(data.public, 400, int(cfg.seed)).x)}

    def hits(rows: np.ndarray, pool: set[bytes]) -> int:
        return sum(r.tobytes() in pool for r in rows)

    pre = [s for s in seen if s["stage"] == "public_pretrain"]
    assert pre and all(not s["dp"] for s in pre)
    assert all(hits(s["rows"], private) == 0 for s in pre)
    assert any(hits(s["rows"], public) == len(s["rows"]) for s in pre)  # the real batches: public features
    with_private = [s for s in seen if hits(s["rows"], private)]
    assert with_private and all(s["stage"] == "private_finetune" and s["dp"] and s["d_step"] for s in with_private)
    (event,) = result["privacy_events"]
    assert len(with_private) <= event["steps"]  # one real batch per DP-SGD step


@pytest.mark.parametrize("method", [pytest.param("dp_gan_mi", marks=pytest.mark.slow), "dp_mepf"])  # dp_gan_mi: the DP-SGD draw test_dp_gan checks
def test_dp_noise_is_not_reproducible_from_the_seed(make_cfg, tmp_path: Path, monkeypatch, method: str) -> None:
    """Two runs with the same seed differ; with privacy.deterministic_noise=true they agree, so the difference is
    the DP noise (and Poisson sampling), drawn from OS entropy. (dp_gan_ft shares dp_gan_mi's code.)"""
    import dpsyn.methods.dp_gan_ft as ft
    import dpsyn.methods.dp_mepf as mepf

    captured: list[torch.Tensor] = []
    if method == "dp_mepf":
        original = mepf.release_means

        def spy(sums, counts, sigma, rng):
            out = original(sums, counts, sigma, rng)
            captured.append(torch.from_numpy(out))
            return out

        monkeypatch.setattr(mepf, "release_means", spy)
    else:
        original_fit = ft.FeatureGANMethod.fit

        def fit(self, *a, **k):
            original_fit(self, *a, **k)
            captured.append(torch.cat([p.detach().flatten() for p in self.module.D.parameters()]))

        monkeypatch.setattr(ft.FeatureGANMethod, "fit", fit)

    over = ("eps=1", "trainer.limit_train_batches=2")
    for extra in ((), (), ("privacy.deterministic_noise=true",), ("privacy.deterministic_noise=true",)):
        captured.append(torch.tensor([]))  # a separator: each run's captures follow one
        _run(make_cfg, tmp_path, method, *over, *extra)
    runs, current = [], None
    for t in captured:
        if t.numel() == 0:
            current = []
            runs.append(current)
        else:
            current.append(t)
    a, b, c, d = (torch.cat([t.flatten() for t in r]) for r in runs)
    assert not torch.equal(a, b), "DP noise was reproducible from the run seed"
    torch.testing.assert_close(c, d)


# ------------------------------------------------------------------------------------------------ resume


RESUME = ("eps=1", "trainer.max_epochs=2", "method.checkpoint_every=3")  # 2 epochs x 4 Poisson batches = 8 DP steps


# dp_gan_mi: slow; its fit and resume are FeatureGANMethod's (dp_gan_mi subclasses it), which [dp_gan_ft] runs in
# make test, with the public pretraining in front
@pytest.mark.parametrize("method", ["dp_gan_ft", pytest.param("dp_gan_mi", marks=pytest.mark.slow)])
def test_feature_gan_resumes_a_crashed_dp_stage_without_spending_twice(make_cfg, tmp_path, monkeypatch,
                                                                       method: str) -> None:
    """Crash before DP step 8 of 8 (checkpoint every 3): the re-run skips the public pretraining, resumes the DP
    stage at step 6, and the ledger charges the 8 planned steps once; another calibration or pretraining is
    refused."""
    from dpsyn.task import run
    from dpsyn.lit import feature_gan
    from dpsyn.privacy import dpsgd_epsilon

    over = (f"method={method}", *SMOKE, *FAST[method], *RESUME)
    run_dir, ckpts = tmp_path / "run", tmp_path / "run" / "checkpoints"
    original = feature_gan.FeatureGANModule.training_step
    seen: list[tuple[str, int]] = []

    def crash_at_7(self, batch, idx):
        if self.stage != "public_pretrain" and self.dp_steps == 7:
            raise RuntimeError("killed")
        return original(self, batch, idx)

    monkeypatch.setattr(feature_gan.FeatureGANModule, "training_step", crash_at_7)
    with pytest.raises(RuntimeError, match="killed"):
        run(make_cfg(*over), run_dir)
    assert (ckpts / "last.ckpt").is_file() and not (run_dir / "result.json").exists()
    assert (ckpts / "pretrain.ckpt").is_file() == (method == "dp_gan_ft")
    crashed = PrivacyLedger.load(run_dir / "privacy.json")
    assert crashed.to_dict()["events"][0]["steps"] == 7  # what the crashed run made, charged on disk
    state = torch.load(ckpts / "last.ckpt", map_location="cpu", weights_only=False)["dpsyn"]
    assert state["dp_steps"] == 6 and state["max_steps"] == 8  # the planned steps the noise was calibrated for

    saved = torch.load(ckpts / "last.ckpt", map_location="cpu", weights_only=False)["state_dict"]
    restored: list[bool] = []

    def spy(self, batch, idx):
        if not seen:  # the weights the resumed DP stage starts from: the checkpoint's
            restored.append(all(torch.equal(v, saved[k]) for k, v in self.state_dict().items()))
        seen.append((self.stage, self.dp_steps))
        return original(self, batch, idx)

    monkeypatch.setattr(feature_gan.FeatureGANModule, "training_step", spy)
    result = run(make_cfg(*over), run_dir)
    assert all(stage != "public_pretrain" for stage, _ in seen)  # the pretraining is not redone
    assert seen[0][1] == 6 and restored == [True]  # the DP stage resumed, not restarted
    (event,) = result["privacy_events"]
    assert event["steps"] == 8 and event["noise_multiplier"] == state["noise_multiplier"]
    assert result["epsilon_spent"] == pytest.approx(dpsgd_epsilon(
        noise_multiplier=event["noise_multiplier"], sample_rate=event["sample_rate"], steps=8, delta=1e-5))
    assert result["epsilon_spent"] <= 1.0
    (run_dir / "checkpoints" / "fitted.pt").unlink()  # the method's own check (checkpoints/fitted.pt would refuse first)
    if method == "dp_gan_ft":
        assert result["sample_provenance"]["pretraining"]["steps"] == 10  # the record survives the resume
        with pytest.raises(ValueError, match="resume with the same config"):
            run(make_cfg(*over, "method.pretrain_steps=12"), run_dir)
    with pytest.raises(ValueError, match="resume with the same config"):
        run(make_cfg(*(o if o != "eps=1" else "eps=2" for o in over)), run_dir)


def test_dp_gan_ft_resumes_a_crashed_public_pretraining(make_cfg, tmp_path, monkeypatch) -> None:
    """Crash before pretraining step 8 of 10 (checkpoint every 3): nothing is charged, the re-run continues the
    pretraining at step 6. Crash again before the first DP checkpoint: the next run loads the finished pretraining
    instead of redoing it and runs the DP stage."""
    from dpsyn.task import run
    from dpsyn.lit import feature_gan

    over = ("method=dp_gan_ft", *SMOKE, *FAST["dp_gan_ft"], *RESUME)
    run_dir, ckpts = tmp_path / "run", tmp_path / "run" / "checkpoints"
    original = feature_gan.FeatureGANModule.training_step
    seen: list[tuple[str, int]] = []

    first: dict[str, dict[str, torch.Tensor]] = {}

    def crash_at(stage: str, step: int):
        def training_step(self, batch, idx):
            first.setdefault(self.stage, {k: v.clone() for k, v in self.G.state_dict().items()})
            seen.append((self.stage, self.dp_steps))
            if self.stage == stage and self.dp_steps == step:
                raise RuntimeError("killed")
            return original(self, batch, idx)

        return training_step

    monkeypatch.setattr(feature_gan.FeatureGANModule, "training_step", crash_at("public_pretrain", 7))
    with pytest.raises(RuntimeError, match="killed"):
        run(make_cfg(*over), run_dir)
    assert not (ckpts / "last.ckpt").exists()
    assert PrivacyLedger.load(run_dir / "privacy.json").to_dict()["events"] == []  # public: free

    seen.clear()
    monkeypatch.setattr(feature_gan.FeatureGANModule, "training_step", crash_at("private_finetune", 1))
    with pytest.raises(RuntimeError, match="killed"):
        run(make_cfg(*over), run_dir)
    pre = [steps for stage, steps in seen if stage == "public_pretrain"]
    assert pre[0] == 6 and max(pre) == 10  # continued, not restarted (the call at 10 stops the stage)
    assert torch.load(ckpts / "pretrain.ckpt", map_location="cpu", weights_only=False)["dpsyn"]["dp_steps"] == 10
    assert not (ckpts / "last.ckpt").exists()  # the DP stage crashed before its first checkpoint

    seen.clear()
    first.clear()
    monkeypatch.setattr(feature_gan.FeatureGANModule, "training_step", crash_at("none", -1))
    result = run(make_cfg(*over), run_dir)
    assert seen and all(stage == "private_finetune" for stage, _ in seen)  # the finished pretraining is loaded
    assert seen[0][1] == 0
    pretrained = torch.load(ckpts / "pretrain.ckpt", map_location="cpu", weights_only=False)["state_dict"]
    assert all(torch.equal(v, pretrained[f"G.{k}"]) for k, v in first["private_finetune"].items())
    assert result["sample_provenance"]["pretraining"]["steps"] == 10
    (event,) = result["privacy_events"]
    assert event["steps"] == 8
