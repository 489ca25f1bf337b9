"""Accountants (privacy.accountants) against closed forms and against dp-accounting used directly."""

from __future__ import annotations

import math

import numpy as np
import pytest
from dp_accounting import NeighboringRelation, dp_event
from dp_accounting.pld import pld_privacy_accountant
from dp_accounting.rdp import rdp_privacy_accountant

from mpi_dp.privacy import GaussianEvent, LaplaceEvent, Ledger
from mpi_dp.privacy import accountants as acc


def lap(eps: float) -> LaplaceEvent:
    return LaplaceEvent(0.2, 0.2 / eps)


def advanced_closed_form(k: int, eps: float, delta: float) -> float:
    return math.sqrt(2 * k * math.log(1 / delta)) * eps + k * eps * (math.exp(eps) - 1)


@pytest.mark.parametrize("eps, k", [(0.005, 200), (0.05, 500), (0.5, 40), (1.0, 1000)])
def test_k_laplace_releases(eps, k):
    delta = 1e-5
    tot = acc.compose([(lap(eps), k)], delta)
    assert tot.eps_basic == pytest.approx(k * eps, rel=1e-12) and tot.delta_basic == 0.0
    assert tot.eps_advanced == pytest.approx(advanced_closed_form(k, eps, delta), rel=1e-12)
    # the tight accountant is below both bounds and above one release
    assert eps <= tot.eps_pld <= min(tot.eps_basic, tot.eps_advanced)
    assert tot.eps_pld <= tot.eps_rdp * (1 + 1e-9)  # RDP converts loosely: never tighter
    # against dp-accounting used directly (its default, finest grid)
    direct = pld_privacy_accountant.PLDAccountant(NeighboringRelation.ADD_OR_REMOVE_ONE)
    direct.compose(dp_event.LaplaceDpEvent(1 / eps), k)
    assert tot.eps_pld == pytest.approx(direct.get_epsilon(delta), rel=1e-4)
    rdp = rdp_privacy_accountant.RdpAccountant(
        neighboring_relation=NeighboringRelation.ADD_OR_REMOVE_ONE)
    rdp.compose(dp_event.LaplaceDpEvent(1 / eps), k)
    assert tot.eps_rdp == pytest.approx(rdp.get_epsilon(delta), rel=1e-12)


def test_single_laplace_release_is_eps_by_every_accountant():
    tot = acc.compose([(lap(0.7), 1)], 1e-6)
    assert tot.eps_basic == pytest.approx(0.7)
    assert tot.eps_pld == pytest.approx(0.7, rel=1e-3)  # the pure-DP eps of one Laplace release


@pytest.mark.parametrize("eps, expected", [(0.1, 153.16), (0.01, 5.80)])
def test_advanced_composition_test_vectors_of_seed_003(eps, expected):
    """Spec dp-distributed-online-learning §4: T = 10^4 releases, delta' = 1e-5."""
    assert acc.advanced([(lap(eps), 10_000)], 1e-5) == pytest.approx(expected, abs=0.005)


def test_heterogeneous_advanced_composition():
    pairs = [(lap(0.1), 30), (lap(0.02), 100)]
    sq = 30 * 0.01 + 100 * 0.0004
    drift = 30 * 0.1 * math.expm1(0.1) + 100 * 0.02 * math.expm1(0.02)
    assert acc.advanced(pairs, 1e-6) == pytest.approx(math.sqrt(2 * math.log(1e6) * sq) + drift)


def test_gaussian_composition_is_one_gaussian():
    """k Gaussians of noise multiplier z compose to one of z / sqrt(k): the PLD matches the exact
    (analytic) eps of that single Gaussian; basic and advanced use the per-release (eps, delta)."""
    z, k, delta = 8.0, 100, 1e-5
    ev = GaussianEvent(1.0, z, 1e-7)
    tot = acc.compose([(ev, k)], delta)
    exact = GaussianEvent(1.0, z / math.sqrt(k), delta).eps
    assert tot.eps_pld == pytest.approx(exact, rel=2e-3)
    assert tot.eps_basic == pytest.approx(k * ev.eps) and tot.delta_basic == pytest.approx(1e-5)
    slack = delta - k * 1e-7
    assert tot.eps_advanced == pytest.approx(
        math.sqrt(2 * k * math.log(1 / slack)) * ev.eps + k * ev.eps * math.expm1(ev.eps))
    # per-release deltas using up the target: advanced composition has no slack left
    assert acc.advanced([(GaussianEvent(1.0, z, 1e-6), 11)], 1e-5) == math.inf


def test_non_private_and_empty_sequences():
    for tot in (acc.compose([(LaplaceEvent(1.0, 0.0), 3)], 1e-5),):
        assert (tot.eps_basic, tot.eps_advanced, tot.eps_pld, tot.eps_rdp) == (math.inf,) * 4
    empty = acc.compose([], 1e-5)
    assert (empty.eps_basic, empty.eps_advanced, empty.eps_pld, empty.eps_rdp) == (0.0,) * 4


def test_mixed_mechanisms_compose():
    pairs = [(lap(0.1), 50), (GaussianEvent(1.0, 10.0, 1e-8), 50)]
    tot = acc.compose(pairs, 1e-5)
    only_lap = acc.compose(pairs[:1], 1e-5)
    assert only_lap.eps_pld < tot.eps_pld < tot.eps_basic


def test_ledger_rows():
    """privacy/ledger: releases and counts are the largest over runs, totals from the worst run;
    a ledger without a contract reports its basic budget as target and the job's delta."""
    a = Ledger(0, 2.1, runs=2)
    for _ in range(20):
        a.charge(lap(0.1))
    a.charge(lap(0.1), runs=np.array([1]))
    b = Ledger(1, math.inf, runs=2)
    b.charge(LaplaceEvent(0.2, 0.1, data_dependent=True))
    b.charge(LaplaceEvent(0.2, 0.1, certified=False))
    c = Ledger(2, 5.0, runs=2)  # made no release
    rows = acc.ledger_rows([a, b, c], 1e-5)
    assert rows.dtype == acc.LEDGER_DTYPE and rows["agent"].tolist() == [0, 1, 2]
    assert rows["mechanism"].tolist() == [b"laplace", b"laplace", b"none"]
    assert rows["releases"].tolist() == [21, 2, 0]
    np.testing.assert_allclose(rows["eps_basic"], [2.1, 4.0, 0.0])
    np.testing.assert_allclose(rows["noise_multiplier"][:2], [10.0, 0.5])
    assert math.isnan(rows["noise_multiplier"][2])
    tot = acc.compose([(lap(0.1), 21)], 1e-5)
    assert rows["eps_pld"][0] == tot.eps_pld and rows["eps_advanced"][0] == tot.eps_advanced
    np.testing.assert_array_equal(rows["eps_pld_all"], rows["eps_pld"])
    assert rows["data_dependent"].tolist() == [0, 1, 0]
    assert rows["certified"].tolist() == [True, False, True]
    assert rows["target_eps"].tolist() == [2.1, math.inf, 5.0] and np.all(rows["delta"] == 1e-5)
    assert rows["calibration"].tolist() == [b"none"] * 3
    assert rows["scope"].tolist() == [b"configuration"] * 3


def test_equal_ledgers_share_one_computation():
    acc._CACHE.clear()
    ledgers = []
    for agent in range(5):
        led = Ledger(agent, 1.0)
        for _ in range(10):
            led.charge(lap(0.1))
        ledgers.append(led)
    acc.ledger_rows(ledgers, 1e-5)
    assert len(acc._CACHE) == 1


def _mixed_ledgers() -> list[Ledger]:
    """Ledgers of different releases, budgets and contracts (one of record scope)."""
    from mpi_dp.privacy import contract

    cal = contract.calibrate(contract.Plan("laplace", 6, 1.0, 1e-4), "pld")
    rec = contract.calibrate(contract.Plan("gaussian", 2, 1.0, 1e-5, scope="record"), "pld")
    out = []
    for a in range(9):
        if a % 3 == 0:
            lg = Ledger(a, 2.0 + a, runs=2)
            for k in range(1 + a % 4):
                lg.charge(lap(0.1 * (1 + k % 2)))
        elif a % 3 == 1:
            lg = Ledger(a, math.inf, runs=2, target=cal)
            for _ in range(6):
                lg.charge(cal.event(0.5))
        else:
            lg = Ledger(a, math.inf, 1.0, runs=2, target=rec)
            for p in range(3):
                lg.charge(rec.event(1.0), record_pass=p % 2)
        out.append(lg)
    return out


def test_rows_composed_where_the_ledgers_live_equal_the_roots():
    """Each rank's rows of its own ledgers, gathered in any order (in_agent_order), equal the
    root's rows of every ledger, bit for bit: a row depends on its ledger alone."""
    ledgers = _mixed_ledgers()
    want = acc.ledger_rows(ledgers, 1e-5)
    parts = [acc.ledger_rows(ledgers[i::3], 1e-5) for i in (2, 0, 1)]
    got = acc.in_agent_order(parts + [acc.ledger_rows([], 1e-5)])
    assert got.dtype == acc.LEDGER_DTYPE and got.tobytes() == want.tobytes()


def test_remembered_compositions_are_not_composed_again(monkeypatch):
    """A rank given the root's totals of its ledgers' compositions (ledger_compositions ->
    composed on the root -> remember) composes no privacy loss distribution itself, and its rows
    equal those it would compute alone."""
    ledgers = _mixed_ledgers()
    acc._CACHE.clear()
    want = acc.ledger_rows(ledgers, 1e-5)
    needed = acc.ledger_compositions(ledgers, 1e-5)
    assert 1 < len(needed) < 2 * len(ledgers)  # distinct compositions only
    totals = acc.composed(needed)  # the root (cached: it just composed them)
    acc._CACHE.clear()
    acc.remember(totals)

    def no_pld(*a, **k):
        raise AssertionError("composed a PLD again")

    monkeypatch.setattr(acc, "pld", no_pld)
    monkeypatch.setattr(acc, "rdp", no_pld)
    assert acc.ledger_rows(ledgers, 1e-5).tobytes() == want.tobytes()
    acc._CACHE.clear()
    with pytest.raises(AssertionError, match="PLD again"):  # without them it would compose
        acc.ledger_rows(ledgers, 1e-5)
