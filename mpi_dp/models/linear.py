"""Linear models (squared, hinge, logistic loss) with a leading runs axis.

Every function takes the models of all Monte-Carlo runs at once, ``Theta`` of shape (R, p) (a 1-D
(p,) model is promoted to (1, p)), so one pass over a shard serves every run through matrix-matrix
products. Records are processed in row chunks whose (rows x R) intermediates hold about CHUNK_ELEMS
numbers (2 MiB: they stay in cache, where the elementwise loss and clipping arithmetic is several
times faster than on a shard-sized block, and memory stays bounded: an n x R block for n = 250,000
and R = 100 would be 200 MB). Chunks are summed in a fixed order, so the result for a given R is
deterministic; evaluating a run alone or among others changes it only by summation rounding.

X is a dense float64 (n, p) array; a scipy.sparse CSR matrix also works (only ``X @ Theta.T``,
``X.T @ M`` and ``abs(X).sum(axis=1)`` are used). Labels for hinge and logistic are in {-1, +1}.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator

import numpy as np
import scipy.sparse as sp
from scipy.special import expit

from mpi_dp.backend import namespace, on_host, to_numpy
from mpi_dp.errors import NumericalError

#: Loss names understood by this module.
LOSSES = ("squared", "hinge", "logistic")

#: Numbers per (rows x runs) intermediate block when streaming over a shard (2 MiB of float64).
CHUNK_ELEMS = 2**18
#: Fewest rows per chunk (keeps the GEMM efficient when R is large).
MIN_CHUNK_ROWS = 256


def check_loss(loss: str) -> str:
    """Return `loss` if it is a known loss name, else raise a ValueError naming the choices."""
    if loss not in LOSSES:
        raise ValueError(f"unknown loss {loss!r}; expected one of {LOSSES}")
    return loss


def as_runs(Theta: np.ndarray) -> np.ndarray:
    """Theta as a float64 (R, p) array; a 1-D (p,) model becomes (1, p)."""
    T = np.asarray(Theta, dtype=np.float64)
    if T.ndim == 1:
        T = T[None, :]
    if T.ndim != 2:
        raise ValueError(f"Theta must have shape (R, p) or (p,), got {T.shape}")
    return T


def _check_finite(Theta: np.ndarray, where: str) -> None:
    if not np.all(np.isfinite(Theta)):
        bad = np.unique(np.nonzero(~np.isfinite(Theta))[0])
        raise NumericalError(f"{where}: model parameters contain NaN or inf (runs {bad.tolist()})")


def chunk_rows(runs: int) -> int:
    """Rows per chunk for `runs` runs: max(MIN_CHUNK_ROWS, CHUNK_ELEMS // runs)."""
    return max(int(MIN_CHUNK_ROWS), int(CHUNK_ELEMS) // max(1, int(runs)))


def _chunks(n: int, runs: int) -> Iterator[slice]:
    step = chunk_rows(runs)
    for start in range(0, n, step):
        yield slice(start, min(start + step, n))


def _margins(X, Theta: np.ndarray) -> np.ndarray:
    """Z = X @ Theta.T as a dense (n, R) array."""
    return np.asarray(X @ Theta.T, dtype=np.float64)


def _row_l1(X) -> np.ndarray:
    """Per-row L1 norms of a dense or sparse X, shape (n,)."""
    if sp.issparse(X):
        return np.asarray(abs(X).sum(axis=1), dtype=np.float64).ravel()
    return np.abs(X).sum(axis=1)


def _check_shapes(X, y, Theta: np.ndarray) -> np.ndarray:
    y = np.asarray(y, dtype=np.float64)
    if X.ndim != 2 or y.shape != (X.shape[0],):
        raise ValueError(f"X must be (n, p) and y (n,); got X {X.shape}, y {y.shape}")
    if Theta.shape[1] != X.shape[1]:
        raise ValueError(f"Theta has {Theta.shape[1]} coordinates but X has {X.shape[1]} columns")
    return y


def loss_values(loss: str, Z: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Per-record loss (n, R) from margins Z = X @ Theta.T (n, R) and labels/targets y (n,)."""
    check_loss(loss)
    Z = np.asarray(Z, dtype=np.float64)
    yc = np.asarray(y, dtype=np.float64).reshape(-1, *([1] * (Z.ndim - 1)))
    if loss == "squared":
        return (yc - Z) ** 2
    if loss == "hinge":
        return np.maximum(0.0, 1.0 - yc * Z)
    return np.logaddexp(0.0, -yc * Z)


def loss_derivative(loss: str, Z: np.ndarray, y: np.ndarray) -> np.ndarray:
    """d loss / d z per record (n, R); the per-record (sub)gradient is this times x.

    Hinge uses the subgradient 0 at the kink y z = 1; logistic uses a stable sigmoid.
    """
    check_loss(loss)
    Z = np.asarray(Z, dtype=np.float64)
    yc = np.asarray(y, dtype=np.float64).reshape(-1, *([1] * (Z.ndim - 1)))
    if loss == "squared":
        return 2.0 * (Z - yc)
    if loss == "hinge":
        return np.where(yc * Z < 1.0, -yc, 0.0)
    return -yc * expit(-yc * Z)


def loss_sum(loss: str, X, y: np.ndarray, Theta: np.ndarray) -> np.ndarray:
    """Sum over the records of X, y of the loss at each run's model, shape (R,)."""
    if not on_host(X):
        return device_pass(loss, X, y, Theta, "loss")
    check_loss(loss)
    T = as_runs(Theta)
    _check_finite(T, "loss_sum")
    y = _check_shapes(X, y, T)
    total = np.zeros(T.shape[0])
    for s in _chunks(X.shape[0], T.shape[0]):
        Zt = _margins_t(X[s], T)
        if loss == "squared":
            Zt -= y[s]
            Zt *= Zt
        else:
            Zt = loss_values(loss, Zt.T, y[s]).T
        total += Zt.sum(axis=1)
    return total


def grad_sum(loss: str, X, y: np.ndarray, Theta: np.ndarray) -> np.ndarray:
    """Sum over the records of the unclipped per-record (sub)gradients, shape (R, p)."""
    if not on_host(X):
        return device_pass(loss, X, y, Theta, "clipped")[0]
    check_loss(loss)
    T = as_runs(Theta)
    _check_finite(T, "grad_sum")
    y = _check_shapes(X, y, T)
    total = np.zeros(T.shape)
    for s in _chunks(X.shape[0], T.shape[0]):
        Xc = X[s]
        total += _back_t(Xc, _derivative_t(loss, _margins_t(Xc, T), y[s]))
    return total


def loss_grad_sum(loss: str, X, y: np.ndarray, Theta: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(`loss_sum`, `grad_sum`) in one pass over the records: each chunk's margins are computed
    once and feed both, with the same operations in the same order, so both are bit for bit
    what the two calls give (the reference solvers' value-and-gradient callback)."""
    if not on_host(X):
        return loss_sum(loss, X, y, Theta), grad_sum(loss, X, y, Theta)
    check_loss(loss)
    T = as_runs(Theta)
    _check_finite(T, "loss_sum")
    y = _check_shapes(X, y, T)
    f, g = np.zeros(T.shape[0]), np.zeros(T.shape)
    for s in _chunks(X.shape[0], T.shape[0]):
        Xc = X[s]
        Zt = _margins_t(Xc, T)
        f += _loss_t(loss, Zt, y[s]).sum(axis=1)
        g += _back_t(Xc, _derivative_t(loss, Zt, y[s]))
    return f, g


def _loss_t(loss: str, Zt: np.ndarray, y: np.ndarray) -> np.ndarray:
    """`loss_sum`'s per-record losses (R, rows) of margins laid out (R, rows); Zt is kept."""
    if loss == "squared":
        L = Zt - y
        L *= L
        return L
    return loss_values(loss, Zt.T, y).T


@dataclasses.dataclass(frozen=True)
class SquaredStats:
    """Per-shard constants that make the squared-loss clipped gradient cost ~ one pass for any R.

    gram = X^T X and xty = X^T y give the unclipped gradient sum 2 (Theta gram - xty) in
    O(R p^2); row_l1/row_l2 bound which records can be clipped (`clipped_grad_sum`).
    """

    gram: np.ndarray
    xty: np.ndarray
    row_l1: np.ndarray
    row_l2: np.ndarray


def squared_stats(X, y: np.ndarray) -> SquaredStats:
    """Compute SquaredStats for a shard (one pass; done once per shard, reused every query)."""
    y = np.asarray(y, dtype=np.float64)
    G = X.T @ X
    G = G.toarray() if sp.issparse(G) else np.asarray(G, dtype=np.float64)
    if sp.issparse(X):
        l2 = np.sqrt(np.asarray(X.multiply(X).sum(axis=1), dtype=np.float64).ravel())
    else:
        l2 = np.sqrt(np.einsum("ij,ij->i", X, X))
    return SquaredStats(G, np.asarray(X.T @ y, dtype=np.float64).ravel(), _row_l1(X), l2)


#: Screened squared-loss path: fall back to the full pass when more than this share of records
#: might be clipped (the bound is loose, e.g. while the runs are far apart).
SCREEN_MAX_SHARE = 0.25
#: (records x runs) up to which the squared loss skips the screen (its set-up costs more)
SMALL_PASS_ELEMS = 2**15


def _clip_args(loss: str, xi: float, Theta: np.ndarray) -> tuple[float, np.ndarray]:
    """The checked (xi, Theta as (R, p)) of a clipped gradient sum."""
    check_loss(loss)
    xi = float(xi)
    if not xi > 0:
        raise ValueError(f"clipping norm xi must be positive, got {xi}")
    T = as_runs(Theta)
    _check_finite(T, "clipped_grad_sum")
    return xi, T


def clipped_grad_sum(
    loss: str, X, y: np.ndarray, Theta: np.ndarray, xi: float, stats: SquaredStats | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Sum of L1-clipped per-record (sub)gradients (R, p) and clipped-record counts (R,) int64.

    clip_xi(v) = v * min(1, xi / ||v||_1) (factor 1 for v = 0; xi = inf disables clipping).
    For linear models v = (dloss/dz) x and ||v||_1 = |dloss/dz| ||x||_1, so clipping is the
    derivative clamped to +-xi/||x||_1, and the sum is one GEMM per chunk.

    With `stats` (squared loss only) the result is the same sum computed exactly without a pass
    over all (record, run) pairs: the unclipped sum 2 (Theta G - X^T y) minus the correction on
    the records that may be clipped in some run. A record is screened out when
    2 (|x.c - y| + ||x||_2 max_r ||theta_r - c||_2) ||x||_1 <= xi at the runs' mean c (its
    gradient norm in every run is at most that, so it is clipped in none).
    """
    xi, T = _clip_args(loss, xi, Theta)
    if not on_host(X):  # a device backend: the direct pass (stats are a host shortcut)
        return device_pass(loss, X, y, T, "clipped", xi)
    y = _check_shapes(X, y, T)
    if T.shape[0] > 1 and not np.any(T != T[0]):  # every run at one model (a first step)
        g, c = clipped_grad_sum(loss, X, y, T[:1], xi, stats)
        return np.repeat(g, T.shape[0], axis=0), np.repeat(c, T.shape[0])
    if stats is not None and loss == "squared":
        if not np.isfinite(xi):
            return 2.0 * (T @ stats.gram - stats.xty), np.zeros(T.shape[0], dtype=np.int64)
        if X.shape[0] * T.shape[0] <= SMALL_PASS_ELEMS:  # one direct pass beats screening
            counts = np.zeros(T.shape[0], dtype=np.int64)
            return sq_direct_pass(X, y, T, _thresholds(xi, stats.row_l1), counts), counts
        center = T.mean(axis=0)
        radius = float(np.sqrt(((T - center) ** 2).sum(axis=1)).max())
        bound = np.abs(np.asarray(X @ center).ravel() - y)
        bound += radius * stats.row_l2
        bound *= 2.0 * stats.row_l1
        cand = np.flatnonzero(bound > xi)
        if cand.size <= SCREEN_MAX_SHARE * X.shape[0]:
            total = 2.0 * (T @ stats.gram - stats.xty)
            counts = np.zeros(T.shape[0], dtype=np.int64)
            for s in _chunks(cand.size, T.shape[0]):
                rows = cand[s]
                Xc = X[rows]
                D = _derivative_t("squared", _margins_t(Xc, T), y[rows])
                Dc = _clamp(D, _thresholds(xi, stats.row_l1[rows]), counts)
                Dc -= D
                total += _back_t(Xc, Dc)
            return total, counts
    total = np.zeros(T.shape)
    counts = np.zeros(T.shape[0], dtype=np.int64)
    for s in _chunks(X.shape[0], T.shape[0]):
        Xc = X[s]
        D = _derivative_t(loss, _margins_t(Xc, T), y[s])
        if np.isfinite(xi):
            D = _clamp(D, _thresholds(xi, _row_l1(Xc)), counts, inplace=True)
        total += _back_t(Xc, D)
    return total, counts


# -- a block of agents of equal record count, stacked ((G, n, p) arrays) ---------------------------
# Each agent's arithmetic is exactly what the per-agent function does on its own (n, p) shard: the
# stacked matmul calls the same GEMM per agent, elementwise steps are per record, reductions run
# along one agent's own axis. So an agent's result does not depend on which agents share its block.


def stacked_grad_ok(loss: str, n: int, runs: int, xi: float, with_stats: bool) -> bool:
    """Whether `clipped_grad_sum_stack` reproduces `clipped_grad_sum` for agents of n records
    (the single-pass branches; the screened squared path and multi-chunk passes are per agent)."""
    if with_stats and loss == "squared":
        return not np.isfinite(xi) or n * runs <= SMALL_PASS_ELEMS
    return n <= chunk_rows(runs)


def clipped_grad_sum_stack(loss: str, Xs: np.ndarray, ys: np.ndarray, Theta: np.ndarray,
                           xi: float, row_l1: np.ndarray, with_stats: bool = False,
                           gram: np.ndarray | None = None, xty: np.ndarray | None = None
                           ) -> tuple[np.ndarray, np.ndarray]:
    """`clipped_grad_sum` of G agents at once: Xs (G, n, p) dense, ys (G, n), row_l1 (G, n) the
    records' L1 norms. `with_stats`: as the per-agent call given the shard's `SquaredStats`
    (squared loss), whose `gram` (G, p, p) and `xty` (G, p) only xi = inf needs. Returns
    (G, R, p) sums and (G, R) clipped counts, agent g's bit for bit `clipped_grad_sum` on its
    own records, for agents where `stacked_grad_ok` holds."""
    xi, T = _clip_args(loss, xi, Theta)
    if not on_host(Xs):
        return device_pass(loss, Xs, ys, T, "clipped", xi, row_l1)
    G, n, p = Xs.shape
    if T.shape[1] != p:
        raise ValueError(f"Theta has {T.shape[1]} coordinates but X has {p} columns")
    R = T.shape[0]
    if R > 1 and not np.any(T != T[0]):  # every run at one model (a first step)
        g, c = clipped_grad_sum_stack(loss, Xs, ys, T[:1], xi, row_l1, with_stats, gram, xty)
        return np.repeat(g, R, axis=1), np.repeat(c, R, axis=1)
    counts = np.zeros((G, R), dtype=np.int64)
    if with_stats and loss == "squared":
        if not np.isfinite(xi):
            assert gram is not None and xty is not None  # given with the stats where xi = inf
            return 2.0 * (T @ gram - xty[:, None, :]), counts
        D = _derivative_t("squared", T @ Xs.transpose(0, 2, 1), ys[:, None, :])
        return _back_stack(Xs, _clamp_stack(D, _thresholds(xi, row_l1), counts)), counts
    total = np.zeros((G, R, p))
    D = _derivative_t(loss, T @ Xs.transpose(0, 2, 1), ys[:, None, :])
    if np.isfinite(xi):
        D = _clamp_stack(D, _thresholds(xi, row_l1), counts)
    total += _back_stack(Xs, D)
    return total, counts


def _back_stack(Xs: np.ndarray, D: np.ndarray) -> np.ndarray:
    """D @ X per agent: (G, R, n) x (G, n, p) -> (G, R, p)."""
    return D @ Xs


def _clamp_stack(D: np.ndarray, thr: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """`_clamp` in place of each agent's (R, n) block D[g] at its thresholds thr[g] (n,)."""
    over = np.abs(D) > thr[:, None, :]
    counts += np.add.reduce(over.view(np.uint8), axis=2, dtype=np.int64)
    np.minimum(D, thr[:, None, :], out=D)
    np.maximum(D, -thr[:, None, :], out=D)
    return D


def loss_sum_stack(loss: str, Xs: np.ndarray, ys: np.ndarray, Theta: np.ndarray) -> np.ndarray:
    """`loss_sum` of G agents at once, (G, R): Xs (G, n, p) dense, ys (G, n); agent g's row is
    bit for bit `loss_sum` on its own records where `n <= chunk_rows(R)` (one chunk)."""
    if not on_host(Xs):
        return device_pass(loss, Xs, ys, Theta, "loss")
    check_loss(loss)
    T = as_runs(Theta)
    _check_finite(T, "loss_sum")
    Zt = T @ Xs.transpose(0, 2, 1)  # (G, R, n)
    y = ys[:, None, :]
    if loss == "squared":
        Zt -= y
        Zt *= Zt
    elif loss == "hinge":
        Zt = np.maximum(0.0, 1.0 - y * Zt)
    else:
        Zt = np.logaddexp(0.0, -y * Zt)
    total = np.zeros(Zt.shape[:2])
    total += Zt.sum(axis=2)
    return total


def loss_grad_sum_stack(loss: str, Xs: np.ndarray, ys: np.ndarray, theta: np.ndarray
                        ) -> np.ndarray:
    """(G, 1 + p): each agent's `loss_sum_stack` and unclipped `clipped_grad_sum_stack` at one
    model theta, from one product of margins (bit for bit the two calls: the same operations on
    the same margins). Host arrays only (the evaluation-only passes stay on the host)."""
    check_loss(loss)
    T = as_runs(theta)
    _check_finite(T, "loss_sum")
    if T.shape[0] != 1:
        raise ValueError("loss_grad_sum_stack takes one model")
    Zt = T @ Xs.transpose(0, 2, 1)  # (G, 1, n)
    y = ys[:, None, :]
    if loss == "squared":
        L = Zt - y
        L *= L
    elif loss == "hinge":
        L = np.maximum(0.0, 1.0 - y * Zt)
    else:
        L = np.logaddexp(0.0, -y * Zt)
    out = np.empty((Xs.shape[0], 1 + Xs.shape[2]))
    total = np.zeros(L.shape[:2])
    total += L.sum(axis=2)
    out[:, :1] = total
    grad = np.zeros((Xs.shape[0], 1, Xs.shape[2]))
    grad += _back_stack(Xs, _derivative_t(loss, Zt, y))
    out[:, 1:] = grad[:, 0]
    return out


def _margins_t(X, Theta: np.ndarray) -> np.ndarray:
    """Theta @ X.T as a C-contiguous (R, rows) array: per-record values run along the fast axis,
    so the per-record clip thresholds broadcast over contiguous memory."""
    if sp.issparse(X):
        return np.ascontiguousarray(np.asarray(X @ Theta.T).T)
    return Theta @ X.T


def sq_direct_pass(X, y: np.ndarray, T: np.ndarray, thr: np.ndarray, counts: np.ndarray
                   ) -> np.ndarray:
    """Squared loss, one pass over all (record, run) pairs: the sum (R, p) of the L1-clipped
    per-record gradients at the rows of T; thr = xi / ||x_i||_1 (`_thresholds`); the records
    clipped are added to counts (R,)."""
    D = _derivative_t("squared", _margins_t(X, T), y)
    return _back_t(X, _clamp(D, thr, counts, inplace=True))


def _back_t(X, D: np.ndarray) -> np.ndarray:
    """D @ X for a (R, rows) D: the (R, p) sum of the per-record gradients."""
    if sp.issparse(X):
        return np.asarray(X.T @ D.T).T
    return D @ X


def _derivative_t(loss: str, Zt: np.ndarray, y: np.ndarray) -> np.ndarray:
    """loss_derivative for margins laid out (R, rows); may overwrite the fresh block Zt."""
    if loss == "squared":
        Zt -= y
        Zt *= 2.0
        return Zt
    if loss == "hinge":
        return np.where(y * Zt < 1.0, -y, 0.0)
    return -y * expit(-y * Zt)


def _thresholds(xi: float, row_l1: np.ndarray) -> np.ndarray:
    """Largest |dloss/dz| left unclipped per record: xi / ||x||_1 (inf for an all-zero x)."""
    with np.errstate(divide="ignore"):
        return xi / row_l1


def _clamp(D: np.ndarray, thr: np.ndarray, counts: np.ndarray, inplace: bool = False) -> np.ndarray:
    """D (R, rows) clamped to +-thr (rows,) (thr = inf where ||x||_1 = 0); adds to `counts` the
    records clamped per run (|D| > thr: the L1 clipping of the record's gradient is active)."""
    over = np.abs(D) > thr
    counts += np.add.reduce(over.view(np.uint8), axis=1, dtype=np.int64)
    out = D if inplace else np.empty_like(D)
    np.minimum(D, thr, out=out)
    np.maximum(out, -thr, out=out)
    return out


def error_counts(X, y: np.ndarray, thetas: np.ndarray) -> np.ndarray:
    """Misclassified records of each model (M,), X dense or CSR, under the prediction rule
    y_hat = sign(x . theta) with sign(0) = +1 (algorithms.common.PREDICTION_RULE).

    Row chunks bound the (rows x M) margins; counts are integers, so the sum is exact.
    """
    T = as_runs(thetas)
    y = np.asarray(y, dtype=np.float64)
    wrong = np.zeros(T.shape[0])
    step = chunk_rows(T.shape[0])
    for a in range(0, X.shape[0], step):
        Z = np.asarray(X[a : a + step] @ T.T, dtype=np.float64)
        wrong += (np.where(Z >= 0.0, 1.0, -1.0) != y[a : a + step, None]).sum(axis=0)
    return wrong


def grad_l1_norms(loss: str, X, y: np.ndarray, Theta: np.ndarray) -> np.ndarray:
    """Per-record L1 norms of the (sub)gradients, shape (n, R) (for the Xi percentile rule)."""
    check_loss(loss)
    T = as_runs(Theta)
    _check_finite(T, "grad_l1_norms")
    y = _check_shapes(X, y, T)
    out = np.empty((X.shape[0], T.shape[0]))
    for s in _chunks(X.shape[0], T.shape[0]):
        Xc = X[s]
        out[s] = np.abs(loss_derivative(loss, _margins(Xc, T), y[s])) * _row_l1(Xc)[:, None]
    return out


def objective(lam: float, loss_total: np.ndarray, n_total: int, Theta: np.ndarray) -> np.ndarray:
    """f(theta) = lam/2 ||theta||_2^2 + loss_total / n_total per run, shape (R,).

    `loss_total` is the (R,) sum of the losses over all owners' records.
    """
    T = as_runs(Theta)
    return 0.5 * lam * np.einsum("rp,rp->r", T, T) + np.asarray(loss_total) / n_total


def rel_fitness(f, f_star):
    """Relative fitness psi = f / f_star - 1 (>= 0 up to rounding when f_star is the optimum)."""
    return np.asarray(f, dtype=np.float64) / f_star - 1.0


def project_box(Theta: np.ndarray, theta_max: float) -> np.ndarray:
    """Euclidean projection onto {||theta||_inf <= theta_max}: clip coordinates; keeps the shape."""
    return np.clip(np.asarray(Theta, dtype=np.float64), -theta_max, theta_max)


def _gram_eigs(X) -> np.ndarray:
    G = X.T @ X
    G = G.toarray() if sp.issparse(G) else np.asarray(G, dtype=np.float64)
    return np.linalg.eigvalsh(G)


def curvature_constant(loss: str, X_public, lam: float) -> float:
    """Largest eigenvalue of the public Hessian proxy (L_pub): the step-size scale 1/L.

    squared: (2/m) lmax(X^T X) + lam; logistic: (1/(4m)) lmax + lam (sigmoid' <= 1/4);
    hinge has no Hessian: (1/m) lmax + lam is used as a curvature scale.
    """
    check_loss(loss)
    m = X_public.shape[0]
    lmax = float(_gram_eigs(X_public)[-1])
    c = {"squared": 2.0, "logistic": 0.25, "hinge": 1.0}[loss]
    return c * lmax / m + lam


def strong_convexity_constant(loss: str, X_public, lam: float) -> float:
    """Strong-convexity modulus estimated on public records.

    squared: (2/m) lmin(X^T X) + lam; logistic and hinge: lam (the loss adds no uniform curvature).
    """
    check_loss(loss)
    if loss != "squared":
        return float(lam)
    m = X_public.shape[0]
    lmin = max(float(_gram_eigs(X_public)[0]), 0.0)
    return 2.0 * lmin / m + lam


# -- device backends (issue 30) ---------------------------------------------------------------------
# One array-API pass serves the kernels above on a device backend (mpi_dp.backend): X (*b, n, p)
# dense and y (*b, n) in the backend's namespace (an optional leading axis b of stacked agents),
# the models Theta (R, p) on the host. Per row chunk: the margins of every run in one (batched)
# GEMM, the loss or its derivative per record, the clamp to +-xi/||x||_1 (the L1 clipping of a
# linear model's per-record gradient), and one GEMM back. The squared loss's SquaredStats paths
# are exact reformulations of this pass, so the device runs the pass itself. Equal to the NumPy
# kernels up to rounding.

#: Most numbers per (runs x records) block on a device backend: a GPU wants few large kernels.
DEVICE_CHUNK_ELEMS = 2**26


def _device_derivative(xp, loss: str, Z, y):
    if loss == "squared":
        return 2.0 * (Z - y)
    if loss == "hinge":
        return xp.where(y * Z < 1.0, -y * xp.ones_like(Z), 0.0)
    return -y / (1.0 + xp.exp(y * Z))  # -y expit(-y z), stable at both ends


def device_pass(loss: str, X, y, Theta: np.ndarray, want: str, xi: float = math.inf,
                row_l1=None):
    """The kernel `want` on a device backend: 'loss' (*b, R) loss sums, 'clipped' ((*b, R, p)
    sums of the L1-clipped per-record gradients, (*b, R) clipped counts; xi = inf: unclipped,
    counts 0), as arrays of X's namespace. `row_l1` (*b, n): the records' L1 norms (computed
    when not given)."""
    check_loss(loss)
    xp = namespace(X)
    T = as_runs(to_numpy(Theta))
    _check_finite(T, f"{loss} {want} pass")
    if X.ndim not in (2, 3) or X.shape[-1] != T.shape[1]:
        raise ValueError(f"X must be (n, p) or (B, n, p) with p = {T.shape[1]}, got "
                         f"{tuple(X.shape)}")
    R, (n, p), lead = T.shape[0], tuple(X.shape[-2:]), tuple(X.shape[:-2])
    if want == "clipped" and R > 1 and not np.any(T != T[0]):  # every run at one model
        g, c = device_pass(loss, X, y, T[:1], want, xi, row_l1)
        return (xp.concat([g] * R, axis=-2), xp.concat([c] * R, axis=-1))
    f64 = xp.float64
    Td = xp.asarray(T)
    yf = xp.astype(y, f64, copy=False)
    total = xp.zeros((*lead, R, p), dtype=f64)
    counts = xp.zeros((*lead, R), dtype=xp.int64)
    losses = xp.zeros((*lead, R), dtype=f64)
    if row_l1 is not None and on_host(row_l1):
        row_l1 = xp.asarray(np.asarray(row_l1, dtype=np.float64))
    rows = max(1, int(DEVICE_CHUNK_ELEMS) // max(1, R))
    for a in range(0, n, rows):
        c = slice(a, min(a + rows, n))  # the standard has no out-of-bounds slice stops
        Xc = xp.astype(X[..., c, :], f64, copy=False)
        yc = xp.expand_dims(yf[..., c], axis=-2)  # (*b, 1, c)
        Z = Td @ xp.matrix_transpose(Xc)  # (*b, R, c)
        if want == "loss":
            L = ((Z - yc) ** 2 if loss == "squared" else
                 xp.maximum(0.0, 1.0 - yc * Z) if loss == "hinge" else
                 xp.logaddexp(xp.zeros_like(Z), -yc * Z))
            losses += xp.sum(L, axis=-1)
            continue
        D = _device_derivative(xp, loss, Z, yc)
        if math.isfinite(xi):
            l1 = (xp.sum(xp.abs(Xc), axis=-1) if row_l1 is None
                  else xp.astype(row_l1[..., c], f64, copy=False))
            thr = xp.expand_dims(xp.where(l1 > 0.0, xi / xp.where(l1 > 0.0, l1, 1.0), math.inf),
                                 axis=-2)
            counts += xp.sum(xp.astype(xp.abs(D) > thr, xp.int64), axis=-1)
            D = xp.minimum(xp.maximum(D, -thr), thr)
        total += D @ Xc
    return losses if want == "loss" else (total, counts)
