"""The asynchronous star method (replay mode) resumes inside a configuration from its checkpoint:
the learner's models, schedule, trace and records, and every owner's ledger, clip counts and
noise position (asked from the hosts while they serve) continue bit for bit."""

from __future__ import annotations

import pytest
from helpers import assert_resumes_inside_a_configuration, write_job


@pytest.mark.parametrize("loss", ["squared", "logistic"])
def test_async_star_resumes_inside_a_configuration_from_its_checkpoint(tmp_path, small_shards,
                                                                       small_binary, loss):
    """Squared loss: records are written as it goes, so the writer killed at record 6 of
    configuration 2 resumes from k = 12 (record 5). Logistic loss: the models are evaluated after
    the run (no record is written before), so the kill comes after the loop and the resume starts
    from the last checkpoint, k = 27, with the 10 models still to evaluate."""
    data = small_shards if loss == "squared" else small_binary
    job = write_job(tmp_path / "c.toml", data, algorithm="async_star", variant="proof", loss=loss,
                    runs=3, T=30, lam=1e-5, theta_max=10.0, record_every=3,
                    sweep={"eps": [0.5, 2.0]})
    if loss == "squared":
        assert_resumes_inside_a_configuration(job, "resumed from its checkpoint at k=12")
    else:
        assert_resumes_inside_a_configuration(job, "resumed from its checkpoint at k=27",
                                              n_records=0)
