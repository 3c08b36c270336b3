"""The pieces of the methods' tiny runs (:attr:`dpsyn.methods.base.Method.tiny`): overrides that make a run end to
end in seconds with ``trainer=debug``, on the cheapest dataset a method supports (the numbers it gives mean nothing).

The test suite runs every registered method with its ``tiny`` overrides (the budget, crash-safety and
neighbouring-run harnesses, tests/test_all_methods.py); a method from outside dpsyn can build its own from these.
"""

from __future__ import annotations

# the embedded public models, shrunk (built once per test session in the test cache; every public-model test shares
# them because the cache key is the same)
TINY_PUBLIC = ("public.n_public=600", "public.encoder.epochs=1", "public.generator.steps=20", "public.quality.n=0")
# no image metric (no evaluation network to train), few samples
IMAGE_METRICS = ("metrics.names.image=[]", "metrics.n_samples=60")
TABLE_METRICS = ("metrics.tabular.classifiers=[logreg]", "metrics.n_samples=60")
# paper 000's embedded case for methods built on public data
SHOES = ("dataset=fmnist_shoes", "dataset.n_private=600", *TINY_PUBLIC, *IMAGE_METRICS)

TINY_PE = ("method.population=60", "method.degrees=[0.6,0.4,0.3]", "method.lookahead=1", "method.threshold=1.0")
TINY_G_PATE = ("method.teachers=20", "method.batch_size=4", "method.projection_dim=2", "method.sigma_threshold=100",
               "method.sigma=50", "method.threshold=10")
TINY_G_PATE_IMAGE = (*TINY_G_PATE, "method.teacher_arch=conv", "method.ndf=2", "method.z_dim=8", "method.ngf=4")
TINY_PATE_GAN = ("method.teachers=10", "method.batch_size=4", "method.teacher_batch=2", "method.sigma_threshold=100",
                 "method.sigma=50", "method.threshold=5", "method.ndf=2", "method.student_ndf=4", "method.z_dim=8",
                 "method.ngf=4", "method.teacher_chunk=null")
TINY_GS_WGAN = ("method.critics=20", "method.batch_size=4", "method.critic_steps=1", "method.ndf=2", "method.ngf=4",
                "method.z_dim=8", "method.iterations=6")
TINY_LOCAL_GAN = ("method.owners=[0.01,0.02]", "method.attack.per_owner_utility=0")
# one small class-conditional MLP pair per owner for one epoch, a small attack
TINIEST_LOCAL_GAN = (*TINY_LOCAL_GAN, "method.epochs=1", "method.per_class=false", "method.g_hidden=[16]",
                     "method.d_hidden=[16]", "method.z_dim=8", "method.attack.n_members=20",
                     "method.attack.monte_carlo=0")
