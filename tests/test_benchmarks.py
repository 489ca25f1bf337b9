"""Benchmarks cannot rot (issue 42, item 7): every script in benchmarks/ runs in its quick mode.

Each script has `--quick`: the smallest meaningful case on tiny synthetic data made by the script
(no file a fresh clone lacks), one or two blocks, the same table as the full run. Here every
script runs that way as a subprocess of this Python, under `mpiexec -n N` (the launcher beside
sys.executable, else PATH's: helpers.MPIEXEC) where it needs MPI, with PYTHONPATH set to this
tree so that the scripts and their mpiexec children import the mpi_dp under test. A test asserts
exit status 0 and the lines of the table / summary that a broken script would not print; no time
is asserted (the timeout is a hang guard only). `test_every_script_has_a_quick_test` fails when a
script is added to benchmarks/ without a QUICK entry here (and a --quick flag there).

The cases share one pytest-xdist worker (xdist_group): several are MPI jobs whose ranks busy-poll,
and two of them side by side on a 2-core machine only wait for each other.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from helpers import HANG_GUARD_S, MPIEXEC

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "benchmarks"

pytestmark = pytest.mark.xdist_group("benchmarks")


@dataclass(frozen=True)
class Quick:
    """How a script's quick mode runs and what its output must show."""

    ranks: int | None  # None: a plain process; N: under `mpiexec -n N` (the fewest it needs)
    expect: tuple[str, ...]  # regular expressions, each must match somewhere in stdout
    args: tuple[str, ...] = field(default=())  # beyond --quick


#: every script of benchmarks/ and its quick run (a new script needs an entry)
QUICK: dict[str, Quick] = {
    "replicates.py": Quick(None, (
        r"^replicates benchmark \(quick\): N = 3 owners x n_i = 2,000 records, d = 10, R = 4 runs",
        r"^  block 2: vectorised .* s, loop \(scaled to R\) .* s, ratio",
        r"^final models: max relative difference vectorised vs loop = \S+ \(equal at rtol 1e-10\)",
        r"^vectorised: median .* ms per iteration",
        r"^loop      : median .* ms per iteration",
        r"^ratio loop/vectorised = \S+ median over 2 blocks")),
    # the owners' plan covers the profile's timed answers (make bench crashed there: issue 42)
    "async_rate.py": Quick(2, (
        r"^quick: ranks 2 \(1 owner hosts\), 4 owners, d = 10, 50 records per owner, protocol "
        r"owner_request, 2 blocks of 200 pings per host \+ T = 200 live updates",
        r"^block  ping-pong/s  \(us each\)   updates/s",
        r"^    1 +\d+ ",
        r"^raw ping-pong round trips/s +median",
        r"^live learner updates/s +median",
        r"^ratio updates / ping-pong +median",
        # live (wall-clock) answers: every owner served, about equally (exactly 1/4 each only
        # on an idle machine; one owner ahead by a few updates under load)
        r"^owner shares of the updates \(last block\): \[0\.2\d* +0\.2\d* +0\.2\d* +0\.2\d*\]",
        r"^VERDICT: ",
        r"^  query-to-answer round trip .* of which owner's answer timed alone \d",
        r"^  raw ping-pong round trip +\d")),
    "admm_mnist.py": Quick(None, (
        r"^3 agents x 200 records, J = 64, K = 10 \(quick, synthetic MNIST-like records",
        r"^efficiency: R = 4 runs; GEMMs per iteration: 3 agents",
        r"^  block 2: iteration .* GFLOP/s; DGEMM peak .* GEMM-only share",
        r"^ADMM GEMM efficiency: achieved \S+ GFLOP/s / DGEMM peak \S+ GFLOP/s = \S+ \(goal >= 0.7\)",
        r"^R = 4 vectorised: +\S+ s per iteration",
        r"^ratio loop / vectorised = \S+; largest \|w_loop - w_vectorised\| = 0\.00e\+00")),
    "scaling.py": Quick(None, (
        r"^scaling \(quick: no warm-up runs\): ",
        r"^== same records, 1 rank\(s\), T = 2, runs = 1, 1 block\(s\)",
        r"^method +agents tree +start-up s +ms/iter +us/agent-iter +ratio +goal",
        r"^sync_star +1 current +\S+ +\S+ +1  \(base of the ratio\)",
        r"^sync_star +4 current +\S+ +\S+ +\S+  ratio <= 3: (met|NOT met)",
        r"^== rank grid, T = 2, runs = 1, 1 block\(s\)",
        r"^method +agents tree +ranks +start-up s +ms/iter +steady ms/iter +peak MiB/rank "
        r"+efficiency +steady eff\.",
        r"^sync_star +4 current +1 +\S+ +\S+ +\S+ +\d+ +1\.00 +1\.00",
        r"^done in \d+ s")),
    # 2 ranks: part 2 (one neighbour exchange against the raw call) needs a neighbour rank
    "dola_rounds.py": Quick(2, (
        r"^dola_rounds \(quick\): 2 rank\(s\)",
        r"^m = 16 agents .*, dense d = 20",
        r"^m = 16 agents .*, csr d = 1000",
        r"^    final iterates MPI vs simulator: bitwise equal",
        r"^    allgather .* us .* ratio/raw",
        r"^summary \(2 ranks, .* medians over 2 blocks",
        r"^ +m \| data +\| +T \| +sim rounds/s \| +MPI rounds/s",
        r"^ +16 \| dense \| 10 \|",
        r"^ +16 \| csr +\| 10 \|",
        r"^verdicts:",
        r"^wall time \d+ s")),
    # 2 ranks: the raw RMA rates and the live/raw ratios need a remote rank
    "p2p_wakeups.py": Quick(2, (
        r"^block 2: raw Put\+Flush \S+/s \| raw Lock/Put/Unlock \S+/s \| live \S+ wake-ups/s \| "
        r"replay \S+/s \| serial \S+/s",
        r"^2 rank\(s\), 16 peers \(quick, synthetic p2p shard .*\), T_i = 2, p = 5, 2 interleaved "
        r"blocks; replay: \d+ levels rounds for 32 wake-ups",
        r"^  live wake-ups per s +median",
        r"^  replay wake-ups per s +median",
        r"^  serial wake-ups per s +median",
        r"^  live wake-ups / raw puts \(goal 0.3\) median",
        r"^  replay / serial \(goal > 1 on 4\) +median")),
    # 2 ranks: passive-target progress needs a remote target; one relaunch (throttle)
    "rma_progress.py": Quick(2, (
        r"^quick: ranks 2, agents 16 \(8 per rank\), .* 50 wake-ups per rank per block, 2 blocks",
        r"^idle us  strategy +wake-ups/s median \[min, max\]",
        *(rf"^ +0  {s} +\d+ \[\d+, \d+\]" for s in ("none", "iprobe", "flush", "sleep", "nap",
                                                   "throttle\\+none", "throttle\\+iprobe",
                                                   "throttle\\+nap")),
        r"^env\+mode rows: ")),
    # the demo job at T = 1e3 and 1e4 (eps = 1, one run): the estimate against the run
    "estimate.py": Quick(None, (
        r"^estimate \(quick\): the demo job \(3 owners x 4,000 records, d = 10, eps \[1\.0\]\), "
        r"runs = 1, record_every = 50, 1 rank\(s\), T in \[1000, 10000\], 1 block\(s\)",
        r"^block 1 T=1e\+03: estimate \S+ s \(calibration \S+ s\), measured \S+ s "
        r"\(calibration \S+ s\), ratio \S+, core share \S+, idle ratio \S+",
        r"^block 1 T=1e\+04: estimate ",
        r"^T +estimate s +calibration est\. s +measured s \(median\) +calibration s +ratio median",
        r"^1e\+03 +\S+ +\S+ +\S+ +\S+ +\S+ \[\S+, \S+\] +\S+ +(yes|no|NO)",
        r"^1e\+04 +\S+ +\S+ +\S+ +\S+ +\S+ \[\S+, \S+\] +\S+ +(yes|no|NO)")),
    "audit_rate.py": Quick(None, (
        r"^audit_rate \(quick\): 3 owners x 4,000 records, d = 10, R = 200 runs, 2 blocks",
        r"^block 2: audit \S+ releases/s \| plain loop \S+/s \| ratio",
        r"^  mpi-dp audit +median +\S+ releases/s",
        r"^  plain NumPy loop +median +\S+ releases/s",
        r"^  ratio \(goal >= 50\)  median \S+  spread \S+  \(1 rank\(s\), R = 200, quick\)")),
    # mpi_dp beside pfl and Flower; the peers run only where their venvs exist (CI: skipped,
    # with the reason); the job itself starts under mpiexec -n 2
    "peers.py": Quick(None, (
        r"^peers \(quick\): mpi_dp sync_star on 2 rank\(s\) vs pfl, flower; N in \[10\] owners "
        r"x 500 records, d = 10 \(\+ bias\), T = 5, eps = 10, delta = 1e-05, 1 block\(s\)",
        r"^pfl: (skipped: (no virtual environment at .* \(pass --install|.*does not import)"
        r"|pfl \S+ in )",
        r"^flower: (skipped: (no virtual environment at .* \(pass --install|.*does not import)"
        r"|flwr \S+ in )",
        r"^N = 10: clip xi = \S+ \(mpi_dp, L1 per record\), C = \S+ \(peers, L2 per client",
        r"^block 1 N=10: mpi_dp total \S+ s, \S+ ms/round, start-up \S+ s, test accuracy 0\.\d+",
        r"^ +N  system  ms/round +start-up s +total s +test acc +round ratio +total ratio",
        r"^ +10  mpi_dp  \S+ \[\S+, \S+\] +\S+ \[\S+, \S+\] +\S+ \[\S+, \S+\] +0\.\d+ +1 +1$",
        r"^equal work N=10: test accurac(y|ies) mpi_dp 0\.\d+",
        r"^DP: mpi_dp sync_star: record-level DP, .* \(local noise.*; pfl/flower: client-level "
        r"central DP",
        r"^done in \d+ s")),
    # CuPy where a GPU is usable, else array_api_strict (the device code path on the CPU); its
    # part 3 starts the job on 2 ranks itself
    "gpu.py": Quick(None, (
        r"^device: (array_api_strict|cupy) .*; --quick",
        r"^part 1, kernel: 2 agents x 200 records, J = 64, K = 10; R in \[1, 4\]",
        r"^  R = +4: device .* max rel diff \S+ \(<= 1e-10\)",
        r"^part 2, replicates on the device: R = 4",
        r"^part 3, the job: jobs/admm_mnist.toml at T = 4, runs = 2",
        r"^  job data: synthetic MNIST-like shard",
        r"^  (array_api_strict|cupy) on 2 rank\(s\): wall \S+ s .* iteration loop",
        r"^case +R +device ms +CPU ms +ratio max rel diff  goal",
        r"^kernel: agents' pass +4 ",
        r"^replicates: loop of 4 x R=1 +4 ",
        r"^job wall \(T=4, 2 ranks\) +2 ",
        r"^job: one iteration \(2 ranks\) +2 ")),
}


def bench_env() -> dict[str, str]:
    """This process's environment with this tree first on PYTHONPATH (the scripts, their
    mpiexec ranks and their own subprocesses import the mpi_dp under test) and one BLAS thread
    (gpu.py sets its own)."""
    path = os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])
    return dict(os.environ, PYTHONPATH=path, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")


def run_quick(name: str, cwd: Path) -> subprocess.CompletedProcess:
    q = QUICK[name]
    cmd = [sys.executable, str(BENCH / name), "--quick", *q.args]
    if name == "scaling.py":  # its shard files and jobs in this test's folder, not /tmp's cache
        cmd += ["--data-dir", str(cwd / "scaling")]
    if q.ranks is not None:
        cmd = [MPIEXEC, "-n", str(q.ranks), *cmd]
    return subprocess.run(cmd, cwd=cwd, env=bench_env(), capture_output=True, text=True,
                          timeout=HANG_GUARD_S)


def test_every_script_has_a_quick_test():
    """A script added to benchmarks/ needs a --quick flag and an entry in QUICK."""
    scripts = sorted(p.name for p in BENCH.glob("*.py"))
    assert scripts, BENCH
    missing = sorted(set(scripts) - set(QUICK))
    assert not missing, f"benchmarks without a quick-mode test in {__file__}: {missing}"
    gone = sorted(set(QUICK) - set(scripts))
    assert not gone, f"QUICK names scripts that are not in benchmarks/: {gone}"
    no_flag = [s for s in scripts if '"--quick"' not in (BENCH / s).read_text()]
    assert not no_flag, f"benchmarks without a --quick flag: {no_flag}"


@pytest.mark.parametrize("name", sorted(QUICK))
def test_quick_mode_runs_and_prints_its_table(name, tmp_path):
    cp = run_quick(name, tmp_path)
    out = cp.stdout
    assert cp.returncode == 0, f"{name} --quick: exit {cp.returncode}\n{out}\n{cp.stderr}"
    for pattern in QUICK[name].expect:
        assert re.search(pattern, out, re.MULTILINE), (
            f"{name} --quick printed no line matching {pattern!r}:\n{out}\n{cp.stderr}")
    assert "Traceback" not in cp.stderr, cp.stderr
    # the scripts run from any folder and leave no file behind in it (scaling: its --data-dir)
    assert sorted(p.name for p in tmp_path.iterdir()) == (
        ["scaling"] if name == "scaling.py" else []), list(tmp_path.iterdir())


def test_async_rate_profile_fits_the_owners_plan():
    """`make bench` crashed in async_rate.py's one-process profile: 3,000 timed answers of an
    owner whose plan (caps = T = 2,000) allowed 2,000 (BudgetExceededError). compute_cost gives
    that owner a plan covering every timed answer: at the full run's settings it completes."""
    mod = _load("async_rate.py")
    s = mod.settings(8, 10, 100, 2000, "owner_request")
    assert mod.PROFILE_REPS > s.caps[0]  # the case that crashed
    from mpi_dp.data.synth import synth_regression

    data = synth_regression(8, 100, 10, 0.25, seed=1, public=0)
    owner_s, learner_s = mod.compute_cost(s, data)
    assert owner_s > 0 and learner_s > 0


@pytest.mark.parametrize("method", ["sync_star", "async_star", "admm", "dola", "p2p"])
def test_scaling_jobs_and_data_commands_are_valid(method, tmp_path):
    """scaling.py's quick mode runs sync_star only; the jobs it writes for every method (both
    tables) pass the job validation, and its `mpi-dp data synth` options the CLI parser."""
    from mpi_dp.cli import build_parser
    from mpi_dp.job import load_job

    mod = _load("scaling.py")
    assert method in mod.METHODS
    for same in (False, True):
        job = tmp_path / f"{method}_{same}.toml"
        job.write_text(mod.job_text(method, tmp_path / "data.h5", tmp_path / "out.h5", 4, 2, 16,
                                    same))
        load_job(job)
    build_parser().parse_args(["data", "synth", *mod.synth_args(method, 16), "--out",
                               str(tmp_path / "d.h5")])


@functools.cache
def _load(name: str):
    """benchmarks/NAME imported as a module (its main() not run)."""
    spec = importlib.util.spec_from_file_location(f"bench_{Path(name).stem}", BENCH / name)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod
