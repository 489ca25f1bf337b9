"""MovieLens-100K ratings with item and user side information (`read_movielens`,
`MovieLens`) from the ml-100k folder or an archive holding it."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np

from mpi_dp.data.readers.common import _archive_kind, _file_record, _iter_archive, _junk, _require_file
from mpi_dp.errors import DataError

# ----------------------------------------------------------------------------------------------
# MovieLens-100K

_ML_FILES = ("u.data", "u.item", "u.user", "u.genre")
_ML_GENRES = ["unknown", "Action", "Adventure", "Animation", "Children's", "Comedy", "Crime",
              "Documentary", "Drama", "Fantasy", "Film-Noir", "Horror", "Musical", "Mystery", "Romance",
              "Sci-Fi", "Thriller", "War", "Western"]


@dataclasses.dataclass
class MovieLens:
    """MovieLens-100K ratings with item and user side information (0-based indices)."""

    user: np.ndarray  # int64 (n_ratings,) u.data user_id - 1
    item: np.ndarray  # int64 (n_ratings,) u.data item_id - 1
    rating: np.ndarray  # float64
    timestamp: np.ndarray  # int64
    item_genres: np.ndarray  # float64 (n_items, 19) genre flags from u.item
    item_titles: list[str]
    user_age: np.ndarray  # int64 (n_users,)
    user_gender: np.ndarray  # int64 codes into info["gender_levels"]
    user_occupation: np.ndarray  # int64 codes into info["occupation_levels"]
    info: dict


def _movielens_files(path: Path) -> tuple[dict[str, bytes], dict[str, str], list[dict]]:
    """Bytes of u.data/u.item/u.user (u.genre if present), their names, and the file records."""
    if path.is_dir():
        base = path if (path / "u.data").is_file() else path / "ml-100k"
        found = {n: base / n for n in _ML_FILES if (base / n).is_file()}
        missing = [n for n in _ML_FILES[:3] if n not in found]
        if missing:
            raise DataError(f"{path}: not a MovieLens-100K folder (missing {', '.join(missing)})")
        return ({n: p.read_bytes() for n, p in found.items()}, {n: str(p) for n, p in found.items()},
                [_file_record(p) for p in found.values()])
    _require_file(path)
    if _archive_kind(path) is None:
        raise DataError(f"{path}: not an ml-100k folder nor a .zip/.tar.xz/.tar.gz archive")

    def wanted(name: str) -> bool:
        return Path(name).name in _ML_FILES and not _junk(name)

    found_b: dict[str, bytes] = {}
    names: dict[str, str] = {}
    for name, raw in _iter_archive(path, wanted):
        member = Path(name).name
        if member not in names or len(Path(name).parts) < len(Path(names[member]).parts):
            found_b[member], names[member] = raw, name
    missing = [n for n in _ML_FILES[:3] if n not in found_b]
    if missing:
        raise DataError(f"{path}: archive has no {', '.join(missing)} (not MovieLens-100K)")
    return found_b, {n: f"{path}:{m}" for n, m in names.items()}, [_file_record(path)]


def _pipe_rows(raw: bytes, where: str, width: int) -> list[list[str]]:
    rows = []
    for no, line in enumerate(raw.decode("latin-1").splitlines(), start=1):
        if not line.strip():
            continue
        fields = line.split("|")
        if len(fields) != width:
            raise DataError(f"{where}: line {no} has {len(fields)} '|'-separated fields, expected {width}")
        rows.append(fields)
    return rows


def _by_id(ids: list[str], where: str) -> np.ndarray:
    """Row order putting records with ids 1..n at positions 0..n-1; DataError if ids are not 1..n."""
    try:
        a = np.asarray(ids, dtype=np.int64)
    except ValueError:
        raise DataError(f"{where}: ids are not integers") from None
    if not np.array_equal(np.sort(a), np.arange(1, len(a) + 1)):
        raise DataError(f"{where}: ids are not exactly 1..{len(a)}")
    return np.argsort(a)


def read_movielens(path: str | Path) -> MovieLens:
    """MovieLens-100K from the ml-100k folder or a .zip / .tar.xz archive holding it."""
    path = Path(path)
    if not path.exists():
        raise DataError(f"{path}: no such file or directory")
    raw, where, records = _movielens_files(path)
    try:
        data = np.asarray(raw["u.data"].split(), dtype=np.int64)
    except ValueError:
        raise DataError(f"{where['u.data']}: not tab-separated integers") from None
    if data.size % 4:
        raise DataError(f"{where['u.data']}: expected 4 fields per line (user, item, rating, timestamp)")
    data = data.reshape(-1, 4)
    items = _pipe_rows(raw["u.item"], where["u.item"], 24)
    users = _pipe_rows(raw["u.user"], where["u.user"], 5)
    items = [items[i] for i in _by_id([r[0] for r in items], where["u.item"])]
    users = [users[i] for i in _by_id([r[0] for r in users], where["u.user"])]
    try:
        genres = np.asarray([r[5:] for r in items], dtype=np.int64).astype(np.float64)
        age = np.asarray([r[1] for r in users], dtype=np.int64)
    except ValueError:
        raise DataError(f"{where['u.item']} / {where['u.user']}: non-integer genre flag or age") from None
    for col, n, name in ((0, len(users), "user"), (1, len(items), "item")):
        if data[:, col].min() < 1 or data[:, col].max() > n:
            raise DataError(f"{where['u.data']}: {name} ids outside 1..{n}")
    gender_levels, gender = np.unique([r[2] for r in users], return_inverse=True)
    occ_levels, occupation = np.unique([r[3] for r in users], return_inverse=True)
    genre_names = _ML_GENRES
    if "u.genre" in raw:
        pairs = [ln.split("|") for ln in raw["u.genre"].decode("latin-1").splitlines() if ln.strip()]
        if len(pairs) == 19 and all(len(p) == 2 for p in pairs):
            genre_names = [p[0] for p in sorted(pairs, key=lambda p: int(p[1]))]
    ratings = data[:, 2].astype(np.float64)
    levels, counts = np.unique(data[:, 2], return_counts=True)
    info = {"reader": "movielens", "files": records, "members": where, "n_ratings": int(len(data)),
            "n_users": len(users), "n_items": len(items),
            "rating_counts": {str(int(v)): int(c) for v, c in zip(levels, counts, strict=True)},
            "genres": genre_names, "gender_levels": gender_levels.tolist(),
            "occupation_levels": occ_levels.tolist()}
    return MovieLens(user=data[:, 0] - 1, item=data[:, 1] - 1, rating=ratings, timestamp=data[:, 3].copy(),
                     item_genres=genres, item_titles=[r[1] for r in items], user_age=age,
                     user_gender=gender.astype(np.int64), user_occupation=occupation.astype(np.int64),
                     info=info)
