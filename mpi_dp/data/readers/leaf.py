"""LEAF JSON (FEMNIST) train and test Tables from a directory tree or an archive (`read_leaf`)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from mpi_dp.data.readers.common import Table, _archive_kind, _file_record, _iter_archive, _junk, _require_file
from mpi_dp.errors import DataError

# ----------------------------------------------------------------------------------------------
# LEAF (FEMNIST)


def _leaf_split(rel: str) -> str | None:
    """'train' or 'test' from the nearest folder of that name in a relative path, else None."""
    parts = Path(rel).parts
    if not rel.endswith(".json") or _junk(rel):
        return None
    for part in reversed(parts[:-1]):
        if part in ("train", "test"):
            return part
    return None


def _leaf_sources(path: Path) -> tuple[Iterator[tuple[str, bytes]], list[dict]]:
    """JSON documents (relative name, bytes) of a LEAF tree or archive, and the file records."""
    if path.is_dir():
        files = sorted(p for p in path.rglob("*.json") if _leaf_split(p.relative_to(path).as_posix()))
        records = [_file_record(p) for p in files]
        return ((p.relative_to(path).as_posix(), p.read_bytes()) for p in files), records
    _require_file(path)
    if _archive_kind(path) is None:
        raise DataError(f"{path}: not a directory nor a .tar/.tar.gz/.tar.xz/.zip archive of LEAF JSON")
    return _iter_archive(path, lambda n: _leaf_split(n) is not None), [_file_record(path)]


def _leaf_document(path: Path, name: str, raw: bytes) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """user -> (x float64 (k, d), y int64 (k,)) of one LEAF JSON document, validated."""
    where = f"{path}: {name}" if not path.is_dir() else str(path / name)
    try:
        doc = json.loads(raw)
        users, user_data = list(doc["users"]), doc["user_data"]
        num = list(doc.get("num_samples", [None] * len(users)))
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise DataError(f"{where}: not a LEAF JSON document ({type(exc).__name__}: {exc})") from None
    if len(num) != len(users):
        raise DataError(f"{where}: {len(users)} users but {len(num)} num_samples entries")
    out = {}
    for user, n in zip(users, num, strict=True):
        try:
            x = np.asarray(user_data[user]["x"], dtype=np.float64)
            y = np.asarray(user_data[user]["y"])
            if not len(y) and not x.size:
                continue
        except (KeyError, TypeError, ValueError) as exc:
            raise DataError(f"{where}: bad data for user {user!r} ({type(exc).__name__}: {exc})") from None
        if x.ndim != 2 or y.ndim != 1 or len(x) != len(y) or (n is not None and n != len(y)):
            raise DataError(f"{where}: user {user!r} has x shape {x.shape}, {y.shape[0]} labels and "
                            f"num_samples {n}")
        if len(y) and (not np.issubdtype(y.dtype, np.integer) or y.min() < 0):
            raise DataError(f"{where}: user {user!r} has labels that are not non-negative integers")
        if len(y):
            out[str(user)] = (x, y.astype(np.int64))
    return out


def read_leaf(path: str | Path, *, require_both: bool = True) -> tuple[Table, Table]:
    """LEAF JSON (FEMNIST) train and test Tables from a directory tree or a tar/zip archive.

    ``keys["user"]`` indexes ``info["users"]`` (sorted writer ids: those with both train and test
    records when `require_both`, else all). Rows are grouped by user in that order; X is stored
    as is (0..1), y the class index.
    """
    path = Path(path)
    if not path.exists():
        raise DataError(f"{path}: no such file or directory")
    docs, records = _leaf_sources(path)
    data: dict[str, dict[str, list]] = {"train": {}, "test": {}}
    names: dict[str, list[str]] = {"train": [], "test": []}
    for name, raw in docs:
        split = _leaf_split(name)
        assert split is not None  # _leaf_sources yields only train/ and test/ documents
        names[split].append(name)
        for user, xy in _leaf_document(path, name, raw).items():
            data[split].setdefault(user, []).append((name, xy))
    for split in ("train", "test"):
        if not names[split]:
            raise DataError(f"{path}: no {split}/*.json files found (LEAF needs train/ and test/ folders)")
    train_users, test_users = set(data["train"]), set(data["test"])
    users = sorted(train_users & test_users if require_both else train_users | test_users)
    if not users:
        raise DataError(f"{path}: no user has both train and test records (require_both=True)")
    widths = {xy[0].shape[1] for split in data.values() for parts in split.values() for _, xy in parts}
    if len(widths) != 1:
        raise DataError(f"{path}: LEAF records have different widths {sorted(widths)}")
    width = widths.pop()
    tables = []
    for split in ("train", "test"):
        info = {"reader": "leaf", "split": split, "files": records, "documents": sorted(names[split]),
                "require_both": require_both, "users": users, "n_users_in_split": len(data[split]),
                "n_users_dropped": len(set(data[split]) - set(users))}
        tables.append(_leaf_table(data[split], users, width, info))
    return tables[0], tables[1]


def _leaf_table(parts: dict[str, list], users: list[str], width: int, info: dict) -> Table:
    """One split's Table: rows grouped by user in the order of `users`, keys["user"] the index."""
    xs, ys, us = [np.zeros((0, width))], [np.zeros(0, np.int64)], [np.zeros(0, np.int64)]
    for u_index, user in enumerate(users):
        for _, (x, y) in sorted(parts.get(user, []), key=lambda part: part[0]):
            xs.append(x)
            ys.append(y)
            us.append(np.full(len(y), u_index, dtype=np.int64))
    y = np.concatenate(ys)
    info.update(n_rows=int(len(y)), n_users_kept=int(sum(u in parts for u in users)),
                label_counts=np.bincount(y).tolist())
    return Table(X=np.concatenate(xs), y=y.astype(np.float64), feature_names=[f"px{j}" for j in range(width)],
                 target="class", keys={"user": np.concatenate(us)}, info=info)
