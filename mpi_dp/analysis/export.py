"""`mpi-dp export`: a result file as tidy tables (CSV or Parquet) that pandas reads directly, or as
a release file (HDF5) that holds only what the privacy guarantee covers.

Tables (`export_tables`):
  metrics  one row per (configuration, iteration, run): `config` (the configuration's index),
           the configuration's columns (its swept values, then its scalar attributes; array
           attributes such as per-owner eps and n are left out), `iteration`, `run` (the run id,
           attribute `run_ids`, else 0..R-1), then one column per metric of G/metrics; a
           per-iteration metric (records,) repeats over the runs of its record
  ledger   one row per (configuration, agent): `config`, the configuration's columns, then every
           field of G/privacy/ledger (bytes decoded to str)
A configuration column whose name is also a metric's, a ledger field's, or `config`, `iteration`,
`run`, is named `config.<name>`. CSV floats are written as their shortest round-trip text, so
`pd.read_csv` gives back the same float64 bits (NaN as an empty cell, inf as `inf`).

The ledger table shows the totals of an owner that trained without noise (target eps = inf, or
a configuration none of whose owners made a noisy release) as inf, whatever the file recorded
(mpi_dp.analysis.guarantee.shown_totals: p2p's eps = inf rows record eps_pld 0); every other
value is the file's.

Release (`export_release`): the root attributes, /provenance, each group's attributes minus the
names its attribute `evaluation_only_attrs` (JSON list) lists, the attributes kept as datasets
`G/arrays/<name>` by the same rule, and only the datasets whose attribute `evaluation_only` is
present and false (a dataset without it is not released). Of a configuration whose guarantee is
not finite and certified (mpi_dp.analysis.guarantee: eps = inf, uncertified noise, no ledger)
it keeps only its attributes and what states its guarantee (GUARANTEE_PATHS: the ledger, the
owners' target eps and the agent coordinate they are indexed by): its models and every other
value computed from the owners' records are left out, and the root attribute
`release_nonprivate` (strict JSON) lists those configurations, why and what was left out;
`include_nonprivate` keeps them and writes the root attribute `release_warning`. Dimension
scales are re-attached where both the dataset and its scale are released.
"""

from __future__ import annotations

import fnmatch
import itertools
import json
import math
import os
from collections.abc import Iterable, Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from .. import strict_json
from ..errors import MpiDpError
from ..results.recorder import ARRAYS
from .guarantee import Guarantee, judge_group, ledger_table, shown_totals

#: columns of the metrics table that are not configuration columns or metrics
RESERVED = ("config", "iteration", "run")
#: prefix of a configuration column whose name a metric or ledger field already has
CLASH_PREFIX = "config."
#: attributes HDF5 dimension scales keep (object references): never copied as raw attributes
SCALE_ATTRS = frozenset({"DIMENSION_LIST", "REFERENCE_LIST", "CLASS", "NAME"})
#: the generic sweep axes in the order a job expands them (mpi_dp.jobspec.Job.configs); a
#: method's own sweep axes follow
SWEEP_AXES = ("variant", "owners", "n", "eps")
FORMATS = {"csv": "csv", "parquet": "parquet", "pq": "parquet"}
PYARROW_HINT = ("Parquet needs pyarrow: pip install pyarrow (or pip install 'mpi_dp[export]'), "
                "or export --format csv")
RELEASE_NOTE = (
    "A release of {source}: it keeps the root attributes, the provenance, each configuration's "
    "attributes and the datasets marked evaluation_only = false, the values the privacy "
    "guarantee covers (what left the data owners with noise, and what is computed from it "
    "alone). Removed: {n_ds} dataset(s) not marked evaluation_only = false (evaluation-only "
    "values computed from private records without noise, e.g. metrics measured on the owners' "
    "records, reference optima and baselines, or not marked at all) and {n_attrs} attribute(s) "
    "named in evaluation_only_attrs; their names are in the root attribute release_removed.")


#: what a release keeps of a configuration without a finite, certified guarantee besides its
#: attributes (paths relative to its group, shell patterns): what states the guarantee, so that
#: a reader of the release sees why the rest is missing (the compound ledger, its per-field
#: columns, the owners' target eps) and the agent coordinate those are indexed by. Nothing here
#: is computed from the owners' records: the ledger and eps are the job's plan and its
#: accounting, the agent ids are 0..N-1.
GUARANTEE_PATHS = ("privacy/ledger", "ledger/*", "eps", "agent")
NONPRIVATE_NOTE = (
    " Configurations without a finite, certified DP guarantee ({which}): of them the release "
    "keeps only the attributes and what states the guarantee ({paths}); their models and every "
    "other value ({n_ds} dataset(s)) were left out. The root attribute release_nonprivate says "
    "which configurations, why and what was left out; `mpi-dp export --release "
    "--include-nonprivate` keeps them (with a warning).")
INCLUDED_NOTE = (
    " WARNING: configurations without a finite, certified DP guarantee ({which}) are included "
    "as they are (--include-nonprivate): see the root attribute release_warning.")
RELEASE_WARNING = (
    "contains models of configurations without a finite, certified DP guarantee: {which}. "
    "They are not covered by any privacy guarantee (--include-nonprivate): do not share this "
    "file as a DP release of them; release_nonprivate lists them and why.")


class ExportError(MpiDpError, ValueError):
    """An export that cannot be made as asked (existing outputs, a missing library, an
    unfinished result for --release); the message says what to do."""


# -- tables -------------------------------------------------------------------------------------

def _plain(v: Any) -> Any:
    """An attribute as a table cell: str for bytes, Python scalars for NumPy scalars and 0-d
    arrays; None for what is not a scalar (arrays)."""
    if isinstance(v, np.ndarray):
        if v.shape != ():
            return None
        v = v[()]
    if isinstance(v, bytes | np.bytes_):
        return v.decode("utf-8", "replace")
    if isinstance(v, np.generic):
        return v.item()
    if isinstance(v, bool | int | float | str):
        return v
    return None


def sweep_values(res: Any) -> dict[int, dict[str, Any]]:
    """Each configuration's swept values {index: {key: value}}: its own `sweep_values`
    attribute (strict JSON, written since format 2), or in an older file the root attribute
    `sweep` expanded as a job expands it (`_expanded_sweep`). Generic axes come first (variant,
    owners, n, eps), then the method's own; a value that is a list (per-owner eps of one
    configuration) becomes its JSON text."""
    out: dict[int, dict[str, Any]] = {}
    for c in res.configs:
        text = c.attrs.get("sweep_values")
        if not isinstance(text, str):
            return _expanded_sweep(res)
        vals = strict_json.loads(text)
        keys = [k for k in SWEEP_AXES if k in vals] + [k for k in vals if k not in SWEEP_AXES]
        out[c.index] = {k: strict_json.dumps(vals[k]) if isinstance(vals[k], list | dict)
                        else vals[k] for k in keys}
    return out


def _expanded_sweep(res: Any) -> dict[int, dict[str, Any]]:
    """A format-1 file's swept values: the root `sweep` expanded in the job's order (variant,
    owners, n, eps, then the method's own axes, their order taken from the configurations'
    scalar attributes where they say it); {} when no order fits the configurations."""
    sweep = {k: v for k, v in res.sweep.items() if isinstance(v, list) and v}
    if not sweep:
        return {}
    generic = [k for k in SWEEP_AXES if k in sweep]
    extra = [k for k in sweep if k not in SWEEP_AXES]
    n_configs = int(res.attrs.get("n_configs", len(res.configs)))
    orders = itertools.permutations(extra) if len(extra) <= 4 else iter([tuple(extra)])
    for order in orders:
        axes = generic + list(order)
        combos = list(itertools.product(*(sweep[k] for k in axes)))
        if len(combos) != n_configs:
            return {}
        out: dict[int, dict[str, Any]] = {}
        fits = True
        for c in res.configs:
            if not 0 <= c.index < len(combos):
                return {}
            values = dict(zip(axes, combos[c.index], strict=True))
            for k, v in values.items():
                a = _plain(c.attrs.get(k))
                if a is not None and not isinstance(v, list) and not _same(a, v):
                    fits = False
            out[c.index] = {k: strict_json.dumps(v) if isinstance(v, list | dict) else v
                            for k, v in values.items()}
        if fits:
            return out
    return {}


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, int | float) and isinstance(b, int | float):
        return a == b or (math.isnan(a) and math.isnan(b))
    return str(a) == str(b)


def config_columns(res: Any) -> dict[int, dict[str, Any]]:
    """Each configuration's columns {index: {name: value}}: its swept values, then its scalar
    attributes (sorted by name; config_index is the `config` column itself)."""
    swept = sweep_values(res)
    out: dict[int, dict[str, Any]] = {}
    for c in res.configs:
        cols = dict(swept.get(c.index, {}))
        for k in sorted(c.attrs):
            if k in ("config_index", "sweep_values"):  # the latter: expanded into its axes
                continue
            v = _plain(c.attrs[k])
            if v is not None:
                cols[k] = v
        out[c.index] = cols
    return out


def _metric_datasets(c: Any) -> tuple[np.ndarray, dict[str, h5py.Dataset]]:
    """(iteration of each record present in every metric, {name: dataset}) of one
    configuration: its (records,) and (records, runs) metrics besides `iteration` (a file being
    written may be ragged: the records all of them hold)."""
    m = c.group.get("metrics")
    if not isinstance(m, h5py.Group) or not isinstance(m.get("iteration"), h5py.Dataset):
        return np.zeros(0, dtype=np.int64), {}
    runs = None
    found: dict[str, h5py.Dataset] = {}
    for name, d in m.items():
        if name == "iteration" or not isinstance(d, h5py.Dataset) or d.ndim not in (1, 2):
            continue
        if d.ndim == 2:
            runs = d.shape[1] if runs is None else runs
            if d.shape[1] != runs:
                continue
        found[name] = d
    n = min([m["iteration"].shape[0]] + [d.shape[0] for d in found.values()])
    return np.asarray(m["iteration"][:n], dtype=np.int64), found


def _run_ids(c: Any, width: int) -> np.ndarray:
    """The run ids (attribute run_ids, or format 2's `run` coordinate), else 0..R-1."""
    ids = c.attrs.get("run_ids")
    if ids is not None:
        ids = np.atleast_1d(np.asarray(ids))
        if ids.shape == (width,) and np.issubdtype(ids.dtype, np.integer):
            return ids.astype(np.int64)
    return np.arange(width, dtype=np.int64)


def _clash_names(res: Any) -> set[str]:
    """Names a configuration column may not take: the reserved columns, every metric and every
    ledger field of the file (the same renaming in both tables)."""
    names = set(RESERVED)
    for c in res.configs:
        names.update(_metric_datasets(c)[1])
        table = ledger_table(c.group)
        if table is not None:
            table_fields = table.dtype.names
            assert table_fields is not None  # a ledger table is a structured array
            names.update(table_fields)
    return names


def _renamed(cols: Mapping[str, Any], clash: set[str]) -> dict[str, Any]:
    out = {}
    for k, v in cols.items():
        name = k
        while name in clash or name in out:
            name = CLASH_PREFIX + name
        out[name] = v
    return out


def _frame(parts: list[dict[str, Any]], lead: list[str], tail: list[str]) -> Any:
    """One DataFrame of column blocks (dicts of equal-length arrays or scalars), columns in the
    order lead, the configuration columns as first seen, tail; a configuration column whose
    cells mix kinds (numbers and text) becomes text, so that Parquet can store it."""
    import pandas as pd

    frames = [pd.DataFrame(p) for p in parts if len(next(iter(p.values()), ()))]
    order = list(lead)
    for p in parts:
        order += [k for k in p if k not in order and k not in tail]
    order += [k for k in tail if k not in order]
    if not frames:
        return pd.DataFrame({k: [] for k in order})
    df = pd.concat(frames, ignore_index=True, sort=False).reindex(columns=order)
    for k in order:
        if k in lead or k in tail or df[k].dtype != object:
            continue
        kinds = {type(v) for v in df[k] if v is not None and not _is_nan(v)}
        if len(kinds) > 1 and not kinds <= {int, float}:
            df[k] = [None if v is None or _is_nan(v) else str(v) for v in df[k]]
    return df


def _is_nan(v: Any) -> bool:
    return isinstance(v, float) and math.isnan(v)


def metrics_frame(res: Any) -> Any:
    """The metrics table of an open result (mpi_dp.analysis.load.Result) as a DataFrame."""
    clash = _clash_names(res)
    columns = config_columns(res)
    parts: list[dict[str, Any]] = []
    metric_names: set[str] = set()
    for c in res.configs:
        it, found = _metric_datasets(c)
        n = len(it)
        metric_names.update(found)
        widths = [d.shape[1] for d in found.values() if d.ndim == 2]
        width = widths[0] if widths else int(c.attrs.get("runs", 1) or 1)
        rows = n * width
        block: dict[str, Any] = {"config": np.full(rows, c.index, dtype=np.int64)}
        for k, v in _renamed(columns[c.index], clash).items():
            block[k] = [v] * rows
        block["iteration"] = np.repeat(it, width)
        block["run"] = np.tile(_run_ids(c, width), n)
        for name, d in found.items():
            values = np.asarray(d[:n], dtype=np.float64)
            block[name] = values.reshape(-1) if d.ndim == 2 else np.repeat(values, width)
        parts.append(block)
    return _frame(parts, ["config"], ["iteration", "run"] + sorted(metric_names))


def ledger_frame(res: Any) -> Any:
    """The privacy ledger table of an open result as a DataFrame."""
    clash = _clash_names(res)
    columns = config_columns(res)
    parts, fields = [], []
    for c in res.configs:
        table = ledger_table(c.group)
        if table is None:
            continue
        block: dict[str, Any] = {"config": np.full(len(table), c.index, dtype=np.int64)}
        for k, v in _renamed(columns[c.index], clash).items():
            block[k] = [v] * len(table)
        shown = shown_totals(table)  # a no-noise row's totals: inf (guarantee.py)
        table_fields = table.dtype.names
        assert table_fields is not None  # a ledger table is a structured array
        for f in table_fields:
            fields += [f] if f not in fields else []
            col = shown.get(f, table[f])
            if col.dtype.kind == "S" or col.dtype.kind == "O":
                block[f] = [x.decode("utf-8", "replace") if isinstance(x, bytes) else x
                            for x in col]
            elif col.ndim > 1:  # a sub-array field: one JSON list per cell
                block[f] = [json.dumps(x.tolist()) for x in col]
            else:
                block[f] = col
        parts.append(block)
    return _frame(parts, ["config"], fields)


def table_paths(result: str | Path, out: str | Path | None, fmt: str | None) -> tuple[
        str, Path, Path]:
    """(format, metrics path, ledger path): --out names the metrics table (default the result's
    stem beside it); the ledger is <stem>.ledger.<ext> beside it; the format is --format, else
    the suffix of --out, else csv."""
    if fmt is None:
        fmt = FORMATS.get(Path(out).suffix.lower().lstrip("."), "csv") if out else "csv"
    fmt = FORMATS.get(fmt.lower(), "")
    if not fmt:
        raise ExportError("--format: csv or parquet")
    ext = "csv" if fmt == "csv" else "parquet"
    metrics = Path(out) if out else Path(result).with_suffix(f".{ext}")
    base = metrics.with_suffix("") if metrics.suffix.lower() in (".csv", ".parquet", ".pq") \
        else metrics
    return fmt, metrics, base.with_name(f"{base.name}.ledger.{ext}")


def _refuse_existing(paths: Iterable[Path], result: Path, overwrite: bool) -> None:
    paths = list(paths)
    for p in paths:
        if p.exists() and p.resolve() == result.resolve():
            raise ExportError(f"{p} is the result file itself; give another --out")
        if p.is_dir():
            raise ExportError(f"{p} is a directory; give a file path (--out)")
    existing = [str(p) for p in paths if p.exists()]
    if existing and not overwrite:
        raise ExportError(f"{', '.join(existing)} exist(s); export never replaces a file "
                          "silently: pass --overwrite to replace, or --out another path")


def _tmp(path: Path) -> Path:
    return path.with_name(f".{path.name}.tmp-{os.getpid()}")


def _check_pyarrow() -> None:
    try:
        import pyarrow  # noqa: F401
    except ImportError:
        raise ExportError(PYARROW_HINT) from None


def write_table(df: Any, path: Path, fmt: str) -> None:
    """Write a table: CSV without the index (floats as their shortest round-trip text), or
    Parquet (pyarrow)."""
    if fmt == "csv":
        df.to_csv(path, index=False)
    else:
        df.to_parquet(path, index=False, engine="pyarrow")


def export_tables(result: str | Path, out: str | Path | None = None, fmt: str | None = None,
                  overwrite: bool = False) -> list[Path]:
    """Write the metrics and ledger tables of `result`; returns [metrics path, ledger path]."""
    from .load import open_result

    fmt, metrics_path, ledger_path = table_paths(result, out, fmt)
    if fmt == "parquet":
        _check_pyarrow()
    with open_result(result) as res:
        _refuse_existing([metrics_path, ledger_path], res.path, overwrite)
        tables = [(metrics_frame(res), metrics_path), (ledger_frame(res), ledger_path)]
    tmps = [_tmp(path) for _, path in tables]
    try:  # both written before either replaces a file
        for (df, path), tmp in zip(tables, tmps, strict=True):
            path.parent.mkdir(parents=True, exist_ok=True)
            write_table(df, tmp, fmt)
        for (_, path), tmp in zip(tables, tmps, strict=True):
            os.replace(tmp, path)
    finally:
        for tmp in tmps:
            tmp.unlink(missing_ok=True)
    return [path for _, path in tables]


# -- release ------------------------------------------------------------------------------------

def release_path(result: str | Path, out: str | Path | None) -> Path:
    """--out, else <stem>.release.h5 beside the result."""
    return Path(out) if out else Path(result).with_name(f"{Path(result).stem}.release.h5")


def released(ds: h5py.Dataset) -> bool:
    """Whether a dataset is covered by the guarantee: its attribute `evaluation_only` is present
    and false (a boolean, or the integer 0); missing or anything else is not released."""
    if "evaluation_only" not in ds.attrs:
        return False
    v = ds.attrs["evaluation_only"]
    if isinstance(v, np.ndarray):
        if v.shape != ():
            return False
        v = v[()]
    if isinstance(v, bool | np.bool_):
        return not bool(v)
    if isinstance(v, int | np.integer):
        return int(v) == 0
    return False


def evaluation_only_attrs(group: h5py.Group) -> set[str]:
    """The names a group's attribute `evaluation_only_attrs` (a JSON list) lists; none when it
    is missing. A value that is not a JSON list of names is an error (nothing is written)."""
    if "evaluation_only_attrs" not in group.attrs:
        return set()
    raw = group.attrs["evaluation_only_attrs"]
    names: Any = None
    if isinstance(raw, np.ndarray) and raw.shape != ():  # an array of names works too
        names = [_plain(x) for x in raw.ravel()]
    elif isinstance(_plain(raw), str):
        try:
            names = json.loads(_plain(raw))
        except json.JSONDecodeError:
            names = None
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise ExportError(f"{group.file.filename}: {group.name}: attribute evaluation_only_attrs "
                          f"is not a JSON list of attribute names ({_plain(raw)!r}); nothing "
                          "written")
    return set(names)


def _copy_attrs(src: h5py.Group | h5py.Dataset, dst: h5py.Group | h5py.Dataset,
                drop: AbstractSet[str] = frozenset()) -> list[str]:
    """Copy attributes with their HDF5 types, except dimension-scale bookkeeping, attributes
    holding object references, and `drop`; returns the names dropped by `drop`."""
    dropped = []
    for k in src.attrs:
        if k in SCALE_ATTRS:
            continue
        if k in drop:
            dropped.append(k)
            continue
        aid = src.attrs.get_id(k)
        if h5py.check_dtype(ref=aid.dtype) is not None:
            continue
        dst.attrs.create(k, src.attrs[k], dtype=aid.dtype)
    return dropped


def _copy_dataset(src: h5py.Dataset, dst_parent: h5py.Group, name: str) -> h5py.Dataset:
    """Re-create a dataset (data, type, chunks, filters, attributes but scale bookkeeping)."""
    kw: dict[str, Any] = {}
    if src.shape is None:  # a null dataspace
        data: Any = h5py.Empty(src.dtype)
    else:
        data = src[()]
        if src.chunks is not None:
            kw.update(chunks=src.chunks, maxshape=src.maxshape, compression=src.compression,
                      compression_opts=src.compression_opts, shuffle=src.shuffle,
                      fletcher32=src.fletcher32)
    ds = dst_parent.create_dataset(name, data=data, dtype=src.dtype, **kw)
    _copy_attrs(src, ds)
    return ds


@dataclass
class NonPrivate:
    """A configuration whose guarantee is not finite and certified, as a release treats it."""

    index: int
    group: str  # its HDF5 group: /configs/<i>, or / for a single configuration
    label: str
    guarantee: Guarantee
    left_out: list[str] = field(default_factory=list)  # released datasets not copied

    @property
    def line(self) -> str:
        """'#3 (eps=inf, n=4000): eps = inf: trained without noise (...)'."""
        return f"#{self.index} ({self.label}): {self.guarantee.reason}"

    def record(self, included: bool) -> dict[str, Any]:
        return {"config": self.index, "group": self.group, "label": self.label,
                "eps": self.guarantee.eps, "reason": self.guarantee.reason,
                "included": included, "left_out": self.left_out}


@dataclass
class ReleaseReport:
    """What `write_release` did: the datasets and attributes removed as evaluation-only, and the
    configurations without a finite, certified guarantee (left out, or kept with a warning)."""

    evaluation_only: list[str]
    attrs: list[str]
    nonprivate: list[NonPrivate]
    included: bool

    @property
    def datasets(self) -> list[str]:
        """Every dataset of the source the release does not hold."""
        return sorted(set(self.evaluation_only).union(*(n.left_out for n in self.nonprivate)))

    def __getitem__(self, key: str) -> list[str]:  # the former {"datasets", "attrs"} dict
        return {"datasets": self.datasets, "attrs": self.attrs}[key]


def _text_attr(v: Any, default: str) -> str:
    t = _plain(v)
    return default if t is None else str(t)


def config_groups(f: h5py.File) -> dict[str, h5py.Group]:
    """{group name: group} of the configurations of a result file: /configs/<i>, or the root for
    a single configuration (as mpi_dp.analysis.load reads them)."""
    configs = f.get("configs")
    if isinstance(configs, h5py.Group):
        return {g.name: g for g in configs.values() if isinstance(g, h5py.Group)}
    return {"/": f}


def nonprivate_configs(f: h5py.File) -> dict[str, NonPrivate]:
    """The configurations of `f` whose guarantee is not finite and certified, by group name."""
    out = {}
    for k, (name, g) in enumerate(sorted(config_groups(f).items())):
        verdict = judge_group(g)
        if verdict.private:
            continue
        index = int(_plain(g.attrs.get("config_index", k)) or 0)
        out[name] = NonPrivate(index, name, _text_attr(g.attrs.get("label"), f"config {index}"),
                               verdict)
    return out


def _configuration_of(path: str, groups: Mapping[str, Any]) -> tuple[str, str] | None:
    """(group, path relative to it) of the configuration a dataset belongs to, or None (the
    provenance, anything outside the configurations)."""
    if path.startswith("/provenance/"):
        return None
    if "/" in groups:
        return "/", path[1:]
    parts = path.split("/", 3)  # "", "configs", "<i>", rest
    if len(parts) == 4 and parts[1] == "configs" and f"/configs/{parts[2]}" in groups:
        return f"/configs/{parts[2]}", parts[3]
    return None


def write_release(src: h5py.File, dst: h5py.File, source_name: str,
                  include_nonprivate: bool = False) -> ReleaseReport:
    """Copy what a release keeps from `src` into the empty `dst`; returns what was removed and
    the configurations without a finite, certified guarantee (whose models and values are left
    out unless `include_nonprivate`)."""
    removed: dict[str, list[str]] = {"datasets": [], "attrs": []}
    kept: dict[str, tuple[h5py.Dataset, h5py.Dataset]] = {}  # path -> (src, dst)
    nonprivate = nonprivate_configs(src)

    def withheld(path: str) -> bool:
        """A released dataset of a configuration without a guarantee, left out (recorded)."""
        where = _configuration_of(path, nonprivate)
        if include_nonprivate or where is None:
            return False
        group, rel = where
        if any(fnmatch.fnmatchcase(rel, p) for p in GUARANTEE_PATHS):
            return False
        nonprivate[group].left_out.append(path)
        return True

    def walk(g: h5py.Group, out: h5py.Group, drop_attrs: set[str]) -> None:
        removed["attrs"] += [f"{g.name}:{k}" for k in _copy_attrs(g, out, drop_attrs)]
        for name, obj in g.items():
            path = obj.name
            if isinstance(obj, h5py.Group):
                if name == ARRAYS:  # attributes too long for one: the attribute rule
                    sub = out.require_group(name)
                    _copy_attrs(obj, sub)
                    for an, ds in obj.items():
                        explicit_eval = "evaluation_only" in ds.attrs and not released(ds)
                        if an in drop_attrs or explicit_eval or not isinstance(ds, h5py.Dataset):
                            removed["datasets"].append(ds.name)
                        else:
                            kept[ds.name] = (ds, _copy_dataset(ds, sub, an))
                    if not len(sub):
                        del out[name]
                    continue
                sub = out.create_group(name)
                walk(obj, sub, evaluation_only_attrs(obj))
                if not len(sub) and not _keep_empty_group(obj):
                    del out[name]
            elif isinstance(obj, h5py.Dataset):
                if not released(obj):
                    removed["datasets"].append(path)
                elif not withheld(path):
                    kept[path] = (obj, _copy_dataset(obj, out, name))

    walk(src, dst, evaluation_only_attrs(src))
    # dimension scales: mark the released scales, then attach them where they were attached
    for s, d in kept.values():
        if s.is_scale:
            d.make_scale(_plain(s.attrs.get("NAME")) or "")
    placeholders: dict[str, h5py.Dataset] = {}
    for s, d in list(kept.values()):
        if "DIMENSION_LIST" not in s.attrs:
            continue
        for i, dim in enumerate(s.dims):
            for scale in dim.values():
                if not scale.is_scale:
                    continue
                if scale.name in kept:
                    d.dims[i].attach_scale(kept[scale.name][1])
                else:  # keep the dimension's name, not its values (netCDF readers need it)
                    if scale.name not in placeholders:
                        placeholders[scale.name] = _dimension_only(dst, scale)
                    d.dims[i].attach_scale(placeholders[scale.name])
    report = ReleaseReport(sorted(removed["datasets"]), removed["attrs"],
                           [nonprivate[k] for k in sorted(nonprivate)], include_nonprivate)
    for n in report.nonprivate:
        n.left_out.sort()
    left_out = sorted(p for n in report.nonprivate for p in n.left_out)
    which = "; ".join(n.line for n in report.nonprivate)
    note = RELEASE_NOTE.format(source=source_name, n_ds=len(removed["datasets"]),
                               n_attrs=len(removed["attrs"]))
    if report.nonprivate:
        note += (INCLUDED_NOTE.format(which=which) if include_nonprivate else
                 NONPRIVATE_NOTE.format(which=which, paths=", ".join(GUARANTEE_PATHS),
                                        n_ds=len(left_out)))
    dst.attrs["release"] = True
    dst.attrs["release_note"] = note
    dst.attrs["release_removed"] = json.dumps({"datasets": report.datasets,
                                               "attrs": report.attrs, "nonprivate": left_out})
    dst.attrs["release_nonprivate"] = strict_json.dumps(
        [n.record(include_nonprivate) for n in report.nonprivate])
    if include_nonprivate and report.nonprivate:
        dst.attrs["release_warning"] = RELEASE_WARNING.format(which=which)
    return report


#: the NAME of a dimension scale that is a dimension only (the netCDF-4 convention)
NOT_A_VARIABLE = "This is a netCDF dimension but not a netCDF variable."


def _dimension_only(dst: h5py.File, scale: h5py.Dataset) -> h5py.Dataset:
    """In place of a scale that is not released but names an axis of a released dataset: a
    dimension without values (netCDF-4's convention: xarray shows the dimension's name and
    length), at the scale's path; nothing of the scale's data is copied."""
    size = int(scale.shape[0]) if scale.shape else 0
    parent, name = scale.name.rsplit("/", 1)
    ds = dst.require_group(parent or "/").create_dataset(name, shape=(size,), dtype=">f4")
    ds.make_scale(f"{NOT_A_VARIABLE}{size:10d}")
    ds.attrs["evaluation_only"] = False
    ds.attrs["release_placeholder"] = ("the dimension of an evaluation-only coordinate, not "
                                       "released: its name and length only, no values")
    return ds


def _keep_empty_group(g: h5py.Group) -> bool:
    """Groups a release keeps even without datasets: the provenance and the configurations
    (their attributes are the configuration)."""
    return g.name == "/provenance" or (g.parent.name == "/configs") or g.name == "/configs"


def export_release(result: str | Path, out: str | Path | None = None, overwrite: bool = False,
                   force: bool = False, include_nonprivate: bool = False
                   ) -> tuple[Path, ReleaseReport]:
    """Write the release file of `result`; returns (its path, what was removed and the
    configurations without a finite, certified guarantee)."""
    from .load import open_result

    with open_result(result) as res:
        src_path = res.path
        if res.status != "complete" and not force:
            raise ExportError(
                f"{src_path} has status {res.status!r}, not 'complete' ({res.completeness}); a "
                "release of an unfinished job is refused: finish it (run --resume) or pass "
                "--force to release what it holds")
    path = release_path(result, out)
    _refuse_existing([path], src_path, overwrite)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _tmp(path)
    try:
        with h5py.File(src_path, "r", locking=False) as src, \
                h5py.File(tmp, "w", libver=("v108", "latest"), locking=False) as dst:
            report = write_release(src, dst, Path(result).name, include_nonprivate)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path, report
