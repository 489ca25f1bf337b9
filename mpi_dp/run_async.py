"""Old import path of the async_star job helpers, kept for scripts written against it.

The method entry (job keys, set-up, outputs) is mpi_dp.methods.async_star.
"""

from .methods.async_star import load_logged_schedule, settings_for

__all__ = ["load_logged_schedule", "settings_for"]
