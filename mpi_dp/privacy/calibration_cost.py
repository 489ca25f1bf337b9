"""What calibrating a job's noise will cost, before it starts: seconds, and rank 0's memory, of
the searches of privacy.calibration, so that a run's estimate (results.footprint) includes them.

A pld search composes its plan's releases by privacy loss distributions (accountants.pld) about
a dozen times. One composition of k Laplace releases of eps e costs time and memory in proportion
to the points of the composed distribution: dp-accounting's truncation keeps about
0.24 k (2 e / grid + 1) of them on a grid of max(1e-4, e / 200), i.e. linear in k = T (measured:
k = 1e5 at e = 0.034, eps = 100 over the run, is 9.5e6 points, ~5 s and ~0.9 GB per composition;
T = 1e7 is 100 times that). A Gaussian plan composes one Gaussian whatever k: cheap.

The search's evaluation points are replayed here with a cheap stand-in for the PLD total (RDP,
within a few per cent of it, milliseconds), and each point is priced by its distribution's size.
Rough, like every estimate of footprint: a factor of two either way.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Sequence

from mpi_dp.privacy import accountants
from mpi_dp.privacy.calibration import (
    Plan,
    _basic,
    _search,
    cached,
    planned_pairs,
    search_start,
    searched,
)
from mpi_dp.privacy.events import Event, GaussianEvent

#: CPU seconds per point of a composed privacy loss distribution (its FFT, then dp-accounting's
#: Python loop over the points for eps at delta): 350-570 ns measured on a 2-core VM; the
#: replayed searches came within 0.74-1.26x of the real ones from T = 1e3 to 1e6 at 5e-7
POINT_S = 5.5e-7
#: peak bytes per point of a search (one composition alone: ~85 from 5e5 to 3e7 points; the
#: process's peak over a whole search, measured at T = 1e5 and 1e6 and eps = 10 and 100: 1.4-1.8x that)
POINT_BYTES = 150.0
#: seconds of one composition besides its points (building the distributions, RDP's totals)
EVALUATION_S = 0.01
#: a Gaussian's loss is kept to about +-8 standard deviations
GAUSSIAN_WIDTH = 16.0
#: distinct plans replayed one by one; the cost of more is extrapolated from theirs
MAX_REPLAYED = 16


@dataclasses.dataclass(frozen=True)
class Cost:
    """Seconds of calibrating some plans, the largest memory one composition takes, and how
    many accountant evaluations that is."""

    seconds: float = 0.0
    peak_bytes: float = 0.0
    evaluations: int = 0

    def __add__(self, other: Cost) -> Cost:
        return Cost(self.seconds + other.seconds, max(self.peak_bytes, other.peak_bytes),
                    self.evaluations + other.evaluations)


def points(pairs: Sequence[tuple[Event, int]]) -> float:
    """About how many points accountants.pld's distributions of `pairs` hold (the composed one,
    and the pieces composed into it)."""
    live = [(ev, c) for ev, c in pairs if c > 0 and 0 < ev.eps < math.inf]
    if not live or any(ev.eps > accountants.EXACT_EPS for ev, _ in live):
        return 0.0  # nothing to compose, or the exact regime (closed form)
    grid = max(accountants.PLD_MIN_INTERVAL, min(ev.eps for ev, _ in live) / 200)
    total = 0.0
    for ev, c in live:
        if isinstance(ev, GaussianEvent):  # one Gaussian of noise z / sqrt(c), its loss's range
            total += GAUSSIAN_WIDTH * math.sqrt(c) / ev.noise_multiplier / grid + 1
        else:  # Laplace or pure: `c` releases of loss in [-eps, eps] composed by FFT
            one = 2 * ev.eps / grid + 1
            total += one if c == 1 else max(one, 0.24 * c * one)
    return total * (2 if len(live) > 1 else 1)


def evaluation(pairs: Sequence[tuple[Event, int]]) -> Cost:
    """One composition of `pairs` by accountants.pld."""
    n = points(pairs)
    return Cost(EVALUATION_S + POINT_S * n, POINT_BYTES * n, 1)


def plan_cost(plan: Plan, rule: str) -> Cost:
    """Calibrating `plan` under `rule` ('pld' or 'basic'; nothing when it is cached, in this
    process or on disk by an earlier job: calibration.cached): the pld search's evaluation
    points (replayed with RDP) and the planned totals."""
    if cached(plan, rule) or math.isinf(plan.eps) or plan.releases == 0:
        return Cost()
    try:
        if rule == "basic":
            return evaluation(planned_pairs(plan, _basic(plan)))
        if not searched(plan):
            return Cost()
        xs: list[float] = []

        def total(x: float) -> float:
            xs.append(x)
            return accountants.rdp(planned_pairs(plan, 1.0 / x), plan.delta)

        root = _search(total, search_start(plan), plan.eps, watched=False)
    except Exception:  # noqa: BLE001 - an estimate never stops a job: the search will say why
        return Cost()
    cost = evaluation(planned_pairs(plan, 1.0 / root))  # the planned totals
    for x in xs:
        cost = cost + evaluation(planned_pairs(plan, 1.0 / x))
    return cost


def job_cost(keys: Iterable[tuple[str, Plan]]) -> Cost:
    """Calibrating the distinct (rule, plan) pairs of a job (runner: each searched once, on rank
    0): the first MAX_REPLAYED replayed, the others priced at their mean."""
    keys = list(keys)
    sample = keys if len(keys) <= MAX_REPLAYED else [
        keys[i * (len(keys) - 1) // (MAX_REPLAYED - 1)] for i in range(MAX_REPLAYED)]
    cost = Cost()
    for rule, plan in sample:
        cost = cost + plan_cost(plan, rule)
    if len(sample) < len(keys):
        scale = len(keys) / len(sample)
        cost = Cost(cost.seconds * scale, cost.peak_bytes, round(cost.evaluations * scale))
    return cost
