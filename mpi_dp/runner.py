"""Orchestration of `mpi-dp run`: job -> checks on every rank -> configurations -> result file.

Errors found before computing (job, shard file, agents, public data) are agreed on by all ranks, so
every rank stops with the same message and nobody waits in a collective. Errors during the
computation are handled by the CLI, which aborts the whole MPI job.
"""

from __future__ import annotations

import math
import socket
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
from mpi4py import MPI

from .algorithms import sync_star
from .algorithms.async_star import default_rho as async_default_rho
from .algorithms.common import LocalShard, cached_reference
from .comm.star import Star
from .data import ShardFile
from .errors import JobError, MpiDpError
from .job import Job, load_job, resolve_per_owner
from .models import linear, reference
from .privacy import lap_scale
from .results import provenance
from .results.recorder import ResultFile
from .run_admm import run_admm_configs
from .run_async import run_async_configs

T_ = TypeVar("T_")


class AgreedError(MpiDpError):
    """A user error that every rank raises together (no rank is left waiting)."""


def collective(comm: MPI.Comm, fn: Callable[[], T_]) -> T_:
    """Run fn on every rank; if it raises a user error on any rank, raise it on all ranks."""
    result, err = None, None
    try:
        result = fn()
    except MpiDpError as e:
        err = str(e)
    except (OSError, ValueError, KeyError) as e:
        err = f"{type(e).__name__}: {e}"
    errors = comm.allgather(err)
    first = next((e for e in errors if e), None)
    if first:
        raise AgreedError(first)
    return result  # type: ignore[return-value]


#: Hinge records whose public-optimum margin y x.theta is within this of 1 count as on the kink.
HINGE_KINK_TOL = 1e-8


def public_grad_norms(loss: str, Xp, yp: np.ndarray, theta: np.ndarray) -> np.ndarray:
    """Per-record gradient L1 norms at the public optimum (the xi = 'auto' rule), X dense or CSR.

    For the hinge loss the free support vectors sit exactly on the kink y x.theta* = 1, where the
    subgradient is only defined up to rounding (0 or -y x): they get the largest subgradient norm
    ||x||_1, so xi does not depend on the last bit of X @ theta (dense and CSR agree).
    """
    norms = linear.grad_l1_norms(loss, Xp, yp, theta)[:, 0]
    if loss == "hinge":
        margin = yp * np.asarray(Xp @ theta, dtype=np.float64).ravel()
        kink = np.abs(margin - 1.0) <= HINGE_KINK_TOL
        norms[kink] = np.asarray(abs(Xp).sum(axis=1), dtype=np.float64).ravel()[kink]
    return norms


def public_constants(job: Job, shard: ShardFile, p: int) -> tuple[float, float, float]:
    """(xi, L, clip fraction at xi on public records) from the job or the public records."""
    xi, L = job["xi"], job["step.L"]
    need_public = xi == "auto" or (L == "public" and job["step.rho"] == "auto")
    if not need_public:
        return float(xi), (float(L) if not isinstance(L, str) else math.nan), math.nan
    if not shard.has_public:
        raise JobError(f"job file {job.path}: xi = 'auto' and step.L = 'public' need public records "
                       f"(/public/X, /public/y) in the shard file {shard.path}, which has none; "
                       "set xi and step.L (or step.rho) to numbers")
    Xp, yp = shard.read_public()
    loss, lam, tmax = job["loss"], job["lam"], job["theta_max"]
    if L == "public":
        L = linear.curvature_constant(loss, Xp, lam)
    frac = math.nan
    if xi == "auto":
        theta_pub = reference.theta_star_local(loss, Xp, yp, lam, tmax)
        norms = public_grad_norms(loss, Xp, yp, theta_pub)
        xi = float(np.quantile(norms, job["xi_quantile"]))
        if not xi > 0:
            raise JobError(f"job file {job.path}: xi = 'auto' gave {xi}: the public gradients are "
                           "all zero; set xi to a number")
        frac = float(np.mean(norms > xi))
    return float(xi), float(L), frac


def participants(job: Job, owners: Any, n_agents: int) -> int:
    """The number of participating owners N_c ('all' or a number <= the shard file's owners)."""
    if owners == "all":
        return n_agents
    key = "sweep.owners" if job["sweep.owners"] else "owners"
    if owners > n_agents:
        raise JobError(f"job file {job.path}: key '{key}': {owners} owners asked for but the shard "
                       f"file {job['data']} has {n_agents}")
    if job["algorithm"] != "async_star":
        raise JobError(f"job file {job.path}: key '{key}': only async_star runs on a subset of "
                       "the owners; sync_star uses all of them")
    return int(owners)


def _resolve_configs(job: Job, shard: ShardFile) -> list[tuple[Any, list[float], list[int]]]:
    sizes = shard.sizes()
    out = []
    for cfg in job.configs():
        N = participants(job, cfg.owners, shard.n_agents)
        key_e = "sweep.eps" if job["sweep.eps"] else "eps"
        key_n = "sweep.n" if job["sweep.n"] else "n"
        eps = [float(e) for e in resolve_per_owner(job, key_e, cfg.eps, N, shard.n_agents)]
        n = resolve_per_owner(job, key_n, cfg.n, N, shard.n_agents)
        n = [int(sizes[i]) if v == "all" else int(v) for i, v in enumerate(n)]
        for i, v in enumerate(n):
            if v > sizes[i] and job["n_beyond_shard"] == "cap":
                n[i] = int(sizes[i])
            elif v > sizes[i]:
                raise JobError(f"job file {job.path}: key '{key_n}': owner {i} should use {v} "
                               f"records but holds only {sizes[i]} in {shard.path} (set "
                               "n_beyond_shard = 'cap' to use all it holds)")
        out.append((cfg, eps, n))
    return out


def run_job(path: str | Path, overrides: Sequence[str] = (), out: str | None = None,
            comm: MPI.Comm | None = None, progress: bool = True) -> Path:
    """Run a job file under MPI (collective over `comm`); returns the result path."""
    comm = comm or MPI.COMM_WORLD
    rank = comm.Get_rank()
    overrides = list(overrides) + ([f'output="{out}"'] if out else [])
    job = collective(comm, lambda: load_job(path, overrides))
    shard = collective(comm, lambda: ShardFile(job["data"]))
    configs = collective(comm, lambda: _resolve_configs(job, shard))
    N, p = shard.n_agents, shard.n_features
    star = Star(comm, N)
    collective(comm, lambda: shard.check_agents(list(star.local_agents)))
    if job["algorithm"] == "admm":  # no public constants (its steps follow the spec's schedules)
        consts = (math.nan, math.nan, math.nan)
    else:
        consts = collective(comm, lambda: public_constants(job, shard, p) if rank == 0 else None)
    xi, L, pub_clip = comm.bcast(consts, root=0)
    R = job["runs"]
    run_ids = tuple(range(job["first_run"], job["first_run"] + R))
    if job["algorithm"] == "admm":
        rho = math.nan  # rho^t of admm.rho, per iteration
    elif job["step.rho"] != "auto":
        rho = float(job["step.rho"])
    elif job["algorithm"] == "async_star":
        rho = async_default_rho(job["async.gamma"], job["T"], float(job["lam"]), L)
    else:
        rho = sync_star.default_rho(job["variant"], job["step.alpha"], L, job["T"])

    result = None
    if rank == 0:
        hosts = comm.gather(socket.gethostname(), root=0)
        sweep = {k: job[f"sweep.{k}"] for k in ("eps", "n", "owners", "method")
                 if job[f"sweep.{k}"]}
        result = collective_open(job, len(configs), sweep, comm, hosts)
    else:
        comm.gather(socket.gethostname(), root=0)
        collective_open(None, 0, {}, comm, None)
    if rank == 0 and progress and job["algorithm"] == "admm":
        print(f"mpi-dp: job '{job.name}' (admm): {len(configs)} configuration(s) x {R} runs x "
              f"T={job['T']} on {comm.Get_size()} rank(s), {N} agents, J={p}\n  writing "
              f"{job.output}", file=sys.stderr, flush=True)
    elif rank == 0 and progress:
        print(f"mpi-dp: job '{job.name}' ({job['algorithm']}/{job['variant']}): {len(configs)} "
              f"configuration(s) x {R} runs x T={job['T']} on {comm.Get_size()} rank(s), {N} "
              f"owners, p={p}{' (CSR)' if shard.is_sparse else ''}; xi={xi:.4g}, L={L:.4g}, "
              f"rho={rho:.4g}\n  writing {job.output}",
              file=sys.stderr, flush=True)
    t_start = time.perf_counter()
    status = "failed"
    try:
        if job["algorithm"] == "async_star":
            run_async_configs(job, shard, configs, star, xi, L, pub_clip, rho, run_ids, result,
                              progress)
            status = "complete"
            return job.output
        if job["algorithm"] == "admm":
            run_admm_configs(job, shard, configs, star, run_ids, result, progress)
            status = "complete"
            return job.output
        refs: dict[tuple[int, ...], Any] = {}
        for cfg, eps, n in configs:
            s = sync_star.Settings(
                variant=job["variant"], T=job["T"], loss=job["loss"], lam=float(job["lam"]),
                theta_max=float(job["theta_max"]), theta0=float(job["theta0"]), xi=xi,
                clip=job["clip"], rho=rho, L=L, avg_kind=job["average.kind"],
                eta=float(job["average.eta"]), seed=job["seed"], run_ids=run_ids,
                record_every=job["record_every"], aggregate=job["comm.aggregate"],
                eps=tuple(eps), n=tuple(n), p=p, schedule=job["step.schedule"])
            collective(comm, lambda s=s: sync_star.check_settings(s, job.path))
            shards = [LocalShard(i, *shard.read_agent(i, n[i])) for i in star.local_agents]
            ref = cached_reference(refs, star, shards, s.loss, s.lam, n, p, s.theta_max,
                                   job["reference.solver"])
            rec = None
            if result is not None:
                rec = result.config(
                    cfg.index, R, expected_records=s.T // s.record_every + 2,
                    label=cfg.label(eps, n), eps=np.array(eps), n=np.array(n, dtype="i8"),
                    T=s.T, loss=s.loss, lam=s.lam, theta_max=s.theta_max, xi=xi, L=L, rho=rho,
                    variant=s.variant, schedule=s.schedule, average=s.avg_kind, eta=s.eta, seed=s.seed,
                    run_ids=np.array(run_ids, dtype="i8"), clip=s.clip,
                    public_clip_fraction=pub_clip,
                    step_rule=("mu_k = rho/(k T^2)" if s.variant == "alg1"
                               else "mu_k = rho/(T sqrt(k))"),
                    evaluation_only="metrics psi, psi_iterate, objective, clip_fraction and "
                    "group reference are evaluation-only (oracle=True): computed from un-noised "
                    "owner data, never part of the private protocol")
            label = f"{cfg.index + 1}/{len(configs)} {cfg.label(eps, n)}"
            final = sync_star.run_config(star, shards, s, ref, rec, label=label, progress=progress)
            if rec is not None:
                rec.write("models/final", final["models/final"])
                rec.write("models/final_iterate", final["models/final_iterate"])
                rec.write("reference/theta_star", ref.theta_star, evaluation_only=True,
                          solver=ref.solver)
                rec.write("reference/f_star", ref.f_star, evaluation_only=True)
                rec.write("reference/theta_isolated", ref.theta_isolated, evaluation_only=True)
                rec.write("reference/psi_isolated", ref.psi_isolated, evaluation_only=True)
                rec.write("privacy/ledger", final["ledger"], composition="basic (sequential)")
                rec.write("privacy/lap_scale", np.array(
                    [lap_scale(xi, s.T, n[i], eps[i]) for i in range(N)]),
                    formula="b_i = 2 xi T / (n_i eps_i), i.i.d. per coordinate")
                result.file.flush()
        status = "complete"
    except KeyboardInterrupt:
        status = "interrupted"
        raise
    finally:
        if result is not None:
            result.close(status, wall_seconds=round(time.perf_counter() - t_start, 3),
                         end_time=time.strftime("%Y-%m-%dT%H:%M:%S%z"))
        if rank == 0 and progress and status == "complete":
            print(f"mpi-dp: done in {time.perf_counter() - t_start:.1f} s -> {job.output}",
                  file=sys.stderr, flush=True)
    return job.output


def collective_open(job: Job | None, n_configs: int, sweep: dict, comm: MPI.Comm,
                    hosts: list[str] | None) -> ResultFile | None:
    """Rank 0 creates the result file; a failure (e.g. unwritable path) stops every rank."""
    def make() -> ResultFile | None:
        if job is None:
            return None
        try:
            return ResultFile(
                job.output, job_text=job.record_text, job_json=job.to_json(),
                algorithm=job["algorithm"], variant=job["variant"], n_configs=n_configs,
                sweep=sweep, provenance=provenance.collect(comm.Get_size(), hosts or [],
                                                           job["seed"]))
        except OSError as e:
            raise JobError(f"job file {job.path}: key 'output': cannot create {job.output}: "
                           f"{e.strerror or e}") from None
    return collective(comm, make)
