"""Distributed PETSc KSP solve of the quadratic Theta* (pytest-mpi, 1, 2 and 4 ranks): every rank
passes only the data of the agents it hosts and gets the serial SciPy solution back."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
from mpi4py import MPI

from mpi_dp.models.reference import petsc_available
from mpi_dp.p2p import objective, reference

pytestmark = pytest.mark.mpi


def _instance(n: int, p: int, seed: int):
    g = np.random.default_rng(seed)
    A = np.triu(g.random((n, n)) < 0.3, 1)
    A[np.arange(n - 1), np.arange(1, n)] = True
    W = np.where(A, g.uniform(0.1, 1.0, (n, n)), 0.0)
    W = sp.csr_matrix(W + W.T)
    X = [g.normal(size=(int(g.integers(5, 30)), p)) for _ in range(n)]
    y = [Xi @ g.normal(size=p) + 0.1 * g.normal(size=Xi.shape[0]) for Xi in X]
    return W, X, y


@pytest.mark.skipif(not petsc_available(), reason="petsc4py is not installed")
@pytest.mark.parametrize("n,p,mu", [(13, 4, 1.0), (7, 3, 10.0), (3, 5, 0.5)])
def test_distributed_ksp_equals_serial_scipy(n, p, mu):
    comm = MPI.COMM_WORLD
    W, X, y = _instance(n, p, seed=n)
    m = np.array([x.shape[0] for x in X])
    serial, q_serial = reference.theta_star(objective.make_problem(W, X, y, "quadratic", mu, 0.05), "scipy")
    starts = reference.block_starts(n, comm.Get_size())
    lo, hi = int(starts[comm.Get_rank()]), int(starts[comm.Get_rank() + 1])
    mine = [X[i] if lo <= i < hi else None for i in range(n)]
    local = objective.make_problem(W, mine, [y[i] if lo <= i < hi else None for i in range(n)],
                                   "quadratic", mu, 0.05, m=m)
    assert [i for i in range(n) if local.X[i] is not None] == list(range(lo, hi))
    Theta, q = reference.theta_star_petsc_dist(comm, local)
    ok = (np.max(np.abs(Theta - serial)) <= 1e-9 * max(1.0, np.max(np.abs(serial)))
          and abs(q - q_serial) <= 1e-9 * max(1.0, abs(q_serial)))
    assert comm.allreduce(int(not ok)) == 0
    # the same block layout as the package's MPI graph helper
    from mpi_dp.comm.graph_exchange import block_starts

    assert np.array_equal(starts, block_starts(n, comm.Get_size()))
