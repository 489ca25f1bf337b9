"""Random streams keyed by (seed, purpose, agent, run), never by rank.

Every random draw in mpi_dp comes from one of these streams, so results do not depend on how agents
are laid out over MPI ranks, and run r of an R-run job draws exactly what the single-run job with run
index r draws. Configurations of a sweep share streams (common random numbers), which makes
comparisons across eps and n much less noisy than independent draws would.

`run_streams` gives the streams of many runs as one `mpi_dp.pcg.RunStreams`, which draws a block
for all runs at once and produces exactly the bits of the single-run `stream` of each run.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .pcg import RunStreams

#: Stable integer codes for the purposes a stream serves. Never renumber: results depend on them.
PURPOSES: dict[str, int] = {
    "noise": 1,  # DP noise added by a data owner
    "data": 2,  # synthetic data generation
    "init": 3,  # random initial models
    "schedule": 4,  # asynchronous schedules (who is served when)
    "sample": 5,  # subsampling of records
    "graph": 6,  # random graphs / topologies
    "partition": 7,  # random partitions of a dataset into agents
    "warm_start": 8,  # output perturbation of a private warm start (seed 004)
    "local_dp": 9,  # local DP perturbation of an owner's own records (seed 004 baseline)
    "clock": 10,  # per-agent Poisson clocks of live asynchronous runs
    "val_score": 11,  # noise of a peer's released validation score (a private selection)
    "test": 99,  # tests only
}

#: Agent id used for streams that belong to the learner / server rather than to an owner.
LEARNER = 2**31 - 1


def seed_sequence(seed: int, purpose: str, agent: int = 0, run: int = 0) -> np.random.SeedSequence:
    """The SeedSequence of the stream (seed, purpose, agent, run)."""
    try:
        code = PURPOSES[purpose]
    except KeyError:
        raise ValueError(f"unknown random purpose {purpose!r}; known: {sorted(PURPOSES)}") from None
    if seed < 0 or agent < 0 or run < 0:
        raise ValueError("seed, agent and run must be non-negative integers")
    return np.random.SeedSequence(int(seed), spawn_key=(code, int(agent), int(run)))


def stream(seed: int, purpose: str, agent: int = 0, run: int = 0) -> np.random.Generator:
    """A fresh numpy Generator (PCG64) for the stream (seed, purpose, agent, run)."""
    return np.random.Generator(np.random.PCG64(seed_sequence(seed, purpose, agent, run)))


def run_streams(seed: int, purpose: str, agent: int, runs: np.ndarray | Sequence[int]) -> RunStreams:
    """The streams of the run indices `runs` as one vectorised RunStreams: row r draws exactly
    the bits of ``stream(seed, purpose, agent, runs[r])`` (mpi_dp.pcg), all rows in one pass."""
    seed_sequence(seed, purpose, agent, 0)  # the same argument checks
    return RunStreams(int(seed), (PURPOSES[purpose], int(agent)), np.asarray(list(runs), dtype=np.int64))


def agent_run_streams(seed: int, purpose: str, agents: np.ndarray | Sequence[int],
                      runs: np.ndarray | Sequence[int]) -> RunStreams:
    """The streams of every (agent, run) pair of a block of agents as one RunStreams, seeded in
    one vectorised pass, agent-major: row a * len(runs) + r draws exactly the bits of
    ``stream(seed, purpose, agents[a], runs[r])``, so a rank hosting many agents seeds and
    draws for all of them at once and each agent's noise is what it draws alone."""
    agents = np.asarray(list(agents), dtype=np.int64).reshape(-1)
    runs = np.asarray(list(runs), dtype=np.int64).reshape(-1)
    seed_sequence(seed, purpose, 0, 0)  # the same argument checks
    if np.any(agents < 0) or np.any(runs < 0):
        raise ValueError("seed, agent and run must be non-negative integers")
    return RunStreams(int(seed), (PURPOSES[purpose], np.repeat(agents, runs.size)),
                      np.tile(runs, agents.size))
