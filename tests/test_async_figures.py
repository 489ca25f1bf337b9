"""Tests for mpi_dp.analysis.async_figures on fake async_star result files."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from mpi_dp.analysis import open_result
from mpi_dp.analysis.async_figures import (
    collaboration_table,
    crossover,
    facility_gains,
    plot_collaboration_map,
    plot_facilities,
    plot_schedule,
    schedule_uniformity,
)
from mpi_dp.analysis.load import ResultFileError
from mpi_dp.results.recorder import ResultFile

T = 4  # records k = 0..T
RUNS = 3
SPREAD = np.array([0.9, 1.0, 1.1])  # per-run factors of mean exactly 1

# (N, eps) grid of the collaboration sweep; E psi = 1 / (N eps^2); owner 1's isolated psi per N
N_GRID = [2, 4, 8, 16]
EPS_GRID = [0.1, 1.0, 10.0]
ISO1 = {2: 0.1, 4: 0.1, 8: 0.2, 16: 0.05}


def _file(path: Path, n_configs: int, sweep: dict) -> ResultFile:
    return ResultFile(path, job_text='name = "fake-async"\n', job_json="{}", algorithm="async_star",
                      variant="proof", n_configs=n_configs, sweep=sweep, provenance={})


def _config(rf: ResultFile, index: int, eps: np.ndarray, n: np.ndarray, final: float | None,
            iso: np.ndarray | None = None, records: int = T + 1) -> None:
    """One configuration: psi falls to `final` * SPREAD at k = T (`records` < T + 1: cut short)."""
    rec = rf.config(index, RUNS, eps=np.asarray(eps, float), n=np.asarray(n, np.int64),
                    owners=len(eps), T=T, label=f"N={len(eps)}, eps={eps[0]:g}",
                    scheduler="poisson")
    if final is not None:
        for k in range(records):
            rec.append(k, {"psi": final * SPREAD * (1.0 + 10.0 * (T - k))})
    if iso is not None:
        rec.write("reference/psi_isolated", np.asarray(iso, float))


def _check_png(p: Path) -> None:
    assert p.exists() and p.stat().st_size > 5000
    assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# ---------------------------------------------------------------------------- schedule


def test_schedule_uniformity_exact() -> None:
    owner = np.array([[0, 1, 1, -1], [2, 2, 2, -1]])
    u = schedule_uniformity(owner, 3)
    assert u["counts"].tolist() == [1, 2, 3] and u["total"] == 6
    np.testing.assert_allclose(u["shares"], [1 / 6, 2 / 6, 3 / 6], rtol=0, atol=1e-15)
    # expected 2 each: chi2 = (1 + 0 + 1) / 2 = 1 with 2 degrees of freedom: p = exp(-1/2)
    assert u["chi2"] == pytest.approx(1.0, rel=1e-12)
    assert u["p_value"] == pytest.approx(np.exp(-0.5), rel=1e-12)
    u4 = schedule_uniformity(owner, 4)
    assert u4["counts"].tolist() == [1, 2, 3, 0]
    # unequal clocks: expected 1, 2, 3 exactly -> chi2 = 0, p = 1
    ur = schedule_uniformity(owner, 3, rates=np.array([1.0, 2.0, 3.0]))
    assert ur["chi2"] == pytest.approx(0.0, abs=1e-12) and ur["p_value"] == pytest.approx(1.0)
    with pytest.raises(ValueError, match="out of range"):
        schedule_uniformity(owner, 2)
    empty = schedule_uniformity(np.full((2, 3), -1), 3)
    assert empty["total"] == 0 and np.isnan(empty["p_value"])


def test_schedule_uniformity_detects_skew() -> None:
    rng = np.random.default_rng(12345)
    uniform = rng.integers(0, 5, size=(20, 1000))
    assert schedule_uniformity(uniform, 5)["p_value"] > 1e-3
    probs = np.array([0.3, 0.2, 0.2, 0.15, 0.15])
    skewed = rng.choice(5, size=(20, 1000), p=probs)
    assert schedule_uniformity(skewed, 5)["p_value"] < 1e-6
    # the same draw is consistent with the unequal rates that produced it
    assert schedule_uniformity(skewed, 5, rates=probs)["p_value"] > 1e-3


def _schedule_file(path: Path, owner: np.ndarray, n_owners: int) -> Path:
    rf = _file(path, 1, {})
    _config(rf, 0, np.full(n_owners, 1.0), np.full(n_owners, 1000), 0.01, np.full(n_owners, 0.5))
    cfg = rf.config(0, RUNS)
    time = np.cumsum(np.random.default_rng(1).exponential(1.0 / n_owners, owner.shape), axis=1)
    time[owner < 0] = np.nan
    cfg.write("schedule/owner", owner)
    cfg.write("schedule/time", time)
    declines = np.array([(0, 40, 1, 3.0)], dtype=[("run", "i8"), ("k", "i8"), ("owner", "i8"),
                                                  ("time", "f8")])
    cfg.write("schedule/declines", declines)
    rf.close("complete")
    return path


def test_plot_schedule(tmp_path: Path) -> None:
    owner = np.random.default_rng(3).integers(0, 3, size=(RUNS, 200))
    owner[0, 150:] = -1  # run 0 ended early
    path = _schedule_file(tmp_path / "sched.h5", owner, 3)
    with open_result(path) as r:
        paths = plot_schedule(r, tmp_path / "fig" / "sched")
    assert [p.name for p in paths] == ["sched_schedule.png"]
    _check_png(paths[0])


def test_plot_schedule_needs_a_schedule(tmp_path: Path) -> None:
    rf = _file(tmp_path / "nosched.h5", 1, {})
    _config(rf, 0, np.ones(3), np.full(3, 1000), 0.01)
    rf.close("complete")
    with open_result(tmp_path / "nosched.h5") as r:
        assert plot_schedule(r, tmp_path / "nosched") == []
    assert not (tmp_path / "nosched_schedule.png").exists()
    empty = _schedule_file(tmp_path / "empty.h5", np.full((RUNS, 10), -1), 3)  # nothing served yet
    with open_result(empty) as r:
        assert plot_schedule(r, tmp_path / "empty") == []


def test_plot_schedule_rejects_bad_owner_index(tmp_path: Path) -> None:
    path = _schedule_file(tmp_path / "bad.h5", np.full((RUNS, 10), 5), 3)
    with open_result(path) as r, pytest.raises(ResultFileError, match="bad.h5.*owner index 5"):
        plot_schedule(r, tmp_path / "bad")


# ---------------------------------------------------------------------------- collaboration


def _collab_file(path: Path) -> Path:
    """The (N, eps) grid, plus an unequal-eps, a cut-short and a not-started configuration."""
    cfgs = [(N, e) for N in N_GRID for e in EPS_GRID]
    rf = _file(path, len(cfgs) + 3, {"owners": N_GRID, "eps": EPS_GRID})
    for i, (N, e) in enumerate(cfgs):
        iso = np.concatenate([[ISO1[N]], np.full(N - 1, 1e3)])
        _config(rf, i, np.full(N, e), np.full(N, 10_000), 1.0 / (N * e**2), iso)
    i = len(cfgs)
    _config(rf, i, np.array([10.0, 1.0]), np.full(2, 10_000), 1e-9, np.array([1.0, 1.0]))
    _config(rf, i + 1, np.full(32, 10.0), np.full(32, 10_000), 1e-9, np.ones(32), records=2)
    _config(rf, i + 2, np.full(64, 10.0), np.full(64, 10_000), None)
    rf.close("interrupted")
    return path


def test_collaboration_table_and_crossover(tmp_path: Path) -> None:
    path = _collab_file(tmp_path / "collab.h5")
    with open_result(path) as r:
        table = collaboration_table(r)
        cross = crossover(r)
    assert [(row["eps"], row["N"]) for row in table] == [(e, N) for e in EPS_GRID for N in N_GRID]
    for row in table:
        mean = 1.0 / (row["N"] * row["eps"] ** 2)
        assert row["mean"] == pytest.approx(mean, rel=1e-12)
        assert row["se"] == pytest.approx(mean * 0.1 / np.sqrt(3), rel=1e-9)
        assert row["psi_iso_1"] == ISO1[row["N"]]
    gains = {(row["N"], row["eps"]) for row in table if row["owner1_gains"]}
    assert gains == {(8, 1.0), (2, 10.0), (4, 10.0), (8, 10.0), (16, 10.0)}
    assert cross == {0.1: None, 1.0: 8, 10.0: 2}


def test_plot_collaboration_map(tmp_path: Path) -> None:
    path = _collab_file(tmp_path / "collab.h5")
    with open_result(path) as r:
        paths = plot_collaboration_map(r, tmp_path / "c")
    assert [p.name for p in paths] == ["c_collab_map.png"]
    _check_png(paths[0])
    with open_result(path) as r:  # a sweep over N is not a facility comparison (Fig 7)
        assert plot_facilities(r, tmp_path / "c") == []


def test_plot_collaboration_map_needs_a_grid(tmp_path: Path) -> None:
    rf = _file(tmp_path / "single.h5", 1, {})
    _config(rf, 0, np.full(4, 1.0), np.full(4, 10_000), 0.01, np.full(4, 0.5))
    rf.close("complete")
    rf = _file(tmp_path / "oneN.h5", 2, {"eps": [1.0, 10.0]})
    for i, e in enumerate([1.0, 10.0]):
        _config(rf, i, np.full(4, e), np.full(4, 10_000), 0.01 / e**2, np.full(4, 0.5))
    rf.close("complete")
    for name in ("single", "oneN"):
        with open_result(tmp_path / f"{name}.h5") as r:
            assert plot_collaboration_map(r, tmp_path / name) == []


# ---------------------------------------------------------------------------- facilities

FAC_ISO = np.array([2.0, 0.5, 0.05, 0.005, 0.2, 0.02])
FAC_N = np.array([10_000, 12_000, 20_000, 50_000, 15_000, 30_000])
FAC_MEAN = {0.1: 1.0, 1.0: 0.1, 10.0: 0.01}


def _facility_file(path: Path) -> Path:
    rf = _file(path, 4, {"eps": [0.1, 1.0, 10.0]})
    for i, (e, m) in enumerate(FAC_MEAN.items()):
        _config(rf, i, np.full(6, e), FAC_N, m, FAC_ISO)
    # only one owner's isolated psi: not a facility comparison
    _config(rf, 3, np.full(6, 3.0), FAC_N, 0.05, FAC_ISO[:1])
    rf.close("complete")
    return path


def test_facility_gains(tmp_path: Path) -> None:
    with open_result(_facility_file(tmp_path / "hosp.h5")) as r:
        rows = facility_gains(r)
    assert [row["eps"] for row in rows] == [0.1, 1.0, 10.0]
    assert [row["count"] for row in rows] == [1, 3, 5]
    assert [row["gaining"] for row in rows] == [[0], [0, 1, 4], [0, 1, 2, 4, 5]]
    assert all(row["owners"] == 6 for row in rows)
    for row in rows:
        assert row["mean"] == pytest.approx(FAC_MEAN[row["eps"]], rel=1e-12)


def test_plot_facilities(tmp_path: Path) -> None:
    with open_result(_facility_file(tmp_path / "hosp.h5")) as r:
        paths = plot_facilities(r, tmp_path / "h")
    assert [p.name for p in paths] == ["h_facilities.png"]
    _check_png(paths[0])
    rf = _file(tmp_path / "noiso.h5", 1, {})
    _config(rf, 0, np.full(6, 1.0), FAC_N, 0.1)
    rf.close("complete")
    with open_result(tmp_path / "noiso.h5") as r:
        assert plot_facilities(r, tmp_path / "noiso") == []
        assert facility_gains(r) == []
