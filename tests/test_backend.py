"""Array backends (issue 30): the heavy kernels under array_api_strict (the standard's reference
namespace: any NumPy-only code in a kernel fails there) and CuPy (tests marked `gpu`, skipped
without a GPU) equal NumPy within 1e-10 relative, and a job with `backend` set equals the NumPy
job within 1e-10, with the same noise.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from helpers import read_datasets, write_job
from mpi4py import MPI

from mpi_dp.backend import BACKENDS, BackendError, backend, gpu_available, to_numpy
from mpi_dp.data.synth import write_synth
from mpi_dp.errors import MpiDpError
from mpi_dp.models import linear
from mpi_dp.models import multinomial as mn
from mpi_dp.p2p import objective
from mpi_dp.runner import run_job

pytest.importorskip("array_api_strict")

GPU, WHY = gpu_available()
DEVICES = ["array_api_strict", pytest.param("cupy", marks=[
    pytest.mark.gpu, pytest.mark.skipif(not GPU, reason=f"no GPU here: {WHY}")])]
RTOL = 1e-10


def rel(a: np.ndarray, b: np.ndarray) -> float:
    """Largest difference relative to the largest magnitude of the NumPy result."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    assert a.shape == b.shape
    scale = np.max(np.abs(a)) if a.size else 1.0
    return float(np.max(np.abs(a - b)) / (scale or 1.0)) if a.size else 0.0


@pytest.fixture(scope="module")
def mnist_like():
    """Records of MNIST's kind (features in [0, 1], 10 classes), sizes that make NumPy chunk."""
    rng = np.random.default_rng(30)
    n, J, K, R = 3000, 40, 10, 4
    X = rng.random((n, J))
    y = rng.integers(0, K, n)
    W = rng.normal(scale=0.3, size=(R, J, K))
    return X, y, W, K


def _on(name: str, X: np.ndarray, y: np.ndarray, K: int):
    bk = backend(name)
    return bk, bk.asarray(X), mn.device_labels(bk.xp, y, K)


@pytest.mark.parametrize("name", DEVICES)
@pytest.mark.parametrize("chunk", [None, 5000])
def test_multinomial_kernels_equal_numpy(mnist_like, name, chunk, monkeypatch):
    """Every multinomial kernel on the device equals NumPy's (one device chunk, and many: the
    chunks' running sums are exercised too); the outputs live in the device's namespace."""
    X, y, W, K = mnist_like
    if chunk is not None:
        monkeypatch.setattr(mn, "DEVICE_CHUNK_ELEMS", chunk)
    bk, Xd, yd = _on(name, X, y, K)
    l1 = np.abs(X).sum(axis=1)
    pairs = {
        "loss_sum": (mn.loss_sum(X, y, W), mn.loss_sum(Xd, yd, W)),
        "grad_sum": (mn.grad_sum(X, y, W), mn.grad_sum(Xd, yd, W)),
        "sensitivity_terms": (mn.sensitivity_terms(X, y, W), mn.sensitivity_terms(Xd, yd, W)),
        "softmax_probs": (mn.softmax_probs(X, W), mn.softmax_probs(Xd, W)),
    }
    g, t = mn.grad_sum_and_terms_max(X, y, W, l1)
    gd, td = mn.grad_sum_and_terms_max(Xd, yd, W, l1)
    pairs["grad_sum_and_terms_max[0]"], pairs["grad_sum_and_terms_max[1]"] = (g, gd), (t, td)
    for what, (host, dev) in pairs.items():
        assert type(dev).__module__.split(".")[0] == name, what  # computed on the device
        assert rel(host, to_numpy(dev)) <= RTOL, what
    wrong = to_numpy(mn.errors(Xd, yd, W))
    np.testing.assert_array_equal(wrong, mn.errors(X, y, W))
    np.testing.assert_array_equal(t, np.max(mn.sensitivity_terms(X, y, W), axis=1))


@pytest.mark.parametrize("name", DEVICES)
def test_stacked_kernels_equal_numpy(name):
    """The stacked (agents, runs) kernels: per-agent models or one shared model."""
    rng = np.random.default_rng(31)
    B, n, J, K, R = 5, 60, 12, 4, 3
    X, y = rng.random((B, n, J)), rng.integers(0, K, (B, n))
    Ws, W = rng.normal(size=(B, R, J, K)), rng.normal(size=(R, J, K))
    l1 = np.abs(X).sum(axis=2)
    bk = backend(name)
    Xd, yd = bk.asarray(X), bk.asarray(y.astype(np.int64))
    for models in (Ws, W):
        g, t = mn.stack_grad_sum(X, y, models, l1, True)
        gd, td = mn.stack_grad_sum(Xd, yd, models, l1, True)
        assert rel(g, to_numpy(gd)) <= RTOL and rel(t, to_numpy(td)) <= RTOL
        g0, none = mn.stack_grad_sum(Xd, yd, models)
        assert none is None and rel(g, to_numpy(g0)) <= RTOL
    assert rel(mn.stack_loss_sum(X, y, W), to_numpy(mn.stack_loss_sum(Xd, yd, W))) <= RTOL
    np.testing.assert_array_equal(mn.stack_errors(X, y, Ws), to_numpy(mn.stack_errors(Xd, yd, Ws)))


@pytest.mark.parametrize("name", DEVICES)
@pytest.mark.parametrize("loss", linear.LOSSES)
@pytest.mark.parametrize("chunk", [None, 700])
def test_linear_kernels_equal_numpy(name, loss, chunk, monkeypatch):
    """The star methods' passes: clipped gradient sums and counts (xi finite and inf, every
    run at one model or not), unclipped sums and loss sums, alone and stacked, on the device
    equal NumPy's (the squared loss's SquaredStats shortcuts against the device's direct pass)."""
    if chunk is not None:
        monkeypatch.setattr(linear, "DEVICE_CHUNK_ELEMS", chunk)
    rng = np.random.default_rng(32)
    n, p, R = 2500, 6, 3
    X = rng.normal(size=(n, p))
    y = rng.normal(size=n) if loss == "squared" else np.sign(rng.normal(size=n))
    T = rng.normal(scale=0.5, size=(R, p))
    bk = backend(name)
    Xd, yd = bk.asarray(X), bk.asarray(y)
    stats = linear.squared_stats(X, y) if loss == "squared" else None
    for models in (T, np.repeat(T[:1], R, axis=0)):
        for xi in (0.4, math.inf):
            g, c = linear.clipped_grad_sum(loss, X, y, models, xi, stats)
            gd, cd = linear.clipped_grad_sum(loss, Xd, yd, models, xi)
            assert rel(g, to_numpy(gd)) <= RTOL, (xi, models is T)
            np.testing.assert_array_equal(c, to_numpy(cd))
            assert xi == math.inf or c.min() > 0  # the clip is exercised
    assert rel(linear.grad_sum(loss, X, y, T), to_numpy(linear.grad_sum(loss, Xd, yd, T))) <= RTOL
    assert rel(linear.loss_sum(loss, X, y, T), to_numpy(linear.loss_sum(loss, Xd, yd, T))) <= RTOL
    G = 4
    Xs, ys = rng.normal(size=(G, 50, p)), np.sign(rng.normal(size=(G, 50)))
    l1 = np.abs(Xs).sum(axis=2)
    g, c = linear.clipped_grad_sum_stack(loss, Xs, ys, T, 0.4, l1)
    gd, cd = linear.clipped_grad_sum_stack(loss, bk.asarray(Xs), bk.asarray(ys), T, 0.4, l1)
    assert rel(g, to_numpy(gd)) <= RTOL
    np.testing.assert_array_equal(c, to_numpy(cd))
    assert rel(linear.loss_sum_stack(loss, Xs, ys, T),
               to_numpy(linear.loss_sum_stack(loss, bk.asarray(Xs), bk.asarray(ys), T))) <= RTOL


@pytest.mark.parametrize("name", DEVICES)
@pytest.mark.parametrize("loss", ["logistic", "quadratic"])
def test_p2p_local_gradient_equals_numpy(name, loss):
    """A peer's clipped local gradient and clipped share on the device equal NumPy's."""
    rng = np.random.default_rng(33)
    m, p, R = 80, 5, 3
    X = rng.normal(size=(m, p))
    y = np.sign(rng.normal(size=m)) if loss == "logistic" else rng.normal(size=m)
    th = rng.normal(size=(R, p))
    xn = np.abs(X).sum(axis=1)
    bk = backend(name)
    for clip in (0.5, math.inf):
        g, f = objective.local_grad(loss, X, y, 0.1, th, clip, xn)
        gd, fd = objective.local_grad(loss, bk.asarray(X), bk.asarray(y), 0.1, th, clip,
                                      bk.asarray(xn))
        assert isinstance(gd, np.ndarray) and rel(g, gd) <= RTOL
        np.testing.assert_array_equal(f, fd)
        assert clip == math.inf or f.min() > 0


@pytest.mark.parametrize("name", DEVICES)
def test_dola_round_products_equal_numpy(name):
    """DOLA's round products on the device: <V, x> (k, R, h) and sum_s C x (k, R, n), from the
    stream's device chunk, equal NumPy's (the mix is checked in the jobs below)."""
    from mpi_dp.algorithms import dola

    rng = np.random.default_rng(34)
    k, h, n, R = 5, 3, 7, 2
    X, y = rng.normal(size=(k, h, n)), np.sign(rng.normal(size=(k, h)))
    V, C = rng.normal(size=(k, R, n)), rng.normal(size=(k, R, h))
    bk = backend(name)
    host, dev = dola.Batch(X, y, k, h), dola.Batch(X, y, k, h, (bk, bk.asarray(X)))
    for got, want in ((dev.dots(V), host.dots(V)), (dev.combine(C, n), host.combine(C, n))):
        assert isinstance(got, np.ndarray) and rel(want, got) <= RTOL


def test_host_records_stay_on_the_host():
    """A CSR peer (scipy.sparse) takes the host kernel, not the device one: the same numbers as
    its dense records."""
    import scipy.sparse as sp

    rng = np.random.default_rng(35)
    X = rng.normal(size=(40, 6)) * (rng.random((40, 6)) < 0.4)
    y, th = np.sign(rng.normal(size=40)), rng.normal(size=(2, 6))
    xn = np.abs(X).sum(axis=1)
    g, f = objective.local_grad("logistic", X, y, 0.1, th, 0.5, xn)
    gs, fs = objective.local_grad("logistic", sp.csr_matrix(X), y, 0.1, th, 0.5, xn)
    assert rel(g, gs) <= 1e-14 and np.array_equal(f, fs)
    assert linear.on_host(sp.csr_matrix(X)) and mn.on_host(X)
    assert not linear.on_host(backend("array_api_strict").asarray(X))


def test_strict_rejects_numpy_only_code():
    """The stand-in is strict: NumPy's fancy flat assignment, which the NumPy kernels use, fails
    there, so a kernel that fell back on NumPy-only code could not pass the tests above."""
    xp = backend("array_api_strict").xp
    a = xp.zeros((2, 3))
    with pytest.raises((IndexError, TypeError)):
        a[:, xp.asarray([0, 2])] = 1.0


def test_device_kernels_check_models_and_labels():
    X = backend("array_api_strict").asarray(np.ones((4, 3)))
    with pytest.raises(Exception, match="NaN or inf"):
        mn.grad_sum(X, backend("array_api_strict").asarray(np.zeros(4, dtype=np.int64)),
                    np.full((1, 3, 2), np.nan))
    with pytest.raises(ValueError, match=r"lie in 0\.\.1"):
        mn.device_labels(backend("array_api_strict").xp, np.array([0, 2]), 2)


def test_unknown_and_missing_backends_are_clear():
    with pytest.raises(BackendError, match="unknown backend"):
        backend("torch")
    assert BACKENDS == ("numpy", "cupy", "array_api_strict")
    if not GPU:
        with pytest.raises(BackendError, match="cupy"):
            backend("cupy")


# -- jobs ----------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def mc_shard(tmp_path_factory):
    """Multiclass shard of 4 agents (3 classes, 6 features)."""
    d = tmp_path_factory.mktemp("mc")
    return write_synth(d / "mc.h5", "multiclass", 4, 300, 6, 0.35, 5, public=300, classes=3)


def _admm_job(tmp_path, data, name: str, be: str | None, **kw):
    keys = dict(algorithm="admm", runs=2, T=15, record_every=5,
                sweep={"variant": ["objt", "outp"], "eps": [1.0, math.inf]})
    if be is not None:
        keys["backend"] = be
    keys.update(kw)
    return write_job(tmp_path / f"{name}.toml", data, **keys)


@pytest.mark.parametrize("layout", ["stacked", "alone"])
@pytest.mark.parametrize("name", DEVICES)
def test_admm_job_on_a_backend_equals_numpy(tmp_path, mc_shard, name, layout, monkeypatch):
    """The whole job (ObjT and OutP, private and not, 2 runs): every dataset within 1e-10 of the
    NumPy job's, integers and the ledgers equal, and the backend recorded; with the agents'
    records stacked (small agents) or each agent alone (large agents' path)."""
    import h5py

    from mpi_dp.algorithms import admm

    if layout == "alone":
        monkeypatch.setattr(admm, "STACK_MAX_ELEMS", 0)
    a = run_job(_admm_job(tmp_path, mc_shard, "np", None), comm=MPI.COMM_SELF, progress=False)
    passes, device_pass = [], mn.device_pass

    def spy(X, *args, **kw):
        passes.append(type(X).__module__.split(".")[0])
        return device_pass(X, *args, **kw)

    monkeypatch.setattr(mn, "device_pass", spy)
    b = run_job(_admm_job(tmp_path, mc_shard, "dev", name), comm=MPI.COMM_SELF, progress=False)
    assert len(passes) >= 4 * 15 and set(passes) == {name}  # every gradient pass on the device
    assert _compare(a, b) > 20
    with h5py.File(b) as f:
        assert f["configs/000"].attrs["backend"] == name
    with h5py.File(a) as f:
        assert f["configs/000"].attrs["backend"] == "numpy"


def _compare(a, b) -> int:
    """Every float dataset of result b within RTOL of a's (same non-finite entries), integers
    equal; returns how many float datasets were compared."""
    da, db = read_datasets(a), read_datasets(b)
    assert set(da) == set(db)
    compared = 0
    for k, v in da.items():
        if k.startswith(("provenance", "job")) or "time" in k.rsplit("/", 1)[-1]:
            continue
        if isinstance(v, np.ndarray) and v.dtype.kind == "f":
            finite = np.isfinite(v)
            np.testing.assert_array_equal(finite, np.isfinite(db[k]), err_msg=k)
            assert rel(v[finite], db[k][finite]) <= RTOL, k
            compared += 1
        elif isinstance(v, np.ndarray) and v.dtype.kind in "iub":
            np.testing.assert_array_equal(v, db[k], err_msg=k)
    return compared


@pytest.mark.parametrize("name", DEVICES)
@pytest.mark.parametrize("method", ["sync_star", "async_star", "admm", "dola", "p2p"])
def test_a_short_job_of_every_method_on_a_backend_equals_numpy(tmp_path, method_shards,
                                                               method, name, monkeypatch):
    """One short job of each method (private and not): within 1e-10 of the NumPy job, and its
    kernels ran on the device (a device array reached them)."""
    from conftest import METHOD_JOBS

    from mpi_dp.algorithms import dola

    data, keys = METHOD_JOBS[method]

    def job(label: str, be: str):
        return write_job(tmp_path / f"{label}.toml", method_shards[data], algorithm=method,
                         backend=be, sweep={"eps": [1.0, math.inf]}, **keys)

    a = run_job(job("np", "numpy"), comm=MPI.COMM_SELF, progress=False)
    seen: list[str] = []

    def spy(module, attr):
        real = getattr(module, attr)

        def wrapped(*args, **kw):
            seen.append(attr)
            return real(*args, **kw)
        monkeypatch.setattr(module, attr, wrapped)

    spy(linear, "device_pass")
    spy(mn, "device_pass")
    spy(objective, "device_local_grad")
    spy(dola.Block, "_mix_on_device")
    b = run_job(job("dev", name), comm=MPI.COMM_SELF, progress=False)
    assert seen, "no kernel ran on the device"
    assert _compare(a, b) >= 10


def test_backend_is_a_key_with_clear_errors(tmp_path, mc_shard, method_shards):
    """An unknown value names the choices; a backend this machine lacks, or a device too small
    for a rank's records (a device with 1 kB free, patched in), stops the job before its output
    exists."""
    bad = _admm_job(tmp_path, mc_shard, "bad", "jax")
    with pytest.raises(MpiDpError, match="backend"):
        run_job(bad, comm=MPI.COMM_SELF, progress=False)
    from mpi_dp.backend import Backend

    with pytest.MonkeyPatch.context() as mp:  # a device with 1 kB free: the records do not fit
        mp.setattr(Backend, "free_bytes", lambda self: 1000.0)
        for method, data in (("admm", mc_shard), ("sync_star", method_shards["regression"]),
                             ("async_star", method_shards["regression"])):
            extra = {"variant": "proof"} if method == "async_star" else {}
            small = write_job(tmp_path / f"small_{method}.toml", data, algorithm=method,
                              backend="array_api_strict", T=5, **extra)
            with pytest.raises(MpiDpError, match=r"records alone take .* GiB on the device"):
                run_job(small, comm=MPI.COMM_SELF, progress=False)
            assert not list(tmp_path.glob(f"small_{method}.h5*"))
    if not GPU:
        job = _admm_job(tmp_path, mc_shard, "gpu", "cupy")
        with pytest.raises(MpiDpError, match="key 'backend'"):
            run_job(job, comm=MPI.COMM_SELF, progress=False)
        assert not list(tmp_path.glob("gpu.h5*"))
