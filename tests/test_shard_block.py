"""The block layout of shard files (format_version 2: every owner's records in one X, rows by
/agents/offsets) and the block reads of `ShardFile` (`read_agents`, `read_agents_test`, `sizes`,
`check_agents`, `check_finite` over a rank's owners in a few large reads): values bit for bit
those of the group layout (format_version 1, still read and written with layout="groups"), the
same clear errors, and the same results of a job."""

from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np
import pytest
import scipy.sparse as sp
from helpers import mpi_run, read_datasets, write_job

import mpi_dp.data.shard_reader as shard_reader
from mpi_dp.data.shards import FORMAT_VERSION, ShardFile, rewrite_shards, write_shards
from mpi_dp.data.synth import synth_regression, write_synth
from mpi_dp.errors import DataError, ShardError

SIZES = [5, 1, 7, 3, 4, 6]
P = 4


def _data(sparse: bool, seed: int = 0):
    """Owners (some with a test set, some with extra arrays) of SIZES records, dense or CSR."""
    g = np.random.default_rng(seed)

    def matrix(n: int):
        X = g.standard_normal((n, P))
        return sp.csr_matrix(np.where(X > 0.3, X, 0.0)) if sparse else X

    agents = [(matrix(n), g.standard_normal(n)) for n in SIZES]
    tests = [None if i % 2 == 0 else (matrix(i), g.standard_normal(i))
             for i in range(len(SIZES))]
    extra = []
    for i, n in enumerate(SIZES):
        e = {} if i == 2 else {"item": np.arange(100 * i, 100 * i + n, dtype=np.int64),
                               "label": np.array([f"r{i}-{k}" * (k + 1) for k in range(n)]),
                               "pair": g.standard_normal((n, 2)),
                               "mean_meta": np.array([float(i)])}
        if i == 3:
            e["odd_meta"] = np.float64(3.5)  # a scalar: stored per owner, not concatenated
            e["pair"] = e["pair"].astype(np.float32)  # another dtype: per owner too
        extra.append(e)
    return agents, tests, extra


def _write(path: Path, layout: str, sparse: bool = False, seed: int = 0) -> Path:
    agents, tests, extra = _data(sparse, seed)
    return write_shards(path, agents, test=tests, agent_extra=extra, layout=layout,
                        public=(agents[0][0], agents[0][1]))


def _same(a, b) -> bool:
    """Bit-for-bit equal matrices or vectors: dense bytes, or CSR arrays with their dtypes."""
    if sp.issparse(a) or sp.issparse(b):
        return (sp.issparse(a) and sp.issparse(b) and a.shape == b.shape
                and all(x.dtype == y.dtype and x.tobytes() == y.tobytes()
                        for x, y in ((a.data, b.data), (a.indices, b.indices),
                                     (a.indptr, b.indptr))))
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


@pytest.fixture(params=[False, True], ids=["dense", "csr"])
def both(request, tmp_path):
    """The same owners written in both layouts: (groups file, blocks file, sparse)."""
    sparse = request.param
    return (_write(tmp_path / "groups.h5", "groups", sparse),
            _write(tmp_path / "blocks.h5", "blocks", sparse), sparse)


def test_layouts_on_disk(both):
    old, new, _ = both
    with h5py.File(old, "r") as f:
        assert f.attrs["format_version"] == 1 and sorted(f["agents"].keys(), key=int) == [
            str(i) for i in range(len(SIZES))]
    with h5py.File(new, "r") as f:
        assert f.attrs["format_version"] == 2
        g = f["agents"]
        assert g["offsets"][()].tolist() == np.concatenate([[0], np.cumsum(SIZES)]).tolist()
        assert g["test_offsets"][()].tolist() == [0, 0, 1, 1, 4, 4, 9]
        assert g["y"].shape == (sum(SIZES),)
        assert g["extra/item"].attrs["layout"] == "concat"
        assert g["extra/pair"].attrs["layout"] == "per_agent"  # float32 beside float64
        assert g["extra/odd_meta"].attrs["layout"] == "per_agent"
        assert g["extra/item/present"][()].tolist() == [1, 1, 0, 1, 1, 1]
    with ShardFile(old) as a, ShardFile(new) as b:
        assert (a.layout, b.layout) == ("groups", "blocks")


def test_round_trip_bit_identical_across_layouts(both):
    """Every read of the block layout returns what the group layout returns, bit for bit, and
    what was written."""
    old, new, sparse = both
    agents, tests, extra = _data(sparse)
    with ShardFile(old) as a, ShardFile(new) as b:
        assert a.sizes().tolist() == b.sizes().tolist() == SIZES
        assert b.sizes([4, 0]).tolist() == [4, 5] and b.sizes().dtype == np.int64
        assert a.has_tests().tolist() == b.has_tests().tolist() == [False, True] * 3
        for i, n in enumerate(SIZES):
            for k in (None, 0, 1, n):
                Xa, ya = a.read_agent(i, k)
                Xb, yb = b.read_agent(i, k)
                assert _same(Xa, Xb) and _same(ya, yb)
            assert _same(b.read_agent(i)[0], sp.csr_matrix(agents[i][0]) if sparse
                         else agents[i][0])
            if n >= 3:
                assert all(_same(u, v) for u, v in zip(a.read_agent_rows(i, 1, 3),
                                                       b.read_agent_rows(i, 1, 3), strict=True))
            if tests[i] is not None:
                assert all(_same(u, v) for u, v in zip(a.read_agent_test(i),
                                                       b.read_agent_test(i), strict=True))
            assert a.agent_extra_names(i) == b.agent_extra_names(i)
            for name in b.agent_extra_names(i):
                u, v = a.read_agent_extra(i, name), b.read_agent_extra(i, name)
                assert u.dtype == v.dtype and u.tolist() == v.tolist()
                if not name.endswith("_meta"):
                    assert b.read_agent_extra(i, name, 1).tolist() == u[:1].tolist()
        with pytest.raises(ShardError, match=r"blocks\.h5.*agent 2 has no extra array 'item'"):
            b.read_agent_extra(2, "item")
        with pytest.raises(ShardError, match="free-form"):
            b.read_agent_extra(1, "mean_meta", 1)
        a.check_agents()
        b.check_agents()


@pytest.mark.parametrize("ids, n", [
    (range(6), None), ([5, 4, 3, 2, 1, 0], None), (range(1, 5), 1), ([0, 2, 2, 5], [3, 7, 0, 6]),
    (np.array([3, 1]), np.array([2, 1])), ([], None),
])
@pytest.mark.parametrize("read_bytes", [2**26, 100], ids=["one-read", "tiny-reads"])
def test_read_agents_equals_read_agent(both, monkeypatch, ids, n, read_bytes):
    """read_agents(ids, n) is read_agent(i, n_i) for each id, in both layouts, with spans of any
    size (READ_BYTES) and before or after check_finite kept the records."""
    monkeypatch.setattr(shard_reader, "READ_BYTES", read_bytes)
    old, new, _ = both
    counts = [None] * len(ids) if n is None else (
        [n] * len(ids) if np.ndim(n) == 0 else list(n))
    for keep in (False, True):
        with ShardFile(old) as a, ShardFile(new) as b:
            if keep:
                a.check_finite()
                b.check_finite([1, 2, 3])
            ref = [a.read_agent(i, k) for i, k in zip(ids, counts, strict=True)]
            for sf in (a, b):
                got = sf.read_agents(ids, n)
                assert len(got) == len(ref)
                for (X, y), (Xr, yr) in zip(got, ref, strict=True):
                    assert _same(X, Xr) and _same(y, yr)
            tests = b.read_agents_test(ids)
            assert [t is None for t in tests] == [a.has_test(i) is False for i in ids]
            for i, t in zip(ids, tests, strict=True):
                if t is not None:
                    assert all(_same(u, v) for u, v in zip(t, a.read_agent_test(i), strict=True))
            assert [t is None for t in a.read_agents_test(ids)] == [t is None for t in tests]


def test_read_agents_checks_like_read_agent(tmp_path):
    path = _write(tmp_path / "b.h5", "blocks")
    with ShardFile(path) as sf:
        with pytest.raises(ShardError, match=r"b\.h5.*agent 2: asked for n=8 records but only 7"):
            sf.read_agents([0, 2], [1, 8])
        with pytest.raises(ShardError, match=r"agent 1: cannot read a negative number"):
            sf.read_agents([1], -1)
        with pytest.raises(ShardError, match=r"agent 6 out of range \(the file has agents 0..5\)"):
            sf.read_agents([0, 6])
        with pytest.raises(ShardError, match=r"agent 9 out of range"):
            sf.check_agents([0, 9])
        with pytest.raises(ShardError, match=r"agent -1 out of range"):
            sf.sizes([-1])
        with pytest.raises(ShardError, match="2 record counts given for 1 agents"):
            sf.read_agents([0], [1, 2])
        with pytest.raises(ShardError, match="agent 0 has no test set"):
            sf.read_agent_test(0)


def test_a_block_of_owners_is_read_in_a_few_reads(tmp_path, monkeypatch):
    """Start-up of 300 owners (sizes, checks, every record and test set): a handful of reads of
    /agents, not one per owner."""
    g = np.random.default_rng(1)
    agents = [(g.standard_normal((4, 3)), g.standard_normal(4)) for _ in range(300)]
    tests = [(g.standard_normal((2, 3)), g.standard_normal(2)) for _ in range(300)]
    path = write_shards(tmp_path / "many.h5", agents, test=tests)
    reads: list[tuple[str, int, int]] = []
    dense_rows = ShardFile._dense_rows

    def counted(self, name, lo, hi):
        reads.append((name, lo, hi))
        return dense_rows(self, name, lo, hi)

    monkeypatch.setattr(ShardFile, "_dense_rows", counted)
    with ShardFile(path) as sf:
        ids = range(50, 250)
        assert sf.sizes(ids).tolist() == [4] * 200
        sf.check_agents(ids)
        sf.check_finite(ids)
        got = sf.read_agents(ids)
        got_test = sf.read_agents_test(ids)
    assert sorted(reads) == [("X", 200, 1000), ("X_test", 100, 500), ("y", 200, 1000),
                             ("y_test", 100, 500)]
    for i, (X, y), (Xt, yt) in zip(ids, got, got_test, strict=True):
        assert _same(X, agents[i][0]) and _same(y, agents[i][1])
        assert _same(Xt, tests[i][0]) and _same(yt, tests[i][1])
        assert not X.flags.writeable  # kept by check_finite, read once
        assert X.base is None or X.base.shape == X.shape  # each owner's own array


def test_csr_reads_stay_bounded(tmp_path, monkeypatch):
    """CSR spans are bounded by their entries: a tiny READ_BYTES reads owner by owner, and the
    matrices are still those of read_agent."""
    path = _write(tmp_path / "c.h5", "blocks", sparse=True)
    monkeypatch.setattr(shard_reader, "READ_BYTES", 1)
    spans: list[tuple[int, int]] = []
    spans_of = ShardFile._spans

    def recorded(self, ids, n, off, suffix):
        for k, j in spans_of(self, ids, n, off, suffix):
            spans.append((k, j))
            yield k, j

    monkeypatch.setattr(ShardFile, "_spans", recorded)
    with ShardFile(path) as sf:
        ref = [sf.read_agent(i) for i in range(6)]
        got = sf.read_agents(range(6))
    assert spans == [(k, k + 1) for k in range(6)]
    assert all(_same(X, Xr) for (X, _), (Xr, _) in zip(got, ref, strict=True))


# ----------------------------------------------------------------------------------------------
# the same clear errors


def _nan(path: Path, layout: str, i: int, row: int, col: int | None, test: bool = False) -> None:
    """Put a NaN in owner i's record `row` (feature `col`, or its label when col is None)."""
    suffix = "_test" if test else ""
    with h5py.File(path, "r+") as f:
        if layout == "groups":
            base = f"agents/{i}/"
            start = 0
        else:
            base = "agents/"
            start = int(f[f"agents/{'test_' if test else ''}offsets"][i])
        if col is None:
            y = f[f"{base}y{suffix}"]
            v = y[()]
            v[start + row] = np.nan
            y[...] = v
            return
        X = f[f"{base}X{suffix}"]
        if isinstance(X, h5py.Group):  # CSR: the entry of (row, col)
            ip = X["indptr"][()]
            ind = X["indices"][()]
            k = ip[start + row] + int(np.flatnonzero(ind[ip[start + row]: ip[start + row + 1]]
                                                     == col)[0])
            d = X["data"][()]
            d[k] = np.nan
            X["data"][...] = d
            return
        v = X[()]
        v[start + row, col] = np.nan
        X[...] = v


@pytest.mark.parametrize("sparse", [False, True], ids=["dense", "csr"])
def test_nan_in_one_owner_same_error_in_both_layouts(tmp_path, sparse):
    messages = {}
    for layout in ("groups", "blocks"):
        path = _write(tmp_path / f"{layout}.h5", layout, sparse)
        with ShardFile(path) as sf:
            X = sf.read_agent(4)[0]
        row, col = (int(v) for v in np.argwhere(X.toarray() != 0 if sparse else X != 0)[1])
        _nan(path, layout, 4, row, col)
        _nan(path, layout, 1, 0, None, test=True)  # owner 1's held-out label
        _nan(path, layout, 5, 2, None)
        with ShardFile(path) as sf:
            sf.check_finite([0, 2, 3])
            got = []
            for ids in ([0, 4, 5], [5, 4], [3, 1, 4], range(6)):
                with pytest.raises(ShardError) as err:
                    sf.check_finite(ids)
                got.append(str(err.value).replace(path.name, "F"))
            messages[layout] = got
    assert messages["groups"] == messages["blocks"]
    assert f"owner 4: record {row}, feature {col} is nan" in messages["blocks"][0]
    assert "owner 5: record 2 has the label nan: labels must be finite" in messages["blocks"][1]
    assert "owner 1: test record 0 has the label nan" in messages["blocks"][2]


def _edit(path: Path, fn) -> Path:
    with h5py.File(path, "r+") as f:
        fn(f["agents"])
    return path


def _replace(g: h5py.Group, name: str, value) -> None:
    del g[name]
    g[name] = value


@pytest.mark.parametrize("edit, match", [
    (lambda g: g.__delitem__("offsets"), r"has no /agents/offsets dataset"),
    (lambda g: _replace(g, "offsets", np.arange(6)),
     r"/agents/offsets has shape \(6,\) and dtype int64, expected \(7,\) integers"),
    (lambda g: _replace(g, "offsets", np.linspace(0, 26, 7)), r"expected \(7,\) integers"),
    (lambda g: _replace(g, "offsets", np.array([1, 5, 6, 13, 16, 20, 26])),
     r"/agents/offsets starts at 1, expected 0"),
    (lambda g: _replace(g, "offsets", np.array([0, 5, 4, 13, 16, 20, 26])),
     r"/agents/offsets decreases at agent 1 \(5 -> 4\)"),
    (lambda g: _replace(g, "offsets", np.array([0, 5, 6, 13, 16, 20, 25])),
     r"/agents/X has 26 rows but /agents/offsets ends at 25"),
    (lambda g: _replace(g, "y", np.zeros(25)), r"y has shape \(25,\) but X has 26 rows"),
    (lambda g: _replace(g, "X", np.zeros((26, 3))), r"X has shape \(26, 3\), expected \(n, 4\)"),
    (lambda g: _replace(g, "y", np.zeros(26, dtype=np.float32)), r"X/y are not float64"),
    (lambda g: g.__delitem__("test_offsets"), r"has /agents/X_test or y_test but no "
     r"/agents/test_offsets"),
    (lambda g: _replace(g, "test_offsets", np.array([0, 0, 1, 1, 4, 4, 8])),
     r"/agents/X_test has 9 rows but /agents/test_offsets ends at 8"),
    (lambda g: g.__delitem__("y"), r"dataset y missing"),
])
def test_damaged_block_layout_fails_at_open_naming_the_file(tmp_path, edit, match):
    path = _edit(_write(tmp_path / "d.h5", "blocks"), edit)
    with pytest.raises(ShardError, match=r"shard file '.*d\.h5': .*" + match):
        ShardFile(path)


def test_damaged_csr_block_fails_at_open(tmp_path):
    path = _write(tmp_path / "c.h5", "blocks", sparse=True)

    def short_indptr(g):
        ip = g["X/indptr"][()]
        _replace(g["X"], "indptr", ip[:-1])

    _edit(path, short_indptr)
    with pytest.raises(ShardError, match=r"c\.h5.*CSR X/indptr has 26 entries, expected 27"):
        ShardFile(path)


def test_damaged_extra_arrays_named_by_check_agents(tmp_path):
    path = _write(tmp_path / "e.h5", "blocks")

    def short(g):
        off = g["extra/item/offsets"][()]
        off[4:] -= 1  # owner 3's item ids one short, values one shorter
        _replace(g["extra/item"], "offsets", off)
        _replace(g["extra/item"], "values", g["extra/item/values"][:-1])

    _edit(path, short)
    with ShardFile(path) as sf:
        sf.check_agents([0, 1, 2, 4, 5])
        with pytest.raises(ShardError, match=r"e\.h5.*agent 3: extra array 'item' has shape "
                           r"\(2,\), expected 3 entries"):
            sf.check_agents([5, 3])
    path = _write(tmp_path / "p.h5", "blocks")
    _edit(path, lambda g: _replace(g["extra/pair"], "3", np.zeros((9, 2))))
    with ShardFile(path) as sf, pytest.raises(
            ShardError, match=r"agent 3: extra array 'pair' has shape \(9, 2\), expected 3"):
        sf.check_agents()
    path = _write(tmp_path / "o.h5", "blocks")
    _edit(path, lambda g: _replace(g["extra/item"], "offsets", np.arange(3)))
    with ShardFile(path) as sf, pytest.raises(
            ShardError, match=r"/agents/extra/item/offsets has shape \(3,\)"):
        sf.check_agents()


def test_empty_owner_named_by_check_sizes(tmp_path):
    path = _write(tmp_path / "z.h5", "blocks")
    _edit(path, lambda g: _replace(g["extra/item"], "offsets", g["extra/item/offsets"][()]))
    with h5py.File(path, "r+") as f:  # owner 1 (1 record) left with none: owner 2 starts early
        off = f["agents/offsets"][()]
        off[1] = off[2]
        f["agents/offsets"][...] = off
    with ShardFile(path) as sf:
        assert sf.sizes().tolist() == [6, 0, 7, 3, 4, 6]
        with pytest.raises(ShardError, match=r"z\.h5.*owner 1 holds no records"):
            sf.check_sizes()


def test_writer_validates_the_layout_and_old_files_still_read(tmp_path):
    agents, _, _ = _data(False)
    with pytest.raises(DataError, match="unknown shard layout 'rows'"):
        write_shards(tmp_path / "x.h5", agents, layout="rows")
    assert list(tmp_path.iterdir()) == []
    # a version-1 file as the first writers made it: no storage attribute, groups only
    path = tmp_path / "v1.h5"
    with h5py.File(path, "w") as f:
        f.attrs.update(format="mpi_dp.shards", format_version=1, n_agents=2, n_features=P,
                       task="regression", source="old")
        for i, (X, y) in enumerate(agents[:2]):
            g = f.create_group(f"agents/{i}")
            g.attrs["n"] = X.shape[0]
            g["X"], g["y"] = X, y
    with ShardFile(path) as sf:
        assert sf.layout == "groups" and sf.sizes().tolist() == SIZES[:2]
        sf.check_agents()
        sf.check_finite()
        for (X, y), (Xr, yr) in zip(sf.read_agents(range(2)), agents[:2], strict=True):
            assert _same(X, Xr) and _same(y, yr)


# ----------------------------------------------------------------------------------------------
# a job's results do not depend on the layout


def test_job_results_bit_identical_across_layouts(tmp_path):
    """A short sync_star job (3 runs, swept eps, public data) on 2 ranks gives bit-identical
    results from a group-layout file and the same data in the block layout."""
    d = synth_regression(7, [30, 45, 20, 60, 25, 40, 35], 5, 0.5, 3, public=200)
    results = []
    for layout in ("groups", "blocks"):
        data = write_shards(tmp_path / f"{layout}.h5", d["agents"], public=d["public"],
                            layout=layout)
        job = write_job(tmp_path / f"job_{layout}.toml", data, T=12, runs=3,
                        sweep={"eps": [1.0, 10.0]}, record_every=3)
        out = tmp_path / f"out_{layout}.h5"
        cp = mpi_run(2, ["run", str(job), "--out", str(out), "--quiet"])
        assert cp.returncode == 0, cp.stderr
        results.append(read_datasets(out))
    a, b = results
    assert sorted(a) == sorted(b) and len(a) > 10
    for k in a:
        assert a[k].dtype == b[k].dtype and a[k].shape == b[k].shape, k
        assert a[k].tobytes() == b[k].tobytes() or np.array_equal(a[k], b[k], equal_nan=True), k


def test_sizes_and_checks_read_no_records(tmp_path, monkeypatch):
    """sizes, check_sizes and check_agents of the block layout use the offsets read at open."""
    path = _write(tmp_path / "s.h5", "blocks")
    with ShardFile(path) as sf:
        monkeypatch.setattr(ShardFile, "_dense_rows", lambda *a: pytest.fail("records read"))
        monkeypatch.setattr(h5py.Dataset, "__getitem__", lambda *a: pytest.fail("data read"))
        assert sf.sizes(range(6)).tolist() == SIZES
        sf.check_sizes()
        monkeypatch.undo()
        monkeypatch.setattr(ShardFile, "_dense_rows", lambda *a: pytest.fail("records read"))
        sf.check_agents(range(6))


def test_rewrite_shards_keeps_everything(tmp_path):
    """rewrite_shards moves a file between the layouts: records, test sets, extra arrays, public
    data, global test set and attributes read back identical."""
    agents, tests, extra = _data(True)
    src = write_shards(tmp_path / "v1.h5", agents, test=tests, agent_extra=extra,
                       public=(agents[1][0], agents[1][1]), test_global=agents[2],
                       feature_names=list("abcd"), source="src", attrs={"k": 3, "cfg": {"a": 1}},
                       public_extra={"basis": np.eye(2), "partition_values": np.array(["x", "y"])},
                       layout="groups")
    dst = rewrite_shards(src, tmp_path / "v2.h5")
    with ShardFile(src) as a, ShardFile(dst) as b:
        assert (a.layout, b.layout) == ("groups", "blocks")
        assert {k: v for k, v in a.attrs.items() if k not in ("format_version", "created_by")} \
            == {k: v for k, v in b.attrs.items() if k not in ("format_version", "created_by")}
        ids = range(a.n_agents)
        for (X, y), (Xb, yb) in zip(a.read_agents(ids), b.read_agents(ids), strict=True):
            assert _same(X, Xb) and _same(y, yb)
        for t, tb in zip(a.read_agents_test(ids), b.read_agents_test(ids), strict=True):
            assert (t is None and tb is None) or all(_same(u, v) for u, v in zip(t, tb,
                                                                                strict=True))
        for i in ids:
            assert a.agent_extra_names(i) == b.agent_extra_names(i)
            for name in a.agent_extra_names(i):
                assert a.read_agent_extra(i, name).tolist() == b.read_agent_extra(i,
                                                                                  name).tolist()
        assert all(_same(u, v) for u, v in zip(a.read_public(), b.read_public(), strict=True))
        assert all(_same(u, v) for u, v in zip(a.read_test(), b.read_test(), strict=True))
        assert a.public_extra_names() == b.public_extra_names()
        assert np.array_equal(a.read_public_extra("basis"), b.read_public_extra("basis"))
        assert b.read_public_extra("partition_values").tolist() == [b"x", b"y"]


def test_synth_writes_the_block_layout(tmp_path):
    path = write_synth(tmp_path / "s.h5", "regression", 4, 10, 3, 0.5, 1, public=20)
    with ShardFile(path) as sf:
        assert sf.layout == "blocks" and sf.attrs["format_version"] == FORMAT_VERSION == 2
        assert sf.sizes().tolist() == [10] * 4


@pytest.mark.parametrize("sparse", [False, True])
def test_data_upgrade_command(tmp_path, sparse, capsys, monkeypatch):
    """`mpi-dp data upgrade`: a version-1 file written again in the block layout with the same
    records and test sets; an existing OUT is refused and left as it was; a block file is left
    alone; an upgrade that would not hold the same data leaves no file behind."""
    from mpi_dp import cli
    from mpi_dp.data import upgrade_cli

    old = _write(tmp_path / "old.h5", "groups", sparse)
    new = tmp_path / "new.h5"
    assert cli.main(["data", "upgrade", str(old), str(new)]) == 0
    assert "records checked equal" in capsys.readouterr().out
    with ShardFile(old) as a, ShardFile(new) as b:
        assert (a.layout, b.layout) == ("groups", "blocks")
        ids = range(len(SIZES))
        for pa, pb in zip(a.read_agents(ids), b.read_agents(ids), strict=True):
            assert _same(pa[0], pb[0]) and _same(pa[1], pb[1])
    before = new.read_bytes()
    assert cli.main(["data", "upgrade", str(old), str(new)]) != 0  # never replaced
    assert "exists" in capsys.readouterr().err and new.read_bytes() == before
    assert cli.main(["data", "upgrade", str(new), str(tmp_path / "again.h5")]) == 0
    assert "already in the block layout" in capsys.readouterr().out
    assert not (tmp_path / "again.h5").exists()

    other = _write(tmp_path / "other.h5", "groups", sparse, seed=1)  # different records
    with pytest.raises(DataError, match="owner 0's records differ"):
        upgrade_cli.check_same_records(old, other)
    import mpi_dp.data.shard_writer as writer  # the command imports its writer when run

    def wrong(src, dst, layout="blocks"):
        return writer.write_shards(dst, _data(sparse, seed=2)[0], layout=layout)

    monkeypatch.setattr(writer, "rewrite_shards", wrong)
    assert cli.main(["data", "upgrade", str(old), str(tmp_path / "bad.h5")]) != 0
    assert "differ" in capsys.readouterr().err and not (tmp_path / "bad.h5").exists()
