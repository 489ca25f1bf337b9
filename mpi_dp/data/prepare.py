"""`mpi-dp data prepare`: source -> preprocessing -> partition -> one HDF5 shard file.

A recipe or the generic CSV/LIBSVM path builds a `Prepared` (per-agent records plus everything
that says how they were made); `write_prepared` stores it atomically with its provenance as root
attributes (recipe, options, source files with SHA-256, preprocessing steps, partition, notes and
the decisions: rows dropped, columns dropped, cells imputed and values clipped, each counted by
reason; one over 16 KiB, e.g. the decisions of a very wide table, as a /meta dataset, and the
column names always as /meta/feature_names), so a shard file says how it was made;
`summary_text` prints what a user checks first.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse as sp

from mpi_dp.data.shards import ShardFile, write_shards

Pair = tuple[Any, np.ndarray]


@dataclasses.dataclass
class Prepared:
    """Per-agent records and the record of how they were made (input of `write_prepared`)."""

    agents: list[Pair]
    task: str
    feature_names: list[str]
    public: Pair | None = None
    public_extra: dict[str, np.ndarray] = dataclasses.field(default_factory=dict)
    tests: Sequence[Pair | None] | None = None
    test_global: Pair | None = None
    agent_extra: list[dict[str, np.ndarray]] | None = None
    steps: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    notes: list[str] = dataclasses.field(default_factory=list)
    source_files: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    partition: dict[str, Any] = dataclasses.field(default_factory=dict)
    parts: list[np.ndarray] | None = None  # each agent's record indices in the source (stored)
    public_index: np.ndarray | None = None  # the hold-out's record indices in the source
    decisions: dict[str, Any] = dataclasses.field(default_factory=dict)  # see `reader_decisions`
    partition_key: str | None = None  # the key column of a partition by key (one agent per value)
    partition_values: list[str] | None = None  # agent i's key value, as the source writes it


#: agents up to which the partition values are a root attribute (JSON); above, /public dataset
PARTITION_VALUES_IN_ATTRS = 1024
#: reader notes copied into the decisions when present (how the text was read)
_FORMAT_KEYS = ("delimiter", "delimiter_sniffed", "decimal", "lines_skipped", "na_values",
                "na_value_cells", "header_cells_named", "renamed_columns", "placeholder_cells")


def reader_decisions(info: Mapping[str, Any]) -> dict[str, Any]:
    """The decisions record of a reader's ``info``: rows read, rows dropped by reason, columns
    dropped with their reasons, cells imputed by reason (and per column), non-finite values per
    column, category level counts and each categorical column's encoding, and how the text was
    read (delimiter, decimal mark, skipped lines, extra missing tokens, placeholder cells kept as
    categories). Later steps add their own drops (the partition's) and ``values_clipped``, so
    that rows read = records in the shard file + rows dropped."""
    options = info.get("options", {})
    out = {
        "rows_read": int(info.get("n_rows_read", info.get("n_rows", 0))),
        "rows_dropped": dict(info.get("rows_dropped", {})),
        "columns_dropped": dict(info.get("dropped_columns", {})),
        "cells_imputed": dict(info.get("cells_imputed", {})),
        "imputation": options.get("missing"),
        "imputed_by_column": dict(info.get("imputed", {})),
        "nonfinite_by_column": dict(info.get("nonfinite_values", {})),
        "ragged_rows": info.get("ragged_rows"),
        "short_rows_padded": info.get("short_rows_padded"),
        "category_levels": {k: len(v["levels"]) for k, v in info.get("encodings", {}).items()},
        "values_clipped": {},
    }
    if "encodings" in info:
        out["encodings"] = {k: v["encoding"] for k, v in info["encodings"].items()}
    for key in _FORMAT_KEYS:
        if info.get(key):
            out[key] = info[key]
    return out


def _jsonable(v: Any) -> Any:
    if isinstance(v, np.ndarray):
        return v.tolist()
    if isinstance(v, np.generic):
        return v.item()
    if isinstance(v, Path):
        return str(v)
    raise TypeError(f"not JSON-serialisable: {type(v).__name__}")


def _json(v: Any) -> str:
    return json.dumps(v, default=_jsonable, sort_keys=True)


def write_prepared(prep: Prepared, out: str | os.PathLike[str], *, recipe: str,
                   options: Mapping[str, Any], source: str) -> Path:
    """Write `prep` to `out` (atomic: no half-written shard on failure) with its provenance."""
    sizes = [int(x.shape[0]) for x, _ in prep.agents]
    attrs = {
        "recipe": recipe,
        "options": _json(dict(options)),
        "source_files": _json(prep.source_files),
        "preprocessing": _json(prep.steps),
        "partition": _json({**prep.partition, "sizes": sizes}),
        "notes": _json(prep.notes),
        "prepared_by": "mpi-dp data prepare",
    }
    if prep.decisions:
        attrs["decisions"] = _json(prep.decisions)
    names = list(prep.feature_names)  # dataset /meta/feature_names: any number of columns
    kwargs: dict[str, Any] = {}
    extra = [dict(e) for e in prep.agent_extra] if prep.agent_extra is not None else None
    if prep.parts is not None:  # provenance: which source records each agent holds
        extra = extra or [{} for _ in prep.agents]
        for e, idx in zip(extra, prep.parts, strict=True):
            e["record"] = np.asarray(idx, dtype=np.int64)
    if extra is not None:
        kwargs["agent_extra"] = extra
    public_extra = dict(prep.public_extra)
    if prep.public_index is not None:
        public_extra["record"] = np.asarray(prep.public_index, dtype=np.int64)
    if prep.test_global is not None:
        kwargs["test_global"] = prep.test_global
    if prep.partition_key is not None:
        attrs["partition_key"] = prep.partition_key
    if prep.partition_values is not None:
        values = [str(v) for v in prep.partition_values]
        if len(values) != len(prep.agents):
            raise ValueError(f"{len(values)} partition values for {len(prep.agents)} agents")
        text = _json(values)
        if len(values) <= PARTITION_VALUES_IN_ATTRS and len(text.encode()) <= 32_768:
            attrs["partition_values"] = text
        else:  # HDF5 attributes are limited to 64 KiB
            public_extra["partition_values"] = np.array(values, dtype=str)
    return write_shards(out, prep.agents, public=prep.public, task=prep.task,
                        feature_names=names, source=source, attrs=attrs,
                        public_extra=public_extra or None, test=prep.tests, **kwargs)


def _rows(X: Any) -> int:
    return int(X.shape[0])


def _human(nbytes: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if nbytes < 1024 or unit == "GiB":
            return f"{nbytes:.0f} {unit}" if unit == "B" else f"{nbytes:.1f} {unit}"
        nbytes /= 1024
    return f"{nbytes} B"


def summary(prep: Prepared, path: Path, seconds: float) -> dict[str, Any]:
    """Figures printed after preparing (and returned for tests and the Python API)."""
    sizes = np.array([_rows(x) for x, _ in prep.agents])
    labels = np.concatenate([np.asarray(y) for _, y in prep.agents])
    out: dict[str, Any] = {
        "path": str(path), "agents": len(sizes), "records": int(sizes.sum()),
        "records_min": int(sizes.min()), "records_median": float(np.median(sizes)),
        "records_max": int(sizes.max()), "features": len(prep.feature_names),
        "task": prep.task, "sparse": any(sp.issparse(x) for x, _ in prep.agents),
        "public": 0 if prep.public is None else _rows(prep.public[0]),
        "test_agents": 0 if prep.tests is None else int(sum(_rows(t[0]) for t in prep.tests if t)),
        "test_global": 0 if prep.test_global is None else _rows(prep.test_global[0]),
        "bytes": path.stat().st_size, "seconds": seconds,
    }
    if prep.decisions:
        out["decisions"] = prep.decisions
    if prep.task != "regression":
        values, counts = np.unique(labels, return_counts=True)
        out["classes"] = {float(v): int(c) for v, c in zip(values, counts, strict=True)}
    else:
        out["target_mean"], out["target_std"] = float(labels.mean()), float(labels.std())
    return out


def summary_text(s: Mapping[str, Any]) -> str:
    """The printed summary: agents, records per agent, features, classes, size, time."""
    lines = [
        f"wrote {s['path']}",
        f"  agents            {s['agents']}",
        f"  records per agent min {s['records_min']:,} / median {s['records_median']:,.0f} / "
        f"max {s['records_max']:,} (total {s['records']:,})",
        f"  features          {s['features']}{' (sparse CSR)' if s['sparse'] else ''}",
    ]
    if "classes" in s:
        cls = s["classes"]
        shown = ", ".join(f"{v:g}: {c:,}" for v, c in list(cls.items())[:12])
        more = f", ... ({len(cls)} classes)" if len(cls) > 12 else f" ({len(cls)} classes)"
        lines.append(f"  task              {s['task']}; labels {shown}{more}")
    else:
        lines.append(f"  task              regression; target mean {s['target_mean']:.4g}, "
                     f"std {s['target_std']:.4g}")
    extra = []
    if s["public"]:
        extra.append(f"public hold-out {s['public']:,}")
    if s["test_agents"]:
        extra.append(f"per-agent test {s['test_agents']:,}")
    if s["test_global"]:
        extra.append(f"global test {s['test_global']:,}")
    if extra:
        lines.append("  other records     " + ", ".join(extra))
    if "decisions" in s:
        lines.extend(decisions_text(s["decisions"]))
    lines.append(f"  size on disk      {_human(s['bytes'])}")
    lines.append(f"  time              {s['seconds']:.1f} s")
    return "\n".join(lines)


def _counts(counts: Mapping[str, Any]) -> str:
    """'3 (ragged row: 1, missing target: 2)' for {'ragged row': 1, 'missing target': 2}."""
    total = sum(int(v) for v in counts.values())
    if not total:
        return "0"
    return f"{total:,} (" + ", ".join(f"{k}: {int(v):,}" for k, v in counts.items() if v) + ")"


def decisions_text(d: Mapping[str, Any]) -> list[str]:
    """Summary lines saying how the text was read and what was dropped, imputed, encoded,
    standardised and clipped, each counted."""
    cols = d.get("columns_dropped", {})
    shown = ", ".join(f"{k}: {v}" for k, v in list(cols.items())[:8])
    more = f", ... ({len(cols)} in all)" if len(cols) > 8 else ""
    imputed = _counts(d.get("cells_imputed", {}))
    how = f" with missing={d['imputation']}" if d.get("imputation") and imputed != "0" else ""
    lines = [f"  csv format        {_format_text(d)}"] if "delimiter" in d else []
    if d.get("header_cells_named"):
        named = d["header_cells_named"]
        lines.append(f"  header            {len(named)} blank cell(s) named "
                     + ", ".join(f"{k} (column {v})" for k, v in list(named.items())[:8]))
    lines += [
        f"  rows read         {d.get('rows_read', 0):,}",
        f"  rows dropped      {_counts(d.get('rows_dropped', {}))}",
        f"  columns dropped   {len(cols)}" + (f" ({shown}{more})" if cols else ""),
        f"  cells imputed     {imputed}{how}",
    ]
    if "encodings" in d:
        lines.append(f"  encodings         {_encodings_text(d)}")
    if "standardised" in d:
        lines.append(f"  standardised      {_standardised_text(d['standardised'])}")
    lines.append(f"  values clipped    {_counts(d.get('values_clipped', {}))}")
    if "test_rows_read" in d:
        lines.append(f"  test file         {_test_text(d)}")
    return lines


def _plural(n: int, word: str) -> str:
    return f"{n:,} {word}{'s' if n != 1 else ''}"


def _format_text(d: Mapping[str, Any]) -> str:
    """"delimiter ';' (sniffed), decimal ',', 1 line skipped, missing also '?' (12 cells)"."""
    if d["delimiter"] == "sniffed":
        sep = f"delimiter {d['delimiter_sniffed']!r} (sniffed)" if "delimiter_sniffed" in d \
            else "delimiter sniffed"
    else:
        sep = f"delimiter {d['delimiter']!r}"
    parts = [sep, f"decimal {d.get('decimal', '.')!r}"]
    if d.get("lines_skipped"):
        parts.append(f"{_plural(d['lines_skipped'], 'line')} skipped")
    if d.get("na_values"):
        cells = sum(d.get("na_value_cells", {}).values())
        parts.append(f"missing also {', '.join(map(repr, d['na_values']))} "
                     f"({_plural(cells, 'cell')})")
    return ", ".join(parts)


def _encodings_text(d: Mapping[str, Any]) -> str:
    """"one-hot 5 columns (38 features), frequency 1 column" from the per-column encodings."""
    enc = d.get("encodings", {})
    if not enc:
        return "none (no categorical columns)"
    levels = d.get("category_levels", {})
    out = []
    for kind, label in (("onehot", "one-hot"), ("frequency", "frequency"), ("codes", "codes")):
        names = [k for k, v in enc.items() if v == kind]
        if names:
            text = f"{label} {_plural(len(names), 'column')}"
            if kind == "onehot":
                text += f" ({_plural(sum(levels.get(k, 0) for k in names), 'feature')})"
            out.append(text)
    return ", ".join(out)


def _standardised_text(s: Mapping[str, Any]) -> str:
    if not s.get("columns"):
        return f"none ({s.get('why', 'not asked')})"
    of = (f"the {_plural(s['records'], 'record')} of the public hold-out"
          if s["fitted_on"] == "hold-out" else f"all {_plural(s['records'], 'training record')}")
    text = f"{_plural(s['columns'], 'column')} with the mean and std of {of}"
    if s.get("onehot_left"):
        text += f"; {_plural(s['onehot_left'], 'one-hot column')} left 0/1"
    return text


def _test_text(d: Mapping[str, Any]) -> str:
    """"250 rows read, 247 kept; dropped 3 (missing target: 3); unseen categories 2 (...)"."""
    text = (f"{d['test_rows_read']:,} rows read, {d['test_records']:,} kept (global test set); "
            f"dropped {_counts(d.get('test_rows_dropped', {}))}")
    unseen = d.get("test_unseen_categories", {})
    if unseen:
        text += f"; unseen categories {_counts(unseen)}"
    imputed = d.get("test_cells_imputed", {})
    if imputed:
        text += f"; cells imputed {_counts(imputed)}"
    if d.get("test_rows_scaled"):
        text += f"; rows scaled {d['test_rows_scaled']:,} (--row-norm)"
    return text


def run_prepare(build, out: str | os.PathLike[str], *, recipe: str, options: Mapping[str, Any],
                source: str, quiet: bool = False) -> dict[str, Any]:
    """Build (a zero-argument callable returning Prepared), write, summarise; returns the summary."""
    t0 = time.perf_counter()
    prep = build()
    path = write_prepared(prep, out, recipe=recipe, options=options, source=source)
    s = summary(prep, Path(path), time.perf_counter() - t0)
    if not quiet:
        print(summary_text(s), flush=True)
        for note in prep.notes:
            print(f"  note: {note}")
    return s


def describe(path: str | os.PathLike[str]) -> dict[str, Any]:
    """How a prepared shard file was made (its provenance attributes, decoded)."""
    with ShardFile(path) as f:
        a = f.attrs
    out: dict[str, Any] = {}
    for k in ("recipe", "options", "source_files", "preprocessing", "partition", "notes", "decisions"):
        if k in a:
            out[k] = json.loads(a[k]) if isinstance(a[k], str) and k != "recipe" else a[k]
    return out


def as_pairs(X: Any, y: np.ndarray, parts: Sequence[np.ndarray]) -> list[Pair]:
    """(X[idx], y[idx]) per agent; CSR stays CSR."""
    return [(X[idx], np.asarray(y)[idx]) for idx in parts]
