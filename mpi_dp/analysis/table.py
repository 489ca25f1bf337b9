"""Per-configuration summary tables of a result file (text and CSV).

Beside the metric (psi by default) a row carries the utility of the final model when the result
records it (evaluation-only): a classifier's test and training error next to the trivial
baselines (always predicting the majority training label; theta = 0), a squared-loss model's
training MSE next to predicting 0 or the training mean, and the flag "<= baseline" when the model
is no better than the best trivial baseline.
"""

from __future__ import annotations

import csv
import math
from pathlib import Path
from typing import Any

import numpy as np

from mpi_dp.analysis.fit import fit_slopes
from mpi_dp.analysis.load import ConfigView, Result
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
#: utility columns (classification, then squared loss), shown after the metric's columns
UTILITY_COLUMNS = ["test_error", "train_error", "error_star", "majority_error", "zero_error",
                   "train_mse", "mse_star", "mse_zero", "mse_mean", "flag"]
_TEXT_HEADERS = {"index": "#", "records": "rec", "psi_isolated": "psi_iso(1)",
                 "test_error": "test_err", "train_error": "train_err", "error_star": "err(theta*)",
                 "majority_error": "majority", "zero_error": "theta=0", "train_mse": "mse",
                 "mse_star": "mse(theta*)", "mse_zero": "mse(0)", "mse_mean": "mse(mean)"}
_TEXT_ORDER = [c for c in COLUMNS if c != "label"] + UTILITY_COLUMNS + ["label"]
#: the flag of a final model no better than a trivial predictor (dola_report's wording)
FLAG = "<= baseline"


def compact(values: np.ndarray) -> str:
    """'1' if all entries equal, else '[0.1, 1, 10]' (%g formatting, inf kept)."""
    v = np.atleast_1d(np.asarray(values))
    if v.size == 0:
        return ""
    if np.all(v == v[0]):
        return f"{v[0]:g}"
    return "[" + ", ".join(f"{x:g}" for x in v) + "]"


def _final_mean(c: ConfigView, name: str) -> float | None:
    """Mean over the finite runs of metric `name` at the last record (None: absent or none)."""
    if name not in c.metric_names() or c.n_records() == 0:
        return None
    v = c.final(name)
    v = v[np.isfinite(v)]
    return float(np.mean(v)) if v.size else None


def ref_scalar(c: ConfigView, name: str) -> float | None:
    """A finite scalar reference/<name>, else None."""
    v = c.reference().get(name)
    if v is None:
        return None
    v = float(np.asarray(v, dtype=float).ravel()[0])
    return v if math.isfinite(v) else None


def beats(value: float | None, baselines: list[float | None]) -> bool | None:
    """value < the best known baseline; None when either is unknown."""
    known = [b for b in baselines if b is not None]
    if value is None or not known:
        return None
    return bool(value < min(known))


def utility_row(c: ConfigView) -> dict[str, Any]:
    """The final model's utility beside its trivial baselines ({} when none is recorded).

    Classification (metric train_error): test_error and train_error are means over the finite
    runs at the last record; error_star (theta*), majority_error and zero_error (theta = 0) are
    the reference values on the set the headline error is measured on: the test set when the
    result has test errors, else the training records (`error_on` says which). Squared loss
    (metric train_mse): train_mse, mse_star, mse_zero (predicting 0), mse_mean (predicting the
    training mean). beats_baseline: headline < the best trivial baseline (None: unknown).
    """
    names = c.metric_names()
    if "train_error" in names:
        test = _final_mean(c, "test_error")
        on = "train" if test is None else "test"
        row: dict[str, Any] = {"test_error": test, "train_error": _final_mean(c, "train_error"),
                               "error_on": on, "error_star": ref_scalar(c, f"{on}_error_star"),
                               "majority_error": ref_scalar(c, f"{on}_error_majority"),
                               "zero_error": ref_scalar(c, f"{on}_error_zero")}
        row["beats_baseline"] = beats(row[f"{on}_error"],
                                      [row["majority_error"], row["zero_error"]])
    elif "train_mse" in names:
        row = {"train_mse": _final_mean(c, "train_mse"), "mse_star": ref_scalar(c, "train_mse_star"),
               "mse_zero": ref_scalar(c, "train_mse_zero"), "mse_mean": ref_scalar(c, "train_mse_mean")}
        row["beats_baseline"] = beats(row["train_mse"], [row["mse_zero"], row["mse_mean"]])
    else:
        return {}
    row["flag"] = FLAG if row["beats_baseline"] is False else ""
    return row


def summarize(result: Result, metric: str = "psi") -> list[dict[str, Any]]:
    """One row per configuration with statistics over runs of `metric` at the last record.

    se is the sample standard deviation (ddof=1) over sqrt(runs); NaN runs are ignored.
    psi_isolated is owner 0's isolated-optimum psi (None when not recorded). Rows of results
    that record the final model's utility also carry `utility_row`.
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
                **utility_row(c),
            }
        )
    return rows


def format_table(rows: list[dict[str, Any]]) -> str:
    """Fixed-width text table of `summarize` rows (numbers in %.3g, errors and MSEs in %.4g,
    label last)."""
    def shown(c: str) -> bool:  # a utility column only when some row has a value for it
        return any((r.get(c) is not None) if c in UTILITY_COLUMNS else (c in r) for r in rows)

    cols = [c for c in _TEXT_ORDER if shown(c)] if rows \
        else [c for c in _TEXT_ORDER if c not in UTILITY_COLUMNS]
    headers = [_TEXT_HEADERS.get(c, c) for c in cols]
    digits = {c: 4 for c in UTILITY_COLUMNS}
    cells = [[cell(r.get(c), digits.get(c, 3)) for c in cols] for r in rows]
    left = {j for j, c in enumerate(cols) if c in ("label", "eps", "n", "flag")}
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
    rows = summarize(result, metric)
    parts = [head, "", format_table(rows)]
    notes = utility_notes(result, rows)
    if notes:
        parts += [""] + notes
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


def utility_notes(result: Result, rows: list[dict[str, Any]]) -> list[str]:
    """Lines under the table: what the utility columns mean, and which rows are flagged."""
    if not any("beats_baseline" in r for r in rows):
        return []
    a = result.configs[0].attrs
    where = a.get("eval_set")
    lines = []
    if any("train_error" in r for r in rows):
        majs = {float(v) for c in result.configs
                if (v := c.reference().get("majority_label")) is not None}
        label = f" ({majs.pop():+g} here)" if len(majs) == 1 else ""
        on_train = any(r.get("error_on") == "train" for r in rows)
        lines += ["utility (evaluation-only: un-noised owner data), final model, mean over runs:",
                  "  NO TEST SET: err(theta*), majority, theta=0 and the flag are TRAINING errors"
                  if on_train else f"  test_err on the evaluation set: {where or 'unknown'}",
                  "  train_err on the participants' training records; err(theta*) = the "
                  "non-private optimum's error",
                  f"  majority = error of always predicting the most frequent training label"
                  f"{label}; theta=0 = error of theta = 0 (" + (
                      "predicts +1 everywhere: sign(0) = +1)" if "prediction" in a
                      else "the model at zero)")]
    if any("train_mse" in r for r in rows):
        lines += ["utility (evaluation-only: un-noised owner data), final model, mean over runs:",
                  "  mse = mean squared error on the training records; mse(theta*), mse(0) and "
                  "mse(mean) = that of theta*, of theta = 0 and of always predicting the "
                  "training mean"]
    flagged = [r for r in rows if r.get("beats_baseline") is False]
    if flagged:
        lines.append(f"{FLAG}: {len(flagged)} configuration(s) whose final model is no better "
                     "than a trivial predictor (" + ("always the majority class, or theta = 0"
                     if any("train_error" in r for r in flagged) else "predicting 0 or the "
                     "training mean") + "): configuration(s) "
                     + ", ".join(str(r["index"]) for r in flagged))
    return lines
