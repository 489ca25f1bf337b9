"""More bad input that must end in one clear line, exit status 2 and no traceback: owners without
records, zero-filled, damaged or misplaced files, files of the wrong kind, and options that ask
for more than the data holds. Each message names the file (or option) and the fix."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest
from helpers import mpi_run

from mpi_dp.data.shards import rewrite_shards
from mpi_dp.data.synth import write_synth

BASE = """name = "b"
algorithm = "sync_star"
data = "{data}"
T = 3
runs = 2
eps = 1.0
"""


def _empty_owners(path: Path, owners: tuple[int, ...]) -> None:
    """Owners of a shard file left with no records (their rows of X and y dropped, their ranges
    of /agents/offsets empty)."""
    with h5py.File(path, "r+") as f:
        g = f["agents"]
        off = g["offsets"][()]
        keep = np.ones(off[-1], dtype=bool)
        for i in owners:
            keep[off[i]: off[i + 1]] = False
        sizes = np.diff(off)
        sizes[list(owners)] = 0
        X, y = g["X"][()][keep], g["y"][()][keep]
        for name, value in (("X", X), ("y", y), ("offsets", np.concatenate([[0], np.cumsum(sizes)]))):
            del g[name]
            g[name] = value


def _edit(d: Path, source: str, name: str, fn) -> None:
    shutil.copy(d / source, d / name)
    with h5py.File(d / name, "r+") as f:
        fn(f)


def _replace(f: h5py.File, key: str, value) -> None:
    if key in f:
        del f[key]
    f[key] = value


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> Path:
    """A work folder of good, broken, zero-filled and misplaced files."""
    d = tmp_path_factory.mktemp("bad_more")
    write_synth(d / "good.h5", "regression", 3, 60, 4, 0.5, 1, public=50)
    write_synth(d / "bin.h5", "binary", 3, 60, 4, 0.3, 1)
    write_synth(d / "bin0.h5", "binary", 3, 60, 4, 0.3, 1, public=0)
    for name, owners in (("empty1.h5", (1,)), ("empty12.h5", (1, 2))):
        shutil.copy(d / "good.h5", d / name)
        _empty_owners(d / name, owners)
    rewrite_shards(d / "good.h5", d / "good_v1.h5", layout="groups")  # format_version 1
    _edit(d, "good_v1.h5", "n_text.h5", lambda f: f["agents/1"].attrs.__setitem__("n", "sixty"))
    _edit(d, "good.h5", "pub_features.h5", lambda f: _replace(f, "public/X", np.zeros((50, 7))))
    _edit(d, "good.h5", "pub_labels.h5", lambda f: _replace(f, "public/y", np.zeros(3)))

    def pub_nan(f: h5py.File) -> None:
        x = f["public/X"][()]
        x[4, 1] = np.nan
        f["public/X"][...] = x
    _edit(d, "good.h5", "pub_nan.h5", pub_nan)

    def test_features(f: h5py.File) -> None:
        f["test/X"], f["test/y"] = np.zeros((5, 9)), np.ones(5)
    _edit(d, "bin.h5", "test_features.h5", test_features)
    _edit(d, "bin0.h5", "norm_text.h5", lambda f: _replace(f, "public/row_norm_max", "abc"))
    shutil.copy(d / "good.h5", d / "damaged.h5")
    with open(d / "damaged.h5", "r+b") as fh:  # the root's metadata zeroed: HDF5 cannot read it
        fh.seek(1000)
        fh.write(bytes(3000))
    (d / "zeros.h5").write_bytes(bytes(100_000))  # head -c 100000 /dev/zero > zeros.h5
    (d / "binary.bin").write_bytes(bytes(range(128, 256)) * 20)  # not UTF-8
    (d / "folder").mkdir()
    (d / "plain").write_text("not HDF5")
    rows = np.random.default_rng(0).normal(size=(200, 3))
    np.savetxt(d / "rows200.csv", np.c_[rows, rows @ [1.0, 2.0, 3.0]], delimiter=",",
               header="a,b,c,y", comments="")
    (d / "job.toml").write_text(BASE.format(data="good.h5"))
    cp = _cli(d, "run", "job.toml", "--out", "result.h5", "--quiet")
    assert cp.returncode == 0, cp.stderr
    shutil.copy(d / "zeros.h5", d / "resumed.h5.partial")  # a stopped run's file, zero-filled
    return d


def _cli(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mpi_dp", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=300)


def _job(extra: str = "", data: str = "good.h5", algorithm: str = "sync_star") -> str:
    return BASE.format(data=data).replace("sync_star", algorithm) + extra


def _one_error(cp: subprocess.CompletedProcess, message: str) -> None:
    assert cp.returncode == 2, (cp.returncode, cp.stderr)
    assert "Traceback" not in cp.stderr, cp.stderr
    errors = [ln for ln in cp.stderr.splitlines() if ln.startswith("mpi-dp: error")]
    assert len(errors) == 1 and message in errors[0], cp.stderr


#: (id, job text, command-line arguments after `run case.toml`, message fragment)
RUN_CASES = [
    ("owner with no records", _job(data="empty1.h5"), [],
     "shard file 'empty1.h5': owner 1 holds no records (n = 0); every owner needs at least one "
     "record: drop it from the file or repartition the data"),
    ("owners with no records", _job(data="empty12.h5"), [],
     "shard file 'empty12.h5': 2 of its 3 owners hold no records (n = 0: 1, 2)"),
    ("owner with no records, p2p", _job('[p2p]\ngraph = "complete"\n', data="empty1.h5",
                                        algorithm="p2p"), [],
     "shard file 'empty1.h5': owner 1 holds no records"),
    ("data zero-filled", _job(data="zeros.h5"), [],
     "shard file 'zeros.h5' is not a readable HDF5 file (Unable to synchronously open file (file "
     "signature not found)); a CSV or LIBSVM file becomes a shard file with mpi-dp data prepare"),
    ("data is a CSV file", _job(data="rows200.csv"), [],
     "shard file 'rows200.csv' is not a readable HDF5 file (Unable to synchronously open file "
     "(file signature not found)); a CSV or LIBSVM file becomes a shard file with mpi-dp data "
     "prepare csv|libsvm FILE"),
    ("data is a directory", _job(data="folder"), [],
     "shard file 'folder' is a directory; give the HDF5 shard file"),
    ("data damaged", _job(data="damaged.h5"), [],
     "shard file 'damaged.h5': is damaged:"),
    ("agent size not an integer", _job(data="n_text.h5"), [],
     "shard file 'n_text.h5': agent 1: attribute n = 'sixty' is not a record count"),
    ("public X of another width", _job(data="pub_features.h5"), [],
     "shard file 'pub_features.h5': public records (/public): X has shape (50, 7), expected "
     "(m, 4)"),
    ("public y of another length", _job(data="pub_labels.h5"), [],
     "shard file 'pub_labels.h5': public records (/public): y has shape (3,) but X has 50 rows"),
    ("NaN in the public records", _job(data="pub_nan.h5"), [],
     "shard file 'pub_nan.h5': public records (/public): X holds 1 NaN or infinite value(s)"),
    ("global test set of another width", _job('loss = "logistic"\n', data="test_features.h5"), [],
     "shard file 'test_features.h5': global test set (/test): X has shape (5, 9), expected "
     "(m, 5)"),
    ("row_norm_max not a number", _job('loss = "logistic"\n', data="norm_text.h5"), [],
     "shard file 'norm_text.h5': /public/row_norm_max must hold one number"),
    ("job file not UTF-8", None, ["run", "binary.bin"],
     "job file binary.bin: not a UTF-8 text file (byte 0)"),
    ("graph file not UTF-8", _job('[p2p]\ngraph = "binary.bin"\n', data="bin.h5",
                                  algorithm="p2p"), [],
     "graph file binary.bin is not a text edge list (binary content)"),
    ("graph file zero-filled", _job('[p2p]\ngraph = "zeros.h5"\n', data="bin.h5",
                                    algorithm="p2p"), [],
     "graph file zeros.h5 is not a text edge list (binary content)"),
    ("schedule_from missing", _job('[async]\nschedule_from = "none.h5"\n', data="bin.h5",
                                   algorithm="async_star"), [],
     "key 'async.schedule_from': none.h5 not found"),
    ("schedule_from zero-filled", _job('[async]\nschedule_from = "zeros.h5"\n', data="bin.h5",
                                       algorithm="async_star"), [],
     "key 'async.schedule_from': zeros.h5 is not a readable HDF5 file"),
    ("resume a zero-filled PATH.partial", _job(), ["--out", "resumed.h5", "--resume"],
     "cannot resume resumed.h5.partial: it is not a readable HDF5 file"),
]

PREPARE = ["data", "prepare", "csv", "rows200.csv", "--target", "y", "--out", "p.h5"]
#: (id, command-line arguments, message fragment)
OTHER_CASES = [
    ("--public beyond the rows", [*PREPARE, "--public", "500"],
     "--public 500 asks for 500 public records but rows200.csv has only 200 rows: give --public "
     "M below 200"),
    ("--public of all rows", [*PREPARE, "--public", "200"],
     "--public 200 takes all 200 rows of rows200.csv as public records, leaving none for the "
     "owners"),
    ("--public negative", [*PREPARE, "--public", "-5"], "--public -5: must be 0"),
    ("prepare csv of a shard file", ["data", "prepare", "csv", "good.h5", "--target", "y",
                                     "--out", "p.h5"],
     "good.h5: is an HDF5 file, not CSV text"),
    ("prepare libsvm of a shard file", ["data", "prepare", "libsvm", "good.h5", "--out", "p.h5"],
     "good.h5: is an HDF5 file, not LIBSVM text"),
    ("prepare csv of a zero-filled file", ["data", "prepare", "csv", "zeros.h5", "--target", "y",
                                           "--out", "p.h5"],
     "zeros.h5: holds binary data (NUL bytes), not CSV text"),
    ("synth into a directory", ["data", "synth", "--out", "folder"],
     "output folder is a directory; give the shard file's path"),
    ("synth under a plain file", ["data", "synth", "--out", "plain/x.h5"],
     "cannot write the shard file plain/x.h5: plain is a file, not a directory"),
    ("analyze a directory", ["analyze", "folder"], "folder is a directory; give a result file"),
    ("plot a directory", ["plot", "folder"], "folder is a directory; give a result file"),
    ("compare into a directory", ["compare", "result.h5", "--out", "folder"],
     "--out folder is a directory; give the figure's file name"),
    ("compare into an unknown format", ["compare", "result.h5", "--out", "x.foo"],
     "--out x.foo: .foo is not a figure format"),
    ("forecast of a binary fit file", ["forecast", "predict", "--fit", "binary.bin", "--n", "100",
                                       "--eps", "1", "--owners", "2"],
     "binary.bin: not JSON (binary content)"),
]

#: zero-filled result files: these named the file already before the changes; kept as guards
ZERO_RESULT_CASES = [
    ("analyze", ["analyze", "zeros.h5"]),
    ("compare", ["compare", "result.h5", "zeros.h5"]),
    ("plot", ["plot", "zeros.h5"]),
    ("merge", ["merge", "merged.h5", "zeros.h5"]),
    ("forecast fit", ["forecast", "fit", "zeros.h5"]),
]


@pytest.mark.parametrize("case", RUN_CASES, ids=[c[0] for c in RUN_CASES])
def test_a_bad_run_stops_with_one_clear_message(files, case):
    name, text, args, message = case
    if text is not None:
        (files / "case.toml").write_text(text)
        args = ["run", "case.toml", *args]
    out = files / "case_out.h5"
    for stale in (out, Path(str(out) + ".partial")):  # no case may hide behind another's file
        stale.unlink(missing_ok=True)
    if "--out" not in args:
        args = [*args, "--out", str(out)]
    _one_error(_cli(files, *args, "--quiet"), message)
    assert not out.exists() and not Path(str(out) + ".partial").exists()


@pytest.mark.parametrize("case", OTHER_CASES, ids=[c[0] for c in OTHER_CASES])
def test_a_bad_command_stops_with_one_clear_message(files, case):
    name, args, message = case
    _one_error(_cli(files, *args), message)


@pytest.mark.parametrize("case", ZERO_RESULT_CASES, ids=[c[0] for c in ZERO_RESULT_CASES])
def test_a_zero_filled_result_file_is_named(files, case):
    _one_error(_cli(files, *case[1]), "zeros.h5: not a readable HDF5 file (")


def test_under_mpiexec_an_owner_without_records_stops_every_rank_with_one_message(files):
    (files / "mpi_case.toml").write_text(_job(data="empty12.h5"))
    out = files / "mpi_out.h5"
    cp = mpi_run(3, ["run", "mpi_case.toml", "--out", str(out), "--quiet"], cwd=files)
    message = "shard file 'empty12.h5': 2 of its 3 owners hold no records (n = 0: 1, 2)"
    assert cp.returncode == 2, cp.stderr
    assert cp.stderr.count(message) == 1 and "Traceback" not in cp.stderr, cp.stderr
    assert not out.exists() and not Path(str(out) + ".partial").exists()
