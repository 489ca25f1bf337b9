"""Method entry of synchronous DP gradient descent on a star (seed 001): job keys, set-up, outputs."""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import numpy as np

from ..algorithms import sync_star
from ..jobspec import NONNEG, CommKeys, Section, SharedKeys, StepKeys, err, key
from ..privacy import rules
from ..privacy.calibration import Sensitivity
from ..privacy.contract import Contract
from ..results.footprint import ITERATION_FLOPS
from .base import (
    Configured,
    Context,
    Outcome,
    Resolved,
    RunHooks,
    Signal,
    backend_for,
    default_records,
    footprint_of,
    ledger_delta,
    owner_plans,
    settings_attrs,
)
from .star_common import (
    STAR_READS,
    StarMethod,
    add_reference_outputs,
    agreed_public_constants,
    evaluation_set,
    lap_scale_formula,
    section_of_values,
    star_guarantee,
    utility_attrs,
)
from .star_common import StarPrepared as Prepared

EVALUATION_ONLY = ("metrics psi, psi_iterate, objective, clip_fraction, train_error, test_error, "
                   "train_mse and group reference (theta*, the trivial baselines) are "
                   "evaluation-only (oracle=True): computed from un-noised owner data, never part "
                   "of the private protocol")


#: the estimate's overhead of one synchronous round besides the owners' (broadcast, gather,
#: the learner's step and average: ~0.35 ms measured on the demo job), and the arithmetic of a
#: squared-loss iteration per run, record and feature (the owner's X^T X statistics and the
#: screening skip most records: ~1 measured at eps = 1; other losses: a full pass)
SYNC_ROUND_S, SQUARED_FLOPS = 0.35e-3, 1.0


@dataclasses.dataclass(frozen=True)
class AverageKeys(Section):
    """The [average] section: how alg2 averages its iterates."""

    NAME: ClassVar[str] = "average"
    kind: str = key((str,), "polynomial", "averaging of alg2", ("polynomial", "stepweighted"))
    eta: float = key((int, float), 3.0, "polynomial-decay parameter (0: uniform running mean)",
                     within=NONNEG)


class SyncStar(StarMethod[Prepared, sync_star.Settings]):
    name = "sync_star"
    summary = ("synchronous DP gradient descent on a star (seed 001): every owner answers every "
               "query of the learner (rank 0) with a clipped, Laplace-noised mean gradient")
    variants = ("alg2", "alg1")
    variant_help = ("alg2 (sub-gradient steps mu_k = rho/(T sqrt(k)) with polynomial-decay "
                    "averaging; default) or alg1 (mu_k = rho/(k T^2), smooth f)")
    reads = STAR_READS + ("comm.aggregate",)
    records_optional = True
    sections = {AverageKeys.NAME: AverageKeys.keys()}
    key_help = {"T": "queries each owner answers (T releases per owner)",
                "eps": "each owner's total for its T answers; its Laplace scale is "
                "b_i = nm_i 2 xi / n_i with nm_i from privacy.calibration"}
    paper_rule = ("eps_i split evenly over the T answers (basic composition, Theorem 1): "
                  "b_i = 2 xi T / (n_i eps_i), a pure eps_i-DP total")

    def validate(self, values: dict[str, Any], path: str) -> None:
        if section_of_values(AverageKeys, values).eta < 0:
            raise err(path, AverageKeys.key_name("eta"), "must be >= 0")

    def prepare(self, ctx: Context) -> Prepared:
        g, step = ctx.job.generic, ctx.job.section(StepKeys)
        pc = agreed_public_constants(ctx)
        rho = (float(step.rho) if step.rho != "auto" else
               sync_star.default_rho(g.variant, step.alpha, pc.L, g.T))
        return Prepared(pc, rho, evalset=evaluation_set(ctx))

    def _rho(self, ctx: Context, prep: Prepared, variant: str) -> float:
        g, step = ctx.job.generic, ctx.job.section(StepKeys)
        if step.rho != "auto" or variant == g.variant:
            return prep.rho
        return sync_star.default_rho(variant, step.alpha, prep.public.L, g.T)

    def configure(self, ctx: Context, prep: Prepared, rc: Resolved
                  ) -> Configured[sync_star.Settings]:
        job = ctx.job
        g, sh, avg = job.generic, job.section(SharedKeys), job.section(AverageKeys)
        s = sync_star.Settings(
            variant=rc.variant, T=g.T, loss=sh.loss, lam=float(sh.lam),
            theta_max=float(sh.theta_max), theta0=float(sh.theta0), xi=prep.public.xi,
            clip=sh.clip, rho=self._rho(ctx, prep, rc.variant), L=prep.public.L,
            avg_kind=avg.kind, eta=float(avg.eta), seed=g.seed,
            run_ids=ctx.run_ids, record_every=g.record_every,
            aggregate=job.section(CommKeys).aggregate, eps=tuple(rc.eps), n=tuple(rc.n),
            p=ctx.shard.n_features, schedule=job.section(StepKeys).schedule,
            backend=backend_for(ctx, rc.n))
        sync_star.check_settings(s, job.path)
        records = default_records(ctx)
        def attrs() -> dict[str, Any]:  # made when the group is (after the footprint)
            return {**settings_attrs(s), "public_clip_fraction": prep.public.public_clip_fraction,
                     "constants_from": prep.public.source,
                     "step_rule": ("mu_k = rho/(k T^2)" if s.variant == "alg1"
                                   else "mu_k = rho/(T sqrt(k))"),
                     **utility_attrs(s.loss, prep.evalset), "evaluation_only": EVALUATION_ONLY}
        # a mean of n_i gradients clipped to xi: sensitivity 2 xi / n_i of the signal's bound xi
        signal = Signal(tuple(2.0 / n for n in rc.n[: len(rc.eps)]), ctx.shard.n_features)
        fp = footprint_of(ctx, records, ctx.shard.n_features, iteration_s=SYNC_ROUND_S,
                          iteration_flops=SQUARED_FLOPS if s.loss == "squared" else
                          ITERATION_FLOPS)
        return Configured(rc, s, tuple(owner_plans(ctx, rc, rc.n, "laplace", s.T)), fp,
                          records, attrs, signal, rules.BasicSplit())

    def run(self, ctx: Context, prep: Prepared, c: Configured[sync_star.Settings],
            contract: Contract, hooks: RunHooks) -> Outcome | None:
        s, rc = c.settings, c.resolved
        n = rc.n
        shards, ref = self.shards_and_reference(ctx, prep, s, n)
        res = sync_star.run_config(ctx.star, shards, s, contract, ref, evalset=prep.evalset,
                                   hooks=hooks, ledger_delta=ledger_delta(ctx, rc))
        if res is None:
            return None
        assert ref is not None  # the learner's, as res
        out = Outcome(res.ledgers, guarantee=star_guarantee(contract, "T answers"))
        out.add("models/final", res.final)
        out.add("models/final_iterate", res.final_iterate)
        add_reference_outputs(out, ref)
        out.add("privacy/lap_scale", np.array([_scale(contract, i, s.xi, n[i])
                                               for i in range(len(n))]),
                formula=lap_scale_formula(contract, "T"))
        return out


def _scale(contract: Contract, i: int, xi: float, n_i: int) -> float:
    """b_i: owner i's Laplace scale of a mean of n_i gradients clipped to xi (0: no noise)."""
    noise = contract.noise(i)
    return 0.0 if noise is None else noise.scale(Sensitivity.mean(xi, n_i))

METHOD = SyncStar()
