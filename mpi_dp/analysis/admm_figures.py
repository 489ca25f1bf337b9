"""Table and figures of DP inexact ADMM result files (algorithm "admm"; spec dp-inexact-admm §5, §7).

- `admm_table` / `admm_table_text`: one row per configuration (final test error: mean and 5/95 %
  percentiles over runs, final consensus and noise; training error beside the trivial baselines,
  always the majority training label and W = 0, flagged "<= baseline" when the model is no
  better), the relative reduction of ObjT's and ObjP's error
  against OutP's at each eps_bar (the paper's "at most 22%" headline) and each method's gap to the
  non-private error (its eps_bar = inf configuration, and G/reference/test_error_nonprivate).
- `plot_admm`: test error vs t (Fig. 1 bottom / Fig. 3), noise magnitude vs t (Fig. 1 top), final
  error vs eps_bar (Fig. 2) and consensus violation vs t (Fig. 5 top).

Files still being written are read up to the records every metric holds (`ConfigView.n_records`);
comparisons between configurations use the last iteration all of them reached, so a configuration
that is ahead is not compared with one that is behind.
"""

from __future__ import annotations

import math
import warnings
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from mpi_dp.analysis.guarantee import shown_totals  # noqa: E402
from mpi_dp.analysis.load import ConfigView, Result, ResultFileError  # noqa: E402
from mpi_dp.analysis.style import DPI, aligned, cell, on_eps_axis, title  # noqa: E402
from mpi_dp.analysis.table import FLAG, beats, ref_scalar  # noqa: E402

ALGORITHM = "admm"
METHOD_NAMES = {"objt": "ObjT", "objp": "ObjP", "outp": "OutP"}
METHOD_ORDER = list(METHOD_NAMES)  # display order: ObjT, ObjP, OutP
METHOD_COLORS = {"objt": "tab:blue", "objp": "tab:green", "outp": "tab:red"}
OTHER_COLORS = ["tab:purple", "tab:orange", "tab:brown", "tab:pink", "tab:olive", "tab:cyan"]
LINESTYLES = ["-", "--", "-.", ":"]
BASELINE = "outp"
PERCENTILES = (5.0, 95.0)
PAPER_MAX_REDUCTION = 0.22  # "ObjT/ObjP reduce the test error by at most 22% against OutP"
ERROR = "test_error"
REF_NONPRIVATE = "test_error_nonprivate"


# ---------------------------------------------------------------------------------------------
# reading helpers
# ---------------------------------------------------------------------------------------------


def _check(result: Result) -> None:
    if result.algorithm != ALGORITHM:
        raise ResultFileError(
            f"{result.path}: algorithm is {result.algorithm!r}, the ADMM analysis needs {ALGORITHM!r}"
        )


def method_key(c: ConfigView) -> str:
    """The configuration's method attribute in lower case ("objt", "objp", "outp", ...)."""
    m = c.attrs.get("method")
    return str(m).lower() if m is not None else c.label


def method_name(key: str) -> str:
    """Display name: ObjT / ObjP / OutP, other methods as recorded."""
    return METHOD_NAMES.get(key, key)


def _method_rank(key: str) -> tuple[int, str]:
    return (METHOD_ORDER.index(key), "") if key in METHOD_ORDER else (len(METHOD_ORDER), key)


def calibrated(c: ConfigView) -> bool:
    """Whether the configuration's eps is each agent's total (a calibrated rule), not the paper's
    per-iteration eps_bar."""
    return str(c.attrs.get("calibration", "paper")) in ("pld", "basic")


def eps_bar(c: ConfigView) -> float:
    """The eps a configuration is compared at: the job's eps, i.e. each agent's total under a
    calibrated rule (its per-iteration eps_bar is an attribute), the per-iteration eps_bar under
    the paper's (attribute, else the common per-agent eps); NaN when unknown."""
    if calibrated(c) and c.eps.size and np.all(c.eps == c.eps[0]):
        return float(c.eps[0])
    if "eps_bar" in c.attrs:
        return float(c.attrs["eps_bar"])
    if c.eps.size and np.all(c.eps == c.eps[0]):
        return float(c.eps[0])
    return float("nan")


def _eps_text(e: float) -> str:
    return "inf" if math.isinf(e) else f"{e:g}"


def _has(c: ConfigView, metric: str) -> bool:
    return c.n_records() > 0 and metric in c.metric_names()


def _finite_stats(values: np.ndarray) -> tuple[float, float, float]:
    """(mean, 5th, 95th percentile) over the finite runs (linear interpolation); NaN if none."""
    v = values[np.isfinite(values)]
    if not v.size:
        return (float("nan"),) * 3
    p5, p95 = (float(q) for q in np.percentile(v, PERCENTILES))
    return float(np.mean(v)), p5, p95


def _final_mean(c: ConfigView, metric: str) -> float | None:
    """Mean over finite runs of `metric` at the last record; None when the metric is absent."""
    if metric not in c.metric_names():
        return None
    if c.n_records() == 0:
        return float("nan")
    return _finite_stats(c.final(metric))[0]


def _mean_at(c: ConfigView, t: int, metric: str = ERROR) -> float:
    """Mean over runs of `metric` at the last record with iteration <= t (NaN if none)."""
    it = c.iterations()
    idx = np.flatnonzero(it <= t)
    if not idx.size:
        return float("nan")
    return _finite_stats(c.metric(metric)[idx[-1]])[0]


def utility(c: ConfigView, test_mean: float) -> dict[str, Any]:
    """Training error (mean over runs at the last record) and the trivial baselines (evaluation-
    only reference values) on the set the headline error is measured on: the test set when the
    test error is finite, else the training records. beats_baseline: that error < the better of
    always predicting the majority training label and W = 0 (None: unknown)."""
    train = _final_mean(c, "train_error")
    if train is not None and not math.isfinite(train):
        train = None
    on = "test" if math.isfinite(test_mean) else "train"
    maj, zero = ref_scalar(c, f"{on}_error_majority"), ref_scalar(c, f"{on}_error_zero")
    ok = beats(test_mean if on == "test" else train, [maj, zero])
    return {"train_error": train, "error_on": on, "majority_error": maj, "zero_error": zero,
            "beats_baseline": ok, "flag": FLAG if ok is False else ""}


def nonprivate_reference(c: ConfigView) -> float | None:
    """G/reference/test_error_nonprivate of the configuration, if recorded."""
    v = c.reference().get(REF_NONPRIVATE)
    return None if v is None else float(np.asarray(v, dtype=float).ravel()[0])


# ---------------------------------------------------------------------------------------------
# table
# ---------------------------------------------------------------------------------------------


def admm_table(result: Result) -> list[dict[str, Any]]:
    """One row per configuration, in file order.

    mean / p5 / p95: mean and 5th / 95th percentiles (numpy linear interpolation) over the finite runs
    of the test error at the last record; consensus, noise_mag: their means over runs at the last
    record (None when the metric is absent, NaN when nothing is recorded yet); t: last iteration
    (-1 before the first record); eps_total_basic: each agent's total (the largest): the ledger's
    PLD total under a calibrated rule, the recorded basic total under the paper's (None if absent).
    """
    _check(result)
    rows: list[dict[str, Any]] = []
    for c in result.configs:
        nan = float("nan")
        mean = p5 = p95 = nan
        if _has(c, ERROR):
            mean, p5, p95 = _finite_stats(c.final(ERROR))
        total = _pld_total(c) if calibrated(c) else c.attrs.get("eps_total_basic")
        rows.append(
            {
                "index": c.index,
                "label": c.label,
                "method": method_name(method_key(c)),
                "method_key": method_key(c),
                "eps_bar": eps_bar(c),
                "runs": c.runs,
                "records": c.n_records(),
                "t": c.final_iteration(),
                "mean": mean,
                "p5": p5,
                "p95": p95,
                "consensus": _final_mean(c, "consensus"),
                "noise_mag": _final_mean(c, "noise_mag"),
                "eps_total_basic": None if total is None else float(total),
                "nonprivate_ref": nonprivate_reference(c),
                **utility(c, mean),
            }
        )
    return rows


def _pld_total(c: ConfigView) -> float | None:
    """The largest tight (PLD) total over agents from the ledger, inf where an agent trained
    without noise (mpi_dp.analysis.guarantee; None without a ledger)."""
    try:
        led = c.ledger()
    except (OSError, KeyError, TypeError, ValueError):
        return None
    if led is None or not len(led) or "eps_pld" not in (led.dtype.names or ()):
        return None
    return float(np.max(shown_totals(led)["eps_pld"]))


def _groups(result: Result) -> dict[float, dict[str, list[ConfigView]]]:
    """eps_bar -> method key -> configurations holding test-error records."""
    out: dict[float, dict[str, list[ConfigView]]] = {}
    for c in result.configs:
        e = eps_bar(c)
        if _has(c, ERROR) and not math.isnan(e):
            out.setdefault(e, {}).setdefault(method_key(c), []).append(c)
    return out


def _best(cfgs: list[ConfigView], t: int) -> tuple[ConfigView, float]:
    """The configuration with the lowest mean error at iteration t (several: a rho / a sweep)."""
    means = [_mean_at(c, t) for c in cfgs]
    i = int(np.nanargmin(means)) if np.isfinite(means).any() else 0
    return cfgs[i], means[i]


def admm_comparison(result: Result) -> dict[str, Any]:
    """Relative reductions against OutP per eps_bar, the headline maximum, and non-private gaps.

    reductions: per eps_bar with an OutP configuration and per other method, dict(eps_bar, method,
      t, error, baseline_error, reduction = (E_OutP - E_method) / E_OutP, choices); errors are means
      over runs at t, the last iteration every compared configuration reached. When several
      configurations share a (method, eps_bar) (a sweep of rho or a), the lowest error is used
      (choices = how many there were).
    headline: the largest reduction of ObjT or ObjP over finite eps_bar (dict, or None).
    gaps: per configuration with finite eps_bar, dict(eps_bar, method, label, t, error, inf_error,
      gap_inf = error - the same method's eps_bar = inf error (None without one), ref_error,
      gap_ref = error - reference/test_error_nonprivate at its final t (None without one)).
    """
    _check(result)
    groups = _groups(result)
    reductions: list[dict[str, Any]] = []
    for e in sorted(groups):
        by_m = groups[e]
        if BASELINE not in by_m:
            continue
        for m in sorted((k for k in by_m if k != BASELINE), key=_method_rank):
            cfgs = by_m[m] + by_m[BASELINE]
            t = min(c.final_iteration() for c in cfgs)
            _, err = _best(by_m[m], t)
            _, base = _best(by_m[BASELINE], t)
            red = (base - err) / base if base > 0 else float("nan")
            reductions.append(
                {"eps_bar": e, "method": method_name(m), "method_key": m, "t": t, "error": err,
                 "baseline_error": base, "reduction": red,
                 "choices": (len(by_m[m]), len(by_m[BASELINE]))}
            )
    cand = [
        r for r in reductions
        if math.isfinite(r["eps_bar"]) and r["method_key"] in ("objt", "objp")
        and math.isfinite(r["reduction"])
    ]
    headline = max(cand, key=lambda r: r["reduction"]) if cand else None
    gaps: list[dict[str, Any]] = []
    inf_group = groups.get(math.inf, {})
    for e in sorted(k for k in groups if math.isfinite(k)):
        for m in sorted(groups[e], key=_method_rank):
            for c in groups[e][m]:
                t_c = c.final_iteration()
                error = _mean_at(c, t_c)
                inf_err = gap_inf = None
                t_inf = t_c
                if m in inf_group:
                    t_inf = min([t_c] + [x.final_iteration() for x in inf_group[m]])
                    _, inf_err = _best(inf_group[m], t_inf)
                    gap_inf = _mean_at(c, t_inf) - inf_err
                ref = nonprivate_reference(c)
                gaps.append(
                    {"eps_bar": e, "method": method_name(m), "method_key": m, "label": c.label,
                     "t": t_c, "error": error, "t_inf": t_inf, "inf_error": inf_err,
                     "gap_inf": gap_inf, "ref_error": ref,
                     "gap_ref": None if ref is None else error - ref}
                )
    return {"reductions": reductions, "headline": headline, "gaps": gaps}


def _fmt(value: Any) -> str:
    return cell(value, 4)


def _pct(x: float | None) -> str:
    return "-" if x is None or not math.isfinite(x) else f"{100 * x:.1f}%"


def admm_table_text(result: Result) -> str:
    """What `mpi-dp analyze` prints for an ADMM file: header, table, reductions vs OutP, gaps."""
    rows = admm_table(result)
    comp = admm_comparison(result)
    head = (
        f"{result.path}: {result.algorithm}" + (f" ({result.variant})" if result.variant else "")
        + f", job {result.job_name}, status {result.status}, {len(rows)} configuration"
        + ("s" if len(rows) != 1 else "")
        + "; test error at the last recorded iteration t (mean, 5/95 % over runs)"
    )
    order = sorted(rows, key=lambda r: (r["eps_bar"], _method_rank(r["method_key"]), r["index"]))
    headers = ["#", "method", "eps_bar", "runs", "t", "mean", "p5", "p95", "consensus", "noise_mag",
               "eps_total", "label"]
    keys = ["index", "method", "eps_bar", "runs", "t", "mean", "p5", "p95", "consensus", "noise_mag",
            "eps_total_basic", "label"]
    if any(r["train_error"] is not None or r["majority_error"] is not None for r in rows):
        headers[-1:-1] = ["train_err", "majority", "W=0", "flag"]
        keys[-1:-1] = ["train_error", "majority_error", "zero_error", "flag"]
    if any(calibrated(c) for c in result.configs):
        headers[2] = "eps (total)"  # each agent's total over T iterations, not eps_bar
    cells = [[_fmt(r[k]) for k in keys] for r in order]
    left = {1, len(keys) - 1} | ({len(keys) - 2} if "flag" in keys else set())
    parts = [head, ""] + aligned(headers, cells, left=left) + _utility_notes(result, rows)
    reds = comp["reductions"]
    if reds:
        parts += ["", "relative reduction of the test error against OutP, (E_OutP - E) / E_OutP:"]
        for r in reds:
            several = "" if r["choices"] == (1, 1) else (
                f" (best of {r['choices'][0]} vs best of {r['choices'][1]} configurations)")
            parts.append(
                f"  eps_bar={_eps_text(r['eps_bar'])}, t={r['t']}: {r['method']} "
                f"{_fmt(r['error'])} vs OutP {_fmt(r['baseline_error'])}: "
                f"{_pct(r['reduction'])}{several}"
            )
        h = comp["headline"]
        if h is not None:
            verdict = "within" if h["reduction"] <= PAPER_MAX_REDUCTION else "above"
            parts.append(
                f"  largest reduction of ObjT/ObjP over finite eps_bar: {_pct(h['reduction'])} "
                f"({h['method']}, eps_bar={_eps_text(h['eps_bar'])}); paper: at most "
                f"{100 * PAPER_MAX_REDUCTION:.0f}% ({verdict})"
            )
    gaps = [g for g in comp["gaps"] if g["gap_inf"] is not None or g["gap_ref"] is not None]
    if gaps:
        parts += ["", "gap to the non-private test error (own eps_bar=inf run; reference):"]
        for g in gaps:
            bits = []
            if g["gap_inf"] is not None:
                bits.append(f"{_fmt(g['gap_inf'])} vs eps_bar=inf {_fmt(g['inf_error'])} "
                            f"(t={g['t_inf']})")
            if g["gap_ref"] is not None:
                bits.append(f"{_fmt(g['gap_ref'])} vs reference {_fmt(g['ref_error'])}")
            parts.append(
                f"  {g['method']} eps_bar={_eps_text(g['eps_bar'])} [{g['label']}]: error "
                f"{_fmt(g['error'])} at t={g['t']}; gap " + "; ".join(bits)
            )
    return "\n".join(parts)


def _utility_notes(result: Result, rows: list[dict[str, Any]]) -> list[str]:
    """What the baseline columns mean and which configurations are flagged (none without them)."""
    if not any(r["majority_error"] is not None for r in rows):
        return []
    on_train = any(r["error_on"] == "train" for r in rows)
    where = result.configs[0].attrs.get("eval_set")
    lines = ["", "utility (evaluation-only): train_err = training error of the final w (mean over "
             "runs); majority = error of always predicting the most frequent training label; "
             "W=0 = error of w = 0 (argmax picks class 0)",
             "  NO TEST SET: majority, W=0 and the flag are TRAINING errors" if on_train
             else f"  majority and W=0 on the test set: {where or 'the recorded test set'}"]
    flagged = [r for r in rows if r["beats_baseline"] is False]
    if flagged:
        lines.append(f"{FLAG}: {len(flagged)} configuration(s) whose final w is no better than a "
                     "trivial predictor (always the majority class, or w = 0): configuration(s) "
                     + ", ".join(str(r["index"]) for r in flagged))
    return lines


# ---------------------------------------------------------------------------------------------
# figures
# ---------------------------------------------------------------------------------------------


def _color(key: str, others: list[str]) -> str:
    if key in METHOD_COLORS:
        return METHOD_COLORS[key]
    return OTHER_COLORS[others.index(key) % len(OTHER_COLORS)] if key in others else "black"


def _other_methods(result: Result) -> list[str]:
    return sorted({method_key(c) for c in result.configs} - set(METHOD_COLORS))


def _save(fig: plt.Figure, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return path


def _panel_configs(result: Result, metric: str, log: bool) -> dict[float, list[ConfigView]]:
    """eps_bar -> configurations with finite records of `metric` (some positive for a log axis)."""
    out: dict[float, list[ConfigView]] = {}
    for c in result.configs:
        e = eps_bar(c)
        if not _has(c, metric) or math.isnan(e):
            continue
        v = c.metric(metric)
        if not np.isfinite(v).any() or (log and not np.any(v > 0)):
            continue  # no test set (NaN), the noise of eps_bar = inf, CV at t = 0 only
        out.setdefault(e, []).append(c)
    return out


def plot_over_iterations(
    result: Result, path: Path, metric: str, ylabel: str, what: str, log: bool = False
) -> Path | None:
    """Mean line and 5-95 % band over runs of `metric` vs t; one panel per eps_bar, colour per method.

    Returns None (no file) when no configuration holds finite values of `metric`.
    """
    panels = _panel_configs(result, metric, log)
    if not panels:
        return None
    others = _other_methods(result)
    eps_list = sorted(panels)
    ncol = min(len(eps_list), 3)
    nrow = math.ceil(len(eps_list) / ncol)
    fig, axes = plt.subplots(nrow, ncol, figsize=(5.2 * ncol, 4.0 * nrow), squeeze=False,
                             sharey=log)
    for ax, e in zip(axes.flat, eps_list, strict=False):
        cfgs = sorted(panels[e], key=lambda c: (_method_rank(method_key(c)), c.index))
        seen: dict[str, int] = {}
        for c in cfgs:
            m = method_key(c)
            n_same = sum(1 for x in cfgs if method_key(x) == m)
            style = LINESTYLES[seen.get(m, 0) % len(LINESTYLES)]
            seen[m] = seen.get(m, 0) + 1
            t = c.iterations()
            v = c.metric(metric)
            if log:
                v = np.where(v > 0, v, np.nan)
            with np.errstate(all="ignore"), warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN records (log axis)
                mean = np.nanmean(v, axis=1)
                lo, hi = np.nanpercentile(v, PERCENTILES, axis=1)
            color = _color(m, others)
            label = method_name(m) if n_same == 1 else f"{method_name(m)} ({c.label})"
            ax.fill_between(t, lo, hi, color=color, alpha=0.2, linewidth=0)
            ax.plot(t, mean, color=color, ls=style, lw=1.5, label=label)
        if log:
            ax.set_yscale("log")
        ax.set_title(f"eps_bar = {_eps_text(e)}" + (" (non-private)" if math.isinf(e) else ""),
                     fontsize=9)
        ax.set_xlabel("iteration t")
        ax.set_ylabel(ylabel)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7, loc="best")
    for ax in list(axes.flat)[len(eps_list):]:
        ax.set_visible(False)
    fig.suptitle(title(result, f"{what}: mean over runs, 5–95 % band"), fontsize=10)
    top = 1.0 - 0.75 / (4.0 * nrow)  # room for the two-line title, ~0.75 inch
    fig.subplots_adjust(left=0.08, right=0.98, bottom=0.1 / nrow, top=top, wspace=0.3, hspace=0.35)
    return _save(fig, path)


def plot_error_vs_eps(result: Result, path: Path) -> Path | None:
    """Final mean test error (5-95 % bars) vs finite eps_bar per method, log x (Fig. 2).

    Non-private levels are horizontal lines: each method's eps_bar = inf configuration (dotted, its
    colour) and reference/test_error_nonprivate (black dashed). Several configurations of one
    (method, eps_bar): the lowest mean is drawn. Points short of the file's last t are hollow.
    Returns None without test-error records at two finite eps_bar values or one plus a level.
    """
    rows = [r for r in admm_table(result) if r["records"] > 0 and math.isfinite(r["mean"])]
    finite = [r for r in rows if on_eps_axis(r["eps_bar"])]  # negligible noise: left off
    inf_rows = [r for r in rows if math.isinf(r["eps_bar"])]
    refs = sorted({round(r["nonprivate_ref"], 12) for r in admm_table(result)
                   if r["nonprivate_ref"] is not None and math.isfinite(r["nonprivate_ref"])})
    n_eps = len({r["eps_bar"] for r in finite})
    if n_eps == 0 or (n_eps < 2 and not (inf_rows or refs)):
        return None
    t_max = max(r["t"] for r in rows)
    others = _other_methods(result)
    fig, ax = plt.subplots(figsize=(7.5, 5.5))
    methods = sorted({r["method_key"] for r in finite} | {r["method_key"] for r in inf_rows},
                     key=_method_rank)
    short = False
    for m in methods:
        color = _color(m, others)
        best: dict[float, dict[str, Any]] = {}
        for r in (x for x in finite if x["method_key"] == m):
            if r["eps_bar"] not in best or r["mean"] < best[r["eps_bar"]]["mean"]:
                best[r["eps_bar"]] = r
        if best:
            pts = [best[e] for e in sorted(best)]
            x = np.array([p["eps_bar"] for p in pts])
            y = np.array([p["mean"] for p in pts])
            err = np.array([[p["mean"] - p["p5"] for p in pts], [p["p95"] - p["mean"] for p in pts]])
            ax.errorbar(x, y, yerr=np.clip(err, 0, None), color=color, marker="o", ms=5, lw=1.5,
                        capsize=3, label=method_name(m), mfc=color)
            hollow = [p for p in pts if p["t"] < t_max]
            if hollow:
                short = True
                ax.plot([p["eps_bar"] for p in hollow], [p["mean"] for p in hollow], "o", ms=7,
                        mfc="white", mec=color)
        level = [r["mean"] for r in inf_rows if r["method_key"] == m]
        if level:
            ax.axhline(min(level), color=color, ls=":", lw=1.2,
                       label=f"{method_name(m)}, eps_bar = inf")
    for i, v in enumerate(refs):
        ax.axhline(v, color="black", ls="--", lw=1.0, label="non-private reference" if i == 0 else None)
    ax.set_xscale("log")
    ax.set_xlabel("eps_bar (per iteration)")
    ax.set_ylabel("test error at the last t (mean, 5–95 %)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    note = f"; hollow: t < {t_max}" if short else ""
    ax.set_title(title(result, f"final test error vs eps_bar{note}"), fontsize=10)
    fig.subplots_adjust(left=0.11, right=0.97, bottom=0.1, top=0.88)
    return _save(fig, path)


def plot_admm(result: Result, prefix: str | Path) -> list[Path]:
    """Write the ADMM figures that the result supports; returns the written PNG paths.

    `<prefix>_test_error.png` (Fig. 1 bottom / 3), `<prefix>_noise.png` (Fig. 1 top, log y),
    `<prefix>_error_vs_eps.png` (Fig. 2) and `<prefix>_consensus.png` (Fig. 5 top, log y); a figure
    whose metric is missing (or, for Fig. 2, with too few eps_bar values) is skipped.
    """
    _check(result)
    p = Path(prefix)
    written = [
        plot_over_iterations(result, Path(f"{p}_test_error.png"), ERROR, "test error",
                             "test error vs iteration"),
        plot_over_iterations(result, Path(f"{p}_noise.png"), "noise_mag",
                             "average noise magnitude", "average noise magnitude vs iteration",
                             log=True),
        plot_error_vs_eps(result, Path(f"{p}_error_vs_eps.png")),
        plot_over_iterations(result, Path(f"{p}_consensus.png"), "consensus",
                             "consensus violation CV", "consensus violation vs iteration", log=True),
    ]
    return [w for w in written if w is not None]
