"""Pieces every star method shares: local owners' data, the evaluation oracle, reference optima.

Everything here is evaluation-only (psi, theta*, isolated optima): it reads un-noised functions of
the owners' data and is labelled so in the output. It is never part of the private protocol.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import numpy as np
import scipy.sparse as sp

from ..comm.star import Star
from ..errors import JobError
from ..models import linear, reference


def agent_order_sum(rows: np.ndarray) -> np.ndarray:
    """Sum of per-agent rows added one agent after the other, so the result never depends on
    how agents are laid out over ranks (bitwise rank-invariance)."""
    total = np.zeros(rows.shape[1:])
    for row in rows:
        total = total + row
    return total


@dataclasses.dataclass
class LocalShard:
    """The first n records of one owner's shard, as held on the rank hosting that owner.

    X is a dense float64 array or, for a sparse shard file, a scipy.sparse CSR matrix: every
    computation on it (models.linear, the reference solvers) accepts both.
    """

    agent: int
    X: np.ndarray | sp.csr_matrix
    y: np.ndarray

    @property
    def n(self) -> int:
        return int(self.X.shape[0])

    @functools.cached_property
    def squared_stats(self) -> linear.SquaredStats:
        """Gram matrix and row norms for the fast squared-loss clipped gradient (computed once)."""
        return linear.squared_stats(self.X, self.y)


@dataclasses.dataclass(frozen=True)
class Reference:
    """Non-private reference quantities of one configuration (evaluation-only)."""

    theta_star: np.ndarray
    f_star: float
    theta_isolated: np.ndarray  # (N, p): each owner's own optimum theta*_i
    psi_isolated: np.ndarray  # (N,): psi(theta*_i) on the full objective
    solver: str


class Oracle:
    """Evaluation-only access to the full objective f, computed across ranks in agent order."""

    def __init__(self, star: Star, shards: list[LocalShard], loss: str, lam: float,
                 n_total: int, p: int) -> None:
        self.star, self.shards, self.loss, self.lam = star, shards, loss, lam
        self.n_total, self.p = n_total, p

    def loss_sums(self, thetas: np.ndarray, extra_local: np.ndarray | None = None
                  ) -> np.ndarray | None:
        """Per-agent loss sums (N, M) at the M models `thetas` (collective; learner gets them).

        `thetas` must have shape (M, p) on every rank (M known everywhere); its values are taken
        from the learner. `extra_local` (n_local, E) rides along (appended columns).
        """
        thetas = self.star.bcast(np.ascontiguousarray(thetas, dtype=np.float64))
        m = thetas.shape[0]
        e = 0 if extra_local is None else extra_local.shape[1]
        local = np.empty((len(self.shards), m + e))
        for j, sh in enumerate(self.shards):
            local[j, :m] = linear.loss_sum(self.loss, sh.X, sh.y, thetas)
            if e:
                local[j, m:] = extra_local[j]
        return self.star.gather_agents(local, (m + e,))

    def objective(self, thetas: np.ndarray, sums: np.ndarray) -> np.ndarray:
        """f(theta) = lam/2 ||theta||^2 + (1/n) sum of losses, summed over agents in order."""
        total = agent_order_sum(sums[:, : thetas.shape[0]])
        return 0.5 * self.lam * np.einsum("ij,ij->i", thetas, thetas) + total / self.n_total

    def evaluate(self, thetas: np.ndarray) -> np.ndarray | None:
        """f at each row of `thetas` (collective); the learner gets (M,), others None."""
        sums = self.loss_sums(thetas)
        return None if sums is None else self.objective(thetas, sums)

    # -- reference optimum ----------------------------------------------------------------
    def _fg_serve(self) -> None:
        """Owner side of the distributed value-and-gradient callback."""
        ctrl = np.zeros(1)
        theta = np.zeros((1, self.p))
        while True:
            self.star.bcast(ctrl)
            if ctrl[0] == 0:
                return
            self._fg_local(self.star.bcast(theta))

    def _fg_local(self, theta: np.ndarray) -> np.ndarray | None:
        local = np.empty((len(self.shards), 1 + self.p))
        for j, sh in enumerate(self.shards):
            local[j, 0] = linear.loss_sum(self.loss, sh.X, sh.y, theta)[0]
            local[j, 1:] = linear.grad_sum(self.loss, sh.X, sh.y, theta)[0]
        return self.star.gather_agents(local, (1 + self.p,))

    def _fg_learner(self, theta: np.ndarray) -> tuple[float, np.ndarray]:
        self.star.bcast(np.ones(1))
        th = self.star.bcast(np.ascontiguousarray(theta, dtype=np.float64).reshape(1, -1))
        g = self._fg_local(th)
        tot = agent_order_sum(g)
        f = 0.5 * self.lam * float(theta @ theta) + tot[0] / self.n_total
        return f, self.lam * theta + tot[1:] / self.n_total

    def _bounded_or_exact(self, theta_max: float, solver: str) -> np.ndarray | None:
        """scipy/petsc on the distributed value-and-gradient, or exact dual CD for the hinge."""
        if solver == "dual_cd":  # exact dual CD needs the records in one place (evaluation-only)
            parts = self.star.gather_objects([(sh.X, sh.y) for sh in self.shards])
            if parts is None:
                return None
            blocks = [x for part in parts for x, _ in part]
            X = (sp.vstack(blocks, format="csr") if any(sp.issparse(b) for b in blocks)
                 else np.concatenate(blocks))
            y = np.concatenate([y for part in parts for _, y in part])
            return reference.svm_dual_cd(X, y, self.lam)
        if self.star.is_learner:
            try:
                return reference.minimize_smooth(self._fg_learner, self.p, theta_max,
                                                 solver=solver)
            finally:
                self.star.bcast(np.zeros(1))
        self._fg_serve()
        return None

    def theta_star(self, theta_max: float, solver: str) -> tuple[np.ndarray, str]:
        """The minimiser of f over the box, on every rank (collective), and the solver used."""
        if solver == "auto":
            solver = {"squared": "closed", "logistic": "scipy", "hinge": "dual_cd"}[self.loss]
        if solver == "closed" and self.loss != "squared":
            raise JobError(f"reference.solver = 'closed' needs loss = 'squared', not {self.loss}")
        if self.loss == "hinge" and solver in ("scipy", "petsc"):
            raise JobError("reference.solver: the hinge loss is non-smooth; use 'auto' (exact "
                           "dual coordinate descent)")
        if solver == "closed":
            theta, solver = self._closed_then_maybe_bounded(theta_max)
        else:
            theta = self._bounded_or_exact(theta_max, solver)
        return self.star.bcast_object(theta), solver

    def _closed_then_maybe_bounded(self, theta_max: float) -> tuple[np.ndarray | None, str]:
        local = np.empty((len(self.shards), self.p * self.p + self.p))
        for j, sh in enumerate(self.shards):  # X^T X, X^T y (dense p x p also for CSR X), cached
            local[j, : self.p * self.p] = sh.squared_stats.gram.reshape(-1)
            local[j, self.p * self.p :] = sh.squared_stats.xty
        g = self.star.gather_agents(local, (self.p * self.p + self.p,))
        theta = None
        if g is not None:
            tot = agent_order_sum(g)
            theta = reference.ridge_closed_form(tot[: self.p * self.p].reshape(self.p, self.p),
                                                tot[self.p * self.p :], self.n_total, self.lam)
        binds = self.star.bcast_object(None if theta is None
                                       else bool(np.max(np.abs(theta)) > theta_max))
        if not binds:
            return theta, "closed"
        return self._bounded_or_exact(theta_max, "scipy"), "scipy"


def reference_quantities(oracle: Oracle, theta_max: float, solver: str) -> Reference | None:
    """theta*, f*, each owner's isolated optimum and its psi (collective; learner gets it)."""
    theta_star, used = oracle.theta_star(theta_max, solver)
    local_iso = np.zeros((len(oracle.shards), oracle.p))
    for j, sh in enumerate(oracle.shards):  # owners without records (not taking part): psi nan
        if sh.n:
            local_iso[j] = reference.theta_star_local(oracle.loss, sh.X, sh.y, oracle.lam,
                                                      theta_max)
    empty = oracle.star.gather_agents(np.array([[float(sh.n == 0)] for sh in oracle.shards]
                                               ).reshape(len(oracle.shards), 1), (1,))
    iso = oracle.star.gather_agents(local_iso, (oracle.p,))
    n_agents = oracle.star.layout.n_agents
    thetas = np.zeros((1 + n_agents, oracle.p))
    if iso is not None:
        thetas[0] = theta_star
        thetas[1:] = iso
    f = oracle.evaluate(thetas)
    if f is None:
        return None
    f_star = float(f[0])
    if not (math.isfinite(f_star) and f_star > 0):
        raise JobError(f"the reference objective f(theta*) = {f_star!r} is not positive: psi = "
                       "f/f* - 1 is undefined (is the data noiseless with lam = 0?)")
    psi_iso = np.where(empty[:, 0] > 0, np.nan, f[1:] / f_star - 1.0)
    return Reference(theta_star=theta_star, f_star=f_star, theta_isolated=iso,
                     psi_isolated=psi_iso, solver=used)


def cached_reference(cache: dict, star: Star, shards: list[LocalShard], loss: str, lam: float,
                     n: list[int], p: int, theta_max: float, solver: str) -> Reference | None:
    """reference_quantities for the sizes n, computed once per n vector of a sweep (collective)."""
    key = tuple(n)
    if key not in cache:
        oracle = Oracle(star, shards, loss, lam, int(sum(n)), p)
        cache[key] = reference_quantities(oracle, theta_max, solver)
    return cache[key]
