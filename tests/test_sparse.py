"""CSR shards: exact round trips and prefix reads, format errors, the reference solvers on CSR, and
the sync_star method under mpiexec giving the same results on a CSR file as on its dense twin."""

from __future__ import annotations

import math

import h5py
import numpy as np
import pytest
import scipy.sparse as sp
from helpers import mpi_run, write_job
from mpi4py import MPI

from mpi_dp.algorithms.common import LocalShard, Oracle, reference_quantities
from mpi_dp.comm.star import Star
from mpi_dp.data import ShardFile, write_shards
from mpi_dp.data.shards import rewrite_shards
from mpi_dp.errors import DataError, ShardError
from mpi_dp.methods.star_common import public_grad_norms
from mpi_dp.models import linear, reference
from mpi_dp.rng import stream

N_AGENTS, ROWS, P, DENSITY = 3, 300, 40, 0.1
PUBLIC = 400


def _sparse_block(seed: int, agent: int, rows: int, p: int = P) -> np.ndarray:
    """A dense array with ~DENSITY nonzeros (some rows all zero: 0.9^40 ~ 1.5% of them)."""
    g = stream(seed, "data", agent, 0)
    mask = g.random((rows, p)) < DENSITY
    return np.where(mask, g.standard_normal((rows, p)), 0.0)


def _dataset(task: str, seed: int = 4):
    """Dense (agents, public) of a small sparse problem; regression targets or +-1 labels."""
    theta = stream(seed, "data", 1000, 0).standard_normal(P)

    def targets(X, agent):
        noise = stream(seed, "data", 2000 + agent, 0).standard_normal(X.shape[0])
        z = X @ theta + 0.5 * noise
        return z if task == "regression" else np.where(z > 0, 1.0, -1.0)

    agents = []
    for i in range(N_AGENTS):
        X = _sparse_block(seed, i, ROWS)
        agents.append((X, targets(X, i)))
    Xp = _sparse_block(seed, 999, PUBLIC)
    return agents, (Xp, targets(Xp, 999))


def _twins(tmp_path, task: str):
    """The same data written dense and CSR."""
    agents, public = _dataset(task)
    dense = write_shards(tmp_path / f"{task}_dense.h5", agents, public=public, task=task)
    csr = write_shards(tmp_path / f"{task}_csr.h5", [(sp.csr_matrix(X), y) for X, y in agents],
                       public=(sp.csr_matrix(public[0]), public[1]), task=task)
    return agents, public, dense, csr


def _leftovers(directory) -> list[str]:
    return sorted(f.name for f in directory.iterdir())


# ----------------------------------------------------------------------------------------------
# the format


def test_csr_round_trip_and_dense_twin(tmp_path):
    agents, public, dense, csr = _twins(tmp_path, "regression")
    with ShardFile(csr) as sc, ShardFile(dense) as sd:
        assert sc.is_sparse and sc.storage == "csr" and not sd.is_sparse
        assert sc.attrs["format_version"] == 2 and sc.n_features == P
        sc.check_agents()
        for i, (X, y) in enumerate(agents):
            Xr, yr = sc.read_agent(i)
            assert isinstance(Xr, sp.csr_matrix) and Xr.dtype == np.float64
            assert Xr.shape == (ROWS, P) and Xr.nnz == np.count_nonzero(X)
            assert np.array_equal(Xr.toarray(), X) and np.array_equal(yr, y)
            assert np.array_equal(Xr.toarray(), sd.read_agent(i)[0])
            for r in range(ROWS):  # indices strictly increasing within every row
                assert np.all(np.diff(Xr.indices[Xr.indptr[r]:Xr.indptr[r + 1]]) > 0)
            for n in (0, 1, 7, 150, ROWS):
                Xn, yn = sc.read_agent(i, n)
                assert isinstance(Xn, sp.csr_matrix) and Xn.shape == (n, P)
                assert np.array_equal(Xn.toarray(), X[:n]) and np.array_equal(yn, y[:n])
                assert Xn.nnz == np.count_nonzero(X[:n])
        Xp, yp = sc.read_public()
        assert isinstance(Xp, sp.csr_matrix)
        assert np.array_equal(Xp.toarray(), public[0]) and np.array_equal(yp, public[1])
        with pytest.raises(ShardError, match=r"regression_csr\.h5.*agent 0.*n=301.*only 300"):
            sc.read_agent(0, ROWS + 1)


def test_csr_layout_contract(tmp_path):
    _, _, dense, csr = _twins(tmp_path, "regression")
    rows = N_AGENTS * ROWS  # the block layout: every owner's rows in one CSR matrix
    with h5py.File(csr, "r") as f:
        assert f.attrs["storage"] == "csr"
        assert f["agents/offsets"][()].tolist() == [k * ROWS for k in range(N_AGENTS + 1)]
        g = f["agents/X"]
        assert isinstance(g, h5py.Group) and g.attrs["format"] == "csr"
        assert list(g.attrs["shape"]) == [rows, P]
        assert g["data"].dtype == np.float64 and g["indptr"].dtype == np.int64
        assert g["indices"].dtype in (np.int32, np.int64)
        assert g["indptr"].shape == (rows + 1,) and g["data"].shape == (g["indptr"][rows],)
        assert isinstance(f["public/X"], h5py.Group)
    with h5py.File(dense, "r") as f:
        assert f.attrs["storage"] == "dense" and isinstance(f["agents/X"], h5py.Dataset)


def test_csr_prefix_reads_only_the_needed_entries(tmp_path, monkeypatch):
    agents, _, _, csr = _twins(tmp_path, "regression")
    calls: list[tuple[str, object]] = []
    original = h5py.Dataset.__getitem__

    def spy(self, key):
        calls.append((self.name, key))
        return original(self, key)

    with ShardFile(csr) as sc:
        monkeypatch.setattr(h5py.Dataset, "__getitem__", spy)
        X, _ = sc.read_agent(2, 10)
        monkeypatch.undo()
    nnz10 = int(np.count_nonzero(agents[2][0][:10]))
    base = int(sum(np.count_nonzero(X) for X, _ in agents[:2]))  # owner 2's first entry
    reads = {name.rsplit("/", 1)[1]: key for name, key in calls if "/X/" in name}
    assert reads["indptr"].indices(10**9) == (2 * ROWS, 2 * ROWS + 11, 1)
    assert reads["data"] == slice(base, base + nnz10)
    assert reads["indices"] == slice(base, base + nnz10)
    assert X.nnz == nnz10
    # a range of rows (a chunk of a DOLA stream) reads only that range's entries
    calls.clear()
    with ShardFile(csr) as sc:
        monkeypatch.setattr(h5py.Dataset, "__getitem__", spy)
        X, _ = sc.read_agent_rows(2, 10, 15)
        monkeypatch.undo()
    reads = {name.rsplit("/", 1)[1]: key for name, key in calls if "/X/" in name}
    lo = base + nnz10
    hi = lo + int(np.count_nonzero(agents[2][0][10:15]))
    assert reads["indptr"].indices(10**9) == (2 * ROWS + 10, 2 * ROWS + 16, 1)
    assert reads["data"] == slice(lo, hi) and reads["indices"] == slice(lo, hi)
    np.testing.assert_array_equal(X.toarray(), agents[2][0][10:15])


def test_canonical_csr_from_duplicates_and_unsorted_input(tmp_path):
    # row 0: (col 2, 1.0), (col 0, 2.0), (col 2, 0.5) -> duplicates summed, columns sorted
    data, indices, indptr = [1.0, 2.0, 0.5, 3.0], [2, 0, 2, 1], [0, 3, 4]
    X = sp.csr_matrix((data, indices, indptr), shape=(2, 3))
    coo = sp.coo_matrix(([4.0, -1.0], ([0, 1], [1, 1])), shape=(2, 3))  # any sparse kind works
    path = write_shards(tmp_path / "c.h5", [(X, [1.0, 2.0]), (coo, [0.0, 0.0])])
    with ShardFile(path) as sf:
        X0 = sf.read_agent(0)[0]
        assert X0.indices.tolist() == [0, 2, 1] and X0.data.tolist() == [2.0, 1.5, 3.0]
        assert X0.indptr.tolist() == [0, 2, 3]
        assert np.array_equal(sf.read_agent(1)[0].toarray(), [[0, 4.0, 0], [0, -1.0, 0]])


def test_empty_rows_and_an_all_zero_agent(tmp_path):
    X = sp.csr_matrix((3, 4))
    path = write_shards(tmp_path / "z.h5", [(X, np.zeros(3)), (sp.eye(2, 4, format="csr"),
                                                               np.ones(2))])
    with ShardFile(path) as sf:
        sf.check_agents()
        X0 = sf.read_agent(0)[0]
        assert X0.shape == (3, 4) and X0.nnz == 0
        assert np.array_equal(sf.read_agent(1, 1)[0].toarray(), [[1.0, 0, 0, 0]])


@pytest.mark.parametrize("where", ["public", "test", "agent", "global"])
def test_mixing_dense_and_csr_is_refused(tmp_path, where):
    agents, public = _dataset("regression")
    csr = [(sp.csr_matrix(X), y) for X, y in agents]
    kw: dict = {}
    if where == "public":
        kw["public"] = public  # dense public with CSR agents
    elif where == "test":
        kw["test"] = [None, (agents[1][0][:5], agents[1][1][:5]), None]
    elif where == "global":
        kw["test_global"] = (agents[0][0][:5], agents[0][1][:5])
    else:
        csr[1] = agents[1]
    with pytest.raises(DataError, match=r"m\.h5: mixes dense arrays and sparse matrices"):
        write_shards(tmp_path / "m.h5", csr, **kw)
    assert _leftovers(tmp_path) == []


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_non_finite_csr_value_is_refused(tmp_path, bad):
    agents, _ = _dataset("regression")
    X = sp.csr_matrix(agents[1][0])
    X.data[5] = bad
    row = int(np.searchsorted(X.indptr, 5, side="right") - 1)
    col = int(X.indices[5])
    parts = [(sp.csr_matrix(agents[0][0]), agents[0][1]), (X, agents[1][1])]
    with pytest.raises(DataError, match=rf"agent 1: X has a non-finite value \({bad}\) at "
                       rf"\({row}, {col}\)"):
        write_shards(tmp_path / "nan.h5", parts)
    assert _leftovers(tmp_path) == []


def test_csr_shape_and_label_validation(tmp_path):
    X = sp.random(6, 5, density=0.5, random_state=1, format="csr")
    with pytest.raises(DataError, match="agent 1: X has 4 features but the first agent has 5"):
        write_shards(tmp_path / "a.h5", [(X, np.zeros(6)), (sp.csr_matrix((2, 4)), np.zeros(2))])
    with pytest.raises(DataError, match="agent 0: X has 6 rows but y has 5"):
        write_shards(tmp_path / "a.h5", [(X, np.zeros(5))])
    with pytest.raises(DataError, match="agent 0: binary labels"):
        write_shards(tmp_path / "a.h5", [(X, np.zeros(6))], task="binary")
    with pytest.raises(DataError, match="public: X has 3 features"):
        write_shards(tmp_path / "a.h5", [(X, np.zeros(6))], public=(sp.csr_matrix((2, 3)),
                                                                   np.zeros(2)))
    assert _leftovers(tmp_path) == []


def test_corrupt_csr_group_is_reported(tmp_path):
    _, _, _, csr = _twins(tmp_path, "regression")
    csr = rewrite_shards(csr, csr.with_name("regression_csr_v1.h5"), layout="groups")
    with h5py.File(csr, "a") as f:
        ip = f["agents/1/X/indptr"][()]
        del f["agents/1/X/indptr"]
        f["agents/1/X"].create_dataset("indptr", data=ip[:-1])
    with ShardFile(csr) as sf:
        sf.check_agents([0, 2])
        with pytest.raises(ShardError, match=r"regression_csr_v1\.h5.*agent 1.*indptr has 300 "
                           "entries, expected 301"):
            sf.check_agents([1])


def test_global_test_csr(tmp_path):
    agents, public = _dataset("binary")
    Xt = sp.csr_matrix(public[0][:50])
    path = write_shards(tmp_path / "g.h5", [(sp.csr_matrix(X), y) for X, y in agents],
                        task="binary", test_global=(Xt, public[1][:50]),
                        test=[(sp.csr_matrix(agents[0][0][:9]), agents[0][1][:9]), None, None])
    with ShardFile(path) as sf:
        assert sf.has_global_test and sf.has_test(0) and not sf.has_test(1)
        X, y = sf.read_test()
        assert isinstance(X, sp.csr_matrix) and np.array_equal(X.toarray(), public[0][:50])
        assert np.array_equal(y, public[1][:50])
        Xa, ya = sf.read_agent_test(0)
        assert isinstance(Xa, sp.csr_matrix) and np.array_equal(Xa.toarray(), agents[0][0][:9])
        sf.check_agents()


# ----------------------------------------------------------------------------------------------
# the models and reference solvers on CSR


@pytest.mark.parametrize("lam", [1e-2, 1e-3])
def test_svm_dual_cd_csr_matches_dense(lam):
    agents, _ = _dataset("binary")
    X = np.vstack([a[0] for a in agents])
    y = np.concatenate([a[1] for a in agents])
    w_dense = reference.svm_dual_cd(X, y, lam)
    w_csr = reference.svm_dual_cd(sp.csr_matrix(X), y, lam, dense_max=0)  # the CSR code path
    np.testing.assert_allclose(w_csr, w_dense, rtol=0, atol=1e-10 * np.max(np.abs(w_dense)))
    # a small CSR X is densified by default: then bitwise the dense result
    assert np.array_equal(reference.svm_dual_cd(sp.csr_matrix(X), y, lam), w_dense)
    # and it is the optimum: no random perturbation lowers f
    n = X.shape[0]

    def f(Theta):
        return linear.objective(lam, linear.loss_sum("hinge", X, y, Theta), n, Theta)

    pert = w_csr + 1e-3 * stream(0, "test", 0, 0).standard_normal((200, P))
    assert np.all(f(pert) > f(w_csr)[0])


@pytest.mark.parametrize("loss", ["squared", "hinge"])
def test_theta_star_local_and_public_constants_on_csr(loss):
    agents, public = _dataset("regression" if loss == "squared" else "binary")
    X, y = agents[0]
    Xs = sp.csr_matrix(X)
    th_d = reference.theta_star_local(loss, X, y, 1e-2, 1e6)
    th_s = reference.theta_star_local(loss, Xs, y, 1e-2, 1e6)
    np.testing.assert_allclose(th_s, th_d, rtol=0, atol=1e-10 * np.max(np.abs(th_d)))
    Xp = public[0]
    assert math.isclose(linear.curvature_constant(loss, sp.csr_matrix(Xp), 1e-2),
                        linear.curvature_constant(loss, Xp, 1e-2), rel_tol=1e-12)
    nd = linear.grad_l1_norms(loss, Xp, public[1], th_d)
    np.testing.assert_allclose(linear.grad_l1_norms(loss, sp.csr_matrix(Xp), public[1], th_d), nd,
                               rtol=1e-12, atol=1e-13 * nd.max())


def test_hinge_xi_auto_is_the_same_for_csr_and_dense():
    """At the hinge optimum the free support vectors sit on the kink y x.theta = 1, where rounding
    alone decides between gradient 0 and -y x: the xi rule gives them ||x||_1, so dense and CSR
    (different rounding) get the same xi."""
    _, (Xp, yp) = _dataset("binary")
    th = reference.theta_star_local("hinge", Xp, yp, 1e-2, 1e6)
    margin = yp * (Xp @ th)
    kink = np.abs(margin - 1.0) <= 1e-8
    assert kink.sum() >= 5  # the data has free support vectors
    nd = public_grad_norms("hinge", Xp, yp, th)
    ns = public_grad_norms("hinge", sp.csr_matrix(Xp), yp, th)
    l1 = np.abs(Xp).sum(axis=1)
    np.testing.assert_allclose(nd[kink], l1[kink], rtol=1e-14)
    np.testing.assert_allclose(nd[margin < 1 - 1e-8], l1[margin < 1 - 1e-8], rtol=1e-14)
    assert np.all(nd[margin > 1 + 1e-8] == 0.0)
    np.testing.assert_allclose(ns, nd, rtol=1e-14)
    for q in (0.5, 0.9, 0.99):
        assert math.isclose(np.quantile(ns, q), np.quantile(nd, q), rel_tol=1e-14)


@pytest.mark.parametrize("rows", [5, 39, 60])
def test_newton_solve_csr_band_equals_direct_solve(rows):
    """The smoothed-Newton step on a CSR band (Woodbury when the band has fewer rows than p)."""
    Zb = _sparse_block(9, 0, rows)
    g = stream(9, "test", 0, 0).standard_normal(P)
    expected = np.linalg.solve(np.eye(P) + 3.0 * Zb.T @ Zb, g)
    np.testing.assert_allclose(reference._newton_solve(sp.csr_matrix(Zb), 3.0, g, P), expected,
                               rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(reference._newton_solve(Zb, 3.0, g, P), expected, rtol=1e-10)
    empty = sp.csr_matrix((0, P))
    np.testing.assert_array_equal(reference._newton_solve(empty, 3.0, g, P), g)


@pytest.mark.parametrize("duplicate", [False, True])
def test_polish_free_solve_on_csr(duplicate):
    """The active-set polish's a_F = (Zf Zf^T)^+ rhs on a CSR free block (QR, or the minimum-norm
    least squares when records repeat), against the pseudo-inverse."""
    Zf = _sparse_block(11, 0, 12)
    Zf[:, 30:] = 0.0  # unused columns are dropped before the dense solve
    if duplicate:
        Zf[5] = Zf[2]
    rhs = stream(11, "test", 0, 0).standard_normal(12)
    a = reference._csr_free_solve(sp.csr_matrix(Zf), rhs)
    expected = np.linalg.pinv(Zf @ Zf.T) @ rhs
    np.testing.assert_allclose(a, expected, rtol=1e-9, atol=1e-9 * np.max(np.abs(expected)))
    if duplicate:  # the minimum-norm answer splits the weight of a repeated record equally
        assert math.isclose(a[2], a[5], rel_tol=1e-9)


def test_ridge_closed_form_accepts_sparse_gram():
    agents, _ = _dataset("regression")
    X, y = agents[1]
    Xs = sp.csr_matrix(X)
    th = reference.ridge_closed_form(Xs.T @ Xs, Xs.T @ y, ROWS, 1e-2)
    expected = np.linalg.solve(2.0 / ROWS * X.T @ X + 1e-2 * np.eye(P), 2.0 / ROWS * X.T @ y)
    np.testing.assert_allclose(th, expected, rtol=1e-10)


def _oracle(shards, loss, lam=1e-2):
    n = sum(sh.n for sh in shards)
    return Oracle(Star(MPI.COMM_SELF, N_AGENTS), shards, loss, lam, n, P)


@pytest.mark.parametrize("loss, solver", [
    ("squared", "closed"), ("squared", "scipy"), ("logistic", "scipy"), ("hinge", "auto"),
    pytest.param("logistic", "petsc", marks=[pytest.mark.petsc, pytest.mark.skipif(
        not reference.petsc_available(), reason="petsc4py is not installed")]),
])
def test_oracle_reference_on_csr_shards(tmp_path, loss, solver):
    """theta*, f* and the isolated optima from CSR shards equal those from the dense twin."""
    _, _, dense, csr = _twins(tmp_path, "regression" if loss == "squared" else "binary")
    refs = {}
    for name, path in (("dense", dense), ("csr", csr)):
        with ShardFile(path) as sf:
            shards = [LocalShard(i, *sf.read_agent(i, 250)) for i in range(N_AGENTS)]
        assert sp.issparse(shards[0].X) == (name == "csr")
        refs[name] = reference_quantities(_oracle(shards, loss), 1e6, solver)
    d, c = refs["dense"], refs["csr"]
    assert c.solver == d.solver == {"auto": "dual_cd"}.get(solver, solver)
    assert math.isclose(c.f_star, d.f_star, rel_tol=1e-12)
    tol = 1e-10 if solver in ("closed", "auto") else 1e-7  # iterative: stops at its tolerance
    scale = np.max(np.abs(d.theta_star))
    np.testing.assert_allclose(c.theta_star, d.theta_star, rtol=0, atol=tol * scale)
    np.testing.assert_allclose(c.theta_isolated, d.theta_isolated, rtol=0,
                               atol=tol * np.max(np.abs(d.theta_isolated)))
    np.testing.assert_allclose(c.psi_isolated, d.psi_isolated, rtol=1e-7)
    assert np.all(d.psi_isolated > 0)


# ----------------------------------------------------------------------------------------------
# the method under mpiexec: CSR file == dense twin


def _results(path):
    out = {}
    with h5py.File(path, "r") as f:
        for c in ("000", "001"):
            g = f[f"configs/{c}"]
            for k in ("metrics/psi", "metrics/clip_fraction", "models/final",
                      "reference/theta_star", "reference/f_star", "reference/theta_isolated"):
                out[f"{c}/{k}"] = g[k][()]
            out[f"{c}/solver"] = g["reference/theta_star"].attrs["solver"]
    return out


@pytest.mark.parametrize("loss", ["squared", "hinge"])
def test_sync_star_csr_equals_dense_under_mpiexec(tmp_path, loss):
    task = "regression" if loss == "squared" else "binary"
    _, _, dense, csr = _twins(tmp_path, task)
    results = {}
    for name, data in (("dense", dense), ("csr", csr)):
        job = write_job(tmp_path / f"{loss}_{name}.toml", data, loss=loss, runs=2, T=20,
                        sweep={"eps": [1.0, math.inf]})
        cp = mpi_run(3, ["run", str(job), "--quiet"])
        assert cp.returncode == 0, cp.stderr
        results[name] = _results(job.with_suffix(".h5"))
    d, c = results["dense"], results["csr"]
    assert d["000/solver"] == c["000/solver"] == ("closed" if loss == "squared" else "dual_cd")
    for key in d:
        if key.endswith("solver"):
            continue
        if "reference" in key:
            np.testing.assert_allclose(c[key], d[key], rtol=1e-10, atol=0, err_msg=key)
        else:
            np.testing.assert_allclose(c[key], d[key], rtol=1e-10, atol=1e-14, err_msg=key)
    # the runs are real: noise (eps = 1) moves the model away from the eps = inf runs
    assert not np.allclose(d["000/models/final"], d["001/models/final"], rtol=1e-3)
    assert np.all(d["001/metrics/psi"][-1] < d["001/metrics/psi"][0])
