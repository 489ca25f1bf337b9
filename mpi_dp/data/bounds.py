"""Public bounds on the records of a shard file, which set step sizes and clipping without
reading private records.

`data prepare` stores ``/public/row_norm_max`` (one number) when it scaled every record to L2
norm <= that bound (``--row-norm l2``): a fact of the preprocessing, known before any record is
read, so every party may use it at no privacy cost.
"""

from __future__ import annotations

import math

import numpy as np

from mpi_dp.data.shards import ShardFile
from mpi_dp.errors import ShardError

#: the public extra dataset holding the L2 bound on every record's features
ROW_NORM_MAX = "row_norm_max"


def row_norm_bound(shard: ShardFile, name: str = ROW_NORM_MAX) -> float | None:
    """The shard's public bound on every record's L2 norm (`name`: the public extra holding
    it, e.g. MovieLens' item_norm_max), or None when it records none."""
    if name not in shard.public_extra_names():
        return None
    raw = np.asarray(shard.read_public_extra(name)).ravel()
    if raw.size != 1 or raw.dtype.kind not in "biuf":
        raise ShardError(f"shard file '{shard.path}': /public/{name} must hold one number "
                         f"(the bound on every record's L2 norm), got {raw.dtype} of shape "
                         f"{raw.shape}; write it again with mpi-dp data prepare --row-norm l2")
    value = float(raw[0])
    return value if math.isfinite(value) and value > 0 else None
