"""Fit scaling laws to final metrics of a sweep (spec section 5, "Fitting constants from runs").

All fits are least squares in log space on M - M0, where M is the mean of the metric at the
final iteration over runs and M0 the floor (the eps = inf configuration with the same n).
Points with M - M0 < 3 SE are dropped. Confidence intervals bootstrap the runs.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from mpi_dp.analysis.load import Result

N_BOOT = 200
BOOT_SEED = 20240601


class FinalMeans(NamedTuple):
    """Per-configuration final statistics (configurations that reached the common last k)."""

    eps: np.ndarray  # (C, N) float
    n: np.ndarray  # (C, N) int
    mean: np.ndarray  # (C,)
    se: np.ndarray  # (C,)


def _mean_se(values: np.ndarray) -> tuple[float, float]:
    v = values[np.isfinite(values)]
    if v.size == 0:
        return float("nan"), float("nan")
    se = float(np.std(v, ddof=1) / np.sqrt(v.size)) if v.size > 1 else float("nan")
    return float(np.mean(v)), se


def _final_data(result: Result, metric: str) -> tuple[FinalMeans, list[np.ndarray], list[int]]:
    """Final statistics of complete-enough configurations, their per-run values and indices."""
    ks = [c.final_iteration() for c in result.configs]
    kmax = max(ks) if ks else -1
    keep = [i for i, k in enumerate(ks) if k >= 0 and k == kmax]
    width = max((result.configs[i].eps.size for i in keep), default=0)
    eps = np.full((len(keep), width), np.nan)
    n = np.zeros((len(keep), width), dtype=np.int64)
    mean = np.full(len(keep), np.nan)
    se = np.full(len(keep), np.nan)
    runs: list[np.ndarray] = []
    for row, i in enumerate(keep):
        c = result.configs[i]
        eps[row, : c.eps.size] = c.eps
        n[row, : c.n.size] = c.n
        values = c.final(metric)
        runs.append(values)
        mean[row], se[row] = _mean_se(values)
    return FinalMeans(eps, n, mean, se), runs, keep


def final_means(result: Result, metric: str = "psi") -> FinalMeans:
    """(eps, n, mean, se) per configuration at the final iteration.

    Only configurations whose last recorded iteration equals the largest one in the file are
    included (an interrupted sweep leaves later configurations short).
    """
    return _final_data(result, metric)[0]


def _lstsq_r2(X: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, float]:
    coef, *_ = np.linalg.lstsq(X, y, rcond=None)
    resid = y - X @ coef
    ss_tot = float(np.sum((y - y.mean()) ** 2))
    r2 = 1.0 - float(np.sum(resid**2)) / ss_tot if ss_tot > 0 else float("nan")
    return coef, r2


def _keep_mask(
    x: np.ndarray, diff: np.ndarray, se: np.ndarray | None
) -> np.ndarray:
    ok = np.isfinite(x) & (x > 0) & np.isfinite(diff) & (diff > 0)
    if se is not None:
        s = np.broadcast_to(np.asarray(se, dtype=float), diff.shape)
        ok &= ~(diff < 3.0 * np.where(np.isfinite(s), s, 0.0))
    return ok


def loglog_slope(
    x: np.ndarray,
    M: np.ndarray,
    M0: float | np.ndarray | None = None,
    se: np.ndarray | None = None,
) -> dict[str, Any]:
    """Least-squares fit log(M - M0) = intercept + slope * log(x).

    Points with M - M0 <= 0, non-finite values, or M - M0 < 3 * se (when `se` is given) are
    dropped. Returns dict(slope, intercept, r2, n_points, dropped); slope is NaN with < 2 points.
    """
    x = np.asarray(x, dtype=float)
    M = np.asarray(M, dtype=float)
    diff = M - (0.0 if M0 is None else np.asarray(M0, dtype=float))
    ok = _keep_mask(x, diff, se)
    out: dict[str, Any] = {
        "slope": float("nan"),
        "intercept": float("nan"),
        "r2": float("nan"),
        "n_points": int(ok.sum()),
        "dropped": int(x.size - ok.sum()),
    }
    if ok.sum() >= 2 and np.unique(x[ok]).size >= 2:
        X = np.column_stack([np.ones(ok.sum()), np.log(x[ok])])
        coef, r2 = _lstsq_r2(X, np.log(diff[ok]))
        out.update(intercept=float(coef[0]), slope=float(coef[1]), r2=r2)
    return out


def _equal_rows(fm: FinalMeans) -> np.ndarray:
    """Rows whose owners all share one eps and one n."""
    if fm.eps.shape[1] == 0:
        return np.zeros(fm.eps.shape[0], dtype=bool)
    same_eps = np.all(fm.eps == fm.eps[:, :1], axis=1)
    same_n = np.all(fm.n == fm.n[:, :1], axis=1)
    return same_eps & same_n


def _floor_index(fm: FinalMeans) -> np.ndarray:
    """For each row, the row of the all-eps-inf configuration with the same n vector, or -1."""
    inf_rows: np.ndarray | list[int] = (
        np.flatnonzero(np.all(np.isinf(fm.eps), axis=1)) if fm.eps.size else [])
    idx = np.full(fm.eps.shape[0], -1)
    for r in range(fm.eps.shape[0]):
        for j in inf_rows:
            if np.array_equal(fm.n[j], fm.n[r]):
                idx[r] = j
                break
    return idx


def _boot_means(runs: list[np.ndarray], n_boot: int, seed: int) -> np.ndarray:
    """(C, n_boot) bootstrap means; runs are resampled jointly (paired) when counts agree."""
    rng = np.random.default_rng(seed)
    sizes = {r.size for r in runs}
    out = np.full((len(runs), n_boot), np.nan)
    if len(sizes) == 1 and runs:
        R = sizes.pop()
        if R == 0:
            return out
        idx = rng.integers(0, R, size=(n_boot, R))
        for c, r in enumerate(runs):
            with np.errstate(invalid="ignore"):
                out[c] = np.nanmean(r[idx], axis=1) if np.isnan(r).any() else r[idx].mean(axis=1)
        return out
    for c, r in enumerate(runs):
        if r.size:
            idx = rng.integers(0, r.size, size=(n_boot, r.size))
            out[c] = np.nanmean(r[idx], axis=1)
    return out


def _ci(samples: np.ndarray) -> tuple[float, float]:
    s = samples[np.isfinite(samples)]
    if s.size < 10:
        return float("nan"), float("nan")
    lo, hi = np.percentile(s, [2.5, 97.5])
    return float(lo), float(hi)


def _diff_se(fm: FinalMeans, floor: np.ndarray) -> np.ndarray:
    se0 = np.where(floor >= 0, fm.se[np.maximum(floor, 0)], 0.0)
    return np.sqrt(np.nan_to_num(fm.se) ** 2 + np.nan_to_num(se0) ** 2)


def _floor_values(means: np.ndarray, floor: np.ndarray) -> np.ndarray:
    """M0 per row (broadcast over trailing bootstrap axis); 0 where there is no floor."""
    f = means[np.maximum(floor, 0)]
    mask = (floor >= 0).reshape((-1,) + (1,) * (means.ndim - 1))
    return np.where(mask, f, 0.0)


def _slope_fit(
    x: np.ndarray, rows: np.ndarray, fm: FinalMeans, boot: np.ndarray, floor: np.ndarray
) -> dict[str, Any]:
    M0 = _floor_values(fm.mean, floor)[rows]
    se = _diff_se(fm, floor)[rows]
    fit = loglog_slope(x, fm.mean[rows], M0, se)
    ok = _keep_mask(x, fm.mean[rows] - M0, se)
    slopes = np.full(boot.shape[1], np.nan)
    if ok.sum() >= 2:
        lx = np.log(x[ok])
        diff_b = boot[rows][ok] - _floor_values(boot, floor)[rows][ok]
        with np.errstate(invalid="ignore", divide="ignore"):
            ly = np.log(np.where(diff_b > 0, diff_b, np.nan))
        good = np.all(np.isfinite(ly), axis=0)
        X = np.column_stack([np.ones(lx.size), lx])
        if good.any():
            coef, *_ = np.linalg.lstsq(X, ly[:, good], rcond=None)
            slopes[good] = coef[1]
    fit["ci"] = _ci(slopes)
    return fit


def _joint_fit(
    rows: np.ndarray, fm: FinalMeans, boot: np.ndarray, floor: np.ndarray
) -> dict[str, Any] | None:
    n = fm.n[rows, 0].astype(float)
    eps = fm.eps[rows, 0]
    M0 = _floor_values(fm.mean, floor)[rows]
    diff = fm.mean[rows] - M0
    ok = _keep_mask(eps, diff, _diff_se(fm, floor)[rows]) & (n > 0)
    if ok.sum() < 4 or np.unique(n[ok]).size < 2 or np.unique(eps[ok]).size < 2:
        return None
    X = np.column_stack([np.ones(ok.sum()), np.log(n[ok]), np.log(eps[ok])])
    coef, r2 = _lstsq_r2(X, np.log(diff[ok]))
    diff_b = boot[rows][ok] - _floor_values(boot, floor)[rows][ok]
    with np.errstate(invalid="ignore", divide="ignore"):
        ly = np.log(np.where(diff_b > 0, diff_b, np.nan))
    good = np.all(np.isfinite(ly), axis=0)
    b_s = np.full(boot.shape[1], np.nan)
    c_s = np.full(boot.shape[1], np.nan)
    if good.any():
        cb, *_ = np.linalg.lstsq(X, ly[:, good], rcond=None)
        b_s[good], c_s[good] = cb[1], cb[2]
    return {
        "kind": "joint",
        "a": float(coef[0]),
        "b": float(coef[1]),
        "c": float(coef[2]),
        "b_ci": _ci(b_s),
        "c_ci": _ci(c_s),
        "r2": r2,
        "n_points": int(ok.sum()),
        "dropped": int(rows.size - ok.sum()),
    }


def predictor(eps: np.ndarray, n: np.ndarray) -> np.ndarray:
    """P = sum_i eps_i^-2 / (sum_i n_i)^2 per row of (C, N) arrays (or one (N,) vector)."""
    eps = np.atleast_2d(np.asarray(eps, dtype=float))
    n = np.atleast_2d(np.asarray(n, dtype=float))
    with np.errstate(divide="ignore", over="ignore"):  # eps beyond 1e154: eps^-2 is 0
        inv = np.where(np.isnan(eps), 0.0, 1.0 / eps**2)
    return inv.sum(axis=1) / n.sum(axis=1) ** 2


def fixed_exponent_constant(result: Result, metric: str = "psi") -> dict[str, Any] | None:
    """K = exp(mean(log(M - M0) - log P)) over all configurations with P > 0.

    Returns dict(kind="constant", K, r2 (log space), max_abs_log10_resid, n_points, dropped),
    or None when fewer than two configurations qualify.
    """
    fm, _, _ = _final_data(result, metric)
    if fm.mean.size == 0:
        return None
    floor = _floor_index(fm)
    P = predictor(fm.eps, fm.n)
    diff = fm.mean - _floor_values(fm.mean, floor)
    ok = _keep_mask(P, diff, _diff_se(fm, floor))
    if ok.sum() < 2:  # one point fits any constant exactly: nothing would be tested
        return None
    ly = np.log(diff[ok])
    lp = np.log(P[ok])
    logK = float(np.mean(ly - lp))
    resid = ly - (logK + lp)
    ss_tot = float(np.sum((ly - ly.mean()) ** 2))
    r2 = 1.0 - float(np.sum(resid**2)) / ss_tot if ss_tot > 0 else float("nan")
    return {
        "kind": "constant",
        "K": float(np.exp(logK)),
        "r2": r2,
        "max_abs_log10_resid": float(np.max(np.abs(resid)) / np.log(10)),
        "n_points": int(ok.sum()),
        "dropped": int((P > 0).sum() - ok.sum()),
    }


def fit_slopes(
    result: Result, metric: str = "psi", n_boot: int = N_BOOT, seed: int = BOOT_SEED
) -> list[dict[str, Any]]:
    """Log-log slopes of the final mean metric over the equal-budget, equal-size sub-grid.

    Returns dicts with `kind`:
    - "eps": slope vs eps at fixed n (`fixed` = {"n": value}); needs >= 3 finite eps values;
    - "n": slope vs per-owner n at fixed eps (`fixed` = {"eps": value}); needs >= 3 n values;
    - "joint": log(M - M0) = a + b log n + c log eps, with b_ci, c_ci;
    - "constant": fixed-exponent K (see `fixed_exponent_constant`).
    Slope entries carry slope, intercept, r2, n_points, dropped and ci (bootstrap 95 %).
    """
    fm, runs, _ = _final_data(result, metric)
    out: list[dict[str, Any]] = []
    if fm.mean.size == 0:
        return out
    floor = _floor_index(fm)
    boot = _boot_means(runs, n_boot, seed)
    eq = _equal_rows(fm)
    finite = eq & np.isfinite(fm.eps[:, 0]) & (fm.eps[:, 0] > 0) if fm.eps.shape[1] else eq
    if fm.eps.shape[1]:
        e0 = fm.eps[:, 0]
        n0 = fm.n[:, 0]
        for nv in np.unique(n0[finite]):
            rows = np.flatnonzero(finite & (n0 == nv))
            if np.unique(e0[rows]).size >= 3:
                rows = rows[np.argsort(e0[rows])]
                fit = _slope_fit(e0[rows], rows, fm, boot, floor)
                fit.update(kind="eps", fixed={"n": int(nv)}, floor=bool(np.any(floor[rows] >= 0)))
                out.append(fit)
        for ev in np.unique(e0[finite]):
            rows = np.flatnonzero(finite & (e0 == ev))
            if np.unique(n0[rows]).size >= 3:
                rows = rows[np.argsort(n0[rows])]
                fit = _slope_fit(n0[rows].astype(float), rows, fm, boot, floor)
                fit.update(kind="n", fixed={"eps": float(ev)}, floor=bool(np.any(floor[rows] >= 0)))
                out.append(fit)
        joint = _joint_fit(np.flatnonzero(finite), fm, boot, floor)
        if joint is not None:
            out.append(joint)
    const = fixed_exponent_constant(result, metric)
    if const is not None:
        out.append(const)
    return out
