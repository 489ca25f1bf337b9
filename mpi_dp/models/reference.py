"""Non-private reference optimum theta* of f(theta) = lam/2 ||theta||^2 + (1/n) sum loss over the
box ||theta||_inf <= theta_max.

psi = f/f(theta*) - 1 is reported down to about 1e-4, so f(theta*) must be accurate to a relative
1e-8: ridge uses the closed form, the logistic loss a tightly converged bounded quasi-Newton method
(L-BFGS-B, or PETSc/TAO), and the hinge loss an exact dual coordinate-descent SVM solver with an
active-set polish.

The smooth solvers only see a callback ``fun_and_grad(theta) -> (f, grad)``, so a caller may
evaluate f across MPI ranks (each owner contributes its loss and gradient sums) without the solver
ever touching the data. X may be a dense array or a scipy.sparse CSR matrix everywhere; the
dual CD solver keeps a large CSR X sparse (see `svm_dual_cd`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import cast

import numpy as np
import scipy.linalg
import scipy.sparse as sp

from mpi_dp import rng
from mpi_dp.errors import NumericalError
from mpi_dp.models import linear

FunAndGrad = Callable[[np.ndarray], tuple[float, np.ndarray]]

SOLVERS = ("auto", "closed", "scipy", "petsc")


@functools.lru_cache(maxsize=1)
def petsc_available() -> bool:
    """True if petsc4py imports and initialises (checked once)."""
    try:
        from mpi_dp.models.petsc_backend import load_petsc

        load_petsc()
    except Exception:  # ImportError, or a broken build failing at init
        return False
    return True


def ridge_closed_form(gram: np.ndarray | sp.spmatrix, xty: np.ndarray, n: int, lam: float
                      ) -> np.ndarray:
    """Unconstrained ridge optimum: solve ((2/n) X^T X + lam I) theta = (2/n) X^T y.

    `gram` = X^T X (dense, or scipy.sparse: densified, p x p) and `xty` = X^T y summed over all
    owners, `n` the total record count.
    """
    gram = (cast("sp.spmatrix", gram).toarray() if sp.issparse(gram)
            else np.asarray(gram, dtype=np.float64))
    A = (2.0 / n) * gram + lam * np.eye(gram.shape[0])
    b = (2.0 / n) * np.asarray(xty, dtype=np.float64)
    return scipy.linalg.solve(A, b, assume_a="pos")


def local_fun_and_grad(loss: str, X, y: np.ndarray, lam: float) -> FunAndGrad:
    """The callback (f(theta), grad f(theta)) for in-memory data X, y (used by theta_star_local)."""
    linear.check_loss(loss)
    n = X.shape[0]

    def fun_and_grad(theta: np.ndarray) -> tuple[float, np.ndarray]:
        loss_sum, grad_sum = linear.loss_grad_sum(loss, X, y, theta)  # one pass over X
        f = 0.5 * lam * float(theta @ theta) + float(loss_sum[0]) / n
        g = lam * theta + grad_sum[0] / n
        return f, g

    return fun_and_grad


def projected_gradient(theta: np.ndarray, grad: np.ndarray, theta_max: float) -> np.ndarray:
    """Gradient with the components that push out of the box at an active bound zeroed."""
    pg = np.array(grad, dtype=np.float64)
    if np.isfinite(theta_max):
        at_hi = (theta >= theta_max) & (pg < 0)
        at_lo = (theta <= -theta_max) & (pg > 0)
        pg[at_hi | at_lo] = 0.0
    return pg


def _scipy_lbfgsb(
    fun_and_grad: FunAndGrad,
    x0: np.ndarray,
    theta_max: float,
    tol: float,
    max_iter: int,
    max_restarts: int,
) -> np.ndarray:
    """L-BFGS-B with tight tolerances, restarted from its answer (fresh memory) until f stalls."""
    p = x0.shape[0]
    bounds = None if not np.isfinite(theta_max) else [(-theta_max, theta_max)] * p

    def fg(theta: np.ndarray) -> tuple[float, np.ndarray]:
        f, g = fun_and_grad(np.array(theta, dtype=np.float64))
        return float(f), np.asarray(g, dtype=np.float64)

    import scipy.optimize  # on first solve: about 0.2 s that a cached reference never needs

    opts = {"maxiter": max_iter, "maxfun": 4 * max_iter, "ftol": 0.0, "gtol": tol, "maxcor": 30}
    x, f_best = x0, np.inf
    for _ in range(max_restarts + 1):
        res = scipy.optimize.minimize(fg, x, jac=True, method="L-BFGS-B", bounds=bounds,
                                      options=opts)
        if not np.all(np.isfinite(res.x)) or not np.isfinite(res.fun):
            raise NumericalError(f"L-BFGS-B produced a non-finite iterate ({res.message})")
        if not res.fun < f_best:
            break
        gain = f_best - res.fun
        x, f_best = res.x, res.fun
        pg = projected_gradient(x, res.jac, theta_max)
        if np.max(np.abs(pg), initial=0.0) <= tol or gain <= 1e-16 * abs(f_best):
            break
    return np.array(x, dtype=np.float64)


def minimize_smooth(
    fun_and_grad: FunAndGrad,
    p: int,
    theta_max: float,
    *,
    solver: str = "scipy",
    x0: np.ndarray | None = None,
    tol: float = 1e-12,
    max_iter: int = 100_000,
) -> np.ndarray:
    """Minimise a smooth convex f over the box ||theta||_inf <= theta_max from a callback.

    `fun_and_grad(theta)` returns f (regulariser included) and its (p,) gradient. `solver` is
    "scipy" (L-BFGS-B, restarted until f stalls) or "petsc" (TAO bounded quasi-Newton on
    COMM_SELF). `tol` bounds the projected gradient (absolute, infinity norm).
    """
    x = np.zeros(p) if x0 is None else np.array(x0, dtype=np.float64).reshape(p)
    x = linear.project_box(x, theta_max)
    if solver == "scipy":
        return _scipy_lbfgsb(fun_and_grad, x, theta_max, tol, max_iter, max_restarts=5)
    if solver == "petsc":
        from mpi_dp.models import petsc_backend

        return petsc_backend.minimize_tao(fun_and_grad, p, theta_max, x0=x, gatol=tol,
                                          max_iter=max_iter)
    raise ValueError(f"unknown smooth solver {solver!r}; expected 'scipy' or 'petsc'")


def _svm_gap(Z: np.ndarray, a: np.ndarray, C: float) -> tuple[np.ndarray, float, float]:
    """w = Z^T a, the primal value P(w) and the duality gap P(w) - D(a)."""
    w = Z.T @ a
    ww = float(w @ w)
    primal = 0.5 * ww + C * float(np.maximum(0.0, 1.0 - Z @ w).sum())
    dual = float(a.sum()) - 0.5 * ww
    return w, primal, primal - dual


_POLISH_DELTAS = (1e-2, 1e-3, 1e-4, 1e-6, 1e-8)


def _svm_polish(Z: np.ndarray, w: np.ndarray, C: float, delta: float) -> np.ndarray:
    """Active-set step: guess the support sets from the margins of w, then solve them exactly.

    Records with margin < 1 - delta get a_i = C, those within delta of 1 are free and solve
    z_i^T w = 1 (least squares if degenerate), the rest get 0. The result is dual feasible, so its
    duality gap certifies it (a wrong guess just fails to certify).
    """
    m = Z @ w
    upper = m < 1.0 - delta
    free = np.abs(m - 1.0) <= delta
    a_new = np.where(upper, C, 0.0)
    if free.any():
        Zf = Z[free]
        # v = Zf^T a_F solves Zf v = rhs; then a_F is the min-norm preimage of v (avoids Zf Zf^T).
        if sp.issparse(Z):
            rhs = 1.0 - Zf @ (Z.T @ a_new)  # a_new is 0 off `upper`: no row extraction needed
            a_f = _csr_free_solve(Zf, rhs)
        else:
            rhs = 1.0 - Zf @ (Z[upper].T @ a_new[upper])
            v = np.linalg.lstsq(Zf, rhs, rcond=None)[0]
            a_f = np.linalg.lstsq(Zf.T, v, rcond=None)[0]
        a_new[free] = np.clip(a_f, 0.0, C)
    return a_new


def _csr_free_solve(Zf, rhs: np.ndarray) -> np.ndarray:
    """The polish's a_F for a CSR free block, a_F = (Zf Zf^T)^+ rhs without forming Zf Zf^T.

    Dense, on the columns the free records use (the others only add zero rows to Zf^T). One
    economic QR of Zf^T = Q R gives a_F = R^-1 R^-T rhs; when R is numerically singular (e.g.
    duplicate records) the two minimum-norm least-squares solves of the dense path are used.
    """
    At = Zf[:, np.unique(Zf.indices)].toarray().T  # (k, m)
    if At.shape[0] >= At.shape[1]:
        R = scipy.linalg.qr(At, mode="r", check_finite=False)[0][: At.shape[1]]
        d = np.abs(np.diag(R))
        if d.size and d.min() > np.finfo(np.float64).eps * max(At.shape) * d.max():
            u = scipy.linalg.solve_triangular(R, rhs, trans="T", check_finite=False)
            return scipy.linalg.solve_triangular(R, u, check_finite=False)
    v = np.linalg.lstsq(At.T, rhs, rcond=None)[0]
    return np.linalg.lstsq(At, v, rcond=None)[0]


def _svm_certify(Z: np.ndarray, w: np.ndarray, C: float, tol: float) -> np.ndarray | None:
    """A w whose duality gap is <= tol relative, found by active-set polishes from w, or None."""
    for delta in _POLISH_DELTAS:
        w_pol = w
        for _ in range(3):
            w_pol, primal, gap = _svm_gap(Z, _svm_polish(Z, w_pol, C, delta), C)
            if gap <= tol * primal:
                return w_pol
    return None


def _svm_smoothed_newton(
    Z: np.ndarray, C: float, w: np.ndarray, tol: float
) -> np.ndarray | None:
    """Finisher: Newton on the Huber-smoothed hinge with smoothing h -> 0 (continuation).

    The smoothed primal 1/2||w||^2 + C sum l_h(z_i^T w) is C^1 and piecewise quadratic, so Newton
    converges in a few steps; a_i = C clip((1 - m_i)/h, 0, 1) is dual feasible and its gap, or
    an active-set polish of w_h, certifies the exact hinge optimum once h is small.
    """
    p = Z.shape[1]

    def smoothed(w: np.ndarray, h: float) -> tuple[float, np.ndarray, np.ndarray]:
        m = Z @ w
        r = 1.0 - m
        loss = np.where(r >= h, r - 0.5 * h, np.where(r > 0.0, 0.5 * r * r / h, 0.0))
        return 0.5 * float(w @ w) + C * float(loss.sum()), np.clip(r / h, 0.0, 1.0), r

    for k in range(0, 16):
        h = 10.0 ** (-k)
        for _ in range(100):
            val, s, r = smoothed(w, h)
            grad = w - C * (Z.T @ s)
            band = (r > 0.0) & (r < h)
            d = -_newton_solve(Z[band], C / h, grad, p)
            t = 1.0
            while t > 1e-12:
                val_new = smoothed(w + t * d, h)[0]
                if val_new <= val + 1e-4 * t * float(grad @ d):
                    break
                t *= 0.5
            w_new = w + t * d
            done = np.max(np.abs(w_new - w)) <= 1e-15 * (1.0 + np.max(np.abs(w)))
            w = w_new
            if done or t <= 1e-12:
                break
        a = C * np.clip((1.0 - Z @ w) / h, 0.0, 1.0)
        w_d, primal, gap = _svm_gap(Z, a, C)
        if gap <= tol * primal:
            return w_d
        w_cert = _svm_certify(Z, w, C, tol)
        if w_cert is not None:
            return w_cert
    return None


#: svm_dual_cd densifies a sparse X with at most this many entries n p (32 MiB of float64).
SVM_DENSE_MAX = 2**22


def _newton_solve(Zb, c: float, g: np.ndarray, p: int) -> np.ndarray:
    """(I + c Zb^T Zb)^{-1} g. Dense Zb: the p x p system. CSR Zb: through the |band| x |band|
    system (Woodbury: g - c Zb^T (I + c Zb Zb^T)^{-1} Zb g) when the band has fewer rows than p,
    else the p x p system with a dense Gram."""
    if not sp.issparse(Zb):
        H = np.eye(p) + c * (Zb.T @ Zb)
        return scipy.linalg.solve(H, g, assume_a="pos")
    b = Zb.shape[0]
    if b < p:
        K = (Zb @ Zb.T).toarray()
        K *= c
        K[np.diag_indices(b)] += 1.0
        u = scipy.linalg.solve(K, np.asarray(Zb @ g).ravel(), assume_a="pos") if b else np.zeros(0)
        return g - c * np.asarray(Zb.T @ u).ravel()
    H = (Zb.T @ Zb).toarray()
    H *= c
    H[np.diag_indices(p)] += 1.0
    return scipy.linalg.solve(H, g, assume_a="pos")


def _svm_rows(Z) -> list:
    """Per-record rows z_i for the CD loop: dense row views, or (indices, values) of a CSR row."""
    if not sp.issparse(Z):
        return list(Z)
    ptr, idx, val = Z.indptr, Z.indices, Z.data
    return [(idx[ptr[i]:ptr[i + 1]], val[ptr[i]:ptr[i + 1]]) for i in range(Z.shape[0])]


def svm_dual_cd(
    X,
    y: np.ndarray,
    lam: float,
    *,
    tol: float = 1e-10,
    max_iter: int = 5000,
    seed: int = 0,
    dense_max: int = SVM_DENSE_MAX,
) -> np.ndarray:
    """Exact minimiser of lam/2 ||theta||^2 + (1/n) sum max(0, 1 - y theta^T x) (L1-loss SVM).

    liblinear-type dual coordinate descent with C = 1/(lam n) (f = lam * (1/2 ||theta||^2 + C sum
    hinge)) and random epoch permutations from the stream (seed, "sample", 0, 0). After each epoch
    an active-set polish tries to certify the exact optimum; once CD has slowed down, a smoothed
    Newton finisher takes over (CD alone converges slowly to 1e-10). Returns when the duality gap
    relative to the primal is <= `tol`, so f is exact to about `tol` relative. Any bias is a
    column of X; y must be in {-1, +1}. A scipy.sparse X with more than `dense_max` entries
    (n p) stays sparse (CSR): CD touches only a record's nonzeros, and only the smoothed-Newton
    finisher forms a dense p x p (or band x band) matrix; a smaller one is densified (faster, and
    then bitwise the same as for the dense X).
    """
    sparse = sp.issparse(X) and X.shape[0] * X.shape[1] > dense_max
    if sp.issparse(X):
        Xd = sp.csr_matrix(X, dtype=np.float64) if sparse else np.asarray(X.toarray(), np.float64)
    else:
        Xd = np.asarray(X, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    n = Xd.shape[0]
    if y.shape != (n,) or not np.all(np.abs(y) == 1.0):
        raise ValueError("svm_dual_cd needs labels y in {-1, +1} with one label per row of X")
    if not lam > 0:
        raise ValueError(f"svm_dual_cd needs lam > 0, got {lam}")
    C = 1.0 / (lam * n)
    if sparse:
        Z = sp.csr_matrix(sp.diags(y) @ Xd)
        Z.sum_duplicates()
        Qd = np.asarray(Z.multiply(Z).sum(axis=1), dtype=np.float64).ravel()
    else:
        Z = y[:, None] * Xd
        Qd = np.einsum("ij,ij->i", Z, Z)
    a = np.zeros(n)
    w = np.zeros(Xd.shape[1])
    gen = rng.stream(seed, "sample", 0, 0)
    rows = _svm_rows(Z)
    finish_gap, finish_epochs = 1e-4, 50
    for epoch in range(max_iter):
        for i in gen.permutation(n).tolist():
            qd = Qd[i]
            if qd <= 0.0:
                continue
            if sparse:
                idx, zi = rows[i]
                G = float(zi @ w[idx]) - 1.0
            else:
                zi = rows[i]
                G = float(zi @ w) - 1.0
            ai = a[i]
            if (ai <= 0.0 and G >= 0.0) or (ai >= C and G <= 0.0):
                continue
            new = min(max(ai - G / qd, 0.0), C)
            if new != ai:
                if sparse:
                    w[idx] += (new - ai) * zi
                else:
                    w += (new - ai) * zi
                a[i] = new
        w, primal, gap = _svm_gap(Z, a, C)
        if gap <= tol * primal:
            return w
        w_cert = _svm_certify(Z, w, C, tol)  # the CD state is left alone
        if w_cert is not None:
            return w_cert
        if gap <= finish_gap * primal or epoch + 1 >= finish_epochs:
            w_fin = _svm_smoothed_newton(Z, C, w, tol)
            if w_fin is not None:
                return w_fin
            finish_epochs = 2 * (epoch + 1)
            finish_gap = 0.01 * gap / primal
    raise NumericalError(
        f"svm_dual_cd: relative duality gap {gap / primal:.3g} > {tol:g} after {max_iter} epochs"
    )


def theta_star_local(
    loss: str, X, y: np.ndarray, lam: float, theta_max: float, solver: str = "auto"
) -> np.ndarray:
    """theta* for in-memory data (an owner's isolated optimum theta*_i, tests).

    squared: closed form (falls back to the bounded solver if the box binds); logistic: L-BFGS-B
    (or TAO with solver="petsc"); hinge: exact dual CD, which assumes the box is inactive and raises
    if it binds. `solver` in {"auto", "closed", "scipy", "petsc"} forces a method.
    """
    linear.check_loss(loss)
    if solver not in SOLVERS:
        raise ValueError(f"unknown solver {solver!r}; expected one of {SOLVERS}")
    n, p = X.shape
    y = np.asarray(y, dtype=np.float64)
    if loss == "hinge":
        if solver not in ("auto", "closed"):
            raise ValueError("the hinge loss is non-smooth: use solver='auto' (dual CD)")
        theta = svm_dual_cd(X, y, lam)
        if np.max(np.abs(theta)) > theta_max:
            raise ValueError(
                f"hinge theta* has max |theta_j| = {np.max(np.abs(theta)):.4g} > theta_max = "
                f"{theta_max:g}: the box binds, which svm_dual_cd does not support; raise theta_max"
            )
        return theta
    if loss == "squared" and solver in ("auto", "closed"):
        gram = X.T @ X
        gram = gram.toarray() if sp.issparse(gram) else gram
        theta = ridge_closed_form(gram, np.asarray(X.T @ y).ravel(), n, lam)
        if np.max(np.abs(theta)) <= theta_max:
            return theta
        if solver == "closed":
            raise ValueError("the ridge closed form leaves the box; use solver='auto' or 'scipy'")
        solver = "scipy"
    if solver == "closed":
        raise ValueError(f"no closed form for the {loss} loss")
    method = "scipy" if solver == "auto" else solver
    return minimize_smooth(local_fun_and_grad(loss, X, y, lam), p, theta_max, solver=method)
