"""A user's own table through every method: a real CSV with a separate test file, prepared with
the defaults, run by all five methods under `mpiexec -n 2` from their defaults at eps = inf, each
ending within 2 points of test error of the non-private optimum the run itself reports, and
`mpi-dp compare` reading the five files.

The table: the first 4,000 rows of the SPARCS 2020 musculoskeletal file in ../shared/data
(discharged home or not), split 3,000 / 1,000 into a training and a test file.
"""

from __future__ import annotations

import math
from pathlib import Path

import h5py
import numpy as np
import pytest

from mpi_dp.analysis import compare
from mpi_dp.cli import main as cli_main
from tests.helpers import mpi_run, write_job

SPARCS = (Path(__file__).resolve().parents[2] / "shared" / "data" / "sparcs2020_musculoskeletal"
          / "week10_df_musc_skel.csv.gz")
COLUMNS = ["Gender", "Ethnicity", "age", "deathrisk", "illseveritydesc",
           "APR.Medical.Surgical.Description", "Payment.Typology.1", "los", "Total.Costs",
           "disposition2"]

#: each method's job at eps = inf: only what a user must give (T) and the loss of the star methods
JOBS = {
    "sync_star": dict(T=200, loss="logistic", lam=1e-5, xi="auto", variant="alg2"),
    "async_star": dict(T=1200, loss="logistic", lam=1e-5, xi="auto", variant="proof"),
    "admm": dict(T=200),
    "dola": dict(T=900),
    "p2p": dict(T=3000, p2p={"graph": "complete"}),
}


@pytest.fixture(scope="module")
def own_shard(tmp_path_factory) -> Path:
    if not SPARCS.exists():
        pytest.skip(f"{SPARCS} is not here (../shared/data beside the repository)")
    import pandas as pd

    d = tmp_path_factory.mktemp("own_e2e")
    rows = pd.read_csv(SPARCS, usecols=COLUMNS, nrows=4000)
    rows.iloc[:3000].to_csv(d / "train.csv", index=False)
    rows.iloc[3000:].to_csv(d / "test.csv", index=False)
    out = d / "sparcs.h5"
    rc = cli_main(["data", "prepare", "csv", str(d / "train.csv"), "--test-file",
                   str(d / "test.csv"), "--target", "disposition2", "--positive", "Home",
                   "--partition", "iid", "--agents", "3", "--out", str(out), "--quiet"])
    assert rc == 0
    return out


@pytest.fixture(scope="module")
def own_results(own_shard, tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("own_runs")
    out = {}
    for method, keys in JOBS.items():
        job = write_job(d / f"{method}.toml", own_shard, algorithm=method, eps=math.inf, runs=1,
                        record_every=keys["T"] // 4, **keys)
        path = d / f"{method}.h5"
        cp = mpi_run(2, ["run", str(job), "--out", str(path), "--quiet"])
        assert cp.returncode == 0, f"{method}: {cp.stderr[-2000:]}"
        out[method] = path
    return out


def _final_and_optimum(method: str, path: Path) -> tuple[float, float, float]:
    """(final test error, the run's own non-private optimum's, majority) from the file."""
    with h5py.File(path) as f:
        if method == "p2p":  # every peer's model on the global test set, and Theta*'s
            return (float(f["per_agent/test_global_error"][()].mean()),
                    float(f.attrs["test_global_error_star"]),
                    float(f.attrs["test_global_error_trivial"]))
        final = float(f["metrics/test_error"][-1].mean())
        majority = (float(f.attrs["test_error_majority"]) if method == "dola"
                    else float(f["reference/test_error_majority"][()]))
        return final, float(f["reference/test_error_star"][()]), majority


@pytest.mark.parametrize("method", list(JOBS))
def test_every_method_learns_a_csv_with_a_test_file_from_its_defaults(own_results, method):
    final, optimum, majority = _final_and_optimum(method, own_results[method])
    assert final <= optimum + 0.02, (method, final, optimum)
    assert optimum < majority - 0.05  # the table is learnable: a useless model would show


def test_the_shard_keeps_the_test_file_and_its_bound(own_shard):
    with h5py.File(own_shard) as f:
        n_test, width = f["test/X"].shape
        assert 900 < n_test <= 1000 and width == f.attrs["n_features"]  # rows without a target go
        assert set(np.unique(f["test/y"][()]).tolist()) == {-1.0, 1.0}
        assert f["public/row_norm_max"][()].tolist() == [1.0]
        assert np.linalg.norm(f["test/X"][()], axis=1).max() <= 1.0 + 1e-12


def test_compare_reads_the_five_files(own_results, capsys):
    paths = [str(own_results[m]) for m in JOBS]
    rows, _ = compare.read_rows(paths)
    assert [r.method for r in rows] == list(JOBS)
    for r, method in zip(rows, JOBS, strict=True):
        final, optimum, majority = _final_and_optimum(method, own_results[method])
        assert r.utility is not None and r.utility.on == "test"
        assert float(np.median(r.utility.values)) == pytest.approx(final, abs=1e-12)
        assert r.utility.optimum == pytest.approx(optimum, abs=1e-12)
        assert r.eps == math.inf
    rc = cli_main(["compare", *paths, "--out", str(Path(paths[0]).with_name("cmp.png"))])
    assert rc == 0
    text = capsys.readouterr().out
    assert all(m in text for m in JOBS)
    assert Path(paths[0]).with_name("cmp.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
