"""DP-ADMM on MNIST (10 agents): GEMM efficiency of an iteration, and vectorised runs vs a loop.

Seed 002 (ObjT, eps_bar = 0.1, the MNIST penalty constants), in one process
(`Star(MPI.COMM_SELF, 10)`: server and agents on one rank, no mpiexec), one BLAS thread.

1. Efficiency (issue 15 item 3). One iteration is `admm.iterate` (the server's average, then
   every agent's step: gradient pass over its records, sensitivity, Laplace draws, trust-region
   update, dual update). Its GEMMs, per agent p with n_p records and R runs
   (multinomial.grad_sum_and_terms_max, per row chunk X_c of the records):

       scores    S^T = W^T X_c^T     (R K x J)(J x rows)
       gradient  G^T += D^T X_c      (R K x rows)(rows x J)

   i.e. 2 * 2 n_p J R K FLOPs per agent (2 m n k per GEMM), 4 I J R K per iteration (I = sum n_p).
   achieved = those FLOPs / wall time of the whole iteration (everything it does, not only its
   GEMMs); peak = the same FLOPs of agent 0 / the best time of np.dot on the same shapes in the
   same process (out= buffers, contiguous operands), the larger of: the chunk shapes the code uses,
   and one unchunked GEMM pair over all n_0 rows. The GEMM-only share is the time spent inside
   the iteration's GEMMs (np.matmul timed in one extra instrumented iteration per block) over that
   iteration's wall time. Because the machine may be shared and noisy, the measurement is
   interleaved in --blocks blocks (--iters iterations, one instrumented iteration, --reps GEMM
   repetitions each); each block takes the best time of each, and the summary gives the median
   and the spread (min-max) over the blocks, and achieved / peak (goal >= 0.7).

2. Vectorised runs (DESIGN.md): R = 1 (run_ids = (0,)), R = --runs vectorised (one run_config),
   and a loop of --runs single-run calls; each call runs --T iterations and records at t = 0
   and t = T (evaluation included in its time). The loop's final models must equal the
   vectorised ones (same seeds) up to GEMM rounding: the largest difference is printed.
   --no-loop skips this part.

Times are printed, never asserted.

    OPENBLAS_NUM_THREADS=1 python benchmarks/admm_mnist.py --data /tmp/mnist.h5 [--runs 20]
    (data: mpi-dp data prepare mnist --source ../shared/data --out /tmp/mnist.h5)
    python benchmarks/admm_mnist.py --quick    # smoke test on synthetic data, no file (seconds)

--quick (tests/test_benchmarks.py runs it) needs no file: MNIST-like synthetic records made in
memory (mpi_dp.data.synth.synth_multiclass: features in [0, 1], QUICK_DATA's shapes), R = 4, two
blocks of one iteration, T = 2, both parts; --data given explicitly reads that file instead.
"""

from __future__ import annotations

import argparse
import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import time  # noqa: E402

import numpy as np  # noqa: E402
from mpi4py import MPI  # noqa: E402

from mpi_dp.algorithms import admm  # noqa: E402
from mpi_dp.comm.star import Star  # noqa: E402
from mpi_dp.data import ShardFile  # noqa: E402
from mpi_dp.models import multinomial  # noqa: E402
from mpi_dp.privacy import rules  # noqa: E402
from mpi_dp.privacy.contract import Contract  # noqa: E402

#: the per-iteration eps_bar of the benchmark (the paper's rule)
EPS_BAR = 0.1
#: --quick: the smallest meaningful case (options given explicitly win)
QUICK = {"runs": 4, "blocks": 2, "iters": 1, "reps": 1, "T": 2}
#: --quick's synthetic records: agents, records per agent, features J, classes K, noise, seed
QUICK_DATA = {"n_agents": 3, "records": 200, "dim": 64, "classes": 10, "noise": 0.35, "seed": 2}


def load(path: str) -> tuple[list[tuple[np.ndarray, np.ndarray]], int]:
    shard = ShardFile(path)
    agents = [shard.read_agent(i) for i in range(shard.n_agents)]
    K = 1 + int(max(y.max() for _, y in agents))
    return [(np.asarray(X, dtype=np.float64), y) for X, y in agents], K


def synthetic() -> tuple[list[tuple[np.ndarray, np.ndarray]], int]:
    """QUICK_DATA's MNIST-like records (in memory, no file): (agents' (X, y), K)."""
    from mpi_dp.data.synth import synth_multiclass

    q = QUICK_DATA
    made = synth_multiclass(q["n_agents"], q["records"], q["dim"], q["noise"], q["seed"],
                            classes=q["classes"], test=0)
    return [(np.ascontiguousarray(X), y) for X, y in made["agents"]], q["classes"]


def settings(data, K: int, run_ids: tuple[int, ...], T: int) -> admm.Settings:
    J = data[0][0].shape[1]
    return admm.Settings(method="objt", T=T, n=tuple(len(y) for _, y in data), J=J,
                         K=K, run_ids=run_ids, record_every=T)


def contract(s: admm.Settings) -> Contract:
    """The paper's rule at eps_bar = EPS_BAR per iteration, T releases per agent."""
    return Contract.planned(rules.PerIteration(), "laplace", s.T, [EPS_BAR] * s.P,
                            seed=s.seed, run_ids=s.run_ids)


def timed_run(data, K: int, run_ids: tuple[int, ...], T: int) -> tuple[float, np.ndarray]:
    """Seconds per iteration of one run_config call (agents built outside the timing)."""
    s = settings(data, K, run_ids, T)
    con = contract(s)
    agents = [admm.Agent(i, X, y, s, con) for i, (X, y) in enumerate(data)]
    t0 = time.perf_counter()
    out = admm.run_config(Star(MPI.COMM_SELF, len(data)), agents, s, con, None, None,
                          progress=False)
    return (time.perf_counter() - t0) / T, out["models/final"]


class GemmClock:
    """Times every np.matmul call (the GEMMs of multinomial) while installed; counts 2 m n k."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.flops = 0
        self._orig = np.matmul

    def __enter__(self) -> GemmClock:
        orig = self._orig

        def timed(a, b, *args, **kwargs):
            t0 = time.perf_counter()
            out = orig(a, b, *args, **kwargs)
            self.seconds += time.perf_counter() - t0
            # (..., m, k) @ (..., k, n): 2 m k n per matrix of the broadcast stack (the agents
            # of equal record count are one stacked matmul since issue 29)
            sa, sb = np.shape(a), np.shape(b)
            stack = int(np.prod(np.broadcast_shapes(sa[:-2], sb[:-2])))
            self.flops += 2 * stack * sa[-2] * sa[-1] * sb[-1]
            return out

        np.matmul = timed
        return self

    def __exit__(self, *exc) -> None:
        np.matmul = self._orig


def best(f, reps: int) -> float:
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        f()
        times.append(time.perf_counter() - t0)
    return min(times)


def efficiency(data, K: int, R: int, blocks: int, iters: int, reps: int) -> None:
    s = settings(data, K, tuple(range(R)), 10**6)
    # the hosted agents as one block, kept across iterations (as the runner does)
    con = contract(s)
    agents = admm.AgentBlock([admm.Agent(i, X, y, s, con) for i, (X, y) in enumerate(data)], s,
                             con)
    star = Star(MPI.COMM_SELF, len(agents))
    state = {"w": np.zeros((R, s.J, s.K)), "t": 0}

    def step() -> None:
        t = state["t"]
        state["w"] = admm.iterate(star, agents, s, state["w"], t, agents.rho(t))
        state["t"] = t + 1

    flops = 4 * s.I * s.J * R * s.K  # scores + gradient GEMM of every agent
    # the same GEMMs for agent 0, with np.dot into preallocated buffers
    X0, n0 = agents.agents[0].X, agents.agents[0].n
    flops0 = 4 * n0 * s.J * R * s.K
    Wt = np.ascontiguousarray(agents.z[0].transpose(0, 2, 1)).reshape(R * s.K, s.J) + 0.01
    St, Gt = np.empty((R * s.K, n0)), np.empty((R * s.K, s.J))
    chunks = list(multinomial._chunks(n0, R, s.K))
    bufs = [np.empty((R * s.K, c.stop - c.start)) for c in chunks]

    def gemms_chunked() -> None:
        for c, b in zip(chunks, bufs, strict=True):
            np.dot(Wt, X0[c].T, out=b)
            np.dot(b, X0[c], out=Gt)

    def gemms_whole() -> None:
        np.dot(Wt, X0.T, out=St)
        np.dot(St, X0, out=Gt)

    print(f"efficiency: R = {R} runs; GEMMs per iteration: {len(agents)} agents x 2 GEMMs per "
          f"chunk of {[c.stop - c.start for c in chunks]} rows = {flops / 1e9:.2f} GFLOP "
          f"(4 I J R K); {blocks} blocks of {iters} iterations + 1 instrumented + {reps} GEMM reps")
    step()  # warm-up (first touch of every buffer)
    rows = []
    for b in range(blocks):
        it = best(step, iters)
        with GemmClock() as clock:
            t0 = time.perf_counter()
            step()
            inst = time.perf_counter() - t0
        if clock.flops != flops:
            raise RuntimeError(f"GEMM FLOPs counted {clock.flops} != defined {flops}")
        ch, wh = best(gemms_chunked, reps), best(gemms_whole, reps)
        achieved, p_ch, p_wh = flops / it / 1e9, flops0 / ch / 1e9, flops0 / wh / 1e9
        peak = max(p_ch, p_wh)
        rows.append((achieved, peak, achieved / peak, clock.seconds / inst, it))
        print(f"  block {b + 1}: iteration {it:.3f} s -> achieved {achieved:6.2f} GFLOP/s; DGEMM "
              f"peak {peak:6.2f} (chunked {p_ch:.2f}, whole {p_wh:.2f}); ratio {achieved / peak:.3f}; "
              f"GEMM-only share {clock.seconds / inst:.1%} (GEMMs {clock.seconds:.3f} s of "
              f"{inst:.3f} s, {flops / clock.seconds / 1e9:.2f} GFLOP/s inside the iteration)")
    a = np.array(rows)
    med = np.median(a, axis=0)

    def spread(j: int, fmt: str) -> str:
        return f"{format(a[:, j].min(), fmt)}-{format(a[:, j].max(), fmt)}"

    print(f"  medians over {blocks} blocks (spread min-max): iteration {med[4]:.3f} s "
          f"({spread(4, '.3f')}), achieved {med[0]:.2f} ({spread(0, '.2f')}) GFLOP/s, peak "
          f"{med[1]:.2f} ({spread(1, '.2f')}) GFLOP/s, per-block ratio {med[2]:.3f} "
          f"({spread(2, '.3f')}), GEMM-only share {med[3]:.1%} ({spread(3, '.1%')})")
    print(f"ADMM GEMM efficiency: achieved {med[0]:.2f} GFLOP/s / DGEMM peak {med[1]:.2f} GFLOP/s "
          f"= {med[0] / med[1]:.2f} (goal >= 0.7)")


def vectorised_vs_loop(data, K: int, R: int, T: int) -> None:
    print(f"vectorised runs: T = {T} iterations per call (records at t = 0 and T included)")
    one, _ = timed_run(data, K, (0,), T)
    vec, w_vec = timed_run(data, K, tuple(range(R)), T)
    loop_times, finals = [], []
    for r in range(R):
        t, w = timed_run(data, K, (r,), T)
        loop_times.append(t)
        finals.append(w[0])
    loop = float(np.sum(loop_times))
    diff = float(np.max(np.abs(np.array(finals) - w_vec)))
    print(f"R = 1:                    {one:8.3f} s per iteration")
    print(f"R = {R} vectorised:        {vec:8.3f} s per iteration ({vec / R:.4f} s per run)")
    print(f"loop of {R} single runs:   {loop:8.3f} s per iteration of all {R} runs")
    print(f"ratio loop / vectorised = {loop / vec:.2f}; largest |w_loop - w_vectorised| = "
          f"{diff:.2e}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", default="data/mnist.h5",
                    help="MNIST shard file (mpi-dp data prepare mnist)")
    ap.add_argument("--runs", type=int, default=20, help="R, Monte-Carlo runs vectorised")
    ap.add_argument("--blocks", type=int, default=5, help="interleaved efficiency blocks")
    ap.add_argument("--iters", type=int, default=3, help="timed iterations per block")
    ap.add_argument("--reps", type=int, default=3, help="DGEMM repetitions per block and shape")
    ap.add_argument("--T", type=int, default=5, help="iterations per call (vectorised vs loop)")
    ap.add_argument("--no-loop", action="store_true", help="skip the vectorised-vs-loop part")
    ap.add_argument("--quick", action="store_true",
                    help="smoke test on synthetic data, no file (tests/test_benchmarks.py): "
                    + ", ".join(f"--{k} {v}" for k, v in QUICK.items())
                    + f", records {QUICK_DATA} (options given explicitly win)")
    args = ap.parse_args()
    synth = False
    if args.quick:  # the smoke-test sizes, where not given explicitly
        for k, v in QUICK.items():
            if getattr(args, k) == ap.get_default(k):
                setattr(args, k, v)
        synth = args.data == ap.get_default("data")
    data, K = synthetic() if synth else load(args.data)
    what = ("quick, synthetic MNIST-like records (synth_multiclass)" if synth
            else f"quick, {args.data}" if args.quick else args.data)
    print(f"{len(data)} agents x {len(data[0][1])} records, J = {data[0][0].shape[1]}, K = {K} "
          f"({what}); ObjT, eps_bar = 0.1; "
          f"OPENBLAS_NUM_THREADS={os.environ.get('OPENBLAS_NUM_THREADS')}")
    efficiency(data, K, args.runs, args.blocks, args.iters, args.reps)
    if not args.no_loop:
        vectorised_vs_loop(data, K, args.runs, args.T)


if __name__ == "__main__":
    main()
