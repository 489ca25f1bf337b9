"""Small kernels of the asynchronous star's hot path: numba when installed, else NumPy.

The live learner serves one owner at a time, so every update is a handful of operations on arrays
of d ~ 10 numbers, where NumPy's per-call overhead (~1 us a call, ~40 calls an update) dominates.
With numba (the optional extra `mpi_dp[fast]`) these kernels are compiled loops; without it the
NumPy versions below run, and they give the same numbers as the code they replace:

- elementwise kernels (query points, the learner's two projected steps, the Laplace draws) give
  the same bits on both backends (same operations in the same order; the Laplace log is NumPy's on
  both);
- reductions (the owner's clipped gradient sum, response norms) add in loop order with numba and
  in BLAS / pairwise order with NumPy: equal to ~1e-15 relative, not bit for bit.

The backend is chosen per process, never per mode, so a live run and the replay of its schedule
take the same path (bitwise equal); `MPI_DP_NUMBA=0` forces NumPy. numba is imported (and its
kernels compiled or loaded from the on-disk cache) on first use only.
"""

from __future__ import annotations

import importlib.util
import os

import numpy as np

from ..pcg import RunStreams
from . import linear

_AVAILABLE = importlib.util.find_spec("numba") is not None
_use_numba = _AVAILABLE and os.environ.get("MPI_DP_NUMBA", "1").strip() not in ("0", "")
_nb = None  # the compiled module, once imported


def available() -> bool:
    """Whether numba can be imported."""
    return _AVAILABLE


def backend() -> str:
    """'numba' or 'numpy': the backend this process uses."""
    return "numba" if _use_numba else "numpy"


def set_backend(name: str) -> str:
    """Switch this process to 'numba' or 'numpy' (tests); returns the previous backend."""
    global _use_numba
    if name not in ("numba", "numpy"):
        raise ValueError(f"backend must be 'numba' or 'numpy', not {name!r}")
    if name == "numba" and not _AVAILABLE:
        raise RuntimeError("numba is not installed (pip install 'mpi_dp[fast]')")
    old = backend()
    _use_numba = name == "numba"
    return old


def _k():
    global _nb
    if _nb is None:
        from . import _numba_kernels

        _nb = _numba_kernels
    return _nb


def warm_up() -> None:
    """Compile (or load from the disk cache) the numba kernels now, outside any timed loop, for
    contiguous arrays and for the strided row views of message buffers; no-op with NumPy."""
    if not _use_numba:
        return
    k = _k()
    views = [np.zeros((2, 2)), np.zeros((2, 4))[:, 2:]]  # C and strided ('A') layouts
    X, y, thr = np.ones((2, 2)), np.ones(2), np.ones(2)
    c = np.zeros(2, dtype=np.int64)
    st = RunStreams(0, (99, 0), np.arange(2))
    w, s, g = np.empty((2, 2)), np.empty((2, 2)), np.zeros((2, 2))
    k.pcg_uniform_parts(st.h, st.lo, st.inc_h, st.inc_l, np.arange(2), w, s)
    L, loc = np.zeros((2, 2)), np.zeros((2, 1, 2))
    for v in views:
        k.sq_clipped_grad(X, y, thr, v, g, c)
        k.owner_parts(X, y, thr, v, g, c, st.h, st.lo, st.inc_h, st.inc_l, np.arange(2), w, s,
                      True)
        k.finish_answer(g, 1.0, w, s, 1.0, v)
        k.query_points(L, loc, 0, v)
        k.learner_step(L, loc, 0, v, v, 1.0, 2.0, 1.0, 1.0, 1.0, 1.0)
        k.row_norms(v, np.empty(2))


# -- the owner ---------------------------------------------------------------------------------
def sq_clipped_grad(X: np.ndarray, y: np.ndarray, thr: np.ndarray, thetas: np.ndarray,
                    out: np.ndarray, counts: np.ndarray) -> None:
    """Squared loss, direct pass: out (m, p) = sum of the L1-clipped per-record gradients at each
    row of `thetas`, counts (m,) = records clipped; thr = xi / ||x_i||_1 (linear._thresholds).

    NumPy: linear.clipped_grad_sum's direct pass, operation for operation (one row computed and
    repeated when every row is the same model, as there). numba: one loop, equal to ~1e-15."""
    if _use_numba:
        _k().sq_clipped_grad(X, y, thr, thetas, out, counts)
        return
    T = thetas
    counts[:] = 0
    if T.shape[0] > 1 and not np.any(T != T[0]):  # as clipped_grad_sum: one model, repeated
        c = np.zeros(1, dtype=np.int64)
        out[:] = linear.sq_direct_pass(X, y, T[:1], thr, c)
        counts += c[0]
        return
    out[:] = linear.sq_direct_pass(X, y, T, thr, counts)


def laplace_answer(grad: np.ndarray, n: int, streams: RunStreams, rows: np.ndarray,
                   scale: float, out: np.ndarray, work: tuple[np.ndarray, np.ndarray] | None = None
                   ) -> bool:
    """out = grad / n + scale * Laplace(0, 1) draws of `streams` rows `rows` (one row of out per
    row, d draws each; the rows advance); scale 0 draws nothing. Returns whether out is finite.

    The same bits as ``grad / n + streams.laplace(d, rows) * scale`` (privacy.laplace_mechanism):
    both backends draw numpy's PCG64 outputs and take NumPy's log. `work`: two (m, d) scratch
    arrays (numba), so that nothing is allocated per answer."""
    if scale == 0.0:
        np.divide(grad, n, out=out)
        out += 0.0  # value + zero noise, as laplace_mechanism adds it
        return bool(np.isfinite(out).all())
    if not _use_numba:
        z = streams.laplace(out.shape[1], rows)
        z *= scale
        np.divide(grad, n, out=out)
        out += z
        return bool(np.isfinite(out).all())
    w, s = work if work is not None else (np.empty(out.shape), np.empty(out.shape))
    k = _k()
    k.pcg_uniform_parts(streams.h, streams.lo, streams.inc_h, streams.inc_l, rows, w, s)
    np.log(w, out=w)
    return k.finish_answer(grad, float(n), w, s, scale, out)


def owner_answer(X: np.ndarray, y: np.ndarray, thr: np.ndarray, thetas: np.ndarray, n: int,
                 streams: RunStreams, rows: np.ndarray, scale: float,
                 work: tuple[np.ndarray, ...], out: np.ndarray) -> bool:
    """An owner's noisy answers (squared loss, direct pass): out = sq_clipped_grad / n + Laplace
    noise of scale `scale` from `streams` rows `rows`; the clip counts go to work[1]. `work` =
    (grad, counts, w, s) scratch arrays of the row count. Returns whether out is finite. The
    caller charges its ledger before (nothing is drawn if that refuses)."""
    grad, counts, w, s = work
    if not _use_numba:
        sq_clipped_grad(X, y, thr, thetas, grad, counts)
        return laplace_answer(grad, n, streams, rows, scale, out)
    k = _k()
    k.owner_parts(X, y, thr, thetas, grad, counts, streams.h, streams.lo, streams.inc_h,
                  streams.inc_l, rows, w, s, scale != 0.0)
    if scale == 0.0:
        return laplace_answer(grad, n, streams, rows, scale, out)
    np.log(w, out=w)
    return k.finish_answer(grad, float(n), w, s, scale, out)


# -- the learner -------------------------------------------------------------------------------
def query_points(theta_L: np.ndarray, theta_loc: np.ndarray, i: int, out: np.ndarray) -> None:
    """out (R, p) = 0.5 * (theta_L + theta_loc[:, i]): the query points (6) of owner i."""
    if _use_numba:
        _k().query_points(theta_L, theta_loc, i, out)
        return
    np.add(theta_L, theta_loc[:, i], out=out)
    out *= 0.5


def learner_step(theta_L: np.ndarray, theta_loc: np.ndarray, i: int, tb: np.ndarray,
                 resp: np.ndarray, lam: float, two_n: float, a_own: float, a_ctr: float,
                 w_i: float, box: float, work: tuple[np.ndarray, ...] | None = None) -> bool:
    """Steps (5) and (7) of every run for owner i (async_star.Learner.update with all runs and
    owners = i, the same bits); returns whether theta_L is finite. `work`: three (R, p) scratch
    arrays for NumPy."""
    if _use_numba:
        return _k().learner_step(theta_L, theta_loc, i, tb, resp, lam, two_n, a_own, a_ctr, w_i,
                                 box)
    g, t, u = work if work is not None else (np.empty(tb.shape) for _ in range(3))
    np.multiply(tb, lam, out=g)  # g = lam * tb
    np.divide(g, two_n, out=t)
    np.multiply(resp, w_i, out=u)
    t += u  # g / 2N + w_i r
    t *= a_own
    np.subtract(tb, t, out=t)
    np.clip(t, -box, box, out=theta_loc[:, i])
    np.multiply(g, a_ctr, out=g)
    np.subtract(tb, g, out=g)
    np.clip(g, -box, box, out=theta_L)
    return bool(np.isfinite(theta_L).all())


def row_norms(a: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """Euclidean norm of each row of a (m, d) array."""
    if _use_numba:
        out = np.empty(a.shape[0]) if out is None else out
        _k().row_norms(a, out)
        return out
    v = np.sqrt(np.einsum("ij,ij->i", a, a))
    if out is None:
        return v
    out[:] = v
    return out


__all__ = ["available", "backend", "laplace_answer", "learner_step", "owner_answer", "query_points",
           "row_norms",
           "set_backend", "sq_clipped_grad", "warm_up"]
