"""Figures of the asynchronous star method (spec async-star-cost-of-privacy, section 6).

- `plot_schedule`: owner served i_k and time t_k vs k, and the owners' shares of iterations with a
  chi-square test of uniformity (Figs 3 / 9).
- `plot_collaboration_map`: log10 E[psi(theta_L,T)] over (number of owners N, eps), cells where
  owner 1 gains from collaborating hatched (Fig 6; claims C3 / C4).
- `plot_facilities`: E[psi] per eps against every owner's isolated psi(theta*_i) vs n_i (Fig 7; C5).

Each plot returns the written paths, or [] when the result lacks what the figure needs. Files still
being written are read up to what they hold (configurations that have not reached the common last
iteration are left out, as in `fit.final_means`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import h5py  # noqa: E402
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.patches import Rectangle  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402
from scipy import stats  # noqa: E402

from mpi_dp.analysis.fit import _final_data  # noqa: E402
from mpi_dp.analysis.load import ConfigView, Result, ResultFileError  # noqa: E402
from mpi_dp.analysis.style import DPI, log_edges, on_eps_axis, title  # noqa: E402

METRIC = "psi"
MAX_LABELS = 20  # label the gaining owners on the facility figure up to this many


# ---------------------------------------------------------------------------------------------
# reading helpers
# ---------------------------------------------------------------------------------------------


def _dataset(c: ConfigView, name: str) -> np.ndarray | None:
    """A dataset of configuration `c` (e.g. "schedule/owner"), or None if absent."""
    d = c.group.get(name)
    return np.asarray(d[()]) if isinstance(d, h5py.Dataset) else None


def _n_owners(c: ConfigView) -> int:
    """N_c: the `owners` attribute, else the length of the per-owner eps vector."""
    if "owners" in c.attrs:
        return int(c.attrs["owners"])
    return int(c.eps.size)


def _common_eps(c: ConfigView) -> float | None:
    """The eps every owner shares, or None when owners differ (or none is recorded)."""
    if c.eps.size == 0 or not np.all(c.eps == c.eps[0]):
        return None
    return float(c.eps[0])


def _psi_isolated(c: ConfigView) -> np.ndarray | None:
    iso = c.reference().get("psi_isolated")
    return None if iso is None else np.atleast_1d(np.asarray(iso, dtype=float))


def _complete_configs(result: Result) -> list[tuple[ConfigView, float, float]]:
    """(config, mean, se) of final psi for configurations that reached the common last k."""
    try:
        fm, _, keep = _final_data(result, METRIC)
    except KeyError:  # a configuration with records but no psi metric
        return []
    return [
        (result.configs[i], float(fm.mean[r]), float(fm.se[r]))
        for r, i in enumerate(keep)
        if METRIC in result.configs[i].metric_names()
    ]


def _prefix(prefix: str | Path) -> Path:
    p = Path(prefix)
    p.parent.mkdir(parents=True, exist_ok=True)
    return p


# ---------------------------------------------------------------------------------------------
# Figs 3 / 9: schedule
# ---------------------------------------------------------------------------------------------


def schedule_uniformity(
    owner: np.ndarray, n_owners: int, rates: np.ndarray | None = None
) -> dict[str, Any]:
    """Counts and shares of iterations per owner and a chi-square goodness-of-fit test.

    `owner` holds 0-based owner indices (any shape, e.g. (runs, T)); negative entries (-1 after a
    run ended early) are ignored. The null hypothesis is P(i_k = j) = 1/N, or rates_j / sum(rates)
    when `rates` is given (unequal Poisson clocks). Returns dict(counts (N,) int, shares (N,),
    expected (N,) probabilities, total, chi2, p_value); chi2 / p_value are NaN with no entries.
    """
    if n_owners < 1:
        raise ValueError(f"n_owners must be >= 1, got {n_owners}")
    a = np.asarray(owner).ravel()
    a = a[a >= 0].astype(np.int64)
    if a.size and a.max() >= n_owners:
        raise ValueError(f"owner index {int(a.max())} out of range for {n_owners} owners")
    counts = np.bincount(a, minlength=n_owners)
    total = int(counts.sum())
    if rates is None:
        expected = np.full(n_owners, 1.0 / n_owners)
    else:
        r = np.asarray(rates, dtype=float)
        if r.shape != (n_owners,) or np.any(r <= 0):
            raise ValueError(f"rates must be {n_owners} positive numbers, got {r}")
        expected = r / r.sum()
    shares = counts / total if total else np.full(n_owners, np.nan)
    chi2 = p = float("nan")
    if total and n_owners >= 2:
        res = stats.chisquare(counts, f_exp=expected * total)
        chi2, p = float(res.statistic), float(res.pvalue)
    return {"counts": counts, "shares": shares, "expected": expected, "total": total,
            "chi2": chi2, "p_value": p}


def _schedule(c: ConfigView, path: Path) -> tuple[np.ndarray, np.ndarray | None, int] | None:
    """(owner (runs, T), time (runs, T) or None, N) of a configuration with a schedule."""
    owner = _dataset(c, "schedule/owner")
    if owner is None or owner.size == 0:
        return None
    owner = np.atleast_2d(owner).astype(np.int64)
    if not np.any(owner >= 0):
        return None
    n = max(_n_owners(c), 1)
    if owner.max() >= n:
        raise ResultFileError(
            f"{path}: configuration {c.index}: schedule/owner holds owner index {int(owner.max())} "
            f"but the configuration has {n} owners"
        )
    time = _dataset(c, "schedule/time")
    if time is not None:
        time = np.atleast_2d(time).astype(float)
        if time.ndim != 2 or time.shape[0] < 1:
            time = None
    return owner, time, n


def _declines_run0(c: ConfigView) -> tuple[np.ndarray, np.ndarray]:
    """(k, owner) of the declined queries of run 0, empty when not recorded."""
    d = _dataset(c, "schedule/declines")
    names = d.dtype.names if d is not None else None
    if d is None or not names or not {"run", "k", "owner"} <= set(names) or d.size == 0:
        return np.zeros(0), np.zeros(0)
    d = np.atleast_1d(d)
    sel = d["run"] == 0
    return d["k"][sel].astype(float), d["owner"][sel].astype(float)


def plot_schedule(result: Result, prefix: str | Path) -> list[Path]:
    """i_k and t_k vs k for run 0, and each owner's share of iterations over all runs.

    Uses the first configuration that has a schedule. Writes `<prefix>_schedule.png`.
    """
    for c in result.configs:
        sched = _schedule(c, result.path)
        if sched is not None:
            break
    else:
        return []
    owner, time, n = sched
    rates = c.attrs.get("rates")
    rates = np.asarray(rates, dtype=float) if rates is not None else None
    if rates is not None and (rates.shape != (n,) or np.any(rates <= 0)):
        rates = None
    u = schedule_uniformity(owner, n, rates)

    path = Path(f"{_prefix(prefix)}_schedule.png")
    fig = plt.figure(figsize=(11, 7.5))
    gs = fig.add_gridspec(2, 2, height_ratios=[1.1, 1.0], hspace=0.38, wspace=0.25)
    ax_i = fig.add_subplot(gs[0, :])
    ax_t = fig.add_subplot(gs[1, 0])
    ax_s = fig.add_subplot(gs[1, 1])

    k = np.arange(1, owner.shape[1] + 1)
    ok = owner[0] >= 0
    ax_i.scatter(k[ok], owner[0][ok] + 1, s=4 if ok.sum() > 300 else 10, color="C0", lw=0)
    dk, downer = _declines_run0(c)
    if dk.size:
        ax_i.scatter(dk, downer + 1, s=18, marker="x", color="C3", lw=0.8,
                     label=f"declined (budget), {dk.size}")
        ax_i.legend(fontsize=8, loc="upper right")
    ax_i.set_xlabel("iteration k")
    ax_i.set_ylabel("owner i_k (1-based)")
    ax_i.set_ylim(0.5, n + 0.5)
    ax_i.yaxis.set_major_locator(MaxNLocator(integer=True, nbins=min(n, 10)))
    ax_i.grid(True, alpha=0.3)
    ax_i.set_title(f"run 0 of {c.label}: owner served at each iteration", fontsize=9)

    if time is not None:
        t0 = time[0][: k.size]
        kt = k[: t0.size]
        good = np.isfinite(t0)
        ax_t.plot(kt[good], t0[good], color="C2", lw=1.2)
    else:
        ax_t.text(0.5, 0.5, "no schedule/time", ha="center", va="center", transform=ax_t.transAxes)
    ax_t.set_xlabel("iteration k")
    ax_t.set_ylabel("time t_k")
    ax_t.grid(True, alpha=0.3)
    ax_t.set_title("run 0: time of each iteration", fontsize=9)

    owners = np.arange(1, n + 1)
    ax_s.bar(owners, u["shares"], width=0.8, color="C0", alpha=0.8)
    if rates is None:
        ax_s.axhline(1.0 / n, color="C3", lw=1.2, ls="--", label=f"1/N = {1.0 / n:.3g}")
    else:
        ax_s.step(owners, u["expected"], where="mid", color="C3", lw=1.2, ls="--",
                  label="rate_j / sum(rates)")
    ax_s.legend(fontsize=8, loc="lower right")
    ax_s.set_xlabel("owner (1-based)")
    ax_s.set_ylabel("share of iterations")
    ax_s.xaxis.set_major_locator(MaxNLocator(integer=True, nbins=min(n, 10)))
    ax_s.grid(True, axis="y", alpha=0.3)
    ax_s.set_title(
        f"{owner.shape[0]} runs, {u['total']} iterations: chi2 = {u['chi2']:.3g}, "
        f"p = {u['p_value']:.3g}",
        fontsize=9,
    )
    sched = c.attrs.get("scheduler", "")
    fig.suptitle(title(result, f"schedule (scheduler {sched or '?'}, N = {n})"), fontsize=10)
    fig.subplots_adjust(left=0.08, right=0.97, bottom=0.08, top=0.88)
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return [path]


# ---------------------------------------------------------------------------------------------
# Fig 6: collaboration map over (N, eps)
# ---------------------------------------------------------------------------------------------


def collaboration_table(result: Result) -> list[dict[str, Any]]:
    """One row per complete configuration where every owner has the same eps, sorted by (eps, N).

    Keys: N, eps, mean (E psi(theta_L,T) over runs), se, psi_iso_1 (owner 1's isolated psi, NaN if
    not recorded), owner1_gains (mean < psi_iso_1; False when either is unknown).
    """
    rows = []
    for c, mean, se in _complete_configs(result):
        eps = _common_eps(c)
        if eps is None:
            continue
        iso = c.psi_isolated(0)
        iso = float("nan") if iso is None else float(iso)
        gains = bool(np.isfinite(mean) and np.isfinite(iso) and mean < iso)
        rows.append({"N": _n_owners(c), "eps": eps, "mean": mean, "se": se, "psi_iso_1": iso,
                     "owner1_gains": gains})
    rows.sort(key=lambda r: (r["eps"], r["N"]))
    return rows


def crossover(result: Result) -> dict[float, int | None]:
    """For each eps, the smallest N at which owner 1 gains (E psi < psi_iso_1); None if never."""
    out: dict[float, int | None] = {}
    for r in collaboration_table(result):
        cur = out.get(r["eps"])
        if r["owner1_gains"] and (cur is None or r["N"] < cur):
            out[r["eps"]] = r["N"]
        else:
            out.setdefault(r["eps"], None)
    return out


def plot_collaboration_map(result: Result, prefix: str | Path) -> list[Path]:
    """Heat map of log10 E[psi] over (N, eps); hatched cells: owner 1 gains by collaborating.

    Needs >= 2 distinct N and >= 2 distinct eps among equal-eps configurations with a finite
    mean. Writes `<prefix>_collab_map.png`.
    """
    table = [r for r in collaboration_table(result) if np.isfinite(r["mean"])
             and on_eps_axis(r["eps"])]
    Ns = np.unique([r["N"] for r in table]).astype(float)
    es = np.unique([r["eps"] for r in table])
    if Ns.size < 2 or es.size < 2:
        return []
    Z = np.full((Ns.size, es.size), np.nan)
    G = np.zeros((Ns.size, es.size), dtype=bool)
    for r in table:
        i, j = int(np.searchsorted(Ns, r["N"])), int(np.searchsorted(es, r["eps"]))
        if np.isnan(Z[i, j]):  # first configuration of a duplicate (N, eps) cell
            with np.errstate(divide="ignore", invalid="ignore"):
                Z[i, j] = np.log10(r["mean"]) if r["mean"] > 0 else np.nan
            G[i, j] = r["owner1_gains"]
    has_iso = any(np.isfinite(r["psi_iso_1"]) for r in table)

    path = Path(f"{_prefix(prefix)}_collab_map.png")
    fig, ax = plt.subplots(figsize=(8.5, 6))
    xe, ye = log_edges(es), log_edges(Ns)
    mesh = ax.pcolormesh(xe, ye, np.ma.masked_invalid(Z), cmap="viridis", shading="flat")
    for i, j in zip(*np.nonzero(G), strict=True):
        ax.add_patch(Rectangle((xe[j], ye[i]), xe[j + 1] - xe[j], ye[i + 1] - ye[i], fill=False,
                               hatch="//", edgecolor="white", lw=0.8))
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_yticks(Ns)
    ax.set_yticklabels([f"{int(v)}" for v in Ns])
    ax.minorticks_off()
    ax.set_xticks(es)
    ax.set_xticklabels([f"{v:.3g}" for v in es], rotation=45, fontsize=8)
    ax.set_xlabel("eps (every owner)")
    ax.set_ylabel("number of owners N")
    fig.colorbar(mesh, ax=ax, label=f"log10 E[{METRIC}(theta_L,T)]")
    cross = crossover(result)
    summary = "; ".join(
        f"{e:.3g}: {'never' if cross.get(float(e)) is None else cross[float(e)]}" for e in es
    )
    what = (
        "hatched: E psi < psi(theta*_1) of owner 1 alone (owner 1 gains)"
        if has_iso else "psi_isolated not recorded: no gain marks"
    )
    fig.suptitle(title(result, f"E[{METRIC}] over (N, eps); {what}"), fontsize=10)
    if has_iso:
        fig.text(0.01, 0.01, f"smallest N where owner 1 gains, by eps: {summary}", fontsize=7,
                 wrap=True)
    fig.subplots_adjust(left=0.1, right=0.97, bottom=0.2, top=0.88)
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return [path]


# ---------------------------------------------------------------------------------------------
# Fig 7: facilities (owners) that gain by collaborating
# ---------------------------------------------------------------------------------------------


def _facility_configs(result: Result) -> list[tuple[ConfigView, float, float, float, np.ndarray]]:
    """(config, eps, mean, se, psi_isolated) of equal-eps configurations with >= 2 isolated psi."""
    out = []
    for c, mean, se in _complete_configs(result):
        eps = _common_eps(c)
        iso = _psi_isolated(c)
        if eps is None or iso is None or iso.size < 2 or not np.isfinite(mean):
            continue
        out.append((c, eps, mean, se, iso))
    return out


def facility_gains(result: Result) -> list[dict[str, Any]]:
    """Per equal-eps configuration: which owners have psi(theta*_i) above E psi (they gain).

    Keys: eps, mean, se, owners (N), count (owners gaining), gaining (0-based indices, ascending).
    Sorted by eps.
    """
    rows: list[dict[str, Any]] = []
    for _, eps, mean, se, iso in _facility_configs(result):
        gaining = np.flatnonzero(iso > mean)
        rows.append({"eps": eps, "mean": mean, "se": se, "owners": int(iso.size),
                     "count": int(gaining.size), "gaining": [int(i) for i in gaining]})
    rows.sort(key=lambda r: r["eps"])
    return rows


def plot_facilities(result: Result, prefix: str | Path) -> list[Path]:
    """E[psi] per eps (horizontal lines) against psi(theta*_i) of every owner vs n_i (log-log).

    Writes `<prefix>_facilities.png`; [] when no configuration has psi_isolated of >= 2 owners and
    matching per-owner sizes n, or when those configurations differ in N (a sweep over the number
    of owners is `plot_collaboration_map`'s figure, not a facility comparison).
    """
    cfgs = [t for t in _facility_configs(result) if t[0].n.size == t[4].size]
    if not cfgs or len({t[4].size for t in cfgs}) > 1:
        return []
    cfgs.sort(key=lambda t: t[1])
    path = Path(f"{_prefix(prefix)}_facilities.png")
    fig, ax = plt.subplots(figsize=(9, 6))
    colors = plt.cm.plasma(np.linspace(0, 0.85, len(cfgs)))
    shown: list[tuple[np.ndarray, np.ndarray]] = []
    xs = np.concatenate([t[0].n.astype(float) for t in cfgs])
    xs = xs[xs > 0]
    x_lo, x_hi = (xs.min() / 1.3, xs.max() * 1.3) if xs.size else (1.0, 10.0)
    for (c, eps, mean, se, iso), color in zip(cfgs, colors, strict=True):
        n = c.n.astype(float)
        if not any(np.array_equal(n, a) and np.allclose(iso, b, equal_nan=True) for a, b in shown):
            first = not shown
            ax.scatter(n, iso, s=16, color="0.2" if first else color, marker="o" if first else "d",
                       zorder=3, label="psi(theta*_i), owner i alone" if first
                       else f"psi(theta*_i) of eps = {eps:g}")
            shown.append((n, iso))
        count = int(np.sum(iso > mean))
        if mean > 0:
            ax.axhline(mean, color=color, lw=1.6,
                       label=f"eps = {eps:g}: E psi = {mean:.3g}; {count} of {iso.size} owners gain")
            if np.isfinite(se) and se > 0 and mean - se > 0:
                ax.fill_between([x_lo, x_hi], mean - se, mean + se, color=color, alpha=0.2, lw=0)
    c, eps, mean, _, iso = cfgs[-1]
    gaining = np.flatnonzero(iso > mean)
    if gaining.size <= MAX_LABELS:
        for i in gaining:
            ax.annotate(str(i + 1), (c.n[i], iso[i]), textcoords="offset points", xytext=(3, 3),
                        fontsize=7)
    ax.set_xlim(x_lo, x_hi)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("n_i (records of owner i)")
    ax.set_ylabel(f"{METRIC}")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, loc="best")
    what = "owners above a line gain by collaborating at that eps"
    if 0 < gaining.size <= MAX_LABELS:
        what += f" (numbers: 1-based owners gaining at eps = {eps:g})"
    ax.set_title(title(result, what), fontsize=10)
    fig.subplots_adjust(left=0.1, right=0.97, bottom=0.1, top=0.88)
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return [path]
