"""Arguments and command of `mpi-dp data prepare` (recipes by name, or a CSV/LIBSVM file).

Every flag that does not apply to what is prepared is an error, not silently ignored: a user who
writes `--key hospital` expects agents per hospital and must not get an i.i.d. split instead.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import functools
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from mpi_dp.data import partition as part
from mpi_dp.data import preprocess as pre
from mpi_dp.data import readers, recipes
from mpi_dp.data.bounds import ROW_NORM_MAX
from mpi_dp.data.cli_checks import (
    OVERWRITE_HELP,
    Range,
    add_number,
    check_ranges,
    launcher_rank,
    refuse_existing,
)
from mpi_dp.data.prepare import Prepared, as_pairs, reader_decisions, run_prepare
from mpi_dp.errors import DataError

EPILOG = """\
recipes (each paper's data setting; options with --opt KEY=VALUE):
{recipes}

examples:
  mpi-dp data prepare lending --source ../shared/data            # -> data/lending.h5
  mpi-dp data prepare sparcs --source ../shared/data --opt min_records=1000
  mpi-dp data prepare mnist                                     # files from `mpi-dp data fetch mnist`
  mpi-dp data prepare csv my.csv --target price --partition iid --agents 8 --public 1000 \\
      --pca 10 --out data/my.h5
  mpi-dp data prepare csv visits.csv.gz --target los --partition key --key hospital \\
      --min-records 500 --public 2000 --out data/visits.h5
  printf '%s\\n' age workclass fnlwgt education education-num marital-status occupation \\
      relationship race sex capital-gain capital-loss hours-per-week native-country income \\
      > adult_names.txt                                   # UCI Adult: 15 columns, no header
  mpi-dp data prepare csv adult.data --no-header --names @adult_names.txt --target income \\
      --target-map '{{">50K": 1, ">50K.": 1, "<=50K": -1, "<=50K.": -1}}' --task binary \\
      --na-values '?' --test-file adult.test --test-skip-rows 1 --agents 8 --public 1000
  mpi-dp data prepare csv sales.csv --sep ';' --decimal , --skip-rows 2 --target revenue \\
      --agents 4 --test-frac 0.2
  mpi-dp data prepare libsvm rcv1.bz2 --partition iid --agents 64 --task binary

CSV files: pandas parses the text (gzip/bz2/xz/zip by suffix, quoted fields, the delimiter
sniffed from the first line unless --sep X; --skip-rows N skips title lines before the header).
Cells are stripped; empty, NA, N/A, n/a, NaN, nan, null, NULL and None are missing, and so are
the tokens of --na-values (e.g. --na-values '?'). Numbers use a decimal point unless --decimal ,
('3,25' is 3.25; the delimiter must then be another character, e.g. --sep ';').

Nothing is guessed: these are errors saying which flag settles them, not silent choices:
  - a column of numbers but for placeholder cells without a letter or digit ('?', '-', '.'):
    --na-values '?' makes them missing (imputed and counted), --categorical COL categories;
  - numbers with decimal commas read without --decimal ,;
  - a header naming a column twice (the error gives the column numbers); blank header cells
    are named col<j> and counted;
  - most records having another field count than the header (title lines before it: use
    --skip-rows N; or the wrong delimiter: --sep X), or an unlikely sniffed delimiter.
In a categorical column, placeholder cells stay a level and a note says how many there are.

Encoding (--encoding, default auto): categorical columns one-hot (features COL=LEVEL) up to
--opt onehot_max_levels=N levels (default 16), frequency-encoded above; codes only when asked.
Every other column (numbers, frequencies, codes) is then standardised (mean 0, std 1;
--no-standardise turns it off) with the statistics of the public hold-out (--public M), or else
of all training records; one-hot columns stay 0/1. Standardising with all records uses the
owners' data outside the privacy accounting: give --public M to fit it on public records only.

A test file (--test-file PATH, instead of --test-frac) is read with the same flags and the
preprocessing fitted on the training file only: its feature columns and their order, category
levels (a category unseen in training is an all-zero one-hot row, or missing under codes and
frequency, and counted), imputation values, standardisation, PCA and label mapping; its rows
with a missing or unmappable target are dropped and counted. It is the shard's global test set.

Nothing is dropped or changed silently: the summary counts every row dropped, by reason (ragged
row = more fields than the header, missing target, target mapped to null, non-finite target or
feature value such as inf or 1e400, missing feature value under --missing drop, partition
remainder, key group under --min-records, missing key), every column dropped, every cell
imputed by reason (missing value, short row), every encoding and standardisation, every value
clipped (--row-norm) and the test file's figures, and the shard file keeps the same record in
its 'decisions' attribute. A short row (fewer fields than the header) keeps its record; its
lacking cells are imputed. With --partition key the shard stores the key column's name and each
agent's value (attributes partition_key and partition_values).

Source files are looked up under --source (repeatable) and then the fetch cache
($MPI_DP_DATA_CACHE or ~/.cache/mpi_dp/data). The shard file records the recipe, options,
source files (SHA-256), preprocessing steps, partition and decisions as attributes, and the
SHA-256 of its own content (content_sha256).

A shard file is a result too (results name it by path and SHA-256): an existing --out is refused
unless --overwrite; a numeric flag out of its range (its help gives it in [...]) is refused before
anything is read or written; under mpiexec or srun only rank 0 writes the file and prints.
"""

#: --opt keys of the file paths, with the type each value must have
FILE_OPTS: dict[str, dict[str, type[Any]]] = {
    "csv": {"delimiter": str, "onehot_max_levels": int},
    "libsvm": {"n_features": int},
}
#: one-hot up to this many levels under --encoding auto (--opt onehot_max_levels=N)
ONEHOT_MAX_LEVELS = 16
#: the declared range of every numeric flag (by dest), filled by `add_prepare_arguments`
RANGES: dict[str, Range] = {}
LINES = Range(int, 0, what="0 or more lines")
PUBLIC = Range(int, 0, what="0 (no public hold-out) or more records")
SHARE = Range(float, 0, 1, lo_open=True, hi_open=True, what="a share in (0, 1)")
#: ranges of the numeric --opt values (recipes' and files'); a key not here takes any value
OPT_RANGES = {
    "public": PUBLIC, "pca": Range(int, 1), "agents": Range(int, 1), "sizes": Range(int, 1),
    "min_records": Range(int, 1), "seed": Range(int, 0), "test_frac": SHARE,
    "max_missing_frac": Range(float, 0, 1), "onehot_max_levels": Range(int, 1),
    "n_features": Range(int, 1), "rank": Range(int, 1), "reg": Range(float, 0),
    "sweeps": Range(int, 1), "knn": Range(int, 1),
}
#: --opt keys people try that are flags of their own
_OPT_HINTS = {"target_map": "--target-map", "positive": "--positive", "names": "--names",
              "header": "--no-header", "target": "--target", "key": "--key", "sep": "--sep",
              "decimal": "--decimal", "na_values": "--na-values", "skip_rows": "--skip-rows"}
#: flags that apply to CSV files only (dest names); libsvm and recipes refuse them
_CSV_ONLY = ("target", "drop", "columns", "categorical", "encoding", "missing", "max_missing_frac",
             "key", "min_records", "no_header", "names", "target_map", "positive", "test_file",
             "test_skip_rows", "na_values", "sep", "decimal", "skip_rows")
#: flags of the generic file path (csv and libsvm); recipes refuse them
_FILE_ONLY = (*_CSV_ONLY, "task", "partition", "agents", "sizes", "alpha", "public", "pca",
              "standardise", "max_normalise", "row_norm", "test_frac", "test_split", "seed")


def _recipe_lines() -> str:
    out = []
    for r in recipes.RECIPES.values():
        out.append(f"  {r.name:<11} {r.summary}")
        out.append(f"  {'':<11} options: " + ", ".join(f"{k}={v}" for k, v in r.defaults.items()))
    return "\n".join(out)


def add_prepare_arguments(ap: argparse.ArgumentParser) -> None:
    ap.epilog = EPILOG.format(recipes=_recipe_lines())
    ap.add_argument("what", metavar="RECIPE|csv|libsvm",
                    help=f"a recipe ({', '.join(recipes.RECIPES)}) or 'csv'/'libsvm' for a file")
    ap.add_argument("file", nargs="?", help="the CSV/LIBSVM file (with csv/libsvm)")
    ap.add_argument("--out", metavar="PATH", help="shard file (default data/<recipe>.h5); an "
                    "existing file is refused unless --overwrite")
    ap.add_argument("--source", action="append", metavar="DIR", default=[],
                    help="folder holding the original files (repeatable)")
    ap.add_argument("--opt", action="append", metavar="KEY=VALUE", default=[],
                    help="option (Python literal value): a recipe's, e.g. --opt public=500; for "
                    f"csv onehot_max_levels=N (default {ONEHOT_MAX_LEVELS}) or delimiter=X (the "
                    "same as --sep X); for libsvm n_features=N. An unknown key is an error")
    ap.add_argument("--overwrite", action="store_true", help=OVERWRITE_HELP)
    ap.add_argument("--quiet", action="store_true", help="no summary")
    g = ap.add_argument_group("csv / libsvm files")
    g.add_argument("--target", help="target column (csv)")
    g.add_argument("--no-header", action="store_true",
                   help="the CSV has no header row (its first row is a record): name the columns "
                   "with --names, e.g. --no-header --names age,workclass,income")
    g.add_argument("--names", metavar="A,B,C|@FILE",
                   help="column names of a CSV without a header row (needs --no-header): "
                   "comma-separated, or @FILE with one name per line; exactly as many as the "
                   "file's rows have fields")
    g.add_argument("--sep", metavar="X",
                   help="the CSV delimiter, e.g. --sep ';' or --sep '\\t' (tab); default: sniffed "
                   "from the first line")
    g.add_argument("--decimal", default=".", choices=(".", ","), metavar="MARK",
                   help="decimal mark of the numbers: '.' (default) or ',' ('3,25' is 3.25; "
                   "needs another delimiter, e.g. --sep ';')")
    g.add_argument("--na-values", metavar="A,B",
                   help="more tokens meaning missing, beyond empty, NA, N/A, n/a, NaN, nan, null, "
                   "NULL and None, e.g. --na-values '?'; their cells are imputed and counted")
    add_number(g, "--skip-rows", LINES, RANGES, default=0, metavar="N",
               help="skip N lines (titles, notes) before the header row (or first record)")
    g.add_argument("--target-map", metavar="JSON",
                   help="JSON object mapping the raw target values to numbers, e.g. "
                   "--target-map '{\">50K\": 1, \"<=50K\": -1}'; values are compared with blanks "
                   "around them stripped; a value the map lacks is an error naming it and its "
                   "row count; null drops that value's rows (counted in the summary)")
    g.add_argument("--positive", metavar="VALUE",
                   help="binary target: rows whose target is VALUE get label +1, every other "
                   "value -1 (implies --task binary), e.g. --positive '>50K'")
    g.add_argument("--drop", nargs="*", default=[], help="columns to leave out")
    g.add_argument("--columns", nargs="*", help="feature columns to keep (default all)")
    g.add_argument("--categorical", default="auto",
                   help="'auto' (non-numeric columns), 'none', or a comma-separated list (read "
                   "those columns as categories even when they hold numbers)")
    g.add_argument("--encoding", default="auto", choices=("auto", "onehot", "frequency", "codes"),
                   help="categorical encoding: auto (default) one-hot up to --opt "
                   f"onehot_max_levels=N levels (default {ONEHOT_MAX_LEVELS}), frequency above; "
                   "onehot; frequency (the level's share of the training rows); codes (integer "
                   "codes of the sorted levels, only when asked)")
    g.add_argument("--missing", default="zero", choices=("zero", "drop", "mean", "median", "error"),
                   help="missing values: set to 0, drop the row, impute, or fail")
    add_number(g, "--max-missing-frac", Range(float, 0, 1), RANGES, default=1.0,
               help="drop feature columns missing in more than this share of rows")
    g.add_argument("--task", choices=("regression", "binary", "multiclass"),
                   help="regression (default); binary: labels -1/+1 (two numeric label values map "
                   "the lower to -1, the higher to +1; string labels need --target-map or "
                   "--positive); multiclass: labels 0..K-1")
    g.add_argument("--partition", default="iid",
                   choices=("iid", "equal", "blocks", "key", "dirichlet"),
                   help="how records become agents")
    add_number(g, "--agents", Range(int, 1), RANGES, default=4,
               help="number of agents (iid/equal/dirichlet)")
    add_number(g, "--sizes", Range(int, 1), RANGES, nargs="*", help="block sizes (blocks)")
    g.add_argument("--key", help="key column, one agent per value (needs --partition key), e.g. "
                   "--partition key --key hospital; each agent's value is stored in the shard")
    add_number(g, "--min-records", Range(int, 1), RANGES,
               help="(--partition key) smallest agent kept, default 1; smaller key groups "
               "are dropped and counted")
    add_number(g, "--alpha", Range(float, 0, lo_open=True), RANGES, default=0.5,
               help="Dirichlet concentration (dirichlet)")
    add_number(g, "--public", PUBLIC, RANGES, default=0, metavar="M",
               help="last M records as public hold-out")
    add_number(g, "--pca", Range(int, 1), RANGES, metavar="K",
               help="PCA to K components fitted on the hold-out (whitened)")
    std = g.add_mutually_exclusive_group()
    std.add_argument("--standardise", action="store_const", const=True, default=None,
                     help="z-score the numeric columns with hold-out statistics (all training "
                     "rows without one): the default for csv, off for libsvm (sparse)")
    std.add_argument("--no-standardise", dest="standardise", action="store_const", const=False,
                     help="leave the numeric columns as read")
    g.add_argument("--max-normalise", action="store_true", help="divide columns by their max |x|")
    g.add_argument("--row-norm", choices=("l1", "l2", "none"),
                   help="scale rows to norm <= 1 (rows above 1 are counted as clipped) and record "
                   "the public bound /public/row_norm_max = 1, from which every method sets its "
                   "clipping and step sizes without reading private records: the default for csv "
                   "is l2 (after standardising); none for libsvm")
    add_number(g, "--test-frac", Range(float, 0, 1, hi_open=True), RANGES, default=0.0,
               help="per-agent test share (0: none)")
    g.add_argument("--test-file", metavar="PATH",
                   help="(csv) a separate test file, read with the same flags and the training "
                   "file's preprocessing, stored as the global test set (not with --test-frac)")
    add_number(g, "--test-split", SHARE, RANGES, metavar="F",
               help="a seeded share F of the rows (outside --public) as the global test set, "
               "held out before anything is fitted (not with --test-file or --test-frac)")
    add_number(g, "--test-skip-rows", LINES, RANGES, metavar="N",
               help="lines to skip before the test file's header (default: --skip-rows)")
    add_number(g, "--seed", Range(int, 0), RANGES, default=1, help="seed of random partitions")


# ----------------------------------------------------------------------------------------------
# checking and parsing the arguments


def _parse_opts(items: list[str]) -> dict[str, Any]:
    out = {}
    for item in items:
        if "=" not in item:
            raise DataError(f"--opt {item!r}: expected KEY=VALUE")
        k, v = item.split("=", 1)
        try:
            out[k.strip()] = ast.literal_eval(v)
        except (ValueError, SyntaxError):
            out[k.strip()] = v
    return out


def file_opts(what: str, items: list[str]) -> dict[str, Any]:
    """The --opt values of the csv/libsvm path; DataError naming an unknown key or a bad value."""
    known = FILE_OPTS[what]
    opts = _parse_opts(items)
    for key, value in opts.items():
        if key not in known:
            hint = f" (use {_OPT_HINTS[key]})" if key in _OPT_HINTS else ""
            raise DataError(f"--opt {key!r} is not an option of 'data prepare {what}'{hint}; "
                            f"known: {', '.join(known)}")
        kind = known[key]
        if not isinstance(value, kind) or isinstance(value, bool) or (kind is int and value < 1) \
                or (kind is str and not value):
            want = "a positive integer" if kind is int else "a non-empty string"
            raise DataError(f"--opt {key}={value!r}: must be {want}")
    return opts


def _given(args: argparse.Namespace, dest: str) -> bool:
    """Whether a flag was given (differs from its default)."""
    return getattr(args, dest) != _defaults().get(dest)


def _flag(dest: str) -> str:
    return "--" + dest.replace("_", "-")


def check_args(args: argparse.Namespace) -> None:
    """DataError for flags that do not apply or contradict each other (nothing is ignored)."""
    if args.what not in ("csv", "libsvm"):
        given = [_flag(d) for d in _FILE_ONLY if _given(args, d)]
        if given:
            raise DataError(f"{', '.join(given)}: for 'data prepare csv|libsvm FILE' only; recipe "
                            f"{args.what!r} takes --opt KEY=VALUE (see --help)")
        return
    if args.what == "libsvm":
        given = [_flag(d) for d in _CSV_ONLY if _given(args, d)]
        if given:
            raise DataError(f"{', '.join(given)}: for CSV files only, not 'data prepare libsvm'")
        if args.partition == "key":
            raise DataError("--partition key needs a key column, which LIBSVM files do not have")
    _check_csv_args(args)
    _check_partition_args(args)


def _check_csv_args(args: argparse.Namespace) -> None:
    """The header, names and target flags of a CSV file."""
    if args.what != "csv":
        return
    if args.no_header and args.names is None:
        raise DataError("--no-header needs --names A,B,C (or --names @FILE, one name per line) to "
                        "name the columns")
    if args.names is not None and not args.no_header:
        raise DataError("--names names the columns of a file without a header row: add "
                        "--no-header (a file with a header row takes its names from it)")
    if args.target_map is not None and args.positive is not None:
        raise DataError("--target-map and --positive both say how to read the target: give one")
    if args.positive is not None and args.task not in (None, "binary"):
        raise DataError(f"--positive makes a binary target (+1/-1); it cannot go with --task "
                        f"{args.task}")
    _check_text_args(args)
    if args.test_file is not None and args.test_frac > 0:
        raise DataError("--test-file and --test-frac both make the evaluation set: give one "
                        "(--test-file is the global test set, --test-frac splits each agent's "
                        "records)")
    if args.test_split is not None:
        if args.test_file is not None or args.test_frac > 0:
            raise DataError("--test-split makes the global test set from the file's rows: not "
                            "with --test-file or --test-frac (give one)")
    if args.test_skip_rows is not None and args.test_file is None:
        raise DataError("--test-skip-rows applies to --test-file only")


def _check_text_args(args: argparse.Namespace) -> None:
    """--sep, --decimal and --na-values, and the --opt delimiter alias."""
    sep = _delimiter(args)
    if sep is not None and sep == args.decimal:
        raise DataError(f"--decimal {args.decimal} needs another delimiter than {sep!r}: name it "
                        f"with --sep, e.g. --sep ';'")
    _na_values(args)


def _delimiter(args: argparse.Namespace) -> str | None:
    """The delimiter of --sep (or its alias --opt delimiter=X); '\\t' and 'tab' mean a tab."""
    alias = file_opts("csv", args.opt).get("delimiter")
    sep = args.sep
    if sep is not None and alias is not None and sep != alias:
        raise DataError(f"--sep {sep!r} and --opt delimiter={alias!r} disagree: give --sep only")
    sep = sep if sep is not None else alias
    if sep is None:
        return None
    if sep == "":
        raise DataError("--sep '': give the delimiter, e.g. --sep ';'")
    return {"\\t": "\t", "tab": "\t", "TAB": "\t"}.get(sep, sep)


def _na_values(args: argparse.Namespace) -> list[str]:
    """The tokens of --na-values A,B (stripped; a blank one is an error)."""
    if args.na_values is None:
        return []
    tokens = [t.strip() for t in args.na_values.split(",")]
    if not all(tokens):
        raise DataError(f"--na-values {args.na_values!r}: a token is blank (empty cells are "
                        "missing already); give e.g. --na-values '?'")
    return tokens


def _check_partition_args(args: argparse.Namespace) -> None:
    """--key and --min-records only with --partition key (and the reverse)."""
    if args.key and args.partition != "key":
        raise DataError(f"--key {args.key} needs --partition key (one agent per {args.key!r} "
                        f"value); without it the split would be --partition {args.partition}")
    if args.min_records is not None and args.partition != "key":
        raise DataError("--min-records applies to --partition key only")
    if args.partition == "key" and not args.key:
        raise DataError("--partition key needs --key COLUMN")


def parse_names(arg: str) -> list[str]:
    """Column names from --names: 'a,b,c' or '@FILE' (one name per line, blank lines skipped)."""
    if arg.startswith("@"):
        path = Path(arg[1:])
        try:
            lines = path.read_text(encoding="utf-8-sig").splitlines()
        except OSError as exc:
            raise DataError(f"--names {arg}: cannot read {path} ({exc.strerror or exc})") from None
        names = [ln.strip() for ln in lines if ln.strip()]
    else:
        names = [n.strip() for n in arg.split(",")]
    if not names or not any(names):
        raise DataError(f"--names {arg!r}: no column names")
    return names


def parse_target_map(text: str) -> dict[str, float | None]:
    """The --target-map JSON object, validated (label -> finite number or null)."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise DataError(f"--target-map is not valid JSON ({exc}); write e.g. "
                        f"--target-map '{{\">50K\": 1, \"<=50K\": -1}}'") from None
    if not isinstance(value, dict):
        raise DataError(f"--target-map must be a JSON object of label: number, got {text!r}")
    return readers.target_table(value)


def _task(args: argparse.Namespace) -> str:
    """The task: binary with --positive, else --task, else regression."""
    if args.positive is not None:
        return "binary"
    return args.task or "regression"


# ----------------------------------------------------------------------------------------------
# the generic file path


def _sources(args: argparse.Namespace) -> list[Path]:
    from mpi_dp.data.fetch import default_cache_dir

    return [Path(s) for s in args.source] + [default_cache_dir()]


def _read(args: argparse.Namespace, path: Path) -> readers.Table:
    """The CSV or LIBSVM file as a Table, with the flags and --opt values applied."""
    opts = file_opts(args.what, args.opt)
    if args.what == "libsvm":
        return readers.read_libsvm(path, n_features=opts.get("n_features"))
    if not args.target:
        raise DataError("'data prepare csv' needs --target COLUMN")
    cat: str | list[str] | None = {"auto": "auto", "none": None}.get(args.categorical, None)
    if args.categorical not in ("auto", "none"):
        cat = [c.strip() for c in args.categorical.split(",") if c.strip()]
    return readers.read_csv(
        path, args.target, columns=args.columns, drop=args.drop, keys=(args.key,) if args.key else (),
        categorical=cat, encoding=args.encoding, missing=args.missing,
        max_missing_frac=args.max_missing_frac,
        onehot_max_levels=opts.get("onehot_max_levels", ONEHOT_MAX_LEVELS),
        delimiter=_delimiter(args), names=parse_names(args.names) if args.names else None,
        target_map=parse_target_map(args.target_map) if args.target_map is not None else None,
        positive=args.positive, na_values=_na_values(args), decimal=args.decimal,
        skip_rows=args.skip_rows, strict=True)


def _read_test(args: argparse.Namespace, path: Path, t: readers.Table) -> readers.Table:
    """The --test-file, read as the training file `t` was (--test-skip-rows aside)."""
    test = Path(args.test_file)
    if not test.exists():
        raise DataError(f"--test-file '{test}' not found")
    if test.resolve() == path.resolve():
        raise DataError(f"--test-file '{test}' is the training file itself: a test set must be "
                        "records the agents do not train on")
    if args.test_skip_rows is not None:
        fmt = dataclasses.replace(t.fitted["format"], skip_rows=args.test_skip_rows)
        t = dataclasses.replace(t, fitted={**t.fitted, "format": fmt})
    try:
        return readers.read_csv_test(test, t)
    except DataError as exc:  # the test file's own skip flag
        raise DataError(str(exc).replace("--skip-rows N", "--test-skip-rows N")) from None


def _binary_labels(y: np.ndarray, path: Path, steps: list[dict[str, Any]]
                   ) -> tuple[np.ndarray, np.ndarray]:
    """Two label values -> -1 (the lower) and +1 (the higher), recorded as a step; returns the
    labels and the two values (a test file's labels are mapped the same way)."""
    vals = np.unique(y)
    if len(vals) != 2:
        raise DataError(f"'{path}': --task binary needs 2 label values, found {len(vals)} "
                        f"({', '.join(f'{v:g}' for v in vals[:10])}); map them with --target-map "
                        f"or name the positive class with --positive")
    steps.append({"step": "labels", "map": {str(vals[0]): -1, str(vals[1]): 1}})
    return np.where(y == vals[1], 1.0, -1.0), vals


def _test_labels(test: readers.Table, vals: np.ndarray) -> readers.Table:
    """The test labels through training's binary map; other values drop their rows (counted)."""
    keep = np.isin(test.y, vals)
    info = dict(test.info)
    if not keep.all():
        info["rows_dropped"] = {**info["rows_dropped"],
                                "label not among the training labels": int((~keep).sum())}
    if not keep.any():
        raise DataError(f"the test file has none of the training labels "
                        f"({', '.join(f'{v:g}' for v in vals)})")
    return dataclasses.replace(test, X=test.X[keep], y=np.where(test.y[keep] == vals[1], 1.0, -1.0),
                               info=info)


def _standardise(args: argparse.Namespace) -> bool:
    """--standardise / --no-standardise, else the default: on for csv, off for libsvm (sparse)."""
    return args.standardise if args.standardise is not None else args.what == "csv"


def _preprocess(args: argparse.Namespace, t: readers.Table, X: Any, pub: np.ndarray | None,
                steps: list[dict[str, Any]], decisions: dict[str, Any], Xt: Any = None,
                fit: np.ndarray | None = None) -> tuple[Any, Any, dict[str, np.ndarray]]:
    """Standardise (not the one-hot columns), max-normalise, PCA and row-normalise as asked,
    each fitted on the training rows (the hold-out's where it says so) and applied to the
    test rows `Xt` too; records steps, standardised columns and clipping."""
    public_extra: dict[str, np.ndarray] = {}
    fitted_on = "hold-out" if pub is not None else "all" if fit is None else "training rows"
    fit = pub if pub is not None else fit  # the rows the statistics come from (None: all)
    if _standardise(args):
        params = pre.fit_standardise(X, fit)
        onehot = t.fitted.get("indicator", np.zeros(X.shape[1], dtype=bool))
        params["mean"][onehot], params["scale"][onehot] = 0.0, 1.0  # indicators stay 0/1
        X = pre.apply_standardise(X, params)
        Xt = None if Xt is None else pre.apply_standardise(Xt, params)
        cols = int(np.count_nonzero(~onehot))
        steps.append({"step": "standardise", "fitted_on": fitted_on, "columns": cols,
                      "onehot_left": int(onehot.sum())})
        decisions["standardised"] = {"columns": cols, "fitted_on": fitted_on,
                                     "records": int(X.shape[0] if fit is None else len(fit)),
                                     "onehot_left": int(onehot.sum())}
    elif args.what == "csv":
        decisions["standardised"] = {"columns": 0, "why": "--no-standardise"}
    if args.max_normalise:
        X, divisors = pre.max_normalise(X, fit)
        Xt = None if Xt is None else pre.scale_columns(Xt, divisors)
        steps.append({"step": "max_normalise"})
    if args.pca:
        if pub is None:
            raise DataError("--pca needs a public hold-out (--public M) to fit on")
        params = pre.fit_pca(X[pub], args.pca)
        X = pre.apply_pca(X, params, whiten=True)
        Xt = None if Xt is None else pre.apply_pca(Xt, params, whiten=True)
        public_extra.update(pca_V=params["V"], pca_D=params["D"])
        steps.append({"step": "pca", "k": args.pca, "whiten": True, "centred": False})
    row_norm = _row_norm(args)
    if row_norm:
        Y = pre.row_normalise(X, row_norm)
        scaled = int(np.count_nonzero(_row_changed(X, Y)))
        if scaled:
            decisions["values_clipped"][f"rows scaled to {row_norm} norm 1 (--row-norm)"] = scaled
        X = Y
        if Xt is not None:
            Yt = pre.row_normalise(Xt, row_norm)
            decisions["test_rows_scaled"] = int(np.count_nonzero(_row_changed(Xt, Yt)))
            Xt = Yt
        steps.append({"step": "row_normalise", "norm": row_norm, "rows_scaled": scaled})
        # ||x||_1 <= 1 implies ||x||_2 <= 1: an L2 bound either way (data.bounds)
        public_extra[ROW_NORM_MAX] = np.array([1.0])
    elif args.what == "csv":
        decisions["row_norm"] = "none (--row-norm none): no public bound on the records' norms"
    return X, Xt, public_extra


def _row_norm(args: argparse.Namespace) -> str | None:
    """--row-norm, else the default: l2 for csv, none for libsvm."""
    if args.row_norm is None:
        return "l2" if args.what == "csv" else None
    return None if args.row_norm == "none" else args.row_norm


def _row_changed(X: Any, Y: Any) -> np.ndarray:
    """Mask of the rows `row_normalise` changed (those whose norm exceeded 1; others are kept
    bitwise). Dense or CSR."""
    largest = abs(Y - X).max(axis=1)
    if hasattr(largest, "toarray"):
        largest = largest.toarray()
    return np.asarray(largest).ravel() > 0


def _key_text(value: Any, record: Mapping[str, Any]) -> str:
    """A key value as the source writes it: the level of a code, the number of a numeric key."""
    if record.get("kind") == "codes":
        return str(record["levels"][int(value)])
    number = float(value)
    return str(int(number)) if number.is_integer() else repr(number)


def _key_partition(args: argparse.Namespace, t: readers.Table, pub: np.ndarray | None,
                   dropped: dict[str, int]) -> tuple[list[np.ndarray], list[str]]:
    """One agent per key value, and each agent's value; records with a missing key and small
    key groups are counted."""
    keys = np.asarray(t.keys[args.key])
    kind = t.info.get("keys", {}).get(args.key, {}).get("kind")
    missing = keys == -1 if kind == "codes" else (np.isnan(keys) if keys.dtype.kind == "f" else
                                                  np.zeros(len(keys), dtype=bool))
    exclude = missing.copy()
    if pub is not None:
        exclude[pub] = True
    missing_outside = int(np.count_nonzero(missing & ~_mask(len(keys), pub)))
    if missing_outside:
        dropped["missing key"] = missing_outside
    clean = np.where(missing, 0, keys) if keys.dtype.kind == "f" else keys
    min_records = args.min_records or 1
    parts, values = part.by_key(clean, min_records=min_records, exclude=exclude)
    small = int((~exclude).sum()) - sum(len(p) for p in parts)
    if small:
        dropped[f"key group under --min-records {min_records}"] = small
    record = t.info.get("keys", {}).get(args.key, {})
    return parts, [_key_text(v, record) for v in values]


def _mask(n: int, idx: np.ndarray | None) -> np.ndarray:
    out = np.zeros(n, dtype=bool)
    if idx is not None:
        out[idx] = True
    return out


def _partition(args: argparse.Namespace, y: np.ndarray, n: int, pub: np.ndarray | None,
               dropped: dict[str, int]) -> list[np.ndarray]:
    """Records -> agents as --partition says (not key); records no agent gets are counted by
    reason."""
    if args.partition == "iid":
        parts = part.iid(n, args.agents, args.seed, exclude=pub)
    elif args.partition == "equal":
        parts = part.equal_blocks(n, args.agents, exclude=pub)
    elif args.partition == "blocks":
        if not args.sizes:
            raise DataError("--partition blocks needs --sizes N1 N2 ...")
        parts = part.blocks(n, args.sizes, exclude=pub)
    else:
        parts = part.dirichlet(y, args.agents, args.alpha, args.seed, exclude=pub)
    left = n - (0 if pub is None else len(pub)) - sum(len(p) for p in parts)
    if left:
        why = "beyond the --sizes blocks" if args.partition == "blocks" else \
            f"partition remainder ({args.partition}: equal shares of {len(parts[0]):,})"
        dropped[why] = left
    return parts


def build_file(args: argparse.Namespace) -> Prepared:
    """The generic path: read a CSV/LIBSVM file (and its --test-file), preprocess, partition;
    every decision counted."""
    if not args.file:
        raise DataError(f"'data prepare {args.what}' needs the file to read")
    path = Path(args.file)
    if not path.exists():
        raise DataError(f"file '{path}' not found")
    t = _read(args, path)
    test = _read_test(args, path, t) if args.test_file else None
    decisions = reader_decisions(t.info)
    X, y = t.X, np.asarray(t.y, dtype=np.float64)
    steps: list[dict[str, Any]] = [{"step": f"read_{args.what}", **t.info.get("options", {})}]
    notes = _placeholder_notes(t.info)
    task = _task(args)
    if task == "binary":
        y, vals = _binary_labels(y, path, steps)
        test = None if test is None else _test_labels(test, vals)
    elif task == "regression" and len(np.unique(y)) == 2:
        notes.append(f"the target has only 2 values ({', '.join(f'{v:g}' for v in np.unique(y))}); "
                     "add --task binary if this is a classification")
    n = X.shape[0]
    if args.public >= n:
        dropped = sum(t.info.get("rows_dropped", {}).values())
        after = f" (after dropping {dropped:,} row{'s' * (dropped != 1)})" if dropped else ""
        what = (f"asks for {args.public:,} public records but {path} has only {n:,} rows{after}"
                if args.public > n else f"takes all {n:,} rows of {path}{after} as public "
                "records, leaving none for the owners")
        raise DataError(f"--public {args.public:,} {what}: give --public M below {n:,} (the "
                        "owners hold the other rows), or no --public")
    pub = np.arange(n - args.public, n) if args.public else None
    split = _test_split(args, n, pub)
    fit = None if split is None else np.setdiff1d(np.arange(n), split)
    X, Xt, public_extra = _preprocess(args, t, X, pub, steps, decisions,
                                      None if test is None else test.X, fit)
    test_global = None if test is None else (Xt, test.y)
    if split is not None:
        test_global = (X[split], y[split])
        decisions["test_split"] = {"share": args.test_split, "records": int(split.size),
                                   "seed": args.seed}
        steps.append({"step": "test_split", "share": args.test_split, "records": int(split.size),
                      "fitted_on": "the other rows (nothing fitted on the test rows)"})
        pub = split if pub is None else np.union1d(pub, split)  # no owner holds them
    if decisions.get("standardised", {}).get("fitted_on") in ("all", "training rows"):
        n_fit = n if fit is None else fit.size
        notes.append(f"standardised with the mean and std of all {n_fit:,} training records, the "
                     "owners' data, outside the privacy accounting; give --public M to fit them "
                     "on a public hold-out, or --no-standardise")
    values = None
    if args.partition == "key":
        parts, values = _key_partition(args, t, pub, decisions["rows_dropped"])
    else:
        parts = _partition(args, y, n, pub, decisions["rows_dropped"])
    tests = None
    if args.test_frac > 0:
        # seed + 1: the split streams must not repeat the shuffle stream of iid/dirichlet
        parts, test_parts = part.train_test_split(parts, args.test_frac, args.seed + 1)
        tests = list(as_pairs(X, y, test_parts))
    if test is not None:
        decisions.update(_test_decisions(args, test))
        steps.append({"step": "read_test_file", "path": str(args.test_file),
                      "fitted_on": "the training file (nothing fitted on the test file)"})
    names = t.feature_names if not args.pca else [f"pc{j + 1}" for j in range(args.pca)]
    hold = np.arange(n - args.public, n)
    return Prepared(agents=as_pairs(X, y, parts), task=task, feature_names=list(names),
                    public=None if not args.public else (X[hold], y[hold]),
                    public_extra=public_extra,
                    tests=tests, test_global=test_global, steps=steps,
                    source_files=list(t.info.get("files", []))
                    + ([] if test is None else list(test.info["files"])),
                    partition={"kind": args.partition, **part.summary(parts)},
                    parts=parts, public_index=None if not args.public else hold, notes=notes,
                    decisions=decisions,
                    partition_key=args.key if args.partition == "key" else None,
                    partition_values=values)


def _test_split(args: argparse.Namespace, n: int, pub: np.ndarray | None) -> np.ndarray | None:
    """--test-split F: a seeded share F of the rows outside the public hold-out, sorted, as the
    global test set (None without the flag)."""
    if not args.test_split:
        return None
    rows = np.arange(n) if pub is None else np.setdiff1d(np.arange(n), pub)
    k = int(round(args.test_split * rows.size))
    if k < 1 or k >= rows.size:
        raise DataError(f"--test-split {args.test_split}: gives {k} test rows of {rows.size:,}; "
                        "choose a share that leaves records on both sides")
    rng = np.random.default_rng([args.seed, 2])  # its own stream: not the partition's shuffle
    return np.sort(rng.choice(rows, size=k, replace=False))


def _placeholder_notes(info: Mapping[str, Any]) -> list[str]:
    """A note per categorical column with placeholder cells ('?') kept as a level."""
    notes = []
    for column, tokens in info.get("placeholder_cells", {}).items():
        for tok, count in tokens.items():
            notes.append(f"column {column}: {count:,} cell{'s are' if count != 1 else ' is'} "
                         f"{tok!r}; pass --na-values '{tok}' if that means missing")
    return notes


def _test_decisions(args: argparse.Namespace, test: readers.Table) -> dict[str, Any]:
    """The test file's figures for the decisions record (kept apart from the training rows)."""
    info = test.info
    out = {"test_file": str(args.test_file), "test_rows_read": int(info["n_rows_read"]),
           "test_records": int(test.X.shape[0]), "test_rows_dropped": dict(info["rows_dropped"]),
           "test_unseen_categories": dict(info["unseen_categories"]),
           "test_cells_imputed": dict(info["cells_imputed"])}
    if info.get("columns_ignored"):
        out["test_columns_ignored"] = list(info["columns_ignored"])
    if info.get("na_value_cells"):
        out["test_na_value_cells"] = dict(info["na_value_cells"])
    return out


def _options(args: argparse.Namespace) -> dict[str, Any]:
    """The arguments as stored in the shard file (the resolved task included)."""
    # --overwrite says what to do with an older file, nothing about the data: not stored, so
    # the same command with and without it writes the same bytes (the same data_sha256)
    opts = {k: v for k, v in vars(args).items()
            if k not in ("func", "command", "data_command", "overwrite")}
    opts["task"] = _task(args)
    return opts


def _recipe_options(r: recipes.Recipe, items: list[str]) -> dict[str, Any]:
    """A recipe's options with the --opt overrides, each numeric one in its range."""
    overrides = _parse_opts(items)
    o = recipes.options(r, overrides)
    for key in overrides:
        if key in OPT_RANGES:
            OPT_RANGES[key].check(f"--opt {key}", o[key], sep="=")
    return o


def run_prepare_command(args: argparse.Namespace) -> int:
    """Check everything (flags, ranges, --out), then build and write the shard file and print
    its summary; under mpiexec/srun only rank 0 works (the others return at once)."""
    if launcher_rank() != 0:
        return 0
    check_ranges(args, RANGES)
    check_args(args)
    if args.what in ("csv", "libsvm"):
        file_opts(args.what, args.opt)  # fail before reading the file
        out = args.out or f"data/{Path(args.file or 'prepared').name.split('.')[0]}.h5"
        refuse_existing(out, args.overwrite, "data prepare")
        run_prepare(lambda: build_file(args), out, recipe=args.what, options=_options(args),
                    source=str(args.file), quiet=args.quiet)
        return 0
    r = recipes.get(args.what)
    if args.file:
        raise DataError(f"recipe {r.name!r} takes no file argument; use --source DIR")
    o = _recipe_options(r, args.opt)
    out = args.out or f"data/{r.name}.h5"
    refuse_existing(out, args.overwrite, "data prepare")
    paths = recipes.resolve_files(r, _sources(args))
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    run_prepare(lambda: r.build(paths, o), out, recipe=r.name, options=o,
                source=", ".join(str(p) for p in paths), quiet=args.quiet)
    return 0


@functools.cache
def _defaults() -> Mapping[str, Any]:
    """Every flag's default, to tell which flags a user gave."""
    ap = argparse.ArgumentParser(add_help=False)
    add_prepare_arguments(ap)
    return vars(ap.parse_args(["x"]))
