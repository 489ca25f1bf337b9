"""Learner updates per second of the live asynchronous star against a raw mpi4py ping-pong.

Issue goal: in live mode (8 owners, d = 10) the learner's update rate is at least half the rate of
a raw buffer-based ping-pong measured in the same run between the same ranks (the protocol costs
at most one extra round trip). Run under MPI (rank 0 = learner, owners in blocks on the others):

    mpiexec -n 3 python benchmarks/async_rate.py [--owners 8] [--dim 10] [--records 100] [--T 2000]
    mpiexec -n 9 python benchmarks/async_rate.py          # one owner per host (oversubscribed)
    mpiexec -n 2 python benchmarks/async_rate.py --quick  # smoke test (tests/test_benchmarks.py)

The two measurements are interleaved in `--blocks` blocks (default 5), each a ping-pong burst
followed at once by a live run, so that both see the same machine load; the ratio is taken per
block and the medians and spreads (max / min over the blocks) are printed. On a shared machine the
load changes from second to second: where a rate's spread exceeds `--max-spread` (2x) the output
says plainly that the ratio is meaningless.

1. Ping-pong: rank 0 sends a QRY-sized float64 buffer to each host in turn and waits for an
   RSP-sized one back (blocking Send/Recv), `--pings` times per host; the other hosts wait
   politely, probing every millisecond (a fixed policy, independent of the library's waiting
   knobs). Rate = round trips / s. A short unmeasured burst comes first (warm-up).
2. Live run: `async_star.run_config` in live mode with the owner_request protocol and a clock so
   fast that every owner always has a request queued (the learner is never idle), T updates,
   one run, psi recorded only at k = 0 and k = T. Rate = (k - 1) / (time of the last update -
   time of the first), the learner's steady state (set-up and stop are left out; the wall rate of
   the whole run_config call is printed beside it).
3. Profile: the learner's mean query-to-answer time (send QRY .. RSP received) splits the time
   per update into the learner's own work (REQ receive, query point, update, trace) and the round
   trip to the owner; the owner's answer and the learner's update are also timed in one process,
   so the round trip splits into the owner's computing and messaging + waking up.
"""

from __future__ import annotations

import argparse
import json
import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import dataclasses  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402
from mpi4py import MPI  # noqa: E402

from mpi_dp.algorithms import async_star  # noqa: E402
from mpi_dp.algorithms.common import LocalShard, Oracle, reference_quantities  # noqa: E402
from mpi_dp.comm.p2p_star import P2PStar  # noqa: E402
from mpi_dp.comm.star import Star  # noqa: E402
from mpi_dp.data.synth import synth_regression  # noqa: E402
from mpi_dp.privacy import rules  # noqa: E402
from mpi_dp.privacy.contract import Contract  # noqa: E402

PING, PONG, DONE = 91, 92, 93
#: how long a host not in turn naps between probes during the ping-pong
IDLE_NAP_S = 1e-3
#: timed calls of each computation in the one-process profile
PROFILE_REPS = 3000
#: --quick: the smallest meaningful case (2 blocks; runs on 2 ranks, one owner host)
QUICK = {"owners": 4, "records": 50, "T": 200, "pings": 200, "blocks": 2, "profile_reps": 200}


def ping_pong(comm: MPI.Comm, hosts: list[int], n_send: int, n_back: int, pings: int) -> float:
    """Round trips per second between rank 0 and each host (hosts served one after another).

    The pair in turn uses blocking Send / Recv / Probe (MPICH busy-polls); the hosts not in turn
    nap IDLE_NAP_S between probes, a fixed policy of this benchmark (not the library's tuning),
    so that they disturb the pair as little as a polling rank can and the reference does not move
    with the protocol's waiting knobs."""
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
        st = MPI.Status()
        while not comm.Iprobe(0, MPI.ANY_TAG, st):
            time.sleep(IDLE_NAP_S)
        if st.Get_tag() == DONE:
            comm.Recv([out[:1], MPI.DOUBLE], source=0, tag=DONE)
            return 0.0
        comm.Recv([out, MPI.DOUBLE], source=0, tag=PING)
        while True:  # this host's turn: plain blocking calls
            comm.Send([back, MPI.DOUBLE], dest=0, tag=PONG)
            comm.Probe(0, MPI.ANY_TAG, st)
            if st.Get_tag() == DONE:
                comm.Recv([out[:1], MPI.DOUBLE], source=0, tag=DONE)
                return 0.0
            comm.Recv([out, MPI.DOUBLE], source=0, tag=PING)
    return 0.0


def settings(N: int, p: int, records: int, T: int, protocol: str) -> async_star.Settings:
    """The live run's settings: N owners of `records` records, each capped at T answers, a clock
    so fast that every owner always has a request queued."""
    return async_star.Settings(
        T=T, loss="squared", lam=1e-5, theta_max=10.0, theta0=0.0, init="const", xi=1.0,
        clip=True, rho=0.5, central_step="proof", eps=tuple([10.0] * N), n=tuple([records] * N),
        caps=tuple([T] * N), p=p, seed=1, run_ids=(0,), record_every=T, mode="live",
        protocol=protocol, clock_unit_s=1e-6, poll_interval_s=1e-5)


def _timed(f, reps: int) -> float:
    f()
    t0 = time.perf_counter()
    for _ in range(reps):
        f()
    return (time.perf_counter() - t0) / reps


def _contract(s: async_star.Settings) -> Contract:
    """The owners' contract: the paper's basic split of eps over their caps."""
    return Contract.planned(rules.BasicSplit(), "laplace", list(s.caps), s.eps, seed=s.seed,
                            run_ids=s.run_ids)


def compute_cost(s: async_star.Settings, data: dict, reps: int = PROFILE_REPS
                 ) -> tuple[float, float]:
    """Seconds per update of the computing alone, timed in one process: (owner 0's answer, the
    learner's query point + update), through the calls the live path makes."""
    # owner 0 answers reps + 1 times (_timed's warm-up; + 1 more on the general path): its plan
    # covers reps + 2 releases. The live run's caps (T) allow fewer: 3,000 timed answers on a plan
    # of 2,000 made its ledger refuse release 2,001 (BudgetExceededError). Only the noise scale
    # differs from the live run's owners.
    sc = dataclasses.replace(s, caps=tuple([reps + 2] * s.N))
    owner = async_star.DataOwner(LocalShard(0, *data["agents"][0]),
                                 async_star.owner_release(_contract(sc), 0, sc), sc.caps[0], sc)
    learner = async_star.Learner(s, np.zeros((1, s.p)))
    runs, own = np.arange(s.runs), np.zeros(s.runs, dtype=np.int64)
    tb = learner.query_points(runs, own)
    if hasattr(owner, "answer_into"):  # the live fast path (this version)
        status, resp = np.zeros(s.runs), np.zeros((s.runs, s.p))

        def answer():
            owner.answer_into(runs, tb, status, resp)

        def learn():
            learner.query_points_into(0, tb)
            learner.update_owner(0, tb, resp)
    else:  # the general calls (older versions)
        _, resp = owner.answer(runs, tb)

        def answer():
            owner.answer(runs, tb)

        def learn():
            learner.update(runs, own, learner.query_points(runs, own), resp)
    return _timed(answer, reps), _timed(learn, reps)


def _spread(x: np.ndarray) -> float:
    return float(np.max(x) / np.min(x)) if np.min(x) > 0 else float("inf")


def _line(name: str, x: np.ndarray, unit: str, fmt: str = "{:10.0f}") -> str:
    return (f"{name:<28} median {fmt.format(np.median(x))} {unit}  min {fmt.format(np.min(x))}  "
            f"max {fmt.format(np.max(x))}  spread (max/min) {_spread(x):.2f}x")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--owners", type=int, default=8)
    ap.add_argument("--dim", type=int, default=10)
    ap.add_argument("--records", type=int, default=100, help="records per owner")
    ap.add_argument("--T", type=int, default=2000, help="live updates per block")
    ap.add_argument("--pings", type=int, default=2000, help="round trips per host per block")
    ap.add_argument("--blocks", type=int, default=5,
                    help="interleaved blocks (ping-pong burst, then a live run)")
    ap.add_argument("--max-spread", type=float, default=2.0,
                    help="a rate whose max/min over the blocks exceeds this makes the ratio "
                         "meaningless")
    ap.add_argument("--protocol", default="owner_request",
                    choices=("owner_request", "learner_broadcast"))
    ap.add_argument("--json", help="also write the per-block figures to this JSON file")
    ap.add_argument("--profile-reps", type=int, default=PROFILE_REPS,
                    help="timed calls of the owner's answer and of the learner's step in the "
                    "one-process profile")
    ap.add_argument("--quick", action="store_true",
                    help="smoke test (seconds; tests/test_benchmarks.py runs it under mpiexec -n "
                    "2): " + ", ".join(f"--{k.replace('_', '-')} {v}" for k, v in QUICK.items())
                    + " (options given explicitly win)")
    args = ap.parse_args()
    if args.quick:  # the smoke-test sizes, where not given explicitly
        for k, v in QUICK.items():
            if getattr(args, k) == ap.get_default(k):
                setattr(args, k, v)
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    if size < 2:
        raise SystemExit("run under mpiexec with at least 2 ranks (learner + owner hosts)")
    N, p = args.owners, args.dim
    star = Star(comm, N)
    link = P2PStar(comm, star.layout, p)
    data = synth_regression(N, args.records, p, 0.25, seed=1, public=0)
    shards = [LocalShard(i, *data["agents"][i]) for i in star.local_agents]
    s = settings(N, p, args.records, args.T, args.protocol)
    oracle = Oracle(star, shards, s.loss, s.lam, s.n_total, p)
    ref = reference_quantities(oracle, s.theta_max, "closed")

    blocks = []  # (ping-pong rate, live rate, live wall rate, mean rtt, shares)
    ping_pong(comm, link.hosts, 2 + (2 + p), 2 + (3 + p), max(1, args.pings // 10))  # warm-up
    for _ in range(args.blocks):
        # the sizes of a one-run QRY and RSP of this protocol
        pp = ping_pong(comm, link.hosts, 2 + (2 + p), 2 + (3 + p), args.pings)
        comm.Barrier()
        t0 = time.perf_counter()
        out = async_star.run_config(star, link, shards, s, _contract(s), ref, None,
                                    progress=False)
        wall = time.perf_counter() - t0
        if rank == 0:
            tr = out["trace"]
            done = tr.owner[0] >= 0
            k = int(np.sum(done))
            times = tr.time[0][done]
            rate = (k - 1) / (times[-1] - times[0])
            shares = np.bincount(tr.owner[0][done], minlength=N) / max(k, 1)
            blocks.append((pp, rate, k / wall, float(np.nanmean(tr.rtt)), shares))
    if rank != 0:
        return
    pp = np.array([b[0] for b in blocks])
    live = np.array([b[1] for b in blocks])
    ratio = live / pp
    rtt = np.array([b[3] for b in blocks])
    print(f"{'quick: ' if args.quick else ''}ranks {size} ({len(link.hosts)} owner hosts), "
          f"{N} owners, d = {p}, {args.records} records per owner, protocol {args.protocol}, "
          f"{args.blocks} blocks of {args.pings} pings per host + T = {args.T} live updates")
    print("block  ping-pong/s  (us each)   updates/s  (us each)  ratio  mean rtt us  wall updates/s")
    for b, (ppb, lb, wb, rb, _) in enumerate(blocks):
        print(f"{b:5d}  {ppb:11.0f}  ({1e6 / ppb:7.1f})  {lb:10.0f}  ({1e6 / lb:7.1f})  "
              f"{lb / ppb:5.3f}  {rb * 1e6:11.1f}  {wb:14.0f}")
    print(_line("raw ping-pong round trips/s", pp, "/s"))
    print(_line("live learner updates/s", live, "/s"))
    print(_line("ratio updates / ping-pong", ratio, "", "{:10.3f}"))
    print(f"owner shares of the updates (last block): "
          f"{np.array2string(blocks[-1][4], precision=3)}")
    bad = [name for name, x in (("ping-pong", pp), ("live", live)) if _spread(x) > args.max_spread]
    if bad:
        print(f"VERDICT: MEANINGLESS. The {' and '.join(bad)} rate varied by more than "
              f"{args.max_spread:g}x between blocks (a shared or loaded machine): the ratio says "
              "nothing about the protocol. Run again on a quiet machine.")
    else:
        med = float(np.median(ratio))
        print(f"VERDICT: ratio median {med:.3f} (blocks {ratio.min():.3f} .. {ratio.max():.3f}); "
              f"goal >= 0.5 {'met' if med >= 0.5 else 'NOT met'}.")
    owner_s, learner_s = compute_cost(s, data, args.profile_reps)
    per = 1.0 / float(np.median(live))
    mrtt = float(np.median(rtt))
    print("profile per update (medians over the blocks, us):")
    print(f"  time per update                                  {per * 1e6:8.1f}")
    print(f"  learner's own work (REQ, query point, update...) {(per - mrtt) * 1e6:8.1f}"
          f"   of which query point + update timed alone {learner_s * 1e6:.1f}")
    print(f"  query-to-answer round trip                       {mrtt * 1e6:8.1f}"
          f"   of which owner's answer timed alone {owner_s * 1e6:.1f}")
    print(f"  raw ping-pong round trip                         {1e6 / np.median(pp):8.1f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"ranks": size, "pingpong": pp.tolist(), "live": live.tolist(),
                       "ratio": ratio.tolist(), "rtt_s": rtt.tolist(),
                       "wall": [b[2] for b in blocks], "owner_answer_s": owner_s,
                       "learner_step_s": learner_s,
                       "meaningless": bool(bad)}, f)


if __name__ == "__main__":
    main()
