"""Tests for mpi_dp.models.linear: losses, (clipped) gradients with a runs axis, constants."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

from mpi_dp.errors import NumericalError
from mpi_dp.models import linear
from mpi_dp.rng import stream

P, LAM = 5, 1e-2


def base_block(agent: int = 0, rows: int = 200):
    """The spec's standard synthetic block: X ~ N(0, I), y = X theta_true + 0.5 N(0, 1)."""
    g = stream(0, "data", agent, 0)
    X = g.standard_normal((rows, P))
    theta_true = stream(0, "data", 999, 0).standard_normal(P)
    y = X @ theta_true + 0.5 * g.standard_normal(rows)
    labels = np.where(X @ theta_true + g.standard_normal(rows) > 0, 1.0, -1.0)
    return X, y, labels


def targets(loss: str, y: np.ndarray, labels: np.ndarray) -> np.ndarray:
    return y if loss == "squared" else labels


def thetas(R: int, scale: float = 1.0, seed: int = 1) -> np.ndarray:
    return scale * stream(seed, "test", 0, 0).standard_normal((R, P))


def per_record_grads(loss: str, X, y, theta) -> np.ndarray:
    """Plain loop: gradient of the loss of each record at one theta, shape (n, p)."""
    out = np.empty_like(X)
    for i in range(X.shape[0]):
        z = float(X[i] @ theta)
        if loss == "squared":
            d = 2.0 * (z - y[i])
        elif loss == "hinge":
            d = -y[i] if y[i] * z < 1.0 else 0.0
        else:
            d = -y[i] / (1.0 + np.exp(y[i] * z))
        out[i] = d * X[i]
    return out


@pytest.mark.parametrize("loss", linear.LOSSES)
def test_derivative_matches_finite_differences(loss):
    X, y, labels = base_block()
    yy = targets(loss, y, labels)
    Z = X @ thetas(3).T
    if loss == "hinge":  # stay away from the kink y z = 1
        keep = np.all(np.abs(yy[:, None] * Z - 1.0) > 1e-3, axis=1)
        Z, yy = Z[keep], yy[keep]
    h = 1e-6
    fd = (linear.loss_values(loss, Z + h, yy) - linear.loss_values(loss, Z - h, yy)) / (2 * h)
    np.testing.assert_allclose(linear.loss_derivative(loss, Z, yy), fd, rtol=1e-6, atol=1e-8)


def test_loss_values_known_and_stable():
    y = np.array([1.0, -1.0, 1.0])
    Z = np.array([[0.5], [0.5], [1.0]])
    np.testing.assert_array_equal(linear.loss_values("hinge", Z, y)[:, 0], [0.5, 1.5, 0.0])
    np.testing.assert_array_equal(linear.loss_derivative("hinge", Z, y)[:, 0], [-1.0, 1.0, 0.0])
    np.testing.assert_array_equal(linear.loss_values("squared", Z, y)[:, 0], [0.25, 2.25, 0.0])
    big = np.array([[1000.0], [-1000.0]])
    yl = np.array([1.0, 1.0])
    vals = linear.loss_values("logistic", big, yl)[:, 0]
    np.testing.assert_allclose(vals, [0.0, 1000.0], atol=1e-300)
    ders = linear.loss_derivative("logistic", big, yl)[:, 0]
    np.testing.assert_allclose(ders, [0.0, -1.0], atol=1e-300)
    np.testing.assert_allclose(linear.loss_values("logistic", np.zeros((1, 1)), yl[:1]), np.log(2))


@pytest.mark.parametrize("loss", linear.LOSSES)
def test_grad_sum_and_loss_sum_match_loops(loss):
    X, y, labels = base_block()
    yy = targets(loss, y, labels)
    T = thetas(3)
    G = linear.grad_sum(loss, X, yy, T)
    L = linear.loss_sum(loss, X, yy, T)
    for r in range(3):
        np.testing.assert_allclose(G[r], per_record_grads(loss, X, yy, T[r]).sum(0), rtol=1e-12,
                                   atol=1e-12)
        ref = sum(float(linear.loss_values(loss, np.array([X[i] @ T[r]]), yy[i:i + 1])[0])
                  for i in range(X.shape[0]))
        np.testing.assert_allclose(L[r], ref, rtol=1e-12)


@pytest.mark.parametrize("loss", linear.LOSSES)
def test_clipped_grad_sum_matches_loop(loss):
    X, y, labels = base_block()
    yy = targets(loss, y, labels)
    T = thetas(3)
    norms = linear.grad_l1_norms(loss, X, yy, T)
    xi = float(np.median(norms[norms > 0]))
    S, counts = linear.clipped_grad_sum(loss, X, yy, T, xi)
    assert counts.dtype == np.int64
    for r in range(3):
        g = per_record_grads(loss, X, yy, T[r])
        l1 = np.abs(g).sum(1)
        np.testing.assert_allclose(norms[:, r], l1, rtol=1e-12, atol=1e-300)
        clipped = np.array([v * min(1.0, xi / nv) if nv > 0 else v for v, nv in zip(g, l1, strict=True)])
        assert np.all(np.abs(clipped).sum(1) <= xi * (1 + 1e-12))
        np.testing.assert_allclose(S[r], clipped.sum(0), rtol=1e-12, atol=1e-12)
        assert counts[r] == int(np.sum(l1 > xi)) and counts[r] > 0


@pytest.mark.parametrize("loss", linear.LOSSES)
def test_no_clipping_with_infinite_or_huge_xi(loss):
    X, y, labels = base_block()
    yy = targets(loss, y, labels)
    T = thetas(4)
    for xi in (np.inf, 1e12):
        S, counts = linear.clipped_grad_sum(loss, X, yy, T, xi)
        np.testing.assert_array_equal(S, linear.grad_sum(loss, X, yy, T))
        assert not counts.any()
    with pytest.raises(ValueError):
        linear.clipped_grad_sum(loss, X, yy, T, 0.0)


@pytest.mark.parametrize("share", [0.0, 1.0])  # 0: always the full pass, 1: always screened
@pytest.mark.parametrize("sparse", [False, True])
def test_squared_screened_path_equals_plain_loop(share, sparse, monkeypatch):
    """SquaredStats path (Gram sum minus the correction on records that may be clipped) gives the
    plain loop's clipped sum and counts, for clipping from none to most records and for runs close
    together (few candidates) or far apart (loose bound)."""
    monkeypatch.setattr(linear, "SCREEN_MAX_SHARE", share)
    X, y, _ = base_block(rows=300)
    X[7] = 0.0  # a record with ||x||_1 = 0: threshold inf, never clipped
    Xs = sp.csr_matrix(X) if sparse else X
    stats = linear.squared_stats(Xs, y)
    np.testing.assert_allclose(stats.gram, X.T @ X, rtol=1e-13)
    center = thetas(1)[0]
    for spread in (1e-3, 1.0):
        T = center + spread * thetas(4, seed=2)
        norms = linear.grad_l1_norms("squared", X, y, T)
        for q in (0.3, 0.9, 0.99, 1.0):
            xi = float(np.quantile(norms, q)) * (1.5 if q == 1.0 else 1.0)
            S, counts = linear.clipped_grad_sum("squared", Xs, y, T, xi, stats)
            for r in range(T.shape[0]):
                g = per_record_grads("squared", X, y, T[r])
                l1 = np.abs(g).sum(1)
                f = np.minimum(1.0, xi / np.where(l1 > 0, l1, 1.0))
                np.testing.assert_allclose(S[r], (g * f[:, None]).sum(0), rtol=1e-10, atol=1e-10)
                assert counts[r] == int(np.sum(l1 > xi))
    S, counts = linear.clipped_grad_sum("squared", Xs, y, T, np.inf, stats)
    np.testing.assert_allclose(S, linear.grad_sum("squared", X, y, T), rtol=1e-10, atol=1e-10)
    assert not counts.any()


@pytest.mark.parametrize("loss", linear.LOSSES)
def test_runs_axis_equals_single_runs(loss):
    X, y, labels = base_block()
    yy = targets(loss, y, labels)
    T = thetas(7)
    xi = 2.0
    S7, c7 = linear.clipped_grad_sum(loss, X, yy, T, xi)
    G7, L7 = linear.grad_sum(loss, X, yy, T), linear.loss_sum(loss, X, yy, T)
    N7 = linear.grad_l1_norms(loss, X, yy, T)
    for r in range(7):
        S1, c1 = linear.clipped_grad_sum(loss, X, yy, T[r], xi)
        assert S1.shape == (1, P) and c1.shape == (1,)
        np.testing.assert_allclose(S7[r], S1[0], rtol=1e-12, atol=1e-13)
        assert c7[r] == c1[0]
        np.testing.assert_allclose(G7[r], linear.grad_sum(loss, X, yy, T[r])[0], rtol=1e-12,
                                   atol=1e-13)
        np.testing.assert_allclose(L7[r], linear.loss_sum(loss, X, yy, T[r])[0], rtol=1e-12)
        np.testing.assert_allclose(N7[:, r], linear.grad_l1_norms(loss, X, yy, T[r])[:, 0],
                                   rtol=1e-12)


@pytest.mark.parametrize("loss", linear.LOSSES)
def test_chunking_invariance(loss, monkeypatch):
    X, y, labels = base_block(rows=600)
    yy = targets(loss, y, labels)
    T = thetas(3)
    one = (linear.loss_sum(loss, X, yy, T), linear.grad_sum(loss, X, yy, T),
           linear.clipped_grad_sum(loss, X, yy, T, 1.5), linear.grad_l1_norms(loss, X, yy, T))
    monkeypatch.setattr(linear, "MIN_CHUNK_ROWS", 16)
    monkeypatch.setattr(linear, "CHUNK_ELEMS", 64 * T.shape[0])
    assert linear.chunk_rows(T.shape[0]) == 64
    many = (linear.loss_sum(loss, X, yy, T), linear.grad_sum(loss, X, yy, T),
            linear.clipped_grad_sum(loss, X, yy, T, 1.5), linear.grad_l1_norms(loss, X, yy, T))
    np.testing.assert_allclose(many[0], one[0], rtol=1e-12)
    np.testing.assert_allclose(many[1], one[1], rtol=1e-12, atol=1e-11)
    np.testing.assert_allclose(many[2][0], one[2][0], rtol=1e-12, atol=1e-11)
    np.testing.assert_array_equal(many[2][1], one[2][1])
    np.testing.assert_allclose(many[3], one[3], rtol=1e-12)


def test_default_chunk_larger_shard():
    g = stream(3, "test", 0, 0)
    n = linear.chunk_rows(2) * 2 + 123
    X = g.standard_normal((n, P))
    y = g.standard_normal(n)
    T = thetas(2)
    G = linear.grad_sum("squared", X, y, T)
    ref = X.T @ (2.0 * (X @ T.T - y[:, None]))
    np.testing.assert_allclose(G, ref.T, rtol=1e-12, atol=1e-9)
    np.testing.assert_allclose(linear.loss_sum("squared", X, y, T),
                               ((X @ T.T - y[:, None]) ** 2).sum(0), rtol=1e-12)


@pytest.mark.parametrize("loss", linear.LOSSES)
def test_sparse_X_matches_dense(loss):
    X, y, labels = base_block()
    X = np.where(np.abs(X) < 0.5, 0.0, X)
    yy = targets(loss, y, labels)
    T = thetas(3)
    Xs = sp.csr_matrix(X)
    np.testing.assert_allclose(linear.loss_sum(loss, Xs, yy, T), linear.loss_sum(loss, X, yy, T),
                               rtol=1e-12)
    S, c = linear.clipped_grad_sum(loss, Xs, yy, T, 1.0)
    S2, c2 = linear.clipped_grad_sum(loss, X, yy, T, 1.0)
    np.testing.assert_allclose(S, S2, rtol=1e-12, atol=1e-12)
    np.testing.assert_array_equal(c, c2)
    np.testing.assert_allclose(linear.grad_l1_norms(loss, Xs, yy, T),
                               linear.grad_l1_norms(loss, X, yy, T), rtol=1e-12)


@pytest.mark.parametrize("loss", linear.LOSSES)
def test_V3_sensitivity_of_clipped_mean(loss):
    X, y, labels = base_block()
    yy = targets(loss, y, labels)
    n = X.shape[0]
    T = thetas(3)
    xi = float(np.percentile(linear.grad_l1_norms(loss, X, yy, T), 75))
    Q = linear.clipped_grad_sum(loss, X, yy, T, xi)[0] / n
    g = stream(4, "test", 0, 0)
    worst = 0.0
    for _ in range(1000):
        j = int(g.integers(n))
        X2, y2 = X.copy(), yy.copy()
        X2[j] = 5.0 * g.standard_normal(P)
        y2[j] = 10.0 * g.standard_normal() if loss == "squared" else -yy[j]
        Q2 = linear.clipped_grad_sum(loss, X2, y2, T, xi)[0] / n
        diff = np.abs(Q - Q2).sum(1)
        assert np.all(diff <= 2 * xi / n * (1 + 1e-12))
        worst = max(worst, float(diff.max()))
    assert worst > 0.5 * xi / n  # the bound is nearly attained, so the test has teeth


def test_bad_inputs():
    X, y, _ = base_block()
    with pytest.raises(ValueError, match="unknown loss"):
        linear.loss_sum("huber", X, y, np.zeros(P))
    bad = np.zeros((2, P))
    bad[1, 2] = np.nan
    with pytest.raises(NumericalError):
        linear.loss_sum("squared", X, y, bad)
    bad[1, 2] = np.inf
    with pytest.raises(NumericalError):
        linear.clipped_grad_sum("squared", X, y, bad, 1.0)
    with pytest.raises(ValueError):
        linear.grad_sum("squared", X, y, np.zeros(P + 1))


def test_objective_rel_fitness_project_box():
    T = np.array([[1.0, -2.0, 0.0, 0.0, 3.0], [0.0] * 5])
    f = linear.objective(0.5, np.array([10.0, 4.0]), 4, T)
    np.testing.assert_allclose(f, [0.25 * 14 + 2.5, 1.0])
    assert linear.objective(0.5, np.array([4.0]), 4, np.zeros(P)).shape == (1,)
    np.testing.assert_allclose(linear.rel_fitness(f, 1.0), f - 1.0)
    np.testing.assert_array_equal(linear.project_box(T, 1.5), np.clip(T, -1.5, 1.5))
    np.testing.assert_array_equal(linear.project_box(T, np.inf), T)
    assert linear.project_box(T[0], 1.0).shape == (P,)


def test_curvature_and_strong_convexity_constants():
    X, _, labels = base_block()
    m = X.shape[0]
    eig = np.linalg.eigvalsh(2.0 / m * X.T @ X + LAM * np.eye(P))
    assert linear.curvature_constant("squared", X, LAM) == pytest.approx(eig[-1], rel=1e-12)
    assert linear.strong_convexity_constant("squared", X, LAM) == pytest.approx(eig[0], rel=1e-12)
    assert linear.strong_convexity_constant("logistic", X, LAM) == LAM
    assert linear.curvature_constant("hinge", X, LAM) == pytest.approx(eig[-1] / 2 + LAM / 2,
                                                                       rel=1e-12)
    L = linear.curvature_constant("logistic", X, LAM)
    for theta in thetas(5):  # the logistic Hessian never exceeds L
        s = 1.0 / (1.0 + np.exp(-labels * (X @ theta)))
        H = (X * (s * (1 - s))[:, None]).T @ X / m + LAM * np.eye(P)
        assert np.linalg.eigvalsh(H)[-1] <= L * (1 + 1e-12)
    assert linear.curvature_constant("squared", sp.csr_matrix(X), LAM) == pytest.approx(eig[-1])
