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

#: the public extra dataset holding the L2 bound on every record's features
ROW_NORM_MAX = "row_norm_max"


def row_norm_bound(shard: ShardFile) -> float | None:
    """The shard's public bound on every record's L2 norm, or None when it records none."""
    if ROW_NORM_MAX not in shard.public_extra_names():
        return None
    value = float(np.asarray(shard.read_public_extra(ROW_NORM_MAX)).ravel()[0])
    return value if math.isfinite(value) and value > 0 else None
