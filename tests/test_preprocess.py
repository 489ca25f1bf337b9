"""Preprocessing: fitted statistics from the hold-out only, exact PCA whitening, dense == CSR."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

from mpi_dp import rng
from mpi_dp.data.partition import holdout_last
from mpi_dp.data.preprocess import (
    add_bias,
    apply_pca,
    apply_standardise,
    fit_pca,
    fit_standardise,
    log1p_columns,
    max_normalise,
    row_normalise,
    scale_columns,
)
from mpi_dp.errors import DataError


def _data(n: int = 300, p: int = 6, seed: int = 1) -> np.ndarray:
    """Correlated features on very different scales, like integer-coded loan data."""
    g = rng.stream(seed, "test")
    A = g.standard_normal((p, p))
    return g.standard_normal((n, p)) @ A * np.logspace(0, 3, p) + np.arange(p)


def _sparse(n: int = 200, p: int = 8, seed: int = 2) -> np.ndarray:
    g = rng.stream(seed, "test")
    X = g.standard_normal((n, p)) * 3
    X[g.random((n, p)) < 0.7] = 0.0
    return X


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and a.tobytes() == b.tobytes()


# --------------------------------------------------------------------------- standardise


def test_standardise_fitted_rows_have_mean0_std1_and_params_ignore_other_rows():
    X = _data()
    X[:, 2] = 7.25  # constant column: scale 1, centred to 0
    rows = np.arange(100, 250)
    params = fit_standardise(X, rows)
    Z = apply_standardise(X, params)
    np.testing.assert_allclose(Z[rows].mean(axis=0), 0.0, atol=1e-12)
    np.testing.assert_allclose(Z[rows][:, [0, 1, 3, 4, 5]].std(axis=0), 1.0, rtol=1e-12)
    assert params["scale"][2] == 1.0 and np.all(Z[:, 2] == 0.0)
    # the other rows are not standardised (their statistics differ)
    assert abs(Z[:100].mean(axis=0)).max() > 1e-3

    # independent check of the values
    np.testing.assert_allclose(params["mean"], X[rows].mean(axis=0), rtol=1e-14)
    np.testing.assert_allclose(params["scale"][[0, 1]], X[rows][:, [0, 1]].std(axis=0), rtol=1e-14)

    # change every record outside `rows`: bitwise the same parameters
    Y = X.copy()
    Y[:100] = 1e6
    Y[250:] = -3.0
    again = fit_standardise(Y, rows)
    assert _same(again["mean"], params["mean"]) and _same(again["scale"], params["scale"])
    # a boolean mask selects the same rows
    mask = np.zeros(len(X), bool)
    mask[rows] = True
    assert _same(fit_standardise(X, mask)["mean"], params["mean"])
    # all rows when rows is None
    np.testing.assert_allclose(fit_standardise(X)["mean"], X.mean(axis=0), rtol=1e-14)


def test_standardise_sparse_fit_matches_dense_and_apply_refuses_sparse():
    X = _sparse()
    d = fit_standardise(X, np.arange(50))
    s = fit_standardise(sp.csr_matrix(X), np.arange(50))
    np.testing.assert_allclose(s["mean"], d["mean"], rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(s["scale"], d["scale"], rtol=1e-10)
    with pytest.raises(DataError, match="densify"):
        apply_standardise(sp.csr_matrix(X), d)
    with pytest.raises(DataError, match="0 of"):
        fit_standardise(X, np.array([], dtype=np.int64))
    with pytest.raises(DataError, match="outside"):
        fit_standardise(X, np.array([0, 200]))


# --------------------------------------------------------------------------- scaling


def test_max_normalise_dense_and_csr():
    X = _sparse()
    X[:, 5] = 0.0
    rows = np.arange(0, 120)
    Y, div = max_normalise(X, rows)
    expect = np.abs(X[rows]).max(axis=0)
    assert div[5] == 1.0 and np.all(Y[:, 5] == 0.0)
    np.testing.assert_array_equal(div[expect > 0], expect[expect > 0])
    assert np.abs(Y[rows]).max() == 1.0
    np.testing.assert_array_equal(Y, X / div)
    Ys, divs = max_normalise(sp.csr_matrix(X), rows)
    assert sp.issparse(Ys) and Ys.format == "csr" and Ys.nnz == sp.csr_matrix(X).nnz
    np.testing.assert_array_equal(divs, div)
    np.testing.assert_array_equal(Ys.toarray(), Y)
    np.testing.assert_array_equal(scale_columns(X, div), Y)
    assert X[0].any()  # input not modified
    np.testing.assert_array_equal(max_normalise(X)[1][:5], np.abs(X).max(axis=0)[:5])


@pytest.mark.parametrize("norm, order", [("l2", 2), ("l1", 1)])
def test_row_normalise(norm, order):
    X = _sparse(seed=5)
    X[:10] *= 1e-3  # rows already inside the unit ball
    X[10] = 0.0
    Y = row_normalise(X, norm)
    norms_before = np.linalg.norm(X, ord=order, axis=1)
    norms = np.linalg.norm(Y, ord=order, axis=1)
    assert norms.max() <= 1 + 1e-12
    inside = norms_before <= 1
    assert inside[:11].all() and (~inside).sum() > 50
    np.testing.assert_array_equal(Y[inside], X[inside])  # unchanged, bitwise
    np.testing.assert_allclose(norms[~inside], 1.0, rtol=1e-12)
    # direction preserved
    np.testing.assert_allclose(Y[~inside] * norms_before[~inside, None], X[~inside], rtol=1e-12)
    Ys = row_normalise(sp.csr_matrix(X), norm)
    assert Ys.format == "csr"
    np.testing.assert_allclose(Ys.toarray(), Y, rtol=1e-14, atol=0)
    with pytest.raises(DataError, match="'l1' or 'l2'"):
        row_normalise(X, "max")


def test_log1p_columns_and_bias():
    X = np.array([[-3.0, 100.0, 0.0], [0.0, -1e6, 2.0]])
    Y = log1p_columns(X, [1, 2])
    np.testing.assert_array_equal(Y[:, 0], X[:, 0])
    np.testing.assert_allclose(Y[:, 1], [np.log(101.0), -np.log(1e6 + 1)], rtol=1e-15)
    np.testing.assert_allclose(Y[:, 2], [0.0, np.log(3.0)], rtol=1e-15)
    assert X[0, 1] == 100.0  # input untouched
    Ys = log1p_columns(sp.csr_matrix(X), [1, 2])
    assert Ys.format == "csr" and Ys.nnz == 4
    np.testing.assert_array_equal(Ys.toarray(), Y)
    with pytest.raises(DataError, match="outside"):
        log1p_columns(X, [3])

    B = add_bias(X)
    assert B.shape == (2, 4) and np.all(B[:, 3] == 1.0) and _same(B[:, :3].copy(), X)
    Bs = add_bias(sp.csr_matrix(X))
    assert Bs.format == "csr" and Bs.nnz == 6
    np.testing.assert_array_equal(Bs.toarray(), B)


# --------------------------------------------------------------------------- PCA


def test_pca_uncentred_matches_eigvalsh_and_whitens_holdout():
    X = _data(n=400, p=7)
    rest, public = holdout_last(len(X), 120)
    k = 4
    params = fit_pca(X[public], k)
    V, D = params["V"], params["D"]
    assert V.shape == (7, k) and D.shape == (k,) and params["centred"] is False
    np.testing.assert_allclose(V.T @ V, np.eye(k), atol=1e-12)
    G = X[public].T @ X[public]
    ref = np.linalg.eigvalsh(G)[::-1][:k]
    np.testing.assert_allclose(D, ref, rtol=1e-10)
    assert np.all(np.diff(D) < 0)
    np.testing.assert_allclose(G @ V, V * D, rtol=1e-8, atol=1e-8 * D[0])  # eigenvectors
    # sign convention: the largest-|.| entry of each eigenvector is positive
    assert np.all(V[np.argmax(np.abs(V), axis=0), np.arange(k)] > 0)

    Z = apply_pca(X[public], params)
    np.testing.assert_allclose(Z.T @ Z, np.eye(k), atol=1e-8)
    np.testing.assert_allclose(apply_pca(X, params, whiten=False), X @ V, rtol=1e-14)
    np.testing.assert_allclose(apply_pca(X, params), X @ V / np.sqrt(D), rtol=1e-14)
    assert fit_pca(X[public], None)["V"].shape == (7, 7)


def test_pca_basis_depends_only_on_holdout_bitwise():
    X = _data(n=300, p=5)
    rest, public = holdout_last(len(X), 80)
    base = fit_pca(X[public], 5)
    for i in (0, 17, int(rest[-1])):
        Y = X.copy()
        Y[i] = 1e9 * (i + 1)
        again = fit_pca(Y[public], 5)
        assert _same(again["V"], base["V"]) and _same(again["D"], base["D"])
    Y = X.copy()
    Y[public[3]] += 1.0  # a hold-out record does change it
    assert not _same(fit_pca(Y[public], 5)["V"], base["V"])


def test_pca_sign_convention_is_deterministic_under_row_order_and_flips():
    X = _data(n=200, p=6, seed=9)
    a = fit_pca(X, 6)
    perm = rng.stream(3, "test").permutation(len(X))
    b = fit_pca(X[perm], 6)  # LAPACK may return other signs; the convention fixes them
    np.testing.assert_allclose(b["V"], a["V"], atol=1e-9)
    c = fit_pca(-X, 6)  # same second-moment matrix
    np.testing.assert_allclose(c["V"], a["V"], atol=1e-9)


def test_pca_csr_input_matches_dense():
    X = _sparse(n=300, p=6, seed=4)
    public = np.arange(200, 300)
    d = fit_pca(X[public], 6)
    s = fit_pca(sp.csr_matrix(X)[public], 6)
    np.testing.assert_allclose(s["D"], d["D"], rtol=1e-10)
    np.testing.assert_allclose(s["V"], d["V"], atol=1e-9)
    Zs = apply_pca(sp.csr_matrix(X), d)
    assert isinstance(Zs, np.ndarray) and Zs.shape == (300, 6)
    np.testing.assert_allclose(Zs, apply_pca(X, d), rtol=1e-12, atol=1e-14)


def test_pca_centred_whitens_centred_holdout():
    X = _data(n=250, p=5, seed=6) + 50.0
    params = fit_pca(X, 3, centred=True)
    mu = X.mean(axis=0)
    np.testing.assert_allclose(params["mean"], mu, rtol=1e-14)
    Xc = X - mu
    np.testing.assert_allclose(params["D"], np.linalg.eigvalsh(Xc.T @ Xc)[::-1][:3], rtol=1e-10)
    Z = apply_pca(X, params)
    np.testing.assert_allclose(Z.mean(axis=0), 0.0, atol=1e-10)
    np.testing.assert_allclose(Z.T @ Z, np.eye(3), atol=1e-8)
    Zs = apply_pca(sp.csr_matrix(X), params)
    np.testing.assert_allclose(Zs, Z, atol=1e-9)
    s = fit_pca(sp.csr_matrix(X), 3, centred=True)
    np.testing.assert_allclose(s["D"], params["D"], rtol=1e-8)
    # the uncentred fit sees the mean: different eigenvalues
    assert not np.allclose(fit_pca(X, 3)["D"], params["D"], rtol=1e-3)


def test_pca_errors_rank_deficient_and_bad_k():
    X = _data(n=100, p=5)
    X[:, 4] = X[:, 0] - 2 * X[:, 1]  # one linear dependency: rank 4
    X[:, 3] = 0.0  # and a zero column: rank 3
    assert fit_pca(X, 3)["D"].shape == (3,)
    with pytest.raises(DataError, match=r"2 of the 5 kept eigenvalues .* are zero \(rank 3 of 5"):
        fit_pca(X, 5)
    with pytest.raises(DataError, match=r"1 of the 4 kept eigenvalues"):
        fit_pca(sp.csr_matrix(X), 4)
    with pytest.raises(DataError, match="k = 6 components for p = 5"):
        fit_pca(X, 6)
    with pytest.raises(DataError, match="k = 0"):
        fit_pca(X, 0)
    few = _data(n=3, p=5)  # fewer hold-out records than features
    with pytest.raises(DataError, match="rank 3 of 5"):
        fit_pca(few, None)
    X[0, 0] = np.nan
    with pytest.raises(DataError, match="NaN"):
        fit_pca(X, 2)
    with pytest.raises(DataError, match="has shape"):
        apply_pca(np.ones((3, 4)), fit_pca(_data(p=5), 2))
