"""The movielens recipe (spec personalized-p2p §5, Table 1): per-user 80/20 split, train-mean
centring, ALS-WR item features from train ratings only, symmetrised 10-NN graph.

Most checks run on small fake ml-100k folders; one light test builds the real MovieLens-100K
when ../shared/data/ml-100k.tar.xz is present.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from mpi_dp import rng
from mpi_dp.data import recipes
from mpi_dp.data.prepare import write_prepared
from mpi_dp.data.shard_graph import read_graph
from mpi_dp.errors import DataError

REAL = Path(__file__).resolve().parents[2] / "shared" / "data" / "ml-100k.tar.xz"


def _write_ml(folder: Path, ratings: list[tuple[int, int, int]], n_users: int, n_items: int) -> Path:
    """An ml-100k folder with the given (user, item, rating) triples (0-based ids)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "u.data").write_text("".join(f"{u + 1}\t{i + 1}\t{r}\t{880000000 + k}\n"
                                           for k, (u, i, r) in enumerate(ratings)))
    flags = "|".join(["0"] * 19)
    (folder / "u.item").write_text("".join(f"{i + 1}|Movie {i + 1} (1995)|01-Jan-1995||http://x|"
                                           f"{flags}\n" for i in range(n_items)))
    (folder / "u.user").write_text("".join(f"{u + 1}|30|M|other|00000\n" for u in range(n_users)))
    return folder


def _random_ratings(n_users: int = 30, n_items: int = 40) -> list[tuple[int, int, int]]:
    g = rng.stream(0, "test", 4)
    out = []
    for u in range(n_users):
        items = np.sort(g.choice(n_items, size=int(g.integers(20, 36)), replace=False))
        out += [(u, int(i), int(g.integers(1, 6))) for i in items]
    return out


def _build(folder: Path, **opts):
    r = recipes.get("movielens")
    return r.build([folder], recipes.options(r, opts))


@pytest.fixture(scope="module")
def fake(tmp_path_factory):
    ratings = _random_ratings()
    folder = _write_ml(tmp_path_factory.mktemp("ml") / "ml-100k", ratings, 30, 40)
    return ratings, folder, _build(folder)


def test_split_centring_and_features(fake):
    ratings, _, p = fake
    R = np.array(ratings)
    Q = p.public_extra["item_features"]
    assert len(p.agents) == 30 and p.task == "regression" and Q.shape == (40, 20)
    for u, ((X, y), (Xt, yt), e) in enumerate(zip(p.agents, p.tests, p.agent_extra, strict=True)):
        mine = R[R[:, 0] == u]
        n = len(mine)
        assert len(y) + len(yt) == n
        assert len(yt) == int(np.floor(0.2 * n + 0.5))  # test share rounded half up
        items, items_t = e["item"], e["item_test_meta"]
        assert not set(items) & set(items_t) and set(items) | set(items_t) == set(mine[:, 1])
        rating = dict(zip(mine[:, 1].tolist(), mine[:, 2].tolist(), strict=True))
        train_r = np.array([rating[i] for i in items], dtype=float)
        test_r = np.array([rating[i] for i in items_t], dtype=float)
        mean = train_r.mean()  # centred by the user's train mean, not the overall mean
        assert e["mean_meta"][0] == pytest.approx(mean, abs=1e-12)
        assert abs(y.mean()) < 1e-12
        np.testing.assert_allclose(y, train_r - mean, atol=1e-12)
        np.testing.assert_allclose(yt, test_r - mean, atol=1e-12)
        np.testing.assert_array_equal(X, Q[items])
        np.testing.assert_array_equal(Xt, Q[items_t])
    assert float(p.public_extra["item_norm_max"]) == pytest.approx(np.linalg.norm(Q, axis=1).max())


def test_graph_is_symmetrised_10nn(fake, tmp_path):
    ratings, _, p = fake
    edges, w = p.public_extra["graph_edges"], p.public_extra["graph_weights"]
    assert edges.dtype == np.int64 and np.all(edges[:, 0] < edges[:, 1])
    assert w.dtype == np.float64 and np.all(w == 1.0)
    # reference: cosine similarity of the centred train rating vectors, 10 nearest each, OR
    Rm = np.zeros((30, 40))
    for u, e in enumerate(p.agent_extra):
        Rm[u, e["item"]] = p.agents[u][1]
    unit = Rm / np.linalg.norm(Rm, axis=1)[:, None]
    S = unit @ unit.T
    np.fill_diagonal(S, -np.inf)
    near = np.argsort(-S, axis=1)[:, :10]
    A = np.zeros((30, 30), dtype=bool)
    A[np.repeat(np.arange(30), 10), near.ravel()] = True
    A |= A.T
    got = np.zeros((30, 30), dtype=bool)
    got[edges[:, 0], edges[:, 1]] = True
    np.testing.assert_array_equal(got | got.T, A)
    assert np.bincount(edges.ravel(), minlength=30).min() >= 10
    path = write_prepared(p, tmp_path / "ml.h5", recipe="movielens", options={}, source="fake")
    W = read_graph(path)  # connected, by the shared convention
    np.testing.assert_array_equal(W.toarray() > 0, A)


def test_features_use_train_ratings_only(fake, tmp_path):
    ratings, _, p = fake
    # the split depends only on each user's rating count, so it survives a change of value
    u = 3
    test_item = int(p.agent_extra[u]["item_test_meta"][0])
    train_item = int(p.agent_extra[u]["item"][0])

    def changed(item: int) -> tuple:
        new = [(a, b, (r % 5) + 1 if (a, b) == (u, item) else r) for a, b, r in ratings]
        return _build(_write_ml(tmp_path / f"ml{item}" / "ml-100k", new, 30, 40))

    q = changed(test_item)
    np.testing.assert_array_equal(q.public_extra["item_features"], p.public_extra["item_features"])
    np.testing.assert_array_equal(q.public_extra["graph_edges"], p.public_extra["graph_edges"])
    assert not np.array_equal(q.tests[u][1], p.tests[u][1])  # the test target did change
    q = changed(train_item)
    assert not np.array_equal(q.public_extra["item_features"], p.public_extra["item_features"])


def test_seed_changes_the_split(fake):
    _, folder, p = fake
    q = _build(folder, seed=2)
    assert any(not np.array_equal(a["item"], b["item"])
               for a, b in zip(p.agent_extra, q.agent_extra, strict=True))


def test_disconnected_graph_is_an_error(tmp_path):
    # two groups of 12 users rating disjoint items with near-identical tastes: the 10 nearest
    # neighbours of every user lie in its own group
    g = rng.stream(1, "test", 4)
    ratings = []
    for u in range(24):
        base = 0 if u < 12 else 20
        for j in range(20):
            r = 5 if j % 2 else 1
            ratings.append((u, base + j, r if g.random() > 0.1 else 3))
    folder = _write_ml(tmp_path / "ml-100k", ratings, 24, 40)
    with pytest.raises(DataError, match=r"disconnected; 12 of 24 agents cannot be reached from "
                                        r"agent 0: 12, 13, 14"):
        _build(folder)


@pytest.mark.skipif(not REAL.is_file(), reason=f"{REAL} (the real MovieLens-100K) absent")
def test_real_movielens():
    r = recipes.get("movielens")
    p = r.build([REAL], recipes.options(r, {}))
    assert len(p.agents) == 943
    n_tr = np.array([len(y) for _, y in p.agents])
    n_te = np.array([len(t[1]) for t in p.tests])
    n = n_tr + n_te
    assert n.sum() == 100_000 and n.min() == 20 and n.max() == 737
    np.testing.assert_array_equal(n_te, np.floor(0.2 * n + 0.5).astype(int))
    assert n_te.sum() == 20_000
    edges = p.public_extra["graph_edges"]
    deg = np.bincount(edges.ravel(), minlength=943)
    assert deg.min() >= 10 and edges.dtype == np.int64
    Q = p.public_extra["item_features"]
    assert Q.shape == (1682, 20)
    assert float(p.public_extra["item_norm_max"]) == np.linalg.norm(Q, axis=1).max()
    assert max(abs(y.mean()) for _, y in p.agents) < 1e-12
