"""Tests for mpi_dp.models.multinomial: softmax regression (model (37)) with a runs axis."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.optimize
from scipy.special import log_softmax, softmax

from mpi_dp.models import multinomial as mn
from mpi_dp.rng import stream

J, K = 6, 4


def data(n: int = 300, seed: int = 0, J: int = J, K: int = K):
    """Spec §9 generator: centroids C ~ U[0,1]^{KxJ}, x = clip(C_y + 0.35 N(0, I), 0, 1)."""
    g = stream(seed, "test", 0, 0)
    C = g.random((K, J))
    y = g.integers(K, size=n)
    X = np.clip(C[y] + 0.35 * g.standard_normal((n, J)), 0.0, 1.0)
    return X, y


def models(R: int, scale: float = 1.0, seed: int = 1) -> np.ndarray:
    return scale * stream(seed, "test", 1, 0).standard_normal((R, J, K))


def naive(X, y, W):
    """Independent per-run reference (scipy softmax): loss sum, gradient sum, terms, errors."""
    H = softmax(X @ W, axis=1)
    Y = np.eye(W.shape[1])[y]
    loss = -np.log(np.clip(H[np.arange(len(y)), y], 1e-9, 1.0)).sum()
    grad = X.T @ (H - Y)
    terms = np.array([np.abs(np.outer(X[i], H[i] - Y[i])).sum() for i in range(len(y))])
    wrong = int((np.argmax(X @ W, axis=1) != y).sum())
    return H, loss, grad, terms, wrong


def test_one_hot_and_label_checks():
    y = np.array([2, 0, 3, 3])
    Y = mn.one_hot(y, 4)
    assert Y.shape == (4, 4) and np.array_equal(Y.argmax(axis=1), y) and np.all(Y.sum(axis=1) == 1)
    assert np.array_equal(mn.one_hot(y.astype(np.float64), 4), Y)  # shard labels are floats
    with pytest.raises(ValueError, match="0..3"):
        mn.one_hot(np.array([0, 4]), 4)
    with pytest.raises(ValueError, match="integers"):
        mn.one_hot(np.array([0.5, 1.0]), 4)


def test_against_naive_reference_per_run():
    X, y = data()
    W = models(3)
    H = mn.softmax_probs(X, W)
    L, G = mn.loss_sum(X, y, W), mn.grad_sum(X, y, W)
    T, E = mn.sensitivity_terms(X, y, W), mn.errors(X, y, W)
    assert H.shape == (3, 300, K) and L.shape == (3,) and G.shape == (3, J, K)
    assert T.shape == (3, 300) and E.dtype == np.int64
    for r in range(3):
        h, loss, grad, terms, wrong = naive(X, y, W[r])
        np.testing.assert_allclose(H[r], h, rtol=1e-12, atol=1e-15)
        np.testing.assert_allclose(L[r], loss, rtol=1e-12)
        np.testing.assert_allclose(G[r], grad, rtol=1e-11, atol=1e-12)
        np.testing.assert_allclose(T[r], terms, rtol=1e-12)
        assert E[r] == wrong


def test_softmax_is_stable_and_loss_clips():
    X, y = data(50)
    W = models(2, scale=1e4)  # scores of order 1e4: a naive exp overflows
    H = mn.softmax_probs(X, W)
    assert np.all(np.isfinite(H)) and np.allclose(H.sum(axis=2), 1.0, atol=1e-12)
    np.testing.assert_allclose(H[0], np.exp(log_softmax(X @ W[0], axis=1)), atol=1e-15)
    # most h_y are far below 1e-9 here: each such record contributes exactly -log(1e-9)
    for r in range(2):
        log_hy = log_softmax(X @ W[r], axis=1)[np.arange(50), y]
        want = -np.clip(log_hy, np.log(1e-9), 0.0).sum()
        assert (log_hy < np.log(1e-9)).sum() > 10
        np.testing.assert_allclose(mn.loss_sum(X, y, W)[r], want, rtol=1e-12)
    assert np.all(np.isfinite(mn.grad_sum(X, y, W))) and np.all(np.isfinite(mn.sensitivity_terms(X, y, W)))


def test_gradient_matches_finite_differences():
    X, y = data(120)
    W = models(1, scale=0.5)[0]
    G = mn.grad_sum(X, y, W)[0]
    h = 1e-6
    fd = np.empty_like(W)
    for j in range(J):
        for k in range(K):
            E = np.zeros_like(W)
            E[j, k] = h
            fd[j, k] = (mn.loss_sum(X, y, W + E)[0] - mn.loss_sum(X, y, W - E)[0]) / (2 * h)
    np.testing.assert_allclose(G, fd, rtol=1e-6, atol=1e-6)


def test_runs_axis_equals_loop_of_single_runs(monkeypatch):
    X, y = data(700)
    W = models(5)
    # small chunks so several chunks (and a ragged last one) are exercised
    monkeypatch.setattr(mn, "CHUNK_ELEMS", 64 * 5 * K)
    monkeypatch.setattr(mn, "MIN_CHUNK_ROWS", 16)
    assert mn.chunk_rows(5, K) == 64
    batched = (mn.softmax_probs(X, W), mn.loss_sum(X, y, W), mn.grad_sum(X, y, W),
               mn.sensitivity_terms(X, y, W), mn.errors(X, y, W))
    for r in range(5):
        single = (mn.softmax_probs(X, W[r])[0], mn.loss_sum(X, y, W[r])[0], mn.grad_sum(X, y, W[r])[0],
                  mn.sensitivity_terms(X, y, W[r])[0], mn.errors(X, y, W[r])[0])
        for b, s in zip(batched, single, strict=True):
            np.testing.assert_allclose(b[r], s, rtol=1e-12, atol=1e-12)


def test_grad_and_terms_max_in_one_pass(monkeypatch):
    X, y = data(700)
    W = models(4)
    monkeypatch.setattr(mn, "CHUNK_ELEMS", 64 * 4 * K)
    monkeypatch.setattr(mn, "MIN_CHUNK_ROWS", 16)
    G, tmax = mn.grad_sum_and_terms_max(X, y, W)
    np.testing.assert_array_equal(tmax, mn.sensitivity_terms(X, y, W).max(axis=1))
    np.testing.assert_allclose(G, mn.grad_sum(X, y, W), rtol=1e-13, atol=1e-13)
    G2, tmax2 = mn.grad_sum_and_terms_max(X, y, W, row_l1=X.sum(axis=1))
    np.testing.assert_array_equal(tmax2, tmax)
    np.testing.assert_array_equal(G2, G)


def test_chunks_bound_memory_for_mnist_shapes():
    rows = mn.chunk_rows(20, 10)
    assert rows * 20 * 10 <= mn.CHUNK_ELEMS and rows >= mn.MIN_CHUNK_ROWS
    assert 60000 // rows >= 10  # MNIST with R = 20 is streamed in many chunks


def test_zero_model_golden_values():
    """At w = 0: h uniform, loss = n log K, ||h - y||_1 = 2 (K-1)/K, every record predicted class 0."""
    X, y = data(200)
    W0 = np.zeros((2, J, K))
    np.testing.assert_allclose(mn.loss_sum(X, y, W0), 200 * np.log(K), rtol=1e-13)
    np.testing.assert_allclose(mn.sensitivity_terms(X, y, W0), np.tile(1.5 * X.sum(axis=1), (2, 1)),
                               rtol=1e-13)
    assert np.all(mn.errors(X, y, W0) == (y != 0).sum())


def test_objective_formula():
    W = models(3)
    f = mn.objective(1e-2, np.array([10.0, 20.0, 30.0]), 50, W)
    np.testing.assert_allclose(f, np.array([10.0, 20.0, 30.0]) / 50 + 1e-2 * (W**2).sum(axis=(1, 2)),
                               rtol=1e-14)


def test_centralised_optimum_kkt_and_scipy():
    X, y = data(400, seed=3)
    gamma = 1e-3
    w = mn.centralised_optimum(X, y, K, gamma)
    assert w.shape == (J, K)
    grad = mn.grad_sum(X, y, w)[0] / 400 + 2 * gamma * w
    assert np.abs(grad).max() <= 1e-9
    # independent solve: trust-exact on a scipy-softmax implementation of F with its full Hessian
    Y = np.eye(K)[y]

    def f(v):
        V = v.reshape(J, K)
        return -(Y * log_softmax(X @ V, axis=1)).sum() / 400 + gamma * (V**2).sum()

    def g(v):
        V = v.reshape(J, K)
        return (X.T @ (softmax(X @ V, axis=1) - Y) / 400 + 2 * gamma * V).ravel()

    def hess(v):
        H = softmax(X @ v.reshape(J, K), axis=1)
        A = H[:, :, None] * np.eye(K) - H[:, :, None] * H[:, None, :]  # (n, K, K)
        full = np.einsum("ia,ib,ikl->akbl", X, X, A).reshape(J * K, J * K)
        return full / 400 + 2 * gamma * np.eye(J * K)

    ref = scipy.optimize.minimize(f, np.zeros(J * K), jac=g, hess=hess, method="trust-exact",
                                  options={"gtol": 1e-12}).x
    # F is 2 gamma-strongly convex: ||w - ref|| <= (||grad F(w)|| + ||grad F(ref)||) / (2 gamma)
    bound = (np.linalg.norm(grad) + np.linalg.norm(g(ref))) / (2 * gamma)
    assert bound <= 1e-6
    assert np.linalg.norm(w.ravel() - ref) <= bound
    # and it is the minimiser: F(w) <= F at perturbed points
    F = mn.objective(gamma, mn.loss_sum(X, y, w), 400, w)[0]
    np.testing.assert_allclose(F, f(ref), rtol=1e-12)
    for s in range(3):
        d = 1e-3 * stream(s, "test", 2, 0).standard_normal((J, K))
        assert mn.objective(gamma, mn.loss_sum(X, y, w + d), 400, w + d)[0] > F


def test_centralised_optimum_box_kkt():
    X, y = data(400, seed=3)
    gamma, B = 1e-4, 0.5
    w = mn.centralised_optimum(X, y, K, gamma, w_bound=B)
    assert np.abs(w).max() <= B and np.isclose(np.abs(w).max(), B)
    grad = mn.grad_sum(X, y, w)[0] / 400 + 2 * gamma * w
    free = np.abs(w) < B - 1e-12
    assert np.abs(grad[free]).max() <= 1e-8
    assert np.all(grad[w >= B] <= 1e-8) and np.all(grad[w <= -B] >= -1e-8)  # KKT signs at the bounds


def test_bad_inputs():
    X, y = data(20)
    with pytest.raises(ValueError, match="J = 5"):
        mn.loss_sum(X, y, np.zeros((5, K)))
    with pytest.raises(ValueError, match="20 rows"):
        mn.grad_sum(X, y[:10], np.zeros((J, K)))
    from mpi_dp.errors import NumericalError

    W = np.zeros((2, J, K))
    W[1, 0, 0] = np.nan
    with pytest.raises(NumericalError, match=r"runs \[1\]"):
        mn.errors(X, y, W)
