"""Block ledger charges (privacy.ledger_block through BlockRelease): every ledger equal, field for
field, to one charged one owner at a time by the per-owner path; refusals with the same message;
block releases bit for bit each owner's own `OwnerRelease` release."""

from __future__ import annotations

import copy
import math
import pickle

import h5py
import numpy as np
import pytest

from mpi_dp import rng
from mpi_dp.errors import BudgetExceededError
from mpi_dp.privacy import contract, tap
from mpi_dp.privacy.events import LaplaceEvent
from mpi_dp.privacy.ledger import Ledger
from mpi_dp.privacy.release import BlockRelease, OwnerRelease
from mpi_dp.results import checkpoint

R = 3
AGENTS = [2, 5, 6, 9, 13, 14]


def _state(led: Ledger) -> dict:
    """Everything a ledger holds and reports, arrays as (dtype, shape, bytes); through pickle."""
    def norm(v):
        if isinstance(v, np.ndarray):
            return (v.dtype.str, v.shape, v.tobytes())
        if isinstance(v, dict):
            return {k: norm(x) for k, x in v.items()}
        if isinstance(v, list | tuple):
            return type(v)(norm(x) for x in v)
        if hasattr(v, "__dict__") and not isinstance(v, type):
            return (type(v).__name__, norm(vars(v)))
        return (type(v).__name__, repr(v), v)

    back = pickle.loads(pickle.dumps(led))
    fields = {k: norm(v) for k, v in vars(back).items()}
    fields["_counts"] = [(key, repr(ev), norm(c)) for key, (ev, c) in led._counts.items()]
    fields["_pass_worst"] = {p: repr(ev) for p, ev in led._pass_worst.items()}
    return {"fields": fields, "repr": repr(led), "spent_eps": norm(led.spent_eps),
            "spent_delta": norm(led.spent_delta), "events": norm(led.event_counts()),
            "worst": repr(led.worst_counts()), "scope": repr(led.scope_pairs()),
            "releases": norm(led.releases)}


def assert_same_ledgers(a: list[Ledger], b: list[Ledger]) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        assert _state(x) == _state(y)


def charge_one_at_a_time(owners, sensitivity, scales=None, *, record_pass=None, delta=None):
    """The per-owner path (BlockRelease.charge before the block charges): each owner's scale and
    event, its ledger charged; events shared between equal owners."""
    sens = np.broadcast_to(np.asarray(sensitivity, dtype=np.float64), (len(owners),))
    given = scales if scales is not None else [None] * len(owners)
    out, events, made = np.empty(len(owners)), [], {}
    for i, (o, sc) in enumerate(zip(owners, given, strict=True)):
        s = o.scale(float(sens[i]), sc)
        key = (float(sens[i]), s, o.certified, o.data_dependent, o.mechanism)
        ev = made.get(key)
        if ev is None:
            ev = made[key] = o.event(float(sens[i]), s, delta=delta)
        o.charge(ev, record_pass=record_pass)
        out[i] = s
        events.append(ev)
    return out, events


@pytest.fixture(autouse=True)
def one_at_a_time(monkeypatch):
    """Counts the block charges that went one owner at a time (the fallback)."""
    calls = []
    orig = BlockRelease._charge_each

    def counted(self, *a, **kw):
        calls.append(a)
        return orig(self, *a, **kw)

    monkeypatch.setattr(BlockRelease, "_charge_each", counted)
    return calls


def run_both(make, rounds, args, vectorised=True):
    """Charge a block and a per-owner copy with args(t) = (sensitivity, scales, kwargs) each
    round until the first refusal (if any); both must agree on everything (on a refusal, the
    block charges nobody; charges it makes one owner at a time charge the owners before)."""
    block, alone = BlockRelease(make()), make()
    refused = None
    for t in range(rounds):
        sens, scales, kw = args(t)
        before = copy.deepcopy([o.ledger for o in alone])
        try:
            ref = charge_one_at_a_time(alone, sens, scales, **kw)
        except BudgetExceededError as e:
            with pytest.raises(BudgetExceededError) as got:
                block.charge(sens, scales, **kw)
            assert str(got.value) == str(e)
            assert_same_ledgers(block.ledgers, before if vectorised else
                                [o.ledger for o in alone])
            refused = (t, str(e))
            break
        got_sc, got_ev = block.charge(sens, scales, **kw)
        assert isinstance(got_ev, list) != vectorised  # the block's path, or the fallback
        assert np.array_equal(got_sc, ref[0])
        assert list(got_ev) == ref[1] and got_ev == ref[1]
        assert_same_ledgers(block.ledgers, [o.ledger for o in alone])
    return block, alone, refused


def test_paper_budgets_per_owner_sensitivities_and_refusal():
    eps = [0.5, 1.0, math.inf, 2.0, 1.0, 0.25]
    budgets = [e * 20 if math.isfinite(e) else math.inf for e in eps]

    def make():
        return [OwnerRelease(a, R, None, budget_eps=b) for a, b in zip(AGENTS, budgets,
                                                                     strict=True)]

    def args(t):  # a sensitivity per owner that shrinks with t (a step size), scale S / eps_i
        S = 2.0 / math.sqrt(t + 1) * np.array([1.0, 1.5, 1.0, 0.7, 1.0, 3.0])
        return S, [0.0 if math.isinf(e) else s / e for s, e in zip(S, eps, strict=True)], {}

    block, alone, refused = run_both(make, 40, args)
    assert refused is not None and refused[0] == 20 and "owner 2 refuses release 21" in refused[1]


def test_paper_budget_refusal_names_the_first_refusing_owner():
    def make():  # owner 6 runs out first: it refuses, though owners before it fit
        return [OwnerRelease(a, R, None, budget_eps=5.0 if a == 6 else 100.0) for a in AGENTS]

    _, _, refused = run_both(make, 30, lambda t: (1.0, [1.0] * len(AGENTS), {}))
    assert refused[0] == 5 and refused[1].startswith("owner 6 refuses release 6")


@pytest.mark.parametrize("rule", ["pld", "basic"])
@pytest.mark.parametrize("scope", ["configuration", "record"])
def test_calibrated_plans(rule, scope):
    cals = [contract.calibrate(contract.Plan("laplace", T, 1.0, 1e-5, scope=scope), rule)
            for T in (12, 12, 15, 8, 12, 20)]

    def make():  # as sync_star's owners: calibrated, no basic budget; one uncalibrated
        return [OwnerRelease(a, R, cal if a != 9 else None, certified=True)
                for a, cal in zip(AGENTS, cals, strict=True)]

    def args(t):
        return 1.0 / (t + 1), None, {"record_pass": t // 2 if scope == "record" else None}

    _, alone, refused = run_both(make, 40, args)
    assert refused is not None
    assert ("pass" in refused[1]) if scope == "record" else ("all made" in refused[1])


def test_calibrated_plan_with_fixed_releases_and_over_noisy_events():
    fixed = LaplaceEvent(1.0, 10.0)
    cal = contract.calibrate(contract.Plan("laplace", 30, 2.0, 1e-5, fixed=(fixed, fixed)),
                             "pld")

    def make():
        return [OwnerRelease(a, R, cal) for a in AGENTS]

    # the fixed release twice (then refused), as a paper scale giving exactly its key
    _, _, refused = run_both(make, 5, lambda t: (1.0, [10.0] * len(AGENTS), {}))
    assert refused[0] == 2 and "planned 2 time(s)" in refused[1]
    # less noisy than calibrated: refused at once
    over = cal.noise_multiplier * 0.5
    _, _, refused = run_both(make, 3, lambda t: (1.0, [over] * len(AGENTS), {}))
    assert refused[0] == 0 and "less noisy" in refused[1]


@pytest.mark.parametrize("rule", ["pld", "paper"])
def test_gaussian(rule):
    plan = contract.Plan("gaussian", 25, 1.0, 1e-5)
    cal = contract.calibrate(plan, "pld") if rule == "pld" else contract.paper(plan, "x", 3.0)

    def make():
        return [OwnerRelease(a, R, cal, certified=a % 2 == 0, mechanism="gaussian",
                             budget_eps=math.inf if rule == "pld" else 40.0,
                             budget_delta=math.inf if rule == "pld" else 1e-3)
                for a in AGENTS]

    def args(t):
        if rule == "pld":
            return 0.5, None, {"record_pass": 0}
        return 0.5 + (t % 3) * 0.1, [1.5 + i * 0.1 for i in range(len(AGENTS))], \
            {"delta": 1e-5 * (1 + t % 2), "record_pass": t // 7}

    _, _, refused = run_both(make, 120, args)
    assert refused is not None


def test_repeated_events_reuse_and_ledgers_restored_then_charged():
    cal = contract.calibrate(contract.Plan("laplace", 200, 1.0, 1e-5), "pld")

    def make():
        return [OwnerRelease(a, R, cal) for a in AGENTS]

    block, alone = BlockRelease(make()), make()
    for _ in range(5):
        _, e1 = block.charge(0.5, record_pass=0)
        charge_one_at_a_time(alone, 0.5, record_pass=0)
    _, e2 = block.charge(0.5, record_pass=0)
    charge_one_at_a_time(alone, 0.5, record_pass=0)
    assert e2 is e1  # the same arguments: the same events, nothing rebuilt
    saved = pickle.loads(pickle.dumps(block.ledgers))
    for _ in range(3):
        block.charge(0.5, record_pass=0)
    block.restore_ledgers(saved)  # back to the checkpoint; the copies charged from there
    ref = pickle.loads(pickle.dumps([o.ledger for o in alone]))
    for o, led in zip(alone, ref, strict=True):
        o.ledger = led
    assert_same_ledgers(block.ledgers, ref)
    other = pickle.loads(pickle.dumps(saved[2]))
    block.owners[2].ledger = other  # one owner restored alone (as dola's restore does)
    alone[2].ledger = pickle.loads(pickle.dumps(other))
    for t in range(10):
        block.charge(0.5 + t % 2, record_pass=0)
        charge_one_at_a_time(alone, 0.5 + t % 2, record_pass=0)
    assert_same_ledgers(block.ledgers, [o.ledger for o in alone])
    assert block.ledgers[2] is other
    assert all(not lg._run_eps.flags.owndata for lg in block.ledgers)  # rows of the block


def test_checkpoint_of_bound_ledgers(tmp_path):
    def make():
        return [OwnerRelease(a, R, None, budget_eps=50.0) for a in AGENTS]

    block, alone = BlockRelease(make()), make()
    for t in range(4):
        block.charge(1.0, [2.0 + t % 2] * len(AGENTS), record_pass=0)
        charge_one_at_a_time(alone, 1.0, [2.0 + t % 2] * len(AGENTS), record_pass=0)
    with h5py.File(tmp_path / "c.h5", "w") as f:
        checkpoint.write_state(f.create_group("s"), {"ledgers": block.ledgers})
    with h5py.File(tmp_path / "c.h5", "r") as f:
        back = checkpoint.read_state(f["s"])["ledgers"]
    assert_same_ledgers(back, [o.ledger for o in alone])
    block.restore_ledgers(back)
    for t in range(6):
        block.charge(1.0, [2.0 + t % 3] * len(AGENTS), record_pass=1)
        charge_one_at_a_time(alone, 1.0, [2.0 + t % 3] * len(AGENTS), record_pass=1)
    assert_same_ledgers(block.ledgers, [o.ledger for o in alone])


def test_mixed_with_per_owner_charges_and_a_second_block():
    def make():
        return [OwnerRelease(a, R, None, budget_eps=1e3) for a in AGENTS]

    owners, alone = make(), make()
    b1 = BlockRelease(owners)
    for t in range(12):
        sens = np.linspace(0.5, 1.5, len(AGENTS)) * (1 + t % 3)
        b1.charge(sens, [3.0] * len(AGENTS))
        charge_one_at_a_time(alone, sens, [3.0] * len(AGENTS))
        if t % 4 == 1:  # an owner's own charge between block charges (some runs only)
            ev = LaplaceEvent(1.0, 4.0)
            owners[3].charge(ev, np.array([0, 2]))
            alone[3].charge(ev, np.array([0, 2]))
        if t % 5 == 2:  # another block over the same owners binds their ledgers
            BlockRelease(owners[::-1]).charge(1.0, [3.0] * len(AGENTS))
            charge_one_at_a_time(alone[::-1], 1.0, [3.0] * len(AGENTS))
    assert_same_ledgers(b1.ledgers, [o.ledger for o in alone])


def test_unusual_charges_take_the_per_owner_path():
    def make():
        return [OwnerRelease(a, R, contract.calibrate(contract.Plan("laplace", 9, 1.0, 1e-5),
                                                      "basic"), budget_eps=10.0)
                for a in AGENTS]

    # some owners calibrated, some given a paper scale (None entries)
    scales = [None, 20.0, None, 30.0, None, None]
    _, _, refused = run_both(make, 12, lambda t: (1.0, scales, {"record_pass": 0}),
                             vectorised=False)
    assert refused[0] == 9
    with pytest.raises(ValueError, match="scale must be a non-negative"):
        BlockRelease(make()).charge(1.0, [20.0, 20.0, -1.0, 20.0, 20.0, 20.0])
    with pytest.raises(ValueError, match="sensitivity must be a number or one per owner"):
        BlockRelease(make()).charge(np.ones(3))


@pytest.mark.parametrize("case", ["calibrated", "paper", "zero", "scalar", "runs"])
def test_block_laplace_is_each_owners_laplace_bit_for_bit(case, one_at_a_time):
    cal = contract.calibrate(contract.Plan("laplace", 50, 1.0, 1e-5), "pld")
    runs = np.array([0, 2]) if case == "runs" else None
    nr = R if runs is None else runs.size

    def make():
        if case in ("calibrated", "runs"):
            return [OwnerRelease(a, R, cal, certified=a != 6) for a in AGENTS]
        return [OwnerRelease(a, R, None, budget_eps=math.inf if case == "zero" else 100.0)
                for a in AGENTS]

    block, alone = BlockRelease(make()), make()
    run_ids = [4, 7, 9]
    streams = rng.agent_run_streams(11, "noise", AGENTS, run_ids)
    gens = [rng.run_streams(11, "noise", a, run_ids) for a in AGENTS]
    if runs is not None:
        streams = streams.subset((np.arange(len(AGENTS))[:, None] * R + runs).ravel())
        gens = [g.subset(runs) for g in gens]
    values = np.random.default_rng(3).normal(size=(len(AGENTS), nr, 5))
    values[0, 0, 0] = -0.0
    for t in range(6):
        sens = np.array([0.5, 1.0, 0.25, 2.0, 1.0, 0.75]) / (t + 1)
        scales = None
        if case in ("paper", "scalar"):
            scales = sens * np.array([1.0, 2.0, 3.0, 0.5, 1.0, 4.0])
        if case == "zero":  # eps = inf for some owners: no noise, streams not advanced
            scales = sens * np.array([1.0, 0.0, 3.0, 0.0, 1.0, 4.0])
        out, sc, events = block.laplace(values, streams, sens, scales, runs,
                                        scalar=case == "scalar")
        for i, o in enumerate(alone):
            ref, ev = o.laplace(values[i], gens[i], sens[i], runs,
                                scale=None if scales is None else scales[i],
                                scalar=case == "scalar")
            assert ref.tobytes() == out[i].tobytes()
            assert ev == events[i] and repr(ev) == repr(events[i])
            assert sc[i] == o.scale(sens[i], None if scales is None else scales[i])
        assert_same_ledgers(block.ledgers, [o.ledger for o in alone])
    assert bool(one_at_a_time) == (runs is not None)  # a subset of runs: one at a time
    if runs is None:  # every stream where its owner's own draws left it
        assert streams.position()[0].tobytes() == np.concatenate(
            [g.position()[0] for g in gens]).tobytes()


def test_block_gaussian_is_each_owners_gaussian_noise_bit_for_bit():
    cal = contract.calibrate(contract.Plan("gaussian", 50, 1.0, 1e-5), "pld")
    owners = [OwnerRelease(a, R, cal if a != 5 else None, mechanism="gaussian")
              for a in AGENTS]
    alone = [OwnerRelease(a, R, cal if a != 5 else None, mechanism="gaussian") for a in AGENTS]
    block = BlockRelease(owners)
    streams = rng.agent_run_streams(2, "noise", AGENTS, range(R))
    gens = [rng.run_streams(2, "noise", a, range(R)) for a in AGENTS]
    values = np.random.default_rng(4).normal(size=(len(AGENTS), R, 7))
    for _ in range(4):
        out, sc, events = block.gaussian(values, streams, 0.5, delta=1e-5)
        for i, o in enumerate(alone):
            noise, ev = o.gaussian_noise(gens[i], 7, 0.5, delta=1e-5)
            assert (values[i] + noise).tobytes() == out[i].tobytes()
            assert ev == events[i]
        assert_same_ledgers(block.ledgers, [o.ledger for o in alone])


def test_the_audit_tap_sees_the_same_releases():
    def make():
        return [OwnerRelease(a, R, None, budget_eps=100.0) for a in AGENTS]

    values = np.random.default_rng(5).normal(size=(len(AGENTS), R, 4))
    scales = np.linspace(0.5, 2.0, len(AGENTS))
    taps = []
    for use_block in (True, False):
        owners = make()
        block = BlockRelease(owners)
        streams = rng.agent_run_streams(7, "noise", AGENTS, range(R))
        gens = [rng.run_streams(7, "noise", a, range(R)) for a in AGENTS]
        with tap.tapping(tap.Tap(AGENTS[3], R, keep=4)) as t:
            for _ in range(5):
                if use_block:
                    block.laplace(values, streams, 1.0, scales)
                else:
                    for i, o in enumerate(owners):
                        o.laplace(values[i], gens[i], 1.0, scale=scales[i])
        taps.append(t)
    a, b = taps
    assert a.count.tolist() == b.count.tolist() == [5] * R
    assert [v.tobytes() for v in a.values] == [v.tobytes() for v in b.values]
    assert a.events == b.events


def test_many_owners_one_vectorised_step(one_at_a_time):
    """10^3 owners: the block's ledgers equal per-owner ones after many varying charges."""
    k = 1000
    eps = np.where(np.arange(k) % 7 == 0, 0.5, 1.0)

    def make():
        return [OwnerRelease(a, 2, None, budget_eps=float(e) * 60) for a, e in
                zip(range(k), eps, strict=True)]

    block, alone = BlockRelease(make()), make()
    for t in range(50):
        S = 2.0 * 0.1 / math.sqrt(t + 1) * math.sqrt(10) / 3
        scales = (S / eps).tolist()
        block.charge(S, scales, record_pass=t // 20)
        charge_one_at_a_time(alone, S, scales, record_pass=t // 20)
    assert not one_at_a_time
    assert_same_ledgers(block.ledgers, [o.ledger for o in alone])
