"""Partitions of a dataset's records into data owners (agents): pure NumPy, no I/O.

Every partitioner returns one int64 array of record indices per agent, sorted ascending within an
agent, and never hands out an index in `exclude` (the learner-public hold-out). Random partitions
draw only from ``rng.stream(seed, "partition")`` (train/test splits: one stream per agent), so they
are reproducible from the job's seed and do not depend on the MPI layout.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from mpi_dp import rng
from mpi_dp.errors import DataError


def _fmt(k: int) -> str:
    return f"{int(k):,}"


def _exclude_mask(n: int, exclude: Any) -> np.ndarray:
    """Boolean mask (n,) of excluded records; DataError for indices outside [0, n)."""
    if n < 0:
        raise DataError(f"the number of records must be non-negative, got {n}")
    mask = np.zeros(n, dtype=bool)
    if exclude is None:
        return mask
    ex = np.asarray(exclude)
    if ex.size == 0:
        return mask
    if ex.dtype == bool:
        if ex.shape != (n,):
            raise DataError(f"boolean exclude mask has shape {ex.shape}, expected ({n},)")
        return ex.copy()
    if not np.issubdtype(ex.dtype, np.integer):
        raise DataError(f"exclude must hold integer record indices, got dtype {ex.dtype}")
    ex = ex.ravel()
    if ex.min() < 0 or ex.max() >= n:
        raise DataError(f"exclude holds indices outside [0, {_fmt(n)}): min {ex.min()}, max {ex.max()}")
    mask[ex] = True
    return mask


def _available(n: int, exclude: Any, start: int = 0) -> np.ndarray:
    """Indices >= start that are not excluded, ascending (int64)."""
    mask = _exclude_mask(n, exclude)
    mask[: max(0, min(start, n))] = True
    return np.flatnonzero(~mask).astype(np.int64)


def _after(exclude: Any, start: int = 0) -> str:
    """' after ...' clause for error messages naming what was skipped."""
    bits = []
    if start:
        bits.append(f"skipping the first {_fmt(start)}")
    if exclude is not None and np.asarray(exclude).size:
        bits.append("the hold-out")
    return (" after " + " and ".join(bits)) if bits else ""


def _n_agents(n_agents: int) -> int:
    if int(n_agents) != n_agents or n_agents < 1:
        raise DataError(f"the number of agents must be a positive integer, got {n_agents}")
    return int(n_agents)


def holdout_last(n: int, m: int) -> tuple[np.ndarray, np.ndarray]:
    """(rest, public): the last m of n records are the learner-public hold-out (seeds 000/001)."""
    if m < 0:
        raise DataError(f"the hold-out size must be non-negative, got {m}")
    if m >= n:
        raise DataError(
            f"a public hold-out of the last {_fmt(m)} records leaves no records for the owners: "
            f"the dataset has only {_fmt(n)}"
        )
    return np.arange(n - m, dtype=np.int64), np.arange(n - m, n, dtype=np.int64)


def blocks(n: int, sizes: Sequence[int], *, start: int = 0, exclude: Any = None) -> list[np.ndarray]:
    """Contiguous blocks: owner 1 gets the first sizes[0] records, owner 2 the next sizes[1], ...

    Records before `start` and excluded records are skipped (the blocks run over what remains, in
    order). DataError naming the shortfall when the blocks do not fit.
    """
    sizes = [int(s) for s in sizes]
    if not sizes:
        raise DataError("blocks need at least one owner size")
    if any(s < 1 for s in sizes):
        raise DataError(f"every owner needs at least 1 record, got sizes {sizes}")
    if start < 0:
        raise DataError(f"start must be non-negative, got {start}")
    avail = _available(n, exclude, start)
    need = sum(sizes)
    if need > avail.size:
        if len(set(sizes)) == 1:
            what = f"{len(sizes)} x {_fmt(sizes[0])} = {_fmt(need)}"
        else:
            what = " + ".join(_fmt(s) for s in sizes) + f" = {_fmt(need)}"
        raise DataError(
            f"blocks need {what} records but only {_fmt(avail.size)} are available{_after(exclude, start)} "
            f"(short by {_fmt(need - avail.size)})"
        )
    bounds = np.concatenate([[0], np.cumsum(sizes)])
    return [avail[bounds[i] : bounds[i + 1]].copy() for i in range(len(sizes))]


def _equal_share(avail: np.ndarray, N: int, exclude: Any) -> int:
    """floor(n' / N) records per agent; DataError when that is zero."""
    size = avail.size // N
    if size == 0:
        raise DataError(
            f"{N:,} agents need at least one record each but only {_fmt(avail.size)} records are "
            f"available{_after(exclude)}"
        )
    return size


def equal_blocks(n: int, n_agents: int, *, exclude: Any = None) -> list[np.ndarray]:
    """Contiguous blocks of floor(n' / N) records each, in record order; the remainder is dropped."""
    N = _n_agents(n_agents)
    avail = _available(n, exclude)
    size = _equal_share(avail, N, exclude)
    return [avail[i * size : (i + 1) * size].copy() for i in range(N)]


def iid(n: int, n_agents: int, seed: int, *, exclude: Any = None) -> list[np.ndarray]:
    """Global shuffle, then equal shares of floor(n' / N) records; the remainder is dropped."""
    N = _n_agents(n_agents)
    avail = _available(n, exclude)
    size = _equal_share(avail, N, exclude)
    perm = rng.stream(seed, "partition").permutation(avail)
    return [np.sort(perm[i * size : (i + 1) * size]) for i in range(N)]


def _group(idx: np.ndarray, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray, list[np.ndarray]]:
    """(distinct keys ascending, their counts, indices of each key ascending) for records idx."""
    values, inverse, counts = np.unique(keys[idx], return_inverse=True, return_counts=True)
    order = np.argsort(inverse.ravel(), kind="stable")
    groups = np.split(idx[order], np.cumsum(counts)[:-1])
    return values, counts, groups


def _check_keys(keys: Any) -> np.ndarray:
    keys = np.asarray(keys)
    if keys.ndim != 1:
        raise DataError(f"keys must be one value per record (1-D), got shape {keys.shape}")
    if keys.dtype.kind == "f" and np.isnan(keys).any():
        raise DataError(f"{int(np.isnan(keys).sum()):,} records have a missing (NaN) key")
    return keys


def by_key(
    keys: np.ndarray, *, min_records: int = 1, exclude: Any = None
) -> tuple[list[np.ndarray], np.ndarray]:
    """One agent per distinct key with >= min_records records (e.g. hospitals as owners).

    Agents come in ascending key order. Returns (parts, the key value of each agent). DataError
    when no key reaches min_records.
    """
    keys = _check_keys(keys)
    avail = _available(keys.size, exclude)
    if avail.size == 0:
        raise DataError(f"no records to partition by key{_after(exclude)}")
    values, counts, groups = _group(avail, keys)
    keep = counts >= min_records
    if not keep.any():
        top = int(np.argmax(counts))
        key = values[top].item() if isinstance(values[top], np.generic) else values[top]
        raise DataError(
            f"no key has at least {_fmt(min_records)} records{_after(exclude)}: the largest, "
            f"{key!r}, has {_fmt(counts[top])} (of {len(values):,} distinct keys)"
        )
    parts = [g for g, k in zip(groups, keep, strict=True) if k]
    return parts, values[keep]


def natural(keys: np.ndarray, *, exclude: Any = None) -> tuple[list[np.ndarray], np.ndarray]:
    """One agent per distinct key (e.g. users), ascending key order; returns (parts, key values)."""
    return by_key(keys, min_records=1, exclude=exclude)


def dirichlet(
    labels: np.ndarray,
    n_agents: int,
    alpha: float,
    seed: int,
    *,
    min_size: int = 1,
    exclude: Any = None,
    max_tries: int = 100,
) -> list[np.ndarray]:
    """Label-skewed partition: each class is split over agents with proportions ~ Dir(alpha 1_N).

    For each class (ascending label) its records are shuffled and cut at the cumulative proportions.
    Small alpha gives each agent few classes; large alpha gives every agent the global class mix.
    The whole draw is repeated (same stream, next draw) until every agent has >= min_size
    records; DataError after max_tries. All available records are assigned.
    """
    N = _n_agents(n_agents)
    if not (np.isfinite(alpha) and alpha > 0):
        raise DataError(f"the Dirichlet concentration alpha must be positive, got {alpha}")
    labels = _check_keys(labels)
    avail = _available(labels.size, exclude)
    if N * min_size > avail.size:
        raise DataError(
            f"{N:,} agents x {_fmt(min_size)} records = {_fmt(N * min_size)} needed but only "
            f"{_fmt(avail.size)} are available{_after(exclude)}"
        )
    _, _, classes = _group(avail, labels)
    g = rng.stream(seed, "partition")
    smallest = 0
    for _ in range(max_tries):
        shares: list[list[np.ndarray]] = [[] for _ in range(N)]
        for idx in classes:
            shuffled = g.permutation(idx)
            props = g.dirichlet(np.full(N, float(alpha)))
            cuts = (np.cumsum(props)[:-1] * idx.size).astype(np.int64)
            for a, piece in enumerate(np.split(shuffled, cuts)):
                shares[a].append(piece)
        parts = [np.sort(np.concatenate(s)) for s in shares]
        smallest = min(p.size for p in parts)
        if smallest >= min_size:
            return parts
    raise DataError(
        f"Dirichlet partition (alpha = {alpha}, {N:,} agents, {len(classes)} classes) left an agent with "
        f"fewer than {_fmt(min_size)} records in all {max_tries} draws (smallest in the last draw: "
        f"{_fmt(smallest)}); raise alpha, lower min_size or use fewer agents"
    )


def train_test_split(
    parts: list[np.ndarray], test_frac: float, seed: int, *, min_test: int = 1
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Per agent, a random share of its records goes to test (e.g. MovieLens 80/20 per user).

    Agent a keeps floor(test_frac * n_a + 0.5) test records (rounded half up), at least min_test
    when it has >= 2 records, and at most n_a - 1 so it always keeps a training record. Agent a draws
    from ``stream(seed, "partition", agent=a)`` and the draw depends only on n_a, so one agent's split
    does not depend on the other agents. Returns (train parts, test parts), each sorted.
    """
    if not (0 <= test_frac < 1):
        raise DataError(f"test_frac must lie in [0, 1), got {test_frac}")
    train: list[np.ndarray] = []
    test: list[np.ndarray] = []
    for a, part in enumerate(parts):
        part = np.asarray(part, dtype=np.int64)
        n_a = part.size
        n_test = int(np.floor(test_frac * n_a + 0.5))
        if n_a >= 2:
            n_test = max(n_test, int(min_test))
        n_test = min(n_test, max(n_a - 1, 0))
        perm = rng.stream(seed, "partition", agent=a).permutation(n_a)
        test.append(np.sort(part[perm[:n_test]]))
        train.append(np.sort(part[perm[n_test:]]))
    return train, test


def check_partition(parts: list[np.ndarray], n: int, *, exclude: Any = None) -> None:
    """DataError unless the parts are disjoint, lie within [0, n) and avoid `exclude`."""
    mask = _exclude_mask(n, exclude)
    owner = np.full(n, -1, dtype=np.int64)
    for a, part in enumerate(parts):
        part = np.asarray(part)
        if part.size == 0:
            continue
        if not np.issubdtype(part.dtype, np.integer):
            raise DataError(f"agent {a} holds non-integer record indices (dtype {part.dtype})")
        part = part.ravel()
        bad = (part < 0) | (part >= n)
        if bad.any():
            raise DataError(f"agent {a} holds record {int(part[bad][0])} outside [0, {_fmt(n)})")
        u, c = np.unique(part, return_counts=True)
        if (c > 1).any():
            raise DataError(f"agent {a} holds record {int(u[c > 1][0])} more than once")
        hit = mask[part]
        if hit.any():
            raise DataError(f"agent {a} holds record {int(part[hit][0])} of the excluded public hold-out")
        taken = owner[part] >= 0
        if taken.any():
            i = int(part[taken][0])
            raise DataError(f"record {i} is held by both agent {int(owner[i])} and agent {a}")
        owner[part] = a


def summary(parts: list[np.ndarray]) -> dict[str, Any]:
    """Agent count and records per agent: {"agents", "min", "median", "max", "total"} (JSON-able)."""
    sizes = np.array([np.asarray(p).size for p in parts], dtype=np.int64)
    if sizes.size == 0:
        return {"agents": 0, "min": 0, "median": 0.0, "max": 0, "total": 0}
    return {
        "agents": int(sizes.size),
        "min": int(sizes.min()),
        "median": float(np.median(sizes)),
        "max": int(sizes.max()),
        "total": int(sizes.sum()),
    }
