"""Mailbox slot layout (serial): slot (i, j) sits in CSR order of the host's rows."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
from mpi4py import MPI

from mpi_dp.comm import rma


def _path(n: int) -> sp.csr_matrix:
    A = np.zeros((n, n))
    for a in range(n - 1):
        A[a, a + 1] = A[a + 1, a] = 1
    return sp.csr_matrix(A)


def test_slot_disp_by_hand():
    W = _path(5)  # neighbours: 0:[1] 1:[0,2] 2:[1,3] 3:[2,4] 4:[3]
    starts = np.array([0, 2, 5])  # rank 0: agents 0, 1 (slots (0,1) (1,0) (1,2)); rank 1: 2, 3, 4
    item = 3
    assert [rma.slot_disp(W, starts, i, j, item) for i, j in [(0, 1), (1, 0), (1, 2)]] == [0, 4, 8]
    assert [rma.slot_disp(W, starts, i, j, item)
            for i, j in [(2, 1), (2, 3), (3, 2), (3, 4), (4, 3)]] == [0, 4, 8, 12, 16]
    with pytest.raises(ValueError):
        rma.slot_disp(W, starts, 0, 2, item)


def test_single_rank_exchange_matches_layout():
    W = _path(6)
    with rma.Mailboxes(MPI.COMM_SELF, W, 2) as mb:
        want = [rma.slot_disp(W, mb.starts, int(i), int(j), 2)
                for j in range(6) for i in W.indices[W.indptr[j]:W.indptr[j + 1]]]
        assert mb.received_disps.tolist() == want
        mb.post(2, 5.0, np.array([1.0, 2.0]))
        stamps, models = mb.read(1)
        assert stamps.tolist() == [-1.0, 5.0] and models.tolist() == [[0, 0], [1, 2]]
        assert mb.puts == 2


def test_asymmetric_graph_is_refused():
    W = _path(4).tolil()
    W[0, 3] = 1  # one direction only
    with pytest.raises(ValueError, match="symmetric"):
        rma.Mailboxes(MPI.COMM_SELF, W.tocsr(), 2)
