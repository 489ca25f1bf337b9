"""A rank's agents as one block (issue 29): every agent's result from the stacked kernels is bit for
bit what it computes alone, whatever agents share its block; the star owners answer as a block
exactly as one at a time; the same job on 1, 2, 3 and 4 ranks with 1,000 owners of unequal sizes
gives identical files."""

from __future__ import annotations

import math
import pickle

import numpy as np
import pytest
import scipy.sparse as sp
from helpers import assert_rank_invariant, write_job

from mpi_dp.algorithms import common, sync_star
from mpi_dp.algorithms.agent_block import AgentBlock
from mpi_dp.algorithms.common import LocalShard, agent_order_sum, error_counts, ordered_total
from mpi_dp.errors import BudgetExceededError
from mpi_dp.models import linear
from mpi_dp.privacy import rules
from mpi_dp.privacy.contract import Contract


def _shards(loss: str, seed: int = 0, p: int = 6) -> list[LocalShard]:
    """Owners of unequal sizes: repeated sizes (stacked groups), one beyond a row chunk (alone),
    one CSR (alone), one without records."""
    rng = np.random.default_rng(seed)
    sizes = [5, 50, 50, 7, 50, 1, 5, 2000, 50, 0, 30]
    out = []
    for i, n in enumerate(sizes):
        X = rng.normal(size=(n, p)) * rng.uniform(0.1, 3.0)
        y = rng.normal(size=n) if loss == "squared" else np.where(rng.random(n) < 0.4, -1.0, 1.0)
        out.append(LocalShard(i, X, y))
    X = sp.random(40, p, density=0.3, random_state=1, format="csr")
    out.append(LocalShard(len(out), X, np.where(rng.random(40) < 0.5, -1.0, 1.0)))
    return out


@pytest.mark.parametrize("loss", ["squared", "logistic", "hinge"])
@pytest.mark.parametrize("R", [1, 3])
@pytest.mark.parametrize("xi", [0.4, math.inf])
def test_block_gradients_are_each_agent_s_own(loss, R, xi):
    shards = _shards(loss)
    block = AgentBlock(shards)
    assert len(block.groups) >= 3 and len(block.singles) == 2  # CSR and the empty owner
    rng = np.random.default_rng(R)
    for T in (rng.normal(size=(R, 6)), np.repeat(rng.normal(size=(1, 6)), R, axis=0)):
        for stats in (False, True):
            g, c = block.clipped_grad_sums(loss, T, xi, stats)
            for j, sh in enumerate(shards):
                st = sh.squared_stats if stats and loss == "squared" else None
                g1, c1 = linear.clipped_grad_sum(loss, sh.X, sh.y, T, xi, st)
                assert np.array_equal(g[j], g1) and np.array_equal(c[j], c1), (j, stats)


@pytest.mark.parametrize("loss", ["squared", "logistic", "hinge"])
def test_block_loss_gradient_and_errors_are_each_agent_s_own(loss):
    shards = _shards(loss, seed=4)
    block = AgentBlock(shards)
    rng = np.random.default_rng(5)
    for M in (1, 2, 257):  # 257: the isolated optima's evaluation (fewer rows per chunk)
        T = rng.normal(size=(M, 6))
        L, E = block.loss_sums(loss, T), block.error_counts(T)
        for j, sh in enumerate(shards):
            assert np.array_equal(L[j], linear.loss_sum(loss, sh.X, sh.y, T)), (M, j)
            assert np.array_equal(E[j], error_counts(sh.X, sh.y, T)), (M, j)
    theta = rng.normal(size=(1, 6))
    G = block.grad_sums(loss, theta)
    for j, sh in enumerate(shards):
        assert np.array_equal(G[j], linear.grad_sum(loss, sh.X, sh.y, theta)[0]), j


def test_a_block_does_not_change_an_agent_s_result():
    """Agent 1's answer alone, in its own block, and among others: the same bits."""
    shards = _shards("logistic", seed=2)
    T = np.random.default_rng(0).normal(size=(2, 6))
    alone = AgentBlock([shards[1]]).clipped_grad_sums("logistic", T, 0.3, False)[0][0]
    among = AgentBlock(shards).clipped_grad_sums("logistic", T, 0.3, False)[0][1]
    pair = AgentBlock([shards[4], shards[1]]).clipped_grad_sums("logistic", T, 0.3, False)[0][1]
    assert np.array_equal(alone, among) and np.array_equal(alone, pair)


@pytest.mark.parametrize("elems,row_loop", [(1, 2**12), (7, 2**12), (2**20, 2**12), (2**20, 3)])
def test_agent_order_sum_adds_one_agent_after_the_other(monkeypatch, elems, row_loop):
    """The vectorised sum equals the loop it replaces bit for bit, signed zeros included, also
    for one column (where numpy's plain sum adds pairwise), for any chunking (rows added in
    place one by one; chunks of agents; all agents at once)."""
    monkeypatch.setattr(common, "ORDER_ELEMS", elems)
    monkeypatch.setattr(common, "ROW_LOOP_ELEMS", row_loop)
    rng = np.random.default_rng(1)

    def loop(rows):
        total = np.zeros(rows.shape[1:])
        for row in rows:
            total = total + row
        return total

    for shape in ((0, 3), (1, 1), (9, 1), (1000, 1), (1000, 4), (300, 2, 5)):
        rows = rng.normal(size=shape) * np.exp(5 * rng.normal(size=shape))
        rows[rng.random(shape) < 0.2] = -0.0
        a, b = loop(rows), agent_order_sum(rows)
        assert np.array_equal(a, b) and np.array_equal(np.signbit(a), np.signbit(b))


@pytest.mark.parametrize("elems,row_loop", [(1, 2**12), (36, 2**12), (2**20, 2**12), (2**20, 2)])
def test_ordered_total_is_the_learner_s_loop(monkeypatch, elems, row_loop):
    """sync_star's learner sum `d = lam theta; d = d + w_i r_i` as array work: the same bits
    (signed zeros included) for any chunking (one agent a chunk; 3 of 12 numbers; all), a lone
    column, one agent and none."""
    monkeypatch.setattr(common, "ORDER_ELEMS", elems)
    monkeypatch.setattr(common, "ROW_LOOP_ELEMS", row_loop)
    rng = np.random.default_rng(2)
    for n, item in ((0, (2, 3)), (1, (1, 1)), (7, (1, 1)), (10, (2, 5)), (1000, (3, 4))):
        rows = rng.normal(size=(n, *item)) * np.exp(5 * rng.normal(size=(n, *item)))
        rows[rng.random(rows.shape) < 0.2] = -0.0
        w = rng.random(n)
        start = rng.normal(size=item)
        start[rng.random(item) < 0.3] = -0.0
        loop = start.copy()
        for i in range(n):
            loop = loop + w[i] * rows[i]
        got = ordered_total(start, rows, w)
        assert np.array_equal(loop, got) and np.array_equal(np.signbit(loop), np.signbit(got))
        # a wrong order (sum of the terms first, then the start) differs somewhere
        if n == 1000:
            assert not np.array_equal(start + (w[:, None, None] * rows).sum(axis=0), got)


def _settings(shards, **kw):
    n = tuple(sh.n for sh in shards)
    base = dict(variant="alg2", T=6, loss="squared", lam=1e-2, theta_max=1e6, theta0=0.0,
                xi=0.5, clip=True, rho=1.0, L=1.0, avg_kind="polynomial", eta=3.0, seed=3,
                run_ids=(0, 4), record_every=1000, aggregate="gather",
                eps=tuple(1.0 + 0.1 * i for i in range(len(n))), n=n, p=6)
    base.update(kw)
    return sync_star.Settings(**base)


def _contract(s):
    return Contract.planned(rules.BasicSplit(), "laplace", s.T, s.eps, seed=s.seed,
                            run_ids=s.run_ids)


@pytest.mark.parametrize("eps_inf", [False, True])
def test_owner_block_answers_as_each_owner_alone(eps_inf):
    """Answers, noise, clipped counts and ledgers of the block equal those of one DataOwner per
    agent over T queries; query T + 1 is refused by both."""
    shards = [sh for sh in _shards("squared", seed=3) if sh.n and not sp.issparse(sh.X)]
    eps = tuple(math.inf if eps_inf and i % 2 else 1.0 + 0.1 * i for i in range(len(shards)))
    shards = [LocalShard(i, sh.X, sh.y) for i, sh in enumerate(shards)]
    s = _settings(shards, eps=eps)
    con = _contract(s)
    block = sync_star.OwnerBlock(shards, s, con)
    alone = [sync_star.DataOwner(sh, sync_star.owner_release(con, sh.agent, s), s)
             for sh in shards]
    rng = np.random.default_rng(7)
    for _ in range(s.T):
        theta = rng.normal(size=(2, 6))
        got = block.answer(theta)
        for j, o in enumerate(alone):
            assert np.array_equal(got[j], o.answer(theta)), j
            assert np.array_equal(block.last_clipped[j], o.last_clipped), j
    for a, b in zip(block.ledgers, [o.ledger for o in alone], strict=True):
        assert repr(a) == repr(b)
        assert np.array_equal(a.releases, b.releases)
        assert np.array_equal(a.spent_eps, b.spent_eps)
        assert [(e.key(), c.tolist()) for e, c in a.event_counts()] == \
            [(e.key(), c.tolist()) for e, c in b.event_counts()]
    with pytest.raises(BudgetExceededError, match="owner 0 refuses query 7"):
        block.answer(theta)
    with pytest.raises(BudgetExceededError, match="owner 0 refuses query 7"):
        alone[0].answer(theta)


def test_owner_block_checkpoint_views_restore_each_owner(tmp_path):
    """A block restored from its owners' states continues bit for bit (noise, ledgers)."""
    shards = [LocalShard(i, sh.X, sh.y) for i, sh in
              enumerate(s for s in _shards("squared", seed=6) if s.n and not sp.issparse(s.X))]
    s = _settings(shards)
    a, b = sync_star.OwnerBlock(shards, s, _contract(s)), sync_star.OwnerBlock(shards, s,
                                                                               _contract(s))
    theta = np.full((2, 6), 0.1)
    for _ in range(3):
        a.answer(theta)
    states = pickle.loads(pickle.dumps([(o.agent, o.state()) for o in a.owners()]))
    views = b.owners()
    for o, (agent, st) in zip(views, states, strict=True):
        assert o.agent == agent
        o.restore(st)
    b.restored_ledgers()
    for _ in range(3):
        assert np.array_equal(a.answer(theta), b.answer(theta))
    assert [repr(x) for x in a.ledgers] == [repr(x) for x in b.ledgers]


@pytest.fixture(scope="module")
def unequal_1000(tmp_path_factory):
    """1,000 owners of unequal sizes (1 to 60 records), regression with public records."""
    from mpi_dp.data.synth import write_synth

    sizes = [int(v) for v in np.random.default_rng(0).integers(1, 61, size=1000)]
    path = tmp_path_factory.mktemp("unequal") / "u1000.h5"
    return write_synth(path, "regression", 1000, sizes, 5, 0.5, 3, public=500)


def test_sync_star_1000_unequal_owners_bitwise_on_1_2_3_4_ranks(tmp_path, unequal_1000):
    job = write_job(tmp_path / "u.toml", unequal_1000, runs=2, T=8, record_every=4,
                    xi=2.0, reference={"isolated": 16})
    results = assert_rank_invariant(job, tmp_path, ranks=(1, 2, 3, 4))
    assert "configs/000/models/final" in results[0] or "models/final" in results[0]


def test_large_groups_are_processed_in_chunks_with_the_same_bits():
    """300 agents of 50 records and 257 models run in several agent chunks (bounded memory):
    each agent still gets exactly its own result."""
    rng = np.random.default_rng(9)
    shards = [LocalShard(i, rng.normal(size=(50, 4)), np.where(rng.random(50) < .5, -1.0, 1.0))
              for i in range(300)]
    block = AgentBlock(shards)
    T = rng.normal(size=(257, 4))
    L, E = block.loss_sums("logistic", T), block.error_counts(T)
    g, c = block.clipped_grad_sums("logistic", T[:40], 0.2, False)
    for j in (0, 17, 150, 299):
        sh = shards[j]
        assert np.array_equal(L[j], linear.loss_sum("logistic", sh.X, sh.y, T))
        assert np.array_equal(E[j], error_counts(sh.X, sh.y, T))
        g1, c1 = linear.clipped_grad_sum("logistic", sh.X, sh.y, T[:40], 0.2)
        assert np.array_equal(g[j], g1) and np.array_equal(c[j], c1)


def test_block_squared_statistics_are_each_agent_s_own():
    shards = _shards("squared", seed=11)
    stats = AgentBlock(shards).gram_stats()
    p = 6
    for j, sh in enumerate(shards):
        if not sh.n:
            assert not stats[j].any()
            continue
        st = linear.squared_stats(sh.X, sh.y)
        assert np.array_equal(stats[j, : p * p], st.gram.reshape(-1)), j
        assert np.array_equal(stats[j, p * p : p * p + p], st.xty), j
        assert stats[j, -1] == float(sh.y @ sh.y), j
