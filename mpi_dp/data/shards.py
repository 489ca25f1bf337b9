"""The HDF5 shard format: one file per dataset, every data owner's records in it.

The format is in three modules: `shard_format` (the layout, its name and version and the
constants both sides need), `shard_writer` (`write_shards`: validate, then write atomically) and
`shard_reader` (`ShardFile`: read-only, each rank reading only its own owners, a block of them
in a few reads); `rewrite_shards` writes a file again in another layout. This module
re-exports their names, so that ``from mpi_dp.data.shards import ...`` works as it did when they
were one module.
"""

from __future__ import annotations

from mpi_dp.data.shard_format import (
    FORMAT,
    FORMAT_VERSION,
    LAYOUTS,
    META_GROUP,
    META_INLINE_BYTES,
    META_SUFFIX,
    RESERVED_ATTRS,
    STORAGES,
    TASKS,
    ArrayPair,
    Matrix,
)
from mpi_dp.data.shard_reader import KEEP_BYTES, READ_BYTES, ShardFile
from mpi_dp.data.shard_writer import (
    CHUNK_ROWS,
    CSR_CHUNK,
    _write_matrix,
    rewrite_shards,
    write_shards,
)

__all__ = [
    "CHUNK_ROWS",
    "CSR_CHUNK",
    "FORMAT",
    "FORMAT_VERSION",
    "KEEP_BYTES",
    "LAYOUTS",
    "META_GROUP",
    "META_INLINE_BYTES",
    "META_SUFFIX",
    "READ_BYTES",
    "RESERVED_ATTRS",
    "STORAGES",
    "TASKS",
    "ArrayPair",
    "Matrix",
    "ShardFile",
    "_write_matrix",
    "rewrite_shards",
    "write_shards",
]
