"""The results HDF5 file: schema, incremental recorder, final status.

Schema (format "mpi_dp.results", version 2; docs/results.md is the full contract, checked against
real files) -- a contract analysis code relies on. Version 2 adds named dimensions (HDF5
dimension scales: `run`, `agent`, `feature`, ... and `metrics/iteration`), per-agent values as
datasets on `agent` instead of attributes, `evaluation_only` on every dataset, `ledger/<field>`,
the per-configuration `sweep_values` and strict JSON (mpi_dp.results.schema):
  /                       attrs format, format_version, job (TOML text), job_resolved (JSON),
                          algorithm, variant, status (running|complete|interrupted|failed),
                          status_reason (interrupted: the signal; failed: the exception text),
                          n_configs, sweep (JSON); heartbeat: writer_host, writer_pid,
                          heartbeat_unix, progress_config, progress_record; a part file of
                          one block of the configurations (`run --configs A:B`) also
                          config_block [A, B] and, from `--config-block I/N`, config_task
                          [I, N]; a merged file merged_from (JSON, mpi_dp.results.merge)
  /provenance             attrs: versions, git revision, MPI library, ranks, hosts, seed, times
  G = /  (no sweep)  or  /configs/000, /configs/001, ... (one group per configuration)
  G attrs                 config_index, label, eps (per owner), n (per owner), T, runs, ...
  G/metrics/iteration     (records,) iteration k of each record (0 = initial model)
  G/metrics/<name>        (records, runs) per-run metrics, e.g. psi, train_error, test_error,
                          train_mse; (records,) for per-iteration scalars such as step_size
  G/models/<name>         final models (runs, p)
  G/reference/...         theta_star, f_star, theta_isolated, psi_isolated; the trivial
                          baselines majority_label, *_error_majority, *_error_zero,
                          *_error_star, train_mse_zero|mean|star (all evaluation-only)
  G attrs (also)          eval_set, prediction (classification), config_complete (resume)
  G/checkpoint            while a configuration runs (methods that checkpoint inside it): the
                          method's state as plain datasets (mpi_dp.results.checkpoint; attrs
                          format_version, digest, n_records, complete); removed when it
                          completes
  G/privacy/ledger        per-agent ledger, every method (privacy.accountants.LEDGER_DTYPE: the
                          owner's target eps / delta, calibration rule and scope, mechanism,
                          releases, per-release eps and noise multiplier, the scope's totals by
                          the basic, advanced, PLD and RDP accountants at the owner's delta and
                          the plain composition of all releases; attrs `guarantee`)
  G attrs (also)          calibration, calibration_rule, calibrations (one line per distinct
                          calibrated plan: rule, releases, noise, planned totals)
Metrics are appended and flushed record by record, so a run killed after k iterations leaves a
readable file holding those k records (status stays 'running' or becomes 'interrupted'). A job
writes PATH.partial and renames it to PATH when complete (mpi_dp.results.output).
"""

from __future__ import annotations

import json
import math
import os
import signal
import socket
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from .. import strict_json
from ..errors import DiskFullError, JobError
from . import schema
from .checkpoint import CheckpointDigestError, CheckpointError, read_state, write_state

FORMAT = "mpi_dp.results"
FORMAT_VERSION = 2


#: longest array stored as a configuration attribute; longer ones are datasets `arrays/<name>`
#: (per-agent values: an attribute is a header message, capped at 64 KiB without the dense
#: attribute storage that older HDF5 readers lack)
ATTR_ARRAY_MAX = 1024
ARRAYS = "arrays"
ARRAYS_DOC = ("attributes of this group too long for an attribute (arrays of more than "
              f"{ATTR_ARRAY_MAX} values, e.g. per-agent eps and n): one dataset each, same name")


def _attr(v: Any) -> Any:
    """An attribute value: numbers and numeric arrays as they are, anything structured as strict
    JSON (mpi_dp.strict_json: infinity is the string "Infinity")."""
    if isinstance(v, dict | list | tuple) and not (
        isinstance(v, list | tuple) and v and all(isinstance(x, int | float) for x in v)
    ):
        return strict_json.dumps(v)
    return v


#: configuration attributes that are never per-agent values even when their length is N
NOT_PER_AGENT = frozenset({"run_ids", "config_block", "config_task"})


def _per_agent(name: str, v: Any, n_agents: int | None) -> bool:
    """Whether an attribute value is one number per agent (stored as a dataset on `agent`)."""
    if n_agents is None or name in NOT_PER_AGENT or isinstance(v, str | bytes | dict):
        return False
    a = np.asarray(v) if isinstance(v, list | tuple | np.ndarray) else None
    return a is not None and a.ndim == 1 and len(a) == n_agents and a.dtype.kind in "biuf"


#: where a checkpoint is written before it replaces `checkpoint` (ConfigRecorder.save_state)
CHECKPOINT_NEW = "checkpoint_new"


class ConfigRecorder:
    """Writes one configuration group: appends metric records, stores final arrays."""

    def __init__(self, group: h5py.Group, runs: int, flush_every: int = 1,
                 expected_records: int | None = None,
                 on_record: Callable[[int], None] | None = None, context: str = "") -> None:
        self.group = group
        #: what a checkpoint of this configuration belongs to (job, data, configuration), bound
        #: into its digest with the record count
        self._context = context
        self._on_record = on_record
        self.runs = runs
        # chunk rows: at most the records a run will write (small files for short runs)
        self._chunk_rows = max(1, min(1024, int(expected_records or 1024)))
        self.metrics = group.require_group("metrics")
        self.n_records = 0
        self._flush_every = max(1, flush_every)
        self._resume_state: Any = None
        self._saved_at = time.monotonic()
        #: agents of the configuration (from its attribute `n`, one record count per agent)
        self.n_agents: int | None = None
        self.run_ids: np.ndarray | None = None

    # -- checkpoints inside a configuration (methods that support them) --------------------------
    def checkpoint_due(self) -> bool:
        """Whether a method should save its state now (every MPI_DP_CHECKPOINT_S seconds)."""
        return time.monotonic() - self._saved_at >= checkpoint_every_s()

    def save_state(self, state: Any) -> None:
        """Store a method's state (plain datasets, mpi_dp.results.checkpoint) with the number of
        records it goes with; a resume continues from it. Written whole as `checkpoint_new`
        (attribute `complete` set last, flushed), then renamed to `checkpoint` over the previous
        one, so a crash mid-write leaves no checkpoint a resume would trust (the previous one, or
        none, is resumed). Removed when the configuration completes."""
        g = self.group
        if CHECKPOINT_NEW in g:  # an earlier write that did not finish
            del g[CHECKPOINT_NEW]
        new = g.create_group(CHECKPOINT_NEW)
        write_state(new, state, self.checkpoint_context(self.n_records))
        new.attrs["n_records"] = self.n_records
        new.attrs["complete"] = True
        g.file.flush()
        if "checkpoint" in g:
            del g["checkpoint"]
        g.move(CHECKPOINT_NEW, "checkpoint")
        g.file.flush()
        self._saved_at = time.monotonic()

    def checkpoint_context(self, n_records: int) -> str:
        """The context a checkpoint's digest binds: the configuration's and its record count."""
        return f"{self._context}\nn_records={n_records}"

    def saved_state(self) -> Any:
        """The state a resumed configuration continues from (None: start afresh)."""
        return self._resume_state

    def resume_from_checkpoint(self) -> None:
        """Load the group's checkpoint and drop the records written after it. A checkpoint this
        version does not read (an older format: the pickled uint8 dataset of earlier versions,
        another format_version, an unfinished write) or one that does not match its digest
        (altered, damaged, of another job or data) is dropped with a note, and the configuration
        restarts from its start (its records dropped too): what it then writes is what an
        uninterrupted run writes."""
        node = self.group["checkpoint"]
        try:
            if not (isinstance(node, h5py.Group) and node.attrs.get("complete", False)
                    and "n_records" in node.attrs):
                raise CheckpointError("not a complete checkpoint group")
            n = _records_of(node, self.metrics)
            state = read_state(node, self.checkpoint_context(n))
        except CheckpointDigestError as e:
            print(f"mpi-dp: {self.group.file.filename} [{self.group.name}]: {e} (altered or "
                  "damaged, or not of this job and data): it is not used; this configuration "
                  "restarts from its start, the complete ones are kept", file=sys.stderr,
                  flush=True)
            del self.group["checkpoint"]
            state, n = None, 0
        except CheckpointError as e:
            print(f"mpi-dp: [{self.group.name}] checkpoint of an older format: configuration "
                  f"restarts from its start ({e})", file=sys.stderr, flush=True)
            del self.group["checkpoint"]
            state, n = None, 0
        self._resume_state = state
        for name in list(self.metrics):
            if n == 0:  # `append` creates the datasets at the first record
                del self.metrics[name]
            else:
                d = self.metrics[name]
                d.resize((n,) + d.shape[1:])
        self.n_records = n

    def append(self, iteration: int, values: Mapping[str, np.ndarray | float]) -> None:
        """Append one record: per-run arrays (runs,) and per-iteration scalars."""
        if self.n_records == 0:
            self.metrics.create_dataset("iteration", shape=(0,), maxshape=(None,), dtype="i8",
                                        chunks=(self._chunk_rows,))
            for name, v in values.items():
                v = np.asarray(v, dtype=np.float64)
                shape = (0,) + v.shape
                rows = min(self._chunk_rows, 2**20 // max(1, v.size * 8))
                chunks = (max(1, rows),) + v.shape
                self.metrics.create_dataset(name, shape=shape, maxshape=(None,) + v.shape,
                                            dtype="f8", chunks=chunks)
        k = self.n_records
        ds = self.metrics["iteration"]
        ds.resize((k + 1,))
        ds[k] = iteration
        for name, v in values.items():
            d = self.metrics[name]
            d.resize((k + 1,) + d.shape[1:])
            d[k] = v
        self.n_records = k + 1
        if self._on_record is not None:
            self._on_record(self.n_records)
        if self.n_records % self._flush_every == 0:
            self.group.file.flush()

    def write(self, path: str, data: np.ndarray | float, **attrs: Any) -> None:
        """Store a final array (e.g. 'models/final') with optional attributes."""
        if path in self.group:
            del self.group[path]
        ds = self.group.create_dataset(path, data=data)
        for k, v in attrs.items():
            ds.attrs[k] = _attr(v)

    def set_attrs(self, **attrs: Any) -> None:
        """The configuration's attributes. Per-agent values (one number per agent: eps, n, noise
        scales ...) become datasets of the group on the `agent` dimension, `run_ids` the `run`
        coordinate (mpi_dp.analysis.load shows both among the attributes); another array longer
        than ATTR_ARRAY_MAX becomes the dataset `arrays/<name>`."""
        if "n" in attrs and np.ndim(attrs["n"]) == 1:
            self.n_agents = len(attrs["n"])
        if "run_ids" in attrs:
            self.run_ids = np.asarray(attrs.pop("run_ids"), dtype=np.int64)
            if "run" in self.group:
                del self.group["run"]
            schema.coordinate(self.group, "run", len(self.run_ids), self.run_ids)
        for k, v in attrs.items():
            if k in self.group.attrs:
                del self.group.attrs[k]
            if k in self.group and isinstance(self.group[k], h5py.Dataset):
                del self.group[k]
            if ARRAYS in self.group and k in self.group[ARRAYS]:
                del self.group[ARRAYS][k]
            if _per_agent(k, v, self.n_agents):
                ds = self.group.create_dataset(k, data=np.asarray(v))
                ds.attrs["per_agent"] = True
                continue
            v = _attr(v)
            if isinstance(v, list | tuple | np.ndarray) and np.size(v) > ATTR_ARRAY_MAX:
                arrays = self.group.require_group(ARRAYS)
                arrays.attrs["doc"] = ARRAYS_DOC
                arrays.create_dataset(k, data=np.asarray(v))
            else:
                self.group.attrs[k] = v

    def annotate(self) -> None:
        """Name the dimensions of every dataset of the complete configuration and mark what is
        evaluation-only (mpi_dp.results.schema)."""
        schema.annotate(self.group, self.runs, self.n_agents, self.run_ids)


def _records_of(node: h5py.Group, metrics: h5py.Group) -> int:
    """The records a checkpoint goes with (its `n_records`), checked against those in the file
    (CheckpointDigestError: not a count of records the file holds)."""
    raw = node.attrs["n_records"]
    it = metrics.get("iteration")
    have = it.shape[0] if isinstance(it, h5py.Dataset) else 0
    if not (np.ndim(raw) == 0 and np.issubdtype(np.asarray(raw).dtype, np.integer)
            and 0 <= int(raw) <= have):
        raise CheckpointDigestError(f"its n_records {raw!r} is not a count of the {have} "
                                    "records written")
    return int(raw)


def _identity(job_json: Any, data_sha256: Any) -> str:
    """What a job's checkpoints belong to: its resolved values (output aside) and its data."""
    return strict_json.dumps({"job": _without_output(job_json),
                              "data_sha256": str(data_sha256 or "")},
                             sort_keys=True, separators=(",", ":"))


def _kill_at(var: str = "MPI_DP_TEST_KILL_AT") -> tuple[int, int] | None:
    """MPI_DP_TEST_KILL_AT=c:k: the writer SIGKILLs itself at record k of configuration c (a
    seam for the resume tests: a real kill at a reproducible point)."""
    v = os.environ.get(var)
    if not v:
        return None
    c, k = v.split(":")
    return int(c), int(k)


_KILL_AT = _kill_at()
#: free bytes below which a job stops at its next record (the file system would fill before the
#: next check, half a second later, and HDF5 cannot always recover from a failed write)
SPACE_MARGIN = 1 << 20
#: MPI_DP_TEST_RAISE_AT=c:k: the writer raises KeyError('typo_key') at record k of configuration
#: c (a seam for the tests of a bug inside a method: its traceback, the status 'failed')
_RAISE_AT = _kill_at("MPI_DP_TEST_RAISE_AT")


def checkpoint_every_s() -> float:
    """Seconds between a method's checkpoints inside a configuration: MPI_DP_CHECKPOINT_S
    (default 60; 0 checkpoints at every record). A value that is not a number >= 0 is a user
    error (JobError), checked by `mpi-dp run` before anything is written."""
    raw = os.environ.get("MPI_DP_CHECKPOINT_S", "60")
    try:
        v = float(raw)
    except ValueError:
        v = math.nan
    if not v >= 0:  # also NaN
        raise JobError(f"environment variable MPI_DP_CHECKPOINT_S={raw!r}: give the seconds "
                       "between checkpoints inside a configuration, a number >= 0 (default 60; "
                       "0: at every record)")
    return v


def _without_output(job_json: Any) -> dict:
    """A job's resolved values without its output path (resume may name the file anew)."""
    text = job_json.decode() if isinstance(job_json, bytes) else str(job_json)
    try:
        values = strict_json.loads(text or "{}")
    except json.JSONDecodeError:
        return {"_unreadable": text}
    if isinstance(values, dict):
        values.pop("output", None)
    return values


class ResultFile:
    """The result file of one job, written by the learner (rank 0) only."""

    # set by reopen() only (declarations, no class attributes: config() reads _resuming with a
    # default)
    completed: list[int]
    _resuming: bool

    def __init__(self, path: str | Path, *, job_text: str, job_json: str, algorithm: str,
                 variant: str, n_configs: int, sweep: Mapping[str, Any],
                 provenance: Mapping[str, Any], block: tuple[int, int] | None = None,
                 task: tuple[int, int] | None = None) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(self.path.name + f".tmp-{os.getpid()}")
        # no HDF5 file lock: one writer (rank 0), and readers may look while it runs or after
        # it was killed (a stale lock would make the partial result unreadable)
        # libver v108: dense attribute storage, so attributes may exceed 64 KiB (e.g. the
        # run ids of 1e5 vectorised runs)
        self.file = h5py.File(tmp, "w", libver=("v108", "latest"), locking=False)
        os.replace(tmp, self.path)  # same inode: appear under the final name at once
        self.sweep = bool(sweep)
        self._identity = _identity(job_json, provenance.get("data_sha256"))
        #: the recorders of configurations being written (annotated when they complete)
        self._recorders: dict[int, ConfigRecorder] = {}
        a = self.file.attrs
        a["format"] = FORMAT
        a["format_version"] = FORMAT_VERSION
        a["job"] = job_text
        a["job_resolved"] = job_json
        a["algorithm"] = algorithm
        a["variant"] = variant
        a["status"] = "running"
        a["n_configs"] = n_configs
        a["sweep"] = strict_json.dumps(dict(sweep))
        if block is not None:  # a part file: only the configurations [A, B) of the job
            a["config_block"] = np.array(block, dtype="i8")
        if task is not None:
            a["config_task"] = np.array(task, dtype="i8")
        # the heartbeat: who writes, and where it is (analyze tells a stopped job from a slow one)
        a["writer_host"] = socket.gethostname()
        a["writer_pid"] = os.getpid()
        self._beat_at = 0.0
        self.beat(0, 0, force=True)
        prov = self.file.create_group("provenance")
        for k, v in provenance.items():
            prov.attrs[k] = _attr(v)
        self.file.flush()

    @classmethod
    def reopen(cls, path: str | Path, job_json: str,
               block: tuple[int, int] | None = None,
               data_sha256: str | None = None) -> ResultFile:
        """Continue an unfinished result file of the same job (resume) and the same block of
        configurations: its complete configurations stay, an unfinished one continues from its
        checkpoint or is run again. `data_sha256`: the data's now (default: the file's
        provenance), which the checkpoints' digests must name; other data than the file was
        started from is refused (ValueError): its complete configurations would not match."""
        self = cls.__new__(cls)
        self.path = Path(path)
        self.file = h5py.File(self.path, "r+", locking=False)
        a = self.file.attrs
        if a.get("format") != FORMAT:
            self.file.close()
            raise ValueError(f"{path} is not an mpi_dp result file")
        self.sweep = bool(strict_json.loads(a.get("sweep", "{}")))
        if _without_output(a.get("job_resolved", "")) != _without_output(job_json):
            self.file.close()
            raise ValueError(f"{path} was written by a different job (its job_resolved differs); "
                             "resume it with the job and --set options that wrote it")
        had = a.get("config_block")
        had = None if had is None else (int(had[0]), int(had[1]))
        if had != (None if block is None else tuple(block)):
            self.file.close()
            what = "all configurations" if had is None else f"configurations {had[0]}:{had[1]}"
            raise ValueError(f"{path} holds {what}; resume it with the same --configs / "
                             "--config-block")
        prov = self.file.get("provenance")
        had_data = str(prov.attrs.get("data_sha256", "")) if prov is not None else ""
        if data_sha256 and had_data and data_sha256 != had_data:
            where = prov.attrs.get("data_path", "")
            self.file.close()
            raise ValueError(
                f"the shard file {where} changed since {path} was "
                f"started from it (its SHA-256 was {had_data[:16]}..., is now "
                f"{data_sha256[:16]}...): the configurations it holds were computed from the "
                "other data; put that file back and resume, or start afresh (move the .partial "
                "file away and run without --resume)")
        self.completed = sorted(int(c) for c in self.complete_indices())
        if data_sha256 is None:
            data_sha256 = had_data
        self._identity = _identity(job_json, data_sha256)
        a["status"] = "running"
        a["writer_host"] = socket.gethostname()
        a["writer_pid"] = os.getpid()
        a["resumed"] = int(a.get("resumed", 0)) + 1
        self._resuming = True
        self._recorders = {}
        self._beat_at = 0.0
        self.beat(self.completed[-1] + 1 if self.completed else 0, 0, force=True)
        return self

    def complete_indices(self) -> list[int]:
        if not self.sweep:
            return [0] if self.file.attrs.get("config_complete", False) else []
        g = self.file.get("configs")
        return [int(k) for k in (g or {}) if g[k].attrs.get("config_complete", False)]

    def config_done(self, index: int) -> None:
        """Mark configuration `index` complete (resume keeps it)."""
        group = self.file[f"configs/{index:03d}"] if self.sweep else self.file
        if "checkpoint" in group:
            del group["checkpoint"]
        rec = self._recorders.pop(index, None)
        if rec is not None:
            rec.annotate()
        group.attrs["config_complete"] = True
        self.sync()

    def sync(self) -> None:
        """Flush to the file and the file to the disk (fsync): what is complete survives a
        crash of the machine or a later write that fails."""
        self.file.flush()
        try:
            os.fsync(self.file.id.get_vfd_handle())
        except (OSError, ValueError, TypeError):  # a driver without a file descriptor
            pass

    def config(self, index: int, runs: int, expected_records: int | None = None,
               **attrs: Any) -> ConfigRecorder:
        """Recorder for configuration `index` (`expected_records` sizes the HDF5 chunks); what
        an unfinished earlier attempt left of it is removed first."""
        name = f"configs/{index:03d}" if self.sweep else "/"
        keep = getattr(self, "_resuming", False) and (
            f"{name}/checkpoint" if self.sweep else "checkpoint") in self.file
        if self.sweep and not keep and name in self.file:
            del self.file[name]
        group = self.file.require_group(name) if self.sweep else self.file
        for k in [k for k in group if k not in (("provenance", "metrics", "checkpoint") if keep
                                              else ("provenance",))]:
            del group[k]
        self.beat(index, 0, force=True)
        rec = ConfigRecorder(group, runs, expected_records=expected_records,
                             on_record=lambda k: self.beat(index, k),
                             context=f"{self._identity}\nconfig={index}")
        if keep:
            rec.resume_from_checkpoint()
        rec.set_attrs(config_index=index, runs=runs, **attrs)
        self._recorders[index] = rec
        return rec

    def beat(self, config: int, record: int, force: bool = False) -> None:
        """Heartbeat: the time, configuration and record reached (at most twice a second)."""
        global _RAISE_AT
        self._progress = (int(config), int(record))
        if _KILL_AT is not None and self._progress == _KILL_AT:  # fault injection (tests)
            self.file.flush()
            os.kill(os.getpid(), signal.SIGKILL)
        if _RAISE_AT is not None and self._progress == _RAISE_AT:
            _RAISE_AT = None  # once
            raise KeyError("typo_key")  # a bug injected by a test
        now = time.time()
        if not force and now - self._beat_at < 0.5:
            return
        self._beat_at = now
        if not force:
            self.check_space()
        a = self.file.attrs
        a["heartbeat_unix"] = now
        a["progress_config"], a["progress_record"] = self._progress

    def check_space(self) -> None:
        """Stop at a record, before HDF5 meets a full disk in the middle of a write, when the
        file system keeps less than SPACE_MARGIN free (PATH.reserve not counted: it is the
        room to close the file). DiskFullError; the runner closes the file and says so."""
        try:
            st = os.statvfs(self.path.parent)
        except OSError:
            return
        free = st.f_bavail * st.f_frsize
        if free < SPACE_MARGIN:
            raise DiskFullError(f"no space left on device writing {self.path} "
                                f"({free >> 10} KiB free)")

    def set_status(self, status: str, reason: str | None = None, **provenance: Any) -> None:
        """The job's status, with why it stopped (`status_reason`: the signal of an interrupted
        job, the exception of a failed one) and provenance attributes."""
        self.beat(*self._progress, force=True)
        self.file.attrs["status"] = status
        if reason is not None:
            self.file.attrs["status_reason"] = reason
        elif "status_reason" in self.file.attrs:  # a resumed job that completes
            del self.file.attrs["status_reason"]
        for k, v in provenance.items():
            self.file["provenance"].attrs[k] = _attr(v)
        self.file.flush()

    def close_on_full_disk(self, reason: str, **provenance: Any) -> None:
        """Close after the disk filled (and PATH.reserve was given back): the status 'failed'
        without an explicit flush (HDF5 refuses a flush after one that failed); closing writes
        the metadata, so every complete configuration stays readable."""
        if not self.file.id.valid:
            return
        try:
            self.file.attrs["status"] = "failed"
            self.file.attrs["status_reason"] = reason
            for k, v in provenance.items():
                self.file["provenance"].attrs[k] = _attr(v)
        finally:
            try:
                self.file.close()
            except RuntimeError:  # HDF5 reports the failed flush again; the file is closed
                pass

    def close(self, status: str | None = None, reason: str | None = None,
              **provenance: Any) -> None:
        if self.file.id.valid:
            if status:
                self.set_status(status, reason, **provenance)
            self.file.close()
