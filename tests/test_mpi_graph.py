"""GraphNet exchanges inside every rank (pytest-mpi, run on 1, 2 and 4 ranks by `make test`):
whatever the layout, after an exchange each ghost row holds exactly the vector its owner released
this round whenever an active edge needs it."""

from __future__ import annotations

import numpy as np
import pytest
from mpi4py import MPI

from mpi_dp.comm import graph_exchange
from mpi_dp.comm import topology as tp

pytestmark = pytest.mark.mpi


def _value(agent: int, t: int, shape) -> np.ndarray:
    return np.full(shape, agent * 1000.0 + t) + np.arange(np.prod(shape)).reshape(shape) * 1e-3


@pytest.mark.parametrize("mode", graph_exchange.MODES)
def test_ghosts_hold_this_rounds_release(mode):
    comm = MPI.COMM_WORLD
    g = tp.make_graph("erdos_renyi", 13, 2, p=0.3)
    shape = (2, 3)
    net = graph_exchange.GraphNet(comm, g, mode, shape)
    act = tp.EdgeActivation(net.tracked, "hash", 0.5, 4, 9)
    k = len(net.agents)
    pub = np.full((k + len(net.ghosts), *shape), np.nan)
    bad = 0
    try:
        for t in range(25):
            active = act.step()
            for i, a in enumerate(net.agents):
                pub[i] = _value(int(a), t, shape)
            net.exchange(t, pub, active)
            rows = tp.MixingRows(g, net.agents, net.tracked, "mh_static")
            on = active[rows.eid]
            for q in np.flatnonzero(on):
                j = int(rows.nbr[q])
                if j in net.ghost_row:
                    bad += not np.array_equal(pub[net.ghost_row[j]], _value(j, t, shape))
    finally:
        net.free()
    assert comm.allreduce(bad) == 0
