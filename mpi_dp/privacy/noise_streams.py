"""Noise drawn ahead for owners that release every round (a block's round noise) or a known number
of times (reserved noise): the draws come from the owners' own streams in the order their
releases take them, so the numbers are those each owner draws alone, one release at a time.

Drawing ahead is how the noise is read, not when it is used: a release path (privacy.release)
hands a draw out only after its ledger charge, and nothing else reads these buffers.

Pure NumPy (mpi_dp.pcg streams), no MPI.
"""

from __future__ import annotations

from typing import Any

import numpy as np

#: rounds of noise drawn per call: at most this many doubles per agent, and at most
#: NOISE_BLOCK_DOUBLES for the whole block (10,000 agents: a few rounds per call). Any chunking
#: draws the same numbers (each row is one agent's own stream, draws are chunk-invariant,
#: checked in tests), so the block size never changes the noise.
NOISE_DOUBLES = 2**16
NOISE_BLOCK_DOUBLES = 2**22

KINDS = ("laplace", "normal")


class RoundNoise:
    """Standard Laplace or normal draws (k, R, n) per round for a block's k owners, from their
    streams as one `rng.agent_run_streams` (row a R + r: owner a, run r, the bits that owner
    draws alone): chunks of rounds per call, the same numbers for any chunking and any block."""

    def __init__(self, streams: Any, k: int, R: int, n: int, kind: str,
                 rounds: int | None = None) -> None:
        if kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
        self.kind = kind
        self.left = rounds  # rounds still to draw (None: unbounded); caps the chunk
        self.k, self.R, self.n = k, R, n
        self.streams = streams
        # rounds per chunk: as one agent drew them, capped so the block's buffer stays small
        per_round = max(1, self.R * n)
        self.C = max(1, min(NOISE_DOUBLES // per_round,
                            NOISE_BLOCK_DOUBLES // (per_round * max(1, self.k))))
        self._buf = np.zeros((self.k, self.R, 0, n))
        self._j = 0
        self._start = self.streams.position()  # where the buffer's draws began

    def _draw(self, size: int) -> np.ndarray:
        """(k R, size) draws of every row (advancing the streams)."""
        s = self.streams
        return (s.laplace if self.kind == "laplace" else s.standard_normal)(size)

    def next(self) -> np.ndarray:
        """The next round's draws (k, R, n)."""
        if self._j >= self._buf.shape[2]:
            C = self.C if self.left is None else max(1, min(self.C, self.left))
            self._start = self.streams.position()
            # C order, as one agent's (R, C n) draws were: the round's slice then has the old
            # strides, so the reductions over it (e.g. a noise norm) add in the same order
            self._buf = np.ascontiguousarray(self._draw(C * self.n)).reshape(
                self.k, self.R, C, self.n)
            self._j = 0
        out = self._buf[:, :, self._j]
        self._j += 1
        if self.left is not None:
            self.left -= 1
        return out

    def positions(self) -> list:
        """Every owner's stream position at its next unconsumed draw (a checkpoint; per owner
        (h, lo) of its R runs, in block order): the buffer's consumed rounds redrawn from its
        start (the live streams are left where they are)."""
        now = self.streams.position()
        self.streams.seek(self._start)
        self._draw(self._j * self.n)
        h, lo = self.streams.position()
        self.streams.seek(now)
        h, lo = h.reshape(self.k, self.R), lo.reshape(self.k, self.R)
        return [(h[a], lo[a]) for a in range(self.k)]

    def seek(self, positions: list, left: int | None) -> None:
        """Continue every owner's streams at `positions` (from `positions()`), `left` rounds to
        draw; the draws are the same for any chunking, so the buffer is simply dropped."""
        shape = (self.k * self.R,)
        h = np.array([p[0] for p in positions], dtype=np.uint64).reshape(shape)
        lo = np.array([p[1] for p in positions], dtype=np.uint64).reshape(shape)
        self.streams.seek((h, lo))
        self._start = self.streams.position()
        self._buf = np.zeros((self.k, self.R, 0, self.n))
        self._j = 0
        self.left = left
