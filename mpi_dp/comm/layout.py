"""Which rank hosts which agents: agents are logical, ranks are physical.

Rank 0 is the learner (server) of the star methods. With one rank it also hosts every owner; with
P > 1 ranks the owners are split into contiguous, near-equal blocks over ranks 1..P-1 (ranks beyond
the number of owners host none and only take part in collectives).
"""

from __future__ import annotations

import dataclasses

import numpy as np


@dataclasses.dataclass(frozen=True)
class Layout:
    n_agents: int
    n_ranks: int

    def __post_init__(self) -> None:
        if self.n_agents < 1 or self.n_ranks < 1:
            raise ValueError("need at least one agent and one rank")

    @property
    def owner_ranks(self) -> list[int]:
        return [0] if self.n_ranks == 1 else list(range(1, self.n_ranks))

    def block_starts(self) -> np.ndarray:
        """First agent of every rank (length n_ranks + 1; rank r hosts starts[r]:starts[r+1])."""
        starts = np.zeros(self.n_ranks + 1, dtype=np.int64)
        ranks = self.owner_ranks
        base, extra = divmod(self.n_agents, len(ranks))
        pos = 0
        for r in range(self.n_ranks):
            starts[r] = pos
            if r in ranks:
                idx = r - ranks[0]
                pos += base + (1 if idx < extra else 0)
        starts[self.n_ranks] = pos
        return starts

    def agents_on(self, rank: int) -> range:
        s = self.block_starts()
        return range(int(s[rank]), int(s[rank + 1]))

    def counts(self) -> np.ndarray:
        """Number of agents hosted by every rank."""
        return np.diff(self.block_starts())
