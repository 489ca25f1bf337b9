"""Vectorised run streams (mpi_dp.pcg) against numpy's own PCG64 and SeedSequence."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.stats

from mpi_dp import pcg, rng
from mpi_dp.privacy.mechanisms import laplace_noise

RUNS = np.array([0, 1, 2, 7, 1000, 2**31 + 3, 2**32 - 1])


def _numpy_raw(seed: int, purpose: str, agent: int, run: int, n: int) -> np.ndarray:
    return np.random.PCG64(rng.seed_sequence(seed, purpose, agent, run)).random_raw(n)


@pytest.mark.parametrize("seed", [0, 7, 2**32 - 1, 2**40 + 5, 2**130 + 17])
@pytest.mark.parametrize("agent", [0, 3, rng.LEARNER])
def test_rows_are_numpys_pcg64_streams_bit_for_bit(seed, agent):
    rs = rng.run_streams(seed, "noise", agent, RUNS)
    # blocks of both shapes: column steps (many rows / few positions) and per-row numpy draws
    got = np.concatenate([rs.uint64(3), rs.uint64(40), rs.uint64(1)], axis=1)
    for i, r in enumerate(RUNS):
        np.testing.assert_array_equal(got[i], _numpy_raw(seed, "noise", agent, int(r), 44))


@pytest.mark.parametrize("seed", [0, 2**40 + 5])
def test_a_block_of_agents_draws_each_agent_s_own_streams(seed):
    """Seeded in one pass over (agent, run), agent-major: every row is that agent's stream bit
    for bit, the same as the agent's own run streams, whichever agents share the block."""
    agents = np.array([0, 3, 2**31 + 1, rng.LEARNER, 3])
    runs = np.array([0, 5, 2**32 - 1])
    block = rng.agent_run_streams(seed, "noise", agents, runs)
    got = np.concatenate([block.uint64(3), block.uint64(40)], axis=1)
    lap = block.laplace(7)
    for a, agent in enumerate(agents):
        own = rng.run_streams(seed, "noise", int(agent), runs)
        np.testing.assert_array_equal(got[a * 3:(a + 1) * 3],
                                      np.concatenate([own.uint64(3), own.uint64(40)], axis=1))
        np.testing.assert_array_equal(lap[a * 3:(a + 1) * 3], own.laplace(7))
        for r, run in enumerate(runs):
            np.testing.assert_array_equal(got[a * 3 + r],
                                          _numpy_raw(seed, "noise", int(agent), int(run), 43))
    with pytest.raises(ValueError, match="non-negative"):
        rng.agent_run_streams(seed, "noise", [-1], runs)
    with pytest.raises(ValueError, match="2\\*\\*32"):
        rng.agent_run_streams(seed, "noise", [2**32], runs)


def test_subset_rows_advance_only_themselves():
    rs = rng.run_streams(5, "noise", 1, range(4))
    a = rs.subset([1, 3]).random(6)  # rows 1 and 3 move on by 6
    b = rs.random(2)
    for r in range(4):
        ref = np.random.Generator(np.random.PCG64(rng.seed_sequence(5, "noise", 1, r))).random(8)
        if r in (1, 3):
            np.testing.assert_array_equal(a[[1, 3].index(r)], ref[:6])
            np.testing.assert_array_equal(b[r], ref[6:8])
        else:
            np.testing.assert_array_equal(b[r], ref[:2])


def test_laplace_matches_numpy_and_the_list_path_bitwise():
    rs = rng.run_streams(11, "noise", 2, range(50))
    x = rs.laplace(30)
    for r in range(50):
        g = rng.stream(11, "noise", 2, r)
        # numpy rounds 2.0 - u before subtracting u again; 2 - 2u is exact (Sterbenz)
        np.testing.assert_allclose(x[r], g.laplace(0.0, 1.0, 30), rtol=1e-12)
        np.testing.assert_array_equal(x[r], pcg.generator_laplace(rng.stream(11, "noise", 2, r), 30))
    # the mechanism gives the same noise from either kind of stream
    np.testing.assert_array_equal(laplace_noise(rng.run_streams(11, "noise", 2, range(3)), 0.7, 9),
                                  laplace_noise([rng.stream(11, "noise", 2, r) for r in range(3)],
                                                0.7, 9))


def test_zero_uniform_is_redrawn_as_numpy_does():
    """A U = 0 draw (probability 2^-53) is skipped and the row's later draws shift by one."""
    rs = rng.run_streams(3, "noise", 0, range(2))
    ref = rs.random(12)  # the rows' first 12 doubles
    rs._rewind(0, 12)
    rs._rewind(1, 12)
    np.testing.assert_array_equal(rs.random(12), ref)  # rewinding is exact
    rs._rewind(1, 12)
    rs._rewind(0, 12)
    real_random = pcg.RunStreams.random

    def with_zero(self, size, rows=None):  # row 1's 5th double replaced by 0
        u = real_random(self, size, rows)
        if size == 10:
            u[1, 4] = 0.0
        return u

    pcg.RunStreams.random = with_zero
    try:
        x = rs.laplace(10)
    finally:
        pcg.RunStreams.random = real_random
    np.testing.assert_array_equal(x[0], pcg.laplace_from_uniform(ref[0, :10]))
    # row 1: the redraw reads the true stream again (no zero there), so it is the plain stream
    np.testing.assert_array_equal(x[1], pcg.laplace_from_uniform(ref[1, :10]))
    np.testing.assert_array_equal(rs.random(2), ref[:, 10:12])


def test_standard_normal_distribution_and_independence_of_rows():
    rs = rng.run_streams(1, "test", 0, range(4))
    z = rs.standard_normal(50_000)
    for r in range(4):
        assert scipy.stats.kstest(z[r], "norm").pvalue > 1e-3
        assert abs(z[r].std() - 1) < 0.01
    assert abs(np.corrcoef(z)[0, 1:]).max() < 0.02
    w = rng.run_streams(1, "test", 0, range(4)).laplace(50_000)
    for r in range(4):
        assert scipy.stats.kstest(w[r], "laplace").pvalue > 1e-3


def test_identical_models_share_one_gradient_pass():
    """clipped_grad_sum with every run at one model (a first step) equals the per-run sums."""
    from mpi_dp.models import linear

    g = rng.stream(4, "test")
    X, y = g.standard_normal((300, 6)), g.standard_normal(300)
    theta = np.tile(g.standard_normal(6), (5, 1))
    for loss, xi in (("squared", 1.0), ("logistic", 0.3), ("squared", np.inf)):
        got, clipped = linear.clipped_grad_sum(loss, X, y, theta, xi)
        one, c1 = linear.clipped_grad_sum(loss, X, y, theta[:1], xi)
        np.testing.assert_allclose(got, np.repeat(one, 5, axis=0), rtol=1e-12)
        np.testing.assert_array_equal(clipped, np.repeat(c1, 5))
        theta2 = theta.copy()
        theta2[3, 0] += 0.5  # one run elsewhere: no sharing, row 3 differs
        got2, _ = linear.clipped_grad_sum(loss, X, y, theta2, xi)
        ref3, _ = linear.clipped_grad_sum(loss, X, y, theta2[3:4], xi)
        np.testing.assert_allclose(got2[3], ref3[0], rtol=1e-12)
        assert not np.allclose(got2[3], got2[0])
