"""Orchestration of an async_star job: per configuration, shards -> reference -> run -> results.

Called by runner.run_job after the checks every method shares (job, shard file, public
constants, result file). Owners beyond a configuration's N (sweep.owners) hold no records in it,
so reference quantities and psi are computed on the participants only (spec §5).
"""

from __future__ import annotations

import math
from typing import Any

import h5py
import numpy as np
import scipy.sparse as sp

from .algorithms import async_star
from .algorithms.common import LocalShard, cached_reference
from .comm.p2p_star import P2PStar
from .comm.star import Star
from .data import ShardFile
from .errors import JobError
from .job import Job, resolve_per_owner
from .privacy import LEDGER_DTYPE


def _collective(comm, fn):
    from .runner import collective  # the runner's agreed-error helper (no import cycle at load)

    return collective(comm, fn)


def _empty_shard(agent: int, p: int, sparse: bool) -> LocalShard:
    X = sp.csr_matrix((0, p)) if sparse else np.zeros((0, p))
    return LocalShard(agent, X, np.zeros(0))


def _caps(job: Job, N: int, n_file: int) -> list[int]:
    caps = resolve_per_owner(job, "async.per_owner_cap", job["async.per_owner_cap"], N, n_file)
    return [job["T"] if int(c) == 0 else int(c) for c in caps]


def _rates(job: Job, N: int, n_file: int) -> tuple[float, ...]:
    return tuple(float(r) for r in resolve_per_owner(job, "async.rates", job["async.rates"], N,
                                                      n_file))


def load_logged_schedule(job: Job, index: int) -> tuple[np.ndarray, np.ndarray]:
    """(owner (k,), time (k,)) served in run 0 of configuration `index` of async.schedule_from."""
    path = job["async.schedule_from"]
    try:
        with h5py.File(path, "r", locking=False) as f:
            g = f[f"configs/{index:03d}"] if "configs" in f else f
            if "schedule/owner" not in g:
                raise JobError(f"job file {job.path}: key 'async.schedule_from': {path} has no "
                               f"logged schedule for configuration {index} (is it an async_star "
                               "result?)")
            owner = np.asarray(g["schedule/owner"][0], dtype=np.int64)
            t = np.asarray(g["schedule/time"][0], dtype=np.float64)
    except OSError as e:
        raise JobError(f"job file {job.path}: key 'async.schedule_from': cannot read {path}: "
                       f"{e}") from None
    keep = owner >= 0
    return owner[keep], t[keep]


def settings_for(job: Job, eps: list[float], n: list[int], n_file: int, xi: float, rho: float,
                 p: int, run_ids: tuple[int, ...]) -> async_star.Settings:
    N = len(n)
    paper = job["async.preset"] == "paper_code"
    mode = job["async.mode"]
    return async_star.Settings(
        T=job["T"], loss=job["loss"], lam=float(job["lam"]), theta_max=float(job["theta_max"]),
        theta0=float(job["theta0"]), init=job["async.init"],
        xi=(p / 2 if paper else xi), clip=(False if paper else job["clip"]), rho=rho,
        central_step=job["variant"], eps=tuple(eps), n=tuple(n), caps=tuple(_caps(job, N, n_file)),
        p=p, seed=job["seed"], run_ids=run_ids, record_every=job["record_every"], mode=mode,
        scheduler=job["async.scheduler"], rates=_rates(job, N, n_file),
        protocol=(job["async.protocol"] if mode == "live" else "virtual"),
        clock_unit_s=float(job["async.clock_unit_s"]),
        poll_interval_s=float(job["async.poll_interval_s"]),
        noise_shape=job["async.noise_shape"], dp_valid=not paper)


def run_async_configs(job: Job, shard: ShardFile, configs: list, star: Star, xi: float, L: float,
                      pub_clip: float, rho: float, run_ids: tuple[int, ...], result: Any,
                      progress: bool) -> None:
    """Run every configuration of an async_star job (collective); rank 0 writes the results."""
    comm = star.comm
    p, n_file = shard.n_features, shard.n_agents
    link = P2PStar(comm, star.layout, p)
    R = len(run_ids)
    refs: dict[tuple[int, ...], Any] = {}
    for cfg, eps, n in configs:
        s = settings_for(job, eps, n, n_file, xi, rho, p, run_ids)
        N = s.N
        _collective(comm, lambda s=s: async_star.check_settings(s, job.path, comm.Get_size()))
        logged = None
        if job["async.schedule_from"]:
            logged = _collective(comm, lambda c=cfg: load_logged_schedule(job, c.index)
                                 if star.is_learner else None)
        shards = [LocalShard(i, *shard.read_agent(i, n[i])) if i < N
                  else _empty_shard(i, p, shard.is_sparse) for i in star.local_agents]
        ref = cached_reference(refs, star, shards, s.loss, s.lam, n, p, s.theta_max,
                               job["reference.solver"])
        rec = None
        if result is not None:
            rec = result.config(
                cfg.index, R, expected_records=s.T // s.record_every + 2,
                label=cfg.label(eps, n), eps=np.array(eps), n=np.array(n, dtype="i8"),
                owners=N, T=s.T, loss=s.loss, lam=s.lam, theta_max=s.theta_max, xi=s.xi, L=L,
                rho=rho, a_own=s.a_own, a_ctr=s.a_ctr, central_step=s.central_step,
                mode=s.mode, scheduler=(s.scheduler if logged is None else "logged"),
                protocol=s.protocol, preset=job["async.preset"], dp_valid=s.dp_valid,
                noise_shape=s.noise_shape, clip=s.clip, init=s.init, theta0=s.theta0,
                lap_scale=s.lap_scales(), caps=np.array(s.caps, dtype="i8"),
                rates=np.array(s.rates), seed=s.seed, run_ids=np.array(run_ids, dtype="i8"),
                public_clip_fraction=pub_clip, oracle=True,
                schedule_from=job["async.schedule_from"],
                step_rule="a_own = N rho/(T^2 lam); a_ctr = " + (
                    "rho/(2 T^2 lam) [proof]" if s.central_step == "proof"
                    else "(N-1) rho/(N T^2 lam) [printed]"),
                evaluation_only="metrics psi, objective, dist_sq, privacy/clip_fraction and "
                "reference/* are evaluation-only (oracle=True): computed from un-noised owner "
                "data, never part of the private protocol")
        label = f"{cfg.index + 1}/{len(configs)} {cfg.label(eps, n)}"
        out = async_star.run_config(star, link, shards, s, ref, rec, label=label,
                                    progress=progress, logged=logged)
        if rec is not None:
            _write(rec, out, ref, s)
            result.file.flush()


def _write(rec, out: dict, ref, s: async_star.Settings) -> None:
    N = s.N
    tr: async_star.Trace = out["trace"]
    rec.write("models/final", out["models/final"])
    rec.write("models/local", out["models/local"])
    rec.write("schedule/owner", tr.owner, what="i_k (0-based owner) of iteration k = 1..T; -1 "
              "after a run ended")
    rec.write("schedule/time", tr.time, what="t_k: virtual time (replay) or wall seconds since "
              "the start (live)")
    rec.write("schedule/response_norm", tr.resp_norm, what="||r_k||_2 of the DP answer")
    rec.write("schedule/ended_at", tr.ended_at, reason=tr.end_reason or "reached T")
    rec.write("schedule/declines", tr.decline_array(),
              reasons={str(k): v for k, v in async_star.REASONS.items()})
    if s.mode == "live":
        rec.write("schedule/rtt_s", tr.rtt, what="learner's query-to-answer seconds")
        rec.write("schedule/dropped_ticks", out["dropped_ticks"],
                  what="clock ticks dropped per host while a request was outstanding")
    f_star = out["f_star"] if out["f_star"] is not None else ref.f_star
    rec.write("reference/theta_star", ref.theta_star, evaluation_only=True, solver=ref.solver)
    rec.write("reference/f_star", f_star, evaluation_only=True)
    rec.write("reference/theta_isolated", ref.theta_isolated[:N], evaluation_only=True)
    rec.write("reference/psi_isolated", out["psi_isolated"], evaluation_only=True)
    rec.write("privacy/answered", out["answered"])
    rec.write("privacy/spent_eps", out["spent_eps"], composition="basic (sequential): answers x "
              "eps_i / m_i")
    rec.write("privacy/clip_fraction", out["clip_fraction"], evaluation_only=True,
              what="mean share of an owner's records clipped per answer")
    rows = np.zeros(N, dtype=LEDGER_DTYPE)
    for i in range(N):
        k = int(out["answered"][:, i].max())
        rows[i] = (i, s.eps[i], float(out["spent_eps"][:, i].max()), 0.0, 0.0, k)
    rec.write("privacy/ledger", rows, composition="basic (sequential); the largest spend over runs")
    rec.write("privacy/lap_scale", s.lap_scales(),
              formula="b_i = 2 xi m_i / (n_i eps_i), m_i = answers allowed (T by default)"
              + ("" if s.noise_shape == "iid" else "; scalar noise: NOT DP"))
    if not math.isfinite(f_star):
        raise JobError("the reference objective is not finite")
