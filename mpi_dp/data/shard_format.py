"""The HDF5 shard format: one file per dataset, one group per data owner.

Layout (format "mpi_dp.shards", version 1)::

    /                  attrs: format, format_version, n_agents, n_features, task, storage
                              ("dense" | "csr"; absent in older files: dense), feature_names
                              (optional), source, created_by, plus any extra writer attrs
    /agents/<i>/X      dense: float64 (n_i, p), chunked in whole rows so a prefix read is cheap
                       csr:   group, attrs format = "csr", shape = (n_i, p), with datasets
                              data float64 (nnz,), indices int32/int64 (nnz,) sorted within each
                              row, indptr int64 (n_i + 1,) (canonical CSR: no duplicate entries)
    /agents/<i>/y      float64 (n_i,)             attr n = n_i
    /agents/<i>/X_test, y_test                    optional held-out records of owner i
    /agents/<i>/extra/<name>                      optional per-record arrays of owner i (length
                                                  n_i along axis 0, e.g. MovieLens item ids or
                                                  the record's line in the source file); names
                                                  ending in "_meta" are free-form
    /public/X, y       optional records every agent and the learner may see
    /public/<name>     optional extra public arrays (e.g. a PCA basis, theta_true; str arrays as
                       UTF-8, e.g. partition_values)
    /test/X, y         optional global test set (e.g. MNIST's own test set), attr n

Every X in a file (agents, test sets, public) is stored the same way: all dense or all CSR
(``storage``). Agent groups are named by the decimal agent id without padding. Writers validate
everything before touching the disk and write atomically (temporary file + ``os.replace``), so a
shard file that exists is complete. Readers open read-only without HDF5 file locking, so many MPI
ranks can read one file on a network filesystem, and each rank reads only its own agents' groups
(a CSR prefix read touches only the first n + 1 entries of indptr and the matching data/indices).

This module holds what the writer (`shard_writer`) and the reader (`shard_reader`) both need:
the format's name and version, its tasks and storages, the root attributes it reserves, the
suffix of free-form extra arrays and the types of the arrays read back. `mpi_dp.data.shards`
re-exports all three modules' names.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

FORMAT = "mpi_dp.shards"
FORMAT_VERSION = 1
TASKS = ("regression", "binary", "multiclass")
STORAGES = ("dense", "csr")

#: Root attributes the format owns; writer-supplied ``attrs`` may not override them.
RESERVED_ATTRS = frozenset(
    {"format", "format_version", "n_agents", "n_features", "task", "feature_names", "source",
     "created_by", "storage"}
)

#: Name suffix of per-agent extra arrays that are free-form (not one entry per record).
META_SUFFIX = "_meta"

#: A feature matrix as read back: dense float64 array or CSR matrix (sparse files).
Matrix = np.ndarray | sp.csr_matrix
ArrayPair = tuple[Matrix, np.ndarray]
