"""The toy method's algorithm (tests/test_toy_method.py): every owner releases, T times, the mean
of its labels clipped to [-bound, bound] (sensitivity 2 bound / n_i) through its release path; the
learner on rank 0 averages the releases over owners (weights n_i / n) and over iterations.
"""

from __future__ import annotations

import numpy as np


def run(star, contract, means: dict[int, float], n: list[int], bound: float, T: int, runs: int,
        hooks, clean: float | None, record_every: int):
    """The T rounds (collective); returns the owners' ledgers on rank 0, else None."""
    agents = sorted(means)
    release = contract.block(agents)
    values = np.array([[[means[i]]] * runs for i in agents]).reshape(len(agents), runs, 1)
    sens = [2 * bound / n[i] for i in agents]
    w = np.array(n, dtype=float) / sum(n)
    total = np.zeros(runs)
    hooks.start(T, "round")
    for k in range(1, T + 1):
        out, _, _ = release.add_laplace(values, sens)  # charged, drawn, shown, returned
        got = star.gather_agents(out.reshape(len(agents), runs), (runs,))
        if star.is_learner:
            total += sum(w[i] * got[i] for i in range(len(w)))
            if clean is not None and (k % record_every == 0 or k == T):
                hooks.record(k, {"error": np.abs(total / k - clean)})
        hooks.progress(k)
    ledgers = star.gather_objects(release.ledgers)
    return None if ledgers is None else sorted((x for p in ledgers for x in p),
                                               key=lambda x: x.agent)
