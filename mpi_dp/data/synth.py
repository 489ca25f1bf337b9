"""Synthetic datasets with the papers' shapes, for unit tests and the embedded demo.

Every draw comes from ``rng.stream(seed, "data", agent, 0)``: owner i's records from agent = i,
the public hold-out from agent = LEARNER, the true parameter from agent = LEARNER - 1. So adding
owners or resizing one owner never changes another owner's records. Each record's features and
noise are drawn together as one row, so an owner with n records gets exactly the first n records
of the same owner with more records (a sweep over n can generate once and read prefixes).
"""

from __future__ import annotations

import argparse
import os
import pathlib
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from mpi_dp import rng
from mpi_dp.data.shards import write_shards
from mpi_dp.errors import DataError

SYNTH_TASKS = ("regression", "binary", "multiclass", "online")


def _records_list(n_agents: int, records: int | Sequence[int]) -> list[int]:
    """Per-owner record counts from an int (same for all) or a list; DataError if invalid."""
    if n_agents < 1:
        raise DataError(f"n_agents must be at least 1, got {n_agents}")
    if isinstance(records, (int, np.integer)):
        sizes = [int(records)] * n_agents
    else:
        sizes = [int(r) for r in records]
        if len(sizes) != n_agents:
            raise DataError(f"{len(sizes)} record counts given for {n_agents} agents")
    if any(r < 1 for r in sizes):
        raise DataError(f"every owner needs at least 1 record, got {sizes}")
    return sizes


def _check(dim: int, noise: float, seed: int, public: int) -> None:
    if dim < 1:
        raise DataError(f"dim must be at least 1, got {dim}")
    if not np.isfinite(noise) or noise < 0:
        raise DataError(f"noise must be a finite non-negative number, got {noise}")
    if seed < 0:
        raise DataError(f"seed must be non-negative, got {seed}")
    if public < 0:
        raise DataError(f"public must be non-negative (0 for none), got {public}")


def _theta_true(seed: int, dim: int) -> np.ndarray:
    return rng.stream(seed, "data", rng.LEARNER - 1, 0).standard_normal(dim)


def _draw(seed: int, agent: int, n: int, dim: int) -> tuple[np.ndarray, np.ndarray]:
    """n rows of (features ~ N(0, I_dim), standard normal noise), one stream row per record."""
    Z = rng.stream(seed, "data", agent, 0).standard_normal((n, dim + 1))
    return np.ascontiguousarray(Z[:, :dim]), np.ascontiguousarray(Z[:, dim])


def synth_regression(
    n_agents: int,
    records: int | Sequence[int],
    dim: int,
    noise: float,
    seed: int,
    *,
    public: int = 10000,
    scale: float = 1.0,
) -> dict[str, Any]:
    """Linear regression: X ~ N(0, scale^2 I), theta_true ~ N(0, I), y = X theta_true + noise e.

    Returns {"agents": [(X, y), ...], "public": (X, y) or None, "theta_true": array (dim,),
    "task": "regression"}.
    """
    sizes = _records_list(n_agents, records)
    _check(dim, noise, seed, public)
    theta = _theta_true(seed, dim)

    def make(agent: int, n: int) -> tuple[np.ndarray, np.ndarray]:
        X, e = _draw(seed, agent, n, dim)
        X *= scale
        return X, X @ theta + noise * e

    return {
        "agents": [make(i, n) for i, n in enumerate(sizes)],
        "public": make(rng.LEARNER, public) if public > 0 else None,
        "theta_true": theta,
        "task": "regression",
    }


def synth_classification(
    n_agents: int,
    records: int | Sequence[int],
    dim: int,
    noise: float,
    seed: int,
    *,
    public: int = 10000,
    bias: bool = True,
) -> dict[str, Any]:
    """Binary labels y = sign(X theta_true + noise e) in {-1.0, +1.0} (0 maps to +1), X ~ N(0, I).

    With bias=True a constant 1 column is appended to X (p = dim + 1), as for the L-SVM.
    theta_true has length dim (the labels have no intercept). Returns the same dict as
    synth_regression with "task": "binary".
    """
    sizes = _records_list(n_agents, records)
    _check(dim, noise, seed, public)
    theta = _theta_true(seed, dim)

    def make(agent: int, n: int) -> tuple[np.ndarray, np.ndarray]:
        X, e = _draw(seed, agent, n, dim)
        y = np.where(X @ theta + noise * e >= 0.0, 1.0, -1.0)
        if bias:
            X = np.hstack([X, np.ones((n, 1))])
        return X, y

    return {
        "agents": [make(i, n) for i, n in enumerate(sizes)],
        "public": make(rng.LEARNER, public) if public > 0 else None,
        "theta_true": theta,
        "task": "binary",
    }


def synth_multiclass(
    n_agents: int,
    records: int | Sequence[int],
    dim: int,
    noise: float,
    seed: int,
    *,
    classes: int = 4,
    test: int = 2000,
) -> dict[str, Any]:
    """Spec dp-inexact-admm §9: centroids C ~ U[0,1]^(K x J), y ~ U{0..K-1},
    x = clip(C_y + noise N(0, I_J), 0, 1) (features in [0, 1], like MNIST pixels).

    Owner i's records come from the stream (seed, 'data', i); the global test set (`test`
    records) from the learner's stream. Labels are floats 0..K-1 (the shard format's y).
    """
    sizes = _records_list(n_agents, records)
    _check(dim, noise, seed, 0)
    if classes < 2:
        raise DataError(f"classes must be at least 2, got {classes}")
    C = rng.stream(seed, "data", rng.LEARNER - 1, 0).random((classes, dim))

    def make(agent: int, n: int) -> tuple[np.ndarray, np.ndarray]:
        g = rng.stream(seed, "data", agent, 0)
        y = g.integers(classes, size=n)
        X = np.clip(C[y] + noise * g.standard_normal((n, dim)), 0.0, 1.0)
        return X, y.astype(np.float64)

    return {"agents": [make(i, n) for i, n in enumerate(sizes)],
            "test": make(rng.LEARNER, test) if test > 0 else None, "centroids": C,
            "task": "multiclass"}


def write_synth(
    path: str | os.PathLike[str],
    task: str,
    n_agents: int,
    records: int | Sequence[int],
    dim: int,
    noise: float,
    seed: int,
    public: int = 10000,
    **kw: Any,
) -> pathlib.Path:
    """Generate a synthetic dataset and write it as a shard file; theta_true goes to /public.

    `kw` is passed to the generator (`scale` for regression, `bias` for binary).
    """
    if task == "online":
        return _write_online(path, n_agents, records, dim, noise, seed, public)
    if task == "multiclass":
        return _write_multiclass(path, n_agents, records, dim, noise, seed, public, **kw)
    if task == "regression":
        gen, generator = synth_regression, "synth_regression"
    elif task == "binary":
        gen, generator = synth_classification, "synth_classification"
    else:
        raise DataError(f"unknown synthetic task {task!r}; expected one of {list(SYNTH_TASKS)}")
    data = gen(n_agents, records, dim, noise, seed, public=public, **kw)
    sizes = [X.shape[0] for X, _ in data["agents"]]
    params: dict[str, Any] = {
        "generator": generator,
        "n_agents": n_agents,
        "records": sizes,
        "dim": dim,
        "noise": float(noise),
        "seed": int(seed),
        "public": int(public),
    }
    if task == "regression":
        params["scale"] = float(kw.get("scale", 1.0))
    else:
        params["bias"] = bool(kw.get("bias", True))
    names = [f"x{j}" for j in range(dim)]
    if task == "binary" and params["bias"]:
        names.append("bias")
    source = f"mpi_dp.data.synth.{generator}(" + ", ".join(
        f"{k}={v!r}" for k, v in params.items() if k != "generator"
    ) + ")"
    return write_shards(
        path,
        data["agents"],
        public=data["public"],
        task=task,
        feature_names=names,
        source=source,
        attrs={"synth": params},
        public_extra={"theta_true": data["theta_true"]},
    )


def synth_online(n_agents: int, records: int | Sequence[int], dim: int, flip: float, seed: int,
                 *, test: int = 2000, informative: int | None = None) -> dict[str, Any]:
    """The DOLA validation stream (spec dp-distributed-online-learning §7): w_true ~ N(0, I)
    normalised (only `informative` coordinates nonzero when given); owner i draws
    x ~ N(c_i, I/dim) around its own shift c_i ~ N(0, I/dim), rows scaled to norm <= 1,
    y = sign(<w_true, x>) with a fraction `flip` of labels flipped. The test set comes from the
    shift-free distribution."""
    sizes = _records_list(n_agents, records)
    if not 0 <= flip < 0.5:
        raise DataError(f"online: the label flip fraction must be in [0, 0.5), got {flip}")
    g = rng.stream(seed, "data", rng.LEARNER, 1)
    w = g.standard_normal(dim)
    if informative is not None:
        w[informative:] = 0.0
    w /= np.linalg.norm(w)

    def make(agent: int, n: int, shift: bool = True) -> tuple[np.ndarray, np.ndarray]:
        ga = rng.stream(seed, "data", agent, 1)
        c = ga.standard_normal(dim) / np.sqrt(dim) if shift else np.zeros(dim)
        X = c + ga.standard_normal((n, dim)) / np.sqrt(dim)
        X /= np.maximum(1.0, np.linalg.norm(X, axis=1))[:, None]
        y = np.where(X @ w >= 0, 1.0, -1.0)
        y[ga.random(n) < flip] *= -1.0
        return X, y

    return {"agents": [make(i, n) for i, n in enumerate(sizes)],
            "test": make(rng.LEARNER, test, shift=False) if test > 0 else None, "w_true": w}


def _write_online(path, n_agents: int, records, dim: int, noise: float, seed: int,
                  test: int) -> pathlib.Path:
    data = synth_online(n_agents, records, dim, noise, seed, test=test)
    params = {"n_agents": n_agents, "records": [X.shape[0] for X, _ in data["agents"]],
              "dim": dim, "flip": float(noise), "seed": int(seed), "test": int(test)}
    source = "mpi_dp.data.synth.synth_online(" + ", ".join(
        f"{k}={v!r}" for k, v in params.items()) + ")"
    return write_shards(path, data["agents"], task="binary",
                        feature_names=[f"x{j}" for j in range(dim)], source=source,
                        attrs={"synth": params}, test_global=data["test"],
                        public_extra={"w_true": data["w_true"]})


def _write_multiclass(path, n_agents: int, records, dim: int, noise: float, seed: int,
                      test: int, classes: int = 4) -> pathlib.Path:
    data = synth_multiclass(n_agents, records, dim, noise, seed, classes=classes, test=test)
    params = {"n_agents": n_agents, "records": [X.shape[0] for X, _ in data["agents"]],
              "dim": dim, "noise": float(noise), "seed": int(seed), "classes": int(classes),
              "test": int(test)}
    source = "mpi_dp.data.synth.synth_multiclass(" + ", ".join(
        f"{k}={v!r}" for k, v in params.items()) + ")"
    return write_shards(path, data["agents"], task="multiclass",
                        feature_names=[f"x{j}" for j in range(dim)], source=source,
                        attrs={"synth": params}, test_global=data["test"])


# ----------------------------------------------------------------------------------------------
# CLI: mpi-dp data synth


def _records_arg(text: str) -> int | list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected an integer or a comma-separated list of integers, got {text!r}"
        ) from None
    if not values:
        raise argparse.ArgumentTypeError("no record count given")
    return values[0] if len(values) == 1 and "," not in text else values


def add_synth_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the options of `mpi-dp data synth` to `parser`."""
    parser.description = (
        "Write a synthetic dataset as an HDF5 shard file, one group per data owner. Owner i's "
        "records depend only on --seed and i, so changing --agents or another owner's size leaves "
        "them unchanged. The true parameter is stored as /public/theta_true."
    )
    parser.add_argument(
        "--task", choices=SYNTH_TASKS, default="regression",
        help="regression: y = X theta + noise*N(0,1); binary: y = sign(X theta + noise*N(0,1)) in "
        "{-1,+1}, with a constant bias column appended; multiclass: --classes centroids in "
        "[0,1]^dim, x = clip(centroid + noise*N(0,I), 0, 1), a global test set of --public "
        "records; online: the DOLA stream (seed 003): owner-specific shifts, rows of norm <= 1, "
        "labels sign(<w_true, x>) with a fraction --noise flipped, a test set of --public "
        "records (default: %(default)s)",
    )
    parser.add_argument("--classes", type=int, default=4, metavar="K",
                        help="multiclass: number of classes (default: %(default)s)")
    parser.add_argument(
        "--agents", type=int, default=3, metavar="N",
        help="number of data owners (default: %(default)s)",
    )
    parser.add_argument(
        "--records", type=_records_arg, default=1000, metavar="N[,N...]",
        help="records per owner: one integer for all owners, or a comma-separated list with one "
        "count per owner (default: %(default)s)",
    )
    parser.add_argument(
        "--dim", type=int, default=5, help="number of features before any bias column "
        "(default: %(default)s)",
    )
    parser.add_argument(
        "--noise", type=float, default=0.5,
        help="standard deviation of the label noise (default: %(default)s)",
    )
    parser.add_argument(
        "--seed", type=int, default=0,
        help="random seed; same seed, same file (default: %(default)s)",
    )
    parser.add_argument(
        "--public", type=int, default=10000, metavar="N",
        help="public hold-out records every agent and the learner may see, e.g. to set step "
        "sizes and the clipping bound; 0 for none (default: %(default)s)",
    )
    parser.add_argument(
        "--out", type=pathlib.Path, required=True, metavar="PATH",
        help="shard file to write (parent directories are created; an existing file is replaced)",
    )


def run_synth_command(args: argparse.Namespace) -> pathlib.Path:
    """Run `mpi-dp data synth` from parsed arguments; prints a short summary, returns the path."""
    start = time.perf_counter()
    extra = {"classes": args.classes} if args.task == "multiclass" else {}
    path = write_synth(
        args.out, args.task, args.agents, args.records, args.dim, args.noise, args.seed,
        public=args.public, **extra,
    )
    seconds = time.perf_counter() - start
    sizes = _records_list(args.agents, args.records)
    per_agent = str(sizes[0]) if len(set(sizes)) == 1 else ",".join(map(str, sizes))
    p = args.dim + (1 if args.task == "binary" else 0)
    size_mib = path.stat().st_size / 2**20
    print(
        f"wrote {path}: {args.task}, {args.agents} agents x {per_agent} records, {p} features, "
        f"public {args.public}; {size_mib:.2f} MiB in {seconds:.2f} s"
    )
    return path
