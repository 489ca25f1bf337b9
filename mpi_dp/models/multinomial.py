"""Multiclass logistic regression, model (37) of the DP inexact ADMM spec, with a leading runs axis.

w in R^{J x K} (column k holds the weights of class k, no bias term); scores s = x^T w,
h = softmax(s), loss l = -log h_y, regulariser r(w) = ||w||_F^2. Every function takes the models of
all Monte-Carlo runs at once, ``W`` of shape (R, J, K) (a 2-D (J, K) model is promoted to (1, J, K)).

The runs' weight vectors are the rows of one (R*K, J) matrix W^T (row r*K + k = w_r[:, k]), so the
scores of a row chunk X_c for every run are one GEMM ``W^T X_c^T`` (R*K, rows) and the gradient sum is
one GEMM ``D^T X_c`` (R*K, J), D^T = (H - Y)^T laid out (R*K, rows): no Python loop over runs, and
every operand is C-contiguous or a transposed view of one (X_c^T), so BLAS makes no copies. The
(R, K, rows) block keeps the records on the contiguous axis: the softmax's reductions over the K
classes are elementwise operations on contiguous rows, done in place in one scratch buffer reused
by every chunk. Records are processed in row chunks (of nearly equal sizes) whose (R x K x rows)
block holds at most CHUNK_ELEMS numbers, so memory stays bounded and the block stays in a core's L2
cache between the GEMM and the softmax passes (MNIST: 6,000 records per agent with R = 20, K = 10
are 5 chunks of 1,200 rows, 1.8 MiB per block). Chunks are summed in a fixed order, so the result
for a given R is deterministic.

X is a dense (n, J) array (float32 or float64, features in [0, 1]); y an (n,) integer label array in
0..K-1 (integer-valued floats, the shard format's y, are accepted). The loss clips h_y to [1e-9, 1]
before the log as the reference code does; the gradient and the sensitivity use the unclipped, stably
computed softmax (the difference is negligible, spec §6).

Backends (mpi_dp.backend): X and y may also live on a device (CuPy, or array_api_strict as the
test stand-in). The kernels then take their namespace from X through array-api-compat and run the
same steps as array-API operations (no `out=`, label entries through a one-hot mask instead of a
flat index), in row chunks of at most DEVICE_CHUNK_ELEMS numbers, and return arrays of X's
namespace; the models W may be host or device arrays. Labels on a device are taken as checked
(`device_labels` checks them once on the host when they move). NumPy inputs take the in-place
NumPy code, bitwise as before.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from mpi_dp.backend import namespace, on_host, to_numpy
from mpi_dp.errors import NumericalError
from mpi_dp.models.reference import minimize_smooth

#: Most numbers per (R x K x rows) intermediate block when streaming over records (2 MiB of float64:
#: about a core's L2 cache, so the softmax passes between the two GEMMs run from cache).
CHUNK_ELEMS = 2**18
#: Fewest rows per chunk (keeps the GEMMs efficient when R * K is large).
MIN_CHUNK_ROWS = 256
#: Lower clip of h_y before taking its log (spec §6).
H_MIN = 1e-9
#: Most numbers per (R x K x rows) block on a device backend: a GPU wants few large kernels.
DEVICE_CHUNK_ELEMS = 2**26


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


def _chunks(n: int, runs: int, K: int, device: bool = False) -> Iterator[slice]:
    """ceil(n / chunk_rows) consecutive row slices of nearly equal sizes (no small ragged tail);
    `device`: chunks of at most DEVICE_CHUNK_ELEMS numbers instead."""
    rows = (max(1, int(DEVICE_CHUNK_ELEMS) // max(1, int(runs) * int(K))) if device
            else chunk_rows(runs, K))
    count = -(-n // rows)
    for i in range(count):
        yield slice(i * n // count, (i + 1) * n // count)


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
    """Checked (R, J, K) W, its (R*K, J) transposed flat form Wt and the labels as intp.

    Row r*K + k of Wt is w_r[:, k] (C order), so the scores of a row chunk for every run are one
    GEMM Wt @ X_c^T with two contiguous operands (X_c^T is X_c read as Fortran order: BLAS gets a
    transpose flag, no copy).
    """
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
    return A, np.ascontiguousarray(A.transpose(0, 2, 1)).reshape(R * K, J), y


def _buffer(n: int, R: int, K: int) -> np.ndarray:
    """Scratch for the (R, K, rows) block of the largest chunk of an n-record pass (reused)."""
    return np.empty(R * K * max((s.stop - s.start for s in _chunks(n, R, K)), default=0))


def _shifted_scores(Xc: np.ndarray, Wt: np.ndarray, R: int, K: int, buf: np.ndarray) -> np.ndarray:
    """Scores minus their per-(run, record) maximum, shape (R, K, rows), computed in `buf`.

    One GEMM (R*K, J) x (J, rows) for all runs; the class axis is the middle one, so the
    reductions over classes run along contiguous rows.
    """
    c = Xc.shape[0]
    S = np.matmul(Wt, Xc.T, out=buf[: R * K * c].reshape(R * K, c)).reshape(R, K, c)
    S -= S.max(axis=1, keepdims=True)
    return S


def _probs(S: np.ndarray) -> np.ndarray:
    """Softmax over the class axis of shifted scores S (R, K, rows), in place."""
    np.exp(S, out=S)
    S /= S.sum(axis=1, keepdims=True)
    return S


def _label_index(yc: np.ndarray) -> np.ndarray:
    """Flat positions of the labels' entries in one run's (K, rows) block: S.reshape(R, K*rows)[:, idx]
    is the (R, rows) array of S[r, y_i, i]."""
    c = yc.shape[0]
    return yc * c + np.arange(c)


def _input(X: np.ndarray, s: slice) -> np.ndarray:
    return np.asarray(X[s], dtype=np.float64)


def softmax_probs(X: np.ndarray, W: np.ndarray) -> np.ndarray:
    """Class probabilities h(w; x_i) of every record for every run, shape (R, n, K) (stable softmax)."""
    if not on_host(X):
        return device_pass(X, None, W, "probs")
    A, Wt, _ = _prepare(X, np.zeros(X.shape[0], dtype=np.intp), W, "softmax_probs")
    R, _, K = A.shape
    out = np.empty((R, X.shape[0], K))
    buf = _buffer(X.shape[0], R, K)
    for s in _chunks(X.shape[0], R, K):
        out[:, s] = _probs(_shifted_scores(_input(X, s), Wt, R, K, buf)).transpose(0, 2, 1)
    return out


def loss_sum(X: np.ndarray, y: np.ndarray, W: np.ndarray) -> np.ndarray:
    """Sum over records of -log(clip(h_y, 1e-9, 1)) per run, shape (R,)."""
    if not on_host(X):
        return device_pass(X, y, W, "loss")
    A, Wt, y = _prepare(X, y, W, "loss_sum")
    R, _, K = A.shape
    total = np.zeros(R)
    buf = _buffer(X.shape[0], R, K)
    for s in _chunks(X.shape[0], R, K):
        S = _shifted_scores(_input(X, s), Wt, R, K, buf)
        sy = S.reshape(R, -1)[:, _label_index(y[s])]  # (R, rows) copy
        np.exp(S, out=S)
        log_hy = sy - np.log(S.sum(axis=1))
        total -= np.clip(log_hy, np.log(H_MIN), 0.0, out=log_hy).sum(axis=1)
    return total


def _gradient_add(total: np.ndarray, D: np.ndarray, Xc: np.ndarray, first: bool,
                  tmp: list[np.ndarray]) -> None:
    """total (R*K, J) (+)= D^T X_c: one GEMM (R*K, rows) x (rows, J), both operands C order."""
    RK = total.shape[0]
    Dt = D.reshape(RK, Xc.shape[0])
    if first:
        np.matmul(Dt, Xc, out=total)
        return
    if not tmp:
        tmp.append(np.empty_like(total))
    total += np.matmul(Dt, Xc, out=tmp[0])


def _grad_out(total: np.ndarray, R: int, K: int) -> np.ndarray:
    """(R*K, J) accumulated gradient rows as the (R, J, K) gradient."""
    return total.reshape(R, K, -1).transpose(0, 2, 1).copy()


def grad_sum(X: np.ndarray, y: np.ndarray, W: np.ndarray) -> np.ndarray:
    """Sum over records of the loss gradients X^T (H - Y) per run, shape (R, J, K).

    Per chunk one GEMM (H - Y)^T X_c with H - Y laid out (R*K, rows).
    """
    if not on_host(X):
        return device_pass(X, y, W, "grad")
    A, Wt, y = _prepare(X, y, W, "grad_sum")
    R, J, K = A.shape
    total = np.zeros((R * K, J))
    buf = _buffer(X.shape[0], R, K)
    tmp: list[np.ndarray] = []
    for i, s in enumerate(_chunks(X.shape[0], R, K)):
        Xc = _input(X, s)
        D = _probs(_shifted_scores(Xc, Wt, R, K, buf))
        D.reshape(R, -1)[:, _label_index(y[s])] -= 1.0
        _gradient_add(total, D, Xc, i == 0, tmp)
    return _grad_out(total, R, K)


def grad_sum_and_terms_max(
    X: np.ndarray, y: np.ndarray, W: np.ndarray, row_l1: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """One softmax pass for an ObjT/ObjP agent step: `grad_sum` (R, J, K) and the per-run maximum of
    `sensitivity_terms` (R,) (the input of admm_steps.sensitivity). `row_l1` = ||x_i||_1 (n,) may be
    precomputed once per agent.

    Per chunk: one GEMM for the scores of all runs, the softmax in place, the label entries read
    and overwritten through one flat index, one GEMM for the gradient (see `_gradient_add`).
    """
    if not on_host(X):
        return device_pass(X, y, W, "grad_terms", row_l1)
    A, Wt, y = _prepare(X, y, W, "grad_sum_and_terms_max")
    R, J, K = A.shape
    l1 = np.abs(X).sum(axis=1, dtype=np.float64) if row_l1 is None else np.asarray(row_l1, dtype=np.float64)
    total = np.zeros((R * K, J))
    tmax = np.zeros(R)
    buf = _buffer(X.shape[0], R, K)
    tmp: list[np.ndarray] = []
    for i, s in enumerate(_chunks(X.shape[0], R, K)):
        Xc = _input(X, s)
        D = _probs(_shifted_scores(Xc, Wt, R, K, buf))
        flat, idx = D.reshape(R, -1), _label_index(y[s])
        hy = flat[:, idx]  # (R, rows) copy
        flat[:, idx] = 0.0  # ||h - y||_1 = 2 sum_{k != y} h_k, as in sensitivity_terms
        np.maximum(tmax, (2.0 * D.sum(axis=1) * l1[s]).max(axis=1), out=tmax)
        hy -= 1.0
        flat[:, idx] = hy
        _gradient_add(total, D, Xc, i == 0, tmp)
    return _grad_out(total, R, K), tmax


def sensitivity_terms(X: np.ndarray, y: np.ndarray, W: np.ndarray) -> np.ndarray:
    """Per-record l1 norms of the loss gradient, ||x_i||_1 * ||h_i - y_i||_1, shape (R, n).

    ||h - y||_1 = 2 (1 - h_y) is computed as 2 sum_{k != y} h_k (no cancellation when h_y ~ 1).
    """
    if not on_host(X):
        return device_pass(X, y, W, "terms")
    A, Wt, y = _prepare(X, y, W, "sensitivity_terms")
    R, _, K = A.shape
    out = np.empty((R, X.shape[0]))
    buf = _buffer(X.shape[0], R, K)
    for s in _chunks(X.shape[0], R, K):
        Xc = _input(X, s)
        H = _probs(_shifted_scores(Xc, Wt, R, K, buf))
        H.reshape(R, -1)[:, _label_index(y[s])] = 0.0
        out[:, s] = 2.0 * H.sum(axis=1) * np.abs(Xc).sum(axis=1)
    return out


def errors(X: np.ndarray, y: np.ndarray, W: np.ndarray) -> np.ndarray:
    """Misclassified record counts per run (prediction = argmax of the scores, first on ties), (R,)."""
    if not on_host(X):
        return device_pass(X, y, W, "errors")
    A, Wt, y = _prepare(X, y, W, "errors")
    R, _, K = A.shape
    wrong = np.zeros(R, dtype=np.int64)
    buf = _buffer(X.shape[0], R, K)
    for s in _chunks(X.shape[0], R, K):
        pred = _shifted_scores(_input(X, s), Wt, R, K, buf).argmax(axis=1)  # (R, rows)
        wrong += (pred != y[s]).sum(axis=1)
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


# ---------------------------------------------------------------- stacked agents (issue 29)
#
# The same one-chunk pass for a stack of B agents of equal record count n at once: X (B, n, J),
# y (B, n), models (B, R, J, K) (or one (R, J, K) model for all). The GEMMs are numpy's stacked
# matmul, which calls the very BLAS routine of the 2-D call once per agent with the same operand
# layout (Wt (R*K, J) C order, X_b^T a transposed view, D_b (R*K, n) C order), and every other
# step is elementwise or reduces along an axis of one agent's own block with the same memory
# layout (the K sums add rows one after the other, the record sums run pairwise over contiguous
# rows of length n). So agent b's results are bitwise those of the single-agent functions above,
# whichever agents share its stack, provided its n records form one chunk (`stackable`) and
# n >= 2 (for n = 1 numpy reduces the class axis of a 2-D call in another order).

def stackable(n: int, runs: int, K: int) -> bool:
    """Whether an agent of n records gets bitwise its single-agent results from the stacked
    kernels at `runs` runs: one chunk (n <= chunk_rows) and n >= 2."""
    return 2 <= int(n) <= chunk_rows(runs, K)


def _stack_models(W: np.ndarray, where: str) -> tuple[np.ndarray, int, int]:
    """Checked models (B, R, J, K) or one (R, J, K) / (J, K) model for every agent, as the
    stacked (B, R*K, J) (or shared (R*K, J)) transposed flat form Wt of `_prepare`; returns
    (Wt, R, K)."""
    A = np.asarray(W, dtype=np.float64)
    if A.ndim == 2:
        A = A[None]
    if A.ndim not in (3, 4):
        raise ValueError(f"{where}: models must be (B, R, J, K), (R, J, K) or (J, K), got "
                         f"{A.shape}")
    if not np.all(np.isfinite(A)):
        bad = np.nonzero(~np.isfinite(A.reshape(-1, *A.shape[-3:])))
        raise NumericalError(f"{where}: model parameters contain NaN or inf (runs "
                             f"{np.unique(bad[1] if A.ndim == 4 else bad[0]).tolist()})")
    R, J, K = A.shape[-3:]
    Wt = np.ascontiguousarray(np.swapaxes(A, -1, -2)).reshape(*A.shape[:-3], R * K, J)
    return Wt, R, K


def _stack_scores(X: np.ndarray, Wt: np.ndarray, R: int, K: int) -> np.ndarray:
    """Shifted scores of every agent, (B, R, K, n): `_shifted_scores` per agent."""
    B, n, _ = X.shape
    S = np.matmul(Wt, X.transpose(0, 2, 1)).reshape(B, R, K, n)
    S -= S.max(axis=2, keepdims=True)
    return S


def stack_label_index(y: np.ndarray, R: int, K: int) -> np.ndarray:
    """Flat positions (B, R, n) of the labels' entries in a (B, R, K, n) block of the stack with
    labels y (B, n): block.reshape(-1)[idx] is block[b, r, y[b, i], i] (`_label_index` for a
    stack; reused by every pass at R runs)."""
    y = np.asarray(y, dtype=np.intp)
    B, n = y.shape
    br = np.arange(B * R, dtype=np.intp).reshape(B, R, 1)
    return (br * K + y[:, None, :]) * n + np.arange(n, dtype=np.intp)


def _label_flat(y: np.ndarray, R: int, K: int, label_index: np.ndarray | None) -> np.ndarray:
    return stack_label_index(y, R, K) if label_index is None else label_index


def stack_grad_sum(X: np.ndarray, y: np.ndarray, W: np.ndarray, row_l1: np.ndarray | None = None,
                   terms: bool = False, label_index: np.ndarray | None = None
                   ) -> tuple[np.ndarray, np.ndarray | None]:
    """`grad_sum` (terms False) or `grad_sum_and_terms_max` (terms True; `row_l1` (B, n) the
    records' l1 norms) of every agent of the stack: gradients (B, R, J, K) and the per-run
    maximum of the sensitivity terms (B, R) (None without terms). `label_index`: the stack's
    `stack_label_index` at these R, K (computed when not given)."""
    if not on_host(X):
        return device_pass(X, y, W, "grad_terms", row_l1) if terms else (
            device_pass(X, y, W, "grad"), None)
    Wt, R, K = _stack_models(W, "grad_sum")
    B, n, J = X.shape
    D = _stack_scores(X, Wt, R, K)
    np.exp(D, out=D)
    D /= D.sum(axis=2, keepdims=True)
    idx, flat = _label_flat(y, R, K, label_index), D.reshape(-1)
    hy = flat[idx]  # (B, R, n) copy
    tmax = None
    if terms:
        flat[idx] = 0.0  # ||h - y||_1 = 2 sum_{k != y} h_k
        tmax = np.maximum(np.zeros((B, R)),
                          (2.0 * D.sum(axis=2) * np.asarray(row_l1)[:, None, :]).max(axis=2))
    hy -= 1.0
    flat[idx] = hy
    G = np.matmul(D.reshape(B, R * K, n), X)  # (B, R*K, J)
    return G.reshape(B, R, K, J).transpose(0, 1, 3, 2).copy(), tmax


def stack_loss_sum(X: np.ndarray, y: np.ndarray, W: np.ndarray,
                   label_index: np.ndarray | None = None) -> np.ndarray:
    """`loss_sum` of every agent of the stack, (B, R) (`label_index` as in stack_grad_sum)."""
    if not on_host(X):
        return device_pass(X, y, W, "loss")
    Wt, R, K = _stack_models(W, "loss_sum")
    S = _stack_scores(X, Wt, R, K)
    sy = S.reshape(-1)[_label_flat(y, R, K, label_index)]  # (B, R, n) copy
    np.exp(S, out=S)
    log_hy = sy - np.log(S.sum(axis=2))
    return np.zeros(log_hy.shape[:2]) - np.clip(log_hy, np.log(H_MIN), 0.0,
                                                out=log_hy).sum(axis=2)


def stack_errors(X: np.ndarray, y: np.ndarray, W: np.ndarray) -> np.ndarray:
    """`errors` of every agent of the stack, (B, R) int64."""
    if not on_host(X):
        return device_pass(X, y, W, "errors")
    Wt, R, K = _stack_models(W, "errors")
    pred = _stack_scores(X, Wt, R, K).argmax(axis=2)  # (B, R, n)
    return (pred != np.asarray(y)[:, None, :]).sum(axis=2, dtype=np.int64)


# ---------------------------------------------------------------- device backends (issue 30)
#
# One array-API pass serves every kernel above on a device backend (mpi_dp.backend): X (*b, n, J)
# and y (*b, n) in the backend's namespace, with an optional leading batch axis b of stacked
# agents, models W (*b, R, J, K) on the host or the device. Per row chunk: the scores of every
# run in one (batched) GEMM, the stable softmax over the class axis, the label entries through a
# one-hot mask (the standard has no integer-array assignment), and one GEMM for the gradient.
# Chunks are added in order; the result equals the NumPy kernel's up to rounding.

def device_labels(xp: object, y: np.ndarray, K: int) -> object:
    """Labels checked on the host (`_labels`), then moved to the device as int64."""
    return xp.asarray(_labels(np.asarray(y), K).astype(np.int64))  # type: ignore[attr-defined]


def _device_models(xp, W, batched: bool, where: str):
    """`_stack_models` checked on the host, its transposed flat form (*b, R*K, J) moved to the
    device; per-agent models (B, R, J, K) only for a stack of agents."""
    A = np.asarray(to_numpy(W), dtype=np.float64)
    if A.ndim == 4 and not batched:
        raise ValueError(f"{where}: models must be (R, J, K) or (J, K), got {A.shape}")
    Wt, R, K = _stack_models(A, where)
    return xp.asarray(Wt), R, K


def device_pass(X, y, W, want: str, row_l1=None) -> Any:
    """The kernel `want` on a device backend: 'loss' (*b, R) loss sums, 'grad' (*b, R, J, K)
    gradient sums, 'grad_terms' (gradient sums, per-run maxima of the sensitivity terms
    (*b, R)), 'terms' (R, n) sensitivity terms, 'errors' (*b, R) int64, 'probs' (R, n, K)."""
    xp = namespace(X)
    batched = X.ndim == 3
    if X.ndim not in (2, 3):
        raise ValueError(f"{want}: X must be (n, J) or (B, n, J), got {tuple(X.shape)}")
    Wt, R, K = _device_models(xp, W, batched, want)
    n, J = X.shape[-2], X.shape[-1]
    if y is None:  # probs: no labels needed
        y = xp.zeros(tuple(X.shape[:-1]), dtype=xp.int64)
    if Wt.shape[-1] != J:
        raise ValueError(f"{want}: X must be (n, J) with J = {Wt.shape[-1]}, got "
                         f"{tuple(X.shape)}")
    if y.shape[-1] != n:
        raise ValueError(f"{want}: X has {n} rows but y has {y.shape[-1]} labels")
    lead = tuple(X.shape[:-2])
    yi = xp.astype(y, xp.int64, copy=False)
    classes = xp.reshape(xp.arange(K, dtype=xp.int64), (K, 1))
    f64 = xp.float64
    total = xp.zeros((*lead, R * K, J), dtype=f64) if want in ("grad", "grad_terms") else None
    loss = xp.zeros((*lead, R), dtype=f64)
    tmax = xp.zeros((*lead, R), dtype=f64)
    wrong = xp.zeros((*lead, R), dtype=xp.int64)
    per_record = (xp.empty((R, n, K), dtype=f64) if want == "probs"
                  else xp.empty((R, n), dtype=f64) if want == "terms" else None)
    if row_l1 is not None and on_host(row_l1):
        row_l1 = xp.asarray(np.asarray(row_l1, dtype=np.float64))
    for s in _chunks(n, R, K, device=True):
        Xc = xp.astype(X[..., s, :], f64, copy=False)
        c = Xc.shape[-2]
        S = xp.reshape(Wt @ xp.matrix_transpose(Xc), (*lead, R, K, c))
        S = S - xp.max(S, axis=-2, keepdims=True)
        M = xp.expand_dims(xp.expand_dims(yi[..., s], axis=-2) == classes, axis=-3)
        if want == "errors":
            pred = xp.argmax(S, axis=-2)  # (*b, R, c), first maximum on ties
            wrong += xp.sum(xp.astype(pred != xp.expand_dims(yi[..., s], axis=-2), xp.int64),
                            axis=-1)
            continue
        E = xp.exp(S)
        if want == "loss":
            sy = xp.sum(xp.where(M, S, 0.0), axis=-2)  # one nonzero term: exact
            log_hy = xp.clip(sy - xp.log(xp.sum(E, axis=-2)), math.log(H_MIN), 0.0)
            loss -= xp.sum(log_hy, axis=-1)
            continue
        H = E / xp.sum(E, axis=-2, keepdims=True)
        if want == "probs":
            assert per_record is not None
            per_record[:, s, :] = xp.matrix_transpose(H)
            continue
        if want in ("terms", "grad_terms"):
            l1 = (xp.sum(xp.abs(Xc), axis=-1) if row_l1 is None
                  else xp.astype(row_l1[..., s], f64, copy=False))
            t = 2.0 * xp.sum(xp.where(M, 0.0, H), axis=-2) * xp.expand_dims(l1, axis=-2)
            if want == "terms":
                assert per_record is not None
                per_record[:, s] = t
                continue
            tmax = xp.maximum(tmax, xp.max(t, axis=-1))
        D = H - xp.astype(M, f64)
        total = total + xp.reshape(D, (*lead, R * K, c)) @ Xc
    if want == "errors":
        return wrong
    if want == "loss":
        return loss
    if want in ("probs", "terms"):
        return per_record
    G = xp.matrix_transpose(xp.reshape(total, (*lead, R, K, J)))
    return (G, tmax) if want == "grad_terms" else G
