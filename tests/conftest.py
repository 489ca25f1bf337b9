"""Shared fixtures: small shard files."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")


@pytest.fixture(scope="session")
def small_shards(tmp_path_factory) -> Path:
    """3 owners x 600 records, p = 5, ridge data with a public hold-out of 2,000 records."""
    from mpi_dp.data.synth import write_synth

    path = tmp_path_factory.mktemp("shards") / "small.h5"
    return write_synth(path, "regression", 3, [600, 500, 700], 5, 0.5, 11, public=2000)


@pytest.fixture(scope="session")
def small_binary(tmp_path_factory) -> Path:
    from mpi_dp.data.synth import write_synth

    path = tmp_path_factory.mktemp("shards") / "binary.h5"
    return write_synth(path, "binary", 3, 400, 4, 0.3, 5, public=2000)
