"""Job files: validation names the key and the file; sweeps expand; overrides apply."""

from __future__ import annotations

import math

import pytest
from helpers import write_job

from mpi_dp.errors import JobError
from mpi_dp.job import load_job, parse_override


def test_valid_job_defaults_and_sweep(tmp_path, small_shards):
    p = write_job(tmp_path / "j.toml", small_shards, sweep={"eps": [0.5, math.inf], "n": [100, 200]})
    job = load_job(p)
    assert job["runs"] == 3 and job["step.alpha"] == 1.0 and job["average.eta"] == 3.0
    cfgs = job.configs()
    assert [(c.eps, c.n) for c in cfgs] == [(0.5, 100), (math.inf, 100), (0.5, 200),
                                            (math.inf, 200)]
    assert cfgs[1].label() == "eps=inf, n=100"
    assert job.is_sweep and job.output == p.with_suffix(".h5")


@pytest.mark.parametrize(
    "keys, fragment",
    [
        ({"epsilon": 1.0}, "unknown key 'epsilon' (did you mean 'eps'?)"),
        ({"runs": "ten"}, "key 'runs': expected integer, got str"),
        ({"T": 1.5}, "key 'T': expected integer"),
        ({"loss": "hing"}, "key 'loss': 'hing' is not one of"),
        ({"eps": -1.0}, "key 'eps': budgets must be positive"),
        ({"eps": [1.0, "x"]}, "key 'eps': budgets must be positive"),
        ({"step": {"alhpa": 1.0}}, "unknown key 'step.alhpa' (did you mean 'step.alpha'?)"),
        ({"sweep": {"n": [100, 0]}}, "key 'sweep.n[1]': record counts must be positive"),
        ({"clip": "yes"}, "key 'clip': expected true/false"),
        ({"variant": "alg3"}, "key 'variant': 'alg3' is not one of"),
    ],
)
def test_bad_jobs_name_key_and_file(tmp_path, small_shards, keys, fragment):
    p = write_job(tmp_path / "bad.toml", small_shards, **keys)
    with pytest.raises(JobError) as e:
        load_job(p)
    assert fragment in str(e.value)
    assert str(p) in str(e.value)


def test_missing_required_and_missing_file(tmp_path):
    p = tmp_path / "j.toml"
    p.write_text('algorithm = "sync_star"\ndata = "x.h5"\n')
    with pytest.raises(JobError, match="key 'T': required but missing"):
        load_job(p)
    with pytest.raises(JobError, match="job file .*nope.toml not found"):
        load_job(tmp_path / "nope.toml")
    p.write_text("T = [1,\n")
    with pytest.raises(JobError, match="not valid TOML"):
        load_job(p)


def test_overrides(tmp_path, small_shards):
    p = write_job(tmp_path / "j.toml", small_shards)
    job = load_job(p, ["eps=[1, 2, inf]", "step.alpha=0.5", "data=other.h5", "sweep.eps=[1, 10]"])
    assert job["eps"] == [1, 2, math.inf] and job["step.alpha"] == 0.5
    assert job["data"] == "other.h5" and job["sweep.eps"] == [1, 10]
    assert "# --set step.alpha=0.5" in job.record_text
    assert parse_override("name=abc") == ("name", "abc")
    with pytest.raises(JobError, match="expected key=value"):
        load_job(p, ["runs"])
    with pytest.raises(JobError, match="key 'runs': expected integer"):
        load_job(p, ["runs=1.5"])
