"""DP inexact ADMM (seed 002): ObjT, ObjP (objective perturbation) and the OutP baseline.

Spec: specs/dp-inexact-admm.md. A server on rank 0 and P agents (blocks over ranks) solve
min_w (1/I) sum_i l(w; x_i, y_i) + gamma ||w||_F^2 for multiclass logistic regression by the
consensus ADMM of (2)-(4), with the agents' subproblems linearised (IADMM):

  ObjT / ObjP, per iteration t (server, then agents, then dual):
    w       = Proj_W( (1/P) sum_p (z_p - lam_p / rho) )                       (4a)
    g_p     = grad f_p(z_p)                     (at the agent's previous iterate)
    xi_p    ~ Laplace(0, b)^(J x K),  b = Delta_bar_p / eps_bar                (11)
    z_p     = trust-region (ObjT) or proximal (ObjP) closed form with + xi_p   (§3.4)
    lam_p  += rho (w - z_p)                                                    (4c)
  OutP (agents, then server, then dual): a proximal step from w^t, then z~_p = z_p + N(0, s^2)
  with Huang et al.'s decreasing variance; w from the z~_p; lam_p += rho (w - z~_p).

All R Monte-Carlo runs advance together along a leading axis ((R, J, K) arrays), and the agents
a rank hosts step together as one AgentBlock, an agents axis before it ((A, R, J, K)): records
stacked by record count (models.multinomial's stack_* kernels: each agent's own GEMMs and
reductions), noise for every (agent, run) pair drawn at once, ledgers charged as a block. Every
agent draws its noise from its own streams (seed, 'noise', agent, run) and the server sums the
agents' contributions in agent order (Gatherv; 'reduce' is an option), so results are bitwise
identical on any number of ranks and with any agents per rank.

Privacy comes from the configuration's contract (privacy.contract.Contract): every agent's release
path (its ledger, its noise streams) and its noise, from which the run reads eps_bar, the
per-iteration eps (`iteration_eps`: Laplace the noise's eps per release, OutP the eps whose
classical Gaussian at dp_delta is its noise), OutP's sigma (the noise's scale of the release's L2
sensitivity) and the delta each OutP release is stated at. Each release is one call of the block's
release path (BlockRelease.perturb): the ledgers charged, the noise drawn from the agents' streams,
the update computed from it, the audit tap shown what leaves the agents.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import time
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, cast

import numpy as np

from ..backend import backend, to_numpy
from ..comm.star import Star
from ..errors import NumericalError
from ..models import multinomial
from ..privacy import Event, Ledger, tap
from ..privacy.contract import Contract
from ..privacy.mechanisms import gaussian_noise, laplace_noise
from ..privacy.release import BlockRelease, OwnerRelease
from ..rng import agent_run_streams
from . import admm_steps as steps
from .common import (
    Checkpointed,
    ReleasePath,
    ResultRecord,
    agent_order_sum,
    gather_ledgers,
    load_checkpoint,
    save_checkpoint,
)
from .hooks import RunHooks

METHODS = ("objt", "objp", "outp")


@dataclasses.dataclass(frozen=True, kw_only=True)
class Settings:
    """The resolved knobs of one configuration (identical on every rank). The defaults here are
    the only ones: the job's [admm] keys take theirs from these fields."""

    method: str
    T: int  # iterations
    n: tuple[int, ...]  # records per agent
    J: int
    K: int
    seed: int = 0
    run_ids: tuple[int, ...] = (0,)
    record_every: int
    gamma: float = 1e-6
    rho_mode: str = "dynamic_1"  # dynamic_1 (21) | dynamic_2 ((21)/100) | static
    rho_static: float = 1.0
    rho_rule: str = ""  # where rho came from (the method entry's words; recorded)
    rho_c1: float = 2.0
    rho_c2: float = 5.0
    rho_tc: int = 10000
    prox_scale: float = 1.0  # a
    tr_schedule: str = "const"  # delta^t = a (the released code) | inv_sq (a/(t+1)^2, the prose)
    sens_mode: str = "global"  # global | bound (data-independent, certified) | local_max(_x2)
    row_bound: float = math.inf  # B of sens_mode = 'bound': every record's L2 norm <= B (public)
    outp_noise_std: str = "sigma"  # sigma (Huang et al.) | sigma_sq (the authors' code)
    outp_calibration: str = "auto"  # OutP Gaussian calibration of the paper rule (PerIteration)
    reg_grad: str = "consistent"  # consistent: 2 (gamma/P) z_p | code: 2 gamma w
    w_bound: float = math.inf  # W = [-B, B]^(J x K); inf: unconstrained (the final code)
    dp_delta: float = 1e-6  # OutP's step schedule (Huang et al.); the paper rule's delta
    budget_eps: float = math.inf  # the paper rule's cap of each agent's total (basic composition)
    aggregate: str = "gather"  # gather (bitwise rank-invariant) | reduce
    backend: str = "numpy"  # array backend of the records' kernels (mpi_dp.backend)

    @property
    def P(self) -> int:
        return len(self.n)

    @property
    def I(self) -> int:  # noqa: E743 (the spec's name for the total sample count)
        return int(sum(self.n))

    @property
    def runs(self) -> int:
        return len(self.run_ids)

    def noise_rho(self, eps_bar: float) -> float:
        """The noise term of rho = 'auto' at the per-iteration eps_bar (0 without noise, and for
        OutP)."""
        if math.isinf(eps_bar) or self.method == "outp":
            return 0.0
        mode = "bound" if math.isfinite(self.row_bound) else "global"
        sens = steps.sensitivity(None, self.I, mode, self.J, self.row_bound)
        return float(sens) / eps_bar * math.sqrt(self.J * self.K / self.P)

    @property
    def box(self) -> float | None:
        """B of W = [-B, B]^(J x K), None when unconstrained."""
        return None if math.isinf(self.w_bound) else self.w_bound

    def rho(self, t: int, eps_bar: float) -> float:
        """rho^t at the per-iteration eps_bar (`iteration_eps`): (21), (21)/100 or a constant
        (App. A.9 variants); 'auto': rho_static (the smoothness bound) plus the noise's pull
        b sqrt(J K / P) (b the Laplace scale of ObjT/ObjP at the public sensitivity), so that
        the noise moves the averaged model by O(1)."""
        if self.rho_mode == "auto":
            return self.rho_static + self.noise_rho(eps_bar)
        return steps.rho_variant(t, self.rho_mode, self.rho_c1, self.rho_c2, self.rho_tc,
                                 eps_bar, static=self.rho_static)


def release_flags(s: Settings) -> dict[str, Any]:
    """What an agent's release path states of its events (privacy.contract.Contract.owner /
    block): OutP's sigma^2 convention is less noise than the rule's (uncertified); ObjT/ObjP's
    sensitivity is read from the data unless global or bound (data-dependent); the mechanism."""
    outp = s.method == "outp"
    return {"certified": s.outp_noise_std == "sigma" if outp else True,
            "data_dependent": not outp and s.sens_mode not in ("global", "bound"),
            "mechanism": "gaussian" if outp else "laplace"}


def iteration_eps(contract: Contract, s: Settings) -> float:
    """eps_bar, every agent's per-iteration eps, from its noise in `contract` (the agents share
    one plan): ObjT/ObjP the eps of one Laplace release, OutP the eps whose classical Gaussian
    sigma sqrt(2 ln(1.25/dp_delta)) / eps is the noise (a paper rule: the job's eps); inf
    without noise."""
    noise = contract.noise(0)
    if noise is None:
        return math.inf
    return noise.classical_eps(s.dp_delta) if s.method == "outp" else noise.eps_release


class Agent(Checkpointed, ReleasePath):
    """Agent p: holds its records, its local model z_p and dual lam_p for every run, and its
    release path in `contract` (`release`: its ledger, its noise streams (seed, 'noise', p,
    run)); it releases only the perturbed z_p (ObjT/ObjP) or z~_p (OutP), its ledger charged
    before the noise is drawn, a release past its plan or budget refused (BudgetExceededError).
    Its steps run as an AgentBlock (of the rank's agents, or of itself alone), which takes over
    its ledger and noise position and leaves them back (`write_back`)."""

    #: what a checkpoint holds to continue this agent bit for bit (with its release path's
    #: noise position: Checkpointed, NOISE = None)
    STATE = ("z", "lam", "ledger", "noise_mag", "scale", "z_change")
    NOISE = None

    def __init__(self, agent: int, X: np.ndarray, y: np.ndarray, s: Settings,
                 contract: Contract) -> None:
        self.agent = agent
        self.s = s
        self.contract = contract
        self.X = np.ascontiguousarray(X, dtype=np.float64)
        self.y = np.asarray(y).astype(np.int64)
        if self.y.size and (self.y.min() < 0 or self.y.max() >= s.K):
            raise ValueError(f"agent {agent}: labels outside 0..{s.K - 1}")
        self.n = self.X.shape[0]
        self.row_l1 = np.abs(self.X).sum(axis=1)
        shape = (s.runs, s.J, s.K)
        self.z = np.zeros(shape)
        self.lam = np.zeros(shape)
        self.release: OwnerRelease = contract.owner(agent, **release_flags(s))
        #: the noise position of its last restored state (None: its streams' start)
        self.noise_at: tuple | None = None
        # evaluation-only logs of the last iteration, per run
        self.noise_mag = np.zeros(s.runs)
        self.scale = np.zeros(s.runs)
        self.z_change = np.zeros(s.runs)

    def restore(self, st: dict) -> None:
        super().restore(st)
        self.noise_at = st["noise"]

    def contribution(self, rho: float) -> np.ndarray:
        """rho z_p - lam_p: what the server sums (R, J, K)."""
        return steps.server_contribution(rho, self.z, self.lam)

    def next_event(self, t: int, rho: float) -> Event:
        """The event of this agent's release at iteration t (its eps does not depend on the data:
        a data-dependent sensitivity moves the noise scale with it)."""
        return AgentBlock([self], self.s).next_events(t, rho)[0]

    # The steps of this agent alone: a block of one (the block's steps are the agents' own).
    def step_objective(self, w: np.ndarray, t: int, rho: float) -> None:
        """ObjT / ObjP agent update (lines 2-5 of iteration t) and the dual update."""
        self._alone(lambda b: b.step_objective(w, t, rho))

    def step_outp(self, w: np.ndarray, t: int, rho: float) -> None:
        """OutP agent update from w^t: proximal step, then Gaussian output noise."""
        self._alone(lambda b: b.step_outp(w, t, rho))

    def outp_dual(self, w: np.ndarray, rho: float) -> None:
        self.lam = steps.dual_update(self.lam, rho, w, self.z)

    def metrics(self, w: np.ndarray) -> np.ndarray:
        """Evaluation-only per-run values at w: [loss sum, ||w - z_p||_1, noise_mag, scale,
        z_change, misclassified own records], shape (N_METRICS R,)."""
        return AgentBlock([self], self.s).metrics(w)[0]

    def _alone(self, step) -> None:
        block = AgentBlock([self], self.s)
        step(block)
        block.write_back()

    def label_counts(self) -> np.ndarray:
        """Evaluation-only: records of each class 0..K-1 among this agent's records (K,)."""
        return np.bincount(self.y, minlength=self.s.K).astype(np.float64)


#: per-run values in Agent.metrics
N_METRICS = 6
#: Most numbers of one stacked (agents x R x K x records) block (multinomial.CHUNK_ELEMS, about a
#: core's L2 cache): a size group's agents are stepped in batches of this size.
BATCH_ELEMS = multinomial.CHUNK_ELEMS
#: Most numbers (n x J) in an agent's records for it to be stacked: a larger agent's own work
#: dwarfs the Python overhead of stepping it alone, so it keeps the per-agent kernels (and its
#: records are not copied into a stack).
STACK_MAX_ELEMS = 2**16


class Stacks:
    """The records of a list of agents laid out for models.multinomial's stacked kernels at up
    to `runs` runs: agents of equal record count n (`multinomial.stackable`, small enough) in
    `batches` of (positions in the list (B,), X (B, n, J), y (B, n), row_l1 (B, n)); the others
    (`single`: positions) one agent at a time. An agent's results do not depend on its batch.

    On a device backend (`backend`, mpi_dp.backend) the records also move to the device, once:
    `batch(j)` and `alone(i)` give the arrays the kernels read (the host's for NumPy)."""

    def __init__(self, agents: Sequence[Agent], runs: int, K: int,
                 backend_name: str = "numpy") -> None:
        by_n: dict[int, list[int]] = {}
        self.single: list[int] = []
        for i, a in enumerate(agents):
            if multinomial.stackable(a.n, runs, K) and a.X.size <= STACK_MAX_ELEMS:
                by_n.setdefault(a.n, []).append(i)
            else:
                self.single.append(i)
        self.batches: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = []
        for n, pos in sorted(by_n.items()):
            step = max(1, BATCH_ELEMS // (runs * K * n))
            for lo in range(0, len(pos), step):
                p = np.array(pos[lo : lo + step], dtype=np.intp)
                self.batches.append((p, np.stack([agents[i].X for i in p]),
                                     np.stack([agents[i].y for i in p]).astype(np.intp),
                                     np.stack([agents[i].row_l1 for i in p])))
        self.K = K
        self._labels: dict[tuple[int, int], np.ndarray] = {}
        bk = backend(backend_name)
        self.on_host = bk.is_numpy
        self._dev_batches = [] if bk.is_numpy else [
            (bk.asarray(X), bk.asarray(y.astype(np.int64)), bk.asarray(l1))
            for _, X, y, l1 in self.batches]
        self._dev_single = {} if bk.is_numpy else {
            i: (bk.asarray(agents[i].X), bk.asarray(agents[i].y), bk.asarray(agents[i].row_l1))
            for i in self.single}
        self._agents = agents

    def batch(self, j: int) -> tuple:
        """Batch j's (X, y, row_l1) where the kernels read them (the device's or the host's)."""
        return self.batches[j][1:] if self.on_host else self._dev_batches[j]

    def alone(self, i: int) -> tuple:
        """Single agent i's (X, y, row_l1) where the kernels read them."""
        if self.on_host:
            a = self._agents[i]
            return a.X, a.y, a.row_l1
        return self._dev_single[i]

    def label_index(self, j: int, R: int) -> np.ndarray | None:
        """multinomial.stack_label_index of batch j at R runs (made once, kept); None on a
        device backend, whose kernels select the labels through a mask."""
        if not self.on_host:
            return None
        idx = self._labels.get((j, R))
        if idx is None:
            idx = self._labels[(j, R)] = multinomial.stack_label_index(self.batches[j][2], R,
                                                                       self.K)
        return idx


class AgentBlock:
    """The agents a rank hosts as one block (DESIGN.md, 'A rank's agents are one block'): their
    models z and duals lam stacked (A, R, J, K) in agent order, their records in `Stacks`, their
    releases through one release path of `contract` (`Contract.block`: every agent's ledger, the
    agents' own noise streams as one agent-major RunStreams, row a R + r: agent a's stream of run
    r, bit for bit its own), every ledger charged before the block's noise is drawn. Each step is
    `Agent`'s as array work over the block; each agent's arithmetic is what it does alone, so
    results are bitwise the same on any number of ranks. The block takes over each agent's
    ledger and noise position; `members()` are the agents as checkpointed owners;
    `write_back()` leaves each Agent object its state. `contract`: the configuration's (default:
    the agents'; a block without agents and contract releases nothing)."""

    def __init__(self, agents: Sequence[Agent], s: Settings,
                 contract: Contract | None = None) -> None:
        self.agents, self.s = list(agents), s
        A, R = len(self.agents), s.runs
        if contract is None and self.agents:
            contract = self.agents[0].contract
        self.stacks = Stacks(self.agents, R, s.K, s.backend)
        self.n = np.array([a.n for a in self.agents], dtype=np.int64)

        def stack(name: str, shape: tuple[int, ...]) -> np.ndarray:
            return (np.stack([np.asarray(getattr(a, name), dtype=np.float64)
                              for a in self.agents]) if A else np.zeros((0, *shape)))

        self.z, self.lam = stack("z", (R, s.J, s.K)), stack("lam", (R, s.J, s.K))
        self.noise_mag, self.scale = stack("noise_mag", (R,)), stack("scale", (R,))
        self.z_change = stack("z_change", (R,))
        #: eps_bar, the agents' per-iteration eps (their noise's: `iteration_eps`)
        self.eps_bar = math.inf if contract is None else iteration_eps(contract, s)
        self.release: BlockRelease = (
            BlockRelease([]) if contract is None else
            contract.block([a.agent for a in self.agents], **release_flags(s)))
        if A:  # each agent's ledger and noise position (seeded once, for the whole block)
            self.release.restore_ledgers([a.ledger for a in self.agents])
            moved = [(i, a.noise_at) for i, a in enumerate(self.agents) if a.noise_at is not None]
            if moved:
                gens = self.release.streams
                for i, (h, lo) in moved:
                    gens.h[i * R : (i + 1) * R], gens.lo[i * R : (i + 1) * R] = h, lo
        self._members: list[_Member] | None = None

    def __len__(self) -> int:
        return len(self.agents)

    def rho(self, t: int) -> float:
        """rho^t of the settings at the agents' eps_bar."""
        return self.s.rho(t, self.eps_bar)

    # -- checkpoints ---------------------------------------------------------------------------
    def state(self, i: int) -> dict:
        """Agent i's checkpoint state, as `Agent.state` gives it (its noise position: its rows of
        the block's streams)."""
        rows = slice(i * self.s.runs, (i + 1) * self.s.runs)
        gens = self.release.streams
        return {"z": self.z[i].copy(), "lam": self.lam[i].copy(),
                "ledger": self.release.owners[i].ledger, "noise_mag": self.noise_mag[i].copy(),
                "scale": self.scale[i].copy(), "z_change": self.z_change[i].copy(),
                "noise": (gens.h[rows].copy(), gens.lo[rows].copy())}

    def restore(self, i: int, st: dict) -> None:
        """Continue agent i from its checkpoint state `st` (`state`)."""
        rows = slice(i * self.s.runs, (i + 1) * self.s.runs)
        self.z[i], self.lam[i] = st["z"], st["lam"]
        self.noise_mag[i], self.scale[i], self.z_change[i] = (st["noise_mag"], st["scale"],
                                                              st["z_change"])
        self.release.owners[i].ledger = st["ledger"]
        self.agents[i].ledger = st["ledger"]
        gens = self.release.streams
        gens.h[rows], gens.lo[rows] = st["noise"]

    def members(self) -> list[_Member]:
        """The agents as checkpointed owners (`agent`, `state()`, `restore()`) backed by the
        block (common.save_checkpoint / load_checkpoint)."""
        if self._members is None:
            self._members = [_Member(self, i) for i in range(len(self))]
        return self._members

    def write_back(self) -> None:
        """Leave every Agent object its state (models, logs, noise position) from the block."""
        for i, a in enumerate(self.agents):
            a.restore(self.state(i))

    # -- the records' kernels ------------------------------------------------------------------
    def gradients(self, W: np.ndarray, terms: bool = False, shared: bool = False
                  ) -> tuple[np.ndarray, np.ndarray | None]:
        """Every agent's gradient sum (A, R, J, K) at its own model W[i] (W (A, R, J, K)) or
        (`shared`) at one W (R, J, K) for all, and with `terms` the per-run maximum of its
        sensitivity terms (A, R): `multinomial.grad_sum(_and_terms_max)` of each agent."""
        Wr = multinomial.as_runs(W) if shared else W
        A, (R, J, K) = len(self), Wr.shape[-3:]
        self._check_runs(R)
        G = np.empty((A, R, J, K))
        tmax = np.empty((A, R)) if terms else None
        for j, (pos, *_) in enumerate(self.stacks.batches):
            X, y, l1 = self.stacks.batch(j)
            g, tm = multinomial.stack_grad_sum(X, y, Wr if shared else Wr[pos], l1, terms,
                                               self.stacks.label_index(j, R))
            G[pos] = to_numpy(g)
            if terms:
                assert tmax is not None
                tmax[pos] = to_numpy(tm)
        for i in self.stacks.single:
            (X, y, l1), Wi = self.stacks.alone(i), Wr if shared else Wr[i]
            if terms:
                assert tmax is not None
                g, tm = multinomial.grad_sum_and_terms_max(X, y, Wi, l1)
                G[i], tmax[i] = to_numpy(g), to_numpy(tm)
            else:
                G[i] = to_numpy(multinomial.grad_sum(X, y, Wi))
        return G, tmax

    def _evaluate(self, W: np.ndarray, stacked, alone) -> np.ndarray:
        """(A, R) per-agent values of one model W (R, J, K) for all: `stacked` on each batch
        (given the batch's label index), `alone` on each remaining agent."""
        Wr = multinomial.as_runs(W)
        R = Wr.shape[0]
        self._check_runs(R)
        out = np.empty((len(self), R))
        for j, (pos, *_) in enumerate(self.stacks.batches):
            X, y, _ = self.stacks.batch(j)
            out[pos] = to_numpy(stacked(X, y, Wr, self.stacks.label_index(j, R)))
        for i in self.stacks.single:
            X, y, _ = self.stacks.alone(i)
            out[i] = to_numpy(alone(X, y, Wr))
        return out

    def _check_runs(self, R: int) -> None:
        """The stacks hold agents whose records are one chunk at up to s.runs models; more
        models would chunk them (another summation order)."""
        if R > self.s.runs:
            raise ValueError(f"models of {R} runs; this block is stacked for {self.s.runs}")

    def loss_sums(self, W: np.ndarray) -> np.ndarray:
        """Every agent's `multinomial.loss_sum` at W (R, J, K): (A, R)."""
        return self._evaluate(W, multinomial.stack_loss_sum, multinomial.loss_sum)

    def error_counts(self, W: np.ndarray) -> np.ndarray:
        """Every agent's misclassified records at W (R, J, K) (`multinomial.errors`): (A, R)."""
        return self._evaluate(W, lambda X, y, Wr, _: multinomial.stack_errors(X, y, Wr),
                              multinomial.errors)

    def label_counts(self) -> np.ndarray:
        """Evaluation-only: records of each class 0..K-1 of every agent (A, K)."""
        K = self.s.K
        out = np.empty((len(self), K))
        for pos, _, y, _ in self.stacks.batches:
            out[pos] = (y[:, :, None] == np.arange(K)).sum(axis=1)
        for i in self.stacks.single:
            out[i] = self.agents[i].label_counts()
        return out

    # -- the method's steps --------------------------------------------------------------------
    def contributions(self, rho: float) -> np.ndarray:
        """Every agent's rho z_p - lam_p, (A, R J K): what the server sums."""
        s = self.s
        return steps.server_contribution(rho, self.z, self.lam).reshape(len(self),
                                                                         s.runs * s.J * s.K)

    def step_objective(self, w: np.ndarray, t: int, rho: float) -> None:
        """ObjT / ObjP update of every agent (lines 2-5 of iteration t) and the dual update."""
        s, A, R = self.s, len(self), self.s.runs
        if not A:
            return
        G, terms_max = self.gradients(self.z, terms=s.sens_mode not in ("global", "bound"))
        g = steps.agent_gradient(G, s.I, s.gamma, s.P, self.z, w, s.reg_grad)
        # terms_max = max_i ||x_i||_1 ||h_i - y_i||_1 over each agent's records (per run)
        sens = np.broadcast_to(np.asarray(steps.sensitivity(terms_max, s.I, s.sens_mode, s.J,
                                                            s.row_bound)), (A, R))
        # (11c) at the contract's eps_bar: b = Delta_bar / eps_bar, per agent and run
        b = np.broadcast_to(np.asarray(steps.laplace_scale(sens, self.eps_bar)), (A, R))
        made: dict[str, np.ndarray] = {}

        def update(noise: np.ndarray) -> np.ndarray:
            xi = noise.reshape(self.z.shape)
            if s.method == "objt":
                delta = steps.delta_objt(t, s.prox_scale, s.tr_schedule)
                made["z"] = steps.objt_update(w, self.lam, g, self.z, xi, rho, delta, s.box)
            else:
                eta = steps.eta_objp(t, s.prox_scale)
                made["z"] = steps.objp_update(w, self.lam, g, self.z, xi, rho, eta, s.box)
            # the audit sees the perturbed linear term g + xi: z_new (what the server gets) is
            # a function of it and of w, lam, z, which the server already knows
            return (g + xi).reshape(A, R, s.J * s.K)

        _, xi, _, _ = self.release.perturb(sens, s.J * s.K, update, b)
        self._finish(made["z"], xi, b, "laplace")
        self.lam = steps.dual_update(self.lam, rho, w, self.z)

    def outp_params(self, t: int, rho: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """OutP at iteration t, per agent (A,): 1/eta_p^t, the release's L2 sensitivity
        (computed once per record count) and the noise std actually used: each agent's noise's
        sigma of that sensitivity (its release path's scale), squared under outp_noise_std =
        'sigma_sq'."""
        s = self.s
        sizes, inverse = np.unique(self.n, return_inverse=True)
        vals = np.empty((sizes.size, 2))
        for j, n in enumerate(sizes.tolist()):
            inv_eta = steps.outp_inv_eta(t, s.prox_scale, n, self.eps_bar, s.dp_delta)
            vals[j] = inv_eta, steps.outp_l2_sensitivity(rho, inv_eta)
        per = vals[inverse.reshape(-1)]
        sigma = self.release.scales(per[:, 1]) if len(self) else np.zeros(0)
        # sigma is 1-D (one per agent), so the std is an array too
        std = cast(np.ndarray, steps.outp_noise_std(sigma, s.outp_noise_std))
        return per[:, 0], per[:, 1], std

    def step_outp(self, w: np.ndarray, t: int, rho: float) -> None:
        """OutP update of every agent from w^t: proximal step, then Gaussian output noise (each
        release stated at its noise's delta)."""
        s, A, R = self.s, len(self), self.s.runs
        if not A:
            return
        G, _ = self.gradients(self.z)
        per_agent = (A, 1, 1, 1)
        # local average, regulariser at w^t
        g = steps.outp_gradient(G, self.n.astype(np.float64).reshape(per_agent), s.gamma, w)
        inv_eta, sens, std = self.outp_params(t, rho)
        z_new = steps.outp_update(w, self.lam, g, self.z, rho, inv_eta.reshape(per_agent))
        released, noise, _, _ = self.release.perturb(
            sens, s.J * s.K, lambda nz: z_new.reshape(A, R, s.J * s.K) + nz, std,
            mechanism="gaussian")
        self._finish(released.reshape(self.z.shape), noise, np.repeat(std, R).reshape(A, R),
                     "gaussian")

    def outp_dual(self, w: np.ndarray, rho: float) -> None:
        self.lam = steps.dual_update(self.lam, rho, w, self.z)

    def next_events(self, t: int, rho: float) -> list[Event]:
        """Every agent's event of its release at iteration t, as its release path states it
        (its eps does not depend on the data: a data-dependent sensitivity moves the noise
        scale with it)."""
        owners = self.release.owners
        if self.s.method == "outp":
            _, sens, std = self.outp_params(t, rho)
            return [o.event(float(x), float(sd)) for o, x, sd in zip(owners, sens, std,
                                                                      strict=True)]
        scale = 0.0 if math.isinf(self.eps_bar) else 1.0 / self.eps_bar
        return [o.event(1.0, scale) for o in owners]

    def can_release(self, t: int, rho: float) -> bool:
        """Whether every agent's ledger has room for its release at iteration t."""
        return all(o.ledger.can_charge(e) for o, e in zip(self.release.owners,
                                                          self.next_events(t, rho), strict=True))

    def _finish(self, z_new: np.ndarray, noise: np.ndarray, scale: np.ndarray, draw: str
                ) -> None:
        """The agents' new models and the evaluation-only logs of their step (noise_mag: the
        mean |noise|, added in the order of the agent's own draw: `_run_major`)."""
        A, R, JK = len(self), self.s.runs, self.s.J * self.s.K
        ok = np.isfinite(z_new).reshape(A, R * JK).all(axis=1)
        if not np.all(ok):
            agent = self.agents[int(np.argmin(ok))].agent
            raise NumericalError(f"agent {agent}: non-finite local model (diverging?)")
        noise = noise.reshape(A, R, JK)
        self.noise_mag = np.empty((A, R))
        moved = (np.all(scale != 0, axis=1) if _run_major(R, JK, draw)
                 else np.zeros(A, dtype=bool))
        if not moved.all():
            self.noise_mag[~moved] = np.abs(noise[~moved]).mean(axis=2)
        if moved.any():  # as the agent's own (R, JK) draw, laid out runs fastest
            t = np.ascontiguousarray(noise[moved].transpose(0, 2, 1)).transpose(0, 2, 1)
            self.noise_mag[moved] = np.abs(t).mean(axis=2)
        self.scale = np.asarray(scale, dtype=np.float64)
        self.z_change = np.abs(z_new - self.z).reshape(A, R, JK).mean(axis=2)
        self.z = z_new

    def metrics(self, w: np.ndarray) -> np.ndarray:
        """Every agent's `Agent.metrics` at w, (A, N_METRICS R) (evaluation-only)."""
        A, R = len(self), self.s.runs
        loss = self.loss_sums(w)
        cv = np.abs(w - self.z).reshape(A, R, self.s.J * self.s.K).sum(axis=2)
        wrong = self.error_counts(w).astype(np.float64)
        return np.concatenate([loss, cv, self.noise_mag, self.scale, self.z_change, wrong],
                              axis=1)


@dataclasses.dataclass(frozen=True)
class _Member:
    """Agent i of a block as a checkpointed owner (its state lives in the block)."""

    block: AgentBlock
    i: int

    @property
    def agent(self) -> int:
        return self.block.agents[self.i].agent

    def state(self) -> dict:
        return self.block.state(self.i)

    def restore(self, st: dict) -> None:
        self.block.restore(self.i, st)


@functools.lru_cache(maxsize=64)
def _run_major(runs: int, size: int, draw: str) -> bool:
    """Whether an agent drawing its (runs, size) noise alone from its own streams, every run at a
    nonzero scale, gets it laid out runs fastest (not C order: pcg draws many rows of few
    positions column by column). A mean over such an array adds in another order than over a C
    array, so a block reproduces an agent's noise_mag from that layout (asked of the draw
    itself, not assumed)."""
    gens = agent_run_streams(0, "noise", [0], range(runs))
    x = (laplace_noise if draw == "laplace" else gaussian_noise)(gens, 1.0, size)
    return not x.flags.c_contiguous


def as_block(agents: Sequence[Agent] | AgentBlock, s: Settings,
             contract: Contract | None = None) -> AgentBlock:
    """A block of `agents` under `contract` (default: the agents'; an AgentBlock passes
    through)."""
    return agents if isinstance(agents, AgentBlock) else AgentBlock(agents, s, contract)


def baselines(star: Star, agents: Sequence[Agent] | AgentBlock, s: Settings,
              test: tuple | None) -> dict[str, float] | None:
    """Evaluation-only trivial predictors (collective; the server gets them, others None).

    majority_label: the most frequent training label (the smallest on a tie, as argmax); the
    error of always predicting it and of w = 0 (all scores 0: argmax picks class 0) on the
    training records (train_error_*) and on the test set (test_error_*, when there is one).
    Label counts are added in agent order.
    """
    local = as_block(agents, s).label_counts()
    g = star.gather_agents(local, (s.K,))
    if g is None:
        return None
    counts = agent_order_sum(g)
    maj = int(np.argmax(counts))
    out = {"majority_label": float(maj), "train_error_majority": 1.0 - counts[maj] / s.I,
           "train_error_zero": 1.0 - counts[0] / s.I}
    if test is not None and len(test[1]):
        y = np.asarray(test[1])
        out["test_error_majority"] = float(np.mean(y != maj))
        out["test_error_zero"] = float(np.mean(y != 0))
    return out


def reference_optimum(star: Star, agents: Sequence[Agent] | AgentBlock, s: Settings,
                      max_iter: int,
                      tol: float = 1e-8) -> tuple[np.ndarray, int, float]:
    """The non-private optimum w* of F (the same objective, box included) over every agent's
    records (collective; evaluation-only: it reads un-noised data), with the iterations taken
    and the final projected gradient's largest entry. One L-BFGS-B run (gradient `tol`, at most
    `max_iter` iterations: a full pass over the records each) on every rank in lockstep: each
    evaluation sums the agents' loss and gradient in agent order on the server and broadcasts
    them, so every rank takes the same steps and w* is the same bits on any number of ranks."""
    import scipy.optimize

    from ..models.reference import projected_gradient

    J, K, size = s.J, s.K, 1 + s.J * s.K
    block = as_block(agents, s)

    def fg(w: np.ndarray) -> tuple[float, np.ndarray]:
        W = np.asarray(w, dtype=np.float64).reshape(J, K)
        local = np.empty((len(block), size))
        local[:, 0] = block.loss_sums(W)[:, 0]
        local[:, 1:] = block.gradients(W, shared=True)[0].reshape(len(block), J * K)
        parts = star.gather_agents(local, (size,))
        total = np.empty(size)
        if parts is not None:
            total[:] = agent_order_sum(parts)
        star.bcast(total)
        f = total[0] / s.I + s.gamma * float(np.sum(W * W))
        return f, total[1:] / s.I + 2.0 * s.gamma * w

    bound = math.inf if s.box is None else float(s.box)
    res = scipy.optimize.minimize(
        fg, np.zeros(J * K), jac=True, method="L-BFGS-B",
        bounds=None if math.isinf(bound) else [(-bound, bound)] * (J * K),
        options={"maxiter": max_iter, "maxfun": 2 * max_iter, "ftol": 1e-13, "gtol": tol,
                 "maxcor": 30})
    pg = projected_gradient(res.x, res.jac, bound)
    return (np.asarray(res.x, dtype=np.float64).reshape(J, K), int(res.nit),
            float(np.max(np.abs(pg), initial=0.0)))


def train_error(star: Star, agents: Sequence[Agent] | AgentBlock, s: Settings, W: np.ndarray
                ) -> float | None:
    """Training error of one model W over every agent's records (collective; the server gets
    it, others None; evaluation-only)."""
    local = as_block(agents, s).error_counts(W).astype(np.float64)
    parts = star.gather_agents(local.reshape(len(local), 1), (1,))
    return None if parts is None else float(agent_order_sum(parts)[0] / s.I)


def _server_model(star: Star, block: AgentBlock, s: Settings, rho: float) -> np.ndarray:
    """w = Proj_W(U / (P rho)), U = sum_p (rho z_p - lam_p) in agent order; Bcast to all ranks."""
    shape = (s.runs, s.J, s.K)
    size = s.runs * s.J * s.K
    local = block.contributions(rho)
    w = np.empty(shape)
    if s.aggregate == "gather":
        parts = star.gather_agents(local, (size,))
        if parts is not None:
            w[:] = steps.server_average(agent_order_sum(parts).reshape(shape), s.P, rho, s.box)
    else:
        total = star.reduce_sum(agent_order_sum(local) if len(block) else np.zeros(size))
        if total is not None:
            w[:] = steps.server_average(total.reshape(shape), s.P, rho, s.box)
    return star.bcast(w)


def iterate(star: Star, agents: Sequence[Agent] | AgentBlock, s: Settings, w: np.ndarray,
            t: int, rho: float) -> np.ndarray:
    """Iteration t (collective): the server's and the agents' updates of the method; returns the
    server's model of the iteration (ObjT/ObjP: computed from the agents' states before their
    step; OutP: from their releases after their step from the previous w). The hosted agents
    step as one AgentBlock; given a list of Agents, a block of them is made for this iteration
    and their states written back (slower: keep the block across iterations)."""
    if not isinstance(agents, AgentBlock):
        block = AgentBlock(agents, s)
        w = iterate(star, block, s, w, t, rho)
        block.write_back()
        return w
    block = agents
    if s.method == "outp":
        block.step_outp(w, t, rho)
        w = _server_model(star, block, s, rho)
        block.outp_dual(w, rho)
    else:
        w = _server_model(star, block, s, rho)
        block.step_objective(w, t, rho)
    return w


@dataclasses.dataclass(frozen=True)
class AdmmResult(ResultRecord):
    """What a configuration leaves on the server (`run_config`).

    final: the server's model w (R, J, K); ledgers: every agent's ledger in agent order;
    iterations: releases of each agent (the most over runs); eps_total_basic, delta_total_basic:
    each agent's basic composition of its releases (the most over runs); ended_at, end_reason:
    the iteration the run stopped at and why; seconds: wall time of the run; baselines: the
    evaluation-only trivial predictors (`baselines`; empty in an audit).
    """

    KEYS: ClassVar[Mapping[str, str]] = {"models/final": "final"}

    final: np.ndarray
    ledgers: list[Ledger] | np.ndarray  # or their privacy/ledger rows (ledger_delta)
    iterations: np.ndarray
    eps_total_basic: np.ndarray
    delta_total_basic: np.ndarray
    ended_at: int
    end_reason: str
    seconds: float
    baselines: dict[str, float]


def run_config(star: Star, agents: Sequence[Agent] | AgentBlock, s: Settings,
               contract: Contract, test: tuple | None,
               recorder=None, label: str = "", progress: bool = True,
               hooks: RunHooks | None = None, ledger_delta: float | None = None
               ) -> AdmmResult | None:
    """Run one configuration (collective) under `contract` (privacy.contract: every agent's
    release path and noise; eps_bar is its per-iteration eps, `iteration_eps`, on every rank).
    `test` = (X, y) on the server (test error of w).
    `ledger_delta`: the ledgers come back as their privacy/ledger rows, composed on the ranks
    hosting the agents (accountants.in_agent_order).
    `hooks` (the runner's RunHooks) record, report progress and checkpoint; without them they
    are built from `recorder`, `label` and `progress`.

    Returns, on the server, the final models, the privacy accounting and (outside an audit) the
    evaluation-only trivial baselines (`baselines`): an AdmmResult; None elsewhere.
    """
    hooks = RunHooks.of(hooks, recorder, label, star.comm, progress)
    block = as_block(agents, s, contract)
    eps_bar = iteration_eps(contract, s)
    noise = contract.noise(0)
    # the basic cap of the agents' ledgers (a paper rule's budget_eps; none: the plan limits)
    budget = math.inf if noise is None else noise.ledger_budget()[0]
    R = s.runs
    w = np.zeros((R, s.J, s.K))
    t0 = time.perf_counter()
    hooks.start(s.T, "iteration")
    trivial = baselines(star, block, s, test) if tap.evaluating() else None

    def record(k: int, rho: float) -> None:
        if not tap.evaluating():  # an audit: evaluation-only, nothing here leaves an owner
            return
        vals = block.metrics(w)
        g = star.gather_agents(vals, (N_METRICS * R,))
        if g is None:
            return
        tot = agent_order_sum(g).reshape(N_METRICS, R)
        train_cost = tot[0] / s.I + s.gamma * np.einsum("rjk,rjk->r", w, w)
        test_err = (multinomial.errors(test[0], test[1], w) / len(test[1])
                    if test is not None else np.full(R, np.nan))
        hooks.record(k, {"test_error": test_err, "train_cost": train_cost,
                         "consensus": tot[1] / s.P, "noise_mag": tot[2] / s.P,
                         "lap_scale": tot[3] / s.P, "z_change": tot[4] / s.P,
                         "rho": rho, "train_error": tot[5] / s.I})
        hooks.progress(k, lambda: f"mean test error {np.mean(test_err):.4f}, CV "
                       f"{np.mean(tot[1]) / s.P:.3g}, "
                       f"{(time.perf_counter() - t0) / max(k, 1):.3f} s/iter")

    saved = load_checkpoint(star, hooks, block.members(), clock="t")
    k0 = 0
    if saved is None:
        record(0, s.rho(0, eps_bar))
    else:  # resume: the server's model (the agents' states, ledgers and noise are restored)
        k0, w = saved["k"], saved["w"].copy()
    ended_at, end_reason = s.T, "reached T"
    for t in range(k0, s.T):
        rho = s.rho(t, eps_bar)
        if math.isfinite(budget) and not star.all_true(block.can_release(t, rho)):
            ended_at = t
            end_reason = (f"ended at t={t}: an agent's budget eps={budget:g} has no room "
                          "for another release (basic composition)")
            if t % s.record_every != 0:
                record(t, s.rho(max(t - 1, 0), eps_bar))
            break
        w = iterate(star, block, s, w, t, rho)
        k = t + 1
        if k % s.record_every == 0 or k == s.T:
            record(k, rho)
            save_checkpoint(star, hooks, k, s.T, block.members(), w=w)
    block.write_back()
    mine = [a.ledger for a in block.agents]
    # each agent's releases and basic totals (the most over runs), gathered beside its ledger
    spent = star.gather_objects((np.array([lg.agent for lg in mine], dtype=np.int64),
                                 np.array([int(lg.releases.max()) for lg in mine], np.int64),
                                 np.array([lg.spent_eps.max() for lg in mine], np.float64),
                                 np.array([lg.spent_delta.max() for lg in mine], np.float64)))
    ledgers = gather_ledgers(star, mine, ledger_delta)
    if not star.is_learner:
        return None
    assert ledgers is not None  # the learner gathers them
    agent, iters, eps_b, delta_b = (np.concatenate(c) for c in zip(*spent, strict=True))
    order = np.argsort(agent, kind="stable")
    return AdmmResult(final=w, ledgers=ledgers, iterations=iters[order],
                      eps_total_basic=eps_b[order], delta_total_basic=delta_b[order],
                      ended_at=ended_at, end_reason=end_reason,
                      seconds=time.perf_counter() - t0, baselines=trivial or {})

