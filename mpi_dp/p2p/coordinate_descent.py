"""Personalised private peer-to-peer coordinate descent (seed 004), as the paper's agents run it.

Algorithm 1 / 2 of agent i, on each tick of its clock (eq. 4; private: eq. 6):

    read the latest Theta_j of every neighbour j                      (its mailbox)
    g = (1/m_i) sum_k clip_C(grad l(Theta_i; x_ik, y_ik)) + 2 lam_i Theta_i
    eta ~ Laplace(0, s_i(k))^p,   s_i(k) = 2 L0 / (e_k m_i)          (Theorem 1)
    Theta_i <- (1 - a_i) Theta_i + a_i (sum_j W_ij/D_ii Theta_j - mu c_i (g + eta))
    broadcast Theta_i to N_i                                          (|N_i| vectors)

and stops after T_i wake-ups. The agent's state is the noisy iterate; it keeps no clean copy.
The per-release budgets e_k come from the configuration's privacy contract (privacy.contract):
each peer's noise answers `release_budgets` (equal budgets calibrated so that the T_i releases,
a private warm start and the other candidates of a private selection meet the peer's (eps,
delta); or the paper's Algorithm 3). Every release goes through the peer's release path
(privacy.release: its ledger charged, its reserved noise taken, the tap shown). Models carry a
runs axis (R, p): runs differ only in their noise (the schedule is the job's).

Execution: `simulate` runs the global schedule tick by tick in one process (the reference);
`replay` runs the same schedule cut into conflict-free rounds on any `Net` (comm.rma mailboxes
under MPI), a round's hosted wake-ups as one batch (`Block.wake_many`), equal to `simulate` bit
for bit; `live` runs per-agent Poisson clocks in wall time and logs what every update read, and
`replay_log` re-executes such a log exactly.
"""

from __future__ import annotations

import dataclasses
import heapq
import math
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, Protocol

import numpy as np

from ..agent_graph import Graph
from ..backend import backend
from ..privacy import Ledger, PureEvent, kairouz
from ..privacy.contract import Contract, Share
from ..privacy.release import OwnerRelease
from ..rng import stream
from . import objective
from .grad_scratch import GradScratch

MODES = ("sound", "faithful")
INITS = ("zero", "local", "private_ws")
#: numbers per padded (agents x neighbours x R p) block of a round's neighbour mix (2 MiB)
MIX_ELEMS = 2**18


@dataclasses.dataclass(frozen=True)
class Settings:
    """Knobs of one configuration (the names of the spec)."""

    T: int  # global ticks of the merged clock
    T_agent: tuple[int, ...] | None  # per-agent cap on wake-ups (None: no cap)
    eps: float  # eps_bar of every agent's CD releases (inf: non-private)
    delta: float  # delta_bar of Theorem 1
    allocation: str = "equal"
    mode: str = "sound"  # sound: clip per-example gradients (L1) at clip; faithful: L0 = 1, no clip
    clip: float = 1.0  # C_clip = L0 in sound mode
    init: str = "zero"
    eps_ws: float = 0.05  # warm start output perturbation (init = private_ws)
    lam_ws: tuple[float, ...] | None = None  # L2 weight of the warm start's local models
    mu_ws: float | None = None
    row_norm: float = 1.0  # public bound on ||x||_2 (warm-start sensitivity)
    runs: tuple[int, ...] = (0,)
    seed: int = 0
    record_every: int = 0  # ticks between records (0: only the end)
    backend: str = "numpy"  # array backend of the peers' gradients (mpi_dp.backend)
    #: a private selection (p2p.select): the validation score each agent releases at the end
    #: (0: none; its plan spans every candidate: Block's release paths take their share)
    score_releases: int = 0

    @property
    def R(self) -> int:
        return len(self.runs)

    @property
    def private(self) -> bool:
        return math.isfinite(self.eps)

    @property
    def L0(self) -> float:
        return self.clip if self.mode == "sound" else 1.0

    @property
    def certified(self) -> bool:
        return self.mode == "sound" or not self.private



def global_schedule(seed: int, n: int, T: int) -> np.ndarray:
    """i_0..i_{T-1} i.i.d. uniform: the jump chain of n rate-1 Poisson clocks."""
    return stream(seed, "schedule", 0, 0).integers(0, n, size=T, dtype=np.int64)


def effective_ticks(schedule: np.ndarray, n: int, T_agent: Sequence[int] | None) -> np.ndarray:
    """Positions of the ticks that run (an agent's ticks after its T_i-th wake-up are dropped)."""
    if T_agent is None:
        return np.arange(len(schedule))
    cap = np.asarray(T_agent)
    order = np.argsort(schedule, kind="stable")
    rank_in_agent = np.empty(len(schedule), dtype=np.int64)
    counts = np.bincount(schedule, minlength=n)
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    rank_in_agent[order] = np.arange(len(schedule)) - np.repeat(starts, counts)
    return np.flatnonzero(rank_in_agent < cap[schedule])


def wakeups(schedule: np.ndarray, n: int, T_agent: Sequence[int] | None) -> np.ndarray:
    """Wake-ups each agent actually performs."""
    return np.bincount(schedule[effective_ticks(schedule, n, T_agent)], minlength=n)


@dataclasses.dataclass(frozen=True)
class Rounds:
    """Replay rounds: `agents` in execution order, round r = agents[starts[r]:starts[r + 1]]
    (pairwise distinct and non-adjacent), and record_at[r] = the global tick after which to
    record once round r is done (-1: no record)."""

    agents: np.ndarray
    starts: np.ndarray
    record_at: np.ndarray

    @property
    def count(self) -> int:
        return len(self.starts) - 1


def cut_rounds(schedule: np.ndarray, keep: np.ndarray, graph: Graph, record_every: int,
               packing: str = "levels") -> Rounds:
    """Conflict-free rounds of the kept ticks, records at every multiple of record_every (the
    ticks between two records are a segment; no round spans two).

    packing "greedy" (spec §6 as written): a round ends before the first tick whose agent is in
    it or adjacent to one in it. "levels" (default): within a segment, wake-up u of agent i runs
    in round 1 + max(round of the previous wake-up of i or of any neighbour of i), the fewest
    rounds the dependencies allow. Both equal serial execution bit for bit: u reads exactly the
    neighbour versions the serial schedule gives it, since every earlier wake-up of a neighbour
    is in an earlier round and every later one in a later round."""
    if packing not in ("levels", "greedy"):
        raise ValueError(f"packing must be 'levels' or 'greedy', got {packing!r}")
    agents = schedule[keep]
    ticks = np.asarray(keep)
    seg = ticks // record_every if record_every else np.zeros(len(ticks), dtype=np.int64)
    indptr, indices = graph.W.indptr, graph.W.indices
    level = np.empty(len(agents), dtype=np.int64)  # global round index of every kept step
    base = 0  # first round of the current segment
    if packing == "greedy":
        blocked: set[int] = set()
        r = -1
        for pos, i in enumerate(agents.tolist()):
            if pos == 0 or i in blocked or seg[pos] != seg[pos - 1]:
                r += 1
                blocked = set()
            blocked.add(i)
            blocked.update(indices[indptr[i]:indptr[i + 1]].tolist())
            level[pos] = r
    else:
        # round of each agent's latest wake-up (this segment); a wake-up reads its neighbours'
        # entries in one vectorised max (no per-agent Python lists: 10^4 agents of degree 10^3)
        last = np.full(graph.W.shape[0], -1, dtype=np.int64)
        top = -1
        for pos, i in enumerate(agents.tolist()):
            if pos > 0 and seg[pos] != seg[pos - 1]:
                base = top + 1
                last.fill(-1)
            lv = max(int(last[i]), int(last[indices[indptr[i]:indptr[i + 1]]].max(initial=-1)))
            lv = base if lv < 0 else lv + 1
            last[i] = lv
            level[pos] = lv
            top = max(top, lv)
    order = np.argsort(level, kind="stable")
    n_rounds = int(level.max()) + 1 if len(level) else 0
    starts = np.searchsorted(level[order], np.arange(n_rounds + 1)).astype(np.int64)
    record_at = np.full(n_rounds, -1, dtype=np.int64)
    if record_every and len(agents):
        firsts = np.flatnonzero(np.r_[True, seg[1:] != seg[:-1]])  # segments are contiguous
        ends = np.r_[firsts[1:], len(agents)] - 1
        record_at[np.maximum.reduceat(level, firsts)] = ticks[ends] + 1
    return Rounds(agents[order], starts, record_at)


def agent_budgets(s: Settings, problem: objective.Problem, schedule: np.ndarray,
                  contract: Contract) -> list[np.ndarray]:
    """e_1..e_{T_i} of every agent, as its noise in the contract gives them (equal under an
    accounted rule; Algorithm 3 under the paper's): the agent's wake-up count is known from the
    replayed schedule; with a cap T_i the split is over T_i (what the agent plans for); the
    Proposition-2 splits read the agent's steps in the kept schedule and kappa."""
    n = problem.n
    plan = np.asarray(s.T_agent) if s.T_agent is not None else wakeups(schedule, n, None)
    kept = schedule[effective_ticks(schedule, n, s.T_agent)]
    order = np.argsort(kept, kind="stable")  # every agent's steps in one pass
    bounds = np.searchsorted(kept[order], np.arange(n + 1))
    kappa = problem.kappa if s.allocation.startswith("prop2") else None
    out = []
    for i in range(n):
        noise = contract.noise(i)
        if noise is None:
            out.append(np.full(int(plan[i]), math.inf))
            continue
        out.append(noise.release_budgets(int(plan[i]), steps=order[bounds[i]:bounds[i + 1]],
                                         horizon=len(kept), kappa=kappa))
    return out


def laplace_scale(L0: float, e: float, m_i: int) -> float:
    """s_i = 2 L0 / (e m_i) (Theorem 1); 0 at e = inf (no noise). An e whose product with m_i
    overflows (e near the largest float) divides twice instead, so s_i stays positive."""
    if math.isinf(e):
        return 0.0
    den = float(e) * m_i  # a Python float: inf on overflow, no warning
    return 2.0 * L0 / den if math.isfinite(den) else 2.0 * L0 / float(e) / m_i


def release_paths(contract: Contract, agents: np.ndarray, s: Settings,
                  releases: dict[int, int]) -> dict[int, OwnerRelease]:
    """The hosted agents' release paths in `contract`: certified in sound mode, clipped at L0;
    each takes its share of a plan that spans a private selection's candidates (its own
    `releases[i]` wake-ups or T_i, its validation score, its warm start)."""
    ws = (warm_start_event(s.eps_ws),) if s.init == "private_ws" else ()
    out = {}
    for i in (int(a) for a in agents):
        cap = int(s.T_agent[i]) if s.T_agent is not None else releases[i]
        out[i] = contract.owner(i, certified=s.certified,
                                clip=s.L0 if s.mode == "sound" else math.inf,
                                share=Share(cap + s.score_releases, ws))
    return out


# -- private warm start (Algorithm 4) -------------------------------------------------------
def l2_laplace(p: int, scale: float, g: np.random.Generator) -> np.ndarray:
    """b with density proportional to exp(-||b||_2 / scale): a uniform direction times a
    Gamma(p, scale) norm."""
    d = g.standard_normal(p)
    return d / np.linalg.norm(d) * g.gamma(p, scale)


def warm_start_sensitivity(row_norm: float, m_i: int, lam_ws: float) -> float:
    """Delta_2 = L0_2 / (m_i lam_ws) of the local minimiser (logistic: L0_2 = max ||x||_2)."""
    return row_norm / (m_i * lam_ws)


# -- the agents of one process --------------------------------------------------------------
class Net(Protocol):
    """Where released models go (comm.rma.Mailboxes under MPI, LocalNet in one process)."""

    def read(self, i: int, out_models: np.ndarray | None = None
             ) -> tuple[np.ndarray, np.ndarray]: ...

    def post(self, j: int, stamp: float, vec: np.ndarray) -> None: ...


class LocalNet:
    """All agents in one process: the latest broadcast of every agent, visible at once."""

    def __init__(self, n: int, item: int, graph: Graph) -> None:
        self.models = np.zeros((n, item))
        self.stamps = np.full(n, -1.0)
        self.graph = graph
        self.puts = 0

    def read(self, i: int, out_models: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        nb = self.graph.nbrs(i)
        return self.stamps[nb].copy(), self.models[nb]

    def post(self, j: int, stamp: float, vec: np.ndarray) -> None:
        self.models[j] = vec.ravel()
        self.stamps[j] = stamp
        self.puts += len(self.graph.nbrs(j))


class Block:
    """The agents hosted here: their data, noisy states, noise streams and ledgers."""

    def __init__(self, problem: objective.Problem, agents: np.ndarray, s: Settings,
                 contract: Contract, budgets: list[np.ndarray], theta0: dict[int, np.ndarray],
                 release: dict[int, OwnerRelease] | None = None) -> None:
        self.P, self.s, self.agents = problem, s, np.asarray(agents, dtype=np.int64)
        R, p = s.R, problem.p
        self.theta = {int(i): np.array(theta0[int(i)], dtype=np.float64).reshape(R, p)
                      for i in self.agents}
        self.k = {int(i): 0 for i in self.agents}
        self.budgets = {int(i): budgets[int(i)] for i in self.agents}
        self.scales = {int(i): np.array([laplace_scale(s.L0, e, int(problem.m[i]))
                                         for e in budgets[int(i)]]) for i in self.agents}
        self.sens = {int(i): 2.0 * s.L0 / int(problem.m[i]) for i in self.agents}
        self.xnorm = {int(i): np.abs(problem.X[int(i)]).sum(axis=1) for i in self.agents
                      if problem.X[int(i)] is not None}
        self.clipped = {int(i): np.zeros(R) for i in self.agents}
        self.release = release if release is not None else release_paths(
            contract, self.agents, s, {int(i): len(budgets[int(i)]) for i in self.agents})
        if s.private:  # every peer's noise, drawn ahead from its streams, taken after charges
            contract.reserve_laplace(self.release, {int(i): len(budgets[int(i)])
                                                    for i in self.agents}, p)
        self._nbuf = np.empty((0, R * p))
        self._rbuf = np.empty((0, R * p))
        # per hosted agent: its mixing weights W_ij / D_ii (wake's), and whether its gradient
        # goes through the stacked kernel (wake_many)
        self._w = {int(i): problem.graph.nbr_weights(int(i)) / problem.deg[int(i)]
                   for i in self.agents}
        self._stacked = {int(i): objective.stackable(problem.X[int(i)], problem.y[int(i)])
                         and int(i) in self.xnorm for i in self.agents}
        # on a device backend: the dense peers' records there, moved once (CSR ones: host)
        bk = backend(s.backend)
        self._dev = {} if bk.is_numpy else {
            i: (bk.asarray(problem.X[i], dtype=bk.xp.float64),
                bk.asarray(problem.y[i], dtype=bk.xp.float64), bk.asarray(self.xnorm[i]))
            for i in map(int, self.agents) if isinstance(problem.X[i], np.ndarray)
            and problem.X[i].shape[0] > 0 and i in self.xnorm}
        if self._dev:
            self._stacked = {i: False for i in self._stacked}
        self._scratch = GradScratch()  # `_grad`'s reused arrays (the same numbers)
        #: gradients computed ahead (`prepare`): agent -> (its version k, gradient, clipped)
        self._ahead: dict[int, tuple[int, np.ndarray, np.ndarray]] = {}

    @property
    def ledgers(self) -> Mapping[int, Ledger]:
        """Every hosted agent's ledger by id: a live view (O(1) to make, as each lookup)."""
        return _Ledgers(self.release)

    def nbr_buffer(self, i: int) -> np.ndarray:
        """Scratch (|N_i|, R p) for mailbox reads: rows of one buffer shared by the hosted agents
        (a wake-up is done with it before the next read), as large as the largest degree read."""
        deg = len(self.P.graph.nbrs(i))
        if self._nbuf.shape[0] < deg:
            self._nbuf = np.empty((deg, self.s.R * self.P.p))
        return self._nbuf[:deg]

    def wake(self, i: int, nbr_models: np.ndarray) -> np.ndarray:
        """Agent i's update (eq. 4 / eq. 6) from its neighbours' models (|N_i|, R p), in
        neighbour-id order; returns its new state (R, p), the vector it broadcasts."""
        P, s = self.P, self.s
        k = self.k[i]
        th = self.theta[i]
        clip = s.clip if (s.mode == "sound" and s.private) else math.inf
        got = self._take(i)
        g, frac = got if got is not None else self._grad(i, th, clip)
        # the release: the ledger charged, the noise taken (none at eps = inf), the tap shown
        g, _ = self.release[i].add_reserved(g, self.sens[i],
                                            self.scales[i][k] if s.private else 0.0)
        if s.private:
            self.clipped[i] += frac
        nb = nbr_models.reshape(-1, s.R, P.p)
        w = P.graph.nbr_weights(i) / P.deg[i]
        mixed = (w[:, None, None] * nb).sum(axis=0)  # fixed order, no BLAS: bitwise everywhere
        a = P.alpha[i]
        new = (1.0 - a) * th + a * (mixed - (P.mu * P.conf[i]) * g)
        # the audit saw the mechanism's output g: the broadcast is (1 - a) theta_i + a (mixed -
        # mu c_i g) with theta_i and the neighbours' models already public, a function of g
        self.theta[i] = new
        self.k[i] = k + 1
        return new

    def round_buffer(self, rows: int) -> np.ndarray:
        """Scratch (rows, R p) for the neighbour models of a round's hosted agents, one agent's
        rows after another (`wake_many` reads it before the next round's reads)."""
        if self._rbuf.shape[0] < rows:
            self._rbuf = np.empty((max(rows, 2 * self._rbuf.shape[0]), self.s.R * self.P.p))
        return self._rbuf[:rows]

    def wake_many(self, ids: Sequence[int], nbr_models: np.ndarray) -> np.ndarray:
        """`wake` of distinct agents `ids` that read nothing the others write (a replay round):
        nbr_models holds agent ids[0]'s neighbours' models (|N_i|, R p) in neighbour-id order,
        then ids[1]'s, ... Returns their new states (A, R, p), the vectors they broadcast.

        Every agent's numbers are its `wake`'s bit for bit, whatever else is in the batch: its
        gradient from objective.local_grads (its own GEMMs; `local_grad` alone where its
        records do not stack), its mix summed over its own neighbours in order (`_mix`), the
        rest elementwise with its own scalars. Then, agent by agent in `ids` order, as `wake`:
        the ledger is charged (a refusal raises with the agents before it done, the others
        untouched), the state, k and clipped share change and the audit sees the release."""
        P, s = self.P, self.s
        ids = [int(i) for i in ids]
        A, R, p = len(ids), s.R, P.p
        if A == 0:
            return np.zeros((0, R, p))
        if A == 1:  # nothing to batch
            return self.wake(ids[0], nbr_models)[None]
        if len(set(ids)) != A:
            raise ValueError("wake_many wakes distinct agents")
        ks = [self.k[i] for i in ids]
        th = [self.theta[i] for i in ids]
        clip = s.clip if (s.mode == "sound" and s.private) else math.inf
        g, frac = self._grads(ids, th, clip)
        # agent by agent, as `wake`: the ledger charged (a refusal raises with the agents
        # before it charged), the noise taken, the tap shown the release
        for pos, (i, k) in enumerate(zip(ids, ks, strict=True)):
            g[pos], _ = self.release[i].add_reserved(g[pos], self.sens[i],
                                                     self.scales[i][k] if s.private else 0.0)
        mixed = self._mix(ids, nbr_models)
        idx = np.asarray(ids, dtype=np.int64)
        a = P.alpha[idx][:, None, None]
        new = (1.0 - a) * np.stack(th) + a * (mixed - (P.mu * P.conf[idx])[:, None, None] * g)
        for pos, i in enumerate(ids):
            if s.private:
                self.clipped[i] += frac[pos]
            self.theta[i] = new[pos].copy()
            self.k[i] = ks[pos] + 1
        return new

    def prepare(self, i: int) -> None:
        """Compute agent i's next gradient now, at its current state (`wake` takes it while the
        state is unchanged): the gradient reads only the agent's own state and records, so a
        replay computes it while this rank waits for the others. Nothing is released."""
        got = self._ahead.get(i)
        if got is not None and got[0] == self.k[i]:
            return
        s = self.s
        clip = s.clip if (s.mode == "sound" and s.private) else math.inf
        g, frac = self._grad(i, self.theta[i], clip)
        self._ahead[i] = (self.k[i], g, frac)

    def _take(self, i: int) -> tuple[np.ndarray, np.ndarray] | None:
        """Agent i's gradient computed ahead at its current state (removed), or None."""
        got = self._ahead.pop(i, None) if self._ahead else None
        if got is None or got[0] != self.k[i]:
            return None
        return got[1], got[2]

    def _grads(self, ids: list[int], th: list[np.ndarray], clip: float
               ) -> tuple[np.ndarray, np.ndarray]:
        """(A, R, p) gradients and (A, R) clipped fractions of `ids` at th, each `local_grad`'s:
        those computed ahead (`prepare`) as they are, the other stackable agents in one
        objective.local_grads, the rest one at a time."""
        ahead = [self._take(i) for i in ids] if self._ahead else []
        if any(x is not None for x in ahead):
            g = np.empty((len(ids), self.s.R, self.P.p))
            frac = np.empty((len(ids), self.s.R))
            rest = [pos for pos, x in enumerate(ahead) if x is None]
            for pos, x in enumerate(ahead):
                if x is not None:
                    g[pos], frac[pos] = x
            if rest:
                g[rest], frac[rest] = self._grads_now([ids[pos] for pos in rest],
                                                      [th[pos] for pos in rest], clip)
            return g, frac
        return self._grads_now(ids, th, clip)

    def _grads_now(self, ids: list[int], th: list[np.ndarray], clip: float
                   ) -> tuple[np.ndarray, np.ndarray]:
        """`_grads` computed here: the stackable agents in one objective.local_grads, the
        others one at a time."""
        P = self.P
        one = [pos for pos, i in enumerate(ids) if not self._stacked[i]]
        if not one:
            return objective.local_grads(P.loss, [P.X[i] for i in ids], [P.y[i] for i in ids],
                                         P.lam[np.asarray(ids, dtype=np.int64)], th, clip,
                                         [self.xnorm[i] for i in ids])
        g = np.empty((len(ids), self.s.R, P.p))
        frac = np.empty((len(ids), self.s.R))
        many = [pos for pos, i in enumerate(ids) if self._stacked[i]]
        if many:
            sel = [ids[pos] for pos in many]
            g[many], frac[many] = objective.local_grads(
                P.loss, [P.X[i] for i in sel], [P.y[i] for i in sel],
                P.lam[np.asarray(sel, dtype=np.int64)], [th[pos] for pos in many], clip,
                [self.xnorm[i] for i in sel])
        for pos in one:
            g[pos], frac[pos] = self._grad(ids[pos], th[pos], clip)
        return g, frac

    def _grad(self, i: int, th: np.ndarray, clip: float) -> tuple[np.ndarray, np.ndarray]:
        """Agent i's `local_grad` at th alone: on the device where its records are there."""
        P = self.P
        dev = self._dev.get(i)
        if dev is not None:
            return objective.local_grad(P.loss, *dev[:2], float(P.lam[i]), th, clip, dev[2])
        return self._scratch.local_grad(P.loss, P.X[i], P.y[i], float(P.lam[i]), th, clip,
                                        self.xnorm.get(i))

    def _mix(self, ids: list[int], nbr_models: np.ndarray) -> np.ndarray:
        """sum_j W_ij / D_ii Theta_j (A, R, p) of `ids` from their neighbours' rows, each agent's
        `wake` sum bit for bit: its products added one neighbour at a time from +0.0, in order
        (NumPy's sum over the outer axis), in padded (agents, neighbours, R p) blocks where the
        shorter agents' padding adds -0.0, which leaves every sum as it is. With R p = 1 (NumPy
        sums a lone axis pairwise) each agent sums alone, as `wake`."""
        R, p = self.s.R, self.P.p
        K = R * p
        w = [self._w[i] for i in ids]
        deg = np.array([len(x) for x in w], dtype=np.int64)
        ends = np.cumsum(deg)
        if nbr_models.shape != (int(ends[-1]), K):
            raise ValueError(f"nbr_models must be ({int(ends[-1])}, {K}) rows of the agents' "
                             f"neighbours, got {nbr_models.shape}")
        A = len(ids)
        out = np.empty((A, K))
        if K == 1:
            for a in range(A):
                nb = nbr_models[ends[a] - deg[a]:ends[a]].reshape(-1, R, p)
                out[a] = (w[a][:, None, None] * nb).sum(axis=0).ravel()
            return out.reshape(A, R, p)
        prod = np.concatenate(w)[:, None] * nbr_models
        a = 0
        while a < A:  # blocks of consecutive agents within MIX_ELEMS (at least one agent)
            b, top = a + 1, int(deg[a])
            while b < A and (b + 1 - a) * max(top, int(deg[b])) * K <= MIX_ELEMS:
                top = max(top, int(deg[b]))
                b += 1
            pad = np.full((b - a, top, K), -0.0)
            pad[np.arange(top) < deg[a:b, None]] = prod[ends[a] - deg[a]:ends[b - 1]]
            out[a:b] = pad.sum(axis=1)
            a = b
        return out.reshape(A, R, p)

    def release_score(self, i: int, score: np.ndarray, sensitivity: float) -> np.ndarray:
        """Agent i's validation score (R,) of a private selection, released with Laplace noise
        of the calibrated multiplier x `sensitivity` (charged first; stream 'val_score')."""
        if not self.s.private:
            return np.asarray(score, dtype=np.float64)
        out, _ = self.release[i].add_laplace(np.asarray(score, dtype=np.float64).reshape(-1, 1),
                                             sensitivity, purpose="val_score")
        return out[:, 0]

    def done(self, i: int) -> bool:
        cap = self.s.T_agent
        return cap is not None and self.k[i] >= cap[i]

    def clip_fraction(self, i: int) -> np.ndarray:
        return self.clipped[i] / max(1, self.k[i])

    def state(self) -> dict[int, dict[str, Any]]:
        """What `wake` changes, per hosted agent by id (a checkpoint; the noise is drawn up front
        and read at index k, so k is also its stream position)."""
        return {i: {"theta": self.theta[i], "k": self.k[i], "clipped": self.clipped[i],
                    "ledger": self.release[i].ledger} for i in self.agents.tolist()}

    def restore(self, states: dict[int, dict[str, Any]]) -> None:
        """Continue the hosted agents from `state()` of any layout (keyed by agent id)."""
        self._ahead.clear()
        for i in self.agents.tolist():
            st = states[i]
            self.theta[i], self.k[i] = np.array(st["theta"], dtype=np.float64), int(st["k"])
            self.clipped[i], self.release[i].ledger = np.array(st["clipped"]), st["ledger"]
            if self.s.private:  # the reserved noise is read at index k
                self.release[i].served = self.k[i]


class _Ledgers(Mapping):
    """A block's ledgers by agent id, read through its release paths (a restore rebinds)."""

    def __init__(self, release: dict[int, OwnerRelease]) -> None:
        self._release = release

    def __getitem__(self, i: int) -> Ledger:
        return self._release[i].ledger

    def __iter__(self) -> Iterator[int]:
        return iter(self._release)

    def __len__(self) -> int:
        return len(self._release)


# -- drivers --------------------------------------------------------------------------------
def post_initial(block: Block, net: Any) -> None:
    """Post every hosted agent's state stamped with its version k (0 at the start; a restored
    block re-posts exactly what its neighbours' mailboxes held)."""
    for i in block.agents.tolist():
        net.post(i, float(block.k[i]), block.theta[i])


def simulate(problem: objective.Problem, s: Settings, contract: Contract, theta0: np.ndarray,
             on_record: Callable[[int, np.ndarray, Block], None] | None = None
             ) -> tuple[np.ndarray, Block, LocalNet]:
    """The reference: every agent in this process, the schedule tick by tick.
    theta0 (R, n, p) or (n, p). Returns (Theta (R, n, p), block, net)."""
    n, R, p = problem.n, s.R, problem.p
    th0 = np.broadcast_to(theta0, (R, n, p))
    schedule = global_schedule(s.seed, n, s.T)
    block = Block(problem, np.arange(n), s, contract,
                  agent_budgets(s, problem, schedule, contract),
                  {i: th0[:, i, :] for i in range(n)})
    net = LocalNet(n, R * p, problem.graph)
    post_initial(block, net)
    keep = effective_ticks(schedule, n, s.T_agent)
    for pos, t in enumerate(keep.tolist()):
        i = int(schedule[t])
        _, nb = net.read(i)
        net.post(i, float(block.k[i] + 1), block.wake(i, nb))
        if on_record is not None and s.record_every and (
                pos + 1 == len(keep) or keep[pos + 1] // s.record_every != t // s.record_every):
            on_record(int(t) + 1, current(block, n), block)
    return current(block, n), block, net


def current(block: Block, n: int) -> np.ndarray:
    """(R, n, p) of the hosted agents' states (others NaN)."""
    R, p = block.s.R, block.P.p
    out = np.full((R, n, p), np.nan)
    for i in block.agents:
        out[:, int(i), :] = block.theta[int(i)]
    return out


def replay(block: Block, net: Any, rounds: Rounds, barrier: Callable[[], None],
           on_record: Callable[[int], None] | None = None,
           progress: Callable[[int], object] | None = None,
           checkpoint: Callable[[int], None] | None = None, start: int = 0,
           ibarrier: Callable[[], Any] | None = None) -> int:
    """The schedule in conflict-free rounds: the hosted agents of a round read (all of them
    first), update as one batch (`Block.wake_many`) and post, then every rank waits at the
    barrier; records where the rounds say, each followed by `checkpoint(r)`. Runs rounds
    `start`.. (a resumed replay: the round after its checkpoint's). Returns wake-ups run.

    `ibarrier` (a nonblocking barrier: returns a request with Test and Wait, e.g. comm.Ibarrier)
    instead of `barrier`: while it is pending, the rank computes the next gradient of its
    agents (`Block.prepare`, the soonest next wake-up first), which reads only the agent's own
    state; so a rank waiting for the others does its agents' next work (a complete graph has
    one wake-up per round: the ranks would otherwise take turns). The numbers are the same."""
    mine = np.zeros(block.P.n, dtype=bool)
    mine[block.agents] = True
    deg = np.diff(block.P.graph.W.indptr)
    ahead = _Ahead(block, rounds, mine, start) if ibarrier is not None else None
    done = 0
    for r in range(start, rounds.count):
        lo, hi = int(rounds.starts[r]), int(rounds.starts[r + 1])
        here = rounds.agents[lo:hi]
        here = here[mine[here]]
        if len(here):
            # no agent of a round is a neighbour of another: nothing read in it is written in
            # it, so every read may come before every post (on every rank: the barrier ends it)
            ends = np.cumsum(deg[here]).tolist()
            buf = block.round_buffer(ends[-1])
            ids = here.tolist()
            o = 0
            for i, e in zip(ids, ends, strict=True):
                view = buf[o:e]
                _, nb = net.read(i, view)
                if nb is not view:
                    view[...] = nb
                o = e
            new = block.wake_many(ids, buf)
            for pos, i in enumerate(ids):
                net.post(i, float(block.k[i]), new[pos])  # stamped with its new version
            done += len(ids)
            if ahead is not None:
                ahead.woke(ids)
        if ahead is not None and ibarrier is not None:
            ahead.wait(ibarrier(), r)
        else:
            barrier()
        if rounds.record_at[r] >= 0:
            if on_record is not None:
                on_record(int(rounds.record_at[r]))
            if checkpoint is not None:
                checkpoint(r)
        if progress is not None:
            progress(hi)
    return done


class _Ahead:
    """`replay`'s gradients computed ahead: every hosted agent's wake-up rounds, and a heap of
    (next wake-up round, agent) of the agents whose next gradient is not computed yet."""

    def __init__(self, block: Block, rounds: Rounds, mine: np.ndarray, start: int) -> None:
        self.block = block
        pos = np.flatnonzero(mine[rounds.agents])
        rnd = np.searchsorted(rounds.starts, pos, side="right") - 1
        ag = rounds.agents[pos]
        order = np.argsort(ag, kind="stable")  # per agent: its rounds ascending
        cuts = np.searchsorted(ag[order], block.agents)
        cuts = np.r_[cuts, len(order)]
        self.rounds: dict[int, list[int]] = {}
        self.next: dict[int, int] = {}
        self.heap: list[tuple[int, int]] = []
        for a, i in enumerate(block.agents.tolist()):
            mine_r = rnd[order[cuts[a]:cuts[a + 1]]].tolist()
            self.rounds[i] = mine_r
            k = int(np.searchsorted(mine_r, start))  # the first wake-up at or after `start`
            self.next[i] = k
            if k < len(mine_r):
                self.heap.append((mine_r[k], i))
        heapq.heapify(self.heap)

    def woke(self, ids: Sequence[int]) -> None:
        """Agents `ids` woke (in the current round): queue their next wake-up."""
        for i in ids:
            k = self.next[i] = self.next[i] + 1
            if k < len(self.rounds[i]):
                heapq.heappush(self.heap, (self.rounds[i][k], i))

    def wait(self, req: Any, r: int) -> None:
        """Until `req` completes (round r's barrier), compute queued gradients."""
        heap = self.heap
        while not req.Test():
            if not heap:
                req.Wait()
                return
            nr, i = heapq.heappop(heap)
            if nr > r:  # a later round's wake-up (always: the agent woke before it)
                self.block.prepare(i)


def clock_times(seed: int, agent: int, count: int, tau: float) -> np.ndarray:
    """Tick times of agent's rate-1/tau Poisson clock (cumulative Exp(1) tau)."""
    return np.cumsum(stream(seed, "clock", agent, 0).exponential(1.0, count)) * tau


def live(block: Block, net: Any, tau: float, wall_budget: float,
         poll: Callable[[], None] | None = None,
         progress: Callable[[int], object] | None = None) -> dict[str, np.ndarray]:
    """Per-agent Poisson clocks in wall time, no barriers: each hosted agent wakes at its ticks
    (tau seconds apart on average; tau = 0: as fast as possible, in clock order), updates from
    whatever its mailbox holds and posts. Stops when every hosted agent has done T_i wake-ups or
    after wall_budget seconds. Returns the log: agent, wall time, and the neighbour versions each
    update read (flattened in update order)."""
    cap = block.s.T_agent
    if cap is None:
        raise ValueError("live mode needs T_agent (each agent's number of wake-ups)")
    ids = [int(i) for i in block.agents]
    times = {i: clock_times(block.s.seed, i, int(cap[i]), tau) for i in ids}
    # due wake-ups as a heap of (time, agent, index): the earliest first, ties by agent id
    due_heap = [(float(times[i][0]), i, 0) for i in ids if cap[i] > 0]
    heapq.heapify(due_heap)
    log_agent: list[int] = []
    log_time: list[float] = []
    log_ver: list[np.ndarray] = []
    t0 = time.perf_counter()
    n_done = 0
    while due_heap:
        t_i, i, k = due_heap[0]
        due = t0 + t_i
        now = time.perf_counter()
        while now < due and now - t0 <= wall_budget:
            if poll is not None:
                poll()
            time.sleep(min(due - now, 2e-4))
            now = time.perf_counter()
        if now - t0 > wall_budget:
            break
        buf = block.nbr_buffer(i)
        stamps, nb = net.read(i, buf)
        log_agent.append(i)
        log_time.append(time.perf_counter() - t0)
        log_ver.append(stamps.astype(np.int64))
        net.post(i, float(block.k[i] + 1), block.wake(i, nb))
        n_done += 1
        if k + 1 < cap[i]:
            heapq.heapreplace(due_heap, (float(times[i][k + 1]), i, k + 1))
        else:
            heapq.heappop(due_heap)
        if progress is not None:
            progress(n_done)
    return {"agent": np.asarray(log_agent, dtype=np.int64),
            "time": np.asarray(log_time, dtype=np.float64),
            "versions": (np.concatenate(log_ver) if log_ver else np.zeros(0, dtype=np.int64))}


def replay_log(problem: objective.Problem, s: Settings, contract: Contract, theta0: np.ndarray,
               agent: np.ndarray, versions: np.ndarray, budgets: list[np.ndarray]
               ) -> np.ndarray:
    """Re-execute a live run from its log: update u of agent i used neighbour j's version v (its
    v-th broadcast; 0 = the initial point). Every update is run once its inputs exist, so any
    causal log replays to the live run's models bit for bit. Returns Theta (R, n, p)."""
    n, R, p = problem.n, s.R, problem.p
    th0 = np.broadcast_to(theta0, (R, n, p))
    block = Block(problem, np.arange(n), s, contract, budgets,
                  {i: th0[:, i, :] for i in range(n)})
    hist: list[list[np.ndarray]] = [[th0[:, i, :].ravel().copy()] for i in range(n)]
    deg = np.diff(problem.graph.W.indptr)
    offs = np.concatenate([[0], np.cumsum(deg[agent])])
    per_agent: list[list[int]] = [[] for _ in range(n)]
    for u, i in enumerate(agent.tolist()):
        per_agent[i].append(u)
    ptr = [0] * n
    left = len(agent)
    while left:
        progressed = False
        for i in range(n):
            while ptr[i] < len(per_agent[i]):
                u = per_agent[i][ptr[i]]
                nb = problem.graph.nbrs(i)
                ver = versions[offs[u]:offs[u + 1]]
                if any(int(v) >= len(hist[j]) for j, v in zip(nb.tolist(), ver.tolist(),
                                                              strict=True)):
                    break
                M_ = np.stack([hist[j][int(v)] for j, v in zip(nb.tolist(), ver.tolist(),
                                                               strict=True)])
                hist[i].append(block.wake(i, M_).ravel().copy())
                ptr[i] += 1
                left -= 1
                progressed = True
        if not progressed:
            raise ValueError("the log is not causal: an update read a version never written")
    return current(block, n)


def theorem1_report(block: Block, s: Settings) -> dict[int, dict[str, float]]:
    """Per hosted agent: wake-ups, sum e_k, Theorem-1 eps_bar of what was spent, clip share."""
    out = {}
    for i in block.agents.tolist():
        e = block.budgets[i][: block.k[i]]
        out[i] = {"wakeups": block.k[i], "sum_e": float(math.fsum(e)),
                  "eps_theorem1": kairouz.theorem1_eps(e, s.delta) if s.private else math.inf,
                  "clip_fraction": float(block.clip_fraction(i).max())}
    return out


def warm_start_event(eps_ws: float) -> PureEvent:
    return PureEvent(eps_ws, "l2_laplace")
