"""The agents a rank hosts as one block: their records stacked by equal record count, so a step of
every hosted agent is a few array operations instead of a Python loop over agents.

Each agent's arithmetic is what it does alone (models.linear's `*_stack` kernels: the same GEMM
per agent, per-record elementwise steps, reductions along the agent's own records), so its result
does not depend on which agents share its block or how many ranks there are (DESIGN.md). Agents
a kernel cannot stack (CSR records, several row chunks, the screened squared-loss path) take the
per-agent function: they hold enough records that the loop's overhead does not matter.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np

from ..backend import backend, to_numpy
from ..models import linear
from ..models.linear import error_counts


def _agent_chunks(g: SizeGroup, models: int, elems: int | None = None
                  ) -> list[tuple[np.ndarray, slice]]:
    """(block positions, group slice) chunks of a group whose (agents x models x records)
    intermediates hold about `elems` numbers (linear.CHUNK_ELEMS: memory bounded,
    cache-sized); the slices stop inside the group (the array API has no out-of-bounds
    stops)."""
    step = max(1, (linear.CHUNK_ELEMS if elems is None else elems) // max(1, models * g.n))
    G = g.rows.size
    return [(g.rows[a : a + step], slice(a, min(a + step, G))) for a in range(0, G, step)]


class Shard(Protocol):
    """What the block reads of a hosted agent's shard (common.LocalShard)."""

    agent: int
    X: Any  # dense (n, p) float64 or CSR
    y: np.ndarray

    @property
    def n(self) -> int: ...

    @property
    def squared_stats(self) -> linear.SquaredStats: ...


@dataclasses.dataclass
class SizeGroup:
    """The dense agents of one record count n: positions in the block and stacked records."""

    rows: np.ndarray  # (G,) positions of these agents in the block
    X: np.ndarray  # (G, n, p)
    y: np.ndarray  # (G, n)
    gram: np.ndarray | None = None  # (G, p, p), computed when first needed
    xty: np.ndarray | None = None  # (G, p)

    @functools.cached_property
    def row_l1(self) -> np.ndarray:
        """(G, n) the records' L1 norms (models.linear's per-record clipping bound)."""
        return np.abs(self.X).sum(axis=2)

    @property
    def n(self) -> int:
        return int(self.X.shape[1])


class AgentBlock:
    """The shards of a rank's hosted agents (`common.LocalShard`s, in block order), grouped for
    array work. On a device backend (`backend_name`, mpi_dp.backend) the dense records also move
    to the device, once, and `clipped_grad_sums` runs there (CSR records stay on the host); the
    evaluation-only passes stay on the host."""

    def __init__(self, shards: Sequence[Shard], backend_name: str = "numpy") -> None:
        self.shards = shards
        self.n = np.array([sh.n for sh in shards], dtype=np.int64)
        by_n: dict[int, list[int]] = {}
        self.singles: list[int] = []  # positions computed one agent at a time
        for j, sh in enumerate(shards):
            if isinstance(sh.X, np.ndarray) and sh.n > 0:
                by_n.setdefault(sh.n, []).append(j)
            else:
                self.singles.append(j)
        self.groups = [SizeGroup(np.array(rows, dtype=np.int64),
                                 np.stack([shards[j].X for j in rows]),
                                 np.stack([np.asarray(shards[j].y, dtype=np.float64)
                                           for j in rows]))
                       for n, rows in sorted(by_n.items())]
        bk = backend(backend_name)
        self.device = None if bk.is_numpy else bk
        self._dev_groups = [] if bk.is_numpy else [
            (bk.asarray(g.X), bk.asarray(g.y), bk.asarray(g.row_l1)) for g in self.groups]
        self._dev_singles = {} if bk.is_numpy else {
            j: (bk.asarray(shards[j].X), bk.asarray(np.asarray(shards[j].y, dtype=np.float64)))
            for j in self.singles if isinstance(shards[j].X, np.ndarray) and shards[j].n > 0}

    def __len__(self) -> int:
        return len(self.shards)

    def _squared_stats(self, g: SizeGroup) -> tuple[np.ndarray, np.ndarray]:
        """(G, p, p) gram X^T X and (G, p) X^T y of a group: per agent the same GEMM (and GEMV)
        as its `linear.squared_stats`, so the same bits."""
        if g.gram is None:
            Xt = g.X.transpose(0, 2, 1)
            g.gram, g.xty = Xt @ g.X, (Xt @ g.y[:, :, None])[..., 0]
        assert g.xty is not None  # set with gram
        return g.gram, g.xty

    def gram_stats(self) -> np.ndarray:
        """(A, p p + p + 1): every agent's X^T X (flattened), X^T y and y^T y, as its own
        `linear.squared_stats` and `y @ y` give them (zeros for an agent without records)."""
        p = self.shards[0].X.shape[1] if self.shards else 0
        out = np.zeros((len(self), p * p + p + 1))
        for g in self.groups:
            gram, xty = self._squared_stats(g)
            out[g.rows, : p * p] = gram.reshape(len(g.rows), -1)
            out[g.rows, p * p : p * p + p] = xty
            out[g.rows, -1] = (g.y[:, None, :] @ g.y[:, :, None])[:, 0, 0]
        for j in self.singles:
            sh = self.shards[j]
            if sh.n:
                st = sh.squared_stats
                out[j, : p * p] = st.gram.reshape(-1)
                out[j, p * p : p * p + p] = st.xty
                out[j, -1] = float(sh.y @ sh.y)
        return out

    def clipped_grad_sums(self, loss: str, Theta: np.ndarray, xi: float, with_stats: bool
                          ) -> tuple[np.ndarray, np.ndarray]:
        """Every agent's `linear.clipped_grad_sum` at the shared models Theta (R, p):
        (A, R, p) sums and (A, R) clipped counts; `with_stats` as passing the shard's
        SquaredStats (squared loss)."""
        T = linear.as_runs(Theta)
        R, p = T.shape
        out = np.empty((len(self), R, p))
        counts = np.empty((len(self), R), dtype=np.int64)
        stats = with_stats and loss == "squared"
        if self.device is not None:
            self._on_device(loss, T, xi, stats, out, counts)
            return out, counts
        for g in self.groups:
            if linear.stacked_grad_ok(loss, g.n, R, xi, stats):
                gram, xty = (self._squared_stats(g) if stats and not np.isfinite(xi)
                             else (None, None))  # the direct pass needs only row_l1
                for rows, c in _agent_chunks(g, R):
                    out[rows], counts[rows] = linear.clipped_grad_sum_stack(
                        loss, g.X[c], g.y[c], T, xi, g.row_l1[c], stats,
                        None if gram is None else gram[c], None if xty is None else xty[c])
            else:
                self._one_by_one(g.rows, loss, T, xi, stats, out, counts)
        self._one_by_one(self.singles, loss, T, xi, stats, out, counts)
        return out, counts

    def _on_device(self, loss: str, T: np.ndarray, xi: float, stats: bool, out: np.ndarray,
                   counts: np.ndarray) -> None:
        """`clipped_grad_sums` on the device backend: each size group in agent chunks of at most
        linear.DEVICE_CHUNK_ELEMS (agents x runs x records) numbers, each dense single agent
        alone; CSR agents on the host."""
        for g, (X, y, l1) in zip(self.groups, self._dev_groups, strict=True):
            for rows, c in _agent_chunks(g, T.shape[0], linear.DEVICE_CHUNK_ELEMS):
                s, k = linear.clipped_grad_sum_stack(loss, X[c, ...], y[c, ...], T, xi,
                                                     l1[c, ...])
                out[rows], counts[rows] = to_numpy(s), to_numpy(k)
        host = []
        for j in self.singles:
            if j in self._dev_singles:
                X, y = self._dev_singles[j]
                s, k = linear.clipped_grad_sum(loss, X, y, T, xi)
                out[j], counts[j] = to_numpy(s), to_numpy(k)
            else:
                host.append(j)
        self._one_by_one(host, loss, T, xi, stats, out, counts)

    def _one_by_one(self, rows, loss: str, T: np.ndarray, xi: float, stats: bool,
                    out: np.ndarray, counts: np.ndarray) -> None:
        for j in np.asarray(rows, dtype=np.int64).tolist():
            sh = self.shards[j]
            out[j], counts[j] = linear.clipped_grad_sum(loss, sh.X, sh.y, T, xi,
                                                        sh.squared_stats if stats else None)

    def _each(self, width: int, models: int, stacked, alone) -> np.ndarray:
        """(A, width): `stacked(group, group slice)` for the agents of each group whose records
        fit one row chunk of `models` models (in agent chunks), `alone(shard)` for the others."""
        out = np.empty((len(self), width))
        step = linear.chunk_rows(models)
        for g in self.groups:
            if g.n <= step:
                for rows, c in _agent_chunks(g, models):
                    out[rows] = stacked(g, c)
            else:
                for j in g.rows.tolist():
                    out[j] = alone(self.shards[j])
        for j in self.singles:
            out[j] = alone(self.shards[j])
        return out

    def loss_sums(self, loss: str, Theta: np.ndarray) -> np.ndarray:
        """Every agent's `linear.loss_sum` at the models Theta (M, p): (A, M)."""
        T = linear.as_runs(Theta)
        return self._each(T.shape[0], T.shape[0],
                          lambda g, c: linear.loss_sum_stack(loss, g.X[c], g.y[c], T),
                          lambda sh: linear.loss_sum(loss, sh.X, sh.y, T))

    def grad_sums(self, loss: str, theta: np.ndarray) -> np.ndarray:
        """Every agent's `linear.grad_sum` at one model theta (1, p): (A, p)."""
        T = linear.as_runs(theta)
        if T.shape[0] != 1:
            raise ValueError("grad_sums takes one model")
        # one chunk: grad_sum is the unclipped pass of clipped_grad_sum
        return self._each(T.shape[1], 1,
                          lambda g, c: linear.clipped_grad_sum_stack(
                              loss, g.X[c], g.y[c], T, np.inf, g.row_l1[c])[0][:, 0],
                          lambda sh: linear.grad_sum(loss, sh.X, sh.y, T)[0])

    def loss_grad_sums(self, loss: str, theta: np.ndarray) -> np.ndarray:
        """(A, 1 + p): `loss_sums` and `grad_sums` at one model theta (1, p) side by side, in one
        pass over the records (bit for bit the two calls: see linear.loss_grad_sum)."""
        T = linear.as_runs(theta)
        if T.shape[0] != 1:
            raise ValueError("loss_grad_sums takes one model")

        def alone(sh: Shard) -> np.ndarray:
            f, g = linear.loss_grad_sum(loss, sh.X, sh.y, T)
            return np.concatenate([f, g[0]])

        return self._each(1 + T.shape[1], 1,
                          lambda g, c: linear.loss_grad_sum_stack(loss, g.X[c], g.y[c], T),
                          alone)

    def error_counts(self, thetas: np.ndarray) -> np.ndarray:
        """Every agent's `linear.error_counts` of the models thetas (M, p): (A, M)."""
        T = linear.as_runs(thetas)

        def stacked(g: SizeGroup, c: slice) -> np.ndarray:
            Z = g.X[c] @ T.T  # (G, n, M): X @ T.T per agent, as error_counts
            wrong = np.where(Z >= 0.0, 1.0, -1.0) != g.y[c, :, None]
            total = np.zeros((Z.shape[0], T.shape[0]))
            total += wrong.sum(axis=1)
            return total

        return self._each(T.shape[0], T.shape[0], stacked,
                          lambda sh: error_counts(sh.X, sh.y, T))
