"""`mpi-dp data prepare csv`: headerless files, string targets, rejected flag combinations, and a
summary that accounts for every row read (records in the shard file + rows dropped by reason)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from mpi_dp.cli import main as cli_main
from mpi_dp.data import ShardFile
from mpi_dp.data.prepare import describe
from mpi_dp.data.readers import read_csv
from mpi_dp.errors import DataError

CENSUS_NAMES = ["age", "workclass", "education", "race", "hours", "income"]
TARGET_MAP = '{">50K": 1, "<=50K": -1}'


def _census_rows(n: int = 200) -> list[list[str]]:
    """Adult-census-like records with known defects: 3 empty workclass cells, 2 blank hours cells,
    an empty target (record 43) and a ragged row with one field too many (record 151)."""
    rows = []
    for i in range(n):
        rows.append([str(17 + (i * 13) % 60), ["Private", "Self-emp-inc", "State-gov"][i % 3],
                     ["Bachelors", "HS-grad", "Masters", "Some-college"][i % 4],
                     ["White", "Black", "Asian-Pac-Islander"][(i // 3) % 3],
                     str(10 + (i * 7) % 60), ">50K" if i % 4 == 0 else "<=50K"])
    for i in (5, 55, 105):
        rows[i][1] = ""
    for i in (8, 88):
        rows[i][4] = " "
    rows[42][5] = ""
    rows[150].insert(3, "extra")
    return rows


CENSUS_KEPT = [i for i in range(200) if i not in (42, 150)]  # 198 records


def _write_census(tmp_path: Path) -> Path:
    path = tmp_path / "adult.data"
    path.write_text("".join(", ".join(r) + "\n" for r in _census_rows()))  # ", " as in UCI adult
    return path


def _prepare_census(src: Path, out: Path, agents: int, public: int) -> subprocess.CompletedProcess:
    """`mpi-dp data prepare csv` of the census file with the documented flags, as a user runs it."""
    return subprocess.run([sys.executable, "-m", "mpi_dp", "data", "prepare", "csv", str(src),
                           "--no-header", "--names", ",".join(CENSUS_NAMES), "--target", "income",
                           "--target-map", TARGET_MAP, "--task", "binary", "--agents", str(agents),
                           "--public", str(public), "--out", str(out)],
                          capture_output=True, text=True, timeout=300)


def _prepare(args: list[str], capsys) -> tuple[int, str, str]:
    """`mpi-dp data prepare csv ...` in this process: (exit code, stdout, stderr)."""
    rc = cli_main(["data", "prepare", "csv", *args])
    out = capsys.readouterr()
    return rc, out.out, out.err


def _all_labels(path: Path) -> np.ndarray:
    with ShardFile(path) as f:
        return np.concatenate([*(f.read_agent(i)[1] for i in range(f.n_agents)), f.read_public()[1]])


# ----------------------------------------------------------------------------------------------
# end to end


def test_census_headerless_string_target_end_to_end(tmp_path):
    src, out = _write_census(tmp_path), tmp_path / "adult.h5"
    cp = _prepare_census(src, out, agents=4, public=18)
    assert cp.returncode == 0, cp.stderr
    # 200 rows read: the ragged row and the empty target are dropped, 198 = 4 x 45 + 18 public
    assert "rows read         200" in cp.stdout
    assert "rows dropped      2 (ragged row: 1, missing target: 1)" in cp.stdout
    assert "cells imputed     5 (missing value: 5) with missing=zero" in cp.stdout
    with ShardFile(out) as f:
        assert f.n_agents == 4 and f.task == "binary"
        # categorical columns one-hot by default (levels sorted), numeric ones as read
        assert f.feature_names == [
            "age", "workclass=Private", "workclass=Self-emp-inc", "workclass=State-gov",
            "education=Bachelors", "education=HS-grad", "education=Masters",
            "education=Some-college", "race=Asian-Pac-Islander", "race=Black", "race=White", "hours"]
        assert f.sizes().tolist() == [45, 45, 45, 45]
        records = np.concatenate([f.read_agent_extra(i, "record") for i in range(4)])
        X_pub, y_pub = f.read_public()
    assert sorted(records.tolist()) == list(range(180))  # every kept record has an owner
    labels = _all_labels(out)
    assert set(np.unique(labels).tolist()) == {-1.0, 1.0}
    assert int((labels == 1).sum()) == sum(1 for i in CENSUS_KEPT if i % 4 == 0) == 50
    # the hold-out is the last 18 kept records; numeric columns are standardised with the
    # hold-out's mean and std (the default), one-hot columns stay 0/1; then every row is scaled
    # to L2 norm <= 1 (the default --row-norm l2): a hot indicator holds the row's factor s
    tail = CENSUS_KEPT[-18:]
    hours = np.array([10 + (i * 7) % 60 for i in tail], dtype=float)
    s = X_pub[:, 1:11].max(axis=1)
    assert np.all(s > 0) and np.all(s <= 1.0)
    np.testing.assert_allclose(X_pub[:, 11] / s, (hours - hours.mean()) / hours.std(), rtol=1e-12)
    hot = X_pub[:, 1:11] > 0
    np.testing.assert_array_equal(X_pub[:, 1:11][hot], np.broadcast_to(s[:, None], hot.shape)[hot])
    assert np.all(np.linalg.norm(X_pub, axis=1) <= 1.0 + 1e-12)
    with ShardFile(out) as f:
        assert f.read_public_extra("row_norm_max").tolist() == [1.0]
    np.testing.assert_array_equal(y_pub, [1.0 if i % 4 == 0 else -1.0 for i in tail])
    d = describe(out)["decisions"]
    assert d["rows_read"] == 200 and d["rows_dropped"] == {"ragged row": 1, "missing target": 1}
    assert d["cells_imputed"] == {"missing value": 5}
    # per stored column: each one-hot column of workclass has the 3 empty cells
    assert d["imputed_by_column"]["workclass=Private"]["count"] == 3
    assert d["imputed_by_column"]["hours"]["count"] == 2
    assert d["encodings"] == {"workclass": "onehot", "education": "onehot", "race": "onehot"}
    assert d["ragged_rows"]["field_counts"] == {"7": 1}
    assert d["rows_read"] == 180 + 18 + sum(d["rows_dropped"].values())


def test_positive_gives_the_same_labels_as_the_target_map(tmp_path, capsys):
    src = _write_census(tmp_path)
    names = tmp_path / "names.txt"
    names.write_text("\n".join(f" {n} " for n in CENSUS_NAMES[:3]) + "\n\n" + "\n".join(CENSUS_NAMES[3:]))
    common = [str(src), "--no-header", "--names", f"@{names}", "--target", "income", "--agents", "2",
              "--public", "18", "--quiet"]
    rc, _, err = _prepare([*common, "--positive", ">50K", "--out", str(tmp_path / "p.h5")], capsys)
    assert rc == 0, err
    rc, _, err = _prepare([*common, "--target-map", TARGET_MAP, "--task", "binary",
                           "--out", str(tmp_path / "m.h5")], capsys)
    assert rc == 0, err
    np.testing.assert_array_equal(_all_labels(tmp_path / "p.h5"), _all_labels(tmp_path / "m.h5"))
    assert describe(tmp_path / "p.h5")["options"]["task"] == "binary"  # --positive implies binary


# ----------------------------------------------------------------------------------------------
# the reader's decisions, counted


def test_positive_value_matches_strings_and_equal_numbers_and_drops_missing(tmp_path):
    path = tmp_path / "p.csv"
    path.write_text("x,y\n1,1.0\n2,0\n3,\n4,1\n5,2\n6,NA\n")
    t = read_csv(path, "y", positive="1")
    np.testing.assert_array_equal(t.y, [1, -1, 1, -1])  # '1.0' and '1' positive; 0 and 2 negative
    np.testing.assert_array_equal(t.X[:, 0], [1, 2, 4, 5])
    assert t.info["rows_dropped"] == {"missing target": 2}  # missing is dropped, never negative
    assert t.info["positive"]["rows_positive"] == 2 and t.info["positive"]["rows_negative"] == 2


def test_target_map_unmapped_value_is_an_error_and_null_drops(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("x,status\n1, yes\n2,no \n3,maybe\n4,yes\n5,maybe\n6,\n")
    with pytest.raises(DataError, match=r"t\.csv: target 'status' has value\(s\) the target map does "
                                        r"not map: 'maybe' \(2 rows\); add them"):
        read_csv(path, "status", target_map={"yes": 1, "no": -1})
    t = read_csv(path, "status", target_map={" yes": 1, "no": -1, "maybe": None})
    np.testing.assert_array_equal(t.y, [1, -1, 1])  # blanks around values and keys are stripped
    np.testing.assert_array_equal(t.X[:, 0], [1, 2, 4])
    assert t.info["rows_dropped"] == {"missing target": 1, "target mapped to null": 2}
    assert t.info["target_counts"] == {"yes": 2, "no": 1, "maybe": 2}
    with pytest.raises(DataError, match=r"value of 'no' must be a finite number or null"):
        read_csv(path, "status", target_map={"yes": 1, "no": "-1"})


def test_non_finite_values_drop_rows_by_reason_and_nan_token_is_imputed(tmp_path):
    path = tmp_path / "nf.csv"
    path.write_text("x,z,y\n1,2,10\ninf,2,20\n3,1e400,30\n4,NaN,40\n5,-inf,50\n6,7,1e400\n7,8,inf\n"
                    "8,NAN,60\n9,9,\n")
    t = read_csv(path, "y")
    np.testing.assert_array_equal(t.X, [[1, 2], [4, 0]])
    np.testing.assert_array_equal(t.y, [10, 40])
    assert t.info["rows_dropped"] == {"missing target": 1, "non-finite target": 2,
                                      "non-finite feature value": 4}
    assert t.info["nonfinite_values"] == {"x": 1, "z": 3}  # inf; 1e400, -inf, NAN
    assert t.info["cells_imputed"] == {"missing value": 1}  # the NaN token
    assert t.info["n_rows_read"] == 9 == t.info["n_rows"] + sum(t.info["rows_dropped"].values())


def test_ragged_rows_dropped_and_short_rows_padded_are_counted(tmp_path):
    path = tmp_path / "r.csv"
    path.write_text("y,a,b\n1,2,3\n4,5,6,7\n7,8\n9\n")
    t = read_csv(path, "y")
    np.testing.assert_array_equal(t.X, [[2, 3], [8, 0], [0, 0]])
    np.testing.assert_array_equal(t.y, [1, 7, 9])
    assert t.info["rows_dropped"] == {"ragged row": 1}
    assert t.info["ragged_rows"] == {"count": 1, "expected_fields": 3, "than": "the header",
                                     "field_counts": {"4": 1}}
    assert t.info["short_rows_padded"] == {"count": 2, "records": [2, 3]}
    assert t.info["cells_imputed"] == {"short row": 3}
    dropped = read_csv(path, "y", missing="drop")
    np.testing.assert_array_equal(dropped.y, [1])
    assert dropped.info["rows_dropped"] == {"ragged row": 1, "missing feature value": 2}


def test_headerless_names_count_and_duplicates(tmp_path):
    path = tmp_path / "h.csv"
    path.write_text("1,a,10\n2,b,20\n")
    t = read_csv(path, "y", names=["x", "c", "y"])
    np.testing.assert_array_equal(t.X, [[1, 0], [2, 1]])  # the first row is a record
    assert t.info["n_rows_read"] == 2 and t.info["header"] == "none (names given)"
    with pytest.raises(DataError, match=r"h\.csv: 2 column names given but the first row has 3 fields"):
        read_csv(path, "y", names=["x", "y"])
    with pytest.raises(DataError, match=r"column name\(s\) 'x' given more than once"):
        read_csv(path, "y", names=["x", "x", "y"])


# ----------------------------------------------------------------------------------------------
# the command: partition accounting, clipping, rejections


def test_key_partition_counts_missing_keys_and_small_groups(tmp_path, capsys):
    races = ["A"] * 30 + ["B"] * 12 + ["C"] * 3 + [""] * 2
    path = tmp_path / "k.csv"
    path.write_text("race,x,y\n" + "".join(f"{r},{i},{i % 7}\n" for i, r in enumerate(races)))
    out = tmp_path / "k.h5"
    rc, stdout, err = _prepare([str(path), "--target", "y", "--partition", "key", "--key", "race",
                                "--min-records", "5", "--out", str(out)], capsys)
    assert rc == 0, err
    with ShardFile(out) as f:
        assert f.sizes().tolist() == [30, 12]
    d = describe(out)["decisions"]
    assert d["rows_dropped"] == {"missing key": 2, "key group under --min-records 5": 3}
    assert d["rows_read"] == 47 == 30 + 12 + sum(d["rows_dropped"].values())
    assert "rows dropped      5 (missing key: 2, key group under --min-records 5: 3)" in stdout


def test_partition_remainder_and_row_norm_clipping_are_counted(tmp_path, capsys):
    path = tmp_path / "c.csv"
    rows = [(0.1, 0.2), (3, 4), (0, 1), (1, 1), (0, 0), (-2, 0), (0.5, 0.5)]
    path.write_text("a,b,y\n" + "".join(f"{a},{b},{k}\n" for k, (a, b) in enumerate(rows)))
    out = tmp_path / "c.h5"
    rc, stdout, err = _prepare([str(path), "--target", "y", "--agents", "3", "--row-norm", "l2",
                                "--no-standardise", "--out", str(out)], capsys)
    assert rc == 0, err
    d = describe(out)["decisions"]
    # (3, 4), (1, 1) and (-2, 0) have norm > 1; (0, 1) has norm 1 exactly and is kept as is
    assert d["values_clipped"] == {"rows scaled to l2 norm 1 (--row-norm)": 3}
    assert d["rows_dropped"] == {"partition remainder (iid: equal shares of 2)": 1}
    with ShardFile(out) as f:
        X = np.vstack([f.read_agent(i)[0] for i in range(3)])
    assert np.linalg.norm(X, axis=1).max() <= 1 + 1e-12
    assert "values clipped    3 (rows scaled to l2 norm 1 (--row-norm): 3)" in stdout


@pytest.mark.parametrize("extra,message", [
    (["--opt", "target_map={'a': 1}"],
     "--opt 'target_map' is not an option of 'data prepare csv' (use --target-map); known: "
     "delimiter, onehot_max_levels"),
    (["--opt", "onehot_max_levels=0"], "--opt onehot_max_levels=0: must be a positive integer"),
    (["--key", "race"], "--key race needs --partition key"),
    (["--min-records", "5"], "--min-records applies to --partition key only"),
    (["--target-map", TARGET_MAP, "--positive", ">50K"],
     "--target-map and --positive both say how to read the target: give one"),
    (["--positive", ">50K", "--task", "regression"], "--positive makes a binary target (+1/-1); it "
     "cannot go with --task regression"),
    (["--target-map", "{'>50K': 1}"], "--target-map is not valid JSON"),
    (["--target-map", '{">50K": 1}'], "target 'income' has value(s) the target map does not map: "
     "'<=50K' (148 rows)"),
    (["--positive", ">50k"], "--positive '>50k' matches no row of target 'income'"),
    ([], "target column 'income' is not numeric (values such as '>50K', '<=50K'); map it to numbers "
     "with a target map (--target-map"),
])
def test_rejected_csv_arguments(tmp_path, capsys, extra, message):
    src, out = _write_census(tmp_path), tmp_path / "x.h5"
    rc, _, err = _prepare([str(src), "--no-header", "--names", ",".join(CENSUS_NAMES), "--target",
                           "income", "--out", str(out), *extra], capsys)
    assert rc == 2
    assert err.startswith("mpi-dp: error: ") and err.count("\n") == 1, err
    assert message in err
    assert not out.exists()


@pytest.mark.parametrize("args,message", [
    (["--no-header", "--target", "income"], "--no-header needs --names A,B,C"),
    (["--names", "a,b", "--target", "income"], "--names names the columns of a file without a "
     "header row: add --no-header"),
    (["--no-header", "--names", "age,workclass,income", "--target", "income"],
     "3 column names given but the first row has 6 fields; give exactly 6 names"),
    (["--no-header", "--names", ",".join(CENSUS_NAMES), "--target", "incme"],
     "target column 'incme' not found; the columns are: age, workclass, education, race, hours, income"),
])
def test_rejected_header_and_target_arguments(tmp_path, capsys, args, message):
    rc, _, err = _prepare([str(_write_census(tmp_path)), *args, "--out", str(tmp_path / "x.h5")], capsys)
    assert rc == 2 and message in err and err.count("\n") == 1, err


def test_flags_for_other_kinds_are_rejected(tmp_path, capsys):
    svm = tmp_path / "t.svm"
    svm.write_text("1 1:0.5\n-1 2:1\n")
    assert cli_main(["data", "prepare", "libsvm", str(svm), "--positive", "1"]) == 2
    assert "--positive: for CSV files only, not 'data prepare libsvm'" in capsys.readouterr().err
    assert cli_main(["data", "prepare", "lending", "--key", "x", "--target", "y"]) == 2
    assert "--target, --key: for 'data prepare csv|libsvm FILE' only" in capsys.readouterr().err


def test_cli_exit_code_2_without_traceback(tmp_path):
    """The help's old example (--key without --partition key) fails as a process: code 2, one line."""
    src = _write_census(tmp_path)
    cp = subprocess.run([sys.executable, "-m", "mpi_dp", "data", "prepare", "csv", str(src),
                         "--no-header", "--names", ",".join(CENSUS_NAMES), "--target", "hours",
                         "--key", "race", "--min-records", "5", "--out", str(tmp_path / "x.h5")],
                        capture_output=True, text=True, timeout=300)
    assert cp.returncode == 2 and "Traceback" not in cp.stderr
    assert cp.stderr == ("mpi-dp: error: --key race needs --partition key (one agent per 'race' value); "
                         "without it the split would be --partition iid\n")


def test_opt_delimiter_and_help_teaches_the_new_flags(tmp_path, capsys):
    path = tmp_path / "s.txt"
    path.write_text("a;b;y\n1;x;2\n3;z;4\n")
    out = tmp_path / "s.h5"
    rc, _, err = _prepare([str(path), "--target", "y", "--agents", "1", "--opt", "delimiter=;",
                           "--out", str(out), "--quiet"], capsys)
    assert rc == 0, err
    steps = describe(out)["preprocessing"]
    assert steps[0]["step"] == "read_csv" and steps[0]["target"] == "y"
    assert json.loads(json.dumps(describe(out)["decisions"]))["rows_read"] == 2
    with pytest.raises(SystemExit):
        cli_main(["data", "prepare", "--help"])
    text = capsys.readouterr().out
    for flag in ("--no-header", "--names A,B,C|@FILE", "--target-map JSON", "--positive VALUE"):
        assert flag in text
    assert "--partition key --key hospital" in text and '{">50K": 1, "<=50K": -1}' in text


def test_census_csv_from_file_to_analyze_with_documented_flags_only(tmp_path):
    """The issue's user path: a headerless CSV with a string target -> shard file (prepare
    csv) -> a logistic sync_star job under mpiexec -> analyze, which prints the test error
    beside the majority baseline."""
    from helpers import mpi_run, write_job

    src, shard = _write_census(tmp_path), tmp_path / "adult.h5"
    cp = _prepare_census(src, shard, agents=3, public=48)
    assert cp.returncode == 0, cp.stderr
    job = write_job(tmp_path / "census.toml", shard, loss="logistic", runs=2, T=30,
                    eps=float("inf"))
    cp = mpi_run(2, ["run", str(job), "--quiet"])
    assert cp.returncode == 0, cp.stderr
    cp = subprocess.run([sys.executable, "-m", "mpi_dp", "analyze", str(tmp_path / "census.h5")],
                        capture_output=True, text=True, timeout=300)
    assert cp.returncode == 0, cp.stderr
    assert "majority" in cp.stdout and "psi" in cp.stdout
    assert "error of always predicting the most frequent training label" in cp.stdout
