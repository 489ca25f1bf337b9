"""PETSc/TAO bounded quasi-Newton solver for the reference optimum (optional, petsc4py).

Imported lazily by `reference.minimize_smooth(..., solver="petsc")`, so mpi_dp works without
petsc4py. TAO runs on PETSc.COMM_SELF: the callback, not PETSc, decides where f is evaluated (it may
itself gather owners' loss and gradient sums over MPI).
"""

from __future__ import annotations

import sys
from collections.abc import Callable

import numpy as np

from mpi_dp.errors import NumericalError


def load_petsc():
    """PETSc, initialised on MPI.COMM_SELF: PetscInitialize is collective over PETSC_COMM_WORLD,
    and only the learner solves, while the owners wait in the callback's broadcasts.

    mpi4py's MPI comes first: a petsc4py wheel taken from pip's cache keeps the RUNPATH of the
    venv it was built in, and finds the mpich wheel's libmpi.so.12 only as an already loaded
    library (without it, a venv at another path fails with "libmpi.so.12: cannot open")."""
    import petsc4py
    from mpi4py import MPI

    if "petsc4py.PETSc" not in sys.modules:
        petsc4py.init(comm=MPI.COMM_SELF)
    from petsc4py import PETSc

    return PETSc


def minimize_tao(
    fun_and_grad: Callable[[np.ndarray], tuple[float, np.ndarray]],
    p: int,
    theta_max: float,
    *,
    x0: np.ndarray | None = None,
    gatol: float = 1e-12,
    max_iter: int = 100_000,
    tao_type: str = "blmvm",
    restarts: int = 3,
) -> np.ndarray:
    """Minimise f over ||theta||_inf <= theta_max with TAO (`blmvm` by default).

    Tolerances are absolute on the (projected) gradient norm; relative tolerances are off so f is
    converged to rounding. A line-search failure near the optimum is normal at such tolerances:
    the solve is restarted from its own answer (fresh quasi-Newton memory) a few times.
    """
    PETSc = load_petsc()
    comm = PETSc.COMM_SELF

    def objgrad(tao, x, g) -> float:
        f, grad = fun_and_grad(np.array(x.getArray(readonly=True), dtype=np.float64))
        g.setArray(np.asarray(grad, dtype=np.float64))
        return float(f)

    x = PETSc.Vec().createSeq(p, comm=comm)
    x.setArray(np.zeros(p) if x0 is None else np.asarray(x0, dtype=np.float64))
    g = x.duplicate()
    bounds = None
    if np.isfinite(theta_max):
        lb, ub = x.duplicate(), x.duplicate()
        lb.set(-float(theta_max))
        ub.set(float(theta_max))
        bounds = (lb, ub)
    f_best = np.inf
    best = x.getArray().copy()
    try:
        for _ in range(restarts + 1):
            tao = PETSc.TAO().create(comm=comm)
            try:
                tao.setType(tao_type)
                tao.setObjectiveGradient(objgrad, g)
                if bounds is not None:
                    tao.setVariableBounds(bounds)
                tao.setTolerances(gatol=gatol, grtol=0.0, gttol=0.0)
                tao.setMaximumIterations(max_iter)
                # setSolution is petsc4py >= 3.17; older releases call it setInitial
                (tao.setSolution if hasattr(tao, "setSolution") else tao.setInitial)(x)
                tao.solve()
                reason = tao.getConvergedReason()
                sol = tao.getSolution().getArray().copy()
                f = objgrad(tao, tao.getSolution(), g)
            finally:
                tao.destroy()
            if not np.all(np.isfinite(sol)) or not np.isfinite(f):
                raise NumericalError(f"TAO {tao_type} produced a non-finite iterate")
            if not f < f_best:
                break
            gain = f_best - f
            f_best, best = f, sol
            if reason > 0 or gain <= 1e-16 * abs(f):
                break
            x.setArray(sol)
    finally:
        for v in (x, g, *(bounds or ())):
            v.destroy()
    return best
