"""Calibration: the per-release noise that makes an owner's release plan meet its (eps, delta).

For every method, `eps` and `delta` are what one owner (peer) is promised for its records over one
configuration of the job (replace-one neighbouring datasets: two datasets of the owner differ in
one record), composed over every release that depends on them. A method states its *release plan*
per owner (a `Plan`: how many releases of which mechanism, composed over what), and a rule
(privacy.rules) turns the plan into a `Calibration`, the owner's noise:

- `pld` (default): the largest per-release privacy whose composition by privacy loss distributions
  (dp-accounting, pessimistic, the accountant the ledger reports) is at most eps at delta, found by
  a bracketed root search over the noise multiplier, as Opacus's `get_noise_multiplier` does for
  DP-SGD; never looser than the pure-eps split where that is tighter (it is the search's start);
- `basic`: the even split of basic composition (eps / k per release, and delta / k for Gaussian);
- a paper rule (privacy.rules: basic_split of seeds 001 / 000, per_iteration of seed 002,
  per_release of seed 003, theorem1 of seed 004): the paper's own formulas, bit for bit, as a
  `Calibration` subclass; the ledger shows what they achieve.

A `Calibration` is what an owner's release path asks for its noise (`scale` of a `Sensitivity`,
`eps_release`, `gaussian_delta`, `release_budgets`...), whatever the rule: the algorithm never
sees which rule made it.

Negligible noise (a plan whose eps per calibrated release exceeds accountants.EXACT_EPS, e.g.
eps = 1e8 or 1e300) is calibrated in closed form, with no search (`_exact`): composition is exact
there (accountants.exact) and the pld rule's noise is the pure split k / eps (Laplace) or the
Gaussian whose composition is eps exactly (events.gaussian_noise_multiplier); the noise is tiny
but positive, never an overflow, and what the ledger reports totals eps to rounding.

Calibrations depend on the plan alone and are cached per distinct plan (owners with equal budgets
and equal plans share one search; never one per owner per run), and across jobs on disk
(privacy.calibration_store: the next job with the same plan reads the same bits, no search).
Sensitivities do not enter: the calibration fixes the noise multiplier (noise scale /
sensitivity), and each release's noise is that multiplier times its own sensitivity.

A search can be long (its compositions grow with the number of releases: privacy.
calibration_cost), so it counts its accountant evaluations (`evaluations`, for progress lines)
and one running in a thread stops before the next once cancelled (`cancel_thread`: Cancelled,
nothing cached; privacy.calibration_run).

Pure: no MPI. dp-accounting is imported on first use (a search; never for a stored plan).
"""

from __future__ import annotations

import dataclasses
import math
import sys
import threading
import weakref
from collections.abc import Callable, Sequence
from typing import overload

import numpy as np

from mpi_dp.privacy import accountants, calibration_store
from mpi_dp.privacy.events import (
    Event,
    GaussianEvent,
    LaplaceEvent,
    fsum,
    gaussian_eps,
    gaussian_noise_multiplier,
)

#: calibration rules of the job key privacy.calibration (the default first)
RULES = ("pld", "basic", "paper")
RULE_TEXT = {
    "pld": "tight: the per-release noise whose composition by privacy loss distributions "
           "(dp-accounting) meets (eps, delta) exactly, to 1e-4",
    "basic": "the even split of basic composition: eps / k per release (and delta / k for a "
             "Gaussian)",
    "paper": "the method's paper's own rule (see the method's guarantee)",
}
#: what a plan's guarantee composes over
SCOPES = ("configuration", "record", "selection")
MECHANISMS = ("laplace", "gaussian")
#: relative precision of the search (in the noise multiplier)
SEARCH_RTOL = 1e-5


def default_delta(n: int) -> float:
    """The largest power of ten at most 1/(10 n): a delta sound for an owner of n records (a
    mechanism may publish one whole record with probability delta; 1/(10 n) keeps that well
    below what publishing a random record costs). 1e-5 for an owner of 1 record or none."""
    if n <= 1:
        return 1e-5 if n <= 0 else 0.01
    digits = len(str(10 * int(n) - 1))  # 10 ** digits >= 10 n
    return float(f"1e-{digits}")


def resolve_delta(value: float | str, n: int, owner: int, where: str = "privacy.delta") -> float:
    """An owner's target delta: `value`, or default_delta(n) for 'auto'; a delta at or above
    1/n_i (n_i > 0) is refused with a message naming the owner and n_i."""
    if value == "auto":
        return default_delta(n)
    d = float(value)
    if not 0.0 < d < 1.0:
        raise ValueError(f"key '{where}': delta must be in (0, 1), got {value!r}")
    if n > 0 and d * n >= 1.0:
        raise ValueError(
            f"key '{where}': delta = {d:g} is at or above 1/n_i = 1/{n} for owner {owner} "
            f"(n_i = {n} records): a mechanism could then publish one of its records outright "
            f"and still be (eps, delta)-DP; use delta < 1/{n} (e.g. {default_delta(n):g}, what "
            "'auto' gives)")
    return d


@dataclasses.dataclass(frozen=True)
class Sensitivity:
    """A release's sensitivity `value` with the `terms` a paper's own formula reads (e.g. the
    clipping bound and n_i of a mean of n_i clipped vectors: `Sensitivity.mean`). Calibrated
    rules use the value alone; a plain float is a Sensitivity without terms."""

    value: float
    terms: tuple[tuple[str, float], ...] = ()

    @classmethod
    def mean(cls, bound: float, n: int) -> Sensitivity:
        """A mean of n vectors each of norm <= bound, replace-one: 2 bound / n."""
        return cls(2 * bound / n, (("bound", float(bound)), ("n", int(n))))

    @classmethod
    def of(cls, value: float, **terms: float) -> Sensitivity:
        return cls(float(value), tuple(terms.items()))

    def term(self, name: str) -> float:
        """The term `name` (ValueError naming the terms given where it is missing)."""
        for k, v in self.terms:
            if k == name:
                return v
        raise ValueError(f"this release's sensitivity states no term {name!r} (it has "
                         f"{[k for k, _ in self.terms] or 'none'}): the rule's formula needs it")

    def __float__(self) -> float:
        return float(self.value)


def sensitivity_value(sensitivity: float | Sensitivity) -> float:
    """The value of a sensitivity given as a number or a Sensitivity."""
    return sensitivity.value if isinstance(sensitivity, Sensitivity) else sensitivity


@dataclasses.dataclass(frozen=True)
class Plan:
    """What one owner releases in a configuration, as far as its guarantee is concerned.

    `releases` releases of `mechanism` whose noise is calibrated (each noise = multiplier x its
    own sensitivity), composed with the `fixed` releases (their noise set elsewhere, e.g. a
    warm start), must meet (eps, delta). `scope`: what the composition covers: the owner's
    releases in the configuration, the releases that touch one record (a single pass: later
    releases are post-processing), or every candidate of a private selection.
    """

    mechanism: str
    releases: int
    eps: float
    delta: float
    fixed: tuple[Event, ...] = ()
    scope: str = "configuration"

    def __post_init__(self) -> None:
        if self.mechanism not in MECHANISMS:
            raise ValueError(f"mechanism must be one of {MECHANISMS}, got {self.mechanism!r}")
        if self.releases < 0:
            raise ValueError(f"releases must be >= 0, got {self.releases}")
        if not (self.eps > 0):
            raise ValueError(f"eps must be > 0, got {self.eps}")
        if not 0.0 < self.delta < 1.0:
            raise ValueError(f"delta must be in (0, 1), got {self.delta}")
        if self.scope not in SCOPES:
            raise ValueError(f"scope must be one of {SCOPES}, got {self.scope!r}")


@dataclasses.dataclass(frozen=True)
class Calibration:
    """The calibrated noise of a plan: every calibrated release adds noise of scale
    `noise_multiplier` x its sensitivity (Laplace: scale / L1 sensitivity; Gaussian: sigma / L2
    sensitivity; 0: no noise, eps = inf). `rule` is pld, basic or paper; `paper` names the paper
    rule; `planned` holds the plan's totals (privacy.accountants.Totals) at its delta."""

    rule: str
    plan: Plan
    noise_multiplier: float
    paper: str = ""
    planned: accountants.Totals | None = None

    @property
    def private(self) -> bool:
        return self.noise_multiplier > 0 or self.plan.releases == 0

    @property
    def name(self) -> str:
        """'pld', 'basic' or 'paper:<rule>' (the ledger's calibration column)."""
        return f"paper:{self.paper}" if self.rule == "paper" and self.paper else self.rule

    @property
    def eps_release(self) -> float:
        """eps of one calibrated release (Gaussian: at the plan's delta); inf without noise."""
        return _release_eps(self.plan.mechanism, self.noise_multiplier, self.plan.delta)

    # -- what an owner's release path asks, the same questions under every rule ---------------
    # (a paper rule, privacy.rules, answers them with its paper's formulas)
    def scale(self, sensitivity: float | Sensitivity) -> float:
        """The noise scale of a release of `sensitivity` (Laplace b, Gaussian sigma): the
        multiplier x its value (honest_scale)."""
        return honest_scale(self.noise_multiplier, float(sensitivity_value(sensitivity)))

    @property
    def gaussian_delta(self) -> float:
        """The delta each Gaussian release is stated at (the plan's)."""
        return self.plan.delta

    @property
    def certified(self) -> bool:
        """Whether this noise is shown to give what it states (a paper rule's formula used
        outside its proof is not)."""
        return True

    def ledger_budget(self) -> tuple[float, float]:
        """The owner ledger's basic-composition budget (eps, delta): none (inf, inf) where the
        calibrated plan itself limits the ledger."""
        return math.inf, math.inf

    def classical_eps(self, delta: float) -> float:
        """The per-release eps whose classical Gaussian sigma (sqrt(2 ln(1.25/delta)) / eps per
        unit of sensitivity) is this noise's (a Laplace plan: its eps_release); inf without
        noise."""
        if self.plan.mechanism == "laplace":
            return self.eps_release
        nm = self.noise_multiplier
        return math.inf if nm == 0 else math.sqrt(2 * math.log(1.25 / delta)) / nm

    def release_budgets(self, count: int, *, steps: np.ndarray | None = None,
                        horizon: int = 0, kappa: float | None = None) -> np.ndarray:
        """The eps of each of `count` releases (e_1..e_count): the calibrated eps_release each
        (`steps`, `horizon`, `kappa`: where a paper's split reads the schedule)."""
        return np.full(int(count), self.eps_release)

    def event(self, sensitivity: float, *, scale: float | None = None,
              data_dependent: bool = False, certified: bool = True,
              delta: float | None = None) -> Event:
        """The event of one release of `sensitivity` (noise `scale`, default this noise's;
        Gaussian: stated at `delta`, default `gaussian_delta`)."""
        sc = self.scale(sensitivity) if scale is None else float(scale)
        if self.plan.mechanism == "laplace":
            return LaplaceEvent(sensitivity, sc, data_dependent=data_dependent,
                                certified=certified)
        return GaussianEvent(sensitivity, sc, self.gaussian_delta if delta is None else delta,
                             data_dependent=data_dependent, certified=certified)

    def unit_event(self) -> Event:
        """One calibrated release in privacy units (sensitivity 1)."""
        return self.event(1.0)

    def text(self) -> str:
        """One line for the output: rule, per-release noise and what the plan composes to."""
        p = self.plan
        if self.rule == "paper" and not self.noise_multiplier >= 0:  # set by the method
            return (f"{self.name}: the paper's own noise for eps={p.eps:g} in the paper's unit "
                    f"({p.releases} release(s) per {p.scope}; what they compose to: "
                    "privacy/ledger)")
        if self.noise_multiplier == 0:
            why = "eps = inf" if math.isinf(p.eps) else "no calibrated release"
            return f"{self.name}: no noise ({why}) per {p.scope}"
        per = (f"Laplace, scale/sensitivity {self.noise_multiplier:.6g} (eps {self.eps_release:.6g}"
               " per release)" if p.mechanism == "laplace" else
               f"Gaussian, sigma/sensitivity {self.noise_multiplier:.6g}")
        tot = ""
        if self.planned is not None:
            tot = (f"; planned totals at delta={p.delta:g}: PLD {self.planned.eps_pld:.6g}, RDP "
                   f"{self.planned.eps_rdp:.6g}, basic {self.planned.eps_basic:.6g}")
        fixed = f" + {len(p.fixed)} fixed release(s)" if p.fixed else ""
        return (f"{self.name}: {p.releases} release(s){fixed} per {p.scope} for "
                f"(eps={p.eps:g}, delta={p.delta:g}); {per}{tot}")


@overload
def honest_scale(noise_multiplier: float, sensitivity: float) -> float: ...
@overload
def honest_scale(noise_multiplier: float | np.ndarray, sensitivity: float | np.ndarray
                 ) -> float | np.ndarray: ...
def honest_scale(noise_multiplier: float | np.ndarray, sensitivity: float | np.ndarray
                 ) -> float | np.ndarray:
    """noise_multiplier x sensitivity, never below its exact value where the product leaves the
    normal floats (negligible noise on a tiny sensitivity: rounded up to the next float, at least
    the smallest positive one), so the release is never less private than calibrated and never
    silently noiseless (a scale of 0 would be eps = inf); elsewhere the plain product."""
    if np.ndim(noise_multiplier) == 0 and np.ndim(sensitivity) == 0:  # the scalar hot path
        x = float(noise_multiplier) * float(sensitivity)
        if x < _FLOAT_MIN and noise_multiplier > 0 and sensitivity > 0:
            x = math.nextafter(x, math.inf)
        return x
    out = np.multiply(noise_multiplier, sensitivity, dtype=np.float64)
    tiny = (out < _FLOAT_MIN) & (np.asarray(noise_multiplier) > 0) & (np.asarray(sensitivity) > 0)
    return np.where(tiny, np.nextafter(out, np.inf), out) if np.any(tiny) else out


_FLOAT_MIN = sys.float_info.min


def _release_eps(mechanism: str, nm: float, delta: float) -> float:
    if nm == 0:
        return math.inf
    if mechanism == "laplace":
        return 1.0 / nm
    return gaussian_eps(nm, delta)


def _unit(mechanism: str, nm: float, delta: float) -> Event:
    if mechanism == "laplace":
        return LaplaceEvent(1.0, nm)
    return GaussianEvent(1.0, nm, delta)


def planned_pairs(plan: Plan, nm: float, releases: int | None = None) -> list[tuple[Event, int]]:
    """The plan's releases as (event, count) pairs at noise multiplier `nm`."""
    k = plan.releases if releases is None else releases
    pairs: list[tuple[Event, int]] = [(_unit(plan.mechanism, nm, plan.delta), k)] if k else []
    fixed: dict[Event, int] = {}
    for ev in plan.fixed:
        fixed[ev] = fixed.get(ev, 0) + 1
    return pairs + list(fixed.items())


def _fixed_eps(plan: Plan) -> tuple[float, float]:
    return (fsum(ev.eps for ev in plan.fixed), fsum(ev.delta for ev in plan.fixed))


def _basic(plan: Plan) -> float:
    """The noise multiplier of the even basic split of what the fixed releases leave."""
    eps_f, delta_f = _fixed_eps(plan)
    eps_left, delta_left = plan.eps - eps_f, plan.delta - delta_f
    if not eps_left > 0 or (plan.mechanism == "gaussian" and not delta_left > 0):
        raise ValueError(_no_room(plan, eps_f))
    e = eps_left / plan.releases
    if plan.mechanism == "laplace":
        return 1.0 / e
    return gaussian_noise_multiplier(e, delta_left / plan.releases)


def _no_room(plan: Plan, eps_fixed: float) -> str:
    return (f"the fixed releases alone (eps {eps_fixed:.4g}) leave no room in the owner's eps = "
            f"{plan.eps:g}: lower them or raise eps")


class Cancelled(Exception):
    """A calibration stopped on request (`cancel_thread`) between two accountant evaluations."""


_cancelled: weakref.WeakSet[threading.Thread] = weakref.WeakSet()  # their searches stop
_evaluations = 0


def cancel_thread(thread: threading.Thread) -> None:
    """Stop the calibration running in `thread` before its next accountant evaluation."""
    _cancelled.add(thread)


def evaluations() -> int:
    """Accountant evaluations of the searches so far in this process (progress lines)."""
    return _evaluations


def _step() -> None:
    """Before an accountant evaluation: stop if this thread was cancelled, else count it."""
    global _evaluations
    me = threading.current_thread()
    if me in _cancelled:
        _cancelled.discard(me)
        raise Cancelled("the noise calibration was stopped")
    _evaluations += 1


def _search(total: Callable[[float], float], x0: float, target: float,
            watched: bool = True) -> float:
    """The largest x with total(x) <= target for total increasing in x (x: privacy per release,
    the inverse noise multiplier): an expanding bracket from x0, then Brent's method in log x,
    then the feasible side of the root (the answer is always one that was evaluated).
    `watched`: each evaluation is counted and may be cancelled (`_step`)."""
    from scipy import optimize

    memo: dict[float, float] = {}

    def f(x: float) -> float:
        if x not in memo:
            if watched:
                _step()
            memo[x] = total(x)
        return memo[x]

    lo = x0
    for _ in range(200):
        if f(lo) <= target:
            break
        lo /= 2.0
    else:
        raise ValueError("no noise level meets the target (the fixed releases exceed it?)")
    hi = lo * 2.0
    for _ in range(200):
        if f(hi) > target:
            break
        lo, hi = hi, hi * 2.0
    else:
        raise ValueError("the privacy accountant never exceeds the target")
    root = math.exp(optimize.brentq(lambda u: f(math.exp(u)) - target, math.log(lo),
                                    math.log(hi), xtol=SEARCH_RTOL / 4, rtol=SEARCH_RTOL / 4))
    best = max((x for x, v in memo.items() if v <= target), default=lo)
    for _ in range(60):  # step down from the root onto the feasible side if it is not already
        if root <= best or f(root) <= target:
            break
        root *= 1.0 - SEARCH_RTOL
    return max(best, root) if f(max(best, root)) <= target else best


def _exact(plan: Plan) -> float:
    """The tight noise multiplier where the noise is negligible (accountants.exact composes the
    plan exactly): Laplace k / (eps - what the fixed releases take); Gaussian: the k releases
    are one Gaussian of noise z / sqrt(k) (with any fixed Gaussian merged in the same way) whose
    eps at delta is what the fixed pure releases leave (events.gaussian_noise_multiplier)."""
    k, d = plan.releases, plan.delta
    fixed = [(ev, 1) for ev in plan.fixed]
    if plan.mechanism == "laplace":
        left = plan.eps - accountants.exact(fixed, d)
        if not left > 0:
            raise ValueError(_no_room(plan, _fixed_eps(plan)[0]))
        return k / left
    pure = fsum(ev.eps for ev in plan.fixed if not isinstance(ev, GaussianEvent))
    fixed_inv_sq = fsum((1.0 / ev.noise_multiplier) * (1.0 / ev.noise_multiplier)
                        for ev in plan.fixed if isinstance(ev, GaussianEvent) and ev.eps > 0)
    z = gaussian_noise_multiplier(plan.eps - pure, d) if plan.eps > pure else 0.0
    room = (1.0 / z) * (1.0 / z) - fixed_inv_sq if z > 0 else 0.0
    if not room > 0:
        raise ValueError(_no_room(plan, _fixed_eps(plan)[0]))
    return math.sqrt(k / room)


def _pld(plan: Plan) -> float:
    """The noise multiplier of the tight calibration (see the module docstring)."""
    eps_f, _ = _fixed_eps(plan)
    if plan.fixed and accountants.pld([(ev, 1) for ev in plan.fixed], plan.delta) >= plan.eps:
        raise ValueError(_no_room(plan, eps_f))
    if (plan.eps - eps_f) / plan.releases > accountants.EXACT_EPS:  # negligible noise
        return _exact(plan)

    def total(x: float) -> float:
        nm = 1.0 / x
        return accountants.pld(planned_pairs(plan, nm), plan.delta)

    return 1.0 / _search(total, search_start(plan), plan.eps)


def searched(plan: Plan) -> bool:
    """Whether the pld rule searches this plan (not: no noise, or negligible noise in closed
    form)."""
    if math.isinf(plan.eps) or plan.releases == 0:
        return False
    return (plan.eps - _fixed_eps(plan)[0]) / plan.releases <= accountants.EXACT_EPS


def search_start(plan: Plan) -> float:
    """Where the pld search starts (privacy per release): the pure split for Laplace (never
    looser than it), the exact analytic start for Gaussian (k Gaussians are one of noise
    z / sqrt(k))."""
    eps_f, _ = _fixed_eps(plan)
    if plan.mechanism == "laplace":
        return max((plan.eps - eps_f) / plan.releases, 1e-300) if plan.eps > eps_f else \
            plan.eps / plan.releases
    sigma = gaussian_noise_multiplier(max(plan.eps - eps_f, plan.eps / 2), plan.delta)
    return 1.0 / (sigma * math.sqrt(plan.releases))


_CACHE: dict[tuple[str, Plan], Calibration] = {}


def calibrate(plan: Plan, rule: str) -> Calibration:
    """The calibration of `plan` under `rule` ('pld' or 'basic'; 'paper' rules are computed by
    their method: see `paper`). Cached per distinct (rule, plan). Raises ValueError when the
    plan cannot meet its target (e.g. fixed releases that spend it all)."""
    if rule not in ("pld", "basic"):
        raise ValueError(f"calibration rule must be 'pld' or 'basic' here, got {rule!r}")
    hit = _CACHE.get((rule, plan)) or _stored(plan, rule)
    if hit is not None:
        return hit
    if math.isinf(plan.eps) or plan.releases == 0:  # nothing to calibrate: no noise
        if plan.fixed and not math.isinf(plan.eps) and accountants.pld(
                [(ev, 1) for ev in plan.fixed], plan.delta) > plan.eps:
            raise ValueError(_no_room(plan, _fixed_eps(plan)[0]))
        cal = Calibration(rule, plan, 0.0)
    else:
        nm = _pld(plan) if rule == "pld" else _basic(plan)
        _step()  # the planned totals: one more composition
        cal = Calibration(rule, plan, nm, planned=accountants.compose(planned_pairs(plan, nm),
                                                                      plan.delta))
        _store(cal)
    _CACHE[(rule, plan)] = cal
    return cal


def paper(plan: Plan, name: str, noise_multiplier: float) -> Calibration:
    """The record of a paper rule `name` (its noise computed by the method, bit for bit as the
    paper's code): the plan's target and what the rule's noise composes to."""
    planned = None
    if noise_multiplier > 0 and plan.releases and math.isfinite(noise_multiplier):
        planned = accountants.compose(planned_pairs(plan, noise_multiplier), plan.delta)
    return Calibration("paper", plan, noise_multiplier, paper=name, planned=planned)


def cached(plan: Plan, rule: str) -> bool:
    """Whether calibrate(plan, rule) is known in this process or stored on disk by an earlier
    job (privacy.calibration_store): it costs nothing then."""
    return (rule, plan) in _CACHE or _stored(plan, rule) is not None


def _store_parts(plan: Plan, rule: str) -> dict | None:
    """The disk cache's key of (rule, plan), or None for a plan it cannot state exactly."""
    try:
        return {"rule": rule, "plan": calibration_store.encode(plan)}
    except calibration_store.Uncachable:
        return None


def _stored(plan: Plan, rule: str) -> Calibration | None:
    """A calibration with noise of (rule, plan) stored by an earlier job (the bits it found),
    kept in this process's cache too; None when there is none (or the cache is off)."""
    if rule not in ("pld", "basic") or math.isinf(plan.eps) or plan.releases == 0:
        return None
    parts = _store_parts(plan, rule)
    value = None if parts is None else calibration_store.load(parts)
    if value is None:
        return None
    nm = calibration_store.floats(value.get("noise_multiplier"), ("nm",))
    planned = calibration_store.floats(value.get("planned"), accountants.TOTALS_FIELDS)
    if nm is None or planned is None or not nm["nm"] > 0:
        return None
    cal = Calibration(rule, plan, nm["nm"], planned=accountants.Totals(**planned))
    _CACHE[(rule, plan)] = cal
    return cal


def _store(cal: Calibration) -> None:
    """Store a calibration with noise for later jobs (nothing where the plan cannot be stated)."""
    parts = _store_parts(cal.plan, cal.rule)
    if parts is None or cal.planned is None:
        return
    calibration_store.save(parts, {
        "noise_multiplier": calibration_store.hexes({"nm": cal.noise_multiplier}),
        "planned": calibration_store.hexes(dataclasses.asdict(cal.planned))})


def calibrate_all(plans: Sequence[Plan | None], rule: str) -> list[Calibration | None]:
    """calibrate() of every plan (None stays None), each distinct plan searched once."""
    return [None if p is None else calibrate(p, rule) for p in plans]
