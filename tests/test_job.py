"""Job files: validation names the key and the file; sweeps expand; overrides apply."""

from __future__ import annotations

import dataclasses
import math

import pytest
from helpers import write_job

from mpi_dp.errors import JobError
from mpi_dp.job import load_job, parse_override
from mpi_dp.jobspec import PrivacyKeys, StepKeys


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
        ({"async": {"mode": "live"}}, "key 'async': the [async] section belongs to algorithm "
         "'async_star', not 'sync_star'"),
        ({"algorithm": "async_star", "variant": "alg2"}, "key 'variant': 'alg2' is not one of"),
        ({"algorithm": "async_star", "variant": "proof", "async": {"mode": "fast"}},
         "key 'async.mode': 'fast' is not"),
        ({"algorithm": "async_star", "variant": "proof", "async": {"per_owner_cap": -2}},
         "key 'async.per_owner_cap': caps must be integers >= 0"),
        ({"algorithm": "async_star", "variant": "proof", "async": {"rates": [1.0, 0.0]}},
         "key 'async.rates': rates must be positive"),
        ({"algorithm": "async_star", "variant": "proof", "async": {"noise_shape": "scalar"}}, "is not DP"),
        ({"algorithm": "async_star", "variant": "proof", "async": {"mode": "live", "schedule_from": "x.h5"}},
         "key 'async.schedule_from': a logged schedule is replayed in mode 'replay'"),
        ({"algorithm": "async_star", "variant": "proof", "owners": 0},
         "key 'owners': expected 'all' or a positive number of owners"),
        ({"algorithm": "async_star", "variant": "proof", "sweep": {"owners": [2, "x"]}},
         "key 'sweep.owners[1]': expected 'all' or a positive"),
        ({"owners": 2}, "key 'owners': is not read by algorithm 'sync_star' (only async_star, dola read "
         "it)"),
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


def test_async_defaults_and_owner_sweep(tmp_path, small_shards):
    from mpi_dp.data import ShardFile
    from mpi_dp.runner import resolve_configs

    p = write_job(tmp_path / "a.toml", small_shards, algorithm="async_star",
                  eps=[1.0, 2.0, 4.0], sweep={"owners": [2, 3], "eps": [1.0, [1.0, 2.0, 4.0]]})
    p.write_text(p.read_text().replace('variant = "alg2"\n', ""))  # the default variant
    job = load_job(p)
    assert job["variant"] == "proof" and job["async.mode"] == "replay"
    configs = resolve_configs(job, ShardFile(small_shards))
    assert [(rc.config.owners, len(rc.eps), len(rc.n)) for rc in configs] == [
        (2, 2, 2), (2, 2, 2), (3, 3, 3), (3, 3, 3)]
    assert configs[1].eps == [1.0, 2.0]  # a per-owner list of the file's 3 owners, first 2 used
    assert configs[0].label.startswith("N=2, ")
    too_many = write_job(tmp_path / "b.toml", small_shards, algorithm="async_star",
                         variant="proof", owners=5)
    with pytest.raises(JobError, match="5 owners asked for but the shard file .* has 3"):
        resolve_configs(load_job(too_many), ShardFile(small_shards))


def test_typed_sections_read_what_the_keys_hold(tmp_path, small_shards):
    """Methods read typed, frozen sections and sweep axes, never the key strings: each view
    answers what the validated job holds."""
    p = write_job(tmp_path / "j.toml", small_shards, sweep={"eps": [0.5, math.inf]})
    job = load_job(p)
    g = job.generic
    assert (g.T, g.runs, g.seed, g.variant) == (job["T"], job["runs"], job["seed"],
                                                job["variant"])
    step = job.section(StepKeys)
    assert step.alpha == job["step.alpha"] == 1.0
    with pytest.raises(dataclasses.FrozenInstanceError):
        step.alpha = 2.0
    assert job.section(PrivacyKeys).delta == job["privacy.delta"]
    assert job.axis("eps") == [0.5, math.inf] and job.axis("n") is None
    assert job.swept("eps", 3.0) == [0.5, math.inf]
    assert job.swept("n", g.n) == [job["n"]] and job.swept("variant", g.variant) == ["alg2"]
