"""Wake-ups per second of personalised P2P CD (seed 004) with the 943 MovieLens peers.

    mpiexec -n 4 python benchmarks/p2p_wakeups.py [--shard data/movielens.h5] [--blocks 3]
    mpiexec -n 2 python benchmarks/p2p_wakeups.py --quick     # smoke test, no file (seconds)

In every block, interleaved: (1) the raw RMA rates of one model-sized vector to the next rank
(comm.rma.raw_put_rate): Lock_all/Put/Flush, and Lock(EXCLUSIVE)/Put/Unlock, the mailboxes' own
protocol (one exclusive epoch per target rank per wake-up); (2) a live run (Poisson clocks as
fast as possible, no barriers, every peer T_i wake-ups); (3) a replay run of the same number of
wake-ups (conflict-free rounds + barriers); (4) the serial simulator of the same schedule on
rank 0. Prints per block, then the median and spread (max/min) of the rates and of: live
wake-ups/s / raw puts/s (the issue's goal >= 0.3), live puts/s / raw puts/s (a wake-up posts
|N_i| ~ 15 puts), live exclusive epochs/s / raw Lock/Put/Unlock/s (the protocol's floor), and
replay wake-ups/s / serial wake-ups/s (goal > 1 on 4 ranks). Oversubscribed ranks (more ranks
than cores) share cores, so a ratio whose spread exceeds 2x is flagged as noise.

The shard (data/movielens.h5: mpi-dp data prepare movielens --source ../shared/data) bounds its
feature rows by /public/item_norm_max; another p2p shard by its /public/row_norm_max, else 1.
--quick (tests/test_benchmarks.py runs it) needs no file: unless --shard is given it writes a
synthetic personalised-P2P shard of the same kind (peers on a graph, mpi_dp.data.synth.write_p2p:
QUICK_PEERS peers, rows of L1 norm 1) to a temporary folder, and runs QUICK's small sizes.
"""

from __future__ import annotations

import argparse
import math
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
from mpi4py import MPI

from mpi_dp.comm import rma
from mpi_dp.comm.graph_exchange import block_starts
from mpi_dp.data import ShardFile
from mpi_dp.data.bounds import row_norm_bound
from mpi_dp.data.shard_graph import read_graph
from mpi_dp.p2p import coordinate_descent, objective
from mpi_dp.privacy import rules
from mpi_dp.privacy.contract import Contract

DEFAULT_SHARD = "data/movielens.h5"
#: --quick: the smallest meaningful case (options given explicitly win)
QUICK = {"blocks": 2, "T_agent": 2, "raw_puts": 500}
#: --quick's synthetic shard: mpi_dp.data.synth.write_p2p(path, **QUICK_PEERS)
QUICK_PEERS = {"n": 16, "p": 5, "seed": 1, "max_records": 20, "test_records": 5}


def problem(shard: ShardFile, agents, mu: float) -> objective.Problem:
    W = read_graph(shard)
    n = shard.n_agents
    m = shard.sizes()
    X: list = [None] * n
    y: list = [None] * n
    for i in agents:
        X[i], y[i] = shard.read_agent(int(i))
    # the public bound on the rows' L2 norms: MovieLens' item_norm_max, else the shard's
    # row_norm_max, else 1 (a synthetic p2p shard's rows have L1, hence L2, norm <= 1)
    item, bound = row_norm_bound(shard, "item_norm_max"), row_norm_bound(shard)
    rn = item if item is not None else bound if bound is not None else 1.0
    return objective.make_problem(W, X, y, "quadratic", mu, 1.0 / m, m=m, smooth="bound", row_norm=rn)


def cd_contract(s: coordinate_descent.Settings, n: int) -> Contract:
    """The peers' contract, as a p2p job makes it: the paper's Theorem 1 at delta_bar = s.delta
    with s.allocation, every peer planning its T_i Laplace releases at eps_bar = s.eps."""
    rule = rules.Theorem1(delta_bar=s.delta, allocation=s.allocation)
    return Contract.planned(rule, "laplace", [int(t) for t in s.T_agent], [s.eps] * n,
                            seed=s.seed, run_ids=s.runs)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shard", default=DEFAULT_SHARD,
                    help="p2p shard file (mpi-dp data prepare movielens --source ../shared/data)")
    ap.add_argument("--blocks", type=int, default=3)
    ap.add_argument("--T-agent", type=int, default=5, help="wake-ups per peer per run")
    ap.add_argument("--barrier", choices=("mpi", "polite"), default="mpi",
                    help="replay's round barrier: MPI_Barrier (busy-polls) or Ibarrier + naps")
    ap.add_argument("--packing", choices=("levels", "greedy"), default="levels",
                    help="replay rounds: dependency levels (default) or spec §6's greedy cut")
    ap.add_argument("--epoch", choices=("rounds", "locks"), default="rounds",
                    help="replay's RMA sync: one Lock_all epoch (default) or a lock per post")
    ap.add_argument("--raw-puts", type=int, default=4000,
                    help="puts of each raw RMA rate measurement per block")
    ap.add_argument("--quick", action="store_true",
                    help="smoke test (tests/test_benchmarks.py): "
                    + ", ".join(f"--{k.replace('_', '-')} {v}" for k, v in QUICK.items())
                    + f"; without --shard a synthetic p2p shard ({QUICK_PEERS}) in a temporary "
                    "folder (options given explicitly win)")
    a = ap.parse_args()
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    tmp = None
    if a.quick:  # the smoke-test sizes, where not given explicitly
        for k, v in QUICK.items():
            if getattr(a, k) == ap.get_default(k):
                setattr(a, k, v)
        if a.shard == ap.get_default("shard"):
            tmp = comm.bcast(tempfile.mkdtemp(prefix="p2p_wakeups.") if rank == 0 else None)
            a.shard = str(Path(tmp) / "p2p_quick.h5")
            if rank == 0:
                from mpi_dp.data.synth import write_p2p

                write_p2p(a.shard, **QUICK_PEERS)
            comm.Barrier()
    if not Path(a.shard).is_file():
        if rank == 0:
            print(f"p2p_wakeups: no shard file {a.shard} (mpi-dp data prepare movielens --source "
                  "../shared/data, or --quick for synthetic data)", flush=True)
        raise SystemExit(2)
    shard = ShardFile(a.shard)
    n = shard.n_agents
    st = block_starts(n, size)
    mine = np.arange(st[rank], st[rank + 1])
    P = problem(shard, mine, 1.0)
    Pall = problem(shard, range(n), 1.0) if rank == 0 else None
    s = coordinate_descent.Settings(T=n * a.T_agent * 3, T_agent=(a.T_agent,) * n, eps=1.0,
                                    delta=math.exp(-5), clip=10.0, seed=1)
    contract = cd_contract(s, n)
    sched = coordinate_descent.global_schedule(s.seed, n, s.T)
    budgets = coordinate_descent.agent_budgets(s, P, sched, contract)
    keep = coordinate_descent.effective_ticks(sched, n, s.T_agent)
    rounds = coordinate_descent.cut_rounds(sched, keep, P.graph, 0, a.packing)
    total = len(keep)
    zero = {int(i): np.zeros(P.p) for i in mine}
    boxes = rma.Mailboxes(comm, P.graph.W, P.p, st)
    barrier = comm.Barrier if a.barrier == "mpi" else (lambda: rma.polite_barrier(comm))
    rows = []
    for b in range(a.blocks):
        raw = rma.raw_put_rate(comm, P.p, a.raw_puts) if size > 1 else math.nan
        raw_locked = (rma.raw_put_rate(comm, P.p, a.raw_puts, locked=True) if size > 1
                      else math.nan)
        block = coordinate_descent.Block(P, mine, s, contract, budgets, zero)
        coordinate_descent.post_initial(block, boxes)
        rma.polite_barrier(comm)
        t0 = time.perf_counter()
        coordinate_descent.live(block, boxes, 0.0, 600.0, boxes.poll)
        dt = time.perf_counter() - t0
        rma.polite_barrier(comm)
        live_rate = a.T_agent * n / comm.allreduce(dt, op=MPI.MAX)
        block = coordinate_descent.Block(P, mine, s, contract, budgets, zero)
        coordinate_descent.post_initial(block, boxes)
        rma.polite_barrier(comm)
        t0 = time.perf_counter()
        if a.epoch == "rounds":
            with boxes.rounds():
                coordinate_descent.replay(block, boxes, rounds, barrier)
        else:
            coordinate_descent.replay(block, boxes, rounds, barrier)
        replay_rate = total / comm.allreduce(time.perf_counter() - t0, op=MPI.MAX)
        serial_rate = math.nan
        if rank == 0:
            t0 = time.perf_counter()
            coordinate_descent.simulate(Pall, s, contract, np.zeros((n, P.p)))
            serial_rate = total / (time.perf_counter() - t0)
        rma.polite_barrier(comm)
        if rank == 0:
            rows.append((raw, live_rate, replay_rate, serial_rate, raw_locked))
            print(f"block {b + 1}: raw Put+Flush {raw:,.0f}/s | raw Lock/Put/Unlock "
                  f"{raw_locked:,.0f}/s | live {live_rate:,.0f} wake-ups/s"
                  f" | replay {replay_rate:,.0f}/s | serial {serial_rate:,.0f}/s", flush=True)
    mean_epochs = comm.allreduce(sum(boxes.target_ranks(int(i)) for i in mine)) / n
    boxes.free()
    if rank == 0:
        r = np.array(rows)

        def stat(v: np.ndarray, name: str) -> None:
            spread = v.max() / v.min() if v.min() > 0 else math.inf
            flag = "  (spread > 2x: noise, do not trust)" if spread > 2 else ""
            print(f"  {name:<34} median {np.median(v):10.4g}   spread {spread:5.2f}x{flag}")
        what = (f"quick, synthetic p2p shard {QUICK_PEERS}" if tmp else
                f"quick, {a.shard}" if a.quick else a.shard)
        print(f"\n{size} rank(s), {n} peers ({what}), T_i = {a.T_agent}, p = {P.p}, "
              f"{a.blocks} interleaved blocks; replay: {rounds.count} {a.packing} rounds for "
              f"{total} wake-ups, {a.barrier} barrier")
        stat(r[:, 0], "raw Put+Flush per s")
        stat(r[:, 4], "raw Lock/Put/Unlock per s")
        stat(r[:, 1], "live wake-ups per s")
        stat(r[:, 2], "replay wake-ups per s")
        stat(r[:, 3], "serial wake-ups per s")
        if size > 1:
            deg = float(np.mean(np.diff(P.graph.W.indptr)))
            live_epochs = mean_epochs
            stat(r[:, 1] / r[:, 0], "live wake-ups / raw puts (goal 0.3)")
            stat(r[:, 1] * deg / r[:, 0], f"live puts (x{deg:.1f}) / raw puts")
            # a wake-up opens one exclusive epoch per target rank: its floor is the locked rate
            stat(r[:, 1] * live_epochs / r[:, 4], f"live epochs (x{live_epochs:.2f}) / locked")
        stat(r[:, 2] / r[:, 3], "replay / serial (goal > 1 on 4)")
    shard.close()
    comm.Barrier()
    if tmp and rank == 0:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
