"""What the datasets of a result file mean, for readers other than mpi_dp: named dimensions
(HDF5 dimension scales, which xarray and netCDF readers show as coordinates), units and long
names, which values the privacy guarantee covers (`evaluation_only`), and strict JSON for text
attributes.

A configuration group G is annotated when it completes (`annotate`):
  - coordinates in G: `run` (run ids), `agent` (agent ids), and index coordinates of the other
    axes (`feature`, `class`, `edge`, `update`, ...), each an HDF5 dimension scale with `units`
    and `long_name`; `G/metrics/iteration` is the `iteration` coordinate;
  - every dataset below G has its axes attached to those scales (DIMS; an axis no rule names
    gets `<dataset>_axis<k>`, never an anonymous dimension);
  - every dataset carries `evaluation_only` (True: computed from private records without noise,
    for evaluation; False: covered by the privacy guarantee or public), and G the attribute
    `evaluation_only_attrs` (JSON list of its attributes that are evaluation-only);
  - `G/ledger/<field>`: the compound `privacy/ledger` as one dataset per field on `agent`
    (netCDF readers skip compound datasets).

JSON attributes are strict JSON (RFC 8259): a non-finite number is written as the string
"Infinity", "-Infinity" or "NaN" (`dumps`); `loads` reads those strings back as floats.
"""

from __future__ import annotations

import fnmatch
from typing import Any

import h5py
import numpy as np

from ..strict_json import NONFINITE, dumps, loads  # noqa: F401 (re-exported)

# -- strict JSON: mpi_dp.strict_json (a leaf module: the job loader writes it too) ------------


# -- dimensions --------------------------------------------------------------------------------
#: long name and units of each named dimension (index coordinates have units "1")
DIMENSIONS: dict[str, str] = {
    "iteration": "iteration (round, update or wake-up) k of the record; 0: the initial model",
    "run": "Monte-Carlo run id (the index of the run's random streams)",
    "agent": "agent id (data owner or peer; the shard file's order)",
    "feature": "model coordinate (feature index)",
    "class": "class index of a multinomial model",
    "update": "learner update k (1-based position in the schedule)",
    "wake_up": "kept wake-up of the replayed schedule",
    "decline": "declined request",
    "edge": "edge of the communication graph",
    "endpoint": "edge endpoint (0: from, 1: to)",
    "xy": "plane coordinate (0: x, 1: y)",
}

#: long names of common datasets (a dataset's `what` attribute, where it has one, is used first)
LONG_NAMES: dict[str, str] = {
    "psi": "relative excess objective F(theta)/F* - 1 of the reported model",
    "psi_iterate": "relative excess objective F(theta_k)/F* - 1 of the last iterate",
    "objective": "objective F(theta) on the training records",
    "train_error": "training error rate", "test_error": "test error rate (the test set)",
    "train_mse": "training mean squared error", "test_mse": "test mean squared error",
    "clip_fraction": "share of records whose gradient was clipped",
    "step_size": "step size of the iteration", "regret": "regret against the comparator w*",
    "loss": "online loss", "eps": "the agent's total eps for the configuration",
    "n": "records the agent uses", "lap_scale": "Laplace noise scale of one release",
    "final": "final model", "final_iterate": "last iterate of the model",
    "theta_star": "the non-private optimum theta*", "w_star": "the non-private optimum w*",
    "Q": "the personalized objective Q(theta)", "gap": "Q(theta) - Q*",
    "ledger": "per-agent privacy ledger (the accountants' totals)",
}

#: the axes of the datasets under a configuration group, by path (shell patterns allowed); a
#: dict picks by number of axes. Axes beyond a rule, or whose length disagrees with the
#: dimension already named in the group, are named `<dataset>_axis<k>`.
DIMS: dict[str, tuple[str, ...] | dict[int, tuple[str, ...]]] = {
    "metrics/iteration": ("iteration",),
    "metrics/*": ("iteration", "run"),
    "models/final": {2: ("run", "feature"), 3: ("run", "feature", "class")},
    "models/final_iterate": ("run", "feature"),
    "models/local": ("run", "agent", "feature"),
    "models/w_bar": ("run", "feature"),
    "models/w_hat": ("run", "feature"),
    "models/theta": ("run", "agent", "feature"),
    "models/theta_local": ("agent", "feature"),
    "models/*": {1: ("feature",), 2: ("run", "feature"), 3: ("run", "agent", "feature")},
    "reference/theta_star": {1: ("feature",), 2: ("agent", "feature")},
    "reference/w_star": {1: ("feature",), 2: ("feature", "class")},
    "reference/theta_isolated": ("agent", "feature"),
    "reference/psi_isolated": ("agent",),
    "reference/*": {1: ("agent",), 2: ("agent", "feature")},
    "privacy/*": {1: ("agent",), 2: ("run", "agent")},
    "ledger/*": ("agent",),
    "schedule/ended_at": ("run",),
    "schedule/declines": ("decline",),
    "schedule/agent": ("wake_up",),
    "schedule/*": ("run", "update"),
    "graph/edges": ("edge", "endpoint"),
    "graph/weights": ("edge",),
    "graph/positions": ("agent", "xy"),
    "per_agent/*": {1: ("agent",), 2: ("run", "agent")},
    "arrays/*": (),
}

#: datasets covered by the privacy guarantee or public (evaluation_only = False); every other
#: dataset is evaluation-only: computed from private records without noise (metrics such as psi,
#: regret and test errors, theta*, isolated optima, trivial baselines, clean iterates)
RELEASED: tuple[str, ...] = (
    # coordinates, the sweep and public per-agent values (budgets, record counts, noise scales)
    "run", "agent", "feature", "class", "update", "wake_up", "decline", "edge", "endpoint", "xy",
    "eps", "n", "n_requested", "caps", "rates", "lap_scale",
    # per-iteration public quantities: the schedule of step sizes and penalties, messages sent
    "metrics/iteration", "metrics/step_size", "metrics/rho", "metrics/vectors_sent",
    "metrics/active_degree", "metrics/a_self_min",
    # models built only from noisy releases (the learner's, the agents' DP models)
    "models/final", "models/final_iterate", "models/local", "models/theta",
    # privacy accounting: ledgers, noise scales, answers counted
    "privacy/ledger", "privacy/lap_scale", "privacy/answered", "privacy/spent_eps",
    "privacy/theorem1", "ledger/*",
    # the public protocol: schedule, graph, records per peer
    "schedule/*", "graph/*", "per_agent/m",
)

#: configuration attributes computed from private records without noise
EVALUATION_ONLY_ATTRS: tuple[str, ...] = (
    "noise_to_signal", "noise_to_signal_run", "Q_*", "test_*", "train_*", "val_*", "*_star*",
    "w_star_*", "L_data", "f_star", "psi_*",
)
#: attributes that only describe (texts, flags): never evaluation-only even when they match
DESCRIPTIVE_ATTRS = ("test_metric", "test_global_metric", "test_global_trivial",
                     "test_global_records", "n_test", "step_rule", "tr_schedule")


def dims_for(path: str, ndim: int) -> tuple[str, ...]:
    """The dimension names DIMS gives a dataset at `path` (relative to its configuration group)
    with `ndim` axes; unnamed axes are left to the caller."""
    for pattern, rule in DIMS.items():
        if fnmatch.fnmatchcase(path, pattern):
            if isinstance(rule, dict):
                return rule.get(ndim, ())
            return rule[:ndim]
    return ()


def released(path: str) -> bool:
    """Whether the dataset at `path` (relative to its configuration group) is covered by the
    privacy guarantee or public."""
    return any(fnmatch.fnmatchcase(path, p) for p in RELEASED)


def evaluation_only_attrs(names: list[str]) -> list[str]:
    """The configuration attributes among `names` computed from private records without noise."""
    return sorted(k for k in names if k not in DESCRIPTIVE_ATTRS and any(
        fnmatch.fnmatchcase(k, p) for p in EVALUATION_ONLY_ATTRS))


def coordinate(group: h5py.Group, name: str, size: int,
               run_ids: np.ndarray | None = None) -> h5py.Dataset:
    """The scale `name` of `size` values in `group` (created once): the run ids for `run` when
    given, else 0..size-1; KeyError when `group` has another dataset of that name."""
    if name in group:
        ds = group[name]
        if isinstance(ds, h5py.Dataset) and ds.shape == (size,):
            if not ds.is_scale:
                ds.make_scale(name)
            return ds
        raise KeyError(name)
    if name == "run" and run_ids is not None and len(run_ids) == size:
        data = np.asarray(run_ids, dtype=np.int64)
    else:
        data = np.arange(size, dtype=np.int64)
    ds = group.create_dataset(name, data=data)
    ds.make_scale(name)
    ds.attrs["long_name"] = DIMENSIONS.get(name, name)
    ds.attrs["units"] = "1"
    ds.attrs["evaluation_only"] = False
    return ds


def annotate(group: h5py.Group, runs: int, n_agents: int | None = None,
             run_ids: np.ndarray | None = None) -> None:
    """Name every axis of the datasets below a complete configuration group `group`, mark each
    dataset evaluation-only or not, list the evaluation-only attributes and add the ledger's
    columns (see the module docstring). Idempotent."""
    if "privacy/ledger" in group and "ledger" not in group:
        _ledger_columns(group)
    sizes: dict[str, int] = {"run": runs}
    if n_agents is not None:
        sizes["agent"] = n_agents
    metrics = group.get("metrics")
    iteration = metrics.get("iteration") if isinstance(metrics, h5py.Group) else None
    if isinstance(iteration, h5py.Dataset):
        if not iteration.is_scale:
            iteration.make_scale("iteration")
        iteration.attrs["long_name"] = DIMENSIONS["iteration"]
        iteration.attrs["units"] = "1"
        sizes["iteration"] = iteration.shape[0]
    items: list[tuple[str, h5py.Dataset]] = []

    def visit(name: str, obj: Any) -> None:
        if isinstance(obj, h5py.Dataset) and not name.startswith(("checkpoint", "provenance")):
            items.append((name, obj))

    guaranteed = models_covered(group)
    group.visititems(visit)
    if group.name == "/":
        items = [(n, d) for n, d in items if not n.startswith("configs/")]
    for path, ds in items:
        if "evaluation_only" not in ds.attrs:
            ds.attrs["evaluation_only"] = not released(path) or (
                path.startswith("models/") and not guaranteed)
        if "long_name" not in ds.attrs:
            leaf = path.rsplit("/", 1)[-1]
            what = ds.attrs.get("what")
            ds.attrs["long_name"] = what if what is not None else LONG_NAMES.get(leaf, leaf)
        if ds.is_scale or ds.ndim == 0:
            continue
        names = (["agent"] if ds.attrs.get("per_agent", False) and ds.ndim == 1
                 else list(dims_for(path, ds.ndim)))
        leaf = path.rsplit("/", 1)[-1]
        for k in range(ds.ndim):
            name = names[k] if k < len(names) else f"{leaf}_axis{k}"
            size = ds.shape[k]
            if sizes.setdefault(name, size) != size or name == "iteration" and iteration is None:
                name = f"{leaf}_axis{k}"
            if name == "iteration":
                scale = iteration
            else:
                # coordinates live in the configuration group (readers that list a subgroup's
                # datasets, e.g. the metrics, see no extra ones); a subgroup shows them as
                # named dimensions, `xr.open_datatree` as inherited coordinates
                where = group if name in DIMENSIONS else ds.parent
                try:
                    scale = coordinate(where, name, size, run_ids)
                except KeyError:  # a dataset of that name is not a coordinate: a private name
                    name = f"{leaf}_axis{k}"
                    scale = coordinate(ds.parent, name, size)
            if scale == ds:  # a dataset of the dimension's name is its coordinate (ledger/agent)
                continue
            if ds.dims[k].label != name:
                ds.dims[k].label = name
            if not any(s == scale for s in ds.dims[k].values()):
                ds.dims[k].attach_scale(scale)
    attrs = [k for k in group.attrs if k not in ("evaluation_only_attrs",)]
    group.attrs["evaluation_only_attrs"] = dumps(evaluation_only_attrs(attrs))


def models_covered(group: h5py.Group) -> bool:
    """Whether the configuration's models are covered by a guarantee: every agent's ledger row is
    certified and either made its noisy releases or was promised eps = inf (no privacy, said so).
    A configuration that released nothing under a finite eps (a non-private baseline such as
    p2p's admm variant) or without a ledger has models computed from private records without
    noise: evaluation-only."""
    if "privacy/ledger" not in group:
        return False
    rows = group["privacy/ledger"][()]
    if not len(rows):
        return False
    ok = rows["certified"].astype(bool) & ((rows["releases"] > 0) | np.isinf(rows["target_eps"]))
    return bool(np.all(ok))


def _ledger_columns(group: h5py.Group) -> None:
    """`ledger/<field>`: the per-agent ledger as plain datasets."""
    rows = group["privacy/ledger"][()]
    cols = group.create_group("ledger")
    cols.attrs["long_name"] = ("the per-agent privacy ledger privacy/ledger, one dataset per "
                               "field (for readers without compound types)")
    for field in rows.dtype.names:  # text stays fixed-length ASCII, as in the compound table
        ds = cols.create_dataset(field, data=rows[field])
        ds.attrs["evaluation_only"] = False


def reattach(group: h5py.Group) -> None:
    """Re-link the dimension scales of a configuration group copied from another file: HDF5's
    object copy keeps each axis's label but not the scale links (object references into the
    source file), so they are dropped and attached again by label."""
    items: list[h5py.Dataset] = []
    group.visititems(lambda _n, o: items.append(o) if isinstance(o, h5py.Dataset) else None)
    for ds in items:
        for key in ("DIMENSION_LIST", "REFERENCE_LIST"):
            if key in ds.attrs:
                del ds.attrs[key]
    for ds in items:
        if ds.ndim == 0 or ds.is_scale:
            continue
        for dim in ds.dims:
            label = dim.label
            if not label:
                continue
            scale = _find_scale(label, ds, group)
            if scale is not None:
                dim.attach_scale(scale)


def _find_scale(label: str, ds: h5py.Dataset, group: h5py.Group) -> h5py.Dataset | None:
    """The scale named `label` seen from `ds`: beside it, in the configuration group, or the
    `metrics/iteration` coordinate."""
    for g, name in ((ds.parent, label), (group, label), (group, f"metrics/{label}")):
        obj = g.get(name)
        if isinstance(obj, h5py.Dataset) and obj.is_scale:
            return obj
    return None
