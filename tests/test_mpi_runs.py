"""Real `mpiexec` jobs launched from the serial suite: rank-invariance, errors, interruption."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import h5py
import numpy as np
import pytest
from helpers import HANG_GUARD_S, MPIEXEC, assert_rank_invariant, mpi_run, write_job


def test_bitwise_identical_on_1_2_4_ranks(tmp_path, small_shards):
    job = write_job(tmp_path / "j.toml", small_shards, runs=3, T=25, record_every=5,
                    sweep={"eps": [0.5, 5.0]})
    results = assert_rank_invariant(job, tmp_path)
    keys = sorted(results[0])
    assert "configs/001/metrics/psi" in keys and "configs/000/models/final" in keys
    # the evaluation-only utility (squared loss: training MSE and its baselines) is compared too
    assert {"configs/001/metrics/train_mse", "configs/000/reference/train_mse_zero",
            "configs/000/reference/train_mse_mean"} <= set(keys)
    with h5py.File(tmp_path / "j_4ranks.h5", "r", locking=False) as f:
        assert f["provenance"].attrs["n_ranks"] == 4 and f.attrs["status"] == "complete"


@pytest.mark.parametrize(
    "keys, message",
    [
        ({"epsilon": 1.0}, "unknown key 'epsilon'"),
        ({"runs": "many"}, "key 'runs': expected integer"),
        ({"shards": "no/such/shards.h5"}, "shard file 'no/such/shards.h5' not found"),
    ],
)
def test_broken_job_fails_on_every_rank_with_one_message(tmp_path, small_shards, keys, message):
    data = keys.pop("shards", small_shards)
    job = write_job(tmp_path / "bad.toml", data, **keys)
    cp = mpi_run(4, ["run", str(job)], timeout=120)  # a hang raises TimeoutExpired
    assert cp.returncode != 0
    assert cp.stderr.count(message) == 1, cp.stderr
    assert str(job) in cp.stderr or "shard file" in message
    assert not (tmp_path / "bad.h5").exists()  # nothing computed, nothing written


def test_rank_that_raises_stops_all_and_keeps_results(tmp_path, small_shards):
    """A huge step makes the model diverge mid-run: the owners' ranks raise, all ranks stop."""
    job = write_job(tmp_path / "div.toml", small_shards, eps=float("inf"), T=3000, lam=1.0,
                    theta_max=float("inf"), clip=False, variant="alg1",
                    step={"alpha": 50.0, "schedule": "constant"})
    cp = mpi_run(4, ["run", str(job), "--quiet"], timeout=120)
    assert cp.returncode != 0
    assert "non-finite" in cp.stderr, cp.stderr
    assert not (tmp_path / "div.h5").exists()  # only a complete job takes the result's name
    with h5py.File(tmp_path / "div.h5.partial", "r", locking=False) as f:
        k = f["metrics/iteration"].shape[0]
        assert k >= 1 and f["metrics/psi"].shape[0] == k
        assert f.attrs["status"] in ("running", "failed")


def _wait_records(path, at_least, proc, limit=HANG_GUARD_S):
    t0 = time.monotonic()
    while time.monotonic() - t0 < limit:
        assert proc.poll() is None, proc.communicate()
        try:
            with h5py.File(path, "r", locking=False) as f:
                if "metrics/iteration" in f and f["metrics/iteration"].shape[0] >= at_least:
                    return
        except (OSError, KeyError):
            pass
        time.sleep(0.2)
    raise AssertionError("the run never recorded enough iterations")


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_killed_run_leaves_readable_partial_result(tmp_path, small_shards, sig):
    job = write_job(tmp_path / "long.toml", small_shards, T=100000, runs=2, record_every=20)
    out = tmp_path / "long.h5"
    proc = subprocess.Popen([MPIEXEC, "-n", "2", sys.executable, "-m", "mpi_dp", "run", str(job),
                             "--quiet"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True, env=dict(os.environ, OPENBLAS_NUM_THREADS="1"))
    try:
        _wait_records(tmp_path / "long.h5.partial", 5, proc)
        os.killpg(proc.pid, sig)
        proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode != 0
    from mpi_dp.analysis import open_result

    assert not out.exists()
    t0 = time.monotonic()
    while time.monotonic() - t0 < 30:  # mpiexec has gone; its ranks may linger a moment
        with open_result(out) as res:
            if "INCOMPLETE" in (res.completeness or ""):
                break
        time.sleep(0.2)
    with open_result(out) as res:  # reads long.h5.partial, and says it is incomplete
        assert res.path.name == "long.h5.partial"
        assert res.completeness is not None and "INCOMPLETE" in res.completeness
        cfg = res.configs[0]
        k = cfg.n_records()
        assert k >= 5
        it = cfg.iterations()[:k]
        np.testing.assert_array_equal(it, np.arange(k) * 20)
        psi = cfg.metric("psi")[:k]
        assert psi.shape == (k, 2) and np.all(np.isfinite(psi))
        # killed while blocked in a collective, the learner cannot mark it: 'running' stays
        assert res.status in ("running", "interrupted")


@pytest.mark.petsc
@pytest.mark.parametrize("loss", ["logistic", "squared"])
def test_petsc_reference_under_mpiexec_matches_scipy(tmp_path, small_shards, small_binary, loss):
    """TAO on the learner while owners serve the distributed value-and-gradient: PETSc must be
    initialised on the learner alone (COMM_SELF), and agree with SciPy to 1e-8 in f*."""
    from mpi_dp.models.reference import petsc_available

    if not petsc_available():
        pytest.skip("petsc4py is not installed")
    data = small_binary if loss == "logistic" else small_shards
    f_star = {}
    for solver in ("scipy", "petsc"):
        job = write_job(tmp_path / f"{solver}.toml", data, loss=loss, runs=1, T=3,
                        reference={"solver": solver})
        cp = mpi_run(3, ["run", str(job), "--quiet"])
        assert cp.returncode == 0, cp.stderr
        with h5py.File(tmp_path / f"{solver}.h5", "r", locking=False) as f:
            assert f["reference/theta_star"].attrs["solver"] == solver
            f_star[solver] = float(f["reference/f_star"][()])
    assert abs(f_star["petsc"] / f_star["scipy"] - 1) < 1e-8
