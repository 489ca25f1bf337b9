"""`mpi-dp forecast fit|predict`: fit the cost-of-privacy bound to sweeps, predict coalitions.

The lead's cli.py creates the `forecast` parser and calls add_forecast_arguments(parser) and, for
the parsed arguments, run_forecast_command(args). Errors are raised as MpiDpError subclasses.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path
from typing import Any

from mpi_dp.analysis.forecast import (
    DEFAULT_MAX_PSI,
    KINDS,
    BoundFit,
    ForecastError,
    fit_bound,
    predict_coalition,
)

FORECAST_DESCRIPTION = """\
Forecast the cost of privacy of a coalition from finished sweeps (spec section 4, bound (11)):

  E[psi] ~ M0 + a sqrt(S)/n + b S/n^2,   n = sum_i n_i,  S = sum_i 1/eps_i^2 (eps = inf adds 0)

M0 is the eps = inf floor (optimisation error). `fit` estimates a (c1bar') and b (c2bar') from
result files; `predict` evaluates the fit for a proposed coalition and says, per owner, whether
joining beats the owner's isolated model theta*_i (value of collaboration).

Examples:
  mpi-dp forecast fit results/async_fig45_grid.h5
  mpi-dp forecast predict --fit results/async_fig45_grid.forecast.json --n 10000 --owners 8 --eps 1
"""

FIT_DESCRIPTION = """\
Fit the bound constants to one or more sweep result files (sync_star or async_star).

Per finite-eps configuration j: n_j = sum n_i, S_j = sum 1/eps_i^2, M_j = mean of the final metric
over runs (SE_j its standard error). M0_j = the all-eps-inf configuration with the same n vector
(and T, rho, ...) in the same file; y_j = M_j - M0_j; points with y_j < 3 SE(y_j) are dropped.
With u = sqrt(S)/n and v = S/n^2:

  nnls  a, b >= 0 minimising sum_j ((a u_j + b v_j - y_j) / y_j)^2   (relative error)
  log   a = 0, b = exp(mean_j(log y_j - log v_j))                    (the authors' code)

Also reported: K = b/N, the paper's per-owner form E psi = K/(n_i^2 eps^2) for N equal owners
(the lending c2bar' = 2.1e9 is a K, i.e. b = 3 K); R^2 and max |log10 residual| in log space;
the leave-one-out factor max(pred/obs, obs/pred) on E[psi] (refit without j, predict j);
the floors per (N, n); kappa of psi(theta*_i) ~ kappa/n_i from reference/psi_isolated.
The sweep must include eps = inf (e.g. --set 'sweep.eps=[0.1, 1, 10, inf]').

Examples:
  mpi-dp forecast fit results/async_fig45_grid.h5
  mpi-dp forecast fit results/async_fig45_grid.h5 results/async_fig6_collab.h5 --out fits/lending.json
"""

PREDICT_DESCRIPTION = """\
Predict E[psi] of a proposed coalition from a fit written by `mpi-dp forecast fit`:

  E[psi] = M0 + a sqrt(S)/n + b S/n^2    (both kinds are printed; --kind picks the one for verdicts)

M0 is the stored eps = inf floor nearest in log n with the same number of owners N (else the
nearest of any N). Owner i gains by joining iff E[psi] < psi(theta*_i), its isolated optimum;
psi(theta*_i) is kappa / n_i from the fit unless --psi-isolated gives it. The held-out
(leave-one-out) error of the fit is printed with the prediction.

Examples:
  mpi-dp forecast predict --fit results/async_fig45_grid.forecast.json --n 10000 10000 10000 --eps 1 1 1
  mpi-dp forecast predict --fit results/async_fig45_grid.forecast.json --n 10000 --owners 16 \\
      --eps 2.5 --kind log
  mpi-dp forecast predict --fit f.json --n 20000 5000 --eps 1 inf --psi-isolated 0.02 0.3
"""


def add_forecast_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the `fit` and `predict` subcommands to the `forecast` parser."""
    fmt = argparse.RawDescriptionHelpFormatter
    parser.formatter_class = fmt
    if not parser.description:
        parser.description = FORECAST_DESCRIPTION
    sub = parser.add_subparsers(dest="forecast_command", metavar="SUBCOMMAND", required=True)
    fit = sub.add_parser("fit", help="fit c1bar', c2bar' of bound (11) to sweep result files",
                         description=FIT_DESCRIPTION, formatter_class=fmt)
    fit.add_argument("results", nargs="+", metavar="RESULT.h5",
                     help="sweep result files with finite eps and eps = inf configurations")
    fit.add_argument("--out", metavar="FILE.json",
                     help="where to write the fit (default: <first result stem>.forecast.json beside it)")
    fit.add_argument("--metric", default="psi", help="final metric to fit (default psi)")
    fit.add_argument("--max-psi", type=float, default=DEFAULT_MAX_PSI, metavar="M",
                     help="leave out configurations whose E[metric] exceeds M (default "
                     f"{DEFAULT_MAX_PSI:g}: a model that much worse than optimal is heavily clipped "
                     "and off the bound's scaling; inf keeps every point)")
    fit.add_argument("--plot", metavar="PREFIX",
                     help="also draw E[metric] vs eps and vs n with the fitted bound (first file)")
    pred = sub.add_parser("predict", help="predict E[psi] and per-owner join verdicts for a coalition",
                          description=PREDICT_DESCRIPTION, formatter_class=fmt)
    pred.add_argument("--fit", required=True, metavar="FILE.json", help="a file from `forecast fit`")
    pred.add_argument("--n", required=True, nargs="+", type=float, metavar="N_I",
                      help="records per owner (one value per owner, or one value with --owners)")
    pred.add_argument("--eps", required=True, nargs="+", type=float, metavar="EPS_I",
                      help="privacy budget per owner (inf = no privacy), or one value with --owners")
    pred.add_argument("--owners", type=int, metavar="N", help="number of owners when --n/--eps are scalars")
    pred.add_argument("--psi-isolated", nargs="+", type=float, metavar="PSI_I",
                      help="psi(theta*_i) per owner (or one value); default kappa / n_i from the fit")
    pred.add_argument("--kind", choices=KINDS, default="nnls",
                      help="fit used for the verdicts: nnls (a, b >= 0) or log (a = 0); default nnls")


def _g(x: Any, digits: int = 4) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    return f"{x:.{digits}g}"


def _table(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(header)]
    lines = ["  ".join(h.rjust(w) for h, w in zip(header, widths, strict=True))]
    lines += ["  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
    return "\n".join(lines)


def format_fit(fit: BoundFit) -> str:
    """Human-readable report of a fit: points, constants, quality, floors, isolated model."""
    multi = len(fit.sources) > 1
    header = (["file"] if multi else []) + ["cfg", "N", "n", "S", "M", "SE", "M0", "y", "fit_nnls",
                                             "fit_log", "sqrt_share", "factor_nnls", "factor_log", "used"]
    rows = []
    for p in fit.points:
        fac = [max(p[f"fit_{k}"] / p["mean"], p["mean"] / p[f"fit_{k}"])
               if p["mean"] > 0 and p[f"fit_{k}"] > 0 else float("nan") for k in ("nnls", "log")]
        rows.append(([Path(p["source"]).name] if multi else []) + [
            str(p["config"]), str(p["owners"]), str(p["n_total"]), _g(p["S"]), _g(p["mean"]),
            _g(p["se"], 2), _g(p["floor"]), _g(p["y"]), _g(p["fit_nnls"]), _g(p["fit_log"]),
            _g(p["share_sqrt"], 2), _g(fac[0], 3), _g(fac[1], 3), "yes" if p["used"] else "no"])
    srcs = ", ".join(f"{s} ({a})" for s, a in zip(fit.sources, fit.algorithms, strict=False))
    kstr = "K = b/N" if len(fit.owners) == 1 else f"K = b/N undefined (several N: {fit.owners})"
    out = [
        f"cost-of-privacy fit of final E[{fit.metric}]: {srcs}",
        "E[psi] ~ M0 + a sqrt(S)/n + b S/n^2,  n = sum n_i,  S = sum 1/eps_i^2;  M0 = eps = inf floor",
        "",
        _table(header, rows),
        "",
        f"points used: {fit.n_points}; dropped (y < 3 SE of y, within noise of the floor): {fit.n_dropped}"
        + (f"; left out with E[{fit.metric}] > {fit.max_psi:g} (heavily clipped regime; "
           f"--max-psi inf keeps them): {fit.n_above_max}" if fit.n_above_max else "")
        + (f"; incomplete configurations left out: {fit.n_incomplete}" if fit.n_incomplete else ""),
        "",
        "constants:",
        f"  nnls (relative error): a = c1bar' = {_g(fit.a)}   b = c2bar' = {_g(fit.b)}"
        + (f"   K = b/N = {_g(fit.K)}" if len(fit.owners) == 1 else ""),
        f"  log  (a = 0):                              b = c2bar' = {_g(fit.b_log)}"
        + (f"   K = b/N = {_g(fit.K_log)}" if len(fit.owners) == 1 else ""),
        f"  ({kstr}: paper form E psi = K/(n_i^2 eps^2) for N equal owners)",
        "quality (log space, on y = E[psi] - M0):",
    ]
    for k in ("nnls", "log"):
        out.append(f"  {k:<4}  R^2 = {_g(fit.r2_log[k])}   max |log10 residual| = "
                   f"{_g(fit.max_log10_residual[k], 3)}   held-out (leave-one-out) factor on E[psi]: "
                   f"median {_g(fit.loo_factor_median[k], 3)}, max {_g(fit.loo_factor_max[k], 3)}")
    out.append(f"floors (eps = inf) stored: {len(fit.floors)}: " + ", ".join(
        f"N={f['owners']} n={f['n_total']}: {_g(f['psi'])}" for f in fit.floors[:8])
        + (" ..." if len(fit.floors) > 8 else ""))
    if fit.kappa is None:
        out.append("isolated optimum model: none (no reference/psi_isolated in the files); "
                   "predict needs --psi-isolated for verdicts")
    else:
        out.append(f"isolated optimum model: psi(theta*_i) ~ kappa / n_i, kappa = {_g(fit.kappa)} "
                   f"({fit.kappa_points} owner sizes, max |log10 residual| "
                   f"{_g(fit.kappa_max_log10_residual, 3)})")
    out.append(f"fitted range: n in [{_g(fit.ranges['n_total'][0])}, {_g(fit.ranges['n_total'][1])}], "
               f"S in [{_g(fit.ranges['S'][0])}, {_g(fit.ranges['S'][1])}], N in {fit.owners}")
    return "\n".join(out)


def format_prediction(fit: BoundFit, out: dict[str, Any]) -> str:
    """Human-readable prediction and per-owner verdicts."""
    kind = out["kind"]
    lines = [
        f"coalition: N = {out['owners']} owners, n = sum n_i = {_g(out['n_total'], 8)}, "
        f"S = sum 1/eps_i^2 = {_g(out['S'])}",
        f"floor M0 = {_g(out['floor'])} ({out['floor_note']})",
        f"predicted E[{fit.metric}] = M0 + a sqrt(S)/n + b S/n^2:",
    ]
    for k in KINDS:
        a, b = fit.coefficients(k)
        mark = "  <- used for verdicts" if k == kind else ""
        lines.append(f"  {k:<4} {_g(out['predicted'][k])}   (excess {_g(out['excess'][k])}; "
                     f"a = {_g(a)}, b = {_g(b)}){mark}")
    lines.append(f"held-out error of the {kind} fit (leave-one-out over {fit.n_points} configurations): "
                 f"factor median {_g(out['loo_factor_median'], 3)}, max {_g(out['loo_factor_max'], 3)}")
    lines += [f"note: {s}" for s in out["notes"]]
    rows = [[str(v["owner"]), _g(v["n"], 8), _g(v["eps"]), _g(v["psi_isolated"]), v["psi_isolated_from"],
             {True: "yes", False: "no", None: "?"}[v["joins"]]] for v in out["verdicts"]]
    lines += ["", _table(["owner", "n_i", "eps_i", "psi_iso_i", "from", "joins"], rows), ""]
    known = [v for v in out["verdicts"] if v["joins"] is not None]
    if known:
        lines.append(f"{sum(v['joins'] for v in known)} of {out['owners']} owners gain by joining "
                     f"(E[{fit.metric}] {_g(out['prediction'])} < psi(theta*_i)).")
    else:
        lines.append("no psi(theta*_i) known: give --psi-isolated for verdicts")
    return "\n".join(lines)


def _fit_command(args: argparse.Namespace) -> int:
    fit = fit_bound([Path(p) for p in args.results], metric=args.metric, max_psi=args.max_psi)
    first = Path(args.results[0])
    out = Path(args.out) if args.out else first.with_name(first.stem + ".forecast.json")
    print(format_fit(fit))
    fit.save(out)
    print(f"wrote {out}")
    if args.plot:
        from mpi_dp.analysis.bound_figures import plot_bound
        from mpi_dp.analysis.load import open_result

        with open_result(first) as res:
            for p in plot_bound(res, args.plot, metric=args.metric, fit=fit):
                print(p)
    return 0


def _predict_command(args: argparse.Namespace) -> int:
    fit = BoundFit.load(args.fit)
    n, eps = args.n, args.eps
    if args.owners is not None:
        if args.owners < 1:
            raise ForecastError(f"--owners must be >= 1, got {args.owners}")
    elif len(n) != len(eps) and 1 not in (len(n), len(eps)):
        raise ForecastError(f"--n has {len(n)} values and --eps {len(eps)}: give one per owner, "
                            "or one value with --owners N")
    out = predict_coalition(fit, n, eps, psi_isolated=args.psi_isolated, kind=args.kind,
                            owners=args.owners)
    print(format_prediction(fit, out))
    return 0


def run_forecast_command(args: argparse.Namespace) -> int:
    """Run `forecast fit` or `forecast predict` from parsed arguments; returns the exit status."""
    if args.forecast_command == "fit":
        return _fit_command(args)
    if args.forecast_command == "predict":
        return _predict_command(args)
    raise ForecastError(f"unknown forecast subcommand {args.forecast_command!r}")
