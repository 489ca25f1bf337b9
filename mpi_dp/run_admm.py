"""Orchestration of an admm job: per configuration (method x eps), agents -> run -> results.

Called by runner.run_job after the shared checks (job, shard file, result file). The server
(rank 0) evaluates the test error of the global model on the shard file's global test set, or on
the union of the agents' own test sets (FEMNIST); test data are not private.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from mpi4py import MPI

from .algorithms import admm
from .comm.star import Star
from .data import ShardFile
from .errors import JobError
from .job import Job


def _collective(comm, fn):
    from .runner import collective  # the runner's agreed-error helper (no import cycle at load)

    return collective(comm, fn)


def n_classes(star: Star, local: dict, test: tuple | None) -> int:
    """K = 1 + the largest label over every agent and the test set (collective)."""
    top = max([int(y.max()) for _, y in local.values() if y.size] + [0])
    if test is not None:
        top = max(top, int(test[1].max()))
    return int(star.comm.allreduce(top, op=MPI.MAX)) + 1


def test_set(shard: ShardFile) -> tuple[np.ndarray, np.ndarray] | None:
    """The global test set, else the union of the agents' test sets, else None."""
    if shard.has_global_test:
        X, y = shard.read_test()
        return np.asarray(X, dtype=np.float64), np.asarray(y).astype(np.int64)
    parts = [shard.read_agent_test(i) for i in range(shard.n_agents) if shard.has_test(i)]
    if not parts:
        return None
    return (np.concatenate([np.asarray(X, dtype=np.float64) for X, _ in parts]),
            np.concatenate([np.asarray(y) for _, y in parts]).astype(np.int64))


def settings_for(job: Job, method: str, eps: list[float], n: list[int], J: int, K: int,
                 run_ids: tuple[int, ...]) -> admm.Settings:
    if len(set(eps)) != 1:
        raise JobError(f"job file {job.path}: key 'eps': admm uses one per-iteration budget "
                       f"eps_bar for every agent, got {eps}")
    rho = job["admm.rho"]
    return admm.Settings(
        method=method, T=job["T"], eps_bar=float(eps[0]), n=tuple(n), J=J, K=K,
        gamma=float(job["admm.gamma"]), rho_mode=rho if isinstance(rho, str) else "static",
        rho_static=(float(rho) if not isinstance(rho, str) else 1.0),
        rho_c1=float(job["admm.rho_c1"]), rho_c2=float(job["admm.rho_c2"]),
        rho_tc=int(job["admm.rho_tc"]), prox_scale=float(job["admm.prox_scale"]),
        tr_schedule=job["admm.tr_schedule"], sens_mode=job["admm.sens_mode"],
        outp_noise_std=job["admm.outp_noise_std"], reg_grad=job["admm.reg_grad"],
        w_bound=float(job["admm.w_bound"]), dp_delta=float(job["admm.dp_delta"]),
        seed=job["seed"], run_ids=run_ids, record_every=job["record_every"],
        aggregate=job["comm.aggregate"])


def run_admm_configs(job: Job, shard: ShardFile, configs: list, star: Star,
                     run_ids: tuple[int, ...], result: Any, progress: bool) -> None:
    """Run every configuration of an admm job (collective); rank 0 writes the results."""
    comm = star.comm
    J = shard.n_features
    if shard.is_sparse:
        raise JobError(f"job file {job.path}: admm needs dense features; {shard.path} is CSR")
    # every hosted agent's records, read once; a configuration uses the first n[i] of them
    local = _collective(comm, lambda: {i: shard.read_agent(i) for i in star.local_agents})
    test = _collective(comm, lambda: test_set(shard) if star.is_learner else None)
    K = n_classes(star, local, test)
    R = len(run_ids)
    for cfg, eps, n in configs:
        method = cfg.method or job["admm.method"]
        s = _collective(comm, lambda m=method, e=eps, nn=n: settings_for(job, m, e, nn, J, K,
                                                                         run_ids))
        agents = _collective(comm, lambda s=s, nn=n: [
            admm.Agent(i, X[: nn[i]], y[: nn[i]], s) for i, (X, y) in local.items()])
        rec = None
        if result is not None:
            rec = result.config(
                cfg.index, R, expected_records=s.T // s.record_every + 2, label=cfg.label(eps, n),
                method=s.method, eps_bar=s.eps_bar, eps=np.array(eps), n=np.array(n, dtype="i8"),
                T=s.T, log_every=s.record_every, J=J, K=K, gamma=s.gamma, rho_mode=s.rho_mode,
                rho_static=s.rho_static, rho_c1=s.rho_c1, rho_c2=s.rho_c2, rho_tc=s.rho_tc,
                prox_scale=s.prox_scale, tr_schedule=s.tr_schedule, sens_mode=s.sens_mode,
                outp_noise_std=s.outp_noise_std, reg_grad=s.reg_grad, w_bound=s.w_bound,
                dp_delta=s.dp_delta, seed=s.seed, run_ids=np.array(run_ids, dtype="i8"),
                aggregate=s.aggregate, n_test=(0 if test is None else len(test[1])),
                dp_strict=(s.sens_mode == "global" or s.method == "outp"),
                privacy=("(eps_bar, delta)-DP per iteration (Gaussian)" if s.method == "outp"
                         else "eps_bar-DP per iteration (Laplace objective perturbation)"),
                evaluation_only="metrics train_cost, consensus, noise_mag, lap_scale and "
                "z_change are evaluation-only (computed from un-noised agent data or states); "
                "test_error uses the public test set")
        label = f"{cfg.index + 1}/{len(configs)} {cfg.label(eps, n)}"
        out = admm.run_config(star, agents, s, test, rec, label=label, progress=progress)
        if rec is not None:
            rec.write("models/final", out["models/final"])
            rec.write("privacy/iterations", out["iterations"])
            rec.write("privacy/eps_per_iteration", np.full(s.P, s.eps_bar))
            rec.write("privacy/eps_total_basic", out["eps_total_basic"],
                      composition="basic (sequential) over the iterations run: iterations x eps_bar "
                      "(the paper states a per-iteration guarantee only)")
            rec.write("privacy/delta_total_basic", out["delta_total_basic"])
            rec.set_attrs(eps_total_basic=float(np.max(out["eps_total_basic"])),
                          seconds=round(out["seconds"], 3))
            result.file.flush()
