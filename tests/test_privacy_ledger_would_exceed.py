"""PrivacyLedger.would_exceed / epsilon_if ("stop before overspending"), the ledger's one RDP -> epsilon conversion,
and its save through dpsyn.results.io.

would_exceed must give exactly what the methods computed before (g_pate.py:428, pate_gan.py:301 at 83123e5) by
deep-copying the ledger, adding the event (or recording the queries) and comparing with ``target * (1 + 1e-9)``;
and it must leave the ledger as it was.
"""

from __future__ import annotations

import copy
import json
import logging
import os

import numpy as np
import pytest

from dpsyn.privacy import (
    ApproxDPEvent,
    GaussianEvent,
    NonPrivateEvent,
    PATEEvent,
    PrivacyLedger,
    SampledGaussianEvent,
    gaussian_rdp,
    rdp_to_epsilon,
)
from dpsyn.privacy.dpsgd import rdp_orders

DELTA = 1e-5


def _votes(rng: np.random.Generator, q: int, teachers: int = 250, bins: int = 4) -> np.ndarray:
    return np.stack([np.bincount(rng.choice(bins, size=teachers, p=[0.7, 0.1, 0.1, 0.1]), minlength=bins)
                     for _ in range(q)])


def _pate(rng: np.random.Generator, i: int) -> PATEEvent:
    event = PATEEvent(sigma_threshold=150.0, sigma=40.0, threshold=200.0,
                      bound=str(rng.choice(["data_independent", "data_dependent"])), label=f"p{i}")
    q = int(rng.integers(1, 20))
    event.add_queries(_votes(rng, q), rng.random(q) < 0.7)
    return event


def _event(rng: np.random.Generator, i: int):
    kind = int(rng.integers(0, 20))
    if kind == 0:
        return NonPrivateEvent(label=f"n{i}")
    if kind <= 5:
        return GaussianEvent(noise_multiplier=float(rng.uniform(2, 40)), count=int(rng.integers(1, 6)), label=f"g{i}")
    if kind <= 9:
        return ApproxDPEvent(epsilon=float(rng.uniform(0.01, 0.3)), delta=float(rng.choice([0.0, 1e-8])),
                             label=f"a{i}")
    if kind <= 14:
        return _pate(rng, i)
    return SampledGaussianEvent(sampling="poisson",
                                noise_multiplier=float(rng.uniform(0.8, 3)), sample_rate=float(rng.uniform(1e-3, 0.05)),
                                steps=int(rng.integers(1, 300)), accountant=str(rng.choice(["rdp", "prv"])),
                                label=f"s{i}")


def _before(ledger: PrivacyLedger, event) -> float:
    trial = copy.deepcopy(ledger)  # the old way: copy everything, add, compose
    trial.add(copy.deepcopy(event))
    return trial.epsilon()


@pytest.mark.parametrize("seed", [0, 1, *(pytest.param(s, marks=pytest.mark.slow) for s in range(2, 6))])
def test_would_exceed_equals_deepcopy_and_add(seed):
    rng = np.random.default_rng(seed)
    ledger = PrivacyLedger(target_epsilon=3.0, delta=DELTA)
    checked = 0
    for i in range(12):
        event = _event(rng, i)
        expected = _before(ledger, event)
        before_dict = ledger.to_dict()
        assert ledger.epsilon_if(event) == expected  # bit-identical: the same composition of the same events
        for target in (expected, expected * (1 + 0.5e-9), expected * (1 - 2e-9), expected / 2, expected * 2):
            if not 0 < target < float("inf"):
                continue
            probe = PrivacyLedger(target_epsilon=target, delta=DELTA, events=ledger.events)
            old_rule = expected > target * (1 + 1e-9)
            assert probe.would_exceed(event) is old_rule
            checked += 1
        assert ledger.to_dict() == before_dict  # nothing recorded, nothing changed
        if isinstance(event, NonPrivateEvent):
            assert ledger.would_exceed(event) is True  # (checked, not kept: every later epsilon would be inf)
        else:
            ledger.add(event)
    assert checked >= 30


@pytest.mark.parametrize("bound", ["data_independent", "data_dependent"])
def test_pate_queries_would_exceed_equals_deepcopy_and_record(bound):
    rng = np.random.default_rng(7)
    ledger = PrivacyLedger(target_epsilon=2.0, delta=DELTA)
    ledger.add(ApproxDPEvent(epsilon=0.01, delta=0.0, label="class proportions"))
    event_id = ledger.add(PATEEvent(sigma_threshold=150.0, sigma=40.0, threshold=200.0, bound=bound, label="votes"))
    stopped = False
    for _ in range(200):
        votes = _votes(rng, 16)
        ones = np.ones(16, dtype=bool)
        old = copy.deepcopy(ledger)  # g_pate.py:428 / pate_gan.py:301 at 83123e5
        old.record_pate_queries(event_id, votes, ones)
        old_stop = old.epsilon() > 2.0 * (1 + 1e-9)
        recorded = ledger.events[event_id].queries
        trial = ledger.events[event_id].with_queries(votes, ones)
        assert ledger.epsilon_if(trial, replacing=event_id) == old.epsilon()
        assert ledger.would_exceed(trial, replacing=event_id) is old_stop
        assert ledger.events[event_id].queries == recorded  # the recorded event is untouched
        if old_stop:
            stopped = True
            break
        ledger.record_pate_queries(event_id, votes, rng.random(16) < 0.8)
    assert stopped  # the loop reached the budget, so both answers were compared


def test_would_exceed_refuses_what_add_refuses():
    ledger = PrivacyLedger(target_epsilon=1.0, delta=DELTA)
    with pytest.raises(ValueError, match="not a privacy event"):
        ledger.would_exceed("gaussian")
    with pytest.raises(ValueError, match="no event with id"):
        ledger.would_exceed(GaussianEvent(noise_multiplier=3.0), replacing=0)
    assert ledger.would_exceed(NonPrivateEvent(label="x")) is True
    assert PrivacyLedger(target_epsilon=float("inf"), delta=DELTA).would_exceed(NonPrivateEvent(label="x")) is False


# ---------------------------------------------------------------------------------------------------------------------
# one RDP -> epsilon conversion
# ---------------------------------------------------------------------------------------------------------------------


def test_ledger_mixed_composition_uses_rdp_to_epsilon():
    from opacus.accountants.analysis.rdp import compute_rdp

    ledger = PrivacyLedger(target_epsilon=10.0, delta=DELTA)
    ledger.add(GaussianEvent(noise_multiplier=5.0, count=3))
    ledger.add(SampledGaussianEvent(sampling="poisson",
                                    noise_multiplier=1.1, sample_rate=0.01, steps=200, accountant="rdp"))
    pate = _pate(np.random.default_rng(3), 0)
    ledger.add(pate)
    orders = rdp_orders()
    curve = (np.asarray(compute_rdp(q=0.01, noise_multiplier=1.1, steps=200, orders=orders))
             + 3 * gaussian_rdp(noise_multiplier=5.0, orders=orders) + pate.rdp(orders))
    assert ledger.epsilon() == rdp_to_epsilon(rdp=curve, orders=orders, delta=DELTA)[0]


def test_rdp_to_epsilon_matches_dp_accounting():
    dpa = pytest.importorskip("dp_accounting")
    from dp_accounting.rdp import rdp_privacy_accountant
    from opacus.accountants.analysis.rdp import compute_rdp

    orders = [float(a) for a in range(2, 64)] + [128.0, 256.0]
    logging.disable(logging.WARNING)
    try:
        for sigma_g, count, sigma, q, steps in [(5.0, 3, 1.1, 0.01, 200), (20.0, 10, 2.0, 0.05, 1000),
                                                (3.0, 1, 0.9, 0.002, 50)]:
            curve = (np.asarray(compute_rdp(q=q, noise_multiplier=sigma, steps=steps, orders=orders))
                     + count * gaussian_rdp(noise_multiplier=sigma_g, orders=orders))
            acc = rdp_privacy_accountant.RdpAccountant(orders=orders)
            acc.compose(dpa.GaussianDpEvent(sigma_g), count)
            acc.compose(dpa.PoissonSampledDpEvent(q, dpa.GaussianDpEvent(sigma)), steps)
            assert rdp_to_epsilon(rdp=curve, orders=orders, delta=DELTA)[0] == pytest.approx(
                acc.get_epsilon(DELTA), rel=1e-6)
    finally:
        logging.disable(logging.NOTSET)


def test_get_privacy_spent_is_called_in_one_place():
    """The conversion lives in dpsyn.privacy.dpsgd.rdp_to_epsilon only (the ledger had a second copy)."""
    from pathlib import Path

    import dpsyn

    root = Path(dpsyn.__file__).parent
    users = sorted(str(p.relative_to(root)) for p in root.rglob("*.py") if "get_privacy_spent(" in p.read_text())
    assert users == ["privacy/dpsgd.py"]


# ---------------------------------------------------------------------------------------------------------------------
# the ledger writes through dpsyn.results.io
# ---------------------------------------------------------------------------------------------------------------------


def test_save_goes_through_atomic_write_json(tmp_path, monkeypatch):
    import dpsyn.privacy.ledger.writer as ledger_module

    calls = []
    real = ledger_module.atomic_write_json
    monkeypatch.setattr(ledger_module, "atomic_write_json", lambda path, data: calls.append(path) or real(path, data))
    ledger = PrivacyLedger(target_epsilon=1.0, delta=DELTA)
    ledger.add(GaussianEvent(noise_multiplier=20.0, label="h"))
    path = ledger.save(tmp_path)
    assert calls == [tmp_path / "privacy.json"] and path == tmp_path / "privacy.json"
    text = path.read_text()
    assert text == json.dumps(ledger.to_dict(), indent=2, allow_nan=False) + "\n"  # the format of before
    assert oct(os.stat(path).st_mode & 0o777) == oct(0o666 & ~_umask())
    assert PrivacyLedger.load(path).epsilon() == ledger.epsilon()


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
