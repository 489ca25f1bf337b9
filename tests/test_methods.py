"""The method seam: registry-driven job keys, one default per knob, every method's privacy ledger,
admm's budget and OutP's Gaussian calibration."""

from __future__ import annotations

import glob
import math
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest
from helpers import admm_outp_sigma, admm_paper_contract, assert_rank_invariant, write_job
from mpi4py import MPI

from mpi_dp import jobspec
from mpi_dp.algorithms import admm, async_star, sync_star
from mpi_dp.algorithms import admm_steps as steps
from mpi_dp.comm.star import Star
from mpi_dp.data.synth import synth_multiclass, write_synth
from mpi_dp.errors import BudgetExceededError, JobError
from mpi_dp.job import load_job
from mpi_dp.methods import REGISTRY
from mpi_dp.methods import admm as admm_entry
from mpi_dp.methods import async_star as async_entry
from mpi_dp.privacy import accountants, gaussian_sigma
from mpi_dp.runner import run_job

JOBS = sorted(glob.glob(str(Path(__file__).resolve().parent.parent / "jobs" / "*.toml")))


@pytest.fixture(scope="module")
def multiclass(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("mc") / "mc.h5"
    return write_synth(path, "multiclass", 4, 200, 6, 0.35, 5, public=300, classes=3)


def _ledger(path, group="/"):
    with h5py.File(path, "r") as f:
        d = f[group]["privacy/ledger"]
        return d[()], dict(d.attrs), dict(f[group].attrs)


# --- job keys come from the registry -------------------------------------------------------------


@pytest.mark.parametrize("algorithm, keys, message", [
    ("admm", {"xi": 1.0}, "key 'xi': is not read by algorithm 'admm' (only sync_star, "
     "async_star read it)"),
    ("admm", {"step": {"alpha": 0.5}}, "key 'step.alpha': is not read by algorithm 'admm'"),
    ("sync_star", {"admm": {"gamma": 0.1}}, "key 'admm': the [admm] section belongs to algorithm "
     "'admm', not 'sync_star'"),
    ("async_star", {"comm": {"aggregate": "reduce"}}, "key 'comm.aggregate': is not read by "
     "algorithm 'async_star' (only sync_star, admm read it)"),
    ("sync_star", {"owners": 2}, "key 'owners': is not read by algorithm 'sync_star'"),
    ("admm", {"average": {"eta": 1.0}}, "the [average] section belongs to algorithm 'sync_star'"),
])
def test_a_key_of_another_method_is_an_error_naming_it(tmp_path, small_shards, algorithm, keys,
                                                       message):
    variant = REGISTRY.get(algorithm).variants[0]
    p = write_job(tmp_path / "j.toml", small_shards, algorithm=algorithm, variant=variant, **keys)
    with pytest.raises(JobError) as e:
        load_job(p)
    assert message in str(e.value) and str(p) in str(e.value)


def test_unknown_algorithm_lists_the_registered_ones(tmp_path, small_shards):
    p = write_job(tmp_path / "j.toml", small_shards, algorithm="sync")
    with pytest.raises(JobError, match="'sync' is not one of 'sync_star', 'async_star', 'admm'"):
        load_job(p)


def test_a_method_entry_outside_the_package_imports_first_or_after():
    """mpi_dp.p2p.method imported first (before mpi_dp.methods, in a fresh process) loads, and
    the registry then gives its METHOD, in the registry's order."""
    code = ("import mpi_dp.p2p.method as entry\n"
            "from mpi_dp.methods import REGISTRY\n"
            "assert REGISTRY.get('p2p') is entry.METHOD\n"
            "print(REGISTRY.names())")
    cp = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert cp.returncode == 0, cp.stderr[-2000:]
    assert cp.stdout.strip() == str(REGISTRY.names()) == str(
        ["sync_star", "async_star", "admm", "dola", "p2p"])


def test_variants_sweep_alike_for_every_method(tmp_path, small_shards):
    p = write_job(tmp_path / "s.toml", small_shards, sweep={"variant": ["alg1", "alg2"],
                                                            "eps": [1.0, 2.0]})
    cfgs = load_job(p).configs()
    assert [(c.variant, c.eps) for c in cfgs] == [("alg1", 1.0), ("alg1", 2.0), ("alg2", 1.0),
                                                  ("alg2", 2.0)]
    assert cfgs[0].label() == "alg1, eps=1, n=all"
    bad = write_job(tmp_path / "b.toml", small_shards, sweep={"variant": ["alg1", "proof"]})
    with pytest.raises(JobError, match=r"key 'sweep.variant\[1\]': 'proof' is not one of"):
        load_job(bad)


def test_old_admm_keys_still_load_and_say_so(tmp_path, multiclass):
    p = write_job(tmp_path / "a.toml", multiclass, algorithm="admm", variant="iadmm",
                  sweep={"method": ["objp", "outp"]}, admm={"gamma": 1e-4})
    job = load_job(p)
    assert job["variant"] == "objt" and job["sweep.variant"] == ["objp", "outp"]
    assert [c.variant for c in job.configs()] == ["objp", "outp"]
    assert any("sweep.method" in n for n in job.notes)
    q = write_job(tmp_path / "b.toml", multiclass, algorithm="admm", variant="objp",
                  admm={"method": "outp"})
    with pytest.raises(JobError, match="key 'admm.method': is the old name of 'variant'"):
        load_job(q)


@pytest.mark.parametrize("path", JOBS, ids=[Path(p).stem for p in JOBS])
def test_every_shipped_job_validates_without_old_names(path):
    job = load_job(path)
    assert job.configs() and not job.notes


def test_one_default_per_knob():
    """A knob's default is its algorithm settings' default; the job key reads it from there."""
    # admm's rho and sens_mode default to 'auto', which the method entry resolves from the
    # shard (its public row-norm bound); without one they fall back to the settings' defaults
    assert admm_entry.SECTION["rho"].default == admm_entry.SECTION["sens_mode"].default == "auto"
    assert (admm.Settings.__dataclass_fields__["rho_mode"].default,
            admm.Settings.__dataclass_fields__["sens_mode"].default) == ("dynamic_1", "global")
    pairs = [(admm_entry.SECTION, admm.Settings, {k: k for k in admm_entry.SECTION
                                                  if k not in ("rho", "sens_mode",
                                                               "reference_iters")}),
        (async_entry.SECTION, async_star.Settings, {k: k for k in (
            "mode", "scheduler", "clock_unit_s", "poll_interval_s", "noise_shape")})]
    for section, settings, fields in pairs:
        for key, field in fields.items():
            assert section[key].default == settings.__dataclass_fields__[field].default, key
    assert jobspec.SHARED_SECTIONS["step"]["schedule"].default == \
        sync_star.Settings.__dataclass_fields__["schedule"].default
    s = admm.Settings(method="outp", T=1, n=(10,), J=2, K=2, record_every=1)
    assert s.outp_noise_std == "sigma" and s.outp_calibration == "auto"


# --- every method writes privacy/ledger ----------------------------------------------------------


def test_sync_star_ledger(tmp_path, small_shards):
    out = run_job(write_job(tmp_path / "s.toml", small_shards, eps=[0.5, 2.0, math.inf], T=40,
                            privacy={"calibration": "paper", "delta": 1e-5}),
                  comm=MPI.COMM_SELF, progress=False)
    rows, attrs, _ = _ledger(out)
    assert rows["mechanism"].tolist() == [b"laplace"] * 3 and np.all(rows["releases"] == 40)
    np.testing.assert_allclose(rows["eps_per_release"][:2], [0.5 / 40, 2.0 / 40], rtol=1e-12)
    np.testing.assert_allclose(rows["eps_basic"][:2], [0.5, 2.0], rtol=1e-12)
    for i, eps in enumerate((0.5, 2.0)):
        e = eps / 40
        adv = math.sqrt(2 * 40 * math.log(1e5)) * e + 40 * e * math.expm1(e)
        assert rows["eps_advanced"][i] == pytest.approx(adv, rel=1e-9)
        assert e < rows["eps_pld"][i] < min(eps, adv)
    assert rows["eps_pld"][2] == math.inf and rows["certified"].all()
    assert attrs["delta"] == 1e-5 and "T answers" in attrs["guarantee"]


def test_async_star_ledger_matches_the_answers(tmp_path, small_shards):
    p = write_job(tmp_path / "a.toml", small_shards, algorithm="async_star", variant="proof",
                  lam=1e-5, T=120, runs=3, eps=2.0,
                  privacy={"delta": 1e-6, "calibration": "paper"},
                  **{"async": {"per_owner_cap": [20, 0, 0]}})
    out = run_job(p, comm=MPI.COMM_SELF, progress=False)
    rows, attrs, _ = _ledger(out)
    with h5py.File(out, "r") as f:
        answered = f["privacy/answered"][()]
        spent = f["privacy/spent_eps"][()]
    assert rows["releases"].tolist() == answered.max(axis=0).tolist()
    assert rows["releases"][0] == 20  # owner 0's cap: its budget spent, then it declines
    np.testing.assert_allclose(spent[:, 0], 2.0, rtol=1e-12)
    np.testing.assert_allclose(rows["eps_per_release"], [2.0 / 20, 2.0 / 120, 2.0 / 120],
                               rtol=1e-12)
    assert np.all(rows["delta"] == 1e-6) and attrs["delta"] == 1e-6
    assert np.all(rows["eps_pld"] < rows["eps_basic"])


def test_admm_ledger_flags_data_dependent_and_uncertified_noise(tmp_path, multiclass):
    def run(name, variant="objt", **admm_keys):
        p = write_job(tmp_path / f"{name}.toml", multiclass, algorithm="admm", variant=variant,
                      runs=2, T=15, eps=0.5, record_every=5, admm=admm_keys,
                      privacy={"calibration": "paper"})
        return _ledger(run_job(p, comm=MPI.COMM_SELF, progress=False))

    rows, attrs, _ = run("local", sens_mode="local_max")  # reads private data
    assert np.all(rows["releases"] == 15) and np.all(rows["data_dependent"] == 15)
    assert not rows["certified"].any() and "per iteration" in attrs["guarantee"]
    np.testing.assert_allclose(rows["eps_per_release"], 0.5, rtol=1e-9)
    rows, _, _ = run("global", sens_mode="global")
    assert rows["certified"].all() and np.all(rows["data_dependent"] == 0)
    np.testing.assert_allclose(rows["eps_basic"], 7.5, rtol=1e-9)
    sigma, _, _ = run("outp", "outp", outp_noise_std="sigma")
    sq, _, _ = run("outp_sq", "outp", outp_noise_std="sigma_sq")
    assert sigma["certified"].all() and not sq["certified"].any()
    assert np.all(sq["eps_per_release"] > sigma["eps_per_release"])  # sigma^2 < sigma: less noise


def test_outp_ledger_of_a_job(tmp_path, multiclass):
    p = write_job(tmp_path / "o.toml", multiclass, algorithm="admm", variant="outp", runs=2,
                  T=10, eps=0.5, record_every=5, privacy={"calibration": "paper"})
    rows, _, _ = _ledger(run_job(p, comm=MPI.COMM_SELF, progress=False))
    assert rows["mechanism"].tolist() == [b"gaussian"] * 4
    # classical sigma at eps = 0.5 is conservative: the exact per-release eps is below 0.5
    assert np.all(rows["eps_per_release"] < 0.5) and np.all(rows["eps_per_release"] > 0.3)
    assert np.all(rows["delta_per_release"] == 1e-6)
    np.testing.assert_allclose(rows["delta_per_release"] * rows["releases"], 10e-6)


# --- admm: a budget that refuses, a Gaussian calibration that holds ------------------------------


def _agents(T, eps, budget, runs=1, method="objt", **kw):
    """Settings, the paper rule's contract (eps per iteration, the basic cap `budget`) and its
    agents."""
    d = synth_multiclass(3, 100, 5, 0.35, 1, classes=3)
    s = admm.Settings(method=method, T=T, n=tuple(len(y) for _, y in d["agents"]),
                      J=5, K=3, record_every=T, budget_eps=budget, sens_mode="global",
                      run_ids=tuple(range(runs)), **kw)
    con = admm_paper_contract(s, eps)
    return s, con, [admm.Agent(i, X, y, s, con) for i, (X, y) in enumerate(d["agents"])]


def test_an_admm_agent_refuses_a_release_past_its_budget():
    s, _, agents = _agents(T=10, eps=0.5, budget=1.0)
    a = agents[0]
    w = np.zeros((1, s.J, s.K))
    for t in range(2):
        a.step_objective(w, t, s.rho(t, 0.5))
    np.testing.assert_allclose(a.ledger.spent_eps, 1.0)
    z = a.z.copy()
    with pytest.raises(BudgetExceededError, match="owner 0 refuses release 3"):
        a.step_objective(w, 2, s.rho(2, 0.5))
    np.testing.assert_array_equal(a.z, z)  # nothing released


def test_an_admm_run_ends_when_the_budget_is_spent():
    s, con, agents = _agents(T=10, eps=0.5, budget=1.6, runs=2)
    out = admm.run_config(Star(MPI.COMM_SELF, 3), agents, s, con, None, None, progress=False)
    assert out["ended_at"] == 3 and "budget eps=1.6" in out["end_reason"]
    assert out["iterations"].tolist() == [3, 3, 3]
    rows = accountants.ledger_rows(out["ledgers"], 1e-5)
    assert rows["releases"].tolist() == [3, 3, 3] and np.all(rows["eps_basic"] <= 1.6)


def test_admm_budget_in_a_job(tmp_path, multiclass):
    p = write_job(tmp_path / "b.toml", multiclass, algorithm="admm", variant="objp", T=20,
                  eps=0.25, record_every=4, admm={"budget_eps": 1.0, "sens_mode": "global"},
                  privacy={"calibration": "paper"})
    out = run_job(p, comm=MPI.COMM_SELF, progress=False)
    rows, _, gattrs = _ledger(out)
    assert np.all(rows["releases"] == 4) and gattrs["ended_at"] == 4
    with h5py.File(out, "r") as f:
        assert f["metrics/iteration"][-1] == 4 and f.attrs["status"] == "complete"


def test_a_budget_ending_a_run_is_rank_invariant(tmp_path, multiclass):
    """The agents agree collectively when a budget ends the run: same records, models and
    ledgers on 1, 2 and 4 ranks (real mpiexec)."""
    p = write_job(tmp_path / "r.toml", multiclass, algorithm="admm", variant="objt", T=12, runs=2,
                  eps=0.3, record_every=5, sweep={"variant": ["objt", "outp"]},
                  admm={"budget_eps": 2.0}, privacy={"calibration": "paper"})
    r = assert_rank_invariant(p, tmp_path)[0]
    assert r["configs/000/metrics/iteration"].tolist() == [0, 5, 6]  # 6 releases of 0.3 fit
    assert np.all(r["configs/000/privacy/ledger"]["releases"] == 6)
    outp = r["configs/001/privacy/ledger"]  # OutP's exact per-release eps is below 0.3
    assert np.all(outp["releases"] == np.floor(2.0 / outp["eps_per_release"])) and np.all(
        outp["releases"] > 6)


def test_outp_gaussian_calibration_options(tmp_path, multiclass):
    rho, inv_eta, delta = 102.0, 1649.87, 1e-6
    sens = steps.outp_l2_sensitivity(rho, inv_eta)
    assert admm_outp_sigma(rho, inv_eta, 0.05, delta) == gaussian_sigma(sens, 0.05, delta)
    assert admm_outp_sigma(rho, inv_eta, 4.0, delta, "auto") == pytest.approx(
        gaussian_sigma(sens, 4.0, delta, calibration="analytic"))
    with pytest.raises(ValueError, match="eps < 1"):
        admm_outp_sigma(rho, inv_eta, 4.0, delta, "classical")
    paper = admm_outp_sigma(rho, inv_eta, 4.0, delta, "paper")
    assert paper == pytest.approx(2 * math.sqrt(2 * math.log(1.25 / delta)) / (4.0 * (rho + inv_eta)))
    # a job asking for the classical bound at eps >= 1 stops before anything runs
    p = write_job(tmp_path / "c.toml", multiclass, algorithm="admm", variant="outp",
                  sweep={"eps": [0.5, 1.0]}, admm={"outp_calibration": "classical"},
                  privacy={"calibration": "paper"})
    with pytest.raises(JobError, match="key 'admm.outp_calibration': the classical Gaussian"):
        load_job(p)
    _, _, agents = _agents(T=3, eps=4.0, budget=math.inf, method="outp")
    _, _, paper_agents = _agents(T=3, eps=4.0, budget=math.inf, method="outp",
                                 outp_calibration="paper")
    assert not paper_agents[0].next_event(0, 1.0).certified
    assert agents[0].next_event(0, 1.0).certified


@pytest.mark.parametrize("algorithm", ["dola", "p2p"])
def test_graph_method_ledgers_carry_every_accountant(tmp_path, algorithm, capsys):
    """The graph methods' privacy/ledger has the same accountant columns as the star methods',
    with totals that agree with the closed forms (the paper rule: eps per release; basic = sum of
    the releases' eps; advanced by Dwork-Rothblum-Vadhan for equal releases; PLD between one
    release and both bounds). dola's guarantee composes one release per record (scope record),
    its *_all columns all of them. `mpi-dp analyze` prints them."""
    from mpi_dp.cli import main

    if algorithm == "dola":
        data = write_synth(tmp_path / "o.h5", "online", 8, 40, 4, 0.05, 3, public=100)
        keys = dict(T=6, eps=0.5, dola={"graph": "ring"})
    else:
        data = write_synth(tmp_path / "p.h5", "p2p", 24, 0, 4, 0.05, 3)
        keys = dict(T=24 * 12, eps=0.5, record_every=96)
    out = run_job(write_job(tmp_path / "g.toml", data, algorithm=algorithm, runs=2,
                            privacy={"calibration": "paper", "delta": 1e-5}, **keys),
                  comm=MPI.COMM_SELF, progress=False)
    rows, attrs, _ = _ledger(out)
    assert len(rows) == (8 if algorithm == "dola" else 24) and attrs["delta"] == 1e-5 and attrs["guarantee"]
    k, e = rows["releases"].astype(float), rows["eps_per_release"]
    assert np.all(k >= 2) and np.all((e > 0) & (e <= 0.5))
    np.testing.assert_allclose(rows["eps_basic_all"], k * e, rtol=1e-9)
    adv = np.sqrt(2 * k * math.log(1e5)) * e + k * e * np.expm1(e)
    assert np.all(rows["eps_pld_all"] >= e) and np.all(
        rows["eps_pld_all"] <= np.minimum(rows["eps_basic_all"], adv) * (1 + 1e-9))
    if algorithm == "dola":  # a single pass: each record is in one release of eps
        assert np.all(rows["scope"] == b"record")
        np.testing.assert_allclose(rows["eps_basic"], e, rtol=1e-12)
        assert np.all(rows["eps_pld"] <= e * (1 + 1e-9))
    else:
        np.testing.assert_allclose(rows["eps_advanced"], adv, rtol=1e-9)
        np.testing.assert_array_equal(rows["eps_pld"], rows["eps_pld_all"])
    assert main(["analyze", str(out)]) == 0
    text = capsys.readouterr().out
    assert "basic | advanced | PLD" in text and "privacy contract" in text


def test_per_agent_arrays_longer_than_an_attribute_are_datasets(tmp_path):
    """Per-agent values (eps, n, caps of thousands of agents, more than ATTR_ARRAY_MAX) are
    datasets of the configuration on the `agent` dimension, not attributes (capped at 64 KiB for
    readers without dense attribute storage), the run ids the `run` coordinate, and the analysis
    sees them among the configuration's attributes."""
    from mpi_dp.analysis.load import Result
    from mpi_dp.results.recorder import ATTR_ARRAY_MAX

    N = ATTR_ARRAY_MAX + 1
    data = write_synth(tmp_path / "many.h5", "regression", N, 3, 2, 0.1, 1, public=50)
    eps = [1.0 + (i % 3) for i in range(N)]
    out = run_job(write_job(tmp_path / "d.toml", data, eps=eps, T=2, runs=1),
                  comm=MPI.COMM_SELF, progress=False)
    with h5py.File(out, "r") as f:
        assert "eps" not in f.attrs and "n" not in f.attrs
        np.testing.assert_array_equal(f["eps"][()], eps)
        np.testing.assert_array_equal(f["n"][()], [3] * N)
        assert [d.label for d in f["eps"].dims] == ["agent"] and f["agent"].shape == (N,)
        assert f["run"][()].tolist() == [0] and "run_ids" not in f.attrs
    with Result(out) as r:
        c = r.configs[0]
        assert c.eps.tolist() == eps and c.n.tolist() == [3] * N
