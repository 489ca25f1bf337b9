"""Learner updates per second of the live asynchronous star against a raw mpi4py ping-pong.

Issue goal: in live mode (8 owners, d = 10) the learner's update rate is at least half the rate of
a raw buffer-based ping-pong measured in the same run between the same ranks (the protocol costs
at most one extra round trip). Run under MPI (rank 0 = learner, owners in blocks on the others):

    mpiexec -n 3 python benchmarks/async_rate.py [--owners 8] [--dim 10] [--records 100] [--T 2000]

1. Ping-pong: rank 0 sends a QRY-sized float64 buffer to each host in turn and waits for an
   RSP-sized one back (blocking Send/Recv), `--pings` times per host; the other hosts wait
   politely (Iprobe + sleep), as idle hosts do in the protocol. Rate = round trips per second.
2. Live run: `async_star.run_config` in live mode with the owner_request protocol and a clock so
   fast that every owner always has a request queued (the learner is never idle), T updates,
   one run, psi recorded only at k = 0 and k = T. Rate = T / wall seconds of the run loop.
Also prints the learner's median query-to-answer time and the owners' gradient time, so the
gap between the two rates can be split into messaging and computing.
"""

from __future__ import annotations

import argparse
import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import time  # noqa: E402

import numpy as np  # noqa: E402
from mpi4py import MPI  # noqa: E402

from mpi_dp.algorithms import async_star  # noqa: E402
from mpi_dp.algorithms.common import LocalShard, Oracle, reference_quantities  # noqa: E402
from mpi_dp.comm.p2p_star import P2PStar, wait_message  # noqa: E402
from mpi_dp.comm.star import Star  # noqa: E402
from mpi_dp.data.synth import synth_regression  # noqa: E402

PING, PONG, DONE = 91, 92, 93


def ping_pong(comm: MPI.Comm, hosts: list[int], n_send: int, n_back: int, pings: int) -> float:
    """Round trips per second between rank 0 and each host (hosts served one after another)."""
    rank = comm.Get_rank()
    out, back = np.zeros(n_send), np.zeros(n_back)
    comm.Barrier()
    if rank == 0:
        t0 = time.perf_counter()
        for h in hosts:
            for _ in range(pings):
                comm.Send([out, MPI.DOUBLE], dest=h, tag=PING)
                comm.Recv([back, MPI.DOUBLE], source=h, tag=PONG)
            comm.Send([out[:1], MPI.DOUBLE], dest=h, tag=DONE)
        return len(hosts) * pings / (time.perf_counter() - t0)
    if rank in hosts:
        while True:
            st = wait_message(comm, 0, MPI.ANY_TAG)
            if st.Get_tag() == DONE:
                comm.Recv([out[:1], MPI.DOUBLE], source=0, tag=DONE)
                return 0.0
            comm.Recv([out, MPI.DOUBLE], source=0, tag=PING)
            while True:  # the rest of this host's turn: plain blocking receives
                comm.Send([back, MPI.DOUBLE], dest=0, tag=PONG)
                st = MPI.Status()
                comm.Probe(0, MPI.ANY_TAG, st)
                if st.Get_tag() == DONE:
                    comm.Recv([out[:1], MPI.DOUBLE], source=0, tag=DONE)
                    return 0.0
                comm.Recv([out, MPI.DOUBLE], source=0, tag=PING)
    return 0.0


def compute_cost(s: async_star.Settings, data: dict, reps: int = 2000) -> float:
    """Seconds per update of the computing alone: owner 0 answers, the learner updates."""
    owner = async_star.DataOwner(LocalShard(0, *data["agents"][0]), s.eps[0], 10**9, s)
    learner = async_star.Learner(s, np.zeros((1, s.p)))
    runs, own = np.array([0]), np.array([0])
    t0 = time.perf_counter()
    for _ in range(reps):
        tb = learner.query_points(runs, own)
        _, r = owner.answer(runs, tb)
        learner.update(runs, own, tb, r)
    return (time.perf_counter() - t0) / reps


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--owners", type=int, default=8)
    ap.add_argument("--dim", type=int, default=10)
    ap.add_argument("--records", type=int, default=100, help="records per owner")
    ap.add_argument("--T", type=int, default=2000, help="live updates to time")
    ap.add_argument("--pings", type=int, default=2000, help="round trips per host")
    ap.add_argument("--protocol", default="owner_request",
                    choices=("owner_request", "learner_broadcast"))
    args = ap.parse_args()
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    if size < 2:
        raise SystemExit("run under mpiexec with at least 2 ranks (learner + owner hosts)")
    N, p = args.owners, args.dim
    star = Star(comm, N)
    link = P2PStar(comm, star.layout, p)
    data = synth_regression(N, args.records, p, 0.25, seed=1, public=0)
    shards = [LocalShard(i, *data["agents"][i]) for i in star.local_agents]
    n = tuple([args.records] * N)
    s = async_star.Settings(
        T=args.T, loss="squared", lam=1e-5, theta_max=10.0, theta0=0.0, init="const", xi=1.0,
        clip=True, rho=0.5, central_step="proof", eps=tuple([10.0] * N), n=n,
        caps=tuple([args.T] * N), p=p, seed=1, run_ids=(0,), record_every=args.T, mode="live",
        protocol=args.protocol, clock_unit_s=1e-6, poll_interval_s=1e-5)
    oracle = Oracle(star, shards, s.loss, s.lam, s.n_total, p)
    ref = reference_quantities(oracle, s.theta_max, "closed")

    # the sizes of a one-run QRY and RSP of this protocol
    pp = ping_pong(comm, link.hosts, 2 + (2 + p), 2 + (3 + p), args.pings)

    t0 = time.perf_counter()
    out = async_star.run_config(star, link, shards, s, ref, None, progress=False)
    wall = time.perf_counter() - t0
    if rank == 0:
        tr = out["trace"]
        k = int(np.sum(tr.owner[0] >= 0))
        rate = k / wall
        shares = np.bincount(tr.owner[0][tr.owner[0] >= 0], minlength=N) / max(k, 1)
        print(f"ranks {size} ({len(link.hosts)} owner hosts), {N} owners, d = {p}, "
              f"{args.records} records per owner, protocol {args.protocol}")
        print(f"raw ping-pong (QRY/RSP-sized buffers): {pp:10.0f} round trips/s "
              f"({1e6 / pp:.1f} us each)")
        print(f"live learner updates:                 {rate:10.0f} updates/s "
              f"({1e6 / rate:.1f} us each; {k} updates in {wall:.2f} s incl. start/stop)")
        print(f"median query-to-answer time at the learner: {np.nanmedian(tr.rtt) * 1e6:.1f} us")
        print(f"owner shares of the updates: {np.array2string(shares, precision=3)}")
        comp = compute_cost(s, data)
        per = 1.0 / rate
        print(f"computing per update, timed in one process (owner answer + learner update): "
              f"{comp * 1e6:.1f} us")
        print(f"messaging and waiting per update (per-update time - computing): "
              f"{(per - comp) * 1e6:.1f} us = {(per - comp) * pp:.2f} ping-pong round trips")
        print(f"ratio updates / ping-pong = {rate / pp:.3f} (goal >= 0.5)")


if __name__ == "__main__":
    main()
