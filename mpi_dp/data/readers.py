"""Readers: real dataset files (CSV, LIBSVM, IDX/MNIST, LEAF JSON, MovieLens) into in-memory tables.

Reading only turns bytes into numbers: no scaling, centring or partitioning happens here (that is
preprocessing). Every reader records in ``info`` what it read (path, size, sha256) and every
decision it took (dropped rows and columns with reasons, category levels, imputed values), so a
prepared dataset can say exactly where each number came from. All failures a user can cause raise
``DataError`` with a message naming the file and the problem.
"""

from __future__ import annotations

import bz2
import csv
import dataclasses
import gzip
import hashlib
import io
import json
import lzma
import tarfile
import zipfile
import zlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse

from mpi_dp.errors import DataError

#: cell values (after stripping blanks) that mean "missing"
MISSING_TOKENS = ("", "NA", "N/A", "n/a", "NaN", "nan", "null", "NULL", "None")
_MISSING = np.array(MISSING_TOKENS)
_DELIMITERS = (",", "\t", "|", ";")
_MISSING_POLICIES = ("zero", "drop", "mean", "median", "error")
_ENCODINGS = ("codes", "onehot", "frequency", "auto")
_COMPRESSION = {".gz": ("gzip", gzip.open), ".bz2": ("bzip2", bz2.open), ".xz": ("xz", lzma.open)}
_DECOMPRESS_ERRORS = (EOFError, OSError, lzma.LZMAError, zlib.error)


@dataclasses.dataclass
class Table:
    """Records read from one source, before preprocessing and partitioning."""

    X: np.ndarray | scipy.sparse.csr_matrix  # float64 (n, p)
    y: np.ndarray  # float64 (n,)
    feature_names: list[str]  # length p
    target: str  # name of the target column / label
    keys: dict[str, np.ndarray]  # per-record key columns kept aside (not features), each length n
    info: dict[str, Any]  # JSON-serialisable provenance and decisions


# ----------------------------------------------------------------------------------------------
# files


def sha256_file(path: str | Path) -> str:
    """Hex sha256 of a file's bytes as stored on disk (compressed files are hashed compressed)."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _file_record(path: Path) -> dict[str, Any]:
    return {"path": str(path.resolve()), "size": path.stat().st_size, "sha256": sha256_file(path)}


def _require_file(path: Path) -> None:
    if not path.exists():
        raise DataError(f"{path}: no such file")
    if not path.is_file():
        raise DataError(f"{path}: is not a regular file")


def _read_bytes(path: Path) -> bytes:
    """The decompressed content of `path` (.gz, .bz2, .xz by suffix; plain otherwise)."""
    _require_file(path)
    kind, opener = _COMPRESSION.get(path.suffix.lower(), (None, None))
    try:
        if opener is None:
            return path.read_bytes()
        with opener(path, "rb") as fh:
            return fh.read()
    except _DECOMPRESS_ERRORS as exc:
        if kind is None:
            raise DataError(f"{path}: cannot read file ({exc})") from None
        raise DataError(f"{path}: truncated or corrupt {kind} file ({exc})") from None


def _decode(data: bytes) -> tuple[str, str]:
    """Text from bytes: UTF-8 (a BOM is dropped), else Latin-1, which never fails."""
    try:
        return data.decode("utf-8-sig"), "utf-8"
    except UnicodeDecodeError:
        return data.decode("latin-1"), "latin-1"


# ----------------------------------------------------------------------------------------------
# CSV: parsing text into string columns


def _sniff_delimiter(text: str) -> str:
    """The candidate delimiter giving the most header fields with consistent row widths."""
    head = text[: 1 << 16]
    if len(text) > len(head) and "\n" in head:
        head = head[: head.rindex("\n")]
    best, best_score = ",", (False, 1)
    for d in _DELIMITERS:
        try:
            rows = [r for r in csv.reader(io.StringIO(head, newline=""), delimiter=d) if r][:50]
        except csv.Error:
            continue
        if not rows or len(rows[0]) < 2:
            continue
        score = (all(len(r) == len(rows[0]) for r in rows[1:]), len(rows[0]))
        if score > best_score:
            best, best_score = d, score
    return best


def _header_names(header: list[str]) -> tuple[list[str], dict[str, str]]:
    """Stripped header names; blanks named col<j>, repeats suffixed .1, .2 (renames returned)."""
    names: list[str] = []
    seen: set[str] = set()
    renamed: dict[str, str] = {}
    for j, raw in enumerate(header):
        name = raw.strip() or f"col{j + 1}"
        base, k = name, 0
        while name in seen:
            k += 1
            name = f"{base}.{k}"
        if name != raw:
            renamed[f"{j + 1}:{raw}"] = name
        seen.add(name)
        names.append(name)
    return names, renamed


def _parse_csv(text: str, delimiter: str, path: Path) -> tuple[list[str], list[tuple], np.ndarray, dict]:
    """Header names, string columns, physical line number of each record, and parse notes."""
    reader = csv.reader(io.StringIO(text, newline=""), delimiter=delimiter)
    try:
        header = next(reader, None)
        while header is not None and not any(f.strip() for f in header):
            header = next(reader, None)
        if header is None:
            raise DataError(f"{path}: is empty (a header row is required)")
        names, renamed = _header_names(header)
        width = len(names)
        rows: list[list[str]] = []
        lines: list[int] = []
        short: list[int] = []
        for row in reader:
            if not row:
                continue
            if len(row) != width:
                if len(row) > width:
                    raise DataError(f"{path}: line {reader.line_num} has {len(row)} fields but the "
                                    f"header has {width} (delimiter {delimiter!r})")
                short.append(reader.line_num)
                row = row + [""] * (width - len(row))
            rows.append(row)
            lines.append(reader.line_num)
    except csv.Error as exc:
        raise DataError(f"{path}: malformed CSV at line {reader.line_num} ({exc})") from None
    if not rows:
        raise DataError(f"{path}: has a header but no records")
    notes: dict[str, Any] = {}
    if renamed:
        notes["renamed_columns"] = renamed
    if short:
        notes["short_rows_padded"] = {"count": len(short), "lines": short[:20]}
    return names, list(zip(*rows, strict=True)), np.asarray(lines, dtype=np.int64), notes


def _clean(column: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """Stripped string values and the missing mask of one column."""
    values = np.char.strip(np.asarray(column, dtype=str))
    return values, np.isin(values, _MISSING)


def _to_float(values: np.ndarray) -> np.ndarray | None:
    """float64 of every value (a trailing % is dropped: '13.5%' -> 13.5), or None if any fails."""
    try:
        return values.astype(np.float64)
    except ValueError:
        pass
    pct = np.char.endswith(values, "%")
    if not pct.any():
        return None
    stripped = values.copy()
    stripped[pct] = [v[:-1] for v in values[pct]]
    try:
        return stripped.astype(np.float64)
    except ValueError:
        return None


def _numeric(values: np.ndarray, miss: np.ndarray) -> np.ndarray | None:
    """float64 column with NaN where missing, or None if a non-missing value is not a number."""
    parsed = _to_float(values[~miss])
    if parsed is None:
        return None
    out = np.full(values.shape, np.nan)
    out[~miss] = parsed
    return out


def _convert(values: np.ndarray, miss: np.ndarray, fn: Callable[[str], float], path: Path,
             name: str, lines: np.ndarray) -> np.ndarray:
    """A user converter applied to each non-missing value; NaN results count as missing."""
    out = np.full(values.shape, np.nan)
    cache: dict[str, float] = {}
    for i in np.flatnonzero(~miss):
        v = str(values[i])
        if v not in cache:
            try:
                cache[v] = float(fn(v))
            except Exception as exc:  # a recipe's parser may raise anything
                raise DataError(f"{path}: converter for column {name!r} failed on {v!r} at line "
                                f"{lines[i]} ({type(exc).__name__}: {exc})") from None
        out[i] = cache[v]
    return out


def _examples(values: np.ndarray, miss: np.ndarray, k: int = 5) -> str:
    """A few distinct non-numeric values of a column, for error messages."""
    bad = [v for v in dict.fromkeys(values[~miss].tolist()) if _to_float(np.array([v])) is None]
    return ", ".join(repr(v) for v in bad[:k])


def _preview(names: Sequence[str], k: int = 25) -> str:
    shown = ", ".join(names[:k])
    return shown if len(names) <= k else f"{shown}, ... ({len(names)} columns in all)"


# ----------------------------------------------------------------------------------------------
# CSV: target, features, keys


def _check_options(path: Path, names: list[str], target: str, columns, drop, keys, categorical,
                   converters, encoding: str, missing: str, max_missing_frac: float) -> None:
    """DataError for unknown column names, contradictory roles and invalid option values."""
    if encoding not in _ENCODINGS:
        raise DataError(f"encoding must be one of {', '.join(_ENCODINGS)}, got {encoding!r}")
    if missing not in _MISSING_POLICIES:
        raise DataError(f"missing must be one of {', '.join(_MISSING_POLICIES)}, got {missing!r}")
    if not 0.0 <= max_missing_frac <= 1.0:
        raise DataError(f"max_missing_frac must be in [0, 1], got {max_missing_frac}")
    if isinstance(categorical, str) and categorical != "auto":
        raise DataError(f"categorical must be 'auto', None or a list of columns, got {categorical!r}")
    if target not in names:
        raise DataError(f"{path}: target column {target!r} not found; available columns: "
                        f"{_preview(names)}")
    known = set(names)
    lists = {"columns": columns or (), "drop": drop, "keys": keys, "converters": converters or {}}
    if categorical is not None and not isinstance(categorical, str):
        lists["categorical"] = categorical
    for what, given in lists.items():
        unknown = [c for c in given if c not in known]
        if unknown:
            raise DataError(f"{path}: unknown column(s) in {what}: {', '.join(map(repr, unknown))}; "
                            f"available columns: {_preview(names)}")
    if target in drop or target in keys:
        raise DataError(f"{path}: the target {target!r} cannot be listed in drop or keys")
    clash = sorted(set(keys) & set(drop))
    if clash:
        raise DataError(f"{path}: column(s) {', '.join(map(repr, clash))} are both keys and dropped")


def _target(values: np.ndarray, miss: np.ndarray, path: Path, name: str, lines: np.ndarray,
            target_map: Mapping[str, float] | None, converter: Callable | None,
            info: dict) -> tuple[np.ndarray, np.ndarray]:
    """Target values (float64) and the mask of records to keep; unmapped labels are dropped."""
    keep = ~miss
    info["rows_dropped"]["missing target"] = int(miss.sum())
    if target_map is not None:
        table = {str(k).strip(): float(v) for k, v in target_map.items()}
        mapped = np.isin(values, list(table)) & keep
        unmapped = keep & ~mapped
        if unmapped.any():
            levels, counts = np.unique(values[unmapped], return_counts=True)
            info["rows_dropped"]["target not in target_map"] = int(unmapped.sum())
            info["target_unmapped_levels"] = {str(v): int(c) for v, c in zip(levels, counts, strict=True)}
        y = np.full(values.shape, np.nan)
        for label, v in table.items():
            y[mapped & (values == label)] = v
        info["target_map"] = table
        keep = mapped
    elif converter is not None:
        y = _convert(values, miss, converter, path, name, lines)
    else:
        y = _numeric(values, miss)
        if y is None:
            raise DataError(f"{path}: target column {name!r} is not numeric (values such as "
                            f"{_examples(values, miss)}); give a target_map, e.g. "
                            f"{{'yes': 1, 'no': -1}}")
    bad = keep & ~np.isfinite(y)
    if bad.any():
        info["rows_dropped"]["target not a finite number"] = int(bad.sum())
        keep = keep & ~bad
    if not keep.any():
        raise DataError(f"{path}: no record has a usable value of target {name!r}")
    return y, keep


@dataclasses.dataclass
class _Feature:
    """One feature column after typing: numeric values (NaN = missing) or category strings."""

    name: str
    kind: str  # "numeric" | "converted" | "categorical"
    values: np.ndarray  # float64 for numeric kinds, str for categorical
    miss: np.ndarray


def _type_features(path: Path, cols: dict[str, tuple], feature_names: list[str], keep: np.ndarray,
                   lines: np.ndarray, categorical, converters: Mapping, max_missing_frac: float,
                   info: dict) -> list[_Feature]:
    """Typed feature columns on the kept rows; drops all-missing and too-often-missing columns."""
    explicit = set(categorical) if categorical is not None and not isinstance(categorical, str) else None
    feats: list[_Feature] = []
    for name in feature_names:
        values, miss = _clean(cols[name])
        values, miss = values[keep], miss[keep]
        if name in converters:
            conv = _convert(values, miss, converters[name], path, name, lines[keep])
            miss = np.isnan(conv)
        if miss.all():
            info["dropped_columns"][name] = "entirely missing"
            continue
        frac = float(miss.mean())
        if frac > max_missing_frac:
            info["dropped_columns"][name] = f"missing share {frac:.4g} > max_missing_frac {max_missing_frac}"
            continue
        if name in converters:
            feats.append(_Feature(name, "converted", conv, miss))
            continue
        numeric = None if explicit is not None and name in explicit else _numeric(values, miss)
        if numeric is not None:
            nonfinite = ~miss & ~np.isfinite(numeric)
            if nonfinite.any():
                info.setdefault("nonfinite_as_missing", {})[name] = int(nonfinite.sum())
                numeric[nonfinite] = np.nan
                miss = miss | nonfinite
            feats.append(_Feature(name, "numeric", numeric, miss))
            continue
        if categorical is None or (explicit is not None and name not in explicit):
            raise DataError(f"{path}: column {name!r} is not numeric (values such as "
                            f"{_examples(values, miss)}); declare it categorical (--categorical "
                            f"{name}), drop it (--drop {name}) or give a converter")
        feats.append(_Feature(name, "categorical", values, miss))
    return feats


def _missing_rows(path: Path, feats: list[_Feature], lines: np.ndarray, policy: str,
                  info: dict) -> np.ndarray:
    """Mask (over the kept rows) of records to keep under the missing-value policy."""
    any_miss = np.zeros(len(lines), dtype=bool)
    for f in feats:
        any_miss |= f.miss
    if policy == "error" and any_miss.any():
        counts = {f.name: int(f.miss.sum()) for f in feats if f.miss.any()}
        first = int(lines[np.flatnonzero(any_miss)[0]])
        listed = ", ".join(f"{k!r} ({v})" for k, v in list(counts.items())[:10])
        raise DataError(f"{path}: missing values in {len(counts)} feature column(s): {listed}; first "
                        f"at line {first} (use missing='drop', 'zero', 'mean' or 'median')")
    if policy == "drop":
        info["rows_dropped"]["missing feature value"] = int(any_miss.sum())
        return ~any_miss
    return np.ones(len(lines), dtype=bool)


def _encode(f: _Feature, encoding: str, max_levels: int, info: dict) -> tuple[np.ndarray, list[str]]:
    """Float64 block (n, k) with NaN where missing, and its column names, for one feature."""
    if f.kind != "categorical":
        return f.values[:, None], [f.name]
    levels, inverse, counts = np.unique(f.values[~f.miss], return_inverse=True, return_counts=True)
    codes = np.full(len(f.values), -1, dtype=np.int64)
    codes[~f.miss] = inverse
    chosen = encoding
    if encoding == "auto":
        chosen = "onehot" if len(levels) <= max_levels else "frequency"
    record: dict[str, Any] = {"encoding": chosen, "levels": levels.tolist()}
    if chosen == "codes":
        block = codes.astype(np.float64)[:, None]
        names = [f.name]
    elif chosen == "onehot":
        block = (codes[:, None] == np.arange(len(levels))[None, :]).astype(np.float64)
        names = [f"{f.name}={lv}" for lv in levels]
    else:
        freq = counts / counts.sum()
        record["frequencies"] = freq.tolist()
        block = np.where(f.miss, 0.0, freq[np.maximum(codes, 0)])[:, None]
        names = [f.name]
    block[f.miss] = np.nan
    info["encodings"][f.name] = record
    return block, names


def _impute(X: np.ndarray, names: list[str], policy: str, info: dict) -> None:
    """Fill NaN in place: 0, column mean or column median over the observed values."""
    for j in np.flatnonzero(np.isnan(X).any(axis=0)):
        col = X[:, j]
        holes = np.isnan(col)
        value = 0.0 if policy == "zero" else float(np.nanmean(col) if policy == "mean" else np.nanmedian(col))
        col[holes] = value
        info["imputed"][names[j]] = {"count": int(holes.sum()), "value": value}


def _key_column(values: np.ndarray, miss: np.ndarray, name: str, info: dict) -> np.ndarray:
    """A key column: int64 if integral and complete, float64 (NaN missing) if numeric, else codes."""
    numeric = _numeric(values, miss)
    record: dict[str, Any] = {"missing": int(miss.sum())}
    if numeric is not None:
        if not miss.any() and np.all(numeric == np.round(numeric)) and np.all(np.abs(numeric) < 2**53):
            out, record["kind"] = numeric.astype(np.int64), "integer"
        else:
            out, record["kind"] = numeric, "numeric"
    else:
        levels, inverse = np.unique(values[~miss], return_inverse=True)
        out = np.full(len(values), -1, dtype=np.int64)
        out[~miss] = inverse
        record["kind"] = "codes"
        record["levels"] = levels.tolist()
    info["keys"][name] = record
    return out


def read_csv(path: str | Path, target: str, *, columns: Sequence[str] | None = None,
             drop: Sequence[str] = (), keys: Sequence[str] = (),
             categorical: str | Sequence[str] | None = "auto", encoding: str = "codes",
             onehot_max_levels: int = 16, missing: str = "zero", max_missing_frac: float = 1.0,
             target_map: Mapping[str, float] | None = None,
             converters: Mapping[str, Callable[[str], float]] | None = None,
             delimiter: str | None = None) -> Table:
    """Read a delimited text file with a header row into a dense Table.

    Numeric columns parse as floats ('13.5%' -> 13.5); the tokens in MISSING_TOKENS are missing.
    Non-numeric features are categorical (encoded as codes, one-hot or frequency) as allowed by
    `categorical`; `keys` columns go to ``Table.keys``. Rows are dropped for a missing target, a
    target label outside `target_map`, and (missing='drop') any missing feature; columns are
    dropped when entirely missing or missing more often than `max_missing_frac`. Features keep
    the header order. Category levels are the sorted distinct strings of the kept rows, and
    frequencies are shares among the non-missing values. Rows shorter than the header (such as a
    truncated last line) are padded with missing values and noted in info. Key columns never
    cause rows to be dropped: a missing key is NaN (numeric keys) or code -1 (string keys).
    """
    path = Path(path)
    for what, given in (("columns", columns), ("drop", drop), ("keys", keys)):
        if isinstance(given, str):
            raise DataError(f"{what} must be a list of column names, got the string {given!r}")
    drop, keys = list(drop), list(keys)
    converters = dict(converters or {})
    text, text_encoding = _decode(_read_bytes(path))
    delim = delimiter or _sniff_delimiter(text)
    names, cols_list, lines, notes = _parse_csv(text, delim, path)
    _check_options(path, names, target, columns, drop, keys, categorical, converters, encoding,
                   missing, max_missing_frac)
    cols = dict(zip(names, cols_list, strict=True))
    info: dict[str, Any] = {
        "reader": "csv", "files": [_file_record(path)], "text_encoding": text_encoding,
        "delimiter": delim, "n_rows_read": len(lines), "n_columns_read": len(names),
        "options": {"target": target, "columns": list(columns) if columns is not None else None,
                    "drop": drop, "keys": keys,
                    "categorical": categorical if categorical is None or isinstance(categorical, str)
                    else list(categorical),
                    "encoding": encoding, "onehot_max_levels": onehot_max_levels, "missing": missing,
                    "max_missing_frac": max_missing_frac, "converters": sorted(converters)},
        **notes, "rows_dropped": {}, "dropped_columns": {}, "encodings": {}, "imputed": {}, "keys": {},
    }
    for name in drop:
        info["dropped_columns"][name] = "listed in drop"
    values, miss = _clean(cols[target])
    y, keep = _target(values, miss, path, target, lines, target_map, converters.get(target), info)
    chosen = [c for c in names if columns is None or c in set(columns)]
    feature_names = [c for c in chosen if c != target and c not in keys and c not in drop]
    feats = _type_features(path, cols, feature_names, keep, lines, categorical, converters,
                           max_missing_frac, info)
    if not feats:
        raise DataError(f"{path}: no feature columns left (dropped: {info['dropped_columns']})")
    rows = _missing_rows(path, feats, lines[keep], missing, info)
    keep[np.flatnonzero(keep)[~rows]] = False
    if not keep.any():
        raise DataError(f"{path}: no records left after dropping rows ({info['rows_dropped']})")
    blocks, out_names = [], []
    for f in feats:
        f.values, f.miss = f.values[rows], f.miss[rows]
        block, block_names = _encode(f, encoding, onehot_max_levels, info)
        blocks.append(block)
        out_names.extend(block_names)
    X = np.ascontiguousarray(np.hstack(blocks), dtype=np.float64)
    _impute(X, out_names, missing, info)
    info["column_kinds"] = {f.name: f.kind for f in feats}
    key_arrays = {}
    for name in keys:
        kv, km = _clean(cols[name])
        key_arrays[name] = _key_column(kv[keep], km[keep], name, info)
    info["n_rows"] = int(keep.sum())
    info["n_features"] = len(out_names)
    return Table(X=X, y=y[keep].astype(np.float64), feature_names=out_names, target=target,
                 keys=key_arrays, info=info)


# ----------------------------------------------------------------------------------------------
# LIBSVM / SVMlight


def _libsvm_tokens(text: str) -> tuple[list[str], list[int], list[str], list[int]]:
    """Labels, source line numbers, all idx:val tokens and the token count of each record."""
    labels: list[str] = []
    line_nos: list[int] = []
    tokens: list[str] = []
    counts: list[int] = []
    for no, line in enumerate(text.splitlines(), start=1):
        hash_at = line.find("#")
        if hash_at >= 0:
            line = line[:hash_at]
        parts = line.split()
        if not parts:
            continue
        labels.append(parts[0])  # parsed below, all at once
        line_nos.append(no)
        feats = [t for t in parts[1:] if not t.startswith("qid:")]
        tokens.extend(feats)
        counts.append(len(feats))
    return labels, line_nos, tokens, counts


def _libsvm_bad_token(path: Path, tokens: list[str], token_line: np.ndarray) -> DataError:
    """The first malformed idx:val token, as a DataError naming its line."""
    for t, no in zip(tokens, token_line, strict=True):
        idx, sep, val = t.partition(":")
        try:
            ok = sep == ":" and int(idx) >= 1 and bool(np.isfinite(float(val)))
        except ValueError:
            ok = False
        if not ok:
            return DataError(f"{path}: malformed LIBSVM line {no}: bad feature token {t!r} "
                             f"(expected index:value with a 1-based integer index)")
    return DataError(f"{path}: malformed LIBSVM data")


def read_libsvm(path: str | Path, n_features: int | None = None) -> Table:
    """Read a LIBSVM/SVMlight file into a Table with a CSR X (sorted indices, duplicates summed).

    Indices are 1-based; ``qid:`` tokens and text after ``#`` are ignored; n_features defaults to
    the largest index. Labels are kept as written (float64).
    """
    path = Path(path)
    text, _ = _decode(_read_bytes(path))
    labels_s, line_nos, tokens, counts = _libsvm_tokens(text)
    if not labels_s:
        raise DataError(f"{path}: has no LIBSVM records")
    lines = np.asarray(line_nos, dtype=np.int64)
    try:
        y = np.asarray(labels_s, dtype=str).astype(np.float64)
    except ValueError:
        for s, no in zip(labels_s, line_nos, strict=True):
            try:
                float(s)
            except ValueError:
                raise DataError(f"{path}: malformed LIBSVM line {no}: label {s!r} is not a number") from None
        raise DataError(f"{path}: malformed LIBSVM labels") from None
    if not np.isfinite(y).all():
        no = int(lines[np.flatnonzero(~np.isfinite(y))[0]])
        raise DataError(f"{path}: malformed LIBSVM line {no}: the label is not finite")
    counts_a = np.asarray(counts, dtype=np.int64)
    rows = np.repeat(np.arange(len(y), dtype=np.int64), counts_a)
    if tokens:
        parts = np.char.partition(np.asarray(tokens, dtype=str), ":")
        try:
            if not np.all(parts[:, 1] == ":"):
                raise ValueError
            idx = parts[:, 0].astype(np.int64)
            val = parts[:, 2].astype(np.float64)
            if idx.min() < 1 or not np.isfinite(val).all():
                raise ValueError
        except ValueError:
            raise _libsvm_bad_token(path, tokens, lines[rows]) from None
        max_index = int(idx.max())
    else:
        idx, val, max_index = np.zeros(0, np.int64), np.zeros(0), 0
    if n_features is None:
        n_features = max_index
    elif n_features < max_index:
        raise DataError(f"{path}: has feature index {max_index} but n_features = {n_features} was given")
    X = scipy.sparse.coo_matrix((val, (rows, idx - 1)), shape=(len(y), n_features)).tocsr()
    X.sum_duplicates()
    X.sort_indices()
    levels, lcounts = np.unique(y, return_counts=True)
    info = {"reader": "libsvm", "files": [_file_record(path)], "n_rows": len(y),
            "n_features": int(n_features), "max_index": max_index, "nnz": int(X.nnz),
            "label_counts": {repr(float(v)): int(c) for v, c in zip(levels, lcounts, strict=True)}}
    return Table(X=X, y=y, feature_names=[f"f{j}" for j in range(1, n_features + 1)], target="label",
                 keys={}, info=info)


# ----------------------------------------------------------------------------------------------
# IDX / MNIST

_IDX_SHAPES = {2049: 1, 2051: 3}


def read_idx(path: str | Path) -> np.ndarray:
    """An IDX array (MNIST): magic 2049 -> uint8 labels (n,), 2051 -> uint8 images (n, rows, cols)."""
    path = Path(path)
    data = _read_bytes(path)
    if len(data) < 4:
        raise DataError(f"{path}: too short for an IDX file ({len(data)} bytes)")
    magic = int.from_bytes(data[:4], "big")
    if magic not in _IDX_SHAPES:
        raise DataError(f"{path}: bad IDX magic number {magic} (expected 2049 for labels or 2051 "
                        f"for images)")
    ndim = _IDX_SHAPES[magic]
    head = 4 + 4 * ndim
    if len(data) < head:
        raise DataError(f"{path}: truncated IDX header ({len(data)} bytes)")
    shape = tuple(int.from_bytes(data[4 + 4 * k: 8 + 4 * k], "big") for k in range(ndim))
    expected = head + int(np.prod(shape))
    if len(data) != expected:
        what = "short" if len(data) < expected else "too long"
        raise DataError(f"{path}: IDX data {what}: shape {shape} needs {expected} bytes, file has "
                        f"{len(data)}")
    return np.frombuffer(data, dtype=np.uint8, offset=head).reshape(shape).copy()


def _find_mnist(directory: Path, stem: str) -> Path:
    for name in (stem, f"{stem}.gz", stem.replace("-idx", ".idx"), stem.replace("-idx", ".idx") + ".gz"):
        if (directory / name).is_file():
            return directory / name
    raise DataError(f"{directory}: no {stem} or {stem}.gz file (found: "
                    f"{', '.join(sorted(p.name for p in directory.iterdir())) or 'nothing'})")


def read_mnist(directory: str | Path) -> tuple[Table, Table]:
    """MNIST train and test Tables: X raw pixels 0..255 (float64, 784 columns), y digits 0..9."""
    directory = Path(directory)
    if not directory.is_dir():
        raise DataError(f"{directory}: is not a directory with MNIST IDX files")
    tables = []
    for split, prefix in (("train", "train"), ("test", "t10k")):
        img_path = _find_mnist(directory, f"{prefix}-images-idx3-ubyte")
        lab_path = _find_mnist(directory, f"{prefix}-labels-idx1-ubyte")
        images, labels = read_idx(img_path), read_idx(lab_path)
        if images.ndim != 3 or labels.ndim != 1:
            raise DataError(f"{img_path}: expected images (magic 2051) and labels (magic 2049)")
        if images.shape[0] != labels.shape[0]:
            raise DataError(f"{img_path}: {images.shape[0]} images but {lab_path} has "
                            f"{labels.shape[0]} labels")
        if labels.size and labels.max() > 9:
            raise DataError(f"{lab_path}: label {int(labels.max())} is not a digit 0..9")
        X = images.reshape(images.shape[0], -1).astype(np.float64)
        info = {"reader": "mnist", "split": split, "files": [_file_record(img_path), _file_record(lab_path)],
                "n_rows": int(X.shape[0]), "image_shape": list(images.shape[1:]),
                "label_counts": np.bincount(labels, minlength=10).tolist()}
        tables.append(Table(X=X, y=labels.astype(np.float64),
                            feature_names=[f"px{j}" for j in range(X.shape[1])], target="digit",
                            keys={}, info=info))
    return tables[0], tables[1]


# ----------------------------------------------------------------------------------------------
# archives (LEAF, MovieLens)


def _archive_kind(path: Path) -> str | None:
    name = path.name.lower()
    if name.endswith(".zip"):
        return "zip"
    if name.endswith((".tar", ".tar.gz", ".tgz", ".tar.xz", ".txz", ".tar.bz2", ".tbz2")):
        return "tar"
    return None


def _iter_archive(path: Path, wanted: Callable[[str], bool]) -> Iterator[tuple[str, bytes]]:
    """(member name, bytes) of regular members accepted by `wanted`, read in archive order."""
    try:
        if _archive_kind(path) == "zip":
            with zipfile.ZipFile(path) as zf:
                for m in zf.infolist():
                    if not m.is_dir() and wanted(m.filename):
                        yield m.filename, zf.read(m)
        else:
            with tarfile.open(path, "r:*") as tf:
                for m in tf:
                    if m.isfile() and wanted(m.name):
                        fh = tf.extractfile(m)
                        if fh is not None:
                            yield m.name, fh.read()
    except (tarfile.TarError, zipfile.BadZipFile, *_DECOMPRESS_ERRORS) as exc:
        raise DataError(f"{path}: truncated or corrupt archive ({type(exc).__name__}: {exc})") from None


def _junk(name: str) -> bool:
    parts = Path(name).parts
    return "__MACOSX" in parts or Path(name).name.startswith("._")


def read_csv_strings(path: str | Path, member: str | None = None
                     ) -> tuple[list[str], dict[str, np.ndarray], dict[str, Any]]:
    """Header names and raw string columns of a CSV file, or of the archive member whose path ends
    with `member` (read in memory, nothing extracted). No typing and no missing-value tokens: the
    caller decides what is missing (UCI's '?', where 'None' is a real level)."""
    path = Path(path)
    _require_file(path)
    if member is None:
        raw, where = _read_bytes(path), str(path)
    else:
        if _archive_kind(path) is None:
            raise DataError(f"{path}: not a .zip/.tar archive (looked for member {member!r})")
        found = list(_iter_archive(path, lambda n: n.endswith(member) and not _junk(n)))
        if len(found) != 1:
            raise DataError(f"{path}: expected one member ending in {member!r}, found "
                            f"{[n for n, _ in found] or 'none'}")
        where, raw = f"{path}:{found[0][0]}", found[0][1]
    text, encoding = _decode(raw)
    names, cols, _, notes = _parse_csv(text, ",", Path(where))
    columns = {n: np.asarray(c, dtype=str) for n, c in zip(names, cols, strict=True)}
    info = {"reader": "csv_strings", "files": [_file_record(path)], "member": where,
            "encoding": encoding, "n_rows": len(cols[0]), "n_columns": len(names), **notes}
    return names, columns, info


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
        base = Path(name).name
        if base not in names or len(Path(name).parts) < len(Path(names[base]).parts):
            found_b[base], names[base] = raw, name
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
