"""Tests for mpi_dp.algorithms.admm_steps: DP inexact ADMM formulas (spec dp-inexact-admm §2-§5, §9)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import scipy.optimize
import scipy.stats
from helpers import admm_outp_sigma
from scipy.special import softmax

from mpi_dp.algorithms import admm_steps as st
from mpi_dp.models import multinomial as mn
from mpi_dp.privacy.mechanisms import gaussian_noise, laplace_noise
from mpi_dp.rng import stream

J, K = 5, 3
RHO, ETA, DELTA = 1.7, 0.3, 0.25


def blocks(R: int, seed: int = 0, scale: float = 1.0) -> dict[str, np.ndarray]:
    """Random w, lam, g, z^t, xi of shape (R, J, K)."""
    g = stream(seed, "test", 0, 0)
    return {k: scale * g.standard_normal((R, J, K)) for k in ("w", "lam", "g", "z", "xi")}


def solve(fun, x0: np.ndarray, bounds=None) -> np.ndarray:
    """Numerical minimiser (L-BFGS-B, tight tolerances) of a smooth fun -> (f, grad) on flat vectors."""
    res = scipy.optimize.minimize(fun, x0, jac=True, method="L-BFGS-B", bounds=bounds,
                                  options={"ftol": 0.0, "gtol": 1e-12, "maxiter": 10000})
    return res.x


def perturbed(w, lam, g, zt, xi, rho, inv_eta):
    """G~(z) = <g + xi, z> + <lam, w - z> + rho/2 ||w - z||^2 + inv_eta/2 ||z - zt||^2 ((8), (9), (10))."""
    w, lam, g, zt, xi = (a.ravel() for a in (w, lam, g, zt, xi))

    def fun(z):
        f = (g + xi) @ z + lam @ (w - z) + 0.5 * rho * (w - z) @ (w - z) + 0.5 * inv_eta * (z - zt) @ (z - zt)
        return f, g + xi - lam - rho * (w - z) + inv_eta * (z - zt)

    return fun


# ---------------------------------------------------------------- V1: closed forms


@pytest.mark.parametrize("w_bound", [None, 1.0])
def test_v1_objp_closed_form_solves_perturbed_subproblem(w_bound):
    b = blocks(3, seed=1)
    if w_bound is not None:
        b["z"] = np.clip(b["z"], -w_bound, w_bound)
    Z = st.objp_update(b["w"], b["lam"], b["g"], b["z"], b["xi"], RHO, ETA, w_bound)
    active = 0
    for r in range(3):
        fun = perturbed(*(b[k][r] for k in ("w", "lam", "g", "z", "xi")), RHO, 1.0 / ETA)
        bounds = None if w_bound is None else [(-w_bound, w_bound)] * (J * K)
        num = solve(fun, np.zeros(J * K), bounds)
        assert np.abs(Z[r].ravel() - num).max() <= 1e-5
        if w_bound is not None:
            active += int((np.abs(Z[r]) == w_bound).sum())
    if w_bound is not None:
        assert active >= 5  # the box is exercised


@pytest.mark.parametrize("w_bound", [None, 1.0])
def test_v1_objt_closed_form_solves_trust_subproblem(w_bound):
    b = blocks(3, seed=2)
    if w_bound is not None:
        b["z"] = np.clip(b["z"], -w_bound, w_bound)
    Z = st.objt_update(b["w"], b["lam"], b["g"], b["z"], b["xi"], RHO, DELTA, w_bound)
    B = np.inf if w_bound is None else w_bound
    active = 0
    for r in range(3):
        zt = b["z"][r].ravel()
        fun = perturbed(*(b[k][r] for k in ("w", "lam", "g", "z", "xi")), RHO, 0.0)  # no prox term
        lo, hi = np.maximum(zt - DELTA, -B), np.minimum(zt + DELTA, B)
        num = solve(fun, zt, list(zip(lo, hi, strict=True)))
        assert np.abs(Z[r].ravel() - num).max() <= 1e-5
        assert np.abs(Z[r] - b["z"][r]).max() <= DELTA + 1e-15
        active += int(((Z[r].ravel() == lo) | (Z[r].ravel() == hi)).sum())
    assert active >= 0.5 * 3 * J * K  # most trust-box constraints are active (prototype: 87%)


def test_noise_free_steps_are_the_iadmm_steps():
    b = blocks(2, seed=3)
    args = (b["w"], b["lam"], b["g"], b["z"])
    assert np.array_equal(st.objp_update(*args, None, RHO, ETA), st.objp_update(*args, 0 * b["xi"], RHO, ETA))
    assert np.array_equal(st.objt_update(*args, None, RHO, DELTA),
                          st.objt_update(*args, 0 * b["xi"], RHO, DELTA))
    # xi enters exactly as an extra linear term: ObjP with xi equals the prox step with g + xi
    np.testing.assert_allclose(st.objp_update(*args, b["xi"], RHO, ETA),
                               st.objp_update(b["w"], b["lam"], b["g"] + b["xi"], b["z"], None, RHO, ETA),
                               rtol=1e-14, atol=1e-14)


def test_outp_update_is_the_prox_step_with_its_eta():
    b = blocks(2, seed=4)
    inv_eta = 1649.87
    Z = st.outp_update(b["w"], b["lam"], b["g"], b["z"], 102.0, inv_eta)
    for r in range(2):
        fun = perturbed(b["w"][r], b["lam"][r], b["g"][r], b["z"][r], 0 * b["xi"][r], 102.0, inv_eta)
        assert np.abs(fun(Z[r].ravel())[1]).max() <= 1e-10  # stationary point of a strongly convex G
    np.testing.assert_allclose(Z, st.objp_update(b["w"], b["lam"], b["g"], b["z"], None, 102.0, 1 / inv_eta),
                               rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("w_bound", [None, 0.3])
def test_server_average_minimises_augmented_lagrangian(w_bound):
    P, rho = 4, 0.8
    g = stream(5, "test", 0, 0)
    Z, Lam = g.standard_normal((P, J, K)), g.standard_normal((P, J, K))
    U = sum(st.server_contribution(rho, Z[p], Lam[p]) for p in range(P))
    w = st.server_average(U, P, rho, w_bound)

    def fun(v):
        f = sum(Lam[p].ravel() @ (v - Z[p].ravel()) + 0.5 * rho * np.sum((v - Z[p].ravel()) ** 2)
                for p in range(P))
        return f, sum(Lam[p].ravel() + rho * (v - Z[p].ravel()) for p in range(P))

    bounds = None if w_bound is None else [(-w_bound, w_bound)] * (J * K)
    assert np.abs(w.ravel() - solve(fun, np.zeros(J * K), bounds)).max() <= 1e-8
    if w_bound is None:
        np.testing.assert_allclose(w, (Z - Lam / rho).mean(axis=0), rtol=1e-12, atol=1e-14)
    else:
        assert np.abs(w).max() == w_bound


def test_dual_update_and_fixed_point():
    b = blocks(2, seed=6)
    lam = st.dual_update(b["lam"], RHO, b["w"], b["z"])
    np.testing.assert_array_equal(lam, b["lam"] + RHO * (b["w"] - b["z"]))
    # at consensus (w = z) the dual does not move
    np.testing.assert_array_equal(st.dual_update(b["lam"], RHO, b["z"], b["z"]), b["lam"])


def test_agent_gradients_sum_to_grad_F():
    g = stream(7, "test", 0, 0)
    X, y = np.clip(g.random((90, J)), 0, 1), g.integers(K, size=90)
    z, w = g.standard_normal((2, J, K)), g.standard_normal((2, J, K))
    gamma, P, I = 0.05, 3, 90
    parts = [slice(0, 30), slice(30, 50), slice(50, 90)]
    total = sum(st.agent_gradient(mn.grad_sum(X[s], y[s], z), I, gamma, P, z, w) for s in parts)
    np.testing.assert_allclose(total, mn.grad_sum(X, y, z) / I + 2 * gamma * z, rtol=1e-12, atol=1e-14)
    code = st.agent_gradient(mn.grad_sum(X[parts[0]], y[parts[0]], z), I, gamma, P, z, w, "code")
    np.testing.assert_allclose(code, mn.grad_sum(X[parts[0]], y[parts[0]], z) / I + 2 * gamma * w, rtol=1e-14)
    out = st.outp_gradient(mn.grad_sum(X[parts[2]], y[parts[2]], z), 40, gamma, w)
    np.testing.assert_allclose(out, mn.grad_sum(X[parts[2]], y[parts[2]], z) / 40 + 2 * gamma * w, rtol=1e-14)


# ---------------------------------------------------------------- V5: noise scale


def test_v5_laplace_scale_equals_brute_force_max():
    g = stream(8, "test", 0, 0)
    n, I, eps = 150, 1000, 0.3
    X, y = np.clip(g.random((n, J)), 0, 1), g.integers(K, size=n)
    Z = g.standard_normal((3, J, K))
    b = st.laplace_scale(st.sensitivity(mn.sensitivity_terms(X, y, Z).max(axis=1), I), eps)
    for r in range(3):
        H, Y = softmax(X @ Z[r], axis=1), np.eye(K)[y]
        brute = max(sum(abs(X[i, j] * (H[i, k] - Y[i, k])) for j in range(J) for k in range(K))
                    for i in range(n))
        np.testing.assert_allclose(b[r], brute / (I * eps), rtol=1e-12)
    assert np.array_equal(st.laplace_scale(st.sensitivity(mn.sensitivity_terms(X, y, Z).max(axis=1), I),
                                           eps / 2), 2 * b)
    terms = mn.sensitivity_terms(X, y, Z).max(axis=1)
    np.testing.assert_array_equal(st.sensitivity(terms, I, "local_max_x2"), 2 * st.sensitivity(terms, I))
    assert st.sensitivity(None, I, "global", n_features=J) == 4 * J / I  # needs no private data
    assert st.sensitivity(terms, I, "global", n_features=J) == 4 * J / I
    assert np.all(st.sensitivity(None, I, "global", n_features=J) >= st.sensitivity(terms, I, "local_max_x2"))


def test_v5_laplace_draws_match_scale():
    b = 0.0137
    x = laplace_noise([stream(0, "noise", 3, 0)], b, 100_000)[0]
    assert abs(np.abs(x).mean() - b) <= 0.02 * b
    assert abs(x.var() - 2 * b**2) <= 0.05 * 2 * b**2
    assert scipy.stats.kstest(x, "laplace", args=(0.0, b)).pvalue > 1e-3


def test_v5_eps_inf_means_no_noise():
    assert st.laplace_scale(0.5, math.inf) == 0.0
    np.testing.assert_array_equal(st.laplace_scale(np.array([0.1, 0.2]), math.inf), 0.0)
    xi = laplace_noise([stream(0, "noise", 0, r) for r in range(2)], st.laplace_scale(np.array([0.1, 0.2]),
                                                                                        math.inf), J * K)
    assert np.all(xi == 0.0)
    assert admm_outp_sigma(102.0, 1500.0, math.inf) == 0.0
    assert st.outp_inv_eta(0, 2.0, 6000, math.inf) == 0.25 * 6000 / 2.0


def test_v5_outp_golden_values_and_gaussian_draws():
    inv_eta = st.outp_inv_eta(0, 1.0, 6000, 0.05, 1e-6)
    assert abs(inv_eta - 1649.87) <= 0.005
    # Huang et al.'s unsimplified form with c1 = I_p, c3 = 0.25 I_p, c_w = 2 sqrt(JK) gives the same
    JK, Ip, t = 7840, 6000, 41
    full = (0.25 * Ip + 4 * Ip * math.sqrt(JK * (t + 1) * math.log(1.25e6)) / (Ip * 0.05 * 2 * math.sqrt(JK)))
    np.testing.assert_allclose(st.outp_inv_eta(t, 1.0, Ip, 0.05), full, rtol=1e-13)
    np.testing.assert_allclose(st.outp_inv_eta(t, 10.0, Ip, 0.05), full / 10, rtol=1e-13)
    sigma = admm_outp_sigma(102.0, inv_eta, 0.05, 1e-6)
    assert abs(sigma - 0.120986) <= 5e-7
    assert abs(st.outp_noise_std(sigma, "sigma_sq") - 0.0146376) <= 5e-8
    assert st.outp_noise_std(sigma, "sigma") == sigma
    # E|N(0, s^2)| = s sqrt(2/pi): 0.01168 (parity) and 0.09653 (Huang), spec §4
    assert abs(st.outp_noise_std(sigma, "sigma_sq") * math.sqrt(2 / math.pi) - 0.01168) <= 5e-6
    assert abs(sigma * math.sqrt(2 / math.pi) - 0.09653) <= 5e-6
    for s in (sigma, sigma**2):
        x = gaussian_noise([stream(1, "noise", 0, 0)], s, 100_000)[0]
        assert abs(x.std() - s) <= 0.02 * s


def test_mnist_t0_golden_laplace_scale():
    """Spec §3.4: MNIST agent (I_p = 6000 of I = 60000), z = 0: h uniform, ||h - y||_1 = 1.8, and
    b = 1.8 max||x||_1 / (I eps) ~= 7.9e-3 / eps when max ||x||_1 = 262 (mean|xi| = 0.157 at 0.05)."""
    g = stream(9, "test", 0, 0)
    n, Jm, Km, I = 6000, 784, 10, 60000
    X = g.random((n, Jm)) * (g.random((n, Jm)) < 0.12)  # MNIST-like: mostly background
    X[17] = 0.0
    X[17, :262] = 1.0  # the record with the largest ||x||_1 = 262
    y = g.integers(Km, size=n)
    terms = mn.sensitivity_terms(X, y, np.zeros((2, Jm, Km)))
    np.testing.assert_allclose(terms, np.tile(1.8 * X.sum(axis=1), (2, 1)), rtol=1e-13)
    max_l1 = X.sum(axis=1).max()
    assert max_l1 == 262.0
    for eps in (0.05, 0.1, 1.0):
        b = st.laplace_scale(st.sensitivity(terms.max(axis=1), I), eps)
        np.testing.assert_allclose(b, 1.8 * max_l1 / I / eps, rtol=1e-13)
        assert abs(b[0] * eps - 7.9e-3) <= 0.01 * 7.9e-3
    b05 = st.laplace_scale(st.sensitivity(terms.max(axis=1), I), 0.05)[0]
    assert abs(b05 - 0.157) <= 5e-4


# ---------------------------------------------------------------- V6: schedules


def test_v6_rho_golden_values():
    mnist = dict(c1=2.0, c2=5.0, tc=10000)
    assert math.isclose(st.rho_schedule(0, eps_bar=0.05, **mnist), 102.0, rel_tol=1e-13)
    assert math.isclose(st.rho_schedule(9998, eps_bar=0.05, **mnist), 102.0, rel_tol=1e-13)
    assert math.isclose(st.rho_schedule(9999, eps_bar=0.05, **mnist), 102.4, rel_tol=1e-13)  # floor(1e4/1e4)
    assert math.isclose(st.rho_schedule(19999, eps_bar=0.05, **mnist), 2 * 1.44 + 100, rel_tol=1e-13)
    assert st.rho_schedule(0, eps_bar=math.inf, **mnist) == 2.0  # c2 term dropped
    femnist = dict(c1=0.005, c2=0.05, tc=2000)
    assert math.isclose(st.rho_schedule(0, eps_bar=0.05, **femnist), 1.005, rel_tol=1e-13)
    assert math.isclose(st.rho_schedule(1999, eps_bar=0.05, **femnist), 0.006 + 1.0, rel_tol=1e-13)
    # the 1e9 cap, reached and never overflowed; rho is non-decreasing
    assert st.rho_schedule(110 * 10000 - 1, eps_bar=0.05, **mnist) == 1e9  # 2 * 1.2^110 > 1e9
    assert st.rho_schedule(10**15, eps_bar=0.05, **mnist) == 1e9
    below = st.rho_schedule(110 * 10000 - 2, eps_bar=0.05, **mnist)  # 2 * 1.2^109 + 100 < 1e9
    assert math.isclose(below, 2 * 1.2**109 + 100, rel_tol=1e-13) and below < 1e9
    ts = np.arange(0, 200 * 10000, 9973)
    rhos = [st.rho_schedule(int(t), eps_bar=0.05, **mnist) for t in ts]
    assert np.all(np.diff(rhos) >= 0) and rhos[-1] == 1e9
    # variants of App. A.9
    rho0 = st.rho_schedule(0, eps_bar=0.05, **mnist)
    assert st.rho_variant(0, "dynamic_1", eps_bar=0.05, **mnist) == rho0
    assert st.rho_variant(0, "dynamic_2", eps_bar=0.05, **mnist) == rho0 / 100
    assert st.rho_variant(5, "static", eps_bar=0.05, static=10.0, **mnist) == 10.0


def test_v6_eta_and_delta_schedules():
    assert st.eta_objp(0, 1.0) == 1.0 and st.eta_objp(3, 2.0) == 1.0
    assert math.isclose(st.eta_objp(99, 1.0), 0.1, rel_tol=1e-15)
    for t in (0, 7, 19999):
        assert st.delta_objt(t, 1.0) == 1.0  # the code's a/(t+1)*(t+1) = a
        assert math.isclose(st.delta_objt(t, 1.0), 1.0 / (t + 1) * (t + 1))
        assert st.delta_objt(t, 2.0, "inv_sq") == 2.0 / (t + 1) ** 2
    assert sum(st.delta_objt(t, 1.0, "inv_sq") for t in range(20000)) <= math.pi**2 / 6


def test_bad_parameters_raise():
    with pytest.raises(ValueError, match="eps_bar"):
        st.laplace_scale(0.1, 0.0)
    with pytest.raises(ValueError, match="sensitivity mode"):
        st.sensitivity(1.0, 10, "max")
    with pytest.raises(ValueError, match="n_features"):
        st.sensitivity(None, 10, "global")
    with pytest.raises(ValueError, match="trust-radius"):
        st.delta_objt(0, 1.0, "inv")
    with pytest.raises(ValueError, match="OutP noise"):
        st.outp_noise_std(0.1, "var")
    with pytest.raises(ValueError, match="static"):
        st.rho_variant(0, "static", 2.0, 5.0, 100, 0.1)
