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
from collections.abc import Callable, Sequence
from typing import Any, TypeVar, cast

import numpy as np

from mpi_dp.privacy import ledger_block, mechanisms, tap
from mpi_dp.privacy.calibration import Calibration, Sensitivity, honest_scale, sensitivity_value
from mpi_dp.privacy.events import Event, GaussianEvent, LaplaceEvent
from mpi_dp.privacy.ledger import Ledger
from mpi_dp.privacy.ledger_block import BlockEvents, LedgerBlock
from mpi_dp.privacy.mechanisms import (
    Streams,
    gaussian_mechanism,
    gaussian_perturbation,
    laplace_mechanism,
    laplace_perturbation,
)
from mpi_dp.privacy.noise_streams import RoundNoise

#: a release's sensitivity: a number, or a Sensitivity with the terms a paper's formula reads
Sens = float | Sensitivity
_T = TypeVar("_T")


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
                 clip: float = math.inf, mechanism: str | None = None,
                 streams: Callable[[], Streams] | None = None,
                 purposes: Callable[[str], Any] | None = None) -> None:
        self.agent = int(agent)
        self._mechanism = mechanism
        self.calibration: Calibration | None = calibration
        self.certified = bool(certified)
        self.data_dependent = bool(data_dependent)
        self.clip = float(clip)
        self._ledger = Ledger(self.agent, budget_eps, budget_delta, runs, target=calibration,
                              allowance=allowance, context=context)
        self._seed_streams = streams
        self._streams: Any = None
        self._seek_to: tuple | None = None  # a checkpoint's position for unseeded streams
        self._purposes = purposes
        self._reserved: np.ndarray | None = None  # standard draws (R, count, size) ahead
        self._served = 0
        self._last: tuple[float, float, Event] | None = None  # (sensitivity, scale, event)

    # -- the owner's noise streams (the contract's: seed, 'noise', agent, run) -----------------
    @property
    def streams(self) -> Any:
        """The owner's noise streams, one row per run (seeded when first used): every draw of
        its releases, fused kernels included, comes from them."""
        if self._streams is None:
            if self._seed_streams is None:
                raise ValueError(f"owner {self.agent}'s release path has no noise streams (a "
                                 "block's owner draws through its BlockRelease)")
            self._streams = self._seed_streams()
            if self._seek_to is not None:
                self._streams.seek(self._seek_to)
                self._seek_to = None
        return self._streams

    def noise_position(self) -> tuple:
        """Where the owner's noise streams stand (a checkpoint; the start where never used)."""
        if self._streams is None and self._seek_to is not None:
            return self._seek_to
        return self.streams.position()

    def stream(self, purpose: str) -> Any:
        """The owner's streams of another purpose (seed, purpose, agent, run), e.g. a warm
        start's or a validation score's: new at each call, from their start."""
        if self._purposes is None:
            raise ValueError(f"owner {self.agent}'s release path has no streams of purpose "
                             f"{purpose!r}")
        return self._purposes(purpose)

    def seek_noise(self, position: tuple) -> None:
        """Continue the noise streams at `position` (from `noise_position`)."""
        if self._streams is None:
            self._seek_to = position
        else:
            self._streams.seek(position)

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

    def scale(self, sensitivity: Sens, scale: float | None = None) -> float:
        """The noise scale of a release of `sensitivity`: `scale` where given, else what the
        owner's noise (its calibration, whatever the rule) gives; 0 without one."""
        if scale is not None:
            return float(scale)
        if self.calibration is None:
            return 0.0
        return self.calibration.scale(sensitivity)

    @property
    def gaussian_delta(self) -> float | None:
        """The delta a Gaussian release is stated at (the owner's noise's; None without)."""
        return None if self.calibration is None else self.calibration.gaussian_delta

    def event(self, sensitivity: Sens, scale: float | None = None, *,
              delta: float | None = None) -> Event:
        """The event of one release (Gaussian: stated at `delta`, default the noise's)."""
        sc = self.scale(sensitivity, scale)
        value = float(sensitivity_value(sensitivity))
        if self.mechanism == "gaussian":
            d = delta if delta is not None else self.gaussian_delta
            assert d is not None  # a Gaussian release is stated at a delta
            return GaussianEvent(value, sc, d, data_dependent=self.data_dependent,
                                 certified=self.certified)
        return LaplaceEvent(value, sc, data_dependent=self.data_dependent,
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

    # -- releases: each call charges, draws from the owner's streams, shows the tap, returns -
    def _gens(self, runs: np.ndarray | None) -> Any:
        return self.streams if runs is None else self.streams.subset(runs)

    def add_laplace(self, value: np.ndarray, sensitivity: Sens, runs: np.ndarray | None = None,
                    *, scale: float | np.ndarray | None = None, scalar: bool = False,
                    purpose: str | None = None) -> tuple[np.ndarray, LaplaceEvent]:
        """value (rows, d) + i.i.d. Laplace noise of the owner's scale for `sensitivity` (or
        `scale`): the ledger charged, the noise drawn from the owner's streams (rows: `runs`,
        all by default; `purpose`: streams of another purpose, e.g. a validation score's), the
        release shown to the tap; returns (released, event)."""
        sc = self._scales(sensitivity, scale)
        gens = self._gens(runs) if purpose is None else self.stream(purpose)
        if purpose is not None and runs is not None:
            gens = gens.subset(runs)
        return laplace_mechanism(value, gens, sc, sensitivity_value(sensitivity),
                                 self.ledger, runs, data_dependent=self.data_dependent,
                                 certified=self.certified, scalar=scalar)

    def add_gaussian(self, value: np.ndarray, sensitivity: Sens,
                     runs: np.ndarray | None = None, *, sigma: float | np.ndarray | None = None,
                     delta: float | None = None) -> tuple[np.ndarray, GaussianEvent]:
        """value (rows, d) + i.i.d. N(0, sigma^2) noise, as `add_laplace` (stated at `delta`,
        default the noise's)."""
        sd = self._scales(sensitivity, sigma)
        d = delta if delta is not None else self.gaussian_delta
        assert d is not None  # a Gaussian release is stated at a delta
        return gaussian_mechanism(value, self._gens(runs), sd, sensitivity_value(sensitivity),
                                  d, self.ledger, runs, data_dependent=self.data_dependent,
                                  certified=self.certified)

    def perturb(self, sensitivity: Sens, size: int, update: Callable[[np.ndarray], np.ndarray],
                runs: np.ndarray | None = None, *, scale: float | np.ndarray | None = None,
                delta: float | None = None) -> tuple[np.ndarray, np.ndarray, Event]:
        """A release whose noise enters a computation (objective perturbation): the ledger
        charged, the noise (rows, size) drawn, `update(noise)` computes what leaves the owner,
        the tap shown it; returns (released, noise, event)."""
        sc = self._scales(sensitivity, scale)
        sv = sensitivity_value(sensitivity)
        event: Event
        if self.mechanism == "gaussian":
            d = delta if delta is not None else self.gaussian_delta
            assert d is not None  # a Gaussian release is stated at a delta
            noise, event = gaussian_perturbation(
                self._gens(runs), sc, size, sv, d, self.ledger, runs,
                data_dependent=self.data_dependent, certified=self.certified)
        else:
            noise, event = laplace_perturbation(
                self._gens(runs), sc, size, sv, self.ledger, runs,
                data_dependent=self.data_dependent, certified=self.certified)
        released = update(noise)
        self.report(released, runs, event)
        return released, noise, event

    def fused(self, event: Event | Sequence[Event], kernel: Callable[[Any], _T],
              out: np.ndarray | None, runs: np.ndarray | None = None, one: int | None = None,
              purpose: str | None = None) -> _T:
        """A kernel that draws its own noise (e.g. the squared loss's clipped gradient and its
        noise in one compiled pass, or a release made of several draws): the ledger charged
        `event` (or each of several events) for `runs` (`one`: the run position when there is
        one; all runs by default), then `kernel(streams)` draws from the owner's streams (of
        `purpose`, default its noise streams) and writes the released rows into `out`, which
        the tap is shown (rows per run; None: the kernel reports nothing row-shaped, the tap is
        shown nothing); returns what the kernel returns."""
        events: list[Event] = (list(event) if isinstance(event, list | tuple)
                               else [cast(Event, event)])
        for ev in events:
            if one is not None:
                self.ledger.charge_one(ev, one)
            else:
                self.ledger.charge(ev, runs)
        result = kernel(self.streams if purpose is None else self.stream(purpose))
        if out is not None:
            for ev in events:
                self.report(out, runs, ev)
        return result

    # -- noise drawn ahead (privacy.noise_streams): handed out one release at a time -----------
    def reserve(self, draws: np.ndarray) -> None:
        """Standard noise (R, count, size) drawn ahead from this owner's noise streams, in
        stream order (`Contract.reserve_laplace`); `add_reserved` hands it out release by
        release, after each charge."""
        self._reserved = draws
        self._served = 0

    @property
    def reserved(self) -> np.ndarray | None:
        """The reserved standard draws (R, count, size), for inspection (tests, audits)."""
        return self._reserved

    @property
    def served(self) -> int:
        """Reserved releases made (a checkpoint's position in the reserved noise)."""
        return self._served

    @served.setter
    def served(self, k: int) -> None:
        self._served = int(k)

    def add_reserved(self, value: np.ndarray, sensitivity: float, scale: float
                     ) -> tuple[np.ndarray, Event]:
        """value (R, size) + the next reserved Laplace draw x `scale`: the ledger charged the
        event (sensitivity, scale) first (the same event object while they repeat), the noise
        taken, the tap shown the release; a zero scale adds nothing, draws nothing (no noise:
        eps = inf is still charged)."""
        last = self._last
        if last is not None and last[0] == sensitivity and last[1] == scale:
            ev = last[2]
        else:
            ev = self.event(sensitivity, scale)
            self._last = (sensitivity, scale, ev)
        self.ledger.charge(ev)
        if scale != 0:
            if self._reserved is None or self._served >= self._reserved.shape[1]:
                raise ValueError(f"owner {self.agent}: no reserved noise left for release "
                                 f"{self._served + 1}")
            value = value + scale * self._reserved[:, self._served, :]
            self._served += 1
        self.report(value, None, ev)
        return value, ev

    # -- the mechanisms (given streams; the releases above draw from the owner's own) ----------
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
        d = delta if delta is not None else self.gaussian_delta
        assert d is not None  # a Gaussian release is stated at a delta
        return gaussian_perturbation(gens, sd, size, sensitivity, d, self.ledger, runs,
                                     data_dependent=self.data_dependent, certified=self.certified)

    def _scales(self, sensitivity: Sens | np.ndarray, scale: float | np.ndarray | None
                ) -> float | np.ndarray:
        if scale is not None:
            return scale
        if self.calibration is None:
            return 0.0
        if isinstance(sensitivity, Sensitivity):
            return self.calibration.scale(sensitivity)
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

    def __init__(self, owners: Sequence[OwnerRelease],
                 streams: Callable[[], Any] | None = None, runs: int | None = None) -> None:
        self.owners: tuple[OwnerRelease, ...] = tuple(owners)
        self._block: LedgerBlock | None = None
        self._unbound_at: int | None = None  # epoch at which the ledgers could not be bound
        self._info: _OwnersInfo | None = None
        self._made: dict[tuple, BlockEvents] = {}  # the last events of each kind of release
        self._seed_streams = streams
        self._streams: Any = None
        self._round: RoundNoise | None = None
        self.runs = runs

    # -- the block's noise streams (every owner's own, agent-major: row a R + r) ---------------
    @property
    def streams(self) -> Any:
        """The owners' noise streams as one block (`rng.agent_run_streams`: row a R + r is owner
        a's run r, the bits that owner draws alone), seeded when first used."""
        if self._streams is None:
            if self._seed_streams is None:
                raise ValueError("this block of owners has no noise streams")
            self._streams = self._seed_streams()
        return self._streams

    def round_noise(self, size: int, kind: str, rounds: int | None = None) -> RoundNoise:
        """The block's round-by-round noise (`round`): standard `kind` draws (k, R, size) per
        round from the block's streams, chunks of rounds per call (privacy.noise_streams)."""
        if self._round is None:
            k = len(self.owners)
            R = len(self.streams) // k if k else 0
            self._round = RoundNoise(self.streams, k, R, size, kind, rounds)
        return self._round

    def scales(self, sensitivity: Sens | Sequence[Sens] | np.ndarray) -> np.ndarray:
        """(k,) every owner's noise scale for a release of `sensitivity` (one, or one per
        owner), as its own release path gives it (its noise, whatever the rule)."""
        sens = sensitivity if isinstance(sensitivity, list | tuple) else None
        k = len(self.owners)
        if isinstance(sensitivity, Sensitivity):  # one release's terms: each noise asked once
            sc = self._scale_array(self._per_owner(sensitivity.value), None,
                                   self._owners_info(), sensitivity)
            if sc is not None and not np.isnan(sc).any():
                return sc
        if sens is None and not isinstance(sensitivity, Sensitivity):
            arr = self._per_owner(sensitivity)  # type: ignore[arg-type]
            sc = self._scale_array(arr, None, self._owners_info())
            if sc is not None and not np.isnan(sc).any():
                return sc
            sens = [float(x) for x in arr]
        if sens is None:
            sens = [sensitivity] * k
        if len(sens) != k:
            raise ValueError(f"sensitivity must be one or one per owner ({k}), got {len(sens)}")
        made: dict[tuple, float] = {}
        out = np.empty(k)
        for i, (o, x) in enumerate(zip(self.owners, sens, strict=True)):
            key = (id(o.calibration), x)
            if key not in made:
                made[key] = o.scale(x)
            out[i] = made[key]
        return out

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
            return np.full(k, float(cast(float, sensitivity)))
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
                     info: _OwnersInfo, terms: Sensitivity | None = None) -> np.ndarray | None:
        """Each owner's `OwnerRelease.scale(sens[i], scales[i])`, or None where an owner's is
        not a plain number (None: calibrated; NaN): then one owner at a time. `terms`: the
        release's Sensitivity (value sens[i] for every owner) a paper rule's formula reads."""
        if scales is None:
            with np.errstate(invalid="ignore", over="ignore"):
                cal = honest_scale(info.noise_multiplier, sens)
            out = np.where(info.calibrated, cal, 0.0)
            for c, idx in info.own_formula:  # a paper rule's noise: its formula, per value
                vals = sens[idx]
                if terms is not None:
                    out[idx] = c.scale(terms)
                elif np.all(vals == vals[0]):
                    out[idx] = c.scale(float(vals[0]))
                else:
                    out[idx] = [c.scale(float(v)) for v in vals]
            return out
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

    # -- releases of every owner: charged, drawn from the block's streams, tapped, returned -----
    def add_laplace(self, values: np.ndarray, sensitivity: float | Sequence[float] | np.ndarray,
                    scales: Sequence[float | None] | np.ndarray | None = None,
                    runs: np.ndarray | None = None, *, record_pass: int | None = None,
                    scalar: bool = False) -> tuple[np.ndarray, np.ndarray, Sequence[Event]]:
        """values (k, R, d) + i.i.d. Laplace noise for every owner (scales: `scales`, else each
        owner's noise for `sensitivity`), the ledgers charged first; returns (released, scales
        (k,), events). Owner i's rows are what its own `OwnerRelease.add_laplace` releases."""
        return self.laplace(values, self._gens(runs), sensitivity, scales, runs,
                            record_pass=record_pass, scalar=scalar)

    def add_gaussian(self, values: np.ndarray, sensitivity: float | Sequence[float] | np.ndarray,
                     sigmas: Sequence[float | None] | np.ndarray | None = None,
                     runs: np.ndarray | None = None, *, delta: float | None = None,
                     record_pass: int | None = None
                     ) -> tuple[np.ndarray, np.ndarray, Sequence[Event]]:
        """values (k, R, d) + i.i.d. N(0, sigma_i^2) noise, as `add_laplace`."""
        return self.gaussian(values, self._gens(runs), sensitivity, sigmas, runs, delta=delta,
                             record_pass=record_pass)

    def perturb(self, sensitivity: float | Sequence[float] | np.ndarray, size: int,
                update: Callable[[np.ndarray], np.ndarray],
                scales: Sequence[float | None] | np.ndarray | None = None, *,
                mechanism: str | None = None, delta: float | None = None,
                record_pass: int | None = None
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray, Sequence[Event]]:
        """Every owner's release whose noise enters a computation (objective perturbation):
        the ledgers charged, the noise (k, R, size) drawn (rows of a zero scale are zeros and
        draw nothing), `update(noise)` computes what leaves the owners (k, R, ...), the tap
        shown it; returns (released, noise, scales (k,), events). `mechanism`: 'laplace' or
        'gaussian' (default: each owner's own, which must agree). `scales` (k, R): one per
        owner and run, as `laplace_noise` (returned as given)."""
        mech = mechanism or self._mechanism()
        if mech == "gaussian":
            noise, sc, events = self.gaussian_noise(self.streams, size, sensitivity, scales,
                                                    delta=delta, record_pass=record_pass)
        else:
            noise, sc, events = self.laplace_noise(self.streams, size, sensitivity, scales,
                                                   record_pass=record_pass)
        released = update(noise)
        self.report(released, events)
        return released, noise, sc, events

    def round(self, sensitivity: Sens | Sequence[float] | np.ndarray,
              update: Callable[[np.ndarray | None, np.ndarray], np.ndarray],
              scales: Sequence[float | None] | np.ndarray | None = None, *,
              delta: float | None = None, record_pass: int | None = None
              ) -> tuple[np.ndarray, np.ndarray, Sequence[Event]]:
        """One round of a block that draws every owner's noise together (`round_noise`, set up
        first): the ledgers charged, then, when any owner's scale is positive, the round's
        standard draws Z (k, R, size) taken (None otherwise: nothing drawn), `update(Z, scales)`
        computes what leaves the owners (k, R, ...), the tap shown it; returns (released,
        scales, events). A `Sensitivity` (one for every owner) carries the terms a paper rule's
        formula reads (`scales` of it)."""
        if self._round is None:
            raise ValueError("round() needs round_noise(size, kind) first")
        mech = "gaussian" if self._round.kind == "normal" else "laplace"
        if isinstance(sensitivity, Sensitivity):
            scales = self.scales(sensitivity) if scales is None else scales
            sensitivity = sensitivity.value
        sens = self._per_owner(sensitivity)
        sc, events = self._charge(sens, scales, record_pass, delta, mech)
        Z = self._round.next() if np.any(sc > 0) else None
        released = update(Z, sc)
        self.report(released, events)
        return released, sc, events

    def _gens(self, runs: np.ndarray | None) -> Any:
        if runs is None:
            return self.streams
        k = len(self.owners)
        R = len(self.streams) // k if k else 0
        rows = (np.arange(k)[:, None] * R + np.asarray(runs)[None, :]).ravel()
        return self.streams.subset(rows)

    def _mechanism(self) -> str:
        mechs = {o.mechanism for o in self.owners}
        if len(mechs) > 1:
            raise ValueError("the block's owners release by different mechanisms: name one")
        return mechs.pop() if mechs else "laplace"

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
        caller adds it and reports what leaves the owners), its scales (k,) and events.
        `scales` may also be one per owner and run (k, R) (a sensitivity read from each run's
        data; `sensitivity` then (k, R) too, or one per owner): each row drawn at its own
        scale, each owner charged for its least private run (`_run_scales`); returns those
        scales (k, R)."""
        per_run = _run_scales(sensitivity, scales, len(self.owners))
        if per_run is not None:
            sens, one, drawn = per_run
            _, events = self._charge(sens, one, record_pass, None, "laplace", runs, scalar)
            return self._noise(streams, drawn, size, "laplace", scalar), drawn, events
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
        standard deviations (k,) and events (`sigmas` (k, R): as `laplace_noise`'s scales)."""
        per_run = _run_scales(sensitivity, sigmas, len(self.owners))
        if per_run is not None:
            sens, one, drawn = per_run
            _, events = self._charge(sens, one, record_pass, delta, "gaussian", runs)
            return self._noise(streams, drawn, size, "standard_normal"), drawn, events
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
        if k == 0:  # a rank hosting no owner (the learner's)
            return np.zeros((0, self.runs or 0, int(size)))
        if len(streams) % k:
            raise ValueError(f"streams must have one row per owner and run ({k} x R), got "
                             f"{len(streams)} rows")
        R = len(streams) // k
        # through the module's samplers (one implementation; an audit's test replaces them)
        sample = mechanisms.laplace_noise if draw == "laplace" else mechanisms.gaussian_noise
        if np.ndim(scales) == 2:  # one scale per owner and run (row a R + r)
            if np.shape(scales) != (k, R):
                raise ValueError(f"scales must be one per owner, or per owner and run ({k} x "
                                 f"{R}), got shape {np.shape(scales)}")
            rows = np.asarray(scales, dtype=np.float64).reshape(-1)
        else:
            rows = np.repeat(scales, R)
        noise = sample(streams, rows, 1 if scalar else int(size))
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
        self.raw_plan_delta = [o.calibration.gaussian_delta if o.calibration is not None
                               else None for o in owners]
        #: owners whose noise has its own formula (a paper rule), grouped by calibration
        groups: dict[int, tuple[Calibration, list[int]]] = {}
        for i, o in enumerate(owners):
            c = o.calibration
            if c is not None and type(c).scale is not Calibration.scale:
                groups.setdefault(id(c), (c, []))[1].append(i)
        self.own_formula = [(c, np.asarray(idx, dtype=np.int64)) for c, idx in groups.values()]
        self.plan_delta = np.array([np.nan if d is None else d for d in self.raw_plan_delta],
                                   dtype=np.float64)


def _run_scales(sensitivity: Any, scales: Any, k: int
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """Where `scales` are one per owner and run (k, R): (each owner's event sensitivity (k,),
    its event scale (k,), the scales (k, R)), the event of owner i that of its least private run
    (largest sensitivity / scale, the first on a tie: what an owner's own path states for
    per-row scales, mechanisms.laplace_perturbation); `sensitivity` a number, one per owner
    (k,) or one per owner and run (k, R). None where `scales` are not (k, R)."""
    if scales is None or np.ndim(scales) != 2:
        return None
    sc = np.asarray(scales, dtype=np.float64)
    sens = np.asarray(sensitivity, dtype=np.float64)
    if sens.ndim == 1:
        sens = sens[:, None]
    if sc.shape[0] != k:
        raise ValueError(f"scales must be one per owner and run ({k} x R), got shape {sc.shape}")
    sens = np.broadcast_to(sens, sc.shape)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(sens == 0, 0.0, np.where(sc == 0, np.inf, sens / sc))
    r = np.argmax(ratio, axis=1)
    rows = np.arange(k)
    return (np.asarray(sens[rows, r], dtype=np.float64),
            np.asarray(sc[rows, r], dtype=np.float64), sc)


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    """Equal bit for bit (float64 arrays)."""
    return a.shape == b.shape and np.array_equal(a.view(np.uint64), b.view(np.uint64))


def _owner_event(o: OwnerRelease, mech: str, sensitivity: float, scale: float,
                 delta: float | None, scalar: bool = False) -> Event:
    """Owner o's event of one release of mechanism `mech`, as its own path builds it."""
    if mech == "gaussian":
        if delta is not None:
            d = delta
        else:
            assert o.calibration is not None  # a Gaussian owner has its noise
            d = o.calibration.gaussian_delta
        return GaussianEvent(sensitivity, scale, d, data_dependent=o.data_dependent,
                             certified=o.certified)
    return LaplaceEvent(sensitivity, scale, data_dependent=o.data_dependent,
                        certified=o.certified and not scalar)


def row_generator(streams: Any, row: int) -> np.random.Generator:
    """A numpy Generator continuing row `row` of `streams` (mpi_dp.pcg.RunStreams): the bits
    `rng.stream(seed, purpose, agent, run)` draws from that point (for a release whose draws
    are numpy's own, e.g. a Gamma norm); the streams themselves do not advance."""
    bg = np.random.PCG64()
    bg.state = streams.state(int(row))
    return np.random.Generator(bg)
