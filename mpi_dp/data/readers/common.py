"""What the readers share: the `Table` they return, opening, hashing and decompressing files,
and reading members of .zip/.tar archives.

Every format module builds its `Table` (or, for MovieLens, its own record) from these pieces, so
that every reader records its files the same way (path, size, sha256) and refuses a missing,
corrupt or HDF5 file with the same `DataError` messages.
"""

from __future__ import annotations

import bz2
import dataclasses
import gzip
import hashlib
import lzma
import tarfile
import zipfile
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse

from mpi_dp.errors import DataError

_COMPRESSION: dict[str, tuple[str, Callable[..., Any]]] = {
    ".gz": ("gzip", gzip.open), ".bz2": ("bzip2", bz2.open), ".xz": ("xz", lzma.open)}
_DECOMPRESS_ERRORS = (EOFError, OSError, lzma.LZMAError, zlib.error)


@dataclasses.dataclass
class Table:
    """Records read from one source, before preprocessing and partitioning."""

    X: np.ndarray | scipy.sparse.csr_matrix  # float64 (n, p)
    y: np.ndarray  # float64 (n,)
    feature_names: list[str]  # length p
    target: str  # name of the target column / label
    keys: dict[str, np.ndarray]  # per-record key columns kept aside (not features), each length n
    info: dict[str, Any]  # JSON-serialisable provenance and decisions
    #: what a CSV read fitted (format, features, levels, fill values), for `read_csv_test`
    fitted: dict[str, Any] = dataclasses.field(default_factory=dict)


# ----------------------------------------------------------------------------------------------
# files


def sha256_file(path: str | Path) -> str:
    """Hex sha256 of a file's bytes as stored on disk (compressed files are hashed compressed)."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _file_record(path: Path) -> dict[str, Any]:
    return {"path": str(path.resolve()), "size": path.stat().st_size, "sha256": sha256_file(path)}


def _require_file(path: Path) -> None:
    if not path.exists():
        raise DataError(f"{path}: no such file")
    if not path.is_file():
        raise DataError(f"{path}: is not a regular file")


#: the first bytes of every HDF5 file
_HDF5_SIGNATURE = b"\x89HDF\r\n\x1a\n"


def _require_text_file(path: Path, kind: str) -> None:
    """_require_file, and refuse an HDF5 file (a shard or result file) given as `kind` text."""
    _require_file(path)
    try:
        with open(path, "rb") as fh:
            head = fh.read(len(_HDF5_SIGNATURE))
    except OSError as exc:
        raise DataError(f"{path}: cannot read file ({exc.strerror or exc})") from None
    if head == _HDF5_SIGNATURE:
        raise DataError(f"{path}: is an HDF5 file, not {kind} text (a shard file is prepared "
                        "already: give it to a job as data = \"...\")")


def _read_bytes(path: Path) -> bytes:
    """The decompressed content of `path` (.gz, .bz2, .xz by suffix; plain otherwise)."""
    _require_file(path)
    kind, opener = _COMPRESSION.get(path.suffix.lower(), (None, None))
    try:
        if opener is None:
            return path.read_bytes()
        with opener(path, "rb") as fh:
            return fh.read()
    except _DECOMPRESS_ERRORS as exc:
        if kind is None:
            raise DataError(f"{path}: cannot read file ({exc})") from None
        raise DataError(f"{path}: truncated or corrupt {kind} file ({exc})") from None


def _decode(data: bytes) -> tuple[str, str]:
    """Text from bytes: UTF-8 (a BOM is dropped), else Latin-1, which never fails."""
    try:
        return data.decode("utf-8-sig"), "utf-8"
    except UnicodeDecodeError:
        return data.decode("latin-1"), "latin-1"


# ----------------------------------------------------------------------------------------------
# archives (LEAF, MovieLens, CSV members)


def _archive_kind(path: Path) -> str | None:
    name = path.name.lower()
    if name.endswith(".zip"):
        return "zip"
    if name.endswith((".tar", ".tar.gz", ".tgz", ".tar.xz", ".txz", ".tar.bz2", ".tbz2")):
        return "tar"
    return None


def _iter_archive(path: Path, wanted: Callable[[str], bool]) -> Iterator[tuple[str, bytes]]:
    """(member name, bytes) of regular members accepted by `wanted`, read in archive order."""
    try:
        if _archive_kind(path) == "zip":
            with zipfile.ZipFile(path) as zf:
                for m in zf.infolist():
                    if not m.is_dir() and wanted(m.filename):
                        yield m.filename, zf.read(m)
        else:
            with tarfile.open(path, "r:*") as tf:
                for member in tf:
                    if member.isfile() and wanted(member.name):
                        fh = tf.extractfile(member)
                        if fh is not None:
                            yield member.name, fh.read()
    except (tarfile.TarError, zipfile.BadZipFile, *_DECOMPRESS_ERRORS) as exc:
        raise DataError(f"{path}: truncated or corrupt archive ({type(exc).__name__}: {exc})") from None


def _junk(name: str) -> bool:
    parts = Path(name).parts
    return "__MACOSX" in parts or Path(name).name.startswith("._")
