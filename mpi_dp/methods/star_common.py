"""Set-up shared by the star methods (sync_star, async_star): public constants from public records.

xi = 'auto' and step.L = 'public' read only the shard file's public records (/public), which every
party may see, so they cost no privacy.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np
import scipy.sparse as sp

from ..algorithms.common import LocalShard, Reference, cached_reference
from ..data import ShardFile
from ..errors import JobError
from ..jobspec import Job
from ..models import linear, reference
from .base import Context, Method

#: Hinge records whose public-optimum margin y x.theta is within this of 1 count as on the kink.
HINGE_KINK_TOL = 1e-8

#: shared keys both star methods read
STAR_READS = ("loss", "lam", "theta_max", "theta0", "xi", "xi_quantile", "clip", "step.*",
              "reference.solver")


@dataclasses.dataclass(frozen=True)
class PublicConstants:
    """xi (L1 clipping bound), L (smoothness) and the share of public records clipped at xi."""

    xi: float
    L: float
    public_clip_fraction: float


def public_grad_norms(loss: str, Xp, yp: np.ndarray, theta: np.ndarray) -> np.ndarray:
    """Per-record gradient L1 norms at the public optimum (the xi = 'auto' rule), X dense or CSR.

    For the hinge loss the free support vectors sit exactly on the kink y x.theta* = 1, where the
    subgradient is only defined up to rounding (0 or -y x): they get the largest subgradient norm
    ||x||_1, so xi does not depend on the last bit of X @ theta (dense and CSR agree).
    """
    norms = linear.grad_l1_norms(loss, Xp, yp, theta)[:, 0]
    if loss == "hinge":
        margin = yp * np.asarray(Xp @ theta, dtype=np.float64).ravel()
        kink = np.abs(margin - 1.0) <= HINGE_KINK_TOL
        norms[kink] = np.asarray(abs(Xp).sum(axis=1), dtype=np.float64).ravel()[kink]
    return norms


def public_constants(job: Job, shard: ShardFile) -> PublicConstants:
    """(xi, L, clip fraction at xi on public records) from the job or the public records."""
    xi, L = job["xi"], job["step.L"]
    need_public = xi == "auto" or (L == "public" and job["step.rho"] == "auto")
    if not need_public:
        return PublicConstants(float(xi), float(L) if not isinstance(L, str) else math.nan,
                               math.nan)
    if not shard.has_public:
        raise JobError(f"job file {job.path}: xi = 'auto' and step.L = 'public' need public records "
                       f"(/public/X, /public/y) in the shard file {shard.path}, which has none; "
                       "set xi and step.L (or step.rho) to numbers")
    Xp, yp = shard.read_public()
    loss, lam, tmax = job["loss"], job["lam"], job["theta_max"]
    if L == "public":
        L = linear.curvature_constant(loss, Xp, lam)
    frac = math.nan
    if xi == "auto":
        theta_pub = reference.theta_star_local(loss, Xp, yp, lam, tmax)
        norms = public_grad_norms(loss, Xp, yp, theta_pub)
        xi = float(np.quantile(norms, job["xi_quantile"]))
        if not xi > 0:
            raise JobError(f"job file {job.path}: xi = 'auto' gave {xi}: the public gradients are "
                           "all zero; set xi to a number")
        frac = float(np.mean(norms > xi))
    return PublicConstants(float(xi), float(L), frac)


def agreed_public_constants(ctx: Context) -> PublicConstants:
    """public_constants computed on the learner and broadcast (collective)."""
    consts = ctx.agree(lambda: public_constants(ctx.job, ctx.shard)
                       if ctx.star.is_learner else None)
    return ctx.comm.bcast(consts, root=0)


@dataclasses.dataclass(frozen=True)
class StarPrepared:
    """What a star job sets up once: public constants, the paper's rho, and the reference optima
    per n vector, shared by the configurations."""

    public: PublicConstants
    rho: float
    refs: dict = dataclasses.field(default_factory=dict)


class StarMethod(Method):
    """What the star methods share: the progress line and each configuration's local shards with
    their reference optima."""

    def header(self, ctx: Context, prep: StarPrepared) -> str:
        pc = prep.public
        sparse = " (CSR)" if ctx.shard.is_sparse else ""
        return (f"p={ctx.shard.n_features}{sparse}; xi={pc.xi:.4g}, L={pc.L:.4g}, "
                f"rho={prep.rho:.4g}")

    def shards_and_reference(self, ctx: Context, prep: StarPrepared, s: Any,
                             n: list[int]) -> tuple[list[LocalShard], Reference | None]:
        """The first n[i] records of every hosted owner i that takes part (owners beyond len(n)
        hold none) and the reference optima on the participants (collective, cached per n)."""
        p, N = ctx.shard.n_features, len(n)
        empty = sp.csr_matrix((0, p)) if ctx.shard.is_sparse else np.zeros((0, p))
        shards = [LocalShard(i, *ctx.shard.read_agent(i, n[i])) if i < N
                  else LocalShard(i, empty, np.zeros(0)) for i in ctx.star.local_agents]
        ref = cached_reference(prep.refs, ctx.star, shards, s.loss, s.lam, n, p, s.theta_max,
                               ctx.job["reference.solver"])
        return shards, ref
