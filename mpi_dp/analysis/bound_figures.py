"""PNG figures of the cost-of-privacy bound: E[psi] vs eps and vs n with the fitted bound drawn."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from mpi_dp.analysis.forecast import BoundFit, ForecastError, fit_bound, regressors  # noqa: E402
from mpi_dp.analysis.load import Result  # noqa: E402
from mpi_dp.analysis.style import DPI, on_eps_axis, title  # noqa: E402

MAX_CURVES = 8


def _equal_points(fit: BoundFit, source: str) -> list[dict]:
    """Points of `source` whose owners share one eps (one drawn on an eps axis) and one n."""
    return [p for p in fit.points if p["source"] == source and len(set(p["eps"])) == 1
            and len(set(p["n"])) == 1 and on_eps_axis(p["eps"][0])]


def _thin(keys: list, limit: int = MAX_CURVES) -> list:
    if len(keys) <= limit:
        return keys
    idx = np.unique(np.round(np.linspace(0, len(keys) - 1, limit)).astype(int))
    return [keys[i] for i in idx]


def _draw(ax, xs, floor, n_tot, S, fit: BoundFit, color) -> None:
    """Fitted bound over a curve: log fit (dashed) and NNLS (dotted)."""
    u, v = regressors(n_tot, S)
    ax.plot(xs, floor + fit.b_log * v, color=color, lw=1.0, ls="--")
    if fit.a > 0 or not np.isclose(fit.b, fit.b_log, rtol=1e-3):
        ax.plot(xs, floor + fit.a * u + fit.b * v, color=color, lw=1.0, ls=":")


def _plot_along(result: Result, fit: BoundFit, path: Path, along: str, metric: str) -> Path | None:
    pts = _equal_points(fit, str(result.path))
    fixed = "n" if along == "eps" else "eps"
    key_of = lambda p: (p["owners"], p[fixed][0])  # noqa: E731
    x_of = (lambda p: p["eps"][0]) if along == "eps" else (lambda p: float(p["n"][0]))
    groups: dict[tuple, list[dict]] = {}
    for p in pts:
        groups.setdefault(key_of(p), []).append(p)
    keys = _thin(sorted(k for k, g in groups.items() if len({x_of(p) for p in g}) >= 2))
    if not keys:
        return None
    fig, ax = plt.subplots(figsize=(7.5, 5.5))
    colors = plt.cm.plasma(np.linspace(0, 0.85, len(keys)))
    for key, color in zip(keys, colors, strict=True):
        g = sorted(groups[key], key=x_of)
        x = np.array([x_of(p) for p in g])
        M = np.array([p["mean"] for p in g])
        se = np.nan_to_num(np.array([p["se"] for p in g]))
        M0 = np.array([p["floor"] for p in g])
        N = key[0]
        label = f"N={N}, " + (f"n_i={key[1]}" if along == "eps" else f"eps={key[1]:g}")
        used = np.array([p["used"] for p in g])
        ax.errorbar(x, M, yerr=se, color=color, marker="o", ms=4, lw=0, elinewidth=1, capsize=2,
                    label=label)
        if (~used).any():
            ax.plot(x[~used], M[~used], ls="none", marker="o", ms=8, mfc="none", mec="grey")
        xs = np.geomspace(x.min(), x.max(), 60)
        floor = np.exp(np.interp(np.log(xs), np.log(x), np.log(np.maximum(M0, 1e-300))))
        if along == "eps":
            n_tot, S = N * key[1], N / xs**2
            ax.axhline(M0[0], color=color, lw=0.8, ls=(0, (1, 3)))
        else:
            n_tot, S = N * xs, N / key[1] ** 2
        _draw(ax, xs, floor, n_tot, S, fit, color)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("eps (every owner)" if along == "eps" else "n_i (records per owner)")
    ax.set_ylabel(f"E[{metric}] at final k (± SE)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    form = f"dashed: M0 + {fit.b_log:.3g} S/n²"
    if fit.a > 0 or not np.isclose(fit.b, fit.b_log, rtol=1e-3):
        form += f"; dotted: M0 + {fit.a:.3g} √S/n + {fit.b:.3g} S/n² (NNLS)"
    axis = "eps" if along == "eps" else "n"
    what = (f"E[{metric}] vs {axis} (open circles: not fitted, y < 3 SE or E > {fit.max_psi:g})"
            f"\n{form}")
    ax.set_title(title(result, what), fontsize=9)
    fig.subplots_adjust(left=0.11, right=0.97, bottom=0.1, top=0.86)
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return path


def _plot_parity(result: Result, fit: BoundFit, path: Path, metric: str) -> Path | None:
    """Observed E[metric] against the NNLS and log predictions, with the factor-2 band."""
    pts = [p for p in fit.points if p["source"] == str(result.path) and p["mean"] > 0]
    if not pts:
        return None
    fig, ax = plt.subplots(figsize=(6.5, 6))
    obs = np.array([p["mean"] for p in pts])
    used = np.array([p["used"] for p in pts])
    for k, marker, color in (("nnls", "o", "tab:blue"), ("log", "s", "tab:orange")):
        pred = np.array([p[f"fit_{k}"] for p in pts])
        ax.scatter(pred[used], obs[used], marker=marker, s=22, color=color, label=f"{k} (used)")
        if (~used).any():
            ax.scatter(pred[~used], obs[~used], marker=marker, s=22, facecolors="none",
                       edgecolors=color, label=f"{k} (dropped)")
    allv = np.concatenate([obs, [p[f"fit_{k}"] for p in pts for k in ("nnls", "log")]])
    allv = allv[np.isfinite(allv) & (allv > 0)]
    lo, hi = float(allv.min()) / 2, float(allv.max()) * 2
    line = np.array([lo, hi])
    ax.plot(line, line, color="k", lw=1)
    ax.fill_between(line, line / 2, line * 2, color="grey", alpha=0.15, label="factor 2")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel(f"fitted E[{metric}] = M0 + excess")
    ax.set_ylabel(f"observed E[{metric}]")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    loo = ", ".join(f"{k} median {fit.loo_factor_median[k]:.3g} max {fit.loo_factor_max[k]:.3g}"
                    for k in ("nnls", "log"))
    ax.set_title(title(result, f"fitted vs observed\nleave-one-out factor: {loo}"), fontsize=9)
    fig.subplots_adjust(left=0.13, right=0.97, bottom=0.1, top=0.86)
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return path


def plot_bound(
    result: Result, path_prefix: str | Path, metric: str = "psi", fit: BoundFit | None = None
) -> list[Path]:
    """`<prefix>_bound_vs_eps.png`, `_bound_vs_n.png`, `_bound_parity.png` for a sweep.

    Returns [] if `result` is not a sweep with at least 3 finite-eps configurations, or when
    no fit is given and the bound cannot be fitted (e.g. no eps = inf floor). `fit`
    defaults to fit_bound(result) (its constants are drawn; only this file's points are shown).
    """
    finite = [c for c in result.configs if c.eps.size and np.isfinite(c.eps).any()]
    if not result.is_sweep or len(finite) < 3:
        return []
    if fit is None:
        try:
            fit = fit_bound(result, metric=metric)
        except ForecastError:
            return []
    prefix = Path(path_prefix)
    prefix.parent.mkdir(parents=True, exist_ok=True)
    out = []
    for along in ("eps", "n"):
        p = _plot_along(result, fit, Path(f"{prefix}_bound_vs_{along}.png"), along, metric)
        if p is not None:
            out.append(p)
    p = _plot_parity(result, fit, Path(f"{prefix}_bound_parity.png"), metric)
    if p is not None:
        out.append(p)
    return out
