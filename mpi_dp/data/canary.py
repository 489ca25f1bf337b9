"""Neighbouring shard files for a privacy audit: D and D' differ in one record of one owner.

The worst-case canary (default) replaces record 0 of the owner by x_c = B e_1 (or the spread
shape, see make_worlds) with opposite labels in the two worlds (binary -1 / +1, multiclass 0 / 1,
regression -Y / +Y), where B is the largest |x_ij| and Y the largest |label| anywhere in the file:
every coordinate box and label range the original file meets still holds (e.g. features in
[0, 1]), and clipping, where a method clips, is what has to stop the canary.
A named record INDEX instead keeps D as it is and replaces that record in D' by the canary
record of world 1 (a membership-style audit of that record).
"""

from __future__ import annotations

import dataclasses
import pathlib
import shutil
from typing import cast

import h5py
import numpy as np
import scipy.sparse as sp

from mpi_dp.data.shards import ShardFile, _write_matrix
from mpi_dp.errors import DataError


@dataclasses.dataclass(frozen=True)
class Canary:
    """What distinguishes the worlds (stored with the audit result)."""

    owner: int
    record: int
    x_norm: float
    y0: float | None  # None: world 0 keeps the original record
    y1: float
    mode: str  # "worst" or "record"
    shape: str = "axis"


def _abs_max(shard: ShardFile) -> float:
    """The largest |x_ij| over every owner's records (1 if all are zero)."""
    amax = 0.0
    for i in range(shard.n_agents):
        X, _ = shard.read_agent(i)
        vals = np.abs(X.data) if sp.issparse(X) else np.abs(X).ravel()
        amax = max(amax, float(vals.max(initial=0.0)))
    return amax if amax > 0 else 1.0


def _labels(shard: ShardFile) -> tuple[float, float]:
    if shard.task == "binary":
        return -1.0, 1.0
    if shard.task == "multiclass":
        return 0.0, 1.0
    y_max = max((float(np.abs(shard.read_agent(i)[1]).max(initial=0.0))
                 for i in range(shard.n_agents)), default=0.0)
    y_max = y_max if y_max > 0 else 1.0
    return -y_max, y_max


def _replace_record(path: pathlib.Path, owner: int, record: int, x: np.ndarray, y: float) -> None:
    """Overwrite record `record` of `owner` in the shard file at `path` (a private copy)."""
    with ShardFile(path) as shard:
        X, yy = shard.read_agent(owner)
    X = cast(sp.csr_matrix, X).tolil(copy=True) if sp.issparse(X) else X.copy()
    X[record] = x
    yy = yy.copy()
    yy[record] = y
    with h5py.File(path, "r+") as f:
        if "offsets" in f["agents"]:  # the block layout: the owner's rows of /agents
            _replace_block_row(f["agents"], int(f["agents/offsets"][owner]) + record, x, y)
            return
        g = f[f"agents/{owner}"]
        del g["X"]
        del g["y"]
        _write_matrix(g, "X", sp.csr_matrix(X) if sp.issparse(X) else X)
        g.create_dataset("y", data=yy)
        g["y"].attrs["n"] = len(yy)


def _replace_block_row(agents: h5py.Group, row: int, x: np.ndarray, y: float) -> None:
    """Row `row` of /agents/X (dense, or CSR: its data and indices rewritten) and /agents/y."""
    agents["y"][row] = y
    X = agents["X"]
    if isinstance(X, h5py.Dataset):
        X[row] = x
        return
    data, indices, indptr = X["data"][()], X["indices"][()], X["indptr"][()]
    a, b = int(indptr[row]), int(indptr[row + 1])
    cols = np.flatnonzero(x)
    new_data = np.concatenate([data[:a], x[cols], data[b:]])
    new_indices = np.concatenate([indices[:a], cols.astype(indices.dtype), indices[b:]])
    indptr[row + 1 :] += cols.size - (b - a)
    for name, values in (("data", new_data), ("indices", new_indices), ("indptr", indptr)):
        del X[name]
        X.create_dataset(name, data=values)


SHAPES = ("axis", "spread")


def make_worlds(source: str | pathlib.Path, out_dir: str | pathlib.Path, owner: int,
                record: int | None = None, shape: str = "axis"
                ) -> tuple[pathlib.Path, pathlib.Path, Canary]:
    """Write world0.h5 (D) and world1.h5 (D') into out_dir; record None = worst-case canary.

    shape "axis": x_c = B e_1, B = max |x_ij| (one coordinate moves: a tight audit of
    coordinate-wise noise); "spread": every coordinate B, the largest L1 norm the file's
    coordinate range allows (for sensitivities that scale with ||x||_1, e.g. seed 002's 4 J / I;
    a method that bounds L2 row norms rejects it)."""
    if shape not in SHAPES:
        raise DataError(f"canary shape must be one of {list(SHAPES)}, got {shape!r}")
    source, out_dir = pathlib.Path(source), pathlib.Path(out_dir)
    with ShardFile(source) as shard:
        shard.check_sizes()  # an empty owner is named in the user's file, not in a world copy
        if not 0 <= owner < shard.n_agents:
            raise DataError(f"canary owner {owner} is not in 0..{shard.n_agents - 1} of {source}")
        m = int(shard.sizes([owner])[0])
        r = 0 if record is None else int(record)
        if not 0 <= r < m:
            raise DataError(f"canary record {r} is not in 0..{m - 1} (owner {owner} holds {m})")
        amax = _abs_max(shard)
        y0, y1 = _labels(shard)
        p = shard.n_features
    if shape == "spread":
        x = np.full(p, amax)
    else:
        x = np.eye(1, p).ravel() * amax
    B = float(np.linalg.norm(x))
    w0, w1 = out_dir / "world0.h5", out_dir / "world1.h5"
    shutil.copyfile(source, w0)
    shutil.copyfile(source, w1)
    if record is None:
        _replace_record(w0, owner, r, x, y0)
    _replace_record(w1, owner, r, x, y1)
    return w0, w1, Canary(owner, r, B, y0 if record is None else None, y1,
                          "worst" if record is None else "record", shape)
