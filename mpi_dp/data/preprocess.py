"""Feature preprocessing for real datasets: pure NumPy/SciPy functions, no I/O.

Each ``fit_*`` function returns the parameters it fitted (dict of arrays) so that the ``data prepare``
pipeline can store them next to the shards and apply the same transform elsewhere. Statistics can be
fitted on a subset of rows (the learner-public hold-out) so that nothing about the owners' records
leaks into the transform. Inputs are dense float64 arrays or ``scipy.sparse`` matrices; sparse input
stays CSR wherever the transform keeps zeros at zero. Inputs are never modified in place.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypeAlias, cast

import numpy as np
import scipy.sparse as sp

from mpi_dp.errors import DataError

Matrix: TypeAlias = np.ndarray | sp.csr_matrix


def _as_matrix(X: Any, what: str = "X") -> Matrix:
    """X as a 2-D float64 ndarray or a float64 CSR matrix (a copy only where a conversion is needed)."""
    if sp.issparse(X):
        X = sp.csr_matrix(X, dtype=np.float64)
    else:
        X = np.asarray(X, dtype=np.float64)
    if X.ndim != 2:
        raise DataError(f"{what} must be a 2-D matrix (records x features), got shape {X.shape}")
    return X


def _values(X: Matrix) -> np.ndarray:
    """The stored values of X (all entries when dense, the non-zeros when sparse)."""
    return cast(np.ndarray, X.data) if sp.issparse(X) else X


def _check_finite(X: Matrix, what: str) -> None:
    if not np.all(np.isfinite(_values(X))):
        raise DataError(f"{what} contains NaN or infinite values; clean them before preprocessing")


def _select_rows(X: Matrix, rows: np.ndarray | None, what: str = "rows") -> Matrix:
    """X restricted to `rows` (integer indices or a boolean mask); all of X when rows is None."""
    if rows is None:
        sub = X
    else:
        r = np.asarray(rows)
        n = X.shape[0]
        if r.dtype == bool:
            if r.shape != (n,):
                raise DataError(f"boolean {what} mask has shape {r.shape}, expected ({n},)")
            r = np.flatnonzero(r)
        elif r.size and not np.issubdtype(r.dtype, np.integer):
            raise DataError(f"{what} must be integer record indices or a boolean mask, got dtype {r.dtype}")
        r = r.astype(np.int64, copy=False).ravel()
        if r.size and (r.min() < 0 or r.max() >= n):
            raise DataError(f"{what} holds indices outside [0, {n:,}): min {r.min()}, max {r.max()}")
        sub = X[r]
    if sub.shape[0] == 0:
        raise DataError(f"no records to fit on: {what} selects 0 of {X.shape[0]:,} records")
    return sub


def _colvec(a: Any) -> np.ndarray:
    """A column reduction of a sparse matrix (np.matrix 1 x p) as a flat ndarray."""
    return np.asarray(a, dtype=np.float64).ravel()


def _param(params: dict[str, Any], key: str, p: int, what: str) -> np.ndarray:
    try:
        v = np.asarray(params[key], dtype=np.float64)
    except KeyError:
        raise DataError(f"{what} parameters lack {key!r} (have {sorted(params)})") from None
    if v.shape[:1] != (p,):
        raise DataError(f"{what} parameter {key!r} has shape {v.shape} but X has {p} features")
    return v


# --------------------------------------------------------------------------- standardisation


def fit_standardise(X: Any, rows: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """Column means and standard deviations (ddof = 0) over `rows` only, or over all rows.

    Returns {"mean": (p,), "scale": (p,)} with scale = std, and scale = 1.0 for columns that are
    constant over those rows (so applying it never divides by zero). Dense and sparse input.
    """
    X = _as_matrix(X)
    _check_finite(X, "X")
    sub = _select_rows(X, rows)
    if sp.issparse(sub):
        mean = _colvec(sub.mean(axis=0))
        var = np.maximum(_colvec(cast(sp.csr_matrix, sub).multiply(sub).mean(axis=0)) - mean**2, 0.0)
        std = np.sqrt(var)
        constant = _colvec(sub.max(axis=0).toarray()) == _colvec(sub.min(axis=0).toarray())
    else:
        mean = sub.mean(axis=0)
        std = sub.std(axis=0)
        constant = np.ptp(sub, axis=0) == 0
    scale = np.where(constant | (std == 0), 1.0, std)
    return {"mean": mean, "scale": scale}


def apply_standardise(X: Any, params: dict[str, Any]) -> np.ndarray:
    """(X - mean) / scale with fitted parameters; dense only (centring a sparse matrix densifies it)."""
    if sp.issparse(X):
        raise DataError(
            "standardising sparse features would densify them (centring fills every zero); "
            "use max_normalise or row_normalise for sparse data, or convert to dense first"
        )
    X = _as_matrix(X)
    p = X.shape[1]
    return (X - _param(params, "mean", p, "standardise")) / _param(params, "scale", p, "standardise")


# --------------------------------------------------------------------------- scaling


def scale_columns(X: Any, scale: np.ndarray) -> Matrix:
    """Divide column j of X by scale[j] (dense or CSR; CSR stays CSR). Used to re-apply max_normalise."""
    X = _as_matrix(X)
    scale = np.asarray(scale, dtype=np.float64)
    if scale.shape != (X.shape[1],):
        raise DataError(f"column scales have shape {scale.shape} but X has {X.shape[1]} features")
    if np.any(scale == 0) or not np.all(np.isfinite(scale)):
        raise DataError("column scales must be finite and non-zero")
    if sp.issparse(X):
        out = X.copy()
        out.data /= scale[out.indices]
        return out
    return X / scale


def max_normalise(X: Any, rows: np.ndarray | None = None) -> tuple[Matrix, np.ndarray]:
    """Divide each column by its largest |value| over `rows` (or all rows), so those rows lie in [-1, 1].

    Returns (scaled X, divisors); the divisor of a column whose max |value| is 0 is 1.0 (column
    untouched). Records outside `rows` may exceed 1 in absolute value. Dense and CSR (stays CSR).
    """
    X = _as_matrix(X)
    _check_finite(X, "X")
    sub = _select_rows(X, rows)
    if sp.issparse(sub):
        m = _colvec(abs(sub).max(axis=0).toarray())
    else:
        m = np.abs(sub).max(axis=0)
    divisors = np.where(m > 0, m, 1.0)
    return scale_columns(X, divisors), divisors


def row_normalise(X: Any, norm: str = "l2") -> Matrix:
    """Scale every record to norm <= 1: x / max(1, ||x||) with the l1 or l2 norm.

    Rows already inside the unit ball are returned unchanged (bitwise). Dense and CSR (stays CSR).
    """
    if norm not in ("l1", "l2"):
        raise DataError(f"row norm must be 'l1' or 'l2', got {norm!r}")
    X = _as_matrix(X)
    _check_finite(X, "X")
    if sp.issparse(X):
        if norm == "l2":
            norms = np.sqrt(_colvec(X.multiply(X).sum(axis=1)))
        else:
            norms = _colvec(abs(X).sum(axis=1))
    else:
        norms = np.sqrt(np.einsum("ij,ij->i", X, X)) if norm == "l2" else np.abs(X).sum(axis=1)
    factor = np.maximum(norms, 1.0)
    if sp.issparse(X):
        out = X.copy()
        out.data /= np.repeat(factor, np.diff(out.indptr))
        return out
    return X / factor[:, None]


def log1p_columns(X: Any, columns: Sequence[int]) -> Matrix:
    """sign(x) * log1p(|x|) on the given columns (heavy-tailed amounts); other columns unchanged.

    Maps 0 to 0, so CSR input stays CSR with the same sparsity pattern.
    """
    X = _as_matrix(X)
    p = X.shape[1]
    cols = np.asarray(list(columns), dtype=np.int64)
    if cols.size and (cols.min() < 0 or cols.max() >= p):
        raise DataError(f"log1p columns {cols.tolist()} are outside [0, {p}) for X with {p} features")
    if sp.issparse(X):
        out = X.copy()
        mask = np.isin(out.indices, cols)
        out.data[mask] = np.sign(out.data[mask]) * np.log1p(np.abs(out.data[mask]))
        return out
    out = X.copy()
    out[:, cols] = np.sign(out[:, cols]) * np.log1p(np.abs(out[:, cols]))
    return out


def add_bias(X: Any) -> Matrix:
    """X with a column of ones appended as the last feature (dense stays dense, CSR stays CSR)."""
    X = _as_matrix(X)
    ones = np.ones((X.shape[0], 1))
    if sp.issparse(X):
        return sp.hstack([X, sp.csr_matrix(ones)], format="csr")
    return np.hstack([X, ones])


# --------------------------------------------------------------------------- PCA


def fit_pca(X_public: Any, k: int | None, *, centred: bool = False) -> dict[str, Any]:
    """Top-k eigenpairs of the hold-out's second-moment matrix, for x <- D^{-1/2} V^T x ("balancing").

    Uncentred (the papers' choice): eigenvectors of X^T X. centred=True: of the scatter matrix
    (X - mean)^T (X - mean), i.e. the covariance times the number of hold-out records, so that D has
    the same meaning in both modes and the whitened hold-out satisfies Z^T Z = I_k either way.
    Only X_public enters, so the basis cannot depend on any owner's record.

    Returns {"V": (p, k) orthonormal columns, "D": (k,) descending, "mean": (p,) (zeros when
    uncentred), "centred": bool}. The sign of each eigenvector is fixed so that its entry of
    largest |value| is positive. k None keeps all p. DataError when k > p, or when a kept
    eigenvalue is numerically zero (rank-deficient hold-out), since whitening would divide by it.
    """
    X = _as_matrix(X_public, "X_public")
    n, p = X.shape
    if n == 0:
        raise DataError("the PCA hold-out has no records")
    _check_finite(X, "the PCA hold-out")
    k = p if k is None else int(k)
    if k < 1 or k > p:
        raise DataError(f"PCA needs 1 <= k <= p, got k = {k} components for p = {p} features")

    if centred:
        mean = _colvec(X.mean(axis=0)) if sp.issparse(X) else X.mean(axis=0)
        if sp.issparse(X):
            M = (X.T @ X).toarray() - n * np.outer(mean, mean)
        else:
            Xc = X - mean
            M = Xc.T @ Xc
    else:
        mean = np.zeros(p)
        M = (X.T @ X).toarray() if sp.issparse(X) else X.T @ X

    evals, evecs = np.linalg.eigh(M)  # ascending
    D = evals[::-1][:k].copy()
    V = evecs[:, ::-1][:, :k].copy()

    # Numerically zero: below the rounding error of forming and decomposing M.
    tol = max(float(evals[-1]), 0.0) * max(n, p) * np.finfo(np.float64).eps
    zero = D <= tol
    if np.any(zero):
        rank = int(np.sum(evals > tol))
        raise DataError(
            f"rank-deficient PCA hold-out: {int(zero.sum())} of the {k} kept eigenvalues of the "
            f"{'centred ' if centred else ''}second-moment matrix are zero (rank {rank} of {p} features, "
            f"{n:,} records); use k <= {rank} or a hold-out whose features are not linearly dependent"
        )

    lead = np.argmax(np.abs(V), axis=0)
    signs = np.where(V[lead, np.arange(k)] < 0, -1.0, 1.0)
    V *= signs
    return {"V": V, "D": D, "mean": mean, "centred": bool(centred)}


def apply_pca(X: Any, params: dict[str, Any], *, whiten: bool = True) -> np.ndarray:
    """Project records onto the fitted basis: D^{-1/2} V^T x (whiten) or V^T x; dense (n, k) output.

    For a centred fit the stored mean is subtracted first (for CSR input as mean^T V after the
    product, so the sparse matrix is never densified).
    """
    X = _as_matrix(X)
    p = X.shape[1]
    V = _param(params, "V", p, "PCA")
    if V.ndim != 2:
        raise DataError(f"PCA parameter 'V' must be a (p, k) matrix, got shape {V.shape}")
    D = np.asarray(params.get("D"), dtype=np.float64) if whiten else None
    centred = bool(params.get("centred", False))
    if centred:
        mean = _param(params, "mean", p, "PCA")
        Z = np.asarray(X @ V) - mean @ V if sp.issparse(X) else (X - mean) @ V
    else:
        Z = np.asarray(X @ V)
    if whiten:
        if D is None or D.shape != (V.shape[1],) or np.any(~(D > 0)):
            raise DataError(f"PCA parameter 'D' must hold {V.shape[1]} positive eigenvalues to whiten")
        Z = Z / np.sqrt(D)
    return Z
