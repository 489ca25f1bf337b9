"""Mechanism events: small frozen records of one DP release, in the shape of dp-accounting's dp_event.

A mechanism returns the noised value together with the event that names it and its parameters;
the owner's ledger charges events and the accountants turn a ledger's events into (eps, delta).
An event knows its own per-release guarantee (`eps`, `delta`) and how to describe itself to
dp-accounting (`to_dp_event`). Two flags say when the guarantee does not hold as calibrated:

- `data_dependent`: the noise scale was set from private data (e.g. admm's `local_max`
  sensitivity), so the release is not DP as stated even if the arithmetic below is right;
- `certified = False`: the mechanism is not the one the calibration assumes (no clipping, one
  scalar draw on every coordinate, a standard deviation other than the calibrated one, ...).

Pure Python/NumPy; dp-accounting is imported only to describe or evaluate Gaussian events.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any, ClassVar


def fsum(values: Any) -> float:
    """math.fsum (exactly rounded), but +-inf where the exact sum of finite values lies beyond the
    largest float (math.fsum raises OverflowError there): totals of negligible-noise eps."""
    xs = list(values)
    try:
        return math.fsum(xs)
    except OverflowError:
        return math.copysign(math.inf, sum(xs))


def _check(name: str, value: float) -> float:
    value = float(value)
    if math.isnan(value) or value < 0:
        raise ValueError(f"{name} must be a non-negative number, got {value}")
    return value


def _round12(x: float) -> float:
    """x to 12 significant digits: equal calibrations computed along different float paths
    (e.g. sigma/Delta recomputed every iteration) share one accounting key."""
    return float(f"{x:.12g}") if math.isfinite(x) else x


@dataclass(frozen=True)
class LaplaceEvent:
    """I.i.d. Laplace(0, scale) noise on every coordinate of a value of L1 sensitivity
    `l1_sensitivity` (neighbouring datasets move the value by at most that in L1 norm).

    Per release: (l1_sensitivity / scale, 0)-DP. scale = 0 (no noise) with a positive sensitivity
    is not private (eps = inf); a zero sensitivity releases nothing about the data (eps = 0).
    """

    l1_sensitivity: float
    scale: float
    data_dependent: bool = False
    certified: bool = True

    mechanism: ClassVar[str] = "laplace"

    def __post_init__(self) -> None:
        object.__setattr__(self, "l1_sensitivity", _check("l1_sensitivity", self.l1_sensitivity))
        object.__setattr__(self, "scale", _check("scale", self.scale))

    @property
    def eps(self) -> float:
        if self.l1_sensitivity == 0.0:
            return 0.0
        if self.scale == 0.0:
            return math.inf
        return self.l1_sensitivity / self.scale

    @property
    def delta(self) -> float:
        return 0.0

    def key(self) -> tuple:
        """What accounting depends on: releases with equal keys compose alike."""
        return ("laplace", _round12(self.eps), self.data_dependent, self.certified)

    def to_dp_event(self) -> Any:
        """dp-accounting's LaplaceDpEvent with noise_multiplier = scale / sensitivity (use with
        NeighboringRelation.ADD_OR_REMOVE_ONE: sensitivity 1 in those units)."""
        from dp_accounting import dp_event

        if self.l1_sensitivity == 0.0:
            return dp_event.NoOpDpEvent()
        if self.scale == 0.0:
            return dp_event.NonPrivateDpEvent()
        return dp_event.LaplaceDpEvent(noise_multiplier=self.scale / self.l1_sensitivity)


#: Below this noise multiplier (eps above about 5e7 per release) a Gaussian's eps is the closed
#: form `gaussian_eps_bound`: dp-accounting's analytic search overflows there (from about 1e-10).
GAUSSIAN_BOUND_NM = 1e-4
#: Above this eps `gaussian_noise_multiplier` inverts the closed form (dp-accounting's
#: get_sigma_gaussian overflows from about 5e7); its noise multipliers at 1e7 (2.2e-4) lie above
#: GAUSSIAN_BOUND_NM, so eps(noise multiplier(eps)) <= eps on both sides of either switch.
GAUSSIAN_BOUND_EPS = 1e7


def _z(delta: float) -> float:
    """Phi^-1(1 - delta), the standard normal quantile, accurate for tiny delta."""
    from scipy.special import ndtri

    return -float(ndtri(delta))


def gaussian_eps_bound(noise_multiplier: float, delta: float) -> float:
    """eps = mu + z sqrt(2 mu) of one Gaussian release, mu = 1 / (2 z_noise^2), z = Phi^-1(1 -
    delta): an upper bound on its exact eps at `delta` for every noise multiplier (the privacy
    loss is N(mu, 2 mu); at this eps the analytic delta(eps) = Phi(-z) - e^eps Phi(-z - sqrt(2
    mu)) < delta) and within about 1 of it (relative 2e-8 at GAUSSIAN_BOUND_NM, exact in floating
    point for the noise of huge eps). inf only where mu itself is not representable."""
    if noise_multiplier == 0.0:
        return math.inf
    if math.isinf(noise_multiplier):
        return 0.0
    r = math.sqrt(0.5) / noise_multiplier  # sqrt(mu), without squaring a tiny noise multiplier
    if math.isinf(r):
        return math.inf
    return max(r * r + _z(delta) / noise_multiplier, 0.0)


@functools.lru_cache(maxsize=4096)
def gaussian_eps(noise_multiplier: float, delta: float) -> float:
    """Exact eps of one Gaussian release with sigma / Delta_2 = noise_multiplier at `delta`
    (Balle & Wang 2018, through dp-accounting); below GAUSSIAN_BOUND_NM (negligible noise, eps
    beyond 5e7) the closed-form upper bound `gaussian_eps_bound`, within about 1 of it."""
    if noise_multiplier == 0.0:
        return math.inf
    if math.isinf(noise_multiplier):
        return 0.0
    if noise_multiplier < GAUSSIAN_BOUND_NM:
        return gaussian_eps_bound(noise_multiplier, delta)
    from dp_accounting import gaussian_mechanism

    return float(gaussian_mechanism.get_epsilon_gaussian(noise_multiplier, delta))


def gaussian_noise_multiplier(eps: float, delta: float) -> float:
    """The smallest sigma / Delta_2 of a Gaussian release that is (eps, delta)-DP: dp-accounting's
    analytic calibration (Balle & Wang 2018) up to GAUSSIAN_BOUND_EPS; beyond it the exact inverse
    of `gaussian_eps_bound` (sqrt(mu) = eps / (z / sqrt 2 + sqrt(eps + z^2 / 2)), no overflow up
    to the largest float eps), so gaussian_eps(result) <= eps to rounding. 0 for eps = inf."""
    if math.isinf(eps):
        return 0.0
    if eps <= GAUSSIAN_BOUND_EPS:
        from dp_accounting import gaussian_mechanism

        return float(gaussian_mechanism.get_sigma_gaussian(eps, delta))
    z = _z(delta)
    root_mu = eps / (z / math.sqrt(2.0) + math.sqrt(eps + z * z / 2.0))
    return math.sqrt(0.5) / root_mu


@dataclass(frozen=True)
class GaussianEvent:
    """I.i.d. N(0, sigma^2) noise on every coordinate of a value of L2 sensitivity `l2_sensitivity`.

    Its per-release guarantee is stated at `delta`: eps is the exact (analytic) eps of this
    sigma / Delta_2 at that delta, whatever formula chose sigma, so a conservative calibration
    shows a smaller eps and an under-noised one (e.g. the authors' sigma^2 as the std) a larger one.
    """

    l2_sensitivity: float
    sigma: float
    delta: float
    data_dependent: bool = False
    certified: bool = True

    mechanism: ClassVar[str] = "gaussian"

    def __post_init__(self) -> None:
        object.__setattr__(self, "l2_sensitivity", _check("l2_sensitivity", self.l2_sensitivity))
        object.__setattr__(self, "sigma", _check("sigma", self.sigma))
        if not 0.0 < float(self.delta) < 1.0:
            raise ValueError(f"delta must be in (0, 1), got {self.delta}")

    @property
    def noise_multiplier(self) -> float:
        if self.l2_sensitivity == 0.0:
            return math.inf
        return self.sigma / self.l2_sensitivity

    @property
    def eps(self) -> float:
        return gaussian_eps(_round12(self.noise_multiplier), float(self.delta))

    def key(self) -> tuple:
        return ("gaussian", _round12(self.noise_multiplier), float(self.delta),
                self.data_dependent, self.certified)

    def to_dp_event(self) -> Any:
        from dp_accounting import dp_event

        if self.l2_sensitivity == 0.0:
            return dp_event.NoOpDpEvent()
        if self.sigma == 0.0:
            return dp_event.NonPrivateDpEvent()
        return dp_event.GaussianDpEvent(noise_multiplier=self.noise_multiplier)


@dataclass(frozen=True)
class PureEvent:
    """A pure (eps, 0)-DP release of a named mechanism that is neither coordinate-wise Laplace
    nor Gaussian (e.g. the L2-norm Laplace of an output-perturbation warm start, randomised
    response on labels). Accountants treat it as the worst case of any eps-DP mechanism: PLD
    composes the (eps, 0) privacy-parameter PLD, RDP the implied eps^2/2-zCDP (Bun & Steinke
    2016, Prop. 1.4), so both stay upper bounds.
    """

    eps_value: float
    kind: str
    data_dependent: bool = False
    certified: bool = True

    def __post_init__(self) -> None:
        object.__setattr__(self, "eps_value", _check("eps", self.eps_value))

    @property
    def mechanism(self) -> str:
        return self.kind

    @property
    def eps(self) -> float:
        return self.eps_value

    @property
    def delta(self) -> float:
        return 0.0

    def key(self) -> tuple:
        return ("pure", self.kind, _round12(self.eps), self.data_dependent, self.certified)

    def to_dp_event(self) -> Any:
        from dp_accounting import dp_event

        if self.eps == 0.0:
            return dp_event.NoOpDpEvent()
        if math.isinf(self.eps):
            return dp_event.NonPrivateDpEvent()
        return dp_event.ZCDpEvent(rho=self.eps**2 / 2.0)


Event = LaplaceEvent | GaussianEvent | PureEvent
