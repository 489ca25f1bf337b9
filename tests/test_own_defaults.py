"""Defaults that learn on a user's binary shard without public records (issue: your own data).

The shard has no public records, only a public bound on every record's L2 norm (what `data
prepare --row-norm l2` records as /public/row_norm_max); its step sizes and clipping come from
that bound. At eps = inf each method must end near the non-private optimum the run itself
reports, admm must take the binary shard as two classes, and the noise-to-signal ratio printed
before the run must be the formula of privacy.noise_signal.
"""

from __future__ import annotations

import math

import h5py
import numpy as np
import pytest

from mpi_dp.data.shards import write_shards
from mpi_dp.models import multinomial
from tests.helpers import mpi_run, write_job

P = 5


def _records(rng: np.random.Generator, n: int, w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    X = rng.normal(size=(n, P)) / math.sqrt(P)
    X /= np.maximum(1.0, np.linalg.norm(X, axis=1))[:, None]
    y = np.where(X @ w + 0.3 * rng.normal(size=n) > 0, 1.0, -1.0)
    return X, y


@pytest.fixture(scope="module")
def binary_shard(tmp_path_factory) -> tuple:
    """4 owners of unequal size, a global test set, rows of norm <= 1 and their public bound."""
    rng = np.random.default_rng(5)
    w = np.array([3.0, -2.0, 1.0, 0.5, 0.0]) * math.sqrt(P)
    agents = [_records(rng, n, w) for n in (150, 400, 250, 600)]
    test = _records(rng, 2000, w)
    path = tmp_path_factory.mktemp("own") / "binary.h5"
    write_shards(path, agents, task="binary", test_global=test,
                 public_extra={"row_norm_max": np.array([1.0])})
    nobound = path.with_name("nobound.h5")
    write_shards(nobound, agents, task="binary", test_global=test)
    return path, nobound, agents, test


def _ok(cp) -> None:
    assert cp.returncode == 0, cp.stderr[-3000:]


def test_admm_takes_a_binary_shard_and_reaches_its_reported_optimum(binary_shard, tmp_path):
    path, _, agents, test = binary_shard
    job = write_job(tmp_path / "admm.toml", path, algorithm="admm", eps=math.inf, T=300, runs=1,
                    record_every=50)
    outs = []
    for n in (1, 3):
        out = tmp_path / f"admm{n}.h5"
        _ok(mpi_run(n, ["run", str(job), "--out", str(out), "--quiet"]))
        outs.append(out)
    X = np.vstack([a[0] for a in agents])
    y = (np.concatenate([a[1] for a in agents]) > 0).astype(np.int64)
    w_ref = multinomial.centralised_optimum(X, y, 2, 1e-6, tol=1e-10)
    yt = (test[1] > 0).astype(np.int64)
    with h5py.File(outs[0]) as f, h5py.File(outs[1]) as g:
        w_star = f["reference/w_star"][()]
        # the same bits on 1 and 3 ranks (agent-order sums, lockstep L-BFGS)
        assert np.array_equal(w_star, g["reference/w_star"][()])
        # the reported optimum is the centralised one, computed here independently
        assert np.allclose(w_star, w_ref, atol=1e-5 * max(1.0, np.abs(w_ref).max()))
        star_err = float(f["reference/test_error_star"][()])
        assert star_err == pytest.approx(multinomial.errors(test[0], yt, w_ref)[0] / len(yt),
                                         abs=1e-3)
        final = float(f["metrics/test_error"][-1].mean())
        assert final <= star_err + 0.02, (final, star_err)
        assert final < float(f["reference/test_error_majority"][()]) - 0.1
        # rho = 'auto' from the public bound: B^2 max n_p / (2 I)
        assert f.attrs["rho_rule"].startswith("auto")
        assert f.attrs["rho_static"] == pytest.approx(600 / (2 * 1400))
        assert f.attrs["K"] == 2 and "binary shard" in f.attrs["classes"]
        assert f.attrs["sens_mode"] == "bound" and f.attrs["row_bound"] == 1.0


def test_admm_bound_sensitivity_covers_every_record_term():
    """sens_mode 'bound' = 4 sqrt(J) B / I: twice (replace-one) the largest per-record term
    ||x||_1 ||h - y||_1 <= sqrt(J) B 2 over records of norm <= B, at any model."""
    from mpi_dp.algorithms import admm_steps

    rng = np.random.default_rng(3)
    J, K, B, n = 7, 3, 0.5, 4000
    X = rng.normal(size=(n, J)) * rng.uniform(0.1, 3, size=(n, 1))
    X *= B / np.maximum(B, np.linalg.norm(X, axis=1))[:, None]
    X[0] = B / math.sqrt(J)  # the worst case of ||x||_1 at norm B
    y = rng.integers(0, K, size=n)
    W = rng.normal(scale=30.0, size=(J, K))  # confident, wrong predictions: ||h - y||_1 near 2
    terms = multinomial.sensitivity_terms(X, y, W)
    sens = admm_steps.sensitivity(None, n, "bound", J, B)
    assert sens == pytest.approx(4 * math.sqrt(J) * B / n)
    assert 2 * terms.max() / n <= sens
    assert 2 * terms.max() / n > 0.9 * sens  # and it is nearly attained: no slack to spare


@pytest.mark.parametrize("algorithm,T", [("sync_star", 200), ("async_star", 2000)])
def test_star_methods_learn_from_the_public_row_bound(binary_shard, tmp_path, algorithm, T):
    path, _, _, _ = binary_shard
    job = write_job(tmp_path / f"{algorithm}.toml", path, algorithm=algorithm, eps=math.inf, T=T,
                    runs=1, loss="logistic", lam=1e-5, record_every=T,
                    variant="alg2" if algorithm == "sync_star" else "proof")
    out = tmp_path / f"{algorithm}.h5"
    _ok(mpi_run(2, ["run", str(job), "--out", str(out), "--quiet"]))
    with h5py.File(out) as f:
        assert f.attrs["xi"] == pytest.approx(math.sqrt(P))
        assert f.attrs["constants_from"].startswith("the shard's public row-norm bound")
        final = float(f["metrics/test_error"][-1].mean())
        star = float(f["reference/test_error_star"][()])
        assert final <= star + 0.02, (final, star)


def test_star_methods_without_public_records_or_bound_say_what_to_do(binary_shard, tmp_path):
    _, nobound, _, _ = binary_shard
    job = write_job(tmp_path / "s.toml", nobound, loss="logistic", eps=1.0)
    cp = mpi_run(1, ["run", str(job), "--out", str(tmp_path / "s.h5"), "--quiet"])
    assert cp.returncode != 0
    assert "row_norm_max" in cp.stderr and "--public M" in cp.stderr
    assert not (tmp_path / "s.h5").exists()


def test_noise_to_signal_is_printed_recorded_and_warns(binary_shard, tmp_path):
    path, _, agents, _ = binary_shard
    n = np.array([len(a[1]) for a in agents], dtype=float)
    for eps, warns in ((10.0, False), (0.001, True)):
        job = write_job(tmp_path / f"n{eps}.toml", path, loss="logistic", eps=eps, T=30, runs=1)
        out = tmp_path / f"n{eps}.h5"
        cp = mpi_run(2, ["run", str(job), "--out", str(out)])
        _ok(cp)
        assert "noise-to-signal of one release" in cp.stderr
        assert ("WARNING: the noise exceeds the signal for every owner" in cp.stderr) == warns
        with h5py.File(out) as f:
            nm = f["privacy/ledger"]["noise_multiplier"]
            ratio = f["noise_to_signal"][()]
            assert np.allclose(ratio, 2.0 * nm * math.sqrt(2 * P) / n, rtol=1e-12)
            assert np.allclose(f["noise_to_signal_run"][()], ratio / math.sqrt(30), rtol=1e-12)
