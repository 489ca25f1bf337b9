"""Tests for mpi_dp.models.reference: the non-private optimum theta* to 1e-8 relative in f."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import numpy as np
import pytest
import scipy.optimize

from mpi_dp.models import linear, reference
from mpi_dp.rng import stream

P, LAM, THETA_MAX = 5, 1e-2, 1e6


def owners_data(n_owners: int = 3, rows: int = 200):
    """Distinct standard blocks per owner (X ~ N(0, I), y = X theta_true + 0.5 N(0,1)) + labels."""
    theta_true = stream(0, "data", 999, 0).standard_normal(P)
    Xs, ys, ls = [], [], []
    for i in range(n_owners):
        g = stream(0, "data", i, 0)
        X = g.standard_normal((rows, P))
        Xs.append(X)
        ys.append(X @ theta_true + 0.5 * g.standard_normal(rows))
        ls.append(np.where(X @ theta_true + g.standard_normal(rows) > 0, 1.0, -1.0))
    return np.vstack(Xs), np.concatenate(ys), np.concatenate(ls)


def targets(loss, y, labels):
    return y if loss == "squared" else labels


def f_of(loss, X, y, Theta, lam=LAM):
    return linear.objective(lam, linear.loss_sum(loss, X, y, Theta), X.shape[0], Theta)


def test_ridge_closed_form_vs_lbfgsb():
    X, y, _ = owners_data()
    n = X.shape[0]
    th_c = reference.ridge_closed_form(X.T @ X, X.T @ y, n, LAM)
    grad = LAM * th_c + linear.grad_sum("squared", X, y, th_c)[0] / n
    assert np.max(np.abs(grad)) < 1e-12
    th_s = reference.minimize_smooth(reference.local_fun_and_grad("squared", X, y, LAM), P,
                                     THETA_MAX)
    f_c, f_s = f_of("squared", X, y, th_c)[0], f_of("squared", X, y, th_s)[0]
    assert abs(f_s / f_c - 1) < 1e-8
    np.testing.assert_allclose(th_s, th_c, rtol=0, atol=1e-6 * np.max(np.abs(th_c)))
    np.testing.assert_array_equal(reference.theta_star_local("squared", X, y, LAM, THETA_MAX),
                                  th_c)


def test_logistic_scipy_optimum():
    X, _, labels = owners_data()
    n = X.shape[0]
    th = reference.theta_star_local("logistic", X, labels, LAM, THETA_MAX)
    grad = LAM * th + linear.grad_sum("logistic", X, labels, th)[0] / n
    assert np.linalg.norm(grad) < 1e-8
    f0 = f_of("logistic", X, labels, th)[0]
    g = stream(5, "test", 0, 0)
    for scale in (1e-4, 1e-2, 1.0):
        pert = th + scale * g.standard_normal((50, P))
        assert np.all(f_of("logistic", X, labels, pert) >= f0 * (1 - 1e-15))


def _hinge_dual_lbfgsb(X, y, lam):
    """Independent dual value D* (<= P*) of the L1-loss SVM by L-BFGS-B on the smooth box QP."""
    n = X.shape[0]
    C = 1.0 / (lam * n)
    Z = y[:, None] * X

    def neg_dual(a):
        w = Z.T @ a
        return 0.5 * w @ w - a.sum(), Z @ w - 1.0

    res = scipy.optimize.minimize(neg_dual, np.full(n, C / 2), jac=True, method="L-BFGS-B",
                                  bounds=[(0.0, C)] * n,
                                  options={"ftol": 0.0, "gtol": 1e-14, "maxiter": 100000})
    return -res.fun


@pytest.mark.parametrize("lam", [LAM, 1e-3])
def test_hinge_dual_cd_exact(lam):
    X, _, labels = owners_data()
    n = X.shape[0]
    th = reference.theta_star_local("hinge", X, labels, lam, 1e3)
    f = f_of("hinge", X, labels, th, lam)[0]
    # weak duality: lam * D(a) <= f* <= f(th) for any feasible a, here an independent dual solve
    d = lam * _hinge_dual_lbfgsb(X, labels, lam)
    assert d <= f * (1 + 1e-12)
    assert (f - d) / f < 1e-8
    # KKT: lam th = (1/n) sum b_i y_i x_i with b_i = 1 on margin < 1, 0 on > 1, [0, 1] on = 1
    m = labels * (X @ th)
    on = np.abs(m - 1.0) < 1e-8
    assert 0 < on.sum() <= P
    Z = labels[:, None] * X
    rhs = lam * n * th - Z[m < 1.0 - 1e-8].sum(0)
    b = np.linalg.lstsq(Z[on].T, rhs, rcond=None)[0]
    np.testing.assert_allclose(Z[on].T @ b, rhs, atol=1e-8 * np.abs(rhs).max())
    assert np.all(b >= -1e-8) and np.all(b <= 1 + 1e-8)
    g = stream(6, "test", 0, 0)
    pert = th + 1e-3 * g.standard_normal((50, P))
    assert np.all(f_of("hinge", X, labels, pert, lam) >= f)


def test_hinge_refuses_binding_box_and_bad_labels():
    X, _, labels = owners_data()
    with pytest.raises(ValueError, match="box binds"):
        reference.theta_star_local("hinge", X, labels, LAM, 1e-3)
    with pytest.raises(ValueError, match=r"\{-1, \+1\}"):
        reference.svm_dual_cd(X, (labels + 1) / 2, LAM)
    with pytest.raises(ValueError):
        reference.theta_star_local("hinge", X, labels, LAM, 1e3, solver="scipy")


@pytest.mark.parametrize("loss", ["squared", "logistic"])
def test_box_binding_projected_gradient_optimality(loss):
    X, y, labels = owners_data()
    yy = targets(loss, y, labels)
    n = X.shape[0]
    free = reference.theta_star_local(loss, X, yy, LAM, THETA_MAX)
    tmax = 0.5 * np.max(np.abs(free))
    th = reference.theta_star_local(loss, X, yy, LAM, tmax)  # squared: closed form falls back
    assert np.max(np.abs(th)) <= tmax
    active = np.abs(th) == tmax
    assert active.any()
    grad = LAM * th + linear.grad_sum(loss, X, yy, th)[0] / n
    assert np.max(np.abs(grad[~active])) < 1e-9
    assert np.all(grad[th == tmax] <= 1e-12) and np.all(grad[th == -tmax] >= -1e-12)
    np.testing.assert_array_equal(reference.projected_gradient(th, grad, tmax)[active], 0.0)
    g = stream(7, "test", 0, 0)
    pert = linear.project_box(th + 1e-2 * g.standard_normal((50, P)), tmax)
    assert np.all(f_of(loss, X, yy, pert) >= f_of(loss, X, yy, th)[0] * (1 - 1e-15))


@pytest.mark.parametrize("loss", linear.LOSSES)
def test_V14_psi_sanity(loss):
    X, y, labels = owners_data()
    yy = targets(loss, y, labels)
    tmax = 1e3 if loss == "hinge" else THETA_MAX
    th = reference.theta_star_local(loss, X, yy, LAM, tmax)
    f_star = f_of(loss, X, yy, th)[0]
    assert abs(linear.rel_fitness(f_of(loss, X, yy, th), f_star)[0]) <= 1e-12
    g = stream(8, "test", 0, 0)
    T = np.vstack([th + s * g.standard_normal((20, P)) for s in (1e-6, 1e-3, 1.0)])
    assert np.all(linear.rel_fitness(f_of(loss, X, yy, T), f_star) >= -1e-12)
    th1 = reference.theta_star_local(loss, X[:200], yy[:200], LAM, tmax)  # owner 1 alone
    assert linear.rel_fitness(f_of(loss, X, yy, th1), f_star)[0] > 1e-6


def test_solver_argument_validation():
    X, y, labels = owners_data()
    with pytest.raises(ValueError, match="unknown solver"):
        reference.theta_star_local("squared", X, y, LAM, THETA_MAX, solver="cvx")
    with pytest.raises(ValueError, match="no closed form"):
        reference.theta_star_local("logistic", X, labels, LAM, THETA_MAX, solver="closed")
    with pytest.raises(ValueError):
        reference.minimize_smooth(lambda t: (0.0, t), P, 1.0, solver="nope")
    assert isinstance(reference.petsc_available(), bool)


@pytest.mark.petsc
@pytest.mark.skipif(importlib.util.find_spec("petsc4py") is None, reason="petsc4py is not installed")
def test_an_installed_petsc4py_loads_in_a_fresh_process():
    """pip's cached petsc/petsc4py wheels keep the RUNPATH of the venv they were built in, so in a
    venv at another path libmpi.so.12 is found only once mpi4py has loaded it: an installed
    petsc4py must load from a process that has not imported MPI yet (it silently skipped every
    PETSc test before)."""
    code = "from mpi_dp.models.reference import petsc_available; print(petsc_available())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "True", out.stderr


@pytest.mark.petsc
@pytest.mark.skipif(not reference.petsc_available(), reason="petsc4py is not installed")
@pytest.mark.parametrize("loss", ["squared", "logistic"])
@pytest.mark.parametrize("tmax_factor", [None, 0.5])
def test_petsc_matches_scipy(loss, tmax_factor):
    X, y, labels = owners_data()
    yy = targets(loss, y, labels)
    tmax = THETA_MAX
    if tmax_factor is not None:
        tmax = tmax_factor * np.max(np.abs(reference.theta_star_local(loss, X, yy, LAM, tmax)))
    th_s = reference.theta_star_local(loss, X, yy, LAM, tmax, solver="scipy")
    th_p = reference.theta_star_local(loss, X, yy, LAM, tmax, solver="petsc")
    assert np.max(np.abs(th_p)) <= tmax
    f_s, f_p = f_of(loss, X, yy, th_s)[0], f_of(loss, X, yy, th_p)[0]
    assert abs(f_p / f_s - 1) < 1e-8
