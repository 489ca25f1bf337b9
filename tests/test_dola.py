"""DOLA (seed 003): the validation checks of spec dp-distributed-online-learning §7, serial.

The vectorised simulator (algorithms.dola) is checked against a plain per-agent reference written
here from the spec's listings (dense A_t, one agent at a time), then the properties the spec asks
for are asserted on it. MPI runs are compared with the simulator in test_mpi_dola.py.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import scipy.sparse as sp
from dola_case import Case, contract
from scipy.sparse import csgraph
from scipy.stats import spearmanr

from mpi_dp import pcg, rng
from mpi_dp.algorithms import dola
from mpi_dp.comm import topology as tp
from mpi_dp.data.synth import synth_online
from mpi_dp.models.reference import svm_dual_cd
from mpi_dp.privacy import accountants, rules


# -- data and runs -------------------------------------------------------------------------------
def _data(m, T, n, seed=0, informative=None, h=1):
    d = synth_online(m, T * h, n, 0.05, seed, test=500, informative=informative)
    return d["agents"], d["test"]


def _reader(agents):
    return lambda a, s, e: (agents[a][0][s:e], agents[a][1][s:e])


def _w_star(agents, lam):
    X = np.concatenate([X for X, _ in agents])
    y = np.concatenate([y for _, y in agents])
    return svm_dual_cd(X, y, lam)


def _settings(m, T, n, **kw):
    lam = kw.pop("lam", 0.1)
    base = dict(variant="laplace", T=T, h=1, n_features=n, m=m, eps=(math.inf,) * m, lam=lam,
                radius=1 / math.sqrt(lam) if lam else 10.0, step="strong" if lam else "convex",
                seed=3, record_every=max(1, T // 10))
    base.update(kw)
    if not isinstance(base["eps"], tuple):
        base["eps"] = (float(base["eps"]),) * m
    return Case(**base)


def _run(s, graph, agents, w_star=None, test=None):
    recs = {}
    block = dola.simulate(s, contract(s), graph, _reader(agents), w_star, test,
                          on_record=lambda t, r: recs.__setitem__(t, r))
    return block, recs


@pytest.fixture(scope="module")
def ring8():
    m, T, n = 8, 4000, 10
    agents, test = _data(m, T, n)
    return m, T, n, agents, test, tp.make_graph("ring", m, 1), _w_star(agents, 0.1)


# -- 1. A_t --------------------------------------------------------------------------------------
GRAPHS = [("ring", 2), ("ring", 5), ("grid", 16), ("complete", 5), ("erdos_renyi", 16),
          ("medium", 16)]


@pytest.mark.parametrize("kind, m", GRAPHS)
@pytest.mark.parametrize("activation", tp.ACTIVATIONS)
@pytest.mark.parametrize("weights", tp.WEIGHTS)
def test_mixing_matrix_properties(kind, m, activation, weights):
    g = tp.make_graph(kind, m, 5)
    act = tp.EdgeActivation(g.edges, activation, 0.5, 10, 11)
    # each agent alone, as the rank hosting it would (its own tracked edges and activation)
    alone = []
    for i in range(m):
        tr = tp.tracked_edges(g, np.array([i]), weights == "mh_active")
        alone.append((tp.MixingRows(g, np.array([i]), tr, weights),
                      tp.EdgeActivation(tr, activation, 0.5, 10, 11)))
    eta = 1.0 / (1 + g.degrees.max())
    support = g.adjacency.toarray() > 0
    window = []
    for _ in range(500):
        active = act.step()
        A = tp.dense_matrix(g, active, weights)
        assert np.max(np.abs(A.sum(axis=1) - 1)) <= 1e-12
        assert np.max(np.abs(A.sum(axis=0) - 1)) <= 1e-12
        assert np.array_equal(A, A.T) and A.min() >= 0
        assert np.all(np.diag(A) > 0)
        off = A - np.diag(np.diag(A))
        assert np.all(off[off > 0] >= eta - 1e-15)
        assert not np.any((off > 0) & ~support)
        B = np.zeros_like(A)
        for i, (rows, a) in enumerate(alone):
            a_self, a_nbr = rows.weights_for(a.step())
            B[i, rows.nbr] = a_nbr
            B[i, i] = a_self[0]
        np.testing.assert_array_equal(B, A)  # rows computed apart assemble into the same A_t
        window.append(g.edges[active])
        if len(window) == 10:
            e = np.concatenate(window)
            union = sp.coo_matrix((np.ones(len(e)), (e[:, 0], e[:, 1])), shape=(m, m))
            assert csgraph.connected_components(union, directed=False)[0] == 1
            window.pop(0)


def test_mixing_rate_bound():
    g = tp.make_graph("ring", 16, 1)
    act = tp.EdgeActivation(g.edges, "hash", 0.5, 10, 7)
    c = tp.mixing_constants(16, 1.0 / 3.0, 10)
    Phi = np.eye(16)
    for K in range(1, 2001):
        Phi = tp.dense_matrix(g, act.step(), "mh_static") @ Phi
        if K in (10, 100, 500, 1000, 2000):
            assert np.abs(Phi - 1 / 16).max() <= c["theta"] * c["beta"] ** K
    assert np.abs(Phi - 1 / 16).max() <= 1e-6


def test_graph_generators_and_errors(tmp_path):
    for kind, deg in tp.RGG_DEGREE.items():
        g = tp.make_graph(kind, 64, 2)
        assert g.is_connected() and abs(g.mean_degree - deg) < 0.5
    f = tmp_path / "g.txt"
    f.write_text("0 1\n1 2\n# comment\n3 4\n")
    with pytest.raises(Exception, match="not connected"):
        tp.make_graph("from_file", 5, 0, path=str(f))
    f.write_text("0 1\n1 2\n2 7\n")
    with pytest.raises(Exception, match=r"ids must be in 0..4"):
        tp.make_graph("from_file", 5, 0, path=str(f))
    f.write_text("0 1\n1 2\n2 3\n3 4\n4 0\n0 1\n")
    assert len(tp.make_graph("from_file", 5, 0, path=str(f)).edges) == 5


# -- the simulator against a plain per-agent reference ----------------------------------------
def _plain(s, g, agents, w_star):
    """Spec §2 listings, one agent at a time, with the whole A_t (the reference)."""
    m, n, R = s.m, s.n_features, s.runs
    act = tp.EdgeActivation(g.edges, s.activation, s.p_act, s.window, s.seed)
    gens = [[rng.stream(s.seed, "noise", a, r) for r in s.run_ids] for a in range(m)]
    pub = np.zeros((m, R, n))
    W = np.zeros((m, R, n))
    loss_own = np.zeros((m, R))
    for t in range(s.T):
        A = tp.dense_matrix(g, act.step(), s.weights)
        alpha = dola.step_size(t + 1, s)
        new_pub = np.zeros_like(pub)
        for i in range(m):
            X, y = agents[i][0][t * s.h:(t + 1) * s.h], agents[i][1][t * s.h:(t + 1) * s.h]
            for r in range(R):
                b = A[i, i] * pub[i, r]
                for j in np.flatnonzero(A[i]):
                    if j != i:
                        b = b + A[i, j] * pub[j, r]
                if s.variant == "sparse":
                    E = dola.soft_threshold(b, alpha * s.rho)
                elif s.variant == "gaussian":
                    E = pub[i, r]
                else:
                    E = W[i, r]
                loss_own[i, r] += np.mean(np.maximum(0, 1 - y * (X @ E))) + 0.5 * s.lam * E @ E
                pt = E if s.variant == "sparse" else b
                gr = s.lam * pt + np.mean(np.where((y * (X @ pt) < 1)[:, None], -y[:, None] * X,
                                                   0.0), axis=0)
                eps = s.eps[i]
                if s.variant == "gaussian":
                    J = rules.gauss_std(s.gauss_mode, 2 / s.h, eps, s.delta, s.T)
                    z = pcg.generator_normal(gens[i][r], n) if J > 0 else 0.0
                    v = b - alpha * (gr + J * z)
                    nv = np.linalg.norm(v)
                    W[i, r] = v * min(1, s.radius / nv) if nv > 0 else v
                    new_pub[i, r] = W[i, r]
                    continue
                S = 2 * alpha * math.sqrt(n) * s.L_data / s.h
                if s.variant == "sparse":
                    W[i, r] = E
                    v = E - alpha * gr
                else:
                    v = b - alpha * gr
                    nv = np.linalg.norm(v)
                    W[i, r] = v = v * min(1, s.radius / nv) if nv > 0 else v
                noise = (S / eps) * pcg.generator_laplace(gens[i][r], n) if math.isfinite(eps) else 0.0
                new_pub[i, r] = v + noise
        pub = new_pub
    return W, pub, loss_own


@pytest.mark.parametrize("variant, eps, rho", [("laplace", 1.0, 0.0), ("gaussian", 0.5, 0.0),
                                               ("sparse", 5.0, 0.3), ("minibatch", 1.0, 0.0),
                                               ("laplace", math.inf, 0.0)])
def test_simulator_equals_plain_reference(variant, eps, rho):
    m, T, n = 6, 40, 5
    h = 3 if variant == "minibatch" else 1
    agents, _ = _data(m, T, n, h=h)
    g = tp.make_graph("erdos_renyi", m, 4, p=0.6)
    lam = 0.0 if variant == "sparse" else 0.2
    s = _settings(m, T, n, variant=variant, eps=eps, rho=rho, h=h, lam=lam, run_ids=(0, 3),
                  radius=1.0)
    block, _ = _run(s, g, agents)
    W, pub, loss = _plain(s, g, agents, None)
    np.testing.assert_allclose(block.W, W, rtol=0, atol=1e-12)
    np.testing.assert_allclose(block.Pub, pub, rtol=0, atol=1e-12)
    np.testing.assert_allclose(block.cum[0], loss, rtol=1e-12)


def test_csr_and_chunked_streams_match_dense():
    m, T, n = 5, 30, 8
    agents, _ = _data(m, T, n, h=2)
    sparse_agents = [(sp.csr_matrix(np.where(np.abs(X) > 0.1, X, 0.0)), y) for X, y in agents]
    dense_agents = [(Xs.toarray(), y) for Xs, y in sparse_agents]
    g = tp.make_graph("ring", m, 1)
    s = _settings(m, T, n, variant="minibatch", h=2, eps=1.0)
    ref, _ = _run(s, g, dense_agents)
    for data, chunk in ((sparse_agents, 4096), (sparse_agents, 5), (dense_agents, 3)):
        net = dola.LocalNet(g)
        block = dola.Block(s, contract(s), g, net,
                           dola.Stream(net.agents, s.h, s.T, n, _reader(data),
                                       chunk_records=chunk))
        dola.drive(block, None)
        np.testing.assert_allclose(block.Pub, ref.Pub, rtol=0, atol=1e-13)


# -- 3, 4, 8: consensus, regret, privacy monotonicity --------------------------------------------
def test_consensus_and_regret_decay_noise_off(ring8):
    m, T, n, agents, test, g, ws = ring8
    _, recs = _run(_settings(m, T, n), g, agents, ws, test)
    early, late = recs[T // 10], recs[T]
    assert late["spread"][0] <= 0.25 * early["spread"][0]
    assert late["regret"][0] <= 0.3 * early["regret"][0]
    assert late["regret"][0] / m <= 0.01
    assert late["test_error"][0] < 0.2  # w_hat learns (labels have 5% flips)


def test_consensus_and_regret_decay_convex_steps(ring8):
    m, T, n, agents, test, g, ws = ring8
    _, recs = _run(_settings(m, T, n, step="convex"), g, agents, ws)
    assert recs[T]["spread"][0] <= 0.6 * recs[T // 10]["spread"][0]
    assert recs[T]["regret"][0] <= 0.5 * recs[T // 10]["regret"][0]


def test_privacy_monotonicity(ring8):
    m, T, n, agents, test, g, ws = ring8
    finals = []
    for eps in (math.inf, 1.0, 0.1):
        _, recs = _run(_settings(m, T, n, eps=eps, run_ids=tuple(range(5))), g, agents, ws)
        finals.append(np.median(recs[T]["regret"]))
    assert finals[0] < finals[1] < finals[2]


def test_minibatch_beats_single_record_at_small_eps():
    """Spec §7 item 7: the same T rounds, h = 10 records per round (S / h)."""
    m, T, n, h = 8, 4000, 10, 10
    agents, _ = _data(m, T, n, h=h)
    g = tp.make_graph("ring", m, 1)
    runs = tuple(range(5))
    single = [(X[:T], y[:T]) for X, y in agents]
    _, r1 = _run(_settings(m, T, n, eps=0.1, run_ids=runs), g, single, _w_star(single, 0.1))
    s4 = _settings(m, T, n, variant="minibatch", h=h, eps=0.1, run_ids=runs)
    _, r4 = _run(s4, g, agents, _w_star(agents, 0.1))
    assert np.median(r4[T]["regret"]) <= 0.5 * np.median(r1[T]["regret"])


# -- 5, 6, 7: noise scales, sensitivity ------------------------------------------------------
def test_noise_scales_and_draw_statistics():
    assert dola.laplace_sensitivity(0.5, 10, 1.0) == pytest.approx(3.16228, abs=1e-5)
    assert dola.laplace_sensitivity(0.5, 10, 1.0, h=10) == dola.laplace_sensitivity(0.5, 10, 1) / 10
    m, T, n = 2, 200, 10
    agents, _ = _data(m, T, n)
    g = tp.make_graph("ring", m, 1)
    s = _settings(m, T, n, eps=1.0, run_ids=tuple(range(50)))
    draws, scales = [], []

    def spy(t, ids, pub):
        alpha = 1.0 / (s.lam * (t + 1))  # the release of round t uses alpha_{t+1}
        draws.append((pub - block.W) / (2 * alpha * math.sqrt(n)))
        scales.append(alpha)
    net = dola.LocalNet(g)
    block = dola.Block(s, contract(s), g, net, dola.Stream(net.agents, 1, T, n, _reader(agents)))
    block.on_release = spy
    dola.drive(block, None)
    z = np.concatenate([d.ravel() for d in draws])
    assert z.size >= 1e5
    assert abs(np.mean(np.abs(z)) - 1.0) <= 0.02
    ev = block.ledgers[0].event_counts()
    assert len(ev) == 1 and ev[0][0].eps == pytest.approx(1.0) and ev[0][1][0] == T
    # Gaussian: the noise that enters the step has std J
    J = rules.gauss_std("per_record", 2.0, 0.5, 1e-4, T)
    assert J == pytest.approx(2.0 * math.sqrt(2 * math.log(1.25 / 1e-4)) / 0.5)
    gen = rng.stream(0, "test")
    assert abs(np.std(J * gen.standard_normal(100_000)) / J - 1) <= 0.02
    lg = math.log(1e4)
    rho = (math.sqrt(lg + 1.0) - math.sqrt(lg)) ** 2
    assert rules.gauss_std("total_T", 2.0, 1.0, 1e-4, 100) == pytest.approx(
        2.0 * math.sqrt(100 / (2 * rho)))


@pytest.mark.parametrize("h", [1, 10])
def test_empirical_sensitivity_within_bound(h):
    gen = rng.stream(1, "test")
    n, lam = 20, 0.1
    r = 1 / math.sqrt(lam)
    alpha = 0.5
    S = dola.laplace_sensitivity(alpha, n, 1.0, h)
    worst, projected = 0.0, 0
    for _ in range(1000):
        b = gen.standard_normal(n)
        b *= r * gen.uniform(0.97, 1.03) / ((1 - alpha * lam) * np.linalg.norm(b))
        X = gen.standard_normal((h, n))
        X /= np.maximum(1, np.linalg.norm(X, axis=1))[:, None] / gen.uniform(0.5, 1, (h, 1))
        X2 = X.copy()
        X2[0] = gen.standard_normal(n)
        X2[0] /= max(1, np.linalg.norm(X2[0]))
        y = gen.choice([-1.0, 1.0], h)
        y2 = y.copy()
        y2[0] = -y[0]
        out = []
        for XX, yy in ((X, y), (X2, y2)):
            batch = dola.Batch(XX[None], yy[None], 1, h)
            B = b[None, None]
            G = dola.hinge_subgradient(batch, B, batch.dots(B) * yy[None, None]) + lam * B
            V = B - alpha * G
            projected += int(np.linalg.norm(V) > r)
            out.append(dola.project_ball(V, r)[0, 0])
        worst = max(worst, np.abs(out[0] - out[1]).sum())
    assert worst <= S + 1e-12
    assert projected > 0  # the projection was active in some pairs
    assert worst > 0.2 * S  # the bound is not vacuous here


# -- 9: sparsity -------------------------------------------------------------------------------
def test_soft_threshold_optimality_and_rho_for_sparsity():
    gen = rng.stream(2, "test")
    p = gen.standard_normal(200)
    tau = 0.4
    w = dola.soft_threshold(p, tau)
    nz = w != 0
    np.testing.assert_allclose(w[nz], p[nz] - tau * np.sign(w[nz]), atol=1e-12)
    assert np.all(np.abs(p[~nz]) <= tau + 1e-12)

    def obj(v):
        return 0.5 * np.sum((p - v) ** 2) + tau * np.abs(v).sum()
    assert all(obj(w) <= obj(w + 1e-3 * gen.standard_normal(200)) for _ in range(100))
    for s in (0.1, 0.436, 0.9):
        alpha = 0.25
        rho = dola.rho_for_sparsity(p, s, alpha)
        zeros = np.mean(dola.soft_threshold(p, alpha * rho) == 0)
        assert abs(zeros - s) <= 1 / p.size + 1e-12


def test_sparse_variant_sparsity_grows_with_rho_and_matches_private_rate():
    m, T, n = 8, 1000, 50
    agents, _ = _data(m, T, n, informative=10)
    g = tp.make_graph("ring", m, 1)
    rhos = [0, 0.01, 0.03, 0.1, 0.3, 1.0]
    spars = []
    for rho in rhos:
        _, recs = _run(_settings(m, T, n, variant="sparse", lam=0.0, rho=rho), g, agents)
        spars.append(recs[T]["sparsity"][0])
    assert spearmanr(rhos, spars).statistic >= 0.9
    assert spars[0] == 0.0 and spars[-1] >= 0.9
    _, recs = _run(_settings(m, T, n, variant="sparse", lam=0.0, rho=1.0, eps=10.0,
                             run_ids=(0, 1, 2)), g, agents)
    expect = 1 - math.exp(-1.0 * 10 / (2 * math.sqrt(n)))
    assert abs(np.mean(recs[T]["sparsity"]) - expect) <= 0.15


# -- 10: invariant P ---------------------------------------------------------------------------
@pytest.mark.parametrize("variant", ["laplace", "gaussian", "sparse"])
def test_invariant_P_every_mix_uses_only_released_vectors(variant):
    m, T, n = 6, 60, 4
    agents, _ = _data(m, T, n)
    g = tp.make_graph("complete", m, 1)
    s = _settings(m, T, n, variant=variant, eps=0.5, lam=0.0 if variant == "sparse" else 0.1,
                  rho=0.1)
    released = {-1: np.zeros((m, 1, n))}
    mixes = []
    net = dola.LocalNet(g)
    block = dola.Block(s, contract(s), g, net, dola.Stream(net.agents, 1, T, n, _reader(agents)))
    block.on_release = lambda t, ids, pub: released.__setitem__(t, pub)
    block.on_mix = lambda t, B, a_self, a_nbr: mixes.append((t, B.copy(), a_self, a_nbr))
    dola.drive(block, None)
    rows = block.rows
    for t, B, a_self, a_nbr in mixes:
        prev = released[t - 1]  # the vectors sent at the end of round t - 1
        for i in range(m):
            b = a_self[i] * prev[i]
            for q in range(rows.indptr[i], rows.indptr[i + 1]):
                b = b + a_nbr[q] * prev[rows.nbr[q]]
            np.testing.assert_array_equal(B[i], b)
    assert s.invariant_P and s.certified
    assert not _settings(m, T, n, variant="minibatch", reg_point="clean").invariant_P


# -- 11: ledger arithmetic ---------------------------------------------------------------------
def test_ledger_basic_and_advanced_composition():
    from mpi_dp.privacy import LaplaceEvent

    for eps, expect_adv in ((0.1, 153.16), (0.01, 5.80)):
        pairs = [(LaplaceEvent(1.0, 1.0 / eps), 10_000)]
        assert accountants.basic(pairs)[0] == pytest.approx(10_000 * eps, rel=1e-12)
        assert accountants.advanced(pairs, 1e-5) == pytest.approx(expect_adv, abs=0.005)
    m, T, n = 3, 50, 4
    agents, _ = _data(m, T, n)
    block, _ = _run(_settings(m, T, n, eps=0.3), tp.make_graph("ring", m, 1), agents)
    for led in block.ledgers:
        np.testing.assert_allclose(led.spent_eps, T * 0.3, rtol=1e-12)


@pytest.mark.parametrize("sparse", [False, True])
def test_shard_row_ranges_equal_slices_of_the_whole_shard(tmp_path, sparse):
    from mpi_dp.data import ShardFile, write_shards

    gen = rng.stream(4, "test")
    agents = []
    for n in (17, 9):
        X = np.where(gen.random((n, 6)) < 0.4, gen.standard_normal((n, 6)), 0.0)
        agents.append((sp.csr_matrix(X) if sparse else X, gen.choice([-1.0, 1.0], n)))
    shard = ShardFile(write_shards(tmp_path / "s.h5", agents, task="binary"))
    for i, (X, y) in enumerate(agents):
        full = X.toarray() if sparse else X
        for a, b in ((0, 4), (4, 9), (3, 3), (5, len(y))):
            Xr, yr = shard.read_agent_rows(i, a, b)
            assert sp.issparse(Xr) == sparse
            np.testing.assert_array_equal(Xr.toarray() if sparse else Xr, full[a:b])
            np.testing.assert_array_equal(yr, y[a:b])
    with pytest.raises(Exception, match="only 9 available"):
        shard.read_agent_rows(1, 0, 10)
