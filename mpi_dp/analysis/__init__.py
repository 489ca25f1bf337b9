"""mpi_dp.analysis: load result files, summarise sweeps, fit scaling laws, draw figures."""

from __future__ import annotations

from pathlib import Path

from mpi_dp.analysis.fit import final_means, fit_slopes, fixed_exponent_constant, loglog_slope
from mpi_dp.analysis.load import (
    ConfigView,
    Result,
    ResultFileError,
    ResultNotFoundError,
    open_result,
)
from mpi_dp.analysis.table import analyze_text, format_table, rows_to_csv, summarize

__all__ = [
    "ConfigView",
    "Result",
    "ResultFileError",
    "ResultNotFoundError",
    "analyze_text",
    "final_means",
    "fit_slopes",
    "fixed_exponent_constant",
    "format_table",
    "loglog_slope",
    "open_result",
    "plot_result",
    "rows_to_csv",
    "summarize",
]


def plot_result(result: Result, out_prefix: str | Path, metric: str = "psi") -> list[Path]:
    """Lazy wrapper for `mpi_dp.analysis.figures.plot_result` (imports matplotlib on demand).

    The generic figure set (bands, vs eps / vs n, collaboration map) for any result; a method's own
    figures come from its composition (e.g. `mpi_dp.analysis.async_report.plot_async`).
    """
    from mpi_dp.analysis.figures import plot_result as _plot_result

    return _plot_result(result, out_prefix, metric)
