"""Collective tests run inside every rank by pytest-mpi (`mpiexec -n K pytest --with-mpi -m mpi`).

`make test` runs them on 1, 2 and 4 ranks. Each compares what the ranks compute together with a
single-process reference computed on rank 0 (COMM_SELF), so a layout-dependent result fails.
"""

from __future__ import annotations

import h5py
import numpy as np
import pytest
from helpers import write_job
from mpi4py import MPI

from mpi_dp.comm.star import Star
from mpi_dp.runner import AgreedError, run_job

pytestmark = pytest.mark.mpi


def _raise_agreed(errors, exc):
    """Raise on every rank when any entry of `errors` (agreed by a collective) is not None."""
    failed = [(r, e) for r, e in enumerate(errors) if e is not None]
    if not failed:
        return
    kind = AssertionError if all(e[0] for _, e in failed) else RuntimeError
    text = "; ".join(f"rank {r}: {e[1]}" for r, e in failed)
    if exc is not None:
        raise kind(text) from exc  # the failing rank keeps its own traceback
    raise kind(text)


def _attempt(fn):
    try:
        fn()
    except BaseException as exc:  # every rank must learn of any failure, whatever it is
        return (isinstance(exc, AssertionError), f"{type(exc).__name__}: {exc}"), exc
    return None, None


def on_root(comm, fn):
    """Run `fn` on rank 0 alone; if it raises, every rank raises the same error.

    A rank-0 check followed by a collective (Barrier, bcast) hangs the other ranks when the check
    fails: rank 0 leaves the test while they wait. Here rank 0 broadcasts the outcome instead, so
    all ranks fail together (AssertionError for a failed assertion, RuntimeError otherwise).
    """
    err, exc = _attempt(fn) if comm.rank == 0 else (None, None)
    _raise_agreed([comm.bcast(err, root=0)], exc)


def on_every_rank(comm, fn):
    """Run `fn` on every rank; if it raises on any rank, every rank raises the same error."""
    err, exc = _attempt(fn)
    _raise_agreed(comm.allgather(err), exc)


@pytest.fixture
def shared_dir(mpi_tmp_path):
    return mpi_tmp_path


@pytest.fixture
def shards(shared_dir):
    comm = MPI.COMM_WORLD
    path = shared_dir / "s.h5"

    def write():
        from mpi_dp.data.synth import write_synth

        write_synth(path, "regression", 5, [300, 200, 250, 400, 150], 4, 0.5, 3, public=1000)

    on_root(comm, write)
    return path


def test_star_gather_and_bcast_in_agent_order():
    comm = MPI.COMM_WORLD
    star = Star(comm, 7)
    local = np.array([[a * 10.0 + j for j in range(3)] for a in star.local_agents]).reshape(-1, 3)
    got = star.gather_agents(local, (3,))

    def check_gather():
        if comm.rank == 0:
            np.testing.assert_array_equal(got, np.arange(7)[:, None] * 10.0 + np.arange(3))
        else:
            assert got is None

    on_every_rank(comm, check_gather)
    buf = np.arange(6.0) if comm.rank == 0 else np.zeros(6)
    sent = star.bcast(buf)
    on_every_rank(comm, lambda: np.testing.assert_array_equal(sent, np.arange(6.0)))
    # every agent lives on exactly one rank
    hosted = comm.allgather(list(star.local_agents))
    assert sorted(a for h in hosted for a in h) == list(range(7))


def _read(path):
    with h5py.File(path, "r", locking=False) as f:
        return {k: f[k][()] for k in ("configs/000/metrics/psi", "configs/001/models/final",
                                      "configs/001/metrics/clip_fraction")}


def test_world_equals_single_process_bitwise(shared_dir, shards):
    comm = MPI.COMM_WORLD
    job = shared_dir / "j.toml"
    on_root(comm, lambda: write_job(job, shards, runs=2, T=15, sweep={"eps": [0.3, 3.0]}))
    world = run_job(job, out=str(shared_dir / "world.h5"), comm=comm, progress=False)

    def compare():
        single = run_job(job, out=str(shared_dir / "single.h5"), comm=MPI.COMM_SELF,
                         progress=False)
        a, b = _read(world), _read(single)
        for k in a:
            np.testing.assert_array_equal(a[k], b[k], err_msg=k)

    on_root(comm, compare)


def test_gather_and_reduce_agree(shared_dir, shards):
    """Spec §8: Reduce of pre-weighted answers equals the Gather path to 1e-12 relative."""
    comm = MPI.COMM_WORLD
    job = shared_dir / "g.toml"
    on_root(comm, lambda: write_job(job, shards, runs=2, T=15, sweep={"eps": [0.3, 3.0]}))
    g = run_job(job, out=str(shared_dir / "g.h5"), comm=comm, progress=False)
    r = run_job(job, ["comm.aggregate=\"reduce\""], out=str(shared_dir / "r.h5"), comm=comm,
                progress=False)

    def compare():
        a, b = _read(g), _read(r)
        for k in a:
            np.testing.assert_allclose(a[k], b[k], rtol=1e-12, atol=1e-15, err_msg=k)

    on_root(comm, compare)


def test_bad_job_raises_on_every_rank(shared_dir, shards):
    comm = MPI.COMM_WORLD
    job = shared_dir / "bad.toml"
    on_root(comm, lambda: write_job(job, shards, eps=[1.0, 2.0]))  # 2 budgets for 5 owners
    with pytest.raises(AgreedError, match="2 values given but the shard file"):
        run_job(job, comm=comm, progress=False)
