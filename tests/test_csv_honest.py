"""`mpi-dp data prepare csv` reads your own data honestly: no silent guesses (placeholder cells,
decimal commas, repeated header names, title lines before the header), the text flags that settle
them (--na-values, --sep, --decimal, --skip-rows), one-hot and standardised by default, a test
file read with the training file's preprocessing, and the key value of each agent stored."""

from __future__ import annotations

import gzip
import re
import shlex
from pathlib import Path

import numpy as np
import pytest

from mpi_dp.cli import build_parser
from mpi_dp.cli import main as cli_main
from mpi_dp.data import ShardFile
from mpi_dp.data.prepare import Prepared, describe, write_prepared
from mpi_dp.data.prepare_cli import EPILOG, check_args

TARGET_MAP = '{">50K": 1, "<=50K": -1}'


def _prepare(args: list[str], capsys) -> tuple[int, str, str]:
    """`mpi-dp data prepare csv ...` in this process: (exit code, stdout, stderr)."""
    rc = cli_main(["data", "prepare", "csv", *args])
    out = capsys.readouterr()
    return rc, out.out, out.err


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def _error(args: list[str], capsys) -> str:
    """The one-line error of a command that must fail (exit code 2, no file written)."""
    rc, _, err = _prepare(args, capsys)
    assert rc == 2 and err.startswith("mpi-dp: error: ") and err.count("\n") == 1, err
    return err


# ----------------------------------------------------------------------------------------------
# placeholders


def _census(n: int = 40, holes: tuple[int, ...] = (3, 17, 29)) -> str:
    """A small census file: age numeric but '?' in the records `holes`, workclass with '?'."""
    lines = ["age,workclass,hours,income"]
    for i in range(n):
        age = "?" if i in holes else str(20 + i)
        work = "?" if i % 5 == 0 else ["Private", "State-gov"][i % 2]
        lines.append(f"{age},{work},{30 + i % 7},{'>50K' if i % 3 == 0 else '<=50K'}")
    return "\n".join(lines) + "\n"


def test_placeholder_in_a_numeric_column_is_an_error_naming_token_and_count(tmp_path, capsys):
    src = _write(tmp_path / "c.csv", _census())
    err = _error([str(src), "--target", "income", "--target-map", TARGET_MAP, "--task", "binary",
                  "--out", str(tmp_path / "c.h5")], capsys)
    assert "column 'age' is numbers except 3 cells '?'" in err
    assert "pass --na-values '?'" in err and "--categorical age" in err
    assert not (tmp_path / "c.h5").exists()


def test_na_values_make_placeholders_missing_imputed_and_counted(tmp_path, capsys):
    src, out = _write(tmp_path / "c.csv", _census()), tmp_path / "c.h5"
    rc, stdout, err = _prepare([str(src), "--target", "income", "--target-map", TARGET_MAP,
                                "--task", "binary", "--na-values", "?", "--agents", "2",
                                "--no-standardise", "--row-norm", "none", "--out", str(out)], capsys)
    assert rc == 0, err
    d = describe(out)["decisions"]
    # age: 3 '?' cells; workclass: 8 '?' cells (every 5th record): all missing now, imputed
    assert d["na_value_cells"] == {"?": 11} and d["na_values"] == ["?"]
    assert d["cells_imputed"] == {"missing value": 11}
    assert d["imputed_by_column"]["age"] == {"count": 3, "value": 0.0}
    with ShardFile(out) as f:
        names = f.feature_names
    assert names == ["age", "workclass=Private", "workclass=State-gov", "hours"]  # age numeric
    assert "missing also '?' (11 cells)" in stdout
    assert "cells imputed     11 (missing value: 11) with missing=zero" in stdout


def test_placeholder_in_a_categorical_column_is_kept_as_a_level_and_noted(tmp_path, capsys):
    src, out = _write(tmp_path / "c.csv", _census(holes=())), tmp_path / "c.h5"
    rc, stdout, err = _prepare([str(src), "--target", "income", "--positive", ">50K",
                                "--agents", "2", "--out", str(out)], capsys)
    assert rc == 0, err
    assert "note: column workclass: 8 cells are '?'; pass --na-values '?' if that means missing" \
        in stdout
    assert describe(out)["decisions"]["placeholder_cells"] == {"workclass": {"?": 8}}
    with ShardFile(out) as f:
        assert "workclass=?" in f.feature_names


# ----------------------------------------------------------------------------------------------
# delimiter and decimal comma


SEMICOLON = "price;rooms;city;y\n3,25;2;Lyon;1\n4,5;3;Nice;0\n12,75;5;Lyon;1\n7;4;Nice;0\n"


def test_decimal_commas_are_an_error_without_decimal_and_numbers_with_it(tmp_path, capsys):
    src, out = _write(tmp_path / "eu.csv", SEMICOLON), tmp_path / "eu.h5"
    err = _error([str(src), "--target", "y", "--agents", "1", "--out", str(out)], capsys)
    assert "column 'price' holds numbers with decimal commas such as '3,25'" in err
    assert "pass --decimal , (with a delimiter other than ',', e.g. --sep ';')" in err
    rc, stdout, err = _prepare([str(src), "--target", "y", "--agents", "1", "--sep", ";",
                                "--decimal", ",", "--no-standardise", "--row-norm", "none",
                                "--out", str(out)], capsys)
    assert rc == 0, err
    with ShardFile(out) as f:
        X, _ = f.read_agent(0)
        assert f.feature_names == ["price", "rooms", "city=Lyon", "city=Nice"]
    np.testing.assert_array_equal(np.sort(X[:, 0]), [3.25, 4.5, 7.0, 12.75])
    assert "csv format        delimiter ';', decimal ','" in stdout
    assert describe(out)["decisions"]["decimal"] == ","


def test_decimal_comma_with_a_comma_delimiter_is_refused(tmp_path, capsys):
    src = _write(tmp_path / "c.csv", "a,y\n1,2\n3,4\n")
    err = _error([str(src), "--target", "y", "--decimal", ",", "--out", str(tmp_path / "c.h5")],
                 capsys)
    assert "--decimal , but the fields are separated by ','" in err and "--sep" in err


def test_an_unlikely_sniffed_delimiter_is_refused(tmp_path, capsys):
    src = _write(tmp_path / "one.csv", "value\n1\n2\n")
    err = _error([str(src), "--target", "value", "--out", str(tmp_path / "o.h5")], capsys)
    assert "the delimiter sniffed from the first line ('value') is 'v'" in err and "--sep" in err


# ----------------------------------------------------------------------------------------------
# header


def test_duplicate_header_names_are_refused_with_their_column_numbers(tmp_path, capsys):
    src = _write(tmp_path / "d.csv", "x1,x2,x1,y,x2\n1,2,3,4,5\n6,7,8,9,10\n")
    err = _error([str(src), "--target", "y", "--out", str(tmp_path / "d.h5")], capsys)
    assert "the header names a column more than once: 'x1' (columns 1, 3); 'x2' (columns 2, 5)" \
        in err
    assert "--no-header --skip-rows 1 --names A,B,C" in err


def test_blank_header_cells_are_named_and_counted(tmp_path, capsys):
    src, out = _write(tmp_path / "b.csv", "a,,y\n1,2,3\n4,5,6\n"), tmp_path / "b.h5"
    rc, stdout, err = _prepare([str(src), "--target", "y", "--agents", "1", "--out", str(out)],
                               capsys)
    assert rc == 0, err
    assert describe(out)["decisions"]["header_cells_named"] == {"col2": 2}
    assert "header            1 blank cell(s) named col2 (column 2)" in stdout


@pytest.mark.parametrize("title", ["Exported from Foo on 2024-01-01", "Report: sales, 2024"])
def test_title_lines_before_the_header_need_skip_rows(tmp_path, capsys, title):
    body = "a,b,y\n" + "".join(f"{i},{2 * i},{i % 3}\n" for i in range(12))
    src, out = _write(tmp_path / "j.csv", f"{title}\n{body}"), tmp_path / "j.h5"
    err = _error([str(src), "--target", "y", "--out", str(out)], capsys)
    assert "skip them with --skip-rows N" in err and "--sep X" in err
    rc, stdout, err = _prepare([str(src), "--target", "y", "--skip-rows", "1", "--agents", "2",
                                "--no-standardise", "--row-norm", "none", "--out", str(out)], capsys)
    assert rc == 0, err
    with ShardFile(out) as f:
        assert f.feature_names == ["a", "b"] and sum(f.sizes()) == 12
    assert describe(out)["decisions"]["lines_skipped"] == 1 and "1 line skipped" in stdout


# ----------------------------------------------------------------------------------------------
# encodings and standardisation


def test_one_hot_by_default_and_frequency_above_the_level_limit(tmp_path, capsys):
    rows = "".join(f"{i},{'abc'[i % 3]},z{i % 6 % 5},{i % 2}\n" for i in range(30))  # z0 twice
    src, out = _write(tmp_path / "e.csv", "x,c,many,y\n" + rows), tmp_path / "e.h5"
    rc, stdout, err = _prepare([str(src), "--target", "y", "--agents", "1", "--opt",
                                "onehot_max_levels=4", "--row-norm", "none", "--out", str(out)], capsys)
    assert rc == 0, err
    with ShardFile(out) as f:
        assert f.feature_names == ["x", "c=a", "c=b", "c=c", "many"]
        X, _ = f.read_agent(0)
    assert set(np.unique(X[:, 1:4]).tolist()) == {0.0, 1.0}  # indicators are not standardised
    np.testing.assert_allclose([X[:, 0].mean(), X[:, 0].std(), X[:, 4].std()], [0, 1, 1],
                               atol=1e-12)
    d = describe(out)["decisions"]
    assert d["encodings"] == {"c": "onehot", "many": "frequency"}
    assert d["standardised"] == {"columns": 2, "fitted_on": "all", "records": 30, "onehot_left": 3}
    assert "encodings         one-hot 1 column (3 features), frequency 1 column" in stdout
    assert "standardised      2 columns with the mean and std of all 30 training records; " \
           "3 one-hot columns left 0/1" in stdout


def test_codes_only_when_asked_and_no_standardise_leaves_values(tmp_path, capsys):
    src, out = _write(tmp_path / "e.csv", "x,c,y\n5,b,1\n7,a,0\n9,b,1\n"), tmp_path / "e.h5"
    rc, stdout, err = _prepare([str(src), "--target", "y", "--agents", "1", "--encoding", "codes",
                                "--no-standardise", "--row-norm", "none", "--out", str(out)], capsys)
    assert rc == 0, err
    with ShardFile(out) as f:
        assert f.feature_names == ["x", "c"]
        np.testing.assert_array_equal(f.read_agent(0)[0], [[5, 1], [7, 0], [9, 1]])
    assert describe(out)["decisions"]["standardised"] == {"columns": 0, "why": "--no-standardise"}
    assert "standardised      none (--no-standardise)" in stdout


# ----------------------------------------------------------------------------------------------
# a test file


TRAIN = ("age,workclass,hours,income\n"
         + "".join(f"{20 + (i * 7) % 45},{['Private', 'State-gov', 'Self-emp'][i % 3]},"
                   f"{25 + (i * 5) % 30},{'>50K' if i % 4 == 0 else '<=50K'}\n" for i in range(60)))
# column order differs; 'Never-worked' is unseen in training; one age missing; one target empty
# and one target outside the map; an extra column is ignored
TEST = ("income,hours,extra,workclass,age\n"
        "<=50K,40,x,Private,30\n>50K,50,y,Never-worked,41\n<=50K,35,z,State-gov,\n"
        ",45,w,Private,50\n>50K.,30,v,Self-emp,60\n>50K,20,u,Self-emp,33\n")


def test_test_file_is_read_with_the_training_preprocessing(tmp_path, capsys):
    train, test = _write(tmp_path / "train.csv", TRAIN), _write(tmp_path / "test.csv", TEST)
    out = tmp_path / "t.h5"
    rc, stdout, err = _prepare([str(train), "--target", "income", "--target-map", TARGET_MAP,
                                "--task", "binary", "--agents", "3", "--test-file", str(test),
                                "--row-norm", "none", "--out", str(out)], capsys)
    assert rc == 0, err
    with ShardFile(out) as f:
        names = f.feature_names
        Xt, yt = f.read_test()
    assert names == ["age", "workclass=Private", "workclass=Self-emp", "workclass=State-gov", "hours"]
    # rows 4 (empty target) and 5 ('>50K.' not in the map) are dropped and counted
    np.testing.assert_array_equal(yt, [-1, 1, -1, 1])
    # standardised with the training file's mean and std (numpy, ddof 0), never the test file's
    raw = np.array([[int(v) for v in ln.split(",")[::2][:2]] for ln in TRAIN.splitlines()[1:]],
                   dtype=float)  # age, hours
    mean, std = raw.mean(axis=0), raw.std(axis=0)
    age = np.array([30, 41, 0, 33.0])  # the missing age gets training's fill (0, missing=zero)
    np.testing.assert_allclose(Xt[:, 0], (age - mean[0]) / std[0], rtol=1e-13)
    np.testing.assert_allclose(Xt[:, 4], (np.array([40, 50, 35, 20.0]) - mean[1]) / std[1],
                               rtol=1e-13)
    # training's category levels: the unseen 'Never-worked' is an all-zero one-hot row
    np.testing.assert_array_equal(Xt[:, 1:4], [[1, 0, 0], [0, 0, 0], [0, 0, 1], [0, 1, 0]])
    d = describe(out)["decisions"]
    assert d["test_rows_read"] == 6 and d["test_records"] == 4
    assert d["test_rows_dropped"] == {"missing target": 1, "target not in the target map": 1}
    assert d["test_unseen_categories"] == {"workclass": 1}
    assert d["test_cells_imputed"] == {"missing value": 1}
    assert d["test_columns_ignored"] == ["extra"]
    assert d["rows_read"] == 60  # the training figures are the training file's alone
    assert "other records     global test 4" in stdout
    assert "test file         6 rows read, 4 kept (global test set); dropped 2 (missing target: 1, " \
           "target not in the target map: 1); unseen categories 1 (workclass: 1)" in stdout


def test_test_file_lacking_a_training_column_is_an_error(tmp_path, capsys):
    train = _write(tmp_path / "train.csv", TRAIN)
    test = _write(tmp_path / "test.csv", "income,age,hours\n>50K,30,40\n")
    err = _error([str(train), "--target", "income", "--positive", ">50K", "--test-file", str(test),
                  "--out", str(tmp_path / "t.h5")], capsys)
    assert "test.csv: the test file lacks the training column(s) 'workclass'" in err


def test_test_file_and_test_frac_are_refused_together(tmp_path, capsys):
    train, test = _write(tmp_path / "train.csv", TRAIN), _write(tmp_path / "test.csv", TEST)
    err = _error([str(train), "--target", "income", "--positive", ">50K", "--test-file", str(test),
                  "--test-frac", "0.2", "--out", str(tmp_path / "t.h5")], capsys)
    assert "--test-file and --test-frac both make the evaluation set: give one" in err


# ----------------------------------------------------------------------------------------------
# the partition values


def test_key_partition_stores_each_agents_value(tmp_path, capsys):
    groups = ["White"] * 6 + ["Black/African American"] * 5 + ["Asian"] * 2 + ["Other"] * 4
    rows = "".join(f"{g},{i},{i % 3}\n" for i, g in enumerate(groups))
    src, out = _write(tmp_path / "k.csv", "race,x,y\n" + rows), tmp_path / "k.h5"
    rc, _, err = _prepare([str(src), "--target", "y", "--partition", "key", "--key", "race",
                           "--min-records", "3", "--out", str(out)], capsys)
    assert rc == 0, err
    with ShardFile(out) as f:
        assert f.partition_values() == ["Black/African American", "Other", "White"]
        assert f.attrs["partition_key"] == "race"
        assert f.sizes().tolist() == [5, 4, 6]
    hospitals = _write(tmp_path / "h.csv", "hospital,x,y\n" + "".join(
        f"{[7, 12, 7][i % 3]},{i},{i % 2}\n" for i in range(9)))
    rc, _, err = _prepare([str(hospitals), "--target", "y", "--partition", "key", "--key",
                           "hospital", "--out", str(out), "--overwrite"], capsys)
    assert rc == 0, err
    with ShardFile(out) as f:
        assert f.partition_values() == ["7", "12"]
    rc, _, err = _prepare([str(hospitals), "--target", "y", "--agents", "2", "--out", str(out),
                           "--overwrite"], capsys)
    with ShardFile(out) as f:
        assert f.partition_values() is None and "partition_key" not in f.attrs


def test_many_partition_values_go_to_a_public_dataset(tmp_path):
    n = 1100
    agents = [(np.full((1, 2), float(i)), np.array([float(i)])) for i in range(n)]
    values = [f"site {i:04d}" for i in range(n)]
    out = write_prepared(Prepared(agents=agents, task="regression", feature_names=["a", "b"],
                                  partition_key="site", partition_values=values),
                         tmp_path / "many.h5", recipe="csv", options={}, source="x")
    with ShardFile(out) as f:
        assert "partition_values" not in f.attrs and "partition_values" in f.public_extra_names()
        assert f.partition_values() == values and f.attrs["partition_key"] == "site"


# ----------------------------------------------------------------------------------------------
# the help


def _epilog_csv_examples() -> list[list[str]]:
    text = re.sub(r"\\\n\s*", " ", EPILOG.replace("{{", "{").replace("}}", "}"))
    return [shlex.split(m.group(0))[1:] for m in re.finditer(r"mpi-dp data prepare csv [^\n]*", text)]


def _adult_row(i: int, dot: str = "") -> str:
    """A UCI-adult-like record: 15 fields, ', ' between them, '?' where unknown."""
    work = "?" if i % 9 == 0 else ["Private", "State-gov", "Self-emp-inc"][i % 3]
    return ", ".join([str(17 + i % 60), work, str(10000 + i), "Bachelors", "13", "Never-married",
                      "Sales", "Husband", "White", ["Male", "Female"][i % 2], "0", "0",
                      str(20 + i % 40), "United-States", (">50K" if i % 4 == 0 else "<=50K") + dot])


def test_help_documents_the_flags_and_its_csv_examples_run_as_written(tmp_path, capsys,
                                                                      monkeypatch):
    with pytest.raises(SystemExit):
        cli_main(["data", "prepare", "--help"])
    text = capsys.readouterr().out
    assert "%%" not in text
    for flag in ("--test-file PATH", "--na-values A,B", "--sep X", "--decimal MARK",
                 "--skip-rows N", "--no-standardise", "onehot_max_levels"):
        assert flag in text, flag
    # every csv example of the epilog parses, passes the flag checks and runs on files like those
    # it names
    monkeypatch.chdir(tmp_path)
    rng = np.random.default_rng(0)
    cols = [f"f{j}" for j in range(12)]
    _write(tmp_path / "my.csv", ",".join([*cols, "price"]) + "\n" + "".join(
        ",".join(f"{v:.4f}" for v in rng.normal(size=13)) + "\n" for _ in range(1200)))
    with gzip.open(tmp_path / "visits.csv.gz", "wt") as fh:
        fh.write("hospital,age,los\n" + "".join(f"H{i % 4},{20 + i % 50},{1 + i % 9}\n"
                                                 for i in range(6000)))
    names = ["age", "workclass", "fnlwgt", "education", "education-num", "marital-status",
             "occupation", "relationship", "race", "sex", "capital-gain", "capital-loss",
             "hours-per-week", "native-country", "income"]
    _write(tmp_path / "adult_names.txt", "\n".join(names) + "\n")
    _write(tmp_path / "adult.data", "".join(_adult_row(i) + "\n" for i in range(1200)))
    _write(tmp_path / "adult.test", "|1x3 Cross validator\n"
           + "".join(_adult_row(i, ".") + "\n" for i in range(300)))
    _write(tmp_path / "sales.csv", "Sales export\nregion: all\nregion;units;price;revenue\n" + "".join(
        f"{'NSEW'[i % 4]};{i % 17};{i % 7},{i % 10}5;{i * 3 % 101},5\n" for i in range(80)))
    examples = _epilog_csv_examples()
    assert len(examples) == 4
    parser = build_parser()
    for args in examples:
        check_args(parser.parse_args(args))
        assert cli_main([*args, "--quiet"]) == 0, (args, capsys.readouterr().err)
    with ShardFile(tmp_path / "data" / "adult.h5") as f:
        assert f.has_global_test and f.read_test()[0].shape[0] == 300
    assert describe(tmp_path / "data" / "adult.h5")["decisions"]["na_value_cells"] == {"?": 134}


# ----------------------------------------------------------------------------------------------
# --test-split and the owners' names in `mpi-dp analyze`


def _grouped(n: int = 200) -> str:
    rng = np.random.default_rng(4)
    lines = ["x,z,grp,y"]
    for i in range(n):
        lines.append(f"{rng.normal(5, 2):.6f},{rng.normal(-1, 3):.6f},{'ab'[i % 2]}{i % 3},"
                     f"{rng.normal():.6f}")
    return "\n".join(lines) + "\n"


def test_test_split_holds_rows_out_before_anything_is_fitted(tmp_path, capsys):
    src = _write(tmp_path / "g.csv", _grouped())
    out = tmp_path / "g.h5"
    rc, stdout, err = _prepare([str(src), "--target", "y", "--partition", "key", "--key", "grp",
                                "--test-split", "0.25", "--row-norm", "none", "--out", str(out)],
                               capsys)
    assert rc == 0, err
    assert "global test 50" in stdout
    raw = np.loadtxt(src, delimiter=",", skiprows=1, usecols=(0, 1))
    with ShardFile(out) as f:
        held = np.concatenate([f.read_agent_extra(i, "record") for i in range(f.n_agents)])
        Xt, _ = f.read_test()
        values = f.partition_values()
    assert held.size == 150 and len(Xt) == 50
    test_rows = np.setdiff1d(np.arange(200), held)  # no owner holds a test row
    train = np.sort(held)
    mean, std = raw[train].mean(axis=0), raw[train].std(axis=0)  # training rows only
    np.testing.assert_allclose(Xt, (raw[test_rows] - mean) / std, rtol=1e-10)
    assert values == ["a0", "a1", "a2", "b0", "b1", "b2"]
    assert describe(out)["decisions"]["test_split"] == {"share": 0.25, "records": 50, "seed": 1}
    # the same seed gives the same split
    out2 = tmp_path / "g2.h5"
    assert _prepare([str(src), "--target", "y", "--partition", "key", "--key", "grp",
                     "--test-split", "0.25", "--row-norm", "none", "--out", str(out2)],
                    capsys)[0] == 0
    with ShardFile(out2) as f:
        assert np.array_equal(f.read_test()[0], Xt)
    assert "--test-split makes the global test set" in _error(
        [str(src), "--target", "y", "--test-split", "0.2", "--test-frac", "0.2",
         "--out", str(tmp_path / "x.h5")], capsys)


def test_analyze_names_the_owners_of_a_key_partition(tmp_path, capsys):
    from tests.helpers import mpi_run, write_job

    src = _write(tmp_path / "g.csv", _grouped())
    out = tmp_path / "g.h5"
    assert _prepare([str(src), "--target", "y", "--partition", "key", "--key", "grp",
                     "--out", str(out)], capsys)[0] == 0
    job = write_job(tmp_path / "j.toml", out, xi=1.0, T=5, runs=1, step={"L": 1.0})
    cp = mpi_run(1, ["run", str(job), "--quiet"])
    assert cp.returncode == 0, cp.stderr
    assert cli_main(["analyze", str(job.with_suffix(".h5"))]) == 0
    text = capsys.readouterr().out
    assert "owners by grp: 0 = 'a0', 1 = 'a1', 2 = 'a2', 3 = 'b0', 4 = 'b1', 5 = 'b2'" in text
