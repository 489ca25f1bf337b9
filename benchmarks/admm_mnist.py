"""Seconds per DP-ADMM iteration on MNIST (10 agents): R = 1, R = 20 vectorised, 20 single runs.

DESIGN.md promises vectorised Monte-Carlo runs: the R runs of a configuration are a leading axis,
so each agent's pass over its 6,000 x 784 records is one GEMM with 10 R columns instead of R GEMMs
with 10 columns. This script measures that for seed 002 (ObjT, eps_bar = 0.1, the MNIST penalty
constants) in one process (`Star(MPI.COMM_SELF, 10)`: server and agents on one rank, no mpiexec):

  R = 1:      one run_config with run_ids = (0,)
  R = 20:     one run_config with run_ids = range(20)
  loop:       20 run_config calls with run_ids = (r,), r = 0..19

Each call runs --T iterations (default 5; times are per iteration, set-up excluded) and records only
at t = T. The loop's final models must equal the vectorised ones (same seeds) up to GEMM rounding:
the script prints the largest difference. Times are printed, never asserted.

    OPENBLAS_NUM_THREADS=1 python benchmarks/admm_mnist.py [--data data/mnist.h5] [--T 5]
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


def load(path: str) -> tuple[list[tuple[np.ndarray, np.ndarray]], int]:
    shard = ShardFile(path)
    agents = [shard.read_agent(i) for i in range(shard.n_agents)]
    K = 1 + int(max(y.max() for _, y in agents))
    return [(np.asarray(X, dtype=np.float64), y) for X, y in agents], K


def timed_run(data, K: int, run_ids: tuple[int, ...], T: int) -> tuple[float, np.ndarray]:
    """Seconds per iteration of one run_config call (agents built outside the timing)."""
    J = data[0][0].shape[1]
    s = admm.Settings(method="objt", T=T, eps_bar=0.1, n=tuple(len(y) for _, y in data), J=J,
                      K=K, run_ids=run_ids, record_every=T)
    agents = [admm.Agent(i, X, y, s) for i, (X, y) in enumerate(data)]
    t0 = time.perf_counter()
    out = admm.run_config(Star(MPI.COMM_SELF, len(data)), agents, s, None, None, progress=False)
    return (time.perf_counter() - t0) / T, out["models/final"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", default="data/mnist.h5",
                    help="MNIST shard file (mpi-dp data prepare mnist)")
    ap.add_argument("--T", type=int, default=5, help="iterations per call")
    ap.add_argument("--runs", type=int, default=20)
    args = ap.parse_args()
    data, K = load(args.data)
    R = args.runs
    print(f"{len(data)} agents x {len(data[0][1])} records, J = {data[0][0].shape[1]}, K = {K}; "
          f"ObjT, eps_bar = 0.1, T = {args.T} iterations per call")
    one, _ = timed_run(data, K, (0,), args.T)
    vec, w_vec = timed_run(data, K, tuple(range(R)), args.T)
    loop_times, finals = [], []
    for r in range(R):
        t, w = timed_run(data, K, (r,), args.T)
        loop_times.append(t)
        finals.append(w[0])
    loop = float(np.sum(loop_times))
    diff = float(np.max(np.abs(np.array(finals) - w_vec)))
    print(f"R = 1:                    {one:8.3f} s per iteration")
    print(f"R = {R} vectorised:        {vec:8.3f} s per iteration ({vec / R:.4f} s per run)")
    print(f"loop of {R} single runs:   {loop:8.3f} s per iteration of all {R} runs")
    print(f"ratio loop / vectorised = {loop / vec:.2f}; largest |w_loop - w_vectorised| = "
          f"{diff:.2e}")


if __name__ == "__main__":
    main()
