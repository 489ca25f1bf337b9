"""What a job will cost before it starts: the size of its result file, the memory of a rank, the
time, estimated from the job's numbers (T, runs, agents, records, features) and checked against
the machine, so that an absurd job stops in a second with one line instead of after hours.

The time covers what follows the estimate: the noise calibration (privacy.calibration_cost: its
searches compose T releases, minutes at T = 1e6), then per configuration its iterations (the
agents' passes over their records, per-agent and per-iteration overheads) and its records (an
evaluation pass and the HDF5 writes each); the constants were measured on the demo job (sync_star,
3 owners x 4,000 records, d = 10) from T = 1e3 to 1e6: benchmarks/estimate.py prints how far the
estimate is from the measured time. Still rough (aim: within 2x on an idle machine; a loaded one
is slower by its load): it exists to catch a T of 1e12 or a result that cannot fit on the disk
and to plan a long job. Memory and time are the largest over ranks (the calibration is rank 0's);
the output is written by rank 0.
"""

from __future__ import annotations

import dataclasses
import math
import shutil
import sys
from pathlib import Path
from typing import Any

import numpy as np
from mpi4py import MPI

from ..errors import JobError
from .output import RESERVE_BYTES

#: metric columns a record holds, a generous guess for every method (psi, errors, distances ...)
METRICS_GUESS = 12
#: arithmetic a rank does per second in the vectorised kernels (float64, one BLAS thread)
FLOPS = 2e9
#: arithmetic per run, record and feature of an iteration's pass (a gradient: X theta and
#: X^T r; a method whose pass is cheaper states its own: sync_star's squared loss screens most
#: records out) and of a record's evaluation (the losses of two models per run: GEMMs, about
#: 3x FLOPS; measured on the demo job)
ITERATION_FLOPS, RECORD_FLOPS = 4.0, 1.5
#: Python and MPI overhead per hosted agent and iteration, and per iteration (measured on the
#: 10,000-agent benchmarks: about 60 us per agent); a method whose iteration does more (a
#: synchronous round: sync_star) states its own
AGENT_S, ITERATION_S = 60e-6, 50e-6
#: overhead of one record (its metrics' HDF5 appends, the checkpoint clock's reduction: 2.5-2.8
#: ms measured on the demo job), and of one configuration (its group, reference and ledger)
RECORD_S, CONFIG_S = 2.5e-3, 0.5
#: memory of one hosted agent's objects beyond its arrays (owner, ledger, noise streams)
AGENT_BYTES = 20e3
#: a job estimated to run longer than this needs --force
TIME_LIMIT_S = 30 * 86400.0


@dataclasses.dataclass(frozen=True)
class Footprint:
    """A job's estimated cost: result bytes (all configurations), the largest rank's memory in
    bytes (one configuration at a time), seconds of the whole job; of them, the noise
    calibration's seconds and its memory on rank 0 (`with_calibration`)."""

    output_bytes: float
    memory_bytes: float
    seconds: float
    calibration_seconds: float = 0.0
    calibration_bytes: float = 0.0

    def with_calibration(self, seconds: float, peak_bytes: float) -> Footprint:
        """This footprint and a noise calibration of `seconds` whose largest composition takes
        `peak_bytes` on rank 0 (privacy.calibration_cost)."""
        return dataclasses.replace(self, seconds=self.seconds + seconds,
                                   calibration_seconds=seconds, calibration_bytes=peak_bytes)

    def node_bytes(self, ranks_per_node: int) -> float:
        """Memory of the busiest node: every rank's, and rank 0's calibration beside them."""
        return self.memory_bytes * max(1, ranks_per_node) + self.calibration_bytes

    def text(self) -> str:
        cal = (f" (noise calibration about {_duration(self.calibration_seconds)} of it, "
               f"{_bytes(self.calibration_bytes)} on rank 0)"
               if self.calibration_seconds >= 0.1 else "")
        return (f"estimated before starting: result file about {_bytes(self.output_bytes)}, "
                f"memory about {_bytes(self.memory_bytes)} per rank, time about "
                f"{_duration(self.seconds)} from here{cal} (rough: aim within 2x on an idle "
                "machine)")


def config_footprint(T: int, runs: int, records: int, p: int, hosted_agents: int,
                     hosted_records: int, n_agents: int, per_iteration_bytes: float = 0.0,
                     iteration_s: float = ITERATION_S, iteration_flops: float = ITERATION_FLOPS
                     ) -> Footprint:
    """One configuration on one rank: `records` written, `p` model coordinates, the agents and
    records this rank hosts, `per_iteration_bytes` a method keeps for every iteration (a trace,
    a schedule: async_star, p2p); `iteration_s` its overhead per iteration beyond the agents',
    `iteration_flops` its arithmetic per run, hosted record and coordinate of an iteration."""
    out = records * runs * 8.0 * METRICS_GUESS + n_agents * 1024.0 + runs * p * 8.0 * 8 + 65536
    mem = (runs * p * 8.0 * (hosted_agents + 16) * 4 + hosted_agents * AGENT_BYTES
           + T * per_iteration_bytes)
    pass_flops = runs * max(hosted_records, 1) * p / FLOPS
    per_it = pass_flops * iteration_flops + hosted_agents * AGENT_S + iteration_s
    per_record = pass_flops * RECORD_FLOPS + RECORD_S
    return Footprint(out, mem, T * per_it + records * per_record + CONFIG_S)


def job_footprint(comm: MPI.Comm, parts: list[Footprint]) -> Footprint:
    """Collective: the job's footprint from each configuration's on this rank (output: summed;
    memory: the largest configuration; time: summed), the largest over ranks."""
    local = np.array([sum(f.output_bytes for f in parts),
                      max((f.memory_bytes for f in parts), default=0.0),
                      sum(f.seconds for f in parts)])
    comm.Allreduce(MPI.IN_PLACE, local, op=MPI.MAX)
    return Footprint(*map(float, local))


def memory_available() -> float:
    """Bytes of memory available on this node (MemAvailable), inf where unknown."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return float(line.split()[1]) * 1024.0
    except OSError:
        pass
    return math.inf


def check(fp: Footprint, final: Path, ranks_per_node: int, force: bool, progress: bool) -> None:
    """Refuse (JobError) what cannot work: memory past what the node holds (always; rank 0's
    calibration included), a result larger than the free space of its file system or a time
    past TIME_LIMIT_S (unless `force`: then a warning). Call on rank 0 inside a collective."""
    avail = memory_available()
    need = fp.node_bytes(ranks_per_node)
    memory = None
    if need > 0.9 * avail:
        cal = (f", and {_bytes(fp.calibration_bytes)} on rank 0 for the noise calibration, whose "
               "privacy loss distributions grow with T (privacy.calibration = 'basic' needs no "
               "search)" if fp.calibration_bytes > 0.1 * need else "")
        memory = (f"the job needs about {_bytes(need)} of memory on a node "
                  f"({_bytes(fp.memory_bytes)} per rank x {ranks_per_node} rank(s){cal}) but the "
                  f"node has {_bytes(avail)} available: lower T, runs or the number of agents, "
                  "or use more nodes")
    try:
        free = float(shutil.disk_usage(final.parent if final.parent.exists() else ".").free)
    except OSError:
        free = math.inf
    problems = []
    if fp.output_bytes + RESERVE_BYTES > free:
        problems.append(f"the result needs about {_bytes(fp.output_bytes)} but {final.parent} has "
                        f"{_bytes(free)} free (free space, write elsewhere with --out, or record "
                        "less often: record_every)")
    if fp.seconds > TIME_LIMIT_S:
        problems.append(f"the job would run about {_duration(fp.seconds)} (lower T, runs or the "
                        "number of configurations)")
    if memory is not None:  # never forced; the other problems said in the same line
        raise JobError("; ".join([memory, *problems]))
    if problems and not force:
        raise JobError("; ".join(problems) + "; pass --force to start anyway")
    if progress:
        print(f"mpi-dp: {fp.text()}", file=sys.stderr, flush=True)
        for p in problems:
            print(f"mpi-dp: warning (--force): {p}", file=sys.stderr, flush=True)


def _bytes(v: float) -> str:
    if not math.isfinite(v):
        return "unknown"
    for unit, size in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if v >= size:
            return f"{v / size:.3g} {unit}"
    return f"{v:.0f} B"


def _duration(s: float) -> str:
    for unit, size in (("years", 365.25 * 86400), ("days", 86400.0), ("h", 3600.0),
                       ("min", 60.0)):
        if s >= size:
            return f"{s / size:.3g} {unit}"
    return f"{s:.2g} s"


def hosted(ctx: Any) -> tuple[int, int]:
    """The agents and records this rank hosts."""
    local = list(ctx.star.local_agents)
    sizes = ctx.sizes if ctx.sizes is not None else np.zeros(ctx.shard.n_agents)
    return len(local), int(np.sum(sizes[local])) if local else 0
