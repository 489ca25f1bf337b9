"""Seed 000: asynchronous DP learning on a star (spec async-star-cost-of-privacy.md, checks V1-V16).

In-process runs use the real code path on one MPI rank (learner and owners on rank 0); the MPI
tests (several ranks, live mode) are in test_mpi_async.py.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from mpi4py import MPI
from scipy import stats

from mpi_dp.algorithms import async_star
from mpi_dp.algorithms.common import LocalShard, Oracle, reference_quantities
from mpi_dp.comm.p2p_star import ANSWERED, DECLINED, LAST_ANSWER, P2PStar, pack_response
from mpi_dp.comm.schedule import LoggedSchedule, Scheduler
from mpi_dp.comm.star import Star
from mpi_dp.models import linear, reference
from mpi_dp.privacy import rules
from mpi_dp.privacy.contract import Contract

BETA = np.array([0.5, -0.3, 0.8, -0.6, 0.2])


def synth_S(n: list[int], seed: int = 0) -> list[tuple[np.ndarray, np.ndarray]]:
    """Spec §8 synthetic set S: x ~ U[-1,1]^5, y = x.beta + 0.25 N(0,1), independent owners."""
    rng = np.random.default_rng(seed)
    out = []
    for ni in n:
        X = rng.uniform(-1, 1, size=(ni, 5))
        out.append((X, X @ BETA + 0.25 * rng.standard_normal(ni)))
    return out


def settings(n, eps, runs=1, first=0, **kw) -> async_star.Settings:
    T = kw.pop("T", 1000)
    base = dict(T=T, loss="squared", lam=1e-5, theta_max=10.0, theta0=0.0, init="const",
                xi=1.0, clip=True, rho=1.5, central_step="proof", eps=tuple(eps), n=tuple(n),
                caps=tuple([T] * len(n)), p=5, seed=3,
                run_ids=tuple(range(first, first + runs)), record_every=T)
    base.update(kw)
    return async_star.Settings(**base)


def contract_of(s: async_star.Settings) -> Contract:
    """The paper's rule for the settings' owners (what a bare run of the algorithm used)."""
    return Contract.planned(rules.BasicSplit(), "laplace", list(s.caps), s.eps, seed=s.seed,
                            run_ids=s.run_ids)


def owner(s: async_star.Settings, data, agent: int = 0, cap: int | None = None
          ) -> async_star.DataOwner:
    return async_star.DataOwner(LocalShard(agent, *data[agent]),
                                async_star.owner_release(contract_of(s), agent, s),
                                s.caps[agent] if cap is None else cap, s)


def run(s: async_star.Settings, data, logged=None, theta_init=None):
    """run_config on one rank; returns (output dict, reference)."""
    star = Star(MPI.COMM_SELF, s.N)
    link = P2PStar(MPI.COMM_SELF, star.layout, s.p)
    shards = [LocalShard(i, *data[i]) for i in range(s.N)]
    ref = reference_quantities(Oracle(star, shards, s.loss, s.lam, s.n_total, s.p), s.theta_max,
                               "closed")
    return async_star.run_config(star, link, shards, s, contract_of(s), ref, None, progress=False,
                                 logged=logged), ref


# -- V2: noise scale, caps and the ledger -------------------------------------------------------
def test_lap_scale_caps_and_refusal():
    data = synth_S([200, 300])
    s = settings([200, 300], [2.0, math.inf], runs=2, T=50, caps=(3, 50))
    own = owner(s, data, 0, 3)
    assert own.lap_scale == 2 * s.xi * 3 / (200 * 2.0)  # b_i = 2 xi m_i / (n_i eps_i)
    assert async_star.lap_scales(contract_of(s), s)[1] == 0.0
    np.testing.assert_array_equal(async_star.lap_scales(contract_of(s), s),
                                  [2 * 1.0 * 3 / (200 * 2.0), 0.0])
    runs, th = np.array([0, 1]), np.zeros((2, 5))
    got = [own.answer(runs, th)[0].tolist() for _ in range(4)]
    assert got == [[ANSWERED] * 2, [ANSWERED] * 2, [LAST_ANSWER] * 2, [DECLINED] * 2]
    np.testing.assert_allclose(own.ledger.spent_eps, [2.0, 2.0])  # never above eps_i
    status, resp = own.answer(np.array([1]), th[:1])
    assert status[0] == DECLINED and not resp.any()  # a refusal releases nothing


def test_paper_code_preset_scale_and_flag(tmp_path, small_shards):
    from mpi_dp.job import load_job
    from mpi_dp.run_async import settings_for

    job_path = tmp_path / "j.toml"
    job_path.write_text(f'algorithm = "async_star"\ndata = "{small_shards}"\nT = 40\n'
                        '[async]\npreset = "paper_code"\nnoise_shape = "scalar"\n'
                        'per_owner_cap = 0\n')  # m_i = T
    job = load_job(job_path)
    s = settings_for(job, [2.0] * 3, [600, 500, 700], 3, xi=9.9, rho=1.0, p=5, run_ids=(0,))
    assert not s.dp_valid and not s.clip and s.xi == 5 / 2
    np.testing.assert_allclose(async_star.lap_scales(contract_of(s), s),
                               [40 * 5 / (ni * 2.0) for ni in (600, 500, 700)])
    bad = tmp_path / "b.toml"
    bad.write_text(f'algorithm = "async_star"\ndata = "{small_shards}"\nT = 40\n'
                   '[async]\nnoise_shape = "scalar"\n')
    with pytest.raises(Exception, match="not DP"):
        load_job(bad)


def test_scalar_noise_moves_only_the_ones_direction():
    """paper_code's scalar noise: answer - clean gradient is c (1, ..., 1) (why it is not DP)."""
    data = synth_S([300])
    s = settings([300], [1.0], T=10, noise_shape="scalar", dp_valid=False)
    own = owner(s, data, 0, 10)
    th = np.full((1, 5), 0.1)
    _, r = own.answer(np.array([0]), th)
    clean = linear.clipped_grad_sum("squared", *data[0], th, 1.0)[0] / 300
    d = (r - clean)[0]
    assert np.ptp(d) < 1e-12 and abs(d[0]) > 0


# -- V3: sensitivity ----------------------------------------------------------------------------
def test_replace_one_sensitivity_bound():
    rng = np.random.default_rng(5)
    X, y = synth_S([150])[0]
    xi, n = 0.7, 150
    worst = 0.0
    for t in range(1000):
        Xb, yb = X.copy(), y.copy()
        j = rng.integers(n)
        scale = 10.0 ** rng.uniform(0, 6) if t % 2 else 1.0  # adversarial huge records too
        Xb[j] = rng.uniform(-1, 1, 5) * scale
        yb[j] = rng.standard_normal() * scale
        th = rng.uniform(-10, 10, size=(1, 5))
        q1 = linear.clipped_grad_sum("squared", X, y, th, xi)[0] / n
        q2 = linear.clipped_grad_sum("squared", Xb, yb, th, xi)[0] / n
        worst = max(worst, float(np.abs(q1 - q2).sum()))
    assert worst <= 2 * xi / n * (1 + 1e-12)
    assert worst > 1.5 * xi / n  # the bound is nearly attained: clipping is really active


# -- V4: schedulers ----------------------------------------------------------------------------
def test_uniform_scheduler_chi_square():
    N = 3
    sch = Scheduler("uniform", N, seed=11, run_ids=(0,))
    own = np.array([sch.next_for(0)[0] for _ in range(300_000)])
    counts = np.bincount(own, minlength=N)
    assert stats.chisquare(counts).pvalue > 1e-4
    assert np.all(np.abs(counts / counts.sum() - 1 / N) < 0.005)


def test_poisson_scheduler_law():
    N, lam = 3, 1.0
    sch = Scheduler("poisson", N, seed=12, run_ids=(0,))
    ev = [sch.next_for(0) for _ in range(10_000)]
    own = np.array([e[0] for e in ev])
    t = np.array([e[1] for e in ev])
    assert t[0] == 0.0  # t_1 = 0
    dt = np.diff(t)
    assert abs(dt.mean() - 1 / (N * lam)) < 0.04 / (N * lam)
    assert stats.kstest(dt, "expon", args=(0, 1 / (N * lam))).pvalue > 1e-3
    assert stats.chisquare(np.bincount(own, minlength=N)).pvalue > 1e-4


def test_schedule_of_a_run_does_not_depend_on_the_others():
    a = Scheduler("poisson", 4, seed=1, run_ids=(0, 1, 2))
    b = Scheduler("poisson", 4, seed=1, run_ids=(2,))
    seq_a = [a.next(np.array([0, 1, 2])) for _ in range(600)]  # > one refill block
    seq_b = [b.next(np.array([0])) for _ in range(600)]
    assert [int(x[0][2]) for x in seq_a] == [int(x[0][0]) for x in seq_b]
    assert [x[1][2] for x in seq_a] == [x[1][0] for x in seq_b]


def test_removed_owner_is_never_drawn_and_logged_schedule_skips_it():
    sch = Scheduler("uniform", 3, seed=2, run_ids=(0,))
    sch.remove(0, 1)
    assert 1 not in {sch.next_for(0)[0] for _ in range(2000)}
    log = LoggedSchedule(np.array([0, 1, 2, 1, 0]), np.arange(5.0), 3, runs=1)
    log.remove(0, 1)
    got = [int(log.next(np.array([0]))[0][0]) for _ in range(3)]
    assert got == [0, 2, 0] and log.exhausted(0)


# -- V5, V7: box and noise-free convergence -----------------------------------------------------
@pytest.mark.parametrize("init", ["const", "uniform"])
@pytest.mark.parametrize("central", ["proof", "printed"])
def test_noise_free_convergence_every_run(init, central):
    data = synth_S([1000] * 3, seed=1)
    s = settings([1000] * 3, [math.inf] * 3, runs=50, clip=False, init=init,
                 central_step=central)
    out, ref = run(s, data)
    psi = out["final_psi"]
    assert np.all(psi < 1e-3), psi.max()
    assert np.max(np.abs(out["models/final"] - ref.theta_star)) < 0.02
    # every owner served about T/N times in every run (uniform law of the Poisson clocks)
    answered = out["answered"]
    assert answered.sum(axis=1).tolist() == [1000] * 50
    assert np.all(np.abs(answered / 1000 - 1 / 3) < 0.1)


def test_box_holds_at_every_step():
    data = synth_S([300] * 3, seed=2)
    s = settings([300] * 3, [1.0] * 3, runs=4, T=200, theta_max=0.3, rho=1.5)
    star = Star(MPI.COMM_SELF, 3)
    link = P2PStar(MPI.COMM_SELF, star.layout, 5)
    shards = [LocalShard(i, *data[i]) for i in range(3)]
    ref = reference_quantities(Oracle(star, shards, "squared", s.lam, 900, 5), 0.3, "closed")
    seen = []
    orig = async_star.Learner.update

    def spy(self, runs, owners, tb, r):
        seen.append(np.abs(tb).max())
        orig(self, runs, owners, tb, r)
        seen.append(max(np.abs(self.theta_L).max(), np.abs(self.theta_loc).max()))

    async_star.Learner.update = spy
    try:
        async_star.run_config(star, link, shards, s, contract_of(s), ref, None, progress=False)
    finally:
        async_star.Learner.update = orig
    assert max(seen) <= 0.3 and max(seen) == 0.3  # the box binds and is never left
    th = np.array([[0.5, -2.0, 0.1]])
    np.testing.assert_array_equal(linear.project_box(linear.project_box(th, 0.3), 0.3),
                                  linear.project_box(th, 0.3))


def test_theta_star_closed_form_matches_bounded_solver_and_kkt():
    X, y = np.concatenate([d[0] for d in synth_S([400] * 3)]), None
    y = np.concatenate([d[1] for d in synth_S([400] * 3)])
    closed = reference.theta_star_local("squared", X, y, 1e-5, 10.0, solver="closed")
    lbfgs = reference.theta_star_local("squared", X, y, 1e-5, 10.0, solver="scipy")
    assert np.max(np.abs(closed - lbfgs)) < 1e-8
    box = reference.theta_star_local("squared", X, y, 1e-5, 0.3)
    g = 1e-5 * box + 2 * X.T @ (X @ box - y) / X.shape[0]
    pg = reference.projected_gradient(box, g, 0.3)
    assert np.max(np.abs(box)) == pytest.approx(0.3) and np.max(np.abs(pg)) < 1e-6


# -- determinism, declines, logged replay ----------------------------------------------------
def test_run_r_equals_single_run_r():
    data = synth_S([500] * 3, seed=4)
    many, _ = run(settings([500] * 3, [2.0] * 3, runs=4, T=300, xi=2.0), data)
    one, _ = run(settings([500] * 3, [2.0] * 3, runs=1, first=2, T=300, xi=2.0), data)
    assert np.array_equal(many["trace"].owner[2], one["trace"].owner[0])  # same schedule
    np.testing.assert_allclose(one["models/final"][0], many["models/final"][2], rtol=1e-12,
                               atol=1e-15)


def test_owner_over_budget_declines_and_run_ends_cleanly():
    data = synth_S([400] * 3, seed=6)
    s = settings([400] * 3, [1.0] * 3, runs=3, T=300, caps=(5, 300, 300))
    out, _ = run(s, data)
    tr = out["trace"]
    assert out["answered"][:, 0].tolist() == [5, 5, 5]
    assert out["answered"].sum(axis=1).tolist() == [300] * 3  # the others take over
    np.testing.assert_allclose(out["spent_eps"][:, 0], 1.0)  # all of owner 0's budget, no more
    dec = tr.decline_array()
    assert sorted(dec["run"].tolist()) == [0, 1, 2] and set(dec["owner"].tolist()) == {0}
    assert set(dec["reason"].tolist()) == {async_star.RETIRED}
    for r in range(3):  # never served after its 5th answer, which was at the declined k
        k_last = np.flatnonzero(tr.owner[r] == 0)[-1] + 1
        assert dec["k"][dec["run"] == r][0] == k_last
    # every owner capped: the runs end when all budgets are spent, with the reason recorded
    s2 = settings([400] * 3, [1.0] * 3, runs=2, T=300, caps=(5, 7, 9))
    out2, _ = run(s2, data)
    assert out2["trace"].ended_at.tolist() == [21, 21]
    assert "no owner left" in out2["trace"].end_reason
    assert np.all(out2["trace"].owner[:, 21:] == -1)


def test_replaying_a_logged_schedule_reproduces_the_iterates():
    data = synth_S([400] * 3, seed=7)
    s = settings([400] * 3, [3.0] * 3, runs=1, T=250, xi=2.0)
    first, _ = run(s, data)
    tr = first["trace"]
    again, _ = run(s, data, logged=(tr.owner[0], tr.time[0]))
    assert np.array_equal(again["trace"].owner, tr.owner)
    assert np.array_equal(again["models/final"], first["models/final"])  # bitwise
    assert np.array_equal(again["models/local"], first["models/local"])


# -- V16: what leaves an owner --------------------------------------------------------------
def test_response_message_carries_exactly_k_owner_run_status_and_noisy_answer():
    data = synth_S([250], seed=8)
    s = settings([250], [1.0], runs=1, T=20)
    own = owner(s, data, 0, 20)
    th = np.full((1, 5), 0.2)
    status, r = own.answer(np.array([0]), th)
    msg = pack_response(7, np.array([0]), np.array([0]), status, r)
    assert msg.size == 2 + 1 * (3 + 5)
    assert msg[:5].tolist() == [7, 1, 0, 0, ANSWERED] and np.array_equal(msg[5:], r[0])
    clean = linear.clipped_grad_sum("squared", *data[0], th, 1.0)[0][0] / 250
    fresh = owner(s, data, 0, 20)
    noise = fresh.release.streams.laplace(5, [0])[0] * own.lap_scale
    np.testing.assert_allclose(r[0], clean + noise, rtol=1e-12)  # noisy, not clean
    assert np.abs(r[0] - clean).min() > 0
