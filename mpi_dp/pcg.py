"""Vectorised run streams: numpy's PCG64, seeded by numpy's SeedSequence, for many runs at once.

An R-run job used to build R `numpy.random.Generator` objects per owner (about 17 us each) and
draw from them one run at a time; an audit with R = 1e5 spent most of its time there. `RunStreams`
holds the R PCG64 states as uint64 arrays and draws a (rows, size) block with one 128-bit LCG
step per position for all rows at once (few rows and many positions: per row through numpy's
own PCG64, its state set from the row). Seeding follows numpy's SeedSequence word for word, so row r
produces exactly the uint64 stream of ``np.random.Generator(np.random.PCG64(seed_sequence))`` of
run r (tested bitwise), and run r of an R-run job draws what the single-run job r draws.

Laplace draws follow numpy's algorithm (one double per draw, U = 0 redrawn) with the exact
2 - 2u where numpy rounds 2.0 - u - u, so they equal ``Generator.laplace`` to about 1e-15.
Gaussian draws are *not* numpy's ziggurat: they are the inverse normal CDF of one 53-bit uniform
at a cell centre, exact in distribution and one uint64 per draw, which keeps rows independent of
each other and positions computable.
"""

from __future__ import annotations

from typing import TypedDict

import numpy as np
from scipy.special import ndtri

M32 = 0xFFFFFFFF
M64 = (1 << 64) - 1
M128 = (1 << 128) - 1
#: PCG64's 128-bit LCG multiplier (numpy: PCG_DEFAULT_MULTIPLIER_HIGH/LOW)
MULT = (2549297995355413924 << 64) | 4865540595714422341
# SeedSequence constants (numpy/random/bit_generator.pyx)
INIT_A, MULT_A, INIT_B, MULT_B = 0x43B0D7E5, 0x931E8875, 0x8B51F9DD, 0x58F38DED
MIX_MULT_L, MIX_MULT_R, XSHIFT = 0xCA01F9DD, 0x4973F715, 16
POOL = 4
_MULT_INV = pow(MULT, -1, 1 << 128)

_U32 = np.uint32
_U64 = np.uint64


def _words(n: int) -> list[int]:
    """numpy's _int_to_uint32_array: little-endian 32-bit words, [0] for 0."""
    if n < 0:
        raise ValueError("seed words must be non-negative")
    out = []
    while True:
        out.append(n & M32)
        n >>= 32
        if n == 0:
            return out


def _seed_states(seed: int, key: tuple[int | np.ndarray, ...], runs: np.ndarray) -> np.ndarray:
    """(R, 4) uint64: SeedSequence(seed, spawn_key=key + (run,)).generate_state(4, uint64) of
    each row. A key element is one int for every row, or an array of R ints (each < 2**32, one
    seed word, as such an int is): e.g. the agent of each row of a block of agents."""
    run_entropy = _words(seed)
    run_entropy += [0] * max(0, POOL - len(run_entropy))
    R = runs.size
    if np.any(runs >= 2**32):
        raise ValueError("run indices must be < 2**32")
    cols = [np.full(R, w, dtype=_U32) for w in run_entropy]
    for k in key:
        if np.ndim(k) == 0:
            cols += [np.full(R, w, dtype=_U32) for w in _words(int(k))]
            continue
        k = np.asarray(k, dtype=np.int64).reshape(-1)
        if k.size != R or np.any((k < 0) | (k >= 2**32)):
            raise ValueError("a per-row seed key needs one value in [0, 2**32) per row")
        cols.append(k.astype(_U32))
    cols.append(runs.astype(_U32))
    hc = [INIT_A]

    def hashmix(v: np.ndarray) -> np.ndarray:
        v = v ^ _U32(hc[0])
        hc[0] = (hc[0] * MULT_A) & M32
        v = v * _U32(hc[0])
        return v ^ (v >> _U32(XSHIFT))

    def mix(x: np.ndarray, y: np.ndarray) -> np.ndarray:
        r = _U32(MIX_MULT_L) * x - _U32(MIX_MULT_R) * y
        return r ^ (r >> _U32(XSHIFT))

    pool = [hashmix(cols[i]) for i in range(POOL)]
    for i_src in range(POOL):
        for i_dst in range(POOL):
            if i_src != i_dst:
                pool[i_dst] = mix(pool[i_dst], hashmix(pool[i_src]))
    for i_src in range(POOL, len(cols)):
        for i_dst in range(POOL):
            pool[i_dst] = mix(pool[i_dst], hashmix(cols[i_src]))
    hb = INIT_B
    words = []
    for i in range(8):
        v = pool[i % POOL] ^ _U32(hb)
        hb = (hb * MULT_B) & M32
        v = v * _U32(hb)
        words.append(v ^ (v >> _U32(XSHIFT)))
    return np.stack([words[2 * k].astype(_U64) | (words[2 * k + 1].astype(_U64) << _U64(32))
                     for k in range(4)], axis=1)


def _mulhi(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """High 64 bits of the 128-bit product of uint64 arrays."""
    m = _U64(M32)
    s = _U64(32)
    a0, a1, b0, b1 = a & m, a >> s, b & m, b >> s
    p00, p01, p10, p11 = a0 * b0, a0 * b1, a1 * b0, a1 * b1
    mid = (p00 >> s) + (p01 & m) + (p10 & m)
    return p11 + (p01 >> s) + (p10 >> s) + (mid >> s)


def _mul128(ah, al, bh, bl) -> tuple[np.ndarray, np.ndarray]:
    """(a * b) mod 2^128 as (high, low) uint64 arrays (broadcasting)."""
    return _mulhi(al, bl) + al * bh + ah * bl, al * bl


def _add128(ah, al, bh, bl) -> tuple[np.ndarray, np.ndarray]:
    lo = al + bl
    return ah + bh + (lo < al).astype(_U64), lo


def _split(x: int) -> tuple[np.uint64, np.uint64]:
    return _U64(x >> 64), _U64(x & M64)


_TO_DOUBLE = 1.0 / 9007199254740992.0


def laplace_from_uniform(u: np.ndarray) -> np.ndarray:
    """Laplace(0, 1) from uniforms in (0, 1) (overwritten): -log(2 - 2u) for u >= 1/2, else
    log(2u). numpy computes 2.0 - u - u, which rounds once in 2.0 - u; 2u is exact and so is
    2 - 2u for 2u in [1, 2) (Sterbenz), so these draws are the exact formula at u (equal to
    numpy's except where that rounding moves the last bit)."""
    u += u                       # t = 2u, exact
    w = 2.0 - u                  # exact where it is used (t >= 1)
    np.minimum(u, w, out=w)      # t below 1, else 2 - t
    u -= 1.0                     # its sign picks the branch (+0 at u = 1/2, as numpy's 0.0 - 0.0)
    np.log(w, out=w)
    return np.copysign(w, u, out=w)


def _to_double(raw: np.ndarray) -> np.ndarray:
    """numpy's next_double of raw uint64 outputs: (raw >> 11) * 2^-53, in [0, 1)."""
    raw >>= _U64(11)
    u = raw.view(np.int64).astype(np.float64)
    u *= _TO_DOUBLE
    return u


def normal_from_raw(raw: np.ndarray) -> np.ndarray:
    """N(0, 1) from raw uint64 outputs: the inverse CDF at the centre of the 53-bit cell."""
    return ndtri(((raw >> _U64(11)) + 0.5) * _TO_DOUBLE)


def generator_laplace(g: np.random.Generator, size: int) -> np.ndarray:
    """Laplace(0, 1) from a numpy Generator, the same bits as a RunStreams row in its state."""
    u = _to_double(g.bit_generator.random_raw(size))
    if np.any(u == 0.0):  # numpy semantics: a zero is skipped, later values shift by one
        vals = [x for x in u if x != 0.0]
        while len(vals) < size:
            x = (int(g.bit_generator.random_raw()) >> 11) * _TO_DOUBLE
            if x != 0.0:
                vals.append(x)
        u = np.array(vals)
    return laplace_from_uniform(u)


def generator_normal(g: np.random.Generator, size: int) -> np.ndarray:
    """N(0, 1) from a numpy Generator, the same bits as a RunStreams row in its state."""
    return normal_from_raw(g.bit_generator.random_raw(size))


class _PCG64Internal(TypedDict):
    state: int
    inc: int


class PCG64State(TypedDict):
    """numpy's PCG64 `state` dict (`RunStreams.state`; what `PCG64.state` reads and takes)."""

    bit_generator: str
    state: _PCG64Internal
    has_uint32: int
    uinteger: int


_PCG64: list[np.random.PCG64] = []


def _scratch_pcg64() -> np.random.PCG64:
    """One reusable numpy PCG64 whose whole state is set before each use (building one seeds it
    from the OS, ~10 us)."""
    if not _PCG64:
        _PCG64.append(np.random.PCG64(0))
    return _PCG64[0]


class RunStreams:
    """The noise (or other purpose) streams of a set of runs of one agent (or of a block of
    agents: `rng.agent_run_streams`), drawn as blocks.

    Row r is the stream `mpi_dp.rng.stream(seed, purpose, agent, runs[r])` (agent: the key's
    agent, or its r-th entry when the key holds one per row). `subset(rows)` gives a
    view that draws from (and advances) only those rows of this object.
    """

    def __init__(self, seed: int, key: tuple[int | np.ndarray, ...], runs: np.ndarray) -> None:
        runs = np.asarray(runs, dtype=np.int64).reshape(-1)
        st = _seed_states(int(seed), tuple(k if np.ndim(k) else int(k) for k in key), runs)
        # numpy pcg64_set_seed + srandom_r: state = 0; inc = (initseq << 1) | 1; step;
        # state += initstate; step
        self.inc_h = (st[:, 2] << _U64(1)) | (st[:, 3] >> _U64(63))
        self.inc_l = (st[:, 3] << _U64(1)) | _U64(1)
        mh, ml = _split(MULT)
        h, lo = self.inc_h.copy(), self.inc_l.copy()  # step from 0: 0 * a + inc
        h, lo = _add128(h, lo, st[:, 0], st[:, 1])
        h, lo = _mul128(h, lo, mh, ml)
        self.h, self.lo = _add128(h, lo, self.inc_h, self.inc_l)
        self.runs = runs

    def __len__(self) -> int:
        return self.runs.size

    def subset(self, rows) -> RunStreamsView:
        return RunStreamsView(self, np.asarray(rows, dtype=np.int64).reshape(-1))

    # -- raw blocks --------------------------------------------------------------------------
    def _block(self, rows: np.ndarray, size: int) -> np.ndarray:
        """(len(rows), size) uint64 outputs of those rows; advances them by `size`.

        Many rows: one LCG step per position for all rows at once. Few rows and many positions:
        per row through numpy's own PCG64 (its state set from the row). Both give the same bits.
        """
        if size == 0 or rows.size == 0:
            return np.empty((rows.size, size), dtype=_U64)
        if rows.size >= 2 * size or size <= 8:
            return self._block_columns(rows, size)
        out = np.empty((rows.size, size), dtype=_U64)
        bg = _scratch_pcg64()
        for i, r in enumerate(rows):
            bg.state = self.state(int(r))
            out[i] = bg.random_raw(size)
            st = bg.state["state"]["state"]
            self.h[r], self.lo[r] = _U64(st >> 64), _U64(st & M64)
        return out

    def _block_columns(self, rows: np.ndarray, size: int) -> np.ndarray:
        """One LCG step per position for all rows (in-place uint64 arithmetic)."""
        m, s32, s58, c63 = _U64(M32), _U64(32), _U64(58), _U64(63)
        mh, ml = _split(MULT)
        b0, b1 = ml & m, ml >> s32
        h, lo = self.h[rows], self.lo[rows]
        ih, il = self.inc_h[rows], self.inc_l[rows]
        n = rows.size
        out = np.empty((size, n), dtype=_U64)
        a0, a1, t, u, hi = (np.empty(n, dtype=_U64) for _ in range(5))
        for j in range(size):
            np.bitwise_and(lo, m, out=a0)
            np.right_shift(lo, s32, out=a1)
            np.multiply(a1, b1, out=hi)            # hi = a1 b1
            np.multiply(h, ml, out=t)
            hi += t                                # + h ml
            np.multiply(lo, mh, out=t)
            hi += t                                # + lo mh
            np.multiply(a0, b1, out=t)             # p01
            np.right_shift(t, s32, out=u)
            hi += u
            t &= m
            np.multiply(a0, b0, out=u)             # p00
            u >>= s32
            t += u                                 # mid = (p00 >> 32) + (p01 & m) ...
            np.multiply(a1, b0, out=u)             # p10
            a0[:] = u
            a0 >>= s32
            hi += a0
            u &= m
            t += u                                 # ... + (p10 & m)
            t >>= s32
            hi += t                                # high word of lo * ml, done
            np.multiply(lo, ml, out=lo)
            lo += il
            hi += ih
            np.less(lo, il, out=t, casting="unsafe")  # carry of the low word
            np.add(hi, t, out=h)
            # XSL-RR output
            x = out[j]
            np.bitwise_xor(h, lo, out=x)
            np.right_shift(h, s58, out=a1)         # rot
            np.right_shift(x, a1, out=u)
            np.negative(a1, out=a1)
            a1 &= c63
            np.left_shift(x, a1, out=x)
            x |= u
        self.h[rows], self.lo[rows] = h, lo
        return out.T

    def _one(self, row: int) -> int:
        """One uint64 of one row (the rare redraw path)."""
        return int(self._block(np.array([row]), 1)[0, 0])

    def uint64(self, size: int, rows: np.ndarray | None = None) -> np.ndarray:
        return self._block(self._rows(rows), int(size))

    def random(self, size: int, rows: np.ndarray | None = None) -> np.ndarray:
        """Uniform [0, 1) doubles: numpy's next_double, (u >> 11) * 2^-53."""
        return _to_double(self._block(self._rows(rows), int(size)))

    def laplace(self, size: int, rows: np.ndarray | None = None) -> np.ndarray:
        """Laplace(0, 1) as numpy's random_laplace: U >= 0.5: -log(2 - 2U); U > 0: log(2U);
        U = 0: the next double of that row is used instead (probability 2^-53 per draw)."""
        rows = self._rows(rows)
        size = int(size)
        u = self.random(size, rows)
        if not u.all():
            zero = np.argwhere(u == 0.0)
            if len(zero):  # exact numpy semantics: redraw in place, later positions shift by one
                for i in np.unique(zero[:, 0]):
                    u[i] = self._redraw_row(int(rows[i]), size)
        return laplace_from_uniform(u)

    def _redraw_row(self, row: int, size: int) -> np.ndarray:
        """Row `row` drew a zero among its last `size` doubles: rewind it and redraw them one by
        one as numpy does (a zero is skipped and the row's later values shift by one)."""
        self._rewind(row, size)
        out: list[float] = []
        while len(out) < size:
            v = (self._one(row) >> 11) * _TO_DOUBLE
            if v != 0.0:
                out.append(v)
        return np.array(out)

    def _rewind(self, row: int, k: int) -> None:
        """Move one row k steps back: s = a^-k (s' - g_k inc), a odd so invertible mod 2^128."""
        s = (int(self.h[row]) << 64) | int(self.lo[row])
        inc = (int(self.inc_h[row]) << 64) | int(self.inc_l[row])
        for _ in range(k):
            s = ((s - inc) * _MULT_INV) & M128
        self.h[row], self.lo[row] = _U64(s >> 64), _U64(s & M64)

    def standard_normal(self, size: int, rows: np.ndarray | None = None) -> np.ndarray:
        """N(0, 1) by the inverse CDF of the 53-bit uniform's cell centre (one uint64 each)."""
        return normal_from_raw(self._block(self._rows(rows), int(size)))

    def _rows(self, rows: np.ndarray | None) -> np.ndarray:
        return np.arange(len(self)) if rows is None else np.asarray(rows, dtype=np.int64)

    def position(self) -> tuple[np.ndarray, np.ndarray]:
        """Every row's place in its stream (a checkpoint); `seek` returns there."""
        return self.h.copy(), self.lo.copy()

    def seek(self, position: tuple[np.ndarray, np.ndarray]) -> None:
        self.h[:], self.lo[:] = position

    def state(self, row: int) -> PCG64State:
        """numpy's PCG64 `state` dict of one row (to continue it as a numpy Generator)."""
        return {"bit_generator": "PCG64",
                "state": {"state": (int(self.h[row]) << 64) | int(self.lo[row]),
                          "inc": (int(self.inc_h[row]) << 64) | int(self.inc_l[row])},
                "has_uint32": 0, "uinteger": 0}


class RunStreamsView:
    """Rows `idx` of a RunStreams, drawn and advanced in the parent."""

    def __init__(self, parent: RunStreams, idx: np.ndarray) -> None:
        self.parent, self.idx = parent, idx

    def __len__(self) -> int:
        return self.idx.size

    def subset(self, rows) -> RunStreamsView:
        return RunStreamsView(self.parent, self.idx[np.asarray(rows, dtype=np.int64).reshape(-1)])

    def _map(self, rows):
        return self.idx if rows is None else self.idx[np.asarray(rows, dtype=np.int64)]

    def laplace(self, size: int, rows=None) -> np.ndarray:
        return self.parent.laplace(size, self._map(rows))

    def standard_normal(self, size: int, rows=None) -> np.ndarray:
        return self.parent.standard_normal(size, self._map(rows))

    def random(self, size: int, rows=None) -> np.ndarray:
        return self.parent.random(size, self._map(rows))
