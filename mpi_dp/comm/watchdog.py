"""A frozen rank cannot hold the job: a rank still running GRACE seconds after the first stop
signal (SIGTERM, SIGINT) aborts every rank.

comm.stop stops the ranks together at a record, a collective: a rank that never answers (stopped
by SIGSTOP, on a dead node, in a hung file system) leaves the others blocked in an MPI call, and
Python runs signal handlers (comm.stop's, its SIGALRM) only in the main thread between bytecodes,
never while that thread waits in C. The C-level handler still writes the signal's number to the
wakeup fd (signal.set_wakeup_fd): a daemon thread blocked on that pipe sees the signal at once,
waits the grace period and calls MPI.COMM_WORLD.Abort (mpiexec then kills every rank, the frozen
one too). mpi4py releases the GIL inside blocking MPI calls, so the thread runs while the main
thread waits in one. The learner flushes the result file at every record and syncs it at every
complete configuration, so what was recorded stays readable.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from types import TracebackType

from mpi4py import MPI

from ..errors import JobError
from . import stop

#: the environment variable of the grace period (seconds)
GRACE_VAR = "MPI_DP_STOP_GRACE_S"
#: default: after comm.stop's own GRACE_S (a clean stop at a record, else at once), and within
#: the 60 s between Slurm's warning (slurm/run.sbatch) and the time limit
DEFAULT_GRACE_S = 45.0
#: the ranks other than 0 wait this much longer: the learner, if it is alive, aborts first and
#: alone says so
LATER_S = 2.0
#: the signals that ask to stop (comm.stop handles them)
WATCHED = (signal.SIGTERM, signal.SIGINT)


def grace_s() -> float:
    """The grace period: MPI_DP_STOP_GRACE_S (default 45). A value that is not a number > 0 is a
    user error (JobError)."""
    raw = os.environ.get(GRACE_VAR, "")
    if not raw.strip():
        return DEFAULT_GRACE_S
    try:
        v = float(raw)
    except ValueError:
        v = float("nan")
    if not (0 < v < float("inf")):
        raise JobError(f"{GRACE_VAR}={raw!r}: expected a number of seconds > 0 (the time a rank "
                       f"waits for the others after a stop signal before it aborts the job; "
                       f"default {DEFAULT_GRACE_S:g})")
    return v


class Watchdog:
    """While entered (in the main thread of a multi-rank job), abort the job `grace` seconds
    after the first SIGTERM / SIGINT unless the block has finished by then. `hint` ends the
    line printed before the abort (how to continue the job)."""

    def __init__(self, comm: MPI.Comm, grace: float, hint: str) -> None:
        self.comm, self.grace, self.hint = comm, grace, hint
        self._done = threading.Event()
        self._signum = 0
        self._fds: tuple[int, int] | None = None
        self._old_fd = -1
        self._thread: threading.Thread | None = None

    def __enter__(self) -> Watchdog:
        if self.comm.Get_size() < 2 or threading.current_thread() is not threading.main_thread():
            return self  # one rank: nobody to wait for; the wakeup fd is the main thread's
        r, w = os.pipe()
        os.set_blocking(w, False)  # the C handler must never block on a full pipe
        self._fds = (r, w)
        self._old_fd = signal.set_wakeup_fd(w, warn_on_full_buffer=False)
        self._thread = threading.Thread(target=self._watch, name="mpi_dp-stop-watchdog",
                                        daemon=True)
        self._thread.start()
        if stop.requested():  # a signal before the pipe (caught early, or just now)
            self.arm(stop.requested())
        return self

    def arm(self, signum: int) -> None:
        """Start the grace period now (a stop signal that came before the watchdog)."""
        if self._fds is not None:
            os.write(self._fds[1], bytes([signum]))

    def _watch(self) -> None:
        assert self._fds is not None
        while not self._done.is_set():
            try:
                data = os.read(self._fds[0], 64)  # blocks without the GIL
            except OSError:
                return
            if not data:
                return
            self._signum = next((b for b in data if b in WATCHED), 0)
            if self._signum:
                break
        if not self._signum:
            return
        rank = self.comm.Get_rank()
        wait = self.grace + (LATER_S if rank else 0.0)
        if self._done.wait(wait):
            return
        name = signal.Signals(self._signum).name
        print(f"mpi-dp: rank {rank} of {self.comm.Get_size()}: still running {wait:g} s after "
              f"{name}: a rank does not answer (stopped, a dead node or a hung file system?); "
              f"aborting every rank ({GRACE_VAR}={self.grace:g} sets the wait). The result file "
              f"keeps every complete configuration; {self.hint}",
              file=sys.stderr, flush=True)
        code = stop.EXIT_INT if self._signum == signal.SIGINT else stop.EXIT_TERM
        try:
            self.comm.Abort(code)
        finally:
            os._exit(code)  # Abort does not return; never leave this rank running

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._done.set()
        if self._fds is None:
            return
        signal.set_wakeup_fd(self._old_fd)
        r, w = self._fds
        try:
            os.write(w, b"\0")  # wake the thread if it still reads
        except OSError:
            pass
        if self._thread is not None:
            self._thread.join(timeout=1.0)
        os.close(w)
        if self._thread is None or not self._thread.is_alive():
            os.close(r)
        self._fds = None
