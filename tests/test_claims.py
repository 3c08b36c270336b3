"""Claims as data: the interval (against scipy's Welch test), the verdict rules, the selectors, the repo's claims."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from scipy import stats

from dpsyn.cli import tables as cli_tables
from dpsyn.paths import CONF_DIR, REPO_DIR
from dpsyn.results import claims as cl

EXPERIMENTS = REPO_DIR / "experiments"


def _rec(method: str, seed: int, value: float, *, metric: str = "acc", profile: str = "quick", eps: float = 1.0,
         overrides: tuple[str, ...] = (), **metrics: float) -> dict:
    return {"experiment": "exp", "profile": profile, "method": method, "dataset": "d", "eps": eps, "seed": seed,
            "overrides": [f"method={method}", *overrides], "metrics": {metric: value, **metrics}}


def _claim(kind: str = "greater", b: cl.Side | None = None, margin: float = 0.0, metric: str = "acc") -> cl.Claim:
    return cl.Claim(paper="p", id="c", wording="w", source="s", metric=metric, kind=kind,
                    a=cl.Side({"experiment": "exp", "method": "a", "dataset": "d", "eps": 1}),
                    b=b or cl.Side({"experiment": "exp", "method": "b", "dataset": "d", "eps": 1}), margin=margin)


@pytest.mark.parametrize("a,b", [([0.61, 0.55, 0.70], [0.40, 0.52, 0.45]), ([1.0, 2.0, 4.0, 3.5], [2.5, 2.6]),
                                 ([10.0, 30.0, 20.0], [19.0, 21.0, 20.5])])
def test_welch_interval_is_scipys(a: list[float], b: list[float]) -> None:
    diff, lo, hi, _ = cl.welch_interval(a, b)
    res = stats.ttest_ind(a, b, equal_var=False)
    ci = res.confidence_interval(0.95)
    assert diff == pytest.approx(sum(a) / len(a) - sum(b) / len(b))
    assert (lo, hi) == pytest.approx((ci.low, ci.high), rel=1e-9)
    assert (lo > 0 or hi < 0) == (res.pvalue < 0.05)  # the interval excludes 0 exactly when the test rejects


def test_one_sample_interval_is_scipys() -> None:
    a = [0.70, 0.74, 0.69]
    diff, lo, hi, df = cl.welch_interval(a, 0.718)
    ci = stats.ttest_1samp(a, 0.718).confidence_interval(0.95)
    assert (lo + 0.718, hi + 0.718) == pytest.approx((ci.low, ci.high), rel=1e-9)
    assert df == 2


def test_verdicts_follow_the_interval() -> None:
    recs = [_rec("a", s, v) for s, v in enumerate([0.60, 0.62, 0.61])]
    recs += [_rec("b", s, v) for s, v in enumerate([0.30, 0.31, 0.33])]
    assert cl.evaluate(_claim("greater"), recs).verdict == "holds"
    assert cl.evaluate(_claim("less"), recs).verdict == "fails"
    noisy = [_rec("a", s, v) for s, v in enumerate([0.2, 0.9, 0.5])] + [r for r in recs if r["method"] == "b"]
    v = cl.evaluate(_claim("greater"), noisy)
    assert v.verdict == "inconclusive" and v.ci[0] < 0 < v.ci[1]
    # within: the whole interval inside [-margin, margin]
    assert cl.evaluate(_claim("within", b=cl.Side({}, value=0.61), margin=0.05), recs).verdict == "holds"
    assert cl.evaluate(_claim("within", b=cl.Side({}, value=0.80), margin=0.05), recs).verdict == "fails"
    # a side compared on another metric of the same runs (PE's last population against its first)
    same = [_rec("a", s, v, iter0=v + 5.0) for s, v in enumerate([1.0, 1.5, 1.2])]
    c = cl.Claim("p", "c", "w", "s", "acc", "less", a=cl.Side({"method": "a"}), b=cl.Side({"method": "a"}, metric="iter0"))
    assert cl.evaluate(c, same).verdict == "holds"


def test_no_interval_without_two_seeds_and_ties_fail_strict_claims() -> None:
    one = [_rec("a", 0, 0.9), _rec("b", 0, 0.1), _rec("b", 1, 0.2)]
    v = cl.evaluate(_claim("greater"), one)
    assert v.verdict == "inconclusive" and "2 seeds" in v.reason and math.isnan(v.ci[0]) and v.diff == pytest.approx(0.75)
    assert "no runs for b" in cl.evaluate(_claim("greater"), [_rec("a", 0, 0.9)]).reason
    # every seed at chance, written two ways: a tie, which contradicts "greater than chance"
    tie = [_rec("a", s, 0.1 + (1e-17 if s else 0.0)) for s in range(3)]
    assert cl.evaluate(_claim("greater", b=cl.Side({}, value=0.1)), tie).verdict == "fails"


def test_selectors_match_overrides_profiles_and_one_value_per_seed() -> None:
    recs = [_rec("a", 0, 0.5, overrides=("f0=0.05",)), _rec("a", 0, 0.9, overrides=("f0=0.5",)),
            _rec("a", 1, 0.4, profile="embedded", overrides=("f0=0.05",)),
            _rec("a", 1, 0.3, profile="quick", overrides=("f0=0.05",)),  # same seed in two profiles: embedded wins
            _rec("a", 2, 0.7, profile="paper", overrides=("f0=0.05",))]  # another profile: not read
    side = cl.Side({"method": "a", "f0": 0.05})
    assert cl.side_values(recs, side, "acc", ("embedded", "quick")) == [0.5, 0.4]
    # a variant (an override the selector does not name) is not a seed of the plain cell
    assert cl.side_values(recs + [_rec("a", 3, 0.9, overrides=("f0=0.05", "method.lr=1"))], side, "acc",
                          ("embedded", "quick")) == [0.5, 0.4]
    flag = [_rec("a", 0, 0.5, overrides=("method.conditional=false",))]
    assert cl.side_values(flag, cl.Side({"method.conditional": False}), "acc", ("quick",)) == [0.5]
    assert cl.side_values(flag, cl.Side({"method.conditional": True}), "acc", ("quick",)) == []


def test_a_claim_across_protocols_is_refused_not_judged() -> None:
    old, new = "dpsyn:small_cnn,x1,5ep,constant,n9000", "dpimagebench:resnet_110+wrn_40_4+resnext_29,50ep,n10000,real_val5000"

    def runs(method: str, values: list[float], protocols: list[str]) -> list[dict]:
        return [{**_rec(method, s, v), "protocol": p} for s, (v, p) in enumerate(zip(values, protocols))]

    a, b = [0.60, 0.62, 0.61], [0.30, 0.31, 0.33]
    same = cl.evaluate(_claim("greater"), runs("a", a, [old] * 3) + runs("b", b, [old] * 3))
    assert same.verdict == "holds" and same.protocol == old and same.to_dict()["protocol"] == old
    across = cl.evaluate(_claim("greater"), runs("a", a, [old] * 3) + runs("b", b, [new] * 3))
    assert across.verdict == "refused" and across.reason == f"mixed protocols: {old} (a) vs {new} (b)"
    assert math.isnan(across.ci[0]) and across.protocol is None
    within = cl.evaluate(_claim("greater", b=cl.Side({}, value=0.1)), runs("a", a, [old, old, new]))
    assert within.verdict == "refused" and within.reason.startswith("mixed protocols within a:")
    # a run kept before protocol ids is no match for one with an id
    legacy = cl.evaluate(_claim("greater"), runs("a", a, [old] * 3) + runs("b", b, [""] * 3))
    assert legacy.verdict == "refused" and "(none recorded)" in legacy.reason
    md = cl.render_markdown([same, across])
    assert "**refused** (mixed protocols: " in md and "1 hold, 0 fail, 0 inconclusive, 1 refused" in md
    assert f"one evaluation protocol: `{old}` (1)" in md


def test_malformed_claims_name_the_claim(tmp_path: Path) -> None:
    p = tmp_path / "claims.yaml"
    p.write_text("claims:\n  - {id: x1, wording: w, source: s, metric: acc, claim: within, a: {method: a}, b: {value: 1}}\n")
    with pytest.raises(ValueError, match="x1.*margin"):
        cl.load_claims(p)
    p.write_text("claims:\n  - {id: x2, wording: w, source: s, metric: acc, claim: bigger, a: {method: a}, b: {value: 1}}\n")
    with pytest.raises(ValueError, match="x2.*allowed"):
        cl.load_claims(p)


def test_the_repos_claims_cover_the_four_papers_and_name_real_experiments_and_metrics() -> None:
    claims = [c for p in cl.claim_files(EXPERIMENTS) for c in cl.load_claims(p)]
    assert len(claims) >= 12
    assert {"wu2023", "lin2023", "long2021", "rajotte2020"} <= {c.paper for c in claims}
    spec_metrics = set()
    for spec in cli_tables.specs():
        from dpsyn.results.tables import load_spec

        spec_metrics.update(m.name for m in load_spec(spec).metrics)
    for c in claims:
        for side in (c.a, c.b):
            if side.value is not None:
                continue
            exp = side.select["experiment"]
            assert (CONF_DIR / "experiment" / f"{exp}.yaml").is_file(), (c.id, exp)
            assert (side.metric or c.metric) in spec_metrics, (c.id, side.metric or c.metric)
        assert c.wording and c.source


def test_claims_command_writes_verdicts_from_kept_results(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    cli_tables.main(["claims", "--from", str(EXPERIMENTS), "--out", str(tmp_path)])
    out = json.loads((tmp_path / "claims.json").read_text())
    assert len(out) >= 12 and all(v["verdict"] in ("holds", "fails", "inconclusive") for v in out)
    decided = [v for v in out if v["ci95"] is not None]
    assert all(v["a"]["n"] >= 2 for v in decided)
    assert "claims:" in capsys.readouterr().out


def test_dpimagebench_claims_are_decided_by_runs_at_dpimagebench_settings_only() -> None:
    """DPImageBench's numbers come from their training length: the claims read the `dib` profile only, and that
    profile composes with their DP-GAN settings (configs/DPGAN/fmnist_28_eps*.yaml, dataset_loader.py)."""
    import math

    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    claims = {c.id: c for c in cl.load_claims(EXPERIMENTS / "dpimagebench" / "claims.yaml")}
    assert all(c.profiles == ("dib",) for c in claims.values())
    claim = claims["dpgan-eps1"]
    rec = {**_rec("dp_gan", 0, 0.70, profile="embedded"), "experiment": "dpimagebench_fmnist", "dataset": "fmnist"}
    assert cl.side_values([rec], claim.a, "acc", claim.profiles) == []  # a short embedded run decides nothing
    assert cl.side_values([{**rec, "profile": "dib"}], claim.a, "acc", claim.profiles) == [0.70]

    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            dib = ["experiment=dpimagebench_fmnist_dib"]
            cfg = compose(config_name="train", overrides=[*dib, "method=dp_gan"])
            gsw = compose(config_name="train", overrides=[*dib, "method=gs_wgan"])
            sweep = compose(config_name="train", overrides=dib, return_hydra_config=True).hydra.sweeper.params
            embedded = compose(config_name="train", overrides=["method=gs_wgan"])
    finally:
        GlobalHydra.instance().clear()
    assert set(str(sweep.method).split(",")) == {"dp_gan", "gs_wgan"}  # every DPImageBench claim has its cells
    assert {c.a.select["method"] for c in claims.values()} == {"dp_gan", "gs_wgan"}
    for c in (cfg, gsw):
        assert (c.profile, c.experiment_name) == ("dib", "dpimagebench_fmnist")
        assert (c.dataset.n_private, c.metrics.n_samples, c.metrics.protocol) == (None, 60000, "dpimagebench")
        assert c.privacy.delta == pytest.approx(1 / (55000 * math.log(55000)), rel=1e-4)
    m = cfg.method
    assert (m.batch_size, m.max_grad_norm, m.lr_d, m.lr_g, m.beta1, m.d_steps) == (4096, 0.001, 5e-4, 2e-4, 0.0, 5)
    assert cfg.trainer.max_epochs == 150
    # GS-WGAN at DPImageBench's setting (configs/GS-WGAN/fmnist_28_eps*.yaml, models/gs_wgan.py)
    g = gsw.method
    assert (g.critics, g.warm_start_iterations, g.iterations, g.batch_size, g.critic_steps) == (1000, 2000, 20000, 32, 5)
    assert (g.lr_g, g.lr_d, g.beta1, g.beta2, g.ema, g.z_dim, g.clip) == (1e-4, 1e-4, 0.5, 0.9, 0.999, 10, 1.0)
    assert (g.gp_weight, g.drift) == (10.0, 1e-3)
    # ... and only there: the embedded gs_wgan keeps its CPU-sized defaults (fmnist's at eps=1: gs_wgan_fmnist.yaml)
    e = embedded.method
    assert (e.critics, e.warm_start_iterations, e.iterations, e.batch_size, e.lr_d) == (100, 150, 12000, 8, 1e-3)
    assert embedded.privacy.delta == 1e-5
