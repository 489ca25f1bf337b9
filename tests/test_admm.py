"""Seed 002: DP inexact ADMM (spec dp-inexact-admm.md, checks V2-V4 and V7) in one process.

The real code path on one MPI rank (server and agents on rank 0); the rank-invariance test runs
real mpiexec jobs.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from helpers import admm_paper_contract, assert_rank_invariant, write_job
from mpi4py import MPI

from mpi_dp.algorithms import admm
from mpi_dp.comm.star import Star
from mpi_dp.data.synth import synth_multiclass, write_synth
from mpi_dp.models import multinomial

MNIST_RHO = dict(rho_mode="dynamic_1", rho_c1=2.0, rho_c2=5.0)


def problem(I: int, J: int, K: int, P: int, seed: int):
    d = synth_multiclass(P, I // P, J, 0.35, seed, classes=K, test=2000)
    return d["agents"], d["test"]


def run(method, agents_data, test, K, eps, T, runs=1, **kw):
    """The paper's algorithm at eps_bar per iteration (the paper rule's contract); sens_mode
    local_max (the authors' code) unless given."""
    kw.setdefault("sens_mode", "local_max")
    J = agents_data[0][0].shape[1]
    s = admm.Settings(method=method, T=T, n=tuple(len(y) for _, y in agents_data),
                      J=J, K=K,
                      run_ids=tuple(range(runs)), record_every=T, **kw)
    star = Star(MPI.COMM_SELF, s.P)
    con = admm_paper_contract(s, eps)
    agents = [admm.Agent(i, X, y, s, con) for i, (X, y) in enumerate(agents_data)]
    out = admm.run_config(star, agents, s, con, (test[0], test[1].astype(int)), None,
                          progress=False)
    return out, agents, s


def centralised(agents_data, K, gamma):
    X = np.concatenate([a[0] for a in agents_data])
    y = np.concatenate([a[1] for a in agents_data]).astype(int)
    w = multinomial.centralised_optimum(X, y, K, gamma)
    F = lambda W: float(multinomial.loss_sum(X, y, W)[0] / len(y)  # noqa: E731
                        + gamma * np.sum(np.asarray(W) ** 2))
    return w, F


@pytest.fixture(scope="module")
def small():
    return problem(1200, 8, 3, 4, seed=1)


def test_V2_nonprivate_objt_reaches_the_centralised_optimum(small):
    agents_data, test = small
    w_star, F = centralised(agents_data, 3, 1e-3)
    out, agents, _ = run("objt", agents_data, test, 3, math.inf, 3000, gamma=1e-3,
                         rho_mode="static", rho_static=0.5, prox_scale=1.0)
    w = out["models/final"][0]
    assert np.linalg.norm(w - w_star) / np.linalg.norm(w_star) <= 1e-3
    assert F(w) - F(w_star) <= 1e-6
    cv = np.mean([np.abs(w - a.z[0]).sum() for a in agents])
    assert cv <= 1e-6  # V3, non-private: consensus reached


def test_V2_nonprivate_objp_reaches_the_centralised_optimum(small):
    agents_data, test = small
    w_star, _ = centralised(agents_data, 3, 1e-3)
    out, _, _ = run("objp", agents_data, test, 3, math.inf, 3000, gamma=1e-3,
                    rho_mode="static", rho_static=0.5, prox_scale=1000.0)
    w = out["models/final"][0]
    assert np.linalg.norm(w - w_star) / np.linalg.norm(w_star) <= 1e-3


@pytest.mark.parametrize("method", ["objt", "objp"])
def test_V3_private_consensus_violation_falls(method):
    agents_data, test = problem(4000, 20, 4, 5, seed=2)
    kw = dict(gamma=1e-6, rho_tc=100, **MNIST_RHO)
    cv = {}
    for T in (100, 3000):  # the same seeds: the short run is the start of the long one
        out, agents, _ = run(method, agents_data, test, 4, 0.1, T, **kw)
        w = out["models/final"][0]
        cv[T] = np.mean([np.abs(w - a.z[0]).sum() for a in agents])
    assert cv[3000] <= 0.3 * cv[100], cv


@pytest.mark.parametrize("eps", [0.1, 1.0])
def test_V4_objt_beats_outp_at_equal_eps(eps):
    errs = {"objt": [], "outp_sigma": [], "outp_sigma_sq": []}
    central = []
    for data_seed in (3, 4):
        agents_data, test = problem(5000, 20, 4, 5, seed=data_seed)
        Xt, yt = test[0], test[1].astype(int)
        for key, method, std in (("objt", "objt", "sigma"), ("outp_sigma", "outp", "sigma"),
                                 ("outp_sigma_sq", "outp", "sigma_sq")):
            out, _, _ = run(method, agents_data, test, 4, eps, 500, runs=3, gamma=1e-6,
                            outp_noise_std=std, **MNIST_RHO)
            errs[key].append(multinomial.errors(Xt, yt, out["models/final"]) / len(yt))
        w_star, _ = centralised(agents_data, 4, 1e-6)
        central.append(multinomial.errors(Xt, yt, w_star)[0] / len(yt))
    objt = np.mean(errs["objt"])
    for key in ("outp_sigma", "outp_sigma_sq"):
        assert objt <= np.mean(errs[key]) - 0.03, (eps, objt, key, np.mean(errs[key]))
    if eps == 1.0:
        assert objt <= np.mean(central) + 0.02, (objt, np.mean(central))


def test_privacy_accounting_is_reported_per_iteration_and_in_total(small):
    agents_data, test = small
    out, _, s = run("objt", agents_data, test, 3, 0.5, 40)
    assert out["iterations"].tolist() == [40] * 4
    np.testing.assert_allclose(out["eps_total_basic"], 20.0)
    out, _, _ = run("outp", agents_data, test, 3, 0.5, 40)
    np.testing.assert_allclose(out["delta_total_basic"], 40 * s.dp_delta)
    out, _, _ = run("objt", agents_data, test, 3, math.inf, 5)
    assert np.all(np.isinf(out["eps_total_basic"]))


def test_run_r_equals_single_run_and_gather_equals_reduce(small):
    agents_data, test = small
    many, _, _ = run("objt", agents_data, test, 3, 0.5, 30, runs=3)
    J = agents_data[0][0].shape[1]
    s1 = admm.Settings(method="objt", T=30, n=tuple(len(y) for _, y in agents_data),
                       J=J, K=3, run_ids=(2,), record_every=30, sens_mode="local_max")
    con = admm_paper_contract(s1, 0.5)
    agents = [admm.Agent(i, X, y, s1, con) for i, (X, y) in enumerate(agents_data)]
    one = admm.run_config(Star(MPI.COMM_SELF, 4), agents, s1, con, None, None, progress=False)
    np.testing.assert_allclose(one["models/final"][0], many["models/final"][2], rtol=1e-10,
                               atol=1e-12)
    red, _, _ = run("objt", agents_data, test, 3, 0.5, 30, runs=3, aggregate="reduce")
    assert np.max(np.abs(red["models/final"] - many["models/final"])) <= 1e-8  # V7


def test_rank_invariant_under_mpiexec(tmp_path):
    data = write_synth(tmp_path / "mc.h5", "multiclass", 4, 200, 6, 0.35, 5, public=300,
                       classes=3)
    job = write_job(tmp_path / "admm.toml", data, algorithm="admm", variant="iadmm", runs=2,
                    T=20, record_every=5, sweep={"method": ["objt", "objp", "outp"],
                                                 "eps": [0.1, math.inf]})
    results = assert_rank_invariant(job, tmp_path)
    r = results[0]
    assert "configs/005/metrics/test_error" in r and r["configs/000/models/final"].shape == (2, 6, 3)
    assert np.all(r["configs/001/metrics/noise_mag"] == 0)  # objt at eps = inf: no noise
    assert np.all(r["configs/000/metrics/noise_mag"][1:] > 0)


def test_strict_sensitivity_reads_no_private_data(small):
    """sens_mode = 'global': b = 4 J / (I eps_bar) for every agent, run and iteration."""
    agents_data, test = small
    _, agents, s = run("objt", agents_data, test, 3, 0.5, 7, runs=2, sens_mode="global")
    for a in agents:
        np.testing.assert_array_equal(a.scale, 4 * s.J / s.I / 0.5)
    _, local, _ = run("objt", agents_data, test, 3, 0.5, 7, runs=2)
    assert len({float(a.scale[0]) for a in local}) == len(local)  # local_max: data-dependent


@pytest.mark.parametrize("calibration", ["paper", "pld"])
def test_the_noise_is_the_contracts_by_its_formula(tmp_path, calibration):
    """A job's per-iteration eps_bar and noise are the contract's, bit for bit by their explicit
    formulas: under the paper rule eps_bar = eps (ObjT: b = 4 J / (I eps) of the global
    sensitivity); under pld eps_bar = 1 / nm (ObjT, b = 4 J / I / eps_bar) and
    sqrt(2 ln(1.25 / dp_delta)) / nm (OutP), nm the noise multiplier of each agent's plan of T
    releases at (eps, delta)."""
    import h5py

    from mpi_dp.privacy.calibration import Plan, calibrate
    from mpi_dp.runner import run_job

    J, T, eps, delta, dp_delta = 5, 4, 2.0, 1e-5, 1e-6
    data = write_synth(tmp_path / "mc.h5", "multiclass", 2, [60, 90], J, 0.35, 3, public=50,
                       classes=3)
    job = write_job(tmp_path / "e.toml", data, algorithm="admm", runs=2, T=T, eps=eps,
                    record_every=1, sweep={"variant": ["objt", "outp"]},
                    admm={"sens_mode": "global", "reference_iters": 0},
                    privacy={"calibration": calibration, "delta": delta})
    out = run_job(job, comm=MPI.COMM_SELF, progress=False)
    sens = 4.0 * J / 150
    with h5py.File(out, "r") as f:
        objt, outp = f["configs/000"], f["configs/001"]
        if calibration == "paper":
            eps_objt = eps_outp = eps
            assert math.isnan(objt.attrs["noise_multiplier"])
        else:
            nm = {m: calibrate(Plan(m, T, eps, delta), "pld").noise_multiplier
                  for m in ("laplace", "gaussian")}
            eps_objt = 1.0 / nm["laplace"]
            eps_outp = math.sqrt(2 * math.log(1.25 / dp_delta)) / nm["gaussian"]
            assert objt.attrs["noise_multiplier"] == nm["laplace"]
            assert outp.attrs["noise_multiplier"] == nm["gaussian"]
        assert objt.attrs["eps_bar"] == eps_objt and outp.attrs["eps_bar"] == eps_outp
        b = objt["metrics/lap_scale"][()]  # the agents' mean b (2 equal values): b itself
        assert np.all(b[0] == 0) and np.all(b[1:] == sens / eps_objt)
        ledger = objt["privacy/ledger"][()]
        assert np.all(ledger["releases"] == T)
        np.testing.assert_allclose(ledger["eps_per_release"], eps_objt, rtol=1e-12)
