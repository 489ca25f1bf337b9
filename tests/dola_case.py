"""dola's algorithm run without a job (tests): its settings with the run's privacy, and the
privacy contract that gives the algorithm its release path (`Contract.planned`)."""

from __future__ import annotations

import dataclasses
import math

from mpi_dp.algorithms import dola
from mpi_dp.privacy import rules
from mpi_dp.privacy.contract import Contract
from mpi_dp.privacy.rules import Rule


@dataclasses.dataclass(frozen=True)
class Case(dola.Settings):
    """dola.Settings and the run's privacy: each agent's `eps` (per release under the paper's
    rule, seed 003's PerRelease, with its knobs gauss_mode, gauss_calibration and delta) and,
    where given, another `rule` calibrating each agent's per-record plan to eps (pld, basic)."""

    eps: tuple[float, ...] = ()
    gauss_mode: str = "per_record"
    gauss_calibration: str = "auto"
    delta: float = 1e-4
    rule: Rule | None = None

    def __post_init__(self) -> None:
        eps = self.eps if isinstance(self.eps, tuple | list) else (float(self.eps),) * self.m
        object.__setattr__(self, "eps", tuple(float(e) for e in (eps or (math.inf,) * self.m)))

    @property
    def paper_rule(self) -> rules.PerRelease:
        return rules.PerRelease(gauss_mode=self.gauss_mode,
                                gauss_calibration=self.gauss_calibration, delta=self.delta)


def contract(s: dola.Settings, eps: float | tuple[float, ...] | None = None,
             rule: Rule | None = None, delta: float = 1e-5) -> Contract:
    """The contract of the m agents of `s` (a Case: its eps and rule) as a dola job makes it:
    each agent's per-record plan (s.passes releases of its mechanism, scope record) at its eps
    and `delta`, under `rule` (default: the case's, else its paper rule), with the noise
    streams (seed, runs) of `s`."""
    if eps is None:
        eps = s.eps if isinstance(s, Case) else (math.inf,) * s.m
    eps_t = tuple(eps) if isinstance(eps, tuple | list) else (float(eps),) * s.m
    if rule is None:
        rule = (s.rule or s.paper_rule) if isinstance(s, Case) else rules.PerRelease()
    return Contract.planned(rule, s.mechanism, s.passes, eps_t, delta, seed=s.seed,
                            run_ids=s.run_ids, scope="record")

