"""A job's noise calibration, watched: the searches run in a worker thread while the caller's
thread prints a progress line every PROGRESS_S seconds and answers a stop request (SIGTERM,
Ctrl-C: comm.stop) within POLL_S, even in the middle of one composition, which takes minutes at
T = 1e6 (privacy.calibration_cost). A stopped search is cancelled at its next evaluation
(calibration.Cancelled) and caches nothing; its thread is a daemon, so the process exits without
waiting for it. Pure: no MPI (the runner calls it on rank 0 and broadcasts the outcome).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Hashable, Sequence
from typing import TypeVar

from mpi_dp import progress as prog
from mpi_dp.privacy import calibration

#: seconds between two progress lines of a calibration (none for one shorter than this)
PROGRESS_S = 5.0
#: seconds between two looks at the stop flag
POLL_S = 0.2

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


def run(keys: Sequence[K], calibrate: Callable[[K], V], *, stopped: Callable[[], int],
        describe: Callable[[K], str] = str, expected_s: float = 0.0, report: bool = True
        ) -> dict[K, V] | int:
    """{key: calibrate(key)} for every key, computed in order in a worker thread; or, when
    `stopped()` answers a signal number (before or during), that number at once. An exception
    of `calibrate` is raised here. `report`: progress lines (prog.info) naming the plan being
    searched (`describe`), the accountant evaluations so far and `expected_s`, the estimate."""
    signum = stopped()
    if signum or not keys:
        return signum or {}
    done: dict[K, V] = {}
    failed: list[BaseException] = []
    at = [0]

    def work() -> None:
        try:
            for i, key in enumerate(keys):
                at[0] = i
                done[key] = calibrate(key)
        except BaseException as e:  # noqa: BLE001 - handed to the caller's thread
            failed.append(e)

    worker = threading.Thread(target=work, name="mpi_dp-calibration", daemon=True)
    first, t0 = calibration.evaluations(), time.perf_counter()
    next_line = t0 + PROGRESS_S
    worker.start()
    while True:
        worker.join(POLL_S)
        if not worker.is_alive():
            break
        signum = stopped()
        if signum:
            calibration.cancel_thread(worker)
            return signum
        now = time.perf_counter()
        if report and now >= next_line:
            next_line = now + PROGRESS_S
            i = at[0]
            about = f" of about {expected_s:.0f} s estimated" if expected_s >= 1 else ""
            prog.info(f"noise calibration: plan {i + 1} of {len(keys)} ({describe(keys[i])}), "
                      f"{calibration.evaluations() - first} accountant evaluation(s), "
                      f"{now - t0:.0f} s{about}")
    if failed:
        raise failed[0]
    return done
