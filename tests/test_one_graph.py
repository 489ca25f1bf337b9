"""One graph type (mpi_dp.agent_graph.Graph) for dola's topology and p2p's objective (2).

p2p's model used a class of its own (a checked symmetric CSR W); `Graph.from_weights` keeps its
checks and messages, and its W, deg, neighbour order, Laplacian and smooth term are the same
bits as that class gave (rebuilt below as it was)."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

from mpi_dp.agent_graph import Graph
from mpi_dp.comm import topology as tp
from mpi_dp.p2p import objective


class _AsItWas:
    """The Graph of p2p's model (then models.p2p) before the merge: W, deg, nbrs, weights,
    laplacian, smooth_term."""

    def __init__(self, W, symmetric=False):
        W = sp.csr_matrix(W, dtype=np.float64)
        W.sum_duplicates()
        W.sort_indices()
        W.eliminate_zeros()
        self.W, self.n = W, W.shape[0]
        self.deg = np.asarray(W.sum(axis=1)).ravel()

    def nbrs(self, i):
        return self.W.indices[self.W.indptr[i]:self.W.indptr[i + 1]]

    def weights(self, i):
        return self.W.data[self.W.indptr[i]:self.W.indptr[i + 1]]

    @property
    def laplacian(self):
        return sp.csr_matrix(sp.diags(self.deg) - self.W)

    def smooth_term(self, Theta, block):
        W = self.W
        R, p = Theta.shape[0], Theta.shape[2]
        if W.nnz * R * p <= block:
            rows = np.repeat(np.arange(self.n), np.diff(W.indptr))
            diff = Theta[:, rows, :] - Theta[:, W.indices, :]
            return 0.25 * np.einsum("e,rep,rep->r", W.data, diff, diff)
        rows = np.repeat(np.arange(self.n, dtype=W.indices.dtype), np.diff(W.indptr))
        up = W.indices > rows
        rows, cols, w = rows[up], W.indices[up], W.data[up]
        per = max(1, block // max(1, p))
        out = np.zeros(R)
        for r in range(R):
            T = np.ascontiguousarray(Theta[r])
            for a in range(0, len(w), per):
                d = T[rows[a:a + per]] - T[cols[a:a + per]]
                out[r] += w[a:a + per] @ np.einsum("ep,ep->e", d, d)
        return 0.5 * out


def _same(a, b) -> bool:
    a, b = np.asarray(a), np.asarray(b)
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def _same_csr(A, B) -> bool:
    return (A.shape == B.shape and _same(A.indptr, B.indptr) and _same(A.indices, B.indices)
            and _same(A.data, B.data))


def _random_weights(n: int, seed: int) -> sp.csr_matrix:
    g = np.random.default_rng(seed)
    A = np.triu(g.random((n, n)) < 0.3, 1) * g.uniform(0.1, 3.0, (n, n))
    A[np.arange(n - 1), np.arange(1, n)] = g.uniform(0.1, 3.0, n - 1)  # a path: no isolated agent
    return sp.csr_matrix(A + A.T)


def _graphs():
    yield "weights", _random_weights(30, 1)
    yield "complete", tp.make_graph("complete", 12, 0).weight_matrix()
    yield "erdos_renyi", tp.make_graph("erdos_renyi:0.3", 40, 3).weight_matrix()
    e = tp.make_graph("ring", 9, 0)
    yield "weighted ring", tp.Graph(9, e.edges, "ring", weights=np.linspace(0.5, 2.0, 9)
                                    ).weight_matrix()


@pytest.mark.parametrize("name, W", list(_graphs()), ids=[n for n, _ in _graphs()])
def test_the_p2p_view_is_the_same_bits_as_the_old_class(name, W):
    old = _AsItWas(W.copy())
    for symmetric in (False, True):
        g = Graph.from_weights(W.copy(), symmetric=symmetric)
        assert g.n == g.m == old.n
        assert _same_csr(g.W, old.W) and _same(g.deg, old.deg)
        assert _same_csr(g.laplacian, old.laplacian)
        for i in range(g.n):
            assert _same(g.nbrs(i), old.nbrs(i)) and _same(g.nbr_weights(i), old.weights(i))
        Th = np.random.default_rng(5).standard_normal((3, g.n, 4))
        assert _same(objective.smooth_term(g, Th), old.smooth_term(Th, objective.SMOOTH_BLOCK))
        for block in (1, 7, 97):  # the blocked sum over the upper triangle
            M_block = objective.SMOOTH_BLOCK
            try:
                objective.SMOOTH_BLOCK = block
                assert _same(objective.smooth_term(g, Th), old.smooth_term(Th, block))
            finally:
                objective.SMOOTH_BLOCK = M_block


def test_an_edge_built_graph_and_its_weight_matrix_give_the_same_graph():
    base = tp.make_graph("erdos_renyi:0.3", 25, 2)
    for g in (base, tp.Graph(25, base.edges, "w", weights=np.arange(1, len(base.edges) + 1.0))):
        h = Graph.from_weights(g.weight_matrix(), kind=g.kind)
        assert _same(h.edges, g.edges) and h.kind == g.kind
        assert _same(h.weights, np.ones(len(g.edges)) if g.weights is None else g.weights)
        assert _same_csr(g.W, h.W) and _same(g.deg, h.deg) and _same_csr(g.laplacian, h.laplacian)
        assert _same_csr(g.adjacency, h.adjacency) and _same(g.degrees, h.degrees)
        for i in range(g.m):
            assert _same(g.nbrs(i), h.nbrs(i)) and _same(g.nbrs(i).astype(np.int64),
                                                          g.neighbours(i))
        assert h.is_connected() and h.describe()["weighted"]


@pytest.mark.parametrize("W, message", [
    (sp.csr_matrix(np.ones((2, 3))), "W must be square"),
    (sp.csr_matrix(np.array([[0.0, 1.0], [2.0, 0.0]])), "W must be symmetric"),
    (sp.csr_matrix(np.array([[0.0, -1.0], [-1.0, 0.0]])), "non-negative with a zero diagonal"),
    (sp.csr_matrix(np.array([[1.0, 1.0], [1.0, 0.0]])), "non-negative with a zero diagonal"),
    (sp.csr_matrix(np.array([[0.0, 1.0, 0.0], [1.0, 0.0, 0.0], [0.0, 0.0, 0.0]])),
     r"agent\(s\) \[2\] have no neighbour"),
    (sp.csr_matrix(np.array([[0.0, np.inf], [np.inf, 0.0]])), "W must be finite"),
])
def test_from_weights_refuses_what_the_model_cannot_use(W, message):
    with pytest.raises(ValueError, match=message):
        Graph.from_weights(W)


def test_one_class_everywhere():
    assert tp.Graph is Graph and objective.Graph is Graph
    assert not hasattr(Graph, "smooth_term")  # objective (2)'s term is the model's
