"""mpi_dp.methods: one module per method and the registry that lists them.

Adding a method: write mpi_dp/methods/<name>.py with `METHOD = <Method subclass>()` (see
methods/base.py for the hooks) and add its module name here. Nothing else changes: the job
loader, the runner, `mpi-dp run --help`, `analyze` and `plot` derive everything from REGISTRY.
A method whose code is a package of its own names its entry module in full (p2p:
mpi_dp.p2p.method, beside the rest of that method's code in mpi_dp/p2p).
"""

from .base import Context, Method, Outcome, Resolved
from .registry import Registry

#: the methods' modules, in the registry's order: a module of this package by its name, or the
#: full dotted name of one outside it
MODULES = (
    "sync_star",
    "async_star",
    "admm",
    "dola",
    "mpi_dp.p2p.method",
)


#: the registry of MODULES' methods; declared here, made by `__getattr__` on first access
REGISTRY: Registry


def __getattr__(name: str) -> Registry:
    """REGISTRY, made where it is first asked for (`from mpi_dp.methods import REGISTRY`, as the
    job loader, the runner and the CLI do): an entry outside this package (mpi_dp.p2p.method)
    imports .base, so importing it first runs this file, and a registry made here at import
    would ask for the METHOD of that module before it is defined."""
    if name == "REGISTRY":
        global REGISTRY
        REGISTRY = Registry.from_modules(m if "." in m else f"{__name__}.{m}" for m in MODULES)
        return REGISTRY
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["REGISTRY", "Context", "Method", "Outcome", "Registry", "Resolved"]
