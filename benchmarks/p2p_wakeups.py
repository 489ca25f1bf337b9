"""Wake-ups per second of personalised P2P CD (seed 004) with the 943 MovieLens peers.

    mpiexec -n 4 python benchmarks/p2p_wakeups.py [--shard data/movielens.h5] [--blocks 3]

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
"""

from __future__ import annotations

import argparse
import math
import time

import numpy as np
from mpi4py import MPI

from mpi_dp.algorithms import p2p_cd as C
from mpi_dp.comm import rma
from mpi_dp.comm.graph import block_starts
from mpi_dp.data import ShardFile
from mpi_dp.data.graphs import read_graph
from mpi_dp.models import p2p as M


def problem(shard: ShardFile, agents, mu: float) -> M.Problem:
    W = read_graph(shard)
    n = shard.n_agents
    m = shard.sizes()
    X: list = [None] * n
    y: list = [None] * n
    for i in agents:
        X[i], y[i] = shard.read_agent(int(i))
    rn = float(shard.read_public_extra("item_norm_max").ravel()[0])
    return M.make_problem(W, X, y, "quadratic", mu, 1.0 / m, m=m, smooth="bound", row_norm=rn)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shard", default="data/movielens.h5")
    ap.add_argument("--blocks", type=int, default=3)
    ap.add_argument("--T-agent", type=int, default=5, help="wake-ups per peer per run")
    ap.add_argument("--barrier", choices=("mpi", "polite"), default="mpi",
                    help="replay's round barrier: MPI_Barrier (busy-polls) or Ibarrier + naps")
    ap.add_argument("--packing", choices=("levels", "greedy"), default="levels",
                    help="replay rounds: dependency levels (default) or spec §6's greedy cut")
    ap.add_argument("--epoch", choices=("rounds", "locks"), default="rounds",
                    help="replay's RMA sync: one Lock_all epoch (default) or a lock per post")
    a = ap.parse_args()
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    shard = ShardFile(a.shard)
    n = shard.n_agents
    st = block_starts(n, size)
    mine = np.arange(st[rank], st[rank + 1])
    P = problem(shard, mine, 1.0)
    Pall = problem(shard, range(n), 1.0) if rank == 0 else None
    s = C.Settings(T=n * a.T_agent * 3, T_agent=(a.T_agent,) * n, eps=1.0,
                   delta=math.exp(-5), clip=10.0, seed=1)
    sched = C.global_schedule(s.seed, n, s.T)
    budgets = C.agent_budgets(s, P, sched)
    keep = C.effective_ticks(sched, n, s.T_agent)
    rounds = C.cut_rounds(sched, keep, P.graph, 0, a.packing)
    total = len(keep)
    zero = {int(i): np.zeros(P.p) for i in mine}
    boxes = rma.Mailboxes(comm, P.graph.W, P.p, st)
    barrier = comm.Barrier if a.barrier == "mpi" else (lambda: rma.polite_barrier(comm))
    rows = []
    for b in range(a.blocks):
        raw = rma.raw_put_rate(comm, P.p, 4000) if size > 1 else math.nan
        raw_locked = rma.raw_put_rate(comm, P.p, 4000, locked=True) if size > 1 else math.nan
        block = C.Block(P, mine, s, budgets, zero)
        C.post_initial(block, boxes)
        rma.polite_barrier(comm)
        t0 = time.perf_counter()
        C.live(block, boxes, 0.0, 600.0, boxes.poll)
        dt = time.perf_counter() - t0
        rma.polite_barrier(comm)
        live_rate = a.T_agent * n / comm.allreduce(dt, op=MPI.MAX)
        block = C.Block(P, mine, s, budgets, zero)
        C.post_initial(block, boxes)
        rma.polite_barrier(comm)
        t0 = time.perf_counter()
        if a.epoch == "rounds":
            with boxes.rounds():
                C.replay(block, boxes, rounds, barrier)
        else:
            C.replay(block, boxes, rounds, barrier)
        replay_rate = total / comm.allreduce(time.perf_counter() - t0, op=MPI.MAX)
        serial_rate = math.nan
        if rank == 0:
            t0 = time.perf_counter()
            C.simulate(Pall, s, np.zeros((n, P.p)))
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
        print(f"\n{size} rank(s), {n} peers, T_i = {a.T_agent}, p = {P.p}, "
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


if __name__ == "__main__":
    main()
