"""`mpi-dp compare`: result files of any method side by side, in one table and one figure.

Each method records its utility in its own way (the star methods a test or training error, or a
training MSE; admm and dola the test error of the final model; p2p a per-peer test accuracy or
RMSE averaged over peers) and its privacy in one shared way (`privacy/ledger`). This module reads
both into one row per (file, configuration): the owners' (eps, delta) total of what their
guarantee composes, the final test error (classification) or RMSE (regression) over the runs
(median and min..max), the trivial baselines and the non-private optimum the file records, and
the wall time. A value a file does not record is shown as "-" with a footnote saying why; files
of a classification and a regression task are not mixed under one metric.
"""

from __future__ import annotations

import math
import string
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import h5py
import numpy as np

from mpi_dp.analysis.guarantee import NO_NOISE, judge_rows
from mpi_dp.analysis.load import ConfigView, Result, open_result
from mpi_dp.analysis.style import DPI, EPS_AXIS_MAX, aligned, cell, on_eps_axis
from mpi_dp.errors import MpiDpError, unwritable_why

if TYPE_CHECKING:
    from matplotlib.colors import ListedColormap

METRICS = ("auto", "test_error", "rmse")
#: the task whose utility each metric measures
KIND = {"test_error": "classification", "rmse": "regression"}
#: the column of the trivial baseline of each metric
TRIVIAL = {"test_error": "majority", "rmse": "mean"}


class CompareError(MpiDpError):
    """Files that cannot be compared as asked (e.g. classification and regression together)."""


@dataclass
class Utility:
    """The final model's metric over runs and what the file records beside it."""

    kind: str  # classification | regression
    on: str  # test | train: the records the metric is measured on
    values: np.ndarray  # per run, finite values only
    trivial: float | None = None  # majority-class error | mean-prediction RMSE
    zero: float | None = None  # the model at zero
    optimum: float | None = None  # the non-private optimum (theta*, Theta*)


@dataclass
class Row:
    """One configuration of one file, as `mpi-dp compare` prints and draws it."""

    tag: str
    path: Path
    method: str
    variant: str
    index: int
    label: str
    eps: float  # the largest owner total (inf: no noise); NaN: unknown
    delta: float | None
    scope: str
    flagged: bool  # no finite, certified guarantee for another reason than eps = inf
    utility: Utility | None
    missing: str | None  # why there is no utility (the footnote)
    config_s: float | None
    run_s: float | None
    notes: list[str] = field(default_factory=list)

    def value(self, metric: str) -> np.ndarray | None:
        """The per-run values of `metric`, or None when this row has none."""
        u = self.utility
        return u.values if u is not None and KIND[metric] == u.kind and u.values.size else None


# --- reading ---------------------------------------------------------------------------------


def _finite(v: Any) -> float | None:
    try:
        x = float(np.asarray(v, dtype=float).ravel()[0])
    except (TypeError, ValueError, IndexError):
        return None
    return x if math.isfinite(x) else None


def _ref(c: ConfigView, name: str) -> float | None:
    return _finite(c.reference()[name]) if name in c.reference() else None


def _sqrt(v: float | None) -> float | None:
    return None if v is None or v < 0 else math.sqrt(v)


def _final(c: ConfigView, name: str) -> np.ndarray:
    v = c.final(name) if c.n_records() else np.zeros(0)
    return v[np.isfinite(v)]


def utility(algorithm: str, c: ConfigView) -> Utility | str:
    """The final model's utility of configuration `c`, or a one-line reason why there is none.

    star methods and admm (and any method recording train_error): the test error where the file
    has a test set, else the training error; baselines reference/{test,train}_error_majority,
    _zero, _star. Squared loss: RMSE = sqrt(train_mse) on the training records, baselines
    sqrt(train_mse_mean, _zero, _star). dola: test_error of w_hat, majority from the attribute
    test_error_majority. p2p: the per-peer test metric averaged over peers (1 - accuracy, or
    RMSE), the peers' majority/mean predictor and Theta* from the group's attributes.
    """
    names = c.metric_names()
    if not names:
        return "no metrics recorded (record_every = 0, or the run stopped before its first record)"
    if algorithm == "p2p" and "test_global_error" in c.attrs:
        a = c.attrs
        rmse = "RMSE" in str(a.get("test_global_metric", ""))
        per = np.asarray(c.group["per_agent/test_global_error"][()], dtype=float)
        v = per.mean(axis=1)
        return Utility("regression" if rmse else "classification", "test", v[np.isfinite(v)],
                       _finite(a.get("test_global_error_trivial")), None,
                       _finite(a.get("test_global_error_star")))
    if algorithm == "p2p":
        if "test_metric" not in names:
            return "no test_metric recorded"
        a = c.attrs
        rmse = "RMSE" in str(a.get("metric", ""))
        f = (lambda x: x) if rmse else (lambda x: None if x is None else 1.0 - x)
        v = _final(c, "test_metric")
        return Utility("regression" if rmse else "classification", "test",
                       v if rmse else 1.0 - v, f(_finite(a.get("test_metric_trivial"))), None,
                       f(_finite(a.get("test_metric_star"))))
    if algorithm == "dola":
        if "test_error" not in names:
            return "no test set in the shard file: no test_error recorded"
        return Utility("classification", "test", _final(c, "test_error"),
                       _finite(c.attrs.get("test_error_majority")), None,
                       _ref(c, "test_error_star"))
    if "test_error" in names or "train_error" in names:
        on = "test" if "test_error" in names else "train"
        return Utility("classification", on, _final(c, f"{on}_error"),
                       _ref(c, f"{on}_error_majority"), _ref(c, f"{on}_error_zero"),
                       _ref(c, f"{on}_error_star"))
    if "train_mse" in names:
        return Utility("regression", "train", np.sqrt(np.maximum(_final(c, "train_mse"), 0.0)),
                       _sqrt(_ref(c, "train_mse_mean")), _sqrt(_ref(c, "train_mse_zero")),
                       _sqrt(_ref(c, "train_mse_star")))
    return f"no test error or MSE among its metrics ({', '.join(names)})"


def _text(v: Any) -> str:
    if isinstance(v, (bytes, np.bytes_)):
        return v.decode("utf-8", "replace").rstrip("\x00")
    return str(v)


def privacy(c: ConfigView) -> tuple[float, float | None, str, bool, str | None]:
    """(eps, delta, scope, flagged, note) of a configuration from its privacy ledger.

    eps is the largest total over owners of what each owner's guarantee composes (scope
    configuration, record or selection), by the ledger's PLD accountant, inf where an owner
    trained without noise (its target is eps = inf, or no owner made a noisy release: p2p's
    eps = inf rows record a PLD total of 0); delta the largest owner delta. flagged: the
    guarantee is not finite and certified for another reason than eps = inf (uncertified noise,
    noise set from private data, an owner without a noisy release), which the note says
    (mpi_dp.analysis.guarantee, the rule of every view). Without a ledger, the configuration's
    eps attribute (note says so).
    """
    try:
        led = c.ledger()
    except (OSError, KeyError, TypeError, ValueError):
        led = None
    names = (led.dtype.names or ()) if led is not None else ()
    total = next((n for n in ("eps_pld", "eps_basic", "spent_eps") if n in names), None)
    if led is None or total is None or np.atleast_1d(led).size == 0:
        eps = float(np.max(c.eps)) if c.eps.size else math.nan
        return eps, None, "-", False, "no privacy ledger: eps is the job's, not a ledger total"
    led = np.atleast_1d(led)
    verdict = judge_rows(led)
    eps = verdict.eps
    dname = next((n for n in ("delta", "target_delta", "budget_delta") if n in names), None)
    delta = float(np.max(led[dname])) if dname else _finite(c.attrs.get("delta"))
    scope = "/".join(sorted({_text(s) for s in led["scope"]})) if "scope" in names else "-"
    other = [r for r in verdict.reasons if not r.startswith(NO_NOISE)]
    notes = [] if total == "eps_pld" else [f"ledger without PLD totals: eps is its {total}"]
    notes += [f"NOT private: {r}" for r in other]
    return eps, delta, scope, bool(other), "; ".join(notes) or None


def _variant(result: Result, c: ConfigView) -> str:
    """The configuration's distinguishing keys: variant, loss, calibration, swept keys but eps."""
    a = c.attrs
    parts = [str(a.get("variant") or result.variant or "")]
    parts += [str(a[k]) for k in ("loss", "calibration") if a.get(k)]
    swept = set(result.sweep) - {"eps", "variant"}
    extra = [p.strip() for p in c.label.split(",") if "=" in p
             and p.split("=")[0].strip() in swept]
    return "/".join(p for p in parts if p) + (" " + ",".join(extra) if extra else "")


def _run_seconds(c: ConfigView) -> tuple[float | None, int | None]:
    prov = c.group.file.get("provenance")
    if not isinstance(prov, h5py.Group):
        return None, None
    ranks = prov.attrs.get("n_ranks")
    return _finite(prov.attrs.get("wall_seconds")), int(ranks) if ranks is not None else None


def read_rows(paths: list[str | Path]) -> tuple[list[Row], list[str]]:
    """Rows of every configuration of every file, and one header line per file."""
    from mpi_dp.analysis import audit_report

    rows: list[Row] = []
    heads: list[str] = []
    tags = _tags(len(paths))
    for tag, path in zip(tags, paths, strict=True):
        if audit_report.is_audit(path):
            raise CompareError(f"{path} is a privacy audit result (mpi-dp analyze shows it); "
                               "compare takes result files of mpi-dp run")
        with open_result(path) as res:
            run_s, ranks = _run_seconds(res.configs[0])
            note = res.completeness
            heads.append(f"{tag}  {res.path}: {res.algorithm}, job {res.job_name}, "
                         f"{res.status}, {len(res.configs)} configuration"
                         f"{'s' if len(res.configs) != 1 else ''}"
                         + (f", {cell(run_s)} s on {ranks} rank(s)" if run_s is not None else "")
                         + (f"  [{note}]" if note else ""))
            for c in res.configs:
                u = utility(res.algorithm, c)
                eps, delta, scope, flagged, pnote = privacy(c)
                rows.append(Row(tag, res.path, res.algorithm, _variant(res, c), c.index, c.label,
                                eps, delta, scope, flagged,
                                u if isinstance(u, Utility) else None,
                                None if isinstance(u, Utility) else u,
                                _finite(c.attrs.get("seconds")), run_s,
                                [pnote] if pnote else []))
    return rows, heads


def _tags(n: int) -> list[str]:
    letters = string.ascii_uppercase
    return [letters[i] if n <= 26 else f"{letters[i // 26 % 26]}{letters[i % 26]}"
            for i in range(n)]


def choose_metric(rows: list[Row], metric: str = "auto") -> str:
    """The metric to show: `metric`, or for auto the one the files' task gives; CompareError when
    auto meets files of a classification and a regression task."""
    if metric not in METRICS:
        raise CompareError(f"unknown metric {metric!r}; choose one of {', '.join(METRICS)}")
    if metric != "auto":
        return metric
    kinds: dict[str, set[str]] = {}
    for r in rows:
        if r.utility is not None:
            kinds.setdefault(r.utility.kind, set()).add(str(r.path))
    if len(kinds) > 1:
        what = "; ".join(f"{kind}: {', '.join(sorted(files))}" for kind, files in kinds.items())
        raise CompareError(f"the files mix tasks ({what}): compare each task's files on their "
                           "own, or pass --metric test_error or --metric rmse")
    return "rmse" if kinds.keys() == {"regression"} else "test_error"


# --- text ------------------------------------------------------------------------------------


def _eps_cell(r: Row) -> str:
    return ("inf" if math.isinf(r.eps) else "-" if math.isnan(r.eps) else f"{r.eps:.3g}") \
        + ("!" if r.flagged else "")


def compare_text(rows: list[Row], heads: list[str], metric: str) -> str:
    """The table `mpi-dp compare` prints, with the file lines above and the footnotes below."""
    trivial = TRIVIAL[metric]
    notes: dict[str, str] = {}

    where: dict[str, list[int]] = {}

    def mark(key: str) -> str:
        return notes.setdefault(key, str(len(notes) + 1))

    headers = ["file", "#", "method", "variant", "eps", "delta", "scope", "runs", metric,
               "min..max", "on", trivial, "zero", "optimum", "cfg_s", "run_s", "note"]
    cells = []
    for r in rows:
        v = r.value(metric)
        u = r.utility
        own = []
        if v is None:
            why = r.missing or (f"a {u.kind} result: no {metric} (try --metric "
                                f"{'rmse' if metric == 'test_error' else 'test_error'})"
                                if u is not None and u.kind != KIND[metric]
                                else "no finite value at the last record")
            own.append(why)
        own += r.notes
        shown = u if v is not None else None
        cells.append([r.tag, str(r.index), r.method, r.variant, _eps_cell(r), cell(r.delta, 3),
                      r.scope, str(v.size) if v is not None else "-",
                      cell(float(np.median(v)), 4) if v is not None else "-",
                      f"{cell(float(v.min()), 4)}..{cell(float(v.max()), 4)}"
                      if v is not None else "-",
                      shown.on if shown else "-",
                      cell(shown.trivial if shown else None, 4),
                      cell(shown.zero if shown else None, 4),
                      cell(shown.optimum if shown else None, 4),
                      cell(r.config_s, 3), cell(r.run_s, 3),
                      ",".join(mark(f"{r.tag}\0{t}") for t in own)])
        for t in own:
            where.setdefault(f"{r.tag}\0{t}", []).append(r.index)
    lines = [*heads, "", *aligned(headers, cells, {0, 2, 3, 6, 10, 16}), ""]
    what = ("test_error: error of the final model on the test set (on = test; where the file "
            "has no test set, on the training records: on = train)" if metric == "test_error"
            else "rmse: root mean squared error of the final model (star methods record the "
            "training MSE only: on = train; p2p: per-peer test RMSE averaged over peers)")
    lines += [f"{what}; the median over runs, then min..max over runs (runs: how many).",
              "eps, delta: the largest total over owners of what each owner's guarantee "
              "composes (scope: configuration; record for dola: per record; selection for "
              "p2p.select), by the ledger's PLD accountant at the owner's delta; inf = no "
              "noise (not private); ! = no finite, certified guarantee (uncertified noise, "
              "noise set from private data, an owner without a noisy release): the note says "
              "why.",
              f"{trivial}: " + ("error of always predicting the most frequent training label "
                                if metric == "test_error" else "RMSE of always predicting the "
                                "training mean ")
              + "(p2p: each peer's own); zero: the model at zero; optimum: the non-private "
              "optimum theta* (p2p: Theta*), on the same records; '-': not recorded.",
              "cfg_s: the configuration's own wall time (admm, dola and p2p record it); run_s: "
              "the whole run's (provenance wall_seconds), seconds."]
    for key, number in notes.items():
        tag, text = key.split("\0")
        idx = where[key]
        which = f"#{idx[0]}" if len(idx) == 1 else f"configurations #{_ranges(idx)}"
        lines.append(f"note {number}: {tag} {which}: {text}")
    return "\n".join(lines)


def _ranges(values: list[int]) -> str:
    """'0-2,5' for sorted distinct integers."""
    out: list[list[int]] = []
    for v in values:
        if out and v == out[-1][1] + 1:
            out[-1][1] = v
        else:
            out.append([v, v])
    return ",".join(f"{a}" if a == b else f"{a}-{b}" for a, b in out)


# --- figure ----------------------------------------------------------------------------------


#: lines per file in the figure; a file with more variants pools them (first by method variant,
#: loss and calibration, then all), so that a 100-configuration sweep stays readable
MAX_SERIES = 4


def _series(rows: list[Row]) -> dict[tuple[str, str], list[Row]]:
    """The figure's lines: (file, variant) -> rows, pooled where a file has too many."""
    out: dict[tuple[str, str], list[Row]] = {}
    for tag in dict.fromkeys(r.tag for r in rows):
        mine = [r for r in rows if r.tag == tag]
        for key in (lambda r: r.variant, lambda r: r.variant.split(" ")[0], lambda r: ""):
            keys = list(dict.fromkeys(key(r) for r in mine))
            if len(keys) <= MAX_SERIES:
                break
        for r in mine:
            out.setdefault((tag, key(r)), []).append(r)
    return out


def plot_compare(rows: list[Row], metric: str, path: str | Path, overwrite: bool = False
                 ) -> Path:
    """`metric` (median over runs, min..max bars) against eps, one line per file and variant
    (pooled beyond MAX_SERIES per file: the median of the configurations' medians, bars over all
    their runs), eps = inf drawn at the right past a gap, the recorded baselines as horizontal
    lines."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.backend_bases import FigureCanvasBase
    from matplotlib.ticker import FixedLocator, NullLocator

    path = Path(path)
    if path.is_dir():
        raise CompareError(f"--out {path} is a directory; give the figure's file name, e.g. "
                           f"{path / 'compare.png'}")
    if not path.suffix:
        path = path.with_suffix(".png")  # what savefig writes: name the file it writes
    elif path.suffix.lower()[1:] not in FigureCanvasBase.get_supported_filetypes():
        raise CompareError(f"--out {path}: {path.suffix} is not a figure format; give a .png, "
                           ".pdf or .svg file name")
    if path.exists() and not overwrite:
        raise CompareError(f"{path} exists: compare never replaces a figure silently; pass "
                           "--overwrite to replace it, or --out another file")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise CompareError(f"cannot write the figure {path}: {unwritable_why(path, e)}; choose "
                           "another --out") from None
    drawn = [r for r in rows if r.value(metric) is not None
             and (on_eps_axis(r.eps) or math.isinf(r.eps))]
    # a finite eps beyond style.EPS_AXIS_MAX (negligible noise) stays in the table only
    off_axis = sum(1 for r in rows if r.value(metric) is not None
                   and EPS_AXIS_MAX < r.eps < math.inf)
    finite = [r.eps for r in drawn if math.isfinite(r.eps)]
    # decades around the finite eps (a PLD total of 0.0999999 for a target of 0.1 stays in 0.1)
    lo = 10 ** math.floor(math.log10(min(finite)) + 1e-4) if finite else 0.1
    hi = 10 ** math.ceil(math.log10(max(finite)) - 1e-4) if finite else 1.0
    hi = max(hi, lo * 10)
    x_inf = hi * 10  # eps = inf: one decade right of the finite points
    fig, ax = plt.subplots(figsize=(10, 5.5))
    # a listed colormap: its colors a tuple of RGB tuples
    colors = cast("tuple[Any, ...]", cast("ListedColormap", plt.get_cmap("tab10")).colors)
    files = list(dict.fromkeys(r.tag for r in rows))
    groups = _series(drawn)
    markers = "osD^vP"
    series: list[str] = []

    def run_values(r: Row) -> np.ndarray:
        v = r.value(metric)
        assert v is not None  # drawn holds the rows with values
        return v

    for j, ((tag, variant), rs) in enumerate(groups.items()):
        color = colors[files.index(tag) % len(colors)]
        by_eps: dict[float, list[Row]] = {}
        for r in sorted(rs, key=lambda r: r.eps):
            by_eps.setdefault(r.eps, []).append(r)
        # per eps: the median of the configurations' medians, bars min..max over all their runs
        stats = np.array([[float(np.median([np.median(run_values(r)) for r in at])),
                           min(float(run_values(r).min()) for r in at),
                           max(float(run_values(r).max()) for r in at)]
                          for at in by_eps.values()])
        eps = np.array(list(by_eps))
        xs = np.where(np.isinf(eps), x_inf, eps)
        fin = np.isfinite(eps)
        yerr = np.vstack([stats[:, 0] - stats[:, 1], stats[:, 2] - stats[:, 0]])
        marker = markers[j % len(markers)]
        pooled = len({r.variant for r in rs})
        u0 = rs[0].utility
        assert u0 is not None  # a row with values has a utility
        label = f"{tag} {rs[0].method} {variant}".strip() + (
            f" ({pooled} variants pooled)" if pooled > 1 else "") + (
            " [train]" if u0.on == "train" else "")
        series.append(label)
        legend: str | None = label  # the series' first errorbar carries its legend entry
        if fin.any():
            ax.errorbar(xs[fin], stats[fin, 0], yerr=yerr[:, fin], color=color, marker=marker,
                        ms=5, lw=1.4, capsize=3, label=legend)
            legend = None
        if (~fin).any():
            ax.errorbar(xs[~fin], stats[~fin, 0], yerr=yerr[:, ~fin], color=color,
                        marker=marker, ms=9, mfc="none", mew=1.6, ls="none", capsize=3,
                        label=legend)
    styles = {"trivial": ("--", TRIVIAL[metric]), "zero": (":", "zero"),
              "optimum": ("-.", "optimum")}
    for tag in files:
        color = colors[files.index(tag) % len(colors)]
        for attr, (ls, name) in styles.items():
            values = sorted({round(getattr(r.utility, attr), 12) for r in rows
                             if r.tag == tag and r.value(metric) is not None
                             and getattr(r.utility, attr) is not None})
            for k, y in enumerate(values):
                ax.axhline(y, color=color, ls=ls, lw=0.9, alpha=0.8,
                           label=f"{tag} {name}" + (f" ({len(values)} values)"
                                                    if len(values) > 1 else "") if k == 0
                           else None)
    ax.set_xscale("log")
    ax.axvspan(hi * 10 ** 0.4, hi * 10 ** 0.6, color="0.9", lw=0)  # the gap before inf
    decades = [10.0 ** e for e in range(round(math.log10(lo)), round(math.log10(hi)) + 1)]
    ax.xaxis.set_major_locator(FixedLocator([*decades, x_inf]))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xticklabels([f"{d:g}" for d in decades] + ["inf\n(no noise)"])
    ax.set_xlim(lo / 10 ** 0.3, x_inf * 10 ** 0.3)
    ax.set_xlabel("eps: the largest owner's total (privacy ledger, PLD)" + (
        f"; {off_axis} configuration(s) of eps > {EPS_AXIS_MAX:g} (negligible noise) not drawn"
        if off_axis else ""))
    ax.set_ylabel(("test error" if metric == "test_error" else "RMSE")
                  + " of the final model (median, min..max over runs)")
    if not drawn:
        ax.text(0.5, 0.5, f"no file records {metric}", ha="center", va="center",
                transform=ax.transAxes)
    ax.grid(True, which="major", alpha=0.3)
    ax.set_title(f"{metric} vs eps: {len(files)} result file(s); open markers: eps = inf; "
                 "[train]: on the training records", fontsize=10)
    handles, labels = ax.get_legend_handles_labels()
    if handles:  # the file's lines first, then the baselines
        order = sorted(range(len(labels)), key=lambda i: (labels[i] not in series, i))
        ax.legend([handles[i] for i in order], [labels[i] for i in order], fontsize=7,
                  loc="center left", bbox_to_anchor=(1.01, 0.5))
    fig.subplots_adjust(left=0.08, right=0.64, bottom=0.14, top=0.92)
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return path


def run_compare(paths: list[str | Path], out: str | Path | None = None,
                metric: str = "auto", overwrite: bool = False) -> tuple[str, Path]:
    """The text `mpi-dp compare` prints and the figure it writes (default: compare.png next to
    the first file; an existing figure is replaced only with `overwrite`)."""
    rows, heads = read_rows(paths)
    metric = choose_metric(rows, metric)
    text = compare_text(rows, heads, metric)
    fig = plot_compare(rows, metric, out or Path(paths[0]).parent / "compare.png", overwrite)
    return text, fig
