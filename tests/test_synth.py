"""Synthetic generators: determinism by (seed, owner), correct statistics, CLI round trip."""

from __future__ import annotations

import argparse
import json

import numpy as np
import pytest

from mpi_dp.data import (
    ShardFile,
    add_synth_arguments,
    run_synth_command,
    synth_classification,
    synth_regression,
    write_synth,
)
from mpi_dp.errors import DataError


def _same(a, b) -> bool:
    return a.shape == b.shape and a.tobytes() == b.tobytes()


@pytest.mark.parametrize("gen", [synth_regression, synth_classification])
def test_determinism_and_owner_independence(gen):
    a = gen(3, 50, 4, 0.5, seed=7, public=30)
    b = gen(3, 50, 4, 0.5, seed=7, public=30)
    for (Xa, ya), (Xb, yb) in zip(a["agents"], b["agents"], strict=True):
        assert _same(Xa, Xb) and _same(ya, yb)
    assert _same(a["public"][0], b["public"][0]) and _same(a["theta_true"], b["theta_true"])

    # owner 0 unchanged when more owners are added or owner 1 is resized
    c = gen(5, [50, 999, 3, 4, 5], 4, 0.5, seed=7, public=10)
    assert _same(c["agents"][0][0], a["agents"][0][0])
    assert _same(c["agents"][0][1], a["agents"][0][1])
    assert _same(c["theta_true"], a["theta_true"])
    # the public hold-out of a different size is a prefix of the same stream
    assert _same(c["public"][0], a["public"][0][:10])
    # a smaller owner gets a prefix of the larger owner's records
    assert _same(c["agents"][2][0], a["agents"][2][0][:3])
    assert _same(c["agents"][2][1], a["agents"][2][1][:3])

    d = gen(3, 50, 4, 0.5, seed=8, public=30)
    assert not np.array_equal(d["agents"][0][0], a["agents"][0][0])
    assert not np.array_equal(d["theta_true"], a["theta_true"])
    # owners differ from each other
    assert not np.array_equal(a["agents"][0][0], a["agents"][1][0])


def test_regression_recovers_theta():
    dim, noise, n = 5, 0.5, 20000
    data = synth_regression(1, n, dim, noise, seed=3, public=0, scale=2.0)
    assert data["public"] is None and data["task"] == "regression"
    X, y = data["agents"][0]
    assert X.shape == (n, dim) and y.shape == (n,)
    assert abs(X.std() - 2.0) < 0.05
    theta_hat, *_ = np.linalg.lstsq(X, y, rcond=None)
    se = noise * np.sqrt(np.diag(np.linalg.inv(X.T @ X)))
    assert np.all(np.abs(theta_hat - data["theta_true"]) < 5 * se)
    resid = y - X @ data["theta_true"]
    assert abs(resid.std() - noise) < 0.02


def test_regression_noiseless_is_exact():
    data = synth_regression(2, [10, 20], 3, 0.0, seed=1, public=5)
    for X, y in [*data["agents"], data["public"]]:
        assert np.allclose(y, X @ data["theta_true"], rtol=0, atol=1e-12)


def test_classification_labels_and_bias():
    data = synth_classification(2, [400, 300], 4, 0.3, seed=2, public=100)
    assert data["task"] == "binary" and data["theta_true"].shape == (4,)
    for X, y in [*data["agents"], data["public"]]:
        assert X.shape[1] == 5
        assert np.all(X[:, -1] == 1.0)
        assert set(np.unique(y).tolist()) == {-1.0, 1.0}
        # labels agree with the noiseless rule for most records
        agree = np.mean(np.sign(X[:, :4] @ data["theta_true"]) == y)
        assert agree > 0.8
    nb = synth_classification(1, 10, 4, 0.3, seed=2, public=0, bias=False)
    assert nb["agents"][0][0].shape == (10, 4)


def test_invalid_parameters():
    with pytest.raises(DataError, match="2 record counts given for 3"):
        synth_regression(3, [1, 2], 2, 0.1, 0)
    with pytest.raises(DataError, match="at least 1 record"):
        synth_regression(2, [5, 0], 2, 0.1, 0)
    with pytest.raises(DataError, match="noise"):
        synth_regression(2, 5, 2, -1.0, 0)


def test_write_synth(tmp_path):
    path = write_synth(tmp_path / "s.h5", "binary", 3, [20, 30, 40], 4, 0.5, seed=9, public=50)
    ref = synth_classification(3, [20, 30, 40], 4, 0.5, 9, public=50)
    with ShardFile(path) as sf:
        assert sf.task == "binary" and sf.n_agents == 3 and sf.n_features == 5
        assert sf.sizes().tolist() == [20, 30, 40]
        assert sf.feature_names == ["x0", "x1", "x2", "x3", "bias"]
        for i, (X, y) in enumerate(ref["agents"]):
            Xr, yr = sf.read_agent(i)
            assert _same(Xr, X) and _same(yr, y)
        assert _same(sf.read_public()[0], ref["public"][0])
        assert _same(sf.read_public_extra("theta_true"), ref["theta_true"])
        params = json.loads(sf.attrs["synth"])
        assert params["seed"] == 9 and params["records"] == [20, 30, 40] and params["bias"] is True
        assert "synth_classification" in sf.source and "seed=9" in sf.source
    with pytest.raises(DataError, match="unknown synthetic task"):
        write_synth(tmp_path / "x.h5", "ranking", 1, 5, 2, 0.1, 0)


def test_cli_round_trip(tmp_path, capsys):
    parser = argparse.ArgumentParser(prog="mpi-dp data synth")
    add_synth_arguments(parser)
    out = tmp_path / "dir" / "demo.h5"
    args = parser.parse_args(
        ["--task", "regression", "--agents", "3", "--records", "10,20,30", "--dim", "4",
         "--seed", "5", "--public", "0", "--out", str(out)]
    )
    path = run_synth_command(args)
    assert path == out
    printed = capsys.readouterr().out
    assert "demo.h5" in printed and "3 agents" in printed and "10,20,30" in printed
    with ShardFile(out) as sf:
        assert sf.task == "regression" and sf.n_features == 4 and not sf.has_public
        assert sf.sizes().tolist() == [10, 20, 30]
        ref = synth_regression(3, [10, 20, 30], 4, 0.5, 5, public=0)
        assert _same(sf.read_agent(1)[1], ref["agents"][1][1])
        assert _same(sf.read_public_extra("theta_true"), ref["theta_true"])

    args = parser.parse_args(["--records", "7", "--out", str(tmp_path / "b.h5")])
    assert args.records == 7 and args.task == "regression" and args.agents == 3
    with pytest.raises(SystemExit):
        parser.parse_args(["--records", "a,b", "--out", "x.h5"])
    with pytest.raises(SystemExit):
        parser.parse_args(["--task", "binary"])  # --out is required
    assert "--public" in parser.format_help()


@pytest.mark.parametrize("task", ["regression", "online", "multiclass"])
def test_synth_parameters_stay_small_for_many_agents(tmp_path, task):
    """The file's `synth` attribute and source keep the record counts as one number (equal) or
    a summary (unequal, more than RECORDS_PARAM_MAX agents), never a per-agent list: an HDF5
    attribute is capped at 64 KiB, which 13,000 listed counts exceed. The counts stay exact in
    every agent's `n`."""
    from mpi_dp.data import synth as S

    n = S.RECORDS_PARAM_MAX + 1
    sizes = [2 + i % 3 for i in range(n)]
    kw = {"public": 5}  # online, multiclass: the global test set
    for records, want in ((3, 3), (sizes, f"{n} per-agent counts")):
        path = write_synth(tmp_path / f"{task}{len(str(records))}.h5", task, n, records, 2, 0.1,
                           seed=1, **kw)
        with ShardFile(path) as sf:
            got = json.loads(sf.attrs["synth"])["records"]
            assert got == want if isinstance(want, int) else got.startswith(want)
            assert sf.sizes().tolist() == ([records] * n if isinstance(records, int) else sizes)
            assert len(sf.source) < 1000
