"""The HDF5 shard format: exact round trips, cheap metadata, clear errors, atomic writes."""

from __future__ import annotations

import json
import pathlib

import h5py
import numpy as np
import pytest

from mpi_dp.data import FORMAT, ShardFile, write_shards
from mpi_dp.errors import DataError, ShardError


def _agents(sizes=(7, 12, 5), p=3, seed=0):
    g = np.random.default_rng(seed)
    return [(g.standard_normal((n, p)), g.standard_normal(n)) for n in sizes]


def _tmp_leftovers(directory: pathlib.Path) -> list[str]:
    return sorted(f.name for f in directory.iterdir() if f.name.endswith(".tmp"))


@pytest.fixture
def shard(tmp_path):
    agents = _agents()
    g = np.random.default_rng(1)
    public = (g.standard_normal((20, 3)), g.standard_normal(20))
    basis = g.standard_normal((3, 2))
    path = write_shards(
        tmp_path / "sub" / "d.h5",
        agents,
        public=public,
        task="regression",
        feature_names=["a", "b", "c"],
        source="unit test",
        attrs={"lam": 1e-5, "name": "demo", "k": 3, "cfg": {"x": [1, 2]}, "lst": [1.5, 2]},
        public_extra={"basis": basis},
        layout="groups",  # format_version 1, still written and read (tests/test_shard_block.py
    )                     # checks the block layout against it)
    return path, agents, public, basis


def test_round_trip_exact(shard):
    path, agents, public, basis = shard
    assert path.exists() and _tmp_leftovers(path.parent) == []
    with ShardFile(path) as sf:
        assert sf.path == path
        assert sf.n_agents == 3 and sf.n_features == 3 and sf.task == "regression"
        assert sf.feature_names == ["a", "b", "c"]
        assert sf.source == "unit test"
        for i, (X, y) in enumerate(agents):
            Xr, yr = sf.read_agent(i)
            assert Xr.dtype == np.float64 and yr.dtype == np.float64
            assert Xr.tobytes() == X.tobytes() and yr.tobytes() == y.tobytes()
            assert Xr.shape == X.shape and yr.shape == y.shape
        assert sf.has_public
        Xp, yp = sf.read_public()
        assert Xp.tobytes() == public[0].tobytes() and yp.tobytes() == public[1].tobytes()
        assert np.array_equal(sf.read_public_extra("basis"), basis)
        assert sf.public_extra_names() == ["basis"]
        a = sf.attrs
        assert a["format"] == FORMAT and a["format_version"] == 1
        assert a["lam"] == 1e-5 and a["name"] == "demo" and a["k"] == 3
        assert json.loads(a["cfg"]) == {"x": [1, 2]} and sf.json_attr("lst") == [1.5, 2]
        assert a["created_by"].startswith("mpi_dp ")
        sf.check_agents()
        sf.check_agents([2, 0])


def test_layout_matches_contract(shard):
    path, agents, _, _ = shard
    with h5py.File(path, "r") as f:
        assert sorted(f["agents"].keys()) == ["0", "1", "2"]
        for i, (X, _) in enumerate(agents):
            g = f[f"agents/{i}"]
            assert int(g.attrs["n"]) == X.shape[0]
            assert g["X"].dtype == np.float64 and g["y"].dtype == np.float64
            assert g["X"].chunks is not None and g["X"].chunks[1] == 3  # whole-row chunks
        assert f.attrs["n_agents"] == 3 and f.attrs["n_features"] == 3


def test_sizes_from_attrs_only(shard, monkeypatch):
    path, agents, _, _ = shard
    with ShardFile(path) as sf:
        # sizes() must not read X or y: make dataset reads fail
        monkeypatch.setattr(h5py.Dataset, "__getitem__", lambda *a: pytest.fail("data read"))
        sizes = sf.sizes()
        assert sizes.dtype == np.int64
        assert sizes.tolist() == [X.shape[0] for X, _ in agents]
        assert sf.sizes([2, 1]).tolist() == [5, 12]


def test_read_prefix(shard):
    path, agents, _, _ = shard
    with ShardFile(path) as sf:
        for n in (0, 1, 4, 12):
            X, y = sf.read_agent(1, n)
            assert X.shape == (n, 3)
            assert np.array_equal(X, agents[1][0][:n]) and np.array_equal(y, agents[1][1][:n])


def test_usable_without_with(shard):
    path, agents, _, _ = shard
    sf = ShardFile(path)
    assert np.array_equal(sf.read_agent(0)[0], agents[0][0])
    sf.close()
    sf.close()  # idempotent


def test_missing_file(tmp_path):
    path = tmp_path / "x.h5"
    with pytest.raises(ShardError, match=r"shard file '.*x\.h5' not found"):
        ShardFile(path)


def test_not_hdf5(tmp_path):
    path = tmp_path / "junk.h5"
    path.write_text("not hdf5")
    with pytest.raises(ShardError, match="junk.h5"):
        ShardFile(path)


def test_wrong_or_missing_format_attr(shard, tmp_path):
    path = shard[0]
    with h5py.File(path, "a") as f:
        f.attrs["format"] = "something.else"
    with pytest.raises(ShardError, match=r"d\.h5.*format"):
        ShardFile(path)
    other = tmp_path / "plain.h5"
    with h5py.File(other, "w") as f:
        f.create_dataset("X", data=np.zeros((2, 2)))
    with pytest.raises(ShardError, match=r"plain\.h5.*format"):
        ShardFile(other)


def test_missing_agent_group_at_open(shard):
    path = shard[0]
    with h5py.File(path, "a") as f:
        del f["agents/1"]
    with pytest.raises(ShardError, match=r"d\.h5.*missing: 1"):
        ShardFile(path)


def test_n_too_large_and_bad_agent(shard):
    path = shard[0]
    with ShardFile(path) as sf:
        with pytest.raises(ShardError, match=r"d\.h5.*agent 2.*n=6.*only 5"):
            sf.read_agent(2, 6)
        with pytest.raises(ShardError, match=r"agent 3 out of range"):
            sf.read_agent(3)
        with pytest.raises(ShardError, match="agent 7"):
            sf.check_agents([0, 7])
        with pytest.raises(ShardError, match="no public extra dataset 'nope'"):
            sf.read_public_extra("nope")


def test_check_agents_inconsistent(shard):
    path = shard[0]
    with h5py.File(path, "a") as f:
        del f["agents/1/y"]
        f["agents/1"].create_dataset("y", data=np.zeros(3))
    with ShardFile(path) as sf:
        sf.check_agents([0, 2])
        with pytest.raises(ShardError, match=r"d\.h5.*agent 1.*y"):
            sf.check_agents([0, 1])


@pytest.mark.parametrize("edit, match", [
    ("csr_x", r"agent 1: X is CSR in a file with storage 'dense'"),
    ("int_y", r"agent 1: X/y are not float64"),
    ("x_cols", r"agent 1: X has shape \(12, 2\), expected \(n, 3\)"),
    ("test_rows", r"agent 1: y_test has shape \(1,\) but X_test has 2 rows"),
    ("test_missing_y", r"agent 1: dataset y_test missing"),
])
def test_check_agents_names_what_the_fast_layout_check_passes_on(tmp_path, edit, match):
    """check_agents validates the plain dense layout through HDF5's low-level API and hands
    anything else to the full check, which names the problem."""
    tests = [None, (np.ones((2, 3)), np.array([1.0, 2.0])), None]
    path = write_shards(tmp_path / "f.h5", _agents(), test=tests, layout="groups")
    with h5py.File(path, "a") as f:
        g = f["agents/1"]
        if edit == "csr_x":
            del g["X"]
            c = g.create_group("X")
            c.create_dataset("data", data=np.ones(12))
        elif edit == "int_y":
            del g["y"]
            g.create_dataset("y", data=np.zeros(12, dtype=np.int64))
        elif edit == "x_cols":
            del g["X"]
            g.create_dataset("X", data=np.zeros((12, 2)))
        elif edit == "test_rows":
            del g["y_test"]
            g.create_dataset("y_test", data=np.zeros(1))
        else:
            del g["y_test"]
    with ShardFile(path) as sf:
        sf.check_agents([0, 2])
        with pytest.raises(ShardError, match=match):
            sf.check_agents()


def test_no_public(tmp_path):
    path = write_shards(tmp_path / "np.h5", _agents())
    with ShardFile(path) as sf:
        assert not sf.has_public and sf.feature_names is None
        with pytest.raises(ShardError, match="no public"):
            sf.read_public()


def test_test_sets(tmp_path):
    agents = _agents()
    tests = [None, (np.ones((2, 3)), np.array([1.0, 2.0])), None]
    path = write_shards(tmp_path / "t.h5", agents, test=tests)
    with ShardFile(path) as sf:
        assert not sf.has_test(0) and sf.has_test(1)
        X, y = sf.read_agent_test(1)
        assert np.array_equal(X, tests[1][0]) and np.array_equal(y, tests[1][1])
        sf.check_agents()


@pytest.mark.parametrize(
    "agents, match",
    [
        ([(np.zeros((3, 2)), np.zeros(3)), (np.zeros((3, 4)), np.zeros(3))], "agent 1.*4 features"),
        ([(np.zeros((3, 2)), np.zeros(4))], "agent 0.*3 rows.*4 entries"),
        ([(np.zeros((3, 2)), np.zeros(3)), (np.full((2, 2), np.nan), np.zeros(2))],
         "agent 1.*X.*non-finite"),
        ([(np.zeros((3, 2)), np.array([0.0, np.inf, 0.0]))], "agent 0.*y.*non-finite"),
        ([(np.zeros(3), np.zeros(3))], "agent 0.*2-D"),
        ([], "no agents"),
    ],
)
def test_invalid_input_leaves_nothing(tmp_path, agents, match):
    path = tmp_path / "bad.h5"
    with pytest.raises(DataError, match=match):
        write_shards(path, agents)
    assert list(tmp_path.iterdir()) == []


def test_failed_write_keeps_old_file_and_no_temp(tmp_path, monkeypatch):
    path = write_shards(tmp_path / "d.h5", _agents())
    before = path.read_bytes()
    bad = _agents()
    bad[1][0][2, 1] = np.nan
    with pytest.raises(DataError, match="agent 1"):
        write_shards(path, bad)
    assert path.read_bytes() == before
    assert _tmp_leftovers(tmp_path) == []

    # an error during the HDF5 write itself also leaves no temp file and no target
    def boom(*a, **k):
        raise RuntimeError("disk full")

    monkeypatch.setattr(h5py.Group, "create_dataset", boom)
    with pytest.raises(RuntimeError, match="disk full"):
        write_shards(tmp_path / "new.h5", _agents())
    assert sorted(f.name for f in tmp_path.iterdir()) == ["d.h5"]


def test_public_and_attr_validation(tmp_path):
    agents = _agents()
    with pytest.raises(DataError, match="public.*2 features"):
        write_shards(tmp_path / "a.h5", agents, public=(np.zeros((4, 2)), np.zeros(4)))
    with pytest.raises(DataError, match="2 feature names given for 3"):
        write_shards(tmp_path / "a.h5", agents, feature_names=["a", "b"])
    with pytest.raises(DataError, match="reserved"):
        write_shards(tmp_path / "a.h5", agents, attrs={"n_agents": 9})
    with pytest.raises(DataError, match="unknown task"):
        write_shards(tmp_path / "a.h5", agents, task="ranking")
    with pytest.raises(DataError, match="binary labels"):
        write_shards(tmp_path / "a.h5", agents, task="binary")
    assert list(tmp_path.iterdir()) == []


def test_concurrent_readers(shard):
    path, agents, _, _ = shard
    readers = [ShardFile(path) for _ in range(4)]
    try:
        for i, sf in enumerate(readers):
            assert np.array_equal(sf.read_agent(i % 3)[1], agents[i % 3][1])
    finally:
        for sf in readers:
            sf.close()


# ----------------------------------------------------------------------------------------------
# storage attribute, per-agent extra arrays, global test set


def test_storage_attr_and_files_without_it(shard):
    path = shard[0]
    with ShardFile(path) as sf:
        assert sf.storage == "dense" and not sf.is_sparse and sf.attrs["format_version"] == 1
    with h5py.File(path, "a") as f:  # a file written before the attribute existed
        del f.attrs["storage"]
    with ShardFile(path) as sf:
        assert sf.storage == "dense" and not sf.is_sparse
        assert isinstance(sf.read_agent(0)[0], np.ndarray)
        sf.check_agents()
    with h5py.File(path, "a") as f:
        f.attrs["storage"] = "coo"
    with pytest.raises(ShardError, match=r"d\.h5.*storage 'coo'"):
        ShardFile(path)
    with pytest.raises(DataError, match="'storage' is reserved"):
        write_shards(path.parent / "r.h5", _agents(), attrs={"storage": "csr"})


def _extras(agents):
    out = []
    for i, (X, _) in enumerate(agents):
        n = X.shape[0]
        out.append({"item": np.arange(100 * i, 100 * i + n, dtype=np.int64),
                    "label": np.array([f"r{i}-{k}" for k in range(n)]),
                    "pair": np.arange(2 * n, dtype=np.float64).reshape(n, 2),
                    "source_meta": np.array([i, 42, 7])})
    out[2] = None  # agents may have none
    return out


def test_agent_extra_round_trip(tmp_path):
    agents = _agents()
    extra = _extras(agents)
    path = write_shards(tmp_path / "e.h5", agents, agent_extra=extra)
    with ShardFile(path) as sf:
        sf.check_agents()
        assert sf.agent_extra_names(0) == ["item", "label", "pair", "source_meta"]
        assert sf.agent_extra_names(2) == []
        for i in (0, 1):
            item = sf.read_agent_extra(i, "item")
            assert item.dtype == np.int64 and np.array_equal(item, extra[i]["item"])
            label = sf.read_agent_extra(i, "label")
            assert label.dtype.kind == "U" and label.tolist() == extra[i]["label"].tolist()
            assert np.array_equal(sf.read_agent_extra(i, "pair"), extra[i]["pair"])
            assert sf.read_agent_extra(i, "source_meta").tolist() == [i, 42, 7]
            # the prefix matches read_agent(i, n)
            assert np.array_equal(sf.read_agent_extra(i, "item", 4), extra[i]["item"][:4])
            assert sf.read_agent_extra(i, "label", 2).tolist() == [f"r{i}-0", f"r{i}-1"]
        with pytest.raises(ShardError, match=r"e\.h5.*agent 1: asked for n=13"):
            sf.read_agent_extra(1, "item", 13)
        with pytest.raises(ShardError, match="free-form"):
            sf.read_agent_extra(0, "source_meta", 2)
        with pytest.raises(ShardError, match=r"agent 2 has no extra array 'item'; available: \[\]"):
            sf.read_agent_extra(2, "item")
    with h5py.File(path, "r") as f:  # the block layout: every owner's item ids together
        assert f["agents/extra/item/values"].shape == (19,)
        assert f["agents/extra/item/present"][()].tolist() == [1, 1, 0]


def test_agent_extra_validation_leaves_nothing(tmp_path):
    agents = _agents()
    cases = [
        ([{"item": np.arange(7)}, {"item": np.arange(11)}, None],
         "agent 1: extra array 'item' has length 11 but the agent has 12 records"),
        ([{"item": np.float64(3.0)}, None, None], "agent 0: extra array 'item' has a scalar"),
        ([{"a/b": np.arange(7)}, None, None], "agent 0: extra array name 'a/b' is invalid"),
        ([{"": np.arange(7)}, None, None], "extra array name '' is invalid"),
        ([{"o": np.array([None] * 7)}, None, None], "extra array 'o' has dtype object"),
        ([None, None], "agent_extra has 2 entries but there are 3 agents"),
    ]
    for extra, match in cases:
        with pytest.raises(DataError, match=match):
            write_shards(tmp_path / "bad.h5", agents, agent_extra=extra)
    assert list(tmp_path.iterdir()) == []


def test_check_agents_catches_extra_of_wrong_length(tmp_path):
    agents = _agents()
    path = write_shards(tmp_path / "e.h5", agents, agent_extra=_extras(agents), layout="groups")
    with h5py.File(path, "a") as f:
        del f["agents/1/extra/item"]
        f["agents/1/extra"].create_dataset("item", data=np.arange(5))
        del f["agents/0/extra/source_meta"]
        f["agents/0/extra"].create_dataset("source_meta", data=np.arange(99))  # free-form: fine
    with ShardFile(path) as sf:
        sf.check_agents([0, 2])
        with pytest.raises(ShardError, match=r"e\.h5.*agent 1: extra array 'item'.*12 entries"):
            sf.check_agents([1])


def test_global_test_round_trip(tmp_path):
    agents = _agents()
    g = np.random.default_rng(3)
    Xt, yt = g.standard_normal((9, 3)), g.standard_normal(9)
    path = write_shards(tmp_path / "g.h5", agents, test_global=(Xt, yt))
    with ShardFile(path) as sf:
        assert sf.has_global_test and not sf.has_public
        X, y = sf.read_test()
        assert X.tobytes() == Xt.tobytes() and y.tobytes() == yt.tobytes()
    with h5py.File(path, "r") as f:
        assert f["test/X"].shape == (9, 3) and f["test"].attrs["n"] == 9
    with ShardFile(write_shards(tmp_path / "n.h5", agents)) as sf:
        assert not sf.has_global_test
        with pytest.raises(ShardError, match=r"n\.h5.*no global test set"):
            sf.read_test()
    with pytest.raises(DataError, match="global test set: X has 2 features but the first agent "
                       "has 3"):
        write_shards(tmp_path / "b.h5", agents, test_global=(np.zeros((4, 2)), np.zeros(4)))
    with pytest.raises(DataError, match="global test set: y has a non-finite"):
        write_shards(tmp_path / "b.h5", agents, test_global=(Xt, np.full(9, np.nan)))
    assert not (tmp_path / "b.h5").exists()
