"""Method entry of DP inexact ADMM (seed 002): job keys, set-up, outputs.

The server (rank 0) evaluates the test error of the global model on the shard file's global test
set, or on the union of the agents' own test sets (FEMNIST); test data are not private.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
from mpi4py import MPI

from ..algorithms import admm, optimum_cache
from ..comm.star import Star
from ..data import ShardFile
from ..data.bounds import row_norm_bound
from ..errors import JobError
from ..jobspec import (
    COUNT,
    INDEX,
    NONNEG,
    OPEN_UNIT,
    POSITIVE,
    POSITIVE_OR_INF,
    CommKeys,
    Section,
    err,
    key,
)
from ..models import multinomial
from ..privacy import GAUSSIAN_CALIBRATIONS, rules, tap
from ..privacy.contract import Contract
from .base import (
    Configured,
    Context,
    Method,
    Outcome,
    Resolved,
    RunHooks,
    Signal,
    backend_for,
    default_of,
    default_records,
    footprint_of,
    ledger_delta,
    owner_plans,
    settings_attrs,
)

_S = admm.Settings
_NUM = (int, float)
EVALUATION_ONLY = ("metrics train_cost, train_error, consensus, noise_mag, lap_scale and "
                   "z_change and the trivial baselines reference/*_majority, *_zero, "
                   "majority_label are evaluation-only (computed from un-noised agent data or "
                   "states); test_error uses the public test set")
PREDICTION_RULE = ("y_hat = argmax_k (x W)_k, the first class on ties: W = 0 predicts class 0 "
                   "for every record")
BASELINE_WHAT = {
    "majority_label": "the most frequent label of the agents' training records (smallest on a "
                      "tie)",
    "train_error_majority": "error of always predicting majority_label, on the training records",
    "train_error_zero": "error of W = 0 (always class 0), on the training records",
    "test_error_majority": "error of always predicting majority_label, on the test set",
    "test_error_zero": "error of W = 0 (always class 0), on the test set",
    "w_star": "the non-private optimum of F (same objective and box), L-BFGS-B over every "
              "agent's records",
    "train_error_star": "error of w_star on the training records",
    "test_error_star": "error of w_star on the test set",
}


def optimum_utility(w_star: np.ndarray, train_err: float | None, test: tuple | None
                    ) -> dict[str, Any]:
    """reference/w_star and its errors (server side)."""
    out: dict[str, Any] = {"w_star": w_star}
    if train_err is not None:
        out["train_error_star"] = train_err
    if test is not None and len(test[1]):
        out["test_error_star"] = float(multinomial.errors(test[0], test[1], w_star)[0]
                                       / len(test[1]))
    return out


def _d(field: str) -> Any:
    return default_of(_S, field)


@dataclasses.dataclass(frozen=True)
class AdmmKeys(Section):
    """The [admm] section of a job (`ctx.job.section(AdmmKeys)`)."""

    NAME: ClassVar[str] = "admm"
    gamma: float = key(_NUM, _d("gamma"), "regularisation weight: F(w) = loss + gamma ||w||_F^2",
                       within=NONNEG)
    rho: str | float = key(
        (str,) + _NUM, "auto", "penalty: auto (B^2 max_p n_p / (2 I), the smoothness bound of the "
        "largest agent's share of F from the shard's public row-norm bound B (`data prepare "
        "--row-norm l2`); (21) when the shard has no bound), dynamic_1 = min(1e9, c1 "
        "1.2^floor((t+1)/T_c) + c2/eps) (21), dynamic_2 = (21)/100, or a constant",
        within=POSITIVE)
    rho_c1: float = key(_NUM, _d("rho_c1"), "c1 of (21) (MNIST 2, FEMNIST 0.005)",
                         within=NONNEG)
    rho_c2: float = key(_NUM, _d("rho_c2"), "c2 of (21) (MNIST 5, FEMNIST 0.05)",
                         within=NONNEG)
    rho_tc: int = key((int,), _d("rho_tc"), "T_c of (21) (MNIST 10000, FEMNIST 2000)",
                     within=COUNT)
    prox_scale: float = key(_NUM, _d("prox_scale"), "a: eta^t = a/sqrt(t+1) (ObjP), delta^t "
                            "(ObjT), OutP's eta", within=POSITIVE)
    tr_schedule: str = key((str,), _d("tr_schedule"), "ObjT trust radius: const (delta = a, the "
                           "released code) or inv_sq (a/(t+1)^2, the paper's prose)",
                           ("const", "inv_sq"))
    sens_mode: str = key(
        (str,), "auto", "l1 sensitivity: auto (bound where the shard has a public row-norm bound "
        "B, else global; the default), bound (4 sqrt(J) B / I: every record's L2 norm <= B, "
        "data-independent, certified), global (4 J / I: x in [0,1]^J, data-independent, "
        "certified), local_max (the authors' code: max over the agent's records at z_p / I; "
        "reads private data to set the noise, recorded as a data-dependent calibration) or "
        "local_max_x2 (replace-one)", ("auto", "bound", "global", "local_max", "local_max_x2"))
    outp_noise_std: str = key(
        (str,), _d("outp_noise_std"), "OutP noise std: sigma (Huang et al., the fair baseline) "
        "or sigma_sq (the authors' code; less noise than calibrated: recorded uncertified)",
        ("sigma", "sigma_sq"))
    outp_calibration: str = key(
        (str,), _d("outp_calibration"), "OutP Gaussian calibration: auto (classical "
        "sqrt(2 ln(1.25/delta))/eps below eps = 1, where its proof holds, analytic (Balle & "
        "Wang) from eps = 1 on), classical (refuses eps >= 1), analytic (every eps), paper "
        "(classical at every eps, as the authors: not DP for eps >= 1, recorded uncertified)",
        (*GAUSSIAN_CALIBRATIONS, "paper"))
    reg_grad: str = key((str,), _d("reg_grad"), "regulariser gradient in ObjT/ObjP: consistent "
                        "(2 gamma/P z_p) or code (2 gamma w)", ("consistent", "code"))
    w_bound: float = key(_NUM, _d("w_bound"), "box W = [-B, B]^(J x K) (inf: unconstrained, the "
                         "final code; 1.0: the April 2021 code)", within=POSITIVE_OR_INF)
    dp_delta: float = key(
        _NUM, _d("dp_delta"), "OutP's per-iteration delta: of the paper rule's (eps_bar, "
        "dp_delta) Gaussian, and of Huang et al.'s step schedule 1/eta^t (under a calibrated "
        "rule: at the per-iteration eps of the calibrated sigma)", within=OPEN_UNIT)
    reference_iters: int = key(
        (int,), 100, "iterations (full passes) of the L-BFGS-B that solves the non-private "
        "optimum w* beside test_error (evaluation-only; stops earlier at gradient 1e-8; attrs "
        "w_star_iterations, w_star_gradient; cached across jobs as theta* is: "
        "MPI_DP_REFERENCE_CACHE); 0: no w*", within=INDEX)
    budget_eps: float = key(
        _NUM, _d("budget_eps"), "privacy.calibration = 'paper' only: each agent's total over "
        "all iterations by basic composition: a release beyond it is refused and the run ends "
        "there (inf: no cap, the paper's per-iteration guarantee); a calibrated rule is limited "
        "by its plan instead", within=POSITIVE_OR_INF)

SECTION = AdmmKeys.keys()


@dataclasses.dataclass(frozen=True)
class Prepared:
    local: dict  # agent -> (X, y), every hosted agent's records read once
    test: tuple | None  # (X, y) on the server
    K: int
    optima: dict = dataclasses.field(default_factory=dict)  # (n, gamma, box) -> w* (reference)


def n_classes(star: Star, local: dict, test: tuple | None) -> int:
    """K = 1 + the largest label over every agent and the test set (collective)."""
    top = max([int(y.max()) for _, y in local.values() if y.size] + [0])
    if test is not None:
        top = max(top, int(test[1].max()))
    return int(star.comm.allreduce(top, op=MPI.MAX)) + 1


def as_classes(pair: tuple | None, task: str) -> tuple | None:
    """A binary shard's labels -1/+1 as the classes 0/1 of a two-class multinomial model (labels
    of a multiclass shard pass through); None stays None."""
    if pair is None or task != "binary":
        return pair
    X, y = pair
    return X, np.where(np.asarray(y) > 0, 1, 0).astype(np.int64)


def test_set(shard: ShardFile) -> tuple[np.ndarray, np.ndarray] | None:
    """The global test set, else the union of the agents' test sets, else None."""
    if shard.has_global_test:
        X, y = shard.read_test()
        return np.asarray(X, dtype=np.float64), np.asarray(y).astype(np.int64)
    parts = [shard.read_agent_test(i) for i in range(shard.n_agents) if shard.has_test(i)]
    if not parts:
        return None
    return (np.concatenate([np.asarray(X, dtype=np.float64) for X, _ in parts]),
            np.concatenate([np.asarray(y) for _, y in parts]).astype(np.int64))


def _eval_set_text(shard: ShardFile, test: tuple | None) -> str:
    """Which records test_error counts (the flag of `mpi-dp analyze` compares against it)."""
    if test is None:
        return "none: the shard file has no test set, only training error is recorded"
    where = ("the shard file's global test set /test" if shard.has_global_test
             else "the agents' own test splits, pooled")
    return f"{where} ({len(test[1])} records)"


class Admm(Method[Prepared, _S]):
    name = "admm"
    summary = ("DP inexact ADMM (seed 002): a server (rank 0) and P agents train a multiclass "
               "logistic regression by consensus ADMM; agents perturb their subproblems (ObjT, "
               "ObjP) or their outputs (OutP)")
    variants = admm.METHODS
    variant_help = ("objt (trust region, inf-norm; default) or objp (proximal): objective "
                    "perturbation with Laplace noise; outp: the DP-ADMM baseline (Gaussian output "
                    "perturbation, decreasing variance)")
    reads = ("comm.aggregate", "backend")
    sections = {"admm": AdmmKeys.keys()}
    legacy_keys = {"admm.method": "variant", "sweep.method": "sweep.variant"}
    variant_aliases = {"iadmm": None}
    label_variant = True
    key_help = {"T": "iterations (one release per agent and iteration)",
                "eps": "every agent's total over its T releases (one value for all agents; "
                "the per-iteration eps_bar is calibrated from it: attribute eps_bar)"}
    paper_rule = ("eps is eps_bar, every agent's budget PER ITERATION (the paper's statement; "
                  "its T releases compose to far more: see privacy/ledger)")
    default_metric = "test_error"

    def model_size(self, ctx: Context, prep: Prepared) -> int:
        return int(ctx.shard.n_features) * int(prep.K)

    def validate(self, values: dict[str, Any], path: str) -> None:
        rho = values["admm.rho"]
        if isinstance(rho, str) and rho not in ("auto", "dynamic_1", "dynamic_2"):
            raise err(path, "admm.rho", f"expected auto, dynamic_1, dynamic_2 or a number, got "
                      f"{rho!r}")
        if not isinstance(rho, str) and not 0 < rho < math.inf:
            raise err(path, "admm.rho", "a constant penalty must be a positive number")
        if values["admm.reference_iters"] < 0:
            raise err(path, "admm.reference_iters", "must be 0 (no w*) or more iterations")
        for name in ("admm.gamma", "admm.rho_c1", "admm.rho_c2"):
            if not 0 <= values[name] < math.inf:
                raise err(path, name, "must be a finite number >= 0")
        if values["admm.rho_tc"] < 1:
            raise err(path, "admm.rho_tc", "must be at least 1")
        for name in ("admm.prox_scale", "admm.w_bound", "admm.budget_eps"):
            if not values[name] > 0:
                raise err(path, name, "must be > 0")
        if not 0 < values["admm.dp_delta"] < 1:
            raise err(path, "admm.dp_delta", "must be in (0, 1)")
        if math.isfinite(values["admm.budget_eps"]) and values["privacy.calibration"] != "paper":
            raise err(path, "admm.budget_eps", "caps the paper rule's per-iteration releases by "
                      "basic composition; under privacy.calibration = "
                      f"'{values['privacy.calibration']}' eps is already each agent's total "
                      "(remove budget_eps, or set privacy.calibration = 'paper')")
        if values["privacy.calibration"] != "paper" and values["admm.outp_noise_std"] != "sigma":
            raise err(path, "admm.outp_noise_std", "'sigma_sq' (the authors' code) adds less "
                      "noise than the calibration: every agent would refuse its first release; "
                      "only with privacy.calibration = 'paper' (recorded uncertified)")
        if values["privacy.calibration"] != "paper" and values["admm.outp_calibration"] != "auto":
            raise err(path, "admm.outp_calibration", "is OutP's Gaussian calibration under the "
                      "paper's rule (privacy.calibration = 'paper'); a calibrated rule sets "
                      "OutP's noise from each agent's (eps, delta): remove it")
        if values["admm.outp_calibration"] == "classical" and \
                values["privacy.calibration"] == "paper":
            variants = values["sweep.variant"] or [values["variant"]]
            budgets = values["sweep.eps"] or [values["eps"]]
            flat = [e for b in budgets for e in (b if isinstance(b, list) else [b])]
            if "outp" in variants and any(1 <= e < math.inf for e in flat):
                raise err(path, "admm.outp_calibration", "the classical Gaussian calibration "
                          "holds only for eps < 1, and OutP runs at eps >= 1 here; use 'auto' or "
                          "'analytic' (Balle & Wang 2018), or 'paper' to reproduce the authors' "
                          "(uncertified) noise")

    def prepare(self, ctx: Context) -> Prepared:
        shard, star = ctx.shard, ctx.star
        if shard.is_sparse:
            raise JobError(f"job file {ctx.job.path}: admm needs dense features; {shard.path} is "
                           "CSR")
        def check_task() -> None:  # the same on every rank: one agreed message
            if shard.task not in ("multiclass", "binary"):
                raise JobError(f"job file {ctx.job.path}: admm trains a multinomial logistic "
                               f"model and needs a classification shard (multiclass labels "
                               f"0..K-1, or binary -1/+1); {shard.path} holds a {shard.task} "
                               "task (prepare the data with --task multiclass or --task binary)")

        ctx.agree(check_task)
        local = ctx.agree(lambda: {i: as_classes(shard.read_agent(i), shard.task)
                                   for i in star.local_agents})
        test = ctx.agree(lambda: as_classes(test_set(shard), shard.task)
                         if star.is_learner else None)
        K = n_classes(star, local, test)
        return Prepared(local, test, 2 if shard.task == "binary" else K)

    def header(self, ctx: Context, prep: Prepared) -> str:
        return f"J={ctx.shard.n_features}, K={prep.K}"

    def configure(self, ctx: Context, prep: Prepared, rc: Resolved) -> Configured[_S]:
        """The settings (no calibration: eps_bar comes from the contract at run time), T
        releases per agent (one per iteration) at one delta for every agent (the smallest of
        theirs: the rho schedule (21) and OutP's steps read one per-iteration eps), the paper
        rule with the job's knobs (seed 002: eps_bar per iteration)."""
        job = ctx.job
        k, g = job.section(AdmmKeys), job.generic
        if len(set(rc.eps)) != 1:
            raise JobError(f"job file {job.path}: key 'eps': admm uses one per-iteration budget "
                           f"eps_bar for every agent, got {rc.eps}")
        rho, rule = k.rho, "the job file"
        B = row_norm_bound(ctx.shard)
        auto_rho = rho == "auto" and B is not None
        if rho == "auto" and B is None:
            rho, rule = "dynamic_1", ("(21) with rho_c1, rho_c2, rho_tc: the shard has no public "
                                      "row-norm bound for rho = 'auto'")
        elif auto_rho:
            assert B is not None  # auto_rho: the shard has B
            rho = B * B * max(rc.n) / (2.0 * sum(rc.n))
            rule = (f"auto: B^2 max_p n_p / (2 I) with the shard's public row-norm bound B = "
                    f"{B:g}, plus b sqrt(J K / P) (b: ObjT/ObjP's Laplace scale)")
        sens = k.sens_mode
        if sens == "auto":
            sens = "global" if B is None else "bound"
        elif sens == "bound" and B is None:
            raise JobError(f"job file {job.path}: key 'admm.sens_mode': 'bound' needs the shard's "
                           f"public row-norm bound (/public/row_norm_max), which {ctx.shard.path} "
                           "lacks (prepare it with --row-norm l2), or use 'global'")
        s = _S(
            rho_rule=rule, method=rc.variant, T=g.T, n=tuple(rc.n),
            J=ctx.shard.n_features, K=prep.K, gamma=float(k.gamma),
            rho_mode="auto" if auto_rho else rho if isinstance(rho, str) else "static",
            row_bound=math.inf if B is None else B,
            rho_static=(float(rho) if not isinstance(rho, str) else 1.0),
            rho_c1=float(k.rho_c1), rho_c2=float(k.rho_c2), rho_tc=int(k.rho_tc),
            prox_scale=float(k.prox_scale), tr_schedule=k.tr_schedule, sens_mode=sens,
            outp_noise_std=k.outp_noise_std, outp_calibration=k.outp_calibration,
            reg_grad=k.reg_grad, w_bound=float(k.w_bound), dp_delta=float(k.dp_delta),
            budget_eps=float(k.budget_eps), seed=g.seed, run_ids=ctx.run_ids,
            record_every=g.record_every, aggregate=job.section(CommKeys).aggregate,
            backend=backend_for(ctx, rc.n))
        outp = s.method == "outp"
        plans = owner_plans(ctx, rc, rc.n, "gaussian" if outp else "laplace", s.T)
        delta = min(p.delta for p in plans)
        plans = [dataclasses.replace(p, delta=delta) for p in plans]
        # ObjT/ObjP perturb agent p's gradient of its share of F, a sum of n_p per-record terms
        # over I: sensitivity 2 / n_p of its bound. OutP perturbs the model itself: not defined.
        signal = None if outp else Signal(tuple(2.0 / n for n in rc.n[: len(rc.eps)]),
                                          s.J * s.K)
        records = default_records(ctx)
        attrs = {**settings_attrs(s),
                 "n_test": 0 if prep.test is None else len(prep.test[1]),
                 "eval_set": _eval_set_text(ctx.shard, prep.test),
                 "prediction": PREDICTION_RULE,
                 "dp_strict": s.sens_mode in ("global", "bound") or outp,
                 **({"classes": "binary shard: label -1 is class 0, +1 is class 1 (K = 2)"}
                    if ctx.shard.task == "binary" else {}),
                 "evaluation_only": EVALUATION_ONLY}
        paper = rules.PerIteration(gaussian_calibration=s.outp_calibration, dp_delta=s.dp_delta,
                                   budget_eps=s.budget_eps)
        return Configured(rc, s, tuple(plans),
                          footprint_of(ctx, records, self.model_size(ctx, prep)), records,
                          attrs, signal, paper)

    def run(self, ctx: Context, prep: Prepared, c: Configured[_S], contract: Contract,
            hooks: RunHooks) -> Outcome | None:
        s, rc = c.settings, c.resolved
        # what the contract sets: the per-iteration eps_bar and the noise it comes from
        noise = contract.noise(0)
        eps_bar = admm.iteration_eps(contract, s)
        if contract.rule.paper:
            what = ("(eps_bar, delta)-DP per iteration (Gaussian)" if s.method == "outp"
                    else "eps_bar-DP per iteration (Laplace objective perturbation)")
        else:
            what = (f"each agent's T = {s.T} releases are (eps, delta)-DP in total (eps the "
                    "job's, delta the ledger's), calibrated by "
                    f"{contract.rule.name}; eps_bar is the per-iteration eps it gives")
        hooks.attrs(eps_bar=eps_bar,
                    noise_multiplier=math.nan if noise is None else noise.noise_multiplier,
                    privacy=what)
        # the hosted agents step as one block (their records stacked by record count)
        agents = ctx.agree(lambda: admm.AgentBlock(
            [admm.Agent(i, X[: rc.n[i]], y[: rc.n[i]], s, contract)
             for i, (X, y) in prep.local.items()], s, contract))
        w_star = star_err = None
        iters = ctx.job.section(AdmmKeys).reference_iters
        if tap.evaluating() and iters > 0:
            optimum = (s.n, s.gamma, s.box)
            if optimum not in prep.optima:  # once per job, and across jobs by the disk cache
                def solve() -> optimum_cache.Optimum:
                    w, nit, grad = admm.reference_optimum(ctx.star, agents, s, iters)
                    return w, admm.train_error(ctx.star, agents, s, w), nit, grad

                key = ctx.agree(lambda: optimum_cache.admm_key(
                    ctx.shard, n=s.n, J=s.J, K=s.K, gamma=s.gamma, w_bound=s.w_bound,
                    iters=iters, backend=s.backend) if ctx.star.is_learner else None)
                prep.optima[optimum] = optimum_cache.cached_optimum(ctx.star, key, (s.J, s.K),
                                                                    solve)
            w_star, star_err, nit, grad = prep.optima[optimum]
        out = admm.run_config(ctx.star, agents, s, contract, prep.test, hooks=hooks,
                              ledger_delta=ledger_delta(ctx, rc))
        if out is None:
            return None
        if contract.rule.paper:
            guarantee = ("the paper's rule: per iteration, each released z_p is eps_bar-DP "
                         "(ObjT/ObjP, Laplace) or (eps_bar, dp_delta)-DP (OutP, Gaussian) for "
                         "agent p's data; it composes nothing across iterations, the totals here "
                         "compose all of an agent's releases")
        else:
            guarantee = (f"each agent's T releases of z_p (ObjT/ObjP: Laplace objective "
                         "perturbation; OutP: Gaussian output perturbation) together are (eps, "
                         "delta)-DP for its records (replace-one), the noise calibrated by "
                         f"{contract.rule.name} ({contract.rule.text}); eps_pld is the tight "
                         "total")
        res = Outcome(out.ledgers, guarantee=guarantee)
        res.add("models/final", out.final)
        for name, value in out.baselines.items():
            res.add(f"reference/{name}", value, evaluation_only=True, what=BASELINE_WHAT[name])
        if w_star is not None:
            for name, value in optimum_utility(w_star, star_err, prep.test).items():
                res.add(f"reference/{name}", value, evaluation_only=True, what=BASELINE_WHAT[name])
            res.attrs.update(w_star_iterations=nit, w_star_gradient=grad)
        res.attrs.update(eps_total_basic=float(np.max(out.eps_total_basic)),
                         seconds=round(out.seconds, 3), ended_at=out.ended_at,
                         end_reason=out.end_reason)
        return res

    def analyze(self, result: Any, metric: str | None = None) -> str:
        from ..analysis import admm_figures, table

        if metric in (None, self.default_metric):
            return admm_figures.admm_table_text(result)
        return table.analyze_text(result, metric=metric)

    def table_rows(self, result: Any, metric: str | None = None) -> list[dict[str, Any]]:
        from ..analysis import admm_figures, table

        if metric in (None, self.default_metric):
            return admm_figures.admm_table(result)
        return table.summarize(result, metric=metric)

    def figures(self, result: Any, prefix: Path, metric: str | None = None) -> list[Path]:
        from ..analysis import admm_figures

        return admm_figures.plot_admm(result, prefix)


METHOD = Admm()
