"""`mpi-dp compare` on result files of real runs of three methods (admm under `mpiexec -n 2`,
dola and sync_star in-process): every printed number equals the value read straight from the
HDF5 file with h5py (independently of mpi_dp.analysis), a metric a file lacks prints "-" with a
footnote, files of two tasks are refused under --metric auto, and the figure is a PNG."""

from __future__ import annotations

import math
from pathlib import Path

import h5py
import numpy as np
import pytest
from helpers import mpi_run, write_job
from mpi4py import MPI

from mpi_dp.cli import main as cli_main
from mpi_dp.data.synth import write_synth
from mpi_dp.runner import run_job

RUNS = 3  # odd: the median is one run's value, not a mean of two
PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    """admm (test set, 2 ranks), dola (test set), sync_star logistic (no test set), sync_star
    without records (record_every = 0) and sync_star squared loss (regression)."""
    d = tmp_path_factory.mktemp("compare")
    mc = write_synth(d / "mc_shards.h5", "multiclass", 4, 200, 6, 0.35, 5, public=300, classes=3)
    online = write_synth(d / "online_shards.h5", "online", 8, 100, 5, 0.05, 1, public=500)
    binary = write_synth(d / "bin_shards.h5", "binary", 3, 400, 4, 0.3, 5, public=2000)
    reg = write_synth(d / "reg_shards.h5", "regression", 3, 300, 4, 0.5, 11, public=1000)
    admm = write_job(d / "admm.toml", mc, algorithm="admm", variant="objt", T=15, runs=RUNS,
                     record_every=5, sweep={"eps": [0.5, math.inf]})
    cp = mpi_run(2, ["run", str(admm), "--quiet"])
    assert cp.returncode == 0, cp.stderr
    jobs = {
        "dola": write_job(d / "dola.toml", online, algorithm="dola", variant="laplace", T=100,
                          runs=RUNS, record_every=20, sweep={"eps": [1.0, math.inf]}),
        "sync": write_job(d / "sync.toml", binary, loss="logistic", T=30, runs=RUNS,
                          sweep={"eps": [1.0, math.inf]}),
        "norec": write_job(d / "norec.toml", binary, loss="logistic", T=10, runs=2,
                           record_every=0),
        "reg": write_job(d / "reg.toml", reg, T=20, runs=RUNS, sweep={"eps": [1.0, math.inf]}),
    }
    out = {"admm": admm.with_suffix(".h5")}
    for name, job in jobs.items():
        out[name] = Path(run_job(job, comm=MPI.COMM_SELF, progress=False))
    return out


def _compare(capsys, *args: str) -> tuple[int, str, str]:
    rc = cli_main(["compare", *args])
    cap = capsys.readouterr()
    return rc, cap.out, cap.err


def _table(text: str) -> dict[tuple[str, int], dict[str, str]]:
    """{(file letter, configuration): {column: cell}}, columns sliced along the dashed rule."""
    lines = text.splitlines()
    k = next(i for i, ln in enumerate(lines) if ln.startswith("file ") and " #" in ln)
    spans, pos = [], 0
    for dashes in lines[k + 1].split("  "):
        spans.append((pos, pos + len(dashes)))
        pos += len(dashes) + 2
    header = [lines[k][a:b].strip() for a, b in spans]
    rows = {}
    for ln in lines[k + 2:]:
        if not ln.strip():
            break
        cells = [ln[a:b].strip() for a, b in spans]
        row = dict(zip(header, cells, strict=True))
        rows[(row["file"], int(row["#"]))] = row
    return rows


def _g(n: int) -> str:
    return f"{n:.4g}"


def _group(f: h5py.File, k: int) -> h5py.Group:
    return f[f"configs/{k:03d}"] if "configs" in f else f["/"]


def _eps(g: h5py.Group) -> str:
    led = g["privacy/ledger"][()]
    totals = np.where(np.isinf(led["target_eps"]), np.inf, led["eps_pld"])
    e = float(totals.max())
    return "inf" if math.isinf(e) else f"{e:.3g}"


def _expect(path: Path, k: int, metric: str, ref: dict[str, str | None]) -> dict[str, str]:
    """The cells of configuration k computed with h5py: final `metric` per run (median,
    min..max), baselines from reference/ datasets or group attributes, ledger eps, times."""
    with h5py.File(path, "r") as f:
        g = _group(f, k)
        v = g[f"metrics/{metric}"][-1]
        out = {"runs": str(v.size), "median": _g(np.median(v)),
               "min..max": f"{_g(v.min())}..{_g(v.max())}", "eps": _eps(g),
               "delta": f"{float(g['privacy/ledger'][()]['delta'].max()):.3g}",
               "run_s": f"{float(f['provenance'].attrs['wall_seconds']):.3g}",
               "cfg_s": f"{float(g.attrs['seconds']):.3g}" if "seconds" in g.attrs else "-"}
        for col, where in ref.items():
            if where is None:
                out[col] = "-"
            elif where.startswith("@"):
                out[col] = _g(float(g.attrs[where[1:]]))
            elif where.endswith("?"):  # recorded by newer versions of the method only
                name = f"reference/{where[:-1]}"
                out[col] = _g(float(g[name][()])) if name in g else "-"
            else:
                out[col] = _g(float(g[f"reference/{where}"][()]))
    return out


def test_the_table_holds_the_files_numbers(files, capsys, tmp_path):
    fig = tmp_path / "figs" / "cmp.png"
    rc, out, err = _compare(capsys, str(files["admm"]), str(files["dola"]), str(files["sync"]),
                            "--out", str(fig))
    assert rc == 0, err
    rows = _table(out)
    assert sorted(rows) == [("A", 0), ("A", 1), ("B", 0), ("B", 1), ("C", 0), ("C", 1)]
    cases = [("A", files["admm"], "test_error", "test",
              {"majority": "test_error_majority", "zero": "test_error_zero",
               "optimum": "test_error_star"}),
             ("B", files["dola"], "test_error", "test",
              {"majority": "@test_error_majority", "zero": None, "optimum": "test_error_star"}),
             ("C", files["sync"], "train_error", "train",
              {"majority": "train_error_majority", "zero": "train_error_zero",
               "optimum": "train_error_star"})]
    for tag, path, metric, on, ref in cases:
        for k in (0, 1):
            row, want = rows[(tag, k)], _expect(path, k, metric, ref)
            assert row["test_error"] == want.pop("median"), (tag, k)
            assert row["on"] == on
            for col, value in want.items():
                assert row[col] == value, (tag, k, col)
    assert [rows[("A", k)]["method"] for k in (0, 1)] == ["admm", "admm"]
    assert rows[("B", 0)]["scope"] == "record" and rows[("A", 0)]["scope"] == "configuration"
    assert rows[("C", 0)]["variant"] == "alg2/logistic/pld"
    assert rows[("A", 1)]["eps"] == "inf" and rows[("B", 0)]["eps"] == "1"
    assert "median over runs, then min..max" in out
    assert f"figure: {fig}" in out and fig.read_bytes()[:8] == PNG


def test_a_missing_metric_prints_a_dash_and_a_footnote(files, capsys):
    rc, out, err = _compare(capsys, str(files["norec"]), str(files["sync"]))
    assert rc == 0, err
    row = _table(out)[("A", 0)]
    assert row["test_error"] == "-" and row["min..max"] == "-" and row["runs"] == "-"
    assert row["note"] == "1"
    assert "note 1: A #0: no metrics recorded (record_every = 0" in out
    assert _table(out)[("B", 0)]["test_error"] != "-"
    default = files["norec"].parent / "compare.png"  # next to the first file
    assert f"figure: {default}" in out and default.read_bytes()[:8] == PNG


def test_regression_is_rmse_and_tasks_are_not_mixed(files, capsys):
    rc, out, err = _compare(capsys, str(files["reg"]), "--out", str(files["reg"].with_suffix(
        ".png")))
    assert rc == 0, err
    rows = _table(out)
    with h5py.File(files["reg"], "r") as f:
        for k in (0, 1):
            g = _group(f, k)
            rmse = np.sqrt(g["metrics/train_mse"][-1])
            assert rows[("A", k)]["rmse"] == _g(np.median(rmse))
            assert rows[("A", k)]["mean"] == _g(math.sqrt(g["reference/train_mse_mean"][()]))
            assert rows[("A", k)]["optimum"] == _g(math.sqrt(g["reference/train_mse_star"][()]))
            assert rows[("A", k)]["on"] == "train"
    rc, out, err = _compare(capsys, str(files["reg"]), str(files["sync"]))
    assert rc == 2 and "mix tasks" in err and str(files["reg"]) in err and not out
    rc, out, err = _compare(capsys, str(files["reg"]), str(files["sync"]), "--metric", "rmse",
                            "--out", str(files["reg"].with_name("both.png")))
    assert rc == 0, err
    assert _table(out)[("B", 0)]["rmse"] == "-"
    assert "B configurations #0-1: a classification result: no rmse" in out


def test_files_that_are_not_results(files, capsys):
    rc, _, err = _compare(capsys, str(files["sync"].with_name("nothere.h5")))
    assert rc == 2 and "not found" in err
    rc, _, err = _compare(capsys, str(files["sync"].with_name("bin_shards.h5")))  # a shard file
    assert rc == 2 and "not an mpi_dp result file" in err


def test_an_existing_figure_is_replaced_only_with_overwrite(files, capsys, tmp_path):
    fig = tmp_path / "cmp.png"
    fig.write_bytes(b"a figure of an earlier comparison")
    rc, out, err = _compare(capsys, str(files["sync"]), "--out", str(fig))
    assert rc == 2 and not out
    assert f"{fig} exists: compare never replaces a figure silently" in err
    assert "--overwrite" in err and "Traceback" not in err
    assert fig.read_bytes() == b"a figure of an earlier comparison"
    rc, out, err = _compare(capsys, str(files["sync"]), "--out", str(fig), "--overwrite")
    assert rc == 0, err
    assert f"figure: {fig}" in out and fig.read_bytes()[:8] == PNG
