"""On-disk cache of admm's and dola's evaluation-only optima across jobs.

* admm's w* (reference/w_star, its training error, iterations and final projected gradient): one
  L-BFGS-B solve over every agent's records (`admm.reference_optimum`: up to
  admm.reference_iters full passes; on MNIST-sized shards most of a short job's set-up). The
  learner keys it by a SHA-256 over the shard file's content digest
  (reference_cache.shard_digest) and task, the records taken (the n vector: the first n_p records
  of agents 0..P-1), J, K, gamma and the box bound (exact bits), the iteration cap and the array
  backend of the records' kernels.
* dola's comparator w* (the exact L1-loss SVM on every consumed record, `svm_dual_cd` on rank 0):
  keyed by those records themselves (rank 0 holds them: X, dense or CSR, and y by their bytes)
  and lam.

Both keys also hold the code that computes the optimum (ADMM_CODE, SVM_CODE: the modules'
source) and what may change its rounding (numpy and scipy versions, Python, the machine, the
BLAS threads). A job already solves each once per (records, parameters) for all its
configurations; this cache carries them across jobs, so a sweep of jobs on one shard solves
them once. Entries share the star methods' folder and format (algorithms.reference_cache,
$MPI_DP_REFERENCE_CACHE: exact float64 bytes with their key and a digest of the values, written
atomically; a damaged entry is ignored and recomputed), so a cached optimum is bit for bit the
computed one. Both solves are rank-invariant, so the rank count is not part of a key.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import scipy.sparse as sp

from ..comm.star import Star
from ..data import ShardFile
from ..p2p import reference_cache as store
from . import reference_cache

#: bump when the entry format or the meaning of a key changes
FORMAT = "mpi_dp optimum cache v1"
#: modules whose code computes admm's w* and its training error (their source is in the key)
ADMM_CODE = ("algorithms/admm.py", "algorithms/admm_steps.py", "models/multinomial.py",
             "models/reference.py", "methods/admm.py", "algorithms/optimum_cache.py")
#: modules whose code computes dola's comparator
SVM_CODE = ("models/reference.py", "algorithms/optimum_cache.py")

#: (w*, training error or None, iterations, largest projected-gradient entry)
Optimum = tuple[np.ndarray, float | None, int, float]


def admm_key(shard: ShardFile, *, n: tuple[int, ...], J: int, K: int, gamma: float,
        w_bound: float, iters: int, backend: str) -> str | None:
    """The entry key of admm's w* (learner only: it digests the shard file); None: the cache is
    disabled."""
    if reference_cache.folder() is None:
        return None
    what = {"shard": reference_cache.shard_digest(shard), "task": str(shard.task),
            "J": str(J), "K": str(K), "gamma": float(gamma).hex(),
            "w_bound": float(w_bound).hex(), "iters": str(int(iters)), "backend": backend}
    d = store.key_start(store.code_digest(FORMAT, ADMM_CODE), what)
    return d.array("n", np.asarray(n, dtype=np.int64)).hexdigest()


def cached_optimum(star: Star, key_on_learner: str | None, shape: tuple[int, int],
                   compute: Callable[[], Optimum]) -> Optimum:
    """Collective: admm's w* read from the cache by the learner and broadcast, else
    `compute()`d on every rank (it is collective) and stored by the learner. `key_on_learner`:
    `admm_key` on the learner (None there: no cache), ignored elsewhere."""
    folder = reference_cache.folder()
    got = None
    if star.is_learner and key_on_learner is not None:
        got = store.load(folder, key_on_learner,
                         {"w_star": shape, "train_error": None, "iterations": None,
                          "gradient": None})
    got = star.bcast_object(got)
    if got is not None:
        err = got["train_error"]
        return (got["w_star"], None if math.isnan(err) else err, int(got["iterations"]),
                got["gradient"])
    w, err, nit, grad = compute()
    if star.is_learner and key_on_learner is not None:
        store.store(folder, key_on_learner, {
            "w_star": np.ascontiguousarray(w, dtype=np.float64),
            "train_error": math.nan if err is None else float(err),
            "iterations": float(nit), "gradient": float(grad)})
    return w, err, nit, grad


def svm_comparator(X: Any, y: np.ndarray, lam: float, solve: Callable[[], np.ndarray]
                   ) -> np.ndarray:
    """dola's comparator w* of the records (X, y) at lam (rank 0, where they are): read from
    the cache, else `solve()`d and stored."""
    folder = reference_cache.folder()
    if folder is None:
        return solve()
    d = store.key_start(store.code_digest(FORMAT, SVM_CODE),
                        {"of": "dola svm comparator", "lam": float(lam).hex()}).array("y", y)
    if sp.issparse(X):
        csr = sp.csr_matrix(X)
        d.text("X", f"csr {csr.shape}").array("data", csr.data).array("indices", csr.indices)
        d.array("indptr", csr.indptr)
    else:
        d.text("X", "dense").array("data", X)
    key = d.hexdigest()
    got = store.load(folder, key, {"w_star": (int(X.shape[1]),)})
    if got is not None:
        return got["w_star"]
    w = solve()
    store.store(folder, key, {"w_star": np.ascontiguousarray(w, dtype=np.float64)})
    return w
