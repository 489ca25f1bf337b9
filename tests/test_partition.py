"""Partitions into agents: disjoint, exact sizes, hold-out never handed out, reproducible by seed."""

from __future__ import annotations

import numpy as np
import pytest

from mpi_dp import rng
from mpi_dp.data.partition import (
    blocks,
    by_key,
    check_partition,
    dirichlet,
    equal_blocks,
    holdout_last,
    iid,
    natural,
    summary,
    train_test_split,
)
from mpi_dp.errors import DataError


def _same_parts(a: list[np.ndarray], b: list[np.ndarray]) -> bool:
    if len(a) != len(b):
        return False
    return all(x.dtype == y.dtype and np.array_equal(x, y) for x, y in zip(a, b, strict=True))


def _well_formed(parts: list[np.ndarray], n: int, exclude=None) -> np.ndarray:
    """Assert int64, sorted, disjoint, in range, avoiding exclude; return the union."""
    for p in parts:
        assert p.dtype == np.int64 and p.ndim == 1
        assert np.all(np.diff(p) > 0)
    check_partition(parts, n, exclude=exclude)
    union = np.concatenate(parts) if parts else np.array([], np.int64)
    assert np.unique(union).size == union.size
    if exclude is not None:
        assert not np.isin(union, exclude).any()
    return union


def test_holdout_last():
    rest, public = holdout_last(100, 30)
    np.testing.assert_array_equal(rest, np.arange(70))
    np.testing.assert_array_equal(public, np.arange(70, 100))
    assert rest.dtype == public.dtype == np.int64
    with pytest.raises(DataError, match="only 100"):
        holdout_last(100, 100)


def test_blocks_contiguous_skip_holdout_and_concrete_shortfall():
    rest, public = holdout_last(1000, 200)
    parts = blocks(1000, [100, 250, 50], exclude=public)
    np.testing.assert_array_equal(parts[0], np.arange(0, 100))
    np.testing.assert_array_equal(parts[1], np.arange(100, 350))
    np.testing.assert_array_equal(parts[2], np.arange(350, 400))
    _well_formed(parts, 1000, public)

    # start skips records; exclusions in the middle are skipped too
    ex = np.arange(10, 20)
    p = blocks(100, [5, 10], start=3, exclude=ex)
    np.testing.assert_array_equal(p[0], [3, 4, 5, 6, 7])
    np.testing.assert_array_equal(p[1], [8, 9, 20, 21, 22, 23, 24, 25, 26, 27])
    _well_formed(p, 100, ex)

    # exactly fitting: all 800 non-public records
    full = blocks(1000, [400, 400], exclude=public)
    np.testing.assert_array_equal(np.concatenate(full), rest)
    msg = "blocks need 3 x 300 = 900 records but only 800 are available after the hold-out (short by 100)"
    with pytest.raises(DataError, match=msg.replace("(", r"\(").replace(")", r"\)")):
        blocks(1000, [300, 300, 300], exclude=public)
    with pytest.raises(DataError, match=r"3 x 250,000 = 750,000 records but only 2,000"):
        blocks(12000, [250_000] * 3, exclude=np.arange(2000, 12000))
    with pytest.raises(DataError, match=r"100 \+ 750 = 850"):
        blocks(1000, [100, 750], exclude=public)
    with pytest.raises(DataError, match="at least 1 record"):
        blocks(1000, [10, 0])


def test_equal_blocks_mnist_style():
    parts = equal_blocks(60000, 10)
    for i, p in enumerate(parts):
        np.testing.assert_array_equal(p, np.arange(6000 * i, 6000 * (i + 1)))
    ex = np.array([0, 5, 999])
    parts = equal_blocks(1000, 7, exclude=ex)
    assert [p.size for p in parts] == [997 // 7] * 7
    union = _well_formed(parts, 1000, ex)
    avail = np.setdiff1d(np.arange(1000), ex)
    np.testing.assert_array_equal(union, avail[: 7 * (997 // 7)])  # remainder = the last records
    with pytest.raises(DataError, match="only 5 records"):
        equal_blocks(5, 6)


def test_iid_shuffled_equal_split_deterministic():
    rest, public = holdout_last(1003, 100)
    a = iid(1003, 4, seed=11, exclude=public)
    assert [p.size for p in a] == [225] * 4
    union = _well_formed(a, 1003, public)
    assert union.size == 900 and np.isin(union, rest).all()
    assert _same_parts(a, iid(1003, 4, seed=11, exclude=public))
    b = iid(1003, 4, seed=12, exclude=public)
    assert not _same_parts(a, b)
    assert not np.array_equal(a[0], np.arange(225))  # actually shuffled
    # the dropped remainder is exactly what was not assigned
    assert np.setdiff1d(rest, union).size == 903 - 900
    # independently reproducible from the documented stream
    perm = rng.stream(11, "partition").permutation(rest)
    np.testing.assert_array_equal(a[1], np.sort(perm[225:450]))


def test_by_key_counts_and_min_records():
    g = rng.stream(1, "test")
    keys = g.integers(100, 130, size=2000)
    keys[:40] = 7  # a small key at the front
    ex = np.arange(1900, 2000)
    parts, vals = by_key(keys, min_records=60, exclude=ex)
    u, c = np.unique(keys[:1900], return_counts=True)
    np.testing.assert_array_equal(vals, u[c >= 60])
    assert [p.size for p in parts] == list(c[c >= 60])
    assert 7 not in vals and len(vals) < len(u)
    for v, p in zip(vals, parts, strict=True):
        assert np.all(keys[p] == v)
        np.testing.assert_array_equal(p, np.flatnonzero(keys[:1900] == v))
    _well_formed(parts, 2000, ex)

    # min_records is exact: a threshold equal to a key's count keeps it, one more drops it
    target = int(c.max())
    vals2 = by_key(keys, min_records=target, exclude=ex)[1]
    np.testing.assert_array_equal(vals2, u[c == target])
    assert by_key(keys, min_records=target + 1, exclude=None)[1].size == int(
        (np.unique(keys, return_counts=True)[1] >= target + 1).sum()
    )
    with pytest.raises(DataError, match=f"largest, .*, has {target}"):
        by_key(keys[:1900], min_records=10_000)

    nparts, nvals = natural(np.array(["b", "a", "b", "c", "a", "b"]))
    assert nvals.tolist() == ["a", "b", "c"]
    assert [p.tolist() for p in nparts] == [[1, 4], [0, 2, 5], [3]]


def _class_shares(parts, labels, n_classes):
    return np.array([np.bincount(labels[p], minlength=n_classes) / p.size for p in parts])


def test_dirichlet_alpha_controls_skew():
    g = rng.stream(2, "test")
    n_classes, N = 10, 8
    labels = g.integers(0, n_classes, size=8000)
    ex = np.arange(7000, 8000)
    global_share = np.bincount(labels[:7000], minlength=n_classes) / 7000

    flat = dirichlet(labels, N, 1e3, seed=5, exclude=ex)
    union = _well_formed(flat, 8000, ex)
    np.testing.assert_array_equal(np.sort(union), np.arange(7000))  # every available record assigned
    shares = _class_shares(flat, labels, n_classes)
    assert np.abs(shares - global_share).max() < 0.05
    assert max(p.size for p in flat) / min(p.size for p in flat) < 1.2

    skewed = dirichlet(labels, N, 0.05, seed=5, exclude=ex, min_size=20)
    _well_formed(skewed, 8000, ex)
    assert min(p.size for p in skewed) >= 20
    assert _class_shares(skewed, labels, n_classes).max(axis=1).mean() > 0.5

    assert _same_parts(skewed, dirichlet(labels, N, 0.05, seed=5, exclude=ex, min_size=20))
    assert not _same_parts(skewed, dirichlet(labels, N, 0.05, seed=6, exclude=ex, min_size=20))

    with pytest.raises(DataError, match="all 3 draws"):
        dirichlet(labels, N, 0.01, seed=5, min_size=900, max_tries=3)
    with pytest.raises(DataError, match="8 agents x 1,000 records = 8,000 needed but only 7,000"):
        dirichlet(labels, N, 1.0, seed=5, min_size=1000, exclude=ex)


def test_train_test_split_sizes_and_agent_locality():
    parts = [np.arange(0, 10), np.arange(10, 17), np.arange(17, 19), np.arange(19, 20), np.arange(20, 125)]
    train, test = train_test_split(parts, 0.2, seed=3)
    # round(0.2 n): 10 -> 2, 7 -> 1.4 -> 1, 2 -> 0.4 -> min_test 1, 1 -> 0 (keeps its record), 105 -> 21
    assert [t.size for t in test] == [2, 1, 1, 0, 21]
    assert [t.size for t in train] == [8, 6, 1, 1, 84]
    for p, tr, te in zip(parts, train, test, strict=True):
        assert np.all(np.diff(tr) > 0) and np.all(np.diff(te) > 0)
        np.testing.assert_array_equal(np.sort(np.concatenate([tr, te])), p)
        assert np.intersect1d(tr, te).size == 0
    # 0.25 * 10 = 2.5 rounds half up to 3
    assert train_test_split([np.arange(10)], 0.25, seed=3)[1][0].size == 3

    # agent-local: changing agent 2's records leaves the other agents' splits alone, before and after it
    other = [parts[0], parts[1], np.arange(500, 900), parts[3], parts[4]]
    tr2, te2 = train_test_split(other, 0.2, seed=3)
    for a in (0, 1, 3, 4):
        np.testing.assert_array_equal(te2[a], test[a])
        np.testing.assert_array_equal(tr2[a], train[a])
    assert te2[2].size == 80
    assert _same_parts(train_test_split(parts[:2], 0.2, seed=3)[1], test[:2])  # fewer agents
    # agent 4 draws from its own documented stream
    perm = rng.stream(3, "partition", agent=4).permutation(105)
    np.testing.assert_array_equal(test[4], np.sort(parts[4][perm[:21]]))
    # deterministic, seed-dependent
    assert _same_parts(test, train_test_split(parts, 0.2, seed=3)[1])
    assert not np.array_equal(train_test_split(parts, 0.2, seed=4)[1][4], test[4])
    with pytest.raises(DataError, match=r"\[0, 1\)"):
        train_test_split(parts, 1.0, seed=3)


def test_check_partition_errors_and_summary():
    check_partition([np.array([0, 1]), np.array([2])], 5, exclude=np.array([4]))
    with pytest.raises(DataError, match="record 2 is held by both agent 0 and agent 1"):
        check_partition([np.array([0, 2]), np.array([2, 3])], 5)
    with pytest.raises(DataError, match="agent 1 holds record 5 outside"):
        check_partition([np.array([0]), np.array([5])], 5)
    with pytest.raises(DataError, match="agent 0 holds record 4 of the excluded"):
        check_partition([np.array([1, 4])], 5, exclude=np.array([4]))
    with pytest.raises(DataError, match="more than once"):
        check_partition([np.array([1, 1])], 5)

    s = summary([np.arange(3), np.arange(10), np.arange(4), np.arange(7)])
    assert s == {"agents": 4, "min": 3, "median": 5.5, "max": 10, "total": 24}
    assert all(type(v) in (int, float) for v in s.values())
