"""DOLA over several passes (dola.passes): the stream's order, the same arithmetic as a stream of
the repeated records, the per-record plan of `passes` releases calibrated to the contract, the
T cap that names passes, and rank invariance."""

from __future__ import annotations

import math

import h5py
import numpy as np
import pytest
import scipy.sparse as sp
from dola_case import Case
from dola_case import contract as dola_contract
from helpers import assert_rank_invariant, write_job
from mpi4py import MPI

from mpi_dp.algorithms import dola
from mpi_dp.comm import topology as tp
from mpi_dp.data.synth import synth_online, write_synth
from mpi_dp.errors import BudgetExceededError, MpiDpError
from mpi_dp.privacy import rules
from mpi_dp.privacy.contract import Contract
from mpi_dp.runner import run_job


def _reader(agents):
    return lambda a, s, e: (agents[a][0][s:e], agents[a][1][s:e])


def _settings(m, T, n, **kw):
    base = dict(variant="laplace", T=T, h=1, n_features=n, m=m, eps=(0.5,) * m, lam=0.1,
                radius=1 / math.sqrt(0.1), step="strong", seed=3, record_every=max(1, T // 5))
    base.update(kw)
    return Case(**base)


@pytest.fixture(scope="module")
def online8(tmp_path_factory):
    return write_synth(tmp_path_factory.mktemp("passes") / "on8.h5", "online", 8, 30, 4, 0.05,
                       3, public=200)


# -- the stream ---------------------------------------------------------------------------------
@pytest.mark.parametrize("sparse", [False, True])
def test_pass_reader_orders_and_chunks(sparse):
    gen = np.random.default_rng(0)
    X = gen.standard_normal((10, 3))
    agents = [(sp.csr_matrix(X) if sparse else X, np.arange(10.0))] * 2
    r = dola.PassReader(_reader(agents), 10, seed=4)
    Xs, ys = r(1, 0, 30)
    assert np.array_equal(ys[:10], np.arange(10.0))  # pass 0: the stored order
    p1, p2 = ys[10:20].astype(int), ys[20:30].astype(int)
    assert sorted(p1) == sorted(p2) == list(range(10))  # every record once per pass
    assert not np.array_equal(p1, p2) and not np.array_equal(p1, np.arange(10))
    dense = Xs.toarray() if sparse else Xs
    np.testing.assert_array_equal(dense[10:20], X[p1])
    assert np.array_equal(r.order(1, 1), p1) and not np.array_equal(r.order(0, 1), p1)
    again = dola.PassReader(_reader(agents), 10, seed=4)  # any chunking: the same records
    parts = [again(1, a, min(a + 7, 30)) for a in range(0, 30, 7)]
    assert np.array_equal(np.concatenate([p[1] for p in parts]), ys)


def test_one_pass_reads_through_the_shards_own_reader():
    read = _reader([(np.zeros((3, 2)), np.zeros(3))])
    assert dola.pass_reader(_settings(1, 3, 2), read) is read
    s = _settings(1, 7, 2, passes=3)
    assert s.rounds_per_pass == 3 and [s.record_pass(t) for t in range(7)] == [0] * 3 + [1] * 3 + [2]


def test_passes_compute_what_a_stream_of_the_repeated_records_does():
    """passes = 3 over n records equals a single pass over the 3 n records the PassReader lays
    out: the arithmetic is a plain single pass, only the records repeat."""
    m, n, p, passes = 4, 12, 5, 3
    d = synth_online(m, n, p, 0.05, 1, test=0)
    agents = d["agents"]
    g = tp.make_graph("ring", m, 1)
    s3 = _settings(m, passes * n, p, passes=passes)
    b3 = dola.simulate(s3, dola_contract(s3), g, _reader(agents))
    r = dola.PassReader(_reader(agents), n, s3.seed)
    laid = [r(a, 0, passes * n) for a in range(m)]
    s1 = _settings(m, passes * n, p)
    b1 = dola.simulate(s1, dola_contract(s1), g, _reader(laid))
    assert np.array_equal(b3.W, b1.W) and np.array_equal(b3.Pub, b1.Pub)


def test_a_pass_beyond_the_calibrated_plan_is_refused():
    m, n, p = 3, 6, 4
    agents = synth_online(m, n, p, 0.05, 2, test=0)["agents"]
    s = _settings(m, 2 * n, p, passes=2)
    one = Contract.planned(rules.TIGHT, "laplace", 1, [0.5] * m, 1e-3, seed=s.seed,
                           run_ids=s.run_ids, scope="record")  # one release per record
    with pytest.raises(BudgetExceededError, match=r"pass 2 over its records is beyond the 1"):
        dola.simulate(s, one, tp.make_graph("ring", m, 1), _reader(agents))


# -- jobs ---------------------------------------------------------------------------------------
def _job(tmp_path, data, name="d", **keys):
    dola_keys = {"graph": "ring", **keys.pop("dola", {})}
    base = dict(algorithm="dola", T=90, runs=2, eps=0.5, record_every=15, seed=5)
    base.update(keys)
    return write_job(tmp_path / f"{name}.toml", data, dola=dola_keys, **base)


def _ledger(path):
    """The ledger and the configuration's attributes, per-agent values (datasets on `agent`)
    among them."""
    with h5py.File(path, "r") as f:
        per_agent = {k: d[()] for k, d in f.items()
                     if isinstance(d, h5py.Dataset) and d.attrs.get("per_agent", False)}
        return f["privacy/ledger"][()], {**dict(f.attrs), **per_agent}


def test_three_passes_meet_the_contract_per_record(tmp_path, online8, capsys):
    from mpi_dp.cli import main

    out = run_job(_job(tmp_path, online8, dola={"passes": 3}), comm=MPI.COMM_SELF,
                  progress=False)
    rows, attrs = _ledger(out)
    assert attrs["passes"] == 3 and attrs["rounds_per_pass"] == 30 and not attrs["single_pass"]
    assert np.all(attrs["n"] == 30)  # each agent's 30 records, three times
    assert np.all(rows["scope"] == b"record") and np.all(rows["releases"] == 90)
    np.testing.assert_allclose(rows["eps_pld"], 0.5, atol=1e-6)  # the per-record total
    assert np.all(rows["eps_pld"] <= 0.5 * (1 + 1e-9))
    assert np.all(rows["eps_basic"] > 0.5)  # 3 releases of the calibrated eps, basic
    np.testing.assert_allclose(rows["eps_basic"], 3 * rows["eps_per_release"], rtol=1e-12)
    assert np.all(rows["eps_pld_all"] > 3 * 0.5)  # all 90 releases composed, shown beside
    assert attrs["eps_per_record"] == 0.5
    assert main(["analyze", str(out)]) == 0
    text = capsys.readouterr().out
    assert "per owner and record" in text and ": met" in text and "PLD all" in text
    assert "3 passes put every record in exactly 3 releases" in text


def test_basic_calibration_splits_eps_over_the_passes(tmp_path, online8):
    out = run_job(_job(tmp_path, online8, T=60, dola={"passes": 2},
                       privacy={"calibration": "basic"}), comm=MPI.COMM_SELF, progress=False)
    rows, _ = _ledger(out)
    np.testing.assert_allclose(rows["eps_per_release"], 0.25, rtol=1e-12)
    np.testing.assert_allclose(rows["eps_basic"], 0.5, rtol=1e-12)


def test_one_pass_is_the_default_and_the_cap_names_passes(tmp_path, online8):
    a = run_job(_job(tmp_path, online8, "a", T=30), comm=MPI.COMM_SELF, progress=False)
    b = run_job(_job(tmp_path, online8, "b", T=30, dola={"passes": 1}), comm=MPI.COMM_SELF,
                progress=False)
    with h5py.File(a, "r") as fa, h5py.File(b, "r") as fb:
        assert fa.attrs["single_pass"] and fa.attrs["passes"] == 1
        assert np.array_equal(fa["models/w_hat"][()], fb["models/w_hat"][()])
        assert np.array_equal(fa["privacy/ledger"]["eps_pld"], fb["privacy/ledger"]["eps_pld"])
    with pytest.raises(MpiDpError, match=r"set T <= 30, raise dola.passes \(T = 31 needs "
                       r"passes >= 2"):
        run_job(_job(tmp_path, online8, "c", T=31), comm=MPI.COMM_SELF, progress=False)
    with pytest.raises(MpiDpError, match="set T <= 60, raise dola.passes"):
        run_job(_job(tmp_path, online8, "d", T=61, dola={"passes": 2}), comm=MPI.COMM_SELF,
                progress=False)
    out = run_job(_job(tmp_path, online8, "e", T=1000, n_beyond_shard="cap",
                       dola={"passes": 2}), comm=MPI.COMM_SELF, progress=False)
    with h5py.File(out, "r") as f:
        assert f.attrs["T"] == 60 and f.attrs["T_requested"] == 1000
    with pytest.raises(MpiDpError, match="key 'dola.passes'"):
        run_job(_job(tmp_path, online8, "f", dola={"passes": 0}), comm=MPI.COMM_SELF,
                progress=False)


def test_passes_are_rank_invariant(tmp_path, online8):
    job = _job(tmp_path, online8, "r", T=70, dola={"passes": 3, "graph": "medium"},
               sweep={"variant": ["laplace", "gaussian"]})
    assert_rank_invariant(job, tmp_path, ranks=(1, 2, 3))
