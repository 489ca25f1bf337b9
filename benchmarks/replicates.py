"""Vectorised Monte-Carlo replicates versus a Python loop of single runs (sync_star, Algorithm 2).

DESIGN.md promises that the R Monte-Carlo runs of a configuration are a leading array axis
(`runs x dim`), so one pass over each owner's shard serves every run (matrix-matrix products)
instead of R passes (matrix-vector products). This script measures that promise on the paper's
shapes (N = 3 owners, n_i = 250,000 records each, d = 10, R = 100 runs) in one process
(`Star(MPI.COMM_SELF, 3)`: the learner and all three owners on one rank, no mpiexec needed):

  vectorised: one `run_config` call with Settings.run_ids = range(R)
  loop:       R `run_config` calls with run_ids = (r,), r = 0..R-1

Both see the same data, the same reference optimum (computed once, outside the timing) and the
same seeded noise streams, so run r of the vectorised call must equal the r-th single run up to
GEMM-versus-GEMV rounding; the script prints the largest relative difference (goal <= 1e-10).

The paper uses T = 1000; the default here is T = 20 (scaled down: both timings are linear in T,
so the ratio is unaffected apart from the one-off set-up cost). Times are printed, never asserted.

Run:  OPENBLAS_NUM_THREADS=1 python benchmarks/replicates.py [--runs 100] [--T 20] [--n 250000]
      python benchmarks/replicates.py --quick      # smoke test (tests/test_benchmarks.py), seconds
"""

from __future__ import annotations

import argparse
import dataclasses
import os

# One BLAS thread, as under MPI (must be set before numpy is imported).
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")

import cProfile  # noqa: E402
import io  # noqa: E402
import pstats  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402
from mpi4py import MPI  # noqa: E402

from mpi_dp.algorithms import sync_star  # noqa: E402
from mpi_dp.algorithms.common import LocalShard, Oracle, reference_quantities  # noqa: E402
from mpi_dp.comm.star import Star  # noqa: E402
from mpi_dp.data.synth import synth_regression  # noqa: E402
from mpi_dp.models import linear, reference  # noqa: E402
from mpi_dp.privacy import rules  # noqa: E402
from mpi_dp.privacy.contract import Contract  # noqa: E402

PAPER_T = 1000
N_OWNERS = 3
LOSS, LAM, THETA_MAX, EPS, XI_QUANTILE, ALPHA = "squared", 1e-5, 1e5, 1.0, 0.99, 1.0
DEFAULT_CHUNK_ROWS = linear.chunk_rows
#: --quick: the smallest meaningful case (both paths, two blocks, the same table)
QUICK = {"runs": 4, "T": 3, "n": 2000, "blocks": 2}


def chunk_rows(mode, runs: int) -> int:
    """Rows per chunk for a call with `runs` runs under --chunk `mode`."""
    return DEFAULT_CHUNK_ROWS(runs) if mode == "default" else int(mode)


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0].rstrip(".") + ". Times R vectorised runs (one run_config call "
        "with a runs axis) against a Python loop of R single-run calls, in one process, and "
        "checks that both give the same final models.",
        epilog="Example: python benchmarks/replicates.py --runs 100 --T 20  (paper: T = 1000; "
        "T is scaled down by default, the ratio does not depend on T apart from set-up costs). "
        "OPENBLAS_NUM_THREADS=1 is set by the script unless already set.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--runs", type=int, default=100, help="Monte-Carlo runs R (paper: 100)")
    ap.add_argument("--T", type=int, default=20,
                    help=f"horizon: iterations per run (paper: {PAPER_T}; scaled down by default)")
    ap.add_argument("--n", type=int, default=250_000, help="records per owner n_i (paper: 250,000)")
    ap.add_argument("--dim", type=int, default=10, help="features d (paper: 10)")
    ap.add_argument("--seed", type=int, default=1, help="data seed (the job seed is 2020)")
    ap.add_argument("--chunk", default="default", metavar="ROWS|default",
                    help="rows per chunk in mpi_dp.models.linear, for what-if measurements: "
                    "'default' keeps mpi_dp's rule (max(MIN_CHUNK_ROWS, CHUNK_ELEMS // runs): a "
                    "rows x runs block of 2 MiB that stays in cache), a number fixes the rows for "
                    "both timings (monkeypatched; mpi_dp itself is not changed)")
    ap.add_argument("--blocks", type=int, default=4,
                    help="interleaved blocks (vectorised, then a share of the loop), for the "
                    "median and spread on a busy machine")
    ap.add_argument("--evaluate", action="store_true",
                    help="also compute psi at k = 0 and k = T (evaluation-only passes over every "
                    "shard, as a job with record_every = T does); default: the method alone "
                    "(record_every = 0)")
    ap.add_argument("--profile", action="store_true",
                    help="also profile the vectorised call with cProfile and print the top entries")
    ap.add_argument("--quick", action="store_true",
                    help="smoke test (seconds; tests/test_benchmarks.py runs it): "
                    + ", ".join(f"--{k} {v}" for k, v in QUICK.items())
                    + " (options given explicitly win)")
    a = ap.parse_args(argv)
    if a.quick:  # the smoke-test sizes, where not given explicitly
        for k, v in QUICK.items():
            if getattr(a, k) == ap.get_default(k):
                setattr(a, k, v)
    if a.chunk != "default":
        try:
            a.chunk = int(a.chunk)
        except ValueError:
            ap.error(f"--chunk must be a number or 'default', not {a.chunk!r}")
        if a.chunk < 1:
            ap.error("--chunk must be at least 1")
    for k in ("runs", "T", "n", "dim", "blocks"):
        if getattr(a, k) < 1:
            ap.error(f"--{k} must be at least 1")
    return a


def settings(T: int, p: int, n: int, xi: float, L: float, run_ids: tuple[int, ...]
             ) -> sync_star.Settings:
    """Settings as mpi_dp.runner builds them for a job with these keys (alg2, squared loss)."""
    return sync_star.Settings(
        variant="alg2", T=T, loss=LOSS, lam=LAM, theta_max=THETA_MAX, theta0=0.0, xi=xi,
        clip=True, rho=sync_star.default_rho("alg2", ALPHA, L, T), L=L, avg_kind="polynomial",
        eta=3.0, seed=2020, run_ids=run_ids, record_every=T, aggregate="gather",
        eps=(EPS,) * N_OWNERS, n=(n,) * N_OWNERS, p=p)


def main(argv=None) -> int:
    a = parse_args(argv)
    R, T, n, d = a.runs, a.T, a.n, a.dim
    scaled = "" if T == PAPER_T else f" (scaled down from the paper's T = {PAPER_T})"
    print(f"replicates benchmark{' (quick)' if a.quick else ''}: N = {N_OWNERS} owners x "
          f"n_i = {n:,} records, d = {d}, R = {R} runs, T = {T}{scaled}")
    print(f"OPENBLAS_NUM_THREADS={os.environ.get('OPENBLAS_NUM_THREADS')}, numpy {np.__version__}, "
          f"chunk rows: vectorised {chunk_rows(a.chunk, R)}, loop {chunk_rows(a.chunk, 1)} "
          f"(--chunk {a.chunk})")

    t = time.perf_counter()
    data = synth_regression(N_OWNERS, n, d, 0.5, a.seed, public=10000)
    shards = [LocalShard(i, X, y) for i, (X, y) in enumerate(data["agents"])]
    Xp, yp = data["public"]
    # Public constants as runner.public_constants computes them (xi = 'auto', step.L = 'public').
    L = linear.curvature_constant(LOSS, Xp, LAM)
    theta_pub = reference.theta_star_local(LOSS, Xp, yp, LAM, THETA_MAX)
    xi = float(np.quantile(linear.grad_l1_norms(LOSS, Xp, yp, theta_pub)[:, 0], XI_QUANTILE))
    star = Star(MPI.COMM_SELF, N_OWNERS)
    oracle = Oracle(star, shards, LOSS, LAM, N_OWNERS * n, d)
    ref = reference_quantities(oracle, THETA_MAX, "auto")
    print(f"set-up (data, xi = {xi:.4g}, L = {L:.4g}, theta*): {time.perf_counter() - t:.1f} s "
          "(not timed below)")

    record_every = T if a.evaluate else 0  # 0: no evaluation-only psi passes (method alone)

    def one(run_ids: tuple[int, ...]) -> np.ndarray:
        rows = chunk_rows(a.chunk, len(run_ids))
        linear.chunk_rows = lambda runs: rows
        st = dataclasses.replace(settings(T, d, n, xi, L, run_ids), record_every=record_every)
        con = Contract.planned(rules.BasicSplit(), "laplace", st.T, st.eps, seed=st.seed,
                               run_ids=st.run_ids)
        out = sync_star.run_config(star, shards, st, con, ref, recorder=None, progress=False)
        return out["models/final"]

    one((0,))  # warm-up (imports, first-touch of the shards)
    print("evaluation: " + ("psi at k = 0 and k = T (as a job with record_every = T)"
                            if a.evaluate else "none (record_every = 0: the method alone; "
                            "--evaluate adds the two psi passes)"))
    print(f"{a.blocks} interleaved blocks: each times the vectorised call (all R runs), then the "
          f"loop over R/{a.blocks} of the runs (its time scaled to R runs)")

    vec = None
    loop_parts = []
    t_vecs, t_loops = [], []
    parts = np.array_split(np.arange(R), a.blocks)
    for b, runs in enumerate(parts):
        t = time.perf_counter()
        vec = one(tuple(range(R)))
        t_vecs.append(time.perf_counter() - t)
        t = time.perf_counter()
        loop_parts.append(np.concatenate([one((int(r),)) for r in runs]))
        t_loops.append((time.perf_counter() - t) * R / len(runs))
        print(f"  block {b + 1}: vectorised {t_vecs[-1]:7.3f} s, loop (scaled to R) "
              f"{t_loops[-1]:8.3f} s, ratio {t_loops[-1] / t_vecs[-1]:5.1f}", flush=True)
    loop = np.concatenate(loop_parts)

    rel = np.abs(vec - loop) / np.maximum(np.abs(loop), 1e-300)
    max_rel = float(rel.max())
    same = np.allclose(vec, loop, rtol=1e-10, atol=0.0)
    print(f"final models: max relative difference vectorised vs loop = {max_rel:.3g} "
          f"({'equal' if same else 'NOT equal'} at rtol 1e-10)")
    t_vec, t_loop = float(np.median(t_vecs)), float(np.median(t_loops))
    ratios = np.array(t_loops) / np.array(t_vecs)

    def spread(v) -> float:
        return float(np.max(v) / np.min(v))

    print(f"vectorised: median {t_vec:8.3f} s, {1e3 * t_vec / T:8.3f} ms per iteration "
          f"({1e3 * t_vec / (T * R):.4f} ms per run-iteration), spread {spread(t_vecs):.2f}x")
    print(f"loop      : median {t_loop:8.3f} s, {1e3 * t_loop / T:8.3f} ms per iteration "
          f"(of all {R} runs; {1e3 * t_loop / (T * R):.4f} ms per run-iteration), "
          f"spread {spread(t_loops):.2f}x")
    print(f"ratio loop/vectorised = {np.median(ratios):.1f} median over {a.blocks} blocks "
          f"(min {ratios.min():.1f}, max {ratios.max():.1f}; goal >= 20)")
    if spread(ratios) > 1.5:
        print("  note: the blocks' ratios differ by more than 1.5x: the machine was busy; "
              "take the median with care")
    if T != PAPER_T:
        print(f"at the paper's T = {PAPER_T} (linear extrapolation): vectorised ~ "
              f"{t_vec * PAPER_T / T:.0f} s, loop ~ {t_loop * PAPER_T / T:.0f} s")

    if a.profile:
        pr = cProfile.Profile()
        pr.enable()
        one(tuple(range(R)))
        pr.disable()
        s = io.StringIO()
        pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(15)
        print("\ncProfile of the vectorised call (sorted by own time):")
        print(s.getvalue())
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
