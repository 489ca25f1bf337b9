"""DP mechanisms: noise calibration, Laplace / Gaussian samplers, releases with events, L1 clipping.

Pure NumPy, no MPI. Noise is drawn *standardised* (unit scale) from the caller's generators and then
multiplied by the scale, so a run's draws are the same whatever eps is (common random numbers across
a sweep) and whatever other runs are drawn alongside it. Every coordinate gets its own i.i.d. draw:
adding one scalar to every coordinate (a bug in the [ASYNC] authors' code) is not DP.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from mpi_dp.pcg import RunStreams, RunStreamsView, generator_laplace, generator_normal
from mpi_dp.privacy import tap
from mpi_dp.privacy.events import GaussianEvent, LaplaceEvent, gaussian_noise_multiplier

#: a noise source: one stream per row, vectorised (RunStreams) or a list of numpy Generators
Streams = RunStreams | RunStreamsView | Sequence[np.random.Generator]


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
    Evaluated literally as ``2*xi*T/(n_i*eps)`` (``2*xi*T/eps/n_i`` where n_i * eps overflows);
    ``eps = inf`` (no privacy) gives 0.0.
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
    den = n_i * eps  # inf only for eps near the largest float: then divide twice, never 0
    return 2 * xi * T / den if math.isfinite(den) else 2 * xi * T / eps / n_i


def l1_sensitivity_mean(xi: float, n_i: int) -> float:
    """L1 sensitivity 2 xi / n_i of a mean of n_i vectors each of L1 norm <= xi (replace-one)."""
    xi = _check_number("xi", xi)
    if xi < 0:
        raise ValueError(f"xi must be >= 0, got {xi}")
    if n_i <= 0:
        raise ValueError(f"n_i must be > 0, got {n_i}")
    return 2 * xi / n_i


#: Gaussian calibrations: classical (Dwork & Roth Thm A.1, eps < 1 only), analytic (Balle & Wang
#: 2018, exact for any eps) and auto (classical where its proof holds, analytic from eps = 1 on).
GAUSSIAN_CALIBRATIONS = ("classical", "analytic", "auto")


def gaussian_sigma(
    l2_sensitivity: float, eps: float, delta: float, *, calibration: str = "classical",
    allow_large_eps: bool = False,
) -> float:
    """Gaussian-mechanism std for (eps, delta)-DP of a value of L2 sensitivity Delta2.

    'classical': sqrt(2 ln(1.25/delta)) * Delta2 / eps. Its proof (Dwork & Roth, Thm A.1) holds only
    for eps < 1, so eps >= 1 raises unless ``allow_large_eps=True`` (the formula is then a heuristic,
    not a guarantee). 'analytic': the smallest sigma with exactly (eps, delta)-DP (Balle & Wang 2018,
    through dp-accounting), valid for every eps. 'auto': classical below eps = 1, analytic from 1 on.
    eps = inf gives 0.
    """
    l2 = _check_number("l2_sensitivity", l2_sensitivity)
    eps = _check_number("eps", eps)
    delta = _check_number("delta", delta)
    if calibration not in GAUSSIAN_CALIBRATIONS:
        raise ValueError(f"unknown Gaussian calibration {calibration!r}; expected one of "
                         f"{', '.join(GAUSSIAN_CALIBRATIONS)}")
    if l2 < 0:
        raise ValueError(f"l2_sensitivity must be >= 0, got {l2}")
    if eps <= 0:
        raise ValueError(f"eps must be > 0, got {eps}")
    if not 0 < delta < 1:
        raise ValueError(f"delta must be in (0, 1), got {delta}")
    if math.isinf(eps):
        return 0.0
    if calibration == "analytic" or (calibration == "auto" and eps >= 1):
        # dp-accounting's analytic calibration; its closed-form inverse beyond eps = 1e7
        return gaussian_noise_multiplier(eps, delta) * l2
    if eps >= 1 and not allow_large_eps:
        raise ValueError(
            f"the classical Gaussian calibration is valid only for eps < 1, got eps={eps}; use the "
            "analytic Gaussian mechanism (calibration 'analytic' or 'auto') for eps >= 1"
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
    gens: Streams, scale: float | np.ndarray, size: int, draw: str
) -> np.ndarray:
    """Rows draw(row r's stream, size) * scale[r]; rows of scale 0 are zeros and draw nothing.

    `gens` is a RunStreams (vectorised) or a list of numpy Generators (one per row); both give the
    same bits for the same stream state (mpi_dp.pcg)."""
    if size < 0:
        raise ValueError(f"size must be >= 0, got {size}")
    s = _row_scales(scale, len(gens))
    if isinstance(gens, RunStreams | RunStreamsView):  # all rows in one vectorised block
        rows = np.flatnonzero(s != 0.0)
        if rows.size == len(gens):
            z = getattr(gens, draw)(int(size))
            z *= s[:, None]
            return z
        out = np.zeros((len(gens), int(size)), dtype=np.float64)
        if rows.size:
            out[rows] = getattr(gens, draw)(int(size), rows) * s[rows, None]
        return out
    out = np.zeros((len(gens), int(size)), dtype=np.float64)
    one = generator_laplace if draw == "laplace" else generator_normal
    for r, gen in enumerate(gens):
        if s[r] != 0.0:
            out[r] = one(gen, int(size)) * s[r]
    return out


def laplace_noise(
    gens: Streams, scale: float | np.ndarray, size: int
) -> np.ndarray:
    """I.i.d. Laplace(0, scale) noise, shape (len(gens), size); row r from row r's stream only.

    Row r is ``size`` standard Laplace draws of that stream (numpy's algorithm, mpi_dp.pcg) times
    scale[r] (scale: scalar or one per row), so the draws are exactly proportional across scales
    and do not depend on the other rows. A row of scale 0 (eps = inf) is zeros and does *not*
    advance its stream.
    """
    return _scaled_noise(gens, scale, size, "laplace")


def gaussian_noise(
    gens: Streams, sigma: float | np.ndarray, size: int
) -> np.ndarray:
    """I.i.d. N(0, sigma^2) noise, shape (len(gens), size); row r is ``size`` standard normal
    draws of row r's stream (inverse CDF, mpi_dp.pcg) times sigma[r]. Rows of sigma 0 are zeros
    and draw nothing."""
    return _scaled_noise(gens, sigma, size, "standard_normal")


def _event_run(sens: float | np.ndarray, scale: float | np.ndarray) -> tuple[float, float]:
    """(sensitivity, scale) of the run whose release is least private (largest sens / scale)."""
    sens_a, scale_a = np.broadcast_arrays(np.asarray(sens, dtype=np.float64),
                                          np.asarray(scale, dtype=np.float64))
    if sens_a.ndim == 0:
        return float(sens_a), float(scale_a)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(sens_a == 0, 0.0, np.where(scale_a == 0, np.inf, sens_a / scale_a))
    r = int(np.argmax(ratio))
    return float(sens_a.flat[r]), float(scale_a.flat[r])


def laplace_perturbation(
    gens: Streams, scale: float | np.ndarray, size: int,
    l1_sensitivity: float | np.ndarray, ledger=None, runs: np.ndarray | None = None, *,
    data_dependent: bool = False, certified: bool = True, scalar: bool = False,
) -> tuple[np.ndarray, LaplaceEvent]:
    """The noise of one Laplace release and its event; `ledger` (the owner's) is charged first.

    Rows as `laplace_noise` (one per generator, scale per row allowed). For objective
    perturbation the caller puts the noise inside its objective; `laplace_mechanism` adds it to a
    value. With per-row sensitivities (a data-dependent calibration) the event describes the row
    with the largest eps. `scalar=True` draws ONE value per row and adds it to every coordinate
    (the [ASYNC] authors' code): not DP, so the event is recorded uncertified.
    """
    sens, sc = _event_run(l1_sensitivity, scale)
    event = LaplaceEvent(sens, sc, data_dependent=data_dependent,
                         certified=certified and not scalar)
    if ledger is not None:
        ledger.charge(event, runs)
    if scalar:
        return laplace_noise(gens, scale, 1) * np.ones((1, int(size))), event
    return laplace_noise(gens, scale, size), event


def laplace_mechanism(
    value: np.ndarray, gens: Streams, scale: float | np.ndarray,
    l1_sensitivity: float | np.ndarray, ledger=None, runs: np.ndarray | None = None, *,
    data_dependent: bool = False, certified: bool = True, scalar: bool = False,
) -> tuple[np.ndarray, LaplaceEvent]:
    """value (rows, d) + i.i.d. Laplace noise, and the release's event (the ledger charged first)."""
    noise, event = laplace_perturbation(gens, scale, value.shape[-1], l1_sensitivity, ledger,
                                        runs, data_dependent=data_dependent,
                                        certified=certified, scalar=scalar)
    out = value + noise
    if ledger is not None:
        tap.release(ledger.agent, out, runs, event)
    return out, event


def gaussian_perturbation(
    gens: Streams, sigma: float | np.ndarray, size: int,
    l2_sensitivity: float | np.ndarray, delta: float, ledger=None,
    runs: np.ndarray | None = None, *, data_dependent: bool = False, certified: bool = True,
) -> tuple[np.ndarray, GaussianEvent]:
    """The noise of one Gaussian release (per-release guarantee stated at `delta`) and its event;
    `ledger` is charged before anything is drawn."""
    sens, sd = _event_run(l2_sensitivity, sigma)
    event = GaussianEvent(sens, sd, delta, data_dependent=data_dependent, certified=certified)
    if ledger is not None:
        ledger.charge(event, runs)
    return gaussian_noise(gens, sigma, size), event


def gaussian_mechanism(
    value: np.ndarray, gens: Streams, sigma: float | np.ndarray,
    l2_sensitivity: float | np.ndarray, delta: float, ledger=None,
    runs: np.ndarray | None = None, *, data_dependent: bool = False, certified: bool = True,
) -> tuple[np.ndarray, GaussianEvent]:
    """value (rows, d) + i.i.d. N(0, sigma^2) noise, and the release's event."""
    noise, event = gaussian_perturbation(gens, sigma, value.shape[-1], l2_sensitivity, delta,
                                         ledger, runs, data_dependent=data_dependent,
                                         certified=certified)
    out = value + noise
    if ledger is not None:
        tap.release(ledger.agent, out, runs, event)
    return out, event


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
