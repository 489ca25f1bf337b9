"""Bad input never gives a traceback: one table of user mistakes, each with its exit code 2, the
message a user reads, and no result file (nor PATH.partial) left behind."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest
from helpers import mpi_run

from mpi_dp.data.shards import rewrite_shards
from mpi_dp.data.synth import write_synth

BASE = """name = "b"
algorithm = "sync_star"
data = "{data}"
T = 3
runs = 2
eps = 1.0
"""


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> Path:
    """A work folder: good, broken and foreign shard files, a result, a CSV, a plain file."""
    d = tmp_path_factory.mktemp("bad")
    write_synth(d / "good.h5", "regression", 3, 60, 4, 0.5, 1, public=50)
    write_synth(d / "bin.h5", "binary", 3, 60, 4, 0.3, 1)
    shutil.copy(d / "good.h5", d / "nan.h5")
    with h5py.File(d / "nan.h5", "r+") as f:  # owner 1's record 3 (rows offsets[1]: of X)
        x = f["agents/X"][()]
        x[int(f["agents/offsets"][1]) + 3, 2] = np.nan
        f["agents/X"][...] = x
    rewrite_shards(d / "good.h5", d / "noowner.h5", layout="groups")  # format_version 1
    with h5py.File(d / "noowner.h5", "r+") as f:
        del f["agents/2"]
    (d / "plain").write_text("not HDF5")
    with h5py.File(d / "foreign.h5", "w") as f:
        f["x"] = 1
    (d / "x.csv").write_text("a,b,y\n1,2,3\n4,5,6\n")
    (d / "job.toml").write_text(BASE.format(data="good.h5"))
    cp = _cli(d, "run", "job.toml", "--out", "result.h5", "--quiet")
    assert cp.returncode == 0, cp.stderr
    return d


def _cli(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mpi_dp", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=300)


def _job(extra: str = "", data: str = "good.h5", **replace: str) -> str:
    text = BASE.format(data=data) + extra
    for a, b in replace.items():
        text = text.replace(a.replace("_", " "), b)
    return text


#: (id, job text or None, command-line arguments after the job, message fragment)
RUN_CASES = [
    ("job file missing", None, ["run", "missing.toml"], "job file missing.toml not found"),
    ("job not TOML", "name = [unclosed", [], "not valid TOML"),
    ("unknown key", _job("epsilon = 1.0\n"), [], "unknown key 'epsilon' (did you mean 'eps'?)"),
    ("wrong type", _job().replace("runs = 2", 'runs = "many"'), [],
     "key 'runs': expected integer, got str 'many'"),
    ("unknown algorithm", _job().replace("sync_star", "nope"), [],
     "key 'algorithm': 'nope' is not one of"),
    ("negative eps", _job().replace("eps = 1.0", "eps = -1.0"), [],
     "key 'eps': budgets must be positive numbers or inf"),
    ("T zero", _job().replace("T = 3", "T = 0"), [], "key 'T': must be at least 1, got 0"),
    ("runs zero", _job().replace("runs = 2", "runs = 0"), [], "key 'runs': must be at least 1"),
    ("unknown variant", _job('variant = "alg3"\n'), [], "key 'variant': 'alg3' is not one of"),
    ("unknown swept variant", _job('[sweep]\nvariant = ["alg3"]\n'), [],
     "key 'sweep.variant[0]': 'alg3' is not one of"),
    ("unknown sweep key", _job("[sweep]\nfoo = [1, 2]\n"), [], "unknown key 'sweep.foo'"),
    ("unknown loss", _job('loss = "cubic"\n'), [], "key 'loss': 'cubic' is not one of"),
    ("negative xi", _job("xi = -1.0\n"), [], "key 'xi': must be > 0"),
    ("record_every negative", _job("record_every = -1\n"), [], "key 'record_every': must be at least 1"),
    ("negative seed", _job("seed = -1\n"), [], "key 'seed': must be non-negative"),
    ("negative first_run", _job("first_run = -3\n"), [], "key 'first_run': must be non-negative"),
    ("delta outside (0, 1)", _job("[privacy]\ndelta = 2.0\n"), [],
     "key 'privacy.delta': must be 'auto' or a number in (0, 1)"),
    ("delta at or above 1/n_i", _job("[privacy]\ndelta = 0.02\n"), [],
     "key 'privacy.delta': delta = 0.02 is at or above 1/n_i = 1/60 for owner 0 (n_i = 60 "
     "records)"),
    ("unknown calibration rule", _job('[privacy]\ncalibration = "loose"\n'), [],
     "key 'privacy.calibration': 'loose' is not one of 'pld', 'basic', 'paper'"),
    ("eps list of wrong length", _job().replace("eps = 1.0", "eps = [1.0, 2.0]"), [],
     "key 'eps': 2 values given but the shard file good.h5 has 3 owners"),
    ("n beyond the shard", _job("n = 100000\n"), [],
     "key 'n': owner 0 should use 100000 records but holds only 60"),
    ("star key in an admm job", _job("xi = 1.0\n").replace('"sync_star"', '"admm"'), [],
     "key 'xi': is not read by algorithm 'admm'"),
    ("key of another method", _job("owners = 10\n"), [],
     "key 'owners': is not read by algorithm 'sync_star'"),
    ("clip off with a finite eps", _job("clip = false\n"), [],
     "clip = false voids the DP guarantee"),
    ("constant step with noise", _job('[step]\nschedule = "constant"\n'), [],
     "a constant step does not converge with noise"),
    ("logistic loss on regression data", _job('loss = "logistic"\n'), [],
     "logistic loss needs a binary shard (labels -1/+1); good.h5 holds a regression task"),
    ("hinge loss on regression data", _job('loss = "hinge"\n'), [],
     "hinge loss needs a binary shard"),
    ("admm on regression data", _job().replace('"sync_star"', '"admm"'), [],
     "admm trains a multinomial logistic model and needs a classification shard"),
    ("dola on regression data", _job().replace('"sync_star"', '"dola"'), [],
     "dola trains a binary linear SVM; the shard file good.h5 holds a regression task"),
    ("p2p without a graph", _job().replace('"sync_star"', '"p2p"'), [],
     "has no public graph"),
    ("live mode on one rank",
     _job('[async]\nmode = "live"\n').replace('"sync_star"', '"async_star"'), [],
     "live mode needs owners on other ranks than the learner"),
    ("shard file missing", _job(data="nothere.h5"), [], "shard file 'nothere.h5' not found"),
    ("shard not HDF5", _job(data="plain"), [], "shard file 'plain' is not a readable HDF5 file"),
    ("shard owner missing", _job(data="noowner.h5"), [], "1 of 3 agent groups missing: 2"),
    ("NaN in a shard", _job(data="nan.h5"), [],
     "owner 1: record 3, feature 2 is nan: the data must be finite"),
    ("--set without =", _job(), ["--set", "T"], "--set 'T': expected key=value"),
    ("--set of a bad value", _job(), ["--set", "T=abc"], "key 'T': expected integer, got str"),
    ("--set of a swept key", _job("[sweep]\neps = [1.0, 2.0]\n"), ["--set", "eps=5"],
     "'eps' is swept in [sweep] (the sweep would ignore it)"),
    ("output exists", _job(), ["--out", "result.h5"],
     "result.h5 exists: a run never replaces a result; pass --overwrite"),
    ("output is a directory", _job(), ["--out", "."], "is a directory; give a file path"),
    ("output under a plain file", _job(), ["--out", "plain/x.h5"],
     "cannot write the result plain/x.h5"),
    ("resume with nothing to resume", _job(), ["--resume"], "nothing to resume"),
]

OTHER_CASES = [
    ("analyze a missing file", ["analyze", "nope.h5"], "result file not found: nope.h5"),
    ("analyze a plain file", ["analyze", "plain"], "not a readable HDF5 file"),
    ("analyze a foreign HDF5", ["analyze", "foreign.h5"], "not an mpi_dp result file"),
    ("analyze a shard file", ["analyze", "good.h5"],
     "root attribute format = 'mpi_dp.shards', expected 'mpi_dp.results'"),
    ("analyze an unknown metric", ["analyze", "result.h5", "--metric", "nope"],
     "has no metric 'nope'; available:"),
    ("analyze --csv under a plain file", ["analyze", "result.h5", "--csv", "plain/t.csv"],
     "cannot write or read"),
    ("plot under a plain file", ["plot", "result.h5", "--out", "plain/fig"],
     "cannot write or read"),
    ("audit with too few runs", ["audit", "job.toml", "--runs", "10"], "--runs must be >= 20"),
    ("audit of a sweep", ["audit", "sweep.toml"],
     "an audit needs exactly one configuration, this job has 2"),
    ("audit with a bad canary", ["audit", "job.toml", "--canary", "best"],
     "--canary must be worst or a record index"),
    ("audit with a bad release", ["audit", "job.toml", "--release", "last"],
     "--release must be a positive release number, 'all' or 'final'"),
    ("audit onto a result", ["audit", "job.toml", "--out", "result.h5"],
     "an audit never overwrites a result"),
    ("synth without agents", ["data", "synth", "--task", "regression", "--agents", "0",
                              "--records", "10", "--dim", "3", "--out", "s.h5"],
     "--agents 0: must be an integer >= 1"),
    ("synth of an unknown task", ["data", "synth", "--task", "nope", "--out", "s.h5"],
     "invalid choice: 'nope'"),
    ("prepare a missing CSV", ["data", "prepare", "csv", "none.csv", "--target", "y",
                               "--out", "p.h5"], "file 'none.csv' not found"),
    ("prepare without a target", ["data", "prepare", "csv", "x.csv", "--out", "p.h5"],
     "needs --target COLUMN"),
    ("prepare --key without --partition key", ["data", "prepare", "csv", "x.csv", "--target",
                                               "y", "--key", "a", "--out", "p.h5"],
     "--partition key"),
    ("prepare an unknown recipe", ["data", "prepare", "nosuchrecipe"],
     "unknown recipe 'nosuchrecipe'"),
    ("forecast without its fit file", ["forecast", "predict", "--fit", "none.json", "--n", "100",
                                       "--eps", "1", "--owners", "2"],
     "forecast file not found: none.json"),
]


@pytest.mark.parametrize("case", RUN_CASES, ids=[c[0] for c in RUN_CASES])
def test_a_bad_run_stops_with_one_clear_message_and_no_file(files, case):
    name, text, args, message = case
    if text is not None:
        (files / "case.toml").write_text(text)
        args = ["run", "case.toml", *args] if not args or args[0] != "run" else args
    out = files / "case_out.h5"
    if "--out" not in args:
        args = [*args, "--out", str(out)]
    cp = _cli(files, *args, "--quiet")
    assert cp.returncode == 2, (cp.returncode, cp.stderr)
    assert "Traceback" not in cp.stderr
    errors = [ln for ln in cp.stderr.splitlines() if ln.startswith("mpi-dp: error")]
    assert len(errors) == 1 and message in errors[0], cp.stderr
    assert not out.exists() and not Path(str(out) + ".partial").exists()


@pytest.mark.parametrize("case", OTHER_CASES, ids=[c[0] for c in OTHER_CASES])
def test_a_bad_command_stops_with_one_clear_message(files, case):
    name, args, message = case
    (files / "sweep.toml").write_text(_job("[sweep]\neps = [1.0, 2.0]\n"))
    cp = _cli(files, *args)
    assert cp.returncode == 2, (cp.returncode, cp.stderr)
    assert "Traceback" not in cp.stderr and message in cp.stderr, cp.stderr


@pytest.mark.parametrize("case", [c for c in RUN_CASES if c[0] in (
    "NaN in a shard", "logistic loss on regression data", "constant step with noise")],
    ids=lambda c: c[0])
def test_under_mpiexec_every_rank_stops_and_one_message_is_printed(files, case):
    name, text, args, message = case
    (files / "mpi_case.toml").write_text(text)
    out = files / "mpi_out.h5"
    cp = mpi_run(3, ["run", "mpi_case.toml", "--out", str(out), "--quiet"], cwd=files)
    assert cp.returncode == 2, cp.stderr
    assert cp.stderr.count(message) == 1 and "Traceback" not in cp.stderr, cp.stderr
    assert not out.exists() and not Path(str(out) + ".partial").exists()


def test_the_table_is_large_enough():
    assert len(RUN_CASES) + len(OTHER_CASES) >= 40


# -- faults that lose nothing (a full disk, a stop signal, absurd numbers, a bug) ------------------
FAULT_JOB = """name = "f"
algorithm = "sync_star"
variant = "alg2"
data = "{data}"
seed = 3
runs = {runs}
T = {T}
eps = 1.0
loss = "squared"
lam = 1e-2
theta_max = 1e6
xi = "auto"
record_every = {record_every}
[sweep]
eps = [1.0, 2.0, 4.0]
"""


def _fault_job(d: Path, runs: int = 2, T: int = 40, record_every: int = 2) -> Path:
    job = d / "fault.toml"
    job.write_text(FAULT_JOB.format(data=d / "good.h5", runs=runs, T=T, record_every=record_every))
    return job


def _same_datasets(a: Path, b: Path) -> None:
    from helpers import read_datasets

    x, y = read_datasets(a), read_datasets(b)
    assert sorted(x) == sorted(y)
    for k in x:
        assert x[k].tobytes() == y[k].tobytes(), k


@pytest.fixture()
def small_disk(tmp_path):
    """A 7 MiB tmpfs (root only): a result that needs more fills it."""
    mnt = tmp_path / "disk"
    mnt.mkdir()
    if os.geteuid() != 0 or not shutil.which("mount"):
        pytest.skip("a full disk needs a small tmpfs: mounting one needs root")
    cp = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=7m", "tmpfs", str(mnt)],
                        capture_output=True, text=True)
    if cp.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({cp.stderr.strip()})")
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def test_a_full_disk_keeps_what_was_complete_and_resume_finishes_it_bit_for_bit(
        files, tmp_path, small_disk):
    """The result needs ~7 MB on a 7 MiB disk (4 MiB of it held by PATH.reserve): the estimate
    refuses; with --force the run fills the disk in its second configuration, stops with one
    line naming the path, and the partial file holds the first configuration complete and
    readable; after space is freed --resume (on another rank count) equals an uninterrupted run."""
    job = _fault_job(files, runs=200, T=150, record_every=1)
    out = small_disk / "x.h5"
    cp = mpi_run(2, ["run", str(job), "--out", str(out), "--quiet"], cwd=files)
    assert cp.returncode == 2 and "pass --force" in cp.stderr and "free" in cp.stderr, cp.stderr
    assert not any(small_disk.iterdir())
    cp = mpi_run(2, ["run", str(job), "--out", str(out), "--quiet", "--force"], cwd=files)
    assert cp.returncode == 2, cp.stderr
    assert "Traceback" not in cp.stderr, cp.stderr
    errors = [ln for ln in cp.stderr.splitlines() if "mpi-dp: error" in ln]
    assert len(errors) == 1 and "no space left on device" in errors[0], cp.stderr
    assert f"{out}.partial" in errors[0] and "--resume" in errors[0]
    assert sorted(p.name for p in small_disk.iterdir()) == ["x.h5.partial"]  # no reserve, lock
    with h5py.File(f"{out}.partial", "r", locking=False) as f:
        assert f.attrs["status"] == "failed" and "no space" in f.attrs["status_reason"]
        assert f["configs/000"].attrs["config_complete"]
        assert f["configs/000/metrics/psi"].shape == (151, 200)
    moved = tmp_path / "x.h5"  # "free space": continue it on a disk with room
    shutil.copy(f"{out}.partial", f"{moved}.partial")
    cp = mpi_run(3, ["run", str(job), "--out", str(moved), "--quiet", "--resume"], cwd=files)
    assert cp.returncode == 0, cp.stderr
    whole = tmp_path / "whole.h5"
    cp = mpi_run(2, ["run", str(job), "--out", str(whole), "--quiet"], cwd=files)
    assert cp.returncode == 0, cp.stderr
    _same_datasets(whole, moved)


def test_sigterm_stops_every_rank_at_a_record_and_resume_finishes_it_bit_for_bit(files, tmp_path):
    """SIGTERM to mpiexec mid-configuration (what Slurm's warning or a time limit sends): every
    rank stops at the next record after a checkpoint, the file says 'interrupted', the lock is
    gone, the log says how to resume, the exit status is 143; --resume equals an uninterrupted
    run bit for bit."""
    import signal
    import time

    from helpers import MPIEXEC, wait_for_progress

    job = _fault_job(files, runs=2, T=400000, record_every=50)
    out = tmp_path / "t.h5"
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", MPI_DP_CHECKPOINT_S="1000")
    # 3 configurations x 2,000 iterations: about 3 s of iterations on a quiet fast machine
    # (0.4 ms per iteration and configuration), so the signal, sent within 0.15 s of the fifth
    # record, lands while the job runs however fast the machine is
    proc = subprocess.Popen([MPIEXEC, "-n", "3", sys.executable, "-m", "mpi_dp", "run", str(job),
                             "--out", str(out), "--set", "T=2000"], cwd=files, env=env,
                            stderr=subprocess.PIPE, text=True)
    wait_for_progress(Path(f"{out}.partial"), "progress_record", 5, poll=0.05)
    time.sleep(0.1)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 143, err
    assert "Traceback" not in err and "interrupted" in err and "--resume" in err, err
    assert not Path(f"{out}.lock").exists() and not Path(f"{out}.reserve").exists()
    with h5py.File(f"{out}.partial", "r", locking=False) as f:
        assert f.attrs["status"] == "interrupted" and "SIGTERM" in f.attrs["status_reason"]
        stopped = int(f.attrs["progress_config"])
        assert "checkpoint" in f[f"configs/{stopped:03d}"]  # stopped inside a configuration
    cp = mpi_run(2, ["run", str(job), "--out", str(out), "--set", "T=2000", "--resume"],
                 cwd=files)
    assert cp.returncode == 0 and "resumed from its checkpoint" in cp.stderr, cp.stderr
    whole = tmp_path / "whole.h5"
    cp = mpi_run(3, ["run", str(job), "--out", str(whole), "--set", "T=2000", "--quiet"],
                 cwd=files)
    assert cp.returncode == 0, cp.stderr
    _same_datasets(whole, out)


def test_a_stop_signal_during_start_up_stops_cleanly_before_the_first_configuration(files,
                                                                                 tmp_path):
    """SIGTERM while the ranks still load the libraries (Slurm's time-limit warning on a busy
    node): no death by the signal, every rank stops before the first configuration, exit 143,
    the file says 'interrupted' and --resume then runs the job."""
    job = _fault_job(files, runs=2, T=200)
    out = tmp_path / "early.h5"
    env = {"MPI_DP_TEST_TERM_AT_START": "1"}
    cp = mpi_run(2, ["run", str(job), "--out", str(out)], cwd=files, env=env)
    assert cp.returncode == 143, cp.stderr
    assert "interrupted (stopped by SIGTERM)" in cp.stderr and "BAD TERMINATION" not in cp.stderr
    with h5py.File(f"{out}.partial", "r", locking=False) as f:
        assert f.attrs["status"] == "interrupted" and int(f.attrs["progress_config"]) == 0
    cp = mpi_run(2, ["run", str(job), "--out", str(out), "--resume", "--quiet"], cwd=files)
    assert cp.returncode == 0 and out.exists(), cp.stderr


def test_an_eps_so_large_the_noise_vanishes_runs_and_is_accounted_exactly(files):
    job = _fault_job(files)
    out = files / "huge_eps.h5"
    cp = _cli(files, "run", str(job), "--out", str(out), "--quiet", "--set", "sweep.eps=[1e300]")
    assert cp.returncode == 0 and "Traceback" not in cp.stderr, cp.stderr
    with h5py.File(out, "r") as f:
        assert f.attrs["status"] == "complete"
        ledger = f["configs/000/privacy/ledger"][()]
    assert np.all(np.isfinite(ledger["eps_basic"])) and np.all(ledger["target_eps"] == 1e300)
    cp = _cli(files, "analyze", str(out))
    assert cp.returncode == 0 and "Traceback" not in cp.stderr, cp.stderr


@pytest.mark.parametrize("key,value,says", [
    ("T", "1000000000000", "would run about"),
    ("runs", "100000000", "of memory"),
])
def test_absurd_numbers_are_refused_before_anything_runs(files, key, value, says):
    job = _fault_job(files)
    out = files / "absurd.h5"
    cp = _cli(files, "run", str(job), "--out", str(out), "--set", f"{key}={value}")
    assert cp.returncode == 2, cp.stderr
    errors = [ln for ln in cp.stderr.splitlines() if ln.startswith("mpi-dp: error")]
    assert len(errors) == 1 and says in errors[0] and "Traceback" not in cp.stderr, cp.stderr
    assert not out.exists() and not Path(f"{out}.partial").exists()
    assert "estimated before starting" not in cp.stderr  # refused: no estimate line to trust


def test_the_estimate_is_printed_before_the_first_iteration(files):
    job = _fault_job(files)
    cp = _cli(files, "run", str(job), "--out", str(files / "estimate.h5"), "--overwrite")
    assert cp.returncode == 0, cp.stderr
    est = cp.stderr.index("estimated before starting: result file about")
    assert est < cp.stderr.index("[1/3")


@pytest.mark.parametrize("ranks", [1, 3])
def test_a_bug_inside_a_method_prints_its_traceback_and_the_file_says_failed(files, ranks):
    """Only MpiDpError is a user error: an injected KeyError (a bug) prints its rank-tagged
    traceback, exits 1, and the result file records 'failed' with the exception."""
    job = _fault_job(files)
    out = files / f"bug{ranks}.h5"
    cp = mpi_run(ranks, ["run", str(job), "--out", str(out), "--quiet", "--overwrite"], cwd=files,
                 env={"MPI_DP_TEST_RAISE_AT": "1:3"})
    assert cp.returncode == 1, cp.stderr
    assert "internal error" in cp.stderr and "KeyError: 'typo_key'" in cp.stderr, cp.stderr
    assert "Traceback" in cp.stderr and "this is a bug in mpi_dp" in cp.stderr
    if ranks > 1:
        assert "[rank 0] Traceback" in cp.stderr
    assert "mpi-dp: error" not in cp.stderr  # not shown as the user's mistake
    assert not Path(f"{out}.lock").exists()
    with h5py.File(f"{out}.partial", "r", locking=False) as f:
        assert f.attrs["status"] == "failed"
        assert f.attrs["status_reason"] == "KeyError: 'typo_key'"
        assert f["configs/000"].attrs["config_complete"]


@pytest.mark.parametrize("value", ["abc", "-1", "nan"])
def test_a_bad_checkpoint_interval_is_one_line(files, value):
    job = _fault_job(files)
    out = files / "ckpt.h5"
    cp = subprocess.run([sys.executable, "-m", "mpi_dp", "run", str(job), "--out", str(out)],
                        cwd=files, capture_output=True, text=True, timeout=300,
                        env=dict(os.environ, MPI_DP_CHECKPOINT_S=value))
    assert cp.returncode == 2 and "Traceback" not in cp.stderr, cp.stderr
    errors = [ln for ln in cp.stderr.splitlines() if ln.startswith("mpi-dp: error")]
    assert len(errors) == 1 and "MPI_DP_CHECKPOINT_S" in errors[0], cp.stderr
    assert not out.exists() and not Path(f"{out}.partial").exists()


def test_the_result_names_the_bytes_of_its_shard_and_the_accountant_version(files):
    import hashlib
    from importlib.metadata import version

    with h5py.File(files / "result.h5", "r") as f:
        prov = dict(f["provenance"].attrs)
    assert prov["data_sha256"] == hashlib.sha256((files / "good.h5").read_bytes()).hexdigest()
    assert prov["dp_accounting"] == version("dp-accounting")


def test_the_job_parser_works_without_tomllib(files):
    """Python 3.10 has no tomllib: the package falls back to tomli (declared for < 3.11)."""
    pytest.importorskip("tomli", reason="tomli (the Python 3.10 fallback) is not installed")
    code = ("import sys; sys.modules['tomllib'] = None\n"
            "from mpi_dp.job import load_job\n"
            "job = load_job('job.toml', [])\n"
            "assert 'tomli' in sys.modules and job['T'] == 3, job['T']\n"
            "print('ok')")
    cp = subprocess.run([sys.executable, "-c", code], cwd=files, capture_output=True, text=True,
                        timeout=120)
    assert cp.returncode == 0 and cp.stdout.strip() == "ok", cp.stderr
