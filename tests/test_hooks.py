"""The runner's hooks (algorithms.hooks.RunHooks), the evaluator interface
(algorithms.evaluation.Evaluator) and the frozen result records of the star algorithms."""

from __future__ import annotations

import dataclasses
import inspect
import math

import numpy as np
import pytest
from mpi4py import MPI

from mpi_dp.algorithms import admm, async_star, dola, sync_star
from mpi_dp.algorithms.common import LocalShard, Oracle
from mpi_dp.algorithms.evaluation import Evaluator
from mpi_dp.algorithms.hooks import RunHooks
from mpi_dp.comm import stop
from mpi_dp.comm.star import Star
from mpi_dp.p2p import evaluation


class FakeRecorder:
    def __init__(self, due: bool = False, saved=None) -> None:
        self.rows, self.states, self.due, self.saved = [], [], due, saved

    def append(self, k, values):
        self.rows.append((k, values))

    def checkpoint_due(self):
        return self.due

    def save_state(self, st):
        self.states.append(st)

    def saved_state(self):
        return self.saved


def test_hooks_without_a_recorder_do_nothing_but_stop():
    h = RunHooks(None, "x", MPI.COMM_SELF, progress=False)
    h.record(1, {"psi": np.zeros(2)})
    assert not h.recording and not h.checkpoint_due() and h.saved_state() is None
    called = []
    h.checkpoint(lambda: called.append(1))  # nothing due, no stop: state() is not called
    assert called == []


def test_hooks_record_and_checkpoint():
    rec = FakeRecorder(due=True, saved={"k": 3})
    h = RunHooks(rec, "x", MPI.COMM_SELF, progress=False)
    h.record(2, {"psi": 1.0})
    assert rec.rows == [(2, {"psi": 1.0})] and h.saved_state() == {"k": 3}
    h.checkpoint(lambda: {"t": 2})
    h.checkpoint(lambda: None)  # nothing to store on this rank
    assert rec.states == [{"t": 2}]
    assert h.at_record() == (True, 0)


def test_a_stop_request_checkpoints_then_interrupts():
    rec = FakeRecorder(due=False)
    h = RunHooks(rec, "x", MPI.COMM_SELF, progress=False)
    stop.request()
    try:
        with pytest.raises(stop.Interrupted):
            h.checkpoint(lambda: {"t": 5})
    finally:
        stop.reset()
    assert rec.states == [{"t": 5}]


def test_of_keeps_given_hooks_and_builds_missing_ones():
    h = RunHooks(None, "given", MPI.COMM_SELF)
    assert RunHooks.of(h, FakeRecorder(), "other") is h
    built = RunHooks.of(None, None, "lbl", MPI.COMM_SELF, progress=True)
    assert built.label == "lbl" and built.reports  # rank 0 of COMM_SELF reports
    assert not RunHooks(None, "q", MPI.COMM_SELF, progress=False).reports
    bar = built.start(10, "round")
    assert bar is built.bar and bar.total == 10 and bar.unit == "round"


def test_the_evaluators_conform():
    X = np.eye(4)
    y = np.array([1.0, -1.0, 1.0, -1.0])
    star = Star(MPI.COMM_SELF, 1)
    shards = [LocalShard(0, X, y)]
    oracle = Oracle(star, shards, "squared", 0.1, 4, 4)
    gram = async_star.GramEvaluator(star, shards, 0.1, 4, 4)
    for ev in (oracle, gram, dola.Evaluation(None)):
        assert isinstance(ev, Evaluator)
    assert issubclass(evaluation.Evaluator, Evaluator)
    # p2p's final scores take a validation score, they never release one themselves
    assert "release_clip" not in inspect.signature(evaluation.Evaluator.final).parameters
    thetas = np.arange(8.0).reshape(2, 4) / 10
    rec = oracle.record(thetas, slice(0, 2))
    assert np.array_equal(rec["objective"], oracle.evaluate(thetas))
    f, util = oracle.evaluate_with_utility(thetas, slice(0, 2))
    assert np.array_equal(f, rec["objective"]) and np.array_equal(util["train_mse"],
                                                                   rec["train_mse"])
    g = gram.record(thetas)
    assert np.allclose(g["objective"], rec["objective"], rtol=1e-12)
    assert set(gram.record(thetas, utility=False)) == {"objective"}
    assert np.allclose(gram.final(thetas, 2.0)["psi_isolated"], g["objective"] / 2.0 - 1.0)
    assert oracle.final() is None and dola.Evaluation(None).final() is None


def test_result_records_are_frozen_and_keep_the_old_keys():
    led = []
    r = sync_star.SyncStarResult(final=np.ones(2), final_iterate=np.zeros(2), ledgers=led)
    assert r["models/final"] is r.final and r["models/final_iterate"] is r.final_iterate
    assert r["ledgers"] is led
    with pytest.raises(KeyError):
        r["models/local"]
    with pytest.raises(dataclasses.FrozenInstanceError):
        r.final = np.zeros(2)  # type: ignore[misc]
    a = admm.AdmmResult(final=np.ones(1), ledgers=[], iterations=np.zeros(0), eps_total_basic=
                        np.zeros(0), delta_total_basic=np.zeros(0), ended_at=3, end_reason="",
                        seconds=math.nan, baselines={})
    assert a["models/final"] is a.final and a["ended_at"] == 3
    assert async_star.AsyncStarResult.KEYS["models/local"] == "local"
