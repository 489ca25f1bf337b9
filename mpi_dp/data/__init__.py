"""mpi_dp.data: the HDF5 shard format and synthetic generators (no MPI in this layer)."""

from mpi_dp.data.shards import FORMAT, FORMAT_VERSION, TASKS, ShardFile, write_shards
from mpi_dp.data.synth import (
    add_synth_arguments,
    run_synth_command,
    synth_classification,
    synth_regression,
    write_synth,
)

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
