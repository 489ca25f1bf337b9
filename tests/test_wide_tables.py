"""Wide tables (issue 43): a CSV with 10,000 columns prepares and runs.

HDF5 refuses an attribute over 64 KiB ("object header message is too large"), so a shard keeps
its column names in the dataset /meta/feature_names and any writer attribute over 16 KiB (here
the decisions, which name every column with an imputed cell) as a /meta dataset; readers take
both, and files that hold them as root attributes (written before) are still read.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import h5py
import numpy as np
import pytest

from mpi_dp.cli import main as cli_main
from mpi_dp.data import ShardFile
from mpi_dp.data.prepare import describe
from mpi_dp.data.shard_digest import file_digest, stored_digest
from mpi_dp.data.shard_writer import rewrite_shards, write_shards
from tests.helpers import mpi_run, write_job

P, N = 10_000, 300
NAMES = [f"gene_{j:05d}" for j in range(P)]


@pytest.fixture(scope="module")
def wide_shard(tmp_path_factory) -> Path:
    """A 300 x 10,000 table (an owner and a label column besides), one empty cell per column,
    prepared with the documented command."""
    d = tmp_path_factory.mktemp("wide")
    rng = np.random.default_rng(43)
    X = rng.normal(size=(N, P)).round(3)
    y = np.where(X[:, 0] + X[:, 1] > 0, "yes", "no")
    cells = X.astype(str)
    cells[np.arange(P) % N, np.arange(P)] = ""  # every column has one missing cell
    src = d / "wide.csv"
    with src.open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["owner", *NAMES, "label"])
        for i in range(N):
            w.writerow([f"site{i % 3}", *cells[i], y[i]])
    out = d / "wide.h5"
    rc = cli_main(["data", "prepare", "csv", str(src), "--target", "label", "--positive", "yes",
                   "--partition", "key", "--key", "owner", "--out", str(out), "--quiet"])
    assert rc == 0
    return out


def test_wide_shard_keeps_names_and_decisions_in_datasets(wide_shard):
    with ShardFile(wide_shard) as sf:
        assert sf.n_features == P and sf.feature_names == NAMES
        assert sf.partition_values() == ["site0", "site1", "site2"]
    d = describe(wide_shard)["decisions"]
    assert len(d["imputed_by_column"]) == P and d["rows_read"] == N
    with h5py.File(wide_shard, "r") as f:
        assert "feature_names" not in f.attrs and "decisions" not in f.attrs
        assert f["meta/feature_names"].shape == (P,)
        assert json.loads(f["meta/decisions"].asstr()[()]) == d
    assert stored_digest(wide_shard) == file_digest(wide_shard)


def test_wide_shard_runs_under_mpi_and_its_result_analyzes_and_exports(wide_shard, tmp_path,
                                                                       capsys):
    job = write_job(tmp_path / "wide.toml", wide_shard, runs=1, T=3, loss="logistic")
    res = tmp_path / "wide.h5"
    cp = mpi_run(2, ["run", str(job), "--out", str(res), "--quiet"])
    assert cp.returncode == 0, cp.stderr[-3000:]
    with h5py.File(res, "r") as f:
        assert f["models/final"].shape == (1, P) and f["feature"].shape == (P,)
        assert np.array_equal(f["feature"][()], np.arange(P))
        assert json.loads(f["provenance"].attrs["owner_values"]) == ["site0", "site1", "site2"]
    capsys.readouterr()
    assert cli_main(["analyze", str(res)]) == 0
    text = capsys.readouterr().out
    assert "owners by owner: 0 = 'site0', 1 = 'site1', 2 = 'site2'" in text
    table = tmp_path / "wide.csv"
    assert cli_main(["export", str(res), "--out", str(table)]) == 0
    header = table.read_text().splitlines()[0].split(",")
    assert "psi" in header and "iteration" in header
    release = tmp_path / "wide_release.h5"
    assert cli_main(["export", "--release", str(res), "--out", str(release)]) == 0
    with h5py.File(release, "r") as f:
        assert f["models/final"].shape == (1, P) and f["feature"].shape == (P,)


def test_5000_short_column_names_prepare_without_the_hdf5_header_error(tmp_path, capsys):
    """5,000 names of 2-5 characters: 80 kB of string references in one attribute was HDF5's
    "object header message is too large"; now they are a dataset."""
    names = [f"f{j}" for j in range(5000)]
    X = np.random.default_rng(5).normal(size=(40, 5000)).round(2)
    src = tmp_path / "w5000.csv"
    with src.open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow([*names, "y"])
        w.writerows([*row, float(row[0] > 0)] for row in X)
    out = tmp_path / "w5000.h5"
    rc = cli_main(["data", "prepare", "csv", str(src), "--target", "y", "--task", "binary",
                   "--agents", "2", "--out", str(out), "--quiet"])
    assert rc == 0, capsys.readouterr().err
    with ShardFile(out) as sf:
        assert sf.feature_names == names and sf.n_features == 5000


def _small(tmp_path: Path, **kw) -> Path:
    rng = np.random.default_rng(0)
    agents = [(rng.normal(size=(4, 3)), rng.normal(size=4)) for _ in range(2)]
    return write_shards(tmp_path / "s.h5", agents, feature_names=["a", "b", "c"], **kw)


def test_large_writer_attr_is_a_dataset_and_survives_a_rewrite(tmp_path):
    big = {"per_column": [f"column {j}" for j in range(20_000)]}  # ~250 kB of JSON
    path = _small(tmp_path, attrs={"big": big, "small": {"k": 1}})
    with h5py.File(path, "r") as f:
        assert "big" not in f.attrs and "small" in f.attrs and "meta/big" in f
    with ShardFile(path) as sf:
        assert sf.json_attr("big") == big and sf.json_attr("small") == {"k": 1}
    again = rewrite_shards(path, tmp_path / "g.h5", layout="groups")
    with ShardFile(again) as sf:
        assert sf.json_attr("big") == big and sf.feature_names == ["a", "b", "c"]
    assert stored_digest(again) == stored_digest(path) == file_digest(again) == file_digest(path)


def test_older_file_with_names_as_attribute_still_reads(tmp_path):
    path = _small(tmp_path)
    digest = stored_digest(path)
    with h5py.File(path, "r+") as f:  # the layout written before: names as a root attribute
        f.attrs["feature_names"] = np.array(["a", "b", "c"], dtype=h5py.string_dtype())
        del f["meta"]
    with ShardFile(path) as sf:
        assert sf.feature_names == ["a", "b", "c"]
    assert file_digest(path) == digest  # the digest does not depend on where the names are
    again = rewrite_shards(path, tmp_path / "new.h5")
    with h5py.File(again, "r") as f:
        assert "feature_names" not in f.attrs and f["meta/feature_names"].shape == (3,)
    assert stored_digest(again) == digest
