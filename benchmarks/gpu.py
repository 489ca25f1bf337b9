"""Device backend (GPU) against the same node's CPU: the ADMM MNIST kernel, replicates, the job.

The job key `backend` (mpi_dp.backend) moves the records of every agent to a device once per
configuration; each iteration then sends the agents' models (R, J, K) to the device, runs the
kernel there and brings the gradient sums back to the host (noise, ledgers and MPI stay on the
host). This script measures what that buys on one node, in one run, against the node's own CPU:
NumPy with all its cores as BLAS threads (OPENBLAS_NUM_THREADS = OMP_NUM_THREADS =
MKL_NUM_THREADS = --cpu-threads, default os.cpu_count(), set before NumPy is imported).

1. Kernel. One ADMM agents' pass of the MNIST shapes (--agents 10 x --records 6,000 records,
   --features 784, --classes 10; synthetic float64 features in [0, 1] and random labels from a
   fixed seed, or --data SHARD's first agents): `multinomial.grad_sum_and_terms_max` of every
   agent (scores, softmax, sensitivity terms, gradient sum) at R runs, for R in --runs-list.
   Device: the records moved once (outside the timing); per call the host models W go to the
   device and the outputs come back with to_numpy (inside the timing, as an iteration pays
   them), and the device is synchronised before the clock stops. CPU: the same call on NumPy
   arrays. Device and CPU alternate in --blocks blocks, each the best of --reps repetitions;
   printed: median and min-max over the blocks, the ratio CPU / device, and the largest
   relative difference between the device's and NumPy's outputs (max |a - b| / max |b| per
   agent and run; the backend promises <= 1e-10).
2. Replicates. On the device: R = --replicates runs vectorised (one call per agent) against a
   loop of R single-run calls per agent, interleaved in the same way; the ratio loop /
   vectorised and the largest relative difference between the two.
3. The job. Wall time of `MPIEXEC -n N python -m mpi_dp run jobs/admm_mnist.toml` at --job-T
   iterations (the paper's 20,000), runs = --job-runs (20), one configuration (variant objt,
   eps 0.1), record_every = 200, backend = --backend; the shard is prepared into --data-dir if
   missing, the result goes to a temporary folder (or --out-dir; never over an existing file).
   N = --job-ranks (default min(11, os.cpu_count()): 1 server + 10 agents). Why ranks: the host
   work of an iteration (noise draws from the CPU streams, trust-region and dual updates, the
   server's ordered sum; NumPy on the host by design) costs tens of ms per iteration on one rank,
   more than the 6 ms the goal leaves; on N ranks each rank does it for its own agents only. All
   ranks of the node share its GPU (mpi_dp.backend: local rank i uses GPU i mod GPUs seen).
   MPIEXEC = --mpiexec, else the `mpiexec` beside this Python, else PATH's. N = 1 runs
   `python -m mpi_dp run` directly (no mpiexec). Open MPI (`MPIEXEC --version` says "Open MPI")
   gets --oversubscribe (it counts physical cores as slots), and --allow-run-as-root as root;
   MPICH needs neither. N > os.cpu_count() is run, with a printed note that the times then
   measure the oversubscription. Each rank of the job gets max(1, --cpu-threads // N) BLAS
   threads (the three variables, in the job's environment). The wall time includes the launch,
   start-up, the evaluation-only reference w* (L-BFGS on the host) and the records; the
   iteration loop alone is the configuration's `seconds` attribute.
   --job-cpu also runs the job on the CPU (backend numpy, the same N ranks) at --job-cpu-T
   iterations and extrapolates linearly to --job-T: (wall - loop) + loop x job-T / job-cpu-T,
   labelled as an extrapolation. --no-job skips this part.

Goals on one H100 / H200 (the issue): the job (20,000 iterations, 20 runs, one configuration)
in under 120 s; at least 20 x the same node's cores (kernel at R = 20). They are printed beside
the figures. Times are printed, never asserted. With --backend cupy and no usable GPU the
script prints one line ("GPU benchmark skipped: ...") and exits 0. --backend array_api_strict
runs the device code path on the CPU (a dry run: its times say nothing about a device).

    python benchmarks/gpu.py                                  # CuPy; all the node's cores
    python benchmarks/gpu.py --job-ranks 1                    # the job on one rank (no mpiexec)
    python benchmarks/gpu.py --job-cpu --cpu-threads 16       # also the CPU job, extrapolated
    python benchmarks/gpu.py --backend array_api_strict --quick   # smoke test on any machine
    python benchmarks/gpu.py --quick      # CuPy where it is usable, else array_api_strict
    (data: mpi-dp data prepare mnist --source ../shared/data --out data/mnist.h5, or done here)

--quick (tests/test_benchmarks.py runs it): QUICK's small shapes for all three parts; without
--backend it takes CuPy when a GPU is usable and array_api_strict (the dry run) otherwise, and
without --data-dir its job reads a synthetic MNIST-like shard of the same small shapes
(mpi_dp.data.synth, multiclass, features in [0, 1]) written to a temporary folder, so it needs
no file. Options given explicitly win.
"""

from __future__ import annotations

import os
import sys

THREAD_VARS = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")


def early_cpu_threads(argv: list[str]) -> int:
    """--cpu-threads N (or =N) from argv before argparse runs (default: os.cpu_count()); an
    unreadable value is left to argparse to report."""
    for i, a in enumerate(argv):
        raw = (a.split("=", 1)[1] if a.startswith("--cpu-threads=") else
               argv[i + 1] if a == "--cpu-threads" and i + 1 < len(argv) else None)
        if raw is not None and raw.isdigit() and int(raw) > 0:
            return int(raw)
    return os.cpu_count() or 1


# The CPU baseline uses all the node's cores as BLAS threads: set before NumPy is imported (an
# inherited OPENBLAS_NUM_THREADS=1, e.g. from the Makefile, is replaced on purpose).
CPU_THREADS = early_cpu_threads(sys.argv[1:])
for _var in THREAD_VARS:
    os.environ[_var] = str(CPU_THREADS)

import argparse  # noqa: E402
import dataclasses  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import shlex  # noqa: E402
import shutil  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable, Sequence  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402

from mpi_dp.backend import BACKENDS, Backend, backend, gpu_available, to_numpy  # noqa: E402
from mpi_dp.models import multinomial  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
JOB = REPO / "jobs" / "admm_mnist.toml"
JOB_GOAL_S = 120.0
RATIO_GOAL = 20.0
SEED = 20261127
#: --quick: a small smoke configuration (explicit flags still win)
QUICK = {"agents": 2, "records": 200, "features": 64, "runs_list": "1,4", "replicates": 4,
         "blocks": 2, "reps": 1, "job_T": 4, "job_runs": 2, "job_record_every": 2, "job_cpu_T": 4,
         "job_ranks": 2, "job_set": ["admm.reference_iters=0"]}
#: --quick's synthetic job shard: noise and seed of mpi_dp.data.synth.synth_multiclass
QUICK_SHARD_NOISE, QUICK_SHARD_SEED = 0.35, 3

Agents = list[tuple[Any, Any, Any]]  # per agent (X, y, row_l1), host or device


# ------------------------------------------------------------------------------ arguments

def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--backend", default=None, choices=[b for b in BACKENDS if b != "numpy"],
                    help="device backend (array_api_strict: the device code path on the CPU); "
                    "default cupy (--quick: cupy where a GPU is usable, else array_api_strict)")
    ap.add_argument("--cpu-threads", type=int, default=CPU_THREADS,
                    help="BLAS threads of the CPU baseline (default: os.cpu_count())")
    ap.add_argument("--agents", type=int, default=10)
    ap.add_argument("--records", type=int, default=6000, help="records per agent")
    ap.add_argument("--features", type=int, default=784)
    ap.add_argument("--classes", type=int, default=10)
    ap.add_argument("--data", help="kernel parts on this shard's first agents (not synthetic)")
    ap.add_argument("--runs-list", default="1,20", help="R values of the kernel part")
    ap.add_argument("--replicates", type=int, default=20, help="R of the replicates part")
    ap.add_argument("--blocks", type=int, default=5, help="interleaved blocks")
    ap.add_argument("--reps", type=int, default=3, help="repetitions per block (best taken)")
    ap.add_argument("--no-job", action="store_true", help="skip part 3 (the job)")
    ap.add_argument("--job-T", type=int, default=20000, help="iterations of the job")
    ap.add_argument("--job-runs", type=int, default=20, help="runs of the job")
    ap.add_argument("--job-record-every", type=int, default=200)
    ap.add_argument("--job-ranks", type=int, default=min(11, os.cpu_count() or 1),
                    help="MPI ranks of the job (default: min(11, os.cpu_count()); 1 server + "
                         "10 agents; 1: no mpiexec)")
    ap.add_argument("--mpiexec", help="launcher of the job (default: the mpiexec beside this "
                                      "Python, else PATH's); the MPI that mpi4py loads")
    ap.add_argument("--job-cpu", action="store_true",
                    help="also the job on the CPU (NumPy) at --job-cpu-T, extrapolated")
    ap.add_argument("--job-cpu-T", type=int, default=200)
    ap.add_argument("--job-set", action="append", default=[], metavar="KEY=VALUE",
                    help="extra `mpi-dp run --set` override of the job (repeatable)")
    ap.add_argument("--data-dir", default=None,
                    help="where the MNIST shard is (prepared); default data (--quick: a "
                    "synthetic shard in a temporary folder)")
    ap.add_argument("--mnist-source", default=str(REPO.parent / "shared" / "data"),
                    help="MNIST originals for `mpi-dp data prepare mnist --source`")
    ap.add_argument("--out-dir", help="job results here (default: a temporary folder)")
    ap.add_argument("--quick", action="store_true",
                    help=f"small smoke configuration: {QUICK}")
    args = ap.parse_args(argv)
    if args.quick:
        ap.set_defaults(**QUICK)
        args = ap.parse_args(argv)
    args.synthetic_job = args.quick and args.data_dir is None
    if args.data_dir is None:
        args.data_dir = "data"
    args.backend_note = ""
    if args.backend is None:
        args.backend = "cupy"
        if args.quick:
            ok, reason = gpu_available()
            if not ok:
                args.backend = "array_api_strict"
                args.backend_note = f" (--quick without a usable GPU: {reason})"
    args.runs_list = [int(r) for r in str(args.runs_list).split(",") if r.strip()]
    if args.job_ranks < 1:
        ap.error("--job-ranks must be >= 1")
    return args


# ------------------------------------------------------------------------------ statistics

@dataclasses.dataclass
class Stat:
    """Per-block best times (seconds) of one case."""

    times: list[float] = dataclasses.field(default_factory=list)

    @property
    def median_ms(self) -> float:
        return float(np.median(self.times)) * 1e3 if self.times else math.nan

    def text(self) -> str:
        lo, hi = min(self.times) * 1e3, max(self.times) * 1e3
        return f"{self.median_ms:10.3f} ms ({lo:.3f}-{hi:.3f})"


@dataclasses.dataclass
class Row:
    """One line of the summary table."""

    case: str
    R: int
    device_ms: float = math.nan
    cpu_ms: float = math.nan
    ratio: float = math.nan
    diff: float = math.nan
    goal: str = ""
    cpu_mark: str = ""


def best_of(f: Callable[[], None], reps: int, sync: Callable[[], None]) -> float:
    """Best wall time of `reps` calls of f, the device synchronised before each clock stop."""
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        f()
        sync()
        times.append(time.perf_counter() - t0)
    return min(times)


def rel_diff(a: np.ndarray, b: np.ndarray, lead: int = 2) -> float:
    """Largest max|a - b| / max|b| over the `lead` leading axes (agents, runs)."""
    a2 = np.asarray(a, dtype=np.float64).reshape(*b.shape[:lead], -1)
    b2 = np.asarray(b, dtype=np.float64).reshape(*b.shape[:lead], -1)
    scale = np.maximum(np.abs(b2).max(axis=-1), np.finfo(np.float64).tiny)
    return float((np.abs(a2 - b2).max(axis=-1) / scale).max())


def goal_text(value: float, goal: float, above: bool, dry: bool = False) -> str:
    """'met' / 'not met' ('n/a' without a figure; 'not judged' on a dry run)."""
    if dry:
        return "not judged (dry run)"
    if not math.isfinite(value):
        return "n/a"
    met = value >= goal if above else value < goal
    return "met" if met else "not met"


def dry_run(args: argparse.Namespace) -> bool:
    """array_api_strict runs on the CPU: its figures judge no goal."""
    return args.backend == "array_api_strict"


# ------------------------------------------------------------------------------ data

def synthetic(args: argparse.Namespace) -> tuple[list[np.ndarray], list[np.ndarray], int]:
    """--agents x --records float64 features in [0, 1) and labels 0..K-1 (fixed seed)."""
    rng = np.random.default_rng(SEED)
    X = [rng.random((args.records, args.features)) for _ in range(args.agents)]
    y = [rng.integers(0, args.classes, args.records) for _ in range(args.agents)]
    return X, y, args.classes


def from_shard(args: argparse.Namespace) -> tuple[list[np.ndarray], list[np.ndarray], int]:
    """The first --agents agents of --data, their first --records records each."""
    from mpi_dp.data import ShardFile

    shard = ShardFile(args.data)
    Xs, ys = [], []
    for i in range(min(args.agents, shard.n_agents)):
        X, y = shard.read_agent(i)
        Xs.append(np.ascontiguousarray(X[: args.records], dtype=np.float64))
        ys.append(np.asarray(y[: args.records]).astype(np.int64))
    K = max(args.classes, 1 + int(max(y.max() for y in ys)))
    return Xs, ys, K


def host_agents(Xs: list[np.ndarray], ys: list[np.ndarray]) -> Agents:
    return [(X, y, np.abs(X).sum(axis=1)) for X, y in zip(Xs, ys, strict=True)]


def device_agents(bk: Backend, host: Agents, K: int) -> Agents:
    """The records, labels and row norms on the device (once, as Stacks does)."""
    return [(bk.asarray(X), multinomial.device_labels(bk.xp, y, K), bk.asarray(l1))
            for X, y, l1 in host]


def models(n_agents: int, R: int, J: int, K: int) -> np.ndarray:
    """Host models (agents, R, J, K): small random weights, as mid-way through a run."""
    return np.random.default_rng(SEED + 1).normal(0.0, 0.01, (n_agents, R, J, K))


def synchronizer(name: str) -> Callable[[], None]:
    if name == "cupy":
        import cupy

        return cupy.cuda.Device().synchronize
    return lambda: None


# ------------------------------------------------------------------------------ kernels

def agents_pass(agents: Agents, W: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """grad_sum_and_terms_max of every agent at its models W[a] (host), outputs on the host."""
    G, tmax = [], []
    for (X, y, l1), Wa in zip(agents, W, strict=True):
        g, t = multinomial.grad_sum_and_terms_max(X, y, Wa, l1)
        G.append(to_numpy(g))
        tmax.append(to_numpy(t))
    return np.stack(G), np.stack(tmax)


def agents_loop(agents: Agents, W: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The same with one single-run call per (agent, run)."""
    G = np.empty(W.shape)
    tmax = np.empty(W.shape[:2])
    for a, (X, y, l1) in enumerate(agents):
        for r in range(W.shape[1]):
            g, t = multinomial.grad_sum_and_terms_max(X, y, W[a, r : r + 1], l1)
            G[a, r], tmax[a, r] = to_numpy(g)[0], to_numpy(t)[0]
    return G, tmax


def outputs_diff(a: tuple[np.ndarray, np.ndarray], b: tuple[np.ndarray, np.ndarray]) -> float:
    return max(rel_diff(a[0], b[0]), rel_diff(a[1][..., None], b[1][..., None]))


def kernel_part(args: argparse.Namespace, dev: Agents, host: Agents, K: int,
                sync: Callable[[], None]) -> list[Row]:
    """Part 1: device against CPU per R, interleaved in blocks."""
    J = host[0][0].shape[1]
    Ws = {R: models(len(host), R, J, K) for R in args.runs_list}
    diffs = {}
    for R, W in Ws.items():  # warm-up (kernel compilation, memory pools) and the check
        d, c = agents_pass(dev, W), agents_pass(host, W)
        sync()
        diffs[R] = outputs_diff(d, c)
    stats = {(R, side): Stat() for R in Ws for side in ("device", "cpu")}
    print(f"part 1, kernel: {len(host)} agents x {host[0][0].shape[0]} records, J = {J}, K = {K}"
          f"; R in {args.runs_list}; {args.blocks} blocks, best of {args.reps} each", flush=True)
    for b in range(args.blocks):
        line = []
        for R, W in Ws.items():
            dt = best_of(lambda W=W: agents_pass(dev, W), args.reps, sync)
            ct = best_of(lambda W=W: agents_pass(host, W), args.reps, lambda: None)
            stats[(R, "device")].times.append(dt)
            stats[(R, "cpu")].times.append(ct)
            line.append(f"R = {R}: device {dt * 1e3:.3f} ms, CPU {ct * 1e3:.3f} ms")
        print(f"  block {b + 1}: " + "; ".join(line), flush=True)
    rows = []
    for R in Ws:
        d, c = stats[(R, "device")], stats[(R, "cpu")]
        ratio = c.median_ms / d.median_ms
        goal = (f"ratio >= {RATIO_GOAL:g}: {goal_text(ratio, RATIO_GOAL, True, dry_run(args))}"
                if R == 20 else "")
        print(f"  R = {R:3d}: device {d.text()}  CPU {c.text()}  ratio CPU/device "
              f"{ratio:8.2f}  max rel diff {diffs[R]:.2e} (<= 1e-10){'  ' + goal if goal else ''}")
        rows.append(Row("kernel: agents' pass", R, d.median_ms, c.median_ms, ratio, diffs[R],
                        goal))
    return rows


def replicates_part(args: argparse.Namespace, dev: Agents, K: int,
                    sync: Callable[[], None]) -> list[Row]:
    """Part 2: R runs vectorised against a loop of R single-run calls, on the device."""
    R = args.replicates
    W = models(len(dev), R, dev[0][0].shape[1], K)
    vec_out, loop_out = agents_pass(dev, W), agents_loop(dev, W)  # warm-up and the check
    sync()
    diff = outputs_diff(loop_out, vec_out)
    vec, loop = Stat(), Stat()
    print(f"part 2, replicates on the device: R = {R} vectorised (one call per agent) vs a loop "
          f"of {R} single-run calls per agent; {args.blocks} blocks, best of {args.reps} each",
          flush=True)
    for b in range(args.blocks):
        vec.times.append(best_of(lambda: agents_pass(dev, W), args.reps, sync))
        loop.times.append(best_of(lambda: agents_loop(dev, W), args.reps, sync))
        print(f"  block {b + 1}: vectorised {vec.times[-1] * 1e3:.3f} ms, loop "
              f"{loop.times[-1] * 1e3:.3f} ms", flush=True)
    ratio = loop.median_ms / vec.median_ms
    print(f"  vectorised {vec.text()}  loop {loop.text()}  ratio loop/vectorised {ratio:.2f}  "
          f"max rel diff {diff:.2e}")
    return [Row("replicates: vectorised", R, vec.median_ms),
            Row(f"replicates: loop of {R} x R=1", R, loop.median_ms, ratio=ratio, diff=diff,
                goal="ratio = loop/vectorised")]


# ------------------------------------------------------------------------------ the job

def mpi_dp(*cli: str) -> list[str]:
    return [sys.executable, "-m", "mpi_dp", *cli]


def synthetic_shard(args: argparse.Namespace, folder: Path) -> Path:
    """--quick's job shard: MNIST-like synthetic records of the quick shapes (--agents x
    --records, --features in [0, 1], --classes) in `folder`."""
    from mpi_dp.data.synth import write_synth

    path = folder / "mnist_like_quick.h5"
    print(f"  job data: synthetic MNIST-like shard ({args.agents} agents x {args.records} records, "
          f"J = {args.features}, K = {args.classes}; mpi_dp.data.synth, multiclass)", flush=True)
    return write_synth(path, "multiclass", args.agents, args.records, args.features,
                       QUICK_SHARD_NOISE, QUICK_SHARD_SEED, public=args.records,
                       classes=args.classes)


def ensure_shard(args: argparse.Namespace) -> Path | None:
    """The MNIST shard in --data-dir, prepared from --mnist-source if missing (None: failed)."""
    path = Path(args.data_dir).resolve() / "mnist.h5"
    if path.exists():
        return path
    print(f"preparing {path} from {args.mnist_source}", flush=True)
    path.parent.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(mpi_dp("data", "prepare", "mnist", "--source", args.mnist_source,
                                 "--out", str(path)), cwd=REPO)
    return path if done.returncode == 0 and path.exists() else None


def free_name(folder: Path, stem: str) -> Path:
    """folder/stem.h5, or stem_1.h5, ...: a name with no file (nor .partial) there yet."""
    for i in range(10**6):
        p = folder / (f"{stem}.h5" if i == 0 else f"{stem}_{i}.h5")
        if not p.exists() and not Path(f"{p}.partial").exists():
            return p
    raise RuntimeError(f"no free result name in {folder}")


def job_overrides(backend_name: str, T: int, args: argparse.Namespace, shard: Path) -> list[str]:
    """`--set` items: one configuration (objt, eps 0.1), T, runs, record_every, backend, data."""
    sets = [f"backend={json.dumps(backend_name)}", f"T={T}", f"runs={args.job_runs}",
            f"record_every={min(args.job_record_every, T)}", 'sweep.variant=["objt"]',
            "sweep.eps=[0.1]", f"data={json.dumps(str(shard))}", *args.job_set]
    return [x for s in sets for x in ("--set", s)]


@dataclasses.dataclass
class Launcher:
    """How part 3 starts the job: N ranks under mpiexec (N = 1: a plain subprocess)."""

    ranks: int
    threads: int  # BLAS threads per rank: max(1, --cpu-threads // ranks)
    mpiexec: str | None = None  # None: one rank, no mpiexec
    flags: list[str] = dataclasses.field(default_factory=list)
    flavour: str = ""  # "Open MPI", "MPICH", or the first line of `mpiexec --version`

    @property
    def oversubscribed(self) -> bool:
        return self.ranks > (os.cpu_count() or 1)

    def env(self) -> dict[str, str]:
        """This process's environment with the job's BLAS threads per rank."""
        return {**os.environ, **{v: str(self.threads) for v in THREAD_VARS}}

    def command(self, cli: list[str]) -> list[str]:
        if self.mpiexec is None:
            return mpi_dp(*cli)
        return [self.mpiexec, "-n", str(self.ranks), *self.flags, *mpi_dp(*cli)]

    def shown(self, cli: list[str]) -> str:
        """The command as printed: the thread variable, `python` for this interpreter."""
        cmd = ["python" if c == sys.executable else c for c in self.command(cli)]
        return f"OPENBLAS_NUM_THREADS={self.threads} " + shlex.join(cmd)


def find_mpiexec(args: argparse.Namespace) -> str:
    """--mpiexec, else the mpiexec beside this Python (a venv's MPI), else PATH's."""
    return (args.mpiexec or shutil.which("mpiexec", path=str(Path(sys.executable).parent))
            or shutil.which("mpiexec") or "mpiexec")


def launcher(args: argparse.Namespace) -> Launcher | str:
    """The launcher of part 3 for --job-ranks, or why there is none (a message)."""
    n = args.job_ranks
    lau = Launcher(n, max(1, CPU_THREADS // n))
    if n == 1:
        return lau
    lau.mpiexec = find_mpiexec(args)
    try:
        done = subprocess.run([lau.mpiexec, "--version"], capture_output=True, text=True,
                              timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"cannot run {lau.mpiexec} --version: {exc}"
    text = done.stdout + done.stderr
    if "Open MPI" in text:
        lau.flavour = "Open MPI"
        # Open MPI counts physical cores as slots (fewer than os.cpu_count() with SMT) and
        # refuses more ranks than slots, or any rank as root, unless told
        lau.flags.append("--oversubscribe")
        if hasattr(os, "geteuid") and os.geteuid() == 0:
            lau.flags.append("--allow-run-as-root")
    elif "HYDRA" in text or "MPICH" in text:
        lau.flavour = "MPICH"  # allows oversubscription and root as is
    else:
        lau.flavour = (text.strip().splitlines() or ["unknown MPI"])[0][:60]
    return lau


@dataclasses.dataclass
class JobTime:
    wall: float  # the subprocess (with mpiexec's launch), start to end (seconds)
    loop: float  # the configuration's iteration loop (attribute `seconds`)
    T: int


def run_job(backend_name: str, T: int, args: argparse.Namespace, shard: Path,
            folder: Path, lau: Launcher) -> JobTime | None:
    """`mpi-dp run` of the job on lau.ranks ranks; None when it fails."""
    out = free_name(folder, f"admm_mnist_{backend_name}_T{T}")
    cli = ["run", str(JOB), *job_overrides(backend_name, T, args, shard), "--out", str(out)]
    print("  $ " + lau.shown(cli), flush=True)
    t0 = time.perf_counter()
    done = subprocess.run(lau.command(cli), cwd=REPO, env=lau.env())
    wall = time.perf_counter() - t0
    if done.returncode != 0 or not out.exists():
        print(f"  job failed (exit {done.returncode}; {lau.ranks} rank(s))")
        return None
    import h5py

    with h5py.File(out, "r") as f:
        attrs = f["configs/000"].attrs
        got = str(attrs.get("backend", "?"))
        loop = float(attrs["seconds"])
        if got != backend_name:
            print(f"  warning: the result says backend = {got!r}, not {backend_name!r}")
    return JobTime(wall, loop, T)


def job_part(args: argparse.Namespace, kernel_ms: float) -> tuple[list[Row], bool]:
    """Part 3: the job on the device (and with --job-cpu on the CPU, extrapolated)."""
    lau = launcher(args)
    n = args.job_ranks
    print(f"part 3, the job: {JOB.relative_to(REPO)} at T = {args.job_T}, runs = {args.job_runs}, "
          f"one configuration (objt, eps 0.1), {n} rank(s)", flush=True)
    if isinstance(lau, str):
        print(f"  job failed: {lau} (--mpiexec PATH, or --job-ranks 1 for no mpiexec)")
        return [], False
    print(f"  {n} rank(s) "
          + (f"under {lau.mpiexec} ({lau.flavour}{', ' if lau.flags else ''}"
             f"{' '.join(lau.flags)})" if lau.mpiexec else "(a plain subprocess, no mpiexec)")
          + f"; BLAS threads per rank: {lau.threads} = max(1, {CPU_THREADS} // {n})", flush=True)
    if lau.oversubscribed:
        print(f"  note: {n} ranks on {os.cpu_count()} CPUs (os.cpu_count()): the job's times "
              "then measure the oversubscription, not the code", flush=True)
    with tempfile.TemporaryDirectory(prefix="gpu_bench_") as tmp:
        shard = synthetic_shard(args, Path(tmp)) if args.synthetic_job else ensure_shard(args)
        if shard is None:
            print(f"  job skipped: no MNIST shard in {args.data_dir} and preparing it failed")
            return [], False
        folder = Path(args.out_dir) if args.out_dir else Path(tmp)
        folder.mkdir(parents=True, exist_ok=True)
        dev = run_job(args.backend, args.job_T, args, shard, folder, lau)
        cpu = (run_job("numpy", args.job_cpu_T, args, shard, folder, lau) if args.job_cpu
               else None)
    if dev is None or (args.job_cpu and cpu is None):
        return [], False
    return job_rows(args, dev, cpu, kernel_ms, lau), True


def mnist_shapes(args: argparse.Namespace) -> bool:
    """Whether part 1/2 ran the job's shapes (10 agents x 6,000 records x 784 features)."""
    return (args.agents, args.records, args.features) == (10, 6000, 784)


def job_rows(args: argparse.Namespace, dev: JobTime, cpu: JobTime | None,
             kernel_ms: float, lau: Launcher) -> list[Row]:
    R, T, n = args.job_runs, args.job_T, lau.ranks
    per_iter = dev.loop / T * 1e3
    met = goal_text(dev.wall, JOB_GOAL_S, False, dry_run(args))
    over = "; oversubscribed" if lau.oversubscribed else ""
    print(f"  {args.backend} on {n} rank(s): wall {dev.wall:.1f} s (goal < {JOB_GOAL_S:g} s: "
          f"{met}{over}); iteration loop {dev.loop:.1f} s = {per_iter:.3f} ms per iteration; the "
          f"rest (launch, start-up, reference, ...) {dev.wall - dev.loop:.1f} s")
    if math.isfinite(kernel_ms) and mnist_shapes(args) and R == args.replicates:
        if n == 1:
            print(f"  kernel share of an iteration: {kernel_ms:.3f} ms (part 1/2, R = {R}) of "
                  f"{per_iter:.3f} ms = {kernel_ms / per_iter:.1%} (the rest: host work)")
        else:
            print(f"  the agents' kernels, one after the other in one process: {kernel_ms:.3f} ms "
                  f"(part 1/2, R = {R}); on {n} ranks they run side by side on the shared "
                  f"device, an iteration: {per_iter:.3f} ms")
    job = Row(f"job wall (T={T}, {n} rank{'s' if n > 1 else ''})", R, dev.wall * 1e3,
              goal=f"< {JOB_GOAL_S:g} s: {met}{over}")
    it = Row(f"job: one iteration ({n} rank{'s' if n > 1 else ''})", R, per_iter)
    if cpu is not None:
        full = (cpu.wall - cpu.loop) + cpu.loop * T / cpu.T
        cpu_iter = cpu.loop / cpu.T * 1e3
        print(f"  numpy (CPU, {n} rank(s) x {lau.threads} BLAS threads) at T = {cpu.T}: wall "
              f"{cpu.wall:.1f} s, loop "
              f"{cpu.loop:.1f} s = {cpu_iter:.3f} ms per iteration; EXTRAPOLATED to T = {T}: "
              f"({cpu.wall:.1f} - {cpu.loop:.1f}) + {cpu.loop:.1f} x {T} / {cpu.T} = {full:.1f} s "
              f"-> ratio {full / dev.wall:.2f}")
        job.cpu_ms, job.ratio, job.cpu_mark = full * 1e3, full / dev.wall, "*"
        job.goal += (f"; ratio >= {RATIO_GOAL:g}: "
                     f"{goal_text(job.ratio, RATIO_GOAL, True, dry_run(args))}")
        it.cpu_ms, it.ratio = cpu_iter, cpu_iter / per_iter
    return [job, it]


# ------------------------------------------------------------------------------ output

def fmt(v: float, spec: str) -> str:
    return format(v, spec) if math.isfinite(v) else "-"


def print_summary(rows: list[Row], args: argparse.Namespace) -> None:
    head = (f"{'case':<30} {'R':>3} {'device ms':>13} {'CPU ms':>15} {'ratio':>8} "
            f"{'max rel diff':>12}  goal")
    n = args.job_ranks
    job = ("" if args.no_job else
           f"; the job on {n} rank(s), {max(1, CPU_THREADS // n)} BLAS thread(s) per rank"
           f"{' (oversubscribed)' if n > (os.cpu_count() or 1) else ''}")
    print(f"\nsummary ({args.backend} vs NumPy with {CPU_THREADS} BLAS threads; medians over "
          f"{args.blocks} blocks; ratio = CPU / device unless noted{job})")
    print(head)
    print("-" * len(head))
    for r in rows:
        cpu = fmt(r.cpu_ms, ",.3f") + (r.cpu_mark or " ")
        print(f"{r.case:<30} {r.R:>3} {fmt(r.device_ms, ',.3f'):>13} {cpu:>15} "
              f"{fmt(r.ratio, '.2f'):>8} {fmt(r.diff, '.2e'):>12}  {r.goal}".rstrip())
    if any(r.cpu_mark for r in rows):
        print(f"* EXTRAPOLATED linearly from a CPU job of T = {args.job_cpu_T}: "
              "(wall - loop) + loop x T / T_cpu")
    if dry_run(args):
        print("(array_api_strict runs on the CPU: a dry run of the device code path; its times "
              "and ratios say nothing about a GPU)")


def describe_device(name: str) -> str:
    if name != "cupy":
        return f"{name} (the array API reference namespace on the CPU)"
    import cupy

    props = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)
    return f"cupy {cupy.__version__} on {props['name'].decode()}"


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.backend == "cupy":
        ok, reason = gpu_available()
        if not ok:
            print(f"GPU benchmark skipped: {reason}")
            return 0
    bk = backend(args.backend)
    threads = ", ".join(f"{v}={os.environ.get(v)}" for v in THREAD_VARS)
    print(f"device: {describe_device(args.backend)}; CPU baseline: NumPy {np.__version__}, "
          f"BLAS threads: {CPU_THREADS} ({threads}; os.cpu_count() = {os.cpu_count()})"
          f"{'; --quick' if args.quick else ''}{args.backend_note}", flush=True)
    Xs, ys, K = from_shard(args) if args.data else synthetic(args)
    host = host_agents(Xs, ys)
    dev = device_agents(bk, host, K)
    sync = synchronizer(args.backend)
    sync()
    rows = kernel_part(args, dev, host, K, sync)
    rows += replicates_part(args, dev, K, sync)
    del dev
    ok = True
    if not args.no_job:
        kernel_ms = next((r.device_ms for r in rows if r.case.startswith("replicates: vec")),
                         math.nan)
        job, ok = job_part(args, kernel_ms)
        rows += job
    print_summary(rows, args)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
