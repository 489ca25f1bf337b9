"""The data owner's privacy ledger: mechanism events charged before every release, over R runs.

One class for every method. The owner holds its own ledger and charges the event of a release
*before* making it; a release that would take a run past what the owner was promised is refused
with BudgetExceededError and nothing is recorded, so DP is enforced where the data lives. The
ledger is vectorised over the R Monte-Carlo runs (each run is its own DP execution): a charge
names the runs that release (all by default). Two kinds of limit, both O(1) per charge:

- a calibrated plan (`target`, privacy.contract: the pld and basic rules): at most the plan's
  number of calibrated releases, each no less noisy than calibrated, and each fixed release of
  the plan once; the plan's composition is what certifies the owner's (eps, delta);
- a budget under basic (sequential) composition (`budget_eps`, `budget_delta`): the papers' rules.

The history is kept as counts per distinct event, which is all the accountants (privacy.accountants:
basic, advanced, PLD, RDP) need. `context` holds releases the owner makes elsewhere that count
towards the same guarantee (the other candidates of a private selection); a ledger of `record`
scope (a single pass: every record in one release per pass) also keeps the least private release
of each pass, the composition a record sees.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from mpi_dp.errors import BudgetExceededError
from mpi_dp.privacy.events import Event, GaussianEvent, LaplaceEvent

#: Relative slack on the budget, so T releases of eps/T fit despite rounding in eps/T.
REL_TOL = 1e-9


def _check_amount(name: str, value: float) -> float:
    value = float(value)
    if math.isnan(value) or value < 0:
        raise ValueError(f"{name} must be a non-negative number, got {value}")
    return value


class Ledger:
    """Owner `agent`'s releases over `runs` runs, against its budget (budget_eps, budget_delta).

    The budget check uses running sums per run (plain float sums: after 10^6 releases they are
    off by far less than REL_TOL); the reported spend (`spent_eps`, `spent_delta`) is recomputed
    from the counts of each distinct event, so it is exact to rounding whatever the history length.
    A block of owners may hold these arrays as rows of its own (privacy.ledger_block: one
    vectorised charge for every owner); they are updated in place, never replaced.
    """

    def __init__(self, agent: int, budget_eps: float = math.inf, budget_delta: float = 0.0,
                 runs: int = 1, *, target: Any = None, allowance: int | None = None,
                 context: Sequence[tuple[Event, int]] = ()) -> None:
        if agent < 0:
            raise ValueError(f"agent must be >= 0, got {agent}")
        if runs < 1:
            raise ValueError(f"runs must be >= 1, got {runs}")
        self.agent = int(agent)
        self.budget_eps = _check_amount("budget_eps", budget_eps)
        self.budget_delta = _check_amount("budget_delta", budget_delta)
        self.runs = int(runs)
        self._run_eps = np.zeros(runs)  # running sums for the budget check
        self._run_delta = np.zeros(runs)
        self._limit_eps = self.budget_eps * (1 + REL_TOL)
        self._limit_delta = self.budget_delta * (1 + REL_TOL)
        self.releases = np.zeros(runs, dtype=np.int64)
        #: event key -> [representative event, releases per run]
        self._counts: dict[tuple, list] = {}
        self._last: list | None = None  # see _cached
        #: the owner's contract (privacy.contract.Calibration) and the plan's limits
        self.target = target
        self.context = tuple((ev, int(c)) for ev, c in context if c > 0)
        self._plan = _PlanLimit(target, allowance, self.context) if _enforced(target) else None
        self._planned = np.zeros(runs, dtype=np.int64)  # calibrated releases made per run
        self._pass_worst: dict[int, Event] = {}  # record scope: least private release per pass

    @property
    def scope(self) -> str:
        """What the owner's guarantee composes over (configuration, record or selection)."""
        return self.target.plan.scope if self.target is not None else "configuration"

    # -- totals ---------------------------------------------------------------------------
    def _total(self, field: str) -> np.ndarray:
        total = np.zeros(self.runs)
        for ev, counts in self._counts.values():
            x = getattr(ev, field)
            if x:
                with np.errstate(invalid="ignore", over="ignore"):  # 0 x inf; sums past the
                    # largest float are inf, which is their value
                    total = total + np.where(counts > 0, counts * x, 0.0)
        return total

    @property
    def spent_eps(self) -> np.ndarray:
        """(runs,) eps spent in each run (basic composition)."""
        return self._total("eps")

    @property
    def spent_delta(self) -> np.ndarray:
        return self._total("delta")

    @property
    def remaining_eps(self) -> np.ndarray:
        """(runs,) budget left (never negative; inf for an infinite budget)."""
        if math.isinf(self.budget_eps):
            return np.full(self.runs, math.inf)
        return np.maximum(0.0, self.budget_eps - self.spent_eps)

    def event_counts(self) -> list[tuple[Event, np.ndarray]]:
        """Each distinct event made and how many times in each run, in order of first use."""
        return [(ev, counts.copy()) for ev, counts in self._counts.values()]

    def worst_counts(self) -> list[tuple[Event, int]]:
        """Each distinct event with its largest count over runs: composing these bounds every run
        (accountants are monotone in the number of releases)."""
        return [(ev, int(c.max())) for ev, c in self._counts.values() if c.max() > 0]

    def scope_pairs(self) -> list[tuple[Event, int]]:
        """What the owner's guarantee composes: per record, the least private release of each
        pass (record scope); else every release made here plus those made elsewhere (context)."""
        if self.scope == "record":
            merged: dict[tuple, list] = {}
            for ev in self._pass_worst.values():
                merged.setdefault(ev.key(), [ev, 0])[1] += 1
            return [(ev, c) for ev, c in merged.values()]
        return self.worst_counts() + list(self.context)

    # -- charging -------------------------------------------------------------------------
    def _idx(self, runs: np.ndarray | None) -> np.ndarray | slice:
        if runs is None:
            return slice(None)
        idx = np.asarray(runs, dtype=np.int64)
        if idx.ndim != 1 or (idx.size and (idx.min() < 0 or idx.max() >= self.runs)):
            raise ValueError(f"run positions must be a 1-D array in 0..{self.runs - 1}")
        return idx

    def _fits(self, eps: float, delta: float, idx: np.ndarray | slice) -> np.ndarray | bool:
        ok: np.ndarray | bool = True
        with np.errstate(over="ignore"):  # a sum past the largest float is inf: it does not fit
            if math.isfinite(self.budget_eps) and eps:
                ok = self._run_eps[idx] + eps <= self._limit_eps
            if delta and math.isfinite(self.budget_delta):
                ok = ok & (self._run_delta[idx] + delta <= self._limit_delta)
        return ok

    def _plan_fits(self, last: list, idx: np.ndarray | slice | int,
                   record_pass: int | None) -> np.ndarray | bool:
        """Whether one more release of the cached event fits the calibrated plan at idx."""
        plan = self._plan
        if plan is None:
            return True
        kind = last[4]
        if kind == "calibrated":
            if self.scope == "record":
                if record_pass is None:
                    raise ValueError("a ledger of record scope needs the pass of every release")
                return record_pass < plan.allowance
            return self._planned[idx] < plan.allowance
        if kind == "fixed":
            return self._count(last[0], last)[idx] < plan.fixed[last[0].key()]
        return False

    def fits(self, event: Event, runs: np.ndarray | None = None) -> np.ndarray:
        """Per run in `runs`: would one more release of `event` stay within the budget?"""
        idx = self._idx(runs)
        n = self.runs if isinstance(idx, slice) else idx.size
        ok = self._fits(event.eps, event.delta, idx) & self._plan_fits(self._cached(event), idx,
                                                                       None if self.scope !=
                                                                       "record" else 0)
        return np.broadcast_to(ok, (n,)).copy()

    def can_charge(self, event: Event, runs: np.ndarray | None = None) -> bool:
        return bool(np.all(self.fits(event, runs)))

    def _cached(self, event: Event) -> list:
        """[event, eps, delta, counts entry or None] of the last event charged (repeated charges
        of one event object, an owner answering queries, skip re-deriving its key)."""
        last = self._last
        if last is None or last[0] is not event:
            kind = self._plan.kind(event) if self._plan is not None else "budget"
            last = self._last = [event, event.eps, event.delta, None, kind]
        return last

    def _count(self, event: Event, last: list) -> np.ndarray:
        """The per-run counts of `event` (created at its first release)."""
        if last[3] is None:
            key = event.key()
            entry = self._counts.get(key)
            if entry is None:
                entry = self._counts[key] = [event, np.zeros(self.runs, dtype=np.int64)]
            last[3] = entry
        return last[3][1]

    def charge(self, event: Event, runs: np.ndarray | None = None, note: str = "",
               record_pass: int | None = None) -> None:
        """Record one release of `event` in each of `runs` (all runs by default); raise
        BudgetExceededError, recording nothing, if any of them would exceed its budget or the
        owner's calibrated plan. `record_pass`: the pass over the owner's records this release
        belongs to (ledgers of record scope: each record is in one release per pass)."""
        idx = self._idx(runs)
        last = self._cached(event)
        why = self._check(event, last, idx, note, record_pass)
        if why is not None:
            raise BudgetExceededError(why)
        self._record(event, last, idx, record_pass)

    def refusal(self, event: Event, runs: np.ndarray | None = None, note: str = "",
                record_pass: int | None = None) -> str | None:
        """Why `charge` would refuse this release (its BudgetExceededError message), or None
        where it fits; records nothing (a block of ledgers checks all before charging any)."""
        return self._check(event, self._cached(event), self._idx(runs), note, record_pass)

    def _check(self, event: Event, last: list, idx: np.ndarray | slice, note: str,
               record_pass: int | None) -> str | None:
        eps, delta = last[1], last[2]
        ok = self._fits(eps, delta, idx) & self._plan_fits(last, idx, record_pass)
        if ok is not True and not np.all(ok):
            where = np.arange(self.runs)[idx]
            r = where[np.flatnonzero(~np.broadcast_to(np.asarray(ok), where.shape))[0]]
            return self._refusal(event, int(r), note, last, record_pass)
        return None

    def charge_one(self, event: Event, r: int, note: str = "") -> None:
        """charge(event, [r]) for the one run position r: the same check and the same running
        sums and counts (the same float additions), with scalar arithmetic (the live hot path)."""
        if not 0 <= r < self.runs:
            raise ValueError(f"run positions must be a 1-D array in 0..{self.runs - 1}")
        last = self._cached(event)
        eps, delta = last[1], last[2]
        if ((eps and math.isfinite(self.budget_eps)  # Python floats: past the largest, inf
             and float(self._run_eps[r]) + eps > self._limit_eps)
                or (delta and math.isfinite(self.budget_delta)
                    and float(self._run_delta[r]) + delta > self._limit_delta)
                or (self._plan is not None and not self._plan_fits(last, r, None))):
            raise BudgetExceededError(self._refusal(event, r, note, last, None))
        self._record(event, last, r)

    def _record(self, event: Event, last: list, idx: np.ndarray | slice | int,
                record_pass: int | None = None) -> None:
        """One release of `event` (its `_cached` entry `last`) at run positions `idx` (or the one
        position): the running sums of the budget check, the releases and the event's counts."""
        with np.errstate(over="ignore"):  # running sums past the largest float are inf
            if last[1]:
                self._run_eps[idx] += last[1]
            if last[2]:
                self._run_delta[idx] += last[2]
        self.releases[idx] += 1
        self._count(event, last)[idx] += 1
        if last[4] == "calibrated":
            self._planned[idx] += 1
        if record_pass is not None:
            worst = self._pass_worst.get(record_pass)
            if worst is None or event.eps > worst.eps:
                self._pass_worst[record_pass] = event

    def _refusal(self, event: Event, r: int, note: str, last: list | None = None,
                 record_pass: int | None = None) -> str:
        n = int(self.releases[r])
        what = f" ({note})" if note else ""
        where = f" in run position {r}" if self.runs > 1 else ""
        if self._plan is not None and last is not None and not self._plan_fits(last, r,
                                                                               record_pass):
            return (f"owner {self.agent} refuses release {n + 1}{what}{where}: "
                    f"{self._plan.why(event, last[4], record_pass)} (its guarantee "
                    f"{self.target.plan.eps:g}, {self.target.plan.delta:g} is certified for "
                    "that plan only)")
        eps_new = float(self.spent_eps[r]) + event.eps
        if eps_new > self._limit_eps:
            field, new, budget = "eps", eps_new, self.budget_eps
        else:
            field = "delta"
            new = float(self.spent_delta[r]) + event.delta
            budget = self.budget_delta
        return (f"owner {self.agent} refuses release {n + 1}{what}{where}: it would spend "
                f"{field}={new:.6g} of its budget {field}={budget:g} ({self._made(r, n, field)} "
                "already made)")

    def _made(self, r: int, n: int, field: str) -> str:
        """'100 releases of eps=0.01' (all alike) or '3 releases totalling eps=0.5'."""
        if n == 0:
            return "no releases"
        used = [ev for ev, c in self._counts.values() if c[r] > 0]
        values = {getattr(ev, field) for ev in used}
        if len(values) == 1:
            return f"{n} release{'s' if n != 1 else ''} of {field}={values.pop():.6g}"
        total = (self.spent_eps if field == "eps" else self.spent_delta)[r]
        return f"{n} releases totalling {field}={total:.6g}"

    def __getstate__(self) -> dict:
        """The ledger without its cache of the last event charged (`_last`, rebuilt on the next
        charge), so equal histories pickle alike however they were charged (one owner at a time
        or as rows of a block, privacy.ledger_block); the checkpoint leaves it out likewise."""
        state = self.__dict__.copy()
        state["_last"] = None
        return state

    def __repr__(self) -> str:
        return (f"Ledger(agent={self.agent}, runs={self.runs}, spent_eps<={self.spent_eps.max():.6g}"
                f"/{self.budget_eps:g}, releases<={int(self.releases.max())})")


def _enforced(target: Any) -> bool:
    """Whether a target's plan limits the ledger: a calibrated (pld / basic) private plan."""
    return (target is not None and target.rule in ("pld", "basic")
            and target.noise_multiplier > 0)


class _PlanLimit:
    """What a calibrated plan allows: `allowance` calibrated releases (per run; per record: the
    passes), each at most as private-costly as calibrated, and each fixed release of the plan
    (less those made elsewhere, `context`) once."""

    def __init__(self, target: Any, allowance: int | None, context: tuple) -> None:
        plan = target.plan
        self.mechanism = plan.mechanism
        self.allowance = plan.releases if allowance is None else int(allowance)
        self.nm = float(target.noise_multiplier)
        self.delta = plan.delta
        fixed: dict[tuple, int] = {}
        for ev in plan.fixed:
            fixed[ev.key()] = fixed.get(ev.key(), 0) + 1
        for ev, c in context:
            if ev.key() in fixed:
                fixed[ev.key()] -= c
        self.fixed = fixed

    def kind(self, event: Event) -> str:
        """'fixed' (a planned fixed release), 'calibrated' (no less noisy than calibrated) or
        'over' (neither: refused)."""
        if event.key() in self.fixed:
            return "fixed"
        if self.mechanism == "laplace" and isinstance(event, LaplaceEvent):
            if event.eps <= (1.0 / self.nm) * (1 + REL_TOL):
                return "calibrated"
        elif self.mechanism == "gaussian" and isinstance(event, GaussianEvent):
            if event.noise_multiplier >= self.nm * (1 - REL_TOL):
                return "calibrated"
        return "over"

    def why(self, event: Event, kind: str, record_pass: int | None) -> str:
        if kind == "over":
            return (f"{event!r} is less noisy than its calibrated plan ({self.mechanism}, noise "
                    f"multiplier {self.nm:.6g})")
        if kind == "fixed":
            return f"{event!r} was planned {max(self.fixed[event.key()], 0)} time(s), all made"
        if record_pass is not None:
            return (f"pass {record_pass + 1} over its records is beyond the {self.allowance} "
                    "pass(es) calibrated")
        return f"its plan calibrates {self.allowance} release(s), all made"
