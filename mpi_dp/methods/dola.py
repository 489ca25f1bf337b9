"""Method entry of DP distributed online learning over time-varying graphs (seed 003).

Agents (the shard file's owners, or `owners` groups of them with `pool_owners`) sit on a graph, not
a star: every rank hosts a block of agents, neighbours exchange released vectors over an MPI
dist-graph topology (comm.graph_exchange), and the algorithm (algorithms.dola) streams each agent's
records in rounds, in `dola.passes` passes over each agent's records. Regret is measured against
the offline comparator w* (the exact regularised SVM on all consumed records, evaluation-only) and
against the reference agent's iterate. The base graph is comm.topology's (dola's kinds, or the
spellings shared with p2p: 'shard', 'knn:K', 'erdos_renyi:p', ...), built on rank 0 and broadcast.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar, cast

import numpy as np
import scipy.sparse as sp

from ..algorithms import dola, optimum_cache
from ..algorithms.common import gather_ledgers
from ..comm import graph_exchange
from ..comm import topology as tp
from ..comm.rma import on_root
from ..data import ShardFile
from ..data.shard_graph import read_descriptors, stored_graph
from ..errors import DataError, JobError
from ..jobspec import (
    COUNT,
    INDEX,
    NONNEG,
    OPEN_UNIT,
    POSITIVE,
    POSITIVE_OR_INF,
    PrivacyKeys,
    Section,
    SharedKeys,
    between,
    err,
    key,
)
from ..models import reference
from ..privacy import GAUSSIAN_CALIBRATIONS, rules, tap
from ..privacy.calibration import Calibration
from ..privacy.contract import Contract
from .base import (
    Configured,
    Context,
    Method,
    Outcome,
    Resolved,
    RunHooks,
    Signal,
    available_backend,
    footprint_of,
    ledger_delta,
    owner_plans,
    settings_attrs,
    shard_sizes,
)

_NUM = (int, float)
EVALUATION_ONLY = (
    "every metric is evaluation-only: losses, regret, online_error, spread and sparsity use the "
    "agents' clean iterates (never released), regret also an evaluation-only broadcast of the "
    "reference agent's iterate and w* (solved on all consumed records); test_error uses the "
    "public test set; noise_l1 is the L1 norm of the noise (Alg. 2: alpha J |N|, as it enters "
    "the step)")
L_DATA_TOL = 1e-9
#: dola.sens_mode: the subgradient bound of the Laplace sensitivity, L_data (sound) or the total
#: L_data + lam r (the paper's); `sensitivity_reg` resolves it for the algorithm
SENS_MODES = ("sound", "paper")


@dataclasses.dataclass(frozen=True)
class DolaKeys(Section):
    """The [dola] section of a job (`ctx.job.section(DolaKeys)`)."""

    NAME: ClassVar[str] = "dola"
    graph: str = key((str,), "medium", "base graph: sparse / medium / dense (random geometric, "
                     "mean degree ~4 / 10 / 24 = the paper's T1 / T2 / T3), geometric "
                     "(graph_degree), ring, grid, complete, erdos_renyi (graph_p), from_file "
                     "(graph_file), or a spelling shared with p2p.graph: 'erdos_renyi:p', 'knn:K' "
                     "(on the shard's public /public/agent_descriptors), 'shard' (the shard file's "
                     "stored graph), 'random_geometric[:r]', an edge-list path; 'shard' and "
                     "'knn:K' need one agent per shard owner (no pool_owners); edge weights are "
                     "ignored (Metropolis-Hastings mixing)")
    graph_degree: float = key(_NUM, 4.0, "mean degree of graph = 'geometric'", within=POSITIVE)
    graph_p: float | str = key(_NUM + (str,), "auto", "edge probability of erdos_renyi ('auto': 2 "
                               "ln(m)/m)", within=between(0, 1, lo_open=True))
    graph_file: str = key((str,), "", "edge list 'i j [w]' per line for graph = 'from_file' (w "
                          "ignored)")
    activation: str = key((str,), "hash", "edges on in round t: hash (u(seed, t, i, j) < p_act, "
                          "both ends agree without a message; an edge idle N-1 rounds is forced "
                          "on) or fixed (all)", tp.ACTIVATIONS)
    p_act: float = key(_NUM, 0.5, "activation probability of an edge per round",
                       within=between(0, 1, lo_open=True))
    window: int = key((int,), 10, "N: every edge is on at least once in any N consecutive rounds",
                      within=COUNT)
    weights: str = key((str,), "mh_static", "A_t weights: mh_static 1/(1+max(d_i,d_j)), mh_active "
                       "(active degrees), max_degree 1/(1+d_max)", tp.WEIGHTS)
    exchange: str = key((str,), "allgather", "neighbour exchange: allgather (Neighbor_allgatherv), "
                        "alltoallv (only active edges), rma (one window, PSCW)", graph_exchange.MODES)
    lam: float = key(_NUM, 0.1, "lambda: f = hinge + lam/2 ||w||^2 (0: plain convex)",
                     within=NONNEG)
    radius: float | str = key(_NUM + (str,), "auto", "r of W = {||w|| <= r}: 'auto' = 1/sqrt(lam) "
                              "(the regularised SVM optimum lies inside), 10 when lam = 0; inf: "
                              "no ball", within=POSITIVE_OR_INF)
    step: str = key((str,), "auto", "alpha_t: strong 1/(lam t), convex 1/(2 sqrt t), auto (strong "
                    "if lam > 0 and not sparse)", dola.STEPS)
    batch: int | str = key((int, str), "auto", "h records per agent per round ('auto': 10 for "
                           "minibatch, else 1)", within=COUNT)
    sens_mode: str = key((str,), "sound", "Laplace sensitivity 2 alpha sqrt(n) L / h with L = "
                         "L_data (sound) or L_data + lam r (paper; both valid, sound is tighter)",
                         SENS_MODES)
    gauss_mode: str = key((str,), "per_record", "privacy.calibration = 'paper' only: Alg. 2 noise: "
                          "per_record (Delta sqrt(2 ln(1.25/delta))/eps, the per-record guarantee "
                          "of a single pass), total_T (all T releases via zCDP), paper (J^2 = 4 "
                          "alpha^2 n L^2 T ln(T/delta) ln(1/delta)/eps^2: uncertified)",
                          rules.GAUSS_MODES)
    gauss_calibration: str = key((str,), "auto", "privacy.calibration = 'paper' only: per_record "
                                 "calibration: auto (classical below eps 1, analytic from 1), "
                                 "classical, analytic", GAUSSIAN_CALIBRATIONS)
    delta: float = key(_NUM, 1e-4, "privacy.calibration = 'paper' only: delta of each Alg. 2 "
                       "release (a calibrated rule uses the owner's privacy.delta)",
                       within=OPEN_UNIT)
    rho: float = key(_NUM, 0.0, "lasso weight of the sparse variant (threshold alpha_t rho)",
                     within=NONNEG)
    reg_point: str = key((str,), "mixed", "minibatch regulariser at the mixed point b_t (sound) or "
                         "at the clean w_t (the paper: breaks invariant P, recorded uncertified)",
                         dola.REG_POINTS)
    ref_agent: int = key((int,), 0, "j of the regret R_D (the reference agent's iterate)",
                         within=INDEX)
    regret: str = key((str,), "exact", "exact: broadcast the reference agent's iterate every round "
                      "(evaluation-only) for R_D; own: only R_own (no extra collective)",
                      ("exact", "own"))
    passes: int = key((int,), 1, "passes over each agent's records (>= 1): round t reads pass t // "
                      "ceil(T / passes), the first in the stored order, later ones in a fresh "
                      "seeded permutation, so T may reach passes x the smallest agent's records / "
                      "h; each record is then in `passes` releases and its noise is calibrated to "
                      "(eps, delta) over them (privacy/ledger scope record); w* stays the SVM on "
                      "each consumed record once (the stream's own optimum when passes divides T)",
                      within=COUNT)
    pool_owners: bool = key((bool,), False, "with owners = N: split ALL of the shard file's owners "
                            "into N contiguous groups, one agent streaming each group (the same "
                            "records for every N, as the paper's Table 3)")



@dataclasses.dataclass
class Prepared:
    test: tuple[Any, np.ndarray] | None  # on rank 0
    majority_error: float
    graphs: dict = dataclasses.field(default_factory=dict)
    comparators: dict = dataclasses.field(default_factory=dict)  # (groups, n_used, lam): w*
    # {(groups, n_used): [every consumed record (rank 0; None elsewhere), the lams whose w* is
    # still to solve]}: checked with the settings, w* solved on them by the first configuration
    # that runs (evaluation-only, like the star methods' reference optima: configuration
    # set-up, not job start-up); the records are dropped once no w* needs them
    consumed: dict = dataclasses.field(default_factory=dict)
    sizes: np.ndarray | None = None  # n_i of every shard owner
    # {(groups, n_used): {agent: (X, y)}}: the consumed records of this rank's agents, read once
    # for the comparator and handed to the stream of the first configuration that reads them
    records: dict = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class DolaSettings:
    algo: dola.Settings
    graph: tp.Graph
    groups: tuple[tuple[int, ...], ...]  # shard owners each agent streams, in order
    n_used: tuple[int, ...]  # records each agent consumes
    T_requested: int
    comparator: str


def sensitivity_reg(sens_mode: str, lam: float, radius: float) -> float:
    """What dola.sens_mode adds to L_data in the sensitivity's subgradient bound (the
    algorithm's Settings.L_reg): 0 for 'sound' (the regulariser is data-independent), lam r for
    the paper's total bound (0 without a ball)."""
    if sens_mode not in SENS_MODES:
        raise ValueError(f"sens_mode must be one of {SENS_MODES}, got {sens_mode!r}")
    if sens_mode == "paper":
        return lam * radius if math.isfinite(radius) else 0.0
    return 0.0


def owner_groups(n_owners: int, m: int, pool: bool) -> tuple[tuple[int, ...], ...]:
    """Shard owners of each agent: itself, or contiguous groups covering all owners (pool)."""
    if not pool:
        return tuple((a,) for a in range(m))
    starts = graph_exchange.block_starts(n_owners, m)
    return tuple(tuple(range(int(starts[a]), int(starts[a + 1]))) for a in range(m))


def owner_sizes(ctx: Context) -> np.ndarray:
    """n_i of every shard owner (int64): the runner's (read once per job), else read now
    (collective)."""
    return ctx.sizes if ctx.sizes is not None else shard_sizes(ctx.comm, ctx.shard)


def group_sizes(sizes: np.ndarray, groups: tuple[tuple[int, ...], ...]) -> list[int]:
    """Records of each agent: the sum over its owners."""
    if all(len(g) == 1 for g in groups):
        return sizes[[g[0] for g in groups]].tolist()
    return [int(sizes[list(g)].sum()) for g in groups]


class PooledReader:
    """read(agent, start, stop) over the concatenation of an agent's owners' records; `sizes`
    (n_i of every owner, e.g. `owner_sizes`) saves reading them from the shard file, and
    `cache` ({agent: (X, y)} of records 0..len(y), e.g. what `consumed_records` read) answers a
    read of exactly those records once without the file."""

    def __init__(self, shard: ShardFile, groups: tuple[tuple[int, ...], ...],
                 sizes: np.ndarray | None = None,
                 cache: dict[int, tuple[Any, np.ndarray]] | None = None) -> None:
        self.shard, self.groups, self.sizes = shard, groups, sizes
        self.cache = cache
        self._offsets: dict[int, np.ndarray] = {}

    def offsets(self, a: int) -> np.ndarray:
        """Where each of agent a's owners starts in its concatenation (and the end)."""
        off = self._offsets.get(a)
        if off is None:
            g = self.groups[a]
            n = self.shard.sizes(g) if self.sizes is None else self.sizes[list(g)]
            off = self._offsets[a] = np.concatenate([[0], np.cumsum(n)])
        return off

    def read_many(self, agents: Sequence[int], start: int, stop: int
                  ) -> list[tuple[Any, np.ndarray]]:
        """`self(a, start, stop)` of every agent of `agents` (in that order), read as a block:
        the cached ones first, then a prefix of every agent that streams one owner in one
        `ShardFile.read_agents` (a few large reads), the rest agent by agent."""
        ids = [int(a) for a in agents]
        got: dict[int, tuple[Any, np.ndarray]] = {}
        if self.cache and start == 0:
            for a in ids:
                if a in self.cache and len(self.cache[a][1]) == stop:
                    got[a] = self.cache.pop(a)
        todo = [a for a in ids if a not in got and len(self.groups[a]) == 1]
        if start == 0 and todo:
            n = [min(stop, int(self.offsets(a)[-1])) for a in todo]
            got.update(zip(todo, self.shard.read_agents([self.groups[a][0] for a in todo], n),
                           strict=True))
        return [got[a] if a in got else self(a, start, stop) for a in ids]

    def __call__(self, a: int, start: int, stop: int) -> tuple[Any, np.ndarray]:
        if self.cache and start == 0 and a in self.cache and len(self.cache[a][1]) == stop:
            return self.cache.pop(a)
        Xs, ys = [], []
        off = self.offsets(a)
        for i, owner in enumerate(self.groups[a]):
            lo, hi = max(start, off[i]), min(stop, off[i + 1])
            if lo < hi:  # a prefix through read_agent (the shard file's fast path)
                X, y = (self.shard.read_agent(owner, int(hi - off[i])) if lo == off[i] else
                        self.shard.read_agent_rows(owner, int(lo - off[i]), int(hi - off[i])))
                Xs.append(X)
                ys.append(y)
        if len(Xs) == 1:
            return Xs[0], ys[0]
        X = sp.vstack(Xs, format="csr") if sp.issparse(Xs[0]) else np.concatenate(Xs)
        return X, np.concatenate(ys)


def _stack(shard: ShardFile, parts: list[tuple[Any, np.ndarray]]) -> tuple[Any, np.ndarray]:
    X = sp.vstack([p[0] for p in parts], format="csr") if shard.is_sparse else \
        np.concatenate([p[0] for p in parts])
    return X, np.concatenate([p[1] for p in parts])


def consumed_records(ctx: Context, groups, n_used, sizes: np.ndarray | None = None,
                     keep: dict[int, tuple[Any, np.ndarray]] | None = None
                     ) -> tuple[Any, np.ndarray] | None:
    """Every record the agents consume (agent order) on rank 0, None elsewhere: each rank reads
    its block of agents (collective; read errors agreed), the block a GraphNet hosts, and puts
    each agent's records into `keep` when given (its stream's first read)."""
    comm, shard = ctx.comm, ctx.shard
    st = graph_exchange.block_starts(len(groups), comm.Get_size())
    r = comm.Get_rank()
    read = PooledReader(shard, groups, sizes)

    def mine() -> tuple[Any, np.ndarray] | None:
        ids = range(int(st[r]), int(st[r + 1]))
        if len({n_used[a] for a in ids}) == 1:  # one prefix for the block: one block read
            parts = dict(zip(ids, read.read_many(ids, 0, n_used[ids[0]]), strict=True))
        else:
            parts = {a: read(a, 0, n_used[a]) for a in ids}
        if keep is not None:
            keep.update(parts)
        return _stack(shard, list(parts.values())) if parts else None

    parts = comm.gather(ctx.agree(mine), root=0)
    return _stack(shard, [p for p in parts if p is not None]) if parts is not None else None


def check_records(shard: ShardFile, records: tuple[Any, np.ndarray], path: str) -> None:
    """The data checks of the comparator's records (labels -1/+1, finite features of L2 norm
    <= 1): made with the settings, before the output file is touched."""
    X, y = records
    if not np.all(np.isin(y, (-1.0, 1.0))):
        raise JobError(f"job file {path}: dola trains a linear SVM: labels must be -1/+1, the "
                       f"shard file {shard.path} has {np.unique(y)[:5].tolist()}")
    sq = (np.asarray(X.multiply(X).sum(axis=1)).ravel() if sp.issparse(X)
          else np.einsum("ij,ij->i", X, X))
    if sq.size and not np.all(np.isfinite(sq)):
        raise JobError(f"job file {path}: the shard file {shard.path} holds NaN or inf features")
    if sq.size and np.sqrt(sq.max()) > 1 + L_DATA_TOL:
        raise JobError(f"job file {path}: dola needs records of L2 norm <= 1 (the sensitivity "
                       f"uses L_data = 1); the largest in {shard.path} is {np.sqrt(sq.max()):.4g}"
                       " (prepare the data with rows scaled to norm <= 1, e.g. the diabetes, "
                       "reuters or mnist_parity recipes)")


def comparator_how(lam: float) -> str:
    return ("exact L1-loss SVM by dual coordinate descent" if lam > 0 else
            "none (lam = 0: no exact comparator, regret not recorded)")


class Dola(Method[Prepared, DolaSettings]):
    name = "dola"
    summary = ("DP distributed online learning over time-varying graphs (seed 003): agents on a "
               "graph mix their neighbours' released vectors, step on the hinge loss of one "
               "record (or h) per round and release a noised vector")
    variants = dola.VARIANTS
    variant_help = ("laplace (Alg. 1, output perturbation; default), gaussian (Alg. 2, noise in "
                    "the step), sparse (Alg. 3, mirror descent with soft-thresholding), "
                    "minibatch (Alg. 4, h records per round)")
    reads = ("owners", "sweep.owners", "backend")
    sections = {"dola": DolaKeys.keys()}
    label_variant = True
    key_help = {"T": "rounds (each agent consumes h records per round; at most dola.passes "
                "passes over its records)",
                "eps": "each agent's total for every one of its records: a pass puts each record "
                "in one release and the other releases are post-processing for it (invariant "
                "P, spec §4), so a record's dola.passes releases are calibrated together to "
                "(eps, delta); the plain composition of all T releases is in privacy/ledger's "
                "*_all columns",
                "n": "'all' (dola streams from the start of each shard)",
                "record_every": "rounds between records"}
    default_metric = "regret"
    sweeps = ("dola.rho", "dola.graph")
    paper_rule = ("eps is the eps of each release (one per round; Alg. 2: with dola.delta, by "
                  "gauss_mode), which a single pass gives every record")

    def validate(self, values: dict[str, Any], path: str) -> None:
        if not 0 < values["dola.p_act"] <= 1:
            raise err(path, "dola.p_act", "must be in (0, 1]")
        if values["dola.window"] < 1:
            raise err(path, "dola.window", "must be at least 1")
        if not 0 <= values["dola.lam"] < math.inf:
            raise err(path, "dola.lam", "must be a finite number >= 0")
        r = values["dola.radius"]
        if (isinstance(r, str) and r != "auto") or (not isinstance(r, str) and not r > 0):
            raise err(path, "dola.radius", "must be 'auto' or a positive number (inf: no ball)")
        b = values["dola.batch"]
        if (isinstance(b, str) and b != "auto") or (isinstance(b, int) and b < 1):
            raise err(path, "dola.batch", "must be 'auto' or a positive integer")
        if not 0 < values["dola.delta"] < 1:
            raise err(path, "dola.delta", "must be in (0, 1)")
        if values["dola.rho"] < 0:
            raise err(path, "dola.rho", "must be >= 0")
        if values["dola.graph"] == "from_file" and not values["dola.graph_file"]:
            raise err(path, "dola.graph_file", "graph = 'from_file' needs the edge-list path")
        for name, kinds in (("dola.graph", [values["dola.graph"]]),
                            ("sweep.graph", values.get("sweep.graph") or [])):
            for kind in kinds:
                try:
                    tp.parse_graph_spec(str(kind), legacy=tp.KINDS)
                except ValueError as e:
                    raise err(path, name, str(e)) from None
                if kind in ("shard",) or str(kind).startswith("knn:"):
                    if values["dola.pool_owners"]:
                        raise err(path, name, f"{kind!r} is a graph on the shard file's owners; "
                                  "with pool_owners an agent streams several owners: choose a "
                                  "graph built for the agents (e.g. 'medium', 'erdos_renyi:p')")
        if isinstance(values["dola.passes"], bool) or values["dola.passes"] < 1:
            raise err(path, "dola.passes", "must be an integer >= 1 (1: a single pass)")
        if values["dola.step"] == "strong" and values["dola.lam"] == 0:
            raise err(path, "dola.step", "strong steps 1/(lam t) need lam > 0 (the paper's error: "
                      "the plain hinge is not strongly convex)")
        if values["n"] != "all" or values["sweep.n"]:
            raise err(path, "n", "dola streams each agent's records from the start; leave n = "
                      "'all' and bound the rounds with T")
        if values["privacy.calibration"] != "paper":
            for name, default in (("dola.gauss_mode", "per_record"),
                                  ("dola.gauss_calibration", "auto"), ("dola.delta", 1e-4)):
                if values[name] != default:
                    raise err(path, name, "is an option of the paper's rule (privacy.calibration "
                              f"= 'paper'); under '{values['privacy.calibration']}' the noise is "
                              "calibrated to each record's (eps, privacy.delta): remove it")

    def prepare(self, ctx: Context) -> Prepared:
        shard = ctx.shard

        def check_task() -> None:  # the same on every rank: one agreed message
            if shard.task != "binary":
                raise JobError(f"job file {ctx.job.path}: dola trains a binary linear SVM; the "
                               f"shard file {shard.path} holds a {shard.task} task")

        ctx.agree(check_task)

        def load() -> tuple[Any, np.ndarray] | None:
            return shard.read_test() if ctx.comm.Get_rank() == 0 and shard.has_global_test \
                else None
        test = ctx.agree(load)
        maj = math.nan
        if test is not None:
            maj = float(min(np.mean(test[1] > 0), np.mean(test[1] < 0)))
        prep = Prepared(test, maj, sizes=owner_sizes(ctx))
        j, n_owners = ctx.job, ctx.shard.n_agents
        k = j.section(DolaKeys)
        # every graph the job needs, built on rank 0 and broadcast
        for o in j.swept("owners", j.section(SharedKeys).owners):
            for kind in j.swept("dola.graph", k.graph):
                self._graph(ctx, prep, n_owners if o == "all" else int(o), kind)
        ctx.agree(lambda: self._check_agents(ctx, prep))
        return prep

    def _check_agents(self, ctx: Context, prep: Prepared) -> None:
        """Graphs and record counts of every configuration, before the output is touched (the
        runner has checked the numbers of owners against the shard file)."""
        j, n_owners = ctx.job, ctx.shard.n_agents
        k = j.section(DolaKeys)
        for o in j.swept("owners", j.section(SharedKeys).owners):
            m = n_owners if o == "all" else int(o)
            for kind in j.swept("dola.graph", k.graph):
                self._graph(ctx, prep, m, kind)
            groups = owner_groups(n_owners, m, k.pool_owners)
            assert prep.sizes is not None  # prepare's
            sizes = group_sizes(prep.sizes, groups)
            for variant in j.swept("variant", j.generic.variant):
                h = self._batch(k, variant)
                few = [a for a, n in enumerate(sizes) if n < h]
                if few:
                    raise JobError(f"job file {j.path}: agent(s) {few[:5]} hold fewer than h = "
                                   f"{h} records ({[sizes[a] for a in few[:5]]}) in "
                                   f"{ctx.shard.path}: every agent streams h records per round")

    @staticmethod
    def _batch(k: DolaKeys, variant: str) -> int:
        if k.batch == "auto":
            return 10 if variant == "minibatch" else 1
        return int(k.batch)

    def header(self, ctx: Context, prep: Prepared) -> str:
        j = ctx.job
        k = j.section(DolaKeys)
        graphs = ",".join(j.swept("dola.graph", k.graph))
        return (f"n={ctx.shard.n_features}{' (CSR)' if ctx.shard.is_sparse else ''}; graph "
                f"{graphs}, {k.activation} activation, {k.exchange} exchange")

    def _graph(self, ctx: Context, prep: Prepared, m: int, kind: str) -> tp.Graph:
        """The base graph, built on rank 0 and broadcast (collective on first use of (kind, m):
        `prepare` builds every one a job needs)."""
        if (kind, m) not in prep.graphs:
            j = ctx.job
            k = j.section(DolaKeys)
            p = k.graph_p
            shard = ctx.shard

            def build() -> tp.Graph:
                try:
                    return tp.make_graph(kind, m, j.generic.seed,
                                         degree=float(k.graph_degree),
                                         p=None if p == "auto" else float(p),
                                         path=k.graph_file or None,
                                         descriptors=lambda: read_descriptors(shard),
                                         stored=lambda: stored_graph(shard))
                except (DataError, JobError) as e:  # e.g. not connected, no descriptors
                    raise JobError(f"job file {j.path}: key 'dola.graph' ({kind!r}): {e}"
                                   ) from None

            g = on_root(ctx.comm, build)
            prep.graphs[kind, m] = ctx.comm.bcast(g, root=0)
        return prep.graphs[kind, m]

    def configure(self, ctx: Context, prep: Prepared, rc: Resolved) -> Configured[DolaSettings]:
        """The configuration's settings (graph, agents' owners and records, the comparator's
        records read and checked), its per-record plans and the paper rule with the job's knobs,
        built once; what depends on the contract is set by `run`."""
        j, shard = ctx.job, ctx.shard
        k, g = j.section(DolaKeys), j.generic
        m = rc.N
        variant = rc.variant
        graph = self._graph(ctx, prep, m, rc.config.param("dola.graph", k.graph))
        groups = owner_groups(shard.n_agents, m, k.pool_owners)
        h = self._batch(k, variant)
        assert prep.sizes is not None  # prepare's
        sizes = group_sizes(prep.sizes, groups)
        rounds = min(n // h for n in sizes)  # rounds of one pass
        T = g.T
        passes = int(k.passes)
        if -(-T // passes) > rounds:
            if g.n_beyond_shard != "cap":
                more = -(-T // rounds)
                raise JobError(f"job file {j.path}: key 'T': {T} rounds of h = {h} in "
                               f"{passes} pass(es) need {-(-T // passes) * h} records per agent "
                               f"and pass, but the smallest agent holds {min(sizes)}: set T <= "
                               f"{rounds * passes}, raise dola.passes (T = {T} needs passes >= "
                               f"{more}: each record then enters {more} releases, calibrated "
                               "together), or n_beyond_shard = 'cap' to run the passes in full")
            T = rounds * passes
        lam = float(k.lam)
        step = k.step
        if step == "auto":
            step = "strong" if lam > 0 and variant != "sparse" else "convex"
        r = k.radius
        radius = (1.0 / math.sqrt(lam) if lam > 0 else 10.0) if r == "auto" else float(r)
        n_used = tuple([-(-T // passes) * h] * m)  # one pass: ceil(T / passes) rounds
        if (groups, n_used) not in prep.consumed:  # read and checked now, solved at the run
            records = consumed_records(ctx, groups, n_used, prep.sizes,
                                       prep.records.setdefault((groups, n_used), {}))
            # on_root: rank 0, which holds the records
            on_root(ctx.comm, lambda: check_records(shard, cast("tuple[Any, np.ndarray]", records),
                                                    j.path))
            prep.consumed[groups, n_used] = [records, set()]
        if lam > 0 and (groups, n_used, lam) not in prep.comparators:
            prep.consumed[groups, n_used][1].add(lam)
        if not 0 <= k.ref_agent < m:
            raise JobError(f"job file {j.path}: key 'dola.ref_agent': {k.ref_agent} is "
                           f"not one of the {m} agents")
        algo = dola.Settings(
            variant=variant, T=T, h=h, n_features=shard.n_features, m=m,
            lam=lam, radius=radius, step=step, L_reg=sensitivity_reg(k.sens_mode, lam, radius),
            rho=float(rc.config.param("dola.rho", k.rho)),
            reg_point=k.reg_point, activation=k.activation, p_act=float(k.p_act),
            window=k.window, weights=k.weights, ref_agent=k.ref_agent,
            exact_regret=k.regret == "exact" and lam > 0, seed=g.seed,
            run_ids=ctx.run_ids, record_every=g.record_every, passes=passes,
            backend=available_backend(j.path, j.values["backend"]))
        paper = rules.PerRelease(gauss_mode=k.gauss_mode, gauss_calibration=k.gauss_calibration,
                                 delta=float(k.delta))
        if variant == "gaussian" and j.section(PrivacyKeys).calibration == "paper":
            for e in set(rc.eps):  # calibration errors (e.g. classical at eps >= 1) before running
                rules.gauss_std(paper.gauss_mode, 2 * algo.L_data / h, e, paper.delta, T,
                                alpha=dola.step_size(1, algo), n=algo.n_features, L=algo.L,
                                calibration=paper.gauss_calibration)
        s = DolaSettings(algo, graph, groups, n_used, g.T, comparator_how(lam))
        # per agent, the releases one record is in: one per pass (dola.passes; invariant P makes
        # the others post-processing for it), over the records it consumes
        plans = owner_plans(ctx, rc, n_used, algo.mechanism, passes, scope="record")
        # a round's step alpha_t g (||g|| <= L, h records) against its noise: Laplace
        # sensitivity 2 alpha_t sqrt(d) L / h (L1 from L2), Gaussian 2 alpha_t L / h; every
        # agent releases T times (w_hat averages the rounds)
        rel = (2.0 if variant == "gaussian" else 2.0 * math.sqrt(algo.n_features)) / h
        signal = Signal(tuple([rel] * m), algo.n_features, tuple([T] * m))
        n_records = algo.T // algo.record_every + 2
        return Configured(rc, s, tuple(plans), footprint_of(ctx, n_records, shard.n_features),
                          n_records, self._attrs(prep, rc, s, paper, k.sens_mode), signal, paper)

    @staticmethod
    def _attrs(prep: Prepared, rc: Resolved, s: DolaSettings, paper: rules.PerRelease,
               sens_mode: str) -> dict[str, Any]:
        """The configuration group's attributes known before the run: the settings (with the
        job's sens_mode and the paper rule's knobs under their key names), the graph and its
        mixing constants, the records each agent consumes."""
        a = s.algo
        rows = tp.MixingRows(s.graph, np.arange(0), s.graph.edges, a.weights)
        mix = tp.mixing_constants(a.m, rows.eta, a.window)
        knobs = {k: v for k, v in settings_attrs(a).items() if k != "L_reg"}
        # n: the records each agent consumes (T h; with pool_owners they span several owners)
        return {**knobs, "eps": np.asarray(rc.eps, dtype=np.float64), "sens_mode": sens_mode,
                "gauss_mode": paper.gauss_mode, "gauss_calibration": paper.gauss_calibration,
                "delta": paper.delta, "label": rc.config.label(rc.eps, list(s.n_used)),
                "n": np.array(s.n_used, dtype=np.int64), "owners_per_agent": len(s.groups[0]),
                "T_requested": s.T_requested, "comparator": s.comparator,
                "graph": s.graph.describe(), **{f"mix_{k}": v for k, v in mix.items()},
                "test_error_majority": prep.majority_error,
                "invariant_P": a.invariant_P, "single_pass": a.passes == 1,
                "rounds_per_pass": a.rounds_per_pass,
                "evaluation_only": EVALUATION_ONLY}

    def run(self, ctx: Context, prep: Prepared, c: Configured[DolaSettings], contract: Contract,
            hooks: RunHooks) -> Outcome | None:
        s, rc = c.settings, c.resolved
        a = s.algo
        noises = [contract.noise(i) for i in range(a.m)]
        # certified: the algorithm keeps invariant P and no agent's noise is a paper formula
        # used outside its proof
        certified = a.certified and all(x is not None and x.certified for x in noises)
        hooks.attrs(certified=certified)
        w_star = self._w_star(ctx, prep, s)
        net = ctx.agree(lambda: graph_exchange.GraphNet(
            ctx.comm, s.graph, ctx.job.section(DolaKeys).exchange, (a.runs, a.n_features),
            two_hop=a.weights == "mh_active"))
        # no try/finally: freeing the window is collective, and a rank that raised must reach the
        # CLI's Abort rather than wait in Win.Free for ranks still computing
        reader = dola.pass_reader(a, PooledReader(ctx.shard, s.groups, prep.sizes,
                                                  prep.records.get((s.groups, s.n_used))))
        block = dola.Block(a, contract, s.graph, net,
                           dola.Stream(net.agents, a.h, a.T, a.n_features, reader,
                                       backend_name=a.backend), w_star)
        t0 = time.perf_counter()
        hooks.start(a.T, "round")
        # checkpoints (hooks.checkpoint, in drive): every agent's state keyed by agent id, so
        # any rank count resumes it
        t_resumed = block.restore(hooks.saved_state())
        if t_resumed is not None:
            hooks.info(f"resumed from its checkpoint at round={t_resumed}")
        ev = dola.Evaluation(prep.test)
        dola.drive(block, ev, hooks=hooks)
        ledgers = gather_ledgers(net, block.ledgers, ledger_delta(ctx, rc))
        exch = net.gather_objects((net.exchange_seconds, net.exchanges))
        net.free()
        final = ev.final()
        if not net.is_root or final is None:
            return None
        assert ledgers is not None  # the root's
        live = [x for x in noises if x is not None]
        paper = contract.rule.paper
        knobs = c.paper_rule
        assert isinstance(knobs, rules.PerRelease)  # configure's
        out = Outcome(ledgers, guarantee=self._guarantee(a, contract, knobs, certified))
        out.add("models/w_hat", final["w_hat"], what="(1/T) sum_t w_bar_t, the online-to-batch "
                "model (evaluation: built from clean iterates)")
        out.add("models/w_bar", final["w_bar"], what="network mean of the final clean iterates")
        if w_star is not None:
            out.add("reference/w_star", w_star, solver=s.comparator)
            if prep.test is not None and tap.evaluating():
                err = dola.test_error(prep.test[0], prep.test[1], np.atleast_2d(w_star))
                out.add("reference/test_error_star", float(err[0]), evaluation_only=True,
                        what="error of w_star (the non-private optimum of the same objective) "
                        "on the global test set")
        out.add("graph/edges", s.graph.edges.astype(np.int64))
        if s.graph.positions is not None:
            out.add("graph/positions", s.graph.positions)
        eps_rel, delta_rec = self._per_release(a, live)
        out.attrs.update(
            eps_per_release=eps_rel,
            eps_per_record=self._per_record(a, live, paper, eps_rel)
            if certified and a.invariant_P else math.nan,
            delta_per_record=(delta_rec if a.passes == 1 or not delta_rec else
                              a.passes * delta_rec if paper
                              else max(x.plan.delta for x in live)),
            exchange_seconds=float(max(e[0] for e in exch)), exchanges=int(max(e[1] for e in exch)),
            seconds=round(time.perf_counter() - t0, 3))
        return out

    @staticmethod
    def _w_star(ctx: Context, prep: Prepared, s: DolaSettings) -> np.ndarray | None:
        """Collective: the comparator w* of s's consumed records (solved once per records and
        lam on rank 0, broadcast; None: lam = 0)."""
        lam = s.algo.lam
        if lam <= 0:
            return None
        key = (s.groups, s.n_used, lam)
        if key not in prep.comparators:
            held = prep.consumed[s.groups, s.n_used]
            records: tuple[Any, np.ndarray] = held[0]  # (X, y) on rank 0, where on_root runs
            w = on_root(ctx.comm, lambda: optimum_cache.svm_comparator(
                *records, lam, lambda: reference.svm_dual_cd(*records, lam)))
            prep.comparators[key] = ctx.comm.bcast(w, root=0)
            held[1].discard(lam)
            if not held[1]:
                held[0] = None
        return prep.comparators[key]

    @staticmethod
    def _per_record(a: dola.Settings, noises: list[Calibration], paper: bool, eps_rel: float
                    ) -> float:
        """What a record's `passes` releases compose to: one release's eps (a single pass), the
        calibrated target (the largest agent eps) or, under the paper's rule, basic
        composition (passes x eps per release; privacy/ledger has the tight totals). The
        delta beside it (delta_per_record) likewise."""
        if a.passes == 1:
            return eps_rel
        return a.passes * eps_rel if paper else max(x.plan.eps for x in noises)

    @staticmethod
    def _per_release(a: dola.Settings, noises: list[Calibration]) -> tuple[float, float]:
        """(eps, delta) of one release (the largest over agents): what each agent's noise
        states for one release (the job's eps under the paper rule, else what the calibrated
        noise gives at the agent's delta), and the delta a Gaussian release is stated at."""
        eps = max(x.eps_release for x in noises)
        delta = max(x.gaussian_delta for x in noises) if a.variant == "gaussian" else 0.0
        return eps, delta

    @staticmethod
    def _guarantee(a: dola.Settings, contract: Contract, paper_rule: rules.PerRelease,
                   certified: bool) -> str:
        cert = "" if certified else " UNCERTIFIED mode (see the settings): not DP as stated;"
        if not contract.rule.paper:
            rule = contract.rule.name
            mech = "Gaussian noise in the step" if a.variant == "gaussian" else "Laplace"
            if a.passes > 1:
                return (f"each agent's records are (eps, delta)-DP each (replace-one):{cert} "
                        f"{a.passes} passes put every record in exactly {a.passes} releases "
                        "(one per pass) and, by invariant P, the other releases are "
                        "post-processing of released vectors and other records, so a "
                        f"record's guarantee composes those {a.passes} releases ({mech}, "
                        f"calibrated together by {rule}; scope record); the *_all columns "
                        "compose all T releases (valid, very loose)")
            return (f"each agent's records are (eps, delta)-DP each (replace-one):{cert} a single "
                    "pass puts every record in exactly one release and, by invariant P, later "
                    "releases are post-processing of released vectors and other records, so one "
                    f"release ({mech}, calibrated by {rule}) is what a record's guarantee "
                    "composes (scope record); the *_all columns compose all T releases "
                    "(valid, very loose for a single pass)")
        per = (f"(eps, {paper_rule.delta:g})-DP (Gaussian, {paper_rule.gauss_mode})"
               if a.variant == "gaussian" else "eps-DP (Laplace)")
        if a.passes > 1:
            return (f"the paper's rule: per release {per} for the record(s) of that round;"
                    f"{cert} {a.passes} passes + invariant P: every record is in exactly "
                    f"{a.passes} releases, which its guarantee composes (privacy/ledger's "
                    "totals of scope record; attrs eps_per_record: their basic composition); "
                    "the *_all columns compose all T releases of an agent (valid, very loose)")
        return (f"the paper's rule: per release {per} for the record(s) of that round;{cert} "
                "single pass + invariant P: every record is in exactly one release, so each "
                "record gets the per-release guarantee (attrs eps_per_record, the totals of "
                "scope record); the *_all columns compose all T releases of an agent (valid, "
                "very loose for a single pass)")

    def analyze(self, result: Any, metric: str | None = None) -> str:
        from ..analysis import dola_report

        return dola_report.dola_text(result, metric or self.default_metric)

    def table_rows(self, result: Any, metric: str | None = None) -> list[dict[str, Any]]:
        from ..analysis import dola_report

        return dola_report.dola_rows(result)

    def figures(self, result: Any, prefix: Path, metric: str | None = None) -> list[Path]:
        from ..analysis import dola_report

        return dola_report.plot_dola(result, prefix)


METHOD = Dola()
