"""Graphs of the peer methods (p2p.graph, dola.graph): every spelling builds a connected graph
with its properties, from the seed alone (the same on any rank count); p2p runs on a shard file
without a stored graph and scores every peer on the shard's global test set."""

from __future__ import annotations

import json
import math

import h5py
import numpy as np
import pytest
from helpers import assert_rank_invariant, write_job
from mpi4py import MPI

from mpi_dp.comm import topology as tp
from mpi_dp.data import ShardFile, write_shards
from mpi_dp.data.shard_graph import graph_arrays, read_descriptors, stored_graph
from mpi_dp.data.synth import synth_online
from mpi_dp.errors import DataError, JobError, MpiDpError
from mpi_dp.runner import run_job

M = 12  # peers of the small shard files


def _shard(path, *, graph: bool = False, descriptors: np.ndarray | None = None):
    """A binary shard of M owners (rows of norm <= 1, labels from one shared w) with a global
    test set and, unless asked, no stored graph and no descriptors: what a CSV prepare writes."""
    data = synth_online(M, 60, 5, 0.05, 3, test=600)
    extra = {}
    if graph:
        ring = tp.ring(M)
        W = ring.weight_matrix() * 0.5
        extra.update(graph_arrays(W))
    if descriptors is not None:
        extra["agent_descriptors"] = descriptors
    return write_shards(path, data["agents"], task="binary", test_global=data["test"],
                        public_extra=extra or None)


def _attrs(path) -> dict:
    with h5py.File(path, "r") as f:
        return dict(f.attrs)


# -- the spellings --------------------------------------------------------------------------------
def test_complete_has_every_pair():
    g = tp.make_graph("complete", 9, 0)
    assert len(g.edges) == 9 * 8 // 2 and g.is_connected() and g.weights is None
    W = g.weight_matrix()
    assert (W != W.T).nnz == 0 and np.all(W.data == 1.0) and W.diagonal().sum() == 0


@pytest.mark.parametrize("k", [2, 5])
def test_knn_degree_at_least_k_and_deterministic(k):
    desc = np.random.default_rng(3).normal(size=(30, 3))
    g = tp.make_graph(f"knn:{k}", 30, 0, descriptors=desc)
    assert g.kind == "knn" and g.info["k"] == k and g.degrees.min() >= k
    # exactly the symmetrised k nearest: i -- j iff j in knn(i) or i in knn(j)
    d = ((desc[:, None] - desc[None]) ** 2).sum(axis=2)
    np.fill_diagonal(d, np.inf)
    near = np.argsort(d, axis=1, kind="stable")[:, :k]
    want = {(min(i, j), max(i, j)) for i in range(30) for j in near[i]}
    assert {tuple(e) for e in g.edges.tolist()} == want
    again = tp.make_graph(f"knn:{k}", 30, 99, descriptors=lambda: desc)  # no random draw
    assert np.array_equal(again.edges, g.edges)


def test_knn_disconnected_says_raise_k():
    desc = np.concatenate([np.zeros((5, 2)), np.full((5, 2), 100.0)])
    desc += np.arange(10)[:, None] * 1e-3
    with pytest.raises(JobError, match=r"not connected.*raise K \(e\.g\. knn:2\)"):
        tp.make_graph("knn:1", 10, 0, descriptors=desc)
    with pytest.raises(JobError, match="1 <= K <= m - 1"):
        tp.make_graph("knn:10", 10, 0, descriptors=desc)


def test_erdos_renyi_reproducible_from_the_seed():
    a = tp.make_graph("erdos_renyi:0.3", 40, 5)
    b = tp.make_graph("erdos_renyi:0.3", 40, 5)
    c = tp.make_graph("erdos_renyi:0.3", 40, 6)
    assert np.array_equal(a.edges, b.edges) and not np.array_equal(a.edges, c.edges)
    assert a.is_connected() and a.info["p"] == 0.3
    # dola's own spelling (kind + graph_p) is the same graph
    assert np.array_equal(a.edges, tp.make_graph("erdos_renyi", 40, 5, p=0.3).edges)
    with pytest.raises(JobError, match="raise p"):
        tp.make_graph("erdos_renyi:0.001", 40, 5)


def test_random_geometric_spellings():
    g = tp.make_graph("random_geometric", 50, 2)
    assert g.is_connected() and g.info["target_degree"] == tp.RGG_SPEC_DEGREE
    assert np.array_equal(g.edges, tp.make_graph("medium", 50, 2).edges)  # dola's T2 graph
    r = tp.make_graph("random_geometric:0.35", 50, 2)
    assert r.is_connected() and r.info["radius"] == 0.35
    d = np.linalg.norm(r.positions[r.edges[:, 0]] - r.positions[r.edges[:, 1]], axis=1)
    assert d.max() <= 0.35
    with pytest.raises(JobError, match="raise r"):
        tp.make_graph("random_geometric:0.01", 50, 2)


def test_edge_list_round_trips(tmp_path):
    g = tp.make_graph("erdos_renyi:0.4", 15, 1)
    back = tp.make_graph(str(tp.to_file(g, tmp_path / "g.txt")), 15, 0)
    assert np.array_equal(back.edges, g.edges) and back.weights is None
    w = tp.Graph(15, g.edges, "weighted", weights=np.linspace(0.5, 2.0, len(g.edges)))
    path = tp.to_file(w, tmp_path / "w.txt")
    back = tp.make_graph(f"file:{path}", 15, 0)
    assert np.array_equal(back.edges, w.edges) and np.array_equal(back.weights, w.weights)
    path.write_text("0 1 2.0\n1 0 3.0\n")
    with pytest.raises(JobError, match="weights 2 and 3"):
        tp.from_file(path, 15)


@pytest.mark.parametrize("value, message", [
    ("knn", "knn:K"), ("knn:0", "K >= 1"), ("erdos_renyi:1.5", r"\(0, 1\]"),
    ("random_geometric:-1", "radius > 0"), ("complete:3", "no parameter"),
    ("hypercube", "unknown graph"),
])
def test_bad_spellings_name_the_forms(value, message):
    with pytest.raises(ValueError, match=message):
        tp.parse_graph_spec(value)


def test_stored_graph_and_descriptors_of_a_shard(tmp_path):
    desc = np.arange(M, dtype=float)[:, None]
    with ShardFile(_shard(tmp_path / "s.h5", graph=True, descriptors=desc)) as f:
        e, w = stored_graph(f)
        g = tp.make_graph("shard", M, 0, stored=(e, w))
        assert g.kind == "shard" and len(g.edges) == M and np.all(g.weights == 0.5)
        assert np.array_equal(read_descriptors(f), desc)
    with ShardFile(_shard(tmp_path / "bare.h5")) as f, \
            pytest.raises(DataError, match="agent_descriptors"):
        read_descriptors(f)


# -- p2p on a shard file without a stored graph ---------------------------------------------------
@pytest.fixture(scope="module")
def bare(tmp_path_factory):
    return _shard(tmp_path_factory.mktemp("peer") / "bare.h5")


def _p2p(tmp_path, data, name="p", **p2p):
    return write_job(tmp_path / f"{name}.toml", data, algorithm="p2p", T=M * 40, runs=2, seed=7,
                     eps=math.inf, record_every=M * 20, p2p={"mu": 1.0, **p2p})


def test_p2p_without_a_stored_graph_names_the_alternatives(tmp_path, bare):
    with pytest.raises(MpiDpError, match=r"key 'p2p.graph'.*has no public graph.*'complete'.*'knn:K'"):
        run_job(_p2p(tmp_path, bare), comm=MPI.COMM_SELF, progress=False)
    assert not (tmp_path / "p.h5").exists()
    with pytest.raises(MpiDpError, match=r"key 'p2p.graph'.*agent_descriptors"):
        run_job(_p2p(tmp_path, bare, graph="knn:3"), comm=MPI.COMM_SELF, progress=False)
    with pytest.raises(MpiDpError, match=r"key 'p2p.graph'.*unknown graph"):
        run_job(_p2p(tmp_path, bare, graph="hypercube"), comm=MPI.COMM_SELF, progress=False)


def test_p2p_complete_graph_beats_the_majority_on_the_global_test_set(tmp_path, bare, capsys):
    from mpi_dp.cli import main

    out = run_job(_p2p(tmp_path, bare, graph="complete"), comm=MPI.COMM_SELF, progress=False)
    a = _attrs(out)
    info = json.loads(a["graph"])
    assert info["kind"] == "complete" and info["n_edges"] == M * (M - 1) // 2
    assert a["graph_edges"] == M * (M - 1) // 2 and a["graph_mean_degree"] == M - 1
    assert a["test_global_records"] == 600 and a["test_global_metric"].startswith("error rate")
    with h5py.File(out, "r") as f:
        err = f["per_agent/test_global_error"][()]
        loc = f["per_agent/test_global_error_local"][()]
        assert np.array_equal(f["graph/edges"][()], tp.complete(M).edges)
        assert np.all(f["graph/weights"][()] == 1.0)  # unweighted: 1 per edge
    assert err.shape == (2, M) and loc.shape == (M,)
    # a broken evaluation (wrong sign, wrong models, no training) sits at or above the majority
    assert a["test_global_error"] < 0.5 * a["test_global_error_trivial"]
    assert a["test_global_error"] == pytest.approx(float(err.mean()), rel=1e-12)
    assert a["test_global_error"] < a["test_global_error_local"]  # collaboration helps here
    assert main(["analyze", str(out)]) == 0
    text = capsys.readouterr().out
    assert "global trivial" in text and "graph: complete" in text


def test_p2p_knn_graph_on_public_descriptors(tmp_path):
    data = _shard(tmp_path / "d.h5", descriptors=np.arange(M, dtype=float)[:, None] ** 1.5)
    out = run_job(_p2p(tmp_path, data, graph="knn:2"), comm=MPI.COMM_SELF, progress=False)
    a = _attrs(out)
    info = json.loads(a["graph"])
    assert info["kind"] == "knn" and info["k"] == 2 and info["min_degree"] >= 2
    assert a["test_global_error"] < a["test_global_error_trivial"]


def test_p2p_stored_graph_is_still_the_default(tmp_path):
    data = _shard(tmp_path / "g.h5", graph=True)
    out = run_job(_p2p(tmp_path, data), comm=MPI.COMM_SELF, progress=False)
    a = _attrs(out)
    assert a["graph_kind"] == "shard" and a["graph_edges"] == M
    with h5py.File(out, "r") as f:
        assert "graph" not in f  # the shard file holds it: outputs as before


def test_p2p_graph_and_run_are_the_same_on_1_2_3_ranks(tmp_path, bare):
    """A random graph (built on rank 0 from the seed, broadcast) and a private run: every
    dataset and the recorded graph bit for bit on 1, 2 and 3 ranks."""
    job = write_job(tmp_path / "r.toml", bare, algorithm="p2p", T=M * 20, runs=2, seed=11,
                    eps=1.0, record_every=M * 10, p2p={"mu": 1.0, "graph": "erdos_renyi:0.3"})
    assert_rank_invariant(job, tmp_path, ranks=(1, 2, 3))
    graphs = [_attrs(tmp_path / f"r_{n}ranks.h5")["graph"] for n in (1, 2, 3)]
    assert graphs[0] == graphs[1] == graphs[2]
    want = tp.make_graph("erdos_renyi:0.3", M, 11)
    assert json.loads(graphs[0])["n_edges"] == len(want.edges)


# -- dola reads the same spellings ----------------------------------------------------------------
def test_dola_accepts_the_shared_spellings(tmp_path):
    data = _shard(tmp_path / "o.h5", graph=True, descriptors=np.arange(M, dtype=float)[:, None])
    edges = {}
    for name, graph, extra in (("shard", "shard", {}), ("knn", "knn:2", {}),
                               ("er", "erdos_renyi:0.4", {}),
                               ("er_old", "erdos_renyi", {"graph_p": 0.4})):
        job = write_job(tmp_path / f"{name}.toml", data, algorithm="dola", T=10, runs=1,
                        eps=1.0, dola={"graph": graph, **extra})
        with h5py.File(run_job(job, comm=MPI.COMM_SELF, progress=False), "r") as f:
            edges[name] = f["graph/edges"][()]
    assert np.array_equal(edges["shard"], tp.ring(M).edges)
    assert np.array_equal(edges["knn"], tp.knn(np.arange(M, dtype=float)[:, None], 2).edges)
    assert np.array_equal(edges["er"], edges["er_old"])
    bad = write_job(tmp_path / "bad.toml", data, algorithm="dola", T=10, owners=4,
                    dola={"graph": "knn:2", "pool_owners": True})
    with pytest.raises(MpiDpError, match="key 'dola.graph'.*pool_owners"):
        run_job(bad, comm=MPI.COMM_SELF, progress=False)
