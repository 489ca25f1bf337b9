"""Audited releases per second: `mpi-dp audit` (both worlds through the run path, R runs
vectorised, tap, statistics) against a plain NumPy loop that makes the same releases one at a
time (per run: its own generator, the owner's clipped mean gradient at theta_0, Laplace noise).

    python benchmarks/audit_rate.py [--runs 100000] [--blocks 3]      (one rank; or mpiexec)
    python benchmarks/audit_rate.py --quick     # smoke test: R = 200, 2 blocks (seconds)

Seed 001 shapes: the demo's regression shards (3 owners x 4000 records, d = 10), Alg. 2 at
eps = 1, T = 1, worst-case canary on owner 0. Interleaved blocks; prints the median and spread
of releases/s of each and their ratio (goal >= 50x). The shards are made in a temporary folder
(removed at the end); --quick (tests/test_benchmarks.py runs it) only shrinks R and the blocks.
"""

from __future__ import annotations

import argparse
import math
import pathlib
import shutil
import tempfile
import time

import numpy as np
from mpi4py import MPI

from mpi_dp.audit import run_audit
from mpi_dp.data import ShardFile
from mpi_dp.data.canary import make_worlds
from mpi_dp.data.synth import write_synth
from mpi_dp.models import linear

JOB = """name = "audit_rate"
algorithm = "sync_star"
variant = "alg2"
data = "{data}"
seed = 7
runs = 1
eps = 1.0
T = 1
loss = "squared"
lam = 1e-5
theta_max = 1e5
xi = {xi}
record_every = 1
"""
#: --quick: the smallest meaningful case (options given explicitly win)
QUICK = {"runs": 200, "blocks": 2}


def plain_loop(world: pathlib.Path, runs: int, xi: float, eps: float) -> np.ndarray:
    """Owner 0's first answer in each run, one run at a time (theta_0 = 0)."""
    with ShardFile(world) as shard:
        X, y = shard.read_agent(0)
    n, d = X.shape
    b = 2 * xi / (n * eps)  # Laplace scale of one query at eps (T = 1)
    out = np.empty((runs, d))
    theta = np.zeros((1, d))
    for r in range(runs):
        g = np.random.default_rng([7, 0, r])
        grad_sum, _ = linear.clipped_grad_sum("squared", X, y, theta, xi)
        out[r] = grad_sum[0] / n + g.laplace(0.0, b, d)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=100_000)
    ap.add_argument("--blocks", type=int, default=3)
    ap.add_argument("--quick", action="store_true",
                    help="smoke test (tests/test_benchmarks.py): "
                    + ", ".join(f"--{k} {v}" for k, v in QUICK.items())
                    + " (options given explicitly win)")
    a = ap.parse_args()
    if a.quick:  # the smoke-test sizes, where not given explicitly
        for k, v in QUICK.items():
            if getattr(a, k) == ap.get_default(k):
                setattr(a, k, v)
    comm = MPI.COMM_WORLD
    rank = comm.Get_rank()
    tmp = pathlib.Path(comm.bcast(tempfile.mkdtemp(prefix="audit_rate.") if rank == 0 else None))
    data = tmp / "demo.h5"
    if rank == 0:
        write_synth(data, "regression", 3, 4000, 10, 0.5, 1, public=10000)
        make_worlds(data, tmp, 0)
    comm.Barrier()
    xi = 10.0
    job = tmp / "job.toml"
    if rank == 0:
        job.write_text(JOB.format(data=data, xi=xi))
    comm.Barrier()
    if rank == 0:
        print(f"audit_rate{' (quick)' if a.quick else ''}: 3 owners x 4,000 records, d = 10, "
              f"R = {a.runs} runs, {a.blocks} blocks, {comm.Get_size()} rank(s)", flush=True)
    rows = []
    for blk in range(a.blocks):
        t0 = time.perf_counter()
        run_audit(str(job), out=str(tmp / f"a{blk}.h5"), runs=a.runs, comm=comm, progress=False)
        ours = 2 * a.runs / (time.perf_counter() - t0)
        base = math.nan
        if rank == 0:
            t0 = time.perf_counter()
            for w in ("world0.h5", "world1.h5"):
                plain_loop(tmp / w, a.runs, xi, 1.0)
            base = 2 * a.runs / (time.perf_counter() - t0)
            rows.append((ours, base))
            print(f"block {blk + 1}: audit {ours:,.0f} releases/s | plain loop {base:,.0f}/s | "
                  f"ratio {ours / base:.3g}", flush=True)
        comm.Barrier()
    if rank == 0:
        r = np.array(rows)
        for i, name in enumerate(("mpi-dp audit", "plain NumPy loop")):
            v = r[:, i]
            print(f"  {name:<18} median {np.median(v):12,.0f} releases/s  spread "
                  f"{v.max() / v.min():.2f}x")
        ratio = r[:, 0] / r[:, 1]
        print(f"  ratio (goal >= 50)  median {np.median(ratio):.3g}  spread "
              f"{ratio.max() / ratio.min():.2f}x  ({comm.Get_size()} rank(s), R = {a.runs}"
              f"{', quick' if a.quick else ''})")
    comm.Barrier()
    if rank == 0:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
