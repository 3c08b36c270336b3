"""The facts of dpsyn's own methods that the preflight reads without importing them (their modules import torch):
each method's dataset kinds and whether it needs public data. Generated from the method classes by ``make docs``
(:mod:`dpsyn.methods.catalog`); edit the classes, not this file.
"""

METHODS = {
    "dp_dre": {"kinds": ("image",), "needs_public": True},
    "dp_gan": {"kinds": ("image", "table"), "needs_public": False},
    "dp_gan_ft": {"kinds": ("image",), "needs_public": True},
    "dp_gan_mi": {"kinds": ("image",), "needs_public": True},
    "dp_mepf": {"kinds": ("image",), "needs_public": True},
    "dp_mge": {"kinds": ("image",), "needs_public": True},
    "g_pate": {"kinds": ("image", "table"), "needs_public": False},
    "gan": {"kinds": ("image",), "needs_public": False},
    "gs_wgan": {"kinds": ("image",), "needs_public": False},
    "icgan_nonprivate": {"kinds": ("image",), "needs_public": True},
    "pate_gan": {"kinds": ("image", "table"), "needs_public": False},
    "pe": {"kinds": ("image",), "needs_public": True},
    "privgan": {"kinds": ("image",), "needs_public": False},
    "public_uniform": {"kinds": ("image",), "needs_public": True},
    "real": {"kinds": ("image", "table"), "needs_public": False},
}
