"""`mpi-dp audit`: measure a method's privacy on the code `mpi-dp run` executes (collective).

Two neighbouring shard files D and D' (mpi_dp.data.canary) are run through the job's own
run path (runner.run_job, R runs vectorised) with the release tap (privacy.tap) open on the
canary owner, so the adversary's view is exactly what leaves that owner. Rank 0 reduces each
run's view to statistics (privacy.audit_stats), picks the test on one half of the runs,
evaluates eps_lower on the other, compares it with the eps the owner's ledger claims and writes
an HDF5 audit result. The two worlds' scratch files are removed; the audit result is never
written over an existing file.
"""

from __future__ import annotations

import math
import os
import pathlib
import shutil
import tempfile
import time
from collections.abc import Sequence
from typing import Any

import h5py
import numpy as np
from mpi4py import MPI

from . import progress as prog
from . import strict_json
from .comm.agree import collective
from .data.canary import Canary, make_worlds
from .errors import JobError
from .job import load_job
from .privacy import audit_stats as S
from .privacy.tap import Tap, tapping
from .runner import run_job

FORMAT = "mpi_dp.audit"
ALPHA = 0.05
#: releases kept per run for `--release all` (a composition audit is for small T)
KEEP_ALL = 10_000


def _prepare(job_path: str, overrides: Sequence[str], out: str | None, runs: int,
             owner: int, record: int | None, shape: str) -> dict[str, Any]:
    """Rank 0: check the job and the output path, write the two worlds (nothing else yet)."""
    if runs < 20:
        raise JobError(f"--runs must be >= 20 (two halves of runs per world), got {runs}")
    job = load_job(job_path, list(overrides))
    if len(job.configs()) != 1:
        raise JobError(f"job file {job.path}: an audit needs exactly one configuration, this job "
                       f"has {len(job.configs())} (pick one with --set, e.g. --set 'sweep.eps=[1]' "
                       "or write an audit job without [sweep])")
    cfg = job.configs()[0]
    if any(k.endswith("shard") for k, _ in cfg.params):
        raise JobError("an audit replaces the job's data file; sweep.shard is not supported")
    eps = cfg.eps
    if isinstance(eps, list | tuple):
        eps = eps[owner] if owner < len(eps) else eps[-1]
    out_path = pathlib.Path(out) if out else pathlib.Path("results") / f"{job.name}_audit.h5"
    if out_path.exists():
        raise JobError(f"{out_path} exists: an audit never overwrites a result (choose --out)")
    out_path.parent.mkdir(parents=True, exist_ok=True)
    scratch = pathlib.Path(tempfile.mkdtemp(prefix=f".{out_path.stem}.", dir=out_path.parent))
    try:
        w0, w1, canary = make_worlds(job.generic.data, scratch, owner, record, shape)
    except BaseException:
        shutil.rmtree(scratch, ignore_errors=True)
        raise
    return {"job": job.record_text, "name": job.name, "algorithm": job.algorithm,
            "out": str(out_path), "scratch": str(scratch), "worlds": [str(w0), str(w1)], "canary": canary,
            "eps_config": float(eps)}


def _claimed(result_path: str, owner: int, events: list[Any], release: str
             ) -> tuple[float, float, str, str]:
    """(eps, delta, source, calibration rule) the owner claims for what was audited: for all
    releases or the final model (post-processing of them), the ledger's total of what its
    contract composes (PLD) at the owner's delta; for one release, that release's event."""
    with h5py.File(result_path, "r") as f:
        g = f["configs/000"] if "configs" in f else f
        led = g["privacy/ledger"][()]
    row = led[led["agent"] == owner]
    if not len(row):
        raise JobError(f"owner {owner} has no privacy ledger in the run")
    rule = row["calibration"][0].decode() if "calibration" in (led.dtype.names or ()) else "none"
    if release in ("all", "final"):  # the final model is post-processing of all releases
        eps = float(row["eps_pld"][0]) if math.isfinite(row["eps_pld"][0]) else float(
            row["eps_basic"][0])
        return (eps, float(row["delta"][0]),
                f"ledger total (PLD, scope {row['scope'][0].decode()}) over the audited "
                "releases", rule)
    ev = events[0]
    return float(ev.eps), float(ev.delta), f"per-release event: {ev!r}", rule


def _statistics(x0: np.ndarray, x1: np.ndarray, noise: str, delta: float, alpha: float
                ) -> dict[str, dict[str, Any]]:
    """The statistics (S.STATISTICS), each fitted and thresholded on the first half of the
    runs, evaluated on the second half at alpha / (number of statistics). "scale" is the
    distance from the pooled centre in noise units: it sees a noise scale set from the data."""
    h0, h1 = len(x0) // 2, len(x1) // 2
    f0, f1, e0, e1 = x0[:h0], x1[:h1], x0[h0:], x1[h1:]
    a = alpha / len(S.STATISTICS)
    out: dict[str, dict[str, Any]] = {}
    mu0, mu1 = S.location(f0, noise), S.location(f1, noise)
    if noise == "laplace":
        b = 0.5 * (np.abs(f0 - mu0).mean(axis=0) + np.abs(f1 - mu1).mean(axis=0))
    else:
        b = 0.5 * (f0.std(axis=0) + f1.std(axis=0))
    tiny = 1e-12 * max(1.0, float(np.abs(np.concatenate([f0, f1])).max(initial=0.0)))
    b = np.maximum(b, tiny)

    def stat_llr(x: np.ndarray) -> np.ndarray:
        return S.llr(x / b, mu0 / b, mu1 / b, noise, 1.0)

    w = S.lda_direction(f0, f1)
    centre = S.location(np.concatenate([f0, f1]), noise)

    def stat_scale(x: np.ndarray) -> np.ndarray:  # how far from the centre, in noise units
        return np.abs((x - centre) / b).sum(axis=1)

    for name, fn in (("llr", stat_llr), ("lda", lambda x: x @ w), ("scale", stat_scale)):
        t, d = S.choose_threshold(fn(f0), fn(f1), delta, a)
        s0, s1 = fn(e0), fn(e1)
        v = S.evaluate(s0, s1, t, d, delta, a)
        out[name] = {"verdict": v, "s0": s0, "s1": s1, "roc": S.roc(s0, s1)}
    return out


def _final_models(result: pathlib.Path, runs: int) -> list[np.ndarray]:
    """[(runs, d')]: the final model of every run, from a run's result file."""
    with h5py.File(result, "r") as f:
        g = f["configs/000"] if "configs" in f else f
        if "models/final" not in g:
            raise JobError(f"this method writes no final model ({result.name} has no "
                           "models/final); audit its releases instead (--release k or all)")
        m = g["models/final"][()]
    return [m.reshape(runs, -1)]


def _views(values: list[np.ndarray], release: str, k: int) -> np.ndarray:
    """(runs, d') adversary's view per run: release k, all releases side by side, or the final
    model (values holds it alone)."""
    if release == "all":
        return np.concatenate(values, axis=1)
    if release == "final":
        return values[0]
    if len(values) < k:
        raise JobError(f"the canary owner made only {len(values)} release(s); --release {k} "
                       "needs more (raise T)")
    return values[k - 1]


def run_audit(job_path: str, overrides: Sequence[str] = (), out: str | None = None,
              canary: str = "worst", owner: int = 0, runs: int = 20_000, release: str = "1",
              comm: MPI.Comm | None = None, progress: bool = True, shape: str = "axis"
              ) -> pathlib.Path:
    """Collective: run both worlds, audit, write the audit result; returns its path."""
    comm = comm or MPI.COMM_WORLD
    rank = comm.Get_rank()

    def check() -> None:  # the same on every rank; raised together as one agreed error
        if canary != "worst" and not canary.isdigit():
            raise JobError(f"--canary must be worst or a record index, got {canary!r}")
        if release not in ("all", "final") and not (release.isdigit() and int(release) >= 1):
            raise JobError(f"--release must be a positive release number, 'all' or 'final', "
                           f"got {release!r}")

    collective(comm, check)
    record = None if canary == "worst" else int(canary)
    k = int(release) if release.isdigit() else 0
    plan = collective(comm, lambda: _prepare(job_path, overrides, out, runs, owner, record, shape)
                      if rank == 0 else None)
    plan = comm.bcast(plan, root=0)
    t0 = time.perf_counter()
    views, events = [], []
    try:
        for w, world in enumerate(plan["worlds"]):
            if rank == 0 and progress:
                prog.info(f"audit: world {w} ({'D' if w == 0 else 'D prime'}): {runs} runs of "
                          f"'{plan['name']}'")
            tap = Tap(owner, runs, KEEP_ALL if release == "all" else max(k, 1))
            result = pathlib.Path(plan["scratch"]) / f"run{w}.h5"
            with tapping(tap):
                run_job(job_path, list(overrides) + [f'data="{world}"', f"runs={runs}",
                                                     "first_run=0"],
                        str(result), comm=comm, progress=False)
            parts = comm.gather((tap.values, tap.events), root=0)
            if rank == 0:
                assert parts is not None  # gather's result on the root
                vals, evs = max(parts, key=lambda p: len(p[0]))
                views.append(_final_models(result, runs) if release == "final" else vals)
                events.append(evs)
        path = collective(comm, lambda: _finish(plan, views, events, release, k, runs, t0)
                          if rank == 0 else None)
        return pathlib.Path(comm.bcast(str(path) if path else None, root=0))
    finally:
        if rank == 0:
            shutil.rmtree(plan["scratch"], ignore_errors=True)


def _finish(plan: dict[str, Any], views: list[list[np.ndarray]], events: list[list[Any]],
            release: str, k: int, runs: int, t0: float) -> pathlib.Path:
    """Rank 0: statistics, verdict and the audit result file (written atomically)."""
    c: Canary = plan["canary"]
    if not views[0] or not views[1]:
        raise JobError(f"owner {c.owner} released nothing the tap saw (is it a participant?)")
    x0, x1 = _views(views[0], release, k), _views(views[1], release, k)
    x0, x1 = x0[~np.isnan(x0).any(axis=1)], x1[~np.isnan(x1).any(axis=1)]
    evs = [events[0][k - 1]] if k else events[0]
    if not evs:
        raise JobError(f"owner {c.owner} made no release the tap saw (is it a participant?)")
    if any(e is None for e in evs):
        raise JobError("the audited release was not private in this configuration "
                       "(no mechanism event: eps = inf?)")
    eps_ledger, delta, source, rule = _claimed(str(pathlib.Path(plan["scratch"]) / "run0.h5"),
                                               c.owner, evs, release)
    # the owner's budget in the job bounds its total, hence every release too: a calibration
    # that records its real (larger) eps honestly in the ledger still breaks the eps the job
    # asked for. (One release of a calibrated plan claims its own event: its eps at delta 0 may
    # exceed the job's total eps, which holds at the owner's delta > 0.)
    eps_job = plan["eps_config"]
    calibrated = rule in ("pld", "basic") and release not in ("all", "final")
    eps_claim = eps_ledger if calibrated else min(eps_ledger, eps_job)
    if eps_claim < eps_ledger:
        source = f"the job's eps = {eps_job:g} (the ledger records {eps_ledger:.4g}: {source})"
    noise = "gaussian" if evs[0].mechanism == "gaussian" else "laplace"
    res = _statistics(x0, x1, noise, delta, ALPHA)
    best = max(res, key=lambda n: res[n]["verdict"].eps_lower)
    eps_lower = res[best]["verdict"].eps_lower
    verdict = "VIOLATION" if eps_lower > eps_claim else "consistent"
    out = pathlib.Path(plan["out"])
    tmp = out.with_name(f".{out.name}.tmp")
    with h5py.File(tmp, "w") as f:
        f.attrs.update({"format": FORMAT, "format_version": 1, "algorithm": plan["algorithm"],
                        "name": plan["name"], "job": plan["job"], "runs": runs,
                        "release": release, "runs_used": np.array([len(x0), len(x1)]),
                        "claimed_eps": eps_claim, "claimed_delta": delta,
                        "ledger_eps": eps_ledger, "job_eps": eps_job,
                        "claimed_source": source, "eps_lower": eps_lower, "statistic": best,
                        "confidence": 1 - ALPHA, "verdict": verdict, "noise": noise,
                        "canary": strict_json.dumps(c.__dict__),
                        "mechanism": evs[0].mechanism,
                        "certified": bool(getattr(evs[0], "certified", True)),
                        "wall_seconds": round(time.perf_counter() - t0, 3)})
        for name, r in res.items():
            g = f.create_group(f"statistics/{name}")
            v = r["verdict"]
            g.attrs.update({k_: getattr(v, k_) for k_ in (
                "eps_lower", "threshold", "direction", "fpr", "fnr", "fpr_upper", "fnr_upper",
                "eps_point", "alpha")})
            g.create_dataset("s0", data=r["s0"])
            g.create_dataset("s1", data=r["s1"])
            g.create_dataset("roc_threshold", data=r["roc"].thresholds)
            g.create_dataset("roc_fp", data=r["roc"].fp)
            g.create_dataset("roc_tp", data=r["roc"].tp)
    if out.exists():  # appeared while we ran: keep both, never replace
        raise JobError(f"{out} appeared during the audit; the audit is in {tmp}")
    os.replace(tmp, out)
    return out
