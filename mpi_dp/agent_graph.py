"""The one graph type of the peer methods: agents 0..m-1 and their undirected weighted edges.

Pure NumPy/SciPy, no MPI, no other mpi_dp module: a leaf that every layer may import. dola reads
the structure (`adjacency`, `degrees`, `neighbours`, `edge_ids`; comm.topology builds the graphs
and re-exports the class), p2p's objective (2) reads the weights (`W`, `deg`, `nbrs`,
`nbr_weights`, `laplacian`; p2p.objective). A graph is built from its edge list (`Graph(m, edges,
kind, weights=...)`) or from a symmetric weight matrix (`Graph.from_weights(W)`, checked).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import numpy as np
import scipy.sparse as sp
from scipy.sparse import csgraph


def _canonical(W: Any) -> sp.csr_matrix:
    """W as float64 CSR with duplicates summed, sorted indices and no stored zeros."""
    W = sp.csr_matrix(W, dtype=np.float64)
    W.sum_duplicates()
    W.sort_indices()
    W.eliminate_zeros()
    return W


@dataclasses.dataclass(frozen=True, eq=False)
class Graph:
    """An undirected simple graph on agents 0..m-1; `edges` (E, 2) with i < j, sorted.

    `weights` (E,), aligned with `edges`, are positive edge weights where the graph has them (a
    stored similarity graph, an edge list with a third column, a weight matrix); None:
    unweighted, which p2p reads as weight 1 on every edge. dola's mixing ignores them
    (Metropolis-Hastings weights from the degrees).

    Two degrees: `degrees` counts the neighbours (int64), `deg` sums the weights (D_ii of
    objective (2), float64)."""

    m: int
    edges: np.ndarray
    kind: str
    info: dict[str, Any] = dataclasses.field(default_factory=dict)
    positions: np.ndarray | None = None
    weights: np.ndarray | None = None

    def __post_init__(self) -> None:
        e = np.asarray(self.edges, dtype=np.int64).reshape(-1, 2)
        if e.size and (e.min() < 0 or e.max() >= self.m or np.any(e[:, 0] >= e[:, 1])):
            raise ValueError("edges must be pairs i < j of agents in 0..m-1")
        if self.weights is None:  # np.unique(e, axis=0) through one int64 key per pair (faster)
            if e.size:
                key = np.unique(e[:, 0] * self.m + e[:, 1])
                e = np.stack([key // self.m, key % self.m], axis=1)
        else:  # sorted like np.unique, the weights along; a repeated pair is refused
            w = np.asarray(self.weights, dtype=np.float64).reshape(-1)
            if w.shape != (len(e),) or not np.all(np.isfinite(w) & (w > 0)):
                raise ValueError("weights must be (E,) finite and > 0, one per edge")
            key = e[:, 0] * self.m + e[:, 1]
            if not np.all(key[1:] > key[:-1]):  # not already sorted without repeats
                order = np.lexsort((e[:, 1], e[:, 0]))
                e, w = e[order], w[order]
                if len(e) > 1 and np.any(np.all(e[1:] == e[:-1], axis=1)):
                    raise ValueError("an edge is listed twice")
            object.__setattr__(self, "weights", w)
        object.__setattr__(self, "edges", e)

    @classmethod
    def from_weights(cls, W: Any, kind: str = "weights", symmetric: bool = False,
                     info: dict[str, Any] | None = None) -> Graph:
        """The graph of a weight matrix W (n x n, symmetric, non-negative, zero diagonal, every
        agent with a neighbour): an edge where W_ij > 0, weighted W_ij. ValueError otherwise.

        `symmetric=True`: the caller vouches that W is symmetric (data.shard_graph.read_graph and
        `weight_matrix` build it from an edge list, both directions alike), so the O(nnz)
        transposition check is skipped. `W` keeps the checked matrix itself."""
        W = _canonical(W)
        if W.shape[0] != W.shape[1]:
            raise ValueError(f"W must be square, got {W.shape}")
        if W.nnz and not symmetric:  # symmetric: the transpose has the same arrays
            T = W.T.tocsr()
            T.sort_indices()
            if not (np.array_equal(T.indptr, W.indptr) and np.array_equal(T.indices, W.indices)
                    and np.array_equal(T.data, W.data)):
                raise ValueError("W must be symmetric")
        if W.nnz and (W.data.min() < 0 or np.any(W.diagonal() != 0)):
            raise ValueError("W must be non-negative with a zero diagonal")
        if W.nnz and not np.all(np.isfinite(W.data)):
            raise ValueError("W must be finite")
        deg = np.asarray(W.sum(axis=1)).ravel()
        if np.any(deg <= 0):
            raise ValueError(f"agent(s) {np.flatnonzero(deg <= 0)[:5].tolist()} have no "
                             "neighbour (D_ii = 0)")
        rows, cols, w = _upper(W)
        g = cls(W.shape[0], np.stack([rows, cols], axis=1), kind, info=dict(info or {}),
                weights=w)
        g.__dict__.update(W=W, deg=deg, upper=(rows, cols, w))  # the cached properties
        return g

    # -- structure (dola, the graph builders) ------------------------------------------------
    @functools.cached_property
    def adjacency(self) -> sp.csr_matrix:
        """Symmetric CSR adjacency with sorted column indices (neighbours by ascending id)."""
        e = self.edges
        rows = np.concatenate([e[:, 0], e[:, 1]])
        cols = np.concatenate([e[:, 1], e[:, 0]])
        a = sp.csr_matrix((np.ones(rows.size), (rows, cols)), shape=(self.m, self.m))
        a.sort_indices()
        return a

    @property
    def degrees(self) -> np.ndarray:
        return np.diff(self.adjacency.indptr).astype(np.int64)

    def neighbours(self, i: int) -> np.ndarray:
        a = self.adjacency
        return a.indices[a.indptr[i]:a.indptr[i + 1]].astype(np.int64)

    def edge_ids(self, i: int) -> np.ndarray:
        """Index into `edges` of each edge of agent i, in the order of `neighbours(i)`."""
        nb = self.neighbours(i)
        lo, hi = np.minimum(nb, i), np.maximum(nb, i)
        return self._edge_lookup(lo, hi)

    def _edge_lookup(self, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
        key = self.edges[:, 0] * self.m + self.edges[:, 1]
        return np.searchsorted(key, lo * self.m + hi).astype(np.int64)

    def is_connected(self) -> bool:
        if self.m <= 1:
            return True
        n, _ = csgraph.connected_components(self.adjacency, directed=False)
        return n == 1

    @property
    def mean_degree(self) -> float:
        return 2.0 * len(self.edges) / self.m

    def describe(self) -> dict[str, Any]:
        """What the output records about the graph (with the edge list stored beside it)."""
        d = self.degrees
        out = {"kind": self.kind, "m": self.m, "n_edges": int(len(self.edges)),
               "mean_degree": float(self.mean_degree), "max_degree": int(d.max(initial=0)),
               "min_degree": int(d.min()) if d.size else 0, **self.info}
        if self.weights is not None:
            out["weighted"] = True
        return out

    def weight_matrix(self) -> sp.csr_matrix:
        """The symmetric weight matrix W (m x m CSR, sorted indices, zero diagonal): the edge
        weights, or 1 on every edge of an unweighted graph (p2p's similarity graph); a new
        matrix on every call (`W` is the cached, canonical one)."""
        e = self.edges
        w = np.ones(len(e)) if self.weights is None else self.weights
        W = sp.csr_matrix((np.concatenate([w, w]), (np.concatenate([e[:, 0], e[:, 1]]),
                                                    np.concatenate([e[:, 1], e[:, 0]]))),
                          shape=(self.m, self.m))
        W.sort_indices()
        return W

    # -- weights (p2p's objective (2)) --------------------------------------------------------
    @property
    def n(self) -> int:
        """The number of agents (= m; objective (2)'s n)."""
        return self.m

    @functools.cached_property
    def W(self) -> sp.csr_matrix:
        """The weight matrix, float64 CSR with sorted indices and no stored zeros (cached:
        shared, do not modify)."""
        return _canonical(self.weight_matrix())

    @functools.cached_property
    def deg(self) -> np.ndarray:
        """The weighted degrees D_ii = sum_j W_ij (n,)."""
        return np.asarray(self.W.sum(axis=1)).ravel()

    @functools.cached_property
    def upper(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The strict upper triangle of W as (rows, cols, weights) in CSR order: each edge once."""
        return _upper(self.W)

    def nbrs(self, i: int) -> np.ndarray:
        """The neighbours of agent i in W's CSR order (ascending ids; a view of W.indices)."""
        return self.W.indices[self.W.indptr[i]:self.W.indptr[i + 1]]

    def nbr_weights(self, i: int) -> np.ndarray:
        """W_ij of agent i's neighbours j, in the order of `nbrs(i)` (a view of W.data)."""
        return self.W.data[self.W.indptr[i]:self.W.indptr[i + 1]]

    @property
    def laplacian(self) -> sp.csr_matrix:
        """L = D - W (a new CSR matrix on every call)."""
        return sp.csr_matrix(sp.diags(self.deg) - self.W)


def _upper(W: sp.csr_matrix) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rows = np.repeat(np.arange(W.shape[0], dtype=W.indices.dtype), np.diff(W.indptr))
    up = W.indices > rows
    return rows[up], W.indices[up], W.data[up]
