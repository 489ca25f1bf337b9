"""Multiclass logistic regression, model (37) of the DP inexact ADMM spec, with a leading runs axis.

w in R^{J x K} (column k holds the weights of class k, no bias term); scores s = x^T w,
h = softmax(s), loss l = -log h_y, regulariser r(w) = ||w||_F^2. Every function takes the models of
all Monte-Carlo runs at once, ``W`` of shape (R, J, K) (a 2-D (J, K) model is promoted to (1, J, K)).

The runs are laid side by side as one (J, R*K) matrix, so the scores of a row chunk for every run are
one GEMM ``X_c @ W_flat`` and the gradient sum is one GEMM ``X_c^T D``: no Python loop over runs.
Records are processed in row chunks whose (rows x R x K) intermediates hold about CHUNK_ELEMS numbers,
so memory stays bounded (MNIST: 60,000 x 784 with R = 20, K = 10 uses chunks of 5,242 rows, ~8 MB per
block). Chunks are summed in a fixed order, so the result for a given R is deterministic.

X is a dense (n, J) array (float32 or float64, features in [0, 1]); y an (n,) integer label array in
0..K-1 (integer-valued floats, the shard format's y, are accepted). The loss clips h_y to [1e-9, 1]
before the log as the reference code does; the gradient and the sensitivity use the unclipped, stably
computed softmax (the difference is negligible, spec §6).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np

from mpi_dp.errors import NumericalError
from mpi_dp.models.reference import minimize_smooth

#: Numbers per (rows x R x K) intermediate block when streaming over records (8 MiB of float64).
CHUNK_ELEMS = 2**20
#: Fewest rows per chunk (keeps the GEMMs efficient when R * K is large).
MIN_CHUNK_ROWS = 256
#: Lower clip of h_y before taking its log (spec §6).
H_MIN = 1e-9


def as_runs(W: np.ndarray) -> np.ndarray:
    """W as a float64 (R, J, K) array; a 2-D (J, K) model becomes (1, J, K)."""
    A = np.asarray(W, dtype=np.float64)
    if A.ndim == 2:
        A = A[None]
    if A.ndim != 3:
        raise ValueError(f"W must have shape (R, J, K) or (J, K), got {A.shape}")
    return A


def one_hot(y: np.ndarray, K: int) -> np.ndarray:
    """(n, K) float64 one-hot encoding of integer labels y in 0..K-1."""
    y = _labels(y, K)
    out = np.zeros((y.shape[0], int(K)))
    out[np.arange(y.shape[0]), y] = 1.0
    return out


def chunk_rows(runs: int, K: int) -> int:
    """Rows per chunk for `runs` runs and K classes: max(MIN_CHUNK_ROWS, CHUNK_ELEMS // (runs K))."""
    return max(int(MIN_CHUNK_ROWS), int(CHUNK_ELEMS) // max(1, int(runs) * int(K)))


def _chunks(n: int, runs: int, K: int) -> Iterator[slice]:
    step = chunk_rows(runs, K)
    for start in range(0, n, step):
        yield slice(start, min(start + step, n))


def _labels(y: np.ndarray, K: int) -> np.ndarray:
    """Labels as an intp array; integer-valued floats (the shard format's y) are accepted."""
    y = np.asarray(y)
    if y.ndim != 1:
        raise ValueError(f"y must be a 1-D label array, got shape {y.shape}")
    if not np.issubdtype(y.dtype, np.integer):
        if y.size and not np.all(np.floor(y) == y):
            raise ValueError("labels must be integers 0..K-1, got non-integer values")
        y = y.astype(np.intp)
    y = y.astype(np.intp, copy=False)
    if y.size and (y.min() < 0 or y.max() >= K):
        raise ValueError(f"labels must lie in 0..{K - 1}, got range [{y.min()}, {y.max()}]")
    return y


def _prepare(X: np.ndarray, y: np.ndarray, W: np.ndarray, where: str):
    """Checked (R, J, K) W, its (J, R*K) flat form, and the labels as intp."""
    A = as_runs(W)
    if not np.all(np.isfinite(A)):
        bad = np.unique(np.nonzero(~np.isfinite(A))[0])
        raise NumericalError(f"{where}: model parameters contain NaN or inf (runs {bad.tolist()})")
    if X.ndim != 2 or X.shape[1] != A.shape[1]:
        raise ValueError(f"{where}: X must be (n, J) with J = {A.shape[1]}, got {X.shape}")
    y = _labels(y, A.shape[2])
    if y.shape[0] != X.shape[0]:
        raise ValueError(f"{where}: X has {X.shape[0]} rows but y has {y.shape[0]} labels")
    R, J, K = A.shape
    return A, A.transpose(1, 0, 2).reshape(J, R * K), y


def _shifted_scores(Xc: np.ndarray, Wf: np.ndarray, R: int, K: int) -> np.ndarray:
    """Scores minus their per-(record, run) maximum, shape (rows, R, K) (one GEMM for all runs)."""
    S = (np.asarray(Xc, dtype=np.float64) @ Wf).reshape(Xc.shape[0], R, K)
    S -= S.max(axis=2, keepdims=True)
    return S


def _probs(S: np.ndarray) -> np.ndarray:
    """Softmax over the class axis of shifted scores S (rows, R, K), in place."""
    np.exp(S, out=S)
    S /= S.sum(axis=2, keepdims=True)
    return S


def softmax_probs(X: np.ndarray, W: np.ndarray) -> np.ndarray:
    """Class probabilities h(w; x_i) of every record for every run, shape (R, n, K) (stable softmax)."""
    A, Wf, _ = _prepare(X, np.zeros(X.shape[0], dtype=np.intp), W, "softmax_probs")
    R, _, K = A.shape
    out = np.empty((R, X.shape[0], K))
    for s in _chunks(X.shape[0], R, K):
        out[:, s] = _probs(_shifted_scores(X[s], Wf, R, K)).transpose(1, 0, 2)
    return out


def loss_sum(X: np.ndarray, y: np.ndarray, W: np.ndarray) -> np.ndarray:
    """Sum over records of -log(clip(h_y, 1e-9, 1)) per run, shape (R,)."""
    A, Wf, y = _prepare(X, y, W, "loss_sum")
    R, _, K = A.shape
    total = np.zeros(R)
    for s in _chunks(X.shape[0], R, K):
        S = _shifted_scores(X[s], Wf, R, K)
        rows = np.arange(S.shape[0])
        log_hy = S[rows, :, y[s]] - np.log(np.exp(S).sum(axis=2))  # (rows, R)
        total -= np.clip(log_hy, np.log(H_MIN), 0.0).sum(axis=0)
    return total


def grad_sum(X: np.ndarray, y: np.ndarray, W: np.ndarray) -> np.ndarray:
    """Sum over records of the loss gradients X^T (H - Y) per run, shape (R, J, K).

    Per chunk one GEMM X_c^T D with D = H - Y laid out (rows, R*K).
    """
    A, Wf, y = _prepare(X, y, W, "grad_sum")
    R, J, K = A.shape
    total = np.zeros((J, R * K))
    for s in _chunks(X.shape[0], R, K):
        Xc = np.asarray(X[s], dtype=np.float64)
        D = _probs(_shifted_scores(Xc, Wf, R, K))
        D[np.arange(D.shape[0]), :, y[s]] -= 1.0
        total += Xc.T @ D.reshape(D.shape[0], R * K)
    return total.reshape(J, R, K).transpose(1, 0, 2).copy()


def grad_sum_and_terms_max(
    X: np.ndarray, y: np.ndarray, W: np.ndarray, row_l1: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """One softmax pass for an ObjT/ObjP agent step: `grad_sum` (R, J, K) and the per-run maximum of
    `sensitivity_terms` (R,) (the input of admm_steps.sensitivity). `row_l1` = ||x_i||_1 (n,) may be
    precomputed once per agent."""
    A, Wf, y = _prepare(X, y, W, "grad_sum_and_terms_max")
    R, J, K = A.shape
    l1 = np.abs(X).sum(axis=1, dtype=np.float64) if row_l1 is None else np.asarray(row_l1, dtype=np.float64)
    total = np.zeros((J, R * K))
    tmax = np.zeros(R)
    for s in _chunks(X.shape[0], R, K):
        Xc = np.asarray(X[s], dtype=np.float64)
        D = _probs(_shifted_scores(Xc, Wf, R, K))
        rows = np.arange(D.shape[0])
        hy = D[rows, :, y[s]]  # (rows, R) copy
        D[rows, :, y[s]] = 0.0
        if D.shape[0]:  # ||h - y||_1 = 2 sum_{k != y} h_k, as in sensitivity_terms
            np.maximum(tmax, (2.0 * D.sum(axis=2) * l1[s][:, None]).max(axis=0), out=tmax)
        D[rows, :, y[s]] = hy - 1.0
        total += Xc.T @ D.reshape(D.shape[0], R * K)
    return total.reshape(J, R, K).transpose(1, 0, 2).copy(), tmax


def sensitivity_terms(X: np.ndarray, y: np.ndarray, W: np.ndarray) -> np.ndarray:
    """Per-record l1 norms of the loss gradient, ||x_i||_1 * ||h_i - y_i||_1, shape (R, n).

    ||h - y||_1 = 2 (1 - h_y) is computed as 2 sum_{k != y} h_k (no cancellation when h_y ~ 1).
    """
    A, Wf, y = _prepare(X, y, W, "sensitivity_terms")
    R, _, K = A.shape
    out = np.empty((R, X.shape[0]))
    for s in _chunks(X.shape[0], R, K):
        Xc = np.asarray(X[s], dtype=np.float64)
        H = _probs(_shifted_scores(Xc, Wf, R, K))
        H[np.arange(H.shape[0]), :, y[s]] = 0.0
        out[:, s] = (2.0 * H.sum(axis=2) * np.abs(Xc).sum(axis=1)[:, None]).T
    return out


def errors(X: np.ndarray, y: np.ndarray, W: np.ndarray) -> np.ndarray:
    """Misclassified record counts per run (prediction = argmax of the scores, first on ties), (R,)."""
    A, Wf, y = _prepare(X, y, W, "errors")
    R, _, K = A.shape
    wrong = np.zeros(R, dtype=np.int64)
    for s in _chunks(X.shape[0], R, K):
        pred = _shifted_scores(X[s], Wf, R, K).argmax(axis=2)  # (rows, R)
        wrong += (pred != y[s][:, None]).sum(axis=0)
    return wrong


def objective(gamma: float, loss_total: np.ndarray, n_total: int, W: np.ndarray) -> np.ndarray:
    """F(w) = loss_total / I + gamma ||w||_F^2 per run, shape (R,).

    `loss_total` is the (R,) loss sum over all agents' records (e.g. a Reduce of `loss_sum`).
    """
    A = as_runs(W)
    return np.asarray(loss_total, dtype=np.float64) / n_total + gamma * np.einsum("rjk,rjk->r", A, A)


def fun_and_grad(
    X: np.ndarray, y: np.ndarray, K: int, gamma: float
) -> Callable[[np.ndarray], tuple[float, np.ndarray]]:
    """Callback flat w (J*K,) -> (F(w), grad F(w) flat) over in-memory data (I = len(y))."""
    n, J = X.shape

    def fg(w: np.ndarray) -> tuple[float, np.ndarray]:
        W = np.asarray(w, dtype=np.float64).reshape(J, K)
        f = float(objective(gamma, loss_sum(X, y, W), n, W)[0])
        g = grad_sum(X, y, W)[0] / n + 2.0 * gamma * W
        return f, g.ravel()

    return fg


def centralised_optimum(
    X: np.ndarray, y: np.ndarray, K: int, gamma: float, tol: float = 1e-12,
    w_bound: float | None = None,
) -> np.ndarray:
    """Minimiser w* (J, K) of F over all data (L-BFGS-B, analytic gradient, gtol `tol`).

    Uses models.reference.minimize_smooth (restarted until F stalls); `w_bound` boxes W to
    [-B, B]^{JxK} (None = unconstrained, the final reference code).
    """
    J = X.shape[1]
    _labels(y, K)
    bound = np.inf if w_bound is None else float(w_bound)
    w = minimize_smooth(fun_and_grad(X, y, K, gamma), J * K, bound, solver="scipy", tol=tol)
    return w.reshape(J, K)
