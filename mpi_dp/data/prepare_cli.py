"""Arguments and command of `mpi-dp data prepare` (recipes by name, or a CSV/LIBSVM file)."""

from __future__ import annotations

import argparse
import ast
from pathlib import Path
from typing import Any

import numpy as np

from mpi_dp.data import partition as part
from mpi_dp.data import preprocess as pre
from mpi_dp.data import readers, recipes
from mpi_dp.data.prepare import Prepared, as_pairs, run_prepare
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
  mpi-dp data prepare csv visits.csv.gz --target los --key hospital --min-records 500 \\
      --categorical auto --encoding auto --standardise
  mpi-dp data prepare libsvm rcv1.bz2 --partition iid --agents 64 --task binary

Source files are looked up under --source (repeatable) and then the fetch cache
($MPI_DP_DATA_CACHE or ~/.cache/mpi_dp/data). The shard file records the recipe, options,
source files (SHA-256), preprocessing steps and partition as attributes.
"""


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
    ap.add_argument("--out", metavar="PATH", help="shard file (default data/<recipe>.h5)")
    ap.add_argument("--source", action="append", metavar="DIR", default=[],
                    help="folder holding the original files (repeatable)")
    ap.add_argument("--opt", action="append", metavar="KEY=VALUE", default=[],
                    help="recipe option (Python literal value), e.g. --opt public=500")
    ap.add_argument("--quiet", action="store_true", help="no summary")
    g = ap.add_argument_group("csv / libsvm files")
    g.add_argument("--target", help="target column (csv)")
    g.add_argument("--drop", nargs="*", default=[], help="columns to leave out")
    g.add_argument("--columns", nargs="*", help="feature columns to keep (default all)")
    g.add_argument("--categorical", default="auto",
                   help="'auto' (non-numeric columns), 'none', or a comma-separated list")
    g.add_argument("--encoding", default="codes", choices=("codes", "onehot", "frequency", "auto"),
                   help="categorical encoding (auto: one-hot up to 16 levels, else frequency)")
    g.add_argument("--missing", default="zero", choices=("zero", "drop", "mean", "median", "error"),
                   help="missing values: set to 0, drop the row, impute, or fail")
    g.add_argument("--max-missing-frac", type=float, default=1.0,
                   help="drop feature columns missing in more than this share of rows")
    g.add_argument("--task", choices=("regression", "binary", "multiclass"), default="regression",
                   help="binary maps the two label values to -1/+1")
    g.add_argument("--partition", default="iid",
                   choices=("iid", "equal", "blocks", "key", "dirichlet"),
                   help="how records become agents")
    g.add_argument("--agents", type=int, default=4, help="number of agents (iid/equal/dirichlet)")
    g.add_argument("--sizes", type=int, nargs="*", help="block sizes (blocks)")
    g.add_argument("--key", help="key column: one agent per value (partition key)")
    g.add_argument("--min-records", type=int, default=1, help="smallest agent kept (key)")
    g.add_argument("--alpha", type=float, default=0.5, help="Dirichlet concentration (dirichlet)")
    g.add_argument("--public", type=int, default=0, help="last M records as public hold-out")
    g.add_argument("--pca", type=int, help="PCA to K components fitted on the hold-out (whitened)")
    g.add_argument("--standardise", action="store_true",
                   help="z-score columns with hold-out statistics (all rows without one)")
    g.add_argument("--max-normalise", action="store_true", help="divide columns by their max |x|")
    g.add_argument("--row-norm", choices=("l1", "l2"), help="scale rows to norm <= 1")
    g.add_argument("--test-frac", type=float, default=0.0, help="per-agent test share")
    g.add_argument("--seed", type=int, default=1, help="seed of random partitions")


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


def _sources(args: argparse.Namespace) -> list[Path]:
    from mpi_dp.data.fetch import default_cache_dir

    return [Path(s) for s in args.source] + [default_cache_dir()]


def build_file(args: argparse.Namespace) -> Prepared:
    """The generic path: read a CSV/LIBSVM file, preprocess, partition."""
    if not args.file:
        raise DataError(f"'data prepare {args.what}' needs the file to read")
    path = Path(args.file)
    if not path.exists():
        raise DataError(f"file '{path}' not found")
    keys = (args.key,) if args.key else ()
    if args.what == "csv":
        if not args.target:
            raise DataError("'data prepare csv' needs --target COLUMN")
        cat = {"auto": "auto", "none": None}.get(args.categorical, None)
        if args.categorical not in ("auto", "none"):
            cat = [c.strip() for c in args.categorical.split(",") if c.strip()]
        t = readers.read_csv(path, args.target, columns=args.columns, drop=args.drop, keys=keys,
                             categorical=cat, encoding=args.encoding, missing=args.missing,
                             max_missing_frac=args.max_missing_frac)
    else:
        t = readers.read_libsvm(path)
    X, y = t.X, np.asarray(t.y, dtype=np.float64)
    steps: list[dict[str, Any]] = [{"step": f"read_{args.what}", **t.info.get("options", {})}]
    if args.task == "binary":
        vals = np.unique(y)
        if len(vals) != 2:
            raise DataError(f"'{path}': --task binary needs 2 label values, found {len(vals)}")
        y = np.where(y == vals[1], 1.0, -1.0)
        steps.append({"step": "labels", "map": {str(vals[0]): -1, str(vals[1]): 1}})
    n = X.shape[0]
    pub = np.arange(n - args.public, n) if args.public else None
    public_extra: dict[str, np.ndarray] = {}
    if args.standardise:
        params = pre.fit_standardise(X, pub)
        X = pre.apply_standardise(X, params)
        steps.append({"step": "standardise", "fitted_on": "hold-out" if pub is not None else "all"})
    if args.max_normalise:
        X, _ = pre.max_normalise(X, pub)
        steps.append({"step": "max_normalise"})
    if args.pca:
        if pub is None:
            raise DataError("--pca needs a public hold-out (--public M) to fit on")
        params = pre.fit_pca(X[pub], args.pca)
        X = pre.apply_pca(X, params, whiten=True)
        public_extra.update(pca_V=params["V"], pca_D=params["D"])
        steps.append({"step": "pca", "k": args.pca, "whiten": True, "centred": False})
    if args.row_norm:
        X = pre.row_normalise(X, args.row_norm)
        steps.append({"step": "row_normalise", "norm": args.row_norm})
    if args.partition == "iid":
        parts = part.iid(n, args.agents, args.seed, exclude=pub)
    elif args.partition == "equal":
        parts = part.equal_blocks(n, args.agents, exclude=pub)
    elif args.partition == "blocks":
        if not args.sizes:
            raise DataError("--partition blocks needs --sizes N1 N2 ...")
        parts = part.blocks(n, args.sizes, exclude=pub)
    elif args.partition == "key":
        if not args.key:
            raise DataError("--partition key needs --key COLUMN")
        parts, _ = part.by_key(t.keys[args.key], min_records=args.min_records, exclude=pub)
    else:
        parts = part.dirichlet(y, args.agents, args.alpha, args.seed, exclude=pub)
    tests = None
    if args.test_frac > 0:
        # seed + 1: the split streams must not repeat the shuffle stream of iid/dirichlet
        parts, test_parts = part.train_test_split(parts, args.test_frac, args.seed + 1)
        tests = list(as_pairs(X, y, test_parts))
    names = t.feature_names if not args.pca else [f"pc{j + 1}" for j in range(args.pca)]
    return Prepared(agents=as_pairs(X, y, parts), task=args.task, feature_names=list(names),
                    public=None if pub is None else (X[pub], y[pub]), public_extra=public_extra,
                    tests=tests, steps=steps, source_files=list(t.info.get("files", [])),
                    partition={"kind": args.partition, **part.summary(parts)},
                    parts=parts, public_index=pub)


def run_prepare_command(args: argparse.Namespace) -> int:
    if args.what in ("csv", "libsvm"):
        out = args.out or f"data/{Path(args.file or 'prepared').name.split('.')[0]}.h5"
        opts = {k: v for k, v in vars(args).items() if k not in ("func", "command", "data_command")}
        run_prepare(lambda: build_file(args), out, recipe=args.what, options=opts,
                    source=str(args.file), quiet=args.quiet)
        return 0
    r = recipes.get(args.what)
    if args.file:
        raise DataError(f"recipe {r.name!r} takes no file argument; use --source DIR")
    o = recipes.options(r, _parse_opts(args.opt))
    paths = recipes.resolve_files(r, _sources(args))
    out = args.out or f"data/{r.name}.h5"
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    run_prepare(lambda: r.build(paths, o), out, recipe=r.name, options=o,
                source=", ".join(str(p) for p in paths), quiet=args.quiet)
    return 0
