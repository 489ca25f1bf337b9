"""The one release path: how anything about an owner's records leaves it, for every method.

In the shape of TF Privacy's `DPQuery`: a release is *preprocessed* (each record's contribution
clipped to the bound the sensitivity assumes: the caller's vectorised kernel, models.linear and
friends, given the bound declared here), *accumulated* (summed or averaged by the same kernel) and
*noised* here: the event of the release is built from the owner's calibration
(privacy.contract), the owner's ledger is charged *before* any noise is drawn (refusing what the
plan does not allow), the noise is drawn from the owner's own streams, and the released value is
reported to the audit tap. A method never charges a ledger or builds an event by hand.

`OwnerRelease` serves one owner (the star methods, admm, each p2p peer); `BlockRelease` a block of
owners hosted on one rank that release together (dola's rounds).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from mpi_dp.privacy import tap
from mpi_dp.privacy.contract import honest_scale
from mpi_dp.privacy.events import Event, GaussianEvent, LaplaceEvent
from mpi_dp.privacy.ledger import Ledger
from mpi_dp.privacy.mechanisms import (
    Streams,
    gaussian_perturbation,
    laplace_mechanism,
    laplace_perturbation,
)


class OwnerRelease:
    """Owner `agent`'s releases over `runs` runs under its `calibration` (privacy.contract;
    None: no contract, e.g. eps = inf or a non-private baseline).

    A calibrated rule gives every release the noise multiplier x its sensitivity; a paper rule
    gives each release's noise `scale` explicitly (the paper's formula, bit for bit) and is
    limited by the basic budget (`budget_eps`, `budget_delta`) where the paper has one.
    `allowance` / `context`: a ledger's share of a selection's plan (privacy.ledger).
    `certified` / `data_dependent` flag every event (uncertified variants, data-dependent
    sensitivities). `clip` is the per-record bound the sensitivity assumes (inf: none).
    `mechanism` names the noise where no calibration does (a paper rule's Gaussian).
    """

    def __init__(self, agent: int, runs: int, calibration: Any = None, *,
                 budget_eps: float = math.inf, budget_delta: float = math.inf,
                 allowance: int | None = None, context: Sequence[tuple[Event, int]] = (),
                 certified: bool = True, data_dependent: bool = False,
                 clip: float = math.inf, mechanism: str | None = None) -> None:
        self.agent = int(agent)
        self._mechanism = mechanism
        self.calibration = calibration
        self.certified = bool(certified)
        self.data_dependent = bool(data_dependent)
        self.clip = float(clip)
        self.ledger = Ledger(self.agent, budget_eps, budget_delta, runs, target=calibration,
                             allowance=allowance, context=context)

    @property
    def mechanism(self) -> str:
        """'laplace' or 'gaussian': the calibration's (else as given, else Laplace)."""
        if self.calibration is not None:
            return self.calibration.plan.mechanism
        return self._mechanism or "laplace"

    @property
    def calibrated(self) -> bool:
        """Whether noise comes from the calibration (pld / basic), not from the caller."""
        c = self.calibration
        return c is not None and c.rule != "paper"

    def scale(self, sensitivity: float, scale: float | None = None) -> float:
        """The noise scale of a release of `sensitivity`: `scale` where the caller's (paper) rule
        gives one, else the calibrated multiplier x sensitivity; 0 without a calibration."""
        if scale is not None:
            return float(scale)
        if self.calibration is None:
            return 0.0
        return self.calibration.scale(sensitivity)

    def event(self, sensitivity: float, scale: float | None = None, *,
              delta: float | None = None) -> Event:
        """The event of one release (Gaussian: stated at `delta`, default the plan's)."""
        sc = self.scale(sensitivity, scale)
        if self.mechanism == "gaussian":
            d = delta if delta is not None else self.calibration.plan.delta
            return GaussianEvent(sensitivity, sc, d, data_dependent=self.data_dependent,
                                 certified=self.certified)
        return LaplaceEvent(sensitivity, sc, data_dependent=self.data_dependent,
                            certified=self.certified)

    def charge(self, event: Event, runs: np.ndarray | None = None, note: str = "",
               record_pass: int | None = None) -> Event:
        """Charge the owner's ledger for `event` before it is made (BudgetExceededError when the
        plan or budget does not allow it); returns the event."""
        self.ledger.charge(event, runs, note, record_pass)
        return event

    def charge_one(self, event: Event, r: int) -> Event:
        """charge(event, [r]) on the scalar hot path (an owner answering one run)."""
        self.ledger.charge_one(event, r)
        return event

    def report(self, values: np.ndarray, runs: np.ndarray | None, event: Event) -> None:
        """Show the released `values` (one row per run in `runs`) to the audit tap."""
        tap.release(self.agent, values, runs, event)

    # -- the mechanisms ------------------------------------------------------------------
    def laplace(self, value: np.ndarray, gens: Streams, sensitivity: float | np.ndarray,
                runs: np.ndarray | None = None, *, scale: float | np.ndarray | None = None,
                scalar: bool = False) -> tuple[np.ndarray, LaplaceEvent]:
        """value (rows, d) + i.i.d. Laplace noise: charged, drawn, added, reported."""
        sc = self._scales(sensitivity, scale)
        return laplace_mechanism(value, gens, sc, sensitivity, self.ledger, runs,
                                 data_dependent=self.data_dependent, certified=self.certified,
                                 scalar=scalar)

    def laplace_noise(self, gens: Streams, size: int, sensitivity: float | np.ndarray,
                      runs: np.ndarray | None = None, *, scale: float | np.ndarray | None = None
                      ) -> tuple[np.ndarray, LaplaceEvent]:
        """The noise of a Laplace release the caller adds inside its own update (objective
        perturbation); charged first. The caller reports what leaves the owner."""
        sc = self._scales(sensitivity, scale)
        return laplace_perturbation(gens, sc, size, sensitivity, self.ledger, runs,
                                    data_dependent=self.data_dependent, certified=self.certified)

    def gaussian_noise(self, gens: Streams, size: int, sensitivity: float,
                       runs: np.ndarray | None = None, *, sigma: float | None = None,
                       delta: float | None = None) -> tuple[np.ndarray, GaussianEvent]:
        """The noise of a Gaussian release (charged first; stated at `delta`, default the
        plan's). The caller adds it and reports the release."""
        sd = self.scale(sensitivity, sigma)
        d = delta if delta is not None else self.calibration.plan.delta
        return gaussian_perturbation(gens, sd, size, sensitivity, d, self.ledger, runs,
                                     data_dependent=self.data_dependent, certified=self.certified)

    def _scales(self, sensitivity: float | np.ndarray, scale: float | np.ndarray | None
                ) -> float | np.ndarray:
        if scale is not None:
            return scale
        if self.calibration is None:
            return 0.0
        return honest_scale(self.calibration.noise_multiplier,
                            np.asarray(sensitivity, dtype=np.float64)) \
            if np.ndim(sensitivity) else self.calibration.scale(float(sensitivity))


class BlockRelease:
    """The owners of one rank that release together each round (`OwnerRelease` each): one
    sensitivity for the round, each owner's own scale, every ledger charged before the block's
    noise is drawn, every release reported."""

    def __init__(self, owners: Sequence[OwnerRelease]) -> None:
        self.owners = list(owners)

    @property
    def ledgers(self) -> list[Ledger]:
        return [o.ledger for o in self.owners]

    def restore_ledgers(self, ledgers: Sequence[Ledger]) -> None:
        for o, led in zip(self.owners, ledgers, strict=True):
            o.ledger = led

    def charge(self, sensitivity: float, scales: Sequence[float | None] | None = None, *,
               record_pass: int | None = None, delta: float | None = None
               ) -> tuple[np.ndarray, list[Event]]:
        """Every owner's event for a release of `sensitivity` (noise: each owner's calibrated
        scale, or `scales[i]` of a paper rule), charged to its ledger; returns (scales (k,),
        events). Owners with equal scales share one event object."""
        given = scales if scales is not None else [None] * len(self.owners)
        out = np.empty(len(self.owners))
        events: list[Event] = []
        made: dict[tuple, Event] = {}
        for i, (o, sc) in enumerate(zip(self.owners, given, strict=True)):
            s = o.scale(sensitivity, sc)
            key = (s, o.certified, o.data_dependent, o.mechanism)
            ev = made.get(key)
            if ev is None:
                ev = made[key] = o.event(sensitivity, s, delta=delta)
            o.charge(ev, record_pass=record_pass)
            out[i] = s
            events.append(ev)
        return out, events

    def report(self, values: np.ndarray, events: Sequence[Event]) -> None:
        """Show owner i's released rows values[i] (R, n) to the audit tap."""
        if not tap.enabled():
            return
        for i, o in enumerate(self.owners):
            tap.release(o.agent, values[i], None, events[i])
