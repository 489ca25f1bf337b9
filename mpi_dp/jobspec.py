"""TOML job file -> validated, immutable Job; every error names the key and the file.

This module is a leaf: it knows the keys every job has and the keys several methods share, but
not the methods themselves. Each method (mpi_dp.methods) declares which shared keys it reads and
owns its own sections; the loader in mpi_dp.job hands the registry's methods to `validate` here.
A key that the job's method does not read is an error naming the key.

Sweeps (``[sweep] eps = [...]``, ``n = [...]``, ``variant = [...]``) expand into configurations
run one after the other within one job and stored side by side in one result file.
"""

from __future__ import annotations

import dataclasses
import difflib
import itertools
import json
import math
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar, Protocol, TypeVar, cast

try:  # Python >= 3.11
    # ignore: mypy checks for Python 3.10 (pyproject), which has no tomllib; tomli below
    import tomllib  # type: ignore[import-not-found]
except ModuleNotFoundError:  # Python 3.10: the same parser, as the tomli package
    import tomli as tomllib

from . import strict_json
from .backend import BACKENDS
from .errors import JobError


@dataclasses.dataclass(frozen=True)
class Range:
    """The numbers a numeric key accepts, checked where the job is loaded (every number of the
    key: a scalar, each entry of a per-owner list, each value of its sweep axis). NaN and -inf
    never pass; +inf only where `inf` says it means something (eps: no noise, theta_max: no
    box); `integer`: an int, not a float. `str(r)` is the short text of `--help` and errors."""

    lo: float = -math.inf
    hi: float = math.inf
    lo_open: bool = False
    hi_open: bool = False
    inf: bool = False
    integer: bool = False

    def admits(self, x: float) -> bool:
        """Whether the number `x` (int or float, not bool) is in the range."""
        if self.integer and not isinstance(x, int):
            return False
        if math.isnan(x) or x == -math.inf:
            return False
        if x == math.inf:
            return self.inf
        return ((x > self.lo if self.lo_open else x >= self.lo)
                and (x < self.hi if self.hi_open else x <= self.hi))

    def __str__(self) -> str:
        lo = f"{'>' if self.lo_open else '>='} {_g(self.lo)}" if self.lo > -math.inf else ""
        hi = f"{'<' if self.hi_open else '<='} {_g(self.hi)}" if self.hi < math.inf else ""
        if lo and hi:
            bound = (f"in {'(' if self.lo_open else '['}{_g(self.lo)}, {_g(self.hi)}"
                     f"{')' if self.hi_open else ']'}")
        else:
            bound = lo or hi
        if self.integer:
            return "an integer" + (f" {bound}" if bound else "")
        if self.inf:
            return f"{bound or 'a number'} or inf"
        if lo and hi:
            return bound
        return "finite" + (f" and {bound}" if bound else "")


def _g(x: float) -> str:
    return f"{x:g}"


#: the ranges most keys take
FINITE = Range()
NONNEG = Range(lo=0.0)  # finite and >= 0
POSITIVE = Range(lo=0.0, lo_open=True)  # finite and > 0
POSITIVE_OR_INF = Range(lo=0.0, lo_open=True, inf=True)  # > 0, inf meaning 'none' / 'no cap'
COUNT = Range(lo=1, integer=True)  # an integer >= 1
INDEX = Range(lo=0, integer=True)  # an integer >= 0
OPEN_UNIT = Range(0.0, 1.0, lo_open=True, hi_open=True)  # in (0, 1): a delta


def between(lo: float, hi: float, lo_open: bool = False, hi_open: bool = False) -> Range:
    """A finite interval, closed unless said: between(0, 1) = [0, 1]."""
    return Range(lo, hi, lo_open, hi_open)


@dataclasses.dataclass(frozen=True)
class Key:
    """One job key: its type(s), default, a one-line description (shown by `mpi-dp run --help`),
    its choices (strings) and, for a key that takes numbers, the `Range` they must lie in."""

    types: tuple[type, ...]
    default: Any
    help: str
    choices: tuple[Any, ...] | None = None
    within: Range | None = None

    @property
    def numeric(self) -> bool:
        """Whether the key takes numbers (bool is not one): it must declare a `within` Range."""
        return int in self.types or float in self.types


_NUM = (int, float)


def key(types: tuple[type, ...], default: Any, help: str,
        choices: tuple[Any, ...] | None = None, within: Range | None = None) -> Any:
    """A field of a typed job section (`Section`): its value's default and the `Key` that
    `--help` and validation read (`within`: the numbers it accepts, for a numeric key)."""
    meta = {"key": Key(tuple(types), default, help, choices, within)}
    if isinstance(default, list | dict):
        return dataclasses.field(default_factory=lambda: type(default)(default), metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


class Section:
    """Base of a typed job section: a frozen dataclass (`@dataclasses.dataclass(frozen=True)`)
    whose fields, declared with `key(...)`, are the section's keys. `keys()` gives the Key table
    the loader validates and `--help` prints; `of(job)` the validated values as attributes
    (`s.gamma`, not `job["admm.gamma"]`). NAME is the TOML table ('' for top-level keys)."""

    NAME: ClassVar[str] = ""

    @classmethod
    def keys(cls) -> dict[str, Key]:
        return {f.name: f.metadata["key"] for f in dataclasses.fields(cls)}  # type: ignore[arg-type]

    @classmethod
    def key_name(cls, field: str) -> str:
        """The job's name of a field: 'admm.gamma', or 'T' for a top-level key."""
        return f"{cls.NAME}.{field}" if cls.NAME else field

    @classmethod
    def of(cls, job: Job) -> Any:
        """The section's values in `job` (every key was validated by the loader)."""
        return cls(**{f.name: job.values[cls.key_name(f.name)]
                      for f in dataclasses.fields(cls)})  # type: ignore[arg-type]

@dataclasses.dataclass(frozen=True)
class GenericKeys(Section):
    """The keys every job has, whatever its method (`job.generic.T`, `.runs`, `.seed` ...)."""

    NAME: ClassVar[str] = ""
    name: str = key((str,), None, "job name (defaults to the file's stem)")
    algorithm: str = key((str,), None, "method to run (see the methods below)")
    variant: str = key((str,), None, "the method's variant (each method lists its own; default: "
                       "the method's first)")
    data: str = key((str,), None, "HDF5 shard file (mpi-dp data synth / prepare), relative to "
                    "the working directory")
    output: str = key((str,), None, "result HDF5 file (default results/<name>.h5)")
    seed: int = key((int,), 0, "base seed of every random stream", within=INDEX)
    runs: int = key((int,), 1, "Monte-Carlo runs, vectorised along a leading axis",
                    within=COUNT)
    first_run: int = key((int,), 0, "index of the first run (run r of an R-run job equals the "
                         "1-run job with first_run = r)", within=INDEX)
    T: int = key((int,), None, "horizon (iterations; each method says what it counts)",
                 within=COUNT)
    eps: float | list = key(
        _NUM + (list,), math.inf, "each owner's total privacy budget: the eps of the "
        "(eps, delta)-DP guarantee every owner (peer) gets for its records over a whole "
        "configuration, composed over every release that depends on them (replace-one "
        "neighbouring datasets; scalar or one per owner; inf: no noise)",
        within=POSITIVE_OR_INF)
    n: int | str | list = key((int, str, list), "all", "records each owner uses: 'all', a number "
                              "or one per owner (its first n records)", within=COUNT)
    n_beyond_shard: str = key((str,), "error", "when n asks for more records than an owner "
                              "holds: 'error', or 'cap' (use all it holds; recorded as n, with "
                              "n_requested; for small real shards, e.g. the 2,433-row lending "
                              "sample)", ("error", "cap"))
    record_every: int = key((int,), 1, "record metrics every k iterations (and always at T); "
                            "sync_star: 0 records nothing (no evaluation-only passes, final "
                            "models only)", within=INDEX)


@dataclasses.dataclass(frozen=True)
class SweepKeys(Section):
    """The generic axes of [sweep] (a method adds its own: shared owners, method keys)."""

    NAME: ClassVar[str] = "sweep"
    eps: list | None = key((list,), None, "eps values (each a scalar or a per-owner list); "
                           "configurations are the product variant x owners x n x eps",
                           within=POSITIVE_OR_INF)
    n: list | None = key((list,), None, "n values (each a scalar or a per-owner list)",
                         within=COUNT)
    variant: list | None = key((list,), None, "variants of the method side by side")


@dataclasses.dataclass(frozen=True)
class PrivacyKeys(Section):
    """The [privacy] section: each owner's delta and how the noise meets (eps, delta)."""

    NAME: ClassVar[str] = "privacy"
    delta: float | str = key(_NUM + (str,), "auto", "each owner's total delta, beside eps "
                             "('auto': the largest power of ten <= 1/(10 n_i) for an owner of n_i "
                             "records; a delta >= 1/n_i is refused)", within=OPEN_UNIT)
    calibration: str = key((str,), "pld", "how the per-release noise meets (eps, delta): pld "
                           "(tight: privacy loss distributions, dp-accounting), basic (even "
                           "split eps/k of basic composition) or paper (each method's paper "
                           "rule, bit for bit: see the method's 'paper rule' below)",
                           ("pld", "basic", "paper"))


@dataclasses.dataclass(frozen=True)
class SharedKeys(Section):
    """The shared top-level keys a method reads: `job.section(SharedKeys).loss`; only those the
    job's method lists in `reads` are in a job (the others read as None)."""

    NAME: ClassVar[str] = ""
    loss: str = key((str,), "squared", "per-record loss", ("squared", "hinge", "logistic"))
    lam: float = key(_NUM, 1e-5, "L2 regularisation lambda of g(theta) = lam/2 ||theta||^2",
                     within=NONNEG)
    theta_max: float = key(_NUM, 1e5, "box Theta = {||theta||_inf <= theta_max} (inf: no box)",
                           within=POSITIVE_OR_INF)
    theta0: float = key(_NUM, 0.0, "initial model, every coordinate", within=FINITE)
    owners: int | str = key((int, str), "all", "owners taking part: 'all' or a number N (the "
                            "first N owners of the shard file; psi is scored on the "
                            "participants' records)", within=COUNT)
    xi: float | str = key(_NUM + (str,), "auto", "L1 clipping bound Xi of a per-record "
                          "gradient; 'auto': xi_quantile of the norms on public records at the "
                          "public optimum (no clipping: clip = false)", within=POSITIVE)
    xi_quantile: float = key(_NUM, 0.99, "quantile used by xi = 'auto'",
                             within=between(0, 1, lo_open=True))
    clip: bool = key((bool,), True, "clip per-record gradients to L1 norm xi (needed for DP)")
    backend: str = key((str,), "numpy", "array backend of the heavy kernels: numpy (the CPU), "
                       "cupy (one GPU per rank: the records move to the GPU once per "
                       "configuration; noise, ledgers and MPI stay on the host, so a GPU run "
                       "uses the CPU run's noise) or array_api_strict (the array API standard's "
                       "reference namespace on the CPU: a test stand-in for a device)", BACKENDS)

    @classmethod
    def of(cls, job: Job) -> SharedKeys:
        values: dict[str, Any] = {k: job.values.get(k) for k in cls.keys()}
        return cls(**values)


@dataclasses.dataclass(frozen=True)
class StepKeys(Section):
    """The shared [step] section: the step size of the star methods."""

    NAME: ClassVar[str] = "step"
    alpha: float = key(_NUM, 1.0, "step constant c = alpha / L (alg2: mu_k = c/sqrt(k); "
                       "alg1: mu_k = c/k)", within=POSITIVE)
    L: float | str = key(_NUM + (str,), "public", "smoothness constant: 'public' (largest "
                         "eigenvalue of the Hessian on public records) or a number",
                         within=POSITIVE)
    schedule: str = key((str,), "decreasing", "step decay: 'decreasing' (the spec's 1/k or "
                        "1/sqrt(k)) or 'constant' (eps = inf only)", ("decreasing", "constant"))
    rho: float | str = key(_NUM + (str,), "auto", "the paper's rho: alg1 mu_k = rho/(k T^2), "
                           "alg2 mu_k = rho/(T sqrt(k)), async_star a_own = N rho/(T^2 lam); "
                           "'auto' derives it from alpha (sync) or async.gamma (async) and L",
                           within=POSITIVE)


@dataclasses.dataclass(frozen=True)
class ReferenceKeys(Section):
    """The shared [reference] section: the evaluation-only optimum theta*."""

    NAME: ClassVar[str] = "reference"
    solver: str = key((str,), "auto", "theta* solver; none: no theta* (psi, psi_iterate, "
                      "dist_sq, the isolated optima and theta*'s utility are not recorded: a "
                      "short exploring run starts at once)",
                      ("auto", "closed", "scipy", "petsc", "none"))
    isolated: int = key((int,), 256, "owners 0..k-1 get their isolated optimum and its psi "
                        "(reference/psi_isolated; NaN beyond k): each costs one evaluation over "
                        "every record, so all 10,000 owners would cost O(N^2)", within=INDEX)


@dataclasses.dataclass(frozen=True)
class CommKeys(Section):
    """The shared [comm] section: how answers reach the learner."""

    NAME: ClassVar[str] = "comm"
    aggregate: str = key((str,), "gather", "how answers reach the learner: gather (each answer "
                         "individually, fixed order: bitwise reproducible) or reduce",
                         ("gather", "reduce"))


#: Keys every job has, whatever its method, and its generic sections.
GENERIC: dict[str, Key] = GenericKeys.keys()
GENERIC_SECTIONS: dict[str, dict[str, Key]] = {"sweep": SweepKeys.keys(),
                                               "privacy": PrivacyKeys.keys()}
#: Keys several methods share; a method lists the ones it reads (`Method.reads`).
SHARED: dict[str, Key] = SharedKeys.keys()
SHARED_SECTIONS: dict[str, dict[str, Key]] = {
    "step": StepKeys.keys(), "reference": ReferenceKeys.keys(), "comm": CommKeys.keys(),
    "sweep": {
        "owners": Key((list,), None, "numbers of participating owners N (configurations are the "
                      "product variant x owners x n x eps)", within=COUNT),
    },
}


class MethodSpec(Protocol):
    """What the job loader needs of a method (mpi_dp.methods.base.Method provides it)."""

    name: str
    summary: str
    variants: tuple[str, ...]
    variant_help: str
    reads: tuple[str, ...]
    sections: Mapping[str, Mapping[str, Key]]
    legacy_keys: Mapping[str, str]
    variant_aliases: Mapping[str, str | None]
    label_variant: bool
    key_help: Mapping[str, str]
    sweeps: tuple[str, ...]
    records_optional: bool
    paper_rule: str

    def validate(self, values: dict[str, Any], path: str) -> None: ...


@dataclasses.dataclass(frozen=True)
class Config:
    """One configuration of a job: per-owner budgets and sizes (resolved once N is known)."""

    index: int
    eps: Any  # scalar or per-owner list, as written
    n: Any  # 'all', scalar or per-owner list, as written
    owners: Any = "all"  # 'all' or the number of participating owners
    variant: str = ""  # the method's variant of this configuration
    show_variant: bool = False  # name the variant in the label
    params: tuple[tuple[str, Any], ...] = ()  # method sweep axes: (key, value), e.g. dola.rho

    def param(self, key: str, default: Any) -> Any:
        """The value of a method key in this configuration (swept, else the job's)."""
        return dict(self.params).get(key, default)

    def label(self, eps: Any = None, n: Any = None) -> str:
        """'eps=1, n=1000' ('N=8, eps=...' with owners); pass resolved values to show numbers."""
        head = "" if self.owners == "all" else f"N={self.owners}, "
        head = (f"{self.variant}, " if self.show_variant and self.variant else "") + head
        tail = "".join(f", {k.rsplit('.', 1)[-1]}={_compact(v)}" for k, v in self.params)
        return (f"{head}eps={_compact(self.eps if eps is None else eps)}, "
                f"n={_compact(self.n if n is None else n)}{tail}")


@dataclasses.dataclass(frozen=True)
class Job:
    """A validated job. `values` maps every key its method reads (dotted for sections) to a value."""

    path: str
    text: str
    values: Mapping[str, Any]
    overrides: tuple[str, ...] = ()
    label_variant: bool = False
    notes: tuple[str, ...] = ()  # e.g. old key names that were read under their new names
    method_sweeps: tuple[str, ...] = ()  # method keys with a sweep axis (sweep.<last part>)

    def __getitem__(self, key: str) -> Any:
        return self.values[key]

    def section(self, cls: type[S]) -> S:
        """A typed section of the job (`Section` subclass): `job.section(AdmmKeys).gamma`."""
        return cls.of(self)

    @property
    def generic(self) -> GenericKeys:
        """The keys every job has, typed (`job.generic.T`, `.runs`, `.seed` ...)."""
        return GenericKeys.of(self)

    def get(self, key: str, default: Any = None) -> Any:
        return self.values.get(key, default)

    @property
    def name(self) -> str:
        return self.values["name"]

    @property
    def algorithm(self) -> str:
        return self.values["algorithm"]

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

    def axis(self, key: str) -> list[Any] | None:
        """The values of `key`'s [sweep] axis (`key`: 'eps', 'n', 'owners', 'variant' or a
        method key such as 'dola.graph'), None where the job does not sweep it."""
        return self.values.get(sweep_key(key)) or None

    def swept(self, key: str, value: Any) -> list[Any]:
        """Every value `key` takes in the job: its sweep axis, else [value] (its one value)."""
        return self.axis(key) or [value]

    def sweep(self) -> dict[str, Any]:
        """The sweep axes that are set, e.g. {'eps': [1, 10]}."""
        return {k.split(".", 1)[1]: v for k, v in self.values.items()
                if k.startswith("sweep.") and v}

    def configs(self) -> list[Config]:
        eps_list = self.values["sweep.eps"] or [self.values["eps"]]
        n_list = self.values["sweep.n"] or [self.values["n"]]
        own_list = self.values.get("sweep.owners") or [self.values.get("owners", "all")]
        var_list = self.values["sweep.variant"] or [self.values["variant"]]
        show = self.label_variant or bool(self.values["sweep.variant"])
        extra = [(key, self.values[sweep_key(key)]) for key in self.method_sweeps
                 if self.values.get(sweep_key(key))]
        grids = [[(key, v) for v in vals] for key, vals in extra]
        return [Config(i, e, n, o, v, show, tuple(ps)) for i, (v, o, n, e, *ps)
                in enumerate(itertools.product(var_list, own_list, n_list, eps_list, *grids))]

    @property
    def is_sweep(self) -> bool:
        return bool(self.sweep())

    def to_json(self) -> str:
        """The resolved values as strict JSON (infinity as the string "Infinity")."""
        return strict_json.dumps(dict(self.values), sort_keys=True)


def _compact(v: Any) -> str:
    if isinstance(v, list):
        if len(set(map(str, v))) == 1:
            return _compact(v[0])
        if len(v) > 8 and all(isinstance(x, int | float) for x in v):  # e.g. 105 writers' sizes
            return f"[{len(v)} values, {_compact(min(v))}..{_compact(max(v))}]"
        return "[" + ",".join(_compact(x) for x in v) + "]"
    if isinstance(v, float):
        return "inf" if math.isinf(v) else f"{v:g}"
    return str(v)


def sweep_key(key: str) -> str:
    """The [sweep] key of a method key a method lets jobs sweep: 'dola.rho' -> 'sweep.rho'."""
    return f"sweep.{key.rsplit('.', 1)[-1]}"


def err(path: str, key: str, msg: str) -> JobError:
    """JobError naming the file and the key."""
    return JobError(f"job file {path}: key '{key}': {msg}")


def _type_name(types: tuple[type, ...]) -> str:
    names = {int: "integer", float: "number", str: "string", list: "list", bool: "true/false"}
    return " or ".join(dict.fromkeys(names[t] for t in types))


def check_type(path: str, key: str, spec: Key, value: Any) -> Any:
    """The value if it has one of the key's types (ints widened to float for number keys)."""
    ok = isinstance(value, spec.types) and not (isinstance(value, bool) and bool not in spec.types)
    if not ok:
        raise err(path, key, f"expected {_type_name(spec.types)}, got {type(value).__name__} "
                  f"{value!r}")
    if float in spec.types and isinstance(value, int) and not isinstance(value, bool):
        value = float(value) if int not in spec.types else value
    if spec.choices and value not in spec.choices:
        raise err(path, key, f"{value!r} is not one of {', '.join(map(repr, spec.choices))}")
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


def check_per_owner(path: str, key: str, v: Any, kind: str) -> None:
    """Budgets (kind 'eps') or record counts ('n'): a scalar or a non-empty per-owner list."""
    items = v if isinstance(v, list) else [v]
    if isinstance(v, list) and not v:
        raise err(path, key, "empty list")
    for x in items:
        if kind == "eps":
            if isinstance(x, bool) or not isinstance(x, int | float) or math.isnan(x) or x <= 0:
                raise err(path, key, f"budgets must be positive numbers or inf, got {x!r}")
        else:
            if x == "all" and not isinstance(v, list):
                continue
            if isinstance(x, bool) or not isinstance(x, int) or x <= 0:
                raise err(path, key, f"record counts must be positive integers or 'all', "
                          f"got {x!r}")


def _check_owners(path: str, key: str, v: Any) -> None:
    if v == "all":
        return
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise err(path, key, f"expected 'all' or a positive number of owners, got {v!r}")


def _flatten(raw: Mapping[str, Any]) -> dict[str, Any]:
    """{'step': {'alpha': 1}} -> {'step.alpha': 1}; a section must be a table."""
    flat: dict[str, Any] = {}
    for key, value in raw.items():
        if isinstance(value, dict):
            for sk, sv in value.items():
                flat[f"{key}.{sk}"] = sv
        else:
            flat[key] = value
    return flat


def _catalogue(methods: Mapping[str, MethodSpec]) -> dict[str, tuple[Key, str | None]]:
    """Every key any method may read -> (Key, owning method or None for generic/shared)."""
    out: dict[str, tuple[Key, str | None]] = {}
    for k, spec in GENERIC.items():
        out[k] = (spec, None)
    for table in (GENERIC_SECTIONS, SHARED_SECTIONS):
        for sec, keys in table.items():
            for k, spec in keys.items():
                out[f"{sec}.{k}"] = (spec, None)
    for k, spec in SHARED.items():
        out[k] = (spec, None)
    for m in methods.values():
        for sec, own in m.sections.items():
            for k, spec in own.items():
                out[f"{sec}.{k}"] = (spec, m.name)
    return out


def method_keys(m: MethodSpec) -> dict[str, Key]:
    """Every key a job of method `m` may hold, dotted, with its spec (`m.reads` resolved)."""
    keys: dict[str, Key] = dict(GENERIC)
    for sec, table in GENERIC_SECTIONS.items():
        keys.update({f"{sec}.{k}": s for k, s in table.items()})
    shared = dict(SHARED)
    for sec, table in SHARED_SECTIONS.items():
        shared.update({f"{sec}.{k}": s for k, s in table.items()})
    for name in m.reads:
        if name.endswith(".*"):
            sec = name[:-2]
            keys.update({f"{sec}.{k}": s for k, s in SHARED_SECTIONS[sec].items()})
        else:
            keys[name] = shared[name]
    for sec, own in m.sections.items():
        keys.update({f"{sec}.{k}": s for k, s in own.items()})
    for key in m.sweeps:
        base = keys[key]
        keys[sweep_key(key)] = Key((list,), None, f"values of {key} (one configuration each)",
                                   within=base.within or (FINITE if base.numeric else None))
    return keys


def _migrate(flat: dict[str, Any], m: MethodSpec, path: str) -> list[str]:
    """Old key names and variant aliases of method `m` -> today's; returns notes for the user."""
    notes = []
    for old, new in m.legacy_keys.items():
        if old in flat:
            if new in flat:
                raise err(path, old, f"is the old name of '{new}'; give only '{new}'")
            flat[new] = flat.pop(old)
            notes.append(f"key '{old}' is the old name of '{new}' (read as '{new}')")
    v = flat.get("variant")
    if isinstance(v, str) and v in m.variant_aliases:
        flat["variant"] = m.variant_aliases[v]
        if flat["variant"] is None:
            del flat["variant"]
        notes.append(f"variant {v!r} is an old name; the variant is now "
                     f"{flat.get('variant', m.variants[0])!r}")
    return notes


def check_ranges(path: str, values: Mapping[str, Any], keys: Mapping[str, Key]) -> None:
    """Every number of the job inside its key's declared `Range` (a numeric key that declares
    none must at least be finite): scalars, per-owner lists and sweep axes entry by entry; words
    ('auto', 'all') are the other checks'. JobError naming the key, the value and the range."""
    for name, spec in keys.items():
        if spec.within is not None or spec.numeric:
            _check_numbers(path, name, values.get(name), spec.within or FINITE)


def _check_numbers(path: str, key: str, v: Any, within: Range) -> None:
    if isinstance(v, list):
        for i, x in enumerate(v):
            _check_numbers(path, f"{key}[{i}]", x, within)
    elif isinstance(v, int | float) and not isinstance(v, bool) and not within.admits(v):
        raise JobError(f"job file {path}: key '{key}' = {v!r}: must be {within}")


#: Checks of generic and shared keys with their own messages, applied when the job's method
#: reads the key (before the declared ranges: `check_ranges`).
def _positive_int(path: str, values: dict, key: str) -> None:
    if values[key] < 1:
        raise err(path, key, f"must be at least 1, got {values[key]}")


def _check_record_every(path: str, values: dict, key: str, m: MethodSpec) -> None:
    v = values[key]
    if v == 0 and m.records_optional:
        return  # no evaluation-only records: the method's cost alone (final models, ledgers)
    if v < 1:
        zero = "; 0 (no records) is not offered by this method" if v == 0 else ""
        raise err(path, key, f"must be at least 1, got {v}{zero}")


def _check_xi(path: str, values: dict, key: str) -> None:
    xi = values[key]
    if isinstance(xi, str) and xi != "auto":
        raise err(path, key, f"expected a number or 'auto', got {xi!r}")
    if not isinstance(xi, str) and not xi > 0:
        raise err(path, key, "must be > 0")


def _check_word_or_positive(word: str) -> Callable[[str, dict, str], None]:
    def check(path: str, values: dict, key: str) -> None:
        v = values[key]
        if isinstance(v, str) and v != word:
            raise err(path, key, f"expected a number or '{word}', got {v!r}")
        if not isinstance(v, str) and not v > 0:
            raise err(path, key, "must be > 0")
    return check


def _check_word_or_range(word: str, lo: float, hi: float, what: str):
    """A key that is `word` or a number in the open interval (lo, hi)."""
    def check(path: str, values: dict, key: str) -> None:
        v = values[key]
        if isinstance(v, str):
            if v != word:
                raise err(path, key, f"{what}, got {v!r}")
        elif math.isnan(v) or not lo < v < hi:
            raise err(path, key, what)
    return check


def _check_range(lo: float, hi: float, lo_open: bool, hi_open: bool, what: str):
    def check(path: str, values: dict, key: str) -> None:
        v = values[key]
        ok = (v > lo if lo_open else v >= lo) and (v < hi if hi_open else v <= hi)
        if (isinstance(v, float) and math.isnan(v)) or not ok:
            raise err(path, key, what)
    return check


CHECKS: dict[str, Callable[[str, dict, str], None]] = {
    "T": _positive_int,
    "runs": _positive_int,
    "seed": _check_range(0, math.inf, False, True, "must be non-negative"),
    "first_run": _check_range(0, math.inf, False, True, "must be non-negative"),
    "xi": _check_xi,
    "step.L": _check_word_or_positive("public"),
    "step.rho": _check_word_or_positive("auto"),
    "privacy.delta": _check_word_or_range("auto", 0, 1, "must be 'auto' or a number in (0, 1)"),
}


def validate(raw: Mapping[str, Any], path: str, methods: Mapping[str, MethodSpec],
             text: str = "", overrides: tuple[str, ...] = (), stem: str = "job") -> Job:
    """Check a parsed job against its method's keys; fill defaults. Raises JobError."""
    known_sections = set(GENERIC_SECTIONS) | set(SHARED_SECTIONS) | {
        s for m in methods.values() for s in m.sections}
    for key, value in raw.items():
        if key in known_sections and not isinstance(value, dict):
            raise err(path, key, "expected a [section] table")
    alg = raw.get("algorithm")
    if alg is None:
        raise err(path, "algorithm", f"required but missing (one of {', '.join(methods)})")
    alg = check_type(path, "algorithm", GENERIC["algorithm"], alg)
    if alg not in methods:
        raise err(path, "algorithm", f"{alg!r} is not one of {', '.join(map(repr, methods))}")
    m = methods[alg]
    flat = _flatten(raw)
    notes = _migrate(flat, m, path)
    allowed = method_keys(m)
    catalogue = _catalogue(methods)
    values: dict[str, Any] = {}
    for key, value in flat.items():
        if key not in allowed:
            if key in catalogue:
                owner = catalogue[key][1]
                sec = key.split(".", 1)[0]
                if owner is not None and "." in key and all(
                        f"{sec}.{k}" not in allowed for k in methods[owner].sections.get(sec, {})):
                    raise err(path, sec, f"the [{sec}] section belongs to algorithm '{owner}', "
                              f"not '{alg}'")
                readers = [n for n, o in methods.items() if key in method_keys(o)]
                whose = ", ".join(readers) or "no method"
                raise err(path, key, f"is not read by algorithm '{alg}' (only {whose} "
                          f"read{'s' if len(readers) == 1 else ''} it); remove it")
            raise _unknown(path, key, sorted(allowed))
        values[key] = check_type(path, key, allowed[key], value)
    for key, spec in allowed.items():
        values.setdefault(key, spec.default)

    for req in ("data", "T"):
        if values[req] is None:
            raise err(path, req, "required but missing")
    values["variant"] = check_type(path, "variant", Key((str,), None, "", m.variants),
                                   values["variant"] or m.variants[0])
    values["name"] = values["name"] or stem
    values["output"] = values["output"] or f"results/{values['name']}.h5"
    for key, check in CHECKS.items():
        if key in values:
            check(path, values, key)
    if "record_every" in values:
        _check_record_every(path, values, "record_every", m)
    if "owners" in values:
        _check_owners(path, "owners", values["owners"])
    if values.get("sweep.owners") is not None:
        if not values["sweep.owners"]:
            raise err(path, "sweep.owners", "empty list")
        for i, v in enumerate(values["sweep.owners"]):
            _check_owners(path, f"sweep.owners[{i}]", v)
    check_per_owner(path, "eps", values["eps"], "eps")
    check_per_owner(path, "n", values["n"], "n")
    for kind in ("eps", "n"):
        sweep = values[f"sweep.{kind}"]
        if sweep is not None:
            if not sweep:
                raise err(path, f"sweep.{kind}", "empty list")
            for i, v in enumerate(sweep):
                check_per_owner(path, f"sweep.{kind}[{i}]", v, kind)
    if values["sweep.variant"] is not None:
        if not values["sweep.variant"]:
            raise err(path, "sweep.variant", "empty list")
        variants = []
        for i, v in enumerate(values["sweep.variant"]):
            name = m.variant_aliases.get(v, v) if isinstance(v, str) else v
            if name not in m.variants:
                raise err(path, f"sweep.variant[{i}]", f"{v!r} is not one of "
                          f"{', '.join(map(repr, m.variants))}")
            variants.append(name)
        values["sweep.variant"] = variants
    for key in m.sweeps:
        skey = sweep_key(key)
        if values.get(skey) is not None:
            if not values[skey]:
                raise err(path, skey, "empty list")
            values[skey] = [check_type(path, f"{skey}[{i}]", allowed[key], v)
                            for i, v in enumerate(values[skey])]
            for v in values[skey]:
                m.validate({**values, key: v}, path)
    m.validate(values, path)
    check_ranges(path, values, allowed)
    return Job(path=path, text=text, values=values, overrides=overrides,
               label_variant=m.label_variant, notes=tuple(notes),
               method_sweeps=tuple(m.sweeps))


def read(path: str | Path, overrides: Sequence[str], methods: Mapping[str, MethodSpec]) -> Job:
    """Read, override and validate a job file. Raises JobError naming the key and the file."""
    p = Path(path)
    spath = str(path)
    try:
        text = p.read_text()
    except FileNotFoundError:
        raise JobError(f"job file {spath} not found") from None
    except OSError as e:
        raise JobError(f"job file {spath}: cannot read: {e.strerror}") from None
    except UnicodeDecodeError as e:
        raise JobError(f"job file {spath}: not a UTF-8 text file (byte {e.start}); a job file "
                       "is TOML text, e.g. jobs/demo.toml") from None
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise JobError(f"job file {spath}: not valid TOML: {e}") from None
    for item in overrides:
        key, value = parse_override(item)
        swept = raw.get("sweep")
        if "." not in key and isinstance(swept, dict) and key in swept:
            raise JobError(f"job file {spath}: --set {key}=...: '{key}' is swept in [sweep] "
                           f"(the sweep would ignore it); set the sweep instead, e.g. --set "
                           f"'sweep.{key}=[{json.dumps(value, default=str)}]'")
        _apply_override(raw, key, value, spath)
    return validate(raw, spath, methods, text, tuple(overrides), stem=p.stem)


def resolve_per_owner(job: Job, key: str, value: Any, n_owners: int,
                      n_file: int | None = None) -> list[Any]:
    """A scalar or per-owner list -> a list of length n_owners (JobError on a length mismatch).

    With `n_file` (the shard file's owners, when only the first n_owners take part) a list may
    also give one value per owner of the file; the first n_owners are used.
    """
    if isinstance(value, list):
        if len(value) == n_owners:
            return list(value)
        if n_file is not None and len(value) == n_file:
            return list(value[:n_owners])
        taking = f" ({n_owners} of them take part)" if n_file not in (None, n_owners) else ""
        raise JobError(f"job file {job.path}: key '{key}': {len(value)} values given but the "
                       f"shard file {job['data']} has {n_file or n_owners} owners{taking}")
    return [value] * n_owners


def _key_lines(keys: Mapping[str, Key], indent: str, overrides: Mapping[str, str] = {}) -> list[str]:
    lines: list[str] = []
    section = None
    for k, s in keys.items():
        sec, _, short = k.rpartition(".")
        if sec != section and sec:
            lines.append(f"{indent}[{sec}]")
        section = sec
        pad = indent + ("  " if sec else "")
        notes = ([str(s.within)] if s.within is not None else []) + (
            [] if s.default is None else [f"default: {_compact(s.default)}"])
        tail = f" [{'; '.join(notes)}]" if notes else ""
        lines.append(f"{pad}{short:<16} {overrides.get(k, s.help)}{tail}")
    return lines


def describe_keys(methods: Mapping[str, MethodSpec]) -> str:
    """Every job key with its default and help, generic first, then per method (`run --help`)."""
    generic: dict[str, Key] = dict(GENERIC)
    for sec, table in GENERIC_SECTIONS.items():
        generic.update({f"{sec}.{k}": s for k, s in table.items()})
    shared: dict[str, Key] = dict(SHARED)
    for sec, table in SHARED_SECTIONS.items():
        shared.update({f"{sec}.{k}": s for k, s in table.items()})
    lines = ["(in brackets: the numbers a key accepts, checked when the job is loaded, and its "
             "default)", "Keys of every job:"] + _key_lines(generic, "  ")
    lines += ["", "Keys some methods read (each method lists its own below):"]
    lines += _key_lines(shared, "  ")
    for m in methods.values():
        lines += ["", f"algorithm = \"{m.name}\": {m.summary}",
                  f"  variant: {m.variant_help}"]
        if getattr(m, "paper_rule", ""):
            lines.append(f"  paper rule (privacy.calibration = 'paper'): {m.paper_rule}")
        if m.reads:
            lines.append(f"  also reads: {', '.join(m.reads)}")
        for k, h in m.key_help.items():
            lines.append(f"  {k}: {h}")
        own: dict[str, Key] = {}
        for sec, m_table in m.sections.items():
            own.update({f"{sec}.{k}": s for k, s in m_table.items()})
        lines += _key_lines(own, "  ")
    return "\n".join(lines)


S = TypeVar("S", bound=Section)


def section_class(name: str, table: str, keys: Mapping[str, Key]) -> type[Section]:
    """A frozen Section dataclass of a Key table (the generic and shared tables, and p2p's section,
    are declared as tables; their typed views are made from them: fields typed Any)."""
    fields = [(k, Any, dataclasses.field(
        default=None, metadata={"key": v})) for k, v in keys.items()]
    cls = cast(type[Section],
               dataclasses.make_dataclass(name, fields, bases=(Section,), frozen=True))
    cls.NAME = table
    return cls
