"""Seed 004, personalised private P2P coordinate descent: the checks of spec §7 on the serial
simulator (items 1, 3, 6-11 and the serial half of 13); optima are computed independently here
(a dense solve of the Kronecker system, SciPy L-BFGS on Q)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import scipy.optimize as so
import scipy.sparse as sp
from helpers import p2p_contract

from mpi_dp.p2p import coordinate_descent, objective
from mpi_dp.privacy import kairouz

DELTA = math.exp(-5)


def _graph(n: int, rng: np.random.Generator, p_edge: float = 0.25) -> sp.csr_matrix:
    A = np.triu(rng.random((n, n)) < p_edge, 1)
    for i in range(n):  # a ring keeps it connected
        A[min(i, (i + 1) % n), max(i, (i + 1) % n)] = True
    Wd = np.triu(A * (0.2 + rng.random((n, n))), 1)
    return sp.csr_matrix(Wd + Wd.T)


def quad_problem(n=20, p=5, seed=0, mu=1.0, lam=0.1):
    rng = np.random.default_rng(seed)
    W = _graph(n, rng)
    X = [rng.standard_normal((int(rng.integers(5, 20)), p)) for _ in range(n)]
    w0 = rng.standard_normal(p)
    y = [x @ (w0 + 0.5 * rng.standard_normal(p)) + 0.1 * rng.standard_normal(len(x)) for x in X]
    return objective.make_problem(W, X, y, "quadratic", mu, lam)


def logistic_problem(n=20, p=5, seed=0, mu=1.0, lam="1/m", smooth="data"):
    rng = np.random.default_rng(seed)
    W = _graph(n, rng)
    X, y = [], []
    for _ in range(n):
        m = int(rng.integers(10, 100))
        x = rng.standard_normal((m, p))
        x /= np.abs(x).sum(axis=1, keepdims=True)  # ||x||_1 = 1: L0 = 1 holds
        X.append(x)
        y.append(np.where(x[:, 0] + 0.3 * rng.standard_normal(m) > 0, 1.0, -1.0))
    m = np.array([len(v) for v in y])
    lam_v = 1.0 / m if lam == "1/m" else np.full(n, lam)
    return objective.make_problem(W, X, y, "logistic", mu, lam_v, smooth=smooth)


def dense_star(P: objective.Problem) -> np.ndarray:
    """Quadratic optimum: (Lap (x) I_p + blockdiag(mu D c A_i)) vec Theta = [mu D c b_i]."""
    n, p = P.n, P.p
    H = np.kron(P.graph.laplacian.toarray(), np.eye(p))
    b = np.zeros(n * p)
    for i in range(n):
        m = len(P.y[i])
        A = 2 / m * P.X[i].T @ P.X[i] + 2 * P.lam[i] * np.eye(p)
        f = P.mu * P.deg[i] * P.conf[i]
        H[i * p:(i + 1) * p, i * p:(i + 1) * p] += f * A
        b[i * p:(i + 1) * p] = f * 2 / m * P.X[i].T @ P.y[i]
    return np.linalg.solve(H, b).reshape(n, p)


def lbfgs_star(P: objective.Problem) -> tuple[np.ndarray, float]:
    n, p = P.n, P.p

    def fg(v):
        Th = v.reshape(1, n, p)
        g = np.stack([P.partial_grad(Th, i)[0] for i in range(n)])
        return float(P.objective(Th)[0]), g.ravel()
    r = so.minimize(fg, np.zeros(n * p), jac=True, method="L-BFGS-B",
                    options={"gtol": 1e-10, "ftol": 0, "maxiter": 20000})
    return r.x.reshape(n, p), float(r.fun)


def settings(**kw) -> coordinate_descent.Settings:
    base = dict(T=1000, T_agent=None, eps=math.inf, delta=DELTA, seed=3)
    base.update(kw)
    return coordinate_descent.Settings(**base)


# -- 1. gradient and constants --------------------------------------------------------------
@pytest.mark.parametrize("make", [quad_problem, logistic_problem])
def test_partial_gradient_matches_finite_differences(make):
    P = make(n=10, p=3)
    rng = np.random.default_rng(1)
    Th = rng.standard_normal((1, P.n, P.p))
    for i in range(P.n):
        g = P.partial_grad(Th, i)[0]
        fd = np.empty(P.p)
        for k in range(P.p):
            E = np.zeros_like(Th)
            E[0, i, k] = 1e-5
            fd[k] = (P.objective(Th + E)[0] - P.objective(Th - E)[0]) / 2e-5
        np.testing.assert_allclose(g, fd, rtol=1e-6, atol=1e-8)


def test_block_lipschitz_is_the_top_eigenvalue_and_eq4_forms_agree():
    P = quad_problem(n=10, p=4)
    for i in range(P.n):
        m = len(P.y[i])
        A = 2 / m * P.X[i].T @ P.X[i] + 2 * P.lam[i] * np.eye(P.p)
        H = P.deg[i] * (np.eye(P.p) + P.mu * P.conf[i] * A)
        assert abs(P.L_blk[i] - np.linalg.eigvalsh(H)[-1]) <= 1e-10 * P.L_blk[i]
    Th = np.random.default_rng(2).standard_normal((2, P.n, P.p))
    for i in range(P.n):
        nb = np.ascontiguousarray(np.moveaxis(Th[:, P.graph.nbrs(i)], 1, 0))
        a = P.cd_step(i, Th[:, i], nb, P.grad(i, Th[:, i]))
        b = Th[:, i] - P.partial_grad(Th, i) / P.L_blk[i]
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-12)


# -- 3. linear convergence --------------------------------------------------------------------
def test_cd_converges_linearly_to_the_optimum():
    P = quad_problem(n=20, p=5, mu=0.3)
    star = dense_star(P)
    Qs = float(P.objective(star[None])[0])
    gaps = []
    s = settings(T=2000 * P.n, record_every=200 * P.n)
    Th, _, _ = coordinate_descent.simulate(P, s, p2p_contract(s, P.n), np.zeros((P.n, P.p)),
                                           on_record=lambda t, T, b: gaps.append(P.objective(T)[0] - Qs))
    assert gaps[-1] <= 1e-9 * max(1.0, abs(Qs))
    assert np.linalg.norm(Th[0] - star) <= 1e-5
    logs = np.log10(np.maximum(np.array(gaps), 1e-300))
    live = logs[logs > -12]
    if len(live) >= 3:  # a roughly constant decrease per block before the floor
        d = np.diff(live)
        assert np.all(d < 0) and d.max() / d.min() < 3 and d.min() / d.max() < 3


def test_mean_gap_below_proposition_1():
    P = quad_problem(n=12, p=3, mu=0.05, lam=0.05)
    Qs = float(P.objective(dense_star(P)[None])[0])
    T = 3 * P.n
    Q0 = float(P.objective(np.zeros((1, P.n, P.p)))[0])
    gaps = []
    for sd in range(5):
        s = settings(T=T, seed=sd)
        Th = coordinate_descent.simulate(P, s, p2p_contract(s, P.n), np.zeros((P.n, P.p)))[0]
        gaps.append(float(P.objective(Th)[0]) - Qs)
    assert np.mean(gaps) <= P.kappa ** T * (Q0 - Qs)


# -- 6. accounting ----------------------------------------------------------------------------
@pytest.mark.parametrize("eps_bar,T_i,e", [(1, 10, 0.106046), (1, 100, 0.0335334),
                                            (0.5, 10, 0.0584996), (0.1, 100, 0.00464903),
                                            (0.15, 50, 0.0093047)])
def test_equal_split_reproduces_the_spec_table(eps_bar, T_i, e):
    got = kairouz.equal_split(eps_bar, T_i, DELTA)
    assert abs(got - e) <= 1e-5
    assert abs(kairouz.theorem1_eps([got] * T_i, DELTA) - eps_bar) <= 1e-9


def test_theorem1_properties():
    es = np.linspace(0.001, 0.5, 50)
    vals = [kairouz.theorem1_eps([e] * 30, DELTA) for e in es]
    assert np.all(np.diff(vals) > 0)
    assert kairouz.theorem1_eps([0.1, 0.2, 0.3], 0.0) == pytest.approx(0.6, abs=1e-15)
    assert kairouz.equal_split(0.7, 1, DELTA) == 0.7
    assert kairouz.theorem1_eps([0.01] * 400, DELTA) < 4.0  # advanced composition beats the sum


@pytest.mark.parametrize("corrected", [False, True])
def test_proposition2_allocations_spend_exactly_eps_bar(corrected):
    P = quad_problem(n=10, p=3)
    sched = coordinate_descent.global_schedule(4, P.n, 200)
    T_agent = np.bincount(sched, minlength=P.n)
    b = kairouz.agent_budgets("prop2_corrected" if corrected else "prop2_paper", 0.5, DELTA, sched,
                              P.n, T_agent, P.kappa)
    for i in range(P.n):
        assert abs(math.fsum(b[i]) - 0.5) <= 1e-12
    star = kairouz.prop2_allocation(0.9, 50, 1.0, corrected)
    assert abs(star.sum() - 1) < 1e-12
    assert (np.diff(star) > 0).all() if corrected else (np.diff(star) < 0).all()


# -- 7. per-release DP: the exact privacy loss ------------------------------------------------
def test_every_release_has_privacy_loss_at_most_e():
    P = logistic_problem(n=10, p=4, seed=5)
    rng = np.random.default_rng(7)
    i = 3
    X, y = P.X[i], P.y[i]
    X2, y2 = X.copy(), y.copy()
    X2[0] = 1e6 * rng.standard_normal(P.p)  # adversarial neighbour: a huge record
    y2[0] = -y2[0]
    th = rng.standard_normal((1, P.p))
    clip, e = 1.0, 0.3
    xn, xn2 = np.abs(X).sum(1), np.abs(X2).sum(1)
    g1 = objective.local_grad("logistic", X, y, P.lam[i], th, clip, xn)[0]
    g2 = objective.local_grad("logistic", X2, y2, P.lam[i], th, clip, xn2)[0]
    m = len(y)
    assert np.abs(g1 - g2).sum() <= 2 * clip / m * (1 + 1e-12)
    s = coordinate_descent.laplace_scale(clip, e, m)
    nb = rng.standard_normal((len(P.graph.nbrs(i)), 1, P.p))
    a, f = P.alpha[i], P.mu * P.conf[i]
    mean1 = P.cd_step(i, th, nb, g1)
    mean2 = P.cd_step(i, th, nb, g2)
    out = mean1 + a * f * s * rng.laplace(size=(10_000, P.p))  # released outputs under S
    loss = (np.abs(out - mean2).sum(1) - np.abs(out - mean1).sum(1)) / (a * f * s)
    assert loss.max() <= e * (1 + 1e-9)


# -- 8. noise calibration --------------------------------------------------------------------
def test_noise_variance_is_two_s_squared():
    P = logistic_problem(n=6, p=3)
    s = settings(T=10, T_agent=(20_000,) * P.n, eps=1.0, allocation="simple")
    b = coordinate_descent.Block(P, np.array([2]), s, p2p_contract(s, P.n),
                                 [np.full(20_000, 1.0 / 20_000)] * P.n, {2: np.zeros(P.p)})
    z = b.release[2].reserved[0].ravel()  # standard Laplace draws, 6e4 of them
    sc = b.scales[2][0]
    assert abs(np.var(sc * z) / (2 * sc**2) - 1) < 0.03
    assert sc == pytest.approx(2 * 1.0 / ((1.0 / 20_000) * P.m[2]))


# -- 9. utility versus budget; eps = inf is non-private CD bit for bit ------------------------
def _final_gap(P, Qs, eps, T_i, seeds=range(5)):
    out = []
    for sd in seeds:
        s = settings(T=T_i * P.n, T_agent=(T_i,) * P.n, eps=eps, seed=sd, clip=1.0)
        Th = coordinate_descent.simulate(P, s, p2p_contract(s, P.n), np.zeros((P.n, P.p)))[0]
        out.append(float(P.objective(Th)[0]) - Qs)
    return float(np.mean(out))


def test_utility_gets_worse_as_the_budget_shrinks():
    P = logistic_problem(n=20, p=5, seed=1, mu=1.0)
    _, Qs = lbfgs_star(P)
    gaps = [_final_gap(P, Qs, e, 20) for e in (math.inf, 10.0, 1.0, 0.1)]
    assert all(a < b for a, b in zip(gaps, gaps[1:], strict=False)), gaps
    s_np = settings(T=20 * P.n, T_agent=(20,) * P.n, eps=math.inf, seed=1)
    a = coordinate_descent.simulate(P, s_np, p2p_contract(s_np, P.n), np.zeros((P.n, P.p)))[0]
    s_f = settings(T=20 * P.n, T_agent=(20,) * P.n, seed=1, clip=5.0, mode="faithful")
    b = coordinate_descent.simulate(P, s_f, p2p_contract(s_f, P.n), np.zeros((P.n, P.p)))[0]
    assert np.array_equal(a, b)  # s = 0: the private code path is non-private CD exactly
    at10 = {T_i: _final_gap(P, Qs, 10.0, T_i) for T_i in (5, 10, 100)}
    assert at10[10] < at10[5] and at10[10] < at10[100], at10  # Theorem 2's trade-off in T_i


# -- 10. Theorem 2 (corrected) ----------------------------------------------------------------
def test_theorem2_corrected_bound_holds():
    P = quad_problem(n=10, p=3, mu=0.5, lam=0.5)
    star = dense_star(P)
    Qs = float(P.objective(star[None])[0])
    T_i, eps = 10, 1.0
    T = T_i * P.n
    s = settings(T=T, T_agent=(T_i,) * P.n, eps=eps, allocation="simple", clip=1.0,
                 runs=tuple(range(20)), mode="faithful")
    Th = coordinate_descent.simulate(P, s, p2p_contract(s, P.n), np.zeros((P.n, P.p)))[0]
    mean_gap = float(np.mean(P.objective(Th) - Qs))
    sc = np.array([coordinate_descent.laplace_scale(1.0, eps / T_i, int(m)) for m in P.m])
    a = P.p / (P.n * P.L_blk.min()) * np.sum((P.mu * P.deg * P.conf * sc) ** 2)
    r = P.sigma / (P.n * P.L_blk.max())
    b = float(P.objective(np.zeros((1, P.n, P.p)))[0]) - Qs
    bound = b * (1 - r) ** T + a / r * (1 - (1 - r) ** T)
    assert mean_gap <= 1.5 * bound


# -- 11. warm start -------------------------------------------------------------------------
def test_warm_start_sensitivity_and_privacy_loss():
    from mpi_dp.p2p import reference

    rng = np.random.default_rng(11)
    p, m, lam_ws = 4, 30, 0.05
    worst = 0.0
    for _ in range(20):
        X = rng.standard_normal((m, p))
        X /= np.linalg.norm(X, axis=1, keepdims=True)
        y = np.where(rng.random(m) < 0.5, 1.0, -1.0)
        X2, y2 = X.copy(), y.copy()
        X2[rng.integers(m)] = rng.standard_normal(p) / math.sqrt(p) / 2
        y2[0] = -y2[0]
        a = reference.local_model("logistic", X, y, lam_ws)
        b = reference.local_model("logistic", X2, y2, lam_ws)
        worst = max(worst, np.linalg.norm(a - b) / coordinate_descent.warm_start_sensitivity(1.0, m, lam_ws))
    assert worst <= 1.0
    # exact privacy loss of the L2 Laplace release between the two means at Delta_2 apart
    sens, eps_ws = coordinate_descent.warm_start_sensitivity(1.0, m, lam_ws), 0.5
    g = np.random.default_rng(3)
    mean1 = np.zeros(p)
    mean2 = np.zeros(p)
    mean2[0] = sens
    outs = np.stack([mean1 + coordinate_descent.l2_laplace(p, sens / eps_ws, g) for _ in range(10_000)])
    loss = (np.linalg.norm(outs - mean2, axis=1) - np.linalg.norm(outs - mean1, axis=1)) \
        * eps_ws / sens
    assert loss.max() <= eps_ws * (1 + 1e-9)


def test_warm_start_improves_the_start_and_the_private_run():
    """Spec §7.11 utility: L2-normalised x (L0_2 = 1, L0 = sqrt p), lam_ws = 10 lam_i,
    eps_ws = 10, 5 seeds; the warm start only sees the noisy local models (post-processing)."""
    from mpi_dp.p2p import reference

    rng = np.random.default_rng(21)
    n, p = 20, 5
    W = _graph(n, rng)
    X, y = [], []
    for _ in range(n):
        m = int(rng.integers(10, 100))
        x = rng.standard_normal((m, p))
        x /= np.linalg.norm(x, axis=1, keepdims=True)
        X.append(x)
        y.append(np.where(x[:, 0] + 0.3 * rng.standard_normal(m) > 0, 1.0, -1.0))
    m = np.array([len(v) for v in y])
    P = objective.make_problem(W, X, y, "logistic", 1.0, 1.0 / m)
    _, Qs = lbfgs_star(P)
    lam_ws = 10.0 / m
    loc = np.stack([reference.local_model("logistic", X[i], y[i], lam_ws[i]) for i in range(n)])
    ws_gap, z_gap, ws_final, z_final = [], [], [], []
    for sd in range(5):
        noisy = np.stack([loc[i] + coordinate_descent.l2_laplace(
                              p, coordinate_descent.warm_start_sensitivity(1.0, m[i], lam_ws[i]) / 10.0,
                              coordinate_descent.stream(sd, "warm_start", i, 0))
                          for i in range(n)])
        th0 = reference.mp_solution(P, noisy)
        noisy[0] += 1.0  # changing the released values changes Theta(0); raw data never enters
        assert not np.array_equal(reference.mp_solution(P, noisy), th0)
        ws_gap.append(float(P.objective(th0[None])[0]) - Qs)
        z_gap.append(float(P.objective(np.zeros((1, n, p)))[0]) - Qs)
        s = settings(T=5 * n, T_agent=(5,) * n, eps=10.0, seed=sd, clip=math.sqrt(p))
        con = p2p_contract(s, P.n)
        ws_final.append(float(P.objective(coordinate_descent.simulate(P, s, con, th0)[0])[0]) - Qs)
        z_final.append(float(P.objective(coordinate_descent.simulate(
            P, s, p2p_contract(s, P.n), np.zeros((n, p)))[0])[0]) - Qs)
    assert np.mean(ws_gap) < np.mean(z_gap), (ws_gap, z_gap)
    assert np.mean(ws_final) < np.mean(z_final), (ws_final, z_final)


@pytest.mark.parametrize("packing", ["levels", "greedy"])
def test_replay_rounds_equal_the_serial_schedule(packing):
    """Spec §6 / item 13, serial half: rounds are conflict-free, no round spans a record
    boundary, and running them equals the tick-by-tick simulator bit for bit (models and the
    records taken after each segment); dependency levels need fewer rounds than the greedy cut."""
    P = logistic_problem(n=30, p=4, seed=4)
    s = settings(T=30 * 12, eps=0.5, T_agent=(10,) * 30, record_every=100, runs=(0, 1), seed=5)
    sched = coordinate_descent.global_schedule(s.seed, P.n, s.T)
    keep = coordinate_descent.effective_ticks(sched, P.n, s.T_agent)
    rounds = coordinate_descent.cut_rounds(sched, keep, P.graph, s.record_every, packing)
    A = P.graph.W.toarray() != 0
    seg = keep // s.record_every
    for r in range(rounds.count):
        members = rounds.agents[rounds.starts[r]:rounds.starts[r + 1]]
        assert len(set(members.tolist())) == len(members)
        assert not A[np.ix_(members, members)].any()
    seen: dict[int, list] = {}
    serial, _, _ = coordinate_descent.simulate(P, s, p2p_contract(s, P.n), np.zeros((P.n, P.p)),
                                               on_record=lambda t, th, b: seen.setdefault(t, th.copy()))
    con = p2p_contract(s, P.n)
    block = coordinate_descent.Block(P, np.arange(P.n), s, con,
                                     coordinate_descent.agent_budgets(s, P, sched, con),
                                     {i: np.zeros((s.R, P.p)) for i in range(P.n)})
    net = coordinate_descent.LocalNet(P.n, s.R * P.p, P.graph)
    coordinate_descent.post_initial(block, net)
    got: dict[int, np.ndarray] = {}
    coordinate_descent.replay(block, net, rounds, lambda: None,
                              on_record=lambda t: got.setdefault(
                                  t, coordinate_descent.current(block, P.n).copy()))
    assert np.array_equal(coordinate_descent.current(block, P.n), serial)
    assert sorted(got) == sorted(seen) and len(got) == len(set(seg.tolist()))
    for t in got:
        assert np.array_equal(got[t], seen[t])
    greedy = coordinate_descent.cut_rounds(sched, keep, P.graph, s.record_every, "greedy")
    assert rounds.count <= greedy.count
    if packing == "levels":
        assert rounds.count < greedy.count
