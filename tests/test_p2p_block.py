"""p2p at many peers (issue 29): the evaluation-only reference cache (p2p.reference_cache) and
the block draws of a rank's peers (p2p.coordinate_descent.Block).

The cache must give back exactly what the computation gives, never serve another shard,
graph, parameter or solver, and never trust a damaged entry; a job gives the same datasets,
bit for bit, with the cache off, filled or read, on 1, 2 and 3 ranks; and, where the code before
issue 29 is at hand ($MPI_DP_BASE_TREE, default /tmp/wt_base), the same as that code.
"""

from __future__ import annotations

import dataclasses
import math
import os
import pickle
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest
import scipy.sparse as sp
from helpers import MPIEXEC, mpi_run, p2p_contract, write_job
from mpi4py import MPI

from mpi_dp.data import synth
from mpi_dp.p2p import coordinate_descent, driver, objective, reference_cache
from mpi_dp.p2p.peer_data import Data
from mpi_dp.privacy import tap
from mpi_dp.rng import run_streams

BASE_TREE = Path(os.environ.get("MPI_DP_BASE_TREE", "/tmp/wt_base"))


def _data(n: int = 12, p: int = 3, seed: int = 0) -> Data:
    """A small binary p2p instance: a ring plus random chords, 5..20 records per peer."""
    g = np.random.default_rng(seed)
    A = np.triu(g.random((n, n)) < 0.3, 1)
    A[np.arange(n - 1), np.arange(1, n)] = True
    W = sp.csr_matrix(np.where(A | A.T, 1.0, 0.0))
    X = [g.normal(size=(int(g.integers(5, 20)), p)) / (2 * math.sqrt(p)) for _ in range(n)]
    y = [np.where(Xi @ g.normal(size=p) + 0.1 * g.normal(size=len(Xi)) >= 0, 1.0, -1.0)
         for Xi in X]
    m = np.array([len(v) for v in y], dtype=np.int64)
    return Data("mem", W, m, X, y, [None] * n, [None] * n, 1.0, "binary", full=True, m_all=m)


def _reference(d: Data, cache: Path | None, mu: float = 1.0, solver: str = "scipy",
               local: bool = True) -> dict:
    obj = driver.Objective("logistic", mu, tuple(1.0 / d.m), "bound")
    P = driver.hosted_problem(MPI.COMM_SELF, obj, d)
    return driver.reference(MPI.COMM_SELF, obj, P, d, d, solver, local=local, cache=cache)


def _same(a: dict, b: dict) -> bool:
    if set(a) != set(b):
        return False
    for k in a:
        x, y = a[k], b[k]
        if isinstance(x, np.ndarray):
            if not (isinstance(y, np.ndarray) and x.dtype == y.dtype and x.shape == y.shape
                    and x.tobytes() == y.tobytes()):
                return False
        elif type(x) is not type(y) or (x != y and not (x != x and y != y)):
            return False
    return True


@pytest.fixture
def counted(monkeypatch):
    """Counts the computations of the reference (a cache hit computes nothing)."""
    calls = []
    real = driver.local_reference
    monkeypatch.setattr(driver, "local_reference", lambda *a, **k: calls.append(1) or real(*a, **k))
    return calls


def test_the_cache_gives_back_exactly_what_the_computation_gives(tmp_path, counted):
    d = _data()
    plain = _reference(d, None)
    assert len(counted) == 1 and set(plain) >= {"theta_loc", "theta_star", "Q_star", "Q_loc"}
    filled = _reference(d, tmp_path)
    assert len(counted) == 2 and len(list(tmp_path.glob("*.npz"))) == 1
    read = _reference(d, tmp_path)
    assert len(counted) == 2  # read, not computed
    assert _same(plain, filled) and _same(plain, read)


def test_another_shard_graph_parameter_or_solver_is_another_entry(tmp_path, counted):
    d = _data()
    first = _reference(d, tmp_path)
    # one record's last bit, one edge weight (both ways), mu, the solver: each a miss, and
    # each entry holds what its own computation gives
    X = [x.copy() for x in d.X]
    X[5][0, 0] = np.nextafter(X[5][0, 0], 1.0)
    W = d.W.tolil()
    j = int(d.W.indices[0])
    W[0, j] = W[j, 0] = 2.0
    variants = [(dataclasses.replace(d, X=X, graph=None), {}),
                (dataclasses.replace(d, W=sp.csr_matrix(W), graph=None), {}),
                (d, {"mu": 0.5}), (d, {"solver": "none"})]
    for k, (dv, kw) in enumerate(variants):
        got = _reference(dv, tmp_path, **kw)
        assert len(counted) == 2 + 2 * k  # computed, not read
        assert _same(got, _reference(dv, None, **kw))
        assert not _same(got, first)
    assert len(list(tmp_path.glob("*.npz"))) == 1 + len(variants)
    assert _same(_reference(d, tmp_path), first)
    assert len(counted) == 1 + 2 * len(variants)  # the first entry is still read


def test_the_local_models_completed_after_the_rounds_are_cached_too(tmp_path, counted):
    """A run that does not start from the local models gets them after its rounds
    (`complete_reference`): the same values computed, stored or read."""
    d = _data()
    obj = driver.Objective("logistic", 1.0, tuple(1.0 / d.m), "bound")
    P = driver.hosted_problem(MPI.COMM_SELF, obj, d)
    got = []
    for cache in (None, tmp_path, tmp_path):
        ref = driver.reference(MPI.COMM_SELF, obj, P, d, None, "none", local=False, cache=cache)
        assert ref == {}
        driver.complete_reference(MPI.COMM_SELF, P, d, ref, cache)
        got.append(ref)
    assert len(counted) == 2 + 3  # the empty references, then computed twice and read once
    assert _same(got[0], got[1]) and _same(got[0], got[2])
    assert set(got[0]) == {"theta_loc", "Q_loc", "Q_zero"}


def test_the_key_names_every_input():
    base = dict(what={"solver": "scipy"}, arrays=[("mu", np.float64(1.0))],
                peers=[b"a", b"b"], full_peers=None)
    k0 = reference_cache.make_key(**base)
    assert reference_cache.make_key(**base) == k0
    for change in ({"what": {"solver": "petsc"}}, {"arrays": [("mu", np.float64(2.0))]},
                   {"arrays": [("mu", np.float32(1.0))]}, {"peers": [b"b", b"a"]},
                   {"peers": [b"ab"]}, {"full_peers": [b"a", b"b"]}):
        assert reference_cache.make_key(**{**base, **change}) != k0, change
    x = np.arange(6.0)
    assert (reference_cache.peer_digest(x.reshape(2, 3), x[:2])
            != reference_cache.peer_digest(x.reshape(3, 2), x[:2]))
    assert reference_cache.peer_digest(x, None) != reference_cache.peer_digest(x, np.zeros(0))


@pytest.mark.parametrize("damage", ["truncate", "flip", "other_key", "values", "shape",
                                    "garbage", "empty"])
def test_a_damaged_entry_is_recomputed_never_trusted(tmp_path, counted, damage):
    d = _data()
    good = _reference(d, tmp_path)
    (path,) = tmp_path.glob("*.npz")
    key = path.stem
    raw = path.read_bytes()
    if damage == "truncate":
        path.write_bytes(raw[: len(raw) // 2])
    elif damage == "flip":  # one bit inside the stored Theta* (zip CRC or the values digest)
        with np.load(path) as z:
            star = z["a_theta_star"].tobytes()
        at = raw.index(star) + 17
        path.write_bytes(raw[:at] + bytes([raw[at] ^ 1]) + raw[at + 1:])
    elif damage in ("other_key", "values", "shape"):
        with np.load(path) as z:
            items = {k: z[k] for k in z.files}
        if damage == "other_key":
            items["__key__"] = np.array("0" * 64)
        elif damage == "values":
            items["a_theta_star"] = items["a_theta_star"] + 1.0  # digest no longer matches
        else:
            items["a_theta_star"] = items["a_theta_star"][:-1]
            items["__values__"] = np.array(reference_cache._values_digest(
                {k: v for k, v in items.items() if not k.startswith("__")}))
        np.savez(path, **items)
    elif damage == "garbage":
        path.write_bytes(b"not an npz file at all")
    else:
        path.write_bytes(b"")
    assert reference_cache.load(tmp_path, key, driver._expect(driver.hosted_problem(
        MPI.COMM_SELF, driver.Objective("logistic", 1.0, tuple(1.0 / d.m), "bound"), d),
        True, True)) is None
    again = _reference(d, tmp_path)
    assert len(counted) == 2 and _same(good, again)
    # the recomputed value replaced the damaged entry: read now
    assert _same(good, _reference(d, tmp_path)) and len(counted) == 2


def test_an_unwritable_cache_folder_only_costs_the_cache(tmp_path, counted):
    blocker = tmp_path / "file"
    blocker.write_text("a file where the folder should be")
    d = _data()
    assert _same(_reference(d, blocker / "sub"), _reference(d, None)) and len(counted) == 2


def test_the_cache_folder_setting(monkeypatch, tmp_path):
    assert reference_cache.cache_dir("off") is None
    assert reference_cache.cache_dir(str(tmp_path)) == tmp_path
    monkeypatch.setenv(reference_cache.CACHE_ENV, str(tmp_path))
    assert reference_cache.cache_dir("auto") == tmp_path / "p2p_reference"
    monkeypatch.delenv(reference_cache.CACHE_ENV)
    assert reference_cache.cache_dir("auto") == Path.home() / ".cache" / "mpi_dp" / "p2p_reference"


def test_block_noise_is_each_agents_own_stream():
    """A rank's peers draw their noise in one block per release count, each peer the bits of
    its own run streams (as when it drew alone), with peers of different release counts."""
    d = _data(n=9)
    obj = driver.Objective("logistic", 1.0, tuple(1.0 / d.m), "bound")
    P = driver.hosted_problem(MPI.COMM_SELF, obj, d)
    s = coordinate_descent.Settings(T=40, T_agent=None, eps=1.0, delta=1e-3, runs=(0, 3), seed=11)
    budgets = [np.full(k % 4, 0.5) for k in range(P.n)]  # 0..3 releases
    agents = np.array([1, 2, 4, 5, 6, 8])
    block = coordinate_descent.Block(P, agents, s, p2p_contract(s, P.n), budgets,
                                     {int(i): np.zeros((2, P.p)) for i in agents})
    for i in agents.tolist():
        n_i = len(budgets[i])
        want = (run_streams(11, "noise", i, (0, 3)).laplace(n_i * P.p).reshape(2, n_i, P.p)
                if n_i else np.zeros((2, 0, P.p)))
        got = block.release[i].reserved if n_i else np.zeros((2, 0, P.p))
        assert got.shape == want.shape
        assert got.tobytes() == want.tobytes()


# -- a replay round as one batch (coordinate_descent.Block.wake_many) ---------------------------
def _uneven_problem(loss: str, n: int = 24, p: int = 3, seed: int = 0) -> objective.Problem:
    """Record counts from a few sizes (equal and different sizes in one round), degrees from 1
    to a hub's n - 1, one agent's records Fortran-ordered (not stackable: `local_grad` alone)."""
    g = np.random.default_rng(seed)
    A = np.triu(g.random((n, n)) < 0.15, 1)
    A[np.arange(n - 1), np.arange(1, n)] = True  # a path keeps it connected
    A[0, 1:] = True  # agent 0: a hub
    Wd = np.triu(A * (0.2 + g.random((n, n))), 1)
    W = sp.csr_matrix(Wd + Wd.T)
    sizes = g.choice([1, 4, 4, 7, 7, 7, 30], size=n)
    X = [g.normal(size=(int(k), p)) / (2 * math.sqrt(p)) for k in sizes]
    X[5] = np.asfortranarray(X[5])
    if loss == "logistic":
        y = [np.where(g.random(len(x)) < 0.5, 1.0, -1.0) for x in X]
    else:
        y = [x @ g.normal(size=p) + 0.1 * g.normal(size=len(x)) for x in X]
    return objective.make_problem(W, X, y, loss, 1.0, 1.0 / sizes)


def _one_at_a_time(block: coordinate_descent.Block, net: coordinate_descent.LocalNet,
                   rounds: coordinate_descent.Rounds) -> None:
    """The replay before wake_many: every hosted agent of a round reads, wakes and posts."""
    for r in range(rounds.count):
        for i in rounds.agents[rounds.starts[r]:rounds.starts[r + 1]].tolist():
            _, nb = net.read(i)
            net.post(i, float(block.k[i] + 1), block.wake(i, nb))


def _replayed(P: objective.Problem, s: coordinate_descent.Settings, theta0: np.ndarray, batched: bool,
              canary: int) -> tuple[coordinate_descent.Block, coordinate_descent.LocalNet, tap.Tap]:
    sched = coordinate_descent.global_schedule(s.seed, P.n, s.T)
    keep = coordinate_descent.effective_ticks(sched, P.n, s.T_agent)
    rounds = coordinate_descent.cut_rounds(sched, keep, P.graph, s.record_every)
    con = p2p_contract(s, P.n)
    block = coordinate_descent.Block(P, np.arange(P.n), s, con,
                                     coordinate_descent.agent_budgets(s, P, sched, con),
                                     {i: theta0[:, i, :] for i in range(P.n)})
    net = coordinate_descent.LocalNet(P.n, s.R * P.p, P.graph)
    coordinate_descent.post_initial(block, net)
    with tap.tapping(tap.Tap(canary, s.R, 1000)) as t:
        if batched:
            coordinate_descent.replay(block, net, rounds, lambda: None)
        else:
            _one_at_a_time(block, net, rounds)
    return block, net, t


def _assert_same_blocks(a: tuple, b: tuple) -> None:
    (ba, na, ta), (bb, nb, tb) = a, b
    for i in ba.agents.tolist():
        assert ba.k[i] == bb.k[i]
        assert ba.theta[i].shape == bb.theta[i].shape
        assert ba.theta[i].tobytes() == bb.theta[i].tobytes(), i
        assert ba.clipped[i].tobytes() == bb.clipped[i].tobytes(), i
        assert pickle.dumps(ba.ledgers[i]) == pickle.dumps(bb.ledgers[i]), i
        la, lb = ba.ledgers[i], bb.ledgers[i]
        assert la.releases.tobytes() == lb.releases.tobytes()
        assert la.spent_eps.tobytes() == lb.spent_eps.tobytes()
        for (ea, ca), (eb, cb) in zip(la.event_counts(), lb.event_counts(), strict=True):
            assert ea == eb and ca.tobytes() == cb.tobytes()
    assert na.models.tobytes() == nb.models.tobytes()
    assert na.stamps.tobytes() == nb.stamps.tobytes() and na.puts == nb.puts
    assert ta.count.tolist() == tb.count.tolist() and ta.events == tb.events
    assert len(ta.values) == len(tb.values) > 0
    for va, vb in zip(ta.values, tb.values, strict=True):
        assert va.tobytes() == vb.tobytes()


@pytest.mark.parametrize("loss", ["logistic", "quadratic"])
@pytest.mark.parametrize("eps", [math.inf, 0.7])
@pytest.mark.parametrize("runs", [(0,), (0, 2, 5)])
def test_a_batched_round_equals_its_agents_one_at_a_time(loss, eps, runs):
    """Replay's rounds as batches (wake_many) against every agent waking alone (wake): states,
    versions, clipped shares, ledgers, mailboxes and the audit's reports, bit for bit; unequal
    record counts and degrees, a non-stackable agent, -0.0 and varied initial models."""
    P = _uneven_problem(loss, seed=len(runs))
    n = P.n
    s = coordinate_descent.Settings(T=n * 12, T_agent=None, eps=eps, delta=1e-3, runs=runs, seed=9,
                                    clip=0.3, allocation="equal")
    g = np.random.default_rng(4)
    theta0 = g.normal(size=(s.R, n, P.p)) * 10.0 ** g.integers(-2, 2, size=(1, n, 1))
    theta0[:, 3] = -0.0
    theta0[:, 4] = 0.0
    canary = int(np.argmax(coordinate_descent.wakeups(coordinate_descent.global_schedule(s.seed, n, s.T),
                                                      n, None)))
    one = _replayed(P, s, theta0, False, canary)
    many = _replayed(P, s, theta0, True, canary)
    _assert_same_blocks(one, many)
    if s.private:
        assert any(c.any() for c in many[0].clipped.values())
    sched = coordinate_descent.global_schedule(s.seed, n, s.T)
    rounds = coordinate_descent.cut_rounds(sched, coordinate_descent.effective_ticks(sched, n, None),
                                           P.graph, 0)
    sizes = [P.m[rounds.agents[a:b]].tolist() for a, b in zip(rounds.starts[:-1],
                                                                rounds.starts[1:], strict=True)]
    assert any(len(z) > len(set(z)) > 1 for z in sizes)  # a round of equal and other sizes


@pytest.mark.parametrize("runs,p", [((0,), 1), ((0, 1), 1)])
def test_a_batched_round_with_one_or_two_numbers_per_model(runs, p):
    """R p = 1 (NumPy sums a lone axis pairwise: each agent mixes alone) and R p = 2."""
    P = _uneven_problem("logistic", p=p, seed=7)
    s = coordinate_descent.Settings(T=P.n * 10, T_agent=None, eps=1.0, delta=1e-3, runs=runs, seed=2)
    theta0 = np.random.default_rng(1).normal(size=(s.R, P.n, P.p))
    _assert_same_blocks(_replayed(P, s, theta0, False, 0), _replayed(P, s, theta0, True, 0))


def test_a_batched_round_in_small_mix_blocks_and_with_capped_agents(monkeypatch):
    """The mix in blocks of a few agents (MIX_ELEMS small: padding differs from block to
    block), agents capped at T_i wake-ups, the Proposition-2 budgets (a scale per release)."""
    P = _uneven_problem("logistic", seed=3)
    cap = tuple(int(k) for k in np.random.default_rng(0).integers(2, 12, size=P.n))
    s = coordinate_descent.Settings(T=P.n * 10, T_agent=cap, eps=2.0, delta=1e-3, runs=(0, 1), seed=4,
                                    allocation="prop2_corrected")
    theta0 = np.zeros((s.R, P.n, P.p))
    want = _replayed(P, s, theta0, False, 1)
    monkeypatch.setattr(coordinate_descent, "MIX_ELEMS", 12 * s.R * P.p)
    _assert_same_blocks(want, _replayed(P, s, theta0, True, 1))
    assert any(len(set(b.tolist())) > 1 for b in want[0].budgets.values())


def test_wake_many_reads_nothing_its_batch_writes():
    """A round's batch equals its agents waking alone in any order, its reads all before its
    posts: Mailbox-like reads into one buffer, then posts."""
    P = _uneven_problem("quadratic", seed=5)
    s = coordinate_descent.Settings(T=1, T_agent=None, eps=math.inf, delta=1e-3, runs=(0, 1), seed=1)
    theta0 = np.random.default_rng(3).normal(size=(s.R, P.n, P.p))
    A = (P.graph.W != 0).toarray()
    ids = []
    for i in np.random.default_rng(8).permutation(P.n).tolist():  # an independent set
        if not A[i, ids].any():
            ids.append(i)
    assert len(ids) > 3
    blocks = [coordinate_descent.Block(P, np.arange(P.n), s, p2p_contract(s, P.n),
                                       [np.zeros(0)] * P.n,
                                       {i: theta0[:, i, :] for i in range(P.n)}) for _ in range(2)]
    nets = [coordinate_descent.LocalNet(P.n, s.R * P.p, P.graph) for _ in range(2)]
    for b, net in zip(blocks, nets, strict=True):
        coordinate_descent.post_initial(b, net)
    for i in ids[::-1]:
        _, nb = nets[0].read(i)
        nets[0].post(i, float(blocks[0].k[i] + 1), blocks[0].wake(i, nb))
    rows = np.concatenate([nets[1].read(i)[1] for i in ids])
    new = blocks[1].wake_many(ids, rows)
    for pos, i in enumerate(ids):
        assert new[pos].tobytes() == blocks[0].theta[i].tobytes() == blocks[1].theta[i].tobytes()
        assert blocks[1].k[i] == 1
    with pytest.raises(ValueError, match="nbr_models"):
        blocks[1].wake_many(ids, rows[1:])


def test_local_grads_is_each_agents_local_grad():
    """The stacked gradient kernel against the per-agent one on random odd shapes: 1 to 300
    records, 1 to 4 runs, 1 to 16 coordinates, both losses, with and without clipping."""
    g = np.random.default_rng(5)
    for trial in range(120):
        A, R, p = (int(g.integers(1, 12)), int(g.integers(1, 5)), int(g.integers(1, 17)))
        loss = ("logistic", "quadratic")[trial % 2]
        X = [g.normal(size=(int(g.choice([1, 2, 3, 7, 64, 299])), p)) for _ in range(A)]
        y = [np.where(g.random(len(x)) < 0.5, 1.0, -1.0) if loss == "logistic"
             else 5 * g.normal(size=len(x)) for x in X]
        th = [g.normal(size=(R, p)) * 10.0 ** g.integers(-3, 4) for _ in range(A)]
        xn = [np.abs(x).sum(axis=1) for x in X]
        lam = g.random(A)
        clip = (math.inf, 1.0, 0.05)[trial % 3]
        G, F = objective.local_grads(loss, X, y, lam, th, clip, xn)
        for a in range(A):
            g1, f1 = objective.local_grad(loss, X[a], y[a], float(lam[a]), th[a], clip, xn[a])
            assert G[a].tobytes() == g1.tobytes() and F[a].tobytes() == f1.tobytes()
    assert not objective.stackable(np.asfortranarray(np.ones((3, 2))), np.ones(3))
    assert not objective.stackable(np.ones((0, 2)), np.ones(0))
    assert not objective.stackable(sp.csr_matrix(np.ones((3, 2))), np.ones(3))
    assert objective.stackable(np.ones((3, 2)), np.ones(3))


# -- whole jobs ----------------------------------------------------------------------------------
def _datasets(path: Path) -> dict[str, np.ndarray]:
    out: dict[str, np.ndarray] = {}
    with h5py.File(path, "r") as f:
        f.visititems(lambda k, v: out.__setitem__(k, v[()]) if isinstance(v, h5py.Dataset)
                     else None)
    return out


def _equal_files(a: Path, b: Path) -> int:
    """Every dataset of a and b equal bit for bit (shape, dtype, bytes); returns their count."""
    da, db = _datasets(a), _datasets(b)
    assert set(da) == set(db)
    for k in da:
        x, y = np.asarray(da[k]), np.asarray(db[k])
        assert x.dtype == y.dtype and x.shape == y.shape, k
        assert x.tobytes() == y.tobytes(), k
    return len(da)


def _job(tmp_path: Path, n: int, **p2p) -> Path:
    data = synth.write_synth(tmp_path / f"p{n}.h5", "p2p", n, 0, 4, 0.05, 2)
    return write_job(tmp_path / f"j{n}.toml", data, algorithm="p2p", T=4 * n, runs=2, seed=7,
                     record_every=2 * n, eps=1.0, p2p={"mu": 1.0, **p2p})


def test_a_job_is_the_same_with_the_cache_off_filled_or_read_on_any_rank_count(tmp_path):
    job = _job(tmp_path, 40)
    cache = tmp_path / "cache"
    env = {reference_cache.CACHE_ENV: str(cache)}
    runs = [(1, "off"), (1, "auto"), (2, "auto"), (3, "auto"), (3, "off")]
    outs = []
    for k, (ranks, spec) in enumerate(runs):
        out = tmp_path / f"o{k}.h5"
        cp = mpi_run(ranks, ["run", str(job), "--out", str(out), "--quiet",
                             "--set", f'p2p.reference_cache="{spec}"'], env=env)
        assert cp.returncode == 0, cp.stderr
        outs.append(out)
        if k == 1:  # filled by the first run with the cache on
            assert len(list((cache / "p2p_reference").glob("*.npz"))) == 1
    for out in outs[1:]:
        assert _equal_files(outs[0], out) > 20
    assert len(list((cache / "p2p_reference").glob("*.npz"))) == 1  # one entry for all


@pytest.mark.skipif(not (BASE_TREE / "mpi_dp").is_dir(),
                    reason="the code before issue 29 is not at $MPI_DP_BASE_TREE")
def test_a_256_peer_job_equals_the_code_before_issue_29(tmp_path):
    """The synthetic 256-peer job of benchmarks/scaling.py (T = 4 wake-ups per peer, 2 runs),
    its shard written by the old code (a format both read), on 2 ranks."""
    old, new, data = tmp_path / "old.h5", tmp_path / "new.h5", tmp_path / "p256.h5"
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", PYTHONPATH=str(BASE_TREE))
    cp = subprocess.run([sys.executable, "-m", "mpi_dp", "data", "synth", "--task", "p2p",
                         "--dim", "10", "--agents", "256", "--seed", "1", "--out", str(data)],
                        env=env, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert cp.returncode == 0, cp.stderr
    job = write_job(tmp_path / "j256.toml", data, algorithm="p2p", T=4 * 256, runs=2, seed=7,
                    record_every=4 * 256, eps=1.0, p2p={"mu": 1.0})
    cp = subprocess.run([MPIEXEC, "-n", "2", sys.executable, "-m", "mpi_dp", "run", str(job),
                         "--out", str(old), "--quiet"], env=env, capture_output=True,
                        text=True, timeout=900, cwd=tmp_path)
    assert cp.returncode == 0, cp.stderr
    cp = mpi_run(2, ["run", str(job), "--out", str(new), "--quiet"],
                 env={reference_cache.CACHE_ENV: str(tmp_path / "cache")})
    assert cp.returncode == 0, cp.stderr
    assert _equal_files(old, new) > 20


# -- evaluation: every hosted peer scored as one batch -----------------------------------------
@pytest.mark.parametrize("task,loss", [("binary", "logistic"), ("regression", "squared"),
                                       ("binary", "squared")])
@pytest.mark.parametrize("R", [1, 3])
def test_evaluation_batch_scores_each_peer_as_alone(task, loss, R):
    """The evaluator's batched local objectives and test metrics equal, bit for bit, each peer's
    own `local_obj` and `_metric` (unequal sizes, large peers, a peer without test records, one
    with CSR records, one with integer labels: those take the per-peer path)."""
    from types import SimpleNamespace

    from mpi_dp.p2p.evaluation import Evaluator

    rng = np.random.default_rng(7)
    p, n = 5, 9
    sizes = [1, 3, 8, 9, 40, 3000, 7, 2, 5]
    lab = (lambda m: rng.choice([-1.0, 1.0], m)) if task == "binary" else (
        lambda m: rng.normal(size=m))
    X = [rng.normal(size=(m, p)) * np.exp(rng.normal(size=(m, 1))) for m in sizes]
    y = [lab(m) for m in sizes]
    Xt = [rng.normal(size=(m, p)) for m in sizes]
    yt = [lab(m) for m in sizes]
    Xt[2], yt[2] = None, None  # no test records
    Xt[4], yt[4] = Xt[4][:0], yt[4][:0]  # an empty test set
    X[6] = sp.csr_matrix(X[6])  # CSR records: the per-peer path
    yt[7] = yt[7].astype(np.int64)  # integer labels: the per-peer path
    d = SimpleNamespace(task=task, X=X, y=y, Xt=Xt, yt=yt)
    P = SimpleNamespace(loss=loss, lam=rng.random(n), p=p)
    agents = np.array([8, 0, 5, 2, 4, 6, 1, 3, 7])
    ev = Evaluator(MPI.COMM_SELF, P, d, agents, {}, R)
    theta = {i: rng.normal(size=(R, p)) for i in range(n)}
    theta[3][0, :] = -0.0
    ids, th, lo, met = ev._mine(theta)
    assert ids.tolist() == agents.tolist()
    for a, i in enumerate(agents.tolist()):
        want_lo = objective.local_obj(loss, X[i], y[i], float(P.lam[i]), th[a])
        want_met = ev._metric(i, th[a])
        assert np.array_equal(lo[a], want_lo), (i, lo[a], want_lo)
        assert np.array_equal(met[a], want_met, equal_nan=True), (i, met[a], want_met)
    assert np.isnan(met[3]).all() and np.isnan(met[4]).all()
