"""Mailboxes (one RMA window per rank) under mpiexec (pytest-mpi, run on 1, 2 and 4 ranks by
`make test`): slots land where the public layout says, reads are never torn, free is collective."""

from __future__ import annotations

import contextlib
import time

import numpy as np
import pytest
import scipy.sparse as sp
from mpi4py import MPI

from mpi_dp.comm import rma

pytestmark = pytest.mark.mpi


def _graph(n: int, extra: float, seed: int) -> sp.csr_matrix:
    """Ring (connected) plus random chords; symmetric, zero diagonal, sorted indices."""
    rng = np.random.default_rng(seed)
    A = np.triu(rng.random((n, n)) < extra, 1)
    idx = np.arange(n)
    A[np.minimum(idx, (idx + 1) % n), np.maximum(idx, (idx + 1) % n)] = True
    A = A | A.T
    np.fill_diagonal(A, False)
    W = sp.csr_matrix(A.astype(float))
    W.sort_indices()
    return W


def _nbrs(W: sp.csr_matrix, i: int) -> np.ndarray:
    return W.indices[W.indptr[i]:W.indptr[i + 1]]


def _payload(j: int, item: int) -> np.ndarray:
    return j + 1e-3 * np.arange(item) + 0.5


def _silent(j: int) -> bool:
    return j % 5 == 3  # these agents never post


@pytest.mark.parametrize("n,epoch", [(13, "locks"), (20, "locks"), (20, "rounds")])
def test_slots_hold_neighbour_payloads_in_id_order(n, epoch):
    """Posts land in the neighbours' slots, with a lock per post or inside `rounds()` (one
    Lock_all epoch, Put + Flush, visible to reads after the barrier)."""
    comm = MPI.COMM_WORLD
    W, item = _graph(n, 0.25, n), 5
    bad = 0
    with rma.Mailboxes(comm, W, item) as mb, (
            mb.rounds() if epoch == "rounds" else contextlib.nullcontext()):
        assert np.array_equal(mb.agents, np.arange(mb.starts[comm.rank], mb.starts[comm.rank + 1]))
        # displacements received over the neighbour exchange = the public layout
        pairs = [(int(j), int(i)) for j in mb.agents for i in _nbrs(W, int(j))]
        for e, (j, i) in enumerate(pairs):
            bad += mb.received_disps[e] != rma.slot_disp(W, mb.starts, i, j, item)
        for j in mb.agents:
            if not _silent(int(j)):
                mb.post(int(j), j * 1000 + 1, _payload(int(j), item))
        comm.Barrier()
        for i in mb.agents:
            nb = _nbrs(W, int(i))
            assert mb.degree(int(i)) == len(nb)
            out = np.full((len(nb), item), np.nan)
            stamps, models = mb.read(int(i), out_models=out)
            assert models is out
            for k, j in enumerate(nb):
                if _silent(int(j)):
                    bad += stamps[k] != -1 or np.any(models[k] != 0)
                else:
                    bad += stamps[k] != j * 1000 + 1 or not np.array_equal(models[k],
                                                                           _payload(int(j), item))
    assert comm.allreduce(bad) == 0


def _star(n: int) -> sp.csr_matrix:
    """Agent 0 joined to every other agent, plus a ring over 1..n-1."""
    A = np.zeros((n, n), dtype=bool)
    A[0, 1:] = True
    for a in range(1, n):
        A[a, 1 + a % (n - 1)] = True
    A = A | A.T
    np.fill_diagonal(A, False)
    return sp.csr_matrix(A.astype(float))


def _consistent(nb: np.ndarray, stamps: np.ndarray, models: np.ndarray) -> int:
    """Slots whose payload is not the one their stamp implies (torn, or plain wrong)."""
    bad = 0
    for k, j in enumerate(nb):
        want = 0.0 if stamps[k] == -1 else j * 1e6 + stamps[k]
        bad += not np.all(models[k] == want)
    return bad


def test_reads_are_never_torn():
    comm = MPI.COMM_WORLD
    n, item, S = 4 * comm.size + 12, 4096, 150
    W = _star(n)
    bad = reads = seen = 0
    with rma.Mailboxes(comm, W, item) as mb:
        assert mb.agents[0] == 0 or comm.rank != 0
        mine = [int(a) for a in mb.agents]
        writers = [a for a in mine if a != 0]
        nbs = {i: _nbrs(W, i) for i in mine}
        out = {i: np.empty((len(nbs[i]), item)) for i in mine}
        vec = np.empty(item)
        for s in range(1, S + 1):
            for j in writers:
                vec.fill(j * 1e6 + s)
                mb.post(j, float(s), vec)
            for i in mine:  # every rank reads its own mailboxes while the others write
                stamps, models = mb.read(i, out[i])
                bad += _consistent(nbs[i], stamps, models)
                reads += 1
        if comm.rank == 0:  # keep reading agent 0's mailbox until every writer is done
            for _ in range(20000):
                stamps, models = mb.read(0, out[0])
                bad += _consistent(nbs[0], stamps, models)
                reads += 1
                seen += int(np.sum((stamps > 0) & (stamps < S)))
                if np.all(stamps == S):
                    break
                mb.poll()
        polite = MPI.COMM_WORLD.Ibarrier()  # done writing: wait without spinning
        while not polite.Test():
            mb.poll()
            time.sleep(1e-3)
        for i in mine:  # everything has landed: the last stamp everywhere
            stamps, models = mb.read(i, out[i])
            bad += _consistent(nbs[i], stamps, models)
            bad += int(np.sum(stamps != S * (nbs[i] != 0) - (nbs[i] == 0)))
    assert comm.allreduce(bad) == 0
    assert comm.allreduce(reads) >= S * n


def test_free_context_manager_and_put_count():
    comm = MPI.COMM_WORLD
    W, item = _graph(17, 0.2, 3), 3
    posted = 0
    with rma.Mailboxes(comm, W, item) as mb:
        for rep in range(3):
            for j in mb.agents[::2]:
                mb.post(int(j), rep, np.zeros(item))
                posted += mb.degree(int(j))
        assert mb.puts == posted
        mb.poll()
    assert mb.win is None
    mb.free()  # idempotent
    assert comm.allreduce(mb.puts) == comm.allreduce(posted)
    # an exception inside the block leaves the window alone (the CLI aborts instead)
    with pytest.raises(KeyError):
        with rma.Mailboxes(comm, W, item, progress="sleep") as mb2:
            raise KeyError("boom")
    assert mb2.win is not None
    mb2.free()
    assert mb2.win is None


@pytest.mark.parametrize("progress", rma.PROGRESS)
def test_every_progress_mode_polls(progress):
    comm = MPI.COMM_WORLD
    with rma.Mailboxes(comm, _graph(9, 0.3, 1), 2, progress=progress) as mb:
        for j in mb.agents:
            mb.post(int(j), 7.0, np.ones(2))
            mb.poll()
        comm.Barrier()
        stamps, _ = mb.read(int(mb.agents[0]))
        assert np.all(stamps == 7.0)


@pytest.mark.parametrize("locked", [False, True])
def test_raw_put_rate_is_collective(locked):
    comm = MPI.COMM_WORLD
    rate = rma.raw_put_rate(comm, 10, 200, locked=locked)
    assert rate > 0
    assert comm.allgather(rate) == [rate] * comm.size


@pytest.mark.parametrize("side", ["row", "column"])
def test_an_asymmetric_graph_is_refused_on_every_rank(side):
    """Each rank checks only its own rows' transposes (no transpose of the whole graph): a
    one-way entry in the last rank's rows (or pointing into them) is refused on every rank."""
    comm = MPI.COMM_WORLD
    W = _graph(13, 0.2, 4).tolil()
    a, b = (12, 1) if side == "row" else (1, 12)  # agent 12 sits on the last rank
    W[a, b] = 0.0 if W[a, b] else 1.0  # one direction changed only
    W = W.tocsr()
    W.eliminate_zeros()
    W.sort_indices()
    with pytest.raises(ValueError, match="symmetric"):
        rma.Mailboxes(comm, W, 2)
    with rma.Mailboxes(comm, _graph(13, 0.2, 4), 2) as mb:  # and the ranks still agree after
        assert comm.allreduce(mb.degree(int(mb.agents[0])) if len(mb.agents) else 0) > 0


def test_a_post_fills_every_slot_of_a_dense_row():
    """One Put per target rank scatters the same [stamp, vector] into all of a high-degree
    agent's slots there (an indexed datatype), equal to one Put per slot."""
    comm = MPI.COMM_WORLD
    n, item = 40, 3
    A = np.ones((n, n)) - np.eye(n)  # complete graph: every agent a neighbour everywhere
    W = sp.csr_matrix(A)
    with rma.Mailboxes(comm, W, item) as mb, mb.rounds():
        for j in mb.agents:
            mb.post(int(j), float(j) + 0.5, _payload(int(j), item))
        comm.Barrier()
        for i in mb.agents:
            stamps, models = mb.read(int(i))
            nb = _nbrs(W, int(i))
            assert stamps.tolist() == [float(j) + 0.5 for j in nb]
            assert np.array_equal(models, np.stack([_payload(int(j), item) for j in nb]))
        assert comm.allreduce(mb.puts) == n * (n - 1)
