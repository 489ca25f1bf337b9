"""mpi_dp.progress: the one progress reporter (rank 0's lines through logging, throttled)."""

from __future__ import annotations

import io
import logging
import sys

import pytest

from mpi_dp import progress
from mpi_dp.progress import LOGGER, Progress


@pytest.fixture(autouse=True)
def _logger_restored():
    """configure() changes the package logger for the whole process: put it back."""
    level, handlers, propagate = LOGGER.level, list(LOGGER.handlers), LOGGER.propagate
    yield
    LOGGER.setLevel(level)
    LOGGER.handlers[:] = handlers
    LOGGER.propagate = propagate


class Clock:
    """An injected clock: seconds set by the test."""

    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def lines(capsys) -> list[str]:
    return capsys.readouterr().err.splitlines()


def test_lines_only_when_due_and_always_at_the_last_step(capsys):
    progress.configure()
    clock = Clock()
    bar = Progress("1/2 cfg", 100, "round", every_s=10.0, clock=clock)
    written = []
    for k, t in [(1, 1.0), (2, 9.9), (3, 10.0), (4, 15.0), (5, 19.9), (6, 20.1), (7, 21.0),
                 (100, 22.0)]:
        clock.t = t
        written.append(bar.update(k))
    assert written == [False, False, True, False, False, True, False, True]
    assert lines(capsys) == ["mpi-dp: [1/2 cfg] round 3/100 (10.0 s)",
                             "mpi-dp: [1/2 cfg] round 6/100 (20.1 s)",
                             "mpi-dp: [1/2 cfg] round 100/100 (22.0 s)"]


def test_format_with_a_detail_computed_only_when_written(capsys):
    progress.configure()
    clock = Clock()
    clock.t = 5.0
    bar = Progress("3/8 eps=1", 40, clock=clock)  # default unit: iteration
    calls = []

    def detail() -> str:
        calls.append(1)
        return "median psi 0.123"

    assert not bar.update(1, detail) and calls == []
    clock.t = 17.25
    assert bar.due(2) and bar.update(2, detail) and calls == [1]
    assert bar.update(40, "median psi 0.01")
    assert lines(capsys) == ["mpi-dp: [3/8 eps=1] iteration 2/40, median psi 0.123 (12.2 s)",
                             "mpi-dp: [3/8 eps=1] iteration 40/40, median psi 0.01 (12.2 s)"]


def test_disabled_reporter_and_other_ranks_print_nothing(capsys):
    progress.configure()
    clock = Clock()
    bar = Progress("x", 3, enabled=False, clock=clock)
    clock.t = 100.0
    assert not bar.due(3) and not bar.update(3, lambda: pytest.fail("detail computed"))
    assert capsys.readouterr().err == ""


def test_quiet_hides_progress_but_shows_warnings(capsys):
    progress.configure(-1)  # --quiet
    bar = Progress("q", 2, clock=Clock())
    assert not bar.due(2) and not bar.update(2)
    progress.info("resuming r.h5.partial")
    progress.debug("a per-record timing")
    LOGGER.warning("warning: something to see")
    assert lines(capsys) == ["mpi-dp: warning: something to see"]
    progress.configure(0)
    progress.info("resuming r.h5.partial")
    progress.debug("a per-record timing")
    assert bar.update(2)
    assert lines(capsys) == ["mpi-dp: resuming r.h5.partial", "mpi-dp: [q] iteration 2/2 (0.0 s)"]
    progress.configure(1)  # -v
    progress.debug("a per-record timing")
    assert lines(capsys) == ["mpi-dp: a per-record timing"]


def test_lines_go_to_the_current_stderr(monkeypatch):
    progress.configure()
    progress.configure()  # idempotent: one handler, one line per message
    first, second = io.StringIO(), io.StringIO()
    monkeypatch.setattr(sys, "stderr", first)
    progress.info("noise calibrated (pld) for 1 distinct release plan(s) in 0.1 s:\n  plan")
    monkeypatch.setattr(sys, "stderr", second)
    progress.info("done in 1.0 s -> r.h5")
    assert first.getvalue() == ("mpi-dp: noise calibrated (pld) for 1 distinct release plan(s) "
                                "in 0.1 s:\n  plan\n")
    assert second.getvalue() == "mpi-dp: done in 1.0 s -> r.h5\n"
    assert sum(getattr(h, "_mpi_dp_handler", False) for h in LOGGER.handlers) == 1


def test_nothing_is_configured_by_importing(capsys):
    """A library user who configures nothing sees no progress line (logging's default)."""
    root = logging.getLogger()
    root_level = root.level
    root.setLevel(logging.WARNING)  # the default, whatever ran before
    try:
        LOGGER.handlers[:] = [h for h in LOGGER.handlers
                              if not getattr(h, "_mpi_dp_handler", False)]
        LOGGER.setLevel(logging.NOTSET)
        LOGGER.propagate = True
        assert not Progress("lib", 1, clock=Clock()).update(1)
        progress.info("not shown")
    finally:
        root.setLevel(root_level)
    assert capsys.readouterr().err == ""
