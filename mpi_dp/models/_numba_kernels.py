"""The numba-compiled kernels behind mpi_dp.models.kernels (imported only when numba is used).

Elementwise kernels repeat NumPy's operations in NumPy's order (no fused multiply-add: numba
compiles without fastmath), so they give the same bits; reductions (dot products, norms) add in
loop order, which can differ from NumPy's (BLAS, pairwise) in the last bits. Compiled on first use
and cached on disk (cache=True) next to this file.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

_U = np.uint64
_M32 = _U(0xFFFFFFFF)
_S32 = _U(32)
_S11 = _U(11)
_S58 = _U(58)
_C63 = _U(63)
_C64 = _U(64)
#: PCG64's 128-bit LCG multiplier (mpi_dp.pcg.MULT), high and low words
_MH = _U(2549297995355413924)
_ML = _U(4865540595714422341)
_TO_DOUBLE = 1.0 / 9007199254740992.0


@njit(cache=True)
def sq_clipped_grad(X, y, thr, thetas, out, counts):
    """Rows r of `thetas`: out[r] = sum_i clamp(2 (x_i . theta_r - y_i), +-thr_i) x_i; counts[r]
    = records whose derivative was clamped (|d| > thr_i)."""
    n, p = X.shape
    for r in range(thetas.shape[0]):
        for j in range(p):
            out[r, j] = 0.0
        c = 0
        for i in range(n):
            z = 0.0
            for j in range(p):
                z += X[i, j] * thetas[r, j]
            d = (z - y[i]) * 2.0
            t = thr[i]
            if abs(d) > t:
                c += 1
                if d > t:
                    d = t
                if d < -t:
                    d = -t
            for j in range(p):
                out[r, j] += d * X[i, j]
        counts[r] = c


@njit(cache=True)
def pcg_uniform_parts(h, lo, inc_h, inc_l, rows, w, s):
    """Rows `rows` of PCG64 states (h, lo; increments inc_h, inc_l) each draw w.shape[1] nonzero
    uniforms u (numpy's next_double; a zero is skipped as numpy's laplace does) and advance; per
    draw w = min(2u, 2 - 2u) and s = 2u - 1 (Laplace = copysign(log w, s), mpi_dp.pcg)."""
    size = w.shape[1]
    for i in range(rows.shape[0]):
        r = rows[i]
        sh, sl, ih, il = h[r], lo[r], inc_h[r], inc_l[r]
        j = 0
        while j < size:
            # state = state * MULT + inc (mod 2^128)
            a0, a1 = sl & _M32, sl >> _S32
            b0, b1 = _ML & _M32, _ML >> _S32
            p00, p01, p10 = a0 * b0, a0 * b1, a1 * b0
            mid = (p00 >> _S32) + (p01 & _M32) + (p10 & _M32)
            hi = a1 * b1 + (p01 >> _S32) + (p10 >> _S32) + (mid >> _S32)
            hi = hi + sl * _MH + sh * _ML
            nl = sl * _ML + il
            carry = _U(1) if nl < il else _U(0)
            sh = hi + ih + carry
            sl = nl
            # XSL-RR output
            x = sh ^ sl
            rot = sh >> _S58
            v = (x >> rot) | (x << ((_C64 - rot) & _C63))
            u = float(np.int64(v >> _S11)) * _TO_DOUBLE
            if u != 0.0:
                t = u + u
                m = 2.0 - t
                w[i, j] = t if t < m else m
                s[i, j] = t - 1.0
                j += 1
        h[r] = sh
        lo[r] = sl


@njit(cache=True)
def owner_parts(X, y, thr, thetas, grad, counts, h, lo, inc_h, inc_l, rows, w, s, draw):
    """sq_clipped_grad, then (if `draw`) pcg_uniform_parts: one call for the owner's answer."""
    sq_clipped_grad(X, y, thr, thetas, grad, counts)
    if draw:
        pcg_uniform_parts(h, lo, inc_h, inc_l, rows, w, s)


@njit(cache=True)
def finish_answer(grad, n, logw, s, scale, out):
    """out = grad / n + copysign(logw, s) * scale (a Laplace draw times its scale); returns
    whether every value is finite."""
    ok = True
    for r in range(out.shape[0]):
        for j in range(out.shape[1]):
            v = grad[r, j] / n + math.copysign(logw[r, j], s[r, j]) * scale
            out[r, j] = v
            if not math.isfinite(v):
                ok = False
    return ok


@njit(cache=True)
def query_points(theta_L, theta_loc, i, out):
    """out[r] = 0.5 * (theta_L[r] + theta_loc[r, i])."""
    for r in range(out.shape[0]):
        for j in range(out.shape[1]):
            out[r, j] = 0.5 * (theta_L[r, j] + theta_loc[r, i, j])


@njit(cache=True)
def learner_step(theta_L, theta_loc, i, tb, resp, lam, two_n, a_own, a_ctr, w_i, box):
    """Steps (5) and (7) of every run for owner i, in Learner.update's order of operations:
    g = lam tb; theta_loc[r, i] = clip(tb - a_own (g / 2N + w_i resp)); theta_L[r] =
    clip(tb - a_ctr g). Returns whether theta_L stayed finite."""
    ok = True
    for r in range(tb.shape[0]):
        for j in range(tb.shape[1]):
            t = tb[r, j]
            g = lam * t
            loc = t - a_own * (g / two_n + w_i * resp[r, j])
            theta_loc[r, i, j] = _clip(loc, box)
            c = _clip(t - a_ctr * g, box)
            theta_L[r, j] = c
            if not math.isfinite(c):
                ok = False
    return ok


@njit(cache=True, inline="always")
def _clip(v, box):
    """np.clip(v, -box, box) (a NaN stays NaN)."""
    if v < -box:
        return -box
    if v > box:
        return box
    return v


@njit(cache=True)
def row_norms(a, out):
    """out[r] = sqrt(sum_j a[r, j]^2), summed in index order."""
    for r in range(a.shape[0]):
        acc = 0.0
        for j in range(a.shape[1]):
            acc += a[r, j] * a[r, j]
        out[r] = math.sqrt(acc)
