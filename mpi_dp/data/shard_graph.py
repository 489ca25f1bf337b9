"""Public similarity graphs between agents, stored in a shard file's /public group.

Convention (personalised P2P, spec personalized-p2p §5): ``/public/graph_edges`` is an (E, 2)
int64 array of agent pairs with i < j, each pair once, and ``/public/graph_weights`` an (E,)
float64 array of positive weights, W_ij = W_ji = weight. `graph_arrays` turns a symmetric matrix
into these arrays, `read_graph` reads and checks them back as a CSR matrix.

``/public/agent_descriptors`` (optional) is an (n_agents, d) float64 array of PUBLIC per-agent
features (e.g. a hospital's region and size, known to everyone), one row per agent: the peer
methods' 'knn:K' graphs are built on it (comm.topology.knn). It is never computed from the agents'
private records; whoever prepares the shard file writes it (write_shards(public_extra=
{"agent_descriptors": D})).
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import numpy as np
import scipy.sparse as sp
from scipy.sparse.csgraph import connected_components

from mpi_dp.data.shards import ShardFile
from mpi_dp.errors import DataError
from mpi_dp.models.spectral import (  # noqa: F401  (re-exported: data users read it here)
    LAMBDA2_DENSE_MAX,
    LAMBDA2_SPARSE_TOL,
    laplacian_lambda2,
)

EDGES = "graph_edges"
WEIGHTS = "graph_weights"
DESCRIPTORS = "agent_descriptors"


def graph_arrays(W: sp.spmatrix | np.ndarray) -> dict[str, np.ndarray]:
    """{graph_edges: (E, 2) int64 with i < j, graph_weights: (E,) float64} of a symmetric W.

    Only the strict upper triangle is read (the diagonal is ignored), in row-major order.
    """
    U = sp.triu(sp.csr_matrix(W, dtype=np.float64), k=1, format="coo")
    U.sum_duplicates()
    keep = U.data != 0
    i, j, w = U.row[keep], U.col[keep], U.data[keep]
    order = np.lexsort((j, i))
    edges = np.stack([i[order], j[order]], axis=1).astype(np.int64).reshape(-1, 2)
    return {EDGES: edges, WEIGHTS: np.ascontiguousarray(w[order], dtype=np.float64)}


def unreachable(W: sp.spmatrix, start: int = 0) -> np.ndarray:
    """Agents (sorted) with no path from agent `start` in the graph W."""
    _, labels = connected_components(sp.csr_matrix(W), directed=False)
    return np.flatnonzero(labels != labels[start])


def _shown(ids: Sequence[int] | np.ndarray, limit: int = 20) -> str:
    ids = [int(i) for i in ids]
    return ", ".join(map(str, ids[:limit])) + (f", ... ({len(ids)} in all)" if len(ids) > limit
                                               else "")


def graph_matrix(edges: np.ndarray, weights: np.ndarray, n: int, *, where: str = "graph",
                 connected: bool = True) -> sp.csr_matrix:
    """The symmetric CSR matrix (n x n, zero diagonal, sorted indices) of an edge list.

    DataError (naming `where`) unless edges is (E, 2) integer with 0 <= i < j < n and no pair
    twice, weights is (E,) finite and > 0, and (with `connected`) every agent is reachable.
    """
    edges, weights = np.asarray(edges), np.asarray(weights)
    if edges.ndim != 2 or edges.shape[1] != 2 or weights.shape != (edges.shape[0],):
        raise DataError(f"{where}: {EDGES} must be (E, 2) and {WEIGHTS} (E,), got "
                        f"{edges.shape} and {weights.shape}")
    if edges.size and edges.dtype.kind not in "iu":
        if not np.all(edges == np.round(edges)):
            raise DataError(f"{where}: {EDGES} holds non-integer agent ids")
    edges = edges.astype(np.int64)
    weights = weights.astype(np.float64)
    bad = np.flatnonzero((edges < 0).any(axis=1) | (edges >= n).any(axis=1))
    if bad.size:
        raise DataError(f"{where}: edge {int(bad[0])} {tuple(edges[bad[0]].tolist())} has an "
                        f"agent id outside 0..{n - 1} ({bad.size} such edges)")
    bad = np.flatnonzero(edges[:, 0] >= edges[:, 1])
    if bad.size:
        raise DataError(f"{where}: edge {int(bad[0])} {tuple(edges[bad[0]].tolist())} does not "
                        "have i < j (each pair once, no self-loops)")
    bad = np.flatnonzero(~np.isfinite(weights) | (weights <= 0))
    if bad.size:
        raise DataError(f"{where}: edge {int(bad[0])} has weight {weights[bad[0]]}; weights must "
                        f"be finite and > 0 ({bad.size} such edges)")
    key = edges[:, 0] * n + edges[:, 1]
    if not np.all(key[1:] > key[:-1]):  # sorted without repeats (graph_arrays' order): no sort
        uniq, counts = np.unique(key, return_counts=True)
        if uniq.size != key.size:
            k = int(uniq[np.argmax(counts > 1)])
            raise DataError(f"{where}: edge ({k // n}, {k % n}) is listed more than once")
    i, j = edges[:, 0], edges[:, 1]
    W = sp.csr_matrix((np.concatenate([weights, weights]),
                       (np.concatenate([i, j]), np.concatenate([j, i]))), shape=(n, n))
    W.sort_indices()
    if connected and n > 1:
        lost = unreachable(W)
        if lost.size:
            raise DataError(f"{where}: the graph is disconnected; {lost.size} of {n} agents "
                            f"cannot be reached from agent 0: {_shown(lost)}")
    return W


def has_graph(shards: ShardFile) -> bool:
    """Whether the shard file holds a public graph."""
    names = shards.public_extra_names()
    return EDGES in names and WEIGHTS in names


def read_graph(shards: str | os.PathLike[str] | ShardFile, *,
               connected: bool = True) -> sp.csr_matrix:
    """The public similarity graph W of a shard file (n_agents x n_agents, symmetric CSR with
    zero diagonal and sorted indices); DataError if it is absent, malformed or (by default)
    disconnected."""
    if not isinstance(shards, ShardFile):
        with ShardFile(shards) as f:
            return read_graph(f, connected=connected)
    where = f"shard file '{shards.path}'"
    if not has_graph(shards):
        raise DataError(f"{where} has no public graph (/public/{EDGES} and /public/{WEIGHTS}); "
                        "make one with `mpi-dp data synth --task p2p` or the movielens recipe")
    return graph_matrix(shards.read_public_extra(EDGES), shards.read_public_extra(WEIGHTS),
                        shards.n_agents, where=where, connected=connected)


def stored_graph(shards: ShardFile) -> tuple[np.ndarray, np.ndarray]:
    """(edges, weights) of the shard file's stored graph, checked but not for connectivity
    (the graph builder says which spelling to change); DataError if absent or malformed."""
    return tuple(graph_arrays(read_graph(shards, connected=False)).values())  # type: ignore


def has_descriptors(shards: ShardFile) -> bool:
    """Whether the shard file holds public agent descriptors."""
    return DESCRIPTORS in shards.public_extra_names()


def read_descriptors(shards: ShardFile) -> np.ndarray:
    """The public agent descriptors (n_agents, d) float64 of a shard file; DataError, with the
    fix, if they are absent, of the wrong shape or not finite."""
    where = f"shard file '{shards.path}'"
    if not has_descriptors(shards):
        raise DataError(f"{where} has no public agent descriptors (/public/{DESCRIPTORS}: one "
                        "row of public features per agent, never computed from the private "
                        "records); a 'knn:K' graph needs them: write them with write_shards("
                        f"public_extra={{'{DESCRIPTORS}': D}}), or choose a graph that needs no "
                        "data ('complete', 'erdos_renyi:p', 'random_geometric', an edge list)")
    d = np.asarray(shards.read_public_extra(DESCRIPTORS))
    if d.ndim == 1:
        d = d[:, None]
    if d.ndim != 2 or d.shape[0] != shards.n_agents or d.dtype.kind not in "biuf":
        raise DataError(f"{where}: /public/{DESCRIPTORS} must be a numeric (n_agents, d) = "
                        f"({shards.n_agents}, d) array, got {d.dtype} {d.shape}")
    d = d.astype(np.float64)
    if not np.all(np.isfinite(d)):
        raise DataError(f"{where}: /public/{DESCRIPTORS} holds NaN or inf values")
    return d
