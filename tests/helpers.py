"""Test helpers: job files and launching real `mpiexec` runs."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

BIN = Path(sys.executable).parent
MPIEXEC = str(BIN / "mpiexec") if (BIN / "mpiexec").exists() else "mpiexec"
#: a hang guard for child MPI jobs (not a performance limit: the jobs take seconds)
HANG_GUARD_S = 300


def mpi_run(n: int, args: list[str], cwd: Path | None = None, env: dict | None = None,
            timeout: float = HANG_GUARD_S) -> subprocess.CompletedProcess:
    """`mpiexec -n N python -m mpi_dp ARGS` as a real MPI job; returns the completed process."""
    cmd = [MPIEXEC, "-n", str(n), sys.executable, "-m", "mpi_dp", *args]
    full_env = dict(os.environ, OPENBLAS_NUM_THREADS="1", **(env or {}))
    return subprocess.run(cmd, cwd=cwd, env=full_env, capture_output=True, text=True,
                          timeout=timeout)


#: keys of the star methods' small test jobs (other methods do not read them)
STAR_KEYS = dict(loss="squared", lam=1e-2, theta_max=1e6, xi="auto")


def write_job(path: Path, data: Path, **keys) -> Path:
    """A small job (TOML; sync_star unless `algorithm` is given) with overridable keys; tables
    given as dicts. The star methods' keys (STAR_KEYS) are added for sync_star and async_star."""
    base = dict(name=path.stem, algorithm="sync_star", variant="alg2", data=str(data),
                output=str(path.with_suffix(".h5")), seed=7, runs=3, T=30, eps=1.0)
    if keys.get("algorithm", "sync_star") in ("sync_star", "async_star"):
        base.update(STAR_KEYS)
    else:
        del base["variant"]  # the method's default variant unless given
    base.update(keys)
    lines, tables = [], []
    for k, v in base.items():
        (tables if isinstance(v, dict) else lines).append((k, v))
    text = "\n".join(f"{k} = {_toml(v)}" for k, v in lines)
    for k, v in tables:
        text += f"\n\n[{k}]\n" + "\n".join(f"{kk} = {_toml(vv)}" for kk, vv in v.items())
    path.write_text(text + "\n")
    return path


def _toml(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return f'"{v}"'
    if isinstance(v, float) and v == float("inf"):
        return "inf"
    if isinstance(v, list):
        return "[" + ", ".join(_toml(x) for x in v) + "]"
    return repr(v)


def assert_rank_invariant(job: Path, out_dir: Path, ranks=(1, 2, 4)) -> list[dict]:
    """Run `job` under mpiexec on each rank count; assert every dataset is bitwise identical.

    Returns the datasets of each run ({path: array}), in the order of `ranks`.
    """
    import numpy as np

    results = []
    for n in ranks:
        out = out_dir / f"{job.stem}_{n}ranks.h5"
        cp = mpi_run(n, ["run", str(job), "--out", str(out), "--quiet"])
        assert cp.returncode == 0, cp.stderr
        results.append(read_datasets(out))
    keys = sorted(results[0])
    for other in results[1:]:
        assert sorted(other) == keys
        for k in keys:
            a, b = results[0][k], other[k]
            if a.dtype.names:
                assert a.tobytes() == b.tobytes(), k
            else:
                np.testing.assert_array_equal(a, b, err_msg=k)
    return results


def count_calls(monkeypatch, owner, name: str) -> list:
    """Replace `owner.name` (a module's function or a class's method) by a wrapper that calls it
    and appends 1 to the returned list at every call (the test counts, e.g., solves)."""
    calls: list = []
    real = getattr(owner, name)

    def counted(*a, **k):
        calls.append(1)
        return real(*a, **k)

    monkeypatch.setattr(owner, name, counted)
    return calls


def read_datasets(path: Path) -> dict:
    """Every dataset of an HDF5 file as {path: array}."""
    import h5py

    out = {}
    with h5py.File(path, "r") as f:
        def visit(name, obj):
            if isinstance(obj, h5py.Dataset):
                out[name] = obj[()]
        f.visititems(visit)
    return out


def wait_for_progress(partial: Path, key: str, at_least: int, limit: float = HANG_GUARD_S,
                      poll: float = 0.2) -> None:
    """Wait until the heartbeat attribute `key` (progress_config, progress_record) of a result
    file being written reaches `at_least` (read every `poll` seconds); AssertionError after
    `limit` seconds."""
    import time

    import h5py

    t0 = time.monotonic()
    while time.monotonic() - t0 < limit:
        try:
            with h5py.File(partial, "r", locking=False) as f:
                if f.attrs.get(key, 0) >= at_least:
                    return
        except (OSError, KeyError):
            pass
        time.sleep(poll)
    raise AssertionError(f"{partial} never reached {key} >= {at_least}")


def assert_resumes_inside_a_configuration(job: Path, resumed_text: str, kill_at: str = "1:6",
                                          n_records: int = 5) -> None:
    """Checkpoint at every record (MPI_DP_CHECKPOINT_S=0); SIGKILL the writer at `kill_at`
    (configuration:record) under mpiexec -n 4; the partial file holds a checkpoint taken after
    `n_records` records of that configuration; `run --resume` on 2 ranks prints `resumed_text`
    and gives every dataset of an uninterrupted 4-rank run, byte for byte, with no checkpoint
    left in the final file."""
    import h5py

    from mpi_dp.results.output import partial_path

    whole, cut = job.with_name("whole.h5"), job.with_name("cut.h5")
    cp = mpi_run(4, ["run", str(job), "--out", str(whole), "--quiet"])
    assert cp.returncode == 0, cp.stderr
    env = {"MPI_DP_TEST_KILL_AT": kill_at, "MPI_DP_CHECKPOINT_S": "0"}
    cp = mpi_run(4, ["run", str(job), "--out", str(cut), "--quiet"], env=env)
    assert cp.returncode != 0 and not cut.exists()
    config = int(kill_at.split(":")[0])
    with h5py.File(partial_path(cut), "r", locking=False) as f:
        assert f[f"configs/{config:03d}/checkpoint"].attrs["n_records"] == n_records
    cp = mpi_run(2, ["run", str(job), "--out", str(cut), "--resume"],
                 env={"MPI_DP_CHECKPOINT_S": "0"})
    assert cp.returncode == 0, cp.stderr
    assert resumed_text in cp.stderr, cp.stderr
    a, b = read_datasets(whole), read_datasets(cut)
    assert sorted(a) == sorted(b) and not any("checkpoint" in k for k in b)
    for k in a:
        assert a[k].tobytes() == b[k].tobytes(), k


def start_when_requeued(job_id: str, limit: float = 120.0) -> None:
    """Slurm holds a requeued job about 2 minutes (BeginTime): once it is pending again (the
    stopped attempt first saves a checkpoint and closes its file), let it start at once."""
    import time

    t0 = time.monotonic()
    while time.monotonic() - t0 < limit:
        q = subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%T"], capture_output=True,
                           text=True, timeout=60)
        if "PENDING" in q.stdout:
            subprocess.run(["scontrol", "update", f"JobId={job_id}", "StartTime=now"],
                           capture_output=True, timeout=60)
            return
        if not q.stdout.strip():
            return
        time.sleep(0.5)


def admm_paper_contract(s, eps_bar: float):
    """The contract of an admm run outside a job (`s`: admm.Settings): the paper's rule with the
    settings' knobs (rules.PerIteration: eps_bar per iteration, OutP's Gaussian calibration and
    dp_delta, the basic cap budget_eps), T releases per agent: what the bare algorithm ran
    before it took a contract."""
    from mpi_dp.privacy import rules
    from mpi_dp.privacy.contract import Contract

    rule = rules.PerIteration(gaussian_calibration=s.outp_calibration, dp_delta=s.dp_delta,
                              budget_eps=s.budget_eps)
    return Contract.planned(rule, "gaussian" if s.method == "outp" else "laplace", s.T,
                            [eps_bar] * s.P, seed=s.seed, run_ids=s.run_ids)


def admm_outp_sigma(rho: float, inv_eta: float, eps_bar: float, dp_delta: float = 1e-6,
                    calibration: str = "auto") -> float:
    """OutP's sigma under the paper's rule (rules.PerIteration at (eps_bar, dp_delta), Gaussian
    `calibration`) for its release's L2 sensitivity 2 / (rho + 1/eta)."""
    from mpi_dp.algorithms import admm_steps
    from mpi_dp.privacy import rules
    from mpi_dp.privacy.calibration import Plan

    noise = rules.PerIteration(gaussian_calibration=calibration, dp_delta=dp_delta).calibrate(
        Plan("gaussian", 1, eps_bar, 1e-5))
    return noise.scale(admm_steps.outp_l2_sensitivity(rho, inv_eta))


def p2p_contract(s, n: int, rule=None):
    """The contract of a p2p Settings' n peers (what a bare run of the algorithm used: the
    paper's Theorem 1 at s.delta with s.allocation; `rule`: another rule, e.g. rules.TIGHT)."""
    import math

    from mpi_dp.privacy import rules
    from mpi_dp.privacy.contract import Contract

    rule = rule or rules.Theorem1(delta_bar=s.delta, allocation=s.allocation)
    counts = [int(s.T_agent[i]) if s.T_agent is not None and math.isfinite(s.eps) else 0
              for i in range(n)]
    return Contract.planned(rule, "laplace", counts, [s.eps] * n, 1e-5, seed=s.seed,
                            run_ids=s.runs)


def local_dp(X, y, eps, B, seed, agent, run=0, eps_split=0.5):
    """(X', y', events) of the local-DP baseline for one agent and run (its stream and events)."""
    from mpi_dp.p2p import baselines
    from mpi_dp.rng import stream

    Xp, yp = baselines.local_dp_data(X, y, eps, B, stream(seed, "local_dp", agent, run),
                                     eps_split)
    return Xp, yp, baselines.local_dp_events(eps, B, X.shape[1], eps_split)
