"""Never lose a result: no silent overwrite, PATH.partial until complete, one writer per output,
and readers that say when a file is incomplete."""

from __future__ import annotations

import subprocess
import sys

import h5py
import pytest
from helpers import mpi_run, wait_for_progress, write_job
from mpi4py import MPI

from mpi_dp.analysis import fit
from mpi_dp.analysis.load import open_result
from mpi_dp.errors import MpiDpError
from mpi_dp.results.output import OutputLock, lock_path, partial_path
from mpi_dp.runner import run_job


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mpi_dp", *args], capture_output=True, text=True,
                          timeout=300)


def test_a_run_never_replaces_a_result_without_overwrite(tmp_path, small_shards):
    assert MPI.COMM_WORLD.Get_size() == 1
    job = write_job(tmp_path / "a.toml", small_shards, T=3, runs=2)
    out = run_job(job, progress=False)
    assert out == tmp_path / "a.h5" and not partial_path(out).exists()
    assert not lock_path(out).exists()  # the lock file goes with the job
    before = out.read_bytes()
    with pytest.raises(MpiDpError, match="exists: a run never replaces a result; pass --overwrite"):
        run_job(job, progress=False)
    assert out.read_bytes() == before
    run_job(job, ["T=4"], progress=False, overwrite=True)
    with h5py.File(out, "r") as f:
        assert f.attrs["status"] == "complete" and f["metrics/iteration"][-1] == 4


def test_a_failed_job_leaves_the_previous_result_untouched(tmp_path, small_shards, monkeypatch):
    """--overwrite replaces only at completion: a job that fails mid-run keeps its records in
    PATH.partial (status failed) and the good result stays."""
    job = write_job(tmp_path / "b.toml", small_shards, T=3, runs=2)
    out = run_job(job, progress=False)
    good = out.read_bytes()
    from mpi_dp.algorithms import sync_star

    real = sync_star.OwnerBlock.answer  # the hosted owners answer as one block
    calls = {"n": 0}

    def failing(self, theta):
        calls["n"] += 1
        if calls["n"] > 3:
            raise RuntimeError("owner lost its disk")
        return real(self, theta)

    monkeypatch.setattr(sync_star.OwnerBlock, "answer", failing)
    with pytest.raises(RuntimeError, match="owner lost its disk"):
        run_job(job, ["T=10"], progress=False, overwrite=True)
    assert out.read_bytes() == good
    with h5py.File(partial_path(out), "r") as f:
        assert f.attrs["status"] == "failed" and f.attrs["progress_record"] >= 1
    assert not lock_path(out).exists()
    # the stopped job's .partial is not replaced silently either
    out.unlink()
    with pytest.raises(MpiDpError, match=r"b\.h5\.partial is left by a job or merge that "
                       r"stopped before completing \(status failed, configuration 1/1, record \d+"):
        run_job(job, progress=False)


def test_a_second_writer_is_refused_while_the_first_holds_the_output(tmp_path, small_shards):
    job = write_job(tmp_path / "c.toml", small_shards, T=3, runs=2)
    lock = OutputLock(tmp_path / "c.h5")
    lock.acquire()  # as a running job would
    try:
        cp = _cli("run", str(job), "--quiet")
        assert cp.returncode == 2
        assert "c.h5 is being written by pid" in cp.stderr and "Traceback" not in cp.stderr
        assert not (tmp_path / "c.h5").exists() and not partial_path(tmp_path / "c.h5").exists()
    finally:
        lock.release()
    assert _cli("run", str(job), "--quiet").returncode == 0


def test_a_killed_job_is_reported_incomplete_and_its_lock_dies_with_it(tmp_path, small_shards):
    """SIGKILL (no chance to mark the file): analyze reads PATH.partial and says the job is
    gone and where it stopped; a new job may start at once (the kernel dropped the lock)."""
    import os
    import signal

    job = write_job(tmp_path / "d.toml", small_shards, T=100000, runs=2, record_every=20)
    part = partial_path(tmp_path / "d.h5")
    proc = subprocess.Popen([sys.executable, "-m", "mpi_dp", "run", str(job), "--quiet"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        wait_for_progress(part, "progress_record", 3)
        os.kill(proc.pid, signal.SIGKILL)
        proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    cp = _cli("analyze", str(tmp_path / "d.h5"))
    assert cp.returncode == 0, cp.stderr
    assert "INCOMPLETE: the job that wrote" in cp.stderr and "is gone" in cp.stderr
    assert "configuration 1/1, record" in cp.stderr
    with open_result(tmp_path / "d.h5") as res:
        assert res.status == "running" and res.configs[0].n_records() >= 3
    cp = _cli("run", str(job), "--set", "T=3", "--quiet")
    assert cp.returncode == 2 and "left by a job or merge that stopped" in cp.stderr
    assert _cli("run", str(job), "--set", "T=3", "--quiet", "--overwrite").returncode == 0
    assert (tmp_path / "d.h5").exists() and not part.exists()


def test_a_swept_key_set_on_the_command_line_is_an_error(tmp_path, small_shards):
    job = write_job(tmp_path / "e.toml", small_shards, T=3, runs=2, sweep={"eps": [1.0, 2.0]})
    cp = _cli("run", str(job), "--set", "eps=5", "--quiet")
    assert cp.returncode == 2
    assert "'eps' is swept in [sweep]" in cp.stderr and "sweep.eps=[5]" in cp.stderr
    assert not (tmp_path / "e.h5").exists()


def test_unwritable_csv_is_a_clear_error(tmp_path, small_shards):
    job = write_job(tmp_path / "f.toml", small_shards, T=3, runs=2)
    assert _cli("run", str(job), "--quiet").returncode == 0
    blocker = tmp_path / "file"
    blocker.write_text("x")
    cp = _cli("analyze", str(tmp_path / "f.h5"), "--csv", str(blocker / "t.csv"))
    assert cp.returncode == 2 and "Traceback" not in cp.stderr
    assert "cannot write or read" in cp.stderr and "t.csv" in cp.stderr


def test_the_constant_is_not_fitted_from_one_point(tmp_path, small_shards):
    """One configuration fits any constant exactly: no fit (R^2 would be nan)."""
    job = write_job(tmp_path / "g.toml", small_shards, T=20, runs=4, eps=1.0)
    with open_result(run_job(job, progress=False)) as res:
        assert fit.fixed_exponent_constant(res) is None


@pytest.mark.parametrize("n", [2])
def test_under_mpiexec_the_result_is_renamed_once_complete(tmp_path, small_shards, n):
    job = write_job(tmp_path / "h.toml", small_shards, T=3, runs=2)
    cp = mpi_run(n, ["run", str(job)])
    assert cp.returncode == 0, cp.stderr
    assert "writing" in cp.stderr and "h.h5.partial" in cp.stderr
    assert (tmp_path / "h.h5").exists() and not partial_path(tmp_path / "h.h5").exists()
    cp = mpi_run(n, ["run", str(job), "--quiet"])
    assert cp.returncode == 2 and cp.stderr.count("exists: a run never replaces") == 1


def _resume_jobs(tmp_path, small_shards) -> dict:
    """One small swept job per method (3 configurations each)."""
    from mpi_dp.data.synth import write_synth

    mc = write_synth(tmp_path / "mc.h5", "multiclass", 4, 120, 6, 0.35, 5, public=200,
                     classes=3)
    online = write_synth(tmp_path / "on.h5", "online", 16, 60, 5, 0.05, 3, public=100)
    p2p = write_synth(tmp_path / "p2p.h5", "p2p", 24, 0, 4, 0.05, 3)
    eps = {"eps": [0.5, 1.0, 5.0]}
    return {
        "sync_star": write_job(tmp_path / "s.toml", small_shards, T=12, runs=2, record_every=3,
                               sweep=eps),
        "async_star": write_job(tmp_path / "a.toml", small_shards, algorithm="async_star",
                                variant="proof", runs=2, T=40, lam=1e-5, theta_max=10.0,
                                record_every=8, sweep=eps),
        "admm": write_job(tmp_path / "m.toml", mc, algorithm="admm", variant="iadmm", runs=2,
                          T=8, record_every=2, sweep=eps),
        "dola": write_job(tmp_path / "d.toml", online, algorithm="dola", T=8, runs=2,
                          record_every=2, seed=5, sweep=eps, dola={"graph": "medium"}),
        "p2p": write_job(tmp_path / "p.toml", p2p, algorithm="p2p", T=24 * 6, runs=2, seed=7,
                         record_every=48, sweep=eps, p2p={"mu": 1.0}),
    }


@pytest.mark.parametrize("method", ["sync_star", "async_star", "admm", "dola", "p2p"])
def test_a_killed_job_resumed_on_another_rank_count_equals_the_uninterrupted_one(
        tmp_path, small_shards, method):
    """SIGKILL of the writer at record 2 of configuration 2 (mpiexec -n 4); `run --resume` on 2
    ranks keeps configuration 1, reruns 2 and runs 3; every dataset equals, bit for bit, the
    file of an uninterrupted run on 4 ranks."""
    from helpers import read_datasets

    job = _resume_jobs(tmp_path, small_shards)[method]
    whole, cut = tmp_path / "whole.h5", tmp_path / "cut.h5"
    cp = mpi_run(4, ["run", str(job), "--out", str(whole), "--quiet"])
    assert cp.returncode == 0, cp.stderr
    cp = mpi_run(4, ["run", str(job), "--out", str(cut), "--quiet"],
                 env={"MPI_DP_TEST_KILL_AT": "1:2"})
    assert cp.returncode != 0 and not cut.exists()
    with h5py.File(partial_path(cut), "r", locking=False) as f:
        assert f.attrs["status"] == "running" and f.attrs["progress_config"] == 1
        assert f["configs/000"].attrs["config_complete"] and "configs/002" not in f
    cp = mpi_run(2, ["run", str(job), "--out", str(cut), "--resume"])
    assert cp.returncode == 0, cp.stderr
    assert "1 of 3 configuration(s) complete" in cp.stderr
    a, b = read_datasets(whole), read_datasets(cut)
    assert sorted(a) == sorted(b) and "configs/002/privacy/ledger" in a
    for k in a:
        assert a[k].tobytes() == b[k].tobytes(), k
    with h5py.File(cut, "r") as f:
        assert f.attrs["status"] == "complete" and f.attrs["resumed"] == 1


def test_a_shard_file_is_readable_like_a_result(tmp_path):
    """mkstemp creates 0600; a shard file gets the umask's permissions, as a result file does."""
    import os
    import stat

    from mpi_dp.data.synth import write_synth

    mask = os.umask(0o022)
    try:
        path = write_synth(tmp_path / "s.h5", "regression", 2, 20, 3, 0.5, 1)
    finally:
        os.umask(mask)
    assert stat.S_IMODE(path.stat().st_mode) == 0o644


def test_the_top_level_help_examples_are_whole_commands():
    cp = _cli("--help")
    lines = [ln.strip() for ln in cp.stdout.split("Typical session:")[1].split("\n\n")[0]
             .splitlines() if ln.strip()]
    assert len(lines) >= 8
    for ln in lines:
        cmd = ln.split("  #")[0].rstrip()
        assert cmd.startswith(("mpi-dp ", "mpiexec -n")) and "   " not in cmd, ln


@pytest.mark.parametrize("method", ["sync_star", "admm"])
def test_a_method_resumes_inside_a_configuration_from_its_checkpoint(tmp_path, small_shards,
                                                                     method):
    """With a checkpoint at every record (MPI_DP_CHECKPOINT_S=0), a writer SIGKILLed at record 6
    of configuration 2 resumes from iteration 12 (record 5), not from the start: models, owners'
    answers, ledgers and noise positions continue, and every dataset equals the uninterrupted
    run's, byte for byte; the checkpoint itself is gone from the final file."""
    from helpers import assert_resumes_inside_a_configuration

    from mpi_dp.data.synth import write_synth

    if method == "sync_star":
        job = write_job(tmp_path / "c.toml", small_shards, T=30, runs=3, record_every=3,
                        sweep={"eps": [0.5, 2.0]})
    else:
        mc = write_synth(tmp_path / "mc.h5", "multiclass", 4, 120, 6, 0.35, 5, public=200,
                         classes=3)
        job = write_job(tmp_path / "c.toml", mc, algorithm="admm", variant="iadmm", runs=2,
                        T=30, record_every=3, sweep={"eps": [0.5, 2.0]})
    assert_resumes_inside_a_configuration(
        job, f"resumed from its checkpoint at {'k' if method == 'sync_star' else 't'}=12")
