"""Accountants: a ledger's events -> total (eps, delta) under four compositions.

- basic (sequential): eps = sum of eps_j, delta = sum of delta_j;
- advanced (Dwork, Rothblum & Vadhan 2010, heterogeneous form): at total delta,
  eps' = sqrt(2 ln(1/delta') sum eps_j^2) + sum eps_j (e^eps_j - 1), delta' = delta - sum delta_j
  (for k releases of eps each: sqrt(2 k ln(1/delta')) eps + k eps (e^eps - 1));
- PLD: privacy loss distributions through dp-accounting (tight, pessimistic discretisation);
- RDP: Renyi DP through dp-accounting, as a cross-check of the PLD figure.

Negligible noise (a release of eps above EXACT_EPS, e.g. a job's eps = 1e8 or 1e300) is outside
the numerical accountants' range (dp-accounting's PLD overflows or returns inf from about 700
per release, RDP and e^eps from a little further on); there every accountant but basic reports
the exact-regime total `exact` (see there), which is finite for every finite eps.

Owners with equal budgets release equal events and share one computation, which is cached (by
the exact events, so a ledger's totals never depend on what was composed before it): a PLD of
1,000 Laplace releases costs about 0.02-2 s depending on the grid, so it is computed once per
distinct event sequence at the end of a configuration, never per agent per run and never inside
an iteration loop. dp-accounting is used with NeighboringRelation.ADD_OR_REMOVE_ONE
and noise multipliers scale / sensitivity, where the sensitivity is the full distance between the
outputs on neighbouring datasets (replace-one sensitivities in this project), i.e. 1 in those units.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping, Sequence

import numpy as np

from mpi_dp.privacy import calibration_store
from mpi_dp.privacy.events import (
    Event,
    GaussianEvent,
    LaplaceEvent,
    PureEvent,
    fsum,
    gaussian_eps,
)
from mpi_dp.privacy.ledger import Ledger

#: Finest PLD grid; coarser for large per-release eps (grid = max(this, smallest eps / 200)),
#: which keeps big compositions fast while the pessimistic estimate stays an upper bound.
PLD_MIN_INTERVAL = 1e-4
#: Per-release eps beyond which the noise is negligible and composition is exact (`exact`): the
#: PLD, RDP and advanced totals of a sequence holding such a release are `exact`'s.
EXACT_EPS = 500.0

ACCOUNTANTS_TEXT = ("basic: sum of per-release eps (and delta); advanced: Dwork-Rothblum-Vadhan at "
                    "delta' = delta - sum of per-release delta; pld: privacy loss distributions "
                    "(dp-accounting, pessimistic); rdp: Renyi DP (dp-accounting), a cross-check")

#: One row per agent of `G/privacy/ledger`, the same columns for every method: the owner's
#: target (eps, delta) and calibration rule, the per-release noise, and the totals of what the
#: contract composes (`scope`) by each accountant at the target delta; `*_all` compose every
#: release of the configuration plainly (equal to the totals unless the scope is a record, or a
#: selection whose other candidates ran in other configurations).
LEDGER_DTYPE = np.dtype([
    ("agent", "i8"),
    ("mechanism", "S32"),
    ("releases", "i8"),
    ("eps_per_release", "f8"),
    ("delta_per_release", "f8"),
    ("noise_multiplier", "f8"),
    ("target_eps", "f8"),
    ("target_delta", "f8"),
    ("calibration", "S32"),
    ("scope", "S16"),
    ("eps_basic", "f8"),
    ("eps_advanced", "f8"),
    ("eps_pld", "f8"),
    ("eps_rdp", "f8"),
    ("delta", "f8"),
    ("eps_basic_all", "f8"),
    ("eps_pld_all", "f8"),
    ("eps_rdp_all", "f8"),
    ("data_dependent", "i8"),
    ("certified", "?"),
])


@dataclasses.dataclass(frozen=True)
class Totals:
    """The composition of a sequence of releases under each accountant, at the target delta."""

    eps_basic: float
    delta_basic: float
    eps_advanced: float
    eps_pld: float
    eps_rdp: float
    delta: float


def basic(pairs: Sequence[tuple[Event, int]]) -> tuple[float, float]:
    """(sum of eps, sum of delta) over (event, count) pairs."""
    eps = fsum(c * ev.eps if c else 0.0 for ev, c in pairs)
    return eps, fsum(c * ev.delta for ev, c in pairs)


def _negligible(pairs: Sequence[tuple[Event, int]]) -> bool:
    """Whether a released event's eps is finite and above EXACT_EPS (the exact regime)."""
    return any(c > 0 and EXACT_EPS < ev.eps < math.inf for ev, c in pairs)


def exact(pairs: Sequence[tuple[Event, int]], delta: float) -> float:
    """eps at `delta` of releases in the exact regime (some release of eps > EXACT_EPS, where the
    numerical accountants overflow): the Gaussian releases composed exactly, as ONE Gaussian of
    noise multiplier (sum_j count_j / z_j^2)^-1/2 at `delta` (events.gaussian_eps: analytic, or
    its closed-form upper bound for negligible noise), plus the sum of the eps of every other
    release (basic composition, which spends no delta). A valid (eps, delta) bound for any
    sequence; for negligible noise it is the tight total as a float (k Laplace releases of eps
    e compose to k e minus O(k + log 1/delta), and k e is what k e - O(k) rounds to once e is
    huge), and it is what the PLD, RDP and advanced columns show in that regime (advanced
    composition, whose e^eps term overflows, is never below basic composition there). inf
    when a release is not private, 0 when nothing is released."""
    if not 0 < delta < 1:
        raise ValueError(f"delta must be in (0, 1), got {delta}")
    fixed = _trivial(pairs)
    if fixed is not None:
        return fixed
    live = [(ev, c) for ev, c in pairs if c > 0 and ev.eps > 0]
    inv_sq = fsum(c * _inv_sq(ev.noise_multiplier) for ev, c in live
                  if isinstance(ev, GaussianEvent))
    pure = fsum(c * ev.eps for ev, c in live if not isinstance(ev, GaussianEvent))
    gauss = gaussian_eps(1.0 / math.sqrt(inv_sq), float(delta)) if inv_sq else 0.0
    return pure + gauss


def _inv_sq(noise_multiplier: float) -> float:
    """1 / z^2 (inf, never an OverflowError, where it exceeds the largest float)."""
    r = 1.0 / noise_multiplier
    return r * r


def advanced(pairs: Sequence[tuple[Event, int]], delta: float) -> float:
    """Advanced composition at total `delta` (inf when delta is not above the per-release
    deltas); `exact` in the exact regime (a release of eps > EXACT_EPS)."""
    if not 0 < delta < 1:
        raise ValueError(f"delta must be in (0, 1), got {delta}")
    live = [(ev, c) for ev, c in pairs if c > 0]
    if not live:
        return 0.0
    if _negligible(live):
        return exact(live, delta)
    slack = delta - fsum(c * ev.delta for ev, c in live)
    if slack <= 0 or any(ev.eps > 700 for ev, _ in live):  # e^eps overflows (inf included)
        return math.inf
    sq = fsum(c * ev.eps**2 for ev, c in live)
    drift = fsum(c * ev.eps * math.expm1(ev.eps) for ev, c in live)
    return math.sqrt(2 * math.log(1 / slack) * sq) + drift


def _trivial(pairs: Sequence[tuple[Event, int]]) -> float | None:
    """0 or inf when no accountant is needed (nothing released, or a non-private release)."""
    live = [(ev, c) for ev, c in pairs if c > 0]
    if any(math.isinf(ev.eps) for ev, _ in live):
        return math.inf
    if all(ev.eps == 0 for ev, _ in live):
        return 0.0
    return None


def _pld_of(ev: Event, count: int, grid: float):
    """dp-accounting's (pessimistic) PLD of `count` releases of `ev`, public API only: a
    Laplace or Gaussian mechanism of sensitivity 1 and noise multiplier scale / sensitivity, or
    the worst case of any (eps, 0)-DP mechanism for a pure release of no named noise."""
    from dp_accounting.pld import common
    from dp_accounting.pld import privacy_loss_distribution as pldm

    if isinstance(ev, LaplaceEvent):
        return pldm.from_laplace_mechanism(ev.scale / ev.l1_sensitivity,
                                           value_discretization_interval=grid
                                           ).self_compose(int(count))
    if isinstance(ev, GaussianEvent):  # k Gaussians compose to one of noise z / sqrt(k)
        return pldm.from_gaussian_mechanism(ev.noise_multiplier / math.sqrt(count),
                                            value_discretization_interval=grid)
    return pldm.from_privacy_parameters(common.DifferentialPrivacyParameters(ev.eps, 0.0),
                                        value_discretization_interval=grid
                                        ).self_compose(int(count))


def pld(pairs: Sequence[tuple[Event, int]], delta: float) -> float:
    """Tight eps at `delta` from privacy loss distributions (dp-accounting's public PLD API:
    pessimistic discretisation, so an upper bound); `exact` in the exact regime."""
    fixed = _trivial(pairs)
    if fixed is not None:
        return fixed
    if _negligible(pairs):
        return exact(pairs, delta)
    live = [(ev, c) for ev, c in pairs if c > 0 and ev.eps > 0]
    grid = max(PLD_MIN_INTERVAL, min(ev.eps for ev, _ in live) / 200)
    total = None
    for ev, c in live:
        one = _pld_of(ev, c, grid)
        total = one if total is None else total.compose(one)
    assert total is not None  # live is not empty: not _trivial
    return float(total.get_epsilon_for_delta(delta))


def rdp(pairs: Sequence[tuple[Event, int]], delta: float) -> float:
    """eps at `delta` from Renyi DP (dp-accounting's default orders); `exact` in the exact
    regime."""
    fixed = _trivial(pairs)
    if fixed is not None:
        return fixed
    if _negligible(pairs):
        return exact(pairs, delta)
    from dp_accounting import NeighboringRelation
    from dp_accounting.rdp import rdp_privacy_accountant

    acc = rdp_privacy_accountant.RdpAccountant(
        neighboring_relation=NeighboringRelation.ADD_OR_REMOVE_ONE)
    for ev, c in pairs:
        if c > 0:
            acc.compose(ev.to_dp_event(), int(c))
    return float(acc.get_epsilon(delta))


_CACHE: dict[tuple, Totals] = {}


def _canonical(ev: Event) -> tuple[tuple, Event]:
    """(key, event): what the accountants read of a release (Laplace: its eps; Gaussian: its
    noise multiplier and delta; pure: its eps), exactly, with a canonical event that has just
    that. Owners whose data-dependent sensitivities differ but whose releases have equal eps
    (e.g. ADMM's local sensitivity with scale = sensitivity / eps) share one computation."""
    if isinstance(ev, LaplaceEvent):
        e = float(ev.eps)
        return ("laplace", e), (LaplaceEvent(1.0, 0.0) if math.isinf(e) else LaplaceEvent(e, 1.0))
    if isinstance(ev, GaussianEvent):
        nm, d = float(ev.noise_multiplier), float(ev.delta)
        can = GaussianEvent(0.0, 1.0, d) if math.isinf(nm) else GaussianEvent(1.0, nm, d)
        return ("gaussian", nm, d), can
    return ("pure", float(ev.eps)), PureEvent(float(ev.eps), "pure")


def compose(pairs: Sequence[tuple[Event, int]], delta: float) -> Totals:
    """Totals of the releases `pairs` under every accountant. Computed from the canonical events
    (`_canonical`; equal keys merged, counts added) in a fixed order and cached by them, so the
    totals are a function of what was released alone: never the answer of an earlier, nearly
    equal ledger (e.g. another configuration's per-release eps one ulp away), which would make a
    configuration's ledger depend on the configurations run before it."""
    return _totals(*_signature(pairs, delta))


def _signature(pairs: Sequence[tuple[Event, int]], delta: float
               ) -> tuple[tuple, list[tuple[Event, int]]]:
    """`compose`'s cache key of `pairs` at delta, and the canonical pairs it composes."""
    merged: dict[tuple, list] = {}
    for ev, c in pairs:
        if c > 0:
            key, can = _canonical(ev)
            merged.setdefault(key, [can, 0])[1] += int(c)
    live = sorted(((key, c, can) for key, (can, c) in merged.items()), key=lambda t: t[:2])
    return (tuple((k, c) for k, c, _ in live), float(delta)), [(ev, c) for _, c, ev in live]


def _totals(sig: tuple, canon: list[tuple[Event, int]]) -> Totals:
    """The totals of a signature: known in this process, else stored on disk by an earlier job
    (a composition that needs dp-accounting: `_stored_key`), else composed here (and stored)."""
    hit = _CACHE.get(sig)
    if hit is None:
        key = _stored_key(sig) if _trivial(canon) is None and not _negligible(canon) else None
        value = None if key is None else calibration_store.load(key)
        got = None if value is None else calibration_store.floats(value.get("totals"),
                                                                  TOTALS_FIELDS)
        if got is not None:
            hit = Totals(**got)
        else:
            delta = sig[1]
            eps_b, delta_b = basic(canon)
            hit = Totals(eps_b, delta_b, advanced(canon, delta), pld(canon, delta),
                         rdp(canon, delta), float(delta))
            if key is not None:
                calibration_store.save(key, {"totals": calibration_store.hexes(
                    dataclasses.asdict(hit))})
        _CACHE[sig] = hit
    return hit


#: the Totals fields, as the calibration cache stores them (by float.hex)
TOTALS_FIELDS = tuple(f.name for f in dataclasses.fields(Totals))


def _stored_key(sig: tuple) -> dict | None:
    """The calibration cache's key of a signature (privacy.calibration_store: the canonical
    events, counts and delta stated exactly; None where it cannot state them). A job whose
    ledgers an earlier job composed reads their totals there, the bits that job found, and
    imports no dp-accounting (about a second and a half)."""
    try:
        return {"rule": "totals", "signature": calibration_store.encode(sig)}
    except calibration_store.Uncachable:
        return None


def ledger_compositions(ledgers: Iterable[Ledger], delta: float) -> dict[tuple, list]:
    """The compositions `ledger_rows(ledgers, delta)` makes ({cache key: canonical pairs}): a
    rank that composes its hosted ledgers' rows gets the totals from the rank that calibrated
    (`composed` there, `remember` here) instead of composing privacy loss distributions again."""
    out: dict[tuple, list] = {}
    for led in ledgers:
        d = _ledger_delta(led, delta)
        for pairs in (led.scope_pairs(), *(() if led.scope == "configuration" else
                                           (led.worst_counts(),))):
            sig, canon = _signature(pairs, d)
            out.setdefault(sig, canon)
    return out


def composed(needed: Mapping[tuple, list]) -> dict[tuple, Totals]:
    """The totals of `ledger_compositions`' keys (computed here, or cached)."""
    return {sig: _totals(sig, canon) for sig, canon in needed.items()}


def remember(totals: Mapping[tuple, Totals]) -> None:
    """Cache totals `composed` elsewhere: the same keys give the same totals everywhere."""
    _CACHE.update(totals)


def _ledger_delta(led: Ledger, delta: float) -> float:
    return float(led.target.plan.delta) if led.target is not None else float(delta)


def _noise_multiplier(pairs: Sequence[tuple[Event, int]]) -> float:
    """Noise scale / sensitivity of the least noisy Laplace or Gaussian release (NaN: none)."""
    nms = [1.0 / ev.eps if isinstance(ev, LaplaceEvent) else ev.noise_multiplier
           for ev, _ in pairs if isinstance(ev, LaplaceEvent | GaussianEvent) and ev.eps > 0]
    return min(nms) if nms else math.nan


def in_agent_order(parts: Iterable[np.ndarray]) -> np.ndarray:
    """`ledger_rows` computed where the ledgers live (each rank its hosted agents'), gathered:
    one table in agent order. A row depends on its ledger alone, so it is the row rank 0 would
    compute from the gathered ledgers, without pickling thousands of them."""
    rows = np.concatenate([np.asarray(p, dtype=LEDGER_DTYPE) for p in parts])
    return rows[np.argsort(rows["agent"], kind="stable")]


def ledger_rows(ledgers: Iterable[Ledger], delta: float) -> np.ndarray:
    """`privacy/ledger`: one LEDGER_DTYPE row per ledger (agent order as given).

    Counts are the largest over runs (an upper bound for every run). A ledger with a target
    (privacy.contract) is composed at its target delta over its scope; one without (a method
    that states no contract) at `delta`, with target_eps its basic budget.
    """
    rows = []
    for led in ledgers:
        pairs = led.worst_counts()
        target = led.target
        d = _ledger_delta(led, delta)
        tot = compose(led.scope_pairs(), d)
        every = tot if led.scope == "configuration" else compose(pairs, d)
        mech = "+".join(sorted({ev.mechanism for ev, _ in pairs})) or "none"
        rows.append((
            led.agent, mech.encode(), int(led.releases.max()),
            max((ev.eps for ev, _ in pairs), default=0.0),
            max((ev.delta for ev, _ in pairs), default=0.0),
            _noise_multiplier(pairs),
            float(target.plan.eps) if target is not None else led.budget_eps,
            d, (target.name if target is not None else "none").encode(), led.scope.encode(),
            tot.eps_basic, tot.eps_advanced, tot.eps_pld, tot.eps_rdp, tot.delta,
            every.eps_basic, every.eps_pld, every.eps_rdp,
            sum(c for ev, c in pairs if ev.data_dependent),
            all(ev.certified and not ev.data_dependent for ev, _ in pairs),
        ))
    return np.array(rows, dtype=LEDGER_DTYPE)
