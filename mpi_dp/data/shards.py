"""The HDF5 shard format: one file per dataset, one group per data owner.

The format is in three modules: `shard_format` (the layout, its name and version and the
constants both sides need), `shard_writer` (`write_shards`: validate, then write atomically) and
`shard_reader` (`ShardFile`: read-only, each rank reading only its own owners). This module
re-exports their names, so that ``from mpi_dp.data.shards import ...`` works as it did when they
were one module.
"""

from __future__ import annotations

from mpi_dp.data.shard_format import (
    FORMAT,
    FORMAT_VERSION,
    META_SUFFIX,
    RESERVED_ATTRS,
    STORAGES,
    TASKS,
    ArrayPair,
    Matrix,
)
from mpi_dp.data.shard_reader import KEEP_BYTES, ShardFile
from mpi_dp.data.shard_writer import CHUNK_ROWS, CSR_CHUNK, _write_matrix, write_shards

__all__ = [
    "CHUNK_ROWS",
    "CSR_CHUNK",
    "FORMAT",
    "FORMAT_VERSION",
    "KEEP_BYTES",
    "META_SUFFIX",
    "RESERVED_ATTRS",
    "STORAGES",
    "TASKS",
    "ArrayPair",
    "Matrix",
    "ShardFile",
    "_write_matrix",
    "write_shards",
]
