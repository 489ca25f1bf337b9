"""slurm/run.sbatch submitted with a real `sbatch` (skipped where no Slurm cluster answers).

On a development machine: ../shared/tools/local-slurm start (a real single-node Slurm).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import h5py
import pytest
from helpers import HANG_GUARD_S, start_when_requeued, write_job

SCRIPT = Path(__file__).resolve().parents[1] / "slurm" / "run.sbatch"


def _slurm_up() -> bool:
    if not shutil.which("sbatch"):
        return False
    try:
        out = subprocess.run(["sinfo", "-h", "-o", "%T"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return False
    return out.returncode == 0 and any(s in out.stdout for s in ("idle", "mixed", "alloc"))


#: the marks of a test that submits to Slurm (also test_merge's): skipped where no cluster answers
#: (sinfo asked once), and on one pytest-xdist worker (one local node: its jobs one at a time)
SLURM_MARKS = (pytest.mark.skipif(not _slurm_up(), reason="no Slurm cluster answers (sinfo)"),
               pytest.mark.xdist_group("slurm"))
pytestmark = list(SLURM_MARKS)


def _sbatch(tmp_path: Path, job: Path, out: Path) -> str:
    """Submit slurm/run.sbatch JOB --out OUT on 3 tasks from tmp_path; returns the job id."""
    env = dict(os.environ, MPI_DP_VENV=str(Path(sys.executable).parent.parent))
    sub = subprocess.run(["sbatch", "--parsable", "--ntasks=3", "--export=ALL",
                          f"--chdir={tmp_path}", str(SCRIPT), str(job), "--out", str(out)],
                         capture_output=True, text=True, env=env, timeout=60)
    assert sub.returncode == 0, sub.stderr
    return sub.stdout.strip().split(";")[0]


def _wait_gone(jid: str) -> None:
    """Wait until Slurm no longer lists job `jid`."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < HANG_GUARD_S:
        q = subprocess.run(["squeue", "-h", "-j", jid, "-o", "%T"], capture_output=True, text=True)
        if not q.stdout.strip():
            return
        time.sleep(1)
    raise AssertionError(f"Slurm job {jid} did not finish")


def test_sbatch_runs_a_job_file(tmp_path, small_shards):
    job = write_job(tmp_path / "slurm.toml", small_shards, runs=2, T=10, sweep={"eps": [1.0, 4.0]})
    out = tmp_path / "slurm_result.h5"
    jid = _sbatch(tmp_path, job, out)
    _wait_gone(jid)
    log = (tmp_path / f"slurm-mpi_dp-{jid}.out").read_text()
    assert "mpi-dp: done" in log, log
    with h5py.File(out, "r", locking=False) as f:
        assert f.attrs["status"] == "complete"
        assert f["provenance"].attrs["n_ranks"] == 3
        assert f["configs/001/metrics/psi"].shape == (11, 2)


def test_sbatch_without_job_file_explains_usage(tmp_path):
    sub = subprocess.run(["sbatch", "--parsable", "--wait", f"--chdir={tmp_path}", str(SCRIPT)],
                         capture_output=True, text=True, timeout=HANG_GUARD_S)
    assert sub.returncode != 0
    jid = sub.stdout.strip().split(";")[0]
    assert "usage: sbatch" in (tmp_path / f"slurm-mpi_dp-{jid}.out").read_text()


def test_a_requeued_job_resumes_and_equals_an_uninterrupted_run(tmp_path, small_shards):
    """`scontrol requeue` mid-run: Slurm stops the job and starts it again (SLURM_RESTART_COUNT
    = 1); run.sbatch passes --resume=auto, the complete configurations are kept and the final
    datasets equal, bit for bit, those of a run that was never interrupted."""
    from helpers import mpi_run, read_datasets, wait_for_progress

    job = write_job(tmp_path / "rq.toml", small_shards, runs=2, T=1500, record_every=150,
                    sweep={"eps": [1.0, 2.0, 4.0]})
    whole = tmp_path / "whole.h5"
    cp = mpi_run(3, ["run", str(job), "--out", str(whole), "--quiet"])
    assert cp.returncode == 0, cp.stderr
    out = tmp_path / "rq_result.h5"
    jid = _sbatch(tmp_path, job, out)
    wait_for_progress(tmp_path / "rq_result.h5.partial", "progress_config", 1)  # configuration 2
    rq = subprocess.run(["scontrol", "requeue", jid], capture_output=True, text=True, timeout=60)
    assert rq.returncode == 0, rq.stderr
    start_when_requeued(jid)
    _wait_gone(jid)
    log = (tmp_path / f"slurm-mpi_dp-{jid}.out").read_text()
    assert "resuming" in log and "mpi-dp: done" in log, log
    with h5py.File(out, "r", locking=False) as f:
        assert f.attrs["status"] == "complete" and f.attrs["resumed"] >= 1
    a, b = read_datasets(whole), read_datasets(out)
    assert sorted(a) == sorted(b)
    for k in a:
        assert a[k].tobytes() == b[k].tobytes(), k


def test_a_time_limit_stops_at_a_record_requeues_and_resumes_bit_for_bit(tmp_path, small_shards):
    """--time=1 with the script's warning 40 s before it (--signal=B:USR1@40): every rank stops at
    its next record after a checkpoint, the file says 'interrupted', the script requeues the job
    (given 5 minutes now, so the next attempt ends), the next attempt resumes and appends to the
    same log; the result equals an uninterrupted run bit for bit. (Resuming inside a
    configuration after SIGTERM: test_bad_inputs.py.)"""
    from helpers import mpi_run, read_datasets

    # longer than the 20 s before the warning, even on a quiet machine
    job = write_job(tmp_path / "tl.toml", small_shards, runs=2, T=12000, record_every=200,
                    sweep={"eps": [1.0, 2.0]})
    out = tmp_path / "tl_result.h5"
    env = dict(os.environ, MPI_DP_VENV=str(Path(sys.executable).parent.parent))
    sub = subprocess.run(["sbatch", "--parsable", "--ntasks=2", "--time=1",
                          "--signal=B:USR1@40", "--export=ALL", f"--chdir={tmp_path}",
                          str(SCRIPT), str(job), "--out", str(out)],
                         capture_output=True, text=True, env=env, timeout=60)
    assert sub.returncode == 0, sub.stderr
    jid = sub.stdout.strip().split(";")[0]
    whole = tmp_path / "whole.h5"  # meanwhile, the uninterrupted run
    cp = mpi_run(2, ["run", str(job), "--out", str(whole), "--quiet"])
    assert cp.returncode == 0, cp.stderr
    t0 = time.monotonic()
    while time.monotonic() - t0 < 2 * HANG_GUARD_S:
        q = subprocess.run(["squeue", "-h", "-j", jid, "-o", "%T"], capture_output=True,
                           text=True)
        if not q.stdout.strip():
            break
        if "PENDING" in q.stdout:  # requeued: it would wait ~2 minutes (BeginTime)
            subprocess.run(["scontrol", "update", f"JobId={jid}", "TimeLimit=5",
                            "StartTime=now"], capture_output=True, timeout=60)
        time.sleep(2)
    else:
        raise AssertionError(f"Slurm job {jid} did not finish")
    log = (tmp_path / f"slurm-mpi_dp-{jid}.out").read_text()
    # stopped at a record (or, if the warning came during set-up, before the first configuration)
    assert "time limit in 60 s" in log and "interrupted (stopped by SIGTERM)" in log, log
    assert "requeueing job" in log, log
    assert "mpi-dp: done" in log and "Traceback" not in log, log
    assert log.index("requeueing job") < log.index("resuming")  # one log, both attempts
    with h5py.File(out, "r", locking=False) as f:
        assert f.attrs["status"] == "complete" and f.attrs["resumed"] >= 1
    assert not Path(f"{out}.lock").exists()
    a, b = read_datasets(whole), read_datasets(out)
    assert sorted(a) == sorted(b)
    for k in a:
        assert a[k].tobytes() == b[k].tobytes(), k


GPU_SCRIPT = SCRIPT.with_name("run_gpu.sbatch")


@pytest.mark.parametrize("backend", ["array_api_strict", "cupy"])
def test_the_gpu_script_sets_the_backend(tmp_path, backend):
    """slurm/run_gpu.sbatch is run.sbatch with backend = "cupy" (here --gres=none: this node
    has no GPU): with MPI_DP_BACKEND=array_api_strict (the CPU stand-in) the admm job runs on
    2 ranks and records its backend; with CuPy asked for where there is none, the job stops
    before its output exists, naming the key."""
    from mpi_dp.backend import gpu_available
    from mpi_dp.data.synth import write_synth

    if backend == "cupy" and gpu_available()[0]:
        pytest.skip("a GPU is here: the refusal is not what this node shows")
    data = write_synth(tmp_path / "mc.h5", "multiclass", 4, 150, 5, 0.35, 5, public=200,
                       classes=3)
    job = write_job(tmp_path / "gpu.toml", data, algorithm="admm", runs=2, T=8, record_every=4)
    out = tmp_path / "gpu_result.h5"
    env = dict(os.environ, MPI_DP_VENV=str(Path(sys.executable).parent.parent),
               MPI_DP_BACKEND=backend)
    sub = subprocess.run(["sbatch", "--parsable", "--wait", "--gres=none", "--ntasks=2",
                          "--export=ALL", f"--chdir={tmp_path}", str(GPU_SCRIPT), str(job),
                          "--out", str(out)], capture_output=True, text=True, env=env,
                         timeout=HANG_GUARD_S)
    jid = sub.stdout.strip().split(";")[0]
    log = (tmp_path / f"slurm-mpi_dp_gpu-{jid}.out").read_text()
    assert f'backend = "{backend}"' in log, log
    if backend == "cupy":
        assert sub.returncode != 0 and "key 'backend'" in log, log
        assert not list(tmp_path.glob("gpu_result.h5*"))
        return
    assert sub.returncode == 0 and "mpi-dp: done" in log, log
    with h5py.File(out, "r", locking=False) as f:
        assert f.attrs["status"] == "complete"
        assert f["provenance"].attrs["n_ranks"] == 2
        assert f.attrs["backend"] == "array_api_strict"  # one configuration: the root
