"""The asynchronous star method's figure set: a composition of the generic and async figures.

Not a figure module itself: it draws nothing, it decides which figures an async_star result gets and
in which order. The method entry (and through it `mpi-dp plot`) calls `plot_async`; the figure
modules never import this one.
"""

from __future__ import annotations

from pathlib import Path

from mpi_dp.analysis import async_figures, bound_figures, figures
from mpi_dp.analysis.fit import _final_data
from mpi_dp.analysis.load import Result


def plot_async(result: Result, prefix: str | Path, metric: str = "psi") -> list[Path]:
    """Write the async_star figures of `result` under `prefix`; returns the written PNG paths.

    In this order: `<prefix>_bands.png`; `<prefix>_vs_eps.png` / `<prefix>_vs_n.png` with slopes
    (when all configurations have the same number of owners N); the fitted cost-of-privacy bound
    (metric psi only); the schedule (Figs 3/9); the (N, eps) collaboration map (Fig 6); the
    per-owner isolated optima against E[psi] (Fig 7). Figures the result lacks data for are skipped.
    """
    prefix = Path(prefix)
    prefix.parent.mkdir(parents=True, exist_ok=True)
    written = [figures.plot_bands(result, Path(f"{prefix}_bands.png"), metric)]
    fm, _, _ = _final_data(result, metric)
    widths = {c.eps.size for c in result.configs}
    if fm.mean.size >= 2 and len(widths) == 1:
        for along in ("eps", "n"):
            p = figures.plot_vs(result, fm, Path(f"{prefix}_vs_{along}.png"), metric, along)
            if p is not None:
                written.append(p)
    if metric == "psi":
        written += bound_figures.plot_bound(result, prefix, metric)
    written += async_figures.plot_schedule(result, prefix)
    written += async_figures.plot_collaboration_map(result, prefix)
    written += async_figures.plot_facilities(result, prefix)
    return written
