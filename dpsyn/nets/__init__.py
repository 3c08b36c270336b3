"""Plain ``nn.Module`` architectures, no training logic."""

from dpsyn.nets.classifier import SmallCNN
from dpsyn.nets.dcgan import CondDCGANDiscriminator, CondDCGANGenerator

__all__ = ["CondDCGANDiscriminator", "CondDCGANGenerator", "SmallCNN"]
