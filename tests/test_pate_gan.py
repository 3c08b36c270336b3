"""PATE-GAN (a baseline of paper 002): teachers on disjoint data, a student that only sees generated samples, the
Confident-GNMax labels, the budget, and the method end to end on images and tables."""

from __future__ import annotations

import copy
import json
import math

import numpy as np
import pytest
import torch

from dpsyn.data.base import Split
from dpsyn.methods import METHODS, PrivacyBudget, RunContext, pate_gan, session
from dpsyn.methods.pate_gan import (
    binary_votes,
    ensemble_generator_loss,
    student_labels,
    teacher_update,
    vote_cuts,
)
from dpsyn.data.partitions import KeyedPartitions, partition_key
from dpsyn.nets.ensemble import CondConvTeacher, TeacherEnsemble
from dpsyn.privacy import PrivacyLedger, pate_data_independent_epsilon
from tests.conftest import RecordingBar, crash_on_call, run_context

TINY = ("method.teachers=10", "method.batch_size=4", "method.teacher_batch=2", "method.sigma_threshold=100",
        "method.sigma=50", "method.threshold=5", "method.ndf=2", "method.student_ndf=4", "method.z_dim=8",
        "method.ngf=4", "method.teacher_chunk=null", "privacy.deterministic_noise=true")


def _flat(module: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().flatten() for p in module.parameters()])


def _image_ctx(**kw) -> RunContext:
    return run_context(trainer={"limit_train_batches": 5}, **kw)


def _image_split(n: int = 60) -> Split:
    g = np.random.default_rng(0)
    return Split(x=g.random((n, 1, 28, 28), dtype=np.float32), y=g.integers(0, 3, n).astype(np.int64),
                 index=np.arange(n))


def _parts(n: int, k: int) -> KeyedPartitions:
    return KeyedPartitions(np.arange(n), k, key=partition_key(0, "teachers"))


def _method(make_cfg, ctx: RunContext, *overrides: str):
    cfg = make_cfg("method=pate_gan", *TINY, *overrides)
    return METHODS.get("pate_gan")(cfg.method, ctx)


# ---- (1) teachers see only their own partition; the student sees only generated samples ------------------------


def test_each_teacher_learns_only_from_its_own_partition() -> None:
    n = 5
    torch.manual_seed(0)
    x_all, y_all = torch.rand(50, 1, 28, 28), torch.randint(0, 3, (50,))
    parts = _parts(50, n)
    fake, fake_y = torch.rand(4, 1, 28, 28), torch.randint(0, 3, (4,))
    torch.manual_seed(1)
    modules = [CondConvTeacher(num_classes=3, channels=1, resolution=28, ndf=2) for _ in range(n)]
    before = [_flat(m) for m in modules]

    def update(x: torch.Tensor) -> list[torch.Tensor]:
        ens = TeacherEnsemble.from_modules(modules, lr=1e-2)
        teacher_update(ens, copy.deepcopy(parts), x, y_all, fake, fake_y, steps=3, batch=4)
        return [_flat(ens.teacher(i)) for i in range(n)]

    base = update(x_all)
    x_pert = x_all.clone()
    x_pert[parts.members(3)] = torch.rand(len(parts.members(3)), 1, 28, 28)  # every row of partition 3 (no other)
    pert = update(x_pert)
    for i in range(n):
        assert not torch.equal(base[i], before[i])  # every teacher trained
        assert torch.equal(base[i], pert[i]) == (i != 3), f"teacher {i}"


def test_the_student_is_trained_on_generated_samples_only(make_cfg, monkeypatch) -> None:
    data = _image_split()
    generated: list[torch.Tensor] = []
    seen: list[torch.Tensor] = []
    original_g, original_step = pate_gan.CondDCGANGenerator, pate_gan.student_step

    class SpyGenerator(original_g):  # records every sample the generator makes
        def forward(self, z, y):
            out = super().forward(z, y)
            generated.append(out.detach().clone())
            return out

    def spy_step(student, opt, x, y, labels):
        seen.append(x.detach().clone())
        return original_step(student, opt, x, y, labels)

    monkeypatch.setattr(pate_gan, "CondDCGANGenerator", SpyGenerator)
    monkeypatch.setattr(pate_gan, "student_step", spy_step)
    method = _method(make_cfg, _image_ctx())  # eps=inf: every query answered, so the student trains every step
    method.fit(data, PrivacyBudget(math.inf, 1e-5), PrivacyLedger(target_epsilon=math.inf, delta=1e-5))
    assert len(seen) == 5 and all(len(x) == 4 for x in seen)
    private = torch.from_numpy(data.x).flatten(1)
    made = torch.cat(generated).flatten(1)
    for x in seen:
        for row in x.flatten(1):
            assert not (private == row).all(1).any()  # never a private row
            assert (made == row).all(1).any()  # always one of the generator's samples


# ---- (2) the student's labels -------------------------------------------------------------------------------------


def test_student_labels_follow_unanimous_teachers_and_unanswered_queries_are_dropped() -> None:
    logits = torch.tensor([[3.0, -1.0, 2.0], [0.5, -2.0, 1.0], [4.0, -0.1, 0.2], [1.0, -3.0, -1.0]])  # 4 teachers
    votes = binary_votes(logits)
    assert votes.tolist() == [[0, 4], [4, 0], [1, 3]]  # (fake, real) counts per sample; a logit of 0 is fake
    noise = torch.Generator().manual_seed(0)
    unanimous = binary_votes(torch.tensor([[1.0, -1.0]] * 100))
    answered, label = student_labels(unanimous, sigma_threshold=1e-3, sigma=1e-3, threshold=50, generator=noise)
    assert answered.all() and label.tolist() == [1, 0]  # the teachers' majority, as they agree
    answered, label = student_labels(unanimous, sigma_threshold=1e-3, sigma=1e-3, threshold=101, generator=noise)
    assert not answered.any() and label.tolist() == [-1, -1]  # threshold not met: nothing for the student
    answered, label = student_labels(votes, sigma_threshold=None, sigma=None, threshold=None, generator=None)
    assert answered.all() and label.tolist() == [1, 0, 1]  # eps=inf: plain argmax


def test_each_teacher_cuts_at_its_own_quantile_of_the_generated_samples() -> None:
    """vote_quantile: teacher i votes "real" above the quantile of its own logits on the step's samples, so teachers
    that call every sample fake (all logits < 0) still split the samples by how real they look to them."""
    ref = torch.tensor([[-9.0, -5.0, -3.0, -1.0], [-4.0, -3.0, -2.0, -1.0], [1.0, 2.0, 3.0, 4.0]])  # 3 teachers
    cut = vote_cuts(ref, 0.5)
    torch.testing.assert_close(cut, torch.tensor([-4.0, -2.5, 2.5]))
    assert binary_votes(ref).tolist() == [[2, 1]] * 4  # the cut at 0: only the third teacher ever says real
    assert binary_votes(ref, cut).tolist() == [[3, 0], [3, 0], [0, 3], [0, 3]]  # each teacher: its upper half
    assert binary_votes(ref, vote_cuts(ref, 0.7)).sum(1).tolist() == [3] * 4  # one vote per teacher per query


def test_the_teachers_cuts_keep_one_vote_per_teacher_between_neighbouring_datasets() -> None:
    """The PATE sensitivity with vote_quantile: replacing every row of one partition moves at most one vote of each
    query (that teacher's), its cut included, since the cut is that teacher's own function of generated samples."""
    n = 7
    torch.manual_seed(0)
    x_all, y_all = torch.rand(70, 1, 28, 28), torch.randint(0, 3, (70,))
    parts = _parts(70, n)
    fake, fake_y = torch.rand(16, 1, 28, 28), torch.randint(0, 3, (16,))
    queries, query_y = torch.rand(64, 1, 28, 28), torch.randint(0, 3, (64,))
    torch.manual_seed(1)
    modules = [CondConvTeacher(num_classes=3, channels=1, resolution=28, ndf=2) for _ in range(n)]

    def votes(x: torch.Tensor) -> torch.Tensor:
        ens = TeacherEnsemble.from_modules(copy.deepcopy(modules), lr=1e-2)
        teacher_update(ens, copy.deepcopy(parts), x, y_all, fake, fake_y, steps=3, batch=4)
        with torch.no_grad():
            return binary_votes(ens.forward_shared(queries, query_y), vote_cuts(ens.forward_shared(fake, fake_y), 0.5))

    base = votes(x_all)
    x_pert = x_all.clone()
    x_pert[parts.members(2)] = torch.rand(len(parts.members(2)), 1, 28, 28) * 0.1  # partition 2's rows (no other)
    pert = votes(x_pert)
    assert (base.sum(1) == n).all() and (pert.sum(1) == n).all()
    assert (base - pert).abs().max() <= 1  # one teacher, one vote per query
    assert (base != pert).any()  # and the perturbed teacher did move some


@pytest.mark.parametrize("quantile", [None, 0.25])
def test_fit_votes_with_each_teachers_cut_when_asked(make_cfg, monkeypatch, quantile) -> None:
    """method.vote_quantile reaches the votes: every step's cuts are each teacher's quantile of its logits on the
    step's generated samples (None: the cut at 0); and teacher_arch=gpate builds G-PATE's teacher."""
    cuts: list[torch.Tensor | None] = []
    original = pate_gan.binary_votes

    def spy(logits, cut=None):
        cuts.append(cut)
        return original(logits, cut)

    monkeypatch.setattr(pate_gan, "binary_votes", spy)
    method = _method(make_cfg, _image_ctx(), f"method.vote_quantile={'null' if quantile is None else quantile}",
                     "method.teacher_arch=gpate")
    assert isinstance(method._make_teacher()(), pate_gan.CondPATETeacher)
    method.fit(_image_split(), PrivacyBudget(math.inf, 1e-5), PrivacyLedger(target_epsilon=math.inf, delta=1e-5))
    assert len(cuts) == 5
    if quantile is None:
        assert all(c is None for c in cuts)
    else:
        assert all(c is not None and c.shape == (10,) and c.isfinite().all() for c in cuts)
        assert len({tuple(c.tolist()) for c in cuts}) == 5  # recomputed every step, as the teachers train
    with pytest.raises(Exception, match="vote_quantile"):
        from dpsyn.cli.config_check import check_composed

        check_composed(make_cfg("method=pate_gan", "method.vote_quantile=1.0"))


# ---- (3) the budget ------------------------------------------------------------------------------------------------


def test_ledger_holds_steps_times_batch_queries_within_the_target(make_cfg) -> None:
    ledger = PrivacyLedger(target_epsilon=1.0, delta=1e-5)
    method = _method(make_cfg, _image_ctx())
    method.fit(_image_split(), PrivacyBudget(1.0, 1e-5), ledger)
    (event,) = ledger.to_dict()["events"]
    assert event["kind"] == "pate" and event["queries"] == 5 * 4 and method.train_log["steps"] == 5
    assert 0 <= event["answered"] <= event["queries"]
    assert ledger.epsilon() <= 1.0
    assert ledger.epsilon() == pytest.approx(pate_data_independent_epsilon(queries=20, sigma_threshold=100, sigma=50,
                                                                           delta=1e-5))


def test_training_stops_before_the_step_that_would_overspend(make_cfg) -> None:
    from dpsyn.privacy import pate_max_queries

    eps = 0.3
    ledger = PrivacyLedger(target_epsilon=eps, delta=1e-5)
    ctx = _image_ctx()
    ctx.trainer = {}
    method = _method(make_cfg, ctx, "method.steps=1000")
    method.fit(_image_split(), PrivacyBudget(eps, 1e-5), ledger)
    most = pate_max_queries(epsilon=eps, sigma_threshold=100, sigma=50, delta=1e-5)
    assert method.train_log["stopped_by"] == "budget" and method.train_log["steps"] < 1000
    assert method.train_log["queries"] == most // 4 * 4  # as many whole steps of 4 as the budget allows
    assert ledger.epsilon() <= eps


def test_under_the_renyi_filter_an_unanswered_label_pays_only_the_threshold(make_cfg) -> None:
    """bound=renyi_filter: the run stops before a step of 4 queries, all answered, could pass the filter's budget,
    and reports the budget's epsilon (tests/test_privacy_renyi_filter.py checks the filter against dp_accounting)."""
    eps = 0.3
    ledger = PrivacyLedger(target_epsilon=eps, delta=1e-5)
    ctx = _image_ctx()
    ctx.trainer = {}
    method = _method(make_cfg, ctx, "method.steps=1000", "method.bound=renyi_filter")
    method.fit(_image_split(), PrivacyBudget(eps, 1e-5), ledger)
    (event,) = ledger.events
    log = method.train_log
    a, budget = event.filter_order, event.filter_budget
    threshold_cost, gnmax_cost = a / (2 * 100**2), a / 50**2
    spent = log["queries"] * threshold_cost + log["answered"] * gnmax_cost
    assert log["stopped_by"] == "budget" and log["filter_spent"] == pytest.approx(spent)
    assert spent <= budget < spent + 4 * (threshold_cost + gnmax_cost)
    assert event.max_queries == ctx.capped_steps(1000) * 4  # the step cap's queries, fixed before the run
    assert ledger.epsilon() == pytest.approx(eps, rel=1e-6) and ledger.epsilon() <= eps


# ---- (4) end to end --------------------------------------------------------------------------------------------


def test_pate_gan_runs_end_to_end_on_images(make_cfg, tmp_path) -> None:
    from dpsyn.task import run

    # fmnist_shoes: acc's classifier is scored on its 3k eval images (fmnist's: 10k); acc is the one metric read
    result = run(make_cfg("method=pate_gan", "dataset=fmnist_shoes", *TINY, "method.teachers=20", "eps=1",
                          "metrics.names.image=[acc]", "metrics.n_samples=200"), tmp_path / "run")
    (event,) = result["privacy_events"]
    assert event["kind"] == "pate" and event["queries"] == 5 * 4
    assert 0 < result["epsilon_spent"] <= 1.0 and "pate" in result["accountant"]
    prov = result["sample_provenance"]
    assert prov["method"] == "pate_gan" and prov["teachers"] == 20 and prov["queries"] == 20 and prov["steps"] == 5
    assert prov["labels"].startswith("uniform")
    assert 0 <= result["metrics"]["acc"] <= 1
    assert (tmp_path / "run" / "samples.png").is_file()


def test_pate_gan_runs_end_to_end_on_a_table(make_cfg, tmp_path) -> None:
    from dpsyn.task import run

    result = run(make_cfg("method=pate_gan", "dataset=breast_cancer", *TINY, "eps=2", "method.sigma_threshold=30",
                          "method.sigma=20", "method.class_ratio_epsilon=0.05", "metrics.n_samples=200"),
                 tmp_path / "run")
    ratio, event = result["privacy_events"]  # the Laplace class ratio first, then the teachers' votes
    assert ratio["kind"] == "approx_dp" and ratio["epsilon"] == 0.05 and ratio["delta"] == 0
    assert event["kind"] == "pate" and event["queries"] == result["sample_provenance"]["queries"] > 0
    assert result["epsilon_spent"] <= 2.0
    assert result["sample_provenance"]["labels"] == "drawn from the Laplace-released class proportions"
    samples = np.load(tmp_path / "run" / "samples.npz")
    assert samples["x"].shape == (200, 30) and samples["x"].min() >= 0 and samples["x"].max() <= 1
    assert 0 <= result["metrics"]["auroc"] <= 1


def test_pate_gan_without_noise_at_eps_inf_and_config_errors(make_cfg) -> None:
    ledger = PrivacyLedger(target_epsilon=math.inf, delta=1e-5)
    method = _method(make_cfg, _image_ctx())
    method.fit(_image_split(), PrivacyBudget(math.inf, 1e-5), ledger)
    assert math.isinf(ledger.epsilon()) and ledger.to_dict()["events"][0]["kind"] == "non_private"
    assert method.sample(7).x.shape == (7, 1, 28, 28)
    table = RunContext(seed=0, deterministic_noise=True, accountant="rdp", kind="table", shape=(30,), num_classes=2,
                       classes=["m", "b"])
    with pytest.raises(ValueError, match="method.teacher_arch"):  # depends on the data kind: checked by the method
        _method(make_cfg, table, "method.teacher_arch=conv")
    from dpsyn.cli.config_check import ConfigError, check_composed

    for override, key in (("method.bound=smooth", "method.bound"), ("method.teachers=0", "method.teachers"),
                          ("method.s_hidden=[]", "method.s_hidden")):  # the schema's ranges, at compose time
        with pytest.raises(ConfigError, match=key):
            check_composed(make_cfg("method=pate_gan", override))


# ---- README's PATE-GAN ladder: the first rung trains G on the teachers themselves (eps=inf only) -------------------


def test_the_ensemble_loss_is_minus_the_log_of_the_teachers_mean_probability() -> None:
    torch.manual_seed(0)
    modules = [CondConvTeacher(num_classes=3, channels=1, resolution=28, ndf=2) for _ in range(4)]
    ens = TeacherEnsemble.from_modules(modules, lr=1e-2)
    fake = torch.rand(5, 1, 28, 28, requires_grad=True)
    y = torch.randint(0, 3, (5,))
    loss = ensemble_generator_loss(ens, fake, y)
    probs = torch.stack([torch.sigmoid(m(fake, y)) for m in modules])  # (4, 5), each teacher as a plain module
    assert loss.item() == pytest.approx(-torch.log(probs.mean(0)).mean().item(), rel=1e-5)
    (grad,) = torch.autograd.grad(loss, fake)
    assert grad.abs().sum() > 0  # a direction for G, from the teachers


def _fit_generator(make_cfg, *overrides: str) -> torch.Tensor:
    method = _method(make_cfg, _image_ctx(), *overrides)
    method.fit(_image_split(), PrivacyBudget(math.inf, 1e-5), PrivacyLedger(target_epsilon=math.inf, delta=1e-5))
    signal = "teachers" if "method.inf_signal=teachers" in overrides else "student"
    assert method.sample(3).provenance["inf_signal"] == signal  # every result says which rung made it
    return _flat(method.G)


def test_the_ladders_first_rung_steps_the_generator_on_the_teachers_not_the_student(make_cfg) -> None:
    # with inf_signal=teachers G never reads the student: another student learning rate leaves G bit for bit the same,
    # while under Algorithm 1 (inf_signal=student) the same change moves G
    teachers = _fit_generator(make_cfg, "method.inf_signal=teachers")
    assert torch.equal(teachers, _fit_generator(make_cfg, "method.inf_signal=teachers", "method.lr_s=5e-2"))
    student = _fit_generator(make_cfg)
    assert not torch.equal(student, _fit_generator(make_cfg, "method.lr_s=5e-2"))
    assert not torch.equal(teachers, student)  # and the rung does change what G learns


def test_the_ladders_first_rung_is_refused_for_private_runs(make_cfg) -> None:
    method = _method(make_cfg, _image_ctx(), "method.inf_signal=teachers")
    ledger = PrivacyLedger(target_epsilon=10.0, delta=1e-5)
    with pytest.raises(ValueError, match="inf_signal=teachers.*not differentially private"):
        method.fit(_image_split(), PrivacyBudget(10.0, 1e-5), ledger)
    assert len(ledger.events) == 0  # refused before anything is recorded or trained
    from dpsyn.cli.config_check import ConfigError, check_composed

    with pytest.raises(ConfigError, match="method.inf_signal"):
        check_composed(make_cfg("method=pate_gan", "method.inf_signal=oracle"))


def test_the_progress_bar_shows_steps_epsilon_and_answered_share(make_cfg, monkeypatch) -> None:
    monkeypatch.setattr(RecordingBar, "made", [])
    monkeypatch.setattr(session, "tqdm", RecordingBar)
    ledger = PrivacyLedger(target_epsilon=10.0, delta=1e-5)
    _method(make_cfg, _image_ctx()).fit(_image_split(), PrivacyBudget(10.0, 1e-5), ledger)
    (bar,) = RecordingBar.made
    assert bar.desc == "pate_gan steps" and bar.total == bar.n == 5 and bar.closed
    assert len(bar.postfixes) == 5 and set(bar.postfixes[0]) == {"eps", "answered"}
    assert float(bar.postfixes[-1]["eps"]) == pytest.approx(ledger.epsilon(), abs=1e-3) and ledger.epsilon() > 0
    assert all(0 <= float(p["answered"]) <= 1 for p in bar.postfixes)


# ---- (5) resume ----------------------------------------------------------------------------------------------------


def test_a_crashed_run_resumes_without_spending_twice(make_cfg, tmp_path, monkeypatch) -> None:
    """Crash in step 4 (checkpoint every 2): the re-run resumes at step 2 and the ledger counts 5 steps once."""
    data, budget = _image_split(), PrivacyBudget(1.0, 1e-5)
    original = pate_gan.student_labels
    monkeypatch.setattr(pate_gan, "student_labels", crash_on_call(original, 4))
    ledger = PrivacyLedger(target_epsilon=1.0, delta=1e-5)
    with pytest.raises(RuntimeError, match="killed"):
        _method(make_cfg, _image_ctx(run_dir=tmp_path), "method.checkpoint_every=2").fit(data, budget, ledger)
    assert (tmp_path / "checkpoints" / "pate_gan.pt").is_file()

    monkeypatch.setattr(pate_gan, "student_labels", original)
    ledger = PrivacyLedger(target_epsilon=1.0, delta=1e-5)  # a fresh process: the ledger comes from the checkpoint
    method = _method(make_cfg, _image_ctx(run_dir=tmp_path), "method.checkpoint_every=2")
    method.fit(data, budget, ledger)
    (event,) = ledger.to_dict()["events"]
    assert event["queries"] == 5 * 4 == method.train_log["queries"]  # 2 steps restored + 3 after the resume
    assert ledger.epsilon() == pytest.approx(pate_data_independent_epsilon(queries=20, sigma_threshold=100, sigma=50,
                                                                           delta=1e-5))
    with pytest.raises(ValueError, match="resume with the same config"):
        _method(make_cfg, _image_ctx(run_dir=tmp_path), "method.checkpoint_every=2", "method.sigma=60").fit(
            data, budget, PrivacyLedger(target_epsilon=1.0, delta=1e-5))


def test_a_resumed_table_run_reuses_its_class_ratio_release(make_cfg, tmp_path, monkeypatch) -> None:
    """A crash after the Laplace release: the re-run charges that release once and draws no new noise."""
    from dpsyn.task import run

    over = ("method=pate_gan", "dataset=breast_cancer", *TINY, "eps=2", "method.sigma_threshold=30", "method.sigma=20",
            "method.class_ratio_epsilon=0.05", "method.checkpoint_every=2", "metrics.names.table=[]",
            "metrics.n_samples=50")
    original = pate_gan.student_labels
    monkeypatch.setattr(pate_gan, "student_labels", crash_on_call(original, 4))
    with pytest.raises(RuntimeError, match="killed"):
        run(make_cfg(*over), tmp_path / "run")
    saved = json.loads((tmp_path / "run" / "checkpoints" / "class_proportions.json").read_text())["proportions"]
    monkeypatch.setattr(pate_gan, "student_labels", original)
    monkeypatch.setattr("dpsyn.methods.base.dp_class_proportions", lambda *a, **k: pytest.fail("drew new noise"))
    result = run(make_cfg(*over), tmp_path / "run")
    ratio, event = result["privacy_events"]
    # step 3's queries were journalled before the crash (their answers were used): kept, and step 3 redone
    assert ratio["kind"] == "approx_dp" and ratio["epsilon"] == 0.05 and event["queries"] == 6 * 4
    assert result["epsilon_spent"] <= 2.0
    assert result["sample_provenance"]["class_proportions"] == pytest.approx(list(saved))
