"""Synchronous DP gradient descent (seed 001, spec sync-dp-gradient...): in one process.

MPI is real here too (COMM_SELF); the multi-rank checks are in test_mpi_runs.py and
test_mpi_collectives.py.
"""

from __future__ import annotations

import math

import h5py
import numpy as np
import pytest
from helpers import write_job
from mpi4py import MPI

from mpi_dp.algorithms import sync_star
from mpi_dp.algorithms.common import LocalShard, Oracle, reference_quantities
from mpi_dp.comm.star import Star
from mpi_dp.data import ShardFile
from mpi_dp.errors import BudgetExceededError
from mpi_dp.privacy import rules
from mpi_dp.privacy.contract import Contract
from mpi_dp.runner import AgreedError, run_job


def _run(tmp_path, shards, name="j", **keys):
    p = write_job(tmp_path / f"{name}.toml", shards, **keys)
    return run_job(p, comm=MPI.COMM_SELF, progress=False)


def _final(path, group="/"):
    with h5py.File(path, "r") as f:
        g = f[group]
        return {k: g[k][()] for k in ("metrics/psi", "metrics/iteration", "models/final",
                                      "reference/theta_star", "privacy/ledger")}


def _settings(**kw):
    base = dict(variant="alg1", T=100, loss="squared", lam=1e-2, theta_max=1e6, theta0=0.0,
                xi=1e12, clip=True, rho=1.0, L=1.0, avg_kind="polynomial", eta=3.0, seed=3,
                run_ids=(0,), record_every=1000, aggregate="gather", eps=(math.inf,) * 3,
                n=(600, 500, 700), p=5)
    base.update(kw)
    return sync_star.Settings(**base)


def _contract(s):
    """The paper's rule for the settings' owners (what a bare run of the algorithm used)."""
    return Contract.planned(rules.BasicSplit(), "laplace", s.T, s.eps, seed=s.seed,
                            run_ids=s.run_ids)


def _problem(small_shards, n=(600, 500, 700)):
    star = Star(MPI.COMM_SELF, 3)
    with ShardFile(small_shards) as sf:
        shards = [LocalShard(i, *sf.read_agent(i, n[i])) for i in range(3)]
    X = np.concatenate([s.X for s in shards])
    H = 2.0 / X.shape[0] * X.T @ X + 1e-2 * np.eye(5)
    ev = np.linalg.eigvalsh(H)
    ref = reference_quantities(Oracle(star, shards, "squared", 1e-2, X.shape[0], 5), 1e6, "auto")
    return star, shards, H, ev[0], ev[-1], ref


def test_eps_inf_constant_step_converges_to_theta_star(small_shards):
    """Spec V4: eps = inf, constant mu = 1/L, T = 2000: ||theta_T - theta*|| / ||theta*|| < 1e-8."""
    star, shards, H, sig, L, ref = _problem(small_shards)
    T = 2000
    s = _settings(T=T, rho=T**2 / L, schedule="constant")
    out = sync_star.run_config(star, shards, s, _contract(s), ref, progress=False)
    err = np.linalg.norm(out["models/final"][0] - ref.theta_star) / np.linalg.norm(ref.theta_star)
    assert err < 1e-8


def test_eps_inf_decreasing_step_rate(small_shards):
    """Spec V4: mu_k = 1/(L k): relative error <= T^(-sigma/L) (1 + 1e-9)."""
    star, shards, H, sig, L, ref = _problem(small_shards)
    T = 500
    s = _settings(T=T, rho=T**2 / L)
    out = sync_star.run_config(star, shards, s, _contract(s), ref, progress=False)
    err = np.linalg.norm(out["models/final"][0] - ref.theta_star) / np.linalg.norm(ref.theta_star)
    assert err <= T ** (-sig / L) * (1 + 1e-9)
    assert err < 0.05  # and it did move


def test_exact_eps_scaling_common_random_numbers(small_shards):
    """Spec V5: start at theta*, same noise draws scaled by b_i: excess f - f* scales as eps^-2."""
    star, shards, H, sig, L, ref = _problem(small_shards)
    excess = []
    for eps in (1.0, 2.0, 4.0, 8.0):
        # no clipping (noise still calibrated to xi) and no box: dynamics linear in the noise
        s = _settings(T=50, rho=50**2 / L, eps=(eps,) * 3, xi=1.0, clip=False,
                      run_ids=(0, 1, 2, 3), theta_max=math.inf)
        out = sync_star.run_config(star, shards, s, _contract(s), ref, progress=False,
                                   theta_init=ref.theta_star)
        d = out["models/final"] - ref.theta_star
        excess.append(0.5 * np.einsum("ri,ij,rj->r", d, H, d))
        assert np.all(np.isfinite(out["models/final"]))
    ratios = np.array(excess) / excess[0]
    np.testing.assert_allclose(ratios, np.array([1, 1 / 4, 1 / 16, 1 / 64])[:, None] * np.ones(4),
                               rtol=1e-6)


def test_owner_refuses_query_beyond_T_and_budget(small_shards):
    star, shards, *_ = _problem(small_shards)
    s = _settings(T=5, eps=(1.0,) * 3, xi=10.0)
    owner = sync_star.DataOwner(shards[1], sync_star.owner_release(_contract(s), 1, s), s)
    theta = np.zeros((1, 5))
    for _ in range(5):
        owner.answer(theta)
    assert owner.ledger.releases == 5 and owner.ledger.spent_eps == pytest.approx(1.0, rel=1e-12)
    with pytest.raises(BudgetExceededError, match="owner 1 refuses"):
        owner.answer(theta)
    # the noise scale is the spec's b_i = 2 xi T / (n_i eps_i), exactly
    assert owner.lap_scale == 2 * 10.0 * 5 / (500 * 1.0)


def test_ledger_and_reference_in_output(tmp_path, small_shards):
    out = _run(tmp_path, small_shards, eps=[0.5, 1.0, math.inf], T=20)
    r = _final(out)
    led = r["privacy/ledger"]
    assert list(led["agent"]) == [0, 1, 2] and list(led["releases"]) == [20, 20, 20]
    np.testing.assert_allclose(led["target_eps"], [0.5, 1.0, math.inf])
    assert np.all(led["eps_pld"][:2] <= led["target_eps"][:2] * (1 + 1e-6))
    assert np.all(led["eps_pld"][:2] >= 0.99 * led["target_eps"][:2])
    assert r["metrics/psi"].shape == (21, 3) and list(r["metrics/iteration"]) == list(range(21))
    assert np.all(r["metrics/psi"] >= -1e-12)
    with h5py.File(out, "r") as f:
        assert f.attrs["status"] == "complete" and f.attrs["format"] == "mpi_dp.results"
        assert "sync_star" in f.attrs["job"] and f["provenance"].attrs["n_ranks"] == 1
        np.testing.assert_array_equal(f["privacy/lap_scale"][2], 0.0)


def test_run_index_equality(tmp_path, small_shards):
    """Run r of an R-run job equals the 1-run job with first_run = r (1e-12: GEMM vs GEMV)."""
    big = _final(_run(tmp_path, small_shards, "big", runs=4, eps=2.0))
    for r in (0, 2):
        one = _final(_run(tmp_path, small_shards, f"one{r}", runs=1, first_run=r, eps=2.0))
        np.testing.assert_allclose(one["models/final"][0], big["models/final"][r], rtol=1e-12)
        np.testing.assert_allclose(one["metrics/psi"][:, 0], big["metrics/psi"][:, r],
                                   rtol=1e-9, atol=1e-15)
    # and the runs really differ from each other (independent noise streams)
    assert not np.allclose(big["models/final"][0], big["models/final"][1])


def test_public_xi_auto_clip_fraction(tmp_path, small_shards):
    out = _run(tmp_path, small_shards, xi="auto", xi_quantile=0.9, T=5)
    with h5py.File(out, "r") as f:
        assert 0.05 < f.attrs["public_clip_fraction"] <= 0.1 + 1e-9
        assert np.all(f["metrics/clip_fraction"][1:] > 0)


def test_shard_errors_are_agreed(tmp_path, small_shards):
    with pytest.raises(AgreedError, match="not found"):
        _run(tmp_path, tmp_path / "missing.h5")
    with pytest.raises(AgreedError, match=r"key 'eps': 2 values given but the shard file"):
        _run(tmp_path, small_shards, eps=[1.0, 2.0])
    with pytest.raises(AgreedError, match="owner 1 should use 501 records but holds only 500"):
        _run(tmp_path, small_shards, n=501)
    with pytest.raises(AgreedError, match="clip = false voids the DP guarantee"):
        _run(tmp_path, small_shards, clip=False)


def _slope(x, m):
    return np.polyfit(np.log(x), np.log(m), 1)[0]


@pytest.mark.slow
def test_eps_and_n_slopes_are_minus_two(tmp_path):
    """Issue 2: Algorithm 2, fixed step constant: log-log slopes of E[psi] vs eps and n = -2
    (the paper's noise b_i = 2 xi T / (n_i eps_i): privacy.calibration = 'paper')."""
    from mpi_dp.data.synth import write_synth

    data = write_synth(tmp_path / "s.h5", "regression", 3, 8000, 5, 0.5, 4, public=5000)
    eps = [1.0, 2.0, 4.0, 8.0, 16.0]
    out = _run(tmp_path, data, "eps", runs=100, T=100, lam=1e-3, n=2000, record_every=100,
               sweep={"eps": eps + [math.inf]}, privacy={"calibration": "paper"})
    m = [_final(out, f"/configs/{i:03d}")["metrics/psi"][-1].mean() for i in range(6)]
    slope_eps = _slope(eps, np.array(m[:5]) - m[5])
    ns = [1000, 2000, 4000, 8000]
    out = _run(tmp_path, data, "n", runs=100, T=100, lam=1e-3, eps=4.0, record_every=100,
               sweep={"n": ns, "eps": [4.0, math.inf]}, privacy={"calibration": "paper"})
    m = np.array([_final(out, f"/configs/{i:03d}")["metrics/psi"][-1].mean() for i in range(8)])
    slope_n = _slope(ns, m[0::2] - m[1::2])
    print(f"slopes: eps {slope_eps:.3f}, n {slope_n:.3f}")
    assert abs(slope_eps + 2) < 0.15
    assert abs(slope_n + 2) < 0.15


def test_record_every_zero_skips_evaluation_and_changes_no_model(tmp_path, small_shards):
    """record_every = 0 (the method's cost alone, e.g. for benchmarks): no metric records, and
    the final models, bit for bit, of a run that evaluated psi at every iteration (evaluation
    changes nothing that leaves an owner). Other methods refuse 0."""
    a = run_job(write_job(tmp_path / "a.toml", small_shards, T=6, runs=2, record_every=1),
                progress=False)
    b = run_job(write_job(tmp_path / "b.toml", small_shards, T=6, runs=2, record_every=0),
                progress=False)
    with h5py.File(a, "r") as fa, h5py.File(b, "r") as fb:
        assert fa["metrics/psi"].shape[0] == 7 and "psi" not in fb.get("metrics", {})
        for k in ("models/final", "models/final_iterate"):
            assert fa[k][()].tobytes() == fb[k][()].tobytes()
    job = write_job(tmp_path / "c.toml", small_shards, algorithm="async_star", variant="proof",
                    T=6, runs=2,
                    record_every=0, lam=1e-5)
    with pytest.raises(AgreedError, match="record_every': must be at least 1, got 0; 0 .no "
                       "records. is not offered by this method"):
        run_job(job, progress=False)


def test_reference_isolated_caps_the_owners_evaluated(tmp_path, small_shards):
    """reference.isolated = k: owners 0..k-1 keep the isolated psi of the full computation, bit
    for bit; the others get NaN (their evaluation would cost O(N^2) at thousands of owners)."""
    a = run_job(write_job(tmp_path / "a.toml", small_shards, T=2, runs=1), progress=False)
    b = run_job(write_job(tmp_path / "b.toml", small_shards, T=2, runs=1,
                          reference={"isolated": 2}), progress=False)
    with h5py.File(a, "r") as fa, h5py.File(b, "r") as fb:
        full, capped = fa["reference/psi_isolated"][()], fb["reference/psi_isolated"][()]
        assert full.size == 3 and np.all(np.isfinite(full))
        assert capped[:2].tobytes() == full[:2].tobytes() and np.isnan(capped[2])
        assert np.isnan(fb["reference/theta_isolated"][2]).all()
