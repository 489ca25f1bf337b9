"""Drivers of personalised P2P coordinate descent (seed 004) and its baselines under MPI.

Every rank hosts a block of peers (comm.graph_exchange.block_starts). For one configuration:

    P = hosted_problem(...)           objective (2) with this rank's peers' records
    ref = reference(...)              evaluation-only: local models, Q of the baselines, Theta*, Q*
    run_cd(...)                       Theta(0) (zero, local, private warm start), the peers'
                                      mailboxes (comm.rma), the wake-ups
                                      (coordinate_descent.replay in conflict-free rounds, or
                                      coordinate_descent.live in wall time) with
                                      records, progress and checkpoints, then the final scores
    run_admm(...) / run_local_dp(...) the baselines (gossip ADMM simulated on rank 0; local DP)

The math is in coordinate_descent / baselines (and objective); the evaluation-only sums in
evaluation.
A driver returns what the method entry writes into its outcome, on rank 0 (None elsewhere).
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import numpy as np
from mpi4py import MPI

from ..agent_graph import Graph
from ..algorithms.hooks import RunHooks
from ..comm import rma
from ..comm.agree import collective
from ..comm.graph_exchange import block_starts
from ..comm.rma import on_root
from ..privacy import Ledger
from ..privacy.contract import Contract
from ..privacy.release import OwnerRelease, row_generator
from . import baselines, coordinate_descent, objective, reference_cache
from .evaluation import Evaluator, HostedModels
from .peer_data import Data
from .reference import local_model, local_models_of, mp_solution, theta_star, theta_star_petsc_dist


@dataclasses.dataclass(frozen=True)
class Objective:
    """Objective (2) of a configuration: what builds its Problem from a shard file's Data."""

    loss: str
    mu: float
    lam: tuple[float, ...]
    smooth: str  # L_loc from the public row-norm bound ('bound') or the data ('data')

    def problem(self, d: Data, L_loc: np.ndarray | None = None) -> objective.Problem:
        """The Problem of d's records (where loaded); `L_loc`: every peer's constant instead of
        the one computed here (data mode: gathered from the ranks hosting the peers)."""
        if d.graph is None:
            d.graph = Graph.from_weights(d.W, symmetric=True)  # read_graph made W so
        P = objective.make_problem(d.graph, d.X, d.y, self.loss, self.mu, np.asarray(self.lam), m=d.m,
                                   smooth=self.smooth, row_norm=d.row_norm)
        if L_loc is not None:
            P = dataclasses.replace(P, L_loc=np.array(L_loc, dtype=np.float64))
        return P


def hosted_problem(comm: MPI.Comm, obj: Objective, d: Data) -> objective.Problem:
    """Collective: the Problem of this rank's peers; in data mode alpha_i of the hosted peers
    comes from their data, and kappa needs every peer's, gathered."""
    P = obj.problem(d)
    if obj.smooth == "data":
        mine = [i for i in range(P.n) if d.X[i] is not None]
        got = comm.allgather({i: float(P.L_loc[i]) for i in mine})
        L_all = np.empty(P.n)
        for part in got:
            for i, v in part.items():
                L_all[i] = v
        P = obj.problem(d, L_all)
    return P


def hosted(comm: MPI.Comm, n: int) -> np.ndarray:
    """The peers this rank hosts (a block of the peer ids)."""
    st = block_starts(n, comm.Get_size())
    rank = comm.Get_rank()
    return np.arange(st[rank], st[rank + 1])


# -- the evaluation-only reference ------------------------------------------------------------
def _ref_key(comm: MPI.Comm, P: objective.Problem, d: Data, full: Data | None, what: dict[str, str]
             ) -> str | None:
    """Collective: the cache key of a reference (reference_cache) on rank 0 (None elsewhere):
    every peer's records digested by the rank hosting it, gathered in peer order (the same key
    on any rank count), with rank 0's full copy where the solve reads it."""
    st = block_starts(P.n, comm.Get_size())
    r = comm.Get_rank()
    mine = [reference_cache.peer_digest(d.X[i], d.y[i]) for i in range(int(st[r]), int(st[r + 1]))]
    parts = comm.gather(mine, root=0)
    if parts is None:
        return None
    W = P.graph.W
    arrays = [("W.indptr", W.indptr), ("W.indices", W.indices), ("W.data", W.data),
              ("m", P.m), ("lam", P.lam), ("conf", P.conf), ("deg", P.deg),
              ("L_loc", P.L_loc), ("mu", np.float64(P.mu))]
    full_peers = None if full is None else [reference_cache.peer_digest(full.X[i], full.y[i])
                                            for i in range(P.n)]
    return reference_cache.make_key({**what, "loss": P.loss, "n": str(P.n), "p": str(P.p)}, arrays,
                                    [b for part in parts for b in part], full_peers)


def _expect(P: objective.Problem, local: bool, star: bool) -> dict[str, tuple[int, ...] | None]:
    """The values of a reference (reference_cache.load checks an entry against them)."""
    out: dict[str, tuple[int, ...] | None] = {}
    if local:
        out.update(theta_loc=(P.n, P.p), Q_loc=None, Q_zero=None)
    if star:
        out.update(theta_star=(P.n, P.p), Q_star=None, solver=None)
    return out


def _cached(comm: MPI.Comm, cache: Path | None, P: objective.Problem, d: Data, full: Data | None,
            what: dict[str, str], expect: dict[str, tuple[int, ...] | None],
            compute: Callable[[], dict[str, Any]], log: Callable[[str], None] | None
            ) -> dict[str, Any]:
    """Collective: compute() (the same dict on every rank), or its entry in the reference
    cache `cache` (None: no cache) read on rank 0 and broadcast; a computed value is stored."""
    if cache is None:
        return compute()
    key = _ref_key(comm, P, d, full, what)
    got = comm.bcast(on_root(comm, lambda: reference_cache.load(cache, cast(str, key), expect)),
                     root=0)  # on_root: rank 0, which holds the key
    if got is not None:
        if log is not None and key is not None:  # rank 0 holds the key
            log(f"evaluation-only reference read from the cache ({cache}/{key[:12]}...)")
        return got
    ref = compute()
    if comm.Get_rank() == 0:
        assert key is not None
        reference_cache.store(cache, key, ref)
    return ref


def reference(comm: MPI.Comm, obj: Objective, P: objective.Problem, d: Data, full: Data | None,
              solver: str, local: bool = True, cache: Path | None = None,
              log: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Collective, evaluation-only, the same on every rank: the local models and the baselines'
    Q (theta_loc, Q_loc, Q_zero: `local_reference`) unless not `local`, and Theta* and Q* by
    `solver`: 'scipy' or 'petsc' on rank 0 from every peer's records (`full`), 'petsc_dist'
    over every rank (each with its own peers' rows), 'none' nothing. Without the local models
    (a run that does not start from them) `complete_reference` adds them after the rounds.
    `cache`: the reference cache's folder (reference_cache; None: always computed)."""

    def compute() -> dict[str, Any]:
        ref = comm.bcast(local_reference(comm, obj, P, d, full, solver, local), root=0)
        if solver == "petsc_dist":  # KSP over every rank, each with its own peers' rows
            th, q = collective(comm, lambda: theta_star_petsc_dist(comm, P))
            ref.update(theta_star=th, Q_star=float(q),
                       solver=f"PETSc KSP distributed over {comm.Get_size()} rank(s)")
        return ref

    star = solver != "none"
    if not (local or star):
        return compute()  # nothing to solve
    what = {"kind": "reference", "local": str(bool(local)), "solver": solver,
            # the distributed KSP's preconditioner (block Jacobi per rank) depends on the ranks
            "ranks": str(comm.Get_size()) if solver == "petsc_dist" else "any",
            "petsc4py": _petsc_version() if solver in ("petsc", "petsc_dist") else ""}
    return _cached(comm, cache, P, d, full if solver in ("scipy", "petsc") else None, what,
                   _expect(P, local, star), compute, log)


def _petsc_version() -> str:
    import importlib.metadata

    try:
        return importlib.metadata.version("petsc4py")
    except importlib.metadata.PackageNotFoundError:
        return "absent"


def complete_reference(comm: MPI.Comm, P: objective.Problem, d: Data, ref: dict[str, Any],
                       cache: Path | None = None) -> None:
    """Collective: `ref` of a run that did not need the local models before its rounds,
    completed in place with them (theta_loc, Q_loc, Q_zero); `cache` as in `reference`."""
    ref.update(_cached(comm, cache, P, d, None, {"kind": "local"}, _expect(P, True, False),
                       lambda: comm.bcast(local_reference(comm, None, P, d, None, "none"),
                                          root=0), None))


def local_reference(comm: MPI.Comm, obj: Objective | None, P: objective.Problem, d: Data,
                    full: Data | None, solver: str, local: bool = True
                    ) -> dict[str, Any] | None:
    """Collective, evaluation-only; the answer on rank 0 (None elsewhere): the local models
    and the baselines' Q (each rank solves and scores its own peers, rank 0 assembles them
    in peer order: the numbers of one rank doing it all) and, for 'scipy' or 'petsc', Theta*
    and Q* on rank 0 from every peer's records. Without `local`: only the latter (solver
    'none' or 'petsc_dist': nothing; the local models come later)."""
    if not local:
        if solver in ("scipy", "petsc"):
            raise ValueError("Theta* by L-BFGS starts from the local models")
        return on_root(comm, dict)
    st = block_starts(P.n, comm.Get_size())
    r = comm.Get_rank()
    agents = range(int(st[r]), int(st[r + 1]))

    def local_models() -> tuple[np.ndarray, list, list]:
        th = local_models_of(P.loss, [d.X[i] for i in agents], [d.y[i] for i in agents],
                                 P.lam[int(st[r]):int(st[r + 1])], P.p)
        full_th = np.zeros((1, P.n, P.p))
        full_th[0, agents.start:agents.stop] = th
        return (th, P.loss_terms(full_th, agents),
                P.loss_terms(np.zeros((1, P.n, P.p)), agents))

    parts = comm.gather(collective(comm, local_models), root=0)

    def assemble() -> dict[str, Any]:
        assert parts is not None
        theta_loc = np.concatenate([th for th, _, _ in parts if len(th)])
        out: dict[str, Any] = {"theta_loc": theta_loc}
        if solver in ("scipy", "petsc"):
            assert full is not None and obj is not None
            Pf = obj.problem(full, P.L_loc)
            th, q = theta_star(Pf, solver=solver, x0=theta_loc.ravel())
            out.update(theta_star=th, Q_star=float(q), solver=solver)
        out["Q_loc"] = float(P.combine(theta_loc[None], [t for _, lt, _ in parts
                                                         for t in lt])[0])
        out["Q_zero"] = float(P.combine(np.zeros((1, P.n, P.p)), [t for _, _, zt in parts
                                                                   for t in zt])[0])
        return out

    return on_root(comm, assemble)


# -- coordinate descent -------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class CDRun:
    """What a coordinate-descent configuration gives its outcome (rank 0)."""

    final: dict[str, Any]  # Evaluator.final: the final models and their scores
    report: dict[int, dict[str, float]]  # coordinate_descent.theorem1_report of every peer
    ledgers: list[Ledger]  # every peer's, in peer order
    logs: list | None  # live: every rank's log (coordinate_descent.live); replay: None per rank
    schedule: np.ndarray  # the global schedule and its kept ticks
    keep: np.ndarray
    deg: np.ndarray  # |N_i|: p-vectors a wake-up of peer i sends
    puts: int  # mailbox puts of the whole configuration (a resumed one's included)
    info: dict[str, Any]  # what the start released (the private warm start)

    def theorem1(self, a: coordinate_descent.Settings) -> np.ndarray:
        """Per peer: wake-ups, sum of its per-release eps, the Theorem-1 composition at
        delta_bar of what it released, the warm start's eps, the total by sequential
        composition, delta_bar and its largest clipped share."""
        n = len(self.report)
        per = np.zeros(n, dtype=[("agent", "i8"), ("wakeups", "i8"), ("sum_e", "f8"),
                                 ("eps_theorem1", "f8"), ("eps_ws", "f8"), ("eps_total", "f8"),
                                 ("delta_bar", "f8"), ("clip_fraction", "f8")])
        ws = a.eps_ws if a.init == "private_ws" else 0.0
        for i in range(n):
            r = self.report[i]
            per[i] = (i, r["wakeups"], r["sum_e"], r["eps_theorem1"], ws,
                      r["eps_theorem1"] + ws, a.delta if a.private else 0.0, r["clip_fraction"])
        return per

    def schedule_arrays(self, live: bool) -> tuple[list[tuple[str, Any, dict[str, Any]]], int]:
        """The schedule that ran as datasets (path, data, attrs), and the p-vectors sent:
        replay, the kept ticks; live, every rank's log (agent, time, neighbour versions read)."""
        if not live:
            vectors = int(self.deg[self.schedule[self.keep]].sum())
            return [("schedule/agent", self.schedule[self.keep].astype(np.int64),
                     {"what": "the replayed schedule's kept ticks (agent per wake-up)"})], vectors
        logs = self.logs or []
        la = np.concatenate([lg["agent"] for lg in logs])
        lt = np.concatenate([lg["time"] for lg in logs])
        lv = [lg["versions"] for lg in logs]
        return [("schedule/agent", la, {"what": "live: agent of every update, by rank then time"}),
                ("schedule/time", lt, {"what": "live: seconds since the start (per rank clock)"}),
                ("schedule/versions", np.concatenate(lv) if lv else np.zeros(0, np.int64),
                 {"what": "live: for every update, the version of each neighbour's model it read "
                  "(neighbour-id order); replay with mpi_dp.p2p.coordinate_descent.replay_log"})], \
            int(self.deg[la].sum())


def theta0(comm: MPI.Comm, a: coordinate_descent.Settings, d: Data, P: objective.Problem,
           ref: dict[str, Any], agents: np.ndarray, release: dict[int, OwnerRelease]
           ) -> tuple[dict[int, np.ndarray], dict[str, Any]]:
    """Collective: Theta(0) of the hosted peers and what the warm start released (through each
    peer's release path: charged, drawn from its 'warm_start' streams, shown to the tap)."""
    R, p = a.R, P.p
    info: dict[str, Any] = {}
    if a.init == "zero":
        return {int(i): np.zeros((R, p)) for i in agents}, info
    if a.init == "local":
        return {int(i): np.broadcast_to(ref["theta_loc"][i], (R, p)).copy()
                for i in agents}, info
    # private warm start: each hosted peer releases its perturbed local model ...
    assert a.lam_ws is not None  # set for init = private_ws
    noisy = {}
    for i in agents.tolist():
        loc = local_model(P.loss, d.X[i], d.y[i], float(a.lam_ws[i]))
        sens = coordinate_descent.warm_start_sensitivity(a.row_norm, int(d.m[i]),
                                                         float(a.lam_ws[i]))
        out = np.empty((R, p))

        def draw(streams: Any, loc: np.ndarray = loc, sens: float = sens,
                 out: np.ndarray = out) -> None:
            for k in range(R):
                out[k] = loc + coordinate_descent.l2_laplace(p, sens / a.eps_ws,
                                                             row_generator(streams, k))

        release[i].fused(coordinate_descent.warm_start_event(a.eps_ws), draw, out,
                         purpose="warm_start")
        noisy[i] = out
    # ... every rank receives every release (a broadcast), then model propagation
    allrel: dict[int, np.ndarray] = {}
    for part in comm.allgather(noisy):
        allrel.update(part)
    tl = np.stack([allrel[i] for i in range(P.n)], axis=1)  # (R, n, p)
    assert a.mu_ws is not None  # set for init = private_ws
    Pmp = dataclasses.replace(P, mu=a.mu_ws)  # a new Problem: its constants at mu_ws
    out = comm.bcast(on_root(comm, lambda: np.stack(
        [mp_solution(Pmp, tl[r]) for r in range(R)])), root=0)  # solved once
    info["warm_start"] = "output perturbation (L2 Laplace) + model propagation solved exactly"
    return {int(i): out[:, int(i), :].copy() for i in agents}, info


def run_cd(comm: MPI.Comm, P: objective.Problem, d: Data, a: coordinate_descent.Settings,
           contract: Contract, ref: dict[str, Any], hooks: RunHooks, clock: str = "replay", tau: float = 0.0,
           wall_budget: float = 3600.0, val_clip: float | None = None,
           ref_cache: Path | None = None) -> CDRun | None:
    """Collective: one configuration of Algorithm 1 / 2 on this rank's peers. `clock` replay
    runs the seeded schedule in conflict-free rounds and checkpoints after a record when the
    hooks' recorder says one is due (a saved state resumes on any rank count); live runs Poisson
    clocks (`tau`, `wall_budget` seconds). Records Q, the test metric and the p-vectors sent
    (`hooks`: records, progress and checkpoints); `ref` lacking the local models is completed
    after the rounds (`complete_reference`); `val_clip`: a private selection's validation score
    bound (None: no selection); `ref_cache`: the reference cache's folder (`reference`)."""
    rank, size = comm.Get_rank(), comm.Get_size()
    st = block_starts(P.n, size)
    agents = np.arange(st[rank], st[rank + 1])
    schedule = coordinate_descent.global_schedule(a.seed, P.n, a.T)
    budgets = coordinate_descent.agent_budgets(a, P, schedule, contract)
    release = coordinate_descent.release_paths(contract, agents, a,
                                               {int(i): len(budgets[int(i)]) for i in agents})
    start_models, info = theta0(comm, a, d, P, ref, agents, release)
    block = coordinate_descent.Block(P, agents, a, contract, budgets, start_models, release)
    ev = Evaluator(comm, P, d, agents, ref, a.R)
    keep = coordinate_descent.effective_ticks(schedule, P.n, a.T_agent)
    replay = clock == "replay"
    rounds = coordinate_descent.cut_rounds(schedule, keep, P.graph, a.record_every) if replay else None
    # checkpoints: replay only (a live configuration runs in wall time and restarts from its
    # start on resume); the peers' states are keyed by peer id: any rank count resumes
    saved = comm.bcast(hooks.saved_state() if replay else None, root=0)
    puts0 = 0  # puts before the checkpoint, less the resumed re-posts (one per edge slot)
    if saved is not None and rounds is not None:
        block.restore(saved["peers"])
        puts0 = saved["puts"] - P.graph.W.nnz
        hooks.info(f"resumed from its checkpoint at tick {rounds.record_at[saved['round']]} "
                   f"({rounds.starts[saved['round'] + 1]}/{len(keep)} wake-ups)")
    boxes = collective(comm, lambda: rma.Mailboxes(comm, P.graph.W, a.R * P.p, st))
    epoch = contextlib.ExitStack()
    if rounds is not None:  # replay: one Lock_all epoch from the initial posts on (barriers
        epoch.enter_context(boxes.rounds())  # order every read after the writes it sees)
    coordinate_descent.post_initial(block, boxes)
    comm.Barrier()
    bar = hooks.start(len(keep), "wake-up")
    deg = np.diff(P.graph.W.indptr)
    sent_cum = np.cumsum(deg[schedule[keep]])

    def record(t: int) -> None:
        done = int(np.searchsorted(keep, t))  # kept ticks < t
        vals = ev.record(block)
        if vals is not None:
            vals["vectors_sent"] = float(sent_cum[done - 1]) if done else 0.0
            hooks.record(t, vals)
        rma.polite_barrier(comm)  # the others nap while rank 0 sums Q and writes

    def checkpoint(r: int) -> None:
        """Collective, after round r's record: every peer's state when rank 0's recorder
        says a checkpoint is due (not at the last round)."""
        assert rounds is not None
        if r >= rounds.count - 1:
            return

        def state() -> dict[str, Any] | None:  # collective: every peer's state on rank 0
            parts = comm.gather(block.state(), root=0)
            puts = comm.reduce(boxes.puts, root=0)
            if parts is None:
                return None
            assert puts is not None  # rank 0, as parts
            return {"round": r, "puts": puts + puts0,
                    "peers": {i: v for part in parts for i, v in part.items()}}

        hooks.checkpoint(state, comm)

    if saved is None:
        record(0)
    log = None
    if rounds is not None:
        start = 0 if saved is None else saved["round"] + 1
        with epoch:  # the rounds exclude readers from writers: no locks needed
            coordinate_descent.replay(block, boxes, rounds, comm.Barrier, record, bar.update, checkpoint,
                                      start, comm.Ibarrier if size > 1 else None)
    else:
        log = coordinate_descent.live(block, boxes, tau, wall_budget, boxes.poll, bar.update)
        req = comm.Ibarrier()  # idle ranks sleep instead of spinning in a barrier
        while not req.Test():
            boxes.poll()
            time.sleep(1e-3)
    record(a.T)
    puts = comm.reduce(boxes.puts, root=0)
    logs = comm.gather(log, root=0)
    rep = comm.gather(coordinate_descent.theorem1_report(block, a), root=0)
    if "theta_loc" not in ref:  # the local models, evaluation-only, after the rounds
        complete_reference(comm, P, d, ref, ref_cache)
    val = ev.validation(block, val_clip)  # a private selection's score is a release
    final = ev.final(block, val)
    ledgers = comm.gather([block.ledgers[int(i)] for i in agents], root=0)
    boxes.free()
    if rank != 0:
        return None
    assert final is not None and rep is not None and ledgers is not None and puts is not None
    report: dict[int, dict[str, float]] = {}
    for part in rep:
        report.update(part)
    return CDRun(final, report, sorted((led for part in ledgers for led in part),
                                       key=lambda x: x.agent),
                 logs, schedule, keep, deg, int(puts + puts0), info)


# -- baselines ---------------------------------------------------------------------------------
def run_admm(comm: MPI.Comm, obj: Objective, P: objective.Problem, d: Data, full: Data | None,
             ref: dict[str, Any], hooks: RunHooks, rho: Any, inner: int, T: int, seed: int,
             record_every: int) -> tuple[dict[str, Any], float] | None:
    """Collective: the gossip-ADMM baseline (baselines.gossip_admm, non-private), simulated
    serially on rank 0 from every peer's records (`full`) and the local models; records Q and
    the mean test metric. Returns (the final scores, rho: 'auto' = the mean positive W_ij) on
    rank 0."""
    ev = Evaluator(comm, P, d, np.arange(0), ref, 1)
    if comm.Get_rank() != 0:
        comm.barrier()
        return None
    assert full is not None
    Pf = obj.problem(full, P.L_loc)
    rho = float(np.mean(Pf.graph.W.data)) if rho == "auto" else float(rho)
    u, recs = baselines.gossip_admm(Pf, ref["theta_loc"], rho, inner, T, seed, record_every,
                                    lambda t, u, sent: ev.metrics_all(full, u[None]))
    for r in recs if hooks.recording else ():
        vals = {"Q": np.array([r["Q"]]), "test_metric": r["test_metric"],
                "vectors_sent": float(r["vectors_sent"])}
        if "Q_star" in ref:
            vals["gap"] = np.array([r["Q"] - ref["Q_star"]])
        hooks.record(int(r["iteration"]), vals)
    comm.barrier()
    return ev.final_all(full, u[None]), rho


def run_local_dp(comm: MPI.Comm, P: objective.Problem, d: Data, a: coordinate_descent.Settings,
                 contract: Contract, eps: float, bound: float, ref: dict[str, Any],
                 hooks: RunHooks) -> tuple[dict[str, Any], list[Ledger]] | None:
    """Collective: the local-DP baseline: every hosted peer perturbs its records once
    (baselines.local_dp_data: features clipped to [-bound, bound] + Laplace, labels by
    randomised response, at `eps`) through its release path (the events charged first, the
    draws from its 'local_dp' streams) and trains its purely local model on them, per run.
    Returns (the final scores, every peer's ledger in peer order) on rank 0."""
    agents = hosted(comm, P.n)
    models, ledgers = {}, []
    for i in agents.tolist():
        rel = contract.owner(i)
        th = np.empty((a.R, P.p))
        X, y = d.X[i], d.y[i]

        def perturb(streams: Any, X: Any = X, y: Any = y, th: np.ndarray = th,
                    i: int = i) -> None:
            for k in range(a.R):  # each record is released once: one release of each per run
                Xp, yp = baselines.local_dp_data(X, y, eps, bound, row_generator(streams, k))
                th[k] = local_model(P.loss, Xp, yp, float(P.lam[i]))

        rel.fused(baselines.local_dp_events(eps, bound, P.p), perturb, None,
                  purpose="local_dp")
        models[i] = th
        ledgers.append(rel.ledger)
    ev = Evaluator(comm, P, d, agents, ref, a.R)
    block = HostedModels(models, agents)
    vals = ev.record(block)
    if vals is not None:
        hooks.record(0, vals)
    final = ev.final(block, ev.validation(block))
    gl = comm.gather(ledgers, root=0)
    if comm.Get_rank() != 0:
        return None
    assert final is not None and gl is not None  # rank 0
    return final, sorted((x for part in gl for x in part), key=lambda x: x.agent)
