"""Set-up shared by the star methods (sync_star, async_star): public constants from public records,
the evaluation set of a classifier's test error, and the evaluation-only outputs they share.

xi = 'auto' and step.L = 'public' read only the shard file's public records (/public), which every
party may see, so they cost no privacy. The test error is measured on the shard file's global test
set (read by the learner), else on the owners' own test splits (each owner reads and evaluates
its own), else not at all (training error only).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Protocol, TypeVar

import numpy as np
import scipy.sparse as sp

from .. import progress
from ..algorithms.common import (
    NO_REFERENCE,
    NO_REFERENCE_NOTE,
    PREDICTION_RULE,
    EvalSet,
    LocalShard,
    Reference,
    cached_reference,
    is_classification,
)
from ..algorithms.reference_cache import DiskCache
from ..data import ShardFile
from ..data.bounds import row_norm_bound
from ..errors import JobError
from ..jobspec import Job, ReferenceKeys, Section, SharedKeys, StepKeys
from ..models import linear, reference
from ..privacy.contract import Contract
from .base import Context, Method, Outcome

#: Hinge records whose public-optimum margin y x.theta is within this of 1 count as on the kink.
HINGE_KINK_TOL = 1e-8

#: shared keys both star methods read
STAR_READS = ("loss", "lam", "theta_max", "theta0", "xi", "xi_quantile", "clip", "step.*",
              "reference.solver", "reference.isolated", "backend")


@dataclasses.dataclass(frozen=True)
class PublicConstants:
    """xi (L1 clipping bound), L (smoothness) and the share of public records clipped at xi."""

    xi: float
    L: float
    public_clip_fraction: float
    source: str = "the job file"  # where xi and L came from (attribute constants_from)


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


def bound_constants(job: Job, shard: ShardFile, xi: Any, L: Any) -> PublicConstants:
    """xi and L from the shard's public row-norm bound B (no public records): a logistic or hinge
    gradient is y s x with |s| <= 1, so its L1 norm is at most ||x||_1 <= sqrt(p) B (nothing is
    clipped); L = c B^2 + lam bounds the Hessian (c = 1/4 logistic, 2 squared, 1 hinge as a
    curvature scale). The squared loss's gradient also scales with the target and theta: its xi
    has no such bound."""
    B = row_norm_bound(shard)
    sh = job.section(SharedKeys)
    loss = sh.loss
    if B is None or (xi == "auto" and loss == "squared"):
        why = ("the squared loss's gradient has no bound from the features alone (set xi)"
               if B is not None else "nor a public bound on the records' norms (/public/"
               "row_norm_max, written by `data prepare --row-norm l2`)")
        raise JobError(f"job file {job.path}: xi = 'auto' and step.L = 'public' need public "
                       f"records (/public/X, /public/y) in the shard file {shard.path}, which has "
                       f"none, {why}; prepare it with --public M, or set xi and step.L (or "
                       "step.rho) to numbers")
    if xi == "auto":
        xi = math.sqrt(shard.n_features) * B
    if L == "public":
        L = {"logistic": 0.25, "squared": 2.0, "hinge": 1.0}[loss] * B * B + float(sh.lam)
    return PublicConstants(float(xi), float(L) if not isinstance(L, str) else math.nan, 0.0,
                           f"the shard's public row-norm bound B = {B:g} (xi = sqrt(p) B, L = "
                           "c B^2 + lam)")


def public_constants(job: Job, shard: ShardFile) -> PublicConstants:
    """(xi, L, clip fraction at xi on public records) from the job or the public records."""
    sh, step = job.section(SharedKeys), job.section(StepKeys)
    xi, L = sh.xi, step.L
    need_public = xi == "auto" or (L == "public" and step.rho == "auto")
    if not need_public:
        return PublicConstants(float(xi), float(L) if not isinstance(L, str) else math.nan,
                               math.nan)
    if not shard.has_public:
        return bound_constants(job, shard, xi, L)
    Xp, yp = shard.read_public()
    loss, lam, tmax = sh.loss, sh.lam, sh.theta_max
    if L == "public":
        L = linear.curvature_constant(loss, Xp, lam)
    frac = math.nan
    if xi == "auto":
        theta_pub = reference.theta_star_local(loss, Xp, yp, lam, tmax)
        norms = public_grad_norms(loss, Xp, yp, theta_pub)
        xi = float(np.quantile(norms, sh.xi_quantile))
        if not xi > 0:
            raise JobError(f"job file {job.path}: xi = 'auto' gave {xi}: the public gradients are "
                           "all zero; set xi to a number")
        frac = float(np.mean(norms > xi))
    return PublicConstants(float(xi), float(L), frac, "the shard's public records")


def check_loss_and_labels(ctx: Context) -> None:
    """A classification loss needs the +-1 labels of a binary shard (checked before any output:
    logistic loss on 0/1 or real-valued targets would run and report a meaningless psi)."""
    loss, task = ctx.job.section(SharedKeys).loss, ctx.shard.task
    if loss in ("logistic", "hinge") and task != "binary":
        raise JobError(f"job file {ctx.job.path}: key 'loss': {loss} loss needs a binary shard "
                       f"(labels -1/+1); {ctx.shard.path} holds a {task} task (use loss = "
                       "'squared', or prepare the data with --task binary / --positive VALUE)")


def agreed_public_constants(ctx: Context) -> PublicConstants:
    """public_constants computed on the learner and broadcast (collective); the loss is checked
    against the shard's labels first."""
    ctx.agree(lambda: check_loss_and_labels(ctx))
    consts = ctx.agree(lambda: public_constants(ctx.job, ctx.shard)
                       if ctx.star.is_learner else None)
    return ctx.comm.bcast(consts, root=0)


def evaluation_set(ctx: Context) -> EvalSet:
    """Where a classifier's test error is measured (collective; see common.EvalSet).

    Only classification losses get one: the global test set on the learner, else each hosted
    owner's own test split on its rank (all owners of the file, participating or not), else none.
    """
    shard, star = ctx.shard, ctx.star
    if not is_classification(ctx.job.section(SharedKeys).loss):
        return EvalSet()
    if shard.has_global_test:
        data = ctx.agree(lambda: shard.read_test() if star.is_learner else None)
        n = int(ctx.comm.bcast(None if data is None else len(data[1]), root=0))
        return EvalSet("test", n, data=data) if n else EvalSet()
    if not shard.has_tests().any():
        return EvalSet()
    def read_tests() -> dict:
        ids = list(star.local_agents)
        return {i: t for i, t in zip(ids, shard.read_agents_test(ids), strict=True)
                if t is not None}

    local = ctx.agree(read_tests)
    sizes = star.gather_agents(np.array([[len(local[i][1]) if i in local else 0]
                                         for i in star.local_agents], dtype=np.float64
                                        ).reshape(-1, 1), (1,))
    n = int(ctx.comm.bcast(None if sizes is None else int(sizes.sum()), root=0))
    return EvalSet("owner_test", n, local=local) if n else EvalSet()


def utility_attrs(loss: str, evalset: EvalSet) -> dict[str, Any]:
    """Group attributes naming the evaluation set and the prediction rule of the utility."""
    if not is_classification(loss):
        return {"eval_set": "training records (squared loss: train_mse only)"}
    return {"eval_set": evalset.describe(), "prediction": PREDICTION_RULE}


#: what each reference utility dataset holds, by the last part of its name
_WHAT = {
    "label": "the most frequent label of the participants' training records (+1 on a tie)",
    "majority": "error of always predicting the majority training label (majority_label)",
    "zero": "error / MSE of theta = 0 (a classifier then predicts +1 for every record)",
    "mean": "MSE of always predicting the mean of the training targets",
    "star": "the same utility of the non-private optimum reference/theta_star",
}
_WHERE = {"train": " on the participants' training records", "test": " on the evaluation set "
          "(attribute eval_set)"}


def utility_what(name: str) -> str:
    """Description of reference/<name> written beside it."""
    return _WHAT.get(name.rsplit("_", 1)[-1], "") + _WHERE.get(name.split("_", 1)[0], "")


def add_utility_reference(out: Outcome, ref: Reference) -> None:
    """reference/<name> of the trivial baselines and theta*'s utility (evaluation-only)."""
    for name, value in ref.utility.items():
        out.add(f"reference/{name}", value, evaluation_only=True, what=utility_what(name))


def _rule(contract: Contract) -> tuple[bool, str, str]:
    """(paper, name, text) of a contract's rule."""
    return contract.rule.paper, contract.rule.name, contract.rule.text


def star_guarantee(contract: Contract, answers: str) -> str:
    """The guarantee text of a star method's ledger: what each owner's answers compose to."""
    paper, name, text = _rule(contract)
    if paper:
        return (f"each owner's {answers} together are eps_i-DP (the paper's rule: basic "
                f"composition of the {answers} at eps_i / m_i each, Laplace, replace-one "
                "sensitivity 2 xi / n_i); the totals below compose them by each accountant")
    return (f"each owner's {answers} together are (eps_i, delta_i)-DP for its records "
            f"(replace-one): Laplace, sensitivity 2 xi / n_i, noise multiplier calibrated by "
            f"{name} ({text}); eps_pld is the tight total, eps_rdp a "
            "cross-check, eps_basic the plain sum of the per-release eps")


def lap_scale_formula(contract: Contract, m: str) -> str:
    """privacy/lap_scale's formula attribute."""
    if _rule(contract)[0]:
        return f"b_i = 2 xi {m} / (n_i eps_i) (the paper's basic split), i.i.d. per coordinate"
    return ("b_i = nm_i 2 xi / n_i, nm_i the calibrated noise multiplier of owner i "
            "(privacy/ledger noise_multiplier), i.i.d. per coordinate")


@dataclasses.dataclass(frozen=True)
class StarPrepared:
    """What a star job sets up once: public constants, the paper's rho, the reference optima per
    n vector, shared by the configurations, and the evaluation set of the test error."""

    public: PublicConstants
    rho: float
    refs: dict = dataclasses.field(default_factory=dict)
    evalset: EvalSet = dataclasses.field(default_factory=EvalSet)


#: a star method's prepared set-up (StarPrepared or a subclass) and its settings
StarPreparedT = TypeVar("StarPreparedT", bound=StarPrepared)


class StarSettings(Protocol):
    """What the star methods' settings (sync_star.Settings, async_star.Settings) share (read
    only: the settings are frozen dataclasses)."""

    @property
    def loss(self) -> str: ...
    @property
    def lam(self) -> float: ...
    @property
    def theta_max(self) -> float: ...


StarSettingsT = TypeVar("StarSettingsT", bound=StarSettings)

_SectionT = TypeVar("_SectionT", bound=Section)


def section_of_values(cls: type[_SectionT], values: dict[str, Any]) -> _SectionT:
    """A typed section of the values a method's `validate` gets (before the Job exists)."""
    return cls(**{name: values[cls.key_name(name)] for name in cls.keys()})


class StarMethod(Method[StarPreparedT, StarSettingsT]):
    """What the star methods share: the progress line and each configuration's local shards with
    their reference optima."""

    def header(self, ctx: Context, prep: StarPreparedT) -> str:
        pc = prep.public
        sparse = " (CSR)" if ctx.shard.is_sparse else ""
        return (f"p={ctx.shard.n_features}{sparse}; xi={pc.xi:.4g}, L={pc.L:.4g}, "
                f"rho={prep.rho:.4g}")

    def shards_and_reference(self, ctx: Context, prep: StarPreparedT, s: StarSettingsT,
                             n: list[int]) -> tuple[list[LocalShard], Reference | None]:
        """The first n[i] records of every hosted owner i that takes part (owners beyond len(n)
        hold none) and the reference optima on the participants (collective, cached per n)."""
        p, N = ctx.shard.n_features, len(n)
        empty = sp.csr_matrix((0, p)) if ctx.shard.is_sparse else np.zeros((0, p))
        ids = [i for i in ctx.star.local_agents if i < N]
        read = dict(zip(ids, ctx.shard.read_agents(ids, [n[i] for i in ids]), strict=True))
        shards = [LocalShard(i, *read[i]) if i < N else LocalShard(i, empty, np.zeros(0))
                  for i in ctx.star.local_agents]
        rk = ctx.job.section(ReferenceKeys)
        if rk.solver == NO_REFERENCE and not prep.refs and ctx.star.is_learner:
            progress.info(NO_REFERENCE_NOTE)
        disk = prep.refs.get(_DISK)
        if disk is None and rk.solver != NO_REFERENCE:
            disk = prep.refs[_DISK] = ctx.agree(
                lambda: DiskCache.for_shard(ctx.shard, ctx.star.is_learner))
        ref = cached_reference(prep.refs, ctx.star, shards, s.loss, s.lam, n, p, s.theta_max,
                               rk.solver, prep.evalset, rk.isolated, disk)
        return shards, ref


#: StarPrepared.refs' entry of the on-disk reference cache (the others are keyed by n vectors)
_DISK = "disk cache"


def add_reference_outputs(out: Outcome, ref: Reference, N: int | None = None,
                          psi_isolated: np.ndarray | None = None) -> None:
    """reference/* of a star configuration: theta*, f*, the isolated optima (owners 0..N-1) and
    their psi (`psi_isolated` where the method recomputed it), the baselines and theta*'s
    utility; with reference.solver = 'none' only the baselines, and the configuration's
    attribute not_recorded says what was left out."""
    if ref.has_optimum:
        assert ref.theta_isolated is not None and ref.psi_isolated is not None  # with theta*
        out.add("reference/theta_star", ref.theta_star, evaluation_only=True, solver=ref.solver)
        out.add("reference/f_star", ref.f_star, evaluation_only=True)
        out.add("reference/theta_isolated", ref.theta_isolated[:N], evaluation_only=True)
        out.add("reference/psi_isolated",
                ref.psi_isolated[:N] if psi_isolated is None else psi_isolated,
                evaluation_only=True)
    else:
        out.attrs["not_recorded"] = NO_REFERENCE_NOTE
    add_utility_reference(out, ref)
