"""Evaluation-only metrics of personalised P2P coordinate descent (seed 004).

Nothing here is released: every rank scores its hosted peers' models on their own records (the
local objective and the per-peer test metric), rank 0 gathers the parts and sums them in peer
order (the numbers of one rank doing it all), adds the graph term of Q and the gap to Q*, and
scores every peer's final model on the shard file's global test set. The one exception is a
private selection's validation score, which each peer releases through its own release path
(`Block.release_score`) before it is gathered.
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
from mpi4py import MPI

from ..data.shard_graph import EDGES, WEIGHTS, graph_arrays
from . import objective
from .coordinate_descent import Block
from .peer_data import Data


@dataclasses.dataclass
class HostedModels:
    """Models of the peers a rank hosts, as the evaluator reads them: theta[i] (R, p) of every
    hosted peer i (e.g. the local-DP baseline's; a coordinate-descent `Block` has the same)."""

    theta: dict[int, np.ndarray]
    agents: np.ndarray


#: test records x peers per block of the global test scores (32 MiB of float64)
GLOBAL_BLOCK = 2**22


def _agent_means(X: list[np.ndarray], y: list[np.ndarray], th: np.ndarray,
                 f: Callable[[np.ndarray, np.ndarray], np.ndarray]) -> list[np.ndarray]:
    """Per agent a, the mean over its records of f(X[a] @ th[a].T, y[a]) (R,): f, elementwise,
    runs once on every agent's records concatenated; each agent's product is its own GEMM and
    its mean the reduction of its own rows (a C-ordered (m_a, R) block, as alone), so agent a
    gets the bits `f(X[a] @ th[a].T, y[a]).mean(axis=0)` gives it."""
    if not X:
        return []
    m = np.array([x.shape[0] for x in X], dtype=np.int64)
    ends = np.cumsum(m).tolist()
    vals = f(np.concatenate([x @ t.T for x, t in zip(X, th, strict=True)]), np.concatenate(y))
    return [vals[e - k:e].mean(axis=0) for e, k in zip(ends, m.tolist(), strict=True)]


def _per_peer(ids: list[int], th: np.ndarray, X: list, y: list,
              f: Callable[[np.ndarray, np.ndarray], np.ndarray],
              alone: Callable[[int], np.ndarray],
              finish: Callable[[int, np.ndarray], np.ndarray]) -> np.ndarray:
    """(k, R) for the peers `ids` (position a: peer ids[a], models th[a]): finish(a, mean of
    f(margins, labels) over its records X[i], y[i]) as one batch (`_agent_means`) where they
    stack (objective.stackable), alone(a) otherwise (no records, CSR, other dtypes)."""
    out = np.empty(th.shape[:2])
    batch = []
    for a, i in enumerate(ids):
        if X is not None and X[i] is not None and objective.stackable(X[i], y[i]):
            batch.append(a)
        else:
            out[a] = alone(a)
    means = _agent_means([X[ids[a]] for a in batch], [y[ids[a]] for a in batch], th[batch], f)
    for a, mean in zip(batch, means, strict=True):
        out[a] = finish(a, mean)
    return out


class Evaluator:
    """Evaluation-only metrics: every rank scores its hosted peers, rank 0 sums in peer order."""

    def __init__(self, comm: MPI.Comm, P: objective.Problem, d: Data, agents: np.ndarray,
                 ref: dict[str, Any], R: int) -> None:
        self.comm, self.P, self.d, self.agents, self.ref, self.R = comm, P, d, agents, ref, R
        self.metric_name = ("per-peer test accuracy" if d.task == "binary"
                            else "per-peer test RMSE")
        self.trivial_name = ("majority label of the peer's training records" if d.task ==
                             "binary" else "the peer's training mean (0 on centred targets)")

    def _terms(self, z: np.ndarray, y: np.ndarray) -> np.ndarray:
        """Per test record and model, from the margins z (m, R): what `_finish` of its mean over
        a peer's records makes the metric (a hit; a squared error)."""
        if self.d.task == "binary":
            return np.where(z >= 0, 1.0, -1.0) == y[:, None]
        return (z - y[:, None]) ** 2

    def _finish(self, mean: np.ndarray) -> np.ndarray:
        """The metric from the mean of `_terms`: accuracy as it is, RMSE its square root."""
        return mean if self.d.task == "binary" else np.sqrt(mean)

    def _metric(self, i: int, th: np.ndarray, X=None, y=None) -> np.ndarray:
        X = self.d.Xt[i] if X is None else X
        y = self.d.yt[i] if y is None else y
        if X is None or len(y) == 0:
            return np.full(th.shape[0], np.nan)
        return self._finish(np.mean(self._terms(X @ th.T, y), axis=0))

    def _trivial(self, i: int, X=None, y=None, ytr=None) -> float:
        y = self.d.yt[i] if y is None else y
        ytr = self.d.y[i] if ytr is None else ytr
        if y is None or len(y) == 0:
            return math.nan
        if self.d.task == "binary":
            maj = 1.0 if np.mean(ytr > 0) >= 0.5 else -1.0
            return float(np.mean(y == maj))
        return float(np.sqrt(np.mean((y - np.mean(ytr)) ** 2)))

    def global_scores(self, theta: np.ndarray, test: tuple | None) -> dict[str, Any] | None:
        """Every peer's models theta (R, n, p) and its local model scored on the global test
        set `test` (rank 0, evaluation-only): error rate of sign(<theta_i, x>) (0 predicts +1)
        for a binary shard, RMSE for regression; with the trivial baseline, the set's own
        majority class / mean. None without a global test set."""
        if test is None:
            return None
        X, y = test
        binary = self.d.task == "binary"

        def score(th: np.ndarray) -> np.ndarray:  # th (n, p) -> (n,), by blocks of peers
            out = np.empty(th.shape[0])
            step = max(1, GLOBAL_BLOCK // max(1, len(y)))
            for a in range(0, th.shape[0], step):
                Z = X @ th[a:a + step].T
                out[a:a + step] = (np.mean(np.where(Z >= 0, 1.0, -1.0) != y[:, None], axis=0)
                                   if binary else np.sqrt(np.mean((Z - y[:, None]) ** 2, axis=0)))
            return out

        err = np.stack([score(theta[r]) for r in range(theta.shape[0])])
        loc = score(np.asarray(self.ref["theta_loc"]).reshape(self.P.n, self.P.p))
        if binary:
            trivial = float(min(np.mean(y > 0), np.mean(y < 0)))
        else:
            trivial = float(np.sqrt(np.mean((y - np.mean(y)) ** 2)))
        star = self.ref.get("theta_star")  # the non-private optimum Theta*
        star_err = (math.nan if star is None else
                    float(np.mean(score(np.asarray(star).reshape(self.P.n, self.P.p)))))
        return {"error": err, "local": loc, "trivial": trivial, "records": int(len(y)),
                "star": star_err,
                "name": ("error rate on the global test set" if binary
                         else "RMSE on the global test set"),
                "trivial_name": ("the global test set's majority class" if binary
                                 else "the global test set's mean")}

    def _mine(self, theta: dict[int, np.ndarray]) -> tuple[np.ndarray, ...]:
        """The hosted peers' ids, models (k, R, p), local objectives and test metrics (k, R):
        four arrays to gather, not a pickled tuple per peer."""
        P, R = self.P, self.R
        ids = self.agents.tolist()
        th = np.empty((len(ids), R, P.p))
        for a, i in enumerate(ids):
            th[a] = theta[i].reshape(R, P.p)
        X, y, lam = self.d.X, self.d.y, P.lam
        lo = _per_peer(ids, th, X, y, lambda z, yc: objective.margin_loss(P.loss, yc, z),
                       lambda a: objective.local_obj(P.loss, X[ids[a]], y[ids[a]], float(lam[ids[a]]),
                                                     th[a]),
                       lambda a, mean: mean + objective.ridge(float(lam[ids[a]]), th[a]))
        met = _per_peer(ids, th, self.d.Xt, self.d.yt, self._terms,
                        lambda a: self._metric(ids[a], th[a]),
                        lambda a, mean: self._finish(mean))
        return np.asarray(ids, dtype=np.int64), th, lo, met

    def _gather(self, mine: tuple[np.ndarray, ...]) -> list[tuple[np.ndarray, ...]] | None:
        return [mine] if self.comm.Get_size() == 1 else self.comm.gather(mine, root=0)

    def _assemble(self, parts: list[tuple[np.ndarray, ...]]
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        P = self.P
        theta = np.empty((self.R, P.n, P.p))
        lo = np.empty((P.n, self.R))
        met = np.empty((P.n, self.R))
        for ids, th, l_i, mt in parts:
            theta[:, ids, :] = th.transpose(1, 0, 2)
            lo[ids], met[ids] = l_i, mt
        return theta, lo, met

    def val_score(self, i: int, th: np.ndarray, clip: float) -> tuple[np.ndarray, float]:
        """Peer i's validation score of its models th (R, p) and the score's sensitivity to one
        validation record (replace-one): the error rate (binary, 1 / m_val) or the mean squared
        error with errors clipped to +-clip (regression, clip^2 / m_val). Lower is better."""
        assert self.d.Xv is not None and self.d.yv is not None  # a job with validation records
        X, y = self.d.Xv[i], self.d.yv[i]
        z = X @ th.T
        if self.d.task == "binary":
            return np.mean(np.where(z >= 0, 1.0, -1.0) != y[:, None], axis=0), 1.0 / len(y)
        return (np.mean(np.clip(z - y[:, None], -clip, clip) ** 2, axis=0),
                clip * clip / len(y))

    def _val(self, block: HostedModels | Block, release_clip: float | None) -> float:
        """val_metric: the mean over peers of their validation scores of the final models,
        each released by its peer with calibrated Laplace noise (`release_clip`: a private
        selection; its score is the clipped one) or, without a selection, computed
        evaluation-only (clip inf: the plain MSE / error rate)."""
        clip = math.inf if release_clip is None else release_clip
        Xv, yv = self.d.Xv, self.d.yv
        assert Xv is not None and yv is not None  # `validation` asks only with them
        mine = {}
        for i in self.agents.tolist():
            if Xv[i] is None or not len(yv[i]):
                continue
            score, sens = self.val_score(i, block.theta[i].reshape(self.R, self.P.p), clip)
            if release_clip is None:
                mine[i] = score
            else:  # a private selection: every peer releases through its block's path
                assert isinstance(block, Block)
                mine[i] = block.release_score(i, score, sens)
        parts = self.comm.gather(mine, root=0)
        if parts is None:
            return math.nan
        scores = [v for part in parts for _, v in sorted(part.items())]
        return float(np.mean(np.mean(scores, axis=0))) if scores else math.nan

    def _Q(self, theta: np.ndarray, lo: np.ndarray) -> np.ndarray:
        P = self.P
        smooth = objective.smooth_term(P.graph, theta)
        return smooth + P.mu * ((P.deg * P.conf)[:, None] * lo).sum(axis=0)

    def record(self, block: HostedModels | Block) -> dict[str, Any] | None:
        parts = self._gather(self._mine(block.theta))
        if parts is None:
            return None
        theta, lo, met = self._assemble(parts)
        Q = self._Q(theta, lo)
        with warnings.catch_warnings():  # peers without test records: NaN, not a warning
            warnings.simplefilter("ignore", RuntimeWarning)
            vals: dict[str, Any] = {"Q": Q, "test_metric": np.nanmean(met, axis=0),
                                    "test_metric_min": np.nanmin(met, axis=0),
                                    "test_metric_max": np.nanmax(met, axis=0)}
        if "Q_star" in self.ref:
            vals["gap"] = Q - self.ref["Q_star"]
        return vals

    def validation(self, block: HostedModels | Block, release_clip: float | None = None
                   ) -> float | None:
        """Collective: val_metric of the final models on rank 0 (NaN elsewhere), None without
        validation records. Not an evaluator's output when `release_clip` is given: then every
        peer releases its score through its own release path (`_val`), a private selection's
        input; without it the score is evaluation-only."""
        return self._val(block, release_clip) if self.d.Xv is not None else None

    def final(self, block: HostedModels | Block, val: float | None = None
              ) -> dict[str, Any] | None:
        """The final models' metrics on rank 0 (collective); `val`: the `validation` score to
        report beside them as val_metric (None: none)."""
        parts = self._gather(self._mine(block.theta))
        star = self.ref.get("theta_star")  # the non-private optimum Theta* (evaluation-only)
        star = None if star is None else np.asarray(star).reshape(self.P.n, self.P.p)
        loc = self.comm.gather({i: (self._metric(i, self.ref["theta_loc"][i][None])[0],
                                    self._trivial(i),
                                    math.nan if star is None else
                                    self._metric(i, star[i][None])[0])
                                for i in self.agents.tolist()}, root=0)
        if parts is None:
            return None
        assert loc is not None  # rank 0, as parts
        theta, _, met = self._assemble(parts)
        ml, mt, ms = np.empty(self.P.n), np.empty(self.P.n), np.empty(self.P.n)
        for part in loc:
            for i, (a, b, c) in part.items():
                ml[i], mt[i], ms[i] = a, b, c
        out = {"theta": theta, "metric": met.T, "metric_local": ml, "metric_trivial": mt,
               "metric_name": self.metric_name, "trivial_name": self.trivial_name}
        if star is not None:
            out["metric_star"] = ms
        if val is not None:
            out["val_metric"] = val
        glob = self.global_scores(theta, self.d.test_global)
        if glob is not None:
            out["global"] = glob
        return out

    def metrics_all(self, full: Data, theta: np.ndarray) -> dict[str, Any]:
        met = np.array([self._metric(i, theta[:, i, :], full.Xt[i], full.yt[i])
                        for i in range(self.P.n)])
        return {"test_metric": np.nanmean(met, axis=0)}

    def final_all(self, full: Data, theta: np.ndarray) -> dict[str, Any]:
        n = self.P.n
        met = np.array([self._metric(i, theta[:, i, :], full.Xt[i], full.yt[i])
                        for i in range(n)])
        ml = np.array([self._metric(i, self.ref["theta_loc"][i][None], full.Xt[i],
                                    full.yt[i])[0] for i in range(n)])
        mt = np.array([self._trivial(i, full.Xt[i], full.yt[i], full.y[i]) for i in range(n)])
        out = {"theta": theta, "metric": met.T, "metric_local": ml, "metric_trivial": mt,
               "metric_name": self.metric_name, "trivial_name": self.trivial_name}
        glob = self.global_scores(theta, full.test_global)
        if glob is not None:
            out["global"] = glob
        return out


def _nanmean(a: Any) -> float:
    """np.nanmean as a float (NaN, without a warning, when every entry is NaN: a shard without
    per-peer test records)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return float(np.nanmean(a))


def final_outcome(final: dict[str, Any], ref: dict[str, Any], d: Data
                  ) -> tuple[list[tuple[str, Any, dict[str, Any]]], dict[str, Any]]:
    """The final models, the reference and the scores (`Evaluator.final` / `final_all`) as a
    configuration's datasets (path, data, attrs) and attributes; with the graph where it was
    built for the job."""
    arrays: list[tuple[str, Any, dict[str, Any]]] = []

    def add(path: str, data: Any, **attrs: Any) -> None:
        arrays.append((path, data, attrs))

    add("models/theta", final["theta"], what="final models (R, n, p)")
    add("models/theta_local", ref["theta_loc"], what="purely local models (baseline, never "
        "released)")
    if "theta_star" in ref:
        add("reference/theta_star", ref["theta_star"], solver=ref["solver"], Q_star=ref["Q_star"])
    add("per_agent/test_metric", final["metric"], what=final["metric_name"])
    add("per_agent/test_metric_local", final["metric_local"], what="purely local models")
    add("per_agent/test_metric_trivial", final["metric_trivial"], what=final["trivial_name"])
    add("per_agent/m", d.m)
    if (d.graph_info or {}).get("kind", "shard") != "shard":  # a graph built for the job
        edges = graph_arrays(d.W)
        add("graph/edges", edges[EDGES], what="the peers' graph built for the job (p2p.graph; "
            "attrs graph): pairs i < j (public)")
        add("graph/weights", edges[WEIGHTS], what="W_ij of each edge (1 unless the edge list "
            "gave weights)")
    attrs: dict[str, Any] = {}
    if "global" in final:
        g = final["global"]
        add("per_agent/test_global_error", g["error"], what=g["name"] + " (R, n): each peer's "
            "final model on the shard file's global test set (evaluation-only)")
        add("per_agent/test_global_error_local", g["local"], what="the purely local models on "
            "the global test set")
        attrs.update(test_global_metric=g["name"], test_global_trivial=g["trivial_name"],
                     test_global_error=float(np.mean(g["error"])),
                     test_global_error_local=float(np.mean(g["local"])),
                     test_global_error_trivial=g["trivial"], test_global_error_star=g["star"],
                     test_global_records=g["records"])
    attrs.update(metric=final["metric_name"], trivial=final["trivial_name"],
                 test_metric=_nanmean(final["metric"]),
                 test_metric_local=_nanmean(final["metric_local"]),
                 test_metric_trivial=_nanmean(final["metric_trivial"]),
                 test_metric_star=_nanmean(final["metric_star"])
                 if "metric_star" in final else math.nan,
                 Q_star=ref.get("Q_star", math.nan), Q_loc=ref["Q_loc"], Q_zero=ref["Q_zero"],
                 val_metric=final.get("val_metric", math.nan))
    return arrays, attrs
