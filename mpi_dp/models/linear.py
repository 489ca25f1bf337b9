"""Linear models (squared, hinge, logistic loss) with a leading runs axis.

Every function takes the models of all Monte-Carlo runs at once, ``Theta`` of shape (R, p) (a 1-D
(p,) model is promoted to (1, p)), so one pass over a shard serves every run through matrix-matrix
products. Records are processed in fixed-size row chunks whose results are summed in a fixed order:
memory stays bounded (an n x R intermediate for n = 250,000 and R = 100 would be 200 MB) and the
result does not depend on how many runs are evaluated together (up to GEMM/GEMV rounding).

X is a dense float64 (n, p) array; a scipy.sparse CSR matrix also works (only ``X @ Theta.T``,
``X.T @ M`` and ``abs(X).sum(axis=1)`` are used). Labels for hinge and logistic are in {-1, +1}.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import scipy.sparse as sp
from scipy.special import expit

from mpi_dp.errors import NumericalError

#: Loss names understood by this module.
LOSSES = ("squared", "hinge", "logistic")

#: Rows per chunk when streaming over a shard (bounds the n x R intermediates to CHUNK_ROWS x R).
CHUNK_ROWS = 16384


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


def _chunks(n: int) -> Iterator[slice]:
    step = int(CHUNK_ROWS)
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
    check_loss(loss)
    T = as_runs(Theta)
    _check_finite(T, "loss_sum")
    y = _check_shapes(X, y, T)
    total = np.zeros(T.shape[0])
    for s in _chunks(X.shape[0]):
        total += loss_values(loss, _margins(X[s], T), y[s]).sum(axis=0)
    return total


def grad_sum(loss: str, X, y: np.ndarray, Theta: np.ndarray) -> np.ndarray:
    """Sum over the records of the unclipped per-record (sub)gradients, shape (R, p)."""
    check_loss(loss)
    T = as_runs(Theta)
    _check_finite(T, "grad_sum")
    y = _check_shapes(X, y, T)
    total = np.zeros(T.shape)
    for s in _chunks(X.shape[0]):
        D = loss_derivative(loss, _margins(X[s], T), y[s])
        total += np.asarray(X[s].T @ D).T
    return total


def clipped_grad_sum(
    loss: str, X, y: np.ndarray, Theta: np.ndarray, xi: float
) -> tuple[np.ndarray, np.ndarray]:
    """Sum of L1-clipped per-record (sub)gradients (R, p) and clipped-record counts (R,) int64.

    clip_xi(v) = v * min(1, xi / ||v||_1) (factor 1 for v = 0; xi = inf disables clipping).
    For linear models ||grad||_1 = |dloss/dz| * ||x||_1, so the factor is computed on the (n, R)
    derivative matrix and the sum is one GEMM per chunk.
    """
    check_loss(loss)
    xi = float(xi)
    if not xi > 0:
        raise ValueError(f"clipping norm xi must be positive, got {xi}")
    T = as_runs(Theta)
    _check_finite(T, "clipped_grad_sum")
    y = _check_shapes(X, y, T)
    total = np.zeros(T.shape)
    counts = np.zeros(T.shape[0], dtype=np.int64)
    for s in _chunks(X.shape[0]):
        Xc = X[s]
        D = loss_derivative(loss, _margins(Xc, T), y[s])
        if np.isfinite(xi):
            norms = np.abs(D) * _row_l1(Xc)[:, None]
            over = norms > xi
            factor = np.ones_like(norms)
            np.divide(xi, norms, out=factor, where=over)
            D = D * factor
            counts += over.sum(axis=0)
        total += np.asarray(Xc.T @ D).T
    return total, counts


def grad_l1_norms(loss: str, X, y: np.ndarray, Theta: np.ndarray) -> np.ndarray:
    """Per-record L1 norms of the (sub)gradients, shape (n, R) (for the Xi percentile rule)."""
    check_loss(loss)
    T = as_runs(Theta)
    _check_finite(T, "grad_l1_norms")
    y = _check_shapes(X, y, T)
    out = np.empty((X.shape[0], T.shape[0]))
    for s in _chunks(X.shape[0]):
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
