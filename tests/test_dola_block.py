"""DOLA with a rank's agents as one block (issue 29): every per-round step is array work over
the hosted agents, and an agent's bits do not depend on which other agents share its block.

Serial: blocks of several layouts advance in lockstep in one process (a fake net copying the
ghosts' releases between them), and must give every agent the bits of one block of all agents;
the block's noise must be each agent's own stream; a checkpoint taken mid-chunk must resume to
the same bits. MPI rank invariance is checked in test_mpi_dola.py.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import scipy.sparse as sp
from dola_case import Case, contract

from mpi_dp import rng
from mpi_dp.algorithms import dola
from mpi_dp.comm import topology as tp
from mpi_dp.data.synth import synth_online
from mpi_dp.privacy import noise_streams, rules
from mpi_dp.privacy.contract import Contract
from mpi_dp.privacy.noise_streams import RoundNoise


def _data(m: int, records: int, n: int, seed: int = 0) -> list:
    return synth_online(m, records, n, 0.05, seed, test=50)["agents"]


def _reader(agents: list):
    return lambda a, s, e: (agents[a][0][s:e], agents[a][1][s:e])


def _settings(m: int, T: int, n: int, **kw) -> Case:
    base = dict(variant="laplace", T=T, h=1, n_features=n, m=m, eps=(1.0,) * m, lam=0.1,
                radius=1 / math.sqrt(0.1), step="strong", seed=3, run_ids=(0, 2, 5),
                exact_regret=False)
    base.update(kw)
    return Case(**base)


def _round_noise(agents: np.ndarray, runs: tuple[int, ...], seed: int, n: int, kind: str,
                 T: int) -> RoundNoise:
    """The round noise of a block of `agents` as its release path gives it (a contract of
    owners 0..max(agents), each releasing T times)."""
    con = Contract.planned(rules.PerRelease(), "gaussian" if kind == "normal" else "laplace", T,
                           [1.0] * (int(max(agents)) + 1), seed=seed, run_ids=runs)
    return con.block([int(a) for a in agents]).round_noise(n, kind, rounds=T)


# -- the block's noise is every agent's own stream ------------------------------------------------
@pytest.mark.parametrize("kind", ["laplace", "normal"])
def test_block_noise_is_each_agents_own_stream(kind, monkeypatch):
    """Row (a, r) of every round's draw equals what run_streams(seed, 'noise', agent, runs)
    draws alone, for any block of agents and any chunking (the cap on the block's buffer);
    sums over a round's draws (noise_l1) add them in the order of the agent's own (R, n)."""
    # 40 agents x 3 runs: small chunks take pcg's row-parallel path, large ones its per-row one
    agents, runs, n, T = np.r_[0, 3, 4, 11, 12, 20:90:2], (0, 2, 5), 10, 9
    draw = "laplace" if kind == "laplace" else "standard_normal"
    ref = {int(a): getattr(rng.run_streams(7, "noise", int(a), runs), draw)(T * n)
           .reshape(len(runs), T, n) for a in agents}
    for cap in (noise_streams.NOISE_BLOCK_DOUBLES, 2 * len(runs) * n * len(agents), 1):
        monkeypatch.setattr(noise_streams, "NOISE_BLOCK_DOUBLES", cap)
        for block in (agents, agents[1:3], agents[::-1]):
            noise = _round_noise(block, runs, 7, n, kind, T)
            rounds = [noise.next() for _ in range(T)]
            l1 = np.stack([np.abs(2.5 * z).sum(axis=2) for z in rounds], axis=2)
            got = np.stack([z.copy() for z in rounds], axis=2)
            for i, a in enumerate(block):
                assert np.array_equal(got[i], ref[int(a)])
                own = np.abs(2.5 * ref[int(a)]).sum(axis=2)
                assert np.array_equal(l1[i], own)


def test_block_noise_positions_resume_mid_chunk():
    """positions() after j rounds of a chunk, seeked by a fresh round noise, continues the same
    draws; each agent's position is the one its own stream reaches after j rounds."""
    agents, runs, n, T = np.arange(6), (1, 4), 3, 12
    a = _round_noise(agents, runs, 5, n, "laplace", T)
    for _ in range(4):
        a.next()
    pos = a.positions()
    rest = [a.next().copy() for _ in range(T - 4)]
    for i, p in enumerate(pos):
        own = rng.run_streams(5, "noise", i, runs)
        own.laplace(4 * n)
        h, lo = own.position()
        assert np.array_equal(p[0], h) and np.array_equal(p[1], lo)
    b = _round_noise(agents, runs, 5, n, "laplace", T)
    b.seek(pos, T - 4)
    for want in rest:
        assert np.array_equal(b.next(), want)


# -- the records of a chunk, read as one block ----------------------------------------------------
@pytest.mark.parametrize("sparse", [False, True])
def test_read_block_stacks_agents_and_prefers_a_block_reader(sparse):
    """read_block stacks every agent's records agent-major (dense (k, c, n), CSR (k c, n)), and
    a reader offering read_many(agents, start, stop) is asked once for the whole block."""
    data = _data(5, 12, 4)
    if sparse:
        data = [(sp.csr_matrix(np.where(np.abs(X) > 0.2, X, 0.0)), y) for X, y in data]
    read = _reader(data)
    agents = np.array([1, 2, 4])
    X, y = dola.read_block(read, agents, 3, 7, 4)
    dense = X.toarray().reshape(3, 4, 4) if sparse else X
    for i, a in enumerate(agents):
        Xa = data[a][0][3:7]
        assert np.array_equal(dense[i], Xa.toarray() if sparse else Xa)
        assert np.array_equal(y[i], data[a][1][3:7])
    calls = []

    class BlockReader:
        def __call__(self, a, s, e):
            raise AssertionError("read agent by agent")

        def read_many(self, ids, s, e):
            calls.append((tuple(int(a) for a in ids), s, e))
            return [read(int(a), s, e) for a in ids]

    X2, y2 = dola.read_block(BlockReader(), agents, 3, 7, 4)
    assert calls == [((1, 2, 4), 3, 7)]
    assert (X2 != X).nnz == 0 if sparse else np.array_equal(X2, X)
    assert np.array_equal(y2, y)


# -- an agent's bits do not depend on its block ---------------------------------------------------
class _LockstepNet:
    """One block of a layout run in one process: its ghosts' rows are copied from `shared`
    (every agent's release of the previous round), as the MPI exchange delivers them."""

    def __init__(self, graph: tp.Graph, agents: np.ndarray, shared: dict) -> None:
        self.agents = np.asarray(agents, dtype=np.int64)
        self.tracked = tp.tracked_edges(graph, self.agents, False)
        ends = self.tracked.ravel()
        self.ghosts = np.setdiff1d(ends, self.agents)
        self.shared = shared
        self.is_root = True

    def exchange(self, t: int, pub: np.ndarray, active: np.ndarray) -> None:
        k = len(self.agents)
        for i, g in enumerate(self.ghosts):
            pub[k + i] = self.shared[int(g)]


def _run_layout(s: Case, graph: tp.Graph, data: list, cuts: list[int]) -> dict:
    """Every agent's final (Pub, W, Hsum, cum, noise_l1) with the agents split at `cuts`."""
    shared: dict = {a: np.zeros((s.runs, s.n_features)) for a in range(s.m)}
    blocks = []
    for lo, hi in zip([0, *cuts], [*cuts, s.m], strict=True):
        net = _LockstepNet(graph, np.arange(lo, hi), shared)
        blocks.append(dola.Block(s, contract(s), graph, net,
                                 dola.Stream(net.agents, s.h, s.T, s.n_features, _reader(data),
                                             chunk_records=7)))
    for _ in range(s.T):
        for b in blocks:
            b.round()
        for b in blocks:
            for i, a in enumerate(b.agents):
                shared[int(a)] = b.Pub[i].copy()
    out = {}
    for b in blocks:
        for i, a in enumerate(b.agents):
            out[int(a)] = (b.Pub[i], b.W[i], b.Hsum[i], b.cum[:, i], b.noise_l1[i],
                           b.last_active_deg[i], b.last_a_self[i])
    return out


@pytest.mark.parametrize("variant, extra", [
    ("laplace", {}), ("minibatch", {"h": 3}), ("sparse", {"rho": 0.05, "step": "convex"}),
    ("gaussian", {}), ("gaussian", {"eps": (0.5, 1.0, 2.0, 0.5, 1.0, math.inf, 2.0, 1.0, 0.5,
                                             1.0, 2.0)})])
def test_an_agents_bits_do_not_depend_on_its_block(variant, extra):
    """One block of all m agents, and the same agents split into 2 or 4 blocks (ghost rows
    exchanged between them): every agent's releases, iterates, losses and noise are bitwise
    the same (its arithmetic reads only its own records, streams and neighbours)."""
    m, n, T = 11, 5, 14
    s = _settings(m, T, n, variant=variant, **extra)
    data = _data(m, T * s.h, n, seed=2)
    graph = tp.make_graph("medium", m, 4)
    whole = _run_layout(s, graph, data, [])
    for cuts in ([5], [1, 4, 8]):
        split = _run_layout(s, graph, data, cuts)
        for a in range(m):
            for x, y in zip(whole[a], split[a], strict=True):
                assert np.array_equal(x, y), (variant, cuts, a)


def test_a_checkpoint_mid_noise_chunk_resumes_bit_for_bit():
    """state() after round 5 (the noise buffer part-consumed, records part-read), restored
    into a fresh block: the rest of the run gives the uninterrupted run's bits."""
    m, n, T = 7, 4, 12
    s = _settings(m, T, n, run_ids=(0, 1))
    data = _data(m, T, n, seed=3)
    graph = tp.make_graph("ring", m, 1)

    def block() -> dola.Block:
        net = dola.LocalNet(graph)
        return dola.Block(s, contract(s), graph, net,
                          dola.Stream(net.agents, 1, T, n, _reader(data), chunk_records=4))

    ref = block()
    dola.drive(ref, None)
    first = block()
    for _ in range(5):
        first.round()
    saved = first.state()
    again = block()
    assert again.restore(saved) == 5
    dola.drive(again, None)
    for name in ("Pub", "W", "Hsum", "cum", "noise_l1"):
        assert np.array_equal(getattr(again, name), getattr(ref, name)), name


@pytest.mark.parametrize("pool", [False, True])
def test_pooled_reader_reads_a_block_as_agent_by_agent(tmp_path, pool):
    """PooledReader.read_many (one block read of the owners' prefixes, the cache first) gives
    every agent the bits `read(agent, start, stop)` gives it alone, pooled owners included."""
    from mpi_dp.data import ShardFile
    from mpi_dp.data.synth import write_synth
    from mpi_dp.methods.dola import PooledReader, owner_groups

    path = write_synth(tmp_path / "on.h5", "online", 12, 20, 4, 0.05, 3, public=50)
    shard = ShardFile(path)
    m = 4 if pool else 12
    groups = owner_groups(12, m, pool)
    sizes = shard.sizes(range(12))
    ids = list(range(1, m))
    for start, stop in ((0, 7), (0, 20), (3, 9)):
        alone = [PooledReader(shard, groups, sizes)(a, start, stop) for a in ids]
        cached = {ids[0]: PooledReader(shard, groups, sizes)(ids[0], 0, stop)}
        block = PooledReader(shard, groups, sizes, cached).read_many(ids, start, stop)
        for (Xa, ya), (Xb, yb) in zip(alone, block, strict=True):
            assert np.array_equal(Xa, Xb) and np.array_equal(ya, yb)
            assert Xa.dtype == Xb.dtype and ya.dtype == yb.dtype
