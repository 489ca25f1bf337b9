"""The live hot path of the asynchronous star (issue 15): mpi_dp.models.kernels on both backends, the
owner's one-owner answer path, the ledger's scalar charge.

NumPy backend: the same bits as the general code it replaces (linear.clipped_grad_sum,
privacy.laplace_mechanism, Learner.update). numba backend: the same bits for elementwise work
(query points, learner steps, Laplace draws), 1e-12-close for reductions (gradient sums, norms).
"""

from __future__ import annotations

import contextlib
import math
import time

import numpy as np
import pytest
from test_async_star import owner, run, settings, synth_S

from mpi_dp.algorithms import async_star
from mpi_dp.comm.p2p_star import ANSWERED, LAST_ANSWER
from mpi_dp.errors import BudgetExceededError
from mpi_dp.models import kernels, linear
from mpi_dp.privacy import Ledger, tap
from mpi_dp.privacy.events import LaplaceEvent
from mpi_dp.rng import run_streams

BACKENDS = ["numpy"] + (["numba"] if kernels.available() else [])


@contextlib.contextmanager
def backend(name: str):
    old = kernels.set_backend(name)
    try:
        yield
    finally:
        kernels.set_backend(old)


@pytest.fixture(params=BACKENDS)
def each_backend(request):
    with backend(request.param):
        yield request.param


def _strided(a: np.ndarray) -> np.ndarray:
    """`a` as the strided row view of a message buffer (rows of 2 + p numbers)."""
    buf = np.zeros((a.shape[0], a.shape[1] + 2))
    buf[:, 2:] = a
    return buf[:, 2:]


def _shard(n: int = 120, p: int = 6, seed: int = 0):
    rng = np.random.default_rng(seed)
    X = rng.uniform(-1, 1, (n, p))
    X[3] = 0.0  # a record of L1 norm 0 (threshold inf)
    return X, X @ rng.normal(size=p) + 0.3 * rng.standard_normal(n)


@pytest.mark.parametrize("m", [1, 3])
@pytest.mark.parametrize("same", [False, True])
def test_clipped_grad_kernel_matches_clipped_grad_sum(each_backend, m, same):
    X, y = _shard()
    st = linear.squared_stats(X, y)
    rng = np.random.default_rng(m)
    T = rng.normal(size=(1 if same else m, X.shape[1])) * 0.5
    T = _strided(np.repeat(T, m, axis=0) if same else T)
    ref, ref_c = linear.clipped_grad_sum("squared", X, y, T, 0.8, st)
    out, c = np.empty((m, X.shape[1])), np.full(m, 99, dtype=np.int64)
    kernels.sq_clipped_grad(X, y, linear._thresholds(0.8, st.row_l1), T, out, c)
    assert np.array_equal(c, ref_c) and ref_c.min() > 0
    if each_backend == "numpy":
        assert np.array_equal(out, ref)  # the same operations
    else:
        np.testing.assert_allclose(out, ref, rtol=1e-12, atol=1e-12 * np.abs(ref).max())


@pytest.mark.parametrize("rows,size", [([0], 10), ([3, 1], 4), ([0, 1, 2, 3], 20)])
def test_laplace_answer_is_grad_over_n_plus_the_streams_draws(each_backend, rows, size):
    rows = np.array(rows)
    ref_st = run_streams(5, "noise", 2, range(4))
    st = run_streams(5, "noise", 2, range(4))
    rng = np.random.default_rng(1)
    for _ in range(20):
        g = rng.normal(size=(rows.size, size))
        ref = g / 37 + ref_st.laplace(size, rows) * 0.3
        out = _strided(np.empty((rows.size, size)))
        assert kernels.laplace_answer(g, 37, st, rows, 0.3, out)
        assert np.array_equal(out, ref)  # bit for bit on both backends
    assert np.array_equal(st.h, ref_st.h) and np.array_equal(st.lo, ref_st.lo)
    before = st.position()
    out = np.empty((rows.size, size))
    kernels.laplace_answer(g, 37, st, rows, 0.0, out)  # eps = inf: no noise, nothing drawn
    assert np.array_equal(out, g / 37) and all(np.array_equal(a, b)
                                               for a, b in zip(before, st.position(), strict=True))


def test_laplace_draws_skip_a_zero_uniform_as_numpy_does(each_backend):
    """Make row 1's next raw output 0 (post-step state with high == low words, so the XSL-RR
    output is 0): numpy's laplace skips that uniform; the kernel must do the same."""
    a, b = run_streams(1, "noise", 0, range(2)), run_streams(1, "noise", 0, range(2))
    for st in (a, b):
        st.h[1] = st.lo[1] = np.uint64(0x1234567890ABCDEF)
        st._rewind(1, 1)
    assert a.random(1, [1])[0, 0] == 0.0  # the zero is there
    a._rewind(1, 1)
    ref = a.laplace(6, np.array([0, 1]))
    out = np.empty((2, 6))
    kernels.laplace_answer(np.zeros((2, 6)), 1, b, np.array([0, 1]), 1.0, out)
    assert np.array_equal(out, ref) and np.array_equal(a.h, b.h) and np.array_equal(a.lo, b.lo)


def test_learner_kernels_are_bitwise_learner_update(each_backend):
    s = settings([50, 80, 70], [1.0] * 3, runs=3, T=40, rho=3.0, theta_max=0.7)
    rng = np.random.default_rng(2)
    ref = async_star.Learner(s, rng.uniform(-1, 1, (3, 5)))
    fast = async_star.Learner(s, ref.theta_L)
    runs = np.arange(3)
    for k in range(30):
        i = k % 3
        own = np.full(3, i)
        tb = ref.query_points(runs, own)
        points = _strided(np.empty((3, 5)))
        fast.query_points_into(i, points)
        assert np.array_equal(points, tb)
        r = _strided(rng.normal(size=(3, 5)) * 50)  # large: the box binds
        ref.update(runs, own, tb, r)
        fast.update_owner(i, points, r)
        assert np.array_equal(fast.theta_L, ref.theta_L)
        assert np.array_equal(fast.theta_loc, ref.theta_loc)
    assert np.abs(ref.theta_loc).max() == 0.7  # the box bound


def test_row_norms(each_backend):
    a = _strided(np.random.default_rng(3).normal(size=(4, 9)))
    ref = np.sqrt(np.einsum("ij,ij->i", a, a))
    out = kernels.row_norms(a, np.empty(4))
    if each_backend == "numpy":
        assert np.array_equal(out, ref)
    else:
        np.testing.assert_allclose(out, ref, rtol=1e-14)


def test_charge_one_is_charge_of_one_run():
    ev = LaplaceEvent(0.02, 0.1)  # eps 0.2 per release
    a, b = Ledger(4, 1.0, runs=3), Ledger(4, 1.0, runs=3)
    for r in (0, 2, 2, 1, 2, 2):
        a.charge(ev, np.array([r]))
        b.charge_one(ev, r)
    for name in ("_run_eps", "releases", "spent_eps"):
        assert np.array_equal(getattr(a, name), getattr(b, name))
    assert [(e.key(), c.tolist()) for e, c in a.event_counts()] == \
        [(e.key(), c.tolist()) for e, c in b.event_counts()]
    b.charge_one(ev, 2)  # the fifth release of eps 0.2 spends the budget of 1.0 exactly
    with pytest.raises(BudgetExceededError, match="refuses release 6"):
        b.charge_one(ev, 2)  # the sixth would exceed it: refused, nothing recorded
    assert b.releases.tolist() == [1, 1, 5] and b.event_counts()[0][1].tolist() == [1, 1, 5]
    other = LaplaceEvent(0.01, 0.1)
    fresh = Ledger(0, 0.05, runs=1)
    with pytest.raises(BudgetExceededError):
        fresh.charge_one(other, 0)
    assert fresh.event_counts() == []  # a refused first release leaves no event behind


def _owner(s, data, agent=0, eps=2.0, cap=None):
    assert s.eps[agent] == eps
    return owner(s, data, agent, s.T if cap is None else cap)


@pytest.mark.parametrize("runs", [[0], [2], [0, 1, 2]])
def test_answer_into_is_answer(each_backend, runs):
    data = synth_S([150, 90], seed=5)
    s = settings([150, 90], [2.0, math.inf], runs=3, T=30, xi=0.5)
    a, b = _owner(s, data, cap=4), _owner(s, data, cap=4)
    runs = np.array(runs)
    rng = np.random.default_rng(4)
    for _ in range(5):  # the 5th query is declined (cap 4)
        th = rng.normal(size=(runs.size, 5))
        st_a, r_a = a.answer(runs, th)
        st_b, r_b = np.empty(runs.size), _strided(np.empty((runs.size, 5)))
        b.answer_into(runs, _strided(th), st_b, r_b)
        assert np.array_equal(st_a, st_b) and np.array_equal(r_a, r_b)
    assert st_a.tolist() == [0] * runs.size
    assert np.array_equal(a.clipped, b.clipped) and a.clipped.max() > 0
    assert np.array_equal(a.ledger.releases, b.ledger.releases)
    assert np.array_equal(a.ledger.spent_eps, b.ledger.spent_eps)
    assert np.array_equal(a.release.streams.h, b.release.streams.h)


def test_fast_answer_is_the_general_mechanism(each_backend):
    """The owner's kernel path releases exactly what the general path (clipped_grad_sum +
    laplace_mechanism) releases, charges the same event and reports it to an audit tap."""
    data = synth_S([200], seed=8)
    s = settings([200], [1.0], runs=2, T=20)
    own = _owner(s, data, eps=1.0)
    assert own._direct
    ref = _owner(s, data, eps=1.0)
    ref._direct = False  # the general path
    th = np.full((2, 5), 0.2)
    with tap.tapping(tap.Tap(0, 2, keep=3)) as t:
        st, r = own.answer(np.arange(2), th)
    st_ref, r_ref = ref.answer(np.arange(2), th)
    assert st.tolist() == st_ref.tolist() == [ANSWERED] * 2
    if each_backend == "numpy":
        assert np.array_equal(r, r_ref)
    else:
        np.testing.assert_allclose(r, r_ref, rtol=1e-12)
    assert np.array_equal(t.values[0], r) and t.events[0] == own.event
    assert [(e.key(), c.tolist()) for e, c in own.ledger.event_counts()] == \
        [(e.key(), c.tolist()) for e, c in ref.ledger.event_counts()]
    last = _owner(s, data, eps=1.0, cap=1)
    assert last.answer(np.arange(2), th)[0].tolist() == [LAST_ANSWER] * 2


def test_runs_on_both_backends_agree():
    data = synth_S([300, 200, 250], seed=9)
    s = settings([300, 200, 250], [2.0, 1.0, math.inf], runs=2, T=200, caps=(30, 200, 200))
    out = {}
    for name in BACKENDS:
        with backend(name):
            out[name], _ = run(s, data)
    ref = out["numpy"]
    for o in out.values():
        assert np.array_equal(o["trace"].owner, ref["trace"].owner)
        assert np.array_equal(o["answered"], ref["answered"])
        assert np.array_equal(o["spent_eps"], ref["spent_eps"])
        assert np.array_equal(o["clip_fraction"], ref["clip_fraction"])
        np.testing.assert_allclose(o["models/final"], ref["models/final"], rtol=1e-10)
        np.testing.assert_allclose(o["trace"].resp_norm, ref["trace"].resp_norm, rtol=1e-10)


class _FakeRecv:
    """A posted receive that completes at wall time `at` (perf_counter)."""

    def __init__(self, at: float) -> None:
        self.at, self.times = at, []

    def Test(self, st=None) -> bool:  # noqa: N802 (mpi4py's name)
        self.times.append(time.perf_counter())
        return self.times[-1] >= self.at


def test_host_wait_learns_the_gap_after_each_owner_and_sleeps_through_most_of_it():
    from mpi_dp.comm.p2p_star import HostWait

    w = HostWait(predict=0.8)
    for gap in (0.004, 0.003, 0.005):  # host answers owner 2; the next query comes `gap` later
        w.answered(2)
        recv = _FakeRecv(time.perf_counter() + gap)
        w.wait(recv, None)
        w.noticed()
    assert len(w.gaps[2]) == 3 and min(w.gaps[2]) >= 0.003 and 3 not in w.gaps
    w.answered(2)
    t0 = time.perf_counter()
    recv = _FakeRecv(t0 + 0.003)
    w.wait(recv, None)
    # it slept through ~0.8 x 3 ms in one nap (no probe in between; naps alone would probe every
    # 0.1 ms at most) and returned only once the message was there
    times = np.array(recv.times) - t0
    assert not np.any((times > 1e-4) & (times < 1.5e-3)) and times[-1] >= 0.003
    for _ in range(10):  # only the last KEEP gaps are kept
        w.answered(2)
        w.noticed()
    assert len(w.gaps[2]) == HostWait.KEEP


@pytest.mark.parametrize("m", [1, 2])
def test_host_slot_answers_a_qry_into_the_rsp_layout(m):
    """HostSlot: QRY [k, m, (owner, run, theta[p]) x m] -> RSP [k, m, (owner, run, status, r[p])
    x m] through an `into` callback (the live host's hot path), as pack_response lays it out."""
    from mpi_dp.comm.p2p_star import HostSlot, pack_query, pack_response

    p = 3
    slot = HostSlot(p, m)
    thetas = np.arange(m * p, dtype=float).reshape(m, p)
    q = pack_query(7, np.full(m, 5), np.arange(m) + 1, thetas)
    slot.qbuf[:] = q
    assert slot.holds(q.size) and not slot.holds(q.size - 1)
    seen = {}

    def into(agent, runs, th, status_out, resp_out):
        seen.update(agent=agent, runs=runs.tolist(), th=th.copy())
        status_out[:] = ANSWERED
        resp_out[:] = -th

    assert slot.answer(into) == (5, ANSWERED)
    assert seen["agent"] == 5 and seen["runs"] == list(range(1, m + 1))
    assert np.array_equal(seen["th"], thetas)
    ref = pack_response(7, np.full(m, 5), np.arange(m) + 1, np.full(m, ANSWERED), -thetas)
    assert np.array_equal(slot.rsp, ref)
