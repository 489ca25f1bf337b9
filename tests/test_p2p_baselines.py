"""Reference optima and baselines of seed 004 (spec §7 items 2, 4, 5, 12 and the local-DP
baseline of §4) on small random connected graphs with fixed seeds."""

from __future__ import annotations

import math

import numpy as np
import pytest
import scipy.linalg
import scipy.sparse as sp
from helpers import local_dp

from mpi_dp.agent_graph import Graph
from mpi_dp.models.reference import petsc_available
from mpi_dp.p2p import baselines, objective, reference

needs_petsc = pytest.mark.skipif(not petsc_available(),
                                 reason="petsc4py is not installed (WITH_PETSC=1 make test)")


def random_graph(n: int, seed: int, density: float = 0.3) -> sp.csr_matrix:
    """Erdos-Renyi plus a path (so connected), weights uniform in [0.1, 1]."""
    g = np.random.default_rng(seed)
    A = np.triu(g.random((n, n)) < density, 1)
    A[np.arange(n - 1), np.arange(1, n)] = True
    W = np.where(A, g.uniform(0.1, 1.0, (n, n)), 0.0)
    return sp.csr_matrix(W + W.T)


def random_data(n: int, p: int, loss: str, seed: int) -> tuple[list, list]:
    g = np.random.default_rng(seed + 1000)
    X, y = [], []
    for _ in range(n):
        m = int(g.integers(5, 30))
        Xi, t = g.normal(size=(m, p)), g.normal(size=p)
        X.append(Xi)
        y.append(Xi @ t + 0.1 * g.normal(size=m) if loss == "quadratic"
                 else np.where(Xi @ t + 0.3 * g.normal(size=m) >= 0, 1.0, -1.0))
    return X, y


def random_problem(n: int, p: int, loss: str, mu: float, seed: int = 0, lam: float = 0.05
                   ) -> objective.Problem:
    X, y = random_data(n, p, loss, seed)
    return objective.make_problem(random_graph(n, seed), X, y, loss, mu, lam)


def dense_kron_solution(P: objective.Problem) -> np.ndarray:
    """Theta* by a dense direct solve of (Lap (x) I_p + blockdiag(mu D_ii c_i A_i)) vec = rhs."""
    n, p = P.n, P.p
    blocks, rhs = [], []
    for i in range(n):
        Xi, yi, m = P.X[i], P.y[i], P.X[i].shape[0]
        w = P.mu * P.deg[i] * P.conf[i]
        blocks.append(w * (2.0 / m * Xi.T @ Xi + 2.0 * P.lam[i] * np.eye(p)))
        rhs.append(w * 2.0 / m * Xi.T @ yi)
    H = np.kron(P.graph.laplacian.toarray(), np.eye(p)) + scipy.linalg.block_diag(*blocks)
    return np.linalg.solve(H, np.concatenate(rhs)).reshape(n, p)


def full_grad(P: objective.Problem, Theta: np.ndarray) -> np.ndarray:
    return np.stack([P.partial_grad(Theta[None], i)[0] for i in range(P.n)])


# --- §7.2 central optimum ---------------------------------------------------------------------


@pytest.mark.parametrize("solver", ["scipy", pytest.param("petsc", marks=needs_petsc)])
@pytest.mark.parametrize("n,p,seed", [(12, 3, 0), (25, 5, 1)])
def test_theta_star_quadratic_matches_dense_direct(solver, n, p, seed):
    P = random_problem(n, p, "quadratic", 1.0, seed)
    ref = dense_kron_solution(P)
    Theta, q = reference.theta_star(P, solver)
    assert np.max(np.abs(Theta - ref)) <= 1e-10 * max(1.0, np.max(np.abs(ref)))
    assert np.max(np.abs(full_grad(P, Theta))) <= 1e-9
    assert q == pytest.approx(float(P.objective(ref[None])[0]), rel=1e-12)
    # not a trivial agreement: Theta* is neither the local models nor one shared model
    assert np.max(np.abs(Theta - reference.local_models(P))) > 1e-2
    assert np.max(np.abs(Theta - Theta.mean(axis=0))) > 1e-2


@pytest.mark.parametrize("solver", ["scipy", pytest.param("petsc", marks=needs_petsc)])
def test_theta_star_logistic_gradient_vanishes(solver):
    P = random_problem(20, 4, "logistic", 1.0, seed=3)
    Theta, q = reference.theta_star(P, solver)
    assert np.linalg.norm(full_grad(P, Theta)) <= 1e-8
    assert q == pytest.approx(float(P.objective(Theta[None])[0]), rel=1e-14)
    # the optimum: small perturbations do not decrease Q
    g = np.random.default_rng(0)
    for _ in range(5):
        d = 1e-3 * g.normal(size=Theta.shape)
        assert P.objective((Theta + d)[None])[0] > q


@pytest.mark.parametrize("loss", ["quadratic", "logistic"])
def test_local_models_are_stationary(loss):
    P = random_problem(10, 4, loss, 1.0, seed=5)
    loc = reference.local_models(P)
    for i in range(P.n):
        g = objective.local_grad(loss, P.X[i], P.y[i], float(P.lam[i]), loc[i][None])[0]
        assert np.max(np.abs(g)) <= 1e-10
    # absent agents give NaN rows
    X = list(P.X)
    X[3] = None
    part = reference.local_models_of(loss, X, P.y, P.lam, P.p)
    assert np.all(np.isnan(part[3])) and np.array_equal(np.delete(part, 3, 0), np.delete(loc, 3, 0))


# --- §7.4 model propagation -------------------------------------------------------------------


def update16(P: objective.Problem, Theta: np.ndarray, loc: np.ndarray, i: int) -> np.ndarray:
    nb = P.graph.nbrs(i)
    s = P.graph.nbr_weights(i) @ Theta[nb] / P.deg[i]
    return (s + P.mu * P.conf[i] * loc[i]) / (1.0 + P.mu * P.conf[i])


@pytest.mark.parametrize("mu", [0.1, 1.0, 10.0])
def test_model_propagation_solution_is_fixed_point_of_16(mu):
    P = random_problem(20, 4, "quadratic", mu, seed=7)
    loc = reference.local_models(P)
    sol = reference.mp_solution(P, loc)
    scale = np.max(np.abs(loc))
    for i in range(P.n):
        assert np.max(np.abs(update16(P, sol, loc, i) - sol[i])) <= 1e-12 * scale
    assert np.max(np.abs(sol - loc)) > 1e-2 * scale  # propagation moved the models
    # Gauss-Seidel sweeps of (16) from 0 converge to it (the fixed point is unique)
    Theta = np.zeros_like(loc)
    for _ in range(3000):
        for i in range(P.n):
            Theta[i] = update16(P, Theta, loc, i)
    assert np.max(np.abs(Theta - sol)) <= 1e-10 * scale


def test_update16_is_update4_with_unit_quadratic_loss():
    """(16) = (4) with L_i = 1/2 ||. - theta_i^loc||^2, i.e. grad L_i = theta - theta^loc and
    L_loc = 1 (alpha_i = 1/(1 + mu c_i)), checked on random states."""
    g = np.random.default_rng(11)
    n, p, R = 15, 4, 3
    graph = Graph.from_weights(random_graph(n, 11))
    m = g.integers(0, 50, size=n)
    P = objective.Problem(graph, "quadratic", 0.7, np.full(n, 0.1), m, np.ones(n), np.ones(n),
                          [None] * n, [None] * n)
    loc = g.normal(size=(n, p))
    for _ in range(5):
        Theta = g.normal(size=(R, n, p))
        for i in range(n):
            th = Theta[:, i, :]
            out4 = P.cd_step(i, th, Theta[:, graph.nbrs(i), :].transpose(1, 0, 2), th - loc[i])
            for r in range(R):
                assert np.allclose(out4[r], update16(P, Theta[r], loc, i), rtol=0, atol=1e-12)


# --- §7.5 mu limits ---------------------------------------------------------------------------


def test_mu_large_gives_local_models():
    P = random_problem(20, 4, "quadratic", 1e6, seed=2)
    Theta, _ = reference.theta_star(P)
    loc = reference.local_models(P)
    assert np.max(np.abs(Theta - loc)) <= 1e-3 * np.max(np.abs(loc))


@pytest.mark.parametrize("loss", ["quadratic", "logistic"])
def test_mu_small_gives_consensus(loss):
    P = random_problem(20, 4, loss, 1e-6, seed=2)
    Theta, _ = reference.theta_star(P)
    cons = reference.consensus_model(P)
    assert np.max(np.linalg.norm(Theta - cons, axis=1)) <= 1e-3
    # consensus minimises sum_i D_ii c_i L_i: its gradient vanishes
    w = P.deg * P.conf
    grad = sum(w[i] * objective.local_grad(loss, P.X[i], P.y[i], float(P.lam[i]), cons[None])[0]
               for i in range(P.n))
    assert np.max(np.abs(grad)) <= 1e-9
    # and at mu = 1 the optimum is far from consensus (the limit is not trivially satisfied)
    P1 = random_problem(20, 4, loss, 1.0, seed=2)
    assert np.max(np.linalg.norm(reference.theta_star(P1)[0] - reference.consensus_model(P1), axis=1)) > 0.05


# --- §7.12 gossip ADMM ------------------------------------------------------------------------


def test_gossip_admm_reaches_q_star():
    n = 12
    P = random_problem(n, 4, "quadratic", 1.0, seed=4)
    Theta, q_star = reference.theta_star(P)
    loc = reference.local_models(P)
    seen = []
    u, records = baselines.gossip_admm(P, loc, rho=1.0, K=10, T=3000 * n, seed=0, record_every=100 * n,
                                       on_record=lambda t, uu, s: seen.append(t) or {"t2": 2 * t})
    assert records[0]["iteration"] == 0 and records[-1]["iteration"] == 3000 * n
    assert records[0]["Q"] == pytest.approx(float(P.objective(loc[None])[0]))
    assert records[0]["Q"] - q_star > 1.0  # started far from the optimum
    assert records[-1]["Q"] - q_star <= 1e-8
    assert np.max(np.abs(u - Theta)) <= 1e-5
    for r in records:
        assert r["vectors_sent"] == 4 * r["iteration"]
        assert r["t2"] == 2 * r["iteration"]
    assert seen == [r["iteration"] for r in records]
    # same seed, same run: identical; another seed: another schedule
    u2, rec2 = baselines.gossip_admm(P, loc, 1.0, 10, 50, seed=0, record_every=50)
    u3, rec3 = baselines.gossip_admm(P, loc, 1.0, 10, 50, seed=0, record_every=50)
    u4, _ = baselines.gossip_admm(P, loc, 1.0, 10, 50, seed=1, record_every=50)
    assert np.array_equal(u2, u3) and rec2 == rec3 and not np.array_equal(u2, u4)


def test_gossip_admm_logistic_decreases_q():
    n = 10
    P = random_problem(n, 3, "logistic", 1.0, seed=6)
    _, q_star = reference.theta_star(P)
    _, records = baselines.gossip_admm(P, reference.local_models(P), 1.0, 10, 400 * n, 0, 100 * n)
    gaps = [r["Q"] - q_star for r in records]
    assert gaps[-1] <= 1e-6 * gaps[0]


def test_admm_schedule_is_uniform_over_agents_and_neighbours():
    P = random_problem(8, 3, "quadratic", 1.0, seed=9)
    counts = np.diff(P.graph.W.indptr)
    agents, pos = baselines.admm_schedule(P.n, counts, 80_000, seed=3)
    assert np.all(pos < counts[agents]) and np.all(pos >= 0)
    freq = np.bincount(agents, minlength=P.n) / agents.size
    assert np.max(np.abs(freq - 1.0 / P.n)) < 4 * math.sqrt(1.0 / P.n / agents.size)
    i = int(np.argmax(counts))
    fp = np.bincount(pos[agents == i], minlength=counts[i]) / np.sum(agents == i)
    assert np.max(np.abs(fp - 1.0 / counts[i])) < 4 * math.sqrt(1.0 / counts[i] / np.sum(agents == i))


def test_admm_rho_grid():
    W = random_graph(10, 0)
    assert np.allclose(baselines.admm_rho_grid(W), np.array([0.1, 1, 10]) * W.data.mean())
    assert np.allclose(baselines.admm_rho_grid(W.toarray()), baselines.admm_rho_grid(W))


# --- local DP baseline ------------------------------------------------------------------------


def test_local_dp_features_are_clip_plus_laplace():
    p, eps, B = 5, 2.0, 1.5
    eps_x = 0.5 * eps
    s = 2 * B * p / eps_x
    g = np.random.default_rng(0)
    X = g.uniform(-4, 4, size=(20_000, p))
    y = np.ones(X.shape[0])
    Xp, _, ev = local_dp(X, y, eps, B, seed=1, agent=2)
    # values beyond the box only matter through their clipped value
    X2 = np.where(np.abs(X) > B, 3 * X, X)
    assert np.array_equal(local_dp(X2, y, eps, B, seed=1, agent=2)[0], Xp)
    # the noise does not depend on the data
    Z = local_dp(np.zeros_like(X), y, eps, B, seed=1, agent=2)[0]
    assert np.allclose(Xp - np.clip(X, -B, B), Z, rtol=0, atol=1e-12)
    noise = Z.ravel()  # 1e5 draws
    assert abs(noise.var() / (2 * s**2) - 1) <= 0.03
    assert abs(np.mean(np.abs(noise)) / s - 1) <= 0.03  # Laplace: E|eta| = s
    assert abs(noise.mean()) <= 4 * math.sqrt(2) * s / math.sqrt(noise.size)
    assert ev[0].l1_sensitivity == 2 * B * p and ev[0].scale == pytest.approx(s)
    assert ev[0].eps == pytest.approx(eps_x) and ev[1].eps == pytest.approx(eps - eps_x)
    assert ev[1].kind == "randomized_response"
    # other agents / runs draw other noise
    assert not np.array_equal(local_dp(X, y, eps, B, seed=1, agent=3)[0], Xp)
    assert not np.array_equal(local_dp(X, y, eps, B, seed=1, agent=2, run=1)[0], Xp)


@pytest.mark.parametrize("eps,split", [(1.0, 0.5), (4.0, 0.25)])
def test_local_dp_labels_randomised_response(eps, split):
    m = 100_000
    y = np.where(np.arange(m) % 3 == 0, -1.0, 1.0)
    _, yp, ev = local_dp(np.zeros((m, 2)), y, eps, 1.0, seed=5, agent=0,
                         eps_split=split)
    eps_y = eps * (1 - split)
    q = math.exp(eps_y) / (1 + math.exp(eps_y))
    kept = np.mean(yp == y)
    assert abs(kept - q) <= 4 * math.sqrt(q * (1 - q) / m)
    assert set(np.unique(yp)) == {-1.0, 1.0}
    assert ev[1].eps == pytest.approx(eps_y)


def test_local_dp_rejects_regression_targets():
    with pytest.raises(ValueError, match="regression"):
        local_dp(np.zeros((4, 2)), np.array([0.3, 1.0, -1.0, 2.0]), 1.0, 1.0, 0, 0)


def test_local_dp_models_much_worse_than_local_at_small_eps():
    """Separable task (y = sign(s_i^T x), no label noise): on clean test points, the local
    models' mean accuracy is >= 0.9, the local-DP models' at eps = 0.1 is within 0.1 of chance
    and at least 0.3 below, while at eps = 1e4 local DP is close to the local models."""
    n, p, m, B = 10, 3, 100, 3.0
    g = np.random.default_rng(21)
    S = g.normal(size=(n, p))
    X = [g.normal(size=(m, p)) for _ in range(n)]
    y = [np.where(X[i] @ S[i] >= 0, 1.0, -1.0) for i in range(n)]
    Xt = [g.normal(size=(1000, p)) for _ in range(n)]
    yt = [np.where(Xt[i] @ S[i] >= 0, 1.0, -1.0) for i in range(n)]
    P = objective.make_problem(random_graph(n, 21), X, y, "logistic", 1.0, 1.0 / m)

    def acc(models):
        return float(np.mean([np.mean(np.where(Xt[i] @ models[i] >= 0, 1.0, -1.0) == yt[i])
                              for i in range(n)]))

    a_loc = acc(reference.local_models(P))
    a_small = np.mean([acc(baselines.local_dp_models(P, 0.1, B, seed=s)[0]) for s in range(3)])
    a_big = acc(baselines.local_dp_models(P, 1e4, B, seed=0)[0])
    assert a_loc >= 0.9
    assert abs(a_small - 0.5) <= 0.1 and a_small <= a_loc - 0.3
    assert a_big >= a_loc - 0.05
    models, Xs, ys, events = baselines.local_dp_models(P, 0.1, B, seed=0)
    assert len(events) == n and all(sum(e.eps for e in ev) == pytest.approx(0.1) for ev in events)
    assert all(np.max(np.abs(np.clip(X[i], -B, B) - Xs[i])) > 1.0 for i in range(n))
