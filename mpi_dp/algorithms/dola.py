"""DP distributed online learning (DOLA, seed 003; spec dp-distributed-online-learning.md).

Agents on a time-varying graph each stream their own records, mix the vectors their neighbours
released, take a projected subgradient step on the hinge loss and release a noised vector:

- `laplace` (Alg. 1): w_{t+1} = Pi_W(b_t - alpha g(b_t)), released w_{t+1} + Lap(S/eps)^n with
  S = 2 alpha sqrt(n) L / h (Lemma 1 through the L2 route, spec §2.1);
- `gaussian` (Alg. 2): released w_{t+1} = Pi_W(b_t - alpha (g + N(0, J^2))) (noise inside the step);
- `sparse` (Alg. 3, reconstructed): mirror descent on duals, w_t = soft(p_t, alpha_t rho),
  z_{t+1} = w_t - alpha_t g, released z + Lap(2 alpha_t sqrt(n) L / eps)^n (COMID);
- `minibatch` (Alg. 4): `laplace` with h records per round and S / h.

Invariant P (privacy-critical): what crosses rounds is only released vectors (own and the
neighbours'); the mix never reads an agent's clean iterate. Each record enters exactly one release
per pass, so a single pass gives every record the per-release guarantee (spec §4 (b)) and E passes
(`Settings.passes`, `PassReader`) compose E releases per record, not T (spec §4 (c)).

Every release goes through the configuration's privacy contract (privacy.contract): the block's
release path (`Contract.block`) charges each agent's ledger, draws the round's noise from the
agents' own streams (seed, 'noise', agent, run) and gives each agent's noise scale for the round's
sensitivity (a `Sensitivity` with the terms alpha, n, L and T that a paper's formula reads); this
module never sees which rule set the noise.

This module is pure NumPy: a `Block` of agents advances one round at a time and talks to the others
only through a `net` object (comm.graph_exchange.GraphNet under MPI, `LocalNet` here for the
single-process simulator of all agents). Every agent's arithmetic depends only on its own data, its
noise streams (keyed by agent and run, never by rank) and the vectors it receives, and the mix sums
self first, then neighbours by ascending id: the results are bitwise the same on any rank count and
layout.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any, Protocol, cast

import numpy as np
import scipy.sparse as sp

from .. import rng
from ..backend import Backend, backend, to_numpy
from ..comm import topology as tp
from ..privacy import Ledger
from ..privacy.calibration import Sensitivity
from ..privacy.contract import Contract
from ..privacy.noise_streams import RoundNoise
from ..privacy.release import BlockRelease
from .hooks import RunHooks

VARIANTS = ("laplace", "gaussian", "sparse", "minibatch")
REG_POINTS = ("mixed", "clean")
STEPS = ("auto", "strong", "convex")


@dataclasses.dataclass(frozen=True)
class Settings:
    """Everything one configuration of DOLA needs (identical on every rank)."""

    variant: str
    T: int  # rounds
    h: int  # records per round
    n_features: int
    m: int  # agents
    lam: float = 0.1
    radius: float = math.inf  # r of W = {||w|| <= r}
    step: str = "strong"  # strong: 1/(lam t); convex: 1/(2 sqrt t)
    L_data: float = 1.0  # max ||x|| (rows are scaled to norm <= 1 by the data preparation)
    #: what the subgradient bound of the sensitivity adds to L_data for the regulariser: 0 (the
    #: regulariser is data-independent: the tighter bound) or lam r (the total bound; the method
    #: entry resolves dola.sens_mode to it)
    L_reg: float = 0.0
    rho: float = 0.0  # lasso weight (sparse)
    reg_point: str = "mixed"  # minibatch regulariser at the mixed point (sound) or clean w (paper)
    activation: str = "hash"
    p_act: float = 0.5
    window: int = 10
    weights: str = "mh_static"
    ref_agent: int = 0
    exact_regret: bool = True
    seed: int = 0
    run_ids: tuple[int, ...] = (0,)
    record_every: int = 1
    #: passes over each agent's records: round t reads pass t // rounds_per_pass (pass 0 in the
    #: stored order, later passes permuted: PassReader), so each record is in `passes` releases
    passes: int = 1
    backend: str = "numpy"  # array backend of the round's products and mix (mpi_dp.backend)

    @property
    def runs(self) -> int:
        return len(self.run_ids)

    @property
    def rounds_per_pass(self) -> int:
        """Rounds of one pass, ceil(T / passes): each agent's records_per_pass = this x h."""
        return -(-self.T // self.passes)

    def record_pass(self, t: int) -> int:
        """The pass over the agents' records that round t (0-based) reads."""
        return t // self.rounds_per_pass if self.passes > 1 else 0

    @property
    def L(self) -> float:
        """The subgradient bound the sensitivity uses: L_data (the regulariser is data-
        independent) or L_data + L_reg (the total bound, L_reg = lam r)."""
        return self.L_data + self.L_reg if self.L_reg else self.L_data

    @property
    def mechanism(self) -> str:
        """The noise of every release: Gaussian in the step (Alg. 2), else Laplace."""
        return "gaussian" if self.variant == "gaussian" else "laplace"

    @property
    def certified(self) -> bool:
        """Whether the algorithm's steps keep the stated guarantee (invariant P); the noise's
        own flag (a paper formula used outside its proof) is the contract's."""
        return self.invariant_P

    @property
    def invariant_P(self) -> bool:
        """The paper's Alg. 4 regulariser at the clean iterate breaks invariant P."""
        return not (self.variant == "minibatch" and self.reg_point == "clean")


# -- pure math -----------------------------------------------------------------------------------
def step_size(t1: int, s: Settings) -> float:
    """alpha_t for t = t1 >= 1: 1/(lam t) (strongly convex) or 1/(2 sqrt t) (convex)."""
    if s.step == "strong":
        return 1.0 / (s.lam * t1)
    return 0.5 / math.sqrt(t1)


def laplace_sensitivity(alpha: float, n: int, L: float, h: int = 1) -> float:
    """S = 2 alpha sqrt(n) L / h: L1 sensitivity of one release (Lemma 1, Lemma 10)."""
    return 2.0 * alpha * math.sqrt(n) * L / h


def project_ball(V: np.ndarray, r: float) -> np.ndarray:
    """Pi_W on the last axis, in place: v * min(1, r / ||v||)."""
    if math.isinf(r):
        return V
    norms = np.linalg.norm(V, axis=-1, keepdims=True)
    big = norms > r
    if np.any(big):
        np.multiply(V, np.where(big, r / np.where(big, norms, 1.0), 1.0), out=V)
    return V


def soft_threshold(P: np.ndarray, tau: float) -> np.ndarray:
    """argmin_w 0.5 ||p - w||^2 + tau ||w||_1, coordinate-wise."""
    return np.sign(P) * np.maximum(np.abs(P) - tau, 0.0)


def rho_for_sparsity(p: np.ndarray, s: float, alpha: float) -> float:
    """The lasso weight that zeroes a fraction s of the coordinates of p at step alpha."""
    return float(np.quantile(np.abs(np.asarray(p, dtype=np.float64)).ravel(), s)) / alpha


def hinge(margins: np.ndarray) -> np.ndarray:
    return np.maximum(0.0, 1.0 - margins)


# -- the records of a round ---------------------------------------------------------------------
class Batch:
    """The h records of every agent of the block in one round: dense X (k, h, n) or CSR (k h, n)
    with row a h + s = record s of agent a; y (k, h) in {-1, +1}. `device`: the dense X on a
    device backend (mpi_dp.backend), where `dots` and `combine` then run (host in, host out)."""

    def __init__(self, X: np.ndarray | sp.csr_matrix, y: np.ndarray, k: int, h: int,
                 device: tuple[Backend, Any] | None = None) -> None:
        self.X, self.y, self.k, self.h = X, y, k, h
        self.device = device
        self.sparse = sp.issparse(X)
        if self.sparse:
            csr = cast("sp.csr_matrix", X)
            rows = np.repeat(np.arange(k * h), np.diff(csr.indptr))
            self._agent_nz = rows // h
            self._rows_nz = rows
            self._nonempty = np.diff(csr.indptr) > 0

    def dots(self, V: np.ndarray) -> np.ndarray:
        """<V[a, r], x_{a, s}> as (k, R, h)."""
        if self.device is not None:
            bk, Xd = self.device
            return to_numpy(bk.asarray(V) @ bk.xp.matrix_transpose(Xd))
        if not self.sparse:
            return np.matmul(V, self.X.transpose(0, 2, 1))
        k, R, _ = V.shape
        out = np.zeros((self.k * self.h, R))
        X = cast("sp.csr_matrix", self.X)
        if X.nnz:
            vals = V[self._agent_nz, :, X.indices] * X.data[:, None]
            out[self._nonempty] = np.add.reduceat(vals, X.indptr[:-1][self._nonempty], axis=0)
        return out.reshape(self.k, self.h, R).transpose(0, 2, 1)

    def dots_vec(self, w: np.ndarray) -> np.ndarray:
        """<w, x_{a, s}> for one vector w, as (k, h)."""
        if not self.sparse:
            return self.X @ w
        return np.asarray(self.X @ w).reshape(self.k, self.h)

    def combine(self, C: np.ndarray, n: int) -> np.ndarray:
        """sum_s C[a, r, s] x_{a, s} as (k, R, n)."""
        if self.device is not None:
            bk, Xd = self.device
            return to_numpy(bk.asarray(C) @ Xd)
        if not self.sparse:
            return np.matmul(C, self.X)
        k, R, _ = C.shape
        X = cast("sp.csr_matrix", self.X)
        coef = C.transpose(0, 2, 1).reshape(k * self.h, R)[self._rows_nz] * X.data[:, None]
        rows = (self._agent_nz[:, None] * R + np.arange(R)[None, :]).ravel()
        cols = np.repeat(X.indices, R)
        G = sp.coo_matrix((coef.ravel(), (rows, cols)), shape=(k * R, n)).toarray()
        return G.reshape(k, R, n)


def hinge_subgradient(batch: Batch, V: np.ndarray, margins: np.ndarray) -> np.ndarray:
    """(1/h) sum_s -y x [y <v, x> < 1] at V (k, R, n), from the margins y<v, x> (k, R, h)."""
    coef = np.where(margins < 1.0, -batch.y[:, None, :], 0.0) / batch.h
    return batch.combine(coef, V.shape[-1])


Reader = Callable[[int, int, int], tuple[Any, np.ndarray]]


def read_block(read: Reader, agents: np.ndarray, start: int, stop: int, n: int
               ) -> tuple[Any, np.ndarray]:
    """Records start..stop of every agent of the block, stacked agent-major: X dense (k, c, n)
    or CSR (k c, n) with row a c + s = record start + s of agent a, y (k, c) float64.

    The one place a chunk of the block's records is read: through `read.read_many(agents,
    start, stop)` (every agent's `read(agent, start, stop)`, in agent order) where the reader
    offers one (a whole block at once: methods.dola.PooledReader), else agent by agent."""
    k, c = len(agents), stop - start
    many = getattr(read, "read_many", None)
    parts = (list(many(agents, start, stop)) if many is not None
             else [read(int(a), start, stop) for a in agents])
    if not parts:
        return np.zeros((0, c, n)), np.zeros((0, c))
    y = np.stack([np.asarray(p[1], dtype=np.float64) for p in parts]).reshape(k, c)
    if sp.issparse(parts[0][0]):
        return sp.vstack([sp.csr_matrix(p[0]) for p in parts], format="csr"), y
    return np.stack([np.asarray(p[0], dtype=np.float64) for p in parts]).reshape(k, c, n), y


class Stream:
    """The block's records, h per agent per round, read from `read(agent, start, stop)` in chunks
    of whole rounds (never a whole large shard at once), the whole block per chunk
    (`read_block`)."""

    def __init__(self, agents: np.ndarray, h: int, T: int, n_features: int, read: Reader,
                 chunk_records: int = 4096, backend_name: str = "numpy") -> None:
        self.agents, self.h, self.T, self.n = np.asarray(agents), h, T, n_features
        bk = backend(backend_name)
        self.bk = None if bk.is_numpy else bk  # dense chunks move to the device once
        self._dev: Any = None
        self.read = read
        self.C = max(1, min(T, chunk_records // h))  # rounds per chunk
        self.t = 0
        self._buf: tuple[Any, np.ndarray] | None = None
        self._base = 0

    def _fill(self) -> None:
        k, h, C = len(self.agents), self.h, min(self.C, self.T - self.t)
        X, y = read_block(self.read, self.agents, self.t * h, (self.t + C) * h, self.n)
        if sp.issparse(X):
            # round-major: round j holds rows a * C h + j h + s for a = 0..k-1, s = 0..h-1
            perm = (np.arange(k)[None, :, None] * C * h + np.arange(C)[:, None, None] * h
                    + np.arange(h)[None, None, :]).ravel()
            X = X[perm]
        self._buf, self._base = (X, y), self.t
        self._dev = None if self.bk is None or sp.issparse(X) else self.bk.asarray(X)

    def next(self) -> Batch:
        if self.t >= self.T:
            raise IndexError("stream exhausted")
        if self._buf is None or self.t - self._base >= self._rows():
            self._fill()
        X, y = self._buf  # type: ignore[misc]
        j, k, h = self.t - self._base, len(self.agents), self.h
        self.t += 1
        yb = y[:, j * h:(j + 1) * h]
        if sp.issparse(X):
            return Batch(X[j * k * h:(j + 1) * k * h], yb, k, h)
        dev = None
        if self._dev is not None:
            assert self.bk is not None  # _dev is set only on a device backend
            dev = (self.bk, self._dev[:, j * h:(j + 1) * h, :])
        return Batch(X[:, j * h:(j + 1) * h], yb, k, h, dev)

    def _rows(self) -> int:
        assert self._buf is not None
        return self._buf[1].shape[1] // self.h

    def seek(self, t: int) -> None:
        """Continue at round t (a resume): the reads give the same records for any chunking."""
        self.t, self._buf = t, None


class PassReader:
    """read(agent, start, stop) over `passes` passes of each agent's first `n` records: record
    s of the stream is record s - k n of pass k = s // n; pass 0 reads them in the stored order
    (through `read`, as a single pass does), pass k >= 1 in the order of a permutation drawn from
    the stream (seed, 'sample', agent, k) (keyed by agent, never by rank). An agent's n records
    are kept in memory from its first read of a later pass on."""

    def __init__(self, read: Callable[[int, int, int], tuple[Any, np.ndarray]], n: int,
                 seed: int) -> None:
        self.read, self.n, self.seed = read, int(n), int(seed)
        self._rows: dict[int, tuple[Any, np.ndarray]] = {}
        self._order: dict[int, tuple[int, np.ndarray]] = {}

    def order(self, agent: int, k: int) -> np.ndarray:
        """The order of agent's records in pass k (k >= 1)."""
        got = self._order.get(agent)
        if got is None or got[0] != k:
            got = self._order[agent] = (k, rng.stream(self.seed, "sample", agent, k)
                                        .permutation(self.n))
        return got[1]

    def _all(self, agent: int) -> tuple[Any, np.ndarray]:
        if agent not in self._rows:
            self._rows[agent] = self.read(agent, 0, self.n)
        return self._rows[agent]

    def __call__(self, agent: int, start: int, stop: int) -> tuple[Any, np.ndarray]:
        parts, s = [], start
        while s < stop:
            k, lo = divmod(s, self.n)
            hi = min(stop - k * self.n, self.n)
            if k == 0:
                part = self.read(agent, lo, hi)
                if lo == 0 and hi == self.n:
                    self._rows[agent] = part
            else:
                X, y = self._all(agent)
                idx = self.order(agent, k)[lo:hi]
                part = (X[idx], np.asarray(y)[idx])
            parts.append(part)
            s = k * self.n + hi
        if len(parts) == 1:
            return parts[0]
        X = (sp.vstack([p[0] for p in parts], format="csr") if sp.issparse(parts[0][0])
             else np.concatenate([p[0] for p in parts]))
        return X, np.concatenate([p[1] for p in parts])


def pass_reader(s: Settings, read: Callable[[int, int, int], tuple[Any, np.ndarray]]
                ) -> Callable[[int, int, int], tuple[Any, np.ndarray]]:
    """The stream's reader of a configuration: `read` itself for a single pass (bit for bit as
    before), else a PassReader over the records of one pass."""
    if s.passes <= 1:
        return read
    return PassReader(read, s.rounds_per_pass * s.h, s.seed)


# -- communication seam --------------------------------------------------------------------------
class Net(Protocol):
    """What a block needs from the others (comm.graph_exchange.GraphNet under MPI, LocalNet here)."""

    agents: np.ndarray  # the block's agents (global ids, ascending)
    ghosts: np.ndarray  # neighbours hosted elsewhere (global ids, ascending): rows k.. of Pub
    tracked: np.ndarray  # edges whose activation the block tracks (rows of graph.edges)

    def exchange(self, t: int, pub: np.ndarray, active: np.ndarray) -> None: ...
    def ref_vector(self, E: np.ndarray, agent: int) -> np.ndarray: ...
    def allreduce_sum(self, a: np.ndarray) -> np.ndarray: ...
    def agent_sum(self, a: np.ndarray) -> np.ndarray: ...
    def gather_agents(self, a: np.ndarray) -> np.ndarray | None: ...
    def gather_objects(self, obj: Any) -> list | None: ...
    def bcast_object(self, obj: Any) -> Any: ...
    def scatter_agents(self, per_agent: dict[int, Any] | None) -> dict[int, Any]: ...


class LocalNet:
    """All agents in one process: the single-process simulator's (empty) communication."""

    def __init__(self, graph: tp.Graph) -> None:
        self.agents = np.arange(graph.m)
        self.ghosts = np.zeros(0, dtype=np.int64)
        self.tracked = graph.edges
        self.is_root = True

    def exchange(self, t: int, pub: np.ndarray, active: np.ndarray) -> None:
        return None

    def ref_vector(self, E: np.ndarray, agent: int) -> np.ndarray:
        return E[agent]

    def allreduce_sum(self, a: np.ndarray) -> np.ndarray:
        return a

    def agent_sum(self, a: np.ndarray) -> np.ndarray:
        return np.asarray(a, dtype=np.float64).sum(axis=0)

    def gather_agents(self, a: np.ndarray) -> np.ndarray | None:
        return a

    def gather_objects(self, obj: Any) -> list | None:
        return [obj]

    def bcast_object(self, obj: Any) -> Any:
        return obj

    def scatter_agents(self, per_agent: dict[int, Any] | None) -> dict[int, Any]:
        assert per_agent is not None
        return per_agent


# -- one block of agents -------------------------------------------------------------------------
def check_contract(s: Settings, contract: Contract) -> None:
    """The contract must hold the m agents with the streams (seed, runs) of `s`: an agent
    without a plan, or other streams, would release other noise than the run states."""
    if contract.owners != s.m:
        raise ValueError(f"the contract holds {contract.owners} owner(s), the run {s.m} agents")
    if contract.seed != s.seed or contract.run_ids != tuple(s.run_ids):
        raise ValueError(f"the contract's streams (seed {contract.seed}, runs "
                         f"{list(contract.run_ids)}) are not the run's (seed {s.seed}, runs "
                         f"{list(s.run_ids)})")


def _rows_of(ids: np.ndarray, want: np.ndarray) -> np.ndarray:
    """The position in `ids` (distinct, any order) of each entry of `want` (all present)."""
    order = np.argsort(ids, kind="stable")
    at = (order[np.minimum(np.searchsorted(ids[order], want), len(ids) - 1)] if len(ids)
          else np.zeros(len(want), dtype=np.int64))
    if not np.array_equal(ids[at], want):
        raise ValueError("a neighbour is neither hosted nor a ghost of this block")
    return at.astype(np.int64)


class Block:
    """The state of the agents a process hosts, advanced one synchronous round at a time.

    Pub (k + g, R, n): the released vectors of the k hosted agents, then of the g ghosts (the
    neighbours hosted elsewhere, filled by the exchange). W (k, R, n): the clean iterates (never
    sent; evaluation only). `contract` (privacy.contract.Contract of the m agents, its seed and
    runs those of `s`) gives the hosted agents' release path (`release`) and their round noise
    (`noise`). `on_release` / `on_mix`, when set, see every release and every mix (instrumented
    runs checking invariant P).
    """

    def __init__(self, s: Settings, contract: Contract, graph: tp.Graph, net: Net,
                 stream: Stream, w_star: np.ndarray | None = None) -> None:
        self.s, self.graph, self.net, self.stream = s, graph, net, stream
        self.agents = np.asarray(net.agents, dtype=np.int64)
        k, R, n = len(self.agents), s.runs, s.n_features
        check_contract(s, contract)
        self.k = k
        rows_ids = np.concatenate([self.agents, np.asarray(net.ghosts, dtype=np.int64)])
        self.rows_ids = rows_ids
        self.rows = tp.MixingRows(graph, self.agents, net.tracked, s.weights)
        self.nbr_row = _rows_of(rows_ids, self.rows.nbr)
        self.deg = np.diff(self.rows.indptr)
        self._mix_indptr = np.concatenate([[0], np.cumsum(self.deg + 1)]).astype(np.int64)
        self._mix_self = self._mix_indptr[:-1]
        nbr_slot = np.ones(self._mix_indptr[-1], dtype=bool)
        nbr_slot[self._mix_self] = False
        self._mix_nbr = np.flatnonzero(nbr_slot)
        self._mix_indices = np.empty(self._mix_indptr[-1], dtype=np.int64)
        self._mix_indices[self._mix_self] = np.arange(k)
        self._mix_indices[self._mix_nbr] = self.nbr_row
        self._mix_data = np.empty(self._mix_indptr[-1])
        bk = backend(s.backend)
        self.device = None if bk.is_numpy else bk
        if self.device is not None:
            # the mix on a device: each agent's neighbours in slots (ascending id, padded with
            # a zero row), added to a_ii Pub_i one slot after another, the CSR product's order
            pos = np.arange(len(self.rows.nbr)) - self.rows.indptr[self.rows.owner]
            width = int(self.deg.max()) if k and len(self.rows.nbr) else 0
            self._slot = (self.rows.owner, pos)
            self._slot_rows = np.full((k, width), len(rows_ids), dtype=np.int64)
            self._slot_rows[self._slot] = self.nbr_row
        self.activation = tp.EdgeActivation(net.tracked, s.activation, s.p_act, s.window, s.seed)
        gkeys = graph.edges[:, 0] * graph.m + graph.edges[:, 1]  # sorted (edges are)
        self._edge_idx = np.searchsorted(gkeys, self.activation.lo * graph.m + self.activation.hi)
        self.Pub = np.zeros((len(rows_ids), R, n))
        self.W = np.zeros((k, R, n))
        self.Hsum = np.zeros((k, R, n))  # running sum of each agent's iterate (w_hat)
        # every hosted agent's release path (its noise, its ledger of a per-record plan, its
        # streams) and the block's noise of every round, drawn from the agents' own streams
        self.release: BlockRelease = contract.block(self.agents.tolist(), certified=s.certified,
                                                    mechanism=s.mechanism)
        self.noise: RoundNoise = self.release.round_noise(
            n, "normal" if s.mechanism == "gaussian" else "laplace", rounds=s.T)
        self.w_star = w_star
        # cumulative per agent and run: own loss, reference-node loss, comparator loss, mistakes
        self.cum = np.zeros((4, k, R))
        self.noise_l1 = np.zeros((k, R))
        self.last_active_deg = np.zeros(k)
        self.last_a_self = np.ones(k)
        self.t = 0
        self.on_release: Callable[[int, np.ndarray, np.ndarray], None] | None = None
        self.on_mix: Callable[[int, np.ndarray, np.ndarray, np.ndarray], None] | None = None

    # -- checkpoints inside a configuration (resume on any rank count) --
    def state(self) -> dict[str, Any] | None:
        """Collective: what a resumed block continues from, on the root (None elsewhere): round
        t, every agent's state keyed by agent id, each edge's last active round (graph order)."""
        pos, ledgers = self.noise.positions(), self.ledgers  # each built once for the block
        cum = self.cum.transpose(1, 0, 2).copy()  # (k, 4, R): agent i's row is its cum[:, i]
        Pub, W, Hsum, l1 = (x.copy() for x in (self.Pub, self.W, self.Hsum, self.noise_l1))
        mine = {int(a): {"pub": Pub[i], "W": W[i], "Hsum": Hsum[i], "cum": cum[i],
                         "noise_l1": l1[i], "deg": self.last_active_deg[i],
                         "a_self": self.last_a_self[i], "ledger": ledgers[i], "noise": pos[i]}
                for i, a in enumerate(self.agents)}
        parts = self.net.gather_objects((mine, self._edge_idx, self.activation.last.copy()))
        if parts is None:
            return None
        last = np.full(len(self.graph.edges), -1, dtype=np.int64)
        for _, idx, lst in parts:
            last[idx] = lst
        return {"t": self.t, "agents": {a: st for p in parts for a, st in p[0].items()},
                "edge_last": last}

    def restore(self, saved: dict[str, Any] | None) -> int | None:
        """Collective: continue from the root's `state()` (None: start afresh); every hosted
        agent and every ghost row of Pub (the neighbours' own saved releases) is restored.
        Returns the round resumed at (None: not resumed)."""
        head = self.net.bcast_object(None if saved is None else (saved["t"], saved["edge_last"]))
        if head is None:
            return None
        t, edge_last = head
        st = self.net.scatter_agents(None if saved is None else saved["agents"])
        if len(self.rows_ids):
            self.Pub[:] = np.stack([st[a]["pub"] for a in self.rows_ids.tolist()])
        mine = [st[a] for a in self.agents.tolist()]
        if mine:
            self.W[:] = np.stack([d["W"] for d in mine])
            self.Hsum[:] = np.stack([d["Hsum"] for d in mine])
            self.cum[:] = np.stack([d["cum"] for d in mine], axis=1)
            self.noise_l1[:] = np.stack([d["noise_l1"] for d in mine])
            self.last_active_deg[:] = [d["deg"] for d in mine]
            self.last_a_self[:] = [d["a_self"] for d in mine]
        self.release.restore_ledgers([d["ledger"] for d in mine])
        self.noise.seek([d["noise"] for d in mine], self.s.T - t)
        self.stream.seek(t)
        self.activation.last, self.activation.t = edge_last[self._edge_idx].copy(), t
        self.t = t
        return t

    @property
    def ledgers(self) -> list[Ledger]:
        return self.release.ledgers

    def record_pass(self, t: int) -> int:
        """The pass over the agents' records that round t reads (a single pass: 0)."""
        return self.s.record_pass(t)

    # -- pieces of a round --
    def mix(self, a_self: np.ndarray, a_nbr: np.ndarray) -> np.ndarray:
        """b_i = a_ii Pub_i + sum_j a_ij Pub_j, neighbours by ascending id: one CSR product whose
        row i is stored [self, neighbours ascending] (scipy sums each row from zero in stored
        order, so the float operations do not depend on the layout)."""
        if self.device is not None:
            return self._mix_on_device(a_self, a_nbr)
        self._mix_data[self._mix_self] = a_self
        self._mix_data[self._mix_nbr] = a_nbr
        A = sp.csr_matrix((self._mix_data, self._mix_indices, self._mix_indptr),
                          shape=(self.k, self.Pub.shape[0]))
        rows, item = self.Pub.shape[0], self.W.shape[1] * self.W.shape[2]
        return np.asarray(A @ self.Pub.reshape(rows, item)).reshape(self.W.shape)

    def _mix_on_device(self, a_self: np.ndarray, a_nbr: np.ndarray) -> np.ndarray:
        """`mix` on the device backend: the same weighted sums, slot by slot (array API)."""
        bk, (k, width) = self.device, self._slot_rows.shape
        assert bk is not None  # mix calls this on a device backend only
        xp = bk.xp
        Pub = bk.asarray(np.concatenate([self.Pub, np.zeros((1, *self.Pub.shape[1:]))]))
        w = np.zeros((k, width))
        w[self._slot] = a_nbr
        B = bk.asarray(np.asarray(a_self, dtype=np.float64)[:, None, None]) * Pub[:k, ...]
        wd, idx = bk.asarray(w[:, :, None, None]), bk.asarray(self._slot_rows)
        for j in range(width):
            B = B + wd[:, j, ...] * xp.take(Pub, idx[:, j], axis=0)
        return to_numpy(B)

    def _losses(self, E: np.ndarray, batch: Batch) -> np.ndarray:
        """Accumulate f_t^i at the agent's own iterate, at the reference agent's and at w*, and
        the online mistakes of sign(<w_t^i, x>) (0 predicts +1). Evaluation-only. Returns the
        margins y <E, x> (k, R, h)."""
        s = self.s
        y = batch.y[:, None, :]
        dE = batch.dots(E)
        mE = dE * y
        reg = 0.5 * s.lam * np.einsum("arn,arn->ar", E, E) if s.lam else 0.0
        self.cum[0] += hinge(mE).mean(axis=2) + reg
        self.cum[3] += (np.where(dE >= 0, 1.0, -1.0) != y).sum(axis=2)
        if s.exact_regret:
            wref = self.net.ref_vector(E, s.ref_agent)  # (R, n): evaluation-only broadcast
            mref = batch.dots(np.broadcast_to(wref, E.shape)) * y
            reg_ref = 0.5 * s.lam * np.einsum("rn,rn->r", wref, wref)[None, :] if s.lam else 0.0
            self.cum[1] += hinge(mref).mean(axis=2) + reg_ref
        if self.w_star is not None:
            ms = batch.dots_vec(self.w_star) * batch.y
            f = hinge(ms).mean(axis=1) + 0.5 * s.lam * float(self.w_star @ self.w_star)
            self.cum[2] += f[:, None]
        return mE

    def round(self) -> None:
        s, t = self.s, self.t
        t1 = t + 1
        active = self.activation.step()
        a_self, a_nbr = self.rows.weights_for(active)
        self.net.exchange(t, self.Pub, active)
        B = self.mix(a_self, a_nbr)
        if self.on_mix is not None:
            self.on_mix(t, B, a_self, a_nbr)
        batch = self.stream.next()
        alpha = step_size(t1, s)
        if s.variant == "sparse":
            E = soft_threshold(B, alpha * s.rho)
        elif s.variant == "gaussian":
            E = self.Pub[: self.k].copy()
        else:
            E = self.W
        margins_E = self._losses(E, batch)
        self.Hsum += E
        n = s.n_features
        if s.variant in ("laplace", "minibatch"):
            point = self.W if s.reg_point == "clean" else B
            G = hinge_subgradient(batch, B, batch.dots(B) * batch.y[:, None, :])
            if s.lam:
                G += s.lam * point
            self.W = project_ball(B - alpha * G, s.radius)
            S = laplace_sensitivity(alpha, n, s.L, s.h)
            self._release_laplace(S, self.W, t)
        elif s.variant == "sparse":
            G = hinge_subgradient(batch, E, margins_E)
            if s.lam:
                G += s.lam * E
            self.W = E
            S = laplace_sensitivity(alpha, n, s.L, s.h)
            self._release_laplace(S, E - alpha * G, t)
        else:  # gaussian: noise inside the step; the released vector is the iterate
            G = hinge_subgradient(batch, B, batch.dots(B) * batch.y[:, None, :])
            if s.lam:
                G += s.lam * B
            self._release_gaussian(alpha, B, G, t)
        # active neighbours per agent: exact small integers in float64, any summation order
        deg_active = np.bincount(self.rows.owner, weights=a_nbr > 0, minlength=self.k
                                 ).astype(np.float64)
        self.last_active_deg, self.last_a_self = deg_active, a_self
        self.t = t1

    def _release_laplace(self, S: float, V: np.ndarray, t: int) -> None:
        """Release V + Lap(mu_i)^n through the block's release path: every hosted agent's ledger
        charged for L1 sensitivity S, mu_i its noise's scale for S, the round's standard draws
        Z taken when some mu_i > 0."""
        k = self.k

        def update(Z: np.ndarray | None, mu: np.ndarray) -> np.ndarray:
            if Z is not None:
                noise = mu[:, None, None] * Z
                self.noise_l1 = np.abs(noise).sum(axis=2)  # evaluation-only
                self.Pub[:k] = V + noise
            else:
                self.Pub[:k] = V
            return self.Pub[:k]

        self.release.round(S, update, record_pass=self.record_pass(t))
        if self.on_release is not None:
            self.on_release(t, self.agents, self.Pub[:k].copy())

    def _release_gaussian(self, alpha: float, B: np.ndarray, G: np.ndarray, t: int) -> None:
        """Release Pi_W(B - alpha (G + J_i N(0, 1))) (Alg. 2: the noise inside the step) through
        the block's release path: every hosted agent's ledger charged for the gradient's L2
        sensitivity delta2 = 2 L_data / h, J_i its noise's scale for the round (the terms
        alpha, n, L, T a paper's formula reads), the round's standard normal draws taken when
        some J_i > 0. The released vector is the agent's new iterate."""
        s, k = self.s, self.k
        delta2 = 2.0 * s.L_data / s.h
        sens = Sensitivity.of(delta2, alpha=alpha, n=s.n_features, L=s.L, T=s.T)

        def update(Z: np.ndarray | None, J: np.ndarray) -> np.ndarray:
            step = G
            if Z is not None:
                step = G + J[:, None, None] * Z
                self.noise_l1 = alpha * J[:, None] * np.abs(Z).sum(axis=2)  # evaluation-only
            self.W = project_ball(B - alpha * step, s.radius)
            self.Pub[:k] = self.W
            return self.Pub[:k]

        self.release.round(sens, update, record_pass=self.record_pass(t))
        if self.on_release is not None:
            self.on_release(t, self.agents, self.Pub[:k].copy())


# -- metrics and the round loop ------------------------------------------------------------------
def test_error(X: Any, y: np.ndarray, V: np.ndarray) -> np.ndarray:
    """Error of sign(<v, x>) (0 predicts +1) for each row v of V (R, n) on a test set."""
    pred = np.where(np.asarray(X @ V.T) >= 0, 1.0, -1.0)
    return (pred != y[:, None]).mean(axis=0)


def collect(block: Block, test: tuple[Any, np.ndarray] | None) -> dict[str, Any] | None:
    """The record of round block.t (collective over the net): per-run metrics (R,) and per-round
    scalars, on the root (None elsewhere). Sums over agents are taken on the root in agent order.
    """
    s, net, t = block.s, block.net, block.t
    R = s.runs
    W = block.W
    k, F = W.shape[0], R * W.shape[2]  # sums over agents in agent order: any layout, same bits
    tot = net.agent_sum(np.concatenate([W.reshape(k, F), block.Hsum.reshape(k, F)], axis=1))
    w_bar = tot[:F].reshape(W.shape[1:]) / s.m
    w_hat = tot[F:].reshape(W.shape[1:]) / (s.m * t)
    spread = np.linalg.norm(W - w_bar[None], axis=-1)  # (k, R)
    per_agent = np.concatenate([
        block.cum.transpose(1, 0, 2).reshape(block.k, 4 * R), spread, spread**2, block.noise_l1,
        (W == 0).mean(axis=-1), block.last_active_deg[:, None], block.last_a_self[:, None]],
        axis=1)
    g = net.gather_agents(per_agent)
    if g is None:
        return None
    m = g.shape[0]
    cols = np.split(g[:, : 8 * R], 8, axis=1)  # own, ref, star, mistakes, spread, sq, noise, zeros
    cum = [c.sum(axis=0) for c in cols[:4]]
    out: dict[str, Any] = {}
    if block.w_star is not None:
        if s.exact_regret:
            out["regret"] = (cum[1] - cum[2]) / t
        out["regret_own"] = (cum[0] - cum[2]) / t
    out["loss"] = cum[0] / (m * t)
    out["online_error"] = cum[3] / (m * t * s.h)
    out["spread"] = cols[4].sum(axis=0)
    out["spread_sq"] = cols[5].sum(axis=0)
    out["noise_l1"] = cols[6].mean(axis=0)
    if s.variant == "sparse" or s.rho:
        out["sparsity"] = cols[7].mean(axis=0)
    if test is not None:
        out["test_error"] = test_error(test[0], test[1], w_hat)
        out["test_error_bar"] = test_error(test[0], test[1], w_bar)
    out["active_degree"] = float(g[:, 8 * R].mean())
    out["a_self_min"] = float(g[:, 8 * R + 1].min())
    out["step_size"] = step_size(t, s)
    out["_w_bar"], out["_w_hat"] = w_bar, w_hat
    return out


class Evaluation:
    """dola's evaluator (algorithms.evaluation.Evaluator; evaluation-only, from the agents'
    clean iterates and the public test set): `record(block)` is `collect` (collective over the
    net), `final()` the models of the last record on the root."""

    def __init__(self, test: tuple[Any, np.ndarray] | None) -> None:
        self.test = test
        self.last: dict[str, Any] | None = None

    def record(self, block: Block) -> dict[str, Any] | None:
        """The record of round block.t on the root (`collect`; None elsewhere): per-run metrics
        and per-round scalars, and the models under '_w_bar' and '_w_hat' (not metrics)."""
        rec = collect(block, self.test)
        if rec is not None:
            self.last = rec
        return rec

    def final(self) -> dict[str, Any] | None:
        """The last record's models on the root: w_hat ((1/T) sum_t w_bar_t, the online-to-
        batch model) and w_bar (the network mean of the clean iterates); None elsewhere or
        before any record."""
        if self.last is None:
            return None
        return {"w_hat": self.last["_w_hat"], "w_bar": self.last["_w_bar"]}


def drive(block: Block, test: tuple[Any, np.ndarray] | Evaluation | None,
          on_record: Callable[[int, dict[str, Any]], None] | None = None,
          progress: Callable[[int], None] | None = None,
          checkpoint: Callable[[], None] | None = None,
          hooks: RunHooks | None = None) -> dict[str, Any] | None:
    """Run the rounds from block.t to T; collect a record every record_every rounds and at T
    (`test`: an Evaluation, or the public test set (X, y) or None to evaluate on), then
    checkpoint (collective) after each record before T. Returns the last record on the root.

    `hooks` (the runner's RunHooks): each record's metrics (its keys without a leading '_') go
    to hooks.record, hooks.checkpoint(block.state) follows each record before T and
    hooks.progress(t) each round. `on_record` (the whole record), `checkpoint` and `progress`
    are the same steps as plain callables (the simulator, tests), called after the hooks'."""
    s = block.s
    ev = test if isinstance(test, Evaluation) else Evaluation(test)
    while block.t < s.T:
        block.round()
        if block.t % s.record_every == 0 or block.t == s.T:
            rec = ev.record(block)
            if rec is not None:
                if hooks is not None and hooks.recording:
                    hooks.record(block.t, {k: v for k, v in rec.items() if not k.startswith("_")})
                if on_record is not None:
                    on_record(block.t, rec)
            if block.t < s.T:
                if hooks is not None:
                    hooks.checkpoint(block.state)
                if checkpoint is not None:
                    checkpoint()
        if hooks is not None:
            hooks.progress(block.t)
        if progress is not None:
            progress(block.t)
    return ev.last


def simulate(s: Settings, contract: Contract, graph: tp.Graph,
             read: Callable[[int, int, int], tuple[Any, np.ndarray]],
             w_star: np.ndarray | None = None, test: tuple[Any, np.ndarray] | None = None,
             on_record: Callable[[int, dict[str, Any]], None] | None = None) -> Block:
    """The single-process simulator of all m agents (the reference of the MPI runs), releasing
    under `contract`."""
    net = LocalNet(graph)
    block = Block(s, contract, graph, net, Stream(net.agents, s.h, s.T, s.n_features,
                                                  pass_reader(s, read), backend_name=s.backend),
                  w_star)
    drive(block, test, on_record)
    return block
