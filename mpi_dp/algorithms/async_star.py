"""Asynchronous DP learning on a star: Algorithm 1 of [ASYNC] (seed 000).

Spec: specs/async-star-cost-of-privacy.md. At iteration k the learner serves one owner i_k:
  theta_bar = (theta_L + theta_loc[i]) / 2                                          (6)
  owner i answers r = Q_i(theta_bar) + Laplace noise of scale b_i                   (3), (4)
  theta_loc[i] = Pi(theta_bar - a_own (grad g(theta_bar) / (2N) + (n_i/n) r))        (5)
  theta_L      = Pi(theta_bar - a_ctr grad g(theta_bar))                             (7)
with a_own = N rho / (T^2 lam) and a_ctr = rho / (2 T^2 lam) (proof, default) or
(N-1) rho / (N T^2 lam) (as printed). Owner i answers at most m_i times (its cap: the method
entry's choice, from the public schedule by default); it clips, and its release path (the
configuration's privacy contract) charges its ledger, draws i.i.d. Laplace noise of its scale b_i
for m_i answers and shows the audit tap, in that order; it declines once its answers are spent.

Modes: `replay` (a seeded schedule; each of the R vectorised runs has its own, and every owner
serves the batch of runs that picked it in one pass) and `live` (owners' Poisson clocks tick in
wall time; all runs follow the one realised schedule, which is logged and can be replayed).

Checkpoints inside a configuration (resume bit for bit): replay mode only. Live mode is driven by
wall clocks, so a stopped live configuration is run again from its start.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Mapping
from typing import ClassVar

import numpy as np
import scipy.sparse as sp

from ..backend import backend, to_numpy
from ..comm import stop
from ..comm.p2p_star import ANSWERED, DECLINED, LAST_ANSWER, OwnerClocks, P2PStar
from ..comm.schedule import LoggedSchedule, Scheduler
from ..comm.star import Star
from ..errors import JobError, NumericalError
from ..models import kernels, linear
from ..privacy import Ledger, l1_sensitivity_mean, tap
from ..privacy.calibration import Sensitivity
from ..privacy.contract import Contract
from ..privacy.release import OwnerRelease
from ..rng import LEARNER, stream
from .agent_block import AgentBlock
from .common import (
    Checkpointed,
    EvalSet,
    LocalShard,
    Oracle,
    Reference,
    ReleasePath,
    ResultRecord,
    agent_order_sum,
    gather_ledgers,
    load_checkpoint,
)
from .hooks import RunHooks

#: decline reasons recorded in schedule/declines
RETIRED, REFUSED = 1, 2
REASONS = {RETIRED: "answered its last allowed query (budget spent); taken out of the schedule",
           REFUSED: "declined a query: its budget was already spent"}
DECLINE_DTYPE = np.dtype([("run", "i8"), ("k", "i8"), ("owner", "i8"), ("time", "f8"),
                          ("reason", "i8")])


@dataclasses.dataclass(frozen=True)
class Settings:
    """The resolved knobs of one configuration (identical on every rank)."""

    T: int
    loss: str
    lam: float  # sigma, the modulus of g = lam/2 ||theta||^2
    theta_max: float
    theta0: float
    init: str  # "const" | "uniform"
    xi: float
    clip: bool
    rho: float
    central_step: str  # "proof" | "printed"
    eps: tuple[float, ...]
    n: tuple[int, ...]
    caps: tuple[int, ...]  # answers each owner gives at most (m_i; T by default)
    p: int
    seed: int
    run_ids: tuple[int, ...]
    record_every: int = 1
    mode: str = "replay"
    scheduler: str = "poisson"
    rates: tuple[float, ...] = ()
    protocol: str = "virtual"
    clock_unit_s: float = 0.01
    poll_interval_s: float = 5e-4
    noise_shape: str = "iid"
    dp_valid: bool = True
    backend: str = "numpy"  # array backend of the owners' clipped gradient passes

    @property
    def N(self) -> int:
        return len(self.n)

    @property
    def runs(self) -> int:
        return len(self.run_ids)

    @property
    def n_total(self) -> int:
        return int(sum(self.n))

    @property
    def a_own(self) -> float:
        return step_constants(self.N, self.T, self.rho, self.lam, self.central_step)[0]

    @property
    def a_ctr(self) -> float:
        return step_constants(self.N, self.T, self.rho, self.lam, self.central_step)[1]

    @property
    def certified(self) -> bool:
        """Whether an owner's answers have the stated guarantee (clipped, i.i.d. noise)."""
        return self.dp_valid and self.clip and self.noise_shape != "scalar"


def lap_scales(contract: Contract, s: Settings) -> np.ndarray:
    """b_i of every participating owner: its noise for a mean of n_i gradients clipped to xi
    (0: no noise)."""
    out = np.zeros(s.N)
    for i in range(s.N):
        noise = contract.noise(i)
        if noise is not None:
            out[i] = noise.scale(Sensitivity.mean(s.xi, s.n[i]))
    return out


def step_constants(N: int, T: int, rho: float, lam: float, central: str) -> tuple[float, float]:
    """(a_own, a_ctr): a_own = N rho/(T^2 lam); a_ctr = rho/(2 T^2 lam) [proof] or
    (N-1) rho/(N T^2 lam) [as printed in (7)]."""
    a_own = N * rho / (T**2 * lam)
    if central == "proof":
        return a_own, rho / (2 * T**2 * lam)
    if central == "printed":
        return a_own, (N - 1) * rho / (N * T**2 * lam)
    raise ValueError(f"central step must be 'proof' or 'printed', not {central!r}")


def default_rho(gamma: float, T: int, lam: float, L: float) -> float:
    """rho giving the local gain gamma = a_own (n_i/n) L on a visit (equal sizes): gamma T^2 lam/L."""
    return gamma * T**2 * lam / L


def initial_models(s: Settings) -> np.ndarray:
    """(R, p): theta0 everywhere, or U[0,1)^p per run from the stream (seed, 'init', LEARNER, run)."""
    if s.init == "uniform":
        return np.array([stream(s.seed, "init", LEARNER, r).random(s.p) for r in s.run_ids])
    return np.full((s.runs, s.p), s.theta0)


class DataOwner(Checkpointed, ReleasePath):
    """Owner i: clips, adds i.i.d. Laplace noise, charges its per-run ledger, declines when spent.

    `answer` is the only way anything about its records leaves it; the clean gradient, the noise
    and the clip counts stay here (clip counts are copied out after the run, evaluation-only).
    It answers at most `cap` (m_i) times per run, each answer a release of eps_i / m_i.

    Hot path (squared loss, dense records, clipping on, few records x runs: the live benchmark's
    case): the clipped gradient sum and the noisy answer are computed by mpi_dp.models.kernels into
    buffers kept per row count, and the ledger is charged the owner's one precomputed event;
    every other case goes through models.linear and privacy.laplace_mechanism. Both paths clip,
    charge the ledger, then draw the noise, in that order, and give the same numbers.
    """

    STATE = ("ledger", "clipped")
    NOISE = None  # the release path's streams

    def __init__(self, shard: LocalShard, release: OwnerRelease, cap: int, s: Settings) -> None:
        self.shard = shard
        self.agent = shard.agent
        self.loss = s.loss
        self.xi = s.xi if s.clip else math.inf
        self.cap = int(cap)
        self.release = release
        self.lap_scale = release.scale(Sensitivity.mean(s.xi, shard.n))
        self.sensitivity = l1_sensitivity_mean(s.xi, shard.n)  # replace-one, clipped to xi
        self.certified = s.dp_valid and s.clip
        self.scalar_noise = s.noise_shape == "scalar"
        self.clipped = np.zeros(s.runs)  # records clipped, summed over this owner's answers
        self.p = s.p
        self.n = shard.n
        # the event of every answer (the release path's, built once)
        self.event = self.release.event(float(self.sensitivity), float(self.lap_scale))
        X = shard.X
        bk = backend(s.backend)
        #: the records on a device backend (dense shards; CSR ones stay on the host)
        self._dev = (None if bk.is_numpy or sp.issparse(X) or shard.n == 0 else
                     (bk.asarray(X, dtype=bk.xp.float64),
                      bk.asarray(shard.y, dtype=bk.xp.float64)))
        self._direct = (self._dev is None and s.loss == "squared" and not sp.issparse(X)
                        and math.isfinite(self.xi)
                        and 0 < shard.n <= linear.SMALL_PASS_ELEMS and not self.scalar_noise
                        and math.isfinite(self.lap_scale) and self.lap_scale >= 0)
        if self._direct:
            stats = shard.squared_stats
            self._X = np.ascontiguousarray(X, dtype=np.float64)
            self._y = np.ascontiguousarray(shard.y, dtype=np.float64)
            self._thr = np.ascontiguousarray(linear._thresholds(self.xi, stats.row_l1))
        self._work: dict[int, tuple[np.ndarray, ...]] = {}  # rows -> scratch arrays

    def answer(self, runs: np.ndarray, thetas: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Line 6 for the runs (positions) that picked this owner: (status, responses)."""
        m = runs.size
        status = np.full(m, DECLINED, dtype=np.int64)
        resp = np.zeros((m, self.p))
        left = self.cap - self.ledger.releases[runs]
        ok = left > 0
        if not ok.any():
            return status, resp
        if ok.all():
            self._release(runs, thetas, resp)
        else:
            r_ok = runs[ok]
            out = np.empty((r_ok.size, self.p))
            self._release(r_ok, thetas[ok], out)
            resp[ok] = out
        status[ok] = np.where(left[ok] == 1, LAST_ANSWER, ANSWERED)
        return status, resp

    def answer_into(self, runs: np.ndarray, thetas: np.ndarray, status_out: np.ndarray,
                    resp_out: np.ndarray) -> None:
        """`answer`, written into the caller's arrays (the RSP buffer of a live host)."""
        if runs.size == 1:
            r = int(runs[0])
            left = self.cap - int(self.ledger.releases[r])
            if left > 0:
                self._release(runs, thetas, resp_out, r)
                status_out[0] = LAST_ANSWER if left == 1 else ANSWERED
                return
        else:
            left = self.cap - self.ledger.releases[runs]
            if np.all(left > 0):
                self._release(runs, thetas, resp_out)
                status_out[:] = np.where(left == 1, LAST_ANSWER, ANSWERED)
                return
        status_out[:], resp_out[:] = self.answer(runs, thetas)

    def _release(self, runs: np.ndarray, thetas: np.ndarray, out: np.ndarray,
                 one: int | None = None) -> None:
        """Answers of runs that may still release (`one`: the run position when there is only
        one): clipped mean gradient + Laplace noise into `out`, the ledger charged before any
        noise is drawn; raises NumericalError on a non-finite answer."""
        m, n = runs.size, self.n
        if not (self._direct and m * n <= linear.SMALL_PASS_ELEMS):
            if self._dev is not None:  # the device pass (no SquaredStats shortcut there)
                (X, y), stats = self._dev, None
            else:
                X, y = self.shard.X, self.shard.y
                stats = self.shard.squared_stats if self.loss == "squared" else None
            grad_sum, clipped = linear.clipped_grad_sum(self.loss, X, y, thetas, self.xi, stats)
            grad_sum, clipped = to_numpy(grad_sum), to_numpy(clipped)
            out[:], _ = self.release.add_laplace(grad_sum / n, self.sensitivity, runs,
                                                 scale=self.lap_scale, scalar=self.scalar_noise)
            finite = bool(np.all(np.isfinite(out)))
        else:
            work = self._work.get(m)
            if work is None:
                work = self._work[m] = (np.empty((m, self.p)), np.zeros(m, dtype=np.int64),
                                        np.empty((m, self.p)), np.empty((m, self.p)))
            # the compiled pass clips, sums and draws the noise from the owner's streams
            finite = self.release.fused(
                self.event, lambda gens: kernels.owner_answer(
                    self._X, self._y, self._thr, thetas, n, gens, runs, self.lap_scale, work,
                    out), out, runs, one)
            clipped = work[1]
        if not finite:
            raise NumericalError(f"owner {self.agent}: non-finite answer (diverging model? lower "
                                 "step.rho or async.gamma)")
        if one is not None:
            self.clipped[one] += clipped[0]
        else:
            self.clipped[runs] += clipped



def owner_release(contract: Contract, agent: int, s: Settings) -> OwnerRelease:
    """Owner `agent`'s release path in `contract` (certified only when clipped with i.i.d.
    noise under the dp preset)."""
    return contract.owner(agent, certified=s.certified, clip=s.xi if s.clip else math.inf)


class HostedOwners(Mapping[int, DataOwner]):
    """The participating owners this rank hosts, by agent id, each built at its first query.

    An iteration serves one owner per run, so a job of T iterations meets at most T R owners:
    building all of them (their noise streams seeded, their ledgers) would make thousands of
    hosted owners cost more than the run. An owner never queried is in its initial state: its
    checkpoint state is not needed, its ledger is empty (`ledgers_and_clipped`).
    """

    def __init__(self, shards: list[LocalShard], s: Settings, contract: Contract) -> None:
        self.shards = {sh.agent: sh for sh in shards}
        self.s = s
        self.contract = contract
        self.built: dict[int, DataOwner] = {}

    def __getitem__(self, a: int) -> DataOwner:
        o = self.built.get(a)
        if o is None:
            sh = self.shards[a]  # KeyError: not a participant hosted here
            o = self.built[a] = DataOwner(sh, owner_release(self.contract, a, self.s),
                                          self.s.caps[a], self.s)
        return o

    def __iter__(self):
        return iter(sorted(self.shards))

    def __len__(self) -> int:
        return len(self.shards)

    def __contains__(self, a: object) -> bool:  # asking builds nothing
        return a in self.shards

    def states(self) -> list[tuple[int, dict]]:
        """The checkpoint state of every owner built so far (the others are as new)."""
        return [(a, o.state()) for a, o in sorted(self.built.items())]

    def restore_states(self, states: dict[int, dict]) -> None:
        """A checkpoint's owners (those this rank hosts) continue from their states."""
        for a in sorted(self.shards):
            if a in states:
                self[a].restore(states[a])

    def ledgers_and_clipped(self) -> list[tuple[Ledger, np.ndarray]]:
        """(ledger, clipped records per run) of every hosted participant, in agent order."""
        out = []
        for a in sorted(self.shards):
            o = self.built.get(a)
            out.append((o.ledger, o.clipped) if o is not None
                       else (owner_release(self.contract, a, self.s).ledger,
                             np.zeros(self.s.runs)))
        return out


class OwnersAnswer:
    """The host's answer callback: each owner serves its rows (its batch of runs) in one pass;
    `into` answers the rows of one owner straight into the caller's arrays (live hot path)."""

    def __init__(self, owners: Mapping[int, DataOwner]) -> None:
        self.owners = owners

    def _owner(self, a: int) -> DataOwner:
        try:
            return self.owners[a]
        except KeyError:
            raise JobError(f"owner {a} was queried but does not take part") from None

    def __call__(self, agents: np.ndarray, runs: np.ndarray, thetas: np.ndarray):
        status = np.empty(agents.size, dtype=np.int64)
        resp = np.empty((agents.size, thetas.shape[1]))
        for a in np.unique(agents):
            idx = np.flatnonzero(agents == a)
            status[idx], resp[idx] = self._owner(int(a)).answer(runs[idx], thetas[idx])
        return status, resp

    def into(self, agent: int, runs: np.ndarray, thetas: np.ndarray, status_out: np.ndarray,
             resp_out: np.ndarray) -> None:
        self._owner(agent).answer_into(runs, thetas, status_out, resp_out)


def owners_answer(owners: Mapping[int, DataOwner]) -> OwnersAnswer:
    """The host's answer callback for the owners it hosts (OwnersAnswer)."""
    return OwnersAnswer(owners)


class Learner:
    """theta_L and the N local copies of every run (lines 4, 7, 8), vectorised over runs."""

    def __init__(self, s: Settings, theta_init: np.ndarray) -> None:
        self.s = s
        self.theta_L = np.array(theta_init, dtype=np.float64)
        self.theta_loc = np.repeat(self.theta_L[:, None, :], s.N, axis=1)
        self.weights = np.array(s.n, dtype=np.float64) / s.n_total  # n_i / n, public
        self.a_own, self.a_ctr = s.a_own, s.a_ctr
        self._work = tuple(np.empty(self.theta_L.shape) for _ in range(3))

    def query_points(self, runs: np.ndarray, owners: np.ndarray) -> np.ndarray:
        """theta_bar (6) of each (run, owner) pair."""
        return 0.5 * (self.theta_L[runs] + self.theta_loc[runs, owners])

    def query_points_into(self, i: int, out: np.ndarray) -> None:
        """query_points(all runs, owner i), written into `out` (R, p) (live hot path)."""
        kernels.query_points(self.theta_L, self.theta_loc, i, out)

    def update(self, runs: np.ndarray, owners: np.ndarray, tb: np.ndarray, r: np.ndarray) -> None:
        """(5) and (7) for runs that got an answer r from owners (one owner per run)."""
        s = self.s
        g = s.lam * tb  # grad g(theta_bar)
        local = tb - self.a_own * (g / (2 * s.N) + self.weights[owners, None] * r)
        self.theta_loc[runs, owners] = linear.project_box(local, s.theta_max)
        self.theta_L[runs] = linear.project_box(tb - self.a_ctr * g, s.theta_max)
        if not np.all(np.isfinite(self.theta_L[runs])):
            raise NumericalError("learner: the model became non-finite (step too large? lower "
                                 "step.rho or async.gamma)")

    def update_owner(self, i: int, tb: np.ndarray, r: np.ndarray) -> None:
        """update(all runs, owner i): the same numbers, no temporaries (live hot path)."""
        s = self.s
        if not kernels.learner_step(self.theta_L, self.theta_loc, i, tb, r, s.lam,
                                    float(2 * s.N), self.a_own, self.a_ctr,
                                    float(self.weights[i]), s.theta_max, self._work):
            raise NumericalError("learner: the model became non-finite (step too large? lower "
                                 "step.rho or async.gamma)")


class Trace:
    """The learner's log: realised schedule, response norms, round trips, declines."""

    def __init__(self, R: int, T: int) -> None:
        self.owner = np.full((R, T), -1, dtype=np.int64)
        self.time = np.full((R, T), np.nan)
        self.resp_norm = np.full((R, T), np.nan)
        self.rtt = np.full(T, np.nan)
        self.declines: list[tuple[int, int, int, float, int]] = []
        self.ended_at = np.full(R, T, dtype=np.int64)
        self.end_reason = ""

    def served(self, k: int, runs: np.ndarray, owners: np.ndarray, times: np.ndarray,
               r: np.ndarray) -> None:
        self.owner[runs, k - 1] = owners
        self.time[runs, k - 1] = times
        self.resp_norm[runs, k - 1] = kernels.row_norms(r)

    def served_owner(self, k: int, i: int, t: float, r: np.ndarray, norms: np.ndarray) -> None:
        """served(k, all runs, owner i at time t, r); `norms`: an (R,) scratch array."""
        kernels.row_norms(r, norms)
        if norms.size == 1:
            self.owner[0, k - 1], self.time[0, k - 1] = i, t
            self.resp_norm[0, k - 1] = norms[0]
        else:
            self.owner[:, k - 1], self.time[:, k - 1] = i, t
            self.resp_norm[:, k - 1] = norms

    def decline_array(self) -> np.ndarray:
        return np.array(self.declines, dtype=DECLINE_DTYPE)


class GramEvaluator:
    """Evaluation-only f(theta) for the squared loss from X^T X, X^T y, y^T y summed in agent
    order (spec §7 oracle): O(p^2) per model on the learner, at any time, even in live mode."""

    def __init__(self, star: Star, block: AgentBlock | list[LocalShard], lam: float,
                 n_total: int, p: int) -> None:
        block = block if isinstance(block, AgentBlock) else AgentBlock(block)
        local = (block.gram_stats() if len(block) else np.zeros((0, p * p + p + 1)))
        g = star.gather_agents(local, (p * p + p + 1,))
        self.ready = g is not None
        if g is not None:
            tot = agent_order_sum(g)
            self.gram = tot[: p * p].reshape(p, p)
            self.xty = tot[p * p : p * p + p]
            self.yty = float(tot[-1])
        self.lam, self.n_total = lam, n_total

    def mse(self, thetas: np.ndarray) -> np.ndarray:
        """(1/n) sum of squared residuals on the training records, per model."""
        th = np.atleast_2d(thetas)
        quad = np.einsum("ij,jk,ik->i", th, self.gram, th)
        return (self.yty - 2.0 * th @ self.xty + quad) / self.n_total

    def f(self, thetas: np.ndarray) -> np.ndarray:
        th = np.atleast_2d(thetas)
        return 0.5 * self.lam * np.einsum("ij,ij->i", th, th) + self.mse(th)

    def record(self, thetas: np.ndarray, utility: bool = True) -> dict[str, np.ndarray] | None:
        """The evaluation-only metrics of a record (evaluation.Evaluator; learner-only, no
        collective): 'objective' f and, with `utility` (outside an audit), 'train_mse' of each
        model; None where the statistics are not held (owners' ranks)."""
        if not self.ready:
            return None
        return {"objective": self.f(thetas), **({"train_mse": self.mse(thetas)} if utility
                                                else {})}

    def final(self, isolated: np.ndarray, f_star: float) -> dict[str, np.ndarray] | None:
        """The end of a run (evaluation.Evaluator): 'psi_isolated', psi = f / f_star - 1 of the
        owners' isolated optima `isolated` on the same (Gram) footing as the records; None
        where the statistics are not held."""
        if not self.ready:
            return None
        return {"psi_isolated": self.f(isolated) / f_star - 1.0}


def _report(hooks: RunHooks, k: int, psi: np.ndarray | None, ended: bool = False) -> None:
    """The learner's progress line at update k (median psi, updates per second); `ended`: every
    run ended before T, a line in any case."""
    bar = hooks.bar

    def detail() -> str:
        med = "" if psi is None else f"median psi {np.median(psi):.3g}, "
        return f"{med}{k / max(time.perf_counter() - bar.t0, 1e-9):.3g} updates/s"
    if not hooks.progress(k, detail) and ended:
        hooks.info(f"{bar.unit} {k}/{bar.total}, every run ended, {detail()} "
                   f"({time.perf_counter() - bar.t0:.1f} s)")


class _Records:
    """Metric records of theta_L; psi at once (squared loss) or after the run (other losses).

    Outside an audit (tap.evaluating()) the records also hold the evaluation-only utility:
    train_mse (squared loss, from the Gram matrix) or train_error / test_error (classifiers).
    """

    def __init__(self, s: Settings, ref: Reference | None, gram: GramEvaluator | None,
                 hooks: RunHooks) -> None:
        self.s, self.ref, self.gram, self.hooks = s, ref, gram, hooks
        self.utility = tap.evaluating()
        self.f_star: float | None = None
        #: theta* known (not reference.solver = 'none'): psi and dist_sq are recorded
        self.optimum = ref is not None and ref.has_optimum
        if ref is not None and ref.theta_star is not None and gram is not None and gram.ready:
            self.f_star = float(gram.f(ref.theta_star)[0])
        self.pending: list[tuple[int, np.ndarray]] = []
        self.last_psi: np.ndarray | None = None
        self.last_k = -1

    def state(self) -> dict:
        """What a checkpoint keeps (the models still to evaluate, the last record)."""
        return {"pending": self.pending, "last_psi": self.last_psi, "last_k": self.last_k}

    def restore(self, st: dict) -> None:
        self.pending, self.last_psi, self.last_k = st["pending"], st["last_psi"], st["last_k"]

    def add(self, k: int, theta_L: np.ndarray) -> None:
        if k == self.last_k:
            return
        self.last_k = k
        if self.gram is None:
            self.pending.append((k, theta_L.copy()))
            return
        rec = self.gram.record(theta_L, self.utility)
        assert rec is not None  # the learner holds the Gram statistics
        self._append(k, theta_L, rec.pop("objective"), rec)

    def _append(self, k: int, theta: np.ndarray, f: np.ndarray,
                util: dict[str, np.ndarray]) -> None:
        assert self.ref is not None  # needed on the learner
        if self.ref.theta_star is None or self.f_star is None:  # reference.solver = 'none'
            if self.hooks.recording:
                self.hooks.record(k, {"objective": f, **util})
            return
        psi = f / self.f_star - 1.0
        d = theta - self.ref.theta_star
        self.last_psi = psi
        if self.hooks.recording:
            self.hooks.record(k, {"psi": psi, "objective": f,
                                  "dist_sq": np.einsum("ij,ij->i", d, d), **util})

    def finish(self, oracle: Oracle, is_learner: bool, star: Star) -> None:
        """Collective: evaluate the stored models of non-squared losses after the run."""
        if self.gram is not None:
            return
        m = star.bcast_object(len(self.pending) if is_learner else None)
        if not m:
            return
        R, p = self.s.runs, self.s.p
        thetas = (np.concatenate([th for _, th in self.pending]) if is_learner
                  else np.zeros((m * R, p)))
        optimum = star.bcast_object(self.optimum if is_learner else None)
        if is_learner and optimum:
            assert self.ref is not None  # needed on the learner
            thetas = np.concatenate([thetas, np.asarray(self.ref.theta_star)[None, :]])
        elif optimum:
            thetas = np.concatenate([thetas, np.zeros((1, p))])
        util = oracle.record(thetas, slice(0, m * R) if self.utility else None)
        if util is None:
            return
        f = util.pop("objective")
        if optimum:
            self.f_star = float(f[-1])
        for j, (k, th) in enumerate(self.pending):
            rows = slice(j * R, (j + 1) * R)
            self._append(k, th, f[rows], {name: v[rows] for name, v in util.items()})


@dataclasses.dataclass(frozen=True)
class AsyncStarResult(ResultRecord):
    """What a configuration leaves on the learner (`run_config`).

    final: theta_L (R, p); local: the local copies theta_loc (R, N, p); trace: the realised
    schedule (Trace); answered, spent_eps, clip_fraction: per run and owner (R, N), the clip
    fraction evaluation-only; dropped_ticks: clock ticks dropped per host (live mode); f_star:
    f(theta*) on the records' own footing (None: the reference's); ledgers: every participating
    owner's ledger in owner order; final_psi: psi of the last record (None without records);
    psi_isolated: psi of the owners' isolated optima (N,).
    """

    KEYS: ClassVar[Mapping[str, str]] = {"models/final": "final", "models/local": "local"}

    final: np.ndarray
    local: np.ndarray
    trace: Trace
    answered: np.ndarray
    spent_eps: np.ndarray
    clip_fraction: np.ndarray
    dropped_ticks: np.ndarray
    f_star: float | None
    ledgers: list[Ledger] | np.ndarray  # or their privacy/ledger rows (ledger_delta)
    final_psi: np.ndarray | None
    psi_isolated: np.ndarray | None  # None: reference.solver = 'none'


def run_config(star: Star, link: P2PStar, shards: list[LocalShard], s: Settings,
               contract: Contract, ref: Reference | None, recorder=None, label: str = "",
               progress: bool = True,
               logged: tuple[np.ndarray, np.ndarray] | None = None,
               evalset: EvalSet | None = None, hooks: RunHooks | None = None,
               ledger_delta: float | None = None) -> AsyncStarResult | None:
    """Run one configuration (collective over star.comm) under `contract` (privacy.contract: every
    owner's release path). The learner returns the final arrays
    (AsyncStarResult), the others None. `ledger_delta`: the ledgers come back as their
    privacy/ledger rows, composed on the ranks hosting the owners (accountants.in_agent_order).

    `shards` are the owners hosted on this rank (owners >= N take no part and hold no records);
    `ref` (theta*, f*) is needed on the learner; `logged` = (owner (T,), time (T,)) replays a
    logged schedule instead of drawing one; `evalset`: where a classifier's test error is
    measured (default: no test set); `hooks` (the runner's RunHooks) record, report progress
    and checkpoint, else hooks are built from `recorder`, `label` and `progress`. Replay mode
    resumes from the recorder's checkpoint, if any (live mode never checkpoints: it restarts a
    stopped configuration from its start).
    """
    hooks = RunHooks.of(hooks, recorder, label, star.comm, progress)
    R, N = s.runs, s.N
    parts = [sh for sh in shards if sh.agent < N]
    owners = HostedOwners(parts, s, contract)
    if s.mode == "live":  # built before the clocks start: none is seeded on the hot path
        for a in owners:
            owners[a]
    answer = owners_answer(owners)
    oracle = Oracle(star, shards, s.loss, s.lam, s.n_total, s.p, evalset)
    gram = (GramEvaluator(star, oracle.block, s.lam, s.n_total, s.p) if s.loss == "squared"
            else None)
    records = _Records(s, ref, gram, hooks)
    saved = (load_checkpoint(star, hooks, owners, owners_only=True)
             if s.mode == "replay" else None)
    trace = Trace(R, s.T) if saved is None else saved["trace"]
    dropped = np.zeros(0)
    stopped = 0  # the signal that stopped the learner (comm.stop), told to the hosts below
    if link.is_learner or s.loss == "squared":
        # compile or load the kernels on every rank at once, before the clocks start (live) or
        # the first query (replay): loaded on a host's first query, they held the learner up
        # for about a second per host (numba's import and its cache)
        kernels.warm_up()
    if s.mode == "live":
        link.start_clock()
    if link.is_learner:
        learner = Learner(s, initial_models(s))
        if saved is None:
            records.add(0, learner.theta_L)
        else:
            learner.theta_L, learner.theta_loc = saved["theta_L"], saved["theta_loc"]
            records.restore(saved["records"])
        hooks.start(s.T, "update")
        try:
            if s.mode == "live":
                _live_learner(link, learner, s, trace, records, hooks)
            else:
                sched = (saved["sched"] if saved is not None
                         else LoggedSchedule(logged[0], logged[1], N, R) if logged is not None
                         else Scheduler(s.scheduler, N, s.seed, s.run_ids,
                                        np.array(s.rates) if s.rates else None))
                _replay_learner(link, answer, learner, sched, s, trace, records, hooks, owners,
                                saved)
        except stop.Interrupted as e:
            stopped = e.signum
        finally:
            if s.mode == "live":
                dropped = link.stop_and_drain()
            else:
                link.stop_hosts()
    elif s.mode == "live":
        gens = {a: stream(s.seed, "schedule", a, s.run_ids[0]) for a in owners}  # owner clocks
        clocks = OwnerClocks(sorted(owners), np.array(s.rates or [1.0] * N), s.clock_unit_s,
                             gens, restart_after_service=s.protocol == "learner_broadcast")
        link.serve_live(s.protocol, clocks, answer, s.runs)
    else:
        link.serve(answer, lambda: _owner_states(owners))
    stopped = star.comm.bcast(stopped, root=0)
    if stopped:  # every rank stops with the learner, after its checkpoint
        raise stop.Interrupted(stopped)

    records.finish(oracle, link.is_learner, star)
    mine = owners.ledgers_and_clipped()
    # every owner's answers, basic eps spent and clipped records per run, beside its ledger
    logs = star.gather_objects((np.array([lg.agent for lg, _ in mine], dtype=np.int64),
                                np.array([lg.releases for lg, _ in mine], np.int64).reshape(-1, R),
                                np.array([lg.spent_eps for lg, _ in mine]).reshape(-1, R),
                                np.array([c for _, c in mine], np.float64).reshape(-1, R)))
    ledgers = gather_ledgers(star, [lg for lg, _ in mine], ledger_delta)
    if not link.is_learner:
        return None
    answered = np.zeros((R, N), dtype=np.int64)
    spent = np.zeros((R, N))
    clip_frac = np.zeros((R, N))
    for a, releases, eps, clipped in logs:
        answered[:, a] = releases.T
        spent[:, a] = eps.T
        n_a = np.array([s.n[i] for i in a.tolist()])
        clip_frac[:, a] = (clipped / np.maximum(releases, 1) / n_a[:, None]).T
    assert ref is not None and ledgers is not None  # the learner's
    psi_isolated = None if ref.psi_isolated is None else ref.psi_isolated[:N]
    if records.gram is not None and ref.theta_isolated is not None:
        # psi of the isolated optima on the same (Gram) footing
        assert records.f_star is not None  # set from the Gram statistics on the learner
        gram_final = records.gram.final(ref.theta_isolated[:N], records.f_star)
        assert gram_final is not None
        psi_isolated = gram_final["psi_isolated"]
    return AsyncStarResult(final=learner.theta_L, local=learner.theta_loc, trace=trace,
                           answered=answered, spent_eps=spent, clip_fraction=clip_frac,
                           dropped_ticks=dropped, f_star=records.f_star, ledgers=ledgers,
                           final_psi=records.last_psi, psi_isolated=psi_isolated)


def _owner_states(owners: HostedOwners) -> list[tuple[int, dict]]:
    return owners.states()


def _replay_learner(link: P2PStar, answer, learner: Learner, sched, s: Settings, trace: Trace,
                    records: _Records, hooks: RunHooks, owners: HostedOwners,
                    saved: dict | None = None) -> None:
    """Iterations k = 1..T (from the checkpoint's k + 1 with `saved`); at a record, when the
    recorder says so (hooks.checkpoint_due) or a stop was asked, checkpoint the learner and
    every owner (asked from its host: the learner alone decides, the hosts serve)."""
    R = s.runs
    alive, k0 = (np.ones(R, dtype=bool), 0) if saved is None else (saved["alive"], saved["k"])
    for k in range(k0 + 1, s.T + 1):
        pending = np.flatnonzero(alive)
        while pending.size:
            own, t = sched.next(pending)
            tb = learner.query_points(pending, own)
            status, resp = link.query(k, own, pending, tb, answer)
            ok = status != DECLINED
            if ok.any():
                learner.update(pending[ok], own[ok], tb[ok], resp[ok])
                trace.served(k, pending[ok], own[ok], t[ok], resp[ok])
            for j in np.flatnonzero(status != ANSWERED):
                r, i = int(pending[j]), int(own[j])
                sched.remove(r, i)
                trace.declines.append((r, k, i, float(t[j]),
                                       RETIRED if status[j] == LAST_ANSWER else REFUSED))
            retry = pending[~ok]
            done = np.array([sched.exhausted(int(r)) for r in retry], dtype=bool)
            for r in retry[done]:  # no owner left to serve this run at k
                alive[r] = False
                trace.ended_at[r] = k - 1
            pending = retry[~done]
        for run in np.flatnonzero(alive):
            if sched.exhausted(int(run)):
                alive[run] = False
                trace.ended_at[run] = k
        if k % s.record_every == 0 or k == s.T or not alive.any():
            records.add(k, learner.theta_L)
            _report(hooks, k, records.last_psi, ended=not alive.any())
        if not alive.any():
            trace.end_reason = (f"every run ended by k={int(trace.ended_at.max())}: no owner "
                                "left with budget")
            break
        if k % s.record_every == 0 and k < s.T and (stop.requested() or hooks.checkpoint_due()):
            snap = dict(link.snapshot(lambda: _owner_states(owners)))
            hooks.save_state({"k": k, "alive": alive, "theta_L": learner.theta_L,
                              "theta_loc": learner.theta_loc, "sched": sched, "trace": trace,
                              "records": records.state(), "owners": snap})
            if stop.requested():  # the hosts learn it when the learner stops them (run_config)
                raise stop.Interrupted(stop.requested())


def _live_learner(link: P2PStar, learner: Learner, s: Settings, trace: Trace, records: _Records,
                  hooks: RunHooks) -> None:
    """Serve owners in arrival order, one-on-one; every run follows the realised schedule.

    The hot path allocates nothing per update: the query points are written into the QRY buffer,
    the answers received into the RSP buffer (p2p_star.OwnerQuery) and the learner's steps and
    the trace written in place (mpi_dp.models.kernels)."""
    q = link.owner_query(s.runs)
    try:
        _live_loop(link, learner, s, trace, records, hooks, q)
    finally:
        q.close()


def _live_loop(link: P2PStar, learner: Learner, s: Settings, trace: Trace, records: _Records,
               hooks: RunHooks, q) -> None:
    R, N = s.runs, s.N
    hosts = link.host_of(np.arange(N)).tolist()
    retired: set[int] = set()
    norms = np.empty(R)
    k, seq = 0, 0
    while k < s.T and len(retired) < N:
        if s.protocol == "owner_request":
            host, i, _tick = link.next_request()
            if i in retired:
                continue
        else:
            seq += 1
            claims = [(h, i) for h, i in link.poll(seq) if i not in retired]
            if not claims:
                time.sleep(s.poll_interval_s)
                continue
            host, i = claims[0]
            for h, _ in claims[1:]:  # later claims of this poll
                link.deny(h, seq)
        if hosts[i] == 0:
            raise JobError(f"live mode: owner {i} is hosted on the learner's rank")
        t_k = link.now()
        learner.query_points_into(i, q.points)
        q0 = time.perf_counter()
        status = q.ask(k + 1, i, hosts[i])
        rtt = time.perf_counter() - q0
        if status == DECLINED:
            retired.add(i)
            trace.declines.extend((r, k + 1, i, t_k, REFUSED) for r in range(R))
            continue
        k += 1
        learner.update_owner(i, q.points, q.resp)
        trace.served_owner(k, i, t_k, q.resp, norms)
        trace.rtt[k - 1] = rtt
        if status == LAST_ANSWER:
            retired.add(i)
            trace.declines.extend((r, k, i, t_k, RETIRED) for r in range(R))
        if k % s.record_every == 0 or k == s.T:
            records.add(k, learner.theta_L)
            _report(hooks, k, records.last_psi)
            if stop.requested() and k < s.T:  # live: no checkpoint, a resume restarts it
                raise stop.Interrupted(stop.requested())
    if k < s.T:
        trace.ended_at[:] = k
        trace.end_reason = f"ended at k={k}: every owner spent its budget"
        records.add(k, learner.theta_L)


def check_settings(s: Settings, path: str, n_ranks: int) -> None:
    if s.lam <= 0:
        raise JobError(f"job file {path}: key 'lam': the asynchronous method needs a strongly "
                       "convex regulariser (its steps are rho/(T^2 lam)); set lam > 0")
    if not s.clip and s.dp_valid and any(math.isfinite(e) for e in s.eps):
        raise JobError(f"job file {path}: key 'clip': clip = false voids the DP guarantee (the "
                       "sensitivity is unbounded) unless every eps is inf or async.preset = "
                       "'paper_code' (recorded dp_valid = false)")
    if s.mode == "live" and n_ranks < 2:
        raise JobError(f"job file {path}: key 'async.mode': live mode needs owners on other ranks "
                       "than the learner: run with mpiexec -n 2 or more")
