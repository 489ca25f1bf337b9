"""What a job will cost before it starts: the size of its result file, the memory of a rank, the
time, estimated from the job's numbers (T, runs, agents, records, features) and checked against
the machine, so that an absurd job stops in a second with one line instead of after hours.

The estimates are deliberately rough (a factor of a few either way): they exist to catch a T of
1e12 or a result that cannot fit on the disk, not to plan a job. Memory and time are the largest
over ranks; the output is written by rank 0.
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
#: Python and MPI overhead per hosted agent and iteration, and per iteration (measured on the
#: 10,000-agent benchmarks: about 60 us per agent)
AGENT_S, ITERATION_S = 60e-6, 50e-6
#: memory of one hosted agent's objects beyond its arrays (owner, ledger, noise streams)
AGENT_BYTES = 20e3
#: a job estimated to run longer than this needs --force
TIME_LIMIT_S = 30 * 86400.0


@dataclasses.dataclass(frozen=True)
class Footprint:
    """A job's estimated cost: result bytes (all configurations), the largest rank's memory in
    bytes (one configuration at a time), seconds of the whole job."""

    output_bytes: float
    memory_bytes: float
    seconds: float

    def text(self) -> str:
        return (f"estimated before starting: result file about {_bytes(self.output_bytes)}, "
                f"memory about {_bytes(self.memory_bytes)} per rank, time about "
                f"{_duration(self.seconds)} (rough, a factor of a few either way)")


def config_footprint(T: int, runs: int, records: int, p: int, hosted_agents: int,
                     hosted_records: int, n_agents: int, per_iteration_bytes: float = 0.0
                     ) -> Footprint:
    """One configuration on one rank: `records` written, `p` model coordinates, the agents and
    records this rank hosts, `per_iteration_bytes` a method keeps for every iteration (a trace,
    a schedule: async_star, p2p)."""
    out = records * runs * 8.0 * METRICS_GUESS + n_agents * 1024.0 + runs * p * 8.0 * 8 + 65536
    mem = (runs * p * 8.0 * (hosted_agents + 16) * 4 + hosted_agents * AGENT_BYTES
           + T * per_iteration_bytes)
    per_it = (runs * max(hosted_records, 1) * p * 4.0 / FLOPS + hosted_agents * AGENT_S
              + ITERATION_S)
    return Footprint(out, mem, T * per_it)


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
    """Refuse (JobError) what cannot work: memory past what the node holds (always), a result
    larger than the free space of its file system or a time past TIME_LIMIT_S (unless
    `force`: then a warning). Call on rank 0 inside a collective."""
    avail = memory_available()
    need = fp.memory_bytes * max(1, ranks_per_node)
    if need > 0.9 * avail:
        raise JobError(f"the job needs about {_bytes(need)} of memory on a node "
                       f"({_bytes(fp.memory_bytes)} per rank x {ranks_per_node} rank(s)) but the "
                       f"node has {_bytes(avail)} available: lower T, runs or the number of "
                       "agents, or use more nodes")
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
