"""A requested stop: SIGTERM (Slurm's warning before a time limit, `scancel --signal=TERM`,
mpiexec passing on a kill) or SIGINT (Ctrl-C) asks every rank to stop at its next record.

Once `install`ed, the first signal only sets a flag; the methods look at it where they record
(`at_record`, collective, so all ranks stop at the same record after a checkpoint) and the
runner before each configuration (a signal during set-up stops there, with nothing lost). A
second signal (more than REPEAT_S later), or no record within GRACE_S of the first, stops at
once (KeyboardInterrupt). mpiexec (hydra) and Slurm signal every rank; a rank that alone got
the signal still stops everyone, because the decision is a reduction over all ranks.
"""

from __future__ import annotations

import signal
import sys
import time
from types import FrameType

import numpy as np
from mpi4py import MPI

#: the exit status of a job stopped by SIGTERM (128 + 15, what a shell reports for a job killed
#: by the signal); slurm/run.sbatch requeues a job that stopped after its time-limit warning
EXIT_TERM = 143
#: the exit status of a job stopped by SIGINT (Ctrl-C)
EXIT_INT = 130

_requested = 0  # the signal number of the first request, 0: none
_at = 0.0  # when it came (time.monotonic)
#: a repeat within this many seconds is the same request delivered twice (at a Slurm time limit
#: a rank may get SIGTERM from its step and again through mpiexec), not a second one
REPEAT_S = 3.0
#: seconds a deferred stop may wait for the next record before it stops at once (Slurm's
#: warning comes 60 s before the time limit: run.sbatch)
GRACE_S = 40


class Interrupted(BaseException):  # noqa: N818 - a stop, like KeyboardInterrupt, not an error
    """Every rank stops together at a record (or between configurations, or in the noise
    calibration) after a signal; `where` says where, when not at a record (e.g. 'during the
    noise calibration')."""

    def __init__(self, signum: int, where: str = "") -> None:
        super().__init__(f"stopped by {signal.Signals(signum).name}")
        self.signum, self.where = signum, where

    @property
    def reason(self) -> str:
        """'stopped by SIGTERM' and where (the result file's status_reason, the CLI's line)."""
        return f"{self} {self.where}" if self.where else str(self)

    @property
    def exit_status(self) -> int:
        return EXIT_TERM if self.signum == signal.SIGTERM else EXIT_INT


def _handler(signum: int, frame: FrameType | None) -> None:
    global _requested, _at
    if _requested:
        if time.monotonic() - _at < REPEAT_S:
            return
        raise KeyboardInterrupt(f"signal {signum}")  # the second signal: stop at once
    _requested, _at = signum, time.monotonic()
    signal.signal(signal.SIGALRM, _too_late)
    signal.alarm(GRACE_S)
    if MPI.COMM_WORLD.Get_rank() == 0:
        print(f"mpi-dp: {signal.Signals(signum).name} received: stopping at the next record "
              "after a checkpoint (send it again to stop at once)", file=sys.stderr, flush=True)


def _too_late(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"no record within {GRACE_S} s of the stop signal")


def install() -> None:
    """Route SIGTERM and SIGINT to the flag (call once, in the CLI, before any work)."""
    signal.signal(signal.SIGTERM, _handler)
    signal.signal(signal.SIGINT, _handler)


def requested() -> int:
    """The signal that asked to stop on this rank (0: none)."""
    return _requested


def reset() -> None:
    """Forget a request (tests that run several jobs in one process)."""
    global _requested
    _requested = 0
    signal.alarm(0)


def request(signum: int = signal.SIGTERM) -> None:
    """Ask to stop as a signal would (tests; a driver that wants a clean stop)."""
    global _requested
    _requested = _requested or signum


def at_record(comm: MPI.Comm, due: bool) -> tuple[bool, int]:
    """Collective at a record: (save a checkpoint now, the signal to stop on or 0). `due` is the
    learner's (rank 0's) checkpoint clock; a stop request on any rank saves and stops all."""
    flags = np.array([1 if due and comm.Get_rank() == 0 else 0, _requested], dtype=np.int64)
    comm.Allreduce(MPI.IN_PLACE, flags, op=MPI.MAX)
    return bool(flags[0]) or bool(flags[1]), int(flags[1])


def check(comm: MPI.Comm) -> None:
    """Collective: raise Interrupted on every rank when a stop was asked on any."""
    signum = at_record(comm, False)[1]
    if signum:
        raise Interrupted(signum)
