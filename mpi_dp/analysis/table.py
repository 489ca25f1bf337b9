"""Per-configuration summary tables of a result file (text and CSV)."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

import numpy as np

from mpi_dp.analysis.fit import fit_slopes
from mpi_dp.analysis.load import Result
from mpi_dp.analysis.style import aligned, cell

COLUMNS = [
    "index",
    "label",
    "eps",
    "n",
    "records",
    "k",
    "runs",
    "median",
    "q25",
    "q75",
    "mean",
    "se",
    "psi_isolated",
]
_TEXT_HEADERS = {"index": "#", "records": "rec", "psi_isolated": "psi_iso(1)"}
_TEXT_ORDER = [c for c in COLUMNS if c != "label"] + ["label"]


def compact(values: np.ndarray) -> str:
    """'1' if all entries equal, else '[0.1, 1, 10]' (%g formatting, inf kept)."""
    v = np.atleast_1d(np.asarray(values))
    if v.size == 0:
        return ""
    if np.all(v == v[0]):
        return f"{v[0]:g}"
    return "[" + ", ".join(f"{x:g}" for x in v) + "]"


def summarize(result: Result, metric: str = "psi") -> list[dict[str, Any]]:
    """One row per configuration with statistics over runs of `metric` at the last record.

    se is the sample standard deviation (ddof=1) over sqrt(runs); NaN runs are ignored.
    psi_isolated is owner 0's isolated-optimum psi (None when not recorded).
    """
    rows: list[dict[str, Any]] = []
    for c in result.configs:
        values = c.final(metric)
        v = values[np.isfinite(values)]
        nan = float("nan")
        if v.size:
            q25, median, q75 = (float(q) for q in np.percentile(v, [25, 50, 75]))
            mean = float(np.mean(v))
            se = float(np.std(v, ddof=1) / np.sqrt(v.size)) if v.size > 1 else nan
        else:
            q25 = median = q75 = mean = se = nan
        rows.append(
            {
                "index": c.index,
                "label": c.label,
                "eps": compact(c.eps),
                "n": compact(c.n),
                "records": c.n_records(),
                "k": c.final_iteration(),
                "runs": int(values.size),
                "median": median,
                "q25": q25,
                "q75": q75,
                "mean": mean,
                "se": se,
                "psi_isolated": c.psi_isolated(0),
            }
        )
    return rows


def format_table(rows: list[dict[str, Any]]) -> str:
    """Fixed-width text table of `summarize` rows (numbers in %.3g, label last)."""
    cols = [c for c in _TEXT_ORDER if any(c in r for r in rows)] if rows else _TEXT_ORDER
    headers = [_TEXT_HEADERS.get(c, c) for c in cols]
    cells = [[cell(r.get(c)) for c in cols] for r in rows]
    left = {j for j, c in enumerate(cols) if c in ("label", "eps", "n")}
    return "\n".join(aligned(headers, cells, left))


def rows_to_csv(rows: list[dict[str, Any]], path: str | Path) -> Path:
    """Write `summarize` rows to CSV (full precision); returns the path."""
    path = Path(path)
    fields = list(COLUMNS) + sorted({k for r in rows for k in r} - set(COLUMNS))
    with path.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=fields)
        writer.writeheader()
        for r in rows:
            writer.writerow({k: ("" if r.get(k) is None else r.get(k)) for k in fields})
    return path


def _ci_text(ci: tuple[float, float] | None) -> str:
    if ci is None or not all(np.isfinite(ci)):
        return ""
    return f" [95% CI {ci[0]:.3f}, {ci[1]:.3f}]"


def format_fits(fits: list[dict[str, Any]], metric: str = "psi") -> list[str]:
    """Human-readable lines for the output of `fit_slopes`."""
    E = f"E[{metric}]"
    lines = []
    for f in fits:
        kind = f["kind"]
        if kind in ("eps", "n"):
            (fk, fv), = f["fixed"].items()
            floor = " - floor" if f.get("floor") else ""
            x = "eps" if kind == "eps" else "n per owner"
            lines.append(
                f"log-log slope of {E}{floor} vs {x} at {fk}={fv:g}: {f['slope']:.3f}"
                f"{_ci_text(f.get('ci'))} (R^2 {f['r2']:.4f}, {f['n_points']} points, "
                f"{f['dropped']} dropped)"
            )
        elif kind == "joint":
            lines.append(
                f"joint fit log({E} - floor) = a + b log n + c log eps: "
                f"b = {f['b']:.3f}{_ci_text(f['b_ci'])}, c = {f['c']:.3f}{_ci_text(f['c_ci'])} "
                f"(R^2 {f['r2']:.4f}, {f['n_points']} points, {f['dropped']} dropped)"
            )
        elif kind == "constant":
            lines.append(
                f"fixed-exponent constant K = {f['K']:.4g} in {E} ~ floor + K sum_i eps_i^-2 / "
                f"(sum_i n_i)^2 (log-space R^2 {f['r2']:.4f}, max |log10 residual| "
                f"{f['max_abs_log10_resid']:.3g}, {f['n_points']} points, {f['dropped']} dropped)"
            )
    return lines


def analyze_text(result: Result, metric: str = "psi") -> str:
    """What `mpi-dp analyze` prints: a header, the summary table and, for a sweep, the fits."""
    head = (
        f"{result.path}: {result.algorithm}"
        + (f" ({result.variant})" if result.variant else "")
        + f", job {result.job_name}, status {result.status}, "
        f"{len(result.configs)} configuration{'s' if len(result.configs) != 1 else ''}, "
        f"metric {metric} at the last recorded iteration"
    )
    parts = [head, "", format_table(summarize(result, metric))]
    if result.is_sweep:
        fits = fit_slopes(result, metric)
        lines = format_fits(fits, metric)
        ks = [c.final_iteration() for c in result.configs]
        kmax = max(ks)
        short = sum(1 for k in ks if k != kmax)
        if short:
            lines.insert(0, f"({short} configuration(s) not at k={kmax} left out of the fits)")
        if lines:
            parts += [""] + lines
    return "\n".join(parts)
