"""DOLA rounds per second: the MPI path against the single-process simulator, and one neighbour
exchange against a raw Neighbor_allgatherv of the same bytes.

Seed 003's DOLA (mpi_dp/algorithms/dola.py) advances a `Block` of agents one synchronous round at
a time; the block talks to the other agents only through a `net`. Two nets exist: `LocalNet`
(all m agents in one process, no communication: the simulator, `dola.simulate`) and
`comm.graph_exchange.GraphNet` (each rank hosts a contiguous block of agents, neighbours exchange
released vectors over an MPI dist-graph communicator: what `mpi-dp run` uses). Run under MPI:

    mpiexec -n P python benchmarks/dola_rounds.py [--agents 64,512] [--kinds dense,csr]

For every agent count m and data kind it measures, in the same run:

1. Rounds per second of a whole DOLA run (`dola.drive`: every round's exchange, mix, hinge step,
   Laplace release and the per-round record, collectives included) two ways, interleaved in
   --blocks blocks: the simulator of ALL m agents (a Block over LocalNet) on rank 0 while the
   other ranks wait politely (Ibarrier + sleep, so a busy-polling MPICH rank does not steal rank
   0's core), and the MPI path (a Block over a GraphNet on COMM_WORLD, built as
   `methods/dola.py::run_config` builds it) on all ranks. Settings as a default job: variant
   laplace, eps 1 per release, lam 0.1, radius 1/sqrt(lam), strong steps, h = 1 record per round,
   hash activation (p_act 0.5, window 10), mh_static weights, graph 'medium' (random geometric,
   mean degree 10), one run (R = 1), a record every round, exact regret (one Bcast of the
   reference agent's iterate per round) against a stand-in comparator w* (a fixed vector: its
   cost matters here, not its value); no test set. Data are in memory (no HDF5): `dense` = d
   (--dim) Gaussian features, rows scaled to norm 1, labels +-1 from a planted vector; `csr` =
   `scipy.sparse.random` rows shaped like Reuters-21578 (d = 8,315, density 0.0053 = 43.7
   nonzeros per row on average, as the LaSVM split has), rows scaled to norm 1; or (--shard,
   default data/reuters.h5 where it exists) the real rows of a prepared Reuters shard file,
   recycled when m T exceeds its 7,744 records. Both paths must end with bitwise equal iterates
   (checked after the first block). Goal: on 1 rank the MPI path within 1.5x of the simulator,
   i.e. ratio simulator time / MPI time >= 0.67.
2. The time of one `GraphNet.exchange` per mode (allgather, alltoallv, rma: a fixed Pub array,
   a fixed active mask of `topology.EdgeActivation`) against a raw `Neighbor_allgatherv` on the
   same dist-graph communicator (`net.dgraph`) of the bytes mode allgather moves (every boundary
   vector to every neighbour rank; alltoallv and rma move only what active edges need, so they
   can beat it), and against raw+copy (the same call plus the two copies any exchange of rows
   of Pub needs: boundary rows into the send buffer, received rows into the ghost rows),
   interleaved in blocks. Per call: the slowest rank's mean over a batch of calls (~0.15 s).
   Goal: exchange / raw <= 2. On 1 rank there are no neighbours and nothing to measure.
3. A summary table of both, with a verdict per ratio: met (every block), not met (no block), or
   inconclusive when the block-to-block spread straddles the goal.

Medians over blocks with the min-max spread are printed; a ratio is the median of the per-block
ratios (the two sides of a ratio are timed back to back in each block). Times are printed, never
asserted. The machine matters: with more ranks than cores, MPICH's busy-polling ranks take turns
on the cores, so oversubscribed MPI timings say more about the scheduler than about the code.
"""

from __future__ import annotations

import argparse
import os

# One BLAS thread per rank, as under MPI (must be set before numpy is imported).
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")

import math  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402
import scipy.sparse as sp  # noqa: E402
from mpi4py import MPI  # noqa: E402

from mpi_dp.algorithms import dola  # noqa: E402
from mpi_dp.comm import graph_exchange  # noqa: E402
from mpi_dp.comm import topology as tp  # noqa: E402
from mpi_dp.privacy import rules  # noqa: E402
from mpi_dp.privacy.contract import Contract  # noqa: E402

GRAPH = "medium"
KINDS = ("dense", "csr")
REUTERS_DIM, REUTERS_DENSITY = 8315, 0.00526  # 43.7 nonzeros per row on average
DEFAULT_SHARD = Path("data/reuters.h5")
#: rounds per block when --rounds is 'auto': about 1 s of simulator per block on a 2-core VM
AUTO_ROUNDS = {("dense", 64): 200, ("dense", 512): 60, ("csr", 64): 28, ("csr", 512): 3}
ROUNDS_GOAL, EXCHANGE_GOAL = 1 / 1.5, 2.0
SPREAD_NOISY = 0.3  # (max - min) / median above which a timing series is called noisy
BATCH_S = 0.15  # target seconds of one timed batch of exchanges


def parse_args(comm: MPI.Comm, argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0].replace("\n", " ") + " Rounds/s of dola.drive over a "
        "GraphNet (all ranks) vs over LocalNet (the simulator of all agents, rank 0), and "
        "GraphNet.exchange (allgather / alltoallv / rma) vs a raw Neighbor_allgatherv, interleaved "
        "in blocks, medians with min-max spread.",
        epilog="Examples: mpiexec -n 4 python benchmarks/dola_rounds.py (~3 min on a 2-core VM); "
        "mpiexec -n 1 python benchmarks/dola_rounds.py --kinds dense (the 1.5x goal); mpiexec -n 2 "
        "python benchmarks/dola_rounds.py --quick (smoke test, seconds; tests/test_benchmarks.py "
        "runs it; any rank count up to 16). Set-up (graph, data, "
        "GraphNet, Block) is never timed. OPENBLAS_NUM_THREADS=1 unless already set. Output: per "
        "m and data kind the medians [min-max] over the blocks, the ratios with a verdict (met in "
        "every block / not met in any / INCONCLUSIVE when the spread straddles the goal, plus "
        "'noisy' when a series spreads over 30%% of its median), then a summary table. The top of "
        "this file and benchmarks/README.md say what is measured and why.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--agents", default="64,512",
                    help="agent counts m, comma-separated (each >= the rank count and >= 11, the "
                    "'medium' graph has mean degree 10)")
    ap.add_argument("--kinds", default="dense,csr",
                    help="data kinds: dense (d = --dim) and/or csr (Reuters-shaped sparse rows)")
    ap.add_argument("--dim", type=int, default=100, help="features d of the dense kind")
    ap.add_argument("--csr-dim", type=int, default=REUTERS_DIM,
                    help="features d of the csr kind (Reuters-21578: 8,315)")
    ap.add_argument("--density", type=float, default=REUTERS_DENSITY,
                    help="fraction of nonzeros of a synthetic csr row (Reuters: 43.7 / 8,315)")
    ap.add_argument("--shard", default="auto", metavar="PATH|auto|none",
                    help="csr kind from a prepared Reuters shard file (mpi-dp data prepare "
                    f"reuters --source ../shared/data --out {DEFAULT_SHARD}): its real rows, "
                    f"recycled if m T is larger; 'auto' = {DEFAULT_SHARD} if it exists, else "
                    "synthetic rows; 'none' = synthetic")
    ap.add_argument("--rounds", default="auto", metavar="T|auto",
                    help="rounds T per timed run (each agent streams T records); 'auto' = "
                    + ", ".join(f"{T} for {k} m={m}" for (k, m), T in AUTO_ROUNDS.items())
                    + " (T for other m: by the nearest m), about 1 s of simulator per block")
    ap.add_argument("--blocks", type=int, default=5,
                    help="interleaved timing blocks (one simulator and one MPI run each; one "
                    "batch per exchange mode and one raw batch each)")
    ap.add_argument("--modes", default=",".join(graph_exchange.MODES),
                    help="exchange modes timed in part 2 (comma-separated)")
    ap.add_argument("--round-mode", default="allgather", choices=graph_exchange.MODES,
                    help="exchange mode of the GraphNet in part 1 (a job's default: allgather)")
    ap.add_argument("--regret", default="exact", choices=("exact", "own"),
                    help="exact: Bcast the reference agent's iterate every round (a job's "
                    "default); own: no extra collective")
    ap.add_argument("--record-every", type=int, default=1,
                    help="rounds between records (each an Allreduce + Gatherv; a job's default 1)")
    ap.add_argument("--seed", type=int, default=1, help="graph, data and noise seed")
    ap.add_argument("--quick", action="store_true",
                    help="smoke test: m = 16, d = 20, csr d = 1,000 (density 0.02), T = 10, "
                    "2 blocks, synthetic data (options given explicitly win)")
    a = ap.parse_args(argv)
    if a.quick:  # the smoke-test sizes, where not given explicitly
        quick = {"agents": "16", "dim": 20, "csr_dim": 1000, "density": 0.02, "rounds": "10",
                 "blocks": 2, "shard": "none"}
        for k, v in quick.items():
            if getattr(a, k) == ap.get_default(k):
                setattr(a, k, v)
    try:
        a.agents = [int(x) for x in a.agents.split(",") if x.strip()]
    except ValueError:
        ap.error(f"--agents must be comma-separated integers, not {a.agents!r}")
    size = comm.Get_size()
    bad = [m for m in a.agents if m < max(11, size)]
    if bad or not a.agents:
        ap.error(f"--agents: every m must be >= 11 (mean degree 10) and >= the {size} ranks "
                 f"(every rank hosts agents); got {a.agents}")
    a.kinds = [k.strip() for k in a.kinds.split(",") if k.strip()]
    if not a.kinds or any(k not in KINDS for k in a.kinds):
        ap.error(f"--kinds must be a comma-separated subset of {KINDS}, not {a.kinds}")
    a.modes = [x.strip() for x in a.modes.split(",") if x.strip()]
    if any(x not in graph_exchange.MODES for x in a.modes):
        ap.error(f"--modes must be a comma-separated subset of {graph_exchange.MODES}, not {a.modes}")
    if a.rounds != "auto":
        try:
            a.rounds = int(a.rounds)
        except ValueError:
            ap.error(f"--rounds must be a positive integer or 'auto', not {a.rounds!r}")
        if a.rounds < 1:
            ap.error("--rounds must be at least 1")
    for k in ("dim", "csr_dim", "blocks", "record_every"):
        if getattr(a, k) < 1:
            ap.error(f"--{k.replace('_', '-')} must be at least 1")
    if not 0 < a.density <= 1:
        ap.error("--density must be in (0, 1]")
    if a.shard == "auto":
        a.shard = str(DEFAULT_SHARD) if DEFAULT_SHARD.exists() else None
    elif a.shard == "none":
        a.shard = None
    elif not Path(a.shard).exists():
        ap.error(f"--shard {a.shard}: no such file")
    return a


def rounds_for(a: argparse.Namespace, kind: str, m: int) -> int:
    if a.rounds != "auto":
        return a.rounds
    near = min((mm for k, mm in AUTO_ROUNDS if k == kind), key=lambda mm: abs(math.log(mm / m)))
    return AUTO_ROUNDS[(kind, near)]


# -- data ----------------------------------------------------------------------------------------
def gen(seed: int, *key: int) -> np.random.Generator:
    """The benchmark's own streams (data, w0, w*, Pub), apart from mpi_dp.rng's purposes."""
    return np.random.default_rng([seed, 3003, *key])


def unit_rows(X: Any) -> Any:
    """Rows scaled to L2 norm 1 (empty rows stay empty)."""
    if sp.issparse(X):
        X = sp.csr_matrix(X)
        norms = np.sqrt(np.asarray(X.multiply(X).sum(axis=1)).ravel())
        return sp.diags(1.0 / np.where(norms > 0, norms, 1.0)) @ X
    norms = np.linalg.norm(X, axis=1, keepdims=True)
    return X / np.where(norms > 0, norms, 1.0)


def labels(X: Any, w0: np.ndarray, g: np.random.Generator) -> np.ndarray:
    z = np.asarray(X @ w0).ravel() + 0.05 * g.standard_normal(X.shape[0])
    return np.where(z >= 0, 1.0, -1.0)


class Data:
    """In-memory records of the agents a rank needs: read(agent, start, stop) for dola.Stream."""

    def __init__(self, kind: str, d: int, T: int, agents: np.ndarray, a: argparse.Namespace,
                 shard_rows: tuple[Any, np.ndarray] | None) -> None:
        self.kind, self.d = kind, d
        self.rows: dict[int, tuple[Any, np.ndarray]] = {}
        w0 = gen(a.seed, 0).standard_normal(d)
        for i in agents.tolist():
            g = gen(a.seed, 1, i)
            if kind == "dense":
                X = unit_rows(g.standard_normal((T, d)))
                self.rows[i] = (X, labels(X, w0, g))
            elif shard_rows is not None:
                Xs, ys = shard_rows
                idx = (i * T + np.arange(T)) % Xs.shape[0]
                self.rows[i] = (Xs[idx], ys[idx])
            else:
                X = unit_rows(sp.random(T, d, density=a.density, format="csr", random_state=g))
                self.rows[i] = (X, labels(X, w0, g))

    def __call__(self, agent: int, start: int, stop: int) -> tuple[Any, np.ndarray]:
        X, y = self.rows[agent]
        return X[start:stop], y[start:stop]


def load_shard(path: str) -> tuple[sp.csr_matrix, np.ndarray]:
    """Every record of a prepared Reuters shard file, through ShardFile.read_agent_rows."""
    from mpi_dp.data import ShardFile

    shard = ShardFile(path)
    if not shard.is_sparse:
        raise SystemExit(f"--shard {path}: not a CSR shard file (the csr kind needs one)")
    parts = [shard.read_agent_rows(i, 0, int(n)) for i, n in enumerate(shard.sizes())]
    return sp.vstack([p[0] for p in parts], format="csr"), np.concatenate([p[1] for p in parts])


# -- timing helpers ------------------------------------------------------------------------------
def polite_wait(comm: MPI.Comm) -> None:
    """A barrier that naps instead of spinning (ranks idle while rank 0 simulates)."""
    req = comm.Ibarrier()
    while not req.Test():
        time.sleep(0.002)


def fmt(x: float) -> str:
    """A rate or time with three significant digits (no exponent below 1e6)."""
    return f"{x:.3g}" if abs(x) < 100 else f"{x:.0f}"


def stats(xs: list[float]) -> tuple[float, float, float]:
    return float(np.median(xs)), float(min(xs)), float(max(xs))


def rel_spread(xs: list[float]) -> float:
    med, lo, hi = stats(xs)
    return (hi - lo) / med if med > 0 else math.inf


def verdict(ratios: list[float], goal: float, higher_is_better: bool, series: dict[str, list[float]]
            ) -> str:
    """Met / not met / inconclusive from the per-block ratios, plus a noise warning."""
    lo, hi = min(ratios), max(ratios)
    if (lo >= goal) if higher_is_better else (hi <= goal):
        v = "met in every block"
    elif (hi < goal) if higher_is_better else (lo > goal):
        v = "not met in any block"
    else:
        v = (f"INCONCLUSIVE: the per-block ratios {lo:.2f}-{hi:.2f} straddle the goal, the "
             "spread makes the median ratio meaningless")
    noisy = {k: rel_spread(x) for k, x in series.items() if rel_spread(x) > SPREAD_NOISY}
    if noisy:
        v += "; noisy (" + ", ".join(f"{k} spread {100 * s:.0f}% of its median"
                                     for k, s in noisy.items()) + ")"
    return v


def rank0_print(comm: MPI.Comm, *args: Any) -> None:
    if comm.Get_rank() == 0:
        print(*args, flush=True)


# -- part 1: rounds per second -------------------------------------------------------------------
def settings(m: int, d: int, T: int, a: argparse.Namespace) -> dola.Settings:
    """A default job's Settings (methods/dola.py: laplace, lam 0.1, radius auto, step auto)."""
    lam = 0.1
    return dola.Settings(variant="laplace", T=T, h=1, n_features=d, m=m, lam=lam,
                         radius=1.0 / math.sqrt(lam), step="strong", seed=a.seed, run_ids=(0,),
                         record_every=min(a.record_every, T), exact_regret=a.regret == "exact")


def contract(s: dola.Settings) -> Contract:
    """Every agent's release path: eps 1 per release (the paper's rule, seed 003), one release
    per record (a single pass)."""
    return Contract.planned(rules.PerRelease(), s.mechanism, s.passes, [1.0] * s.m, seed=s.seed,
                            run_ids=s.run_ids, scope="record")


def sim_run(s: dola.Settings, graph: tp.Graph, read: Data, w_star: np.ndarray
            ) -> tuple[float, dola.Block]:
    net = dola.LocalNet(graph)
    block = dola.Block(s, contract(s), graph, net,
                       dola.Stream(net.agents, s.h, s.T, s.n_features, read), w_star)
    t0 = time.perf_counter()
    dola.drive(block, None)
    return time.perf_counter() - t0, block


def mpi_run(comm: MPI.Comm, s: dola.Settings, graph: tp.Graph, net: graph_exchange.GraphNet, read: Data,
            w_star: np.ndarray) -> tuple[float, float, dola.Block]:
    """Wall seconds of dola.drive on all ranks (barrier to barrier, rank 0's clock) and the
    slowest rank's exchange seconds."""
    block = dola.Block(s, contract(s), graph, net,
                       dola.Stream(net.agents, s.h, s.T, s.n_features, read), w_star)
    ex0 = net.exchange_seconds
    comm.Barrier()
    t0 = time.perf_counter()
    dola.drive(block, None)
    comm.Barrier()
    wall = time.perf_counter() - t0
    ex = comm.allreduce(net.exchange_seconds - ex0, op=MPI.MAX)
    return wall, ex, block


def bench_rounds(comm: MPI.Comm, a: argparse.Namespace, kind: str, m: int, d: int, T: int,
                 graph: tp.Graph, shard_rows: Any) -> dict[str, Any]:
    rank = comm.Get_rank()
    t_set = time.perf_counter()
    net = graph_exchange.GraphNet(comm, graph, a.round_mode, (1, d), two_hop=False)
    t_net = comm.allreduce(time.perf_counter() - t_set, op=MPI.MAX)
    agents = np.arange(m) if rank == 0 else net.agents
    data = Data(kind, d, T, agents, a, shard_rows)
    w_star = 0.5 * unit_rows(gen(a.seed, 2).standard_normal((1, d)))[0]
    s = settings(m, d, T, a)
    warm = settings(m, d, max(2, T // 10), a)
    # warm-up (first touches, imports; not timed); block 0 also checks the final iterates
    if rank == 0:
        sim_run(warm, graph, data, w_star)
    polite_wait(comm)
    mpi_run(comm, warm, graph, net, data, w_star)
    t_sim, t_mpi, t_ex, ratios = [], [], [], []
    same = None
    for b in range(a.blocks):
        order = ("sim", "mpi") if b % 2 == 0 else ("mpi", "sim")
        got: dict[str, float] = {}
        for which in order:
            if which == "sim":
                if rank == 0:
                    got["sim"], sim_block = sim_run(s, graph, data, w_star)
                polite_wait(comm)
            else:
                got["mpi"], ex, mpi_block = mpi_run(comm, s, graph, net, data, w_star)
        if b == 0:
            W = net.gather_agents(mpi_block.W.reshape(mpi_block.k, -1))
            if rank == 0:
                same = float(np.max(np.abs(W - sim_block.W.reshape(m, -1))))
        if rank == 0:
            t_sim.append(got["sim"])
            t_mpi.append(got["mpi"])
            t_ex.append(ex)
            ratios.append(got["sim"] / got["mpi"])
    net.free()
    return {"T": T, "t_sim": t_sim, "t_mpi": t_mpi,
            "t_ex": t_ex, "ratios": ratios, "same": same,
            "t_net": t_net, "boundary": comm.allreduce(len(net.ghosts), op=MPI.MAX)}


def report_rounds(comm: MPI.Comm, kind: str, m: int, r: dict[str, Any], a: argparse.Namespace
                  ) -> None:
    if comm.Get_rank() != 0:
        return
    T, size = r["T"], comm.Get_size()
    sim, mpi = [T / t for t in r["t_sim"]], [T / t for t in r["t_mpi"]]
    ms, ls, hs = stats(sim)
    mm, lm, hm = stats(mpi)
    mr, lr, hr = stats(r["ratios"])
    share = float(np.median(np.array(r["t_ex"]) / np.array(r["t_mpi"])))
    print(f"  rounds: T = {T} per run, {a.blocks} blocks; GraphNet set-up {r['t_net']:.2f} s "
          f"(not timed), at most {r['boundary']} ghost agents per rank")
    print(f"    simulator (rank 0, all {m} agents): {fmt(ms)} rounds/s [{fmt(ls)}-{fmt(hs)}]")
    print(f"    MPI path ({size} rank{'s' * (size > 1)}, {a.round_mode}): {fmt(mm)} rounds/s "
          f"[{fmt(lm)}-{fmt(hm)}]; exchange {100 * share:.0f}% of its time")
    same = r["same"]
    print("    final iterates MPI vs simulator: "
          + ("bitwise equal" if same == 0.0 else f"DIFFER (max |diff| {same:.3g})"))
    r["verdict"] = verdict(r["ratios"], ROUNDS_GOAL, True, {"sim": r["t_sim"], "MPI": r["t_mpi"]})
    print(f"    ratio simulator time / MPI time = {mr:.2f} [{lr:.2f}-{hr:.2f}] (goal >= "
          f"{ROUNDS_GOAL:.2f} on 1 rank): {r['verdict']}")


# -- part 2: one exchange ------------------------------------------------------------------------
def bench_exchange(comm: MPI.Comm, a: argparse.Namespace, m: int, d: int, graph: tp.Graph
                   ) -> dict[str, Any] | None:
    if comm.Get_size() == 1:
        return None
    nets = {mode: graph_exchange.GraphNet(comm, graph, mode, (1, d)) for mode in a.modes}
    net0 = next(iter(nets.values()))
    g = gen(a.seed, 3, comm.Get_rank())
    pub = g.standard_normal((len(net0.agents) + len(net0.ghosts), 1, d))
    pubs = {mode: pub.copy() for mode in nets}
    act = tp.EdgeActivation(net0.tracked, "hash", 0.5, 10, a.seed)
    for _ in range(3):
        active = act.step()  # round 2's mask (about half the edges on)
    # the raw reference: every boundary vector to every neighbour rank (what allgather moves)
    dg = net0.dgraph
    peers = net0.peers
    boundary = (np.unique(np.concatenate([net0.send_to[q] for q in peers])) if peers
                else np.zeros(0, np.int64))
    sendbuf = np.ascontiguousarray(pub[: len(boundary)].reshape(len(boundary), d))
    counts = np.zeros(len(peers), dtype=np.int64)
    dg.Neighbor_allgather([np.array([len(boundary) * d], dtype=np.int64), MPI.INT64_T],
                          [counts, MPI.INT64_T])
    displs = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)
    recvbuf = np.zeros(int(counts.sum()))
    # raw+copy: the same plus the two copies any exchange of rows of Pub makes (the boundary rows
    # into the send buffer; the received rows this rank needs into its ghost rows)
    ids = np.zeros(int(counts.sum()) // d, dtype=np.int64)
    dg.Neighbor_allgatherv([boundary, MPI.INT64_T], [ids, (counts // d, displs // d),
                                                      MPI.INT64_T])
    k = len(net0.agents)
    flat = pub.reshape(pub.shape[0], d)
    send_rows = boundary - (net0.agents[0] if k else 0)
    want = np.isin(ids, net0.ghosts)
    pick = np.flatnonzero(want)
    ghost_rows = k + np.searchsorted(net0.ghosts, ids[want])
    recv2 = recvbuf.reshape(-1, d)
    clock = {mode: 0 for mode in nets}

    def raw() -> None:
        dg.Neighbor_allgatherv([sendbuf, MPI.DOUBLE], [recvbuf, (counts, displs), MPI.DOUBLE])

    def raw_copy() -> None:
        np.take(flat, send_rows, axis=0, out=sendbuf)
        raw()
        flat[ghost_rows] = recv2[pick]

    def call(mode: str) -> Any:
        def f() -> None:
            nets[mode].exchange(clock[mode], pubs[mode], active)
            clock[mode] += 1
        return f

    fns = {"raw": raw, "raw+copy": raw_copy, **{mode: call(mode) for mode in nets}}

    def timed(f: Any, reps: int) -> float:
        comm.Barrier()
        t0 = time.perf_counter()
        for _ in range(reps):
            f()
        return comm.allreduce((time.perf_counter() - t0) / reps, op=MPI.MAX)

    reps = {}
    for name, f in fns.items():  # warm-up and calibration: a batch takes about BATCH_S
        timed(f, 3)
        t1 = timed(f, 5)
        reps[name] = int(min(5000, max(5, BATCH_S / max(t1, 1e-7))))
    times: dict[str, list[float]] = {name: [] for name in fns}
    names = list(fns)
    for b in range(a.blocks):
        for name in names[b % len(names):] + names[: b % len(names)]:  # rotate the order
            times[name].append(timed(fns[name], reps[name]))
    moved = comm.allreduce(int(counts.sum()) * 8, op=MPI.MAX)
    for net in nets.values():
        net.free()
    return {"times": times, "reps": reps, "recv_bytes": moved, "peers": len(peers)}


def report_exchange(comm: MPI.Comm, r: dict[str, Any] | None, a: argparse.Namespace) -> None:
    if comm.Get_rank() != 0:
        return
    if r is None:
        print("  exchange: 1 rank, no neighbour ranks: every neighbour is in memory, nothing to "
              "exchange (skipped)")
        return
    times = r["times"]
    print(f"  exchange (per call, slowest rank; raw = Neighbor_allgatherv receiving up to "
          f"{r['recv_bytes'] / 1024:.0f} KiB per rank from {r['peers']} peer rank(s)):")
    for name in ("raw", "raw+copy"):
        q, lo, hi = stats(times[name])
        print(f"    {name:10s} {1e6 * q:9.1f} us  [{1e6 * lo:.1f}-{1e6 * hi:.1f}]  "
              f"({r['reps'][name]} calls per batch)")
    r["ratios"], r["verdicts"] = {}, {}
    for mode in a.modes:
        m_, l_, h_ = stats(times[mode])
        ratios = [x / y for x, y in zip(times[mode], times["raw"], strict=True)]
        q, ql, qh = stats(ratios)
        r["ratios"][mode] = ratios
        r["verdicts"][mode] = verdict(ratios, EXCHANGE_GOAL, False,
                                      {mode: times[mode], "raw": times["raw"]})
        qc = stats([x / y for x, y in zip(times[mode], times["raw+copy"], strict=True)])[0]
        print(f"    {mode:10s} {1e6 * m_:9.1f} us  [{1e6 * l_:.1f}-{1e6 * h_:.1f}]  ratio/raw "
              f"{q:.2f} [{ql:.2f}-{qh:.2f}] (goal <= {EXCHANGE_GOAL:g}; /raw+copy {qc:.2f}): "
              f"{r['verdicts'][mode]}")


# -- summary -------------------------------------------------------------------------------------
def summary(comm: MPI.Comm, rows: list[tuple[int, str, dict, dict | None]],
            a: argparse.Namespace) -> None:
    if comm.Get_rank() != 0:
        return
    size = comm.Get_size()
    print(f"\nsummary ({size} rank{'s' * (size > 1)}, {os.cpu_count()} cores; medians over "
          f"{a.blocks} blocks, [min-max])")
    head = ["m", "data", "T", "sim rounds/s", "MPI rounds/s", "sim/MPI time", "raw us",
            "raw+copy us"]
    head += [f"{mode} us = /raw" for mode in a.modes]
    table = []
    for m, kind, rr, ex in rows:
        T = rr["T"]
        sim = stats([T / t for t in rr["t_sim"]])
        mpi = stats([T / t for t in rr["t_mpi"]])
        q = stats(rr["ratios"])
        row = [str(m), kind, str(T), f"{fmt(sim[0])} [{fmt(sim[1])}-{fmt(sim[2])}]",
               f"{fmt(mpi[0])} [{fmt(mpi[1])}-{fmt(mpi[2])}]",
               f"{q[0]:.2f} [{q[1]:.2f}-{q[2]:.2f}]"]
        if ex is None:
            row += ["-"] * (2 + len(a.modes))
        else:
            row += [f"{1e6 * stats(ex['times'][x])[0]:.0f}" for x in ("raw", "raw+copy")]
            for mode in a.modes:
                e, qq = stats(ex["times"][mode])[0], stats(ex["ratios"][mode])
                row.append(f"{1e6 * e:.0f} = {qq[0]:.2f} [{qq[1]:.2f}-{qq[2]:.2f}]")
        table.append(row)
    widths = [max(len(r[i]) for r in [head, *table]) for i in range(len(head))]
    for r in [head, *table]:
        print("  " + " | ".join(c.rjust(w) if i != 1 else c.ljust(w)
                                for i, (c, w) in enumerate(zip(r, widths, strict=True))))
    print("verdicts:")
    for m, kind, rr, ex in rows:
        print(f"  m={m} {kind}: rounds sim/MPI (goal >= {ROUNDS_GOAL:.2f}"
              f"{', judged on 1 rank' if size > 1 else ''}): {rr['verdict']}")
        if ex is not None:
            for mode in a.modes:
                print(f"  m={m} {kind}: exchange {mode}/raw (goal <= {EXCHANGE_GOAL:g}): "
                      f"{ex['verdicts'][mode]}")
    if rows and rows[0][3] is None:
        print("  exchange: 1 rank, no neighbour ranks, nothing exchanged (skipped)")
    cores = os.cpu_count() or 1
    load = os.getloadavg()
    print(f"load average at the end: {load[0]:.1f} (1 min), {load[1]:.1f} (5 min) on {cores} "
          "cores" + (" -- other jobs shared the machine" if load[1] > cores + 0.5 else ""))
    if size > cores:
        print(f"note: {size} ranks on {cores} cores: oversubscribed; MPICH ranks busy-poll while "
              "they wait, so every MPI timing includes waiting for a core")


def main(argv: list[str] | None = None) -> int:
    t_start = time.perf_counter()
    comm = MPI.COMM_WORLD
    a = parse_args(comm, argv)
    size = comm.Get_size()
    shard_rows = None
    if "csr" in a.kinds and a.shard:
        shard_rows = load_shard(a.shard)
        a.csr_dim = shard_rows[0].shape[1]
    src = (f"real rows of {a.shard} ({shard_rows[0].shape[0]:,} records, "
           f"{shard_rows[0].nnz / shard_rows[0].shape[0]:.1f} nonzeros per row)" if shard_rows
           else f"synthetic, density {a.density:.4f}")
    rank0_print(comm, f"dola_rounds{' (quick)' if a.quick else ''}: {size} rank(s) on "
                f"{os.cpu_count()} cores, MPI {MPI.Get_library_version().splitlines()[0].strip()}, "
                f"numpy {np.__version__}, OPENBLAS_NUM_THREADS={os.environ.get('OPENBLAS_NUM_THREADS')}")
    rank0_print(comm, f"load average at the start: {os.getloadavg()[0]:.1f} (1 min)")
    rank0_print(comm, f"graph {GRAPH} (mean degree 10), laplace, eps 1, R = 1, h = 1, record "
                f"every {a.record_every}, regret {a.regret}; dense d = {a.dim}; csr d = "
                f"{a.csr_dim}, {src}")
    rows = []
    for m in a.agents:
        graph = tp.make_graph(GRAPH, m, a.seed)
        for kind in a.kinds:
            d = a.dim if kind == "dense" else a.csr_dim
            T = rounds_for(a, kind, m)
            rank0_print(comm, f"\nm = {m} agents ({len(graph.edges)} edges, mean degree "
                        f"{graph.mean_degree:.1f}), {kind} d = {d}, {m // size}-"
                        f"{-(-m // size)} agents per rank")
            rr = bench_rounds(comm, a, kind, m, d, T, graph, shard_rows)
            report_rounds(comm, kind, m, rr, a)
            ex = bench_exchange(comm, a, m, d, graph)
            report_exchange(comm, ex, a)
            rows.append((m, kind, rr, ex))
    summary(comm, rows, a)
    rank0_print(comm, f"wall time {time.perf_counter() - t_start:.0f} s")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
