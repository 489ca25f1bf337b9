"""Method entry of personalised private peer-to-peer coordinate descent (seed 004).

Every owner of the shard file is a peer with its own model; peers sit on a public similarity
graph: the one stored in the shard file (/public/graph_edges, graph_weights; `p2p.graph =
"shard"`, the default) or one built from the job's seed (`p2p.graph`: knn:K on the shard's public
agent descriptors, complete, erdos_renyi:p, random_geometric[:r], an edge list; comm.topology),
on rank 0 and broadcast, so every rank count gets the same graph. Each rank hosts a block of
peers; a peer broadcasts its model into its neighbours' mailboxes (comm.rma: one MPI window per
rank, passive-target Lock/Put/Unlock) and reads its own mailbox when it wakes. `clock = replay`
(default) runs the seeded schedule in conflict-free rounds (bitwise equal to the serial
simulator) and checkpoints inside a configuration (resume continues it bit for bit, on any rank
count); `clock = live` runs Poisson clocks in wall time and logs what every update read (no
checkpoints: a resumed live configuration restarts from its start).

Variants: cd (Algorithm 1 at eps = inf, Algorithm 2 otherwise), admm (the gossip-ADMM baseline,
non-private, simulated on rank 0), local_dp (every peer perturbs its own records once, then trains
its local model). Every configuration also records the purely local models and a trivial
predictor as baselines, and (evaluation-only) the optimum Q* of objective (2); where the shard file
holds a global test set, every peer's final model is also scored on it (test_global_error, beside
the set's own majority class / mean), on rank 0.
"""

from __future__ import annotations

import dataclasses
import math
import time
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import scipy.sparse as sp

from ..comm import topology
from ..comm.graph_exchange import block_starts
from ..comm.rma import bcast_csr, on_root
from ..data import ShardFile
from ..errors import DataError, JobError
from ..jobspec import (
    COUNT,
    NONNEG,
    POSITIVE,
    POSITIVE_OR_INF,
    PrivacyKeys,
    Section,
    between,
    err,
    key,
)
from ..methods.base import (
    Configured,
    Context,
    Method,
    Outcome,
    Resolved,
    RunHooks,
    Signal,
    available_backend,
    footprint_of,
    owner_plans,
    settings_attrs,
    shard_sizes,
)
from ..privacy import contract, kairouz, rules
from ..privacy.contract import Contract
from . import coordinate_descent, driver, evaluation, objective, peer_data, reference_cache
from .peer_data import Data

_NUM = (int, float)
EVALUATION_ONLY = (
    "evaluation-only: Q, gap (Q - Q*), losses and the test metrics read every peer's model and "
    "data on the host ranks; Q* and theta_star are solved on rank 0 from every peer's records; "
    "the local models and the trivial baseline are never released; test_global_error scores "
    "every peer's final model on the shard file's global test set on rank 0")
#: p2p.graph spellings (comm.topology.parse_graph_spec; dola's own kinds are not p2p's)
GRAPH_HELP = (
    "the peers' public similarity graph: " + topology.SPELLINGS + ". A built graph comes from the "
    "job's seed on rank 0 (the same on any rank count), must be connected, and weighs 1 per edge "
    "unless its edge list gives weights; the output records it (attrs graph, graph_kind, "
    "graph_edges, graph_mean_degree)")

@dataclasses.dataclass(frozen=True)
class P2PKeys(Section):
    """The [p2p] section, typed: `job.section(P2PKeys).graph`."""

    NAME: ClassVar[str] = "p2p"
    loss: str = key((str,), "auto",
        "per-example loss: auto (logistic for a binary shard, quadratic for regression), "
        "logistic, quadratic",
        ("auto",) + objective.LOSSES)
    mu: float = key(_NUM, 1.0,
        "trade-off mu of objective (2): large -> the purely local models, small -> one consensus "
        "model", within=POSITIVE)
    lam: float | str = key(_NUM + (str,), "1/m",
        "L2 weight lam_i of L_i: '1/m' (1/m_i, the paper's) or a number", within=NONNEG)
    conf_floor: float = key(_NUM, 1e-3,
        "confidence c_i of a peer without records", within=between(0, 1, lo_open=True))
    smoothness: str = key((str,), "bound",
        "L_loc of alpha_i: bound (from the public row-norm bound row_norm: alpha_i does not read "
        "private data) or data (the paper: lmax(X_i^T X_i), data-dependent step)",
        ("bound", "data"))
    row_norm: float | str = key(_NUM + (str,), "auto",
        "public bound on every record's L2 norm: 'auto' = the shard's public item_norm_max if "
        "present, else its row_norm_max (`data prepare --row-norm`), else 1 (rows normalised to "
        "norm <= 1); checked against the data before the run", within=POSITIVE)
    T_agent: int | str = key((int, str), "auto",
        "T_i, wake-ups of each peer: 'auto' = ceil(T / n) when private (the paper's T/n) and no "
        "cap at eps = inf; a number caps every peer", within=COUNT)
    allocation: str = key((str,), "equal",
        "budget split over a peer's T_i wake-ups: equal (every release alike; the paper rule: "
        "Theorem-1 composition, bisection); with privacy.calibration = 'paper' also simple "
        "(eps/T_i), prop2_paper, prop2_corrected (Proposition 2, replay only)",
        kairouz.ALLOCATIONS)
    delta_bar: float = key(_NUM, math.exp(-5),
        "privacy.calibration = 'paper' only: delta_bar of Theorem 1 (the paper: e^-5; refused at "
        "or above 1/m_i)", within=between(0, 1, hi_open=True))
    mode: str = key((str,), "sound",
        "sound: clip per-example gradients to L1 norm <= clip (L0 = clip); faithful: L0 = 1 and "
        "no clipping (the paper: not DP unless ||x||_1 <= 1, recorded uncertified)",
        coordinate_descent.MODES)
    clip: float = key(_NUM, 1.0,
        "C_clip = L0: L1 bound on every per-example gradient (sound mode)", within=POSITIVE)
    init: str = key((str,), "zero",
        "Theta(0): zero, local (the non-private local models: only at eps = inf), private_ws "
        "(Algorithm 4: local models + L2-Laplace output perturbation at eps_ws, then model "
        "propagation)",
        coordinate_descent.INITS)
    eps_ws: float = key(_NUM, 0.05,
        "eps of the private warm start (charged to every peer)", within=POSITIVE_OR_INF)
    lam_ws: float | str = key(_NUM + (str,), "lam",
        "L2 weight of the warm start's local models: 'lam' (lam_i) or a multiple of lam_i, e.g. "
        "10", within=POSITIVE)
    mu_ws: float | str = key(_NUM + (str,), "mu",
        "mu of the warm start's model propagation ('mu': mu)", within=POSITIVE)
    clock: str = key((str,), "replay",
        "replay: the seeded schedule in conflict-free rounds (bitwise equal to the serial "
        "simulator on any layout); live: Poisson clocks in wall time, no barriers, the realised "
        "schedule logged",
        ("replay", "live"))
    tau: float = key(_NUM, 0.0,
        "live: mean seconds between a peer's ticks (0: as fast as possible)", within=NONNEG)
    wall_budget: float = key(_NUM, 3600.0,
        "live: seconds before the peers stop (inf: no limit)", within=POSITIVE_OR_INF)
    reference: str = key((str,), "auto",
        "Q* solver: auto (PETSc KSP if petsc4py, else SciPy CG; L-BFGS for logistic), scipy, "
        "petsc, none",
        ("auto", "scipy", "petsc",
                                                                  "none"))
    reference_cache: str = key((str,), "auto",
        "folder caching the evaluation-only reference (local models, Q*, theta_star) per shard "
        "content and parameters (mpi_dp.p2p.reference_cache): auto ($MPI_DP_CACHE/p2p_reference, "
        "else ~/.cache/mpi_dp/p2p_reference), off, or a folder")
    admm_rho: float | str = key(_NUM + (str,), "auto",
        "gossip ADMM penalty ('auto': mean positive W_ij)", within=POSITIVE)
    admm_inner: int = key((int,), 10,
        "K, gradient steps per ADMM activation", within=COUNT)
    local_dp_bound: float = key(_NUM, 1.0,
        "local_dp: features clipped to [-B, B]", within=POSITIVE)
    validation: float = key(_NUM, 0.0,
        "share of every peer's training records held out (seeded) for tuning (p2p.select)",
        within=between(0, 1, hi_open=True))
    select: str = key((str,), "",
        "a private selection: the configurations that differ only in this swept key (T_agent) are"
        " candidates; each peer releases its noised validation score (attribute val_metric) at "
        "the end of every candidate, and every candidate's releases are calibrated together to "
        "the peer's (eps, delta) (one per-release noise for all); analyze picks the best score",
        ("", "T_agent"))
    val_clip: float | str = key(_NUM + (str,), "auto",
        "the validation score's public bound: a regression score is the mean squared error with "
        "every error clipped to +-val_clip (its sensitivity val_clip^2 / m_val); 'auto': 1 for a "
        "binary shard (the error rate, sensitivity 1 / m_val), required for regression",
        within=POSITIVE)
    graph: str = key((str,), "shard",
        GRAPH_HELP)
    shard: str = key((str,), "",
        "shard file of this configuration (default: the job's shard); sweep it ([sweep] shard = "
        "[...]) to average over random splits (Table 1's five) or to compare dimensions (Fig. 2c)")


#: the [p2p] keys (the registry and --help read the table)
SECTION = P2PKeys.keys()


@dataclasses.dataclass
class Prepared:
    data: dict = dataclasses.field(default_factory=dict)  # path -> Data (hosted peers)
    full: dict = dataclasses.field(default_factory=dict)  # path -> Data (all peers, rank 0)
    refs: dict = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class P2PSettings:
    algo: coordinate_descent.Settings
    path: str
    loss: str
    mu: float
    lam: tuple[float, ...]
    smooth: str
    clock: str
    variant: str

    @property
    def objective(self) -> driver.Objective:
        return driver.Objective(self.loss, self.mu, self.lam, self.smooth)


def _lam(spec: Any, m: np.ndarray) -> np.ndarray:
    return 1.0 / np.maximum(m, 1) if spec == "1/m" else np.full(len(m), float(spec))


class P2P(Method):
    name = "p2p"
    reads = ("backend",)
    summary = ("personalised private peer-to-peer coordinate descent (seed 004): every peer "
               "learns its own model, mixing its graph neighbours' broadcast models into a "
               "(noisy) coordinate step on its local loss")
    variants = ("cd", "admm", "local_dp")
    variant_help = ("cd (asynchronous block coordinate descent; private at eps < inf: Laplace "
                    "noise on the clipped local gradient, Theorem-1 budgets), admm (gossip ADMM "
                    "baseline, non-private), local_dp (records perturbed once by their owner, "
                    "then purely local models)")
    sections = {"p2p": SECTION}
    label_variant = True
    key_help = {"T": "global ticks of the merged Poisson clock (one peer wakes per tick); admm: "
                "edge activations", "eps": "every peer's total over all its releases (its T_i "
                "wake-ups, a private warm start, the candidates of a private selection); inf = "
                "non-private",
                "n": "'all' (every peer uses all its records)",
                "record_every": "ticks between records of Q and the test metric"}
    default_metric = "test_metric"
    sweeps = ("p2p.shard", "p2p.T_agent", "p2p.init", "p2p.mu")
    paper_rule = ("eps is eps_bar of Theorem 1 (Kairouz et al.) at p2p.delta_bar over a peer's "
                  "T_i wake-ups, split by p2p.allocation (Algorithm 3); a private warm start "
                  "adds eps_ws")

    def validate(self, values: dict[str, Any], path: str) -> None:
        if not values["p2p.mu"] > 0:
            raise err(path, "p2p.mu", "must be > 0")
        lam = values["p2p.lam"]
        if (isinstance(lam, str) and lam != "1/m") or (not isinstance(lam, str) and lam < 0):
            raise err(path, "p2p.lam", "must be '1/m' or a number >= 0")
        t = values["p2p.T_agent"]
        if (isinstance(t, str) and t != "auto") or (isinstance(t, int) and t < 1):
            raise err(path, "p2p.T_agent", "must be 'auto' or a positive integer")
        rn = values["p2p.row_norm"]
        if (isinstance(rn, str) and rn != "auto") or (not isinstance(rn, str) and not rn > 0):
            raise err(path, "p2p.row_norm", "must be 'auto' or a positive number")
        if not 0 <= values["p2p.delta_bar"] < 1:
            raise err(path, "p2p.delta_bar", "must be in [0, 1)")
        if not 0 <= values["p2p.validation"] < 1:
            raise err(path, "p2p.validation", "must be in [0, 1)")
        for v in values.get("sweep.mu") or []:
            if not v > 0:
                raise err(path, "sweep.mu", f"every mu must be > 0, got {v}")
        for v in values.get("sweep.T_agent") or []:
            if (isinstance(v, str) and v != "auto") or (isinstance(v, int) and v < 1):
                raise err(path, "sweep.T_agent", "every T_agent must be 'auto' or >= 1")
        if not values["p2p.clip"] > 0:
            raise err(path, "p2p.clip", "must be > 0")
        if not values["p2p.eps_ws"] > 0:
            raise err(path, "p2p.eps_ws", "must be > 0")
        if values["p2p.tau"] < 0 or not values["p2p.wall_budget"] > 0:
            raise err(path, "p2p.tau", "tau must be >= 0 and wall_budget > 0")
        try:
            topology.parse_graph_spec(values["p2p.graph"])
        except ValueError as e:
            raise err(path, "p2p.graph", str(e)) from None
        if values["n"] != "all" or values["sweep.n"]:
            raise err(path, "n", "p2p peers use all their records; leave n = 'all'")
        if values.get("owners", "all") != "all" or values.get("sweep.owners"):
            raise err(path, "owners", "p2p runs every peer of the shard file's graph; leave "
                      "owners = 'all'")
        if values["p2p.clock"] == "live" and values["p2p.allocation"].startswith("prop2"):
            raise err(path, "p2p.allocation", "Proposition 2 needs the schedule in advance: "
                      "only with clock = 'replay'")
        if values["p2p.allocation"] != "equal" and values["privacy.calibration"] != "paper":
            raise err(path, "p2p.allocation", f"{values['p2p.allocation']!r} is a split of the "
                      "paper's rule: set privacy.calibration = 'paper' (a calibrated rule "
                      "releases every wake-up alike: 'equal')")
        if values["privacy.calibration"] != "paper" and values["p2p.delta_bar"] != math.exp(-5):
            raise err(path, "p2p.delta_bar", "is Theorem 1's delta of the paper's rule "
                      "(privacy.calibration = 'paper'); a calibrated rule uses privacy.delta: "
                      "remove it")
        vc = values["p2p.val_clip"]
        if (isinstance(vc, str) and vc != "auto") or (not isinstance(vc, str) and not vc > 0):
            raise err(path, "p2p.val_clip", "must be 'auto' or a positive number")
        if values["p2p.select"]:
            key = values["p2p.select"]
            if not values.get(f"sweep.{key}") or len(values[f"sweep.{key}"]) < 2:
                raise err(path, "p2p.select", f"selects among the values of sweep.{key}: give "
                          "at least two")
            if not values["p2p.validation"] > 0:
                raise err(path, "p2p.select", "a selection scores the candidates on held-out "
                          "records: set p2p.validation > 0 (e.g. 0.2)")
            if values["p2p.clock"] != "replay":
                raise err(path, "p2p.select", "a private selection runs its candidates in "
                          "replay (the plan needs every candidate's T_i)")

    # -- preparation ---------------------------------------------------------------------
    def prepare(self, ctx: Context) -> Prepared:
        prep = Prepared()
        j = ctx.job
        paths = j.swept("p2p.shard", j.section(P2PKeys).shard or str(ctx.shard.path))
        for path in paths:
            prep.data[path] = self._load_hosted(ctx, path)
        return prep

    def _open(self, ctx: Context, path: str) -> ShardFile:
        j = ctx.job
        try:
            shard = ctx.shard if Path(path) == Path(ctx.shard.path) else ShardFile(path)
        except (OSError, DataError) as e:
            raise JobError(f"job file {j.path}: key 'p2p.shard': {e}") from None
        if shard.task not in ("binary", "regression"):
            raise JobError(f"job file {j.path}: p2p needs a binary or regression shard; "
                           f"{shard.path} holds a {shard.task} task")
        if shard.is_sparse:
            raise JobError(f"job file {j.path}: p2p needs dense features ({shard.path} is CSR)")
        return shard

    def _load_hosted(self, ctx: Context, path: str) -> Data:
        """Collective: the graph read or built and checked on rank 0 and broadcast (with the
        global test set, kept there), every peer's m_i gathered from the ranks hosting it, then
        each rank's own peers' records."""
        comm = ctx.comm

        def public() -> tuple[sp.csr_matrix, dict[str, Any], tuple | None]:
            shard, j = self._open(ctx, path), ctx.job
            return (*peer_data.peer_graph(shard, j.section(P2PKeys).graph, int(j.generic.seed), j.path),
                    peer_data.global_test(shard, j.path))

        got = on_root(comm, public)
        W = bcast_csr(comm, None if got is None else got[0])
        info = comm.bcast(None if got is None else got[1], root=0)
        test = None if got is None else got[2]
        shard = ctx.agree(lambda: self._open(ctx, path))
        m_all = (ctx.sizes if shard is ctx.shard and ctx.sizes is not None
                 else shard_sizes(comm, shard))
        d = ctx.agree(lambda: self._load(ctx, path, hosted=True, W=W, m_all=m_all,
                                         shard=shard))
        d.graph_info, d.test_global = info, test
        return d

    def _load(self, ctx: Context, path: str, hosted: bool, W: sp.csr_matrix, m_all: np.ndarray,
              shard: ShardFile | None = None) -> Data:
        """With the public graph W and sizes m_all, the records of this rank's peers (`hosted`)
        or of all of them (peer_data.read_peers)."""
        j = ctx.job
        shard = self._open(ctx, path) if shard is None else shard
        n = shard.n_agents
        rank, size = ctx.comm.Get_rank(), ctx.comm.Get_size()
        st = block_starts(n, size)
        mine = range(n) if not hosted else range(int(st[rank]), int(st[rank + 1]))
        if hosted and shard is not ctx.shard:  # a swept p2p.shard: checked as the job's data is
            shard.check_finite(mine)
        d = peer_data.read_peers(shard, path, W, m_all, mine, j.section(P2PKeys).validation,
                                 int(j.generic.seed), j.section(P2PKeys).row_norm, j.path,
                                 full=not hosted)
        if self._loss(j, shard.task) == "logistic" and shard.task != "binary":
            raise JobError(f"job file {j.path}: key 'p2p.loss': logistic needs a binary shard, "
                           f"{shard.path} is {shard.task}")
        return d

    @staticmethod
    def _loss(j: Any, task: str) -> str:
        loss = j.section(P2PKeys).loss
        return ("logistic" if task == "binary" else "quadratic") if loss == "auto" else loss

    def header(self, ctx: Context, prep: Prepared) -> str:
        d = next(iter(prep.data.values()))
        deg = np.diff(d.W.indptr)
        kind = (d.graph_info or {}).get("kind", "?")
        return (f"p={ctx.shard.n_features}; {kind} graph of {d.W.shape[0]} peers, mean degree "
                f"{deg.mean():.1f}; clock {ctx.job['p2p.clock']}")

    # -- configuration -------------------------------------------------------------------
    def _settings(self, ctx: Context, prep: Prepared, rc: Resolved) -> P2PSettings:
        j = ctx.job
        path = rc.config.param("p2p.shard", j.section(P2PKeys).shard) or next(iter(prep.data))
        d = prep.data[path]
        n = d.W.shape[0]
        if len(set(rc.eps)) != 1:
            raise JobError(f"job file {j.path}: key 'eps': p2p gives every peer the same "
                           "eps_bar (one number)")
        eps = float(rc.eps[0])
        private = math.isfinite(eps) and rc.variant == "cd"
        ta = rc.config.param("p2p.T_agent", j.section(P2PKeys).T_agent)
        if ta == "auto":
            cap = (math.ceil(j.generic.T / n),) * n if private or j.section(P2PKeys).clock == "live" else None
        else:
            cap = (int(ta),) * n
        init = rc.config.param("p2p.init", j.section(P2PKeys).init)
        mu = float(rc.config.param("p2p.mu", j.section(P2PKeys).mu))
        if init == "local" and private:
            raise JobError(f"job file {j.path}: key 'p2p.init': the non-private local models "
                           "cannot start a private run (use private_ws or zero)")
        loss = self._loss(j, d.task)
        if init == "private_ws" and loss != "logistic":
            raise JobError(f"job file {j.path}: key 'p2p.init': the private warm start's "
                           "output perturbation needs per-example gradients bounded by the row "
                           "norm (logistic loss); not available for the quadratic loss")
        lam = _lam(j.section(P2PKeys).lam, d.m)
        lw = j.section(P2PKeys).lam_ws
        lam_ws = lam if lw == "lam" else lam * float(lw)
        mw = j.section(P2PKeys).mu_ws
        k = j.section(P2PKeys)
        algo = coordinate_descent.Settings(
            T=int(j.generic.T), T_agent=cap, eps=eps if rc.variant == "cd" else math.inf,
            delta=float(k.delta_bar), allocation=k.allocation, mode=k.mode,
            clip=float(k.clip), init=init, eps_ws=float(k.eps_ws),
            lam_ws=tuple(float(v) for v in lam_ws),
            mu_ws=mu if mw == "mu" else float(mw), row_norm=d.row_norm,
            runs=ctx.run_ids, seed=int(j.generic.seed), record_every=int(j.generic.record_every),
            backend=available_backend(j.path, j.values["backend"]))
        if rc.variant == "local_dp" and d.task != "binary":
            raise JobError(f"job file {j.path}: variant 'local_dp' perturbs -1/+1 labels by "
                           f"randomised response; {path} is a {d.task} task")
        if rc.variant == "admm" and math.isfinite(eps):
            raise JobError(f"job file {j.path}: variant 'admm' is the non-private baseline: "
                           "run it at eps = inf (a separate job, or cd alone in the eps sweep)")
        if rc.variant == "admm" and j.section(P2PKeys).clock == "live":
            raise JobError(f"job file {j.path}: the admm baseline runs serially (clock replay)")
        if rc.variant == "cd" and j.section(P2PKeys).clock == "live" and ctx.comm.Get_size() < 2:
            raise JobError(f"job file {j.path}: key 'p2p.clock': live runs need at least 2 "
                           "ranks (run with mpiexec -n 2 or more)")
        return P2PSettings(algo, path, loss, mu, tuple(float(v) for v in lam),
                           j.section(P2PKeys).smoothness, j.section(P2PKeys).clock, rc.variant)

    def _cap(self, ctx: Context, value: Any, n: int) -> int:
        """T_i of a T_agent value ('auto': ceil(T / n))."""
        return math.ceil(ctx.job.generic.T / n) if value == "auto" else int(value)

    def plans(self, ctx: Context, prep: Prepared, rc: Resolved, s: P2PSettings
              ) -> list[contract.Plan] | None:
        """cd: each peer's T_i wake-ups (Laplace) and its private warm start (fixed), over its
        records (training and validation); with a private selection, every candidate's
        wake-ups, warm start and validation score. local_dp: each record perturbed once (its
        split is fixed: see `calibrated`). admm: non-private."""
        if s.variant == "admm":
            return None
        j, a = ctx.job, s.algo
        d = prep.data[s.path]
        m_all = d.m_all
        if s.variant == "local_dp" or not a.private:
            return owner_plans(ctx, rc, m_all, "laplace", 0)
        ws = (coordinate_descent.warm_start_event(a.eps_ws),) if a.init == "private_ws" else ()
        assert a.T_agent is not None  # capped in a private run
        cap = int(a.T_agent[0])
        if j.section(PrivacyKeys).calibration == "paper":
            if a.delta > 0 and a.delta * int(m_all.min()) >= 1:
                i = int(np.argmin(m_all))
                raise JobError(f"job file {j.path}: key 'p2p.delta_bar': {a.delta:g} is at or "
                               f"above 1/m_i for peer {i} (m_i = {int(m_all[i])} records); use "
                               f"a delta_bar < 1/{int(m_all.max())}")
            if j.section(P2PKeys).select:
                raise JobError(f"job file {j.path}: key 'p2p.select': a private selection "
                               "composes its candidates under the contract: set "
                               "privacy.calibration = 'pld' or 'basic'")
            return owner_plans(ctx, rc, m_all, "laplace", cap, fixed=ws)
        if not j.section(P2PKeys).select:
            return owner_plans(ctx, rc, m_all, "laplace", cap, fixed=ws)
        self._val_clip(ctx, d)  # a regression score needs its bound: refused before running
        caps = self._candidates(ctx, d)  # all candidates' releases, calibrated together
        return owner_plans(ctx, rc, m_all, "laplace", sum(caps) + len(caps),
                           fixed=ws * len(caps), scope="selection")

    def _candidates(self, ctx: Context, d: Data) -> list[int]:
        """T_i of every candidate of the selection (p2p.select = 'T_agent')."""
        n = d.W.shape[0]
        return [self._cap(ctx, v, n) for v in ctx.job.axis("p2p.T_agent") or []]

    def configure(self, ctx: Context, prep: Prepared, rc: Resolved) -> Configured[P2PSettings]:
        s = self._settings(ctx, prep, rc)
        plans = self.plans(ctx, prep, rc, s)
        a = s.algo
        other = 0
        if ctx.job.section(P2PKeys).select and a.private:  # the plan spans every candidate
            caps = self._candidates(ctx, prep.data[s.path])
            assert a.T_agent is not None  # capped in a private run
            other = sum(caps) + len(caps) - int(a.T_agent[0]) - 1
            s = dataclasses.replace(s, algo=dataclasses.replace(a, score_releases=1))
        records = s.algo.T // max(1, s.algo.record_every or s.algo.T) + 2
        fp = footprint_of(ctx, records, ctx.shard.n_features)
        # the wake-up schedule and its replay rounds, per tick (not per run)
        fp = dataclasses.replace(fp, memory_bytes=fp.memory_bytes + 48.0 * s.algo.T)
        signal = None
        if s.variant == "cd":  # a mean of m_i gradients clipped to L0 (L1): 2 L0 / m_i
            signal = Signal(tuple(2.0 / float(m) for m in prep.data[s.path].m_all),
                            int(ctx.shard.n_features))
        k = ctx.job.section(P2PKeys)
        return Configured(rc, s, None if plans is None else tuple(plans), fp, records,
                          lambda: self._attrs(ctx, prep, rc, s, other), signal,
                          rules.Theorem1(delta_bar=float(k.delta_bar), allocation=k.allocation),
                          # local DP: its split is fixed, eps_x + eps_y = eps (basic)
                          rules.EVEN_SPLIT if s.variant == "local_dp" else None)

    def _attrs(self, ctx: Context, prep: Prepared, rc: Resolved, s: P2PSettings,
               other_releases: int) -> dict[str, Any]:
        d = prep.data[s.path]
        a = s.algo
        out = {k: v for k, v in settings_attrs(a).items()
               if k not in ("lam_ws", "T_agent", "runs", "eps")}
        out["other_releases"] = other_releases
        if ctx.job.section(P2PKeys).select:
            out["select"] = ctx.job.section(P2PKeys).select
        out["eps_bar"] = a.eps
        out["run_ids"] = np.asarray(a.runs, dtype=np.int64)
        if a.T_agent is not None:
            out["T_agent"] = int(a.T_agent[0])
        return {**out, "label": rc.config.label(rc.eps, [int(v) for v in d.m]),
                "n": d.m, "shard": s.path, "loss": s.loss, "mu": s.mu,
                "lam_rule": str(ctx.job.section(P2PKeys).lam), "smoothness": s.smooth, "clock": s.clock,
                "method_variant": s.variant, "certified": a.certified,
                "evaluation_only": EVALUATION_ONLY, "n_peers": d.W.shape[0],
                "graph_edges": int(d.W.nnz // 2), **self._graph_attrs(d)}

    @staticmethod
    def _graph_attrs(d: Data) -> dict[str, Any]:
        """The graph as public attributes: its description (JSON), kind and mean degree."""
        info = d.graph_info or {}
        return {"graph": info, "graph_kind": str(info.get("kind", "")),
                "graph_mean_degree": float(info.get("mean_degree", math.nan))}

    # -- run -----------------------------------------------------------------------------
    def _full(self, ctx: Context, prep: Prepared, s: P2PSettings) -> Data | None:
        """Every peer's records on rank 0 (evaluation-only: Q*, the admm baseline)."""
        if ctx.comm.Get_rank() != 0:
            return None
        if s.path not in prep.full:
            d = prep.data[s.path]
            prep.full[s.path] = self._load(ctx, s.path, hosted=False, W=d.W, m_all=d.m_all)
            prep.full[s.path].graph = d.graph
            prep.full[s.path].graph_info = d.graph_info
            prep.full[s.path].test_global = d.test_global
        return prep.full[s.path]

    def run(self, ctx: Context, prep: Prepared, c: Configured[P2PSettings], contract: Contract,
            hooks: RunHooks) -> Outcome | None:
        comm, j = ctx.comm, ctx.job
        s, rc = c.settings, c.resolved
        d = prep.data[s.path]
        t0 = time.perf_counter()
        P = driver.hosted_problem(comm, s.objective, d)
        solver = self._solver(ctx, s)
        # every peer's records on rank 0 only where a solve needs them all (Q* on one rank, the
        # admm baseline simulated there)
        need_full = s.variant == "admm" or solver in ("scipy", "petsc")
        full = on_root(comm, lambda: self._full(ctx, prep, s)) if need_full else None
        key = (s.path, s.loss, s.mu, s.lam, s.smooth, solver)
        # the local models (and Q of the baselines) are evaluation-only unless the run starts
        # from them or Q* starts there: then they come after the run (run_cd completes the
        # reference), not before its first round
        late = s.variant == "cd" and s.algo.init != "local" and solver not in ("scipy", "petsc")
        ref = prep.refs.get(key)
        cache = reference_cache.cache_dir(j.section(P2PKeys).reference_cache)
        if ref is None:
            ref = driver.reference(comm, s.objective, P, d, full, solver, local=not late,
                                   cache=cache, log=hooks.info)
        out: Outcome | None = None
        if s.variant == "admm":
            T = int(j.generic.T)
            got = driver.run_admm(comm, s.objective, P, d, full, ref, hooks, j.section(P2PKeys).admm_rho,
                                  int(j.section(P2PKeys).admm_inner), T, int(j.generic.seed),
                                  int(j.generic.record_every) or T)
            if got is not None:
                out = self._final_outcome([], "non-private baseline (gossip ADMM): no DP claim",
                                          got[0], ref, d)
                out.attrs.update(rho=got[1], admm_inner=int(j.section(P2PKeys).admm_inner),
                                 vectors_sent=4 * T, simulated="serially on rank 0",
                                 seconds=round(time.perf_counter() - t0, 3))
        elif s.variant == "local_dp":
            Bx = float(j.section(P2PKeys).local_dp_bound)
            got_dp = driver.run_local_dp(comm, P, d, s.algo, contract, float(rc.eps[0]), Bx, ref,
                                         hooks)
            if got_dp is not None:
                out = self._final_outcome(
                    got_dp[1], f"local DP: every record perturbed once by its owner (features "
                    f"clipped to [-{Bx:g}, {Bx:g}] + Laplace, labels by randomised response), "
                    "eps split equally; nothing else is released", got_dp[0], ref, d)
                out.attrs.update(seconds=round(time.perf_counter() - t0, 3))
        else:
            a = s.algo
            keys = j.section(P2PKeys)
            run = driver.run_cd(comm, P, d, a, contract, ref, hooks, s.clock, float(keys.tau),
                                float(keys.wall_budget),
                                self._val_clip(ctx, d) if a.score_releases else None, cache)
            out = None if run is None else self._cd_outcome(s, d, ref, run, t0, contract)
        prep.refs[key] = ref  # whole now: run_cd added the local models a late one lacked
        return out

    @staticmethod
    def _val_clip(ctx: Context, d: Data) -> float:
        """The validation score's public bound (p2p.val_clip; 'auto': 1, binary shards only)."""
        vc = ctx.job.section(P2PKeys).val_clip
        if vc != "auto":
            return float(vc)
        if d.task != "binary":
            raise JobError(f"job file {ctx.job.path}: key 'p2p.val_clip': a regression score "
                           "needs a public bound on the prediction error (e.g. the rating "
                           "range): set p2p.val_clip")
        return 1.0

    @staticmethod
    def _solver(ctx: Context, s: P2PSettings) -> str:
        """The Q* solver, decided alike on every rank (no collective PETSc initialisation)."""
        import importlib.util

        solver = ctx.job.section(P2PKeys).reference
        has_petsc = importlib.util.find_spec("petsc4py") is not None
        if solver == "auto":
            solver = "petsc" if has_petsc and s.loss == "quadratic" else "scipy"
        if solver == "petsc" and not has_petsc:
            raise JobError(f"job file {ctx.job.path}: key 'p2p.reference': petsc needs "
                           "petsc4py (make venv WITH_PETSC=1), or use 'scipy'")
        return "petsc_dist" if solver == "petsc" and s.loss == "quadratic" else solver

    # -- outcome -------------------------------------------------------------------------
    def _cd_outcome(self, s: P2PSettings, d: Data, ref: dict[str, Any], run: driver.CDRun,
                    t0: float, contract: Contract) -> Outcome:
        a = s.algo
        out = self._final_outcome(run.ledgers, self._guarantee(a, contract), run.final, ref, d)
        per = run.theorem1(a)
        out.add("privacy/theorem1", per, what="per peer: wake-ups, sum of its per-release eps, "
                "the Theorem-1 composition (Kairouz et al.) at delta_bar of what it released "
                "(the paper's guarantee; under a calibrated rule only a comparison: the "
                "guarantee is privacy/ledger's), the warm start's eps and the total by "
                "sequential composition")
        if a.private:  # the per-release eps of an equal split (the others vary by release)
            if not contract.rule.paper:
                out.attrs["eps_step"] = max(c.eps_release for c in contract.calibrations or ()
                                            if c is not None)
            else:
                out.attrs["eps_step"] = (kairouz.equal_split(a.eps, int(a.T_agent[0]), a.delta)
                                         if a.allocation == "equal" and a.T_agent is not None
                                         else math.nan)
        arrays, vectors = run.schedule_arrays(s.clock == "live")
        out.arrays.extend(arrays)
        out.attrs.update(vectors_sent=vectors, puts=int(run.puts),
                         wakeups=int(per["wakeups"].sum()),
                         eps_theorem1_max=float(per["eps_theorem1"].max()),
                         eps_total_max=float(per["eps_total"].max()),
                         seconds=round(time.perf_counter() - t0, 3), **run.info)
        return out

    @staticmethod
    def _guarantee(a: coordinate_descent.Settings, contract: Contract) -> str:
        if not a.private:
            return "non-private (eps = inf): the models are broadcast without noise"
        cert = "" if a.certified else (" UNCERTIFIED (faithful mode: L0 = 1 without clipping, "
                                       "not DP unless every ||x||_1 <= 1);")
        if not contract.rule.paper:
            rule, rule_text = contract.rule.name, contract.rule.text
            sel = ("; a private selection: every candidate's wake-ups, warm start and noised "
                   "validation score are calibrated together to the peer's (eps, delta) "
                   "(scope selection: the totals include the other candidates' planned "
                   "releases; *_all: this configuration's alone)" if a.score_releases else "")
            ws = "; plus the warm start (L2 Laplace, eps_ws)" if a.init == "private_ws" else ""
            return (f"every peer is (eps, delta)-DP for its records (replace-one) over all its "
                    f"releases:{cert} each wake-up broadcasts its model with Laplace noise on "
                    f"its clipped gradient (sensitivity 2 L0 / m_i), the noise calibrated by "
                    f"{rule} ({rule_text}){ws}{sel}")
        return (f"the paper's rule: every wake-up releases the peer's model with Laplace noise "
                f"on its clipped "
                f"gradient: (e_k, 0)-DP per release;{cert} a peer's releases compose by "
                f"Theorem 1 (Kairouz et al.) to eps_bar at delta_bar = {a.delta:.4g} "
                "(privacy/theorem1); the accountants below compose the same releases "
                "(basic / advanced / PLD / RDP at the job's delta)"
                + ("; plus the warm start's eps_ws (L2 Laplace output perturbation)"
                   if a.init == "private_ws" else ""))

    @staticmethod
    def _final_outcome(ledgers: list, guarantee: str, final: dict[str, Any], ref: dict[str, Any],
                       d: Data) -> Outcome:
        """An outcome with the final models, the reference and the scores (evaluation)."""
        arrays, attrs = evaluation.final_outcome(final, ref, d)
        return Outcome(ledgers, guarantee=guarantee, arrays=arrays, attrs=attrs)

    # -- analysis ------------------------------------------------------------------------
    def analyze(self, result: Any, metric: str | None = None) -> str:
        from . import report

        return report.p2p_text(result)

    def table_rows(self, result: Any, metric: str | None = None) -> list[dict[str, Any]]:
        from . import report

        return report.p2p_rows(result)

    def figures(self, result: Any, prefix: Path, metric: str | None = None) -> list[Path]:
        from . import report

        return report.plot_p2p(result, prefix)


METHOD = P2P()
