"""DOLA under real `mpiexec`: every variant and exchange mode on 1, 2, 3 and 4 ranks equals the
single-process simulator of all agents (spec §7 item 12), and bad inputs stop every rank with one
message."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import h5py
import numpy as np
import pytest
from dola_case import Case, contract
from helpers import mpi_run, write_job
from mpi4py import MPI

from mpi_dp.algorithms import dola
from mpi_dp.analysis.load import ConfigView
from mpi_dp.comm import graph_exchange
from mpi_dp.comm import topology as tp
from mpi_dp.data import ShardFile, write_shards
from mpi_dp.data.synth import write_synth
from mpi_dp.errors import JobError
from mpi_dp.methods.dola import sensitivity_reg
from mpi_dp.models.reference import svm_dual_cd

VARIANTS = ["laplace", "gaussian", "sparse", "minibatch"]
BITWISE = ("regret", "regret_own", "loss", "online_error", "noise_l1", "sparsity",
           "active_degree", "a_self_min")


@pytest.fixture(scope="module")
def online64(tmp_path_factory):
    path = tmp_path_factory.mktemp("dola") / "online64.h5"
    return write_synth(path, "online", 64, 90, 5, 0.05, 3, public=300)


def _job(tmp_path, data, name, **dola_keys):
    """A dola job under the paper's rule (eps per release), which the simulator reruns from the
    configuration's attributes alone."""
    return write_job(tmp_path / f"{name}.toml", data, algorithm="dola", T=8, runs=2, eps=0.5,
                     record_every=2, seed=5, sweep={"variant": VARIANTS},
                     dola={"graph": "medium", **dola_keys}, privacy={"calibration": "paper"})


def _settings_from(attrs) -> Case:
    """The run's settings and its paper rule's knobs, rebuilt from the configuration's
    attributes alone."""
    kw = {}
    for f in dataclasses.fields(Case):
        if f.name == "rule":  # the paper's rule (privacy.calibration = 'paper'): the case's own
            continue
        if f.name == "L_reg":  # dola.sens_mode, resolved as the method entry resolves it
            mode = attrs["sens_mode"]
            kw[f.name] = sensitivity_reg(mode.decode() if isinstance(mode, bytes) else str(mode),
                                         float(attrs["lam"]), float(attrs["radius"]))
            continue
        v = attrs[f.name]
        if f.name in ("eps", "run_ids"):
            v = tuple(float(x) if f.name == "eps" else int(x) for x in np.atleast_1d(v))
        elif isinstance(v, np.generic):
            v = v.item()
        elif isinstance(v, bytes):
            v = v.decode()
        kw[f.name] = v
    return Case(**kw)


def _simulate(data, g) -> dict:
    shard = ShardFile(data)
    s = _settings_from(ConfigView(g, 0, Path(g.file.filename)).attrs)  # per-agent values too
    graph = tp.Graph(s.m, g["graph/edges"][()], "from result")
    w_star = g["reference/w_star"][()] if "reference/w_star" in g else None
    recs = {}
    block = dola.simulate(s, contract(s), graph, shard.read_agent_rows, w_star,
                          shard.read_test() if shard.has_global_test else None,
                          on_record=lambda t, r: recs.__setitem__(t, r))
    return {"recs": recs, "block": block}


@pytest.mark.parametrize("mode, ranks", [("allgather", (1, 2, 3, 4)), ("alltoallv", (1, 2, 4)),
                                         ("rma", (1, 2, 4))])
def test_mpi_runs_equal_the_simulator(tmp_path, online64, mode, ranks):
    job = _job(tmp_path, online64, f"j_{mode}", exchange=mode)
    sims = {}
    for n in ranks:
        out = tmp_path / f"{mode}_{n}.h5"
        cp = mpi_run(n, ["run", str(job), "--out", str(out), "--quiet"])
        assert cp.returncode == 0, cp.stderr
        with h5py.File(out, "r") as f:
            assert f.attrs["status"] == "complete"
            for c in f["configs"]:
                g = f["configs"][c]
                variant = g.attrs["variant"]
                if variant not in sims:
                    sims[variant] = _simulate(online64, g)
                recs = sims[variant]["recs"]
                its = g["metrics/iteration"][()]
                assert list(its) == sorted(recs)
                for name in g["metrics"]:
                    if name == "iteration":
                        continue
                    got = g["metrics"][name][()]
                    want = np.array([recs[t][name] for t in its])
                    if name in BITWISE:
                        np.testing.assert_array_equal(got, want, err_msg=f"{variant} {name}")
                    else:  # sums through Allreduce: the order of ranks
                        np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12,
                                                   err_msg=f"{variant} {name}")
                last = recs[its[-1]]
                np.testing.assert_allclose(g["models/w_hat"][()], last["_w_hat"], rtol=1e-10,
                                           atol=1e-13)
                assert g.attrs["eps_per_record"] == 0.5 and g.attrs["invariant_P"]
                led = g["privacy/ledger"][()]
                assert len(led) == 64 and np.all(led["releases"] == g.attrs["T"])


def test_comparator_is_the_svm_optimum_on_consumed_records(tmp_path, online64):
    job = write_job(tmp_path / "c.toml", online64, algorithm="dola", T=30, runs=1, eps=1.0,
                    dola={"graph": "ring"})
    cp = mpi_run(2, ["run", str(job), "--quiet"])
    assert cp.returncode == 0, cp.stderr
    shard = ShardFile(online64)
    parts = [shard.read_agent_rows(a, 0, 30) for a in range(64)]
    X = np.concatenate([p[0] for p in parts])
    y = np.concatenate([p[1] for p in parts])
    with h5py.File(tmp_path / "c.h5", "r") as f:
        np.testing.assert_allclose(f["reference/w_star"][()], svm_dual_cd(X, y, 0.1), atol=1e-8)


def _one_error(cp, message):
    assert cp.returncode != 0
    assert cp.stderr.count(message) == 1, cp.stderr


def test_disconnected_graph_file_stops_every_rank(tmp_path, online64):
    edges = tmp_path / "edges.txt"
    edges.write_text("\n".join(f"{i} {i + 1}" for i in range(62) if i != 30) + "\n")
    job = write_job(tmp_path / "bad.toml", online64, algorithm="dola", T=5,
                    dola={"graph": "from_file", "graph_file": str(edges)})
    cp = mpi_run(4, ["run", str(job)], timeout=120)
    _one_error(cp, "is not connected")
    assert not (tmp_path / "bad.h5").exists()


def test_more_agents_than_shard_owners(tmp_path, online64):
    job = write_job(tmp_path / "bad.toml", online64, algorithm="dola", T=5, owners=100)
    _one_error(mpi_run(2, ["run", str(job)], timeout=120), "100 owners asked for but the shard file")


def test_agent_with_too_few_records_for_a_round(tmp_path):
    gen = np.random.default_rng(0)
    agents = [(gen.uniform(-0.3, 0.3, (n, 3)), gen.choice([-1.0, 1.0], n)) for n in (20, 20, 5)]
    data = write_shards(tmp_path / "s.h5", agents, task="binary")
    job = write_job(tmp_path / "bad.toml", data, algorithm="dola", T=1, variant="minibatch",
                    dola={"graph": "complete"})
    _one_error(mpi_run(2, ["run", str(job)], timeout=120), "agent(s) [2] hold fewer than h = 10")
    assert not (tmp_path / "bad.h5").exists()


def test_too_many_rounds_names_the_limit(tmp_path, online64):
    job = write_job(tmp_path / "bad.toml", online64, algorithm="dola", T=500)
    _one_error(mpi_run(2, ["run", str(job)], timeout=120), "set T <= 90")


def test_rma_without_window_support_is_a_clear_error(monkeypatch):
    def refuse(*a, **k):
        raise NotImplementedError("MPI_Win_allocate")
    monkeypatch.setattr(graph_exchange, "allocate_window", refuse)
    g = tp.make_graph("ring", 4, 0)
    with pytest.raises(JobError, match="cannot allocate an RMA window"):
        graph_exchange.GraphNet(MPI.COMM_SELF, g, "rma", (1, 3))


def test_uncertified_modes_are_flagged(tmp_path, online64):
    job = write_job(tmp_path / "u.toml", online64, algorithm="dola", T=6, variant="gaussian",
                    eps=0.5, dola={"graph": "ring", "gauss_mode": "paper"},
                    privacy={"calibration": "paper"})
    cp = mpi_run(1, ["run", str(job), "--quiet"])
    assert cp.returncode == 0, cp.stderr
    with h5py.File(tmp_path / "u.h5", "r") as f:
        assert not f.attrs["certified"] and math.isnan(f.attrs["eps_per_record"])
        assert "UNCERTIFIED" in f["privacy/ledger"].attrs["guarantee"]


def test_ranks_without_agents_take_part(tmp_path, online64):
    """3 agents on 4 ranks: rank 3 hosts none and still joins every collective."""
    job = write_job(tmp_path / "few.toml", online64, algorithm="dola", T=20, owners=3, runs=2,
                    eps=1.0, dola={"graph": "complete", "exchange": "rma"})
    outs = []
    for n in (1, 4):
        out = tmp_path / f"few_{n}.h5"
        cp = mpi_run(n, ["run", str(job), "--out", str(out), "--quiet"])
        assert cp.returncode == 0, cp.stderr
        with h5py.File(out, "r") as f:
            outs.append((f["metrics/regret"][()], f["metrics/loss"][()]))
    np.testing.assert_array_equal(outs[0][0], outs[1][0])
    np.testing.assert_array_equal(outs[0][1], outs[1][1])
