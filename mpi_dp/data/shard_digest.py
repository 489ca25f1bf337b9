"""The content digest of a shard file: root attribute ``content_sha256``.

A SHA-256 over what the file holds, not over its bytes: the root attributes and the /meta
datasets (by name, one namespace, except ``format_version``, ``created_by`` and the digest
itself: a value digests the same as an attribute or a dataset), then each owner's records (X, y),
held-out records and extra arrays (by name), the public records and extra public arrays (by
name) and the global test set, each value with its kind, dtype and shape, strings as UTF-8, and
CSR matrices as their canonical data/indices/indptr. So the digest does not depend on the
layout (`mpi-dp data upgrade` keeps it), the chunking or the HDF5 library, and a file with the
same digest holds the same data. The writer computes it from the arrays it writes
(`content_digest`); `file_digest` recomputes it from a file, `stored_digest` reads it (None for
files written before it existed, which open as before).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import scipy.sparse as sp

from mpi_dp.data.shard_format import CONTENT_DIGEST, stored_meta

#: root attributes outside the digest: the layout's version, the writing package's version (a
#: rewrite in another layout or by another release holds the same data) and the digest itself
DIGEST_SKIPS = frozenset({"format_version", "created_by", CONTENT_DIGEST})
_TAG = b"mpi_dp.shards content_sha256 v1"


class _Digest:
    """Length-prefixed, typed pieces fed to one SHA-256 (no two contents feed the same bytes)."""

    def __init__(self) -> None:
        self.h = hashlib.sha256(_TAG)

    def piece(self, kind: bytes, data: bytes | np.ndarray) -> None:
        """`kind`, the length of `data` in bytes, then `data` (bytes or a C-contiguous array,
        hashed in place: no copy of a large array)."""
        size = data.nbytes if isinstance(data, np.ndarray) else len(data)
        self.h.update(kind + size.to_bytes(8, "little"))
        self.h.update(data.data if isinstance(data, np.ndarray) else data)

    def text(self, s: str) -> None:
        self.piece(b"s", s.encode("utf-8", "surrogatepass"))

    def value(self, v: Any) -> None:
        """A number, string or array: strings (str or bytes, also inside arrays) as UTF-8 text,
        numbers as little-endian bytes with their dtype and shape."""
        if isinstance(v, (str, bytes)):
            self.text(v.decode("utf-8", "surrogateescape") if isinstance(v, bytes) else v)
            return
        a = np.asarray(v)
        shape = np.asarray(a.shape, dtype="<i8").tobytes()
        if a.dtype.kind in "OSU":
            self.piece(b"t", shape)
            for e in a.ravel().tolist():
                self.text(e.decode("utf-8", "surrogateescape") if isinstance(e, bytes) else str(e))
            return
        le = a.dtype.newbyteorder("<") if a.dtype.byteorder == ">" else a.dtype
        self.piece(b"n", a.dtype.str.encode() + b":" + shape)
        self.piece(b"d", np.ascontiguousarray(a, dtype=le))

    def matrix(self, X: Any) -> None:
        """A feature matrix: dense float64, or CSR (data, int64 indices, indptr from 0)."""
        if sp.issparse(X):
            M = sp.csr_matrix(X)
            self.piece(b"csr", np.asarray(M.shape, dtype="<i8").tobytes())
            self.value(np.asarray(M.data, dtype="<f8"))
            self.value(np.asarray(M.indices, dtype="<i8"))
            self.value(np.asarray(M.indptr, dtype="<i8") - int(M.indptr[0]))
        else:
            self.piece(b"dense", b"")
            self.value(np.asarray(X, dtype="<f8"))

    def pair(self, pair: Any) -> None:
        """An optional (X, y): a marker, then X and y."""
        self.piece(b"pair", b"1" if pair is not None else b"0")
        if pair is not None:
            self.matrix(pair[0])
            self.value(np.asarray(pair[1], dtype="<f8"))

    def named(self, arrays: Mapping[str, Any]) -> None:
        self.piece(b"names", len(arrays).to_bytes(8, "little"))
        for name in sorted(arrays):
            self.text(name)
            self.value(arrays[name])


def content_digest(attrs: Mapping[str, Any], agents: Sequence[Any], tests: Sequence[Any],
                   agent_extra: Sequence[Mapping[str, Any]], public: Any,
                   public_extra: Mapping[str, Any], test_global: Any) -> str:
    """The hex digest of a shard's content (see the module's docstring): root `attrs`, the
    owners' (X, y) `agents`, their held-out `tests` (None: none) and `agent_extra` arrays, the
    `public` (X, y) or None, `public_extra` arrays and the `test_global` (X, y) or None."""
    d = _Digest()
    d.named({k: v for k, v in attrs.items() if k not in DIGEST_SKIPS})
    d.piece(b"agents", len(agents).to_bytes(8, "little"))
    for i, pair in enumerate(agents):
        d.pair(pair)
        d.pair(tests[i] if tests else None)
        d.named(agent_extra[i] if agent_extra else {})
    d.pair(public)
    d.named(public_extra)
    d.pair(test_global)
    return d.h.hexdigest()


def stored_digest(path: str | os.PathLike[str]) -> str | None:
    """The digest a shard file records, None when it has none (written before the digest)."""
    import h5py

    with h5py.File(path, "r", locking=False) as f:
        value = f.attrs.get(CONTENT_DIGEST)
    if value is None:
        return None
    return value.decode() if isinstance(value, bytes) else str(value)


def file_digest(path: str | os.PathLike[str]) -> str:
    """The digest of a shard file's content, recomputed from what it holds (any layout)."""
    import h5py

    from mpi_dp.data.shard_reader import ShardFile  # the reader does not import this module

    with ShardFile(path) as sf:
        ids = range(sf.n_agents)
        agents = sf.read_agents(ids)
        tests = sf.read_agents_test(ids)
        extras = [{name: sf.read_agent_extra(i, name) for name in sf.agent_extra_names(i)}
                  for i in ids]
        public = sf.read_public() if sf.has_public else None
        extra_names = sf.public_extra_names()
        test_global = sf.read_test() if sf.has_global_test else None
    with h5py.File(path, "r", locking=False) as f:
        attrs = {**stored_meta(f), **dict(f.attrs.items())}  # /meta datasets count as attrs
        public_extra = {name: f["public"][name][()] for name in extra_names}
    return content_digest(attrs, agents, tests, extras, public, public_extra, test_global)
