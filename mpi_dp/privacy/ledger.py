"""Per-owner privacy ledger: immutable release records and one narrow charging interface.

Shaped like dp-accounting (small frozen events, an accountant that only composes them). The data
owner holds its own ledger and charges it *before* each release; a release that would exceed the
budget is refused with BudgetExceededError, so DP is enforced where the data lives. Composition is
basic (sequential): spent eps and delta are the sums over releases.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from mpi_dp.errors import BudgetExceededError

#: Relative slack on the budget, so T releases of eps/T fit despite rounding in eps/T.
REL_TOL = 1e-9

#: One row per ledger, for HDF5 (`privacy/ledger`).
LEDGER_DTYPE = np.dtype(
    [
        ("agent", "i8"),
        ("budget_eps", "f8"),
        ("spent_eps", "f8"),
        ("budget_delta", "f8"),
        ("spent_delta", "f8"),
        ("releases", "i8"),
    ]
)


@dataclass(frozen=True)
class Release:
    """One (eps, delta)-DP release made by an owner; `note` says what was released."""

    eps: float
    delta: float = 0.0
    note: str = ""


def _check_amount(name: str, value: float) -> float:
    value = float(value)
    if math.isnan(value) or value < 0:
        raise ValueError(f"{name} must be a non-negative number, got {value}")
    return value


def _exceeds(total: float, budget: float) -> bool:
    """True if `total` exceeds `budget` by more than the relative tolerance."""
    if math.isinf(budget):
        return False
    return total > budget * (1 + REL_TOL)


class PrivacyLedger:
    """Owner `agent`'s ledger of releases against its budget (budget_eps, budget_delta)."""

    def __init__(self, agent: int, budget_eps: float, budget_delta: float = 0.0) -> None:
        if agent < 0:
            raise ValueError(f"agent must be >= 0, got {agent}")
        self.agent = int(agent)
        self._budget_eps = _check_amount("budget_eps", budget_eps)
        self._budget_delta = _check_amount("budget_delta", budget_delta)
        self._history: list[Release] = []

    @property
    def budget_eps(self) -> float:
        return self._budget_eps

    @property
    def budget_delta(self) -> float:
        return self._budget_delta

    @property
    def history(self) -> tuple[Release, ...]:
        return tuple(self._history)

    @property
    def releases(self) -> int:
        return len(self._history)

    @property
    def spent_eps(self) -> float:
        return math.fsum(r.eps for r in self._history)

    @property
    def spent_delta(self) -> float:
        return math.fsum(r.delta for r in self._history)

    @property
    def remaining_eps(self) -> float:
        """Budget left (never negative; inf for an infinite budget)."""
        if math.isinf(self._budget_eps):
            return math.inf
        return max(0.0, self._budget_eps - self.spent_eps)

    def _new_totals(self, eps: float, delta: float) -> tuple[float, float]:
        eps = _check_amount("eps", eps)
        delta = _check_amount("delta", delta)
        return (
            math.fsum([*(r.eps for r in self._history), eps]),
            math.fsum([*(r.delta for r in self._history), delta]),
        )

    def can_charge(self, eps: float, delta: float = 0.0) -> bool:
        """Whether a release of (eps, delta) would fit in the budget."""
        new_eps, new_delta = self._new_totals(eps, delta)
        return not (_exceeds(new_eps, self._budget_eps) or _exceeds(new_delta, self._budget_delta))

    def charge(self, eps: float, delta: float = 0.0, note: str = "") -> Release:
        """Record a release of (eps, delta); raise BudgetExceededError (recording nothing) if it
        would exceed the budget."""
        new_eps, new_delta = self._new_totals(eps, delta)
        n = len(self._history)
        what = f" ({note})" if note else ""
        if _exceeds(new_eps, self._budget_eps):
            raise BudgetExceededError(
                f"owner {self.agent} refuses release {n + 1}{what}: it would spend "
                f"eps={new_eps:.6g} of its budget eps={self._budget_eps:g} "
                f"({self._made(n, 'eps')} already made)"
            )
        if _exceeds(new_delta, self._budget_delta):
            raise BudgetExceededError(
                f"owner {self.agent} refuses release {n + 1}{what}: it would spend "
                f"delta={new_delta:.6g} of its budget delta={self._budget_delta:g} "
                f"({self._made(n, 'delta')} already made)"
            )
        release = Release(float(eps), float(delta), note)
        self._history.append(release)
        return release

    def _made(self, n: int, field: str) -> str:
        """'100 releases of 0.01' (all equal) or '3 releases totalling 0.5'."""
        if n == 0:
            return "no releases"
        values = {getattr(r, field) for r in self._history}
        if len(values) == 1:
            return f"{n} release{'s' if n != 1 else ''} of {field}={values.pop():.6g}"
        total = self.spent_eps if field == "eps" else self.spent_delta
        return f"{n} releases totalling {field}={total:.6g}"

    def to_record(self) -> dict:
        """The ledger's summary as plain Python values (for results files and logs)."""
        return {
            "agent": self.agent,
            "budget_eps": self._budget_eps,
            "spent_eps": self.spent_eps,
            "budget_delta": self._budget_delta,
            "spent_delta": self.spent_delta,
            "releases": self.releases,
        }

    def __repr__(self) -> str:
        return (
            f"PrivacyLedger(agent={self.agent}, spent_eps={self.spent_eps:.6g}/"
            f"{self._budget_eps:g}, releases={self.releases})"
        )


def ledgers_to_array(ledgers: Iterable[PrivacyLedger]) -> np.ndarray:
    """The ledgers' records as a structured array of LEDGER_DTYPE, in the given order."""
    rows = [tuple(led.to_record()[name] for name in LEDGER_DTYPE.names) for led in ledgers]
    return np.array(rows, dtype=LEDGER_DTYPE)


class RunLedger:
    """One owner's ledgers for R independent runs that each release eps_i / cap per answer.

    Vectorised over runs (each run is its own DP execution with its own budget eps_i): a release
    that would exceed a run's budget, i.e. more than `cap` answers, is refused.
    Spent eps is releases x (eps_i / cap): exact, no running sums.
    """

    def __init__(self, agent: int, budget_eps: float, cap: int, runs: int) -> None:
        if cap < 1:
            raise ValueError(f"cap must be >= 1, got {cap}")
        self.agent = int(agent)
        self.budget_eps = _check_amount("budget_eps", budget_eps)
        self.cap = int(cap)
        self.per_release = self.budget_eps / self.cap
        self.releases = np.zeros(runs, dtype=np.int64)

    def remaining(self, runs: np.ndarray) -> np.ndarray:
        """Answers each of `runs` may still give."""
        return self.cap - self.releases[runs]

    def charge(self, runs: np.ndarray) -> None:
        """Record one release in each of `runs` (BudgetExceededError if any run is at its cap)."""
        runs = np.asarray(runs, dtype=np.int64)
        over = runs[self.releases[runs] >= self.cap]
        if over.size:
            raise BudgetExceededError(
                f"owner {self.agent} refuses release {self.cap + 1} in run position "
                f"{int(over[0])}: {self.cap} releases of eps={self.per_release:.6g} already spend "
                f"its budget eps={self.budget_eps:g}")
        self.releases[runs] += 1

    @property
    def spent_eps(self) -> np.ndarray:
        """(runs,) eps spent in each run."""
        return self.releases * self.per_release

    def to_records(self) -> np.ndarray:
        """Summary row of LEDGER_DTYPE (the largest spend over runs)."""
        k = int(self.releases.max()) if self.releases.size else 0
        return np.array([(self.agent, self.budget_eps, k * self.per_release, 0.0, 0.0, k)],
                        dtype=LEDGER_DTYPE)
