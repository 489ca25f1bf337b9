"""Checkpoints inside a configuration of the personalised P2P method (seed 004, replay clock)."""

from __future__ import annotations

from helpers import assert_resumes_inside_a_configuration, write_job


def test_p2p_cd_resumes_inside_a_configuration_on_another_rank_count(tmp_path):
    """Checkpoint at every record (4 ranks), SIGKILL at record 8 of configuration 2: the resume
    on 2 ranks restores every peer's model, version, clip counts and ledger (by peer id) and its
    neighbours' mailboxes, continues after tick 72 and writes the uninterrupted run's bytes."""
    from mpi_dp.data.synth import write_synth

    p2p = write_synth(tmp_path / "p2p.h5", "p2p", 24, 0, 4, 0.05, 3)
    job = write_job(tmp_path / "p.toml", p2p, algorithm="p2p", T=24 * 6, runs=2, seed=7,
                    record_every=12, sweep={"eps": [0.5, 2.0]}, p2p={"mu": 1.0})
    assert_resumes_inside_a_configuration(job, "resumed from its checkpoint at tick 72 (70/124 wake-ups)",
                                          kill_at="1:8", n_records=7)
