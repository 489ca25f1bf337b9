"""The HDF5 shard format: one file per dataset, one group per data owner.

Layout (format "mpi_dp.shards", version 1)::

    /                  attrs: format, format_version, n_agents, n_features, task, feature_names
                              (optional), source, created_by, plus any extra writer attrs
    /agents/<i>/X      float64 (n_i, p), chunked in whole rows so a prefix read is cheap
    /agents/<i>/y      float64 (n_i,)             attr n = n_i
    /agents/<i>/X_test, y_test                    optional held-out records of owner i
    /public/X, y       optional records every agent and the learner may see
    /public/<name>     optional extra public arrays (e.g. a PCA basis, theta_true)

Agent groups are named by the decimal agent id without padding. Writers validate everything
before touching the disk and write atomically (temporary file + ``os.replace``), so a shard file
that exists is complete. Readers open read-only without HDF5 file locking, so many MPI ranks can
read one file on a network filesystem, and each rank reads only its own agents' groups.
"""

from __future__ import annotations

import json
import os
import pathlib
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import h5py
import numpy as np

from mpi_dp import __version__
from mpi_dp.errors import DataError, ShardError

FORMAT = "mpi_dp.shards"
FORMAT_VERSION = 1
TASKS = ("regression", "binary", "multiclass")

#: Root attributes the format owns; writer-supplied ``attrs`` may not override them.
RESERVED_ATTRS = frozenset(
    {"format", "format_version", "n_agents", "n_features", "task", "feature_names", "source",
     "created_by"}
)

#: Rows per chunk of X at most; fewer when rows are wide, so one chunk stays near 4 MiB.
CHUNK_ROWS = 8192
_CHUNK_BYTES = 4 * 2**20

ArrayPair = tuple[np.ndarray, np.ndarray]


# ----------------------------------------------------------------------------------------------
# writing


def _as_pair(X: Any, y: Any, what: str, n_features: int | None, task: str) -> ArrayPair:
    """Validate one (X, y) pair and return float64 C-contiguous copies; DataError names `what`."""
    try:
        X = np.ascontiguousarray(X, dtype=np.float64)
        y = np.ascontiguousarray(y, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise DataError(f"{what}: cannot convert X/y to float64 ({exc})") from None
    if X.ndim != 2:
        raise DataError(f"{what}: X must be 2-D (records x features), got shape {X.shape}")
    if y.ndim != 1:
        raise DataError(f"{what}: y must be 1-D, got shape {y.shape}")
    if X.shape[0] != y.shape[0]:
        raise DataError(f"{what}: X has {X.shape[0]} rows but y has {y.shape[0]} entries")
    if X.shape[0] == 0:
        raise DataError(f"{what}: has no records")
    if X.shape[1] == 0:
        raise DataError(f"{what}: X has no feature columns")
    if n_features is not None and X.shape[1] != n_features:
        raise DataError(
            f"{what}: X has {X.shape[1]} features but the first agent has {n_features}"
        )
    if not np.isfinite(X).all():
        bad = np.argwhere(~np.isfinite(X))[0]
        raise DataError(f"{what}: X has a non-finite value ({X[tuple(bad)]}) at {tuple(bad)}")
    if not np.isfinite(y).all():
        bad = int(np.flatnonzero(~np.isfinite(y))[0])
        raise DataError(f"{what}: y has a non-finite value ({y[bad]}) at index {bad}")
    if task == "binary" and not np.isin(y, (-1.0, 1.0)).all():
        raise DataError(f"{what}: binary labels must be -1.0 or +1.0")
    if task == "multiclass" and not (np.all(y == np.round(y)) and np.all(y >= 0)):
        raise DataError(f"{what}: multiclass labels must be non-negative integers")
    return X, y


def _attr_value(key: str, value: Any) -> Any:
    """An HDF5-storable form of a writer attr: dict/list/tuple become a JSON string."""
    if isinstance(value, (dict, list, tuple)):
        try:
            return json.dumps(value, sort_keys=True)
        except TypeError as exc:
            raise DataError(f"attribute {key!r} is not JSON-serialisable ({exc})") from None
    if value is None:
        raise DataError(f"attribute {key!r} is None; HDF5 attributes cannot be None")
    return value


def _chunk_rows(n: int, p: int) -> int:
    return max(1, min(n, CHUNK_ROWS, _CHUNK_BYTES // (8 * p)))


def _write_pair(group: h5py.Group, X: np.ndarray, y: np.ndarray, suffix: str = "") -> None:
    n, p = X.shape
    group.create_dataset("X" + suffix, data=X, chunks=(_chunk_rows(n, p), p))
    group.create_dataset("y" + suffix, data=y)


def write_shards(
    path: str | os.PathLike[str],
    agents: Sequence[ArrayPair],
    *,
    public: ArrayPair | None = None,
    task: str = "regression",
    feature_names: Sequence[str] | None = None,
    source: str = "",
    attrs: Mapping[str, Any] | None = None,
    public_extra: Mapping[str, np.ndarray] | None = None,
    test: Sequence[ArrayPair | None] | None = None,
) -> pathlib.Path:
    """Validate and atomically write a shard file; returns its path.

    `agents[i]` is owner i's (X, y). `test[i]`, when given, is owner i's optional held-out
    (X_test, y_test) (None for none). Everything is checked before the disk is touched (DataError
    naming the agent and the problem); the file is written to a temporary file in the target's
    directory and moved into place, so no half-written shard is ever left behind.
    """
    path = pathlib.Path(path)
    if task not in TASKS:
        raise DataError(f"unknown task {task!r}; expected one of {list(TASKS)}")
    if len(agents) == 0:
        raise DataError("no agents to write")
    pairs: list[ArrayPair] = []
    p: int | None = None
    for i, pair in enumerate(agents):
        if len(pair) != 2:
            raise DataError(f"agent {i}: expected an (X, y) pair, got {len(pair)} items")
        X, y = _as_pair(pair[0], pair[1], f"agent {i}", p, task)
        p = X.shape[1]
        pairs.append((X, y))
    assert p is not None
    tests: list[ArrayPair | None] = [None] * len(pairs)
    if test is not None:
        if len(test) != len(pairs):
            raise DataError(f"test has {len(test)} entries but there are {len(pairs)} agents")
        for i, pair in enumerate(test):
            if pair is not None:
                tests[i] = _as_pair(pair[0], pair[1], f"agent {i} test set", p, task)
    pub = None if public is None else _as_pair(public[0], public[1], "public", p, task)
    extras: dict[str, np.ndarray] = {}
    for name, arr in (public_extra or {}).items():
        if name in ("X", "y") or not name or "/" in name:
            raise DataError(f"public extra dataset name {name!r} is reserved or invalid")
        extras[name] = np.asarray(arr)
    names: list[str] | None = None
    if feature_names is not None:
        names = [str(s) for s in feature_names]
        if len(names) != p:
            raise DataError(f"{len(names)} feature names given for {p} features")
    extra_attrs: dict[str, Any] = {}
    for key, value in (attrs or {}).items():
        if key in RESERVED_ATTRS:
            raise DataError(f"attribute {key!r} is reserved by the shard format")
        extra_attrs[key] = _attr_value(key, value)

    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    tmp = pathlib.Path(tmp_name)
    try:
        with h5py.File(tmp, "w") as f:
            f.attrs["format"] = FORMAT
            f.attrs["format_version"] = FORMAT_VERSION
            f.attrs["n_agents"] = len(pairs)
            f.attrs["n_features"] = p
            f.attrs["task"] = task
            if names is not None:
                f.attrs["feature_names"] = np.array(names, dtype=h5py.string_dtype())
            f.attrs["source"] = str(source)
            f.attrs["created_by"] = f"mpi_dp {__version__}"
            for key, value in extra_attrs.items():
                f.attrs[key] = value
            agents_group = f.create_group("agents")
            for i, (X, y) in enumerate(pairs):
                g = agents_group.create_group(str(i))
                g.attrs["n"] = X.shape[0]
                _write_pair(g, X, y)
                if tests[i] is not None:
                    _write_pair(g, *tests[i], suffix="_test")  # type: ignore[misc]
            if pub is not None or extras:
                g = f.create_group("public")
                if pub is not None:
                    g.attrs["n"] = pub[0].shape[0]
                    _write_pair(g, *pub)
                for name, arr in extras.items():
                    g.create_dataset(name, data=arr)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


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


class ShardFile:
    """A read-only view of a shard file; a context manager, or call `close()` when done.

    Opening checks the format and that every agent group exists, but reads no records: each rank
    reads only the agents it hosts with `read_agent`.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self._path = pathlib.Path(path)
        if not self._path.is_file():
            raise ShardError(f"shard file '{self._path}' not found")
        try:
            self._f = _open_readonly(self._path)
        except OSError as exc:
            raise ShardError(
                f"shard file '{self._path}' is not a readable HDF5 file ({exc})"
            ) from None
        try:
            self._attrs = {k: _plain(v) for k, v in self._f.attrs.items()}
            self._validate_root()
        except BaseException:
            self._f.close()
            raise

    def _fail(self, problem: str) -> ShardError:
        return ShardError(f"shard file '{self._path}': {problem}")

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
        if "agents" not in self._f:
            raise self._fail("has no /agents group")
        present = set(self._f["agents"].keys())
        missing = [i for i in range(self.n_agents) if str(i) not in present]
        if missing:
            shown = ", ".join(map(str, missing[:10])) + (" ..." if len(missing) > 10 else "")
            raise self._fail(f"{len(missing)} of {self.n_agents} agent groups missing: {shown}")

    # -- lifecycle --
    def close(self) -> None:
        """Close the underlying HDF5 file (idempotent)."""
        if self._f.id.valid:
            self._f.close()

    def __enter__(self) -> ShardFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return (
            f"ShardFile('{self._path}', n_agents={self.n_agents}, n_features={self.n_features}, "
            f"task={self.task!r})"
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
    def feature_names(self) -> list[str] | None:
        names = self._attrs.get("feature_names")
        return None if names is None else [str(s) for s in names]

    @property
    def source(self) -> str:
        return str(self._attrs.get("source", ""))

    @property
    def attrs(self) -> dict[str, Any]:
        """All root attributes as plain Python values (writer dict/list attrs stay JSON strings)."""
        return dict(self._attrs)

    def json_attr(self, key: str) -> Any:
        """A writer attr that was stored as JSON (a dict or list), decoded."""
        if key not in self._attrs:
            raise self._fail(f"has no attribute {key!r}")
        try:
            return json.loads(self._attrs[key])
        except (TypeError, ValueError):
            raise self._fail(f"attribute {key!r} is not JSON") from None

    # -- agents --
    def _group(self, i: int) -> h5py.Group:
        i = int(i)
        if not 0 <= i < self.n_agents:
            raise self._fail(f"agent {i} out of range (the file has agents 0..{self.n_agents - 1})")
        g = self._f["agents"].get(str(i))
        if not isinstance(g, h5py.Group):
            raise self._fail(f"agent {i} group /agents/{i} is missing")
        return g

    def _size(self, i: int) -> int:
        g = self._group(i)
        if "n" not in g.attrs:
            raise self._fail(f"agent {i} has no 'n' attribute")
        return int(g.attrs["n"])

    def sizes(self, ids: Iterable[int] | None = None) -> np.ndarray:
        """Record counts n_i (int64) of `ids` (default: all agents), from attributes only."""
        ids = range(self.n_agents) if ids is None else ids
        return np.array([self._size(i) for i in ids], dtype=np.int64)

    def read_agent(self, i: int, n: int | None = None) -> ArrayPair:
        """Owner i's (X, y) as float64 arrays; only the first `n` records when n is given."""
        g = self._group(i)
        available = self._size(i)
        if n is None:
            n = available
        n = int(n)
        if n < 0:
            raise self._fail(f"agent {i}: cannot read a negative number of records ({n})")
        if n > available:
            raise self._fail(f"agent {i}: asked for n={n} records but only {available} available")
        try:
            X = g["X"][:n]
            y = g["y"][:n]
        except KeyError as exc:
            raise self._fail(f"agent {i}: dataset missing ({exc})") from None
        return np.asarray(X, dtype=np.float64), np.asarray(y, dtype=np.float64)

    def has_test(self, i: int) -> bool:
        """Whether owner i has a held-out test set."""
        g = self._group(i)
        return "X_test" in g and "y_test" in g

    def read_agent_test(self, i: int) -> ArrayPair:
        """Owner i's held-out (X_test, y_test)."""
        if not self.has_test(i):
            raise self._fail(f"agent {i} has no test set")
        g = self._group(i)
        return np.asarray(g["X_test"][()], np.float64), np.asarray(g["y_test"][()], np.float64)

    def check_agents(self, ids: Iterable[int] | None = None) -> None:
        """Check that the groups of `ids` (default: all) exist and are consistent, reading no rows.

        Raises ShardError naming the file and the first inconsistent agent.
        """
        p = self.n_features
        for i in range(self.n_agents) if ids is None else ids:
            g = self._group(i)
            n = self._size(i)
            for suffix in ("", "_test"):
                xk, yk = "X" + suffix, "y" + suffix
                if suffix and xk not in g and yk not in g:
                    continue
                if xk not in g or yk not in g:
                    raise self._fail(f"agent {i}: dataset {xk if xk not in g else yk} missing")
                X, y = g[xk], g[yk]
                if X.ndim != 2 or X.shape[1] != p:
                    raise self._fail(f"agent {i}: {xk} has shape {X.shape}, expected (n, {p})")
                if y.shape != (X.shape[0],):
                    raise self._fail(
                        f"agent {i}: {yk} has shape {y.shape} but {xk} has {X.shape[0]} rows"
                    )
                if X.dtype != np.float64 or y.dtype != np.float64:
                    raise self._fail(f"agent {i}: {xk}/{yk} are not float64")
                if not suffix and X.shape[0] != n:
                    raise self._fail(f"agent {i}: attribute n={n} but X has {X.shape[0]} rows")

    # -- public --
    @property
    def has_public(self) -> bool:
        """Whether the file holds public records (/public/X and /public/y)."""
        return "public" in self._f and "X" in self._f["public"] and "y" in self._f["public"]

    def read_public(self) -> ArrayPair:
        """The public (X, y) every agent and the learner may see."""
        if not self.has_public:
            raise self._fail("has no public records (/public/X, /public/y)")
        g = self._f["public"]
        return np.asarray(g["X"][()], np.float64), np.asarray(g["y"][()], np.float64)

    def public_extra_names(self) -> list[str]:
        """Names of the extra public datasets (everything under /public except X and y)."""
        if "public" not in self._f:
            return []
        return sorted(k for k in self._f["public"].keys() if k not in ("X", "y"))

    def read_public_extra(self, name: str) -> np.ndarray:
        """An extra public dataset, e.g. a PCA basis or theta_true."""
        if name not in self.public_extra_names():
            raise self._fail(
                f"has no public extra dataset {name!r}; available: {self.public_extra_names()}"
            )
        return np.asarray(self._f["public"][name][()])
