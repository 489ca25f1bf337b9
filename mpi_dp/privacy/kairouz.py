"""Theorem 1 of seed 004: heterogeneous advanced composition of pure releases (Kairouz, Oh &
Viswanath 2015) and the per-agent budget split of its Algorithm 3.

An agent that wakes T_i times releases with eps e_1..e_{T_i} (each (e_k, 0)-DP). For any
delta_bar in [0, 1] the sequence is (eps_bar, delta_bar)-DP with eps_bar the minimum of
(a) sum e_k, (b) sum e_k tanh(e_k/2) + sqrt(2 sum e_k^2 log(e + sqrt(sum e_k^2)/delta_bar)) and
(c) sum e_k tanh(e_k/2) + sqrt(2 sum e_k^2 log(1/delta_bar)); (e^x-1)/(e^x+1) = tanh(x/2).
Pure functions of public numbers: the split is fixed before any data is read.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from mpi_dp.privacy.events import fsum

ALLOCATIONS = ("equal", "simple", "prop2_paper", "prop2_corrected")


def theorem1_eps(e: Sequence[float] | np.ndarray, delta_bar: float) -> float:
    """eps_bar of releases e_1..e_k at delta_bar (only (a) when delta_bar = 0)."""
    e = np.asarray(e, dtype=np.float64)
    if e.size and (np.any(e < 0) or np.any(np.isnan(e))):
        raise ValueError("per-release eps must be >= 0")
    if not 0.0 <= delta_bar <= 1.0:
        raise ValueError(f"delta_bar must be in [0, 1], got {delta_bar}")
    a = fsum(e)  # inf, not OverflowError, beyond the largest float
    if delta_bar == 0.0 or not math.isfinite(a) or a == 0.0:
        return a
    drift = math.fsum(e * np.tanh(e / 2.0))
    top = float(e.max())
    if top > _SQUARE_MAX:  # negligible noise: e^2 would overflow; the same bounds, scaled by top
        root = top * math.sqrt(math.fsum((e / top) ** 2))  # sqrt(sum e^2)
        log_b = math.log(root) - math.log(delta_bar) + math.log1p(math.e * delta_bar / root)
        b = drift + root * math.sqrt(2.0 * log_b)
        c = drift + root * math.sqrt(2.0 * math.log(1.0 / delta_bar)) if delta_bar < 1 else drift
        return min(a, b, c)
    sq = math.fsum(e * e)
    b = drift + math.sqrt(2.0 * sq * math.log(math.e + math.sqrt(sq) / delta_bar))
    c = drift + math.sqrt(2.0 * sq * math.log(1.0 / delta_bar)) if delta_bar < 1 else drift
    return min(a, b, c)


#: Per-release eps above which theorem1_eps works with e / max(e) (e^2 summed over a sequence
#: would overflow beyond about 1e154); at most this, bit for bit the formulas as written.
_SQUARE_MAX = 1e100


def equal_split(eps_bar: float, T_i: int, delta_bar: float, tol: float = 1e-12) -> float:
    """The largest e with theorem1_eps([e] * T_i) <= eps_bar (bisection; the map is monotone)."""
    if T_i < 1:
        raise ValueError(f"T_i must be >= 1, got {T_i}")
    if math.isinf(eps_bar):
        return math.inf
    if eps_bar <= 0:
        raise ValueError(f"eps_bar must be > 0, got {eps_bar}")
    if T_i == 1:
        return float(eps_bar)
    lo, hi = 0.0, float(eps_bar)
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if theorem1_eps(np.full(T_i, mid), delta_bar) <= eps_bar:
            lo = mid
        else:
            hi = mid
        if hi - lo <= tol * max(hi, 1e-300):
            break
    return lo


def prop2_allocation(kappa: float, T: int, eps_bar: float, corrected: bool = True) -> np.ndarray:
    """eps*(t), t = 0..T-1, summing to eps_bar: the paper's kappa^{t/3} weights (budget shrinks
    over time) or the corrected kappa^{(T-1-t)/3} (the unrolled recursion: budget grows)."""
    if not 0 < kappa < 1:
        raise ValueError(f"kappa must be in (0, 1), got {kappa}")
    t = np.arange(T, dtype=np.float64)
    w = np.power(kappa, ((T - 1 - t) if corrected else t) / 3.0)
    return eps_bar * w / math.fsum(w)


def agent_budgets(allocation: str, eps_bar: float, delta_bar: float, schedule: np.ndarray,
                  n: int, T_agent: np.ndarray, kappa: float | None = None) -> list[np.ndarray]:
    """Per agent, the eps of each of its wake-ups (T_agent[i] entries) under `allocation`.

    equal / simple need only T_i; the Proposition-2 allocations read the whole global schedule
    (replay mode) and give agent i the share eps*(t) / lambda_i of its own steps t."""
    if allocation not in ALLOCATIONS:
        raise ValueError(f"allocation must be one of {ALLOCATIONS}, got {allocation!r}")
    if math.isinf(eps_bar):
        return [np.full(int(k), math.inf) for k in T_agent]
    if allocation in ("equal", "simple"):
        out, memo = [], {}
        for k in (int(x) for x in T_agent):
            if k not in memo:
                memo[k] = (equal_split(eps_bar, k, delta_bar) if allocation == "equal"
                           else eps_bar / k) if k else 0.0
            out.append(np.full(k, memo[k]))
        return out
    if kappa is None:
        raise ValueError("the Proposition-2 allocations need kappa")
    schedule = np.asarray(schedule)
    star = prop2_allocation(kappa, len(schedule), eps_bar, allocation == "prop2_corrected")
    out = []
    for i in range(n):
        steps = np.flatnonzero(schedule == i)[: int(T_agent[i])]
        share = star[steps]
        lam_i = math.fsum(share) / eps_bar if steps.size else 1.0
        out.append(share / lam_i)
    return out


def compose_deltas(deltas: Sequence[float], delta_bar: float = 0.0) -> float:
    """1 - (1 - delta_bar) prod_k (1 - delta_k): the total delta of the Gaussian variant."""
    return 1.0 - (1.0 - delta_bar) * math.prod(1.0 - d for d in deltas)
