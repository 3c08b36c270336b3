"""PE's diffusion backend (dpsyn.public.diffusion): config checks, the DDIM / SDEdit sampler, the embedded model
(trained for a few steps on tiny fake Fashion-MNIST files, and the shipped weights), the cache, and the real adapters
with stand-ins written here (a fake ``improved_diffusion`` package and checkpoint; a tiny Stable Diffusion folder
saved with diffusers' ``save_pretrained``). Paper 000's public models must never touch the diffusion section.
"""

from __future__ import annotations

import hashlib
import json
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf, open_dict

import dpsyn.public as public_mod
from dpsyn.data import fmnist as fmnist_mod
from dpsyn.config import load_group
from dpsyn.paths import CONF_DIR
from dpsyn.public import SHIPPED_DIR, check_public_config, load_public_models
from dpsyn.public import diffusion as diff_mod
from dpsyn.public.diffusion import (
    EmbeddedDiffusion,
    build_unet,
    check_diffusion_config,
    ddim_denoise,
    degree_from_skipped_steps,
    load_diffusion_model,
    respaced_timesteps,
    sdedit_steps,
)
from tests.test_data import write_fake_fmnist

TINY_UNET = {
    "block_out_channels": [8, 16], "layers_per_block": 1, "mid_attention": True, "attention_head_dim": 8,
    "norm_num_groups": 4, "steps": 3, "batch_size": 16, "warmup_steps": 1, "ddim_steps": 4,
    "sample_batch_size": 8, "quality_n": 0,
}  # fmt: skip
TINY_PAPER000 = {"encoder": {"feature_dim": 8, "width": 4, "epochs": 1, "batch_size": 32},
                 "generator": {"z_dim": 8, "ngf": 8, "ndf": 8, "k": 4, "steps": 2, "batch_size": 16},
                 "quality": {"n": 0}}


def _conf(name: str) -> dict:
    return OmegaConf.to_container(load_group("public", name), resolve=True)


def _tiny_cfg(**diffusion: object) -> dict:
    return OmegaConf.to_container(OmegaConf.merge(_conf("fmnist"), TINY_PAPER000,
                                                  {"diffusion": {**TINY_UNET, **diffusion}}))


@pytest.fixture
def fake_fmnist_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A data_dir with tiny Fashion-MNIST files (200 train -> 100 public, 50 test), Debian's copy hidden."""
    monkeypatch.setattr(fmnist_mod, "SYSTEM_DIRS", (tmp_path / "nowhere",))
    write_fake_fmnist(tmp_path / "data")
    return tmp_path / "data"


# ------------------------------------------------------------------------------------------------------ configs


def test_shipped_public_configs_pass_both_checkers() -> None:
    for name in ("fmnist", "imagenet"):
        cfg = _conf(name)
        assert "diffusion" in cfg
        check_public_config(cfg)
        check_diffusion_config(cfg)
    assert _conf("imagenet")["diffusion"]["name"] == "improved_diffusion"
    assert _conf("imagenet")["diffusion"]["ddim_steps"] == 100


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"foo": 1}, "unknown key public.diffusion.foo"),
        ({"name": "improved_diffusion"}, r"public.diffusion.name='improved_diffusion' for public.kind=embedded"),
        ({"ddim_steps": 0}, "public.diffusion.ddim_steps=0 must be a positive integer"),
        ({"ddim_steps": 2000}, "public.diffusion.ddim_steps=2000 exceeds public.diffusion.num_train_timesteps"),
        ({"spacing": "trailing"}, "public.diffusion.spacing='trailing'; allowed: even, leading"),
        ({"block_out_channels": [16, 30]}, "block_out_channels entry 30 is not divisible by"),
        ({"block_out_channels": []}, "public.diffusion.block_out_channels"),
        ({"beta_schedule": "cosine"}, "public.diffusion.beta_schedule='cosine'; allowed"),
        ({"p_uncond": 1.0}, r"public.diffusion.p_uncond=1.0 must be a number in \[0, 1\)"),
        ({"lr": 0}, "public.diffusion.lr"),
        ({"mid_attention": "yes"}, "public.diffusion.mid_attention"),
        ({"quality_n": -1}, "public.diffusion.quality_n"),
    ],
)
def test_diffusion_config_errors_name_the_key(change: dict, message: str) -> None:
    cfg = _conf("fmnist")
    cfg["diffusion"].update(change)
    with pytest.raises(ValueError, match=message):
        check_diffusion_config(cfg)
    with pytest.raises(ValueError, match=message):  # the public config check runs it too (config errors fail early)
        check_public_config(cfg)


def test_diffusion_config_errors_for_real_backends() -> None:
    cfg = _conf("imagenet")
    del cfg["diffusion"]["checkpoint"]
    with pytest.raises(ValueError, match="public config lacks public.diffusion.checkpoint"):
        check_diffusion_config(cfg)
    cfg = _conf("imagenet")
    cfg["diffusion"] = {"name": "stable_diffusion", "model": "checkpoints/sd", "prompts": [], "ddim_steps": 50,
                        "sample_batch_size": 4}
    with pytest.raises(ValueError, match="public.diffusion.prompts must be a non-empty list"):
        check_diffusion_config(cfg)
    cfg["diffusion"].update(prompts=["a cat"], resolution=500)
    with pytest.raises(ValueError, match="public.diffusion.resolution=500 must be divisible by 8"):
        check_diffusion_config(cfg)
    cfg["diffusion"].update(resolution=512, name="unet")
    with pytest.raises(ValueError, match="public.diffusion.name='unet' for public.kind=real"):
        check_diffusion_config(cfg)


def test_loader_needs_a_diffusion_section(tmp_path: Path) -> None:
    cfg = _conf("fmnist")
    del cfg["diffusion"]
    check_public_config(cfg)  # optional for paper 000
    with pytest.raises(ValueError, match=r"no diffusion section \(public.diffusion\)"):
        load_diffusion_model(cfg, cache_dir=tmp_path, data_dir=tmp_path)


# ------------------------------------------------------------------------------------------ schedule and sampler


def test_respacing_and_degree_convention() -> None:
    even = respaced_timesteps(4000, 100, "even")
    assert len(even) == 100 and even[0] == 0 and even[-1] == 3999 and np.all(np.diff(even) > 0)
    np.testing.assert_array_equal(respaced_timesteps(1000, 25, "leading"), np.arange(25) * 40)
    with pytest.raises(ValueError, match="steps=0"):
        respaced_timesteps(1000, 0)
    assert sdedit_steps(1.0, 25) == 25 and sdedit_steps(0.01, 25) == 1 and sdedit_steps(0.5, 100) == 50
    for bad in (0.0, 1.5, -0.1, True):
        with pytest.raises(ValueError, match="degree"):
            sdedit_steps(bad, 25)
    # PE's improved-diffusion degrees: skip d of 100 respaced steps, i.e. re-run the last 100 - d of them
    for d in range(0, 42, 2):
        assert sdedit_steps(degree_from_skipped_steps(d, 100), 100) == 100 - d


def test_ddim_matches_diffusers_ddim_scheduler() -> None:
    """Independent implementation: diffusers' DDIMScheduler (eta 0, clipped x0, leading spacing, alpha_0 = 1)."""
    from diffusers import DDIMScheduler, DDPMScheduler

    alphas = DDPMScheduler(num_train_timesteps=1000, beta_schedule="squaredcos_cap_v2").alphas_cumprod
    w = torch.randn(4, 4, generator=torch.Generator().manual_seed(0))

    def eps(x: torch.Tensor, t: int) -> torch.Tensor:
        return torch.tanh(x @ w) * (1 + t / 1000)

    x = torch.randn(3, 1, 4, 4, generator=torch.Generator().manual_seed(1))
    ours = ddim_denoise(eps, x.clone(), respaced_timesteps(1000, 25, "leading"), alphas)
    ref = DDIMScheduler(num_train_timesteps=1000, beta_schedule="squaredcos_cap_v2", clip_sample=True,
                        set_alpha_to_one=True, timestep_spacing="leading", steps_offset=0)
    ref.set_timesteps(25)
    y = x.clone()
    for t in ref.timesteps:
        y = ref.step(eps(y, int(t)), t, y, eta=0.0, use_clipped_model_output=True).prev_sample
    torch.testing.assert_close(ours, y, atol=1e-5, rtol=1e-5)


# --------------------------------------------------------------------------------------------- embedded model


def test_embedded_model_trains_caches_and_samples(tmp_path: Path, fake_fmnist_dir: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    cache = tmp_path / "cache"
    model = load_diffusion_model(_tiny_cfg(), cache_dir=cache, data_dir=fake_fmnist_dir, progress=False, device="cpu")
    assert isinstance(model, EmbeddedDiffusion)
    assert model.num_classes == 10 and model.shape == (1, 28, 28) and model.unconditional
    rec = model.record
    assert rec["steps"] == 3 and rec["data"]["n_public"] == 100 and len(rec["sha256"]) == 64
    assert Path(rec["cache"]).is_file() and Path(rec["cache"]).with_suffix(".json").is_file()

    labels = np.array([0, 3, 9, -1, 5, 5, 1, 2, 7, 8, 4])
    a = model.random(labels, generator=torch.Generator().manual_seed(0))
    assert a.shape == (11, 1, 28, 28) and a.dtype == np.float32 and a.min() >= 0 and a.max() <= 1
    np.testing.assert_array_equal(a, model.random(labels, generator=torch.Generator().manual_seed(0)))
    # the noise of image i does not depend on the batch size (only float rounding of batched convs does)
    np.testing.assert_allclose(a, model.random(labels, generator=torch.Generator().manual_seed(0), batch_size=3),
                               atol=1e-4)
    assert not np.allclose(a, model.random(labels, generator=torch.Generator().manual_seed(1)))

    v = model.variation(a, labels, degree=0.5, generator=torch.Generator().manual_seed(2))
    assert v.shape == a.shape and v.min() >= 0 and v.max() <= 1
    np.testing.assert_array_equal(v, model.variation(a, labels, degree=0.5, generator=torch.Generator().manual_seed(2)))

    with pytest.raises(ValueError, match="label 10 out of range; allowed: 0..9 or -1"):
        model.random(np.array([10]), generator=torch.Generator())
    with pytest.raises(ValueError, match="degree"):
        model.variation(a, labels, degree=0.0, generator=torch.Generator())
    with pytest.raises(ValueError, match=r"images must be \(N, 1, 28, 28\)"):
        model.variation(np.zeros((2, 3, 28, 28)), np.zeros(2, dtype=int), degree=0.5, generator=torch.Generator())
    with pytest.raises(ValueError, match=r"images must be floats in \[0, 1\]"):
        model.variation(a * 255, labels, degree=0.5, generator=torch.Generator())
    with pytest.raises(ValueError, match="got 11 images but 2 labels"):
        model.variation(a, labels[:2], degree=0.5, generator=torch.Generator())

    # cached: no retraining; sampling settings are not part of the key, training settings are
    def no_training(*args, **kwargs):
        raise AssertionError("a cached diffusion model must not be retrained")

    monkeypatch.setattr("dpsyn.lit.diffusion.train_diffusion", no_training)
    again = load_diffusion_model(_tiny_cfg(ddim_steps=2, guidance_scale=2.0), cache_dir=cache,
                                 data_dir=fake_fmnist_dir, progress=False, device="cpu")
    assert again.record["key"] == rec["key"] and again.ddim_steps == 2 and again.guidance_scale == 2.0
    sa, sb = model.net.state_dict(), again.net.state_dict()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    guided = again.random(labels[:4], generator=torch.Generator().manual_seed(0))
    assert guided.shape == (4, 1, 28, 28) and np.isfinite(guided).all()
    with pytest.raises(AssertionError, match="must not be retrained"):
        load_diffusion_model(_tiny_cfg(steps=4), cache_dir=cache, data_dir=fake_fmnist_dir, progress=False)

    # the checkpoint alone (no training data) gives the same model
    alone = EmbeddedDiffusion.from_checkpoint(rec["cache"], device="cpu")
    np.testing.assert_array_equal(alone.random(labels, generator=torch.Generator().manual_seed(0)), a)


def test_paper000_public_models_never_touch_the_diffusion_section(tmp_path: Path, fake_fmnist_dir: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    def forbidden(*args, **kwargs):
        raise AssertionError("paper 000's public models must not build, train or load the diffusion model")

    for name in ("load_diffusion_model", "_load_embedded", "build_unet", "EmbeddedDiffusion"):
        monkeypatch.setattr(diff_mod, name, forbidden)
    monkeypatch.setattr("dpsyn.lit.diffusion.train_diffusion", forbidden)
    with_section = load_public_models(_tiny_cfg(), cache_dir=tmp_path / "a", data_dir=fake_fmnist_dir,
                                      progress=False)
    other = load_public_models(_tiny_cfg(steps=99, block_out_channels=[4, 8]), cache_dir=tmp_path / "a",
                               data_dir=fake_fmnist_dir, progress=False)
    bare = _tiny_cfg()
    del bare["diffusion"]
    without = load_public_models(bare, cache_dir=tmp_path / "b", data_dir=fake_fmnist_dir, progress=False)
    # the encoder's and the IC-GAN's cache keys hash only their own sections
    for part in ("encoder", "generator"):
        assert with_section.record[part]["key"] == without.record[part]["key"] == other.record[part]["key"]
    assert not any(p.name.split("-")[1] == "diffusion" for p in (tmp_path / "a" / "public").iterdir())


# ------------------------------------------------------------------------------------------- shipped weights


def _shipped() -> Path:
    found = sorted(SHIPPED_DIR.glob("*-diffusion-*.safetensors"))
    assert len(found) == 1, f"expected one shipped diffusion model in {SHIPPED_DIR}, found {found}"
    return found[0]


def test_shipped_diffusion_weights_are_intact_and_documented() -> None:
    weights = _shipped()
    record = json.loads(weights.with_suffix(".json").read_text())
    assert hashlib.sha256(weights.read_bytes()).hexdigest() == record["sha256"]
    assert record["key"] == weights.stem and weights.stat().st_size < 5 * 2**20
    assert record["data"]["dataset"] == "fmnist_public" and record["seed"] == _conf("fmnist")["seed"]
    q = record["quality"]
    assert q["class_acc"] > 0.5 and q["fd_evalnet"] > 0 and set(q["variation"]) == {"0.2", "0.5", "0.8"}
    assert record["released"] == "ema" and record["train_seconds"] > 0


def test_pretrain_architecture_matches_the_shipped_weights() -> None:
    """conf/public/fmnist.yaml's architecture (what `pretrain diffusion=true` builds) has exactly the shipped
    tensors, and the shipped training settings are the config's."""
    from safetensors.torch import load_file

    from dpsyn.public.diffusion import _train_settings

    cfg = _conf("fmnist")
    weights = _shipped()
    record = json.loads(weights.with_suffix(".json").read_text())
    assert record["settings"] == _train_settings(cfg["diffusion"])
    shipped = load_file(str(weights))
    built = build_unet(cfg["diffusion"], channels=1, resolution=28, num_classes=10).state_dict()
    assert {k: tuple(v.shape) for k, v in built.items()} == {k: tuple(v.shape) for k, v in shipped.items()}


def test_shipped_model_variation_degree_controls_distance() -> None:
    """Averaged over a batch, SDEdit at degree 0.2 stays much closer (pixel MSE) to its input than at degree 1.

    One image per class: the ratio is ~0.03 with 1 or 3 per class (measured), far below the 0.5 asserted."""
    model = EmbeddedDiffusion.from_checkpoint(_shipped(), device="cpu")
    labels = np.arange(10)
    x = model.random(labels, generator=torch.Generator().manual_seed(0))
    mse = {d: float(((model.variation(x, labels, degree=d, generator=torch.Generator().manual_seed(1)) - x) ** 2)
                    .mean()) for d in (0.2, 1.0)}
    assert mse[0.2] < 0.5 * mse[1.0]


def test_shipped_model_loads_through_the_config_without_training(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    if not Path("/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz").is_file():
        pytest.skip("the shipped key is for Debian's dataset-fashion-mnist files")

    def no_training(*args, **kwargs):
        raise AssertionError("trained although shipped weights exist")

    monkeypatch.setattr("dpsyn.lit.diffusion.train_diffusion", no_training)
    model = load_diffusion_model(_conf("fmnist"), cache_dir=tmp_path / "empty", data_dir=tmp_path / "data",
                                 device="cpu")
    assert Path(model.record["shipped"]) == _shipped() and model.ddim_steps == 25
    assert model.random(np.array([0, -1]), generator=torch.Generator().manual_seed(0)).shape == (2, 1, 28, 28)


# ------------------------------------------------------------------------------------ improved-diffusion adapter

FAKE_SCRIPT_UTIL = '''
import numpy as np
import torch
from torch import nn

NUM_CLASSES = 1000


def model_and_diffusion_defaults():
    return dict(image_size=64, num_channels=128, num_res_blocks=2, num_heads=4, num_heads_upsample=-1,
                attention_resolutions="16,8", dropout=0.0, learn_sigma=False, sigma_small=False, class_cond=False,
                diffusion_steps=1000, noise_schedule="linear", timestep_respacing="", use_kl=False,
                predict_xstart=False, rescale_timesteps=True, rescale_learned_sigmas=True, use_checkpoint=False,
                use_scale_shift_norm=True)


class TinyUNet(nn.Module):
    def __init__(self, learn_sigma, class_cond, steps):
        super().__init__()
        self.steps = steps
        self.conv = nn.Conv2d(3, 6 if learn_sigma else 3, 3, padding=1)
        self.label_emb = nn.Embedding(NUM_CLASSES, 6 if learn_sigma else 3) if class_cond else None

    def forward(self, x, timesteps, y=None):
        assert timesteps.shape == (len(x),) and 0 <= int(timesteps.min()) and int(timesteps.max()) < self.steps
        assert (y is None) == (self.label_emb is None)
        h = 0.1 * self.conv(x) + timesteps.float().view(-1, 1, 1, 1) / self.steps
        return h if y is None else h + self.label_emb(y)[:, :, None, None]


class Diffusion:
    def __init__(self, steps, noise_schedule):
        t = np.arange(steps + 1) / steps
        f = np.cos((t + 0.008) / 1.008 * np.pi / 2) ** 2
        betas = np.minimum(1 - f[1:] / f[:-1], 0.999)
        self.alphas_cumprod = np.cumprod(1.0 - betas)


def create_model_and_diffusion(*, image_size, class_cond, learn_sigma, sigma_small, num_channels, num_res_blocks,
                               num_heads, num_heads_upsample, attention_resolutions, dropout, diffusion_steps,
                               noise_schedule, timestep_respacing, use_kl, predict_xstart, rescale_timesteps,
                               rescale_learned_sigmas, use_checkpoint, use_scale_shift_norm):
    assert timestep_respacing == ""
    return TinyUNet(learn_sigma, class_cond, diffusion_steps), Diffusion(diffusion_steps, noise_schedule)
'''


@pytest.fixture
def fake_improved_diffusion(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An improved-diffusion checkout (only script_util) on sys.path, forgotten afterwards."""
    code = tmp_path / "improved-diffusion" / "improved_diffusion"
    code.mkdir(parents=True)
    (code / "__init__.py").write_text("")
    (code / "script_util.py").write_text(textwrap.dedent(FAKE_SCRIPT_UTIL))
    for name in ("improved_diffusion", "improved_diffusion.script_util"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    monkeypatch.syspath_prepend(str(code.parent))
    yield code.parent
    for name in ("improved_diffusion", "improved_diffusion.script_util"):
        sys.modules.pop(name, None)


def _imagenet_cfg(tmp_path: Path, **flags: object) -> dict:
    cfg = _conf("imagenet")
    cfg["diffusion"]["flags"].update({"image_size": 8, **flags})
    cfg["diffusion"].update(ddim_steps=10, sample_batch_size=4)
    return cfg


def test_improved_diffusion_adapter_samples_through_the_users_installation(
    tmp_path: Path, fake_improved_diffusion: Path
) -> None:
    from improved_diffusion import script_util

    cfg = _imagenet_cfg(tmp_path)
    flags = {**script_util.model_and_diffusion_defaults(), **cfg["diffusion"]["flags"]}
    torch.manual_seed(0)
    net, _ = script_util.create_model_and_diffusion(**flags)
    ckpt = tmp_path / cfg["diffusion"]["checkpoint"]
    ckpt.parent.mkdir(parents=True)
    torch.save(net.state_dict(), ckpt)

    model = load_diffusion_model(cfg, cache_dir=tmp_path, data_dir=tmp_path, device="cpu")
    assert model.num_classes == 1000 and model.shape == (3, 8, 8) and not model.unconditional
    assert model.record["sha256"] == hashlib.sha256(ckpt.read_bytes()).hexdigest()
    assert len(model.timesteps) == 10 and model.timesteps[-1] == flags["diffusion_steps"] - 1
    labels = np.array([0, 207, 999, 1, 5])
    a = model.random(labels, generator=torch.Generator().manual_seed(0))
    assert a.shape == (5, 3, 8, 8) and a.dtype == np.float32 and a.min() >= 0 and a.max() <= 1
    np.testing.assert_array_equal(a, model.random(labels, generator=torch.Generator().manual_seed(0)))
    v = model.variation(a, labels, degree=degree_from_skipped_steps(20, 100), generator=torch.Generator())
    assert v.shape == a.shape and 0 <= v.min() and v.max() <= 1
    with pytest.raises(ValueError, match="label -1 out of range; allowed: 0..999 .this model has no unconditional"):
        model.random(np.array([-1]), generator=torch.Generator())


def test_improved_diffusion_adapter_errors(tmp_path: Path, fake_improved_diffusion: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = _imagenet_cfg(tmp_path)
    with pytest.raises(FileNotFoundError, match=r"imagenet64_cond_270M_250K\.pt") as err:
        load_diffusion_model(cfg, cache_dir=tmp_path, data_dir=tmp_path)
    assert str(tmp_path / "checkpoints") in str(err.value) and "openaipublic" in str(err.value)
    ckpt = tmp_path / cfg["diffusion"]["checkpoint"]
    ckpt.parent.mkdir(parents=True)
    torch.save({}, ckpt)
    bad = _imagenet_cfg(tmp_path, num_chanels=3)
    with pytest.raises(ValueError, match="unknown key public.diffusion.flags.num_chanels"):
        load_diffusion_model(bad, cache_dir=tmp_path, data_dir=tmp_path)
    monkeypatch.setitem(sys.modules, "improved_diffusion", None)  # None in sys.modules: the import fails
    with pytest.raises(ImportError, match=r"pip install -e improved-diffusion"):
        load_diffusion_model(cfg, cache_dir=tmp_path, data_dir=tmp_path)


# ------------------------------------------------------------------------------------ Stable Diffusion adapter


def _bytes_to_unicode() -> list[str]:
    """GPT-2 / CLIP byte-level BPE alphabet (printable bytes as themselves, the others shifted past 255)."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("\u00a1"), ord("\u00ac") + 1),
            *range(ord("\u00ae"), ord("\u00ff") + 1)]
    shifted = [b for b in range(256) if b not in keep]
    return [chr(b) for b in keep] + [chr(256 + i) for i in range(len(shifted))]


@pytest.fixture(scope="module")
def tiny_sd_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Stable Diffusion pipeline (16x16 images) saved in diffusers' folder layout."""
    transformers = pytest.importorskip("transformers")
    from diffusers import AutoencoderKL, DDIMScheduler, StableDiffusionPipeline, UNet2DConditionModel

    root = tmp_path_factory.mktemp("sd")
    chars = _bytes_to_unicode()
    vocab = {t: i for i, t in enumerate([*chars, *(c + "</w>" for c in chars), "<|startoftext|>", "<|endoftext|>"])}
    (root / "vocab.json").write_text(json.dumps(vocab))
    (root / "merges.txt").write_text("#version: 0.2\n")  # no merges: one token per character
    tokenizer = transformers.CLIPTokenizer(str(root / "vocab.json"), str(root / "merges.txt"), model_max_length=32)
    torch.manual_seed(0)
    text = transformers.CLIPTextModel(transformers.CLIPTextConfig(
        vocab_size=len(vocab), hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
        max_position_embeddings=32, projection_dim=16))
    unet = UNet2DConditionModel(
        sample_size=8, in_channels=4, out_channels=4, block_out_channels=(8, 16), layers_per_block=1,
        down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"), up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"),
        cross_attention_dim=16, norm_num_groups=4, attention_head_dim=4)
    vae = AutoencoderKL(in_channels=3, out_channels=3, down_block_types=("DownEncoderBlock2D",) * 2,
                        up_block_types=("UpDecoderBlock2D",) * 2, block_out_channels=(8, 16), latent_channels=4,
                        norm_num_groups=4, sample_size=16)
    scheduler = DDIMScheduler(num_train_timesteps=100, beta_schedule="scaled_linear", clip_sample=False,
                              set_alpha_to_one=False)
    pipe = StableDiffusionPipeline(vae=vae, text_encoder=text, tokenizer=tokenizer, unet=unet, scheduler=scheduler,
                                   safety_checker=None, feature_extractor=None, requires_safety_checker=False)
    pipe.save_pretrained(str(root / "tiny-sd"))
    return root / "tiny-sd"


def _sd_cfg(model: Path) -> dict:
    cfg = _conf("imagenet")
    cfg["diffusion"] = {"name": "stable_diffusion", "model": str(model), "prompts": ["a red square", "a blue disc"],
                        "resolution": 16, "ddim_steps": 4, "guidance_scale": 2.0, "sample_batch_size": 2,
                        "dtype": "float32"}
    return cfg


def test_stable_diffusion_adapter_text2img_and_img2img(tmp_path: Path, tiny_sd_folder: Path) -> None:
    model = load_diffusion_model(_sd_cfg(tiny_sd_folder), cache_dir=tmp_path, data_dir=tmp_path, device="cpu")
    assert model.num_classes == 2 and model.shape == (3, 16, 16) and model.unconditional
    assert "unet/diffusion_pytorch_model.safetensors" in model.record["sha256"]
    labels = np.array([0, 1, -1])
    a = model.random(labels, generator=torch.Generator().manual_seed(0))
    assert a.shape == (3, 3, 16, 16) and a.dtype == np.float32 and a.min() >= 0 and a.max() <= 1
    np.testing.assert_array_equal(a, model.random(labels, generator=torch.Generator().manual_seed(0)))
    v = model.variation(a, labels, degree=0.5, generator=torch.Generator().manual_seed(1))
    assert v.shape == a.shape and v.min() >= 0 and v.max() <= 1
    with pytest.raises(ValueError, match="label 2 out of range"):
        model.random(np.array([2]), generator=torch.Generator())


def test_stable_diffusion_missing_folder_says_what_to_download(tmp_path: Path) -> None:
    cfg = _sd_cfg(Path("checkpoints/stable-diffusion-v1-5"))
    with pytest.raises(FileNotFoundError, match="huggingface-cli download") as err:
        load_diffusion_model(cfg, cache_dir=tmp_path, data_dir=tmp_path)
    assert str(tmp_path / "checkpoints" / "stable-diffusion-v1-5") in str(err.value)


def test_public_module_exports_the_loader() -> None:
    assert public_mod.load_diffusion_model is load_diffusion_model
    assert public_mod.check_diffusion_config is check_diffusion_config


def test_pretrain_command_trains_the_diffusion_model_when_asked(tmp_path: Path, fake_fmnist_dir: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from dpsyn.cli import pretrain as pretrain_mod

    tiny = [f"public.diffusion.{k}={json.dumps(v)}" for k, v in TINY_UNET.items()]
    base = [
        "public=fmnist", f"paths.cache_dir={tmp_path / 'cache'}", f"paths.data_dir={fake_fmnist_dir}",
        "public.encoder.width=4", "public.encoder.feature_dim=8", "public.encoder.epochs=1",
        "public.generator.steps=1", "public.generator.ngf=8", "public.generator.ndf=8",
        "public.generator.batch_size=16", "public.generator.k=4", "public.quality.n=0",
    ]

    def composed(*overrides: str):
        GlobalHydra.instance().clear()
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            cfg = compose("pretrain", overrides=[*base, *overrides])
        GlobalHydra.instance().clear()
        return cfg

    assert composed().diffusion is False  # default: paper 000's models only
    record = pretrain_mod.pretrain(composed())
    assert "diffusion" not in record
    record = pretrain_mod.pretrain(composed("diffusion=true", *tiny, f"diffusion_grid={tmp_path / 'grid.png'}"))
    summary = pretrain_mod.format_summary(record, 1.0)
    assert record["diffusion"]["cache"] in summary and "3 steps of 16" in summary
    assert (tmp_path / "grid.png").stat().st_size > 0

    cfg = composed("diffusion=true")
    with open_dict(cfg):
        cfg.public.diffusion = None  # a typed node keeps its fields: a public config without one has it null
    with pytest.raises(ValueError, match="has no diffusion section"):
        pretrain_mod.pretrain(cfg)
