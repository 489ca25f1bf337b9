"""Reading shard files (the layout is in `shard_format`): `ShardFile`.

A `ShardFile` opens read-only without HDF5 file locking, so many MPI ranks can read one file on a
network filesystem; opening checks the format and the owners' layout but reads no records, and
each rank reads only its own agents (a CSR prefix read touches only the first n + 1 entries of
indptr and the matching data/indices). Both layouts are read: "blocks" (format_version 2, every
owner's records in one X) and "groups" (format_version 1, one group per owner).

In the block layout a rank's block of owners is read in a few large reads (`read_agents`,
`read_agents_test`, `check_finite`, `check_agents`, `sizes`: the offsets are read once, at open),
in slices of at most `READ_BYTES`, and each owner gets its own arrays (copies, so an owner's
arrays are laid out in memory as a read of that owner alone lays them out). In the group layout
sizes, agent checks and dense reads take fast paths through h5py's low-level API where the layout
is the plain dense one (else the high-level path, which names any problem). `check_finite` keeps
the records it read (up to `KEEP_BYTES`) so that the run does not read them twice.
"""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, cast

import h5py
import numpy as np
import scipy.sparse as sp

from mpi_dp.data.shard_format import (
    FORMAT,
    FORMAT_VERSION,
    LAYOUTS,
    META_SUFFIX,
    RESERVED_ATTRS,
    STORAGES,
    TASKS,
    ArrayPair,
    Matrix,
    stored_meta,
)
from mpi_dp.errors import ShardError

#: Bytes of owners' records a rank keeps in memory after `check_finite` (read once, not twice)
KEEP_BYTES = 512 * 2**20
#: Bytes of owners' records read at a time from a block layout (a rank's owners in a few reads)
READ_BYTES = 64 * 2**20


#: What each task's labels must be (the writer's rule, `shard_writer`): a binary shard's -1/+1 are
#: what the logistic and hinge losses read (y x.theta), a multiclass shard's the class indices
LABEL_RULES = {
    "binary": "a binary shard's labels must be -1 or +1 (0/1 labels: write the file with "
              "mpi-dp data prepare --task binary, which maps them)",
    "multiclass": "a multiclass shard's labels must be class indices 0, 1, 2, ...",
}


def label_problem(task: str, y: np.ndarray) -> int | None:
    """The index of the first label in `y` that the task does not allow (None: all fine);
    regression takes any finite value."""
    if task == "binary":
        bad = (y != 1.0) & (y != -1.0)
    elif task == "multiclass":
        bad = (y < 0) | (y != np.floor(y))
    else:
        return None
    return int(np.flatnonzero(bad)[0]) if bad.any() else None


# ----------------------------------------------------------------------------------------------
# reading


def _open_readonly(path: pathlib.Path) -> h5py.File:
    """Open read-only without HDF5 file locking where h5py supports it (safe for many ranks)."""
    try:
        return h5py.File(path, "r", locking=False)
    except TypeError:  # h5py < 3.5 has no `locking` argument
        return h5py.File(path, "r")


def _plain(value: Any) -> Any:
    """An HDF5 attribute value as a plain Python value (str, int, float, bool or list)."""
    if isinstance(value, bytes):
        return value.decode("utf-8")
    if isinstance(value, np.ndarray):
        return [_plain(v) for v in value.tolist()]
    if isinstance(value, np.generic):
        return value.item()
    return value


def _attr_read(obj: h5py.h5g.GroupID, name: bytes) -> np.ndarray:
    """Read attribute `name` of a low-level object (raises KeyError when it is absent)."""
    if not h5py.h5a.exists(obj, name):
        raise KeyError(name)
    a = h5py.h5a.open(obj, name)
    out = np.empty(a.shape, dtype=a.dtype)
    a.read(out)
    return out


class ShardFile:
    """A read-only view of a shard file; a context manager, or call `close()` when done.

    Opening checks the format and the owners' layout (every agent group, or the offsets of the
    block layout and the shapes of its arrays), but reads no records: each rank reads only the
    agents it hosts, with `read_agents` (a block of owners in a few reads) or `read_agent`. In a
    CSR file (`is_sparse`) every X is returned as a scipy.sparse.csr_matrix with sorted indices,
    otherwise as a float64 array.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self._path = pathlib.Path(path)
        if self._path.is_dir():
            raise ShardError(f"shard file '{self._path}' is a directory; give the HDF5 shard file "
                             "(one that mpi-dp data synth or mpi-dp data prepare wrote)")
        if not self._path.is_file():
            raise ShardError(f"shard file '{self._path}' not found")
        try:
            self._f = _open_readonly(self._path)
            self._agents_gid: h5py.h5g.GroupID | None = None
            #: owners' records kept (read-only) after `check_finite`, so they are read once
            self._kept: dict[int, ArrayPair] = {}
            self._kept_test: dict[int, ArrayPair] = {}
            # per-agent lookups, each made once (a group lookup costs ~90 us: thousands of
            # agents are checked, validated and read in several passes)
            self._groups: dict[int, h5py.Group] = {}
            self._sizes: dict[int, int] = {}
            self._tests: dict[int, bool] = {}
            # block layout: row offsets of the owners' records and held-out records (read once,
            # at open), low-level datasets, and each extra array's layout, offsets and owners
            self._off: np.ndarray | None = None
            self._toff: np.ndarray | None = None
            self._dsets: dict[str, h5py.h5d.DatasetID] = {}
            self._extras: dict[str, tuple[str, np.ndarray | None, np.ndarray]] | None = None
        except OSError as exc:
            raise ShardError(
                f"shard file '{self._path}' is not a readable HDF5 file ({exc}); a CSV or LIBSVM "
                "file becomes a shard file with mpi-dp data prepare csv|libsvm FILE"
            ) from None
        try:
            with self._reading("its root attributes, /meta or agent groups"):
                self._attrs = {k: _plain(v) for k, v in self._f.attrs.items()}
                for k, v in stored_meta(self._f).items():  # feature names, large writer attrs
                    if k not in self._attrs and (k == "feature_names" or k not in RESERVED_ATTRS):
                        self._attrs[k] = _plain(v)
                self._validate_root()
        except BaseException:
            self._f.close()
            raise

    def _fail(self, problem: str) -> ShardError:
        return ShardError(f"shard file '{self._path}': {problem}")

    @contextlib.contextmanager
    def _reading(self, what: str) -> Iterator[None]:
        """HDF5's own errors while reading `what` (damaged metadata or data: OSError,
        RuntimeError, and the KeyError h5py raises when an object it lists cannot be opened) as
        a ShardError naming the file. Callers test for what may be absent before opening it."""
        try:
            yield
        except (OSError, RuntimeError, KeyError) as exc:
            why = exc.args[0] if isinstance(exc, KeyError) and exc.args else exc
            raise self._fail(f"is damaged: {what} cannot be read ({why}); write the file again "
                             "(mpi-dp data prepare / mpi-dp data synth)") from None

    def _validate_root(self) -> None:
        fmt = self._attrs.get("format")
        if fmt != FORMAT:
            raise self._fail(f"format attribute is {fmt!r}, expected {FORMAT!r}")
        version = self._attrs.get("format_version")
        if not isinstance(version, int) or version > FORMAT_VERSION or version < 1:
            raise self._fail(
                f"format_version {version!r} is not supported (this reader knows {FORMAT_VERSION})"
            )
        for key in ("n_agents", "n_features"):
            if not isinstance(self._attrs.get(key), int) or self._attrs[key] < 1:
                raise self._fail(f"root attribute {key!r} is missing or not a positive integer")
        if self._attrs.get("task") not in TASKS:
            raise self._fail(f"task {self._attrs.get('task')!r} is not one of {list(TASKS)}")
        if self._attrs.get("storage", "dense") not in STORAGES:
            raise self._fail(f"storage {self._attrs.get('storage')!r} is not one of "
                             f"{list(STORAGES)}")
        if "agents" not in self._f:
            raise self._fail("has no /agents group")
        if self.layout == "blocks":
            self._validate_blocks()
            return
        present = set(self._f["agents"].keys())
        missing = [i for i in range(self.n_agents) if str(i) not in present]
        if missing:
            shown = ", ".join(map(str, missing[:10])) + (" ..." if len(missing) > 10 else "")
            raise self._fail(f"{len(missing)} of {self.n_agents} agent groups missing: {shown}")

    def _validate_blocks(self) -> None:
        """The block layout's offsets (read, checked) and the shapes and dtypes of its X and y,
        of its held-out records where present, reading no records."""
        g = self._f["agents"]
        self._off = self._read_offsets(g, "offsets")
        self._check_block_pair(g, "", int(self._off[-1]), "offsets")
        if "test_offsets" in g or "X_test" in g or "y_test" in g:
            if "test_offsets" not in g:
                raise self._fail("has /agents/X_test or y_test but no /agents/test_offsets (the "
                                 "owners' ranges of held-out records)")
            self._toff = self._read_offsets(g, "test_offsets")
            self._check_block_pair(g, "_test", int(self._toff[-1]), "test_offsets")

    def _read_offsets(self, g: h5py.Group, name: str) -> np.ndarray:
        """<g>/<name>: n_agents + 1 non-decreasing int64 row offsets from 0 (one read)."""
        n = self.n_agents
        obj = g.get(name)
        where = f"{g.name}/{name}"
        if not isinstance(obj, h5py.Dataset):
            raise self._fail(f"has no {where} dataset (format_version 2 stores owner i's "
                             f"records as rows {name}[i]:{name}[i+1] of /agents/X and y)")
        if obj.shape != (n + 1,) or obj.dtype.kind not in "iu":
            raise self._fail(f"{where} has shape {obj.shape} and dtype {obj.dtype}, "
                             f"expected ({n + 1},) integers (n_agents + 1 row offsets)")
        off = np.empty(n + 1, dtype=np.int64)
        obj.id.read(h5py.h5s.ALL, h5py.h5s.ALL, off)
        if off[0] != 0:
            raise self._fail(f"{where} starts at {off[0]}, expected 0")
        down = np.flatnonzero(off[1:] < off[:-1])
        if down.size:
            k = int(down[0])
            raise self._fail(f"{where} decreases at agent {k} ({off[k]} -> {off[k + 1]}): "
                             "agent ranges must be non-decreasing row offsets")
        return off

    def _check_block_pair(self, g: h5py.Group, suffix: str, rows: int, offsets: str) -> None:
        """/agents/X<suffix> and y<suffix> hold `rows` records (the end of /agents/<offsets>)."""
        what = "the owners' held-out records" if suffix else "the owners' records"
        got = self._check_pair(g, suffix, f"{what} (/agents)")
        if got != rows:
            raise self._fail(f"/agents/X{suffix} has {got} rows but /agents/{offsets} ends at "
                             f"{rows}")

    # -- lifecycle --
    def close(self) -> None:
        """Close the underlying HDF5 file (idempotent)."""
        self._groups.clear()
        self._dsets.clear()
        if self._f.id.valid:
            self._f.close()

    def __enter__(self) -> ShardFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return (
            f"ShardFile('{self._path}', n_agents={self.n_agents}, n_features={self.n_features}, "
            f"task={self.task!r}, storage={self.storage!r})"
        )

    # -- metadata --
    @property
    def path(self) -> pathlib.Path:
        return self._path

    @property
    def n_agents(self) -> int:
        return int(self._attrs["n_agents"])

    @property
    def n_features(self) -> int:
        return int(self._attrs["n_features"])

    @property
    def task(self) -> str:
        return str(self._attrs["task"])

    @property
    def storage(self) -> str:
        """How X is stored: "dense" or "csr" (files without the attribute are dense)."""
        return str(self._attrs.get("storage", "dense"))

    @property
    def is_sparse(self) -> bool:
        """Whether every X in the file is CSR (read back as scipy.sparse.csr_matrix)."""
        return self.storage == "csr"

    @property
    def layout(self) -> str:
        """How the owners are stored: "blocks" (format_version 2: every owner's records in one X,
        rows by /agents/offsets) or "groups" (format_version 1: one group per owner)."""
        return LAYOUTS[int(self._attrs["format_version"])]

    @property
    def feature_names(self) -> list[str] | None:
        """The column names: /meta/feature_names, or the root attribute of older files."""
        names = self._attrs.get("feature_names")
        return None if names is None else [str(s) for s in names]

    @property
    def source(self) -> str:
        return str(self._attrs.get("source", ""))

    @property
    def attrs(self) -> dict[str, Any]:
        """All root attributes and /meta datasets (feature_names, writer attrs too large for an
        attribute) as plain Python values (writer dict/list attrs stay JSON strings)."""
        return dict(self._attrs)

    def json_attr(self, key: str) -> Any:
        """A writer attr that was stored as JSON (a dict or list), decoded (attribute or /meta)."""
        if key not in self._attrs:
            raise self._fail(f"has no attribute {key!r}")
        try:
            return json.loads(self._attrs[key])
        except (TypeError, ValueError):
            raise self._fail(f"attribute {key!r} is not JSON") from None

    # -- matrices --
    def _read_matrix(self, parent: h5py.Group, name: str, what: str, n: int | None = None,
                     start: int = 0) -> Matrix:
        """Dataset or CSR group `name` of `parent` (rows start:n if n is given, else start:)."""
        obj = parent.get(name)
        if obj is None:
            raise self._fail(f"{what}: dataset {name} missing")
        if isinstance(obj, h5py.Dataset):
            return np.asarray(obj[start:] if n is None else obj[start:n], dtype=np.float64)
        shape = self._csr_shape(obj, what, name)
        rows = (shape[0] if n is None else n) - start
        try:
            indptr = np.asarray(obj["indptr"][start: start + rows + 1], dtype=np.int64)
            if indptr.shape != (rows + 1,):
                raise ValueError(f"indptr has {indptr.shape[0]} entries, expected {rows + 1}")
            lo, hi = int(indptr[0]), int(indptr[-1])
            data = np.asarray(obj["data"][lo:hi], dtype=np.float64)
            indices = np.asarray(obj["indices"][lo:hi])
            X = sp.csr_matrix((data, indices, indptr - lo), shape=(rows, shape[1]))
        except (KeyError, ValueError) as exc:
            raise self._fail(f"{what}: CSR group {name} is inconsistent ({exc})") from None
        X.sum_duplicates()  # O(nnz) check only: the writer stores canonical CSR (sorted indices)
        return X

    def _csr_shape(self, obj: h5py.Group, what: str, name: str) -> tuple[int, int]:
        if _plain(obj.attrs.get("format")) != "csr" or "shape" not in obj.attrs:
            raise self._fail(f"{what}: {name} is a group but not a CSR matrix (format/shape attrs)")
        shape = tuple(int(v) for v in np.asarray(obj.attrs["shape"]).ravel())
        if len(shape) != 2:
            raise self._fail(f"{what}: CSR {name} has shape attribute {shape}, expected (n, p)")
        return shape

    def _check_matrix(self, parent: h5py.Group, name: str, what: str) -> int:
        """Check X `name` (dense or CSR, as the file's storage says) reading no records; rows."""
        p = self.n_features
        obj = parent[name]
        if isinstance(obj, h5py.Dataset):
            if self.is_sparse:
                raise self._fail(f"{what}: {name} is dense in a file with storage 'csr'")
            if obj.ndim != 2 or obj.shape[1] != p:
                raise self._fail(f"{what}: {name} has shape {obj.shape}, expected (n, {p})")
            if obj.dtype != np.float64:
                raise self._fail(f"{what}: {name} is not float64")
            return int(obj.shape[0])
        if not self.is_sparse:
            raise self._fail(f"{what}: {name} is CSR in a file with storage 'dense'")
        n, cols = self._csr_shape(obj, what, name)
        if cols != p:
            raise self._fail(f"{what}: {name} has shape {(n, cols)}, expected (n, {p})")
        for key in ("data", "indices", "indptr"):
            if not isinstance(obj.get(key), h5py.Dataset) or obj[key].ndim != 1:
                raise self._fail(f"{what}: CSR {name}/{key} missing or not 1-D")
        if obj["indptr"].shape[0] != n + 1:
            raise self._fail(f"{what}: CSR {name}/indptr has {obj['indptr'].shape[0]} entries, "
                             f"expected {n + 1}")
        nnz = int(obj["indptr"][n])
        if obj["data"].shape[0] != nnz or obj["indices"].shape[0] != nnz:
            raise self._fail(f"{what}: CSR {name}/data and indices need {nnz} entries (indptr)")
        if obj["data"].dtype != np.float64 or obj["indices"].dtype.kind != "i":
            raise self._fail(f"{what}: CSR {name}/data is not float64 or indices not integer")
        return n

    def _check_pair(self, parent: h5py.Group, suffix: str, what: str) -> int:
        xk, yk = "X" + suffix, "y" + suffix
        if xk not in parent or yk not in parent:
            raise self._fail(f"{what}: dataset {xk if xk not in parent else yk} missing")
        rows = self._check_matrix(parent, xk, what)
        y = parent[yk]
        if not isinstance(y, h5py.Dataset) or y.shape != (rows,):
            shape = getattr(y, "shape", None)
            raise self._fail(f"{what}: {yk} has shape {shape} but {xk} has {rows} rows")
        if y.dtype != np.float64:
            raise self._fail(f"{what}: {xk}/{yk} are not float64")
        return rows

    # -- agents --
    def _group(self, i: int) -> h5py.Group:
        i = self._id(i)
        g = self._groups.get(i)
        if g is not None:
            return g
        g = self._f["agents"].get(str(i))
        if not isinstance(g, h5py.Group):
            raise self._fail(f"agent {i} group /agents/{i} is missing")
        self._groups[i] = g
        return g

    def _id(self, i: int) -> int:
        """Agent id i as an int, checked in range."""
        i = int(i)
        if not 0 <= i < self.n_agents:
            raise self._fail(f"agent {i} out of range (the file has agents 0..{self.n_agents - 1})")
        return i

    def _ids(self, ids: Iterable[int] | None) -> np.ndarray:
        """`ids` (default: all agents) as int64, each checked in range (the first one out of
        range named)."""
        if ids is None:
            return np.arange(self.n_agents, dtype=np.int64)
        if isinstance(ids, range):
            out = np.arange(ids.start, ids.stop, ids.step, dtype=np.int64)
        else:
            out = np.array([int(i) for i in ids], dtype=np.int64)
        bad = np.flatnonzero((out < 0) | (out >= self.n_agents))
        if bad.size:
            self._id(int(out[bad[0]]))
        return out

    @property
    def _blocks(self) -> bool:
        return self._off is not None

    def _size(self, i: int) -> int:
        i = int(i)
        if self._off is not None:
            i = self._id(i)
            return int(self._off[i + 1] - self._off[i])
        n = self._sizes.get(i)
        if n is None and i not in self._groups and 0 <= i < self.n_agents:
            try:  # the low-level API: a tenth of the high-level lookup (sizes of every agent)
                if self._agents_gid is None:
                    self._agents_gid = self._f["agents"].id
                raw = np.asarray(_attr_read(h5py.h5g.open(
                    self._agents_gid, str(i).encode()), b"n")).ravel()
                # anything but one non-negative integer: the slow path below names the problem
                if raw.size == 1 and raw.dtype.kind in "iu" and raw[0] >= 0:
                    n = self._sizes[i] = int(raw[0])
            except (KeyError, ValueError, OSError, TypeError, IndexError):
                n = None
        if n is None:
            g = self._group(i)
            if "n" not in g.attrs:
                raise self._fail(f"agent {i} has no 'n' attribute")
            raw = np.asarray(g.attrs["n"]).ravel()
            if raw.size != 1 or raw.dtype.kind not in "iu" or raw[0] < 0:
                raise self._fail(f"agent {i}: attribute n = {_plain(g.attrs['n'])!r} is not a "
                                 "record count (a non-negative integer)")
            n = self._sizes[i] = int(raw[0])
        return n

    def check_sizes(self, sizes: Iterable[int] | None = None) -> None:
        """ShardError naming every owner that holds no records (`sizes`: every agent's n_i, as
        `sizes()` reads them); the format needs at least one record per owner."""
        sizes = self.sizes() if sizes is None else np.asarray(sizes)
        empty = np.flatnonzero(np.asarray(sizes) == 0)
        if empty.size:
            shown = ", ".join(map(str, empty[:10].tolist())) + (" ..." if empty.size > 10 else "")
            one = empty.size == 1
            who = (f"owner {shown} holds" if one else
                   f"{empty.size} of its {self.n_agents} owners hold")
            raise self._fail(f"{who} no records (n = 0{'' if one else ': ' + shown}); every "
                             f"owner needs at least one record: drop {'it' if one else 'them'} "
                             "from the file or repartition the data into fewer owners (mpi-dp "
                             "data prepare ... --agents N)")

    def sizes(self, ids: Iterable[int] | None = None) -> np.ndarray:
        """Record counts n_i (int64) of `ids` (default: all agents), from the block layout's
        offsets (read at open) or the groups' attributes; no records are read."""
        if self._off is not None:
            a = self._ids(ids)
            return self._off[a + 1] - self._off[a]
        ids = range(self.n_agents) if ids is None else ids
        return np.array([self._size(i) for i in ids], dtype=np.int64)

    def _prefix(self, i: int, n: int | None) -> int:
        available = self._size(i)
        n = available if n is None else int(n)
        if n < 0:
            raise self._fail(f"agent {i}: cannot read a negative number of records ({n})")
        if n > available:
            raise self._fail(f"agent {i}: asked for n={n} records but only {available} available")
        return n

    def _prefixes(self, ids: np.ndarray, n: int | Sequence[int] | np.ndarray | None
                  ) -> np.ndarray:
        """Records to read of each of `ids`: all (None), the same n, or one n per agent; checked
        as `read_agent` checks them (the first bad one named)."""
        sizes = self.sizes(ids)
        if n is None:
            return sizes
        if np.ndim(n) == 0:
            want = np.full(ids.shape, int(n), dtype=np.int64)  # type: ignore[arg-type]
        else:
            want = np.array([int(k) for k in n], dtype=np.int64)  # type: ignore[union-attr]
            if want.shape != ids.shape:
                raise self._fail(f"{want.size} record counts given for {ids.size} agents")
        bad = np.flatnonzero((want < 0) | (want > sizes))
        if bad.size:
            k = int(bad[0])
            self._prefix(int(ids[k]), int(want[k]))
        return want

    # -- block layout: a rank's owners in a few large reads --
    def _dset(self, name: str) -> h5py.h5d.DatasetID:
        """Low-level /agents/<name> of the block layout, opened once."""
        d = self._dsets.get(name)
        if d is None:
            d = self._dsets[name] = h5py.h5d.open(self._f["agents"].id, name.encode())
        return d

    def _dense_rows(self, name: str, lo: int, hi: int) -> np.ndarray:
        """Rows lo:hi of the block layout's float64 dataset /agents/<name> (one read)."""
        d = self._dset(name)
        count = (hi - lo,) + tuple(d.shape[1:])
        out = np.empty(count)
        if hi > lo:
            space = d.get_space()
            space.select_hyperslab((lo,) + (0,) * (len(count) - 1), count)
            d.read(h5py.h5s.create_simple(count), space, out)
        return out

    def _csr_rows(self, suffix: str, lo: int, hi: int
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """indptr (int64, hi - lo + 1 entries), data and indices of rows lo:hi of the block
        layout's CSR X<suffix> (data and indices from entry indptr[0] on)."""
        g = self._f["agents"]["X" + suffix]
        indptr = np.asarray(g["indptr"][lo: hi + 1], dtype=np.int64)
        if indptr.shape != (hi - lo + 1,):
            raise self._fail(f"/agents/X{suffix}: CSR indptr has {indptr.shape[0]} entries from "
                             f"row {lo}, expected {hi - lo + 1}")
        a, b = int(indptr[0]), int(indptr[-1])
        return indptr, np.asarray(g["data"][a:b], dtype=np.float64), np.asarray(g["indices"][a:b])

    def _csr_part(self, raw: tuple[np.ndarray, np.ndarray, np.ndarray], r0: int, r1: int,
                  what: str) -> sp.csr_matrix:
        """Rows r0:r1 of a `_csr_rows` read as their own canonical CSR matrix (as a read of those
        rows alone builds it)."""
        indptr, data, indices = raw
        ip = indptr[r0: r1 + 1]
        lo, hi = int(ip[0]) - int(indptr[0]), int(ip[-1]) - int(indptr[0])
        try:
            X = sp.csr_matrix((data[lo:hi].copy(), indices[lo:hi].copy(), ip - int(ip[0])),
                              shape=(r1 - r0, self.n_features))
        except ValueError as exc:
            raise self._fail(f"{what}: CSR rows are inconsistent ({exc})") from None
        X.sum_duplicates()  # O(nnz) check only: the writer stores canonical CSR (sorted indices)
        return X

    def _indptr_at(self, suffix: str, rows: np.ndarray) -> np.ndarray:
        """Entries at `rows` (sorted) of the block layout's CSR X<suffix>/indptr, read in
        slices of at most READ_BYTES."""
        ds = self._f["agents"]["X" + suffix]["indptr"]
        out = np.empty(rows.shape, dtype=np.int64)
        step = max(1, READ_BYTES // 8)
        k = 0
        while k < rows.size:
            j = max(k + 1, int(np.searchsorted(rows, rows[k] + step, side="left")))
            lo, hi = int(rows[k]), int(rows[j - 1]) + 1
            piece = np.asarray(ds[lo:hi], dtype=np.int64)
            if piece.shape != (hi - lo,):
                raise self._fail(f"/agents/X{suffix}: CSR indptr has {lo + piece.shape[0]} "
                                 f"entries, expected at least {hi}")
            out[k:j] = piece[rows[k:j] - lo]
            k = j
        return out

    def _spans(self, ids: np.ndarray, n: np.ndarray, off: np.ndarray, suffix: str
               ) -> Iterator[tuple[int, int]]:
        """[k, j) slices of `ids` (sorted, unique) whose records are read together: consecutive
        ids, at most READ_BYTES from the first one's start to the last one's prefix (one owner
        at least). CSR counts its entries (16 bytes) and rows (16 bytes: indptr and y)."""
        starts, ends = off[ids], off[ids] + n
        if self.is_sparse:
            rows = np.concatenate([starts, ends])
            order = np.argsort(rows, kind="stable")
            at = np.empty_like(rows)
            at[order] = self._indptr_at(suffix, rows[order])
            first, last = at[: ids.size].tolist(), at[ids.size:].tolist()
            row_bytes, entry_bytes = 16, 16
        else:
            first = last = [0] * ids.size
            row_bytes, entry_bytes = 8 * (self.n_features + 1), 0
        s, e, idl = starts.tolist(), ends.tolist(), ids.tolist()
        k = 0
        while k < len(idl):
            j = k + 1
            while (j < len(idl) and idl[j] == idl[j - 1] + 1
                   and (e[j] - s[k]) * row_bytes + (last[j] - first[k]) * entry_bytes
                   <= READ_BYTES):
                j += 1
            yield k, j
            k = j

    def _read_many(self, ids: np.ndarray, n: np.ndarray, test: bool
                   ) -> Iterator[tuple[np.ndarray, np.ndarray, list[ArrayPair], np.ndarray]]:
        """Per span of `_spans`: its ids, the values read (X, or CSR data), each owner's (X, y)
        of its first n rows (its own arrays: copies of the span) and the labels read."""
        off = self._toff if test else self._off
        assert off is not None
        suffix = "_test" if test else ""
        for k, j in self._spans(ids, n, off, suffix):
            lo, hi = int(off[ids[k]]), int(off[ids[j - 1]] + n[j - 1])
            what = (f"owner {int(ids[k])}'s" if j == k + 1 else
                    f"owners {int(ids[k])}..{int(ids[j - 1])}'s") + (" held-out" if test else "")
            with self._reading(f"{what} records (/agents/X{suffix}, rows {lo}:{hi})"):
                y = self._dense_rows("y" + suffix, lo, hi)
                if self.is_sparse:
                    raw = self._csr_rows(suffix, lo, hi)
                    values = raw[1]
                else:
                    X = values = self._dense_rows("X" + suffix, lo, hi)
            parts: list[ArrayPair] = []
            for t in range(k, j):
                r0 = int(off[ids[t]]) - lo
                r1 = r0 + int(n[t])
                if self.is_sparse:
                    Xi: Matrix = self._csr_part(raw, r0, r1, f"agent {int(ids[t])}")
                elif j == k + 1:  # the span is this owner's alone: its own arrays already
                    Xi, yi = X, y
                else:
                    Xi = X[r0:r1].copy()
                yi = y if j == k + 1 else y[r0:r1].copy()
                parts.append((Xi, yi))
            yield ids[k:j], values, parts, y

    def read_agents(self, ids: Iterable[int], n: int | Sequence[int] | np.ndarray | None = None
                    ) -> list[ArrayPair]:
        """Owners' (X, y) in the order of `ids`, each as `read_agent(i, n_i)` returns it (n:
        None for all records, one prefix length for every owner, or one per owner). A block of
        consecutive ids (a rank's owners) is read in a few large reads in the block layout."""
        a = self._ids(ids)
        want = self._prefixes(a, n)
        if self._off is None:
            return [self.read_agent(int(i), int(k)) for i, k in zip(a, want, strict=True)]
        got: dict[int, ArrayPair] = {}
        todo: dict[int, int] = {}
        for i, k in zip(a.tolist(), want.tolist(), strict=True):
            kept = self._kept.get(i)
            if kept is None or k > kept[0].shape[0]:
                todo[i] = max(k, todo.get(i, 0))
        if todo:
            u = np.array(sorted(todo), dtype=np.int64)
            for block, _, parts, _ in self._read_many(u, np.array([todo[i] for i in u.tolist()],
                                                                  dtype=np.int64), False):
                got.update(zip(block.tolist(), parts, strict=True))
        out: list[ArrayPair] = []
        full = n is None
        for i, k in zip(a.tolist(), want.tolist(), strict=True):
            kept = self._kept.get(i)
            if kept is not None and k <= kept[0].shape[0]:
                out.append(kept if full else (kept[0][:k], kept[1][:k]))
                continue
            X, y = got[i]
            out.append((X, y) if X.shape[0] == k else (X[:k], y[:k]))
        return out

    def has_tests(self, ids: Iterable[int] | None = None) -> np.ndarray:
        """Whether each of `ids` (default: all) has a held-out test set (bool array)."""
        a = self._ids(ids)
        if self._off is None:
            return np.array([self.has_test(int(i)) for i in a], dtype=bool)
        if self._toff is None:
            return np.zeros(a.shape, dtype=bool)
        return self._toff[a + 1] > self._toff[a]

    def read_agents_test(self, ids: Iterable[int]) -> list[ArrayPair | None]:
        """Owners' held-out (X_test, y_test) in the order of `ids` (None for an owner without
        one), each as `read_agent_test(i)` returns it; a few large reads in the block layout."""
        a = self._ids(ids)
        have = self.has_tests(a)
        if self._off is None:
            return [self.read_agent_test(int(i)) if h else None
                    for i, h in zip(a, have, strict=True)]
        assert self._toff is not None or not have.any()
        todo = sorted({i for i, h in zip(a.tolist(), have.tolist(), strict=True)
                       if h and i not in self._kept_test})
        got: dict[int, ArrayPair] = {}
        if todo:
            u = np.array(todo, dtype=np.int64)
            assert self._toff is not None
            for block, _, parts, _ in self._read_many(u, self._toff[u + 1] - self._toff[u], True):
                got.update(zip(block.tolist(), parts, strict=True))
        return [None if not h else self._kept_test.get(i) or got[i]
                for i, h in zip(a.tolist(), have.tolist(), strict=True)]

    def _read_dense_fast(self, i: int, n: int | None, suffix: str = "") -> ArrayPair | None:
        """Owner i's dense (X, y) (suffix "_test": its test set) through HDF5's low-level API (a
        third of the high-level cost: thousands of owners per rank start in seconds); None when
        anything is not the plain dense float64 layout with n = rows, so that `read_agent` names
        the problem."""
        try:
            if self._agents_gid is None:
                self._agents_gid = self._f["agents"].id
            g = self._groups[int(i)].id if int(i) in self._groups else h5py.h5g.open(
                self._agents_gid, str(int(i)).encode())
            dX = h5py.h5d.open(g, f"X{suffix}".encode())
            dy = h5py.h5d.open(g, f"y{suffix}".encode())
            avail = (int(np.asarray(_attr_read(g, b"n")).ravel()[0]) if not suffix
                     else dX.shape[0])
        except (KeyError, ValueError, OSError, TypeError):
            return None
        rows = avail if n is None else int(n)
        if (dX.dtype != np.float64 or dy.dtype != np.float64 or len(dX.shape) != 2
                or dX.shape[0] != avail or dy.shape != (avail,) or not 0 <= rows <= avail):
            return None
        X = np.empty((rows, dX.shape[1]))
        y = np.empty(rows)
        if rows == avail and rows:
            dX.read(h5py.h5s.ALL, h5py.h5s.ALL, X)
            dy.read(h5py.h5s.ALL, h5py.h5s.ALL, y)
        elif rows:
            for d, out in ((dX, X), (dy, y)):
                space = d.get_space()
                count = (rows,) + tuple(d.shape[1:])
                space.select_hyperslab((0,) * len(count), count)
                d.read(h5py.h5s.create_simple(count), space, out)
        return X, y

    def _read_block_rows(self, i: int, start: int, stop: int, test: bool = False) -> ArrayPair:
        """Owner i's records start:stop (held-out ones with `test`) in the block layout."""
        off = self._toff if test else self._off
        assert off is not None
        suffix = "_test" if test else ""
        lo, hi = int(off[i]) + start, int(off[i]) + stop
        what = f"agent {i}" + (" test set" if test else "")
        with self._reading(f"owner {i}'s{' held-out' if test else ''} records (/agents/X{suffix},"
                           f" rows {lo}:{hi})"):
            y = self._dense_rows("y" + suffix, lo, hi)
            if self.is_sparse:
                return self._csr_part(self._csr_rows(suffix, lo, hi), 0, hi - lo, what), y
            return self._dense_rows("X" + suffix, lo, hi), y

    def read_agent(self, i: int, n: int | None = None) -> ArrayPair:
        """Owner i's (X, y) (X dense float64, or CSR in a sparse file); only the first `n`
        records when n is given (a CSR prefix reads only the entries of those rows)."""
        kept = self._kept.get(int(i))
        if kept is not None and (n is None or 0 <= int(n) <= kept[0].shape[0]):
            return kept if n is None else (kept[0][: int(n)], kept[1][: int(n)])
        if self._off is not None:
            i = self._id(i)
            return self._read_block_rows(i, 0, self._prefix(i, n))
        if not self.is_sparse:
            fast = self._read_dense_fast(i, n)
            if fast is not None:
                return fast
        g = self._group(i)
        n = self._prefix(i, n)
        X = self._read_matrix(g, "X", f"agent {i}", n)
        if "y" not in g:
            raise self._fail(f"agent {i}: dataset y missing")
        return X, np.asarray(g["y"][:n], dtype=np.float64)

    def read_agent_rows(self, i: int, start: int, stop: int) -> ArrayPair:
        """Owner i's records start:stop (a chunk of a stream; CSR reads only those rows)."""
        stop = self._prefix(i, stop)
        if not 0 <= start <= stop:
            raise self._fail(f"agent {i}: bad record range {start}:{stop}")
        if self._off is not None:
            return self._read_block_rows(self._id(i), int(start), stop)
        g = self._group(i)
        X = self._read_matrix(g, "X", f"agent {i}", stop, start)
        return X, np.asarray(g["y"][start:stop], dtype=np.float64)

    def has_test(self, i: int) -> bool:
        """Whether owner i has a held-out test set."""
        if self._off is not None:
            i = self._id(i)
            return self._toff is not None and bool(self._toff[i + 1] > self._toff[i])
        i = int(i)
        t = self._tests.get(i)
        if t is None:
            g = self._group(i)
            t = self._tests[i] = "X_test" in g and "y_test" in g
        return t

    def read_agent_test(self, i: int) -> ArrayPair:
        """Owner i's held-out (X_test, y_test)."""
        kept = self._kept_test.get(int(i))
        if kept is not None:
            return kept
        if not self.has_test(i):
            raise self._fail(f"agent {i} has no test set")
        if self._toff is not None:
            i = int(i)
            return self._read_block_rows(i, 0, int(self._toff[i + 1] - self._toff[i]), True)
        if not self.is_sparse:
            fast = self._read_dense_fast(i, None, "_test")
            if fast is not None:
                return fast
        g = self._group(i)
        return (self._read_matrix(g, "X_test", f"agent {i} test set"),
                np.asarray(g["y_test"][()], np.float64))

    # -- extra arrays --
    def _extra_layouts(self) -> dict[str, tuple[str, np.ndarray | None, np.ndarray]]:
        """Block layout: each extra array's layout ("concat" | "per_agent"), offsets into its
        values (concat) and which owners have it (bool), read and checked once."""
        if self._extras is not None:
            return self._extras
        out: dict[str, tuple[str, np.ndarray | None, np.ndarray]] = {}
        with self._reading("the owners' extra arrays (/agents/extra)"):
            eg = self._f["agents"].get("extra")
            for name in sorted(eg.keys()) if isinstance(eg, h5py.Group) else ():
                g = eg[name]
                where = f"/agents/extra/{name}"
                layout = _plain(g.attrs.get("layout")) if isinstance(g, h5py.Group) else None
                if layout == "per_agent":
                    have = np.zeros(self.n_agents, dtype=bool)
                    for key in g.keys():
                        if not key.isdigit() or int(key) >= self.n_agents:
                            raise self._fail(f"{where} holds {key!r}, not an agent id")
                        have[int(key)] = True
                    out[name] = ("per_agent", None, have)
                    continue
                if layout != "concat":
                    raise self._fail(f"{where} is not an extra array of the block layout "
                                     "(attribute layout 'concat' or 'per_agent')")
                for key in ("values", "offsets", "present"):
                    if not isinstance(g.get(key), h5py.Dataset):
                        raise self._fail(f"{where}/{key} is missing")
                values = g["values"]
                if values.ndim == 0:
                    raise self._fail(f"{where}/values is a scalar, expected an array")
                off = self._read_offsets(eg, f"{name}/offsets")
                if int(off[-1]) != values.shape[0]:
                    raise self._fail(f"{where}/offsets ends at {int(off[-1])} but values has "
                                     f"{values.shape[0]} entries")
                present = g["present"]
                if present.shape != (self.n_agents,):
                    raise self._fail(f"{where}/present has shape {present.shape}, expected "
                                     f"({self.n_agents},)")
                out[name] = ("concat", off, np.asarray(present[()]).astype(bool))
        self._extras = out
        return out

    def agent_extra_names(self, i: int) -> list[str]:
        """Names of owner i's extra arrays (/agents/<i>/extra/<name>), sorted."""
        if self._off is not None:
            i = self._id(i)
            return [name for name, (_, _, have) in self._extra_layouts().items() if have[i]]
        g = self._group(i)
        extra = g.get("extra")
        return sorted(extra.keys()) if isinstance(extra, h5py.Group) else []

    def read_agent_extra(self, i: int, name: str, n: int | None = None) -> np.ndarray:
        """Owner i's extra array `name` (str arrays come back as str); with n, the entries of the
        first n records (not for free-form '_meta' arrays)."""
        names = self.agent_extra_names(i)
        if name not in names:
            raise self._fail(f"agent {i} has no extra array {name!r}; available: {names}")
        if n is not None and name.endswith(META_SUFFIX):
            raise self._fail(f"agent {i}: extra array {name!r} is free-form; it has no prefix")
        count = None if n is None else self._prefix(i, n)
        if self._off is None:
            ds = self._group(i)["extra"][name]
            sel = slice(None) if count is None else slice(0, count)
        else:
            i = int(i)
            layout, off, _ = self._extra_layouts()[name]
            g = self._f["agents"]["extra"][name]
            if layout == "per_agent":
                ds, sel = g[str(i)], slice(None) if count is None else slice(0, count)
            else:
                assert off is not None
                ds = g["values"]
                lo = int(off[i])
                sel = slice(lo, int(off[i + 1]) if count is None else lo + count)
        with self._reading(f"agent {i}'s extra array {name!r}"):
            if h5py.check_string_dtype(ds.dtype) is not None:
                return np.asarray(ds.asstr()[()] if ds.ndim == 0 else ds.asstr()[sel], dtype=str)
            return np.asarray(ds[()] if ds.ndim == 0 else ds[sel])

    # -- checks --
    def check_agents(self, ids: Iterable[int] | None = None) -> None:
        """Check that the records of `ids` (default: all) are consistent, reading no rows: their
        groups (group layout; the block layout's arrays are checked at open) and their extra
        arrays. Raises ShardError naming the file and the first inconsistent agent."""
        if self._off is None:
            for i in range(self.n_agents) if ids is None else ids:
                with self._reading(f"agent {i}'s group /agents/{i}"):
                    self._check_agent(i)
            return
        a = self._ids(ids)
        sizes = self.sizes(a)
        for name, (layout, off, have) in self._extra_layouts().items():
            if name.endswith(META_SUFFIX):
                continue
            g = self._f["agents"]["extra"][name]
            with self._reading(f"/agents/extra/{name}"):
                if layout == "concat":
                    assert off is not None
                    count = off[a + 1] - off[a]
                else:
                    count = np.array([(getattr(g[str(i)], "shape", None) or (-1,))[0]
                                      if have[i] else 0 for i in a.tolist()], dtype=np.int64)
                bad = np.flatnonzero(have[a] & (count != sizes))
                if bad.size:
                    k, i = int(bad[0]), int(a[bad[0]])
                    shape = ((int(count[k]),) + g["values"].shape[1:] if layout == "concat"
                             else getattr(g[str(i)], "shape", None))
                    raise self._fail(f"agent {i}: extra array {name!r} has shape {shape}, "
                                     f"expected {int(sizes[k])} entries")

    def _check_agent(self, i: int) -> None:
        g = self._group(i)
        n = self._size(i)
        if not self.is_sparse and self._dense_agent_ok(g.id, n, self.n_features):
            return
        rows = self._check_pair(g, "", f"agent {i}")
        if rows != n:
            raise self._fail(f"agent {i}: attribute n={n} but X has {rows} rows")
        if "X_test" in g or "y_test" in g:
            self._check_pair(g, "_test", f"agent {i}")
        extra = g.get("extra")
        for name in extra.keys() if isinstance(extra, h5py.Group) else ():
            ds = extra[name]
            if name.endswith(META_SUFFIX):
                continue
            if not isinstance(ds, h5py.Dataset) or ds.ndim == 0 or ds.shape[0] != n:
                raise self._fail(f"agent {i}: extra array {name!r} has shape "
                                 f"{getattr(ds, 'shape', None)}, expected {n} entries")

    @staticmethod
    def _dense_agent_ok(gid: h5py.h5g.GroupID, n: int, d: int) -> bool:
        """Whether an agent group is the plain dense layout (X (n, d), y (n,), optionally
        X_test (m, d) and y_test (m,), all float64, no extra arrays), checked through the
        low-level API; False sends `check_agents` to the slow path, which names any problem."""
        try:
            if gid.links.exists(b"extra"):
                return False
            for suffix, rows in ((b"", n), (b"_test", None)):
                if suffix and not (gid.links.exists(b"X_test") or gid.links.exists(b"y_test")):
                    break
                dX, dy = h5py.h5d.open(gid, b"X" + suffix), h5py.h5d.open(gid, b"y" + suffix)
                rows = dX.shape[0] if rows is None else rows
                if (len(dX.shape) != 2 or dX.shape != (rows, d) or dy.shape != (rows,)
                        or dX.dtype != np.float64 or dy.dtype != np.float64):
                    return False
        except (KeyError, ValueError, OSError, TypeError):
            return False
        return True

    def check_finite(self, ids: Iterable[int] | None = None) -> None:
        """Check that the records of `ids` (default: all) hold no NaN or inf and that their
        labels are the task's (`label_problem`: a binary shard's -1/+1), naming the owner, the
        record and the first bad value (a NaN would otherwise surface deep in the solver as a
        traceback, a label 0.5 would train a classifier on nonsense). Dense records are kept (up
        to KEEP_BYTES) for the run's own read; the block layout reads a block of owners at a
        time (at most READ_BYTES)."""
        if self._off is None:
            budget = KEEP_BYTES
            for i in range(self.n_agents) if ids is None else ids:
                with self._reading(f"owner {i}'s records"):
                    parts = [("", self.read_agent(i))]
                    if self.has_test(i):
                        parts.append(("test ", self.read_agent_test(i)))
                budget = self._keep(int(i), parts[0][1], parts[1][1] if len(parts) > 1 else None,
                                    budget)
                self._raise_if_not_finite(i, parts)
                self._raise_if_bad_labels(i, parts)
            return
        a = self._ids(ids)
        u = np.unique(a)
        bad: set[int] = set()
        bad_labels: set[int] = set()
        budget = KEEP_BYTES
        for test in (False, True):
            off = self._toff if test else self._off
            if off is None:
                continue
            sel = u[off[u + 1] > off[u]] if test else u
            for block, values, pairs, y in self._read_many(sel, off[sel + 1] - off[sel], test):
                if not (np.isfinite(values).all() and np.isfinite(y).all()):
                    bad.update(int(i) for i, (X, yi) in zip(block, pairs, strict=True)
                               if not (np.isfinite(X.data if sp.issparse(X) else X).all()
                                       and np.isfinite(yi).all()))
                if label_problem(self.task, y) is not None:
                    bad_labels.update(int(i) for i, (_, yi) in zip(block, pairs, strict=True)
                                      if label_problem(self.task, yi) is not None)
                for i, pair in zip(block.tolist(), pairs, strict=True):
                    budget = self._keep(i, None if test else pair, pair if test else None,
                                        budget)
        if bad:  # the first bad owner in the order of `ids`, named as the group layout names it
            i = next(int(i) for i in a.tolist() if i in bad)
            parts = [("", self.read_agent(i))]
            if self.has_test(i):
                parts.append(("test ", self.read_agent_test(i)))
            self._raise_if_not_finite(i, parts)
        if bad_labels:
            i = next(int(i) for i in a.tolist() if i in bad_labels)
            parts = [("", self.read_agent(i))]
            if self.has_test(i):
                parts.append(("test ", self.read_agent_test(i)))
            self._raise_if_bad_labels(i, parts)

    def _raise_if_bad_labels(self, i: int, parts: list[tuple[str, ArrayPair]]) -> None:
        """ShardError naming owner i's first label in `parts` that is not of the task."""
        for what, (_, y) in parts:
            r = label_problem(self.task, y)
            if r is not None:
                raise self._fail(f"owner {i}: {what}record {r} has the label {y[r]:g}: "
                                 f"{LABEL_RULES[self.task]}")

    def _keep(self, i: int, pair: ArrayPair | None, test: ArrayPair | None, budget: int) -> int:
        """Keep owner i's dense records (and its dense test set) read-only for the run's own read
        while they fit in `budget` bytes; returns the budget left."""
        if pair is not None:
            X, y = pair
            size = (X.data.nbytes if sp.issparse(X) else X.nbytes) + y.nbytes
            if not sp.issparse(X) and size <= budget:  # kept for the run's own read
                budget -= size
                X.flags.writeable = y.flags.writeable = False
                self._kept[i] = (X, y)
        if test is not None:
            size = sum(v.nbytes for v in test) if not sp.issparse(test[0]) else budget + 1
            if size <= budget:
                budget -= size
                test[0].flags.writeable = test[1].flags.writeable = False
                self._kept_test[i] = test
        return budget

    def _raise_if_not_finite(self, i: int, parts: list[tuple[str, ArrayPair]]) -> None:
        """ShardError naming owner i's first non-finite value in `parts` ((prefix, (X, y)))."""
        for what, (X, y) in parts:
            data = X.data if sp.issparse(X) else X
            if not np.all(np.isfinite(data)):
                if sp.issparse(X):
                    coo = cast(sp.csr_matrix, X).tocoo()
                    k = int(np.flatnonzero(~np.isfinite(coo.data))[0])
                    r, c = int(coo.row[k]), int(coo.col[k])
                else:
                    r, c = (int(v) for v in np.argwhere(~np.isfinite(X))[0])
                raise self._fail(f"owner {i}: {what}record {r}, feature {c} is "
                                 f"{X[r, c]}: the data must be finite (mpi-dp data prepare "
                                 "drops such rows and says how many)")
            if not np.all(np.isfinite(y)):
                r = int(np.flatnonzero(~np.isfinite(y))[0])
                raise self._fail(f"owner {i}: {what}record {r} has the label {y[r]}: labels "
                                 "must be finite")

    # -- public --
    @property
    def has_public(self) -> bool:
        """Whether the file holds public records (/public/X and /public/y)."""
        with self._reading("/public"):
            return "public" in self._f and "X" in self._f["public"] and "y" in self._f["public"]

    def read_public(self) -> ArrayPair:
        """The public (X, y) every agent and the learner may see."""
        if not self.has_public:
            raise self._fail("has no public records (/public/X, /public/y)")
        return self._read_whole_pair(self._f["public"], "public records (/public)")

    def _read_whole_pair(self, g: h5py.Group, what: str) -> ArrayPair:
        """(X, y) of a public or global test group, checked against the file: X numeric with
        n_features columns, y numeric with one label per row, all finite (ShardError naming the
        group)."""
        with self._reading(what):
            for name in ("X", "y"):
                obj = g[name]
                if isinstance(obj, h5py.Dataset) and obj.dtype.kind not in "biuf":
                    raise self._fail(f"{what}: {name} holds {obj.dtype} values, not numbers")
            X = self._read_matrix(g, "X", what)
            y = np.asarray(g["y"][()], np.float64)
        if X.ndim != 2 or X.shape[1] != self.n_features:
            raise self._fail(f"{what}: X has shape {X.shape}, expected (m, {self.n_features}) "
                             f"(the file's n_features)")
        if y.shape != (X.shape[0],):
            raise self._fail(f"{what}: y has shape {y.shape} but X has {X.shape[0]} rows (one "
                             "label per record)")
        for name, a in (("X", X.data if sp.issparse(X) else X), ("y", y)):
            if not np.all(np.isfinite(a)):
                raise self._fail(f"{what}: {name} holds {np.count_nonzero(~np.isfinite(a))} NaN "
                                 "or infinite value(s); the data must be finite")
        r = label_problem(self.task, y)
        if r is not None:
            raise self._fail(f"{what}: record {r} has the label {y[r]:g}: "
                             f"{LABEL_RULES[self.task]}")
        return X, y

    def public_extra_names(self) -> list[str]:
        """Names of the extra public datasets (everything under /public except X and y)."""
        with self._reading("/public"):
            if "public" not in self._f:
                return []
            return sorted(k for k in self._f["public"].keys() if k not in ("X", "y"))

    def read_public_extra(self, name: str) -> np.ndarray:
        """An extra public dataset, e.g. a PCA basis or theta_true."""
        if name not in self.public_extra_names():
            raise self._fail(
                f"has no public extra dataset {name!r}; available: {self.public_extra_names()}"
            )
        with self._reading(f"/public/{name}"):
            return np.asarray(self._f["public"][name][()])

    # -- partition by key --
    def partition_values(self) -> list[str] | None:
        """Agent i's key value (index i), as the source writes it, in a file partitioned by a key
        column (root attribute ``partition_values``, JSON, or the /public/partition_values
        dataset when long); None when the file does not record them. The column's name is the
        root attribute ``partition_key``."""
        if "partition_values" in self._attrs:
            values = self.json_attr("partition_values")
        elif "public" in self._f and "partition_values" in self._f["public"]:
            values = [v.decode("utf-8") if isinstance(v, bytes) else v
                      for v in self._f["public"]["partition_values"][()].tolist()]
        else:
            return None
        if not isinstance(values, list) or len(values) != self.n_agents:
            count = len(values) if isinstance(values, list) else type(values).__name__
            raise self._fail(f"partition_values holds {count} values for {self.n_agents} agents")
        return [str(v) for v in values]

    # -- global test set --
    @property
    def has_global_test(self) -> bool:
        """Whether the file holds a test set of the whole dataset (/test/X, /test/y)."""
        with self._reading("/test"):
            return "test" in self._f and "X" in self._f["test"] and "y" in self._f["test"]

    def read_test(self) -> ArrayPair:
        """The global test set (X, y), e.g. MNIST's own test set."""
        if not self.has_global_test:
            raise self._fail("has no global test set (/test/X, /test/y)")
        return self._read_whole_pair(self._f["test"], "global test set (/test)")
