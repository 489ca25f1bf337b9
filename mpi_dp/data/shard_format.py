"""The HDF5 shard format: one file per dataset, the records of all data owners stored together.

Layout (format "mpi_dp.shards", version 2: "blocks")::

    /                  attrs: format, format_version, n_agents, n_features, task, storage
                              ("dense" | "csr"; absent in older files: dense), source,
                              created_by, content_sha256 (the content digest, see below; absent
                              in older files, which open as before), plus any extra writer
                              attrs up to META_INLINE_BYTES (16 KiB) each
    /meta/feature_names  optional UTF-8 strings (n_features,): the column names (older files
                       hold them as the root attribute feature_names, still read)
    /meta/<name>       a writer attr over META_INLINE_BYTES (e.g. the decisions of a table with
                       thousands of columns) stored as a dataset of the same value (JSON text as a
                       scalar UTF-8 string) instead of a root attribute: HDF5 keeps attributes in
                       the object header, 64 KiB a message at most, datasets anywhere, so
                       10,000 columns fit
    /agents/offsets    int64 (n_agents + 1,): owner i's records are rows offsets[i]:offsets[i+1]
                       of X and y (offsets[0] = 0, non-decreasing, offsets[-1] = N, the records of
                       all owners)
    /agents/X          dense: float64 (N, p), chunked in whole rows
                       csr:   group, attrs format = "csr", shape = (N, p), with datasets
                              data float64 (nnz,), indices int32/int64 (nnz,) sorted within each
                              row, indptr int64 (N + 1,) (canonical CSR: no duplicate entries)
    /agents/y          float64 (N,)
    /agents/test_offsets, X_test, y_test          optional held-out records of the owners, stored
                                                  the same way (an owner with no held-out records
                                                  has an empty range: it has no test set)
    /agents/extra/<name>                          optional per-owner arrays (e.g. MovieLens item
                                                  ids or the record's line in the source file):
                       attr layout = "concat": datasets values (every owner's array, concatenated
                              along axis 0), offsets int64 (n_agents + 1,) into values, present
                              uint8 (n_agents,) (1 where the owner has the array); or
                       attr layout = "per_agent" (owners' arrays that do not concatenate: other
                              dtypes or trailing shapes, scalars): one dataset per owner, named by
                              its id
                       names ending in "_meta" are free-form; the others hold one entry per record
                       of the owner (their offsets equal /agents/offsets where present)
    /public/X, y       optional records every agent and the learner may see
    /public/<name>     optional extra public arrays (e.g. a PCA basis, theta_true; str arrays as
                       UTF-8, e.g. partition_values)
    /test/X, y         optional global test set (e.g. MNIST's own test set), attr n

A rank hosts a contiguous block of owners, so it reads the records of its whole block in a few
large reads (a rank's rows are one range of X), not one read per owner.

Version 1 ("groups", still read, and written with ``write_shards(layout="groups")``) stores one
group per owner instead: /agents/<i>/X and /agents/<i>/y (attr n = n_i), /agents/<i>/X_test,
y_test and /agents/<i>/extra/<name>; groups are named by the decimal agent id without padding.

content_sha256 is a SHA-256 over what the file holds, not its bytes (`shard_digest`): the root
attributes but format_version, created_by and itself, with the /meta datasets among them by name
(so moving a value between an attribute and /meta does not change it), every owner's records,
held-out records and extra arrays, the public records and arrays and the global test set, each
with its dtype and shape. It does not depend on the layout or the chunking: a file rewritten in
another layout keeps it. (A result records the SHA-256 of the shard file's bytes as data_sha256.)

Every X in a file (agents, test sets, public) is stored the same way: all dense or all CSR
(``storage``). Writers validate everything before touching the disk and write atomically
(temporary file + ``os.replace``), so a shard file that exists is complete. Readers open read-only
without HDF5 file locking, so many MPI ranks can read one file on a network filesystem, and each
rank reads only its own agents' records (a CSR prefix read touches only the first n + 1 entries of
indptr and the matching data/indices).

This module holds what the writer (`shard_writer`) and the reader (`shard_reader`) both need:
the format's name and version, its tasks and storages, the root attributes it reserves, the
/meta group and its size rule, the suffix of free-form extra arrays and the types of the arrays
read back. `mpi_dp.data.shards` re-exports all three modules' names.
"""

from __future__ import annotations

from typing import Any, TypeAlias

import numpy as np
import scipy.sparse as sp

FORMAT = "mpi_dp.shards"
FORMAT_VERSION = 2
#: The agents' layouts by format_version: 1 one group per owner, 2 all owners' records together.
LAYOUTS = {1: "groups", 2: "blocks"}
TASKS = ("regression", "binary", "multiclass")
STORAGES = ("dense", "csr")

#: Root attribute of the content digest (hex SHA-256 over what the file holds: `shard_digest`).
CONTENT_DIGEST = "content_sha256"

#: Root attributes the format owns; writer-supplied ``attrs`` may not override them.
RESERVED_ATTRS = frozenset(
    {"format", "format_version", "n_agents", "n_features", "task", "feature_names", "source",
     "created_by", "storage", CONTENT_DIGEST}
)

#: Group of the metadata stored as datasets: feature_names and writer attrs too large to inline.
META_GROUP = "meta"
#: Bytes above which a writer attr is stored as the dataset /meta/<name>, not a root attribute:
#: attributes live in the object header, one message at most 64 KiB (HDF5: "object header
#: message is too large": 4,096 strings of an array, each a 16-byte reference, or 8,192 float64
#: already are); a dataset has no such limit.
META_INLINE_BYTES = 16 * 1024

#: Name suffix of per-agent extra arrays that are free-form (not one entry per record).
META_SUFFIX = "_meta"

#: A feature matrix as read back: dense float64 array or CSR matrix (sparse files).
Matrix: TypeAlias = np.ndarray | sp.csr_matrix
ArrayPair = tuple[Matrix, np.ndarray]


def stored_meta(f: Any) -> dict[str, Any]:
    """The /meta datasets of an open h5py file (`f`), by name: UTF-8 text as str (one) or an
    object array of str, numbers as arrays; {} for files without /meta (older files)."""
    import h5py

    g = f.get(META_GROUP)
    out: dict[str, Any] = {}
    if not isinstance(g, h5py.Group):
        return out
    for name, ds in g.items():
        if not isinstance(ds, h5py.Dataset):
            continue
        if h5py.check_string_dtype(ds.dtype) is not None:
            value = ds.asstr()[()]
            out[name] = value if isinstance(value, str) else np.asarray(value, dtype=object)
        else:
            out[name] = ds[()]
    return out
