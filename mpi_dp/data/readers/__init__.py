"""Readers: real dataset files (CSV, LIBSVM, IDX/MNIST, LEAF JSON, MovieLens) into in-memory tables.

Reading only turns bytes into numbers: no scaling, centring or partitioning happens here (that is
preprocessing). CSV text is parsed by pandas (compression, quoting, delimiter sniffing); this
package keeps the project's own part, the decisions: which cells are missing, which columns are
numeric or categorical, which rows and columns are dropped and why, which cells are imputed and
why. Every reader records in ``info`` what it read (path, size, sha256) and every decision it took,
so a prepared dataset can say exactly where each number came from and nothing is dropped or
changed silently. All failures a user can cause raise ``DataError`` with a message naming the file
and the problem.

One module per format, and one for what they share; this module re-exports the readers' public
names, so ``from mpi_dp.data import readers`` and ``from mpi_dp.data.readers import X`` work as
they did when the readers were one module:

- `common`: the `Table` every reader returns, file checks, hashing, decompression, archives
- `csv_text`: CSV text into string cells and typed cells (`CsvFormat`, `read_csv_strings`)
- `csv_table`: the CSV reader's decisions (`read_csv`, `read_csv_test`, `target_table`)
- `libsvm`: LIBSVM / SVMlight (`read_libsvm`)
- `mnist`: IDX arrays and MNIST (`read_idx`, `read_mnist`)
- `leaf`: LEAF JSON / FEMNIST (`read_leaf`)
- `movielens`: MovieLens-100K (`read_movielens`, `MovieLens`)
"""

from __future__ import annotations

from mpi_dp.data.readers.common import Table, sha256_file
from mpi_dp.data.readers.csv_table import (
    DROP_MISSING_FEATURE,
    DROP_MISSING_TARGET,
    DROP_NONFINITE_FEATURE,
    DROP_NONFINITE_TARGET,
    DROP_NULL_TARGET,
    DROP_RAGGED,
    DROP_TARGET_NOT_NUMBER,
    DROP_UNMAPPED_TARGET,
    DROP_UNSEEN_TARGET,
    read_csv,
    read_csv_test,
    target_table,
)
from mpi_dp.data.readers.csv_text import MISSING_TOKENS, CsvFormat, read_csv_strings
from mpi_dp.data.readers.leaf import read_leaf
from mpi_dp.data.readers.libsvm import read_libsvm
from mpi_dp.data.readers.mnist import read_idx, read_mnist
from mpi_dp.data.readers.movielens import MovieLens, read_movielens

__all__ = [
    "DROP_MISSING_FEATURE",
    "DROP_MISSING_TARGET",
    "DROP_NONFINITE_FEATURE",
    "DROP_NONFINITE_TARGET",
    "DROP_NULL_TARGET",
    "DROP_RAGGED",
    "DROP_TARGET_NOT_NUMBER",
    "DROP_UNMAPPED_TARGET",
    "DROP_UNSEEN_TARGET",
    "MISSING_TOKENS",
    "CsvFormat",
    "MovieLens",
    "Table",
    "read_csv",
    "read_csv_strings",
    "read_csv_test",
    "read_idx",
    "read_leaf",
    "read_libsvm",
    "read_mnist",
    "read_movielens",
    "sha256_file",
    "target_table",
]
