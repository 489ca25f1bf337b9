"""admm's and dola's evaluation-only optima w* across jobs (issue 44, algorithms.optimum_cache):
a second job on the same shard and objective reads w* (admm: its training error, iterations and
gradient too) from the on-disk cache instead of solving, and its result file is byte for byte
the first's and that of a run without the cache; another parameter, record count or shard
misses; a damaged entry is recomputed."""

from __future__ import annotations

import h5py
import numpy as np
import pytest
from helpers import count_calls, mpi_run, write_job

from mpi_dp.algorithms import admm
from mpi_dp.data.synth import write_synth
from mpi_dp.models import reference
from mpi_dp.runner import run_job

#: the environment variable naming the cache folder (algorithms.reference_cache.ENV)
ENV = "MPI_DP_REFERENCE_CACHE"
#: wall-clock attributes (they differ between two runs of one job)
_TIMING = {"heartbeat_unix", "writer_host", "writer_pid", "seconds", "wall_seconds",
           "start_time", "end_time", "ended_at"}


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    """Two 3-class shard files (3 agents x 120 records, p = 4 + bias) of different seeds."""
    d = tmp_path_factory.mktemp("admmcache")
    return [write_synth(d / f"m{seed}.h5", "multiclass", 3, 120, 4, 0.5, seed, public=300,
                        classes=3) for seed in (5, 6)]


@pytest.fixture
def solves(monkeypatch):
    """Counts w* solves (admm.reference_optimum calls) of the jobs run in the test."""
    return count_calls(monkeypatch, admm, "reference_optimum")


def _job(tmp_path, shard, name, admm_keys=None, **keys):
    base = dict(algorithm="admm", T=5, runs=2, eps=1.0, record_every=1,
                admm={"reference_iters": 200, **(admm_keys or {})})
    base.update(keys)
    return run_job(write_job(tmp_path / f"{name}.toml", shard, **base), progress=False)


def _contents(path) -> dict[str, bytes]:
    """Every dataset's bytes and every attribute but the wall-clock ones."""
    out: dict[str, bytes] = {}

    def visit(name, obj):
        if isinstance(obj, h5py.Dataset):
            out[name] = np.ascontiguousarray(obj[()]).tobytes()
        for k, v in obj.attrs.items():
            if k not in _TIMING:
                out[f"{name}@{k}"] = repr(v).encode()

    with h5py.File(path, "r") as f:
        f.visititems(visit)
    return out


def test_a_second_job_reads_w_star_from_the_cache_bit_for_bit(tmp_path, monkeypatch, shards,
                                                              solves):
    cache = tmp_path / "cache"
    monkeypatch.setenv(ENV, str(cache))
    first = _job(tmp_path, shards[0], "first", sweep={"eps": [1.0, 2.0]})
    assert len(solves) == 1 and len(list(cache.glob("*.npz"))) == 1  # once per job already
    second = _job(tmp_path, shards[0], "second", sweep={"eps": [1.0, 2.0]})
    assert len(solves) == 1, "the second job solved w* again instead of reading the cache"
    monkeypatch.setenv(ENV, "off")
    fresh = _job(tmp_path, shards[0], "fresh", sweep={"eps": [1.0, 2.0]})
    assert len(solves) == 2
    a, b, c = (_contents(p) for p in (first, second, fresh))
    assert any(k.endswith("reference/w_star") for k in a)
    assert any(k.endswith("reference/train_error_star") for k in a)
    assert any(k.endswith("@w_star_iterations") for k in a)
    differ = [k for k in a.keys() | b.keys() | c.keys()
              if not a.get(k) == b.get(k) == c.get(k) and "provenance" not in k]
    assert not differ, differ


def test_another_objective_or_shard_misses_the_cache(tmp_path, monkeypatch, shards, solves):
    cache = tmp_path / "cache"
    monkeypatch.setenv(ENV, str(cache))
    _job(tmp_path, shards[0], "a")
    _job(tmp_path, shards[0], "a_again", seed=8, T=3)  # neither is part of w*
    assert len(solves) == 1
    _job(tmp_path, shards[0], "gamma", admm_keys={"gamma": 1e-3})
    _job(tmp_path, shards[0], "box", admm_keys={"w_bound": 0.5})
    _job(tmp_path, shards[0], "iters", admm_keys={"reference_iters": 150})
    _job(tmp_path, shards[1], "other_shard")
    _job(tmp_path, shards[0], "fewer", n=100)
    assert len(solves) == 6 and len(list(cache.glob("*.npz"))) == 6


def test_a_damaged_entry_is_recomputed(tmp_path, monkeypatch, shards, solves):
    cache = tmp_path / "cache"
    monkeypatch.setenv(ENV, str(cache))
    first = _job(tmp_path, shards[0], "first")
    (entry,) = cache.glob("*.npz")
    entry.write_bytes(entry.read_bytes()[:100])
    second = _job(tmp_path, shards[0], "second")
    assert len(solves) == 2
    a, b = _contents(first), _contents(second)
    assert not [k for k in a.keys() | b.keys() if a.get(k) != b.get(k) and "provenance" not in k]


def test_the_cache_across_rank_counts_is_bit_for_bit(tmp_path, shards):
    """Stored by a 2-rank job, read by a 3-rank one (the learner broadcasts it): the same bytes
    as a 1-rank job without the cache."""
    job = write_job(tmp_path / "r.toml", shards[0], algorithm="admm", T=5, runs=2, eps=1.0,
                    admm={"reference_iters": 200})
    cache = str(tmp_path / "cache")
    outs = {}
    for name, n, where in (("cold", 2, cache), ("warm", 3, cache), ("off", 1, "off")):
        outs[name] = tmp_path / f"{name}.h5"
        cp = mpi_run(n, ["run", str(job), "--out", str(outs[name]), "--quiet"],
                     env={ENV: where})
        assert cp.returncode == 0, cp.stderr
    assert len(list((tmp_path / "cache").glob("*.npz"))) == 1
    a, b, c = (_contents(outs[k]) for k in ("cold", "warm", "off"))
    assert any(k.endswith("reference/w_star") for k in a)
    assert not [k for k in a.keys() | b.keys() | c.keys()
                if not a.get(k) == b.get(k) == c.get(k) and "provenance" not in k]


# -- dola: the comparator w* (the exact SVM on every consumed record) ----------------------------
@pytest.fixture(scope="module")
def online(tmp_path_factory):
    d = tmp_path_factory.mktemp("dolacache")
    return [write_synth(d / f"on{seed}.h5", "online", 4, 60, 4, 0.05, seed, public=100)
            for seed in (3, 4)]


@pytest.fixture
def svm_solves(monkeypatch):
    """Counts dola's comparator solves (reference.svm_dual_cd calls)."""
    return count_calls(monkeypatch, reference, "svm_dual_cd")


def _dola(tmp_path, shard, name, **keys):
    base = dict(algorithm="dola", T=40, runs=2, eps=0.5, record_every=20, seed=5,
                dola={"graph": "ring", **keys.pop("dola", {})})
    base.update(keys)
    return run_job(write_job(tmp_path / f"{name}.toml", shard, **base), progress=False)


def test_dola_reads_its_comparator_from_the_cache_bit_for_bit(tmp_path, monkeypatch, online,
                                                              svm_solves):
    cache = tmp_path / "cache"
    monkeypatch.setenv(ENV, str(cache))
    first = _dola(tmp_path, online[0], "first")
    assert len(svm_solves) == 1 and len(list(cache.glob("*.npz"))) == 1
    second = _dola(tmp_path, online[0], "second", seed=6)  # the seed is no part of w*
    assert len(svm_solves) == 1, "the second job solved w* again instead of reading the cache"
    monkeypatch.setenv(ENV, "off")
    fresh = _dola(tmp_path, online[0], "fresh")
    assert len(svm_solves) == 2
    a, c = _contents(first), _contents(fresh)
    w = [k for k in a if k.endswith("reference/w_star")]
    assert w and all(_contents(second)[k] == a[k] == c[k] for k in w)
    assert not [k for k in a.keys() | c.keys() if a.get(k) != c.get(k) and "provenance" not in k]
    monkeypatch.setenv(ENV, str(cache))
    _dola(tmp_path, online[0], "lam", dola={"lam": 0.05})
    _dola(tmp_path, online[1], "other_shard")
    _dola(tmp_path, online[0], "shorter", T=20)  # fewer records consumed
    assert len(svm_solves) == 5 and len(list(cache.glob("*.npz"))) == 4
