"""Noise-to-signal ratio of a calibrated release plan: will the noise win before a run starts?

A release adds noise of scale `noise_multiplier` x sensitivity to a signal whose norm is bounded
(a clipped mean gradient, a clipped step). Its noise-to-signal ratio is the expected L2 norm of
the noise over that bound:

    ratio = nm x (sensitivity / signal bound) x c_d,  c_d = sqrt(2 d) (Laplace: each coordinate
            has variance 2 b^2) or sqrt(d) (Gaussian), d the release's dimension

e.g. 2 nm sqrt(2 d) / n_i for the mean of n_i clipped gradients (replace-one sensitivity 2 / n_i
of the bound). Noise is independent across releases while the signal adds up, so over a plan of
k releases the ratio shrinks like 1 / sqrt(k): `run_ratio`. A run whose run ratio exceeds 1 for
every owner is dominated by noise: it will not learn.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

#: how the ratio is defined (recorded beside it)
WHAT = ("expected L2 norm of one release's noise over the norm bound of its signal (nm x "
        "sensitivity/bound x sqrt(2d) Laplace, sqrt(d) Gaussian); noise_to_signal_run divides "
        "by sqrt(releases): above 1 for every owner the run is dominated by noise")


def noise_norm_factor(mechanism: str, d: int) -> float:
    """E||noise||_2 per unit noise scale in d dimensions (to leading order)."""
    return math.sqrt((2.0 if mechanism == "laplace" else 1.0) * d)


def ratios(noise_multipliers: Sequence[float], sens_over_signal: Sequence[float],
           mechanisms: Sequence[str], d: int) -> np.ndarray:
    """Per owner: the noise-to-signal ratio of one release (0 without noise)."""
    nm = np.asarray(noise_multipliers, dtype=np.float64)
    rel = np.asarray(sens_over_signal, dtype=np.float64)
    c = np.array([noise_norm_factor(m, d) for m in mechanisms])
    return np.where(nm > 0, nm * rel * c, 0.0)


def run_ratio(per_release: np.ndarray, releases: Sequence[int]) -> np.ndarray:
    """The ratio over a plan's releases: independent noise averages out as 1 / sqrt(k)."""
    k = np.maximum(np.asarray(releases, dtype=np.float64), 1.0)
    return np.asarray(per_release, dtype=np.float64) / np.sqrt(k)


def summary(per_release: np.ndarray, per_run: np.ndarray) -> str:
    """'min 0.12 / median 0.5 / max 3.1 per release; over the run 0.01 / 0.04 / 0.2'."""
    def three(a: np.ndarray) -> str:
        return f"{np.min(a):.3g} / {np.median(a):.3g} / {np.max(a):.3g}"

    return f"per release {three(per_release)}; over the run {three(per_run)} (min / median / max)"


def noise_wins(per_run: np.ndarray) -> bool:
    """Whether the noise dominates every owner's releases over the run."""
    return bool(np.size(per_run)) and bool(np.all(np.asarray(per_run) > 1.0))
