"""Honest estimates for long runs (issue 43): the estimate a run prints includes the noise
calibration (whose compositions grow with T), a long calibration prints progress lines, and a
stop signal during it ends the run within a moment, every rank together, with nothing written.
No time is asserted: slow compositions are made slow on purpose (a sleep per evaluation)."""

from __future__ import annotations

import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import h5py
import pytest
from helpers import HANG_GUARD_S, MPIEXEC, write_job

from mpi_dp import progress as prog
from mpi_dp.data.synth import write_synth
from mpi_dp.errors import JobError
from mpi_dp.privacy import accountants, calibration, calibration_cost, calibration_run
from mpi_dp.privacy.calibration import Plan
from mpi_dp.results import footprint


def test_the_calibration_cost_grows_with_T_and_enters_the_estimate(tmp_path):
    """The model: a pld search of a Laplace plan composes T releases, so its cost (seconds and
    rank 0's memory) grows with T; the job's estimate adds it and says so; a calibration that
    cannot fit in the node's memory is refused naming it."""
    small, large = (calibration_cost.plan_cost(Plan("laplace", T, 100.0, 1e-5), "pld")
                    for T in (1_000, 100_000))
    assert 0 < small.seconds and 10 * small.seconds < large.seconds
    assert 10 * small.peak_bytes < large.peak_bytes and large.evaluations >= 8
    # nothing to search: no noise, negligible noise, a Gaussian composes one Gaussian whatever T
    assert calibration_cost.plan_cost(Plan("laplace", 10**6, float("inf"), 1e-5), "pld").seconds == 0
    assert calibration_cost.plan_cost(Plan("laplace", 10, 1e6, 1e-5), "pld").seconds == 0
    g = [calibration_cost.plan_cost(Plan("gaussian", T, 1.0, 1e-5), "pld").seconds
         for T in (1_000, 100_000)]
    assert g[1] < 2 * g[0]
    # the job: iterations and records, then the calibration on top
    it = footprint.config_footprint(1000, 2, 501, 10, 3, 12000, 3)
    fp = it.with_calibration(large.seconds, large.peak_bytes)
    assert fp.seconds == it.seconds + large.seconds and fp.calibration_bytes == large.peak_bytes
    assert "noise calibration about" in fp.text() and "noise calibration" not in it.text()
    huge = it.with_calibration(1.0, 1e18)
    with pytest.raises(JobError, match="for the noise calibration"):
        footprint.check(huge, tmp_path / "r.h5", 1, force=True, progress=False)


@pytest.fixture()
def slow_pld(monkeypatch):
    """Every PLD composition sleeps first (a long search without the CPU); nothing cached."""
    real = accountants.pld

    def slow(pairs, delta):
        time.sleep(0.05)
        return real(pairs, delta)
    monkeypatch.setattr(accountants, "pld", slow)
    monkeypatch.setattr(calibration, "_CACHE", {})
    monkeypatch.setattr(accountants, "_CACHE", {})
    monkeypatch.setattr(calibration_run, "PROGRESS_S", 0.05)
    monkeypatch.setattr(calibration_run, "POLL_S", 0.01)


@pytest.mark.parametrize("verbosity", [0, -1])
def test_a_long_calibration_prints_progress_lines_unless_quiet(slow_pld, capsys, verbosity):
    plans = [("pld", Plan("laplace", 300, e, 1e-5)) for e in (1.0, 2.0)]
    old = prog.LOGGER.level
    prog.configure(verbosity)
    try:
        out = calibration_run.run(plans, lambda k: calibration.calibrate(k[1], k[0]),
                                  stopped=lambda: 0, describe=lambda k: f"eps={k[1].eps:g}",
                                  expected_s=3.0)
    finally:
        prog.LOGGER.setLevel(old)
    assert isinstance(out, dict) and list(out) == plans
    assert out[plans[1]] == calibration.calibrate(plans[1][1], "pld")  # the search's own answer
    lines = [ln for ln in capsys.readouterr().err.splitlines() if "noise calibration:" in ln]
    if verbosity < 0:
        assert lines == []
        return
    assert len(lines) >= 2, lines
    assert re.match(r"mpi-dp: noise calibration: plan 1 of 2 \(eps=1\), \d+ accountant "
                    r"evaluation\(s\), \d+ s of about 3 s estimated", lines[0]), lines
    assert any("plan 2 of 2 (eps=2)" in ln for ln in lines), lines


def test_a_stop_request_ends_the_search_at_once_and_caches_nothing(slow_pld):
    plan = Plan("laplace", 300, 3.0, 1e-5)
    asked = []

    def stopped() -> int:  # a SIGTERM once the search has evaluated twice
        if calibration.evaluations() >= start + 2:
            asked.append(True)
            return int(signal.SIGTERM)
        return 0
    start = calibration.evaluations()
    got = calibration_run.run([("pld", plan)], lambda k: calibration.calibrate(k[1], k[0]),
                              stopped=stopped, report=False)
    assert got == signal.SIGTERM and asked
    for t in threading.enumerate():  # the cancelled search ends at its next evaluation
        if t.name == "mpi_dp-calibration":
            t.join(HANG_GUARD_S)
            assert not t.is_alive()
    assert not calibration.cached(plan, "pld")
    assert calibration.evaluations() <= start + 4  # it stopped, it did not search on
    # a stop asked before the calibration: it does not start
    assert calibration_run.run([("pld", plan)], calibration.calibrate, stopped=lambda: 2) == 2


#: `mpi-dp run` with every PLD composition slowed down (0.4 s) and progress lines every 0.3 s
SLOW_RUN = """import sys, time
from mpi_dp.privacy import accountants
real = accountants.pld
def slow(pairs, delta):
    time.sleep(0.4)
    return real(pairs, delta)
accountants.pld = slow
try:
    from mpi_dp.privacy import calibration_run
    calibration_run.PROGRESS_S = 0.3
except ImportError:  # code without progress lines
    pass
from mpi_dp.cli import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.parametrize("ranks", [1, 2])
def test_sigterm_during_the_calibration_stops_every_rank_at_once(tmp_path, ranks):
    """SIGTERM while rank 0 searches the noise (here: as soon as it reports progress) stops
    the job there, on every rank, without finishing the calibration: exit 143, the run's usual
    'interrupted' lines naming the calibration, a readable PATH.partial saying 'interrupted'
    with no configuration done, no lock or reserve left; --resume then runs the job."""
    data = tmp_path / "d.h5"
    write_synth(data, "regression", 3, 60, 4, 0.5, 1, public=50)
    job = write_job(tmp_path / "cal.toml", data, T=300, runs=2, record_every=10,
                    sweep={"eps": [1.0, 2.0, 4.0]})
    out = tmp_path / "cal.h5"
    script = tmp_path / "slow_run.py"
    script.write_text(SLOW_RUN)
    cmd = [sys.executable, str(script), "run", str(job), "--out", str(out)]
    if ranks > 1:
        cmd = [MPIEXEC, "-n", str(ranks), *cmd]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, cwd=tmp_path,
                            env=dict(os.environ, OPENBLAS_NUM_THREADS="1"))
    lines: queue.Queue[str | None] = queue.Queue()

    def read() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            lines.put(line)
        lines.put(None)
    threading.Thread(target=read, daemon=True).start()
    seen: list[str] = []
    try:
        estimated = False
        while True:  # until the calibration's first progress line
            try:
                line = lines.get(timeout=10.0 if estimated else HANG_GUARD_S)
            except queue.Empty:  # code without progress lines: stop it in its calibration
                break
            if line is None:
                break
            seen.append(line)
            estimated = estimated or "estimated before starting" in line
            if "noise calibration:" in line:
                break
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=HANG_GUARD_S)  # a hang guard, not a time limit
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    while (line := lines.get(timeout=HANG_GUARD_S)) is not None:
        seen.append(line)
    err = "".join(seen)
    assert "noise calibration: plan 1 of 3" in err, err  # progress before the signal
    assert proc.returncode == 143, err
    said = [ln for ln in seen if ln.startswith("mpi-dp: interrupted (")]
    assert len(said) == 1, err
    assert said[0].startswith("mpi-dp: interrupted (stopped by SIGTERM) during the noise "
                              "calibration; "), said
    assert "--resume" in said[0], said
    assert "noise calibrated" not in err and "BAD TERMINATION" not in err, err
    assert "Traceback" not in err, err
    left = sorted(p.name for p in tmp_path.iterdir())
    assert left == ["cal.h5.partial", "cal.toml", "d.h5", "slow_run.py"], left
    with h5py.File(f"{out}.partial", "r", locking=False) as f:
        assert f.attrs["status"] == "interrupted"
        assert f.attrs["status_reason"] == "stopped by SIGTERM during the noise calibration"
        assert int(f.attrs["progress_config"]) == 0 and "configs" not in f
    if ranks == 1:  # the calibration (not slowed now) and the configurations run
        cp = subprocess.run([sys.executable, "-m", "mpi_dp", "run", str(job), "--out", str(out),
                             "--resume", "--quiet"], capture_output=True, text=True,
                            cwd=tmp_path, timeout=HANG_GUARD_S)
        assert cp.returncode == 0 and out.exists(), cp.stderr


def test_the_run_prints_its_calibration_in_the_estimate(tmp_path):
    """A run whose plans are searched says so in its estimate line, before the calibration."""
    data = tmp_path / "d.h5"
    write_synth(data, "regression", 3, 60, 4, 0.5, 1, public=50)
    job = write_job(tmp_path / "e.toml", data, T=3000, runs=1, record_every=1000, eps=30.0)
    cp = subprocess.run([sys.executable, "-m", "mpi_dp", "run", str(job), "--out",
                         str(tmp_path / "e.h5")], capture_output=True, text=True, cwd=tmp_path,
                        timeout=HANG_GUARD_S)
    assert cp.returncode == 0, cp.stderr
    est = re.search(r"estimated before starting: .* time about \S+ \S+ from here \(noise "
                    r"calibration about \S+ \S+ of it, \S+ \S+ on rank 0\)", cp.stderr)
    assert est is not None, cp.stderr
    assert est.start() < cp.stderr.index("noise calibrated (pld)")
    assert Path(tmp_path / "e.h5").exists()
