"""Synthetic datasets with the papers' shapes, for unit tests and the embedded demo.

Every draw comes from ``rng.stream(seed, "data", agent, 0)``: owner i's records from agent = i,
the public hold-out from agent = LEARNER, the true parameter from agent = LEARNER - 1. So adding
owners or resizing one owner never changes another owner's records. Each record's features and
noise are drawn together as one row, so an owner with n records gets exactly the first n records
of the same owner with more records (a sweep over n can generate once and read prefixes).
The personalised P2P task (`p2p_instance`) draws agent i's targets from (seed, "graph", i) and
its records from (seed, "data", i); its graph follows mpi_dp.data.shard_graph.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import time
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import numpy as np
import scipy.sparse as sp
from scipy.sparse.csgraph import connected_components

from mpi_dp import rng
from mpi_dp.data.cli_checks import (
    OVERWRITE_HELP,
    Range,
    add_number,
    check_ranges,
    launcher_rank,
    refuse_existing,
)
from mpi_dp.data.shard_graph import graph_arrays, laplacian_lambda2
from mpi_dp.data.shards import ShardFile, write_shards
from mpi_dp.errors import DataError

SYNTH_TASKS = ("regression", "binary", "multiclass", "online", "p2p")


#: longest list of per-agent sizes stored in the file's `synth` attribute (attributes are capped
#: at 64 KiB; every agent's size is its group's `n` attribute anyway)
RECORDS_PARAM_MAX = 256


def _records_param(sizes: Sequence[int]) -> int | list[int] | str:
    """The `records` entry of the synth parameters: one number when every agent has the same
    count, the list when it is short, else a summary (thousands of agents)."""
    if len(set(sizes)) == 1:
        return int(sizes[0])
    if len(sizes) <= RECORDS_PARAM_MAX:
        return [int(r) for r in sizes]
    return (f"{len(sizes)} per-agent counts (/agents/offsets): {min(sizes)}..{max(sizes)}"
            f", {sum(sizes)} in all")


def _records_list(n_agents: int, records: int | Sequence[int]) -> list[int]:
    """Per-owner record counts from an int (same for all) or a list; DataError if invalid."""
    if n_agents < 1:
        raise DataError(f"n_agents must be at least 1, got {n_agents}")
    if isinstance(records, (int, np.integer)):
        sizes = [int(records)] * n_agents
    else:
        sizes = [int(r) for r in records]
        if len(sizes) != n_agents:
            raise DataError(f"{len(sizes)} record counts given for {n_agents} agents")
    if any(r < 1 for r in sizes):
        raise DataError(f"every owner needs at least 1 record, got {sizes}")
    return sizes


def _check(dim: int, noise: float, seed: int, public: int) -> None:
    if dim < 1:
        raise DataError(f"dim must be at least 1, got {dim}")
    if not np.isfinite(noise) or noise < 0:
        raise DataError(f"noise must be a finite non-negative number, got {noise}")
    if seed < 0:
        raise DataError(f"seed must be non-negative, got {seed}")
    if public < 0:
        raise DataError(f"public must be non-negative (0 for none), got {public}")


def _theta_true(seed: int, dim: int) -> np.ndarray:
    return rng.stream(seed, "data", rng.LEARNER - 1, 0).standard_normal(dim)


def _draw(seed: int, agent: int, n: int, dim: int) -> tuple[np.ndarray, np.ndarray]:
    """n rows of (features ~ N(0, I_dim), standard normal noise), one stream row per record."""
    Z = rng.stream(seed, "data", agent, 0).standard_normal((n, dim + 1))
    return np.ascontiguousarray(Z[:, :dim]), np.ascontiguousarray(Z[:, dim])


def synth_regression(
    n_agents: int,
    records: int | Sequence[int],
    dim: int,
    noise: float,
    seed: int,
    *,
    public: int = 10000,
    scale: float = 1.0,
) -> dict[str, Any]:
    """Linear regression: X ~ N(0, scale^2 I), theta_true ~ N(0, I), y = X theta_true + noise e.

    Returns {"agents": [(X, y), ...], "public": (X, y) or None, "theta_true": array (dim,),
    "task": "regression"}.
    """
    sizes = _records_list(n_agents, records)
    _check(dim, noise, seed, public)
    theta = _theta_true(seed, dim)

    def make(agent: int, n: int) -> tuple[np.ndarray, np.ndarray]:
        X, e = _draw(seed, agent, n, dim)
        X *= scale
        return X, X @ theta + noise * e

    return {
        "agents": [make(i, n) for i, n in enumerate(sizes)],
        "public": make(rng.LEARNER, public) if public > 0 else None,
        "theta_true": theta,
        "task": "regression",
    }


def synth_classification(
    n_agents: int,
    records: int | Sequence[int],
    dim: int,
    noise: float,
    seed: int,
    *,
    public: int = 10000,
    bias: bool = True,
) -> dict[str, Any]:
    """Binary labels y = sign(X theta_true + noise e) in {-1.0, +1.0} (0 maps to +1), X ~ N(0, I).

    With bias=True a constant 1 column is appended to X (p = dim + 1), as for the L-SVM.
    theta_true has length dim (the labels have no intercept). Returns the same dict as
    synth_regression with "task": "binary".
    """
    sizes = _records_list(n_agents, records)
    _check(dim, noise, seed, public)
    theta = _theta_true(seed, dim)

    def make(agent: int, n: int) -> tuple[np.ndarray, np.ndarray]:
        X, e = _draw(seed, agent, n, dim)
        y = np.where(X @ theta + noise * e >= 0.0, 1.0, -1.0)
        if bias:
            X = np.hstack([X, np.ones((n, 1))])
        return X, y

    return {
        "agents": [make(i, n) for i, n in enumerate(sizes)],
        "public": make(rng.LEARNER, public) if public > 0 else None,
        "theta_true": theta,
        "task": "binary",
    }


def synth_multiclass(
    n_agents: int,
    records: int | Sequence[int],
    dim: int,
    noise: float,
    seed: int,
    *,
    classes: int = 4,
    test: int = 2000,
) -> dict[str, Any]:
    """Spec dp-inexact-admm §9: centroids C ~ U[0,1]^(K x J), y ~ U{0..K-1},
    x = clip(C_y + noise N(0, I_J), 0, 1) (features in [0, 1], like MNIST pixels).

    Owner i's records come from the stream (seed, 'data', i); the global test set (`test`
    records) from the learner's stream. Labels are floats 0..K-1 (the shard format's y).
    """
    sizes = _records_list(n_agents, records)
    _check(dim, noise, seed, 0)
    if classes < 2:
        raise DataError(f"classes must be at least 2, got {classes}")
    C = rng.stream(seed, "data", rng.LEARNER - 1, 0).random((classes, dim))

    def make(agent: int, n: int) -> tuple[np.ndarray, np.ndarray]:
        g = rng.stream(seed, "data", agent, 0)
        y = g.integers(classes, size=n)
        X = np.clip(C[y] + noise * g.standard_normal((n, dim)), 0.0, 1.0)
        return X, y.astype(np.float64)

    return {"agents": [make(i, n) for i, n in enumerate(sizes)],
            "test": make(rng.LEARNER, test) if test > 0 else None, "centroids": C,
            "task": "multiclass"}


def write_synth(
    path: str | os.PathLike[str],
    task: str,
    n_agents: int,
    records: int | Sequence[int],
    dim: int,
    noise: float,
    seed: int,
    public: int = 10000,
    **kw: Any,
) -> pathlib.Path:
    """Generate a synthetic dataset and write it as a shard file; theta_true goes to /public.

    `kw` is passed to the generator (`scale` for regression, `bias` for binary). For "p2p",
    `noise` is the label flip probability, `records` and `public` are ignored and `kw` goes to
    `p2p_instance` (min_records, max_records, test_records, gamma, normalise).
    """
    if task == "p2p":
        return write_p2p(path, n_agents, dim, seed, flip=noise, **kw)
    if task == "online":
        return _write_online(path, n_agents, records, dim, noise, seed, public)
    if task == "multiclass":
        return _write_multiclass(path, n_agents, records, dim, noise, seed, public, **kw)
    gen: Callable[..., dict[str, Any]]
    if task == "regression":
        gen, generator = synth_regression, "synth_regression"
    elif task == "binary":
        gen, generator = synth_classification, "synth_classification"
    else:
        raise DataError(f"unknown synthetic task {task!r}; expected one of {list(SYNTH_TASKS)}")
    data = gen(n_agents, records, dim, noise, seed, public=public, **kw)
    sizes = [X.shape[0] for X, _ in data["agents"]]
    params: dict[str, Any] = {
        "generator": generator,
        "n_agents": n_agents,
        "records": _records_param(sizes),
        "dim": dim,
        "noise": float(noise),
        "seed": int(seed),
        "public": int(public),
    }
    if task == "regression":
        params["scale"] = float(kw.get("scale", 1.0))
    else:
        params["bias"] = bool(kw.get("bias", True))
    names = [f"x{j}" for j in range(dim)]
    if task == "binary" and params["bias"]:
        names.append("bias")
    source = f"mpi_dp.data.synth.{generator}(" + ", ".join(
        f"{k}={v!r}" for k, v in params.items() if k != "generator"
    ) + ")"
    return write_shards(
        path,
        data["agents"],
        public=data["public"],
        task=task,
        feature_names=names,
        source=source,
        attrs={"synth": params},
        public_extra={"theta_true": data["theta_true"]},
    )


#: the label flip probability of `--task online` when --noise is not given (spec
#: dp-distributed-online-learning §7: 5 % label flips)
ONLINE_FLIP = 0.05


def synth_online(n_agents: int, records: int | Sequence[int], dim: int, flip: float, seed: int,
                 *, test: int = 2000, informative: int | None = None) -> dict[str, Any]:
    """The DOLA validation stream (spec dp-distributed-online-learning §7): w_true ~ N(0, I)
    normalised (only `informative` coordinates nonzero when given); owner i draws
    x ~ N(c_i, I/dim) around its own shift c_i ~ N(0, I/dim), rows scaled to norm <= 1,
    y = sign(<w_true, x>) with a fraction `flip` of labels flipped. The test set comes from the
    shift-free distribution."""
    sizes = _records_list(n_agents, records)
    if not 0 <= flip < 0.5:
        raise DataError(f"online: the label flip fraction must be in [0, 0.5), got {flip}")
    g = rng.stream(seed, "data", rng.LEARNER, 1)
    w = g.standard_normal(dim)
    if informative is not None:
        w[informative:] = 0.0
    w /= np.linalg.norm(w)

    def make(agent: int, n: int, shift: bool = True) -> tuple[np.ndarray, np.ndarray]:
        ga = rng.stream(seed, "data", agent, 1)
        c = ga.standard_normal(dim) / np.sqrt(dim) if shift else np.zeros(dim)
        X = c + ga.standard_normal((n, dim)) / np.sqrt(dim)
        X /= np.maximum(1.0, np.linalg.norm(X, axis=1))[:, None]
        y = np.where(X @ w >= 0, 1.0, -1.0)
        y[ga.random(n) < flip] *= -1.0
        return X, y

    return {"agents": [make(i, n) for i, n in enumerate(sizes)],
            "test": make(rng.LEARNER, test, shift=False) if test > 0 else None, "w_true": w}


def _write_online(path, n_agents: int, records, dim: int, noise: float, seed: int,
                  test: int) -> pathlib.Path:
    data = synth_online(n_agents, records, dim, noise, seed, test=test)
    params = {"n_agents": n_agents,
              "records": _records_param([X.shape[0] for X, _ in data["agents"]]),
              "dim": dim, "flip": float(noise), "seed": int(seed), "test": int(test)}
    source = "mpi_dp.data.synth.synth_online(" + ", ".join(
        f"{k}={v!r}" for k, v in params.items()) + ")"
    return write_shards(path, data["agents"], task="binary",
                        feature_names=[f"x{j}" for j in range(dim)], source=source,
                        attrs={"synth": params}, test_global=data["test"],
                        public_extra={"w_true": data["w_true"]})


def _write_multiclass(path, n_agents: int, records, dim: int, noise: float, seed: int,
                      test: int, classes: int = 4) -> pathlib.Path:
    data = synth_multiclass(n_agents, records, dim, noise, seed, classes=classes, test=test)
    params = {"n_agents": n_agents,
              "records": _records_param([X.shape[0] for X, _ in data["agents"]]),
              "dim": dim, "noise": float(noise), "seed": int(seed), "classes": int(classes),
              "test": int(test)}
    source = "mpi_dp.data.synth.synth_multiclass(" + ", ".join(
        f"{k}={v!r}" for k, v in params.items()) + ")"
    return write_shards(path, data["agents"], task="multiclass",
                        feature_names=[f"x{j}" for j in range(dim)], source=source,
                        attrs={"synth": params}, test_global=data["test"])


# ----------------------------------------------------------------------------------------------
# personalised P2P (spec personalized-p2p §5, "Synthetic linear classification")

#: Connectivity test of the thresholded graph: Laplacian lambda_2 above this.
P2P_LAMBDA2_TOL = 1e-3
P2P_NORMALISE = ("l1", "none")


class P2PInstance(NamedTuple):
    """A personalised-P2P instance: graph, per-agent train and test sets, agent targets."""

    W: sp.csr_matrix  # (n, n) symmetric, zero diagonal, kernel weights of the kept edges
    train: list[tuple[np.ndarray, np.ndarray]]  # agent i's (X (m_i, p), y (m_i,) in {-1, +1})
    test: list[tuple[np.ndarray, np.ndarray]]  # agent i's (X_test, y_test)
    targets: np.ndarray  # (n, 2): s_i, labels are sign(s_i^T x[:2]) before flipping


def p2p_targets(n: int, seed: int) -> np.ndarray:
    """Targets s_i ~ N(0, 1/2 I_2), s_i from stream (seed, "graph", i): (n, 2)."""
    return np.array([np.sqrt(0.5) * rng.stream(seed, "graph", i).standard_normal(2)
                     for i in range(n)]).reshape(n, 2)


#: entries of one block of kernel rows in `p2p_graph` (64 MiB of float64): up to sqrt(2^23) = 2896
#: agents the block is the whole matrix, computed exactly as `p2p_kernel` does
P2P_KERNEL_BLOCK = 2**23


def _unit_targets(targets: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(targets, axis=1)
    if np.any(norms == 0):
        raise DataError(f"p2p: agent(s) {np.flatnonzero(norms == 0).tolist()} have a zero target")
    return targets / norms[:, None]


def p2p_kernel(targets: np.ndarray, gamma: float = 0.1) -> np.ndarray:
    """Dense W_ij = exp((cos(phi_ij) - 1) / gamma), phi_ij the angle between s_i and s_j; the
    diagonal is 0."""
    u = _unit_targets(targets)
    K = np.exp((np.clip(u @ u.T, -1.0, 1.0) - 1.0) / gamma)
    np.fill_diagonal(K, 0.0)
    return K


def _kernel_blocks(u: np.ndarray, gamma: float, block: int = P2P_KERNEL_BLOCK):
    """Rows lo:hi of `p2p_kernel` (diagonal 0) for near-equal blocks of rows of at most `block`
    entries: yields (lo, K[lo:hi]). One block is the whole matrix, computed as `p2p_kernel` does
    (u @ u.T); more blocks take u[lo:hi] @ u.T (BLAS gives the same bits for blocks of many rows
    of a large matrix, checked at 10^4 agents; the graph's structure does not hinge on them)."""
    n = u.shape[0]
    parts = max(1, -(-n * n // block))
    base, extra = divmod(n, parts)
    lo = 0
    for q in range(parts):
        hi = lo + base + (1 if q < extra else 0)
        Kb = (u if parts == 1 else u[lo:hi]) @ u.T
        np.clip(Kb, -1.0, 1.0, out=Kb)  # p2p_kernel's operations, in place
        Kb -= 1.0
        Kb /= gamma
        np.exp(Kb, out=Kb)
        Kb[np.arange(hi - lo), np.arange(lo, hi)] = 0.0
        yield lo, Kb
        lo = hi


def p2p_graph(targets: np.ndarray, gamma: float = 0.1,
              tol: float = P2P_LAMBDA2_TOL) -> tuple[sp.csr_matrix, float, int]:
    """The sparsest connected thresholding of `p2p_kernel`: over thr = max(W) 10^(-k/2),
    k = 1, 2, ..., keep W_ij > thr for the first k whose Laplacian has lambda_2 > tol.

    Returns (W as CSR with sorted indices, thr, k).

    The kernel is never held whole beyond P2P_KERNEL_BLOCK entries: one pass over blocks of rows
    finds max and min W, one pass per threshold keeps the pairs above it (a sparse W). A graph
    whose threshold leaves it disconnected has lambda_2 = 0 (connected components decide, no
    eigenvalue); a connected one gets `laplacian_lambda2` (dense LAPACK up to
    graphs.LAMBDA2_DENSE_MAX agents, sparse Lanczos above): the same W, thr and k as thresholding
    the dense kernel and taking the dense lambda_2 of every candidate.
    """
    n = targets.shape[0]
    if n < 2:
        raise DataError(f"p2p: a graph needs at least 2 agents, got {n}")
    u = _unit_targets(targets)
    wmax, wmin = -np.inf, np.inf
    for lo, Kb in _kernel_blocks(u, gamma):
        rows = np.arange(Kb.shape[0])
        wmax = max(wmax, float(Kb.max()))  # the diagonal's 0 is never above an off-diagonal max
        Kb[rows, lo + rows] = np.inf
        wmin = min(wmin, float(Kb.min()))
    if not wmax > 0:
        raise DataError(f"p2p: every kernel weight underflows to 0 at gamma = {gamma}; use a "
                        "larger gamma")
    k = 0
    while True:
        k += 1
        thr = wmax * 10.0 ** (-k / 2)
        W = _threshold_graph(u, gamma, thr, n)
        lam2 = laplacian_lambda2(W) if connected_components(W, directed=False)[0] == 1 else 0.0
        if lam2 > tol:
            return W, thr, k
        if thr < wmin:  # every pair kept and still not connected enough
            deg = np.asarray(W.sum(axis=1)).ravel()
            raise DataError(f"p2p: even the complete kernel graph has Laplacian lambda_2 = "
                            f"{lam2:.3g} <= {tol} (agent {int(np.argmin(deg))} "
                            f"has total weight {deg.min():.3g}); use another seed, more agents "
                            f"or a larger gamma than {gamma}")


def _threshold_graph(u: np.ndarray, gamma: float, thr: float, n: int) -> sp.csr_matrix:
    """The symmetric CSR (sorted indices) of the kernel entries > thr (thr > 0): each pair's
    value from the upper triangle, mirrored."""
    ii, jj, ww = [], [], []
    for lo, Kb in _kernel_blocks(u, gamma):
        r, c = np.nonzero(Kb > thr)
        up = c > lo + r
        r, c = r[up] + lo, c[up]
        ii.append(r)
        jj.append(c)
        ww.append(Kb[r - lo, c])
    i, j, w = np.concatenate(ii), np.concatenate(jj), np.concatenate(ww)
    W = sp.csr_matrix((np.concatenate([w, w]), (np.concatenate([i, j]), np.concatenate([j, i]))),
                      shape=(n, n))
    W.sum_duplicates()
    W.sort_indices()
    return W


def _p2p_records(g: np.random.Generator, m: int, s: np.ndarray, p: int, flip: float,
                 normalise: str) -> tuple[np.ndarray, np.ndarray]:
    """m records: x ~ N(0, 1/2 I_p), y = sign(s^T x[:2]) (0 -> +1), each flipped w.p. flip."""
    X = np.sqrt(0.5) * g.standard_normal((m, p))
    y = np.where(X[:, :2] @ s >= 0.0, 1.0, -1.0)
    y[g.random(m) < flip] *= -1.0
    if normalise == "l1":  # label-preserving: labels depend only on the sign of s^T x[:2]
        X /= np.abs(X).sum(axis=1)[:, None]
    return X, y


def p2p_instance(n: int = 100, p: int = 100, seed: int = 0, *, min_records: int = 10,
                 max_records: int = 100, test_records: int = 100, flip: float = 0.05,
                 gamma: float = 0.1, normalise: str = "l1") -> P2PInstance:
    """Synthetic linear classification of the personalised P2P paper (spec §5).

    Targets come from streams (seed, "graph", i); agent i's data from (seed, "data", i), whose
    SeedSequence is spawned into three children: m_i ~ UniformInt[min_records, max_records], the
    train records, the test records. So agent i's data depends only on the seed, i and the
    options, never on n, and its test set not on m_i. normalise="l1" divides every x by its L1
    norm (spec §5.5 "sound" mode: ||x||_2 <= ||x||_1 = 1).
    """
    _p2p_check(n, p, seed, min_records, max_records, test_records, flip, gamma, normalise)
    return _p2p_instance(n, p, seed, min_records, max_records, test_records, flip, gamma,
                         normalise)[0]


def _p2p_check(n: int, p: int, seed: int, min_records: int, max_records: int,
               test_records: int, flip: float, gamma: float, normalise: str) -> None:
    if n < 2 or p < 2:
        raise DataError(f"p2p: needs at least 2 agents and 2 features, got n={n}, p={p}")
    if not 1 <= min_records <= max_records:
        raise DataError(f"p2p: need 1 <= min_records <= max_records, got {min_records}, "
                        f"{max_records}")
    if test_records < 1:
        raise DataError(f"p2p: test_records must be at least 1, got {test_records}")
    if not 0 <= flip < 0.5:
        raise DataError(f"p2p: the label flip probability must be in [0, 0.5), got {flip}")
    if not (np.isfinite(gamma) and gamma > 0):
        raise DataError(f"p2p: gamma must be positive, got {gamma}")
    if normalise not in P2P_NORMALISE:
        raise DataError(f"p2p: normalise must be one of {list(P2P_NORMALISE)}, got {normalise!r}")
    if seed < 0:
        raise DataError(f"seed must be non-negative, got {seed}")


def _p2p_instance(n: int, p: int, seed: int, min_records: int, max_records: int,
                  test_records: int, flip: float, gamma: float, normalise: str
                  ) -> tuple[P2PInstance, float, int]:
    """`p2p_instance` (checked arguments) with the graph's threshold and k."""
    targets = p2p_targets(n, seed)
    W, thr, k = p2p_graph(targets, gamma)
    train, test = [], []
    for i in range(n):
        g_m, g_tr, g_te = (np.random.Generator(np.random.PCG64(c))
                           for c in rng.seed_sequence(seed, "data", i).spawn(3))
        m = int(g_m.integers(min_records, max_records + 1))
        train.append(_p2p_records(g_tr, m, targets[i], p, flip, normalise))
        test.append(_p2p_records(g_te, test_records, targets[i], p, flip, normalise))
    return P2PInstance(W, train, test, targets), thr, k


def write_p2p(path: str | os.PathLike[str], n: int = 100, p: int = 100, seed: int = 0,
              **kw: Any) -> pathlib.Path:
    """Write `p2p_instance(n, p, seed, **kw)` as a shard file: per-agent X, y, X_test, y_test;
    /public/graph_edges, graph_weights (see mpi_dp.data.shard_graph) and targets; the generator's
    options in the "synth" attribute (with the range and total of the record counts: each
    agent's own count is its group's "n") and the threshold in the "graph" attribute."""
    defaults = {"min_records": 10, "max_records": 100, "test_records": 100, "flip": 0.05,
                "gamma": 0.1, "normalise": "l1"}
    unknown = sorted(set(kw) - set(defaults))
    if unknown:
        raise TypeError(f"write_p2p got unexpected option(s) {unknown}")
    opts = {**defaults, **kw}
    _p2p_check(n, p, seed, **opts)
    inst, thr, k = _p2p_instance(n, p, seed, **opts)
    sizes = np.array([X.shape[0] for X, _ in inst.train], dtype=np.int64)
    params = {"n": n, "p": p, "seed": int(seed), **opts, "records_min": int(sizes.min()),
              "records_max": int(sizes.max()), "records_total": int(sizes.sum())}
    graph = {"kernel": "exp((cos(phi_ij) - 1) / gamma)", "gamma": float(opts["gamma"]),
             "threshold": thr, "k": k, "rule": "keep W_ij > max(W) 10^(-k/2), smallest k "
             f"with Laplacian lambda_2 > {P2P_LAMBDA2_TOL}",
             "lambda2": laplacian_lambda2(inst.W), "edges": int(inst.W.nnz // 2)}
    source = "mpi_dp.data.synth.p2p_instance(" + ", ".join(
        f"{key}={v!r}" for key, v in params.items() if not key.startswith("records")) + ")"
    return write_shards(path, inst.train, task="binary", test=inst.test,
                        feature_names=[f"x{j}" for j in range(p)], source=source,
                        attrs={"synth": params, "graph": graph},
                        public_extra={**graph_arrays(inst.W), "targets": inst.targets})


# ----------------------------------------------------------------------------------------------
# CLI: mpi-dp data synth


def _records_arg(text: str) -> int | list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected an integer or a comma-separated list of integers, got {text!r}"
        ) from None
    if not values:
        raise argparse.ArgumentTypeError("no record count given")
    return values[0] if len(values) == 1 and "," not in text else values


class _Given(argparse.Action):
    """Store the value and note the option as given (tasks with their own defaults need to know)."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:
        setattr(namespace, self.dest, values)
        namespace.given_options = {*getattr(namespace, "given_options", ()), self.dest}


#: the declared range of every numeric option of `mpi-dp data synth` (by dest)
SYNTH_RANGES: dict[str, Range] = {}


def add_synth_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the options of `mpi-dp data synth` to `parser`."""
    parser.description = (
        "Write a synthetic dataset as an HDF5 shard file, one group per data owner. Owner i's "
        "records depend only on --seed and i, so changing --agents or another owner's size leaves "
        "them unchanged. The true parameter is stored as /public/theta_true. A shard file is a "
        "result too: an existing --out is refused unless --overwrite, a number out of its range "
        "[...] is refused before anything is written, and under mpiexec or srun only rank 0 "
        "writes the file."
    )
    parser.add_argument(
        "--task", choices=SYNTH_TASKS, default="regression",
        help="regression: y = X theta + noise*N(0,1); binary: y = sign(X theta + noise*N(0,1)) in "
        "{-1,+1}, with a constant bias column appended; multiclass: --classes centroids in "
        "[0,1]^dim, x = clip(centroid + noise*N(0,I), 0, 1), a global test set of --public "
        "records; online: the DOLA stream (seed 003): owner-specific shifts, rows of norm <= 1, "
        "labels sign(<w_true, x>) with a fraction --noise flipped, a test set of --public "
        "records; p2p: personalised P2P linear classification (targets s_i in R^2, kernel "
        "similarity graph /public/graph_edges, graph_weights, per-agent test sets of "
        "--test-records; y = sign(s_i^T x[:2]) with a fraction --noise flipped) "
        "(default: %(default)s)",
    )
    add_number(parser, "--classes", Range(int, 2), SYNTH_RANGES, default=4, metavar="K",
               help="multiclass: number of classes (default: %(default)s)")
    add_number(parser, "--agents", Range(int, 1), SYNTH_RANGES, default=3, metavar="N",
               action=_Given, help="number of data owners (default: %(default)s; p2p: 100)")
    parser.add_argument(
        "--records", type=_records_arg, default=1000, metavar="N[,N...]", action=_Given,
        help="records per owner: one integer for all owners, or a comma-separated list with one "
        "count per owner; not for p2p (default: %(default)s) [each an integer >= 1]",
    )
    SYNTH_RANGES["records"] = Range(int, 1)
    add_number(parser, "--dim", Range(int, 1), SYNTH_RANGES, default=5, action=_Given,
               help="number of features before any bias column (default: %(default)s; p2p: 100)")
    add_number(parser, "--noise", Range(float, 0), SYNTH_RANGES, default=0.5, action=_Given,
               help="standard deviation of the label noise; online and p2p: the label flip "
               "probability, below 0.5 (default: %(default)s; online and p2p: 0.05)")
    add_number(parser, "--seed", Range(int, 0), SYNTH_RANGES, default=0,
               help="random seed; same seed, same file (default: %(default)s)")
    add_number(parser, "--public", Range(int, 0), SYNTH_RANGES, default=10000, metavar="N",
               action=_Given,
               help="public hold-out records every agent and the learner may see, e.g. to set "
               "step sizes and the clipping bound; 0 for none; not for p2p (default: "
               "%(default)s)")
    g = parser.add_argument_group("p2p (personalised peer-to-peer, spec personalized-p2p §5)")
    add_number(g, "--min-records", Range(int, 1), SYNTH_RANGES, default=10, metavar="M",
               help="p2p: m_i ~ UniformInt[M, --max-records] (default: %(default)s)")
    add_number(g, "--max-records", Range(int, 1), SYNTH_RANGES, default=100, metavar="M",
               help="p2p: largest m_i (default: %(default)s)")
    add_number(g, "--test-records", Range(int, 1), SYNTH_RANGES, default=100, metavar="M",
               help="p2p: test records per agent (default: %(default)s)")
    add_number(g, "--gamma", Range(float, 0, lo_open=True), SYNTH_RANGES, default=0.1,
               help="p2p: kernel bandwidth, W_ij = exp((cos phi_ij - 1)/gamma) "
               "(default: %(default)s)")
    g.add_argument("--normalise", choices=P2P_NORMALISE, default="l1",
                   help="p2p: l1 divides every x by its L1 norm (labels unchanged; ||x||_1 = 1 "
                   "as the DP constant L0 = 1 needs); none keeps x ~ N(0, I/2) "
                   "(default: %(default)s)")
    parser.add_argument(
        "--out", type=pathlib.Path, required=True, metavar="PATH",
        help="shard file to write (parent directories are created; an existing file is refused "
        "unless --overwrite)",
    )
    parser.add_argument("--overwrite", action="store_true", help=OVERWRITE_HELP)


def _run_p2p(args: argparse.Namespace) -> pathlib.Path:
    given: set[str] = getattr(args, "given_options", set())
    wrong = sorted({"records", "public"} & given)
    if wrong:
        raise DataError(f"--task p2p takes no --{' / --'.join(wrong)}: it draws m_i ~ "
                        "UniformInt[--min-records, --max-records] and --test-records per agent")
    n = args.agents if "agents" in given else 100
    p = args.dim if "dim" in given else 100
    flip = args.noise if "noise" in given else 0.05
    start = time.perf_counter()
    path = write_p2p(args.out, n, p, args.seed, min_records=args.min_records,
                     max_records=args.max_records, test_records=args.test_records, flip=flip,
                     gamma=args.gamma, normalise=args.normalise)
    with ShardFile(path) as f:
        sizes = f.sizes()
        graph = f.json_attr("graph")
    print(f"wrote {path}: p2p, {n} agents x {sizes.min()}..{sizes.max()} records (total "
          f"{int(sizes.sum())}) + {args.test_records} test, {p} features, flip {flip:g}, "
          f"normalise {args.normalise}; graph {graph['edges']} edges (threshold "
          f"{graph['threshold']:.3g}, k={graph['k']}, lambda_2 {graph['lambda2']:.3g}); "
          f"{path.stat().st_size / 2**20:.2f} MiB in {time.perf_counter() - start:.2f} s")
    return path


def run_synth_command(args: argparse.Namespace) -> pathlib.Path | None:
    """Run `mpi-dp data synth` from parsed arguments; prints a short summary, returns the path.
    Ranges and --out are checked first; under mpiexec/srun only rank 0 works (others: None)."""
    if launcher_rank() != 0:
        return None
    check_ranges(args, SYNTH_RANGES)
    refuse_existing(args.out, args.overwrite, "data synth")
    if args.task == "p2p":
        return _run_p2p(args)
    start = time.perf_counter()
    extra = {"classes": args.classes} if args.task == "multiclass" else {}
    noise = args.noise
    if args.task == "online" and "noise" not in getattr(args, "given_options", set()):
        noise = ONLINE_FLIP  # a flip probability, not --noise's default standard deviation
    path = write_synth(
        args.out, args.task, args.agents, args.records, args.dim, noise, args.seed,
        public=args.public, **extra,
    )
    seconds = time.perf_counter() - start
    sizes = _records_list(args.agents, args.records)
    per_agent = str(sizes[0]) if len(set(sizes)) == 1 else ",".join(map(str, sizes))
    p = args.dim + (1 if args.task == "binary" else 0)
    size_mib = path.stat().st_size / 2**20
    print(
        f"wrote {path}: {args.task}, {args.agents} agents x {per_agent} records, {p} features, "
        + (f"flip {noise:g}, test {args.public}" if args.task == "online" else
           f"public {args.public}") + f"; {size_mib:.2f} MiB in {seconds:.2f} s"
    )
    return path
