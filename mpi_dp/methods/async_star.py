"""Method entry of asynchronous DP learning on a star (seed 000): job keys, set-up, outputs.

Owners beyond a configuration's N (owners, sweep.owners) hold no records in it, so reference
quantities and psi are computed on the participants only (spec §5).
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any, ClassVar

import h5py
import numpy as np

from ..algorithms import async_star
from ..comm.p2p_star import P2PStar
from ..comm.schedule import Scheduler
from ..errors import JobError
from ..jobspec import (
    INDEX,
    POSITIVE,
    Job,
    PrivacyKeys,
    Section,
    SharedKeys,
    StepKeys,
    err,
    key,
    resolve_per_owner,
)
from ..privacy import rules
from ..privacy.contract import Contract
from .base import (
    Configured,
    Context,
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
from .star_common import (
    STAR_READS,
    StarMethod,
    StarPrepared,
    add_reference_outputs,
    agreed_public_constants,
    evaluation_set,
    lap_scale_formula,
    section_of_values,
    star_guarantee,
    utility_attrs,
)

_S = async_star.Settings
EVALUATION_ONLY = ("metrics psi, objective, dist_sq, train_error, test_error, train_mse, "
                   "privacy/clip_fraction and reference/* (theta*, the trivial baselines) are "
                   "evaluation-only (oracle=True): computed from un-noised owner data, never part "
                   "of the private protocol")

@dataclasses.dataclass(frozen=True)
class AsyncKeys(Section):
    """The [async] section: who is served when, the owners' caps and the step gain."""

    NAME: ClassVar[str] = "async"
    mode: str = key((str,), default_of(_S, "mode"), "replay: a seeded schedule decides who is "
                    "served (bitwise reproducible); live: owners' Poisson clocks tick in wall time",
                    ("replay", "live"))
    scheduler: str = key((str,), default_of(_S, "scheduler"), "replay schedule: poisson "
                         "(independent clocks of rate async.rates, t_1 = 0) or uniform (i_k ~ U, "
                         "t_k = k - 1)", ("poisson", "uniform"))
    rates: float | list = key((int, float, list), 1.0, "Poisson clock rate lambda_j of each owner "
                              "(scalar or one per owner; unequal rates leave the paper's 1/N law)",
                              within=POSITIVE)
    schedule_from: str = key((str,), "", "replay the schedule logged in this result file (e.g. of "
                             "a live run): same configuration index, run 0's schedule for all runs")
    protocol: str = key((str,), "owner_request", "live mode: owner_request (an owner asks when its "
                        "clock ticks) or learner_broadcast (the learner polls; the first owner to "
                        "claim is served)", ("owner_request", "learner_broadcast"))
    clock_unit_s: float = key((int, float), default_of(_S, "clock_unit_s"), "live mode: seconds "
                              "per unit of clock time (ticks are Exp(lambda) x clock_unit_s apart; "
                              "when owners tick faster than the learner serves, requests queue and "
                              "service is near round-robin)", within=POSITIVE)
    poll_interval_s: float = key((int, float), default_of(_S, "poll_interval_s"), "live "
                                 "learner_broadcast: seconds between polls when no owner claimed",
                                 within=POSITIVE)
    per_owner_cap: int | list | str = key(
        (int, list, str), "auto", "answers each owner gives before it declines (m_i; its noise "
        "is calibrated for m_i answers): 'schedule' (replay: the most answers the public, seeded "
        "schedule gives the owner in any run, known before any data is read, so it never "
        "declines), 'quantile' (the 0.999 quantile of its answers under the declared rates, "
        "Binomial(T, lambda_i / sum lambda): at its cap it declines and another owner is "
        "served), 0 = T (the paper's Theorem 1), or m_i > 0 (scalar or one per owner); 'auto' "
        "(default): T under privacy.calibration = 'paper', else 'schedule' in replay mode and "
        "'quantile' in live mode", within=INDEX)
    gamma: float = key((int, float), 0.1, "rho = 'auto': local gain gamma = a_own (n_i/n) L, so "
                       "rho = gamma T^2 lam / L_public (spec: keep gamma in [0.02, 0.3])",
                       within=POSITIVE)
    init: str = key((str,), "const", "initial models: const (theta0 everywhere) or uniform "
                    "(U[0,1)^p per run, the authors' lending setting)", ("const", "uniform"))
    preset: str = key((str,), "dp", "dp (clipping, i.i.d. noise; dp_valid = true) or paper_code "
                      "(the authors' code: xi = p/2, no clipping; dp_valid = false)",
                      ("dp", "paper_code"))
    noise_shape: str = key((str,), default_of(_S, "noise_shape"), "iid (DP) or scalar (one "
                           "Laplace value added to every coordinate, as in the authors' code: NOT "
                           "DP, paper_code only)", ("iid", "scalar"))


#: the [async] keys (kept for the tests and scripts that read the table)
SECTION = AsyncKeys.keys()


@dataclasses.dataclass(frozen=True)
class Prepared(StarPrepared):
    link: P2PStar | None = None  # the learner's one-on-one messaging with the owners' hosts


#: the quantile of an owner's answer count that per_owner_cap = 'quantile' allows
CAP_QUANTILE = 0.999
CAP_RULES = ("auto", "schedule", "quantile")


def cap_rule(job: Job) -> str:
    """What async.per_owner_cap resolves to: 'schedule', 'quantile' or 'fixed' (numbers)."""
    cap = job.section(AsyncKeys).per_owner_cap
    if not isinstance(cap, str):
        return "fixed"
    if cap != "auto":
        return cap
    if job.section(PrivacyKeys).calibration == "paper":
        return "fixed"  # the paper's m_i = T
    return "schedule" if job.section(AsyncKeys).mode == "replay" else "quantile"


def _caps(job: Job, N: int, n_file: int, seed: int, run_ids: tuple[int, ...],
          logged: np.ndarray | None = None) -> tuple[list[int], str]:
    """Each participating owner's cap m_i and how it was set (an attribute's text)."""
    T = job.generic.T
    rule = cap_rule(job)
    a = job.section(AsyncKeys)
    if rule == "schedule":
        counts = schedule_counts(job, N, n_file, seed, run_ids, logged)
        return [int(c) for c in counts], ("schedule: the most answers the public schedule gives "
                                          "the owner in any run")
    if rule == "quantile":
        rates = np.array(_rates(job, N, n_file))
        from scipy.stats import binom

        caps = [max(1, min(T, int(binom.ppf(CAP_QUANTILE, T, r / rates.sum())))) for r in rates]
        return caps, (f"quantile: the {CAP_QUANTILE} quantile of Binomial(T, lambda_i / sum "
                      "lambda), the owner's answers under the declared rates")
    cap = 0 if a.per_owner_cap == "auto" else a.per_owner_cap
    caps = resolve_per_owner(job, AsyncKeys.key_name("per_owner_cap"), cap, N, n_file)
    return [T if int(c) == 0 else int(c) for c in caps], "fixed: async.per_owner_cap (0 = T)"


def schedule_counts(job: Job, N: int, n_file: int, seed: int, run_ids: tuple[int, ...],
                    logged: np.ndarray | None = None) -> np.ndarray:
    """(N,) the most answers each owner gives in any run of the replay schedule of T iterations
    (the seeded Scheduler, or the logged schedule's owners): public, drawn before any data."""
    T = job.generic.T
    if logged is not None:
        return np.bincount(np.asarray(logged, dtype=np.int64)[:T], minlength=N)[:N]
    a = job.section(AsyncKeys)
    sched = Scheduler(a.scheduler, N, seed, run_ids, np.array(_rates(job, N, n_file)))
    runs = np.arange(len(run_ids))
    counts = np.zeros((len(run_ids), N), dtype=np.int64)
    for _ in range(T):
        own, _t = sched.next(runs)
        counts[runs, own] += 1
    return counts.max(axis=0)


def _rates(job: Job, N: int, n_file: int) -> tuple[float, ...]:
    rates = job.section(AsyncKeys).rates
    return tuple(float(r) for r in resolve_per_owner(job, AsyncKeys.key_name("rates"), rates, N,
                                                      n_file))


def load_logged_schedule(job: Job, index: int) -> tuple[np.ndarray, np.ndarray]:
    """(owner (k,), time (k,)) served in run 0 of configuration `index` of async.schedule_from."""
    path = job.section(AsyncKeys).schedule_from
    if not Path(path).is_file():
        what = "is a directory" if Path(path).is_dir() else "not found"
        raise JobError(f"job file {job.path}: key 'async.schedule_from': {path} {what}; give "
                       "the async_star result file whose schedule to replay")
    try:
        with h5py.File(path, "r", locking=False) as f:
            g = f[f"configs/{index:03d}"] if "configs" in f else f
            if "schedule/owner" not in g:
                raise JobError(f"job file {job.path}: key 'async.schedule_from': {path} has no "
                               f"logged schedule for configuration {index} (is it an async_star "
                               "result?)")
            owner = np.asarray(g["schedule/owner"][0], dtype=np.int64)
            t = np.asarray(g["schedule/time"][0], dtype=np.float64)
    except OSError as e:
        raise JobError(f"job file {job.path}: key 'async.schedule_from': {path} is not a "
                       f"readable HDF5 file ({e})") from None
    keep = owner >= 0
    return owner[keep], t[keep]


def settings_for(job: Job, eps: list[float], n: list[int], n_file: int, xi: float, rho: float,
                 p: int, run_ids: tuple[int, ...], variant: str | None = None,
                 caps: list[int] | None = None) -> _S:
    """The algorithm's settings of one configuration (variant: the job's unless given; caps:
    each owner's m_i, else async.per_owner_cap's numbers)."""
    N = len(n)
    g, sh, a = job.generic, job.section(SharedKeys), job.section(AsyncKeys)
    paper = a.preset == "paper_code"
    mode = a.mode
    if caps is None:
        caps = _caps(job, N, n_file, g.seed, run_ids)[0]
    return _S(
        T=g.T, loss=sh.loss, lam=float(sh.lam), theta_max=float(sh.theta_max),
        theta0=float(sh.theta0), init=a.init,
        xi=(p / 2 if paper else xi), clip=(False if paper else sh.clip), rho=rho,
        central_step=variant or g.variant, eps=tuple(eps), n=tuple(n),
        caps=tuple(caps), p=p, seed=g.seed, run_ids=run_ids,
        record_every=g.record_every, mode=mode, scheduler=a.scheduler,
        rates=_rates(job, N, n_file),
        protocol=(a.protocol if mode == "live" else "virtual"),
        clock_unit_s=float(a.clock_unit_s),
        poll_interval_s=float(a.poll_interval_s),
        noise_shape=a.noise_shape, dp_valid=not paper,
        backend=job.values["backend"])


class AsyncStar(StarMethod[Prepared, _S]):
    name = "async_star"
    summary = ("asynchronous DP learning on a star (seed 000): the learner (rank 0) serves one "
               "owner per iteration, which answers with a clipped, Laplace-noised mean gradient")
    variants = ("proof", "printed")
    variant_help = ("the central step c_L of (7): proof (rho/(2 T^2 lam), the proof and the "
                    "authors' code; default) or printed ((N-1) rho/(N T^2 lam))")
    reads = STAR_READS + ("owners", "sweep.owners")
    sections = {AsyncKeys.NAME: SECTION}
    key_help = {"T": "learner updates over all owners", "eps": "each owner's total for its at "
                "most m_i answers (async.per_owner_cap: by default its answers in the public "
                "schedule); its Laplace scale is "
                "b_i = nm_i 2 xi / n_i with nm_i from privacy.calibration"}
    paper_rule = ("eps_i split evenly over the m_i answers an owner may give (basic "
                  "composition, Theorem 1): b_i = 2 xi m_i / (n_i eps_i), m_i = T by default")

    def validate(self, values: dict[str, Any], path: str) -> None:
        a, name = section_of_values(AsyncKeys, values), AsyncKeys.key_name
        for r in a.rates if isinstance(a.rates, list) else [a.rates]:
            if isinstance(r, bool) or not isinstance(r, int | float) or not 0 < r < math.inf:
                raise err(path, name("rates"), f"rates must be positive finite numbers, got {r!r}")
        for field, v in (("clock_unit_s", a.clock_unit_s), ("poll_interval_s", a.poll_interval_s)):
            if not 0 < v < math.inf:
                raise err(path, name(field), f"must be a positive number of seconds, got {v!r}")
        cap = a.per_owner_cap
        if isinstance(cap, str):
            if cap not in CAP_RULES:
                raise err(path, name("per_owner_cap"), f"must be one of {', '.join(CAP_RULES)}, "
                          f"0 (= T) or a number of answers, got {cap!r}")
            if cap == "schedule" and a.mode == "live":
                raise err(path, name("per_owner_cap"), "'schedule' counts the replay schedule's "
                          "answers; a live schedule is not known in advance: use 'quantile' or "
                          "numbers")
        for c in cap if isinstance(cap, list) else [] if isinstance(cap, str) else [cap]:
            if isinstance(c, bool) or not isinstance(c, int) or c < 0:
                raise err(path, name("per_owner_cap"), f"caps must be integers >= 0 (0 = T), got "
                          f"{c!r}")
        if not 0 < a.gamma < math.inf:
            raise err(path, name("gamma"), "must be > 0")
        if a.noise_shape == "scalar" and a.preset != "paper_code":
            raise err(path, name("noise_shape"), "'scalar' noise (one Laplace value on every "
                      "coordinate) is not DP: allowed only with async.preset = 'paper_code'")
        if a.mode == "live" and a.schedule_from:
            raise err(path, name("schedule_from"), "a logged schedule is replayed in mode "
                      "'replay', not 'live'")

    def prepare(self, ctx: Context) -> Prepared:
        job = ctx.job
        step = job.section(StepKeys)
        pc = agreed_public_constants(ctx)
        if step.rho != "auto":
            rho = float(step.rho)
        else:
            rho = async_star.default_rho(job.section(AsyncKeys).gamma, job.generic.T,
                                         float(job.section(SharedKeys).lam), pc.L)
        link = P2PStar(ctx.comm, ctx.star.layout, ctx.shard.n_features)
        return Prepared(pc, rho, evalset=evaluation_set(ctx), link=link)

    def configure(self, ctx: Context, prep: Prepared, rc: Resolved) -> Configured[_S]:
        job = ctx.job
        backend_for(ctx, rc.n)  # the backend this rank can provide, before the output exists
        logged = None
        if job.section(AsyncKeys).schedule_from:
            # a bad file stops before any output; its owners are the schedule's
            mine = ctx.agree(lambda: load_logged_schedule(job, rc.index)[0]
                             if ctx.star.is_learner else None)
            logged = ctx.comm.bcast(mine, root=0)
        caps, cap_text = _caps(job, len(rc.n), ctx.shard.n_agents, job.generic.seed,
                               ctx.run_ids, logged)
        s = settings_for(job, rc.eps, rc.n, ctx.shard.n_agents, prep.public.xi, prep.rho,
                         ctx.shard.n_features, ctx.run_ids, variant=rc.variant, caps=caps)
        async_star.check_settings(s, job.path, ctx.comm.Get_size())
        a = job.section(AsyncKeys)
        def attrs() -> dict[str, Any]:  # made when the group is (after the footprint)
            return {**settings_attrs(s), "owners": s.N, "per_owner_cap_rule": cap_text,
                     "L": prep.public.L, "a_own": s.a_own,
                     "a_ctr": s.a_ctr, "preset": a.preset,
                     "scheduler": "logged" if a.schedule_from else s.scheduler,
                     "schedule_from": a.schedule_from,
                     "public_clip_fraction": prep.public.public_clip_fraction,
                     "constants_from": prep.public.source, "oracle": True,
                     "step_rule": "a_own = N rho/(T^2 lam); a_ctr = " + (
                         "rho/(2 T^2 lam) [proof]" if s.central_step == "proof"
                         else "(N-1) rho/(N T^2 lam) [printed]"),
                     **utility_attrs(s.loss, prep.evalset), "evaluation_only": EVALUATION_ONLY}
        records = default_records(ctx)
        # a mean of n_i gradients clipped to xi: sensitivity 2 xi / n_i of the signal's bound xi
        signal = Signal(tuple(2.0 / n for n in rc.n[: len(rc.eps)]), ctx.shard.n_features)
        # the trace of every iteration and run: owner, time, answer norm (8 bytes each) and more
        fp = footprint_of(ctx, records, ctx.shard.n_features, per_iteration_bytes=40.0)
        return Configured(rc, s, tuple(owner_plans(ctx, rc, rc.n, "laplace", s.caps)), fp,
                          records, attrs, signal, rules.BasicSplit())

    def run(self, ctx: Context, prep: Prepared, c: Configured[_S], contract: Contract,
            hooks: RunHooks) -> Outcome | None:
        star, job = ctx.star, ctx.job
        s, rc = c.settings, c.resolved
        hooks.attrs(lap_scale=async_star.lap_scales(contract, s))
        logged = None
        if job.section(AsyncKeys).schedule_from:
            logged = ctx.agree(lambda: load_logged_schedule(job, rc.index)
                               if star.is_learner else None)
        shards, ref = self.shards_and_reference(ctx, prep, s, rc.n)
        assert prep.link is not None  # prepare's
        out = async_star.run_config(star, prep.link, shards, s, contract, ref, logged=logged,
                                    evalset=prep.evalset, hooks=hooks,
                                    ledger_delta=ledger_delta(ctx, rc))
        if out is None:
            return None
        return _outcome(out, ref, s, contract)

    def figures(self, result: Any, prefix: Path, metric: str | None = None) -> list[Path]:
        from ..analysis import async_report

        return async_report.plot_async(result, prefix, self.metric_of(result, metric))


def _outcome(out: async_star.AsyncStarResult, ref, s: _S, contract: Contract) -> Outcome:
    N = s.N
    tr = out.trace
    res = Outcome(out.ledgers, guarantee=(
        star_guarantee(contract, "at most m_i answers")
        + ("" if s.dp_valid else "; preset paper_code: NOT DP (dp_valid = false)")))
    res.add("models/final", out.final)
    res.add("models/local", out.local)
    res.add("schedule/owner", tr.owner, what="i_k (0-based owner) of iteration k = 1..T; -1 "
            "after a run ended")
    res.add("schedule/time", tr.time, what="t_k: virtual time (replay) or wall seconds since "
            "the start (live)")
    res.add("schedule/response_norm", tr.resp_norm, what="||r_k||_2 of the DP answer")
    res.add("schedule/ended_at", tr.ended_at, reason=tr.end_reason or "reached T")
    res.add("schedule/declines", tr.decline_array(),
            reasons={str(k): v for k, v in async_star.REASONS.items()})
    if s.mode == "live":
        res.add("schedule/rtt_s", tr.rtt, what="learner's query-to-answer seconds")
        res.add("schedule/dropped_ticks", out.dropped_ticks,
                what="clock ticks dropped per host while a request was outstanding")
    if ref.has_optimum:
        f_star = out.f_star if out.f_star is not None else ref.f_star
        if not math.isfinite(f_star):
            raise JobError("the reference objective is not finite")
        ref = dataclasses.replace(ref, f_star=f_star)
    add_reference_outputs(res, ref, N, out.psi_isolated)
    res.add("privacy/answered", out.answered)
    res.add("privacy/spent_eps", out.spent_eps, composition="basic (sequential) sum of the "
            "per-release eps each owner spent, per run and owner (inf: eps = inf, no noise); the "
            "owner's guarantee is privacy/ledger's eps_pld (the tight total of the same releases)")
    res.add("privacy/clip_fraction", out.clip_fraction, evaluation_only=True,
            what="mean share of an owner's records clipped per answer")
    res.add("privacy/lap_scale", async_star.lap_scales(contract, s),
            formula=lap_scale_formula(contract, "m_i") + ", m_i = answers allowed "
            "(per_owner_cap_rule)" + ("" if s.noise_shape == "iid" else "; scalar noise: NOT DP"))
    return res


METHOD = AsyncStar()
