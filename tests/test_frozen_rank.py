"""A frozen rank (SIGSTOP: as a dead node or a hung file system) cannot hold a job after SIGTERM:
the healthy ranks abort after MPI_DP_STOP_GRACE_S (comm.watchdog), and the result file keeps
every complete configuration. A real `mpiexec -n 3` job launched from the serial suite."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import h5py
import numpy as np
import pytest
from helpers import MPIEXEC, mpi_run, write_job

#: a hang guard, not a performance limit: with the grace below the job ends seconds after SIGTERM
GUARD_S = 120
T, EVERY = 1500, 50
MARK = "MPI_DP_TEST_FROZEN_MARK"


def _rank_pids(mark: str) -> dict[int, int]:
    """{rank: pid} of the job's ranks: the processes whose environment holds our mark."""
    out = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            env = Path(f"/proc/{name}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if f"{MARK}={mark}".encode() in env:
            rank = next((e[len(b"PMI_RANK="):] for e in env if e.startswith(b"PMI_RANK=")), None)
            if rank is not None:
                out[int(rank)] = int(name)
    return out


def _alive(pid: int) -> bool:
    """The process exists and is not a zombie."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def _first_config_done(path: Path, proc: subprocess.Popen) -> None:
    t0 = time.monotonic()
    while time.monotonic() - t0 < GUARD_S:
        assert proc.poll() is None, proc.communicate()
        try:
            with h5py.File(path, "r", locking=False) as f:
                if f["configs/000"].attrs.get("config_complete", False):
                    return
        except (OSError, KeyError, RuntimeError, ValueError):  # not there yet, or mid-write
            pass
        time.sleep(0.1)
    raise AssertionError("the job never completed its first configuration")


@pytest.mark.parametrize("frozen", [2, 0])
def test_frozen_rank_cannot_hold_the_job_after_sigterm(tmp_path, small_shards, frozen):
    # 12 configurations of about 2 s each: the freeze comes long before the job's end (a freeze
    # in the job's last steps, after every collective, proves nothing: the others just exit)
    job = write_job(tmp_path / "frozen.toml", small_shards, T=T, runs=2, record_every=EVERY,
                    sweep={"eps": [1.0, 2.0, 3.0], "n": [500, 450, 400, 350]},
                    privacy={"calibration": "basic"})
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", MPI_DP_STOP_GRACE_S="5",
               **{MARK: str(tmp_path)})
    proc = subprocess.Popen([MPIEXEC, "-n", "3", sys.executable, "-m", "mpi_dp", "run", str(job),
                             "--quiet"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True, env=env)
    pids: dict[int, int] = {}
    try:
        _first_config_done(tmp_path / "frozen.h5.partial", proc)
        pids = _rank_pids(str(tmp_path))
        assert sorted(pids) == [0, 1, 2], pids
        os.kill(pids[frozen], signal.SIGSTOP)  # it never answers again
        time.sleep(0.5)  # the others block in the next collective
        os.kill(proc.pid, signal.SIGTERM)  # as slurm/run.sbatch on Slurm's warning
        try:
            _, err = proc.communicate(timeout=GUARD_S)
        except subprocess.TimeoutExpired:
            pytest.fail(f"mpiexec still runs {GUARD_S} s after SIGTERM with rank {frozen} frozen")
        t0 = time.monotonic()
        while any(_alive(p) for p in pids.values()) and time.monotonic() - t0 < GUARD_S:
            time.sleep(0.1)
        assert not [r for r, p in pids.items() if _alive(p)], "ranks left running"
    finally:
        if frozen in pids:
            for sig in (signal.SIGCONT, signal.SIGKILL):
                try:
                    os.kill(pids[frozen], sig)
                except ProcessLookupError:
                    pass
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode != 0
    said = re.findall(r"^mpi-dp: rank (\d) of 3: still running [57] s after SIGTERM: a rank does "
                      r"not answer.*aborting every rank \(MPI_DP_STOP_GRACE_S=5 sets the wait\)\. "
                      r"The result file keeps every complete configuration; .*--resume", err, re.M)
    assert said and str(frozen) not in said, err  # a healthy rank said it, once or per rank

    from mpi_dp.analysis import open_result

    with open_result(tmp_path / "frozen.h5") as res:  # reads frozen.h5.partial
        assert res.path.name == "frozen.h5.partial"
        assert res.status in ("running", "interrupted")
        cfg = res.configs[0]
        assert cfg.group.attrs["config_complete"]
        k = T // EVERY + 1
        assert cfg.n_records() == k
        np.testing.assert_array_equal(cfg.iterations(), np.arange(k) * EVERY)
        psi = cfg.metric("psi")
        assert psi.shape == (k, 2) and np.all(np.isfinite(psi))
        assert cfg.group["models/final"].shape[0] == 2


def test_a_bad_grace_period_is_one_clear_message(tmp_path, small_shards):
    job = write_job(tmp_path / "grace.toml", small_shards, T=20, runs=1)
    cp = mpi_run(2, ["run", str(job), "--quiet"], env={"MPI_DP_STOP_GRACE_S": "soon"},
                 timeout=GUARD_S)
    assert cp.returncode == 2, cp.stderr
    assert cp.stderr.count("mpi-dp: error: MPI_DP_STOP_GRACE_S='soon': expected a number of "
                           "seconds > 0") == 1, cp.stderr
    assert "Traceback" not in cp.stderr and not (tmp_path / "grace.h5.partial").exists()
