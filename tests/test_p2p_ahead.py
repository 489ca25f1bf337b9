"""p2p fast at scale, the same numbers (issue 44): the gradient kernel with reused scratch arrays
(p2p.grad_scratch) equals `objective.local_grad` bit for bit, and a replay that computes its
agents' next gradients while it waits at a round's barrier (`replay(..., ibarrier=...)`) ends in
exactly the states, ledgers, mailboxes and audit reports of the plain replay.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from helpers import p2p_contract
from test_p2p_block import _assert_same_blocks, _uneven_problem

from mpi_dp.p2p import coordinate_descent, objective
from mpi_dp.p2p.grad_scratch import GradScratch
from mpi_dp.privacy import tap


def test_the_scratch_kernel_is_local_grad_bit_for_bit():
    """One scratch over random odd shapes (1 to 3,000 records, growing and shrinking), both
    losses, with and without clipping, margins from tiny to huge, C- and Fortran-ordered X."""
    g = np.random.default_rng(11)
    S = GradScratch()
    for trial in range(150):
        m, R, p = (int(g.choice([1, 2, 5, 64, 299, 3001])), int(g.integers(1, 6)),
                   int(g.integers(1, 40)))
        loss = ("logistic", "quadratic")[trial % 2]
        X = g.normal(size=(m, p)) / math.sqrt(p)
        if trial % 7 == 0:
            X = np.asfortranarray(X)
        y = (np.where(g.random(m) < 0.5, 1.0, -1.0) if loss == "logistic"
             else 5 * g.normal(size=m))
        th = g.normal(size=(R, p)) * 10.0 ** g.integers(-4, 4)
        th[0, 0] = -0.0
        xn = np.abs(X).sum(axis=1)
        clip = (math.inf, 1.0, 0.05, 1e-12)[trial % 4]
        lam = float(g.random())
        g0, f0 = objective.local_grad(loss, X, y, lam, th, clip, xn)
        g1, f1 = S.local_grad(loss, X, y, lam, th, clip, xn)
        assert g1.shape == g0.shape and f1.shape == f0.shape
        assert g0.tobytes() == g1.tobytes() and f0.tobytes() == f1.tobytes(), trial
        if math.isfinite(clip) and clip < 0.1:
            assert f1.max() > 0  # some example was clipped
    with pytest.raises(ValueError, match="loss"):
        S.local_grad("hinge", X, y, 0.1, th)


class _Pending:
    """An Ibarrier-like request that completes after `tests` calls of Test (Wait: at once)."""

    def __init__(self, tests: int, log: list[int]) -> None:
        self.left = tests
        self.log = log

    def Test(self) -> bool:
        self.left -= 1
        return self.left < 0

    def Wait(self) -> None:
        self.log.append(1)
        self.left = -1


def _replay(P: objective.Problem, s: coordinate_descent.Settings, theta0: np.ndarray,
            hosted: np.ndarray, ahead: bool, seed: int) -> tuple:
    """`replay` of the agents `hosted` (the others' mailboxes stay as posted at the start: only
    the hosted states matter to the comparison), with the plain barrier or the nonblocking one
    that lets 0 to 3 gradients be computed ahead at each round's end."""
    sched = coordinate_descent.global_schedule(s.seed, P.n, s.T)
    keep = coordinate_descent.effective_ticks(sched, P.n, s.T_agent)
    rounds = coordinate_descent.cut_rounds(sched, keep, P.graph, s.record_every)
    con = p2p_contract(s, P.n)
    block = coordinate_descent.Block(P, hosted, s, con,
                                     coordinate_descent.agent_budgets(s, P, sched, con),
                                     {int(i): theta0[:, i, :] for i in hosted})
    net = coordinate_descent.LocalNet(P.n, s.R * P.p, P.graph)
    for i in range(P.n):
        net.post(i, 0.0, theta0[:, i, :])
    g = np.random.default_rng(seed)
    waits: list[int] = []
    made = [0]
    prepare = block.prepare

    def counted(i: int) -> None:
        made[0] += 1
        prepare(i)

    block.prepare = counted  # type: ignore[method-assign]
    with tap.tapping(tap.Tap(int(hosted[0]), s.R, 1000)) as t:
        coordinate_descent.replay(
            block, net, rounds, lambda: None,
            ibarrier=(lambda: _Pending(int(g.integers(0, 4)), waits)) if ahead else None)
    return (block, net, t), made[0], len(waits)


@pytest.mark.parametrize("loss", ["logistic", "quadratic"])
@pytest.mark.parametrize("eps", [math.inf, 0.7])
def test_gradients_computed_ahead_change_nothing(loss, eps):
    """States, versions, clipped shares, ledgers, mailboxes and the audit's reports of a replay
    that computes gradients ahead (some, all or none of a round's agents; capped agents whose
    last wake-up needs none) equal the plain replay's, bit for bit, on half of the agents."""
    P = _uneven_problem(loss, seed=2)
    n = P.n
    cap = tuple(int(k) for k in np.random.default_rng(1).integers(3, 14, size=n))
    s = coordinate_descent.Settings(T=n * 12, T_agent=cap, eps=eps, delta=1e-3, runs=(0, 3),
                                    seed=5, clip=0.3, allocation="equal")
    theta0 = np.random.default_rng(6).normal(size=(s.R, n, P.p))
    hosted = np.arange(n // 3, n // 3 + n // 2)
    plain, made0, _ = _replay(P, s, theta0, hosted, False, 0)
    ahead, made, waits = _replay(P, s, theta0, hosted, True, 0)
    _assert_same_blocks(plain, ahead)
    assert made0 == 0 and made > 10 and waits > 0  # some rounds ran out of gradients to make
    # every wake-up used its gradient made ahead or made its own: none was made twice
    assert sum(ahead[0].k.values()) == sum(plain[0].k.values())
