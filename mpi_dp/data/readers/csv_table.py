"""CSV cells into a Table: the decisions of the CSV reader (`read_csv`, `read_csv_test`).

Which column is the target and how it becomes a number, which columns are features or keys,
which rows and columns are dropped and why (counted by reason), how categories are encoded and
missing cells imputed. `Table.fitted` keeps what was decided on a training file, so that
`read_csv_test` reads a test file exactly the same way and fits nothing on it. The parsing of
text into typed cells is in `csv_text`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:  # only in annotations: pandas loads where csv_text reads a CSV
    import pandas as pd

from mpi_dp.data.readers.common import Table, _require_file
from mpi_dp.data.readers.csv_text import (
    CsvFormat,
    _cells,
    _convert,
    _count_na,
    _drop,
    _examples,
    _floats,
    _guess_error,
    _numbers_but,
    _numeric,
    _placeholders,
    _preview,
    _quoted,
    _read_rows,
    _to_float,
)
from mpi_dp.errors import DataError

_MISSING_POLICIES = ("zero", "drop", "mean", "median", "error")
_ENCODINGS = ("codes", "onehot", "frequency", "auto")

#: reasons a CSV row is dropped, in the order they are checked (a row counts under the first)
DROP_RAGGED = "ragged row"
DROP_MISSING_TARGET = "missing target"
DROP_NULL_TARGET = "target mapped to null"
DROP_NONFINITE_TARGET = "non-finite target"
DROP_NONFINITE_FEATURE = "non-finite feature value"
DROP_MISSING_FEATURE = "missing feature value"
#: reasons only a test file's row is dropped (its target cannot be read as training's was)
DROP_UNMAPPED_TARGET = "target not in the target map"
DROP_UNSEEN_TARGET = "target value not in the training file"
DROP_TARGET_NOT_NUMBER = "target not a number"

#: reasons a feature cell is missing and so imputed (or its row dropped under missing="drop")
_WHY_MISSING = {1: "missing value", 2: "short row", 3: "converter gave no number",
                4: "category unseen in training"}


# ----------------------------------------------------------------------------------------------
# CSV: target


def _check_options(where: str, names: list[str], target: str, columns, drop, keys, categorical,
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
        raise DataError(f"{where}: target column {target!r} not found; the columns are: "
                        f"{_preview(names)}")
    known = set(names)
    lists = {"columns": columns or (), "drop": drop, "keys": keys, "converters": converters or {}}
    if categorical is not None and not isinstance(categorical, str):
        lists["categorical"] = categorical
    for what, given in lists.items():
        unknown = [c for c in given if c not in known]
        if unknown:
            raise DataError(f"{where}: unknown column(s) in {what}: {', '.join(map(repr, unknown))}; "
                            f"the columns are: {_preview(names)}")
    if target in drop or target in keys:
        raise DataError(f"{where}: the target {target!r} cannot be listed in drop or keys")
    clash = sorted(set(keys) & set(drop))
    if clash:
        raise DataError(f"{where}: column(s) {', '.join(map(repr, clash))} are both keys and dropped")


def target_table(target_map: Mapping[str, Any]) -> dict[str, float | None]:
    """A validated target map: stripped label -> finite number, or None (drop those rows)."""
    if not isinstance(target_map, Mapping) or not target_map:
        raise DataError(f"a target map must be a non-empty mapping of label -> number, got {target_map!r}")
    table: dict[str, float | None] = {}
    for label, value in target_map.items():
        key = str(label).strip()
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                  or not np.isfinite(value)):
            raise DataError(f"target map: the value of {key!r} must be a finite number or null, "
                            f"got {value!r}")
        if key in table:
            raise DataError(f"target map: label {key!r} is given twice (labels are compared stripped)")
        table[key] = None if value is None else float(value)
    return table


def _value_counts(values: np.ndarray, k: int = 5) -> str:
    """The k most frequent values with their row counts, e.g. "'>50K.' (12 rows), 'x' (1 row)"."""
    levels, counts = np.unique(values, return_counts=True)
    order = np.argsort(-counts, kind="stable")
    shown = [f"{str(levels[i])!r} ({counts[i]} row{'s' if counts[i] != 1 else ''})" for i in order[:k]]
    more = f" and {len(levels) - k} more value(s)" if len(levels) > k else ""
    return ", ".join(shown) + more


def _map_target(values: np.ndarray, keep: np.ndarray, where: str, name: str,
                target_map: Mapping[str, Any], info: dict) -> tuple[np.ndarray, np.ndarray]:
    """Target values through the map; an unmapped value is an error, a null drops its rows."""
    table = target_table(target_map)
    unmapped = keep & ~np.isin(values, list(table))
    if unmapped.any():
        raise DataError(f"{where}: target {name!r} has value(s) the target map does not map: "
                        f"{_value_counts(values[unmapped])}; add them to the map (null drops "
                        f"those rows)")
    y = np.full(values.shape, np.nan)
    nulls = np.zeros(values.shape, dtype=bool)
    counts: dict[str, int] = {}
    for label, value in table.items():
        hit = keep & (values == label)
        counts[label] = int(hit.sum())
        if value is None:
            nulls |= hit
        else:
            y[hit] = value
    _drop(info, DROP_NULL_TARGET, nulls)
    info["target_map"] = table
    info["target_counts"] = counts
    return y, keep & ~nulls


def _matches(values: np.ndarray, positive: str, decimal: str = ".") -> np.ndarray:
    """Cells equal to `positive` as strings, or as numbers when both parse ('1.0' matches '1')."""
    wanted = positive.strip()
    hit = values == wanted
    number = _to_float(np.array([wanted]), decimal)
    if number is None:
        return hit
    for level in np.unique(values[~hit]):
        parsed = _to_float(np.array([level]), decimal)
        if parsed is not None and parsed[0] == number[0]:
            hit |= values == level
    return hit


def _positive_target(values: np.ndarray, keep: np.ndarray, where: str, name: str, positive: str,
                     info: dict, decimal: str) -> np.ndarray:
    """+1 where the target equals `positive`, -1 for every other (non-missing) value."""
    hit = keep & _matches(values, str(positive), decimal)
    if not hit.any():
        raise DataError(f"{where}: --positive {positive!r} matches no row of target {name!r}; its "
                        f"values are {_value_counts(values[keep])}")
    if not (keep & ~hit).any():
        raise DataError(f"{where}: every row of target {name!r} is {positive!r}: no negative class")
    info["positive"] = {"value": str(positive), "rows_positive": int(hit.sum()),
                        "rows_negative": int((keep & ~hit).sum()),
                        "negative_values": sorted(set(values[keep & ~hit].tolist()))[:50]}
    return np.where(hit, 1.0, -1.0)


def _target(values: np.ndarray, miss: np.ndarray, where: str, name: str,
            target_map: Mapping[str, Any] | None, positive: str | None, converter: Callable | None,
            info: dict, fmt: CsvFormat) -> tuple[np.ndarray, np.ndarray]:
    """Target values (float64) and the mask of records to keep, each drop counted by reason."""
    keep = ~miss
    _drop(info, DROP_MISSING_TARGET, miss)
    y: np.ndarray | None
    if target_map is not None:
        y, keep = _map_target(values, keep, where, name, target_map, info)
    elif positive is not None:
        y = _positive_target(values, keep, where, name, positive, info, fmt.decimal)
    elif converter is not None:
        y = _convert(values, miss, converter, where, name)
    else:
        y = _numeric(values, miss, fmt.decimal)
        if y is None:
            holders = _placeholders(values, miss)
            flags = _numbers_but(values, miss, fmt, holders)
            if flags:
                raise _guess_error(where, name, values, miss, holders, flags, target=True)
            raise DataError(f"{where}: target column {name!r} is not numeric (values such as "
                            f"{_examples(values, miss, decimal=fmt.decimal)}); map it to numbers "
                            f"with a target map (--target-map '{{\"yes\": 1, \"no\": -1}}') or "
                            f"name the positive class (--positive yes)")
    bad = keep & ~np.isfinite(y)
    _drop(info, DROP_NONFINITE_TARGET, bad)
    keep = keep & ~bad
    if not keep.any():
        raise DataError(f"{where}: no record has a usable value of target {name!r} "
                        f"(rows dropped: {info['rows_dropped']})")
    return y, keep


# ----------------------------------------------------------------------------------------------
# CSV: features and keys


@dataclasses.dataclass
class _Feature:
    """One feature column after typing: numeric values (NaN = missing) or category strings."""

    name: str
    kind: str  # "numeric" | "converted" | "categorical"
    values: np.ndarray  # float64 for numeric kinds, str for categorical
    why: np.ndarray  # int8 per cell: 0 present, else the key of its reason in _WHY_MISSING

    @property
    def miss(self) -> np.ndarray:
        return self.why > 0

    def take(self, rows: np.ndarray) -> None:
        self.values, self.why = self.values[rows], self.why[rows]


def _missing_why(miss: np.ndarray, short: np.ndarray) -> np.ndarray:
    """Reason code per cell: 1 missing token, 2 lacking in a short row, 0 present."""
    return np.where(short, 2, np.where(miss, 1, 0)).astype(np.int8)


def _type_feature(where: str, name: str, column: pd.Series, keep: np.ndarray, categorical,
                  converters: Mapping, fmt: CsvFormat, info: dict) -> tuple[_Feature, np.ndarray]:
    """One feature on the kept rows, and the mask of its non-finite numbers (inf, nan, 1e400).
    A column of numbers but for placeholders or decimal commas is an error unless the user
    declared it categorical (always in a strict read; else where it may not be categorical); the
    placeholder cells of a categorical column are kept as a level and counted."""
    values, miss, short = (a[keep] for a in _cells(column, fmt.na))
    _count_na(values, fmt, info)
    why = _missing_why(miss, short)
    explicit = categorical is not None and not isinstance(categorical, str)
    if name in converters:
        conv = _convert(values, miss, converters[name], where, name)
        why[~miss & np.isnan(conv)] = 3
        return _Feature(name, "converted", conv, why), ~np.isnan(conv) & ~np.isfinite(conv)
    declared = explicit and name in categorical
    numeric = None if declared else _numeric(values, miss, fmt.decimal)
    if numeric is not None:
        return _Feature(name, "numeric", numeric, why), ~miss & ~np.isfinite(numeric)
    allowed = categorical is not None and (not explicit or declared)
    holders = _placeholders(values, miss)
    if not declared and (fmt.strict or not allowed):
        flags = _numbers_but(values, miss, fmt, holders)
        if flags:
            raise _guess_error(where, name, values, miss, holders, flags, target=False)
    if not allowed:
        raise DataError(f"{where}: column {name!r} is not numeric (values such as "
                        f"{_examples(values, miss, decimal=fmt.decimal)}); declare it categorical "
                        f"(--categorical {name}), drop it (--drop {name}) or give a converter")
    if holders:
        info["placeholder_cells"][name] = holders
    return _Feature(name, "categorical", values, why), np.zeros(len(values), dtype=bool)


def _drop_sparse_columns(feats: list[_Feature], max_missing_frac: float, info: dict) -> list[_Feature]:
    """The features left after dropping the entirely missing and the too-often missing ones."""
    kept = []
    for f in feats:
        frac = float(f.miss.mean())
        if f.miss.all():
            info["dropped_columns"][f.name] = "entirely missing"
        elif frac > max_missing_frac:
            info["dropped_columns"][f.name] = (f"missing share {frac:.4g} > max_missing_frac "
                                               f"{max_missing_frac}")
        else:
            kept.append(f)
    return kept


def _missing_rows(where: str, feats: list[_Feature], records: np.ndarray, policy: str,
                  info: dict) -> np.ndarray:
    """Mask (over the kept rows) of records to keep under the missing-value policy."""
    any_miss = np.zeros(len(records), dtype=bool)
    for f in feats:
        any_miss |= f.miss
    if policy == "error" and any_miss.any():
        counts = {f.name: int(f.miss.sum()) for f in feats if f.miss.any()}
        first = int(records[np.flatnonzero(any_miss)[0]])
        listed = ", ".join(f"{k!r} ({v})" for k, v in list(counts.items())[:10])
        raise DataError(f"{where}: missing values in {len(counts)} feature column(s): {listed}; first "
                        f"in record {first} (use missing='drop', 'zero', 'mean' or 'median')")
    if policy == "drop":
        _drop(info, DROP_MISSING_FEATURE, any_miss)
        return ~any_miss
    return np.ones(len(records), dtype=bool)


def _count_imputed(whys: Sequence[np.ndarray], info: dict) -> None:
    """Count the feature cells about to be imputed, by why they are missing."""
    why = np.concatenate(list(whys))
    codes, counts = np.unique(why[why > 0], return_counts=True)
    info["cells_imputed"] = {_WHY_MISSING[int(c)]: int(n) for c, n in zip(codes, counts, strict=True)}


def _encode(f: _Feature, encoding: str, max_levels: int, info: dict) -> tuple[np.ndarray, list[str]]:
    """Float64 block (n, k) with NaN where missing, and its column names, for one feature."""
    if f.kind != "categorical":
        return f.values[:, None], [f.name]
    miss = f.miss
    levels, inverse, counts = np.unique(f.values[~miss], return_inverse=True, return_counts=True)
    codes = np.full(len(f.values), -1, dtype=np.int64)
    codes[~miss] = inverse
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
        block = np.where(miss, 0.0, freq[np.maximum(codes, 0)])[:, None]
        names = [f.name]
    block[miss] = np.nan
    info["encodings"][f.name] = record
    return block, names


def _impute(X: np.ndarray, names: list[str], policy: str, info: dict) -> np.ndarray:
    """Fill NaN in place: 0, column mean or column median over the observed values. Returns the
    fill value of every column (a test file's missing cells get the same)."""
    fill = np.zeros(X.shape[1])
    for j in range(X.shape[1]):
        col = X[:, j]
        holes = np.isnan(col)
        if policy in ("mean", "median") and not holes.all():
            fill[j] = float(np.nanmean(col) if policy == "mean" else np.nanmedian(col))
        if holes.any():
            col[holes] = fill[j]
            info["imputed"][names[j]] = {"count": int(holes.sum()), "value": float(fill[j])}
    return fill


def _key_column(values: np.ndarray, miss: np.ndarray, name: str, info: dict,
                decimal: str = ".") -> np.ndarray:
    """A key column: int64 if integral and complete, float64 (NaN missing) if numeric, else codes
    (-1 missing)."""
    numeric = _numeric(values, miss, decimal)
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


def _features(where: str, rows: pd.DataFrame, feature_names: list[str], keep: np.ndarray,
              categorical, converters: Mapping, max_missing_frac: float, info: dict,
              fmt: CsvFormat) -> list[_Feature]:
    """Typed features on the rows to keep; clears `keep` (in place) for rows with a non-finite
    number; drops entirely and too-often missing columns."""
    feats, nonfinite = [], np.zeros(int(keep.sum()), dtype=bool)
    for name in feature_names:
        f, bad = _type_feature(where, name, rows[name], keep, categorical, converters, fmt, info)
        if bad.any():
            info["nonfinite_values"][name] = int(bad.sum())
        nonfinite |= bad
        feats.append(f)
    _drop(info, DROP_NONFINITE_FEATURE, nonfinite)
    for f in feats:
        f.take(~nonfinite)
    keep[np.flatnonzero(keep)[nonfinite]] = False
    return _drop_sparse_columns(feats, max_missing_frac, info)


def read_csv(path: str | Path, target: str, *, columns: Sequence[str] | None = None,
             drop: Sequence[str] = (), keys: Sequence[str] = (),
             categorical: str | Sequence[str] | None = "auto", encoding: str = "codes",
             onehot_max_levels: int = 16, missing: str = "zero", max_missing_frac: float = 1.0,
             target_map: Mapping[str, Any] | None = None, positive: str | None = None,
             converters: Mapping[str, Callable[[str], float]] | None = None,
             delimiter: str | None = None, names: Sequence[str] | None = None,
             na_values: Sequence[str] = (), decimal: str = ".", skip_rows: int = 0,
             strict: bool = False) -> Table:
    """Read a delimited text file into a dense Table; pandas parses, the decisions are recorded.

    The first row (after `skip_rows` lines) is the header unless `names` is given (a file without
    a header row: the names must match its first row's field count). The delimiter is sniffed
    from the first line unless given. Cells are stripped; the tokens in MISSING_TOKENS and
    `na_values` are missing. Numeric columns parse as floats ('13.5%' -> 13.5; with decimal ','
    '3,25' -> 3.25); non-numeric features are categorical (codes, one-hot or frequency; auto:
    one-hot up to `onehot_max_levels` levels) as `categorical` allows; `keys` columns go to
    ``Table.keys`` and never drop a row. `strict` refuses guesses (see `CsvFormat`).

    The target is numeric, or mapped by `target_map` (stripped label -> number; a label mapped to
    None drops its rows; a label the map lacks is an error naming it and its row count), or
    binary by `positive` (that value -> +1, every other -> -1). Rows are dropped, and counted in
    ``info["rows_dropped"]`` by reason, for: more fields than the header ("ragged row"), a missing
    target, a target mapped to None, a non-finite target, a non-finite feature number (inf, a nan
    spelling outside MISSING_TOKENS, overflow such as 1e400), and under missing='drop' a missing
    feature value. Rows shorter than the header are kept with the lacking cells missing. Columns
    are dropped when entirely missing or missing more often than `max_missing_frac`. Missing
    cells are imputed (0, mean or median) and counted in ``info["cells_imputed"]`` by reason.
    Category levels are the sorted distinct strings of the kept rows. Records are numbered from 1
    after the header in messages. ``Table.fitted`` keeps what `read_csv_test` needs to read a
    test file the same way.
    """
    path = Path(path)
    for what, given in (("columns", columns), ("drop", drop), ("keys", keys)):
        if isinstance(given, str):
            raise DataError(f"{what}: must be a list of column names, got the string {given!r}")
    if target_map is not None and positive is not None:
        raise DataError("give either a target map or a positive value, not both")
    drop, keys, converters = list(drop), list(keys), dict(converters or {})
    fmt = CsvFormat(delimiter=delimiter, names=None if names is None else tuple(names),
                    na_values=tuple(na_values), decimal=decimal, skip_rows=skip_rows, strict=strict)
    _require_file(path)
    columns_read, rows, long_rows, meta = _read_rows(path, fmt)
    _check_options(str(path), columns_read, target, columns, drop, keys, categorical, converters, encoding,
                   missing, max_missing_frac)
    info: dict[str, Any] = {
        "reader": "csv", **meta,
        "options": {"target": target, "columns": list(columns) if columns is not None else None,
                    "drop": drop, "keys": keys,
                    "categorical": categorical if categorical is None or isinstance(categorical, str)
                    else list(categorical),
                    "encoding": encoding, "onehot_max_levels": onehot_max_levels, "missing": missing,
                    "max_missing_frac": max_missing_frac, "converters": sorted(converters),
                    "positive": positive, "names": None if names is None else list(names)},
        "rows_dropped": {}, "dropped_columns": {}, "nonfinite_values": {}, "encodings": {},
        "imputed": {}, "cells_imputed": {}, "keys": {}, "placeholder_cells": {},
    }
    _drop(info, DROP_RAGGED, np.ones(len(long_rows), dtype=bool))
    return _build_table(str(path), rows, columns_read, target, columns, drop, keys, categorical, encoding,
                        onehot_max_levels, missing, max_missing_frac, target_map, positive,
                        converters, info, fmt)


def _build_table(where: str, rows: pd.DataFrame, names: list[str], target: str, columns, drop, keys,
                 categorical, encoding: str, onehot_max_levels: int, missing: str,
                 max_missing_frac: float, target_map, positive, converters: dict, info: dict,
                 fmt: CsvFormat) -> Table:
    """The decisions of `read_csv` on parsed rows: target, features, rows, encodings, keys."""
    for name in drop:
        info["dropped_columns"][name] = "listed in drop"
    for name in names:
        if columns is not None and name not in columns and name not in (target, *keys, *drop):
            info["dropped_columns"][name] = "not listed in columns"
    values, miss, _ = _cells(rows[target], fmt.na)
    _count_na(values, fmt, info)
    y, keep = _target(values, miss, where, target, target_map, positive, converters.get(target),
                      info, fmt)
    feature_names = [c for c in names if (columns is None or c in set(columns))
                     and c != target and c not in keys and c not in drop]
    feats = _features(where, rows, feature_names, keep, categorical, converters, max_missing_frac,
                      info, fmt)
    if not feats:
        raise DataError(f"{where}: no feature columns left (dropped: {info['dropped_columns']})")
    kept = _missing_rows(where, feats, np.flatnonzero(keep) + 1, missing, info)
    keep[np.flatnonzero(keep)[~kept]] = False
    if not keep.any():
        raise DataError(f"{where}: no records left after dropping rows ({info['rows_dropped']})")
    for f in feats:
        f.take(kept)
    if missing != "drop":
        _count_imputed([f.why for f in feats], info)
    blocks, out_names, indicator = [], [], []
    for f in feats:
        block, block_names = _encode(f, encoding, onehot_max_levels, info)
        blocks.append(block)
        out_names.extend(block_names)
        onehot = f.kind == "categorical" and info["encodings"][f.name]["encoding"] == "onehot"
        indicator.extend([onehot] * len(block_names))
    X = np.ascontiguousarray(np.hstack(blocks), dtype=np.float64)
    fill = _impute(X, out_names, missing, info)
    info["column_kinds"] = {f.name: f.kind for f in feats}
    key_arrays = {}
    for name in keys:
        kv, km, _ = _cells(rows[name], fmt.na)
        key_arrays[name] = _key_column(kv[keep], km[keep], name, info, fmt.decimal)
    info["n_rows"] = int(keep.sum())
    info["n_features"] = len(out_names)
    targets = values[keep] if positive is not None else None
    fitted = {"format": fmt, "target": target, "target_map": target_map, "positive": positive,
              "target_values": None if targets is None else set(np.unique(targets).tolist()),
              "converters": converters, "missing": missing,
              "features": [(f.name, f.kind, info["encodings"].get(f.name)) for f in feats],
              "fill": fill, "indicator": np.array(indicator, dtype=bool)}
    return Table(X=X, y=y[keep].astype(np.float64), feature_names=out_names, target=target,
                 keys=key_arrays, info=info, fitted=fitted)


# ----------------------------------------------------------------------------------------------
# CSV: a test file read as its training file was (nothing fitted on it)


def _test_target(where: str, column: pd.Series, fit: Mapping[str, Any], info: dict
                 ) -> tuple[np.ndarray, np.ndarray]:
    """The test target read as the training one; a value the training reading cannot map is a
    dropped row, counted by reason (an evaluation set is not refused for a few odd labels)."""
    fmt: CsvFormat = fit["format"]
    values, miss, _ = _cells(column, fmt.na)
    _count_na(values, fmt, info)
    keep = ~miss
    _drop(info, DROP_MISSING_TARGET, miss)
    if fit["target_map"] is not None:
        table = target_table(fit["target_map"])
        unmapped = keep & ~np.isin(values, list(table))
        _drop(info, DROP_UNMAPPED_TARGET, unmapped)
        keep &= ~unmapped
        y = np.full(values.shape, np.nan)
        nulls = np.zeros(values.shape, dtype=bool)
        for label, value in table.items():
            hit = keep & (values == label)
            if value is None:
                nulls |= hit
            else:
                y[hit] = value
        _drop(info, DROP_NULL_TARGET, nulls)
        keep &= ~nulls
    elif fit["positive"] is not None:
        hit = _matches(values, str(fit["positive"]), fmt.decimal)
        unseen = keep & ~hit & ~np.isin(values, list(fit["target_values"]))
        _drop(info, DROP_UNSEEN_TARGET, unseen)
        keep &= ~unseen
        y = np.where(hit, 1.0, -1.0)
    elif fit["converters"].get(fit["target"]) is not None:
        y = _convert(values, miss, fit["converters"][fit["target"]], where, fit["target"])
    else:
        y, ok = _floats(values, miss, fmt.decimal)
        _drop(info, DROP_TARGET_NOT_NUMBER, keep & ~ok)
        keep &= ok
    bad = keep & ~np.isfinite(y)
    _drop(info, DROP_NONFINITE_TARGET, bad)
    keep &= ~bad
    if not keep.any():
        hint = ("; a --target-map can map the labels of both files" if fit["target_map"] is None
                and fit["positive"] is not None else "")
        raise DataError(f"{where}: no record of the test file has a usable value of target "
                        f"{fit['target']!r} (rows dropped: {info['rows_dropped']}){hint}")
    return y, keep


def _encode_like(values: np.ndarray, miss: np.ndarray, record: Mapping[str, Any]
                 ) -> tuple[np.ndarray, np.ndarray]:
    """A categorical test column encoded with the training levels: (block with NaN where
    missing, mask of the levels unseen in training). An unseen level is an all-zero one-hot row,
    and missing (imputed as training's missing cells) under codes and frequency."""
    levels = np.asarray(record["levels"], dtype=str)
    pos = np.minimum(np.searchsorted(levels, values), len(levels) - 1)
    found = ~miss & (levels[pos] == values)
    unseen = ~miss & ~found
    if record["encoding"] == "onehot":
        block = ((pos[:, None] == np.arange(len(levels))[None, :]) & found[:, None]).astype(np.float64)
        block[miss] = np.nan
        return block, unseen
    if record["encoding"] == "codes":
        column = pos.astype(np.float64)
    else:
        column = np.asarray(record["frequencies"], dtype=np.float64)[pos]
    column[~found] = np.nan
    return column[:, None], unseen


def read_csv_test(path: str | Path, train: Table) -> Table:
    """A test file read exactly as `train` (a `read_csv` Table) was: the same text format, the
    training feature columns in the same order, its category levels, encodings and imputation
    values, its target reading; nothing is fitted on the test file.

    A category unseen in training is an all-zero one-hot row (missing under codes or frequency,
    then treated as training's missing cells) and counted in ``info["unseen_categories"]``. Rows
    are dropped, and counted by reason, for a missing or unmappable target (a label the target
    map lacks, a value training never had under `positive`, a target that is not a number), a
    non-finite number, a missing feature under missing='drop'. A training column the file lacks,
    or a numeric training column holding text, is a DataError.
    """
    fit = train.fitted
    if not fit:
        raise DataError("read_csv_test needs the Table of read_csv (it reads a test file as that "
                        "training file was read)")
    path = Path(path)
    where = str(path)
    fmt: CsvFormat = fit["format"]
    names, rows, long_rows, meta = _read_rows(path, fmt)
    target, features = fit["target"], fit["features"]
    needed = [target, *(name for name, _, _ in features)]
    absent = [c for c in needed if c not in names]
    if absent:
        raise DataError(f"{where}: the test file lacks the training column(s) "
                        f"{', '.join(map(repr, absent))}; its columns are: {_preview(names)}")
    info: dict[str, Any] = {
        "reader": "csv_test", **meta, "rows_dropped": {}, "nonfinite_values": {},
        "unseen_categories": {}, "cells_imputed": {}, "imputed": {},
        "columns_ignored": [c for c in names if c not in needed]}
    _drop(info, DROP_RAGGED, np.ones(len(long_rows), dtype=bool))
    y, keep = _test_target(where, rows[target], fit, info)
    blocks, whys = [], []
    nonfinite = np.zeros(len(rows), dtype=bool)
    unseen_by: dict[str, np.ndarray] = {}
    for name, kind, record in features:
        values, miss, short = _cells(rows[name], fmt.na)
        _count_na(values[keep], fmt, info)
        why = _missing_why(miss, short)
        if kind == "numeric":
            column = _numeric(values, miss, fmt.decimal)
            if column is None:
                holders = _placeholders(values, miss)
                hint = (f"; pass --na-values {_quoted(list(holders))} if "
                        f"{'they mean' if len(holders) > 1 else 'it means'} missing"
                        if holders else "")
                raise DataError(f"{where}: column {name!r} is numeric in the training file but the "
                                f"test file has {_examples(values, miss, decimal=fmt.decimal)} in it"
                                f"{hint}")
            bad = ~miss & ~np.isfinite(column)
            block = column[:, None]
        elif kind == "converted":
            column = _convert(values, miss, fit["converters"][name], where, name)
            why[~miss & np.isnan(column)] = 3
            bad = ~np.isnan(column) & ~np.isfinite(column)
            block = column[:, None]
        else:
            block, unseen = _encode_like(values, miss, record)
            if record["encoding"] != "onehot":
                why[unseen] = 4
            unseen_by[name] = unseen
            bad = np.zeros(len(values), dtype=bool)
        if (bad & keep).any():
            info["nonfinite_values"][name] = int((bad & keep).sum())
        nonfinite |= bad
        blocks.append(block)
        whys.append(why)
    _drop(info, DROP_NONFINITE_FEATURE, keep & nonfinite)
    keep &= ~nonfinite
    X = np.hstack(blocks)
    any_miss = np.logical_or.reduce([w > 0 for w in whys]) & keep
    policy = fit["missing"]
    if policy == "error" and any_miss.any():
        counts = {n: int(((w > 0) & keep).sum()) for (n, _, _), w in zip(features, whys, strict=True)
                  if ((w > 0) & keep).any()}
        listed = ", ".join(f"{k!r} ({v})" for k, v in list(counts.items())[:10])
        raise DataError(f"{where}: missing values (or categories unseen in training) in the test "
                        f"file: {listed}; first in record {int(np.flatnonzero(any_miss)[0]) + 1} "
                        f"(use missing='drop', 'zero', 'mean' or 'median')")
    if policy == "drop":
        _drop(info, DROP_MISSING_FEATURE, any_miss)
        keep &= ~any_miss
    if not keep.any():
        raise DataError(f"{where}: no test records left after dropping rows ({info['rows_dropped']})")
    for name, unseen in unseen_by.items():
        if (unseen & keep).any():
            info["unseen_categories"][name] = int((unseen & keep).sum())
    X = np.ascontiguousarray(X[keep], dtype=np.float64)
    if policy != "drop":
        _count_imputed([w[keep] for w in whys], info)
        for j in np.flatnonzero(np.isnan(X).any(axis=0)):
            holes = np.isnan(X[:, j])
            X[holes, j] = fit["fill"][j]
            info["imputed"][train.feature_names[j]] = {"count": int(holes.sum()),
                                                      "value": float(fit["fill"][j])}
    info["n_rows"] = int(keep.sum())
    info["n_features"] = X.shape[1]
    return Table(X=X, y=y[keep].astype(np.float64), feature_names=list(train.feature_names),
                 target=target, keys={}, info=info)
