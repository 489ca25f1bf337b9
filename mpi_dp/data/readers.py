"""Readers: real dataset files (CSV, LIBSVM, IDX/MNIST, LEAF JSON, MovieLens) into in-memory tables.

Reading only turns bytes into numbers: no scaling, centring or partitioning happens here (that is
preprocessing). CSV text is parsed by pandas (compression, quoting, delimiter sniffing); this
module keeps the project's own part, the decisions: which cells are missing, which columns are
numeric or categorical, which rows and columns are dropped and why, which cells are imputed and
why. Every reader records in ``info`` what it read (path, size, sha256) and every decision it took,
so a prepared dataset can say exactly where each number came from and nothing is dropped or
changed silently. All failures a user can cause raise ``DataError`` with a message naming the file
and the problem.
"""

from __future__ import annotations

import bz2
import csv
import dataclasses
import functools
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
import pandas as pd
import scipy.sparse

from mpi_dp.errors import DataError

#: cell values (after stripping blanks) that mean "missing"
MISSING_TOKENS = ("", "NA", "N/A", "n/a", "NaN", "nan", "null", "NULL", "None")
_MISSING = np.array(MISSING_TOKENS)
_MISSING_POLICIES = ("zero", "drop", "mean", "median", "error")
_ENCODINGS = ("codes", "onehot", "frequency", "auto")
_COMPRESSION = {".gz": ("gzip", gzip.open), ".bz2": ("bzip2", bz2.open), ".xz": ("xz", lzma.open)}
_DECOMPRESS_ERRORS = (EOFError, OSError, lzma.LZMAError, zlib.error)
#: compressions pandas infers from a CSV file's suffix (names for messages)
_PANDAS_COMPRESSION = {".gz": "gzip", ".bz2": "bzip2", ".xz": "xz", ".zip": "zip", ".zst": "zstd"}

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


@dataclasses.dataclass
class Table:
    """Records read from one source, before preprocessing and partitioning."""

    X: np.ndarray | scipy.sparse.csr_matrix  # float64 (n, p)
    y: np.ndarray  # float64 (n,)
    feature_names: list[str]  # length p
    target: str  # name of the target column / label
    keys: dict[str, np.ndarray]  # per-record key columns kept aside (not features), each length n
    info: dict[str, Any]  # JSON-serialisable provenance and decisions
    #: what a CSV read fitted (format, features, levels, fill values), for `read_csv_test`
    fitted: dict[str, Any] = dataclasses.field(default_factory=dict)


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


#: the first bytes of every HDF5 file
_HDF5_SIGNATURE = b"\x89HDF\r\n\x1a\n"


def _require_text_file(path: Path, kind: str) -> None:
    """_require_file, and refuse an HDF5 file (a shard or result file) given as `kind` text."""
    _require_file(path)
    try:
        with open(path, "rb") as fh:
            head = fh.read(len(_HDF5_SIGNATURE))
    except OSError as exc:
        raise DataError(f"{path}: cannot read file ({exc.strerror or exc})") from None
    if head == _HDF5_SIGNATURE:
        raise DataError(f"{path}: is an HDF5 file, not {kind} text (a shard file is prepared "
                        "already: give it to a job as data = \"...\")")


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
# CSV: how the text is read


#: delimiters a first line plausibly gives the sniffer; a strict read refuses any other (a letter)
_PLAUSIBLE_DELIMITERS = (",", ";", "\t", "|", " ", ":")
_DECIMALS = (".", ",")


@dataclasses.dataclass(frozen=True)
class CsvFormat:
    """How a CSV file's text becomes cells and numbers; a test file is read with its training
    file's format.

    `na_values` are missing-value tokens beyond MISSING_TOKENS, `decimal` is '.' or ',' (applied
    when cells are typed: pandas hands every cell over as a string), `skip_rows` lines before the
    header (or first record) are skipped. `strict` refuses what would otherwise be a guess: a
    column of numbers but for placeholder cells ('?', '-') or decimal commas, repeated header
    names, a header whose field count most records do not share, an implausible sniffed
    delimiter. The CLI reads strictly; the recipes, whose files are known, read leniently.
    """

    delimiter: str | None = None
    names: tuple[str, ...] | None = None
    na_values: tuple[str, ...] = ()
    decimal: str = "."
    skip_rows: int = 0
    strict: bool = False

    def __post_init__(self) -> None:
        if self.decimal not in _DECIMALS:
            raise DataError(f"decimal must be '.' or ',', got {self.decimal!r}")
        if self.delimiter is not None and not self.delimiter:
            raise DataError("the delimiter must be a non-empty string")
        if self.delimiter == self.decimal:
            raise DataError(f"the delimiter and the decimal mark are both {self.decimal!r}; a "
                            f"decimal comma needs another delimiter, e.g. --sep ';'")
        if isinstance(self.skip_rows, bool) or not isinstance(self.skip_rows, int) or self.skip_rows < 0:
            raise DataError(f"skip_rows must be a non-negative integer, got {self.skip_rows!r}")
        if isinstance(self.na_values, str):
            raise DataError(f"na_values must be a list of tokens, got the string {self.na_values!r}")
        tokens = [str(t).strip() for t in self.na_values]
        if not all(tokens):
            raise DataError("na_values: a blank token is missing already; give non-blank tokens")
        extra = tuple(dict.fromkeys(t for t in tokens if t not in MISSING_TOKENS))
        object.__setattr__(self, "na_values", extra)
        if self.names is not None:
            object.__setattr__(self, "names", tuple(self.names))

    @functools.cached_property
    def na(self) -> np.ndarray:
        """Every token that means missing: the defaults and `na_values`."""
        return np.array(MISSING_TOKENS + self.na_values)


def _pandas_rows(source: Any, fmt: CsvFormat, encoding: str) -> tuple[pd.DataFrame, list[int]]:
    """Every row as str cells (NaN where a row is shorter than the first), and the field counts
    of the rows longer than the first, which pandas hands back and which are left out."""
    long_rows: list[int] = []

    def ragged(fields: list[str]) -> None:
        long_rows.append(len(fields))
        return None

    # header=None: no index column is ever inferred, and pandas 2 and 3 both hand long rows to
    # `ragged` (with index_col=False pandas 2 truncates them instead, with only a warning)
    rows = pd.read_csv(source, header=None, sep=fmt.delimiter, engine="python", dtype=str,
                       keep_default_na=False, na_filter=False, encoding=encoding,
                       on_bad_lines=ragged, skiprows=fmt.skip_rows or None)
    return rows, long_rows


def _parse_text(source: str | Path | bytes, where: str, fmt: CsvFormat
                ) -> tuple[pd.DataFrame, list[int], str]:
    """`_pandas_rows` of a file (compression from its suffix) or of bytes, trying UTF-8 then
    Latin-1; pandas' errors become DataError naming `where`. Returns (rows, long rows, encoding)."""
    kind = _PANDAS_COMPRESSION.get(Path(where).suffix.lower())
    for encoding in ("utf-8-sig", "latin-1"):
        src = io.BytesIO(source) if isinstance(source, bytes) else source
        try:
            rows, long_rows = _pandas_rows(src, fmt, encoding)
            return rows, long_rows, "utf-8" if encoding == "utf-8-sig" else encoding
        except UnicodeDecodeError:
            continue
        except pd.errors.EmptyDataError:
            if fmt.skip_rows:
                raise DataError(f"{where}: nothing is left after skipping {fmt.skip_rows} "
                                f"line(s) (--skip-rows)") from None
            raise DataError(f"{where}: is empty") from None
        except pd.errors.ParserError as exc:
            raise DataError(f"{where}: malformed CSV ({exc})") from None
        except csv.Error as exc:
            raise DataError(f"{where}: cannot tell the delimiter from the first line ({exc}; is it "
                            "empty, or a title line before the header?); name the delimiter with "
                            "--sep X (e.g. --sep ';'), or skip lines before the header with "
                            "--skip-rows N") from None
        except (*_DECOMPRESS_ERRORS, zipfile.BadZipFile) as exc:
            what = f"truncated or corrupt {kind} file" if kind else "cannot read file"
            raise DataError(f"{where}: {what} ({type(exc).__name__}: {exc})") from None
        except ValueError as exc:  # e.g. a .zip holding several files
            raise DataError(f"{where}: cannot read ({exc})") from None
    raise AssertionError("latin-1 decodes any bytes")  # pragma: no cover


def _first_line(path: Path, skip: int) -> str | None:
    """The line pandas sniffs the delimiter from (the first after `skip` lines) of a plain, .gz,
    .bz2 or .xz file; None where reading it is not cheap (.zip, .zst) or fails."""
    if path.suffix.lower() in (".zip", ".zst"):
        return None
    _, opener = _COMPRESSION.get(path.suffix.lower(), (None, open))
    try:
        with opener(path, "rb") as fh:  # type: ignore[operator]
            for _ in range(skip):
                fh.readline()
            line = fh.readline(1 << 20)
    except _DECOMPRESS_ERRORS:
        return None
    return line.decode("utf-8-sig", errors="replace")


def _sniff(path: Path, fmt: CsvFormat) -> str | None:
    """The delimiter pandas sniffs (csv.Sniffer on the first line read), checked: a strict read
    refuses an implausible one (a letter, from a one-column or title line). None if unknown."""
    line = _first_line(path, fmt.skip_rows)
    if not line:
        return None
    if "\0" in line:
        raise DataError(f"{path}: holds binary data (NUL bytes), not CSV text; is it the right "
                        "file? (a compressed file needs its suffix: .gz, .bz2, .xz)")
    try:
        sniffed = csv.Sniffer().sniff(line).delimiter
    except csv.Error:
        return None  # pandas fails on it too, with its own message
    if fmt.strict and sniffed not in _PLAUSIBLE_DELIMITERS:
        after = f" after the {fmt.skip_rows} skipped" if fmt.skip_rows else ""
        raise DataError(f"{path}: the delimiter sniffed from the first line{after} "
                        f"({line.strip()[:80]!r}) is {sniffed!r}, which is unlikely: name the "
                        f"delimiter with --sep X (e.g. --sep ';'), or skip lines before the header "
                        f"with --skip-rows N")
    return sniffed


def _header_names(header: list[str]) -> tuple[list[str], dict[str, str], dict[str, int],
                                              dict[str, list[int]]]:
    """Stripped header names; blanks named col<j>, repeats suffixed .1, .2. Returns (names, the
    renames, the blank cells by given name -> column number, the repeated names -> their column
    numbers)."""
    names: list[str] = []
    seen: set[str] = set()
    renamed: dict[str, str] = {}
    blank: dict[str, int] = {}
    where: dict[str, list[int]] = {}
    for j, raw in enumerate(header):
        name = raw.strip() or f"col{j + 1}"
        if not raw.strip():
            blank[name] = j + 1
        where.setdefault(name, []).append(j + 1)
        base, k = name, 0
        while name in seen:
            k += 1
            name = f"{base}.{k}"
        if name != raw:
            renamed[f"{j + 1}:{raw}"] = name
        seen.add(name)
        names.append(name)
    repeated = {n: cols for n, cols in where.items() if len(cols) > 1}
    return names, renamed, blank, repeated


def _check_names(names: Sequence[str], width: int, where: str, long_rows: Sequence[int] = ()
                 ) -> list[str]:
    """The given column names of a headerless file: as many as its first row has fields, distinct."""
    names = [str(n).strip() for n in names]
    if len(names) != width:
        hint = ""
        if long_rows and len(names) in long_rows:
            hint = (f" ({long_rows.count(len(names)):,} later rows have {len(names)}: is the first "
                    f"line a title? skip it with --skip-rows N)")
        raise DataError(f"{where}: {len(names)} column names given but the first row has {width} "
                        f"fields; give exactly {width} names{hint}")
    blank = [j + 1 for j, n in enumerate(names) if not n]
    if blank:
        raise DataError(f"{where}: column name number(s) {blank} are blank")
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise DataError(f"{where}: column name(s) {', '.join(map(repr, repeated))} given more than once")
    return names


def _split_header(rows: pd.DataFrame, where: str, fmt: CsvFormat, long_rows: Sequence[int] = ()
                  ) -> tuple[list[str], pd.DataFrame, dict[str, Any]]:
    """Column names (the header row, or `fmt.names` for a file without one) and the record rows;
    `long_rows` (field counts) were left out for having more fields than the first row. A strict
    read refuses repeated header names."""
    notes: dict[str, Any] = {}
    n_long = len(long_rows)
    if fmt.names is None:
        if rows.empty:
            raise DataError(f"{where}: is empty (a header row is required)")
        names, renamed, blank, repeated = _header_names(rows.iloc[0].tolist())
        if repeated and fmt.strict:
            listed = "; ".join(f"{n!r} (columns {', '.join(map(str, c))})" for n, c in repeated.items())
            raise DataError(f"{where}: the header names a column more than once: {listed}; give "
                            f"each column its own name in the file, or name them all with "
                            f"--no-header --skip-rows {fmt.skip_rows + 1} --names A,B,C")
        if renamed:
            notes["renamed_columns"] = renamed
        if blank:
            notes["header_cells_named"] = blank
        rows = rows.iloc[1:]
        if rows.empty and n_long:
            raise DataError(f"{where}: all {n_long} records have more fields than the header's "
                            f"{len(names)} (lines before the header? skip them with --skip-rows N; "
                            f"a header cell missing, or the wrong delimiter? name it with --sep X)")
        if rows.empty:
            raise DataError(f"{where}: has a header but no records")
    else:
        names = _check_names(fmt.names, rows.shape[1], where, list(long_rows))
        notes["header"] = "none (names given)"
    rows = rows.set_axis(names, axis=1).reset_index(drop=True)
    return names, rows, notes


def _row_notes(rows: pd.DataFrame, long_rows: list[int], width: int, header: bool) -> dict[str, Any]:
    """What the parse left for the record: rows dropped as too long, rows padded as too short."""
    notes: dict[str, Any] = {}
    if long_rows:
        counts = np.unique(long_rows, return_counts=True)
        notes["ragged_rows"] = {
            "count": len(long_rows), "expected_fields": width,
            "than": "the header" if header else "the first row",
            "field_counts": {str(int(k)): int(c) for k, c in zip(*counts, strict=True)}}
    short = np.flatnonzero(rows.isna().to_numpy().any(axis=1))
    if short.size:
        notes["short_rows_padded"] = {"count": int(short.size), "records": (short[:20] + 1).tolist()}
    return notes


def _check_shape(rows: pd.DataFrame, long_rows: list[int], width: int, where: str, header: bool
                 ) -> None:
    """DataError when most records have another field count than the header (or first row): a
    title line before the header, or the wrong delimiter, not a few ragged rows."""
    fields = rows.notna().to_numpy().sum(axis=1)
    odd = int(np.count_nonzero(fields != width)) + len(long_rows)
    total = len(rows) + len(long_rows)
    if not total or 2 * odd <= total:
        return
    counts = np.unique(np.concatenate([fields, np.asarray(long_rows, dtype=fields.dtype)]),
                       return_counts=True)
    common = int(counts[0][np.argmax(counts[1])])
    than = "the header" if header else "the first row"
    raise DataError(f"{where}: {odd:,} of {total:,} records have another number of fields than "
                    f"{than} ({width}); most have {common}: if there are lines before the "
                    f"{'header' if header else 'records'}, skip them with --skip-rows N; if the "
                    f"delimiter is wrong, name it with --sep X")


def _read_rows(path: Path, fmt: CsvFormat) -> tuple[list[str], pd.DataFrame, list[int], dict[str, Any]]:
    """Parse a CSV file into named string columns: (names, rows, long row field counts, what was
    read and how: file record, parser, encoding, delimiter, skipped lines, header notes)."""
    _require_text_file(path, "CSV")
    where = str(path)
    sniffed = _sniff(path, fmt) if fmt.delimiter is None else None
    if fmt.decimal == "," and sniffed == ",":
        raise DataError(f"{where}: --decimal , but the fields are separated by ',' (sniffed): name "
                        f"the delimiter with --sep X, e.g. --sep ';'")
    raw, long_rows, text_encoding = _parse_text(path, where, fmt)
    names, rows, notes = _split_header(raw, where, fmt, long_rows)
    header = fmt.names is None
    if fmt.strict:
        _check_shape(rows, long_rows, len(names), where, header)
    meta: dict[str, Any] = {
        "files": [_file_record(path)], "parser": f"pandas {pd.__version__}",
        "text_encoding": text_encoding, "delimiter": fmt.delimiter or "sniffed",
        "n_rows_read": len(rows) + len(long_rows), "n_columns_read": len(names),
        **notes, **_row_notes(rows, long_rows, len(names), header)}
    if sniffed is not None:
        meta["delimiter_sniffed"] = sniffed
    if fmt.decimal != ".":
        meta["decimal"] = fmt.decimal
    if fmt.skip_rows:
        meta["lines_skipped"] = fmt.skip_rows
    if fmt.na_values:
        meta["na_values"] = list(fmt.na_values)
        meta["na_value_cells"] = {}
    return names, rows, long_rows, meta


# ----------------------------------------------------------------------------------------------
# CSV: typing string cells


def _cells(column: pd.Series, na: np.ndarray = _MISSING) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Stripped string values, the missing mask (a token of `na`, or lacking in a short row), and
    the mask of cells a short row lacked."""
    short = column.isna().to_numpy()
    values = np.char.strip(column.fillna("").to_numpy(dtype=str))
    return values, np.isin(values, na) | short, short


def _to_float(values: np.ndarray, decimal: str = ".") -> np.ndarray | None:
    """float64 of every value (a trailing % is dropped: '13.5%' -> 13.5), or None if any fails.
    With decimal ',' a comma is the decimal mark ('3,25' -> 3.25) and a '.' is not a number."""
    if decimal == ",":
        values = np.char.replace(np.char.replace(values, ".", "#"), ",", ".")
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


def _numeric(values: np.ndarray, miss: np.ndarray, decimal: str = ".") -> np.ndarray | None:
    """float64 column with NaN where missing, or None if a non-missing value is not a number.
    Overflowing numbers such as 1e400 parse as inf (non-finite, counted by the caller)."""
    parsed = _to_float(values[~miss], decimal)
    if parsed is None:
        return None
    out = np.full(values.shape, np.nan)
    out[~miss] = parsed
    return out


def _floats(values: np.ndarray, miss: np.ndarray, decimal: str) -> tuple[np.ndarray, np.ndarray]:
    """Each non-missing value as float64 where it is a number: (values, NaN elsewhere; the mask of
    the cells that are numbers)."""
    out = _numeric(values, miss, decimal)
    if out is not None:
        return out, ~miss
    out = np.full(values.shape, np.nan)
    ok = np.zeros(values.shape, dtype=bool)
    for level in np.unique(values[~miss]):
        parsed = _to_float(np.array([level]), decimal)
        if parsed is not None:
            hit = ~miss & (values == level)
            out[hit], ok[hit] = parsed[0], True
    return out, ok


def _convert(values: np.ndarray, miss: np.ndarray, fn: Callable[[str], float], where: str,
             name: str) -> np.ndarray:
    """A user converter applied to each non-missing value (NaN where missing or it gives NaN)."""
    out = np.full(values.shape, np.nan)
    cache: dict[str, float] = {}
    for i in np.flatnonzero(~miss):
        v = str(values[i])
        if v not in cache:
            try:
                cache[v] = float(fn(v))
            except Exception as exc:  # a recipe's parser may raise anything
                raise DataError(f"{where}: converter for column {name!r} failed on {v!r} in record "
                                f"{i + 1} ({type(exc).__name__}: {exc})") from None
        out[i] = cache[v]
    return out


def _examples(values: np.ndarray, miss: np.ndarray, k: int = 5, decimal: str = ".") -> str:
    """A few distinct non-numeric values of a column, for error messages."""
    bad = [v for v in dict.fromkeys(values[~miss].tolist())
           if _to_float(np.array([v]), decimal) is None]
    return ", ".join(repr(v) for v in bad[:k])


def _placeholders(values: np.ndarray, miss: np.ndarray) -> dict[str, int]:
    """Counts of the non-missing cells without a letter or digit ('?', '-', '.'), by token:
    placeholders that often mean missing."""
    levels, counts = np.unique(values[~miss], return_counts=True)
    return {str(v): int(c) for v, c in zip(levels, counts, strict=True)
            if not any(ch.isalnum() for ch in str(v))}


def _quoted(tokens: Sequence[str]) -> str:
    """Tokens as one shell argument of --na-values, e.g. '?,-'."""
    joined = ",".join(tokens)
    return f"'{joined}'" if "'" not in joined else f'"{joined}"'


def _cells_text(counts: Mapping[str, int]) -> str:
    """"3 cells '?' and 1 cell '-'" for {'?': 3, '-': 1}."""
    parts = [f"{n:,} cell{'s' if n != 1 else ''} {tok!r}" for tok, n in counts.items()]
    return " and ".join(parts) if len(parts) <= 2 else ", ".join(parts[:-1]) + " and " + parts[-1]


def _numbers_but(values: np.ndarray, miss: np.ndarray, fmt: CsvFormat,
                 placeholders: Mapping[str, int]) -> list[str] | None:
    """The flags that would make a column that is not numeric as read numeric (--na-values for
    its placeholder cells, --decimal , for decimal commas), or None if no flag would."""
    rest = ~miss
    if placeholders:
        rest &= ~np.isin(values, list(placeholders))
    if not rest.any():
        return None
    flags = []
    if _to_float(values[rest], fmt.decimal) is None:
        if fmt.decimal != "." or _to_float(values[rest], ",") is None:
            return None
        flags.append("--decimal ,")
    if placeholders:
        flags.append(f"--na-values {_quoted(list(placeholders))}")
    return flags or None


def _guess_error(where: str, name: str, values: np.ndarray, miss: np.ndarray,
                 placeholders: Mapping[str, int], flags: list[str], target: bool) -> DataError:
    """The error for a column that is numbers but for placeholders or decimal commas."""
    role = "target column" if target else "column"
    if "--decimal ," in flags:
        comma = values[~miss & (np.char.find(values, ",") >= 0)]
        what = f"holds numbers with decimal commas such as {str(comma[0])!r}"
        if placeholders:
            what += f", and {_cells_text(placeholders)} (placeholders for missing values?)"
        sep = " (with a delimiter other than ',', e.g. --sep ';')"
    else:
        n = sum(placeholders.values())
        what = (f"is numbers except {_cells_text(placeholders)} (placeholder{'s' if n != 1 else ''} "
                f"for missing values?)")
        sep = ""
    fix = ("; rows whose target is then missing are dropped and counted" if target else
           f", or --categorical {name} to read the column as categories")
    return DataError(f"{where}: {role} {name!r} {what}: pass {' '.join(flags)}{sep}{fix}")


def _preview(names: Sequence[str], k: int = 25) -> str:
    shown = ", ".join(names[:k])
    return shown if len(names) <= k else f"{shown}, ... ({len(names)} columns in all)"


def _drop(info: dict[str, Any], reason: str, mask: np.ndarray) -> None:
    """Count the rows of `mask` as dropped for `reason` (only reasons that dropped a row appear)."""
    count = int(np.count_nonzero(mask))
    if count:
        info["rows_dropped"][reason] = info["rows_dropped"].get(reason, 0) + count


def _count_na(values: np.ndarray, fmt: CsvFormat, info: dict[str, Any]) -> None:
    """Count the cells read as missing only because of `fmt.na_values`, by token."""
    for tok in fmt.na_values:
        hit = int(np.count_nonzero(values == tok))
        if hit:
            info["na_value_cells"][tok] = info["na_value_cells"].get(tok, 0) + hit


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
    _require_text_file(path, "LIBSVM")
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
    """Header names and raw string columns of a comma-separated file, or of the archive member
    whose path ends with `member` (read in memory, nothing extracted). No typing, no stripping and
    no missing-value tokens: the caller decides what is missing (UCI's '?', where 'None' is a real
    level). A row with more fields than the header is an error; a short row is padded with ''."""
    path = Path(path)
    _require_file(path)
    source: Path | bytes = path
    where = str(path)
    if member is not None:
        if _archive_kind(path) is None:
            raise DataError(f"{path}: not a .zip/.tar archive (looked for member {member!r})")
        found = list(_iter_archive(path, lambda n: n.endswith(member) and not _junk(n)))
        if len(found) != 1:
            raise DataError(f"{path}: expected one member ending in {member!r}, found "
                            f"{[n for n, _ in found] or 'none'}")
        where, source = f"{path}:{found[0][0]}", found[0][1]
    fmt = CsvFormat(delimiter=",")
    raw, long_rows, encoding = _parse_text(source, where, fmt)
    names, rows, notes = _split_header(raw, where, fmt)
    if long_rows:
        raise DataError(f"{where}: {len(long_rows)} row(s) have more fields than the header's "
                        f"{len(names)}")
    columns = {n: rows[n].fillna("").to_numpy(dtype=str) for n in names}
    info = {"reader": "csv_strings", "files": [_file_record(path)], "member": where,
            "parser": f"pandas {pd.__version__}", "encoding": encoding, "n_rows": len(rows),
            "n_columns": len(names), **notes, **_row_notes(rows, [], len(names), True)}
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
