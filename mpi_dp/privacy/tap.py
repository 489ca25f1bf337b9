"""The release tap: where a privacy audit sees exactly what leaves a data owner.

Every method reports each noised release of an owner, at the point where it leaves the owner
(the wire), through `release(agent, values, runs, event)`. Outside an audit no tap is active and
the call returns at once. `mpi-dp audit` activates one `Tap` per process for the canary owner
around the very run code `mpi-dp run` executes, so the audit never re-implements a mechanism.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import numpy as np

_ACTIVE: Tap | None = None


class Tap:
    """The first `keep` releases of owner `agent` in each of `runs` run positions.

    `evaluate=False` (an audit's default) lets methods skip their evaluation-only records
    (`evaluating()`), which change nothing that leaves an owner.

    values[k] (runs, d) is release k of every run (NaN where a run made fewer releases);
    events[k] the mechanism event the owner charged for it (the first one reported)."""

    def __init__(self, agent: int, runs: int, keep: int, evaluate: bool = False) -> None:
        if keep < 1:
            raise ValueError(f"keep must be >= 1, got {keep}")
        self.agent, self.runs, self.keep = int(agent), int(runs), int(keep)
        self.evaluate = bool(evaluate)
        self.count = np.zeros(self.runs, dtype=np.int64)
        self.values: list[np.ndarray] = []
        self.events: list[Any] = []

    def record(self, values: np.ndarray, runs: np.ndarray | None, event: Any) -> None:
        v = np.asarray(values, dtype=np.float64)
        idx = np.arange(self.runs) if runs is None else np.asarray(runs, dtype=np.int64)
        v = v.reshape(len(idx), -1)
        k = self.count[idx]
        for rel in np.unique(k[k < self.keep]).tolist():
            while len(self.values) <= rel:
                self.values.append(np.full((self.runs, v.shape[1]), np.nan))
                self.events.append(None)
            sel = k == rel
            self.values[rel][idx[sel]] = v[sel]
            if self.events[rel] is None:
                self.events[rel] = event
        self.count[idx] += 1


def enabled() -> bool:
    """Whether an audit listens (lets a block of many agents skip its per-agent reports)."""
    return _ACTIVE is not None


def evaluating() -> bool:
    """Whether evaluation-only records are wanted: always outside an audit (collective: every
    process of a run has the same tap state)."""
    return _ACTIVE is None or _ACTIVE.evaluate


def release(agent: int, values: np.ndarray, runs: np.ndarray | None = None,
            event: Any = None) -> None:
    """Report release `values` (one row per run in `runs`, all runs when None) of `agent`."""
    tap = _ACTIVE
    if tap is not None and int(agent) == tap.agent:
        tap.record(values, runs, event)


@contextlib.contextmanager
def tapping(tap: Tap) -> Iterator[Tap]:
    """Activate `tap` in this process for the duration of the block."""
    global _ACTIVE
    if _ACTIVE is not None:
        raise RuntimeError("a release tap is already active")
    _ACTIVE = tap
    try:
        yield tap
    finally:
        _ACTIVE = None
