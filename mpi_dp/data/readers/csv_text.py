"""CSV text into string cells, and string cells into numbers: the parsing half of the CSV reader.

pandas parses the text (compression, quoting, delimiter sniffing); this module keeps the checks
around it (the sniffed delimiter, the header, ragged rows), `CsvFormat` (how a file's text is
read, so that a test file is read as its training file was), the typing of string cells
(numbers, percentages, decimal commas, placeholders) and the messages that say which flag would
read a column as numbers. `read_csv_strings` reads raw string columns with no typing at all.
The decisions on those cells (target, features, keys) are in `csv_table`.
"""

from __future__ import annotations

import csv
import dataclasses
import functools
import io
import zipfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:  # pandas loads where a CSV is read (about 0.3 s that `mpi-dp run` skips)
    import pandas as pd

from mpi_dp.data.readers.common import (
    _COMPRESSION,
    _DECOMPRESS_ERRORS,
    _archive_kind,
    _file_record,
    _iter_archive,
    _junk,
    _require_file,
    _require_text_file,
)
from mpi_dp.errors import DataError

#: cell values (after stripping blanks) that mean "missing"
MISSING_TOKENS = ("", "NA", "N/A", "n/a", "NaN", "nan", "null", "NULL", "None")
_MISSING = np.array(MISSING_TOKENS)
#: compressions pandas infers from a CSV file's suffix (names for messages)
_PANDAS_COMPRESSION = {".gz": "gzip", ".bz2": "bzip2", ".xz": "xz", ".zip": "zip", ".zst": "zstd"}


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


def _pandas_version() -> str:
    import pandas as pd

    return pd.__version__


def _pandas_rows(source: Any, fmt: CsvFormat, encoding: str) -> tuple[pd.DataFrame, list[int]]:
    """Every row as str cells (NaN where a row is shorter than the first), and the field counts
    of the rows longer than the first, which pandas hands back and which are left out."""
    long_rows: list[int] = []

    def ragged(fields: list[str]) -> None:
        long_rows.append(len(fields))
        return None

    import pandas as pd

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
    import pandas as pd

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
        with opener(path, "rb") as fh:
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
        "files": [_file_record(path)], "parser": f"pandas {_pandas_version()}",
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
# CSV: raw string columns (a file or an archive member)


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
            "parser": f"pandas {_pandas_version()}", "encoding": encoding, "n_rows": len(rows),
            "n_columns": len(names), **notes, **_row_notes(rows, [], len(names), True)}
    return names, columns, info
