"""Synchronous star collectives: the learner (rank 0) broadcasts, owners answer, all buffer-based.

The learner receives every owner's answer individually, in agent order (Gatherv), so it can audit
each DP answer and sum them in a fixed order: results are bitwise identical for any rank count.
"""

from __future__ import annotations

import numpy as np
from mpi4py import MPI

from .layout import Layout

ROOT = 0


class Star:
    """Collectives between the learner on rank 0 and the owners hosted on every rank."""

    def __init__(self, comm: MPI.Comm, n_agents: int) -> None:
        self.comm = comm
        self.rank = comm.Get_rank()
        self.size = comm.Get_size()
        self.layout = Layout(n_agents, self.size)
        self.local_agents = self.layout.agents_on(self.rank)
        self._counts = self.layout.counts()
        self._displs = self.layout.block_starts()[:-1]

    @property
    def is_learner(self) -> bool:
        return self.rank == ROOT

    def bcast(self, buf: np.ndarray) -> np.ndarray:
        """Broadcast a contiguous float64/int64 array from the learner, in place."""
        self.comm.Bcast(buf, root=ROOT)
        return buf

    def gather_agents(self, local: np.ndarray, item_shape: tuple[int, ...]) -> np.ndarray | None:
        """Gather per-agent arrays (n_local, *item_shape) into (n_agents, *item_shape) on rank 0.

        Returns the array (agent order) on the learner and None elsewhere.
        """
        item = int(np.prod(item_shape)) if item_shape else 1
        send = np.ascontiguousarray(local, dtype=np.float64).reshape(-1)
        if send.size != len(self.local_agents) * item:
            raise ValueError("gather_agents: local array does not match the hosted agents")
        recv = None
        if self.is_learner:
            recv = np.empty((self.layout.n_agents,) + tuple(item_shape), dtype=np.float64)
            spec = [recv.reshape(-1), (self._counts * item, self._displs * item), MPI.DOUBLE]
        else:
            spec = None
        self.comm.Gatherv([send, MPI.DOUBLE], spec, root=ROOT)
        return recv

    def reduce_sum(self, local_sum: np.ndarray) -> np.ndarray | None:
        """Sum of per-rank partial sums on the learner (order depends on the rank count)."""
        send = np.ascontiguousarray(local_sum, dtype=np.float64)
        recv = np.empty_like(send) if self.is_learner else None
        self.comm.Reduce(send, recv, op=MPI.SUM, root=ROOT)
        return recv

    def all_true(self, flag: bool) -> bool:
        """Whether `flag` holds on every rank (the same answer everywhere)."""
        return bool(self.comm.allreduce(int(bool(flag)), op=MPI.MIN))

    def gather_objects(self, obj):
        """Small control messages only (pickled; on one rank the object itself, unpickled:
        a rank's thousands of ledgers cost seconds to pickle for nobody)."""
        if self.comm.Get_size() == 1:
            return [obj]
        return self.comm.gather(obj, root=ROOT)

    def bcast_object(self, obj):
        return self.comm.bcast(obj, root=ROOT)
