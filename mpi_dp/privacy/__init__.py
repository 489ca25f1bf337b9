"""mpi_dp.privacy: DP mechanisms returning events, the owner's ledger, and accountants.

Pure NumPy, never imports mpi4py. `accountants` (dp-accounting) is imported on demand, at the
end of a configuration: `from mpi_dp.privacy import accountants`.
"""

from mpi_dp.privacy.events import Event, GaussianEvent, LaplaceEvent, PureEvent
from mpi_dp.privacy.ledger import Ledger
from mpi_dp.privacy.mechanisms import (
    GAUSSIAN_CALIBRATIONS,
    clip_factors_l1,
    clip_l1,
    gaussian_mechanism,
    gaussian_noise,
    gaussian_perturbation,
    gaussian_sigma,
    l1_sensitivity_mean,
    lap_scale,
    laplace_mechanism,
    laplace_noise,
    laplace_perturbation,
)

__all__ = [
    "GAUSSIAN_CALIBRATIONS",
    "Event",
    "GaussianEvent",
    "LaplaceEvent",
    "Ledger",
    "PureEvent",
    "clip_factors_l1",
    "clip_l1",
    "gaussian_mechanism",
    "gaussian_noise",
    "gaussian_perturbation",
    "gaussian_sigma",
    "l1_sensitivity_mean",
    "lap_scale",
    "laplace_mechanism",
    "laplace_noise",
    "laplace_perturbation",
]
