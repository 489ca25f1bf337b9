"""The privacy contract (privacy.contract): calibrations against dp-accounting used directly and
against closed forms, the delta rules, and the limits a calibrated plan puts on a ledger."""

from __future__ import annotations

import math

import numpy as np
import pytest
from dp_accounting import NeighboringRelation, dp_event, gaussian_mechanism
from dp_accounting.pld import pld_privacy_accountant
from dp_accounting.rdp import rdp_privacy_accountant

from mpi_dp.errors import BudgetExceededError
from mpi_dp.privacy import Ledger, PureEvent, accountants, calibration, contract
from mpi_dp.privacy.release import BlockRelease, OwnerRelease


def _direct_pld(event: dp_event.DpEvent, k: int, delta: float) -> float:
    """dp-accounting's own PLD accountant (its default, finest grid)."""
    acc = pld_privacy_accountant.PLDAccountant(NeighboringRelation.ADD_OR_REMOVE_ONE)
    acc.compose(event, k)
    return float(acc.get_epsilon(delta))


@pytest.mark.parametrize("k", [1, 2, 50, 200, 1000])
def test_pld_laplace_meets_the_target_tightly(k):
    plan = contract.Plan("laplace", k, 1.0, 1e-5)
    cal = contract.calibrate(plan, "pld")
    # the ledger's accountant: at most the target, and the calibration wastes little
    assert cal.planned.eps_pld <= 1.0 + 1e-9
    assert cal.planned.eps_pld >= 0.999
    # dp-accounting used directly agrees (finer grid: a little below the pessimistic total)
    direct = _direct_pld(dp_event.LaplaceDpEvent(cal.noise_multiplier), k, 1e-5)
    assert direct <= 1.0 + 1e-6 and direct >= 0.99
    # 0.1 % less noise breaks the target: the search found the boundary
    less = accountants.pld([(calibration._unit("laplace", cal.noise_multiplier * 0.999, 1e-5), k)],
                           1e-5)
    assert less > 1.0
    # never looser than the pure split, and the RDP cross-check is looser than the PLD
    assert cal.noise_multiplier <= k / 1.0 * (1 + 1e-12)
    assert cal.planned.eps_rdp >= cal.planned.eps_pld


def test_pld_gives_the_noise_of_the_issue_s_example():
    """(eps, delta) = (1, 1e-5): a Laplace per-release eps about 2x, 3.8x and 8.5x the even split
    at T = 50, 200, 1000; checked against the even split computed here."""
    ratios = []
    for k in (50, 200, 1000):
        cal = contract.calibrate(contract.Plan("laplace", k, 1.0, 1e-5), "pld")
        ratios.append(cal.eps_release / (1.0 / k))
    assert ratios[0] == pytest.approx(1.95, abs=0.05)
    assert ratios[1] == pytest.approx(3.82, abs=0.05)
    assert ratios[2] == pytest.approx(8.5, abs=0.1)


@pytest.mark.parametrize("k", [1, 10, 500])
def test_pld_gaussian_is_the_analytic_gaussian_of_the_composition(k):
    """k Gaussians of noise multiplier z are one of z / sqrt(k): the tight calibration is
    sqrt(k) times the analytic sigma of (eps, delta) (Balle & Wang), to the PLD's discretisation."""
    cal = contract.calibrate(contract.Plan("gaussian", k, 0.5, 1e-6), "pld")
    exact = math.sqrt(k) * gaussian_mechanism.get_sigma_gaussian(0.5, 1e-6)
    assert cal.noise_multiplier == pytest.approx(exact, rel=2e-3)
    assert cal.noise_multiplier >= exact * (1 - 1e-9)  # pessimistic: never less noise
    assert 0.499 <= cal.planned.eps_pld <= 0.5 + 1e-9
    rdp = rdp_privacy_accountant.RdpAccountant(
        neighboring_relation=NeighboringRelation.ADD_OR_REMOVE_ONE)
    rdp.compose(dp_event.GaussianDpEvent(cal.noise_multiplier), k)
    assert cal.planned.eps_rdp == pytest.approx(rdp.get_epsilon(1e-6), rel=1e-9)


def test_basic_rule_is_the_even_split():
    lap = contract.calibrate(contract.Plan("laplace", 40, 2.0, 1e-5), "basic")
    assert lap.noise_multiplier == 20.0 and lap.planned.eps_basic == pytest.approx(2.0)
    g = contract.calibrate(contract.Plan("gaussian", 8, 1.0, 1e-5), "basic")
    assert g.noise_multiplier == pytest.approx(
        gaussian_mechanism.get_sigma_gaussian(1.0 / 8, 1e-5 / 8), rel=1e-12)
    # the tight rule needs less noise for the same target
    assert contract.calibrate(contract.Plan("laplace", 40, 2.0, 1e-5), "pld").noise_multiplier \
        < lap.noise_multiplier


def test_fixed_releases_are_composed_in_and_may_leave_no_room():
    ws = PureEvent(0.05, "l2_laplace")
    alone = contract.calibrate(contract.Plan("laplace", 100, 1.0, 1e-5), "pld")
    with_ws = contract.calibrate(contract.Plan("laplace", 100, 1.0, 1e-5, fixed=(ws,)), "pld")
    assert with_ws.noise_multiplier > alone.noise_multiplier
    total = accountants.pld([(with_ws.unit_event(), 100), (ws, 1)], 1e-5)
    assert 0.999 <= total <= 1.0 + 1e-9
    basic = contract.calibrate(contract.Plan("laplace", 100, 1.0, 1e-5, fixed=(ws,)), "basic")
    assert basic.noise_multiplier == pytest.approx(100 / 0.95)
    with pytest.raises(ValueError, match="no room"):
        contract.calibrate(contract.Plan("laplace", 10, 0.04, 1e-5, fixed=(ws,)), "pld")


def test_calibrations_are_cached_per_plan_and_infinite_eps_means_no_noise():
    plan = contract.Plan("laplace", 77, 1.5, 1e-5)
    assert contract.calibrate(plan, "pld") is contract.calibrate(
        contract.Plan("laplace", 77, 1.5, 1e-5), "pld")
    free = contract.calibrate(contract.Plan("laplace", 77, math.inf, 1e-5), "pld")
    assert free.noise_multiplier == 0.0 and free.scale(3.0) == 0.0
    assert free.eps_release == math.inf


@pytest.mark.parametrize("n, expected", [(1, 0.01), (9, 0.01), (10, 0.01), (11, 1e-3),
                                         (259, 1e-4), (4000, 1e-5), (10_000, 1e-5),
                                         (10_001, 1e-6)])
def test_default_delta_is_the_largest_power_of_ten_below_one_tenth_of_one_over_n(n, expected):
    d = contract.default_delta(n)
    assert d == expected
    assert d <= 1.0 / (10 * n) * (1 + 1e-12)


def test_delta_at_or_above_one_over_n_is_refused_naming_the_owner():
    assert contract.resolve_delta(1e-3, 999, 4) == 1e-3
    with pytest.raises(ValueError, match=r"owner 4 \(n_i = 1000 records\)"):
        contract.resolve_delta(1e-3, 1000, 4)
    with pytest.raises(ValueError, match="1/259"):
        contract.resolve_delta(math.exp(-5), 259, 0)
    assert contract.resolve_delta("auto", 259, 0) == 1e-4


def test_a_calibrated_plan_limits_the_ledger():
    ws = PureEvent(0.05, "l2_laplace")
    cal = contract.calibrate(contract.Plan("laplace", 3, 1.0, 1e-5, fixed=(ws,)), "pld")
    led = Ledger(2, runs=2, target=cal)
    ev = cal.event(0.4)
    led.charge(ws)
    for _ in range(3):
        led.charge(ev)
    with pytest.raises(BudgetExceededError, match="calibrates 3 release"):
        led.charge(ev, note="query 4")
    with pytest.raises(BudgetExceededError, match="planned 1 time"):
        led.charge(ws)
    fresh = Ledger(3, runs=1, target=cal)
    with pytest.raises(BudgetExceededError, match="less noisy"):
        fresh.charge(cal.event(0.4, scale=cal.scale(0.4) * 0.99))
    fresh.charge(cal.event(0.4, scale=cal.scale(0.4) * 2))  # more noise is always allowed
    # what was composed is what the plan certifies
    assert accountants.compose(led.scope_pairs(), 1e-5).eps_pld <= 1.0 + 1e-9


def test_a_selection_s_other_candidates_count_towards_the_owner_s_total():
    """All candidates of a selection (here 4 + 6 releases) calibrated together: a candidate's
    ledger allows its own share and composes it with the others' planned releases."""
    cal = contract.calibrate(contract.Plan("laplace", 10, 1.0, 1e-5, scope="selection"), "pld")
    led = Ledger(0, runs=1, target=cal, allowance=4, context=[(cal.unit_event(), 6)])
    ev = cal.event(0.1)
    for _ in range(4):
        led.charge(ev)
    with pytest.raises(BudgetExceededError):
        led.charge(ev)
    tot = accountants.compose(led.scope_pairs(), 1e-5)
    own = accountants.compose(led.worst_counts(), 1e-5)
    assert own.eps_pld < tot.eps_pld <= 1.0 + 1e-9 and tot.eps_pld >= 0.999


def test_record_scope_composes_one_release_per_pass():
    cal = contract.calibrate(contract.Plan("laplace", 1, 1.0, 1e-5, scope="record"), "pld")
    block = BlockRelease([OwnerRelease(a, 2, cal) for a in (5, 6)])
    for t in range(50):  # 50 rounds of a single pass: every record in one release
        scales, events = block.charge(2.0 / (t + 1), record_pass=0)
        np.testing.assert_allclose(scales, cal.noise_multiplier * 2.0 / (t + 1))
    led = block.ledgers[0]
    per_record = accountants.compose(led.scope_pairs(), 1e-5)
    every = accountants.compose(led.worst_counts(), 1e-5)
    assert 0.999 <= per_record.eps_pld <= 1.0 + 1e-9
    assert every.eps_pld > 10  # the plain composition of 50 releases: valid, very loose
    with pytest.raises(BudgetExceededError, match="pass 2"):
        block.charge(1.0, record_pass=1)


def test_ledger_rows_report_target_rule_scope_and_totals():
    cal = contract.calibrate(contract.Plan("laplace", 20, 1.0, 1e-4), "pld")
    rel = OwnerRelease(0, 3, cal)
    for _ in range(20):
        rel.charge(cal.event(0.5))
    paper = contract.paper(contract.Plan("laplace", 20, 1.0, 1e-4), "basic_split", 20.0)
    old = Ledger(1, 1.0, runs=3, target=paper)
    for _ in range(20):
        old.charge(paper.event(0.5))
    rows = accountants.ledger_rows([rel.ledger, old], 1e-5)
    assert rows["calibration"].tolist() == [b"pld", b"paper:basic_split"]
    assert rows["scope"].tolist() == [b"configuration"] * 2
    assert np.all(rows["target_eps"] == 1.0) and np.all(rows["delta"] == 1e-4)
    assert rows["noise_multiplier"][0] == pytest.approx(cal.noise_multiplier)
    assert rows["noise_multiplier"][1] == pytest.approx(20.0)
    assert 0.999 <= rows["eps_pld"][0] <= 1.0 + 1e-9
    assert rows["eps_pld"][1] < 0.7  # the even split leaves a third of the budget unused
    assert rows["eps_basic"][1] == pytest.approx(1.0)
    np.testing.assert_array_equal(rows["eps_pld_all"], rows["eps_pld"])


def _row(target: float, pld: float, rule: bytes = b"pld", every: float | None = None) -> dict:
    return {"target_eps": target, "target_delta": 1e-5, "calibration": rule.decode(),
            "scope": "configuration", "eps_pld": pld, "eps_rdp": pld * 1.1,
            "eps_basic": pld * 3, "eps_pld_all": pld if every is None else every,
            "certified": True}


class _Cfg:
    def __init__(self, index: int, rows: list[dict]) -> None:
        self.index, self.label, self.groups = index, f"config {index}", [([0], r) for r in rows]


def test_analyze_says_per_configuration_whether_the_target_was_met():
    from mpi_dp.analysis.privacy_text import CONTRACT_LINES_MAX, contract_lines

    lines = contract_lines([_Cfg(0, [_row(1.0, 0.99999)]),
                            _Cfg(1, [_row(1.0, 12.5, b"paper:per_iteration")]),
                            _Cfg(2, [_row(1.0, 0.99, every=40.0)]),
                            _Cfg(3, [_row(math.inf, math.inf)])])
    assert lines[1].startswith("  #0 config 0: target eps=1, delta=1e-05") and \
        lines[1].endswith(": met")
    assert "NOT met (the paper's rule reads eps in its own unit)" in lines[2]
    assert "all releases composed: PLD 40" in lines[3] and lines[3].endswith(": met")
    assert "achieved PLD inf, no noise" in lines[4]
    assert lines[4].endswith("NOT private: eps = inf: trained without noise (owner 0: target "
                             "eps = inf)")
    # many configurations: alike ones share a line, the largest totals shown
    many = [_Cfg(i, [_row(1.0, 0.9 + i / 1000)]) for i in range(CONTRACT_LINES_MAX + 1)]
    grouped = contract_lines(many)
    assert len(grouped) == 2 and "#0-12 (13 configurations)" in grouped[1]
    assert "achieved PLD 0.912" in grouped[1] and grouped[1].endswith(": met")
