"""Tests for mpi_dp.analysis.admm_figures on fake DP-ADMM result files."""

from __future__ import annotations

import math
from pathlib import Path

import h5py
import numpy as np
import pytest

from mpi_dp.analysis import open_result
from mpi_dp.analysis.admm_figures import (
    admm_comparison,
    admm_table,
    admm_table_text,
    plot_admm,
)
from mpi_dp.analysis.load import ResultFileError
from mpi_dp.results.recorder import ResultFile

TS = [0, 100, 200]  # logged iterations
RUNS = 5
# per-run deviations of the final test error (mean 0, stored unsorted); sorted: -.04 -.01 0 .02 .03
DEV = np.array([0.0, 0.03, -0.04, 0.02, -0.01])
# numpy's linear percentile: the 5th sits at position 0.05 * (5 - 1) = 0.2, the 95th at 3.8
P5 = -0.04 + 0.2 * (-0.01 - (-0.04))  # -0.034
P95 = 0.02 + 0.8 * (0.03 - 0.02)  # 0.028
CV_DEV = np.array([-0.5, 0.0, 0.5, 0.25, -0.25])  # mean 0
REF = 0.075  # reference/test_error_nonprivate
# (method, eps_bar) -> mean final test error
FINAL = {
    ("objt", 0.1): 0.40, ("objp", 0.1): 0.45, ("outp", 0.1): 0.50,
    ("objt", 1.0): 0.18, ("objp", 1.0): 0.19, ("outp", 1.0): 0.20,
    ("objt", math.inf): 0.07, ("objp", math.inf): 0.085, ("outp", math.inf): 0.10,
}
WORSE_OUTP = 0.60  # a second OutP configuration at eps_bar = 0.1 (another rho): never the baseline


def _file(path: Path, n_configs: int, algorithm: str = "admm") -> ResultFile:
    return ResultFile(path, job_text='name = "fake-admm"\n', job_json="{}", algorithm=algorithm,
                      variant="iadmm", n_configs=n_configs, sweep={"eps_bar": [0.1, 1.0, "inf"]},
                      provenance={})


def _config(rf: ResultFile, index: int, method: str, eps: float, final: float, *,
            metrics: tuple[str, ...] = ("test_error", "consensus", "noise_mag"),
            ts: list[int] = TS, label: str | None = None) -> None:
    """Test error 0.9 at t=0, halfway at t=100, final + DEV at t=200; CV = 1/t; noise = 1/eps."""
    rec = rf.config(index, RUNS, method=method, eps_bar=eps, eps=np.full(3, eps), n=np.full(3, 50),
                    T=TS[-1], log_every=100, label=label or f"{method} eps={eps:g}",
                    eps_total_basic=eps * (ts[-1] + 1))
    for t in ts:
        err = 0.9 + (final - 0.9) * t / TS[-1] + (DEV if t == TS[-1] else 0.0)
        values = {
            "test_error": np.full(RUNS, 1.0) * err,
            "consensus": (0.0 if t == 0 else 1.0 / t) * (1.0 + CV_DEV),
            "noise_mag": np.full(RUNS, 0.0 if math.isinf(eps) else 1.0 / eps) * (1 + t / 1000),
            "rho": 102.0,  # per-record scalar, as in the schema
        }
        rec.append(t, {k: v for k, v in values.items() if k in metrics or k == "rho"})
    rec.write("reference/test_error_nonprivate", REF)


@pytest.fixture()
def full(tmp_path: Path) -> Path:
    path = tmp_path / "admm.h5"
    rf = _file(path, len(FINAL) + 1)
    for i, ((m, e), v) in enumerate(FINAL.items()):
        _config(rf, i, m, e, v)
    _config(rf, len(FINAL), "outp", 0.1, WORSE_OUTP, label="outp eps=0.1 rho=10")
    rf.close("complete")
    return path


def _check_png(p: Path) -> None:
    assert p.exists() and p.stat().st_size > 5000
    assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_table_numbers_exact(full: Path) -> None:
    with open_result(full) as res:
        rows = admm_table(res)
    assert len(rows) == 10
    assert [r["method"] for r in rows[:3]] == ["ObjT", "ObjP", "OutP"]
    for r, ((m, e), v) in zip(rows, FINAL.items(), strict=False):
        assert r["method_key"] == m and r["eps_bar"] == e
        assert r["runs"] == RUNS and r["t"] == 200 and r["records"] == 3
        assert r["mean"] == pytest.approx(v, abs=1e-14)
        assert r["p5"] == pytest.approx(v + P5, abs=1e-14)
        assert r["p95"] == pytest.approx(v + P95, abs=1e-14)
        assert r["consensus"] == pytest.approx(1 / 200, rel=1e-13)
        assert r["noise_mag"] == pytest.approx(0.0 if math.isinf(e) else 1.2 / e, rel=1e-13)
        assert r["eps_total_basic"] == e * 201
        assert r["nonprivate_ref"] == REF
    assert rows[-1]["mean"] == pytest.approx(WORSE_OUTP, abs=1e-14)


def test_reductions_headline_and_gaps(full: Path) -> None:
    with open_result(full) as res:
        comp = admm_comparison(res)
    red = {(r["method"], r["eps_bar"]): r for r in comp["reductions"]}
    assert set(red) == {(m, e) for m in ("ObjT", "ObjP") for e in (0.1, 1.0, math.inf)}
    expect = {(method, e): (FINAL[("outp", e)] - FINAL[(key, e)]) / FINAL[("outp", e)]
              for method, key in (("ObjT", "objt"), ("ObjP", "objp")) for e in (0.1, 1.0, math.inf)}
    for k, v in expect.items():
        assert red[k]["reduction"] == pytest.approx(v, abs=1e-12)
        assert red[k]["t"] == 200
    assert red[("ObjT", 0.1)]["reduction"] == pytest.approx(0.2, abs=1e-12)
    assert red[("ObjP", 1.0)]["reduction"] == pytest.approx(0.05, abs=1e-12)
    # the worse OutP (rho sweep) is not the baseline; two OutP configurations were candidates
    assert red[("ObjT", 0.1)]["baseline_error"] == pytest.approx(0.5, abs=1e-14)
    assert red[("ObjT", 0.1)]["choices"] == (1, 2)
    # headline over finite eps only: eps_bar = inf has 30 % but is not a privacy level
    assert red[("ObjT", math.inf)]["reduction"] == pytest.approx(0.3, abs=1e-12)
    h = comp["headline"]
    assert (h["method"], h["eps_bar"]) == ("ObjT", 0.1) and h["reduction"] == pytest.approx(0.2)
    gaps = {(g["method"], g["eps_bar"], g["label"]): g for g in comp["gaps"]}
    assert len(gaps) == 7  # 6 finite (method, eps) + the second OutP
    g = gaps[("ObjT", 0.1, "objt eps=0.1")]
    assert g["gap_inf"] == pytest.approx(0.40 - 0.07, abs=1e-13)
    assert g["gap_ref"] == pytest.approx(0.40 - REF, abs=1e-13)
    g = gaps[("OutP", 1.0, "outp eps=1")]
    assert g["gap_inf"] == pytest.approx(0.20 - 0.10, abs=1e-13)


def test_text_contains_numbers(full: Path) -> None:
    with open_result(full) as res:
        text = admm_table_text(res)
    lines = text.splitlines()
    row = next(ln for ln in lines if ln.rstrip().endswith("objt eps=0.1"))
    # mean, 5th and 95th percentile (%.4g), CV, noise, eps_total
    for cell in ("0.4", "0.366", "0.428", "0.005", "12", "20.1"):
        assert f" {cell} " in f" {row} ", (cell, row)
    assert "ObjT 0.4 vs OutP 0.5: 20.0% (best of 1 vs best of 2 configurations)" in text
    assert "eps_bar=1, t=200: ObjP 0.19 vs OutP 0.2: 5.0%" in text
    assert "largest reduction of ObjT/ObjP over finite eps_bar: 20.0% (ObjT, eps_bar=0.1); paper: at " \
           "most 22% (within)" in text
    assert "ObjT eps_bar=0.1 [objt eps=0.1]: error 0.4 at t=200; gap 0.33 vs eps_bar=inf 0.07 " \
           "(t=200); 0.325 vs reference 0.075" in text
    # rows sorted by eps_bar then method: the first data row is ObjT at 0.1, the last OutP at inf
    assert lines[4].split()[1:3] == ["ObjT", "0.1"]
    assert lines[3 + 10].split()[1:3] == ["OutP", "inf"]


def test_plot_writes_all_four(full: Path, tmp_path: Path) -> None:
    with open_result(full) as res:
        paths = plot_admm(res, tmp_path / "fig" / "run")
    names = [p.name for p in paths]
    assert names == ["run_test_error.png", "run_noise.png", "run_error_vs_eps.png",
                     "run_consensus.png"]
    for p in paths:
        _check_png(p)


def test_missing_metrics_fewer_figures(tmp_path: Path) -> None:
    path = tmp_path / "lean.h5"
    rf = _file(path, 3)
    for i, (m, e) in enumerate([("objt", 0.1), ("outp", 0.1), ("objt", 1.0)]):
        _config(rf, i, m, e, FINAL[(m, e)], metrics=("test_error",))
    rf.close("complete")
    with open_result(path) as res:
        paths = plot_admm(res, tmp_path / "lean")
        rows = admm_table(res)
        text = admm_table_text(res)
    assert [p.name for p in paths] == ["lean_test_error.png", "lean_error_vs_eps.png"]
    for p in paths:
        _check_png(p)
    assert not (tmp_path / "lean_noise.png").exists()
    assert all(r["consensus"] is None and r["noise_mag"] is None for r in rows)
    assert "eps_bar=0.1, t=200: ObjT 0.4 vs OutP 0.5: 20.0%" in text
    assert "eps_bar=1, t=" not in text  # no OutP at eps_bar = 1: no reduction


def test_no_test_error_no_figures(tmp_path: Path) -> None:
    path = tmp_path / "cv_only.h5"
    rf = _file(path, 2)
    _config(rf, 0, "objt", 0.1, 0.4, metrics=("consensus",))
    _config(rf, 1, "outp", 0.1, 0.5, metrics=("consensus",))
    rf.close("complete")
    with open_result(path) as res:
        paths = plot_admm(res, tmp_path / "cv")
        comp = admm_comparison(res)
        rows = admm_table(res)
    assert [p.name for p in paths] == ["cv_consensus.png"]
    assert comp["reductions"] == [] and comp["headline"] is None
    assert all(math.isnan(r["mean"]) for r in rows)


def test_nan_test_error_skips_its_figures(tmp_path: Path) -> None:
    """A job without a test set records test_error = NaN: no error figures, consensus still drawn."""
    path = tmp_path / "notest.h5"
    rf = _file(path, 2)
    _config(rf, 0, "objt", 0.1, 0.4)
    _config(rf, 1, "outp", 1.0, 0.5)
    for g in ("configs/000", "configs/001"):
        rf.file[f"{g}/metrics/test_error"][...] = np.nan
    rf.close("complete")
    with open_result(path) as res:
        paths = plot_admm(res, tmp_path / "nt")
        rows = admm_table(res)
    assert [p.name for p in paths] == ["nt_noise.png", "nt_consensus.png"]
    assert all(math.isnan(r["mean"]) and r["consensus"] == pytest.approx(1 / 200) for r in rows)


def test_file_being_written(tmp_path: Path) -> None:
    """Ragged datasets and configurations at different t: compare at the common last t."""
    path = tmp_path / "running.h5"
    rf = _file(path, 3)
    _config(rf, 0, "objt", 0.1, 0.4)
    _config(rf, 1, "outp", 0.1, 0.5, ts=TS[:2])  # OutP reached t = 100 only
    rf.config(2, RUNS, method="objp", eps_bar=0.1, label="objp not started")
    rf.file.flush()
    # a writer caught between two datasets: test_error has 3 records, consensus only 2
    rf.file["configs/000/metrics/consensus"].resize((2, RUNS))
    rf.file.flush()
    with open_result(path) as res:
        rows = admm_table(res)
        comp = admm_comparison(res)
        paths = plot_admm(res, tmp_path / "run")
        text = admm_table_text(res)
    assert rows[0]["records"] == 2 and rows[0]["t"] == 100
    assert rows[0]["mean"] == pytest.approx(0.65, abs=1e-14)  # halfway 0.9 -> 0.4, no DEV yet
    assert rows[1]["t"] == 100 and rows[1]["mean"] == pytest.approx(0.7, abs=1e-14)
    assert rows[2]["t"] == -1 and rows[2]["records"] == 0 and math.isnan(rows[2]["mean"])
    (r,) = comp["reductions"]
    assert r["t"] == 100 and r["reduction"] == pytest.approx((0.7 - 0.65) / 0.7, abs=1e-12)
    assert "running" in text
    assert {p.name for p in paths} >= {"run_test_error.png", "run_consensus.png"}
    rf.close("interrupted")


def test_common_t_when_one_is_ahead(tmp_path: Path) -> None:
    """ObjT ahead of OutP: its error at OutP's last t is used, not its own final."""
    path = tmp_path / "ahead.h5"
    rf = _file(path, 2)
    _config(rf, 0, "objt", 1.0, 0.18)
    _config(rf, 1, "outp", 1.0, 0.20, ts=[0])
    rf.close("interrupted")
    with open_result(path) as res:
        (r,) = admm_comparison(res)["reductions"]
    assert r["t"] == 0 and r["reduction"] == pytest.approx(0.0, abs=1e-15)


def test_wrong_algorithm(tmp_path: Path) -> None:
    path = tmp_path / "sync.h5"
    rf = _file(path, 1, algorithm="sync_star")
    _config(rf, 0, "objt", 0.1, 0.4)
    rf.close("complete")
    with open_result(path) as res, pytest.raises(ResultFileError, match="sync.h5.*admm"):
        admm_table(res)


def test_empty_configuration(tmp_path: Path) -> None:
    """An empty configuration group (no metrics yet) yields a row of NaN and no figure."""
    path = tmp_path / "empty.h5"
    rf = _file(path, 1)
    rf.config(0, RUNS, method="objt", eps_bar=0.1)
    rf.close("running")
    with h5py.File(path, "r") as f:
        assert "metrics" in f["configs/000"]
    with open_result(path) as res:
        assert plot_admm(res, tmp_path / "e") == []
        (row,) = admm_table(res)
    assert row["t"] == -1 and row["consensus"] is None and math.isnan(row["mean"])
