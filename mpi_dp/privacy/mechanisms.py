"""DP mechanisms: noise calibration, Laplace / Gaussian samplers and L1 clipping.

Pure NumPy, no MPI. Noise is drawn *standardised* (unit scale) from the caller's generators and then
multiplied by the scale, so a run's draws are the same whatever eps is (common random numbers across
a sweep) and whatever other runs are drawn alongside it. Every coordinate gets its own i.i.d. draw:
adding one scalar to every coordinate (a bug in the [ASYNC] authors' code) is not DP.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np


def _check_number(name: str, value: float) -> float:
    """`value` as a float; ValueError if it is NaN."""
    value = float(value)
    if math.isnan(value):
        raise ValueError(f"{name} must be a number, got NaN")
    return value


def lap_scale(xi: float, T: int, n_i: int, eps: float) -> float:
    """Per-coordinate Laplace scale b_i = 2 xi T / (n_i eps) of Theorem 1 (mean-gradient form).

    An owner answering T queries of its clipped mean gradient (L1 sensitivity 2 xi / n_i under
    replace-one neighbours) with this scale is eps-DP over all T answers (sequential composition).
    Evaluated literally as ``2*xi*T/(n_i*eps)``; ``eps = inf`` (no privacy) gives 0.0.
    """
    xi = _check_number("xi", xi)
    eps = _check_number("eps", eps)
    if xi < 0:
        raise ValueError(f"xi must be >= 0, got {xi}")
    if T <= 0:
        raise ValueError(f"horizon T must be > 0, got {T}")
    if n_i <= 0:
        raise ValueError(f"n_i must be > 0, got {n_i}")
    if eps <= 0:
        raise ValueError(f"eps must be > 0, got {eps}")
    if math.isinf(eps):
        return 0.0
    return 2 * xi * T / (n_i * eps)


def l1_sensitivity_mean(xi: float, n_i: int) -> float:
    """L1 sensitivity 2 xi / n_i of a mean of n_i vectors each of L1 norm <= xi (replace-one)."""
    xi = _check_number("xi", xi)
    if xi < 0:
        raise ValueError(f"xi must be >= 0, got {xi}")
    if n_i <= 0:
        raise ValueError(f"n_i must be > 0, got {n_i}")
    return 2 * xi / n_i


def gaussian_sigma(
    l2_sensitivity: float, eps: float, delta: float, *, allow_large_eps: bool = False
) -> float:
    """Classical Gaussian-mechanism std sqrt(2 ln(1.25/delta)) * Delta2 / eps for (eps, delta)-DP.

    The classical proof (Dwork & Roth, Thm A.1) holds only for eps < 1, so eps >= 1 raises unless
    ``allow_large_eps=True`` (the formula is then a heuristic, not a guarantee). eps = inf gives 0.
    """
    l2 = _check_number("l2_sensitivity", l2_sensitivity)
    eps = _check_number("eps", eps)
    delta = _check_number("delta", delta)
    if l2 < 0:
        raise ValueError(f"l2_sensitivity must be >= 0, got {l2}")
    if eps <= 0:
        raise ValueError(f"eps must be > 0, got {eps}")
    if not 0 < delta < 1:
        raise ValueError(f"delta must be in (0, 1), got {delta}")
    if math.isinf(eps):
        return 0.0
    if eps >= 1 and not allow_large_eps:
        raise ValueError(
            f"the classical Gaussian calibration is valid only for eps < 1, got eps={eps}; "
            "pass allow_large_eps=True to use it anyway"
        )
    return math.sqrt(2 * math.log(1.25 / delta)) * l2 / eps


def _row_scales(scale: float | np.ndarray, rows: int) -> np.ndarray:
    """The scale as one finite, non-negative float per row."""
    s = np.asarray(scale, dtype=np.float64)
    if s.ndim == 0:
        s = np.full(rows, float(s))
    elif s.shape != (rows,):
        raise ValueError(f"scale must be a scalar or one per row ({rows}), got shape {s.shape}")
    if not np.all(np.isfinite(s)) or np.any(s < 0):
        raise ValueError(f"noise scale must be finite and >= 0, got {scale}")
    return s


def _scaled_noise(
    gens: Sequence[np.random.Generator], scale: float | np.ndarray, size: int, draw
) -> np.ndarray:
    """Rows draw(gens[r], size) * scale[r]; rows of scale 0 are zeros and draw nothing."""
    if size < 0:
        raise ValueError(f"size must be >= 0, got {size}")
    s = _row_scales(scale, len(gens))
    out = np.zeros((len(gens), int(size)), dtype=np.float64)
    for r, gen in enumerate(gens):
        if s[r] != 0.0:
            out[r] = draw(gen, int(size)) * s[r]
    return out


def laplace_noise(
    gens: Sequence[np.random.Generator], scale: float | np.ndarray, size: int
) -> np.ndarray:
    """I.i.d. Laplace(0, scale) noise, shape (len(gens), size); row r from gens[r] only.

    Row r is ``gens[r].laplace(0.0, 1.0, size) * scale[r]`` (scale: scalar or one per row), so the
    draws are exactly proportional across scales and do not depend on the other rows. A row of scale
    0 (eps = inf) is zeros and does *not* advance its generator.
    """
    return _scaled_noise(gens, scale, size, lambda g, k: g.laplace(0.0, 1.0, k))


def gaussian_noise(
    gens: Sequence[np.random.Generator], sigma: float | np.ndarray, size: int
) -> np.ndarray:
    """I.i.d. N(0, sigma^2) noise, shape (len(gens), size); row r is
    ``gens[r].standard_normal(size) * sigma[r]``. Rows of sigma 0 are zeros and draw nothing."""
    return _scaled_noise(gens, sigma, size, lambda g, k: g.standard_normal(k))


def clip_factors_l1(norms: np.ndarray, xi: float) -> np.ndarray:
    """Factors min(1, xi / norm) that bring vectors of L1 norm `norms` to L1 norm <= xi.

    Use as ``clipped = grad * factor``. A zero norm gives 1 (nothing to clip); xi = inf gives all
    ones, so clipping switched off leaves vectors unchanged bit for bit.
    """
    xi = _check_number("xi", xi)
    if xi < 0:
        raise ValueError(f"xi must be >= 0, got {xi}")
    norms = np.asarray(norms, dtype=np.float64)
    if math.isinf(xi):
        return np.ones_like(norms)
    with np.errstate(divide="ignore", invalid="ignore"):
        factors = np.where(norms > xi, xi / np.where(norms > 0, norms, 1.0), 1.0)
    return factors


def clip_l1(v: np.ndarray, xi: float) -> np.ndarray:
    """`v` (a vector, or the rows of a 2-D array) scaled so each has L1 norm <= xi.

    Vectors already within xi are returned unchanged; others keep their direction.
    """
    v = np.asarray(v, dtype=np.float64)
    if v.ndim not in (1, 2):
        raise ValueError(f"clip_l1 expects a 1-D or 2-D array, got {v.ndim}-D")
    factors = clip_factors_l1(np.abs(v).sum(axis=-1), xi)
    return v * factors[..., None] if v.ndim == 2 else v * factors
