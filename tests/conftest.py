"""Shared fixtures: small shard files."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
# the reference caches of the suite's jobs (p2p's and the star methods', and those of their
# mpiexec children) stay out of ~/.cache
os.environ.setdefault("MPI_DP_CACHE", tempfile.mkdtemp(prefix="mpi_dp_test_cache_"))
# the on-disk calibration cache (privacy.calibration_store) is off: every job of the suite searches
# its noise afresh, as the tests of the calibration's cost, progress and stops expect; the tests of
# the cache give it a folder of their own
os.environ.setdefault("MPI_DP_CALIBRATION_CACHE", "off")


@pytest.fixture(scope="session")
def small_shards(tmp_path_factory) -> Path:
    """3 owners x 600 records, p = 5, ridge data with a public hold-out of 2,000 records."""
    from mpi_dp.data.synth import write_synth

    path = tmp_path_factory.mktemp("shards") / "small.h5"
    return write_synth(path, "regression", 3, [600, 500, 700], 5, 0.5, 11, public=2000)


@pytest.fixture(scope="session")
def small_binary(tmp_path_factory) -> Path:
    from mpi_dp.data.synth import write_synth

    path = tmp_path_factory.mktemp("shards") / "binary.h5"
    return write_synth(path, "binary", 3, 400, 4, 0.3, 5, public=2000)


@pytest.fixture(scope="session")
def method_shards(tmp_path_factory) -> dict:
    """Small shard files for a tiny job of every method: star methods (regression), admm
    (multiclass), dola (online) and p2p."""
    from mpi_dp.data.synth import write_synth

    d = tmp_path_factory.mktemp("method_shards")
    return {
        "regression": write_synth(d / "reg.h5", "regression", 3, [300, 250, 400], 4, 0.5, 3,
                                  public=1000),
        "multiclass": write_synth(d / "mc.h5", "multiclass", 4, 150, 5, 0.35, 5, public=300,
                                  classes=3),
        "online": write_synth(d / "on.h5", "online", 6, 60, 4, 0.05, 3, public=100),
        "p2p": write_synth(d / "p2p.h5", "p2p", 16, 0, 4, 0.05, 3),
    }


#: the small job of each method used by the result-format tests (a two-configuration sweep, so
#: that the layout under /configs is exercised; dola's and p2p's keys as in test_contract_methods)
METHOD_JOBS: dict[str, tuple[str, dict]] = {
    "sync_star": ("regression", dict(T=20, runs=3, record_every=5)),
    "async_star": ("regression", dict(T=30, runs=2, variant="proof", lam=1e-3, record_every=10)),
    "admm": ("multiclass", dict(T=10, runs=2, record_every=5)),
    "dola": ("online", dict(T=40, runs=2, record_every=20, dola={"graph": "ring"})),
    "p2p": ("p2p", dict(T=16 * 8, runs=2, record_every=64)),
}


@pytest.fixture(scope="session")
def method_results(method_shards, tmp_path_factory) -> dict:
    """One complete result file of every method (2 ranks, a sweep eps = [1, inf]), written once
    per session for the tests of the result format (xarray, export, release, schema)."""
    from helpers import mpi_run, write_job

    d = tmp_path_factory.mktemp("method_results")
    out = {}
    for method, (data, keys) in METHOD_JOBS.items():
        job = write_job(d / f"{method}.toml", method_shards[data], algorithm=method,
                        sweep={"eps": [1.0, float("inf")]}, **keys)
        path = d / f"{method}.h5"
        cp = mpi_run(2, ["run", str(job), "--out", str(path), "--quiet"])
        assert cp.returncode == 0, cp.stderr
        out[method] = path
    return out
