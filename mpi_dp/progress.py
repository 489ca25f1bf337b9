"""One progress reporter for every method: rank 0's lines through `logging` (logger "mpi_dp"),
throttled to one line per EVERY_S seconds, one line per event (Slurm logs stay readable: no
carriage returns, no bars).

`mpi-dp run` sets the level (`--quiet`: warnings only; default: progress; `-v`: also debug
lines such as per-record timings). Library users get the standard behaviour of `logging`:
nothing is printed unless they configure a handler or call `configure`.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable

#: the package's logger; progress lines are INFO, details DEBUG
LOGGER = logging.getLogger("mpi_dp")
#: seconds between two progress lines of one loop (the last step is always reported)
EVERY_S = 10.0
_HANDLER_FLAG = "_mpi_dp_handler"


class _Stderr(logging.StreamHandler):
    """A handler on whatever sys.stderr is when a line is written (pytest, redirections)."""

    def __init__(self) -> None:
        super().__init__(sys.stderr)

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, value) -> None:  # logging assigns it in __init__
        pass


def configure(verbosity: int = 0) -> None:
    """Print the package's log on stderr as `mpi-dp: message`: verbosity -1 (--quiet) warnings
    and errors only, 0 progress, 1 (-v) also debug lines. Idempotent."""
    level = logging.WARNING if verbosity < 0 else logging.INFO if verbosity == 0 else logging.DEBUG
    LOGGER.setLevel(level)
    if not any(getattr(h, _HANDLER_FLAG, False) for h in LOGGER.handlers):
        handler = _Stderr()
        handler.setFormatter(logging.Formatter("mpi-dp: %(message)s"))
        setattr(handler, _HANDLER_FLAG, True)
        LOGGER.addHandler(handler)
        LOGGER.propagate = False


def info(message: str) -> None:
    """A one-off progress line (set-up, calibration, where a result was written)."""
    LOGGER.info(message)


def debug(message: str) -> None:
    LOGGER.debug(message)


class Progress:
    """Progress of one loop of `total` steps (iterations, rounds, wake-ups) on the rank that
    reports (`enabled`: rank 0 and progress wanted): `update(k)` logs at most one line per
    `every_s` seconds and always at k == total, as `[label] unit k/total, detail (t s)`;
    `count` formats `k/total` otherwise (e.g. bytes of a download: `12.0 MiB / 40.0 MiB`)."""

    def __init__(self, label: str, total: int, unit: str = "iteration", enabled: bool = True,
                 every_s: float = EVERY_S, clock: Callable[[], float] = time.perf_counter,
                 count: Callable[[int, int], str] | None = None) -> None:
        self.label, self.total, self.unit = label, int(total), unit
        self.enabled, self.every_s, self._clock = enabled, float(every_s), clock
        self._count = count
        self._last: int | None = None  # the step of the last line (never reported twice)
        self.t0 = clock()
        self._next = self.t0 + self.every_s

    def due(self, k: int, force: bool = False) -> bool:
        """Whether `update(k)` would log now (lets a caller skip computing its detail)."""
        if not self.enabled or not LOGGER.isEnabledFor(logging.INFO) or k == self._last:
            return False
        return force or k >= self.total > 0 or self._clock() >= self._next

    def update(self, k: int, detail: str | Callable[[], str] = "", force: bool = False) -> bool:
        """Log step k when due (or when `force`: a loop that ends early); `detail` (text, or a
        function giving it, called only when a line is written) follows the count. Returns
        whether a line was written."""
        if not self.due(k, force):
            return False
        now = self._clock()
        self._next, self._last = now + self.every_s, k
        text = detail() if callable(detail) else detail
        count = (self._count(k, self.total) if self._count is not None
                 else f"{self.unit} {k}/{self.total}")
        LOGGER.info(f"[{self.label}] {count}{', ' + text if text else ''} "
                    f"({now - self.t0:.1f} s)")
        return True
