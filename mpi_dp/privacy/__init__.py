"""mpi_dp.privacy: DP mechanisms (noise, clipping) and the per-owner privacy ledger.

Pure NumPy, never imports mpi4py.
"""

from mpi_dp.privacy.ledger import LEDGER_DTYPE, PrivacyLedger, Release, RunLedger, ledgers_to_array
from mpi_dp.privacy.mechanisms import (
    clip_factors_l1,
    clip_l1,
    gaussian_noise,
    gaussian_sigma,
    l1_sensitivity_mean,
    lap_scale,
    laplace_noise,
)

__all__ = [
    "LEDGER_DTYPE",
    "PrivacyLedger",
    "Release",
    "RunLedger",
    "clip_factors_l1",
    "clip_l1",
    "gaussian_noise",
    "gaussian_sigma",
    "l1_sensitivity_mean",
    "lap_scale",
    "laplace_noise",
    "ledgers_to_array",
]
