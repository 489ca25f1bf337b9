"""The owner's ledger (privacy.ledger) and mechanism events (privacy.events, privacy.mechanisms)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import scipy.stats

from mpi_dp.errors import BudgetExceededError
from mpi_dp.pcg import generator_laplace
from mpi_dp.privacy import (
    GaussianEvent,
    LaplaceEvent,
    Ledger,
    gaussian_mechanism,
    lap_scale,
    laplace_mechanism,
    laplace_perturbation,
)
from mpi_dp.rng import stream


def lap(eps: float, sens: float = 0.4) -> LaplaceEvent:
    """A Laplace event of per-release eps (sensitivity 0.4, scale 0.4 / eps)."""
    return LaplaceEvent(sens, sens / eps)


# --- events --------------------------------------------------------------------------------------


def test_laplace_event_eps_and_edge_cases():
    xi, T, n, eps = 1.5, 20, 300, 2.0
    ev = LaplaceEvent(2 * xi / n, lap_scale(xi, T, n, eps))
    assert ev.eps == pytest.approx(eps / T, rel=1e-15) and ev.delta == 0.0
    assert LaplaceEvent(0.1, 0.0).eps == math.inf  # no noise: not private
    assert LaplaceEvent(0.0, 0.0).eps == 0.0  # nothing about the data released
    assert ev.key() == LaplaceEvent(4 * xi / n, 2 * lap_scale(xi, T, n, eps)).key()
    assert ev.key() != LaplaceEvent(2 * xi / n, lap_scale(xi, T, n, eps),
                                    data_dependent=True).key()
    with pytest.raises(ValueError):
        LaplaceEvent(-1.0, 1.0)
    with pytest.raises(AttributeError):
        ev.scale = 3.0  # type: ignore[misc]  (frozen)


def _gauss_delta(z: float, eps: float) -> float:
    """Balle & Wang (2018), Thm 8 with sensitivity 1 and sigma = z, written out independently."""
    n = scipy.stats.norm
    return n.cdf(0.5 / z - eps * z) - math.exp(eps) * n.cdf(-0.5 / z - eps * z)


@pytest.mark.parametrize("z, delta", [(0.8, 1e-5), (3.0, 1e-6), (40.0, 1e-6)])
def test_gaussian_event_eps_is_the_exact_one(z, delta):
    ev = GaussianEvent(0.5, 0.5 * z, delta)
    assert ev.noise_multiplier == pytest.approx(z)
    assert _gauss_delta(z, ev.eps) == pytest.approx(delta, rel=1e-6)
    assert GaussianEvent(0.5, 0.0, delta).eps == math.inf
    with pytest.raises(ValueError):
        GaussianEvent(1.0, 1.0, 0.0)


# --- ledger --------------------------------------------------------------------------------------


@pytest.mark.parametrize("eps", [1.0, 0.3, 3.0, 7.0, 0.1, 2.2])
@pytest.mark.parametrize("T", [1, 3, 100, 1000])
def test_t_releases_fit_exactly_and_release_t_plus_1_is_refused(eps, T):
    led = Ledger(5, eps, runs=2)
    ev = LaplaceEvent(2.0 / 700, lap_scale(1.0, T, 700, eps))  # the star methods' calibration
    for _ in range(T):
        assert led.can_charge(ev)
        led.charge(ev)
    assert led.releases.tolist() == [T, T]
    np.testing.assert_allclose(led.spent_eps, eps, rtol=1e-12)
    assert np.all(led.remaining_eps <= eps * 1e-12)
    assert not led.can_charge(ev)
    with pytest.raises(BudgetExceededError) as exc:
        led.charge(ev, note="query")
    msg = str(exc.value)
    assert f"owner 5 refuses release {T + 1} (query) in run position 0" in msg
    assert f"budget eps={eps:g}" in msg
    assert led.releases.tolist() == [T, T]  # nothing recorded


def test_refusal_message_names_the_spend():
    led = Ledger(2, 1.0)
    for _ in range(100):
        led.charge(lap(0.01))
    with pytest.raises(BudgetExceededError) as exc:
        led.charge(lap(0.01))
    msg = str(exc.value)
    assert "owner 2 refuses release 101" in msg and "run position" not in msg
    assert "1.01" in msg and "budget eps=1" in msg and "100 releases of eps=0.01" in msg


def test_budget_tolerance_is_tight():
    led = Ledger(0, 1.0)
    assert led.can_charge(lap(1.0 + 1e-10))
    assert not led.can_charge(lap(1.0 + 1e-8))
    led.charge(lap(0.5))
    assert not led.can_charge(lap(0.5 + 1e-6))
    with pytest.raises(BudgetExceededError):
        led.charge(lap(0.6))
    assert led.spent_eps[0] == 0.5 and led.remaining_eps[0] == 0.5


def test_runs_are_separate_executions():
    """Each run has its own budget: run 1 can still release when run 0 cannot."""
    led = Ledger(3, 1.0, runs=3)
    led.charge(lap(0.6), runs=np.array([0, 2]))
    led.charge(lap(0.3), runs=np.array([0]))
    np.testing.assert_allclose(led.spent_eps, [0.9, 0.0, 0.6])
    assert led.fits(lap(0.3)).tolist() == [False, True, True]
    with pytest.raises(BudgetExceededError, match="run position 0"):
        led.charge(lap(0.3))  # all runs: refused as a whole, nothing recorded
    assert led.releases.tolist() == [2, 0, 1]
    led.charge(lap(0.3), runs=np.array([1, 2]))
    assert [(ev.eps, c.tolist()) for ev, c in led.event_counts()] == [
        (pytest.approx(0.6), [1, 0, 1]), (pytest.approx(0.3), [1, 1, 1])]
    assert [(round(ev.eps, 12), c) for ev, c in led.worst_counts()] == [(0.6, 1), (0.3, 1)]
    with pytest.raises(ValueError):
        led.charge(lap(0.1), runs=np.array([3]))


def test_delta_budget_and_infinite_budget():
    g = GaussianEvent(1.0, 4.0, 1e-6)
    led = Ledger(1, math.inf, budget_delta=2.5e-6)
    led.charge(g)
    led.charge(g)
    with pytest.raises(BudgetExceededError, match="delta"):
        led.charge(g)
    assert not Ledger(1, 10.0).can_charge(g)  # no delta budget by default
    free = Ledger(4, math.inf)
    for _ in range(10):
        free.charge(lap(1e6))
    assert free.spent_eps[0] == 1e7 and free.remaining_eps[0] == math.inf
    free.charge(LaplaceEvent(1.0, 0.0))  # an un-noised release: inf, allowed by an inf budget
    assert free.spent_eps[0] == math.inf and free.releases[0] == 11
    assert not Ledger(3, 1.0).can_charge(LaplaceEvent(1.0, 0.0))


@pytest.mark.parametrize("bad", [-0.1, math.nan])
def test_bad_budgets_are_rejected(bad):
    with pytest.raises(ValueError):
        Ledger(0, bad)
    with pytest.raises(ValueError):
        Ledger(0, 1.0, budget_delta=bad)


def test_reported_spend_does_not_drift():
    """The reported spend comes from the counts of each event, not from a running sum: 10^4
    releases of 0.1 add up to 1000 to the last ulps where naive accumulation drifts."""
    led = Ledger(0, math.inf, runs=4)
    ev = LaplaceEvent(1.0, 10.0)
    naive = 0.0
    for _ in range(10_000):
        led.charge(ev)
        naive += 0.1
    assert abs(naive - 1000.0) > 1e-10  # the naive sum really drifts...
    np.testing.assert_allclose(led.spent_eps, 1000.0, rtol=1e-15)  # ...the ledger does not
    led.charge(LaplaceEvent(1.0, 20.0), runs=np.array([1]))
    np.testing.assert_allclose(led.spent_eps, [1000.0, 1000.05, 1000.0, 1000.0], rtol=1e-15)


# --- mechanisms return events and charge first ---------------------------------------------------


def test_laplace_mechanism_charges_before_drawing():
    gens = [stream(1, "test", 0, r) for r in range(2)]
    ref = [stream(1, "test", 0, r) for r in range(2)]
    led = Ledger(0, 1.0, runs=2)
    value = np.ones((2, 3))
    out, ev = laplace_mechanism(value, gens, 0.5, 0.25, led)
    assert ev == LaplaceEvent(0.25, 0.5) and ev.eps == 0.5
    np.testing.assert_array_equal(out, value + np.array([generator_laplace(g, 3) for g in ref]) * 0.5)
    laplace_mechanism(value, gens, 0.5, 0.25, led)
    state = [g.bit_generator.state for g in gens]
    with pytest.raises(BudgetExceededError):
        laplace_mechanism(value, gens, 0.5, 0.25, led)
    assert [g.bit_generator.state for g in gens] == state  # a refusal draws nothing


def test_per_run_calibration_reports_the_least_private_run():
    gens = [stream(2, "test", 0, r) for r in range(3)]
    sens = np.array([0.1, 0.4, 0.2])
    scale = np.array([0.1, 0.2, 0.4])  # eps 1, 2, 0.5
    noise, ev = laplace_perturbation(gens, scale, 4, sens, data_dependent=True)
    assert noise.shape == (3, 4) and ev.eps == 2.0 and ev.data_dependent
    _, scalar = laplace_perturbation(gens, 0.3, 4, 0.3, scalar=True)
    assert not scalar.certified  # one draw on every coordinate is not the Laplace mechanism


def test_gaussian_mechanism_event():
    gens = [stream(3, "test", 0, 0)]
    out, ev = gaussian_mechanism(np.zeros((1, 5)), gens, 2.0, 0.5, 1e-6)
    assert ev.noise_multiplier == 4.0 and ev.delta == 1e-6 and out.shape == (1, 5)
