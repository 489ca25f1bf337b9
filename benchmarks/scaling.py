"""Scaling: start-up, time per iteration, peak memory per rank and parallel efficiency of every
method with 16, 1,024 and 10,000 agents on 1, 2, 4 and 8 ranks (agents in blocks per rank).

The driver makes one synthetic shard file per (method, agents) with `mpi-dp data synth` (cached in
--data-dir), writes a small job per method and runs it as a user does,
`mpiexec -n R python benchmarks/scaling.py --worker JOB OUT`; the worker calls
`mpi_dp.runner.run_job` and times it from the outside:

  start-up    launch of the worker's run_job -> configuration 0 opened (job checks, shards read and
              validated, layout, output created; what a user waits for before any iteration)
  per iter    (configuration 0 done - configuration 0 opened) / T: the iterations with their
              records and the configuration's own set-up (references), amortised over T
  peak memory max over ranks of ru_maxrss (resource.getrusage), MiB
  efficiency  per-iteration time on 1 rank / (R x per-iteration time on R ranks)

Nothing is asserted. On a 2-core machine more than 2 ranks are oversubscribed: efficiency beyond 2
ranks measures the oversubscription, not the code (the output says so).

    python benchmarks/scaling.py                                   # the full grid (long)
    python benchmarks/scaling.py --methods sync_star --agents 16,1024 --ranks 1,2
    python benchmarks/scaling.py --methods dola --agents 10000 --ranks 8 --T 4
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

METHODS = ("sync_star", "async_star", "admm", "dola", "p2p")
ROOT = Path(__file__).resolve().parents[1]


def synth_args(method: str, agents: int) -> list[str]:
    """`mpi-dp data synth` options of the method's synthetic problem at `agents` agents."""
    common = ["--agents", str(agents), "--seed", "1"]
    if method in ("sync_star", "async_star"):
        return ["--task", "regression", "--records", "50", "--dim", "10", "--noise", "0.5",
                "--public", "1000", *common]
    if method == "admm":
        return ["--task", "multiclass", "--classes", "3", "--records", "50", "--dim", "10",
                "--public", "1000", *common]
    if method == "dola":
        return ["--task", "online", "--records", "50", "--dim", "10", "--noise", "0.05",
                "--public", "1000", *common]
    return ["--task", "p2p", "--dim", "10", *common]


def job_text(method: str, data: Path, out: Path, T: int, runs: int, agents: int) -> str:
    """A small job of `method` on `data`: T iterations (dola: rounds; p2p: T x agents wake-ups,
    i.e. T per agent), `runs` runs."""
    head = (f'name = "scaling_{method}"\nalgorithm = "{method}"\ndata = "{data}"\n'
            f'output = "{out}"\nseed = 7\nruns = {runs}\neps = 1.0\n')
    if method == "sync_star":
        return head + (f'variant = "alg2"\nT = {T}\nloss = "squared"\nlam = 1e-2\n'
                       f'theta_max = 1e6\nxi = "auto"\nrecord_every = {T}\n')
    if method == "async_star":
        return head + (f'variant = "proof"\nT = {T}\nloss = "squared"\nlam = 1e-2\n'
                       f'theta_max = 1e6\nxi = "auto"\nrecord_every = {T}\n')
    if method == "admm":
        return head + f'variant = "iadmm"\nT = {T}\nrecord_every = {T}\n'
    if method == "dola":
        return head + f'T = {T}\nrecord_every = {T}\n'
    return head + f'T = {T * agents}\nrecord_every = {T * agents}\n\n[p2p]\nmu = 1.0\n'


# -- worker (under mpiexec) ----------------------------------------------------------------------
def worker(job: str, out: str) -> None:
    from mpi4py import MPI

    from mpi_dp.results import recorder
    from mpi_dp.runner import run_job

    comm = MPI.COMM_WORLD
    marks: dict[str, float] = {}
    beat, done = recorder.ResultFile.beat, recorder.ResultFile.config_done

    def timed_beat(self, config, record, force=False):
        marks.setdefault("opened", time.perf_counter())
        return beat(self, config, record, force)

    def timed_done(self, index):
        marks.setdefault("done", time.perf_counter())
        return done(self, index)

    recorder.ResultFile.beat, recorder.ResultFile.config_done = timed_beat, timed_done
    comm.Barrier()
    t0 = time.perf_counter()
    run_job(Path(job), [], Path(out), comm=comm, progress=False, overwrite=True)
    rss = comm.gather(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0, root=0)
    if comm.Get_rank() == 0:
        print("SCALING " + json.dumps({"startup": marks["opened"] - t0,
                                       "config": marks["done"] - marks["opened"],
                                       "peak_mib": max(rss)}), flush=True)


# -- driver ----------------------------------------------------------------------------------------
def make_data(method: str, agents: int, data_dir: Path) -> Path:
    task = synth_args(method, agents)[1]
    path = data_dir / f"{task}_{agents}.h5"
    if not path.exists():
        t = time.perf_counter()
        subprocess.run([sys.executable, "-m", "mpi_dp", "data", "synth",
                        *synth_args(method, agents), "--out", str(path)], check=True,
                       capture_output=True, text=True)
        print(f"  (made {path.name} in {time.perf_counter() - t:.1f} s)", flush=True)
    return path


def run_case(method: str, agents: int, ranks: int, a: argparse.Namespace) -> dict | None:
    data = make_data(method, agents, a.data_dir)
    work = a.data_dir / "runs"
    work.mkdir(exist_ok=True)
    out = work / f"{method}_{agents}_{ranks}.h5"
    for p in (out, out.with_name(out.name + ".partial")):
        p.unlink(missing_ok=True)
    job = work / f"{method}_{agents}.toml"
    job.write_text(job_text(method, data, out, a.T, a.runs, agents))
    mpiexec = shutil.which("mpiexec", path=str(Path(sys.executable).parent)) or "mpiexec"
    cmd = [mpiexec, "-n", str(ranks), sys.executable, __file__, "--worker", str(job), str(out)]
    cp = subprocess.run(cmd, capture_output=True, text=True, timeout=a.timeout)
    line = next((ln for ln in cp.stdout.splitlines() if ln.startswith("SCALING ")), None)
    if cp.returncode != 0 or line is None:
        tail = (cp.stderr.strip().splitlines() or ["(no output)"])[-1]
        print(f"  {method} {agents} agents {ranks} rank(s): FAILED: {tail}", flush=True)
        return None
    return json.loads(line[len("SCALING "):])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n\n", 1)[1])
    ap.add_argument("--worker", nargs=2, metavar=("JOB", "OUT"), help=argparse.SUPPRESS)
    ap.add_argument("--methods", default=",".join(METHODS), help="comma-separated methods")
    ap.add_argument("--agents", default="16,1024,10000", help="comma-separated agent counts")
    ap.add_argument("--ranks", default="1,2,4,8", help="comma-separated rank counts")
    ap.add_argument("--T", type=int, default=10, help="iterations (rounds; p2p: wake-ups per "
                    "agent) per run")
    ap.add_argument("--runs", type=int, default=2, help="Monte-Carlo runs")
    ap.add_argument("--timeout", type=float, default=1800.0, help="seconds per case")
    ap.add_argument("--data-dir", type=Path, default=Path("/tmp/mpi_dp_scaling"),
                    help="where shard files are cached and jobs run")
    a = ap.parse_args(argv)
    if a.worker:
        worker(*a.worker)
        return 0
    methods = [m for m in a.methods.split(",") if m]
    bad = [m for m in methods if m not in METHODS]
    if bad:
        ap.error(f"unknown method(s) {bad}; choose from {', '.join(METHODS)}")
    agents = [int(v) for v in a.agents.split(",")]
    ranks = sorted(int(v) for v in a.ranks.split(","))
    a.data_dir.mkdir(parents=True, exist_ok=True)
    cores = os.cpu_count() or 1
    print(f"scaling: T = {a.T}, runs = {a.runs}, {cores} core(s); ranks beyond {cores} are "
          "oversubscribed (efficiency there measures the oversubscription)")
    print(f"{'method':<11} {'agents':>7} {'ranks':>5} {'start-up s':>10} {'per iter ms':>11} "
          f"{'peak MiB/rank':>13} {'efficiency':>10}")
    for m in methods:
        for n in agents:
            base = None
            for r in ranks:
                res = run_case(m, n, r, a)
                if res is None:
                    continue
                it = 1e3 * res["config"] / a.T
                if r == ranks[0]:
                    base = it * r
                eff = f"{base / (r * it):.2f}" if base else "-"
                print(f"{m:<11} {n:>7,} {r:>5} {res['startup']:>10.2f} {it:>11.1f} "
                      f"{res['peak_mib']:>13.0f} {eff:>10}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
