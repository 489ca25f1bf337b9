"""Where a result came from: package, git revision, MPI library, ranks, hosts, versions, times."""

from __future__ import annotations

import datetime
import hashlib
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import scipy

from .. import __version__


def git_revision() -> str:
    """The git revision of the package's checkout ('+dirty' if modified), or '' outside git."""
    root = Path(__file__).resolve().parents[2]
    try:
        rev = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True,
                             text=True, timeout=5)
        if rev.returncode != 0:
            return ""
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--", "mpi_dp"],
                               capture_output=True, text=True, timeout=5)
        return rev.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return ""


def versions() -> dict[str, str]:
    """Versions of the libraries a result depends on (petsc4py only if installed)."""
    out = {"mpi_dp": __version__, "python": platform.python_version(), "numpy": np.__version__,
           "scipy": scipy.__version__, "h5py": h5py.__version__, "hdf5": h5py.version.hdf5_version}
    try:
        import mpi4py
        from mpi4py import MPI

        out["mpi4py"] = mpi4py.__version__
        # some MPIs (Open MPI builds) pad the string with NULs, which HDF5 strings refuse
        out["mpi_library"] = (MPI.Get_library_version().replace("\x00", "").strip()
                              .splitlines() or [""])[0]
        out["mpi_standard"] = "{}.{}".format(*MPI.Get_version())
    except ImportError:  # pragma: no cover - mpi4py is a dependency
        out["mpi4py"] = "not installed"
    try:
        from importlib.metadata import version

        out["dp_accounting"] = version("dp-accounting")
    except Exception:  # noqa: BLE001 - metadata of an odd install: say so, never fail a run
        out["dp_accounting"] = "unknown"
    try:
        import petsc4py

        out["petsc4py"] = petsc4py.__version__
    except ImportError:
        out["petsc4py"] = "not installed"
    return out


def sha256(path: str | Path, chunk: int = 1 << 22) -> str:
    """The SHA-256 of a file (the shard a result was computed from: which bytes, not which name)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def collect(n_ranks: int, hosts: list[str], seed: int, extra: dict[str, Any] | None = None
            ) -> dict[str, Any]:
    info: dict[str, Any] = dict(versions())
    info.update(
        git_revision=git_revision(),
        n_ranks=n_ranks,
        hosts=",".join(sorted(set(hosts))),
        seed=seed,
        command=" ".join(sys.argv),
        start_time=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    )
    if extra:
        info.update(extra)
    return info
