"""Tests of mpi_dp.privacy: the spec's V1 (Laplace sampler) and V2 (noise scale, refusal of query
T+1), plus the Gaussian sampler and its calibrations and L1 clipping. The ledger and the
accountants: test_ledger.py, test_accountants.py."""

from __future__ import annotations

import math

import numpy as np
import pytest
import scipy.stats

from mpi_dp.errors import BudgetExceededError
from mpi_dp.pcg import generator_laplace, generator_normal
from mpi_dp.privacy import (
    LaplaceEvent,
    Ledger,
    clip_factors_l1,
    clip_l1,
    gaussian_noise,
    gaussian_sigma,
    l1_sensitivity_mean,
    lap_scale,
    laplace_noise,
)
from mpi_dp.rng import run_streams, stream

SEED = 20200617
B = 0.7


def _gen(agent: int = 0, run: int = 0) -> np.random.Generator:
    return stream(SEED, "test", agent, run)


# --- V1: Laplace sampler -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def lap_draws() -> np.ndarray:
    w = laplace_noise([_gen()], B, 10**6)
    assert w.shape == (1, 10**6)
    return w[0]


def test_v1_laplace_moments(lap_draws):
    w = lap_draws
    assert abs(w.mean()) < 5e-3
    assert abs(w.var() / (2 * B**2) - 1) < 0.01
    assert abs(np.abs(w).mean() / B - 1) < 0.01


def test_v1_laplace_ks(lap_draws):
    assert scipy.stats.kstest(lap_draws, scipy.stats.laplace(scale=B).cdf).pvalue > 1e-3
    # the test has power: the wrong scale is rejected
    assert scipy.stats.kstest(lap_draws, scipy.stats.laplace(scale=1.05 * B).cdf).pvalue < 1e-3


def test_v1_laplace_long_vector_iid(lap_draws):
    """Consecutive coordinates of one long draw are uncorrelated and each Laplace(B)."""
    x = lap_draws.reshape(10**5, 10)
    c = np.corrcoef(x, rowvar=False)
    assert np.max(np.abs(c - np.eye(10))) < 0.02
    for j in range(10):
        assert scipy.stats.kstest(x[:, j], scipy.stats.laplace(scale=B).cdf).pvalue > 1e-4


def test_v1_laplace_coordinates_iid_across_runs():
    """Each run's vector has i.i.d. coordinates, not one scalar added to every coordinate (the
    [ASYNC] code's bug, which is not DP)."""
    gens = run_streams(SEED, "test", 3, range(10_000))
    x = laplace_noise(gens, B, 10)
    assert x.shape == (10_000, 10)
    c = np.corrcoef(x, rowvar=False)
    assert np.max(np.abs(c - np.eye(10))) < 0.05
    # spread within a row is that of independent draws (zero for the one-scalar bug)
    assert abs(x.var(axis=1, ddof=1).mean() / (2 * B**2) - 1) < 0.05
    for j in range(10):
        assert scipy.stats.kstest(x[:, j], scipy.stats.laplace(scale=B).cdf).pvalue > 1e-4


def test_laplace_rows_reproducible_and_independent_of_other_rows():
    many = laplace_noise(run_streams(SEED, "test", 1, range(5)), B, 7)
    for r in range(5):
        one = laplace_noise([stream(SEED, "test", 1, r)], B, 7)
        np.testing.assert_array_equal(many[r], one[0])
    assert len({tuple(row) for row in many}) == 5  # different runs draw differently


def test_laplace_common_random_numbers_across_scales():
    a = laplace_noise([_gen(run=4)], 0.5, 100)
    b = laplace_noise([_gen(run=4)], 1.0, 100)
    np.testing.assert_array_equal(b, 2 * a)  # exactly: scaling by 2 is exact in binary
    z = generator_laplace(_gen(run=4), 100)
    np.testing.assert_array_equal(laplace_noise([_gen(run=4)], 0.3, 100)[0], z * 0.3)
    # numpy's own Laplace of the same stream, up to its rounding of 2.0 - u (see mpi_dp.pcg)
    np.testing.assert_allclose(z, _gen(run=4).laplace(0.0, 1.0, 100), rtol=1e-12)


def test_laplace_per_row_scales():
    scales = np.array([0.5, 1.0, 2.0])
    x = laplace_noise(run_streams(SEED, "test", 0, range(3)), scales, 20)
    for r in range(3):
        np.testing.assert_array_equal(x[r], laplace_noise([_gen(run=r)], scales[r], 20)[0])


def test_laplace_zero_scale_gives_zeros_and_draws_nothing():
    g = _gen(run=9)
    x = laplace_noise([g], lap_scale(1.0, 10, 100, math.inf), 50)
    assert x.shape == (1, 50) and not np.any(x)
    # the generator was not advanced
    np.testing.assert_array_equal(g.standard_normal(3), _gen(run=9).standard_normal(3))


@pytest.mark.parametrize("bad", [-1.0, math.nan, math.inf, np.array([1.0, 2.0])])
def test_laplace_rejects_bad_scale(bad):
    with pytest.raises(ValueError):
        laplace_noise([_gen()], bad, 3)


# --- V2: noise scale -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "xi,T,n_i,eps",
    [(1.0, 100, 200, 1.0), (0.37, 2000, 333, 0.3), (2.5, 7, 1, 7.0), (1e-3, 1, 9, 3.0)],
)
def test_v2_lap_scale_exact(xi, T, n_i, eps):
    assert lap_scale(xi, T, n_i, eps) == 2 * xi * T / (n_i * eps)


def test_v2_lap_scale_value():
    assert lap_scale(1.0, 100, 200, 1.0) == 1.0
    assert lap_scale(0.5, 10, 4, 2.0) == 1.25


def test_v2_lap_scale_inf_eps():
    assert lap_scale(1.0, 100, 200, math.inf) == 0.0


@pytest.mark.parametrize(
    "args",
    [
        (1.0, 10, 10, 0.0),
        (1.0, 10, 10, -1.0),
        (1.0, 10, 0, 1.0),
        (1.0, 0, 10, 1.0),
        (-1.0, 10, 10, 1.0),
        (math.nan, 10, 10, 1.0),
        (1.0, 10, 10, math.nan),
    ],
)
def test_v2_lap_scale_rejects_bad_input(args):
    with pytest.raises(ValueError):
        lap_scale(*args)


def test_l1_sensitivity_mean():
    assert l1_sensitivity_mean(1.5, 6) == 0.5
    # lap_scale is the per-query sensitivity over the per-query budget eps/T
    assert math.isclose(lap_scale(1.5, 10, 6, 2.0), l1_sensitivity_mean(1.5, 6) / (2.0 / 10))


def test_v2_owner_refuses_query_t_plus_1():
    T, eps, xi, n = 100, 1.0, 1.5, 60
    led = Ledger(2, eps)
    event = LaplaceEvent(l1_sensitivity_mean(xi, n), lap_scale(xi, T, n, eps))
    for _ in range(T):
        led.charge(event)
    assert led.releases[0] == T
    with pytest.raises(BudgetExceededError, match=r"owner 2 refuses release 101"):
        led.charge(event)
    assert led.releases[0] == T  # the refused release was not recorded


# --- Gaussian ------------------------------------------------------------------------------------


def test_gaussian_noise_std_and_ks():
    sigma = 1.3
    n = 2 * 10**5
    w = gaussian_noise([_gen(run=2)], sigma, n)[0]
    assert abs(w.std() / sigma - 1) < 0.01
    assert abs(w.mean()) < 5 * sigma / math.sqrt(n)
    assert scipy.stats.kstest(w, scipy.stats.norm(scale=sigma).cdf).pvalue > 1e-3
    assert scipy.stats.kstest(w, scipy.stats.norm(scale=1.05 * sigma).cdf).pvalue < 1e-3
    z = generator_normal(_gen(run=2), 10)
    np.testing.assert_array_equal(gaussian_noise([_gen(run=2)], sigma, 10)[0], z * sigma)
    assert not np.any(gaussian_noise([_gen()], 0.0, 5))


def test_gaussian_sigma():
    assert gaussian_sigma(2.0, 0.5, 1e-5) == math.sqrt(2 * math.log(1.25 / 1e-5)) * 2.0 / 0.5
    with pytest.raises(ValueError, match="calibration"):
        gaussian_sigma(1.0, 0.5, 1e-5, calibration="exact")
    assert gaussian_sigma(1.0, math.inf, 1e-5) == 0.0
    with pytest.raises(ValueError, match="eps < 1"):
        gaussian_sigma(1.0, 1.0, 1e-5)
    big = gaussian_sigma(1.0, 4.0, 1e-5, allow_large_eps=True)
    assert big == math.sqrt(2 * math.log(1.25 / 1e-5)) / 4.0
    for bad in [(1.0, 0.5, 0.0), (1.0, 0.5, 1.0), (1.0, 0.0, 1e-5), (-1.0, 0.5, 1e-5)]:
        with pytest.raises(ValueError):
            gaussian_sigma(*bad)


# --- clipping ------------------------------------------------------------------------------------


def test_clip_l1_bounds_norm_and_keeps_direction():
    rng = _gen(run=5)
    v = rng.standard_normal((1000, 8)) * rng.exponential(3.0, (1000, 1))
    xi = 2.0
    c = clip_l1(v, xi)
    norms = np.abs(v).sum(axis=1)
    cn = np.abs(c).sum(axis=1)
    big = norms > xi
    assert big.sum() > 100 and (~big).sum() > 100  # both cases exercised
    assert np.all(cn <= xi * (1 + 1e-12))
    np.testing.assert_allclose(cn[big], xi, rtol=1e-12)
    np.testing.assert_array_equal(c[~big], v[~big])  # bit for bit
    # direction preserved: positive multiple of the original
    ratio = c[big] / v[big]
    np.testing.assert_allclose(ratio, ratio[:, :1] * np.ones((1, 8)), rtol=1e-12)
    assert np.all(ratio > 0)


def test_clip_l1_vector_and_edge_cases():
    v = np.array([3.0, -4.0, 1.0])
    np.testing.assert_allclose(clip_l1(v, 4.0), v * 0.5, rtol=1e-15)
    np.testing.assert_array_equal(clip_l1(v, 8.0), v)
    np.testing.assert_array_equal(clip_l1(v, math.inf), v)
    np.testing.assert_array_equal(clip_l1(np.zeros(3), 1.0), np.zeros(3))


def test_clip_factors_l1():
    f = clip_factors_l1(np.array([0.0, 0.5, 1.0, 4.0]), 1.0)
    np.testing.assert_array_equal(f, [1.0, 1.0, 1.0, 0.25])
    np.testing.assert_array_equal(clip_factors_l1(np.array([0.0, 1e300]), math.inf), [1.0, 1.0])
    with pytest.raises(ValueError):
        clip_factors_l1(np.array([1.0]), -1.0)


# --- analytic Gaussian calibration ---------------------------------------------------------------


def _gauss_delta(sigma: float, eps: float) -> float:
    """Balle & Wang (2018) Thm 8, sensitivity 1: delta(eps) = Phi(1/(2s) - eps s)
    - e^eps Phi(-1/(2s) - eps s), written out here independently of dp-accounting."""
    n = scipy.stats.norm
    return n.cdf(0.5 / sigma - eps * sigma) - math.exp(eps) * n.cdf(-0.5 / sigma - eps * sigma)


@pytest.mark.parametrize("eps, delta", [(0.3, 1e-6), (1.0, 1e-6), (4.0, 1e-5), (10.0, 1e-5)])
def test_analytic_gaussian_is_exact_and_tighter(eps, delta):
    sigma = gaussian_sigma(1.0, eps, delta, calibration="analytic")
    assert _gauss_delta(sigma, eps) == pytest.approx(delta, rel=1e-6)  # exactly (eps, delta)
    assert _gauss_delta(0.99 * sigma, eps) > delta  # and no smaller sigma would do
    assert gaussian_sigma(3.0, eps, delta, calibration="analytic") == pytest.approx(3 * sigma)
    if eps < 1:  # where the classical bound holds, the analytic one needs less noise
        assert sigma < gaussian_sigma(1.0, eps, delta, calibration="classical")


def test_auto_calibration_switches_at_one():
    assert gaussian_sigma(1.0, 0.5, 1e-6, calibration="auto") == gaussian_sigma(1.0, 0.5, 1e-6)
    assert gaussian_sigma(1.0, 1.0, 1e-6, calibration="auto") == gaussian_sigma(
        1.0, 1.0, 1e-6, calibration="analytic")
    assert gaussian_sigma(1.0, math.inf, 1e-6, calibration="analytic") == 0.0
