"""Mailbox (RMA window) progress strategies on a live-like workload, against a raw Put+Flush rate.

Question (spec §6, "Progress"): passive-target RMA may stall when the target makes no MPI calls.
Which idle hook (`Mailboxes(progress=...)`) keeps live ranks fastest? Run under MPI:

    mpiexec -n 8 python benchmarks/rma_progress.py      # oversubscribed on a 2-core machine
    mpiexec -n 2 python benchmarks/rma_progress.py [--blocks 3] [--wakeups 1500] [--launch throttle]
    mpiexec -n 2 python benchmarks/rma_progress.py --quick    # smoke test (seconds)

Workload: every rank hosts a block of --agents agents of a random graph with mean degree --degree
(ring + random chords, public seed); each rank runs --wakeups wake-ups, agents in a seeded random
order: read the agent's mailbox, ~--work-us of numpy work (a matvec, repetitions calibrated once
on rank 0), post the new vector (item doubles) to every neighbour, then `poll()`; with
--idle-us > 0 the rank then idles that long calling `poll()` (as it would while waiting for the
next clock tick). No barriers inside the loop. Strategies:

- none: poll() does nothing (only the rank's own read/post calls drive MPI progress);
- iprobe: poll() = Iprobe;  flush: poll() = Lock(self)/Win_flush_all/Unlock;
- sleep: poll() = time.sleep(rma.NAP_S);
- async: progress none in a second launch with MPICH_ASYNC_PROGRESS=1 (rank 0 runs
  `mpiexec` with that variable after the main run; the other ranks wait asleep).

Blocks interleave the raw rate (`rma.raw_put_rate`: Lock_all, Put+Flush to the next rank) and each
strategy, so a slow phase of the machine hits all of them. Printed per strategy: aggregate
wake-ups/s (all wake-ups / slowest rank's loop time) and Put calls/s, median and [min, max] over
blocks; the longest `post` and `read` call of any rank (a stalled exclusive lock shows here) and
the 99th percentile of post. It never asserts a time.

--quick (tests/test_benchmarks.py runs it on 2 ranks, the fewest with a remote target): QUICK's
sizes, every strategy busy (idle 0) and one relaunch (throttle; async is the slow one); options
given explicitly win.
"""

from __future__ import annotations

import argparse
import json
import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402
import scipy.sparse as sp  # noqa: E402
from mpi4py import MPI  # noqa: E402

from mpi_dp.comm import rma  # noqa: E402

#: --quick: the smallest meaningful case (options given explicitly win)
QUICK = {"agents": 8, "wakeups": 50, "idle_us": "0", "blocks": 2, "raw_puts": 500,
         "launch": "throttle"}


def random_graph(n: int, degree: float, seed: int) -> sp.csr_matrix:
    """Ring plus random chords, mean degree about `degree` (symmetric, sorted, zero diagonal)."""
    rng = np.random.default_rng(seed)
    extra = max(0, int(round(n * (degree - 2) / 2)))
    a, b = rng.integers(0, n, extra), rng.integers(0, n, extra)
    ring = np.arange(n)
    rows = np.concatenate([ring, a])
    cols = np.concatenate([(ring + 1) % n, b])
    keep = rows != cols
    A = sp.coo_matrix((np.ones(keep.sum()), (rows[keep], cols[keep])), shape=(n, n)).tocsr()
    A = ((A + A.T) > 0).astype(float).tocsr()
    A.sort_indices()
    return A


def calibrate(work_us: float, size: int = 160) -> int:
    """Repetitions of a (size x size) matvec that take about work_us on this rank."""
    M, x = np.random.default_rng(0).random((size, size)), np.ones(size)
    for _ in range(50):
        M @ x
    t0 = time.perf_counter()
    for _ in range(2000):
        M @ x
    one = (time.perf_counter() - t0) / 2000
    return max(1, int(round(work_us * 1e-6 / one)))


def live_block(comm: MPI.Comm, W: sp.csr_matrix, item: int, wakeups: int, reps: int,
               idle_s: float, progress: str, seed: int) -> dict:
    """One live run; returns this rank's figures."""
    M = np.random.default_rng(1).random((160, 160)) / 160
    x = np.ones(160)
    with rma.Mailboxes(comm, W, item, progress=progress) as mb:
        agents = mb.agents
        order = np.random.default_rng(seed + comm.rank).integers(0, len(agents), wakeups)
        outs = {int(i): np.empty((mb.degree(int(i)), item)) for i in agents}
        vec = np.zeros(item)
        t_post, t_read = np.zeros(wakeups), np.zeros(wakeups)
        fresh = 0
        polite = comm.Ibarrier()  # start together without spinning
        while not polite.Test():
            time.sleep(1e-4)
        t0 = time.perf_counter()
        for k in range(wakeups):
            i = int(agents[order[k]])
            ta = time.perf_counter()
            stamps, models = mb.read(i, outs[i])
            tb = time.perf_counter()
            fresh += int(np.sum(stamps >= 0))
            y = x
            for _ in range(reps):
                y = M @ x
            vec[:] = models.mean(axis=0) * 0.5 + y[0] if len(models) else y[0]
            tc = time.perf_counter()
            mb.post(i, float(k), vec)
            td = time.perf_counter()
            t_read[k], t_post[k] = tb - ta, td - tc
            mb.poll()
            if idle_s > 0:
                until = td + idle_s
                while time.perf_counter() < until:
                    mb.poll()
        loop_s = time.perf_counter() - t0
        puts = mb.puts
    return dict(loop_s=loop_s, wakeups=wakeups, puts=puts, fresh=fresh,
                post_max=float(t_post.max()), read_max=float(t_read.max()),
                post_p99=float(np.percentile(t_post, 99)))


#: relaunched strategies: environment of the second mpiexec (set before MPI init) and the
#: poll() modes measured under it
ENV_STRATEGIES = {
    "async": ({"MPICH_ASYNC_PROGRESS": "1"}, "none"),
    "throttle": ({"MPIR_CVAR_CH4_PROGRESS_THROTTLE": "1",
                  "MPIR_CVAR_CH4_PROGRESS_THROTTLE_NO_PROGRESS_COUNT": "1"}, "none,iprobe,nap"),
}


def run(args: argparse.Namespace) -> dict | None:
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    n = args.agents * size
    W = random_graph(n, args.degree, args.seed)
    reps = calibrate(args.work_us) if rank == 0 else 0
    rma.polite_barrier(comm)  # the others must not spin while rank 0 calibrates
    reps = comm.bcast(reps, root=0)
    strategies = args.strategies.split(",")
    idles = [float(x) for x in args.idle_us.split(",")]
    res: dict = {"raw": [], "blocks": {f"{s}@{idle:g}": [] for idle in idles for s in strategies}}
    for b in range(args.blocks):
        res["raw"].append(rma.raw_put_rate(comm, args.item, args.raw_puts))
        for idle in idles:
            for s in strategies:
                mine = live_block(comm, W, args.item, args.wakeups, reps, idle * 1e-6, s,
                                  args.seed + 7919 * b)
                every = comm.gather(mine, root=0)
                if rank == 0:
                    loop = max(r["loop_s"] for r in every)
                    res["blocks"][f"{s}@{idle:g}"].append(dict(
                        rate=sum(r["wakeups"] for r in every) / loop,
                        put_rate=sum(r["puts"] for r in every) / loop,
                        post_max=max(r["post_max"] for r in every),
                        post_p99=max(r["post_p99"] for r in every),
                        read_max=max(r["read_max"] for r in every)))
    if rank != 0:
        return None
    res["meta"] = dict(ranks=size, agents=n, edges=int(W.nnz // 2), item=args.item, reps=reps,
                       wakeups=args.wakeups, env=os.environ.get("MPI_DP_BENCH_ENV", ""))
    return res


def launch(args: argparse.Namespace, size: int, name: str) -> dict:
    """Rerun this script under ENV_STRATEGIES[name] and return its results (rank 0 only)."""
    extra, strategies = ENV_STRATEGIES[name]
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PMI_", "HYDI_", "HYDRA_", "MPI_LOCAL"))}
    env.update(extra, MPI_DP_BENCH_ENV=name)
    mpiexec = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    slow = name == "async"  # fewer, shorter blocks: it runs at a few per cent of the others
    wakeups = args.async_wakeups if slow else args.wakeups
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, f"{name}.json")
        cmd = [mpiexec, "-n", str(size), sys.executable, os.path.abspath(__file__),
               "--strategies", strategies, "--child", out] + _passthrough(args) \
            + ["--wakeups", str(wakeups)] + (["--blocks", str(min(2, args.blocks))] if slow else [])
        subprocess.run(cmd, env=env, check=True, timeout=args.launch_timeout)
        with open(out) as f:
            return json.load(f)


def _passthrough(args: argparse.Namespace) -> list[str]:
    return ["--agents", str(args.agents), "--degree", str(args.degree), "--item", str(args.item),
            "--work-us", str(args.work_us), "--blocks", str(args.blocks), "--raw-puts",
            str(args.raw_puts), "--idle-us", args.idle_us, "--seed", str(args.seed)]


def _med(xs: list[float]) -> str:
    return f"{np.median(xs):.0f} [{min(xs):.0f}, {max(xs):.0f}]"


def report(results: list[dict], quick: bool = False) -> None:
    m = results[0]["meta"]
    print(f"{'quick: ' if quick else ''}ranks {m['ranks']}, agents {m['agents']} "
          f"({m['agents'] // m['ranks']} per rank), edges {m['edges']}, item {m['item']}, "
          f"work {m['reps']} matvecs (~50 us)/wake-up, {m['wakeups']} wake-ups per rank per block, "
          f"{len(results[0]['raw'])} blocks")
    head = (f"{'idle us':>7s}  {'strategy':16s} {'wake-ups/s median [min, max]':>29s} "
            f"{'puts/s':>7s} {'raw Put+Flush/s median [min, max]':>34s} {'post max':>8s} "
            f"{'p99':>6s} {'read max':>8s}  (ms)")
    print(head)
    print("-" * len(head))
    rows = []
    for res in results:
        env = res["meta"]["env"]
        for key, blocks in res["blocks"].items():
            s, idle = key.split("@")
            rows.append((float(idle), f"{env}+{s}" if env else s, blocks, res["raw"]))
    for idle, name, blocks, raw in sorted(rows, key=lambda r: r[0]):
        print(f"{idle:7g}  {name:16s} {_med([b['rate'] for b in blocks]):>29s} "
              f"{np.median([b['put_rate'] for b in blocks]):7.0f} {_med(raw):>34s} "
              f"{1e3 * max(b['post_max'] for b in blocks):8.1f} "
              f"{1e3 * max(b['post_p99'] for b in blocks):6.1f} "
              f"{1e3 * max(b['read_max'] for b in blocks):8.1f}")
    print("env+mode rows: a separate mpiexec with that environment (raw rate measured there); "
          "async = MPICH_ASYNC_PROGRESS=1, throttle = MPIR_CVAR_CH4_PROGRESS_THROTTLE=1 "
          "(NO_PROGRESS_COUNT=1)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--agents", type=int, default=64, help="agents per rank")
    ap.add_argument("--degree", type=float, default=10.0)
    ap.add_argument("--item", type=int, default=10, help="doubles per payload")
    ap.add_argument("--wakeups", type=int, default=400, help="wake-ups per rank per block")
    ap.add_argument("--work-us", type=float, default=50.0)
    ap.add_argument("--idle-us", default="0,300",
                    help="comma list: idle time polled after each wake-up (0 = busy)")
    ap.add_argument("--blocks", type=int, default=3)
    ap.add_argument("--raw-puts", type=int, default=10000)
    ap.add_argument("--strategies", default=",".join(rma.PROGRESS))
    ap.add_argument("--launch", default="throttle,async",
                    help="relaunched environments (comma list of ENV_STRATEGIES; '' for none)")
    ap.add_argument("--async-wakeups", type=int, default=40,
                    help="wake-ups per rank per block under async progress (it is slow)")
    ap.add_argument("--launch-timeout", type=float, default=900.0)
    ap.add_argument("--seed", type=int, default=5)
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--quick", action="store_true",
                    help="smoke test (tests/test_benchmarks.py): "
                    + ", ".join(f"--{k.replace('_', '-')} {v}" for k, v in QUICK.items())
                    + " (options given explicitly win)")
    args = ap.parse_args()
    if args.quick:  # the smoke-test sizes, where not given explicitly
        for k, v in QUICK.items():
            if getattr(args, k) == ap.get_default(k):
                setattr(args, k, v)
    comm = MPI.COMM_WORLD
    res = run(args)
    if args.child:
        if comm.rank == 0:
            with open(args.child, "w") as f:
                json.dump(res, f)
        return
    results = [res]
    for name in filter(None, args.launch.split(",")):
        if comm.rank == 0:
            try:
                results.append(launch(args, comm.size, name))
            except (subprocess.SubprocessError, OSError) as e:
                print(f"{name} launch failed: {e}", flush=True)
        rma.polite_barrier(comm, nap=1e-2)  # the others sleep while the child runs
    if comm.rank == 0:
        report(results, args.quick)


if __name__ == "__main__":
    main()
