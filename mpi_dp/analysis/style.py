"""Shared style of the analysis output: figure resolution and titles, log-scale cell edges, table cells.

Every figure and table module takes these from here, never from one another. This module does not
import matplotlib, so the text tables (and `mpi_dp.analysis` itself) stay free of it; figure modules
select the Agg backend themselves before importing pyplot.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from mpi_dp.analysis.load import Result

#: Resolution of every PNG written by the analysis.
DPI = 120
#: The largest eps drawn on an eps axis. Beyond it the noise is negligible (such a configuration
#: is the eps = inf one to many digits) and matplotlib's log axes overflow (from about 1e280):
#: those configurations stay in every table and fit and are left off the figures' eps axes.
EPS_AXIS_MAX = 1e100


def on_eps_axis(eps: Any) -> Any:
    """Whether eps (a number, or elementwise for an array) is drawn on an eps axis: 0 < eps <=
    EPS_AXIS_MAX (so never eps = inf, NaN or a negligible-noise eps)."""
    e = np.asarray(eps, dtype=float)
    out = (e > 0) & (e <= EPS_AXIS_MAX)
    return bool(out) if out.ndim == 0 else out


def title(result: Result, what: str) -> str:
    """Figure title: 'algorithm[/variant] — job name [status]' and, on a second line, `what`."""
    alg = result.algorithm + (f"/{result.variant}" if result.variant else "")
    status = "" if result.status == "complete" else f" [{result.status}]"
    return f"{alg} — {result.job_name}{status}\n{what}"


def log_edges(v: np.ndarray) -> np.ndarray:
    """Cell edges for positive, sorted centres `v` on a log axis (midpoints in log10; one cell a
    decade wide when there is a single centre)."""
    lv = np.log10(v)
    if lv.size == 1:
        return 10 ** np.array([lv[0] - 0.5, lv[0] + 0.5])
    mid = (lv[1:] + lv[:-1]) / 2
    return 10 ** np.concatenate([[2 * lv[0] - mid[0]], mid, [2 * lv[-1] - mid[-1]]])


def cell(value: Any, digits: int = 3) -> str:
    """A table cell: '-' for None, integers as they are, floats to `digits` significant digits."""
    if value is None:
        return "-"
    if isinstance(value, (bool, np.bool_)):
        return str(value)
    if isinstance(value, (int, np.integer)):
        return str(int(value))
    if isinstance(value, (float, np.floating)):
        return f"{value:.{digits}g}"
    return str(value)


def aligned(headers: list[str], cells: list[list[str]], left: set[int],
            rule: bool = True) -> list[str]:
    """Fixed-width lines of a text table: columns as wide as their widest cell, the columns in
    `left` left-aligned and the others right-aligned, a dashed rule under the headers if `rule`."""
    widths = [max([len(h)] + [len(r[j]) for r in cells]) for j, h in enumerate(headers)]

    def line(items: list[str]) -> str:
        parts = [it.ljust(w) if j in left else it.rjust(w)
                 for j, (it, w) in enumerate(zip(items, widths, strict=True))]
        return "  ".join(parts).rstrip()

    return ([line(headers)] + ([line(["-" * w for w in widths])] if rule else [])
            + [line(r) for r in cells])
