"""The algebraic connectivity lambda_2 of a weighted graph's Laplacian: dense for the papers'
sizes, sparse (ARPACK) for thousands of agents. Pure math on arrays (data and models use it)."""

from __future__ import annotations

from typing import cast

import numpy as np
import scipy.sparse as sp
from scipy.sparse.csgraph import connected_components

#: up to this many agents `laplacian_lambda2` takes every eigenvalue of the dense Laplacian
#: (LAPACK); above it, the sparse iteration (a dense n x n matrix and an O(n^3) solve would not fit
#: 10^4 agents and up)
LAMBDA2_DENSE_MAX = 1000
#: relative tolerance of the sparse iteration (ARPACK): lambda_2 to about 1e-12 of the largest
#: Laplacian eigenvalue
LAMBDA2_SPARSE_TOL = 1e-12


def laplacian_lambda2(W: sp.spmatrix | np.ndarray, method: str = "auto") -> float:
    """The second smallest eigenvalue of the graph Laplacian D - W (0.0 for one agent).

    method "dense": all eigenvalues of the dense Laplacian (LAPACK); "sparse": 0.0 for a
    disconnected graph (exactly: D - W then has 0 twice), else the Lanczos iteration (ARPACK) on
    the sparse Laplacian, shifted and restricted to the vectors orthogonal to the constant one,
    accurate to about 1e-12 of the largest eigenvalue; "auto": dense up to LAMBDA2_DENSE_MAX
    agents (what the graphs of the papers' sizes always had), sparse above.
    """
    if method not in ("auto", "dense", "sparse"):
        raise ValueError(f"method must be 'auto', 'dense' or 'sparse', got {method!r}")
    n = W.shape[0]
    if n < 2:
        return 0.0
    if method == "dense" or (method == "auto" and n <= LAMBDA2_DENSE_MAX):
        A = (cast("sp.spmatrix", W).toarray() if sp.issparse(W)
             else np.asarray(W, dtype=np.float64))
        L = np.diag(A.sum(axis=1)) - A
        return float(np.linalg.eigvalsh(L)[1])
    return _lambda2_sparse(sp.csr_matrix(W, dtype=np.float64))


def _lambda2_sparse(W: sp.csr_matrix) -> float:
    """lambda_2 of D - W by ARPACK: the largest eigenvalue of c I - L on the complement of the
    constant vector is c - lambda_2 (c = 2 max degree >= lambda_max, Gershgorin)."""
    from scipy.sparse.linalg import LinearOperator, eigsh

    n = W.shape[0]
    if connected_components(W, directed=False)[0] > 1:
        return 0.0
    deg = np.asarray(W.sum(axis=1)).ravel()
    c = 2.0 * float(deg.max())
    if c == 0.0:
        return 0.0

    def matvec(x: np.ndarray) -> np.ndarray:
        x = np.ravel(x)
        x = x - x.mean()
        y = (c - deg) * x + W @ x  # (c I - D + W) x
        return y - y.mean()

    op = LinearOperator((n, n), matvec=matvec, dtype=np.float64)
    v0 = np.cos(np.arange(n) * 0.7 + 0.3)  # fixed start: the same iteration on every call
    v0 -= v0.mean()
    top = eigsh(op, k=1, which="LA", v0=v0, tol=LAMBDA2_SPARSE_TOL, ncv=min(n - 1, 40),
                maxiter=100 * n, return_eigenvectors=False)
    return float(max(0.0, c - float(top[0])))
