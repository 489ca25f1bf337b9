"""admm with a rank's agents as one block (issue 29): the block's steps are each agent's own.

The reference here is the agent-by-agent loop admm ran before (one Agent object computing, drawing
its noise from its own streams and charging its own ledger): the block must give the same bits,
whichever agents share it, on any number of ranks, and across a checkpoint.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
from helpers import admm_paper_contract, assert_rank_invariant, write_job
from mpi4py import MPI

from mpi_dp.algorithms import admm
from mpi_dp.algorithms import admm_steps as steps
from mpi_dp.algorithms.common import agent_order_sum
from mpi_dp.comm.star import Star
from mpi_dp.data.shard_writer import write_shards
from mpi_dp.models import multinomial
from mpi_dp.privacy import gaussian_sigma
from mpi_dp.rng import run_streams

J, K = 4, 3
#: record counts: equal sizes that stack, n = 1 and a large agent (both per-agent)
SIZES = (5, 12, 1, 5, 40, 12, 2, 5, admm.STACK_MAX_ELEMS // J + 1, 12, 3)


def agents_data(sizes=SIZES, seed=0, k=K) -> list[tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(seed)
    W = rng.normal(size=(J, k)) * 2
    out = []
    for n in sizes:
        X = rng.random((n, J))
        out.append((X, np.argmax(X @ W + rng.gumbel(size=(n, k)), axis=1)))
    return out


def settings(method: str, data, runs=2, k=K, **kw) -> admm.Settings:
    kw.pop("eps_bar", None)  # the contract's (`setup`)
    return admm.Settings(method=method, T=kw.pop("T", 4), n=tuple(len(y) for _, y in data), J=J,
                         K=k, record_every=1, run_ids=tuple(range(runs)), seed=11, **kw)


def setup(method: str, data, **kw):
    """(settings, the paper rule's contract at eps_bar (default 0.7) per iteration, eps_bar)."""
    eps_bar = kw.get("eps_bar", 0.7)
    s = settings(method, data, **kw)
    return s, admm_paper_contract(s, eps_bar), eps_bar


def agents_of(data, s, con) -> list:
    return [admm.Agent(i, X, y, s, con) for i, (X, y) in enumerate(data)]


# -- the reference: the agent loop admm ran before issue 29 -------------------------------------
def reference_run(data, s: admm.Settings, con, eps_bar: float) -> tuple[np.ndarray, list]:
    """One agent at a time, exactly as admm.Agent stepped before the block (its own streams, its
    own ledger charge per release), the paper's noise at eps_bar per iteration; the server sums
    in agent order. Returns (w, agents)."""
    agents = agents_of(data, s, con)
    gens = [run_streams(s.seed, "noise", i, s.run_ids) for i in range(len(agents))]
    w = np.zeros((s.runs, J, s.K))

    def server(rho: float) -> np.ndarray:
        parts = np.array([steps.server_contribution(rho, a.z, a.lam).reshape(-1)
                          for a in agents])
        return steps.server_average(agent_order_sum(parts).reshape(w.shape), s.P, rho, s.box)

    for t in range(s.T):
        rho = s.rho(t, eps_bar)
        if s.method == "outp":
            for a, g in zip(agents, gens, strict=True):
                _old_step_outp(a, g, w, t, rho, eps_bar)
            w = server(rho)
            for a in agents:
                a.lam = steps.dual_update(a.lam, rho, w, a.z)
        else:
            w = server(rho)
            for a, g in zip(agents, gens, strict=True):
                _old_step_objective(a, g, w, t, rho, eps_bar)
    for a, g in zip(agents, gens, strict=True):
        a.gens = g
    return w, agents


def _old_finish(a, z_new, noise, scale) -> None:
    R = a.s.runs
    a.noise_mag = np.abs(noise).reshape(R, -1).mean(axis=1)
    a.scale = np.asarray(scale, dtype=np.float64)
    a.z_change = np.abs(z_new - a.z).reshape(R, -1).mean(axis=1)
    a.z = z_new


def _old_step_objective(a, gens, w, t, rho, eps_bar) -> None:
    s = a.s
    G, terms_max = multinomial.grad_sum_and_terms_max(a.X, a.y, a.z, a.row_l1)
    g = steps.agent_gradient(G, s.I, s.gamma, s.P, a.z, w, s.reg_grad)
    sens = np.broadcast_to(np.asarray(steps.sensitivity(terms_max, s.I, s.sens_mode, s.J,
                                                        s.row_bound)), (s.runs,))
    b = np.broadcast_to(np.asarray(steps.laplace_scale(sens, eps_bar)), (s.runs,))
    xi, _ = a.release.laplace_noise(gens, s.J * s.K, sens, scale=b)
    xi = xi.reshape(a.z.shape)
    if s.method == "objt":
        z_new = steps.objt_update(w, a.lam, g, a.z, xi, rho,
                                  steps.delta_objt(t, s.prox_scale, s.tr_schedule), s.box)
    else:
        z_new = steps.objp_update(w, a.lam, g, a.z, xi, rho, steps.eta_objp(t, s.prox_scale),
                                  s.box)
    _old_finish(a, z_new, xi, b)
    a.lam = steps.dual_update(a.lam, rho, w, a.z)


def _paper_sigma(sens: float, eps_bar: float, s: admm.Settings) -> float:
    """OutP's sigma of the paper rule at (eps_bar, dp_delta): the Gaussian of
    outp_calibration ('paper': the classical formula at every eps)."""
    if math.isinf(eps_bar):
        return 0.0
    paper = s.outp_calibration == "paper"
    return gaussian_sigma(sens, eps_bar, s.dp_delta,
                          calibration="classical" if paper else s.outp_calibration,
                          allow_large_eps=paper)


def _old_step_outp(a, gens, w, t, rho, eps_bar) -> None:
    s = a.s
    G = multinomial.grad_sum(a.X, a.y, a.z)
    g = steps.outp_gradient(G, a.n, s.gamma, w)
    inv_eta = steps.outp_inv_eta(t, s.prox_scale, a.n, eps_bar, s.dp_delta)
    sens = steps.outp_l2_sensitivity(rho, inv_eta)
    std = steps.outp_noise_std(_paper_sigma(sens, eps_bar, s), s.outp_noise_std)
    z_new = steps.outp_update(w, a.lam, g, a.z, rho, inv_eta)
    noise, ev = a.release.gaussian_noise(gens, s.J * s.K, sens, sigma=std, delta=s.dp_delta)
    noise = noise.reshape(a.z.shape)
    _old_finish(a, z_new + noise, noise, np.full(s.runs, ev.sigma))


def assert_same_agents(ours, ref) -> None:
    """Bitwise equal states, noise positions and ledgers (releases, spending, events)."""
    for a, b in zip(ours, ref, strict=True):
        for k in ("z", "lam", "noise_mag", "scale", "z_change"):
            np.testing.assert_array_equal(getattr(a, k), getattr(b, k), err_msg=f"{a.agent} {k}")
        for x, y in zip(a.state()["noise"], b.gens.position(), strict=True):
            np.testing.assert_array_equal(x, y)
        la, lb = a.ledger, b.ledger
        np.testing.assert_array_equal(la.releases, lb.releases)
        np.testing.assert_array_equal(la.spent_eps, lb.spent_eps)
        np.testing.assert_array_equal(la.spent_delta, lb.spent_delta)
        assert [(e, c.tolist()) for e, c in la.event_counts()] == \
            [(e, c.tolist()) for e, c in lb.event_counts()]


# -- the kernels ---------------------------------------------------------------------------------
@pytest.mark.parametrize("R,Kc", [(1, 2), (2, 3), (5, 10)])
def test_stacked_kernels_give_each_agent_its_own_bits(R, Kc):
    """multinomial's stack_* kernels: each agent of a stack gets bitwise what the single-agent
    functions give it (gradient, sensitivity terms, loss, errors), at per-agent and shared
    models, for record counts on both sides of numpy's 8-wide pairwise blocks."""
    rng = np.random.default_rng(R * Kc)
    for n in (2, 3, 8, 9, 17, 130):
        B = 5
        X = rng.random((B, n, J)) * 3
        y = rng.integers(0, Kc, (B, n))
        W = rng.normal(size=(B, R, J, Kc)) * 2
        l1 = np.abs(X).sum(axis=2)
        G, tmax = multinomial.stack_grad_sum(X, y, W, l1, terms=True)
        G2, none = multinomial.stack_grad_sum(X, y, W)
        loss, wrong = multinomial.stack_loss_sum(X, y, W[0]), multinomial.stack_errors(X, y, W[0])
        assert none is None and multinomial.stackable(n, R, Kc)
        for b in range(B):
            g, t = multinomial.grad_sum_and_terms_max(X[b], y[b], W[b], l1[b])
            assert g.tobytes() == G[b].tobytes() and t.tobytes() == tmax[b].tobytes()
            assert multinomial.grad_sum(X[b], y[b], W[b]).tobytes() == G2[b].tobytes()
            assert multinomial.loss_sum(X[b], y[b], W[0]).tobytes() == loss[b].tobytes()
            np.testing.assert_array_equal(multinomial.errors(X[b], y[b], W[0]), wrong[b])


def test_what_cannot_stack_takes_the_per_agent_path():
    """n = 1, several row chunks or a large agent: not stacked (per-agent kernels)."""
    assert not multinomial.stackable(1, 2, 3) and multinomial.stackable(2, 2, 3)
    assert not multinomial.stackable(multinomial.chunk_rows(2, 3) + 1, 2, 3)
    data = agents_data()
    s, con, _ = setup("objt", data)
    block = admm.AgentBlock(agents_of(data, s, con), s, con)
    single = [len(data[i][1]) for i in block.stacks.single]
    assert sorted(single) == [1, SIZES[8]]
    stacked = sorted(i for p, *_ in block.stacks.batches for i in p.tolist())
    assert stacked == sorted(set(range(len(SIZES))) - set(block.stacks.single))


# -- the steps -----------------------------------------------------------------------------------
@pytest.mark.parametrize("method,kw", [
    ("objt", {"sens_mode": "global"}),
    ("objt", {"sens_mode": "local_max"}),
    ("objt", {"sens_mode": "global", "k": 2, "runs": 3}),  # J K = 8: drawn runs fastest alone
    ("objp", {"sens_mode": "local_max_x2", "w_bound": 0.5}),
    ("objp", {"sens_mode": "global", "eps_bar": math.inf}),
    ("objp", {"sens_mode": "local_max", "k": 2, "runs": 1}),
    ("outp", {}),
    ("outp", {"k": 2, "runs": 20}),  # R >= 2 J K: drawn runs fastest alone
    ("outp", {"outp_noise_std": "sigma_sq", "outp_calibration": "paper", "eps_bar": 2.0}),
])
def test_a_block_run_equals_the_agent_loop_bit_for_bit(method, kw):
    """run_config over a block of unequal agents (stacked groups, n = 1, a large agent) gives
    bitwise the final models, every agent's state and logs (noise_mag too, whichever layout an
    agent's own draw has), noise position and ledger of the agent loop admm ran before."""
    data = agents_data(k=kw.get("k", K))
    s, con, eps_bar = setup(method, data, **kw)
    w_ref, ref = reference_run(data, s, con, eps_bar)
    agents = agents_of(data, s, con)
    out = admm.run_config(Star(MPI.COMM_SELF, len(agents)), agents, s, con, None, None,
                          progress=False)
    assert out.final.tobytes() == w_ref.tobytes()
    assert_same_agents(agents, ref)


def test_an_agents_results_do_not_depend_on_its_block_mates():
    """Stepping agents alone (Agent.step_objective: a block of one) or in any sub-block gives the
    same bits as the whole block: nothing of one agent's arithmetic reads another's."""
    data = agents_data()
    s, con, eps_bar = setup("objt", data, sens_mode="local_max")
    w = np.random.default_rng(3).normal(size=(s.runs, J, K)) * 0.1
    whole, alone, halves = (agents_of(data, s, con) for _ in range(3))
    blocks = [admm.AgentBlock(whole, s, con), admm.AgentBlock(halves[::2], s, con),
              admm.AgentBlock(halves[1::2], s, con)]
    for t in range(3):
        for b in blocks:
            b.step_objective(w, t, s.rho(t, eps_bar))
        for a in alone:
            a.step_objective(w, t, s.rho(t, eps_bar))
    for b in blocks:
        b.write_back()
    for a, b, c in zip(whole, alone, halves, strict=True):
        for k in ("z", "lam", "scale"):
            assert getattr(a, k).tobytes() == getattr(b, k).tobytes() == getattr(c, k).tobytes()
    m = blocks[0].metrics(w)
    assert all(m[i].tobytes() == a.metrics(w).tobytes() for i, a in enumerate(alone))


def test_a_block_checkpoint_continues_bit_for_bit():
    """The block's members save each agent's state (models, logs, ledger, noise position) in
    Agent.state's form; restoring them into a fresh block continues the run bit for bit."""
    data = agents_data()
    s, con, _ = setup("objp", data, sens_mode="local_max", T=5)
    star = Star(MPI.COMM_SELF, len(data))

    def fresh() -> admm.AgentBlock:
        return admm.AgentBlock(agents_of(data, s, con), s, con)

    def steps_(block, w, ts):
        for t in ts:
            w = admm.iterate(star, block, s, w, t, block.rho(t))
        return w

    straight = fresh()
    w_all = steps_(straight, np.zeros((s.runs, J, K)), range(5))
    first = fresh()
    w = steps_(first, np.zeros((s.runs, J, K)), range(2))
    saved = {m.agent: m.state() for m in first.members()}
    assert list(saved[0]) == [*admm.Agent.STATE, "noise"]
    second = fresh()
    for m in second.members():
        m.restore(saved[m.agent])
    w = steps_(second, w, range(2, 5))
    assert w.tobytes() == w_all.tobytes()
    second.write_back()
    straight.write_back()
    for a, b in zip(second.agents, straight.agents, strict=True):
        st_a, st_b = a.state(), b.state()
        for k in ("z", "lam", "noise_mag", "scale", "z_change"):
            assert st_a[k].tobytes() == st_b[k].tobytes()
        assert all(x.tobytes() == y.tobytes() for x, y in zip(st_a["noise"], st_b["noise"],
                                                              strict=True))
        np.testing.assert_array_equal(a.ledger.spent_eps, b.ledger.spent_eps)


def test_a_block_charges_every_ledger_once_per_release():
    """One release per agent and iteration, charged before the noise: under a global sensitivity
    every agent's event is the same; under local_max each agent's own (data-dependent)."""
    data = agents_data()
    for mode, distinct in (("global", 1), ("local_max", len(data))):
        s, con, _ = setup("objt", data, sens_mode=mode)
        agents = agents_of(data, s, con)
        block = admm.AgentBlock(agents, s, con)
        block.step_objective(np.zeros((s.runs, J, K)), 0, block.rho(0))
        assert all(a.ledger.releases.tolist() == [1] * s.runs for a in agents)
        events = {e for a in agents for e, _ in a.ledger.event_counts()}
        assert len(events) == distinct and all(e.data_dependent == (mode != "global")
                                               for e in events)


# -- under mpiexec -------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def unequal_shard(tmp_path_factory):
    """A multiclass shard of 40 agents of 1 to 30 records and one of 3,000, with a test set."""
    path = tmp_path_factory.mktemp("admm_block") / "unequal.h5"
    rng = np.random.default_rng(9)
    sizes = rng.integers(1, 31, 40)
    sizes[7] = 3000
    data = agents_data(tuple(int(n) for n in sizes), seed=9)
    test = agents_data((200,), seed=10)[0]
    write_shards(path, [(X, y.astype(np.float64)) for X, y in data], task="multiclass",
                 test_global=(test[0], test[1].astype(np.float64)))
    return path


def test_an_unequal_shard_is_rank_invariant(tmp_path, unequal_shard):
    """Agents of unequal sizes, as blocks of 40, 20 + 20 or 14 + 13 + 13 agents: the same bits
    (every dataset of the result file) on 1, 2 and 3 ranks, for the three variants."""
    job = write_job(tmp_path / "u.toml", unequal_shard, algorithm="admm", runs=2, T=4,
                    record_every=2, sweep={"variant": ["objt", "objp", "outp"]},
                    admm={"sens_mode": "local_max"})
    r = assert_rank_invariant(job, tmp_path, ranks=(1, 2, 3))[0]
    assert r["configs/002/models/final"].shape == (2, J, K)


def test_a_rank_without_agents_steps_an_empty_block():
    """A rank hosting no agent (the server's, with few agents) steps and evaluates nothing."""
    s = settings("outp", agents_data((3, 4)))
    block = admm.AgentBlock([], s)
    w = np.zeros((s.runs, J, K))
    block.step_outp(w, 0, 1.0)
    admm.AgentBlock([], dataclasses.replace(s, method="objt")).step_objective(w, 0, 1.0)
    assert block.contributions(1.0).shape == (0, s.runs * J * K)
    assert block.metrics(w).shape == (0, admm.N_METRICS * s.runs)
    assert block.label_counts().shape == (0, K) and block.members() == []
