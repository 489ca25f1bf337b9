"""One privacy contract for every method: a job's eps and delta are each owner's total, met by the
tight calibration and shown alike in every method's privacy/ledger; the paper rules stay behind
privacy.calibration = 'paper'; bad deltas and unknown rules are refused before any output."""

from __future__ import annotations

import math
from pathlib import Path

import h5py
import numpy as np
import pytest
from helpers import mpi_run, write_job

from mpi_dp.privacy import kairouz

METHODS = ("sync_star", "async_star", "admm", "dola", "p2p")


@pytest.fixture(scope="module")
def data(method_shards) -> dict[str, Path]:
    return method_shards


def _keys(method: str, data: dict[str, Path]) -> tuple[Path, dict]:
    """A small job of `method` (its data and keys)."""
    if method == "sync_star":
        return data["regression"], dict(T=40, runs=3)
    if method == "async_star":  # 40 updates over 3 owners: every owner reaches its cap of 10
        return data["regression"], dict(T=40, runs=3, variant="proof", lam=1e-3,
                                        **{"async": {"per_owner_cap": 10}})
    if method == "admm":
        return data["multiclass"], dict(T=20, runs=2, record_every=10)
    if method == "dola":
        return data["online"], dict(T=50, runs=2, record_every=25, dola={"graph": "ring"})
    # 24 ticks per peer on average: every peer reaches its T_i = 8 wake-ups
    return data["p2p"], dict(T=16 * 24, runs=2, record_every=128,
                             p2p={"init": "private_ws", "eps_ws": 0.05, "T_agent": 8})


def _ledger(path: Path) -> tuple[np.ndarray, dict]:
    with h5py.File(path, "r") as f:
        return f["privacy/ledger"][()], dict(f.attrs)


def _run(tmp_path: Path, name: str, method: str, data: dict[str, Path], n: int = 2,
         **extra) -> Path:
    shard, keys = _keys(method, data)
    keys = {**keys, **extra}
    if "privacy" in extra and isinstance(extra["privacy"], dict):
        keys["privacy"] = {"delta": 1e-5, **extra["privacy"]}
    job = write_job(tmp_path / f"{name}.toml", shard, algorithm=method, **keys)
    out = tmp_path / f"{name}.h5"
    cp = mpi_run(n, ["run", str(job), "--out", str(out), "--quiet"])
    assert cp.returncode == 0, cp.stderr
    return out


@pytest.mark.parametrize("method", METHODS)
def test_every_owner_gets_its_total_eps_and_delta_with_little_waste(tmp_path, data, method):
    """eps = 1, delta = 1e-5, the default (pld) calibration: every owner's tight total of what
    its guarantee composes is at most 1 (to 1e-6) and at least 0.9, at delta = 1e-5, and every
    method writes the same ledger columns."""
    out = _run(tmp_path, method, method, data, eps=1.0, privacy={"delta": 1e-5})
    rows, _ = _ledger(out)
    assert rows.dtype.names == _ledger_columns()
    assert np.all(rows["calibration"] == b"pld") and np.all(rows["target_eps"] == 1.0)
    assert np.all(rows["delta"] == 1e-5) and np.all(rows["target_delta"] == 1e-5)
    assert np.all(rows["eps_pld"] <= 1.0 + 1e-6), rows["eps_pld"]
    assert np.all(rows["eps_pld"] >= 0.9), rows["eps_pld"]
    assert np.all(rows["eps_rdp"] >= rows["eps_pld"])  # the cross-check is looser
    assert rows["certified"].all()
    if method == "dola":  # one release per record; the plain composition of all is far more
        assert np.all(rows["scope"] == b"record")
        assert np.all(rows["eps_pld_all"] > 5 * rows["eps_pld"])
    else:
        assert np.all(rows["scope"] == b"configuration")


def _ledger_columns() -> tuple[str, ...]:
    from mpi_dp.privacy.accountants import LEDGER_DTYPE

    return LEDGER_DTYPE.names


def test_tight_calibration_needs_less_noise_and_learns_better_than_basic(tmp_path):
    """The demo job (sync_star, 3 owners x 4,000 records, T = 200) at eps = 1: the pld rule's
    noise is several times smaller than the basic split's for the same (eps, delta), and its
    median psi is lower."""
    from mpi_dp.data.synth import write_synth as ws

    shard = ws(tmp_path / "demo.h5", "regression", 3, 4000, 10, 0.5, 1, public=10000)
    demo = Path(__file__).resolve().parent.parent / "jobs" / "demo.toml"
    outs = {}
    for rule in ("pld", "basic"):
        out = tmp_path / f"demo_{rule}.h5"
        cp = mpi_run(2, ["run", str(demo), "--out", str(out), "--quiet", "--set",
                         f'data="{shard}"', "--set", "sweep.eps=[1.0]", "--set", "runs=10",
                         "--set", f'privacy.calibration="{rule}"'])
        assert cp.returncode == 0, cp.stderr
        outs[rule] = out
    with h5py.File(outs["pld"], "r") as fa, h5py.File(outs["basic"], "r") as fb:
        a, b = fa["configs/000"], fb["configs/000"]  # a one-value sweep keeps its layout
        la, lb = a["privacy/ledger"][()], b["privacy/ledger"][()]
        assert np.all(la["noise_multiplier"] < lb["noise_multiplier"] / 3)
        assert np.all(la["eps_pld"] <= 1 + 1e-6) and np.all(lb["eps_basic"] <= 1 + 1e-9)
        psi_tight = np.median(a["metrics/psi"][-1])
        psi_basic = np.median(b["metrics/psi"][-1])
    assert psi_tight < psi_basic / 3, (psi_tight, psi_basic)


def test_paper_rules_keep_each_paper_s_noise(tmp_path, data):
    """privacy.calibration = 'paper': each method's paper formula, exactly (the figure jobs rely
    on it): sync b_i = 2 xi T / (n_i eps_i); async 2 xi m_i / (n_i eps_i); admm eps_bar = eps
    per iteration; dola eps per release; p2p Theorem 1's equal split at delta_bar."""
    paper = {"calibration": "paper"}
    out = _run(tmp_path, "sync", "sync_star", data, eps=[0.5, 2.0, 1.0], privacy=paper)
    with h5py.File(out, "r") as f:
        xi, T, n = f.attrs["xi"], 40, [300, 250, 400]
        want = np.array([2 * xi * T / (n[i] * e) for i, e in enumerate((0.5, 2.0, 1.0))])
        assert np.array_equal(f["privacy/lap_scale"][()], want)
        assert np.all(f["privacy/ledger"]["calibration"] == b"paper:basic_split")
        np.testing.assert_allclose(f["privacy/ledger"]["eps_basic"], [0.5, 2.0, 1.0],
                                   rtol=1e-12)
    out = _run(tmp_path, "async", "async_star", data, eps=1.0, privacy=paper)
    with h5py.File(out, "r") as f:
        xi = f.attrs["xi"]
        want = np.array([2 * xi * 10 / (n_i * 1.0) for n_i in (300, 250, 400)])  # m_i = 10
        assert np.array_equal(f["privacy/lap_scale"][()], want)
    out = _run(tmp_path, "admm", "admm", data, eps=0.5, privacy=paper)
    with h5py.File(out, "r") as f:
        assert f.attrs["eps_bar"] == 0.5
        np.testing.assert_allclose(f["privacy/ledger"]["eps_basic"], 0.5 * 20, rtol=1e-12)
    out = _run(tmp_path, "dola", "dola", data, eps=0.5, privacy=paper)
    with h5py.File(out, "r") as f:
        assert f.attrs["eps_per_release"] == 0.5 and f.attrs["eps_per_record"] == 0.5
        np.testing.assert_allclose(f["privacy/ledger"]["eps_per_release"], 0.5, rtol=1e-12)
    out = _run(tmp_path, "p2p", "p2p", data, eps=0.5, privacy=paper)
    with h5py.File(out, "r") as f:
        assert f.attrs["eps_step"] == kairouz.equal_split(0.5, 8, math.exp(-5))


def test_pld_gives_less_noise_than_the_paper_rule_of_every_method(tmp_path, data):
    """For the same eps, the tight contract's noise multiplier is below the paper rule's wherever
    the paper splits eps over releases (sync_star, async_star, p2p); admm's paper rule reads eps
    per iteration, so its total is far above eps, which the contract holds to eps."""
    for method in ("sync_star", "async_star", "p2p"):
        a = _ledger(_run(tmp_path, f"{method}_pld", method, data, eps=1.0))[0]
        b = _ledger(_run(tmp_path, f"{method}_paper", method, data, eps=1.0,
                         privacy={"calibration": "paper"}))[0]
        live = b["releases"] > 0
        assert np.all(a["noise_multiplier"][live] < b["noise_multiplier"][live]), method
    a = _ledger(_run(tmp_path, "admm_pld", "admm", data, eps=1.0))[0]
    b = _ledger(_run(tmp_path, "admm_paper", "admm", data, eps=1.0,
                     privacy={"calibration": "paper"}))[0]
    assert np.all(a["eps_pld"] <= 1 + 1e-6) and np.all(b["eps_pld"] > 5)


@pytest.mark.parametrize("keys, message", [
    (dict(privacy={"delta": 0.003}), "owner 2 (n_i = 400 records)"),
    (dict(privacy={"calibration": "tight"}), "'tight' is not one of 'pld', 'basic', 'paper'"),
    (dict(privacy={"delta": "sometimes"}), "must be 'auto' or a number in (0, 1)"),
])
def test_bad_contracts_are_refused_before_any_output(tmp_path, data, keys, message):
    job = write_job(tmp_path / "bad.toml", data["regression"], eps=1.0, T=10, **keys)
    out = tmp_path / "bad.h5"
    cp = mpi_run(2, ["run", str(job), "--out", str(out), "--quiet"])
    assert cp.returncode == 2, cp.stderr
    assert message in cp.stderr and cp.stderr.count("error") <= 2, cp.stderr
    assert not out.exists() and not Path(str(out) + ".partial").exists()


def test_a_private_selection_charges_every_candidate(tmp_path, data):
    """p2p.select = 'T_agent': all candidates are calibrated together to every peer's (eps,
    delta); a candidate's ledger holds its own wake-ups and its noised validation score, and
    composes them with the other candidates' planned releases to at most the peer's eps (scope
    selection); the score each peer released is what analyze selects on."""
    out = _run(tmp_path, "sel", "p2p", data, eps=1.0, T=16 * 30, record_every=240,
               p2p={"validation": 0.25, "select": "T_agent"}, sweep={"T_agent": [2, 6]},
               privacy={"delta": 1e-4})
    with h5py.File(out, "r") as f:
        groups = [f["configs"][k] for k in sorted(f["configs"])]
        for g, cap in zip(groups, (2, 6), strict=True):
            led = g["privacy/ledger"][()]
            assert np.all(led["scope"] == b"selection") and g.attrs["select"] == "T_agent"
            assert np.all(led["eps_pld"] <= 1.0 + 1e-6) and np.all(led["eps_pld"] >= 0.8)
            assert np.all(led["eps_pld_all"] < led["eps_pld"])  # its own share alone
            assert np.all(led["releases"] <= cap + 1) and np.any(led["releases"] == cap + 1)
            assert math.isfinite(g.attrs["val_metric"])
        assert "per selection" in groups[0].attrs["calibrations"]
    # a selection needs held-out records, and the paper's rule cannot charge one
    for keys, message in ((dict(p2p={"select": "T_agent"}), "set p2p.validation > 0"),
                          (dict(p2p={"select": "T_agent", "validation": 0.2},
                                privacy={"calibration": "paper"}),
                           "a private selection composes its candidates under the contract")):
        job = write_job(tmp_path / "nosel.toml", data["p2p"], algorithm="p2p", eps=1.0, T=64,
                        sweep={"T_agent": [2, 6]}, **keys)
        cp = mpi_run(1, ["run", str(job), "--out", str(tmp_path / "nosel.h5"), "--quiet"])
        assert cp.returncode == 2 and message in cp.stderr, cp.stderr
