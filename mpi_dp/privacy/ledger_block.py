"""The ledgers of a block of owners charged as arrays: one check and one add for every owner.

A rank hosting 10^4 owners charges every ledger each iteration; `Ledger.charge` one owner at a
time costs microseconds of Python each. `LedgerBlock` binds the block's ledgers to rows of
(owners, runs) arrays: each ledger's running sums (`_run_eps`, `_run_delta`), `releases`,
`_planned` and the counts of the events it charges *are* row views of arrays held here, so one
vectorised check and one add update every ledger in place, and a ledger charged on its own
(`Ledger.charge`) updates the same rows. The arithmetic is `Ledger.charge`'s, element for
element (the same float additions in the same order per run), so a ledger charged as a row is
equal in every field to one charged alone.

Which counts entry an event increments is found once per owner: an owner's entry (its event
key, privacy.events) is remembered with the interval of eps (Laplace) or noise multiplier
(Gaussian) values seen to map to it; the key rounds that value to 12 digits, monotonically, so
any value inside the interval has the same key and no event is built or keyed again. Owners
whose value leaves the interval (or whose event is new to their ledger) take the per-owner path
for that charge. `BlockEvents` builds the block's event objects only when one is asked for.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from mpi_dp.errors import BudgetExceededError
from mpi_dp.privacy.events import Event, GaussianEvent, LaplaceEvent, _round12
from mpi_dp.privacy.ledger import REL_TOL, Ledger

#: bumped whenever an owner's ledger object is replaced (a restore), so a block rebinds
_EPOCH = [0]


def ledgers_replaced() -> None:
    """Note that some owner now holds another ledger object (blocks check theirs)."""
    _EPOCH[0] += 1


def epoch() -> int:
    return _EPOCH[0]


class BlockEvents(Sequence):
    """The k events of one block release, owner i's built on first access exactly as its own
    path builds it (LaplaceEvent(sens[i], scales[i], ...) or GaussianEvent(..., delta[i], ...));
    owners with equal parameters share one object."""

    def __init__(self, sens: np.ndarray, scales: np.ndarray, gauss: np.ndarray,
                 delta: np.ndarray, certified: np.ndarray, data_dependent: np.ndarray, *,
                 raw_delta: Any = None, plan_delta: Sequence[Any] = ()) -> None:
        self.sens, self.scales, self.gauss, self.delta = sens, scales, gauss, delta
        self.certified, self.data_dependent = certified, data_dependent
        #: a Gaussian event's delta as its owner's path passes it (the caller's, else the plan's)
        self.raw_delta, self.plan_delta = raw_delta, plan_delta
        self._made: list[Event | None] = [None] * sens.size
        self._shared: dict[tuple, Event] = {}

    def __len__(self) -> int:
        return self.sens.size

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        i = int(i)
        if i < 0:
            i += len(self)
        ev = self._made[i]
        if ev is None:
            s, sc = float(self.sens[i]), float(self.scales[i])
            dd, cert = bool(self.data_dependent[i]), bool(self.certified[i])
            g = bool(self.gauss[i])
            d = (self.raw_delta if self.raw_delta is not None else self.plan_delta[i]) \
                if g else 0.0
            key = (s, sc, g, float(self.delta[i]), dd, cert)
            ev = self._shared.get(key)
            if ev is None:
                ev = self._shared[key] = (
                    GaussianEvent(s, sc, d, data_dependent=dd, certified=cert) if g
                    else LaplaceEvent(s, sc, data_dependent=dd, certified=cert))
            self._made[i] = ev
        return ev

    def __iter__(self) -> Iterator[Event]:
        return (self[i] for i in range(len(self)))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Sequence) or len(other) != len(self):
            return NotImplemented if not isinstance(other, Sequence) else False
        return all(a == b for a, b in zip(self, other, strict=True))

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"BlockEvents({list(self)!r})"


class _Slots:
    """Each owner's counts entry for one kind of release (own mechanism or forced one)."""

    def __init__(self, k: int) -> None:
        self.valid = np.zeros(k, dtype=bool)
        self.lo = np.zeros(k)
        self.hi = np.zeros(k)
        self.delta = np.zeros(k)
        self.row = np.zeros(k, dtype=np.int64)  # pool row of the entry's counts
        self.fixed = np.zeros(k, dtype=bool)  # the entry's key is a fixed release of the plan
        self.fixed_limit = np.zeros(k, dtype=np.int64)
        self.geps = np.zeros(k)  # a Gaussian entry's eps (a function of its key)
        self.entry: list[list | None] = [None] * k
        self.span: tuple[int, int] | None = None  # (chunk, first row) where rows are a slice


class LedgerBlock:
    """`ledgers` (one per owner, all of `runs` runs) bound to rows of arrays held here; see the
    module. `bind` gives None where the ledgers cannot share rows (different run counts, one
    ledger twice, unusual dtypes): the caller charges them one at a time."""

    def __init__(self, ledgers: Sequence[Ledger]) -> None:
        self.ledgers = list(ledgers)
        self.k = k = len(self.ledgers)
        self.runs = self.ledgers[0].runs if k else 1
        # copies of the ledgers' arrays (owning their data), whose rows become the ledgers'
        self.run_eps = np.array([lg._run_eps for lg in self.ledgers], dtype=np.float64)
        self.run_delta = np.array([lg._run_delta for lg in self.ledgers], dtype=np.float64)
        self.releases = np.array([lg.releases for lg in self.ledgers], dtype=np.int64)
        self.planned = np.array([lg._planned for lg in self.ledgers], dtype=np.int64)
        for i, lg in enumerate(self.ledgers):
            lg._run_eps, lg._run_delta = self.run_eps[i], self.run_delta[i]
            lg.releases, lg._planned = self.releases[i], self.planned[i]
        ledgers_replaced()  # another block holding these ledgers rebinds them
        self.epoch = epoch()
        self.check_eps = np.array([math.isfinite(lg.budget_eps) for lg in self.ledgers], bool)
        self.limit_eps = np.array([lg._limit_eps for lg in self.ledgers], dtype=np.float64)
        self.check_delta = np.array([math.isfinite(lg.budget_delta) for lg in self.ledgers],
                                    bool)
        self.limit_delta = np.array([lg._limit_delta for lg in self.ledgers], dtype=np.float64)
        plans = [lg._plan for lg in self.ledgers]
        self.has_plan = np.array([p is not None for p in plans], dtype=bool)
        self.plan_laplace = np.array([p is not None and p.mechanism == "laplace" for p in plans],
                                     dtype=bool)
        self.plan_gaussian = np.array([p is not None and p.mechanism == "gaussian"
                                       for p in plans], dtype=bool)
        nm = np.array([p.nm if p is not None else 1.0 for p in plans], dtype=np.float64)
        with np.errstate(divide="ignore"):
            # _PlanLimit.kind's thresholds, the same float operations
            self.laplace_limit = (1.0 / nm) * (1 + REL_TOL)
        self.gaussian_limit = nm * (1 - REL_TOL)
        self.allowance = np.array([p.allowance if p is not None else 0 for p in plans],
                                  dtype=np.int64)
        self.record_scope = np.array([p is not None and lg.scope == "record"
                                      for p, lg in zip(plans, self.ledgers, strict=True)], bool)
        self.any_plan = bool(self.has_plan.any())
        self.any_record = bool(self.record_scope.any())
        self._slots: dict[Any, _Slots] = {}
        self._chunk = max(k, 16)
        self._pool: list[np.ndarray] = []
        self._pool_used = 0
        self._pooled: dict[int, tuple[list, int]] = {}  # id(entry) -> (entry, pool row)
        self._worst: dict[int, np.ndarray] = {}  # record pass -> each owner's worst eps there

    @classmethod
    def bind(cls, ledgers: Sequence[Ledger]) -> LedgerBlock | None:
        ledgers = list(ledgers)
        if not ledgers or len(set(map(id, ledgers))) != len(ledgers):
            return None
        R = ledgers[0].runs
        if any(lg.runs != R for lg in ledgers):
            return None
        for name, dt in (("_run_eps", np.float64), ("_run_delta", np.float64),
                         ("releases", np.int64), ("_planned", np.int64)):
            if {(type(a), a.dtype, a.shape) for a in (getattr(lg, name) for lg in ledgers)} \
                    != {(np.ndarray, np.dtype(dt), (R,))}:
                return None
        return cls(ledgers)

    def holds(self, ledgers: Sequence[Ledger]) -> bool:
        """Whether `ledgers` are this block's, still bound to its rows."""
        return len(ledgers) == self.k and all(
            a is b and a._run_eps.base is self.run_eps
            for a, b in zip(ledgers, self.ledgers, strict=True))

    # -- the counts of each owner's entries: rows of pool chunks --------------------------
    def _alloc(self) -> tuple[int, np.ndarray]:
        """A fresh pool row (zeros): its number and the row."""
        g = self._pool_used
        c, r = divmod(g, self._chunk)
        if c == len(self._pool):
            self._pool.append(np.zeros((self._chunk, self.runs), dtype=np.int64))
        self._pool_used += 1
        return g, self._pool[c][r]

    def _pool_row(self, entry: list) -> int:
        """The pool row holding `entry`'s counts (moved there, as a view, on first use)."""
        got = self._pooled.get(id(entry))
        if got is not None and got[0] is entry:
            return got[1]
        counts = entry[1]
        if not (isinstance(counts, np.ndarray) and counts.shape == (self.runs,)
                and counts.dtype == np.int64):
            raise ValueError("a ledger's event counts must be one int64 per run")
        g, row = self._alloc()
        row[:] = counts
        entry[1] = row
        self._pooled[id(entry)] = (entry, g)
        return g

    def _rows_op(self, rows: np.ndarray, op: Callable[[np.ndarray, np.ndarray], Any]) -> None:
        """op(chunk, local rows) for the chunks holding pool rows `rows` (distinct)."""
        if self._pool_used <= self._chunk:
            op(self._pool[0], rows)
            return
        c, r = np.divmod(rows, self._chunk)
        for ci in np.unique(c).tolist():
            op(self._pool[ci], r[c == ci])

    def _counts(self, rows: np.ndarray) -> np.ndarray:
        out = np.empty((rows.size, self.runs), dtype=np.int64)
        c, r = np.divmod(rows, self._chunk)
        for ci in np.unique(c).tolist():
            sel = c == ci
            out[sel] = self._pool[ci][r[sel]]
        return out

    def _resolve(self, sl: _Slots, events: BlockEvents, x: np.ndarray,
                 miss: np.ndarray) -> list[tuple[int, tuple]]:
        """The slots of owners `miss` (their value x left the slot's interval): their events'
        counts entries, found by key (created where new to the ledger, as Ledger._count does:
        returned as (owner, key), so a refused charge can take them back)."""
        created: list[tuple[int, tuple]] = []
        known: dict[int, tuple] = {}  # id(event) -> what owners sharing that event share
        idx = miss.tolist()
        xs = x[miss].tolist()
        valid, lo, hi = sl.valid[miss].tolist(), sl.lo[miss].tolist(), sl.hi[miss].tolist()
        rows, fixed, limit, geps, delta = [], [], [], [], []
        ledgers, slot_entry, pooled = self.ledgers, sl.entry, self._pooled
        for j, i in enumerate(idx):
            ev = events[i]
            got = known.get(id(ev))
            if got is None:  # its key, the values of the same key, a Gaussian's eps and delta
                key = ev.key()
                g = isinstance(ev, GaussianEvent)
                got = known[id(ev)] = (key, _key_span(key[1]), ev.eps if g else 0.0,
                                       ev.delta if g else 0.0)
            key, (slo, shi), ge, de = got
            lg = ledgers[i]
            entry = lg._counts.get(key)
            if entry is None:  # Ledger._count's new entry: zero counts, in a pool row
                row, counts = self._alloc()
                entry = lg._counts[key] = [ev, counts]
                pooled[id(entry)] = (entry, row)
                created.append((i, key))
            else:
                row = self._pool_row(entry)
            xi = xs[j]
            if valid[j] and slot_entry[i] is entry:  # same key: every value between maps to it
                lo[j], hi[j] = min(lo[j], xi, slo), max(hi[j], xi, shi)
            else:
                lo[j], hi[j] = min(xi, slo), max(xi, shi)
            slot_entry[i] = entry
            rows.append(row)
            plan = lg._plan
            f = plan is not None and key in plan.fixed
            fixed.append(f)
            limit.append(plan.fixed[key] if f else 0)
            geps.append(ge)
            delta.append(de)
        sl.lo[miss], sl.hi[miss], sl.row[miss] = lo, hi, rows
        sl.fixed[miss], sl.fixed_limit[miss] = fixed, limit
        sl.geps[miss], sl.delta[miss] = geps, delta
        sl.valid[miss] = True
        r = sl.row
        c0 = int(r[0]) // self._chunk
        sl.span = None
        if (int(r[-1]) - int(r[0]) == r.size - 1 and int(r[-1]) // self._chunk == c0
                and np.array_equal(r, np.arange(r[0], r[0] + r.size))):
            sl.span = (c0, int(r[0]) % self._chunk)  # one slice of one chunk: no fancy index
        return created

    # -- charging -------------------------------------------------------------------------
    def charge(self, events: BlockEvents, record_pass: int | None, variant: Any) -> bool:
        """Record one release of events[i] in every run of owner i's ledger, as `Ledger.charge`
        (events[i], record_pass=record_pass) one owner at a time would. Raises
        BudgetExceededError with the message of the first refusing owner (in owner order), and
        then charges no owner at all. False (nothing done) where the block cannot decide
        exactly (a ledger of record scope without the pass; a NaN eps): charge one at a time.
        """
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            # over: running sums past the largest float are inf, which is their value
            return self._charge(events, record_pass, variant)

    def _charge(self, events: BlockEvents, record_pass: int | None, variant: Any) -> bool:
        k = self.k
        gauss = events.gauss
        any_gauss = bool(gauss.any())
        sens, scales = events.sens, events.scales
        zero = sens == 0.0
        any_zero = bool(zero.any())
        lap_eps = sens / scales  # LaplaceEvent.eps: s / b; inf for b = 0; 0 for s = 0
        if any_zero:
            lap_eps[zero] = 0.0
        x = lap_eps
        if any_gauss:
            nm = scales / sens  # GaussianEvent.noise_multiplier: inf for s = 0
            if any_zero:
                nm[zero] = np.inf
            x = np.where(gauss, nm, lap_eps)
        if np.isnan(x).any() or (record_pass is None and self.any_record):
            return False
        sl = self._slots.get(variant)
        if sl is None:
            sl = self._slots[variant] = _Slots(k)
        hit = sl.valid & (sl.lo <= x) & (x <= sl.hi)
        if any_gauss:
            hit &= ~gauss | (events.delta == sl.delta)
        created = [] if hit.all() else self._resolve(sl, events, x, np.flatnonzero(~hit))
        eps, dlt = lap_eps, None
        if any_gauss:
            eps = np.where(gauss, sl.geps, lap_eps)  # a Gaussian event's eps: its key's
            dlt = np.where(gauss, events.delta, 0.0)

        # the checks of Ledger._fits and _plan_fits, every owner and run at once
        bad = np.zeros(k, dtype=bool)
        ce = self.check_eps & (eps != 0.0)
        if ce.any():
            ok = self.run_eps + eps[:, None] <= self.limit_eps[:, None]
            if not ok.all():
                bad |= ce & ~ok.all(axis=1)
        if dlt is not None:
            cd = self.check_delta & (dlt != 0.0)
            if cd.any():
                ok = self.run_delta + dlt[:, None] <= self.limit_delta[:, None]
                if not ok.all():
                    bad |= cd & ~ok.all(axis=1)
        calibrated = None
        if self.any_plan:
            fixed = self.has_plan & sl.fixed
            calibrated = self.has_plan & ~fixed & (
                (self.plan_laplace & ~gauss & (eps <= self.laplace_limit))
                | (self.plan_gaussian & gauss & (x >= self.gaussian_limit)))
            bad |= self.has_plan & ~fixed & ~calibrated  # kind 'over'
            if self.any_record:
                assert record_pass is not None  # returned False above otherwise
                bad |= calibrated & self.record_scope & ~(record_pass < self.allowance)
            run = calibrated & ~self.record_scope
            if run.any():
                ok = self.planned < self.allowance[:, None]
                if not ok.all():
                    bad |= run & ~ok.all(axis=1)
            if fixed.any():
                fi = np.flatnonzero(fixed)
                bad[fi] |= ~np.all(self._counts(sl.row[fi]) < sl.fixed_limit[fi, None], axis=1)
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            for j, key in reversed(created):  # as before this charge: no entry made
                del self.ledgers[j]._counts[key]
                sl.valid[j] = False
            why = self.ledgers[i].refusal(events[i], None, "", record_pass)
            if why is None:  # pragma: no cover - the block and the ledger disagree
                raise AssertionError(f"owner {i}: the block refuses a release its ledger allows")
            raise BudgetExceededError(why)

        # record: Ledger._record's additions, every owner and run at once
        self.run_eps += eps[:, None]  # + 0 where eps = 0: the same sums
        if dlt is not None:
            self.run_delta += dlt[:, None]
        self.releases += 1
        if calibrated is not None:
            self.planned += calibrated[:, None]
        if sl.span is not None:
            c, a = sl.span
            self._pool[c][a:a + k] += 1
        else:
            self._rows_op(sl.row, _add_one)
        if record_pass is not None:
            self._note_worst(events, eps, record_pass)
        return True

    def _note_worst(self, events: BlockEvents, eps: np.ndarray, p: int) -> None:
        """Ledger._record's least private release of pass p, for every owner."""
        worst = self._worst.get(p)
        if worst is None:
            worst = self._worst[p] = np.array(
                [lg._pass_worst[p].eps if p in lg._pass_worst else -np.inf
                 for lg in self.ledgers], dtype=np.float64)
        # a ledger only ever raises its worst, so this misses no owner whose worst changes
        for i in np.flatnonzero(eps > worst).tolist():
            lg, ev = self.ledgers[i], events[i]
            cur = lg._pass_worst.get(p)
            if cur is None or ev.eps > cur.eps:
                lg._pass_worst[p] = ev
            worst[i] = lg._pass_worst[p].eps


def _key_span(r: float) -> tuple[float, float]:
    """Values (lo, hi) around r that round to r at 12 digits (events.key: _round12), checked
    exactly, so by monotonicity every value between them does; (r, r) where none is found."""
    if not (math.isfinite(r) and r > 0.0):
        return r, r
    u = 10.0 ** (math.floor(math.log10(r)) - 11)  # one unit of the 12th digit
    lo, hi = r, r
    for f in (0.4999, 0.499, 0.45, 0.2):
        if lo == r and _round12(r - f * u) == r:
            lo = r - f * u
        if hi == r and _round12(r + f * u) == r:
            hi = r + f * u
    return lo, hi


def _add_one(chunk: np.ndarray, rows: np.ndarray) -> None:
    chunk[rows] += 1
