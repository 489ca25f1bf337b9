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

from mpi_dp.privacy import ledger_block, mechanisms, tap
from mpi_dp.privacy.contract import honest_scale
from mpi_dp.privacy.events import Event, GaussianEvent, LaplaceEvent
from mpi_dp.privacy.ledger import Ledger
from mpi_dp.privacy.ledger_block import BlockEvents, LedgerBlock
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
        self._ledger = Ledger(self.agent, budget_eps, budget_delta, runs, target=calibration,
                              allowance=allowance, context=context)

    @property
    def ledger(self) -> Ledger:
        """The owner's ledger (charged before every release)."""
        return self._ledger

    @ledger.setter
    def ledger(self, ledger: Ledger) -> None:
        """Another ledger (a restore from a checkpoint): a block holding this owner rebinds."""
        if ledger is not self._ledger:
            self._ledger = ledger
            ledger_block.ledgers_replaced()

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
    """The owners of one rank that release together each round (`OwnerRelease` each): a
    sensitivity for the round (one, or one per owner), each owner's own scale, every ledger
    charged before the block's noise is drawn, every release reported.

    Charges are array work over the block (privacy.ledger_block): each owner's ledger keeps its
    running sums and counts as rows of (owners, runs) arrays held here, so a round's check and
    record of every owner is one vectorised step with `Ledger.charge`'s arithmetic; ledgers
    stay equal, field for field, to ledgers charged one owner at a time. A refusal raises the
    BudgetExceededError of the first refusing owner (in owner order) and charges no owner of
    the block (one owner at a time, the owners before it would have been charged). Unusual
    charges (a subset of runs, a paper scale missing for some owner, a ledger of record scope
    without the pass, invalid values) go one owner at a time, exactly as before. `owners` is
    fixed (a tuple); an owner's ledger may be replaced (`restore_ledgers`, or
    `owners[i].ledger = ...`): the block notices and rebinds. Owners' calibrations and flags
    are read once.
    """

    def __init__(self, owners: Sequence[OwnerRelease]) -> None:
        self.owners: tuple[OwnerRelease, ...] = tuple(owners)
        self._block: LedgerBlock | None = None
        self._unbound_at: int | None = None  # epoch at which the ledgers could not be bound
        self._info: _OwnersInfo | None = None
        self._made: dict[tuple, BlockEvents] = {}  # the last events of each kind of release

    @property
    def ledgers(self) -> list[Ledger]:
        return [o.ledger for o in self.owners]

    def restore_ledgers(self, ledgers: Sequence[Ledger]) -> None:
        for o, led in zip(self.owners, ledgers, strict=True):
            o.ledger = led

    def _per_owner(self, sensitivity: float | Sequence[float] | np.ndarray) -> np.ndarray:
        """The sensitivity as one float per owner (k,)."""
        k = len(self.owners)
        if np.ndim(sensitivity) == 0:
            return np.full(k, float(sensitivity))
        sens = np.asarray(sensitivity, dtype=np.float64)
        if sens.shape != (k,):
            raise ValueError(f"sensitivity must be a number or one per owner ({k}), got shape "
                             f"{sens.shape}")
        return sens

    def charge(self, sensitivity: float | Sequence[float] | np.ndarray,
               scales: Sequence[float | None] | np.ndarray | None = None, *,
               record_pass: int | None = None, delta: float | None = None
               ) -> tuple[np.ndarray, Sequence[Event]]:
        """Every owner's event for a release of `sensitivity` (a number, or one per owner (k,);
        noise: each owner's calibrated scale, or `scales[i]` of a paper rule; Gaussian owners:
        stated at `delta`, default each plan's), charged to its ledger; returns (scales (k,),
        events (k,): built when read, owners with equal events share one object; the same
        arguments as the last charge give the same events)."""
        return self._charge(self._per_owner(sensitivity), scales, record_pass, delta, None)

    def _charge(self, sens: np.ndarray, scales: Sequence[float | None] | np.ndarray | None,
                record_pass: int | None, delta: float | None, kind: str | None,
                runs: np.ndarray | None = None, scalar: bool = False
                ) -> tuple[np.ndarray, Sequence[Event]]:
        """`charge` for events of mechanism `kind` (None: each owner's own), at `runs`."""
        k = len(self.owners)
        if runs is not None or k == 0:
            return self._charge_each(sens, scales, record_pass, delta, kind, runs, scalar)
        info = self._owners_info()
        sc = self._scale_array(sens, scales, info)
        if sc is None or not (np.all(sens >= 0) and np.all(sc >= 0)):  # NaN, None, negative
            return self._charge_each(sens, scales, record_pass, delta, kind, runs, scalar)
        gauss = info.gaussian if kind is None else np.full(k, kind == "gaussian")
        dl = np.zeros(k)
        if gauss.any():
            if delta is not None:
                dl[gauss] = float(delta)
            else:
                dl[gauss] = info.plan_delta[gauss]
            if not np.all((dl[gauss] > 0.0) & (dl[gauss] < 1.0)):  # their events raise
                return self._charge_each(sens, scales, record_pass, delta, kind, runs, scalar)
        variant = (kind, scalar)
        events = self._events(variant, sens, sc, gauss, dl, delta, scalar, info)
        blk = self._ledger_block()
        if blk is None or not blk.charge(events, record_pass, variant):
            return self._charge_each(sens, scales, record_pass, delta, kind, runs, scalar)
        return sc, events

    def _owners_info(self) -> _OwnersInfo:
        if self._info is None:
            self._info = _OwnersInfo(self.owners)
        return self._info

    def _scale_array(self, sens: np.ndarray, scales: Sequence[float | None] | np.ndarray | None,
                     info: _OwnersInfo) -> np.ndarray | None:
        """Each owner's `OwnerRelease.scale(sens[i], scales[i])`, or None where an owner's is
        not a plain number (None: calibrated; NaN): then one owner at a time."""
        if scales is None:
            with np.errstate(invalid="ignore", over="ignore"):
                cal = honest_scale(info.noise_multiplier, sens)
            return np.where(info.calibrated, cal, 0.0)
        try:
            sc = np.asarray(scales, dtype=np.float64)
        except (TypeError, ValueError):
            return None
        if sc.shape != sens.shape or np.isnan(sc).any():
            return None
        return sc

    def _events(self, variant: tuple, sens: np.ndarray, sc: np.ndarray, gauss: np.ndarray,
                dl: np.ndarray, delta: float | None, scalar: bool, info: _OwnersInfo
                ) -> BlockEvents:
        """The block's events (those of the last charge of this kind where equal, bit for bit)."""
        prev = self._made.get(variant)
        if (prev is not None and prev.raw_delta is delta and _same(prev.sens, sens)
                and _same(prev.scales, sc) and _same(prev.delta, dl)):
            return prev
        cert = info.certified & ~(~gauss & scalar) if scalar else info.certified
        ev = BlockEvents(sens.copy(), sc.copy(), gauss, dl, cert, info.data_dependent,
                         raw_delta=delta, plan_delta=info.raw_plan_delta)
        self._made[variant] = ev
        return ev

    def _ledger_block(self) -> LedgerBlock | None:
        """The owners' ledgers bound as rows (rebound after a ledger was replaced or bound by
        another block); None where they cannot be."""
        ep = ledger_block.epoch()
        blk = self._block
        if blk is not None and blk.epoch == ep:
            return blk
        if blk is None and self._unbound_at == ep:
            return None
        ledgers = self.ledgers
        if blk is not None and blk.holds(ledgers):
            blk.epoch = ep
            return blk
        blk = self._block = LedgerBlock.bind(ledgers)
        if blk is None:
            self._unbound_at = ledger_block.epoch()
        return blk

    def _charge_each(self, sens: np.ndarray, scales: Sequence[float | None] | np.ndarray | None,
                     record_pass: int | None, delta: float | None, kind: str | None,
                     runs: np.ndarray | None = None, scalar: bool = False
                     ) -> tuple[np.ndarray, list[Event]]:
        """`charge` one owner at a time: owner i's event of mechanism `kind` (None: the owner's
        own; 'laplace' / 'gaussian': that of `OwnerRelease.laplace` / `gaussian_noise`), charged
        at `runs`; `scalar` marks Laplace events uncertified (one draw on every coordinate)."""
        given = scales if scales is not None else [None] * len(self.owners)
        out = np.empty(len(self.owners))
        events: list[Event] = []
        made: dict[tuple, Event] = {}
        for i, (o, sc) in enumerate(zip(self.owners, given, strict=True)):
            s_i = float(sens[i])
            s = o.scale(s_i, sc)
            mech = kind or o.mechanism
            key = (s_i, s, o.certified and not scalar, o.data_dependent, mech)
            ev = made.get(key)
            if ev is None:
                ev = made[key] = _owner_event(o, mech, s_i, s, delta, scalar)
            o.ledger.charge(ev, runs, "", record_pass)
            out[i] = s
            events.append(ev)
        return out, events

    def report(self, values: np.ndarray, events: Sequence[Event],
               runs: np.ndarray | None = None) -> None:
        """Show owner i's released rows values[i] (R, n; one per run in `runs`, all runs when
        None) to the audit tap."""
        if not tap.enabled():
            return
        for i, o in enumerate(self.owners):
            tap.release(o.agent, values[i], runs, events[i])

    # -- the mechanisms, for the whole block ---------------------------------------------------
    def laplace(self, values: np.ndarray, streams: Streams,
                sensitivity: float | Sequence[float] | np.ndarray,
                scales: Sequence[float | None] | np.ndarray | None = None,
                runs: np.ndarray | None = None, *, record_pass: int | None = None,
                scalar: bool = False) -> tuple[np.ndarray, np.ndarray, Sequence[Event]]:
        """values (k, R, d) + i.i.d. Laplace noise for every owner: charged, drawn, added,
        reported; returns (released (k, R, d), scales (k,), events). `streams`: k * R rows,
        agent-major (row a * R + r: owner a, run r; `rng.agent_run_streams`). Owner i's rows
        are bit for bit what `OwnerRelease.laplace(values[i], its own streams, sensitivity[i],
        runs, scale=scales[i], scalar=scalar)` releases (a zero scale: no noise, its streams
        not advanced) and its ledger is charged alike."""
        values = np.asarray(values)
        noise, sc, events = self.laplace_noise(streams, values.shape[-1], sensitivity, scales,
                                               runs, record_pass=record_pass, scalar=scalar)
        out = values + noise
        self.report(out, events, runs)
        return out, sc, events

    def laplace_noise(self, streams: Streams, size: int,
                      sensitivity: float | Sequence[float] | np.ndarray,
                      scales: Sequence[float | None] | np.ndarray | None = None,
                      runs: np.ndarray | None = None, *, record_pass: int | None = None,
                      scalar: bool = False) -> tuple[np.ndarray, np.ndarray, Sequence[Event]]:
        """The noise (k, R, size) of a Laplace release of every owner (charged first; the
        caller adds it and reports what leaves the owners), its scales (k,) and events."""
        sens = self._per_owner(sensitivity)
        sc, events = self._charge(sens, scales, record_pass, None, "laplace", runs, scalar)
        return self._noise(streams, sc, size, "laplace", scalar), sc, events

    def gaussian(self, values: np.ndarray, streams: Streams,
                 sensitivity: float | Sequence[float] | np.ndarray,
                 sigmas: Sequence[float | None] | np.ndarray | None = None,
                 runs: np.ndarray | None = None, *, delta: float | None = None,
                 record_pass: int | None = None
                 ) -> tuple[np.ndarray, np.ndarray, Sequence[Event]]:
        """values (k, R, d) + i.i.d. N(0, sigma_i^2) noise (stated at `delta`, default each
        plan's): as `laplace`; owner i's rows bit for bit its `OwnerRelease.gaussian_noise`
        added to its value."""
        values = np.asarray(values)
        noise, sc, events = self.gaussian_noise(streams, values.shape[-1], sensitivity, sigmas,
                                                runs, delta=delta, record_pass=record_pass)
        out = values + noise
        self.report(out, events, runs)
        return out, sc, events

    def gaussian_noise(self, streams: Streams, size: int,
                       sensitivity: float | Sequence[float] | np.ndarray,
                       sigmas: Sequence[float | None] | np.ndarray | None = None,
                       runs: np.ndarray | None = None, *, delta: float | None = None,
                       record_pass: int | None = None
                       ) -> tuple[np.ndarray, np.ndarray, Sequence[Event]]:
        """The noise (k, R, size) of a Gaussian release of every owner (charged first), its
        standard deviations (k,) and events."""
        sens = self._per_owner(sensitivity)
        sc, events = self._charge(sens, sigmas, record_pass, delta, "gaussian", runs)
        return self._noise(streams, sc, size, "standard_normal"), sc, events

    def _noise(self, streams: Streams, scales: np.ndarray, size: int, draw: str,
               scalar: bool = False) -> np.ndarray:
        """(k, R, size): owner i's rows standard draws of its own streams x scales[i], exactly
        as mechanisms.laplace_noise / gaussian_noise draw them for that owner alone (rows of a
        zero scale are zeros and draw nothing; `scalar`: one draw per row on every coordinate).
        """
        k = len(self.owners)
        if k == 0:
            return np.zeros((0, 0, int(size)))
        if len(streams) % k:
            raise ValueError(f"streams must have one row per owner and run ({k} x R), got "
                             f"{len(streams)} rows")
        R = len(streams) // k
        # through the module's samplers (one implementation; an audit's test replaces them)
        sample = mechanisms.laplace_noise if draw == "laplace" else mechanisms.gaussian_noise
        noise = sample(streams, np.repeat(scales, R), 1 if scalar else int(size))
        if scalar:
            noise = noise * np.ones((1, int(size)))
        return noise.reshape(k, R, int(size))


class _OwnersInfo:
    """What a block's charges read of each owner, as arrays (read once)."""

    def __init__(self, owners: Sequence[OwnerRelease]) -> None:
        self.gaussian = np.array([o.mechanism == "gaussian" for o in owners], dtype=bool)
        self.certified = np.array([o.certified for o in owners], dtype=bool)
        self.data_dependent = np.array([o.data_dependent for o in owners], dtype=bool)
        self.calibrated = np.array([o.calibration is not None for o in owners], dtype=bool)
        self.noise_multiplier = np.array(
            [o.calibration.noise_multiplier if o.calibration is not None else np.nan
             for o in owners], dtype=np.float64)
        self.raw_plan_delta = [o.calibration.plan.delta if o.calibration is not None else None
                               for o in owners]
        self.plan_delta = np.array([np.nan if d is None else d for d in self.raw_plan_delta],
                                   dtype=np.float64)


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    """Equal bit for bit (float64 arrays)."""
    return a.shape == b.shape and np.array_equal(a.view(np.uint64), b.view(np.uint64))


def _owner_event(o: OwnerRelease, mech: str, sensitivity: float, scale: float,
                 delta: float | None, scalar: bool = False) -> Event:
    """Owner o's event of one release of mechanism `mech`, as its own path builds it."""
    if mech == "gaussian":
        d = delta if delta is not None else o.calibration.plan.delta
        return GaussianEvent(sensitivity, scale, d, data_dependent=o.data_dependent,
                             certified=o.certified)
    return LaplaceEvent(sensitivity, scale, data_dependent=o.data_dependent,
                        certified=o.certified and not scalar)
