"""mpi_dp.methods: one module per method and the registry that lists them.

Adding a method: write mpi_dp/methods/<name>.py with `METHOD = <Method subclass>()` (see
methods/base.py for the hooks) and add its module name here. Nothing else changes: the job
loader, the runner, `mpi-dp run --help`, `analyze` and `plot` derive everything from REGISTRY.
"""

from .base import Context, Method, Outcome, Resolved
from .registry import Registry

REGISTRY = Registry.from_modules(f"{__name__}.{m}" for m in (
    "sync_star",
    "async_star",
    "admm",
    "dola",
    "p2p",
))

__all__ = ["REGISTRY", "Context", "Method", "Outcome", "Registry", "Resolved"]
