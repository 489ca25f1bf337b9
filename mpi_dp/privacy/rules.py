"""Calibration rules: how each owner's release plan becomes its per-release noise.

A rule is a named object. The job's `privacy.calibration` picks one: `pld` (TIGHT) and `basic`
(EVEN_SPLIT) calibrate any plan by accounting (privacy.calibration); `paper` takes the method's
own paper rule, one of the four below, built by the method entry with the paper's knobs. The
contract (privacy.contract) asks the rule for every distinct plan's `Calibration`; a release
path asks that calibration for its noise (`scale`, `eps_release`, `gaussian_delta`,
`release_budgets`, ...) and never sees which rule made it. Each paper rule answers those
questions with its paper's formulas, bit for bit as the paper's code:

- `BasicSplit` (seeds 001 and 000): eps_i split evenly over the m_i releases, b_i =
  2 xi m_i / (n_i eps_i) of a mean of n_i gradients clipped to xi; the owner's ledger holds the
  basic budget (eps_i, 0);
- `PerIteration` (seed 002): eps is every release's own eps (eps_bar per iteration; Laplace
  b = Delta / eps_bar, Gaussian by the paper's calibration at dp_delta); an optional basic cap
  budget_eps;
- `PerRelease` (seed 003): eps is every release's own eps (Laplace S / eps; Gaussian by
  gauss_mode at the paper's delta);
- `Theorem1` (seed 004): e_1..e_{T_i} per owner by Algorithm 3 (Kairouz et al.'s Theorem 1 at
  delta_bar; privacy.kairouz).

Pure: no MPI.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any, ClassVar

import numpy as np

from mpi_dp.privacy import kairouz
from mpi_dp.privacy.calibration import (
    RULE_TEXT,
    Calibration,
    Plan,
    Sensitivity,
    calibrate,
    sensitivity_value,
)
from mpi_dp.privacy.mechanisms import GAUSSIAN_CALIBRATIONS, gaussian_sigma, lap_scale


class Rule:
    """One way of turning an owner's plan into its noise (`calibrate`)."""

    #: the ledger's calibration column ('pld', 'basic', 'paper:<name>')
    name: str = ""
    #: what the rule means (the configuration's attribute calibration_rule)
    text: str = ""
    #: a paper's own rule (its noise is the paper's formula, not an accountant's search)
    paper: bool = False

    def calibrate(self, plan: Plan) -> Calibration:
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"


class Accounted(Rule):
    """pld or basic: the noise multiplier an accountant finds for the plan (cached per plan)."""

    def __init__(self, name: str) -> None:
        if name not in ("pld", "basic"):
            raise ValueError(f"an accounted rule is 'pld' or 'basic', got {name!r}")
        self.name, self.text = name, RULE_TEXT[name]

    def calibrate(self, plan: Plan) -> Calibration:
        return calibrate(plan, self.name)


#: the job's privacy.calibration = 'pld' (default) and 'basic'
TIGHT = Accounted("pld")
EVEN_SPLIT = Accounted("basic")


@dataclasses.dataclass(frozen=True)
class PaperRule(Rule):
    """A paper's own rule: every plan gets a `Calibration` subclass (NOISE) carrying the rule's
    knobs, whose answers are the paper's formulas; its multiplier is NaN (the paper states no
    multiplier: what the releases compose to is in the ledger)."""

    NOISE: ClassVar[type[Calibration]] = Calibration
    #: the paper rule's short name (the ledger's calibration column: 'paper:<short>')
    SHORT: ClassVar[str] = ""
    paper: ClassVar[bool] = True  # type: ignore[misc]
    text: ClassVar[str] = RULE_TEXT["paper"]  # type: ignore[misc]

    @property
    def name(self) -> str:  # type: ignore[override]
        return f"paper:{self.SHORT}"

    def knobs(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    def calibrate(self, plan: Plan) -> Calibration:
        return self.NOISE("paper", plan, math.nan, paper=self.SHORT, **self.knobs())


# -- seeds 001 and 000: the basic split of Theorem 1 -----------------------------------------------

@dataclasses.dataclass(frozen=True)
class BasicSplitNoise(Calibration):
    """b_i = 2 xi m_i / (n_i eps_i) (mechanisms.lap_scale, evaluated literally) of a mean of n_i
    gradients clipped to xi (`Sensitivity.mean`), m_i = the plan's releases; the owner's ledger
    holds the basic budget (eps_i, 0)."""

    def scale(self, sensitivity: float | Sensitivity) -> float:
        if not isinstance(sensitivity, Sensitivity):
            raise ValueError("the paper's basic split sets the noise of a mean of clipped "
                             "vectors: its release states Sensitivity.mean(bound, n)")
        return lap_scale(sensitivity.term("bound"), self.plan.releases,
                         int(sensitivity.term("n")), self.plan.eps)

    @property
    def eps_release(self) -> float:
        return self.plan.eps / self.plan.releases if self.plan.releases else math.inf

    def ledger_budget(self) -> tuple[float, float]:
        return self.plan.eps, 0.0


@dataclasses.dataclass(frozen=True)
class BasicSplit(PaperRule):
    """Seeds 001 (sync_star) and 000 (async_star): eps_i split evenly over the owner's m_i
    answers, basic composition (Theorem 1)."""

    NOISE: ClassVar[type[Calibration]] = BasicSplitNoise
    SHORT: ClassVar[str] = "basic_split"


# -- seed 002: eps_bar per iteration -----------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class PerIterationNoise(Calibration):
    """eps is every release's own eps (eps_bar): Laplace b = Delta / eps_bar; Gaussian sigma
    by `gaussian_calibration` at `dp_delta` ('paper': the classical formula at every eps, the
    authors' runs at eps >= 1, recorded uncertified); the ledger's basic cap `budget_eps`."""

    gaussian_calibration: str = "auto"
    dp_delta: float = 1e-6
    budget_eps: float = math.inf

    @property
    def eps_release(self) -> float:
        return self.plan.eps

    def classical_eps(self, delta: float) -> float:
        return self.plan.eps

    @property
    def gaussian_delta(self) -> float:
        return self.dp_delta

    @property
    def certified(self) -> bool:
        return not (self.plan.mechanism == "gaussian" and self.gaussian_calibration == "paper"
                    and 1 <= self.plan.eps < math.inf)

    def scale(self, sensitivity: float | Sensitivity) -> float:
        value = float(sensitivity_value(sensitivity))
        eps = self.plan.eps
        if math.isinf(eps):
            return 0.0
        if self.plan.mechanism == "laplace":
            return value / eps
        paper = self.gaussian_calibration == "paper"
        return gaussian_sigma(value, eps, self.dp_delta,
                              calibration="classical" if paper else self.gaussian_calibration,
                              allow_large_eps=paper)

    def ledger_budget(self) -> tuple[float, float]:
        return self.budget_eps, math.inf


@dataclasses.dataclass(frozen=True)
class PerIteration(PaperRule):
    """Seed 002 (admm): eps is eps_bar, every agent's budget per iteration."""

    NOISE: ClassVar[type[Calibration]] = PerIterationNoise
    SHORT: ClassVar[str] = "per_iteration"
    gaussian_calibration: str = "auto"
    dp_delta: float = 1e-6
    budget_eps: float = math.inf

    def __post_init__(self) -> None:
        if self.gaussian_calibration not in (*GAUSSIAN_CALIBRATIONS, "paper"):
            raise ValueError(f"unknown Gaussian calibration {self.gaussian_calibration!r}")


# -- seed 003: eps per release -----------------------------------------------------------------

GAUSS_MODES = ("per_record", "total_T", "paper")


@functools.lru_cache(maxsize=4096)
def gauss_std(mode: str, delta2: float, eps: float, delta: float, T: int, *, alpha: float = 0.0,
              n: int = 1, L: float = 1.0, calibration: str = "auto") -> float:
    """J of seed 003's Alg. 2 for the gradient's L2 sensitivity delta2 (spec §2.2): per_record
    (the Gaussian of (eps, delta) per release, `calibration`), total_T (zCDP over the T rounds)
    or paper (the authors' formula with alpha, n, L; recorded uncertified)."""
    if math.isinf(eps):
        return 0.0
    if mode == "per_record":
        return gaussian_sigma(delta2, eps, delta, calibration=calibration)
    if mode == "total_T":
        lg = math.log(1.0 / delta)
        rho_tot = (math.sqrt(lg + eps) - math.sqrt(lg)) ** 2
        return delta2 * math.sqrt(T / (2.0 * rho_tot))
    if mode == "paper":
        return math.sqrt(4 * alpha**2 * n * L**2 * T * math.log(T / delta) * math.log(1 / delta)
                         ) / eps
    raise ValueError(f"unknown gauss_mode {mode!r}")


@dataclasses.dataclass(frozen=True)
class PerReleaseNoise(Calibration):
    """eps is every release's own eps: Laplace S / eps; Gaussian J = gauss_std(gauss_mode, ...)
    at the paper's `delta` (the release states the terms alpha, n, L and T of the round)."""

    gauss_mode: str = "per_record"
    gauss_calibration: str = "auto"
    delta: float = 1e-4

    @property
    def eps_release(self) -> float:
        return self.plan.eps

    @property
    def gaussian_delta(self) -> float:
        return self.delta

    @property
    def certified(self) -> bool:
        return not (self.plan.mechanism == "gaussian" and self.gauss_mode == "paper")

    def scale(self, sensitivity: float | Sensitivity) -> float:
        value = float(sensitivity_value(sensitivity))
        eps = self.plan.eps
        if self.plan.mechanism == "laplace":
            return 0.0 if math.isinf(eps) else value / eps
        if not isinstance(sensitivity, Sensitivity):
            raise ValueError("the paper's Gaussian needs the round's terms (Sensitivity.of("
                             "delta2, alpha=..., n=..., L=..., T=...))")
        t = sensitivity.term
        return gauss_std(self.gauss_mode, value, float(eps), self.delta, int(t("T")),
                         alpha=t("alpha"), n=int(t("n")), L=t("L"),
                         calibration=self.gauss_calibration)


@dataclasses.dataclass(frozen=True)
class PerRelease(PaperRule):
    """Seed 003 (dola): eps is the eps of each release (one per round)."""

    NOISE: ClassVar[type[Calibration]] = PerReleaseNoise
    SHORT: ClassVar[str] = "per_release"
    gauss_mode: str = "per_record"
    gauss_calibration: str = "auto"
    delta: float = 1e-4

    def __post_init__(self) -> None:
        if self.gauss_mode not in GAUSS_MODES:
            raise ValueError(f"unknown gauss_mode {self.gauss_mode!r}")


# -- seed 004: Theorem 1 and Algorithm 3 ---------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Theorem1Noise(Calibration):
    """e_1..e_{T_i} of the owner by Algorithm 3 (privacy.kairouz): `allocation` of eps_bar at
    `delta_bar`; the Proposition-2 allocations read the owner's wake-up positions in the
    schedule (`steps`, of `horizon` ticks) and kappa."""

    delta_bar: float = math.exp(-5)
    allocation: str = "equal"

    @property
    def eps_release(self) -> float:
        return self.plan.eps

    def release_budgets(self, count: int, *, steps: np.ndarray | None = None,
                        horizon: int = 0, kappa: float | None = None) -> np.ndarray:
        k = int(count)
        eps_bar = self.plan.eps
        if math.isinf(eps_bar):
            return np.full(k, math.inf)
        if self.allocation in ("equal", "simple"):
            e = (_equal_split(eps_bar, k, self.delta_bar) if self.allocation == "equal"
                 else eps_bar / k) if k else 0.0
            return np.full(k, e)
        if kappa is None or steps is None:
            raise ValueError("the Proposition-2 allocations need kappa and the owner's steps")
        star = _prop2(kappa, int(horizon), eps_bar, self.allocation == "prop2_corrected")
        share = star[np.asarray(steps, dtype=np.int64)[:k]]
        lam_i = math.fsum(share) / eps_bar if share.size else 1.0
        return share / lam_i


@functools.lru_cache(maxsize=1024)
def _equal_split(eps_bar: float, k: int, delta_bar: float) -> float:
    return kairouz.equal_split(eps_bar, k, delta_bar)


@functools.lru_cache(maxsize=16)
def _prop2(kappa: float, horizon: int, eps_bar: float, corrected: bool) -> np.ndarray:
    out = kairouz.prop2_allocation(kappa, horizon, eps_bar, corrected)
    out.setflags(write=False)
    return out


@dataclasses.dataclass(frozen=True)
class Theorem1(PaperRule):
    """Seed 004 (p2p): eps is eps_bar of Theorem 1 at delta_bar over a peer's wake-ups."""

    NOISE: ClassVar[type[Calibration]] = Theorem1Noise
    SHORT: ClassVar[str] = "theorem1"
    delta_bar: float = math.exp(-5)
    allocation: str = "equal"

    def __post_init__(self) -> None:
        if self.allocation not in kairouz.ALLOCATIONS:
            raise ValueError(f"allocation must be one of {kairouz.ALLOCATIONS}, got "
                             f"{self.allocation!r}")


def rule_of(name: str, paper: PaperRule | None) -> Rule:
    """The rule of the job's privacy.calibration `name`: pld, basic, or the method's `paper`
    rule (ValueError where the method has none)."""
    if name == "pld":
        return TIGHT
    if name == "basic":
        return EVEN_SPLIT
    if name == "paper":
        if paper is None:
            raise ValueError("this method has no paper rule: use privacy.calibration = 'pld' or "
                             "'basic'")
        return paper
    raise ValueError(f"privacy.calibration must be 'pld', 'basic' or 'paper', got {name!r}")
