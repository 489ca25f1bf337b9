"""The DOLA graph method resumes inside a configuration from its checkpoint, on another rank
count, bit for bit."""

from __future__ import annotations

from helpers import assert_resumes_inside_a_configuration, write_job


def test_dola_resumes_inside_a_configuration_from_its_checkpoint(tmp_path):
    """Killed at record 6 (round 12) of configuration 1 on 4 ranks, resumed on 2 from the
    checkpoint at round 10 (record 5): the agents' released and clean vectors, sums, ledgers,
    noise positions, records read and edge activations continue, and every dataset equals the
    uninterrupted run's."""
    from mpi_dp.data.synth import write_synth

    online = write_synth(tmp_path / "on.h5", "online", 16, 60, 5, 0.05, 3, public=100)
    job = write_job(tmp_path / "d.toml", online, algorithm="dola", T=24, runs=2, record_every=2,
                    seed=5, sweep={"eps": [0.5, 2.0]}, dola={"graph": "medium"})
    assert_resumes_inside_a_configuration(job, "resumed from its checkpoint at round=10")
