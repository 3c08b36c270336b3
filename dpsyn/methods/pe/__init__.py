"""Private Evolution (paper 001, Lin et al. 2023): the method (:mod:`.method`), the model APIs (:mod:`.api`) and
the DP nearest-neighbour histogram (:mod:`.histogram`). One package rather than one file: the APIs and the
histogram are reused on their own (benchmarks, tests)."""

from dpsyn.methods.pe.api import DiffusionAPI, ICGANAPI, PEAPI, Population
from dpsyn.methods.pe.histogram import Histogram, dp_nn_histogram, nearest_neighbours, nn_counts, select_parents
from dpsyn.methods.pe.method import PE, pe_noise_multiplier, pe_releases

__all__ = [
    "PE",
    "PEAPI",
    "DiffusionAPI",
    "Histogram",
    "ICGANAPI",
    "Population",
    "dp_nn_histogram",
    "nearest_neighbours",
    "nn_counts",
    "pe_noise_multiplier",
    "pe_releases",
    "select_parents",
]
