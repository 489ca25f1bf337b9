"""`mpi-dp merge`: combine the part files of one job (blocks of its configurations written by
`mpi-dp run --configs A:B` / `--config-block I/N`, e.g. the array tasks of slurm/sweep.sbatch)
into the result file the whole job writes.

The parts must come from the same job (the same job_resolved apart from `output`, algorithm,
variant, n_configs, sweep), each be complete, and together hold every configuration exactly once.
The merged file starts as a byte copy of the part holding configuration 0; the other parts'
configuration groups are copied in with HDF5's object copy, so every dataset equals, bit for bit,
the one a single job writes. Root attributes are that first part's with status complete, the block
attributes (config_block, config_task) and `resumed` removed, `merged_from` (JSON: each part's
path, block, task, resumed count and provenance) added, and the heartbeat the merge's. Attributes
that differ from a single job's file: writer_host, writer_pid, heartbeat_unix, merged_from and, in
/provenance, command, hosts (all parts'), n_ranks (the first part's), start_time (earliest),
end_time (latest), wall_seconds (summed over the parts); besides, as between any two runs, the
wall times some methods record per configuration (attribute `seconds`).
"""

from __future__ import annotations

import dataclasses
import glob
import json
import os
import re
import shutil
import socket
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from .. import progress as prog
from ..errors import MergeError
from . import schema
from .output import OutputLock, check_output, describe_partial, partial_path, progress_text
from .parts import ranges_text, task_glob, task_path
from .recorder import FORMAT, _without_output

#: root attributes two parts of one job must share (besides job_resolved without output)
SAME_JOB = ("format_version", "algorithm", "variant", "n_configs", "sweep")
#: provenance attributes naming the code; parts written by different code get a warning
CODE = ("mpi_dp", "git_revision", "python", "numpy", "scipy", "h5py", "hdf5", "mpi_library",
        "petsc4py")


def _plain(v: Any) -> Any:
    if isinstance(v, bytes | np.bytes_):
        return v.decode("utf-8", "replace")
    if isinstance(v, np.generic):
        return v.item()
    if isinstance(v, np.ndarray):
        return v.tolist()
    return v


@dataclasses.dataclass(frozen=True)
class Part:
    """One part file: its root and provenance attributes and the block it holds."""

    path: Path
    attrs: dict[str, Any]
    prov: dict[str, Any]
    block: tuple[int, int]
    task: tuple[int, int] | None

    @property
    def empty(self) -> bool:
        return self.block[0] == self.block[1]


def find_parts(out: Path, specs: Sequence[str]) -> list[Path]:
    """Files, directories (their *.h5) and globs -> part paths, each once; none: OUT's task files."""
    if not specs:
        found = sorted(out.parent.glob(task_glob(out)))
        if not found:
            raise MergeError(f"no part files {out.parent / task_glob(out)} (what slurm/sweep.sbatch "
                             "and `mpi-dp run --config-block I/N --task-file` write); name the "
                             "parts: mpi-dp merge OUT PART...")
        return found
    paths: list[Path] = []
    for spec in specs:
        p = Path(spec)
        if p.is_dir():
            got = sorted(q for q in p.glob("*.h5") if q.resolve() != out.resolve())
            if not got:
                raise MergeError(f"{p} is a directory without *.h5 files")
        elif not p.exists() and glob.has_magic(spec):
            got = sorted(Path(q) for q in glob.glob(spec))
            if not got:
                raise MergeError(f"no file matches {spec}")
        elif not p.exists():
            raise MergeError(f"part file not found: {p}")
        else:
            got = [p]
        paths += got
    unique: dict[Path, Path] = {}
    for p in paths:
        unique.setdefault(p.resolve(), p)  # a file named twice (a glob and by name) counts once
    return list(unique.values())


def _held(f: h5py.File, sweep: bool) -> dict[int, bool]:
    """Configuration index -> complete, of every configuration a file holds."""
    if not sweep:
        a = f.attrs
        return {0: bool(a.get("config_complete", False))} if "config_index" in a else {}
    g = f.get("configs")
    return {int(k): bool(g[k].attrs.get("config_complete", False)) for k in (g or {})}


def read_part(path: Path) -> Part:
    """A complete part file holding exactly its block; MergeError otherwise."""
    try:
        f = h5py.File(path, "r", locking=False)
    except OSError as e:
        raise MergeError(f"{path}: not a readable HDF5 file ({e})") from None
    with f:
        try:
            attrs = {k: _plain(v) for k, v in f.attrs.items()}
        except (OSError, RuntimeError) as e:  # HDF5's errors on damaged metadata
            raise MergeError(f"{path}: the part file is damaged: its attributes cannot be read "
                             f"({e})") from None
        if attrs.get("format") != FORMAT:
            raise MergeError(f"{path}: not an mpi_dp result file")
        if attrs.get("status") != "complete":
            raise MergeError(f"{path} is not complete ({progress_text(attrs)}): let its job finish "
                             "or resume it (mpi-dp run ... --resume, or submit its task again), "
                             "then merge")
        n = int(attrs["n_configs"])
        block = tuple(attrs["config_block"]) if "config_block" in attrs else (0, n)
        task = tuple(attrs["config_task"]) if "config_task" in attrs else None
        held = _held(f, bool(json.loads(attrs.get("sweep") or "{}")))
        if set(held) != set(range(*block)) or not all(held.values()):
            raise MergeError(f"{path} should hold the complete configurations {block[0]}:"
                             f"{block[1]} but holds {ranges_text(list(held)) or 'none'} "
                             f"(complete: {ranges_text([i for i, c in held.items() if c]) or 'none'})")
        prov = {k: _plain(v) for k, v in f["provenance"].attrs.items()} if "provenance" in f else {}
    return Part(path, attrs, prov, (int(block[0]), int(block[1])),
                None if task is None else (int(task[0]), int(task[1])))


def check_same_job(parts: list[Part]) -> None:
    """Every part comes from the first part's job and --set options (output aside)."""
    ref = parts[0]
    ref_job = _without_output(ref.attrs.get("job_resolved", ""))
    for p in parts[1:]:
        job = _without_output(p.attrs.get("job_resolved", ""))
        diffs = [f"{k} {ref.attrs.get(k)!r} vs {p.attrs.get(k)!r}" for k in SAME_JOB
                 if ref.attrs.get(k) != p.attrs.get(k)]
        keys = sorted(k for k in set(job) | set(ref_job) if job.get(k) != ref_job.get(k))
        diffs += [f"{k} = {ref_job.get(k)!r} vs {job.get(k)!r}" for k in keys[:5]]
        if len(keys) > 5:
            diffs.append(f"and {len(keys) - 5} more keys")
        if diffs:
            raise MergeError(f"{p.path} and {ref.path} are not parts of the same job ("
                             f"{'; '.join(diffs)}); merge only the parts written by one job file "
                             "with the same --set options")


def check_cover(parts: list[Part], out: Path) -> None:
    """Together the parts hold every configuration exactly once; else say what is missing."""
    n = int(parts[0].attrs["n_configs"])
    owner: dict[int, Part] = {}
    both: dict[tuple[Path, Path], list[int]] = {}
    for p in parts:
        for i in range(*p.block):
            if i in owner:
                both.setdefault((owner[i].path, p.path), []).append(i)
            else:
                owner[i] = p
    if both:
        raise MergeError("configurations in more than one part: " + "; ".join(
            f"{ranges_text(ix)} in {a} and {b}" for (a, b), ix in both.items()) +
            " (a part given twice, or parts of different splits?); give each configuration's "
            "part once")
    missing = sorted(set(range(n)) - set(owner))
    if missing:
        raise MergeError(f"the parts hold {n - len(missing)} of the job's {n} configurations; "
                         f"missing: {ranges_text(missing)}{_missing_hint(parts, missing, out)}")


def _missing_hint(parts: list[Part], missing: list[int], out: Path) -> str:
    """Which --config-block tasks would hold the missing configurations, and their files."""
    tasks = [p.task for p in parts]
    if None in tasks or len({t[1] for t in tasks if t}) != 1:
        return ""
    N, n = parts[0].task[1], int(parts[0].attrs["n_configs"])  # type: ignore[index]
    have = {t[0] for t in tasks if t}
    todo = [i for i in range(N) if i not in have and
            any(i * n // N <= m < (i + 1) * n // N for m in missing)]
    notes = []
    for i in todo:
        f = _task_file(parts, i) or task_path(out, i)
        state = (f"{partial_path(f)}: {describe_partial(partial_path(f))}"
                 if partial_path(f).exists() else f"{f} exists but was not given" if f.exists()
                 else f"no {f}")
        notes.append(f"block {i}/{N} ({state})")
    ids = ",".join(map(str, todo))
    return (f" -- {', '.join(notes)}; run block(s) {ids} of {N} (sbatch --array={ids} "
            f"--export=ALL,MPI_DP_BLOCKS={N} slurm/sweep.sbatch JOB ..., or mpi-dp run JOB "
            f"--config-block I/{N} --task-file) and merge again") if notes else ""


def _task_file(parts: list[Part], i: int) -> Path | None:
    """Task I's file beside a given part named like STEM.taskJ.h5 (None if none is)."""
    for p in parts:
        m = re.fullmatch(rf"(.*)\.task{p.task[0]}(\.[^.]*)?", p.path.name) if p.task else None
        if m:
            return p.path.with_name(f"{m.group(1)}.task{i}{m.group(2) or ''}")
    return None


def _warn_if_code_differs(parts: list[Part]) -> None:
    for k in CODE:
        values = sorted({str(p.prov.get(k, "")) for p in parts})
        if len(values) > 1:
            print(f"mpi-dp: warning: the parts were written by different code ({k}: "
                  f"{', '.join(values)})", file=sys.stderr, flush=True)


def _write(partial: Path, parts: list[Part]) -> None:
    """The merged file at `partial`: a copy of the part holding configuration 0, the others'
    configuration groups copied in, the root and provenance attributes of a complete result."""
    first = next(p for p in parts if not p.empty)
    shutil.copyfile(first.path, partial)
    n = int(first.attrs["n_configs"])
    with h5py.File(partial, "r+", locking=False) as f:
        for p in parts:
            if p is first or p.empty:
                continue
            with h5py.File(p.path, "r", locking=False) as src:
                dst = f.require_group("configs")
                for i in range(*p.block):
                    dst.copy(src[f"configs/{i:03d}"], f"{i:03d}")
                    schema.reattach(dst[f"{i:03d}"])  # the copy keeps labels, not scale links
        last = next(p for p in parts if p.block[0] <= n - 1 < p.block[1])
        a = f.attrs
        for k in ("config_block", "config_task", "resumed"):
            if k in a:
                del a[k]
        a["status"] = "complete"
        a["writer_host"], a["writer_pid"], a["heartbeat_unix"] = (socket.gethostname(),
                                                                  os.getpid(), time.time())
        a["progress_config"] = last.attrs["progress_config"]
        a["progress_record"] = last.attrs["progress_record"]
        a["merged_from"] = json.dumps([
            {"path": str(p.path), "config_block": list(p.block),
             "config_task": list(p.task) if p.task else None,
             "resumed": int(p.attrs.get("resumed", 0)),
             **{k: p.prov.get(k) for k in ("hosts", "n_ranks", "start_time", "end_time",
                                           "wall_seconds", "command")}} for p in parts])
        prov = f.require_group("provenance").attrs
        prov["hosts"] = ",".join(sorted({h for p in parts
                                         for h in str(p.prov.get("hosts", "")).split(",") if h}))
        for k, pick in (("start_time", min), ("end_time", max)):
            times = [str(p.prov[k]) for p in parts if k in p.prov]
            if times:
                prov[k] = pick(times)
        prov["wall_seconds"] = round(sum(float(p.prov.get("wall_seconds", 0.0)) for p in parts), 3)
        prov["command"] = " ".join(sys.argv)


def merge_parts(out: str | Path, specs: Sequence[str] = (), overwrite: bool = False,
                progress: bool = True) -> Path:
    """Check the parts and write their merged result to `out` (via OUT.partial, renamed when
    complete; an existing OUT is replaced only with `overwrite`). Returns `out`."""
    out = Path(out)
    if out.is_dir():
        raise MergeError(f"{out} is a directory; give the merged file's path, e.g. results/x.h5")
    paths = find_parts(out, specs)
    if any(p.resolve() == out.resolve() for p in paths):
        raise MergeError(f"{out} is one of the parts; merge into another file")
    parts = sorted((read_part(p) for p in paths), key=lambda p: (p.block, str(p.path)))
    check_same_job(parts)
    check_cover(parts, out)
    _warn_if_code_differs(parts)
    lock = OutputLock(out)
    lock.acquire()
    try:
        partial = partial_path(out)
        check_output(out, overwrite, MergeError, "merge", "OUT")
        try:
            _write(partial, parts)
            os.replace(partial, out)
        except BaseException:
            partial.unlink(missing_ok=True)
            raise
    finally:
        lock.release()
    if progress:
        lines = "".join(f"\n  {p.block[0]}:{p.block[1]}  {p.path}" for p in parts)
        prog.info(f"merged {len(parts)} part(s), {int(parts[0].attrs['n_configs'])} "
                  f"configuration(s) -> {out}{lines}")
    return out
