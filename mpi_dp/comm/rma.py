"""Per-agent mailboxes in one passive-target MPI window per rank (spec §6 "Windows").

Agents are logical, ranks physical: rank r hosts agents starts[r]..starts[r+1]-1. The agent graph
is public (a symmetric CSR matrix W, zero diagonal, sorted indices). Rank r's window holds, for
every local agent i and every neighbour j of i (ascending id), a slot [stamp, payload (item
doubles)]; i's slots are contiguous, so they sit in CSR order: slot (i, j) is CSR entry e of W and
lies at displacement (e - indptr[starts[r]]) * (1 + item) doubles (`slot_disp`). Stamps start at
-1 (nothing received).

- Write (`post`): agent j's owner, for each rank q hosting neighbours of j, takes
  `Lock(EXCLUSIVE, q)`, `Put`s [stamp, payload] into every slot (i, j) on q, `Unlock(q)`.
  Neighbours on the same rank take the same path with q = self.
- Read (`read`): `Lock(SHARED, self)`, copy agent i's slots out, `Unlock`. The writer's exclusive
  lock and the reader's shared lock exclude each other, so no read is torn (a stamp always comes
  with the payload of the same write).
- Rounds (`rounds()`, replay mode): when barriers already separate every read from every
  conflicting write, one `Lock_all` epoch spans the run, `post` is Put + Flush per target rank and
  `read` is Sync + copy: no per-post lock hand-shake (4 ranks on 2 cores: 2x the replay rate).

Set-up is collective: a dist graph over the ranks that host a neighbour of a local agent (weights:
the number of (local agent, neighbour there) pairs; self is a neighbour only when some edge joins
two local agents, so the self slots travel the same exchange as the others), then one
`Neighbor_alltoall` of counts and one `Neighbor_alltoallv` of int64 slot displacements: every
window owner tells each writer where its slots are. Each writer checks them against
`slot_disp` (the layout is public) and keeps, per local agent, [(rank, displacements)], so `post`
searches nothing.

Progress. With this MPICH (5.0.2 wheel, ch4) a window's Lock, shared or exclusive, is granted
by the target's progress engine: a writer waits until the target rank makes an MPI call (a target
asleep for 2 s held a writer in `Lock` for 2 s). The Puts themselves go through shared memory.
So a rank must drive progress while idle, and `poll()` is that hook (`progress=`):
"none" (nothing), "iprobe" (Iprobe on the dist graph), "flush" (Lock(SHARED, self), Win_flush_all,
Unlock: the RMA path), "sleep" (nap NAP_S), "nap" (Iprobe, then nap). benchmarks/rma_progress.py,
2-core machine shared with another job, 64 agents/rank, degree 10, item 10, ~50 us numpy per
wake-up, read/compute/post then poll(); "idle" = 300 us polled after each wake-up (a paced clock);
aggregate wake-ups/s, median of 3 interleaved blocks (raw Lock_all/Put/Flush: 0.39-0.45 M/s):

    ranks  idle us   none  iprobe  flush  sleep   nap  | MPICH_ASYNC_PROGRESS=1
      2       0     10175   9361   8776   4127   4191  |   32
      2     300      1151   1693   3748   2325   2414  |   32
      8       0      4406   4143   4168   3605   3635  |   22
      8     300      1211   1254   3832   3157   3257  |   21

"flush" is the default: busy ranks lose at most 14% to "none" (2 ranks) and it has the shortest
stalls (8 ranks: longest post 9.6 ms against 24 ms for "none"); idle ranks using it serve lock
requests 2-3x faster than with any other mode (Iprobe does not poll the RMA path). Asynchronous
progress threads are ruinous on oversubscribed cores (and slow even on 2 ranks). Relaunching with
MPIR_CVAR_CH4_PROGRESS_THROTTLE=1 changed nothing beyond noise. Across nodes, where the Puts also
need the target, poll at least as often.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar, cast

import numpy as np
import scipy.sparse as sp
from mpi4py import MPI

from .agree import collective
from .graph_exchange import block_starts

T_ = TypeVar("T_")

PROGRESS = ("none", "iprobe", "flush", "sleep", "nap")
DEFAULT_PROGRESS = "flush"
#: seconds one poll() naps in progress="sleep" or "nap", and the nap of the polite wait in free()
NAP_S = 1e-4


def allocate_window(nbytes: int, comm: MPI.Comm) -> MPI.Win:
    """MPI.Win.Allocate with 8-byte displacement units (a seam for tests)."""
    return MPI.Win.Allocate(max(8, nbytes), 8, comm=cast(MPI.Intracomm, comm))


def slot_disp(W: sp.csr_matrix, starts: np.ndarray, i: int, j: int, item: int) -> int:
    """Displacement (doubles) of slot (i, j) in the window of the rank hosting agent i."""
    q = int(np.searchsorted(starts, i, side="right")) - 1
    row = W.indices[W.indptr[i]:W.indptr[i + 1]]
    k = int(np.searchsorted(row, j))
    if k >= len(row) or row[k] != j:
        raise ValueError(f"agents {i} and {j} are not neighbours")
    return int(W.indptr[i] + k - W.indptr[starts[q]]) * (1 + item)


def polite_barrier(comm: MPI.Comm, nap: float = NAP_S) -> None:
    """Barrier that naps while waiting (MPICH busy-polls in Barrier; oversubscribed cores need
    the CPU for the ranks still working). Each Test also serves pending lock requests."""
    req = comm.Ibarrier()
    while not req.Test():
        time.sleep(nap)


def on_root(comm: MPI.Comm, fn: Callable[[], T_]) -> T_ | None:
    """fn() on rank 0 (None elsewhere), collective: its user errors are raised on every rank
    (comm.agree.collective), and the other ranks wait in `polite_barrier` instead of spinning in
    MPI while rank 0 works (they share oversubscribed cores with it)."""

    def work() -> T_ | None:
        try:
            return fn() if comm.Get_rank() == 0 else None
        finally:
            polite_barrier(comm)

    return collective(comm, work)


def bcast_csr(comm: MPI.Comm, W: sp.csr_matrix | None, root: int = 0) -> sp.csr_matrix:
    """Rank root's CSR matrix on every rank: three buffer broadcasts (no pickling of the arrays)."""
    meta = comm.bcast(None if W is None else (W.shape, W.nnz, W.indptr.dtype.str,
                                              W.indices.dtype.str, W.data.dtype.str,
                                              bool(W.has_sorted_indices)), root=root)
    shape, nnz, ip, ix, dt, srt = meta
    if comm.Get_rank() == root:
        assert W is not None
        indptr, indices, data = (np.ascontiguousarray(W.indptr), np.ascontiguousarray(W.indices),
                                 np.ascontiguousarray(W.data))
    else:
        indptr, indices, data = (np.empty(shape[0] + 1, ip), np.empty(nnz, ix), np.empty(nnz, dt))
    for a in (indptr, indices, data):
        comm.Bcast(a, root=root)
    if comm.Get_rank() == root:
        return W
    out = sp.csr_matrix((data, indices, indptr), shape=shape)
    out.has_sorted_indices = srt
    return out


class Mailboxes:
    """Context manager. Collective over comm (construction, `free`, `__exit__`)."""

    def __init__(self, comm: MPI.Comm, W: sp.csr_matrix, item: int, starts: np.ndarray | None = None,
                 progress: str = DEFAULT_PROGRESS) -> None:
        if progress not in PROGRESS:
            raise ValueError(f"progress must be one of {PROGRESS}, got {progress!r}")
        if not (sp.issparse(W) and W.format == "csr" and W.has_sorted_indices):
            W = sp.csr_matrix(W, copy=True)  # sorted below: never the caller's matrix
            W.sort_indices()
        n = W.shape[0]
        if W.shape != (n, n):
            raise ValueError(f"W must be square, got {W.shape}")
        self.comm, self.item, self.progress = comm, int(item), progress
        self.rank, self.size = comm.Get_rank(), comm.Get_size()
        self.starts = block_starts(n, self.size) if starts is None else np.asarray(starts, np.int64)
        if len(self.starts) != self.size + 1 or self.starts[0] != 0 or self.starts[-1] != n \
                or np.any(np.diff(self.starts) < 0):
            raise ValueError(f"starts must split 0..{n} into {self.size} blocks, got {self.starts}")
        self.width = 1 + self.item
        lo, hi = int(self.starts[self.rank]), int(self.starts[self.rank + 1])
        self._lo = lo
        self.agents = np.arange(lo, hi, dtype=np.int64)
        indptr = W.indptr.astype(np.int64)
        e0, e1 = int(indptr[lo]), int(indptr[hi])
        # twin[e - e0]: position in W of the transpose of my entry e (symmetric W: the same
        # pattern; every rank checks its rows, all ranks agree before the first set-up message)
        twin, ok = _local_twins(W, indptr, lo, hi)
        if not comm.allreduce(ok, op=MPI.LAND):
            raise ValueError("W must be symmetric (the same pattern as its transpose)")
        self._first = indptr[lo:hi + 1] - e0  # slots of local agent i: _first[i-lo]:_first[i-lo+1]
        n_slots = e1 - e0
        owner = np.repeat(np.arange(self.size), np.diff(self.starts))
        rows = np.repeat(self.agents, np.diff(indptr[lo:hi + 1]))  # CSR entries e0..e1-1: (row, col)
        cols = W.indices[e0:e1].astype(np.int64)
        col_owner = owner[cols]
        self.peers = np.unique(col_owner).tolist()
        weights = [int(np.sum(col_owner == q)) for q in self.peers]
        self.dgraph = cast(MPI.Intracomm, comm).Create_dist_graph_adjacent(
            self.peers, self.peers, sourceweights=weights, destweights=weights, reorder=False)
        self.win: MPI.Win | None = allocate_window(n_slots * self.width * 8, comm)
        # cast: numpy's stubs do not take mpi4py's buffer (it has the buffer protocol)
        self._mem = np.frombuffer(cast(memoryview, self.win.tomemory()),
                                  dtype=np.float64)[:n_slots * self.width] \
            .reshape(n_slots, self.width)
        self.win.Lock(self.rank, MPI.LOCK_EXCLUSIVE)
        self._mem[:, 0] = -1.0
        self._mem[:, 1:] = 0.0
        self.win.Unlock(self.rank)
        # to each peer q: displacements of my slots (i local, j on q) in (j, i) order, which is
        # the CSR order of q's rows restricted to my agents: the order in which q writes them
        send, sc = [], []
        for q in self.peers:
            sel = np.flatnonzero(col_owner == q)
            sel = sel[np.lexsort((rows[sel], cols[sel]))]
            send.append(sel * self.width)
            sc.append(len(sel))
        sendbuf = np.concatenate(send) if send else np.zeros(0, np.int64)
        sc_a = np.array(sc, dtype=np.int64)
        rc_a = np.zeros(len(self.peers), dtype=np.int64)
        self.dgraph.Neighbor_alltoall([sc_a, MPI.INT64_T], [rc_a, MPI.INT64_T])
        expect = np.array(weights, dtype=np.int64)  # symmetric W: I write as many slots as I hold
        if not np.array_equal(rc_a, expect):
            raise RuntimeError(f"mailbox set-up: peers {self.peers} announce {rc_a.tolist()} slots, "
                               f"expected {expect.tolist()} (is W symmetric and the same everywhere?)")
        recvbuf = np.zeros(int(rc_a.sum()), dtype=np.int64)
        self.dgraph.Neighbor_alltoallv([sendbuf, (sc_a, _displs(sc_a)), MPI.INT64_T],
                                       [recvbuf, (rc_a, _displs(rc_a)), MPI.INT64_T])
        # recvbuf, segment q: the displacements of slots (i on q, j local) for my CSR entries with
        # a column on q, in CSR order
        disp = np.empty(n_slots, dtype=np.int64)
        for q, start, cnt in zip(self.peers, _displs(rc_a), rc_a, strict=True):
            disp[np.flatnonzero(col_owner == q)] = recvbuf[start:start + cnt]
        # the layout is public: check what arrived
        expect_disp = (twin - indptr[self.starts[col_owner]]) * self.width
        if not np.array_equal(disp, expect_disp):
            raise RuntimeError("mailbox set-up: received slot displacements differ from the layout")
        self.received_disps = disp  # per CSR entry (j local, i): slot (i, j) on owner(i)
        # per local agent: [(rank, displacements)]; a row's columns ascend, so owners are runs
        self._targets: list[list[tuple[int, np.ndarray]]] = []
        for k in range(hi - lo):
            a, b = int(self._first[k]), int(self._first[k + 1])
            o = col_owner[a:b]
            cut = np.flatnonzero(np.diff(o)) + 1
            self._targets.append([(int(o[s]), disp[a:b][s:t])
                                  for s, t in zip(np.r_[0, cut], np.r_[cut, b - a], strict=True)])
        # per local agent, built at its first post: one indexed-block datatype per target rank
        # scattering a staged copy per slot, so a post is one Put per rank, not one per slot
        self._types: list[list[MPI.Datatype] | None] = [None] * (hi - lo)
        # per local agent: the most slots it writes on one target rank (the staged copies)
        self._most = [max((len(d) for _, d in tg), default=0) for tg in self._targets]
        self._stage = np.zeros((max(1, max(self._most, default=0)), self.width))
        self._rounds = False  # inside rounds(): one shared epoch on every rank, no locks
        self.puts = 0
        self.max_write_epoch_s = 0.0  # longest Lock..Unlock of one target rank in post()
        self.max_read_epoch_s = 0.0  # longest Lock..Unlock of read()
        comm.Barrier()  # stamps initialised everywhere before anyone posts

    def degree(self, i: int) -> int:
        k = i - self._lo
        return int(self._first[k + 1] - self._first[k])

    def target_ranks(self, j: int) -> int:
        """How many ranks (self included) a post of local agent j locks: one epoch each."""
        return len(self._targets[j - self._lo])

    def post(self, j: int, stamp: float, vec: np.ndarray) -> None:
        """Put [stamp, vec] into slot (i, j) of every neighbour i of local agent j: one Put per
        target rank, its datatype scattering the staged copies into the slots there."""
        k = j - self._lo
        targets = self._targets[k]
        types = self._types[k]
        if types is None:
            types = self._types[k] = [
                MPI.DOUBLE.Create_indexed_block(self.width, d.tolist()).Commit()
                for _, d in targets]
        most = self._most[k]
        stage = self._stage
        stage[:most, 0] = stamp
        stage[:most, 1:] = vec.reshape(-1)
        win = self.win
        assert win is not None
        for (q, disps), ttype in zip(targets, types, strict=True):
            spec = [stage, len(disps) * self.width, MPI.DOUBLE]
            t0 = time.perf_counter()
            if self._rounds:
                win.Put(spec, q, target=(0, 1, ttype))
                win.Flush(q)
            else:
                win.Lock(q, MPI.LOCK_EXCLUSIVE)
                win.Put(spec, q, target=(0, 1, ttype))
                win.Unlock(q)
            dt = time.perf_counter() - t0
            if dt > self.max_write_epoch_s:
                self.max_write_epoch_s = dt
            self.puts += len(disps)

    @contextlib.contextmanager
    def rounds(self) -> Iterator[None]:
        """Collective. For callers that separate every read from every conflicting write by a
        barrier (replay's conflict-free rounds: no agent of a round is written by another agent
        of it): one `Lock_all` epoch on every rank, `post` = Put + Flush per target rank, `read` =
        Sync + copy, no per-post lock hand-shake with the target's progress engine."""
        win = self.win
        assert win is not None
        win.Lock_all()
        self._rounds = True
        try:
            yield
        finally:
            self._rounds = False
            win.Unlock_all()

    def read(self, i: int, out_models: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(stamps (deg,), models (deg, item)) of local agent i's slots, neighbours by id."""
        k = i - self._lo
        a, b = int(self._first[k]), int(self._first[k + 1])
        models = np.empty((b - a, self.item)) if out_models is None else out_models
        stamps = np.empty(b - a)
        win = self.win
        assert win is not None
        t0 = time.perf_counter()
        if not self._rounds:
            win.Lock(self.rank, MPI.LOCK_SHARED)
        win.Sync()  # memory barrier: see the writers' completed Puts
        blk = self._mem[a:b]
        stamps[:] = blk[:, 0]
        models[...] = blk[:, 1:]
        if not self._rounds:
            win.Unlock(self.rank)
        dt = time.perf_counter() - t0
        if dt > self.max_read_epoch_s:
            self.max_read_epoch_s = dt
        return stamps, models

    def poll(self) -> None:
        """Idle hook: drive MPI progress (or yield the CPU) according to `progress`."""
        if self._rounds:
            return
        if self.progress == "iprobe":
            self.dgraph.Iprobe(MPI.ANY_SOURCE, MPI.ANY_TAG)
        elif self.progress == "flush" and self.win is not None:
            self.win.Lock(self.rank, MPI.LOCK_SHARED)
            self.win.Flush_all()
            self.win.Unlock(self.rank)
        elif self.progress == "sleep":
            time.sleep(NAP_S)
        elif self.progress == "nap":
            self.dgraph.Iprobe(MPI.ANY_SOURCE, MPI.ANY_TAG)
            time.sleep(NAP_S)

    def free(self) -> None:
        """Collective and idempotent: wait politely for every rank, then free the window."""
        if self.win is None:
            return
        polite_barrier(self.comm)
        self.win.Free()
        self.win = None
        for types in self._types:
            for t in types or ():
                t.Free()
        self._types = [None] * len(self._types)
        self._mem = np.zeros((0, self.width))
        if self.dgraph != MPI.COMM_NULL:
            self.dgraph.Free()

    def __enter__(self) -> Mailboxes:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        """Free on a normal exit only: after an exception the other ranks may never reach the
        collective free, so leave the window to MPI_Abort (the CLI aborts on errors)."""
        if exc_type is None:
            self.free()


def _row_counts(W: sp.csr_matrix, indptr: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Per row of W, how many of its entries have `mask` set (mask over W's entries)."""
    cs = np.zeros(len(mask) + 1, dtype=np.int32 if len(mask) < 2**31 else np.int64)
    np.cumsum(mask, out=cs[1:])
    return (cs[indptr[1:]] - cs[indptr[:-1]]).astype(np.int64)


def _local_twins(W: sp.csr_matrix, indptr: np.ndarray, lo: int, hi: int
                 ) -> tuple[np.ndarray, bool]:
    """For the entries of rows lo..hi-1 (CSR order; W sorted), the position in W of each one's
    transpose, and whether every one has it (row j's columns in lo..hi-1 are exactly the local
    rows i with an entry (i, j)). Work O(nnz of W) in vectorised passes and O(local entries)
    memory beyond two boolean masks, not a transpose of all of W."""
    n = W.shape[0]
    e0, e1 = int(indptr[lo]), int(indptr[hi])
    cols = W.indices[e0:e1].astype(np.int64)
    # column j of my rows: which local rows i (ascending) have an entry (i, j), and where it is
    B = sp.csr_matrix((np.arange(1, e1 - e0 + 1, dtype=np.int64), cols, indptr[lo:hi + 1] - e0),
                      shape=(hi - lo, n)).tocsc()
    B.sort_indices()
    per_col = np.diff(B.indptr)
    below = _row_counts(W, indptr, W.indices < lo)  # row j's entries left of my columns
    inside = _row_counts(W, indptr, W.indices < hi) - below
    if not np.array_equal(inside, per_col):
        return np.zeros(e1 - e0, dtype=np.int64), False
    j = np.repeat(np.arange(n, dtype=np.int64), per_col)
    rank_in = np.arange(B.nnz, dtype=np.int64) - B.indptr[j]
    twin = np.empty(e1 - e0, dtype=np.int64)
    twin[B.data - 1] = indptr[j] + below[j] + rank_in
    rows = np.repeat(np.arange(lo, hi, dtype=np.int64), np.diff(indptr[lo:hi + 1]))
    ok = bool(np.array_equal(W.indices[twin].astype(np.int64), rows)) if twin.size else True
    return twin, ok


def _displs(counts: np.ndarray) -> np.ndarray:
    return np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64) if len(counts) \
        else np.zeros(0, np.int64)


def raw_put_rate(comm: MPI.Comm, item: int, n_puts: int, locked: bool = False) -> float:
    """Puts per second, all ranks together, of 1+item doubles to rank+1 on a scratch window
    (collective; the same value on every rank): `Lock_all; (Put; Flush) x n_puts; Unlock_all`, or
    with `locked` the mailbox protocol's own floor, `(Lock(EXCLUSIVE); Put; Unlock) x n_puts`."""
    rank, size = comm.Get_rank(), comm.Get_size()
    win = allocate_window((1 + item) * 8, comm)
    buf = np.full(1 + item, float(rank))
    spec, nxt = [buf, MPI.DOUBLE], (rank + 1) % size
    comm.Barrier()
    if locked:
        t0 = time.perf_counter()
        for _ in range(n_puts):
            win.Lock(nxt, MPI.LOCK_EXCLUSIVE)
            win.Put(spec, nxt, 0)
            win.Unlock(nxt)
        dt = time.perf_counter() - t0
    else:
        win.Lock_all()
        t0 = time.perf_counter()
        for _ in range(n_puts):
            win.Put(spec, nxt, 0)
            win.Flush(nxt)
        dt = time.perf_counter() - t0
        win.Unlock_all()
    polite_barrier(comm)
    win.Free()
    return comm.allreduce(n_puts) / comm.allreduce(dt, op=MPI.MAX)
