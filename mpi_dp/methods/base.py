"""The method seam: what one method provides so that the job loader, the runner and the CLI need
nothing else. A method is one module defining a `Method` subclass and `METHOD = ThatClass()`, plus
one line in the registry (mpi_dp/methods/__init__.py).

The runner calls, for a job of the method:

    prepare(ctx)                          once, collective (public constants, test sets...)
    header(ctx, prepared)                 progress line on rank 0
    per configuration, before the output exists:
        configure(ctx, prepared, resolved) -> Configured
                                          one frozen record, built once: the settings, each
                                          owner's release plan, the paper rule with its knobs,
                                          the noise-to-signal inputs, the group's attributes,
                                          the footprint; errors agreed by every rank
    per configuration:
        run(ctx, prepared, configured, contract, hooks) -> Outcome on rank 0 (None elsewhere)

Between the two the runner builds the configuration's `privacy.contract.Contract` from the job's
privacy keys and the plans (each distinct plan calibrated once, on rank 0): the method's run asks
it for its owners' release paths and never sees which rule set the noise. `hooks`
(algorithms.hooks.RunHooks) are the configuration's recording, progress lines and checkpoints.
The runner writes the outcome: its arrays, `privacy/ledger` (every agent's ledger through the
accountants, at the job's privacy.delta) and its attributes. `mpi-dp analyze` and `mpi-dp plot`
call `analyze`, `table_rows` and `figures` of the method named in the result file.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Generic, TypeVar

import numpy as np
from mpi4py import MPI

from ..algorithms.hooks import RunHooks
from ..backend import BackendError, backend
from ..comm.agree import collective
from ..comm.star import Star
from ..data import ShardFile
from ..errors import JobError
from ..jobspec import Config, Job, Key, PrivacyKeys
from ..privacy import Ledger, contract
from ..privacy.contract import Contract
from ..privacy.rules import PaperRule, Rule
from ..results.footprint import (
    ITERATION_FLOPS,
    ITERATION_S,
    Footprint,
    config_footprint,
    hosted,
)

#: what a method's `prepare` returns and its per-configuration settings (Method's parameters)
PreparedT = TypeVar("PreparedT")
SettingsT = TypeVar("SettingsT")


@dataclasses.dataclass
class Context:
    """What every method gets from the runner for one job (identical on every rank)."""

    job: Job
    shard: ShardFile
    star: Star
    run_ids: tuple[int, ...]
    progress: bool = True
    #: n_i of every agent of `shard` (read once per job: `shard_sizes`)
    sizes: np.ndarray | None = None

    @property
    def comm(self):
        return self.star.comm

    @property
    def runs(self) -> int:
        return len(self.run_ids)

    def agree(self, fn):
        """Run fn on every rank; a user error on any rank is raised on all of them."""
        return collective(self.comm, fn)


def shard_sizes(comm: Any, shard: ShardFile) -> np.ndarray:
    """Collective: every agent's record count n_i (int64), each rank reading a block of them
    (one lookup per agent in the job, not per agent and rank: thousands of agents start in
    seconds); read errors are raised on every rank."""
    n, size, rank = shard.n_agents, comm.Get_size(), comm.Get_rank()
    starts = [n * r // size for r in range(size + 1)]
    mine = collective(comm, lambda: np.ascontiguousarray(
        shard.sizes(range(starts[rank], starts[rank + 1])), dtype=np.int64))
    out = np.empty(n, dtype=np.int64)
    comm.Allgatherv(mine, [out, np.diff(starts), starts[:-1], MPI.INT64_T])
    collective(comm, lambda: shard.check_sizes(out))  # an owner without records: one message
    return out


@dataclasses.dataclass(frozen=True)
class Resolved:
    """A configuration with its per-owner budgets and sizes resolved against the shard file."""

    config: Config
    eps: list[float]  # one per participating owner
    n: list[int]  # records each participating owner uses
    n_requested: list[int] | None = None  # set when n_beyond_shard = 'cap' shortened a request

    @property
    def index(self) -> int:
        return self.config.index

    @property
    def variant(self) -> str:
        return self.config.variant

    @property
    def N(self) -> int:
        return len(self.n)

    @property
    def label(self) -> str:
        return self.config.label(self.eps, self.n)


@dataclasses.dataclass
class Outcome:
    """What a configuration leaves for the result file (on rank 0).

    `ledgers`: every participating agent's privacy ledger, in agent order, or their rows of
    privacy/ledger already composed where they live (`ledger_delta`, accountants.in_agent_order).
    `guarantee`: what one
    release and the totals mean for this method (stored with privacy/ledger and printed by
    analyze). `arrays`: (path, data, attrs) datasets. `attrs`: attributes of the group.
    """

    ledgers: list[Ledger] | np.ndarray
    guarantee: str
    arrays: list[tuple[str, Any, dict[str, Any]]] = dataclasses.field(default_factory=list)
    attrs: dict[str, Any] = dataclasses.field(default_factory=dict)

    def add(self, path: str, data: Any, **attrs: Any) -> None:
        self.arrays.append((path, data, attrs))


@dataclasses.dataclass(frozen=True)
class Signal:
    """Inputs of the noise-to-signal ratio (privacy.noise_signal): each planned owner's release
    sensitivity over the norm bound of its signal (2 / n_i for a mean of n_i clipped
    gradients), in plan order, the release's dimension and, where a plan counts other releases
    than an owner makes (a per-record plan), each owner's releases in the run."""

    sens_over_signal: tuple[float, ...]
    dim: int
    releases: tuple[int, ...] | None = None


@dataclasses.dataclass(frozen=True)
class Configured(Generic[SettingsT]):
    """One configuration as its method configured it, once, before the output exists.

    `settings`: the algorithm's resolved knobs; `plans`: each participating owner's release
    plan (privacy.contract.Plan, `owner_plans` builds them; None: the configuration releases
    nothing private, a non-private baseline); `paper_rule`: the method's paper rule with the
    job's knobs (used where privacy.calibration = 'paper'); `signal`: the noise-to-signal
    inputs (None: not defined); `attrs`: the configuration group's attributes; `footprint`:
    this rank's cost (`footprint_of`); `records`: records it writes (sizes the HDF5 chunks).
    `attrs` may be a function, so that a large one (e.g. the run ids of 10^8 runs) is made only
    once the job's footprint was checked."""

    resolved: Resolved
    settings: SettingsT
    plans: tuple[contract.Plan | None, ...] | None
    footprint: Footprint
    records: int
    attrs: Mapping[str, Any] | Callable[[], Mapping[str, Any]] = dataclasses.field(
        default_factory=dict)
    signal: Signal | None = None
    paper_rule: PaperRule | None = None
    #: a configuration whose noise the method fixes itself (its plans hold no calibrated
    #: release, e.g. a local-DP baseline's even split) names the rule that describes it;
    #: None: the job's privacy.calibration
    rule: Rule | None = None

    def group_attrs(self) -> dict[str, Any]:
        """The configuration group's attributes (`attrs`, called when it is a function: made
        only for a configuration that runs, after the job's footprint was checked)."""
        return dict(self.attrs() if callable(self.attrs) else self.attrs)


def footprint_of(ctx: Context, records: int, model_size: int,
                 per_iteration_bytes: float = 0.0, iteration_s: float = ITERATION_S,
                 iteration_flops: float = ITERATION_FLOPS) -> Footprint:
    """This rank's estimated cost of one configuration (results.footprint), checked before the
    output is touched: `records` written, `model_size` coordinates of one model,
    `per_iteration_bytes` kept per iteration and run (a trace, a schedule); the method's
    `iteration_s` and `iteration_flops` where they differ from footprint's defaults."""
    a, n = hosted(ctx)
    return config_footprint(int(ctx.job.generic.T), ctx.runs, records, int(model_size), a, n,
                            ctx.shard.n_agents, per_iteration_bytes * ctx.runs, iteration_s,
                            iteration_flops)


def default_records(ctx: Context) -> int:
    """Records of a configuration that records every record_every iterations (and at 0, T)."""
    g = ctx.job.generic
    return g.T // max(1, g.record_every) + 2


def ledger_delta(ctx: Context, rc: Resolved) -> float:
    """The delta privacy/ledger composes a ledger without a target at (privacy.delta; 'auto'
    by the largest n_i)."""
    d = ctx.job.section(PrivacyKeys).delta
    return contract.default_delta(max(rc.n)) if d == "auto" else float(d)


#: Share of a device's free memory the records of its ranks may take (the rest: the passes'
#: working blocks, models, CuPy's pool).
DEVICE_MEMORY_SHARE = 0.8


def available_backend(path: str | Path, name: str, records_bytes: float = 0.0) -> str:
    """The job's `backend` when this rank can provide it (checked on every rank before the
    output is touched: CuPy installed, a GPU present, and the device's free memory, shared by
    the node's ranks on it, holding the `records_bytes` this rank moves there: a lower bound
    of what it needs), else JobError naming the key."""
    try:
        bk = backend(name)
    except BackendError as e:
        raise JobError(f"job file {path}: key 'backend': {e}") from None
    free = bk.free_bytes()
    if records_bytes > DEVICE_MEMORY_SHARE * free:
        raise JobError(f"job file {path}: key 'backend': this rank's records alone take "
                       f"{records_bytes / 2**30:.2f} GiB on the device, which has "
                       f"{free / 2**30:.2f} GiB free for each of its ranks: use more GPUs "
                       "(nodes, or fewer ranks per GPU), fewer records (n), or backend = 'numpy'")
    return name


def backend_for(ctx: Context, n_records: Any) -> str:
    """`available_backend` of the job's `backend` for this rank's hosted agents: their records
    (`n_records`, the configuration's per agent) x features x 8 bytes."""
    n = np.asarray(n_records, dtype=np.float64)
    rows = float(sum(n[a] for a in ctx.star.local_agents if a < n.size))
    return available_backend(ctx.job.path, ctx.job.values["backend"],
                             rows * ctx.shard.n_features * 8.0)


def owner_plans(ctx: Context, rc: Resolved, n_records: Any, mechanism: str,
                releases: int | Any, *, fixed: tuple = (), scope: str = "configuration"
                ) -> list[contract.Plan]:
    """The participating owners' plans: owner i releases `releases` (or releases[i]) times by
    `mechanism` (plus the `fixed` releases), at its eps (the configuration's) and its delta
    (privacy.delta; 'auto' by its n_records[i]). A delta at or above 1/n_i is refused (JobError
    naming the owner and n_i)."""
    job = ctx.job
    asked = job.section(PrivacyKeys).delta
    out = []
    for i, eps in enumerate(rc.eps):
        n = int(n_records[i])
        try:
            delta = contract.resolve_delta(asked, n, i)
        except ValueError as e:
            raise JobError(f"job file {job.path}: {e}") from None
        k = int(releases if isinstance(releases, int | np.integer) else releases[i])
        out.append(contract.Plan(mechanism, k, float(eps), delta, tuple(fixed), scope))
    return out


def settings_attrs(settings: Any) -> dict[str, Any]:
    """Settings (a dataclass or a mapping) as HDF5 attributes: its field names, tuples and lists
    as arrays (one source of names: the attributes are called what the algorithm calls its knobs)."""
    out: dict[str, Any] = {}
    items = (settings.items() if isinstance(settings, Mapping) else
             ((f.name, getattr(settings, f.name)) for f in dataclasses.fields(settings)))
    for name, v in items:
        if v is None or name == "calibration":  # calibrations: calibration_attrs
            continue
        if isinstance(v, tuple | list) and not all(isinstance(x, int | float | np.number)
                                                   for x in v):
            continue  # objects (events...): described elsewhere
        if isinstance(v, tuple | list):
            a = np.asarray(v)
            v = a.astype(np.int64 if len(v) and a.dtype.kind in "biu" else np.float64)
        out[name] = v
    return out


def default_of(settings_cls: type, field: str) -> Any:
    """The default of a settings field: job keys take their defaults from the algorithm, so each
    knob has exactly one default."""
    for f in dataclasses.fields(settings_cls):
        if f.name == field:
            if f.default is dataclasses.MISSING:
                raise ValueError(f"{settings_cls.__name__}.{field} has no default")
            return f.default
    raise ValueError(f"{settings_cls.__name__} has no field {field!r}")


class Method(Generic[PreparedT, SettingsT]):
    """One method of the program, generic in what `prepare` returns (PreparedT) and what
    `settings` returns (SettingsT, a frozen dataclass). Subclasses set the class attributes and
    override the hooks."""

    name: str = ""
    summary: str = ""
    #: variants, the default first; `variant_help` explains them in `mpi-dp run --help`
    variants: tuple[str, ...] = ("default",)
    variant_help: str = ""
    #: shared keys it reads besides the generic ones (jobspec.SHARED / SHARED_SECTIONS; 'step.*'
    #: for a whole shared section)
    reads: tuple[str, ...] = ()
    #: sections it owns: {section: {key: Key}}
    sections: Mapping[str, Mapping[str, Key]] = {}
    #: old key names still accepted, {old: new}, and old variant names, {old: new or None}
    legacy_keys: Mapping[str, str] = {}
    variant_aliases: Mapping[str, str | None] = {}
    #: name the variant in every configuration label (also without a variant sweep)
    label_variant: bool = False
    #: what generic keys mean for this method, shown in `mpi-dp run --help`
    key_help: Mapping[str, str] = {}
    #: the metric `analyze` and `plot` summarise by default
    default_metric: str = "psi"
    #: its own keys that a job may sweep, e.g. ("dola.rho",) -> `[sweep] rho = [...]`; the
    #: configuration's value is `rc.config.param(key, job[key])`
    sweeps: tuple[str, ...] = ()
    #: `record_every = 0` is allowed: no evaluation-only records, the method's cost alone
    records_optional: bool = False
    #: the paper's own calibration (privacy.calibration = 'paper'): what eps means there, and
    #: its short name (the ledger's calibration column: 'paper:<name>')
    paper_rule: str = ""

    # -- job ---------------------------------------------------------------------------------
    def validate(self, values: dict[str, Any], path: str) -> None:
        """Range checks of its own keys (types and choices are checked already)."""

    # -- run ---------------------------------------------------------------------------------
    def prepare(self, ctx: Context) -> PreparedT:
        """Collective set-up shared by the configurations (e.g. public constants)."""
        return None  # type: ignore[return-value]

    def header(self, ctx: Context, prepared: PreparedT) -> str:
        """Method-specific part of the progress line printed when the job starts."""
        return ""

    def configure(self, ctx: Context, prepared: PreparedT, rc: Resolved
                  ) -> Configured[SettingsT]:
        """One configuration's Configured record (collective; errors agreed by every rank)."""
        raise NotImplementedError

    def run(self, ctx: Context, prepared: PreparedT, configured: Configured[SettingsT],
            contract: Contract, hooks: RunHooks) -> Outcome | None:
        """Run one configuration (collective): the Outcome on rank 0, None elsewhere. Releases
        come from `contract` (its owners' release paths); `hooks` record, report progress and
        checkpoint."""
        raise NotImplementedError

    # -- analysis ----------------------------------------------------------------------------
    def metric_of(self, result: Any, metric: str | None) -> str:
        """The metric to summarise: `metric`, else the default one, else (a result without it,
        e.g. no psi under reference.solver = 'none') the objective (analysis.load)."""
        if metric is not None:
            return metric
        from ..analysis.load import shown_metric

        return shown_metric(result, self.default_metric)

    def analyze(self, result: Any, metric: str | None = None) -> str:
        """What `mpi-dp analyze` prints for a result of this method (before the privacy block)."""
        from ..analysis import table

        return table.analyze_text(result, metric=self.metric_of(result, metric))

    def table_rows(self, result: Any, metric: str | None = None) -> list[dict[str, Any]]:
        """The rows `mpi-dp analyze --csv` writes."""
        from ..analysis import table

        return table.summarize(result, metric=self.metric_of(result, metric))

    def figures(self, result: Any, prefix: Path, metric: str | None = None) -> list[Path]:
        """Write this method's figures; returns the PNG paths."""
        from ..analysis import figures

        return figures.plot_result(result, prefix, metric=self.metric_of(result, metric))


def rule_for(job: Job, configured: Configured) -> Rule:
    """The calibration rule of a configuration: the job's privacy.calibration, 'paper' being the
    method's paper rule (JobError where it has none)."""
    from ..privacy import rules

    if configured.rule is not None:
        return configured.rule
    try:
        return rules.rule_of(job.section(PrivacyKeys).calibration, configured.paper_rule)
    except ValueError as e:
        raise JobError(f"job file {job.path}: key 'privacy.calibration': {e}") from None
