"""Recipes on the real copies in ../shared/data: counts from SOURCES.md, partitions, provenance."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from mpi_dp.data import recipes
from mpi_dp.data.prepare import describe
from mpi_dp.data.shards import ShardFile
from mpi_dp.errors import DataError

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data"
pytestmark = pytest.mark.skipif(not SHARED.is_dir(), reason=f"{SHARED} (real data copies) absent")


def build(name: str, **opts):
    r = recipes.get(name)
    return r.build(recipes.resolve_files(r, [SHARED]), recipes.options(r, opts))


def check_disjoint_cover(parts, exclude, n, cover: bool):
    allidx = np.concatenate(parts)
    assert len(np.unique(allidx)) == len(allidx), "agents overlap"
    assert not np.intersect1d(allidx, exclude).size, "an agent holds hold-out records"
    if cover:
        assert len(allidx) + len(exclude) == n


def test_lending_counts_blocks_and_public_pca():
    p = build("lending")
    assert p.task == "regression" and len(p.agents) == 3
    assert [x.shape for x, _ in p.agents] == [(666, 10)] * 3
    assert p.public[0].shape == (433, 10)
    # 2,433 rows in SOURCES.md: 3 x 666 blocks + 433 public + 2 left over
    assert len(np.concatenate(p.parts)) + len(p.public_index) + 2 == 2433
    check_disjoint_cover(p.parts, p.public_index, 2433, cover=False)
    assert all(np.all(np.diff(idx) == 1) for idx in p.parts)  # contiguous blocks
    assert p.parts[0][0] == 0 and p.public_index[-1] == 2432
    # whitened on the hold-out: Z^T Z = I there
    Zp = p.public[0]
    np.testing.assert_allclose(Zp.T @ Zp, np.eye(10), atol=1e-8)
    y = np.concatenate([y for _, y in p.agents])
    assert 6.0 < y.min() and y.max() < 31.0  # int_rate range 6.46 .. 30.75 (SOURCES.md)


def test_lending_basis_depends_only_on_holdout(tmp_path):
    src = SHARED / "lending_club" / "loan_kaggle2018_first2433rows.csv"
    lines = src.read_text().splitlines(keepends=True)
    cols = lines[0].rstrip("\n").split(",")
    j = cols.index("loan_amnt")
    row = lines[1].rstrip("\n").split(",")  # record 0 (an owner's) gets another loan amount
    assert row[j].replace(".", "").isdigit()
    row[j] = "123456"
    changed = tmp_path / "lending_club"
    changed.mkdir()
    (changed / src.name).write_text("".join([lines[0], ",".join(row) + "\n", *lines[2:]]))
    r = recipes.get("lending")
    a = r.build(recipes.resolve_files(r, [SHARED]), recipes.options(r, {}))
    b = r.build(recipes.resolve_files(r, [tmp_path]), recipes.options(r, {}))
    np.testing.assert_array_equal(a.public_extra["pca_V"], b.public_extra["pca_V"])
    np.testing.assert_array_equal(a.public_extra["pca_D"], b.public_extra["pca_D"])
    assert not np.array_equal(a.agents[0][0][0], b.agents[0][0][0])


def test_creditcard_counts_and_features():
    p = build("creditcard")
    X = np.concatenate([x for x, _ in p.agents] + [p.public[0]])
    y = np.concatenate([y for _, y in p.agents] + [p.public[1]])
    assert X.shape == (3 * 833 + 565, 30) and p.feature_names[-1] == "bias"
    assert set(np.unique(y)) <= {-1.0, 1.0}
    assert int(np.sum(y > 0)) == 2  # the two frauds of the 3,065-row prefix (SOURCES.md)
    assert len(np.concatenate(p.parts)) + len(p.public_index) + 1 == 3065
    np.testing.assert_array_equal(X[:, -1], 1.0)
    amount = p.public[0][:, p.feature_names.index("Amount")]
    assert abs(amount.mean()) < 1e-12 and abs(amount.std() - 1) < 1e-12  # z-scored on hold-out


def test_sparcs_facilities_as_owners():
    from mpi_dp.data import readers

    t = readers.read_csv(SHARED / "sparcs2020_musculoskeletal" / "week10_df_musc_skel.csv.gz",
                         "los", columns=recipes.SPARCS_FEATURES, keys=(recipes.SPARCS_KEY,),
                         categorical=recipes.SPARCS_FEATURES)
    keys = t.keys[recipes.SPARCS_KEY]
    assert t.X.shape[0] == 36631
    values, counts = np.unique(keys, return_counts=True)
    assert len(values) == 169 and int(np.sum(counts >= 500)) == 23  # SOURCES.md
    p = build("sparcs")
    n, m = 36631, 5000
    _, c_owned = np.unique(keys[: n - m], return_counts=True)
    assert len(p.agents) == int(np.sum(c_owned >= 500))
    check_disjoint_cover(p.parts, p.public_index, n, cover=False)
    for idx in p.parts:
        assert len(np.unique(keys[idx])) == 1 and len(idx) >= 500
    assert p.public[0].shape == (m, len(recipes.SPARCS_FEATURES))
    y = np.concatenate([y for _, y in p.agents])
    assert y.min() >= 1 and y.max() <= 120


def test_mnist_ten_contiguous_owners_and_test_set():
    p = build("mnist")
    assert [x.shape for x, _ in p.agents] == [(6000, 784)] * 10
    assert p.test_global[0].shape == (10000, 784)
    y = np.concatenate([y for _, y in p.agents])
    np.testing.assert_array_equal(np.bincount(y.astype(int)),
                                  [5923, 6742, 5958, 6131, 5842, 5421, 5918, 6265, 5851, 5949])
    np.testing.assert_array_equal(np.bincount(p.test_global[1].astype(int)),
                                  [980, 1135, 1032, 1010, 982, 892, 958, 1028, 974, 1009])
    assert p.agents[0][0].max() <= 1.0 and p.agents[0][0].min() >= 0.0
    check_disjoint_cover(p.parts, np.array([], dtype=int), 60000, cover=True)


def test_reuters_sparse_iid_and_deterministic():
    import scipy.sparse as sp

    a, b = build("reuters"), build("reuters")
    c = build("reuters", seed=2)
    assert len(a.agents) == 64 and all(sp.issparse(x) for x, _ in a.agents)
    assert all(x.shape == (7770 // 64, 8315) for x, _ in a.agents)
    assert a.test_global[0].shape == (3299, 8315)
    assert int(np.sum(a.test_global[1] > 0)) == 179
    for (xa, ya), (xb, yb) in zip(a.agents, b.agents, strict=True):
        assert (xa != xb).nnz == 0 and np.array_equal(ya, yb)
    assert not all(np.array_equal(pa, pc) for pa, pc in zip(a.parts, c.parts, strict=True))
    check_disjoint_cover(a.parts, np.array([], dtype=int), 7770, cover=False)


@pytest.mark.slow
def test_femnist_writers_as_owners():
    p = build("femnist")
    assert len(p.agents) == 105  # writers with train and test records (SOURCES.md)
    assert p.task == "multiclass" and p.agents[0][0].shape[1] == 784
    assert all(t is not None and t[0].shape[0] > 0 for t in p.tests)
    y = np.concatenate([y for _, y in p.agents])
    assert y.min() >= 0 and y.max() <= 61


def test_movielens_users_split_features_graph():
    p = build("movielens")
    assert len(p.agents) == 943
    n_train = sum(x.shape[0] for x, _ in p.agents)
    n_test = sum(t[0].shape[0] for t in p.tests)
    assert n_train + n_test == 100_000  # every rating once (SOURCES.md)
    for (x, _), t in zip(p.agents, p.tests, strict=True):
        n = x.shape[0] + t[0].shape[0]
        assert t[0].shape[0] == int(np.floor(0.2 * n + 0.5))
    assert p.public_extra["item_features"].shape == (1682, 20)
    for (x, y), e in zip(p.agents[:5], p.agent_extra[:5], strict=True):
        np.testing.assert_array_equal(x, p.public_extra["item_features"][e["item"]])
        assert abs(y.mean()) < 1e-12  # centred by the user's train mean
    edges = p.public_extra["graph_edges"]
    deg = np.bincount(edges.ravel(), minlength=943)
    assert deg.min() >= 10 and np.all(edges[:, 0] < edges[:, 1])


def test_cli_prepare_writes_summary_and_provenance(tmp_path):
    out = tmp_path / "cc.h5"
    cp = subprocess.run([sys.executable, "-m", "mpi_dp", "data", "prepare", "creditcard",
                         "--source", str(SHARED), "--out", str(out)],
                        capture_output=True, text=True, timeout=300)
    assert cp.returncode == 0, cp.stderr
    assert "agents            3" in cp.stdout and "size on disk" in cp.stdout
    d = describe(out)
    assert d["recipe"] == "creditcard" and d["options"]["public"] == 565
    assert d["source_files"] and len(d["source_files"][0]["sha256"]) == 64
    with ShardFile(out) as f:
        assert f.n_agents == 3 and f.n_features == 30
        rec = [f.read_agent_extra(i, "record") for i in range(3)]
    assert rec[0][0] == 0 and rec[1][0] == 833


def test_cli_prepare_errors_name_the_problem(tmp_path):
    cp = subprocess.run([sys.executable, "-m", "mpi_dp", "data", "prepare", "lending",
                         "--source", str(tmp_path), "--out", str(tmp_path / "x.h5")],
                        capture_output=True, text=True, timeout=300)
    assert cp.returncode != 0 and "mpi-dp data fetch lending" in cp.stderr
    with pytest.raises(DataError, match="no option"):
        recipes.options(recipes.get("lending"), {"publik": 3})
    with pytest.raises(DataError, match="unknown recipe"):
        recipes.get("covtype")
    # too few records for the blocks: clear error, no file left behind
    shutil.copytree(SHARED / "lending_club", tmp_path / "lending_club")
    out = tmp_path / "big.h5"
    cp = subprocess.run([sys.executable, "-m", "mpi_dp", "data", "prepare", "lending",
                         "--source", str(tmp_path), "--opt", "sizes=[250000, 250000, 250000]",
                         "--out", str(out)], capture_output=True, text=True, timeout=300)
    assert cp.returncode != 0 and "750,000" in cp.stderr
    assert not out.exists() and not list(tmp_path.glob("*.tmp*"))


def test_seed001_job_runs_on_lending_shards(tmp_path):
    """jobs/sync_fig2_bands.toml on the prepared lending shards, only data (and the cap for the
    2,433-row sample) changed; without the cap the job stops with a message naming owner and n."""
    import h5py
    from helpers import mpi_run

    shards = tmp_path / "lending.h5"
    cp = subprocess.run([sys.executable, "-m", "mpi_dp", "data", "prepare", "lending", "--source",
                         str(SHARED), "--out", str(shards), "--quiet"], capture_output=True,
                        text=True, timeout=300)
    assert cp.returncode == 0, cp.stderr
    job = str(Path(__file__).resolve().parents[1] / "jobs" / "sync_fig2_bands.toml")
    out = tmp_path / "fig2.h5"
    base = ["run", job, "--set", f'data="{shards}"', "--out", str(out), "--quiet",
            "--set", "runs=2", "--set", "T=10"]
    cp = mpi_run(2, base)
    assert cp.returncode != 0 and "holds only 666" in cp.stderr and "n_beyond_shard" in cp.stderr
    cp = mpi_run(2, [*base, "--set", 'n_beyond_shard="cap"'])
    assert cp.returncode == 0, cp.stderr
    with h5py.File(out, "r", locking=False) as f:
        assert f.attrs["status"] == "complete" and f.attrs["n_configs"] == 3
        np.testing.assert_array_equal(f["configs/000/n"][()], [666, 666, 666])
        assert np.isfinite(f["configs/002/metrics/psi"][()]).all()


def test_sparcs_min_records_too_high_names_file_and_leaves_nothing(tmp_path):
    out = tmp_path / "sp.h5"
    cp = subprocess.run([sys.executable, "-m", "mpi_dp", "data", "prepare", "sparcs", "--source",
                         str(SHARED), "--opt", "min_records=5000", "--out", str(out)],
                        capture_output=True, text=True, timeout=300)
    assert cp.returncode != 0
    assert "week10_df_musc_skel.csv.gz" in cp.stderr and "at least 5,000 records" in cp.stderr
    assert not out.exists() and list(tmp_path.iterdir()) == []


def test_cli_prepare_csv_generic_path(tmp_path):
    """`data prepare csv` on a file it has never seen, given --target: iid agents, hold-out
    excluded, per-agent test split, provenance stored."""
    src = SHARED / "creditcard_fraud" / "creditcard_first3065rows.csv"
    out = tmp_path / "g.h5"
    cp = subprocess.run([sys.executable, "-m", "mpi_dp", "data", "prepare", "csv", str(src),
                         "--target", "Amount", "--drop", "Time", "--partition", "iid",
                         "--agents", "4", "--public", "65", "--standardise", "--test-frac", "0.2",
                         "--out", str(out)], capture_output=True, text=True, timeout=300)
    assert cp.returncode == 0, cp.stderr
    with ShardFile(out) as f:
        assert f.n_agents == 4 and f.n_features == 29  # V1..V28 and Class
        rec = [f.read_agent_extra(i, "record") for i in range(4)]
        n_train = sum(f.read_agent(i)[0].shape[0] for i in range(4))
        n_test = sum(f.read_agent_test(i)[0].shape[0] for i in range(4))
    assert n_train + n_test == 4 * (3000 // 4)
    assert not np.intersect1d(np.concatenate(rec), np.arange(3000, 3065)).size
    assert sum(len(r) for r in rec) == n_train
    d = describe(out)
    assert d["recipe"] == "csv" and d["partition"]["kind"] == "iid"
    assert any(s["step"] == "standardise" and s["fitted_on"] == "hold-out"
               for s in d["preprocessing"])


@pytest.mark.parametrize("name, opts", [("lending", {"sizes": [500, 500]}), ("creditcard", {}),
                                        ("sparcs", {"min_records": 500})])
def test_csv_recipes_account_for_every_row_read(name, opts):
    """rows read = owners' records + hold-out + rows dropped (each with its reason), as the
    generic `data prepare csv` path records; a partition that leaves rows out says why."""
    p = build(name, **opts)
    d = p.decisions
    held = sum(x.shape[0] for x, _ in p.agents) + p.public[0].shape[0]
    assert d["rows_read"] > 0 and d["rows_read"] == held + sum(d["rows_dropped"].values())
    if name != "creditcard":
        assert any(("blocks" in k or "min_records" in k) and v > 0
                   for k, v in d["rows_dropped"].items()), d["rows_dropped"]
