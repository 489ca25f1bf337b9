"""Reference solutions of objective (2) of seed 004 (pure NumPy/SciPy; PETSc optional).

* `local_model(s)`: the purely local models theta_i^loc = argmin L_i (eq. 1);
* `consensus_model`: argmin_theta sum_i D_ii c_i L_i(theta), the mu -> 0 limit of (2);
* `theta_star`: the optimum Theta* of Q and Q*. Quadratic loss: the sparse SPD system
  (Lap (x) I_p + blockdiag(mu D_ii c_i A_i)) vec(Theta) = [mu D_ii c_i b_i]_i, solved by CG
  (SciPy, block-Jacobi preconditioner) or PETSc KSP (CG + block Jacobi/ICC); logistic loss:
  L-BFGS on Q (or TAO with solver="petsc"), polished by sparse Newton steps;
* `theta_star_petsc_dist`: the quadratic system distributed over MPI ranks with PETSc, each
  rank assembling the rows of the agents it hosts from its own data only;
* `mp_solution`: the optimum of model propagation (App. C), (Lap + mu diag(D_ii c_i)) Theta =
  mu diag(D_ii c_i) Theta^loc.

All solvers need the data of the agents whose rows they build (X[i] not None). Models here are
single (n, p) arrays: they are deterministic, so runs share them.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import scipy.linalg
import scipy.sparse as sp
import scipy.sparse.linalg as spla

from mpi_dp.errors import NumericalError
from mpi_dp.models.reference import minimize_smooth, petsc_available
from mpi_dp.p2p import objective

SOLVERS = ("auto", "scipy", "petsc")
#: default tolerances: relative residual of the quadratic system, inf-norm of grad Q (logistic)
QUAD_TOL = 1e-14
GRAD_TOL = 1e-10
#: Newton polish of the logistic Theta*: sparse direct solves while nnz(W) p stays below this
POLISH_DIRECT_NNZ = 4_000_000
#: model propagation (`mp_solution`): a sparse LU up to this many graph entries, CG above
MP_DIRECT_NNZ = 1_000_000


# ---------------------------------------------------------------------------------------------
# local and consensus models


def quad_terms(X: np.ndarray, y: np.ndarray, lam: float) -> tuple[np.ndarray, np.ndarray]:
    """(A_i, b_i) of the quadratic loss: grad L_i(theta) = A_i theta - b_i (m_i = 0: 2 lam I, 0)."""
    m, p = X.shape
    A = 2.0 * lam * np.eye(p)
    if m == 0:
        return A, np.zeros(p)
    return A + (2.0 / m) * (X.T @ X), (2.0 / m) * (X.T @ y)


def _solve_spd(A: np.ndarray, b: np.ndarray) -> np.ndarray:
    try:
        return scipy.linalg.solve(A, b, assume_a="pos")
    except np.linalg.LinAlgError:  # lam = 0 and rank-deficient data: minimum-norm minimiser
        return np.linalg.lstsq(A, b, rcond=None)[0]


def _weighted_newton(data: list[tuple[np.ndarray, np.ndarray, float, float]], p: int,
                     tol: float, max_iter: int = 200) -> np.ndarray:
    """argmin sum_i w_i L_i(theta) for the logistic loss, data = [(X_i, y_i, lam_i, w_i)]:
    damped Newton (Armijo backtracking) until ||grad||_inf <= tol."""
    Xs = np.concatenate([d[0] for d in data]) if data else np.zeros((0, p))
    ys = np.concatenate([d[1] for d in data]) if data else np.zeros(0)
    ew = np.concatenate([np.full(d[0].shape[0], d[3] / max(d[0].shape[0], 1)) for d in data]
                        ) if data else np.zeros(0)
    reg = sum(d[3] * d[2] for d in data)  # f has + reg ||theta||^2

    def fgh(theta: np.ndarray, hess: bool) -> tuple[float, np.ndarray, np.ndarray | None]:
        z = ys * (Xs @ theta)
        f = float(ew @ np.logaddexp(0.0, -z)) + reg * float(theta @ theta)
        s = objective._sigmoid_neg(z)  # 1/(1+e^z)
        g = Xs.T @ (-ew * ys * s) + 2.0 * reg * theta
        H = (Xs.T * (ew * s * (1.0 - s))) @ Xs + 2.0 * reg * np.eye(p) if hess else None
        return f, g, H

    theta = np.zeros(p)
    f, g, H = fgh(theta, True)
    for _ in range(max_iter):
        if np.max(np.abs(g), initial=0.0) <= tol:
            return theta
        assert H is not None  # fgh(theta, True) gives the Hessian
        d = -_solve_spd(H, g)
        t, slope = 1.0, float(g @ d)
        while t > 1e-12:
            f_new, g_new, _ = fgh(theta + t * d, False)
            if f_new <= f + 1e-4 * t * slope:
                break
            t *= 0.5
        else:  # no decrease at rounding level: f is flat to machine precision here
            return theta
        new = theta + t * d
        if np.array_equal(new, theta):  # a step below rounding: every later iteration would
            break  # repeat this one from the same state, up to max_iter, to the same answer
        theta = new
        f, g, H = fgh(theta, True)
    if np.max(np.abs(g), initial=0.0) > math.sqrt(tol):
        raise NumericalError(f"logistic Newton did not converge: ||grad||_inf = "
                             f"{np.max(np.abs(g)):.3g} (lam = 0 on separable data?)")
    return theta


def local_model(loss: str, X: np.ndarray, y: np.ndarray, lam: float, tol: float = GRAD_TOL
                ) -> np.ndarray:
    """theta^loc = argmin L(theta) (eq. 1), shape (p,): closed form (quadratic) or Newton
    (logistic, ||grad||_inf <= tol)."""
    if loss == "quadratic":
        return _solve_spd(*quad_terms(X, y, lam))
    if loss == "logistic":
        return _weighted_newton([(X, y, float(lam), 1.0)], X.shape[1], tol)
    raise ValueError(f"loss must be one of {objective.LOSSES}, got {loss!r}")


def local_models_of(loss: str, X: list, y: list, lam: np.ndarray, p: int,
                    tol: float = GRAD_TOL) -> np.ndarray:
    """(n, p) local models of the agents in X (rows where X[i] is None are NaN)."""
    out = np.full((len(X), p), np.nan)
    for i, (Xi, yi) in enumerate(zip(X, y, strict=True)):
        if Xi is not None:
            out[i] = local_model(loss, Xi, yi, float(lam[i]), tol)
    return out


def local_models(problem: objective.Problem, tol: float = GRAD_TOL) -> np.ndarray:
    """Theta^loc (n, p): the purely local model of every hosted agent (NaN rows elsewhere)."""
    return local_models_of(problem.loss, problem.X, problem.y, problem.lam, problem.p, tol)


def _require_data(problem: objective.Problem, agents) -> None:
    missing = [int(i) for i in agents if problem.X[i] is None]
    if missing:
        raise ValueError(f"the data of agent(s) {missing[:5]} is not present here")


def consensus_model(problem: objective.Problem, tol: float = GRAD_TOL) -> np.ndarray:
    """argmin_theta sum_i D_ii c_i L_i(theta) (p,): the mu -> 0 limit of (2); needs all data."""
    _require_data(problem, range(problem.n))
    w = problem.deg * problem.conf
    if problem.loss == "quadratic":
        A = np.zeros((problem.p, problem.p))
        b = np.zeros(problem.p)
        for i in range(problem.n):
            Ai, bi = quad_terms(problem.X[i], problem.y[i], float(problem.lam[i]))
            A += w[i] * Ai
            b += w[i] * bi
        return _solve_spd(A, b)
    data = [(problem.X[i], problem.y[i], float(problem.lam[i]), float(w[i]))
            for i in range(problem.n)]
    return _weighted_newton(data, problem.p, tol)


# ---------------------------------------------------------------------------------------------
# the quadratic system


def quad_rows(problem: objective.Problem, lo: int, hi: int, p: int | None = None
              ) -> tuple[sp.csr_matrix, np.ndarray, np.ndarray]:
    """Rows lo*p..hi*p of the system (Lap (x) I_p + blockdiag(mu D_ii c_i A_i)) vec(Theta) = rhs
    for agents lo..hi-1: (CSR with global columns, sorted; their rhs; their p x p diagonal
    blocks D_ii I + mu D_ii c_i A_i, the block-Jacobi preconditioner)."""
    n, p = problem.n, problem.p if p is None else p
    _require_data(problem, range(lo, hi))
    lap = problem.graph.laplacian[lo:hi]
    k = hi - lo
    blocks, rhs = np.empty((k, p, p)), np.empty((k, p))
    for a, i in enumerate(range(lo, hi)):
        Ai, bi = quad_terms(problem.X[i], problem.y[i], float(problem.lam[i]))
        wi = problem.mu * problem.deg[i] * problem.conf[i]
        blocks[a], rhs[a] = wi * Ai, wi * bi
    r = np.repeat(np.arange(k * p), p)  # block a, row s, col t -> (a p + s, (lo + a) p + t)
    c = np.repeat(np.arange(lo, hi) * p, p * p) + np.tile(np.arange(p), k * p)
    bd = sp.csr_matrix((blocks.ravel(), (r, c)), shape=(k * p, n * p))
    H = sp.csr_matrix(sp.kron(lap, sp.eye(p), format="csr") + bd)
    H.sum_duplicates()
    H.sort_indices()
    diag = blocks + problem.deg[lo:hi, None, None] * np.eye(p)
    return H, rhs.ravel(), diag


def _floor_atol(norm_h: float, N: int, x_norm: float) -> float:
    """Residual norm that rounding alone leaves in H x: no solver goes reliably below it."""
    return 10.0 * math.sqrt(N) * np.finfo(float).eps * norm_h * x_norm


def _cg_scipy(H: sp.csr_matrix, b: np.ndarray, diag: np.ndarray, tol: float) -> np.ndarray:
    """CG with the block-Jacobi preconditioner diag (n, p, p)^-1 to relative residual tol (or
    the rounding floor), restarted from its answer so the recursive residual cannot drift."""
    N = H.shape[0]
    M = _block_jacobi(diag)
    nb = float(np.linalg.norm(b))
    if nb == 0.0:
        return np.zeros(N)
    norm_h = float(abs(H).sum(axis=1).max())
    maxiter = 20 * N + 1000
    x, info = spla.cg(H, b, rtol=max(tol, 1e-10), maxiter=maxiter, M=M)
    res = float(np.linalg.norm(b - H @ x))
    for _ in range(8):
        floor = _floor_atol(norm_h, N, float(np.linalg.norm(x)))
        if res <= max(tol * nb, floor):
            break
        x_new, info = spla.cg(H, b, x0=x, rtol=tol, atol=floor, maxiter=maxiter, M=M)
        res_new = float(np.linalg.norm(b - H @ x_new))
        if res_new < res:
            x, res_old, res = x_new, res, res_new
            if res > 0.5 * res_old:
                break
        else:
            break
    if not np.all(np.isfinite(x)) or res > math.sqrt(tol) * nb + _floor_atol(
            norm_h, N, float(np.linalg.norm(x))):
        raise NumericalError(f"CG stalled at relative residual {res / nb:.3g} (info {info})")
    return x


def _petsc_mod():
    from mpi_dp.models import petsc_backend

    return petsc_backend.load_petsc()


def _ksp_cg(comm: Any, H: sp.csr_matrix, b: np.ndarray, N: int, tol: float) -> np.ndarray:
    """PETSc KSP CG + block Jacobi (ICC(0) per rank block) on the rows this rank owns (H: local
    rows with global columns, b: local rhs). Two passes: relative 1e-10, then tol or the rounding
    floor of the local rows (reduced over comm). Returns the local part of the solution."""
    PETSc = _petsc_mod()
    nloc = H.shape[0]
    A = PETSc.Mat().createAIJ(size=((nloc, N), (nloc, N)),
                              csr=(H.indptr.astype(PETSc.IntType), H.indices.astype(PETSc.IntType),
                                   H.data), comm=comm)
    A.assemble()
    xv, bv = A.createVecs()
    bv.setArray(b)
    ksp = PETSc.KSP().create(comm=comm)
    try:
        ksp.setOperators(A)
        ksp.setType("cg")
        ksp.setNormType(PETSc.KSP.NormType.UNPRECONDITIONED)
        pc = ksp.getPC()
        pc.setType("bjacobi")
        ksp.setUp()
        for sub in pc.getBJacobiSubKSP():
            sub.setType("preonly")
            sub.getPC().setType("icc")
        nb = bv.norm()
        ksp.setTolerances(rtol=max(tol, 1e-10), atol=0.0, max_it=20 * N + 1000)
        ksp.solve(bv, xv)
        # second pass from there: stop at tol * ||b|| or the rounding floor (global norms)
        norm_h = A.norm(PETSc.NormType.INFINITY)
        floor = _floor_atol(norm_h, N, xv.norm())
        ksp.setInitialGuessNonzero(True)
        ksp.setTolerances(rtol=0.0, atol=max(tol * nb, floor), max_it=20 * N + 1000)
        ksp.solve(bv, xv)
        r = bv.duplicate()
        A.mult(xv, r)
        r.aypx(-1.0, bv)
        res = r.norm()
        r.destroy()
        if res > math.sqrt(tol) * nb + floor:
            raise NumericalError(f"PETSc KSP stalled at relative residual {res / nb:.3g}")
        return xv.getArray().copy()
    finally:
        # drop the PC wrappers before destroying: a PETSc object left alive on a multi-rank comm
        # makes a rank that exits first skip PETSc's clean finalisation, and hydra then SIGKILLs
        # the ranks still working (tests/test_mpi_p2p.py::..._lets_every_rank_exit)
        pc = sub = None
        for obj in (ksp, A, xv, bv):
            obj.destroy()


# ---------------------------------------------------------------------------------------------
# Theta*


def _logistic_parts(problem: objective.Problem):
    """Vectorised Q for the logistic loss: returns f(vec Theta) -> (Q, grad) and the Hessian."""
    n, p = problem.n, problem.p
    _require_data(problem, range(n))
    lap = problem.graph.laplacian
    X = np.concatenate([problem.X[i] for i in range(n)])
    y = np.concatenate([problem.y[i] for i in range(n)])
    m = np.array([problem.X[i].shape[0] for i in range(n)])
    owner = np.repeat(np.arange(n), m)
    off = np.concatenate([[0], np.cumsum(m)])  # agent i's records: off[i]:off[i + 1]
    w = problem.mu * problem.deg * problem.conf  # per agent
    ew = (w / np.maximum(m, 1))[owner]  # per example
    reg = (w * problem.lam)[:, None]  # + reg_i ||Theta_i||^2
    S = sp.csr_matrix((np.ones(len(owner)), (owner, np.arange(len(owner)))), shape=(n, len(owner)))

    def fg(v: np.ndarray) -> tuple[float, np.ndarray]:
        T = v.reshape(n, p)
        LT = lap @ T
        z = y * np.einsum("kp,kp->k", X, T[owner])
        f = 0.5 * float(np.sum(T * LT)) + float(ew @ np.logaddexp(0.0, -z)) \
            + float(np.sum(reg * T * T))
        coef = -ew * y * objective._sigmoid_neg(z)
        g = LT + S @ (coef[:, None] * X) + 2.0 * reg * T
        return f, g.ravel()

    lap_diag = lap.diagonal()

    def hess(v: np.ndarray, sparse: bool) -> tuple[Any, np.ndarray]:
        """(H, its p x p diagonal blocks (n, p, p)): H as a sparse matrix when `sparse` (for a
        direct solve), else as an operator (Laplacian x I_p + block diagonal: no n p x n p
        matrix is formed; at 10^4 agents of a dense-ish graph that matrix takes gigabytes)."""
        T = v.reshape(n, p)
        z = y * np.einsum("kp,kp->k", X, T[owner])
        s = objective._sigmoid_neg(z)
        d = ew * s * (1.0 - s)
        blocks = np.empty((n, p, p))
        for i, (a, b) in enumerate(zip(off[:-1], off[1:], strict=True)):
            Xi = X[a:b]
            blocks[i] = (Xi.T * d[a:b]) @ Xi + 2.0 * reg[i, 0] * np.eye(p)
        diag = blocks + lap_diag[:, None, None] * np.eye(p)
        if sparse:
            return sp.csr_matrix(sp.kron(lap, sp.eye(p)) + sp.block_diag(list(blocks))), diag

        def matvec(r: np.ndarray) -> np.ndarray:
            R = r.reshape(n, p)
            return (lap @ R + np.einsum("nij,nj->ni", blocks, R)).ravel()

        return spla.LinearOperator((n * p, n * p), matvec=matvec, dtype=np.float64), diag

    return fg, hess


def theta_star(problem: objective.Problem, solver: str = "auto", tol: float | None = None,
               x0: np.ndarray | None = None) -> tuple[np.ndarray, float]:
    """(Theta* (n, p), Q*) of objective (2); needs every agent's data.

    Quadratic: the SPD system to relative residual `tol` (default 1e-14, or the rounding floor),
    by SciPy CG ("scipy"; "auto") or PETSc KSP ("petsc"). Logistic: L-BFGS ("scipy"; "auto") or
    TAO ("petsc") on Q to ||grad Q||_inf <= tol (default 1e-10), from x0 (default: the local
    models, vec (n p,)), then Newton polish: a sparse direct solve per step up to
    POLISH_DIRECT_NNZ Laplacian entries times p, block-Jacobi CG above (a direct factor of a
    dense-ish graph's Hessian does not fit 10^4 agents)."""
    if solver not in SOLVERS:
        raise ValueError(f"solver must be one of {SOLVERS}, got {solver!r}")
    if solver == "petsc" and not petsc_available():
        raise ValueError("solver='petsc' needs petsc4py")
    n, p = problem.n, problem.p
    if problem.loss == "quadratic":
        tol = QUAD_TOL if tol is None else tol
        H, b, diag = quad_rows(problem, 0, n)
        if solver == "petsc":
            x = _ksp_cg(_petsc_mod().COMM_SELF, H, b, n * p, tol)
        else:
            x = _cg_scipy(H, b, diag, tol)
        Theta = x.reshape(n, p)
    else:
        tol = GRAD_TOL if tol is None else tol
        fg, hess = _logistic_parts(problem)
        x0 = local_models(problem).ravel() if x0 is None else np.asarray(x0, np.float64).ravel()
        x = minimize_smooth(fg, n * p, math.inf, solver="scipy" if solver == "auto" else solver,
                            x0=x0, tol=tol)
        g = fg(x)[1]
        direct = problem.graph.W.nnz * p <= POLISH_DIRECT_NNZ
        for _ in range(5):  # Newton polish: L-BFGS stalls at rounding of f before grad -> 0
            if np.max(np.abs(g)) <= tol * 1e-2:
                break
            H, diag = hess(x, direct)
            x_new = x - (spla.spsolve(H.tocsc(), g) if direct else _newton_cg(H, diag, g))
            g_new = fg(x_new)[1]
            if not np.linalg.norm(g_new) < np.linalg.norm(g):
                break
            x, g = x_new, g_new
        if np.max(np.abs(g)) > tol:
            raise NumericalError(f"logistic Theta*: ||grad Q||_inf = {np.max(np.abs(g)):.3g}")
        Theta = x.reshape(n, p)
    return Theta, float(problem.objective(Theta[None])[0])


def _newton_cg(H: Any, diag: np.ndarray, g: np.ndarray) -> np.ndarray:
    """H^-1 g by CG with the p x p diagonal blocks `diag` (n, p, p) of H as preconditioner, to
    relative residual 1e-13 (a Newton step of the polish; the loop keeps it only if it lowers
    the gradient)."""
    n, p = diag.shape[:2]
    x, _ = spla.cg(H, g, rtol=1e-13, atol=0.0, maxiter=20 * n * p + 1000, M=_block_jacobi(diag))
    return x


def _block_jacobi(diag: np.ndarray) -> spla.LinearOperator:
    """The block-Jacobi preconditioner: the inverses of the p x p diagonal blocks `diag`
    (n, p, p), applied agent by agent."""
    n, p = diag.shape[:2]
    binv = np.linalg.inv(diag)
    return spla.LinearOperator((n * p, n * p), dtype=np.float64,
                               matvec=lambda r: np.einsum("nij,nj->ni", binv,
                                                          r.reshape(n, p)).ravel())


def block_starts(n: int, size: int) -> np.ndarray:
    """First agent of every rank (length size + 1): contiguous near-equal blocks, the layout of
    `mpi_dp.comm.graph_exchange.block_starts` (restated here so this models-layer module does not
    import mpi4py)."""
    base, extra = divmod(n, size)
    return np.concatenate([[0], np.cumsum([base + (r < extra) for r in range(size)])]
                          ).astype(np.int64)


def theta_star_petsc_dist(comm: Any, problem: objective.Problem, tol: float = QUAD_TOL
                          ) -> tuple[np.ndarray, float]:
    """(Theta* (n, p), Q*) of the quadratic objective by PETSc KSP distributed over `comm`
    (an mpi4py communicator; collective).

    Rank r hosts agents `block_starts(n, size)[r:r+2]` and `problem` needs the data of those
    agents only (X[i] may be None elsewhere; pass the public m to make_problem). Each rank
    assembles its agents' rows, the solve runs on a PETSc AIJ matrix whose row ownership is the
    agent blocks times p, and the full Theta* is allgathered to every rank. Q* sums the ranks'
    loss terms (one allreduce)."""
    if problem.loss != "quadratic":
        raise ValueError("the distributed KSP solve is for the quadratic loss")
    from mpi4py import MPI

    size, rank = comm.Get_size(), comm.Get_rank()
    n = problem.n
    p = comm.allreduce(problem.p, op=MPI.MAX)
    if problem.p not in (0, p):
        raise ValueError(f"inconsistent dimension p = {problem.p} here, {p} elsewhere")
    starts = block_starts(n, size)
    lo, hi = int(starts[rank]), int(starts[rank + 1])
    H, b, _ = quad_rows(problem, lo, hi, p)
    x_loc = _ksp_cg(comm, H, b, n * p, tol)
    counts = (np.diff(starts) * p).astype(np.int64)
    x = np.empty(n * p)
    comm.Allgatherv(np.ascontiguousarray(x_loc), [x, counts, starts[:-1] * p, MPI.DOUBLE])
    Theta = x.reshape(n, p)
    loss = sum(problem.deg[i] * problem.conf[i] * float(objective.local_obj(
        problem.loss, problem.X[i], problem.y[i], float(problem.lam[i]), Theta[i][None])[0])
        for i in range(lo, hi))
    smooth = float(objective.smooth_term(problem.graph, Theta[None])[0])
    return Theta, smooth + problem.mu * comm.allreduce(loss, op=MPI.SUM)


def mp_solution(problem: objective.Problem, theta_loc: np.ndarray, mu: float | None = None
                ) -> np.ndarray:
    """Optimum (n, p) of model propagation (App. C) with trade-off mu (default problem.mu):
    (Lap + mu diag(D_ii c_i)) Theta = mu diag(D_ii c_i) Theta^loc (sparse direct, all columns)."""
    mu = problem.mu if mu is None else float(mu)
    d = mu * problem.deg * problem.conf
    rhs = np.ascontiguousarray(d[:, None] * np.asarray(theta_loc, dtype=np.float64))
    if problem.graph.W.nnz > MP_DIRECT_NNZ:  # a sparse LU of a dense-ish graph does not fit
        return _jacobi_block_cg(sp.csr_matrix(problem.graph.laplacian + sp.diags(d)), rhs)
    M = sp.csc_matrix(problem.graph.laplacian + sp.diags(d))
    lu = spla.splu(M)
    return lu.solve(rhs)


def _jacobi_block_cg(A: sp.csr_matrix, B: np.ndarray, rtol: float = 1e-13,
                     maxiter: int | None = None) -> np.ndarray:
    """A^-1 B for SPD A and B (n, k): k independent Jacobi-preconditioned CGs, one sparse product
    with all k columns per iteration, each column to residual <= rtol ||b|| (or its rounding
    floor: stops when the residual no longer falls)."""
    n, k = B.shape
    dinv = 1.0 / A.diagonal()
    X = np.zeros_like(B)
    R = B.copy()
    Z = dinv[:, None] * R
    P = Z.copy()
    rz = np.einsum("ij,ij->j", R, Z)
    goal = rtol * np.linalg.norm(B, axis=0)
    best = np.linalg.norm(R, axis=0)
    stall = np.zeros(k, dtype=np.int64)
    live = best > goal
    for _ in range(maxiter or 10 * n + 100):
        if not live.any():
            break
        AP = A @ P
        pap = np.einsum("ij,ij->j", P, AP)
        alpha = np.where(live, rz / np.where(live, pap, 1.0), 0.0)
        X += alpha * P
        R -= alpha * AP
        res = np.linalg.norm(R, axis=0)
        stall = np.where(res < 0.999 * best, 0, stall + 1)
        best = np.minimum(best, res)
        live &= (res > goal) & (stall < 20)
        Z = dinv[:, None] * R
        rz_new = np.einsum("ij,ij->j", R, Z)
        beta = np.where(live, rz_new / np.where(rz > 0, rz, 1.0), 0.0)
        P = Z + beta * P
        rz = rz_new
    if not np.all(np.isfinite(X)) or np.any(best > math.sqrt(rtol) * np.linalg.norm(B, axis=0)):
        raise NumericalError("model propagation: CG did not converge")
    return X
