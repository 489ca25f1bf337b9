"""Who is served when: seeded schedules of the asynchronous star (spec async-star §2, line 3).

`poisson`: owner j has an independent Poisson clock of rate lambda_j; the next event is the owner
whose clock ticks first, at that time (times shifted so that t_1 = 0). `uniform`: i_k ~ U{active},
t_k = k - 1. Each run has its own stream (seed, 'schedule', LEARNER, run), so the schedule of run r
does not depend on the other runs, on the ranks, or on the data. Owners that declined (budget
spent) are taken out of the draw: a removed Poisson clock simply never ticks again.
"""

from __future__ import annotations

import numpy as np

from ..rng import LEARNER, stream

#: exponentials drawn per refill of a run's buffer (the sequence does not depend on it)
_BLOCK = 256


class _ExpBuffer:
    """Standard exponentials of one generator, drawn in blocks and consumed in order."""

    def __init__(self, gen: np.random.Generator) -> None:
        self.gen = gen
        self.buf = np.empty(0)
        self.pos = 0

    def take(self) -> float:
        if self.pos == self.buf.size:
            self.buf = self.gen.standard_exponential(_BLOCK)
            self.pos = 0
        self.pos += 1
        return float(self.buf[self.pos - 1])


class Scheduler:
    """Seeded schedule of R runs over N owners; `next` gives every run's next (owner, time)."""

    def __init__(self, kind: str, n_owners: int, seed: int, run_ids: tuple[int, ...],
                 rates: np.ndarray | None = None) -> None:
        if kind not in ("poisson", "uniform"):
            raise ValueError(f"unknown scheduler {kind!r}")
        self.kind = kind
        self.N = int(n_owners)
        self.R = len(run_ids)
        self.rates = np.ones(self.N) if rates is None else np.asarray(rates, dtype=np.float64)
        if self.rates.shape != (self.N,) or not np.all(self.rates > 0):
            raise ValueError("rates must be N positive numbers")
        self.gens = [stream(seed, "schedule", LEARNER, int(r)) for r in run_ids]
        self.active = np.ones((self.R, self.N), dtype=bool)
        self.k = np.zeros(self.R, dtype=np.int64)  # events drawn so far per run
        if kind == "poisson":
            self._exp = [_ExpBuffer(g) for g in self.gens]
            # first tick of every owner, in owner order
            self.tick = np.array([[self._exp[r].take() / self.rates[j] for j in range(self.N)]
                                  for r in range(self.R)])
            self.t0 = self.tick.min(axis=1)

    def remove(self, run: int, owner: int) -> None:
        """Owner `owner` declined in run `run`: it is never drawn again in that run."""
        self.active[run, owner] = False
        if self.kind == "poisson":
            self.tick[run, owner] = np.inf

    def exhausted(self, run: int) -> bool:
        return not self.active[run].any()

    def next_for(self, run: int) -> tuple[int, float]:
        """The next (owner, time) of one run (that still has an active owner)."""
        if self.kind == "uniform":
            act = np.flatnonzero(self.active[run])
            i = int(act[self.gens[run].integers(act.size)])
            t = float(self.k[run])
        else:
            i = int(np.argmin(self.tick[run]))
            t = float(self.tick[run, i] - self.t0[run])
            self.tick[run, i] += self._exp[run].take() / self.rates[i]
        self.k[run] += 1
        return i, t

    def next(self, runs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Next (owner, time) of each run in `runs` (each must have an active owner)."""
        owners = np.empty(len(runs), dtype=np.int64)
        times = np.empty(len(runs))
        for j, r in enumerate(runs):
            owners[j], times[j] = self.next_for(int(r))
        return owners, times


class LoggedSchedule:
    """Replays a logged schedule (owner, time) of shape (T,) for every run (e.g. a live run's)."""

    def __init__(self, owner: np.ndarray, time: np.ndarray, n_owners: int, runs: int) -> None:
        self.owner = np.asarray(owner, dtype=np.int64)
        self.time = np.asarray(time, dtype=np.float64)
        self.N = n_owners
        self.R = runs
        self.pos = np.zeros(runs, dtype=np.int64)
        self.active = np.ones((runs, n_owners), dtype=bool)

    def remove(self, run: int, owner: int) -> None:
        self.active[run, owner] = False

    def _skip_inactive(self, run: int) -> None:
        while (self.pos[run] < self.owner.size
               and not self.active[run, self.owner[self.pos[run]]]):
            self.pos[run] += 1

    def exhausted(self, run: int) -> bool:
        """True when the log is used up (owners that declined since are skipped)."""
        self._skip_inactive(run)
        return bool(self.pos[run] >= self.owner.size)

    def next(self, runs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The next logged events of `runs` (each must not be exhausted)."""
        owners = np.empty(len(runs), dtype=np.int64)
        times = np.empty(len(runs))
        for j, r in enumerate(runs):
            self._skip_inactive(int(r))
            p = self.pos[r]
            owners[j], times[j] = self.owner[p], self.time[p]
            self.pos[r] += 1
        return owners, times
