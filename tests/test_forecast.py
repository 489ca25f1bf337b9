"""Tests for the cost-of-privacy forecast (mpi_dp.analysis.forecast, forecast_cli, bound_figures).

Fake async_star sweeps have per-run final psi = floor(n) * (1 + 2 % noise) + excess * lognormal
noise of mean 1, with excess = A sqrt(S)/n + B S/n^2 (known constants), an eps = inf floor per n,
and reference/psi_isolated = KAPPA / n_i.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import numpy as np
import pytest

from mpi_dp.analysis.bound_figures import plot_bound
from mpi_dp.analysis.forecast import (
    BoundFit,
    ForecastError,
    fit_bound,
    inv_eps_sq_sum,
    predict_coalition,
)
from mpi_dp.analysis.forecast_cli import add_forecast_arguments, run_forecast_command
from mpi_dp.analysis.load import open_result
from mpi_dp.errors import MpiDpError
from mpi_dp.results.recorder import ResultFile

N_OWN = 3
B_TRUE = 2.0e6
A_TRUE = 300.0
KAPPA = 40.0
SIGMA = 0.3
RUNS = 60
T = 50
EPS_GRID = [0.3, 1.0, 3.0, 10.0]
N_GRID = [1000, 4000, 16000]
HUGE_EPS = 1.0e4  # excess ~1e-13: indistinguishable from the floor, must be dropped


def floor_of(n_total: float) -> float:
    """True eps = inf floor: the optimisation error, depends on n."""
    return 1e-5 * math.sqrt(3000.0 / n_total)


def excess_of(n_total: float, S: float, a: float, b: float) -> float:
    return a * math.sqrt(S) / n_total + b * S / n_total**2


def write_sweep(
    path: Path,
    configs: list[tuple[list[int], list[float]]],
    a: float = 0.0,
    b: float = B_TRUE,
    seed: int = 0,
    iso: bool = True,
) -> Path:
    """A fake async_star result file; configs = [(n vector, eps vector), ...]."""
    rng = np.random.default_rng(seed)
    rf = ResultFile(path, job_text='name = "fake"\n', job_json="{}", algorithm="async_star",
                    variant="proof", n_configs=len(configs), sweep={"eps": ["grid"]}, provenance={})
    for i, (n, eps) in enumerate(configs):
        n_arr, e_arr = np.asarray(n, dtype=np.int64), np.asarray(eps, dtype=float)
        n_tot, S = float(n_arr.sum()), inv_eps_sq_sum(e_arr)
        final = floor_of(n_tot) * (1 + 0.02 * rng.standard_normal(RUNS))
        final += excess_of(n_tot, S, a, b) * np.exp(SIGMA * rng.standard_normal(RUNS) - SIGMA**2 / 2)
        rec = rf.config(i, RUNS, label=f"cfg {i}", eps=e_arr, n=n_arr, owners=len(n), T=T, rho=3000.0)
        rec.append(0, {"psi": np.full(RUNS, 10.0)})
        rec.append(T, {"psi": final})
        if iso:
            rec.write("reference/psi_isolated", KAPPA / n_arr.astype(float))
    rf.close("complete")
    return path


def grid(n_grid=N_GRID, eps_grid=EPS_GRID, N=N_OWN, floor=True, huge=True):
    extra = [HUGE_EPS] if huge else []
    eps_all = list(eps_grid) + extra + ([math.inf] if floor else [])
    return [([ni] * N, [e] * N) for ni in n_grid for e in eps_all]


@pytest.fixture(scope="module")
def train(tmp_path_factory) -> Path:
    return write_sweep(tmp_path_factory.mktemp("fc") / "train.h5", grid(), seed=1)


@pytest.fixture(scope="module")
def fit(train: Path) -> BoundFit:
    return fit_bound(train)


def test_recovers_b_without_sqrt_term(fit: BoundFit) -> None:
    assert fit.n_points == len(N_GRID) * len(EPS_GRID)
    assert fit.n_dropped == len(N_GRID)  # the eps = 1e4 points, one per n
    assert fit.b_log == pytest.approx(B_TRUE, rel=0.05)
    assert fit.b == pytest.approx(B_TRUE, rel=0.05)
    assert fit.K_log == pytest.approx(B_TRUE / N_OWN, rel=0.05)
    assert fit.K == pytest.approx(fit.b / N_OWN, rel=1e-12)
    used = [p for p in fit.points if p["used"]]
    assert max(p["share_sqrt"] for p in used) < 0.1
    assert fit.r2_log["log"] > 0.99 and fit.max_log10_residual["log"] < 0.1
    for kind in ("nnls", "log"):
        assert fit.loo_factor_max[kind] < 2.0
        assert 1.0 <= fit.loo_factor_median[kind] <= fit.loo_factor_max[kind]
    # the floors are the eps = inf means (one per n), and y = M - M0 for each point
    assert len(fit.floors) == len(N_GRID)
    p = used[0]
    assert p["y"] == pytest.approx(p["mean"] - p["floor"], rel=1e-12)
    assert p["S"] == pytest.approx(N_OWN / p["eps"][0] ** 2)
    assert fit.kappa == pytest.approx(KAPPA, rel=1e-12) and fit.kappa_points == len(N_GRID)


def test_log_constant_exact_formula(fit: BoundFit) -> None:
    used = [p for p in fit.points if p["used"]]
    y = np.array([p["y"] for p in used])
    v = np.array([p["S"] / p["n_total"] ** 2 for p in used])
    assert fit.b_log == pytest.approx(float(np.exp(np.mean(np.log(y / v)))), rel=1e-12)


def test_nnls_recovers_sqrt_term(tmp_path: Path) -> None:
    path = write_sweep(tmp_path / "ab.h5", grid(), a=A_TRUE, b=B_TRUE, seed=2)
    f = fit_bound(path)
    assert f.a == pytest.approx(A_TRUE, rel=0.1)
    assert f.b == pytest.approx(B_TRUE, rel=0.1)
    shares = [p["share_sqrt"] for p in f.points if p["used"]]
    assert min(shares) < 0.2 and max(shares) > 0.8
    # the one-parameter fit cannot follow a sqrt term: it is worse in log space
    assert f.max_log10_residual["log"] > 2 * f.max_log10_residual["nnls"]


def test_predict_held_out_file(fit: BoundFit, tmp_path: Path) -> None:
    held = [([2000] * 3, [0.5] * 3), ([8000] * 3, [2.0] * 3), ([6000] * 3, [0.7] * 3),
            ([3000, 5000, 9000], [0.5, 2.0, 5.0]), ([2000, 2000, 2000], [1.0, 1.0, math.inf])]
    path = write_sweep(tmp_path / "held.h5", held, seed=9)
    with open_result(path) as r:
        for c in r.configs:
            obs = float(np.mean(c.final("psi")))
            for kind in ("nnls", "log"):
                out = predict_coalition(fit, list(c.n), list(c.eps), kind=kind)
                assert max(out["prediction"] / obs, obs / out["prediction"]) < 2.0, (c.label, kind)
    out = predict_coalition(fit, [3000, 5000, 9000], [0.5, 2.0, 5.0])
    assert out["n_total"] == 17000 and out["S"] == pytest.approx(4 + 0.25 + 0.04)
    a, b = fit.a, fit.b
    expect_excess = a * math.sqrt(out["S"]) / 17000 + b * out["S"] / 17000**2
    assert out["excess"]["nnls"] == pytest.approx(expect_excess, rel=1e-12)
    assert out["floor"] == pytest.approx(next(f["psi"] for f in fit.floors if f["n_total"] == 12000))


def test_floor_choice(fit: BoundFit) -> None:
    v, note = fit.floor_for(13000, 3)
    assert v == next(f["psi"] for f in fit.floors if f["n_total"] == 12000) and "N = 3" in note
    v, note = fit.floor_for(2000, 5)  # no floor with N = 5: nearest n of any N (3000)
    assert v == next(f["psi"] for f in fit.floors if f["n_total"] == 3000)
    assert "no floor with N = 5" in note
    out = predict_coalition(fit, 1000, 1.0, owners=5)
    assert any("N = 5" in s for s in out["notes"])
    # eps = inf everywhere: the prediction is the floor itself
    out = predict_coalition(fit, [4000] * 3, [math.inf] * 3)
    assert out["S"] == 0 and out["prediction"] == out["floor"]


def test_verdicts_flip_at_crossing(fit: BoundFit) -> None:
    base = predict_coalition(fit, [4000] * 3, [1.0] * 3)["prediction"]
    iso = [base * (1 - 1e-9), base * (1 + 1e-9), base * 10]
    out = predict_coalition(fit, [4000] * 3, [1.0] * 3, psi_isolated=iso)
    assert [v["joins"] for v in out["verdicts"]] == [False, True, True]
    assert all(v["psi_isolated_from"] == "given" for v in out["verdicts"])
    # from sizes alone: psi_iso = kappa / n_i, owner joins iff kappa / n_i > prediction
    n = [100, 1000, 10000, 100000]
    out = predict_coalition(fit, n, 0.3, kind="log")
    expect = [fit.kappa / ni > out["predicted"]["log"] for ni in n]
    assert [v["joins"] for v in out["verdicts"]] == expect and True in expect and False in expect


def test_json_round_trip(fit: BoundFit, tmp_path: Path) -> None:
    text = fit.to_json()
    json.loads(text, parse_constant=lambda c: pytest.fail(f"non-standard JSON constant {c}"))
    back = BoundFit.from_json(text)
    assert back.to_json() == text
    assert back.b == fit.b and back.a == fit.a and back.floors == fit.floors
    assert back.predict(20000, 1.0, 3) == fit.predict(20000, 1.0, 3)
    with pytest.raises(ForecastError, match="not an mpi-dp forecast file"):
        BoundFit.from_json('{"a": 1}', name="x.json")


def test_two_files_several_owner_counts(train: Path, tmp_path: Path) -> None:
    five = write_sweep(tmp_path / "five.h5", grid(n_grid=[2000], N=5, huge=False), seed=4)
    f = fit_bound([train, five])
    assert f.owners == [3, 5] and math.isnan(f.K) and math.isnan(f.K_log)
    assert f.n_points == len(N_GRID) * len(EPS_GRID) + len(EPS_GRID)
    assert f.b_log == pytest.approx(B_TRUE, rel=0.05)
    assert len(f.sources) == 2 and len(f.floors) == len(N_GRID) + 1
    v, note = f.floor_for(3000, 5)  # the N = 5 floor (n = 10000), not the nearer N = 3 one (3000)
    assert v == next(fl["psi"] for fl in f.floors if fl["owners"] == 5) and "N = 5, n = 10000" in note


def test_missing_floor_is_a_clear_error(tmp_path: Path) -> None:
    path = write_sweep(tmp_path / "nofloor.h5", grid(floor=False))
    with pytest.raises(MpiDpError, match=r"nofloor\.h5.*no eps = inf configuration.*sweep\.eps"):
        fit_bound(path)


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="mpi-dp")
    sub = ap.add_subparsers(dest="command")
    add_forecast_arguments(sub.add_parser("forecast"))
    return ap


def test_cli_fit_and_predict(train: Path, fit: BoundFit, tmp_path: Path, capsys) -> None:
    out_json = tmp_path / "f.json"
    args = _parser().parse_args(["forecast", "fit", str(train), "--out", str(out_json)])
    assert run_forecast_command(args) == 0
    text = capsys.readouterr().out
    assert f"{fit.b_log:.4g}" in text and f"{fit.b:.4g}" in text and f"{fit.K_log:.4g}" in text
    assert f"{fit.loo_factor_max['log']:.3g}" in text and str(out_json) in text
    assert BoundFit.load(out_json).to_json() == fit.to_json()
    # default output path: next to the first result
    args = _parser().parse_args(["forecast", "fit", str(train)])
    assert run_forecast_command(args) == 0
    assert train.with_name("train.forecast.json").exists()
    capsys.readouterr()
    args = _parser().parse_args(["forecast", "predict", "--fit", str(out_json), "--n", "4000",
                                 "--owners", "3", "--eps", "1", "--psi-isolated", "1e-9", "1"])
    with pytest.raises(ForecastError, match="psi_isolated: 2 values for 3 owners"):
        run_forecast_command(args)
    args = _parser().parse_args(["forecast", "predict", "--fit", str(out_json), "--n", "4000",
                                 "--owners", "3", "--eps", "1", "--kind", "log"])
    assert run_forecast_command(args) == 0
    text = capsys.readouterr().out
    expect = predict_coalition(fit, [4000] * 3, [1.0] * 3, kind="log")
    assert f"{expect['predicted']['log']:.4g}" in text and f"{expect['predicted']['nnls']:.4g}" in text
    assert f"{fit.loo_factor_median['log']:.3g}" in text
    rows = [ln for ln in text.splitlines() if ln.strip().endswith(("yes", "no"))]
    assert len(rows) == 3 and all(ln.split()[-1] == ("yes" if expect["verdicts"][0]["joins"] else "no")
                                  for ln in rows)


def test_plot_bound(train: Path, tmp_path: Path) -> None:
    with open_result(train) as r:
        paths = plot_bound(r, tmp_path / "fig" / "train")
    assert sorted(p.name for p in paths) == ["train_bound_parity.png", "train_bound_vs_eps.png",
                                             "train_bound_vs_n.png"]
    for p in paths:
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and p.stat().st_size > 5000
    single = write_sweep(tmp_path / "one.h5", [([1000] * 3, [1.0] * 3), ([1000] * 3, [math.inf] * 3)])
    with open_result(single) as r:
        assert plot_bound(r, tmp_path / "one") == []


def test_points_above_max_psi_are_shown_but_not_fitted(tmp_path: Path) -> None:
    path = write_sweep(tmp_path / "big.h5", grid(huge=False), b=100 * B_TRUE, seed=3)
    default = fit_bound(path)  # max_psi = 10
    big = [p for p in default.points if p["mean"] > 10.0]
    assert big and default.n_above_max == len(big)
    assert all(not p["used"] and p["above_max"] for p in big)
    assert all(p["mean"] <= 10.0 for p in default.points if p["used"])
    assert default.b_log == pytest.approx(100 * B_TRUE, rel=0.05)
    keep_all = fit_bound(path, max_psi=math.inf)
    assert keep_all.n_above_max == 0 and keep_all.n_points == default.n_points + len(big)
    assert BoundFit.from_json(default.to_json()).max_psi == 10.0


def test_other_coalition_sizes_keep_the_per_owner_constant(fit: BoundFit) -> None:
    """Bound (10): c2bar = 8 N c2, so at equal n_i and eps the excess does not depend on N."""
    three = predict_coalition(fit, [4000] * 3, [1.0] * 3)
    six = predict_coalition(fit, [4000] * 6, [1.0] * 6)
    for k in ("nnls", "log"):
        assert six["excess"][k] == pytest.approx(three["excess"][k], rel=1e-12)
    assert six["excess"]["log"] == pytest.approx(fit.K_log / (4000**2 * 1.0), rel=1e-12)
    assert any("scaled by N/N_fit = 2" in note for note in six["notes"])
    assert fit.n_scale(3) == 1.0 and fit.n_scale(12) == 4.0
