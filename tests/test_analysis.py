"""Tests for mpi_dp.analysis on synthetic result files that follow the mpi_dp.results schema."""

from __future__ import annotations

import json
from pathlib import Path

import h5py
import numpy as np
import pytest

from mpi_dp.analysis import (
    analyze_text,
    final_means,
    fit_slopes,
    format_table,
    loglog_slope,
    open_result,
    rows_to_csv,
    summarize,
)
from mpi_dp.analysis.figures import plot_result
from mpi_dp.analysis.fit import predictor

N_OWNERS = 3
K_TRUE = 4.0e5
EPS_GRID = [0.1, 0.3, 1.0, 3.0, 10.0]
N_GRID = [1000, 3000, 10000, 30000]
JOB = 'name = "synthetic-sweep"\nalgorithm = "sync_star"\n'


def _write_config(
    g: h5py.Group,
    index: int,
    eps: np.ndarray,
    n: np.ndarray,
    psi: np.ndarray,
    T: int,
    psi_iso: np.ndarray | None = None,
) -> None:
    """Fill one configuration group; psi is (records, runs)."""
    records, runs = psi.shape
    g.attrs["config_index"] = index
    g.attrs["label"] = f"eps={eps[0]:g}, n={n[0]}" if np.all(eps == eps[0]) else f"cfg {index}"
    g.attrs["eps"] = np.asarray(eps, dtype=np.float64)
    g.attrs["n"] = np.asarray(n, dtype=np.int64)
    g.attrs["T"] = T
    g.attrs["runs"] = runs
    g.attrs["loss"] = "logistic"
    m = g.create_group("metrics")
    m["iteration"] = np.arange(records, dtype=np.int64)
    m["psi"] = psi
    m["psi_iterate"] = 2 * psi
    m["objective"] = 1.0 + psi
    m["clip_fraction"] = np.zeros_like(psi)
    m["step_size"] = 1.0 / np.sqrt(np.arange(records) + 1.0)  # 1-D: not a per-run metric
    p = 4
    models = g.create_group("models")
    models["final"] = np.zeros((runs, p))
    models["final_iterate"] = np.zeros((runs, p))
    ref = g.create_group("reference")
    ref["theta_star"] = np.zeros(p)
    ref["f_star"] = 0.5
    ref["theta_isolated"] = np.zeros((eps.size, p))
    if psi_iso is not None:
        ref["psi_isolated"] = psi_iso
    led = np.zeros(
        eps.size,
        dtype=[
            ("agent", "i8"),
            ("budget_eps", "f8"),
            ("spent_eps", "f8"),
            ("budget_delta", "f8"),
            ("spent_delta", "f8"),
            ("releases", "i8"),
        ],
    )
    led["agent"] = np.arange(eps.size)
    led["budget_eps"] = eps
    g.create_group("privacy")["ledger"] = led


def _trajectory(final: np.ndarray, records: int) -> np.ndarray:
    """(records, runs) decreasing trajectory ending at `final` after k = records - 1 steps."""
    k = np.arange(records)[:, None]
    return final[None, :] * (1.0 + 10.0 * (records - 1 - k))


def write_result(
    path: Path,
    configs: list[dict],
    sweep: dict | None,
    status: str = "complete",
    T: int = 5,
) -> Path:
    """Write a result file; `configs` entries have eps, n, final (runs,), optional records/iso."""
    with h5py.File(path, "w") as f:
        f.attrs["format"] = "mpi_dp.results"
        f.attrs["format_version"] = 1
        f.attrs["job"] = JOB
        f.attrs["algorithm"] = "sync_star"
        f.attrs["variant"] = "alg2"
        f.attrs["status"] = status
        f.attrs["n_configs"] = len(configs)
        f.attrs["sweep"] = json.dumps(sweep or {})
        f.create_group("provenance").attrs["package_version"] = "0.1.0"
        for i, c in enumerate(configs):
            g = f if sweep is None else f.require_group("configs").create_group(f"{i:03d}")
            records = c.get("records", T + 1)
            psi = _trajectory(np.asarray(c["final"], dtype=float), records)
            _write_config(
                g, i, np.asarray(c["eps"], float), np.asarray(c["n"]), psi, T, c.get("iso")
            )
    return path


def equal_grid(
    runs: int = 20,
    noise: float = 0.0,
    floor: float = 0.0,
    seed: int = 1,
    eps_grid: list[float] = EPS_GRID,
    n_grid: list[int] = N_GRID,
) -> list[dict]:
    """Equal-budget, equal-size grid with psi = floor + K_TRUE * P, plus eps = inf floors."""
    rng = np.random.default_rng(seed)
    out = []
    for n in n_grid:
        for eps in list(eps_grid) + [np.inf]:
            e = np.full(N_OWNERS, eps)
            nv = np.full(N_OWNERS, n)
            target = floor + (K_TRUE * predictor(e, nv)[0] if np.isfinite(eps) else 0.0)
            # independent multiplicative noise of mean 1 per run
            z = rng.standard_normal(runs)
            final = target * (1.0 + noise * z) if noise else np.full(runs, target)
            if not np.isfinite(eps) and floor == 0.0:
                final = np.full(runs, 1e-12)
            out.append({"eps": e, "n": nv, "final": final, "iso": np.full(N_OWNERS, 0.3)})
    return out


@pytest.fixture
def sweep_file(tmp_path: Path) -> Path:
    sweep = {"eps": EPS_GRID + ["inf"], "n": N_GRID}
    return write_result(tmp_path / "sweep.h5", equal_grid(), sweep)


@pytest.fixture
def partial_file(tmp_path: Path) -> Path:
    c = {"eps": np.ones(3), "n": np.full(3, 1000), "final": np.linspace(0.1, 1, 8), "records": 4}
    return write_result(tmp_path / "partial.h5", [c], None, status="interrupted", T=10)


def test_load_single_root_layout(partial_file: Path) -> None:
    with open_result(partial_file) as r:
        assert r.status == "interrupted"
        assert r.algorithm == "sync_star" and r.variant == "alg2"
        assert r.sweep == {} and not r.is_sweep
        assert r.job_name == "synthetic-sweep"
        assert len(r.configs) == 1
        c = r.configs[0]
        assert c.label == "eps=1, n=1000"
        np.testing.assert_array_equal(c.eps, np.ones(3))
        np.testing.assert_array_equal(c.n, np.full(3, 1000))
        np.testing.assert_array_equal(c.iterations(), np.arange(4))
        assert c.metric("psi").shape == (4, 8)
        assert c.metric_names() == ["clip_fraction", "objective", "psi", "psi_iterate"]
        np.testing.assert_allclose(c.final(), np.linspace(0.1, 1, 8))
        assert c.reference()["f_star"] == 0.5
        assert c.ledger()["budget_eps"].tolist() == [1.0, 1.0, 1.0]
        with pytest.raises(KeyError, match="step_size"):
            c.metric("step_size")


def test_load_sweep_layout(sweep_file: Path) -> None:
    with open_result(sweep_file) as r:
        assert r.is_sweep and r.sweep["n"] == N_GRID
        assert len(r.configs) == len(N_GRID) * (len(EPS_GRID) + 1)
        assert [c.index for c in r.configs] == list(range(len(r.configs)))
        assert r.configs[0].label == "eps=0.1, n=1000"
        assert np.isinf(r.configs[len(EPS_GRID)].eps).all()
        assert r.configs[-1].metric("psi").shape == (6, 20)
        assert r.configs[0].psi_isolated(0) == pytest.approx(0.3)


def test_summarize_matches_numpy(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    finals = [rng.lognormal(size=15) for _ in range(3)]
    cfgs = [
        {"eps": np.full(3, e), "n": np.full(3, 500), "final": v, "iso": np.array([0.2, 0.3, 0.4])}
        for e, v in zip([0.5, 1.0, 2.0], finals, strict=True)
    ]
    cfgs.append(
        {"eps": np.array([1.0, 0.1, 10.0]), "n": np.array([10, 20, 30]), "final": finals[0]}
    )
    path = write_result(tmp_path / "s.h5", cfgs, {"eps": [0.5, 1, 2]})
    with open_result(path) as r:
        rows = summarize(r)
        text = format_table(rows)
        csv_path = rows_to_csv(rows, tmp_path / "s.csv")
    for row, v in zip(rows, finals + [finals[0]], strict=True):
        assert row["median"] == pytest.approx(np.median(v))
        assert row["q25"] == pytest.approx(np.percentile(v, 25))
        assert row["q75"] == pytest.approx(np.percentile(v, 75))
        assert row["mean"] == pytest.approx(np.mean(v))
        assert row["se"] == pytest.approx(np.std(v, ddof=1) / np.sqrt(v.size))
        assert row["runs"] == 15 and row["k"] == 5 and row["records"] == 6
    assert rows[0]["eps"] == "0.5" and rows[0]["n"] == "500"
    assert rows[0]["psi_isolated"] == pytest.approx(0.2)
    assert rows[3]["eps"] == "[1, 0.1, 10]" and rows[3]["psi_isolated"] is None
    assert "median" in text.splitlines()[0] and len(text.splitlines()) == 6
    assert csv_path.read_text().startswith("index,label,eps,n,")


def test_loglog_slope_basic() -> None:
    x = np.array([0.1, 1.0, 10.0, 100.0])
    fit = loglog_slope(x, 3.0 * x**-2)
    assert fit["slope"] == pytest.approx(-2.0) and fit["r2"] == pytest.approx(1.0)
    assert fit["intercept"] == pytest.approx(np.log(3.0))
    fit = loglog_slope(x, 0.5 + 3.0 * x**-2, M0=0.5)
    assert fit["slope"] == pytest.approx(-2.0, abs=1e-6)
    fit = loglog_slope(x, 3.0 * x**-2, se=np.array([0, 0, 0, 1.0]))
    assert fit["n_points"] == 3 and fit["dropped"] == 1


@pytest.mark.parametrize("floor", [0.0, 0.05])
def test_fit_slopes_noiseless(tmp_path: Path, floor: float) -> None:
    path = write_result(tmp_path / "g.h5", equal_grid(floor=floor), {"eps": EPS_GRID, "n": N_GRID})
    with open_result(path) as r:
        fits = fit_slopes(r)
        eps, n, M, se = final_means(r)
    assert eps.shape == (len(M), N_OWNERS) and n.shape == eps.shape
    by_kind = {k: [f for f in fits if f["kind"] == k] for k in ("eps", "n", "joint", "constant")}
    assert len(by_kind["eps"]) == len(N_GRID) and len(by_kind["n"]) == len(EPS_GRID)
    for f in by_kind["eps"] + by_kind["n"]:
        assert f["slope"] == pytest.approx(-2.0, abs=0.02)
        assert f["dropped"] == 0
    (joint,) = by_kind["joint"]
    assert joint["b"] == pytest.approx(-2.0, abs=0.02)
    assert joint["c"] == pytest.approx(-2.0, abs=0.02)
    (const,) = by_kind["constant"]
    assert const["K"] == pytest.approx(K_TRUE, rel=1e-6)
    assert const["max_abs_log10_resid"] < 1e-6


def test_fit_slopes_bootstrap_ci_noisy(tmp_path: Path) -> None:
    cfgs = equal_grid(runs=50, noise=0.3, floor=1e-4, seed=3)
    path = write_result(tmp_path / "n.h5", cfgs, {"eps": EPS_GRID, "n": N_GRID})
    with open_result(path) as r:
        fits = fit_slopes(r)
        text = analyze_text(r)
    slopes = [f for f in fits if f["kind"] in ("eps", "n")]
    assert slopes
    for f in slopes:
        lo, hi = f["ci"]
        assert lo < f["slope"] < hi
        assert lo <= -2.0 <= hi, f
        assert abs(f["slope"] + 2.0) < 0.25
    joint = next(f for f in fits if f["kind"] == "joint")
    assert joint["b_ci"][0] <= -2.0 <= joint["b_ci"][1]
    assert joint["c_ci"][0] <= -2.0 <= joint["c_ci"][1]
    const = next(f for f in fits if f["kind"] == "constant")
    assert const["K"] == pytest.approx(K_TRUE, rel=0.1)
    assert "log-log slope of E[psi] - floor vs eps at n=1000: " in text
    assert "95% CI" in text and "fixed-exponent constant K" in text


def test_analyze_text_single(partial_file: Path) -> None:
    with open_result(partial_file) as r:
        text = analyze_text(r)
    assert "interrupted" in text and "slope" not in text


def _check_png(p: Path) -> None:
    assert p.exists() and p.stat().st_size > 5000
    assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plot_sweep(sweep_file: Path, tmp_path: Path) -> None:
    with open_result(sweep_file) as r:
        paths = plot_result(r, tmp_path / "fig" / "sweep")
    names = sorted(p.name for p in paths)
    assert names == ["sweep_bands.png", "sweep_vs_eps.png", "sweep_vs_n.png"]
    for p in paths:
        _check_png(p)


def test_plot_partial_single(partial_file: Path, tmp_path: Path) -> None:
    with open_result(partial_file) as r:
        paths = plot_result(r, tmp_path / "partial")
    assert [p.name for p in paths] == ["partial_bands.png"]
    _check_png(paths[0])


def test_plot_and_fit_interrupted_sweep(tmp_path: Path) -> None:
    cfgs = equal_grid(runs=5, eps_grid=[0.1, 1.0, 10.0], n_grid=[1000, 10000])
    cfgs[-1]["records"] = 2  # last configuration cut short
    cfgs[-2]["records"] = 0  # ... and one not started
    path = write_result(tmp_path / "cut.h5", cfgs, {"eps": [0.1, 1, 10]}, status="interrupted")
    with open_result(path) as r:
        paths = plot_result(r, tmp_path / "cut")
        text = analyze_text(r)
        assert len(final_means(r).mean) == len(cfgs) - 2
    assert len(paths) == 3 and "left out of the fits" in text


def test_plot_collaboration_map(tmp_path: Path) -> None:
    cfgs = []
    for n1 in [1000, 3000, 10000, 30000]:
        for e1 in EPS_GRID:
            eps = np.array([e1, 0.1, 0.1])
            n = np.array([n1, 1000, 1000])
            iso = np.array([30.0 / np.sqrt(n1), 1.0, 1.0])
            final = np.full(10, K_TRUE * predictor(eps, n)[0])
            cfgs.append({"eps": eps, "n": n, "final": final, "iso": iso})
    path = write_result(tmp_path / "map.h5", cfgs, {"n1": [1], "eps1": [1]})
    with open_result(path) as r:
        paths = plot_result(r, tmp_path / "scen")
    assert sorted(p.name for p in paths) == ["scen_bands.png", "scen_map.png"]
    for p in paths:
        _check_png(p)


def test_errors_name_the_file(tmp_path: Path) -> None:
    other = tmp_path / "other.h5"
    with h5py.File(other, "w") as f:
        f["x"] = np.zeros(3)
    with pytest.raises(ValueError, match="other.h5.*not an mpi_dp result file"):
        open_result(other)
    text = tmp_path / "plain.h5"
    text.write_text("not hdf5")
    with pytest.raises(ValueError, match="plain.h5"):
        open_result(text)
    with pytest.raises(FileNotFoundError, match="missing.h5"):
        open_result(tmp_path / "missing.h5")


def _add_utility(path: Path, test_errors: list[float] | None, train_errors: list[float]) -> None:
    """Give each configuration of a result file final errors and the reference baselines."""
    with h5py.File(path, "r+") as f:
        for i, (cfg, tr) in enumerate(zip(f["configs"].values(), train_errors, strict=True)):
            records, runs = cfg["metrics/psi"].shape
            cfg["metrics/train_error"] = np.full((records, runs), tr)
            ref = cfg["reference"]
            ref["majority_label"], ref["train_error_majority"] = -1.0, 0.3
            ref["train_error_zero"], ref["train_error_star"] = 0.7, 0.1
            if test_errors is not None:
                cfg["metrics/test_error"] = np.full((records, runs), test_errors[i])
                ref["test_error_majority"], ref["test_error_zero"] = 0.25, 0.75
                ref["test_error_star"] = 0.12
                cfg.attrs["eval_set"] = "the shard file's global test set /test (100 records)"
                cfg.attrs["prediction"] = "sign(0) = +1"


@pytest.mark.parametrize("with_test", [True, False])
def test_utility_columns_and_the_baseline_flag(tmp_path: Path, with_test: bool) -> None:
    cfgs = [{"eps": np.full(3, e), "n": np.full(3, 500), "final": np.full(4, 0.1)}
            for e in (0.1, 1.0, 10.0)]
    path = write_result(tmp_path / "u.h5", cfgs, {"eps": [0.1, 1, 10]})
    # config 0 no better than majority on the test set (0.25), config 1 no better on training
    # records only (0.3), config 2 better on both
    _add_utility(path, [0.25, 0.2, 0.15] if with_test else None, [0.2, 0.35, 0.15])
    with open_result(path) as r:
        rows = summarize(r)
        text = analyze_text(r)
    expect = [False, True, True] if with_test else [True, False, True]
    assert [row["beats_baseline"] for row in rows] == expect
    assert [row["flag"] for row in rows] == ["<= baseline" if not e else "" for e in expect]
    assert rows[0]["majority_error"] == (0.25 if with_test else 0.3)
    assert rows[0]["error_star"] == (0.12 if with_test else 0.1)
    head = text.splitlines()[2]
    assert ("test_err" in head) == with_test
    for col in ("train_err", "err(theta*)", "majority", "theta=0", "flag", "median"):
        assert col in head
    assert ("NO TEST SET" in text) != with_test
    assert "<= baseline: 1 configuration(s) whose final model is no better than a trivial " \
           f"predictor (always the majority class, or theta = 0): configuration(s) " \
           f"{0 if with_test else 1}" in text


def test_no_utility_no_columns(sweep_file: Path) -> None:
    with open_result(sweep_file) as r:
        text = analyze_text(r)
        rows = summarize(r)
    assert "majority" not in text and "<= baseline" not in text
    assert all("beats_baseline" not in row for row in rows)
