"""``dp_gan_mi``: DP-GAN with model inversion (DP-GAN-MI, Chen et al. 2021), a baseline of paper 000.

Paper 000, "Baselines" 3: DP-GAN-MI pretrains an unconditional GAN on the public data and trains a differentially
private GAN in its latent space; an image is the pretrained GAN's output for a latent vector drawn from the private
GAN. Paper 000 runs it with the IC-GAN architecture: the latent space is that of the feature extractor h, the
pretrained public generator is the IC-GAN g, and the private generator and discriminator are 4-layer MLPs.

Here (a reconstruction on dpsyn's public models): the feature GAN of :mod:`dpsyn.lit.feature_gan` is trained from a
fresh initialisation — no public pretraining of the feature GAN, which is what separates it from ``dp_gan_ft`` —
on the private features ``h(x_i)`` with a DP-SGD discriminator (Opacus, Poisson sampling, noise calibrated for the
planned steps, one ``SampledGaussianEvent``), and its samples are decoded by g. The training code is
:class:`dpsyn.methods.dp_gan_ft.FeatureGANMethod`, shared with ``dp_gan_ft``; the departures listed there
(class-conditional feature GAN, embedded h/g) apply here too.
"""

from __future__ import annotations

from dpsyn.methods.base import DPSGD_ACCOUNTING_KEYS, DPSGD_GAN_TUNABLE_KEYS, METHODS
from dpsyn.methods.dp_gan_ft import FeatureGANMethod
from dpsyn.methods.tiny import SHOES


@METHODS.register("dp_gan_mi")
class DPGANMI(FeatureGANMethod):
    """DP-GAN-MI (see the module docstring): a DP feature GAN from scratch, decoded by the public generator."""

    accounting_keys = DPSGD_ACCOUNTING_KEYS
    tunable_keys = (*DPSGD_GAN_TUNABLE_KEYS, "hidden", "layers")
    tiny = ("method=dp_gan_mi", *SHOES)

    pretrain_on_public = False
    method_name = "dp_gan_mi"
