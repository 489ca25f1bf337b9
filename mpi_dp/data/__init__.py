"""mpi_dp.data: the HDF5 shard format and synthetic generators (no MPI in this layer).

The generators (mpi_dp.data.synth, with scipy's graph routines) load on first use: a run reads
shards and never needs them."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from mpi_dp.data.shards import FORMAT, FORMAT_VERSION, TASKS, ShardFile, write_shards

if TYPE_CHECKING:
    from mpi_dp.data.synth import (
        add_synth_arguments,
        run_synth_command,
        synth_classification,
        synth_regression,
        write_synth,
    )

_SYNTH = ("add_synth_arguments", "run_synth_command", "synth_classification", "synth_regression",
          "write_synth")

__all__ = [
    "FORMAT",
    "FORMAT_VERSION",
    "TASKS",
    "ShardFile",
    "add_synth_arguments",
    "run_synth_command",
    "synth_classification",
    "synth_regression",
    "write_shards",
    "write_synth",
]


def __getattr__(name: str) -> Any:
    if name in _SYNTH:
        return getattr(importlib.import_module("mpi_dp.data.synth"), name)
    raise AttributeError(f"module 'mpi_dp.data' has no attribute {name!r}")
