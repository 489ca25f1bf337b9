"""Lines `mpi-dp analyze` adds about a result's surroundings, each one line: whether the shard file
it was computed from still holds those bytes, and which files a killed job left beside it.

A result records its shard as data_path (as the job named it: relative paths are relative to the
directory the run started in) and data_sha256, the SHA-256 of the file's bytes; the check hashes
the file at data_path again (a read of the whole file) and compares.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

from mpi_dp.results.output import lock_path, reserve_path, writer_gone
from mpi_dp.results.provenance import sha256

PARTIAL = ".partial"


def data_note(res: Any) -> str | None:
    """None when the result's shard file still has the recorded SHA-256 (or the result records
    none); else one line saying that it changed, or that it cannot be checked."""
    prov = res.provenance
    recorded, where = str(prov.get("data_sha256", "")), str(prov.get("data_path", ""))
    if not recorded or not where:
        return None
    path = Path(where)
    relative = "" if path.is_absolute() else " (data_path is relative to where the run started)"
    if not path.is_file():
        return (f"note: the shard file {path} this result was computed from is not found"
                f"{relative}; its data_sha256 cannot be checked")
    try:
        now = sha256(path)
    except OSError as e:
        return (f"note: cannot read the shard file {path} ({e.strerror or e}); the result's "
                "data_sha256 cannot be checked")
    if now == recorded:
        return None
    return (f"warning: the shard file {path} changed after this result was computed from it: its "
            f"SHA-256 is now {now[:12]}..., the result's data_sha256 is {recorded[:12]}...; the "
            f"figures describe the data it held then{relative}")


def leftovers_note(res: Any) -> str | None:
    """For a result whose writer is gone (killed): the lock and reserve files it left beside the
    result and the command that removes them; None when there are none."""
    if res.status != "running" or not writer_gone(res.attrs):
        return None
    path = Path(res.path)
    final = path.with_name(path.name[:-len(PARTIAL)]) if path.name.endswith(PARTIAL) else path
    left = [p for p in (lock_path(final), reserve_path(final)) if p.exists()]
    if not left:
        return None
    return (f"clean-up: the killed job left {' and '.join(p.name for p in left)} beside its "
            f"result (nothing in them is needed; {path} keeps the records written): remove "
            f"them with  rm {' '.join(shlex.quote(str(p)) for p in left)}")


def missing_note(final: Path) -> str:
    """For a result file that is not there: when a job that is gone left its lock (and reserve)
    file beside the name, '; ... remove them with  rm ...' (to append to the message); else ''."""
    lock = lock_path(final)
    try:
        holder = json.loads(lock.read_text() or "{}")
    except (OSError, ValueError):
        return ""
    if not isinstance(holder, dict) or not writer_gone(
            {"writer_pid": holder.get("pid", -1), "writer_host": holder.get("host", "")}):
        return ""
    left = [p for p in (lock, reserve_path(final)) if p.exists()]
    return (f"; {' and '.join(p.name for p in left)} beside it are left by a job (pid "
            f"{holder.get('pid')}) that is gone without writing it, and nothing in them is "
            f"needed: remove them with  rm {' '.join(shlex.quote(str(p)) for p in left)}")
