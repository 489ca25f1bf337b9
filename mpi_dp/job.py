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

#: algorithm -> its variants; the first listed in DEFAULT_VARIANT is used when `variant` is absent.
ALGORITHMS = {"sync_star": ("alg1", "alg2"), "async_star": ("proof", "printed"),
              "admm": ("iadmm",)}
DEFAULT_VARIANT = {"sync_star": "alg2", "async_star": "proof", "admm": "iadmm"}
#: sections that only make sense for one algorithm (setting them elsewhere is an error)
ALGORITHM_SECTIONS = {"average": "sync_star", "async": "async_star", "admm": "admm"}
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
    "variant": Key((str,), None, "algorithm variant. sync_star: alg1 (decreasing steps, smooth "
                   "f) or alg2 (sub-gradient with averaging; default). async_star: the central "
                   "step c_L of (7): proof (rho/(2 T^2 sigma), default) or printed "
                   "((N-1) rho/(N T^2 sigma))"),
    "data": Key((str,), None, "HDF5 shard file (mpi-dp data synth / prepare), relative to the "
                "working directory"),
    "output": Key((str,), None, "result HDF5 file (default results/<name>.h5)"),
    "seed": Key((int,), 0, "base seed of every random stream"),
    "runs": Key((int,), 1, "Monte-Carlo runs, vectorised along a leading axis"),
    "first_run": Key((int,), 0, "index of the first run (run r of an R-run job equals the "
                     "1-run job with first_run = r)"),
    "T": Key((int,), None, "horizon: iterations (sync_star: queries answered by each owner; "
                "async_star: learner updates over all owners)"),
    "loss": Key((str,), "squared", "per-record loss", LOSSES),
    "lam": Key(_NUM, 1e-5, "L2 regularisation lambda of g(theta) = lam/2 ||theta||^2"),
    "theta_max": Key(_NUM, 1e5, "box Theta = {||theta||_inf <= theta_max} (inf: no box)"),
    "theta0": Key(_NUM, 0.0, "initial model, every coordinate"),
    "eps": Key(_NUM + (list,), math.inf, "each owner's total budget for all T answers "
               "(scalar or one per owner; inf: no noise)"),
    "n": Key((int, str, list), "all", "records each owner uses: 'all', a number or one per owner "
             "(its first n records)"),
    "owners": Key((int, str), "all", "owners taking part: 'all' or a number N (the first N owners "
                  "of the shard file; psi is scored on the participants' records)"),
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
                   "mu_k = rho/(T sqrt(k)), async_star a_own = N rho/(T^2 lam); 'auto' derives it "
                   "from alpha (sync) or async.gamma (async) and L"),
    },
    "async": {
        "mode": Key((str,), "replay", "replay: a seeded schedule decides who is served (bitwise "
                    "reproducible); live: owners' Poisson clocks tick in wall time", ("replay", "live")),
        "scheduler": Key((str,), "poisson", "replay schedule: poisson (independent clocks of rate "
                         "async.rates, t_1 = 0) or uniform (i_k ~ U, t_k = k - 1)",
                         ("poisson", "uniform")),
        "rates": Key(_NUM + (list,), 1.0, "Poisson clock rate lambda_j of each owner (scalar or "
                     "one per owner; unequal rates leave the paper's 1/N law)"),
        "schedule_from": Key((str,), "", "replay the schedule logged in this result file (e.g. of "
                             "a live run): same configuration index, run 0's schedule for all runs"),
        "protocol": Key((str,), "owner_request", "live mode: owner_request (an owner asks when its "
                        "clock ticks) or learner_broadcast (the learner polls; the first owner to "
                        "claim is served)", ("owner_request", "learner_broadcast")),
        "clock_unit_s": Key(_NUM, 0.01, "live mode: seconds per unit of clock time (ticks are "
                            "Exp(lambda) x clock_unit_s apart; when owners tick faster than the "
                            "learner serves, requests queue and service is near round-robin)"),
        "poll_interval_s": Key(_NUM, 0.0005, "live learner_broadcast: seconds between polls when "
                               "no owner claimed"),
        "per_owner_cap": Key((int, list), 0, "answers each owner gives before it declines: 0 = T "
                             "(the spec's default, b_i = 2 xi T/(n_i eps_i)); m_i > 0 gives "
                             "b_i = 2 xi m_i/(n_i eps_i) (scalar or one per owner)"),
        "gamma": Key(_NUM, 0.1, "rho = 'auto': local gain gamma = a_own (n_i/n) L, so "
                     "rho = gamma T^2 lam / L_public (spec: keep gamma in [0.02, 0.3])"),
        "init": Key((str,), "const", "initial models: const (theta0 everywhere) or uniform "
                    "(U[0,1)^p per run, the authors' lending setting)", ("const", "uniform")),
        "preset": Key((str,), "dp", "dp (clipping, i.i.d. noise; dp_valid = true) or paper_code "
                      "(the authors' code: xi = p/2, no clipping; dp_valid = false)",
                      ("dp", "paper_code")),
        "noise_shape": Key((str,), "iid", "iid (DP) or scalar (one Laplace value added to every "
                           "coordinate, as in the authors' code: NOT DP, paper_code only)",
                           ("iid", "scalar")),
    },
    "average": {
        "kind": Key((str,), "polynomial", "averaging of alg2", ("polynomial", "stepweighted")),
        "eta": Key(_NUM, 3.0, "polynomial-decay parameter (0: uniform running mean)"),
    },
    "admm": {
        "method": Key((str,), "objt", "objt (trust region, inf-norm), objp (proximal): objective "
                      "perturbation with Laplace noise; outp: the DP-ADMM baseline (Gaussian output "
                      "perturbation, decreasing variance)", ("objt", "objp", "outp")),
        "gamma": Key(_NUM, 1e-6, "regularisation weight: F(w) = loss + gamma ||w||_F^2"),
        "rho": Key((str,) + _NUM, "dynamic_1", "penalty: dynamic_1 = min(1e9, c1 1.2^floor((t+1)/"
                   "T_c) + c2/eps) (21), dynamic_2 = (21)/100, or a constant"),
        "rho_c1": Key(_NUM, 2.0, "c1 of (21) (MNIST 2, FEMNIST 0.005)"),
        "rho_c2": Key(_NUM, 5.0, "c2 of (21) (MNIST 5, FEMNIST 0.05)"),
        "rho_tc": Key((int,), 10000, "T_c of (21) (MNIST 10000, FEMNIST 2000)"),
        "prox_scale": Key(_NUM, 1.0, "a: eta^t = a/sqrt(t+1) (ObjP), delta^t (ObjT), OutP's eta"),
        "tr_schedule": Key((str,), "const", "ObjT trust radius: const (delta = a, the released "
                           "code) or inv_sq (a/(t+1)^2, the paper's prose)", ("const", "inv_sq")),
        "sens_mode": Key((str,), "local_max", "l1 sensitivity: local_max (the code: max over the "
                         "agent's records at z_p / I; reads private data to set the noise), "
                         "local_max_x2 (replace-one) or global (4 J / I: strict, data-independent)",
                         ("local_max", "local_max_x2", "global")),
        "outp_noise_std": Key((str,), "sigma", "OutP noise std: sigma (Huang et al., the fair "
                              "baseline) or sigma_sq (the authors' code)", ("sigma", "sigma_sq")),
        "reg_grad": Key((str,), "consistent", "regulariser gradient in ObjT/ObjP: consistent "
                        "(2 gamma/P z_p) or code (2 gamma w)", ("consistent", "code")),
        "w_bound": Key(_NUM, math.inf, "box W = [-B, B]^(J x K) (inf: unconstrained, the final "
                       "code; 1.0: the April 2021 code)"),
        "dp_delta": Key(_NUM, 1e-6, "delta of OutP's (eps, delta)-DP per iteration"),
    },
    "sweep": {
        "eps": Key((list,), None, "eps values (each a scalar or a per-owner list); "
                   "configurations are the product eps x n"),
        "n": Key((list,), None, "n values (each a scalar or a per-owner list)"),
        "owners": Key((list,), None, "numbers of participating owners N (configurations are the "
                      "product owners x n x eps)"),
        "method": Key((list,), None, "admm methods side by side (configurations: method x eps)"),
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
    owners: Any = "all"  # 'all' or the number of participating owners
    method: str = ""  # admm method of this configuration

    def label(self, eps: Any = None, n: Any = None) -> str:
        """'eps=1, n=1000' ('N=8, eps=...' with owners); pass resolved values to show numbers."""
        head = "" if self.owners == "all" else f"N={self.owners}, "
        head = (f"{self.method}, " if self.method else "") + head
        return (f"{head}eps={_compact(self.eps if eps is None else eps)}, "
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
        own_list = self.values["sweep.owners"] or [self.values["owners"]]
        meth_list = self.values["sweep.method"] or [
            self.values["admm.method"] if self.values["algorithm"] == "admm" else ""]
        return [Config(i, e, n, o, m) for i, (m, o, n, e)
                in enumerate(itertools.product(meth_list, own_list, n_list, eps_list))]

    @property
    def is_sweep(self) -> bool:
        return bool(self.values["sweep.eps"] or self.values["sweep.n"] or self.values["sweep.owners"]
                    or self.values["sweep.method"])

    def to_json(self) -> str:
        return json.dumps(dict(self.values), default=str, sort_keys=True)


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


def _check_owners(path: str, key: str, v: Any) -> None:
    if v == "all":
        return
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise _err(path, key, f"expected 'all' or a positive number of owners, got {v!r}")


def _check_async(path: str, values: dict[str, Any]) -> None:
    """Range checks of the [async] keys (types and choices are checked already)."""
    rates = values["async.rates"]
    for r in rates if isinstance(rates, list) else [rates]:
        if isinstance(r, bool) or not isinstance(r, int | float) or not 0 < r < math.inf:
            raise _err(path, "async.rates", f"rates must be positive finite numbers, got {r!r}")
    for key in ("async.clock_unit_s", "async.poll_interval_s"):
        if not 0 < values[key] < math.inf:
            raise _err(path, key, f"must be a positive number of seconds, got {values[key]!r}")
    cap = values["async.per_owner_cap"]
    for c in cap if isinstance(cap, list) else [cap]:
        if isinstance(c, bool) or not isinstance(c, int) or c < 0:
            raise _err(path, "async.per_owner_cap", f"caps must be integers >= 0 (0 = T), got {c!r}")
    if not 0 < values["async.gamma"] < math.inf:
        raise _err(path, "async.gamma", "must be > 0")
    if values["async.noise_shape"] == "scalar" and values["async.preset"] != "paper_code":
        raise _err(path, "async.noise_shape", "'scalar' noise (one Laplace value on every "
                   "coordinate) is not DP: allowed only with async.preset = 'paper_code'")
    if values["async.mode"] == "live" and values["async.schedule_from"]:
        raise _err(path, "async.schedule_from", "a logged schedule is replayed in mode 'replay', "
                   "not 'live'")


def _check_admm(path: str, values: dict[str, Any]) -> None:
    rho = values["admm.rho"]
    if isinstance(rho, str) and rho not in ("dynamic_1", "dynamic_2"):
        raise _err(path, "admm.rho", f"expected dynamic_1, dynamic_2 or a number, got {rho!r}")
    if not isinstance(rho, str) and not 0 < rho < math.inf:
        raise _err(path, "admm.rho", "a constant penalty must be a positive number")
    for key in ("admm.gamma", "admm.rho_c1", "admm.rho_c2"):
        if not 0 <= values[key] < math.inf:
            raise _err(path, key, "must be a finite number >= 0")
    if values["admm.rho_tc"] < 1:
        raise _err(path, "admm.rho_tc", "must be at least 1")
    if not values["admm.prox_scale"] > 0 or not values["admm.w_bound"] > 0:
        raise _err(path, "admm.prox_scale" if not values["admm.prox_scale"] > 0
                   else "admm.w_bound", "must be > 0")
    if not 0 < values["admm.dp_delta"] < 1:
        raise _err(path, "admm.dp_delta", "must be in (0, 1)")
    for i, m in enumerate(values["sweep.method"] or []):
        if m not in ("objt", "objp", "outp"):
            raise _err(path, f"sweep.method[{i}]", f"{m!r} is not one of 'objt', 'objp', 'outp'")
    if values["sweep.method"] is not None and values["algorithm"] != "admm":
        raise _err(path, "sweep.method", "only the admm algorithm has methods")


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
    alg = values["algorithm"]
    values["variant"] = _check_type(path, "variant", Key((str,), None, "", ALGORITHMS[alg]),
                                    values["variant"] or DEFAULT_VARIANT[alg])
    for sec, owner_alg in ALGORITHM_SECTIONS.items():
        if sec in raw and alg != owner_alg:
            raise _err(path, sec, f"the [{sec}] section belongs to algorithm '{owner_alg}', not "
                       f"'{alg}'")
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
    _check_async(path, values)
    _check_admm(path, values)
    _check_owners(path, "owners", values["owners"])
    for i, v in enumerate(values["sweep.owners"] or []):
        _check_owners(path, f"sweep.owners[{i}]", v)
    if values["sweep.owners"] is not None and not values["sweep.owners"]:
        raise _err(path, "sweep.owners", "empty list")
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
