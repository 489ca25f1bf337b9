"""The privacy contract of one configuration: the one object a method's run asks for releases.

A job's `eps` and `delta` are each data owner's total guarantee for its records over a
configuration (docs/privacy.md). The runner builds a `Contract` per configuration from the job
and the method's declared release plan: each participating owner's `Plan` (its target (eps_i,
delta_i), how many releases of which mechanism, composed over what), the calibration rule
(privacy.rules: pld, basic, or the method's paper rule) and the `Calibration` the rule gives
each distinct plan (searched once, on one rank). The method's algorithm asks the contract for
its owners' release paths (`owner`, `block`: privacy.release) and those for their releases;
every release charges the owner's ledger, draws from the owner's streams (seed, 'noise', agent,
run), shows the audit tap and returns, in that order, and a release the owner's plan does not
cover is refused before any noise is drawn. The algorithm never sees which rule calibrated the
noise.

Pure: no MPI.
"""

from __future__ import annotations

import dataclasses
import math
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from mpi_dp import rng
from mpi_dp.privacy.calibration import (  # noqa: F401 (the contract's vocabulary, one import)
    MECHANISMS,
    RULE_TEXT,
    RULES,
    SCOPES,
    Calibration,
    Plan,
    Sensitivity,
    calibrate,
    default_delta,
    honest_scale,
    paper,
    resolve_delta,
)
from mpi_dp.privacy.events import Event
from mpi_dp.privacy.release import BlockRelease, OwnerRelease
from mpi_dp.privacy.rules import Rule


@dataclasses.dataclass(frozen=True)
class Share:
    """What one configuration's owner makes of a plan that spans several configurations (a
    private selection's candidates, calibrated together): its own calibrated releases and fixed
    releases; the plan's others count towards the same guarantee (the ledger's context)."""

    releases: int
    fixed: tuple[Event, ...] = ()


class Contract:
    """One configuration's privacy: `rule`, and per participating owner (agent ids 0..N-1) its
    calibration (whose `plan` is what it may release; None: the owner releases nothing private)
    or no calibrations at all (None: the configuration is a non-private baseline). `seed` and
    `run_ids` key the owners' noise streams."""

    def __init__(self, rule: Rule, calibrations: Sequence[Calibration | None] | None, *,
                 seed: int, run_ids: Sequence[int]) -> None:
        self.rule = rule
        self.calibrations: tuple[Calibration | None, ...] | None = (
            None if calibrations is None else tuple(calibrations))
        self.seed = int(seed)
        self.run_ids = tuple(int(r) for r in run_ids)

    @classmethod
    def of(cls, rule: Rule, plans: Sequence[Plan | None] | None, *, seed: int,
           run_ids: Sequence[int], found: Mapping[Plan, Calibration] | None = None) -> Contract:
        """The contract of `plans` under `rule` (each distinct plan's calibration from `found`
        where given, else calibrated here)."""
        if plans is None:
            return cls(rule, None, seed=seed, run_ids=run_ids)
        made: dict[Plan, Calibration] = dict(found or {})
        cals: list[Calibration | None] = []
        for p in plans:
            if p is None:
                cals.append(None)
                continue
            if p not in made:
                made[p] = rule.calibrate(p)
            cals.append(made[p])
        return cls(rule, cals, seed=seed, run_ids=run_ids)

    @classmethod
    def planned(cls, rule: Rule, mechanism: str, releases: int | Sequence[int],
                eps: Sequence[float], delta: float = 1e-5, *, seed: int = 0,
                run_ids: Sequence[int] = (0,), fixed: tuple[Event, ...] = (),
                scope: str = "configuration") -> Contract:
        """The contract of owners 0..len(eps)-1, owner i releasing `releases` (or releases[i])
        times by `mechanism` at (eps[i], delta) under `rule` (scripts and tests that run an
        algorithm without a job)."""
        counts = ([int(releases)] * len(eps) if isinstance(releases, int)
                  else [int(k) for k in releases])
        plans = [Plan(mechanism, k, float(e), float(delta), tuple(fixed), scope)
                 for k, e in zip(counts, eps, strict=True)]
        return cls.of(rule, plans, seed=seed, run_ids=run_ids)

    # -- what the contract says ----------------------------------------------------------------
    @property
    def plans(self) -> tuple[Plan | None, ...] | None:
        if self.calibrations is None:
            return None
        return tuple(None if c is None else c.plan for c in self.calibrations)

    @property
    def runs(self) -> int:
        return len(self.run_ids)

    @property
    def owners(self) -> int:
        """Participating owners (those with an entry, planned or not)."""
        return 0 if self.calibrations is None else len(self.calibrations)

    @property
    def private(self) -> bool:
        """Whether some owner's release is noised for a finite target (False: nothing private
        is promised; every release then records eps = inf)."""
        return any(c is not None and math.isfinite(c.plan.eps)
                   for c in self.calibrations or ())

    def noise(self, owner: int) -> Calibration | None:
        """Owner `owner`'s noise (its calibration under the rule); None: no plan."""
        if self.calibrations is None or not 0 <= owner < len(self.calibrations):
            return None
        return self.calibrations[owner]

    def attrs(self) -> dict[str, Any]:
        """The configuration's calibration as group attributes: the rule, what it means, and
        one line per distinct calibration (owners with equal plans share one)."""
        live = [c for c in self.calibrations or () if c is not None]
        if not live:
            return {}
        texts = list(dict.fromkeys(c.text() for c in {id(c): c for c in live}.values()))
        return {"calibration": live[0].name, "calibration_rule": self.rule.text,
                "calibrations": "\n".join(texts)}

    # -- release paths -------------------------------------------------------------------------
    def owner(self, agent: int, *, certified: bool = True, data_dependent: bool = False,
              clip: float = math.inf, mechanism: str | None = None, share: Share | None = None,
              purpose: str = "noise") -> OwnerRelease:
        """Owner `agent`'s release path: its noise, its ledger (the plan's limits, or the basic
        budget a paper rule states), its noise streams (seed, `purpose`, agent, run).
        `certified` / `data_dependent` flag its events (a variant whose guarantee is not shown,
        a sensitivity read from the data); `clip` is the per-record bound its sensitivity
        assumes; `mechanism` names the noise of an owner without a plan; `share`: its part of a
        plan that spans several configurations."""
        return self._owner(agent, certified, data_dependent, clip, mechanism, share,
                           lambda a=int(agent): rng.run_streams(self.seed, purpose, a,
                                                               self.run_ids),
                           lambda what, a=int(agent): rng.run_streams(self.seed, what, a,
                                                                      self.run_ids))

    def block(self, agents: Sequence[int], *, certified: bool = True,
              data_dependent: bool = False, clip: float = math.inf,
              mechanism: str | None = None, purpose: str = "noise") -> BlockRelease:
        """The release path of the owners `agents` hosted together (privacy.release.
        BlockRelease): each owner's own path (as `owner`), the block's noise streams the owners'
        own as one agent-major RunStreams (row a R + r: agents[a], run r)."""
        ids = [int(a) for a in agents]
        owners = [self._owner(a, certified, data_dependent, clip, mechanism, None, None, None)
                  for a in ids]
        return BlockRelease(owners, streams=lambda: rng.agent_run_streams(
            self.seed, purpose, ids, self.run_ids), runs=self.runs)

    def _owner(self, agent: int, certified: bool, data_dependent: bool, clip: float,
               mechanism: str | None, share: Share | None, streams: Any,
               purposes: Any) -> OwnerRelease:
        cal = self.noise(int(agent))
        if self.calibrations is not None and cal is None and int(agent) < self.owners:
            raise ValueError(f"owner {agent} has no release plan in this configuration: it "
                             "may release nothing")
        budget = cal.ledger_budget() if cal is not None else (math.inf, math.inf)
        allowance: int | None = None
        context: tuple[tuple[Event, int], ...] = ()
        if (share is not None and cal is not None and not self.rule.paper
                and cal.noise_multiplier > 0):  # a share limits an accounted, noisy plan
            allowance, context = _context(cal, share)
        return OwnerRelease(int(agent), self.runs, cal, budget_eps=budget[0],
                            budget_delta=budget[1], allowance=allowance, context=context,
                            certified=certified and (cal is None or cal.certified),
                            data_dependent=data_dependent, clip=clip, mechanism=mechanism,
                            streams=streams, purposes=purposes)


    def reserve_laplace(self, owners: Mapping[int, OwnerRelease], counts: Mapping[int, int],
                        size: int) -> None:
        """Draw ahead every owner's standard Laplace noise for `counts[agent]` releases of
        `size` numbers each, from its noise streams (the owners with equal counts in one block
        draw: `rng.agent_run_streams`, each owner's rows the bits it draws alone), and reserve
        it in its release path (`OwnerRelease.reserve`)."""
        ids = sorted(int(a) for a in owners if counts[a] > 0)
        if not ids:
            return
        import numpy as np

        R = self.runs
        n_of = np.array([int(counts[i]) for i in ids], dtype=np.int64)
        streams = rng.agent_run_streams(self.seed, "noise", ids, self.run_ids)
        for n_i in np.unique(n_of).tolist():
            pos = np.flatnonzero(n_of == n_i)  # owners with n_i releases
            rows = (pos[:, None] * R + np.arange(R)).ravel()
            draws = streams.laplace(n_i * size, rows).reshape(len(pos), R, n_i, size)
            for k, a in enumerate(pos.tolist()):
                owners[ids[a]].reserve(draws[k])


def _context(cal: Calibration, share: Share) -> tuple[int, tuple[tuple[Event, int], ...]]:
    """The ledger's allowance (the share's calibrated releases) and context (the plan's other
    releases: calibrated ones as unit events, fixed ones as they are) of an owner's share."""
    plan = cal.plan
    others = plan.releases - share.releases
    if others < 0:
        raise ValueError(f"a share of {share.releases} releases exceeds its plan's "
                         f"{plan.releases}")
    left = Counter(plan.fixed)
    left.subtract(Counter(share.fixed))
    if any(c < 0 for c in left.values()):
        raise ValueError("a share's fixed releases are not all in its plan")
    fixed = []
    for ev in plan.fixed:  # the plan's order, less the share's
        if left[ev] > 0:
            fixed.append(ev)
            left[ev] -= 1
    context = tuple(x for x in ((cal.unit_event(), others), *((ev, 1) for ev in fixed)) if x[1])
    return share.releases, context
