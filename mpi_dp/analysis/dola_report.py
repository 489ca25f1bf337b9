"""Text, CSV rows and figures of DP distributed online learning results (algorithm "dola", seed 003;
spec dp-distributed-online-learning §5, experiments E1-E8 and Table 3).

- `dola_rows` / `dola_text`: one row per configuration with the values at the last recorded round t
  (mean ± sd over runs): the average regret R_D(t)/t (summed over agents) and R_D/(m t), R_own(t)/t,
  the online error, the test error of the averaged model w_hat beside the majority-class baseline
  (flagged "<= baseline" when the model is no better than always predicting the majority class), the
  spread sum_i ||w_t^i - w_bar_t||, the sparsity, eps per release and per record. A result over
  several numbers of agents m also gets the "Table 3 analogue": test accuracy per (eps, m) next to
  the paper's numbers (E8).
- `plot_dola`: average regret vs t (Fig. 3 / 6b, log y), spread vs t (Fig. 6c, log y), test error
  of w_hat vs t with the majority baseline (Fig. 6a), test accuracy vs final sparsity (Fig. 5),
  accuracy vs m beside the paper's Table 3, and the communication graph (Fig. 1).

Missing data are skipped, never invented: no regret without a comparator (lam = 0), no test error
without a test set, no sparsity outside the sparse variant (and rho = 0). Files still being written
are read up to the records every metric holds (`ConfigView.n_records`).
"""

from __future__ import annotations

import json
import math
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast

import matplotlib

from ..errors import ResultError

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.collections import LineCollection  # noqa: E402
from matplotlib.colors import ListedColormap  # noqa: E402

from mpi_dp.analysis import table  # noqa: E402
from mpi_dp.analysis.load import ConfigView, Result, ResultFileError  # noqa: E402
from mpi_dp.analysis.style import DPI, aligned, cell, title  # noqa: E402

ALGORITHM = "dola"
DEFAULT_METRIC = "regret"
#: the spec's Table 3 (RCV1, 75 % train / 25 % test, test accuracy of w_hat): (nodes, eps) -> accuracy
PAPER_TABLE3: dict[tuple[int, float], float] = {
    (1, math.inf): 0.8251, (4, math.inf): 0.7464, (64, math.inf): 0.6572,
    (1, 1.0): 0.8251, (4, 1.0): 0.7464, (64, 1.0): 0.6572,
    (1, 0.1): 0.8017, (4, 0.1): 0.7086, (64, 0.1): 0.6234,
    (1, 0.01): 0.7569, (4, 0.01): 0.6481, (64, 0.01): 0.5036,
}
PAPER_NODES = (1, 4, 64)
TABLE3_CAVEAT = (
    "caveat (spec §5 E8): the paper's eps = 1 rows equal its non-private rows exactly, implausible "
    "with Alg. 1 as printed (Laplace scale 2 alpha sqrt(n)/eps far above ||w|| at n = 47,236; "
    "linear SVMs usually reach ~95%+ on rcv1.binary): compare TRENDS, not values (accuracy falls as "
    "eps falls and as m grows)")
MAX_GRAPH_PANELS = 4


def _listed_colors(name: str) -> tuple[Any, ...]:
    """The colors of a listed colormap (a tuple of RGB tuples)."""
    return cast("tuple[Any, ...]", cast(ListedColormap, plt.get_cmap(name)).colors)


COLORS = _listed_colors("tab10") + _listed_colors("Dark2")


# ---------------------------------------------------------------------------------------------
# reading helpers
# ---------------------------------------------------------------------------------------------


def _check(result: Result) -> None:
    if result.algorithm != ALGORITHM:
        raise ResultFileError(
            f"{result.path}: algorithm is {result.algorithm!r}, the dola analysis needs {ALGORITHM!r}"
        )


def _has(c: ConfigView, metric: str) -> bool:
    return metric in c.metric_names()


def final_stats(c: ConfigView, metric: str) -> tuple[float, float] | None:
    """(mean, sample sd) over the finite runs of `metric` at the last record.

    None when the configuration has no such metric; NaN mean before the first record or without a
    finite run; NaN sd with fewer than two finite runs.
    """
    if not _has(c, metric):
        return None
    nan = float("nan")
    if c.n_records() == 0:
        return nan, nan
    v = c.final(metric)
    v = v[np.isfinite(v)]
    if not v.size:
        return nan, nan
    return float(np.mean(v)), (float(np.std(v, ddof=1)) if v.size > 1 else nan)


def graph_info(c: ConfigView) -> dict[str, Any]:
    """The configuration's `graph` attribute (JSON: kind, m, n_edges, mean_degree, ...), or {}."""
    g = c.attrs.get("graph")
    if g is None:
        return {}
    try:
        d = json.loads(str(g))
    except json.JSONDecodeError:
        return {"kind": str(g)}
    return d if isinstance(d, dict) else {}


def _float(v: Any) -> float | None:
    if v is None:
        return None
    try:
        return float(np.asarray(v, dtype=float).ravel()[0])
    except (TypeError, ValueError, IndexError):
        return None


def _int(v: Any) -> int | None:
    f = _float(v)
    return None if f is None or not math.isfinite(f) else int(f)


def agents(c: ConfigView) -> int:
    """m: the configuration's number of agents (attribute m, else the graph's, else len(eps))."""
    m = _int(c.attrs.get("m"))
    if m is None:
        m = _int(graph_info(c).get("m"))
    return m if m is not None else int(c.eps.size)


def eps_release(c: ConfigView) -> float:
    """eps per release (attribute eps_per_release, else the largest per-agent eps; NaN unknown)."""
    e = _float(c.attrs.get("eps_per_release"))
    if e is not None:
        return e
    return float(np.max(c.eps)) if c.eps.size else float("nan")


def _eps_text(e: float | None) -> str:
    if e is None or math.isnan(e):
        return "-"
    return "inf" if math.isinf(e) else f"{e:g}"


# ---------------------------------------------------------------------------------------------
# rows
# ---------------------------------------------------------------------------------------------

#: (row key, metric): final mean (and `<key>_sd`) of these metrics go into every row
_ROW_METRICS = [
    ("regret", "regret"), ("regret_own", "regret_own"), ("loss", "loss"),
    ("online_error", "online_error"), ("test_error", "test_error"),
    ("test_error_bar", "test_error_bar"), ("spread", "spread"), ("spread_sq", "spread_sq"),
    ("noise_l1", "noise_l1"), ("sparsity", "sparsity"),
]


def dola_rows(result: Result) -> list[dict[str, Any]]:
    """One row per configuration, in file order (what `mpi-dp analyze --csv` writes).

    For every metric of `_ROW_METRICS`: `<name>` = mean and `<name>_sd` = sample sd over the finite
    runs at the last record (None when the configuration lacks the metric). Also regret_per_agent =
    regret / m (R_D(t)/(m t)), accuracy = 1 - test_error, majority_error (attribute
    test_error_majority, None when NaN / absent) and beats_majority (test_error < majority_error;
    None without either), t (last recorded round), eps (the target), eps per release / per record
    (NaN: uncertified).
    """
    _check(result)
    rows: list[dict[str, Any]] = []
    for c in result.configs:
        a = c.attrs
        g = graph_info(c)
        m = agents(c)
        maj = _float(a.get("test_error_majority"))
        if maj is not None and not math.isfinite(maj):
            maj = None
        row: dict[str, Any] = {
            "index": c.index,
            "label": c.label,
            "variant": str(a.get("variant", result.variant)),
            "m": m,
            "T": _int(a.get("T")),
            "h": _int(a.get("h")),
            "lam": _float(a.get("lam")),
            "rho": _float(a.get("rho")),
            "graph": g.get("kind"),
            "mean_degree": _float(g.get("mean_degree")),
            "n_edges": _int(g.get("n_edges")),
            "eps": table.compact(c.eps),
            "eps_target": float(np.max(c.eps)) if c.eps.size else float("nan"),
            "eps_per_release": eps_release(c),
            "eps_per_record": _float(a.get("eps_per_record")),
            "delta_per_record": _float(a.get("delta_per_record")),
            "certified": bool(a["certified"]) if "certified" in a else None,
            "runs": c.runs,
            "records": c.n_records(),
            "t": c.final_iteration(),
        }
        for key, metric in _ROW_METRICS:
            st = final_stats(c, metric)
            row[key] = None if st is None else st[0]
            row[f"{key}_sd"] = None if st is None else st[1]
        row["regret_per_agent"] = None if row["regret"] is None else row["regret"] / m
        te = row["test_error"]
        row["accuracy"] = None if te is None else 1.0 - te
        row["majority_error"] = maj
        row["beats_majority"] = (None if te is None or maj is None or math.isnan(te)
                                 else bool(te < maj))
        row["seconds"] = _float(a.get("seconds"))
        row["exchange_seconds"] = _float(a.get("exchange_seconds"))
        row["comparator"] = None if a.get("comparator") is None else str(a["comparator"])
        rows.append(row)
    return rows


# ---------------------------------------------------------------------------------------------
# text
# ---------------------------------------------------------------------------------------------


def _pm(mean: float | None, sd: float | None, digits: int = 4) -> str:
    """'mean ± sd' (mean to `digits` significant digits, sd to 2); '-' when absent."""
    if mean is None:
        return "-"
    if sd is None or not math.isfinite(sd):
        return cell(mean, digits)
    if math.isfinite(mean) and sd <= 1e-12 * max(1.0, abs(mean)):
        sd = 0.0  # identical runs up to rounding (eps = inf)
    return f"{cell(mean, digits)} ± {cell(sd, 2)}"


def _distinct(values: list[Any]) -> list[Any]:
    out: list[Any] = []
    for v in values:
        if v not in out:
            out.append(v)
    return out


def _header(result: Result, rows: list[dict[str, Any]]) -> list[str]:
    variants = _distinct([r["variant"] for r in rows])
    head = (f"{result.path}: {result.algorithm} ({', '.join(variants)}), job {result.job_name}, "
            f"status {result.status}, {len(rows)} configuration{'s' if len(rows) != 1 else ''}")
    ms = _distinct([r["m"] for r in rows])
    bits = [f"m = {', '.join(str(m) for m in ms)} agents"]
    graphs = _distinct([(r["m"], r["graph"], r["mean_degree"]) for r in rows])
    gtext = [f"{'' if len(ms) == 1 else f'm={m}: '}{kind or '?'}"
             + ("" if deg is None else f" (mean degree {deg:.3g})") for m, kind, deg in graphs]
    bits.append("graph " + ", ".join(gtext))
    for key, what in (("T", "T"), ("h", "h")):
        vals = _distinct([r[key] for r in rows if r[key] is not None])
        if vals:
            bits.append(f"{what} = {', '.join(str(v) for v in vals)}")
    ex = [r["exchange_seconds"] for r in rows if r["exchange_seconds"] is not None]
    sec = [r["seconds"] for r in rows if r["exchange_seconds"] is not None and r["seconds"]]
    if ex and sec and len(sec) == len(ex) and sum(sec) > 0:
        bits.append(f"exchange {100 * sum(ex) / sum(sec):.1f}% of the run time "
                    f"({sum(ex):.3g} of {sum(sec):.3g} s)")
    return [head, "; ".join(bits)]


def _table3_groups(rows: list[dict[str, Any]]
                   ) -> dict[str, dict[tuple[int, float], list[dict[str, Any]]]]:
    """variant -> (m, eps) -> rows with a test error (eps: the job's, each agent's per-record
    target; under the paper's rule the eps of one release)."""
    out: dict[str, dict[tuple[int, float], list[dict[str, Any]]]] = {}
    for r in rows:
        if r["test_error"] is None or math.isnan(r["eps_target"]):
            continue
        out.setdefault(r["variant"], {}).setdefault((r["m"], r["eps_target"]), []).append(r)
    return out


def _eps_order(eps: list[float]) -> list[float]:
    """Non-private first, then decreasing eps (the paper's Table 3 order)."""
    return sorted(set(eps), key=lambda e: -e)


def table3_grid(result: Result) -> dict[str, dict[str, Any]]:
    """Per variant: the Table 3 analogue, test accuracy of w_hat by (eps per release, m).

    Only when the configurations differ in m. Returns {variant: dict(ms, eps, ours, several, paper)}:
    ours[(m, eps)] = 1 - mean test error over runs at the last record (the best configuration where
    several share (m, eps): several[(m, eps)] = their number), paper[(m, eps)] = PAPER_TABLE3 or None.
    """
    rows = dola_rows(result)
    if len({r["m"] for r in rows}) < 2:
        return {}
    out: dict[str, dict[str, Any]] = {}
    for variant, cells in _table3_groups(rows).items():
        ms = sorted({m for m, _ in cells})
        eps = _eps_order([e for _, e in cells])
        ours: dict[tuple[int, float], float] = {}
        several: dict[tuple[int, float], int] = {}
        for key, rs in cells.items():
            accs = [r["accuracy"] for r in rs if r["accuracy"] is not None
                    and math.isfinite(r["accuracy"])]
            ours[key] = max(accs) if accs else float("nan")
            if len(rs) > 1:
                several[key] = len(rs)
        paper = {(m, e): PAPER_TABLE3.get((m, e)) for m in ms for e in eps}
        out[variant] = {"ms": ms, "eps": eps, "ours": ours, "several": several, "paper": paper}
    return out


def _acc(v: float | None) -> str:
    return "-" if v is None or not math.isfinite(v) else f"{100 * v:.2f}%"


def _trend_counts(grid: dict[str, Any]) -> tuple[int, int, int, int]:
    """(columns where accuracy does not rise as eps falls, columns with >= 2 values, rows where it
    does not rise as m grows, rows with >= 2 values)."""
    ours = grid["ours"]

    def monotone(seq: list[float]) -> bool:
        return all(b <= a for a, b in zip(seq, seq[1:], strict=False))

    col_ok = col_n = row_ok = row_n = 0
    for m in grid["ms"]:
        seq = [ours[(m, e)] for e in grid["eps"] if (m, e) in ours and math.isfinite(ours[(m, e)])]
        if len(seq) >= 2:
            col_n += 1
            col_ok += monotone(seq)
    for e in grid["eps"]:
        seq = [ours[(m, e)] for m in grid["ms"] if (m, e) in ours and math.isfinite(ours[(m, e)])]
        if len(seq) >= 2:
            row_n += 1
            row_ok += monotone(seq)
    return col_ok, col_n, row_ok, row_n


def table3_text(result: Result) -> list[str]:
    """The Table 3 analogue lines (empty when the configurations share one m or lack test errors)."""
    grids = table3_grid(result)
    parts: list[str] = []
    for variant, grid in grids.items():
        headers = ["eps"]
        for m in grid["ms"]:
            headers += [f"m={m}", "paper"]
        cells = []
        for e in grid["eps"]:
            line = ["non-private" if math.isinf(e) else f"{e:g}"]
            for m in grid["ms"]:
                key = (m, e)
                ours = _acc(grid["ours"].get(key)) + ("*" if key in grid["several"] else "")
                line += [ours, _acc(grid["paper"].get(key))]
            cells.append(line)
        parts += ["", f"Table 3 analogue ({variant}): test accuracy of w_hat (1 - test error, mean "
                  "over runs, last round) by eps per release and number of agents m, beside the "
                  "paper's (RCV1, nodes " + ", ".join(str(n) for n in PAPER_NODES) + ")"]
        parts += aligned(headers, cells, left={0})
        if grid["several"]:
            parts.append("  * best of several configurations with this (m, eps)")
        matched = sorted({m for m in grid["ms"] if m in PAPER_NODES})
        parts.append("  paper: spec Table 3; '-' where (m, eps) is not one of its cells"
                     + ("" if matched else " (no m of this result is a paper node count)"))
        co, cn, ro, rn = _trend_counts(grid)
        parts.append(f"  ours: accuracy does not rise as eps falls in {co}/{cn} m columns, and "
                     f"does not rise as m grows in {ro}/{rn} eps rows (the paper: all)")
        parts.append("  " + TABLE3_CAVEAT)
    return parts


def _metric_available(result: Result, metric: str) -> None:
    if not any(_has(c, metric) for c in result.configs):
        names = sorted({n for c in result.configs for n in c.metric_names()} - {"iteration"})
        raise ResultError(f"{result.path}: no configuration has metric {metric!r}; available: "
                       f"{', '.join(names) or 'none'}")


def dola_text(result: Result, metric: str = DEFAULT_METRIC) -> str:
    """What `mpi-dp analyze` prints for a dola file (the CLI appends the privacy ledger itself).

    Header (m, graph, T, h, exchange share), one row per configuration at its last recorded round,
    notes on missing data, and for results over several m the Table 3 analogue. `metric` other than
    "regret": its final mean ± sd replaces the regret columns.
    """
    rows = dola_rows(result)
    metric = metric or DEFAULT_METRIC
    custom = metric != DEFAULT_METRIC
    if custom:
        _metric_available(result, metric)
    parts = _header(result, rows)
    any_regret = any(r["regret"] is not None for r in rows)
    any_own = any(r["regret_own"] is not None for r in rows)
    any_test = any(r["test_error"] is not None for r in rows)
    any_sparse = any(r["sparsity"] is not None for r in rows)
    legend = ["values at each configuration's last recorded round t, mean ± sd over runs"]
    if any_regret and not custom:
        legend.append("R_D/t = average regret summed over agents, R_D/(mt) per agent")
    if any_test:
        legend.append("test error of w_hat = (1/t) sum_k w_bar_k beside the majority-class error")
    if any_sparse:
        legend.append("sparsity = share of zero coordinates")
    parts.append("; ".join(legend))
    cols: list[tuple[str, Any]] = [
        ("#", lambda r, c: str(r["index"])),
        ("m", lambda r, c: str(r["m"])),
        ("eps", lambda r, c: _eps_text(r["eps_target"])),
        ("eps/rel", lambda r, c: _eps_text(r["eps_per_release"])),
        ("eps/rec", lambda r, c: "uncertified" if r["eps_per_record"] is not None
         and math.isnan(r["eps_per_record"]) else _eps_text(r["eps_per_record"])),
        ("t", lambda r, c: str(r["t"])),
    ]
    if custom:
        def _custom(r: dict[str, Any], c: ConfigView) -> str:
            st = final_stats(c, metric)
            return "-" if st is None else _pm(*st)
        cols.append((f"{metric} (final)", _custom))
    else:
        if any_regret:
            cols += [("R_D/t", lambda r, c: _pm(r["regret"], r["regret_sd"])),
                     ("R_D/(mt)", lambda r, c: _pm(r["regret_per_agent"], None))]
        if any_own:
            cols.append(("R_own/t", lambda r, c: _pm(r["regret_own"], None)))
    shown = {metric} if custom else set()
    if "online_error" not in shown:
        cols.append(("online err", lambda r, c: _pm(r["online_error"], None)))
    if any_test:
        cols += [("test err w_hat", lambda r, c: _pm(r["test_error"], r["test_error_sd"])),
                 ("majority", lambda r, c: cell(r["majority_error"], 4)),
                 ("flag", lambda r, c: "<= baseline" if r["beats_majority"] is False else "")]
    if "spread" not in shown:
        cols.append(("spread", lambda r, c: _pm(r["spread"], None)))
    if any_sparse and "sparsity" not in shown:
        cols.append(("sparsity", lambda r, c: _pm(r["sparsity"], None)))
    cols.append(("label", lambda r, c: r["label"]))
    headers = [h for h, _ in cols]
    cells = [[f(r, c) for _, f in cols] for r, c in zip(rows, result.configs, strict=True)]
    left = {len(cols) - 1} | {j for j, (h, _) in enumerate(cols) if h == "flag"}
    parts += [""] + aligned(headers, cells, left=left)
    notes = []
    flagged = [r for r in rows if r["beats_majority"] is False]
    if flagged:
        notes.append(f"<= baseline: {len(flagged)} configuration(s) whose w_hat is no better than "
                     "always predicting the majority class (its test error is the majority column)")
    if not custom:
        no_regret = [r for r in rows if r["regret"] is None]
        if no_regret:
            why = _distinct([r["comparator"] for r in no_regret if r["comparator"]])
            notes.append(f"regret not recorded in {len(no_regret)} configuration(s)"
                         + (f" (comparator: {'; '.join(why)})" if why else ""))
    if not any_test:
        notes.append("test error not recorded: the shard file has no test set")
    elif any(r["test_error"] is not None and r["majority_error"] is None for r in rows):
        notes.append("majority-class baseline unknown for some configurations")
    uncert = [r for r in rows if r["eps_per_record"] is not None and math.isnan(r["eps_per_record"])]
    if uncert:
        notes.append(f"uncertified: {len(uncert)} configuration(s) ran a mode without a per-record "
                     "guarantee (attrs certified / invariant_P); their eps per release is no DP "
                     "claim")
    if notes:
        parts += [""] + notes
    parts += table3_text(result)
    return "\n".join(parts)


# ---------------------------------------------------------------------------------------------
# figures
# ---------------------------------------------------------------------------------------------


def _save(fig: plt.Figure, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return path


def _variant(result: Result, c: ConfigView) -> str:
    return str(c.attrs.get("variant", result.variant))


def _series(c: ConfigView, metric: str, log: bool
            ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None:
    """(t, mean, min, max) over runs of `metric`; non-positive values dropped on a log axis; None
    without a finite (positive, on a log axis) value."""
    if not _has(c, metric) or c.n_records() == 0:
        return None
    v = c.metric(metric)
    if log:
        v = np.where(v > 0, v, np.nan)
    if not np.isfinite(v).any():
        return None
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN records
        return c.iterations(), np.nanmean(v, axis=1), np.nanmin(v, axis=1), np.nanmax(v, axis=1)


def plot_over_rounds(result: Result, path: Path, metric: str, ylabel: str, what: str,
                     log: bool = False, majority: bool = False) -> Path | None:
    """Mean over runs of `metric` vs round t with a min-max band, one line per configuration and
    one panel per variant (Alg. 1 / 2 / 3 / 4 side by side, as the paper's Fig. 3a/b).

    majority: draw each panel's majority-class test error (attribute) as a dashed line. Returns None
    (no file) when no configuration holds finite values of `metric`.
    """
    panels: dict[str, list[tuple[ConfigView, tuple]]] = {}
    for c in result.configs:
        s = _series(c, metric, log)
        if s is not None:
            panels.setdefault(_variant(result, c), []).append((c, s))
    if not panels:
        return None
    n = len(panels)
    ncol = min(n, 2)
    nrow = math.ceil(n / ncol)
    fig, axes = plt.subplots(nrow, ncol, figsize=(6.4 * ncol, 4.6 * nrow), squeeze=False,
                             sharey=log)
    for ax, (variant, items) in zip(axes.flat, panels.items(), strict=False):
        for i, (c, (t, mean, lo, hi)) in enumerate(items):
            color = COLORS[i % len(COLORS)]
            ax.fill_between(t, lo, hi, color=color, alpha=0.18, linewidth=0)
            ax.plot(t, mean, color=color, lw=1.5, label=c.label)
        if majority:
            levels = _distinct([_float(c.attrs.get("test_error_majority")) for c, _ in items])
            levels = [v for v in levels if v is not None and math.isfinite(v)]
            for j, v in enumerate(levels):
                ax.axhline(v, color="black", ls="--", lw=1.0,
                           label="majority class" if j == 0 else None)
        if log:
            ax.set_yscale("log")
        ax.set_title(f"variant {variant}", fontsize=9)
        ax.set_xlabel("round t")
        ax.set_ylabel(ylabel)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7, loc="best")
    for ax in list(axes.flat)[n:]:
        ax.set_visible(False)
    fig.suptitle(title(result, f"{what}: mean over runs, min-max band"), fontsize=10)
    top = 1.0 - 0.75 / (4.6 * nrow)
    fig.subplots_adjust(left=0.08, right=0.98, bottom=0.1 / nrow, top=top, wspace=0.25,
                        hspace=0.35)
    return _save(fig, path)


def plot_sparsity(result: Result, path: Path) -> Path | None:
    """Test accuracy of w_hat vs final sparsity (share of zero coordinates), one point per
    configuration (mean over runs, sd bars), connected within (variant, graph, m, eps) groups as
    the paper's Fig. 5 connects a rho sweep per topology; None without sparsity and test error."""
    rows = [r for r in dola_rows(result) if r["sparsity"] is not None and r["accuracy"] is not None
            and math.isfinite(r["sparsity"]) and math.isfinite(r["accuracy"])]
    if not rows:
        return None
    groups: dict[tuple, list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault((r["variant"], r["graph"], r["m"], r["eps_target"]), []).append(r)
    fig, ax = plt.subplots(figsize=(7.5, 5.5))
    for i, ((variant, kind, m, e), rs) in enumerate(groups.items()):
        rs = sorted(rs, key=lambda r: r["sparsity"])
        x = np.array([100 * r["sparsity"] for r in rs])
        y = np.array([100 * r["accuracy"] for r in rs])
        sd = np.array([0.0 if r["test_error_sd"] is None or not math.isfinite(r["test_error_sd"])
                       else 100 * r["test_error_sd"] for r in rs])
        color = COLORS[i % len(COLORS)]
        ax.errorbar(x, y, yerr=sd, color=color, marker="o", ms=5, lw=1.3, capsize=3,
                    label=f"{variant}, graph {kind}, m={m}, eps={_eps_text(e)}")
        if len({r["rho"] for r in rs}) > 1:
            for r, xi, yi in zip(rs, x, y, strict=True):
                ax.annotate(f"rho={cell(r['rho'])}", (xi, yi), fontsize=6,
                            textcoords="offset points", xytext=(3, 3))
    ax.set_xlabel("final sparsity (% zero coordinates, mean over agents and runs)")
    ax.set_ylabel("test accuracy of w_hat (%)")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7)
    ax.set_title(title(result, "test accuracy vs final sparsity (Fig. 5)"), fontsize=10)
    fig.subplots_adjust(left=0.11, right=0.97, bottom=0.1, top=0.88)
    return _save(fig, path)


def plot_table3(result: Result, path: Path) -> Path | None:
    """Test accuracy vs m per eps (ours solid, the paper's Table 3 dashed, hollow markers), one
    panel per variant; None unless the configurations differ in m and record test errors."""
    grids = table3_grid(result)
    if not grids:
        return None
    n = len(grids)
    fig, axes = plt.subplots(1, n, figsize=(6.4 * n, 5.0), squeeze=False)
    for ax, (variant, grid) in zip(axes.flat, grids.items(), strict=True):
        for i, e in enumerate(grid["eps"]):
            color = COLORS[i % len(COLORS)]
            name = "non-private" if math.isinf(e) else f"eps={e:g}"
            pts = [(m, grid["ours"][(m, e)]) for m in grid["ms"]
                   if (m, e) in grid["ours"] and math.isfinite(grid["ours"][(m, e)])]
            if pts:
                ax.plot([p[0] for p in pts], [100 * p[1] for p in pts], color=color, marker="o",
                        lw=1.5, label=f"ours, {name}")
            paper = [(m, PAPER_TABLE3[(m, e)]) for m in PAPER_NODES if (m, e) in PAPER_TABLE3]
            if paper:
                ax.plot([p[0] for p in paper], [100 * p[1] for p in paper], color=color,
                        marker="s", mfc="white", ls="--", lw=1.0, label=f"paper, {name}")
        ax.set_xscale("log", base=2)
        ticks = sorted(set(grid["ms"]) | set(PAPER_NODES))
        ax.set_xticks(ticks, [str(m) for m in ticks])
        ax.minorticks_off()
        ax.set_xlabel("number of agents m")
        ax.set_ylabel("test accuracy of w_hat (%)")
        ax.set_title(f"variant {variant}", fontsize=9)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(title(result, "Table 3 analogue: accuracy vs m (paper: RCV1; compare trends)"),
                 fontsize=10)
    fig.subplots_adjust(left=0.08, right=0.98, bottom=0.11, top=0.85, wspace=0.25)
    return _save(fig, path)


def plot_graph(result: Result, path: Path) -> Path | None:
    """The communication graph(s) from graph/positions and graph/edges (one panel per distinct
    graph, at most MAX_GRAPH_PANELS); None when no configuration records positions."""
    graphs: dict[str, tuple[np.ndarray, np.ndarray, dict[str, Any]]] = {}
    for c in result.configs:
        pos = c.group.get("graph/positions")
        if pos is None or len(graphs) >= MAX_GRAPH_PANELS:
            continue
        info = graph_info(c)
        key = json.dumps(info, sort_keys=True) if info else f"config {c.index}"
        if key in graphs:
            continue
        e = c.group.get("graph/edges")
        edges = np.zeros((0, 2), dtype=np.int64) if e is None else np.asarray(e[()], dtype=np.int64)
        graphs[key] = (np.asarray(pos[()], dtype=float), edges, info)
    if not graphs:
        return None
    n = len(graphs)
    fig, axes = plt.subplots(1, n, figsize=(5.0 * n, 5.4), squeeze=False)
    for ax, (pos, edges, info) in zip(axes.flat, graphs.values(), strict=True):
        if edges.size:
            # cast: an (E, 2, 2) array is a sequence of segments (the stubs want a Sequence)
            segments = cast(Sequence[Any], pos[edges])
            ax.add_collection(LineCollection(segments, colors="0.6", linewidths=0.8, zorder=1))
        ax.scatter(pos[:, 0], pos[:, 1], s=30 if len(pos) <= 64 else 10, color="tab:blue",
                   zorder=2)
        if len(pos) <= 32:
            for i, (x, y) in enumerate(pos):
                ax.annotate(str(i), (x, y), fontsize=6, textcoords="offset points", xytext=(3, 3))
        deg = _float(info.get("mean_degree"))
        ax.set_title(f"{info.get('kind', '?')}: m = {len(pos)}, {len(edges)} edges"
                     + ("" if deg is None else f", mean degree {deg:.3g}"), fontsize=9)
        ax.set_aspect("equal")
        ax.set_xlim(-0.05, 1.05)
        ax.set_ylim(-0.05, 1.05)
        ax.set_xticks([])
        ax.set_yticks([])
    fig.suptitle(title(result, "communication graph (random geometric, unit square)"), fontsize=10)
    fig.subplots_adjust(left=0.03, right=0.97, bottom=0.03, top=0.82, wspace=0.1)
    return _save(fig, path)


def plot_dola(result: Result, prefix: str | Path) -> list[Path]:
    """Write the dola figures the result supports; returns the written PNG paths.

    `<prefix>_regret.png` (average regret R_D(t)/t, log y; Fig. 3), `<prefix>_spread.png` (spread,
    log y; Fig. 6c), `<prefix>_what.png` (test error of w_hat with the majority baseline; Fig. 6a),
    `<prefix>_sparsity.png` (accuracy vs final sparsity; Fig. 5), `<prefix>_table3.png` (accuracy vs
    m beside the paper; Table 3) and `<prefix>_graph.png` (the graph from graph/positions). A figure
    whose data are missing is skipped.
    """
    _check(result)
    p = Path(prefix)
    written = [
        plot_over_rounds(result, Path(f"{p}_regret.png"), "regret", "R_D(t)/t (sum over agents)",
                         "average regret R_D(t)/t vs round", log=True),
        plot_over_rounds(result, Path(f"{p}_spread.png"), "spread",
                         "spread  sum_i ||w_t^i - w_bar_t||", "spread vs round", log=True),
        plot_over_rounds(result, Path(f"{p}_what.png"), "test_error", "test error of w_hat",
                         "test error of w_hat = (1/t) sum_k w_bar_k vs round", majority=True),
        plot_sparsity(result, Path(f"{p}_sparsity.png")),
        plot_table3(result, Path(f"{p}_table3.png")),
        plot_graph(result, Path(f"{p}_graph.png")),
    ]
    return [w for w in written if w is not None]
