"""How honest is the estimate a run prints before it starts? The demo job (jobs/demo.toml:
sync_star, 3 owners x 4,000 records, d = 10, eps in 1, 10, 100, inf) at T = 1e3 ... 1e7: each
`mpi-dp run` prints "time about X from here (noise calibration about Y of it ...)"; the script
times what follows that line (the calibration, the configurations, closing the file) and prints
estimate, measured and their ratio (goal: within 2x, i.e. 0.5 <= measured / estimate <= 2).

    python benchmarks/estimate.py                       # T = 1e3 ... 1e6, 3 blocks
    python benchmarks/estimate.py --max-T 1e7 --blocks 1
    python benchmarks/estimate.py --runs 1 --record-every 1000 --max-T 1e7
    python benchmarks/estimate.py --quick               # smoke test: T = 1e3, 1e4 (seconds)

Blocks interleave the T values (block 1: every T, then block 2 ...) so that every T sees the
same load; per T the median and spread of the ratio over the blocks. A loaded machine runs
slower than any estimate made before starting can know: the table also prints the share of a
core the run got (CPU time / wall time) and the ratio at that share ("idle ratio": the measured
time times the share, what an idle machine would take, roughly).

How long it takes: about the estimates it prints. At the demo's 20 runs and record_every = 2 a
configuration costs ~3-5 ms per iteration on one core, so T = 1e5 is ~30 min and T = 1e6 ~5 h
(4 configurations; the calibration ~6 min); T = 1e7 (~2 days) is left out unless --max-T says
so: for a T beyond --max-T the script starts the run, reads its estimate (or its refusal: at
T = 1e7 the eps = 100 calibration needs ~20 GB on rank 0), stops it with SIGTERM (which ends it
within a second, calibration included) and prints that. --runs 1 and a larger --record-every
make every T ~10x cheaper. The shards are made in a temporary folder, removed at the end.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import queue
import re
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]
DEMO = ROOT / "jobs" / "demo.toml"
#: the demo's shards (`make demo`)
SYNTH = ["data", "synth", "--task", "regression", "--agents", "3", "--records", "4000",
         "--dim", "10", "--noise", "0.5", "--seed", "1", "--public", "10000"]
UNITS = {"s": 1.0, "min": 60.0, "h": 3600.0, "days": 86400.0, "years": 365.25 * 86400}
ESTIMATE = re.compile(r"time about ([0-9.e+]+) (s|min|h|days|years) from here"
                      r"(?: \(noise calibration about ([0-9.e+]+) (s|min|h|days|years))?")
CALIBRATED = re.compile(r"noise calibrated \(.*\) for \d+ distinct release plan\(s\) in "
                        r"([0-9.]+) s")
#: --quick: the smallest meaningful case (options given explicitly win)
QUICK = {"T": "1e3,1e4", "blocks": 1, "runs": 1, "record_every": 50, "eps": "1.0"}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--T", default="1e3,1e4,1e5,1e6,1e7", help="the horizons, comma-separated")
    ap.add_argument("--max-T", type=float, default=1e6,
                    help="run T up to this; a larger T only prints its estimate")
    ap.add_argument("--blocks", type=int, default=3, help="interleaved blocks")
    ap.add_argument("--runs", type=int, default=20, help="Monte-Carlo runs (the demo's: 20)")
    ap.add_argument("--record-every", dest="record_every", type=int, default=2,
                    help="iterations between records (the demo's: 2)")
    ap.add_argument("--eps", default="", help="the eps sweep, comma-separated (default: the "
                    "demo's 1, 10, 100, inf)")
    ap.add_argument("--ranks", type=int, default=1, help="MPI ranks of each run (mpiexec)")
    ap.add_argument("--quick", action="store_true",
                    help="smoke test (tests/test_benchmarks.py): "
                    + ", ".join(f"--{k.replace('_', '-')} {v}" for k, v in QUICK.items())
                    + " (options given explicitly win)")
    a = ap.parse_args(argv)
    if a.quick:
        for k, v in QUICK.items():
            if getattr(a, k) == ap.get_default(k):
                setattr(a, k, v)
    return a


def _seconds(value: str | None, unit: str | None) -> float:
    return float("nan") if value is None or unit is None else float(value) * UNITS[unit]


class Run:
    """One `mpi-dp run` as a subprocess: its stderr lines time-stamped as they come."""

    def __init__(self, cmd: list[str], cwd: pathlib.Path) -> None:
        self.t0 = time.perf_counter()
        self.proc = subprocess.Popen(cmd, cwd=cwd, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE, text=True, start_new_session=True,
                                     env=dict(os.environ, OPENBLAS_NUM_THREADS="1"))
        self.lines: queue.Queue[tuple[float, str | None]] = queue.Queue()
        self.seen: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.lines.put((time.perf_counter(), line.rstrip("\n")))
        self.lines.put((time.perf_counter(), None))

    def until(self, pattern: re.Pattern) -> tuple[float, re.Match | None]:
        """Read lines until one matches `pattern` (its time and match) or the output ends."""
        while True:
            t, line = self.lines.get()
            if line is None:
                return t, None
            self.seen.append(line)
            m = pattern.search(line)
            if m:
                return t, m

    def finish(self) -> tuple[float, int, float]:
        """Wait for the end: (its time, exit status, CPU seconds of the process tree)."""
        _, status, usage = os.wait4(self.proc.pid, 0)
        t = time.perf_counter()
        self.proc.returncode = os.waitstatus_to_exitcode(status)
        self.until(re.compile(r"$^"))  # the rest of the output
        return t, self.proc.returncode, usage.ru_utime + usage.ru_stime

    def stop(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass


def command(a: argparse.Namespace, job: pathlib.Path, out: pathlib.Path, T: int) -> list[str]:
    cmd = [sys.executable, "-m", "mpi_dp", "run", str(job), "--out", str(out), "--overwrite",
           "--set", f"T={T}", "--set", f"runs={a.runs}", "--set",
           f"record_every={a.record_every}"]
    if a.ranks > 1:
        mpiexec = pathlib.Path(sys.executable).parent / "mpiexec"
        cmd = [str(mpiexec) if mpiexec.exists() else "mpiexec", "-n", str(a.ranks), *cmd]
    return cmd


def measure(a: argparse.Namespace, job: pathlib.Path, tmp: pathlib.Path, T: int) -> dict:
    """One run at T: its estimate, and what followed it."""
    run = Run(command(a, job, tmp / "out.h5", T), tmp)
    t_est, m = run.until(ESTIMATE)
    if m is None:
        run.finish()
        return {"error": next((ln for ln in run.seen if "error" in ln), "no estimate printed")}
    est, cal_est = _seconds(m[1], m[2]), _seconds(m[3], m[4])
    _, c = run.until(CALIBRATED)
    t_end, rc, cpu = run.finish()
    if rc != 0:
        return {"error": f"exit {rc}: " + " | ".join(run.seen[-3:])}
    wall = t_end - t_est
    share = min(1.0, cpu / (t_end - run.t0) / a.ranks)
    return {"estimate": est, "calibration_estimate": cal_est, "measured": wall,
            "calibration": float(c[1]) if c is not None else float("nan"),
            "total": t_end - run.t0, "share": share, "ratio": wall / est,
            "idle_ratio": wall * share / est}


def estimate_only(a: argparse.Namespace, job: pathlib.Path, tmp: pathlib.Path, T: int) -> str:
    """The estimate (or refusal) a run at T prints, then the run stopped (SIGTERM)."""
    run = Run(command(a, job, tmp / "skipped.h5", T), tmp)
    _, m = run.until(re.compile(r"estimated before starting: .*|mpi-dp: error: .*"))
    run.stop()
    run.finish()
    return m[0] if m is not None else "no estimate printed"


def main(argv: list[str] | None = None) -> None:
    a = parse_args(argv)
    Ts = [int(float(t)) for t in a.T.split(",")]
    ran = [T for T in Ts if T <= a.max_T]
    tmp = pathlib.Path(tempfile.mkdtemp(prefix="estimate."))
    try:
        data = tmp / "demo_shards.h5"
        subprocess.run([sys.executable, "-m", "mpi_dp", *SYNTH, "--out", str(data)], check=True,
                       capture_output=True)
        text = DEMO.read_text().replace('"data/demo_shards.h5"', f'"{data}"')
        if a.eps:
            text = re.sub(r"(?m)^eps = \[.*\]$", f"eps = [{a.eps}]", text)
        job = tmp / "demo.toml"
        job.write_text(text)
        print(f"estimate{' (quick)' if a.quick else ''}: the demo job (3 owners x 4,000 records, "
              f"d = 10, eps [{a.eps or '1, 10, 100, inf'}]), runs = {a.runs}, record_every = "
              f"{a.record_every}, {a.ranks} rank(s), T in {Ts}, {a.blocks} block(s); load "
              f"average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPU(s)", flush=True)
        rows: dict[int, list[dict]] = {T: [] for T in ran}
        for blk in range(a.blocks):
            for T in ran:
                r = measure(a, job, tmp, T)
                rows[T].append(r)
                if "error" in r:
                    print(f"block {blk + 1} T={T:.0e}: {r['error']}", flush=True)
                    continue
                print(f"block {blk + 1} T={T:.0e}: estimate {r['estimate']:.4g} s (calibration "
                      f"{r['calibration_estimate']:.3g} s), measured {r['measured']:.4g} s "
                      f"(calibration {r['calibration']:.3g} s), ratio {r['ratio']:.3g}, core "
                      f"share {r['share']:.2f}, idle ratio {r['idle_ratio']:.3g}", flush=True)
        print("T       estimate s  calibration est. s  measured s (median)  calibration s  "
              "ratio median [min, max]  idle ratio median  within 2x")
        for T in ran:
            ok = [r for r in rows[T] if "error" not in r]
            if not ok:
                print(f"{T:<7.0e} (every block failed)")
                continue
            ratio = np.array([r["ratio"] for r in ok])
            idle = np.median([r["idle_ratio"] for r in ok])
            med = float(np.median(ratio))
            verdict = ("yes" if 0.5 <= med <= 2 else
                       "no (at the core share: yes)" if 0.5 <= idle <= 2 else "NO")
            print(f"{T:<7.0e} {np.median([r['estimate'] for r in ok]):>10.4g}  "
                  f"{np.median([r['calibration_estimate'] for r in ok]):>18.3g}  "
                  f"{np.median([r['measured'] for r in ok]):>19.4g}  "
                  f"{np.median([r['calibration'] for r in ok]):>13.3g}  "
                  f"{med:>6.3g} [{ratio.min():.3g}, {ratio.max():.3g}]  {idle:>17.3g}  "
                  f"{verdict}", flush=True)
        for T in Ts:
            if T > a.max_T:
                print(f"T={T:.0e} not run (--max-T {a.max_T:.0e}): {estimate_only(a, job, tmp, T)}",
                      flush=True)
        print(f"CPU time of this script's runs: "
              f"{resource.getrusage(resource.RUSAGE_CHILDREN).ru_utime:.0f} s")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
