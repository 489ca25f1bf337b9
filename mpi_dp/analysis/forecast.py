"""Cost-of-privacy forecasting: fit the bound (11) to sweeps and predict E[psi] for a coalition.

Spec async-star-cost-of-privacy.md section 4 ("Fitting c1bar', c2bar' to experiments") and section 5
(value of collaboration). Each configuration j of a result file (sync_star or async_star) gives
n_j = sum_i n_i, S_j = sum_i 1/eps_i^2 (eps = inf adds 0), the mean M_j of the final metric over
runs and its standard error. The floor M0_j is the all-eps-inf configuration with the same n vector
(and the same T, rho, ...) in the same file; y_j = M_j - M0_j, and points with y_j < 3 SE(y_j) are
dropped. With u = sqrt(S)/n and v = S/n^2 the excess is modelled as

    nnls: y = a u + b v     (a = c1bar', b = c2bar' >= 0, least squares in relative error)
    log:  y = b_log v       (a = 0, b_log = exp(mean(log y - log v)); the authors' code)

The paper's per-owner constant K (E psi = K/(n_i^2 eps^2) for N equal owners) is K = b/N.
Pure NumPy/SciPy; no MPI.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from scipy.optimize import nnls

from mpi_dp.analysis.fit import _mean_se
from mpi_dp.analysis.load import ConfigView, Result, open_result
from mpi_dp.errors import MpiDpError

FORMAT = "mpi_dp.forecast"
FORMAT_VERSION = 1
KINDS = ("nnls", "log")
#: attributes that must agree between a configuration and its eps = inf floor (besides n)
FLOOR_MATCH_KEYS = ("T", "rho", "lam", "theta_max", "central_step", "mode", "scheduler", "protocol")


class ForecastError(MpiDpError, ValueError):
    """A forecast that cannot be fitted or evaluated; the message says why and what to do."""


# ----------------------------------------------------------------------------------- data


def inv_eps_sq_sum(eps: Sequence[float] | np.ndarray) -> float:
    """S = sum_i 1/eps_i^2; an owner with eps = inf (no privacy) contributes 0, and so (to
    rounding) does one with eps beyond 1e154, where eps^2 overflows."""
    e = np.asarray(eps, dtype=float)
    with np.errstate(divide="ignore", over="ignore"):
        return float(np.sum(np.where(np.isinf(e), 0.0, 1.0 / e**2)))


def _same_setting(a: ConfigView, b: ConfigView) -> bool:
    """Same n vector and the same optimisation settings (where both record them)."""
    if not np.array_equal(a.n, b.n):
        return False
    for key in FLOOR_MATCH_KEYS:
        if key in a.attrs and key in b.attrs:
            va, vb = np.asarray(a.attrs[key]), np.asarray(b.attrs[key])
            if va.shape != vb.shape or not np.all(va == vb):
                return False
    return True


def _complete_configs(result: Result) -> tuple[list[ConfigView], int]:
    """Configurations that reached the last iteration of their T group; and how many did not."""
    with_data = [c for c in result.configs if c.n_records() > 0 and c.n.size > 0]
    last: dict[Any, int] = {}
    for c in with_data:
        key = json.dumps(c.attrs.get("T"), default=str)
        last[key] = max(last.get(key, -1), c.final_iteration())
    keep = [c for c in with_data if c.final_iteration() == last[json.dumps(c.attrs.get("T"), default=str)]]
    return keep, len(result.configs) - len(keep)


def _owner_sizes(result: Result, cfgs: list[ConfigView]) -> list[tuple[int, float]]:
    """(n_i, psi_isolated_i) pairs recorded in reference/psi_isolated, without repeats."""
    seen: set[tuple[int, float]] = set()
    out = []
    for c in cfgs:
        iso = c.reference().get("psi_isolated")
        if iso is None:
            continue
        iso = np.atleast_1d(np.asarray(iso, dtype=float))
        for ni, p in zip(c.n, iso, strict=False):
            pair = (int(ni), float(p))
            if np.isfinite(p) and p > 0 and ni > 0 and pair not in seen:
                seen.add(pair)
                out.append(pair)
    return out


def collect_points(
    result: Result, metric: str = "psi"
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[tuple[int, float]], int]:
    """Points (finite-eps configurations with their floor), floors, (n_i, psi_iso) pairs, incomplete.

    Raises ForecastError when a finite-eps configuration has no eps = inf floor in the file.
    """
    cfgs, incomplete = _complete_configs(result)
    floors_cv = [c for c in cfgs if np.all(np.isinf(c.eps))]
    stats = {c.index: _mean_se(c.final(metric)) for c in cfgs}
    src = str(result.path)
    floors = [
        {
            "owners": int(c.n.size), "n": [int(x) for x in c.n], "n_total": int(c.n.sum()),
            "psi": stats[c.index][0], "se": stats[c.index][1], "source": src, "config": c.index,
            "label": c.label,
        }
        for c in floors_cv
        if np.isfinite(stats[c.index][0])
    ]
    points: list[dict[str, Any]] = []
    missing: list[str] = []
    for c in cfgs:
        if np.all(np.isinf(c.eps)):
            continue
        eps = np.broadcast_to(c.eps, c.n.shape) if c.eps.size == 1 else c.eps  # one eps for all
        match = next((f for f in floors_cv if _same_setting(c, f)), None)
        if match is None:
            missing.append(f"{c.index} ({c.label}, n = {[int(x) for x in c.n]})")
            continue
        M, se = stats[c.index]
        M0, se0 = stats[match.index]
        y = M - M0
        se_y = math.hypot(0.0 if not np.isfinite(se) else se, 0.0 if not np.isfinite(se0) else se0)
        used = bool(np.isfinite(y) and y > 0 and y >= 3.0 * se_y)
        points.append({
            "source": src, "config": c.index, "label": c.label, "owners": int(c.n.size),
            "n": [int(x) for x in c.n], "eps": [float(x) for x in eps],
            "n_total": int(c.n.sum()), "S": inv_eps_sq_sum(eps), "mean": M, "se": se,
            "floor": M0, "floor_se": se0, "floor_config": match.index, "y": y, "se_y": se_y,
            "used": used,
        })
    if missing:
        shown = "; ".join(missing[:5]) + (f"; ... ({len(missing)} in all)" if len(missing) > 5 else "")
        raise ForecastError(
            f"{src}: no eps = inf configuration with the same n vector (and T, rho, ...) for "
            f"configuration(s) {shown}. The floor M0 (the optimisation error without noise) must be "
            "subtracted before fitting the bound: add inf to sweep.eps (e.g. --set "
            "'sweep.eps=[0.1, 1, 10, inf]') and run the sweep again."
        )
    return points, floors, _owner_sizes(result, cfgs), incomplete


# ----------------------------------------------------------------------------------- fits


def regressors(n_total: np.ndarray | float, S: np.ndarray | float) -> tuple[np.ndarray, np.ndarray]:
    """u = sqrt(S)/n and v = S/n^2 (the two terms of bound (11))."""
    n = np.asarray(n_total, dtype=float)
    S = np.asarray(S, dtype=float)
    return np.sqrt(S) / n, S / n**2


def nnls_relative(u: np.ndarray, v: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """(a, b) >= 0 minimising sum(((a u + b v - y)/y)^2): NNLS on rows divided by y.

    Columns are scaled to unit norm first (u and v differ by many decades).
    """
    A = np.column_stack([u / y, v / y])
    scale = np.linalg.norm(A, axis=0)
    scale[scale == 0] = 1.0
    x, _ = nnls(A / scale, np.ones_like(y))
    a, b = x / scale
    return float(a), float(b)


def log_constant(v: np.ndarray, y: np.ndarray) -> float:
    """b = exp(mean(log y - log v)): the one-parameter fit y = b v in log space."""
    return float(np.exp(np.mean(np.log(y) - np.log(v))))


def _fit_both(u: np.ndarray, v: np.ndarray, y: np.ndarray) -> dict[str, tuple[float, float]]:
    return {"nnls": nnls_relative(u, v, y), "log": (0.0, log_constant(v, y))}


def _log_quality(pred: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """(R^2 of log y against log pred, max |log10 residual|)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        r = np.log(y) - np.log(pred)
    ly = np.log(y)
    ss_tot = float(np.sum((ly - ly.mean()) ** 2))
    if not np.all(np.isfinite(r)):
        return float("nan"), float("inf")
    r2 = 1.0 - float(np.sum(r**2)) / ss_tot if ss_tot > 0 else float("nan")
    return r2, float(np.max(np.abs(r)) / np.log(10))


def ratio_factor(pred: np.ndarray | float, obs: np.ndarray | float) -> np.ndarray:
    """max(pred/obs, obs/pred); inf where either is <= 0."""
    p = np.asarray(pred, dtype=float)
    o = np.asarray(obs, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        f = np.maximum(p / o, o / p)
    return np.where((p > 0) & (o > 0) & np.isfinite(f), f, np.inf)


def _loo(u: np.ndarray, v: np.ndarray, y: np.ndarray, M0: np.ndarray, M: np.ndarray) -> dict[str, np.ndarray]:
    """Leave-one-out factors on E[psi] = M0 + excess, per kind (NaN with < 3 points)."""
    m = y.size
    out = {k: np.full(m, np.nan) for k in KINDS}
    if m < 3:
        return out
    for j in range(m):
        keep = np.arange(m) != j
        fits = _fit_both(u[keep], v[keep], y[keep])
        for k, (a, b) in fits.items():
            out[k][j] = ratio_factor(M0[j] + a * u[j] + b * v[j], M[j])
    return out


def _nan_to_none(obj: Any) -> Any:
    if isinstance(obj, float) and not math.isfinite(obj):
        return None if math.isnan(obj) else ("inf" if obj > 0 else "-inf")
    if isinstance(obj, dict):
        return {k: _nan_to_none(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_nan_to_none(v) for v in obj]
    if isinstance(obj, np.generic):
        return _nan_to_none(obj.item())
    return obj


def _none_to_nan(obj: Any, key: str = "") -> Any:
    if obj is None and key not in ("kappa", "kappa_max_log10_residual"):
        return float("nan")
    if obj == "inf":
        return float("inf")
    if obj == "-inf":
        return float("-inf")
    if isinstance(obj, dict):
        return {k: _none_to_nan(v, k) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_none_to_nan(v) for v in obj]
    return obj


@dataclass
class BoundFit:
    """Fitted constants of E[psi] <= M0 + a sqrt(S)/n + b S/n^2, floors and the isolated model.

    Per-kind quality measures are dicts keyed by "nnls" and "log": r2_log (R^2 in log space of the
    excess), max_log10_residual, loo_factor_median / loo_factor_max (leave-one-out factor
    max(pred/obs, obs/pred) on E[psi] over the usable configurations).
    """

    metric: str
    a: float
    b: float
    b_log: float
    K: float
    K_log: float
    owners: list[int]
    r2_log: dict[str, float]
    max_log10_residual: dict[str, float]
    loo_factor_median: dict[str, float]
    loo_factor_max: dict[str, float]
    n_points: int
    n_dropped: int
    n_incomplete: int
    points: list[dict[str, Any]]
    floors: list[dict[str, Any]]
    kappa: float | None
    kappa_points: int
    kappa_max_log10_residual: float | None
    ranges: dict[str, list[float]]
    sources: list[str]
    algorithms: list[str] = field(default_factory=list)
    max_psi: float = math.inf
    n_above_max: int = 0

    def coefficients(self, kind: str = "nnls") -> tuple[float, float]:
        """(a, b) of the excess a u + b v for `kind`."""
        if kind == "nnls":
            return self.a, self.b
        if kind == "log":
            return 0.0, self.b_log
        raise ForecastError(f"unknown fit kind {kind!r}; use one of {', '.join(KINDS)}")

    def n_scale(self, N: int | None) -> float:
        """N / N_fit when the fit saw one number of owners N_fit, else 1.

        Bound (10) has c1bar = sqrt(8N) c1 and c2bar = 8N c2: at fixed (T, rho) the constants grow
        with N, so a coalition of another size uses a sqrt(N/N_fit) and b N/N_fit (that is, the
        per-owner constant K = b/N stays).
        """
        if N is None or len(self.owners) != 1 or N == self.owners[0]:
            return 1.0
        return N / self.owners[0]

    def excess(self, n_total: float, S: float, kind: str = "nnls", N: int | None = None) -> float:
        """Predicted E[psi] - floor = a sqrt(S)/n + b S/n^2 (constants scaled to N owners)."""
        a, b = self.coefficients(kind)
        u, v = regressors(n_total, S)
        g = self.n_scale(N)
        return float(a * math.sqrt(g) * u + b * g * v)

    def floor_for(self, n_total: float, N: int) -> tuple[float, str]:
        """Floor of the stored eps = inf configuration nearest in log n (same N if any), and a note."""
        if not self.floors:
            raise ForecastError("the fit stores no eps = inf floor; refit with inf in sweep.eps")
        same = [f for f in self.floors if f["owners"] == N]
        pool = same or self.floors
        best = min(pool, key=lambda f: abs(math.log(f["n_total"]) - math.log(n_total)))
        where = f"{Path(best['source']).name} config {best['config']}"
        if same:
            note = f"eps = inf floor of N = {N}, n = {best['n_total']} ({where})"
        else:
            note = (f"no floor with N = {N} in the fit; nearest n of any N: eps = inf floor of "
                    f"N = {best['owners']}, n = {best['n_total']} ({where})")
        return float(best["psi"]), note

    def predict(self, n_total: float, S: float, N: int, kind: str = "nnls") -> float:
        """E[psi] = floor (nearest stored) + a sqrt(S)/n + b S/n^2 (scaled to N owners)."""
        return self.floor_for(n_total, N)[0] + self.excess(n_total, S, kind, N)

    def to_json(self) -> str:
        """JSON text (non-finite numbers as null / "inf")."""
        data = {"format": FORMAT, "format_version": FORMAT_VERSION, **asdict(self)}
        return json.dumps(_nan_to_none(data), indent=1)

    @classmethod
    def from_json(cls, text: str, name: str = "forecast JSON") -> BoundFit:
        """Inverse of to_json; `name` (a path) is used in error messages."""
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ForecastError(f"{name}: not JSON ({exc})") from exc
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise ForecastError(f"{name}: not an mpi-dp forecast file (format != {FORMAT!r}); "
                                "write one with `mpi-dp forecast fit RESULT.h5`")
        version = data.get("format_version", 0)
        if not isinstance(version, int):
            raise ForecastError(f"{name}: format_version {version!r} is not an integer; write the "
                                "file again with `mpi-dp forecast fit RESULT.h5`")
        if version > FORMAT_VERSION:
            raise ForecastError(f"{name}: forecast format_version {data['format_version']} is newer "
                                "than this reader; upgrade mpi_dp")
        data = {k: v for k, v in data.items() if k not in ("format", "format_version")}
        data = _none_to_nan(data)
        try:
            return cls(**data)
        except TypeError as exc:
            raise ForecastError(f"{name}: malformed forecast file ({exc})") from exc

    def save(self, path: str | Path) -> Path:
        """Write to_json() to `path`."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(self.to_json() + "\n")
        return path

    @classmethod
    def load(cls, path: str | Path) -> BoundFit:
        """Read a file written by save()."""
        path = Path(path)
        if not path.exists():
            raise ForecastError(f"forecast file not found: {path}")
        try:
            text = path.read_text()
        except OSError as exc:
            raise ForecastError(f"forecast file {path}: cannot read: {exc.strerror or exc}"
                                ) from None
        except UnicodeDecodeError:
            raise ForecastError(f"{path}: not JSON (binary content); give the .forecast.json "
                                "that `mpi-dp forecast fit RESULT.h5` wrote") from None
        return cls.from_json(text, name=str(path))


def _kappa(pairs: list[tuple[int, float]]) -> tuple[float | None, float | None]:
    """psi_iso ~ kappa / n_i in log space: kappa = exp(mean(log psi + log n)), max |log10 resid|."""
    if not pairs:
        return None, None
    n = np.array([p[0] for p in pairs], dtype=float)
    psi = np.array([p[1] for p in pairs], dtype=float)
    r = np.log(psi) + np.log(n)
    lk = float(np.mean(r))
    return float(np.exp(lk)), float(np.max(np.abs(r - lk)) / np.log(10))


#: default largest E[psi] of a fitted point: beyond it the model is useless and clipping distorts
#: the scaling (the heavily clipped regime of spec §9), so such points are left out of the fit
DEFAULT_MAX_PSI = 10.0


def fit_bound(
    results: Result | str | Path | Sequence[Result | str | Path], metric: str = "psi",
    max_psi: float = DEFAULT_MAX_PSI,
) -> BoundFit:
    """Fit both forms of the bound to one or more result files (open Results or paths).

    Configurations whose E[metric] exceeds `max_psi` are shown but not fitted (math.inf keeps all).
    """
    items = [results] if isinstance(results, Result | str | Path) else list(results)
    if not items:
        raise ForecastError("fit_bound needs at least one result file")
    points: list[dict[str, Any]] = []
    floors: list[dict[str, Any]] = []
    pairs: list[tuple[int, float]] = []
    incomplete = 0
    sources, algorithms = [], []
    for item in items:
        res = open_result(item) if isinstance(item, str | Path) else item
        try:
            pts, f, iso, inc = collect_points(res, metric)
            sources.append(str(res.path))
            algorithms.append(res.algorithm + (f"/{res.variant}" if res.variant else ""))
        finally:
            if res is not item:
                res.close()
        points += pts
        floors += f
        pairs += [x for x in iso if x not in pairs]
        incomplete += inc
    n_above = 0
    for p in points:
        p["above_max"] = bool(p["used"] and p["mean"] > max_psi)
        if p["above_max"]:
            p["used"] = False
            n_above += 1
    used = [p for p in points if p["used"]]
    names = ", ".join(sources)
    if not points:
        raise ForecastError(f"{names}: no configuration with a finite eps (the sweep needs finite "
                            "eps values as well as inf)")
    if not used:
        raise ForecastError(
            f"{names}: all {len(points)} finite-eps configurations are within 3 standard errors of "
            "their eps = inf floor, so the privacy cost is not measurable; use smaller eps or n, "
            "or more runs"
        )
    n_tot = np.array([p["n_total"] for p in used], dtype=float)
    S = np.array([p["S"] for p in used])
    y = np.array([p["y"] for p in used])
    M = np.array([p["mean"] for p in used])
    M0 = np.array([p["floor"] for p in used])
    u, v = regressors(n_tot, S)
    fits = _fit_both(u, v, y)
    loo = _loo(u, v, y, M0, M)
    r2, mlr, med, mx = {}, {}, {}, {}
    for k, (a, b) in fits.items():
        r2[k], mlr[k] = _log_quality(a * u + b * v, y)
        med[k] = float(np.median(loo[k])) if np.isfinite(loo[k]).any() else float("nan")
        mx[k] = float(np.max(loo[k])) if not np.isnan(loo[k]).all() else float("nan")
    for p in points:  # fitted E[psi] per kind and the sqrt-term share a u / (a u + b v)
        pu, pv = regressors(p["n_total"], p["S"])
        for k, (ak, bk) in fits.items():
            p[f"fit_{k}"] = float(p["floor"] + ak * pu + bk * pv)
        ex = fits["nnls"][0] * pu + fits["nnls"][1] * pv
        p["share_sqrt"] = float(fits["nnls"][0] * pu / ex) if ex > 0 else float("nan")
    owners = sorted({p["owners"] for p in used})
    one_n = len(owners) == 1
    a, b = fits["nnls"]
    b_log = fits["log"][1]
    kappa, kappa_resid = _kappa(pairs)
    return BoundFit(
        metric=metric, a=a, b=b, b_log=b_log,
        K=b / owners[0] if one_n else float("nan"),
        K_log=b_log / owners[0] if one_n else float("nan"),
        owners=owners, r2_log=r2, max_log10_residual=mlr, loo_factor_median=med, loo_factor_max=mx,
        n_points=len(used), n_dropped=len(points) - len(used) - n_above, n_incomplete=incomplete,
        max_psi=float(max_psi), n_above_max=n_above,
        points=points, floors=floors, kappa=kappa, kappa_points=len(pairs),
        kappa_max_log10_residual=kappa_resid,
        ranges={"n_total": [float(n_tot.min()), float(n_tot.max())], "S": [float(S.min()), float(S.max())]},
        sources=sources, algorithms=algorithms,
    )


# ----------------------------------------------------------------------------------- predict


def _broadcast(name: str, values: Sequence[float] | float, N: int) -> list[float]:
    vals = [float(x) for x in np.atleast_1d(np.asarray(values, dtype=float))]
    if len(vals) == 1:
        return vals * N
    if len(vals) != N:
        raise ForecastError(f"{name}: {len(vals)} values for {N} owners (give one value or one per owner)")
    return vals


def predict_coalition(
    fit: BoundFit,
    n: Sequence[float] | float,
    eps: Sequence[float] | float,
    psi_isolated: Sequence[float] | float | None = None,
    kind: str = "nnls",
    owners: int | None = None,
) -> dict[str, Any]:
    """Predict E[psi] of a coalition and whether each owner gains by joining.

    n, eps: per owner (or scalars with `owners`); eps may be inf. psi_isolated: per owner (or one
    value) psi(theta*_i); default kappa / n_i from the fit. Owner i joins iff the predicted
    E[psi] (of `kind`) < psi_isolated_i. Returns a dict with n_total, S, floor, floor_note,
    excess / predicted per kind, prediction, the fit's held-out factors, notes and `verdicts`.
    """
    fit.coefficients(kind)
    N = owners or max(np.atleast_1d(n).size, np.atleast_1d(eps).size)
    n_v = _broadcast("n", n, N)
    e_v = _broadcast("eps", eps, N)
    if any(not (x > 0) or not math.isfinite(x) for x in n_v):
        raise ForecastError(f"n: every owner needs a positive finite number of records, got {n_v}")
    if any(not (x > 0) for x in e_v):
        raise ForecastError(f"eps: every budget must be > 0 (inf for no privacy), got {e_v}")
    n_total = float(sum(n_v))
    S = inv_eps_sq_sum(e_v)
    floor, floor_note = fit.floor_for(n_total, N)
    excess = {k: fit.excess(n_total, S, k, N) for k in KINDS}
    predicted = {k: floor + excess[k] for k in KINDS}
    a, _ = fit.coefficients(kind)
    u, v = regressors(n_total, S)
    g = fit.n_scale(N)
    share = float(a * math.sqrt(g) * u / excess[kind]) if excess[kind] > 0 else float("nan")
    notes = []
    lo_n, hi_n = fit.ranges["n_total"]
    lo_s, hi_s = fit.ranges["S"]
    if not lo_n <= n_total <= hi_n:
        notes.append(f"n = {n_total:g} is outside the fitted range [{lo_n:g}, {hi_n:g}] (extrapolation)")
    if S > 0 and not lo_s <= S <= hi_s:
        notes.append(f"S = {S:g} is outside the fitted range [{lo_s:g}, {hi_s:g}] (extrapolation)")
    if N not in fit.owners:
        notes.append(f"N = {N} owners was not in the fit (fitted N: {fit.owners})"
                     + (f"; constants scaled by N/N_fit = {g:.4g} as bound (10) says "
                        "(c2bar = 8 N c2: the per-owner K = b/N is kept)" if g != 1.0 else ""))
    if psi_isolated is not None:
        iso = _broadcast("psi_isolated", psi_isolated, N)
        iso_src = ["given"] * N
    elif fit.kappa is not None:
        iso = [fit.kappa / x for x in n_v]
        iso_src = ["kappa/n_i"] * N
    else:
        iso = [float("nan")] * N
        iso_src = ["unknown"] * N
    pred = predicted[kind]
    verdicts = [
        {
            "owner": i, "n": n_v[i], "eps": e_v[i], "psi_isolated": iso[i], "psi_isolated_from": iso_src[i],
            "joins": (bool(pred < iso[i]) if math.isfinite(iso[i]) else None),
        }
        for i in range(N)
    ]
    return {
        "owners": N, "n": n_v, "eps": e_v, "n_total": n_total, "S": S, "u": float(u), "v": float(v),
        "floor": floor, "floor_note": floor_note, "excess": excess, "predicted": predicted,
        "kind": kind, "prediction": pred, "sqrt_share": share,
        "loo_factor_median": fit.loo_factor_median[kind], "loo_factor_max": fit.loo_factor_max[kind],
        "notes": notes, "verdicts": verdicts,
    }
