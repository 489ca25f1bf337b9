"""Bad input never gives a traceback: one table of user mistakes, each with its exit code 2, the
message a user reads, and no result file (nor PATH.partial) left behind."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest
from helpers import mpi_run

from mpi_dp.data.synth import write_synth

BASE = """name = "b"
algorithm = "sync_star"
data = "{data}"
T = 3
runs = 2
eps = 1.0
"""


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> Path:
    """A work folder: good, broken and foreign shard files, a result, a CSV, a plain file."""
    d = tmp_path_factory.mktemp("bad")
    write_synth(d / "good.h5", "regression", 3, 60, 4, 0.5, 1, public=50)
    write_synth(d / "bin.h5", "binary", 3, 60, 4, 0.3, 1)
    shutil.copy(d / "good.h5", d / "nan.h5")
    with h5py.File(d / "nan.h5", "r+") as f:
        x = f["agents/1/X"][()]
        x[3, 2] = np.nan
        f["agents/1/X"][...] = x
    shutil.copy(d / "good.h5", d / "noowner.h5")
    with h5py.File(d / "noowner.h5", "r+") as f:
        del f["agents/2"]
    (d / "plain").write_text("not HDF5")
    with h5py.File(d / "foreign.h5", "w") as f:
        f["x"] = 1
    (d / "x.csv").write_text("a,b,y\n1,2,3\n4,5,6\n")
    (d / "job.toml").write_text(BASE.format(data="good.h5"))
    cp = _cli(d, "run", "job.toml", "--out", "result.h5", "--quiet")
    assert cp.returncode == 0, cp.stderr
    return d


def _cli(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mpi_dp", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=300)


def _job(extra: str = "", data: str = "good.h5", **replace: str) -> str:
    text = BASE.format(data=data) + extra
    for a, b in replace.items():
        text = text.replace(a.replace("_", " "), b)
    return text


#: (id, job text or None, command-line arguments after the job, message fragment)
RUN_CASES = [
    ("job file missing", None, ["run", "missing.toml"], "job file missing.toml not found"),
    ("job not TOML", "name = [unclosed", [], "not valid TOML"),
    ("unknown key", _job("epsilon = 1.0\n"), [], "unknown key 'epsilon' (did you mean 'eps'?)"),
    ("wrong type", _job().replace("runs = 2", 'runs = "many"'), [],
     "key 'runs': expected integer, got str 'many'"),
    ("unknown algorithm", _job().replace("sync_star", "nope"), [],
     "key 'algorithm': 'nope' is not one of"),
    ("negative eps", _job().replace("eps = 1.0", "eps = -1.0"), [],
     "key 'eps': budgets must be positive numbers or inf"),
    ("T zero", _job().replace("T = 3", "T = 0"), [], "key 'T': must be at least 1, got 0"),
    ("runs zero", _job().replace("runs = 2", "runs = 0"), [], "key 'runs': must be at least 1"),
    ("unknown variant", _job('variant = "alg3"\n'), [], "key 'variant': 'alg3' is not one of"),
    ("unknown swept variant", _job('[sweep]\nvariant = ["alg3"]\n'), [],
     "key 'sweep.variant[0]': 'alg3' is not one of"),
    ("unknown sweep key", _job("[sweep]\nfoo = [1, 2]\n"), [], "unknown key 'sweep.foo'"),
    ("unknown loss", _job('loss = "cubic"\n'), [], "key 'loss': 'cubic' is not one of"),
    ("negative xi", _job("xi = -1.0\n"), [], "key 'xi': must be > 0"),
    ("record_every negative", _job("record_every = -1\n"), [], "key 'record_every': must be at least 1"),
    ("negative seed", _job("seed = -1\n"), [], "key 'seed': must be non-negative"),
    ("negative first_run", _job("first_run = -3\n"), [], "key 'first_run': must be non-negative"),
    ("delta outside (0, 1)", _job("[privacy]\ndelta = 2.0\n"), [],
     "key 'privacy.delta': must be 'auto' or a number in (0, 1)"),
    ("delta at or above 1/n_i", _job("[privacy]\ndelta = 0.02\n"), [],
     "key 'privacy.delta': delta = 0.02 is at or above 1/n_i = 1/60 for owner 0 (n_i = 60 "
     "records)"),
    ("unknown calibration rule", _job('[privacy]\ncalibration = "loose"\n'), [],
     "key 'privacy.calibration': 'loose' is not one of 'pld', 'basic', 'paper'"),
    ("eps list of wrong length", _job().replace("eps = 1.0", "eps = [1.0, 2.0]"), [],
     "key 'eps': 2 values given but the shard file good.h5 has 3 owners"),
    ("n beyond the shard", _job("n = 100000\n"), [],
     "key 'n': owner 0 should use 100000 records but holds only 60"),
    ("star key in an admm job", _job("xi = 1.0\n").replace('"sync_star"', '"admm"'), [],
     "key 'xi': is not read by algorithm 'admm'"),
    ("key of another method", _job("owners = 10\n"), [],
     "key 'owners': is not read by algorithm 'sync_star'"),
    ("clip off with a finite eps", _job("clip = false\n"), [],
     "clip = false voids the DP guarantee"),
    ("constant step with noise", _job('[step]\nschedule = "constant"\n'), [],
     "a constant step does not converge with noise"),
    ("logistic loss on regression data", _job('loss = "logistic"\n'), [],
     "logistic loss needs a binary shard (labels -1/+1); good.h5 holds a regression task"),
    ("hinge loss on regression data", _job('loss = "hinge"\n'), [],
     "hinge loss needs a binary shard"),
    ("admm on regression data", _job().replace('"sync_star"', '"admm"'), [],
     "admm trains a multinomial logistic model and needs a classification shard"),
    ("dola on regression data", _job().replace('"sync_star"', '"dola"'), [],
     "dola trains a binary linear SVM; the shard file good.h5 holds a regression task"),
    ("p2p without a graph", _job().replace('"sync_star"', '"p2p"'), [],
     "has no public graph"),
    ("live mode on one rank",
     _job('[async]\nmode = "live"\n').replace('"sync_star"', '"async_star"'), [],
     "live mode needs owners on other ranks than the learner"),
    ("shard file missing", _job(data="nothere.h5"), [], "shard file 'nothere.h5' not found"),
    ("shard not HDF5", _job(data="plain"), [], "shard file 'plain' is not a readable HDF5 file"),
    ("shard owner missing", _job(data="noowner.h5"), [], "1 of 3 agent groups missing: 2"),
    ("NaN in a shard", _job(data="nan.h5"), [],
     "owner 1: record 3, feature 2 is nan: the data must be finite"),
    ("--set without =", _job(), ["--set", "T"], "--set 'T': expected key=value"),
    ("--set of a bad value", _job(), ["--set", "T=abc"], "key 'T': expected integer, got str"),
    ("--set of a swept key", _job("[sweep]\neps = [1.0, 2.0]\n"), ["--set", "eps=5"],
     "'eps' is swept in [sweep] (the sweep would ignore it)"),
    ("output exists", _job(), ["--out", "result.h5"],
     "result.h5 exists: a run never replaces a result; pass --overwrite"),
    ("output is a directory", _job(), ["--out", "."], "is a directory; give a file path"),
    ("output under a plain file", _job(), ["--out", "plain/x.h5"],
     "cannot write the result plain/x.h5"),
    ("resume with nothing to resume", _job(), ["--resume"], "nothing to resume"),
]

OTHER_CASES = [
    ("analyze a missing file", ["analyze", "nope.h5"], "result file not found: nope.h5"),
    ("analyze a plain file", ["analyze", "plain"], "not a readable HDF5 file"),
    ("analyze a foreign HDF5", ["analyze", "foreign.h5"], "not an mpi_dp result file"),
    ("analyze a shard file", ["analyze", "good.h5"],
     "root attribute format = 'mpi_dp.shards', expected 'mpi_dp.results'"),
    ("analyze an unknown metric", ["analyze", "result.h5", "--metric", "nope"],
     "has no metric 'nope'; available:"),
    ("analyze --csv under a plain file", ["analyze", "result.h5", "--csv", "plain/t.csv"],
     "cannot write or read"),
    ("plot under a plain file", ["plot", "result.h5", "--out", "plain/fig"],
     "cannot write or read"),
    ("audit with too few runs", ["audit", "job.toml", "--runs", "10"], "--runs must be >= 20"),
    ("audit of a sweep", ["audit", "sweep.toml"],
     "an audit needs exactly one configuration, this job has 2"),
    ("audit with a bad canary", ["audit", "job.toml", "--canary", "best"],
     "--canary must be worst or a record index"),
    ("audit with a bad release", ["audit", "job.toml", "--release", "last"],
     "--release must be a positive release number, 'all' or 'final'"),
    ("audit onto a result", ["audit", "job.toml", "--out", "result.h5"],
     "an audit never overwrites a result"),
    ("synth without agents", ["data", "synth", "--task", "regression", "--agents", "0",
                              "--records", "10", "--dim", "3", "--out", "s.h5"],
     "n_agents must be at least 1"),
    ("synth of an unknown task", ["data", "synth", "--task", "nope", "--out", "s.h5"],
     "invalid choice: 'nope'"),
    ("prepare a missing CSV", ["data", "prepare", "csv", "none.csv", "--target", "y",
                               "--out", "p.h5"], "file 'none.csv' not found"),
    ("prepare without a target", ["data", "prepare", "csv", "x.csv", "--out", "p.h5"],
     "needs --target COLUMN"),
    ("prepare --key without --partition key", ["data", "prepare", "csv", "x.csv", "--target",
                                               "y", "--key", "a", "--out", "p.h5"],
     "--partition key"),
    ("prepare an unknown recipe", ["data", "prepare", "nosuchrecipe"],
     "unknown recipe 'nosuchrecipe'"),
    ("forecast without its fit file", ["forecast", "predict", "--fit", "none.json", "--n", "100",
                                       "--eps", "1", "--owners", "2"],
     "forecast file not found: none.json"),
]


@pytest.mark.parametrize("case", RUN_CASES, ids=[c[0] for c in RUN_CASES])
def test_a_bad_run_stops_with_one_clear_message_and_no_file(files, case):
    name, text, args, message = case
    if text is not None:
        (files / "case.toml").write_text(text)
        args = ["run", "case.toml", *args] if not args or args[0] != "run" else args
    out = files / "case_out.h5"
    if "--out" not in args:
        args = [*args, "--out", str(out)]
    cp = _cli(files, *args, "--quiet")
    assert cp.returncode == 2, (cp.returncode, cp.stderr)
    assert "Traceback" not in cp.stderr
    errors = [ln for ln in cp.stderr.splitlines() if ln.startswith("mpi-dp: error")]
    assert len(errors) == 1 and message in errors[0], cp.stderr
    assert not out.exists() and not Path(str(out) + ".partial").exists()


@pytest.mark.parametrize("case", OTHER_CASES, ids=[c[0] for c in OTHER_CASES])
def test_a_bad_command_stops_with_one_clear_message(files, case):
    name, args, message = case
    (files / "sweep.toml").write_text(_job("[sweep]\neps = [1.0, 2.0]\n"))
    cp = _cli(files, *args)
    assert cp.returncode == 2, (cp.returncode, cp.stderr)
    assert "Traceback" not in cp.stderr and message in cp.stderr, cp.stderr


@pytest.mark.parametrize("case", [c for c in RUN_CASES if c[0] in (
    "NaN in a shard", "logistic loss on regression data", "constant step with noise")],
    ids=lambda c: c[0])
def test_under_mpiexec_every_rank_stops_and_one_message_is_printed(files, case):
    name, text, args, message = case
    (files / "mpi_case.toml").write_text(text)
    out = files / "mpi_out.h5"
    cp = mpi_run(3, ["run", "mpi_case.toml", "--out", str(out), "--quiet"], cwd=files)
    assert cp.returncode == 2, cp.stderr
    assert cp.stderr.count(message) == 1 and "Traceback" not in cp.stderr, cp.stderr
    assert not out.exists() and not Path(str(out) + ".partial").exists()


def test_the_table_is_large_enough():
    assert len(RUN_CASES) + len(OTHER_CASES) >= 40
