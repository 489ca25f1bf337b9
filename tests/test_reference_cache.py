"""The star methods' evaluation-only reference (theta*): the on-disk cache and
reference.solver = 'none' (issue 44).

A second job on the same shard and objective reads theta* (and the isolated optima, f*, the
baselines) from the cache instead of solving, and its result is byte for byte the first's and
that of a run without the cache; another objective parameter or another shard misses it.
reference.solver = 'none' skips theta*: the metrics needing it are not recorded, the run and the
result file say so, and the analysis summarises the objective instead.
"""

from __future__ import annotations

import logging

import h5py
import numpy as np
import pytest
from helpers import count_calls, write_job

from mpi_dp.algorithms import common
from mpi_dp.analysis.load import open_result
from mpi_dp.data.synth import write_synth
from mpi_dp.errors import ResultError
from mpi_dp.methods import REGISTRY
from mpi_dp.runner import run_job

#: the environment variable naming the cache folder (algorithms.reference_cache.ENV)
ENV = "MPI_DP_REFERENCE_CACHE"
#: wall-clock attributes (they differ between two runs of one job)
_TIMING_ATTRS = {"heartbeat_unix", "writer_host", "writer_pid", "seconds", "wall_seconds",
                 "start_time", "end_time"}


@pytest.fixture(scope="module")
def binary_shards(tmp_path_factory):
    """Two binary shard files (4 owners x 150 records, p = 4 + bias) of different seeds."""
    d = tmp_path_factory.mktemp("refcache")
    return [write_synth(d / f"b{seed}.h5", "binary", 4, 150, 4, 0.5, seed, public=500)
            for seed in (3, 4)]


@pytest.fixture
def solves(monkeypatch):
    """Counts theta* solves (Oracle.theta_star calls) of the jobs run in the test."""
    return count_calls(monkeypatch, common.Oracle, "theta_star")


def _job(tmp_path, shards, name, **keys):
    base = dict(loss="logistic", lam=1e-2, theta_max=1e3, T=6, runs=2)
    base.update(keys)
    return run_job(write_job(tmp_path / f"{name}.toml", shards, **base), progress=False)


def _datasets(path) -> dict[str, bytes]:
    out: dict[str, bytes] = {}

    def visit(name, obj):
        if isinstance(obj, h5py.Dataset):
            out[name] = np.ascontiguousarray(obj[()]).tobytes()

    with h5py.File(path, "r") as f:
        f.visititems(visit)
    return out


def _config_attrs(path) -> dict[str, bytes]:
    out = {}
    with h5py.File(path, "r") as f:
        g = f["configs"] if "configs" in f else f
        for cname, cg in g.items():
            if isinstance(cg, h5py.Group):
                for k, v in cg.attrs.items():
                    if k not in _TIMING_ATTRS:
                        out[f"{cname}/{k}"] = repr(v).encode()
    return out


def test_second_job_reads_theta_star_from_the_cache_bit_for_bit(tmp_path, monkeypatch,
                                                                 binary_shards, solves):
    cache = tmp_path / "cache"
    monkeypatch.setenv(ENV, str(cache))
    first = _job(tmp_path, binary_shards[0], "first")
    assert len(solves) == 1 and len(list(cache.glob("*.npz"))) == 1
    second = _job(tmp_path, binary_shards[0], "second")
    assert len(solves) == 1, "the second job solved theta* again instead of reading the cache"
    monkeypatch.setenv(ENV, "off")
    fresh = _job(tmp_path, binary_shards[0], "fresh")
    assert len(solves) == 2
    a, b, c = _datasets(first), _datasets(second), _datasets(fresh)
    assert "reference/theta_star" in a and "metrics/psi" in a
    assert a == b == c, [k for k in a if not a[k] == b.get(k) == c.get(k)]
    assert _config_attrs(first) == _config_attrs(second) == _config_attrs(fresh)


def test_another_objective_or_shard_misses_the_cache(tmp_path, monkeypatch, binary_shards,
                                                     solves):
    cache = tmp_path / "cache"
    monkeypatch.setenv(ENV, str(cache))
    _job(tmp_path, binary_shards[0], "a")
    _job(tmp_path, binary_shards[0], "a_again", seed=8)  # the seed is no part of theta*
    assert len(solves) == 1
    _job(tmp_path, binary_shards[0], "lam", lam=2e-2)
    _job(tmp_path, binary_shards[0], "box", theta_max=1.0)
    _job(tmp_path, binary_shards[1], "other_shard")
    _job(tmp_path, binary_shards[0], "fewer", sweep={"n": [100]})
    assert len(solves) == 5 and len(list(cache.glob("*.npz"))) == 5


def test_a_damaged_entry_is_recomputed(tmp_path, monkeypatch, binary_shards, solves):
    cache = tmp_path / "cache"
    monkeypatch.setenv(ENV, str(cache))
    first = _job(tmp_path, binary_shards[0], "first")
    (entry,) = cache.glob("*.npz")
    entry.write_bytes(entry.read_bytes()[:100])
    second = _job(tmp_path, binary_shards[0], "second")
    assert len(solves) == 2 and _datasets(first) == _datasets(second)


def test_cache_folder_from_the_environment(monkeypatch, tmp_path):
    from mpi_dp.algorithms import reference_cache

    assert reference_cache.ENV == ENV
    monkeypatch.delenv(ENV, raising=False)
    monkeypatch.setenv("MPI_DP_CACHE", str(tmp_path))
    assert reference_cache.folder() == tmp_path / "star_reference"
    monkeypatch.setenv(ENV, "off")
    assert reference_cache.folder() is None
    monkeypatch.setenv(ENV, str(tmp_path / "x"))
    assert reference_cache.folder() == tmp_path / "x"


@pytest.mark.parametrize(("algorithm", "loss"), [("sync_star", "logistic"),
                                               ("async_star", "logistic"),
                                               ("async_star", "squared")])
def test_solver_none_skips_theta_star_and_says_so(tmp_path, binary_shards, solves, caplog,
                                                  algorithm, loss):
    caplog.set_level(logging.INFO, logger="mpi_dp")
    variant = {"sync_star": "alg2", "async_star": "proof"}[algorithm]
    job = write_job(tmp_path / "none.toml", binary_shards[0], algorithm=algorithm,
                    variant=variant, loss=loss, lam=1e-2, theta_max=1e3, T=6, runs=2,
                    reference={"solver": "none"})
    path = run_job(job, progress=True)
    assert not solves
    assert "reference.solver = 'none': theta* not computed" in caplog.text
    data = _datasets(path)
    baseline = "train_error_majority" if loss == "logistic" else "train_mse_zero"
    assert "metrics/objective" in data and f"reference/{baseline}" in data
    for left_out in ("metrics/psi", "metrics/psi_iterate", "metrics/dist_sq",
                     "reference/theta_star", "reference/f_star", "reference/psi_isolated",
                     "reference/theta_isolated", "reference/train_error_star",
                     "reference/train_mse_star"):
        assert left_out not in data
    with open_result(path) as res:
        assert "reference.solver = 'none'" in str(res.configs[0].attrs["not_recorded"])
        # the analysis summarises the objective instead of psi, and asking for psi says why
        assert "metric objective" in REGISTRY.get(algorithm).analyze(res)
        with pytest.raises(ResultError, match="reference.solver = 'none'"):
            res.configs[0].metric("psi")


@pytest.mark.parametrize("loss", ["logistic", "hinge", "squared"])
def test_fused_loss_and_gradient_pass_is_bit_for_bit_the_two_passes(loss, binary_shards):
    """The solver's value-and-gradient callback reads the records once (linear.loss_grad_sum,
    AgentBlock.loss_grad_sums) with the same bits as the loss pass and the gradient pass."""
    import scipy.sparse as sp

    from mpi_dp.algorithms.agent_block import AgentBlock
    from mpi_dp.data import ShardFile
    from mpi_dp.models import linear

    with ShardFile(binary_shards[0]) as shard:
        data = shard.read_agents(range(4), [150, 150, 90, 150])
    shards = [common.LocalShard(i, X, y) for i, (X, y) in enumerate(data)]
    shards.append(common.LocalShard(4, sp.csr_matrix(data[0][0]), data[0][1]))
    theta = np.random.default_rng(1).normal(size=(1, data[0][0].shape[1]))
    block = AgentBlock(shards)
    fused = block.loss_grad_sums(loss, theta)
    assert fused[:, :1].tobytes() == block.loss_sums(loss, theta).tobytes()
    assert fused[:, 1:].tobytes() == block.grad_sums(loss, theta).tobytes()
    for sh in shards:
        f, g = linear.loss_grad_sum(loss, sh.X, sh.y, theta)
        assert f.tobytes() == linear.loss_sum(loss, sh.X, sh.y, theta).tobytes()
        assert g.tobytes() == linear.grad_sum(loss, sh.X, sh.y, theta).tobytes()
