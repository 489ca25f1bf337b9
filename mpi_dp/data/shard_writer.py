"""Writing shard files (the layout is in `shard_format`): `write_shards`.

Every array is validated (shapes, dtypes, finite values, labels of the task, one storage for
every X) before the disk is touched, then the file is written to a temporary file in the
target's directory and moved into place with ``os.replace``, so a shard file that exists is
complete. The root attribute ``content_sha256`` is the digest of what is written
(`shard_digest`), computed from the validated arrays. The owners' records are written one after
another (layout "blocks", format_version 2) so that a rank reads its block of owners in a few
large reads; ``layout="groups"`` writes the version-1 layout (one group per owner) for files that
older readers must read. Dense X is chunked in whole rows and CSR X in runs of entries, so that a
reader's prefix read is cheap.
"""

from __future__ import annotations

import json
import os
import pathlib
import tempfile
from collections.abc import Mapping, Sequence
from typing import Any, cast

import h5py
import numpy as np
import scipy.sparse as sp

from mpi_dp import __version__
from mpi_dp.data.shard_digest import content_digest
from mpi_dp.data.shard_format import (
    CONTENT_DIGEST,
    FORMAT,
    LAYOUTS,
    META_GROUP,
    META_INLINE_BYTES,
    META_SUFFIX,
    RESERVED_ATTRS,
    TASKS,
    ArrayPair,
    Matrix,
    stored_meta,
)
from mpi_dp.errors import DataError, unwritable_why

#: Rows per chunk of X at most; fewer when rows are wide, so one chunk stays near 4 MiB.
CHUNK_ROWS = 8192
_CHUNK_BYTES = 4 * 2**20
#: Entries per chunk of a CSR data/indices dataset (4 MiB of float64).
CSR_CHUNK = 2**19
#: Bytes of owners' arrays concatenated in memory at a time while writing a block layout
_WRITE_BYTES = 64 * 2**20


# ----------------------------------------------------------------------------------------------
# writing


def _as_dense(X: Any, what: str) -> np.ndarray:
    try:
        X = np.ascontiguousarray(X, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise DataError(f"{what}: cannot convert X to float64 ({exc})") from None
    if X.ndim != 2:
        raise DataError(f"{what}: X must be 2-D (records x features), got shape {X.shape}")
    if not np.isfinite(X).all():
        bad = np.argwhere(~np.isfinite(X))[0]
        raise DataError(f"{what}: X has a non-finite value ({X[tuple(bad)]}) at {tuple(bad)}")
    return X


def _as_csr(X: Any, what: str) -> sp.csr_matrix:
    """A canonical float64 CSR copy (duplicates summed, indices sorted), checked without
    densifying."""
    try:
        M = sp.csr_matrix(X, dtype=np.float64, copy=True)
    except (TypeError, ValueError) as exc:
        raise DataError(f"{what}: cannot convert sparse X to float64 CSR ({exc})") from None
    M.sum_duplicates()
    M.sort_indices()
    finite = np.isfinite(M.data)
    if not finite.all():
        k = int(np.flatnonzero(~finite)[0])
        row = int(np.searchsorted(M.indptr, k, side="right")) - 1
        raise DataError(
            f"{what}: X has a non-finite value ({M.data[k]}) at {(row, int(M.indices[k]))}"
        )
    return M


def _as_pair(X: Any, y: Any, what: str, n_features: int | None, task: str) -> ArrayPair:
    """Validate one (X, y) pair; returns a float64 C-contiguous X (or a canonical CSR copy when X
    is a scipy.sparse matrix) and y. DataError names `what`."""
    X = _as_csr(X, what) if sp.issparse(X) else _as_dense(X, what)
    try:
        y = np.ascontiguousarray(y, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise DataError(f"{what}: cannot convert y to float64 ({exc})") from None
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
    if not np.isfinite(y).all():
        bad = int(np.flatnonzero(~np.isfinite(y))[0])
        raise DataError(f"{what}: y has a non-finite value ({y[bad]}) at index {bad}")
    if task == "binary" and not np.isin(y, (-1.0, 1.0)).all():
        raise DataError(f"{what}: binary labels must be -1.0 or +1.0")
    if task == "multiclass" and not (np.all(y == np.round(y)) and np.all(y >= 0)):
        raise DataError(f"{what}: multiclass labels must be non-negative integers")
    return X, y


def _as_extras(extra: Mapping[str, Any], what: str, n: int) -> dict[str, np.ndarray]:
    """Validate owner-level extra arrays: names without '/', one entry per record unless the name
    ends in META_SUFFIX; numeric, boolean, bytes or str arrays (str is stored as UTF-8)."""
    out: dict[str, np.ndarray] = {}
    for name, arr in extra.items():
        if not isinstance(name, str) or not name or "/" in name or name in (".", ".."):
            raise DataError(f"{what}: extra array name {name!r} is invalid (non-empty, no '/')")
        a = np.asarray(arr)
        if a.dtype.kind not in "biufcSU":
            raise DataError(f"{what}: extra array {name!r} has dtype {a.dtype}, which HDF5 cannot "
                            "store (use numbers, booleans or strings)")
        if not name.endswith(META_SUFFIX) and (a.ndim == 0 or a.shape[0] != n):
            length = "a scalar" if a.ndim == 0 else f"length {a.shape[0]}"
            raise DataError(f"{what}: extra array {name!r} has {length} but the agent has {n} "
                            f"records (free-form arrays need a name ending in '{META_SUFFIX}')")
        out[name] = a
    return out


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


def _stored_bytes(value: Any) -> int:
    """About the bytes `value` takes as an HDF5 attribute (a variable-length string costs its
    UTF-8 bytes plus a 16-byte heap reference)."""
    if isinstance(value, str):
        return len(value.encode("utf-8", "surrogatepass")) + 16
    if isinstance(value, bytes):
        return len(value) + 16
    a = np.asarray(value)
    if a.dtype.kind in "OSU":
        return sum(_stored_bytes(v if isinstance(v, (str, bytes)) else str(v))
                   for v in a.ravel().tolist())
    return int(a.nbytes)


def _write_meta(f: h5py.File, meta: Mapping[str, Any]) -> None:
    """/meta/<name> datasets: strings (one, or an array) as UTF-8, numbers as they are."""
    g = f.create_group(META_GROUP)
    for name, value in meta.items():
        a = np.asarray(value)
        if isinstance(value, (str, bytes)) or a.dtype.kind in "OSU":
            g.create_dataset(name, data=value, dtype=h5py.string_dtype())
        else:
            g.create_dataset(name, data=a)


def _chunk_rows(n: int, p: int) -> int:
    return max(1, min(n, CHUNK_ROWS, _CHUNK_BYTES // (8 * p)))


def _write_matrix(group: h5py.Group, name: str, X: Matrix) -> None:
    """X as a row-chunked dataset, or (CSR) a group of data/indices/indptr chunked for prefixes."""
    n, p = X.shape
    if not sp.issparse(X):
        group.create_dataset(name, data=X, chunks=(_chunk_rows(n, p), p))
        return
    csr = cast(sp.csr_matrix, X)
    g = group.create_group(name)
    g.attrs["format"] = "csr"
    g.attrs["shape"] = np.array([n, p], dtype=np.int64)
    index_dtype = np.int32 if p <= np.iinfo(np.int32).max else np.int64
    chunks = {"chunks": (min(csr.nnz, CSR_CHUNK),)} if csr.nnz else {}
    g.create_dataset("data", data=np.asarray(csr.data, dtype=np.float64), **chunks)
    g.create_dataset("indices", data=np.asarray(csr.indices, dtype=index_dtype), **chunks)
    g.create_dataset("indptr", data=np.asarray(csr.indptr, dtype=np.int64),
                     chunks=(min(n + 1, CSR_CHUNK),))


def _write_pair(group: h5py.Group, X: Matrix, y: np.ndarray, suffix: str = "") -> None:
    _write_matrix(group, "X" + suffix, X)
    group.create_dataset("y" + suffix, data=y)


def _write_array(group: h5py.Group, name: str, a: np.ndarray) -> None:
    if a.dtype.kind == "U":
        group.create_dataset(name, data=a.astype(object), dtype=h5py.string_dtype())
    else:
        group.create_dataset(name, data=a)


def _write_concat(ds: h5py.Dataset, parts: Sequence[np.ndarray]) -> None:
    """`parts` one after another along axis 0 of `ds`, written in slices of about _WRITE_BYTES
    (the writer never holds a second copy of every owner's records)."""
    batch: list[np.ndarray] = []
    lo, size = 0, 0

    def flush() -> None:
        nonlocal lo, batch, size
        if batch:
            a = batch[0] if len(batch) == 1 else np.concatenate(batch)
            if a.shape[0]:
                ds[lo: lo + a.shape[0]] = a
            lo += a.shape[0]
        batch, size = [], 0

    for a in parts:
        batch.append(a)
        size += a.nbytes
        if size >= _WRITE_BYTES:
            flush()
    flush()


def _offsets(counts: Sequence[int] | np.ndarray) -> np.ndarray:
    """Row offsets (int64, len(counts) + 1) of arrays of `counts` rows stored one after another."""
    out = np.zeros(len(counts) + 1, dtype=np.int64)
    np.cumsum(np.asarray(counts, dtype=np.int64), out=out[1:])
    return out


def _write_matrix_block(group: h5py.Group, name: str, mats: Sequence[Matrix], p: int) -> None:
    """The rows of `mats` (all dense or all CSR) one after another as one X: a row-chunked
    dataset, or one CSR group whose indptr runs over every row."""
    n = sum(int(X.shape[0]) for X in mats)
    if not mats or not sp.issparse(mats[0]):
        ds = group.create_dataset(name, shape=(n, p), dtype=np.float64,
                                  chunks=(_chunk_rows(n, p), p) if n else None)
        _write_concat(ds, mats)
        return
    csrs = cast("Sequence[sp.csr_matrix]", mats)  # all CSR here
    nnz = _offsets([int(X.nnz) for X in csrs])
    g = group.create_group(name)
    g.attrs["format"] = "csr"
    g.attrs["shape"] = np.array([n, p], dtype=np.int64)
    index_dtype = np.int32 if p <= np.iinfo(np.int32).max else np.int64
    total = int(nnz[-1])
    chunks = {"chunks": (min(total, CSR_CHUNK),)} if total else {}
    _write_concat(g.create_dataset("data", shape=(total,), dtype=np.float64, **chunks),
                  [np.asarray(X.data, dtype=np.float64) for X in csrs])
    _write_concat(g.create_dataset("indices", shape=(total,), dtype=index_dtype, **chunks),
                  [np.asarray(X.indices, dtype=index_dtype) for X in csrs])
    indptr = g.create_dataset("indptr", shape=(n + 1,), dtype=np.int64,
                              chunks=(min(n + 1, CSR_CHUNK),))
    _write_concat(indptr, [np.zeros(1, np.int64)] + [
        np.asarray(X.indptr[1:], dtype=np.int64) + nnz[k] for k, X in enumerate(csrs)])


def _concatenable(arrays: Sequence[np.ndarray]) -> bool:
    """Whether owners' extra arrays concatenate along axis 0 and read back unchanged: all at
    least 1-D with the same trailing shape and dtype (str of any length)."""
    first = arrays[0]
    for a in arrays:
        if a.ndim == 0 or a.shape[1:] != first.shape[1:]:
            return False
        if a.dtype != first.dtype and not (a.dtype.kind == first.dtype.kind == "U"):
            return False
    return True


def _write_extras_block(group: h5py.Group, extras: Sequence[Mapping[str, np.ndarray]]) -> None:
    """Owners' extra arrays by name under /agents/extra/<name>: concatenated (values, offsets,
    present) where they concatenate, else one dataset per owner (layout "per_agent")."""
    names = sorted({name for e in extras for name in e})
    if not names:
        return
    eg = group.create_group("extra")
    for name in names:
        owners = [i for i, e in enumerate(extras) if name in e]
        arrays = [extras[i][name] for i in owners]
        g = eg.create_group(name)
        if not _concatenable(arrays):
            g.attrs["layout"] = "per_agent"
            for i, a in zip(owners, arrays, strict=True):
                _write_array(g, str(i), a)
            continue
        g.attrs["layout"] = "concat"
        counts = np.zeros(len(extras), dtype=np.int64)
        counts[owners] = [a.shape[0] for a in arrays]
        present = np.zeros(len(extras), dtype=np.uint8)
        present[owners] = 1
        g.create_dataset("offsets", data=_offsets(counts))
        g.create_dataset("present", data=present)
        _write_array(g, "values", np.concatenate(arrays))


def _write_agents_blocks(f: h5py.File, pairs: Sequence[ArrayPair],
                         tests: Sequence[ArrayPair | None],
                         extras: Sequence[Mapping[str, np.ndarray]], p: int) -> None:
    """The owners in the block layout (format_version 2): /agents/offsets, X, y, the held-out
    records (test_offsets, X_test, y_test) and the extra arrays."""
    g = f.create_group("agents")
    g.create_dataset("offsets", data=_offsets([X.shape[0] for X, _ in pairs]))
    _write_matrix_block(g, "X", [X for X, _ in pairs], p)
    _write_concat(g.create_dataset("y", shape=(sum(y.shape[0] for _, y in pairs),),
                                   dtype=np.float64), [y for _, y in pairs])
    if any(t is not None for t in tests):
        have = [t for t in tests if t is not None]
        g.create_dataset("test_offsets",
                         data=_offsets([0 if t is None else t[0].shape[0] for t in tests]))
        _write_matrix_block(g, "X_test", [X for X, _ in have], p)
        _write_concat(g.create_dataset("y_test", shape=(sum(y.shape[0] for _, y in have),),
                                       dtype=np.float64), [y for _, y in have])
    _write_extras_block(g, extras)


def _write_agents_groups(f: h5py.File, pairs: Sequence[ArrayPair],
                         tests: Sequence[ArrayPair | None],
                         extras: Sequence[Mapping[str, np.ndarray]]) -> None:
    """The owners in the group layout (format_version 1): one group /agents/<i> per owner."""
    agents_group = f.create_group("agents")
    for i, (X, y) in enumerate(pairs):
        g = agents_group.create_group(str(i))
        g.attrs["n"] = X.shape[0]
        _write_pair(g, X, y)
        if tests[i] is not None:
            _write_pair(g, *tests[i], suffix="_test")  # type: ignore[misc]
        if extras[i]:
            eg = g.create_group("extra")
            for name, arr in extras[i].items():
                _write_array(eg, name, arr)


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
    agent_extra: Sequence[Mapping[str, np.ndarray] | None] | None = None,
    test_global: ArrayPair | None = None,
    layout: str = "blocks",
) -> pathlib.Path:
    """Validate and atomically write a shard file; returns its path.

    `agents[i]` is owner i's (X, y); X is a dense array or a scipy.sparse matrix (stored as CSR),
    the same kind for every X in the file. `test[i]`, when given, is owner i's optional held-out
    (X_test, y_test) (None for none); `agent_extra[i]` owner i's named extra arrays (None or {}
    for none); `test_global` a test set of the whole dataset. `layout` "blocks" (the default,
    format_version 2) stores the owners' records one after another, "groups" (format_version 1)
    one group per owner. Everything is checked before the disk is touched (DataError naming the
    agent and the problem); the file is written to a temporary file in the target's directory and
    moved into place, so no half-written shard is ever left.
    """
    path = pathlib.Path(path)
    versions = {name: version for version, name in LAYOUTS.items()}
    if layout not in versions:
        raise DataError(f"unknown shard layout {layout!r}; expected one of {list(versions)}")
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
        for i, test_pair in enumerate(test):
            if test_pair is not None:
                tests[i] = _as_pair(test_pair[0], test_pair[1], f"agent {i} test set", p, task)
    pub = None if public is None else _as_pair(public[0], public[1], "public", p, task)
    glob = (None if test_global is None
            else _as_pair(test_global[0], test_global[1], "global test set", p, task))
    matrices = [X for X, _ in pairs] + [t[0] for t in tests if t is not None]
    matrices += [q[0] for q in (pub, glob) if q is not None]
    kinds = {sp.issparse(X) for X in matrices}
    if len(kinds) > 1:
        raise DataError(f"{path}: mixes dense arrays and sparse matrices for X (agents, test "
                        "sets, public); store every X as CSR or every X dense")
    storage = "csr" if kinds == {True} else "dense"
    agent_extras: list[dict[str, np.ndarray]] = [{} for _ in pairs]
    if agent_extra is not None:
        if len(agent_extra) != len(pairs):
            raise DataError(f"agent_extra has {len(agent_extra)} entries but there are "
                            f"{len(pairs)} agents")
        for i, extra in enumerate(agent_extra):
            agent_extras[i] = _as_extras(extra or {}, f"agent {i}", pairs[i][0].shape[0])
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
    root: dict[str, Any] = {"format": FORMAT, "format_version": versions[layout],
                            "n_agents": len(pairs), "n_features": p, "task": task,
                            "storage": storage}
    meta: dict[str, Any] = {}  # datasets under /meta: no 64 KiB limit, so any width fits
    if names is not None:
        meta["feature_names"] = np.array(names, dtype=h5py.string_dtype())
    root.update(source=str(source), created_by=f"mpi_dp {__version__}")
    for key, value in (attrs or {}).items():
        if key in RESERVED_ATTRS:
            raise DataError(f"attribute {key!r} is reserved by the shard format")
        value = _attr_value(key, value)
        if _stored_bytes(value) > META_INLINE_BYTES:
            meta[key] = value
        else:
            root[key] = value
    root[CONTENT_DIGEST] = content_digest({**root, **meta}, pairs, tests, agent_extras, pub,
                                          extras, glob)

    if path.is_dir():
        raise DataError(f"output {path} is a directory; give the shard file's path, e.g. "
                        f"{path / 'data.h5'}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp_name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as exc:
        raise DataError(f"cannot write the shard file {path}: {unwritable_why(path, exc)}; "
                        "choose another --out") from None
    os.close(fd)
    tmp = pathlib.Path(tmp_name)
    try:
        with h5py.File(tmp, "w") as f:
            for key, value in root.items():
                f.attrs[key] = value
            if meta:
                _write_meta(f, meta)
            if layout == "blocks":
                _write_agents_blocks(f, pairs, tests, agent_extras, p)
            else:
                _write_agents_groups(f, pairs, tests, agent_extras)
            if pub is not None or extras:
                g = f.create_group("public")
                if pub is not None:
                    g.attrs["n"] = pub[0].shape[0]
                    _write_pair(g, *pub)
                for name, arr in extras.items():
                    _write_array(g, name, arr)
            if glob is not None:
                g = f.create_group("test")
                g.attrs["n"] = glob[0].shape[0]
                _write_pair(g, *glob)
        mask = os.umask(0)
        os.umask(mask)
        os.chmod(tmp, 0o666 & ~mask)  # mkstemp made it 0600; a shard file is read like a result
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


def rewrite_shards(src: str | os.PathLike[str], dst: str | os.PathLike[str], *,
                   layout: str = "blocks") -> pathlib.Path:
    """Write the shard file `src` again as `dst` in `layout` (e.g. a format_version-1 file in the
    block layout, whose start-up reads a rank's owners in a few reads): the same records, test
    sets, extra arrays, public and global test data and attributes, bit for bit."""
    from mpi_dp.data.shard_reader import ShardFile  # the reader does not import the writer

    with ShardFile(src) as sf:
        ids = range(sf.n_agents)
        sf.check_agents(ids)
        agents = sf.read_agents(ids)
        tests = sf.read_agents_test(ids)
        extras = [{name: sf.read_agent_extra(i, name) for name in sf.agent_extra_names(i)}
                  for i in ids]
        public = sf.read_public() if sf.has_public else None
        extra_names = sf.public_extra_names()
        test_global = sf.read_test() if sf.has_global_test else None
        task, names, source = sf.task, sf.feature_names, sf.source
    with h5py.File(src, "r", locking=False) as f:  # attributes and arrays as stored
        attrs = {k: v for k, v in stored_meta(f).items() if k not in RESERVED_ATTRS}
        attrs.update((k, v) for k, v in f.attrs.items() if k not in RESERVED_ATTRS)
        public_extra = {}
        for name in extra_names:
            ds = f["public"][name]
            public_extra[name] = (np.asarray(ds.asstr()[()], dtype=str)
                                  if h5py.check_string_dtype(ds.dtype) is not None else ds[()])
    return write_shards(dst, agents, public=public, task=task, feature_names=names, source=source,
                        attrs=attrs, public_extra=public_extra,
                        test=tests if any(t is not None for t in tests) else None,
                        agent_extra=extras if any(extras) else None, test_global=test_global,
                        layout=layout)
