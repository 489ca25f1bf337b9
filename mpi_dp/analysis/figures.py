"""PNG figures of a result file: percentile bands, final mean vs eps / n, collaboration maps."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from mpi_dp.analysis.fit import (  # noqa: E402
    FinalMeans,
    _diff_se,
    _equal_rows,
    _final_data,
    _floor_index,
    _floor_values,
    loglog_slope,
)
from mpi_dp.analysis.load import ConfigView, Result  # noqa: E402
from mpi_dp.analysis.style import DPI, log_edges, on_eps_axis, title  # noqa: E402

MAX_BANDS = 10


def _pick_band_configs(result: Result) -> tuple[list[ConfigView], str]:
    """At most ~MAX_BANDS configurations with data, and a note saying which were picked."""
    cfgs = [c for c in result.configs if c.n_records() > 0]
    if len(cfgs) <= MAX_BANDS:
        return cfgs, ""
    equal = [
        c for c in cfgs if c.eps.size and np.all(c.eps == c.eps[0]) and np.all(c.n == c.n[0])
    ]
    ns = sorted({int(c.n[0]) for c in equal})
    if len(equal) == len(cfgs) and len(ns) >= 2:
        chosen: list[ConfigView] = []
        for nv in (ns[0], ns[-1]):
            group = sorted((c for c in equal if int(c.n[0]) == nv), key=lambda c: c.eps[0])
            take = np.unique(np.linspace(0, len(group) - 1, min(len(group), MAX_BANDS // 2)))
            chosen += [group[int(i)] for i in np.round(take).astype(int)]
        note = f"showing {len(chosen)} of {len(cfgs)} configurations: n = {ns[0]} and {ns[-1]}"
        return chosen, note
    take = np.unique(np.round(np.linspace(0, len(cfgs) - 1, MAX_BANDS)).astype(int))
    return [cfgs[i] for i in take], f"showing {take.size} of {len(cfgs)} configurations (evenly)"


def plot_bands(result: Result, path: Path, metric: str = "psi") -> Path:
    """Median and 25-75 % band of `metric` vs iteration, one per configuration (log y)."""
    cfgs, note = _pick_band_configs(result)
    fig, ax = plt.subplots(figsize=(8, 5.5))
    colors = plt.cm.viridis(np.linspace(0, 0.9, max(len(cfgs), 1)))
    for c, color in zip(cfgs, colors, strict=False):
        k = c.iterations()
        v = c.metric(metric)
        with np.errstate(all="ignore"):
            q25, med, q75 = np.nanpercentile(v, [25, 50, 75], axis=1)
        ax.fill_between(k, q25, q75, color=color, alpha=0.25, linewidth=0)
        ax.plot(k, med, color=color, lw=1.6, label=c.label)
    if not cfgs:
        ax.text(0.5, 0.5, "no records yet", ha="center", va="center", transform=ax.transAxes)
    else:
        ax.set_yscale("log")
        ax.legend(fontsize=8, loc="best", title="median, 25–75 % band", title_fontsize=8)
    ax.set_xlabel("iteration k")
    ax.set_ylabel(metric)
    ax.grid(True, which="both", alpha=0.3)
    ax.set_title(title(result, f"{metric} over runs" + (f"; {note}" if note else "")), fontsize=10)
    fig.subplots_adjust(left=0.11, right=0.97, bottom=0.1, top=0.88)
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return path


def plot_vs(
    result: Result,
    fm: FinalMeans,
    path: Path,
    metric: str,
    along: str,
) -> Path | None:
    """Final mean (SE bars) vs eps (`along`="eps", one line per n) or vs n (one line per eps)."""
    eq = _equal_rows(fm)
    e0, n0 = fm.eps[:, 0], fm.n[:, 0].astype(float)
    finite = eq & on_eps_axis(e0)  # a negligible-noise eps (style.EPS_AXIS_MAX) is left off
    floor = _floor_index(fm)
    M0 = _floor_values(fm.mean, floor)
    dse = _diff_se(fm, floor)
    x_all, key_all = (e0, n0) if along == "eps" else (n0, e0)
    keys = np.unique(key_all[finite])
    members = [np.flatnonzero(finite & (key_all == kv)) for kv in keys]
    groups = [(kv, g) for kv, g in zip(keys, members, strict=True)
              if np.unique(x_all[g]).size >= 2]
    if not groups:
        return None
    fig, ax = plt.subplots(figsize=(7.5, 5.5))
    colors = plt.cm.plasma(np.linspace(0, 0.85, len(groups)))
    for (kv, rows), color in zip(groups, colors, strict=True):
        rows = rows[np.argsort(x_all[rows])]
        x = x_all[rows]
        fit = loglog_slope(x, fm.mean[rows], M0[rows], dse[rows])
        kname = "n" if along == "eps" else "eps"
        label = f"{kname} = {kv:g}"
        if np.isfinite(fit["slope"]):
            label += f" (slope {fit['slope']:.2f})"
        ax.errorbar(
            x, fm.mean[rows], yerr=np.nan_to_num(fm.se[rows]), color=color, marker="o", ms=4,
            lw=1.4, capsize=2, label=label,
        )
        if np.isfinite(fit["slope"]):
            xs = np.geomspace(x.min(), x.max(), 50)
            m0 = np.interp(np.log(xs), np.log(x), M0[rows])
            ax.plot(xs, m0 + np.exp(fit["intercept"]) * xs ** fit["slope"], color=color,
                    lw=0.8, ls="--")
        if along == "eps" and floor[rows[0]] >= 0:
            ax.axhline(M0[rows[0]], color=color, lw=0.8, ls=":")
    ax.set_xscale("log")
    ax.set_yscale("log")
    if along == "eps":
        ax.set_xlabel("eps (every owner)")
        what = f"final E[{metric}] vs eps (dotted: eps = inf floor; slopes of E - floor)"
    else:
        ax.set_xlabel("n per owner (records)")
        what = f"final E[{metric}] vs n per owner (slopes of E - floor)"
    ax.set_ylabel(f"E[{metric}] at final k (± SE)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title(title(result, what), fontsize=10)
    fig.subplots_adjust(left=0.11, right=0.97, bottom=0.1, top=0.88)
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return path


def _scenario_groups(fm: FinalMeans) -> list[np.ndarray]:
    """Groups of rows with fixed owners 2..N and a >= 2 x 2 grid over owner 1's (n, eps)."""
    if fm.eps.shape[1] < 2:
        return []
    keys: dict[tuple, list[int]] = {}
    for r in range(fm.eps.shape[0]):
        keys.setdefault((tuple(fm.eps[r, 1:]), tuple(fm.n[r, 1:])), []).append(r)
    out = []
    for rows in keys.values():
        rows_a = np.asarray(rows)
        ok = rows_a[on_eps_axis(fm.eps[rows_a, 0]) & np.isfinite(fm.mean[rows_a])]
        if np.unique(fm.n[ok, 0]).size >= 2 and np.unique(fm.eps[ok, 0]).size >= 2:
            out.append(ok)
    return out


def plot_map(
    result: Result, fm: FinalMeans, iso: np.ndarray, path: Path, metric: str = "psi"
) -> Path | None:
    """Heat map of log10 E[metric] over owner 1's (n_1, eps_1), one panel per fixed partner set."""
    groups = _scenario_groups(fm)
    if not groups:
        return None
    groups = groups[:6]
    ncol = min(len(groups), 2)
    nrow = int(np.ceil(len(groups) / ncol))
    fig, axes = plt.subplots(nrow, ncol, figsize=(6.2 * ncol, 4.8 * nrow), squeeze=False)
    with np.errstate(divide="ignore", invalid="ignore"):
        allz = np.log10(np.concatenate([fm.mean[g] for g in groups]))
    allz = allz[np.isfinite(allz)]
    vmin, vmax = (float(allz.min()), float(allz.max())) if allz.size else (0.0, 1.0)
    mesh = None
    for ax, rows in zip(axes.flat, groups, strict=False):
        ns = np.unique(fm.n[rows, 0])
        es = np.unique(fm.eps[rows, 0])
        Z = np.full((ns.size, es.size), np.nan)
        D = np.full((ns.size, es.size), np.nan)
        for r in rows:
            i = np.searchsorted(ns, fm.n[r, 0])
            j = np.searchsorted(es, fm.eps[r, 0])
            with np.errstate(divide="ignore", invalid="ignore"):
                Z[i, j] = np.log10(fm.mean[r])
                D[i, j] = Z[i, j] - np.log10(iso[r]) if np.isfinite(iso[r]) else np.nan
        mesh = ax.pcolormesh(
            log_edges(es), log_edges(ns.astype(float)), np.ma.masked_invalid(Z), cmap="viridis",
            vmin=vmin, vmax=vmax, shading="flat",
        )
        if ns.size >= 2 and es.size >= 2 and np.isfinite(D).any():
            Dm = np.ma.masked_invalid(D)
            if np.nanmin(D) < 0 < np.nanmax(D):
                ax.contour(es, ns, Dm, levels=[0.0], colors="white", linewidths=2)
            if np.nanmin(D) < 0:
                ax.contourf(
                    es, ns, Dm, levels=[float(np.nanmin(D)) - 1.0, 0.0], colors="none",
                    hatches=["//"],
                )
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("eps_1 (owner 1)")
        ax.set_ylabel("n_1 (owner 1)")
        partners = ", ".join(
            f"({int(n)}, {e:g})"
            for n, e in zip(fm.n[rows[0], 1:], fm.eps[rows[0], 1:], strict=True)
        )
        ax.set_title(f"others (n, eps): {partners}", fontsize=9)
    for ax in list(axes.flat)[len(groups):]:
        ax.set_visible(False)
    if mesh is not None:
        fig.colorbar(mesh, ax=axes.ravel().tolist(), label=f"log10 E[{metric}] at final k")
    fig.suptitle(
        title(
            result,
            f"hatched: E[{metric}] < psi(theta*_1) of owner 1 alone (collaboration pays); "
            "white line: equal",
        ),
        fontsize=10,
    )
    fig.subplots_adjust(top=0.80 if nrow == 1 else 0.88, hspace=0.35, wspace=0.3, right=0.8)
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return path


def plot_result(result: Result, out_prefix: str | Path, metric: str = "psi") -> list[Path]:
    """Write the figures that apply to `result`; returns the written PNG paths.

    `<prefix>_bands.png` always; `<prefix>_vs_eps.png` / `<prefix>_vs_n.png` when the
    equal-budget, equal-size configurations span >= 2 eps / n values; `<prefix>_map.png` when
    owner 1's (n, eps) varies over a grid with the other owners fixed.
    """
    prefix = Path(out_prefix)
    prefix.parent.mkdir(parents=True, exist_ok=True)
    written = [plot_bands(result, Path(f"{prefix}_bands.png"), metric)]
    fm, _, keep = _final_data(result, metric)
    if fm.mean.size >= 2 and fm.eps.shape[1] > 0:
        for along in ("eps", "n"):
            p = plot_vs(result, fm, Path(f"{prefix}_vs_{along}.png"), metric, along)
            if p is not None:
                written.append(p)
        iso = np.array(
            [
                v if (v := result.configs[i].psi_isolated(0)) is not None else np.nan
                for i in keep
            ]
        )
        p = plot_map(result, fm, iso, Path(f"{prefix}_map.png"), metric)
        if p is not None:
            written.append(p)
    return written

