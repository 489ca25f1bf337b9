"""Baselines of seed 004 (spec §4): gossip ADMM (Algorithm 5 [R]) and the local-DP baseline [R].

* `gossip_admm`: the serial simulator of the asynchronous edge-based ADMM of Vanhaesebrouck
  et al. (2017), rescaled so its optimum is Theta* of objective (2). One iteration activates one
  edge: agent i (uniform) wakes and picks a neighbour j (uniform in N_i); both take K gradient
  steps on their reduced local objective, exchange 4 p-vectors, and update the edge's Z and duals.
* `local_dp_data` / `local_dp_models`: every agent perturbs its examples once (features clipped
  to [-B, B]^p plus Laplace noise, labels by randomised response) and trains its purely local
  model on them.

Pure NumPy/SciPy; all randomness comes from `mpi_dp.rng.stream`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import cast

import numpy as np
import scipy.sparse as sp

from mpi_dp.p2p import objective
from mpi_dp.p2p.reference import local_models_of, quad_terms
from mpi_dp.privacy import LaplaceEvent, PureEvent
from mpi_dp.rng import stream

#: agent index of the ADMM schedule stream `stream(seed, "schedule", ADMM_SCHEDULE_AGENT, run)`:
#: distinct from the CD replay schedule (agent 0), so the two baselines draw independent schedules.
ADMM_SCHEDULE_AGENT = 1
#: p-vectors exchanged per ADMM activation: u_i + Lam^ii/rho and v_ij + Lam^ij/rho both ways.
ADMM_VECTORS_PER_ACTIVATION = 4


def admm_rho_grid(W: sp.spmatrix | np.ndarray) -> np.ndarray:
    """The rho grid {0.1, 1, 10} x the mean positive W_ij (spec §4)."""
    w = cast(np.ndarray, W.data) if sp.issparse(W) else np.asarray(W).ravel()
    w = w[w > 0]
    return np.array([0.1, 1.0, 10.0]) * float(w.mean())


def admm_schedule(n: int, nbr_counts: np.ndarray, T: int, seed: int, run: int = 0
                  ) -> tuple[np.ndarray, np.ndarray]:
    """(i_t, k_t) for t < T: the waking agent (uniform over n) and the position of its partner
    among its neighbours (uniform over N_i, neighbours sorted by id)."""
    g = stream(seed, "schedule", ADMM_SCHEDULE_AGENT, run)
    agents = g.integers(0, n, size=T)
    pos = np.floor(g.random(T) * nbr_counts[agents]).astype(np.int64)
    return agents, pos


def _reverse_slots(W: sp.csr_matrix) -> np.ndarray:
    """rev[q] = CSR position of (j, i) for the entry q = (i, j) of a symmetric pattern."""
    P = sp.csr_matrix((np.arange(1, W.nnz + 1, dtype=np.float64), W.indices, W.indptr),
                      shape=W.shape)
    PT = sp.csr_matrix(P.T)
    PT.sort_indices()
    return PT.data.astype(np.int64) - 1


def gossip_admm(problem: objective.Problem, theta_loc: np.ndarray, rho: float, K: int, T: int,
                seed: int, record_every: int, on_record: Callable | None = None, run: int = 0
                ) -> tuple[np.ndarray, list[dict]]:
    """Run T activations of Algorithm 5 from Theta^loc; returns (u (n, p), records).

    State per directed slot (i, j) (CSR order of W): v_ij, i's copy Z_e^i of edge e = (i, j),
    and the duals Lam_e^{ii} (u_i = Z_e^i) and Lam_e^{ij} (v_ij = Z_e^j); Z_e^j is read from
    the reverse slot. Primal step at i: K gradient steps on
    sum_j om_ij/2 ||u - tgt_j||^2 + rho/2 sum_j ||u - own_j||^2 + mu D_ii c_i L_i(u) with step
    1/(sum_j om_ij + rho |N_i| + mu D_ii c_i L_loc_i), then v_ij = (W'_ij u + rho tgt_j)/(W'_ij + rho).

    A record {"iteration", "Q", "vectors_sent"} is taken every `record_every` activations
    (iteration 0 and T included); `on_record(t, u, vectors_sent)` may return a dict of extra
    fields (e.g. test accuracy) merged into it. Needs every agent's data."""
    n, p = problem.n, problem.p
    if rho <= 0 or K < 1 or T < 0 or record_every < 1:
        raise ValueError("need rho > 0, K >= 1, T >= 0 and record_every >= 1")
    W = problem.graph.W
    ptr, nbr = W.indptr, W.indices
    rev = _reverse_slots(W)
    wh = W.data / 2.0  # W'_ij
    om = wh * rho / (wh + rho)
    counts = np.diff(ptr)
    mdc = problem.mu * problem.deg * problem.conf
    lin = np.add.reduceat(om, ptr[:-1]) + rho * counts  # the quadratic part's curvature
    step = 1.0 / (lin + mdc * problem.L_loc)
    theta_loc = np.asarray(theta_loc, dtype=np.float64)
    if theta_loc.shape != (n, p):
        raise ValueError(f"theta_loc must be ({n}, {p}), got {theta_loc.shape}")
    quad = problem.loss == "quadratic"
    AB = [quad_terms(problem.X[i], problem.y[i], float(problem.lam[i])) for i in range(n)] \
        if quad else None

    u = theta_loc.copy()
    rows = np.repeat(np.arange(n), counts)
    v = theta_loc[nbr].copy()  # v_ij = theta_j^loc
    z = theta_loc[rows].copy()  # Z_e^i = theta_i^loc
    lam_own = np.zeros_like(z)  # Lam_e^{ii}
    lam_nbr = np.zeros_like(z)  # Lam_e^{ij}

    def primal(i: int) -> None:
        sl = slice(ptr[i], ptr[i + 1])
        tgt = z[rev[sl]] - lam_nbr[sl] / rho
        own = z[sl] - lam_own[sl] / rho
        c = om[sl] @ tgt + rho * own.sum(axis=0)
        ui = u[i]
        for _ in range(K):
            if AB is not None:  # quad
                gl = AB[i][0] @ ui - AB[i][1]
            else:
                gl = problem.grad(i, ui[None])[0]
            ui = ui - step[i] * (lin[i] * ui - c + mdc[i] * gl)
        u[i] = ui
        w = wh[sl, None]
        v[sl] = (w * ui + rho * tgt) / (w + rho)

    def record(t: int, sent: int) -> None:
        rec = {"iteration": t, "Q": float(problem.objective(u[None])[0]), "vectors_sent": sent}
        if on_record is not None:
            rec.update(on_record(t, u, sent) or {})
        records.append(rec)

    records: list[dict] = []
    agents, pos = admm_schedule(n, counts, T, seed, run)
    sent = 0
    record(0, 0)
    for t in range(T):
        i = int(agents[t])
        q = int(ptr[i] + pos[t])
        j = int(nbr[q])
        r = int(rev[q])
        primal(i)
        primal(j)
        sent += ADMM_VECTORS_PER_ACTIVATION  # u_i + Lam^ii/rho, v_ij + Lam^ij/rho, and for j
        zi = 0.5 * (u[i] + v[r]) + (lam_own[q] + lam_nbr[r]) / (2.0 * rho)
        zj = 0.5 * (u[j] + v[q]) + (lam_own[r] + lam_nbr[q]) / (2.0 * rho)
        z[q], z[r] = zi, zj
        lam_own[q] += rho * (u[i] - zi)
        lam_nbr[r] += rho * (v[r] - zi)
        lam_own[r] += rho * (u[j] - zj)
        lam_nbr[q] += rho * (v[q] - zj)
        if (t + 1) % record_every == 0 or t + 1 == T:
            record(t + 1, sent)
    return u, records


# ---------------------------------------------------------------------------------------------
# local DP baseline


def local_dp_events(eps: float, B: float, p: int, eps_split: float = 0.5) -> list:
    """The events of one agent's local-DP release (`local_dp_data`): the features' Laplace
    (L1 sensitivity 2 B p, scale 2 B p / eps_x) and the labels' randomised response (eps_y).
    Each example is released once, so replacing one example changes one release: they are
    charged once per agent and run, not per example. Public: fixed before any record is read."""
    eps_x, eps_y = _local_dp_split(eps, B, eps_split)
    sens = 2.0 * B * p
    return [LaplaceEvent(l1_sensitivity=sens, scale=sens / eps_x),
            PureEvent(eps_y, "randomized_response")]


def _local_dp_split(eps: float, B: float, eps_split: float) -> tuple[float, float]:
    if not 0.0 < eps_split <= 1.0 or not eps > 0 or not B > 0:
        raise ValueError("need eps > 0, B > 0 and 0 < eps_split <= 1")
    eps_x = eps * eps_split
    eps_y = eps - eps_x if math.isfinite(eps) else (math.inf if eps_split < 1 else 0.0)
    return eps_x, eps_y


def local_dp_data(X: np.ndarray, y: np.ndarray, eps: float, B: float, g: np.random.Generator,
                  eps_split: float = 0.5) -> tuple[np.ndarray, np.ndarray]:
    """One agent's examples perturbed once: (X', y').

    Features: clip to [-B, B]^p, then Laplace(0, 2 B p / eps_x) on every coordinate (one point
    moves by at most 2 B p in L1). Labels (must be -1/+1): randomised response, kept with
    probability e^eps_y / (1 + e^eps_y). eps_x = eps_split * eps and eps_y = eps - eps_x.
    Noise from `g` (the agent's stream (seed, 'local_dp', agent, run)): features first, then
    labels. The events (`local_dp_events`) are charged by the caller's release path first."""
    eps_x, eps_y = _local_dp_split(eps, B, eps_split)
    y = np.asarray(y, dtype=np.float64)
    if y.size and not np.all(np.abs(y) == 1.0):
        raise ValueError("the local-DP baseline perturbs -1/+1 labels; it does not apply to "
                         "regression targets")
    X = np.asarray(X, dtype=np.float64)
    p = X.shape[1]
    sens = 2.0 * B * p
    scale = sens / eps_x
    Xp = np.clip(X, -B, B) + g.laplace(0.0, scale, size=X.shape) if scale > 0 \
        else np.clip(X, -B, B)
    keep = 1.0 / (1.0 + math.exp(-eps_y))  # e^eps_y / (1 + e^eps_y), stable for eps_y = inf
    yp = np.where(g.random(y.shape[0]) < keep, y, -y)
    return Xp, yp


def local_dp_models(problem: objective.Problem, eps: float, B: float, seed: int, run: int = 0,
                    eps_split: float = 0.5) -> tuple[np.ndarray, list, list, list]:
    """Local-DP baseline for the hosted agents: (models (n, p) trained purely locally on the
    perturbed data, NaN rows where not hosted; X' list; y' list; events per agent)."""
    Xs: list = [None] * problem.n
    ys: list = [None] * problem.n
    events: list = [None] * problem.n
    for i in range(problem.n):
        if problem.X[i] is not None:
            events[i] = local_dp_events(eps, B, problem.p, eps_split)
            Xs[i], ys[i] = local_dp_data(problem.X[i], problem.y[i], eps, B,
                                         stream(seed, "local_dp", i, run), eps_split)
    models = local_models_of(problem.loss, Xs, ys, problem.lam, problem.p)
    return models, Xs, ys, events
