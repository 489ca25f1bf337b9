"""`mpi-dp data upgrade`: a format_version-1 shard file (one HDF5 group per owner) written again in
the block layout (format_version 2), whose start-up reads a rank's owners in a few large reads
instead of one per owner (at 10,000 owners: seconds). The same records, test sets, extra arrays,
public and global test data and attributes, bit for bit; checked after writing."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import scipy.sparse as sp

from ..errors import DataError, MpiDpError

_EPILOG = """\
examples:
  mpi-dp data upgrade data/old.h5 data/old_v2.h5     then point the job's `data` at the new file

The input is never changed and an existing output is never replaced. Results computed from either
file are the same bit for bit (the records are); the result file records the data file's SHA-256,
which differs between the two.
"""


def add_upgrade_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of `mpi-dp data upgrade`."""
    parser.epilog = _EPILOG
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument("src", type=Path, metavar="IN", help="shard file to read (either layout)")
    parser.add_argument("dst", type=Path, metavar="OUT",
                        help="shard file to write in the block layout (must not exist)")


def _same(a, b) -> bool:
    """Bit-for-bit equal records: dense bytes, or CSR arrays with their dtypes (-0.0 is not 0.0)."""
    if sp.issparse(a) or sp.issparse(b):
        if not (sp.issparse(a) and sp.issparse(b)) or a.shape != b.shape:
            return False
        a, b = sp.csr_matrix(a), sp.csr_matrix(b)
        return all(x.dtype == y.dtype and x.tobytes() == y.tobytes() for x, y in
                   ((a.data, b.data), (a.indices, b.indices), (a.indptr, b.indptr)))
    a, b = np.asarray(a), np.asarray(b)
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def check_same_records(src: Path, dst: Path) -> int:
    """Every owner's records and test set of `dst` equal `src`'s bit for bit (DataError naming
    the first owner that differs); returns the number of owners."""
    from .shard_reader import ShardFile

    with ShardFile(src) as a, ShardFile(dst) as b:
        if a.n_agents != b.n_agents:
            raise DataError(f"{dst} holds {b.n_agents} owners, {src} {a.n_agents}")
        ids = range(a.n_agents)
        for i, (pa, pb) in enumerate(zip(a.read_agents(ids), b.read_agents(ids), strict=True)):
            if not (_same(pa[0], pb[0]) and _same(pa[1], pb[1])):
                raise DataError(f"{dst}: owner {i}'s records differ from {src}'s")
        for i, (ta, tb) in enumerate(zip(a.read_agents_test(ids), b.read_agents_test(ids),
                                         strict=True)):
            if (ta is None) != (tb is None) or (ta is not None and tb is not None and not (
                    _same(ta[0], tb[0]) and _same(ta[1], tb[1]))):
                raise DataError(f"{dst}: owner {i}'s test set differs from {src}'s")
        return a.n_agents


def run_upgrade_command(args: argparse.Namespace) -> int:
    from .shard_reader import ShardFile
    from .shard_writer import rewrite_shards

    src, dst = Path(args.src), Path(args.dst)
    if not src.is_file():
        raise DataError(f"{src}: no such shard file")
    if dst.exists() or dst.resolve() == src.resolve():
        raise DataError(f"{dst} exists: choose another OUT (nothing is ever replaced)")
    with ShardFile(src) as sf:
        layout = sf.layout
    if layout == "blocks":
        print(f"{src} is already in the block layout (format_version 2): nothing to do")
        return 0
    t0 = time.perf_counter()
    written = rewrite_shards(src, dst, layout="blocks")
    try:
        n = check_same_records(src, written)
    except MpiDpError:
        written.unlink(missing_ok=True)  # a file that is not the same data is not left behind
        raise
    mib = written.stat().st_size / 2**20
    print(f"wrote {written} ({mib:.1f} MiB): {n} owners in the block layout (format_version 2), "
          f"records checked equal to {src}'s bit for bit, in {time.perf_counter() - t0:.1f} s")
    return 0
