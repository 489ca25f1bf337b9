"""Issue 14, "utility the user can read": test and training error of the star methods and admm
beside the trivial baselines, flagged by `mpi-dp analyze` when a model is no better.

Every number is checked against an independent NumPy computation on the same records; the
evaluation never changes a model (evaluation on / off: bitwise the same models) and is bitwise
the same on 1, 2 and 4 ranks.
"""

from __future__ import annotations

import math
import subprocess
import sys

import h5py
import numpy as np
import pytest
from helpers import admm_paper_contract, assert_rank_invariant, mpi_run, write_job
from mpi4py import MPI

from mpi_dp.algorithms import admm, async_star, sync_star
from mpi_dp.algorithms.common import (
    EvalSet,
    LocalShard,
    Oracle,
    baselines,
    error_counts,
    reference_quantities,
)
from mpi_dp.analysis import open_result, summarize
from mpi_dp.analysis.admm_figures import admm_table
from mpi_dp.comm.p2p_star import P2PStar
from mpi_dp.comm.star import Star
from mpi_dp.data.shards import ShardFile, write_shards
from mpi_dp.data.synth import synth_multiclass, write_synth
from mpi_dp.privacy import rules
from mpi_dp.privacy.contract import Contract
from mpi_dp.privacy.tap import Tap, tapping
from mpi_dp.runner import run_job

SIZES = (300, 250, 350)
P = 4
N_TEST = 900


def _draw(g: np.random.Generator, theta: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """x ~ N(0, I) plus a bias column; y = sign(x theta - 0.6 + noise): about 70 % are -1, so
    the majority label (-1) and theta = 0 (always +1) are different baselines."""
    X = np.hstack([g.standard_normal((n, P)), np.ones((n, 1))])
    y = np.where(X[:, :P] @ theta - 0.6 + 0.3 * g.standard_normal(n) >= 0, 1.0, -1.0)
    return X, y


def binary_shard(path, test: str) -> str:
    """3 owners of a known linear rule, public records, and a test set: 'global' (/test), 'owner'
    (each owner's own split) or 'none'."""
    g = np.random.default_rng(0)
    theta = g.standard_normal(P)
    agents = [_draw(g, theta, n) for n in SIZES]
    kw: dict = {}
    if test == "global":
        kw["test_global"] = _draw(g, theta, N_TEST)
    elif test == "owner":
        kw["test"] = [_draw(g, theta, N_TEST // 3) for _ in SIZES]
    return str(write_shards(path, agents, public=_draw(g, theta, 1000), task="binary", **kw))


@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> dict[str, str]:
    d = tmp_path_factory.mktemp("utility")
    return {t: binary_shard(d / f"{t}.h5", t) for t in ("global", "owner", "none")}


def _records(path: str) -> tuple[tuple, tuple | None]:
    """(training X, y of every owner, concatenated; the evaluation set or None), read directly."""
    with ShardFile(path) as f:
        owners = range(f.n_agents)
        train = f.read_agents(owners)
        if f.has_global_test:
            test = f.read_test()
        elif f.has_test(0):
            test = tuple(np.concatenate(a) for a in zip(*f.read_agents_test(owners), strict=True))
        else:
            test = None
    X, y = (np.concatenate(a) for a in zip(*train, strict=True))
    return (X, y), test


def _error(X: np.ndarray, y: np.ndarray, thetas: np.ndarray) -> np.ndarray:
    """Independent error rate per model: sign(x . theta), sign(0) = +1."""
    return np.mean(np.where(X @ np.atleast_2d(thetas).T >= 0, 1.0, -1.0) != y[:, None], axis=0)


def _group(path) -> dict:
    with h5py.File(path, "r") as f:
        g = f["configs/000"] if "configs" in f else f
        out = {"models/final": g["models/final"][()]}
        out.update({f"metrics/{k}": g["metrics"][k][()] for k in g["metrics"]})
        out.update({f"reference/{k}": g["reference"][k][()] for k in g["reference"]})
        out["attrs"] = dict(g.attrs)
    return out


# -- (1) the recorded numbers equal an independent computation -----------------------------------
@pytest.mark.parametrize("algorithm, test, loss", [
    ("sync_star", "global", "logistic"), ("async_star", "owner", "logistic"),
    ("sync_star", "none", "hinge"), ("async_star", "global", "hinge")])
def test_recorded_errors_and_baselines_match_numpy(tmp_path, shards, algorithm, test, loss):
    extra = {"variant": "proof"} if algorithm == "async_star" else {}
    job = write_job(tmp_path / "u.toml", shards[test], algorithm=algorithm, loss=loss, runs=3,
                    T=40, record_every=10, eps=2.0, **extra)
    g = _group(run_job(job, comm=MPI.COMM_SELF, progress=False))
    (X, y), ev = _records(shards[test])
    final, star = g["models/final"], g["reference/theta_star"]
    maj = 1.0 if np.mean(y > 0) >= 0.5 else -1.0
    assert maj == -1.0 and g["reference/majority_label"] == maj
    np.testing.assert_array_equal(g["metrics/train_error"][-1], _error(X, y, final))
    assert g["reference/train_error_star"] == _error(X, y, star)[0]
    assert g["reference/train_error_majority"] == np.mean(y != maj)
    assert g["reference/train_error_zero"] == np.mean(y != 1.0)  # theta = 0 predicts +1
    if ev is None:
        assert "metrics/test_error" not in g and "reference/test_error_majority" not in g
        assert "no test set" in g["attrs"]["eval_set"]
        return
    Xt, yt = ev
    np.testing.assert_array_equal(g["metrics/test_error"][-1], _error(Xt, yt, final))
    assert g["reference/test_error_star"] == _error(Xt, yt, star)[0]
    assert g["reference/test_error_majority"] == np.mean(yt != maj)
    assert g["reference/test_error_zero"] == np.mean(yt != 1.0)
    assert f"({len(yt)} records)" in g["attrs"]["eval_set"]
    assert "sign(0) = +1" in g["attrs"]["prediction"]
    assert "test_error" in g["attrs"]["evaluation_only"]


def test_squared_loss_records_training_mse_and_its_baselines(tmp_path, small_shards):
    job = write_job(tmp_path / "r.toml", small_shards, runs=2, T=20, eps=5.0)
    g = _group(run_job(job, comm=MPI.COMM_SELF, progress=False))
    (X, y), _ = _records(small_shards)
    mse = np.mean((X @ g["models/final"].T - y[:, None]) ** 2, axis=0)
    np.testing.assert_allclose(g["metrics/train_mse"][-1], mse, rtol=1e-12)
    assert g["reference/train_mse_zero"] == pytest.approx(np.mean(y**2), rel=1e-12)
    assert g["reference/train_mse_mean"] == pytest.approx(np.var(y), rel=1e-9)
    assert "metrics/train_error" not in g


def test_error_counts_and_baselines_units():
    X = np.array([[1.0, 0.0], [0.0, 1.0], [-1.0, 0.0], [0.0, 0.0]])
    y = np.array([1.0, -1.0, -1.0, 1.0])
    thetas = np.array([[1.0, 0.0], [0.0, 0.0], [-1.0, 1.0]])
    # theta = 0 and the record x = 0 both predict +1 (sign(0) = +1)
    np.testing.assert_array_equal(error_counts(X, y, thetas), [1.0, 2.0, 3.0])
    # [n, n_pos, sum y, sum y^2] of training, [n, n_pos] of the test set; a tie gives +1
    b = baselines(np.array([4, 2, 0, 4, 10, 3]), True, True)
    assert b["majority_label"] == 1.0 and b["test_error_majority"] == b["test_error_zero"] == 0.7
    b = baselines(np.array([4, 1, -2, 4, 10, 3]), True, True)
    assert b["majority_label"] == -1.0 and b["train_error_majority"] == 0.25
    assert b["test_error_majority"] == 0.3 and b["test_error_zero"] == 0.7
    assert baselines(np.array([4, 0, 2, 6, 0, 0]), False, False) == {"train_mse_zero": 1.5,
                                                                      "train_mse_mean": 1.25}


def test_admm_train_error_and_baselines_match_numpy(tmp_path):
    path = write_synth(tmp_path / "mc.h5", "multiclass", 3, 150, 5, 0.35, 1, 400, classes=3)
    job = write_job(tmp_path / "a.toml", path, algorithm="admm", runs=2, T=15, record_every=5,
                    eps=1.0)
    g = _group(run_job(job, comm=MPI.COMM_SELF, progress=False))
    with ShardFile(path) as f:
        X, y = (np.concatenate(a) for a in zip(*f.read_agents(range(3)), strict=True))
        y = y.astype(int)
        yt = f.read_test()[1].astype(int)
    pred = np.argmax(np.einsum("nj,rjk->rnk", X, g["models/final"]), axis=2)
    np.testing.assert_array_equal(g["metrics/train_error"][-1], np.mean(pred != y, axis=1))
    maj = np.argmax(np.bincount(y))
    assert g["reference/majority_label"] == maj
    assert g["reference/train_error_majority"] == pytest.approx(np.mean(y != maj), abs=1e-15)
    assert g["reference/train_error_zero"] == pytest.approx(np.mean(y != 0), abs=1e-15)
    assert g["reference/test_error_majority"] == np.mean(yt != maj)
    assert g["reference/test_error_zero"] == np.mean(yt != 0)  # W = 0: argmax picks class 0
    with open_result(job.with_suffix(".h5")) as res:
        (row,) = admm_table(res)
    assert row["majority_error"] == g["reference/test_error_majority"]
    assert row["beats_baseline"] == (row["mean"] < min(row["majority_error"], row["zero_error"]))


# -- evaluation changes no model ------------------------------------------------------------------
def _sync_models(shards: list[LocalShard], ev: EvalSet, evaluate: bool) -> np.ndarray:
    star = Star(MPI.COMM_SELF, 3)
    s = sync_star.Settings(variant="alg2", T=25, loss="logistic", lam=1e-2, theta_max=1e6,
                           theta0=0.0, xi=2.0, clip=True, rho=5.0, L=1.0, avg_kind="polynomial",
                           eta=3.0, seed=3, run_ids=(0, 1, 2), record_every=5,
                           aggregate="gather", eps=(1.0, 2.0, 0.5), n=SIZES, p=P + 1)
    with tapping(Tap(0, s.runs, 1, evaluate=evaluate)):
        ref = reference_quantities(Oracle(star, shards, "logistic", s.lam, sum(SIZES), P + 1,
                                          ev), s.theta_max, "auto")
        assert bool(ref.utility) == evaluate
        con = Contract.planned(rules.BasicSplit(), "laplace", s.T, s.eps, seed=s.seed,
                               run_ids=s.run_ids)
        out = sync_star.run_config(star, shards, s, con, ref, progress=False, evalset=ev)
    return np.concatenate([out["models/final"], out["models/final_iterate"]])


def _async_models(shards: list[LocalShard], ev: EvalSet, evaluate: bool) -> np.ndarray:
    star = Star(MPI.COMM_SELF, 3)
    s = async_star.Settings(T=60, loss="logistic", lam=1e-2, theta_max=10.0, theta0=0.0,
                            init="const", xi=2.0, clip=True, rho=1.0, central_step="proof",
                            eps=(1.0, 2.0, 0.5), n=SIZES, caps=(60,) * 3, p=P + 1, seed=3,
                            run_ids=(0, 1, 2), record_every=10)
    with tapping(Tap(0, s.runs, 1, evaluate=evaluate)):
        ref = reference_quantities(Oracle(star, shards, "logistic", s.lam, sum(SIZES), P + 1,
                                          ev), s.theta_max, "auto")
        con = Contract.planned(rules.BasicSplit(), "laplace", list(s.caps), s.eps, seed=s.seed,
                               run_ids=s.run_ids)
        out = async_star.run_config(star, P2PStar(MPI.COMM_SELF, star.layout, P + 1), shards, s,
                                    con, ref, None, progress=False, evalset=ev)
    return np.concatenate([out["models/final"], out["models/local"].reshape(3, -1)], axis=1)


@pytest.mark.parametrize("runner", [_sync_models, _async_models])
def test_evaluation_changes_no_model(shards, runner):
    """The same run with the evaluation (utility, psi) on and off (an audit's tap): bitwise the
    same models, so the metrics cannot have touched a noise draw or a model value."""
    (X, y), (Xt, yt) = _records(shards["owner"])
    cut = np.cumsum((0,) + SIZES)
    parts = [LocalShard(i, X[cut[i]:cut[i + 1]], y[cut[i]:cut[i + 1]]) for i in range(3)]
    m = N_TEST // 3
    ev = EvalSet("owner_test", N_TEST, local={i: (Xt[i * m:(i + 1) * m], yt[i * m:(i + 1) * m])
                                              for i in range(3)})
    on, off = runner(parts, ev, True), runner(parts, ev, False)
    assert on.tobytes() == off.tobytes()


def test_admm_evaluation_changes_no_model():
    d = synth_multiclass(3, 100, 5, 0.35, 1, classes=3, test=200)
    models = []
    for evaluate in (True, False):
        s = admm.Settings(method="objt", T=10, n=(100,) * 3, J=5, K=3,
                          run_ids=(0, 1), record_every=2)
        con = admm_paper_contract(s, 1.0)
        agents = [admm.Agent(i, X, y, s, con) for i, (X, y) in enumerate(d["agents"])]
        with tapping(Tap(0, s.runs, 1, evaluate=evaluate)):
            out = admm.run_config(Star(MPI.COMM_SELF, 3), agents, s, con,
                                  (d["test"][0], d["test"][1].astype(int)), None, progress=False)
        assert bool(out["baselines"]) == evaluate
        models.append(out["models/final"])
    assert models[0].tobytes() == models[1].tobytes()


# -- (2) analyze flags a useless configuration, not a good one --------------------------------
def test_analyze_flags_a_model_no_better_than_the_majority_class(tmp_path, shards):
    """eps = 1e-3: the noise swamps the gradient, the model is near random (~50 % error against
    the majority class's ~30 %); eps = inf learns the rule (~10 %)."""
    job = write_job(tmp_path / "flag.toml", shards["global"], loss="logistic", runs=3, T=40,
                    sweep={"eps": [1e-3, math.inf]})
    out = tmp_path / "flag.h5"
    cp = mpi_run(2, ["run", str(job), "--out", str(out), "--quiet"])
    assert cp.returncode == 0, cp.stderr
    cp = subprocess.run([sys.executable, "-m", "mpi_dp", "analyze", str(out)],
                        capture_output=True, text=True, timeout=120)
    assert cp.returncode == 0, cp.stderr
    lines = cp.stdout.splitlines()
    head = next(ln for ln in lines if ln.startswith("#  "))
    for col in ("median", "test_err", "train_err", "err(theta*)", "majority", "theta=0", "flag"):
        assert col in head, head
    bad = next(ln for ln in lines if ln.rstrip().endswith("eps=0.001, n=[300,250,350]"))
    good = next(ln for ln in lines if ln.rstrip().endswith("eps=inf, n=[300,250,350]"))
    assert "<= baseline" in bad and "<= baseline" not in good
    assert "<= baseline: 1 configuration(s) whose final model is no better than a trivial " \
           "predictor" in cp.stdout
    assert "global test set /test (900 records)" in cp.stdout
    with open_result(out) as res:
        rows = summarize(res)
    assert [r["beats_baseline"] for r in rows] == [False, True]
    assert rows[0]["test_error"] >= rows[0]["majority_error"] > rows[1]["test_error"]


# -- (3) bitwise the same on 1, 2 and 4 ranks -------------------------------------------------
@pytest.mark.parametrize("algorithm, test, ranks", [
    ("sync_star", "owner", (1, 2, 4)), ("async_star", "global", (1, 2)),
    ("sync_star", "none", (1, 2))])
def test_utility_is_rank_invariant(tmp_path, shards, algorithm, test, ranks):
    extra = {"variant": "proof"} if algorithm == "async_star" else {}
    job = write_job(tmp_path / f"ri_{algorithm}.toml", shards[test], algorithm=algorithm,
                    loss="logistic", runs=2, T=20, record_every=5, **extra)
    keys = set(assert_rank_invariant(job, tmp_path, ranks)[0])
    assert {"metrics/train_error", "reference/train_error_majority",
            "reference/train_error_star", "reference/majority_label"} <= keys
    assert ("metrics/test_error" in keys) == (test != "none")


def test_admm_utility_is_rank_invariant(tmp_path):
    path = write_synth(tmp_path / "mc.h5", "multiclass", 3, 120, 5, 0.35, 1, 300, classes=3)
    job = write_job(tmp_path / "ra.toml", path, algorithm="admm", runs=2, T=10, record_every=5,
                    eps=1.0)
    keys = set(assert_rank_invariant(job, tmp_path, (1, 2))[0])
    assert {"metrics/train_error", "reference/test_error_majority"} <= keys
