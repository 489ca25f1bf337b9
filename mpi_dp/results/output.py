"""Safe result paths: never replace a result silently, one writer at a time, no half-written
file under a result's name.

A job writes PATH.partial while it runs (status running, a heartbeat per record) and renames it
to PATH only when it completes, so a job that fails, is interrupted or is killed never destroys a
previous result at PATH; its .partial keeps what it did. PATH.lock is held with flock(2) for the
job's lifetime: a second job on the same output stops at once, naming the first; the kernel
releases the lock when the holder dies, so a killed job leaves no stale lock.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import socket
import sys
import time
from pathlib import Path
from typing import Any

from ..errors import DiskFullError, JobError

#: seconds without a heartbeat after which a running file on another host counts as stopped
STALE_AFTER_S = 600.0
#: bytes held in PATH.reserve beside a running job's result: given back when the disk fills,
#: so that the result file can still be closed (HDF5 writes its metadata when it closes) and
#: stays readable
RESERVE_BYTES = 4 << 20


def partial_path(final: str | Path) -> Path:
    final = Path(final)
    return final.with_name(final.name + ".partial")


def lock_path(final: str | Path) -> Path:
    final = Path(final)
    return final.with_name(final.name + ".lock")


def holder_text() -> dict[str, Any]:
    """Who writes: host, pid and start time (also the heartbeat's identity)."""
    return {"host": socket.gethostname(), "pid": os.getpid(),
            "since": time.strftime("%Y-%m-%dT%H:%M:%S%z")}


class OutputLock:
    """An exclusive flock on PATH.lock for one job's output (rank 0 only)."""

    def __init__(self, final: str | Path) -> None:
        self.final = Path(final)
        self._fd: int | None = None

    def acquire(self) -> None:
        if self.final.is_dir() or self.final.name in ("", ".", ".."):
            raise JobError(f"output {self.final} is a directory; give a file path (--out x.h5)")
        self.path = lock_path(self.final)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as e:
            raise JobError(f"cannot write the result {self.final}: {e.strerror or e} "
                           f"({e.filename or self.path.parent}); choose --out") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            try:
                who = json.loads(os.pread(fd, 4096, 0).decode() or "{}")
            except (OSError, ValueError):
                who = {}
            os.close(fd)
            desc = (f"pid {who.get('pid', '?')} on {who.get('host', '?')} since "
                    f"{who.get('since', '?')}") if who else "another job"
            raise JobError(f"{self.final} is being written by {desc} (lock {self.path}); "
                           "wait for it to finish or choose another --out") from None
        except OSError as e:  # a file system without flock (some NFS/Lustre mounts): go on
            print(f"mpi-dp: warning: cannot lock {self.path} ({e.strerror or e}); two jobs "
                  "writing the same output would not be stopped", file=sys.stderr, flush=True)
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(holder_text()).encode(), 0)
        self._fd = fd

    def release(self) -> None:
        if self._fd is None:  # never acquired
            return
        try:
            self.path.unlink(missing_ok=True)
        finally:
            os.close(self._fd)  # closing drops the flock
            self._fd = None


def check_output(final: str | Path, overwrite: bool, error: type[Exception] = JobError,
                 verb: str = "a run", option: str = "--out") -> None:
    """Refuse what would lose a result; call while holding the lock, before touching anything.
    `error`, `verb` and `option` (where the output is named) fit the refusal to the caller
    (`mpi-dp run`, `mpi-dp merge`)."""
    final, partial = Path(final), partial_path(final)
    if final.is_dir():
        raise error(f"output {final} is a directory; give a file path ({option} x.h5)")
    if final.exists() and not overwrite:
        raise error(f"{final} exists: {verb} never replaces a result; pass --overwrite to "
                    f"replace it (the old file stays until the new one is complete) or choose "
                    f"another {option}")
    if partial.exists() and not overwrite:
        raise error(f"{partial} is left by a job or merge that stopped before completing "
                    f"({describe_partial(partial)}); `mpi-dp analyze {partial}` reads what "
                    f"it holds; pass --overwrite to start afresh or choose another {option}")
    parent = final.parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise error(f"cannot create the output directory {parent}: {e.strerror or e}") from None
    if not os.access(parent, os.W_OK):
        raise error(f"cannot write results in {parent} (permission denied); choose another "
                    f"{option}")


def check_resume(final: str | Path) -> None:
    """A resume needs PATH.partial of a stopped job (the lock, held now, says none writes it)."""
    final, partial = Path(final), partial_path(final)
    if not partial.exists():
        what = (f"{final} is complete: nothing to resume" if final.exists()
                else f"nothing to resume: {partial} does not exist")
        raise JobError(f"{what} (a stopped job leaves PATH.partial; run without --resume "
                       "to start)")
    if final.exists():
        raise JobError(f"both {final} and {partial} exist: resuming would replace the complete "
                       f"result; move one away first")
    import h5py

    if partial.is_dir():
        raise JobError(f"cannot resume {partial}: it is a directory, not a stopped job's result "
                       "file; move it away and run without --resume")
    try:
        with h5py.File(partial, "r", locking=False):
            pass
    except OSError as e:
        raise JobError(f"cannot resume {partial}: it is not a readable HDF5 file ({e}); run "
                       "with --overwrite instead of --resume to start afresh") from None


def describe_partial(path: Path) -> str:
    """One line on an unfinished result file: status and where it stopped."""
    try:
        import h5py

        with h5py.File(path, "r", locking=False) as f:
            return progress_text(dict(f.attrs))
    except OSError:
        return "not readable"


def progress_text(attrs: dict[str, Any]) -> str:
    """'status running, configuration 2/4, record 17, last heartbeat ... (pid on host)'."""
    def txt(v: Any) -> str:
        return v.decode() if isinstance(v, bytes) else str(v)

    parts = [f"status {txt(attrs.get('status', 'unknown'))}"]
    if "progress_config" in attrs:
        parts.append(f"configuration {int(attrs['progress_config']) + 1}/"
                     f"{int(attrs.get('n_configs', 0))}, record {int(attrs['progress_record'])}")
    if "heartbeat_unix" in attrs:
        age = time.time() - float(attrs["heartbeat_unix"])
        parts.append(f"last heartbeat {age:.0f} s ago (pid {int(attrs.get('writer_pid', -1))} on "
                     f"{txt(attrs.get('writer_host', '?'))})")
    return ", ".join(parts)


def writer_gone(attrs: dict[str, Any]) -> bool | None:
    """Whether the job that writes a 'running' file is gone: True / False, None if unknown."""
    def txt(v: Any) -> str:
        return v.decode() if isinstance(v, bytes) else str(v)

    if "writer_pid" not in attrs:
        return None
    if txt(attrs.get("writer_host", "")) == socket.gethostname():
        try:
            os.kill(int(attrs["writer_pid"]), 0)
        except ProcessLookupError:
            return True
        except PermissionError:
            return False
        return False
    if "heartbeat_unix" in attrs:
        return time.time() - float(attrs["heartbeat_unix"]) > STALE_AFTER_S
    return None


def reserve_path(final: str | Path) -> Path:
    final = Path(final)
    return final.with_name(final.name + ".reserve")


class SpaceReserve:
    """RESERVE_BYTES allocated in PATH.reserve while a job writes PATH.partial (rank 0): when the
    disk fills, `release` gives them back so that the result file closes cleanly with what was
    complete; removed when the job ends."""

    def __init__(self, final: str | Path, nbytes: int = RESERVE_BYTES) -> None:
        self.path, self.nbytes, self.held = reserve_path(final), nbytes, False

    def hold(self) -> None:
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        except OSError as e:
            raise JobError(f"cannot write beside the result: {self.path}: "
                           f"{e.strerror or e}") from None
        try:
            try:
                os.posix_fallocate(fd, 0, self.nbytes)
            except OSError as e:
                if e.errno not in (errno.EOPNOTSUPP, errno.EINVAL, getattr(errno, "ENOTSUP", -1)):
                    raise
                os.pwrite(fd, bytes(self.nbytes), 0)  # a file system without fallocate
        except OSError as e:
            os.close(fd)
            self.path.unlink(missing_ok=True)
            if e.errno == errno.ENOSPC:
                raise DiskFullError(f"no space left on device for {self.path.parent}: not even "
                                    f"{self.nbytes >> 20} MiB free; free space or choose --out "
                                    "elsewhere") from None
            raise JobError(f"cannot write beside the result: {self.path}: "
                           f"{e.strerror or e}") from None
        os.close(fd)
        self.held = True

    def release(self) -> None:
        if self.held:
            self.path.unlink(missing_ok=True)
            self.held = False


def no_space(e: BaseException | None) -> bool:
    """Whether an exception (or one it was raised from) says the disk is full (ENOSPC; HDF5
    reports it in its message text as errno = 28)."""
    seen = 0
    while e is not None and seen < 8:
        if isinstance(e, DiskFullError) or isinstance(e, OSError) and e.errno == errno.ENOSPC:
            return True
        text = str(e)
        if f"errno = {errno.ENOSPC}," in text or "No space left on device" in text:
            return True
        e, seen = e.__cause__ or e.__context__, seen + 1
    return False


def quiet_full_disk_deallocs() -> None:
    """h5py closes a dataset when its Python object goes away and can only report a failed
    write there as an 'Exception ignored' traceback; on a full disk that is the error the job
    reports once, in one line (runner), so these are not printed. Any other stays printed."""
    default = sys.unraisablehook
    if getattr(default, "_mpi_dp", False):
        return

    def hook(u: Any) -> None:
        if not no_space(u.exc_value):
            default(u)

    hook._mpi_dp = True  # type: ignore[attr-defined]
    sys.unraisablehook = hook
