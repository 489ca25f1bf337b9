"""Agent graphs on MPI distributed-graph topologies: agents are logical, ranks physical.

Rank r hosts a contiguous block of agents (every rank hosts some: there is no learner). The rank
graph is `Create_dist_graph_adjacent` over the ranks that host a neighbour of one of r's agents,
with the number of cut edges as weights. Only boundary vectors cross ranks; neighbours on the same
rank read each other's released vectors in memory. Three exchange modes (spec §6), buffer calls
only, no pickling per round:

- `allgather`: `Neighbor_allgatherv` of every boundary vector to every neighbour rank (inactive
  edges still carry data and get weight 0);
- `alltoallv`: `Neighbor_alltoallv` with, per neighbour rank, only the vectors some active edge
  needs this round (counts computed alike at both ends from the shared activation hash);
- `rma`: one window per rank with a slot [round stamp, vector] per ghost agent; per round a PSCW
  epoch on the neighbour group and a `Put` into each slot an active edge needs; the stamp proves
  that what is read is this round's release.
"""

from __future__ import annotations

import time
from typing import Any, cast

import numpy as np
from mpi4py import MPI

from ..errors import JobError
from . import topology

MODES = ("allgather", "alltoallv", "rma")


def allocate_window(nbytes: int, comm: MPI.Comm) -> MPI.Win:
    """MPI.Win.Allocate (a seam, so a test can stand in for an MPI without RMA)."""
    return MPI.Win.Allocate(nbytes, 8, comm=cast(MPI.Intracomm, comm))


def block_starts(m: int, n_ranks: int) -> np.ndarray:
    """First agent of every rank (length n_ranks + 1), contiguous near-equal blocks."""
    base, extra = divmod(m, n_ranks)
    sizes = np.array([base + (1 if r < extra else 0) for r in range(n_ranks)], dtype=np.int64)
    return np.concatenate([[0], np.cumsum(sizes)])


class GraphNet:
    """The `Net` of algorithms.dola for the block of agents this rank hosts (collective setup)."""

    def __init__(self, comm: MPI.Comm, graph: topology.Graph, mode: str, item_shape: tuple[int, ...],
                 two_hop: bool = False) -> None:
        if mode not in MODES:
            raise ValueError(f"exchange mode must be one of {MODES}, got {mode!r}")
        self.comm, self.graph, self.mode = comm, graph, mode
        self.rank, self.size = comm.Get_rank(), comm.Get_size()
        self.starts = block_starts(graph.m, self.size)
        self.owner_of = np.repeat(np.arange(self.size), np.diff(self.starts))
        self.agents = np.arange(self.starts[self.rank], self.starts[self.rank + 1], dtype=np.int64)
        self.is_root = self.rank == 0
        self.item = int(np.prod(item_shape))
        self.item_shape = tuple(item_shape)
        self.tracked = topology.tracked_edges(graph, self.agents, two_hop)
        # every cut edge (endpoints on different ranks) in both directions: (inside, outside)
        both = np.concatenate([graph.edges, graph.edges[:, ::-1]])
        self._cut = both[self.owner_of[both[:, 0]] != self.owner_of[both[:, 1]]]
        self._cut_rank = self.owner_of[self._cut[:, 0]]
        mine = self._cut_rank == self.rank
        self.ghosts = np.unique(self._cut[mine, 1])
        self.ghost_row = {int(g): len(self.agents) + i for i, g in enumerate(self.ghosts)}
        out_rank = self.owner_of[self._cut[:, 1]]
        self.peers = np.unique(out_rank[mine]).tolist()
        # per peer q: (my agents q needs, q's agents I need) and the cut edges between them
        self._edge_key = self.tracked[:, 0] * graph.m + self.tracked[:, 1]
        self.send_to: dict[int, np.ndarray] = {}
        self.recv_from: dict[int, np.ndarray] = {}
        self._pair_edges: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
        for q in self.peers:
            a, b = self._cut[mine & (out_rank == q)].T
            self.send_to[q], self.recv_from[q] = np.unique(a), np.unique(b)
            key = np.minimum(a, b) * graph.m + np.maximum(a, b)
            self._pair_edges[q] = (np.searchsorted(self._edge_key, key), a, b)
        # rows of the hosted agents: the boundary (agents some peer needs) first, ascending, then
        # the interior, so every boundary vector leaves from one contiguous block of Pub. Only the
        # row positions change: each agent's arithmetic (and the mix order, by neighbour id) does
        # not, and gather_agents returns agent order.
        boundary = self._boundary_of(self.rank)
        self.n_boundary = len(boundary)
        self.agents = np.concatenate([boundary, np.setdiff1d(self.agents, boundary)])
        self._block_pos = np.empty(len(self.agents), dtype=np.int64)
        self._block_pos[self.agents - self.starts[self.rank]] = np.arange(len(self.agents))
        self._agent_order = np.argsort(self.agents, kind="stable")
        w = [len(self._pair_edges[q][1]) for q in self.peers]  # cut edges to each peer
        self.dgraph = cast(MPI.Intracomm, comm).Create_dist_graph_adjacent(
            self.peers, self.peers, sourceweights=w, destweights=w, reorder=False)
        self.exchange_seconds = 0.0
        self.exchanges = 0
        self.win: MPI.Win | None = None
        if mode == "allgather":
            self._setup_allgather()
        elif mode == "alltoallv":
            self._setup_alltoallv()
        else:
            self._setup_rma()

    # -- helpers --
    def _active_sets(self, q: int, active: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(my agents q needs now, q's agents I need now): endpoints of active cut edges."""
        eid, a, b = self._pair_edges[q]
        on = active[eid]
        return np.unique(a[on]), np.unique(b[on])

    def _rows(self, ids: np.ndarray) -> np.ndarray:
        """Rows of Pub holding these agents (own block first, then ghosts)."""
        ids = np.asarray(ids, dtype=np.int64)
        lo, hi = self.starts[self.rank], self.starts[self.rank + 1]
        own = (ids >= lo) & (ids < hi)
        pos = self._block_pos[np.clip(ids - lo, 0, max(0, len(self.agents) - 1))] \
            if len(self.agents) else ids
        return np.where(own, pos, len(self.agents) + np.searchsorted(self.ghosts, ids))

    # -- allgather --
    def _setup_allgather(self) -> None:
        # the boundary is rows 0..n_boundary-1 of Pub: sent in place, no packing
        self._send_count = self.n_boundary * self.item
        # what every peer sends: the union of its boundary towards all its own peers, which I
        # compute from the (public) graph exactly as the peer does
        counts, picks, base = [], [], 0
        for q in self.peers:
            theirs = self._boundary_of(q)
            counts.append(len(theirs) * self.item)
            picks.append(base + np.searchsorted(theirs, self.recv_from[q]))
            base += len(theirs)
        self._recv_counts = np.array(counts, dtype=np.int64)
        self._recv_displs = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)
        self._recv_pick = np.concatenate(picks) if picks else np.zeros(0, dtype=np.int64)
        # the ghosts, sorted by id, are the peers' needed vectors in peer order: when every peer
        # sends exactly those, receive straight into the ghost rows of Pub
        self._recv_direct = bool(np.array_equal(self._recv_pick, np.arange(base)))
        self._recvbuf = np.zeros((0 if self._recv_direct else base, self.item))

    def _boundary_of(self, q: int) -> np.ndarray:
        """Rank q's agents with a neighbour on another rank (what q sends in allgather)."""
        return np.unique(self._cut[self._cut_rank == q, 0])

    def _exchange_allgather(self, pub: np.ndarray) -> None:
        flat = pub.reshape(pub.shape[0], self.item)
        ghosts = flat[len(self.agents):]
        recv = ghosts if self._recv_direct else self._recvbuf
        self.dgraph.Neighbor_allgatherv(
            [flat, self._send_count, MPI.DOUBLE],
            [recv, (self._recv_counts, self._recv_displs), MPI.DOUBLE])
        if not self._recv_direct:
            np.take(self._recvbuf, self._recv_pick, axis=0, out=ghosts, mode="clip")

    # -- alltoallv --
    def _setup_alltoallv(self) -> None:
        n_send = sum(len(self.send_to[q]) for q in self.peers)
        n_recv = sum(len(self.recv_from[q]) for q in self.peers)
        self._sendbuf = np.zeros((n_send, self.item))
        self._recvbuf = np.zeros((n_recv, self.item))

    def _exchange_alltoallv(self, pub: np.ndarray, active: np.ndarray) -> None:
        flat = pub.reshape(pub.shape[0], self.item)
        sc, rc, send_rows, recv_rows = [], [], [], []
        for q in self.peers:
            mine, theirs = self._active_sets(q, active)
            sc.append(len(mine) * self.item)
            rc.append(len(theirs) * self.item)
            send_rows.append(self._rows(mine))
            recv_rows.append(self._rows(theirs))
        srows = np.concatenate(send_rows) if send_rows else np.zeros(0, dtype=np.int64)
        rrows = np.concatenate(recv_rows) if recv_rows else np.zeros(0, dtype=np.int64)
        sbuf, rbuf = self._sendbuf[: len(srows)], self._recvbuf[: len(rrows)]
        np.take(flat, srows, axis=0, out=sbuf, mode="clip")
        sd = np.concatenate([[0], np.cumsum(sc)[:-1]]).astype(np.int64) if sc else np.zeros(0, int)
        rd = np.concatenate([[0], np.cumsum(rc)[:-1]]).astype(np.int64) if rc else np.zeros(0, int)
        self.dgraph.Neighbor_alltoallv([self._sendbuf, (np.array(sc, dtype=np.int64), sd),
                                        MPI.DOUBLE],
                                       [self._recvbuf, (np.array(rc, dtype=np.int64), rd),
                                        MPI.DOUBLE])
        flat[rrows] = rbuf  # the active ghosts (a subset: not a contiguous block)

    # -- rma --
    def _setup_rma(self) -> None:
        slot = 1 + self.item
        try:
            self.win = allocate_window(max(1, len(self.ghosts)) * slot * 8, self.comm)
        except (NotImplementedError, MPI.Exception) as e:
            raise JobError(f"exchange 'rma': this MPI cannot allocate an RMA window ({e}); use "
                           "exchange = 'allgather' or 'alltoallv'") from None
        # cast: numpy's stubs do not take mpi4py's buffer (it has the buffer protocol)
        self._slots = np.frombuffer(cast(memoryview, self.win.tomemory()),
                                    dtype=np.float64).reshape(-1, slot)
        self._slots[:] = -1.0
        # my slot index at each peer: my agent's position among the peer's ghosts (the peer's
        # ghosts from me are exactly send_to[q]); checked once against the peer's own count
        self._slot_of = {q: np.searchsorted(self._ghosts_of(q), self.send_to[q]).astype(np.int64)
                         for q in self.peers}
        counts = np.array([len(self.recv_from[q]) for q in self.peers], dtype=np.int64)
        theirs = np.zeros(len(self.peers), dtype=np.int64)
        if self.peers:
            self.dgraph.Neighbor_alltoall([counts, MPI.INT64_T], [theirs, MPI.INT64_T])
        expect = np.array([len(self.send_to[q]) for q in self.peers], dtype=np.int64)
        if not np.array_equal(theirs, expect):
            raise RuntimeError("rma set-up: peers disagree on the boundary (slot layout)")
        self._group = self.comm.Get_group().Incl(self.peers) if self.peers else None
        self._stage = np.zeros((sum(len(self.send_to[q]) for q in self.peers), slot))
        self.comm.Barrier()

    def _ghosts_of(self, q: int) -> np.ndarray:
        """Rank q's ghosts: neighbours of q's agents hosted on other ranks (q's slot order)."""
        return np.unique(self._cut[self._cut_rank == q, 1])

    def _exchange_rma(self, t: int, pub: np.ndarray, active: np.ndarray) -> None:
        flat = pub.reshape(pub.shape[0], self.item)
        win = self.win
        assert win is not None and self._group is not None
        win.Post(self._group)
        win.Start(self._group)
        k = 0
        expected, types = [], []
        width = 1 + self.item
        for q in self.peers:
            mine, theirs = self._active_sets(q, active)
            expected.append(theirs)
            if not len(mine):
                continue
            # the vectors q needs, staged contiguously with the round stamp, and one Put whose
            # target datatype scatters them into their slots at q
            stage = self._stage[k:k + len(mine)]
            stage[:, 0] = t
            np.take(flat, self._rows(mine), axis=0, out=stage[:, 1:], mode="clip")
            slots = self._slot_of[q][np.searchsorted(self.send_to[q], mine)]
            ttype = MPI.DOUBLE.Create_indexed_block(width, (slots * width).tolist()).Commit()
            types.append(ttype)
            win.Put([stage, MPI.DOUBLE], q, target=(0, 1, ttype))
            k += len(mine)
        win.Complete()
        win.Wait()
        for ttype in types:
            ttype.Free()
        got = np.concatenate(expected) if expected else np.zeros(0, dtype=np.int64)
        if got.size:
            idx = np.searchsorted(self.ghosts, got)
            stamps = self._slots[idx, 0]
            if np.any(stamps != t):
                bad = got[stamps != t][:3].tolist()
                raise RuntimeError(f"rma exchange: round {t}: slots of agents {bad} hold stamps "
                                   f"{stamps[stamps != t][:3].tolist()}, not this round's")
            flat[self._rows(got)] = self._slots[idx, 1:]

    # -- the Net protocol --
    def exchange(self, t: int, pub: np.ndarray, active: np.ndarray) -> None:
        if not self.peers:
            return
        t0 = time.perf_counter()
        if self.mode == "allgather":
            self._exchange_allgather(pub)
        elif self.mode == "alltoallv":
            self._exchange_alltoallv(pub, active)
        else:
            self._exchange_rma(t, pub, active)
        self.exchange_seconds += time.perf_counter() - t0
        self.exchanges += 1

    def ref_vector(self, E: np.ndarray, agent: int) -> np.ndarray:
        """The reference agent's iterate on every rank (an evaluation-only broadcast)."""
        root = int(self.owner_of[agent])
        buf = (np.ascontiguousarray(E[self._block_pos[agent - self.starts[self.rank]]])
               if root == self.rank else np.empty(E.shape[1:]))
        self.comm.Bcast(buf, root=root)
        return buf

    def allreduce_sum(self, a: np.ndarray) -> np.ndarray:
        a = np.ascontiguousarray(a, dtype=np.float64)
        out = np.empty_like(a)
        self.comm.Allreduce(a, out, op=MPI.SUM)
        return out

    def agent_sum(self, a: np.ndarray) -> np.ndarray:
        """The sum over all agents of per-agent rows (k, F), added in agent order on rank 0 and
        broadcast: bitwise the same on any rank count (an Allreduce adds per rank)."""
        g = self.gather_agents(a)
        F = np.asarray(a).shape[1]
        if self.is_root:
            assert g is not None  # gather_agents returns the rows on rank 0
            tot = g.sum(axis=0)
        else:
            tot = np.empty(F)
        self.comm.Bcast(tot, root=0)
        return tot

    def gather_agents(self, a: np.ndarray) -> np.ndarray | None:
        """Per-agent rows (k, F) of every rank (each in the rank's row order), in agent order,
        on rank 0."""
        a = np.ascontiguousarray(np.asarray(a, dtype=np.float64)[self._agent_order])
        F = a.shape[1]
        counts = np.diff(self.starts) * F
        recv = np.empty((self.graph.m, F)) if self.is_root else None
        spec = [recv, (counts, self.starts[:-1] * F), MPI.DOUBLE] if self.is_root else None
        self.comm.Gatherv([a, MPI.DOUBLE], spec, root=0)
        return recv

    def gather_objects(self, obj: Any) -> list | None:
        """`obj` of every rank on rank 0 (pickled; on one rank the object itself)."""
        if self.comm.Get_size() == 1:
            return [obj]
        return self.comm.gather(obj, root=0)

    def bcast_object(self, obj: Any) -> Any:
        """Rank 0's `obj` on every rank."""
        return self.comm.bcast(obj, root=0)

    def scatter_agents(self, per_agent: dict[int, Any] | None) -> dict[int, Any]:
        """Rank 0's objects keyed by agent id (all agents): every rank gets those of its agents
        and of its ghosts."""
        parts = None
        if self.is_root:
            assert per_agent is not None
            parts = [{a: per_agent[a] for a in np.concatenate(
                [np.arange(self.starts[q], self.starts[q + 1]), self._ghosts_of(q)]).tolist()}
                for q in range(self.size)]
        return self.comm.scatter(parts, root=0)

    def free(self) -> None:
        if self.win is not None:
            self.win.Free()
            self.win = None
        group = getattr(self, "_group", None)
        if group is not None:
            group.Free()
            self._group = None

        if self.dgraph != MPI.COMM_NULL:
            self.dgraph.Free()
