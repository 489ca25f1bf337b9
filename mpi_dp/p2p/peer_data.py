"""The peers' data of personalised P2P coordinate descent (seed 004), as one rank sees it.

`Data` holds one shard file's public graph W and record counts, and the records of the peers a
rank hosts (or of all of them: rank 0's evaluation copy). `peer_graph` reads the shard file's
stored graph or builds the job's (comm.topology), `global_test` reads its global test set, and
`read_peers` reads the peers' records, holds out each peer's seeded validation share and checks
them against the public row-norm bound. Errors name the job file and its key (`job`: the job
file's path).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np
import scipy.sparse as sp

from ..agent_graph import Graph
from ..comm import topology
from ..data import ShardFile
from ..data.bounds import row_norm_bound
from ..data.shard_graph import has_graph, read_descriptors, read_graph, stored_graph
from ..errors import DataError, JobError
from ..rng import stream


@dataclasses.dataclass
class Data:
    """One shard file as this rank sees it: public graph and sizes, its peers' records."""

    path: str
    W: sp.csr_matrix
    m: np.ndarray
    X: list
    y: list
    Xt: list
    yt: list
    row_norm: float
    task: str
    full: bool = False  # every peer's records are loaded (rank 0's evaluation copy)
    Xv: list | None = None  # held-out validation records of each peer (p2p.validation > 0)
    yv: list | None = None
    m_all: np.ndarray | None = None  # records in the shard file (m + the validation share)
    graph: Graph | None = None  # the checked graph of W, built once (`Objective.problem`)
    graph_info: dict | None = None  # what the output records about the graph (public)
    test_global: tuple | None = None  # the shard file's global test set (rank 0 only)


def peer_graph(shard: ShardFile, spec: str, seed: int, job: Any
               ) -> tuple[sp.csr_matrix, dict[str, Any]]:
    """The peers' graph W (symmetric CSR, sorted indices) of p2p.graph = `spec` and what the
    output records about it: the shard file's stored graph ('shard', read as it always was) or
    one built by comm.topology from the seed (weight 1 per edge where it has none)."""
    if spec == "shard":
        if not has_graph(shard):
            raise JobError(
                f"job file {job}: key 'p2p.graph': 'shard' (the default) reads the graph "
                f"stored in the shard file, but {shard.path} has no public graph (/public/"
                "graph_edges, graph_weights: only `mpi-dp data synth --task p2p` and the "
                "movielens recipe write one); set p2p.graph to a graph built for the job: "
                "'complete', "
                "'erdos_renyi:p' (e.g. 'erdos_renyi:0.2'), 'random_geometric', 'knn:K' (needs "
                "public /public/agent_descriptors) or an edge-list path ('i j [w]' per line)")
        W = read_graph(shard)
        info: dict[str, Any] = {"kind": "shard", "source": "the shard file's /public/"
                                "graph_edges and graph_weights (its weights)"}
    else:
        try:
            g = topology.make_graph(spec, shard.n_agents, seed,
                                    descriptors=lambda: read_descriptors(shard),
                                    stored=lambda: stored_graph(shard))
        except (JobError, DataError) as e:
            raise JobError(f"job file {job}: key 'p2p.graph': {e}") from None
        W = g.weight_matrix()
        info = g.describe()
        info["weights"] = ("the edge list's" if g.weights is not None
                           else "1 per edge (an unweighted graph)")
    deg = np.diff(W.indptr)
    info.update(spec=spec, m=int(W.shape[0]), n_edges=int(W.nnz // 2),
                mean_degree=float(deg.mean()) if deg.size else 0.0,
                min_degree=int(deg.min()) if deg.size else 0,
                max_degree=int(deg.max()) if deg.size else 0)
    return W, info


def global_test(shard: ShardFile, job: Any) -> tuple[np.ndarray, np.ndarray] | None:
    """The shard file's global test set (dense X, y), checked, or None without one."""
    if not shard.has_global_test:
        return None
    X: Any  # dense or CSR as read
    X, y = shard.read_test()
    X = X.toarray() if sp.issparse(X) else np.asarray(X, dtype=np.float64)
    if shard.task == "binary" and not np.all(np.isin(y, (-1.0, 1.0))):
        raise JobError(f"job file {job}: {shard.path}: the global test set has "
                       f"labels {np.unique(y)[:4].tolist()}; binary p2p needs -1/+1")
    return X, y


def read_peers(shard: ShardFile, path: str, W: sp.csr_matrix, m_all: np.ndarray,
               mine: Sequence[int], validation: float, seed: int, row_norm: Any, job: Any,
               full: bool) -> Data:
    """The records of the peers `mine` (a block, or all of them when `full`), each peer's
    seeded `validation` share held out, checked (finite, L2 norm <= the public bound `row_norm`,
    its spec: 'auto' or a number; binary labels -1/+1)."""
    n = shard.n_agents
    frac = float(validation)
    n_val = np.floor(frac * m_all).astype(np.int64) if frac > 0 else np.zeros_like(m_all)
    m = m_all - n_val  # public: depends on the public m_i only
    X: list = [None] * n
    y: list = [None] * n
    Xt: list = [None] * n
    yt: list = [None] * n
    Xv: list = [None] * n
    yv: list = [None] * n
    for i in mine:
        X[i], y[i] = shard.read_agent(i)
        if n_val[i]:  # a fixed random share of the peer's training records, per peer
            perm = stream(int(seed), "partition", i).permutation(int(m_all[i]))
            v, t = np.sort(perm[: n_val[i]]), np.sort(perm[n_val[i]:])
            Xv[i], yv[i] = X[i][v], y[i][v]
            X[i], y[i] = X[i][t], y[i][t]
        if shard.has_test(i):
            Xt[i], yt[i] = shard.read_agent_test(i)
    rn = row_norm
    if rn == "auto":
        item, bound = row_norm_bound(shard, "item_norm_max"), row_norm_bound(shard)
        rn = item if item is not None else bound if bound is not None else 1.0
    bad = [(i, float(np.linalg.norm(X[i], axis=1).max())) for i in mine if m[i] and
           np.linalg.norm(X[i], axis=1).max() > rn * (1 + 1e-9)]
    nonfinite = [i for i in mine if m[i] and not (np.all(np.isfinite(X[i])) and
                                                  np.all(np.isfinite(y[i])))]
    if nonfinite:
        raise JobError(f"job file {job}: {shard.path}: peer(s) {nonfinite[:5]} hold NaN "
                       "or inf values")
    if bad:
        raise JobError(f"job file {job}: key 'p2p.row_norm': peer {bad[0][0]} of "
                       f"{shard.path} has a record of L2 norm {bad[0][1]:.4g} > row_norm = "
                       f"{rn:g} (give a public bound that holds, or normalise the rows)")
    if shard.task == "binary":
        for i in mine:
            if m[i] and not np.all(np.isin(y[i], (-1.0, 1.0))):
                raise JobError(f"job file {job}: {shard.path}: peer {i} has labels "
                               f"{np.unique(y[i])[:4].tolist()}; binary p2p needs -1/+1")
    return Data(str(path), W, m, X, y, Xt, yt, float(rn), shard.task, full=full,
                Xv=Xv if frac > 0 else None, yv=yv if frac > 0 else None, m_all=m_all)
