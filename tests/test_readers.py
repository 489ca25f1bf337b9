"""Readers: exact tables from small synthetic files, user-facing errors, and the real dataset copies."""

from __future__ import annotations

import bz2
import gzip
import hashlib
import json
import lzma
import os
import struct
import tarfile
import time
import zipfile
from pathlib import Path

import numpy as np
import pytest

from mpi_dp.data.readers import (
    MISSING_TOKENS,
    read_csv,
    read_idx,
    read_leaf,
    read_libsvm,
    read_mnist,
    read_movielens,
    sha256_file,
)
from mpi_dp.errors import DataError

DATA = Path(__file__).resolve().parents[2] / "shared" / "data"


def _data_file(rel: str) -> Path:
    """A real dataset copy under shared/data, or skip the test saying which file is absent."""
    path = DATA / rel
    if not path.exists():
        pytest.skip(f"real dataset copy {path} is absent (shared/data not mounted here)")
    return path


def _write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_bytes(text.encode("utf-8"))
    return path


def _eq(a, b) -> None:
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


# ----------------------------------------------------------------------------------------------
# CSV: values


def test_numeric_percent_and_provenance(tmp_path):
    path = _write(tmp_path, "t.csv", "a,rate,b,y\n1,13.5%,2.5,1\n-2, 7% ,1e3,0\n3.25,100%,0,1\n")
    t = read_csv(path, "y")
    _eq(t.X, [[1, 13.5, 2.5], [-2, 7, 1000], [3.25, 100, 0]])
    assert t.X.dtype == np.float64 and t.y.dtype == np.float64
    _eq(t.y, [1, 0, 1])
    assert t.feature_names == ["a", "rate", "b"] and t.target == "y" and t.keys == {}
    rec = t.info["files"][0]
    assert rec["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest() == sha256_file(path)
    assert rec["size"] == path.stat().st_size and Path(rec["path"]) == path.resolve()
    assert json.loads(json.dumps(t.info)) == t.info


MISSING_CSV = "a,b,y\n1,,10\nNA,4,20\n2,6,30\n9,N/A,40\n4,20,50\n"
# a observed 1, 2, 9, 4 (mean 4, median 3); b observed 4, 6, 20 (mean 10, median 6)
MISSING_EXPECTED = {
    "zero": [[1, 0], [0, 4], [2, 6], [9, 0], [4, 20]],
    "mean": [[1, 10], [4, 4], [2, 6], [9, 10], [4, 20]],
    "median": [[1, 6], [3, 4], [2, 6], [9, 6], [4, 20]],
}


@pytest.mark.parametrize("policy", ["zero", "mean", "median"])
def test_missing_imputation(tmp_path, policy):
    t = read_csv(_write(tmp_path, "m.csv", MISSING_CSV), "y", missing=policy)
    _eq(t.X, MISSING_EXPECTED[policy])
    _eq(t.y, [10, 20, 30, 40, 50])
    assert t.info["imputed"]["a"]["count"] == 1 and t.info["imputed"]["b"]["count"] == 2


def test_missing_drop_and_error(tmp_path):
    path = _write(tmp_path, "m.csv", MISSING_CSV)
    t = read_csv(path, "y", missing="drop")
    _eq(t.X, [[2, 6], [4, 20]])
    _eq(t.y, [30, 50])
    assert t.info["rows_dropped"]["missing feature value"] == 3 and t.info["n_rows"] == 2
    with pytest.raises(DataError, match=r"m\.csv.*missing values.*'a' \(1\).*'b' \(2\).*in record 1 "):
        read_csv(path, "y", missing="error")


def test_every_missing_token_and_missing_target(tmp_path):
    rows = "".join(f"{tok},{k}\n" for k, tok in enumerate(MISSING_TOKENS))
    path = _write(tmp_path, "tok.csv", "x,y\n" + rows + "5,\n7,NA\n3,99\n")
    t = read_csv(path, "y")
    # every token is missing in x (-> 0); the rows with an empty or NA target are dropped
    _eq(t.X[:, 0], [0] * len(MISSING_TOKENS) + [3])
    _eq(t.y, list(range(len(MISSING_TOKENS))) + [99])
    assert t.info["rows_dropped"]["missing target"] == 2 and t.info["n_rows_read"] == len(MISSING_TOKENS) + 3


CAT_CSV = "color,size,y\nred,S,1\nblue,M,2\nred,,3\ngreen,S,4\n"


def test_codes_encoding(tmp_path):
    t = read_csv(_write(tmp_path, "c.csv", CAT_CSV), "y", encoding="codes")
    # levels sorted: blue=0, green=1, red=2; M=0, S=1; the missing size -> 0 under missing="zero"
    _eq(t.X, [[2, 1], [0, 0], [2, 0], [1, 1]])
    assert t.feature_names == ["color", "size"]
    assert t.info["encodings"]["color"] == {"encoding": "codes", "levels": ["blue", "green", "red"]}
    assert t.info["encodings"]["size"]["levels"] == ["M", "S"]


def test_onehot_encoding_with_zero_and_mean(tmp_path):
    path = _write(tmp_path, "c.csv", CAT_CSV)
    t = read_csv(path, "y", encoding="onehot")
    assert t.feature_names == ["color=blue", "color=green", "color=red", "size=M", "size=S"]
    _eq(t.X, [[0, 0, 1, 0, 1], [1, 0, 0, 1, 0], [0, 0, 1, 0, 0], [0, 1, 0, 0, 1]])
    m = read_csv(path, "y", encoding="onehot", missing="mean")
    np.testing.assert_allclose(m.X[2], [0, 0, 1, 1 / 3, 2 / 3])


def test_frequency_and_auto_encoding(tmp_path):
    path = _write(tmp_path, "c.csv", CAT_CSV)
    t = read_csv(path, "y", encoding="frequency")
    # color: red 2/4, blue 1/4, green 1/4; size among the 3 observed: S 2/3, M 1/3; missing -> 0
    np.testing.assert_allclose(t.X, [[0.5, 2 / 3], [0.25, 1 / 3], [0.5, 0], [0.25, 2 / 3]])
    np.testing.assert_allclose(t.info["encodings"]["color"]["frequencies"], [0.25, 0.25, 0.5])
    a = read_csv(path, "y", encoding="auto", onehot_max_levels=2)
    assert a.feature_names == ["color", "size=M", "size=S"]
    np.testing.assert_allclose(a.X, [[0.5, 0, 1], [0.25, 1, 0], [0.5, 0, 0], [0.25, 0, 1]])
    assert a.info["encodings"]["color"]["encoding"] == "frequency"
    assert a.info["encodings"]["size"]["encoding"] == "onehot"


def test_keys_are_not_features_and_follow_dropped_rows(tmp_path):
    path = _write(tmp_path, "k.csv", "user,fac,x,y\nbob,7,1.0,1\namy,3,,0\nbob,7,3.0,1\ncy,12,4,0\n")
    t = read_csv(path, "y", keys=["user", "fac"], missing="drop")
    assert t.feature_names == ["x"]
    _eq(t.X[:, 0], [1, 3, 4])
    assert t.keys["fac"].dtype == np.int64
    _eq(t.keys["fac"], [7, 7, 12])
    _eq(t.keys["user"], [0, 0, 1])  # levels of the kept rows: bob, cy
    assert t.info["keys"]["user"]["levels"] == ["bob", "cy"]


def test_columns_drop_and_unknown_names(tmp_path):
    path = _write(tmp_path, "s.csv", "a,b,c,d,y\n1,2,3,4,5\n6,7,8,9,10\n")
    assert read_csv(path, "y", columns=["c", "a"]).feature_names == ["a", "c"]
    t = read_csv(path, "y", drop=["b"])
    assert t.feature_names == ["a", "c", "d"] and t.info["dropped_columns"]["b"] == "listed in drop"
    _eq(t.X, [[1, 3, 4], [6, 8, 9]])
    for option in ("columns", "drop", "keys", "categorical"):
        with pytest.raises(DataError, match=rf"s\.csv.*unknown column.*{option}.*'zz'"):
            read_csv(path, "y", **{option: ["a", "zz"]})


def test_max_missing_frac_entirely_missing_and_constant(tmp_path):
    path = _write(tmp_path, "f.csv", "half,none,const,x,y\n1,,5,1,1\n,,5,2,2\n2,NA,5,3,3\n,,5,4,4\n")
    t = read_csv(path, "y", max_missing_frac=0.4)
    assert t.feature_names == ["const", "x"]
    assert t.info["dropped_columns"]["none"] == "entirely missing"
    assert "max_missing_frac" in t.info["dropped_columns"]["half"]
    _eq(t.X[:, 0], [5, 5, 5, 5])
    assert read_csv(path, "y", max_missing_frac=0.5).feature_names == ["half", "const", "x"]


def test_explicit_categorical_and_converters(tmp_path):
    path = _write(tmp_path, "e.csv", "zip,term,grade,y\n9,36 months,B,1\n10,60 months,A,2\n9,36 months,C,3\n")
    t = read_csv(path, "y", categorical=["zip", "grade"], converters={"term": lambda s: float(s.split()[0])})
    # zip is numeric but listed: categorical with string-sorted levels "10" < "9"
    _eq(t.X, [[1, 36, 1], [0, 60, 0], [1, 36, 2]])
    assert t.info["encodings"]["zip"]["levels"] == ["10", "9"]
    assert t.info["column_kinds"] == {"zip": "categorical", "term": "converted", "grade": "categorical"}
    expected = r"e\.csv.*converter for column 'term' failed on '36 months' in record 1 "
    with pytest.raises(DataError, match=expected):
        read_csv(path, "y", categorical=["grade"], converters={"term": float})


def test_target_map_and_non_numeric_target(tmp_path):
    path = _write(tmp_path, "t.csv", "x,status\n1,Fully Paid\n2,Charged Off\n3,Current\n4,Fully Paid\n")
    with pytest.raises(DataError, match=r"t\.csv.*target column 'status' is not numeric.*--target-map.*"
                                        r"--positive"):
        read_csv(path, "status")
    # a label the map lacks is an error naming it and its rows, never a silent drop
    with pytest.raises(DataError, match=r"t\.csv: target 'status' has value\(s\) the target map does "
                                        r"not map: 'Current' \(1 row\)"):
        read_csv(path, "status", target_map={"Fully Paid": 1, "Charged Off": -1})
    t = read_csv(path, "status", target_map={"Fully Paid": 1, "Charged Off": -1, "Current": None})
    _eq(t.y, [1, -1, 1])
    _eq(t.X[:, 0], [1, 2, 4])
    assert t.info["rows_dropped"] == {"target mapped to null": 1}
    assert t.info["target_map"] == {"Fully Paid": 1.0, "Charged Off": -1.0, "Current": None}
    with pytest.raises(DataError, match="either a target map or a positive value"):
        read_csv(path, "status", target_map={"Fully Paid": 1}, positive="Fully Paid")


def test_delimiters_quotes_and_compression(tmp_path):
    plain = read_csv(_write(tmp_path, "p.csv", 'a,name,y\n1,"x, y",2\n3,z,4\n'), "y")
    _eq(plain.X, [[1, 0], [3, 1]])
    assert plain.info["encodings"]["name"]["levels"] == ["x, y", "z"]
    for sep in (";", "\t", "|"):
        path = _write(tmp_path, "s.txt", f'a{sep}name{sep}y\n1{sep}"x, y"{sep}2\n3{sep}z{sep}4\n')
        t = read_csv(path, "y")
        assert t.info["delimiter"] == "sniffed" and t.info["parser"].startswith("pandas ")
        _eq(t.X, plain.X)
        given = read_csv(path, "y", delimiter=sep)
        assert given.info["delimiter"] == sep
        _eq(given.X, plain.X)
    raw = b'a,name,y\n1,"x, y",2\n3,z,4\n'
    for suffix, compress in ((".gz", gzip.compress), (".bz2", bz2.compress), (".xz", lzma.compress)):
        path = tmp_path / f"c.csv{suffix}"
        path.write_bytes(compress(raw))
        t = read_csv(path, "y")
        _eq(t.X, plain.X)
        assert t.info["files"][0]["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()


def test_short_rows_padded_long_rows_dropped(tmp_path):
    t = read_csv(_write(tmp_path, "s.csv", "a,b,y\n1,2,3\n4,5,6\n7,8"), "b")
    _eq(t.X, [[1, 3], [4, 6], [7, 0]])
    assert t.info["short_rows_padded"] == {"count": 1, "records": [3]}
    assert t.info["cells_imputed"] == {"short row": 1} and t.info["rows_dropped"] == {}
    long = read_csv(_write(tmp_path, "l.csv", "a,b,y\n1,2,3\n4,5,6,7\n8,9,10\n"), "y")
    _eq(long.X, [[1, 2], [8, 9]])
    assert long.info["rows_dropped"] == {"ragged row": 1} and long.info["n_rows_read"] == 3


# ----------------------------------------------------------------------------------------------
# CSV: errors


def test_missing_target_column(tmp_path):
    path = _write(tmp_path, "nt.csv", "alpha,beta,gamma\n1,2,3\n")
    with pytest.raises(DataError, match=r"nt\.csv: target column 'label' not found.*alpha, beta, gamma"):
        read_csv(path, "label")


def test_non_numeric_column_rejected(tmp_path):
    path = _write(tmp_path, "nn.csv", "x,city,kind,y\n1,Paris,a,1\n2,Rome,b,2\n")
    expected = r"nn\.csv: column 'city' is not numeric.*'Paris'.*--categorical city\)"
    with pytest.raises(DataError, match=expected):
        read_csv(path, "y", categorical=None)
    with pytest.raises(DataError, match=r"nn\.csv: column 'city' is not numeric.*--categorical"):
        read_csv(path, "y", categorical=["kind"])
    assert read_csv(path, "y", categorical=["kind", "city"]).feature_names == ["x", "city", "kind"]


@pytest.mark.parametrize("suffix,compress,kind", [(".gz", gzip.compress, "gzip"),
                                                  (".bz2", bz2.compress, "bzip2"),
                                                  (".xz", lzma.compress, "xz")])
def test_truncated_compressed_file(tmp_path, suffix, compress, kind):
    body = "a,y\n" + "".join(f"{i},{i * 0.5}\n" for i in range(2000))
    blob = compress(body.encode())
    path = tmp_path / f"cut.csv{suffix}"
    path.write_bytes(blob[:-20])
    with pytest.raises(DataError, match=rf"cut\.csv{suffix}: truncated or corrupt {kind} file"):
        read_csv(path, "y")


def test_bad_options(tmp_path):
    path = _write(tmp_path, "o.csv", "a,y\n1,2\n")
    with pytest.raises(DataError, match="encoding must be one of"):
        read_csv(path, "y", encoding="ordinal")
    with pytest.raises(DataError, match="missing must be one of"):
        read_csv(path, "y", missing="ignore")
    with pytest.raises(DataError, match=r"o\.csv: no such file"):
        read_csv(tmp_path / "absent" / "o.csv", "y")


# ----------------------------------------------------------------------------------------------
# LIBSVM

LIBSVM_TEXT = """# a comment line
+1 1:0.5 3:2 # trailing comment
-1 qid:3 2:1.5 2:0.25 4:-1

1
-1 4:3 1:1
"""
LIBSVM_DENSE = [[0.5, 0, 2, 0], [0, 1.75, 0, -1], [0, 0, 0, 0], [1, 0, 0, 3]]


def test_libsvm_matches_dense(tmp_path):
    path = _write(tmp_path, "t.svm", LIBSVM_TEXT)
    t = read_libsvm(path)
    _eq(t.X.toarray(), LIBSVM_DENSE)
    _eq(t.y, [1, -1, 1, -1])
    assert t.X.format == "csr" and t.X.dtype == np.float64 and t.X.has_sorted_indices
    assert t.X.nnz == 6  # the two entries of feature 2 on line 3 are summed into one
    assert t.feature_names == ["f1", "f2", "f3", "f4"]
    wide = read_libsvm(path, n_features=6)
    assert wide.X.shape == (4, 6)
    _eq(wide.X.toarray()[:, :4], LIBSVM_DENSE)
    with pytest.raises(DataError, match=r"t\.svm: has feature index 4 but n_features = 3"):
        read_libsvm(path, n_features=3)
    packed = tmp_path / "t.svm.bz2"
    packed.write_bytes(bz2.compress(LIBSVM_TEXT.encode()))
    _eq(read_libsvm(packed).X.toarray(), LIBSVM_DENSE)


@pytest.mark.parametrize("bad,line", [("1 3:abc", 3), ("1 0:1.0", 3), ("1 2", 3), ("yes 1:1", 3)])
def test_libsvm_malformed_line(tmp_path, bad, line):
    path = _write(tmp_path, "bad.svm", f"1 1:1\n\n{bad}\n-1 2:2\n")
    with pytest.raises(DataError, match=rf"bad\.svm: malformed LIBSVM line {line}"):
        read_libsvm(path)


# ----------------------------------------------------------------------------------------------
# IDX / MNIST


def _idx(magic: int, array: np.ndarray) -> bytes:
    return struct.pack(">I", magic) + b"".join(struct.pack(">I", d) for d in array.shape) + array.tobytes()


def test_idx_roundtrip_and_errors(tmp_path):
    images = np.arange(2 * 3 * 4, dtype=np.uint8).reshape(2, 3, 4)
    (tmp_path / "img").write_bytes(_idx(2051, images))
    (tmp_path / "lab.gz").write_bytes(gzip.compress(_idx(2049, np.array([7, 1, 9], np.uint8))))
    _eq(read_idx(tmp_path / "img"), images)
    assert read_idx(tmp_path / "img").shape == (2, 3, 4)
    _eq(read_idx(tmp_path / "lab.gz"), [7, 1, 9])
    (tmp_path / "magic").write_bytes(_idx(2050, images))
    with pytest.raises(DataError, match=r"magic: bad IDX magic number 2050"):
        read_idx(tmp_path / "magic")
    (tmp_path / "short").write_bytes(_idx(2051, images)[:-5])
    expected = r"short: IDX data short: shape \(2, 3, 4\) needs 40 bytes, file has 35$"
    with pytest.raises(DataError, match=expected):
        read_idx(tmp_path / "short")


def test_read_mnist_fake_directory(tmp_path):
    rng = np.random.default_rng(3)
    parts = {}
    for prefix, n in (("train", 5), ("t10k", 3)):
        parts[prefix] = (rng.integers(0, 256, size=(n, 28, 28), dtype=np.uint8),
                         rng.integers(0, 10, size=n, dtype=np.uint8))
        (tmp_path / f"{prefix}-images-idx3-ubyte.gz").write_bytes(gzip.compress(_idx(2051, parts[prefix][0])))
        (tmp_path / f"{prefix}-labels-idx1-ubyte").write_bytes(_idx(2049, parts[prefix][1]))
    train, test = read_mnist(tmp_path)
    for t, prefix in ((train, "train"), (test, "t10k")):
        _eq(t.X, parts[prefix][0].reshape(-1, 784).astype(np.float64))
        _eq(t.y, parts[prefix][1])
        assert t.X.dtype == np.float64 and len(t.feature_names) == 784
    os.remove(tmp_path / "t10k-labels-idx1-ubyte")
    with pytest.raises(DataError, match="no t10k-labels-idx1-ubyte"):
        read_mnist(tmp_path)


# ----------------------------------------------------------------------------------------------
# LEAF


def _leaf_doc(users: dict[str, tuple[list, list]]) -> str:
    return json.dumps({"users": list(users), "num_samples": [len(y) for _, y in users.values()],
                       "user_data": {u: {"x": x, "y": y} for u, (x, y) in users.items()}})


@pytest.fixture
def leaf_tree(tmp_path) -> Path:
    root = tmp_path / "femnist"
    (root / "data" / "train").mkdir(parents=True)
    (root / "data" / "test").mkdir(parents=True)
    (root / "data" / "train" / "a.json").write_text(_leaf_doc({
        "u2": ([[0.1, 0.2], [0.3, 0.4]], [5, 61]), "u3": ([[0.5, 0.5]], [1])}))
    (root / "data" / "train" / "b.json").write_text(_leaf_doc({"u1": ([[1.0, 0.0]], [0])}))
    (root / "data" / "test" / "a.json").write_text(_leaf_doc({
        "u1": ([[0.9, 0.8]], [2]), "u4": ([[0.0, 0.0]], [3]), "u2": ([[0.7, 0.6]], [4])}))
    return root


def test_leaf_require_both(leaf_tree):
    train, test = read_leaf(leaf_tree)
    assert train.info["users"] == ["u1", "u2"]
    _eq(train.X, [[1.0, 0.0], [0.1, 0.2], [0.3, 0.4]])
    _eq(train.y, [0, 5, 61])
    _eq(train.keys["user"], [0, 1, 1])
    _eq(test.X, [[0.9, 0.8], [0.7, 0.6]])
    _eq(test.keys["user"], [0, 1])
    train_all, test_all = read_leaf(leaf_tree, require_both=False)
    assert train_all.info["users"] == ["u1", "u2", "u3", "u4"]
    _eq(train_all.keys["user"], [0, 1, 1, 2])
    _eq(test_all.keys["user"], [0, 1, 3])
    _eq(test_all.y, [2, 4, 3])


@pytest.mark.parametrize("mode,suffix", [("w:gz", ".tar.gz"), ("w:xz", ".tar.xz")])
def test_leaf_archive_equals_directory(leaf_tree, tmp_path, mode, suffix):
    archive = tmp_path / f"leaf{suffix}"
    with tarfile.open(archive, mode) as tf:
        tf.add(leaf_tree, arcname="femnist")
    for a, b in zip(read_leaf(leaf_tree), read_leaf(archive), strict=True):
        _eq(a.X, b.X)
        _eq(a.y, b.y)
        _eq(a.keys["user"], b.keys["user"])
        assert a.info["users"] == b.info["users"]
    assert read_leaf(archive)[0].info["files"][0]["sha256"] == sha256_file(archive)


def test_leaf_errors(leaf_tree, tmp_path):
    bad = leaf_tree / "data" / "test" / "a.json"
    doc = json.loads(bad.read_text())
    doc["num_samples"][0] = 7
    bad.write_text(json.dumps(doc))
    with pytest.raises(DataError, match=r"a\.json: user 'u1' has .*num_samples 7"):
        read_leaf(leaf_tree)
    bad.unlink()
    with pytest.raises(DataError, match=r"no test/\*\.json files found"):
        read_leaf(leaf_tree)


# ----------------------------------------------------------------------------------------------
# MovieLens


def _fake_ml100k(folder: Path) -> None:
    folder.mkdir(parents=True)
    (folder / "u.data").write_text(
        "2\t3\t5\t881250949\n1\t1\t3\t891717742\n3\t2\t1\t878887116\n2\t1\t4\t880606923\n")
    flags = ["|".join("1" if g in on else "0" for g in range(19)) for on in ({1, 5}, {0}, {18, 7})]
    items = [f"1|Toy Story (1995)|01-Jan-1995||http://x|{flags[0]}",
             f"3|Caf\u00e9 Society (1996)|01-Jan-1996||http://z|{flags[2]}",
             f"2|Unknown|||http://y|{flags[1]}"]
    (folder / "u.item").write_bytes(("\n".join(items) + "\n").encode("latin-1"))
    (folder / "u.user").write_text("1|24|M|technician|85711\n3|23|M|writer|32067\n2|53|F|other|94043\n")
    (folder / "u.genre").write_text("".join(f"g{k}|{k}\n" for k in range(19)) + "\n")


def _same_movielens(a, b) -> None:
    for field in ("user", "item", "rating", "timestamp", "item_genres", "user_age", "user_gender",
                  "user_occupation"):
        _eq(getattr(a, field), getattr(b, field))
    assert a.item_titles == b.item_titles


def test_movielens_folder_zip_and_tar(tmp_path):
    _fake_ml100k(tmp_path / "ml-100k")
    d = read_movielens(tmp_path / "ml-100k")
    _eq(d.user, [1, 0, 2, 1])
    _eq(d.item, [2, 0, 1, 0])
    _eq(d.rating, [5, 3, 1, 4])
    _eq(d.timestamp, [881250949, 891717742, 878887116, 880606923])
    assert d.item_titles == ["Toy Story (1995)", "Unknown", "Caf\u00e9 Society (1996)"]
    _eq(d.item_genres.sum(axis=1), [2, 1, 2])
    assert d.item_genres[2, 18] == 1 and d.item_genres[2, 7] == 1 and d.item_genres[1, 0] == 1
    _eq(d.user_age, [24, 53, 23])
    _eq(d.user_gender, [1, 0, 1])
    assert d.info["occupation_levels"] == ["other", "technician", "writer"]
    _eq(d.user_occupation, [1, 0, 2])
    assert d.info["genres"][:2] == ["g0", "g1"]
    assert d.info["rating_counts"] == {"1": 1, "3": 1, "4": 1, "5": 1}
    _same_movielens(d, read_movielens(tmp_path))  # the parent folder of ml-100k works too

    archive = tmp_path / "ml-100k.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        for f in sorted((tmp_path / "ml-100k").iterdir()):
            zf.write(f, f"ml-100k/{f.name}")
        zf.writestr("__MACOSX/ml-100k/._u.data", b"junk")
    _same_movielens(d, read_movielens(archive))
    tar = tmp_path / "ml-100k.tar.xz"
    with tarfile.open(tar, "w:xz") as tf:
        tf.add(tmp_path / "ml-100k", arcname="ml-100k")
    _same_movielens(d, read_movielens(tar))


def test_movielens_errors(tmp_path):
    _fake_ml100k(tmp_path / "ml-100k")
    with open(tmp_path / "ml-100k" / "u.data", "a") as fh:
        fh.write("4\t1\t2\t880606923\n")
    with pytest.raises(DataError, match=r"u\.data: user ids outside 1\.\.3"):
        read_movielens(tmp_path / "ml-100k")
    (tmp_path / "ml-100k" / "u.user").unlink()
    with pytest.raises(DataError, match=r"not a MovieLens-100K folder \(missing u\.user\)"):
        read_movielens(tmp_path / "ml-100k")
    broken = tmp_path / "broken.zip"
    broken.write_bytes(b"PK\x03\x04 not really a zip")
    with pytest.raises(DataError, match=r"broken\.zip: truncated or corrupt archive"):
        read_movielens(broken)


# ----------------------------------------------------------------------------------------------
# the real dataset copies (counts from shared/data/SOURCES.md)


def test_real_sparcs():
    path = _data_file("sparcs2020_musculoskeletal/week10_df_musc_skel.csv.gz")
    start = time.perf_counter()
    t = read_csv(path, "los", keys=["Permanent.Facility.Id"])
    assert time.perf_counter() - start < 30  # a few seconds normally; guards against quadratic parsing
    assert t.X.shape == (36631, 26) and t.info["n_rows_read"] == 36631
    assert t.y.min() == 1 and t.y.max() == 120 and np.median(t.y) == 4
    fac = t.keys["Permanent.Facility.Id"]
    ids, counts = np.unique(fac, return_counts=True)
    assert len(ids) == 169 and (counts >= 500).sum() == 23 and (counts >= 1000).sum() == 3
    assert dict(zip(ids[counts >= 1000].tolist(), counts[counts >= 1000].tolist(), strict=True)) == {
        1: 1028, 210: 1095, 413: 1143}
    assert "Permanent.Facility.Id" not in t.feature_names and "Total.Charges" in t.feature_names


def test_real_lending_club():
    t = read_csv(_data_file("lending_club/loan_kaggle2018_first2433rows.csv"), "int_rate")
    assert t.X.shape[0] == 2433 and t.info["n_columns_read"] == 145
    assert t.y.min() == 6.46 and t.y.max() == 30.75 and abs(t.y.mean() - 12.6) < 0.05
    assert t.info["dropped_columns"]["id"] == "entirely missing"
    assert t.info["short_rows_padded"]["count"] == 1  # the copy's last line is cut short
    assert t.info["encodings"]["grade"]["levels"][:3] == ["A", "B", "C"]
    assert np.isfinite(t.X).all()

    a = read_csv(_data_file("lending_club/LoanStats3a_DaylanSit_16col.csv"), "loan_status",
                 target_map={"Fully Paid": 1, "Charged Off": -1})
    assert a.X.shape[0] == 39786 and (a.y == 1).sum() == 34116 and (a.y == -1).sum() == 5670
    assert a.info["imputed"]["emp_length"]["count"] == 1078 and a.info["imputed"]["revol_util"]["count"] == 50
    assert a.X[0, a.feature_names.index("revol_util")] == 83.7  # '83.70%'


def test_real_creditcard():
    t = read_csv(_data_file("creditcard_fraud/creditcard_first3065rows.csv"), "Class")
    assert t.X.shape == (3065, 30) and t.y.sum() == 2
    assert t.feature_names[0] == "Time" and t.feature_names[-1] == "Amount"
    assert t.X[0, 1] == -1.3598071336738


@pytest.mark.parametrize("name,rows,positives,n_features", [("reuters.trn.bz2", 7770, 538, None),
                                                           ("reuters.tst.bz2", 3299, 179, 8315)])
def test_real_reuters(name, rows, positives, n_features):
    t = read_libsvm(_data_file(f"reuters21578_lasvm_tick/{name}"), n_features=n_features)
    assert t.X.shape == (rows, 8315)  # the train file's largest index is 8315
    assert (t.y == 1).sum() == positives and (t.y == -1).sum() == rows - positives
    assert n_features or t.X.nnz == 339837
    assert 0 < t.X.max() < 0.95


def test_real_mnist():
    train, test = read_mnist(_data_file("mnist"))
    assert train.X.shape == (60000, 784) and test.X.shape == (10000, 784)
    _eq(np.bincount(train.y.astype(int)), [5923, 6742, 5958, 6131, 5842, 5421, 5918, 6265, 5851, 5949])
    _eq(np.bincount(test.y.astype(int)), [980, 1135, 1032, 1010, 982, 892, 958, 1028, 974, 1009])
    assert train.X.min() == 0 and train.X.max() == 255


@pytest.fixture(scope="module")
def femnist():
    """The FEMNIST archive read once (all users), shared by the checks below."""
    return read_leaf(_data_file("femnist_leaf_sf0.05_partial.tar.xz"), require_both=False)


def test_real_femnist_counts(femnist):
    train, test = femnist
    assert train.X.shape == (14708, 784) and test.X.shape == (4088, 784)
    tr_users, te_users = set(train.keys["user"].tolist()), set(test.keys["user"].tolist())
    assert len(tr_users) == 105 and len(te_users) == 184 and len(tr_users & te_users) == 105
    assert train.info["users"] == sorted(train.info["users"]) and len(train.info["users"]) == 184
    assert 0 <= train.X.min() and train.X.max() <= 1 and train.y.max() <= 61
    assert np.all(np.diff(train.keys["user"]) >= 0)  # grouped by user


def test_real_movielens():
    m = read_movielens(_data_file("ml-100k.tar.xz"))
    assert len(m.rating) == 100000 and m.info["n_users"] == 943 and m.info["n_items"] == 1682
    assert m.info["rating_counts"] == {"1": 6110, "2": 11370, "3": 27145, "4": 34174, "5": 21201}
    assert m.user.max() == 942 and m.item.max() == 1681 and m.user.min() == m.item.min() == 0
    assert m.item_genres.shape == (1682, 19) and len(m.user_age) == 943
    assert m.item_titles[0] == "Toy Story (1995)"
