"""Array backends of the heavy kernels (DESIGN.md, 'Array backends'): the job key `backend`.

  numpy             the CPU, NumPy (default): the tuned in-place kernels, bitwise as always
  cupy              one GPU per rank, CuPy: the records move to the device once per
                    configuration; models go there per call and the kernels' outputs (gradient
                    sums, losses, counts) come back for the owner's release path
  array_api_strict  the Python array API standard's reference namespace on the CPU: the test
                    stand-in for a device, which fails on any NumPy-only code in a kernel

Only the data-heavy kernels run on the backend. Noise, clipping bounds, ledgers and MPI stay on
the host, in NumPy, in the same code for every backend: the noise of a GPU run is the CPU run's,
drawn from the same streams, and a kernel's output differs from NumPy's only by rounding (float64:
within 1e-10 relative).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
from types import ModuleType
from typing import Any

import numpy as np

#: Names the job key `backend` accepts.
BACKENDS = ("numpy", "cupy", "array_api_strict")


class BackendError(RuntimeError):
    """A backend that this machine cannot provide (package missing, no GPU)."""


def _cupy() -> ModuleType:
    try:
        import cupy
    except ImportError as e:
        raise BackendError("backend = 'cupy' needs CuPy (pip install cupy-cuda12x or "
                           f"cupy-cuda13x, matching the node's CUDA): {e}") from None
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as e:  # noqa: BLE001 - CUDA reports a missing driver in several ways
        raise BackendError(f"backend = 'cupy': CuPy finds no usable GPU ({e})") from None
    if count < 1:
        raise BackendError("backend = 'cupy': CuPy finds no GPU on this node")
    return cupy


def gpu_available() -> tuple[bool, str]:
    """(whether CuPy and a GPU are usable here, the reason when not)."""
    try:
        _cupy()
    except BackendError as e:
        return False, str(e)
    return True, ""


@dataclasses.dataclass(frozen=True)
class Backend:
    """An array namespace `xp` (array-api-compat's wrapper) and the moves to and from it."""

    name: str
    xp: Any

    @property
    def is_numpy(self) -> bool:
        return self.name == "numpy"

    def asarray(self, a: Any, dtype: Any = None) -> Any:
        """A host array (or anything array-like) on the backend's device (NumPy: as is)."""
        if self.is_numpy:
            return np.asarray(a, dtype=dtype)
        if dtype is None:
            a = np.asarray(a)
            dtype = getattr(self.xp, str(a.dtype))
        return self.xp.asarray(np.ascontiguousarray(a), dtype=dtype)

    def free_bytes(self) -> float:
        """Free memory of this rank's device, shared by the node's ranks on the same device
        (`local_ranks` over the devices it sees, rounded up); inf on the host backends."""
        if self.name != "cupy":
            return math.inf
        import cupy

        free = float(cupy.cuda.runtime.memGetInfo()[0])
        return free / -(-local_ranks() // max(1, cupy.cuda.runtime.getDeviceCount()))


def to_numpy(a: Any) -> np.ndarray:
    """Any backend's array as a host NumPy array (CuPy: copied from the device)."""
    if isinstance(a, np.ndarray):
        return a
    get = getattr(a, "get", None)  # cupy.ndarray
    if callable(get) and type(a).__module__.startswith("cupy"):
        return get()
    return np.from_dlpack(a)


#: Environment variables that give a rank's index among the ranks of its node (Slurm, Open MPI,
#: MPICH's Hydra, PMI), in the order they are read.
LOCAL_RANK_VARS = ("SLURM_LOCALID", "OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID",
                   "PMI_LOCAL_RANK")


def local_rank() -> int:
    """This rank's index on its node (0 when no launcher says): rank i of a node uses GPU
    i mod (GPUs it sees), so one rank per GPU needs no configuration (Slurm's --gres with
    CUDA_VISIBLE_DEVICES per task shows each rank one GPU: index 0)."""
    for var in LOCAL_RANK_VARS:
        v = os.environ.get(var, "")
        if v.isdigit():
            return int(v)
    return 0


#: Environment variables that give the number of ranks on this rank's node, read in order.
LOCAL_SIZE_VARS = ("OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", "PMI_LOCAL_SIZE")


def local_ranks() -> int:
    """Ranks on this rank's node, where the launcher says (1 otherwise)."""
    for var in LOCAL_SIZE_VARS:
        v = os.environ.get(var, "")
        if v.isdigit() and int(v) > 0:
            return int(v)
    return 1


@functools.cache
def backend(name: str = "numpy") -> Backend:
    """The Backend of a job's `backend` key (BackendError when this machine lacks it)."""
    from array_api_compat import array_namespace

    if name == "numpy":
        return Backend(name, array_namespace(np.zeros(0)))
    if name == "array_api_strict":
        try:
            import array_api_strict
        except ImportError as e:
            raise BackendError("backend = 'array_api_strict' needs the array-api-strict package "
                               f"(pip install array-api-strict; the test extra has it): {e}"
                               ) from None
        return Backend(name, array_namespace(array_api_strict.asarray(0.0)))
    if name == "cupy":
        cupy = _cupy()
        cupy.cuda.Device(local_rank() % cupy.cuda.runtime.getDeviceCount()).use()
        return Backend(name, array_namespace(cupy.zeros(0)))
    raise BackendError(f"unknown backend {name!r}; one of {', '.join(BACKENDS)}")


def on_host(x: Any) -> bool:
    """Whether x takes the NumPy kernels: a NumPy array or a host object of scipy (CSR
    records); anything else is a device backend's array."""
    return isinstance(x, np.ndarray) or type(x).__module__.startswith("scipy")


def namespace(*arrays: Any) -> Any:
    """The array-api-compat namespace of `arrays` (NumPy's wrapper for NumPy arrays)."""
    from array_api_compat import array_namespace

    return array_namespace(*arrays)

