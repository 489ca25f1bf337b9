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

import contextlib
import dataclasses
import math
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse as sp
from mpi4py import MPI

from ..algorithms import p2p_baselines as B
from ..algorithms import p2p_cd as C
from ..comm import rma, stop
from ..comm import topology as tp
from ..comm.graph import block_starts
from ..comm.rma import bcast_csr, on_root
from ..data import ShardFile
from ..data.bounds import row_norm_bound
from ..data.graphs import (
    EDGES,
    WEIGHTS,
    graph_arrays,
    has_graph,
    read_descriptors,
    read_graph,
    stored_graph,
)
from ..errors import DataError, JobError
from ..jobspec import Key, err
from ..models import p2p as M
from ..models import p2p_reference as REF
from ..privacy import contract
from ..privacy import kairouz as K
from ..results.footprint import Footprint
from ..rng import stream
from .base import (
    Context,
    Method,
    Outcome,
    Resolved,
    calibration_attrs,
    owner_plans,
    settings_attrs,
    shard_sizes,
)

_NUM = (int, float)
EVALUATION_ONLY = (
    "evaluation-only: Q, gap (Q - Q*), losses and the test metrics read every peer's model and "
    "data on the host ranks; Q* and theta_star are solved on rank 0 from every peer's records; "
    "the local models and the trivial baseline are never released; test_global_error scores "
    "every peer's final model on the shard file's global test set on rank 0")
#: p2p.graph spellings (comm.topology.parse_graph_spec; dola's own kinds are not p2p's)
GRAPH_HELP = (
    "the peers' public similarity graph: " + tp.SPELLINGS + ". A built graph comes from the "
    "job's seed on rank 0 (the same on any rank count), must be connected, and weighs 1 per edge "
    "unless its edge list gives weights; the output records it (attrs graph, graph_kind, "
    "graph_edges, graph_mean_degree)")

SECTION = {
    "loss": Key((str,), "auto", "per-example loss: auto (logistic for a binary shard, quadratic "
                "for regression), logistic, quadratic", ("auto",) + M.LOSSES),
    "mu": Key(_NUM, 1.0, "trade-off mu of objective (2): large -> the purely local models, "
              "small -> one consensus model"),
    "lam": Key(_NUM + (str,), "1/m", "L2 weight lam_i of L_i: '1/m' (1/m_i, the paper's) or a "
               "number"),
    "conf_floor": Key(_NUM, 1e-3, "confidence c_i of a peer without records"),
    "smoothness": Key((str,), "bound", "L_loc of alpha_i: bound (from the public row-norm bound "
                      "row_norm: alpha_i does not read private data) or data (the paper: "
                      "lmax(X_i^T X_i), data-dependent step)", ("bound", "data")),
    "row_norm": Key(_NUM + (str,), "auto", "public bound on every record's L2 norm: 'auto' = the "
                    "shard's public item_norm_max if present, else its row_norm_max (`data "
                    "prepare --row-norm`), else 1 (rows normalised to norm <= 1); checked "
                    "against the data before the run"),
    "T_agent": Key((int, str), "auto", "T_i, wake-ups of each peer: 'auto' = ceil(T / n) when "
                   "private (the paper's T/n) and no cap at eps = inf; a number caps every peer"),
    "allocation": Key((str,), "equal", "budget split over a peer's T_i wake-ups: equal (every "
                      "release alike; the paper rule: Theorem-1 composition, bisection); with "
                      "privacy.calibration = 'paper' also simple (eps/T_i), prop2_paper, "
                      "prop2_corrected (Proposition 2, replay only)", K.ALLOCATIONS),
    "delta_bar": Key(_NUM, math.exp(-5), "privacy.calibration = 'paper' only: delta_bar of "
                     "Theorem 1 (the paper: e^-5; refused at or above 1/m_i)"),
    "mode": Key((str,), "sound", "sound: clip per-example gradients to L1 norm <= clip (L0 = "
                "clip); faithful: L0 = 1 and no clipping (the paper: not DP unless ||x||_1 <= 1, "
                "recorded uncertified)", C.MODES),
    "clip": Key(_NUM, 1.0, "C_clip = L0: L1 bound on every per-example gradient (sound mode)"),
    "init": Key((str,), "zero", "Theta(0): zero, local (the non-private local models: only at "
                "eps = inf), private_ws (Algorithm 4: local models + L2-Laplace output "
                "perturbation at eps_ws, then model propagation)", C.INITS),
    "eps_ws": Key(_NUM, 0.05, "eps of the private warm start (charged to every peer)"),
    "lam_ws": Key(_NUM + (str,), "lam", "L2 weight of the warm start's local models: 'lam' "
                  "(lam_i) or a multiple of lam_i, e.g. 10"),
    "mu_ws": Key(_NUM + (str,), "mu", "mu of the warm start's model propagation ('mu': mu)"),
    "clock": Key((str,), "replay", "replay: the seeded schedule in conflict-free rounds (bitwise "
                 "equal to the serial simulator on any layout); live: Poisson clocks in wall "
                 "time, no barriers, the realised schedule logged", ("replay", "live")),
    "tau": Key(_NUM, 0.0, "live: mean seconds between a peer's ticks (0: as fast as possible)"),
    "wall_budget": Key(_NUM, 3600.0, "live: seconds before the peers stop"),
    "reference": Key((str,), "auto", "Q* solver: auto (PETSc KSP if petsc4py, else SciPy CG; "
                     "L-BFGS for logistic), scipy, petsc, none", ("auto", "scipy", "petsc",
                                                                  "none")),
    "admm_rho": Key(_NUM + (str,), "auto", "gossip ADMM penalty ('auto': mean positive W_ij)"),
    "admm_inner": Key((int,), 10, "K, gradient steps per ADMM activation"),
    "local_dp_bound": Key(_NUM, 1.0, "local_dp: features clipped to [-B, B]"),
    "validation": Key(_NUM, 0.0, "share of every peer's training records held out (seeded) "
                      "for tuning (p2p.select)"),
    "select": Key((str,), "", "a private selection: the configurations that differ only in "
                  "this swept key (T_agent) are candidates; each peer releases its noised "
                  "validation score (attribute val_metric) at the end of every candidate, and "
                  "every candidate's releases are calibrated together to the peer's (eps, "
                  "delta) (one per-release noise for all); analyze picks the best score",
                  ("", "T_agent")),
    "val_clip": Key(_NUM + (str,), "auto", "the validation score's public bound: a regression "
                    "score is the mean squared error with every error clipped to +-val_clip "
                    "(its sensitivity val_clip^2 / m_val); 'auto': 1 for a binary shard (the "
                    "error rate, sensitivity 1 / m_val), required for regression"),
    "graph": Key((str,), "shard", GRAPH_HELP),
    "shard": Key((str,), "", "shard file of this configuration (default: the job's shard); "
                 "sweep it ([sweep] shard = [...]) to average over random splits (Table 1's "
                 "five) or to compare dimensions (Fig. 2c)"),
}


@dataclasses.dataclass
class Data:
    """One shard file as this rank sees it: public graph and sizes, its peers' records."""

    path: str
    W: sp.csr_matrix
    m: np.ndarray
    X: list
    y: list
    Xt: list
    yt: list
    row_norm: float
    task: str
    full: bool = False  # every peer's records are loaded (rank 0's evaluation copy)
    Xv: list | None = None  # held-out validation records of each peer (p2p.validation > 0)
    yv: list | None = None
    m_all: np.ndarray | None = None  # records in the shard file (m + the validation share)
    graph: M.Graph | None = None  # the checked graph of W, built once (`_problem`)
    graph_info: dict | None = None  # what the output records about the graph (public)
    test_global: tuple | None = None  # the shard file's global test set (rank 0 only)


@dataclasses.dataclass
class Prepared:
    data: dict = dataclasses.field(default_factory=dict)  # path -> Data (hosted peers)
    full: dict = dataclasses.field(default_factory=dict)  # path -> Data (all peers, rank 0)
    refs: dict = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class P2PSettings:
    algo: C.Settings
    path: str
    loss: str
    mu: float
    lam: tuple[float, ...]
    smooth: str
    clock: str
    variant: str


def _nanmean(a: Any) -> float:
    """np.nanmean as a float (NaN, without a warning, when every entry is NaN: a shard without
    per-peer test records)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return float(np.nanmean(a))


def _lam(spec: Any, m: np.ndarray) -> np.ndarray:
    return 1.0 / np.maximum(m, 1) if spec == "1/m" else np.full(len(m), float(spec))


class P2P(Method):
    name = "p2p"
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
    paper_rule_name = "theorem1"

    #: the wake-up schedule and its replay rounds, per tick (not per run)
    PER_ITERATION_BYTES = 0.0

    def footprint(self, ctx: Context, prep: Prepared, rc: Resolved, s: P2PSettings) -> Footprint:
        base = super().footprint(ctx, prep, rc, s)
        return dataclasses.replace(base, memory_bytes=base.memory_bytes + 48.0 * s.algo.T)

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
            tp.parse_graph_spec(values["p2p.graph"])
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
        paths = j.get("sweep.shard") or [j["p2p.shard"] or str(ctx.shard.path)]
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
            shard = self._open(ctx, path)
            return (*self._peer_graph(ctx, shard), self._global_test(ctx, shard))

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

    @staticmethod
    def _peer_graph(ctx: Context, shard: ShardFile) -> tuple[sp.csr_matrix, dict[str, Any]]:
        """The peers' graph W (symmetric CSR, sorted indices) of p2p.graph and what the output
        records about it: the shard file's stored graph ('shard', read as it always was) or
        one built by comm.topology from the seed (weight 1 per edge where it has none)."""
        j = ctx.job
        spec = j["p2p.graph"]
        if spec == "shard":
            if not has_graph(shard):
                raise JobError(
                    f"job file {j.path}: key 'p2p.graph': 'shard' (the default) reads the graph "
                    f"stored in the shard file, but {shard.path} has no public graph (/public/"
                    "graph_edges, graph_weights: only `mpi-dp data synth --task p2p` and the "
                    "movielens recipe write one); set p2p.graph to a graph built for the job: "
                    "'complete', "
                    "'erdos_renyi:p' (e.g. 'erdos_renyi:0.2'), 'random_geometric', 'knn:K' (needs "
                    "public /public/agent_descriptors) or an edge-list path ('i j [w]' per line)")
            W = read_graph(shard)
            info: dict[str, Any] = {"kind": "shard", "source": "the shard file's /public/"
                                    "graph_edges and graph_weights (its weights)"}
        else:
            try:
                g = tp.make_graph(spec, shard.n_agents, int(j["seed"]),
                                  descriptors=lambda: read_descriptors(shard),
                                  stored=lambda: stored_graph(shard))
            except (JobError, DataError) as e:
                raise JobError(f"job file {j.path}: key 'p2p.graph': {e}") from None
            W = g.weight_matrix()
            info = g.describe()
            info["weights"] = ("the edge list's" if g.weights is not None
                               else "1 per edge (an unweighted graph)")
        deg = np.diff(W.indptr)
        info.update(spec=spec, m=int(W.shape[0]), n_edges=int(W.nnz // 2),
                    mean_degree=float(deg.mean()) if deg.size else 0.0,
                    min_degree=int(deg.min()) if deg.size else 0,
                    max_degree=int(deg.max()) if deg.size else 0)
        return W, info

    @staticmethod
    def _global_test(ctx: Context, shard: ShardFile) -> tuple[np.ndarray, np.ndarray] | None:
        """The shard file's global test set (dense X, y), checked, or None without one."""
        if not shard.has_global_test:
            return None
        X, y = shard.read_test()
        X = X.toarray() if sp.issparse(X) else np.asarray(X, dtype=np.float64)
        if shard.task == "binary" and not np.all(np.isin(y, (-1.0, 1.0))):
            raise JobError(f"job file {ctx.job.path}: {shard.path}: the global test set has "
                           f"labels {np.unique(y)[:4].tolist()}; binary p2p needs -1/+1")
        return X, y

    def _load(self, ctx: Context, path: str, hosted: bool, W: sp.csr_matrix | None = None,
              m_all: np.ndarray | None = None, shard: ShardFile | None = None) -> Data:
        """The public graph and sizes (read unless given) and the records of this rank's peers
        (`hosted`) or of all of them."""
        j = ctx.job
        shard = self._open(ctx, path) if shard is None else shard
        W = self._peer_graph(ctx, shard)[0] if W is None else W
        n = shard.n_agents
        m_all = shard.sizes().astype(np.int64) if m_all is None else m_all
        frac = float(j["p2p.validation"])
        n_val = np.floor(frac * m_all).astype(np.int64) if frac > 0 else np.zeros_like(m_all)
        m = m_all - n_val  # public: depends on the public m_i only
        rank, size = ctx.comm.Get_rank(), ctx.comm.Get_size()
        st = block_starts(n, size)
        mine = range(n) if not hosted else range(int(st[rank]), int(st[rank + 1]))
        X: list = [None] * n
        y: list = [None] * n
        Xt: list = [None] * n
        yt: list = [None] * n
        Xv: list = [None] * n
        yv: list = [None] * n
        for i in mine:
            X[i], y[i] = shard.read_agent(i)
            if n_val[i]:  # a fixed random share of the peer's training records, per peer
                perm = stream(int(j["seed"]), "partition", i).permutation(int(m_all[i]))
                v, t = np.sort(perm[: n_val[i]]), np.sort(perm[n_val[i]:])
                Xv[i], yv[i] = X[i][v], y[i][v]
                X[i], y[i] = X[i][t], y[i][t]
            if shard.has_test(i):
                Xt[i], yt[i] = shard.read_agent_test(i)
        rn = j["p2p.row_norm"]
        if rn == "auto":
            item, bound = row_norm_bound(shard, "item_norm_max"), row_norm_bound(shard)
            rn = item if item is not None else bound if bound is not None else 1.0
        bad = [(i, float(np.linalg.norm(X[i], axis=1).max())) for i in mine if m[i] and
               np.linalg.norm(X[i], axis=1).max() > rn * (1 + 1e-9)]
        nonfinite = [i for i in mine if m[i] and not (np.all(np.isfinite(X[i])) and
                                                      np.all(np.isfinite(y[i])))]
        if nonfinite:
            raise JobError(f"job file {j.path}: {shard.path}: peer(s) {nonfinite[:5]} hold NaN "
                           "or inf values")
        if bad:
            raise JobError(f"job file {j.path}: key 'p2p.row_norm': peer {bad[0][0]} of "
                           f"{shard.path} has a record of L2 norm {bad[0][1]:.4g} > row_norm = "
                           f"{rn:g} (give a public bound that holds, or normalise the rows)")
        if shard.task == "binary":
            for i in mine:
                if m[i] and not np.all(np.isin(y[i], (-1.0, 1.0))):
                    raise JobError(f"job file {j.path}: {shard.path}: peer {i} has labels "
                                   f"{np.unique(y[i])[:4].tolist()}; binary p2p needs -1/+1")
        loss = self._loss(j, shard.task)
        if loss == "logistic" and shard.task != "binary":
            raise JobError(f"job file {j.path}: key 'p2p.loss': logistic needs a binary shard, "
                           f"{shard.path} is {shard.task}")
        return Data(str(path), W, m, X, y, Xt, yt, float(rn), shard.task, full=not hosted,
                    Xv=Xv if frac > 0 else None, yv=yv if frac > 0 else None, m_all=m_all)

    @staticmethod
    def _loss(j: Any, task: str) -> str:
        loss = j["p2p.loss"]
        return ("logistic" if task == "binary" else "quadratic") if loss == "auto" else loss

    def header(self, ctx: Context, prep: Prepared) -> str:
        d = next(iter(prep.data.values()))
        deg = np.diff(d.W.indptr)
        kind = (d.graph_info or {}).get("kind", "?")
        return (f"p={ctx.shard.n_features}; {kind} graph of {d.W.shape[0]} peers, mean degree "
                f"{deg.mean():.1f}; clock {ctx.job['p2p.clock']}")

    # -- configuration -------------------------------------------------------------------
    def settings(self, ctx: Context, prep: Prepared, rc: Resolved) -> P2PSettings:
        j = ctx.job
        path = rc.config.param("p2p.shard", j["p2p.shard"]) or next(iter(prep.data))
        d = prep.data[path]
        n = d.W.shape[0]
        if len(set(rc.eps)) != 1:
            raise JobError(f"job file {j.path}: key 'eps': p2p gives every peer the same "
                           "eps_bar (one number)")
        eps = float(rc.eps[0])
        private = math.isfinite(eps) and rc.variant == "cd"
        ta = rc.config.param("p2p.T_agent", j["p2p.T_agent"])
        if ta == "auto":
            cap = (math.ceil(j["T"] / n),) * n if private or j["p2p.clock"] == "live" else None
        else:
            cap = (int(ta),) * n
        init = rc.config.param("p2p.init", j["p2p.init"])
        mu = float(rc.config.param("p2p.mu", j["p2p.mu"]))
        if init == "local" and private:
            raise JobError(f"job file {j.path}: key 'p2p.init': the non-private local models "
                           "cannot start a private run (use private_ws or zero)")
        loss = self._loss(j, d.task)
        if init == "private_ws" and loss != "logistic":
            raise JobError(f"job file {j.path}: key 'p2p.init': the private warm start's "
                           "output perturbation needs per-example gradients bounded by the row "
                           "norm (logistic loss); not available for the quadratic loss")
        lam = _lam(j["p2p.lam"], d.m)
        lw = j["p2p.lam_ws"]
        lam_ws = lam if lw == "lam" else lam * float(lw)
        mw = j["p2p.mu_ws"]
        algo = C.Settings(
            T=int(j["T"]), T_agent=cap, eps=eps if rc.variant == "cd" else math.inf,
            delta=float(j["p2p.delta_bar"]), allocation=j["p2p.allocation"], mode=j["p2p.mode"],
            clip=float(j["p2p.clip"]), init=init, eps_ws=float(j["p2p.eps_ws"]),
            lam_ws=tuple(float(v) for v in lam_ws),
            mu_ws=mu if mw == "mu" else float(mw), row_norm=d.row_norm,
            runs=ctx.run_ids, seed=int(j["seed"]), record_every=int(j["record_every"]))
        if rc.variant == "local_dp" and d.task != "binary":
            raise JobError(f"job file {j.path}: variant 'local_dp' perturbs -1/+1 labels by "
                           f"randomised response; {path} is a {d.task} task")
        if rc.variant == "admm" and math.isfinite(eps):
            raise JobError(f"job file {j.path}: variant 'admm' is the non-private baseline: "
                           "run it at eps = inf (a separate job, or cd alone in the eps sweep)")
        if rc.variant == "admm" and j["p2p.clock"] == "live":
            raise JobError(f"job file {j.path}: the admm baseline runs serially (clock replay)")
        if rc.variant == "cd" and j["p2p.clock"] == "live" and ctx.comm.Get_size() < 2:
            raise JobError(f"job file {j.path}: key 'p2p.clock': live runs need at least 2 "
                           "ranks (run with mpiexec -n 2 or more)")
        return P2PSettings(algo, path, loss, mu, tuple(float(v) for v in lam),
                           j["p2p.smoothness"], j["p2p.clock"], rc.variant)

    def _cap(self, ctx: Context, value: Any, n: int) -> int:
        """T_i of a T_agent value ('auto': ceil(T / n))."""
        return math.ceil(ctx.job["T"] / n) if value == "auto" else int(value)

    def release_signal(self, ctx: Context, prep: Prepared, rc: Resolved, s: P2PSettings
                       ) -> tuple[list[float], int] | None:
        """cd: a wake-up's local gradient, a mean of m_i per-example gradients clipped to L0 (L1),
        against Laplace noise of sensitivity 2 L0 / m_i. local_dp and admm: not defined."""
        if s.variant != "cd":
            return None
        return [2.0 / float(m) for m in prep.data[s.path].m_all], int(ctx.shard.n_features)

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
        ws = (C.warm_start_event(a.eps_ws),) if a.init == "private_ws" else ()
        cap = int(a.T_agent[0])
        if j["privacy.calibration"] == "paper":
            if a.delta > 0 and a.delta * int(m_all.min()) >= 1:
                i = int(np.argmin(m_all))
                raise JobError(f"job file {j.path}: key 'p2p.delta_bar': {a.delta:g} is at or "
                               f"above 1/m_i for peer {i} (m_i = {int(m_all[i])} records); use "
                               f"a delta_bar < 1/{int(m_all.max())}")
            if j["p2p.select"]:
                raise JobError(f"job file {j.path}: key 'p2p.select': a private selection "
                               "composes its candidates under the contract: set "
                               "privacy.calibration = 'pld' or 'basic'")
            return owner_plans(ctx, rc, m_all, "laplace", cap, fixed=ws)
        if not j["p2p.select"]:
            return owner_plans(ctx, rc, m_all, "laplace", cap, fixed=ws)
        self._val_clip(ctx, d)  # a regression score needs its bound: refused before running
        caps = self._candidates(ctx, d)  # all candidates' releases, calibrated together
        return owner_plans(ctx, rc, m_all, "laplace", sum(caps) + len(caps),
                           fixed=ws * len(caps), scope="selection")

    def _candidates(self, ctx: Context, d: Data) -> list[int]:
        """T_i of every candidate of the selection (p2p.select = 'T_agent')."""
        n = d.W.shape[0]
        return [self._cap(ctx, v, n) for v in ctx.job["sweep.T_agent"]]

    def calibrated(self, ctx: Context, prep: Prepared, rc: Resolved, s: P2PSettings,
                   cals: list) -> P2PSettings:
        a = s.algo
        if s.variant == "local_dp":  # each record in one release of eps_x + eps_y = eps
            cals = [dataclasses.replace(c, rule="basic") for c in cals]
            return dataclasses.replace(s, algo=dataclasses.replace(a, calibration=tuple(cals)))
        extra: dict[str, Any] = {}
        if ctx.job["p2p.select"] and a.private and cals[0].rule != "paper":
            caps = self._candidates(ctx, prep.data[s.path])
            ws = (C.warm_start_event(a.eps_ws),) if a.init == "private_ws" else ()
            extra = {"score_releases": 1,
                     "other_releases": sum(caps) + len(caps) - int(a.T_agent[0]) - 1,
                     "other_fixed": ws * (len(caps) - 1)}
        return dataclasses.replace(s, algo=dataclasses.replace(a, calibration=tuple(cals),
                                                               **extra))

    def record_attrs(self, ctx: Context, prep: Prepared, rc: Resolved, s: P2PSettings
                     ) -> dict[str, Any]:
        d = prep.data[s.path]
        a = s.algo
        out = {k: v for k, v in settings_attrs(a).items()
               if k not in ("lam_ws", "T_agent", "runs", "eps", "other_fixed")}
        out.update(calibration_attrs(list(a.calibration)))
        if ctx.job["p2p.select"]:
            out["select"] = ctx.job["p2p.select"]
        out["eps_bar"] = a.eps
        out["run_ids"] = np.asarray(a.runs, dtype=np.int64)
        if a.T_agent is not None:
            out["T_agent"] = int(a.T_agent[0])
        return {**out, "label": rc.config.label(rc.eps, [int(v) for v in d.m]),
                "n": d.m, "shard": s.path, "loss": s.loss, "mu": s.mu,
                "lam_rule": str(ctx.job["p2p.lam"]), "smoothness": s.smooth, "clock": s.clock,
                "method_variant": s.variant, "certified": a.certified,
                "evaluation_only": EVALUATION_ONLY, "n_peers": d.W.shape[0],
                "graph_edges": int(d.W.nnz // 2), **self._graph_attrs(d)}

    @staticmethod
    def _graph_attrs(d: Data) -> dict[str, Any]:
        """The graph as public attributes: its description (JSON), kind and mean degree."""
        info = d.graph_info or {}
        return {"graph": info, "graph_kind": str(info.get("kind", "")),
                "graph_mean_degree": float(info.get("mean_degree", math.nan))}

    def expected_records(self, ctx: Context, s: P2PSettings) -> int:
        ev = s.algo.record_every or s.algo.T
        return s.algo.T // max(1, ev) + 2

    # -- run -----------------------------------------------------------------------------
    def _problem(self, d: Data, s: P2PSettings, L_loc: np.ndarray | None = None) -> M.Problem:
        if d.graph is None:
            d.graph = M.Graph(sp.csr_matrix(d.W), symmetric=True)  # read_graph made W so
        P = M.make_problem(d.graph, d.X, d.y, s.loss, s.mu, np.asarray(s.lam), m=d.m,
                           smooth=s.smooth, row_norm=d.row_norm)
        if L_loc is not None:  # every peer's constant (data mode: gathered)
            P.L_loc[:] = L_loc
            P.__post_init__()
        return P

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

    def run_config(self, ctx: Context, prep: Prepared, rc: Resolved, s: P2PSettings,
                   recorder: Any, label: str) -> Outcome | None:
        comm = ctx.comm
        d = prep.data[s.path]
        t0 = time.perf_counter()
        P = self._problem(d, s)
        if s.smooth == "data":  # alpha_i of the hosted peers from their data; kappa needs all
            mine = [i for i in range(P.n) if d.X[i] is not None]
            got = comm.allgather({i: float(P.L_loc[i]) for i in mine})
            L_all = np.empty(P.n)
            for part in got:
                for i, v in part.items():
                    L_all[i] = v
            P = self._problem(d, s, L_all)
        solver = self._solver(ctx, s)
        # every peer's records on rank 0 only where a solve needs them all (Q* on one rank, the
        # admm baseline simulated there)
        need_full = s.variant == "admm" or solver in ("scipy", "petsc")
        full = on_root(comm, lambda: self._full(ctx, prep, s)) if need_full else None
        key = (s.path, s.loss, s.mu, s.lam, s.smooth, solver)
        # the local models (and Q of the baselines) are evaluation-only unless the run starts
        # from them or Q* starts there: then they come after the run, not before its first round
        late = s.variant == "cd" and s.algo.init != "local" and solver not in ("scipy", "petsc")
        if key not in prep.refs:
            ref = self._reference(ctx, s, d, full, P, solver, local=not late)
            ref = comm.bcast(ref, root=0)
            if solver == "petsc_dist":  # KSP over every rank, each with its own peers' rows
                th, q = ctx.agree(lambda: REF.theta_star_petsc_dist(comm, P))
                ref.update(theta_star=th, Q_star=float(q),
                           solver=f"PETSc KSP distributed over {comm.Get_size()} rank(s)")
            if late:
                ref["_complete"] = lambda base=ref: self._complete_reference(ctx, prep, key, s, d,
                                                                             P, base)
            else:
                prep.refs[key] = ref
        else:
            ref = prep.refs[key]
        if s.variant == "admm":
            return self._run_admm(ctx, s, d, full, P, ref, recorder, label, t0)
        if s.variant == "local_dp":
            return self._run_local_dp(ctx, rc, s, d, P, ref, recorder, t0)
        return self._run_cd(ctx, prep, s, d, P, ref, recorder, label, t0)

    def _complete_reference(self, ctx: Context, prep: Prepared, key: tuple, s: P2PSettings,
                            d: Data, P: M.Problem, base: dict[str, Any]) -> dict[str, Any]:
        """Collective: the reference of a run that did not need the local models before its
        rounds (`base`: what it had, e.g. a distributed Theta* and Q*), completed with them and
        kept, whole, for the job's later configurations."""
        ref = ctx.comm.bcast(self._reference(ctx, s, d, None, P, "none"), root=0)
        prep.refs[key] = {**{k: v for k, v in base.items() if k != "_complete"}, **ref}
        return ref

    @staticmethod
    def _val_clip(ctx: Context, d: Data) -> float:
        """The validation score's public bound (p2p.val_clip; 'auto': 1, binary shards only)."""
        vc = ctx.job["p2p.val_clip"]
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

        solver = ctx.job["p2p.reference"]
        has_petsc = importlib.util.find_spec("petsc4py") is not None
        if solver == "auto":
            solver = "petsc" if has_petsc and s.loss == "quadratic" else "scipy"
        if solver == "petsc" and not has_petsc:
            raise JobError(f"job file {ctx.job.path}: key 'p2p.reference': petsc needs "
                           "petsc4py (make venv WITH_PETSC=1), or use 'scipy'")
        return "petsc_dist" if solver == "petsc" and s.loss == "quadratic" else solver

    def _reference(self, ctx: Context, s: P2PSettings, d: Data, full: Data | None,
                   P: M.Problem, solver: str, local: bool = True) -> dict[str, Any] | None:
        """Collective, evaluation-only; the answer on rank 0 (None elsewhere): the local models
        and the baselines' Q (each rank solves and scores its own peers, rank 0 assembles them
        in peer order: the numbers of one rank doing it all) and, unless distributed or 'none',
        Theta* and Q* on rank 0 from every peer's records. Without `local`: only the latter
        (solver 'none' or 'petsc_dist': nothing; the local models come later)."""
        comm = ctx.comm
        if not local:
            if solver in ("scipy", "petsc"):
                raise ValueError("Theta* by L-BFGS starts from the local models")
            return on_root(comm, dict)
        st = block_starts(P.n, comm.Get_size())
        r = comm.Get_rank()
        agents = range(int(st[r]), int(st[r + 1]))

        def local() -> tuple[np.ndarray, list, list]:
            th = REF.local_models_of(P.loss, [d.X[i] for i in agents], [d.y[i] for i in agents],
                                     P.lam[int(st[r]):int(st[r + 1])], P.p)
            full_th = np.zeros((1, P.n, P.p))
            full_th[0, agents.start:agents.stop] = th
            return (th, P.loss_terms(full_th, agents),
                    P.loss_terms(np.zeros((1, P.n, P.p)), agents))

        parts = comm.gather(ctx.agree(local), root=0)

        def assemble() -> dict[str, Any]:
            assert parts is not None
            theta_loc = np.concatenate([th for th, _, _ in parts if len(th)])
            out: dict[str, Any] = {"theta_loc": theta_loc}
            if solver in ("scipy", "petsc"):
                assert full is not None
                Pf = self._problem(full, s, P.L_loc)
                th, q = REF.theta_star(Pf, solver=solver, x0=theta_loc.ravel())
                out.update(theta_star=th, Q_star=float(q), solver=solver)
            out["Q_loc"] = float(P.combine(theta_loc[None], [t for _, lt, _ in parts
                                                             for t in lt])[0])
            out["Q_zero"] = float(P.combine(np.zeros((1, P.n, P.p)), [t for _, _, zt in parts
                                                                       for t in zt])[0])
            return out

        return on_root(comm, assemble)

    # -- cd ------------------------------------------------------------------------------
    def _theta0(self, ctx: Context, s: P2PSettings, d: Data, P: M.Problem,
                ref: dict[str, Any], agents: np.ndarray) -> tuple[dict[int, np.ndarray], dict]:
        """Theta(0) of the hosted peers and what the warm start released."""
        a = s.algo
        R, p = a.R, P.p
        info: dict[str, Any] = {}
        if a.init == "zero":
            return {int(i): np.zeros((R, p)) for i in agents}, info
        if a.init == "local":
            return {int(i): np.broadcast_to(ref["theta_loc"][i], (R, p)).copy()
                    for i in agents}, info
        # private warm start: each hosted peer releases its perturbed local model ...
        noisy = {}
        for i in agents.tolist():
            loc = REF.local_model(P.loss, d.X[i], d.y[i], float(a.lam_ws[i]))
            sens = C.warm_start_sensitivity(a.row_norm, int(d.m[i]), float(a.lam_ws[i]))
            noisy[i] = np.stack([loc + C.l2_laplace(p, sens / a.eps_ws,
                                                     stream(a.seed, "warm_start", i, r))
                                 for r in a.runs])
        # ... every rank receives every release (a broadcast), then model propagation
        allrel: dict[int, np.ndarray] = {}
        for part in ctx.comm.allgather(noisy):
            allrel.update(part)
        tl = np.stack([allrel[i] for i in range(P.n)], axis=1)  # (R, n, p)
        Pmp = dataclasses.replace(P, mu=a.mu_ws)
        Pmp.__post_init__()
        out = ctx.comm.bcast(on_root(ctx.comm, lambda: np.stack(
            [REF.mp_solution(Pmp, tl[r]) for r in range(R)])), root=0)  # solved once
        info["warm_start"] = "output perturbation (L2 Laplace) + model propagation solved exactly"
        return {int(i): out[:, int(i), :].copy() for i in agents}, info

    def _run_cd(self, ctx: Context, prep: Prepared, s: P2PSettings, d: Data, P: M.Problem,
                ref: dict[str, Any], recorder: Any, label: str, t0: float) -> Outcome | None:
        comm = ctx.comm
        a = s.algo
        rank, size = comm.Get_rank(), comm.Get_size()
        st = block_starts(P.n, size)
        agents = np.arange(st[rank], st[rank + 1])
        schedule = C.global_schedule(a.seed, P.n, a.T)
        budgets = C.agent_budgets(a, P, schedule)
        theta0, info = self._theta0(ctx, s, d, P, ref, agents)
        block = C.Block(P, agents, a, budgets, theta0)
        if a.init == "private_ws":
            for i in agents.tolist():
                block.release[i].charge(C.warm_start_event(a.eps_ws))
        ev = Evaluator(comm, P, d, agents, ref, a.R)
        keep = C.effective_ticks(schedule, P.n, a.T_agent)
        replay = s.clock == "replay"
        rounds = C.cut_rounds(schedule, keep, P.graph, a.record_every) if replay else None
        # checkpoints: replay only (a live configuration runs in wall time and restarts from its
        # start on resume); the peers' states are keyed by peer id: any rank count resumes
        saved = comm.bcast(recorder.saved_state() if recorder is not None and replay else None,
                           root=0)
        puts0 = 0  # puts before the checkpoint, less the resumed re-posts (one per edge slot)
        if saved is not None and rounds is not None:
            block.restore(saved["peers"])
            puts0 = saved["puts"] - P.graph.W.nnz
            if ctx.progress and rank == 0:
                print(f"mpi-dp: [{label}] resumed from its checkpoint at tick "
                      f"{rounds.record_at[saved['round']]} ({rounds.starts[saved['round'] + 1]}"
                      f"/{len(keep)} wake-ups)", file=sys.stderr, flush=True)
        boxes = ctx.agree(lambda: rma.Mailboxes(comm, P.graph.W, a.R * P.p, st))
        epoch = contextlib.ExitStack()
        if rounds is not None:  # replay: one Lock_all epoch from the initial posts on (barriers
            epoch.enter_context(boxes.rounds())  # order every read after the writes it sees)
        C.post_initial(block, boxes)
        comm.Barrier()
        state = {"next": time.perf_counter() + 10.0}
        deg = np.diff(P.graph.W.indptr)
        sent_cum = np.cumsum(deg[schedule[keep]])

        def record(t: int) -> None:
            done = int(np.searchsorted(keep, t))  # kept ticks < t
            vals = ev.record(block)
            if recorder is not None and vals is not None:
                vals["vectors_sent"] = float(sent_cum[done - 1]) if done else 0.0
                recorder.append(t, vals)
            rma.polite_barrier(comm)  # the others nap while rank 0 sums Q and writes

        def progress(k: int) -> None:
            now = time.perf_counter()
            if ctx.progress and rank == 0 and now >= state["next"]:
                state["next"] = now + 10.0
                print(f"mpi-dp: [{label}] {k}/{len(keep)} wake-ups ({now - t0:.0f} s)",
                      file=sys.stderr, flush=True)

        def checkpoint(r: int) -> None:
            """Collective, after round r's record: every peer's state when rank 0's recorder
            says a checkpoint is due (not at the last round)."""
            assert rounds is not None
            if r >= rounds.count - 1:
                return
            save, signum = stop.at_record(comm, recorder is not None and recorder.checkpoint_due())
            if save:
                parts = comm.gather(block.state(), root=0)
                puts = comm.reduce(boxes.puts, root=0)
                if parts is not None and recorder is not None:
                    recorder.save_state({"round": r, "puts": puts + puts0, "peers": {
                        i: v for part in parts for i, v in part.items()}})
            if signum:
                raise stop.Interrupted(signum)

        if saved is None:
            record(0)
        log = None
        if rounds is not None:
            start = 0 if saved is None else saved["round"] + 1
            with epoch:  # the rounds exclude readers from writers: no locks needed
                C.replay(block, boxes, rounds, comm.Barrier, record, progress, checkpoint, start)
        else:
            log = C.live(block, boxes, float(ctx.job["p2p.tau"]),
                         float(ctx.job["p2p.wall_budget"]), boxes.poll, progress)
            req = comm.Ibarrier()  # idle ranks sleep instead of spinning in a barrier
            while not req.Test():
                boxes.poll()
                time.sleep(1e-3)
        record(a.T)
        puts = comm.reduce(boxes.puts, root=0)
        logs = comm.gather(log, root=0)
        rep = comm.gather(C.theorem1_report(block, a), root=0)
        complete = ref.pop("_complete", None)
        if complete is not None:  # the local models, evaluation-only, after the rounds
            ref.update(complete())
        final = ev.final(block, self._val_clip(ctx, d) if a.score_releases else None)
        ledgers = comm.gather([block.ledgers[int(i)] for i in agents], root=0)
        boxes.free()
        if rank != 0:
            return None
        return self._cd_outcome(s, d, P, ref, final, rep, ledgers, logs, schedule, keep, deg,
                                puts + puts0, info, t0)

    def _cd_outcome(self, s, d, P, ref, final, rep, ledgers, logs, schedule, keep, deg, puts,
                    info, t0) -> Outcome:
        a = s.algo
        report: dict[int, dict[str, float]] = {}
        for part in rep:
            report.update(part)
        out = Outcome(sorted((led for part in ledgers for led in part), key=lambda x: x.agent),
                      guarantee=self._guarantee(a))
        self._add_final(out, final, ref, d)
        n = P.n
        per = np.zeros(n, dtype=[("agent", "i8"), ("wakeups", "i8"), ("sum_e", "f8"),
                                 ("eps_theorem1", "f8"), ("eps_ws", "f8"), ("eps_total", "f8"),
                                 ("delta_bar", "f8"), ("clip_fraction", "f8")])
        ws = a.eps_ws if a.init == "private_ws" else 0.0
        for i in range(n):
            r = report[i]
            per[i] = (i, r["wakeups"], r["sum_e"], r["eps_theorem1"], ws,
                      r["eps_theorem1"] + ws, a.delta if a.private else 0.0, r["clip_fraction"])
        out.add("privacy/theorem1", per, what="per peer: wake-ups, sum of its per-release eps, "
                "the Theorem-1 composition (Kairouz et al.) at delta_bar of what it released "
                "(the paper's guarantee; under a calibrated rule only a comparison: the "
                "guarantee is privacy/ledger's), the warm start's eps and the total by "
                "sequential composition")
        if a.private:  # the per-release eps of an equal split (the others vary by release)
            if a.calibrated:
                out.attrs["eps_step"] = max(c.eps_release for c in a.calibration)
            else:
                out.attrs["eps_step"] = (K.equal_split(a.eps, int(a.T_agent[0]), a.delta)
                                         if a.allocation == "equal" and a.T_agent is not None
                                         else math.nan)
        if s.clock == "replay":
            out.add("schedule/agent", schedule[keep].astype(np.int64),
                    what="the replayed schedule's kept ticks (agent per wake-up)")
            vectors = int(deg[schedule[keep]].sum())
        else:
            la = np.concatenate([lg["agent"] for lg in logs])
            lt = np.concatenate([lg["time"] for lg in logs])
            lv = [lg["versions"] for lg in logs]
            out.add("schedule/agent", la, what="live: agent of every update, by rank then time")
            out.add("schedule/time", lt, what="live: seconds since the start (per rank clock)")
            out.add("schedule/versions", np.concatenate(lv) if lv else np.zeros(0, np.int64),
                    what="live: for every update, the version of each neighbour's model it "
                    "read (neighbour-id order); replay with algorithms.p2p_cd.replay_log")
            vectors = int(deg[la].sum())
        out.attrs.update(vectors_sent=vectors, puts=int(puts), wakeups=int(per["wakeups"].sum()),
                         eps_theorem1_max=float(per["eps_theorem1"].max()),
                         eps_total_max=float(per["eps_total"].max()),
                         seconds=round(time.perf_counter() - t0, 3), **info)
        return out

    @staticmethod
    def _guarantee(a: C.Settings) -> str:
        if not a.private:
            return "non-private (eps = inf): the models are broadcast without noise"
        cert = "" if a.certified else (" UNCERTIFIED (faithful mode: L0 = 1 without clipping, "
                                       "not DP unless every ||x||_1 <= 1);")
        if a.calibrated:
            rule = a.calibration[0].rule
            sel = ("; a private selection: every candidate's wake-ups, warm start and noised "
                   "validation score are calibrated together to the peer's (eps, delta) "
                   "(scope selection: the totals include the other candidates' planned "
                   "releases; *_all: this configuration's alone)" if a.score_releases else "")
            ws = "; plus the warm start (L2 Laplace, eps_ws)" if a.init == "private_ws" else ""
            return (f"every peer is (eps, delta)-DP for its records (replace-one) over all its "
                    f"releases:{cert} each wake-up broadcasts its model with Laplace noise on "
                    f"its clipped gradient (sensitivity 2 L0 / m_i), the noise calibrated by "
                    f"{rule} ({contract.RULE_TEXT[rule]}){ws}{sel}")
        return (f"the paper's rule: every wake-up releases the peer's model with Laplace noise "
                f"on its clipped "
                f"gradient: (e_k, 0)-DP per release;{cert} a peer's releases compose by "
                f"Theorem 1 (Kairouz et al.) to eps_bar at delta_bar = {a.delta:.4g} "
                "(privacy/theorem1); the accountants below compose the same releases "
                "(basic / advanced / PLD / RDP at the job's delta)"
                + ("; plus the warm start's eps_ws (L2 Laplace output perturbation)"
                   if a.init == "private_ws" else ""))

    def _add_final(self, out: Outcome, final: dict[str, Any], ref: dict[str, Any], d: Data
                   ) -> None:
        out.add("models/theta", final["theta"], what="final models (R, n, p)")
        out.add("models/theta_local", ref["theta_loc"], what="purely local models (baseline, "
                "never released)")
        if "theta_star" in ref:
            out.add("reference/theta_star", ref["theta_star"], solver=ref["solver"],
                    Q_star=ref["Q_star"])
        out.add("per_agent/test_metric", final["metric"], what=final["metric_name"])
        out.add("per_agent/test_metric_local", final["metric_local"], what="purely local models")
        out.add("per_agent/test_metric_trivial", final["metric_trivial"],
                what=final["trivial_name"])
        out.add("per_agent/m", d.m)
        if (d.graph_info or {}).get("kind", "shard") != "shard":  # a graph built for the job
            arrays = graph_arrays(d.W)
            out.add("graph/edges", arrays[EDGES], what="the peers' graph built for the job "
                    "(p2p.graph; attrs graph): pairs i < j (public)")
            out.add("graph/weights", arrays[WEIGHTS], what="W_ij of each edge (1 unless the "
                    "edge list gave weights)")
        if "global" in final:
            g = final["global"]
            out.add("per_agent/test_global_error", g["error"], what=g["name"] + " (R, n): "
                    "each peer's final model on the shard file's global test set "
                    "(evaluation-only)")
            out.add("per_agent/test_global_error_local", g["local"], what="the purely local "
                    "models on the global test set")
            out.attrs.update(test_global_metric=g["name"], test_global_trivial=g["trivial_name"],
                             test_global_error=float(np.mean(g["error"])),
                             test_global_error_local=float(np.mean(g["local"])),
                             test_global_error_trivial=g["trivial"],
                             test_global_error_star=g["star"],
                             test_global_records=g["records"])
        out.attrs.update(metric=final["metric_name"], trivial=final["trivial_name"],
                         test_metric=_nanmean(final["metric"]),
                         test_metric_local=_nanmean(final["metric_local"]),
                         test_metric_trivial=_nanmean(final["metric_trivial"]),
                         test_metric_star=_nanmean(final["metric_star"])
                         if "metric_star" in final else math.nan,
                         Q_star=ref.get("Q_star", math.nan), Q_loc=ref["Q_loc"],
                         Q_zero=ref["Q_zero"], val_metric=final.get("val_metric", math.nan))

    # -- baselines -----------------------------------------------------------------------
    def _run_admm(self, ctx, s, d, full, P, ref, recorder, label, t0) -> Outcome | None:
        comm = ctx.comm
        ev = Evaluator(comm, P, d, np.arange(0), ref, 1)
        if comm.Get_rank() != 0:
            comm.barrier()
            return None
        Pf = self._problem(full, s, P.L_loc)
        rho = ctx.job["p2p.admm_rho"]
        rho = float(np.mean(Pf.graph.W.data)) if rho == "auto" else float(rho)

        u, recs = B.gossip_admm(Pf, ref["theta_loc"], rho, int(ctx.job["p2p.admm_inner"]),
                                int(ctx.job["T"]), int(ctx.job["seed"]),
                                int(ctx.job["record_every"]) or int(ctx.job["T"]),
                                lambda t, u, sent: ev.metrics_all(full, u[None]))
        for r in recs if recorder is not None else ():
            vals = {"Q": np.array([r["Q"]]), "test_metric": r["test_metric"],
                    "vectors_sent": float(r["vectors_sent"])}
            if "Q_star" in ref:
                vals["gap"] = np.array([r["Q"] - ref["Q_star"]])
            recorder.append(int(r["iteration"]), vals)
        comm.barrier()
        final = ev.final_all(full, u[None])
        out = Outcome([], guarantee="non-private baseline (gossip ADMM): no DP claim")
        self._add_final(out, final, ref, d)
        out.attrs.update(rho=rho, admm_inner=int(ctx.job["p2p.admm_inner"]),
                         vectors_sent=4 * int(ctx.job["T"]), simulated="serially on rank 0",
                         seconds=round(time.perf_counter() - t0, 3))
        return out

    def _run_local_dp(self, ctx, rc, s, d, P, ref, recorder, t0) -> Outcome | None:
        comm = ctx.comm
        a = s.algo
        rank, size = comm.Get_rank(), comm.Get_size()
        st = block_starts(P.n, size)
        agents = np.arange(st[rank], st[rank + 1])
        Bx = float(ctx.job["p2p.local_dp_bound"])
        eps = float(rc.eps[0])
        models, ledgers = {}, []
        from ..privacy.release import OwnerRelease
        for i in agents.tolist():
            rel = OwnerRelease(i, a.R, a.calibration[i] if a.calibration else None)
            th = np.empty((a.R, P.p))
            for k, r in enumerate(a.runs):
                Xp, yp, events = B.local_dp_data(d.X[i], d.y[i], eps, Bx, a.seed, i, r)
                th[k] = REF.local_model(P.loss, Xp, yp, float(P.lam[i]))
                if k == 0:  # each record is released once: one release of each per owner
                    for e in events:
                        rel.charge(e)
            models[i] = th
            ledgers.append(rel.ledger)
        ev = Evaluator(comm, P, d, agents, ref, a.R)
        block = type("B", (), {"theta": models, "agents": agents})()
        vals = ev.record(block)
        if recorder is not None and vals is not None:
            recorder.append(0, vals)
        final = ev.final(block)
        gl = comm.gather(ledgers, root=0)
        if rank != 0:
            return None
        out = Outcome(sorted((x for part in gl for x in part), key=lambda x: x.agent),
                      guarantee=f"local DP: every record perturbed once by its owner (features "
                      f"clipped to [-{Bx:g}, {Bx:g}] + Laplace, labels by randomised response), "
                      "eps split equally; nothing else is released")
        self._add_final(out, final, ref, d)
        out.attrs.update(seconds=round(time.perf_counter() - t0, 3))
        return out

    # -- analysis ------------------------------------------------------------------------
    def analyze(self, result: Any, metric: str | None = None) -> str:
        from ..analysis import p2p_report

        return p2p_report.p2p_text(result)

    def table_rows(self, result: Any, metric: str | None = None) -> list[dict[str, Any]]:
        from ..analysis import p2p_report

        return p2p_report.p2p_rows(result)

    def figures(self, result: Any, prefix: Path, metric: str | None = None) -> list[Path]:
        from ..analysis import p2p_report

        return p2p_report.plot_p2p(result, prefix)


#: test records x peers per block of the global test scores (32 MiB of float64)
GLOBAL_BLOCK = 2**22


class Evaluator:
    """Evaluation-only metrics: every rank scores its hosted peers, rank 0 sums in peer order."""

    def __init__(self, comm: MPI.Comm, P: M.Problem, d: Data, agents: np.ndarray,
                 ref: dict[str, Any], R: int) -> None:
        self.comm, self.P, self.d, self.agents, self.ref, self.R = comm, P, d, agents, ref, R
        self.metric_name = ("per-peer test accuracy" if d.task == "binary"
                            else "per-peer test RMSE")
        self.trivial_name = ("majority label of the peer's training records" if d.task ==
                             "binary" else "the peer's training mean (0 on centred targets)")

    def _metric(self, i: int, th: np.ndarray, X=None, y=None) -> np.ndarray:
        X = self.d.Xt[i] if X is None else X
        y = self.d.yt[i] if y is None else y
        if X is None or len(y) == 0:
            return np.full(th.shape[0], np.nan)
        z = X @ th.T
        if self.d.task == "binary":
            return np.mean(np.where(z >= 0, 1.0, -1.0) == y[:, None], axis=0)
        return np.sqrt(np.mean((z - y[:, None]) ** 2, axis=0))

    def _trivial(self, i: int, X=None, y=None, ytr=None) -> float:
        y = self.d.yt[i] if y is None else y
        ytr = self.d.y[i] if ytr is None else ytr
        if y is None or len(y) == 0:
            return math.nan
        if self.d.task == "binary":
            maj = 1.0 if np.mean(ytr > 0) >= 0.5 else -1.0
            return float(np.mean(y == maj))
        return float(np.sqrt(np.mean((y - np.mean(ytr)) ** 2)))

    def global_scores(self, theta: np.ndarray, test: tuple | None) -> dict[str, Any] | None:
        """Every peer's models theta (R, n, p) and its local model scored on the global test
        set `test` (rank 0, evaluation-only): error rate of sign(<theta_i, x>) (0 predicts +1)
        for a binary shard, RMSE for regression; with the trivial baseline, the set's own
        majority class / mean. None without a global test set."""
        if test is None:
            return None
        X, y = test
        binary = self.d.task == "binary"

        def score(th: np.ndarray) -> np.ndarray:  # th (n, p) -> (n,), by blocks of peers
            out = np.empty(th.shape[0])
            step = max(1, GLOBAL_BLOCK // max(1, len(y)))
            for a in range(0, th.shape[0], step):
                Z = X @ th[a:a + step].T
                out[a:a + step] = (np.mean(np.where(Z >= 0, 1.0, -1.0) != y[:, None], axis=0)
                                   if binary else np.sqrt(np.mean((Z - y[:, None]) ** 2, axis=0)))
            return out

        err = np.stack([score(theta[r]) for r in range(theta.shape[0])])
        loc = score(np.asarray(self.ref["theta_loc"]).reshape(self.P.n, self.P.p))
        if binary:
            trivial = float(min(np.mean(y > 0), np.mean(y < 0)))
        else:
            trivial = float(np.sqrt(np.mean((y - np.mean(y)) ** 2)))
        star = self.ref.get("theta_star")  # the non-private optimum Theta*
        star_err = (math.nan if star is None else
                    float(np.mean(score(np.asarray(star).reshape(self.P.n, self.P.p)))))
        return {"error": err, "local": loc, "trivial": trivial, "records": int(len(y)),
                "star": star_err,
                "name": ("error rate on the global test set" if binary
                         else "RMSE on the global test set"),
                "trivial_name": ("the global test set's majority class" if binary
                                 else "the global test set's mean")}

    def _mine(self, theta: dict[int, np.ndarray]) -> dict[int, tuple]:
        P = self.P
        out = {}
        for i in self.agents.tolist():
            th = theta[i].reshape(self.R, P.p)
            lo = M.local_obj(P.loss, self.d.X[i], self.d.y[i], float(P.lam[i]), th)
            out[i] = (th, lo, self._metric(i, th))
        return out

    def _assemble(self, parts: list[dict[int, tuple]]) -> tuple[np.ndarray, np.ndarray,
                                                                  np.ndarray]:
        P = self.P
        theta = np.empty((self.R, P.n, P.p))
        lo = np.empty((P.n, self.R))
        met = np.empty((P.n, self.R))
        for part in parts:
            for i, (th, l_i, mt) in part.items():
                theta[:, i, :], lo[i], met[i] = th, l_i, mt
        return theta, lo, met

    def val_score(self, i: int, th: np.ndarray, clip: float) -> tuple[np.ndarray, float]:
        """Peer i's validation score of its models th (R, p) and the score's sensitivity to one
        validation record (replace-one): the error rate (binary, 1 / m_val) or the mean squared
        error with errors clipped to +-clip (regression, clip^2 / m_val). Lower is better."""
        X, y = self.d.Xv[i], self.d.yv[i]
        z = X @ th.T
        if self.d.task == "binary":
            return np.mean(np.where(z >= 0, 1.0, -1.0) != y[:, None], axis=0), 1.0 / len(y)
        return (np.mean(np.clip(z - y[:, None], -clip, clip) ** 2, axis=0),
                clip * clip / len(y))

    def _val(self, block: Any, release_clip: float | None) -> float:
        """val_metric: the mean over peers of their validation scores of the final models,
        each released by its peer with calibrated Laplace noise (`release_clip`: a private
        selection; its score is the clipped one) or, without a selection, computed
        evaluation-only (clip inf: the plain MSE / error rate)."""
        clip = math.inf if release_clip is None else release_clip
        mine = {}
        for i in self.agents.tolist():
            if self.d.Xv[i] is None or not len(self.d.yv[i]):
                continue
            score, sens = self.val_score(i, block.theta[i].reshape(self.R, self.P.p), clip)
            mine[i] = score if release_clip is None else block.release_score(i, score, sens)
        parts = self.comm.gather(mine, root=0)
        if parts is None:
            return math.nan
        scores = [v for part in parts for _, v in sorted(part.items())]
        return float(np.mean(np.mean(scores, axis=0))) if scores else math.nan

    def _Q(self, theta: np.ndarray, lo: np.ndarray) -> np.ndarray:
        P = self.P
        smooth = P.graph.smooth_term(theta)
        return smooth + P.mu * ((P.deg * P.conf)[:, None] * lo).sum(axis=0)

    def record(self, block: Any) -> dict[str, Any] | None:
        parts = self.comm.gather(self._mine(block.theta), root=0)
        if parts is None:
            return None
        theta, lo, met = self._assemble(parts)
        Q = self._Q(theta, lo)
        with warnings.catch_warnings():  # peers without test records: NaN, not a warning
            warnings.simplefilter("ignore", RuntimeWarning)
            vals: dict[str, Any] = {"Q": Q, "test_metric": np.nanmean(met, axis=0),
                                    "test_metric_min": np.nanmin(met, axis=0),
                                    "test_metric_max": np.nanmax(met, axis=0)}
        if "Q_star" in self.ref:
            vals["gap"] = Q - self.ref["Q_star"]
        return vals

    def final(self, block: Any, release_clip: float | None = None) -> dict[str, Any] | None:
        """The final models' metrics on rank 0; with validation records also val_metric
        (`_val`: released privately when `release_clip` is given)."""
        val = self._val(block, release_clip) if self.d.Xv is not None else None
        parts = self.comm.gather(self._mine(block.theta), root=0)
        star = self.ref.get("theta_star")  # the non-private optimum Theta* (evaluation-only)
        star = None if star is None else np.asarray(star).reshape(self.P.n, self.P.p)
        loc = self.comm.gather({i: (self._metric(i, self.ref["theta_loc"][i][None])[0],
                                    self._trivial(i),
                                    math.nan if star is None else
                                    self._metric(i, star[i][None])[0])
                                for i in self.agents.tolist()}, root=0)
        if parts is None:
            return None
        theta, _, met = self._assemble(parts)
        ml, mt, ms = np.empty(self.P.n), np.empty(self.P.n), np.empty(self.P.n)
        for part in loc:
            for i, (a, b, c) in part.items():
                ml[i], mt[i], ms[i] = a, b, c
        out = {"theta": theta, "metric": met.T, "metric_local": ml, "metric_trivial": mt,
               "metric_name": self.metric_name, "trivial_name": self.trivial_name}
        if star is not None:
            out["metric_star"] = ms
        if val is not None:
            out["val_metric"] = val
        glob = self.global_scores(theta, self.d.test_global)
        if glob is not None:
            out["global"] = glob
        return out

    def metrics_all(self, full: Data, theta: np.ndarray) -> dict[str, Any]:
        met = np.array([self._metric(i, theta[:, i, :], full.Xt[i], full.yt[i])
                        for i in range(self.P.n)])
        return {"test_metric": np.nanmean(met, axis=0)}

    def final_all(self, full: Data, theta: np.ndarray) -> dict[str, Any]:
        n = self.P.n
        met = np.array([self._metric(i, theta[:, i, :], full.Xt[i], full.yt[i])
                        for i in range(n)])
        ml = np.array([self._metric(i, self.ref["theta_loc"][i][None], full.Xt[i],
                                    full.yt[i])[0] for i in range(n)])
        mt = np.array([self._trivial(i, full.Xt[i], full.yt[i], full.y[i]) for i in range(n)])
        out = {"theta": theta, "metric": met.T, "metric_local": ml, "metric_trivial": mt,
               "metric_name": self.metric_name, "trivial_name": self.trivial_name}
        glob = self.global_scores(theta, full.test_global)
        if glob is not None:
            out["global"] = glob
        return out


METHOD = P2P()
