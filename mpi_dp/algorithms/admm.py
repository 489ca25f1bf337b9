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

All R Monte-Carlo runs advance together along a leading axis ((R, J, K) arrays). Every agent
draws its noise from its own streams (seed, 'noise', agent, run) and the server sums the agents'
contributions in agent order (Gatherv; 'reduce' is an option), so results are bitwise identical
on any number of ranks.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Mapping
from typing import ClassVar

import numpy as np

from ..comm.star import Star
from ..errors import NumericalError
from ..models import multinomial
from ..privacy import GaussianEvent, LaplaceEvent, Ledger, tap
from ..privacy.release import OwnerRelease
from ..rng import run_streams
from . import admm_steps as steps
from .common import (
    Checkpointed,
    ReleasePath,
    ResultRecord,
    agent_order_sum,
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
    eps_bar: float  # per-iteration eps of every agent (inf: non-private): the calibrated one, or
    # the job's eps itself under the paper's rule
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
    outp_calibration: str = "auto"  # privacy.GAUSSIAN_CALIBRATIONS or "paper"
    reg_grad: str = "consistent"  # consistent: 2 (gamma/P) z_p | code: 2 gamma w
    w_bound: float = math.inf  # W = [-B, B]^(J x K); inf: unconstrained (the final code)
    dp_delta: float = 1e-6
    budget_eps: float = math.inf  # each agent's total eps (basic composition); inf: no cap
    aggregate: str = "gather"  # gather (bitwise rank-invariant) | reduce
    #: OutP under a calibrated rule: sigma = noise_multiplier x the release's L2 sensitivity
    #: (NaN: the paper's outp_sigma of (eps_bar, dp_delta))
    noise_multiplier: float = math.nan
    #: per agent: its calibration (privacy.contract.Calibration), () before calibration
    calibration: tuple = ()

    @property
    def calibrated(self) -> bool:
        """Whether the noise comes from the job's calibration (pld / basic), not the paper's."""
        return bool(self.calibration) and self.calibration[0] is not None \
            and self.calibration[0].rule != "paper"

    @property
    def P(self) -> int:
        return len(self.n)

    @property
    def I(self) -> int:  # noqa: E743 (the spec's name for the total sample count)
        return int(sum(self.n))

    @property
    def runs(self) -> int:
        return len(self.run_ids)

    @property
    def noise_rho(self) -> float:
        """The noise term of rho = 'auto' (0 without noise, and for OutP)."""
        if math.isinf(self.eps_bar) or self.method == "outp":
            return 0.0
        mode = "bound" if math.isfinite(self.row_bound) else "global"
        sens = steps.sensitivity(None, self.I, mode, self.J, self.row_bound)
        return float(sens) / self.eps_bar * math.sqrt(self.J * self.K / self.P)

    @property
    def box(self) -> float | None:
        """B of W = [-B, B]^(J x K), None when unconstrained."""
        return None if math.isinf(self.w_bound) else self.w_bound

    def rho(self, t: int) -> float:
        """rho^t: (21), (21)/100 or a constant (App. A.9 variants); 'auto': rho_static (the
        smoothness bound) plus the noise's pull b sqrt(J K / P) (b the Laplace scale of ObjT/ObjP
        at the public sensitivity), so that the noise moves the averaged model by O(1)."""
        if self.rho_mode == "auto":
            return self.rho_static + self.noise_rho
        return steps.rho_variant(t, self.rho_mode, self.rho_c1, self.rho_c2, self.rho_tc,
                                 self.eps_bar, static=self.rho_static)


class Agent(Checkpointed, ReleasePath):
    """Agent p: holds its records, its local model z_p and dual lam_p for every run; draws its own
    noise, charges its own ledger before every release and releases only the perturbed z_p
    (ObjT/ObjP) or z~_p (OutP). A release past its budget is refused (BudgetExceededError)."""

    def __init__(self, agent: int, X: np.ndarray, y: np.ndarray, s: Settings) -> None:
        self.agent = agent
        self.s = s
        self.X = np.ascontiguousarray(X, dtype=np.float64)
        self.y = np.asarray(y).astype(np.int64)
        if self.y.size and (self.y.min() < 0 or self.y.max() >= s.K):
            raise ValueError(f"agent {agent}: labels outside 0..{s.K - 1}")
        self.n = self.X.shape[0]
        self.row_l1 = np.abs(self.X).sum(axis=1)
        shape = (s.runs, s.J, s.K)
        self.z = np.zeros(shape)
        self.lam = np.zeros(shape)
        self.gens = run_streams(s.seed, "noise", agent, s.run_ids)
        cal = s.calibration[agent] if s.calibration else None
        outp_ok = s.outp_noise_std == "sigma" and (s.calibrated or not (
            s.outp_calibration == "paper" and 1 <= s.eps_bar < math.inf))
        self.release = OwnerRelease(agent, s.runs, cal,
                                    budget_eps=math.inf if s.calibrated else s.budget_eps,
                                    certified=outp_ok if s.method == "outp" else True,
                                    data_dependent=s.method != "outp"
                                    and s.sens_mode not in ("global", "bound"),
                                    mechanism="gaussian" if s.method == "outp" else "laplace")
        # evaluation-only logs of the last iteration, per run
        self.noise_mag = np.zeros(s.runs)
        self.scale = np.zeros(s.runs)
        self.z_change = np.zeros(s.runs)

    #: what a checkpoint holds to continue this agent bit for bit (with its noise position)
    STATE = ("z", "lam", "ledger", "noise_mag", "scale", "z_change")

    def contribution(self, rho: float) -> np.ndarray:
        """rho z_p - lam_p: what the server sums (R, J, K)."""
        return steps.server_contribution(rho, self.z, self.lam)

    def next_event(self, t: int, rho: float) -> LaplaceEvent | GaussianEvent:
        """The event of this agent's release at iteration t (its eps does not depend on the data:
        a data-dependent sensitivity moves the noise scale with it)."""
        s = self.s
        if s.method == "outp":
            return self._outp_noise(t, rho)[1]
        scale = 0.0 if math.isinf(s.eps_bar) else 1.0 / s.eps_bar
        return self.release.event(1.0, scale)

    def _outp_noise(self, t: int, rho: float) -> tuple[float, GaussianEvent]:
        """OutP at iteration t: 1/eta_p^t and the event of the release (L2 sensitivity, the std
        actually used; uncertified for the sigma^2 quirk or the paper's eps >= 1): sigma is the
        calibrated multiplier x the sensitivity (stated at the owner's delta), or the paper's
        (eps_bar, dp_delta) Gaussian."""
        s = self.s
        inv_eta = steps.outp_inv_eta(t, s.prox_scale, self.n, s.eps_bar, s.dp_delta)
        sens = steps.outp_l2_sensitivity(rho, inv_eta)
        if s.calibrated:
            sigma = 0.0 if math.isinf(s.eps_bar) else s.noise_multiplier * sens
            delta = self.release.calibration.plan.delta
        else:
            sigma = steps.outp_sigma(rho, inv_eta, s.eps_bar, s.dp_delta, s.outp_calibration)
            delta = s.dp_delta
        return inv_eta, self.release.event(sens, steps.outp_noise_std(sigma, s.outp_noise_std),
                                           delta=delta)

    def step_objective(self, w: np.ndarray, t: int, rho: float) -> None:
        """ObjT / ObjP agent update (lines 2-5 of iteration t) and the dual update."""
        s = self.s
        G, terms_max = multinomial.grad_sum_and_terms_max(self.X, self.y, self.z, self.row_l1)
        g = steps.agent_gradient(G, s.I, s.gamma, s.P, self.z, w, s.reg_grad)
        # terms_max = max_i ||x_i||_1 ||h_i - y_i||_1 over this agent's records (per run)
        sens = np.broadcast_to(np.asarray(steps.sensitivity(terms_max, s.I, s.sens_mode, s.J,
                                                            s.row_bound)),
                               (s.runs,))
        b = np.broadcast_to(np.asarray(steps.laplace_scale(sens, s.eps_bar)), (s.runs,))
        xi, ev = self.release.laplace_noise(self.gens, s.J * s.K, sens, scale=b)
        xi = xi.reshape(self.z.shape)
        bound = s.box
        if s.method == "objt":
            delta = steps.delta_objt(t, s.prox_scale, s.tr_schedule)
            z_new = steps.objt_update(w, self.lam, g, self.z, xi, rho, delta, bound)
        else:
            eta = steps.eta_objp(t, s.prox_scale)
            z_new = steps.objp_update(w, self.lam, g, self.z, xi, rho, eta, bound)
        # the audit sees the perturbed linear term g + xi: z_new (what the server gets) is a
        # function of it and of w, lam, z, which the server already knows
        if tap.enabled():
            self.release.report((g + xi).reshape(s.runs, -1), None, ev)
        self._finish(z_new, xi, b)
        self.lam = steps.dual_update(self.lam, rho, w, self.z)

    def step_outp(self, w: np.ndarray, t: int, rho: float) -> None:
        """OutP agent update from w^t: proximal step, then Gaussian output noise."""
        s = self.s
        G = multinomial.grad_sum(self.X, self.y, self.z)
        g = steps.outp_gradient(G, self.n, s.gamma, w)  # local average, regulariser at w^t
        inv_eta, ev = self._outp_noise(t, rho)
        z_new = steps.outp_update(w, self.lam, g, self.z, rho, inv_eta)
        noise, ev = self.release.gaussian_noise(self.gens, s.J * s.K, ev.l2_sensitivity,
                                                sigma=ev.sigma, delta=ev.delta)
        noise = noise.reshape(self.z.shape)
        released = z_new + noise
        self.release.report(released.reshape(s.runs, -1), None, ev)
        self._finish(released, noise, np.full(s.runs, ev.sigma))

    def outp_dual(self, w: np.ndarray, rho: float) -> None:
        self.lam = steps.dual_update(self.lam, rho, w, self.z)

    def _finish(self, z_new: np.ndarray, noise: np.ndarray, scale: np.ndarray) -> None:
        if not np.all(np.isfinite(z_new)):
            raise NumericalError(f"agent {self.agent}: non-finite local model (diverging?)")
        R = self.s.runs
        self.noise_mag = np.abs(noise).reshape(R, -1).mean(axis=1)
        self.scale = np.asarray(scale, dtype=np.float64)
        self.z_change = np.abs(z_new - self.z).reshape(R, -1).mean(axis=1)
        self.z = z_new

    def metrics(self, w: np.ndarray) -> np.ndarray:
        """Evaluation-only per-run values at w: [loss sum, ||w - z_p||_1, noise_mag, scale,
        z_change, misclassified own records], shape (N_METRICS R,)."""
        loss = multinomial.loss_sum(self.X, self.y, w)
        cv = np.abs(w - self.z).reshape(self.s.runs, -1).sum(axis=1)
        wrong = multinomial.errors(self.X, self.y, w).astype(np.float64)
        return np.concatenate([loss, cv, self.noise_mag, self.scale, self.z_change, wrong])

    def label_counts(self) -> np.ndarray:
        """Evaluation-only: records of each class 0..K-1 among this agent's records (K,)."""
        return np.bincount(self.y, minlength=self.s.K).astype(np.float64)


#: per-run values in Agent.metrics
N_METRICS = 6


def baselines(star: Star, agents: list[Agent], s: Settings, test: tuple | None
              ) -> dict[str, float] | None:
    """Evaluation-only trivial predictors (collective; the server gets them, others None).

    majority_label: the most frequent training label (the smallest on a tie, as argmax); the
    error of always predicting it and of w = 0 (all scores 0: argmax picks class 0) on the
    training records (train_error_*) and on the test set (test_error_*, when there is one).
    Label counts are added in agent order.
    """
    local = np.array([a.label_counts() for a in agents]).reshape(len(agents), s.K)
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


def reference_optimum(star: Star, agents: list[Agent], s: Settings, max_iter: int,
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

    def fg(w: np.ndarray) -> tuple[float, np.ndarray]:
        W = np.asarray(w, dtype=np.float64).reshape(J, K)
        local = np.empty((len(agents), size))
        for j, a in enumerate(agents):
            local[j, 0] = multinomial.loss_sum(a.X, a.y, W)[0]
            local[j, 1:] = multinomial.grad_sum(a.X, a.y, W)[0].reshape(-1)
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


def train_error(star: Star, agents: list[Agent], s: Settings, W: np.ndarray) -> float | None:
    """Training error of one model W over every agent's records (collective; the server gets
    it, others None; evaluation-only)."""
    local = np.array([float(multinomial.errors(a.X, a.y, W)[0]) for a in agents])
    parts = star.gather_agents(local.reshape(len(agents), 1), (1,))
    return None if parts is None else float(agent_order_sum(parts)[0] / s.I)


def _server_model(star: Star, agents: list[Agent], s: Settings, rho: float) -> np.ndarray:
    """w = Proj_W(U / (P rho)), U = sum_p (rho z_p - lam_p) in agent order; Bcast to all ranks."""
    shape = (s.runs, s.J, s.K)
    size = s.runs * s.J * s.K
    local = np.empty((len(agents), size))
    for j, a in enumerate(agents):
        local[j] = a.contribution(rho).reshape(-1)
    w = np.empty(shape)
    if s.aggregate == "gather":
        parts = star.gather_agents(local, (size,))
        if parts is not None:
            w[:] = steps.server_average(agent_order_sum(parts).reshape(shape), s.P, rho, s.box)
    else:
        total = star.reduce_sum(agent_order_sum(local) if len(agents) else np.zeros(size))
        if total is not None:
            w[:] = steps.server_average(total.reshape(shape), s.P, rho, s.box)
    return star.bcast(w)


def iterate(star: Star, agents: list[Agent], s: Settings, w: np.ndarray, t: int,
            rho: float) -> np.ndarray:
    """Iteration t (collective): the server's and the agents' updates of the method; returns the
    server's model of the iteration (ObjT/ObjP: computed from the agents' states before their
    step; OutP: from their releases after their step from the previous w)."""
    if s.method == "outp":
        for a in agents:
            a.step_outp(w, t, rho)
        w = _server_model(star, agents, s, rho)
        for a in agents:
            a.outp_dual(w, rho)
    else:
        w = _server_model(star, agents, s, rho)
        for a in agents:
            a.step_objective(w, t, rho)
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
    ledgers: list[Ledger]
    iterations: np.ndarray
    eps_total_basic: np.ndarray
    delta_total_basic: np.ndarray
    ended_at: int
    end_reason: str
    seconds: float
    baselines: dict[str, float]


def run_config(star: Star, agents: list[Agent], s: Settings, test: tuple | None,
               recorder=None, label: str = "", progress: bool = True,
               hooks: RunHooks | None = None) -> AdmmResult | None:
    """Run one configuration (collective). `test` = (X, y) on the server (test error of w).
    `hooks` (the runner's RunHooks) record, report progress and checkpoint; without them they
    are built from `recorder`, `label` and `progress`.

    Returns, on the server, the final models, the privacy accounting and (outside an audit) the
    evaluation-only trivial baselines (`baselines`): an AdmmResult; None elsewhere.
    """
    hooks = RunHooks.of(hooks, recorder, label, star.comm, progress)
    R = s.runs
    w = np.zeros((R, s.J, s.K))
    t0 = time.perf_counter()
    hooks.start(s.T, "iteration")
    trivial = baselines(star, agents, s, test) if tap.evaluating() else None

    def record(k: int, rho: float) -> None:
        if not tap.evaluating():  # an audit: evaluation-only, nothing here leaves an owner
            return
        vals = np.array([a.metrics(w) for a in agents]).reshape(len(agents), N_METRICS * R)
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

    saved = load_checkpoint(star, hooks, agents, clock="t")
    k0 = 0
    if saved is None:
        record(0, s.rho(0))
    else:  # resume: the server's model (the agents' states, ledgers and noise are restored)
        k0, w = saved["k"], saved["w"].copy()
    ended_at, end_reason = s.T, "reached T"
    for t in range(k0, s.T):
        rho = s.rho(t)
        if math.isfinite(s.budget_eps) and not _all_can_release(star, agents, t, rho):
            ended_at = t
            end_reason = (f"ended at t={t}: an agent's budget eps={s.budget_eps:g} has no room "
                          "for another release (basic composition)")
            if t % s.record_every != 0:
                record(t, s.rho(max(t - 1, 0)))
            break
        w = iterate(star, agents, s, w, t, rho)
        k = t + 1
        if k % s.record_every == 0 or k == s.T:
            record(k, rho)
            save_checkpoint(star, hooks, k, s.T, agents, w=w)
    ledgers = star.gather_objects([a.ledger for a in agents])
    if not star.is_learner:
        return None
    ledgers = sorted((lg for part in ledgers for lg in part), key=lambda lg: lg.agent)
    iters = np.array([int(lg.releases.max()) for lg in ledgers], dtype=np.int64)
    return AdmmResult(final=w, ledgers=ledgers, iterations=iters,
                      eps_total_basic=np.array([lg.spent_eps.max() for lg in ledgers]),
                      delta_total_basic=np.array([lg.spent_delta.max() for lg in ledgers]),
                      ended_at=ended_at, end_reason=end_reason,
                      seconds=time.perf_counter() - t0, baselines=trivial or {})


def _all_can_release(star: Star, agents: list[Agent], t: int, rho: float) -> bool:
    """Whether every agent's ledger has room for its release at iteration t (collective)."""
    ok = all(a.ledger.can_charge(a.next_event(t, rho)) for a in agents)
    return star.all_true(ok)
