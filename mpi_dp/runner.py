"""Orchestration of `mpi-dp run`: job -> checks on every rank -> configurations -> result file.

Method-agnostic: everything a method does is behind its entry in the registry (mpi_dp.methods).
Errors found before computing (job, shard file, agents, public data) are agreed on by all ranks,
so every rank stops with the same message and nobody waits in a collective. Errors during the
computation are handled by the CLI, which aborts the whole MPI job.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast

import numpy as np
from mpi4py import MPI

from . import progress as prog
from . import strict_json
from .comm import stop
from .comm.agree import AgreedError, collective
from .comm.star import Star
from .data import ShardFile
from .errors import DiskFullError, JobError
from .job import load_job
from .jobspec import Job, resolve_per_owner, sweep_key
from .methods import REGISTRY, Context, Method, Outcome, Resolved
from .methods.base import Configured, RunHooks, ledger_delta, rule_for, shard_sizes
from .privacy import accountants, calibration_cost, calibration_run, noise_signal
from .privacy.calibration import Plan
from .privacy.contract import Contract
from .privacy.rules import Rule
from .results import footprint, provenance
from .results.output import (
    OutputLock,
    SpaceReserve,
    check_output,
    check_resume,
    no_space,
    partial_path,
    quiet_full_disk_deallocs,
)
from .results.parts import BlockSpec, task_path
from .results.recorder import ConfigRecorder, ResultFile, checkpoint_every_s

__all__ = ["AgreedError", "collective", "resolve_configs", "run_job"]


def participants(job: Job, owners: Any, n_agents: int) -> int:
    """The number of participating owners N_c ('all' or a number <= the shard file's owners)."""
    if owners == "all":
        return n_agents
    key = sweep_key("owners") if job.axis("owners") else "owners"
    if owners > n_agents:
        raise JobError(f"job file {job.path}: key '{key}': {owners} owners asked for but the shard "
                       f"file {job.generic.data} has {n_agents}")
    return int(owners)


def resolve_configs(job: Job, shard: ShardFile, sizes: np.ndarray | None = None
                    ) -> list[Resolved]:
    """The job's configurations with per-owner eps and n resolved against the shard file
    (`sizes`: every agent's record count, read from it unless given)."""
    sizes = shard.sizes() if sizes is None else sizes
    out = []
    for cfg in job.configs():
        N = participants(job, cfg.owners, shard.n_agents)
        key_e = sweep_key("eps") if job.axis("eps") else "eps"
        key_n = sweep_key("n") if job.axis("n") else "n"
        eps = [float(e) for e in resolve_per_owner(job, key_e, cfg.eps, N, shard.n_agents)]
        asked = resolve_per_owner(job, key_n, cfg.n, N, shard.n_agents)
        asked = [int(sizes[i]) if v == "all" else int(v) for i, v in enumerate(asked)]
        n = list(asked)
        for i, v in enumerate(asked):
            if v > sizes[i] and job.generic.n_beyond_shard == "cap":
                n[i] = int(sizes[i])
            elif v > sizes[i]:
                raise JobError(f"job file {job.path}: key '{key_n}': owner {i} should use {v} "
                               f"records but holds only {sizes[i]} in {shard.path} (set "
                               "n_beyond_shard = 'cap' to use all it holds)")
        out.append(Resolved(cfg, eps, n, asked if n != asked else None))
    return out


def run_job(path: str | Path, overrides: Sequence[str] = (), out: str | None = None,
            comm: MPI.Comm | None = None, progress: bool = True, overwrite: bool = False,
            resume: bool | str = False, configs: BlockSpec | None = None,
            task_file: bool = False, force: bool = False) -> Path:
    """Run a job file under MPI (collective over `comm`); returns the result path.

    The result is written to PATH.partial under an exclusive lock and renamed to PATH when the
    job completes; an existing PATH is replaced only with `overwrite` (and only then). With
    `resume` the job continues PATH.partial left by a stopped run of the same job: complete
    configurations are kept, the rest run again (bitwise what an uninterrupted run writes);
    resume="auto" resumes when PATH.partial exists and starts afresh otherwise.

    `configs` (--configs A:B, --config-block I/N) runs only that block of the configurations,
    each written at its own index, into a part file recording the block (`mpi-dp merge`
    combines the parts); `task_file` names it PATH.taskI.h5 (block I of --config-block).

    Before the output is touched, the job's result size, memory and time are estimated
    (results.footprint): past the node's memory it stops; past the free disk space or a month
    it stops unless `force`. A full disk during the run leaves the complete configurations
    readable (PATH.reserve is given back so the file closes) and stops with DiskFullError."""
    comm = comm or MPI.COMM_WORLD
    rank = comm.Get_rank()
    overrides = list(overrides) + ([f'output="{out}"'] if out else [])
    job = collective(comm, lambda: load_job(path, overrides))
    collective(comm, checkpoint_every_s)  # a bad MPI_DP_CHECKPOINT_S stops before anything

    def select() -> tuple[tuple[int, int] | None, Path]:
        if task_file and (configs is None or configs.task is None):
            raise JobError("--task-file names the part of --config-block I/N; give the block")
        block = configs.resolve(len(job.configs())) if configs is not None else None
        if not task_file:
            return block, job.output
        assert configs is not None and configs.task is not None  # checked above
        return block, task_path(job.output, configs.task[0])

    block, final = collective(comm, select)
    lock = OutputLock(final) if rank == 0 else None

    def claim() -> bool:  # before anything else: fail fast, and hold the output while we run
        if lock is None:
            return False
        lock.acquire()
        try:
            go_on = resume and (resume != "auto" or partial_path(final).exists())
            check_resume(final) if go_on else check_output(final, overwrite)
            return bool(go_on)
        except BaseException:
            lock.release()
            raise

    resumed: bool = comm.bcast(collective(comm, claim), root=0)
    try:
        task = configs.task if configs is not None else None
        return _run_locked(job, comm, progress, resumed, final, block, task, force)
    finally:
        if lock is not None:
            lock.release()


def _run_locked(job: Job, comm: MPI.Comm, progress: bool, resume: bool, final: Path,
                block: tuple[int, int] | None, task: tuple[int, int] | None,
                force: bool = False) -> Path:
    """run_job once the output `final` is claimed: validate, write PATH.partial, rename when
    complete. Only the configurations in `block` (all if None) run."""
    rank = comm.Get_rank()
    method = REGISTRY.get(job.algorithm)
    shard = collective(comm, lambda: ShardFile(job.generic.data))
    sizes = shard_sizes(comm, shard)
    configs = collective(comm, lambda: resolve_configs(job, shard, sizes))
    star = Star(comm, shard.n_agents)
    # the rank's block of owners in a few large reads (block layout; one per owner in old files)
    collective(comm, lambda: shard.check_agents(star.local_agents))
    collective(comm, lambda: shard.check_finite(star.local_agents))
    g = job.generic
    run_ids = tuple(range(g.first_run, g.first_run + g.runs))
    ctx = Context(job, shard, star, run_ids, progress, sizes)
    prepared = method.prepare(ctx)
    # every configuration configured once (settings, release plans, attributes, footprint),
    # agreed and checked before the output exists
    configured = [ctx.agree(lambda rc=rc: method.configure(ctx, prepared, rc))
                  for rc in configs]
    # what the job will cost (result size, memory, time), checked before the noise calibration
    # (a T of 1e12 would compose privacy losses for hours) and before the output is touched
    hosts = comm.allgather(socket.gethostname())
    lo, hi = block if block is not None else (0, len(configs))
    fp = footprint.job_footprint(comm, [c.footprint for c in configured
                                        if lo <= c.resolved.index < hi])
    rules, distinct = calibration_keys(ctx, configured)
    reserve = SpaceReserve(final) if rank == 0 else None

    def check_and_reserve() -> None:
        nonlocal fp
        if rank == 0:  # the calibration (rank 0's) too: minutes and GBs at T = 1e6
            cost = calibration_cost.job_cost(distinct)
            fp = fp.with_calibration(cost.seconds, cost.peak_bytes)
            footprint.check(fp, final, max(hosts.count(h) for h in hosts), force, progress)
            assert reserve is not None  # rank 0's
            reserve.hold()
    collective(comm, check_and_reserve)
    try:
        stopped = None
        try:
            contracts = make_contracts(ctx, configured, rules, distinct, fp.calibration_seconds)
            signal = noise_to_signal(ctx, configured, contracts)
        except stop.Interrupted as e:  # the file still says so, as for any other stop
            stopped, contracts, signal = e, [], {}
        return _write(job, comm, method, ctx, prepared, configured, contracts, signal, hosts,
                      resume, final, block, task, reserve, progress, stopped)
    finally:
        if reserve is not None:
            reserve.release()


def _write(job: Job, comm: MPI.Comm, method: Method, ctx: Context, prepared: Any,
           configured: list[Configured], contracts: list[Contract], signal: dict,
           hosts: list[str] | None, resume: bool, final: Path, block: tuple[int, int] | None,
           task: tuple[int, int] | None, reserve: SpaceReserve | None, progress: bool,
           stopped: stop.Interrupted | None = None) -> Path:
    """The result file: open (or reopen), run the configurations, close with the status
    (`stopped`: a stop during the noise calibration, raised once the file says so)."""
    rank, shard, run_ids = comm.Get_rank(), ctx.shard, ctx.run_ids
    if rank == 0:
        quiet_full_disk_deallocs()
    owners = collective(comm, lambda: {**owner_values(shard), **shard_digest(shard)}
                        if rank == 0 else {})
    result = collective_open(job if rank == 0 else None, len(configured), comm, hosts, resume,
                             final, block, task, owners)
    # completed: set by ResultFile.reopen (resume)
    done = set(comm.bcast(cast(Any, result).completed if result is not None and resume else [],
                          root=0))
    lo, hi = block if block is not None else (0, len(configured))
    full, kept = False, 0
    if rank == 0 and progress and resume:
        prog.info(f"resuming {partial_path(final)}: {len(done)} of {hi - lo} "
                  "configuration(s) complete, the others run (again)")
    if rank == 0 and progress:
        for note in job.notes:
            prog.info(f"note: job file {job.path}: {note}")
        detail = method.header(ctx, prepared)
        prog.info(f"job '{job.name}' ({job.algorithm}/{_variants(job)}): {len(configured)} "
                  f"configuration(s) x {len(run_ids)} runs x T={job['T']} on {comm.Get_size()} "
                  f"rank(s), {shard.n_agents} owners{'; ' + detail if detail else ''}\n"
                  f"{_block_text(lo, hi, len(configured), task) if block is not None else ''}"
                  f"  writing {partial_path(final)} (renamed to {final.name} when complete)")
    t_start = time.perf_counter()
    status, why = "failed", None
    try:
        if stopped is not None:  # no configuration runs; --resume runs them all
            raise stopped
        for c, con in zip(configured, contracts, strict=True):
            i = c.resolved.index
            if lo <= i < hi and i not in done:
                stop.check(comm)  # a stop asked during set-up or the last configuration
                _run_one(method, ctx, prepared, c, con, len(configured), result,
                         signal.get(i, {}))
        status = "complete"
    except (stop.Interrupted, KeyboardInterrupt) as e:
        status = "interrupted"
        why = (e.reason if isinstance(e, stop.Interrupted) else str(e)) or "interrupted"
        raise
    except BaseException as e:
        full = result is not None and no_space(e)
        if full and reserve is not None:
            reserve.release()  # room for HDF5 to close the file with what was complete
        why = (f"no space left on device writing {result.path}" if full and result is not None
               else f"{type(e).__name__}: {e}"[:2000])
        kept = len(result.complete_indices()) if full and result is not None else 0
        if not full:
            raise
    finally:
        if result is not None:
            ends = {"wall_seconds": round(time.perf_counter() - t_start, 3),
                    "end_time": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
            if full:
                assert why is not None  # set with full
                result.close_on_full_disk(why, **ends)
            else:
                result.close(status, reason=why, **ends)
            if status == "complete":
                os.replace(result.path, final)  # only a finished job takes the name
        if rank == 0 and progress and status == "complete":
            prog.info(f"done in {time.perf_counter() - t_start:.1f} s -> {final}")
        elif rank == 0 and result is not None and status != "complete" and not full:
            print(f"mpi-dp: {status}: what the job did is in {result.path} (mpi-dp analyze "
                  f"reads it); {final} was not touched", file=sys.stderr, flush=True)
    if full:
        raise DiskFullError(f"no space left on device writing {partial_path(final)}: the "
                            f"{kept} complete configuration(s) in it stay readable; free space "
                            "and run the same command with --resume to finish the job")
    return final


def calibration_keys(ctx: Context, configured: list[Configured]
                     ) -> tuple[list[Rule], list[tuple[str, Plan]]]:
    """Collective: every configuration's calibration rule, and the distinct (rule name, plan)
    pairs of the accounted rules (pld, basic), each searched once by make_contracts."""
    rules = [ctx.agree(lambda c=c: rule_for(ctx.job, c)) for c in configured]
    distinct = list(dict.fromkeys((r.name, p) for r, c in zip(rules, configured, strict=True)
                                  if not r.paper for p in c.plans or () if p is not None))
    return rules, distinct


def make_contracts(ctx: Context, configured: list[Configured], rules: list[Rule],
                   distinct: list[tuple[str, Plan]], expected_s: float = 0.0) -> list[Contract]:
    """Collective: every configuration's privacy contract (privacy.contract.Contract): its
    owners' plans under its rule (`calibration_keys`; the method's paper rule for 'paper').
    Each distinct plan of an accounted rule is searched once, on rank 0, and broadcast (a
    search composes privacy loss distributions ~15 times: seconds, minutes at T = 1e6; never
    per owner and never per rank), watched (privacy.calibration_run: a progress line every few
    seconds against `expected_s`, the estimate; a stop signal ends it within a second on every
    rank: comm.stop.Interrupted, and the result file then says 'interrupted' with no
    configuration done); a paper rule's formulas are computed where they are used."""
    job, comm, g = ctx.job, ctx.comm, ctx.job.generic
    by_name = {r.name: r for r in rules}

    def search() -> dict | tuple[int, str] | None:
        if comm.Get_rank() != 0:
            return None
        t0 = time.perf_counter()
        when = "before" if stop.requested() else "during"
        try:
            out = calibration_run.run(distinct, lambda key: by_name[key[0]].calibrate(key[1]),
                                      stopped=stop.requested, describe=_plan_text,
                                      expected_s=expected_s, report=ctx.progress)
        except ValueError as e:
            raise JobError(f"job file {job.path}: {e}") from None
        if isinstance(out, int):  # the signal that stopped it
            return out, f"{when} the noise calibration"
        if ctx.progress and distinct:
            _print_calibrations(out, ", ".join(dict.fromkeys(k[0] for k in out)),
                                time.perf_counter() - t0)
        return out

    found = comm.bcast(ctx.agree(search), root=0) if distinct else {}
    if isinstance(found, tuple):  # every rank stops together
        raise stop.Interrupted(*found)

    def contract_of(rule: Rule, c: Configured) -> Contract:
        try:
            return Contract.of(rule, c.plans, seed=g.seed, run_ids=ctx.run_ids,
                               found={p: cal for (name, p), cal in found.items()
                                      if name == rule.name})
        except ValueError as e:
            raise JobError(f"job file {job.path}: {e}") from None

    return [ctx.agree(lambda r=r, c=c: contract_of(r, c))
            for r, c in zip(rules, configured, strict=True)]


def noise_to_signal(ctx: Context, configured: list[Configured], contracts: list[Contract]
                    ) -> dict[int, dict[str, Any]]:
    """Each configuration's noise-to-signal ratios (privacy.noise_signal) as group attributes,
    printed before the first iteration with a warning where the noise wins for every owner.
    Only calibrated rules (a paper rule sets its noise its own way) and private configurations."""
    out: dict[int, dict[str, Any]] = {}
    lines: list[str] = []
    for c, con in zip(configured, contracts, strict=True):
        cs = con.calibrations
        rc = c.resolved
        if not cs or con.rule.paper or any(x is None for x in cs):
            continue
        if all(x.noise_multiplier == 0 for x in cs if x is not None):
            continue
        sig = c.signal
        if sig is None:
            continue
        live = [x for x in cs if x is not None]
        per = noise_signal.ratios([x.noise_multiplier for x in live], list(sig.sens_over_signal),
                                  [x.plan.mechanism for x in live], sig.dim)
        run = noise_signal.run_ratio(per, list(sig.releases) if sig.releases is not None
                                     else [x.plan.releases for x in live])
        out[rc.index] = {"noise_to_signal": per, "noise_to_signal_run": run,
                         "noise_to_signal_what": noise_signal.WHAT}
        line = f"  #{rc.index} {rc.label}: {noise_signal.summary(per, run)}"
        if noise_signal.noise_wins(run):
            line += ("\n    WARNING: the noise exceeds the signal for every owner over the run: "
                     "this configuration will not learn (a larger eps, more records per owner or "
                     "fewer releases lowers the ratio)")
        lines.append(line)
    if lines and ctx.comm.Get_rank() == 0 and ctx.progress:
        shown = lines if len(lines) <= 12 else [*lines[:6], f"  ... {len(lines) - 8} more ...",
                                                 *lines[-2:]]
        warned = sum("WARNING" in ln for ln in lines)
        prog.info("noise-to-signal of one release (expected noise norm / signal norm bound), "
                  "and over the run (/ sqrt(releases)):\n" + "\n".join(shown)
                  + (f"\nmpi-dp: warning: the noise wins for every owner in {warned} "
                     "configuration(s)" if warned and len(lines) > 12 else ""))
    return out


def _plan_text(key: tuple[str, Plan]) -> str:
    """A plan in a progress line: rule, releases, mechanism, target."""
    rule, p = key
    return f"{rule}, {p.releases} {p.mechanism} release(s) per {p.scope}, eps={p.eps:g}"


def _print_calibrations(found: dict, rule: str, seconds: float) -> None:
    """One progress line per distinct calibrated plan (what privacy costs, before computing)."""
    lines = [f"noise calibrated ({rule}) for {len(found)} distinct release plan(s) in "
             f"{seconds:.1f} s:"]
    for cal in list(found.values())[:8]:
        lines.append(f"  {cal.text()}")
    if len(found) > 8:
        lines.append(f"  ... and {len(found) - 8} more (privacy/ledger of each configuration)")
    prog.info("\n".join(lines))


def _block_text(lo: int, hi: int, n: int, task: tuple[int, int] | None) -> str:
    """The progress line of a part: which configurations it holds."""
    which = f"block {task[0]}/{task[1]}: " if task is not None else ""
    held = (f"configuration {hi} of {n} (index {lo})" if hi == lo + 1 else
            f"configurations {lo + 1}..{hi} of {n} (indices {lo}:{hi})" if hi > lo else
            f"no configuration of the {n} (an empty block)")
    return f"  {which}{held}; mpi-dp merge combines the parts\n"


def _run_one(method: Method, ctx: Context, prepared: Any, c: Configured, con: Contract,
             n_configs: int, result: ResultFile | None, extra: dict[str, Any]) -> None:
    """One configuration: the group and its attributes, the run (with the configuration's
    contract and RunHooks: its recorder, label, progress and checkpoints), the outputs."""
    rc = c.resolved
    rec = None
    if result is not None:
        attrs = {"label": rc.label, "variant": rc.variant, "eps": np.array(rc.eps),
                 "n": np.array(rc.n, dtype="i8"), **c.group_attrs(), **con.attrs(), **extra}
        if rc.n_requested is not None:
            attrs["n_requested"] = np.array(rc.n_requested, dtype="i8")
        if ctx.job.is_sweep:
            attrs["sweep_values"] = sweep_values(ctx.job, rc.config)
        rec = result.config(rc.index, ctx.runs, expected_records=c.records, **attrs)
    label = f"{rc.index + 1}/{n_configs} {rc.label}"
    hooks = RunHooks(rec, label, ctx.comm, ctx.progress)
    outcome = method.run(ctx, prepared, c, con, hooks)
    if rec is not None:
        if outcome is None:
            raise RuntimeError(f"method {method.name!r} returned no outcome on rank 0")
        write_outcome(rec, outcome, ledger_delta(ctx, rc))
        assert result is not None  # rec is its recorder
        result.config_done(rc.index)


def sweep_values(job: Job, config: Any) -> str:
    """This configuration's value of every sweep axis, as written in the job (strict JSON, e.g.
    {"eps": "Infinity", "graph": "ring"}): the sweep per configuration."""
    own = {"eps": config.eps, "n": config.n, "owners": config.owners, "variant": config.variant,
           **{k.rsplit(".", 1)[-1]: v for k, v in config.params}}
    return strict_json.dumps({k: own.get(k) for k in job.sweep()})


def write_outcome(rec: ConfigRecorder, outcome: Outcome, delta: float) -> None:
    """A configuration's arrays, its agents' ledgers through the accountants, its attributes."""
    for path, data, attrs in outcome.arrays:
        rec.write(path, data, **attrs)
    rows = (outcome.ledgers if isinstance(outcome.ledgers, np.ndarray) else
            accountants.ledger_rows(outcome.ledgers, delta))
    common = {"delta": float(rows["delta"][0])} if len(rows) and np.all(
        rows["delta"] == rows["delta"][0]) else {}
    rec.write("privacy/ledger", rows, guarantee=outcome.guarantee,
              accountants=accountants.ACCOUNTANTS_TEXT, **common,
              composition="per owner: target_eps / target_delta, the guarantee it was promised "
              "(calibration: the rule that set its noise); eps_basic / eps_advanced / eps_pld / "
              "eps_rdp: the totals of what the guarantee composes (scope) at the owner's delta; "
              "*_all: every release of the configuration composed plainly; counts are the "
              "largest over runs")
    rec.set_attrs(**outcome.attrs)


def _variants(job: Job) -> str:
    """The job's variant, or the swept variants joined by commas."""
    return ",".join(job.swept("variant", job.generic.variant))


def owner_values(shard: ShardFile) -> dict[str, str]:
    """Provenance of a shard partitioned by a key column: which value each owner holds
    (owner_key, owner_values as JSON), so that `mpi-dp analyze` can name the owners."""
    values = shard.partition_values()
    if values is None:
        return {}
    key = shard.attrs.get("partition_key", "")
    return {"owner_key": str(key), "owner_values": json.dumps(values)}


def shard_digest(shard: ShardFile) -> dict[str, str]:
    """Provenance of the data: the shard file's path and SHA-256 (which bytes a result used)."""
    try:
        return {"data_path": str(shard.path), "data_sha256": provenance.sha256(shard.path)}
    except OSError as e:
        raise JobError(f"cannot read the shard file {shard.path}: {e.strerror or e}") from None


def collective_open(job: Job | None, n_configs: int, comm: MPI.Comm,
                    hosts: list[str] | None, resume: bool = False, final: Path | None = None,
                    block: tuple[int, int] | None = None,
                    task: tuple[int, int] | None = None,
                    owners: dict[str, str] | None = None) -> ResultFile | None:
    """Rank 0 creates (or, resuming, reopens) the result file of `final` (default: the job's
    output); a failure (e.g. unwritable path) stops every rank."""
    def make() -> ResultFile | None:
        if job is None:
            return None
        out = final or job.output
        if resume:
            try:
                return ResultFile.reopen(partial_path(out), job.to_json(), block,
                                         (owners or {}).get("data_sha256"))
            except (OSError, ValueError) as e:
                raise JobError(f"cannot resume {partial_path(out)}: {e}") from None
        try:
            return ResultFile(
                partial_path(out), job_text=job.record_text, job_json=job.to_json(),
                algorithm=job.algorithm, variant=_variants(job), n_configs=n_configs,
                sweep=job.sweep(), provenance=provenance.collect(comm.Get_size(), hosts or [],
                                                                 job.generic.seed, owners),
                block=block, task=task)
        except OSError as e:
            raise JobError(f"job file {job.path}: key 'output': cannot create {out}: "
                           f"{e.strerror or e}") from None
    return collective(comm, make)
