"""Synchronous DP (sub)gradient descent on a star: Algorithms 1 and 2 of [SYNC] (seed 001).

Spec: specs/sync-dp-gradient-value-of-collaboration.md. The learner on rank 0 broadcasts theta_{k-1};
every data owner answers with its clipped mean gradient (L1 sensitivity 2 xi / n_i) plus Laplace
noise through its release path (the configuration's privacy contract: the ledger charged first,
the noise of its scale b_i for a mean of n_i gradients clipped to xi drawn from its own streams);
the learner takes a projected step (Alg. 1: mu_k = rho/(k T^2); Alg. 2: mu_k = rho/(T sqrt(k))
with polynomial-decay averaging). All R Monte-Carlo runs advance together along a leading axis.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Mapping
from typing import ClassVar

import numpy as np

from ..comm.star import Star
from ..errors import BudgetExceededError, JobError, NumericalError
from ..models import linear
from ..privacy import Ledger, l1_sensitivity_mean, tap
from ..privacy.calibration import Sensitivity
from ..privacy.contract import Contract
from ..privacy.release import OwnerRelease
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
    ordered_total,
    save_checkpoint,
)
from .hooks import RunHooks


@dataclasses.dataclass(frozen=True)
class Settings:
    """The resolved knobs of one configuration (identical on every rank)."""

    variant: str  # "alg1" | "alg2"
    T: int
    loss: str
    lam: float
    theta_max: float
    theta0: float
    xi: float
    clip: bool
    rho: float
    L: float
    avg_kind: str
    eta: float
    seed: int
    run_ids: tuple[int, ...]
    record_every: int
    aggregate: str
    eps: tuple[float, ...]  # per owner
    n: tuple[int, ...]  # per owner
    p: int  # number of features
    schedule: str = "decreasing"  # or "constant" (eps = inf only)
    backend: str = "numpy"  # array backend of the owners' clipped gradient passes

    @property
    def runs(self) -> int:
        return len(self.run_ids)

    def step_size(self, k: int) -> float:
        """mu_k: alg1 rho/(k T^2) [spec §3]; alg2 rho/(T sqrt(k)) [spec §4].

        schedule 'constant' (mu_k = rho/T^2 for alg1, rho/T for alg2) is only for eps = inf, where
        the paper notes a constant step is allowed (e.g. computing theta* by Algorithm 1).
        """
        if self.schedule == "constant":
            return self.rho / (self.T**2 if self.variant == "alg1" else self.T)
        if self.variant == "alg1":
            return self.rho / (k * self.T**2)
        return self.rho / (self.T * math.sqrt(k))


def default_rho(variant: str, alpha: float, L: float, T: int) -> float:
    """rho giving mu_1 = alpha / L: alg1 rho = alpha T^2 / L; alg2 rho = alpha T / L (c = rho/T)."""
    return alpha * T**2 / L if variant == "alg1" else alpha * T / L


class DataOwner(Checkpointed, ReleasePath):
    """Owner i: holds its records, clips, adds i.i.d. Laplace noise through its release path
    (`release`: the contract's, its ledger charged first, its own noise streams).

    Nothing un-noised leaves it through `answer`; `loss_sums` (in the Oracle) is evaluation-only.
    One owner alone; a rank's hosted owners answer together as an `OwnerBlock`, bit for bit as
    each of them would here.
    """

    STATE = ("answered", "ledger", "last_clipped")
    NOISE = None  # the release path's streams

    def __init__(self, shard: LocalShard, release: OwnerRelease, s: Settings) -> None:
        self.shard = shard
        self.agent = shard.agent
        self.T = s.T
        self.loss = s.loss
        self.xi = s.xi if s.clip else math.inf
        self.release = release
        self.sensitivity = l1_sensitivity_mean(s.xi, shard.n)  # replace-one, clipped to xi
        self.lap_scale = release.scale(Sensitivity.mean(s.xi, shard.n))
        self.answered = 0
        self.last_clipped = np.zeros(s.runs)

    def answer(self, theta: np.ndarray) -> np.ndarray:
        """Lines 4-6: refuse beyond T queries; Q_i + Laplace noise, the release charged first."""
        if self.answered >= self.T:
            raise BudgetExceededError(f"owner {self.agent} refuses query {self.answered + 1}: "
                                      f"it answers at most T = {self.T} queries")
        stats = self.shard.squared_stats if self.loss == "squared" else None
        grad_sum, clipped = linear.clipped_grad_sum(self.loss, self.shard.X, self.shard.y, theta,
                                                    self.xi, stats)
        q = grad_sum / self.shard.n
        response, _ = self.release.add_laplace(q, self.sensitivity, scale=self.lap_scale)
        self.answered += 1
        self.last_clipped = clipped.astype(np.float64)
        if not np.all(np.isfinite(response)):
            raise NumericalError(f"owner {self.agent}: non-finite answer at query "
                                 f"{self.answered} (diverging model? lower step.alpha)")
        return response


def owner_release(contract: Contract, agent: int, s: Settings) -> OwnerRelease:
    """Owner `agent`'s release path in `contract` (its events certified only when clipped)."""
    return contract.owner(agent, certified=s.clip, clip=s.xi if s.clip else math.inf)


class OwnerBlock:
    """The data owners hosted on a rank, answering together: each clips its own records' gradients,
    adds its own i.i.d. Laplace noise from its own streams and charges its own ledger, as
    `DataOwner` does one at a time (bit for bit), with the agents as an array axis."""

    def __init__(self, shards: list[LocalShard], s: Settings, contract: Contract) -> None:
        self.agents = np.array([sh.agent for sh in shards], dtype=np.int64)
        self.data = AgentBlock(shards, s.backend)
        self.T, self.loss, self.R = s.T, s.loss, s.runs
        self.xi = s.xi if s.clip else math.inf
        self.n = self.data.n
        self.sensitivity = np.array([l1_sensitivity_mean(s.xi, sh.n) for sh in shards])
        self.release = contract.block(self.agents.tolist(), certified=s.clip,
                                      clip=s.xi if s.clip else math.inf)
        self.lap_scale = self.release.scales([Sensitivity.mean(s.xi, sh.n) for sh in shards])
        self.noise = self.release.streams
        self.answered = 0
        self.last_clipped = np.zeros((len(shards), s.runs))
        self.restored: dict[int, Ledger] = {}  # checkpointed ledgers, by block position

    def __len__(self) -> int:
        return int(self.agents.size)

    def answer(self, theta: np.ndarray) -> np.ndarray:
        """Lines 4-6 for every hosted owner: (A, R, p) noisy clipped mean gradients."""
        A = len(self)
        if A == 0:
            return np.empty((0, self.R, theta.shape[-1]))
        if self.answered >= self.T:
            raise BudgetExceededError(f"owner {int(self.agents[0])} refuses query "
                                      f"{self.answered + 1}: it answers at most T = {self.T} "
                                      "queries")
        grad_sum, clipped = self.data.clipped_grad_sums(self.loss, theta, self.xi,
                                                        self.loss == "squared")
        q = grad_sum / self.n[:, None, None]
        response, _, _ = self.release.add_laplace(q, self.sensitivity, scales=self.lap_scale)
        self.answered += 1
        self.last_clipped = clipped.astype(np.float64)
        bad = ~np.isfinite(response).reshape(A, -1).all(axis=1)
        if bad.any():
            raise NumericalError(f"owner {int(self.agents[np.argmax(bad)])}: non-finite answer "
                                 f"at query {self.answered} (diverging model? lower "
                                 "step.alpha)")
        return response

    @property
    def ledgers(self) -> list[Ledger]:
        return self.release.ledgers

    def owners(self) -> list[_HostedOwner]:
        """One checkpoint view per hosted owner (`save_checkpoint` / `load_checkpoint`; after a
        load, `restored_ledgers` hands the owners their checkpointed ledgers)."""
        self.restored = {}
        return [_HostedOwner(self, j) for j in range(len(self))]

    def restored_ledgers(self) -> None:
        """Give the owners the ledgers a checkpoint restored (all or none)."""
        if self.restored:
            self.release.restore_ledgers([self.restored[j] for j in range(len(self))])
        self.restored = {}


class _HostedOwner:
    """Owner j of an OwnerBlock as a checkpoint sees it: the state a DataOwner saves."""

    def __init__(self, block: OwnerBlock, j: int) -> None:
        self.block, self.j, self.agent = block, j, int(block.agents[j])

    def _rows(self) -> slice:
        return slice(self.j * self.block.R, (self.j + 1) * self.block.R)

    def state(self) -> dict:
        b, rows = self.block, self._rows()
        return {"answered": b.answered, "ledger": b.release.owners[self.j].ledger,
                "last_clipped": b.last_clipped[self.j].copy(),
                "noise": (b.noise.h[rows].copy(), b.noise.lo[rows].copy())}

    def restore(self, st: dict) -> None:
        b, rows = self.block, self._rows()
        b.answered = st["answered"]
        b.restored[self.j] = st["ledger"]
        b.last_clipped[self.j] = st["last_clipped"]
        b.noise.h[rows], b.noise.lo[rows] = st["noise"]


def _median_psi(psi: np.ndarray | None) -> str:
    return "" if psi is None else f"median psi {np.median(psi):.3g}"


@dataclasses.dataclass(frozen=True)
class SyncStarResult(ResultRecord):
    """What a configuration leaves on the learner (`run_config`): final, the reported model
    (alg2: the average, alg1: the last iterate) (R, p); final_iterate, the last iterate (R, p);
    ledgers, every owner's ledger in owner order."""

    KEYS: ClassVar[Mapping[str, str]] = {"models/final": "final",
                                         "models/final_iterate": "final_iterate"}

    final: np.ndarray
    final_iterate: np.ndarray
    ledgers: list[Ledger] | np.ndarray  # or their privacy/ledger rows (ledger_delta)


def run_config(star: Star, shards: list[LocalShard], s: Settings, contract: Contract,
               ref: Reference | None, recorder=None, label: str = "", progress: bool = True,
               theta_init: np.ndarray | None = None,
               evalset: EvalSet | None = None, hooks: RunHooks | None = None,
               ledger_delta: float | None = None) -> SyncStarResult | None:
    """Run one configuration (collective) under `contract` (privacy.contract: every owner's
    release path). The learner returns the final arrays
    (SyncStarResult), the others None. `ledger_delta`: the owners' ledgers come back as their
    privacy/ledger rows, composed on the ranks hosting them (accountants.in_agent_order).

    `ref` (theta*, f*: see common.reference_quantities) is needed on the learner only.
    `theta_init` (p,) replaces theta0 (test hook, e.g. starting at theta* as spec check V5 does).
    `evalset`: where a classifier's test error is measured (default: no test set). `hooks` (the
    runner's RunHooks) record, report progress and checkpoint; without them they are built from
    `recorder`, `label` and `progress`.
    """
    hooks = RunHooks.of(hooks, recorder, label, star.comm, progress)
    p = s.p
    n_total = int(sum(s.n))
    weights = np.array(s.n, dtype=np.float64) / n_total  # n_i / n, public
    owners = OwnerBlock(shards, s, contract)
    oracle = Oracle(star, shards, s.loss, s.lam, n_total, p, evalset, block=owners.data)
    R = s.runs
    reported = slice(0, R) if s.variant == "alg2" else slice(R, 2 * R)  # rows of [avg, iterate]

    theta = np.full((R, p), s.theta0, dtype=np.float64)
    if theta_init is not None:
        theta[:] = theta_init
    theta_avg = theta.copy()
    step_sum = 0.0
    hooks.start(s.T, "iteration")

    def record(k: int, mu: float) -> np.ndarray | None:
        if not tap.evaluating() or s.record_every == 0:  # evaluation-only: an audit, or none
            return None  # wanted (record_every = 0: the method's cost alone)
        clipped = owners.last_clipped
        both = np.concatenate([theta_avg, theta])
        util = oracle.record(both, reported, extra_local=clipped)
        if util is None:
            return None
        assert ref is not None  # needed on the learner (util is not None there)
        f, clip_total = util.pop("objective"), util.pop("extra")
        f_avg, f_it = f[:R], f[R:]
        report = f_avg if s.variant == "alg2" else f_it
        if ref.f_star is None:  # reference.solver = 'none': no theta*, no psi
            hooks.record(k, {"objective": report, "clip_fraction": clip_total / n_total,
                             "step_size": mu, **util})
            return None
        psi = report / ref.f_star - 1.0
        hooks.record(k, {"psi": psi, "psi_iterate": f_it / ref.f_star - 1.0,
                         "objective": report, "clip_fraction": clip_total / n_total,
                         "step_size": mu, **util})
        return psi

    saved = load_checkpoint(star, hooks, owners.owners())
    owners.restored_ledgers()
    k0 = 0
    if saved is None:
        record(0, 0.0)
    else:  # resume: the learner's model (the owners' answers, ledgers and noise are restored)
        k0, step_sum = saved["k"], saved["step_sum"]
        theta, theta_avg = saved["theta"].copy(), saved["theta_avg"].copy()
    for k in range(k0 + 1, s.T + 1):
        mu = s.step_size(k)
        star.bcast(theta)  # line 3: learner -> owners: theta_{k-1}
        responses_local = owners.answer(theta)  # lines 4-6, on the owners' ranks
        if s.aggregate == "gather":  # line 7: every answer reaches the learner individually
            responses = star.gather_agents(responses_local, (R, p))
            if star.is_learner:  # line 8, fixed owner order
                assert responses is not None  # gathered on the learner
                d = ordered_total(s.lam * theta, responses, weights)
        else:  # optional: Reduce of pre-weighted answers (sum order depends on the rank count)
            part = agent_order_sum(weights[owners.agents][:, None, None] * responses_local)
            total = star.reduce_sum(part)
            if star.is_learner:
                assert total is not None  # reduced on the learner
                d = s.lam * theta + total
        if star.is_learner:
            theta = linear.project_box(theta - mu * d, s.theta_max)  # line 9
            if not np.all(np.isfinite(theta)):
                raise NumericalError(f"learner: the model became non-finite at k={k} "
                                     "(step too large? lower step.alpha)")
            if s.avg_kind == "stepweighted":
                step_sum += mu
                gamma = mu / step_sum
            else:
                gamma = (s.eta + 1.0) / (k + s.eta + 1.0)  # polynomial-decay averaging (8)
            theta_avg = (1.0 - gamma) * theta_avg + gamma * theta
        if k == s.T or (s.record_every and k % s.record_every == 0):
            psi = record(k, mu)
            save_checkpoint(star, hooks, k, s.T, owners.owners(), theta=theta, theta_avg=theta_avg,
                            step_sum=step_sum)
            hooks.progress(k, functools.partial(_median_psi, psi))

    ledgers = gather_ledgers(star, owners.ledgers, ledger_delta)
    if not star.is_learner:
        return None
    assert ledgers is not None  # the learner gathers them
    return SyncStarResult(final=theta_avg if s.variant == "alg2" else theta,
                          final_iterate=theta, ledgers=ledgers)


def check_settings(s: Settings, path: str) -> None:
    if s.schedule == "constant" and any(math.isfinite(e) for e in s.eps):
        raise JobError(f"job file {path}: key 'step.schedule': a constant step does not converge "
                       "with noise; use it only with eps = inf (e.g. to compute theta*)")
    if not s.clip and any(math.isfinite(e) for e in s.eps):
        raise JobError(f"job file {path}: key 'clip': clip = false voids the DP guarantee (the "
                       "sensitivity is unbounded) unless every eps is inf")
