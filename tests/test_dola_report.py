"""Tests for mpi_dp.analysis.dola_report on result files of real `mpi-dp run` dola jobs.

Every expected number is recomputed here straight from the HDF5 file with h5py, independently of
mpi_dp.analysis.load; the text is checked cell by cell (columns sliced from the dashed rule).
"""

from __future__ import annotations

import csv
import math
import shutil
from pathlib import Path

import h5py
import numpy as np
import pytest
from helpers import mpi_run, write_job

from mpi_dp.analysis import open_result
from mpi_dp.analysis.dola_report import PAPER_TABLE3, dola_rows, dola_text, plot_dola
from mpi_dp.analysis.load import ResultFileError
from mpi_dp.cli import main as cli_main

AGENTS, RECORDS, DIM = 8, 100, 5
RUNS = 3  # odd: a median would not pass for the mean
OWNERS = [1, 2, 8]  # Table 3 analogue: 1 matches a paper node count, 2 and 8 do not
T3_EPS = [1.0, 0.1, math.inf]
PNG = b"\x89PNG\r\n\x1a\n"


# ---------------------------------------------------------------------------------------------
# result files of real runs
# ---------------------------------------------------------------------------------------------


def _run(n: int, job: Path, *extra: str) -> None:
    cp = mpi_run(n, ["run", str(job), "--quiet", *extra])
    assert cp.returncode == 0, cp.stderr


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    from mpi_dp.data.synth import write_synth

    path = tmp_path_factory.mktemp("dola_data") / "online.h5"
    return write_synth(path, "online", AGENTS, RECORDS, DIM, 0.05, 1, public=500)


def _job(path: Path, data: Path, **keys) -> Path:
    base = dict(algorithm="dola", variant="laplace", T=100, runs=RUNS, seed=4, record_every=20)
    base.update(keys)
    return write_job(path, data, **base)


@pytest.fixture(scope="module")
def sweep(data: Path) -> Path:
    """Laplace and Gaussian at eps 1 and inf on a random geometric graph (positions recorded)."""
    job = _job(data.parent / "sweep.toml", data, dola={"graph": "sparse"},
               sweep={"eps": [1.0, math.inf], "variant": ["laplace", "gaussian"]})
    _run(2, job)
    return job.with_suffix(".h5")


@pytest.fixture(scope="module")
def sparse(data: Path) -> Path:
    """Alg. 3 with lam = 0 (no comparator: no regret) on a ring (no positions)."""
    job = _job(data.parent / "sparse.toml", data, variant="sparse",
               dola={"graph": "ring", "lam": 0, "rho": 0.05}, sweep={"eps": [1.0, math.inf]})
    _run(2, job)
    return job.with_suffix(".h5")


@pytest.fixture(scope="module")
def table3(data: Path) -> Path:
    """All 8 owners' records pooled into m = 1, 2, 8 agents at three eps."""
    job = _job(data.parent / "table3.toml", data, T=100000, n_beyond_shard="cap",
               dola={"graph": "medium", "pool_owners": True},
               sweep={"owners": OWNERS, "eps": T3_EPS})
    _run(2, job)
    return job.with_suffix(".h5")


def _configs(path: Path) -> list[dict]:
    """Per configuration, straight from h5py: attrs (with the per-agent values, datasets on
    `agent`) and every metric's last record (runs,)."""
    out = []
    with h5py.File(path, "r") as f:
        groups = [f["configs"][k] for k in sorted(f["configs"])] if "configs" in f else [f]
        for g in groups:
            attrs = {k: (v.decode() if isinstance(v, bytes) else v) for k, v in g.attrs.items()}
            attrs.update((k, d[()]) for k, d in g.items()
                         if isinstance(d, h5py.Dataset) and d.attrs.get("per_agent", False))
            final = {k: np.asarray(d[-1], dtype=np.float64) for k, d in g["metrics"].items()
                     if d.ndim == 2}
            out.append({"attrs": attrs, "final": final,
                        "t": int(g["metrics/iteration"][-1])})
    return out


# ---------------------------------------------------------------------------------------------
# parsing the text
# ---------------------------------------------------------------------------------------------


def _table(lines: list[str], start: int, notes_indented: bool = False
           ) -> tuple[list[str], list[list[str]], int]:
    """The aligned table whose header is lines[start]: (headers, rows of cells, index after it).
    Column spans come from the dashed rule (columns are separated by two spaces); the table ends
    at a blank line or, with `notes_indented` (a left-aligned first column), an indented note."""
    rule = lines[start + 1]
    assert set(rule) <= {"-", " "}, rule
    spans, j = [], 0
    while j < len(rule):
        if rule[j] == "-":
            k = j
            while k < len(rule) and rule[k] == "-":
                k += 1
            spans.append((j, k))
            j = k
        else:
            j += 1
    spans[-1] = (spans[-1][0], 10_000)  # the last column (a label) may be wider than its rule

    def cut(line: str) -> list[str]:
        return [line[a:b].strip() for a, b in spans]

    rows, i = [], start + 2
    while i < len(lines) and lines[i].strip() and not (notes_indented
                                                       and lines[i].startswith(" ")):
        rows.append(cut(lines[i]))
        i += 1
    return cut(lines[start]), rows, i


def _main_table(text: str) -> list[dict[str, str]]:
    lines = text.splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith("#"))
    headers, rows, _ = _table(lines, start)
    return [dict(zip(headers, r, strict=True)) for r in rows]


def _g4(x: float) -> str:
    return f"{x:.4g}"


# ---------------------------------------------------------------------------------------------
# text
# ---------------------------------------------------------------------------------------------


def test_text_rows_regret_and_majority(sweep: Path) -> None:
    cfgs = _configs(sweep)
    with open_result(sweep) as res:
        text = dola_text(res, "regret")
    head = text.splitlines()[:2]
    assert "job sweep" in head[0] and "4 configurations" in head[0]
    assert f"m = {AGENTS} agents" in head[1] and "graph sparse (mean degree" in head[1]
    assert "T = 100" in head[1] and "h = 1" in head[1] and "exchange" in head[1]
    table = _main_table(text)
    assert len(table) == len(cfgs) == 4
    for row, c in zip(table, cfgs, strict=True):
        a, fin = c["attrs"], c["final"]
        assert row["label"] == a["label"]
        assert row["m"] == str(AGENTS) and row["t"] == str(c["t"]) == "100"
        reg = fin["regret"]
        mean = float(np.mean(reg))
        assert row["R_D/t"].split(" ± ")[0] == _g4(mean)
        assert row["R_D/(mt)"] == _g4(mean / a["m"])
        assert row["R_own/t"] == _g4(float(np.mean(fin["regret_own"])))
        assert row["online err"] == _g4(float(np.mean(fin["online_error"])))
        te = float(np.mean(fin["test_error"]))
        assert row["test err w_hat"].split(" ± ")[0] == _g4(te)
        maj = float(a["test_error_majority"])
        assert 0 < maj <= 0.5
        assert row["majority"] == _g4(maj)
        assert row["flag"] == ("<= baseline" if te >= maj else "")
        assert row["spread"] == _g4(float(np.mean(fin["spread"])))
        eps = float(a["eps_per_release"])
        assert row["eps/rel"] == ("inf" if math.isinf(eps) else f"{eps:g}")
        assert row["eps/rec"] == row["eps/rel"]  # certified single pass: per record = per release
        assert "sparsity" not in row
    # the non-private runs learn: they beat the majority class
    assert all(r["flag"] == "" for r in table if r["eps/rel"] == "inf")
    assert "Table 3 analogue" not in text  # one m only


def test_text_other_metric_and_unknown(sweep: Path) -> None:
    cfgs = _configs(sweep)
    with open_result(sweep) as res:
        text = dola_text(res, "spread_sq")
        with pytest.raises(KeyError, match="no configuration has metric 'nope'"):
            dola_text(res, "nope")
    table = _main_table(text)
    for row, c in zip(table, cfgs, strict=True):
        v = c["final"]["spread_sq"]
        assert row["spread_sq (final)"].split(" ± ")[0] == _g4(float(np.mean(v)))
        assert "R_D/t" not in row


def test_text_without_regret_shows_sparsity(sparse: Path) -> None:
    cfgs = _configs(sparse)
    assert all("regret" not in c["final"] for c in cfgs)
    with open_result(sparse) as res:
        text = dola_text(res)
    table = _main_table(text)
    assert len(table) == 2
    for row, c in zip(table, cfgs, strict=True):
        assert "R_D/t" not in row and "R_own/t" not in row
        assert row["sparsity"] == _g4(float(np.mean(c["final"]["sparsity"])))
    assert "regret not recorded in 2 configuration(s)" in text
    assert "lam = 0" in text


def test_table3_grid(table3: Path) -> None:
    cfgs = _configs(table3)
    assert sorted({int(c["attrs"]["m"]) for c in cfgs}) == OWNERS
    with open_result(table3) as res:
        text = dola_text(res)
    lines = text.splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith("Table 3 analogue (laplace)"))
    headers, rows, after = _table(lines, start + 1, notes_indented=True)
    assert headers == ["eps"] + [h for m in OWNERS for h in (f"m={m}", "paper")]
    assert [r[0] for r in rows] == ["non-private", "1", "0.1"]  # the paper's order
    grid = {(r[0], headers[j]): r[j] for r in rows for j in range(1, len(headers))}
    cols = {h: j for j, h in enumerate(headers)}
    for c in cfgs:
        m, eps = int(c["attrs"]["m"]), float(np.max(c["attrs"]["eps"]))  # the job's eps
        name = "non-private" if math.isinf(eps) else f"{eps:g}"
        acc = 1 - float(np.mean(c["final"]["test_error"]))
        assert grid[(name, f"m={m}")] == f"{100 * acc:.2f}%"
        paper_cell = rows[[r[0] for r in rows].index(name)][cols[f"m={m}"] + 1]
        paper = PAPER_TABLE3.get((m, eps))
        assert paper_cell == ("-" if paper is None else f"{100 * paper:.2f}%")
    # the paper's m = 1 cells: eps = 1 equals non-private (the caveat), 0.1 below
    m1 = cols["m=1"] + 1
    assert [r[m1] for r in rows] == ["82.51%", "82.51%", "80.17%"]
    notes = "\n".join(lines[after:])
    assert "caveat" in notes and "eps = 1 rows equal its non-private rows" in notes
    assert "accuracy falls as eps falls and as m grows" in notes


def test_text_and_figures_without_test_set(sweep: Path, tmp_path: Path) -> None:
    path = tmp_path / "no_test.h5"
    shutil.copy(sweep, path)
    with h5py.File(path, "r+") as f:
        for k in f["configs"]:
            g = f["configs"][k]
            del g["metrics/test_error"], g["metrics/test_error_bar"]
            g.attrs["test_error_majority"] = np.nan
    with open_result(path) as res:
        text = dola_text(res)
        rows = dola_rows(res)
        written = plot_dola(res, tmp_path / "nt")
    assert "test error not recorded" in text
    assert all("test err w_hat" not in r and "majority" not in r for r in _main_table(text))
    assert all(r["test_error"] is None and r["accuracy"] is None and r["majority_error"] is None
               and r["beats_majority"] is None for r in rows)
    assert {p.name for p in written} == {"nt_regret.png", "nt_spread.png", "nt_graph.png"}


def test_not_dola(sweep: Path, tmp_path: Path) -> None:
    path = tmp_path / "other.h5"
    shutil.copy(sweep, path)
    with h5py.File(path, "r+") as f:
        f.attrs["algorithm"] = "admm"
    with open_result(path) as res, pytest.raises(ResultFileError, match="dola"):
        dola_rows(res)


# ---------------------------------------------------------------------------------------------
# rows
# ---------------------------------------------------------------------------------------------


def _check_rows(path: Path) -> list[dict]:
    cfgs = _configs(path)
    with open_result(path) as res:
        rows = dola_rows(res)
    assert len(rows) == len(cfgs)
    for r, c in zip(rows, cfgs, strict=True):
        a, fin = c["attrs"], c["final"]
        assert r["label"] == a["label"] and r["variant"] == a["variant"]
        assert r["m"] == a["m"] and r["T"] == a["T"] and r["h"] == a["h"] and r["t"] == c["t"]
        assert r["runs"] == a["runs"] == RUNS
        assert r["eps_per_release"] == a["eps_per_release"]
        assert r["eps_per_record"] == a["eps_per_record"]
        assert r["majority_error"] == a["test_error_majority"]
        assert r["lam"] == a["lam"] and r["rho"] == a["rho"]
        for key in ("regret", "regret_own", "loss", "online_error", "test_error",
                    "test_error_bar", "spread", "spread_sq", "noise_l1", "sparsity"):
            if key in fin:
                assert r[key] == float(np.mean(fin[key])), key
                assert r[f"{key}_sd"] == float(np.std(fin[key], ddof=1)), key
            else:
                assert r[key] is None and r[f"{key}_sd"] is None, key
        if "regret" in fin:
            assert r["regret_per_agent"] == float(np.mean(fin["regret"])) / a["m"]
        assert r["accuracy"] == 1.0 - float(np.mean(fin["test_error"]))
        assert r["beats_majority"] == (float(np.mean(fin["test_error"]))
                                       < a["test_error_majority"])
    return rows


def test_rows_exact(sweep: Path, sparse: Path, table3: Path) -> None:
    rows = _check_rows(sweep)
    assert [r["variant"] for r in rows] == ["laplace", "laplace", "gaussian", "gaussian"]
    assert all(r["graph"] == "sparse" and r["sparsity"] is None for r in rows)
    sp = _check_rows(sparse)
    assert all(r["regret"] is None and r["regret_per_agent"] is None for r in sp)
    assert all(r["sparsity"] is not None for r in sp)
    t3 = _check_rows(table3)
    assert sorted({r["m"] for r in t3}) == OWNERS


def test_cli_analyze_csv_and_plot(sweep: Path, tmp_path: Path, capsys) -> None:
    """The method entry's seams: `mpi-dp analyze --csv` and `mpi-dp plot` use this module."""
    out = tmp_path / "rows.csv"
    assert cli_main(["analyze", str(sweep), "--csv", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "R_D/(mt)" in printed and "privacy" in printed.lower()
    with out.open() as fh:
        csv_rows = list(csv.DictReader(fh))
    cfgs = _configs(sweep)
    for r, c in zip(csv_rows, cfgs, strict=True):
        assert float(r["regret"]) == float(np.mean(c["final"]["regret"]))
        assert float(r["test_error"]) == float(np.mean(c["final"]["test_error"]))
    assert cli_main(["plot", str(sweep), "--out", str(tmp_path / "cli")]) == 0
    assert {Path(p).name for p in capsys.readouterr().out.split()} == {
        "cli_regret.png", "cli_spread.png", "cli_what.png", "cli_graph.png"}


# ---------------------------------------------------------------------------------------------
# figures
# ---------------------------------------------------------------------------------------------


def _png(p: Path) -> None:
    assert p.exists() and p.stat().st_size > 5000
    assert p.read_bytes()[:8] == PNG


def test_figures(sweep: Path, sparse: Path, table3: Path, tmp_path: Path) -> None:
    with open_result(sweep) as res:
        w = plot_dola(res, tmp_path / "sw")
    assert [p.name for p in w] == ["sw_regret.png", "sw_spread.png", "sw_what.png", "sw_graph.png"]
    for p in w:
        _png(p)
    assert not (tmp_path / "sw_sparsity.png").exists()  # no sparsity metric: skipped
    assert not (tmp_path / "sw_table3.png").exists()  # one m: no Table 3 figure
    with open_result(sparse) as res:
        w = plot_dola(res, tmp_path / "sp")
    # no regret (lam = 0), no positions (ring): those figures are skipped
    assert [p.name for p in w] == ["sp_spread.png", "sp_what.png", "sp_sparsity.png"]
    for p in w:
        _png(p)
    with open_result(table3) as res:
        w = plot_dola(res, tmp_path / "t3")
    assert "t3_table3.png" in [p.name for p in w] and "t3_regret.png" in [p.name for p in w]
    for p in w:
        _png(p)
