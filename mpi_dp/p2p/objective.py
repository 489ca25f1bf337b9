"""Objective (2) of seed 004: personalised models on a similarity graph (pure NumPy/SciPy).

Q(Theta) = 1/2 sum_{i<j} W_ij ||Theta_i - Theta_j||^2 + mu sum_i D_ii c_i L_i(Theta_i), with
L_i(theta) = (1/m_i) sum_k l(theta; x_ik, y_ik) + lam_i ||theta||^2 (no 1/2: gradient 2 lam theta).
mu -> inf gives the purely local models, mu -> 0 one consensus model (the paper's convention).

Models carry a leading runs axis where noted: theta (R, p), Theta (R, n, p). An agent's data may
be absent (None) on ranks that do not host it; the public constants (W, m, lam) are everywhere.
The graph is mpi_dp.agent_graph.Graph (W, deg, nbrs, nbr_weights, laplacian); its term of Q is
`smooth_term` here.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import numpy as np
import scipy.sparse as sp

from mpi_dp.agent_graph import Graph
from mpi_dp.backend import namespace, on_host, to_numpy

LOSSES = ("logistic", "quadratic")
#: (edge, run, coordinate) entries of one block of `smooth_term` (128 MiB of differences)
SMOOTH_BLOCK = 2**24


def _sigmoid_neg(z: np.ndarray) -> np.ndarray:
    """1 / (1 + e^z), stable for large |z|."""
    return 0.5 * (1.0 - np.tanh(0.5 * z))


def example_coef(loss: str, X: np.ndarray, y: np.ndarray, theta: np.ndarray) -> np.ndarray:
    """c (m, R) with per-example gradient grad l(theta_r; x_k, y_k) = c[k, r] x_k."""
    return margin_coef(loss, y, X @ theta.T)  # z (m, R)


def margin_coef(loss: str, y: np.ndarray, z: np.ndarray) -> np.ndarray:
    """`example_coef` from the margins z = X @ theta.T (m, R): elementwise per record."""
    if loss == "logistic":
        return -y[:, None] * _sigmoid_neg(y[:, None] * z)
    return 2.0 * (z - y[:, None])


def example_loss(loss: str, X: np.ndarray, y: np.ndarray, theta: np.ndarray) -> np.ndarray:
    """l(theta_r; x_k, y_k), shape (m, R)."""
    return margin_loss(loss, y, X @ theta.T)


def margin_loss(loss: str, y: np.ndarray, z: np.ndarray) -> np.ndarray:
    """`example_loss` from the margins z = X @ theta.T (m, R): elementwise per record."""
    if loss == "logistic":
        return np.logaddexp(0.0, -y[:, None] * z)
    return (z - y[:, None]) ** 2


def clip_factors(coef: np.ndarray, xnorm: np.ndarray, clip: float) -> np.ndarray:
    """min(1, clip / ||c x||) per example and run, for the norm whose row norms are `xnorm`."""
    g = np.abs(coef) * xnorm[:, None]
    with np.errstate(divide="ignore"):
        return np.minimum(1.0, clip / np.where(g > 0, g, np.inf))


def local_grad(loss: str, X: np.ndarray, y: np.ndarray, lam: float, theta: np.ndarray,
               clip: float = math.inf, xnorm: np.ndarray | None = None
               ) -> tuple[np.ndarray, np.ndarray]:
    """grad L_i at theta (R, p): the mean of the per-example gradients, each clipped to norm
    <= clip first (xnorm: the rows' norms in the clipping norm), then + 2 lam theta.
    Returns (gradient (R, p), fraction of examples clipped per run (R,)).

    X, y (and xnorm) on a device backend (mpi_dp.backend): the same steps as array-API
    operations there, theta on the host, the results brought back to the host."""
    if not on_host(X):
        return device_local_grad(loss, X, y, lam, theta, clip, xnorm)
    c = example_coef(loss, X, y, theta)
    frac = np.zeros(theta.shape[0])
    if math.isfinite(clip):
        assert xnorm is not None  # given where clipping
        f = clip_factors(c, xnorm, clip)
        frac = np.mean(f < 1.0, axis=0)
        c = c * f
    return (c.T @ X) / X.shape[0] + 2.0 * lam * theta, frac


def device_local_grad(loss: str, X, y, lam: float, theta: np.ndarray, clip: float = math.inf,
                      xnorm=None) -> tuple[np.ndarray, np.ndarray]:
    """`local_grad` with X (m, p), y (m,), xnorm (m,) on a device backend: (R, p) gradient and
    (R,) clipped fractions on the host, equal to `local_grad`'s up to rounding."""
    xp = namespace(X)
    th = np.asarray(theta, dtype=np.float64)
    z = X @ xp.asarray(np.ascontiguousarray(th.T))  # (m, R)
    yc = xp.expand_dims(y, axis=1)
    c = (-yc * (0.5 * (1.0 - xp.tanh(0.5 * (yc * z)))) if loss == "logistic"
         else 2.0 * (z - yc))
    frac = np.zeros(th.shape[0])
    if math.isfinite(clip):
        g = xp.abs(c) * xp.expand_dims(xnorm, axis=1)
        f = xp.where(g > clip, clip / xp.where(g > 0.0, g, 1.0), 1.0)
        frac = to_numpy(xp.mean(xp.astype(f < 1.0, xp.float64), axis=0))
        c = c * f
    S = to_numpy(xp.matrix_transpose(c) @ X)
    return S / X.shape[0] + 2.0 * lam * th, frac


def stackable(X: object, y: object) -> bool:
    """Whether `local_grads` takes an agent's records: dense float64 C-ordered X (m >= 1, p)
    and float64 labels (m,) (anything else: `local_grad` alone)."""
    return (isinstance(X, np.ndarray) and X.dtype == np.float64 and X.ndim == 2
            and X.shape[0] > 0 and X.flags.c_contiguous and isinstance(y, np.ndarray)
            and y.dtype == np.float64 and y.shape == (X.shape[0],))


def local_grads(loss: str, X: Sequence[np.ndarray], y: Sequence[np.ndarray], lam: np.ndarray,
                theta: Sequence[np.ndarray], clip: float = math.inf,
                xnorm: Sequence[np.ndarray] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """`local_grad` of A agents at once (each `stackable`): X[a] (m_a, p), y[a], lam (A,),
    theta[a] (R, p), xnorm[a] (m_a,) where clipping. Returns ((A, R, p) gradients, (A, R)
    fractions clipped), agent a's bit for bit its own `local_grad`: its two products are its own
    GEMMs (X @ theta.T, c.T @ X on a fresh copy of its c), the loss and clipping steps are
    elementwise on the agents' records concatenated, its clipped count is an exact integer sum
    over its records, and the rest is elementwise with its own scalars."""
    if not len(X):
        raise ValueError("local_grads needs at least one agent")
    m = np.array([x.shape[0] for x in X], dtype=np.int64)
    starts = np.concatenate([[0], np.cumsum(m)[:-1]])
    c = margin_coef(loss, np.concatenate(y), np.concatenate([x @ t.T for x, t in
                                                            zip(X, theta, strict=True)]))
    frac = np.zeros((len(X), c.shape[1]))
    if math.isfinite(clip):
        assert xnorm is not None  # given where clipping
        f = clip_factors(c, np.concatenate(xnorm), clip)
        frac = np.add.reduceat(f < 1.0, starts, axis=0, dtype=np.int64) / m[:, None]
        c = c * f
    S = np.stack([c[o:o + k].copy().T @ x for o, k, x in zip(starts.tolist(), m.tolist(), X,
                                                              strict=True)])
    return S / m[:, None, None] + (2.0 * np.asarray(lam, dtype=np.float64))[:, None, None] \
        * np.stack(theta), frac


def local_obj(loss: str, X: np.ndarray, y: np.ndarray, lam: float, theta: np.ndarray
              ) -> np.ndarray:
    """L_i(theta_r) for theta (R, p): shape (R,)."""
    return example_loss(loss, X, y, theta).mean(axis=0) + ridge(lam, theta)


def ridge(lam: float, theta: np.ndarray) -> np.ndarray:
    """lam ||theta_r||^2 for theta (R, p): the regulariser of `local_obj`, shape (R,)."""
    return lam * np.einsum("rp,rp->r", theta, theta)


def smoothness(loss: str, X: np.ndarray, lam: float) -> tuple[float, float]:
    """(L_loc, sigma_loc) of L_i from its data (spec §1)."""
    m = X.shape[0]
    top = float(np.linalg.eigvalsh(X.T @ X)[-1]) if m else 0.0
    if loss == "logistic":
        return top / (4.0 * m) + 2.0 * lam, 2.0 * lam
    ev = np.linalg.eigvalsh(2.0 / m * (X.T @ X) + 2.0 * lam * np.eye(X.shape[1]))
    return float(ev[-1]), float(ev[0])


def smoothness_bound(loss: str, row_norm: float, lam: float) -> float:
    """A data-independent upper bound on L_loc from a public bound on the rows' L2 norms."""
    return (row_norm**2 / 4.0 if loss == "logistic" else 2.0 * row_norm**2) + 2.0 * lam


def smooth_term(graph: Graph, Theta: np.ndarray) -> np.ndarray:
    """1/2 sum_{i<j} W_ij ||Theta_i - Theta_j||^2 for Theta (R, n, p): shape (R,). One einsum
    over every (edge, run, coordinate) up to SMOOTH_BLOCK of them (the bits objective (2) always
    had); above, the upper triangle's edges (`graph.upper`) in blocks of SMOOTH_BLOCK / p per run
    (memory O(block), not O(edges x runs x p); the same sum in another order)."""
    W = graph.W
    R, p = Theta.shape[0], Theta.shape[2]
    if W.nnz * R * p <= SMOOTH_BLOCK:
        rows = np.repeat(np.arange(graph.n), np.diff(W.indptr))
        diff = Theta[:, rows, :] - Theta[:, W.indices, :]
        return 0.25 * np.einsum("e,rep,rep->r", W.data, diff, diff)  # each edge twice
    rows, cols, w = graph.upper
    per = max(1, SMOOTH_BLOCK // max(1, p))
    out = np.zeros(R)
    for r in range(R):
        T = np.ascontiguousarray(Theta[r])
        for a in range(0, len(w), per):
            d = T[rows[a:a + per]] - T[cols[a:a + per]]
            out[r] += w[a:a + per] @ np.einsum("ep,ep->e", d, d)
    return 0.5 * out


def confidence(m: np.ndarray, conf_floor: float = 1e-3) -> np.ndarray:
    """c_i = m_i / max_j m_j, and conf_floor for agents without data."""
    m = np.asarray(m, dtype=np.float64)
    c = m / m.max() if m.max() > 0 else np.zeros_like(m)
    return np.where(m > 0, c, conf_floor)


@dataclasses.dataclass
class Problem:
    """Objective (2) over the agents: public constants everywhere, data where hosted.

    `L_loc` is per agent (from the data, or the public bound); `alpha_i = 1/(1 + mu c_i L_loc_i)`
    and the block constants `L_blk_i = D_ii (1 + mu c_i L_loc_i)` follow."""

    graph: Graph
    loss: str
    mu: float
    lam: np.ndarray  # (n,)
    m: np.ndarray  # (n,) records per agent (public)
    L_loc: np.ndarray  # (n,)
    sigma_loc: np.ndarray  # (n,)
    X: list  # per agent (m_i, p) or None where not hosted
    y: list
    conf_floor: float = 1e-3

    def __post_init__(self) -> None:
        if self.loss not in LOSSES:
            raise ValueError(f"loss must be one of {LOSSES}, got {self.loss!r}")
        self.n = self.graph.n
        self.conf = confidence(self.m, self.conf_floor)
        self.deg = self.graph.deg
        self.alpha = 1.0 / (1.0 + self.mu * self.conf * self.L_loc)
        self.L_blk = self.deg * (1.0 + self.mu * self.conf * self.L_loc)
        self.p = next((x.shape[1] for x in self.X if x is not None), 0)

    @property
    def sigma(self) -> float:
        """Lower bound mu min_i D_ii c_i sigma_loc_i on the strong convexity of Q."""
        return float(self.mu * np.min(self.deg * self.conf * self.sigma_loc))

    @property
    def kappa(self) -> float:
        return 1.0 - self.sigma / (self.n * float(self.L_blk.max()))

    def grad(self, i: int, theta: np.ndarray) -> np.ndarray:
        return local_grad(self.loss, self.X[i], self.y[i], float(self.lam[i]), theta)[0]

    def nbr_mean(self, i: int, nbr_models: np.ndarray) -> np.ndarray:
        """sum_j (W_ij / D_ii) Theta_j for nbr_models (|N_i|, R, p) in neighbour-id order."""
        w = self.graph.nbr_weights(i) / self.deg[i]
        return np.tensordot(w, nbr_models, axes=(0, 0))

    def cd_step(self, i: int, theta: np.ndarray, nbr_models: np.ndarray, g: np.ndarray
                ) -> np.ndarray:
        """Update (4)/(6): (1 - a) theta + a (sum_j W_ij/D_ii Theta_j - mu c_i g)."""
        a = self.alpha[i]
        return (1.0 - a) * theta + a * (self.nbr_mean(i, nbr_models) - self.mu * self.conf[i] * g)

    def objective(self, Theta: np.ndarray) -> np.ndarray:
        """Q for Theta (R, n, p): shape (R,). Needs every agent's data."""
        return self.combine(Theta, self.loss_terms(Theta, range(self.n)))

    def loss_terms(self, Theta: np.ndarray, agents) -> list[np.ndarray]:
        """D_ii c_i L_i(Theta_i) (R,) of each of `agents` (their data must be here)."""
        return [self.deg[i] * self.conf[i] * local_obj(self.loss, self.X[i], self.y[i],
                                                       float(self.lam[i]), Theta[:, i, :])
                for i in agents]

    def combine(self, Theta: np.ndarray, terms: list[np.ndarray]) -> np.ndarray:
        """Q from the loss terms of every agent in agent order (`loss_terms`, gathered from the
        ranks hosting them: the same sum as with all the data in one place)."""
        return smooth_term(self.graph, Theta) + self.mu * sum(terms)

    def partial_grad(self, Theta: np.ndarray, i: int) -> np.ndarray:
        """[grad Q]_i (eq. 3) for Theta (R, n, p): shape (R, p)."""
        nb = self.graph.nbrs(i)
        s = np.tensordot(self.graph.nbr_weights(i), Theta[:, nb, :], axes=(0, 1))
        return self.deg[i] * (Theta[:, i, :] + self.mu * self.conf[i] * self.grad(i, Theta[:, i, :])
                              ) - s


def make_problem(W: sp.spmatrix | Graph, X: list, y: list, loss: str, mu: float, lam: np.ndarray,
                 m: np.ndarray | None = None, smooth: str = "data", row_norm: float = 1.0,
                 conf_floor: float = 1e-3) -> Problem:
    """A Problem; smooth = 'data' (L_loc from each agent's data) or 'bound' (public row norm).
    W may be a built `Graph` (shared, not copied: it is not modified)."""
    g = W if isinstance(W, Graph) else Graph.from_weights(sp.csr_matrix(W))
    lam = np.broadcast_to(np.asarray(lam, dtype=np.float64), (g.n,)).copy()
    m = np.array([x.shape[0] for x in X], dtype=np.int64) if m is None else np.asarray(m)
    L_loc, s_loc = np.empty(g.n), np.empty(g.n)
    for i in range(g.n):
        if smooth == "bound" or X[i] is None:
            L_loc[i] = smoothness_bound(loss, row_norm, float(lam[i]))
            s_loc[i] = 2.0 * lam[i]
        else:
            L_loc[i], s_loc[i] = smoothness(loss, X[i], float(lam[i]))
    return Problem(g, loss, float(mu), lam, m, L_loc, s_loc, list(X), list(y), conf_floor)
