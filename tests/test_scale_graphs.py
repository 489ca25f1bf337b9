"""The graph methods at many agents (issue 15 item 4): the blocked, sparse constructions equal
the dense ones they replace, and 2,000-agent instances are built and run.

Reference implementations here are the code the blocked/vectorised versions replaced, kept as
they were, so a change of results shows up as a difference."""

from __future__ import annotations

import math

import h5py
import numpy as np
import pytest
import scipy.sparse as sp
from helpers import mpi_run, read_datasets, write_job

from mpi_dp import rng
from mpi_dp.agent_graph import Graph
from mpi_dp.comm import topology as tp
from mpi_dp.data import shard_graph, synth
from mpi_dp.data.shards import ShardFile
from mpi_dp.errors import DataError
from mpi_dp.p2p import coordinate_descent, objective, reference


def _dense_p2p_graph(targets, gamma=0.1, tol=synth.P2P_LAMBDA2_TOL):
    """p2p_graph as it was: the dense kernel thresholded, dense lambda_2 of every candidate."""
    n = targets.shape[0]
    K = synth.p2p_kernel(targets, gamma)
    off = K[~np.eye(n, dtype=bool)]
    wmax, wmin = float(off.max()), float(off.min())
    k = 0
    while True:
        k += 1
        thr = wmax * 10.0 ** (-k / 2)
        A = np.where(K > thr, K, 0.0)
        L = np.diag(A.sum(axis=1)) - A
        if float(np.linalg.eigvalsh(L)[1]) > tol:
            W = sp.csr_matrix(A)
            W.sort_indices()
            return W, thr, k
        if thr < wmin:
            return None, thr, k


def _same_csr(a, b):
    return (a.shape == b.shape and a.indices.dtype == b.indices.dtype
            and np.array_equal(a.indptr, b.indptr) and np.array_equal(a.indices, b.indices)
            and a.data.tobytes() == b.data.tobytes())


@pytest.mark.parametrize("n", [50, 120, 300])
@pytest.mark.parametrize("gamma", [0.1, 0.03])
def test_p2p_graph_equals_the_dense_thresholding(n, gamma):
    """W, thr and k bit for bit, over seeds where the first threshold is (or is not) connected,
    and the same refusal where no threshold is."""
    ks = set()
    for seed in range(4):
        t = synth.p2p_targets(n, seed)
        W0, thr0, k0 = _dense_p2p_graph(t, gamma)
        if W0 is None:
            with pytest.raises(DataError, match="complete kernel graph"):
                synth.p2p_graph(t, gamma)
            continue
        W, thr, k = synth.p2p_graph(t, gamma)
        assert (thr, k) == (thr0, k0) and _same_csr(W, W0), (n, gamma, seed)
        assert W.has_sorted_indices and W.has_canonical_format
        ks.add(k)
    if (n, gamma) == (50, 0.03):
        assert max(ks) > 2  # thresholds past the first ones are exercised


def test_p2p_graph_in_row_blocks_keeps_the_graph(monkeypatch):
    """Above P2P_KERNEL_BLOCK entries the kernel is computed in blocks of rows (BLAS may round
    a block's entries apart from the whole matrix's in the last bit): the same pairs, threshold
    and k, the same weights to rounding."""
    t = synth.p2p_targets(400, 1)
    W0, thr0, k0 = synth.p2p_graph(t, 0.05)
    monkeypatch.setattr(synth, "P2P_KERNEL_BLOCK", 400 * 37)  # 11 blocks of 36 or 37 rows
    W, thr, k = synth.p2p_graph(t, 0.05)
    assert (thr, k) == (thr0, k0)
    assert np.array_equal(W.indptr, W0.indptr) and np.array_equal(W.indices, W0.indices)
    np.testing.assert_allclose(W.data, W0.data, rtol=1e-13)
    assert (W != W.T).nnz == 0


def test_sparse_lambda2_equals_the_dense_one():
    for n, seed in [(300, 0), (700, 1)]:
        W, _, _ = synth.p2p_graph(synth.p2p_targets(n, seed))
        dense = shard_graph.laplacian_lambda2(W, method="dense")
        assert shard_graph.laplacian_lambda2(W, method="sparse") == pytest.approx(dense, rel=1e-9)
        g = tp.geometric(n, 12.0, seed)
        dense = shard_graph.laplacian_lambda2(g.adjacency, method="dense")
        assert dense < 0.2  # a poorly connected graph: lambda_2 small against lambda_max
        assert shard_graph.laplacian_lambda2(g.adjacency, method="sparse") == pytest.approx(
            dense, rel=1e-8)
    two = sp.block_diag([tp.ring(30).adjacency, tp.ring(40).adjacency], format="csr")
    assert shard_graph.laplacian_lambda2(two, method="sparse") == 0.0
    assert shard_graph.laplacian_lambda2(two, method="dense") < 1e-10
    assert shard_graph.laplacian_lambda2(sp.csr_matrix((1, 1)), method="sparse") == 0.0
    big = tp.ring(shard_graph.LAMBDA2_DENSE_MAX + 1).adjacency  # "auto" goes sparse above the bound
    m = big.shape[0]
    assert shard_graph.laplacian_lambda2(big) == pytest.approx(2 - 2 * math.cos(2 * math.pi / m),
                                                               rel=1e-6)


def test_a_2000_agent_p2p_instance_is_built(tmp_path):
    n = 2000
    path = synth.write_p2p(tmp_path / "p2k.h5", n, 3, 4, max_records=12, test_records=2)
    with ShardFile(path) as f:
        assert f.n_agents == n
        sizes = f.sizes()
        params, info = f.json_attr("synth"), f.json_attr("graph")
        W = shard_graph.read_graph(f)  # connected, checked
    assert "records" not in params  # no per-agent list in an attribute (capped at 64 KiB)
    assert (params["records_min"], params["records_max"], params["records_total"]) == (
        int(sizes.min()), int(sizes.max()), int(sizes.sum()))
    assert sizes.min() >= 10 and sizes.max() <= 12
    assert info["lambda2"] > synth.P2P_LAMBDA2_TOL and info["edges"] == W.nnz // 2
    W0, thr, k = synth.p2p_graph(synth.p2p_targets(n, 4))
    assert (info["threshold"], info["k"]) == (thr, k) and _same_csr(W, W0)
    with h5py.File(path, "r") as f:  # no root attribute grows with the agents
        sizes = {k: len(v.encode()) if isinstance(v, str) else np.asarray(v).nbytes
                 for k, v in f.attrs.items()}
    assert max(sizes.values()) < 4096, sizes


def test_erdos_renyi_in_blocks_draws_what_one_draw_did(monkeypatch):
    for m, p in [(2, 0.9), (9, 0.5), (150, 0.05)]:
        i, j = np.triu_indices(m, k=1)
        keep = rng.stream(3, "graph", 0, 0).random(i.size) < p
        want = np.stack([i[keep], j[keep]], axis=1)
        for block in (1, 7, 1000):
            monkeypatch.setattr(tp, "ER_PAIRS_BLOCK", block)
            got = tp._er_edges(m, p, rng.stream(3, "graph", 0, 0))
            assert got.dtype == np.int64 and np.array_equal(got, want), (m, block)
    g = tp.make_graph("erdos_renyi", 60, 5)
    assert g.is_connected() and g.info["attempt"] >= 0


def _bisected_radius_as_it_was(m, degree, seed, attempt):
    from scipy.spatial import cKDTree

    pts = rng.stream(seed, "graph", 0, attempt).random((m, 2))
    tree = cKDTree(pts)
    lo, hi = 0.0, math.sqrt(2.0)
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        if (tree.count_neighbors(tree, mid) - m) / 2 >= degree * m / 2.0:
            hi = mid
        else:
            lo = mid
    return hi


@pytest.mark.parametrize("m, degree", [(5, 2.0), (64, 10.0), (300, 4.5), (2000, 24.0)])
def test_geometric_radius_is_the_counted_bisection(m, degree, monkeypatch):
    """The bisection takes its side from the sorted pair distances away from the crossing and
    counts with the k-d tree near it: the radius (hence the graph) of counting at every step."""
    calls = []

    class Counting(tp.cKDTree):
        def count_neighbors(self, *a, **k):
            calls.append(1)
            return super().count_neighbors(*a, **k)

    for seed in range(2):
        want = _bisected_radius_as_it_was(m, degree, seed, 0)
        monkeypatch.setattr(tp, "MAX_ATTEMPTS", 1)
        monkeypatch.setattr(tp, "CONNECT_MARGIN", math.inf)  # bisect even a disconnected one
        monkeypatch.setattr(tp, "cKDTree", Counting)
        try:
            g = tp.geometric(m, degree, seed)
        except tp.JobError:  # attempt 0 not connected: compare the radius on its own
            g = None
        monkeypatch.undo()
        if g is not None:
            assert g.info["radius"] == want and g.info["attempt"] == 0
            assert np.array_equal(g.edges, np.unique(tp._pairs_within(g.positions, want), axis=0))
    assert 0 < len(calls) < 2 * 60  # fewer tree counts than one per step


def _levels_as_they_were(schedule, keep, W, record_every):
    """cut_rounds' 'levels' packing with per-agent Python neighbour lists (the replaced code)."""
    agents = schedule[keep]
    seg = np.asarray(keep) // record_every if record_every else np.zeros(len(keep), np.int64)
    nbrs = [W.indices[W.indptr[i]:W.indptr[i + 1]].tolist() for i in range(W.shape[0])]
    last, top, base = [-1] * W.shape[0], -1, 0
    level = np.empty(len(agents), dtype=np.int64)
    for pos, i in enumerate(agents.tolist()):
        if pos > 0 and seg[pos] != seg[pos - 1]:
            base, last = top + 1, [-1] * W.shape[0]
        lv = last[i]
        for j in nbrs[i]:
            lv = max(lv, last[j])
        lv = base if lv < 0 else lv + 1
        last[i] = lv
        level[pos] = lv
        top = max(top, lv)
    return level


@pytest.mark.parametrize("n, record_every", [(40, 0), (150, 37)])
def test_cut_rounds_levels_are_the_per_agent_ones(n, record_every):
    W, _, _ = synth.p2p_graph(synth.p2p_targets(n, 2))
    g = Graph.from_weights(W)
    schedule = coordinate_descent.global_schedule(5, n, 25 * n)
    keep = coordinate_descent.effective_ticks(schedule, n, [20] * n)
    level = _levels_as_they_were(schedule, keep, W, record_every)
    r = coordinate_descent.cut_rounds(schedule, keep, g, record_every)
    order = np.argsort(level, kind="stable")
    assert np.array_equal(r.agents, schedule[keep][order])
    assert np.array_equal(r.starts, np.searchsorted(level[order], np.arange(level.max() + 2)))


def _newton_as_it_was(X, y, lam, tol=reference.GRAD_TOL, max_iter=200):
    """_weighted_newton for one agent without the stop at an exact fixed point; also returns
    whether it ran all max_iter iterations."""
    p = X.shape[1]
    ew = np.full(X.shape[0], 1.0 / X.shape[0])

    def fgh(theta, hess):
        z = y * (X @ theta)
        f = float(ew @ np.logaddexp(0.0, -z)) + lam * float(theta @ theta)
        s = objective._sigmoid_neg(z)
        g = X.T @ (-ew * y * s) + 2.0 * lam * theta
        H = (X.T * (ew * s * (1.0 - s))) @ X + 2.0 * lam * np.eye(p) if hess else None
        return f, g, H

    theta = np.zeros(p)
    f, g, H = fgh(theta, True)
    for _ in range(max_iter):
        if np.max(np.abs(g), initial=0.0) <= tol:
            return theta, False
        d = -reference._solve_spd(H, g)
        t, slope = 1.0, float(g @ d)
        while t > 1e-12:
            f_new, _, _ = fgh(theta + t * d, False)
            if f_new <= f + 1e-4 * t * slope:
                break
            t *= 0.5
        else:
            return theta, False
        theta = theta + t * d
        f, g, H = fgh(theta, True)
    return theta, True


def test_local_models_stop_at_a_fixed_point_with_the_same_answer():
    """Agents whose gradient stalls above tol at rounding level used to run all 200 Newton
    iterations on one unchanging state; the stop there returns the same bits."""
    inst = synth.p2p_instance(300, 10, 1)
    stalled = 0
    for X, y in inst.train:
        lam = 1.0 / X.shape[0]
        want, ran_out = _newton_as_it_was(X, y, lam)
        assert reference.local_model("logistic", X, y, lam).tobytes() == want.tobytes()
        stalled += ran_out
    assert stalled > 0  # the stop was exercised


def test_smooth_term_in_blocks_sums_the_same_edges(monkeypatch):
    W, _, _ = synth.p2p_graph(synth.p2p_targets(200, 3))
    g = Graph.from_weights(W)
    Th = np.random.default_rng(0).standard_normal((3, 200, 5))
    whole = objective.smooth_term(g, Th)
    monkeypatch.setattr(objective, "SMOOTH_BLOCK", 97)
    g2 = Graph.from_weights(W, symmetric=True)
    np.testing.assert_allclose(objective.smooth_term(g2, Th), whole, rtol=1e-13)


@pytest.mark.parametrize("method", ["dola", "p2p"])
def test_a_2000_agent_job_runs_and_is_rank_invariant(tmp_path, method):
    """2,000 agents on 1 and 3 ranks: the job runs, writes per-agent results as datasets and
    every dataset is the same bits on both layouts (graph built on rank 0, records and sizes
    read by the ranks hosting them, local models solved where the peers are)."""
    n = 2000
    if method == "dola":
        data = synth.write_synth(tmp_path / "on.h5", "online", n, 6, 4, 0.05, 3, public=100)
        job = write_job(tmp_path / "d.toml", data, algorithm="dola", T=4, runs=2,
                        record_every=2, seed=5, eps=1.0, dola={"graph": "medium"})
        per_agent = "privacy/ledger"
    else:
        data = synth.write_p2p(tmp_path / "p.h5", n, 3, 4, max_records=12, test_records=3)
        job = write_job(tmp_path / "p.toml", data, algorithm="p2p", T=600, runs=2, seed=7,
                        record_every=300, eps=1.0, p2p={"mu": 1.0, "reference": "none"})
        per_agent = "per_agent/test_metric_local"
    out = {}
    for ranks in (1, 3):
        out[ranks] = tmp_path / f"{method}_{ranks}.h5"
        cp = mpi_run(ranks, ["run", str(job), "--out", str(out[ranks]), "--quiet"])
        assert cp.returncode == 0, cp.stderr
    a, b = read_datasets(out[1]), read_datasets(out[3])
    assert sorted(a) == sorted(b) and a[per_agent].shape[0] == n
    for k in a:
        assert a[k].tobytes() == b[k].tobytes(), k
    with h5py.File(out[3], "r") as f:
        if method == "p2p":
            assert np.isfinite(f.attrs["Q_loc"]) and f.attrs["n_peers"] == n


def test_the_private_warm_start_is_solved_once_and_rank_invariant(tmp_path, monkeypatch):
    """Algorithm 4's model propagation is solved on rank 0 and broadcast: the same models on
    1 and 3 ranks (and a sparse LU below MP_DIRECT_NNZ graph entries, CG above: close)."""
    data = synth.write_synth(tmp_path / "p.h5", "p2p", 30, 0, 4, 0.05, 2)
    job = write_job(tmp_path / "w.toml", data, algorithm="p2p", T=120, runs=2, seed=3,
                    record_every=60, eps=1.0, p2p={"mu": 1.0, "init": "private_ws"})
    got = []
    for ranks in (1, 3):
        out = tmp_path / f"w{ranks}.h5"
        cp = mpi_run(ranks, ["run", str(job), "--out", str(out), "--quiet"])
        assert cp.returncode == 0, cp.stderr
        got.append(read_datasets(out))
    assert all(got[0][k].tobytes() == got[1][k].tobytes() for k in got[0])
    with ShardFile(data) as f:
        W = shard_graph.read_graph(f)
        m = f.sizes()
    P = objective.make_problem(W, [np.zeros((1, 4))] * 30, [np.zeros(1)] * 30, "logistic", 0.5,
                               1.0 / m, m=m, smooth="bound")
    loc = np.random.default_rng(0).standard_normal((30, 4))
    lu = reference.mp_solution(P, loc)
    monkeypatch.setattr(reference, "MP_DIRECT_NNZ", 0)
    np.testing.assert_allclose(reference.mp_solution(P, loc), lu, rtol=1e-10, atol=1e-12)


def test_logistic_polish_without_the_hessian_matrix_equals_the_direct_one(monkeypatch):
    """Above POLISH_DIRECT_NNZ the logistic Theta* polish applies the Hessian as an operator
    (Laplacian x I_p + the agents' p x p blocks) with block-Jacobi CG: the operator equals the
    sparse Hessian on any vector, its diagonal blocks are the matrix's, and Theta* equals the
    direct solve's."""
    from test_p2p_cd import logistic_problem

    P = logistic_problem(n=30, p=4, seed=2)
    fg, hess = reference._logistic_parts(P)
    v = np.random.default_rng(0).standard_normal(30 * 4)
    H, d1 = hess(v, True)
    op, d2 = hess(v, False)
    r = np.random.default_rng(1).standard_normal(30 * 4)
    np.testing.assert_allclose(op @ r, H @ r, rtol=1e-12, atol=1e-12)
    np.testing.assert_array_equal(d1, d2)
    dense = H.toarray()
    for i in range(30):
        np.testing.assert_allclose(d1[i], dense[4 * i:4 * i + 4, 4 * i:4 * i + 4], rtol=1e-14)
    direct, q_direct = reference.theta_star(P, "scipy")
    monkeypatch.setattr(reference, "POLISH_DIRECT_NNZ", 0)
    calls = []
    newton_cg = reference._newton_cg
    monkeypatch.setattr(reference, "_newton_cg", lambda *a: calls.append(1) or newton_cg(*a))
    cg, q_cg = reference.theta_star(P, "scipy")
    assert calls  # the polish ran through the operator
    np.testing.assert_allclose(cg, direct, rtol=1e-8, atol=1e-10)
    assert q_cg == pytest.approx(q_direct, rel=1e-12)


@pytest.mark.parametrize("m, degree, seed", [(1000, 10.0, 1), (400, 8.0, 3), (120, 6.0, 0)])
def test_geometric_connectivity_precheck_keeps_the_graph(m, degree, seed, monkeypatch):
    """Rejecting an attempt whose graph at d* (1 + margin) is disconnected before bisecting
    skips only attempts the bisected graph would reject: the same attempt, radius and edges as
    with the pre-check off (an infinite margin: the complete graph, always connected)."""
    g = tp.geometric(m, degree, seed)
    monkeypatch.setattr(tp, "CONNECT_MARGIN", math.inf)
    want = tp.geometric(m, degree, seed)
    assert g.info == want.info and np.array_equal(g.edges, want.edges)
    assert g.info["attempt"] >= 1 or (m, seed) != (1000, 1)  # the first case resamples
