"""Pieces every star method shares: local owners' data, the evaluation oracle, reference optima.

Everything here is evaluation-only (psi, theta*, isolated optima, training and test error, the
trivial baselines): it reads un-noised functions of the owners' data and is labelled so in the
output. It is never part of the private protocol and never touches a noise stream or a model.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import time
from collections.abc import Iterable, Mapping
from typing import Any, ClassVar

import numpy as np
import scipy.sparse as sp

from .. import progress
from ..comm.star import Star
from ..errors import JobError
from ..models import linear, reference
from ..models.linear import error_counts
from ..privacy import Ledger, tap
from ..privacy.release import OwnerRelease
from .agent_block import AgentBlock
from .hooks import RunHooks
from .reference_cache import DiskCache

#: losses whose models are binary classifiers (labels in {-1, +1}): they get error rates
CLASSIFICATION_LOSSES = ("hinge", "logistic")
#: the prediction rule behind every error rate of the star methods
PREDICTION_RULE = ("y_hat = sign(x . theta) with sign(0) = +1 (the convention of the synthetic "
                   "labels, dola and p2p): theta = 0 predicts +1 for every record")


def is_classification(loss: str) -> bool:
    """Whether models of `loss` are classifiers whose error rates are recorded."""
    return loss in CLASSIFICATION_LOSSES


#: numbers per chunk of `agent_order_sum`'s and `ordered_total`'s terms (bounds their
#: temporaries to a few x 8 MiB)
ORDER_ELEMS = 2**20
#: rows of at least this many numbers: `agent_order_sum` adds them in place, one by one (the
#: loop's overhead is small beside the row, and no partial sums are written)
ROW_LOOP_ELEMS = 2**12


def agent_order_sum(rows: np.ndarray) -> np.ndarray:
    """Sum of per-agent rows added one agent after the other, so the result never depends on
    how agents are laid out over ranks (bitwise rank-invariance)."""
    rows = np.asarray(rows, dtype=np.float64)
    A = rows.shape[0]
    if A == 0:
        return np.zeros(rows.shape[1:])
    # rows of ROW_LOOP_ELEMS numbers or more are added in place one after the other; many
    # small rows by add.accumulate, sequential along its axis (a plain sum may add pairwise),
    # in chunks of agents of at most ORDER_ELEMS numbers (it writes every partial sum): the
    # same additions. The loop this replaces, total = total + row from +0.0, differs from
    # both only in a -0.0 total: + 0.0
    step = max(1, ORDER_ELEMS // max(1, rows[0].size))
    if step == 1 or rows[0].size >= ROW_LOOP_ELEMS:
        total = rows[0].copy()
        for row in rows[1:]:
            total += row
    else:
        total = np.add.accumulate(rows[:step], axis=0)[-1]
        for lo in range(step, A, step):
            terms = np.concatenate([total[None], rows[lo:lo + step]])
            total = np.add.accumulate(terms, axis=0)[-1]
    total += 0.0
    return total


def ordered_total(start: np.ndarray, rows: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """start + weights[0] rows[0] + weights[1] rows[1] + ..., added left to right: bit for bit
    the loop `d = start; for i: d = d + weights[i] * rows[i]`, as array work (add.accumulate is
    sequential along its axis), in chunks of agents of at most ORDER_ELEMS numbers; rows of
    ROW_LOOP_ELEMS numbers or more one after the other, in place."""
    total = np.array(start, dtype=np.float64)
    if total.size >= ROW_LOOP_ELEMS:
        for i in range(rows.shape[0]):
            total += weights[i] * rows[i]
        return total
    step = max(1, ORDER_ELEMS // max(1, total.size))
    for lo in range(0, rows.shape[0], step):
        w = weights[lo:lo + step].reshape((-1,) + (1,) * (rows.ndim - 1))
        terms = np.concatenate([total[None], w * rows[lo:lo + step]])
        total = np.add.accumulate(terms, axis=0)[-1]
    return total


@dataclasses.dataclass
class LocalShard:
    """The first n records of one owner's shard, as held on the rank hosting that owner.

    X is a dense float64 array or, for a sparse shard file, a scipy.sparse CSR matrix: every
    computation on it (models.linear, the reference solvers) accepts both.
    """

    agent: int
    X: np.ndarray | sp.csr_matrix
    y: np.ndarray

    @property
    def n(self) -> int:
        return int(self.X.shape[0])

    @functools.cached_property
    def squared_stats(self) -> linear.SquaredStats:
        """Gram matrix and row norms for the fast squared-loss clipped gradient (computed once)."""
        return linear.squared_stats(self.X, self.y)


@dataclasses.dataclass(frozen=True)
class EvalSet:
    """Where the test error of a classifier is measured (evaluation-only).

    kind: 'test' (the shard file's global test set; `data` = (X, y) on the learner only),
    'owner_test' (every owner's own test split, evaluated by that owner: `local` maps each hosted
    owner to its (X_test, y_test); counts pooled in agent order) or 'train' (no test set: only
    the training error is recorded). kind and n (records in the set) are the same on every rank.
    """

    kind: str = "train"
    n: int = 0
    data: tuple | None = None
    local: dict = dataclasses.field(default_factory=dict)

    @property
    def has_test(self) -> bool:
        return self.kind != "train"

    def describe(self) -> str:
        """One line for the output: which records the test error counts."""
        return {"test": f"the shard file's global test set /test ({self.n} records)",
                "owner_test": f"the owners' own test splits, pooled ({self.n} records)",
                "train": "none: the shard file has no test set, only training error is "
                         "recorded"}[self.kind]


@dataclasses.dataclass(frozen=True)
class Reference:
    """Non-private reference quantities of one configuration (evaluation-only).

    `utility`: the trivial baselines and theta*'s own utility (see `baselines`); empty inside a
    privacy audit, which skips evaluation. With reference.solver = 'none' (`NO_REFERENCE`) the
    optima and f* are None (nothing needing theta* is recorded) and `utility` holds the
    baselines only.
    """

    theta_star: np.ndarray | None
    f_star: float | None
    theta_isolated: np.ndarray | None  # (N, p): each owner's own optimum theta*_i
    psi_isolated: np.ndarray | None  # (N,): psi(theta*_i) on the full objective
    solver: str
    utility: dict = dataclasses.field(default_factory=dict)

    @property
    def has_optimum(self) -> bool:
        """Whether theta* was computed (not reference.solver = 'none')."""
        return self.theta_star is not None and self.f_star is not None


#: reference.solver value that skips theta* (and everything that needs it)
NO_REFERENCE = "none"
#: what a run without theta* leaves out, for its progress line and result attribute
NO_REFERENCE_NOTE = ("reference.solver = 'none': theta* not computed, so psi, psi_iterate, "
                     "theta_star, f_star, the isolated optima and theta*'s utility are not "
                     "recorded")


class Oracle:
    """Evaluation-only access to the full objective f, computed across ranks in agent order
    (an evaluation.Evaluator: `record`, `final`)."""

    def __init__(self, star: Star, shards: list[LocalShard], loss: str, lam: float,
                 n_total: int, p: int, evalset: EvalSet | None = None,
                 block: AgentBlock | None = None) -> None:
        self.star, self.shards, self.loss, self.lam = star, shards, loss, lam
        self.n_total, self.p = n_total, p
        self.evalset = evalset if evalset is not None else EvalSet()
        self._block = block

    @property
    def block(self) -> AgentBlock:
        """The hosted shards stacked for array work (`agent_block.AgentBlock`), built once."""
        if self._block is None:
            self._block = AgentBlock(self.shards)
        return self._block

    @property
    def classify(self) -> bool:
        return is_classification(self.loss)

    def error_width(self, q: int) -> int:
        """Columns the error counts of q models take in `loss_sums` (train, owners' tests)."""
        return q * (2 if self.evalset.kind == "owner_test" else 1)

    def loss_sums(self, thetas: np.ndarray, extra_local: np.ndarray | None = None,
                  errors: slice | None = None) -> np.ndarray | None:
        """Per-agent loss sums (N, M) at the M models `thetas` (collective; learner gets them).

        `thetas` must have shape (M, p) on every rank (M known everywhere); its values are taken
        from the learner. `extra_local` (n_local, E) rides along (appended columns). `errors`
        (classification): each owner also counts the misclassified records of thetas[errors]
        on its training records and, for an 'owner_test' set, on its own test split: columns
        M + E onwards (`utility` reads them). The loss columns do not depend on the others.
        """
        thetas = self.star.bcast(np.ascontiguousarray(thetas, dtype=np.float64))
        m = thetas.shape[0]
        e = 0 if extra_local is None else extra_local.shape[1]
        wrong = thetas[errors] if errors is not None and self.classify else None
        c = 0 if wrong is None else self.error_width(wrong.shape[0])
        local = np.empty((len(self.shards), m + e + c))
        local[:, :m] = self.block.loss_sums(self.loss, thetas)
        if e:
            local[:, m : m + e] = extra_local
        if c:
            assert wrong is not None  # c > 0 only with models to count errors of
            q = wrong.shape[0]
            local[:, m + e : m + e + q] = self.block.error_counts(wrong)
            if self.evalset.kind == "owner_test":  # each owner's own test split, if it has one
                for j, sh in enumerate(self.shards):
                    test = self.evalset.local.get(sh.agent)
                    local[j, m + e + q :] = (0.0 if test is None
                                             else error_counts(test[0], test[1], wrong))
        return self.star.gather_agents(local, (m + e + c,))

    def utility(self, thetas: np.ndarray, sums: np.ndarray, rows: slice, start: int
                ) -> dict[str, np.ndarray]:
        """Learner: evaluation-only metrics of the models thetas[rows] from `loss_sums` output.

        Classification: train_error (share of the participants' training records misclassified)
        and, with a test set, test_error, read from the error columns at `start` (loss_sums
        called with errors=rows) or, for the global test set, computed here on the learner.
        Squared loss: train_mse, the mean squared error on the training records.
        """
        if not self.classify:
            return {"train_mse": agent_order_sum(sums[:, rows]) / self.n_total}
        q = thetas[rows].shape[0]
        out = {"train_error": agent_order_sum(sums[:, start : start + q]) / self.n_total}
        ev = self.evalset
        if ev.kind == "owner_test":
            out["test_error"] = agent_order_sum(sums[:, start + q : start + 2 * q]) / ev.n
        elif ev.kind == "test":
            assert ev.data is not None  # the global test set, held on the learner
            out["test_error"] = error_counts(ev.data[0], ev.data[1], thetas[rows]) / ev.n
        return out

    def label_stats(self) -> np.ndarray | None:
        """Learner: [n, n_pos, sum y, sum y^2] of the training records and [n, n_pos] of the
        evaluation set, added in agent order (collective; evaluation-only)."""
        local = np.zeros((len(self.shards), 6))
        for j, sh in enumerate(self.shards):
            y = np.asarray(sh.y, dtype=np.float64)
            local[j, :4] = [y.size, np.count_nonzero(y > 0), y.sum(), y @ y]
            test = self.evalset.local.get(sh.agent) if self.evalset.kind == "owner_test" else None
            if test is not None:
                local[j, 4:] = (len(test[1]), np.count_nonzero(np.asarray(test[1]) > 0))
        g = self.star.gather_agents(local, (6,))
        if g is None:
            return None
        tot = agent_order_sum(g)
        if self.evalset.kind == "test":
            assert self.evalset.data is not None  # the global test set, held on the learner
            y = np.asarray(self.evalset.data[1])
            tot[4:] = [y.size, np.count_nonzero(y > 0)]
        return tot

    def objective(self, thetas: np.ndarray, sums: np.ndarray) -> np.ndarray:
        """f(theta) = lam/2 ||theta||^2 + (1/n) sum of losses, summed over agents in order."""
        total = agent_order_sum(sums[:, : thetas.shape[0]])
        return 0.5 * self.lam * np.einsum("ij,ij->i", thetas, thetas) + total / self.n_total

    def record(self, thetas: np.ndarray, rows: slice | None = None,
               extra_local: np.ndarray | None = None) -> dict[str, np.ndarray] | None:
        """The evaluation-only metrics of a record (evaluation.Evaluator; collective, the
        learner gets them, others None): 'objective', f at each row of `thetas` (M,); with
        `rows`, the `utility` metrics of thetas[rows]; with `extra_local` (n_local, E, riding
        along `loss_sums`), 'extra': its columns summed over agents in agent order (E,). f is
        bitwise the same with or without the others."""
        sums = self.loss_sums(thetas, extra_local=extra_local, errors=rows)
        if sums is None:
            return None
        m = thetas.shape[0]
        e = 0 if extra_local is None else extra_local.shape[1]
        out = {"objective": self.objective(thetas, sums)}
        if e:
            out["extra"] = agent_order_sum(sums[:, m : m + e])
        if rows is not None:
            out.update(self.utility(thetas, sums, rows, m + e))
        return out

    def final(self) -> None:
        """evaluation.Evaluator's end of a run: nothing here. The star methods' final
        evaluation-only outputs are the reference quantities (`reference_quantities`: theta*,
        f*, the isolated optima, the trivial baselines), computed before the run, and the
        last record."""
        return None

    def evaluate(self, thetas: np.ndarray) -> np.ndarray | None:
        """f at each row of `thetas` (collective); the learner gets (M,), others None."""
        rec = self.record(thetas)
        return None if rec is None else rec["objective"]

    def evaluate_with_utility(self, thetas: np.ndarray, rows: slice
                              ) -> tuple[np.ndarray, dict[str, np.ndarray]] | None:
        """f at each row of `thetas` and the `utility` metrics of thetas[rows] (collective; the
        learner gets them, others None). f is bitwise what `evaluate` gives."""
        rec = self.record(thetas, rows)
        if rec is None:
            return None
        return rec.pop("objective"), rec

    # -- reference optimum ----------------------------------------------------------------
    def _fg_serve(self) -> None:
        """Owner side of the distributed value-and-gradient callback."""
        ctrl = np.zeros(1)
        theta = np.zeros((1, self.p))
        while True:
            self.star.bcast(ctrl)
            if ctrl[0] == 0:
                return
            self._fg_local(self.star.bcast(theta))

    def _fg_local(self, theta: np.ndarray) -> np.ndarray | None:
        local = self.block.loss_grad_sums(self.loss, theta)  # one pass: loss and gradient
        return self.star.gather_agents(local, (1 + self.p,))

    def _fg_learner(self, theta: np.ndarray) -> tuple[float, np.ndarray]:
        self.star.bcast(np.ones(1))
        th = self.star.bcast(np.ascontiguousarray(theta, dtype=np.float64).reshape(1, -1))
        g = self._fg_local(th)
        assert g is not None  # the learner gathers the sums
        tot = agent_order_sum(g)
        f = 0.5 * self.lam * float(theta @ theta) + tot[0] / self.n_total
        return f, self.lam * theta + tot[1:] / self.n_total

    def _bounded_or_exact(self, theta_max: float, solver: str) -> np.ndarray | None:
        """scipy/petsc on the distributed value-and-gradient, or exact dual CD for the hinge."""
        if solver == "dual_cd":  # exact dual CD needs the records in one place (evaluation-only)
            parts = self.star.gather_objects([(sh.X, sh.y) for sh in self.shards])
            if parts is None:
                return None
            blocks = [x for part in parts for x, _ in part]
            X = (sp.vstack(blocks, format="csr") if any(sp.issparse(b) for b in blocks)
                 else np.concatenate(blocks))
            y = np.concatenate([y for part in parts for _, y in part])
            return reference.svm_dual_cd(X, y, self.lam)
        if self.star.is_learner:
            try:
                return reference.minimize_smooth(self._fg_learner, self.p, theta_max,
                                                 solver=solver)
            finally:
                self.star.bcast(np.zeros(1))
        self._fg_serve()
        return None

    def theta_star(self, theta_max: float, solver: str) -> tuple[np.ndarray, str]:
        """The minimiser of f over the box, on every rank (collective), and the solver used."""
        if solver == "auto":
            solver = {"squared": "closed", "logistic": "scipy", "hinge": "dual_cd"}[self.loss]
        if solver == "closed" and self.loss != "squared":
            raise JobError(f"reference.solver = 'closed' needs loss = 'squared', not {self.loss}")
        if self.loss == "hinge" and solver in ("scipy", "petsc"):
            raise JobError("reference.solver: the hinge loss is non-smooth; use 'auto' (exact "
                           "dual coordinate descent)")
        if solver == "closed":
            theta, solver = self._closed_then_maybe_bounded(theta_max)
        else:
            theta = self._bounded_or_exact(theta_max, solver)
        return self.star.bcast_object(theta), solver

    def _closed_then_maybe_bounded(self, theta_max: float) -> tuple[np.ndarray | None, str]:
        # X^T X, X^T y of every owner (dense p x p also for CSR X)
        local = np.ascontiguousarray(self.block.gram_stats()[:, : self.p * self.p + self.p])
        g = self.star.gather_agents(local, (self.p * self.p + self.p,))
        theta = None
        if g is not None:
            tot = agent_order_sum(g)
            theta = reference.ridge_closed_form(tot[: self.p * self.p].reshape(self.p, self.p),
                                                tot[self.p * self.p :], self.n_total, self.lam)
        binds = self.star.bcast_object(None if theta is None
                                       else bool(np.max(np.abs(theta)) > theta_max))
        if not binds:
            return theta, "closed"
        return self._bounded_or_exact(theta_max, "scipy"), "scipy"


def baselines(stats: np.ndarray, has_test: bool, classify: bool) -> dict[str, float]:
    """The trivial predictors' utility from `Oracle.label_stats` (evaluation-only).

    Classification: majority_label (the most frequent training label, +1 on a tie, as sign(0))
    and the error of always predicting it, and of theta = 0 (always +1), on the training records
    (train_error_*) and on the evaluation set (test_error_*, with a test set). Squared loss: the
    training MSE of theta = 0 (mean y^2) and of predicting the training mean (the variance of y).
    """
    n, pos, sy, syy, n_test, pos_test = (float(v) for v in stats)
    if not classify:
        return {"train_mse_zero": syy / n, "train_mse_mean": max(syy / n - (sy / n) ** 2, 0.0)}
    maj = 1.0 if pos >= n - pos else -1.0
    out = {"majority_label": maj, "train_error_zero": (n - pos) / n,
           "train_error_majority": (n - pos) / n if maj > 0 else pos / n}
    if has_test and n_test > 0:
        out["test_error_zero"] = (n_test - pos_test) / n_test
        out["test_error_majority"] = out["test_error_zero"] if maj > 0 else pos_test / n_test
    return out


def baselines_only(oracle: Oracle) -> Reference | None:
    """The Reference of reference.solver = 'none': no optimum, only the trivial baselines
    (outside an audit; collective, the learner gets it)."""
    stats = oracle.label_stats() if tap.evaluating() else None
    if not oracle.star.is_learner:
        return None
    utility = ({} if stats is None
               else baselines(stats, oracle.evalset.has_test, oracle.classify))
    return Reference(theta_star=None, f_star=None, theta_isolated=None, psi_isolated=None,
                     solver=NO_REFERENCE, utility=utility)


def reference_quantities(oracle: Oracle, theta_max: float, solver: str,
                         isolated: int | None = None) -> Reference | None:
    """theta*, f*, the isolated optimum of owners 0..isolated-1 (default: all) and its psi, and
    (outside an audit) the trivial baselines and theta*'s own utility (collective; learner gets
    it). Owners from `isolated` on get NaN: each isolated psi is an evaluation over every
    record, so all of them cost O(N^2) for N owners. solver = 'none': `baselines_only`."""
    if solver == NO_REFERENCE:
        return baselines_only(oracle)
    theta_star, used = oracle.theta_star(theta_max, solver)
    n_agents = oracle.star.layout.n_agents
    k_iso = n_agents if isolated is None else min(int(isolated), n_agents)
    local_iso = np.zeros((len(oracle.shards), oracle.p))
    for j, sh in enumerate(oracle.shards):  # owners without records (not taking part): psi nan
        if sh.n and sh.agent < k_iso:
            local_iso[j] = reference.theta_star_local(oracle.loss, sh.X, sh.y, oracle.lam,
                                                      theta_max)
    empty = oracle.star.gather_agents(np.array([[float(sh.n == 0)] for sh in oracle.shards]
                                               ).reshape(len(oracle.shards), 1), (1,))
    iso = oracle.star.gather_agents(local_iso, (oracle.p,))
    thetas = np.zeros((1 + k_iso, oracle.p))
    if iso is not None:
        thetas[0] = theta_star
        thetas[1:] = iso[:k_iso]
    evaluating = tap.evaluating()
    stats = oracle.label_stats() if evaluating else None
    star_util: dict[str, np.ndarray] = {}
    if evaluating:
        out = oracle.evaluate_with_utility(thetas, slice(0, 1))
        if out is None:
            return None
        f, star_util = out
    else:
        f_only = oracle.evaluate(thetas)
        if f_only is None:
            return None
        f = f_only
    assert empty is not None and iso is not None  # the learner (f is not None) gathers them
    f_star = float(f[0])
    if not (math.isfinite(f_star) and f_star > 0):
        raise JobError(f"the reference objective f(theta*) = {f_star!r} is not positive: psi = "
                       "f/f* - 1 is undefined (is the data noiseless with lam = 0?)")
    psi_iso = np.full(n_agents, np.nan)
    psi_iso[:k_iso] = np.where(empty[:k_iso, 0] > 0, np.nan, f[1:] / f_star - 1.0)
    if k_iso < n_agents:
        iso[k_iso:] = np.nan
    utility = {}
    if evaluating:
        assert stats is not None  # the learner's
        utility = baselines(stats, oracle.evalset.has_test, oracle.classify)
        utility.update({f"{k}_star": float(v[0]) for k, v in star_util.items()})
    return Reference(theta_star=theta_star, f_star=f_star, theta_isolated=iso,
                     psi_isolated=psi_iso, solver=used, utility=utility)


def cached_reference(cache: dict, star: Star, shards: list[LocalShard], loss: str, lam: float,
                     n: list[int], p: int, theta_max: float, solver: str,
                     evalset: EvalSet | None = None,
                     isolated: int | None = None, disk: DiskCache | None = None
                     ) -> Reference | None:
    """reference_quantities for the sizes n, computed once per n vector of a sweep (collective),
    and read from / written to the on-disk cache `disk` (reference_cache; None or a disabled
    one: always computed). A cached reference is bit for bit the computed one."""
    key = tuple(n)
    if key not in cache:
        oracle = Oracle(star, shards, loss, lam, int(sum(n)), p, evalset)
        if solver == NO_REFERENCE or disk is None:
            cache[key] = reference_quantities(oracle, theta_max, solver, isolated)
        else:
            cache[key] = _on_disk(disk, oracle, theta_max, solver, isolated, n)
    return cache[key]


def _on_disk(disk: DiskCache, oracle: Oracle, theta_max: float, solver: str,
             isolated: int | None, n: list[int]) -> Reference | None:
    """reference_quantities through the disk cache: the learner looks its entry up and tells
    the others whether it hit (collective); a computed reference is stored by the learner."""
    star = oracle.star
    entry = None
    if star.is_learner and disk.folder is not None:
        entry = disk.key(loss=oracle.loss, lam=oracle.lam, theta_max=theta_max, solver=solver,
                         isolated=isolated, n=n, n_agents=star.layout.n_agents, p=oracle.p,
                         evalset=oracle.evalset, evaluating=tap.evaluating())
    got = None if entry is None else disk.load(entry, star.layout.n_agents, oracle.p)
    if star.bcast_object(got is not None):
        if got is None:
            return None  # not the learner
        progress.info(f"reference theta* read from the cache ({disk.folder}/{str(entry)[:12]}...)")
        return Reference(**got)
    t0 = time.perf_counter()
    ref = reference_quantities(oracle, theta_max, solver, isolated)
    if entry is not None and ref is not None:
        where = disk.store(entry, dataclasses.asdict(ref))
        progress.info(f"reference theta* computed in {time.perf_counter() - t0:.1f} s"
                      + (f" (cached in {disk.folder})" if where is not None
                         else f" (the cache folder {disk.folder} is not writable)"))
    return ref


# -- checkpoints inside a configuration (resume) -------------------------------------------------
class ReleasePath:
    """An owner whose ledger lives in its release path (`release`, privacy.release): `ledger`
    reads it, and sets it (a checkpoint's ledger on resume)."""

    release: OwnerRelease

    @property
    def ledger(self) -> Ledger:
        return self.release.ledger

    @ledger.setter
    def ledger(self, value: Ledger) -> None:
        self.release.ledger = value


class Checkpointed:
    """An owner whose `state()` (the attributes named in STATE and its noise streams' position:
    attribute NOISE's, or its release path's where NOISE is None) lets a resumed configuration
    continue it bit for bit."""

    STATE: tuple[str, ...] = ()
    NOISE: str | None = "gens"
    release: OwnerRelease  # where NOISE is None (a ReleasePath)

    def state(self) -> dict:
        noise = (self.release.noise_position() if self.NOISE is None
                 else getattr(self, self.NOISE).position())
        return {**{k: getattr(self, k) for k in self.STATE}, "noise": noise}

    def restore(self, st: dict) -> None:
        for k in self.STATE:
            setattr(self, k, st[k])
        if self.NOISE is None:
            self.release.seek_noise(st["noise"])
        else:
            getattr(self, self.NOISE).seek(st["noise"])


def gather_ledgers(gather: Star | Any, ledgers: list[Ledger], delta: float | None
                   ) -> list[Ledger] | np.ndarray | None:
    """Collective: the hosted `ledgers` of every rank on the root (None elsewhere), in agent
    order: with `delta`, as their privacy/ledger rows composed here, in parallel
    (accountants.ledger_rows at delta; unpickling 10,000 ledgers on the root took seconds),
    else the Ledger objects. `gather`: a Star or a GraphNet (its comm, gather_objects and
    bcast_object)."""
    if delta is None:
        parts = gather.gather_objects(ledgers)
        return None if parts is None else sorted((lg for p in parts for lg in p),
                                                 key=lambda lg: lg.agent)
    from ..privacy import accountants

    if gather.comm.Get_size() > 1:
        # the compositions the rows need are few and mostly cached on the root (its
        # calibration composed them): composed there once, not on every rank (on one rank
        # the rows compose them here anyway: no second pass over the ledgers)
        needed = gather.gather_objects(accountants.ledger_compositions(ledgers, delta))
        totals = None if needed is None else accountants.composed(
            {sig: canon for part in needed for sig, canon in part.items()})
        accountants.remember(gather.bcast_object(totals))
    parts = gather.gather_objects(accountants.ledger_rows(ledgers, delta))
    return None if parts is None else accountants.in_agent_order(parts)


def save_checkpoint(star: Star, hooks: RunHooks, k: int, T: int, owners: list,
                    **learner) -> None:
    """Collective, at a record: when the learner's recorder says a checkpoint is due or a stop
    was asked (hooks.checkpoint; not at the last record), store the learner's state with every
    owner's `state()`; after a stop's checkpoint every rank raises Interrupted."""
    if k >= T:
        return

    def state() -> dict | None:
        states = star.gather_objects([(o.agent, o.state()) for o in owners])
        if not star.is_learner:
            return None
        return {**learner, "k": k, "owners": dict(st for part in states for st in part)}

    hooks.checkpoint(state, star.comm)


def load_checkpoint(star: Star, hooks: RunHooks, owners: Iterable, clock: str = "k",
                    owners_only: bool = False) -> dict | None:
    """Collective: the checkpoint a resumed configuration continues from (None: start afresh),
    with every hosted owner (objects with `agent` and `restore`) restored; the learner's state
    is in the dict returned (`owners_only`: only the owners' part is broadcast, and only the
    learner gets the dict)."""
    saved = hooks.saved_state()
    sent = star.comm.bcast(saved if not owners_only or saved is None else
                           {"owners": saved["owners"], "k": saved["k"]}, root=0)
    if sent is None:
        return None
    if hasattr(owners, "restore_states"):  # owners built on demand (async_star.HostedOwners)
        owners.restore_states(sent["owners"])
    else:
        for o in owners:
            o.restore(sent["owners"][o.agent])
    hooks.info(f"resumed from its checkpoint at {clock}={sent['k']}")
    return saved if star.is_learner else None if owners_only else sent


class ResultRecord:
    """What a star algorithm's `run_config` returns on the learner: a frozen dataclass whose
    fields are the run's outputs. `KEYS` maps the keys of the dict these runs returned before
    (e.g. 'models/final') to fields, so `result["models/final"]` still reads `result.final`."""

    KEYS: ClassVar[Mapping[str, str]] = {}

    def __getitem__(self, key: str) -> Any:
        name = self.KEYS.get(key, key)
        if name not in {f.name for f in dataclasses.fields(self)}:  # type: ignore[arg-type]
            raise KeyError(key)
        return getattr(self, name)
