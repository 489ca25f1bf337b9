"""The personalised-P2P synthetic task (spec personalized-p2p §5) and the shard graph convention."""

from __future__ import annotations

import argparse

import h5py
import numpy as np
import pytest
import scipy.sparse as sp

from mpi_dp.data.shard_graph import graph_arrays, read_graph
from mpi_dp.data.shards import ShardFile, write_shards
from mpi_dp.data.synth import (
    add_synth_arguments,
    p2p_graph,
    p2p_instance,
    run_synth_command,
    write_synth,
)
from mpi_dp.errors import DataError


def _lambda2(A: np.ndarray) -> float:
    return float(np.linalg.eigvalsh(np.diag(A.sum(axis=1)) - A)[1])


def _kernel(s: np.ndarray, gamma: float) -> np.ndarray:
    """W_ij = exp((cos(phi_ij) - 1)/gamma) from the angles of the targets, diagonal 0."""
    ang = np.arctan2(s[:, 1], s[:, 0])
    K = np.exp((np.cos(ang[:, None] - ang[None, :]) - 1.0) / gamma)
    np.fill_diagonal(K, 0.0)
    return K


@pytest.mark.parametrize("n, seed", [(20, 0), (20, 5), (100, 0)])
def test_graph_is_the_sparsest_connected_threshold(n, seed):
    inst = p2p_instance(n, 3, seed, max_records=12, test_records=2)
    W = inst.W
    assert W.shape == (n, n) and W.has_sorted_indices
    assert (W != W.T).nnz == 0 and np.all(W.diagonal() == 0)
    A = W.toarray()
    assert _lambda2(A) > 1e-3
    K = _kernel(inst.targets, 0.1)
    wmax = K.max()
    _, thr, k = p2p_graph(inst.targets, 0.1)
    assert np.isclose(thr, wmax * 10 ** (-k / 2), rtol=1e-12)
    np.testing.assert_array_equal(A > 0, K > thr)  # exactly the pairs above the threshold
    np.testing.assert_allclose(A[A > 0], K[A > 0], rtol=1e-9)  # the kernel formula
    if n == 20:
        assert k >= 2  # these seeds need a lower threshold than the first one
    if k >= 2:  # the next larger threshold of the schedule leaves the graph disconnected
        prev = wmax * 10 ** (-(k - 1) / 2)
        assert _lambda2(np.where(K > prev, K, 0.0)) <= 1e-3


def test_records_labels_and_normalisation():
    n, p = 100, 10
    inst = p2p_instance(n, p, 3)
    sizes = np.array([X.shape[0] for X, _ in inst.train])
    assert sizes.min() >= 10 and sizes.max() <= 100
    assert sizes.min() < 20 and sizes.max() > 90  # spread over the whole range
    assert all(X.shape == (100, p) for X, _ in inst.test)
    assert inst.targets.shape == (n, 2)
    for part in (inst.train, inst.test):
        flipped = total = 0
        for (X, y), s in zip(part, inst.targets, strict=True):
            assert set(np.unique(y)) <= {-1.0, 1.0}
            assert np.all(np.abs(X).sum(axis=1) <= 1 + 1e-12)
            np.testing.assert_allclose(np.abs(X).sum(axis=1), 1.0, rtol=1e-12)
            clean = np.where(X[:, :2] @ s >= 0, 1.0, -1.0)
            flipped += int(np.sum(y != clean))
            total += y.size
        sd = np.sqrt(total * 0.05 * 0.95)
        assert abs(flipped - 0.05 * total) < 4 * sd, (flipped, total)
    raw = p2p_instance(n, p, 3, normalise="none", flip=0.0)
    X = np.vstack([X for X, _ in raw.train])
    assert abs(X.var() - 0.5) < 0.02 and np.abs(X).sum(axis=1).min() > 1
    for (X, y), s in zip(raw.train, raw.targets, strict=True):
        np.testing.assert_array_equal(y, np.where(X[:, :2] @ s >= 0, 1.0, -1.0))
    # the same draws, rescaled: normalising changes no label
    for (Xa, ya), (Xb, yb) in zip(inst.train, p2p_instance(n, p, 3, normalise="none").train,
                                  strict=True):
        np.testing.assert_array_equal(ya, yb)
        np.testing.assert_allclose(Xa, Xb / np.abs(Xb).sum(axis=1)[:, None], rtol=1e-12)


def test_agent_data_does_not_depend_on_n():
    a, b = p2p_instance(20, 4, 7), p2p_instance(30, 4, 7)
    np.testing.assert_array_equal(a.targets, b.targets[:20])
    for part in ("train", "test"):
        for (Xa, ya), (Xb, yb) in zip(getattr(a, part), getattr(b, part)[:20], strict=True):
            np.testing.assert_array_equal(Xa, Xb)
            np.testing.assert_array_equal(ya, yb)
    c = p2p_instance(20, 4, 7, max_records=50)  # the test sets do not depend on m_i
    for (Xa, _), (Xc, _) in zip(a.test, c.test, strict=True):
        np.testing.assert_array_equal(Xa, Xc)
    assert not np.array_equal(a.targets, p2p_instance(20, 4, 8).targets)


def _contents(path) -> dict:
    out = {}
    with h5py.File(path, "r") as f:
        out["/"] = {k: np.asarray(v).tolist() for k, v in f.attrs.items()}

        def visit(name, obj):
            if isinstance(obj, h5py.Dataset):
                value = obj[()]  # strings (e.g. /meta/feature_names) by value, not by pointer
                out[name] = (obj.dtype.str, value.tolist() if obj.dtype.kind == "O"
                             else value.tobytes())
            out[name + "@"] = {k: np.asarray(v).tolist() for k, v in obj.attrs.items()}

        f.visititems(visit)
    return out


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="mpi-dp data synth")
    add_synth_arguments(parser)
    return parser


def test_cli_writes_the_instance(tmp_path, capsys):
    argv = ["--task", "p2p", "--agents", "20", "--dim", "4", "--max-records", "30"]
    a, b, c = tmp_path / "a.h5", tmp_path / "b.h5", tmp_path / "c.h5"
    run_synth_command(_parser().parse_args([*argv, "--seed", "2", "--out", str(a)]))
    assert "20 agents" in capsys.readouterr().out
    run_synth_command(_parser().parse_args([*argv, "--seed", "2", "--out", str(b)]))
    assert _contents(a) == _contents(b)  # same seed, same file contents
    run_synth_command(_parser().parse_args([*argv, "--seed", "3", "--out", str(c)]))
    assert _contents(a) != _contents(c)
    inst = p2p_instance(20, 4, 2, max_records=30)
    _, thr, k = p2p_graph(inst.targets)
    with ShardFile(a) as f:
        assert f.task == "binary" and f.n_agents == 20 and f.n_features == 4
        for i in range(20):
            for got, want in zip((*f.read_agent(i), *f.read_agent_test(i)),
                                 (*inst.train[i], *inst.test[i]), strict=True):
                np.testing.assert_array_equal(got, want)
        np.testing.assert_array_equal(f.read_public_extra("targets"), inst.targets)
        assert f.read_public_extra("graph_edges").dtype == np.int64
        W = read_graph(f)
        graph = f.json_attr("graph")
        assert graph["threshold"] == thr and graph["k"] == k and graph["edges"] == W.nnz // 2
        assert f.json_attr("synth")["max_records"] == 30
    assert abs(W - inst.W).max() == 0 and W.has_sorted_indices
    np.testing.assert_array_equal(read_graph(a).toarray(), W.toarray())  # from a path too


def test_cli_defaults_and_misuse(tmp_path):
    args = _parser().parse_args(["--task", "p2p", "--out", str(tmp_path / "d.h5")])
    path = run_synth_command(args)
    with ShardFile(path) as f:
        assert f.n_agents == 100 and f.n_features == 100
        sizes = f.sizes()
        assert sizes.min() >= 10 and sizes.max() <= 100
        assert f.json_attr("synth")["flip"] == 0.05 and f.json_attr("synth")["normalise"] == "l1"
    for extra in (["--records", "50"], ["--public", "10"]):
        with pytest.raises(DataError, match="p2p takes no"):
            run_synth_command(_parser().parse_args(["--task", "p2p", *extra,
                                                    "--out", str(tmp_path / "x.h5")]))
    with pytest.raises(DataError, match="min_records <= max_records"):
        p2p_instance(5, 3, 0, min_records=20, max_records=10)
    with pytest.raises(DataError, match="normalise"):
        p2p_instance(5, 3, 0, normalise="l2")
    p = write_synth(tmp_path / "w.h5", "p2p", 20, 0, 3, 0.1, 4, max_records=20)
    with ShardFile(p) as f:
        assert f.json_attr("synth")["flip"] == 0.1 and f.n_agents == 20


def _write_graph(path, n: int, edges, weights) -> None:
    X = np.ones((2, 1))
    write_shards(path, [(X, np.ones(2))] * n, public_extra={
        "graph_edges": np.asarray(edges, dtype=np.int64).reshape(-1, 2),
        "graph_weights": np.asarray(weights, dtype=np.float64)})


def test_read_graph_round_trip(tmp_path):
    rng = np.random.default_rng(0)
    A = np.triu(rng.random((6, 6)) * (rng.random((6, 6)) < 0.6), 1)
    A[np.arange(5), np.arange(1, 6)] = 0.5  # a path: connected
    A = A + A.T
    arrays = graph_arrays(sp.csr_matrix(A))
    e = arrays["graph_edges"]
    assert e.dtype == np.int64 and np.all(e[:, 0] < e[:, 1])
    _write_graph(tmp_path / "g.h5", 6, e, arrays["graph_weights"])
    W = read_graph(tmp_path / "g.h5")
    assert isinstance(W, sp.csr_matrix) and W.has_sorted_indices
    np.testing.assert_array_equal(W.toarray(), A)


@pytest.mark.parametrize("edges, weights, match", [
    ([(0, 1), (2, 3)], [1.0, 1.0], r"disconnected; 2 of 4 agents cannot be reached from agent 0: "
                                   r"2, 3"),
    ([(0, 1), (1, 2), (2, 4)], [1.0, 1.0, 1.0], r"outside 0\.\.3"),
    ([(0, 1), (1, 2), (-1, 3)], [1.0, 1.0, 1.0], r"outside 0\.\.3"),
    ([(0, 1), (2, 1), (2, 3)], [1.0, 1.0, 1.0], r"i < j"),
    ([(0, 1), (1, 1), (2, 3)], [1.0, 1.0, 1.0], r"i < j"),
    ([(0, 1), (1, 2), (2, 3)], [1.0, 0.0, 1.0], r"weight 0\.0"),
    ([(0, 1), (1, 2), (2, 3)], [1.0, -2.0, 1.0], r"weight -2\.0"),
    ([(0, 1), (1, 2), (2, 3), (0, 1)], [1.0] * 4, r"\(0, 1\) is listed more than once"),
])
def test_read_graph_errors(tmp_path, edges, weights, match):
    _write_graph(tmp_path / "bad.h5", 4, edges, weights)
    with pytest.raises(DataError, match=match):
        read_graph(tmp_path / "bad.h5")


def test_read_graph_without_a_graph(tmp_path):
    write_shards(tmp_path / "plain.h5", [(np.ones((2, 1)), np.ones(2))] * 3)
    with pytest.raises(DataError, match="has no public graph"):
        read_graph(tmp_path / "plain.h5")
    _write_graph(tmp_path / "split.h5", 3, [(0, 1)], [1.0])
    W = read_graph(tmp_path / "split.h5", connected=False)  # the check can be switched off
    assert W.nnz == 2
