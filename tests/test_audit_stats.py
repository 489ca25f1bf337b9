"""Audit statistics (mpi_dp.privacy.audit_stats): Clopper-Pearson bounds by their definition,
eps_lower of an exact Laplace pair against the closed form, and the statistics' power."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from mpi_dp.privacy import audit_stats as A


@pytest.mark.parametrize("k,n", [(0, 10), (3, 10), (50, 1000), (999, 1000), (1000, 1000)])
def test_clopper_pearson_bounds_satisfy_their_definition(k, n):
    alpha = 0.05
    hi, lo = float(A.cp_upper(k, n, alpha)), float(A.cp_lower(k, n, alpha))
    # upper u: P(Bin(n, u) <= k) = alpha; lower l: P(Bin(n, l) >= k) = alpha
    if k < n:
        assert stats.binom.cdf(k, n, hi) == pytest.approx(alpha, rel=1e-6)
    else:
        assert hi == 1.0
    if k > 0:
        assert stats.binom.sf(k - 1, n, lo) == pytest.approx(alpha, rel=1e-6)
    else:
        assert lo == 0.0
    if k == 0:
        assert hi == pytest.approx(1 - alpha ** (1 / n), rel=1e-9)  # closed form
    assert lo <= k / n <= hi


def _laplace_pair(R, eps, b=1.0, seed=0):
    g = np.random.default_rng(seed)
    return g.laplace(0.0, b, R), g.laplace(eps * b, b, R)


def test_eps_lower_of_an_exact_laplace_pair_matches_the_closed_form():
    eps, b, delta, alpha = 1.0, 1.0, 0.0, 0.05
    x0, x1 = _laplace_pair(200_000, eps, b)
    t, d = A.choose_threshold(x0[:100_000], x1[:100_000], delta, alpha)
    v = A.evaluate(x0[100_000:], x1[100_000:], t, d, delta, alpha)
    # closed form of the chosen test: FPR = P0(X >= t), FNR = P1(X < t)
    fpr = stats.laplace.sf(t, 0.0, b) if d > 0 else stats.laplace.cdf(t, 0.0, b)
    fnr = stats.laplace.cdf(t, eps * b, b) if d > 0 else stats.laplace.sf(t, eps * b, b)
    cf = math.log((1 - fnr) / fpr)
    assert v.eps_lower <= cf <= eps + 1e-12  # the bound holds, the test is a valid test
    assert v.fpr <= v.fpr_upper and v.fnr <= v.fnr_upper
    assert abs(v.eps_point - cf) < 0.05  # the point estimate sits on the closed form
    assert v.eps_lower >= 0.9 * eps  # and the audit is tight


def test_roc_counts_and_both_directions():
    r = A.roc(np.array([0.0, 1.0, 2.0]), np.array([1.0, 3.0]))
    assert r.thresholds.tolist() == [0.0, 1.0, 2.0, 3.0, math.inf]
    assert r.fp.tolist() == [3, 2, 1, 0, 0] and r.tp.tolist() == [2, 2, 1, 1, 0]
    # a perfectly separated pair, flipped: the "s < t" direction finds it
    e = A.roc(np.full(1000, 5.0), np.full(1000, -5.0)).eps(0.0, 0.05)
    assert e.max() == pytest.approx(math.log((1 - (1 - 0.025 ** (1 / 1000))) /
                                             (1 - 0.025 ** (1 / 1000))), rel=1e-9)


def test_llr_of_the_claimed_noise_is_the_privacy_loss():
    """Laplace in d = 5 with the worlds' difference on one coordinate: the LLR statistic is the
    exact privacy loss, at most eps, attained beyond both means."""
    g = np.random.default_rng(1)
    b, eps = 0.5, 1.0
    mu0, mu1 = np.zeros(5), np.r_[eps * b, np.zeros(4)]
    x = mu0 + g.laplace(0, b, (10_000, 5))
    s = A.llr(x, mu0, mu1, "laplace", b)
    assert s.max() == pytest.approx(eps) and s.min() == pytest.approx(-eps)
    assert np.mean(np.isclose(s, eps)) == pytest.approx(0.5 * math.exp(-eps), abs=0.02)
    sg = A.llr(mu0 + np.zeros((1, 5)), mu0, mu1, "gaussian", 1.0)
    assert sg[0] == pytest.approx(-(eps * b) ** 2 / 2)


def test_lda_catches_one_noise_draw_shared_by_all_coordinates():
    """The [ASYNC] authors' scalar Laplace: the discriminant finds a direction without noise, in
    which the worlds never overlap."""
    g = np.random.default_rng(2)
    R, d, b = 20_000, 4, 1.0
    mu1 = np.r_[1.0, 0, 0, 0]
    x0 = g.laplace(0, b, (R, 1)) * np.ones(d)
    x1 = mu1 + g.laplace(0, b, (R, 1)) * np.ones(d)
    h = R // 2
    w = A.lda_direction(x0[:h], x1[:h])
    s0, s1 = x0[h:] @ w, x1[h:] @ w
    t, di = A.choose_threshold(x0[:h] @ w, x1[:h] @ w, 0.0, 0.05)
    v = A.evaluate(s0, s1, t, di, 0.0, 0.05)
    assert v.fpr == 0 and v.fnr == 0 and v.eps_lower > 5.0


@pytest.mark.parametrize("shift,n0,n1", [(0.0, 3000, 3000), (0.3, 5000, 4000), (2.0, 4000, 4000),
                                         (6.0, 2000, 2500)])
def test_branch_and_bound_finds_the_full_argmax(shift, n0, n1):
    """Roc.best_by_direction equals max / first argmax of eps_by_direction (all thresholds)."""
    g = np.random.default_rng(int(10 * shift) + n0)
    s0 = np.round(g.laplace(0.0, 1.0, n0), 2)  # rounding makes ties among thresholds
    s1 = np.round(g.laplace(shift, 1.0, n1), 2)
    r = A.roc(s0, s1)
    for delta in (0.0, 1e-5):
        full = r.eps_by_direction(delta, 0.05)
        for (e, i), arr in zip(r.best_by_direction(delta, 0.05), full, strict=True):
            assert e == arr.max() and i == int(np.argmax(arr))
