"""eps so large that the noise is negligible (1e8, 1e300) is treated exactly, with no overflow
anywhere: every method's job completes, the ledger's totals are finite and equal the target, the
noise multiplier is tiny and the models equal (or nearly equal) the eps = inf ones, and analyze,
compare and plot work, all with RuntimeWarning turned into an error."""

from __future__ import annotations

import math
import warnings
from pathlib import Path

import numpy as np
import pytest
from helpers import write_job
from mpi4py import MPI

from mpi_dp.analysis.load import open_result
from mpi_dp.cli import main as cli_main
from mpi_dp.privacy import accountants, contract, events, kairouz
from mpi_dp.privacy.events import GaussianEvent, LaplaceEvent
from mpi_dp.privacy.mechanisms import gaussian_sigma
from mpi_dp.runner import run_job

pytestmark = pytest.mark.filterwarnings("error::RuntimeWarning")

METHODS = ("sync_star", "async_star", "admm", "dola", "p2p")
HUGE = (1e8, 1e300)
DELTA = 1e-5
REL = 1e-12  # "exact": the float sums of k per-release eps round to the target to this


@pytest.fixture(scope="module")
def data(method_shards) -> dict[str, Path]:
    return method_shards


def _keys(method: str, data: dict[str, Path]) -> tuple[Path, dict]:
    """A tiny job of `method`: its data and keys (each owner's plan is a few releases)."""
    if method == "sync_star":
        return data["regression"], dict(T=30, runs=2)
    if method == "async_star":
        return data["regression"], dict(T=30, runs=2, variant="proof", lam=1e-3,
                                        **{"async": {"per_owner_cap": 8}})
    if method == "admm":
        return data["multiclass"], dict(T=15, runs=2, record_every=5)
    if method == "dola":
        return data["online"], dict(T=40, runs=2, record_every=20, dola={"graph": "ring"})
    return data["p2p"], dict(T=16 * 20, runs=2, record_every=160, p2p={"T_agent": 6})


@pytest.fixture(scope="module")
def results(tmp_path_factory, data) -> dict[str, Path]:
    """Every method run in this process on one rank over eps = 1e8, 1e300 and inf (the default
    pld calibration), any RuntimeWarning (overflow, invalid value) an error."""
    d = tmp_path_factory.mktemp("huge_eps_runs")
    out = {}
    for method in METHODS:
        shard, keys = _keys(method, data)
        job = write_job(d / f"{method}.toml", shard, algorithm=method,
                        privacy={"delta": DELTA}, sweep={"eps": [*HUGE, math.inf]}, **keys)
        with warnings.catch_warnings():
            warnings.simplefilter("error", RuntimeWarning)
            out[method] = Path(run_job(job, comm=MPI.COMM_SELF, progress=False))
    return out


def _configs(path: Path) -> dict[float, object]:
    res = open_result(path)
    assert res.status == "complete"
    return {float(c.eps[0]): c for c in res.configs}


@pytest.mark.parametrize("method", METHODS)
def test_the_ledger_totals_are_exact_and_the_noise_tiny(results, method):
    """Each owner's totals by every accountant equal its target eps (to rounding), finite; the
    delta stays the target; the noise multiplier is the exact split 1 / eps per release (below
    1e-6 of the sensitivity)."""
    configs = _configs(results[method])
    assert sorted(configs) == [*HUGE, math.inf]
    for eps in HUGE:
        rows = configs[eps].ledger()
        assert rows is not None and rows.size
        assert np.all(rows["target_eps"] == eps) and np.all(rows["calibration"] == b"pld")
        for col in ("eps_basic", "eps_advanced", "eps_pld", "eps_rdp"):
            assert np.all(np.isfinite(rows[col])), (col, rows[col])
            np.testing.assert_allclose(rows[col], eps, rtol=REL, err_msg=col)
        for col in ("eps_basic_all", "eps_pld_all", "eps_rdp_all"):
            assert np.all(np.isfinite(rows[col])), (col, rows[col])
            np.testing.assert_allclose(rows[col], rows["releases"] * rows["eps_per_release"],
                                       rtol=REL, err_msg=col)
        assert np.all(rows["delta"] == DELTA) and np.all(rows["target_delta"] == DELTA)
        assert np.all(rows["delta_per_release"] == 0.0)  # Laplace: no delta spent
        nm = rows["noise_multiplier"]
        assert np.all((nm > 0) & (nm < 1e-6)), nm
        np.testing.assert_allclose(nm * rows["eps_per_release"], 1.0, rtol=REL)
        if method != "dola":  # dola's scope is a record: one release per record and pass
            np.testing.assert_allclose(rows["releases"] * rows["eps_per_release"], eps, rtol=REL)
        assert rows["certified"].all()


@pytest.mark.parametrize("method", METHODS)
def test_negligible_noise_gives_the_non_private_models(results, method):
    """eps = 1e300: the final models equal the eps = inf ones to 1e-12; eps = 1e8: to 1e-5."""
    configs = _configs(results[method])
    ref = configs[math.inf].group["models"]
    for eps, tol in ((1e300, 1e-12), (1e8, 1e-5)):
        models = configs[eps].group["models"]
        assert sorted(models) == sorted(ref)
        for name in ref:
            a, b = models[name][()], ref[name][()]
            assert np.all(np.isfinite(a)), name
            np.testing.assert_allclose(a, b, rtol=tol, atol=tol * max(1.0, np.abs(b).max()),
                                       err_msg=f"{method} eps={eps:g} models/{name}")


@pytest.mark.parametrize("method", METHODS)
def test_analyze_prints_the_exact_totals(results, method, capsys):
    assert cli_main(["analyze", str(results[method])]) == 0
    out = capsys.readouterr().out
    for eps in HUGE:
        assert f"achieved PLD {eps:g} (RDP {eps:g}, basic {eps:g}" in out, out
        lines = [ln for ln in out.splitlines() if f"{eps:g}" in ln]
        assert lines and not any("nan" in ln.lower() for ln in lines), lines


def test_compare_and_plot(results, tmp_path, capsys):
    """compare (both tasks) and every method's figures: an eps beyond style.EPS_AXIS_MAX stays
    in the table and is left off the log eps axes (matplotlib overflows near 1e300)."""
    reg = [str(results[m]) for m in ("sync_star", "async_star")]
    cls = [str(results[m]) for m in ("admm", "dola", "p2p")]
    assert cli_main(["compare", *reg, "--out", str(tmp_path / "reg.png")]) == 0
    out = capsys.readouterr().out
    assert "1e+300" in out and "1e+08" in out
    assert cli_main(["compare", *cls, "--metric", "test_error",
                     "--out", str(tmp_path / "cls.png")]) == 0
    assert (tmp_path / "reg.png").stat().st_size and (tmp_path / "cls.png").stat().st_size
    assert cli_main(["plot", str(results["admm"])]) == 0  # its error-vs-eps figure
    written = capsys.readouterr().out
    assert "_error_vs_eps.png" in written, written


@pytest.mark.parametrize("eps", HUGE)
@pytest.mark.parametrize("mechanism", ["laplace", "gaussian"])
def test_calibration_of_negligible_noise_is_exact(eps, mechanism):
    """pld and basic calibrate in closed form; the planned totals (every accountant) are eps."""
    k = 40
    plan = contract.Plan(mechanism, k, eps, DELTA)
    for rule in ("pld", "basic"):
        cal = contract.calibrate(plan, rule)
        assert 0 < cal.noise_multiplier < 1e-2
        tot = cal.planned
        assert tot is not None
        assert max(tot.eps_pld, tot.eps_rdp, tot.eps_advanced) <= eps * (1 + REL)
        if rule == "pld" or mechanism == "laplace":  # basic's Gaussian split is looser
            for v in (tot.eps_pld, tot.eps_rdp, tot.eps_advanced):
                assert v == pytest.approx(eps, rel=REL)
        # a release of a tiny sensitivity is noised no less than calibrated, never with 0
        assert cal.scale(1e-30) > 0
        assert cal.event(1e-30).eps <= cal.eps_release * (1 + 1e-9)
    if mechanism == "laplace":
        assert contract.calibrate(plan, "pld").noise_multiplier == pytest.approx(k / eps,
                                                                                 rel=REL)


@pytest.mark.parametrize("eps", HUGE)
def test_gaussian_and_kairouz_helpers_at_huge_eps(eps):
    """The analytic Gaussian and its inverse, advanced composition and Theorem 1 of seed 004:
    finite, no overflow, consistent."""
    z = events.gaussian_noise_multiplier(eps, DELTA)
    assert 0 < z < 1e-3 and events.gaussian_eps(z, DELTA) == pytest.approx(eps, rel=REL)
    assert gaussian_sigma(2.0, eps, DELTA, calibration="analytic") == pytest.approx(2 * z)
    pairs = [(LaplaceEvent(1.0, 10 / eps), 10), (GaussianEvent(1.0, z, DELTA), 1)]
    tot = accountants.compose(pairs, DELTA)
    assert tot.eps_pld == pytest.approx(2 * eps, rel=REL) and math.isfinite(tot.eps_advanced)
    assert kairouz.theorem1_eps([eps / 8] * 8, DELTA) == pytest.approx(eps, rel=REL)
    assert kairouz.equal_split(eps, 8, DELTA) == pytest.approx(eps / 8, rel=1e-9)
