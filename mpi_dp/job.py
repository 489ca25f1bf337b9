"""TOML job file -> validated, immutable Job; every error names the key and the file.

A job holds every knob of a run. Sweeps (``[sweep] eps = [...]``, ``n = [...]``) expand into
configurations run one after the other within one job and stored side by side in one result file.
"""

from __future__ import annotations

import dataclasses
import difflib
import itertools
import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import tomllib

from .errors import JobError

ALGORITHMS = {"sync_star": ("alg1", "alg2")}
LOSSES = ("squared", "hinge", "logistic")


@dataclasses.dataclass(frozen=True)
class Key:
    """One job key: its type(s), default and a one-line description (shown by `mpi-dp run --help`)."""

    types: tuple[type, ...]
    default: Any
    help: str
    choices: tuple[Any, ...] | None = None


_NUM = (int, float)
#: Top-level keys. Per-owner values (eps, n) take a scalar or a list with one entry per owner.
TOP: dict[str, Key] = {
    "name": Key((str,), None, "job name (defaults to the file's stem)"),
    "algorithm": Key((str,), None, "method to run", tuple(ALGORITHMS)),
    "variant": Key((str,), "alg2", "algorithm variant: alg1 (decreasing steps, smooth f) or alg2 "
                   "(sub-gradient with averaging)"),
    "data": Key((str,), None, "HDF5 shard file (mpi-dp data synth / prepare), relative to the "
                "working directory"),
    "output": Key((str,), None, "result HDF5 file (default results/<name>.h5)"),
    "seed": Key((int,), 0, "base seed of every random stream"),
    "runs": Key((int,), 1, "Monte-Carlo runs, vectorised along a leading axis"),
    "first_run": Key((int,), 0, "index of the first run (run r of an R-run job equals the "
                     "1-run job with first_run = r)"),
    "T": Key((int,), None, "horizon: iterations = queries answered by each owner"),
    "loss": Key((str,), "squared", "per-record loss", LOSSES),
    "lam": Key(_NUM, 1e-5, "L2 regularisation lambda of g(theta) = lam/2 ||theta||^2"),
    "theta_max": Key(_NUM, 1e5, "box Theta = {||theta||_inf <= theta_max} (inf: no box)"),
    "theta0": Key(_NUM, 0.0, "initial model, every coordinate"),
    "eps": Key(_NUM + (list,), math.inf, "each owner's total budget for all T answers "
               "(scalar or one per owner; inf: no noise)"),
    "n": Key((int, str, list), "all", "records each owner uses: 'all', a number or one per owner "
             "(its first n records)"),
    "n_beyond_shard": Key((str,), "error", "when n asks for more records than an owner holds: "
                          "'error', or 'cap' (use all it holds; recorded as n, with n_requested; "
                          "for small real shards, e.g. the 2,433-row lending sample)",
                          ("error", "cap")),
    "xi": Key(_NUM + (str,), "auto", "L1 clipping bound Xi of a per-record gradient; 'auto': "
              "xi_quantile of the norms on public records at the public optimum"),
    "xi_quantile": Key(_NUM, 0.99, "quantile used by xi = 'auto'"),
    "clip": Key((bool,), True, "clip per-record gradients to L1 norm xi (needed for DP)"),
    "record_every": Key((int,), 1, "record metrics every k iterations (and always at T)"),
}
SECTIONS: dict[str, dict[str, Key]] = {
    "step": {
        "alpha": Key(_NUM, 1.0, "step constant c = alpha / L (alg2: mu_k = c/sqrt(k); "
                     "alg1: mu_k = c/k)"),
        "L": Key(_NUM + (str,), "public", "smoothness constant: 'public' (largest eigenvalue of "
                 "the Hessian on public records) or a number"),
        "schedule": Key((str,), "decreasing", "step decay: 'decreasing' (the spec's 1/k or "
                        "1/sqrt(k)) or 'constant' (eps = inf only)", ("decreasing", "constant")),
        "rho": Key(_NUM + (str,), "auto", "the paper's rho: alg1 mu_k = rho/(k T^2), alg2 "
                   "mu_k = rho/(T sqrt(k)); 'auto' derives it from alpha and L"),
    },
    "average": {
        "kind": Key((str,), "polynomial", "averaging of alg2", ("polynomial", "stepweighted")),
        "eta": Key(_NUM, 3.0, "polynomial-decay parameter (0: uniform running mean)"),
    },
    "sweep": {
        "eps": Key((list,), None, "eps values (each a scalar or a per-owner list); "
                   "configurations are the product eps x n"),
        "n": Key((list,), None, "n values (each a scalar or a per-owner list)"),
    },
    "reference": {
        "solver": Key((str,), "auto", "theta* solver", ("auto", "closed", "scipy", "petsc")),
    },
    "comm": {
        "aggregate": Key((str,), "gather", "how answers reach the learner: gather (each answer "
                         "individually, fixed order: bitwise reproducible) or reduce",
                         ("gather", "reduce")),
    },
}


@dataclasses.dataclass(frozen=True)
class Config:
    """One configuration of a job: per-owner budgets and sizes (resolved once N is known)."""

    index: int
    eps: Any  # scalar or per-owner list, as written
    n: Any  # 'all', scalar or per-owner list, as written

    def label(self, eps: Any = None, n: Any = None) -> str:
        """'eps=1, n=1000'; pass the resolved per-owner values to show 'all' as numbers."""
        return (f"eps={_compact(self.eps if eps is None else eps)}, "
                f"n={_compact(self.n if n is None else n)}")


@dataclasses.dataclass(frozen=True)
class Job:
    """A validated job. `values` maps every key (dotted for sections) to its value."""

    path: str
    text: str
    values: Mapping[str, Any]
    overrides: tuple[str, ...] = ()

    def __getitem__(self, key: str) -> Any:
        return self.values[key]

    @property
    def name(self) -> str:
        return self.values["name"]

    @property
    def output(self) -> Path:
        return Path(self.values["output"])

    @property
    def record_text(self) -> str:
        """The TOML text plus the --set overrides, as stored in the result file."""
        if not self.overrides:
            return self.text
        extra = "\n".join(f"# --set {o}" for o in self.overrides)
        return f"{self.text.rstrip()}\n\n# overrides given on the command line:\n{extra}\n"

    def configs(self) -> list[Config]:
        eps_list = self.values["sweep.eps"] or [self.values["eps"]]
        n_list = self.values["sweep.n"] or [self.values["n"]]
        return [Config(i, e, n) for i, (n, e) in enumerate(itertools.product(n_list, eps_list))]

    @property
    def is_sweep(self) -> bool:
        return bool(self.values["sweep.eps"] or self.values["sweep.n"])

    def to_json(self) -> str:
        return json.dumps(dict(self.values), default=str, sort_keys=True)


def _compact(v: Any) -> str:
    if isinstance(v, list):
        if len(set(map(str, v))) == 1:
            return _compact(v[0])
        return "[" + ",".join(_compact(x) for x in v) + "]"
    if isinstance(v, float):
        return "inf" if math.isinf(v) else f"{v:g}"
    return str(v)


def _err(path: str, key: str, msg: str) -> JobError:
    return JobError(f"job file {path}: key '{key}': {msg}")


def _type_name(types: tuple[type, ...]) -> str:
    names = {int: "integer", float: "number", str: "string", list: "list", bool: "true/false"}
    return " or ".join(dict.fromkeys(names[t] for t in types))


def _check_type(path: str, key: str, spec: Key, value: Any) -> Any:
    ok = isinstance(value, spec.types) and not (isinstance(value, bool) and bool not in spec.types)
    if not ok:
        raise _err(path, key, f"expected {_type_name(spec.types)}, got {type(value).__name__} "
                   f"{value!r}")
    if float in spec.types and isinstance(value, int) and not isinstance(value, bool):
        value = float(value) if int not in spec.types else value
    if spec.choices and value not in spec.choices:
        raise _err(path, key, f"{value!r} is not one of {', '.join(map(repr, spec.choices))}")
    return value


def _unknown(path: str, key: str, known: Sequence[str]) -> JobError:
    close = difflib.get_close_matches(key, known, n=1)
    hint = f" (did you mean '{close[0]}'?)" if close else ""
    return JobError(f"job file {path}: unknown key '{key}'{hint}; known keys: {', '.join(known)}")


def parse_override(item: str) -> tuple[str, Any]:
    """`key=value` with a TOML value (strings may be written bare): ('step.alpha', 0.5)."""
    if "=" not in item:
        raise JobError(f"--set {item!r}: expected key=value, e.g. --set eps=1.0")
    key, raw = (s.strip() for s in item.split("=", 1))
    try:
        value = tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw
    return key, value


def _apply_override(raw: dict[str, Any], key: str, value: Any, path: str) -> None:
    parts = key.split(".")
    if len(parts) == 1:
        raw[key] = value
    elif len(parts) == 2:
        sec = raw.setdefault(parts[0], {})
        if not isinstance(sec, dict):
            raise JobError(f"--set {key}: '{parts[0]}' is not a section in {path}")
        sec[parts[1]] = value
    else:
        raise JobError(f"--set {key}: keys have at most one dot (section.key)")


def _check_per_owner(path: str, key: str, v: Any, kind: str) -> None:
    items = v if isinstance(v, list) else [v]
    if isinstance(v, list) and not v:
        raise _err(path, key, "empty list")
    for x in items:
        if kind == "eps":
            if isinstance(x, bool) or not isinstance(x, int | float) or math.isnan(x) or x <= 0:
                raise _err(path, key, f"budgets must be positive numbers or inf, got {x!r}")
        else:
            if x == "all" and not isinstance(v, list):
                continue
            if isinstance(x, bool) or not isinstance(x, int) or x <= 0:
                raise _err(path, key, f"record counts must be positive integers or 'all', "
                           f"got {x!r}")


def load_job(path: str | Path, overrides: Sequence[str] = ()) -> Job:
    """Read, override and validate a job file. Raises JobError naming the key and the file."""
    p = Path(path)
    spath = str(path)
    try:
        text = p.read_text()
    except FileNotFoundError:
        raise JobError(f"job file {spath} not found") from None
    except OSError as e:
        raise JobError(f"job file {spath}: cannot read: {e.strerror}") from None
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise JobError(f"job file {spath}: not valid TOML: {e}") from None
    for item in overrides:
        key, value = parse_override(item)
        _apply_override(raw, key, value, spath)
    return validate(raw, spath, text, tuple(overrides), stem=p.stem)


def validate(raw: Mapping[str, Any], path: str, text: str = "", overrides: tuple[str, ...] = (),
             stem: str = "job") -> Job:
    known = list(TOP) + list(SECTIONS)
    values: dict[str, Any] = {}
    for key, value in raw.items():
        if key in SECTIONS:
            if not isinstance(value, dict):
                raise _err(path, key, "expected a [section] table")
            sec = SECTIONS[key]
            for sk, sv in value.items():
                if sk not in sec:
                    raise _unknown(path, f"{key}.{sk}", [f"{key}.{k}" for k in sec])
                values[f"{key}.{sk}"] = _check_type(path, f"{key}.{sk}", sec[sk], sv)
        elif key in TOP:
            values[key] = _check_type(path, key, TOP[key], value)
        else:
            raise _unknown(path, key, known)
    for key, spec in TOP.items():
        values.setdefault(key, spec.default)
    for sec, keys in SECTIONS.items():
        for k, spec in keys.items():
            values.setdefault(f"{sec}.{k}", spec.default)

    for req in ("algorithm", "data", "T"):
        if values[req] is None:
            raise _err(path, req, "required but missing")
    values["variant"] = _check_type(
        path, "variant", Key((str,), None, "", ALGORITHMS[values["algorithm"]]), values["variant"]
    )
    values["name"] = values["name"] or stem
    values["output"] = values["output"] or f"results/{values['name']}.h5"
    for key in ("T", "runs", "record_every"):
        if values[key] < 1:
            raise _err(path, key, f"must be at least 1, got {values[key]}")
    if values["first_run"] < 0 or values["seed"] < 0:
        raise _err(path, "seed" if values["seed"] < 0 else "first_run", "must be non-negative")
    if values["lam"] < 0 or math.isnan(values["lam"]):
        raise _err(path, "lam", "must be >= 0")
    if not values["theta_max"] > 0:
        raise _err(path, "theta_max", "must be > 0 (inf for no box)")
    xi = values["xi"]
    if isinstance(xi, str) and xi != "auto":
        raise _err(path, "xi", f"expected a number or 'auto', got {xi!r}")
    if not isinstance(xi, str) and not xi > 0:
        raise _err(path, "xi", "must be > 0")
    if not 0 < values["xi_quantile"] <= 1:
        raise _err(path, "xi_quantile", "must be in (0, 1]")
    for key in ("step.L", "step.rho"):
        v = values[key]
        if isinstance(v, str) and v not in ("public", "auto"):
            raise _err(path, key, f"expected a number or '{'public' if key == 'step.L' else 'auto'}'"
                       f", got {v!r}")
        if not isinstance(v, str) and not v > 0:
            raise _err(path, key, "must be > 0")
    if not values["step.alpha"] > 0:
        raise _err(path, "step.alpha", "must be > 0")
    if values["average.eta"] < 0:
        raise _err(path, "average.eta", "must be >= 0")
    _check_per_owner(path, "eps", values["eps"], "eps")
    _check_per_owner(path, "n", values["n"], "n")
    for kind in ("eps", "n"):
        sweep = values[f"sweep.{kind}"]
        if sweep is not None:
            if not sweep:
                raise _err(path, f"sweep.{kind}", "empty list")
            for i, v in enumerate(sweep):
                _check_per_owner(path, f"sweep.{kind}[{i}]", v, kind)
    return Job(path=path, text=text, values=values, overrides=overrides)


def resolve_per_owner(job: Job, key: str, value: Any, n_owners: int) -> list[Any]:
    """A scalar or per-owner list -> a list of length n_owners (JobError on a length mismatch)."""
    if isinstance(value, list):
        if len(value) != n_owners:
            raise JobError(f"job file {job.path}: key '{key}': {len(value)} values given but the "
                           f"shard file {job['data']} has {n_owners} owners")
        return list(value)
    return [value] * n_owners


def describe_keys() -> str:
    """All job keys with defaults and help, for `mpi-dp run --help`."""
    lines = []
    for k, s in TOP.items():
        lines.append(f"  {k:<16} {s.help} [default: {_compact(s.default)}]")
    for sec, keys in SECTIONS.items():
        lines.append(f"  [{sec}]")
        for k, s in keys.items():
            lines.append(f"    {k:<14} {s.help} [default: {_compact(s.default)}]")
    return "\n".join(lines)
