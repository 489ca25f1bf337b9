"""The toy method's entry (tests/test_toy_method.py): its keys, its configuration (settings and
each owner's release plan) and its run. The owner's (eps, delta) is the job's; the noise is the
contract's."""

from __future__ import annotations

import numpy as np
import toy_algorithm

from mpi_dp.jobspec import Key
from mpi_dp.methods import Method, Outcome
from mpi_dp.methods.base import Configured, default_records, footprint_of, owner_plans


class ToyMean(Method):
    name = "toy_mean"
    summary = "toy: the DP mean of the owners' clipped labels"
    variants = ("plain",)
    variant_help = "plain (the only one)"
    sections = {"toy": {"bound": Key((int, float), 1.0, "clip labels to [-bound, bound]"),
                        "extra": Key((int,), 0, "releases beyond the plan (a test of refusal)")}}
    default_metric = "error"

    def configure(self, ctx, prepared, rc):
        T = int(ctx.job["T"])
        s = {"T": T, "bound": float(ctx.job["toy.bound"]), "extra": int(ctx.job["toy.extra"])}
        records = default_records(ctx)
        return Configured(rc, s, tuple(owner_plans(ctx, rc, rc.n, "laplace", T)),
                          footprint_of(ctx, records, 1), records, {"T": T, "bound": s["bound"]})

    def run(self, ctx, prepared, c, contract, hooks):
        s, rc, star = c.settings, c.resolved, ctx.star
        B = s["bound"]
        means = {i: float(np.clip(ctx.shard.read_agent(i, rc.n[i])[1], -B, B).mean())
                 for i in star.local_agents}
        w = np.array(rc.n, dtype=float) / sum(rc.n)
        got = star.gather_agents(np.array([[means[i]] for i in sorted(means)]).reshape(-1, 1),
                                 (1,))
        clean = None if got is None else float(w @ got[:, 0])  # evaluation-only
        ledgers = toy_algorithm.run(star, contract, means, rc.n, B, s["T"] + s["extra"],
                                    ctx.runs, hooks, clean, int(ctx.job["record_every"]))
        if ledgers is None:
            return None
        return Outcome(ledgers, guarantee="each owner's T releases are (eps_i, delta_i)-DP "
                       "together")
